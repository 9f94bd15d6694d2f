"""sep-CMA-ES on 10-d Rosenbrock, jes against pycma, side by side (evaluations to each level of f(mean)).

pycma is in the ``test`` extra (``pip install ".[test]"``), not a jes dependency:

    python benchmarks/pycma_rosenbrock.py --pycma --seeds 1,2,3,4,5      # pycma, diagonal and full (seed 0 is random in pycma)
    python benchmarks/pycma_rosenbrock.py --seeds 0,1,2,3,4              # jes sep_cma_es

Same function, x0 = zeros, sigma0 = 0.1, population 10 (the default for d = 10 in both). jes counts
the population plus one evaluation of the mean per generation; pycma counts the population.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import median_text, print_load, print_provenance  # noqa: E402

LEVELS = (1e-1, 1e-2, 1e-4, 1e-6)


def rosenbrock_np(x):
    x = np.asarray(x, np.float64)
    return float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2))


def summary(label, hits, seeds):
    """One table row: per level, the median (min-max) evaluations of the seeds that reached it, and how many did."""
    cells = []
    for t in LEVELS:
        reached = [h[t] for h in hits if h.get(t) is not None]
        cells.append(f"{median_text(reached)} ({min(reached)}-{max(reached)}), {len(reached)}/{len(hits)}"
                     if reached else f"never (0/{len(hits)})")
    print(f"| {label} | seeds {','.join(map(str, seeds))} | " + " | ".join(cells) + " |", flush=True)


def run_pycma(seeds, dim, sigma0, max_evaluations):
    import cma

    rows = []
    for diagonal in (True, False):
        hits = []
        for seed in seeds:
            es = cma.CMAEvolutionStrategy(np.zeros(dim), sigma0, {
                "CMA_diagonal": diagonal, "popsize": 10, "seed": seed, "verbose": -9, "maxfevals": max_evaluations,
                "tolfun": 0, "tolx": 0, "tolfunhist": 0, "tolstagnation": 1e9, "tolupsigma": 1e30})
            hit, value = {}, np.inf
            while not es.stop() and value >= LEVELS[-1]:
                xs = es.ask()
                es.tell(xs, [rosenbrock_np(x) for x in xs])
                value = rosenbrock_np(es.mean)
                hit.update({t: es.countevals for t in LEVELS if value < t and t not in hit})
            stop = ", ".join(es.stop()) or "target"
            print(f"pycma {cma.__version__} {'diagonal' if diagonal else 'full'} seed {seed}: "
                  f"{ {t: hit.get(t) for t in LEVELS} } final f(mean) {value:.2g} after {es.countevals} ({stop})",
                  flush=True)
            hits.append(hit)
        rows.append((f"pycma {cma.__version__} {'`CMA_diagonal=True`' if diagonal else 'full CMA-ES'}", hits))
    header(seeds)
    for label, hits in rows:
        summary(label, hits, seeds)


def header(seeds):
    print("\n| implementation | runs | " + " | ".join(f"f < {t:g}: evaluations, median (range), runs" for t in LEVELS)
          + " |")
    print("|---|---|" + "---|" * len(LEVELS))


def run_jes(seeds, dim, sigma0, max_evaluations):
    import jax.numpy as jnp

    import jes

    jes.use_cpu_cores()
    rosenbrock = lambda x: jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)
    hits = []
    for seed in seeds:
        r = jes.optimize(rosenbrock, jnp.zeros(dim), "sep_cma_es", minimize=True, num_members=10,
                         num_generations=max_evaluations // 11, noise_std=sigma0, key=seed, target=LEVELS[-1])
        values, evaluations = r.history["mean_value"], r.history["evaluations"]
        hit = {t: int(evaluations[np.argmax(values < t)]) if (values < t).any() else None for t in LEVELS}
        print(f"jes sep_cma_es seed {seed}: {hit} final f(mean) {r.value:.2g} after {r.num_evaluations}", flush=True)
        hits.append(hit)
    header(seeds)
    summary("jes sep_cma_es", hits, seeds)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pycma", action="store_true", help="run pycma (needs `cma` installed) instead of jes")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--sigma0", type=float, default=0.1)
    parser.add_argument("--max-evaluations", type=int, default=80000)
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    print_provenance(seeds)
    (run_pycma if args.pycma else run_jes)(seeds, args.dim, args.sigma0, args.max_evaluations)
    print_load()


if __name__ == "__main__":
    main()
