"""Pictures of what a policy does: one episode as a GIF (gymnax, Gymnasium) or HTML (brax).

:func:`render` draws a run's centre policy (a trainer and a state, from a result or a checkpoint);
:func:`render_policy` any policy given as its env, functions, parameters and normaliser
(``TrainedPolicy.render``, so a saved ``.policy`` file too). The same key gives the same frames.

* CartPole and Pendulum (also with masked observations) are drawn with Pillow, frame by frame.
* Other gymnax envs have no drawing yet (gymnax's own matplotlib visualiser failed on Acrobot here).
* brax envs render to brax's interactive HTML viewer (``.html``); images of brax scenes need an
  OpenGL context this library does not assume.
* Gymnasium envs (host envs) draw themselves: the env is made with ``render_mode="rgb_array"`` and its
  frames become the GIF (CartPole needs pygame, ``pip install "gymnasium[classic-control]"``; MuJoCo
  envs an OpenGL context, e.g. ``MUJOCO_GL=egl``).

The episode runs in one compiled ``lax.scan`` (the same keys and done rule as training rollouts);
drawing happens on the host afterwards. Outputs are written atomically (a temporary file beside the target, then
``os.replace``), so a Ctrl-C or an error while writing leaves the file that was there. A Gymnasium episode is stepped on the host, reset with the seed its
episode key gives in training (:func:`jes.host_rollout.episode_seeds`).
"""
from __future__ import annotations

import inspect
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jes import host_rollout
from jes.arrays import as_key
from jes.atomic import check_writable, write_atomically
from jes.envs import gymnasium as gymnasium_family
from jes.envs.brax import BraxEnv
from jes.envs.spec import EnvSpec
from jes.envs.wrappers import MaskedObservations
from jes.policies import PolicyFns
from jes.rollout import normalise

VIZ_HINT = "pip install 'jax-jes[viz]'"
FRAME_SIZE = (400, 300)


def record_episode(spec: EnvSpec, fns: PolicyFns, params: Any, obs_scale: tuple[jax.Array, jax.Array] | None,
                   key: jax.Array, max_steps: int | None = None,
                   action_fn: Callable | None = None) -> tuple[Any, np.ndarray, int]:
    """Run one episode of a policy on a gymnax or brax env, in one compiled ``lax.scan``.

    Args:
        spec: the env (:class:`jes.EnvSpec`).
        fns: the policy's functions (``apply(params, carry, obs) -> (carry, outputs)`` and ``initial_carry()``).
        params: the policy's (unflattened) variables, e.g. ``trainer.unravel(state.params)``.
        obs_scale: ``(mean, 1 / std)`` observations are normalised with (``trainer.obs_scale(state)``), or ``None``.
        key: the episode key (reset from ``fold_in(key, 0)``, step ``t`` from ``fold_in(key, t + 1)``).
        max_steps: steps to record at most (default: the spec's episode limit).
        action_fn: one policy output -> one env action (default ``spec.action``; a :class:`jes.trained.ActionMap`
            gives the same bits).

    Returns:
        ``(env_states, rewards, length)``: env states stacked over time ``[T + 1, ...]`` (the reset
        state first), rewards ``[T]``, and the episode's real length ``<= T`` (steps up to and
        including the one that ended it).
    """
    steps = int(max_steps or spec.max_steps)
    action_fn = spec.action if action_fn is None else action_fn

    @jax.jit
    def episode(params, obs_scale, key):
        obs, env_state = spec.env.reset_env(jax.random.fold_in(key, 0), spec.params)

        def step(carry, t):
            obs, env_state, policy_carry, done = carry
            policy_carry, out = fns.apply(params, policy_carry, normalise(obs, obs_scale))
            new_obs, new_state, reward, terminated, _ = spec.env.step_env(
                jax.random.fold_in(key, t + 1), env_state, action_fn(out), spec.params)
            now_done = done | spec.done_after(terminated, new_state)
            return (new_obs, new_state, policy_carry, now_done), (new_state, jnp.where(done, 0.0, reward), done)

        init = (obs, env_state, fns.initial_carry(), jnp.array(False))
        _, (states, rewards, was_done) = jax.lax.scan(step, init, jnp.arange(steps))
        states = jax.tree.map(lambda first, rest: jnp.concatenate([jnp.asarray(first, rest.dtype)[None], rest]), env_state, states)
        return states, rewards, jnp.sum(~was_done)

    states, rewards, length = episode(params, obs_scale, key)
    return jax.device_get(states), np.asarray(rewards), int(length)


