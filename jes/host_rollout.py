"""Host rollouts: Python simulators (Gymnasium) stepped on the host, the policy compiled and batched.

The host twin of :func:`jes.rollout.run_slots`: ``S`` episode slots side by side, one env instance per slot;
each time step makes ONE call of a jitted, vmapped policy step for a group of slots (the same observation
normaliser, action mapping and non-finite-output rule as the compiled rollout), then steps every live
slot's env. Finished slots are masked (their rewards, steps and observations never count), and every
slot's return and observation sums are accumulated step by step in float32, in time order, so a slot's
results depend only on its parameters and its seed, never on which other slots share the batch.

Episode ``k`` is reset with ``seed = seed_of(fold_in(key_k, 0))`` (:func:`episode_seeds`); nothing else
is random on the host side, so a member's fitness is a function of (key, generation, member, episode)
when the env is deterministic given its seed.
"""
from __future__ import annotations

import signal
import threading
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jes.envs.spec import EnvSpec
from jes.rollout import batch_act, obs_normaliser


class HostEnvError(RuntimeError):
    """A host env failed during a member's (or the centre's) episode: its step or reset raised, the episode ran
    past its wall-time limit, or an observation is not finite as float32 (the policy's input). A training run it
    stops saves its last good state to its checkpoint first and carries ``error.result`` (the run so far) and,
    where it saved one, ``error.checkpoint_path`` (``resume`` it once the env is fixed).

    Attributes:
        env: the env's name. slot: what was evaluated (``"member 3 (episode 0) of generation 2"``).
    """

    def __init__(self, message: str, env: str, slot: str):
        super().__init__(message)
        self.env, self.slot = env, slot


class _Timeout(BaseException):
    """Raised by the alarm inside a hung env call (a BaseException so the env's own ``except Exception`` passes it on)."""


def episode_seeds(keys: jax.Array) -> jax.Array:
    """``uint32 [S, 2]`` key data of ``fold_in(key, 0)`` per episode key (traceable); :func:`seed_of` makes an int."""
    return jax.random.key_data(jax.vmap(lambda k: jax.random.fold_in(k, 0))(keys))


def seed_of(data: np.ndarray) -> int:
    """The ``reset(seed=...)`` int of one episode's ``uint32[2]`` key data (a 64-bit non-negative int)."""
    return (int(data[0]) << 32) | int(data[1])


def policy_step(apply: Callable, spec: EnvSpec, params: Any, carry: Any, obs: jax.Array,
                obs_scale: tuple[jax.Array, jax.Array] | None,
                action_fn: Callable | None = None) -> tuple[Any, jax.Array, jax.Array]:
    """One vmapped policy step over slots (traceable): ``(carry, actions, finite)``, as inside :func:`jes.rollout.run_slots`.

    Args:
        apply: ``apply(params, carry, obs) -> (carry, outputs)`` for one slot.
        params, carry: pytrees whose leaves lead with the slots axis ``[S, ...]``; obs: ``[S, *obs_shape]``.
        action_fn: one output -> one action (default ``spec.action``; a :class:`jes.ActionMap` gives the same bits).
    """
    return batch_act(jax.vmap(apply), spec, params, carry, obs, obs_scale, action_fn)


class HostEnvPool:
    """Env instances of one host env, one per slot index, made on first use and reused (each reset reseeds)."""

    def __init__(self, env: Any):
        self.env = env
        self.instances: list = []

    def get(self, count: int) -> list:
        while len(self.instances) < count:
            self.instances.append(self.env.make())
        return self.instances[:count]

    def close(self) -> None:
        for instance in self.instances:
            try:
                instance.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self.instances = []


