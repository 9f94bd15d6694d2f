"""jes.distributed.master's bookkeeping, driven event by event with a fake clock (no worker processes).

The property (issue 12's hang): whatever the interleaving of assignments, lost messages, results,
heartbeats, deadlines, stale requests and workers that die, every chunk of the generation is at all
times stored, queued, or held by a live assignment with a deadline, and once the workers stop
answering the master finishes the generation by itself.
"""
import random

import time

import numpy as np
import pytest

import jes
from jes.distributed import protocol
from jes.distributed.master import Master, _Worker

SECRET = b"test-secret-0123456789abcdef"
CONFIG = jes.ESConfig(num_members=32, chunk_size=4, eval_episodes=2)


@pytest.fixture(scope="module")
def trainer():
    return jes.Trainer(jes.MLPPolicy(hidden_sizes=(3,)), "CartPole-v1", "adam", CONFIG)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class FakeWorker:
    """What a worker would do with the messages the master sends it; it may lose them or die."""

    def __init__(self, name: bytes):
        self.identity, self.inbox, self.last_aid, self.alive, self.busy = name, [], 0, True, None


def make_master(trainer, clock, **options):
    master = Master(trainer, "127.0.0.1:0", secret=SECRET, env="CartPole-v1", optimizer="adam",
                    heartbeat_interval=0.5, worker_timeout=3.0, assign_timeout=4.0, min_deadline=1.0, **options)
    master.clock = clock
    master._run = "run"
    master.evaluated_here = []

    def evaluate_here(chunk):  # the master's own evaluation, without compiling anything
        master.evaluated_here.append(chunk)
        master._store([chunk], *(np.zeros((1, *a.shape[1:]), a.dtype) for a in master._results))

    master._evaluate_here = evaluate_here
    master._evaluate_range = lambda start, stop: tuple(  # an audit by the master, likewise
        np.zeros((stop - start, *a.shape[1:]), a.dtype) for a in master._results)
    return master


def connect(master, fake: FakeWorker, clock):
    master.workers[fake.identity] = _Worker(fake.identity, fake.identity.decode(), clock.now,
                                            session=protocol.Session(SECRET, protocol.new_nonce()), nonce="n" * 16,
                                            run="run", setup_sent=True, generation=0, state_hash="h")
    master._send = lambda worker, message, fakes={}: None  # replaced below per test


def check_invariant(master):
    held = {c for a in master.assignments.values() if a.generation == master._generation for c in a.chunks}
    for chunk in range(master.trainer.num_chunks):
        assert master._have[chunk] or chunk in master._pending or chunk in held, (chunk, master.assignments)
    for aid, a in master.assignments.items():
        assert np.isfinite(a.deadline) and aid in master.workers[a.worker].aids


def result_message(trainer, aid, start, stop, gen=0, digest="h", slots=0):
    """A well-formed result; ``slots``: each chunk's centre slots (``trainer.centre_slots`` when the work asked for
    them live, else none)."""
    k, size, obs = stop - start, trainer.chunk_size, trainer.spec.obs_shape
    return {"type": "result", "run": "run", "gen": gen, "hash": digest, "aid": aid, "start": start, "stop": stop,
            "seconds": 0.01, "fitness": protocol.pack_array(np.zeros((k, size), np.float32)),
            "env_steps": protocol.pack_array(np.zeros(k, np.int32)),
            "obs_sum": protocol.pack_array(np.zeros((k, *obs), np.float32)),
            "obs_sumsq": protocol.pack_array(np.zeros((k, *obs), np.float32)),
            "centre_returns": protocol.pack_array(np.zeros((k, slots), np.float32)),
            "centre_steps": protocol.pack_array(np.zeros((k, slots), np.int32))}


def request_message(fake, abandon=None):
    return {"type": "request", "name": "x", "run": "run", "gen": 0, "hash": "h", "last_aid": fake.last_aid,
            "abandon": abandon}


