"""Environments: a registry of env families resolved into one :class:`EnvSpec`.

* gymnax (:mod:`jes.envs.gymnax`): ``"CartPole-v1"``, a gymnax env object, or ``(env, params)``.
* brax (:mod:`jes.envs.brax`, optional extra ``pip install 'jax-jes[brax]'``):
  ``"brax/hopper"``, ``"brax/hopper?backend=generalized"``, or a raw brax env object.
* wrappers (:mod:`jes.envs.wrappers`): ``mask_observations(env, keep=[0, 2])``, also written
  as the name suffix ``"CartPole-v1?keep_obs=0,2"``.
* gymnasium (:mod:`jes.envs.gymnasium`, optional extra ``pip install 'jax-jes[gymnasium]'``): a *host*
  env family, ``"gymnasium:CartPole-v1"``, a ``gymnasium.Env`` instance or subclass, or
  ``jes.envs.gymnasium.make(factory)``; stepped on the host by :mod:`jes.host_rollout` (``spec.host``).

Every env is brought to the gymnax protocol :mod:`jes.rollout` drives. An env's
``EnvSpec.name`` resolves back to the same env with :func:`make_env`, which is how checkpoints
and distributed runs record it.
"""
from __future__ import annotations

from typing import Any, Sequence

from jes.envs import brax as brax_family
from jes.envs import gymnasium as gymnasium_family
from jes.envs import gymnax as gymnax_family
from jes.envs.gymnax import SOLVED_RETURNS
from jes.envs.spec import EnvSpec, spec_from_env
from jes.envs.wrappers import KEEP_OPTION, MaskedObservations, split_option
from jes.env_checks import check_env

__all__ = ["EnvSpec", "SOLVED_RETURNS", "make_env", "mask_observations", "registered_env_names", "resolvable_name"]


def registered_env_names(include_brax: bool = True) -> list[str]:
    """Names accepted by :func:`make_env`: gymnax's registry, then ``brax/<name>`` when brax is installed.

    Listing the brax names imports brax (~2 s); ``include_brax=False`` skips it.
    """
    names = gymnax_family.env_names()
    if include_brax:
        try:
            names += brax_family.env_names()
        except ImportError:
            pass
    return names


def _resolve(env: Any) -> tuple[Any, Any, str]:
    """``(gymnax-protocol env object, its default params, name)`` for anything make_env accepts."""
    if isinstance(env, str):
        base, keep = split_option(env, KEEP_OPTION)
        if keep is not None:
            inner, params, inner_name = _resolve(base)
            try:
                indices = [int(i) for i in keep.split(",")]
            except ValueError:
                raise ValueError(f"bad {KEEP_OPTION}={keep!r} in env name {env!r}; write indices like "
                                 f"{KEEP_OPTION}=0,2") from None
            masked = MaskedObservations(inner, indices, inner_name, params)
            return masked, params, masked.name
        if env.startswith(brax_family.PREFIX):
            adapted = brax_family.make(env)
            return adapted, adapted.default_params, adapted.name
        if env.endswith(gymnasium_family.INSTANCE_SUFFIX):
            raise ValueError(f"env {env!r} was a gymnasium.Env instance made otherwise than its registered id (other "
                             f"arguments, time limit or wrappers), which no name rebuilds: pass that env itself again, from Python (jes.load_policy(path, env=env), "
                             f"policy.evaluate(env=env), jes.train(policy, env, ..., resume=path)); the command "
                             f"line cannot rebuild it")
        if "?" in env:
            raise ValueError(f"unknown option in env name {env!r}; gymnax envs take only ?{KEEP_OPTION}=0,2")
        env_obj, params = gymnax_family.make(env)
        return env_obj, params, env
    if isinstance(env, tuple) and len(env) == 2:
        env_obj, params = env
        if brax_family.is_brax_env(env_obj):
            raise TypeError("pass a brax env alone (make_env(env)); brax envs have no separate params")
        return env_obj, params, getattr(env_obj, "name", type(env_obj).__name__)
    if brax_family.is_brax_env(env):
        adapted = brax_family.BraxEnv(env)
        return adapted, adapted.default_params, adapted.name
    gymnax_family.check_protocol(env)
    return env, getattr(env, "default_params", None), getattr(env, "name", type(env).__name__)


def make_env(env: Any, env_params: Any = None, max_steps: int | None = None) -> EnvSpec:
    """Resolve ``env`` into an :class:`EnvSpec`.

    Args:
        env: a gymnax id (``"CartPole-v1"``), a brax name (``"brax/hopper?backend=spring"``), either
            with ``?keep_obs=0,2`` to mask observations, a gymnax(-protocol) env object, a raw brax
            env object, or ``(env, params)``.
        env_params: env parameters overriding the env's defaults (gymnax).
        max_steps: episode length limit (default: the env's own; 1000 for brax envs).

    Raises:
        ValueError: unknown env name (the message lists the valid ones) or an unsupported action space.
        TypeError: an object that does not follow the env protocol.
        ImportError: a brax env without brax installed (the message names the extra).
    """
    if gymnasium_family.is_gymnasium_env(env):
        if env_params is not None:
            raise ValueError("Gymnasium envs take no env_params; pass keyword arguments through your own factory")
        return gymnasium_family.make(env, max_steps).spec(max_steps)
    check_env(env)
    env_obj, default_params, name = _resolve(env)
    params = default_params if env_params is None else env_params
    return spec_from_env(env_obj, params, name, max_steps, SOLVED_RETURNS)


def mask_observations(env: Any, keep: Sequence[int], env_params: Any = None) -> MaskedObservations:
    """``env`` whose observations keep only the (flattened) entries ``keep``, in that order.

    Works on any env :func:`make_env` accepts. Pass the result to :func:`jes.train` like any env;
    its name (``"CartPole-v1?keep_obs=0,2"``) resolves back to it, so checkpoints record it.

    Example: ``mask_observations("CartPole-v1", keep=[0, 2])`` hides both velocities;
    ``mask_observations("Pendulum-v1", keep=[0, 1])`` hides the angular velocity.
    """
    env_obj, default_params, name = _resolve(env)
    return MaskedObservations(env_obj, keep, name, default_params if env_params is None else env_params)


def resolvable_name(env: Any) -> str | None:
    """The name that :func:`make_env` resolves back to ``env``, for env objects jes itself adapts.

    A name for a raw brax env, a :class:`~jes.envs.brax.BraxEnv` or a :class:`MaskedObservations`
    (whose names carry the backend / the kept indices), else ``None``: run descriptions should
    record such envs by this name (a brax env rebuilt from its class alone would get brax's default
    backend, i.e. other physics). A brax env object is named by its registry name and backend only:
    pass ``"brax/<name>?backend=...&<option>=..."`` to carry other constructor options.
    """
    if brax_family.is_brax_env(env):
        return brax_family.BraxEnv(env).name
    if isinstance(env, (brax_family.BraxEnv, MaskedObservations)):
        return env.name
    if isinstance(env, gymnasium_family.GymnasiumEnv) and env.env_id is not None:
        return env.name
    return None