def _rgb_array_env(spec: EnvSpec) -> Any:
    """A new instance of the Gymnasium env of ``spec`` that renders ``rgb_array`` frames: rebuilt from its id with
    that ``render_mode``, a class of the user's that takes ``render_mode`` made with it, a factory's env as it
    comes. Raises ``ValueError`` (the instance closed) where it does not render that way."""
    host_env = spec.env
    advice = "jes draws a Gymnasium env from its render_mode='rgb_array' frames"
    if host_env.env_id is not None:
        try:
            instance = gymnasium_family.make(spec.name, spec.max_steps, render_mode="rgb_array").make()
        except TypeError as err:  # gymnasium.make passes render_mode to a constructor that takes none
            if "render_mode" not in str(err):
                raise
            raise ValueError(f"env {spec.name!r} cannot be made with render_mode='rgb_array' (its constructor takes "
                             f"no render_mode); {advice}: give your env a render_mode argument and an rgb_array "
                             f"render()") from err
    elif isinstance(host_env.factory, type) and "render_mode" in _parameters(host_env.factory):
        instance = host_env.factory(render_mode="rgb_array")  # an env class of the Gymnasium convention
    else:
        instance = host_env.make()
    if getattr(instance, "render_mode", None) != "rgb_array":
        instance.close()
        raise ValueError(f"env {spec.name!r} renders with render_mode={getattr(instance, 'render_mode', None)!r}; "
                         f"{advice}: make your env with it and draw with it, e.g. result.trained_policy().render(path, "
                         f"env=YourEnv(render_mode='rgb_array')) (a loaded policy: policy.render(path, env=...))")
    return instance


def record_host_episode(spec: EnvSpec, fns: PolicyFns, params: Any, obs_scale: tuple[jax.Array, jax.Array] | None,
                        key: jax.Array, max_steps: int | None = None,
                        action_fn: Callable | None = None) -> tuple[list, float]:
    """One episode of a Gymnasium env, drawn by the env itself: ``(frames, fps)``, frames ``[H, W, 3]`` uint8.

    The env is rebuilt from its id with ``render_mode="rgb_array"``, a class of the user's that takes
    ``render_mode`` is made with it, and a factory's env must already render that way. Reset with the seed of episode key ``key`` (as training seeds its episodes). The
    arguments are :func:`record_episode`'s.

    Raises:
        ValueError: the env does not render to ``rgb_array`` (or cannot be made with that ``render_mode``).
        ImportError: the env's drawing needs a package that is not installed (the message names it).
    """
    instance = _rgb_array_env(spec)
    host_env = spec.env
    params = jax.tree.map(lambda x: x[None], params)
    step = jax.jit(lambda c, o: host_rollout.policy_step(fns.apply, spec, params, c, o, obs_scale, action_fn))
    seed = host_rollout.seed_of(np.asarray(host_rollout.episode_seeds(key[None]))[0])
    carry = jax.tree.map(lambda c: c[None], fns.initial_carry())
    try:
        obs, _ = instance.reset(seed=seed)
        frames = [instance.render()]
        for _ in range(int(max_steps or spec.max_steps)):
            carry, action, _ = step(carry, host_env.observation(obs)[None])
            obs, _, terminated, truncated, _ = instance.step(host_env.env_action(np.asarray(action)[0]))
            frames.append(instance.render())
            if terminated or truncated:
                break
        fps = float((getattr(instance, "metadata", None) or {}).get("render_fps") or 30)
    except gymnasium_family.missing_package_errors() as err:  # its render() imports what draws it (CartPole: pygame)
        if not gymnasium_family.is_missing_package(err):
            raise
        raise gymnasium_family.missing_package(spec.name, err) from err
    finally:
        instance.close()
    return frames, fps


def _parameters(cls: type) -> Any:
    """The parameters ``cls(...)`` takes (none known where Python cannot say)."""
    try:
        return inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return {}


def _unwrap(env: Any) -> Any:
    while isinstance(env, MaskedObservations):
        env = env.env
    return env


