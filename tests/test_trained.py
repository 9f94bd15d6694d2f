"""Using what was trained: result.act / policy_fn / evaluate reproduce training's centre evaluation
bit for bit; save_policy / load_policy round trips; the best member is regenerated from its key."""
import logging
import os
import re
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jes
from jes.generation import as_key
from jes.rollout import run_episodes
from jes.strategies import noise

SMALL = dict(num_members=8, num_generations=2, eval_episodes=8, log_dir=None, progress=False)


@pytest.fixture(scope="module", params=[("CartPole-v1", True), ("CartPole-v1", False),
                                        ("Pendulum-v1", True), ("Pendulum-v1", False)],
                ids=["cartpole-norm", "cartpole-raw", "pendulum-norm", "pendulum-raw"])
def result(request):
    env, normalize = request.param
    return jes.train(jes.MLPPolicy(hidden_sizes=(8,)), env, key=1, normalize_observations=normalize,
                     max_episode_steps=60, **SMALL)


def test_evaluate_reproduces_the_centre_evaluation_bit_for_bit(result):
    key = jax.random.key(7)
    expected, _ = jax.jit(result.trainer.evaluate_centre, static_argnums=1)(result.state, 8, key)
    got = result.evaluate(8, key)
    np.testing.assert_array_equal(got, np.asarray(expected))
    # an int seed (seeded inside the evaluation program) is the same as jax.random.key(seed)
    np.testing.assert_array_equal(result.evaluate(8, 7), got)
    np.testing.assert_array_equal(result.evaluate(8, np.int64(-5)), result.evaluate(8, jax.random.key(-5)))
    # and the run's own last centre evaluation, with the key it used
    state = result.state
    centre_key = noise.generation_key(state.es_key, state.generation)
    assert np.float32(result.evaluate(8, centre_key).mean()) == np.float32(result.history["centre_return"][-1])


def test_policy_fn_is_self_contained_and_matches_act(result):
    fn = jax.jit(result.policy_fn())
    carry = result.initial_carry()
    obs = jnp.linspace(-0.5, 0.5, result.trainer.spec.obs_shape[0])
    c1, a1 = fn(carry, obs)
    c2, a2 = result.act(carry, obs)
    # policy_fn bakes the values in as constants, which XLA may fold: the last bit of a continuous action can differ
    np.testing.assert_allclose(np.asarray(a1), np.asarray(a2), rtol=1e-5)
    if result.trainer.spec.discrete:
        assert a1.dtype == jnp.int32 and a1.shape == ()
    else:
        low, high = result.trainer.spec.action_low, result.trainer.spec.action_high
        assert a1.shape == result.trainer.spec.action_shape and np.all(low <= a1) and np.all(a1 <= high)
    # A batch is refused with act's advice (a trial: CartPole's [8, 4] to a policy that flattens its input gave the
    # scalar action 15 of 2, silently)
    batch = jnp.zeros((8, *result.trainer.spec.obs_shape))
    with pytest.raises(ValueError, match=r"policy_fn's function takes one observation of shape \(\d+,\), got "
                                         r"shape \(8, \d+\); for a batch of envs use jax.vmap\(fn\)"):
        fn(carry, batch)
    _, actions = jax.vmap(result.policy_fn(), in_axes=(None, 0))(carry, batch)
    assert actions.shape[0] == 8


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_stepping_the_env_with_act_gives_the_evaluated_return(env):
    """A plain Python loop over env.step with result.act: exact on a discrete env; on a continuous one the
    unbatched step may round the last bit of an action differently from the batched rollout."""
    result = jes.train(jes.GRUPolicy(hidden=3, layers=1), env, key=2, max_episode_steps=60, **SMALL)
    spec = result.trainer.spec
    key = noise.centre_episode_keys(as_key(5), 1)[0]
    obs, state = spec.env.reset_env(jax.random.fold_in(key, 0), spec.params)
    step = jax.jit(lambda k, s, a: spec.env.step_env(k, s, a, spec.params))
    carry, total = result.initial_carry(), 0.0
    for t in range(spec.max_steps):
        carry, action = result.act(carry, obs)
        obs, state, reward, done, _ = step(jax.random.fold_in(key, t + 1), state, action)
        total += float(reward)
        if bool(done) or bool(spec.done_after(done, state)):
            break
    expected = float(result.evaluate(1, 5)[0])
    assert total == expected if spec.discrete else total == pytest.approx(expected, rel=1e-4)


def test_raw_policy_apply_is_not_what_was_trained_but_act_is():
    """The README's old recipe skipped the normaliser; act applies the one training used."""
    result = jes.train(jes.MLPPolicy(hidden_sizes=(8,)), "CartPole-v1", key=1, **SMALL)
    mean, std = (np.asarray(x) for x in result.trainer.obs_norm(result.state))
    obs = np.array([0.1, -0.2, 0.05, 0.3], np.float32)
    _, out = result.trainer.fns.apply(result.params, (), (obs - mean) / std)
    assert int(result.act((), obs)[1]) == int(np.argmax(np.asarray(out)))


