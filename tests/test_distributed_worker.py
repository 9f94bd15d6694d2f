"""jes.distributed.worker without a master: its handlers driven directly, its link on a real socket; and real worker
processes interrupted while they build a run for a real master."""
import logging
import math
import queue
import sys
import time

import jax
import msgpack
import numpy as np
import pytest
import zmq

import jes
from jes.distributed import protocol, transport
from jes.distributed.worker import Worker, _Link

SECRET = b"test-secret-0123456789abcdef"
CONFIG = jes.ESConfig(num_members=16, chunk_size=4, eval_episodes=2, noise_std=0.1)


def wire(message):
    """What the message looks like after msgpack (as a worker receives it)."""
    return msgpack.unpackb(msgpack.packb(message, use_bin_type=True), raw=False)


@pytest.fixture(scope="module")
def trainer():
    return jes.Trainer(jes.MLPPolicy(hidden_sizes=(3,)), "CartPole-v1", "adam", CONFIG)


@pytest.fixture()
def worker():
    """A Worker whose link thread never starts: what it would send is collected in ``worker.sent``."""
    w = Worker("127.0.0.1:9", SECRET, name="unit")
    w.sent = []
    w.link.send = w.sent.append
    w.request_interval = 0.0
    yield w
    w.link._pipe_out.close(0)
    w.link._pipe_in.close(0)


def test_a_fresh_worker_compiles_each_program_once(trainer, worker):
    description = wire(protocol.describe_run(trainer, "CartPole-v1", "adam"))
    worker._handle({"type": "setup", "run": "r", "description": description, "heartbeat_interval": 1.0})
    assert worker.run == "r", worker.sent
    state = trainer.init_state(3)
    digest = protocol.state_hash(state)
    worker._handle(wire({"type": "snapshot", "run": "r", "gen": 0, "hash": digest, "state": protocol.pack_state(state)}))
    n = trainer.num_chunks
    worker._handle({"type": "work", "run": "r", "gen": 0, "hash": digest, "aid": 1, "start": 0, "stop": n,
                    "centre": False, "update": None})
    result = worker.sent[-1]
    assert result["type"] == "result" and (result["start"], result["stop"]) == (0, n)
    assert protocol.unpack_array(wire(result)["centre_returns"]).shape == (n, 0)  # idle slots: none travel
    arrays = [protocol.unpack_array(wire(result)[k]) for k in ("fitness", "env_steps", "obs_sum", "obs_sumsq")]
    new_state, _ = jax.jit(trainer.apply_chunk_results)(state, jes.ChunkResults(*arrays))  # as the master does
    new_digest = protocol.state_hash(new_state)
    update = {"gen": 0, "hash": digest, **{k: protocol.pack_array(a) for k, a in
                                            zip(("fitness", "env_steps", "obs_sum", "obs_sumsq"), arrays)}}
    worker._handle(wire({"type": "work", "run": "r", "gen": 1, "hash": new_digest, "aid": 2, "start": 1, "stop": 3,
                         "centre": True, "update": update}))
    result = wire(worker.sent[-1])
    assert result["type"] == "result" and worker.state_hash == new_digest  # advanced by the update
    # a generation evaluating the centre: chunks 1 and 2 ran centre episodes S..3S-1 live, as the step's do
    slots = trainer.centre_slots
    returns = protocol.unpack_array(result["centre_returns"], "float32", (2, slots))
    steps = protocol.unpack_array(result["centre_steps"], "int32", (2, slots))
    episodes = np.arange(slots, 3 * slots).reshape(2, slots)
    assert ((steps > 0) == (episodes < CONFIG.eval_episodes)).all() and (returns[steps == 0] == 0).all()
    # Warm-up, snapshot, first range, update and second range (its centre slots live: the same program): one
    # program each (issue 11: it was two); the evaluation once per device the worker runs on (a placement is part
    # of a program: 2 when an earlier test of this process asked JAX for two CPU devices, as tests/test_cli.py's CLI
    # runs do).
    assert worker.compile_counts() == {"evaluate": len(worker.devices), "apply": 1}


