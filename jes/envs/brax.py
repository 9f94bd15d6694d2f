"""The brax env family: a raw brax env adapted to the gymnax protocol jes's rollout drives.

``make_env("brax/hopper")`` or ``make_env("brax/hopper?backend=generalized")`` or
``make_env(brax.envs.get_environment("hopper", backend="spring"))``.

What the adapter does, and why:

* It wraps the *raw* env (``brax.envs.get_environment``), never ``brax.envs.create``:
  create's ``EpisodeWrapper``/``AutoResetWrapper`` would restart finished episodes from one
  cached state and keep stepping after ``done``; jes masks finished episodes and stops early itself.
* All randomness comes from ``reset(key)`` with jes's per-episode key; brax's ``step`` takes none.
* brax's ``done`` is a float meaning termination; raw envs keep simulating after it. A step
  that produces a non-finite observation or reward also ends the episode (its reward counts
  as 0): a physics blow-up is a failure, not a NaN fitness. The rollout masks everything after
  ``done`` with ``where`` (never by multiplying, which would turn NaN into NaN).
* The episode limit is jes's ``max_episode_steps`` (default 1000, brax's own ``EpisodeWrapper``
  default); it lives in :class:`BraxParams` so it travels like gymnax's ``max_steps_in_episode``.
* Actions: policy outputs are squashed with tanh into [-1, 1], brax's action space for every env (its own
  trainers' tanh outputs). The envs whose actuators' ``ctrl_range`` is not +-1 (humanoid and humanoidstandup
  +-0.4, inverted_pendulum +-3, pusher +-2) scale [-1, 1] to it in their ``step``; the others pass actions to
  actuators of range +-1. (Checkpoint format <= 7 runs squashed into ``ctrl_range``, which those four envs then
  scaled again: :attr:`BraxEnv.mapped_otherwise_before`.) An env of your own whose actuators' ranges are not
  +-1 scales [-1, 1] to them in its ``step``, as brax's own do.
* The observation shape comes from ``jax.eval_shape(env.reset, key)`` (~1 s), not
  ``env.observation_size``, which runs an un-jitted reset (8-25 s).

Backends: the default is ``spring`` wherever the env supports it (the fastest on CPU in a one-off
comparison, kept in CHANGELOG.md); ``swimmer`` only has ``generalized`` (a backend an env rejects is answered
with the ones it takes, found by building it with each). ``spring`` is brax's cheapest, least accurate physics; for results
comparable with MuJoCo on a GPU ask for ``?backend=mjx`` (or ``generalized``). The backend is
part of the env's name, so checkpoints and distributed runs carry it.

Names: an env object is named by its registry name, backend and the constructor arguments it was given
(``brax/inverted_pendulum?backend=spring&n_frames=1``), read back from what brax stores (``_n_frames``,
``_<argument>``); the name is verified by rebuilding the env from it and comparing its attributes, ``sys``
included. An object that its name does not rebuild (a changed ``sys``, an attribute set after construction,
an argument a name cannot hold, a class of one's own) is named ``"<name> (a brax env instance) physics:1:<hex>"``
(:data:`INSTANCE_SUFFIX`, :func:`physics_fingerprint` of its ``sys``), which rebuilding refuses: its files are
evaluated and resumed with the env passed again, and warn when that instance's ``sys`` is another (another
fingerprint: other physics, or the same built by another brax or MuJoCo version).
brax wrappers (``brax.envs.create``'s, ``training.wrap``'s, one's own ``brax.envs.Wrapper``) are refused.

The ``brax`` package is imported only here, and only when a brax env is asked for.
"""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import inspect
import io
import re
import sys
import types
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jes.envs.fingerprint import feed
from jes.lazy_gymnax import import_gymnax

