"""Gymnasium env family: Python simulators stepped on the host, the policy compiled and batched.

A host env is not a gymnax-protocol object: :mod:`jes.host_rollout` steps one ``gymnasium.Env`` per
episode slot on the host and calls one jitted, vmapped policy step per env step for all of them.

Accepted (:func:`make`):

* ``"gymnasium:CartPole-v1"``: a registered Gymnasium id, optionally with
  ``?episode_seconds=60`` (a per-episode wall-time limit). Only this form travels to workers and into
  checkpoints: the id is data, and ``gymnasium.make`` builds it from gymnasium's own registry (ids
  with a ``module:`` prefix, which would import a module, are refused).
* a ``gymnasium.Env`` instance (each slot gets a deep copy), a ``gymnasium.Env`` subclass or any
  zero-argument factory returning a ``gymnasium.Env`` (called once per slot): in-process only.

Each episode's ``reset(seed=...)`` comes from its episode key, so a member's fitness depends only on
(key, generation, member, episode): bit-identical wherever it runs *when the env is deterministic given
its seed* (nothing checks that; it is the user's env).
"""
from __future__ import annotations

import copy
import inspect
import math
import sys
from typing import Any, Callable

import numpy as np

from jes.envs.gymnax import env_names as gymnax_env_names
from jes.envs.spec import EnvSpec
from jes.envs.wrappers import split_option

PREFIX = "gymnasium:"
TIME_OPTION = "episode_seconds"
EXTRA = 'pip install "jax-jes[gymnasium]" (and "gymnasium[mujoco]" for MuJoCo envs)'


def import_gymnasium() -> Any:
    """The ``gymnasium`` module, or an ``ImportError`` naming the extra."""
    try:
        import gymnasium
    except ImportError as err:
        raise ImportError(f"Gymnasium envs need gymnasium: {EXTRA}") from err
    return gymnasium


def _gymnasium_or_none() -> Any:
    try:
        import gymnasium
    except ImportError:
        return None
    return gymnasium


def is_gymnasium_env(env: Any) -> bool:
    """Whether ``env`` is something this family takes: a ``gymnasium:`` id, a ``gymnasium.Env`` instance or
    subclass, or a :class:`GymnasiumEnv`. (A plain factory function is taken by :func:`make` explicitly.)"""
    if isinstance(env, GymnasiumEnv):
        return True
    if isinstance(env, str):
        return env.startswith(PREFIX)
    gymnasium = _gymnasium_or_none()
    if gymnasium is None:
        return False
    if inspect.isclass(env):
        return issubclass(env, gymnasium.Env)
    return isinstance(env, gymnasium.Env)


def _index_check(space: Any, where: str = "") -> Callable[[Any], Any] | None:
    """``obs -> obs`` raising ``ValueError`` where a Discrete or MultiDiscrete part of ``space`` holds an index outside
    its range (``gymnasium.spaces.flatten`` one-hot encodes ``start - 1`` as the last cell and a MultiDiscrete's
    overflow as the next component's cell, silently); ``None`` for a space without such parts."""
    spaces = import_gymnasium().spaces
    if isinstance(space, spaces.Discrete):
        low, high = int(space.start), int(space.start) + int(space.n)

        def discrete(obs):
            if not low <= int(np.asarray(obs).reshape(())) < high:
                raise ValueError(f"observation{where} {obs!r} is outside {space} (indices {low}..{high - 1})")
            return obs
        return discrete
    if isinstance(space, spaces.MultiDiscrete):
        low = np.asarray(getattr(space, "start", 0))
        high = low + np.asarray(space.nvec)

        def multi(obs):
            x = np.asarray(obs)
            if x.shape != tuple(space.shape) or not np.all((low <= x) & (x < high)):
                raise ValueError(f"observation{where} {x.tolist()} is outside {space} (each index from its start "
                                 f"below its nvec)")
            return obs
        return multi
    if isinstance(space, spaces.Dict):
        parts = {k: _index_check(s, f"{where}[{k!r}]") for k, s in space.spaces.items()}
        parts = {k: f for k, f in parts.items() if f is not None}
        if not parts:
            return None

        def mapping(obs):
            for k, f in parts.items():
                f(obs[k])
            return obs
        return mapping
    if isinstance(space, spaces.Tuple):
        parts = [(i, _index_check(s, f"{where}[{i}]")) for i, s in enumerate(space.spaces)]
        parts = [(i, f) for i, f in parts if f is not None]
        if not parts:
            return None

        def sequence(obs):
            for i, f in parts:
                f(obs[i])
            return obs
        return sequence
    return None