@pytest.mark.parametrize("audit", [0.0, 0.5])
@pytest.mark.parametrize("seed", range(8))
def test_every_chunk_is_stored_queued_or_held_and_the_generation_always_finishes(trainer, seed, audit):
    rng = random.Random(seed)
    clock = Clock()
    master = make_master(trainer, clock, audit=audit)
    fakes = {name: FakeWorker(name) for name in (b"a", b"b", b"c")}
    try:
        for fake in fakes.values():
            connect(master, fake, clock)

        def send(worker, message):
            fake = fakes.get(worker.identity)
            if fake is not None and fake.alive and rng.random() > 0.1:  # 10% of messages are lost
                fake.inbox.append(message)

        master._send = send
        master._begin(None, 0, "h")
        for fake in fakes.values():
            master._handle(fake.identity, request_message(fake))
        for _ in range(300):
            check_invariant(master)
            if master._have.all() and not master._auditing():
                break
            fake = rng.choice(list(fakes.values()))
            if fake.alive and fake.identity not in master.workers:
                # The master dropped it (silent too long): it gets 'rehello' and opens a new session.
                fake.inbox, fake.last_aid, fake.busy = [], 0, None
                connect(master, fake, clock)
                master._send = send
            event = rng.random()
            clock.now += rng.uniform(0.0, 0.6)
            if not fake.alive:
                pass
            elif event < 0.03:
                fake.alive = False  # kill -9: silence from now on
            elif fake.busy is not None and event < 0.5:
                aid, start, stop = fake.busy
                fake.busy = None
                if rng.random() > 0.1:  # the result may be lost on the way
                    master._handle(fake.identity, result_message(trainer, aid, start, stop))
            elif fake.inbox and event < 0.8:
                message = fake.inbox.pop(0)
                if message["type"] == "work":
                    fake.last_aid = max(fake.last_aid, message["aid"])
                    if fake.busy is None and rng.random() > 0.1:
                        fake.busy = (message["aid"], message["start"], message["stop"])
                    else:  # it cannot take this one now: hands it back
                        master._handle(fake.identity, request_message(fake, abandon=message["aid"]))
            elif event < 0.9:
                if fake.busy is not None:
                    master._handle(fake.identity, {"type": "heartbeat", "name": "x"})
                else:  # idle: it asks again (a request may cross a work message in flight)
                    master._handle(fake.identity, request_message(fake))
            master._expire(clock.now)
            master._assign_idle()
            if master._pending and master._should_evaluate_here() and rng.random() < 0.3:
                master._evaluate_here(master._pending[0])
            elif not master._pending and master._audits and master._should_audit_here() and rng.random() < 0.3:
                master._audit_here(*master._audits.pop(0))
            check_invariant(master)
        # Every worker dies now: the master must finish alone, in bounded time.
        for fake in fakes.values():
            fake.alive = False
        for _ in range(10 * trainer.num_chunks + 100):
            if master._have.all() and not master._auditing():
                break
            clock.now += 0.5
            master._expire(clock.now)
            master._assign_idle()
            if master._pending and master._should_evaluate_here():
                master._evaluate_here(master._pending[0])
            elif not master._pending and master._audits and master._should_audit_here():
                master._audit_here(*master._audits.pop(0))
            check_invariant(master)
        assert master._have.all() and not master._auditing(), (master._pending, master.assignments, master._audits)
    finally:
        master.close()


def test_a_request_of_a_previous_master_session_cannot_release_fresh_ranges(trainer):
    """Issue 11: a worker's last_aid from an old master made the new one release and re-issue ranges."""
    clock = Clock()
    master = make_master(trainer, clock)
    try:
        fake = FakeWorker(b"a")
        connect(master, fake, clock)
        sent = []
        master._send = lambda worker, message: sent.append(message)
        master._begin(None, 0, "h")
        fake.last_aid = 0  # a new session starts at 0, whatever the old master's ids were
        master._handle(b"a", request_message(fake))
        work = [m for m in sent if m["type"] == "work"]
        assert len(work) == 1
        for _ in range(3):  # requests that crossed the work message: nothing is released or re-issued
            master._handle(b"a", request_message(fake))
        assert len([m for m in sent if m["type"] == "work"]) == 1 and master.stats["reissued_chunks"] == 0
    finally:
        master.close()


def test_a_range_past_its_deadline_is_requeued_once_even_when_its_worker_is_lost(trainer):
    clock = Clock()
    master = make_master(trainer, clock)
    try:
        slow, other = FakeWorker(b"slow"), FakeWorker(b"other")
        connect(master, slow, clock)
        connect(master, other, clock)
        master._send = lambda worker, message: None
        master._begin(None, 0, "h")
        master._pending = [2, 3]
        master._have[:] = True
        master._have[[2, 3]] = False
        master._handle(b"slow", request_message(slow))  # slow gets chunk 2 (first range: one chunk)
        slow_aid = next(iter(master.workers[b"slow"].aids))
        clock.now += 10  # past its deadline
        master.workers[b"other"].last_seen = clock.now
        master._expire(clock.now)
        assert 2 in master._pending and master.stats["reissued_chunks"] == 1
        master._handle(b"other", request_message(other))  # another worker takes chunk 2
        assert 2 in {c for a in master.assignments.values() for c in a.chunks}
        clock.now += 4  # slow is now silent past worker_timeout: dropped, nothing queued twice
        master.workers[b"other"].last_seen = clock.now
        master._expire(clock.now)
        assert b"slow" not in master.workers and 2 not in master._pending
        assert slow_aid not in master.assignments and master.stats["reissued_chunks"] == 1
    finally:
        master.close()


def test_a_worker_that_slowed_down_gets_ranges_it_can_finish_after_one_missed_deadline(trainer):
    """A review: a worker's speed was learnt from accepted results only, so one that became 20x slower (a loaded host,
    longer episodes) kept getting ranges sized and timed for its old speed, missed every deadline, and every late
    result was dropped: the master evaluated everything itself, waiting for each deadline first. A range that
    overran its deadline now bounds the worker's speed by what it could have done in that time."""
    clock = Clock()
    master = make_master(trainer, clock)
    try:
        slow = FakeWorker(b"slow")
        connect(master, slow, clock)
        sent = []
        master._send = lambda worker, message: sent.append(message)
        master._begin(None, 0, "h")
        master.workers[b"slow"].chunks_per_second = 20.0  # as measured before it slowed down
        master._handle(b"slow", request_message(slow))
        first = [m for m in sent if m["type"] == "work"][-1]
        (aid,) = master.workers[b"slow"].aids
        issued = master.assignments[aid].issued
        clock.now = master.assignments[aid].deadline + 0.5
        master.workers[b"slow"].last_seen = clock.now
        master._expire(clock.now)
        chunks = first["stop"] - first["start"]
        assert master.workers[b"slow"].chunks_per_second == pytest.approx(chunks / (clock.now - issued))
        master._handle(b"slow", request_message(slow, abandon=aid))
        second = [m for m in sent if m["type"] == "work"][-1]
        assert second["stop"] - second["start"] < chunks, (first, second)
    finally:
        master.close()


