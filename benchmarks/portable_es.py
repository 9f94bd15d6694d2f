"""Shared driver for the portable-es style benchmarks (cartpole.py, acrobot.py).

For each optimizer: one compiled trainer, run from several seeds for a fixed
number of generations with a centre evaluation every generation; report the
population mean and centre score at the last generation (mean ± std over
seeds), generations-to-solve and the time to solve including trainer construction, the initial
state and the compile (imports are left to benchmarks/startup.py, which times whole processes).
"""
from __future__ import annotations

import argparse
import platform
import time

import jax
import numpy as np

import jes
from jes.loop import run
from provenance import print_load, print_provenance, seeds_or_count

OPTIMIZERS = ("novograd", "adabelief", "adam", "radam", "amsgrad")


def parse_args(description: str, default_seeds: str = "5") -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS), help="comma-separated optimizer names")
    parser.add_argument("--seeds", type=seeds_or_count, default=default_seeds,
                        help="seeds per optimizer: a comma list (0,1,2 or 0-9) or a count N, seeds 0..N-1 (default 5)")
    parser.add_argument("--generations", type=int, default=25)
    parser.add_argument("--pairs", type=int, default=256, help="antithetic pairs per generation")
    parser.add_argument("--eval-episodes", type=int, default=64, help="fresh episodes per centre evaluation")
    return parser.parse_args()


def benchmark(env: str, policy: jes.GRUPolicy, args: argparse.Namespace) -> list[dict]:
    """Run the table and print it; returns one row per optimizer."""
    print_provenance(args.seeds)
    described = " ".join(repr(policy).split())  # one line: flax's repr spans several, outside the '# ' block
    print(f"# {env}, {described}, {2 * args.pairs} evaluations/generation, {args.generations} generations, "
          f"{len(args.seeds)} seeds; jax {jax.__version__} on {jax.default_backend()} ({platform.machine()}, "
          f"{len(jax.devices())} device(s))", flush=True)
    rows = []
    for name in args.optimizers.split(","):
        config = jes.ESConfig(num_members=2 * args.pairs, num_generations=args.generations,
                              eval_episodes=args.eval_episodes)
        t_setup = time.perf_counter()
        trainer = jes.Trainer(policy, env, name, config)
        setup_time = time.perf_counter() - t_setup
        pop_final, centre_final, solved_at, time_to_solve, per_gen = [], [], [], [], []
        compile_time = None
        for seed in args.seeds:
            t_init = time.perf_counter()
            state = trainer.init_state(seed)
            jax.block_until_ready(state)
            init_time = time.perf_counter() - t_init
            result = run(trainer, state, key=seed)
            compile_time = result.compile_time if compile_time is None else compile_time
            hist = result.history
            pop_final.append(hist["pop_mean"][-1])
            centre_final.append(hist["centre_return"][-1])
            per_gen.extend(hist["generation_time"])
            if result.solved_generation is not None:
                solved_at.append(result.solved_generation)
                # What a user waits for after the imports: trainer construction (env setup, first in this
                # process), the initial state, compiling, then the generations up to solving. The trainer
                # and its compiled step are shared by the seeds, so seed 0's setup and compile stand for all.
                time_to_solve.append(setup_time + init_time + result.compile_time
                                     + hist["wall_time"][result.solved_generation - 1])
            print(f"  {name:9s} seed {seed}: pop mean {pop_final[-1]:7.1f}  centre {centre_final[-1]:7.1f}  "
                  f"solved at {result.solved_generation}", flush=True)
        row = dict(
            optimizer=name, params=trainer.num_params,
            pop_mean=float(np.mean(pop_final)), pop_sd=float(np.std(pop_final)),
            centre=float(np.mean(centre_final)), centre_sd=float(np.std(centre_final)),
            solved=f"{len(solved_at)}/{len(args.seeds)}",
            gens_median=float(np.median(solved_at)) if solved_at else float("nan"),
            gens_range=f"{min(solved_at)}-{max(solved_at)}" if solved_at else "-",
            solve_s=float(np.median(time_to_solve)) if time_to_solve else float("nan"),
            compile_s=compile_time, gen_s=float(np.median(per_gen)),
        )
        rows.append(row)
    print_load()
    print()
    print(f"| optimizer | params | pop mean @{args.generations} | centre @{args.generations} | solved | "
          f"gens to solve (median, range) | s to solve incl. setup and compile (median) | compile s | s/generation (median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['optimizer']} | {r['params']} | {r['pop_mean']:.1f} ± {r['pop_sd']:.1f} | "
              f"{r['centre']:.1f} ± {r['centre_sd']:.1f} | {r['solved']} | {r['gens_median']:.1f} ({r['gens_range']}) | "
              f"{r['solve_s']:.2f} | {r['compile_s']:.2f} | {r['gen_s']:.3f} |")
    return rows


