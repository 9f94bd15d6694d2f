"""jes.checkpoint: atomic saves, bit-identical resume, clear errors for bad files."""
import dataclasses
import functools
import operator
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import types
import warnings

import jax
import numpy as np
import pytest

import jes
from jes import checkpoint, cli
from jes.loop import run

SMALL = dict(num_members=16, chunk_size=8, num_generations=4, eval_episodes=4, eval_every=2)
POLICY = jes.GRUPolicy(hidden=3, layers=1)


@pytest.fixture(scope="module")
def trainer():
    return jes.Trainer(POLICY, "CartPole-v1", "adam", jes.ESConfig(**SMALL))


@pytest.fixture(scope="module")
def full_run(trainer):
    """The uninterrupted 4-generation run every resumed run must equal bit for bit."""
    return run(trainer, trainer.init_state(5), key=5)


@pytest.fixture(scope="module")
def saved(trainer, tmp_path_factory):
    """A checkpoint after 2 of 4 generations."""
    path = str(tmp_path_factory.mktemp("ckpt") / "run.ckpt")
    run(trainer, trainer.init_state(5), key=5, num_generations=2, checkpoint_path=path)
    return path


def test_resume_with_train_is_bit_identical(saved, full_run, tmp_path):
    path = str(tmp_path / "copy.ckpt")
    with open(saved, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read())
    with pytest.warns(UserWarning, match="key=999 is ignored: a resumed run continues with its checkpoint's key"):
        resumed = jes.train(POLICY, "CartPole-v1", "adam", key=999, resume=path, log_dir=None, progress=False, **SMALL)
    np.testing.assert_array_equal(resumed.flat_params, full_run.flat_params)
    np.testing.assert_array_equal(resumed.state.obs_sumsq, full_run.state.obs_sumsq)
    np.testing.assert_array_equal(resumed.history["pop_mean"], full_run.history["pop_mean"])
    np.testing.assert_array_equal(resumed.history["generation"], [1, 2, 3, 4])
    np.testing.assert_array_equal(resumed.key, full_run.key)  # the run key came from the file, not key=999
    assert checkpoint.read(path).generation == 4  # the resume file is updated by default
    # The best member ever evaluated is the whole run's, not only the resumed call's.
    assert (resumed.best.fitness, resumed.best.generation, resumed.best.member) == (
        full_run.best.fitness, full_run.best.generation, full_run.best.member)
    np.testing.assert_array_equal(resumed.best.flat_params, full_run.best.flat_params)


def test_the_checkpoint_keeps_the_best_member_for_a_resume(saved, full_run, tmp_path):
    first_two = full_run.history["pop_max"][:2]
    kept = checkpoint.read(saved).best
    assert float(kept["fitness"]) == first_two.max() and int(kept["generation"]) == int(np.argmax(first_two)) + 1
    path = str(tmp_path / "copy.ckpt")
    with open(saved, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read())
    # Resumed with nothing left to run: the best member can only come from the file.
    with pytest.warns(UserWarning, match="nothing left to train"):
        resumed = jes.train(POLICY, "CartPole-v1", "adam", resume=path, log_dir=None, progress=False,
                            **dict(SMALL, num_generations=2))
    assert resumed.best.fitness == first_two.max() and resumed.best.generation == int(kept["generation"])
    np.testing.assert_array_equal(resumed.best.flat_params, kept["flat_params"])
    assert resumed.best.policy.obs_stats is not None  # it acts with the normaliser it was evaluated with


def test_a_checkpoints_own_best_member_saves_and_its_repr_is_one_line(saved, tmp_path):
    """jes.checkpoint.save(..., best=ckpt.best) with what checkpoint.load gives raised a raw AttributeError ('dict'
    object has no attribute 'generation'): it writes that best member as the file kept it; another dict or object is
    refused naming what best must be. repr(Checkpoint) printed every history array: one line."""
    trainer, state, ckpt = checkpoint.load(saved)
    path = checkpoint.save(str(tmp_path / "again.ckpt"), trainer, state, ckpt.history, ckpt.key, best=ckpt.best)
    again = checkpoint.read(path)
    assert again.best.keys() == ckpt.best.keys() and again.best["obs_stats"].keys() == ckpt.best["obs_stats"].keys()
    for name in ("fitness", "generation", "member", "flat_params"):
        assert np.asarray(again.best[name]).tobytes() == np.asarray(ckpt.best[name]).tobytes(), name
    for i in "012":
        assert np.asarray(again.best["obs_stats"][i]).tobytes() == np.asarray(ckpt.best["obs_stats"][i]).tobytes()
    for bad, said in (({"fitness": 1.0}, "got a dict without flat_params, generation, member"), (3, "got int")):
        with pytest.raises(TypeError, match=rf"best must be a run's best member \(result.best\) or a checkpoint's "
                                            rf"\(jes.checkpoint.read\(path\).best\), {said}"):
            checkpoint.save(str(tmp_path / "bad.ckpt"), trainer, state, ckpt.history, ckpt.key, best=bad)
    assert not os.path.exists(tmp_path / "bad.ckpt")
    assert repr(again) == (f"Checkpoint({path!r}: CartPole-v1, generation 2, 2 history rows, a best member)")


def test_a_resumed_runs_summary_says_its_wall_time_is_this_calls(full_run):
    """A run resumed after long sessions said "20010 generations ... 7.6s wall" (127.6 s over its sessions): the
    summary says the wall time is this call's, beside the history's training time, where that is the longer."""
    import dataclasses

    assert " in this call" not in full_run.summary()
    history = dict(full_run.history, wall_time=np.asarray(full_run.history["wall_time"]) + 120.0)
    resumed = dataclasses.replace(full_run, history=history, wall_time=7.61)
    assert (f"7.6s wall in this call ({float(history['wall_time'][-1]):.1f}s training over the run's sessions)"
            in resumed.summary())


def test_a_manual_resume_keeps_the_checkpoints_best_member(saved, full_run, tmp_path):
    """The public route (jes.checkpoint.load, then jes.run) had no way to pass the checkpoint's best member on (run()
    took a BestMember, the checkpoint holds a dict): the resumed run's best was the best of its own generations,
    saved over the better one the file kept."""
    path = str(tmp_path / "copy.ckpt")
    shutil.copy(saved, path)
    trainer, state, ckpt = checkpoint.load(path)
    # Nothing left to train (2 of 2 generations): the best member can only come from the file, and must stay in it
    resumed = jes.run(trainer, state, key=ckpt.key, history=ckpt.history, best=ckpt.best, checkpoint_path=path,
                      num_generations=2)
    assert (resumed.best.fitness, resumed.best.generation, resumed.best.member) == (
        float(ckpt.best["fitness"]), int(ckpt.best["generation"]), int(ckpt.best["member"]))
    np.testing.assert_array_equal(resumed.best.flat_params, ckpt.best["flat_params"])
    assert resumed.best.policy.obs_stats is not None  # it acts with the normaliser it was evaluated with
    assert int(checkpoint.read(path).best["generation"]) == int(ckpt.best["generation"])
    # On to the run's 4 generations: the best member is the uninterrupted run's, as with jes.train(resume=...)
    trainer, state, ckpt = checkpoint.load(path)
    resumed = jes.run(trainer, state, key=ckpt.key, history=ckpt.history, best=ckpt.best, checkpoint_path=path)
    np.testing.assert_array_equal(resumed.flat_params, full_run.flat_params)
    assert (resumed.best.fitness, resumed.best.generation, resumed.best.member) == (
        full_run.best.fitness, full_run.best.generation, full_run.best.member)
    np.testing.assert_array_equal(checkpoint.read(path).best["flat_params"], full_run.best.flat_params)


def test_checkpoint_holds_everything(saved, trainer):
    ckpt = checkpoint.read(saved)
    with open(saved, "rb") as f:
        assert f.read(8) == checkpoint.MAGIC
    assert ckpt.generation == 2 and ckpt.env_name == "CartPole-v1" and ckpt.optimizer == "adam"
    assert ckpt.meta["policy"]["class"] == "jes.policies:GRUPolicy"
    assert ckpt.meta["policy"]["fields"]["hidden"] == 3 and ckpt.meta["num_params"] == trainer.num_params
    assert list(ckpt.history["generation"]) == [1, 2]
    np.testing.assert_array_equal(ckpt.key, jax.random.key_data(jax.random.key(5)))
    rebuilt, state, _ = checkpoint.load(saved)  # trainer rebuilt from the description alone
    assert rebuilt.num_params == trainer.num_params and int(state.generation) == 2
    assert float(state.obs_count) > 1.0  # observation statistics travelled
    assert float(state.strategy.opt_state.hyperparams["learning_rate"]) == pytest.approx(float(
        trainer.init_state(0).strategy.opt_state.hyperparams["learning_rate"]))


