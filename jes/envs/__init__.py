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

import jax
import jax.numpy as jnp

from jes.envs import brax as brax_family
from jes.envs import gymnasium as gymnasium_family
from jes.envs import gymnax as gymnax_family
from jes.envs.gymnax import SOLVED_RETURNS
from jes.envs.spec import EnvSpec, spec_from_env
from jes.envs.wrappers import KEEP_OPTION, MaskedObservations, nan_option, split_option
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


def _resolve(env: Any, env_params: Any = None) -> tuple[Any, Any, str]:
    """``(gymnax-protocol env object, its params, name)`` for anything make_env accepts; ``env_params`` (when given)
    replace the env's own params, and the name records them."""
    if isinstance(env, str):
        base, keep = split_option(env, KEEP_OPTION)
        if keep is not None:
            inner, params, inner_name = _resolve(base, env_params)
            try:
                indices = [int(i) for i in keep.split(",")]
            except ValueError:
                raise ValueError(f"bad {KEEP_OPTION}={keep!r} in env name {env!r}; write indices like "
                                 f"{KEEP_OPTION}=0,2") from None
            masked = MaskedObservations(inner, indices, inner_name, params)
            return masked, params, masked.name
        for suffix, kind in ((gymnasium_family.CLASS_SUFFIX, "a gymnasium.Env class"),
                             (gymnasium_family.FACTORY_SUFFIX, "a factory of gymnasium.Env")):
            if env.endswith(suffix):
                raise ValueError(f"env {env!r} was {kind} of your own, which no name rebuilds: pass that env itself "
                                 f"again, from Python (jes.load_policy(path, env=env), policy.evaluate(env=env), policy.render(path, env=env), "
                                 f"jes.train(policy, env, ..., resume=path)); the command line cannot rebuild it")
        for suffix, kind, how in (
                (gymnasium_family.INSTANCE_SUFFIX, "a gymnasium.Env instance", "its registered id (other arguments, "
                 "params, time limit or wrappers)"),
                (gymnax_family.INSTANCE_SUFFIX, "a JAX env object of your own class, or a gymnax env",
                 "its registered id (other arguments or params)"),
                (brax_family.INSTANCE_SUFFIX, "a brax env object", "its registered name (a changed sys, attributes "
                 "set after construction, constructor arguments a name cannot hold, or a class of your own)")):
            # a brax or gymnax instance's name goes on with its fingerprint (and may with ?keep_obs=...)
            if env.endswith(suffix) or (suffix != gymnasium_family.INSTANCE_SUFFIX and suffix in env):
                raise ValueError(f"env {env!r} was {kind} made otherwise than {how}, which no name rebuilds: pass "
                                 f"that env itself again, from Python (jes.load_policy(path, env=env), "
                                 f"policy.evaluate(env=env), policy.render(path, env=env), jes.train(policy, env, ..., resume=path)); the command "
                                 f"line cannot rebuild it")
        if env.startswith(brax_family.PREFIX):
            adapted = brax_family.make(env)
            return adapted, adapted.default_params if env_params is None else env_params, adapted.name
        env_obj, params = gymnax_family.make(env)
        if env_params is not None:
            if "?" in env:
                raise ValueError(f"env {env!r} sets params in its name and env_params were given too; give them "
                                 f"one way")
            gymnax_family.check_params(env_obj, env_params, env)
            params = env_params
        named = env_params is not None or "?" in env
        return env_obj, params, gymnax_family.name_of(env_obj, params) if named else env
    if isinstance(env, tuple) and len(env) == 2:
        env_obj, params = env
        if env_params is not None:
            raise ValueError("env was given as (env, params) and env_params=... too; pass the params once")
        if brax_family.is_brax_env(env_obj):
            raise TypeError("pass a brax env alone (make_env(env)); brax envs have no separate params")
        if all(hasattr(params, m) for m in gymnax_family.PROTOCOL_METHODS) and not hasattr(env_obj, "step_env"):
            raise TypeError(f"env was given as (params, env): pass (env, params), the env first "
                            f"({type(params).__name__}, then its {type(env_obj).__name__})")
        gymnax_family.check_protocol(env_obj)
        return _named(env_obj, params)
    if brax_family.is_brax_env(env):
        adapted = brax_family.BraxEnv(env)
        return adapted, adapted.default_params if env_params is None else env_params, adapted.name
    gymnax_family.check_protocol(env)
    return _named(env, getattr(env, "default_params", None) if env_params is None else env_params)