def test_a_fast_workers_range_is_never_more_than_one_result_message_holds(trainer, caplog):
    """A review: a range's results (fitness, observation sums) were sized by speed alone, so a fast worker's range of
    image observations' sums (2 x 113 KB a chunk at 84x84x4) went over the master's 16 MiB message limit: its socket
    dropped every such result with the connection, and the range was reissued. A range now holds what fits."""
    clock = Clock()
    master = make_master(trainer, clock)
    try:
        fake = FakeWorker(b"fast")
        connect(master, fake, clock)
        sent = []
        master._send = lambda worker, message: sent.append(message)
        master._begin(None, 0, "h")
        master.workers[b"fast"].chunks_per_second = 1e5  # speed alone: every chunk in one range
        per_chunk = sum(a[0].nbytes for a in master._results)
        master.max_message_bytes = 4096 + 3 * per_chunk + per_chunk // 2  # 3 chunks' arrays and 4 KiB for the rest
        master._handle(b"fast", request_message(fake))
        work = [m for m in sent if m["type"] == "work"][-1]
        k = work["stop"] - work["start"]
        assert k == 3 < trainer.num_chunks, work
        message = dict(result_message(trainer, 1, 0, k), name="fast" * 64, last_aid=0)  # a 256-character name
        assert len(protocol.encode(message, b"k" * 32)[0]) <= master.max_message_bytes
        # Not even one chunk fits (a review: assigned all the same, its result dropped every time): said once, no
        # worker is sent work, the master evaluates alone.
        master.max_message_bytes = 4096 + per_chunk // 2
        other = FakeWorker(b"other")
        connect(master, other, clock)
        master._send = lambda worker, message: sent.append(message)
        sent.clear()
        with caplog.at_level("ERROR", logger="jes.distributed.master"):
            for _ in range(3):
                master._handle(b"other", request_message(other))
        assert [m["type"] for m in sent] == ["wait"] * 3, sent
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and "one chunk's results are" in errors[0] and "smaller chunk_size" in errors[0], errors
    finally:
        master.close()


def test_a_state_too_large_for_a_workers_message_is_said_once_and_never_sent(trainer, monkeypatch, caplog):
    """A review: a snapshot over the workers' message limit (protocol.MAX_TO_WORKER_BYTES) was sent all the same:
    the worker's socket dropped it with the connection, it reconnected every master_timeout, and both logs blamed
    silence. It is now never sent, the worker waits, and the master says once why it evaluates alone."""
    clock = Clock()
    master = make_master(trainer, clock)
    try:
        fake = FakeWorker(b"w")
        connect(master, fake, clock)
        sent = []
        master._send = lambda worker, message: sent.append(message)
        master._begin(trainer.init_state(0), 1, "h1")  # the worker holds generation 0: it needs a snapshot
        monkeypatch.setattr(protocol, "MAX_TO_WORKER_BYTES", 4096 + len(protocol.pack_state(master._state)) - 1)
        with caplog.at_level("ERROR", logger="jes.distributed.master"):
            for _ in range(3):
                master._handle(b"w", request_message(fake))
        assert [m["type"] for m in sent] == ["wait"] * 3 and master.stats["snapshots"] == 0
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and "more than a worker takes in one message" in errors[0], errors
    finally:
        master.close()


def test_a_benched_worker_does_not_stop_the_master_from_evaluating(trainer):
    """A worker that keeps failing to sync sits the generation out; the master must not wait for it."""
    clock = Clock()
    master = make_master(trainer, clock)
    try:
        fake = FakeWorker(b"a")
        connect(master, fake, clock)
        sent = []
        master._send = lambda worker, message: sent.append(message)
        master._begin(None, 0, "h")
        master._handle(b"a", request_message(fake))
        for _ in range(3):
            fake.last_aid = [m for m in sent if m["type"] == "work"][-1]["aid"]
            master._handle(b"a", request_message(fake, abandon=fake.last_aid))
        assert sent[-1]["type"] == "wait" and master.workers[b"a"].idle
        assert master._should_evaluate_here()
    finally:
        master.close()


def drive(master, fakes, sent, alter):
    """Serve the generation to ``fakes`` (``alter(fake, result)`` may change a result) until it is complete."""
    for _ in range(200):
        if master._have.all() and not master._auditing():
            return
        for fake in fakes:
            worker = master.workers.get(fake.identity)
            if worker is None or worker.distrusted:
                continue
            work = [m for m in sent[fake.identity] if m["type"] == "work"]
            sent[fake.identity].clear()
            if not work:
                master._handle(fake.identity, request_message(fake))
            for m in work:
                fake.last_aid = m["aid"]
                master._handle(fake.identity, alter(fake, result_message(master.trainer, m["aid"], m["start"],
                                                                         m["stop"])))
        master.clock.now += 0.1
        master._expire(master.clock.now)
        master._assign_idle()
        if master._pending and master._should_evaluate_here():
            master._evaluate_here(master._pending[0])
        elif not master._pending and master._audits and master._should_audit_here():
            master._audit_here(*master._audits.pop(0))
        check_invariant(master)
    raise AssertionError("the generation did not complete")


