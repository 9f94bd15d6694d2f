"""Env wrappers over the gymnax protocol (so they work on gymnax and brax envs alike).

``mask_observations(env, keep=[0, 2])`` hides observation entries: CartPole without its
velocities (keep cart position and pole angle) can only be balanced by a policy that
remembers, which is what a recurrent policy is for.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jes.envs.gymnax import solved_return as registered_solved_return
from jes.lazy_gymnax import import_gymnax

KEEP_OPTION = "keep_obs"


def with_option(name: str, key: str, value: str) -> str:
    """``name`` with ``key=value`` appended to its ``?query``."""
    return f"{name}{'&' if '?' in name else '?'}{key}={value}"


def split_option(name: str, key: str) -> tuple[str, str | None]:
    """``(name without key=..., value or None)``."""
    base, sep, query = name.partition("?")
    if not sep:
        return name, None
    items = [item for item in query.split("&") if item]
    value = None
    rest = []
    for item in items:
        k, _, v = item.partition("=")
        if k == key:
            value = v
        else:
            rest.append(item)
    return base + ("?" + "&".join(rest) if rest else ""), value


def nan_option(name: str) -> str | None:
    """The first ``key=value`` option of env name ``name`` whose value reads as NaN (``"gravity=nan"``), or ``None``.

    No env parameter means anything as NaN (an infinite one can: a threshold turned off), and a NaN one turns every
    return NaN; env names come from files and masters too, so they are checked before anything is built.
    """
    for item in name.partition("?")[2].split("&"):
        try:
            if math.isnan(float(item.partition("=")[2])):
                return item
        except ValueError:
            continue
    return None


class MaskedObservations:
    """A gymnax-protocol env whose observations keep only the entries ``keep`` (a flat view).

    Args:
        env: a gymnax-protocol env object (a gymnax env, a :class:`jes.envs.brax.BraxEnv`, ...).
        keep: indices into the flattened observation, kept in the given order.
        name: the wrapped env's name (``<name>?keep_obs=0,2`` is this env's).
        default_params: the wrapped env's params (gymnax ids come with theirs).
    """

    def __init__(self, env: Any, keep: Sequence[int], name: str, default_params: Any = None):
        self.env = env
        self.keep = tuple(int(i) for i in keep)
        self._default_params = getattr(env, "default_params", None) if default_params is None else default_params
        inner_shape = tuple(int(d) for d in env.observation_space(self._default_params).shape)
        size = int(np.prod(inner_shape))
        if not self.keep:
            raise ValueError("mask_observations needs at least one index to keep, e.g. keep=[0, 2]")
        bad = [i for i in self.keep if not -size <= i < size]
        if bad:
            raise ValueError(f"mask_observations: indices {bad} are outside the {size} observation entries of {name!r} "
                             f"(shape {inner_shape}); keep indices in 0..{size - 1}")
        self.inner_name = name
        self.name = with_option(name, KEEP_OPTION, ",".join(str(i) for i in self.keep))
        self._index = jnp.asarray(self.keep, jnp.int32)

    def _mask(self, obs: jax.Array) -> jax.Array:
        return jnp.ravel(obs)[self._index]

    @property
    def default_params(self) -> Any:
        return self._default_params

    def reset_env(self, key: jax.Array, params: Any):
        obs, state = self.env.reset_env(key, params)
        return self._mask(obs), state

    def step_env(self, key: jax.Array, state: Any, action: Any, params: Any):
        obs, state, reward, done, info = self.env.step_env(key, state, action, params)
        return self._mask(obs), state, reward, done, info

    def is_truncated(self, state: Any, params: Any) -> jax.Array:
        inner = getattr(self.env, "is_truncated", None)
        if inner is None:
            raise NotImplementedError
        return inner(state, params)

    def solved_return(self, max_steps: int) -> float | None:
        inner = getattr(self.env, "solved_return", None)
        if callable(inner):
            return inner(max_steps)
        return registered_solved_return(self.inner_name, max_steps)

    def action_space(self, params: Any = None) -> Any:
        return self.env.action_space(params)

    def observation_space(self, params: Any = None) -> Any:
        spaces = import_gymnax().environments.spaces

        inner = self.env.observation_space(params)
        low = np.ravel(np.broadcast_to(np.asarray(inner.low, np.float32), inner.shape))[list(self.keep)]
        high = np.ravel(np.broadcast_to(np.asarray(inner.high, np.float32), inner.shape))[list(self.keep)]
        return spaces.Box(low, high, (len(self.keep),), jnp.float32)