def _named(env: Any, params: Any) -> tuple[Any, Any, str]:
    """``(env, params, name)`` for a gymnax-protocol env object: jes's own adapters by their names, others by
    :func:`jes.envs.gymnax.name_of` (a registered env's id with its changed params as options)."""
    own = resolvable_name(env)
    if own is not None:
        return env, params, own
    gymnax_family.check_params(env, params, getattr(env, "name", type(env).__name__))
    return env, params, gymnax_family.name_of(env, params)


def _check_observations(env: Any, params: Any, name: str) -> None:
    """Raise ``ValueError`` when ``env``'s first observation is not of the shape its ``observation_space`` gives
    (policies and observation statistics are sized by the space)."""
    if isinstance(env, (brax_family.BraxEnv, MaskedObservations)):
        return
    space = env.observation_space(params)
    if not hasattr(space, "shape"):
        raise ValueError(f"env {name!r} has a {type(space).__name__} observation space; a JAX env's observations go "
                         f"to the policy as one array: give it a Box observation_space and return one array "
                         f"(jnp.concatenate the parts, jnp.ravel each), or pass a gymnasium.Env, whose Dict and "
                         f"Tuple observations jes flattens")
    declared = tuple(int(d) for d in space.shape)
    try:
        obs = jax.eval_shape(lambda k: env.reset_env(k, params)[0], jax.random.key(0))
    except Exception:  # noqa: BLE001 - an env that fails here fails with its own error when run
        return
    actual = tuple(getattr(obs, "shape", ()))
    if actual != declared:
        raise ValueError(f"env {name!r} returns observations of shape {actual} from reset_env, but its "
                         f"observation_space(params).shape is {declared}; jes sizes the policy's input by the "
                         f"space, so make them agree")


def _typed(value: Any) -> str:
    """``"float32[1]"``: a traced value's dtype and shape, as JAX writes them."""
    shape = getattr(value, "shape", None)
    if shape is None:
        return type(value).__name__
    return f"{getattr(value, 'dtype', '?')}[{','.join(str(d) for d in shape)}]"


def _check_step(spec: EnvSpec) -> None:
    """Raise ``ValueError`` naming the value when one ``step_env`` (traced only, by ``jax.eval_shape``: nothing is
    compiled or run) returns what the rollout's loop cannot carry: a reward or done that is not a scalar, an
    observation of another shape than ``reset_env``'s, or a state of another structure or shapes (JAX would fail
    deep in the compiled loop, naming neither the env nor the value)."""
    env, params, name = spec.env, spec.params, spec.name
    if isinstance(env, (brax_family.BraxEnv, MaskedObservations)) or type(env).__module__.split(".")[0] == "gymnax":
        return   # jes's adapters and gymnax's own envs step as the rollout needs: nothing to trace

    def reset_then_step(key: jax.Array) -> tuple:
        obs, state = env.reset_env(key, params)
        action = spec.action(jnp.zeros((spec.num_outputs,), jnp.float32))  # what the rollout's policy head gives
        return (obs, state), env.step_env(key, state, action, params)

    try:
        (obs, state), stepped = jax.eval_shape(reset_then_step, jax.random.key(0))
        new_obs, new_state, reward, done = stepped[:4]
    except Exception:  # noqa: BLE001 - an env that fails here fails with its own error when run
        return
    for what, value, fix in (
            ("reward", reward, "return a scalar: reward[0], jnp.sum(reward) or reward.squeeze()"),
            ("done", done, "return a scalar bool: done[0], jnp.any(done) or done.squeeze()")):
        if getattr(value, "shape", None) != ():
            raise ValueError(f"env {name!r}: step_env returns a {what} of {_typed(value)}; jes's rollout takes one "
                             f"scalar {what} a step: {fix}")
    if getattr(new_obs, "shape", None) != getattr(obs, "shape", None):
        raise ValueError(f"env {name!r}: step_env returns observations of {_typed(new_obs)}, but reset_env returns "
                         f"{_typed(obs)}; every step's observation must have reset_env's shape")
    leaves, structure = jax.tree.flatten_with_path(state)
    new_leaves, new_structure = jax.tree.flatten_with_path(new_state)
    if structure != new_structure:
        raise ValueError(f"env {name!r}: step_env returns a state of another structure than reset_env's ({new_structure}"
                         f", reset_env's {structure}); the state must keep its fields and their shapes from step to "
                         f"step")
    for (path, before), (_, after) in zip(leaves, new_leaves):
        if getattr(before, "shape", None) != getattr(after, "shape", None):
            raise ValueError(f"env {name!r}: step_env returns a state whose {jax.tree_util.keystr(path) or 'value'} "
                             f"is {_typed(after)}, but reset_env's is {_typed(before)}; the state must keep its "
                             f"shapes from step to step (a scalar stays a scalar: squeeze the action, e.g. "
                             f"action[0], before adding it)")


