"""jes.envs.wrappers: observation masking on real gymnax envs, and the MemoryChain memory task."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jes
from jes.envs import make_env, mask_observations
from jes.policies import PolicyFns
from jes.rollout import run_episodes


@pytest.mark.parametrize("name,keep,inner_shape", [
    ("CartPole-v1", [0, 2], (4,)),   # cart position, pole angle: no velocities
    ("Pendulum-v1", [0, 1], (3,)),   # cos, sin: no angular velocity
])
def test_masked_observations_are_the_kept_entries(name, keep, inner_shape):
    inner = make_env(name)
    masked = make_env(mask_observations(name, keep=keep))
    assert inner.obs_shape == inner_shape and masked.obs_shape == (len(keep),)
    assert masked.name == f"{name}?keep_obs={','.join(map(str, keep))}" and make_env(masked.name).name == masked.name
    assert masked.num_outputs == inner.num_outputs and masked.solved_return == inner.solved_return
    key = jax.random.key(4)
    obs, state = masked.env.reset_env(key, masked.params)
    full_obs, full_state = inner.env.reset_env(key, inner.params)
    np.testing.assert_array_equal(obs, np.asarray(full_obs)[keep])
    action = inner.action(jnp.ones(inner.num_outputs))
    obs, *_ = masked.env.step_env(key, state, action, masked.params)
    full_obs, *_ = inner.env.step_env(key, full_state, action, inner.params)
    np.testing.assert_array_equal(obs, np.asarray(full_obs)[keep])


def test_masking_does_not_change_the_episodes():
    """A policy that ignores the hidden entries scores the same with and without the mask."""
    full, masked = make_env("CartPole-v1"), make_env("CartPole-v1?keep_obs=0,2")
    keys = jax.random.split(jax.random.key(1), 4).reshape(1, 4)
    policy = jes.MLPPolicy(hidden_sizes=(), num_outputs=2)   # linear: head weights [obs, 2]

    def returns(spec, kernel):
        fns = PolicyFns(policy, spec.obs_shape)
        params = {"params": {"head": {"kernel": kernel[None], "bias": jnp.zeros((1, 2))}}}
        return run_episodes(fns, spec, params, keys, jnp.array([True])).returns

    kernel = jnp.array([[0.3, -0.3], [-2.0, 2.0]])            # reads position and angle only
    full_kernel = jnp.zeros((4, 2)).at[0].set(kernel[0]).at[2].set(kernel[1])
    np.testing.assert_array_equal(returns(masked, kernel), returns(full, full_kernel))


def test_bad_masks_are_explained():
    with pytest.raises(ValueError, match="outside"):
        mask_observations("CartPole-v1", keep=[4])
    with pytest.raises(ValueError, match="at least one"):
        mask_observations("CartPole-v1", keep=[])
    with pytest.raises(ValueError, match="keep_obs=0,2"):
        make_env("CartPole-v1?keep_obs=a")


def test_memory_chain_needs_the_first_observation():
    spec = make_env("MemoryChain-bsuite")
    assert spec.discrete and spec.num_outputs == 2 and spec.obs_shape == (3,) and spec.solved_return == 1.0
    fns = PolicyFns(jes.MLPPolicy(hidden_sizes=(4,), num_outputs=2), spec.obs_shape)
    params = jax.vmap(fns.init)(jax.random.split(jax.random.key(0), 2))
    keys = jax.random.split(jax.random.key(2), 32).reshape(2, 16)
    out = jax.jit(lambda p, k: run_episodes(fns, spec, p, k, jnp.ones(2, bool)))(params, keys)
    assert set(np.unique(np.asarray(out.returns))) <= {-1.0, 1.0}   # one rewarded decision per episode
    np.testing.assert_array_equal(out.steps, 6)                     # memory_length 5, then the query
