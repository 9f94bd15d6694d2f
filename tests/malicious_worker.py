"""A real `jes-worker` that holds the shared secret, speaks the protocol, and lies (tests/test_distributed_hostile.py).

It is :class:`jes.distributed.worker.Worker` itself (same session, MACs, heartbeats, evaluation), with
its outgoing ``result`` messages rewritten by its mode. The mode is read, for this worker's ``--name``,
from the JSON file ``--modes`` at the start of every session with a master, so one process serves
several masters (one a test) in turn:

    honest        unchanged
    never_issued  results for chunks it was never issued (under other assignment ids, and under its own
                  assignment id but another range) around its real results
    seconds_inf   ``seconds = inf``
    seconds_huge  ``seconds = 1e300`` on its first result; then it holds every range it gets, heartbeating
                  forever without a result
    nan_fitness   the first fitness of each result is NaN
    collude       the first fitness of each result is increased by 1 (two workers in this mode lie identically)

Usage: ``python -c "import malicious_worker; malicious_worker.main()" --master HOST:PORT --name NAME --modes FILE``
(secret from ``JES_SECRET``).
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys

import numpy as np

from jes.distributed import protocol
from jes.distributed.worker import Worker, _interrupt_handler

MODES = ("honest", "never_issued", "seconds_inf", "seconds_huge", "nan_fitness", "collude")


class LyingWorker(Worker):
    def __init__(self, *args, modes_file: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.modes_file = modes_file
        self.mode = "honest"
        self.results_sent = 0
        send = self.link.send
        self.link.send = lambda message: [send(m) for m in self._corrupt(message)]

    def _read_mode(self) -> str:
        try:
            with open(self.modes_file) as f:
                mode = json.load(f).get(self.name, "honest")
        except (OSError, ValueError):
            mode = "honest"
        if mode not in MODES:
            raise SystemExit(f"unknown mode {mode!r}")
        return mode

    def _handle(self, message: dict) -> None:
        if message["type"] == "session":
            self.mode, self.results_sent = self._read_mode(), 0
            logging.getLogger("malicious").info("new session: mode %s", self.mode)
        if message["type"] == "distrusted":  # a liar does not stop when caught (and this process serves later masters)
            logging.getLogger("malicious").info("distrusted: %s", message.get("reason"))
            return
        if message["type"] == "work" and self.mode == "seconds_huge" and self.results_sent:
            # Hold the range: the link heartbeats while we are "busy", and no result ever comes.
            self.last_aid = max(self.last_aid, int(message.get("aid") or 0))
            self.current_aid = message.get("aid")
            self.link.idle = False
            return
        super()._handle(message)

    def _corrupt(self, message: dict) -> list[dict]:
        if message.get("type") != "result" or self.mode == "honest":
            return [message]
        self.results_sent += 1
        first = self.results_sent == 1
        if self.mode == "seconds_inf":
            return [dict(message, seconds=float("inf"))]
        if self.mode == "seconds_huge":
            return [dict(message, seconds=1e300)]
        if self.mode in ("nan_fitness", "collude"):
            fitness = protocol.unpack_array(message["fitness"]).copy()
            fitness.flat[0] = np.nan if self.mode == "nan_fitness" else fitness.flat[0] + np.float32(1.0)
            return [dict(message, fitness=protocol.pack_array(fitness))]
        # never_issued: plausible-looking results for every chunk outside its range.
        aid, start, stop = message["aid"], message["start"], message["stop"]
        size, obs = self.trainer.chunk_size, self.trainer.spec.obs_shape

        def forged(forged_aid: int, chunk: int) -> dict:
            return dict(message, aid=forged_aid, start=chunk, stop=chunk + 1, seconds=0.01,
                        fitness=protocol.pack_array(np.full((1, size), 500.0, np.float32)),
                        env_steps=protocol.pack_array(np.ones(1, np.int32)),
                        obs_sum=protocol.pack_array(np.zeros((1, *obs), np.float32)),
                        obs_sumsq=protocol.pack_array(np.zeros((1, *obs), np.float32)),
                        centre_returns=protocol.pack_array(protocol.unpack_array(message["centre_returns"])[:1]),
                        centre_steps=protocol.pack_array(protocol.unpack_array(message["centre_steps"])[:1]))

        others = [c for c in range(self.trainer.num_chunks) if not start <= c < stop]
        foreign = [forged(a, c) for a in (aid - 1, aid + 1, aid + 2, 10**9) for c in others]
        own = [forged(aid, c) for c in others]
        # First result: forgeries under other ids, the real one, then forgeries under its (now ended) id.
        # Later: a forgery under its live id (another range) first, then the real one.
        return [*foreign, message, *own] if first else [*own[:1], message, *foreign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="malicious_worker")
    parser.add_argument("--master", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--modes", required=True, help="JSON file {name: mode}")
    parser.add_argument("--curve-server-key")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s %(levelname)s %(message)s")
    worker = LyingWorker(args.master, protocol.load_secret(None), name=args.name, modes_file=args.modes,
                         curve_server_key=args.curve_server_key)
    handler = _interrupt_handler(worker)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    worker.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
