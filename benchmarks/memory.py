"""GRU vs MLP of similar size on tasks that need memory, several seeds each (one after another, jes.sweep's default).

    python benchmarks/memory.py [--seeds 5] [--generations 40] [--tasks cartpole,pendulum,memorychain]
    (--seeds: a comma list of seeds as the other scripts take, 0,1,2, ranges too, 0-9; or a count N, seeds 0..N-1)

Tasks:
  * ``CartPole-v1?keep_obs=0,2``: CartPole with both velocities hidden (cart position and pole angle only).
  * ``Pendulum-v1?keep_obs=0,1``: Pendulum with the angular velocity hidden (cos, sin only).
  * ``MemoryChain-bsuite`` (gymnax's bsuite port, memory_length 5): the context bit is shown in the first
    observations only; the single rewarded action (+1 right, -1 wrong) comes 5 steps later. Without memory
    the best expected return is 0.
  * ``CartPole-v1`` (full observations): the control, where memory is not needed.

Reported: the centre policy's mean return over 64 fresh episodes after the last generation, mean +- std
over seeds, and how many seeds reached the task's solved score.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jes  # noqa: E402
from jes.sweep import sweep  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import print_load, print_provenance, seeds_or_count  # noqa: E402

# name: (env, config overrides). Budgets sized for ~10 minutes on 2 loaded vCPUs.
TASKS = {
    "cartpole": ("CartPole-v1?keep_obs=0,2", dict(num_members=128)),
    "pendulum": ("Pendulum-v1?keep_obs=0,1", dict(num_members=128, learning_rate=0.05, noise_std=0.1)),
    "memorychain": ("MemoryChain-bsuite", dict(num_members=64, episodes_per_member=8)),
    "cartpole-full": ("CartPole-v1", dict(num_members=128)),
}
POLICIES = {
    "GRU 5x2": jes.GRUPolicy(hidden=5, layers=2),
    "MLP 16x16": jes.MLPPolicy(hidden_sizes=(16, 16)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=seeds_or_count, default="5",
                        help="a comma list of seeds (0,1,2 or 0-9) or a count N, seeds 0..N-1 (default 5)")
    parser.add_argument("--generations", type=int, default=40)
    parser.add_argument("--tasks", default=",".join(TASKS))
    args = parser.parse_args()
    jes.use_cpu_cores()
    print_provenance(args.seeds)
    print(f"# {len(args.seeds)} seeds, {args.generations} generations, adam; jax {jax.__version__} on "
          f"{jax.default_backend()} ({platform.machine()}, {len(jax.devices())} device(s))", flush=True)
    print("| task | policy | params | final centre return (mean ± std over seeds) | seeds solved | env steps/seed | time |")
    print("|---|---|---|---|---|---|---|", flush=True)
    for task in args.tasks.split(","):
        env, overrides = TASKS[task]
        for label, policy in POLICIES.items():
            config = jes.ESConfig(num_generations=args.generations, **overrides)
            t0 = time.perf_counter()
            result = sweep(policy, env, "adam", grid={}, seeds=args.seeds, config=config, log_dir=None)
            wall = time.perf_counter() - t0
            finals = np.array([run.history["centre_return"][-1] for run in result.runs])
            row = result.rows[0]
            trainer_params = result.runs[0].flat_params.size
            solved = jes.make_env(env).solved_return
            n_solved = int(np.sum(finals >= solved)) if solved is not None else 0
            digits = 2 if np.max(np.abs(finals)) < 10 else 1
            print(f"| `{env}` | {label} | {trainer_params} | {finals.mean():.{digits}f} ± {finals.std():.{digits}f} "
                  f"({' '.join(f'{f:.0f}' if abs(f) >= 10 else f'{f:.2f}' for f in finals)}) | "
                  f"{n_solved}/{len(args.seeds)} (≥ {solved:g}) | {row['env_steps_per_seed']:,.0f} | {wall:.0f} s |", flush=True)
    print_load()


if __name__ == "__main__":
    main()
