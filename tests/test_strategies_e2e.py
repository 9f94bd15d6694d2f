"""Every strategy keeps jes's guarantees end to end: bit-identical over devices and across checkpoint + resume.

(0 vs 2 jes-workers for every strategy: tests/test_distributed.py.)
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import jes
from jes import checkpoint
from jes.loop import run

NAMES = jes.strategies.names()
POLICY = dict(hidden_sizes=(4,))
CONFIG = dict(num_members=8, chunk_size=2, num_generations=3, eval_episodes=2, max_episode_steps=40)

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, jes
    jes.enable_compilation_cache()   # the session's cache (tests/conftest.py)
    assert len(jax.devices()) == 2, jax.devices()
    out = {}
    # Two chunks: a loop over both on one device, one chunk per device on two (XLA drops that loop and fuses
    # across it, which once let LLVM contract ARS's weights into an FMA on two devices only).
    for name in jes.strategies.names():
        runs = {d: jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", strategy=name, key=4, devices=d,
                             log_dir=None, progress=False, **dict(CONFIG, chunk_size=4)) for d in (1, 2)}
        out[name] = {d: {"params": r.flat_params.tolist(), "pop_mean": r.history["pop_mean"].tolist(),
                         "sigma": r.history["noise_std"].tolist()} for d, r in runs.items()}
    print(json.dumps(out))
""").replace("CONFIG", repr(CONFIG).replace("{", "dict(").replace("}", ")").replace("'", "").replace(": ", "="))


@pytest.mark.parametrize("name", NAMES)
def test_interrupted_and_resumed_run_is_bit_identical(name, tmp_path):
    trainer = jes.Trainer(jes.MLPPolicy(**POLICY), "CartPole-v1", None, jes.ESConfig(**CONFIG), strategy=name)
    full = run(trainer, trainer.init_state(6), key=6)
    path = str(tmp_path / "run.ckpt")
    run(trainer, trainer.init_state(6), key=6, num_generations=2, checkpoint_path=path)
    saved = checkpoint.read(path)
    assert saved.meta["strategy"]["name"] == name and saved.generation == 2
    rebuilt, state, _ = checkpoint.load(path)  # trainer rebuilt from the file alone, strategy included
    assert rebuilt.strategy == trainer.strategy
    resumed = run(trainer, state, key=saved.key, history=saved.history)
    np.testing.assert_array_equal(full.flat_params, resumed.flat_params)
    np.testing.assert_array_equal(full.history["noise_std"], resumed.history["noise_std"])
    for a, b in zip(jax_leaves(full.state.strategy), jax_leaves(resumed.state.strategy)):
        np.testing.assert_array_equal(a, b)  # sigma vectors, evolution paths, optimizer state


def jax_leaves(tree):
    import jax
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_resume_with_another_strategy_is_refused(tmp_path):
    trainer = jes.Trainer(jes.MLPPolicy(**POLICY), "CartPole-v1", None, jes.ESConfig(**CONFIG), strategy="snes")
    path = str(tmp_path / "run.ckpt")
    run(trainer, trainer.init_state(0), key=0, num_generations=1, checkpoint_path=path)
    other = jes.Trainer(jes.MLPPolicy(**POLICY), "CartPole-v1", None, jes.ESConfig(**CONFIG), strategy="sep_cma_es")
    with pytest.raises(checkpoint.CheckpointError, match="strategy"):
        checkpoint.read(path).restore_state(other)


def test_format_1_checkpoint_of_openai_es_still_resumes(tmp_path):
    """Checkpoints written before strategies existed (OpenAI-ES fields at the top of the state) load unchanged."""
    from flax import serialization

    trainer = jes.Trainer(jes.MLPPolicy(**POLICY), "CartPole-v1", "adam", jes.ESConfig(**CONFIG))
    path = str(tmp_path / "new.ckpt")
    done = run(trainer, trainer.init_state(2), key=2, num_generations=2, checkpoint_path=path)
    new = checkpoint.read(path)
    old_state = dict(new.state_dict)
    strategy_state = old_state.pop("strategy")
    old_state.update(params=strategy_state["mean"], opt_state=strategy_state["opt_state"],
                     noise_std=strategy_state["noise_std"])
    meta = {k: v for k, v in new.meta.items() if k != "strategy"}
    meta["version"] = 1
    payload = serialization.msgpack_serialize({"meta": json.dumps(meta), "state": old_state,
                                               "history": new.history, "key": new.key})
    old_path = str(tmp_path / "old.ckpt")
    with open(old_path, "wb") as f:
        checkpoint._write_payload(f, payload)
    state = checkpoint.read(old_path).restore_state(trainer)
    np.testing.assert_array_equal(state.params, done.flat_params)


# Last in the module: where the subprocess's one-device runs compile the same programs as the tests above
# (same config and policy), it loads them from the session's compilation cache (tests/conftest.py; the
# forced host device count is not part of a cache key).
@pytest.fixture(scope="module")
def two_device_runs():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    try:
        proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    except subprocess.TimeoutExpired:
        pytest.fail("the 2-device strategies run did not finish within 900 s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_two_devices_equal_one_device_for_every_strategy(two_device_runs, name):
    one, two = two_device_runs[name]["1"], two_device_runs[name]["2"]
    assert one["params"] == two["params"]
    assert one["pop_mean"] == two["pop_mean"] and one["sigma"] == two["sigma"]
