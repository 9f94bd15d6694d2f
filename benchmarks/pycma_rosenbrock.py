"""sep-CMA-ES on 10-d Rosenbrock, jes against pycma, side by side (evaluations to each level of f(mean)).

pycma is not a jes dependency; install it somewhere else and give its interpreter:

    python3 -m venv /tmp/cmavenv && /tmp/cmavenv/bin/pip install cma numpy
    /tmp/cmavenv/bin/python benchmarks/pycma_rosenbrock.py --pycma --seeds 1,2,3,4,5      # pycma, diagonal and full
    PYTHONPATH=. python benchmarks/pycma_rosenbrock.py --seeds 0,1                        # jes sep_cma_es

Same function, x0 = zeros, sigma0 = 0.1, population 10 (the default for d = 10 in both). jes counts
the population plus one evaluation of the mean per generation; pycma counts the population.
"""
from __future__ import annotations

import argparse

import numpy as np

LEVELS = (1e-1, 1e-2, 1e-4, 1e-6)


def rosenbrock_np(x):
    x = np.asarray(x, np.float64)
    return float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2))


def run_pycma(seeds, dim, sigma0, max_evaluations):
    import cma

    for diagonal in (True, False):
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


def run_jes(seeds, dim, sigma0, max_evaluations):
    import jax.numpy as jnp

    import jes

    jes.use_cpu_cores()
    rosenbrock = lambda x: jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)
    for seed in seeds:
        r = jes.optimize(rosenbrock, jnp.zeros(dim), "sep_cma_es", minimize=True, num_members=10,
                         num_generations=max_evaluations // 11, noise_std=sigma0, key=seed, target=LEVELS[-1])
        values, evaluations = r.history["mean_value"], r.history["evaluations"]
        hit = {t: int(evaluations[np.argmax(values < t)]) if (values < t).any() else None for t in LEVELS}
        print(f"jes sep_cma_es seed {seed}: {hit} final f(mean) {r.value:.2g} after {r.num_evaluations}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pycma", action="store_true", help="run pycma (needs `cma` installed) instead of jes")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--sigma0", type=float, default=0.1)
    parser.add_argument("--max-evaluations", type=int, default=80000)
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    (run_pycma if args.pycma else run_jes)(seeds, args.dim, args.sigma0, args.max_evaluations)


if __name__ == "__main__":
    main()
