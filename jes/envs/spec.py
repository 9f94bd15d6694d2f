"""EnvSpec: a resolved environment and how policy outputs become its actions.

Every env family (gymnax, brax, wrappers over either) is brought to the gymnax
protocol that :mod:`jes.rollout` drives, then described by one :class:`EnvSpec`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.extend.core as jax_core
import jax.numpy as jnp
import numpy as np
from jes.lazy_gymnax import import_gymnax


def box_action(out: jax.Array, low: np.ndarray, high: np.ndarray) -> jax.Array:
    """A continuous action from the policy's raw output (``low``/``high``: float32 bounds shaped like ``out``).

    Each dimension bounded on both sides is ``low + (tanh(out) + 1) / 2 * (high - low)``; bounded below only,
    ``low + softplus(out)``; above only, ``high - softplus(-out)``; unbounded, ``out`` itself. (A space with any
    infinite bound took the raw output in every dimension before, actions outside the bounds included.)
    """
    below, above = np.isfinite(low), np.isfinite(high)
    if below.all() and above.all():
        low, high = jnp.asarray(low, jnp.float32), jnp.asarray(high, jnp.float32)
        return low + (jnp.tanh(out) + 1.0) * 0.5 * (high - low)
    if not below.any() and not above.any():
        return out
    both = below & above
    low_f, high_f = np.where(below, low, 0.0).astype(np.float32), np.where(above, high, 0.0).astype(np.float32)
    scaled = low_f + (jnp.tanh(out) + 1.0) * 0.5 * (high_f - low_f)
    one_sided = jnp.where(below, low_f + jax.nn.softplus(out), high_f - jax.nn.softplus(-out))
    return jnp.where(both, scaled, jnp.where(below | above, one_sided, out))


def maps_box_otherwise_than_before(low: np.ndarray | None, high: np.ndarray | None) -> bool:
    """Whether :func:`box_action` maps these bounds otherwise than jes did before it (checkpoint format 5, policy
    format 1): some bounds finite and some not, where the raw output went to every dimension."""
    if low is None or high is None:
        return False
    finite = np.concatenate([np.isfinite(np.asarray(low, np.float32)).ravel(),
                             np.isfinite(np.asarray(high, np.float32)).ravel()])
    return bool(finite.any() and not finite.all())


@dataclasses.dataclass(frozen=True, eq=False)
class EnvSpec:
    """A resolved environment: the env object, its params, and how policy outputs become actions.

    Attributes:
        env: the gymnax(-protocol) environment object (brax envs come wrapped in
            :class:`jes.envs.brax.BraxEnv`).
        params: env parameters passed to ``reset_env``/``step_env``.
        name: a name :func:`jes.envs.make_env` resolves back to the same env (the registry id for
            gymnax envs, ``"brax/hopper?backend=spring"`` for brax); checkpoints and run
            descriptions record it.
        obs_shape: shape of one observation.
        num_outputs: size of the policy output the action head expects.
        discrete: whether actions are integers (argmax over outputs).
        action_low, action_high: bounds of a continuous action space (numpy), or ``None``.
        action_shape: shape of one action.
        max_steps: episode length limit used by rollouts.
        solved_return: the task's "solved" threshold when known, else ``None``.
        fixed_length: whether the env never ends an episode itself (only its time limit does), so every
            episode runs ``max_steps`` steps: the rollout then compiles no compaction levels, which could
            never be entered (a speed and compile-time hint; results never depend on compaction).
        categorical_obs: whether an observation is a ``Discrete`` space's integer id (gymnax's FrozenLake-misc): a
            category, not a quantity, so it reaches the policy as it is (an ``nn.Embed`` takes it), never
            normalised (a z-scored id is another id, or none).
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
    fixed_length: bool = False
    categorical_obs: bool = False

    @property
    def host(self) -> bool:
        """Whether the env is a host (Python) env stepped by :mod:`jes.host_rollout`, not compiled."""
        return bool(getattr(self.env, "is_host_env", False))

    def action(self, out: jax.Array) -> jax.Array:
        """Map one raw policy output of shape ``(num_outputs,)`` to an env action."""
        if self.discrete:
            return jnp.argmax(out).astype(jnp.int32)
        out = out.reshape(self.action_shape)
        if self.action_low is None:
            return out
        return box_action(out, np.asarray(self.action_low, np.float32), np.asarray(self.action_high, np.float32))

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


def never_terminates(env: Any, params: Any) -> bool:
    """Whether ``env``'s own termination is the constant ``False``: gymnax >= 1.0 envs report it apart from the
    time limit (``is_terminated``), traced once here, without running the env (Pendulum: yes; CartPole: no)."""
    is_terminated = getattr(env, "is_terminated", None)
    if is_terminated is None:
        return False
    try:
        traced = jax.make_jaxpr(lambda k: is_terminated(env.reset(k, params)[1], params))(jax.random.key(0))
    except Exception:  # noqa: BLE001 - an env that cannot be traced this way simply gets no hint
        return False
    outs = traced.jaxpr.outvars
    return len(outs) == 1 and isinstance(outs[0], jax_core.Literal) and not bool(outs[0].val)


def spec_from_env(env: Any, params: Any, name: str, max_steps: int | None,
                  solved_return_of: Callable[[str, int], float | None] | None = None) -> EnvSpec:
    """Describe a gymnax-protocol ``env`` with ``params``; ``max_steps`` overrides its own episode limit.

    The "solved" threshold is the env's own ``solved_return(max_steps)`` when it has one, else
    ``solved_return_of(name, max_steps)``.

    Raises:
        ValueError: an unsupported action space, or no episode limit known.
    """

    spaces = import_gymnax().environments.spaces

    space = env.action_space(params)
    obs_space = env.observation_space(params)
    obs_shape = tuple(int(d) for d in obs_space.shape)
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
    solved = getattr(env, "solved_return", None)
    if callable(solved):
        solved = solved(int(max_steps))
    else:
        solved = solved_return_of(name, int(max_steps)) if solved_return_of is not None else None
    return EnvSpec(
        env=env,
        params=params,
        name=name,
        obs_shape=obs_shape,
        num_outputs=num_outputs,
        discrete=discrete,
        action_shape=action_shape,
        action_low=low,
        action_high=high,
        max_steps=int(max_steps),
        solved_return=solved,
        fixed_length=never_terminates(env, params),
        categorical_obs=isinstance(obs_space, spaces.Discrete),
    )
