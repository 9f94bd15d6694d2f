"""The master of a distributed run: a ZeroMQ ROUTER that farms each generation's chunks out to workers.

The master owns the authoritative :class:`jes.TrainState`. For every generation
it splits the population into the trainer's fixed chunks, hands contiguous
chunk ranges to idle workers (pull model: a worker asks, the master answers),
collects the per-chunk fitness / env steps / observation sums, and applies the
same compiled :meth:`jes.Trainer.apply_chunk_results` the fused step uses, so
the parameters are bit-identical whoever evaluated which chunk.

The centre's evaluation rides along as the fused step runs it: on a generation that evaluates the centre,
each chunk's rollout runs its share of the centre's episodes (chunk ``k``: episodes ``k*S .. k*S+S-1``, ``S`` =
:attr:`jes.Trainer.centre_slots`) live beside the members, the result carries their returns and steps, and the
master reduces the ``[num_chunks, S]`` buffer with the step's own :meth:`jes.Trainer.centre_from_chunks`. On
other generations those slots are idle, as in the step. Runs whose step evaluates the centre apart (host envs,
low-rank members) have the master evaluate it apart too; a generation without members (a run's last centre
evaluation) is evaluated by the master alone.

Parameters never travel per generation: a worker keeps its own copy of the
state and advances it with the previous generation's per-chunk results, which
ride along with its next work item; the state hash in every message catches a
worker that drifted, and it gets a full snapshot.

Bookkeeping (why a generation always finishes): every chunk is either stored,
queued, or held by a live assignment, and every assignment has a deadline.
An assignment ends when its result arrives, when its worker says it is idle
(a ``request`` whose ``last_aid`` covers it), leaves (``bye``), falls silent for
``worker_timeout``, or when its deadline passes; whatever it held that is not
stored and not held by another live assignment goes back to the queue. Queued
chunks go to idle workers; the master evaluates them itself when no worker can
take them (none connected, all busy with expired ranges, all benched), or when
they were re-queued once already. Assignment ids are unique per master and
``last_aid`` is per session, so a worker of a previous master can never make
this one release ranges it has just handed out.

Results are not trusted (a worker holds the shared secret, not the master's
confidence). A result is used only for a live assignment of the worker that
sends it: its own assignment id, exactly the range it was issued, the current
run, generation and state hash, and arrays of exactly the issued shapes and
dtypes (the centre slots' returns and steps included: ``[k, S]`` when the work asked for them, ``[k, 0]``
otherwise); anything else is dropped (a late or foreign result) or, for a live
assignment, makes the worker distrusted. Its values must be plausible: a
positive, finite ``seconds`` no longer than the master has waited for it (else
the worker is distrusted: timing cannot be checked), finite fitness, centre returns and
observation sums, non-negative sums of squares, env step counts within what the
range's episodes can take. An implausible value is not stored: the master
evaluates the range itself and uses its own result (an honest run can produce
non-finite fitness, e.g. a policy whose outputs overflow; a worker whose values
equal the master's bit for bit stays trusted, any other is distrusted). A
distrusted worker (by its ZeroMQ identity, also across new sessions) gets no
more work for the rest of the run, and what it delivered in the generation
goes back to the queue. Reported times enter the speed estimate only clamped
to what the master measured itself, so no deadline can be zero or unbounded.

A worker is verified before it is trusted: the first range each newly connected worker delivers is audited
(below) whatever ``audit`` (one range per join; and its first range with live centre slots, which settle the
centre's return and so ``stop_at_return``), and a worker whose state after a generation's update differs
from the master's says so (``diverged``) and is distrusted: it computes other bits. A distrusted worker is told
why (``distrusted``; a ``jes-worker`` then stops).

With ``audit > 0`` a fraction of delivered ranges is evaluated a second time
and compared bit for bit, by the master or by a worker the master has verified
(one whose delivery matched the master's own evaluation); the master settles a
mismatch with its own evaluation and distrusts whoever was wrong. A generation
then also waits for its open audits.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import math
import random
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import zmq

from jes import host_step, interrupts
from jes.distributed import protocol, transport
from jes.distributed.protocol import ProtocolError, field
from jes.generation import ChunkResults
from jes.threefry import UnrolledJit

log = logging.getLogger("jes.distributed.master")

# A reported evaluation time above this many times what the master waited for the range (its own clock),
# plus TIMING_SLACK_SECONDS for clocks of other hosts, is impossible: the worker is distrusted.
TIMING_SLACK_FACTOR = 2.0
TIMING_SLACK_SECONDS = 1.0
RESULT_HEADER_BYTES = 4096  # a result message's bytes besides its arrays' data (fields, array headers; < 1 KiB)
MIN_SECONDS = 1e-6                  # times are clamped to at least this before they divide anything
MIN_RATE, MAX_RATE = 1e-6, 1e6      # chunks per second, the bounds of any speed estimate


# Worker processes whose newest connection a master remembers (Master._stale_connection); the oldest go first
MAX_REMEMBERED_PROCESSES = 4096


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and bytes (NaN equals the same NaN: an honest non-finite result matches itself)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def members_per_second(members: int, seconds: float) -> str:
    """A status line's rate: whole numbers from 10 up, two significant digits below (a worker that evaluated 16
    members in 10 s shows 1.6, not 0 as if idle)."""
    rate = members / seconds
    return f"{rate:.0f}" if rate >= 10 or rate == 0 else f"{rate:.2g}"


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
    worker: bytes
    generation: int
    chunks: list
    issued: float
    deadline: float
    heard: bool = False     # a heartbeat came while it was outstanding: the worker is evaluating it
    audit: bool = False     # a second evaluation of a delivered range, to compare bit for bit


@dataclasses.dataclass
class _Worker:
    identity: bytes
    name: str
    last_seen: float
    session: protocol.Session | None = None
    nonce: str = ""
    run: str | None = None
    generation: int = -1
    state_hash: str = ""
    idle: bool = False
    setup_sent: bool = False
    refused: str | None = None  # the run this worker said it cannot build
    distrusted: bool = False    # delivered wrong, malformed or impossible results: never given work again
    verified: bool = False      # a delivery of it matched the master's own evaluation: it may audit others
    probe: bool = True          # its next delivered range is audited, whatever `audit` (it joined, or resynced)
    centre_probe: bool = True   # likewise its first range with live centre slots (the join probe may have had none)
    aids: set = dataclasses.field(default_factory=set)  # its live assignments
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
        heartbeat_interval: seconds between worker heartbeats (told to workers). Default 1.
        worker_timeout: a worker silent this long is dropped and its chunks re-queued. Default 10.
        assign_timeout: deadline of a worker's first range, before its speed is known. Default 60.
        min_deadline: shortest deadline of any later range. Default 5.
        deadline_factor: later ranges get this many times their expected time (at the worker's
            measured speed) before they are re-queued. Default 4.
        target_range_seconds: a worker gets about this much work per range (at its measured speed). Default 1.
        max_range_chunks: most chunks in one range (``None``: no cap beyond the worker's share).
        status_interval: seconds between status log lines. Default 10.
        max_message_bytes: larger incoming messages are dropped (ZeroMQ cuts the peer off).
        description_extra: further parts of the run described to workers and passed to their
            ``Trainer`` by name (e.g. ``{"strategy": jes.strategies.PGPE(...)}``).
        audit: fraction of delivered ranges (0 to 1) evaluated a second time, by a worker the master has
            verified (or by the master itself when none is free), and compared bit for bit (same backend,
            same bits). On a mismatch, or whenever no verified worker audits, the master evaluates the range
            itself; a worker whose results differ from the master's is distrusted for the rest of the run:
            its deliveries of the generation are dropped and re-queued, and it gets no more work. Default 0
            (off).
        audit_seed: seed of the choice of audited ranges.
        curve_secret_key: this master's own CURVE secret key (Z85 text or the ``NAME.secret`` file of ``jes keys
            NAME``); workers then need ``--curve-server-key NAME.public``, and a worker holding the shared secret
            cannot pose as this master. ``None`` (default): the server key is derived from the shared secret.
            Every connection is CURVE-encrypted either way, and only peers holding the shared secret get
            through the handshake (:mod:`jes.distributed.transport`).
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
        deadline_factor: float = 4.0,
        target_range_seconds: float = 1.0,
        max_range_chunks: int | None = None,
        status_interval: float = 10.0,
        max_message_bytes: int = protocol.MAX_TO_MASTER_BYTES,
        description_extra: dict | None = None,
        curve_secret_key: str | bytes | None = None,
        audit: float = 0.0,
        audit_seed: int = 0,
    ):
        self.trainer = trainer
        self.key = protocol.load_secret(secret)
        self.description = protocol.describe_run(trainer, env, optimizer, env_params, **(description_extra or {}))
        for name, value in (("heartbeat_interval", heartbeat_interval), ("worker_timeout", worker_timeout),
                            ("assign_timeout", assign_timeout), ("min_deadline", min_deadline),
                            ("deadline_factor", deadline_factor), ("target_range_seconds", target_range_seconds)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"Master {name} must be a positive number of seconds, got {value!r}")
        if max_range_chunks is not None and (isinstance(max_range_chunks, bool) or not isinstance(max_range_chunks, int)
                                             or max_range_chunks < 1):
            raise ValueError(f"Master max_range_chunks must be a positive integer or None, got {max_range_chunks!r}")
        if worker_timeout <= heartbeat_interval:
            raise ValueError(f"Master worker_timeout ({worker_timeout}) must exceed heartbeat_interval "
                             f"({heartbeat_interval}), or every worker would be dropped between heartbeats")
        self.heartbeat_interval = float(heartbeat_interval)
        self.worker_timeout = float(worker_timeout)
        self.assign_timeout = float(assign_timeout)
        self.min_deadline = float(min_deadline)
        self.deadline_factor = float(deadline_factor)
        self.target_range_seconds = float(target_range_seconds)
        self.max_range_chunks = max_range_chunks
        if isinstance(audit, bool) or not isinstance(audit, (int, float)) or not 0.0 <= audit <= 1.0:
            raise ValueError(f"Master audit must be a fraction of ranges between 0 and 1, got {audit!r}")
        self.audit = float(audit)
        self._audit_rng = random.Random(audit_seed)
        self._audits: list[tuple[int, int, bytes]] = []  # (start, stop, first deliverer) waiting for a second look
        self._delivered_by: dict[int, bytes] = {}         # chunk -> the worker whose result is stored
        self._distrusted: dict[bytes, str] = {}           # identities distrusted for the rest of the run: why
        self._names_warned: set[str] = set()              # names taken by two connected workers (warned once each)
        spec = trainer.spec
        max_steps = getattr(spec, "max_steps", None)
        # The most env steps a chunk's episodes can take (each member slot's episode stops at max_steps).
        self._max_chunk_steps = (None if not isinstance(max_steps, int) else
                                 trainer.chunk_size * trainer.config.episodes_per_member * max_steps)
        self._max_episode_steps = max_steps if isinstance(max_steps, int) else None  # of one centre slot's episode
        self.status_interval = float(status_interval)
        self.max_message_bytes = int(max_message_bytes)
        self.clock = time.monotonic  # a seam for tests of the bookkeeping
        self.workers: dict[bytes, _Worker] = {}
        # Each worker process's newest connection (its hello's process -> (connection number, identity)): what
        # _stale_connection tells a reconnected worker's queued old hellos from a new worker's by
        self._connections: dict[str, tuple[int, bytes]] = {}
        self._replaced: dict[bytes, None] = {}  # identities of connections a newer one of their process replaced
        self._stale_said: set[str] = set()  # processes whose stale hello was logged
        self._rehello_said: dict[bytes, None] = {}  # connections told to say hello again, logged once each
        self.assignments: dict[int, _Assignment] = {}
        self.stats = collections.Counter()
        self._next_aid = 1
        self._run: str | None = None
        self._state = None
        self._generation = -1
        self._hash = ""
        self._snapshot = None
        self._snapshot_too_large = False  # said once (see _assign)
        self._results_too_large = False  # likewise
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
        # Compiled for JAX envs; a host env's (Gymnasium) chunks and centre run on the host (jes.host_rollout).
        self._programs = host_step.programs(trainer)
        self._evaluate, self._centre = self._programs.chunks, self._programs.centre
        self._centre_live = False  # whether this generation's chunks run their centre slots (see step)
        self._apply = UnrolledJit(lambda s, *r: trainer.apply_chunk_results(s, ChunkResults(*r)),
                                  compiler_options=trainer.step_compiler_options)  # the step's: they can change bits

        curve_secret = protocol.load_curve_key(curve_secret_key, "curve_secret_key")
        self.own_server_key = curve_secret is not None
        endpoint = bind_address(address)  # a malformed address is refused before any socket or thread exists
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        if "[" in endpoint or "://*:" in endpoint:  # an IPv6 address, or every interface's (IPv4 and IPv6); a
            self.socket.setsockopt(zmq.IPV6, 1)  # host name binds its IPv4 address as before (not its IPv6 one)
        self.socket.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes + 4096)
        self.socket.setsockopt(zmq.SNDHWM, 1000)
        self.socket.setsockopt(zmq.RCVHWM, 10000)
        # CURVE on every connection, keys from the secret: a peer without it never gets a frame queued here.
        self.curve_public_key = transport.secure_server(self.socket, self.key, curve_secret)  # Z85 bytes
        self.gatekeeper = transport.Gatekeeper(self.context, self.key)
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
        log.info("master listening on %s, CURVE-encrypted with %s (%d members in %d chunks of %d, %d params)", endpoint,
                 "its own server key" if self.own_server_key else "keys from the shared secret",
                 trainer.config.num_members, trainer.num_chunks, trainer.chunk_size, trainer.num_params)

    # ----------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Stop listening. Workers keep running and reconnect to the next master on this address."""
        host_step.close_programs(getattr(self, "_programs", None))  # a host env's instances (Gymnasium)
        if not self.socket.closed:
            self.socket.close(0)
        gatekeeper = getattr(self, "gatekeeper", None)
        if gatekeeper is not None and gatekeeper.is_alive():
            gatekeeper.stop()
        self.context.term()

    def __enter__(self) -> "Master":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------- generation
    def step(self, state: Any, evaluate_centre: bool, evaluate_population: bool = True) -> tuple[Any, dict]:
        """One generation, evaluated by whoever is connected; same result and metrics as the fused step
        (:meth:`jes.generation.Generation.generation_step`): the centre evaluated is ``state``'s. Where the step
        runs the centre's episodes in its chunks' rollouts, so do the chunks' evaluators (workers, or the master)
        and the master reduces their centre slots as the step does; else the master evaluates the centre apart
        while the workers evaluate the members. Without ``evaluate_population``, only the centre, on the master."""
        trainer = self.trainer
        state = trainer.place(state)
        in_chunks = bool(evaluate_centre) and self._programs.centre_slots > 0 and bool(evaluate_population)
        if evaluate_centre and not in_chunks:  # dispatched now, computed while the members are
            centre_return, centre_steps = self._centre(state)
        else:
            centre_return, centre_steps = jnp.float32(jnp.nan), jnp.int32(0)
        if not evaluate_population:
            return state, dict(centre_return=centre_return, centre_steps=centre_steps)
        generation = int(state.generation)
        self._set_run(state)
        current = self._last_hash if state is self._last_state else protocol.state_hash(state)
        if current != self._last_hash:
            self._update = None  # not the state our last update produced (a resume): workers get snapshots
        self._begin(state, generation, current, centre=in_chunks)
        try:
            self._assign_idle()
            while not self._have.all() or self._auditing():
                busy_here = bool(self._pending) and self._should_evaluate_here()
                self._poll(0 if busy_here else 20)
                self._expire(self.clock())
                self._assign_idle()
                if self._pending and self._should_evaluate_here():
                    self._evaluate_here(self._pending[0])
                elif not self._pending and self._audits and self._should_audit_here():
                    self._audit_here(*self._audits.pop(0))
        finally:
            self._end()
        fitness, env_steps, obs_sum, obs_sumsq = (jnp.asarray(r) for r in self._results[:4])
        if in_chunks:  # every chunk's centre slots, [num_chunks, S] as the step gathers them, reduced by its code
            centre_return, centre_steps = self._programs.reduce(*self._results[4:])
        new_state, metrics = self._apply(state, fitness, env_steps, obs_sum, obs_sumsq)
        metrics = dict(metrics, centre_return=centre_return, centre_steps=centre_steps)
        self._update = {
            "gen": generation, "hash": current,
            **{k: protocol.pack_array(v) for k, v in zip(("fitness", "env_steps", "obs_sum", "obs_sumsq"),
                                                         self._results[:4])},
        }
        self._last_state, self._last_hash = new_state, protocol.state_hash(new_state)
        self._status(generation + 1)
        return new_state, metrics

    def _begin(self, state: Any, generation: int, state_hash: str, centre: bool = False) -> None:
        """Open a generation: every chunk queued, none stored; with ``centre``, the chunks' centre slots are live."""
        trainer = self.trainer
        self._state, self._generation, self._hash, self._snapshot = state, generation, state_hash, None
        self._centre_live = centre
        n, size = trainer.num_chunks, trainer.chunk_size
        obs = trainer.spec.obs_shape
        slots = self._programs.centre_slots if centre else 0
        self._results = (np.zeros((n, size), np.float32), np.zeros((n,), np.int32),
                         np.zeros((n, *obs), np.float32), np.zeros((n, *obs), np.float32),
                         np.zeros((n, slots), np.float32), np.zeros((n, slots), np.int32))
        self._have = np.zeros(n, bool)
        self._pending = list(range(n))
        self._reissued = set()
        self._audits = []
        self._delivered_by = {}
        self._active = True

    def _end(self) -> None:
        """Close the generation: assignments still out are void (their late results are stale)."""
        self._active = False
        self._pending = []
        for worker in self.workers.values():
            worker.aids.clear()
        self.assignments.clear()

    def _set_run(self, state: Any) -> None:
        if self._run is None:
            key_data = np.asarray(jax.random.key_data(state.es_key), np.uint32).tobytes()
            self._run = protocol.run_id(self.description, key_data)

    def wait_for_workers(self, state: Any, count: int, timeout: float, only_these: bool = False) -> int:
        """Serve joining workers (they build and compile the run) until ``count`` are ready or ``timeout`` s pass.

        ``state`` (the run's state; may be ``None`` once a generation ran) names the run workers build. With
        ``only_these`` (``count`` workers are all there will be: a run's own local workers) the wait also ends when so
        many refused the run (cannot build it: they said why, and so did the log) that ``count`` cannot be ready.

        Returns:
            The number of ready workers.
        """
        if state is not None:
            self._set_run(state)
        if self._run is None:
            raise ValueError("wait_for_workers needs the run's state before the first generation")
        deadline = time.monotonic() + timeout
        while (len(self._ready_workers()) < count and time.monotonic() < deadline
               and not (only_these and len(self._ready_workers()) + self._refusing() >= count)):
            interrupts.raise_if_terminated()  # a SIGTERM Python dropped while workers build: not after their 120 s
            self._poll(50)
            self._expire(self.clock())
        return len(self._ready_workers())

    def _refusing(self) -> int:
        """Connected workers that refused the current run."""
        return sum(1 for w in self.workers.values() if w.refused == self._run and w.run != self._run)

    def _benched(self, worker: _Worker) -> bool:
        return worker.abandons[0] == self._generation and worker.abandons[1] >= 3

    def _should_evaluate_here(self) -> bool:
        """Evaluate the first queued chunk here when no worker can take it soon.

        No idle worker can take it (idle ones were just given work), so: when no worker holds a live
        assignment (none connected, all benched, all past their deadlines), or when the chunk was
        re-queued once already (its first taker failed; don't bet the generation on a second one).
        """
        ready = self._ready_workers()
        if any(w.idle and not self._benched(w) for w in ready):
            return False
        if not any(w.aids for w in ready):
            return True
        return self._pending[0] in self._reissued

    def _ready_workers(self) -> list[_Worker]:
        return [w for w in self.workers.values()
                if w.run == self._run and w.setup_sent and not w.distrusted and (w.idle or w.aids)]

    def _evaluate_chunk(self, chunk: int) -> tuple:
        """Chunk ``chunk`` evaluated here, as a worker would: numpy values of :meth:`_result_values`'s order."""
        out = self._evaluate(self._state, jnp.array([chunk], jnp.int32), np.bool_(self._centre_live), np.bool_(True))
        return self._centre_part(tuple(np.asarray(x) for x in out))

    def _centre_part(self, values: tuple) -> tuple:
        """Chunk results with their centre slots as the generation stores them (none when they are idle)."""
        slots = self._results[4].shape[1]
        return (*values[:4], *(np.ascontiguousarray(v[:, :slots]) for v in values[4:]))

    def _evaluate_here(self, chunk: int) -> None:
        self._store([chunk], *self._evaluate_chunk(chunk))
        self._master_members += self.trainer.chunk_size
        self.stats["master_chunks"] += 1
        log.debug("master: evaluated chunk %d of generation %d itself", chunk, self._generation)

    def _store(self, chunks: list, *values: Any, by: bytes | None = None) -> int:
        """Store ``values`` (each ``[len(chunks), ...]``, in :attr:`_results`'s order) of chunks not stored yet."""
        if len(values) != len(self._results):
            raise ValueError(f"{len(values)} per-chunk values, {len(self._results)} expected")
        stored = 0
        for i, chunk in enumerate(chunks):
            if self._have[chunk]:
                continue
            for target, value in zip(self._results, values):
                target[chunk] = value[i]
            self._have[chunk] = True
            if by is not None:
                self._delivered_by[chunk] = by
            stored += 1
            if chunk in self._pending:
                self._pending.remove(chunk)
        return stored

    # ------------------------------------------------------------- network
    def _send(self, worker: _Worker, message: dict) -> None:
        if worker.session is None:
            return
        frames = worker.session.seal(message)
        self._send_frames(worker.identity, frames, message["type"], worker.name)

    def _send_frames(self, identity: bytes, frames: list[bytes], kind: str, name: str) -> None:
        try:
            self.socket.send_multipart([identity, *frames], flags=zmq.NOBLOCK)
            self.stats["bytes_sent"] += sum(len(f) for f in frames)
        except zmq.Again:
            log.warning("dropping %s to worker %s: its send queue is full", kind, name)

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
            if message["type"] == "hello":
                self._hello(identity, message)
                return
            worker = self.workers.get(identity)
            if worker is None and identity in self._replaced:  # queued before its worker reconnected: nothing to say
                log.debug("dropped a %r message of a connection its worker has replaced", message["type"])
                return
            if worker is None or worker.session is None:
                # Authenticated, but of a session we do not know: a worker of our previous incarnation
                # (or a replay; answering it creates nothing).
                sid = message.get("sid")
                if isinstance(sid, str) and message["type"] != "bye":
                    self._send_frames(identity, protocol.encode({"type": "rehello", "sid": sid[:64]}, self.key),
                                      "rehello", identity.hex()[:12])
                    self._told_to_rehello(identity, message["type"])
                    return
                raise ProtocolError(f"{message['type']!r} message outside any session")
            try:
                worker.session.accept(message)
            except ProtocolError:
                self.stats["replayed"] += 1
                raise
            self._handle(identity, message)
        except ProtocolError as err:
            self.stats["dropped"] += 1
            unexpected = self.stats["dropped"] - self.stats["rehello"]  # (a fleet's rehellos spend none of the 20)
            if unexpected <= 20 or unexpected % 1000 == 0:
                log.warning("dropped a message from peer %s: %s (%d dropped so far)", identity.hex()[:12], err,
                            unexpected)
        except Exception:  # an authenticated peer sent something we failed on: never take the master down
            self.stats["dropped"] += 1
            self.stats["handler_errors"] += 1  # a validation gap: every malformed input should be a ProtocolError
            log.exception("error handling a message from peer %s; dropped", identity.hex()[:12])

    def _told_to_rehello(self, identity: bytes, kind: str) -> None:
        """A worker in a session not open here was told to say hello again: one of an earlier master on this address
        (a long-lived jes-worker when a run resumes or a new one starts) or one this master dropped (silent too
        long). Expected, so said once per connection at INFO, not warned of as other dropped messages are (each of
        its queued heartbeats and requests was a WARNING line)."""
        self.stats["dropped"] += 1
        self.stats["rehello"] += 1
        if identity not in self._rehello_said:
            self._rehello_said[identity] = None
            while len(self._rehello_said) > MAX_REMEMBERED_PROCESSES:
                self._rehello_said.pop(next(iter(self._rehello_said)))
            log.info("asked peer %s to say hello again: its %r belongs to no session open here (a worker of an "
                     "earlier master on this address, or one this master dropped)", identity.hex()[:12], kind)

    def _hello(self, identity: bytes, message: dict) -> None:
        nonce = field(message, "nonce", str)
        if not 16 <= len(nonce) <= 64:
            raise ProtocolError("hello nonce of a bad length")
        name = protocol.loggable(str(field(message, "name", str, optional=True) or identity.hex()[:8]), 64)
        worker = self.workers.get(identity)
        if worker is None or worker.nonce != nonce:
            if worker is not None:  # the same connection opens a new session: the old one is over
                self._drop_worker(worker, "opened a new session")
            if self._stale_connection(identity, message):
                return
            name = self._unique_name(name)
            worker = self.workers[identity] = _Worker(identity, name, self.clock(), nonce=nonce,
                                                      session=protocol.Session(self.key, protocol.new_nonce()),
                                                      distrusted=identity in self._distrusted)
            log.info("worker %s connected (%d connected)", name, len(self.workers))
        # A repeated hello (its first welcome was lost) gets the same session.
        self._send_frames(identity, protocol.encode({"type": "welcome", "nonce": nonce, "sid": worker.session.sid},
                                                    self.key), "welcome", name)

    def _stale_connection(self, identity: bytes, message: dict) -> bool:
        """Whether a hello comes from an earlier connection of a worker process that has since connected again
        (queued while this master was busy: compiling, checkpointing), to be dropped; a hello from a newer one ends
        that process's older connection here, quietly, so one worker is never counted, named (``name#2``) or
        lost as several. Workers tell their process and connection apart by the hello's ``process`` and
        ``connection`` fields (a worker of a jes without them is taken as it comes)."""
        process = field(message, "process", str, optional=True)
        connection = field(message, "connection", int, optional=True)
        if process is None or connection is None or not 16 <= len(process) <= 64 or connection < 0:
            return False
        newest = self._connections.get(process)
        if newest is not None and connection < newest[0]:
            if process not in self._stale_said:  # once a process: a worker kept out this way is not invisible
                self._stale_said.add(process)
                log.info("dropped a hello from an earlier connection of worker process %s (it has connected again "
                         "since)", protocol.loggable(process, 16))
            return True
        if newest is not None and newest[1] != identity and newest[1] in self.workers:
            self._replaced[newest[1]] = None  # its queued messages are dropped quietly (_receive)
            while len(self._replaced) > MAX_REMEMBERED_PROCESSES:
                self._replaced.pop(next(iter(self._replaced)))
            self._drop_worker(self.workers[newest[1]], "reconnected (its earlier connection is over)")
        self._connections.pop(process, None)
        self._connections[process] = (connection, identity)
        while len(self._connections) > MAX_REMEMBERED_PROCESSES:  # the oldest first
            self._connections.pop(next(iter(self._connections)))
        return False

    def _unique_name(self, name: str) -> str:
        """``name``, or ``name#2``, ``name#3``... when a connected worker has it (two ``--name $(hostname)`` on one
        host); a taken name is warned about once."""
        taken = {w.name for w in self.workers.values()}
        if name not in taken:
            return name
        number = 2
        while f"{name}#{number}" in taken:
            number += 1
        if name not in self._names_warned:
            self._names_warned.add(name)
            log.warning("worker name %s is taken by a connected worker; this one is called %s#%d in this log (give "
                        "each worker its own --name)", name, name, number)
        return f"{name}#{number}"

    def _handle(self, identity: bytes, message: dict) -> None:
        """Act on an authenticated, in-session message from a known worker."""
        kind = message["type"]
        if kind not in ("request", "result", "heartbeat", "bye", "refused", "diverged"):
            raise ProtocolError(f"unexpected message type {kind!r}")
        worker = self.workers[identity]
        worker.last_seen = self.clock()
        if kind == "heartbeat":
            for aid in worker.aids:
                assignment = self.assignments[aid]
                if not assignment.heard:
                    # Workers heartbeat only while busy, so this is the first sign it is evaluating the range.
                    assignment.heard = True
                    log.debug("worker %s: evaluating chunks %d..%d of generation %d", worker.name,
                              assignment.chunks[0], assignment.chunks[-1], assignment.generation)
            self._send(worker, {"type": "pong"})
            return
        if kind == "bye":
            self._drop_worker(worker, "left")
            return
        if kind == "diverged":
            self._diverged(worker, message)
            return
        if kind == "refused":
            run = field(message, "run", str)
            reason = protocol.loggable(str(field(message, "reason", str)), 2000)
            if run == self._run and worker.refused != run:
                worker.refused = run
                if "protocol version" in reason:  # a worker of another jes: say which one the master runs
                    from jes import __version__ as jes_version

                    reason += (f" (this master runs jes {jes_version}, protocol version {protocol.PROTOCOL_VERSION}: "
                               f"install that jes on the worker's host)")
                log.error("worker %s refused run %s: %s", worker.name, run, reason)
            self.stats["refused"] += 1
            return
        run = field(message, "run", str, optional=True)
        generation = field(message, "gen", int)
        state_hash = field(message, "hash", str)
        if kind == "result":
            self._handle_result(worker, message, run, generation, state_hash)
        else:
            last_aid = field(message, "last_aid", int)
            abandon = field(message, "abandon", int, optional=True)
            done = sorted(aid for aid in worker.aids if aid <= last_aid)
            for aid in done:  # it is idle, so it finished (result already in) or abandoned these
                self._end_assignment(aid, "returned")
            if worker.aids:
                return  # this request crossed a work message in flight; the worker will get it
            if abandon is not None:
                count = worker.abandons[1] + 1 if worker.abandons[0] == self._generation else 1
                worker.abandons = (self._generation, count)
        worker.run, worker.generation, worker.state_hash = run, generation, state_hash
        if worker.aids:
            return
        worker.idle = True
        self._assign(worker)  # between generations the queue is empty: set up, or 'wait'

    def _diverged(self, worker: _Worker, message: dict) -> None:
        """A worker found its state after a generation's update differs from ours: it computes other bits."""
        run, generation = field(message, "run", str), field(message, "gen", int)
        expected, mine = field(message, "hash", str), field(message, "mine", str)
        if run != self._run or worker.distrusted:
            return
        self.stats["diverged"] += 1
        self._distrust(worker.identity, f"computes other bits than the master: its state after the update of "
                                        f"generation {generation - 1} has hash {protocol.loggable(mine, 64)}, the "
                                        f"master's {protocol.loggable(expected, 64)} (likely causes: other XLA_FLAGS "
                                        f"or JAX settings on that worker, e.g. JAX_ENABLE_X64 or --xla_cpu_enable_fast_"
                                        f"math; another jes, JAX or jaxlib version; another kind of CPU)", logging.WARNING)

    def _handle_result(self, worker: _Worker, message: dict, run, generation: int, state_hash: str) -> None:
        aid = field(message, "aid", int)
        assignment = self.assignments.get(aid) if aid in worker.aids else None
        if assignment is None or not self._active or assignment.generation != self._generation or worker.distrusted:
            # Not a live assignment of this worker: late (past its deadline, or the generation is over), of
            # another worker, or never issued. Nothing in it is used.
            self.stats["stale_results"] += 1
            log.debug("worker %s: dropped a result for assignment %d, not one it holds", worker.name, aid)
            return
        start, stop = assignment.chunks[0], assignment.chunks[-1] + 1
        try:
            try:
                seconds, values = self._result_values(message, start, stop, run, generation, state_hash)
            except ProtocolError as err:
                self.stats["bad_results"] += 1
                self._distrust(worker.identity, f"sent a malformed result ({err})")
                return
            elapsed = max(0.0, self.clock() - assignment.issued)
            if not (math.isfinite(seconds) and 0 < seconds <= TIMING_SLACK_FACTOR * elapsed + TIMING_SLACK_SECONDS):
                self.stats["bad_results"] += 1
                self._distrust(worker.identity, f"reported an impossible evaluation time ({seconds!r} s for chunks "
                                                f"{start}..{stop - 1}, issued {elapsed:.3g} s before)")
                return
            problem = self._implausible(values)
            if problem is not None:
                self._verify_here(worker, assignment, values, problem)
                return
            if assignment.audit:
                self._check_audit(start, stop, values, worker.identity)
                return
            stored = self._store(list(range(start, stop)), *values, by=worker.identity)
            # A worker's first range (after it joined, or after its state diverged) is always checked: one
            # range per join, so a worker computing other bits is caught before its results settle anything
            probe, worker.probe = worker.probe and not worker.verified, False
            # ... and so are the first centre slots it delivers: they settle the centre's return (what stop_at_return
            # reads), and with eval_every > 1 its first range can have come on a generation without them
            probe = probe or (self._centre_live and worker.centre_probe)
            if stored and (probe or (self.audit and self._audit_rng.random() < self.audit)):
                self._audits.append((start, stop, worker.identity))
                self.stats["join_audits" if probe else "sampled_audits"] += 1
                worker.centre_probe = worker.centre_probe and not self._centre_live
            worker.members_done += stored * self.trainer.chunk_size
            worker.interval_members += stored * self.trainer.chunk_size
            self._learn_speed(worker, stop - start, seconds, elapsed)
        finally:
            if aid in worker.aids:  # whatever it held and did not deliver goes back to the queue
                self._end_assignment(aid, "not delivered, back")

    def _result_values(self, message: dict, start: int, stop: int, run, generation: int, state_hash: str) -> tuple:
        """``(seconds, (fitness, env_steps, obs_sum, obs_sumsq, centre_returns, centre_steps))`` of a result for the
        issued range ``[start, stop)``, every field checked; raises :class:`ProtocolError` for anything else."""
        if (field(message, "start", int), field(message, "stop", int)) != (start, stop):
            raise ProtocolError(f"result for chunks [{message['start']}, {message['stop']}), but it was issued "
                                f"[{start}, {stop})")
        if (run, generation, state_hash) != (self._run, self._generation, self._hash):
            raise ProtocolError("result of another run, generation or state than its assignment")
        seconds = float(field(message, "seconds", (float, int)))
        k, size, obs = stop - start, self.trainer.chunk_size, self.trainer.spec.obs_shape
        slots = self._results[4].shape[1]  # the chunks' centre slots: S when they were asked for live, else none

        def array(name, dtype, shape):
            try:
                return protocol.unpack_array(message.get(name), dtype, shape)
            except ProtocolError as err:
                raise ProtocolError(f"field {name!r}: {err}") from None

        return seconds, (array("fitness", "float32", (k, size)), array("env_steps", "int32", (k,)),
                         array("obs_sum", "float32", (k, *obs)), array("obs_sumsq", "float32", (k, *obs)),
                         array("centre_returns", "float32", (k, slots)), array("centre_steps", "int32", (k, slots)))

    def _implausible(self, values: tuple) -> str | None:
        """Why a worker's per-chunk values cannot be used as they are (``None``: they can)."""
        fitness, env_steps, obs_sum, obs_sumsq, centre_returns, centre_steps = values
        if not np.isfinite(fitness).all():
            return "non-finite fitness"
        if (env_steps < 0).any() or (self._max_chunk_steps is not None and (env_steps > self._max_chunk_steps).any()):
            return f"env step counts outside [0, {self._max_chunk_steps}]"
        if not np.isfinite(centre_returns).all():
            return "non-finite centre returns"
        most = self._max_episode_steps
        if (centre_steps < 0).any() or (most is not None and (centre_steps > most).any()):
            return f"centre episode step counts outside [0, {most}]"
        if not (np.isfinite(obs_sum).all() and np.isfinite(obs_sumsq).all()):
            return "non-finite observation sums"
        if (obs_sumsq < 0).any():
            return "negative sums of squares"
        return None

    def _verify_here(self, worker: _Worker, assignment: _Assignment, values: tuple, problem: str) -> None:
        """Settle an implausible result with the master's own evaluation of its range, which is what is stored."""
        start, stop = assignment.chunks[0], assignment.chunks[-1] + 1
        log.warning("worker %s: chunks %d..%d of generation %d came with %s; the master evaluates them itself",
                    worker.name, start, stop - 1, self._generation, problem)
        self.stats["verified_here"] += 1
        truth = self._evaluate_range(start, stop)
        honest = all(_same_bits(v, t) for v, t in zip(values, truth))
        if assignment.audit:
            self._check_audit(start, stop, truth, None)
        else:
            self._store(list(range(start, stop)), *truth)
        if honest:  # e.g. a policy whose outputs overflow: the master gets the same non-finite fitness
            worker.verified = True
        else:
            self.stats["bad_results"] += 1
            self._distrust(worker.identity, f"sent {problem} that differ from the master's own evaluation")

    def _learn_speed(self, worker: _Worker, chunks: int, seconds: float, elapsed: float) -> None:
        # Clamped before any arithmetic: no worker computed longer than the master waited for it.
        seconds = min(max(seconds, MIN_SECONDS), max(elapsed, MIN_SECONDS))
        rate = min(max(chunks / seconds, MIN_RATE), MAX_RATE)
        worker.chunks_per_second = rate if worker.chunks_per_second is None else 0.5 * (worker.chunks_per_second + rate)

    # ------------------------------------------------------------ scheduling
    def _end_assignment(self, aid: int, why: str, level: int = logging.INFO) -> list[int]:
        """Forget assignment ``aid``; queue again its chunks that nobody has delivered or holds. Returns them."""
        assignment = self.assignments.pop(aid, None)
        if assignment is None:
            return []
        worker = self.workers.get(assignment.worker)
        if worker is not None:
            worker.aids.discard(aid)
        if not self._active or assignment.generation != self._generation:
            return []
        if assignment.audit:
            start, stop = assignment.chunks[0], assignment.chunks[-1] + 1
            if why != "audited" and self._have[start:stop].all():  # not delivered: another worker or the master looks
                self._audits.append((start, stop, self._delivered_by.get(start, b"")))
            return []
        held = {c for a in self.assignments.values() for c in a.chunks}
        back = [c for c in assignment.chunks if not self._have[c] and c not in self._pending and c not in held]
        if back:
            self._pending = sorted(self._pending + back)
            self._reissued.update(back)
            self.stats["reissued_chunks"] += len(back)
            name = worker.name if worker is not None else assignment.worker.hex()[:12]
            log.log(level, "worker %s: chunks %d..%d %s to the queue", name, back[0], back[-1], why)
        return back

    def _drop_worker(self, worker: _Worker, why: str) -> None:
        for aid in sorted(worker.aids):
            self._end_assignment(aid, "back", logging.WARNING)
        self.workers.pop(worker.identity, None)
        log.info("worker %s %s (%d connected)", worker.name, why, len(self.workers))

    def _expire(self, now: float) -> None:
        for worker in list(self.workers.values()):
            if now - worker.last_seen > self.worker_timeout:
                log.warning("worker %s lost (silent for %.1fs)", worker.name, now - worker.last_seen)
                self._drop_worker(worker, "dropped")
                continue
            for aid in sorted(worker.aids):
                assignment = self.assignments[aid]
                if now > assignment.deadline:
                    # Nobody waits for it any more; a late result is not a live assignment's and is dropped. What the
                    # worker did is a measurement too: at most its chunks in the time it had (its estimate, learnt
                    # from results only, stayed at its old speed: a worker 4x slower than it was missed every
                    # deadline after, its ranges sized and timed for the old speed, a review)
                    if not assignment.audit and now > assignment.issued:
                        bound = max(len(assignment.chunks) / (now - assignment.issued), MIN_RATE)
                        if worker.chunks_per_second is None or worker.chunks_per_second > bound:
                            worker.chunks_per_second = bound
                    self._end_assignment(aid, "overran their deadline, back", logging.WARNING)

    def _assign_idle(self) -> None:
        for worker in list(self.workers.values()):
            if worker.idle and not self._benched(worker) and not worker.distrusted and (self._pending or (
                    worker.verified and any(a[2] != worker.identity for a in self._audits))):
                self._assign(worker)

    # --------------------------------------------------------------- audits
    def _auditing(self) -> bool:
        """Audits of this generation still open (queued, or out with a worker)."""
        return bool(self._audits) or any(a.audit for a in self.assignments.values())

    def _should_audit_here(self) -> bool:
        """The master takes a queued audit when no verified worker (other than the deliverer) is idle or busy.

        Only workers the master has verified audit: a second opinion of an unverified worker (perhaps the
        same liar under another identity) would settle nothing."""
        auditors = [w for w in self._ready_workers()
                    if w.verified and not self._benched(w) and w.identity != self._audits[0][2]]
        if any(w.idle for w in auditors):
            return False
        return not any(w.aids for w in auditors)

    def _evaluate_range(self, start: int, stop: int) -> tuple:
        outs = [self._evaluate_chunk(c) for c in range(start, stop)]
        self.stats["master_chunks"] += stop - start
        return tuple(np.concatenate([o[j] for o in outs]) for j in range(len(self._results)))

    def _audit_here(self, start: int, stop: int, first: bytes) -> None:
        self._check_audit(start, stop, self._evaluate_range(start, stop), None)

    def _check_audit(self, start: int, stop: int, values: tuple, by: bytes | None) -> None:
        """Compare a second evaluation of chunks [start, stop) (by worker ``by``, or the master) with the stored one.

        Settled without the master only when ``by`` is a verified worker and both agree bit for bit;
        otherwise the master's own evaluation is the truth, and every worker that differs from it is distrusted.
        """
        self.stats["audits"] += 1
        for aid in [aid for aid, a in self.assignments.items() if a.audit and a.chunks[0] == start]:
            self._end_assignment(aid, "audited")
        chunks = range(start, stop)
        if not self._have[start:stop].all():
            return  # its first delivery was dropped meanwhile (that worker was distrusted): nothing to compare
        auditor = self.workers.get(by) if by is not None else None
        trusted = by is None or (auditor is not None and auditor.verified and not auditor.distrusted)
        agree = all(_same_bits(r[start:stop], v) for r, v in zip(self._results, values))
        if agree and trusted:
            if by is None:
                self._mark_verified({self._delivered_by.get(c) for c in chunks})
            return
        if not agree:
            self.stats["audit_mismatches"] += 1
        else:
            self.stats["audits_settled_here"] += 1  # an unverified auditor agreeing proves nothing
        truth = values if by is None else self._evaluate_range(start, stop)  # the master settles it
        for identity in {self._delivered_by.get(c) for c in chunks} - {None}:
            theirs = [c for c in chunks if self._delivered_by.get(c) == identity]
            if any(not _same_bits(r[c], t[c - start]) for c in theirs for r, t in zip(self._results, truth)):
                self._distrust(identity)
            else:
                self._mark_verified({identity})
        if by is not None:
            if all(_same_bits(v, t) for v, t in zip(values, truth)):
                self._mark_verified({by})
            else:
                self._distrust(by)
        self._have[start:stop] = False
        for chunk in chunks:
            self._delivered_by.pop(chunk, None)
        self._store(list(chunks), *truth)

    def _mark_verified(self, identities: set) -> None:
        for identity in identities:
            worker = self.workers.get(identity) if identity is not None else None
            if worker is not None and not worker.distrusted:
                worker.verified = True

    def _distrust(self, identity: bytes,
                  why: str = "returned results that differ from the master's own evaluation",
                  level: int = logging.ERROR) -> None:
        """Drop everything ``identity`` delivered in this generation and give it no more work (for the rest of
        the run, also in a new session of the same identity); tell the worker why (``distrusted``)."""
        already = identity in self._distrusted
        self._distrusted.setdefault(identity, why)
        worker = self.workers.get(identity)
        name = worker.name if worker is not None else identity.hex()[:12]
        dropped = sorted(c for c, who in self._delivered_by.items() if who == identity)
        for chunk in dropped:
            self._have[chunk] = False
            del self._delivered_by[chunk]
        self._pending = sorted(set(self._pending) | set(dropped))
        self._reissued.update(dropped)
        self._audits = [a for a in self._audits if a[2] != identity]
        if worker is not None:
            worker.distrusted, worker.verified = True, False
            for aid in sorted(worker.aids):
                self._end_assignment(aid, "from a distrusted worker, back")
        if already:
            return
        self.stats["distrusted_workers"] += 1
        spec = getattr(self.trainer, "spec", None)
        seeded = (" If every worker is distrusted so, the likely cause is the env: a Python env whose episodes are "
                  "not a function of reset(seed=...) (one drawing from the global np.random or random, or the clock, "
                  "instead of self.np_random) gives other results at every evaluation"
                  if getattr(spec, "host", False) and "differ" in why else "")
        log.log(level, "worker %s %s: distrusted for the rest of the run, its results are no longer used; its %d "
                "chunk(s) of generation %d go back to the queue.%s", name, why, len(dropped), self._generation, seeded)
        if worker is not None:
            self._send(worker, {"type": "distrusted", "run": self._run, "reason": why})

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
        size = max(1, min(share, round(rate * self.target_range_seconds)))
        size = max(1, min(size, self._most_chunks_per_message()))
        return min(size, self.max_range_chunks) if self.max_range_chunks else size

    def _most_chunks_per_message(self) -> int:
        """Most chunks whose results fit in one message to the master (its socket drops a larger one, and with it the
        worker's connection: a range of image observations' sums, 2 x 113 KB a chunk at 84x84x4, went over 16 MiB
        from 74 chunks on, every result dropped and reissued). 0: not even one (said by _assign, which sends none)."""
        per_chunk = sum(a[0].nbytes for a in self._results)  # (a range's arrays are packed whole: their headers, the
        return max(0, self.max_message_bytes - RESULT_HEADER_BYTES) // max(1, per_chunk)  # message's fields, < 4 KiB)

    def _assign(self, worker: _Worker) -> None:
        """Answer an idle worker: the run to build, a snapshot, a range of chunks, or 'wait'."""
        if worker.run != self._run:
            if worker.refused == self._run:
                self._send(worker, {"type": "wait"})  # it cannot build this run; it logged why, and so did we
            elif not worker.setup_sent or worker.run is not None:
                # A worker reporting no run after its setup is still building it (its heartbeats say so).
                self._send(worker, {"type": "setup", "run": self._run, "description": self.description,
                                    "heartbeat_interval": self.heartbeat_interval})
                worker.setup_sent = True
                log.info("worker %s: sent run %s", worker.name, self._run)
            worker.idle = False
            return
        worker.setup_sent = True
        audit = None
        if not self._pending and not worker.distrusted and worker.verified:
            audit = next((a for a in self._audits if a[2] != worker.identity), None)
        if worker.distrusted:  # told again (a new session of it): a jes-worker stops at this message
            self._send(worker, {"type": "distrusted", "run": self._run,
                                "reason": self._distrusted.get(worker.identity, "distrusted")})
            return
        if (not self._pending and audit is None) or self._benched(worker):
            # Nothing to do, or a worker that keeps failing to sync (it sits this generation out).
            self._send(worker, {"type": "wait"})
            return
        if self._most_chunks_per_message() < 1:  # one chunk's results are more than a message to the master holds
            if not self._results_too_large:
                self._results_too_large = True
                log.error("one chunk's results are %d bytes, more than a worker can send the master in one message "
                          "(%d): no worker's result could arrive, so the master evaluates every chunk itself; train "
                          "without workers, or with a smaller chunk_size", sum(a[0].nbytes for a in self._results),
                          self.max_message_bytes - RESULT_HEADER_BYTES)
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
            if len(self._snapshot) > protocol.MAX_TO_WORKER_BYTES - 4096:  # (its message's other fields: < 4 KiB)
                # A worker's socket drops a larger message, and with it the connection: it reconnected every
                # master_timeout, both logs blaming silence (a review). Said once; the master evaluates alone.
                if not self._snapshot_too_large:
                    self._snapshot_too_large = True
                    log.error("the run's state is %d bytes packed, more than a worker takes in one message (%d): "
                              "no worker can receive it, so the master evaluates every chunk itself; train this "
                              "policy without workers, or make its state smaller (a smaller policy, or an optimizer "
                              "with less state, e.g. sgd)", len(self._snapshot), protocol.MAX_TO_WORKER_BYTES - 4096)
                self._send(worker, {"type": "wait"})
                return
            self._send(worker, {"type": "snapshot", "run": self._run, "gen": self._generation, "hash": self._hash,
                                "state": self._snapshot})
            self.stats["snapshots"] += 1
            log.info("worker %s: sent state snapshot of generation %d", worker.name, self._generation)
        if audit is not None:
            self._audits.remove(audit)
            chunks = list(range(audit[0], audit[1]))
        else:
            size = self._range_size(worker)
            chunks = [self._pending[0]]
            while len(chunks) < size and len(self._pending) > len(chunks) and self._pending[len(chunks)] == chunks[-1] + 1:
                chunks.append(self._pending[len(chunks)])
            del self._pending[: len(chunks)]
        now = self.clock()
        if worker.chunks_per_second is None:
            deadline = now + self.assign_timeout
        else:  # the rate is clamped to [MIN_RATE, MAX_RATE] where it is learned: a finite deadline
            deadline = now + max(self.min_deadline, self.deadline_factor * len(chunks) / worker.chunks_per_second)
        aid, self._next_aid = self._next_aid, self._next_aid + 1
        self.assignments[aid] = _Assignment(aid, worker.identity, self._generation, chunks, now, deadline,
                                            audit=audit is not None)
        worker.aids.add(aid)
        worker.idle = False
        self.stats["assigned_ranges"] += 1
        worker.generation, worker.state_hash = self._generation, self._hash
        self._send(worker, {"type": "work", "run": self._run, "gen": self._generation, "hash": self._hash, "aid": aid,
                            "start": chunks[0], "stop": chunks[-1] + 1, "centre": self._centre_live,
                            "update": update})
        log.debug("worker %s: assigned chunks %d..%d of generation %d", worker.name, chunks[0], chunks[-1],
                  self._generation)

    def _worker_rate(self, worker: _Worker, elapsed: float) -> str:
        """A worker's part of the status line: ``distrusted``, ``refused`` (it cannot build this run, and said why
        when it refused), or its members/s."""
        if worker.distrusted:
            return "distrusted"
        if worker.refused == self._run and worker.run != self._run:
            return "refused"
        return members_per_second(worker.interval_members, elapsed)

    def _status(self, generation: int) -> None:
        now = time.monotonic()
        elapsed = now - self._last_status
        if elapsed < self.status_interval or elapsed <= 0:
            return
        parts = [f"{w.name} {self._worker_rate(w, elapsed)}" for w in self.workers.values()]
        log.info("generation %d: %d worker(s) connected; members/s: %s%s", generation, len(self.workers),
                 ", ".join(parts) or "-", f", master {members_per_second(self._master_members, elapsed)}")
        for w in self.workers.values():
            w.interval_members = 0
        self._master_members = 0
        self._last_status = now