def test_save_and_load_policy_round_trip(result, tmp_path):
    path = result.save_policy(str(tmp_path / "policy.jes"))
    loaded = jes.load_policy(path)
    np.testing.assert_array_equal(loaded.flat_params, result.flat_params)
    assert loaded.env_name == result.env_name
    np.testing.assert_array_equal(loaded.evaluate(8, 3), result.evaluate(8, 3))
    obs = jnp.ones(result.trainer.spec.obs_shape) * 0.1
    np.testing.assert_array_equal(np.asarray(loaded.act(loaded.initial_carry(), obs)[1]),
                                  np.asarray(result.act(result.initial_carry(), obs)[1]))
    for batch in (jnp.stack([obs, obs, obs]), obs[None]):  # a batch (even of one)
        with pytest.raises(ValueError, match=rf"act takes one observation of shape "
                                             rf"{re.escape(str(tuple(obs.shape)))}, got shape "
                                             rf"{re.escape(str(tuple(batch.shape)))}; for a batch of envs use "
                                             rf"jax.vmap\(policy.policy_fn\(\)\)"):
            loaded.act(loaded.initial_carry(), batch)
    # another shape is not a batch: no vmap advice (a trial: CartPole given 3 numbers was told to vmap)
    with pytest.raises(ValueError, match=rf"got shape \({obs.size + 2},\) \(the env '{result.env_name}' gives "
                                         rf"{re.escape(str(tuple(obs.shape)))}\)$"):
        loaded.act(loaded.initial_carry(), jnp.ones(obs.size + 2))


