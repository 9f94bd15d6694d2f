"""The master against workers that hold the shared secret and lie, and against a fuzzer of its message handler.

A real master in this process, real lying `jes-worker` processes (tests/malicious_worker.py: the real
Worker with its results rewritten) on 127.0.0.1, one case each of: results for ranges never issued to
the worker, ``seconds = inf``, ``seconds = 1e300`` then heartbeats forever, NaN fitness, and two
colluding identities lying identically under ``audit=1.0``. Then correctly signed random and mutated
messages fed to the master's receive path (tests/master_fuzz.py) during a run.

In every case the run finishes and its final state is bit-identical, leaf by leaf and byte for byte, to
the honest single-process run with the same key and config. Hard timeouts; no wall-time assertion.
"""
import json
import os

import jax
import numpy as np
import pytest

from jes.distributed import protocol
from jes.loop import run
from master_fuzz import MasterFuzzer
from test_distributed import KEY, READY_TIMEOUT, SECRET, WORKER, WorkerPool, free_port, make_master, trainer  # noqa: F401

pytestmark = pytest.mark.hard_timeout(420)
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
LYING_WORKER = [WORKER[0], "-c", WORKER[2].replace("runpy.run_module('jes.distributed.worker', run_name='__main__')",
                                                   "import malicious_worker; sys.exit(malicious_worker.main())")]


@pytest.fixture(scope="module")
def honest(trainer):  # noqa: F811
    """The final state of the honest single-process run."""
    return run(trainer, trainer.init_state(KEY), key=KEY).state


@pytest.fixture(scope="module")
def liars(tmp_path_factory):
    """Two lying worker processes, ``a`` and ``b``; each reads its mode at every new session (set_modes)."""
    log_dir = tmp_path_factory.mktemp("liars")
    pool = WorkerPool(free_port(), log_dir)
    pool.modes = log_dir / "modes.json"
    set_modes(pool, {})
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), TESTS_DIR) if p)
    try:
        for name in ("a", "b"):
            pool.start(name, args=("--modes", str(pool.modes)), env={"PYTHONPATH": path}, command=LYING_WORKER)
        yield pool
    finally:
        pool.close()


def set_modes(pool, modes: dict) -> None:
    tmp = pool.modes.with_suffix(".tmp")
    tmp.write_text(json.dumps(modes))
    os.replace(tmp, pool.modes)


def assert_bit_identical(state, expected) -> None:
    ours, theirs = (jax.tree_util.tree_flatten_with_path(protocol.state_leaves(s))[0] for s in (state, expected))
    assert [p for p, _ in ours] == [p for p, _ in theirs]
    for (path, a), (_, b) in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape, jax.tree_util.keystr(path)
        assert a.tobytes() == b.tobytes(), f"state leaf {jax.tree_util.keystr(path)} differs from the honest run"


def run_against(trainer, pool, modes: dict, **options):  # noqa: F811
    """A whole run served to workers ``a`` and ``b`` in ``modes`` (default honest); the master and the result."""
    set_modes(pool, modes)
    with make_master(trainer, pool.port, **options) as master:
        state = trainer.init_state(KEY)
        assert master.wait_for_workers(state, 2, READY_TIMEOUT) == 2, [pool.log(n) for n in pool.procs]
        result = run(trainer, state, key=KEY, step_fn=master.step)
    assert pool.live() == ["a", "b"], [pool.log(n) for n in pool.procs]
    return master, result


def distrusted(master) -> list[str]:
    return sorted(w.name for w in master.workers.values() if w.distrusted)


@pytest.mark.slow
def test_results_for_ranges_never_issued_are_dropped(trainer, honest, liars):  # noqa: F811
    master, result = run_against(trainer, liars, {"a": "never_issued"})
    assert_bit_identical(result.state, honest)
    assert master.stats["stale_results"] > 0      # the forgeries under other assignment ids
    assert distrusted(master) == ["a"]            # a forgery under its own live id (another range)
    assert master.stats["handler_errors"] == 0


@pytest.mark.slow
def test_infinite_seconds_are_refused_and_the_master_survives(trainer, honest, liars):  # noqa: F811
    master, result = run_against(trainer, liars, {"a": "seconds_inf"})
    assert_bit_identical(result.state, honest)
    assert master.stats["bad_results"] >= 1 and distrusted(master) == ["a"]
    assert all(w.chunks_per_second is None or 0 < w.chunks_per_second < float("inf") for w in master.workers.values())


@pytest.mark.slow
def test_huge_seconds_then_heartbeats_cannot_hold_a_generation(trainer, honest, liars):  # noqa: F811
    master, result = run_against(trainer, liars, {"a": "seconds_huge"})
    assert_bit_identical(result.state, honest)
    assert master.stats["bad_results"] >= 1 and distrusted(master) == ["a"]


@pytest.mark.slow
def test_nan_fitness_of_a_worker_is_replaced_by_the_masters_own_evaluation(trainer, honest, liars):  # noqa: F811
    master, result = run_against(trainer, liars, {"a": "nan_fitness"})
    assert_bit_identical(result.state, honest)
    assert master.stats["verified_here"] >= 1 and distrusted(master) == ["a"]
    assert np.isfinite(result.history["pop_mean"]).all()


@pytest.mark.slow
def test_two_colluding_identities_cannot_outvote_the_master_audit(trainer, honest, liars):  # noqa: F811
    master, result = run_against(trainer, liars, {"a": "collude", "b": "collude"}, audit=1.0)
    assert_bit_identical(result.state, honest)
    assert distrusted(master) == ["a", "b"] and master.stats["audit_mismatches"] >= 1
    assert not any(w.verified for w in master.workers.values())


def test_fuzzed_signed_messages_never_raise_and_the_run_stays_bit_identical(trainer, honest):  # noqa: F811
    """A few hundred correctly signed random or mutated messages, fed to the receive path while the
    master runs (a few every time it polls its socket), under audit=1.0: the master verifies whatever a
    fuzzed identity delivered, so nothing it invented may survive."""
    with make_master(trainer, 0, audit=1.0) as master:
        fuzzer = MasterFuzzer(master, SECRET, seed=0, identities=4)
        poll = master._poll

        def poll_and_fuzz(timeout_ms):
            if fuzzer.sent < 100 * (master._generation + 2):  # about a hundred a generation
                fuzzer.feed(5)
            poll(timeout_ms)

        master._poll = poll_and_fuzz
        result = run(trainer, trainer.init_state(KEY), key=KEY, step_fn=master.step)
    assert_bit_identical(result.state, honest)
    assert fuzzer.sent >= 300, fuzzer.sent
    assert master.stats["handler_errors"] == 0, "a fuzzed message raised a raw exception in the master (see log)"
    assert master.stats["assigned_ranges"] > 0 and master.stats["dropped"] > 0  # it got deep and wide
