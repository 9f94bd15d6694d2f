import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jes
from jes.envs import make_env
from jes.policies import PolicyFns
from jes.rollout import run_episodes
from envs_for_tests import Countdown


@pytest.mark.parametrize("name,discrete,outputs", [
    ("CartPole-v1", True, 2), ("Acrobot-v1", True, 3), ("MountainCar-v0", True, 3),
    ("Pendulum-v1", False, 1), ("MountainCarContinuous-v0", False, 1),
])
def test_classic_control_envs_resolve(name, discrete, outputs):
    spec = make_env(name)
    assert spec.discrete == discrete and spec.num_outputs == outputs and spec.max_steps > 0


def test_unknown_env_lists_valid_names():
    with pytest.raises(ValueError, match="CartPole-v1"):
        make_env("CartPole-v0")
    with pytest.raises(TypeError, match="reset_env"):
        make_env(object())


def test_continuous_actions_stay_in_bounds():
    spec = make_env("Pendulum-v1")
    for value in (-1e6, -0.3, 0.0, 2.0, 1e6):
        action = float(spec.action(jnp.array([value]))[0])
        assert spec.action_low[0] <= action <= spec.action_high[0]
    assert int(make_env("CartPole-v1").action(jnp.array([0.1, 0.7]))) == 1


def test_half_bounded_and_unbounded_action_dimensions_each_map_by_their_own_bounds():
    """A Box with some infinite bounds: each dimension in its bounds (a space with any infinite bound used to take the
    raw output in every dimension); a trained policy's action map gives the same bits as the run's."""
    low = np.array([0.0, -np.inf, -1.0, -np.inf], np.float32)
    high = np.array([np.inf, 2.0, 1.0, np.inf], np.float32)
    spec = make_env("Pendulum-v1")
    import dataclasses
    spec = dataclasses.replace(spec, num_outputs=4, action_shape=(4,), action_low=low, action_high=high)
    action_map = jes.trained.ActionMap.from_spec(spec)
    outs = jax.random.normal(jax.random.key(0), (200, 4)) * 30.0
    actions = np.asarray(jax.vmap(spec.action)(outs))
    assert np.array_equal(actions, np.asarray(jax.vmap(action_map)(outs)))
    assert (actions[:, 0] >= 0).all() and (actions[:, 1] <= 2).all()  # softplus: inside its one bound
    assert ((actions[:, 2] >= -1) & (actions[:, 2] <= 1)).all()
    np.testing.assert_array_equal(actions[:, 3], np.asarray(outs[:, 3]))  # unbounded: the raw output
    bounded = make_env("Pendulum-v1")  # every bound finite: tanh scaling, as before
    out = jnp.array([0.37])
    assert bounded.action(out)[0] == jnp.float32(-2.0) + (jnp.tanh(out[0]) + 1.0) * 0.5 * jnp.float32(4.0)


def rollout(env, params_value=None, episodes=3, members=2, active=None, env_params=None):
    spec = make_env(env, env_params)
    fns = PolicyFns(jes.MLPPolicy(hidden_sizes=(4,), num_outputs=spec.num_outputs), spec.obs_shape)
    params = jax.vmap(fns.init)(jax.random.split(jax.random.key(0), members))
    keys = jax.random.split(jax.random.key(1), members * episodes).reshape(members, episodes)
    active = jnp.ones(members, bool) if active is None else active
    return jax.jit(lambda p, k, a: run_episodes(fns, spec, p, k, a))(params, keys, active)


def test_rewards_after_done_never_count():
    out = rollout(Countdown())
    np.testing.assert_array_equal(out.returns, 5.0)   # 5 steps of reward 1, never the 1000 after done
    np.testing.assert_array_equal(out.steps, 5)


def test_truncation_by_time_limit_and_padding_members():
    env = Countdown()
    params = env.default_params.replace(episode_length=100, max_steps_in_episode=7)
    out = rollout(env, env_params=params, active=jnp.array([True, False]))
    np.testing.assert_array_equal(out.returns[0], 7.0)
    np.testing.assert_array_equal(out.returns[1], 0.0)   # padding member never steps
    np.testing.assert_array_equal(out.steps[1], 0)


