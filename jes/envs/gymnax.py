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

import dataclasses
from typing import Any

import jax
import numpy as np

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

# An env object that no name rebuilds (other constructor arguments, or params a name cannot hold) is named
# "<its name> (a gymnax env instance)": checkpoints and policy files record that, and rebuilding it asks for the env.
INSTANCE_SUFFIX = " (a gymnax env instance)"
# Ids whose construction needs more than this machine (MNISTBandit downloads MNIST): never built to find an id.
_NOT_PROBED = ("MNISTBandit-bsuite",)


def env_names() -> list[str]:
    """gymnax's registered env ids."""
    gymnax = import_gymnax()
    return list(gymnax.registered_envs)


def make(name: str) -> tuple[Any, Any]:
    """``(env, params)`` for a gymnax id, optionally with params fields as options: ``"CartPole-v1?gravity=20.0"``.

    Raises:
        ValueError: unknown id (the message lists the valid ones), or an option that is not a params field.
    """
    base, _, query = name.partition("?")
    names = env_names()
    if base not in names:
        raise ValueError(f"unknown env {base!r}; valid gymnax env names are: {', '.join(names)} "
                         f"(and brax envs as 'brax/<name>', e.g. 'brax/inverted_pendulum'; Gymnasium envs as "
                         f"'gymnasium:<id>', e.g. 'gymnasium:CartPole-v1')")
    gymnax = import_gymnax()
    try:
        env, params = gymnax.make(base)
    except OSError as err:  # urllib's URLError included: MNISTBandit downloads MNIST when made
        raise OSError(f"gymnax could not make {base!r}: {err} (it fetches data over the network when made)") from err
    return env, _with_options(base, params, query)


def _field_value(name: str, field: str, default: Any, text: str) -> Any:
    """The params field ``field`` read from its name option ``text``, as the type of its default."""
    if isinstance(default, bool):
        if text.lower() not in ("true", "false"):
            raise ValueError(f"env {name!r}: {field}={text!r} is not a bool; write {field}=true or {field}=false")
        return text.lower() == "true"
    for kind in (int, float):
        if isinstance(default, kind):
            try:
                return kind(text)
            except ValueError:
                raise ValueError(f"env {name!r}: {field}={text!r} is not {'an int' if kind is int else 'a float'}") \
                    from None
    raise ValueError(f"env {name!r}: the params field {field!r} is {type(default).__name__}, which a name cannot "
                     f"hold; pass (env, params) from Python")


def _with_options(base: str, params: Any, query: str) -> Any:
    """``params`` with the fields ``query`` (``"gravity=20.0&length=1.0"``) names replaced."""
    items = [item for item in query.split("&") if item]
    if not items:
        return params
    fields = [f.name for f in dataclasses.fields(params)] if dataclasses.is_dataclass(params) else []
    changes = {}
    for item in items:
        field, sep, text = item.partition("=")
        if not sep or field not in fields:
            raise ValueError(f"unknown option {item!r} in env name '{base}?{query}'; a gymnax env takes its params "
                             f"fields ({', '.join(fields) or 'none'}) and keep_obs=0,2")
        changes[field] = _field_value(base, field, getattr(params, field), text)
    return params.replace(**changes)


def _scalar(value: Any) -> Any:
    """``value`` as a Python bool/int/float when it is a real scalar, else ``None``."""
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (np.ndarray, np.generic, jax.Array)) and np.ndim(value) == 0:
        try:
            return np.asarray(value).item()
        except (TypeError, ValueError):
            return None
    return None


def params_options(params: Any, defaults: Any) -> str | None:
    """The name options (``"gravity=20.0"``) that turn ``defaults`` into ``params``; ``""`` when equal, ``None``
    when a difference cannot be written in a name (an array field, another params type)."""
    if params is defaults:
        return ""
    if type(params) is not type(defaults) or not dataclasses.is_dataclass(params):
        return None
    options = []
    for field in dataclasses.fields(params):
        value, default = getattr(params, field.name), getattr(defaults, field.name)
        if _same_value(value, default):
            continue
        scalar = _scalar(value)
        if scalar is None or isinstance(_scalar(default), bool) != isinstance(scalar, bool):
            return None
        kind = type(_scalar(default))
        if kind is int and float(scalar) != int(scalar):
            return None
        text = str(scalar).lower() if isinstance(scalar, bool) else repr(kind(scalar)) if kind in (int, float) else None
        if text is None:
            return None
        options.append(f"{field.name}={text}")
    return "&".join(options)


def _same_value(a: Any, b: Any) -> bool:
    """Whether two attribute values are equal, arrays (and key arrays) by their contents."""
    try:
        if isinstance(a, jax.Array) and jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a = jax.random.key_data(a)
        if isinstance(b, jax.Array) and jax.dtypes.issubdtype(b.dtype, jax.dtypes.prng_key):
            b = jax.random.key_data(b)
        if isinstance(a, (np.ndarray, np.generic, jax.Array)) or isinstance(b, (np.ndarray, np.generic, jax.Array)):
            a, b = np.asarray(a), np.asarray(b)
            return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - values that cannot be compared are not shown equal
        return False


