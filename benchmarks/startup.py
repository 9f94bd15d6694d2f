"""Startup benchmark: from starting ``python`` to a solved CartPole, cold and warm, as a user waits.

    python benchmarks/startup.py [--seeds 5] [--compare base=/path/to/old/checkout,new=.]

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
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

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
PHASES = ("python", "import", "setup", "init", "compile", "generations", "evaluate")


def run_child(pythonpath: str, seed: int, cache_dir: str, extra_env: dict | None = None) -> dict:
    """One fresh process; returns its phase durations (s), total wall time, and result."""
    # The checkout first; whatever PYTHONPATH already holds after it (e.g. packages installed outside the venv).
    path = os.pathsep.join(p for p in (os.path.abspath(pythonpath), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, JES_COMPILATION_CACHE=cache_dir, **(extra_env or {}))
    env.pop("XLA_FLAGS", None)
    start = time.time()
    # Run in the cache's parent directory: `python -c` puts its working directory first on sys.path, so a
    # checkout's jes/ there would shadow the one on PYTHONPATH (and --compare would time one checkout twice).
    proc = subprocess.run([sys.executable, "-c", CHILD, str(seed)], env=env, capture_output=True, text=True,
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


def steady_generation_s(runs: list[dict]) -> float:
    """Median seconds per generation after the first, over runs."""
    times = [t for r in runs for t in r["generation_times"][1:]]
    return statistics.median(times) if times else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--compare", default=f"jes={os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}",
                        help="label=PATH,... checkouts to compare (default: this one)")
    parser.add_argument("--no-warm", action="store_true", help="cold runs only")
    args = parser.parse_args()
    checkouts = [item.split("=", 1) for item in args.compare.split(",")]
    rows = {(label, kind): [] for label, _ in checkouts for kind in ("cold", "warm")}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            for label, path in checkouts:
                cache = os.path.join(tmp, f"{label}-{seed}")
                for kind in ("cold",) if args.no_warm else ("cold", "warm"):
                    r = run_child(path, seed, cache)
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
    print(f"\n(medians over seeds 0-{args.seeds - 1}; load average at the end: {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