def test_audit_catches_a_worker_that_alters_fitness_and_keeps_the_generation_exact(trainer):
    clock = Clock()
    master = make_master(trainer, clock, audit=1.0)
    truth_calls = []

    def master_evaluates(start, stop):  # the master's own (trusted) evaluation: zeros, like the honest worker
        truth_calls.append((start, stop))
        return tuple(np.zeros((stop - start, *a.shape[1:]), a.dtype) for a in master._results)

    master._evaluate_range = master_evaluates
    try:
        honest, liar = FakeWorker(b"honest"), FakeWorker(b"liar")
        for fake in (honest, liar):
            connect(master, fake, clock)
        sent = {b"honest": [], b"liar": []}
        master._send = lambda worker, message: sent[worker.identity].append(message)
        master._begin(None, 0, "h")

        def alter(fake, result):
            if fake is liar:  # one altered value
                fitness = np.zeros((result["stop"] - result["start"], trainer.chunk_size), np.float32)
                fitness[0, 0] = 1.0
                result["fitness"] = protocol.pack_array(fitness)
            return result

        drive(master, (honest, liar), sent, alter)
        assert master._have.all() and not master._auditing()
        assert master.workers[b"liar"].distrusted and not master.workers[b"honest"].distrusted
        assert master.stats["audit_mismatches"] >= 1 and master.stats["distrusted_workers"] == 1
        assert all(not r.any() for r in master._results)  # nothing the liar said survived
    finally:
        master.close()


# ------------------------------------------------------- results are not trusted
def issue(master, fake, sent):
    """Have ``fake`` ask for work; the work message it got."""
    master._handle(fake.identity, request_message(fake))
    work = [m for m in sent if m["type"] == "work"][-1]
    fake.last_aid = work["aid"]
    return work


def serve(trainer, fakes, centre=False, **options):
    clock = Clock()
    master = make_master(trainer, clock, **options)
    sent = []
    for fake in fakes:
        connect(master, fake, clock)
    master._send = lambda worker, message: sent.append(message)
    master._begin(None, 0, "h", centre=centre)
    return master, sent


def test_a_result_is_used_only_for_the_live_assignment_it_was_issued_for(trainer):
    a, b = FakeWorker(b"a"), FakeWorker(b"b")
    master, sent = serve(trainer, (a, b))
    try:
        work_a, work_b = issue(master, a, sent), issue(master, b, sent)
        others = [c for c in range(trainer.num_chunks) if c not in (work_a["start"], work_b["start"])]
        master._handle(b"a", result_message(trainer, work_b["aid"], work_b["start"], work_b["stop"]))  # b's id
        master._handle(b"a", result_message(trainer, 999, others[0], others[0] + 1))                   # never issued
        assert not master._have.any() and master.stats["stale_results"] == 2 and not master.workers[b"a"].distrusted
        master._handle(b"a", result_message(trainer, work_a["aid"], others[0], others[0] + 1))  # its id, another range
        assert not master._have.any() and master.workers[b"a"].distrusted
        assert work_a["start"] in master._pending and work_b["aid"] in master.assignments  # b keeps its range
    finally:
        master.close()


@pytest.mark.parametrize("seconds", [float("inf"), float("nan"), 0.0, -1.0, 1e300])
def test_an_impossible_time_distrusts_the_worker_and_no_deadline_divides_by_it(trainer, seconds):
    a, b = FakeWorker(b"a"), FakeWorker(b"b")
    master, sent = serve(trainer, (a, b))
    try:
        work = issue(master, a, sent)
        master._handle(b"a", dict(result_message(trainer, work["aid"], work["start"], work["stop"]), seconds=seconds))
        assert master.workers[b"a"].distrusted and not master._have.any() and work["start"] in master._pending
        master.clock.now += 0.5
        work = issue(master, b, sent)  # an honest worker: its speed is learned from clamped times
        master._handle(b"b", dict(result_message(trainer, work["aid"], work["start"], work["stop"]), seconds=1e-30))
        assert 0 < master.workers[b"b"].chunks_per_second <= 1e6
        issue(master, b, sent)
        check_invariant(master)
    finally:
        master.close()


def test_a_centre_generations_work_asks_for_the_centre_slots_and_stores_what_comes_back(trainer):
    """On a generation that evaluates the centre, each chunk's centre slots run where the chunk does: the work says
    so, and a result's slots ([k, S] returns and steps) are stored for the master's reduction."""
    slots = trainer.centre_slots
    assert slots == 1  # eval_episodes 2 over 8 chunks
    a = FakeWorker(b"a")
    for centre in (False, True):
        master, sent = serve(trainer, (a,), centre=centre)
        try:
            work = issue(master, a, sent)
            assert work["centre"] is centre
            message = result_message(trainer, work["aid"], work["start"], work["stop"], slots=slots if centre else 0)
            if centre:
                k = work["stop"] - work["start"]
                message["centre_returns"] = protocol.pack_array(np.full((k, slots), -1.5, np.float32))
                message["centre_steps"] = protocol.pack_array(np.full((k, slots), 7, np.int32))
            master._handle(b"a", message)
            assert master._have[work["start"]] and not master.workers[b"a"].distrusted
            assert master._results[4].shape == master._results[5].shape == (trainer.num_chunks, slots if centre else 0)
            if centre:
                assert master._results[4][work["start"], 0] == -1.5 and master._results[5][work["start"], 0] == 7
        finally:
            master.close()