def test_keyboard_interrupt_saves_then_resume_is_bit_identical(trainer, full_run, tmp_path):
    path = str(tmp_path / "interrupted.ckpt")

    def ctrl_c_after_second(record):
        if record["generation"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as interrupted:
        run(trainer, trainer.init_state(5), key=5, callbacks=[ctrl_c_after_second], checkpoint_path=path)
    # Interrupted among generation 2's callbacks (TensorBoard's writes, say): the run is saved at generation 1, so the
    # resumed run steps generation 2 again and every callback sees it whole (no hole in the logged curves).
    ckpt = checkpoint.read(path)
    assert ckpt.generation == 1 and list(ckpt.history["generation"]) == [1]
    # The run so far rides on the interrupt too (a notebook without a checkpoint lost it): the checkpoint's centre.
    so_far = interrupted.value.result
    assert list(so_far.history["generation"]) == [1]
    # ... and its traceback says so (a notebook cell showed a bare "KeyboardInterrupt:"; a trial)
    assert interrupted.value.__notes__ == [f"jes: interrupted after generation 1. The run so far is this exception's "
                                           f".result (`except KeyboardInterrupt as e: result = e.result`; in "
                                           f"Jupyter/IPython, after the cell: `result = sys.last_value.result`); the "
                                           f"checkpoint {path} holds it too (resume={path!r})"]
    np.testing.assert_array_equal(so_far.flat_params, np.asarray(ckpt.restore_state(trainer).params))
    seen = []
    resumed = run(trainer, ckpt.restore_state(trainer), key=ckpt.key, history=ckpt.history,
                  callbacks=[lambda record: seen.append(record["generation"])])
    assert seen[0] == 2
    np.testing.assert_array_equal(resumed.flat_params, full_run.flat_params)
    np.testing.assert_array_equal(resumed.history["pop_mean"], full_run.history["pop_mean"])


def test_an_interrupt_while_the_step_compiles_carries_the_run_as_it_started(tmp_path, monkeypatch):
    """Ctrl-C during the step's compile (seconds to minutes, before generation 1): the interrupt carries the run as it
    began, as the guide's `except KeyboardInterrupt as interrupt: interrupt.result` expects (it had no .result)."""
    def ctrl_c(self, state):
        raise KeyboardInterrupt
    monkeypatch.setattr(jes.Trainer, "compiled_step", ctrl_c)
    with pytest.raises(KeyboardInterrupt) as interrupted:
        jes.train(POLICY, "CartPole-v1", "adam", key=5, log_dir=str(tmp_path / "logs"), progress=False, **SMALL)
    so_far = interrupted.value.result
    fresh = jes.Trainer(POLICY, "CartPole-v1", "adam", jes.ESConfig(**SMALL)).init_state(5)
    assert list(so_far.history["generation"]) == [] and so_far.solved_generation is None
    assert interrupted.value.__notes__[0].startswith("jes: interrupted while the generation step compiled, before "
                                                     "generation 1: nothing was trained; the run as it started is")
    # (its summary named a log dir never made and "checkpoint: off" of a run with checkpoints on; a trial)
    assert so_far.summary().endswith(f"; logs: none written (would have been {tmp_path / 'logs'}); checkpoint: none "
                                     f"written")
    np.testing.assert_array_equal(so_far.flat_params, np.asarray(fresh.params))


@pytest.mark.hard_timeout(600)
def test_a_resumed_run_interrupted_while_compiling_names_the_checkpoint_it_resumed(tmp_path, monkeypatch):
    """A review: its summary said "checkpoint: none written" and its note named no checkpoint, though the file it
    resumed holds the run as it started."""
    path = str(tmp_path / "run.ckpt")
    jes.train(POLICY, "CartPole-v1", "adam", key=5, checkpoint_path=path, log_dir=None, progress=False,
              **{**SMALL, "num_generations": 1})

    def ctrl_c(self, state):
        raise KeyboardInterrupt
    monkeypatch.setattr(jes.Trainer, "compiled_step", ctrl_c)
    with pytest.raises(KeyboardInterrupt) as interrupted:
        jes.train(POLICY, "CartPole-v1", "adam", num_generations=3, resume=path, log_dir=None, progress=False,
                  **{k: v for k, v in SMALL.items() if k != "num_generations"})
    so_far = interrupted.value.result
    assert list(so_far.history["generation"]) == [1] and so_far.checkpoint_path == path
    assert so_far.summary().endswith(f"; checkpoint: {path}"), so_far.summary()
    assert interrupted.value.__notes__[0].endswith(f"the checkpoint {path} it resumed holds it too (resume={path!r})")
    assert interrupted.value.checkpoint_path == path


def test_the_ctrl_c_note_of_another_process_names_the_checkpoint_process_0_saves():
    """A review: process 1's note said "no checkpoint holds it" while process 0 saved the run's checkpoint."""
    from jes.loop import _note_interrupt

    interrupt = KeyboardInterrupt()
    interrupt.result = None
    _note_interrupt(interrupt, 3, None, process_0_saves="run.ckpt")
    assert interrupt.__notes__[0].endswith("after generation 3. The run so far is this exception's .result (`except "
                                           "KeyboardInterrupt as e: result = e.result`; in Jupyter/IPython, after the "
                                           "cell: `result = sys.last_value.result`); process 0 of this multi-process "
                                           "run saves it to the checkpoint run.ckpt")


INTERRUPTED_WHILE_COMPILING = """
import os, signal, threading, time
import jes
from jes.compiled import CompiledPrograms

compile_step, compiled_step, sent = CompiledPrograms._compile_step, CompiledPrograms.compiled_step, threading.Event()

def slow_compile(self, *args, **kwargs):  # the background compile: still running when the Ctrl-C comes
    if threading.current_thread().name == "jes-compile-step":
        sent.wait(120)
        time.sleep(0.5)
    return compile_step(self, *args, **kwargs)

def ctrl_c_soon(self, state):  # the main thread about to wait for the compile: Ctrl-C while it waits
    def send():
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)
        sent.set()
    threading.Thread(target=send, daemon=True).start()
    return compiled_step(self, state)

CompiledPrograms._compile_step, CompiledPrograms.compiled_step = slow_compile, ctrl_c_soon
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job (nohup ... &) inherits SIGINT ignored
try:
    jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", num_members=8, num_generations=2, log_dir=None,
              progress=False)
except KeyboardInterrupt as interrupt:
    print("result generations:", len(interrupt.result.history["generation"]))
"""


@pytest.mark.hard_timeout(300)
def test_ctrl_c_while_waiting_for_the_compile_exits_cleanly(tmp_path):
    """An interrupted Thread.join marks the compile thread stopped on CPython < 3.13 while it still compiles: the
    process then left during the compile and aborted ("FATAL: exception not rethrown", status 134)."""
    out = subprocess.run([sys.executable, "-c", INTERRUPTED_WHILE_COMPILING], capture_output=True, text=True,
                         cwd=str(tmp_path), timeout=240)
    assert out.returncode == 0 and "FATAL" not in out.stderr, (out.returncode, out.stderr[-2000:])
    assert "result generations: 0" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "stopping once the generation step's compile" in out.stderr


def test_periodic_checkpoints(trainer, tmp_path):
    path = str(tmp_path / "periodic.ckpt")
    seen = []
    run(trainer, trainer.init_state(5), key=5, checkpoint_path=path, checkpoint_every=1, num_generations=3,
        callbacks=[lambda r: seen.append(checkpoint.read(path).generation if os.path.exists(path) else None)])
    # Each callback runs before that generation's save: it sees the previous generation's checkpoint.
    assert seen == [None, 1, 2] and checkpoint.read(path).generation == 3


@pytest.mark.parametrize("damage, message", [
    (lambda data: data[: len(data) // 2], "truncated"),
    (lambda data: data[:100] + bytes([data[100] ^ 0xFF]) + data[101:], "corrupt"),
    (lambda data: b"\x80\x04pickle" + data[10:], "not a jes checkpoint"),
    (lambda data: data[:10], "truncated"),
])
def test_damaged_file_gives_clear_error_and_good_file_survives(saved, tmp_path, damage, message):
    with open(saved, "rb") as f:
        good = f.read()
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(damage(good))
    with pytest.raises(checkpoint.CheckpointError, match=message) as err:
        checkpoint.read(str(bad))
    assert str(bad) in str(err.value)
    assert checkpoint.read(saved).generation == 2


def test_failed_save_leaves_previous_checkpoint_intact(trainer, saved, tmp_path, monkeypatch):
    path = str(tmp_path / "run.ckpt")
    with open(saved, "rb") as src:
        good = src.read()
    with open(path, "wb") as dst:
        dst.write(good)

    def disk_full(f, payload):
        f.write(payload[: len(payload) // 3])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "_write_payload", disk_full)
    state = trainer.init_state(9)
    with pytest.raises(OSError, match="No space"):
        checkpoint.save(path, trainer, state, {}, key=9)
    with open(path, "rb") as f:
        assert f.read() == good
    assert os.listdir(tmp_path) == ["run.ckpt"]  # the temporary file was removed


def test_mismatching_run_is_refused_with_the_differences(saved):
    other_policy = jes.Trainer(jes.GRUPolicy(hidden=4, layers=1), "CartPole-v1", "adam", jes.ESConfig(**SMALL))
    with pytest.raises(checkpoint.CheckpointError, match="parameter count") as err:
        checkpoint.read(saved).restore_state(other_policy)
    assert saved in str(err.value) and "policy" in str(err.value)
    other_env = jes.Trainer(POLICY, "Acrobot-v1", "adam", jes.ESConfig(**SMALL))
    with pytest.raises(checkpoint.CheckpointError, match="env: checkpoint has CartPole-v1"):
        checkpoint.read(saved).restore_state(other_env)
    other_config = jes.Trainer(POLICY, "CartPole-v1", "adam", jes.ESConfig(**dict(SMALL, num_members=24)))
    with pytest.raises(checkpoint.CheckpointError, match="config.num_members"):
        checkpoint.read(saved).restore_state(other_config)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        checkpoint.read(saved + ".missing")


# --------------------------------------------------------------- what a file may build
def _rewrite_meta(src: str, dst: str, change, change_content=None) -> str:
    """Copy checkpoint ``src`` to ``dst`` with ``change(meta)`` (and ``change_content(content)``) applied (a valid
    header and checksum)."""
    import hashlib
    import json

    from flax import serialization

    with open(src, "rb") as f:
        data = f.read()
    content = serialization.msgpack_restore(data[checkpoint._HEADER.size:])
    meta = json.loads(content["meta"])
    change(meta)
    content["meta"] = json.dumps(meta)
    if change_content is not None:
        change_content(content)
    payload = serialization.msgpack_serialize(content)
    with open(dst, "wb") as f:
        f.write(checkpoint._HEADER.pack(checkpoint.MAGIC, len(payload), hashlib.sha256(payload).digest()))
        f.write(payload)
    return dst


def test_a_checkpoint_cannot_make_load_run_arbitrary_code(saved, tmp_path):
    target = tmp_path / "pwned"
    popen = {"class": "subprocess:Popen", "fields": {"args": {"__seq__": ["touch", str(target)], "tuple": False}}}
    for name, change in (
        ("policy", lambda meta: meta.update(policy=popen)),
        ("field", lambda meta: meta["policy"]["fields"].update(cell={"__callable__": "subprocess:Popen"})),
        ("alias", lambda meta: meta.update(policy=dict(popen, **{"class": "jax._src.environment_info:subprocess.Popen"}))),
        ("not a policy", lambda meta: meta.update(policy={"class": "jes.config:ESConfig", "fields": {}})),
    ):
        path = _rewrite_meta(saved, str(tmp_path / f"{name}.ckpt"), change)
        with pytest.raises(checkpoint.CheckpointError, match="cannot rebuild the policy"):
            checkpoint.load(path)
        with pytest.raises(checkpoint.CheckpointError, match="cannot rebuild the policy"):
            checkpoint.load(path, allow_modules=["mypkg"])
    assert not target.exists()


@pytest.mark.parametrize("change, message", [
    (lambda meta: meta.update(policy={"class": "jes.policies:MLPPolicy",  # a registered layer refusing its fields
                                      "fields": {"activation": {"class": "flax.linen:Dense", "fields": {}}}}),
     r"policy.activation: Dense\(\.\.\.\) failed: TypeError: .*'features'"),
    (lambda meta: meta.update(policy={"class": "jes.policies:MLPPolicy",  # a registered policy refusing its fields
                                      "fields": {"parent": {"class": "flax.linen:Dense", "fields": {"features": 2}}}}),
     r"policy: MLPPolicy\(\.\.\.\) failed: AssertionError"),
    (lambda meta: meta.update(policy={"class": "jes.strategies.pgpe:PGPE", "fields": {}}),  # registered, not a policy
     r"jes.strategies.pgpe:PGPE is not a flax.linen.Module subclass"),
], ids=["layer-fields", "policy-fields", "role"])
def test_a_registered_class_that_does_not_build_is_not_told_to_allow_its_module(saved, tmp_path, change, message):
    """Allowing a module admits a class outside the registry; it cannot mend a registered class's fields or role, so
    those errors no longer end with "Import your policy's module first or pass allow_modules=[...]"."""
    path = _rewrite_meta(saved, str(tmp_path / "refused.ckpt"), change)
    with pytest.raises(checkpoint.CheckpointError, match=message) as raised:
        checkpoint.load(path)
    text = str(raised.value)
    assert "cannot rebuild the policy" in text and path in text
    assert "allow_modules" not in text and "--allow-module" not in text and "Import your policy" not in text, text
    assert "restore_state(trainer)" in text  # a trainer built by hand still takes the file's state


@pytest.mark.parametrize("change, change_content, message", [
    (lambda meta: meta.update(generation=2 ** 31 - 1), None,
     r"its meta records generation 2147483647, its state is at generation 2"),
    (lambda meta: meta.update(key_impl="rbg"), None,
     r"its meta records key_impl 'rbg' \(keys of 4 uint32\), its run key holds 2"),
    (lambda meta: meta.update(es_key_impl="unsafe_rbg"), None,
     r"its meta records es_key_impl 'unsafe_rbg' \(keys of 4 uint32\), its state's es_key holds 2"),
    (lambda meta: None, lambda content: content["best"].update(generation=np.asarray(3, np.int64)),
     r"its best member is of generation 3, after its run's generation 2"),
], ids=["generation", "key_impl", "es_key_impl", "best-generation"])
def test_a_meta_that_contradicts_its_state_is_an_inconsistent_file(saved, tmp_path, change, change_content, message):
    """The meta repeats some of the state (generation, key implementations); nothing compared them, so a meta
    generation of 2**31-1 over a state at generation 2 loaded and `jes eval` printed "generation 2147483647"."""
    path = _rewrite_meta(saved, str(tmp_path / "edited.ckpt"), change, change_content)
    with pytest.raises(checkpoint.CheckpointError, match=message) as raised:
        checkpoint.read(path)
    assert f"checkpoint {path} is inconsistent" in str(raised.value)
    assert "edited or is corrupt" in str(raised.value)
    assert checkpoint.read(saved).generation == 2


def test_the_key_shapes_checkpoints_check_are_jaxs():
    for impl, size in checkpoint.KEY_SIZES.items():
        assert jax.random.key_data(jax.random.key(0, impl=impl)).shape == (size,)


@pytest.mark.parametrize("where, value, message", [
    ("obs_count", np.asarray(-5.0, np.float32), r"state.obs_count is -5.0"),
    ("obs_count", np.asarray(np.nan, np.float32), r"state.obs_count is nan"),
    ("obs_count", np.asarray(0.0, np.float32), r"state.obs_count is 0.0"),
    ("best.0", np.asarray(-1.0, np.float32), r"best.obs_stats\[0\] \(its obs_count\) is -1.0"),
    ("obs_sum", np.full(4, np.inf, np.float32), r"state.obs_sum holds 4 non-finite value"),
    ("obs_sumsq", np.asarray([0.0, np.nan, 1.0, 1.0], np.float32), r"state.obs_sumsq holds 1 non-finite value"),
    ("best.2", np.full(4, -np.inf, np.float32), r"best.obs_stats\[2\] \(its obs_sumsq\) holds 4 non-finite"),
])
def test_invalid_observation_statistics_in_a_checkpoint_are_refused_or_said(saved, tmp_path, where, value, message):
    """A checkpoint's normaliser statistics are counts and sums of observations. A count that is not positive and
    finite normalises every observation to NaN, and no run writes it: such a file was edited or is corrupt, refused.
    Sums that are not finite a run whose observations left float32's range writes itself: the file loads, with a
    warning (a user's run is never refused its own checkpoint)."""
    def change(content):
        assert "obs_stats" in content["best"]
        if where.startswith("best."):
            content["best"]["obs_stats"][where[5:]] = value
        else:
            content["state"][where] = value

    path = _rewrite_meta(saved, str(tmp_path / "stats.ckpt"), lambda meta: None, change)
    if where in ("obs_count", "best.0"):  # the count
        with pytest.raises(checkpoint.CheckpointError, match=message) as raised:
            checkpoint.read(path)
        assert path in str(raised.value)
    else:
        with pytest.warns(UserWarning, match=message):
            checkpoint.read(path)


def test_a_checkpoint_with_non_finite_parameters_loads_with_a_warning(saved, trainer, tmp_path):
    """A diverged run's file is still data someone may want to inspect: it loads, and says what it holds."""
    def change(content):
        mean = np.array(content["state"]["strategy"]["mean"])
        mean[:3] = [np.nan, np.inf, -np.inf]
        content["state"]["strategy"]["mean"] = mean
        best = np.array(content["best"]["flat_params"])
        best[0] = np.nan
        content["best"]["flat_params"] = best

    path = _rewrite_meta(saved, str(tmp_path / "diverged.ckpt"), lambda meta: None, change)
    with pytest.warns(UserWarning) as caught:
        state = checkpoint.read(path).restore_state(trainer)
    messages = [str(w.message) for w in caught]
    assert any(f"checkpoint {path}: 3 of {trainer.num_params} values of its centre are not finite" in m
               for m in messages), messages
    assert any(f"1 of {trainer.num_params} values of its best member's parameters are not finite" in m
               for m in messages), messages
    assert np.isnan(np.asarray(state.strategy.mean)[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checkpoint.read(saved)  # a finite file says nothing


def test_a_checkpoint_naming_an_env_parameter_nan_is_refused(saved, tmp_path):
    path = _rewrite_meta(saved, str(tmp_path / "nan-env.ckpt"),
                         lambda meta: meta.update(env_name="CartPole-v1?gravity=nan"))
    with pytest.raises(checkpoint.CheckpointError, match=r"env name 'CartPole-v1\?gravity=nan' sets gravity=nan"):
        checkpoint.read(path)


def test_format_1_checkpoints_still_load_and_resume(saved, trainer, tmp_path):
    def as_format_1(meta):
        meta["version"] = 1
        meta["policy"] = {"class": "jes.policies:MLPPolicy",
                          "fields": {"hidden_sizes": [3], "activation": {"callable": "jax.numpy:tanh"}}}

    path = _rewrite_meta(saved, str(tmp_path / "v1.ckpt"), as_format_1)
    policy = checkpoint.read(path).policy()
    assert policy.hidden_sizes == (3,) and policy.activation is jax.numpy.tanh
    old = _rewrite_meta(saved, str(tmp_path / "v1gru.ckpt"), lambda meta: meta.update(version=1))
    checkpoint.read(old).restore_state(trainer)  # a format-1 description matches today's trainer


def test_user_policy_modules_load_when_imported_or_allowed(trainer, tmp_path, monkeypatch):
    module = tmp_path / "jes_test_user_policies.py"
    module.write_text("import flax.linen as nn\n\nclass Tiny(nn.Module):\n    num_outputs: int = 2\n\n"
                      "    @nn.compact\n    def __call__(self, x):\n        return nn.Dense(self.num_outputs)(x)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import jes_test_user_policies

    path = str(tmp_path / "user.ckpt")
    user_trainer = jes.Trainer(jes_test_user_policies.Tiny(), "CartPole-v1", "adam", jes.ESConfig(**SMALL))
    checkpoint.save(path, user_trainer, user_trainer.init_state(1))
    assert type(checkpoint.read(path).policy()).__name__ == "Tiny"  # imported by this program: trusted
    monkeypatch.delitem(sys.modules, "jes_test_user_policies")
    with pytest.raises(checkpoint.CheckpointError, match="allow_modules"):
        checkpoint.read(path).policy()  # never imported on the file's say-so
    assert "jes_test_user_policies" not in sys.modules
    assert type(checkpoint.read(path).policy(allow_modules=["jes_test_user_policies"])).__name__ == "Tiny"


def test_interrupt_inside_mkstemp_leaves_no_temp_file(trainer, saved, tmp_path, monkeypatch):
    """Ctrl-C right after mkstemp created the file (before it returned its name) must not leave it behind."""
    path = str(tmp_path / "run.ckpt")
    with open(saved, "rb") as src:
        good = src.read()
    with open(path, "wb") as dst:
        dst.write(good)
    real_mkstemp = checkpoint.tempfile.mkstemp

    def interrupted_mkstemp(*args, **kwargs):
        fd, name = real_mkstemp(*args, **kwargs)
        os.close(fd)
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.tempfile, "mkstemp", interrupted_mkstemp)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(path, trainer, trainer.init_state(9), {}, key=9)
    assert os.listdir(tmp_path) == ["run.ckpt"]
    with open(path, "rb") as f:
        assert f.read() == good


def test_a_checkpoint_gets_the_permissions_a_plain_open_gives(trainer, saved, tmp_path):
    """Checkpoints were written 0600 (mkstemp's mode) where event files and .policy files follow the umask: a shared
    run's group could not `jes eval` or resume it. A new file follows the umask; a file saved over keeps its mode
    (a deliberate chmod 600, or 644, stayed only until the next save)."""
    previous = os.umask(0o022)
    try:
        path = str(tmp_path / "run.ckpt")
        ckpt = checkpoint.read(saved)
        run(trainer, ckpt.restore_state(trainer), key=5, num_generations=3, checkpoint_path=path, history=ckpt.history,
            best=ckpt.best)
        assert oct(os.stat(path).st_mode & 0o777) == oct(0o644)
        os.chmod(path, 0o600)
        os.umask(0o002)
        checkpoint.save(path, trainer, trainer.init_state(9), {}, key=9)
        assert oct(os.stat(path).st_mode & 0o777) == oct(0o600)  # kept
        os.chmod(path, 0o644)
        os.umask(0o077)
        checkpoint.save(path, trainer, trainer.init_state(9), {}, key=9)
        assert oct(os.stat(path).st_mode & 0o777) == oct(0o644)  # kept
        os.umask(0o002)
        other = str(tmp_path / "new.ckpt")
        checkpoint.save(other, trainer, trainer.init_state(9), {}, key=9)
        assert oct(os.stat(other).st_mode & 0o777) == oct(0o664)  # a new file: 0666 & ~umask
        assert os.umask(0o002) == 0o002  # saves read the umask, never set it
    finally:
        os.umask(previous)


def test_save_sweeps_temp_files_left_by_a_killed_save(trainer, tmp_path):
    """A save killed with SIGKILL leaves its temp file; the next save removes it (and nothing else)."""
    path = str(tmp_path / "run.ckpt")
    stale = tmp_path / ".run.ckpt.k1ll3d.tmp"
    stale.write_bytes(b"half a checkpoint")
    old = os.stat(stale).st_mtime - 3600
    os.utime(stale, (old, old))
    other = tmp_path / ".other.ckpt.abc.tmp"  # another checkpoint's temp file is not ours to remove
    other.write_bytes(b"x")
    os.utime(other, (old, old))
    checkpoint.save(path, trainer, trainer.init_state(9), {}, key=9)
    assert sorted(os.listdir(tmp_path)) == [".other.ckpt.abc.tmp", "run.ckpt"]
    assert checkpoint.read(path).generation == 0


MAIN_POLICY_SCRIPT = """
import sys
import flax.linen as nn, jax.numpy as jnp, numpy as np
import jes

class Linear(nn.Module):  # the policies guide's example, defined in the script itself (__main__), as in a notebook
    num_outputs: int = 2

    @nn.compact
    def __call__(self, obs):
        return nn.Dense(self.num_outputs)(jnp.ravel(obs))

kw = dict(num_members=16, eval_episodes=2, progress=False)
first = jes.train(Linear(), "CartPole-v1", "adam", num_generations=2, log_dir=sys.argv[1], **kw)
resumed = jes.train(Linear(), "CartPole-v1", "adam", num_generations=3, resume=first.checkpoint_path, **kw)
whole = jes.train(Linear(), "CartPole-v1", "adam", num_generations=3, log_dir=None, **kw)
assert np.array_equal(resumed.flat_params, whole.flat_params)
print("checkpoint", first.checkpoint_path)
"""


def test_a_policy_defined_in_main_keeps_its_checkpoints(tmp_path):
    """A policy class of the script (or notebook) itself made the first checkpoint save raise, after the run: the
    run was lost. Its checkpoints are written and resume from that script; other programs get an error saying why."""
    script = tmp_path / "train_it.py"
    script.write_text(MAIN_POLICY_SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True,
                         timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0 and "checkpoint " in out.stdout, out.stderr
    ckpt = str(tmp_path / "run" / "checkpoint.ckpt")
    with pytest.raises(checkpoint.CheckpointError, match=r"its class Linear was defined in the script or notebook that "
                                                         r"trained it \(__main__\), which no other program can import"):
        checkpoint.read(ckpt).build_trainer()


def test_a_checkpoint_with_a_setting_its_strategy_ignores_resumes_with_a_warning(tmp_path, capsys):
    """A jes that took learning_rate for snes silently wrote it into the checkpoint; `jes train --resume` takes the
    config from there, so refusing it would leave the run impossible to continue."""
    snes = jes.Trainer(POLICY, "CartPole-v1", None, jes.ESConfig(**SMALL), strategy="snes")
    clean = checkpoint.save(str(tmp_path / "snes.ckpt"), snes, snes.init_state(1), key=1)
    old = _rewrite_meta(clean, str(tmp_path / "old.ckpt"), lambda meta: meta["config"].update(learning_rate=0.05))
    with pytest.warns(UserWarning, match=r"learning_rate=0.05 would be ignored by strategy 'snes'.*\(the resumed run "
                                         r"goes on as it ran, without them\)"):
        assert cli.main(["train", "--resume", old, "--generations", "1", "--log-dir", "none", "--no-progress"]) == 0


def test_a_save_never_removes_another_live_writers_temp_file(trainer, tmp_path):
    """Two runs saving to one path: the sweep of leftovers removed the other's save in flight, whose rename then
    failed with a bare ENOENT that ended its run. Only the temp files of processes that are gone are removed."""
    path = str(tmp_path / "run.ckpt")
    host = socket.gethostname().replace(".", "_")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        old = time.time() - 3600
        names = {"live": f".run.ckpt.{sleeper.pid}@{host}.abc.tmp", "dead": f".run.ckpt.{dead.pid}@{host}.def.tmp",
                 "foreign": ".run.ckpt.123@another_host.ghi.tmp",
                 "other path": f".run.ckpt.bak.{dead.pid}@{host}.jkl.tmp",  # run.ckpt.bak's, not run.ckpt's
                 "other path, older jes": ".run.ckpt.bak.mno.tmp"}
        for name in names.values():
            (tmp_path / name).write_bytes(b"half a checkpoint")
            os.utime(tmp_path / name, (old, old))
        checkpoint.save(path, trainer, trainer.init_state(9), {}, key=9)
        kept = [names[k] for k in ("live", "other path", "other path, older jes")]
        assert sorted(os.listdir(tmp_path)) == sorted([*kept, names["foreign"], "run.ckpt"])
        ancient = time.time() - checkpoint.FOREIGN_TEMP_AGE - 60  # another host's, a day old: stale
        os.utime(tmp_path / names["foreign"], (ancient, ancient))
        checkpoint.save(path, trainer, trainer.init_state(9), {}, key=9)
        assert sorted(os.listdir(tmp_path)) == sorted([*kept, "run.ckpt"])
    finally:
        sleeper.kill()
        sleeper.wait()


def test_format_2_pgpe_checkpoints_keep_their_clipup_step(tmp_path):
    """PGPE's default ClipUp step changed in format 3 (0.15 -> 0.4 x the search radius): an older file keeps 0.15."""
    pgpe = jes.Trainer(POLICY, "CartPole-v1", None, jes.ESConfig(**SMALL), strategy="pgpe")
    new = str(tmp_path / "pgpe.ckpt")
    checkpoint.save(new, pgpe, pgpe.init_state(1))
    old = _rewrite_meta(new, str(tmp_path / "pgpe-v2.ckpt"), lambda meta: meta.update(version=2))
    radius_step = 0.4 * 0.2 * pgpe.num_params ** 0.5

    def step(t):
        return float(t.ctx.optimizer.init(jax.numpy.zeros(t.num_params)).hyperparams["learning_rate"])

    assert step(pgpe) == pytest.approx(radius_step)
    assert checkpoint.read(new).meta["strategy"]["fields"]["center_lr"] is None
    assert step(checkpoint.read(new).build_trainer()) == pytest.approx(radius_step)
    assert checkpoint.read(old).meta["strategy"]["fields"]["center_lr"] == 0.15
    assert step(checkpoint.read(old).build_trainer()) == pytest.approx(0.15)
    with pytest.raises(checkpoint.CheckpointError, match="center_lr"):
        checkpoint.read(old).check_compatible(pgpe)  # today's default would silently change the resumed run
    checkpoint.read(old).check_compatible(
        jes.Trainer(POLICY, "CartPole-v1", None, jes.ESConfig(**SMALL), strategy=jes.strategies.PGPE(center_lr=0.15)))


@pytest.mark.parametrize("version, name, old_fields, file_fields", [
    # Format 4 changed sep-CMA-ES's policy defaults (mean_lr 10 -> 10/1.5, sigma 1.5 x noise_std, CSA without
    # p_sigma's start-up bias); a format-3 file named neither new field and left mean_lr at its default.
    (4, "sep_cma_es", {"mean_lr": 10.0, "sigma_scale": 1.0, "unbiased_csa": False}, {"sigma_init": None, "mean_lr": None}),
    # Format 5 changed SNES's (mean_lr 10 -> 20, log utilities -> linear ranks); a format-4 file had no
    # linear_utilities field.
    (5, "snes", {"mean_lr": 10.0, "linear_utilities": False}, {"mean_lr": None, "sigma_lr": None, "sigma_init": None}),
])
def test_older_checkpoints_keep_their_strategys_policy_defaults(tmp_path, version, name, old_fields, file_fields):
    """A file older than a change of a strategy's policy defaults resumes with the old ones, bit for bit, and
    today's defaults are refused; a file of the changing format keeps them unset and rebuilds today's strategy."""
    config = jes.ESConfig(**SMALL)
    cls = type(jes.strategies.get(name))
    old_defaults = cls(**old_fields)
    before = jes.Trainer(POLICY, "CartPole-v1", None, config, strategy=old_defaults)  # what an older run did
    full = run(before, before.init_state(3), key=3)
    new = str(tmp_path / "new.ckpt")
    run(before, before.init_state(3), key=3, num_generations=2, checkpoint_path=new)

    def as_older(meta):
        meta["version"] = version - 1
        meta["strategy"]["fields"] = dict(file_fields)

    old = _rewrite_meta(new, str(tmp_path / "old.ckpt"), as_older)
    assert checkpoint.read(old).meta["strategy"]["fields"] == {**file_fields, **old_fields}
    today = jes.Trainer(POLICY, "CartPole-v1", None, config, strategy=name)
    with pytest.raises(checkpoint.CheckpointError, match=".*".join(old_fields)):
        checkpoint.read(old).check_compatible(today)  # today's defaults would silently change the resumed run
    rebuilt, state, ckpt = checkpoint.load(old)
    assert rebuilt.strategy == old_defaults
    resumed = run(rebuilt, state, key=ckpt.key, history=ckpt.history, best=None)
    np.testing.assert_array_equal(resumed.flat_params, full.flat_params)
    np.testing.assert_array_equal(resumed.history["pop_mean"], full.history["pop_mean"])
    path = str(tmp_path / "today.ckpt")
    checkpoint.save(path, today, today.init_state(1))
    fields = checkpoint.read(path).meta["strategy"]["fields"]
    assert all(fields[f] is None for f in old_fields)
    assert checkpoint.read(path).build_trainer().strategy == cls()


@dataclasses.dataclass(frozen=True)
class Top4(jes.strategies.OpenAIES):
    """A user's own fitness shaping that keeps OpenAI-ES's name: another algorithm under the built-in's name."""

    def weights(self, ctx, state, fitness):
        top = jax.numpy.where(jax.numpy.argsort(jax.numpy.argsort(-fitness)) < 4, 1.0, 0.0)
        return top - top.mean()


@dataclasses.dataclass(frozen=True)
class TopK(jes.strategies.OpenAIES):
    """A strategy of the user's own, under a name of its own that jes does not register."""

    name = "topk_es"
    k: int = 4

    def weights(self, ctx, state, fitness):
        top = jax.numpy.where(jax.numpy.argsort(jax.numpy.argsort(-fitness)) < self.k, 1.0, 0.0)
        return top - top.mean()


def _class_of(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def test_a_strategy_class_of_your_own_is_recorded_and_a_resume_with_another_class_is_refused(tmp_path):
    """A subclass keeping its parent's name was recorded as the built-in ({'name': 'openai_es', 'fields': {}}): a
    resume with the built-in (or the reverse) ran two algorithms in one run without a word."""
    config, policy = jes.ESConfig(**SMALL), jes.MLPPolicy((4,))
    own, builtin = (jes.Trainer(policy, "CartPole-v1", "adam", config, strategy=s) for s in (Top4(), "openai_es"))
    paths = {}
    for label, trainer in (("own", own), ("builtin", builtin)):
        paths[label] = checkpoint.save(str(tmp_path / f"{label}.ckpt"), trainer, trainer.init_state(1))
    assert checkpoint.read(paths["own"]).meta["strategy"] == {"name": "openai_es", "fields": {},
                                                             "class": _class_of(Top4)}
    # A registered strategy's description is what files recorded before classes were: no "class" key
    for name in jes.strategies.names():
        described = checkpoint.describe_strategy(jes.strategies.get(name))
        assert list(described) == ["name", "fields"] and described["name"] == name
    for file, other in (("own", builtin), ("builtin", own)):
        with pytest.raises(checkpoint.CheckpointError, match=re.escape(_class_of(Top4))) as refused:
            checkpoint.read(paths[file]).check_compatible(other)
        assert "jes.strategies.openai_es:OpenAIES" in str(refused.value) and "name of its own" in str(refused.value)
    checkpoint.read(paths["own"]).check_compatible(own)  # the same class resumes
    # jes.train refuses it before it compiles anything (the tester's repro)
    with pytest.raises(checkpoint.CheckpointError, match="strategy class: checkpoint ran"):
        jes.train(policy, "CartPole-v1", "adam", resume=paths["own"], log_dir=None, progress=False, **SMALL)


def test_a_checkpoint_from_before_strategy_classes_warns_that_it_cannot_check_a_class_of_your_own(tmp_path):
    """A format-8 file names the strategy only: it may have run your subclass (which was recorded as its parent), so
    resuming it with one is warned of, not refused; with the registered strategy it resumes as before, silently."""
    config, policy = jes.ESConfig(**SMALL), jes.MLPPolicy((4,))
    own, builtin = (jes.Trainer(policy, "CartPole-v1", "adam", config, strategy=s) for s in (Top4(), "openai_es"))
    new = checkpoint.save(str(tmp_path / "own.ckpt"), own, own.init_state(1))

    def as_format_8(meta):
        meta["version"] = 8
        del meta["strategy"]["class"]

    old = checkpoint.read(_rewrite_meta(new, str(tmp_path / "old.ckpt"), as_format_8))
    with pytest.warns(UserWarning, match=f"before jes recorded a strategy's class.*{re.escape(_class_of(Top4))}"):
        old.check_compatible(own)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        old.check_compatible(builtin)
    with pytest.raises(checkpoint.CheckpointError, match="topk_es"):  # another name is refused, as it was
        old.check_compatible(jes.Trainer(policy, "CartPole-v1", "adam", config, strategy=TopK()))


def test_a_checkpoint_of_your_own_strategy_evaluates_its_centre_and_says_how_to_restore_it(tmp_path):
    """load / centre_for_evaluation failed with "unknown strategy 'topk_es'" although evaluating the centre does not
    need the strategy; load (which restores the strategy's state) now says how to restore it into a trainer."""
    trainer = jes.Trainer(jes.MLPPolicy((4,)), "CartPole-v1", "adam", jes.ESConfig(**SMALL), strategy=TopK())
    path = str(tmp_path / "topk.ckpt")
    run(trainer, trainer.init_state(2), key=2, num_generations=1, checkpoint_path=path)
    ckpt = checkpoint.read(path)
    assert ckpt.meta["strategy"] == {"name": "topk_es", "fields": {"k": 4}, "class": _class_of(TopK)}
    assert not ckpt.rebuilds_its_strategy()
    for rebuild in (checkpoint.load, lambda p: checkpoint.read(p).build_trainer()):
        with pytest.raises(checkpoint.CheckpointError, match=r"unknown strategy|class of your own") as refused:
            rebuild(path)
        assert "jes.checkpoint.read(path).restore_state(" in str(refused.value), refused.value
    stand_in, centre = ckpt.centre_for_evaluation()
    state = ckpt.restore_state(trainer)  # the run's own state, restored into the user's trainer
    key = jes.generation.as_key(7)
    mine, theirs = (np.asarray(t.evaluate_centre(s, 4, key)[0]) for t, s in ((stand_in, centre), (trainer, state)))
    assert mine.tobytes() == theirs.tobytes()
    assert np.asarray(centre.params).tobytes() == np.asarray(state.params).tobytes()
    assert int(centre.generation) == 1


@dataclasses.dataclass(frozen=True)
class AlwaysNormalises(jes.strategies.OpenAIES):
    """A strategy of the user's own that normalises observations whatever the config asks (uses_obs_norm)."""

    name = "normalising_es"

    def uses_obs_norm(self, requested):
        return True


def test_the_stand_in_of_your_own_strategy_normalises_observations_as_the_run_did(tmp_path):
    """Whether a run normalises is its strategy's say: the stand-in (OpenAI-ES, which follows the config) evaluated
    a run that normalised against normalize_observations=False without the file's statistics, other returns."""
    config = jes.ESConfig(**dict(SMALL, normalize_observations=False))
    trainer = jes.Trainer(jes.MLPPolicy((4,)), "Pendulum-v1", "adam", config, strategy=AlwaysNormalises())
    path = str(tmp_path / "normalising.ckpt")
    run(trainer, trainer.init_state(3), key=3, num_generations=1, checkpoint_path=path)
    ckpt = checkpoint.read(path)
    stand_in, centre = ckpt.centre_for_evaluation()
    key = jes.generation.as_key(5)
    mine, theirs = (np.asarray(t.evaluate_centre(s, 3, key)[0])
                    for t, s in ((stand_in, centre), (trainer, ckpt.restore_state(trainer))))
    assert stand_in.normalize_observations and mine.tobytes() == theirs.tobytes(), (mine, theirs)


def test_a_file_naming_a_strategy_class_never_imports_or_builds_it(saved, tmp_path):
    """A file names no code: a recorded strategy class is compared, never imported or constructed."""
    module = "jes_test_never_imported_strategies"
    for label, cls in (("unimported", f"{module}:Evil"), ("imported", "subprocess:Popen")):
        path = _rewrite_meta(saved, str(tmp_path / f"{label}.ckpt"),
                             lambda meta: meta["strategy"].update({"class": cls}))
        ckpt = checkpoint.read(path)  # the schema takes the key
        with pytest.raises(checkpoint.CheckpointError, match="a class of your own"):
            checkpoint.load(path)
        trainer, _ = ckpt.centre_for_evaluation()  # evaluated with a stand-in strategy
        assert type(trainer.strategy) is jes.strategies.OpenAIES
    assert module not in sys.modules
    bad = _rewrite_meta(saved, str(tmp_path / "bad.ckpt"), lambda meta: meta["strategy"].update({"class": 5}))
    with pytest.raises(checkpoint.CheckpointError, match="class"):
        checkpoint.read(bad)


SMALL_RUN = dict(num_members=16, chunk_size=8, num_generations=3, eval_episodes=4, eval_every=2)


def test_resuming_a_run_that_already_has_all_its_generations_says_there_is_nothing_left(tmp_path):
    ckpt = str(tmp_path / "c.ckpt")
    jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=0, checkpoint_path=ckpt, log_dir=None, progress=False,
              **SMALL_RUN)
    with pytest.warns(UserWarning, match=r"at generation 3, and num_generations=2: there is nothing left to train"):
        result = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=ckpt, log_dir=None, progress=False,
                           **dict(SMALL_RUN, num_generations=2))
    assert result.history["pop_mean"].shape[0] == 3


def test_a_refused_resume_is_refused_before_the_step_compiles(tmp_path, monkeypatch, capsys):
    """train() started compiling the step before it read the checkpoint: a refused resume (`jes train --resume ...
    --noise-std 0.5`) waited for a whole compile first, saying "jes: stopping once the generation step's compile
    ... has finished", which read as if the user had interrupted it."""
    path = str(tmp_path / "run.ckpt")
    jes.train(jes.MLPPolicy((8,)), "CartPole-v1", "adam", num_members=8, num_generations=1, eval_episodes=2,
              log_dir=None, progress=False, checkpoint_path=path)
    capsys.readouterr()
    trainers, start = [], jes.Trainer.start_compiling_step
    monkeypatch.setattr(jes.Trainer, "start_compiling_step", lambda self: (start(self), trainers.append(self)))
    for changed in (dict(noise_std=0.5), dict(num_members=16)):
        with pytest.raises(checkpoint.CheckpointError, match="does not match this run"):
            jes.train(jes.MLPPolicy((8,)), "CartPole-v1", "adam", **dict(dict(num_members=8, num_generations=2,
                      eval_episodes=2), **changed), log_dir=None, progress=False, resume=path)
    assert trainers == [] and "compile" not in capsys.readouterr().err


@pytest.mark.hard_timeout(300)
def test_an_error_while_the_step_compiles_is_not_reported_as_an_interrupt(tmp_path, monkeypatch, capsys):
    """An error raised while the step still compiles waits for the compile (XLA cannot be interrupted: a daemon
    thread still compiling when the interpreter finalises aborts it, status 134) and says so, as an error, not as
    the stop an interrupt asked for."""
    import threading

    from jes.compiled import CompiledPrograms

    compile_step, finish, waiting = CompiledPrograms._compile_step, CompiledPrograms.finish_compiling, threading.Event()

    def slow_compile(self, *args, **kwargs):  # the background compile: still running when the error comes
        if threading.current_thread().name == "jes-compile-step":
            waiting.wait(120)
            time.sleep(0.5)
        return compile_step(self, *args, **kwargs)

    def finish_compiling(self):
        waiting.set()
        return finish(self)

    monkeypatch.setattr(CompiledPrograms, "_compile_step", slow_compile)
    monkeypatch.setattr(CompiledPrograms, "finish_compiling", finish_compiling)
    trainers, start = [], jes.Trainer.start_compiling_step
    monkeypatch.setattr(jes.Trainer, "start_compiling_step", lambda self: (start(self), trainers.append(self)))

    def full_disk(self, *args, **kwargs):  # the loggers are made after the compile began (another run's checkpoint
        raise OSError(28, "No space left on device")  # is refused before it: test_logging.py)

    monkeypatch.setattr(jes.logging.TensorBoardLogger, "__init__", full_disk)
    with pytest.raises(OSError, match="No space left on device"):  # after the compile began
        jes.train(jes.MLPPolicy((8,)), "CartPole-v1", "adam", key=1, num_members=8, num_generations=1,
                  eval_episodes=2, log_dir=str(tmp_path / "run"), progress=False)
    err = capsys.readouterr().err
    assert "jes: waiting for the generation step's compile, started in the background, to finish before reporting " \
           "the error" in err and "stopping" not in err, err
    assert trainers[0]._compiling[0].is_set()  # the compile thread's done event: nothing left compiling


def test_a_pgpe_checkpoint_with_antithetic_false_resumes_with_a_warning(tmp_path):
    """A jes that took antithetic=False for pgpe (and ran mirrored pairs anyway) recorded it; resuming warns."""
    pgpe = jes.Trainer(POLICY, "CartPole-v1", None, jes.ESConfig(**SMALL), strategy="pgpe")
    clean = checkpoint.save(str(tmp_path / "pgpe.ckpt"), pgpe, pgpe.init_state(1), key=1)
    old = _rewrite_meta(clean, str(tmp_path / "old.ckpt"), lambda meta: meta["config"].update(antithetic=False))
    with pytest.warns(UserWarning, match=r"antithetic=False would be ignored by strategy 'pgpe': it evaluates mirrored "
                                         r"pairs by definition.*\(the resumed run goes on as it ran"):
        jes.train(POLICY, "CartPole-v1", strategy="pgpe", config=checkpoint.read(old).config(), resume=old,
                  num_generations=1, log_dir=None, progress=False)


def test_resuming_with_an_optax_object_or_a_schedule_warns_that_it_is_unchecked(tmp_path):
    """An optax object is recorded by its type's name and a schedule by its field's name, so another one resumed
    silently; each warns once, naming it, and an optimizer given by name (compared already) does not."""
    import optax

    def resumed(optimizer, **config):
        path = str(tmp_path / f"run{len(os.listdir(tmp_path))}.ckpt")
        jes.train(POLICY, "CartPole-v1", optimizer, checkpoint_path=path, log_dir=None, progress=False,
                  **SMALL | {"num_generations": 1} | config)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            jes.train(POLICY, "CartPole-v1", optimizer, resume=path, log_dir=None, progress=False,
                      **SMALL | {"num_generations": 2} | config)
        return [str(w.message) for w in caught if "cannot check" in str(w.message)]

    optax_object = resumed(optax.adam(0.1))
    assert len(optax_object) == 1 and "optimizer=GradientTransformationExtraArgs (an optax object)" in optax_object[0]
    assert "continues with the checkpoint's optimizer state" in optax_object[0]
    schedule = resumed("adam", learning_rate=optax.linear_schedule(0.1, 0.01, 10))
    assert len(schedule) == 1 and "learning_rate (a schedule)" in schedule[0]
    assert resumed("adam") == []


def test_a_schedule_left_out_or_added_on_resume_and_a_folder_as_checkpoint_say_what_to_do(tmp_path, capsys):
    """A trial: a run with a learning_rate schedule resumed with a number (or none, or the other way round) was refused
    with "schedules: checkpoint has ['learning_rate'], this run has []" next to "a resumed run may change
    learning_rate"; --checkpoint naming a folder said "already holds a file this run did not write ... delete that
    file"; jes eval named the optimizer of a run with an optax object or a schedule "sgd"."""
    import optax

    from jes import cli

    path = str(tmp_path / "sch.ckpt")
    schedule = optax.linear_schedule(0.1, 0.01, 10)
    run = dict(log_dir=None, progress=False, **SMALL | {"num_generations": 1})
    jes.train(POLICY, "CartPole-v1", "adam", checkpoint_path=path, learning_rate=schedule, **run)
    for given in ({}, {"learning_rate": 0.2}):
        with pytest.raises(jes.checkpoint.CheckpointError,
                           match=r"config.learning_rate: the checkpoint's run had a schedule, this run .*pass it again, "
                                 r"jes.train\(..., learning_rate=your_schedule, resume=path\)"):
            jes.train(POLICY, "CartPole-v1", "adam", resume=path, **run | given)
    plain = str(tmp_path / "plain.ckpt")
    jes.train(POLICY, "CartPole-v1", "adam", checkpoint_path=plain, **run)
    with pytest.raises(jes.checkpoint.CheckpointError, match=r"config.noise_std: the checkpoint's run had 0.\d+, this "
                                                            r"run a schedule"):
        jes.train(POLICY, "CartPole-v1", "adam", resume=plain, noise_std=optax.linear_schedule(0.1, 0.05, 5), **run)
    (tmp_path / "folder").mkdir()
    with pytest.raises(FileExistsError, match=r"checkpoint '.*folder' is a folder, not a checkpoint file: give "
                                              r"checkpoint_path the file's path"):
        jes.train(POLICY, "CartPole-v1", "adam", **dict(run, checkpoint_path=str(tmp_path / "folder")))
    chained = str(tmp_path / "chained.ckpt")
    jes.train(POLICY, "CartPole-v1", optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.1)),
              checkpoint_path=chained, **run)
    for ckpt, name in ((path, "adam"), (chained, "GradientTransformationExtraArgs")):
        assert cli.main(["eval", ckpt, "--episodes", "2"]) == 0
        out = capsys.readouterr().out
        assert f", {name}, generation 1:" in out and "sgd" not in out, out


def test_an_optimizers_alias_or_case_resumes_and_numpy_scalars_are_numbers(tmp_path):
    """Resuming an "amsgrad" run with "adamm" (its alias) or "AMSGrad" was refused as another optimizer; a numpy
    float noise_std / learning_rate was "not a positive number"; strategy="adam" was an unknown strategy, no hint."""
    ckpt = str(tmp_path / "c.ckpt")
    common = dict(log_dir=None, progress=False, **dict(SMALL_RUN, num_generations=2))
    jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "amsgrad", key=0, checkpoint_path=ckpt, **common)
    for spelling in ("adamm", "AMSGrad"):
        copy = str(tmp_path / f"{spelling}.ckpt")
        shutil.copy(ckpt, copy)
        resumed = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", spelling, resume=copy, checkpoint_path=copy,
                            **dict(common, num_generations=3))
        assert resumed.history["pop_mean"].shape[0] == 3
    config = jes.ESConfig(noise_std=np.float32(0.1), learning_rate=np.float64(0.05), weight_decay=np.float32(0.5))
    assert type(config.noise_std) is float and config.noise_std == np.float32(0.1) and type(config.weight_decay) is float
    with pytest.raises(ValueError, match=r"'adam' is an optimizer: pass it as optimizer="):
        jes.strategies.get("adam")


def test_a_new_learning_rate_on_resume_names_the_default_the_run_used(tmp_path):
    """The warning said "the run used None" for a run on its optimizer's default rate."""
    ckpt = str(tmp_path / "c.ckpt")
    common = dict(log_dir=None, progress=False, **dict(SMALL_RUN, num_generations=1))
    jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=0, checkpoint_path=ckpt, **common)
    default = jes.optimizers.DEFAULT_LEARNING_RATES["adam"]
    with pytest.warns(UserWarning, match=rf"with learning_rate=0.01 \(the run used {default:.4g}, its default\)"):
        jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=ckpt, **dict(common, num_generations=2,
                                                                                    learning_rate=0.01))


def test_a_resume_given_no_learning_rate_goes_on_at_its_checkpoints(tmp_path):
    """From Python, a resume without learning_rate went on at the optimizer's default rate (with a warning naming
    learning_rate=None), where `jes train --resume` keeps the run's; and learning_rate=0.2 given to resume a run on
    adam's default 0.2 warned that the rest of the run would differ, which it did not."""
    def train(path, **kw):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", log_dir=None, progress=False,
                               **dict(SMALL_RUN, **kw), **({"checkpoint_path": path} if path else {}))
        assert not [w for w in caught if "learning_rate" in str(w.message)], [str(w.message) for w in caught]
        return result

    ran_at = str(tmp_path / "at-0.05.ckpt")
    train(ran_at, key=0, learning_rate=0.05, num_generations=1)
    resumed = train(None, resume=ran_at, num_generations=3)
    np.testing.assert_allclose(resumed.history["learning_rate"], [0.05] * 3)
    uninterrupted = train(None, key=0, learning_rate=0.05, checkpoint_path=None)
    np.testing.assert_array_equal(resumed.flat_params, uninterrupted.flat_params)
    assert checkpoint.read(ran_at).meta["config"]["learning_rate"] == 0.05

    ran_at_default = str(tmp_path / "default.ckpt")
    train(ran_at_default, key=0, num_generations=1)
    resumed = train(None, resume=ran_at_default, learning_rate=0.2, num_generations=3)  # adam's default, given
    uninterrupted = train(None, key=0, checkpoint_path=None)
    np.testing.assert_array_equal(resumed.flat_params, uninterrupted.flat_params)


