"""The gymnax env family, and the protocol a custom JAX env follows.

jes drives any gymnax environment (by registered name or as an object). A
custom environment works if it offers the gymnax methods jes uses:

* ``default_params`` (a pytree of env parameters, may be ``None``-free dataclass),
* ``reset_env(key, params) -> (obs, state)``,
* ``step_env(key, state, action, params) -> (obs, state, reward, done, info)``,
* ``action_space(params)`` returning a ``gymnax.environments.spaces.Discrete`` or ``Box``,
* ``observation_space(params)`` with a ``.shape``,
* optionally ``is_truncated(state, params)`` (gymnax >= 1.0 keeps the time limit out of ``done``),
* optionally ``name`` (the label its files record) and ``solved_return(max_steps)``.

An env object that no gymnax id rebuilds (a class of one's own, or a gymnax class made otherwise than its id) is
named ``"<name> (a gymnax env instance) class:<module>.<QualName> params:<scheme>:<hex>"`` (:func:`instance_name`):
its class, and a fingerprint of its params and plain attributes, so that a resume with another class is refused
and one with other params (or a policy file loaded for them) is warned of.

jes calls the non-resetting ``step_env`` and masks finished episodes itself;
rewards after ``done`` never count.
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
import sys
from typing import Any

import jax
import numpy as np

from jes.envs.fingerprint import feed
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
# ...followed by its class and a fingerprint of its values (params and plain attributes): "... class:mypkg.envs.Point
# params:1:<hex>". Another class is another name (a resume refused); other values are warned of, not refused (as a brax
# instance's other physics): the fingerprint of the same values may change with 64-bit JAX switched where a value
# was computed, and that must not lock a run away. Files written before jes recorded these name the bare label.
CLASS_LABEL = " class:"
VALUES_LABEL = " params:"
VALUES_SCHEME = 1   # how values_fingerprint computes; another number where that changes (a file's is not compared)
_FINGERPRINT_HEX = 12
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
        registry = getattr(sys.modules.get("gymnasium"), "registry", {})  # an id a program registered (--import)
        hint = (f" Gymnasium has {base!r} registered: a Python simulator goes in as 'gymnasium:{base}'."
                if base in registry else "")
        raise ValueError(f"unknown env {base!r};{hint} valid gymnax env names are: {', '.join(names)} "
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
    (``"CartPole-v1?gravity=20.0"``). Any other object (a class of one's own; a registered one made otherwise or
    with params a name cannot hold) is named by :func:`instance_name`: its own ``name`` (or its class name, or its
    id), :data:`INSTANCE_SUFFIX`, its class and a fingerprint of its params and attributes.
    """
    env_id = registered_id(env)
    if env_id is None:
        return instance_name(getattr(env, "name", None) or type(env).__name__, env, params)
    options = params_options(params, _fresh(env_id)[1])
    if options is None:
        return instance_name(env_id, env, params)
    return f"{env_id}?{options}" if options else env_id


def _plain_attributes(env: Any) -> dict:
    """An env object's settings: its public attributes that hold data (numbers, strings, None, arrays, key arrays
    as their key data, and tuples, lists and dicts of them); others (submodules, functions) are left out."""
    def data(value: Any, depth: int = 0) -> bool:
        if depth > 8:
            return False
        if value is None or isinstance(value, (bool, int, float, str, np.ndarray, np.generic, jax.Array)):
            return True
        if isinstance(value, (tuple, list)):
            return all(data(v, depth + 1) for v in value)
        if isinstance(value, dict):
            return all(isinstance(k, str) and data(v, depth + 1) for k, v in value.items())
        return False

    try:
        attributes = vars(env)
    except TypeError:   # a class with __slots__: nothing to take
        return {}
    return {k: _key_data(v) for k, v in sorted(attributes.items()) if not k.startswith("_") and data(v)}


def _key_data(tree: Any) -> Any:
    """``tree`` with its PRNG key arrays as their key data (a key array has no values numpy reads)."""
    def unkey(leaf: Any) -> Any:
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            return jax.random.key_data(leaf)
        return leaf
    try:
        return jax.tree.map(unkey, tree)
    except Exception:  # noqa: BLE001 - a pytree that does not map: fed as it is
        return tree


def values_fingerprint(env: Any, params: Any) -> str:
    """``"<scheme>:<hex>"``: a short sha256 of an env object's ``params`` and its :func:`_plain_attributes` (the
    constructor arguments such objects keep), by :func:`jes.envs.fingerprint.feed` (numbers and arrays by their values
    in one canonical dtype: the same in every process, on any device, with 64-bit JAX or not)."""
    digest = hashlib.sha256()
    feed(digest, ("params", _key_data(params), "attributes", _plain_attributes(env)))
    return f"{VALUES_SCHEME}:{digest.hexdigest()[:_FINGERPRINT_HEX]}"