def test_act_names_a_carry_that_is_not_the_policys():
    """Trial: act(None, obs) of a GRU (Stable-Baselines3's predict(obs, state=None)) raised "'NoneType' object is not
    subscriptable"; a feed-forward policy's empty carry may still be given as None."""
    gru = jes.train(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", key=1, **SMALL)
    obs = np.ones(4, np.float32)
    with pytest.raises(ValueError, match=r"act\(carry, obs\) takes this policy's carry, shaped as initial_carry\(\)'s "
                                         r"\(GRUPolicy: PyTreeDef\(\*\)\), got PyTreeDef\(None\): start each episode "
                                         r"with carry = policy.initial_carry\(\)"):
        gru.act(None, obs)
    for wrong in (np.zeros(3, np.float32), np.zeros((2, 1, 3), np.float32)):  # unbatched, or a batch (a review)
        with pytest.raises(ValueError, match=rf"\(GRUPolicy: float32\[1, 3\]\), got float32\{list(wrong.shape)}: "
                                             r".*jax.vmap\(policy.policy_fn\(\)\)"):
            gru.act(wrong, obs)
    carry, action = gru.act(gru.initial_carry(), obs)
    assert gru.act(carry, obs)[0].shape == carry.shape
    mlp = jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", key=1, **SMALL)
    for empty in (None, 0, {}, []):  # it reads none (a review: 0, {} and [] were taken before)
        assert int(mlp.act(empty, obs)[1]) == int(mlp.act(mlp.initial_carry(), obs)[1])


def test_a_policy_no_program_could_rebuild_is_not_saved_to_a_file(tmp_path):
    """A lambda in a field was written without a word, and load_policy could never read the file back."""
    lam = jes.MLPPolicy(hidden_sizes=(4,), activation=lambda x: jax.nn.relu(x))
    result = jes.train(lam, "CartPole-v1", "adam", num_members=16, num_generations=1, eval_episodes=2, log_dir=None,
                       progress=False)
    with pytest.raises(jes.describe.DescriptionError, match=r"cannot save this policy to a file: policy.activation "
                                                            r"holds the callable .*lambda"):
        result.save_policy(str(tmp_path / "lambda.policy"))
    assert not os.listdir(tmp_path)


def test_a_dict_field_that_no_file_describes_is_named_with_what_to_give():
    """A trial: a dict field was refused as "not plain data"; a file holds no mappings, and a tuple of pairs saves."""
    with pytest.raises(jes.describe.DescriptionError, match=r"policy.extra holds a dict \{'a': 1\}, which a policy "
                                                            r"file or checkpoint cannot describe .*; give it as a "
                                                            r"tuple of \(key, value\) pairs"):
        jes.describe.describe_value({"a": 1}, "policy.extra")
    assert jes.describe.describe_value((("a", 1),), "policy.extra")["tuple"]


def test_a_trained_policy_pickles_as_its_policy_file(result, tmp_path):
    """pickle (a worker process's return) and deepcopy: the policy file's bytes, read back as load_policy reads them
    (the Flax module's jnp.tanh is named, not pickled); parameters and normaliser bit for bit, the same actions and
    returns. deepcopy keeps (shares) the env it was given."""
    import copy
    import pickle

    trained = result.trained_policy()
    data = pickle.dumps(trained)
    assert b"jes.trained" in data and b"_unpickled_policy" in data and b"flax" not in data  # the file, not the module
    for back in (pickle.loads(data), copy.deepcopy(trained)):
        assert type(back.policy) is type(trained.policy) and back.policy == trained.policy
        assert back.flat_params.tobytes() == trained.flat_params.tobytes()
        assert (back.obs_stats is None) == (trained.obs_stats is None)
        for x, y in zip(back.obs_stats or (), trained.obs_stats or ()):
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
        assert (back.action_map, back.env_name, back.max_steps, back.obs_shape) == (
            trained.action_map, trained.env_name, trained.max_steps, trained.obs_shape)
        np.testing.assert_array_equal(back.evaluate(8, 3), trained.evaluate(8, 3))
    assert copy.deepcopy(trained)._spec is trained._spec


def test_a_trained_policy_no_file_can_name_pickles_as_pickle_does():
    """A policy that no policy file can name (here a field that is not plain data; a notebook's own class) pickles its
    module as pickle does."""
    import copy
    import pickle

    trained = jes.trained.TrainedPolicy(TaggedPolicy(), np.arange(10, dtype=np.float32), (4,),
                                        jes.trained.ActionMap(discrete=True, num_outputs=2))
    with pytest.raises(jes.describe.DescriptionError):
        jes.trained.policy_bytes(trained)
    for back in (pickle.loads(pickle.dumps(trained)), copy.deepcopy(trained)):
        assert back.policy == trained.policy and back.flat_params.tobytes() == trained.flat_params.tobytes()


class TaggedPolicy(nn.Module):
    tags: frozenset = frozenset({"tag"})  # not plain data: no file describes it

    @nn.compact
    def __call__(self, obs):
        return nn.Dense(2)(obs)


def _policy_of(module: nn.Module, discrete: bool = True) -> "jes.trained.TrainedPolicy":
    return jes.trained.TrainedPolicy(module, np.linspace(-1, 1, 4 * 4 + 4 + 4 * 2 + 2).astype(np.float32), (4,),
                                     jes.trained.ActionMap(discrete=discrete, num_outputs=2), env_name="CartPole-v1")


def test_a_trained_policy_of_a_users_own_module_unpickles():
    """A policy class of the user's own module, with a field naming a function of that module, comes back (the
    file's own modules allowed where it is read: pickle imports them by name all the same); one whose file names
    what no loader builds (a builtin) pickles as pickle does rather than failing where it is unpickled."""
    import copy
    import pickle

    import policies_for_tests as mine

    for module in (mine.SwishPolicy(), mine.AbsPolicy()):
        trained = _policy_of(module)
        for back in (pickle.loads(pickle.dumps(trained)), copy.deepcopy(trained)):
            assert type(back.policy) is type(module) and back.policy.act is module.act
            assert back.flat_params.tobytes() == trained.flat_params.tobytes()
            carry, obs = trained.initial_carry(), np.ones(4, np.float32)
            assert int(back.act(carry, obs)[1]) == int(trained.act(carry, obs)[1])


OWN_MODULE_POOL_SCRIPT = '''
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np


def train(seed):
    import jes
    import policies_for_tests
    return jes.train(policies_for_tests.SwishPolicy(), "CartPole-v1", "adam", key=seed, num_members=8,
                     num_generations=1, eval_episodes=2, log_dir=None, progress=False)


def abs_policy():
    import jes
    import policies_for_tests
    return jes.trained.TrainedPolicy(policies_for_tests.AbsPolicy(), np.zeros(30, np.float32), (4,),
                                     jes.trained.ActionMap(discrete=True, num_outputs=2), env_name="CartPole-v1")


if __name__ == "__main__":
    import jes
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(train, 3), pool.submit(abs_policy), pool.submit(train, 4)]
        results = [f.result(timeout=float(sys.argv[1])) for f in futures]
    assert "policies_for_tests" in sys.modules  # imported by unpickling, as pickle imports a class's module
    assert [type(r.policy).__name__ for r in results] == ["SwishPolicy", "AbsPolicy", "SwishPolicy"]
    assert results[0].trainer is None and results[0].summary().startswith("CartPole-v1")
    assert np.isfinite(results[2].evaluate(2)).all()
    print("every result came back")
'''


@pytest.mark.hard_timeout(660)
def test_results_of_a_users_own_policy_module_come_back_from_a_spawn_pool(tmp_path):
    """A spawn ProcessPoolExecutor returns results whose policy class (and its activation) is of the user's own
    module, one the parent never imported, and a policy whose file names a builtin: none breaks the pool."""
    from subprocess_for_tests import run_script

    script = tmp_path / "pool.py"
    script.write_text(OWN_MODULE_POOL_SCRIPT)
    done = run_script(script, "300", tests=True)
    assert done.returncode == 0 and "every result came back" in done.stdout, done.stdout + done.stderr


def test_copying_a_policy_keeps_its_env_and_says_nothing_of_its_parameters(result):
    """copy.copy shares the env it was given; a copy (shallow, deep, pickled) of a diverged policy does not warn as
    loading its file would: the policy copied said nothing."""
    import copy
    import pickle

    trained = result.trained_policy()
    spec = jes.envs.make_env(trained.env_name, max_steps=trained.max_steps)
    given = jes.trained.TrainedPolicy(trained.policy, trained.flat_params, trained.obs_shape, trained.action_map,
                                      trained.obs_stats, trained.env_name, trained.max_steps, env=spec)
    shallow = copy.copy(given)
    assert shallow._spec is spec and shallow.policy is given.policy and shallow.flat_params is given.flat_params
    np.testing.assert_array_equal(shallow.evaluate(4, 3), given.evaluate(4, 3))
    diverged = jes.trained.TrainedPolicy(trained.policy, np.full_like(trained.flat_params, np.nan),
                                         trained.obs_shape, trained.action_map, trained.obs_stats, trained.env_name,
                                         trained.max_steps)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for back in (copy.copy(diverged), copy.deepcopy(diverged), pickle.loads(pickle.dumps(diverged))):
            assert np.isnan(back.flat_params).all()


def test_load_policy_refuses_other_files(tmp_path):
    bad = tmp_path / "not.jes"
    bad.write_bytes(b"JESCKPT1" + b"\0" * 60)
    with pytest.raises(jes.trained.PolicyFileError, match="checkpoint"):
        jes.load_policy(str(bad))
    with pytest.raises(FileNotFoundError):
        jes.load_policy(str(tmp_path / "missing.jes"))


def test_best_member_is_regenerated_from_its_key():
    result = jes.train(jes.MLPPolicy(hidden_sizes=(8,)), "CartPole-v1", key=4, **SMALL)
    best = result.best
    assert best.fitness == pytest.approx(float(np.max(result.history["pop_max"])))
    assert 1 <= best.generation <= 2 and 0 <= best.member < 8
    # Re-run its training episodes from (run key, generation, member): the same fitness.
    trainer = result.trainer
    state = trainer.init_state(4)
    for _ in range(best.generation - 1):
        state, _ = trainer.step(state, jnp.bool_(False), jnp.bool_(True))
    np.testing.assert_array_equal(np.asarray(trainer.member(state, best.member)), best.flat_params)
    gen_key = noise.generation_key(state.es_key, state.generation)
    keys = noise.episode_keys(gen_key, jnp.array([best.member]), 1, trainer.antithetic)
    params = jax.tree.map(lambda x: x[None], trainer.params_tree(best.flat_params))
    out = run_episodes(trainer.fns, trainer.spec, params, keys, jnp.ones(1, bool), obs_scale=trainer.obs_scale(state))
    assert float(out.returns[0, 0]) == pytest.approx(best.fitness)
    assert isinstance(best.policy, jes.TrainedPolicy)


class NaNPolicy(nn.Module):
    num_outputs: int | None = None

    @nn.compact
    def __call__(self, obs):
        return nn.Dense(self.num_outputs)(obs) * jnp.nan


def test_non_finite_policy_outputs_on_a_discrete_env_are_an_error():
    with pytest.raises(jes.NonFiniteFitnessError, match="policy outputs") as info:
        jes.train(NaNPolicy(), "CartPole-v1", **SMALL)
    assert info.value.generation == 1


def test_reading_the_result_and_evaluating_it_compile_only_the_evaluation(caplog):
    """Each eager jax op is a compile in a fresh process: the result's parameters are unravelled on the host and an
    evaluation derives its episode keys inside its one program (before: ~10 small compiles, ~0.5 s cold)."""
    # Shapes no other test uses, so nothing is compiled already in this process.
    result = jes.train(jes.MLPPolicy(hidden_sizes=(7,)), "CartPole-v1", key=2, normalize_observations=True,
                       max_episode_steps=30, **SMALL)
    caplog.set_level(logging.WARNING)
    with jax.log_compiles(True):
        params = result.trainer.params_tree(result.flat_params)
        policy = result.trained_policy()
        np.testing.assert_array_equal(np.asarray(jax.tree.leaves(policy.params)[0]), np.asarray(jax.tree.leaves(params)[0]))
        returns = result.evaluate(num_episodes=5, key=3)
    assert returns.shape == (5,)
    compiled = [r.getMessage().split(" in ")[0] for r in caplog.records if "Finished XLA compilation" in r.getMessage()]
    assert compiled == ["Finished XLA compilation of jit(run)"], compiled


# --------------------------------------------------------------- what a policy file may hold
def small_trained_policy() -> jes.TrainedPolicy:
    """A CartPole policy with observation statistics, made without training."""
    spec = jes.make_env("CartPole-v1")
    return jes.TrainedPolicy(jes.MLPPolicy(hidden_sizes=(3,), num_outputs=2), np.linspace(-1, 1, 23),
                             spec.obs_shape, jes.trained.ActionMap.from_spec(spec),
                             obs_stats=(np.float32(10.0), np.ones(4, np.float32), np.full(4, 2.0, np.float32)),
                             env_name="CartPole-v1", max_steps=20)


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory):
    """A CartPole policy file with observation statistics (bytes)."""
    path = jes.save_policy(small_trained_policy(), str(tmp_path_factory.mktemp("policy") / "run.policy"))
    return open(path, "rb").read()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_policy_file_gets_the_permissions_a_plain_open_gives(tmp_path):
    """save_policy wrote 0600 files (mkstemp's mode), unreadable by the folder's other users: a .policy file is
    what one carries to wherever jes is installed, and GIFs and PNGs beside it were 0644."""
    path = jes.save_policy(small_trained_policy(), str(tmp_path / "run.policy"))
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o666 & ~_umask())
    jes.save_policy(small_trained_policy(), path)  # over an earlier file too
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o666 & ~_umask())
    assert os.listdir(tmp_path) == ["run.policy"]