class CentreEvaluator:
    """One parameter set's host episodes with the normaliser of running statistics: THE program pair training's centre
    evaluation (:class:`jes.host_step.HostGeneration`), ``jes eval`` and :meth:`jes.TrainedPolicy.evaluate` all run.

    The normaliser ``(mean, 1 / std)`` is its own jitted program: computed eagerly, op by op, its variance
    ``sumsq / count - mean * mean`` is rounded twice where a compiled program fuses it into one multiply-add, and the
    policy saw observations that differed in their last bits. The policy step compiles with the same XLA options
    whoever evaluates, ``options`` (:func:`jes.cpu.compiler_options`: the centre is the plain policy, whatever the
    run's perturbation, so a policy file, which knows none, evaluates with the same).

    Args:
        apply: ``apply(params, carry, obs) -> (carry, outputs)`` for one slot.
        spec: the host env's spec.
        options: XLA compiler options of both programs.
        action_fn: one output -> one action (default ``spec.action``; a :class:`jes.ActionMap` gives the same bits).
    """

    def __init__(self, apply: Callable, spec: EnvSpec, options: dict | None, action_fn: Callable | None = None):
        self.spec = spec

        def scale(obs_stats):
            return None if obs_stats is None else obs_normaliser(*obs_stats)

        def step(params, carry, obs, obs_scale):
            return policy_step(apply, spec, params, carry, obs, obs_scale, action_fn)

        self._scale = jax.jit(scale, compiler_options=options)
        self._step = jax.jit(step, compiler_options=options)

    def __call__(self, pool: HostEnvPool, params: Any, obs_stats: tuple | None, initial_carry: Any, seeds: np.ndarray,
                 label: Callable[[int], str]) -> tuple[np.ndarray, np.ndarray]:
        """Returns and steps ``[E]`` of ``params`` (leaves ``[E, ...]``) on the ``E`` episodes of ``seeds``
        (:func:`episode_seeds`), observations normalised by ``obs_stats`` ``(count, sum, sumsq)`` or not (``None``)."""
        obs_scale = self._scale(obs_stats)
        return evaluate_centre(self.spec, pool, lambda c, o: self._step(params, c, o, obs_scale), initial_carry,
                               np.asarray(seeds), label)


def evaluate_centre(spec: EnvSpec, pool: HostEnvPool, step: Callable, initial_carry: Any, seeds: np.ndarray,
                    label: Callable[[int], str]) -> tuple[np.ndarray, np.ndarray]:
    """Returns and steps ``[E]`` of one parameter set on ``E = len(seeds)`` host episodes: ``step(carry, obs)`` is
    the jitted policy step for all ``E`` slots (its parameters bound in); see :func:`run_host_slots`."""
    num_episodes = int(seeds.shape[0])
    out = run_host_slots(spec, pool, [(step, num_episodes)], initial_carry, np.asarray(seeds),
                         np.zeros(num_episodes, bool), False, label)
    return out["returns"], out["steps"]


def _steps(count: int) -> str:
    return "1 step" if count == 1 else f"{count} steps"


