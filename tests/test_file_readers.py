"""Checkpoints and .policy files are data: loading one never runs code, and every malformed file is a jes error.

The gadget of issue 27 is rebuilt as a real file with a valid checksum (``ToLinen`` wrapping
``brax.io.model.save_params``, which would write an attacker-named file), and the readers are
fuzzed with malformed files of every kind (``tests/file_fuzz.py``; ``benchmarks/fuzz_files.py``
runs 10,000+).
"""
import json
import subprocess
import sys

import numpy as np
import pytest
from flax import serialization

import file_fuzz
import jes
from jes import checkpoint
from jes.trained import PolicyFileError

CONFIG = dict(num_members=8, chunk_size=4, eval_episodes=2, num_generations=1)
POLICY = jes.MLPPolicy(hidden_sizes=(3,))


@pytest.fixture(scope="module")
def trainer():
    return jes.Trainer(POLICY, "CartPole-v1", "adam", jes.ESConfig(**CONFIG))


@pytest.fixture(scope="module")
def files(trainer, tmp_path_factory):
    directory = tmp_path_factory.mktemp("files")
    ckpt = str(directory / "run.ckpt")
    checkpoint.save(ckpt, trainer, trainer.init_state(0))
    trained = jes.TrainedPolicy(trainer.policy, trainer.init_state(0).strategy.mean, trainer.spec.obs_shape,
                                jes.trained.ActionMap.from_spec(trainer.spec), env_name="CartPole-v1", max_steps=50)
    policy = jes.save_policy(trained, str(directory / "run.policy"))
    return {"checkpoint": open(ckpt, "rb").read(), "policy": open(policy, "rb").read()}


def with_meta(kind: str, data: bytes, change) -> bytes:
    content = serialization.msgpack_restore(data[file_fuzz.HEADER.size:])
    meta = json.loads(content["meta"])
    change(meta)
    return file_fuzz.frame(kind, serialization.msgpack_serialize(dict(content, meta=json.dumps(meta))))


def to_linen_gadget(target) -> dict:
    """flax's ToLinen wrapping brax's save_params: building and initialising it would write ``target``."""
    return {"class": "flax.nnx.bridge.wrappers:ToLinen", "fields": {
        "nnx_class": {"__callable__": "brax.io.model:save_params"},
        "args": {"__seq__": [str(target), {"__seq__": [], "tuple": False}], "tuple": True}}}


@pytest.mark.parametrize("kind", ["policy", "checkpoint"])
def test_a_file_naming_a_library_gadget_runs_no_code(kind, files, tmp_path):
    target = tmp_path / "written-by-the-file"
    path = tmp_path / f"shared.{kind}"
    path.write_bytes(with_meta(kind, files[kind], lambda meta: meta.update(policy=to_linen_gadget(target))))
    error = PolicyFileError if kind == "policy" else checkpoint.CheckpointError
    # (before jes built nnx policies: ToLinen was not registered; now it is built only around an nnx class of the
    # user's own, named as one)
    with pytest.raises(error, match=r"a ToLinen's nnx_class must name a flax.nnx.Module subclass"):
        if kind == "policy":
            jes.load_policy(str(path))
        else:
            checkpoint.load(str(path))
    assert not target.exists()


def test_jes_eval_and_resume_of_a_gadget_checkpoint_fail_cleanly_and_run_nothing(files, tmp_path):
    target = tmp_path / "written-by-the-file"
    path = tmp_path / "shared.ckpt"
    path.write_bytes(with_meta("checkpoint", files["checkpoint"], lambda meta: meta.update(policy=to_linen_gadget(target))))
    empty = tmp_path / "empty-meta.ckpt"
    empty.write_bytes(with_meta("checkpoint", files["checkpoint"], lambda meta: meta.clear()))
    for argv in (["eval", str(path), "--episodes", "1"], ["train", "--resume", str(path)],
                 ["eval", str(empty), "--episodes", "1"]):
        try:
            done = subprocess.run([sys.executable, "-m", "jes.cli", *argv], capture_output=True, text=True, timeout=240)
        except subprocess.TimeoutExpired as err:
            pytest.fail(f"jes {' '.join(argv)} did not exit within 240 s: {err.stderr}")
        assert done.returncode != 0, done.stdout
        assert "Traceback" not in done.stderr, done.stderr
        assert ("is malformed" in done.stderr or "not one of jes's registered" in done.stderr
                or "a ToLinen's nnx_class must name a flax.nnx.Module subclass" in done.stderr), done.stderr
    assert not target.exists()


@pytest.mark.parametrize("kind", ["policy", "checkpoint"])
@pytest.mark.parametrize("case, change, match", [
    ("payload a list", None, "expected a map, found list"),
    ("no meta", None, "missing 'meta'"),
    ("meta not JSON", None, "cannot be decoded"),
    ("meta nested deeply", None, "nested too deeply"),
    ("empty meta", None, "missing 'version'"),
    ("trailing bytes", None, "cannot be decoded"),
])
def test_the_malformed_files_of_issue_27_are_named_errors(kind, case, change, match, files, tmp_path):
    data = dict(file_fuzz.cases(kind, files[kind], 0))[case]
    path = tmp_path / f"bad.{kind}"
    path.write_bytes(data)
    error = PolicyFileError if kind == "policy" else checkpoint.CheckpointError
    with pytest.raises(error, match=match) as raised:
        jes.load_policy(str(path)) if kind == "policy" else checkpoint.load(str(path))
    assert str(path) in str(raised.value)


