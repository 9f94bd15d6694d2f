"""Distributed jes end to end: a real master, real `jes-worker` processes, real ZeroMQ sockets on 127.0.0.1.

The worker processes are shared by the module (starting JAX costs seconds); each
test starts its own master on the same port, so every test after the first also
exercises workers reconnecting to a restarted master.

Every test has a hard timeout (tests/conftest.py) and asserts behaviour (bit-identical
parameters, a worker connected and was assigned work, a range went back to the queue),
never wall time or how the work happened to be shared out: these machines are loaded.
"""
import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import warnings

import gymnax
import jax
import msgpack
import numpy as np
import optax
import pytest
import zmq

import jes
from jes.distributed import protocol, transport
from jes.distributed.master import Master
from jes.loop import run

SECRET = b"test-secret-0123456789abcdef"
KEY = 11
CONFIG = jes.ESConfig(num_members=32, chunk_size=4, num_generations=4, eval_episodes=4, noise_std=0.1)
FAST = dict(heartbeat_interval=0.2, worker_timeout=2.0, assign_timeout=5.0, min_deadline=1.0, status_interval=0.0)
READY_TIMEOUT = 120.0
# JES_TEST_CURVE=1 runs every test of this module with masters holding CURVE key pairs of their own (workers and
# raw clients given the public key); every connection is CURVE-encrypted either way.
CURVE = protocol.curve_keypair() if os.environ.get("JES_TEST_CURVE") else None  # (public, secret)
pytestmark = pytest.mark.hard_timeout(420)  # every test here; the slow ones start and compile worker processes
# `jes-worker` that dies with the test process (PR_SET_PDEATHSIG), so that a session ended by a hard
# timeout leaves no worker behind; set in the worker process itself (no preexec_fn in a threaded parent).
# It loads the programs it builds from the session's compilation cache (tests/conftest.py) when the
# master (this process) or an earlier worker compiled them already.
WORKER = [sys.executable, "-c", "import ctypes, os, runpy, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGKILL); "
          "os.getppid() == 1 and sys.exit(1); import jes; jes.enable_compilation_cache(); "
          "runpy.run_module('jes.distributed.worker', run_name='__main__')"]
# A worker that adds 1 to the first value of every float array it sends back (fitness, observation sums).
LYING_WORKER = [WORKER[0], "-c", "import numpy as np, jes.distributed.protocol as p\npack = p.pack_array\n"
                "def lie(a):\n    a = np.array(a)\n    if a.dtype == np.float32 and a.size:\n        a.flat[0] += 1.0\n"
                "    return pack(a)\np.pack_array = lie\n" + WORKER[2]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def trainer():
    return jes.Trainer(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam", CONFIG)


@pytest.fixture(scope="module")
def reference(trainer):
    """Parameters of the plain in-process run."""
    return run(trainer, trainer.init_state(KEY), key=KEY).flat_params


class WorkerPool:
    """`python -m jes.distributed.worker` processes connected to 127.0.0.1:port; all killed at the end."""

    def __init__(self, port: int, log_dir):
        self.port, self.log_dir = port, log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, secret: bytes = SECRET, args: tuple = (), env: dict | None = None,
              command: list | None = None) -> subprocess.Popen:
        if CURVE is not None and "--curve-server-key" not in args and name != "plain":
            args = (*args, "--curve-server-key", CURVE[0])
        env = dict(os.environ, JES_SECRET=secret.decode(), **(env or {}))
        with open(self.log_dir / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                [*(command or WORKER), "--master", f"127.0.0.1:{self.port}", "--name", name, *args],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )
        self.procs[name] = proc
        return proc

    def live(self) -> list[str]:
        return [name for name, p in self.procs.items() if p.poll() is None]

    def ensure(self, count: int) -> None:
        i = 0
        while len(self.live()) < count:
            while f"w{i}" in self.procs:
                i += 1
            self.start(f"w{i}")

    def kill(self, name: str, sig=signal.SIGKILL) -> None:
        self.procs[name].send_signal(sig)
        self.procs[name].wait(timeout=20)

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            proc.wait(timeout=20)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    workers = WorkerPool(free_port(), tmp_path_factory.mktemp("workers"))
    try:
        yield workers
    finally:
        workers.close()


def make_master(trainer, port, env="CartPole-v1", env_params=None, **options):
    return Master(trainer, f"127.0.0.1:{port}", secret=SECRET, env=env, env_params=env_params, optimizer="adam",
                  **{**FAST, **(dict(curve_secret_key=CURVE[1]) if CURVE else {}), **options})


def contributed(master) -> dict:
    return {w.name: w.members_done for w in master.workers.values()}


class _Recorder(logging.Handler):
    def __init__(self, on_message):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []
        self.on_message = on_message

    def emit(self, record):
        message = record.getMessage()
        self.messages.append(message)
        if self.on_message is not None:
            self.on_message(message)


@contextlib.contextmanager
def master_log(on_message=None):
    """Record the master's log (debug included); ``on_message(text)`` runs in the master's thread as it logs."""
    logger = logging.getLogger("jes.distributed.master")
    recorder, level = _Recorder(on_message), logger.level
    logger.addHandler(recorder)
    logger.setLevel(logging.DEBUG)
    try:
        yield recorder
    finally:
        logger.removeHandler(recorder)
        logger.setLevel(level)


def chunk_ranges(messages, pattern: str) -> list[tuple]:
    """The groups of each message matching ``pattern``, digits as ints."""
    return [tuple(int(g) if g.isdigit() else g for g in m.groups()) for m in map(re.compile(pattern).fullmatch, messages) if m]


# ------------------------------------------------------------- no workers
def test_master_alone_is_bit_identical_to_local_training(trainer, reference):
    with make_master(trainer, 0) as master:
        result = run(trainer, trainer.init_state(KEY), key=KEY, step_fn=master.step)
    np.testing.assert_array_equal(result.flat_params, reference)
    assert master.stats["master_chunks"] == CONFIG.num_generations * trainer.num_chunks
    assert np.isfinite(result.history["centre_return"][-1])


def test_train_with_master_keyword(trainer, reference):
    result = jes.train(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam", key=KEY, config=CONFIG,
                       master="127.0.0.1:0", secret=SECRET, log_dir=None, checkpoint_path=None, progress=False)
    np.testing.assert_array_equal(result.flat_params, reference)


def test_train_with_master_rejects_what_workers_cannot_rebuild():
    with pytest.raises(protocol.DescriptionError, match="optimizer by name"):
        jes.train(jes.MLPPolicy(hidden_sizes=(3,)), "CartPole-v1", optax.sgd(0.1), config=CONFIG,
                  master="127.0.0.1:0", secret=SECRET, log_dir=None, checkpoint_path=None, progress=False)
    with pytest.raises(protocol.DescriptionError, match="schedule"):
        jes.train(jes.MLPPolicy(hidden_sizes=(3,)), "CartPole-v1", "adam", config=CONFIG.replace(noise_std=lambda g: 0.1),
                  master="127.0.0.1:0", secret=SECRET, log_dir=None, checkpoint_path=None, progress=False)
    with pytest.raises(ValueError, match="shared secret"):
        os.environ.pop(protocol.SECRET_ENV, None)
        jes.train(jes.MLPPolicy(hidden_sizes=(3,)), "CartPole-v1", "adam", config=CONFIG,
                  master="127.0.0.1:0", log_dir=None, checkpoint_path=None, progress=False)



def test_a_master_refused_at_start_creates_no_file(tmp_path, monkeypatch):
    """Defect (new-user tester): a master refused at start-up (no secret, its port in use) left a TensorBoard event
    file in its log_dir, and the corrected rerun then warned of "an earlier run" there. It creates nothing now."""
    train = lambda log_dir, address, **kw: jes.train(
        jes.MLPPolicy(hidden_sizes=(3,)), "CartPole-v1", "adam", config=CONFIG, master=address,
        log_dir=str(log_dir), progress=False, **kw)
    monkeypatch.delenv(protocol.SECRET_ENV, raising=False)
    with pytest.raises(ValueError, match="shared secret"):
        train(tmp_path / "nosecret", "127.0.0.1:0")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError, match="cannot listen"):
            train(tmp_path / "taken", f"127.0.0.1:{taken.getsockname()[1]}", secret=SECRET)
    assert sorted(os.listdir(tmp_path)) == []

