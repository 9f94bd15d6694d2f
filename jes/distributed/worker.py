"""``jes-worker``: evaluate chunks of a distributed run's population for a master.

A worker connects a ZeroMQ DEALER to the master's ROUTER and asks for work.
It rebuilds the run from the master's plain-data description, keeps its own
copy of the training state (advanced each generation with the per-chunk
results the master sends along with the next work item, checked against the
master's state hash, replaced by a snapshot when it drifted), evaluates its
chunk range with the same compiled chunk program the master would use, and
sends back only fitness, env steps and observation sums, and on a generation that evaluates the centre the
returns and steps of its chunks' centre slots (the local step's layout: :mod:`jes.distributed.master`).

Two threads: the main thread computes; a link thread owns the socket, sends
heartbeats while the main thread is busy (compiling or evaluating), and
reconnects when the master goes quiet (e.g. it restarted), backing off after failed handshakes. A worker the
master distrusts (its results differed, or its state drifted) logs why and ``jes-worker`` exits with status 3. Ctrl-C (or
SIGTERM) hands the current range back to the master and exits cleanly.

A worker builds only registered classes and functions (jes's policies and
strategies, flax.linen layers, activations, gymnax envs) and what is defined in
the operator's ``--allow-module`` modules, checked on the resolved objects
(:mod:`jes.describe`); a master that names anything else gets a ``refused``
message, and the worker keeps serving.

Usage::

    JES_SECRET=... jes-worker --master trainhost:5555 [--name gpu0] [--devices 1] [--cores 0] [--allow-module mypkg] [--import mypkg.envs]
"""
from __future__ import annotations

import argparse
import collections
import logging
import math
import os
import queue
import signal
import socket
import sys
import threading
import time
import uuid
from typing import Any, Callable

import msgpack
import numpy as np
import zmq

from jes import describe

from jes.distributed import protocol, transport
from jes.distributed.protocol import ProtocolError, field

# A master's heartbeat interval beyond this is taken as this (seconds): the worker still heartbeats hourly
MAX_HEARTBEAT_INTERVAL = 3600.0
# After a failed handshake (a wrong secret or server key) the worker reconnects after 1, 2, 4 ... seconds, at most
# this long, rather than ZeroMQ's every 200 ms: a misconfigured fleet must not hammer the master's port
MAX_HANDSHAKE_BACKOFF = 30.0
# What the worker's socket monitor watches: failed handshakes, and TCP connections that fail (refused)
LINK_EVENTS = transport.HANDSHAKE_EVENTS | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_CONNECTED


def handshake_backoff(failures: int) -> float:
    """Seconds to wait before reconnecting after the ``failures``-th failed handshake in a row (1, 2, 4, ... 30)."""
    return min(MAX_HANDSHAKE_BACKOFF, 2.0 ** min(max(failures - 1, 0), 16))


def resolve_problem(endpoint: str) -> str | None:
    """Why the host of a ``tcp://host:port`` endpoint cannot be resolved, or ``None`` (resolved, or not TCP)."""
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint[len("tcp://"):].rpartition(":")
    try:
        socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, ValueError) as err:
        return f"cannot resolve host {host!r} (name resolution failed: {err}); check --master"
    return None

log = logging.getLogger("jes.distributed.worker")


class EnvFailedError(RuntimeError):
    """The run built, but its env failed (:class:`jes.host_rollout.HostEnvError`) in the chunk a worker evaluates to
    warm its programs up before any assignment: the env's fault, not the run's description."""


def connect_address(master: str) -> str:
    """``"host:port"`` -> ``tcp://host:port`` (``tcp://...`` as is)."""
    if not isinstance(master, str):
        raise ValueError(f"--master must be 'host:port', got {master!r}")
    if master.startswith(("tcp://", "ipc://", "inproc://")):
        return master
    host, sep, port = master.rpartition(":")
    if not host or not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--master must be 'host:port' (e.g. trainhost:5555), got {master!r}")
    return f"tcp://{host}:{port}"


def parse_cores(text: str) -> set[int]:
    """``"0"``, ``"0,2"``, ``"0-3"`` -> a set of CPU ids."""
    cores: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            cores.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ValueError(f"--cores must look like '0', '0,2' or '0-3', got {text!r}") from None
    if not cores:
        raise ValueError("--cores names no core")
    return cores


_HANDSHAKE_ADVICE = {
    "key": "the master refused this worker's key: this worker's shared secret is not the master's (--secret-file, "
           "$JES_SECRET)",
    "ended": "the master closed the connection in the CURVE handshake: this worker's shared secret is not the "
             "master's, the master has a key pair of its own and --curve-server-key is missing or not its "
             "NAME.public, or the master runs a jes from before CURVE on every connection (run the same jes "
             "version on both)",
    "no CURVE": "the process there does not speak CURVE: a jes master from before CURVE on every connection "
                "(run the same jes version on both), or not a jes master",
    "server key": "the CURVE handshake failed on a cryptographic check: --curve-server-key is not the master's",
}


# `jes-worker`'s exit status when its master distrusts it (a supervisor may keep it from restarting on this
# status: a restarted worker with the same settings is distrusted again)
DISTRUSTED_EXIT = 3
# `jes-worker --give-up-after`'s exit status when no master ever answered within that time (a wrong --master,
# secret or port, or a master that never started); a worker whose master answered and then went exits 0
NO_MASTER_EXIT = 4
# ... and when its master's run was one it could not build (it refused it; its log said why), and it did no other
REFUSED_EXIT = 5


class Distrusted(Exception):
    """The master distrusts this worker (its reason in ``args[0]``): :meth:`Worker.serve` returns."""


