"""Learning parity of low-rank (EGGROLL) perturbations: generations to solve, full rank vs r = 1 vs r = 4.

Per cell (env, policy) and perturbation, over seeds: how many seeds reach the env's threshold (the
centre's mean return over fresh episodes), and the generations they needed (median and range).
One trainer per (cell, perturbation); seeds share its compiled step.

    python benchmarks/lowrank_parity.py --seeds 0,1,2,3,4
    python benchmarks/lowrank_parity.py --cells cartpole-gru,pendulum-32 --seeds 0,1,2,3,4,5,6,7,8,9
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import jes  # noqa: E402
from jes.loop import run  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from inference_ratio import MinAtarCNN  # noqa: E402

CELLS = {
    # name: (env, policy, threshold, generations, config)
    "cartpole-gru": ("CartPole-v1", lambda: jes.GRUPolicy(5, 2), 475.0, 50, dict(num_members=512)),
    "cartpole-mlp64": ("CartPole-v1", lambda: jes.MLPPolicy((64, 64)), 475.0, 50, dict(num_members=512)),
    "pendulum-32": ("Pendulum-v1", lambda: jes.MLPPolicy((32, 32)), -200.0, 100, dict(num_members=512)),
    "pendulum-256": ("Pendulum-v1", lambda: jes.MLPPolicy((256, 256)), -200.0, 100, dict(num_members=512)),
    "brax-inverted-pendulum": ("brax/inverted_pendulum?backend=spring", lambda: jes.MLPPolicy((16,)), 950.0, 100,
                               dict(num_members=64, noise_std=0.1, learning_rate=0.03, eval_episodes=16)),
    "minatar-breakout": ("Breakout-MinAtar", lambda: MinAtarCNN(hidden=64), 10.0, 100,
                         dict(num_members=512, max_episode_steps=1000)),
}
PERTURBATIONS = {"full rank": jes.FullRank(), "r=1": jes.LowRank(1), "r=4": jes.LowRank(4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", default="cartpole-gru,cartpole-mlp64,pendulum-32,pendulum-256")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--perturbations", default=",".join(PERTURBATIONS))
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    for cell in args.cells.split(","):
        env, make_policy, threshold, generations, extra = CELLS[cell]
        for label in args.perturbations.split(","):
            config = jes.ESConfig(num_generations=generations, stop_at_return=threshold,
                                  perturbation=PERTURBATIONS[label], **extra)
            trainer = jes.Trainer(make_policy(), env, "adam", config)
            solved, finals, started = [], [], time.perf_counter()
            for seed in seeds:
                result = run(trainer, trainer.init_state(seed), key=seed)
                solved.append(result.solved_generation)
                finals.append(result.final_centre_return)
                print(f"  {cell} {label} seed {seed}: solved at {result.solved_generation}, centre "
                      f"{result.final_centre_return:.1f}", flush=True)
            ok = [g for g in solved if g is not None]
            rows.append((cell, trainer.num_params, label, f"{len(ok)}/{len(seeds)}",
                         f"{np.median(ok):.0f} ({min(ok)}-{max(ok)})" if ok else "-",
                         f"{np.mean(finals):.1f} +- {np.std(finals):.1f}", f"{time.perf_counter() - started:.0f}"))
    print(f"\nseeds {seeds}; adam, ESConfig defaults unless the cell sets them; threshold on the centre's mean return")
    print("| cell | P | perturbation | solved | generations to solve, median (range) | final centre return | wall s |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(v) for v in row) + " |")


if __name__ == "__main__":
    main()
