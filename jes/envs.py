"""Environment lookup and the protocol a custom JAX env follows.

jes drives any gymnax environment (by registered name or as an object). A
custom environment works if it offers the gymnax methods jes uses:

* ``default_params`` (a pytree of env parameters, may be ``None``-free dataclass),
* ``reset_env(key, params) -> (obs, state)``,
* ``step_env(key, state, action, params) -> (obs, state, reward, done, info)``,
* ``action_space(params)`` returning a ``gymnax.environments.spaces.Discrete`` or ``Box``,
* ``observation_space(params)`` with a ``.shape``,
* optionally ``is_truncated(state, params)`` (gymnax >= 1.0 keeps the time limit out of ``done``).

jes calls the non-resetting ``step_env`` and masks finished episodes itself;
rewards after ``done`` never count.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jes.env_checks import check_env

# Scores at which gymnax's classic-control tasks count as solved (Gym's thresholds).
SOLVED_RETURNS = {
    "CartPole-v1": 475.0,
    "Acrobot-v1": -100.0,
    "MountainCar-v0": -110.0,
    "MountainCarContinuous-v0": 90.0,
    "Pendulum-v1": -200.0,
}


def registered_env_names() -> list[str]:
    """Names accepted by :func:`make_env` (gymnax's registry)."""
    import gymnax

    return list(gymnax.registered_envs)


@dataclasses.dataclass(frozen=True, eq=False)
class EnvSpec:
    """A resolved environment: the env object, its params, and how policy outputs become actions.

    Attributes:
        env: the gymnax(-like) environment object.
        params: env parameters passed to ``reset_env``/``step_env``.
        name: a readable name (the registry id for gymnax envs).
        obs_shape: shape of one observation.
        num_outputs: size of the policy output the action head expects.
        discrete: whether actions are integers (argmax over outputs).
        action_low, action_high: bounds of a continuous action space (numpy), or ``None``.
        action_shape: shape of one action.
        max_steps: episode length limit used by rollouts.
        solved_return: Gym's "solved" threshold when known, else ``None``.
    """

    env: Any
    params: Any
    name: str
    obs_shape: tuple[int, ...]
    num_outputs: int
    discrete: bool
    action_shape: tuple[int, ...]
    action_low: np.ndarray | None
    action_high: np.ndarray | None
    max_steps: int
    solved_return: float | None

    def action(self, out: jax.Array) -> jax.Array:
        """Map one raw policy output of shape ``(num_outputs,)`` to an env action."""
        if self.discrete:
            return jnp.argmax(out).astype(jnp.int32)
        out = out.reshape(self.action_shape)
        low, high = self.action_low, self.action_high
        if low is None or not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
            return out
        low = jnp.asarray(low, jnp.float32)
        high = jnp.asarray(high, jnp.float32)
        return low + (jnp.tanh(out) + 1.0) * 0.5 * (high - low)

    def done_after(self, terminated: jax.Array, state: Any) -> jax.Array:
        """``terminated`` or truncated by the env's own time limit (gymnax >= 1.0 reports them apart)."""
        is_truncated = getattr(self.env, "is_truncated", None)
        if is_truncated is None:
            return terminated.astype(bool)
        try:
            truncated = is_truncated(state, self.params)
        except (NotImplementedError, AttributeError):
            return terminated.astype(bool)
        return jnp.logical_or(terminated, truncated)


def make_env(env: Any, env_params: Any = None, max_steps: int | None = None) -> EnvSpec:
    """Resolve ``env`` (a gymnax id, a gymnax env object, or ``(env, params)``) into an :class:`EnvSpec`.

    Raises:
        ValueError: unknown env name (the message lists the valid ones) or an unsupported action space.
        TypeError: an object that does not follow the env protocol.
    """
    check_env(env)
    if isinstance(env, str):
        names = registered_env_names()
        if env not in names:
            raise ValueError(f"unknown env {env!r}; valid gymnax env names are: {', '.join(names)}")
        import gymnax

        env_obj, default_params = gymnax.make(env)
        name = env
    elif isinstance(env, tuple) and len(env) == 2:
        env_obj, default_params = env
        name = getattr(env_obj, "name", type(env_obj).__name__)
    else:
        env_obj = env
        missing = [m for m in ("reset_env", "step_env", "action_space", "observation_space") if not hasattr(env_obj, m)]
        if missing:
            raise TypeError(
                f"env must be a gymnax env name, a gymnax Environment or an object with reset_env/step_env/"
                f"action_space/observation_space; {type(env).__name__} lacks {', '.join(missing)}"
            )
        default_params = getattr(env_obj, "default_params", None)
        name = getattr(env_obj, "name", type(env_obj).__name__)
    params = default_params if env_params is None else env_params

    from gymnax.environments import spaces

    space = env_obj.action_space(params)
    obs_shape = tuple(int(d) for d in env_obj.observation_space(params).shape)
    if isinstance(space, spaces.Discrete):
        num_outputs = int(space.n)
        discrete, action_shape, low, high = True, (), None, None
    elif isinstance(space, spaces.Box):
        action_shape = tuple(int(d) for d in space.shape)
        num_outputs = int(np.prod(action_shape)) if action_shape else 1
        discrete = False
        low = np.broadcast_to(np.asarray(space.low, np.float32), action_shape).copy()
        high = np.broadcast_to(np.asarray(space.high, np.float32), action_shape).copy()
    else:
        raise ValueError(
            f"env {name!r} has action space {type(space).__name__}; jes supports Discrete and Box action spaces"
        )

    env_limit = getattr(params, "max_steps_in_episode", None)
    if max_steps is None:
        if env_limit is None:
            raise ValueError(f"env {name!r} has no max_steps_in_episode; pass max_episode_steps=... to jes.train")
        max_steps = int(env_limit)
    if int(max_steps) <= 0:
        raise ValueError(f"max_episode_steps must be positive, got {max_steps}")
    if env_limit is not None and int(max_steps) != int(env_limit):
        # gymnax truncates at params.max_steps_in_episode: move the env's own limit along with ours.
        if not hasattr(params, "replace"):
            raise ValueError(f"env {name!r} params cannot be given max_episode_steps={max_steps}; set it in env_params")
        params = params.replace(max_steps_in_episode=int(max_steps))
    return EnvSpec(
        env=env_obj,
        params=params,
        name=name,
        obs_shape=obs_shape,
        num_outputs=num_outputs,
        discrete=discrete,
        action_shape=action_shape,
        action_low=low,
        action_high=high,
        max_steps=int(max_steps),
        solved_return=SOLVED_RETURNS.get(name),
    )