def run_host_slots(spec: EnvSpec, pool: HostEnvPool, groups: Sequence[tuple[Callable, int]], initial_carry: Any,
                   seeds: np.ndarray, done: np.ndarray, collect_obs_stats: bool, label: Callable[[int], str]) -> dict:
    """Run ``S`` host episodes side by side, one per slot.

    Args:
        spec: the host env's spec (``spec.env`` a :class:`jes.envs.gymnasium.GymnasiumEnv`).
        pool: env instances to step (slot ``i`` uses instance ``i``).
        groups: ``(step, size)`` pairs covering the slots in order: ``step(carry, obs) -> (carry, actions,
            finite)`` is one jitted call for ``size`` slots (params bound in).
        initial_carry: one slot's initial policy carry.
        seeds: ``uint32 [S, 2]`` (:func:`episode_seeds`); done: bool ``[S]``, slots that start done (padding).
        collect_obs_stats: also sum raw observations of live steps per slot.
        label: slot index -> what it evaluates, for error messages.

    Returns:
        Per-slot numpy arrays ``returns`` (float32, NaN where the policy output a non-finite value), ``steps``
        (int32), and with ``collect_obs_stats`` ``obs_sum``/``obs_sumsq`` ``[S, *obs_shape]``.

    Raises:
        HostEnvError: an env's reset or step raised, or an episode ran past ``spec.env.episode_seconds``.
    """
    env = spec.env
    num_slots = int(seeds.shape[0])
    instances = pool.get(num_slots)
    obs = np.zeros((num_slots, *spec.obs_shape), np.float32)
    live = ~np.asarray(done, bool)
    returns = np.zeros(num_slots, np.float32)
    steps = np.zeros(num_slots, np.int32)
    finite = np.ones(num_slots, bool)
    obs_sum = np.zeros_like(obs) if collect_obs_stats else None
    obs_sumsq = np.zeros_like(obs) if collect_obs_stats else None
    bounds = np.cumsum([0] + [size for _, size in groups])
    if bounds[-1] != num_slots:
        raise ValueError(f"policy groups cover {bounds[-1]} slots, not {num_slots}")
    carries = [jax.tree.map(lambda c: jnp.broadcast_to(c, (size,) + c.shape), initial_carry) for _, size in groups]
    limit = env.episode_seconds
    current = [-1, "reset"]  # the slot and call in progress, for the alarm's message

    def fail(slot: int, what: str, err: BaseException | None) -> HostEnvError:
        if err is None or isinstance(err, _Timeout):
            message = (f"env {spec.name!r}: {label(slot)} ran past its time limit of {limit:g} s per episode "
                       f"(in {what}, after {_steps(steps[slot])}); raise or drop ?episode_seconds=")
        elif what in ("reset", "step"):
            text = str(err) or ("not implemented by the env" if isinstance(err, NotImplementedError) else "")
            message = (f"env {spec.name!r}: {what} raised {type(err).__name__}: {text} in {label(slot)} after "
                       f"{_steps(steps[slot])}")
        else:  # what jes reads from a call's return: the env's, not jes's, error
            message = (f"env {spec.name!r}: {what} does not fit: {type(err).__name__}: {err} in {label(slot)} after "
                       f"{_steps(steps[slot])}")
        return HostEnvError(message, spec.name, label(slot))

    def returned(what: str, result: Any, size: int, form: str) -> tuple:
        if not isinstance(result, tuple) or len(result) != size:
            got = f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
            current[1] = f"{what}'s return"
            raise TypeError(f"{what} must return {form} (Gymnasium's API); it returned {got}")
        return result

    # The limit is on each episode's own time in its env's calls (reset and steps; the slots take turns, so an
    # episode's wall time would grow with the batch). A SIGALRM timer, set to the episode's remaining time around
    # each call, interrupts a call that hangs; only in the main thread, and never over someone else's timer (a test's
    # hard timeout, the user's own): then the time is checked after every call instead.
    alarm = (limit is not None and threading.current_thread() is threading.main_thread()
             and signal.getitimer(signal.ITIMER_REAL)[0] == 0)
    if alarm:
        def on_alarm(signum, frame):
            raise _Timeout()

        previous = signal.signal(signal.SIGALRM, on_alarm)
    spent = np.zeros(num_slots)  # seconds each episode's env calls took

    def call(slot: int, what: str, fn: Callable[[], Any]) -> Any:
        current[:] = [slot, what]
        if limit is None:
            return fn()
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, max(limit - spent[slot], 1e-6))
        start = time.monotonic()
        try:
            result = fn()
        finally:
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
            spent[slot] += time.monotonic() - start
        if spent[slot] > limit:
            raise fail(slot, what, None)
        return result

    try:
        for slot in np.flatnonzero(live):
            first, _ = returned("reset(seed=...)", call(slot, "reset", lambda: instances[slot].reset(
                seed=seed_of(seeds[slot]))), 2, "(obs, info)")
            current[1] = "reset's observation (against the env's observation_space)"
            obs[slot] = env.observation(first)
        for _t in range(spec.max_steps):
            if not live.any():
                break
            outputs = []
            for g, (step, _) in enumerate(groups):
                carries[g], actions, fin = step(carries[g], obs[bounds[g]:bounds[g + 1]])
                outputs.append((actions, fin))
            actions = np.concatenate([np.asarray(a) for a, _ in outputs])
            finite &= np.concatenate([np.asarray(f) for _, f in outputs]) | ~live
            if collect_obs_stats:
                live_obs = np.where(live.reshape((-1,) + (1,) * len(spec.obs_shape)), obs, np.float32(0))
                obs_sum += live_obs
                with np.errstate(over="ignore"):
                    square = live_obs * live_obs
                if not np.isfinite(square).all():  # a finite float32 observation past ~1.8e19: its square overflows
                    current[:] = [int(np.argwhere(~np.isfinite(square))[0][0]), "the observation normaliser's sums"]
                    big = float(np.max(np.abs(live_obs[int(current[0])])))
                    raise OverflowError(f"an observation value of {big:.3g} squares past float32's range; scale the "
                                        f"observation in the env, or train with normalize_observations=False")
                obs_sumsq += square
            for slot in np.flatnonzero(live):
                new_obs, reward, terminated, truncated, _ = returned("step(action)", call(
                    slot, "step", lambda: instances[slot].step(env.env_action(actions[slot]))), 5,
                    "(obs, reward, terminated, truncated, info)")
                steps[slot] += 1  # counted from its return on: a bad reward or observation names the same step
                current[1] = "step's reward"
                if reward is None or isinstance(reward, (str, bytes)):
                    raise TypeError(f"the reward is {reward!r}, not a number")
                returns[slot] += np.float32(reward)
                current[1] = "step's observation (against the env's observation_space)"
                obs[slot] = env.observation(new_obs)
                current[1] = "step's terminated and truncated (one bool each)"
                if terminated or truncated:
                    live[slot] = False
    except _Timeout as err:
        raise fail(int(current[0]), current[1], err) from None
    except HostEnvError:
        raise
    except Exception as err:  # noqa: BLE001 - any env failure becomes an error naming env, member, generation
        raise fail(int(current[0]), current[1], err) from err
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    out = {"returns": np.where(finite, returns, np.float32(np.nan)).astype(np.float32), "steps": steps}
    if collect_obs_stats:
        out["obs_sum"], out["obs_sumsq"] = obs_sum, obs_sumsq
    return out
