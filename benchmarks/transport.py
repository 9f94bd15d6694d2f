"""What CURVE on every master-worker connection costs: MB/s of large messages over loopback, CURVE (as jes's master
and workers set their sockets up, jes.distributed.transport) against ZeroMQ plaintext, side by side in one run.

    python benchmarks/transport.py [--size-mib 100] [--messages 3] [--repeats 5]

Each repeat sends ``--messages`` messages of ``--size-mib`` MiB from a DEALER to a ROUTER on 127.0.0.1, the two
transports taking turns; prints each transport's median MB/s over the repeats, its [min, max], and the ratio of
the medians. Only a joining worker's state snapshot is this large: results and work items are kilobytes.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import zmq

from jes.distributed import transport

SECRET = b"benchmark-secret-0123456789abcdef"


def pair(context: zmq.Context, curve: bool) -> tuple[zmq.Socket, zmq.Socket, object]:
    router = context.socket(zmq.ROUTER)
    dealer = context.socket(zmq.DEALER)
    for sock in (router, dealer):
        sock.setsockopt(zmq.LINGER, 0)
    gatekeeper = None
    if curve:
        transport.secure_server(router, SECRET)
        gatekeeper = transport.Gatekeeper(context, SECRET)
        transport.secure_client(dealer, SECRET)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    dealer.send(b"hello")
    router.recv_multipart()  # connected (and, with CURVE, through the handshake)
    return router, dealer, gatekeeper


def megabytes_per_second(curve: bool, data: bytes, messages: int) -> float:
    context = zmq.Context()
    router, dealer, gatekeeper = pair(context, curve)
    try:
        start = time.perf_counter()
        for _ in range(messages):
            dealer.send(data)
            router.recv_multipart()
        return messages * len(data) / 1e6 / (time.perf_counter() - start)
    finally:
        dealer.close(0)
        router.close(0)
        if gatekeeper is not None:
            gatekeeper.stop()
        context.term()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=100)
    parser.add_argument("--messages", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    data = os.urandom(args.size_mib * 2**20)
    rates: dict[str, list[float]] = {"plaintext": [], "CURVE": []}
    for _ in range(args.repeats):
        for name in rates:
            rates[name].append(megabytes_per_second(name == "CURVE", data, args.messages))
    medians = {name: statistics.median(r) for name, r in rates.items()}
    print(f"{args.messages} messages of {args.size_mib} MiB per repeat, {args.repeats} repeats, taking turns")
    for name, r in rates.items():
        print(f"{name:>9}: {medians[name]:7.0f} MB/s  [{min(r):.0f}, {max(r):.0f}]")
    print(f"CURVE / plaintext: {medians['CURVE'] / medians['plaintext']:.2f}")


if __name__ == "__main__":
    main()