# ---------------------------------------------------------------- workers
@pytest.mark.slow
def test_one_then_three_workers_give_bit_identical_params(trainer, reference, pool):
    for count in (1, 3):
        pool.ensure(count)
        with make_master(trainer, pool.port) as master:
            state = trainer.init_state(KEY)
            assert master.wait_for_workers(state, count, READY_TIMEOUT) >= count, [pool.log(n) for n in pool.live()]
            result = run(trainer, state, key=KEY, step_fn=master.step)
        np.testing.assert_array_equal(result.flat_params, reference)
        assert master.stats["assigned_ranges"] > 0 and master.stats["bytes_sent"] > 0  # workers were given work


@pytest.mark.slow
def test_worker_killed_mid_run_loses_no_member(trainer, reference, pool):
    pool.ensure(2)
    for extra in pool.live()[2:]:  # exactly two workers, so both get part of every generation
        pool.kill(extra, signal.SIGINT)  # Ctrl-C: a clean goodbye
        assert pool.procs[extra].returncode == 0 and "disconnected" in pool.log(extra)
    victim = pool.live()[0]
    with make_master(trainer, pool.port) as master:
        state = trainer.init_state(KEY)
        assert master.wait_for_workers(state, 2, READY_TIMEOUT) >= 2

        def kill_after_second_generation(record):
            if record["generation"] == 2:
                pool.kill(victim)  # kill -9: it is idle in the master's books and gets the next range

        result = run(trainer, state, key=KEY, step_fn=master.step, callbacks=[kill_after_second_generation])
    np.testing.assert_array_equal(result.flat_params, reference)
    assert master.stats["reissued_chunks"] > 0  # the victim's range went back to the queue


# Pendulum never terminates early, so every episode runs all its steps: ~0.1s per chunk on a CPU, long
# enough to catch a worker in the middle of a range.
SLOW_ENV_PARAMS = gymnax.make("Pendulum-v1")[1].replace(max_steps_in_episode=200_000)
SLOW_CONFIG = jes.ESConfig(num_members=32, chunk_size=4, num_generations=3, eval_episodes=4, noise_std=0.1)


@pytest.mark.slow
def test_worker_killed_while_evaluating_loses_no_member(pool):
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(4,)), "Pendulum-v1", "adam", SLOW_CONFIG,
                          env_params=SLOW_ENV_PARAMS)
    reference = run(trainer, trainer.init_state(KEY), key=KEY).flat_params
    pool.ensure(2)
    for extra in pool.live()[2:]:  # exactly two workers, so both hold part of every generation
        pool.kill(extra, signal.SIGINT)
    victim, _ = pool.live()
    killed = {}

    def kill_while_evaluating(message):
        # The master logs a range's first heartbeat: the worker has it and is evaluating it right now.
        m = re.fullmatch(r"worker (\S+): evaluating chunks (\d+)\.\.(\d+) of generation (\d+)", message)
        if m and not killed and m[1] == victim:
            pool.kill(victim)  # kill -9, mid-range
            killed.update(generation=int(m[4]), at=len(recorder.messages))

    with master_log(kill_while_evaluating) as recorder, \
            make_master(trainer, pool.port, env="Pendulum-v1", env_params=SLOW_ENV_PARAMS,
                        heartbeat_interval=0.05) as master:
        state = trainer.init_state(KEY)
        assert master.wait_for_workers(state, 2, READY_TIMEOUT) >= 2, [pool.log(n) for n in pool.live()]
        result = run(trainer, state, key=KEY, step_fn=master.step)
    np.testing.assert_array_equal(result.flat_params, reference)
    assert killed, "the victim was never seen evaluating a range"
    assert pool.procs[victim].returncode == -signal.SIGKILL
    # What the victim held when it died went back to the queue (when it fell silent or at its deadline).
    after = recorder.messages[killed["at"]:]
    back = chunk_ranges(after, rf"worker ({re.escape(victim)}): chunks (\d+)\.\.(\d+) .*back to the queue")
    assert back, after
    assert master.stats["reissued_chunks"] > 0