PREFIX = "brax/"
INSTALL_HINT = "pip install 'jax-jes[brax]'"
DEFAULT_MAX_STEPS = 1000
# Envs whose default backend is not spring (spring unsupported).
DEFAULT_BACKENDS = {"swimmer": "generalized"}
FALLBACK_BACKEND = "spring"
# brax's physics pipelines (PipelineEnv's backends); which of them an env takes is found by building it.
BACKENDS = ("spring", "positional", "generalized", "mjx")
# Fractions of the per-step maximum that count as solved (Gym's InvertedPendulum: 950 of 1000), for the registered
# env with its default constructor arguments, at brax's own episode limit only.
SOLVED_FRACTIONS = {"inverted_pendulum": 0.95}
# An env object that no name rebuilds is named "<name> (a brax env instance) physics:<scheme>:<hex>": checkpoints
# and policy files record that, and rebuilding it by name asks for the env object. The fingerprint (of its sys:
# physics_fingerprint) makes a file warn when it is resumed on, or loaded for, an instance of another sys; files
# written before names held it name an instance without one (their physics cannot be checked), and an older jes
# still finds the suffix in a name.
INSTANCE_SUFFIX = " (a brax env instance)"
PHYSICS_LABEL = " physics:"
PHYSICS_SCHEME = 1   # how physics_fingerprint computes; another number where that changes (a file's is not compared)
_FINGERPRINT_HEX = 12
_BRAX_NOTICE = "Brax System, piplines and environments are not actively"
_MISSING = object()


def _import_brax_envs() -> Any:
    try:
        # mujoco.mjx prints "Failed to import warp" to stdout on machines without NVIDIA warp;
        # keep jes's own stdout (progress lines, JSON) clean and pass anything else on.
        captured = io.StringIO()
        with contextlib.redirect_stdout(captured):
            import brax.envs
        rest = [line for line in captured.getvalue().splitlines() if "import warp" not in line
                and "import mujoco_warp" not in line]
        if rest:
            print("\n".join(rest), file=sys.stderr)
    except ImportError as err:
        raise ImportError(f"brax envs need the brax extra: {INSTALL_HINT} ({err})") from err
    return brax.envs


def env_names() -> list[str]:
    """brax's registered env names, each prefixed ``brax/``."""
    return [PREFIX + name for name in sorted(_import_brax_envs()._envs)]


def default_backend(name: str) -> str:
    """The backend jes uses for brax env ``name`` when none is given."""
    return DEFAULT_BACKENDS.get(name, FALLBACK_BACKEND)


def is_brax_env(env: Any) -> bool:
    """True for a brax ``Env`` object (checked without importing brax when it is not loaded)."""
    base = sys.modules.get("brax.envs.base")
    return base is not None and isinstance(env, base.Env)


def _parse_value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _format_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def canonical_name(name: str, options: dict[str, Any]) -> str:
    """``brax/<name>?backend=...&<other options sorted>``: the name :func:`make` resolves back."""
    rest = sorted((k, v) for k, v in options.items() if k != "backend")
    items = ([("backend", options["backend"])] if "backend" in options else []) + rest
    query = "&".join(f"{k}={_format_value(v)}" for k, v in items)
    return PREFIX + name + (f"?{query}" if query else "")


def _constructor_arguments(cls: type) -> tuple[dict[str, Any], bool]:
    """``({argument: default}, closed)``: the keyword arguments ``cls(...)`` takes, its own and, where its
    constructor passes ``**kwargs`` on, those of the base classes it passes them to (``PipelineEnv``: ``backend``,
    ``n_frames``, ``debug``); ``closed`` is False when some ``**kwargs`` could not be followed. A default is
    ``inspect.Parameter.empty`` where there is none."""
    arguments: dict[str, Any] = {}
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None:
            continue
        if klass is object:
            return arguments, True
        try:
            parameters = list(inspect.signature(init).parameters.values())[1:]   # without self
        except (TypeError, ValueError):
            return arguments, False
        for parameter in parameters:
            if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) and parameter.name != "sys":
                arguments.setdefault(parameter.name, parameter.default)
        if not any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters):
            return arguments, True
    return arguments, False


def _kind(default: Any) -> type | None:
    """The type an option must have for an argument with this default (``None``: not checked)."""
    for kind in (bool, int, float, str):
        if isinstance(default, kind) and not isinstance(default, enum.Enum):
            return kind
    return None