def _fresh(name: str) -> tuple[Any, Any]:
    """``(env, default params)`` as gymnax makes them for the id ``name`` (cheap: no module-level cache kept)."""
    return import_gymnax().make(name)


def registered_id(env: Any) -> str | None:
    """The gymnax id whose ``make`` builds ``env`` itself: the same class with the same attributes, else ``None``."""
    names = env_names()
    label = getattr(env, "name", None)
    if label in names:
        candidates = [label]
    elif type(env).__module__.split(".")[0] == "gymnax":
        candidates = [n for n in names if n not in _NOT_PROBED]  # a registered class whose name is not its id
    else:
        return None
    for candidate in candidates:
        fresh, _ = _fresh(candidate)
        if type(fresh) is not type(env):
            continue
        mine, theirs = vars(env), vars(fresh)
        if mine.keys() == theirs.keys() and all(_same_value(mine[k], theirs[k]) for k in mine):
            return candidate
    return None


def params_fields(env_id: str) -> tuple[str, ...]:
    """The fields of a registered env's params (what ``?field=value`` options in its name may set)."""
    if env_id not in env_names() or env_id in _NOT_PROBED:
        return ()
    params = _fresh(env_id)[1]
    return tuple(f.name for f in dataclasses.fields(params)) if dataclasses.is_dataclass(params) else ()


def registered_label(env_id: str) -> str | None:
    """The ``name`` attribute of the env gymnax makes for ``env_id`` (``"DiscountingChain-v0"`` for
    ``"DiscountingChain-bsuite"``), what jes recorded for such an env object before it named envs by their ids;
    ``None`` for anything else."""
    if env_id not in env_names() or env_id in _NOT_PROBED:
        return None
    return getattr(_fresh(env_id)[0], "name", None)


def name_of(env: Any, params: Any) -> str:
    """The name :func:`jes.envs.make_env` resolves back to ``(env, params)`` for a gymnax(-protocol) env object.

    A registered env made as its id makes is named by its id, with its params' changed fields as options
    (``"CartPole-v1?gravity=20.0"``). Any other object keeps its own ``name`` (or its class name), marked with
    :data:`INSTANCE_SUFFIX` when that name would otherwise rebuild a different env.
    """
    label = getattr(env, "name", None) or type(env).__name__
    env_id = registered_id(env)
    if env_id is None:
        base = label.partition("?")[0]
        return label + INSTANCE_SUFFIX if base in env_names() else label
    options = params_options(params, _fresh(env_id)[1])
    if options is None:
        return env_id + INSTANCE_SUFFIX
    return f"{env_id}?{options}" if options else env_id


def check_params(env: Any, params: Any, name: str) -> None:
    """Raise ``TypeError`` when ``params`` is not of the type of ``env``'s own default params."""
    defaults = getattr(env, "default_params", None)
    if defaults is None or params is None or type(params) is type(defaults):
        return
    raise TypeError(f"env_params for {name!r} are {type(params).__module__}.{type(params).__qualname__}, but that env "
                    f"takes {type(defaults).__module__}.{type(defaults).__qualname__}: pass env.default_params."
                    f"replace(field=value) of that env (or the options in its name: 'CartPole-v1?gravity=20.0')")


def check_not_wrapper(env: Any) -> None:
    """Raise ``TypeError`` for a gymnax wrapper (``LogWrapper``, ``FlattenObservationWrapper``, ...)."""
    if not any(c.__name__ == "GymnaxWrapper" and c.__module__.startswith("gymnax.") for c in type(env).__mro__):
        return
    raise TypeError(
        f"env is a gymnax wrapper ({type(env).__name__}); jes steps an env through its reset_env/step_env, which a "
        f"gymnax wrapper passes to the env inside it, so the wrapper's own reset/step would never run. Pass the env "
        f"inside it: jes takes image observations as they are (no FlattenObservationWrapper needed), logs returns "
        f"itself (no LogWrapper), and masks observations with jes.envs.mask_observations; for other changes write an env "
        f"with its own reset_env/step_env")


def solved_return(name: str, max_steps: int) -> float | None:
    """Gym's threshold for the registered env ``name`` (``?keep_obs=`` allowed), at its own episode limit only:
    with fewer steps a failing policy can score above a threshold of negative rewards (Acrobot, MountainCar), and
    with other params it is another task."""
    base, _, query = name.partition("?")
    if base not in SOLVED_RETURNS or any(not item.startswith("keep_obs=") for item in query.split("&") if item):
        return None
    limit = getattr(_fresh(base)[1], "max_steps_in_episode", None)
    return SOLVED_RETURNS[base] if limit is None or int(limit) == int(max_steps) else None


def check_protocol(env: Any) -> None:
    """Raise ``TypeError`` naming what ``env`` lacks to be driven like a gymnax env."""
    check_not_wrapper(env)
    missing = [m for m in PROTOCOL_METHODS if not hasattr(env, m)]
    if missing:
        raise TypeError(
            f"env must be a gymnax env name, a gymnax Environment, a brax env or an object with reset_env/step_env/"
            f"action_space/observation_space; {type(env).__name__} lacks {', '.join(missing)}"
        )
