"""Clear errors for envs jes cannot drive (called by :func:`jes.envs.make_env` before anything else).

jes compiles whole episodes with JAX, so it needs a *JAX* environment with gymnax's pure
``reset_env``/``step_env`` methods. The two common mistakes get a message saying what is
supported and how to adapt: passing an env *class* instead of an instance, and passing a
Gym/Gymnasium env (Python, stateful, stepped one call at a time).
"""
from __future__ import annotations

import functools
import inspect
from typing import Any

SUPPORTED = ("a gymnax env id (e.g. \"CartPole-v1\", see jes.registered_env_names()), a gymnax Environment "
             "instance, (env, env_params), or your own JAX env object with reset_env/step_env/action_space/"
             "observation_space (see jes/envs/gymnax.py); a Python simulator as 'gymnasium:<id>', a gymnasium.Env "
             "instance or jes.envs.gymnasium.make(factory)")


def check_env(env: Any) -> None:
    """Raise a ``TypeError`` that says what to pass instead when ``env`` is an env class or a Gym(nasium) env.

    Anything else is left to :func:`jes.envs.make_env`'s own checks.
    """
    target = env[0] if isinstance(env, tuple) and len(env) == 2 else env
    if inspect.isclass(target):
        if _has_env_methods(target):
            raise TypeError(f"env is the class {target.__module__}.{target.__qualname__}, not an environment: pass "
                            f"{target.__name__}() instead. jes accepts {SUPPORTED}.")
        raise TypeError(f"env is the class {target.__module__}.{target.__qualname__}, which is neither a JAX env "
                        f"(reset_env/step_env/action_space/observation_space) nor a gymnasium.Env subclass. jes "
                        f"accepts {SUPPORTED}.")
    if callable(target) and not hasattr(target, "reset_env") and (inspect.isfunction(target)
                                                                  or isinstance(target, functools.partial)):
        raise TypeError(f"env is the function {getattr(target, '__qualname__', target)!r}: a factory of a Python env "
                        f"goes in as jes.envs.gymnasium.make(factory) (a zero-argument function returning a "
                        f"gymnasium.Env). jes accepts {SUPPORTED}.")
    if _is_gym_env(target):
        spec_id = getattr(getattr(target, "spec", None), "id", None)
        same = f"; for {spec_id!r} try the gymnax id {spec_id!r}" if spec_id else ""
        raise TypeError(
            f"env is a Gym/Gymnasium environment ({type(target).__module__}.{type(target).__name__}) but not a "
            f"gymnasium.Env; jes steps Python simulators through Gymnasium: pass 'gymnasium:<id>', a gymnasium.Env "
            f"instance or jes.envs.gymnasium.make(factory) (pip install \"jax-jes[gymnasium]\"){same}. Or a JAX "
            f"env: {SUPPORTED}. Or evaluate members yourself with jes.AskTell (README: ask/tell).")


def _has_env_methods(obj: Any) -> bool:
    return all(hasattr(obj, m) for m in ("reset_env", "step_env"))


def _is_gym_env(obj: Any) -> bool:
    modules = [getattr(c, "__module__", "") or "" for c in type(obj).__mro__]
    if any(m.split(".")[0] in ("gym", "gymnasium") for m in modules):
        return True
    # Wrapped or look-alike Python envs: step/reset without gymnax's pure methods.
    return (hasattr(obj, "step") and hasattr(obj, "reset") and not _has_env_methods(obj)
            and hasattr(obj, "action_space") and not callable(getattr(obj, "action_space")))
