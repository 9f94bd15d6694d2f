"""jes cma_es against pycma's CMA-ES, side by side: evaluations until f(mean) < target, medians over seeds.

    PYTHONPATH=. python benchmarks/pycma_compare.py --seeds 0,1,2,3,4,5,6,7,8,9
    PYTHONPATH=. python benchmarks/pycma_compare.py --functions rastrigin --restarts ipop --budget 200000

Same function, x0, sigma0 and population (the default 4 + 3 ln d in both). pycma is a test-only
dependency (``pip install cma``), run in the same process with its stopping criteria off (budget only),
except with ``--restarts ipop`` where both use their own criteria and IPOP restarts. jes counts the
population plus one evaluation of the mean per generation ("jes evals"); "jes pop evals" leaves the
mean's out, as pycma counts.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import median_text, print_load, print_provenance  # noqa: E402

FUNCTIONS = {
    # name: (numpy f, x0 value)
    "sphere": (lambda x: float(np.sum(x ** 2)), 3.0),
    "rosenbrock": (lambda x: float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)), 0.0),
    "ellipsoid": (lambda x: float(np.sum(10.0 ** (6 * np.arange(len(x)) / (len(x) - 1)) * x ** 2)), 1.0),
    "rastrigin": (lambda x: float(10 * len(x) + np.sum(x ** 2 - 10 * np.cos(2 * np.pi * x))), 3.0),
}


def jax_function(name):
    import jax.numpy as jnp

    return {
        "sphere": lambda x: jnp.sum(x ** 2),
        "rosenbrock": lambda x: jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2),
        "ellipsoid": lambda x: jnp.sum(10.0 ** (6 * jnp.arange(x.shape[0]) / (x.shape[0] - 1)) * x ** 2),
        "rastrigin": lambda x: 10 * x.shape[0] + jnp.sum(x ** 2 - 10 * jnp.cos(2 * jnp.pi * x)),
    }[name]


def run_pycma(name, dim, seed, sigma0, target, budget, restarts):
    import cma

    f, x0 = FUNCTIONS[name]
    if restarts == "ipop":
        options = {"seed": seed + 1, "verbose": -9, "maxfevals": budget, "ftarget": target}
        result = cma.fmin(f, x0 * np.ones(dim), sigma0, options, restarts=9, incpopsize=2)
        best = result[1]
        return (int(result[3]) if best < target else None), best
    es = cma.CMAEvolutionStrategy(x0 * np.ones(dim), sigma0, {
        "seed": seed + 1, "verbose": -9, "maxfevals": budget, "tolfun": 0, "tolx": 0, "tolfunhist": 0,
        "tolstagnation": 1e9, "tolupsigma": 1e30, "tolflatfitness": 1e9})
    value = np.inf
    while not es.stop():
        xs = es.ask()
        es.tell(xs, [f(x) for x in xs])
        value = f(es.mean)
        if value < target:
            return es.countevals, value
    return None, value


def run_jes(name, dim, seeds, sigma0, target, budget, restarts):
    import jax.numpy as jnp

    import jes

    f, x0 = FUNCTIONS[name]
    out = []
    for seed in seeds:
        kwargs = dict(minimize=True, noise_std=sigma0, key=seed, target=target)
        if restarts == "ipop":
            r = jes.optimize(jax_function(name), x0 * jnp.ones(dim), "cma_es", restarts="ipop",
                             max_evaluations=budget, **kwargs)
            pop = r.num_evaluations - len(r.history["generation"])
            value = min(float(r.value), float(r.best_value))
        else:
            n = jes.strategies.get("cma_es").default_population(dim)
            r = jes.optimize(jax_function(name), x0 * jnp.ones(dim), "cma_es", num_generations=budget // (n + 1),
                             **kwargs)
            pop = len(r.history["generation"]) * n
            value = float(r.value)
        hit = value < target
        out.append((r.num_evaluations if hit else None, pop if hit else None, value))
    return out


def median(values):
    done = [v for v in values if v is not None]
    if not done:
        return "-"
    return f"{median_text(done)} ({min(done)}-{max(done)})"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--functions", default="sphere,rosenbrock")
    parser.add_argument("--dims", default="10")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--sigma0", type=float, default=0.5)
    parser.add_argument("--target", type=float, default=1e-8)
    parser.add_argument("--budget", type=int, default=100_000)
    parser.add_argument("--restarts", default="none", choices=("none", "ipop"))
    args = parser.parse_args(argv)
    print_provenance()
    import cma
    import jes

    jes.use_cpu_cores()
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"pycma {cma.__version__}, target f(mean) < {args.target:g}, sigma0 {args.sigma0}, restarts {args.restarts}, "
          f"seeds {args.seeds}: evaluations to target, median (min-max) over the seeds that reach it")
    print("| function | d | pycma solved | pycma evals | jes solved | jes pop evals | jes evals |")
    print("|---|---|---|---|---|---|---|")
    for name in args.functions.split(","):
        for dim in (int(d) for d in args.dims.split(",")):
            theirs = [run_pycma(name, dim, s, args.sigma0, args.target, args.budget, args.restarts) for s in seeds]
            ours = run_jes(name, dim, seeds, args.sigma0, args.target, args.budget, args.restarts)
            print(f"| {name} | {dim} | {sum(e is not None for e, _ in theirs)}/{len(seeds)} | "
                  f"{median([e for e, _ in theirs])} | {sum(e is not None for e, _, _ in ours)}/{len(seeds)} | "
                  f"{median([p for _, p, _ in ours])} | {median([e for e, _, _ in ours])} |", flush=True)


if __name__ == "__main__":
    main()
    print_load()
