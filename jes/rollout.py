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
import numpy as np

from jes.envs import EnvSpec
from jes.policies import PolicyFns


class RolloutOutput(NamedTuple):
    """Per-episode results, each shaped ``[members, episodes]``.

    Attributes:
        returns: undiscounted episode returns (rewards after ``done`` excluded); NaN for an episode in
            which the policy output a non-finite value.
        steps: real (un-padded) env steps taken in each episode.
        obs_sum, obs_sumsq: sums of observations and their squares over real
            steps and all episodes, shape ``obs_shape`` (zeros unless requested);
            summed per episode, then over episodes in order, so they do not depend on
            compaction either.
    """

    returns: jax.Array
    steps: jax.Array
    obs_sum: jax.Array
    obs_sumsq: jax.Array


# Initial pseudo-count of the running observation statistics (OpenAI ES's RunningStat), and the floor of
# their variance.
OBS_EPS = 1e-2


def _mean_var(count: jax.Array, total: jax.Array, sumsq: jax.Array) -> tuple[jax.Array, jax.Array]:
    inv_count = 1.0 / count
    mean = total * inv_count
    return mean, jnp.maximum(sumsq * inv_count - mean * mean, OBS_EPS)


def obs_normaliser(count: jax.Array, total: jax.Array, sumsq: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(mean, 1 / std)`` of running observation statistics; the policy sees ``(obs - mean) * (1 / std)``.

    Written so that no compiler rewrite depends on the program around it: XLA:CPU turns
    ``x / count`` into ``x * (1 / count)`` and ``y / sqrt(v)`` into ``y * rsqrt(v)`` only where it
    sees the producer, so the same normaliser compiled into two programs (one device or two, the
    population's chunk or the centre's evaluation, training or a saved policy) could differ in the
    last bit. Here the reciprocal and ``rsqrt`` are explicit, and every program computes the same.
    """
    mean, var = _mean_var(count, total, sumsq)
    return mean, jax.lax.rsqrt(var)


# A dimension whose mean is this many times its std is past what float32 running sums resolve for long:
# sumsq / count - mean^2 cancels 4 of float32's ~7 digits, and the sums' rounding grows with every addition (an
# offset of 1e5 over a spread of 1 came out with std 55 to 400; the error can make the std look larger, so the
# ratio is of the estimate, which hides nothing at this ratio). Dimensions where 64 float32 ulps of the mean square
# stay below the variance floor (OBS_EPS) are left out: a constant feature is normalised to ~0 whatever its estimate.
OFFSET_RATIO = 100.0


def offset_warning(count: Any, total: Any, sumsq: Any) -> str | None:
    """Say which observation dimensions sit so far from 0 against their spread that the normaliser's float32 running
    sums cannot resolve the spread (an altitude, a price, a timestamp: ``1e5 + N(0, 1)`` came out with std 55), and
    what to do; ``None`` where none does."""
    count = float(np.asarray(count))
    if not count > 0:
        return None
    total, sumsq = (np.asarray(x, np.float64).ravel() for x in (total, sumsq))
    mean = total / count
    square = sumsq / count
    var = np.maximum(square - mean * mean, OBS_EPS)
    resolved = 64 * np.finfo(np.float32).eps * square <= OBS_EPS
    bad = np.flatnonzero((np.abs(mean) > OFFSET_RATIO * np.sqrt(var)) & ~resolved)
    if bad.size == 0:
        return None
    shown = ", ".join(f"[{i}] mean {mean[i]:.6g}, estimated std {np.sqrt(var[i]):.3g}" for i in bad[:5])
    more = f" and {bad.size - 5} more" if bad.size > 5 else ""
    return (f"observation dimension{'s' if bad.size > 1 else ''} {shown}{more}: so far from 0 against {'their' if bad.size > 1 else 'its'} "
            f"spread that the observation normaliser's float32 running sums cannot resolve it (their mean square "
            f"cancels most of its digits), so the policy sees {'these dimensions' if bad.size > 1 else 'this dimension'} "
            f"scaled by a wrong std. Subtract the offset in the env (a wrapper that centres the observation near 0), "
            f"or train with normalize_observations=False")


def obs_mean_std(count: jax.Array, total: jax.Array, sumsq: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(mean, std)`` of running observation statistics, for people: the rollout multiplies by
    :func:`obs_normaliser`'s ``rsqrt``, which can differ from ``1 / std`` in the last bit."""
    mean, var = _mean_var(count, total, sumsq)
    return mean, jnp.sqrt(var)


def normalise(obs: jax.Array, obs_scale: tuple[jax.Array, jax.Array] | None) -> jax.Array:
    """``obs`` as the policy sees it: ``(obs - mean) * (1 / std)`` with :func:`obs_normaliser`'s pair, or as is."""
    return obs if obs_scale is None else (obs - obs_scale[0]) * obs_scale[1]


def batch_act(forward: Any, spec: EnvSpec, params: Any, carry: Any, obs: jax.Array,
              obs_scale: tuple[jax.Array, jax.Array] | None, action_fn: Any = None) -> tuple[Any, jax.Array, jax.Array]:
    """One policy step of a batch of slots: ``(carry, actions, finite)``, each leading with the slots axis.

    Args:
        forward: ``forward(params, carry, obs) -> (carry, outputs)`` over the whole batch (``jax.vmap`` of a
            one-slot ``apply``, or a policy's own ``apply_batch``).
        obs: ``[S, *obs_shape]``, normalised here with ``obs_scale`` (see :func:`normalise`).
        action_fn: one raw output -> one action (default ``spec.action``).
    """
    new_carry, out = forward(params, carry, normalise(obs, obs_scale))
    flat = out.reshape(out.shape[0], -1)
    action = jax.vmap(spec.action if action_fn is None else action_fn)(out)
    return new_carry, action, jnp.all(jnp.isfinite(flat), axis=1)


def _select(mask: jax.Array, new: Any, old: Any) -> Any:
    """Per-episode ``where(mask, new, old)`` over pytrees whose leaves lead with ``mask.shape``."""

    def pick(n, o):
        m = mask.reshape(mask.shape + (1,) * (n.ndim - mask.ndim))
        return jnp.where(m, n, o)

    return jax.tree.map(pick, new, old)


def compaction_sizes(num_slots: int, min_slots: int = 32, factor: int = 4, optional_slots: int = 0) -> list[int]:
    """Batch sizes the rollout steps through: ``num_slots``, then /4 while at least ``min_slots``.

    With ``optional_slots`` (a group of slots that may all start done, such as the centre's episodes on a
    generation that does not evaluate it), the first batch is left as soon as no more than
    ``num_slots - optional_slots`` run, so an idle group costs one gather instead of a full level."""
    rest = num_slots - optional_slots
    if 0 < optional_slots and rest >= min_slots:
        return [num_slots] + compaction_sizes(rest, min_slots, factor)
    sizes = [num_slots]
    while sizes[-1] // factor >= min_slots:
        sizes.append(sizes[-1] // factor)
    return sizes


def run_episodes(
    policy: PolicyFns,
    spec: EnvSpec,
    params: Any,
    episode_keys: jax.Array,
    active: jax.Array,
    obs_scale: tuple[jax.Array, jax.Array] | None = None,
    collect_obs_stats: bool = False,
    min_slots: int = 32,
    action_fn: Any = None,
) -> RolloutOutput:
    """Roll out ``M`` parameter sets on ``E`` episodes each (:func:`run_slots` with one slot per episode).

    Args:
        policy: the policy functions.
        spec: the resolved environment.
        params: Flax params pytree whose leaves lead with a members axis ``[M, ...]``.
        episode_keys: typed PRNG keys ``[M, E]``, one per episode.
        active: bool ``[M]``; inactive members (padding) start done and cost nothing.
        obs_scale: optional ``(mean, 1 / std)`` of shape ``obs_shape`` (:func:`obs_normaliser`); the
            policy then sees ``(obs - mean) * (1 / std)``.
        collect_obs_stats: also sum observations (for running normalisation).
        min_slots: smallest batch compaction goes down to.
        action_fn: maps one raw policy output to an action (default ``spec.action``; a saved policy's
            :class:`jes.trained.ActionMap` does the same without the env).

    Returns:
        A :class:`RolloutOutput`.
    """
    num_members, num_episodes = episode_keys.shape
    slot_params = jax.tree.map(lambda p: jnp.repeat(p, num_episodes, axis=0), params) if num_episodes > 1 else params
    out = run_slots(policy, spec, slot_params, episode_keys.reshape(-1), jnp.repeat(~active, num_episodes),
                    obs_scale, collect_obs_stats, min_slots, action_fn)
    shape = (num_members, num_episodes)
    obs_sum, obs_sumsq = sum_obs_stats(out, num_members * num_episodes, spec.obs_shape)
    return RolloutOutput(returns=out["returns"].reshape(shape), steps=out["steps"].reshape(shape),
                         obs_sum=obs_sum, obs_sumsq=obs_sumsq)


def sum_obs_stats(slots: dict, num_slots: int, obs_shape: tuple) -> tuple[jax.Array, jax.Array]:
    """Observation sums over the first ``num_slots`` slots of :func:`run_slots`' output (zeros if not collected)."""
    if "obs_sum" not in slots:
        zero = jnp.zeros(obs_shape, jnp.float32)
        return zero, zero
    return slots["obs_sum"][:num_slots].sum(0), slots["obs_sumsq"][:num_slots].sum(0)


def run_slots(
    policy: PolicyFns,
    spec: EnvSpec,
    slot_params: Any,
    keys: jax.Array,
    done: jax.Array,
    obs_scale: tuple[jax.Array, jax.Array] | None = None,
    collect_obs_stats: bool = False,
    min_slots: int = 32,
    action_fn: Any = None,
    optional_slots: int = 0,
) -> dict:
    """Run ``S`` episodes side by side, one per slot, each with its own parameters and key.

    Once at most a quarter of the slots are still running, the running ones are gathered
    into a batch a quarter the size and stepping continues there (down to ``min_slots``), so
    long episodes do not make every finished slot pay for their remaining steps. Each
    episode's return is still summed step by step in time order, so nothing depends on
    compaction, nor on which other episodes share the batch: a population's members and the
    centre's evaluation episodes can run in one batch with the same results as apart.

    Args:
        slot_params: Flax params pytree whose leaves lead with the slots axis ``[S, ...]``.
        keys: typed PRNG keys ``[S]``, one per episode.
        done: bool ``[S]``; slots that start done (padding) cost nothing and return 0.
        optional_slots: size of a group of slots that may all start done (see :func:`compaction_sizes`);
            only the batch sizes depend on it, not the results.
        (the rest as in :func:`run_episodes`)

    Returns:
        Per-slot arrays: ``returns`` ``[S]`` (NaN where the policy output a non-finite value),
        ``steps`` ``[S]``, and with ``collect_obs_stats`` ``obs_sum``/``obs_sumsq`` ``[S, *obs_shape]``
        (see :func:`sum_obs_stats`).
    """
    num_slots = keys.shape[0]
    env, env_params = spec.env, spec.params
    obs, env_state = jax.vmap(lambda k: env.reset_env(jax.random.fold_in(k, 0), env_params))(keys)
    carry0 = policy.initial_carry()
    carry = jax.tree.map(lambda c: jnp.broadcast_to(c, (num_slots,) + c.shape), carry0)
    obs_axes = (1,) * len(spec.obs_shape)

    # The first batch may hold the slots' parameters in a form of the policy's own, applied to the whole batch at
    # once (a low-rank population's antithetic pairs read their shared factors once); the first compaction turns
    # it into one parameter set per slot (``policy.take``), and later batches vmap ``policy.apply`` over slots.
    batch_apply = getattr(policy, "apply_batch", None)
    vmapped = jax.vmap(policy.apply)

    def step(t, running, results, forward):
        p, k, obs, env_state, carry, done = running
        new_carry, action, finite_out = batch_act(forward, spec, p, carry, obs, obs_scale, action_fn)
        step_keys = jax.vmap(lambda key: jax.random.fold_in(key, t + 1))(k)
        new_obs, new_state, reward, terminated, _ = jax.vmap(
            lambda key, st, a: env.step_env(key, st, a, env_params)
        )(step_keys, env_state, action)
        live = ~done
        results = dict(results, returns=results["returns"] + jnp.where(live, reward.astype(jnp.float32), 0.0),
                       steps=results["steps"] + live.astype(jnp.int32),
                       finite=results["finite"] & (finite_out | ~live))
        if collect_obs_stats:
            live_obs = jnp.where(live.reshape(live.shape + obs_axes), obs.astype(jnp.float32), 0.0)
            results["obs_sum"] = results["obs_sum"] + live_obs
            results["obs_sumsq"] = results["obs_sumsq"] + live_obs * live_obs
        now_done = jax.vmap(spec.done_after)(terminated, new_state)
        # Finished episodes keep their last state: no NaN/inf drift, rewards stay masked.
        obs = _select(live, new_obs, obs)
        env_state = _select(live, new_state, env_state)
        carry = _select(live, new_carry, carry)
        return (p, k, obs, env_state, carry, done | now_done), results

    # Per-episode results (returns, steps, observation sums) travel with their slot and are written
    # back by slot id, so nothing depends on how slots were compacted.
    results = {"returns": jnp.zeros(num_slots, jnp.float32), "steps": jnp.zeros(num_slots, jnp.int32),
               "finite": jnp.ones(num_slots, bool)}
    if collect_obs_stats:
        results["obs_sum"] = results["obs_sumsq"] = jnp.zeros((num_slots,) + spec.obs_shape, jnp.float32)
    final = results
    running = (slot_params, keys, obs, env_state, carry, done)
    slot_ids = jnp.arange(num_slots, dtype=jnp.int32)

    def write_back(final, results, slot_ids):
        return jax.tree.map(lambda f, r: f.at[slot_ids].set(r), final, results)

    t = jnp.int32(0)
    # Episodes that all run max_steps never leave a batch early: only an idle optional group can be dropped.
    floor = num_slots - optional_slots if spec.fixed_length else min_slots
    sizes = compaction_sizes(num_slots, floor, optional_slots=optional_slots)
    for level, size in enumerate(sizes):
        if level > 0:
            # Record every slot's results, then keep the running ones (at most `size` of them).
            final = write_back(final, results, slot_ids)
            keep = jnp.argsort(running[5], stable=True)[:size]
            params = running[0]
            running, results, slot_ids = jax.tree.map(lambda x: x[keep], (running[1:], results, slot_ids))
            # (the first batch's slots are 0..S-1, so `keep` are slot ids there)
            params = policy.take(params, keep) if level == 1 and batch_apply is not None else \
                jax.tree.map(lambda x: x[keep], params)
            running = (params, *running)
        forward = batch_apply if level == 0 and batch_apply is not None else vmapped
        leave_at = sizes[level + 1] if level + 1 < len(sizes) else 0

        def cond(state, leave_at=leave_at):
            t, running, _ = state
            return (t < spec.max_steps) & (jnp.sum(~running[5]) > leave_at)

        def body(state, forward=forward):
            t, running, results = state
            return (t + 1, *step(t, running, results, forward))

        t, running, results = jax.lax.while_loop(cond, body, (t, running, results))
    final = write_back(final, results, slot_ids)
    # A non-finite policy output makes the episode's return NaN: argmax(NaN) would silently act 0 and train on.
    final["returns"] = jnp.where(final.pop("finite"), final["returns"], jnp.nan)
    return final
