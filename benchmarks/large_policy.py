"""A 1M-parameter policy trained with low-rank (EGGROLL) perturbations on this machine.

MLP 1024 x 1024 (1,054,721 parameters on Pendulum-v1) with 1,024 members. Printed per generation: the
centre's return, seconds, and the process's peak resident memory; at the end the perturbation floats a
chunk holds as sampled (``C / 2`` mirrored pairs' draws of ``r * sum(m + n) + dense leaves`` floats, and a sign
per member) against the ``C x P`` a full-rank chunk would.

    python benchmarks/large_policy.py --generations 5 --rank 1 --seeds 0,1,2,3,4

One ``jes.train`` per seed (its key and initial policy), one after another in this process; at the end the
median s/generation (generations after the first) of each seed, their median and [min, max] over seeds,
and the process's peak resident memory over all of them.
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
import numpy as np  # noqa: E402

import jes  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import print_load, print_provenance  # noqa: E402


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--members", type=int, default=1024)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--seeds", default="0", help="comma-separated run keys, one run each")
    parser.add_argument("--env", default="Pendulum-v1")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    print_provenance(seeds)
    policy = jes.MLPPolicy((args.hidden, args.hidden))
    per_seed, compiles = [], []
    for seed in seeds:
        rows = []

        def record(row):
            rows.append(row)
            print(f"seed {seed} generation {row['generation']}: centre {row['centre_return']:.1f}, pop mean "
                  f"{row['pop_mean']:.1f}, {row['generation_time']:.1f} s, peak RSS {peak_rss_gib():.2f} GiB", flush=True)

        start = time.perf_counter()
        result = jes.train(policy, args.env, "adam", key=seed, num_members=args.members,
                           num_generations=args.generations, eval_episodes=16, perturbation=jes.LowRank(args.rank),
                           log_dir=None, checkpoint_path=None, progress=False, callbacks=[record])
        trainer = result.trainer
        times = [r["generation_time"] for r in rows[1:]] or [rows[0]["generation_time"]]
        per_seed.append(float(np.median(times)))
        compiles.append(result.compile_time)
        print(f"seed {seed}: compile {result.compile_time:.0f} s; s/generation median {per_seed[-1]:.2f}; "
              f"wall {time.perf_counter() - start:.0f} s; centre {rows[0]['centre_return']:.1f} -> "
              f"{rows[-1]['centre_return']:.1f}", flush=True)
        assert math.isfinite(rows[-1]["centre_return"])
    # the chunk's members as sampled (one draw per mirrored pair, a sign per member; see the perturbations guide)
    state = jax.eval_shape(lambda: trainer.init_state(0))
    members, _, _ = jax.eval_shape(trainer.sample_chunk, state, jax.numpy.int32(0))
    chunk_floats = sum(math.prod(x.shape) for x in jax.tree.leaves(members))
    print(f"\n{args.env}, MLP {args.hidden}x{args.hidden}: P = {trainer.num_params:,}, {args.members} members, "
          f"chunks of {trainer.chunk_size}, rank {args.rank}, seeds {args.seeds}, jax {jax.__version__}, "
          f"{os.cpu_count()} CPUs")
    print(f"perturbation floats per chunk: {chunk_floats:,} "
          f"(a full-rank chunk: C x P = {trainer.chunk_size * trainer.num_params:,}, "
          f"{trainer.chunk_size * trainer.num_params / chunk_floats:.0f}x more)")
    print(f"s/generation over seeds: median {np.median(per_seed):.2f} [{min(per_seed):.2f}, {max(per_seed):.2f}] "
          f"(each seed's median of generation{' 1' if args.generations < 2 else f's 2..{args.generations}'}); "
          f"compile median {np.median(compiles):.0f} s "
          f"[{min(compiles):.0f}, {max(compiles):.0f}]; peak RSS of the process {peak_rss_gib():.2f} GiB")
    print_load()

if __name__ == "__main__":
    main()