@pytest.mark.slow
def test_worker_on_two_local_devices_is_bit_identical(trainer, reference, tmp_path):
    if jax.default_backend() != "cpu":
        pytest.skip("compares a worker on two forced host CPU devices with training on this process's CPU")
    workers = WorkerPool(free_port(), tmp_path)
    try:
        flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2".strip()
        workers.start("two", args=("--devices", "2"), env={"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"})
        # Long target ranges: once its speed is known, the worker gets several chunks per range.
        with master_log() as recorder, make_master(trainer, workers.port, target_range_seconds=1000.0) as master:
            state = trainer.init_state(KEY)
            assert master.wait_for_workers(state, 1, READY_TIMEOUT) >= 1, workers.log("two")
            result = run(trainer, state, key=KEY, step_fn=master.step)
        np.testing.assert_array_equal(result.flat_params, reference)
        assert "on 2 device(s) cpu:0, cpu:1" in workers.log("two"), workers.log("two")
        # The worker puts chunk i of a range on device i % 2: a range of several chunks used both devices.
        ranges = chunk_ranges(recorder.messages, r"worker (two): assigned chunks (\d+)\.\.(\d+) of generation (\d+)")
        assert any(last > first for _, first, last, _ in ranges), ranges
    finally:
        workers.close()


@pytest.mark.slow
def test_worker_joining_mid_run_and_master_restart_are_survived(trainer, reference, pool):
    pool.ensure(1)
    state = trainer.init_state(KEY)
    # First master: two generations, then it goes away.
    with make_master(trainer, pool.port) as master:
        assert master.wait_for_workers(state, 1, READY_TIMEOUT) >= 1
        half = run(trainer, state, key=KEY, step_fn=master.step, num_generations=2)
    # Second master on the same port: the old worker opens a new session by itself; a new one joins mid-run.
    with make_master(trainer, pool.port) as master:
        assert master.wait_for_workers(half.state, 1, READY_TIMEOUT) >= 1
        joined = []

        def join_after_third_generation(record):
            if record["generation"] == 3:
                joined.append(pool.start(f"late{len(pool.procs)}"))
                assert master.wait_for_workers(None, 2, READY_TIMEOUT) >= 2, pool.log(f"late{len(pool.procs) - 1}")

        result = run(trainer, half.state, key=KEY, history=half.history, step_fn=master.step,
                     callbacks=[join_after_third_generation])
    np.testing.assert_array_equal(result.flat_params, reference)
    assert joined and master.stats["snapshots"] >= 1  # the workers of the new master started from a snapshot