def _wrong_centre(name, value):
    return lambda message, k, slots: dict(message, **{name: value(k, slots)})


@pytest.mark.parametrize("centre, change, field", [
    (True, _wrong_centre("centre_returns", lambda k, s: protocol.pack_array(np.zeros((k, s + 1), np.float32))),
     "centre_returns"),
    (True, _wrong_centre("centre_returns", lambda k, s: protocol.pack_array(np.zeros((k, s), np.float64))),
     "centre_returns"),
    (True, _wrong_centre("centre_steps", lambda k, s: protocol.pack_array(np.zeros((k, s), np.float32))),
     "centre_steps"),
    (True, _wrong_centre("centre_steps", lambda k, s: protocol.pack_array(np.zeros(k * s, np.int32))),
     "centre_steps"),
    (True, lambda message, k, slots: {n: v for n, v in message.items() if n != "centre_returns"}, "centre_returns"),
    (False, _wrong_centre("centre_returns", lambda k, s: protocol.pack_array(np.zeros((k, 1), np.float32))),
     "centre_returns"),  # slots the work did not ask for
])
def test_a_results_centre_slots_of_another_length_or_dtype_distrust_the_worker(trainer, centre, change, field):
    a = FakeWorker(b"a")
    master, sent = serve(trainer, (a,), centre=centre)
    try:
        work = issue(master, a, sent)
        k, slots = work["stop"] - work["start"], trainer.centre_slots if centre else 0
        message = change(result_message(trainer, work["aid"], work["start"], work["stop"], slots=slots), k, slots)
        master._handle(b"a", message)
        assert master.workers[b"a"].distrusted and not master._have.any() and work["start"] in master._pending
        told = [m for m in sent if m["type"] == "distrusted"]
        assert told and "malformed result" in told[0]["reason"] and repr(field) in told[0]["reason"], told
    finally:
        master.close()


@pytest.mark.parametrize("returns, steps", [(np.nan, 3), (0.0, -1), (0.0, 10**6)])
def test_implausible_centre_slots_are_settled_by_the_masters_own_evaluation(trainer, returns, steps):
    a = FakeWorker(b"a")
    master, sent = serve(trainer, (a,), centre=True)
    truth = []

    def master_evaluates(start, stop):
        truth.append((start, stop))
        return tuple(np.zeros((stop - start, *x.shape[1:]), x.dtype) for x in master._results)

    master._evaluate_range = master_evaluates
    try:
        work = issue(master, a, sent)
        k, slots = work["stop"] - work["start"], trainer.centre_slots
        master._handle(b"a", dict(result_message(trainer, work["aid"], work["start"], work["stop"], slots=slots),
                                  centre_returns=protocol.pack_array(np.full((k, slots), returns, np.float32)),
                                  centre_steps=protocol.pack_array(np.full((k, slots), steps, np.int32))))
        assert truth == [(work["start"], work["stop"])] and master.stats["verified_here"] == 1
        assert master._have[work["start"]] and master._results[5][work["start"], 0] == 0  # the master's own
        assert master.workers[b"a"].distrusted
    finally:
        master.close()


def test_non_finite_fitness_is_settled_by_the_masters_own_evaluation(trainer):
    """An honest run can give NaN fitness: a worker that reports the master's own NaN stays trusted."""
    honest, liar = FakeWorker(b"honest"), FakeWorker(b"liar")
    master, sent = serve(trainer, (honest, liar))
    truth = []

    def master_evaluates(start, stop):  # the truth: NaN in the first member of every chunk
        truth.append((start, stop))
        fitness = np.zeros((stop - start, trainer.chunk_size), np.float32)
        fitness[:, 0] = np.nan
        return (fitness, *(np.zeros((stop - start, *a.shape[1:]), a.dtype) for a in master._results[1:]))

    master._evaluate_range = master_evaluates
    try:
        for fake, value in ((honest, np.nan), (liar, np.inf)):
            work = issue(master, fake, sent)
            k = work["stop"] - work["start"]
            fitness = np.zeros((k, trainer.chunk_size), np.float32)
            fitness[:, 0] = value
            master._handle(fake.identity, dict(result_message(trainer, work["aid"], work["start"], work["stop"]),
                                               fitness=protocol.pack_array(fitness)))
            assert master._have[work["start"]] and np.isnan(master._results[0][work["start"], 0])
        assert len(truth) == 2 and master.stats["verified_here"] == 2
        assert master.workers[b"honest"].verified and not master.workers[b"honest"].distrusted
        assert master.workers[b"liar"].distrusted
    finally:
        master.close()