def likely_cause(reason: str) -> str:
    """What to check on a worker the master distrusted for ``reason`` (the master's words)."""
    if "int64" in reason or "float64" in reason:
        return ("Is JAX_ENABLE_X64 (or jax.config's jax_enable_x64) set on this worker? The master computes in "
                "32 bits.")
    if "other bits" in reason or "differ from the master's own evaluation" in reason or "differ" in reason:
        return ("This worker computes other bits than the master: check that its environment matches the master's "
                "(the env's code and version: your --allow-module / --import modules, the gymnax, brax, Gymnasium "
                "or simulator versions; XLA_FLAGS, JAX_ENABLE_X64 and other JAX settings; the jes, JAX and jaxlib "
                "versions; the kind of CPU or accelerator); or, for a Python env, episodes that are not a function of "
                "reset(seed=...) (the global np.random or random, the clock), which differ at every evaluation.")
    if "evaluation time" in reason:
        return "Its reported evaluation times were impossible by the master's clock."
    return "Check that this worker runs the same jes, JAX and settings as the master."


class _Link(threading.Thread):
    """Owns the DEALER socket: the session, outgoing and incoming messages, heartbeats, reconnects.

    The main thread hands messages over with :meth:`send` (msgpack through an inproc pipe); this
    thread stamps them with the session's ``sid``/``seq`` and MAC. Incoming messages are checked
    (MAC, then session and sequence number: replays are dropped) and queued in :attr:`inbox`; a new
    session is announced there as ``{"type": "session"}`` so the main thread asks for work afresh.
    """

    def __init__(self, endpoint: str, key: bytes, name: str, heartbeat_interval: float, master_timeout: float,
                 curve_server_key: bytes | None = None):
        super().__init__(name="jes-worker-link", daemon=True)
        self.endpoint, self.key, self.name = endpoint, key, name
        self.curve_server_key = curve_server_key
        self.heartbeat_interval = heartbeat_interval
        self.master_timeout = master_timeout
        self.inbox: queue.Queue = queue.Queue()
        self.idle = True
        self.context = zmq.Context()
        self._pipe_address = f"inproc://jes-worker-{uuid.uuid4().hex}"
        self._pipe_in = self.context.socket(zmq.PAIR)
        self._pipe_in.bind(self._pipe_address)
        self._pipe_out = self.context.socket(zmq.PAIR)  # used by the main thread only
        self._pipe_out.connect(self._pipe_address)
        self._stopping = threading.Event()
        self._socket = None
        self.session: protocol.Session | None = None
        self._nonce = ""
        self._last_hello = 0.0
        self.connected = False
        self.replayed = 0
        self._monitor = None
        self.handshake_failures: collections.Counter = collections.Counter()  # by transport.handshake_failure kind
        self._last_handshake_warning = -float("inf")
        self._reconnect_at: float | None = None  # a reconnect put off after a failed handshake (back-off)
        self.unreachable: str | None = None  # why the master cannot be reached (unresolvable, refused), once said
        self._last_unreachable_warning = -float("inf")
        self._was_connected = False  # whether a master ever answered on this endpoint (what a refusal then means)
        # This worker process's id and its connections' count, in each hello: a master that was busy while the
        # worker reconnected drops the older connection's queued hellos instead of counting it twice
        self.process = uuid.uuid4().hex
        self._connections = 0
        # When a master last sent an authenticated message (monotonic seconds; the link's start until one does),
        # never reset by a reconnect: what Worker's give_up_after reads. ever_heard: whether one ever did.
        self.last_heard_at = time.monotonic()
        self.ever_heard = False

    def send(self, message: dict) -> None:
        """Queue ``message`` for the master (main thread)."""
        self._pipe_out.send(msgpack.packb(message, use_bin_type=True))

    def stop(self, flush_seconds: float = 1.0) -> None:
        self._flush_seconds = flush_seconds
        self._stopping.set()
        self.join(timeout=flush_seconds + 2)
        self._pipe_out.close(0)
        if not self.is_alive():
            # What the closed socket still queues (the goodbye) leaves when its context terminates, within the
            # socket's linger. Nothing else terminated it: a worker leaving during a build ends with os._exit, and
            # its goodbye was lost where ZMQ's I/O thread had not sent it yet (a loaded machine: the master then
            # reported the worker lost, not left). Bounded: a socket still open would hold term() forever.
            ender = threading.Thread(target=self.context.term, name="jes-worker-link-term", daemon=True)
            ender.start()
            ender.join(timeout=flush_seconds + 1)

    def _connect(self) -> None:
        if self._socket is not None:
            self._socket.disable_monitor()
            self._monitor.close(0)
            self._socket.close(0)
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, f"{self.name}-{uuid.uuid4().hex[:8]}".encode()[:255])
        sock.setsockopt(zmq.LINGER, 0)
        if "[" in self.endpoint:  # an IPv6 address ([::1]:5555); a host name resolves to IPv4 as before (with
            sock.setsockopt(zmq.IPV6, 1)  # IPv6 on, "localhost" could resolve to ::1, where a master on 0.0.0.0 is not)
        sock.setsockopt(zmq.IMMEDIATE, 1)            # never queue messages for a master that is not there
        sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_TO_WORKER_BYTES + 4096)
        sock.setsockopt(zmq.RECONNECT_IVL, 200)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        sock.setsockopt(zmq.HEARTBEAT_IVL, 2000)     # transport-level: a vanished master host is noticed
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 10000)
        # CURVE with the client key of the shared secret (the master admits no other), to the master's own
        # server key when given, else to the one the secret gives (jes.distributed.transport).
        transport.secure_client(sock, self.key, self.curve_server_key)
        self._connections += 1
        self._monitor = sock.get_monitor_socket(LINK_EVENTS)
        problem = resolve_problem(self.endpoint)  # ZeroMQ retries an unresolvable name in silence
        if problem is not None:
            self._unreachable(problem, time.monotonic())
        sock.connect(self.endpoint)
        self._socket = sock
        self._new_session()

    def _unreachable(self, why: str, now: float) -> None:
        """Say why the master cannot be reached: at once the first time, then at most every master_timeout."""
        self.unreachable = why
        if now - self._last_unreachable_warning >= self.master_timeout:
            self._last_unreachable_warning = now
            log.warning("cannot reach master %s: %s; still trying", self.endpoint, why)

    def _new_session(self) -> None:
        """Forget the session; :meth:`_hello` opens the next one."""
        self.session, self._nonce, self._last_hello = None, protocol.new_nonce(), 0.0

    def _hello(self, now: float) -> None:
        # Repeated until welcomed: with IMMEDIATE, a hello sent before the TCP connection is up is dropped.
        if now - self._last_hello >= min(0.5, self.heartbeat_interval):
            self._raw({"type": "hello", "name": self.name, "nonce": self._nonce, "process": self.process,
                       "connection": self._connections})
            self._last_hello = now

    def _raw(self, message: dict) -> None:
        self._forward(protocol.encode(message, self.key))

    def _forward(self, frames: list[bytes]) -> None:
        try:
            self._socket.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            log.debug("master not reachable; dropped an outgoing message")

    def _outgoing(self, packed: bytes) -> None:
        if self.session is None:
            log.debug("no session with the master yet; dropped an outgoing message")
            return
        self._forward(self.session.seal(msgpack.unpackb(packed, raw=False)))

    def _incoming(self, frames: list[bytes]) -> dict | None:
        """The checked message, or ``None`` for one to drop (logged)."""
        try:
            message = protocol.decode(frames, self.key, protocol.MAX_TO_WORKER_BYTES)
            kind = message["type"]
            if kind == "welcome":
                if (self.session is not None and message.get("nonce") == self._nonce
                        and message.get("sid") == self.session.sid):
                    # The master answers each of our repeated hellos with the same session: nothing to do.
                    log.debug("another welcome to the session we already have")
                    return None
                if self.session is not None or message.get("nonce") != self._nonce:
                    raise ProtocolError("welcome for another hello (replayed or stale)")
                self.session = protocol.Session(self.key, field(message, "sid", str))
                return {"type": "session"}
            if kind == "rehello":
                if self.session is None:
                    return None  # answers to messages we sent before our new hello; that one is on its way
                if message.get("sid") != self.session.sid:
                    raise ProtocolError("rehello for another session (replayed or stale)")
                log.info("the master does not know our session (it restarted?); opening a new one")
                self._new_session()
                return None
            if self.session is None:
                raise ProtocolError(f"{kind!r} message before the session opened")
            try:
                self.session.accept(message)
            except ProtocolError:
                self.replayed += 1
                raise
            return message
        except ProtocolError as err:
            log.warning("dropped a message from the master: %s", err)
            return None

    def run(self) -> None:
        self._connect()
        poller = zmq.Poller()
        poller.register(self._pipe_in, zmq.POLLIN)
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        last_sent = last_heard = self.last_heard_at = time.monotonic()
        ever_connected = False
        while not self._stopping.is_set():
            events = dict(poller.poll(50))
            now = time.monotonic()
            if self.session is None:
                self._hello(now)
            if self._pipe_in in events:
                while self._pipe_in.poll(0):
                    self._outgoing(self._pipe_in.recv())
                last_sent = now
            if self._monitor in events:
                while self._monitor.poll(0):
                    self._handshake_event(self._monitor.recv_multipart(), now)
            if self._reconnect_at is not None and now >= self._reconnect_at:
                self._reconnect_at = None
                self._socket.connect(self.endpoint)
            if self._socket in events:
                while self._socket.poll(0):
                    message = self._incoming(self._socket.recv_multipart())
                    if message is None:
                        continue
                    last_heard = self.last_heard_at = now  # authenticated and in session: the master is there
                    self.ever_heard = True
                    if message["type"] == "session" and not self.connected:
                        self.connected = ever_connected = True
                        self.handshake_failures.clear()  # those before this session were explained then
                        log.info("connected to master %s", self.endpoint)
                    if message["type"] != "pong":
                        self.inbox.put(message)
            if self.session is not None and now - last_sent > self.heartbeat_interval and not self.idle:
                # Heartbeats go out while the main thread builds, compiles or evaluates; the master's
                # pongs keep last_heard fresh, so a long build never looks like a silent master.
                self._forward(self.session.seal({"type": "heartbeat", "name": self.name}))
                last_sent = now
            if self.idle and now - last_heard > self.master_timeout and self._reconnect_at is not None:
                last_heard = now  # a reconnect is put off after a failed handshake (said why): keep the back-off
            elif self.idle and now - last_heard > self.master_timeout:
                if self.connected:
                    log.warning("master %s silent for %.0fs; reconnecting", self.endpoint, now - last_heard)
                elif ever_connected:  # not a wrong secret: it answered before
                    log.warning("master %s has not answered for %.0fs since it last did (its run ended, or it stopped "
                                "or restarted; Ctrl-C stops this worker); waiting for a master there",
                                self.endpoint, now - last_heard)
                elif self.handshake_failures or self.unreachable:  # said why when the handshakes failed, or the
                    pass                                             # connection was refused or not resolved
                else:
                    # A wrong secret or server key fails the handshake, which is said at once: not listed here.
                    log.warning("no answer from master %s for %.0fs (not started yet, a firewall dropping the "
                                "connection, or not a jes master?); still trying", self.endpoint, now - last_heard)
                self.connected = False
                poller.unregister(self._socket)
                poller.unregister(self._monitor)
                self._connect()
                poller.register(self._socket, zmq.POLLIN)
                poller.register(self._monitor, zmq.POLLIN)
                last_heard = now
        # Flush what the main thread queued last (its 'bye'), then close.
        deadline = time.monotonic() + getattr(self, "_flush_seconds", 1.0)
        while self._pipe_in.poll(0):
            self._outgoing(self._pipe_in.recv())
        self._socket.setsockopt(zmq.LINGER, int(max(0.0, deadline - time.monotonic()) * 1000))
        self._socket.disable_monitor()
        self._monitor.close(0)
        self._socket.close()
        self._pipe_in.close(0)

    def _handshake_event(self, frames: list[bytes], now: float) -> None:
        """Say why the master's handshake failed: at once the first time, then at most every master_timeout."""
        from zmq.utils.monitor import parse_monitor_message

        try:
            event = parse_monitor_message(frames)["event"]
        except Exception:  # noqa: BLE001 - not a monitor event
            return
        if event == zmq.EVENT_CONNECTED:
            self.unreachable, self._was_connected = None, True
            return
        if event == zmq.EVENT_CONNECT_RETRIED:  # the TCP connection failed: refused, or a name not resolved
            if now - self._last_unreachable_warning >= self.master_timeout:  # a name lookup only when it is said
                self._unreachable(resolve_problem(self.endpoint) or refused_reason(self._was_connected), now)
            return
        kind = transport.handshake_failure(frames)
        if kind is None:
            return
        self.handshake_failures[kind] += 1
        # The master there now is not the one this worker was connected to: the next session that opens is a new
        # connection (said, and the failures' count cleared then, so a later failure backs off from 1 s again)
        self.connected = False
        failures = sum(self.handshake_failures.values())
        delay = handshake_backoff(failures)
        try:  # no ZeroMQ reconnect every 200 ms: the link connects again after the back-off
            self._socket.disconnect(self.endpoint)
        except zmq.ZMQError:
            pass
        self._reconnect_at = now + delay
        if now - self._last_handshake_warning >= self.master_timeout:
            self._last_handshake_warning = now
            log.warning("the handshake with master %s failed (%d time(s) so far, it retries in %.0fs, backing off "
                        "to every %.0fs): %s", self.endpoint, failures, delay, MAX_HANDSHAKE_BACKOFF,
                        _HANDSHAKE_ADVICE.get(kind, kind))


