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
comparison, kept in CHANGELOG.md); ``swimmer`` only has ``generalized``. ``spring`` is brax's cheapest, least accurate physics; for results
comparable with MuJoCo on a GPU ask for ``?backend=mjx`` (or ``generalized``). The backend is
part of the env's name, so checkpoints and distributed runs carry it.

The ``brax`` package is imported only here, and only when a brax env is asked for.
"""
from __future__ import annotations

import contextlib
import io
import sys
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jes.lazy_gymnax import import_gymnax

PREFIX = "brax/"
INSTALL_HINT = "pip install 'jax-jes[brax]'"
DEFAULT_MAX_STEPS = 1000
# Envs whose default backend is not spring (spring unsupported).
DEFAULT_BACKENDS = {"swimmer": "generalized"}
FALLBACK_BACKEND = "spring"
# Fractions of the per-step maximum that count as solved (Gym's InvertedPendulum: 950 of 1000).
SOLVED_FRACTIONS = {"inverted_pendulum": 0.95}


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


@struct.dataclass
class BraxParams:
    """Env params of a brax env as jes sees it: only the episode limit (brax envs carry their own)."""

    max_steps_in_episode: int = DEFAULT_MAX_STEPS


class BraxEnv:
    """A raw brax env behind the gymnax protocol (``reset_env``/``step_env``/spaces).

    Args:
        env: a raw brax env (``brax.envs.get_environment(...)``, not ``brax.envs.create``).
        name: the canonical name (``brax/<name>?backend=...``); derived from the env's class
            when ``None``.
    """

    def __init__(self, env: Any, name: str | None = None):
        wrapped = type(env).__name__
        if wrapped in ("EpisodeWrapper", "AutoResetWrapper", "VmapWrapper", "DomainRandomizationVmapWrapper"):
            raise TypeError(f"pass a raw brax env (brax.envs.get_environment(...)), not one from brax.envs.create() "
                            f"(it is wrapped in {wrapped}): jes limits episodes and masks finished ones itself")
        self.env = env
        self.backend = getattr(env, "backend", None)
        self.name = name or self._name_from_class(env)
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

    def _name_from_class(self, env: Any) -> str:
        registry = _import_brax_envs()._envs
        names = [n for n, cls in registry.items() if type(env) is cls]
        base = names[0] if names else type(env).__name__
        return canonical_name(base, {"backend": self.backend} if self.backend else {})

    @property
    def default_params(self) -> BraxParams:
        return BraxParams()

    def solved_return(self, max_steps: int) -> float | None:
        base = self.name[len(PREFIX):].split("?")[0]
        fraction = SOLVED_FRACTIONS.get(base)
        return None if fraction is None else fraction * max_steps

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
    """A :class:`BraxEnv` for ``"brax/<name>[?backend=...&<constructor kwarg>=...]"``.

    Raises:
        ImportError: brax is not installed (the message names the extra to install).
        ValueError: unknown brax env (the message lists the valid ones) or a bad option.
    """
    if not name.startswith(PREFIX):
        raise ValueError(f"brax env names start with {PREFIX!r}, got {name!r}")
    base, _, query = name[len(PREFIX):].partition("?")
    options: dict[str, Any] = {}
    for item in filter(None, query.split("&")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"bad option {item!r} in env name {name!r}; write key=value, e.g. 'brax/hopper?backend=spring'")
        options[key] = _parse_value(value)
    envs = _import_brax_envs()
    if base not in envs._envs:
        raise ValueError(f"unknown brax env {base!r}; valid brax env names are: "
                         f"{', '.join(PREFIX + n for n in sorted(envs._envs))}")
    if base != "fast":   # brax's toy env has no physics backend
        options.setdefault("backend", default_backend(base))
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Brax System, piplines and environments are not actively")
            env = envs.get_environment(base, **options)
    except (TypeError, ValueError) as err:
        raise ValueError(f"brax env {base!r} rejected options {options}: {err} "
                         f"(backends: spring, positional, generalized, mjx)") from err
    return BraxEnv(env, canonical_name(base, options))