# ------------------------------------------------------ hostile network input
def raw_client(port: int, secret: bytes | None = SECRET, server_key: bytes | None = None) -> zmq.Socket:
    """A DEALER connected to the master: through its transport with ``secret``'s keys (a peer holding the
    secret), or (``secret=None``) a CURVE client with a key pair of its own to ``server_key``, or, without that
    either, ZeroMQ's plaintext."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if secret is not None:
        transport.secure_client(sock, secret, CURVE and CURVE[0].encode())
    elif server_key is not None:
        sock.curve_serverkey = server_key
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def test_wrong_secret_and_garbage_leave_the_master_serving(trainer, reference):
    with make_master(trainer, 0, max_message_bytes=64 * 1024) as master:
        port = master.port
        state = trainer.init_state(KEY)
        master.wait_for_workers(state, 0, 0)
        good = protocol.encode({"type": "request", "name": "x", "run": None, "gen": -1, "hash": "", "last_aid": 0}, SECRET)
        wrong = raw_client(port)
        wrong.send_multipart(protocol.encode({"type": "request", "name": "intruder", "run": None, "gen": -1,
                                              "hash": "", "last_aid": 0}, b"wrong-secret-0123456789"))
        garbage = raw_client(port)
        body = msgpack.packb({"type": "result"})
        for frames in (
            [b"\x00" * 7],                                                  # one frame
            [b"junk", b"more", b"frames"],                                   # three frames
            [good[0][:-5], good[1]],                                         # truncated body, MAC of the whole
            [good[0], good[1][:10]],                                         # truncated MAC
            protocol.encode({"no": "type"}, SECRET),                         # authenticated, no type
            [b"\xc1\xc1", protocol.encode({}, SECRET)[1]],                   # undecodable
            protocol.encode({"type": "request", "name": "y", "run": 5, "gen": "x", "hash": 1, "last_aid": 0}, SECRET),
            protocol.encode({"type": "shutdown"}, SECRET),
            [body, b"\x00" * 32],
            protocol.encode({"type": "hello", "name": "z", "nonce": "short"}, SECRET),       # bad nonce
            protocol.encode({"type": "hello", "name": "z"}, SECRET),                          # no nonce
        ):
            garbage.send_multipart(frames)
        oversized = raw_client(port)
        oversized.send_multipart(protocol.encode({"type": "heartbeat", "name": "big", "pad": b"\x00" * 200_000}, SECRET))
        time.sleep(0.3)
        master.wait_for_workers(None, 1, 0.5)
        # Authenticated but wrong results during a generation are dropped too.
        result = run(trainer, state, key=KEY, step_fn=master.step)
        assert wrong.poll(200) == 0  # nothing is ever sent to a peer that failed authentication
    np.testing.assert_array_equal(result.flat_params, reference)
    assert master.stats["dropped"] >= 11
    assert "intruder" not in contributed(master) and "big" not in contributed(master)
    for sock in (wrong, garbage, oversized):
        sock.close(0)


def test_worker_with_wrong_secret_is_refused(trainer, tmp_path):
    port = free_port()
    workers = WorkerPool(port, tmp_path)
    try:
        workers.start("wrong", secret=b"not-the-secret-0123456789")
        with make_master(trainer, port) as master:
            deadline = time.monotonic() + READY_TIMEOUT
            while "the handshake with master" not in workers.log("wrong") and time.monotonic() < deadline:
                master.wait_for_workers(trainer.init_state(KEY), 1, 0.5)
            master.wait_for_workers(trainer.init_state(KEY), 1, 1.0)
            # Refused in the handshake (it encrypts to the server key of its secret; with the master's own server
            # key, its client key is not the secret's), so not one of its messages reached the master; the worker
            # says why.
            assert "this worker's shared secret is not the master's" in workers.log("wrong"), workers.log("wrong")
            assert master.stats["dropped"] == 0 and not master.workers
    finally:
        workers.close()


def test_a_peer_without_the_secret_never_gets_a_frame_to_the_master(trainer, reference):
    """A peer that reaches the port without the secret got every message it sent queued for the master (a
    multipart message of any number of 16 MiB frames held whole in memory) until the master dropped it as
    unauthenticated. Now its connection ends in the CURVE handshake: plaintext peers (another mechanism), peers
    with a key pair of their own (refused by the master's ZAP handler, even knowing the master's public key),
    peers with the keys of another secret. Its messages never reach the master, and the run goes on."""
    with master_log() as recorder, make_master(trainer, 0) as master:
        state = trainer.init_state(KEY)
        master.wait_for_workers(state, 0, 0)
        server_public = transport.server_keys(SECRET, CURVE and CURVE[1].encode())[0]
        outsiders = [raw_client(master.port, secret=None),                        # plaintext
                     raw_client(master.port, secret=None, server_key=server_public),  # a key pair of its own
                     raw_client(master.port, secret=b"another-secret-0123456789")]    # another secret's keys
        hello = {"type": "hello", "name": "outsider", "nonce": protocol.new_nonce()}
        for sock in outsiders:  # 64 MiB in one message, then a hello MAC'd with the secret (stolen, say)
            with contextlib.suppress(zmq.Again):
                sock.send_multipart([b"\x00" * 2**20] * 64, flags=zmq.NOBLOCK)
                sock.send_multipart(protocol.encode(hello, SECRET), flags=zmq.NOBLOCK)
        # The key pair of its own is refused by the master's ZAP handler (and logged); the plaintext peer and the
        # one with another secret's keys fail the CURVE handshake before it is asked.
        deadline = time.monotonic() + READY_TIMEOUT
        while master.gatekeeper.refused == 0 and time.monotonic() < deadline:
            master.wait_for_workers(state, 1, 0.2)
        master.wait_for_workers(state, 1, 1.0)
        assert master.gatekeeper.admitted == 0 and master.stats["dropped"] == 0 and not master.workers, master.stats
        assert all(sock.poll(0) == 0 for sock in outsiders)
        assert any(m.startswith("refused 1 connection(s) in the CURVE handshake, before any of their messages, the "
                                "last from 127.0.0.1: a key pair that is not the shared secret's")
                   for m in recorder.messages), recorder.messages
        insider = raw_client(master.port)  # the secret's keys: through the handshake, then the protocol
        insider.send_multipart(protocol.encode(hello, SECRET))
        deadline = time.monotonic() + READY_TIMEOUT
        while not insider.poll(0) and time.monotonic() < deadline:
            master.wait_for_workers(state, 1, 0.2)  # the master answers while it waits
        assert insider.poll(0), "no welcome for a peer holding the secret"
        assert protocol.decode(insider.recv_multipart(), SECRET, protocol.MAX_TO_WORKER_BYTES)["type"] == "welcome"
        result = run(trainer, state, key=KEY, step_fn=master.step)
    np.testing.assert_array_equal(result.flat_params, reference)
    for sock in (*outsiders, insider):
        sock.close(0)


def test_worker_cli_errors_are_clear():
    env = {k: v for k, v in os.environ.items() if k != protocol.SECRET_ENV}
    out = subprocess.run([sys.executable, "-m", "jes.distributed.worker", "--master", "127.0.0.1:5"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "shared secret" in out.stderr
    out = subprocess.run([sys.executable, "-m", "jes.distributed.worker", "--master", "nohostport"],
                         env=dict(env, JES_SECRET=SECRET.decode()), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "host:port" in out.stderr
    beyond = max(os.sched_getaffinity(0)) + 1
    for flags, message in ((["--master-timeout", "0"], "--master-timeout must be a positive number of seconds, got 0.0"),
                           (["--log-level", "LOUD"], "argument --log-level: invalid choice: 'LOUD'"),
                           (["--cores", str(beyond)], f"--cores {beyond}: this process may run on cores"),
                           (["--devices", "5"], "--devices 5: this host has 1 local device(s) (cpu:0); pass at "
                                                "most 1")):  # it was taken, then refused every run, staying in the fleet
        one_device = dict(env, JES_SECRET=SECRET.decode(), JAX_PLATFORMS="cpu", XLA_FLAGS="", JAX_NUM_CPU_DEVICES="1")
        out = subprocess.run([sys.executable, "-m", "jes.distributed.worker", "--master", "127.0.0.1:5", *flags],
                             env=one_device, capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def _children(pid: int) -> list[int]:
    """Live child processes of ``pid`` (from /proc)."""
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                children.append(int(entry))
    return children


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_local_workers_end_with_their_master_however_it_ends(how, tmp_path):
    """``jes train --workers 2`` killed by SIGTERM (timeout, Slurm, docker stop) stops its workers as Ctrl-C does,
    with a checkpoint; killed by SIGKILL, its workers notice their parent is gone and exit (they used to reconnect to
    the dead port forever, 350 MB each)."""
    ckpt, log = tmp_path / "c.ckpt", tmp_path / "master.log"
    with open(log, "w") as stderr:
        master = subprocess.Popen([sys.executable, "-m", "jes.cli", "train", "--env", "Pendulum-v1", "--policy", "mlp",
                                   "--hidden", "8", "--population", "64", "--chunk-size", "16", "--generations",
                                   "100000", "--eval-every", "1000", "--log-dir", "none", "--checkpoint", str(ckpt),
                                   "--checkpoint-every", "1", "--no-progress", "--workers", "2"], stderr=stderr)
    workers = []
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while len(workers) < 2 or not ckpt.exists():  # the workers started, and a generation is done
            assert time.monotonic() < deadline and master.poll() is None, f"the run never started: {log.read_text()}"
            workers = _children(master.pid)
            time.sleep(0.5)
        master.send_signal(how)
        master.wait(timeout=120)
        if how == signal.SIGTERM:
            err = log.read_text()
            assert master.returncode == 128 + signal.SIGTERM and "terminated (checkpoint " in err \
                and "; continue with --resume " in err, err
        deadline = time.monotonic() + 60
        while any(_alive(w) for w in workers):
            assert time.monotonic() < deadline, f"local workers {workers} outlived their master ({how.name})"
            time.sleep(0.5)
    finally:
        for pid in [master.pid, *workers]:  # the workers too when the master is gone (and they are not)
            if pid == master.pid or _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------- sessions, replays
def pump(master, seconds: float = 0.3) -> None:
    """Let the (single-threaded) master serve its socket for a while."""
    master.wait_for_workers(None, 99, seconds)


def receive(sock, master, kind: str, session=None) -> dict:
    for _ in range(100):
        pump(master, 0.05)
        if sock.poll(50):
            message = protocol.decode(sock.recv_multipart(), SECRET, protocol.MAX_TO_WORKER_BYTES)
            if session is not None and message["type"] not in ("welcome", "rehello"):
                session.accept(message)
            if message["type"] == kind:
                return message
    raise AssertionError(f"no {kind!r} from the master")


def open_session(sock, master, name: str) -> protocol.Session:
    nonce = protocol.new_nonce()
    sock.send_multipart(protocol.encode({"type": "hello", "name": name, "nonce": nonce}, SECRET))
    welcome = receive(sock, master, "welcome")
    assert welcome["nonce"] == nonce
    return protocol.Session(SECRET, welcome["sid"])


def test_replayed_request_result_and_bye_are_rejected(trainer):
    with make_master(trainer, 0) as master:
        master.wait_for_workers(trainer.init_state(KEY), 0, 0)
        sock = raw_client(master.port)
        session = open_session(sock, master, "fake")
        request = session.seal({"type": "request", "name": "fake", "run": None, "gen": -1, "hash": "", "last_aid": 0})
        sock.send_multipart(request)
        assert receive(sock, master, "setup", session)["run"] == master._run  # accepted in session
        result = session.seal({"type": "result", "run": master._run, "gen": 0, "hash": "x", "aid": 1, "start": 0,
                               "stop": 1, "seconds": 0.1})
        sock.send_multipart(result)
        pump(master)
        assert master.stats["replayed"] == 0 and master.stats["stale_results"] == 1
        for frames in (result, request):  # captured on the wire and sent again
            sock.send_multipart(frames)
        pump(master)
        assert master.stats["replayed"] == 2 and master.stats["stale_results"] == 1
        other = raw_client(master.port)  # the same frames from another connection: no session there
        other.send_multipart(result)
        pump(master)
        assert [w.name for w in master.workers.values()] == ["fake"] and master.stats["stale_results"] == 1
        bye = session.seal({"type": "bye", "name": "fake", "aid": None})
        sock.send_multipart(bye)
        pump(master)
        assert not master.workers
        dropped = master.stats["dropped"]
        sock.send_multipart(bye)  # a replayed goodbye (or anything else) of the closed session
        sock.send_multipart(request)
        pump(master)
        assert not master.workers and master.stats["dropped"] == dropped + 2
        for s in (sock, other):
            s.close(0)


def test_a_real_worker_refuses_every_rce_route_creates_nothing_and_keeps_serving(tmp_path):
    from test_describe import rce_routes
    from test_distributed_worker import FakeMaster

    master = FakeMaster(curve_secret_key=CURVE and CURVE[1])
    workers = WorkerPool(master.port, tmp_path)
    target = tmp_path / "pwned"
    try:
        workers.start("target")
        master.open_session()
        for i, (route, description) in enumerate(rce_routes(target).items()):
            master.send(master.session.seal({"type": "setup", "run": f"evil{i}", "description": description,
                                             "heartbeat_interval": 0.5}))
            refused = master.receive("refused", timeout=READY_TIMEOUT)
            assert refused["run"] == f"evil{i}" and "RefusedError" in refused["reason"], (route, refused)
            assert not target.exists(), route
        assert workers.procs["target"].poll() is None, workers.log("target")  # still serving
        assert workers.log("target").count("cannot build run evil") == len(rce_routes(target))
    finally:
        workers.close()
        master.close()
    assert not target.exists()


@pytest.mark.slow
def test_master_logs_a_refusal_and_allow_module_admits_the_users_env(tmp_path):
    from envs_for_tests import Countdown

    config = jes.ESConfig(num_members=16, chunk_size=4, num_generations=2, eval_episodes=2, noise_std=0.1)
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(3,)), Countdown(), "adam", config)
    reference = run(trainer, trainer.init_state(KEY), key=KEY).flat_params
    workers = WorkerPool(free_port(), tmp_path)
    tests_dir = os.path.dirname(__file__)
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), tests_dir) if p)
    try:
        with master_log() as recorder, make_master(trainer, workers.port, env=Countdown()) as master:
            state = trainer.init_state(KEY)
            workers.start("strict", env={"PYTHONPATH": path})
            while not any("refused run" in m for m in recorder.messages):
                master.wait_for_workers(state, 1, 0.5)
            why = next(m for m in recorder.messages if "refused run" in m)
            assert "worker strict refused run" in why and "envs_for_tests:Countdown" in why and "allow" in why, why
            workers.start("trusting", args=("--allow-module", "envs_for_tests"), env={"PYTHONPATH": path})
            assert master.wait_for_workers(state, 1, READY_TIMEOUT) == 1, workers.log("trusting")
            result = run(trainer, state, key=KEY, step_fn=master.step)
        np.testing.assert_array_equal(result.flat_params, reference)
        assert master.stats["assigned_ranges"] > 0
        assert workers.procs["strict"].poll() is None  # the refusing worker is still serving
    finally:
        workers.close()


@pytest.mark.slow
def test_a_masters_own_curve_key_run_is_bit_identical_and_workers_without_its_public_key_cannot_join(
        trainer, reference, tmp_path):
    public, secret = protocol.curve_keypair()
    (tmp_path / "master.public").write_text(public + "\n")
    workers = WorkerPool(free_port(), tmp_path)
    try:
        workers.start("plain")
        workers.start("curve", args=("--curve-server-key", str(tmp_path / "master.public")))
        with make_master(trainer, workers.port, curve_secret_key=secret) as master:
            state = trainer.init_state(KEY)
            assert master.wait_for_workers(state, 1, READY_TIMEOUT) >= 1, workers.log("curve")
            result = run(trainer, state, key=KEY, step_fn=master.step)
            names = [w.name for w in master.workers.values()]
        np.testing.assert_array_equal(result.flat_params, reference)
        assert master.own_server_key and master.stats["assigned_ranges"] > 0
        assert names == ["curve"], names  # a worker expecting the secret's server key never gets past the handshake
    finally:
        workers.close()


@pytest.mark.slow
def test_audit_catches_a_worker_that_alters_fitness_and_the_run_stays_bit_identical(trainer, reference, tmp_path):
    workers = WorkerPool(free_port(), tmp_path)
    try:
        workers.start("honest")
        workers.start("liar", command=LYING_WORKER)
        with master_log() as recorder, make_master(trainer, workers.port, audit=1.0) as master:
            state = trainer.init_state(KEY)
            assert master.wait_for_workers(state, 2, READY_TIMEOUT) == 2, workers.log("liar")
            result = run(trainer, state, key=KEY, step_fn=master.step)
        np.testing.assert_array_equal(result.flat_params, reference)
        assert master.stats["audit_mismatches"] >= 1 and master.stats["distrusted_workers"] == 1
        assert any(m.startswith("worker liar returned results that differ") for m in recorder.messages)
        assert workers.procs["liar"].wait(timeout=60) == 3  # told, it stops (jes-worker's status for a distrust)
        assert workers.procs["honest"].poll() is None
    finally:
        workers.close()


def assert_two_workers_match_local(trainer, pool, env="CartPole-v1"):
    local = run(trainer, trainer.init_state(KEY), key=KEY)
    pool.ensure(2)
    optimizer = trainer.optimizer_name if trainer.strategy.uses_optimizer else None
    with Master(trainer, f"127.0.0.1:{pool.port}", secret=SECRET, env=env, optimizer=optimizer,
                **{**FAST, **(dict(curve_secret_key=CURVE[1]) if CURVE else {})}) as master:
        state = trainer.init_state(KEY)
        assert master.wait_for_workers(state, 2, READY_TIMEOUT) >= 2, [pool.log(n) for n in pool.live()]
        result = run(trainer, state, key=KEY, step_fn=master.step)
    np.testing.assert_array_equal(result.flat_params, local.flat_params)
    np.testing.assert_array_equal(result.history["noise_std"], local.history["noise_std"])
    np.testing.assert_array_equal(result.history["pop_mean"], local.history["pop_mean"])
    assert master.stats["assigned_ranges"] > 0


def assert_two_workers_match_local_by_bytes(trainer, pool, env):
    """A run through a master with two workers against the local run: the final parameters and every history column
    (wall times aside) compared by bytes; returns the local result and the master."""
    local = run(trainer, trainer.init_state(KEY), key=KEY)
    pool.ensure(2)
    with Master(trainer, f"127.0.0.1:{pool.port}", secret=SECRET, env=env, optimizer="adam",
                **{**FAST, **(dict(curve_secret_key=CURVE[1]) if CURVE else {})}) as master:
        state = trainer.init_state(KEY)
        assert master.wait_for_workers(state, 2, READY_TIMEOUT) >= 2, [pool.log(n) for n in pool.live()]
        result = run(trainer, state, key=KEY, step_fn=master.step)
    assert result.flat_params.tobytes() == local.flat_params.tobytes()
    for name in local.history:
        if name not in ("wall_time", "generation_time"):
            assert np.asarray(result.history[name]).tobytes() == np.asarray(local.history[name]).tobytes(), name
    return local, master


@pytest.mark.slow
@pytest.mark.parametrize("name", jes.strategies.names())
def test_every_strategy_with_two_workers_is_bit_identical(name, pool):
    """0 vs 2 workers for every strategy: the strategy travels in the run description and every host
    applies its update from chunk-ordered statistics."""
    config = CONFIG.replace(num_members=16, num_generations=3)
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", None, config, strategy=name)
    assert_two_workers_match_local(trainer, pool)


@pytest.mark.slow
@pytest.mark.parametrize("name, rank", [("openai_es", 2), ("ars", 2), ("openai_es", 4)])
def test_low_rank_runs_with_two_workers_are_bit_identical(name, rank, pool):
    """0 vs 2 workers with low-rank (EGGROLL) members: a worker's chunk runs the very program the master's does
    (rank 4: batched products, the local step compiled with XLA's default fusion emitters)."""
    config = CONFIG.replace(num_members=16, num_generations=3, perturbation="low_rank", perturbation_rank=rank)
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(8, 8)), "CartPole-v1", None, config, strategy=name)
    assert_two_workers_match_local(trainer, pool)