def test_an_unverified_auditor_agreeing_with_a_liar_settles_nothing(trainer):
    """Two identities of one liar: an audit is never assigned to, nor settled by, a worker the master has not
    verified; the master's own evaluation decides, and both are distrusted."""
    a, b = FakeWorker(b"a"), FakeWorker(b"b")
    master, sent = serve(trainer, (a, b), audit=1.0)
    try:
        work = issue(master, a, sent)
        lie = dict(result_message(trainer, work["aid"], work["start"], work["stop"]),
                   fitness=protocol.pack_array(np.ones((1, trainer.chunk_size), np.float32)))
        master._handle(b"a", lie)
        assert master._audits and not master.workers[b"b"].verified
        master._pending = []  # only the audit is left: b, idle and unverified, is not given it
        master._handle(b"b", request_message(b))
        assert not any(a.audit for a in master.assignments.values()) and master._should_audit_here()
        # Even an audit result of b that agrees with a (as if b had been handed it) is settled by the master.
        master._check_audit(work["start"], work["stop"],
                            tuple(protocol.unpack_array(lie[k]) for k in ("fitness", "env_steps", "obs_sum", "obs_sumsq",
                                                                         "centre_returns", "centre_steps")),
                            b"b")
        assert master.workers[b"a"].distrusted and master.workers[b"b"].distrusted
        assert not master._results[0].any() and master.stats["audit_mismatches"] == 0
        assert master.stats["audits_settled_here"] == 1
    finally:
        master.close()


def test_the_status_lines_rates_show_workers_that_evaluated_few_members():
    """A worker that evaluated 16 members in a 10 s status interval showed "0" members/s, as if it were idle."""
    from jes.distributed.master import members_per_second

    assert members_per_second(16, 10.0) == "1.6"
    assert members_per_second(1, 30.0) == "0.033"
    assert members_per_second(0, 10.0) == "0"
    assert members_per_second(1234, 10.0) == "123"


# ---------------------------------------- a worker is verified before it is trusted
def test_a_new_workers_first_range_is_audited_even_without_audit(trainer, caplog):
    """Defect (new-user tester): with audit=0 a worker computing other bits (other XLA flags) had every result used.
    Its first range is now checked against the master's own evaluation, so it is distrusted before any of its
    results settle the generation, and it is told why."""
    liar, honest = FakeWorker(b"liar"), FakeWorker(b"honest")
    master, _ = serve(trainer, (liar, honest))
    sent = {b"liar": [], b"honest": []}
    master._send = lambda worker, message: sent[worker.identity].append(message)

    def alter(fake, result):
        if fake is liar:  # one value off in every range it sends
            k = result["stop"] - result["start"]
            obs_sum = np.zeros((k, *trainer.spec.obs_shape), np.float32)
            obs_sum[0, 0] = 1e-7
            result["obs_sum"] = protocol.pack_array(obs_sum)
        return result

    try:
        with caplog.at_level("INFO", "jes.distributed.master"):
            drive(master, (liar, honest), sent, alter)
        assert master.workers[b"liar"].distrusted and not master.workers[b"honest"].distrusted
        assert master.workers[b"honest"].verified  # its first range was audited too, and matched
        assert master.stats["join_audits"] == 2 and master.stats["sampled_audits"] == 0
        assert all(not r.any() for r in master._results)  # nothing the liar said survived
        told = [m for m in sent[b"liar"] if m["type"] == "distrusted"]
        assert told and "differ from the master's own evaluation" in told[0]["reason"]
        with caplog.at_level("INFO", "jes.distributed.master"):
            master._last_status = -1e9  # a status line now
            master._status(1)
        assert "liar distrusted, honest" in caplog.text
    finally:
        master.close()


@pytest.mark.parametrize("lies", [False, True])
def test_a_workers_first_centre_slots_are_audited_even_when_its_first_range_had_none(trainer, lies):
    """Review of the fleet centre: the centre's return now comes from the workers' centre slots (and stop_at_return
    reads it), but only a worker's first range was audited; with eval_every > 1 that range can come on a generation
    without live slots, and a worker verified there had its centre values used unchecked ever after (audit 0). Its
    first range with live slots is audited too, once: a liar about the centre alone is distrusted."""
    a = FakeWorker(b"a")
    master, sent = serve(trainer, (a,), centre=False)
    try:
        work = issue(master, a, sent)  # generation 0: no centre; its join probe
        master._handle(b"a", result_message(trainer, work["aid"], work["start"], work["stop"]))
        assert master.stats["join_audits"] == 1
        master._audit_here(*master._audits.pop(0))
        assert master.workers[b"a"].verified and not master.workers[b"a"].distrusted
        slots = trainer.centre_slots
        for generation in (1, 2):  # generations evaluating the centre
            master._end()
            master._begin(None, generation, "h", centre=True)
            master._handle(b"a", dict(request_message(a), gen=generation))  # at this generation's state already
            work = [m for m in sent if m["type"] == "work"][-1]
            a.last_aid = work["aid"]
            k = work["stop"] - work["start"]
            message = result_message(trainer, work["aid"], work["start"], work["stop"], gen=generation, slots=slots)
            if lies:  # finite, plausible and wrong: only a comparison catches it
                message["centre_returns"] = protocol.pack_array(np.full((k, slots), 500.0, np.float32))
            master._handle(b"a", message)
            if generation == 1:
                assert master.stats["join_audits"] == 2 and len(master._audits) == 1  # whatever audit (0 here)
                master._audit_here(*master._audits.pop(0))
                assert master.workers[b"a"].distrusted is lies
                assert not master._results[4].any()  # the master's own slots stand
                if lies:
                    return
            else:  # checked once: an honest worker's later centre slots are used as they come
                assert master.stats["join_audits"] == 2 and not master._audits and master._have[work["start"]]
    finally:
        master.close()