def test_cartpole_returns_match_a_plain_gymnax_loop():
    spec = make_env("CartPole-v1")
    fns = PolicyFns(jes.MLPPolicy(hidden_sizes=(4,), num_outputs=2), spec.obs_shape)
    params = fns.init(jax.random.key(3))
    keys = jax.random.split(jax.random.key(4), 3)
    out = jax.jit(lambda p, k: run_episodes(fns, spec, p, k, jnp.ones(1, bool)))(
        jax.tree.map(lambda x: x[None], params), keys[None])
    env, env_params = spec.env, spec.params
    step = jax.jit(env.step)
    for e, key in enumerate(keys):
        obs, state = env.reset(jax.random.fold_in(key, 0), env_params)
        total, t = 0.0, 0
        while True:
            _, logits = fns.apply(params, (), obs)
            obs, state, reward, terminated, truncated, _ = step(jax.random.fold_in(key, t + 1), state, spec.action(logits), env_params)
            total += float(reward)
            t += 1
            if bool(terminated) or bool(truncated):
                break
        assert float(out.returns[0, e]) == total and int(out.steps[0, e]) == t


# Pinned before jes.envs became a package and brax joined it: gymnax results must stay bit-identical.
PINNED_GYMNAX_RUNS = {
    "gru-cartpole": "ed49415d5b89b69cd59582b13ec448e50691a45c96293a4da6b58de6829b478e",
    "mlp-pendulum": "158a07f07516fb48b798a6af56324fb3a808d09a305c442db1b2289ebfd15529",
}


@pytest.mark.parametrize("case", sorted(PINNED_GYMNAX_RUNS))
def test_gymnax_training_results_are_pinned(case):
    import hashlib

    if case == "gru-cartpole":
        result = jes.train(jes.GRUPolicy(), "CartPole-v1", "adam", key=0, num_members=16, num_generations=2,
                           log_dir=None, progress=False)
    else:
        result = jes.train(jes.MLPPolicy(hidden_sizes=(8,)), "Pendulum-v1", "adam", key=1, num_members=8,
                           num_generations=2, max_episode_steps=50, log_dir=None, progress=False)
    digest = hashlib.sha256(np.asarray(result.flat_params, np.float32).tobytes()).hexdigest()
    assert digest == PINNED_GYMNAX_RUNS[case]


def test_import_jes_stays_light_and_brax_errors_name_the_extra():
    """`import jes` pulls in neither brax nor matplotlib; without brax a brax name says what to install."""
    import subprocess
    import sys

    script = (
        "import sys; import jes\n"
        "assert 'brax' not in sys.modules and 'matplotlib' not in sys.modules, 'heavy import'\n"
        "sys.modules['brax'] = None  # as if brax were not installed\n"
        "try:\n    jes.make_env('brax/hopper')\nexcept ImportError as err:\n    print(err)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "pip install 'jax-jes[brax]'" in proc.stdout


def test_changed_gymnax_params_are_in_the_name_so_files_and_resumes_rebuild_them(tmp_path):
    """A run on (env, params) recorded the bare id: a saved policy, `jes eval` and a resume silently ran the
    default params (CartPole at gravity 50 evaluated at 9.8)."""
    import gymnax

    env, params = gymnax.make("CartPole-v1")
    heavy = params.replace(gravity=50.0)
    spec = make_env((env, heavy))
    assert spec.name == "CartPole-v1?gravity=50.0" and spec.solved_return is None  # another task: no Gym threshold
    assert make_env(env, env_params=heavy).name == spec.name == make_env("CartPole-v1?gravity=50").name
    rebuilt = make_env(spec.name)
    assert rebuilt.params == spec.params and type(rebuilt.env) is type(env)
    assert make_env("CartPole-v1?gravity=50.0&keep_obs=0,2").name == \
        jes.envs.mask_observations((env, heavy), keep=[0, 2]).name == "CartPole-v1?gravity=50.0&keep_obs=0,2"
    result = jes.train(jes.MLPPolicy(hidden_sizes=(4,)), (env, heavy), num_members=8, num_generations=1,
                       eval_episodes=2, log_dir=str(tmp_path / "run"), progress=False, key=0)
    path = result.save_policy(str(tmp_path / "heavy.policy"))
    np.testing.assert_array_equal(jes.load_policy(path).evaluate(4, 1), result.evaluate(4, 1))
    assert not np.array_equal(jes.load_policy(path).evaluate(4, 1, env="CartPole-v1"), result.evaluate(4, 1))
    with pytest.raises(ValueError, match="env"):  # resuming on the default params is another run
        jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", num_members=8, num_generations=2,
                  eval_episodes=2, progress=False, resume=str(tmp_path / "run" / "checkpoint.ckpt"), key=0)


