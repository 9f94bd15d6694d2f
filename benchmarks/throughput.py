"""Env steps/s of a full jes generation next to the environment's random-action ceiling, over seeds.

    python benchmarks/throughput.py [--envs CartPole-v1,Acrobot-v1] [--sizes 256,1024,4096] [--repeats 5] [--seeds 0,1,2,3,4]

For each env and batch size N (= population x episodes), in one process, for every seed (the ceiling's
random-action key, jes's run key and initial policy):

* ceiling: N gymnax envs stepped for 500 steps with random actions, no policy, in one
  compiled ``lax.scan`` (gymnax ``step_env``; finished envs reset, so every step is real);
  median over ``--repeats`` calls;
* jes: one full generation (noise, GRU rollouts of N members, shaping, gradient, optax update;
  no centre evaluation) counting only real, un-padded env steps. Measured twice: at the
  initial policy (short CartPole episodes, the while-loop stops early; the first generation
  re-run ``--repeats`` times, median) and after ``--train-gens`` generations of training
  ("trained", longer episodes; median over the next ``--repeats`` generations).

Each cell is the median over the seeds with [min, max] over seeds; ratios are taken seed by seed
(jes and the ceiling measured side by side) before the median. Also prints compile times and memory
(XLA's temp allocation of the compiled generation, and the process's peak RSS).
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jes
from jes.loop import run

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import print_load, print_provenance  # noqa: E402

STEPS = 500


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def ceiling(env_name: str, n: int, repeats: int, seeds: list[int]) -> tuple[list[float], float]:
    """Steps/s of N envs under random actions (one value per seed), and compile seconds."""
    spec = jes.make_env(env_name)
    env, params = spec.env, spec.params
    space = env.action_space(params)

    def rollout(key):
        obs, state = jax.vmap(env.reset_env, in_axes=(0, None))(jax.random.split(key, n), params)

        def body(state, key):
            k_act, k_step, k_reset = jax.random.split(key, 3)
            actions = jax.vmap(space.sample)(jax.random.split(k_act, n)) if not spec.discrete else \
                jax.random.randint(k_act, (n,), 0, spec.num_outputs)
            _, new, reward, term, _ = jax.vmap(env.step_env, in_axes=(None, 0, 0, None))(k_step, state, actions, params)
            done = jax.vmap(spec.done_after)(term, new)
            _, fresh = env.reset_env(k_reset, params)
            new = jax.tree.map(lambda f, s: jnp.where(done.reshape(done.shape + (1,) * (s.ndim - 1)), f, s), fresh, new)
            return new, reward.sum()

        state, rewards = jax.lax.scan(body, state, jax.random.split(key, STEPS))
        return rewards.sum()

    t0 = time.perf_counter()
    compiled = jax.jit(rollout).lower(jax.random.key(0)).compile()
    compile_s = time.perf_counter() - t0
    per_seed = []
    for seed in seeds:
        key = jax.random.key(seed)
        per_seed.append(n * STEPS / median_time(lambda: compiled(key), repeats))
    return per_seed, compile_s


def jes_generation(env_name: str, n: int, repeats: int, train_gens: int, seeds: list[int],
                   devices: int | None = None, min_batch: int | None = None) -> dict:
    """One trainer (one compile) for every seed; per seed, "init" and "trained" as (steps/s, real-step
    fraction, s/generation) medians."""
    layers = 3 if env_name.startswith("Acrobot") else 2
    config = jes.ESConfig(num_members=n, eval_every=0)
    extra = {} if min_batch is None else dict(rollout_min_batch=min_batch)
    trainer = jes.Trainer(jes.GRUPolicy(hidden=5, layers=layers), env_name, "adam", config, devices=devices, **extra)
    state = trainer.init_state(seeds[0])
    compiled, compile_s = trainer.compiled_step(state)
    temp_mb = compiled.memory_analysis().temp_size_in_bytes / 2**20
    out = dict(params=trainer.num_params, compile_s=compile_s, temp_mb=temp_mb, init=[], trained=[])
    no, yes = jnp.bool_(False), jnp.bool_(True)
    full = n * trainer.spec.max_steps
    for seed in seeds:
        state = trainer.init_state(seed)
        # The initial policy: the same first generation re-run (its episodes are what "init" means).
        steps = int(compiled(state, no, yes)[1]["env_steps"])
        seconds = median_time(lambda: compiled(state, no, yes), repeats)
        out["init"].append((steps / seconds, steps / full, seconds))
        # Trained: run train_gens generations with this seed's key, then time the next `repeats` generations.
        s = run(trainer, state, key=seed, num_generations=train_gens).state
        rates, fractions, times = [], [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            s, metrics = compiled(s, no, yes)
            jax.block_until_ready(s)
            seconds = time.perf_counter() - t0
            steps = int(metrics["env_steps"])
            rates.append(steps / seconds)
            fractions.append(steps / full)
            times.append(seconds)
        out["trained"].append((float(np.median(rates)), float(np.median(fractions)), float(np.median(times))))
    return out


def spread(values, fmt: str = "{:,.0f}") -> str:
    """Median [min, max] over seeds."""
    values = np.asarray(values, dtype=float)
    return f"{fmt.format(np.median(values))} [{fmt.format(values.min())}, {fmt.format(values.max())}]"


def mega(values) -> str:
    values = np.asarray(values, dtype=float) / 1e6
    return f"{np.median(values):.2f}M [{values.min():.2f}, {values.max():.2f}]"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="CartPole-v1,Acrobot-v1")
    parser.add_argument("--sizes", default="256,1024,4096")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls (init) / generations (trained) per seed")
    parser.add_argument("--train-gens", type=int, default=5, help="generations trained before the 'trained' row")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated: ceiling keys, jes run keys")
    parser.add_argument("--compare-devices", action="store_true",
                        help="instead: jes on 1 device vs all local devices, side by side (set "
                             "XLA_FLAGS=--xla_force_host_platform_device_count=2 for two CPU devices)")
    parser.add_argument("--compare-min-batch", default=None, metavar="B,B,...",
                        help="instead: trained s/generation for these rollout_min_batch values side by side "
                             "(a value >= the chunk size, 256, turns compaction off)")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    print_provenance(seeds)
    if args.compare_devices or args.compare_min_batch:
        (compare_min_batch if args.compare_min_batch else compare_devices)(args, seeds)
        print_load()
        return
    print(f"# jax {jax.__version__}, backend {jax.default_backend()}, {len(jax.devices())} device(s): "
          f"{jax.devices()[0].device_kind}; {platform.processor() or platform.machine()}")
    print(f"# each cell: median [min, max] over seeds {args.seeds}; per seed, the median of {args.repeats} "
          f"calls (ceiling, init) or generations (trained)")
    print("| env | N | params | ceiling steps/s | jes steps/s (init) | ratio | real-step fraction | "
          "jes steps/s (trained) | ratio | real-step fraction | s/generation (trained) | compile s (jes / ceiling) | XLA temp MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for env_name in args.envs.split(","):
        for n in (int(s) for s in args.sizes.split(",")):
            ceil, ceil_compile = ceiling(env_name, n, args.repeats, seeds)
            j = jes_generation(env_name, n, args.repeats, args.train_gens, seeds)
            init, trained = np.array(j["init"]), np.array(j["trained"])
            ceil = np.array(ceil)
            print(f"| {env_name} | {n} | {j['params']} | {mega(ceil)} | {mega(init[:, 0])} | "
                  f"{spread(init[:, 0] / ceil, '{:.2f}')} | {spread(init[:, 1], '{:.2f}')} | {mega(trained[:, 0])} | "
                  f"{spread(trained[:, 0] / ceil, '{:.2f}')} | {spread(trained[:, 1], '{:.2f}')} | "
                  f"{spread(trained[:, 2], '{:.3f}')} | {j['compile_s']:.1f} / {ceil_compile:.1f} | "
                  f"{j['temp_mb']:.1f} |", flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak RSS of this process: {peak:.0f} MB")
    print_load()


def compare_devices(args, seeds):
    """Trained-policy generation throughput on 1 device vs all local devices (results are bit-identical)."""
    count = len(jax.devices())
    print(f"# jax {jax.__version__}, {count} local device(s); median [min, max] over seeds {args.seeds}; "
          f"speed-up taken seed by seed")
    print("| env | N | devices | jes steps/s (trained) | s/generation | speed-up |")
    print("|---|---|---|---|---|---|")
    for env_name in args.envs.split(","):
        for n in (int(s) for s in args.sizes.split(",")):
            base = None
            for devices in sorted({1, count}):
                trained = np.array(jes_generation(env_name, n, args.repeats, args.train_gens, seeds, devices)["trained"])
                base = trained[:, 0] if base is None else base
                print(f"| {env_name} | {n} | {devices} | {mega(trained[:, 0])} | {spread(trained[:, 2], '{:.3f}')} | "
                      f"{spread(trained[:, 0] / base, '{:.2f}')}x |", flush=True)


def compare_min_batch(args, seeds):
    """Trained-policy s/generation for several rollout_min_batch values (results are bit-identical)."""
    values = [int(v) for v in args.compare_min_batch.split(",")]
    print(f"# jax {jax.__version__}, {len(jax.devices())} device(s); median [min, max] over seeds {args.seeds} of "
          f"each seed's median over {args.repeats} generations after {args.train_gens} trained")
    print("| env | N | rollout_min_batch | s/generation (trained) | jes steps/s (trained) | compile s |")
    print("|---|---|---|---|---|---|")
    for env_name in args.envs.split(","):
        for n in (int(s) for s in args.sizes.split(",")):
            for value in values:
                j = jes_generation(env_name, n, args.repeats, args.train_gens, seeds, min_batch=value)
                trained = np.array(j["trained"])
                print(f"| {env_name} | {n} | {value} | {spread(trained[:, 2], '{:.4f}')} | {mega(trained[:, 0])} | "
                      f"{j['compile_s']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