def test_a_policy_path_that_cannot_be_written_is_named_with_the_cause(tmp_path):
    """The errors named jes's hidden temporary file ('/proc/.x.policy.6mpiwmqv.tmp', '.pol.5h4qyvhh.tmp' ->
    'out/pol') or read as a refusal to overwrite a file ("File exists: '.../checkpoint.ckpt'")."""
    trained = small_trained_policy()
    (tmp_path / "file.txt").write_text("a file, not a folder")
    (tmp_path / "out" / "pol").mkdir(parents=True)
    cases = [(str(tmp_path / "file.txt" / "x.policy"), NotADirectoryError, "is a file, not a folder"),
             (str(tmp_path / "file.txt" / "deeper" / "x.policy"), NotADirectoryError, "is a file, not a folder"),
             (str(tmp_path / "out" / "pol"), IsADirectoryError, "it is a folder"),
             ("/proc/x.policy", OSError, "a file cannot be created in '/proc'")]
    for path, error, cause in cases:
        with pytest.raises(error) as raised:
            jes.save_policy(trained, path)
        message = str(raised.value)
        assert message.startswith(f"cannot write {path!r}: ") and cause in message, message
        assert ".tmp" not in message and "File exists" not in message, message
    assert (tmp_path / "file.txt").read_text() == "a file, not a folder"
    assert sorted(os.listdir(tmp_path)) == ["file.txt", "out"] and os.listdir(tmp_path / "out" / "pol") == []