def render(trainer: Any, state: Any, path: str, key: Any = 0, max_steps: int | None = None) -> str:
    """Render one episode of the centre policy to ``path`` (``.gif`` for gymnax envs, ``.html`` for brax).

    A saved policy (``jes.load_policy``, ``result.trained_policy()``) draws the same frames with
    :meth:`jes.trained.TrainedPolicy.render`.

    Args:
        trainer, state: a trainer and a training state (``result.trainer``, ``result.state``;
            or ``jes.checkpoint.load(path)[:2]``).
        path: output file; its suffix picks the format.
        key: an int seed or a PRNG key for the episode.
        max_steps: steps to show at most (default: the env's episode limit).

    Returns:
        ``path``.

    Raises:
        ValueError: a format the env cannot be rendered to (the message names the one that works).
        OSError: ``path`` cannot be written (its folder is a file or takes no new file), found before the episode.
        ImportError: Pillow / matplotlib missing (the message names the extra to install).
    """
    key = _check_request(trainer.spec, path, key, max_steps)
    return _draw(trainer.spec, trainer.fns, trainer.unravel(state.params), trainer.obs_scale(state), path, key,
                 max_steps)


def render_policy(spec: EnvSpec, fns: PolicyFns, params: Any, obs_scale: tuple[jax.Array, jax.Array] | None,
                  path: str, key: Any = 0, max_steps: int | None = None, action_fn: Callable | None = None) -> str:
    """Render one episode of any policy to ``path``, given what :func:`render` takes from a trainer and a state.

    ``TrainedPolicy.render`` calls it; with the values of the same state, the same key gives :func:`render`'s bytes.

    Args:
        spec: the env (:class:`jes.EnvSpec`).
        fns: the policy's functions (``apply(params, carry, obs) -> (carry, outputs)`` and ``initial_carry()``).
        params: the policy's (unflattened) variables.
        obs_scale: ``(mean, 1 / std)`` observations are normalised with, or ``None``.
        path: output file; its suffix picks the format.
        key: an int seed or a PRNG key for the episode.
        max_steps: steps to show at most (default: the env's episode limit).
        action_fn: one policy output -> one env action (default ``spec.action``).

    Returns:
        ``path``.

    Raises:
        ValueError, OSError, ImportError: as :func:`render`, before the episode where they can be.
    """
    key = _check_request(spec, path, key, max_steps)
    return _draw(spec, fns, params, obs_scale, path, key, max_steps, action_fn)


def _check_request(spec: EnvSpec, path: str, key: Any, max_steps: int | None) -> jax.Array:
    """The episode key of ``key``, after refusing a bad ``key``, ``max_steps`` or ``path`` (before any episode)."""
    key = as_key(key)
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer))
                                  or max_steps < 1):
        raise ValueError(f"max_steps must be a positive number of steps (or None: the env's episode limit), got "
                         f"{max_steps!r}")
    check_render_path(spec, path)
    return key


def _draw(spec: EnvSpec, fns: PolicyFns, params: Any, obs_scale: Any, path: str, key: jax.Array,
          max_steps: int | None, action_fn: Callable | None = None) -> str:
    """Record one episode and write it to ``path`` in the format the env's kind takes (checked already)."""
    if spec.host:
        frames, fps = record_host_episode(spec, fns, params, obs_scale, key, max_steps, action_fn)
        Image, _ = _pil()
        _save_gif([Image.fromarray(np.asarray(f, np.uint8)) for f in frames], path, duration_ms=int(1000 / fps))
        return path
    base_env = _unwrap(spec.env)
    states, _, length = record_episode(spec, fns, params, obs_scale, key, max_steps, action_fn)
    if isinstance(base_env, BraxEnv):
        _render_brax_html(base_env, states, length, path)
        return path
    name = spec.name.split("?")[0]
    _save_gif(GIF_DRAWERS[name](states, spec.params, length), path, duration_ms=20 if name == "CartPole-v1" else 50)
    return path


