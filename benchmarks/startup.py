"""Startup benchmark: from starting ``python`` to a solved CartPole, cold and warm, as a user waits.

    python benchmarks/startup.py [--seeds 5] [--compare base=/path/to/old/checkout,new=.]
    (--seeds: a comma list of seeds as the other scripts take, 0,1,2, ranges too, 0-4; or a count N, seeds 0..N-1)
    PYTHONPATH=/tmp/evosax python benchmarks/startup.py --peer evosax   # after the line below
    PYTHONPATH=/tmp/evosax python benchmarks/startup.py --as-user --peer evosax  # `python -m jes` itself
    pip install --target /tmp/evosax "evosax==0.3.2" dotmap --no-deps     # a peer, beside jes's environment

Each run is a fresh ``python -c`` child doing what ``python -m jes`` does with the defaults
(``jes.use_cpu_cores()``, ``jes.enable_compilation_cache()``, GRU 5x2 on CartPole-v1, stop at a
centre return of 475, then a 100-episode evaluation of the result), spelled out with the public
pieces ``jes.train`` is made of (``Trainer``, ``init_state``, ``compiled_step``, ``jes.run``) so the
child can print a timestamp after each phase. As in ``jes.train``, the step compiles in a background
thread while the initial state is built, so "step compile" is the wait for it after "init". The parent measures the wall time from just before
starting the child to its exit; the child's phases are wall-clock timestamps relative to the
parent's start, so "python start" is the interpreter's own start-up.

Per seed: a cold run (a fresh, empty compilation-cache directory), then a warm run (the same
directory again). ``--compare label=PATH,...`` runs each checkout (its ``jes`` put first on
``PYTHONPATH``) side by side, interleaved seed by seed, so a loaded machine loads them alike.
``--peer evosax`` adds evosax's Open_ES on the same task, written as its user would write it (see
``CHILD_EVOSAX``), interleaved the same way.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import print_load, print_provenance, seeds_or_count, seeds_text  # noqa: E402

CHILD = r"""
import sys, time
def mark(name):
    print("PHASE", name, repr(time.time()), flush=True)
mark("python")
import numpy as np
import jes
mark("import")
jes.use_cpu_cores()
jes.enable_compilation_cache()
seed = int(sys.argv[1])
trainer = jes.Trainer(jes.GRUPolicy(hidden=5, layers=2), "CartPole-v1",
                      config=jes.ESConfig(stop_at_return=475.0))
mark("setup")
getattr(trainer, "start_compiling_step", lambda: None)()  # as jes.train does (older checkouts: absent)
state = trainer.init_state(seed)
jax_block = state.params.block_until_ready()
mark("init")
trainer.compiled_step(state)
mark("compile")
result = jes.run(trainer, state, key=seed)
mark("generations")
score = float(np.mean(result.evaluate(num_episodes=100)))
mark("evaluate")
gen_times = [float(x) for x in result.history["generation_time"]]
print("RESULT", json.dumps(dict(solved=result.solved_generation, score=score, generation_times=gen_times,
                                  compile_time=result.compile_time)), flush=True)
"""
CHILD = CHILD.replace("import sys, time", "import json, sys, time")

# The peer, as its user would write it (no jes): evosax 0.3's Open_ES with jes's defaults where they are choices
# (population 512, antithetic, centred ranks, adam lr 0.2, sigma 0.2, GRU 5x2, the centre on 64 fresh episodes
# after every generation, stop at 475, then 100 episodes), its own rollout as evosax's examples write it (one
# lax.scan over the 500 steps of gymnax's auto-resetting step, the return summed until the first done), ask,
# rollout, tell and the centre in one jitted generation. Warm: JAX's persistent cache in the same directory,
# with JAX's default thresholds (what an evosax user gets by turning it on).
CHILD_EVOSAX = r"""
import json, sys, time
def mark(name):
    print("PHASE", name, repr(time.time()), flush=True)
mark("python")
import numpy as np
import jax, jax.numpy as jnp, optax, flax.linen as nn
from jax.flatten_util import ravel_pytree
import gymnax
from evosax.algorithms import Open_ES
mark("import")
jax.config.update("jax_compilation_cache_dir", sys.argv[2])
seed, POP, EPISODES = int(sys.argv[1]), 512, 64
env, env_params = gymnax.make("CartPole-v1")

class GRU(nn.Module):
    @nn.compact
    def __call__(self, carry, obs):
        x, new = obs, []
        for layer in range(2):
            c, x = nn.GRUCell(features=5, name=f"gru{layer}")(carry[layer], x)
            new.append(c)
        return jnp.stack(new), nn.Dense(2)(x)

policy = GRU()
carry0 = jnp.zeros((2, 5))
key = jax.random.key(seed)
x0, unravel = ravel_pytree(policy.init(jax.random.fold_in(key, 0), carry0, jnp.zeros(4)))
es = Open_ES(population_size=POP, solution=x0, use_antithetic_sampling=True, optimizer=optax.adam(0.2),
             std_schedule=optax.constant_schedule(0.2))