@pytest.mark.parametrize("kind", ["policy", "checkpoint"])
def test_wrong_types_in_every_meta_field_are_named_errors(kind, files, trainer, tmp_path):
    meta = json.loads(serialization.msgpack_restore(files[kind][file_fuzz.HEADER.size:])["meta"])
    path, raw = str(tmp_path / f"typed.{kind}"), []
    error = PolicyFileError if kind == "policy" else checkpoint.CheckpointError
    for field in meta:
        for value in file_fuzz.WRONG_VALUES:
            with open(path, "wb") as f:
                f.write(with_meta(kind, files[kind], lambda m: m.update({field: value})))
            try:
                jes.load_policy(path) if kind == "policy" else checkpoint.load(path, trainer=trainer)
            except error:
                pass
            except Exception as err:  # noqa: BLE001
                raw.append(f"{field}={value!r}: {type(err).__name__}: {err}")
    assert raw == []


@pytest.mark.parametrize("kind", ["policy", "checkpoint"])
def test_fuzzed_files_give_only_jes_errors(kind, files, tmp_path):
    """A few hundred malformed files through the whole load path (the benchmark runs 10,000+)."""
    if kind == "policy":
        def read(path):
            jes.load_policy(path)
        expected = (PolicyFileError,)
    else:
        def read(path):
            checkpoint.load(path)
        expected = (checkpoint.CheckpointError,)
    seen, raw = file_fuzz.run(kind, files[kind], 300, read, expected, str(tmp_path), seed=27)
    assert seen == 300 and raw == []


def test_a_run_folder_given_for_its_file_is_a_clear_error(files, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(FileNotFoundError, match="is a directory, not a policy file; it holds no .policy file"):
        jes.load_policy(str(run))
    (run / "checkpoint.ckpt").write_bytes(files["checkpoint"])
    with pytest.raises(FileNotFoundError, match=r"is a directory, not a checkpoint; give the file: .*checkpoint\.ckpt"):
        checkpoint.load(str(run))
    for argv in (["eval", str(run), "--episodes", "1"], ["train", "--resume", str(run)]):
        try:
            done = subprocess.run([sys.executable, "-m", "jes.cli", *argv], capture_output=True, text=True, timeout=240)
        except subprocess.TimeoutExpired as err:
            pytest.fail(f"jes {' '.join(argv)} did not exit within 240 s: {err.stderr}")
        assert done.returncode == 2, done.stdout
        assert "Traceback" not in done.stderr and "checkpoint.ckpt" in done.stderr, done.stderr


def test_fields_that_do_not_fit_together_are_named_errors(files, tmp_path):
    """Each field well-typed, together inconsistent: refused at load or before an episode runs, never a raw error."""
    path = tmp_path / "odd.policy"
    path.write_bytes(with_meta("policy", files["policy"], lambda meta: meta["action"].update(discrete=False)))
    with pytest.raises(PolicyFileError, match=r"continuous action of shape \[\] needs 1 outputs"):
        jes.load_policy(str(path))
    path.write_bytes(with_meta("policy", files["policy"], lambda meta: meta["action"].update(num_outputs=3)))
    with pytest.raises(PolicyFileError, match=r"outputs shape \[2\]; the action map expects \[3\]"):
        jes.load_policy(str(path))
    path.write_bytes(with_meta("policy", files["policy"], lambda meta: meta.update(env_name="Acrobot-v1")))
    trained = jes.load_policy(str(path))
    with pytest.raises(ValueError, match=r"'Acrobot-v1' \(the env its file names\) does not fit .* observations of "
                                         r"shape \[6\], the policy takes \[4\]; actions from 3 outputs"):
        trained.evaluate(num_episodes=1)
    path.write_bytes(files["policy"])
    with pytest.raises(ValueError, match="continuous actions, the policy's are discrete"):
        jes.load_policy(str(path)).evaluate(num_episodes=1, env="Pendulum-v1")
    assert jes.load_policy(str(path)).evaluate(num_episodes=1).shape == (1,)


def test_policy_files_of_format_1_keep_the_raw_outputs_they_were_trained_with_for_half_bounded_boxes(tmp_path):
    """Format 2 maps a Box with some infinite bounds dimension by dimension; a format-1 file of such a space keeps
    the raw outputs (its policy was trained on them); a file whose bounds do not fit together is refused."""
    spec = jes.make_env("Pendulum-v1")
    action = jes.trained.ActionMap(discrete=False, num_outputs=1, action_shape=(1,), low=(0.0,), high=(float("inf"),))
    trained = jes.TrainedPolicy(jes.MLPPolicy((3,), num_outputs=1), np.zeros(16, np.float32), spec.obs_shape, action,
                                env_name="Pendulum-v1")
    path = str(tmp_path / "half.policy")
    jes.save_policy(trained, path)
    data = open(path, "rb").read()
    obs = np.array([0.3, -0.2, 0.1], np.float32)
    for version, raw in ((1, True), (2, False)):
        with open(path, "wb") as f:
            f.write(with_meta("policy", data, lambda meta: meta.update(version=version)))
        loaded = jes.load_policy(path)
        assert loaded.action_map.raw_unless_bounded is raw
        out = np.asarray(loaded.act(loaded.initial_carry(), obs)[1])
        assert (out == 0.0).all() if raw else (out > 0).all()  # zero weights: raw 0, else softplus(0) = log 2
    for change, message in ((lambda a: a.update(high=None), "one bound without the other"),
                            (lambda a: a.update(low=[float("nan")]), "holds NaN"),
                            (lambda a: a.update(low=[2.0], high=[1.0]), "low > high")):
        with open(path, "wb") as f:
            f.write(with_meta("policy", data, lambda meta: change(meta["action"])))
        with pytest.raises(PolicyFileError, match=message):
            jes.load_policy(path)
