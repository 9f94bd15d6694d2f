"""jes.distributed.protocol: framing, authentication, array/state encoding, run descriptions (no sockets)."""
import subprocess
import sys

import jax.numpy as jnp
import msgpack
import numpy as np
import pytest

import jes
from jes import describe
from jes.distributed import protocol
from jes.distributed.protocol import DescriptionError, ProtocolError

KEY = b"k" * 32


def test_frames_round_trip_and_reject_tampering():
    frames = protocol.encode({"type": "request", "gen": 3}, KEY)
    assert protocol.decode(frames, KEY, 1024) == {"type": "request", "gen": 3}
    for bad, match in (
        ([frames[0]], "2 frames"),
        ([frames[0][:-1], frames[1]], "bad MAC"),
        ([frames[0], frames[1][:-1]], "MAC frame length"),
        (protocol.encode({"type": "x"}, b"other-key-0123456789"), "bad MAC"),
        (protocol.encode({"no": "type"}, KEY), "'type'"),
        (protocol.encode({"type": "x", "pad": b"0" * 2000}, KEY), "oversized"),
    ):
        with pytest.raises(ProtocolError, match=match):
            protocol.decode(bad, KEY, 1024)


def test_arrays_round_trip_and_malformed_arrays_are_refused():
    for value in (np.float32(1.5), np.arange(6, dtype=np.int32).reshape(2, 3), np.zeros((0, 4), np.float32)):
        packed = msgpack.unpackb(msgpack.packb(protocol.pack_array(value)))
        out = protocol.unpack_array(packed, value.dtype.name, value.shape)
        np.testing.assert_array_equal(out, value)
        assert out.shape == value.shape
    good = protocol.pack_array(np.zeros(4, np.float32))
    for bad in (dict(good, data=good["data"][:-1]), dict(good, dtype="object"), dict(good, shape=[-1]), [1, 2]):
        with pytest.raises(ProtocolError):
            protocol.unpack_array(bad)
    with pytest.raises(ProtocolError, match="shape"):
        protocol.unpack_array(good, "float32", (5,))


def test_state_snapshot_round_trips_bit_identically():
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(3,)), "CartPole-v1", "adam",
                          jes.ESConfig(num_members=8, chunk_size=4, eval_episodes=2))
    state, _ = trainer.step(trainer.init_state(5), jnp.bool_(False), jnp.bool_(True))
    wire = msgpack.unpackb(msgpack.packb(protocol.pack_state(state)))
    restored = protocol.unpack_state(trainer, wire)
    assert protocol.state_hash(restored) == protocol.state_hash(state)
    assert protocol.state_hash(state) != protocol.state_hash(trainer.init_state(5))
    wire["params"] = protocol.pack_array(np.zeros(3, np.float32))
    with pytest.raises(ProtocolError):
        protocol.unpack_state(trainer, wire)


def test_run_description_rebuilds_the_same_trainer_and_refuses_what_cannot_travel():
    config = jes.ESConfig(num_members=8, chunk_size=4, eval_episodes=2, noise_std=0.05)
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(5, 3), activation=jnp.tanh), "CartPole-v1", "sgd", config)
    description = msgpack.unpackb(msgpack.packb(protocol.describe_run(trainer, "CartPole-v1", "sgd")))
    rebuilt = protocol.build_run(description)
    assert rebuilt.policy == trainer.policy and rebuilt.config == trainer.config
    assert rebuilt.num_params == trainer.num_params
    lam = jes.Trainer(jes.MLPPolicy(hidden_sizes=(3,), activation=lambda x: x), "CartPole-v1", "adam", config)
    with pytest.raises(DescriptionError, match="lambda"):
        protocol.describe_run(lam, "CartPole-v1", "adam")
    with pytest.raises(DescriptionError, match="outside the allowed modules"):
        protocol.build_run(dict(description, policy={"class": "no.such.module:Policy", "fields": {}}))
    with pytest.raises(DescriptionError, match="cannot import"):
        protocol.build_run(dict(description, policy={"class": "no.such.module:Policy", "fields": {}}),
                           allow=describe.allowlist(["no.such.module"]))