# Option names of brax's own trainers (brax.envs.create, EvoJAX's BraxTask) and of jes's config, which a brax env's
# name does not take: what jes calls them. ("{value}" is the value given.)
_ELSEWHERE = {
    "episode_length": "the episode length is jes's max_episode_steps, not part of the env name: "
                      "jes.train(..., max_episode_steps={value}) or jes train --max-episode-steps {value}",
    "max_episode_steps": "max_episode_steps is jes's config, not part of the env name: "
                         "jes.train(..., max_episode_steps={value}) or jes train --max-episode-steps {value}",
    "max_steps": "the episode length is jes's max_episode_steps, not part of the env name: "
                 "jes.train(..., max_episode_steps={value}) or jes train --max-episode-steps {value}",
    "action_repeat": "brax.envs.create's action_repeat (a wrapper repeating whole env steps) has no wrapper in jes; "
                     "the nearest is the env's own n_frames, the physics steps one env step takes{example}",
}


def _value_problem(key: str, value: Any) -> str | None:
    """Why an option's value, of the right type, still makes no env, and what the option takes (``None``: it
    makes one)."""
    number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if key == "n_frames" and number and value < 1:
        return (f"n_frames={value} runs no physics step per env step (an env step steps the physics n_frames "
                f"times): the env would never move or end, and every member would score alike; n_frames takes an "
                f"int of 1 or more")
    if key == "reset_noise_scale" and number and not 0 <= value < np.inf:
        if np.isnan(value):   # an env object built so (a name's NaN is refused before, with every option)
            why = "NaN, not a number: brax's uniform(-scale, scale) draws NaN start states"
        elif value < 0:
            why = ("brax draws uniform(-scale, scale), which a negative scale clamps to -scale: every episode would "
                   "start alike, shifted by -scale")
        else:
            why = "an infinite scale draws NaN start states"
        return (f"reset_noise_scale={value} gives no reset noise ({why}); reset_noise_scale takes a finite number of "
                f"0 or more (0: no noise)")
    return None


# Constructor arguments whose values _value_problem checks, also in an env object's _<argument> attributes.
_VALUE_CHECKED = ("n_frames", "reset_noise_scale")


def _example(base: str, key: str, options: dict[str, Any]) -> str:
    """``" (e.g. 'brax/<base>?backend=...&<key>=<value>', <base>'s default)"``: the value of argument ``key`` that
    brax env ``base`` is built with on the backend of ``options`` when a name leaves it out, read back from its
    ``_<key>`` attribute (inverted_pendulum's ``n_frames`` is 4 on spring and 2 on generalized, not
    ``PipelineEnv``'s 1); ``""`` where that cannot be told."""
    shown = {"backend": options["backend"]} if "backend" in options else {}
    try:
        default = vars(_build(base, shown)).get("_" + key, _MISSING)
    except Exception:  # noqa: BLE001 - an env that does not build on that backend: no example
        return ""
    if default is _MISSING or _value_problem(key, default) is not None:
        return ""
    return f" (e.g. {canonical_name(base, {**shown, key: default})!r}, {base}'s default)"


def _checked_options(base: str, options: dict[str, Any], arguments: dict[str, Any], closed: bool) -> dict[str, Any]:
    """``options`` checked against the constructor of brax env ``base`` (names, values of the type of the
    argument's default, and values that make no env: ``n_frames`` < 1, a negative or infinite
    ``reset_noise_scale``), ints given for float arguments made floats.

    Raises:
        ValueError: an argument the constructor does not take (with jes's name for it where it is an option of brax's
            trainers or of jes's config: ``episode_length``, ``action_repeat``, ``max_episode_steps``), a value of
            another type or one that makes no env; the message names the option, the env and what it takes.
    """
    takes = ", ".join(arguments)
    checked = {}
    for key, value in options.items():
        if key not in arguments:
            if closed:
                elsewhere = _ELSEWHERE.get(key, "")
                if key == "action_repeat" and "n_frames" not in arguments:
                    elsewhere = elsewhere.partition(";")[0]
                if elsewhere:
                    example = _example(base, "n_frames", options) if "{example}" in elsewhere else ""
                    elsewhere = "; " + elsewhere.format(value=_format_value(value), example=example)
                raise ValueError(f"brax env {base!r} takes no option {key!r}{elsewhere}; its constructor takes: "
                                 f"{takes} (and jes's keep_obs=0,2)")
            checked[key] = value
            continue
        kind = _kind(arguments[key])
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is not None and (type(value) is not kind):
            what = {bool: "true or false", int: "an int", float: "a number", str: "a string"}[kind]
            raise ValueError(f"brax env {base!r}: option {key}={_format_value(value)!r} is not {what}; {key} takes "
                             f"{what}{_example(base, key, options)}")
        problem = _value_problem(key, value)
        if problem is not None:
            raise ValueError(f"brax env {base!r}: {problem}{_example(base, key, options)}")
        checked[key] = value
    return checked


