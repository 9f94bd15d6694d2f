"""Every strategy side by side: RL envs (jes.train) and black-box functions (jes.optimize).

    python benchmarks/strategies.py                       # everything (long)
    python benchmarks/strategies.py --part rl --envs CartPole-v1 --seeds 0,1,2,3,4
    python benchmarks/strategies.py --part functions --dims 10,100
    python benchmarks/strategies.py --part functions --functions rastrigin --seeds 0,1,2

RL: per strategy and env, generations and evaluations (members + centre episodes) until the
centre reaches the env's threshold on fresh episodes, final centre return mean +- std over seeds,
and steady-state s/generation (compile excluded; one compile per strategy and env, shared by seeds).

Functions: sphere and Rosenbrock (evaluations until f(mean) < 1e-6, within a budget) and
Rastrigin (f(mean) after the budget) at several dimensions.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jes  # noqa: E402
from jes import blackbox  # noqa: E402
from jes.loop import run  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import median_text, print_load, print_provenance  # noqa: E402

ENVS = {
    # env: (policy, threshold, generations, members)
    "CartPole-v1": (lambda: jes.GRUPolicy(hidden=5, layers=2), 475.0, 50, 512),
    "Acrobot-v1": (lambda: jes.GRUPolicy(hidden=5, layers=3), -100.0, 50, 512),
    "Pendulum-v1": (lambda: jes.MLPPolicy(hidden_sizes=(32, 32)), -200.0, 100, 512),
}


def rl(strategies, envs, seeds, generations_override):
    rows = []
    for env in envs:
        make_policy, threshold, generations, members = ENVS[env]
        generations = generations_override or generations
        for name in strategies:
            config = jes.ESConfig(num_members=members, num_generations=generations, stop_at_return=threshold)
            trainer = jes.Trainer(make_policy(), env, None, config, strategy=name)
            solved, finals, gen_times, evals, seed_gen_s = [], [], [], [], []
            compile_time = None
            for seed in seeds:
                result = run(trainer, trainer.init_state(seed), key=seed)
                compile_time = result.compile_time
                h = result.history
                solved.append(result.solved_generation)
                finals.append(result.final_centre_return)
                gen_times.extend(h["generation_time"][1:])
                if len(h["generation_time"]) > 1:
                    seed_gen_s.append(float(np.median(h["generation_time"][1:])))
                n = len(h["generation"]) if result.solved_generation is None else result.solved_generation
                evals.append(n * (members + config.eval_episodes))
                print(f"  {env} {name} seed {seed}: solved at {result.solved_generation}, centre "
                      f"{result.final_centre_return:.1f}", flush=True)
            ok = [g for g in solved if g is not None]
            rows.append(dict(env=env, strategy=name, solved=f"{len(ok)}/{len(seeds)}",
                             gens=f"{median_text(ok)} ({min(ok)}-{max(ok)})" if ok else "-",
                             evals=median_text([e for e, g in zip(evals, solved) if g is not None]) if ok else "-",
                             final=f"{np.mean(finals):.1f} +- {np.std(finals):.1f}",
                             s_per_gen=(f"{np.median(gen_times):.3f} [{min(seed_gen_s):.3f}, {max(seed_gen_s):.3f}]"
                                        if gen_times else "-"),
                             per_seed=" ".join("-" if g is None else str(g) for g in solved),
                             compile=f"{compile_time:.1f}"))
    print("\n| env | strategy | solved | generations to solve, median (range) | evaluations to solve (median) "
          "| final centre return | s/generation, median [min, max of seeds' medians] | compile s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['env']} | {r['strategy']} | {r['solved']} | {r['gens']} | {r['evals']} | {r['final']} | "
              f"{r['s_per_gen']} | {r['compile']} |")
    print("\ngeneration each seed solved at (- = not within the budget), in seed order:")
    for r in rows:
        print(f"  {r['env']} {r['strategy']}: {r['per_seed']}")


def sphere(x):
    return jnp.sum(x * x)


def rosenbrock(x):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def rastrigin(x):
    return 10.0 * x.shape[0] + jnp.sum(x * x - 10.0 * jnp.cos(2 * jnp.pi * x))


FUNCTIONS = {
    # name: (fn, x0 value, noise_std, target or None)
    "sphere": (sphere, 3.0, 0.2, 1e-6),
    "rosenbrock": (rosenbrock, 0.0, 0.1, 1e-6),
    "rastrigin": (rastrigin, 3.0, 2.0, None),
}


def functions(strategies, dims, seeds, budget, names=tuple(FUNCTIONS)):
    print("\n| function | d | strategy | population | evaluations to f < 1e-6 (median, runs that reached it) "
          "| final f(mean), median [min, max] | s per run (median) |")
    print("|---|---|---|---|---|---|---|")
    for fname in names:
        fn, start, sigma, target = FUNCTIONS[fname]
        for d in dims:
            for name in strategies:
                reached, finals, walls = [], [], []
                strategy = jes.strategies.get(name)
                pop = strategy.default_population(d)
                pop += pop % 2 if strategy.antithetic(True) else 0
                generations = max(1, budget(d) // (pop + 1))
                config = blackbox._config(pop, generations, sigma, None, "centered_ranks", 0.0, None, strategy)
                problem = blackbox.FunctionProblem(fn, start * jnp.ones(d), strategy, config, minimize=True)
                for seed in seeds:  # one compiled program per (function, d, strategy), shared by the seeds
                    t0 = time.perf_counter()
                    r = blackbox.run_optimization(problem, seed, target=target)
                    walls.append(time.perf_counter() - t0)
                    finals.append(r.value)
                    if target is not None and r.value < target:
                        reached.append(int(r.history["evaluations"][-1]))
                ev = f"{median_text(reached)} ({len(reached)}/{len(seeds)})" if reached else f"- (0/{len(seeds)})"
                if target is None:
                    ev = "n/a"
                print(f"| {fname} | {d} | {name} | {pop} | {ev} | {np.median(finals):.3g} "
                      f"[{np.min(finals):.3g}, {np.max(finals):.3g}] | {np.median(walls):.1f} |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("rl", "functions", "all"), default="all")
    parser.add_argument("--strategies", default=",".join(jes.strategies.names()))
    parser.add_argument("--envs", default=",".join(ENVS))
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--generations", type=int, default=0, help="override the per-env generation budget")
    parser.add_argument("--functions", default=",".join(FUNCTIONS), help="which of: " + ", ".join(FUNCTIONS))
    parser.add_argument("--dims", default="10,100,1000")
    parser.add_argument("--budget", type=int, default=0, help="function evaluations per run (default 2e4 * sqrt(d/10))")
    args = parser.parse_args(argv)
    jes.use_cpu_cores()
    strategies = args.strategies.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    print_provenance(seeds)
    print(f"jax {jax.__version__} on {jax.devices()}")
    if args.part in ("rl", "all"):
        rl(strategies, args.envs.split(","), seeds, args.generations)
    if args.part in ("functions", "all"):
        budget = (lambda d: args.budget) if args.budget else (lambda d: int(20000 * math.sqrt(d / 10)))
        functions(strategies, [int(d) for d in args.dims.split(",")], seeds, budget, args.functions.split(","))
    print_load()


if __name__ == "__main__":
    main()