def refused_reason(was_connected: bool) -> str:
    """Why a connection to the master's port was refused, for the log: a master that was there has gone (its run
    ended, or it stopped), or none has listened there yet."""
    if was_connected:
        return ("connection refused: the master that was there has gone (its run ended or it stopped); waiting for "
                "the next master on that port")
    return "connection refused: nothing listens on that port (the master is not started yet, or a wrong host or port)"


class Worker:
    """Serve chunk evaluations to the master at ``master`` until interrupted.

    Args:
        master: ``host:port`` of the master.
        secret: the shared HMAC key.
        name: shown in the master's logs (default ``hostname-pid``).
        devices: local devices to evaluate on (``None``: the first; an int n: the first n; or a list).
        master_timeout: reconnect after this long without a word from the master while idle.
        allow_modules: modules of the operator's own (besides jes's registry of policies, flax layers,
            strategies, activations and gymnax envs: :mod:`jes.describe`) whose classes and functions a run
            description may name, e.g. ``["mypkg.policies"]``; anything else is refused.
        curve_server_key: the master's own CURVE public key (Z85 text or the ``NAME.public`` file of
            ``jes keys NAME``), for a master started with its own secret key. ``None`` (default): the key the
            shared secret gives. Every connection is CURVE-encrypted either way.
        give_up_after: stop serving (:meth:`serve` returns, :attr:`gave_up` says why) once no master has said a
            word for this many seconds while the worker is idle: from its start if none ever answered, else from
            the last word of the last one (a run that ended, a master that stopped). ``None`` (default): wait for
            a master for ever (an elastic fleet whose master comes and goes). A worker that is evaluating is
            never stopped by it (the master's answers to its heartbeats keep it fresh).
    """

    def __init__(self, master: str, secret: bytes | str, *, name: str | None = None, devices: Any = None,
                 master_timeout: float = 30.0, allow_modules: Any = (), curve_server_key: Any = None,
                 give_up_after: float | None = None):
        if give_up_after is not None and (isinstance(give_up_after, bool) or not isinstance(give_up_after, (int, float))
                                          or not 0 < give_up_after < math.inf):  # NaN too
            raise ValueError(f"give_up_after must be a positive number of seconds or None, got {give_up_after!r}")
        self.give_up_after = give_up_after
        self.gave_up: str | None = None  # why serve() stopped waiting for a master, once it did
        self.give_up_status = 0  # jes-worker's exit status for it (0, NO_MASTER_EXIT or REFUSED_EXIT)
        self._idle_since = time.monotonic()  # when the worker last asked for work (its silence counts from then)
        self.allow = describe.allowlist(allow_modules)
        server_key = protocol.load_curve_key(curve_server_key, "--curve-server-key")
        self.endpoint = connect_address(master)
        self.key = protocol.load_secret(secret)
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.devices_arg = devices
        self.link = _Link(self.endpoint, self.key, self.name, 1.0, master_timeout, server_key)
        self.request_interval = 1.0
        self.run: str | None = None
        self.trainer = None
        self.state = None
        self.device_states: list = []
        self.generation = -1
        self.state_hash = ""
        self.last_aid = 0
        self.current_aid: int | None = None
        self.refused_run: str | None = None
        self.refused_reason = ""
        self.members_done = 0
        self.distrusted: str | None = None  # the master's reason, once it distrusts this worker
        # Set by interrupt(): a KeyboardInterrupt raised by a signal handler can land in a weakref callback or a
        # __del__, where Python prints and drops it; the serve loop checks this flag too, so the worker still exits.
        self._interrupted = threading.Event()
        # True while _setup builds and compiles a run: an interrupt must not raise inside it (see _interrupt_handler).
        self.building = False
        self._last_assign_log = 0.0

    # ---------------------------------------------------------------- loop
    def serve(self) -> None:
        """Run until Ctrl-C/SIGTERM (or :meth:`interrupt`), until the master distrusts this worker (then
        :attr:`distrusted` holds its reason), or until no master has answered for ``give_up_after`` seconds (then
        :attr:`gave_up` does)."""
        log.info("worker %s connecting to %s", self.name, self.endpoint)
        self.link.last_heard_at = self._idle_since = time.monotonic()  # the give-up clock starts now, not at __init__
        self.link.start()
        try:
            self._request()
            while True:
                if self._interrupted.is_set():
                    raise KeyboardInterrupt
                left = self._give_up_left()
                if left <= 0:
                    self._give_up()
                    self.link.send({"type": "bye", "name": self.name, "aid": None})
                    break
                try:
                    message = self.link.inbox.get(timeout=min(self.request_interval, left))
                except queue.Empty:
                    if self.link.idle:
                        self._request()
                    continue
                self._handle(message)
        except KeyboardInterrupt:
            note = f", returning assignment {self.current_aid}" if self.current_aid is not None else ""
            log.info("worker %s interrupted%s; disconnecting after %d members", self.name, note, self.members_done)
            self.link.send({"type": "bye", "name": self.name, "aid": self.current_aid})
        except Distrusted as err:
            self.distrusted = str(err)
            self.link.send({"type": "bye", "name": self.name, "aid": None})
        finally:
            self.link.stop()
            if getattr(self, "programs", None) is not None:  # the last run's host env instances (Gymnasium)
                from jes import host_step

                host_step.close_programs(self.programs)
            log.info("worker %s disconnected", self.name)

    def _give_up_left(self) -> float:
        """Seconds left before :meth:`serve` gives up waiting for a master (``inf``: never, or not idle).

        Silence counts while the worker is idle, from the later of the master's last word and the worker's last
        request (a build or an evaluation is not silence), and is at least two request intervals plus a second:
        an idle worker's requests are answered once per interval, so a live master can be that quiet."""
        if self.give_up_after is None or not self.link.idle:
            return math.inf
        limit = max(self.give_up_after, 2 * self.request_interval + 1.0)
        return limit - (time.monotonic() - max(self.link.last_heard_at, self._idle_since))

    def _give_up(self) -> None:
        """Say why the worker stops waiting for a master (once) and set :attr:`gave_up` and its exit status."""
        silent = time.monotonic() - max(self.link.last_heard_at, self._idle_since)
        if self.link.ever_heard and self.refused_run is not None and self.run is None:
            self.give_up_status = REFUSED_EXIT
            self.gave_up = (f"no word from master {self.endpoint} for {silent:.0f}s, whose run this worker could not "
                            f"build ({self.refused_reason}); giving up as --give-up-after {self.give_up_after:g} asks")
            log.error("worker %s: %s", self.name, self.gave_up)
        elif self.link.ever_heard:
            self.gave_up = (f"no word from master {self.endpoint} for {silent:.0f}s (its run ended, it stopped, or it "
                            f"is busy for longer than that outside its generations); giving up as --give-up-after "
                            f"{self.give_up_after:g} asks, after {self.members_done} members")
            log.info("worker %s: %s", self.name, self.gave_up)
        else:
            self.give_up_status = NO_MASTER_EXIT
            seen = self.link.unreachable or "; ".join(
                _HANDSHAKE_ADVICE.get(kind, kind) for kind in self.link.handshake_failures) or (
                "connected, but nothing answered: a master still starting, or not a jes master"
                if self.link._was_connected else "no connection")
            self.gave_up = (f"no master answered at {self.endpoint} within {self.give_up_after:g}s ({seen}); giving up "
                            f"as --give-up-after asks (check --master, the secret and that the master runs)")
            log.error("worker %s: %s", self.name, self.gave_up)

    def interrupt(self) -> None:
        """Ask :meth:`serve` to hand its assignment back and return (thread- and signal-safe); what Ctrl-C and
        SIGTERM do, besides raising KeyboardInterrupt."""
        self._interrupted.set()

    def _request(self, abandon: int | None = None) -> None:
        if not self.link.idle:  # back from a build or an evaluation: silence counts from now (not on every request)
            self._idle_since = time.monotonic()
        self.link.idle = True
        self.current_aid = None
        self.link.send({"type": "request", "name": self.name, "run": self.run, "gen": self.generation,
                        "hash": self.state_hash, "last_aid": self.last_aid, "abandon": abandon})

    def _handle(self, message: dict) -> None:
        kind = message["type"]
        if kind == "distrusted":
            self._distrusted(message)
        try:
            if kind == "setup":
                self._setup(message)
            elif kind == "snapshot":
                self._snapshot(message)
            elif kind == "work":
                self._work(message)
            elif kind == "session":
                self.last_aid = 0  # assignment ids are per master: a new session may be a new master
                self._request()
            elif kind != "wait":
                raise ProtocolError(f"unexpected message type {kind!r}")
        except Exception as err:  # noqa: BLE001 - nothing a master sends may kill the worker
            failed = self.current_aid if kind == "work" else None
            if isinstance(err, ProtocolError):
                log.warning("dropped a %s message from the master: %s", kind, err)
            else:
                log.exception("failed on a %s message from the master; dropped it", kind)
            time.sleep(self.request_interval)  # never spin against a master whose messages we reject
            # An assignment we failed on (its env raised here) is handed back as abandoned: the master benches a
            # worker that abandons three in a generation and evaluates them itself, rather than re-sending them
            # to us for ever.
            self._request(abandon=failed)

    # ------------------------------------------------------------ handlers
    def _distrusted(self, message: dict) -> None:
        """The master uses no more results of this worker in its run: say why, with the likely cause, and stop
        (:class:`Distrusted`; ``jes-worker`` exits with status :data:`DISTRUSTED_EXIT`)."""
        reason = protocol.loggable(str(message.get("reason") or "no reason given"), 2000)
        log.error("the master distrusts this worker and uses none of its results for the rest of run %s: %s. %s "
                  "This worker stops.", protocol.loggable(str(message.get("run")), 64), reason, likely_cause(reason))
        raise Distrusted(reason)

    def _setup(self, message: dict) -> None:
        run = field(message, "run", str)
        heartbeat = float(field(message, "heartbeat_interval", (int, float)))
        if not math.isfinite(heartbeat) or heartbeat <= 0:  # inf overflowed the inbox's wait and killed the worker;
            # NaN silenced the heartbeats (no comparison with NaN is true)
            raise ProtocolError(f"field 'heartbeat_interval' must be a positive number of seconds, got {heartbeat!r}")
        self.link.heartbeat_interval = min(heartbeat, MAX_HEARTBEAT_INTERVAL)
        self.request_interval = max(0.2, 2 * self.link.heartbeat_interval)
        if run == self.run:
            self._request()
            return
        if run == self.refused_run:  # asked again (e.g. in a new session): the same answer, without rebuilding
            self.link.send({"type": "refused", "run": run, "reason": self.refused_reason})
            self._request()
            return
        self.link.idle = False
        self.run, self.trainer, self.state, self.generation, self.state_hash = None, None, None, -1, ""
        t0 = time.perf_counter()
        self.building = True
        try:
            self._build(message.get("description"))
        except Exception as err:  # noqa: BLE001 - a description we cannot (or will not) build must not kill us
            refused = isinstance(err, protocol.RefusedError)
            # Any refusal (NotAllowedError too) is "RefusedError" on the wire: a master's log reads the same
            if refused:
                reason = f"refused: RefusedError: {err}"
            elif isinstance(err, EnvFailedError):  # built; its env raised, which a log should not call a build problem
                reason = f"its env failed: {err}"
            else:
                reason = f"cannot build: {type(err).__name__}: {err}"
            what = "built run %s sent by the master, but" if isinstance(err, EnvFailedError) else \
                "cannot build run %s sent by the master:"
            log.error(what + " %s", protocol.loggable(run, 200), protocol.loggable(reason, 2000))
            self.refused_run, self.refused_reason, self.trainer = run, reason[:2000], None
            self.link.send({"type": "refused", "run": run, "reason": self.refused_reason})
            self._request()
            return
        finally:
            self.building = False
        self.run = run
        log.info("built run %s: %s on %s, %d members in chunks of %d, %d params, on %d device(s) %s "
                 "(%.1fs incl. compile)", run, type(self.trainer.policy).__name__, self.trainer.spec.name,
                 self.trainer.config.num_members, self.trainer.chunk_size, self.trainer.num_params,
                 len(self.devices), ", ".join(str(d) for d in self.devices), time.perf_counter() - t0)
        self._request()

    def _build(self, description: Any) -> None:
        import jax

        from jes import host_step
        from jes.generation import ChunkResults, resolve_devices
        from jes.host_rollout import HostEnvError
        from jes.threefry import UnrolledJit

        devices = resolve_devices(self.devices_arg)
        trainer = protocol.build_run(description, devices=devices[:1], allow=self.allow)
        self.devices = devices
        host_step.close_programs(getattr(self, "programs", None))  # the last run's host env instances (Gymnasium)
        self.programs = host_step.programs(trainer)  # jitted, or a host env's (Gymnasium) host rollouts
        self.evaluate = self.programs.chunks
        self.apply = UnrolledJit(lambda s, *r: trainer.apply_chunk_results(s, ChunkResults(*r)),
                                 compiler_options=trainer.step_compiler_options)  # the step's: they can change bits
        # Compile now, while the link heartbeats, so no assignment waits on a compiler. The warm-up
        # places state, chunk ids and results exactly as _set_state/_work do: another placement
        # (sharding) is another program, and the first assignment would compile again.
        self.trainer = trainer
        self._set_state(trainer.init_state(0), "")
        for i, device in enumerate(devices):
            try:  # a host env steps its episodes here: chunk 0 of the first generation, as a run's first assignment
                jax.block_until_ready(self.evaluate(self.device_states[i], jax.device_put(np.zeros(1, np.int32),
                                                                                          device),
                                                    np.bool_(False), np.bool_(True)))
            except HostEnvError as err:
                raise EnvFailedError(f"HostEnvError: {err} (in the chunk this worker evaluates to warm up, before "
                                     f"any assignment)") from err
        n, size, obs = trainer.num_chunks, trainer.chunk_size, trainer.spec.obs_shape
        zeros = (np.zeros((n, size), np.float32), np.zeros(n, np.int32), np.zeros((n, *obs), np.float32),
                 np.zeros((n, *obs), np.float32))
        jax.block_until_ready(self._apply(self.state, zeros))
        self.state, self.device_states, self.generation, self.state_hash = None, [], -1, ""

    def _set_state(self, state: Any, state_hash: str) -> None:
        import jax

        # One placement everywhere (committed to one device each), whatever produced the state.
        self.device_states = [jax.device_put(state, d) for d in self.devices]
        self.state = self.device_states[0]
        self.generation = int(state.generation)
        self.state_hash = state_hash

    def _apply(self, state: Any, results: tuple) -> Any:
        """The state after a generation's per-chunk ``results`` (numpy), on the first device."""
        import jax

        new_state, _ = self.apply(state, *(jax.device_put(r, self.devices[0]) for r in results))
        return new_state

    def compile_counts(self) -> dict:
        """Programs compiled so far for chunk evaluation and for the update (1 each when placement is stable)."""
        return {"evaluate": self.evaluate._cache_size(), "apply": self.apply._cache_size()}

    def _snapshot(self, message: dict) -> None:
        if field(message, "run", str) != self.run or self.trainer is None:
            return
        state = protocol.unpack_state(self.trainer, message.get("state"))
        expected = field(message, "hash", str)
        actual = protocol.state_hash(state)
        if actual != expected:
            raise ProtocolError(f"snapshot hash {actual} differs from the master's {expected}")
        self._set_state(state, actual)
        log.info("received state snapshot of generation %d", self.generation)

    def _work(self, message: dict) -> None:
        import jax

        aid = field(message, "aid", int)
        self.last_aid = max(self.last_aid, aid)
        if field(message, "run", str) != self.run or self.trainer is None:
            self._request(abandon=aid)
            return
        generation, expected = field(message, "gen", int), field(message, "hash", str)
        start, stop = field(message, "start", int), field(message, "stop", int)
        centre = field(message, "centre", bool)  # the chunks' centre slots live (a generation evaluating the centre)
        if not 0 <= start < stop <= self.trainer.num_chunks:
            raise ProtocolError(f"chunk range [{start}, {stop}) outside the population")
        self.link.idle = False
        self.current_aid = aid
        if (generation, expected) != (self.generation, self.state_hash):
            update = message.get("update")
            if isinstance(update, dict) and (update.get("gen"), update.get("hash")) == (self.generation, self.state_hash):
                n, size, obs = self.trainer.num_chunks, self.trainer.chunk_size, self.trainer.spec.obs_shape
                results = (
                    protocol.unpack_array(update.get("fitness"), "float32", (n, size)),
                    protocol.unpack_array(update.get("env_steps"), "int32", (n,)),
                    protocol.unpack_array(update.get("obs_sum"), "float32", (n, *obs)),
                    protocol.unpack_array(update.get("obs_sumsq"), "float32", (n, *obs)),
                )
                state = self._apply(self.state, results)
                state_hash = protocol.state_hash(state)
                if state_hash == expected:
                    self._set_state(state, state_hash)
                else:
                    # Same results, another state: this process computes other bits than the master. Its results
                    # cannot be trusted either; the master distrusts it (and says so) when told.
                    log.warning("my state after generation %d differs from the master's (hash %s vs %s): this "
                                "worker computes other bits than the master; telling it", generation - 1, state_hash,
                                expected)
                    self.link.send({"type": "diverged", "name": self.name, "run": self.run, "gen": generation,
                                    "hash": expected, "mine": state_hash})
            if (generation, expected) != (self.generation, self.state_hash):
                self.generation, self.state_hash = -1, ""  # unknown: the master answers with a snapshot
                self._request(abandon=aid)
                return
        now = time.monotonic()
        if now - self._last_assign_log > 5.0:
            log.info("assigned chunks %d..%d of generation %d", start, stop - 1, generation)
            self._last_assign_log = now
        t0 = time.perf_counter()
        outs = []
        flags = np.bool_(centre), np.bool_(True)
        for i, chunk in enumerate(range(start, stop)):
            device = self.devices[i % len(self.devices)]
            ids = jax.device_put(np.array([chunk], np.int32), device)
            outs.append(self.evaluate(self.device_states[i % len(self.devices)], ids, *flags))
        fitness, env_steps, obs_sum, obs_sumsq, centre_returns, centre_steps = (
            np.concatenate([np.asarray(o[j]) for o in outs]) for j in range(6))
        if not centre:  # idle slots: none travel
            centre_returns, centre_steps = centre_returns[:, :0], centre_steps[:, :0]
        seconds = time.perf_counter() - t0
        self.members_done += (stop - start) * self.trainer.chunk_size
        self.current_aid = None
        self._idle_since = time.monotonic()  # silence counts from the result, not from before the evaluation
        self.link.idle = True
        self.link.send({
            "type": "result", "name": self.name, "run": self.run, "gen": generation, "hash": expected,
            "aid": aid, "last_aid": self.last_aid, "start": start, "stop": stop, "seconds": seconds,
            "fitness": protocol.pack_array(fitness), "env_steps": protocol.pack_array(env_steps),
            "obs_sum": protocol.pack_array(obs_sum), "obs_sumsq": protocol.pack_array(obs_sumsq),
            "centre_returns": protocol.pack_array(centre_returns), "centre_steps": protocol.pack_array(centre_steps),
        })


