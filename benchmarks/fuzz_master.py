"""Fuzz the distributed master's message handler: correctly signed random and mutated messages.

Feeds ``--messages`` inputs (tests/master_fuzz.py: sessions, requests that get real assignments,
results for them and for anything else, heartbeats, goodbyes, unknown types, each with fields dropped
or replaced by wrong types, NaN, inf, huge or negative numbers, arrays of the wrong dtype, shape or
length) to ``Master._receive`` over many generations, with the master's own evaluations faked (zeros,
nothing compiles) and a fake clock, so it runs in seconds. Prints the count of inputs, of raw exceptions
(caught by the master's last-resort handler, or escaping it or its scheduling calls; all should be 0),
of generations that did not finish once the fuzzed workers fell silent, and the master's counters.

    python benchmarks/fuzz_master.py [--messages 10000] [--seed 0] [--audit 0.5]
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import jes  # noqa: E402
from jes.distributed import protocol  # noqa: E402
from jes.distributed.master import Master  # noqa: E402
from master_fuzz import MasterFuzzer  # noqa: E402

SECRET = b"fuzz-secret-0123456789abcdef"


class Clock:
    now = 1000.0

    def __call__(self):
        return self.now


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--per-generation", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--audit", type=float, default=0.5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)  # the master logs every drop; we count them instead

    config = jes.ESConfig(num_members=32, chunk_size=4, eval_episodes=2)
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(3,)), "CartPole-v1", "adam", config)
    clock = Clock()
    master = Master(trainer, "127.0.0.1:0", secret=SECRET, env="CartPole-v1", optimizer="adam",
                    heartbeat_interval=0.5, worker_timeout=3.0, assign_timeout=4.0, min_deadline=1.0,
                    audit=args.audit, audit_seed=args.seed)
    master.clock = clock

    def zeros(start, stop):  # the master's own evaluation, faked
        return tuple(np.zeros((stop - start, *a.shape[1:]), a.dtype) for a in master._results)

    master._evaluate_range = zeros
    master._evaluate_here = lambda chunk: master._store([chunk], *zeros(chunk, chunk + 1))
    state = trainer.init_state(0)
    master._set_run(state)
    state_hash = protocol.state_hash(state)
    fuzzer = MasterFuzzer(master, SECRET, seed=args.seed, identities=6)
    escaped, stuck, generation = 0, 0, 0

    def guarded(fn, *a):
        nonlocal escaped
        try:
            fn(*a)
        except Exception:  # noqa: BLE001 - counted: nothing should get here
            escaped += 1
            if escaped <= 5:
                traceback.print_exc()

    def schedule():
        guarded(master._expire, clock.now)
        guarded(master._assign_idle)
        if master._pending and master._should_evaluate_here():
            guarded(master._evaluate_here, master._pending[0])
        elif not master._pending and master._audits and master._should_audit_here():
            guarded(master._audit_here, *master._audits.pop(0))

    try:
        while fuzzer.sent < args.messages:
            master._begin(state, generation, state_hash)
            budget = fuzzer.sent + min(args.per_generation, args.messages - fuzzer.sent)
            while fuzzer.sent < budget:
                guarded(fuzzer.feed, 5)
                clock.now += 0.05
                if fuzzer.rng.random() < 0.3:
                    schedule()
            for _ in range(10 * trainer.num_chunks + 100):  # the fuzzed workers fall silent: it must finish
                if master._have.all() and not master._auditing():
                    break
                clock.now += 0.5
                schedule()
            else:
                stuck += 1
            master._end()
            generation += 1
    finally:
        master.close()
    print(f"inputs: {fuzzer.sent} over {generation} generations")
    print(f"raw exceptions: {master.stats['handler_errors'] + escaped} "
          f"(in the handler: {master.stats['handler_errors']}, escaping: {escaped})")
    print(f"generations that did not finish: {stuck}")
    print("master counters:", dict(sorted(master.stats.items())))
    return 0 if master.stats["handler_errors"] + escaped + stuck == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