@pytest.mark.slow
@pytest.mark.parametrize("perturbation", ["full_rank", "low_rank"])
def test_a_67k_parameter_policy_with_two_workers_is_bit_identical(perturbation, pool):
    """An MLP 256x256: its update's sums are long enough that XLA's options change their bits (XLA:CPU's fusion
    emitters), so the master's and workers' programs must compile with the step's options (they did not: the
    master's update differed from the local step's in the last bit of 9,764 of the 67,073 parameters)."""
    config = CONFIG.replace(num_members=16, chunk_size=8, num_generations=3, eval_episodes=2, learning_rate=0.05,
                            perturbation=perturbation)
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(256, 256)), "Pendulum-v1", "adam", config)
    assert_two_workers_match_local(trainer, pool, env="Pendulum-v1")


@pytest.mark.slow
@pytest.mark.parametrize("policy, chunk_size, eval_every", [(jes.MLPPolicy(hidden_sizes=(5,)), 16, 1),
                                                             (jes.GRUPolicy(hidden=5, layers=1), 32, 2)])
def test_chunks_of_16_members_or_more_with_two_workers_are_bit_identical(policy, chunk_size, eval_every, pool):
    """A fleet tester's find: on Pendulum from 16 members a chunk, a master's run (workers or none) had other bits
    than the local step (the final parameters of a 150-generation run all different). A worker's chunk ran its
    members in a batch without the step's centre slots, and XLA:CPU's code for a rollout depends on its batch size;
    the master's centre return was a mean compiled into its episodes' program. Every history column compared."""
    config = CONFIG.replace(num_members=64, chunk_size=chunk_size, num_generations=3, eval_episodes=64,
                            eval_every=eval_every, max_episode_steps=100)
    trainer = jes.Trainer(policy, "Pendulum-v1", "adam", config)
    local, master = assert_two_workers_match_local_by_bytes(trainer, pool, "Pendulum-v1")
    assert np.isfinite(local.history["centre_return"]).sum() == (3 if eval_every == 1 else 2)
    assert master.stats["assigned_ranges"] > 0