def test_a_worker_that_reports_a_diverged_state_is_distrusted_with_the_likely_causes(trainer, caplog):
    """Defect (new-user tester): a worker whose state after an update differed from the master's only asked for a
    snapshot (86 times in one run) while its results kept being used; now it says so and the master distrusts it."""
    fake = FakeWorker(b"fast")
    master, _ = serve(trainer, (fake,))
    sent = []
    master._send = lambda worker, message: sent.append(message)
    try:
        work = issue(master, fake, sent)
        with caplog.at_level("INFO", "jes.distributed.master"):
            master._handle(fake.identity, {"type": "diverged", "run": "run", "gen": 0, "hash": "h", "mine": "other"})
        assert master.workers[b"fast"].distrusted and work["start"] in master._pending
        warning = [r for r in caplog.records if "computes other bits" in r.getMessage()]
        assert warning and warning[0].levelname == "WARNING"
        for cause in ("XLA_FLAGS", "JAX_ENABLE_X64", "jaxlib", "CPU", "no longer used"):
            assert cause in warning[0].getMessage()
        assert sent[-1]["type"] == "distrusted" and "computes other bits" in sent[-1]["reason"]
        master._handle(fake.identity, request_message(fake))  # asking again: told again, no work
        assert sent[-1]["type"] == "distrusted"
    finally:
        master.close()


def test_results_that_differ_on_a_python_env_name_an_env_not_seeded_by_reset_as_the_likely_cause(trainer, caplog):
    """A trial: an env drawing from the global np.random had every local worker distrusted with "check XLA_FLAGS,
    JAX_ENABLE_X64, versions", which local workers cannot differ in; the env's seeding was never named."""
    import types

    from jes.distributed.worker import likely_cause

    fake = FakeWorker(b"fast")
    master, _ = serve(trainer, (fake,))
    master._send = lambda worker, message: None
    try:
        host = types.SimpleNamespace(spec=types.SimpleNamespace(host=True), chunk_size=trainer.chunk_size)
        for run_trainer, named in ((trainer, False), (host, True)):
            caplog.clear()
            master.trainer, master._distrusted = run_trainer, {}
            with caplog.at_level("INFO", "jes.distributed.master"):
                master._distrust(fake.identity)
            text = " ".join(r.getMessage() for r in caplog.records)
            assert "distrusted for the rest of the run" in text
            assert ("not a function of reset(seed=...)" in text) is named, text
    finally:
        master.trainer = trainer
        master.close()
    assert "episodes that are not a function of reset(seed=...)" in likely_cause(
        "returned results that differ from the master's own evaluation")


def test_the_status_line_calls_a_worker_that_refused_the_run_refused(trainer, caplog):
    """Defect (new-user tester): a worker that refused the run (it cannot build it: a missing simulator) showed as
    "0" members/s in the master's status line, as if it were idle; distrusted workers already said so."""
    master = make_master(trainer, Clock())
    try:
        for identity, name in ((b"one", "busy"), (b"two", "cannot")):
            master._hello(identity, {"type": "hello", "name": name, "nonce": identity.decode().ljust(16, "n")})
        master.workers[b"one"].interval_members = 500
        master.workers[b"two"].refused = master._run
        master._last_status = time.monotonic() - 10 * max(master.status_interval, 1.0)
        with caplog.at_level("INFO", "jes.distributed.master"):
            master._status(3)
        line = next(r.getMessage() for r in caplog.records if "members/s" in r.getMessage())
        assert "cannot refused" in line and "busy 0" not in line and "cannot 0" not in line, line
    finally:
        master.close()


def test_a_worker_of_another_protocol_version_is_told_which_jes_the_master_runs(trainer, caplog):
    """Review of the protocol bump (2 -> 3): a worker of the earlier jes refuses the run saying only the version it
    was sent; the master's log says which jes it runs and what to install on the worker."""
    master = make_master(trainer, Clock())
    try:
        master._hello(b"old", {"type": "hello", "name": "old", "nonce": "o" * 16})
        with caplog.at_level("ERROR", "jes.distributed.master"):
            master._handle(b"old", {"type": "refused", "run": master._run,
                                    "reason": "run description of protocol version 3, but this jes speaks version 2"})
        assert f"this master runs jes {jes.__version__}, protocol version {protocol.PROTOCOL_VERSION}" in caplog.text
        assert "install that jes on the worker's host" in caplog.text
        assert master.workers[b"old"].refused == master._run
    finally:
        master.close()


