"""Wall time of S seeds run together (one vmapped program) vs one after another (one compiled step, reused).

    python benchmarks/sweep.py [--seeds 8] [--population 64] [--generations 5] [--repeats 3] [--hidden 5 --layers 2]
    (--seeds: a comma list of seeds as the other scripts take, 0,1,2, ranges too, 0-7; or a count N, seeds 0..N-1)

Both modes run the same trainer configuration on CartPole-v1; the sequential mode's parameters are those of
standalone runs, bit for bit, and the vmapped mode's may differ in the last bits (the script says whether they
did). Compile time is reported separately; run times are medians over ``--repeats``.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jes
from jes.sweep import compile_batch, run_batch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import print_load, print_provenance, seeds_or_count  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seeds", type=seeds_or_count, default="8",
                        help="a comma list of seeds (0,1,2 or 0-7) or a count N, seeds 0..N-1 (default 8)")
    parser.add_argument("--population", type=int, default=64)
    parser.add_argument("--generations", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=5)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--eval-episodes", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print_provenance(args.seeds)

    config = jes.ESConfig(num_members=args.population, num_generations=args.generations,
                          eval_episodes=args.eval_episodes, eval_every=0)
    trainer = jes.Trainer(jes.GRUPolicy(hidden=args.hidden, layers=args.layers), args.env, "adam", config, devices=1)
    states = jax.tree.map(lambda *x: jnp.stack(x), *[trainer.init_state(seed) for seed in args.seeds])

    results = {}
    for mode, vmap in (("sequential", False), ("vmapped", True)):
        # Compile once per mode (the trainer caches its step; compile_batch is kept), time the runs apart.
        t0 = time.perf_counter()
        if vmap:
            compiled = compile_batch(trainer, states)
        else:
            compiled = None
            trainer.compiled_step(trainer.place(jax.tree.map(lambda x: x[0], states)))
        compile_time = time.perf_counter() - t0
        times, final = [], None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            final, _, _, _ = run_batch(trainer, states, vmap=vmap, compiled=compiled)
            jax.block_until_ready(final)
            times.append(time.perf_counter() - t0)
        results[mode] = (float(np.median(times)), compile_time, np.asarray(final.params), min(times), max(times))

    same = np.array_equal(results["sequential"][2], results["vmapped"][2])
    print(f"{platform.node()} {jax.devices()[0].platform} x{len(jax.devices())}, jax {jax.__version__}")
    print(f"{args.env}, GRU {args.hidden}x{args.layers} ({trainer.num_params} params), population {args.population}, "
          f"{args.generations} generations, {len(args.seeds)} seeds, median of {args.repeats}")
    for mode, (wall, compile_s, _, low, high) in results.items():
        print(f"  {mode:10s}: {wall:7.2f} s run [{low:.2f}, {high:.2f} over repeats]   ({compile_s:5.2f} s compile)")
    print(f"  speed-up of vmapped seeds: {results['sequential'][0] / results['vmapped'][0]:.2f}x; "
          f"final params {'bit-identical' if same else 'differ'} between modes")
    print_load()


if __name__ == "__main__":
    main()