def test_a_description_of_another_protocol_version_is_refused_naming_both_versions():
    """Version 3 (the centre slots in work and result): a worker refuses a master's description of version 2 (or a
    later one), saying which version came, which it speaks, and what to do."""
    assert protocol.PROTOCOL_VERSION == 3
    config = jes.ESConfig(num_members=8, chunk_size=4, eval_episodes=2, noise_std=0.05)
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(3,)), "CartPole-v1", "adam", config)
    description = protocol.describe_run(trainer, "CartPole-v1", "adam")
    for version in (2, 4):
        with pytest.raises(DescriptionError, match=rf"protocol version {version}, but this jes speaks version 3: run "
                                                   r"the same jes version on the master and its workers"):
            protocol.build_run(dict(description, version=version))


def test_a_jax_env_object_that_workers_would_build_otherwise_is_refused():
    """Workers build an env object's class without arguments: a ScaledCountdown(scale=2.0) went to them as
    ScaledCountdown(), whose returns mixed with the master's without a word."""
    from envs_for_tests import ScaledCountdown

    config = jes.ESConfig(num_members=4, eval_episodes=1)
    describe = lambda env: protocol.describe_run(jes.Trainer(jes.MLPPolicy(hidden_sizes=(2,)), env, "adam", config),
                                                 env, "adam")
    assert describe(ScaledCountdown())["env"] == {"class": "envs_for_tests:ScaledCountdown", "fields": {}}
    with pytest.raises(DescriptionError, match=r"this one's scale differs from ScaledCountdown\(\)'s .*run it "
                                               r"without workers"):
        describe(ScaledCountdown(scale=2.0))


def test_a_run_description_carries_the_chunk_the_master_runs_whatever_the_workers_default(monkeypatch):
    from jes.perturbations import low_rank

    config = jes.ESConfig(num_members=16, eval_episodes=2, perturbation="low_rank")
    trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(4,)), "Pendulum-v1", "adam", config)
    assert trainer.chunk_size == 16 and trainer.config.chunk_size is None
    description = msgpack.unpackb(msgpack.packb(protocol.describe_run(trainer, "Pendulum-v1", "adam")))
    monkeypatch.setattr(low_rank, "CHUNK_SIZE", 8)  # a worker whose jes has another default chunk
    rebuilt = protocol.build_run(description)
    assert (rebuilt.chunk_size, rebuilt.num_chunks) == (16, 1)


def test_secret_sources(tmp_path, monkeypatch):
    monkeypatch.delenv(protocol.SECRET_ENV, raising=False)
    with pytest.raises(ValueError, match="shared secret"):
        protocol.load_secret()
    with pytest.raises(ValueError, match="at least 16"):
        protocol.load_secret("short")
    path = tmp_path / "s"
    path.write_text("a-long-enough-secret\n")
    assert protocol.load_secret(secret_file=str(path)) == b"a-long-enough-secret"
    monkeypatch.setenv(protocol.SECRET_ENV, "from-the-environment")
    assert protocol.load_secret() == b"from-the-environment"


def test_importing_the_distributed_package_protocol_and_worker_does_not_import_jax():
    code = ("import sys, jes.distributed, jes.distributed.protocol, jes.distributed.worker, jes.describe; "
            "assert 'jax' not in sys.modules, sorted(m for m in sys.modules if m.startswith('jax'))[:5]")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_a_peers_text_is_logged_on_one_line_with_its_control_characters_escaped():
    """A worker named "w9\\nERROR:...: FORGED" made the master's log show a line jes never wrote."""
    forged = "w9\nERROR:jes.distributed.master:FORGED\r\x1b[31m"
    assert protocol.loggable(forged, 200) == "w9\\nERROR:jes.distributed.master:FORGED\\r\\x1b[31m"
    assert protocol.loggable("x" * 100, 64) == "x" * 64
    assert protocol.loggable("ünïcode name", 64) == "ünïcode name"  # printable text as it is
