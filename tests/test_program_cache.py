"""jes.program_cache: a warm process calls the stored traced step instead of tracing it, with the same bits.

The key must miss on any change that could change the program; any unreadable entry falls back to tracing.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import jes
from jes import program_cache
from jes.loop import run

SMALL = dict(num_members=16, chunk_size=8, num_generations=2, eval_episodes=4)
pytestmark = pytest.mark.skipif(program_cache.importlib.util.find_spec("flatbuffers") is None,
                                reason="jax.export serialization needs flatbuffers")


@pytest.fixture
def cache_dir(tmp_path):
    """JAX's persistent cache (and so the program cache) in a fresh directory for this test."""
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "xla"))
    yield tmp_path / "xla" / program_cache.SUBDIR
    jax.config.update("jax_compilation_cache_dir", before)


def small_trainer(**changes):
    policy = changes.pop("policy", jes.GRUPolicy(hidden=3, layers=1))
    env = changes.pop("env", "CartPole-v1")
    optimizer = changes.pop("optimizer", "adam")
    devices = changes.pop("devices", None)
    return jes.Trainer(policy, env, optimizer, jes.ESConfig(**dict(SMALL, **changes)), devices=devices)


def trained(trainer, key=5):
    """A run's bits, its best member included (regenerated when asked for: through the member program)."""
    result = run(trainer, trainer.init_state(key), key=key)
    return (result.flat_params, result.history["centre_return"], np.asarray(result.state.obs_sum),
            result.best.flat_params)


class TracedFunctions:
    """Names of the functions jit traces from the top level while active (JAX's monitoring events).

    Patching jes to catch a trace would itself make runs uncacheable (see test_code_replaced_at_run_time...).
    """

    def __enter__(self):
        self.names = []
        self._listener = lambda event, duration, **kwargs: (
            self.names.append(kwargs.get("fun_name")) if event == "/jax/core/compile/jaxpr_trace_duration" else None)
        jax.monitoring.register_event_duration_secs_listener(self._listener)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._listener)


# What jes traces for the programs the cache holds (the step's exported form is "flat_step").
JES_PROGRAMS = {"generation_step", "flat_step", "_fresh_state_from_seed", "init_from_seed_flat", "member_params",
                "member_params_flat"}


def entries(directory):
    return sorted(p for p in os.listdir(directory) if p.endswith(".jesprog")) if directory.exists() else []


def keys_of(trainer):
    """The program cache's keys of ``trainer``'s init, step and member programs."""
    shapes = trainer._state_shapes()
    return {"init": trainer._program_key("init_from_seed", shapes), "step": trainer.step_program_key(shapes),
            "member": trainer._program_key("member_params", shapes)}


@pytest.mark.hard_timeout(300)
def test_hit_gives_the_bits_of_a_miss_and_of_no_cache(cache_dir):
    with_normalisation = dict(normalize_observations=True)
    with TracedFunctions() as on_miss:
        miss = trained(small_trainer(**with_normalisation))
    # the exports trace (so the recorder works)
    assert JES_PROGRAMS & set(on_miss.names) == {"flat_step", "init_from_seed_flat", "member_params_flat"}
    assert entries(cache_dir) == sorted(f"{k}.jesprog" for k in keys_of(small_trainer(**with_normalisation)).values())
    with TracedFunctions() as on_hit:  # a fresh trainer of the same run traces none of its programs
        hit = trained(small_trainer(**with_normalisation))
    assert not JES_PROGRAMS & set(on_hit.names), on_hit.names
    assert len(entries(cache_dir)) == 3
    jax.config.update("jax_compilation_cache_dir", None)
    traced = trained(small_trainer(**with_normalisation))
    for a, b, c in zip(miss, hit, traced):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


@pytest.mark.hard_timeout(300)
def test_background_compile_reads_the_cache_too(cache_dir):
    trained(small_trainer())
    with TracedFunctions() as traced:
        trainer = small_trainer()
        trainer.start_compiling_step()
        _, out, _ = trainer._compiling
        compiled, _ = trainer.compiled_step(trainer.init_state(5))
    assert compiled is out["compiled"]
    assert not JES_PROGRAMS & set(traced.names), traced.names


@pytest.fixture(scope="module")
def pristine_cache(tmp_path_factory):
    """A small run's bits and a copy of the cache its three programs were stored in (made once for the module).

    Keys cover jax's configuration, the cache's directory included: damaged copies go back to the same path."""
    root = tmp_path_factory.mktemp("pristine")
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(root / "xla"))
    try:
        expected = trained(small_trainer())
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
    shutil.copytree(root / "xla", root / "copy")
    return root, expected