def _interrupt_handler(worker: Worker) -> Callable[[int, Any], None]:
    """Ctrl-C / SIGTERM: flag the worker (never lost), then raise KeyboardInterrupt (prompt, but Python drops it
    when it lands in a weakref callback or ``__del__``).

    While the worker builds a run it leaves at once instead (:func:`_leave_while_building`): XLA's compiler polls
    for signals, so a KeyboardInterrupt raised there abandons a compile whose threads then crash the interpreter's
    exit (a segmentation fault, status 139, after the worker had said goodbye)."""
    def handler(signum, frame):
        if worker._interrupted.is_set():  # a second Ctrl-C / SIGTERM while handing back: leave at once, quietly
            os._exit(128 + signum)
        worker.interrupt()
        if worker.building:
            _leave_while_building(worker)
        raise KeyboardInterrupt
    return handler


def _leave_while_building(worker: Worker) -> None:
    """Say goodbye (the worker holds no range yet), flush the link and the logs, and end the process without the
    interpreter's exit, status 0 as any other Ctrl-C of a worker; nothing of a half-built run needs tearing down."""
    try:
        log.info("worker %s interrupted while building its run; disconnecting", worker.name)
        worker.link.send({"type": "bye", "name": worker.name, "aid": None})
        worker.link.stop()
        log.info("worker %s disconnected", worker.name)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(0)


