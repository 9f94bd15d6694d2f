"""The master of a distributed run: a ZeroMQ ROUTER that farms each generation's chunks out to workers.

The master owns the authoritative :class:`jes.TrainState`. For every generation
it splits the population into the trainer's fixed chunks, hands contiguous
chunk ranges to idle workers (pull model: a worker asks, the master answers),
collects the per-chunk fitness / env steps / observation sums, and applies the
same compiled :meth:`jes.Trainer.apply_chunk_results` the fused step uses, so
the parameters are bit-identical whoever evaluated which chunk.

Parameters never travel per generation: a worker keeps its own copy of the
state and advances it with the previous generation's per-chunk results, which
ride along with its next work item; the state hash in every message catches a
worker that drifted, and it gets a full snapshot. A worker that stops
answering (heartbeats) or overruns its deadline has its chunks re-queued; when
no worker can take queued chunks the master evaluates them itself.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import zmq

from jes.distributed import protocol
from jes.generation import ChunkResults
from jes.distributed.protocol import ProtocolError, field

log = logging.getLogger("jes.distributed.master")


def bind_address(address: str) -> str:
    """``":5555"`` -> ``tcp://*:5555``; ``"0.0.0.0:5555"``/``"host:5555"`` -> ``tcp://host:5555``; ``tcp://...`` as is."""
    if not isinstance(address, str) or not address:
        raise ValueError(f"master address must be a string like ':5555' or '0.0.0.0:5555', got {address!r}")
    if address.startswith(("tcp://", "ipc://", "inproc://")):
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"master address {address!r} needs a port, e.g. ':5555' or '0.0.0.0:5555'")
    return f"tcp://{host or '*'}:{port}"


@dataclasses.dataclass
class _Assignment:
    aid: int
    generation: int
    chunks: list
    issued: float
    deadline: float
    expired: bool = False   # overran its deadline: its chunks were re-queued then
    heard: bool = False     # a heartbeat came while it was outstanding: the worker is evaluating it


@dataclasses.dataclass
class _Worker:
    identity: bytes
    name: str
    last_seen: float
    run: str | None = None
    generation: int = -1
    state_hash: str = ""
    idle: bool = False
    setup_sent: bool = False
    assignment: _Assignment | None = None
    chunks_per_second: float | None = None
    members_done: int = 0
    abandons: tuple = (-1, 0)  # (generation, ranges handed back unevaluated in it)
    interval_members: int = 0


