"""Distributed jes: bytes on the wire per generation, and the overhead of master + local workers.

Part 1 runs a master with one local worker on a 367-parameter GRU and on a
~100k-parameter MLP (CartPole) and prints the bytes each way per generation
once the worker is synchronised: they do not grow with the parameter count,
because parameters never travel after the first snapshot.

Part 2 times population 512 on CartPole: in-process training vs a master with
two local workers pinned to one core each (this machine's cores), and checks
that the parameters are bit-identical.

    python benchmarks/distributed.py [--generations 6] [--cores 0,1] [--seeds 0,1,2,3,4]

Every part runs once per seed (run key and initial policy) with the same master and workers (a new seed's
state reaches the workers as a snapshot, which is not counted); bytes and ms/generation are reported per
seed and as the median [min, max] over seeds, each seed's figure being the median over its generations
(bytes: the mean over its generations).
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

import numpy as np

import jes
from jes.distributed.master import Master
from jes.loop import run

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import print_load, print_provenance  # noqa: E402

SECRET = os.urandom(32).hex()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_workers(port: int, cores: list[str | None]) -> list[subprocess.Popen]:
    procs = []
    for i, core in enumerate(cores):
        cmd = [sys.executable, "-m", "jes.distributed.worker", "--master", f"127.0.0.1:{port}", "--name", f"bench{i}",
               "--log-level", "WARNING", "--exit-with", str(os.getpid())]  # no orphan if this process is killed
        if core is not None:
            cmd += ["--cores", core]
        procs.append(subprocess.Popen(cmd, env=dict(os.environ, JES_SECRET=SECRET)))
    return procs


def stop(procs) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


def spread(values, fmt="{:.1f}") -> str:
    values = np.asarray(values, dtype=float)
    return f"{fmt.format(np.median(values))} [{fmt.format(values.min())}, {fmt.format(values.max())}]"


def wire_bytes(policy, generations: int, seeds: list[int], perturbation: str = "full_rank") -> tuple[int, list[float], list[float]]:
    config = jes.ESConfig(num_members=64, chunk_size=8, num_generations=generations + 2, eval_every=0, eval_episodes=4,
                          perturbation=perturbation)
    trainer = jes.Trainer(policy, "CartPole-v1", "adam", config)
    port = free_port()
    procs = start_workers(port, [None])
    sent, received = [], []
    try:
        with Master(trainer, f"127.0.0.1:{port}", secret=SECRET, env="CartPole-v1", optimizer="adam",
                    status_interval=1e9) as master:
            if master.wait_for_workers(trainer.init_state(seeds[0]), 1, 300) < 1:
                raise RuntimeError("the worker did not come up")
            for seed in seeds:
                state = trainer.init_state(seed)
                state, _ = master.step(state, False)  # first generation: the worker gets its snapshot
                state, _ = master.step(state, False)
                sent0, received0 = master.stats["bytes_sent"], master.stats["bytes_received"]
                for _ in range(generations):
                    state, _ = master.step(state, False)
                sent.append((master.stats["bytes_sent"] - sent0) / generations)
                received.append((master.stats["bytes_received"] - received0) / generations)
            return trainer.num_params, sent, received
    finally:
        stop(procs)


def overhead(generations: int, cores: list[str], seeds: list[int]) -> None:
    config = jes.ESConfig(num_members=512, chunk_size=64, num_generations=generations + 1, eval_every=0, eval_episodes=8)
    policy = jes.GRUPolicy(hidden=5, layers=2)
    trainer = jes.Trainer(policy, "CartPole-v1", "adam", config)
    local_ms, local_params = [], []
    for seed in seeds:
        local = run(trainer, trainer.init_state(seed), key=seed)  # the first generation waits for the compile
        local_ms.append(1000 * float(np.median(local.history["generation_time"][1:])))
        local_params.append(local.flat_params)

    port = free_port()
    procs = start_workers(port, cores)
    dist_ms, identical, shares = [], [], {}
    try:
        with Master(trainer, f"127.0.0.1:{port}", secret=SECRET, env="CartPole-v1", optimizer="adam",
                    status_interval=1e9) as master:
            if master.wait_for_workers(trainer.init_state(seeds[0]), len(cores), 300) < len(cores):
                raise RuntimeError("the workers did not come up")
            for seed, params in zip(seeds, local_params):
                state = trainer.init_state(seed)
                state, _ = master.step(state, False)  # the workers get this seed's snapshot
                times = []
                for _ in range(generations):
                    t0 = time.perf_counter()
                    state, _ = master.step(state, False)
                    times.append(time.perf_counter() - t0)
                dist_ms.append(1000 * float(np.median(times)))
                identical.append(bool(np.array_equal(np.asarray(state.params), params)))
            shares = {w.name: w.members_done for w in master.workers.values()}
            shares["master"] = master.stats["master_chunks"] * trainer.chunk_size
    finally:
        stop(procs)
    print(f"population 512, GRU 5x2 (367 params), {generations} generations per seed, chunk 64, "
          f"{os.cpu_count()} cores; ms/generation per seed = median over its generations 2..{generations + 1}:")
    print(f"  in-process (both cores)         : {spread(local_ms)} ms/generation median [min, max] over seeds "
          f"(per seed: {' '.join(f'{t:.1f}' for t in local_ms)})")
    print(f"  master + {len(cores)} workers (cores {','.join(cores)}): {spread(dist_ms)} ms/generation "
          f"(per seed: {' '.join(f'{t:.1f}' for t in dist_ms)}); ratio to in-process per seed "
          f"{spread(np.array(dist_ms) / np.array(local_ms), '{:.2f}')}; members evaluated over all seeds: {shares}")
    print(f"  parameters bit-identical to in-process, per seed: {identical}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=6)
    parser.add_argument("--cores", default="0,1", help="one local worker per listed core")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="run keys, comma-separated")
    parser.add_argument("--part", choices=("all", "bytes", "overhead"), default="all")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    print_provenance(seeds)
    if args.part != "overhead":
        wire_table(args.generations, seeds)
    if args.part != "bytes":
        overhead(args.generations, args.cores.split(","), seeds)
    print_load()


def wire_table(generations: int, seeds: list[int]) -> None:
    print("bytes on the wire per generation, 1 worker, population 64 in chunks of 8 (after the first snapshot), "
          "median [min, max] over seeds:")
    big = jes.MLPPolicy(hidden_sizes=(256, 256, 128))
    for label, policy, perturbation in (("GRUPolicy(hidden=5, layers=2)", jes.GRUPolicy(hidden=5, layers=2), "full_rank"),
                                        ("MLPPolicy(hidden_sizes=(256, 256, 128))", big, "full_rank"),
                                        ("the same MLP, low rank r = 1", big, "low_rank")):
        params, sent, received = wire_bytes(policy, generations, seeds, perturbation)
        print(f"  {label:42s} {params:7d} params: master->worker {spread(sent, '{:.0f}')} B, "
              f"worker->master {spread(received, '{:.0f}')} B", flush=True)


if __name__ == "__main__":
    main()