@pytest.mark.hard_timeout(300)
@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped byte", "another key's file"])
def test_a_damaged_entry_falls_back_to_tracing(pristine_cache, damage):
    """Each of the three programs' entries damaged the same way: the run traces them again, with the same bits."""
    root, expected = pristine_cache
    shutil.rmtree(root / "xla")
    shutil.copytree(root / "copy", root / "xla")
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(root / "xla"))
    try:
        damaged_run_traces_again(root / "xla" / program_cache.SUBDIR, damage, expected)
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def damaged_run_traces_again(cache_dir, damage, expected):
    keys = keys_of(small_trainer())
    for key in keys.values():
        path = cache_dir / f"{key}.jesprog"
        blob = path.read_bytes()
        if damage == "garbage":
            path.write_bytes(b"not a program")
        elif damage == "truncated":
            path.write_bytes(blob[: len(blob) // 2])
        elif damage == "flipped byte":
            path.write_bytes(blob[:-10] + bytes([blob[-10] ^ 1]) + blob[-9:])
        else:  # a valid entry stored under another name: its recorded key does not match
            path.write_bytes(blob.replace(key.encode(), b"0" * 64, 1))
        assert program_cache.load(key) is None
    with TracedFunctions() as traced:
        got = trained(small_trainer())
    assert {"flat_step", "init_from_seed_flat", "member_params_flat"} <= set(traced.names), traced.names
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)
    for key in keys.values():
        assert program_cache.load(key) is not None  # stored again by the traced run


@pytest.mark.hard_timeout(120)
def test_each_program_has_its_own_key(cache_dir):
    keys = keys_of(small_trainer())
    assert None not in keys.values() and len(set(keys.values())) == 3


def key_of(trainer):
    shapes = jax.eval_shape(lambda: trainer.fresh_state(jax.random.key(0)))
    return trainer.step_program_key(jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type, sharding=trainer.replicated), shapes))


class MyPolicy(jes.MLPPolicy):
    """A policy from outside jes's packages: its helpers could change without the key seeing it."""


@pytest.mark.hard_timeout(120)
def test_the_key_misses_on_any_change_of_the_run(cache_dir, monkeypatch):
    base = key_of(small_trainer())
    assert base is not None and base == key_of(small_trainer())  # a separately built, equal run hits
    changed = [
        small_trainer(noise_std=0.1000001), small_trainer(num_members=18), small_trainer(chunk_size=4),
        small_trainer(eval_episodes=5), small_trainer(normalize_observations=False),
        small_trainer(optimizer="sgd"), small_trainer(learning_rate=0.02),
        small_trainer(policy=jes.GRUPolicy(hidden=4, layers=1)),
        small_trainer(policy=jes.GRUPolicy(hidden=3, layers=1, torch_layout=False)),
        small_trainer(max_episode_steps=100),
        small_trainer(env="Acrobot-v1"),
        jes.Trainer(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam", jes.ESConfig(**SMALL),
                    rollout_min_batch=8),
        jes.Trainer(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", None, jes.ESConfig(**SMALL), strategy="pgpe"),
    ]
    if jax.local_device_count() > 1:
        changed.append(small_trainer(devices=1))
    keys = [key_of(t) for t in changed]
    assert None not in keys and len(set(keys + [base])) == len(keys) + 1
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=true")
    assert key_of(small_trainer()) != base
    monkeypatch.delenv("XLA_FLAGS")
    with jax.default_matmul_precision("highest"):
        assert key_of(small_trainer()) != base


@pytest.mark.hard_timeout(120)
def test_what_cannot_be_fingerprinted_is_never_cached(cache_dir):
    import optax

    assert key_of(small_trainer(optimizer=optax.adam(0.01))) is None  # an optax object
    assert key_of(small_trainer(noise_std=lambda generation: 0.1)) is None  # a schedule
    assert key_of(small_trainer(policy=MyPolicy(hidden_sizes=(4,)))) is None  # code from outside jes's packages
    jax.config.update("jax_compilation_cache_dir", None)
    assert key_of(small_trainer()) is None  # cache off


@pytest.mark.hard_timeout(120)
def test_files_changed_since_the_process_started_are_never_keyed(cache_dir, monkeypatch):
    assert key_of(small_trainer()) is not None
    monkeypatch.setattr(jes, "IMPORTED_AT_NS", 0)  # as if every installed file changed after jes was imported
    assert key_of(small_trainer()) is None


@pytest.mark.hard_timeout(120)
def test_code_replaced_at_run_time_is_never_keyed(cache_dir, monkeypatch):
    """Monkeypatched code is in no file the key covers: a class method, a jes function, an instance's method."""
    import jes.generation

    assert key_of(small_trainer()) is not None

    def evaluate_members(self, *args):
        raise AssertionError("never traced here")

    with monkeypatch.context() as patch:
        patch.setattr(jes.Trainer, "evaluate_members", evaluate_members)
        assert key_of(small_trainer()) is None
    with monkeypatch.context() as patch:
        patch.setattr(jes.generation, "run_episodes", lambda *args, **kwargs: None)
        assert key_of(small_trainer()) is None
    with monkeypatch.context() as patch:
        patch.setattr(jes.GRUPolicy, "helper", lambda self: None, raising=False)  # any function from elsewhere
        assert key_of(small_trainer()) is None
    trainer = small_trainer()
    trainer.centre_from_chunks = lambda centre: (0.0, 0)
    assert key_of(trainer) is None
    assert key_of(small_trainer()) is not None


def test_fingerprint_is_exact():
    fp = program_cache.fingerprint
    assert fp(0.1) != fp(0.1 + 2 ** -56)  # the next float after 0.1
    assert fp(1) != fp(1.0) != fp(True)
    assert fp((1, 2)) != fp([1, 2])
    assert fp(np.float32(1)) != fp(np.float64(1))
    assert fp(np.zeros(3)) != fp(np.zeros(4))
    with pytest.raises(program_cache.Uncacheable):
        fp(lambda x: x)
    with pytest.raises(program_cache.Uncacheable):
        fp(object())


TWO_DEVICES = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    import jes
    assert len(jax.devices()) == 2, jax.devices()
    cache = sys.argv[1]
    out = {}
    def train(devices):
        r = jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "Pendulum-v1", "adam", key=3, devices=devices, log_dir=None,
                      progress=False, num_members=8, chunk_size=2, episodes_per_member=2, normalize_observations=True,
                      num_generations=2, eval_episodes=2, max_episode_steps=50)
        return [r.flat_params.tolist(), np.asarray(r.state.obs_sum).tolist(), r.history["pop_mean"].tolist(),
                r.best.flat_params.tolist()]  # the best member: regenerated when asked for, by the member program
    names = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: names.append(kw.get("fun_name")) if event.endswith("jaxpr_trace_duration") else None)
    for devices in (1, 2):
        out[f"off/{devices}"] = train(devices)
        jes.enable_compilation_cache(cache)
        out[f"miss/{devices}"] = train(devices)
        names.clear()
        out[f"hit/{devices}"] = train(devices)
        out[f"hit-traced/{devices}"] = sorted(set(names) & {"generation_step", "flat_step", "member_params",
                                                             "member_params_flat", "_fresh_state_from_seed",
                                                             "init_from_seed_flat"})
        jax.config.update("jax_compilation_cache_dir", None)
    print(json.dumps(out))