def test_a_malformed_or_refused_description_never_kills_the_worker(trainer, worker, tmp_path):
    good = wire(protocol.describe_run(trainer, "CartPole-v1", "adam"))
    target = tmp_path / "pwned"
    popen = {"class": "subprocess:Popen", "fields": {"args": {"__seq__": ["touch", str(target)], "tuple": False}}}
    for i, description in enumerate((
        dict(good, env_params={"class": "jes.config:ESConfig", "fields": {}}),  # not an EnvParams (issue 11)
        dict(good, env_params=popen),
        dict(good, policy=None),
        "garbage",
        None,
    )):
        worker._handle({"type": "setup", "run": f"bad{i}", "description": description, "heartbeat_interval": 1.0})
        refused = [m for m in worker.sent if m["type"] == "refused"]
        assert refused and refused[-1]["run"] == f"bad{i}", worker.sent
        assert worker.sent[-1]["type"] == "request" and worker.run is None
    assert "refused: RefusedError" in [m for m in worker.sent if m.get("run") == "bad1"][0]["reason"]
    worker._handle({"type": "setup", "run": "bad4", "description": good, "heartbeat_interval": 1.0})  # asked again
    assert [m["type"] for m in worker.sent[-2:]] == ["refused", "request"]  # the same answer, nothing rebuilt
    assert worker.run is None
    for message in ({"type": "work", "run": "x", "gen": "no", "aid": 1}, {"type": "snapshot"}, {"type": "nope"},
                    {"type": "work", "run": None, "gen": 0, "hash": "", "aid": 3, "start": 5, "stop": 1}):
        worker._handle(message)
        assert worker.sent[-1]["type"] == "request"
    assert not target.exists()


def test_a_range_the_worker_fails_on_is_handed_back_as_abandoned(trainer, worker):
    """A worker whose env raised asked for work without saying it abandoned the range: the master never benched it
    and re-sent the same range to it for ever (the run hung)."""
    worker._handle({"type": "setup", "run": "r", "description": wire(protocol.describe_run(trainer, "CartPole-v1",
                                                                                            "adam")),
                    "heartbeat_interval": 1.0})
    state = trainer.init_state(3)
    digest = protocol.state_hash(state)
    worker._handle(wire({"type": "snapshot", "run": "r", "gen": 0, "hash": digest, "state": protocol.pack_state(state)}))

    def env_raises(*args):
        raise RuntimeError("the simulator crashed")

    worker.evaluate = env_raises
    worker._handle({"type": "work", "run": "r", "gen": 0, "hash": digest, "aid": 7, "start": 0, "stop": 1,
                    "centre": False, "update": None})
    assert worker.sent[-1]["type"] == "request" and worker.sent[-1]["abandon"] == 7, worker.sent[-1]
    worker._handle({"type": "nope"})  # a message it rejects abandons nothing
    assert worker.sent[-1]["type"] == "request" and worker.sent[-1]["abandon"] is None