def test_env_objects_no_name_rebuilds_are_named_so_and_rebuilding_them_is_refused():
    import gymnax
    from gymnax.environments.bsuite import DeepSea

    assert make_env(gymnax.make("DeepSea-bsuite")[0]).name == "DeepSea-bsuite"
    other = make_env(DeepSea(action_mapping_key=jax.random.key(3)))  # its actions mapped by another key
    assert other.name.startswith("DeepSea-bsuite (a gymnax env instance) class:gymnax.environments.bsuite.deep_sea."
                                 "DeepSea params:1:")
    with pytest.raises(ValueError, match="pass that env itself again"):
        make_env(other.name)
    # A registered env whose own `name` is not its id ("DiscountingChain-v0") is named by its id.
    assert make_env(gymnax.make("DiscountingChain-bsuite")[0]).name == "DiscountingChain-bsuite"
    acrobot, params = gymnax.make("Acrobot-v1")  # an array field no name holds
    assert make_env((acrobot, params.replace(available_torque=jnp.array([-2.0, 0.0, 2.0])))).name.startswith(
        "Acrobot-v1 (a gymnax env instance) class:")


def test_gymnax_wrappers_and_mismatched_env_params_are_refused():
    """Wrappers' reset/step never ran (gymnax passes reset_env/step_env through): a LogWrapper or a reward-scaling
    wrapper trained on the plain env; FlattenObservationWrapper was a raw broadcasting error."""
    import gymnax
    from gymnax.wrappers import FlattenObservationWrapper, LogWrapper

    breakout, _ = gymnax.make("Breakout-MinAtar")
    cartpole, cartpole_params = gymnax.make("CartPole-v1")
    for wrapped in (LogWrapper(cartpole), FlattenObservationWrapper(breakout)):
        with pytest.raises(TypeError, match="gymnax wrapper .*would never run"):
            make_env(wrapped)
    with pytest.raises(TypeError, match="env_params for 'Breakout-MinAtar' are .*cartpole.EnvParams"):
        make_env(breakout, env_params=cartpole_params)
    with pytest.raises(TypeError, match=r"given as \(params, env\)"):
        make_env((cartpole_params, cartpole))
    with pytest.raises(ValueError, match="pass the params once"):
        make_env((cartpole, cartpole_params), env_params=cartpole_params)
    with pytest.raises(ValueError, match="unknown option 'grav=1'.*gravity"):
        make_env("CartPole-v1?grav=1")
    with pytest.raises(ValueError, match="available_torque.*cannot hold"):
        make_env("Acrobot-v1?available_torque=1")


def test_an_env_name_setting_a_parameter_to_nan_is_refused():
    """"CartPole-v1?gravity=nan" built an env whose every return was NaN. An infinite value (a threshold turned off)
    is a setting; NaN is none."""
    for name, option in (("CartPole-v1?gravity=nan", "gravity=nan"),
                         ("CartPole-v1?keep_obs=0,2&length=NaN", "length=NaN"),
                         ("Pendulum-v1?max_speed=-nan", "max_speed=-nan")):
        with pytest.raises(ValueError, match=rf"env {re.escape(repr(name))} sets {re.escape(option)}: .*not a number"):
            make_env(name)
    assert make_env("CartPole-v1?x_threshold=inf").params.x_threshold == float("inf")
    assert make_env("CartPole-v1?gravity=20.0").params.gravity == 20.0


def test_an_observation_unlike_the_observation_space_is_refused():
    class Short(Countdown):
        def get_obs(self, state, params=None, key=None):
            return jnp.array([state.time / 10.0], jnp.float32)  # the space says (2,)

    with pytest.raises(ValueError, match=r"observations of shape \(1,\) from reset_env, but its "
                                         r"observation_space\(params\).shape is \(2,\)"):
        make_env(Short())


def test_gym_thresholds_hold_at_the_registered_episode_limit_only():
    """Acrobot cut to 60 steps scores -60 failing every episode, above Gym's -100: it was reported solved."""
    assert make_env("Acrobot-v1").solved_return == -100.0 and make_env("Acrobot-v1", max_steps=60).solved_return is None
    assert make_env("MountainCar-v0", max_steps=50).solved_return is None
    assert make_env("CartPole-v1?keep_obs=0,2").solved_return == 475.0
    pytest.importorskip("gymnasium")
    assert make_env("gymnasium:CartPole-v1", max_steps=100).solved_return is None
    assert make_env("gymnasium:CartPole-v1").solved_return == 475.0


