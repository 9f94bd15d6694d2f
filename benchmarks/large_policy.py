"""A 1M-parameter policy trained with low-rank (EGGROLL) perturbations on this machine.

MLP 1024 x 1024 (1,055,745 parameters on Pendulum-v1) with 1,024 members. Printed per generation: the
centre's return, seconds, and the process's peak resident memory; at the end the perturbation floats a
chunk holds (``C * (r * sum(m + n) + dense leaves)``) against the ``C x P`` a full-rank chunk would.

    python benchmarks/large_policy.py --generations 5 --rank 1 --seed 0
"""
from __future__ import annotations

import argparse
import math
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402

import jes  # noqa: E402


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--members", type=int, default=1024)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env", default="Pendulum-v1")
    args = parser.parse_args()
    policy = jes.MLPPolicy((args.hidden, args.hidden))
    rows = []

    def record(row):
        rows.append(row)
        print(f"generation {row['generation']}: centre {row['centre_return']:.1f}, pop mean {row['pop_mean']:.1f}, "
              f"{row['generation_time']:.1f} s, peak RSS {peak_rss_gib():.2f} GiB", flush=True)

    start = time.perf_counter()
    result = jes.train(policy, args.env, "adam", key=args.seed, num_members=args.members,
                       num_generations=args.generations, eval_episodes=16, perturbation=jes.LowRank(args.rank),
                       log_dir=None, checkpoint_path=None, progress=False, callbacks=[record])
    trainer = result.trainer
    layout = trainer.ctx.layout
    per_member = args.rank * sum(leaf.rows + leaf.cols for leaf in layout.factored) + layout.dense_size
    print(f"\n{args.env}, MLP {args.hidden}x{args.hidden}: P = {trainer.num_params:,}, {args.members} members, "
          f"chunks of {trainer.chunk_size}, rank {args.rank}, seed {args.seed}, jax {jax.__version__}, "
          f"{os.cpu_count()} CPUs")
    print(f"perturbation floats per chunk: {trainer.chunk_size * per_member:,} "
          f"(a full-rank chunk: C x P = {trainer.chunk_size * trainer.num_params:,}, "
          f"{trainer.chunk_size * trainer.num_params / (trainer.chunk_size * per_member):.0f}x more)")
    times = sorted(r["generation_time"] for r in rows[1:]) or [rows[0]["generation_time"]]
    print(f"compile {result.compile_time:.0f} s; s/generation median {times[len(times) // 2]:.1f}; "
          f"wall {time.perf_counter() - start:.0f} s; peak RSS {peak_rss_gib():.2f} GiB; "
          f"centre {rows[0]['centre_return']:.1f} -> {rows[-1]['centre_return']:.1f}")
    assert math.isfinite(rows[-1]["centre_return"])


if __name__ == "__main__":
    main()