# ------------------------------------------------------------------ the link on a real socket
class FakeMaster:
    """A ROUTER on 127.0.0.1 that speaks the session protocol by hand."""

    def __init__(self, curve_secret_key: str | None = None):
        self.context = zmq.Context()  # its own: a context has one ZAP handler
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        # The master's end of the transport, as a real master has it
        transport.secure_server(self.socket, SECRET, curve_secret_key and curve_secret_key.encode())
        self.gatekeeper = transport.Gatekeeper(self.context, SECRET)
        self.port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self.identity = None
        self.session = None

    def receive(self, kind: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.socket.poll(100):
                frames = self.socket.recv_multipart()
                message = protocol.decode(frames[1:], SECRET, protocol.MAX_TO_MASTER_BYTES)
                self.identity = frames[0]
                if message["type"] == kind:
                    return message
        raise AssertionError(f"no {kind!r} message within {timeout}s")

    def send(self, frames):
        self.socket.send_multipart([self.identity, *frames])

    def open_session(self) -> None:
        hello = self.receive("hello")
        self.session = protocol.Session(SECRET, protocol.new_nonce())
        self.send(protocol.encode({"type": "welcome", "nonce": hello["nonce"], "sid": self.session.sid}, SECRET))

    def close(self):
        self.socket.close(0)
        if self.gatekeeper.is_alive():
            self.gatekeeper.stop()
            self.context.term()


def next_message(link: _Link, timeout: float = 5.0):
    try:
        return link.inbox.get(timeout=timeout)
    except queue.Empty:
        return None


def test_link_rejects_a_replayed_work_message_and_a_replayed_welcome():
    master = FakeMaster()
    link = _Link(f"tcp://127.0.0.1:{master.port}", SECRET, "unit", heartbeat_interval=0.2, master_timeout=60)
    link.start()
    try:
        master.open_session()
        assert next_message(link)["type"] == "session"
        work = master.session.seal({"type": "work", "run": "r", "gen": 0, "hash": "h", "aid": 7, "start": 0,
                                    "stop": 1, "centre": False, "update": None})
        master.send(work)
        received = next_message(link)
        assert received["type"] == "work" and received["aid"] == 7
        master.send(work)  # captured on the wire, sent again
        master.send(protocol.encode({"type": "welcome", "nonce": "0" * 32, "sid": "attacker"}, SECRET))
        master.send(master.session.seal({"type": "wait"}))
        assert next_message(link)["type"] == "wait"  # the replay and the stray welcome were dropped
        assert link.replayed == 1 and link.session.sid == master.session.sid
    finally:
        link.stop()
        master.close()


def test_link_heartbeats_while_busy_and_pongs_keep_it_from_reconnecting():
    """A build longer than master_timeout must not make the worker reconnect (issue 11)."""
    master = FakeMaster()
    link = _Link(f"tcp://127.0.0.1:{master.port}", SECRET, "unit", heartbeat_interval=0.1, master_timeout=1.0)
    link.start()
    try:
        master.open_session()
        assert next_message(link)["type"] == "session"
        identity = master.identity
        link.idle = False  # the main thread builds a run
        deadline = time.monotonic() + 3.0  # three master_timeouts
        while time.monotonic() < deadline:
            heartbeat = master.receive("heartbeat")
            master.send(master.session.seal({"type": "pong"}))
            assert master.identity == identity
        link.idle = True  # built: the worker asks for work on the same connection and session
        link.send({"type": "request", "name": "unit"})
        request = master.receive("request")
        assert master.identity == identity and request["sid"] == master.session.sid
        assert heartbeat["sid"] == master.session.sid
    finally:
        link.stop()
        master.close()


def test_a_master_gone_after_a_session_is_not_called_a_wrong_secret(caplog):
    """A run's master that ended (or stopped) was reported, after the first reconnect, as "not started yet, a wrong
    secret, or a wrong --curve-server-key?", which it cannot be: it had answered."""
    import logging

    master = FakeMaster()
    link = _Link(f"tcp://127.0.0.1:{master.port}", SECRET, "unit", heartbeat_interval=0.1, master_timeout=0.5)
    link.start()
    try:
        with caplog.at_level(logging.WARNING, logger="jes.distributed"):
            master.open_session()
            assert next_message(link)["type"] == "session"
            master.close()  # the run ended: nothing answers any more
            deadline = time.monotonic() + 30.0
            while time.monotonic() < deadline and "has not answered" not in caplog.text:
                time.sleep(0.1)
        assert "has not answered" in caplog.text and "its run ended" in caplog.text, caplog.text
        assert "wrong secret" not in caplog.text, caplog.text
    finally:
        link.stop()


@pytest.mark.parametrize("master_kind", ["another secret", "an older plaintext master"])
def test_a_failed_handshake_is_explained_at_once(caplog, master_kind):
    """With CURVE on every connection a wrong secret ends in the handshake, where the master hears nothing: the
    worker would only have said, after master_timeout, "no answer ... (not started yet, a wrong secret, ...)".
    It says at once why the handshake failed."""
    import logging

    if master_kind == "another secret":
        master = FakeMaster()  # the transport of SECRET; the link below holds another secret
        secret, expected = b"another-secret-0123456789", "this worker's shared secret is not the master's"
    else:
        master = FakeMaster()
        master.socket.close(0)
        master.socket = master.context.socket(zmq.ROUTER)  # ZeroMQ without CURVE, as jes masters were
        master.socket.setsockopt(zmq.LINGER, 0)
        master.port = master.socket.bind_to_random_port("tcp://127.0.0.1")
        secret, expected = SECRET, "before CURVE on every connection"  # "ended" or "no CURVE": a race
    link = _Link(f"tcp://127.0.0.1:{master.port}", secret, "unit", heartbeat_interval=0.1, master_timeout=600)
    link.start()
    try:
        with caplog.at_level(logging.WARNING, logger="jes.distributed"):
            deadline = time.monotonic() + 60.0
            while time.monotonic() < deadline and "handshake with master" not in caplog.text:
                time.sleep(0.05)
        assert f"the handshake with master tcp://127.0.0.1:{master.port} failed" in caplog.text, caplog.text
        assert expected in caplog.text and link.session is None, caplog.text
        assert master.socket.poll(0) == 0  # nothing of the worker's reached the master
    finally:
        link.stop()
        master.close()


def test_an_interrupt_python_dropped_still_stops_the_worker():
    """SIGTERM/Ctrl-C raise KeyboardInterrupt, which Python prints and drops when it lands in a weakref callback or
    ``__del__`` (seen in CI: the worker then served a gone master forever). The handler also flags the worker,
    and serve() returns on the flag, saying goodbye like an interrupt does."""
    import threading

    w = Worker("127.0.0.1:9", SECRET, name="unit")  # no master there: the worker keeps asking
    w.request_interval = 0.05
    sent = []
    w.link.start = lambda: None
    w.link.stop = lambda: None
    w.link.send = sent.append
    thread = threading.Thread(target=w.serve, daemon=True)
    try:
        thread.start()
        time.sleep(0.3)
        assert thread.is_alive()
        w.interrupt()  # what the signal handler does before its KeyboardInterrupt (here: dropped)
        thread.join(timeout=30)
        assert not thread.is_alive(), "serve() did not return after interrupt()"
        assert sent[-1]["type"] == "bye" and sent[0]["type"] == "request"
    finally:
        w.link._pipe_out.close(0)
        w.link._pipe_in.close(0)



# A real `jes-worker` process that dies with the test process (PR_SET_PDEATHSIG, set in the worker itself), without
# the compilation cache: its build really traces and compiles.
WORKER_PROCESS = [sys.executable, "-c", "import ctypes, os, runpy, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGKILL); "
                  "os.getppid() == 1 and sys.exit(1); runpy.run_module('jes.distributed.worker', run_name='__main__')"]


@pytest.mark.hard_timeout(600)
def test_ctrl_c_while_the_worker_builds_its_run_exits_cleanly(tmp_path):
    """Ctrl-C reaching a `jes-worker` while it built (traced, compiled) a run: the KeyboardInterrupt left JAX's
    tracing or XLA's compiler (which polls for signals) half-way, and the worker, after its goodbye, crashed in the
    interpreter's exit (segmentation fault, status 139) or died of the signal, in some of the tries. It now says
    goodbye and exits 0, as any other Ctrl-C of a worker. A real master on 127.0.0.1 serves the run; the interrupts
    land at several points after it sent the run (where exactly depends on the machine's load, so the exit status of
    each is asserted, never a time)."""
    import logging
    import os
    import signal
    import socket
    import subprocess

    from jes.distributed.master import Master

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = "gymnasium:CartPole-v1"  # a host env, as in the report (a gymnax env's build compiles the same way)
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(3,)), env, "adam", CONFIG)
    messages = []

    class Recorder(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    logger, recorder = logging.getLogger("jes.distributed.master"), Recorder()
    level = logger.level
    logger.addHandler(recorder)
    logger.setLevel(logging.INFO)
    statuses, procs = {}, []
    try:
        with Master(trainer, f"127.0.0.1:{port}", secret=SECRET, env=env, optimizer="adam",
                    heartbeat_interval=0.2, worker_timeout=5.0, status_interval=0.0) as master:
            state = trainer.init_state(0)
            for i, delay in enumerate((0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0)):
                name = f"build{i}"
                with open(tmp_path / f"{name}.log", "wb") as out:
                    proc = subprocess.Popen([*WORKER_PROCESS, "--master", f"127.0.0.1:{port}", "--name", name],
                                            env=dict(os.environ, JES_SECRET=SECRET.decode(), PYTHONFAULTHANDLER="1"),
                                            stdout=out, stderr=subprocess.STDOUT)
                procs.append(proc)
                while not any(m.startswith(f"worker {name}: sent run ") for m in messages) and proc.poll() is None:
                    master.wait_for_workers(state, 99, 0.05)
                until = time.monotonic() + delay
                while time.monotonic() < until:
                    master.wait_for_workers(state, 99, 0.05)
                proc.send_signal(signal.SIGINT)
                while proc.poll() is None:  # the master keeps serving: it receives the goodbye
                    master.wait_for_workers(state, 99, 0.05)
                statuses[name] = proc.returncode
        logs = {name: (tmp_path / f"{name}.log").read_text(errors="replace") for name in statuses}
        assert all(status == 0 for status in statuses.values()), (statuses, logs)
        assert not any("Fatal Python error" in text for text in logs.values()), logs
        assert all("disconnected" in text for text in logs.values()), logs
        assert any(m.startswith("worker build0 ") and "left" in m for m in messages), messages
    finally:
        logger.removeHandler(recorder)
        logger.setLevel(level)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=20)