def rewritten(data: bytes, path, meta_change=None, content_change=None) -> str:
    """``data`` (a policy file) with its meta and content changed, under a valid header and checksum, at ``path``."""
    import json

    from flax import serialization

    import file_fuzz

    content = serialization.msgpack_restore(data[file_fuzz.HEADER.size:])
    meta = json.loads(content["meta"])
    if meta_change is not None:
        meta_change(meta)
    content["meta"] = json.dumps(meta)
    if content_change is not None:
        content_change(content)
    path.write_bytes(file_fuzz.frame("policy", serialization.msgpack_serialize(content)))
    return str(path)


@pytest.mark.parametrize("policy, message", [
    ({"class": "jes.policies:MLPPolicy", "fields": {"activation": {"class": "flax.linen:Dense", "fields": {}}}},
     r"policy.activation: Dense\(\.\.\.\) failed: TypeError: .*'features'"),
    ({"class": "jes.policies:MLPPolicy",
      "fields": {"parent": {"class": "flax.linen:Dense", "fields": {"features": 2}}}},
     r"policy: MLPPolicy\(\.\.\.\) failed: AssertionError"),
    ({"class": "jes.strategies.pgpe:PGPE", "fields": {}},
     r"jes.strategies.pgpe:PGPE is not a flax.linen.Module subclass"),
], ids=["layer-fields", "policy-fields", "role"])
def test_a_policy_file_whose_registered_class_does_not_build_is_not_told_to_allow_its_module(policy_file, tmp_path,
                                                                                            policy, message):
    path = rewritten(policy_file, tmp_path / "refused.policy", lambda meta: meta.update(policy=policy))
    with pytest.raises(jes.trained.PolicyFileError, match=message) as raised:
        jes.load_policy(path)
    text = str(raised.value)
    assert "allow_modules" not in text and "--allow-module" not in text and "Import your policy" not in text, text
    assert "restore_state" not in text  # a checkpoint's advice: a policy file has no trainer state
    outside = rewritten(policy_file, tmp_path / "outside.policy",
                        lambda meta: meta.update(policy={"class": "jes_not_imported_policies:Tiny", "fields": {}}))
    with pytest.raises(jes.trained.PolicyFileError, match=r"Import your policy's module first or pass allow_modules"):
        jes.load_policy(outside)  # a class outside the allowlist: there the advice helps


