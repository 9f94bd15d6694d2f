"""Correctly signed, random or mutated messages for a :class:`jes.distributed.master.Master`'s receive path.

Used by tests/test_distributed_hostile.py and benchmarks/fuzz_master.py. The fuzzer plays a few worker
identities: it opens sessions (``hello``), asks for work with the master's current run, generation and hash
(so the master really assigns it ranges), and sends results for its live assignments, heartbeats,
goodbyes, refusals and unknown types, each a valid template with some fields mutated (dropped, replaced
by values of the wrong type, NaN, inf, huge or negative numbers, arrays of the wrong dtype, shape or
length). Messages are sealed with the session's ``sid`` and the next ``seq`` (sometimes a stale one), so
they get past the MAC and replay checks to the handlers.
"""
from __future__ import annotations

import math
import random

import numpy as np

from jes.distributed import protocol

ODD_VALUES = (None, True, False, 0, -1, 1, 2**31, 2**63 - 1, -2**63, 2**64 - 1, 0.0, -0.0, 1e-300, 1e300, -1e300,
              math.nan, math.inf, -math.inf, "", "x" * 200, b"", b"\x00" * 9, [], [1, "a"], {}, {"dtype": "float32"},
              {"dtype": "float32", "shape": [1], "data": b"\x00\x00\xc0\x7f"})
DTYPES = (*protocol.ALLOWED_DTYPES, "float16", "object", "<f4", "", None)


class MasterFuzzer:
    """Feed ``count`` messages to ``master._receive``, a few at a time (see :meth:`feed`)."""

    def __init__(self, master, secret: bytes, seed: int = 0, identities: int = 3):
        self.master, self.secret, self.rng = master, secret, random.Random(seed)
        self.identities = [f"fuzz-{i}".encode() for i in range(identities)]
        self.sent = 0

    # ----------------------------------------------------------- messages
    def _seal(self, identity: bytes, message: dict) -> list[bytes]:
        worker = self.master.workers.get(identity)
        if worker is None or worker.session is None:
            return protocol.encode(message, self.secret)
        session = protocol.Session(self.secret, worker.session.sid)
        session.sent = worker.session.received  # the next seq the master accepts
        if self.rng.random() < 0.03:
            session.sent -= self.rng.randint(1, 3)  # a replayed / reordered seq
        if self.rng.random() < 0.02:
            session.sid = protocol.new_nonce()      # another session
        return session.seal(message)

    def _array(self, dtype: str, shape: tuple, low: float = -1e3) -> dict:
        rng = self.rng
        kind = rng.random()
        if kind < 0.6:  # well-formed, mostly plausible values (which only an audit can tell from the truth)
            values = np.asarray([rng.uniform(low, 1e3) for _ in range(int(np.prod(shape)))]).reshape(shape)
            if dtype == "float32" and values.size and rng.random() < 0.3:
                values.flat[rng.randrange(values.size)] = rng.choice((math.nan, math.inf, -math.inf, -1.0, 1e38))
            return protocol.pack_array(values.astype(dtype))
        packed = protocol.pack_array(np.zeros(shape, dtype))
        if kind < 0.75:
            packed["dtype"] = rng.choice(DTYPES)
        elif kind < 0.85:
            packed["shape"] = rng.choice(([], [0], [-1], [2**31], [2**30, 2**30, 16], list(shape) + [1],
                                          [s + 1 for s in shape], "12", None))
        elif kind < 0.95:
            packed["data"] = rng.choice((b"", packed["data"][:-1], packed["data"] + b"\x00", b"\xff" * len(packed["data"]),
                                         "text", None))
        else:
            packed = rng.choice(ODD_VALUES)
        return packed

    def _template(self, identity: bytes) -> dict:
        master, rng = self.master, self.rng
        worker = master.workers.get(identity)
        if worker is None or rng.random() < 0.04:
            return {"type": "hello", "name": identity.decode(), "nonce": protocol.new_nonce()}
        current = dict(run=master._run, gen=master._generation, hash=master._hash)
        kind = rng.random()
        if kind < 0.3:
            return {"type": "request", "name": worker.name, **current, "last_aid": max(worker.aids, default=0) - 1,
                    "abandon": None}
        if kind < 0.75:
            trainer = master.trainer
            live = [master.assignments[a] for a in sorted(worker.aids) if a in master.assignments]
            if live:
                assignment = rng.choice(live)
                aid, start, stop = assignment.aid, assignment.chunks[0], assignment.chunks[-1] + 1
            else:
                aid, start = rng.randint(0, master._next_aid + 2), rng.randrange(trainer.num_chunks)
                stop = rng.randint(start + 1, trainer.num_chunks)
            k, size, obs = stop - start, trainer.chunk_size, trainer.spec.obs_shape
            slots = master._results[4].shape[1] if master._results is not None else 0
            return {"type": "result", "name": worker.name, **current, "aid": aid, "last_aid": aid, "start": start,
                    "stop": stop, "seconds": rng.choice((0.001, 0.01, 0.5)),
                    "fitness": self._array("float32", (k, size)), "env_steps": self._array("int32", (k,), 0.0),
                    "obs_sum": self._array("float32", (k, *obs)), "obs_sumsq": self._array("float32", (k, *obs), 0.0),
                    "centre_returns": self._array("float32", (k, slots)),
                    "centre_steps": self._array("int32", (k, slots), 0.0)}
        if kind < 0.9:
            return {"type": "heartbeat", "name": worker.name}
        if kind < 0.93:
            return {"type": "bye", "name": worker.name, "aid": None}
        if kind < 0.96:
            return {"type": "refused", "run": rng.choice((master._run, "other")), "reason": "fuzz"}
        return {"type": rng.choice(("work", "setup", "shutdown", "")), "name": worker.name}

    def _mutate(self, message: dict) -> dict:
        rng = self.rng
        for _ in range(rng.choice((0, 0, 1, 1, 2, 3))):
            keys = list(message)
            what = rng.random()
            if what < 0.25 and len(keys) > 1:
                message.pop(rng.choice([k for k in keys if k != "type"]), None)
            elif what < 0.75:
                key = rng.choice(keys)
                value = message[key]
                if isinstance(value, int) and not isinstance(value, bool) and rng.random() < 0.5:
                    message[key] = value + rng.choice((-1, 1, -2**40, 2**40))
                else:
                    message[key] = rng.choice(ODD_VALUES)
            else:
                message[rng.choice(("extra", "pad", "sid", "seq", "x" * 40))] = rng.choice(ODD_VALUES)
        return message

    # -------------------------------------------------------------- feeding
    def feed(self, count: int) -> None:
        """Send ``count`` messages to the master's receive path (raw exceptions are the master's to catch)."""
        for _ in range(count):
            i = self.rng.randrange(len(self.identities))
            worker = self.master.workers.get(self.identities[i])
            if worker is not None and worker.distrusted:  # caught: come back as someone new
                self.identities[i] = f"fuzz-{self.rng.getrandbits(32):08x}".encode()
            identity = self.identities[i]
            message = self._mutate(self._template(identity))
            if not isinstance(message.get("type"), str):
                message["type"] = "request"
            try:
                frames = self._seal(identity, message)
            except (TypeError, ValueError, OverflowError):  # msgpack cannot pack it (e.g. an int beyond 64 bits)
                continue
            self.sent += 1
            self.master._receive([identity, *frames])
