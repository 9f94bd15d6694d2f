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
