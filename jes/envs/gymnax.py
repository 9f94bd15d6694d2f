"""The gymnax env family, and the protocol a custom JAX env follows.

jes drives any gymnax environment (by registered name or as an object). A
custom environment works if it offers the gymnax methods jes uses:

* ``default_params`` (a pytree of env parameters, may be ``None``-free dataclass),
* ``reset_env(key, params) -> (obs, state)``,
* ``step_env(key, state, action, params) -> (obs, state, reward, done, info)``,
* ``action_space(params)`` returning a ``gymnax.environments.spaces.Discrete`` or ``Box``,
* ``observation_space(params)`` with a ``.shape``,
* optionally ``is_truncated(state, params)`` (gymnax >= 1.0 keeps the time limit out of ``done``),
* optionally ``name`` (recorded in checkpoints) and ``solved_return(max_steps)``.

jes calls the non-resetting ``step_env`` and masks finished episodes itself;
rewards after ``done`` never count.
"""
from __future__ import annotations

from typing import Any
from jes.lazy_gymnax import import_gymnax

# Scores at which tasks count as solved (Gym's thresholds; MemoryChain: always right).
SOLVED_RETURNS = {
    "CartPole-v1": 475.0,
    "Acrobot-v1": -100.0,
    "MountainCar-v0": -110.0,
    "MountainCarContinuous-v0": 90.0,
    "Pendulum-v1": -200.0,
    "MemoryChain-bsuite": 1.0,
}

PROTOCOL_METHODS = ("reset_env", "step_env", "action_space", "observation_space")


def env_names() -> list[str]:
    """gymnax's registered env ids."""
    gymnax = import_gymnax()
    return list(gymnax.registered_envs)


def make(name: str) -> tuple[Any, Any]:
    """``(env, default_params)`` for a gymnax id.

    Raises:
        ValueError: unknown id; the message lists the valid ones.
    """
    names = env_names()
    if name not in names:
        raise ValueError(f"unknown env {name!r}; valid gymnax env names are: {', '.join(names)} "
                         f"(and brax envs as 'brax/<name>', e.g. 'brax/inverted_pendulum'; Gymnasium envs as "
                         f"'gymnasium:<id>', e.g. 'gymnasium:CartPole-v1')")
    gymnax = import_gymnax()
    return gymnax.make(name)


def check_protocol(env: Any) -> None:
    """Raise ``TypeError`` naming what ``env`` lacks to be driven like a gymnax env."""
    missing = [m for m in PROTOCOL_METHODS if not hasattr(env, m)]
    if missing:
        raise TypeError(
            f"env must be a gymnax env name, a gymnax Environment, a brax env or an object with reset_env/step_env/"
            f"action_space/observation_space; {type(env).__name__} lacks {', '.join(missing)}"
        )
