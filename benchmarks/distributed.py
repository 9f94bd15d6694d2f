"""Distributed jes: bytes on the wire per generation, and the overhead of master + local workers.

Part 1 runs a master with one local worker on a 367-parameter GRU and on a
~100k-parameter MLP (CartPole) and prints the bytes each way per generation
once the worker is synchronised: they do not grow with the parameter count,
because parameters never travel after the first snapshot.

Part 2 times population 512 on CartPole: in-process training vs a master with
two local workers pinned to one core each (this machine's cores), and checks
that the parameters are bit-identical.

    python benchmarks/distributed.py [--generations 6] [--cores 0,1]
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

SECRET = os.urandom(32).hex()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_workers(port: int, cores: list[str | None]) -> list[subprocess.Popen]:
    procs = []
    for i, core in enumerate(cores):
        cmd = [sys.executable, "-m", "jes.distributed.worker", "--master", f"127.0.0.1:{port}", "--name", f"bench{i}",
               "--log-level", "WARNING"]
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


def wire_bytes(policy, generations: int) -> tuple[int, float, float]:
    config = jes.ESConfig(num_members=64, chunk_size=8, num_generations=generations + 2, eval_every=0, eval_episodes=4)
    trainer = jes.Trainer(policy, "CartPole-v1", "adam", config)
    port = free_port()
    procs = start_workers(port, [None])
    try:
        with Master(trainer, f"127.0.0.1:{port}", secret=SECRET, env="CartPole-v1", optimizer="adam",
                    status_interval=1e9) as master:
            state = trainer.init_state(0)
            if master.wait_for_workers(state, 1, 300) < 1:
                raise RuntimeError("the worker did not come up")
            state, _ = master.step(state, False)  # first generation: the worker gets its snapshot
            state, _ = master.step(state, False)
            sent0, received0 = master.stats["bytes_sent"], master.stats["bytes_received"]
            for _ in range(generations):
                state, _ = master.step(state, False)
            sent = (master.stats["bytes_sent"] - sent0) / generations
            received = (master.stats["bytes_received"] - received0) / generations
            return trainer.num_params, sent, received
    finally:
        stop(procs)


def overhead(generations: int, cores: list[str]) -> None:
    config = jes.ESConfig(num_members=512, chunk_size=64, num_generations=generations + 1, eval_every=0, eval_episodes=8)
    policy = jes.GRUPolicy(hidden=5, layers=2)
    trainer = jes.Trainer(policy, "CartPole-v1", "adam", config)
    local = run(trainer, trainer.init_state(0), key=0, num_generations=1)  # compile
    t0 = time.perf_counter()
    local = run(trainer, local.state, key=0)
    t_local = (time.perf_counter() - t0) / generations

    port = free_port()
    procs = start_workers(port, cores)
    try:
        with Master(trainer, f"127.0.0.1:{port}", secret=SECRET, env="CartPole-v1", optimizer="adam",
                    status_interval=1e9) as master:
            state = trainer.init_state(0)
            if master.wait_for_workers(state, len(cores), 300) < len(cores):
                raise RuntimeError("the workers did not come up")
            state, _ = master.step(state, False)
            t0 = time.perf_counter()
            for _ in range(generations):
                state, _ = master.step(state, False)
            t_dist = (time.perf_counter() - t0) / generations
            shares = {w.name: w.members_done for w in master.workers.values()}
            shares["master"] = master.stats["master_chunks"] * trainer.chunk_size
    finally:
        stop(procs)
    identical = np.array_equal(np.asarray(state.params), local.flat_params)
    print(f"population 512, GRU 5x2 (367 params), {generations} generations, chunk 64, 2 cores:")
    print(f"  in-process (both cores)         : {t_local * 1000:7.1f} ms/generation")
    print(f"  master + {len(cores)} workers (cores {','.join(cores)}): {t_dist * 1000:7.1f} ms/generation "
          f"(overhead {100 * (t_dist / t_local - 1):+.0f}%), members evaluated: {shares}")
    print(f"  parameters bit-identical to in-process: {identical}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=6)
    parser.add_argument("--cores", default="0,1", help="one local worker per listed core")
    args = parser.parse_args()
    print("bytes on the wire per generation, 1 worker, population 64 in chunks of 8 (after the first snapshot):")
    for label, policy in (("GRUPolicy(hidden=5, layers=2)", jes.GRUPolicy(hidden=5, layers=2)),
                          ("MLPPolicy(hidden_sizes=(256, 256, 128))", jes.MLPPolicy(hidden_sizes=(256, 256, 128)))):
        params, sent, received = wire_bytes(policy, args.generations)
        print(f"  {label:42s} {params:7d} params: master->worker {sent:7.0f} B, worker->master {received:7.0f} B")
    overhead(args.generations, args.cores.split(","))


if __name__ == "__main__":
    main()