def make_env(env: Any, env_params: Any = None, max_steps: int | None = None) -> EnvSpec:
    """Resolve ``env`` into an :class:`EnvSpec`.

    Args:
        env: a gymnax id (``"CartPole-v1"``, with params fields as options: ``"CartPole-v1?gravity=20.0"``), a
            brax name (``"brax/hopper?backend=spring"``), either with ``?keep_obs=0,2`` to mask observations, a
            gymnax(-protocol) env object, a raw brax env object, or ``(env, params)``.
        env_params: env parameters overriding the env's defaults (gymnax).
        max_steps: episode length limit (default: the env's own; 1000 for brax envs).

    The spec's name resolves back to the same env and params: a registered gymnax env's changed params become
    options in it; an env object made otherwise than its id (constructor arguments, or params a name cannot hold)
    gets a name ending in ``" (a gymnax env instance)"``, which rebuilding refuses. A brax env object is named by its
    registry name, backend and constructor arguments (``"brax/inverted_pendulum?backend=spring&n_frames=1"``), or,
    when that name does not rebuild it, ``"... (a brax env instance) physics:<fingerprint>"``.

    Raises:
        ValueError: unknown env name (the message lists the valid ones), a name setting a parameter to NaN, an
            unsupported action space or observation space (a JAX env's Dict), observations of another shape than
            the env's observation space, or (a JAX env of one's own, traced once, not compiled) a step_env whose
            reward or done is not a scalar, or whose observation or state changes shape or structure.
        TypeError: an object that does not follow the env protocol, a gymnax or brax wrapper, or params of another
            env.
        ImportError: a brax env without brax installed (the message names the extra), or a registered Gymnasium id
            whose package is not installed (the message names the env and the package).
    """
    if gymnasium_family.is_gymnasium_env(env):
        if env_params is not None:
            raise ValueError("Gymnasium envs take no env_params; pass keyword arguments through your own factory")
        return gymnasium_family.make(env, max_steps).spec(max_steps)
    if isinstance(env, str) and nan_option(env) is not None:
        raise ValueError(f"env {env!r} sets {nan_option(env)}: an env parameter cannot be NaN (not a number)")
    check_env(env)
    env_obj, params, name = _resolve(env, env_params)
    _check_observations(env_obj, params, name)
    spec = spec_from_env(env_obj, params, name, max_steps, gymnax_family.solved_return)
    _check_step(spec)
    return spec


def mask_observations(env: Any, keep: Sequence[int], env_params: Any = None) -> MaskedObservations:
    """``env`` whose observations keep only the (flattened) entries ``keep``, in that order.

    Works on any env :func:`make_env` accepts. Pass the result to :func:`jes.train` like any env;
    its name (``"CartPole-v1?keep_obs=0,2"``) resolves back to it, so checkpoints record it.

    Example: ``mask_observations("CartPole-v1", keep=[0, 2])`` hides both velocities;
    ``mask_observations("Pendulum-v1", keep=[0, 1])`` hides the angular velocity.
    """
    if gymnasium_family.is_gymnasium_env(env):
        raise ValueError(f"mask_observations {gymnasium_family.NOT_MASKED}")
    env_obj, params, name = _resolve(env, env_params)
    return MaskedObservations(env_obj, keep, name, params)


def resolvable_name(env: Any) -> str | None:
    """The name that :func:`make_env` resolves back to ``env``, for env objects jes itself adapts.

    A name for a raw brax env, a :class:`~jes.envs.brax.BraxEnv` or a :class:`MaskedObservations`
    (whose names carry the backend / the kept indices), else ``None``: run descriptions should
    record such envs by this name (a brax env rebuilt from its class alone would get brax's default
    backend, i.e. other physics). A brax env object is named by its registry name, backend and the
    constructor arguments it was given (``"brax/inverted_pendulum?backend=spring&n_frames=1"``); one that
    no name rebuilds gets a name with :data:`jes.envs.brax.INSTANCE_SUFFIX`, which :func:`make_env` refuses.
    """
    if brax_family.is_brax_env(env):
        return brax_family.BraxEnv(env).name
    if isinstance(env, (brax_family.BraxEnv, MaskedObservations)):
        return env.name
    if isinstance(env, gymnasium_family.GymnasiumEnv) and env.env_id is not None:
        return env.name
    if gymnasium_family.is_gymnasium_env(env) and not isinstance(env, (str, type)):
        made = gymnasium_family.make(env)  # gymnasium.make(id)'s plain env is rebuilt from its id
        return made.name if made.env_id is not None else None
    return None