def test_a_changed_learning_rate_on_resume_names_the_rates_the_run_goes_on_with(tmp_path):
    ckpt = str(tmp_path / "c.ckpt")
    common = dict(log_dir=None, progress=False, **SMALL_RUN)
    jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=0, checkpoint_path=ckpt, learning_rate=0.05,
              **dict(common, num_generations=1))
    with pytest.warns(UserWarning, match=r"with learning_rate=0.01 \(the run used 0.05\); the remaining generations "
                                         r"differ"):
        resumed = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=ckpt, learning_rate=0.01, **common)
    np.testing.assert_allclose(resumed.history["learning_rate"], [0.05, 0.01, 0.01])


RUN_THAT_WAITS = """
import sys
from jes.compilation_cache import enable_compilation_cache
enable_compilation_cache()
import jes

def wait_in_generation_2(record):
    if record["generation"] == 2:
        print("writing", flush=True)
        sys.stdin.readline()  # until the test says so, or kills it

jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=sys.argv[1], num_members=16, chunk_size=8,
          num_generations=3, eval_episodes=4, eval_every=2, log_dir=None, progress=False,
          callbacks=[wait_in_generation_2])
"""


@pytest.mark.hard_timeout(400)
def test_a_checkpoint_another_run_is_writing_is_refused_naming_that_run(tmp_path, capsys):
    """Two runs resuming one checkpoint at once both "succeeded": the last writer's saves were all the file kept (a
    changed learning rate made that lost work). A run holds a lock beside its checkpoint while it writes it; another
    run on it is refused at once, naming it; a kill -9 leaves the lock file, never the lock."""
    path = str(tmp_path / "run.ckpt")
    common = dict(log_dir=None, progress=False, **SMALL_RUN)
    jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=0, checkpoint_path=path, **dict(common, num_generations=1))
    from subprocess_for_tests import checkout_env

    other = subprocess.Popen([sys.executable, "-c", RUN_THAT_WAITS, path], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
                             env=checkout_env())
    try:
        line = other.stdout.readline()  # the other run is in its generation 2, holding the checkpoint
        assert line == "writing\n", other.communicate()[1][-3000:]
        capsys.readouterr()
        holder = rf"another run is writing it \(pid {other.pid} on host {re.escape(socket.gethostname())}, since "
        with pytest.raises(checkpoint.CheckpointInUseError, match=rf"checkpoint {re.escape(repr(path))} is in use: "
                                                                  rf"{holder}"):
            jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=path, **common)
        assert "compile" not in capsys.readouterr().err  # refused before the step's compile
        with pytest.raises(checkpoint.CheckpointInUseError, match=holder):  # a fresh run into it too
            jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", checkpoint_path=path, **common)
        trainer, state, ckpt = checkpoint.load(path)
        with pytest.raises(checkpoint.CheckpointInUseError, match=holder):  # and jes.run
            jes.run(trainer, state, key=ckpt.key, history=ckpt.history, best=ckpt.best, checkpoint_path=path)
        assert cli.main(["train", "--resume", path, "--log-dir", "none", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"is in use: another run is writing it (pid {other.pid} on host" in err
        assert "give this run another --log-dir" not in err, err  # a resume writes the file it resumes from
        assert "give this resumed run its own --checkpoint PATH" in err, err
        assert checkpoint.read(path).generation == 1  # nothing of the refused runs was written
        other.kill()  # kill -9: its lock file stays, its lock does not
        other.wait()
        assert os.path.exists(path + checkpoint.LOCK_SUFFIX)
        resumed = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=path, **common)
        assert resumed.history["generation"].tolist() == [1, 2, 3] and checkpoint.read(path).generation == 3
        assert os.listdir(tmp_path) == ["run.ckpt"]  # a run that ended removed its lock file
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()


def test_a_writer_lock_is_one_runs_and_leaves_nothing_behind(tmp_path):
    path = str(tmp_path / "new" / "deeper" / "run.ckpt")
    with checkpoint.WriterLock(path) as lock:
        assert lock.held
        with open(path + checkpoint.LOCK_SUFFIX) as f:
            assert f.read().startswith(f"pid {os.getpid()} on host {socket.gethostname()}, since ")
        with pytest.raises(checkpoint.CheckpointInUseError, match=rf"\(pid {os.getpid()} on host .*: this process\)"):
            checkpoint.WriterLock(path).acquire()  # another run of this process (a thread, a callback)
    assert os.listdir(tmp_path) == []  # the lock file, and the folders made for it (a refused run's, say)
    os.makedirs(tmp_path / "run")
    left = tmp_path / "run" / "run.ckpt.jes-lock"  # a killed run's lock file, unlocked: taken over
    left.write_text("pid 4242 on host gone, since yesterday\n")
    with checkpoint.WriterLock(str(tmp_path / "run" / "run.ckpt")) as lock:
        assert lock.held and left.read_text().startswith(f"pid {os.getpid()} ")
    assert os.listdir(tmp_path / "run") == []


def test_a_writer_lock_is_not_a_users_own_lock_file(tmp_path):
    """A job script guarding its checkpoint with FileLock(ckpt + ".lock") was refused by its own lock."""
    import fcntl

    path = str(tmp_path / "run.ckpt")
    with open(path + ".lock", "w") as own:
        fcntl.flock(own, fcntl.LOCK_EX)
        with checkpoint.WriterLock(path) as lock:
            assert lock.held
    assert os.listdir(tmp_path) == ["run.ckpt.lock"]  # and jes left it alone


def test_the_refusal_gives_advice_that_works_for_a_resume(tmp_path):
    """A resume writes the file it resumes from: "give this run another log_dir" was refused again."""
    path = str(tmp_path / "run.ckpt")
    with checkpoint.WriterLock(path):
        with pytest.raises(checkpoint.CheckpointInUseError, match="or give this run another log_dir"):
            checkpoint.WriterLock(path).acquire()
        with pytest.raises(checkpoint.CheckpointInUseError) as info:
            checkpoint.WriterLock(path, resuming=True).acquire()
    assert "another log_dir" not in str(info.value)
    assert "give this resumed run its own checkpoint_path" in str(info.value)


def test_a_forked_child_never_keeps_its_parents_checkpoint_lock(tmp_path):
    """fork() without exec (multiprocessing's "fork", a callback's background process) shared the lock's open file:
    a child outliving a killed run kept the checkpoint locked, and every resume was refused naming a dead pid."""
    import warnings as _warnings

    path = str(tmp_path / "run.ckpt")
    lock = checkpoint.WriterLock(path).acquire()
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    with _warnings.catch_warnings():
        _warnings.simplefilter("ignore")  # JAX's warning of fork() in a threaded process
        child = os.fork()
    if child == 0:  # the child: stays alive, as a background process would, until told
        try:
            os.write(ready_w, b"x")
            os.read(done_r, 1)
        finally:
            os._exit(0)
    try:
        os.read(ready_r, 1)
        # The child's closing its copy left the parent's lock held
        with pytest.raises(checkpoint.CheckpointInUseError, match="this process"):
            checkpoint.WriterLock(path).acquire()
        lock._forget()  # the run dies (kill -9): its descriptor closes, its lock file stays
        assert os.path.exists(path + checkpoint.LOCK_SUFFIX)
        with checkpoint.WriterLock(path) as again:  # the live child holds nothing
            assert again.held
    finally:
        os.write(done_w, b"x")
        os.waitpid(child, 0)
        for fd in (ready_r, ready_w, done_r, done_w):
            os.close(fd)


def test_a_refusal_says_when_the_pid_it_names_is_gone(tmp_path):
    import fcntl

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    path = str(tmp_path / "run.ckpt")
    with open(path + checkpoint.LOCK_SUFFIX, "w") as f:  # held by what that pid started (a forked child)
        f.write(f"pid {gone.pid} on host {socket.gethostname()}, since 2026-01-01 00:00:00\n")
        f.flush()
        fcntl.flock(f, fcntl.LOCK_EX)
        with pytest.raises(checkpoint.CheckpointInUseError, match=rf"pid {gone.pid} is gone, and a process it started "
                                                                  rf"\(a forked child\) still holds the lock: `fuser"):
            checkpoint.WriterLock(path).acquire()


def test_a_lock_interrupted_as_it_is_taken_or_dropped_held_is_released(tmp_path, monkeypatch):
    """A Ctrl-C after flock, before the lock was kept, left it held for the life of the process (a notebook refused
    every later run on the checkpoint); so did a lock object dropped without release."""
    import gc

    path = str(tmp_path / "run.ckpt")
    real = socket.gethostname
    calls = []

    def ctrl_c_once():
        if not calls:
            calls.append(1)
            raise KeyboardInterrupt
        return real()

    monkeypatch.setattr(socket, "gethostname", ctrl_c_once)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.WriterLock(path).acquire()
    assert os.listdir(tmp_path) == []
    with checkpoint.WriterLock(path) as lock:
        assert lock.held
    dropped = checkpoint.WriterLock(path).acquire()
    del dropped
    gc.collect()
    with checkpoint.WriterLock(path) as lock:  # the dropped lock's descriptor was closed
        assert lock.held


def test_a_lock_that_cannot_be_kept_warns_rather_than_going_on_silently(tmp_path, monkeypatch):
    path = str(tmp_path / "run.ckpt")
    monkeypatch.setattr(checkpoint.WriterLock, "_names", lambda self, fd: False)  # removed each time it is locked
    with pytest.warns(UserWarning, match=r"removed each of the 20 times it was locked .*the run goes on unlocked"):
        lock = checkpoint.WriterLock(path).acquire()
    assert not lock.held


def test_a_run_releases_its_lock_however_it_ends(trainer, tmp_path):
    """A notebook resumes in the same process after a Ctrl-C: the interrupted run's lock must be gone."""
    path = str(tmp_path / "run.ckpt")

    def ctrl_c_in_generation_2(record):
        if record["generation"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(trainer, trainer.init_state(5), key=5, callbacks=[ctrl_c_in_generation_2], checkpoint_path=path)
    assert os.listdir(tmp_path) == ["run.ckpt"]
    with pytest.raises(KeyboardInterrupt):
        jes.train(POLICY, "CartPole-v1", "adam", resume=path, log_dir=None, progress=False,
                  callbacks=[ctrl_c_in_generation_2], **SMALL)
    assert os.listdir(tmp_path) == ["run.ckpt"]
    resumed = jes.train(POLICY, "CartPole-v1", "adam", resume=path, log_dir=None, progress=False, **SMALL)
    assert resumed.history["generation"].tolist() == [1, 2, 3, 4] and os.listdir(tmp_path) == ["run.ckpt"]


def test_without_file_locks_a_run_goes_on_unlocked(trainer, tmp_path, monkeypatch):
    """A filesystem that takes no locks (some network ones) warns and goes on; without fcntl (Windows) nothing is
    locked."""
    import errno

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    path = str(tmp_path / "run.ckpt")
    monkeypatch.setattr(checkpoint.fcntl, "flock", no_locks)
    with pytest.warns(UserWarning, match=r"cannot lock .*run.ckpt.jes-lock \(No locks available\): this filesystem takes no "
                                         r"file locks.*the run goes on unlocked"):
        result = run(trainer, trainer.init_state(5), key=5, num_generations=1, checkpoint_path=path)
    assert result.checkpoint_path == path and os.listdir(tmp_path) == ["run.ckpt"]
    monkeypatch.setattr(checkpoint, "fcntl", None)
    with checkpoint.WriterLock(path) as lock:
        assert not lock.held and os.listdir(tmp_path) == ["run.ckpt"]


def test_a_resume_that_already_reached_stop_at_return_says_it_trains_nothing(tmp_path):
    """It trained 0 generations without a word."""
    ckpt = str(tmp_path / "c.ckpt")
    common = dict(log_dir=None, progress=False, **dict(SMALL_RUN, num_generations=2, eval_every=1))
    first = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=0, checkpoint_path=ckpt, **common)
    reached = float(np.nanmin(first.history["centre_return"]))
    with pytest.warns(UserWarning, match=rf"reached stop_at_return={reached:g} at generation 1 .* trains no more"):
        resumed = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=ckpt,
                            **dict(common, num_generations=4, stop_at_return=reached))
    assert resumed.history["generation"].tolist() == [1, 2]