@pytest.mark.slow
@pytest.mark.parametrize("env, policy, size, eval_every", [
    ("MountainCarContinuous-v0", jes.MLPPolicy(hidden_sizes=(5,)), dict(num_members=32, chunk_size=16), 1),
    ("MountainCarContinuous-v0", jes.MLPPolicy(hidden_sizes=(5,)), dict(num_members=32, chunk_size=16), 3),
    ("CartPole-v1", jes.MLPPolicy(hidden_sizes=(8,)), dict(num_members=256, chunk_size=128), 2),
])
def test_workers_run_their_chunks_centre_slots_and_the_centre_is_the_local_steps_bit_for_bit(
        env, policy, size, eval_every, pool):
    """A fleet tester's find: the master evaluated the centre in a program of its own, its episodes in one batch of
    ``eval_episodes``, while the step runs each in a chunk's batch beside the members (XLA:CPU's code for a rollout
    depends on the batch's size; compaction on which episodes share it): on MountainCarContinuous (float rewards of
    the actions) the centre return's last bits differed. Workers and the master now run each chunk's centre slots
    live and the master reduces them as the step does (before, both MountainCarContinuous cases differed: eval_every
    3 at a generation with members and at the last one, the centre alone). CartPole: chunks of 128 whose episodes
    end at different times (compaction with the centre's slots live; its integer returns hide a last-bit difference
    unless an action flips), eval_every 2 (the idle slots' extra compaction level on other generations). Every
    history column and the final parameters compared by bytes."""
    config = CONFIG.replace(**size, num_generations=4, eval_episodes=8, eval_every=eval_every, max_episode_steps=60)
    trainer = jes.Trainer(policy, env, "adam", config)
    local, master = assert_two_workers_match_local_by_bytes(trainer, pool, env)
    assert np.isfinite(local.history["centre_return"]).sum() == {1: 4, 2: 2, 3: 2}[eval_every]
    # a worker's first delivered range is audited against the master's own evaluation: none differed
    assert master.stats["assigned_ranges"] > 0
    assert master.stats["distrusted_workers"] == 0 and master.stats["bad_results"] == 0
    # the master's chunks (audits, its last centre alone), centre slots live or idle: one program
    assert master._programs.chunks._cache_size() == 1