es_params = es.default_params
mark("setup")
state = es.init(jax.random.fold_in(key, 1), x0, es_params)
jax.block_until_ready(state.mean)
mark("init")

def episode(flat, k):
    params = unravel(flat)
    k_reset, k_steps = jax.random.split(k)
    obs, env_state = env.reset(k_reset, env_params)
    def step(c, k_step):
        obs, env_state, carry, total, done = c
        carry, logits = policy.apply(params, carry, obs)
        obs, env_state, reward, terminated, truncated, _ = env.step(k_step, env_state, jnp.argmax(logits), env_params)
        d = (terminated | truncated).astype(jnp.float32)
        return (obs, env_state, carry, total + reward * (1 - done), jnp.maximum(done, d)), None
    c = (obs, env_state, carry0, jnp.float32(0), jnp.float32(0))
    return jax.lax.scan(step, c, jax.random.split(k_steps, env_params.max_steps_in_episode))[0][3]

def centre(mean, k, n):
    return jax.vmap(episode, in_axes=(None, 0))(mean, jax.random.split(k, n)).mean()

@jax.jit
def generation(state, k):
    k_ask, k_eval, k_tell, k_centre = jax.random.split(k, 4)
    xs, state = es.ask(k_ask, state, es_params)
    returns = jax.vmap(episode)(xs, jax.random.split(k_eval, POP))
    state, _ = es.tell(k_tell, xs, -returns, state, es_params)  # evosax minimises
    return state, centre(state.mean, k_centre, EPISODES)

run_key = jax.random.fold_in(key, 2)
generation = generation.lower(state, run_key).compile()
mark("compile")
solved, times = None, []
for g in range(200):
    t = time.perf_counter()
    state, score = generation(state, jax.random.fold_in(run_key, g))
    score = float(score)
    times.append(time.perf_counter() - t)
    if score >= 475.0:
        solved = g + 1
        break