def differing_attributes(env: Any, other: Any) -> list[str]:
    """The names of the plain attributes (those :func:`values_fingerprint` takes) that env objects ``env`` and
    ``other`` hold with other values, or one holds and the other does not, sorted."""
    def digest(value: Any) -> bytes:
        hashed = hashlib.sha256()
        feed(hashed, value)
        return hashed.digest()

    mine, theirs = _plain_attributes(env), _plain_attributes(other)
    return sorted(k for k in mine.keys() | theirs.keys()
                  if k not in mine or k not in theirs or digest(mine[k]) != digest(theirs[k]))


def instance_name(label: str, env: Any, params: Any) -> str:
    """The name of a gymnax(-protocol) env object that no id rebuilds: ``label`` (its ``name``, class name or id),
    :data:`INSTANCE_SUFFIX`, its class (``module.QualName``) and :func:`values_fingerprint`."""
    cls = type(env)
    return (f"{label}{INSTANCE_SUFFIX}{CLASS_LABEL}{cls.__module__}.{cls.__qualname__}"
            f"{VALUES_LABEL}{values_fingerprint(env, params)}")


def _split_values(name: str) -> tuple[str, str | None]:
    """``(name without its fingerprint, the fingerprint as written, or None)``."""
    head, suffix, tail = name.partition(INSTANCE_SUFFIX)
    found = re.search(re.escape(VALUES_LABEL) + "([0-9a-z:]+)", tail) if suffix else None
    if found is None:
        return name, None
    return head + suffix + tail[:found.start()] + tail[found.end():], found.group(1)


def _split_keep(name: str) -> tuple[str, str | None]:
    """``(name without a trailing keep_obs option, its indices or None)``: a masked instance's name ends with one
    (:mod:`jes.envs.wrappers` appends it; it imports this module, so it is read here by hand)."""
    found = re.search(r"[?&]keep_obs=([^&?]*)$", name)
    return (name, None) if found is None else (name[:found.start()], found.group(1))


def instance_difference(recorded: str, given: str) -> str | None:
    """How env name ``given`` (a gymnax env instance's, with its class and fingerprint) stands to ``recorded`` (a
    file's): ``"values"`` when they name one label and class with another fingerprint of this jes's scheme,
    ``"unchecked"`` when ``recorded`` is the name jes gave that object before it recorded class and values (its bare
    label, or the label with :data:`INSTANCE_SUFFIX`), or holds a fingerprint of another scheme; ``None`` otherwise
    (the same name, or names of other envs or classes, which are compared as names)."""
    if recorded == given or INSTANCE_SUFFIX not in given or CLASS_LABEL not in given:
        return None
    (recorded, recorded_keep), (given, given_keep) = _split_keep(recorded), _split_keep(given)
    if recorded_keep != given_keep:
        return None
    label = given.partition(INSTANCE_SUFFIX)[0]
    if recorded == label + INSTANCE_SUFFIX or (recorded == label and label.partition("?")[0] not in env_names()):
        return "unchecked"   # a gymnax id's object was named with the suffix then, so a bare id is the id's env
    (recorded_plain, recorded_values), (given_plain, given_values) = _split_values(recorded), _split_values(given)
    if recorded_plain != given_plain or given_values is None:
        return None
    scheme = f"{VALUES_SCHEME}:"
    if recorded_values is None or not recorded_values.startswith(scheme) or not given_values.startswith(scheme):
        return "unchecked"
    return "values" if recorded_values != given_values else None


def instance_warning(recorded: str, given: str, file: str, resuming: bool) -> str | None:
    """What to warn where ``file`` (``"checkpoint <path>"``, ``"policy file <path>"``), which ran the gymnax env
    instance ``recorded``, is resumed (``resuming``) or loaded with the instance ``given`` (:func:`instance_difference`);
    ``None``: nothing to say. Other values are said, not refused, as a brax instance's other physics are."""
    difference = instance_difference(recorded, given)
    going_on = "resuming on it as given" if resuming else "its policy is evaluated on it as given"
    if difference == "values":
        return (f"{file} ran the env {recorded!r}; the env given, {given!r}, is of that class with other params or "
                f"attributes (fingerprint {_split_values(given)[1]}, the file's {_split_values(recorded)[1]}): "
                f"{going_on}. If that is not what you meant, pass the env and params the file ran: (env, params)")
    if difference == "unchecked":
        return (f"{file} names its env {recorded!r}, as jes named a JAX env object of its own before it recorded its "
                f"class and a fingerprint of its params: jes cannot check that the env given, {given!r}, is the one "
                f"it ran; {going_on}")
    return None


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