""")


@pytest.mark.hard_timeout(600)
def test_two_devices_hit_miss_and_no_cache_agree(tmp_path):
    """Pendulum MLP with observation normalisation over 2 CPU devices: a hit, a miss and no cache give the same
    bits, on 1 device and on 2 (separate cache entries)."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", TWO_DEVICES, str(tmp_path / "xla")], capture_output=True, text=True,
                          env=env, timeout=580)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for devices in (1, 2):
        assert out[f"hit-traced/{devices}"] == []
        assert out[f"miss/{devices}"] == out[f"off/{devices}"]
        assert out[f"hit/{devices}"] == out[f"off/{devices}"]
    assert out["off/1"][:2] == out["off/2"][:2]
    assert len(entries(tmp_path / "xla" / program_cache.SUBDIR)) == 6  # init, step and member, for 1 and 2 devices


def _tiny_exported(offset=1.0):
    return jax.export.export(jax.jit(lambda x: x + offset))(jax.ShapeDtypeStruct((3,), np.float32))


def test_an_entry_another_user_made_is_never_called(cache_dir, monkeypatch):
    """A shared cache folder: whoever can write it can compute a run's key and store a program of theirs under it,
    with a checksum that matches (it proves only that the file is intact). Only this user's own entries are read."""
    key = "0" * 64
    assert program_cache.store(key, _tiny_exported())
    assert program_cache.load(key) is not None  # this user's own entry
    mine = os.geteuid()
    monkeypatch.setattr(program_cache.os, "geteuid", lambda: mine + 1)  # the same file, as another user sees it
    assert program_cache.load(key) is None


def test_store_never_writes_through_a_link_planted_in_the_folder(cache_dir, tmp_path):
    """The temp file a store writes first has a fresh, exclusively created name: a link planted under a predictable
    name (``<entry>.<pid>.tmp``) to a file of this user's made the store overwrite that file."""
    key = "1" * 64
    os.makedirs(cache_dir, exist_ok=True)
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    entry = os.path.join(cache_dir, f"{key}.jesprog")
    for pid in {os.getpid(), *range(os.getpid() - 2, os.getpid() + 3)}:
        os.symlink(precious, f"{entry}.{pid}.tmp")
    assert program_cache.store(key, _tiny_exported())
    assert precious.read_text() == "keep me"
    assert program_cache.load(key) is not None