mark("generations")
score = float(jax.jit(centre, static_argnums=2)(state.mean, jax.random.fold_in(key, 3), 100))
mark("evaluate")
print("RESULT", json.dumps(dict(solved=solved, score=score, generation_times=times, compile_time=None)), flush=True)
"""
PHASES = ("python", "import", "setup", "init", "compile", "generations", "evaluate")


def run_child(pythonpath: str, seed: int, cache_dir: str, extra_env: dict | None = None, child: str = CHILD) -> dict:
    """One fresh process; returns its phase durations (s), total wall time, and result."""
    # The checkout first; whatever PYTHONPATH already holds after it (e.g. packages installed outside the venv).
    path = os.pathsep.join(p for p in (pythonpath and os.path.abspath(pythonpath), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, JES_COMPILATION_CACHE=cache_dir, **(extra_env or {}))
    env.pop("XLA_FLAGS", None)
    start = time.time()
    # Run in the cache's parent directory: `python -c` puts its working directory first on sys.path, so a
    # checkout's jes/ there would shadow the one on PYTHONPATH (and --compare would time one checkout twice).
    proc = subprocess.run([sys.executable, "-c", child, str(seed), cache_dir], env=env, capture_output=True, text=True,
                          timeout=600, cwd=os.path.dirname(os.path.abspath(cache_dir)))
    total = time.time() - start
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    marks, result = {}, None
    for line in proc.stdout.splitlines():
        if line.startswith("PHASE "):
            _, name, stamp = line.split()
            marks[name] = float(stamp)
        elif line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    phases, before = {}, start
    for name in PHASES:
        phases[name] = marks[name] - before
        before = marks[name]
    phases["exit"] = start + total - before
    # "solved": process start -> the end of the generation that solved it (the run stops there).
    return dict(total=total, solved_at=marks["generations"] - start, phases=phases, **result)


def run_module(seed: int, cache_dir: str) -> dict:
    """``python -m jes --seed SEED`` itself, as a user runs it: a fresh process with a fresh home and the given
    compilation cache; the wall time from just before starting it to its exit, measured from outside."""
    home = os.path.join(os.path.dirname(os.path.abspath(cache_dir)), f"home-{os.path.basename(cache_dir)}")
    os.makedirs(home, exist_ok=True)
    env = dict(os.environ, HOME=home, JES_COMPILATION_CACHE=cache_dir)
    env.pop("XLA_FLAGS", None)
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "jes", "--seed", str(seed)], env=env, capture_output=True, text=True,
                          timeout=600, cwd=home)
    total = time.time() - start
    if proc.returncode not in (0, 1):  # 1: not solved within its generations (reported, not an error)
        raise RuntimeError(f"python -m jes failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    # "generation 4/25: mean ..." (stdout not a terminal, as here) or the terminal's "generation 4 ... population mean"
    gens = [int(m.group(1)) for m in (re.match(r"generation (\d+)(/\d+:| .*population mean)", line)
                                      for line in proc.stdout.splitlines()) if m]
    score = [float(line.split(":")[1].split()[0]) for line in proc.stdout.splitlines() if "fresh episodes:" in line]
    return dict(total=total, solved=gens[-1] if proc.returncode == 0 else None, score=score[0] if score else None)


def as_user(seeds: list[int], peers: list[str], kinds: tuple[str, ...] = ("cold", "warm")) -> None:
    """``python -m jes`` and each peer's child, cold then warm, interleaved seed by seed; wall time from outside."""
    children = [("python -m jes", None)] + [(peer, {"evosax": CHILD_EVOSAX}[peer]) for peer in peers]
    rows = {(label, kind): [] for label, _ in children for kind in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for label, child in children:
                cache = os.path.join(tmp, f"{label.replace(' ', '_')}-{seed}")
                for kind in kinds:
                    r = run_module(seed, cache) if child is None else run_child("", seed, cache, child=child)
                    rows[(label, kind)].append(r)
                    print(f"{label:>14s} seed {seed} {kind}: {r['total']:5.2f} s, solved at generation {r['solved']}, "
                          f"100-episode score {r['score']}", flush=True)
    print()
    print("| program | cache | process start -> exit, median [min, max] s | ratio to `python -m jes` (medians) | "
          "generations to solve | 100-episode score |")
    print("|---|---|---|---|---|---|")
    for (label, kind), runs in rows.items():
        totals = [r["total"] for r in runs]
        base = statistics.median(r["total"] for r in rows[("python -m jes", kind)])
        print(f"| {label} | {kind} | {statistics.median(totals):.2f} [{min(totals):.2f}, {max(totals):.2f}] | "
              f"{statistics.median(totals) / base:.2f}x | {', '.join(str(r['solved']) for r in runs)} | "
              + ", ".join(f"{r['score']:.1f}" for r in runs) + " |")
    print(f"\n(seeds {seeds_text(seeds)}; load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")


def steady_generation_s(runs: list[dict]) -> float:
    """Median seconds per generation after the first, over runs."""
    times = [t for r in runs for t in r["generation_times"][1:]]
    return statistics.median(times) if times else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=seeds_or_count, default="5",
                        help="a comma list of seeds (0,1,2 or 0-4) or a count N, seeds 0..N-1 (default 5)")
    parser.add_argument("--compare", default=f"jes={os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}",
                        help="label=PATH,... checkouts to compare (default: this one)")
    parser.add_argument("--no-warm", action="store_true", help="cold runs only")
    parser.add_argument("--as-user", action="store_true",
                        help="time `python -m jes --seed N` itself from outside (fresh home; cold, then warm) "
                             "beside the peers, instead of the phase-stamped children")
    parser.add_argument("--peer", choices=("evosax",), action="append", default=[],
                        help="also run a peer library's equivalent, interleaved (evosax: importable from PYTHONPATH)")
    args = parser.parse_args()
    for peer in args.peer:  # before minutes of jes runs, not after them
        if importlib.util.find_spec(peer) is None:
            parser.error(f"--peer {peer}: {peer} is not importable here (pip install {peer}; it is a peer for "
                         f"comparison, never a jes dependency)")
    print_provenance(args.seeds)
    if args.as_user:
        as_user(args.seeds, args.peer, ("cold",) if args.no_warm else ("cold", "warm"))
        print_load()
        return
    # (label, checkout put first on PYTHONPATH or "" for a peer, child script)
    checkouts = [(*item.split("=", 1), CHILD) for item in args.compare.split(",")] + \
        [(peer, "", {"evosax": CHILD_EVOSAX}[peer]) for peer in args.peer]
    rows = {(label, kind): [] for label, _, _ in checkouts for kind in ("cold", "warm")}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for label, path, child in checkouts:
                cache = os.path.join(tmp, f"{label}-{seed}")
                for kind in ("cold",) if args.no_warm else ("cold", "warm"):
                    r = run_child(path, seed, cache, child=child)
                    rows[(label, kind)].append(r)
                    p = r["phases"]
                    print(f"{label:>8s} seed {seed} {kind}: total {r['total']:5.2f}s solved@{r['solved_at']:5.2f}s "
                          f"(gen {r['solved']}) | " + " ".join(f"{k} {v:.2f}" for k, v in p.items()), flush=True)
    print()
    print("| checkout | cache | process start -> solved (median s) | start -> exit incl. 100-episode eval | "
          "python | import | env/trainer setup | init | step compile | generations | final eval | "
          "gens to solve | s/generation (steady) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (label, kind), runs in rows.items():
        if not runs:
            continue
        med = lambda f: statistics.median(f(r) for r in runs)
        print(f"| {label} | {kind} | {med(lambda r: r['solved_at']):.2f} | {med(lambda r: r['total']):.2f} | "
              + " | ".join(f"{med(lambda r, k=k: r['phases'][k]):.2f}" for k in PHASES)
              + f" | {med(lambda r: r['solved'] or 0):.0f} | {steady_generation_s(runs):.4f} |")
    print(f"\n(medians over seeds {seeds_text(args.seeds)})")
    print_load()


if __name__ == "__main__":
    main()
