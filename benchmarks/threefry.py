"""The training step with JAX's threefry hash unrolled (jes's default) against JAX's rolled CPU lowering.

Both programs give the same bits (tests/test_trainer.py compares them); only speed and compile time differ
(see jes/threefry.py). For each cell, in one process: two trainers of the same run, one compiled each way
(``jes.compiled.THREEFRY_UNROLLED``), stepped generation by generation in turn (so a change of this machine's
load falls on both), per seed (run key). Printed: the compile seconds of each,
the median over seeds of each seed's median step time over ``--repeats`` generations (after one warm-up), and
rolled / unrolled time per seed, median [min, max] over the seeds.

    python benchmarks/threefry.py
    python benchmarks/threefry.py --cells pendulum-mlp256-full --seeds 0,1 --repeats 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jes  # noqa: E402
import jes.compiled  # noqa: E402
from inference_ratio import MinAtarCNN  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import print_load, print_provenance  # noqa: E402

# name -> (policy, env, config fields)
CELLS = {
    "cartpole-gru-full": (lambda: jes.GRUPolicy(hidden=5, layers=2), "CartPole-v1", {}),
    "pendulum-mlp256-full": (lambda: jes.MLPPolicy((256, 256)), "Pendulum-v1", dict(num_members=256)),
    "minatar-cnn64-full": (lambda: MinAtarCNN(hidden=64), "Breakout-MinAtar", dict(num_members=512)),
    "pendulum-mlp256-r1": (lambda: jes.MLPPolicy((256, 256)), "Pendulum-v1",
                           dict(num_members=512, perturbation=jes.LowRank(1))),
    "minatar-cnn256-r1": (lambda: MinAtarCNN(hidden=256), "Breakout-MinAtar",
                          dict(num_members=512, perturbation=jes.LowRank(1))),
}


def compiled_trainer(name: str, unrolled: bool):
    """``(trainer, compiled step, compile seconds)`` of cell ``name``, threefry lowered ``unrolled`` or rolled."""
    policy, env, fields = CELLS[name]
    jes.compiled.THREEFRY_UNROLLED = unrolled
    try:
        trainer = jes.Trainer(policy(), env, "adam", jes.ESConfig(eval_episodes=2, **fields))
        start = time.perf_counter()
        step, _ = trainer.compiled_step(trainer.init_state(0))
        assert trainer.programs_threefry_unrolled == unrolled
        return trainer, step, time.perf_counter() - start
    finally:
        jes.compiled.THREEFRY_UNROLLED = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", default=",".join(CELLS), help=f"comma-separated, of {', '.join(CELLS)}")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--repeats", type=int, default=3, help="timed generations per seed and program")
    args = parser.parse_args()
    print_provenance()
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"jax {jax.__version__}, {os.cpu_count()} CPUs; seeds {args.seeds}, {args.repeats} generations each; "
          f"the programs take turns generation by generation")
    print("| cell | compile s, rolled | compile s, unrolled | ms/generation, rolled | ms/generation, unrolled | "
          "rolled / unrolled time |")
    print("|---|---|---|---|---|---|")
    true, false = jnp.bool_(True), jnp.bool_(False)
    for name in args.cells.split(","):
        medians = {False: [], True: []}
        ratios, trainers, steps, compile_s = [], {}, {}, {}
        for unrolled in (False, True):
            trainers[unrolled], steps[unrolled], compile_s[unrolled] = compiled_trainer(name, unrolled)
        for seed in seeds:
            states = {unrolled: trainer.init_state(seed) for unrolled, trainer in trainers.items()}
            times = {False: [], True: []}
            for g in range(args.repeats + 1):
                for unrolled in (False, True):
                    start = time.perf_counter()
                    states[unrolled], _ = jax.block_until_ready(steps[unrolled](states[unrolled], false, true))
                    if g:  # the first generation warms up
                        times[unrolled].append(time.perf_counter() - start)
            for unrolled in (False, True):
                medians[unrolled].append(statistics.median(times[unrolled]))
            ratios.append(statistics.median(r / u for r, u in zip(times[False], times[True])))
        ms = lambda u: f"{statistics.median(medians[u]) * 1e3:,.1f}"
        print(f"| {name} | {compile_s[False]:.2f} | {compile_s[True]:.2f} | {ms(False)} | {ms(True)} | "
              f"{statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}] |", flush=True)


if __name__ == "__main__":
    main()
    print_load()