def _parse_query(name: str, query: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in filter(None, query.split("&")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"bad option {item!r} in env name {name!r}; write key=value, e.g. 'brax/hopper?backend=spring'")
        if key in options:
            raise ValueError(f"option {key!r} is given twice in env name {name!r}; give it once")
        options[key] = _parse_value(value)
    return options


def _build(base: str, options: dict[str, Any]) -> Any:
    """``brax.envs.get_environment(base, **options)``, without brax's notice that it is not maintained, its model on
    this process's own device (:func:`_mjx_models_on_a_local_device`)."""
    envs = _import_brax_envs()
    with warnings.catch_warnings(), _mjx_models_on_a_local_device():
        warnings.filterwarnings("ignore", message=_BRAX_NOTICE)
        return envs.get_environment(base, **options)


@contextlib.contextmanager
def _mjx_models_on_a_local_device():
    """In a multi-process JAX run, MuJoCo MJX's ``put_model`` (brax's ``mjcf.load``) places a model on its own process's
    first device, not on ``jax.devices()[0]``, MJX's default: process 0's device, which process 1 cannot hold, so every
    brax env failed to compile there ("Closing over jax.Array that spans non-addressable devices"; a trial). One
    process: nothing changes (its first device is ``jax.devices()[0]``)."""
    import jax

    from jes.cpu import distributed_initialized

    mjx = sys.modules.get("mujoco.mjx")
    # (distributed_initialized first, not process_count(), which starts the backends)
    if mjx is None or not hasattr(mjx, "put_model") or not distributed_initialized() or jax.process_count() == 1:
        yield
        return
    put_model = mjx.put_model

    def local_put_model(*args, **kwargs):
        if kwargs.get("device") is None and len(args) < 2:  # (m, device, impl, ...): a device given is kept
            kwargs["device"] = jax.local_devices()[0]
        return put_model(*args, **kwargs)

    mjx.put_model = local_put_model
    try:
        yield
    finally:
        mjx.put_model = put_model


def supported_backends(base: str) -> list[str]:
    """The backends brax env ``base`` can be built with (each tried: an env rejects others in its constructor)."""
    supported = []
    for backend in BACKENDS:
        try:
            _build(base, {"backend": backend})
        except Exception:  # noqa: BLE001 - any refusal means "not this backend"
            continue
        supported.append(backend)
    return supported


def _same(a: Any, b: Any, depth: int = 0) -> bool:
    """Whether two attribute values are equal: numbers by value, arrays by their contents, dataclasses (a brax
    ``System``), tuples and dicts field by field. A MuJoCo ``MjModel`` (the rendering model a ``System`` keeps;
    physics reads the ``System``'s own arrays) counts by its type."""
    if a is b:
        return True
    if depth > 16:
        return False
    if type(a).__name__ == "MjModel" and type(a).__module__.split(".")[0] == "mujoco":
        return type(b) is type(a)
    if isinstance(a, (bool, np.bool_)) or isinstance(b, (bool, np.bool_)):
        return isinstance(a, (bool, np.bool_)) and isinstance(b, (bool, np.bool_)) and bool(a) == bool(b)
    if isinstance(a, (int, float, np.number)) and isinstance(b, (int, float, np.number)):
        return bool(a == b) or bool(np.isnan(a) and np.isnan(b))
    if isinstance(a, (np.ndarray, jax.Array)) or isinstance(b, (np.ndarray, jax.Array)):
        try:
            a, b = np.asarray(a), np.asarray(b)
            return a.shape == b.shape and a.dtype == b.dtype and bool(
                np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
        except Exception:  # noqa: BLE001 - key arrays and the like: not shown equal
            return False
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a):
        return all(_same(getattr(a, f.name), getattr(b, f.name), depth + 1) for f in dataclasses.fields(a))
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y, depth + 1) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], depth + 1) for k in a)
    if isinstance(a, (str, bytes, types.ModuleType, enum.Enum, type(None))):
        return a == b
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values that cannot be compared are not shown equal
        return False


