"""Distributed jes end to end: a real master, real `jes-worker` processes, real ZeroMQ sockets on 127.0.0.1.

The worker processes are shared by the module (starting JAX costs seconds); each
test starts its own master on the same port, so every test after the first also
exercises workers reconnecting to a restarted master.
"""
import os
import signal
import socket
import subprocess
import sys
import time

import msgpack
import numpy as np
import optax
import pytest
import zmq

import jes
from jes.distributed import protocol
from jes.distributed.master import Master
from jes.trainer import run

SECRET = b"test-secret-0123456789abcdef"
KEY = 11
CONFIG = jes.ESConfig(num_members=32, chunk_size=4, num_generations=4, eval_episodes=4, noise_std=0.1)
FAST = dict(heartbeat_interval=0.2, worker_timeout=2.0, assign_timeout=5.0, min_deadline=1.0, status_interval=0.0)
READY_TIMEOUT = 120.0


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

    def start(self, name: str, secret: bytes = SECRET) -> subprocess.Popen:
        env = dict(os.environ, JES_SECRET=secret.decode())
        log = open(self.log_dir / f"{name}.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "jes.distributed.worker", "--master", f"127.0.0.1:{self.port}", "--name", name],
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


def make_master(trainer, port, **options):
    return Master(trainer, f"127.0.0.1:{port}", secret=SECRET, env="CartPole-v1", optimizer="adam", **dict(FAST, **options))


def contributed(master) -> dict:
    return {w.name: w.members_done for w in master.workers.values()}


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
        done = contributed(master)
        assert sum(done.values()) > 0 and len([n for n in done.values() if n > 0]) >= count, done
        assert master.stats["bytes_sent"] > 0


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


@pytest.mark.slow
def test_worker_joining_mid_run_contributes_and_master_restart_is_survived(trainer, reference, pool):
    pool.ensure(1)
    state = trainer.init_state(KEY)
    # First master: two generations, then it goes away.
    with make_master(trainer, pool.port) as master:
        assert master.wait_for_workers(state, 1, READY_TIMEOUT) >= 1
        half = run(trainer, state, key=KEY, step_fn=master.step, num_generations=2)
    # Second master on the same port: the old worker reconnects by itself; a new one joins mid-run.
    with make_master(trainer, pool.port) as master:
        assert master.wait_for_workers(half.state, 1, READY_TIMEOUT) >= 1
        joined = []

        def join_after_third_generation(record):
            if record["generation"] == 3:
                joined.append(pool.start(f"late{len(pool.procs)}"))
                assert master.wait_for_workers(None, 2, READY_TIMEOUT) >= 2

        result = run(trainer, half.state, key=KEY, history=half.history, step_fn=master.step,
                     callbacks=[join_after_third_generation])
        late = [w for w in master.workers.values() if w.name.startswith("late")]
    np.testing.assert_array_equal(result.flat_params, reference)
    assert late and late[0].members_done > 0
    assert master.stats["snapshots"] >= 1  # the late worker started from a full snapshot


# ------------------------------------------------------ hostile network input
def raw_client(port: int) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
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
    assert master.stats["dropped"] >= 9
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
            while master.stats["dropped"] == 0 and time.monotonic() < deadline:
                master.wait_for_workers(trainer.init_state(KEY), 1, 0.5)
            assert master.stats["dropped"] > 0
            assert not master.workers
    finally:
        workers.close()


def test_worker_cli_errors_are_clear():
    env = {k: v for k, v in os.environ.items() if k != protocol.SECRET_ENV}
    out = subprocess.run([sys.executable, "-m", "jes.distributed.worker", "--master", "127.0.0.1:5"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "shared secret" in out.stderr
    out = subprocess.run([sys.executable, "-m", "jes.distributed.worker", "--master", "nohostport"],
                         env=dict(env, JES_SECRET=SECRET.decode()), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "host:port" in out.stderr