def _exit_with(pid: int, worker: Worker, grace: float = 10.0) -> None:
    """End the worker when process ``pid``, its parent, ends (``jes train --workers`` / ``num_workers``: a master
    killed by SIGTERM or SIGKILL would otherwise leave its local workers reconnecting forever)."""
    def watch():
        while os.getppid() == pid:
            time.sleep(0.5)
        log.warning("worker %s: its master process %d ended; exiting", worker.name, pid)
        worker.interrupt()
        time.sleep(grace)  # serve() returns at its next message or request; a compiled chunk may still be running
        os._exit(0)
    threading.Thread(target=watch, name="jes-worker-parent", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """Console entry point of ``jes-worker``."""
    parser = argparse.ArgumentParser(
        prog="jes-worker",
        description="Evaluate population chunks for a jes master (jes.train(..., master=':5555') or "
                    "`jes train --listen`). The secret comes from --secret-file or the JES_SECRET variable.",
    )
    parser.add_argument("--master", required=True, help="host:port of the master, e.g. trainhost:5555")
    parser.add_argument("--secret-file", help="file holding the shared secret (default: $JES_SECRET)")
    parser.add_argument("--name", help="name shown in the master's log (default: hostname-pid)")
    parser.add_argument("--devices", help="local devices to use: a count (e.g. 2) or ids (e.g. 0,1); default: the first")
    parser.add_argument("--cores", help="pin this process to these CPU cores, e.g. 0 or 0-3 (Linux)")
    parser.add_argument("--master-timeout", type=float, default=30.0,
                        help="reconnect after this many seconds without a word from the master (default 30)")
    parser.add_argument("--give-up-after", type=float, default=None, metavar="SECONDS",
                        help="exit once no master has answered for this many seconds while idle (e.g. a batch "
                             "job's worker after its run ended): status 0 if a master had answered, "
                             f"{NO_MASTER_EXIT} if none ever did, {REFUSED_EXIT} if its run was one this worker could "
                             "not build; default: wait for a master for ever. Give more than the master's longest "
                             "pause outside its generations (its first compile, a checkpoint, a slow callback)")
    parser.add_argument("--allow-module", action="append", default=[], metavar="MODULE",
                        help="also build classes and functions defined in this module of your own (e.g. "
                             "mypkg.policies; repeatable). Always allowed: jes's registry (its policies and "
                             "strategies, flax.linen layers, activations, gymnax envs); anything else a master "
                             "names is refused")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import this module of your own first (repeatable), e.g. one that registers your "
                             "Gymnasium env id with gymnasium.register, so that 'gymnasium:<your id>' runs here")
    parser.add_argument("--curve-server-key", metavar="KEY",
                        help="the public key of a master started with its own CURVE key pair (the NAME.public "
                             "file of `jes keys NAME`, or its 40 characters); without it, the key the shared "
                             "secret gives (every connection is CURVE-encrypted either way)")
    parser.add_argument("--log-level", default="INFO", type=str.upper,
                        choices=("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL"),
                        help="DEBUG, INFO, WARNING, ERROR or CRITICAL (default INFO)")
    parser.add_argument("--exit-with", type=int, default=None, metavar="PID",
                        help="exit when process PID, this worker's parent, ends (local workers of jes train "
                             "--workers / num_workers are started with it)")
    args = parser.parse_args(argv)
    if not args.master_timeout > 0:  # NaN too
        parser.error(f"--master-timeout must be a positive number of seconds, got {args.master_timeout}")
    if args.give_up_after is not None and not args.give_up_after > 0:
        parser.error(f"--give-up-after must be a positive number of seconds, got {args.give_up_after}")
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if args.cores:
            cores = parse_cores(args.cores)
            available = os.sched_getaffinity(0)
            if not cores <= available:
                raise ValueError(f"--cores {args.cores}: this process may run on cores {sorted(available)}, not on "
                                 f"{sorted(cores - available)}")
            # Before the XLA CPU client exists: it sizes its thread pools from the schedulable CPUs.
            os.sched_setaffinity(0, cores)
            for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
                os.environ.setdefault(var, str(len(cores)))
            log.info("pinned to cores %s", sorted(cores))
        secret = protocol.load_secret(None, args.secret_file)
        devices: Any = None
        if args.devices:
            import jax

            if "," in args.devices or not args.devices.isdigit() or args.devices == "0":
                ids = [int(x) for x in args.devices.split(",")]
                by_id = {d.id: d for d in jax.local_devices()}
                missing = [i for i in ids if i not in by_id]
                if missing:
                    raise ValueError(f"--devices names device ids {missing}; this host has {sorted(by_id)}")
                devices = [by_id[i] for i in ids]
            else:  # accepted, it refused every run the master sent, and stayed in the fleet
                devices, local = int(args.devices), jax.local_devices()
                if devices > len(local):
                    cpu = all(d.platform == "cpu" for d in local) and (
                        f" (JAX shows one CPU device unless asked for more: start the worker with "
                        f"XLA_FLAGS=--xla_force_host_platform_device_count={devices} for {devices}, one per core; the "
                        f"results' bits are the same)")
                    raise ValueError(f"--devices {devices}: this host has {len(local)} local device(s) "
                                     f"({', '.join(str(d) for d in local)}); pass at most {len(local)}{cpu or ''}")
        if args.allow_module:
            describe.current_directory_importable()  # the operator's modules import from where they run jes-worker
        describe.import_modules(args.imports)
        worker = Worker(args.master, secret, name=args.name, devices=devices, master_timeout=args.master_timeout,
                        allow_modules=args.allow_module, curve_server_key=args.curve_server_key,
                        give_up_after=args.give_up_after)
    except (ValueError, OSError) as err:
        print(f"jes-worker: error: {err}", file=sys.stderr)
        return 2
    handler = _interrupt_handler(worker)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    if args.exit_with is not None:
        _exit_with(args.exit_with, worker)
    worker.serve()
    return DISTRUSTED_EXIT if worker.distrusted is not None else worker.give_up_status


if __name__ == "__main__":
    sys.exit(main())
