"""IPOP / BIPOP CMA-ES on Rastrigin: solve rate and evaluations to f < 1e-8, one line per seed and a summary.

    python benchmarks/restarts.py --seeds 0,1,2,3,4,5,6,7,8,9                  # the black-box guide's table
    python benchmarks/restarts.py --dim 4 --max-evaluations 3000 --restarts ipop

Each run is the black-box guide's example: ``jes.optimize(rastrigin, 3 * ones(d), "cma_es", minimize=True,
noise_std=2.0, restarts=..., max_evaluations=..., target=1e-8, key=seed)`` with the default ``max_restarts=9``
and ``StopCriteria``. Evaluations count the population and the mean, as ``result.num_evaluations`` does.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import print_load, print_provenance  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9", help="keys, comma-separated")
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--max-evaluations", type=int, default=200_000)
    parser.add_argument("--restarts", default="ipop,bipop", help="ipop, bipop, or both: ipop,bipop (the default) or the word both")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    schemes = ["ipop", "bipop"] if args.restarts == "both" else args.restarts.split(",")
    if not seeds or any(s not in ("ipop", "bipop") for s in schemes):
        parser.error("--seeds needs at least one key and --restarts takes ipop and/or bipop")

    import jax.numpy as jnp

    import jes

    print_provenance(seeds)
    rastrigin = lambda x: 10 * x.shape[0] + jnp.sum(x ** 2 - 10 * jnp.cos(2 * jnp.pi * x))
    rows = []
    for scheme in schemes:
        results = []
        for seed in seeds:
            r = jes.optimize(rastrigin, 3 * jnp.ones(args.dim), "cma_es", minimize=True, noise_std=2.0, key=seed,
                             restarts=scheme, max_evaluations=args.max_evaluations, target=1e-8)
            solved = r.stop_reason == "target"
            populations = [run["population"] for run in r.runs]
            print(f"{scheme} seed {seed}: {'solved' if solved else 'not solved'} ({r.stop_reason}), "
                  f"{r.num_evaluations} evaluations, {len(r.runs)} runs, populations {populations}, "
                  f"f {r.value:.3g}", flush=True)
            results.append((solved, r.num_evaluations, len(r.runs)))
        hit = [e for solved, e, _ in results if solved]
        runs = [n for solved, _, n in results if solved]
        cell = (f"{np.median(hit) / 1e3:.1f}k [{min(hit) / 1e3:.1f}k, {max(hit) / 1e3:.1f}k]" if hit else "-")
        rows.append(f"| {scheme} | {len(hit)}/{len(results)} | {cell} | "
                    f"{f'{min(runs)}-{max(runs)}' if runs else '-'} |")
    print(f"\n{args.dim}-d Rastrigin, x0 = 3 * ones, noise_std 2.0, max_evaluations {args.max_evaluations}, "
          f"target f < 1e-8, seeds {','.join(map(str, seeds))}")
    print("| restarts | solved | evaluations of the solved: median [min, max] | runs of the solved |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    print_load()


if __name__ == "__main__":
    main()