def _same_env(env: Any, other: Any) -> bool:
    """Whether two brax envs of one class hold the same attributes (``sys`` with all its arrays included)."""
    mine, theirs = vars(env), vars(other)
    return mine.keys() == theirs.keys() and all(_same(mine[k], theirs[k]) for k in mine)


def physics_fingerprint(env: Any) -> str:
    """``"<scheme>:<hex>"``: a short sha256 of a raw brax env's physics, its ``sys`` (the brax ``System``, every
    array of it included: :func:`jes.envs.fingerprint.feed`), and of nothing else: attributes that change as an env is used (counters
    such as brax's ``fast`` env's ``_reset_count``, cached properties) leave it alone, and constructor arguments are
    in the name already. ``<scheme>`` (:data:`PHYSICS_SCHEME`) numbers the way it is computed. The same ``System``,
    built again, gives the same one in every process and with the ``sys`` moved to another device; a ``System`` of
    other values, one built by another brax or MuJoCo version (other fields), or one edited with values that round
    otherwise (64-bit JAX on or off: floats are taken at float32 precision, but ``mass * 1.3`` computed in float64
    then cast need not equal it computed in float32; another kind of device) gives another. An env without a
    ``sys`` (brax's toy env ``fast``) has one fingerprint."""
    try:
        system = getattr(env, "sys", None)
    except Exception:  # noqa: BLE001 - a property of one's own class that raises: no System to take
        system = None
    digest = hashlib.sha256()
    feed(digest, system)
    return f"{PHYSICS_SCHEME}:{digest.hexdigest()[:_FINGERPRINT_HEX]}"


def instance_name(name: str, env: Any) -> str:
    """The name of brax env instance ``env``: ``name`` (its class's registry name and options) with
    :data:`INSTANCE_SUFFIX` and :data:`PHYSICS_LABEL` and its :func:`physics_fingerprint`."""
    return name + INSTANCE_SUFFIX + PHYSICS_LABEL + physics_fingerprint(env)


def _split_physics(name: str) -> tuple[str, str | None]:
    """``(name without its instance's fingerprint, the fingerprint or None)``: the fingerprint as written, of any
    scheme (``"1:893fe4a92718"``; ``"893fe4a92718"`` in names of a development version before schemes had
    numbers)."""
    head, suffix, tail = name.partition(INSTANCE_SUFFIX)
    found = re.match(re.escape(PHYSICS_LABEL) + "([0-9a-z:]+)", tail) if suffix else None
    if found is None:
        return name, None
    return head + suffix + tail[found.end():], found.group(1)


def instance_difference(recorded: str, given: str) -> str | None:
    """How env name ``given`` stands to ``recorded`` (a file's) where both name one brax env instance (one class,
    backend and options): ``"physics"`` when ``given``'s physics fingerprint is another of this jes's scheme,
    ``"unchecked"`` when ``recorded`` holds none of it (a file of an earlier jes, or of one fingerprinting by
    another scheme: the instance's physics cannot be checked), ``None`` otherwise (the same name, or names of
    other envs, which are compared as names)."""
    if recorded == given or INSTANCE_SUFFIX not in recorded or INSTANCE_SUFFIX not in given:
        return None
    (recorded_plain, recorded_physics), (given_plain, given_physics) = _split_physics(recorded), _split_physics(given)
    if recorded_plain != given_plain or given_physics is None:
        return None
    scheme = f"{PHYSICS_SCHEME}:"
    if recorded_physics is None or not recorded_physics.startswith(scheme) or not given_physics.startswith(scheme):
        return "unchecked"
    return "physics" if recorded_physics != given_physics else None