@pytest.fixture
def missing_package_env(monkeypatch):
    """A Gymnasium id whose entry point's package is not installed (as shimmy's GymV26Environment-v0 without shimmy)."""
    gymnasium = pytest.importorskip("gymnasium")
    spec = gymnasium.envs.registration.EnvSpec("JesNeedsMissing-v0", entry_point="jes_no_such_package.envs:Env",
                                               max_episode_steps=20)
    monkeypatch.setitem(gymnasium.registry, spec.id, spec)
    return "gymnasium:JesNeedsMissing-v0"


def test_evaluating_a_policy_whose_env_needs_a_missing_package_names_both(policy_file, tmp_path, missing_package_env):
    """evaluate() raised the raw ImportError of gymnasium.make, naming neither the env nor what to do."""
    path = rewritten(policy_file, tmp_path / "missing.policy", lambda meta: meta.update(env_name=missing_package_env))
    trained = jes.load_policy(path)
    with pytest.raises(ImportError, match=r"cannot rebuild env 'gymnasium:JesNeedsMissing-v0' for evaluation: .*"
                                          r"needs the package 'jes_no_such_package'.*pass env=\.\.\.") as raised:
        trained.evaluate(num_episodes=1)
    assert isinstance(raised.value.__cause__, ImportError)


def test_evaluating_a_policy_on_gymnasiums_gym_v26_env_without_shimmy_names_both(policy_file, tmp_path):
    pytest.importorskip("gymnasium")
    try:
        import shimmy  # noqa: F401
        pytest.skip("shimmy is installed: GymV26Environment-v0 is buildable here")
    except ImportError:
        pass
    path = rewritten(policy_file, tmp_path / "v26.policy",
                     lambda meta: meta.update(env_name="gymnasium:GymV26Environment-v0"))
    with pytest.raises(ImportError, match=r"cannot rebuild env 'gymnasium:GymV26Environment-v0' for evaluation: .*"
                                          r"shimmy.*pass env=\.\.\."):
        jes.load_policy(path).evaluate(num_episodes=1)


@pytest.mark.parametrize("field, value, message", [
    ("obs_count", np.asarray(-5.0, np.float32), r"obs_count is -5.0; a count of observations is positive and finite"),
    ("obs_count", np.asarray(np.nan, np.float32), r"obs_count is nan"),
    ("obs_count", np.asarray(-1, np.int32), r"obs_count is -1"),
])
def test_invalid_observation_statistics_in_a_policy_file_are_refused(policy_file, tmp_path, field, value, message):
    """They loaded without a word, and every observation was then normalised to NaN."""
    path = rewritten(policy_file, tmp_path / "stats.policy", content_change=lambda c: c.update({field: value}))
    with pytest.raises(jes.trained.PolicyFileError, match=message) as raised:
        jes.load_policy(path)
    assert path in str(raised.value)


@pytest.mark.parametrize("field, value, message", [
    ("obs_sum", np.full(4, np.inf, np.float32), r"obs_sum holds 4 non-finite value"),
    ("obs_sumsq", np.asarray([1.0, np.nan, 1.0, -np.inf], np.float32), r"obs_sumsq holds 2 non-finite value"),
])
def test_non_finite_observation_sums_in_a_policy_file_load_with_a_warning(policy_file, tmp_path, field, value, message):
    """A run whose observations left float32's range writes such sums itself: its file loads, and says so."""
    path = rewritten(policy_file, tmp_path / "stats.policy", content_change=lambda c: c.update({field: value}))
    with pytest.warns(UserWarning, match=message):
        jes.load_policy(path)


def test_a_policy_file_naming_an_env_parameter_nan_is_refused(policy_file, tmp_path):
    """It loaded, and evaluate returned NaN returns. (An infinite value, a threshold turned off, still loads.)"""
    path = rewritten(policy_file, tmp_path / "nan.policy", lambda meta: meta.update(env_name="CartPole-v1?gravity=nan"))
    with pytest.raises(jes.trained.PolicyFileError, match=r"env name 'CartPole-v1\?gravity=nan' sets gravity=nan"):
        jes.load_policy(path)
    path = rewritten(policy_file, tmp_path / "inf.policy",
                     lambda meta: meta.update(env_name="CartPole-v1?x_threshold=inf"))
    assert jes.load_policy(path).env_spec().params.x_threshold == float("inf")