@pytest.mark.slow
def test_a_low_rank_runs_bytes_per_generation_do_not_grow_with_the_policy(pool):
    """Keys, ranges and fitness on the wire: once a worker has the run (the first generation's snapshot), a
    low-rank generation's bytes are the same for 0.6k and 67k parameters, far below one parameter vector."""
    per_generation = {}
    for hidden in (8, 256):
        config = CONFIG.replace(num_members=16, num_generations=17, eval_episodes=2, eval_every=0,
                                perturbation="low_rank")
        trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(hidden, hidden)), "Pendulum-v1", "adam", config)
        pool.ensure(1)
        with Master(trainer, f"127.0.0.1:{pool.port}", secret=SECRET, env="Pendulum-v1", optimizer="adam",
                    **{**FAST, **(dict(curve_secret_key=CURVE[1]) if CURVE else {})}) as master:
            state = trainer.init_state(KEY)
            assert master.wait_for_workers(state, 1, READY_TIMEOUT) >= 1, [pool.log(n) for n in pool.live()]
            state, _ = master.step(state, False)
            for _ in range(5):  # a window of 3 generations in which no worker (the pool may hold several) got a snapshot
                sent, received, snapshots = (master.stats[k] for k in ("bytes_sent", "bytes_received", "snapshots"))
                for _ in range(3):
                    state, _ = master.step(state, False)
                if master.stats["snapshots"] == snapshots:
                    break
            assert master.stats["snapshots"] == snapshots, master.stats
            per_generation[trainer.num_params] = ((master.stats["bytes_sent"] - sent) / 3,
                                                  (master.stats["bytes_received"] - received) / 3)
    (small, small_bytes), (big, big_bytes) = sorted(per_generation.items())
    assert big > 60_000 and small < 1_000
    for s, b in zip(small_bytes, big_bytes):  # (heartbeats may add a message or two: not a fixed count)
        assert 0 < b < 1.5 * s + 2_000 and b < big * 4 / 10, per_generation


@pytest.mark.hard_timeout(600)
def test_local_workers_build_a_policy_of_the_users_own_module():
    """``num_workers=N`` starts workers of this Python for a run whose policy class is the user's own (from a module of
    theirs, not jes's registry): the workers allow that module and import it from where this process did, and
    evaluate chunks (they used to refuse the run, and the master waited 120 s, then ran alone, unwarned)."""
    from envs_for_tests import UsersPolicy

    kw = dict(num_members=16, chunk_size=4, num_generations=2, eval_episodes=2, log_dir=None, progress=False, key=KEY)
    alone = jes.train(UsersPolicy(), "CartPole-v1", "adam", **kw)
    with master_log() as recorder, warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # "... local worker(s) became ready ..." would fail here
        spread = jes.train(UsersPolicy(), "CartPole-v1", "adam", num_workers=2, **kw)
    assert not [m for m in recorder.messages if "refused" in m], recorder.messages
    assert [m for m in recorder.messages if re.match(r"worker local-\d: assigned chunks", m)], recorder.messages
    np.testing.assert_array_equal(alone.flat_params, spread.flat_params)
    np.testing.assert_array_equal(alone.history["pop_mean"], spread.history["pop_mean"])