@pytest.fixture
def ctrl_c_raises():
    """SIGINT as Python's Ctrl-C (a background job, as CI's, inherits it ignored), restored after the test."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def signals_during_writes(monkeypatch, *signals):
    """Make each checkpoint write send ``signals`` to this process first (a real Ctrl-C mid-save); the sizes written."""
    real_write, written = checkpoint._write_payload, []

    def write_while_signalled(f, payload):
        for sig in signals:
            os.kill(os.getpid(), sig)
            time.sleep(0.01)  # delivered here, at a bytecode boundary, unless held back
        real_write(f, payload)
        written.append(len(payload))

    monkeypatch.setattr(checkpoint, "_write_payload", write_while_signalled)
    return written


def test_ctrl_c_during_the_final_save_keeps_the_checkpoint_and_names_it(trainer, full_run, tmp_path, monkeypatch,
                                                                         ctrl_c_raises):
    """The save after the last generation was outside the interrupt's protection: a Ctrl-C during it (seconds in a
    multi-process run) lost every generation since the last periodic checkpoint, and said there was none."""
    path = str(tmp_path / "final.ckpt")
    signals_during_writes(monkeypatch, signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as interrupted:
        run(trainer, trainer.init_state(5), key=5, checkpoint_path=path)
    assert checkpoint.read(path).generation == 4
    assert interrupted.value.checkpoint_path == path
    np.testing.assert_array_equal(interrupted.value.result.flat_params, full_run.flat_params)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is restored


def test_a_second_ctrl_c_during_the_interrupt_save_waits_for_it(trainer, tmp_path, monkeypatch, ctrl_c_raises):
    """An impatient second Ctrl-C cut the interrupt's save off: no checkpoint at all."""
    path = str(tmp_path / "twice.ckpt")

    def ctrl_c_after_second(record):
        if record["generation"] == 2:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)  # interrupted here

    written = signals_during_writes(monkeypatch, signal.SIGINT, signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as interrupted:
        run(trainer, trainer.init_state(5), key=5, callbacks=[ctrl_c_after_second], checkpoint_path=path)
    assert len(written) == 1 and checkpoint.read(path).generation == 1
    assert interrupted.value.checkpoint_path == path and list(interrupted.value.result.history["generation"]) == [1]


def test_sigterm_during_jes_trains_final_save_keeps_it_and_says_so(tmp_path, monkeypatch, capsys):
    """``jes train`` takes SIGTERM as Ctrl-C: during the final save it said "no checkpoint was saved: the run had none
    yet" after every generation had run, and saved none."""
    written = signals_during_writes(monkeypatch, signal.SIGTERM)
    before = signal.getsignal(signal.SIGTERM)
    path = str(tmp_path / "run" / "checkpoint.ckpt")
    status = cli.main(["train", "--policy", "mlp", "--hidden", "4", "--layers", "1", "--population", "8",
                       "--generations", "2", "--checkpoint-every", "100", "--log-dir", str(tmp_path / "run"),
                       "--no-progress"])
    err = capsys.readouterr().err
    assert status == 128 + signal.SIGTERM, err
    assert f"terminated (checkpoint {path}; continue with --resume {path})" in err, err
    assert len(written) == 1 and checkpoint.read(path).generation == 2
    assert signal.getsignal(signal.SIGTERM) == before  # no holding handler left behind


TERMINATED_SCRIPT = r"""
import sys, time
import jes

log_dir, ready = sys.argv[1], sys.argv[2]


def wait_for_sigterm(record):
    if record["generation"] == 4:  # after the checkpoint of generation 2: the test sends SIGTERM once it sees the file
        open(ready, "w").close()
        while True:
            time.sleep(0.05)


jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=3, num_members=8, num_generations=50, eval_episodes=2,
          log_dir=log_dir, checkpoint_every=2, progress=False, callbacks=[wait_for_sigterm])
print("returned")
"""


@pytest.mark.hard_timeout(400)
def test_sigterm_to_a_script_calling_train_saves_the_checkpoint_then_ends_as_sigterm(tmp_path):
    """A script calling jes.train killed by SIGTERM (a scheduler, kill, timeout) died at once: only `jes train` took
    it as Ctrl-C, so the generations since the last periodic checkpoint were lost."""
    from subprocess_for_tests import checkout_env, wait_for_file

    log_dir, ready = tmp_path / "run", tmp_path / "ready"
    path = str(log_dir / "checkpoint.ckpt")
    script = tmp_path / "script.py"
    script.write_text(TERMINATED_SCRIPT)
    child = subprocess.Popen([sys.executable, str(script), str(log_dir), str(ready)], env=checkout_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for_file(ready, child), f"generation 4 never came (status {child.poll()})"
        assert checkpoint.read(path).generation == 2  # the periodic one
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    # It ends as SIGTERM ends a process (143 in a shell), once generation 3 (the last one whole) is saved
    assert child.returncode == -signal.SIGTERM, err[-3000:]
    assert "returned" not in out and "Traceback" not in err, err[-3000:]
    assert f"jes.train: terminated by SIGTERM; the run so far is in checkpoint {path}: continue it with " \
           f"resume={path!r}" in err, err[-3000:]
    saved = checkpoint.read(path)
    assert saved.generation == 3 and list(saved.history["generation"]) == [1, 2, 3]
    assert not os.path.exists(path + ".jes-lock")
    resumed = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", num_members=8, num_generations=4,
                        eval_episodes=2, resume=path, log_dir=None, progress=False)
    assert list(resumed.history["generation"]) == [1, 2, 3, 4]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # this process's own, untouched


DROPPED_INTERRUPT_SCRIPT = """
import gc, os, signal, sys
import jes

signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job (CI's) inherits SIGINT ignored

def callback(record):
    if record["generation"] == 2:  # the signal lands in a gc callback (as in JAX's _xla_gc_callback while it traces)
        def in_gc(phase, info):
            if phase == "start":
                gc.callbacks.remove(in_gc)
                os.kill(os.getpid(), getattr(signal, sys.argv[2]))
                sum(range(10))  # the handler runs here: Python prints its KeyboardInterrupt and drops it
        gc.callbacks.append(in_gc)
        gc.collect()

try:
    jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=3, num_members=8, num_generations=40,
              eval_episodes=2, log_dir=sys.argv[1], checkpoint_every=0, progress=False, callbacks=[callback])
    print("returned")
except KeyboardInterrupt as interrupt:  # (SIGTERM's ends the process first, as SIGTERM would)
    print("interrupted", interrupt.checkpoint_path, len(interrupt.result.history["generation"]))
"""


@pytest.mark.hard_timeout(400)
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_an_interrupt_python_dropped_still_stops_the_run_at_the_next_generation(tmp_path, sig):
    """Preemption tester: a SIGTERM landing in JAX's gc callback (jes train's start-up, tracing) had its
    KeyboardInterrupt printed as "Exception ignored" and dropped; the run trained on to its end and `jes train`
    exited 0, ignoring the scheduler's preemption until SIGKILL. A trial: a Ctrl-C's alike, the run training on as if
    no key had been pressed. The run now stops at the next generation, saved, as either stops it."""
    from subprocess_for_tests import checkout_env

    log_dir = tmp_path / "run"
    path = str(log_dir / "checkpoint.ckpt")
    script = tmp_path / "script.py"
    script.write_text(DROPPED_INTERRUPT_SCRIPT)
    try:
        done = subprocess.run([sys.executable, str(script), str(log_dir), sig], env=checkout_env(),
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the script ran past 300 s:\n{e.stderr}")
    assert "Exception ignored" not in done.stderr, done.stderr[-3000:]  # dropped, and raised again: not printed
    assert "returned" not in done.stdout, done.stderr[-3000:]
    if sig == "SIGTERM":
        assert done.returncode == -signal.SIGTERM, done.stderr[-3000:]
        assert f"jes.train: terminated by SIGTERM; the run so far is in checkpoint {path}" in done.stderr
    else:
        assert done.returncode == 0 and f"interrupted {path} 2" in done.stdout, (done.stdout, done.stderr[-3000:])
    assert checkpoint.read(path).generation == 2  # stopped before generation 3, not at 40


def test_a_dropped_ctrl_c_is_raised_once_and_only_while_a_run_is_on(capsys):
    """The interrupt Python dropped is raised again at the run's next check, once; outside a run (or after it
    ended) nothing is kept, and other unraisable errors still reach the hook that was there. One no check raised
    again is said as the block ends, unless an interrupt or error ended it; a forked child's passes on, as
    without jes (the child never checks)."""
    from jes import interrupts

    seen = []
    dropped = lambda: sys.unraisablehook(types.SimpleNamespace(exc_value=KeyboardInterrupt()))
    late = "a Ctrl-C that Python dropped (its KeyboardInterrupt landed in a gc callback) came after the last point"
    previous, sys.unraisablehook = sys.unraisablehook, lambda u: seen.append(type(u.exc_value))
    try:
        taking = interrupts.SigtermAsInterrupt(unless_handled=True).install()
        try:
            dropped()
            sys.unraisablehook(types.SimpleNamespace(exc_value=ValueError()))
            assert seen == [ValueError]  # the interrupt kept, not printed
            with pytest.raises(KeyboardInterrupt):
                interrupts.raise_if_terminated()
            interrupts.raise_if_terminated()  # once
            dropped()
        finally:
            taking.restore()
        assert late in capsys.readouterr().err  # the block ended without it: said
        interrupts.raise_if_terminated()  # nothing installed: nothing kept
        assert taking.dropped == [] and seen == [ValueError]
        dropped()
        assert seen == [ValueError, KeyboardInterrupt]  # the hook given back

        taking = interrupts.SigtermAsInterrupt(unless_handled=True).install()
        dropped()
        taking.restore(KeyboardInterrupt())  # a second Ctrl-C ended the run: nothing more to say
        assert late not in capsys.readouterr().err and taking.dropped == []

        taking = interrupts.SigtermAsInterrupt(unless_handled=True).install()
        try:
            taking._pid = -1  # as in a child forked meanwhile
            dropped()
            assert taking.dropped == [] and seen == [ValueError, KeyboardInterrupt, KeyboardInterrupt]
        finally:
            taking.restore()
    finally:
        sys.unraisablehook = previous


def test_train_takes_sigterm_only_in_the_main_thread_and_only_when_nobody_handles_it(trainer):
    """jes.train/jes.run take SIGTERM over only where its default action would end the process, and give it back."""
    import threading

    seen = []
    look = lambda record: seen.append(signal.getsignal(signal.SIGTERM))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    run(trainer, trainer.init_state(5), key=5, num_generations=1, callbacks=[look])
    assert callable(seen[-1]) and seen[-1] is not signal.SIG_DFL  # a SIGTERM would save, then end the process
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

    own = lambda signum, frame: None
    previous = signal.signal(signal.SIGTERM, own)
    try:
        run(trainer, trainer.init_state(5), key=5, num_generations=1, callbacks=[look])
        assert seen[-1] is own and signal.getsignal(signal.SIGTERM) is own  # the program's own stays in charge
    finally:
        signal.signal(signal.SIGTERM, previous)

    errors = []
    thread = threading.Thread(target=lambda: _collect_errors(errors, lambda: run(
        trainer, trainer.init_state(5), key=5, num_generations=1, callbacks=[look])))
    thread.start()
    thread.join(timeout=240)
    assert not thread.is_alive() and not errors, errors
    assert seen[-1] is signal.SIG_DFL  # no handler from another thread (Python refuses one there)


def _collect_errors(errors: list, function) -> None:
    try:
        function()
    except Exception as err:  # noqa: BLE001  reported by the test
        errors.append(err)


def test_train_gives_back_neither_a_handler_installed_meanwhile_nor_a_handler_from_outside_python(trainer, monkeypatch):
    """Review of 708af84: restoring SIGTERM's handler after a run put SIG_DFL over a handler a callback (or a library it
    set up) installed during the run, and over a handler from outside Python (``None``, which signal.signal refuses:
    a TypeError, where the CLI's handler before that commit left it alone)."""
    own = lambda signum, frame: None

    def install_own(record):
        signal.signal(signal.SIGTERM, own)

    try:
        run(trainer, trainer.init_state(5), key=5, num_generations=1, callbacks=[install_own])
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    from jes import interrupts

    real = signal.signal
    monkeypatch.setattr(signal, "signal", lambda sig, handler: (real(sig, handler), None)[1])  # "from outside Python"
    taking = interrupts.SigtermAsInterrupt().install()
    try:
        taking.restore()  # raised TypeError: signal handler must be signal.SIG_IGN, signal.SIG_DFL, or a callable
    finally:
        real(signal.SIGTERM, signal.SIG_DFL)


def test_a_child_forked_while_sigterm_is_taken_dies_of_sigterm_as_without_jes():
    """Review of 708af84: a child forked during a run (a callback's multiprocessing pool, whose terminate() sends
    SIGTERM) inherited the run's handler and raised KeyboardInterrupt, exiting 1 with a traceback where it died of
    SIGTERM without jes. The child now ends as SIGTERM ends it; the parent still takes SIGTERM as an interrupt."""
    from jes import interrupts

    taking = interrupts.SigtermAsInterrupt().install()
    try:
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: say it runs (a signal before the fork's after-work in the child is dropped), wait
            try:
                os.write(ready_w, b"x")
                time.sleep(60)
            finally:
                os._exit(7)  # reached only if SIGTERM raised (KeyboardInterrupt) instead of ending the process
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"x"
        os.close(ready_r)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
    finally:
        taking.restore()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


JAX_DISTRIBUTED_SCRIPT = r"""
import os, signal, socket, time
import jax

listening = socket.socket()
listening.bind(("127.0.0.1", 0))
port = listening.getsockname()[1]
listening.close()
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=1, process_id=0)
import jes

seen = []
jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=3, num_members=8, num_generations=1, eval_episodes=2,
          log_dir=None, progress=False, callbacks=[lambda record: seen.append(signal.getsignal(signal.SIGTERM))])
print("during", seen, flush=True)
os.kill(os.getpid(), signal.SIGTERM)  # JAX's preemption notifier notes it; the process goes on
time.sleep(1)
print("survived", flush=True)
"""


@pytest.mark.hard_timeout(300)
def test_train_leaves_jax_preemption_notifier_in_charge_of_sigterm(tmp_path):
    """Review of 708af84: jax.distributed.initialize installs JAX's preemption notifier from C, where
    signal.getsignal still says SIG_DFL: jes.train took SIGTERM over it, then restored SIG_DFL, so a later SIGTERM
    (the preemption the notifier was there to note) killed the process."""
    from subprocess_for_tests import checkout_env

    script = tmp_path / "script.py"
    script.write_text(JAX_DISTRIBUTED_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], env=checkout_env(), capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0 and "survived" in done.stdout, (done.returncode, done.stdout, done.stderr[-3000:])
    assert "during [<Handlers.SIG_DFL: 0>]" in done.stdout, done.stdout  # jes installed nothing


KILLED_MID_SAVE = """
import os, signal, sys
import jes
from jes import checkpoint

trainer = jes.Trainer(jes.MLPPolicy((4,)), "CartPole-v1", "adam", jes.ESConfig(num_members=8, num_generations=2))
checkpoint.save(sys.argv[1], trainer, trainer.init_state(1), {}, key=1)

def write_half_then_die(f, payload):
    f.write(payload[: len(payload) // 2])
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)

checkpoint._write_payload = write_half_then_die
checkpoint.save(sys.argv[1], trainer, trainer.init_state(2), {}, key=2)
"""


@pytest.mark.hard_timeout(300)
def test_a_save_killed_midway_leaves_the_previous_checkpoint(tmp_path):
    """Holding Ctrl-C back during a save does not hold SIGKILL: the save stays atomic."""
    path = str(tmp_path / "run.ckpt")
    out = subprocess.run([sys.executable, "-c", KILLED_MID_SAVE, path], capture_output=True, text=True, timeout=240)
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    np.testing.assert_array_equal(checkpoint.read(path).key, np.asarray(jax.random.key_data(jes.generation.as_key(1))))


# --------------------------------------------------------------- a small file naming a big run
LOAD_AND_MEASURE = r"""
import sys
import jes
from jes import checkpoint
path, how = sys.argv[1], sys.argv[2]
try:
    if how == "load":
        checkpoint.load(path)
    else:
        checkpoint.read(path).centre_for_evaluation()
    print("loaded")
except checkpoint.CheckpointError as err:
    print("CheckpointError:", str(err).replace("\n", " | "))
# This process's own peak (VmHWM: of its memory since exec). getrusage's ru_maxrss keeps the peak of the process
# it was forked from (Linux carries it across exec): a pytest worker's gigabytes.
hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
print("maxrss_mb", int(hwm.split()[1]) // 1024)
"""


def _huge(tmp_path, name: str, hidden: tuple, strategy: dict | None = None, schedules=(), mean_params=None) -> str:
    """A small checkpoint of a CartPole MLP run rewritten to describe an MLP of ``hidden`` (valid checksum)."""
    import hashlib
    import json

    from flax import serialization

    small = jes.Trainer(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam", jes.ESConfig(num_members=8))
    base = checkpoint.save(str(tmp_path / "base.ckpt"), small, small.init_state(0))
    big = jes.Trainer(jes.MLPPolicy(hidden_sizes=hidden), "CartPole-v1", "adam", jes.ESConfig(num_members=8))

    def change(meta):
        meta["policy"]["fields"]["hidden_sizes"] = {"__seq__": list(hidden), "tuple": True}
        meta["num_params"] = big.num_params
        if strategy is not None:
            meta["strategy"], meta["optimizer"] = strategy, None
        meta["config_schedules"] = list(schedules)

    path = _rewrite_meta(base, str(tmp_path / f"{name}.ckpt"), change)
    if mean_params is not None:  # the file holds the centre the description asks for, nothing else of its run
        with open(path, "rb") as f:
            content = serialization.msgpack_restore(f.read()[checkpoint._HEADER.size:])
        content["state"]["strategy"]["mean"] = np.zeros(big.num_params, np.float32)
        payload = serialization.msgpack_serialize(content)
        with open(path, "wb") as f:
            f.write(checkpoint._HEADER.pack(checkpoint.MAGIC, len(payload), hashlib.sha256(payload).digest()))
            f.write(payload)
    return path


@pytest.mark.hard_timeout(300)
@pytest.mark.parametrize("case, how, message", [
    ("mlp_1e8", "load", "holds arrays of other shapes than this run"),
    ("mlp_1e8", "centre", "holds arrays of other shapes than this run"),
    ("mlp_1e9", "load", "expected float32\\[1000267115\\], file has float32\\[30\\]"),
    ("cma_cov", "load", "does not fit this run's structure"),
    ("cma_cov_schedule", "centre", "but the file holds"),
])
def test_a_small_file_naming_a_huge_run_is_refused_before_allocating_it(tmp_path, case, how, message):
    """A file describes its run in a few bytes; loading it allocates only what it stores (before, a 3 KB file made
    load / centre_for_evaluation allocate the run it named: 2.5-3.3 GB, or a raw RESOURCE_EXHAUSTED at 1e9 params)."""
    cma = {"name": "cma_es", "fields": {"sigma_init": None, "eigen_interval": None, "max_params": 10 ** 9}}
    path = {
        "mlp_1e8": lambda: _huge(tmp_path, case, (10000, 10000)),
        "mlp_1e9": lambda: _huge(tmp_path, case, (31623, 31623)),
        # CMA-ES on 20017 parameters: a 1.6 GB covariance; the file holds the 80 KB centre (and with a schedule,
        # centre_for_evaluation stands in for the rest of the state)
        "cma_cov": lambda: _huge(tmp_path, case, (2000, 5), cma, mean_params=True),
        "cma_cov_schedule": lambda: _huge(tmp_path, case, (2000, 5), cma, ["learning_rate"], mean_params=True),
    }[case]()
    assert os.path.getsize(path) < 100_000
    out = subprocess.run([sys.executable, "-c", LOAD_AND_MEASURE, path, how], capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert "CheckpointError:" in lines, out.stdout
    assert path in lines["CheckpointError:"]
    import re
    assert re.search(message, lines["CheckpointError:"]), lines["CheckpointError:"]
    assert int(lines["maxrss_mb"]) < 1500, out.stdout


def test_an_interrupt_among_the_handler_restores_leaves_no_holding_handler(monkeypatch, ctrl_c_raises):
    """A Ctrl-C raised right after SIGINT's handler was restored skipped SIGTERM's restore: SIGTERM kept the holding
    handler for good, and every later SIGTERM (Slurm, docker stop) was swallowed."""
    real_signal, terms = signal.signal, []
    previous_term = real_signal(signal.SIGTERM, lambda signum, frame: terms.append(signum))
    own_term = signal.getsignal(signal.SIGTERM)

    def restore_then_ctrl_c(sig, handler):
        out = real_signal(sig, handler)
        if sig == signal.SIGINT and handler is signal.default_int_handler:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)  # delivered here, to the handler just restored
        return out

    try:
        with pytest.raises(KeyboardInterrupt):
            with checkpoint.interrupts_deferred():
                monkeypatch.setattr(signal, "signal", restore_then_ctrl_c)
        monkeypatch.setattr(signal, "signal", real_signal)
        assert signal.getsignal(signal.SIGTERM) is own_term
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        real_signal(signal.SIGTERM, previous_term)


def test_ctrl_c_after_the_run_returned_carries_its_result_and_checkpoint(tmp_path, monkeypatch):
    """A Ctrl-C while jes closed the logs (or stopped local workers) after the last generation carried nothing:
    `jes train` said no checkpoint was saved, "interrupted before the first generation ran", of a finished run."""
    from jes import logging as jes_logging

    real_close_all = jes_logging.close_all

    def close_then_ctrl_c(loggers, **kwargs):
        real_close_all(loggers, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(jes_logging, "close_all", close_then_ctrl_c)
    path = str(tmp_path / "done.ckpt")
    with pytest.raises(KeyboardInterrupt) as interrupted:
        jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=2, num_members=8, num_generations=2,
                  eval_episodes=1, log_dir=None, checkpoint_path=path, progress=False)
    assert interrupted.value.checkpoint_path == path and checkpoint.read(path).generation == 2
    assert list(interrupted.value.result.history["generation"]) == [1, 2]


LAMBDA_POLICY_SCRIPT = """
import sys, warnings
import flax.linen as nn, jes
warnings.simplefilter("error")  # no warning either way: the same code in another process is the same policy
policy = jes.MLPPolicy((4,), activation=lambda x: x * nn.sigmoid(x))
kw = dict(num_members=8, eval_episodes=2, max_episode_steps=20, progress=False)
if sys.argv[1] == "train":
    r = jes.train(policy, "CartPole-v1", "adam", num_generations=2, log_dir=sys.argv[2], **kw)
else:
    r = jes.train(policy, "CartPole-v1", "adam", num_generations=3, resume=sys.argv[2], **kw)
print("generations", len(r.history["generation"]))
"""


def test_a_policy_with_a_lambda_resumes_in_another_process(tmp_path):
    """A lambda field was recorded by its repr, memory address included: resume= in a new process was always refused
    with "Resume with the same policy", which it was."""
    script = tmp_path / "lambda_policy.py"
    script.write_text(LAMBDA_POLICY_SCRIPT)
    run = lambda *args: subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                                       timeout=300, cwd=str(tmp_path))
    first = run("train", str(tmp_path / "run"))
    assert first.returncode == 0 and "generations 2" in first.stdout, first.stderr[-3000:]
    resumed = run("resume", str(tmp_path / "run" / "checkpoint.ckpt"))
    assert resumed.returncode == 0 and "generations 3" in resumed.stdout, resumed.stderr[-3000:]


def _swish(x):
    return x


def test_a_checkpoint_recording_a_lambda_by_its_address_resumes_with_a_warning(tmp_path):
    """Checkpoints written before jes named lambdas by module, qualified name and line hold their address: the same
    qualified name resumes, said; another function is refused with a message that explains lambdas."""
    swish = lambda x: x * jax.nn.sigmoid(x)  # noqa: E731
    policy = jes.MLPPolicy((3,), activation=swish)
    trainer = jes.Trainer(policy, "CartPole-v1", "adam", jes.ESConfig(**SMALL))
    saved = checkpoint.save(str(tmp_path / "new.ckpt"), trainer, trainer.init_state(0), key=0)
    old_repr = f"<function {swish.__qualname__} at 0x7f40098d84a0>"
    old = _rewrite_meta(saved, str(tmp_path / "old.ckpt"),
                        lambda meta: meta["policy"]["fields"].update(activation={"__unimportable__": old_repr}))
    with pytest.warns(UserWarning, match=r"recorded the function <function .*<lambda> at 0x7f40098d84a0> by its memory "
                                         r"address, as jes did before .*resuming with it as given"):
        checkpoint.read(old).restore_state(trainer)
    def linear(x):
        return x

    other = jes.Trainer(jes.MLPPolicy((3,), activation=linear), "CartPole-v1", "adam", jes.ESConfig(**SMALL))
    with pytest.raises(checkpoint.CheckpointError, match=r"a lambda or closure is recorded by its module, qualified "
                                                         r"name, first line and code hash"):
        checkpoint.read(old).restore_state(other)


class _Scale:
    def __call__(self, x):
        return x


def test_a_run_whose_checkpoint_cannot_resume_in_another_process_says_so_as_it_starts(tmp_path):
    """A callable object's repr holds its address: its checkpoint matches no other process, said at the start of the
    run, not when resume= refuses it hours later."""
    policy = jes.MLPPolicy((3,), activation=_Scale())
    with pytest.warns(UserWarning, match=r"will record policy.activation \(<.*_Scale object at 0x[0-9a-f]+>\) by its "
                                         r"memory address.*resume= in another process will refuse it"):
        jes.train(policy, "CartPole-v1", "adam", log_dir=str(tmp_path / "run"), progress=False,
                  **dict(SMALL, num_generations=1))


def test_a_run_that_writes_no_checkpoint_does_not_warn_that_it_cannot_resume():
    """The warning is about a checkpoint: a run with log_dir=None and checkpoint_path=None writes none."""
    policy = jes.MLPPolicy((3,), activation=_Scale())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", DeprecationWarning)
        jes.train(policy, "CartPole-v1", "adam", log_dir=None, checkpoint_path=None, progress=False,
                  **dict(SMALL, num_generations=1))


@pytest.mark.parametrize("value, old", [
    (functools.partial(operator.mul, 0.5), "functools.partial(<built-in function mul>, 0.5)"),
    (functools.partial(operator.add, 1.0), "functools.partial(<built-in function add>, 1.0)"),
])
def test_a_checkpoint_of_a_policy_with_a_stable_repr_partial_still_resumes(tmp_path, value, old):
    """Naming lambdas by their code recorded these partials otherwise than jes always had: their checkpoints were
    refused on resume, blaming a lambda."""
    trainer = jes.Trainer(jes.MLPPolicy((3,), activation=value), "CartPole-v1", "adam", jes.ESConfig(**SMALL))
    saved = checkpoint.save(str(tmp_path / "new.ckpt"), trainer, trainer.init_state(0), key=0)
    written = _rewrite_meta(saved, str(tmp_path / "old.ckpt"),
                            lambda meta: meta["policy"]["fields"].update(activation={"__unimportable__": old}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", DeprecationWarning)
        checkpoint.read(written).restore_state(trainer)


def test_a_lambda_edited_on_its_line_resumes_with_a_warning(tmp_path):
    """Recorded by module, qualified name, line and captured data only, a lambda edited on the same line resumed
    silently: its code's hash now tells it, said as for a moved lambda."""
    trained, edited = (lambda x: x * 2.0), (lambda x: jax.numpy.sin(x))  # noqa: E731 - the same line
    trainer = jes.Trainer(jes.MLPPolicy((3,), activation=trained), "CartPole-v1", "adam", jes.ESConfig(**SMALL))
    saved = checkpoint.save(str(tmp_path / "run.ckpt"), trainer, trainer.init_state(0), key=0)
    other = jes.Trainer(jes.MLPPolicy((3,), activation=edited), "CartPole-v1", "adam", jes.ESConfig(**SMALL))
    with pytest.warns(UserWarning, match=r"ran the function .*<lambda>:\d+ code=[0-9a-f]+, this run passes .*<lambda>:"
                                         r"\d+ code=[0-9a-f]+: the same module, the same line but other code "
                                         r"\(edited\?\).*resuming with it as given"):
        checkpoint.read(saved).restore_state(other)
    with warnings.catch_warnings():  # the same lambda: nothing to say
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", DeprecationWarning)
        checkpoint.read(saved).restore_state(trainer)


@pytest.mark.parametrize("change, message", [
    (lambda h: h.pop("generation"), "its history lacks generation"),
    (lambda h: h.__setitem__("env_steps", np.zeros((2, 3), np.int64)), r"its history env_steps is int64\[2, 3\]"),
])
def test_a_history_no_run_continues_is_refused_before_resuming(saved, tmp_path, change, message):
    """A history without a column the run appends to, or of 2-d arrays, passed the reader's checks: the resumed run
    failed once its first generation had run (a bare KeyError: 'generation', a TypeError), not naming the file."""
    path = _rewrite_meta(saved, str(tmp_path / "history.ckpt"), lambda meta: None,
                         lambda content: change(content["history"]))
    with pytest.raises(checkpoint.CheckpointError, match=f"checkpoint {re.escape(path)} cannot be resumed: {message}"):
        jes.train(POLICY, "CartPole-v1", "adam", resume=path, log_dir=None, progress=False, **SMALL)
    assert checkpoint.read(path).generation == 2  # the file is left as it was