def test_a_policy_file_with_non_finite_parameters_loads_with_a_warning(policy_file, tmp_path):
    """A diverged run's file is still data to inspect: it loads, and says how many values are not finite."""
    def change(content):
        params = np.array(content["params"])
        params[[0, 5, 7]] = [np.nan, np.inf, -np.inf]
        content["params"] = params

    path = rewritten(policy_file, tmp_path / "diverged.policy", content_change=change)
    with pytest.warns(UserWarning, match=rf"policy file {re.escape(path)}: 3 of 23 parameters are not finite"):
        trained = jes.load_policy(path)
    assert np.isnan(trained.flat_params[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jes.load_policy(rewritten(policy_file, tmp_path / "fine.policy"))


NNX_LOAD_SCRIPT = '''
import sys

import numpy as np

import jes
import policies_for_tests  # the nnx class's module, imported by the program that loads the file

trained = jes.load_policy(sys.argv[1])
print("params", trained.flat_params.tobytes().hex())
print("returns", np.asarray(trained.evaluate(4), np.float32).tobytes().hex())
'''


@pytest.mark.hard_timeout(900)
def test_a_flax_nnx_policy_trains_resumes_and_is_saved_loaded_and_evaluated_elsewhere(tmp_path):
    """A flax.nnx module through Flax's bridge (``nnx.bridge.ToLinen``): its run writes a checkpoint that resumes
    and that ``jes eval`` rebuilds, and its policy file loads in another process (its module imported there) with
    the same parameters and the same returns, bit for bit; a file naming a linen class as the nnx class is refused.
    Before, the checkpoint could not be evaluated by another program and save_policy raised on ToLinen's fields."""
    from flax import nnx

    import policies_for_tests as mine
    from subprocess_for_tests import checkout_env, run_script

    policy = nnx.bridge.ToLinen(mine.NnxMLP, args=(2,), kwargs={"features": 6})
    run = tmp_path / "run"
    result = jes.train(policy, "CartPole-v1", "adam", key=3, **dict(SMALL, log_dir=str(run)))
    resumed = jes.train(policy, "CartPole-v1", "adam", key=3, resume=True,
                        **dict(SMALL, num_generations=3, log_dir=str(run)))
    assert list(resumed.history["generation"]) == [1, 2, 3] and result.flat_params.size == 4 * 6 + 6 + 6 * 2 + 2
    path = tmp_path / "nnx.policy"
    resumed.save_policy(str(path))
    script = tmp_path / "load.py"
    script.write_text(NNX_LOAD_SCRIPT)
    done = run_script(script, str(path), timeout=600, tests=True)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith(("params", "returns")))
    assert lines["params"] == np.asarray(resumed.flat_params, np.float32).tobytes().hex()
    assert lines["returns"] == np.asarray(resumed.evaluate(4), np.float32).tobytes().hex()
    import subprocess
    import sys

    evaluated = subprocess.run([sys.executable, "-m", "jes", "eval", str(run / "checkpoint.ckpt"), "--import",
                                "policies_for_tests", "--episodes", "4"], env=checkout_env(tests=True),
                               capture_output=True, text=True, timeout=600)
    assert evaluated.returncode == 0 and "ToLinen" in evaluated.stdout, evaluated.stdout + evaluated.stderr

    def linen_class(meta):
        meta["policy"]["fields"]["nnx_class"] = {"__nnx_class__": "policies_for_tests:SwishPolicy"}

    with pytest.raises(jes.trained.PolicyFileError, match=r"SwishPolicy' is not a flax.nnx.Module subclass"):
        jes.load_policy(rewritten(path.read_bytes(), tmp_path / "linen.policy", linen_class))


def test_a_flax_nnx_module_instance_is_refused_naming_flaxs_bridge():
    from flax import nnx

    import policies_for_tests as mine

    with pytest.raises(TypeError, match=r"flax.nnx module \(NnxMLP\).*nnx.bridge.ToLinen\(NnxMLP, args="):
        jes.train(mine.NnxMLP(2, rngs=nnx.Rngs(0)), "CartPole-v1", "adam", **SMALL)


def test_a_flax_nnx_class_no_program_can_import_is_not_saved_to_a_policy_file(tmp_path):
    from flax import nnx

    class Local(nnx.Module):  # a class no other program can import
        def __init__(self, rngs):
            self.head = nnx.Linear(4, 2, rngs=rngs)

        def __call__(self, obs):
            return self.head(obs)

    trained = jes.trained.TrainedPolicy(nnx.bridge.ToLinen(Local), np.zeros(10, np.float32), (4,),
                                        jes.trained.ActionMap(discrete=True, num_outputs=2), env_name="CartPole-v1")
    with pytest.raises(jes.describe.DescriptionError, match=r"nnx_class is test_trained:.*<locals>.Local, which cannot be imported by name"):
        trained.save(str(tmp_path / "local.policy"))


@pytest.mark.parametrize("name, message", [
    ("NnxRecurrent", r"policy ToLinen \(NnxRecurrent\) is recurrent, and Flax's bridge cannot run an nnx module's "
                     r"initialize_carry outside a call .*written with flax.linen"),
    ("NnxDropout", r"policy ToLinen \(NnxDropout\) cannot be built as a pure function of its parameters \(KeyError: "
                   r".*leave nnx.Dropout out of the policy"),
    ("NnxBatchNorm", r"policy ToLinen \(NnxBatchNorm\) updates \['batch_stats'\]\['norm'\]\['mean'\], "
                     r"\['batch_stats'\]\['norm'\]\['var'\] as it acts, which Flax's bridge drops without a word "
                     r".*give nnx.BatchNorm use_running_average=True"),
])
def test_what_flaxs_bridge_cannot_run_for_jes_is_said(name, message):
    """A review: a recurrent nnx module failed with Flax's CallCompactUnboundModuleError, and nnx.Dropout with a raw
    KeyError of its RNG stream, neither saying what jes cannot do with them."""
    from flax import nnx

    import policies_for_tests as mine

    with pytest.raises(ValueError, match=message):
        jes.train(nnx.bridge.ToLinen(getattr(mine, name), args=(2,)), "CartPole-v1", "adam", **SMALL)


@pytest.mark.hard_timeout(600)
def test_an_nnx_batchnorm_with_running_averages_trains_and_acts_on_the_observation():
    """The refusal above is of a training-mode nnx.BatchNorm only: with use_running_average=True the policy trains
    (its statistics evolved as batch_stats), and its output depends on the observation."""
    from flax import nnx

    import policies_for_tests as mine

    policy = nnx.bridge.ToLinen(mine.NnxBatchNorm, args=(2,), kwargs={"running": True})
    result = jes.train(policy, "CartPole-v1", "adam", **SMALL)
    outs = {tuple(np.asarray(policy.apply(result.params, np.asarray(obs, np.float32))).tolist())
            for obs in ([0.1, 0.2, 0.3, 0.4], [-3.0, 1.0, 2.0, -1.0])}
    assert "batch_stats" in result.params and len(outs) == 2
    # (a review: every update the call made was refused as a BatchNorm's; a counter of one's own changes no output)
    jes.train(nnx.bridge.ToLinen(mine.NnxCounter, args=(2,)), "CartPole-v1", "adam", **SMALL)


def test_the_command_line_trains_an_nnx_class_with_its_arguments_and_the_envs_output_size(tmp_path):
    """``jes train --policy module:NnxClass --policy-arg k=v`` trains it through Flax's bridge (it said the class
    was not a flax.linen.Module class), its num_outputs filled in from the env as for jes's own policies."""
    import subprocess
    import sys

    from subprocess_for_tests import checkout_env

    def jes_train(*args):
        return subprocess.run([sys.executable, "-m", "jes", "train", "--env", "CartPole-v1", "--policy",
                               "policies_for_tests:NnxMLP", "--population", "8", "--generations", "1", *args],
                              env=checkout_env(tests=True), cwd=tmp_path, capture_output=True, text=True, timeout=600)

    done = jes_train("--policy-arg", "features=3", "--log-dir", str(tmp_path / "run"), "--save-policy",
                     str(tmp_path / "cli.policy"))
    assert done.returncode == 0, done.stdout + done.stderr
    import policies_for_tests  # noqa: F401 - the file's nnx class's module

    loaded = jes.load_policy(str(tmp_path / "cli.policy"))
    assert loaded.policy.kwargs == {"features": 3, "num_outputs": 2} and loaded.flat_params.size == 4 * 3 + 3 + 3 * 2 + 2
    refused = jes_train("--policy-arg", "width=3")
    assert refused.returncode != 0 and "--policy-arg width: NnxMLP.__init__ has no such argument; its arguments are " \
        "num_outputs, features" in refused.stderr, refused.stderr


def test_a_toLinen_subclass_and_a_librarys_nnx_class_are_refused_where_they_would_not_come_back(tmp_path):
    """A review: a ToLinen subclass's own fields were left out of its file (rebuilt with their defaults, silently),
    and `jes train --policy flax.nnx:Linear` trained a run that nothing could evaluate or save afterwards."""
    import dataclasses
    import subprocess
    import sys

    from flax import nnx

    import policies_for_tests as mine
    from subprocess_for_tests import checkout_env

    sub = dataclasses.dataclass(type("SubToLinen", (nnx.bridge.ToLinen,), {"__annotations__": {"extra": float},
                                                                           "extra": 1.0, "__module__": __name__}))
    trained = jes.trained.TrainedPolicy(sub(mine.NnxMLP, args=(2,), extra=5.0), np.zeros(4 * 8 + 8 + 8 * 2 + 2,
                                        np.float32), (4,), jes.trained.ActionMap(discrete=True, num_outputs=2),
                                        env_name="CartPole-v1")
    with pytest.raises(jes.describe.DescriptionError, match=r"a subclass of Flax's ToLinen, which a file cannot name"):
        trained.save(str(tmp_path / "sub.policy"))
    done = subprocess.run([sys.executable, "-m", "jes", "train", "--env", "CartPole-v1", "--policy", "flax.nnx:Linear",
                           "--policy-arg", "in_features=4", "--policy-arg", "out_features=2"], cwd=tmp_path,
                          env=checkout_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "a class of flax's own" in done.stderr, done.stderr
    assert not list(tmp_path.glob("runs/*"))  # refused before the run started