@pytest.mark.parametrize("interval", [math.inf, 1e300, math.nan, -1.0, 0.0])
def test_a_heartbeat_interval_that_would_stop_or_silence_the_worker_is_refused_or_capped(trainer, worker, interval):
    """A setup with heartbeat_interval inf or 1e300 made the serve loop's wait overflow (OverflowError: the worker
    process ended); NaN turned its heartbeats off (no comparison with NaN is true)."""
    import threading

    description = wire(protocol.describe_run(trainer, "CartPole-v1", "adam"))
    before = worker.link.heartbeat_interval
    worker._handle({"type": "setup", "run": "r", "description": description, "heartbeat_interval": interval})
    assert math.isfinite(worker.request_interval) and worker.request_interval < threading.TIMEOUT_MAX
    assert 0 < worker.link.heartbeat_interval <= 3600.0
    if math.isfinite(interval) and interval > 0:  # huge: capped, and the run is built
        assert worker.link.heartbeat_interval == 3600.0 and worker.run == "r"
    else:  # dropped: nothing built, the interval kept
        assert worker.link.heartbeat_interval == before and worker.run is None


@pytest.mark.parametrize("where, expected", [("127.0.0.1:PORT", "connection refused: nothing listens on that port"),
                                             ("nosuchhost.invalid:5555", "cannot resolve host 'nosuchhost.invalid'")])