def check_render_path(spec: Any, path: str) -> None:
    """Raise ``ValueError`` when the env of ``spec`` cannot be rendered to ``path`` (a format it has no drawing in,
    or no drawing at all), and ``OSError`` when ``path`` cannot be written, before anything runs."""
    _check_render_format(spec, path)
    if spec.host:  # an env that cannot draw itself is refused now, not after jes eval's episodes
        _rgb_array_env(spec).close()
    check_writable(path)  # jes eval --render: before its episodes, not after (and render(): before the episode)


def _check_render_format(spec: Any, path: str) -> None:
    suffix = os.path.splitext(path)[1].lower()
    if spec.host:
        if suffix != ".gif":
            raise ValueError(f"Gymnasium envs render to an animated GIF of their rgb_array frames: give a .gif path, "
                             f"not {path!r}")
        return
    if isinstance(_unwrap(spec.env), BraxEnv):
        if suffix != ".html":
            raise ValueError(f"brax envs render to brax's HTML viewer: give a .html path, not {path!r}")
        return
    name = spec.name.split("?")[0]
    if name not in GIF_DRAWERS:
        raise ValueError(f"no drawing for env {name!r}: jes renders {', '.join(GIF_DRAWERS)} (GIF) and brax envs (HTML)")
    if suffix != ".gif":
        raise ValueError(f"gymnax envs render to an animated GIF: give a .gif path, not {path!r}")


def _pil() -> Any:
    try:
        from PIL import Image, ImageDraw
    except ImportError as err:
        raise ImportError(f"rendering GIFs needs Pillow: {VIZ_HINT}") from err
    return Image, ImageDraw


def _save_gif(frames: list, path: str, duration_ms: int) -> None:
    write_atomically(path, lambda f: frames[0].save(f, format="GIF", save_all=True, append_images=frames[1:],
                                                     duration=duration_ms, loop=0, optimize=False))


def _cartpole_frames(states: Any, params: Any, length: int) -> list:
    Image, ImageDraw = _pil()
    width, height = FRAME_SIZE
    x_limit = float(getattr(params, "x_threshold", 2.4)) * 1.25
    scale = width / (2 * x_limit)
    pole = 2 * float(getattr(params, "length", 0.5)) * scale
    track_y = int(height * 0.7)
    frames = []
    for t in range(length + 1):
        x, theta = float(states.x[t]), float(states.theta[t])
        image = Image.new("RGB", FRAME_SIZE, "white")
        draw = ImageDraw.Draw(image)
        draw.line([(0, track_y), (width, track_y)], fill="black", width=1)
        cx = width / 2 + x * scale
        draw.rectangle([cx - 25, track_y - 15, cx + 25, track_y + 15], fill=(60, 60, 60))
        tip = (cx + pole * np.sin(theta), track_y - 15 - pole * np.cos(theta))
        draw.line([(cx, track_y - 15), tip], fill=(200, 120, 50), width=8)
        draw.ellipse([cx - 4, track_y - 19, cx + 4, track_y - 11], fill=(120, 120, 200))
        draw.text((8, 8), f"t={t}", fill="black")
        frames.append(image)
    return frames


def _pendulum_frames(states: Any, params: Any, length: int) -> list:
    Image, ImageDraw = _pil()
    width, height = FRAME_SIZE
    centre, radius = (width / 2, height / 2), height * 0.4
    frames = []
    for t in range(length + 1):
        theta = float(states.theta[t])   # 0 is upright
        image = Image.new("RGB", FRAME_SIZE, "white")
        draw = ImageDraw.Draw(image)
        tip = (centre[0] + radius * np.sin(theta), centre[1] - radius * np.cos(theta))
        draw.line([centre, tip], fill=(200, 60, 60), width=10)
        draw.ellipse([centre[0] - 5, centre[1] - 5, centre[0] + 5, centre[1] + 5], fill="black")
        draw.text((8, 8), f"t={t}", fill="black")
        frames.append(image)
    return frames


def _render_brax_html(env: BraxEnv, states: Any, length: int, path: str) -> None:
    from brax.io import html

    pipeline = states.pipeline_state
    frames = [jax.tree.map(lambda x: x[t], pipeline) for t in range(length + 1)]
    page = html.render(env.env.sys.tree_replace({"opt.timestep": env.env.dt}), frames)
    write_atomically(path, lambda f: f.write(page), mode="w")


GIF_DRAWERS = {"CartPole-v1": _cartpole_frames, "Pendulum-v1": _pendulum_frames}
