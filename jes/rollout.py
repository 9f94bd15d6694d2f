"""Evaluate a batch of policies on episodes: vmap over members and episodes, one while_loop over time.

This is the hot loop of jes. It uses gymnax's non-resetting ``step_env`` and
explicit ``done`` masks (auto-reset would draw a reset every step), stops as
soon as every episode of the batch has ended (early CartPole generations are
~80 % padding in a fixed 500-step scan), and freezes finished episodes so
rewards after ``done`` never count.

Randomness: episode ``k`` uses ``fold_in(k, 0)`` for its reset and
``fold_in(k, t + 1)`` for step ``t``. Deterministic envs ignore the step key,
and XLA then removes the key arithmetic entirely.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jes.envs import EnvSpec
from jes.policies import PolicyFns


class RolloutOutput(NamedTuple):
    """Per-episode results, each shaped ``[members, episodes]``.

    Attributes:
        returns: undiscounted episode returns (rewards after ``done`` excluded).
        steps: real (un-padded) env steps taken in each episode.
        obs_sum, obs_sumsq: sums of observations and their squares over real
            steps and all episodes, shape ``obs_shape`` (zeros unless requested).
    """

    returns: jax.Array
    steps: jax.Array
    obs_sum: jax.Array
    obs_sumsq: jax.Array


def _select(mask: jax.Array, new: Any, old: Any) -> Any:
    """Per-episode ``where(mask, new, old)`` over pytrees whose leaves lead with ``mask.shape``."""

    def pick(n, o):
        m = mask.reshape(mask.shape + (1,) * (n.ndim - mask.ndim))
        return jnp.where(m, n, o)

    return jax.tree.map(pick, new, old)


def run_episodes(
    policy: PolicyFns,
    spec: EnvSpec,
    params: Any,
    episode_keys: jax.Array,
    active: jax.Array,
    obs_norm: tuple[jax.Array, jax.Array] | None = None,
    collect_obs_stats: bool = False,
) -> RolloutOutput:
    """Roll out ``M`` parameter sets on ``E`` episodes each.

    Args:
        policy: the policy functions.
        spec: the resolved environment.
        params: Flax params pytree whose leaves lead with a members axis ``[M, ...]``.
        episode_keys: typed PRNG keys ``[M, E]``, one per episode.
        active: bool ``[M]``; inactive members (padding) start done and cost nothing.
        obs_norm: optional ``(mean, std)`` of shape ``obs_shape`` applied to observations
            before the policy sees them.
        collect_obs_stats: also sum observations (for running normalisation).

    Returns:
        A :class:`RolloutOutput`.
    """
    num_members, num_episodes = episode_keys.shape
    env, env_params = spec.env, spec.params
    reset_keys = jax.vmap(jax.vmap(lambda k: jax.random.fold_in(k, 0)))(episode_keys)
    obs, env_state = jax.vmap(jax.vmap(lambda k: env.reset_env(k, env_params)))(reset_keys)
    carry0 = policy.initial_carry()
    carry = jax.tree.map(lambda c: jnp.broadcast_to(c, (num_members, num_episodes) + c.shape), carry0)
    done = jnp.broadcast_to(~active[:, None], (num_members, num_episodes))
    zeros = jnp.zeros((num_members, num_episodes), jnp.float32)
    obs_zero = jnp.zeros(spec.obs_shape, jnp.float32)

    def act(member_params, member_carry, member_obs):
        def one(c, o):
            if obs_norm is not None:
                o = (o - obs_norm[0]) / obs_norm[1]
            c, out = policy.apply(member_params, c, o)
            return c, spec.action(out)

        return jax.vmap(one)(member_carry, member_obs)

    def step(t, loop):
        obs, env_state, carry, done, returns, steps, obs_sum, obs_sumsq = loop
        new_carry, action = jax.vmap(act)(params, carry, obs)
        step_keys = jax.vmap(jax.vmap(lambda k: jax.random.fold_in(k, t + 1)))(episode_keys)
        new_obs, new_state, reward, terminated, _ = jax.vmap(
            jax.vmap(lambda k, s, a: env.step_env(k, s, a, env_params))
        )(step_keys, env_state, action)
        live = ~done
        if collect_obs_stats:
            live_obs = jnp.where(live.reshape(live.shape + (1,) * len(spec.obs_shape)), obs, 0.0)
            obs_sum = obs_sum + live_obs.sum((0, 1))
            obs_sumsq = obs_sumsq + (live_obs * live_obs).sum((0, 1))
        returns = returns + jnp.where(live, reward.astype(jnp.float32), 0.0)
        steps = steps + live.astype(jnp.int32)
        now_done = jax.vmap(jax.vmap(spec.done_after))(terminated, new_state)
        # Finished episodes keep their last state: no wasted NaN/inf drift, rewards stay masked.
        obs = _select(live, new_obs, obs)
        env_state = _select(live, new_state, env_state)
        carry = _select(live, new_carry, carry)
        done = done | now_done
        return obs, env_state, carry, done, returns, steps, obs_sum, obs_sumsq

    def cond(state):
        t, loop = state
        return (t < spec.max_steps) & ~jnp.all(loop[3])

    def body(state):
        t, loop = state
        return t + 1, step(t, loop)

    loop0 = (obs, env_state, carry, done, zeros, zeros.astype(jnp.int32), obs_zero, obs_zero)
    _, final = jax.lax.while_loop(cond, body, (jnp.int32(0), loop0))
    return RolloutOutput(returns=final[4], steps=final[5], obs_sum=final[6], obs_sumsq=final[7])