def test_a_checkpoint_from_before_params_in_names_resumes_with_a_warning(tmp_path):
    """Format-6 files named a run on changed params by the bare id: with params now in the name, their resume was
    refused outright (the review of this change caught it)."""
    import hashlib
    import json
    import struct

    import gymnax
    from flax import serialization

    from jes import checkpoint

    env, params = gymnax.make("CartPole-v1")
    heavy = (env, params.replace(gravity=20.0))
    common = dict(num_members=8, eval_episodes=2, log_dir=None, progress=False, key=0)
    path = str(tmp_path / "old.ckpt")
    jes.train(jes.MLPPolicy(hidden_sizes=(4,)), heavy, num_generations=1, checkpoint_path=path, **common)
    header = struct.Struct("<8sQ32s")
    data = open(path, "rb").read()
    content = serialization.msgpack_restore(data[header.size:])
    meta = json.loads(content["meta"])
    assert meta["env_name"] == "CartPole-v1?gravity=20.0"
    meta.update(version=6, env_name="CartPole-v1")  # as the previous jes wrote it
    payload = serialization.msgpack_serialize(dict(content, meta=json.dumps(meta)))
    with open(path, "wb") as f:
        f.write(header.pack(checkpoint.MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload)
    with pytest.warns(UserWarning, match=r"format 6\): it names its env 'CartPole-v1', which cannot say whether it ran "
                                         r"'CartPole-v1\?gravity=20.0'"):
        resumed = jes.train(jes.MLPPolicy(hidden_sizes=(4,)), heavy, num_generations=2, resume=path, **common)
    whole = jes.train(jes.MLPPolicy(hidden_sizes=(4,)), heavy, num_generations=2, **common)
    np.testing.assert_array_equal(resumed.flat_params, whole.flat_params)
    old = checkpoint.read(path)
    old.meta.update(version=6, env_name="CartPole-v1?keep_obs=0,2")
    assert old.names_env("CartPole-v1?gravity=20.0&keep_obs=0,2") and not old.names_env("Acrobot-v1")
    assert not old.names_env("CartPole-v1?gravity=20.0")  # its observations were masked
    for other, recorded in (("brax/ant?backend=spring", "brax/ant"),  # options of other envs: other envs then too
                            ("gymnasium:Pendulum-v1?episode_seconds=1", "gymnasium:Pendulum-v1")):
        old.meta.update(env_name=recorded)
        assert not old.names_env(other)


class OtherCountdown(Countdown):
    """Another class that calls itself "Countdown" (as a class of the same name in another module would)."""

    def step_env(self, key, state, action, params):
        obs, state, reward, done, info = super().step_env(key, state, action, params)
        return obs, state, 2.0 * reward, done, info


def _old_name_of(env, params):
    """The name jes gave a JAX env object of one's own before it recorded its class and params."""
    return getattr(env, "name", None) or type(env).__name__


def test_own_jax_env_objects_are_named_by_class_and_a_fingerprint_of_their_params():
    """A JAX env of one's own was named by its `name` alone: other params, or another class of that name, made the
    same name, so its files resumed and loaded on them without a word."""
    short = Countdown().default_params.replace(episode_length=3)
    plain, again, other_params = make_env(Countdown()), make_env(Countdown()), make_env((Countdown(), short))
    assert plain.name == again.name and plain.name.startswith(
        "Countdown (a gymnax env instance) class:envs_for_tests.Countdown params:1:"), plain.name
    assert other_params.name != plain.name and other_params.name.partition(" params:")[0] == \
        plain.name.partition(" params:")[0]
    assert make_env((Countdown(), Countdown().default_params.replace(episode_length=5))).name == plain.name
    assert "class:test_envs.OtherCountdown params:" in make_env(OtherCountdown()).name
    with pytest.raises(ValueError, match="pass that env itself again"):
        make_env(plain.name)
    # a registered id's name is unchanged
    assert make_env("CartPole-v1").name == "CartPole-v1"
    assert make_env(jes.envs.gymnax.make("CartPole-v1?gravity=20.0")).name == "CartPole-v1?gravity=20.0"


def test_resuming_or_loading_an_own_jax_env_on_other_params_or_class_is_said(tmp_path, monkeypatch):
    short = Countdown().default_params.replace(episode_length=3)
    settings = dict(num_members=8, eval_episodes=2, log_dir=None, progress=False, key=0)
    policy = lambda: jes.MLPPolicy(hidden_sizes=(3,))
    path = str(tmp_path / "run.ckpt")
    result = jes.train(policy(), (Countdown(), short), num_generations=1, checkpoint_path=path, **settings)
    with pytest.warns(UserWarning, match="is of that class with other params or attributes"):
        jes.train(policy(), Countdown(), num_generations=2, resume=path, checkpoint_path=str(tmp_path / "b.ckpt"),
                  **settings)
    with pytest.raises(jes.checkpoint.CheckpointError, match="class:test_envs.OtherCountdown"):
        jes.train(policy(), (OtherCountdown(), short), num_generations=2, resume=path, **settings)
    file = result.save_policy(str(tmp_path / "short.policy"))
    with pytest.warns(UserWarning, match="other params or attributes"):
        loaded = jes.load_policy(file, env=Countdown())
    assert loaded.evaluate(2, 1).tobytes() != result.evaluate(2, 1).tobytes()
    with pytest.warns(UserWarning, match="other params or attributes"):
        jes.load_policy(file, env=(Countdown(), short)).evaluate(2, 1, env=Countdown())
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = jes.load_policy(file, env=(Countdown(), short)).evaluate(2, 1)
    assert same.tobytes() == result.evaluate(2, 1).tobytes()


def test_files_of_an_own_jax_env_named_before_its_class_and_params_resume_and_load_with_a_warning(tmp_path,
                                                                                                  monkeypatch):
    settings = dict(num_members=8, eval_episodes=2, log_dir=None, progress=False, key=0)
    path = str(tmp_path / "old.ckpt")
    with monkeypatch.context() as patched:
        patched.setattr(jes.envs.gymnax, "name_of", _old_name_of)
        result = jes.train(jes.MLPPolicy(hidden_sizes=(3,)), Countdown(), num_generations=1, checkpoint_path=path,
                           **settings)
        file = result.save_policy(str(tmp_path / "old.policy"))
    assert jes.checkpoint.read(path).env_name == "Countdown"
    with pytest.warns(UserWarning, match="jes cannot check that the env given"):
        jes.train(jes.MLPPolicy(hidden_sizes=(3,)), Countdown(), num_generations=2, resume=path,
                  checkpoint_path=str(tmp_path / "new.ckpt"), **settings)
    with pytest.warns(UserWarning, match="jes cannot check that the env given"):
        loaded = jes.load_policy(file, env=Countdown())
    assert loaded.evaluate(2, 1).tobytes() == result.evaluate(2, 1).tobytes()


class _Stepping(Countdown):
    """Countdown whose step_env makes one of the slips the rollout's loop cannot carry."""

    def __init__(self, slip):
        super().__init__()
        self.slip = slip

    def step_env(self, key, state, action, params):
        obs, new_state, reward, done, info = super().step_env(key, state, action, params)
        if self.slip == "reward":
            reward = jnp.reshape(reward, (1,))
        elif self.slip == "done":
            done = jnp.stack([done, done])
        elif self.slip == "obs":
            obs = obs[:1]
        elif self.slip == "state_shape":
            new_state = new_state.replace(time=jnp.reshape(new_state.time, (1,)))
        elif self.slip == "state_structure":
            new_state = (new_state, 0)
        return obs, new_state, reward, done, info


@pytest.mark.parametrize("slip,message", [
    ("reward", r"step_env returns a reward of float32\[1\]; .*reward\[0\], jnp.sum\(reward\)"),
    ("done", r"step_env returns a done of bool\[2\]; .*scalar"),
    ("obs", r"step_env returns observations of float32\[1\], but reset_env returns float32\[2\]"),
    ("state_shape", r"step_env returns a state whose .time is int32\[1\], but reset_env's is int32\[\]"),
    ("state_structure", r"step_env returns a state of another structure"),
])
def test_a_step_the_rollout_cannot_carry_is_refused_naming_the_env_and_value(slip, message):
    """These failed deep in JAX ("while_loop body function carry input and carry output must have equal types"),
    naming neither the env nor the value."""
    with pytest.raises(ValueError, match=r"env 'Countdown .*" + message):
        make_env(_Stepping(slip))
    assert make_env(_Stepping("none")).num_outputs == 2


def test_a_dict_observation_space_of_a_jax_env_is_refused_saying_what_works():
    from gymnax.environments import spaces

    class DictObs(Countdown):
        def observation_space(self, params):
            return spaces.Dict({"a": spaces.Box(0.0, 1.0, (2,))})

    with pytest.raises(ValueError, match="has a Dict observation space; .*Box observation_space.*gymnasium.Env"):
        make_env(DictObs())


@pytest.mark.parametrize("perturbation", ["full_rank", "low_rank"])
def test_a_discrete_observation_reaches_the_policy_as_its_id_never_normalised(tmp_path, perturbation):
    """Trial: FrozenLake-misc's observation is a Discrete(16) state id; normalised by default, an nn.Embed policy
    was handed z-scored floats (ids 0, 0, 0, 2 for states 0, 1, 6, ...) and trained on without a word. The id now
    reaches it as it is: the default run is the run without normalisation, bit for bit."""
    from policies_for_tests import EmbedPolicy

    assert make_env("FrozenLake-misc").categorical_obs and not make_env("FourRooms-misc").categorical_obs
    runs = [jes.train(EmbedPolicy(), "FrozenLake-misc", "adam", key=2, num_members=8, num_generations=3,
                      eval_episodes=2, max_episode_steps=20, perturbation=perturbation, log_dir=None, progress=False,
                      **extra) for extra in ({}, {"normalize_observations": False})]
    assert np.array_equal(runs[0].flat_params, runs[1].flat_params)
    assert np.array_equal(runs[0].history["centre_return"], runs[1].history["centre_return"])
    path = str(tmp_path / "lake.policy")
    runs[0].save_policy(path)
    loaded = jes.load_policy(path)
    assert loaded.obs_stats is None
    assert np.array_equal(loaded.evaluate(4, key=1), runs[0].evaluate(4, key=1))


def test_resuming_a_run_that_normalised_discrete_ids_says_that_it_now_sees_the_ids(tmp_path):
    """A checkpoint of a FrozenLake-misc run from before (its ids z-scored) resumes with a warning: the same
    parameters now see the ids, so the resumed run is not the run it continues."""
    from policies_for_tests import EmbedPolicy

    config = jes.ESConfig(num_members=8, num_generations=2, eval_episodes=2, max_episode_steps=20)
    trainer = jes.Trainer(EmbedPolicy(), "FrozenLake-misc", "adam", config)
    assert not trainer.normalize_observations
    trainer.normalize_observations = True  # as jes did before: the ids normalised, their statistics collected
    path = str(tmp_path / "lake.ckpt")
    jes.run(trainer, trainer.init_state(2), key=2, num_generations=2, checkpoint_path=path)
    with pytest.warns(UserWarning, match="written by a jes that normalised env FrozenLake-misc's Discrete "
                                         "observations"):
        resumed = jes.train(EmbedPolicy(), "FrozenLake-misc", "adam", config=config.replace(num_generations=3),
                            resume=path, log_dir=None, progress=False)
    assert list(resumed.history["generation"]) == [1, 2, 3]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # a run of today's resumes without it
        fresh = str(tmp_path / "today.ckpt")
        jes.train(EmbedPolicy(), "FrozenLake-misc", "adam", config=config, checkpoint_path=fresh, log_dir=None,
                  progress=False)
        jes.train(EmbedPolicy(), "FrozenLake-misc", "adam", config=config.replace(num_generations=3), resume=fresh,
                  log_dir=None, progress=False)
    assert not [w for w in caught if "normalised env" in str(w.message)]
    with pytest.warns(UserWarning, match="normalised env FrozenLake-misc's Discrete observations"):
        jes.checkpoint.load(path)  # evaluated, too


@pytest.mark.parametrize("build", ["gymnax id", "described class"])
def test_mnist_bandit_reads_mnist_from_the_users_own_folder_not_the_shared_tmp(monkeypatch, build):
    """gymnax's MNISTBandit (an id a checkpoint, a .policy file or a master's run description can name) reads MNIST
    from ``load_mnist(directory="/tmp/mnist")``, downloading only the files missing there: files another user of the
    machine put in /tmp/mnist were read (a decompression bomb, data of their choosing). In jes it reads the user's own
    cache folder."""
    import sys

    from jes import describe
    from jes.lazy_gymnax import SHARED_MNIST_FOLDER, import_gymnax, mnist_folder

    import_gymnax()
    load = sys.modules["gymnax.utils.load_mnist"].load_mnist
    monkeypatch.setattr(load, "__defaults__", (SHARED_MNIST_FOLDER,))  # gymnax's own default (imported by a user)
    if build == "gymnax id":
        import_gymnax()  # what jes.envs.gymnax.make calls before gymnax.make (which would download MNIST here)
    else:
        describe.resolve("gymnax.environments.bsuite.mnist:MNISTBandit", describe.allowlist(), "env")
    assert load.__defaults__ == (mnist_folder(),)
    assert not mnist_folder().startswith("/tmp")