def instance_warning(recorded: str, given: str, file: str, resuming: bool) -> str | None:
    """What to warn where ``file`` (``"checkpoint <path>"``, ``"policy file <path>"``), which ran brax env instance
    ``recorded``, is resumed (``resuming``) or loaded with the instance ``given`` (:func:`instance_difference`);
    ``None``: nothing to say. Another ``sys`` is said, not refused: the fingerprint of the same physics changes with
    a brax or MuJoCo upgrade, or with 64-bit JAX switched, too, which must not lock a run away."""
    difference = instance_difference(recorded, given)
    if difference == "physics":
        (_, theirs), (_, mine) = _split_physics(recorded), _split_physics(given)
        going_on = ("resuming continues on the physics given" if resuming else
                    "its policy is evaluated on the physics given")
        return (f"{file} ran the brax env instance {recorded!r}; the instance given, {given!r}, has other physics: "
                f"its sys (brax System) differs from the one the file ran (fingerprint {mine}, the file's {theirs}), "
                f"and {going_on}. If that is not what you meant, pass the instance the file ran; the fingerprint of "
                f"the same physics changes too with a brax or MuJoCo upgrade, and with 64-bit JAX switched on or off "
                f"where the sys was edited with values that round otherwise")
    if difference == "unchecked":
        (_, theirs) = _split_physics(recorded)
        why = ("as jes named an instance before it recorded a fingerprint of its physics" if theirs is None else
               f"with a fingerprint of another scheme ({theirs}; this jes writes scheme {PHYSICS_SCHEME})")
        return (f"{file} ran the brax env instance {recorded!r}, named {why}: jes cannot check that the instance "
                f"given now, {given!r}, has the physics it ran; {'resuming' if resuming else 'evaluating'} on it "
                f"as given")
    return None


def registered_instead_warning(recorded: str, given: str, file: str,
                               how: str = "load_policy(path, env=instance)") -> str | None:
    """What to warn where ``file``, whose policy ran brax env instance ``recorded``, is evaluated on ``given``, the
    registered env of the instance's class and options (its default physics, not the instance's); ``None``
    otherwise (an env of another name is taken as the user's choice, as any env of fitting shapes is)."""
    head, suffix, _ = recorded.partition(INSTANCE_SUFFIX)
    if not suffix or INSTANCE_SUFFIX in given or head != given:
        return None
    return (f"{file} ran the brax env instance {recorded!r} (a {head!r} of its own physics or attributes), but the "
            f"env given is the registered {given!r}, with brax's default physics: its policy is evaluated on those. "
            f"If that is not what you meant, pass the instance the file ran ({how})")


def _registry_name(env: Any) -> str | None:
    return next((n for n, cls in _import_brax_envs()._envs.items() if type(env) is cls), None)


def name_of(env: Any) -> str:
    """The name :func:`make` rebuilds ``env`` from, for a raw brax env object.

    A registered class is named by its registry name, its backend and the constructor arguments that differ from
    those of the env the name alone builds (read back from the ``_<argument>`` attributes brax's envs keep:
    ``"brax/inverted_pendulum?backend=spring&n_frames=1"``). The name is verified by building the env from it and
    comparing every attribute; an env it does not rebuild (a changed ``sys``, an attribute set after construction,
    an argument a name cannot hold, a class of one's own) is named with :data:`INSTANCE_SUFFIX` and its
    :func:`physics_fingerprint` (:func:`instance_name`).
    """
    arguments, closed = _constructor_arguments(type(env))
    backend = vars(env).get("_backend") if "backend" in arguments else None   # brax's toy env "fast" keeps none
    plain: dict[str, Any] = {} if backend is None else {"backend": backend}
    options = dict(plain)
    base = _registry_name(env)
    if base is None:
        return instance_name(canonical_name(type(env).__name__, options), env)
    rebuilds = False
    try:
        fresh = _build(base, options)
        for key, default in arguments.items():
            value = vars(env).get("_" + key, _MISSING)
            if key == "backend" or value is _MISSING or _same(value, vars(fresh).get("_" + key, _MISSING)):
                continue
            if _kind(default) is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            options[key] = value
        if options == plain:
            rebuilt = fresh
        else:  # built as make() builds it from the name's text
            query = canonical_name(base, options).partition("?")[2]
            rebuilt = _build(base, _checked_options(base, _parse_query(base, query), arguments, closed))
        rebuilds = _same_env(env, rebuilt)
    except Exception:  # noqa: BLE001 - a value a name cannot hold, or an env its name does not build: an instance
        rebuilds = False
    name = canonical_name(base, options)
    return name if rebuilds else instance_name(name, env)