class Master:
    """Serve one training run to workers; :meth:`step` is a ``step_fn`` for :func:`jes.loop.run`.

    Args:
        trainer: the run's :class:`jes.Trainer`.
        address: where to listen (``":5555"``, ``"0.0.0.0:5555"``, ``"127.0.0.1:0"`` for a free port).
        secret: HMAC key (bytes/str); ``None`` reads ``JES_SECRET``.
        env, optimizer, env_params: as given to :func:`jes.train`, described to workers as plain data.
        heartbeat_interval: seconds between worker heartbeats (told to workers).
        worker_timeout: a worker silent this long is dropped and its chunks re-queued.
        assign_timeout: deadline of a worker's first range (before its speed is known).
        min_deadline: shortest deadline of any range; later ranges get 4x their expected time.
        target_range_seconds: a worker gets about this much work per range (at its measured speed).
        status_interval: seconds between status log lines.
        max_message_bytes: larger incoming messages are dropped (ZeroMQ cuts the peer off).
    """

    def __init__(
        self,
        trainer: Any,
        address: str,
        *,
        secret: bytes | str | None = None,
        env: Any,
        optimizer: Any,
        env_params: Any = None,
        heartbeat_interval: float = 1.0,
        worker_timeout: float = 10.0,
        assign_timeout: float = 60.0,
        min_deadline: float = 5.0,
        target_range_seconds: float = 1.0,
        status_interval: float = 10.0,
        max_message_bytes: int = protocol.MAX_TO_MASTER_BYTES,
    ):
        self.trainer = trainer
        self.key = protocol.load_secret(secret)
        self.description = protocol.describe_run(trainer, env, optimizer, env_params)
        self.heartbeat_interval = float(heartbeat_interval)
        self.worker_timeout = float(worker_timeout)
        self.assign_timeout = float(assign_timeout)
        self.min_deadline = float(min_deadline)
        self.target_range_seconds = float(target_range_seconds)
        self.status_interval = float(status_interval)
        self.max_message_bytes = int(max_message_bytes)
        self.workers: dict[bytes, _Worker] = {}
        self.stats = collections.Counter()
        self._next_aid = 1
        self._run: str | None = None
        self._state = None
        self._generation = -1
        self._hash = ""
        self._snapshot = None
        self._update: dict | None = None       # previous generation's results, for workers one generation behind
        self._last_state = None
        self._last_hash = ""
        self._active = False
        self._pending: list[int] = []
        self._reissued: set[int] = set()
        self._have = None
        self._results = None
        self._last_status = time.monotonic()
        self._master_members = 0
        self._evaluate = jax.jit(lambda s, c: ChunkResults.as_tuple(trainer.evaluate_chunks(s, c)))
        self._apply = jax.jit(lambda s, *r: trainer.apply_chunk_results(s, ChunkResults(*r)))
        self._centre = jax.jit(lambda s: tuple(f(x) for f, x in zip((jnp.mean, jnp.sum), trainer.evaluate_centre(s))))

        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes + 4096)
        self.socket.setsockopt(zmq.SNDHWM, 1000)
        self.socket.setsockopt(zmq.RCVHWM, 10000)
        endpoint = bind_address(address)
        try:
            if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
                self.port = self.socket.bind_to_random_port(endpoint[:-2])
                endpoint = f"{endpoint[:-2]}:{self.port}"
            else:
                self.socket.bind(endpoint)
                self.port = int(endpoint.rsplit(":", 1)[1]) if endpoint.startswith("tcp://") else None
        except zmq.ZMQError as err:
            self.close()
            raise OSError(f"cannot listen on {endpoint}: {err}") from err
        self.endpoint = endpoint
        log.info("master listening on %s (%d members in %d chunks of %d, %d params)", endpoint,
                 trainer.config.num_members, trainer.num_chunks, trainer.chunk_size, trainer.num_params)

    # ----------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Stop listening. Workers keep running and reconnect to the next master on this address."""
        if not self.socket.closed:
            self.socket.close(0)
        self.context.term()

    def __enter__(self) -> "Master":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------- generation
    def step(self, state: Any, evaluate_centre: bool) -> tuple[Any, dict]:
        """One generation, evaluated by whoever is connected; same result and metrics as the fused step."""
        trainer = self.trainer
        state = trainer.place(state)
        generation = int(state.generation)
        self._set_run(state)
        current = self._last_hash if state is self._last_state else protocol.state_hash(state)
        if current != self._last_hash:
            self._update = None  # not the state our last update produced (a resume): workers get snapshots
        self._state, self._generation, self._hash, self._snapshot = state, generation, current, None
        n, size = trainer.num_chunks, trainer.chunk_size
        obs = trainer.spec.obs_shape
        self._results = (np.zeros((n, size), np.float32), np.zeros((n,), np.int32),
                         np.zeros((n, *obs), np.float32), np.zeros((n, *obs), np.float32))
        self._have = np.zeros(n, bool)
        self._pending = list(range(n))
        self._reissued = set()
        self._active = True
        try:
            self._assign_idle()
            while not self._have.all():
                busy_here = bool(self._pending) and self._should_evaluate_here()
                self._poll(0 if busy_here else 20)
                self._expire(time.monotonic())
                self._assign_idle()
                if self._pending and self._should_evaluate_here():
                    self._evaluate_here(self._pending.pop(0))
        finally:
            self._active = False
            self._pending = []
        fitness, env_steps, obs_sum, obs_sumsq = (jnp.asarray(r) for r in self._results)
        new_state, metrics = self._apply(state, fitness, env_steps, obs_sum, obs_sumsq)
        if evaluate_centre and int(metrics["bad_member"]) < 0 and not bool(metrics["bad_update"]):
            centre_return, centre_steps = self._centre(new_state)
        else:
            centre_return, centre_steps = jnp.float32(jnp.nan), jnp.int32(0)
        metrics = dict(metrics, centre_return=centre_return, centre_steps=centre_steps)
        self._update = {
            "gen": generation, "hash": current,
            **{k: protocol.pack_array(v) for k, v in zip(("fitness", "env_steps", "obs_sum", "obs_sumsq"), self._results)},
        }
        self._last_state, self._last_hash = new_state, protocol.state_hash(new_state)
        self._status(generation + 1)
        return new_state, metrics

    def _set_run(self, state: Any) -> None:
        if self._run is None:
            key_data = np.asarray(jax.random.key_data(state.es_key), np.uint32).tobytes()
            self._run = protocol.run_id(self.description, key_data)

    def wait_for_workers(self, state: Any, count: int, timeout: float) -> int:
        """Serve joining workers (they build and compile the run) until ``count`` are ready or ``timeout`` s pass.

        ``state`` (the run's state; may be ``None`` once a generation ran) names the run workers build.

        Returns:
            The number of ready workers.
        """
        if state is not None:
            self._set_run(state)
        if self._run is None:
            raise ValueError("wait_for_workers needs the run's state before the first generation")
        deadline = time.monotonic() + timeout
        while len(self._ready_workers()) < count and time.monotonic() < deadline:
            self._poll(50)
            self._expire(time.monotonic())
        return len(self._ready_workers())

    def _should_evaluate_here(self) -> bool:
        """Evaluate a queued chunk locally when no worker can take it: none ready, or it was re-issued."""
        if any(w.idle for w in self._ready_workers()):
            return False
        if not self._ready_workers():
            return True
        return self._pending[0] in self._reissued

    def _ready_workers(self) -> list[_Worker]:
        return [w for w in self.workers.values() if w.run == self._run and w.setup_sent and (w.idle or w.assignment)]

    def _evaluate_here(self, chunk: int) -> None:
        out = self._evaluate(self._state, jnp.array([chunk], jnp.int32))
        self._store([chunk], *(np.asarray(x) for x in out))
        self._master_members += self.trainer.chunk_size
        self.stats["master_chunks"] += 1
        log.debug("master: evaluated chunk %d of generation %d itself", chunk, self._generation)

    def _store(self, chunks: list, fitness, env_steps, obs_sum, obs_sumsq) -> int:
        stored = 0
        for i, chunk in enumerate(chunks):
            if self._have[chunk]:
                continue
            for target, value in zip(self._results, (fitness, env_steps, obs_sum, obs_sumsq)):
                target[chunk] = value[i]
            self._have[chunk] = True
            stored += 1
            if chunk in self._pending:
                self._pending.remove(chunk)
        return stored

    # ------------------------------------------------------------- network
    def _send(self, worker: _Worker, message: dict) -> None:
        frames = protocol.encode(message, self.key)
        try:
            self.socket.send_multipart([worker.identity, *frames], flags=zmq.NOBLOCK)
            self.stats["bytes_sent"] += sum(len(f) for f in frames)
        except zmq.Again:
            log.warning("dropping %s to worker %s: its send queue is full", message["type"], worker.name)

    def _poll(self, timeout_ms: int) -> None:
        if not self.socket.poll(timeout_ms):
            return
        for _ in range(10000):  # bounded: a flood cannot starve the generation loop
            try:
                frames = self.socket.recv_multipart(flags=zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            self._receive(frames)

    def _receive(self, frames: list[bytes]) -> None:
        self.stats["bytes_received"] += sum(len(f) for f in frames)
        identity = frames[0]
        try:
            message = protocol.decode(frames[1:], self.key, self.max_message_bytes)
            self._handle(identity, message)
        except ProtocolError as err:
            self.stats["dropped"] += 1
            if self.stats["dropped"] <= 20 or self.stats["dropped"] % 1000 == 0:
                log.warning("dropped a message from peer %s: %s (%d dropped so far)", identity.hex()[:12], err,
                            self.stats["dropped"])
        except Exception:  # an authenticated peer sent something we failed on: never take the master down
            self.stats["dropped"] += 1
            log.exception("error handling a message from peer %s; dropped", identity.hex()[:12])

    def _handle(self, identity: bytes, message: dict) -> None:
        kind = message["type"]
        now = time.monotonic()
        if kind not in ("request", "result", "heartbeat", "bye"):
            raise ProtocolError(f"unexpected message type {kind!r}")
        if kind in ("request", "result"):  # validated before the peer counts as a worker
            run = field(message, "run", str, optional=True)
            generation = field(message, "gen", int)
            state_hash = field(message, "hash", str)
            last_aid = field(message, "last_aid", int)
            abandon = field(message, "abandon", int, optional=True)
        worker = self.workers.get(identity)
        if worker is None:
            if kind == "bye":
                return
            name = str(field(message, "name", str, optional=True) or identity.hex()[:8])[:64]
            worker = self.workers[identity] = _Worker(identity, name, now)
            log.info("worker %s connected (%d connected)", name, len(self.workers))
        worker.last_seen = now
        if kind == "heartbeat":
            assignment = worker.assignment
            if assignment is not None and not assignment.heard:
                # Workers heartbeat only while busy, so this is the first sign it is evaluating the range.
                assignment.heard = True
                log.debug("worker %s: evaluating chunks %d..%d of generation %d", worker.name, assignment.chunks[0],
                          assignment.chunks[-1], assignment.generation)
            return
        if kind == "bye":
            log.info("worker %s left%s", worker.name, self._release(worker, "returned"))
            del self.workers[identity]
            return
        if kind == "result":
            self._handle_result(worker, message, run, generation, state_hash)
        else:
            if worker.assignment is not None and worker.assignment.aid > last_aid:
                return  # this request crossed our work message in flight; the worker will get it
            if abandon is not None or worker.assignment is not None:
                self._release(worker, "returned")
            if abandon is not None:
                count = worker.abandons[1] + 1 if worker.abandons[0] == self._generation else 1
                worker.abandons = (self._generation, count)
        worker.run, worker.generation, worker.state_hash = run, generation, state_hash
        worker.idle = True
        self._assign(worker)  # between generations the queue is empty: set up, or 'wait'

    def _handle_result(self, worker: _Worker, message: dict, run, generation: int, state_hash: str) -> None:
        aid = field(message, "aid", int)
        start, stop = field(message, "start", int), field(message, "stop", int)
        seconds = field(message, "seconds", (float, int))
        assignment = worker.assignment
        if assignment is not None and assignment.aid == aid:
            worker.assignment = None
        current = self._active and run == self._run and generation == self._generation and state_hash == self._hash
        if not current:
            self.stats["stale_results"] += 1
            return
        n, size, obs = self.trainer.num_chunks, self.trainer.chunk_size, self.trainer.spec.obs_shape
        if not 0 <= start < stop <= n:
            raise ProtocolError(f"result chunk range [{start}, {stop}) outside [0, {n})")
        k = stop - start
        fitness = protocol.unpack_array(message.get("fitness"), "float32", (k, size))
        env_steps = protocol.unpack_array(message.get("env_steps"), "int32", (k,))
        obs_sum = protocol.unpack_array(message.get("obs_sum"), "float32", (k, *obs))
        obs_sumsq = protocol.unpack_array(message.get("obs_sumsq"), "float32", (k, *obs))
        stored = self._store(list(range(start, stop)), fitness, env_steps, obs_sum, obs_sumsq)
        worker.members_done += stored * size
        worker.interval_members += stored * size
        if seconds > 0:
            rate = k / seconds
            worker.chunks_per_second = rate if worker.chunks_per_second is None else 0.5 * (worker.chunks_per_second + rate)

    # ------------------------------------------------------------ scheduling
    def _release(self, worker: _Worker, why: str) -> str:
        """Put the worker's unfinished chunks back in the queue; returns a note for the log."""
        assignment, worker.assignment = worker.assignment, None
        if assignment is None or not self._active or assignment.generation != self._generation:
            return ""
        if assignment.expired:
            # Its chunks went back to the queue at the deadline; whoever took them owns them now, and
            # queueing them again would evaluate them twice.
            return ""
        back = [c for c in assignment.chunks if not self._have[c] and c not in self._pending]
        if not back:
            return ""
        self._pending = sorted(self._pending + back)
        self._reissued.update(back)
        self.stats["reissued_chunks"] += len(back)
        return f"; chunks {back[0]}..{back[-1]} {why} to the queue"

    def _expire(self, now: float) -> None:
        for identity, worker in list(self.workers.items()):
            if now - worker.last_seen > self.worker_timeout:
                note = self._release(worker, "back")
                del self.workers[identity]
                log.warning("worker %s lost (silent for %.1fs)%s", worker.name, now - worker.last_seen, note)
            elif worker.assignment is not None and not worker.assignment.expired and now > worker.assignment.deadline:
                assignment = worker.assignment
                assignment.expired = True
                back = [c for c in assignment.chunks if not self._have[c] and c not in self._pending]
                if back and assignment.generation == self._generation:
                    self._pending = sorted(self._pending + back)
                    self._reissued.update(back)
                    self.stats["reissued_chunks"] += len(back)
                    log.warning("worker %s overran its deadline on chunks %d..%d; re-issuing them",
                                worker.name, back[0], back[-1])

    def _assign_idle(self) -> None:
        for worker in list(self.workers.values()):
            if worker.idle and self._pending:
                self._assign(worker)

    def _range_size(self, worker: _Worker) -> int:
        rate = worker.chunks_per_second
        if rate is None:
            return 1
        ready = self._ready_workers()
        fastest = max([w.chunks_per_second or rate for w in ready] + [rate])
        # Rates floored at a quarter of the fastest: one slow measurement (a cold first range) must not
        # starve a worker of the work that would correct it.
        floor = 0.25 * fastest
        rate = max(rate, floor)
        total = sum(max(w.chunks_per_second or rate, floor) for w in ready) or rate
        share = math.ceil(len(self._pending) * rate / total)
        return max(1, min(share, round(rate * self.target_range_seconds)))

    def _assign(self, worker: _Worker) -> None:
        """Answer an idle worker: the run to build, a snapshot, a range of chunks, or 'wait'."""
        if worker.run != self._run:
            # A worker reporting no run after its setup is still building it (or failed to: it logs why).
            if not worker.setup_sent or worker.run is not None:
                self._send(worker, {"type": "setup", "run": self._run, "description": self.description,
                                    "heartbeat_interval": self.heartbeat_interval})
                worker.setup_sent = True
                log.info("worker %s: sent run %s", worker.name, self._run)
            worker.idle = False
            return
        worker.setup_sent = True
        if not self._pending or (worker.abandons[0] == self._generation and worker.abandons[1] >= 3):
            # Nothing to do, or a worker that keeps failing to sync: it sits this generation out.
            self._send(worker, {"type": "wait"})
            return
        update = None
        if worker.generation == self._generation and worker.state_hash == self._hash:
            pass
        elif (self._update is not None and worker.generation == self._generation - 1
              and worker.state_hash == self._update["hash"]):
            update = self._update
        else:
            if self._snapshot is None:
                self._snapshot = protocol.pack_state(self._state)
            self._send(worker, {"type": "snapshot", "run": self._run, "gen": self._generation, "hash": self._hash,
                                "state": self._snapshot})
            self.stats["snapshots"] += 1
            log.info("worker %s: sent state snapshot of generation %d", worker.name, self._generation)
        size = self._range_size(worker)
        chunks = [self._pending[0]]
        while len(chunks) < size and len(self._pending) > len(chunks) and self._pending[len(chunks)] == chunks[-1] + 1:
            chunks.append(self._pending[len(chunks)])
        del self._pending[: len(chunks)]
        now = time.monotonic()
        if worker.chunks_per_second is None:
            deadline = now + self.assign_timeout
        else:
            deadline = now + max(self.min_deadline, 4.0 * len(chunks) / worker.chunks_per_second)
        aid, self._next_aid = self._next_aid, self._next_aid + 1
        worker.assignment = _Assignment(aid, self._generation, chunks, now, deadline)
        worker.idle = False
        worker.generation, worker.state_hash = self._generation, self._hash
        self._send(worker, {"type": "work", "run": self._run, "gen": self._generation, "hash": self._hash, "aid": aid,
                            "start": chunks[0], "stop": chunks[-1] + 1, "update": update})
        log.debug("worker %s: assigned chunks %d..%d of generation %d", worker.name, chunks[0], chunks[-1],
                  self._generation)

    def _status(self, generation: int) -> None:
        now = time.monotonic()
        elapsed = now - self._last_status
        if elapsed < self.status_interval:
            return
        parts = [f"{w.name} {w.interval_members / elapsed:.0f}" for w in self.workers.values()]
        log.info("generation %d: %d worker(s) connected; members/s: %s%s", generation, len(self.workers),
                 ", ".join(parts) or "-", f", master {self._master_members / elapsed:.0f}")
        for w in self.workers.values():
            w.interval_members = 0
        self._master_members = 0
        self._last_status = now