def test_two_workers_of_one_name_are_told_apart_and_the_name_is_warned_about_once(trainer, caplog):
    """Defect (new-user tester): two `jes-worker --name dup` read "members/s: dup 4387, dup 2702" in the log."""
    master = make_master(trainer, Clock())
    try:
        with caplog.at_level("INFO", "jes.distributed.master"):
            for identity in (b"one", b"two", b"three"):
                master._hello(identity, {"type": "hello", "name": "dup", "nonce": identity.decode().ljust(16, "n")})
            master._hello(b"four", {"type": "hello", "name": "other", "nonce": "4" * 16})
        assert [w.name for w in master.workers.values()] == ["dup", "dup#2", "dup#3", "other"]
        assert len([r for r in caplog.records if "name dup is taken" in r.getMessage()]) == 1
        assert "worker dup#2 connected" in caplog.text
    finally:
        master.close()


@pytest.mark.parametrize("order", ["old hello first", "new hello first"])
def test_a_worker_that_reconnected_while_the_master_was_busy_counts_once_under_its_own_name(trainer, caplog, order):
    """Defect (fleet tester): a worker whose --master-timeout ran out while the master compiled reconnected with a new
    identity; the master then read both connections' hellos, counted the one worker two or three times, warned that
    its (unique) name was taken, called it solo#3 for the rest of the run and later reported the ghosts lost. A
    hello carries the worker process's id and connection number: the newer connection replaces the older, whose
    queued hellos are dropped."""
    master = make_master(trainer, Clock())
    process = "p" * 32
    old = (b"old", {"type": "hello", "name": "solo", "nonce": "o" * 16, "process": process, "connection": 1})
    new = (b"new", {"type": "hello", "name": "solo", "nonce": "n" * 16, "process": process, "connection": 2})
    other = (b"other", {"type": "hello", "name": "solo", "nonce": "x" * 16, "process": "q" * 32, "connection": 1})
    try:
        with caplog.at_level("INFO", "jes.distributed.master"):
            for identity, hello in ((old, new) if order == "old hello first" else (new, old)):
                master._hello(identity, hello)
            assert list(master.workers) == [b"new"] and master.workers[b"new"].name == "solo"
            assert "is taken" not in caplog.text
            master._hello(*other)  # another process with the same --name is still told apart, as before
        assert {w.name for w in master.workers.values()} == {"solo", "solo#2"}
        assert "worker name solo is taken" in caplog.text
    finally:
        master.close()


def test_messages_queued_by_a_replaced_connection_are_dropped_quietly(trainer, caplog):
    """Review: once a reconnected worker's older connection was dropped, the heartbeats it had queued were each logged
    at WARNING as "outside any session" (up to 20 lines a reconnect)."""
    master = make_master(trainer, Clock())
    process = "p" * 32
    try:
        master._hello(b"old", {"type": "hello", "name": "solo", "nonce": "o" * 16, "process": process, "connection": 1})
        stale = master.workers[b"old"].session.seal({"type": "heartbeat", "name": "solo"})
        master._hello(b"new", {"type": "hello", "name": "solo", "nonce": "n" * 16, "process": process, "connection": 2})
        with caplog.at_level("INFO", "jes.distributed.master"):
            master._receive([b"old", *stale])
        assert "outside any session" not in caplog.text and master.stats["dropped"] == 0, caplog.text
    finally:
        master.close()


def test_a_worker_of_an_earlier_master_is_asked_to_say_hello_again_without_warnings(trainer, caplog):
    """A new user's trial: long-lived jes-workers, still in a session of the master before (a run resumed on the
    same port), had each queued heartbeat and request logged at WARNING as "dropped a message ... outside any
    session" by the new master, for what is the expected path: it answers rehello and they open a new session."""
    master = make_master(trainer, Clock())
    sent = []
    master._send_frames = lambda identity, frames, kind, name: sent.append((identity, kind))
    earlier = protocol.Session(master.key, "s" * 32)  # a session the master before this one opened
    caplog.clear()  # (its "master listening" line, where an earlier test left jes.distributed's level at INFO)
    try:
        with caplog.at_level("INFO", "jes.distributed.master"):
            for message in ({"type": "heartbeat", "name": "fleet0"},
                            {"type": "request", "name": "fleet0", "run": "r", "gen": 3, "hash": "h", "last_aid": 7},
                            {"type": "heartbeat", "name": "fleet0"}):
                master._receive([b"fleet0", *earlier.seal(message)])
        assert sent == [(b"fleet0", "rehello")] * 3 and not master.workers
        assert [r.levelname for r in caplog.records] == ["INFO"], caplog.text
        assert "asked peer 666c65657430 to say hello again: its 'heartbeat' belongs to no session open here" \
            in caplog.text
        assert master.stats["rehello"] == 3 and master.stats["dropped"] == 3
        with caplog.at_level("INFO", "jes.distributed.master"):  # once per connection
            master._receive([b"fleet1", *earlier.seal({"type": "heartbeat", "name": "fleet1"})])
        assert [r.levelname for r in caplog.records] == ["INFO", "INFO"], caplog.text
        # A large fleet's rehellos spend none of the 20 warnings of messages dropped for other reasons
        for _ in range(30):
            master._receive([b"fleet1", *earlier.seal({"type": "heartbeat", "name": "fleet1"})])
        caplog.clear()
        with caplog.at_level("INFO", "jes.distributed.master"):
            master._receive([b"odd", *protocol.encode({"type": "heartbeat", "name": "odd"}, master.key)])  # no sid
        assert [r.levelname for r in caplog.records] == ["WARNING"] and "(1 dropped so far)" in caplog.text
    finally:
        master.close()