def refuse_wrapper(env: Any) -> None:
    """Raise ``TypeError`` for any brax ``Wrapper`` (``brax.envs.create``'s, ``training.wrap``'s, ``EvalWrapper``,
    one's own subclass of ``brax.envs.Wrapper``), naming the wrappers and what to pass instead."""
    base = sys.modules.get("brax.envs.base")
    if base is None or not isinstance(env, base.Wrapper):
        return
    chain, inner = [], env
    while isinstance(inner, base.Wrapper) and len(chain) < 32:
        chain.append(type(inner).__name__)
        inner = vars(inner).get("env")   # not getattr: a brax Wrapper passes unknown attributes on to its env
    wrapped = "(".join(chain) + "(" + type(inner).__name__ + ")" * len(chain)
    created = {"EpisodeWrapper", "AutoResetWrapper", "VmapWrapper"} & set(chain)
    raise TypeError(
        f"pass a raw brax env (brax.envs.get_environment(...)), not a wrapped one ({wrapped})"
        f"{', e.g. from brax.envs.create() or training.wrap()' if created else ''}: jes limits episodes "
        f"(max_episode_steps) and masks finished ones itself, and rebuilds an env from its name (checkpoints, jes "
        f"eval, workers), which no wrapper survives. A wrapper of your own (another reward, observation or action) "
        f"is not supported: write the change into an env of your own, a subclass of the brax env's class with its "
        f"own step/reset, and pass it as an object (it runs in this process; evaluate or resume its files with the "
        f"env passed again) or register it (brax.envs.register_environment('my_env', MyEnv)) and pass "
        f"'brax/my_env' where it is registered")


@struct.dataclass
class BraxParams:
    """Env params of a brax env as jes sees it: only the episode limit (brax envs carry their own)."""

    max_steps_in_episode: int = DEFAULT_MAX_STEPS


class BraxEnv:
    """A raw brax env behind the gymnax protocol (``reset_env``/``step_env``/spaces).

    Args:
        env: a raw brax env (``brax.envs.get_environment(...)``, not ``brax.envs.create``).
        name: the canonical name (``brax/<name>?backend=...``); when ``None``, :func:`name_of` the env (its
            registry name, backend and changed constructor arguments, or an instance's name).

    Raises:
        TypeError: a brax wrapper (:func:`refuse_wrapper`).
        ValueError: an env built with ``n_frames`` < 1 (it would never move) or a negative or infinite
            ``reset_noise_scale`` (no reset noise).
    """

    def __init__(self, env: Any, name: str | None = None):
        refuse_wrapper(env)
        for key in _VALUE_CHECKED:   # an object built so (a name's options are refused before the env is built)
            problem = _value_problem(key, vars(env).get("_" + key))
            if problem is not None:
                raise ValueError(f"brax env {type(env).__name__}: {problem}")
        self.env = env
        self.backend = getattr(env, "backend", None)
        self.name = name or name_of(env)
        state = jax.eval_shape(env.reset, jax.random.key(0))
        self.obs_shape = tuple(int(d) for d in state.obs.shape)
        size = int(env.action_size)
        self.action_low, self.action_high = -np.ones(size, np.float32), np.ones(size, np.float32)
        ctrl = getattr(getattr(getattr(env, "sys", None), "actuator", None), "ctrl_range", None)
        ctrl = None if ctrl is None else np.asarray(ctrl, np.float32).reshape(-1, 2)
        limited = None if ctrl is None else ctrl[:, 0] < ctrl[:, 1]  # MuJoCo writes (0, 0) for unlimited actuators
        # Whether the actuators' ranges are other than [-1, 1]: then the env's step scales [-1, 1] to them, and a jes
        # of checkpoint format <= 7, which squashed actions into these ranges, had them scaled twice.
        self.mapped_otherwise_before = bool(ctrl is not None and ctrl.shape[0] == size and limited.any()
                                     and not np.array_equal(ctrl[limited], np.tile([-1.0, 1.0], (int(limited.sum()), 1))))

    @property
    def default_params(self) -> BraxParams:
        return BraxParams()

    # The episode limit the solved thresholds were set for: brax's own (its EpisodeWrapper's default), whatever
    # max_episode_steps this run takes (as gymnax's and Gymnasium's thresholds count at their env's own limit).
    threshold_steps = DEFAULT_MAX_STEPS

    def solved_return(self, max_steps: int) -> float | None:
        """Gym's threshold for the registered env with its default constructor arguments (any backend), at brax's
        own episode limit only: with fewer steps it is an easier task, with another ``n_frames`` another one."""
        if INSTANCE_SUFFIX in self.name or int(max_steps) != self.threshold_steps:
            return None
        base, _, query = self.name[len(PREFIX):].partition("?")
        if any(item.partition("=")[0] != "backend" for item in query.split("&") if item):
            return None
        fraction = SOLVED_FRACTIONS.get(base)
        return None if fraction is None else fraction * self.threshold_steps

    def reset_env(self, key: jax.Array, params: BraxParams) -> tuple[jax.Array, Any]:
        del params
        state = self.env.reset(key)
        return state.obs, state

    def step_env(self, key: jax.Array, state: Any, action: jax.Array, params: BraxParams):
        del key, params   # brax steps are deterministic given the state
        new = self.env.step(state, action)
        obs, reward = new.obs, new.reward
        finite = jnp.all(jnp.isfinite(obs)) & jnp.isfinite(reward)
        done = (new.done != 0) | ~finite
        return jnp.where(jnp.isfinite(obs), obs, 0.0), new, jnp.where(finite, reward, 0.0), done, {}

    def action_space(self, params: Any = None) -> Any:
        spaces = import_gymnax().environments.spaces

        return spaces.Box(self.action_low, self.action_high, self.action_low.shape, jnp.float32)

    def observation_space(self, params: Any = None) -> Any:
        spaces = import_gymnax().environments.spaces

        return spaces.Box(-jnp.inf, jnp.inf, self.obs_shape, jnp.float32)