class GymnasiumEnv:
    """A host env: builds one ``gymnasium.Env`` per episode slot and converts observations and actions.

    Args:
        factory: zero-argument callable returning a fresh ``gymnasium.Env``.
        name: the env's name (``"gymnasium:CartPole-v1"`` for ids: :func:`jes.envs.make_env` resolves it back).
        env_id: the registered id when built from one (``None``: a user's factory; it cannot travel to workers).
        episode_seconds: wall-time limit of one episode (``None``: none).
    """

    is_host_env = True

    def __init__(self, factory: Callable[[], Any], name: str, env_id: str | None = None,
                 episode_seconds: float | None = None):
        gymnasium = import_gymnasium()
        if env_id is None and _rebuilds_another(name):  # the name would rebuild another env: mark it
            name += INSTANCE_SUFFIX
        self.factory, self.name, self.env_id, self.episode_seconds = factory, name, env_id, episode_seconds
        try:
            probe = self.make()
        except missing_package_errors() as err:  # a registered id whose package is missing (LunarLander needs Box2D)
            if not is_missing_package(err):
                raise
            raise missing_package(name, err) from err
        except TypeError as err:
            if not inspect.isclass(factory):  # a factory's own error is its own
                raise
            raise TypeError(f"could not build env {name!r} with no arguments ({err}): jes builds one env per episode "
                            f"slot; pass jes.envs.gymnasium.make(lambda: YourEnv(...)) with the arguments") from err
        try:  # (refused, the probe is closed: a vector env's worker processes, an EnvPool's threads)
            _refuse_vector_env(probe, f"env factory for {name!r} returned", gymnasium)
            if not isinstance(probe, gymnasium.Env):
                raise TypeError(f"env factory for {name!r} returned {type(probe).__name__}, not a gymnasium.Env")
            missing = [a for a in ("observation_space", "action_space") if getattr(probe, a, None) is None]
            if missing:
                raise TypeError(f"env {name!r} has no {' or '.join(missing)}: a gymnasium.Env sets both in its "
                                f"constructor (gymnasium.spaces.Box / Discrete ...)")
        except BaseException:
            try:
                probe.close()
            except Exception:  # noqa: BLE001 - closing is best effort; the refusal is the news
                pass
            raise
        self.observation_space, self.action_space = probe.observation_space, probe.action_space
        self.spec_max_steps = getattr(getattr(probe, "spec", None), "max_episode_steps", None)
        self.reward_threshold = getattr(getattr(probe, "spec", None), "reward_threshold", None)
        registered = gymnasium.registry.get(getattr(getattr(probe, "spec", None), "id", None))
        # the limit the threshold was set for: the registered id's, whatever time limit this env was made with
        self.threshold_steps = registered.max_episode_steps if registered is not None else self.spec_max_steps
        spaces = gymnasium.spaces
        space = self.observation_space
        if isinstance(space, spaces.Box):
            self.obs_shape = tuple(int(d) for d in space.shape)
            self._flatten = None
        elif isinstance(space, (spaces.Dict, spaces.Tuple, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
            try:
                self.obs_shape = (int(spaces.flatdim(space)),)
            except (ValueError, TypeError, NotImplementedError) as err:  # a Sequence or Graph inside: no fixed size
                raise ValueError(f"env {name!r} has observation space {space}, which does not flatten to a fixed size "
                                 f"({err}); jes takes Box, Discrete, MultiDiscrete, MultiBinary and Dict/Tuple of "
                                 f"those") from err
            indices = _index_check(space)  # flatten's one-hot takes -1 as the last cell, silently
            self._flatten = ((lambda obs: spaces.flatten(space, obs)) if indices is None else
                             (lambda obs: spaces.flatten(space, indices(obs))))
        else:
            raise ValueError(f"env {name!r} has observation space {type(space).__name__}; jes takes Box, Discrete, "
                             f"MultiDiscrete, MultiBinary and Dict/Tuple of those (flattened)")
        action = self.action_space
        if isinstance(action, spaces.Discrete):
            self.discrete, self.action_shape, self.num_outputs = True, (), int(action.n)
            self._start = int(action.start)
        elif isinstance(action, spaces.Box):
            self.discrete, self.action_shape = False, tuple(int(d) for d in action.shape)
            self.num_outputs = int(np.prod(self.action_shape)) if self.action_shape else 1
            self._dtype = action.dtype
            if np.dtype(action.dtype).kind in "iub" and not (np.all(np.abs(action.low.astype(np.float64)) <= 2 ** 24)
                                                            and np.all(np.abs(action.high.astype(np.float64)) <= 2 ** 24)):
                raise ValueError(f"env {name!r} has an integer Box action space {action} whose bounds are beyond "
                                 f"+-2**24 (16,777,216), which jes's float32 actions cannot hold exactly (an unbounded "
                                 f"integer Box is one of its dtype's extreme values); give it finite bounds that fit")
        else:
            raise ValueError(f"env {name!r} has action space {type(action).__name__}; jes supports Discrete and Box "
                             f"action spaces")
        probe.close()

    def make(self) -> Any:
        """A fresh env instance."""
        return self.factory()

    @property
    def flattens(self) -> bool:
        """Whether :meth:`observation` flattens the env's observations (a Dict, Tuple, Discrete, MultiDiscrete or
        MultiBinary space: ``gymnasium.spaces.flatten``), rather than taking a Box's array as it is."""
        return self._flatten is not None

    def observation(self, obs: Any) -> np.ndarray:
        """One observation as the policy's flat float32 array of :attr:`obs_shape`."""
        if self._flatten is not None:
            obs = self._flatten(obs)
        elif np.shape(obs) != self.obs_shape and _squeezed(np.shape(obs)) != _squeezed(self.obs_shape):
            # (a reshape took any array of its size: a (2, 3) for a (3, 2) space, scrambling a conv policy's input
            # silently; size-1 axes aside, as a (4, 1) for a (4,) space or a number for a (1,) one, which keep the order)
            raise ValueError(f"the observation's shape is {np.shape(obs)}, the observation_space's "
                             f"{self.obs_shape} ({self.observation_space}): return arrays of the space's shape, or "
                             f"declare the shape it returns")
        with np.errstate(over="ignore", invalid="ignore"):  # said below, naming the values
            out = np.asarray(obs, np.float32).reshape(self.obs_shape)
        if not np.isfinite(out).all():
            bad = np.flatnonzero(~np.isfinite(out.reshape(-1)))
            raw = np.asarray(obs, np.float64).reshape(-1)[bad[:5]]
            raise ValueError(f"the observation is not finite as float32, the policy's input: index(es) "
                             f"{bad[:5].tolist()} hold {raw.tolist()} (float32 holds magnitudes up to 3.4e38; jes "
                             f"normalises observations only after this cast). Scale the observation in your env or "
                             f"a gymnasium.ObservationWrapper, or end the episode before it overflows")
        return out

    def action_finish(self) -> tuple[int, str]:
        """What :meth:`env_action` adds to the policy's action: ``(start, integer)``, a Discrete space's ``start``
        (else 0) and an integer Box's dtype name (rounded to the nearest within its bounds; else ``""``)."""
        if self.discrete:
            return self._start, ""
        return 0, np.dtype(self._dtype).name if np.dtype(self._dtype).kind in "iub" else ""

    def env_action(self, action: np.ndarray) -> Any:
        """One policy action (numpy) as the env takes it."""
        if self.discrete:
            return int(action) + self._start
        action = np.asarray(action).reshape(self.action_shape)
        if np.dtype(self._dtype).kind in "iub":  # an integer Box: the nearest integer within the bounds, not truncation
            space = self.action_space
            action = np.clip(np.rint(action), space.low, space.high)
        return action.astype(self._dtype)

    def spec(self, max_steps: int | None) -> EnvSpec:
        """This env described as an :class:`EnvSpec` (``params`` is ``None``: nothing is compiled)."""
        limit = max_steps if max_steps is not None else self.spec_max_steps
        if limit is None:
            raise ValueError(f"env {self.name!r} has no episode limit (no TimeLimit / spec.max_episode_steps); pass "
                             f"max_episode_steps=... to jes.train")
        if int(limit) <= 0:
            raise ValueError(f"max_episode_steps must be positive, got {limit}")
        low = high = None
        if not self.discrete:
            low = np.broadcast_to(np.asarray(self.action_space.low, np.float32), self.action_shape).copy()
            high = np.broadcast_to(np.asarray(self.action_space.high, np.float32), self.action_shape).copy()
        return EnvSpec(env=self, params=None, name=self.name, obs_shape=self.obs_shape, num_outputs=self.num_outputs,
                       discrete=self.discrete, action_shape=self.action_shape, action_low=low, action_high=high,
                       max_steps=int(limit),
                       solved_return=self._solved_return(int(limit)))

    def _solved_return(self, limit: int) -> float | None:
        """The spec's ``reward_threshold``, at the spec's own episode limit only (with fewer steps a failing
        policy can score above a threshold of negative rewards; with more it is another task)."""
        if self.reward_threshold is None or (self.threshold_steps is not None and limit != int(self.threshold_steps)):
            return None
        return float(self.reward_threshold)


def _from_id(name: str, max_steps: int | None, render_mode: str | None = None) -> GymnasiumEnv:
    base, seconds = split_option(name, TIME_OPTION)
    if "?" in base:
        if split_option(base, "keep_obs")[1] is not None:
            raise ValueError(f"env {name!r}: keep_obs {NOT_MASKED}")
        raise ValueError(f"unknown option in env name {name!r}; gymnasium envs take only ?{TIME_OPTION}=60. To give "
                         f"an env constructor arguments, make it yourself in this process (gymnasium.make(id, key=value) "
                         f"as the env), or register an id that holds them (gymnasium.register(id=..., entry_point=..., "
                         f"kwargs={{...}}) in a module of yours) for workers and the command line (--import MODULE)")
    env_id = base[len(PREFIX):]
    if not env_id or ":" in env_id:
        raise ValueError(f"env name {name!r}: write a registered Gymnasium id, e.g. 'gymnasium:CartPole-v1'. Ids "
                         f"with a 'module:' prefix (which import a module) are refused: import your module so that "
                         f"it registers the env, then pass 'gymnasium:YourEnv-v0'")
    try:
        limit = None if seconds is None else float(seconds)
    except ValueError:
        raise ValueError(f"bad {TIME_OPTION}={seconds!r} in env name {name!r}; write seconds like "
                         f"{TIME_OPTION}=60") from None
    if limit is not None and not (limit > 0 and math.isfinite(limit)):
        raise ValueError(f"{TIME_OPTION} must be a positive, finite number of seconds, got {seconds!r} in {name!r}")
    gymnasium = import_gymnasium()
    if env_id not in gymnasium.registry:
        close = [k for k in gymnasium.registry if k.split("-")[0].lower() == env_id.split("-")[0].lower()]
        raise ValueError(f"unknown Gymnasium id {env_id!r} in {name!r}" + (f"; did you mean {close}?" if close else
                         "; see gymnasium.pprint_registry()") + " (an env outside gymnasium needs its package installed "
                         f"and imported, {IMPORT_HINT})")
    kwargs: dict = {"disable_env_checker": True}
    if max_steps is not None:
        kwargs["max_episode_steps"] = int(max_steps)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    return GymnasiumEnv(lambda: gymnasium.make(env_id, **kwargs), name, env_id=env_id, episode_seconds=limit)


def missing_package_errors() -> tuple[type, ...]:
    """What building or drawing a Gymnasium env raises for a package that is not installed: ``ImportError``
    (GymV26Environment-v0 without shimmy, MuJoCo's imageio), and Gymnasium's own ``DependencyNotInstalled`` (Box2D
    for LunarLander, pygame for CartPole's frames), which is not an ``ImportError``. Whether one of them is a missing
    package: :func:`is_missing_package`."""
    return ImportError, import_gymnasium().error.DependencyNotInstalled


def is_missing_package(err: Exception) -> bool:
    """Whether ``err`` (one of :func:`missing_package_errors`) says a package is not installed, rather than being the
    env's own error: an ``ImportError`` of a module that was found (a name it lacks, a native library that fails to
    load: its ``path`` is set) is the env's bug or setup, which "install it" would not fix."""
    return not isinstance(err, ImportError) or isinstance(err, ModuleNotFoundError) or err.path is None


def missing_package(name: str, err: Exception) -> ImportError:
    """An ``ImportError`` naming the env and the package that building it could not import (``err``: one of
    :func:`missing_package_errors`; Gymnasium's ``DependencyNotInstalled`` says how to install it, and the
    ``ImportError`` it was raised from names the package)."""
    cause = err if isinstance(err, ImportError) else err.__cause__
    module = cause.name if isinstance(cause, ImportError) else None
    if module:
        package = module.split(".")[0]
        return ImportError(f"Gymnasium env {name!r} needs the package {package!r}, which is not installed here "
                           f"({err}); install it (on every worker too)", name=module)
    return ImportError(f"Gymnasium env {name!r} needs a package that is not installed here: {err}; install it (on "
                       f"every worker too)")


def entry_point_module(env_id: str) -> str | None:
    """The module of a registered Gymnasium id's entry point (``"__main__"`` for a class or function of a script or
    notebook), ``None`` for an unregistered id."""
    spec = import_gymnasium().registry.get(env_id)
    entry = getattr(spec, "entry_point", None)
    return entry.partition(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", None)


def registering_module(env_id: str) -> str | None:
    """The module of the user's own behind a registered Gymnasium id (its entry point's), which a worker process
    imports to have the id registered too (``jes-worker --import``); ``None`` for Gymnasium's own ids and entry
    points defined in ``__main__``."""
    module = entry_point_module(env_id)
    if not module or module == "__main__" or module.split(".")[0] == "gymnasium" or module not in sys.modules:
        return None
    return module


# How a program imports the module registering a user's Gymnasium id (`jes eval` says its own flag instead: jes.cli)
IMPORT_HINT = "on every worker too: jes train --import MODULE, jes-worker --import MODULE"

# Why jes's observation masking (keep_obs, jes.envs.mask_observations) refuses a Gymnasium env.
NOT_MASKED = ("masks the observations of JAX envs (gymnax, brax); a Gymnasium env masks its own with a wrapper of "
              "yours, passed as an instance or through jes.envs.gymnasium.make(factory)")

# Names an env instance that is not its registered id's plain env: no env name resolves to it (a checkpoint or policy
# file of it is evaluated or resumed with the env passed again), so it is never rebuilt as another env.
INSTANCE_SUFFIX = " (a gymnasium.Env instance)"
# Name an env class or factory of one's own the same way (no name rebuilds them either), after its module-qualified
# name, so that files of different classes or factories do not pass for each other.
CLASS_SUFFIX = " (a gymnasium.Env class)"
FACTORY_SUFFIX = " (a gymnasium.Env factory)"


def factory_name(factory: Any) -> str:
    """The name of an env class or factory of one's own: ``"mypkg.envs.Corridor (a gymnasium.Env class)"``,
    ``"mypkg.envs.make_env (a gymnasium.Env factory)"``; a lambda's (whose qualified name says only ``<lambda>``)
    adds the first line of its code, ``"__main__.<lambda>:12 (a gymnasium.Env factory)"``, so that lambdas written in
    different places differ (two on one line do not). A callable object without a name of its own (a
    ``functools.partial``) is named after its type."""
    named = factory if hasattr(factory, "__qualname__") else type(factory)
    name = f"{getattr(named, '__module__', None) or '<unknown>'}.{named.__qualname__}"
    code = getattr(factory, "__code__", None)
    if "<lambda>" in named.__qualname__ and code is not None:
        name += f":{code.co_firstlineno}"
    return name + (CLASS_SUFFIX if inspect.isclass(factory) else FACTORY_SUFFIX)


def legacy_factory_name(name: str) -> str | None:
    """The name jes recorded before it named them by module and qualified name for the class, factory or instance of
    a class of one's own that ``name`` names (a class's or factory's ``__name__``: ``"Corridor"``, ``"<lambda>"``; an
    instance's class's with :data:`INSTANCE_SUFFIX`), ``None`` when ``name`` names none of them."""
    for suffix in (CLASS_SUFFIX, FACTORY_SUFFIX):
        if name.endswith(suffix):
            return name.removesuffix(suffix).rpartition(".")[2].partition(":")[0]
    label = name.removesuffix(INSTANCE_SUFFIX)
    if label != name and "." in label and ":" not in label:  # (a registered id's instance keeps its id: "CartPole-v1")
        return label.rpartition(".")[2] + INSTANCE_SUFFIX
    return None


def _registered_id(env: Any, gymnasium: Any) -> str | None:
    """The registered id an env instance is the plain env of (``gymnasium.make(id)``: the id's own keyword arguments,
    time limit and no wrappers of its own; a render mode aside), else ``None``. Gymnasium ids name gymnax envs too
    (``"CartPole-v1"``), so an instance is never named by its bare id."""
    spec = getattr(env, "spec", None)
    env_id = getattr(spec, "id", None)
    if not isinstance(env_id, str) or env_id not in gymnasium.registry:
        return None
    registered = gymnasium.registry[env_id]
    try:
        kwargs = {k: v for k, v in (spec.kwargs or {}).items() if k != "render_mode"}
        if (kwargs != {k: v for k, v in (registered.kwargs or {}).items() if k != "render_mode"}
                or spec.max_episode_steps != registered.max_episode_steps
                or tuple(getattr(spec, "additional_wrappers", ()) or ()) or spec.entry_point != registered.entry_point):
            return None
        # Attributes set after make() (env.unwrapped.length = 5.0) are not in its spec: the plain values of a fresh
        # env's must be the instance's too
        fresh = gymnasium.make(env_id, disable_env_checker=True)
        try:
            ours, theirs = _plain_attributes(env.unwrapped), _plain_attributes(fresh.unwrapped)
        finally:
            fresh.close()
        return env_id if ours == theirs else None
    except Exception:  # noqa: BLE001 - kwargs that do not compare (arrays), an env that fails to make: an instance
        return None


def _rebuilds_another(name: str) -> bool:
    """Whether :func:`jes.envs.make_env` would build an env from ``name`` (a gymnax id, ``gymnasium:<id>``, a brax
    name): a user's factory named so must not be recorded by it."""
    base = name.partition("?")[0]
    if name.endswith((CLASS_SUFFIX, FACTORY_SUFFIX)):
        return False
    if base.startswith(PREFIX) or base.startswith("brax/") or name.endswith(INSTANCE_SUFFIX):
        return not name.endswith(INSTANCE_SUFFIX)
    return base in gymnax_env_names()


def _plain_attributes(env: Any) -> dict:
    """An env's settings: its public attributes of plain types (numbers, strings, booleans, None), the render mode
    aside (it draws, it does not step), and a MuJoCo env's model (``model.opt.gravity``, body masses...) as the bytes
    of its numeric arrays."""
    plain = {k: v for k, v in vars(env).items()
             if not k.startswith("_") and k != "render_mode" and (v is None or isinstance(v, (bool, int, float, str)))}
    model = vars(env).get("model")
    if model is not None and type(model).__module__.split(".")[0] == "mujoco":
        plain["model"] = _model_arrays(model)
    return plain


def _model_arrays(model: Any) -> dict:
    """A MuJoCo model's numeric arrays (its own and its ``opt``'s), as bytes, by name."""
    arrays = {}
    for owner, prefix in ((model, ""), (getattr(model, "opt", None), "opt.")):
        for attr in dir(owner) if owner is not None else ():
            if attr.startswith("_"):
                continue
            try:
                value = getattr(owner, attr)
            except Exception:  # noqa: BLE001 - properties that cannot be read are not settings
                continue
            if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
                arrays[prefix + attr] = (value.shape, value.dtype.str, value.tobytes())
    return arrays


def _copier(template: Any) -> Callable[[], Any]:
    """A factory of deep copies of ``template`` that keep what was set on it after ``make``: an env built by
    ``EzPickle`` (Gymnasium's MuJoCo and Box2D envs) is otherwise copied by calling its constructor again, which
    drops a changed model or attribute."""
    gymnasium = import_gymnasium()
    ez = getattr(getattr(gymnasium, "utils", None), "EzPickle", None)

    def clone() -> Any:
        memo: dict = {}
        layer, seen = template, set()
        while layer is not None and id(layer) not in seen:  # the wrappers, then the env inside them
            seen.add(id(layer))
            if ez is not None and isinstance(layer, ez):
                twin = object.__new__(type(layer))
                memo[id(layer)] = twin
                twin.__dict__.update(copy.deepcopy(layer.__dict__, memo))
            layer = getattr(layer, "env", None)
        return copy.deepcopy(template, memo)

    advice = "pass jes.envs.gymnasium.make(factory) with a zero-argument function that builds a fresh env"
    try:
        clone()
        return clone
    except Exception as err:  # noqa: BLE001 - locks, sockets, C handles (a Box2D world, EnvPool)
        failure = err
    # An EzPickle env whose state cannot be copied (a Box2D world): copies by its constructor arguments, as deepcopy
    # makes them, are the instance itself only when nothing was set on it after make()
    try:
        rebuilt = copy.deepcopy(template)
    except Exception as err:  # noqa: BLE001
        raise TypeError(f"jes copies an env instance for each episode slot, and this {type(template).__name__} cannot "
                        f"be copied ({type(err).__name__}: {err}); {advice}") from err
    # the settings its constructor sets (a reset or a step adds and moves episode state, which copies need not keep)
    ours, theirs = _plain_attributes(template.unwrapped), _plain_attributes(rebuilt.unwrapped)
    changed = sorted(k for k in theirs if ours.get(k) != theirs[k])
    if changed:
        raise TypeError(f"jes copies an env instance for each episode slot; this {type(template).__name__} copies only "
                        f"by its constructor arguments ({type(failure).__name__}: {failure}), which drop what was set "
                        f"after make() ({', '.join(changed)}): give those as arguments (gymnasium.make(id, ...=...)), "
                        f"or {advice}")
    return lambda: copy.deepcopy(template)


def _squeezed(shape: tuple) -> tuple:
    return tuple(d for d in shape if d != 1)


def _refuse_vector_env(env: Any, what: str, gymnasium: Any) -> None:
    """Refuse a vector env (EnvPool's, ``gymnasium.make_vec``'s): a batch of envs stepped and seeded as a pool, which
    jes's per-slot host rollout cannot use (EnvPool's failed deep in a step, after ignoring each episode's seed)."""
    vector = getattr(getattr(gymnasium, "vector", None), "VectorEnv", None)
    layers, layer = [], env
    while layer is not None and len(layers) < 64 and all(layer is not seen for seen in layers):  # through wrappers
        layers.append(layer)
        layer = getattr(layer, "env", None)
    for env in layers:
        envpool = any(c.__module__.split(".")[0] == "envpool" for c in type(env).__mro__)
        if envpool or (vector is not None and isinstance(env, vector)):
            break
    else:
        return
    kind = "an EnvPool pool" if envpool else "a vector env (gymnasium.make_vec / a VectorEnv)"
    raise TypeError(f"{what} {type(env).__name__}, {kind} of {getattr(env, 'num_envs', '?')} env(s) stepped and "
                    f"seeded together: jes steps one gymnasium.Env per episode slot and seeds each episode from its "
                    f"key (reset(seed=...), which a pool ignores), batching the policy itself. Pass the single env: "
                    f"its id ('gymnasium:CartPole-v1'), its class, or a factory of one env")


def make(env: Any, max_steps: int | None = None, render_mode: str | None = None) -> GymnasiumEnv:
    """A :class:`GymnasiumEnv` for a ``gymnasium:`` id, an env instance, an env class or a factory.

    Raises:
        ImportError: gymnasium is not installed (the message names the extra), or a registered id's package is not
            (the message names the env and the package).
        ValueError: an unknown id or an unsupported space.
    """
    if isinstance(env, GymnasiumEnv):
        return env
    if isinstance(env, str):
        return _from_id(env, max_steps, render_mode)
    gymnasium = import_gymnasium()
    _refuse_vector_env(env, "env", gymnasium)
    if isinstance(env, gymnasium.Env):
        env_id = _registered_id(env, gymnasium)
        if env_id is not None:  # as gymnasium.make(id) makes it: the id's env, named (and rebuilt) by the id
            return _from_id(PREFIX + env_id, max_steps, render_mode)
        template = env
        # an instance of a class of one's own by the class's module and qualified name, as the class itself is named
        # (by its bare name, mypkg.envs.Corridor() and otherpkg.envs.Corridor() resumed each other's checkpoints)
        own = type(env.unwrapped)
        label = getattr(getattr(env, "spec", None), "id", None) or f"{own.__module__}.{own.__qualname__}"
        return GymnasiumEnv(_copier(template), label + INSTANCE_SUFFIX)
    if callable(env):
        return GymnasiumEnv(env, factory_name(env))
    raise TypeError(f"not a Gymnasium env: {type(env).__name__}")