def test_an_unreachable_master_is_named_at_once(caplog, where, expected):
    """Defect (new-user tester): a worker pointed at a typo'd host, or a port where nothing listens, said nothing for
    30 s and then listed causes including "a wrong secret" (which is reported at once anyway)."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        where = where.replace("PORT", str(probe.getsockname()[1]))
    link = _Link(f"tcp://{where}", SECRET, "unit", heartbeat_interval=0.1, master_timeout=600)
    with caplog.at_level(logging.WARNING, logger="jes.distributed"):
        link.start()
        try:
            deadline = time.monotonic() + 60.0
            while time.monotonic() < deadline and expected not in caplog.text:
                time.sleep(0.05)
        finally:
            link.stop()
    assert f"cannot reach master tcp://{where}: {expected}" in caplog.text, caplog.text
    assert "wrong secret" not in caplog.text


def test_a_master_that_went_away_is_not_called_never_started(caplog):
    """Defect (new-user tester): when the master's run ended under a connected worker, the worker logged "nothing
    listens on that port (the master is not started yet, or a wrong host or port)", a wrong diagnosis of a port it
    had just been connected to. It says the master that was there has gone, and that it waits for the next."""
    master = FakeMaster()
    link = _Link(f"tcp://127.0.0.1:{master.port}", SECRET, "unit", heartbeat_interval=0.1, master_timeout=600)
    with caplog.at_level(logging.WARNING, logger="jes.distributed"):
        link.start()
        try:
            master.receive("hello")      # connected: the master heard the worker
            master.close()               # its run ended: nothing listens on that port any more
            deadline = time.monotonic() + 60.0
            while time.monotonic() < deadline and "cannot reach master" not in caplog.text:
                time.sleep(0.05)
        finally:
            link.stop()
    assert "the master that was there has gone (its run ended or it stopped)" in caplog.text, caplog.text
    assert "not started yet" not in caplog.text


def test_failed_handshakes_back_off_exponentially(monkeypatch):
    """Defect (new-user tester): a worker with a wrong secret reconnected about 5 times a second, for ever. It backs
    off now: 1, 2, 4 ... seconds between attempts, at most 30."""
    from jes.distributed.worker import handshake_backoff

    assert [handshake_backoff(n) for n in (1, 2, 3, 4, 5, 6, 7, 50)] == [1, 2, 4, 8, 16, 30, 30, 30]
    failed_at = []
    seen = transport.handshake_failure

    def recording(frames):
        kind = seen(frames)
        if kind is not None:
            failed_at.append(time.monotonic())
        return kind

    monkeypatch.setattr(transport, "handshake_failure", recording)
    master = FakeMaster()  # the transport of SECRET; the link holds another secret
    link = _Link(f"tcp://127.0.0.1:{master.port}", b"another-secret-0123456789", "unit", heartbeat_interval=0.1,
                 master_timeout=600)
    link.start()
    try:
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline and len(failed_at) < 3:
            time.sleep(0.05)
    finally:
        link.stop()
        master.close()
    assert len(failed_at) >= 3, failed_at
    # Lower bounds only (a loaded machine makes the gaps longer, never shorter): no reconnect before its back-off
    assert failed_at[1] - failed_at[0] >= 0.9 and failed_at[2] - failed_at[1] >= 1.9, failed_at


def test_a_local_worker_the_master_distrusted_is_not_replaced(monkeypatch):
    """jes train --workers N restarted a local worker that exited because the master distrusted it (exit status 3):
    the replacement computed the same other bits, was audited, distrusted and exited again, up to the restart
    limit. Any other exit is still replaced."""
    import subprocess
    import sys

    from jes.distributed.local import LocalWorkers
    from jes.distributed.worker import DISTRUSTED_EXIT

    codes = iter([DISTRUSTED_EXIT, 1])
    spawned = []

    def spawn(self, index):
        code = next(codes, None)
        spawned.append(code)
        script = f"import sys; sys.exit({code})" if code is not None else "import time; time.sleep(60)"
        return subprocess.Popen([sys.executable, "-c", script])

    monkeypatch.setattr(LocalWorkers, "_spawn", spawn)
    workers = LocalWorkers("127.0.0.1:1", "x" * 32, 2)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(spawned) < 3:
            time.sleep(0.1)
        time.sleep(1.5)  # three more turns of the watcher: a replacement of the distrusted one would be spawned now
        assert spawned == [DISTRUSTED_EXIT, 1, None], spawned  # the exit-1 worker replaced, the distrusted one not
        assert workers.processes[0] is None and workers.restarts == 1
    finally:
        workers.close()


def test_give_up_after_ends_a_worker_no_master_answers_with_its_own_status(tmp_path):
    """A batch job's worker (a Slurm array task) pointed at a master that never answers waited for ever; with
    --give-up-after it exits with status 4 and says why (here: nothing listens on that port)."""
    import os
    import socket
    import subprocess

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    try:
        done = subprocess.run([*WORKER_PROCESS, "--master", f"127.0.0.1:{port}", "--give-up-after", "1"],
                              env=dict(os.environ, JES_SECRET=SECRET.decode()), capture_output=True, text=True,
                              timeout=180)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"jes-worker --give-up-after 1 still ran after 180 s:\n{e.stdout}\n{e.stderr}")
    assert done.returncode == 4, (done.returncode, done.stderr)
    assert "no master answered at tcp://127.0.0.1" in done.stderr and "nothing listens" in done.stderr, done.stderr


class AnsweringMaster(FakeMaster):
    """A FakeMaster that, in a thread, welcomes, answers each request with ``wait`` (after ``first``, if given, to the
    first) and each heartbeat with a pong: a live master with nothing to hand out, until :meth:`close`."""

    def __init__(self, first: dict | None = None):
        import threading

        super().__init__()
        self.first, self.stopping = first, threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stopping.is_set():
            if not self.socket.poll(50):
                continue
            frames = self.socket.recv_multipart()
            message = protocol.decode(frames[1:], SECRET, protocol.MAX_TO_MASTER_BYTES)
            self.identity = frames[0]
            if message["type"] == "hello":
                self.session = protocol.Session(SECRET, protocol.new_nonce())
                self.send(protocol.encode({"type": "welcome", "nonce": message["nonce"], "sid": self.session.sid},
                                          SECRET))
            elif message["type"] == "request":
                answer, self.first = self.first or {"type": "wait"}, None
                self.send(self.session.seal(answer))
            elif message["type"] == "heartbeat":
                self.send(self.session.seal({"type": "pong"}))

    def close(self):
        self.stopping.set()
        self.thread.join(timeout=30)
        super().close()


def test_give_up_after_ends_a_worker_whose_master_went_never_one_whose_master_answers():
    """A worker whose master answered and then went (its run ended) stops serving after give_up_after seconds of
    silence (status 0: nothing went wrong; 5 when the run was one it could not build); one whose master answers its
    requests with 'wait' does not stop, even with give_up_after below its request interval; and without the option
    a worker whose master went still waits."""
    import threading

    from jes.distributed.worker import NO_MASTER_EXIT, REFUSED_EXIT

    def serve(worker):
        thread = threading.Thread(target=worker.serve, daemon=True)
        thread.start()
        return thread

    outcomes = {}
    for case, give_up_after, first in (("went", 1.0, None), ("refused", 1.0, {"type": "setup", "run": "r",
                                       "description": "not a run", "heartbeat_interval": 1.0}),
                                       ("stays", 0.5, None), ("no option", None, None)):
        master = AnsweringMaster(first)
        worker = Worker(f"127.0.0.1:{master.port}", SECRET, name="unit", give_up_after=give_up_after)
        thread = serve(worker)
        try:
            deadline = time.monotonic() + 60
            while not worker.link.ever_heard and time.monotonic() < deadline:
                time.sleep(0.05)
            if case == "stays":
                thread.join(timeout=8)  # a live master, answering every request: it must not give up meanwhile
            else:
                while first is not None and worker.refused_run is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                master.close()  # the run ended
                thread.join(timeout=60 if give_up_after else 3)
            outcomes[case] = (thread.is_alive(), worker.gave_up, worker.give_up_status)
        finally:
            worker.interrupt()
            thread.join(timeout=30)
            master.close()
    alive, why, status = outcomes["went"]
    assert not alive and status == 0 and "its run ended" in why, outcomes
    alive, why, status = outcomes["refused"]
    assert not alive and status == REFUSED_EXIT == 5 and "could not build" in why, outcomes
    assert outcomes["stays"] == (True, None, 0), outcomes
    assert outcomes["no option"] == (True, None, 0), outcomes
    assert NO_MASTER_EXIT == 4


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_give_up_after_refuses_a_time_that_is_not_positive(value, capsys):
    from jes.distributed.worker import main

    with pytest.raises(SystemExit) as exited:
        main(["--master", "127.0.0.1:9", "--give-up-after", value])
    assert exited.value.code == 2
    assert "--give-up-after must be a positive number of seconds" in capsys.readouterr().err