def make(name: str) -> BraxEnv:
    """A :class:`BraxEnv` for ``"brax/<name>[?backend=...&<constructor argument>=...]"``.

    Options are checked against the env's constructor before it is built; those equal to what the name without
    them builds are left out of the env's name, so that equal envs get one name.

    Raises:
        ImportError: brax is not installed (the message names the extra to install).
        ValueError: unknown brax env (the message lists the valid ones), an option its constructor does not take or
            of another type, a backend it does not support (the message names those it does), or an instance's
            name (:data:`INSTANCE_SUFFIX`), which no name rebuilds.
    """
    if not name.startswith(PREFIX):
        raise ValueError(f"brax env names start with {PREFIX!r}, got {name!r}")
    if INSTANCE_SUFFIX in name:
        raise ValueError(f"env {name!r} was a brax env object that no name rebuilds: pass that env itself again, "
                         f"from Python")
    base, _, query = name[len(PREFIX):].partition("?")
    options = _parse_query(name, query)
    envs = _import_brax_envs()
    if base not in envs._envs:
        raise ValueError(f"unknown brax env {base!r}; valid brax env names are: "
                         f"{', '.join(PREFIX + n for n in sorted(envs._envs))}")
    arguments, closed = _constructor_arguments(envs._envs[base])
    if "backend" in arguments:   # brax's toy env "fast" has no physics backend
        options.setdefault("backend", default_backend(base))
    options = _checked_options(base, options, arguments, closed)
    try:
        env = _build(base, options)
    except Exception as err:  # noqa: BLE001 - brax's envs refuse arguments with errors of many kinds
        backend = options.get("backend")
        if backend is not None:
            supported = supported_backends(base)
            if supported and backend not in supported:
                raise ValueError(f"brax env {base!r} does not support backend {backend!r} ({err}); it supports "
                                 f"{', '.join(supported)}: write 'brax/{base}?backend={supported[0]}'") from err
        raise ValueError(f"brax env {base!r} rejected options {options}: {type(err).__name__}: {err}") from err
    # The same env gets the same name however it was spelt: options that built what the name without them builds
    # (a default value; a backend the env does not keep, as brax's toy env "fast") are left out of it.
    plain = {"backend": options["backend"]} if "backend" in options and "_backend" in vars(env) else {}
    if options != plain:
        default = _build(base, plain)

        def needed(key: str, value: Any) -> bool:
            stored = vars(env).get("_" + key, _MISSING)
            if key in plain or stored is _MISSING:   # an argument not kept in an attribute: its effect is unknown
                return key in plain or key != "backend"
            return not _same(value, vars(default).get("_" + key, _MISSING))

        reduced = {k: v for k, v in options.items() if needed(k, v)}
        if reduced != options and _same_env(env, default if reduced == plain else _build(base, reduced)):
            options = reduced
    return BraxEnv(env, canonical_name(base, options))