@pytest.mark.hard_timeout(600)
def test_local_workers_join_a_master_with_a_curve_key_pair_of_its_own():
    """``master_options={"curve_secret_key": ...}`` with ``num_workers=N``: the local workers were started without the
    master's public key, failed the handshake, and the master ran alone after waiting for them (120 s, warned).
    They are given the public key now and evaluate chunks, with the bits of the run alone."""
    public, secret = protocol.curve_keypair()
    kw = dict(num_members=16, chunk_size=4, num_generations=2, eval_episodes=2, log_dir=None, progress=False, key=KEY)
    alone = jes.train(jes.MLPPolicy(hidden_sizes=(3,)), "CartPole-v1", "adam", **kw)
    with master_log() as recorder, warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # "... local worker(s) became ready ..." would fail here
        spread = jes.train(jes.MLPPolicy(hidden_sizes=(3,)), "CartPole-v1", "adam", num_workers=1,
                           master_options={"curve_secret_key": secret}, **kw)
    assert [m for m in recorder.messages if re.match(r"worker local-0: assigned chunks", m)], recorder.messages
    np.testing.assert_array_equal(alone.flat_params, spread.flat_params)


def test_a_malformed_master_address_leaves_no_thread_or_socket(trainer):
    """The address was checked after the context, the socket and the ZAP handler's thread existed: each refused
    Master left a thread and its file descriptors behind."""
    import threading

    before = sum(t.name == "jes-zap" for t in threading.enumerate())
    for address in ("no-port", "host:99999", ""):
        with pytest.raises(ValueError, match="master address"):
            Master(trainer, address, secret=SECRET, env="CartPole-v1", optimizer="adam", **FAST)
    assert sum(t.name == "jes-zap" for t in threading.enumerate()) == before


@pytest.mark.slow
@pytest.mark.hard_timeout(600)
def test_workers_computing_other_bits_are_distrusted_told_why_and_the_run_stays_bit_identical(tmp_path):
    """Defects 1 and 2 of a new-user tester: a worker started with XLA_FLAGS=--xla_cpu_enable_fast_math=true (on
    this CPU it computes other bits: its state after an update differs from the master's in most generations)
    only asked for snapshots while the master kept using its results, and one with JAX_ENABLE_X64=1 was
    distrusted without being told. Both are distrusted now, say why and stop; the run is bit-identical to one
    without workers (parameters and observation statistics, byte for byte)."""
    trainer = jes.Trainer(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam", CONFIG.replace(num_generations=8))
    assert trainer.config.normalize_observations
    local = run(trainer, trainer.init_state(KEY), key=KEY)
    flags = " ".join(filter(None, (os.environ.get("XLA_FLAGS"), "--xla_cpu_enable_fast_math=true")))
    workers = WorkerPool(free_port(), tmp_path)
    try:
        workers.start("fast", env={"XLA_FLAGS": flags})
        workers.start("x64", env={"JAX_ENABLE_X64": "1"})
        with master_log() as recorder, make_master(trainer, workers.port) as master:
            state = trainer.init_state(KEY)
            assert master.wait_for_workers(state, 2, READY_TIMEOUT) == 2, workers.log("fast") + workers.log("x64")
            result = run(trainer, state, key=KEY, step_fn=master.step)
        mine, theirs = protocol.state_leaves(result.state), protocol.state_leaves(local.state)  # params in "strategy"
        assert jax.tree.structure(mine) == jax.tree.structure(theirs) and {"obs_sum", "obs_sumsq"} <= set(mine)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(jax.tree.leaves(mine), jax.tree.leaves(theirs)))
        distrusted = [m for m in recorder.messages if "distrusted for the rest of the run" in m]
        assert any(m.startswith("worker fast computes other bits") and "XLA_FLAGS" in m for m in distrusted), \
            recorder.messages
        assert any(m.startswith("worker x64 sent a malformed result") for m in distrusted), recorder.messages
        assert workers.procs["fast"].wait(timeout=60) == 3 and workers.procs["x64"].wait(timeout=60) == 3
        assert "XLA_FLAGS" in workers.log("fast") and "Is JAX_ENABLE_X64" in workers.log("x64")
    finally:
        workers.close()


def test_a_master_and_a_worker_on_ipv6_loopback_are_bit_identical(trainer, reference, tmp_path):
    """A review: --listen "[::1]:0" failed ("No such device") and jes-worker --master [::1]:PORT said "connection
    refused" (neither socket took IPv6). Both do now, and the run is the in-process run's bit for bit."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
            port = s.getsockname()[1]
    except OSError as err:
        pytest.skip(f"no IPv6 loopback on this machine ({err})")
    curve = ("--curve-server-key", CURVE[0]) if CURVE else ()
    with open(tmp_path / "v6.log", "wb") as log:
        worker = subprocess.Popen([*WORKER, "--master", f"[::1]:{port}", "--name", "v6", *curve],
                                  env=dict(os.environ, JES_SECRET=SECRET.decode()), stdout=log, stderr=subprocess.STDOUT)
    try:
        with Master(trainer, f"[::1]:{port}", secret=SECRET, env="CartPole-v1", optimizer="adam",
                    **{**FAST, **(dict(curve_secret_key=CURVE[1]) if CURVE else {})}) as master:
            state = trainer.init_state(KEY)
            assert master.wait_for_workers(state, 1, READY_TIMEOUT) >= 1, (tmp_path / "v6.log").read_text()
            result = run(trainer, state, key=KEY, step_fn=master.step)
        np.testing.assert_array_equal(result.flat_params, reference)
        assert master.stats["assigned_ranges"] > 0
    finally:
        worker.kill()
        worker.wait(timeout=20)
