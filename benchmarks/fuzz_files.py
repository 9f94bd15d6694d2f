"""Fuzz jes's file readers: malformed checkpoints and .policy files through the whole load path.

Prints, per file kind, how many malformed files were read and how many raised anything other than
the reader's own error (``CheckpointError`` / ``PolicyFileError``): the goal is 0. The inputs
(tests/file_fuzz.py) are random bytes, truncations, valid checksums over junk payloads and valid
files with a field of a wrong type, in the content and in the meta.

    python benchmarks/fuzz_files.py --count 10000 --seed 0
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import file_fuzz  # noqa: E402

import jes  # noqa: E402
from jes import checkpoint  # noqa: E402
from jes.trained import ActionMap, PolicyFileError  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10000, help="random malformed files per kind (default 10000), besides the fixed cases every run reads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(3,)), "CartPole-v1", "adam",
                          jes.ESConfig(num_members=8, chunk_size=4, eval_episodes=2, num_generations=1))
    with tempfile.TemporaryDirectory(prefix="jes-fuzz-") as directory:  # removed after, not left in /tmp per run
        total_raw = fuzz(args, trainer, directory)
    sys.exit(1 if total_raw else 0)


def fuzz(args, trainer, directory: str) -> int:
    """Every reader over ``args.count`` malformed files written in ``directory``; the raw exceptions' count."""
    ckpt = checkpoint.save(os.path.join(directory, "valid.ckpt"), trainer, trainer.init_state(0))
    trained = jes.TrainedPolicy(trainer.policy, trainer.init_state(0).strategy.mean, trainer.spec.obs_shape,
                                ActionMap.from_spec(trainer.spec), env_name="CartPole-v1", max_steps=50)
    policy = jes.save_policy(trained, os.path.join(directory, "valid.policy"))
    def read_checkpoint(path):
        # Every reader step of `jes eval` / `jes train --resume` except building a Trainer (a compile per file):
        # the file, its policy, config and strategy rebuilt, then its state restored into a trainer of this run.
        ckpt = checkpoint.read(path)
        ckpt.policy(), ckpt.config(), checkpoint.build_strategy(ckpt.meta.get("strategy")), ckpt.run_key
        ckpt.restore_state(trainer)

    readers = {
        "checkpoint": (ckpt, read_checkpoint, (checkpoint.CheckpointError,)),
        "policy": (policy, lambda path: jes.load_policy(path), (PolicyFileError,)),
    }
    print(f"| reader | malformed files | raw exceptions | seconds |  (seed {args.seed})")
    print("|---|---|---|---|")
    total_raw = 0
    for kind, (valid, read, expected) in readers.items():
        start = time.perf_counter()
        seen, raw = file_fuzz.run(kind, open(valid, "rb").read(), args.count, read, expected, directory, args.seed)
        total_raw += len(raw)
        print(f"| {kind} | {seen} | {len(raw)} | {time.perf_counter() - start:.1f} |")
        for line in raw[:10]:
            print("   ", line[:300])
    return total_raw


if __name__ == "__main__":
    main()
