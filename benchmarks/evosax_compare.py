"""jes and evosax side by side on the same black-box functions (evosax is a benchmark-only extra).

    pip install --target /tmp/evosax "evosax==0.3.2" dotmap --no-deps   # beside jes's environment
    PYTHONPATH=/tmp/evosax python benchmarks/evosax_compare.py [--dims 10,100] [--seeds 0,1,2]

evosax is not a jes dependency; it is put on ``PYTHONPATH`` for this script only (its other
requirements, jax, flax, numpy and matplotlib, are jes's or gymnax's already).

Both libraries get the same function, start point, initial sigma, population (jes's default for
the dimension, ``4 + 3 ln d``), evaluation budget (as ``benchmarks/strategies.py``:
``2e4 * sqrt(d / 10)``, each generation counted as its members plus one evaluation of the mean) and
seeds; each library's own defaults otherwise. The strategies compared are the two that have no
optimizer or learning rate to choose, so "defaults" means the paper's algorithm in both:
sep-CMA-ES and SNES. Both minimise; the target is on f(mean). evosax runs its generations inside
compiled ``lax.scan`` blocks of 25 generations (stopping after the block that reaches the target), jes
through ``jes.optimize``'s compiled generation (one call per generation, stopping at the target);
each compiles once per configuration, shared by the seeds; "s" is the median wall time per run over
the seeds (the first seed's includes the compile).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jes  # noqa: E402
from jes import blackbox  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from strategies import FUNCTIONS  # noqa: E402  (same functions, start points and sigmas)

PAIRS = {"sep_cma_es": "Sep_CMA_ES", "snes": "SNES"}


class EvosaxRun:
    """One evosax configuration, compiled once and shared by the seeds (as jes shares its program)."""

    BLOCK = 25  # generations per compiled call; the run stops after the block that reaches the target

    def __init__(self, algorithm, fn, x0, sigma, population, generations):
        self.es = algorithm(population_size=population, solution=x0)
        self.params = self.es.default_params.replace(std_init=sigma)
        self.x0, self.fn, self.generations = x0, fn, generations

        def generation(state, k):
            ask_key, tell_key = jax.random.split(k)
            xs, state = self.es.ask(ask_key, state, self.params)
            state, _ = self.es.tell(tell_key, xs, jax.vmap(fn)(xs), state, self.params)
            return state, fn(state.mean)

        self.block = jax.jit(lambda state, keys: jax.lax.scan(generation, state, keys))

    def __call__(self, seed, target):
        """f(mean) after each generation run (all of them, or up to the block that reached ``target``)."""
        key = jax.random.key(seed)
        state = self.es.init(key, self.x0, self.params)
        keys = jax.random.split(jax.random.fold_in(key, 1), self.generations)
        values = []
        for start in range(0, self.generations, self.BLOCK):
            chunk = keys[start:start + self.BLOCK]
            if chunk.shape[0] < self.BLOCK:  # the last, shorter block: pad, keep the real generations
                chunk = jnp.concatenate([chunk, keys[:self.BLOCK - chunk.shape[0]]])
            state, block_values = self.block(state, chunk)
            values.extend(np.asarray(block_values)[: min(self.BLOCK, self.generations - start)].tolist())
            if target is not None and min(values) < target:
                break
        return np.asarray(values)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", default="10,100")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--functions", default=",".join(FUNCTIONS))
    parser.add_argument("--strategies", default=",".join(PAIRS))
    args = parser.parse_args(argv)
    try:
        import evosax
        from evosax import algorithms
    except ImportError:
        sys.exit("evosax is not importable: install it beside jes as the docstring says (it is not a jes dependency)")
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"jax {jax.__version__}, evosax {getattr(evosax, '__version__', '0.3.x')}, jes on {jax.devices()}")
    print("\n| function | d | strategy | library | population | evaluations to f < 1e-6 (median, runs that reached it) "
          "| final f(mean) (median) | s per run (median) |")
    print("|---|---|---|---|---|---|---|---|")
    for fname in args.functions.split(","):
        fn, start, sigma, target = FUNCTIONS[fname]
        for d in (int(x) for x in args.dims.split(",")):
            x0 = start * jnp.ones(d)
            budget = int(2e4 * (d / 10) ** 0.5)
            for name in args.strategies.split(","):
                strategy = jes.strategies.get(name).for_functions()
                population = strategy.default_population(d)
                generations = max(1, budget // (population + 1))
                config = blackbox._config(population, generations, sigma, None, "centered_ranks", 0.0, None, strategy)
                problem = blackbox.FunctionProblem(fn, x0, strategy, config, minimize=True)
                results = {"jes": [], "evosax": []}
                evosax_run = EvosaxRun(getattr(algorithms, PAIRS[name]), fn, x0, sigma, population, generations)
                for seed in seeds:
                    t0 = time.perf_counter()
                    r = blackbox.run_optimization(problem, seed, target=target)
                    reached = int(r.history["evaluations"][-1]) if target is not None and r.value < target else None
                    results["jes"].append((reached, float(r.value), time.perf_counter() - t0))
                    t0 = time.perf_counter()
                    values = evosax_run(seed, target)
                    hit = np.flatnonzero(values < target) if target is not None else []
                    reached = int((hit[0] + 1) * (population + 1)) if len(hit) else None
                    final = values[hit[0]] if len(hit) else values[-1]  # where jes stops too: at the target
                    results["evosax"].append((reached, float(final), time.perf_counter() - t0))
                for library, rows in results.items():
                    got = [e for e, _, _ in rows if e is not None]
                    ev = "n/a" if target is None else (
                        f"{np.median(got):.0f} ({len(got)}/{len(rows)})" if got else f"- (0/{len(rows)})")
                    print(f"| {fname} | {d} | {name} | {library} | {population} | {ev} | "
                          f"{np.median([v for _, v, _ in rows]):.3g} | {np.median([s for _, _, s in rows]):.2f} |",
                          flush=True)


if __name__ == "__main__":
    main()
