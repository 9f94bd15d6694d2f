"""Host loop: ``jes.train`` and ``jes.run``, results, and the wiring to host services.

The compiled generation step lives in :mod:`jes.generation`; this module calls it once
per generation, reads back a handful of scalars, and hands each generation's record
to callbacks (TensorBoard, progress, console), checkpoints and, for distributed runs,
the ZeroMQ master. Host services are imported here, never by the core.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
import pickle
import re
import sys
import time
import warnings
from typing import Any, Callable, Iterable, Sequence

import flax.linen as nn
import jax
import numpy as np

from jes import checkpoint, interrupts, logging as jes_logging
from jes.atomic import folder_problem
from jes.distributed import jax_runtime
from jes.distributed.local import LOCAL_MASTER_OPTIONS, LocalWorkers, new_secret
from jes.distributed.master import Master
from jes import describe
from jes.describe import DescriptionError
from jes.config import ESConfig, checked_config
from jes.envs import gymnasium as gymnasium_envs
from jes.envs import gymnax as gymnax_envs
from jes.envs.spec import maps_box_otherwise_than_before
from jes.generation import Trainer, TrainState, as_key, fetch, localize
from jes import strategies
from jes.strategies.base import both_sigmas, given_noise_std, ignored_settings
from jes.strategy_context import run_learning_rate
from jes.host_step import HostGeneration
from jes.perturbations import LowRankWarning
from jes.policies import evolved_variances
from jes.rollout import offset_warning
from jes.trained import ActionMap, TrainedPolicy


class StopTraining(Exception):
    """Raise it from a callback to end the run after the generation the callback was given, keeping it.

    The run ends as at its last generation: the generation's row is in the history (the callbacks after the one
    that raised still see it), ``best`` counts it, the checkpoint is saved and the logs are closed as at a normal
    end; :func:`train` returns its result, whose ``stopped`` holds the message (or ``"StopTraining"``). Its centre
    is evaluated only if the generation was to evaluate it (``eval_every``). Resuming the checkpoint with
    ``resume=`` goes on from there (its TensorBoard final metrics, written at the stop, move to the resumed run's
    end: one point each). In a ``jax.distributed`` run, where every process runs the callbacks, the processes agree
    after each generation: a ``StopTraining`` raised in any of them stops them all there (as does another error in
    one of them: see :class:`CallbackFailedInAnotherProcess`).

    Example:
        >>> def plateau(record):
        ...     if record["generation"] >= 20 and record["pop_mean"] < 30:
        ...         raise jes.StopTraining("no progress in 20 generations")
        >>> result = jes.train(policy, "CartPole-v1", callbacks=[plateau])
    """


class NonFiniteFitnessError(ValueError):
    """A member's fitness was NaN or infinite; training stopped before using it.

    Attributes:
        generation: the generation being evaluated (1-based, as in the history).
        member: index of the first offending member.
        result: the :class:`TrainResult` up to the last good generation.
    """

    def __init__(self, message: str, generation: int, member: int, result: "TrainResult | None" = None):
        super().__init__(message)
        self.generation = generation
        self.member = member
        self.result = result

    def __reduce__(self):  # copy / pickle (multiprocessing, joblib) with the attributes
        return type(self), (self.args[0], self.generation, self.member, self.result)


class NonFiniteUpdateError(ValueError):
    """A generation's ES update (or the parameters it would give) was not finite; it was not applied.

    Attributes:
        generation: the generation whose update failed (1-based, as in the history).
        result: the :class:`TrainResult` up to the last good generation.
    """

    def __init__(self, message: str, generation: int, result: "TrainResult | None" = None):
        super().__init__(message)
        self.generation = generation
        self.result = result

    def __reduce__(self):  # copy / pickle (multiprocessing, joblib) with the attributes
        return type(self), (self.args[0], self.generation, self.result)


class CheckpointSaveError(OSError):
    """Saving the run's checkpoint failed mid-run (a full disk, a folder whose permissions changed); training
    stopped at the generation it was saving. ``errno`` is the failed write's.

    Attributes:
        generation: the generation (1-based) the run had completed, which the failed save was to hold.
        num_generations: the generations the run was to train.
        reason: the failed write's own words (``"No space left on device"``).
        path: the checkpoint file (the previous checkpoint there, if any, is intact).
        result: the :class:`TrainResult` up to that generation: nothing trained is lost. Save it elsewhere with
            ``jes.checkpoint.save(path, r.trainer, r.state, r.history, r.key, best=r.best)`` (``--resume``-able) or
            ``r.save_policy(path)``; an unpickled error's ``r.trainer`` is ``None``: pass ``jes.Trainer(...)`` of
            the run's policy, env, optimizer and config instead.
    """

    def __init__(self, message: str, generation: int, path: str, result: "TrainResult | None" = None,
                 errno: int | None = None, num_generations: int | None = None, reason: str | None = None):
        super().__init__(message)
        self.reason = reason
        self.errno = errno
        self.generation = generation
        self.num_generations = num_generations
        self.path = path
        self.result = result

    def __str__(self) -> str:  # the message alone (OSError's would prefix "[Errno N]" once errno is set)
        return self.args[0]

    def __reduce__(self):  # copy / pickle (multiprocessing, joblib) with the attributes
        return type(self), (self.args[0], self.generation, self.path, self.result, self.errno, self.num_generations,
                            self.reason)


class BestMember:
    """The best population member evaluated in a run (its fitness is from its own training episodes).

    Its parameters are regenerated from its key when first asked for (or when a checkpoint is
    written, or it is pickled), so a run that never looks at them compiles and runs nothing for them.

    Attributes:
        fitness: its fitness (mean return over ``episodes_per_member`` episodes).
        generation: the generation (1-based) it was evaluated in.
        member: its index in that generation's population.
        flat_params: ``[num_params]`` parameters, regenerated from its key.
        policy: a :class:`jes.trained.TrainedPolicy` of it, with the normaliser it was evaluated with.
    """

    def __init__(self, fitness: float, generation: int, member: int, flat_params: np.ndarray | None = None,
                 policy: TrainedPolicy | None = None,
                 regenerate: Callable[[], tuple[np.ndarray, TrainedPolicy]] | None = None):
        if (flat_params is None) == (regenerate is None):
            raise ValueError("BestMember needs either flat_params (with its policy) or regenerate")
        self.fitness, self.generation, self.member = fitness, generation, member
        self._flat, self._policy, self._regenerate = flat_params, policy, regenerate

    def _materialise(self) -> None:
        if self._regenerate is not None:
            self._flat, self._policy = self._regenerate()
            self._regenerate = None

    @property
    def flat_params(self) -> np.ndarray:
        self._materialise()
        return self._flat

    @property
    def policy(self) -> TrainedPolicy:
        self._materialise()
        return self._policy

    @property
    def params(self) -> Any:
        """Its Flax variables."""
        return self.policy.params

    def __getstate__(self) -> dict:
        # pickle (multiprocessing, joblib): its parameters regenerated first (the regenerator holds the trainer's
        # compiled programs and devices, which cannot be pickled); the policy pickles as its policy file does
        self._materialise()
        return dict(self.__dict__)

    def __deepcopy__(self, memo: dict) -> "BestMember":
        copied = copy.copy(self)
        memo[id(self)] = copied
        for name, value in self.__dict__.items():
            if name != "_regenerate":  # shared: it regenerates the same member, with the trainer's programs
                setattr(copied, name, copy.deepcopy(value, memo))
        return copied

    def __copy__(self) -> "BestMember":
        copied = object.__new__(type(self))
        copied.__dict__.update(self.__dict__)
        return copied

    def __repr__(self) -> str:
        return f"BestMember(fitness={self.fitness!r}, generation={self.generation}, member={self.member})"


class NotPickled:
    """Stands in, in an unpickled :class:`TrainResult`'s ``config``, for a value pickle cannot carry (a schedule:
    a closure); calling it raises. ``what``: the value's field and repr."""

    def __init__(self, what: str):
        self.what = what

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{self.what} was not pickled (a closure cannot be); the history holds the values it gave "
                        f"each generation, and the run's checkpoint resumes with jes.train(..., resume=path)")

    def __repr__(self) -> str:
        return f"NotPickled({self.what!r})"


def _picklable_config(config: ESConfig) -> ESConfig:
    """``config`` with each field that pickle cannot carry (a schedule: a closure) replaced by a :class:`NotPickled`."""
    replaced = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if callable(value):
            try:
                pickle.dumps(value)
            except Exception:  # noqa: BLE001 - whatever pickle says, the value cannot travel
                replaced[f.name] = NotPickled(f"config.{f.name} {' '.join(repr(value).split())}")
    if not replaced:
        return config
    copied = copy.copy(config)  # not dataclasses.replace: the config's checks refuse the stand-in
    for name, value in replaced.items():
        object.__setattr__(copied, name, value)
    return copied


class CentrePolicy:
    """What a finished run's final centre does as a policy, through the run's :meth:`trained_policy` (a
    :class:`jes.trained.TrainedPolicy`): :class:`TrainResult` and :class:`jes.sweep.SweepRun` have these."""

    def trained_policy(self) -> TrainedPolicy:
        raise NotImplementedError

    def act(self, carry: Any, obs: Any) -> tuple[Any, jax.Array]:
        """``(carry, action)`` of the trained centre for one raw observation, normalised as in training.

        Start each episode with :meth:`initial_carry`; ``action`` goes straight into ``env.step``.
        """
        return self.trained_policy().act(carry, obs)

    def initial_carry(self) -> Any:
        """The policy's carry at an episode's start (``()`` for feed-forward policies)."""
        return self.trained_policy().initial_carry()

    def policy_fn(self) -> Callable[[Any, jax.Array], tuple[Any, jax.Array]]:
        """A self-contained, jittable ``fn(carry, obs) -> (carry, action)`` with the params, normaliser and
        action mapping baked in."""
        return self.trained_policy().policy_fn()

    def evaluate(self, num_episodes: int = 64, key: Any = 12345) -> np.ndarray:
        """Returns of the final centre on ``num_episodes`` fresh episodes drawn from ``key``, stepped as training
        steps them (the same returns as training's centre evaluation with that key)."""
        return self.trained_policy().evaluate(num_episodes, key)

    def save_policy(self, path: str) -> str:
        """Write the trained centre to ``path`` for :func:`jes.load_policy` (msgpack; needs only jes to use)."""
        return self.trained_policy().save(path)


@dataclasses.dataclass
class TrainResult(CentrePolicy):
    """What :func:`train` returns. Its final centre is a policy (:class:`CentrePolicy`): :meth:`save_policy`,
    :meth:`evaluate`, :meth:`act`, :meth:`initial_carry`, :meth:`policy_fn`, :meth:`trained_policy`.

    Attributes:
        params: final centre as Flax variables, usable with ``result.policy.apply``.
        flat_params: the same as one numpy vector.
        policy: the policy module as trained (output size filled in).
        history: per-generation arrays: ``generation``, ``pop_mean``, ``pop_max``, ``pop_min``,
            ``pop_std``, ``centre_return`` (NaN where not evaluated), ``wall_time`` (s since start,
            compile excluded, summed over a resumed run's sessions), ``generation_time``, ``env_steps`` (cumulative), ``noise_std``,
            ``learning_rate``, ``grad_norm``, ``update_norm``, ``param_norm``.
        config: the :class:`ESConfig`.
        key: raw ``uint32`` data of the run key (``jes.train(..., key=result.key)`` reproduces the run).
        env_name: the environment id.
        optimizer: the optimizer's name (or type name); ``None`` for strategies without one.
        strategy: the strategy's name.
        solved_generation: first generation (1-based) whose centre evaluation reached the
            env's solved return, or ``None``.
        compile_time: seconds spent compiling the generation step; 0.0 where it is not compiled here as one
            program (a Python simulator's jitted pieces, a distributed master's workers, a given ``step_fn``).
        wall_time: seconds of this call: from :func:`train`'s call (the trainer's build and the step's compile
            included) or :func:`run`'s; a resumed run's earlier sessions are in ``history["wall_time"]``.
        state: the final :class:`TrainState` (to continue training).
        trainer: the :class:`Trainer` that ran it, or ``None`` in a result that was pickled (sent back from a
            ``multiprocessing`` / joblib worker): its compiled functions and devices cannot be pickled and are left
            out. Everything else pickles: arrays, ``history``, ``key``, ``state`` (on the default device), ``best``
            (its parameters regenerated first) and the policy, which pickles as its ``.policy`` file does (rebuilt
            as :func:`jes.load_policy` rebuilds it, env by its name); :meth:`trained_policy`, :meth:`act`,
            :meth:`evaluate`, :meth:`save_policy` and :meth:`summary` work as before, :meth:`render` says what to do.
            A ``config`` field pickle cannot carry (a schedule: a closure) comes back as a :class:`NotPickled`.
            To train on, resume the run's checkpoint, or ``jes.run(jes.Trainer(...), result.state,
            key=result.key, history=result.history, best=result.best)``. ``copy.deepcopy`` copies the result and
            shares its ``trainer``.
        best: the best member evaluated in the run (:class:`BestMember`; kept across a resume by the
            checkpoint), or ``None``.
        log_dir: the TensorBoard directory, or ``None``.
        checkpoint_path: the checkpoint file, or ``None``.
        stopped: ``None``, or why a callback ended the run early: the message of the :class:`StopTraining` it raised
            (``"StopTraining"`` when it gave none).
    """

    params: Any
    flat_params: np.ndarray
    policy: nn.Module
    history: dict
    config: ESConfig
    key: np.ndarray
    env_name: str
    optimizer: str | None
    strategy: str
    solved_generation: int | None
    compile_time: float
    wall_time: float
    state: TrainState
    trainer: Trainer | None
    best: BestMember | None = None
    log_dir: str | None = None
    checkpoint_path: str | None = None
    stopped: str | None = None

    def __getstate__(self) -> dict:
        # pickle (multiprocessing, joblib): without the trainer, whose compiled functions and devices cannot be
        # pickled; what needs it later is built now (the trained policy, the summary's words). The bare Flax module
        # is not pickled itself (pickle cannot name jnp.tanh): the trained policy carries it as its file does
        return dict(self.__dict__, trainer=None, policy=None, config=_picklable_config(self.config),
                    _trained=self.trained_policy(), _label=self._run_label(), _num_params=self._param_count())

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.policy = self._trained.policy

    def __copy__(self) -> "TrainResult":
        copied = object.__new__(type(self))
        copied.__dict__.update(self.__dict__)
        return copied

    def __deepcopy__(self, memo: dict) -> "TrainResult":
        copied = copy.copy(self)
        memo[id(self)] = copied
        for name, value in self.__dict__.items():
            if name != "trainer":  # shared: compiled functions and devices are not data to copy
                setattr(copied, name, copy.deepcopy(value, memo))
        return copied

    def _run_label(self) -> str:
        return self.trainer.run_label if self.trainer is not None else self.__dict__.get("_label", "?")

    def _param_count(self) -> int:
        return self.trainer.num_params if self.trainer is not None else int(self.flat_params.size)

    @property
    def final_centre_return(self) -> float:
        """The last centre evaluation's mean return (NaN if none ran)."""
        scores = self.history["centre_return"]
        finite = scores[np.isfinite(scores)]
        return float(finite[-1]) if finite.size else float("nan")

    def trained_policy(self) -> TrainedPolicy:
        """The final centre as a :class:`jes.trained.TrainedPolicy` (normaliser and action mapping included)."""
        if getattr(self, "_trained", None) is None:
            self._trained = trained_policy(self._needs_trainer("trained_policy()"), self.state.params, self.state)
        return self._trained

    def render(self, path: str, key: Any = 0, max_steps: int | None = None) -> str:
        """Draw one centre episode to ``path`` (``.gif`` for gymnax CartPole/Pendulum and Gymnasium envs, ``.html`` for brax).

        Needs the ``viz`` extra for GIFs (``pip install ".[viz]"`` in jes's clone); see :func:`jes.render.render`.
        ``key`` is the episode's own key (:meth:`evaluate` draws its episodes' keys from its key: ``render(key=k)`` is
        not the episode ``evaluate(1, key=k)`` scores).
        """
        from jes.render import render as render_episode  # matplotlib/pillow only when asked for

        return render_episode(self._needs_trainer("render()"), self.state, path, key, max_steps)

    def _needs_trainer(self, what: str) -> Trainer:
        if self.trainer is None:
            raise ValueError(f"{what} needs the run's trainer, which a pickled TrainResult leaves out (its compiled "
                             f"functions and devices cannot be pickled): build one with jes.Trainer(policy, env, "
                             f"optimizer, config) and pass it with result.state (jes.render.render(trainer, "
                             f"result.state, path)), or resume the run's checkpoint "
                             f"({self.checkpoint_path or 'none was written'})")
        return self.trainer

    def __repr__(self) -> str:
        # The default dataclass repr printed every array (35 k characters in a notebook cell's output).
        return f"TrainResult({self.summary()})"

    def summary(self) -> str:
        """One readable line about the run."""
        solved = f"solved at generation {self.solved_generation}" if self.solved_generation else "not solved"
        return (
            f"{self.env_name} with {self._run_label()}: {_count(len(self.history['generation']), 'generation')}, "
            f"centre return {self.final_centre_return:.1f}, {solved}; "
            f"{self._param_count()} params, {self.wall_time:.1f}s wall{self._sessions_note()}"
            # 0.0: the step was not compiled here as one program (a host env's pieces, a master's workers)
            + (f" ({self.compile_time:.1f}s compile)" if self.compile_time else "")
            + (f"; best member {self.best.fitness:.1f} (generation {self.best.generation})" if self.best else "")
            + (f"; stopped by a callback: {self.stopped}" if self.stopped is not None else "")
            + f"; logs: {self._logs_note()}; checkpoint: {self.checkpoint_path or self._no_checkpoint_note()}"
        )

    def _no_checkpoint_note(self) -> str:
        """'off', or 'none written' for a run with checkpoints on that stopped before it wrote one (interrupted while
        compiling: "off" said otherwise)."""
        return "none written" if self.__dict__.get("_checkpointing") else "off"

    def _logs_note(self) -> str:
        """The log dir, or why there is none: logging off, or a run stopped before it wrote one (interrupted while
        compiling: its folder was named but never made)."""
        if not self.log_dir:
            return "off"
        # (looked up by its absolute path as the run ended: a relative log_dir read from another folder; a run
        # interrupted while compiling removes the folder its logger made)
        where = self.__dict__.get("_log_dir_path") or self.log_dir
        return self.log_dir if os.path.isdir(where) else f"none written (would have been {self.log_dir})"

    def _sessions_note(self) -> str:
        """For a resumed run (its history's training time past this call's wall time): that the wall time is this
        call's, with the training time of all its sessions (the history's ``wall_time``, compiles excluded)."""
        times = self.history.get("wall_time", ())
        total = float(times[-1]) if len(times) else 0.0
        return f" in this call ({total:.1f}s training over the run's sessions)" if total > self.wall_time else ""


def trained_policy(trainer: Trainer, flat_params: Any, state: TrainState) -> TrainedPolicy:
    """A :class:`TrainedPolicy` of ``flat_params`` with ``trainer``'s policy and action mapping and ``state``'s normaliser."""
    stats = None
    if trainer.normalize_observations:  # what obs_norm(state) is not None says, without computing it eagerly
        stats = tuple(np.asarray(fetch(x)) for x in (state.obs_count, state.obs_sum, state.obs_sumsq))
    return _policy_of(trainer, fetch(flat_params), stats)


def _member_regenerator(trainer: Trainer, state: TrainState, member: int) -> Callable[[], tuple]:
    """Regenerates member ``member`` of ``state``'s generation: ``(flat_params, TrainedPolicy)``."""

    def regenerate():
        flat = np.asarray(fetch(trainer.member(localize(state), np.int32(member))))  # np: no eager convert program
        return flat, trained_policy(trainer, flat, state)

    return regenerate


def _policy_of(trainer: Trainer, flat_params: Any, obs_stats: tuple | None) -> TrainedPolicy:
    """A :class:`TrainedPolicy` of host ``flat_params`` with ``trainer``'s policy and action mapping."""
    return TrainedPolicy(trainer.policy, np.asarray(flat_params), trainer.spec.obs_shape,
                         ActionMap.from_spec(trainer.spec), obs_stats=obs_stats, env_name=trainer.spec.name,
                         max_steps=trainer.spec.max_steps, env=trainer.spec)


# Seconds a run with local workers waits for them to build and compile the run before its first generation.
LOCAL_WORKERS_TIMEOUT = 120.0

HISTORY_KEYS = (
    "generation", "pop_mean", "pop_max", "pop_min", "pop_std", "centre_return", "wall_time",
    "generation_time", "env_steps", "noise_std", "learning_rate", "grad_norm", "update_norm", "param_norm",
)

Callback = Callable[[dict], Any]


def _check_mirrored_population(strategy: Any, overrides: dict) -> None:
    """Refuse an odd ``num_members`` for a strategy that always evaluates mirrored pairs, before ESConfig's own
    refusal advises ``antithetic=False``, which such a strategy refuses too."""
    members = overrides.get("num_members")
    try:
        resolved = strategies.get(strategy)
    except (TypeError, ValueError):
        return  # the Trainer reports a bad strategy
    if isinstance(members, int) and not isinstance(members, bool) and members % 2 and resolved.antithetic(False):
        raise ValueError(f"num_members={members} is odd, but strategy {resolved.name!r} evaluates mirrored pairs by "
                         f"definition; use an even population (e.g. {members + 1})")


def own_checkpoint_to_resume(resume: Any, log_dir: str | None, checkpoint_path: str | None,
                             command: bool = False) -> str | None:
    """``resume`` as :func:`train` reads it: with ``True``, the run's own checkpoint if it is there (``None``: a
    fresh run, which writes it); any other value as given. ``command``: errors in ``jes train``'s words.

    Raises:
        ValueError: ``True`` without a ``checkpoint_path`` or ``log_dir`` of the caller's own (an auto-named log dir
            is new each run: a requeued job would never find its checkpoint), or a resume that is not a path.
    """
    if resume is None or resume is False or isinstance(resume, (str, os.PathLike)):
        return None if resume is None or resume is False else os.fspath(resume)
    if resume is not True:
        raise TypeError(f"resume must be a checkpoint path, True (the run's own checkpoint if it is there) or None, "
                        f"got {resume!r}")
    if checkpoint_path is None:
        raise ValueError("--resume without a file continues the run's own checkpoint, but --checkpoint none keeps "
                         "none" if command else "resume=True continues the run's own checkpoint, but "
                         "checkpoint_path=None keeps none")
    if checkpoint_path != "<log_dir>/checkpoint.ckpt":
        path = os.fspath(checkpoint_path)
    elif log_dir not in (None, "runs/<auto>"):
        path = os.path.join(os.fspath(log_dir), "checkpoint.ckpt")
    else:
        raise ValueError("--resume without a file continues the run's own checkpoint if it is there: give the run a "
                         "--log-dir DIR of its own (the auto-named one is new each run, so a rerun would never find "
                         "it) or a --checkpoint PATH" if command else
                         "resume=True continues the run's own checkpoint if it is there: give the run a log_dir of "
                         "its own (the auto-named one is new each run, so a rerun would never find it) or a "
                         "checkpoint_path")
    exists = os.path.exists(path)
    if jax_runtime.is_initialized() and jax.process_count() > 1:  # process 0 writes it: its answer, everywhere
        exists = _from_process_0("there" if exists else None) is not None
    return path if exists else None


def _take_sigterm(taking: interrupts.SigtermAsInterrupt) -> None:
    """Install ``taking`` (SIGTERM as Ctrl-C), except in a ``jax.distributed`` process: JAX's preemption notifier
    holds SIGTERM there, installed from C where ``signal.getsignal`` still says ``SIG_DFL``, so ``unless_handled``
    cannot see it; taking SIGTERM over would break ``reached_preemption_sync_point`` and, once restored, leave
    SIGTERM's default action (the process then dies on the SIGTERM the notifier was there to catch)."""
    if not jax_runtime.is_initialized():
        taking.install()


def _end_if_terminated(taking: interrupts.SigtermAsInterrupt, name: str, error: BaseException | None,
                       resume: str | None = None, finished: str | None = None) -> None:
    """Give SIGTERM its handler back; if one came while :func:`train` or :func:`run` ran (taken as Ctrl-C: by now the
    run is saved, its local workers stopped and its logs closed), say on stderr where the run is and end the process
    as SIGTERM ends it (status 143): what it would have done without jes, with nothing trained lost. ``error``: the
    interrupt (or error) the run raised, which names the checkpoint it saved; ``resume``: the one it continued;
    ``finished``: the checkpoint of a run that finished (``""`` without one), where none raised."""
    taking.restore(error)
    if not taking.terminated:
        return
    saved = getattr(error, "checkpoint_path", None) or resume
    save_error = getattr(error, "save_error", None)
    # jes.run has no resume=: its state, key, history and best come from the checkpoint
    how = (f"resume={saved!r}" if name != "run" else
           f"`trainer, state, ckpt = jes.checkpoint.load({saved!r})` and `jes.run(trainer, state, key=ckpt.key, "
           f"history=ckpt.history, best=ckpt.best, checkpoint_path={saved!r})`")
    if error is None and finished is not None:  # its interrupt dropped (a gc callback's) after the run's last check
        where = (f" after the run had finished (its checkpoint: {finished})" if os.path.exists(finished) else
                 " after the run had finished")
    elif saved is None or not os.path.exists(saved):
        where = " before it saved a checkpoint (checkpoint_path=None, or before its first generation)"
    elif save_error is not None:
        where = (f"; saving its newest generations failed ({getattr(save_error, 'reason', None) or save_error}): "
                 f"continue from the earlier checkpoint {saved} with {how}")
    else:
        where = f"; the run so far is in checkpoint {saved}: continue it with {how}"
    print(f"jes.{name}: terminated by SIGTERM{where}", file=sys.stderr, flush=True)
    interrupts.terminate_as_sigterm()


def train(
    policy: nn.Module,
    env: Any,
    optimizer: Any = None,
    *,
    strategy: Any = "openai_es",
    key: Any = 0,
    config: ESConfig | None = None,
    env_params: Any = None,
    devices: Any = None,
    callbacks: Sequence[Callback] = (),
    log_dir: str | None = "runs/<auto>",
    progress: bool | None = None,
    checkpoint_path: str | None = "<log_dir>/checkpoint.ckpt",
    checkpoint_every: int = 10,
    resume: str | bool | None = None,
    master: str | None = None,
    secret: bytes | str | None = None,
    master_options: dict | None = None,
    distributed: bool = False,
    rollout_min_batch: int = 32,
    num_workers: int = 0,
    **overrides: Any,
) -> TrainResult:
    """Train ``policy`` on ``env`` with an evolution strategy (OpenAI-ES by default).

    Example:
        >>> result = jes.train(jes.GRUPolicy(hidden=5, layers=2), "CartPole-v1", "novograd")
        >>> result = jes.train(jes.GRUPolicy(), "CartPole-v1", strategy="pgpe")   # ClipUp by default
        >>> result = jes.train(jes.GRUPolicy(), "CartPole-v1", strategy=jes.strategies.SNES(sigma_lr=0.05))

    Args:
        policy: a Flax module mapping one observation to action outputs.
        env: a gymnax env id (``"CartPole-v1"``), env object, or ``(env, env_params)``.
        optimizer: for strategies that move their mean with an optimizer (openai_es, pgpe):
            ``"adam"``, ``"adabelief"``, ``"novograd"``, ``"radam"``, ``"amsgrad"``, ``"sgd"``,
            ``"clipup"``, or any optax ``GradientTransformation``; ``None`` takes the strategy's
            default (adam for openai_es, clipup for pgpe). snes, sep_cma_es, ars and cma_es have their own
            update rules and refuse an optimizer.
        strategy: ``"openai_es"`` (default), ``"pgpe"``, ``"snes"``, ``"sep_cma_es"``, ``"ars"``, ``"cma_es"``
            (``jes.strategies.names()``) or a strategy object with its hyperparameters. One that sets its own
            initial sigma (``SNES(sigma_init=0.3)``) refuses a ``noise_std`` given beside it (one would be ignored).
        key: int seed or ``jax.random`` key; same key and config give bit-identical results.
        config: an :class:`ESConfig`; keyword ``overrides`` (e.g. ``num_members=256``) replace its fields.
        env_params: gymnax env params.
        devices: local devices to shard the population over (``None``: all local devices).
        callbacks: functions called with each generation's metrics dict (host side); see :mod:`jes.logging`. One
            that raises :class:`StopTraining` ends the run after that generation, keeping it (``result.stopped``).
        log_dir: TensorBoard directory; the default is ``runs/<env>-<policy>-<optimizer>-<time>``, or with
            ``resume`` the checkpoint's directory when it holds TensorBoard event files (the run's own log dir,
            where its curves then continue); ``None`` turns TensorBoard logging off.
        progress: tqdm progress bar; ``None`` shows it only when stdout is a terminal.
        checkpoint_path: checkpoint file, written every ``checkpoint_every`` generations, at the end,
            and on Ctrl-C; also on SIGTERM (``kill``, ``timeout``, a cluster scheduler) where it would end the process
            unhandled (in the main thread, without a SIGTERM handler of the program's own): the run saves as on
            Ctrl-C, says where on stderr, then the process ends as SIGTERM ends it (status 143). The default is
            ``checkpoint.ckpt`` in ``log_dir`` (the ``resume`` file when resuming); ``None`` turns checkpoints off.
            A file already there that is not the ``resume`` file (another run's checkpoint: a second run into the
            same ``log_dir``) is never overwritten: the run is
            refused with a ``FileExistsError`` before it starts, and so is a ``log_dir`` or checkpoint folder that
            cannot be written (a ``PermissionError``). While the run writes the checkpoint it holds a lock beside
            it (``<checkpoint>.jes-lock``, removed when the run ends; the lock ends with its process and those it
            forked, however they end): a second run on the same checkpoint (resuming it too, say) is refused with a
            :class:`jes.checkpoint.CheckpointInUseError` naming the run that holds it, before its step compiles (in
            a ``jax.distributed`` run, once its processes agree on the run, with the compile already started); a
            run into an auto-named ``log_dir`` that another run started in the same second took moves on to the
            next free name instead. A
            save that fails later (a full disk) stops the run with a
            :class:`CheckpointSaveError` whose ``result`` holds the run so far. Any other error that stops the run
            midway (a Python simulator that raises, a callback's bug, a full log disk) first saves the last good
            state there, as Ctrl-C does, and carries the run so far as ``error.result`` and the checkpoint as
            ``error.checkpoint_path``: fix the cause and ``resume`` it. Logs that cannot be closed at the end (a full
            log disk) are warned of: they never replace that error, nor cost a finished run its result.
        checkpoint_every: generations between checkpoints (0: only at the end, on Ctrl-C and on an error).
        resume: a checkpoint to continue from; the run then ends bit-identical to one never
            interrupted. ``True``: the run's own checkpoint (``checkpoint_path``, else ``checkpoint.ckpt`` in
            ``log_dir``, one of them given) if it is there, else a fresh run that writes it: one call for a batch
            job's first start and each requeue after a preemption. The run key comes from the checkpoint (``key`` is ignored, with a warning where
            it differs); the policy, env,
            optimizer and config must match it (``num_generations`` may grow). ``learning_rate`` may change (with
            a warning when the rate the run goes on with is not the one it ran with); not given (``None``), the
            run goes on at the checkpoint's rate.
        master: listen address (``":5555"``, ``"0.0.0.0:5555"``) to spread each generation over
            ``jes-worker --master HOST:PORT`` processes (:mod:`jes.distributed`); the result is
            bit-identical to a local run. The policy, env, optimizer (by name) and config must be
            describable as plain data.
        secret: shared HMAC key for ``master`` (``None``: the ``JES_SECRET`` environment variable).
        master_options: keyword arguments of :class:`jes.distributed.master.Master` (timing knobs
            ``heartbeat_interval``, ``worker_timeout``, ``assign_timeout``, ``min_deadline``,
            ``target_range_seconds``, ``max_range_chunks``; ``audit``; ``curve_secret_key``).
        distributed: run over every process of a multi-process JAX runtime (``jax.distributed``:
            homogeneous accelerator clusters). Every process runs the same script and call; jes joins
            the runtime from what ``jes launch``, Slurm or a TPU pod provides (or uses the one started
            by :func:`jes.distributed.initialize`) and shards the population over every device of every
            process. Bit-identical to one process; process 0 writes logs and checkpoints; every process
            returns the same result. A run already inside an initialised runtime uses it without this flag.
        rollout_min_batch: see :class:`Trainer` (a speed/compile-time knob; results do not depend on it).
        num_workers: local ``jes-worker`` processes to spread each generation's chunks over (0: this process
            alone). Meant for host (Python) envs such as ``"gymnasium:CartPole-v1"``: a master on 127.0.0.1
            with a fresh secret serves them, a worker that dies is replaced, and the result is bit-identical to
            ``num_workers=0``. The run must be describable as data (the env by its registered id).

    Returns:
        A :class:`TrainResult`.
    """
    started = time.perf_counter()
    _check_checkpoint_every(checkpoint_every)  # before the step's compile starts (see finish_compiling)
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an integer >= 0, got {num_workers!r}")
    if num_workers and (master is not None or distributed):
        raise ValueError("num_workers= starts local worker processes with a master of its own; it cannot be combined "
                         "with master= or distributed=True (start jes-worker processes against master= instead)")
    if distributed:
        if master is not None:
            raise ValueError("distributed=True (JAX's multi-process runtime) and master= (the ZeroMQ master for "
                             "jes-worker fleets) are two different backends; choose one")
        jax_runtime.ensure_initialized()
    elif (os.environ.get(jax_runtime.ENV_NUM_PROCESSES, "").isdigit()
          and int(os.environ[jax_runtime.ENV_NUM_PROCESSES]) > 1 and jax.process_count() == 1):
        warnings.warn(f"this process is one of {os.environ[jax_runtime.ENV_NUM_PROCESSES]} that jes launch started, "
                      f"but distributed=False: it trains the whole run alone, as every other process does, all "
                      f"writing the same files; pass distributed=True", stacklevel=2)
    jes_logging.check_callbacks(callbacks)
    primary = jax.process_index() == 0
    if overrides:
        _check_mirrored_population(strategy, overrides)
    config = checked_config(config)
    check_keywords(overrides, train)
    config = config.replace(**overrides) if overrides else config
    own_checkpoint = resume is True  # (a requeued job's run: what it finds in its folder is its own earlier start)
    resume = own_checkpoint_to_resume(resume, log_dir, checkpoint_path)
    restored = None
    if resume is not None:
        # Before the Trainer, whose optimizer is built with the rate: a resume given none goes on at the file's
        try:
            restored = checkpoint.read(resume)
        except (checkpoint.CheckpointError, OSError):
            if jax.process_count() == 1:
                raise
            # A multi-process run: its processes first check that they resume the same file (below), which names the
            # process that cannot read it, before any of them raises
        if restored is not None:
            config = _resumed_learning_rate(config, restored)
    # A resume's low-rank warnings (a rank no smaller than a matrix, a leaf it cannot factor) wait for the checkpoint's
    # check: a resume refused for another rank printed the rebuilt policy's warning first, as if it were the problem
    # (they are given again by a second look at the layout once it passed, from where they are given: the user's
    # filters and registries apply as to any warning; every other warning is given as it comes)
    quiet = restored is not None and jax.process_count() == 1
    with warnings.catch_warnings() if quiet else contextlib.nullcontext():
        if quiet:
            warnings.simplefilter("ignore", LowRankWarning)
        trainer = Trainer(policy, env, optimizer, config, env_params=env_params, devices=devices,
                          rollout_min_batch=rollout_min_batch, strategy=strategy)
    ignored = ignored_settings(trainer.strategy, config.learning_rate, config.weight_decay, config.fitness_shaping,
                               config.antithetic)
    if ignored is not None and resume is None:
        raise ValueError(ignored)
    # (a resume goes on from the sigma its state holds: neither initial sigma is read again)
    sigmas = both_sigmas(trainer.strategy, given_noise_std(config, overrides)) if resume is None else None
    if sigmas is not None:
        raise ValueError(sigmas)
    if ignored is not None:  # a checkpoint of a jes that took them silently: its run goes on as it was
        warnings.warn(f"{ignored} (the resumed run goes on as it ran, without them)", stacklevel=2)
    if restored is not None and jax.process_count() == 1:
        # Before the step's compile: a checkpoint of another run is refused at once, not after a compile (the
        # processes of a multi-process run first check that they resume the same file, below)
        restored.check_compatible(trainer)
    if quiet and trainer.perturbation.structured:  # (the check passed: the low-rank warnings held back above)
        trainer.perturbation_layout()
    if log_dir == "":  # the current folder (it trained, then stopped at its first write: "No such file or directory: ''")
        log_dir = "."
    if log_dir == "runs/<auto>" and resume is not None and jes_logging.has_event_files(os.path.dirname(resume) or "."):
        log_dir = os.path.dirname(resume) or "."  # the checkpoint sits in its run's log dir: continue the curves there
    auto_name = None  # the auto log dir's name: a run started in the same second that took it first moves this one on
    if log_dir == "runs/<auto>":
        # a JAX env object's name goes on with its class and fingerprint: its label alone names the directory
        env_label = trainer.spec.name.partition(gymnax_envs.INSTANCE_SUFFIX)[0]
        auto_name = jes_logging.default_run_name(env_label, type(trainer.policy).__name__, trainer.run_label)
        log_dir = jes_logging.unique_dir(os.path.join("runs", auto_name))
    auto_checkpoint = checkpoint_path == "<log_dir>/checkpoint.ckpt" and resume is None
    if checkpoint_path == "<log_dir>/checkpoint.ckpt":
        checkpoint_path = resume if resume is not None else (
            os.path.join(log_dir, "checkpoint.ckpt") if log_dir is not None else None)
    if checkpoint_path is not None and primary:
        checkpoint.warn_unresumable(trainer.policy, checkpoint_path)  # at the start, not when resume= refuses it
    # A resume of a run with nothing left to train (its generations done, or its stop_at_return reached): its result
    # is the checkpoint's, so the step is not compiled and no event file is started
    nothing_left = restored is not None and _nothing_left(restored.generation, restored.history, config)
    lock = None  # this run's lock on its checkpoint, held until it ends
    server = None  # the ZeroMQ master of master=, made before the loggers

    def refuse_to_write() -> None:
        """Refuse a checkpoint that would replace another run's, or a folder that cannot be written: process 0's
        verdict, which every process of a multi-process run raises."""
        overwrite = _overwrite_problem(checkpoint_path, resume) if primary and checkpoint_path is not None else None
        if jax.process_count() > 1:
            overwrite = _from_process_0(overwrite)  # process 0 writes; every process hears its refusal
        if overwrite is not None:
            raise FileExistsError(overwrite)
        # A folder that cannot be written was found at the first save, after the training it was to keep
        unwritable = _unwritable_problem(log_dir, checkpoint_path, resume) if primary else None
        if jax.process_count() > 1:
            unwritable = _from_process_0(unwritable)
        if unwritable is not None:
            raise PermissionError(unwritable)

    ran = _Ran()
    failed = None  # the error (or interrupt) the run raises, if any
    # SIGTERM (kill, timeout, a cluster scheduler) as Ctrl-C from here on, where it would end the process unhandled:
    # the run saves, then the process ends as SIGTERM ends it (_end_if_terminated)
    taking_sigterm = interrupts.SigtermAsInterrupt(unless_handled=True)
    try:  # a compile thread left running when this raises would abort the interpreter at its exit
        _take_sigterm(taking_sigterm)
        if jax.process_count() == 1:  # (a multi-process run takes process 0's below, once its processes agree on it)
            for attempt in range(_AUTO_DIR_ATTEMPTS):
                try:  # before the compile: a checkpoint in use is refused at once
                    lock = _lock_checkpoint(checkpoint_path, resuming=resume is not None)
                    break
                except checkpoint.CheckpointInUseError:
                    # Runs started together that picked one auto folder: the others move on to its _1, _2... (the
                    # lock made the folder) as unique_dir moved them before; only a path one chose is refused
                    if auto_name is None or not auto_checkpoint or log_dir is None or attempt + 1 == _AUTO_DIR_ATTEMPTS:
                        raise
                    log_dir = jes_logging.unique_dir(os.path.join("runs", auto_name))
                    checkpoint_path = os.path.join(log_dir, "checkpoint.ckpt")
            refuse_to_write()  # before the compile: nothing has run (a multi-process run's processes agree first)
        if master is None and not num_workers and not trainer.spec.host and not nothing_left:
            trainer.start_compiling_step()  # overlaps building or restoring the state (a master or a host env: none)
        history = None
        if jax.process_count() > 1:
            _check_same_run(trainer, key, resume)
        if resume is not None:
            restored = restored or checkpoint.read(resume)
            try:
                same_key = np.array_equal(np.asarray(jax.random.key_data(as_key(key))), np.asarray(restored.key))
            except (TypeError, ValueError):  # not a key at all: ignored all the same
                same_key = False
            if not (isinstance(key, int) and key == 0) and not same_key:
                warnings.warn(f"key={key!r} is ignored: a resumed run continues with its checkpoint's key (its "
                              f"members are those of the run it continues); start a fresh run for another key",
                              stacklevel=2)
            spec = trainer.spec
            if restored.meta["version"] < 6 and not spec.discrete and maps_box_otherwise_than_before(
                    spec.action_low, spec.action_high):
                warnings.warn(f"{resume!r} was written by a jes that gave env {spec.name!r}'s actions (a Box with some "
                              f"bounds infinite) the raw policy outputs; this jes maps each dimension by its own "
                              f"bounds (CHANGELOG.md), so the resumed run is not the run it continues", stacklevel=2)
            state = restored.restore_state(trainer, checked=jax.process_count() == 1)  # checked above with one
            history, key = restored.history, restored.key
            problem = _history_problem(history)
            if problem is not None:  # (it failed once the first generation had run: a KeyError, a TypeError)
                raise checkpoint.CheckpointError(f"checkpoint {resume} cannot be resumed: its history {problem}; jes "
                                                 f"writes one 1-d array of numbers for each of {', '.join(HISTORY_KEYS)}. "
                                                 f"The file was edited or is corrupt: use an earlier checkpoint")
            best = _best_from_checkpoint(trainer, restored.best)
            state = _apply_new_learning_rate(trainer, state, restored.meta["config"].get("learning_rate"), resume)
            _warn_unchecked_on_resume(optimizer, config, resume)
            done = int(fetch(state.generation))
            if done >= config.num_generations:
                warnings.warn(f"{resume!r} is at generation {done}, and num_generations={config.num_generations}: there is "
                              f"nothing left to train (the result is the checkpoint's); raise num_generations "
                              f"(jes train: --generations) to continue the run", stacklevel=2)
        else:
            state, best = trainer.init_state(key), None
            if master is None and not num_workers and not trainer.spec.host and primary:
                _warn_idle_devices(trainer)
                _warn_serial_chunks(trainer)
        if jax.process_count() > 1:
            log_dir = _from_process_0(log_dir)  # its auto name has process 0's clock in it
            checkpoint_path = _from_process_0(checkpoint_path)
            lock = _lock_checkpoint(checkpoint_path, resuming=resume is not None)
            refuse_to_write()
        # Listening (a secret, a free port) is checked before any log file exists: a refused master leaves nothing.
        if master is not None:
            _check_workers_can_rebuild(trainer, f"master={master!r}")
            server = Master(trainer, master, secret=secret, env=env, optimizer=optimizer, env_params=env_params,
                            **(master_options or {}))
        # In a multi-process run process 0 alone reports (and writes; see run()).
        earlier = [float(x) for x in (history or {}).get("pop_max", ()) if math.isfinite(float(x))]
        loggers = [jes_logging.ProgressBar(config.num_generations, int(fetch(state.generation)),
                                           enabled=progress if primary else False, best=max(earlier, default=-math.inf))]
        if log_dir is not None and primary and resume is None and jes_logging.has_logged_scalars(log_dir):
            if own_checkpoint:  # stopped before its first checkpoint, started again: nothing to pass differently
                warnings.warn(f"log_dir {log_dir!r} holds the TensorBoard event files of an earlier start of this run "
                              f"that saved no checkpoint (stopped before its first); it starts again, its curves "
                              f"beside those (jes plot draws each start apart)", stacklevel=2)
            else:
                warnings.warn(f"log_dir {log_dir!r} already holds the TensorBoard event files of an earlier run; this "
                              f"run's go beside them, and TensorBoard (and jes.logging.read_scalars) will show both: "
                              f"pass a new log_dir, or resume= that run's checkpoint to continue it", stacklevel=2)
        if log_dir is not None and primary and not nothing_left:  # (nothing to log: no event file)
            hparams = dict(run_hparams(trainer, config, optimizer), strategy=trainer.strategy.describe(),
                           num_params=trainer.num_params, key=str(np.asarray(jax.random.key_data(as_key(key))).tolist()))
            centres = [float(x) for x in (history or {}).get("centre_return", ()) if math.isfinite(float(x))]
            purge_from, again = (int(fetch(state.generation)) + 1, None) if resume is not None else (None, None)
            if resume is not None:
                # A session that completed at the checkpoint's generation (stopped by StopTraining, or given more
                # generations now) wrote its final metrics there: the marker goes at that step, dropping them (a
                # "final" curve of two points otherwise), and the generation's own scalars are written again
                row = _last_record(history, purge_from - 1)
                if row is not None and jes_logging.final_metrics_at(log_dir, purge_from - 1):
                    purge_from, again = purge_from - 1, row
            loggers.append(jes_logging.TensorBoardLogger(
                log_dir, hparams, best_centre=max(centres, default=-math.inf), purge_from=purge_from, again=again))
    except BaseException as err:
        try:
            trainer.finish_compiling()
            if server is not None:
                server.close()
        finally:  # even if those raise: a lock left held would refuse every later run on it in this process
            try:
                if lock is not None:
                    lock.release()
            finally:
                _end_if_terminated(taking_sigterm, "train", err, resume)
        raise
    try:
        if num_workers and not nothing_left:  # (nothing left: no workers to start, compile and wait for)
            _check_workers_can_rebuild(trainer, f"num_workers={num_workers}", local=True)
            local_secret = new_secret()
            try:
                server = Master(trainer, "127.0.0.1:0", secret=local_secret, env=env, optimizer=optimizer,
                                env_params=env_params, **{**LOCAL_MASTER_OPTIONS, **(master_options or {})})
            except DescriptionError as err:
                raise ValueError(f"num_workers={num_workers}: worker processes rebuild the run from plain data, but "
                                 f"{err}. Make that part plain data (an env by its registered id, e.g. "
                                 f"'gymnasium:CartPole-v1'; an optimizer by name; constant settings), or use "
                                 f"num_workers=0") from err
            # The workers are this process's own children: they may build the policy class this process runs
            own = describe.own_modules(server.description)
            env_id = getattr(trainer.spec.env, "env_id", None) if trainer.spec.host else None
            registering = gymnasium_envs.registering_module(env_id) if env_id is not None else None
            server_key = server.curve_public_key.decode("ascii") if server.own_server_key else None
            with server, LocalWorkers(f"127.0.0.1:{server.port}", local_secret, num_workers, allow_modules=own,
                                      imports=(registering,) if registering else (), curve_server_key=server_key):
                ready = server.wait_for_workers(state, num_workers, timeout=LOCAL_WORKERS_TIMEOUT, only_these=True)
                if ready < num_workers:
                    warnings.warn(f"num_workers={num_workers}: {ready} local worker(s) became ready (the others "
                                  f"refused the run or were not ready within {LOCAL_WORKERS_TIMEOUT:.0f} s; their "
                                  f"errors, if any, are logged above); the run goes on with them and evaluates the "
                                  f"rest in this process (same bits)", stacklevel=2)
                return ran(_run(trainer, state, key=key, callbacks=[*loggers, *callbacks], history=history,
                               checkpoint_path=checkpoint_path, checkpoint_every=checkpoint_every,
                               step_fn=server.step, log_dir=log_dir, best=best, started=started,
                               resumed_from=resume))
        if server is not None:
            with server:
                return ran(_run(trainer, state, key=key, callbacks=[*loggers, *callbacks], history=history,
                               checkpoint_path=checkpoint_path, checkpoint_every=checkpoint_every,
                               step_fn=server.step, log_dir=log_dir, best=best, started=started,
                               resumed_from=resume))
        return ran(_run(trainer, state, key=key, callbacks=[*loggers, *callbacks], history=history,
                       checkpoint_path=checkpoint_path, checkpoint_every=checkpoint_every, log_dir=log_dir, best=best,
                       started=started, resumed_from=resume))
    except BaseException as err:
        failed = err
        trainer.finish_compiling()  # a failure before the step was compiled (already joined after it)
        ran.interrupted(err)
        raise
    finally:
        try:
            # A logger that cannot close (its disk full) is warned of: the error in flight, which carries the run so far
            # and its checkpoint, goes on, and a run that finished returns its result (saved; only logs are missing)
            # Completed: the run reached its end (its result returned, or a Ctrl-C or an error during its final
            # checkpoint's save, after which a resume has nothing left to write them)
            completed = ran.result is not None or getattr(failed, "_jes_reached_end", False)
            jes_logging.close_all(loggers, warn=True, completed=completed)
        except KeyboardInterrupt as interrupt:  # a Ctrl-C while the logs close
            ran.interrupted(interrupt)
            _carry_run_over(failed, interrupt)
            failed = interrupt
            raise
        except Exception as err:  # that warning raised as an error (-W error): it must not replace the run's error
            if failed is None:
                raise
            if hasattr(failed, "add_note"):
                failed.add_note(f"(closing the logs also failed: {type(err).__name__}: {err})")
        finally:
            try:
                if lock is not None:
                    lock.release()
            finally:
                _end_if_terminated(taking_sigterm, "train", failed, resume,
                                   finished=(ran.result.checkpoint_path or "") if ran.result is not None else None)


def run_hparams(trainer: Trainer, config: ESConfig, optimizer: Any) -> dict:
    """The hyperparameters a run of ``trainer`` with ``config`` and ``optimizer`` (as given) runs with, for its
    TensorBoard table and HPARAMS entry: ``config.to_dict()`` with its defaults resolved (the learning rate, chunk
    size, episode length, mirrored sampling and observation normalisation the run uses), the env, the policy with
    its fields and the optimizer's name. (The config as passed recorded ``learning_rate None``, ``chunk_size None``
    and the policy's class alone: runs that differed in those looked the same in TensorBoard's HPARAMS view.)"""
    hparams = config.to_dict()
    learning_rate = run_learning_rate(trainer.strategy, optimizer, config, trainer.num_params)
    if learning_rate is not None and not callable(learning_rate):  # a schedule stays as the config shows it
        hparams["learning_rate"] = float(learning_rate)
    hparams.update(chunk_size=trainer.chunk_size, max_episode_steps=trainer.spec.max_steps,
                   antithetic=bool(trainer.antithetic), normalize_observations=bool(trainer.normalize_observations))
    policy = trainer.policy

    def text(value: Any) -> str:  # activation=tanh, not the repr of a jitted function; a submodule on one line
        return value.__name__ if callable(value) and hasattr(value, "__name__") else " ".join(repr(value).split())

    fields = ", ".join(f"{f.name}={text(getattr(policy, f.name))}" for f in dataclasses.fields(policy)
                       if f.init and f.name not in ("parent", "name")) if dataclasses.is_dataclass(policy) else "..."
    return dict(hparams, env=trainer.spec.name, policy=f"{type(policy).__name__}({fields})",
                optimizer=trainer.optimizer_name or "")


# Other libraries' names for train's arguments and ESConfig's fields (difflib's nearest name is not always the one meant:
# population -> perturbation)
KEYWORD_SYNONYMS = {"population": "num_members", "popsize": "num_members", "pop_size": "num_members",
                    "population_size": "num_members", "generations": "num_generations", "sigma": "noise_std",
                    "sigma_init": "noise_std", "lr": "learning_rate", "seed": "key", "checkpoint": "checkpoint_path",
                    "workers": "num_workers", "episodes": "episodes_per_member", "rank": "perturbation_rank"}


def check_keywords(overrides: dict, function: Callable) -> None:
    """Refuse keywords that are neither ``function``'s own nor ESConfig fields, naming the nearest of either (a trial:
    ``checkpoint="x"`` listed only ESConfig's fields, not ``checkpoint_path``)."""
    fields = [f.name for f in dataclasses.fields(ESConfig)]
    unknown = sorted(set(overrides) - set(fields))
    if not unknown:
        return
    import difflib
    import inspect

    own = [name for name, p in inspect.signature(function).parameters.items() if p.kind is p.KEYWORD_ONLY
           or p.kind is p.POSITIONAL_OR_KEYWORD]
    hints = []
    for name in unknown:
        near = ([KEYWORD_SYNONYMS[name]] if KEYWORD_SYNONYMS.get(name) in own + fields else
                difflib.get_close_matches(name, own + fields, n=1, cutoff=0.6) or
                [candidate for candidate in own + fields if candidate.startswith(name) or name in candidate][:1])
        hints.append(f"{name!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    raise TypeError(f"jes.{function.__name__}() got unknown keyword argument(s) {', '.join(hints)}: it takes its own "
                    f"({', '.join(own)}) and ESConfig's fields ({', '.join(fields)})")


def _check_workers_can_rebuild(trainer: Trainer, how: str, local: bool = False) -> None:
    """Refuse a Python env that worker processes cannot rebuild (they rebuild it from its registered id); ``local``:
    jes's own worker processes, which import no ``__main__`` (a remote worker's ``--import`` may register the id)."""
    if not trainer.spec.host:
        return
    env_id = getattr(trainer.spec.env, "env_id", "")
    if env_id is None:
        raise ValueError(f"{how}: worker processes rebuild a Python env from its registered id, and env "
                         f"{trainer.spec.name!r} is your own class, instance or factory, which cannot travel to "
                         f"them: pass it by a registered id ('gymnasium:<id>', registered where every worker "
                         f"imports it), or run without workers")
    if local and env_id and gymnasium_envs.entry_point_module(env_id) == "__main__":
        # (the workers started, compiled, each refused the id, and the run went on on the master alone, warned)
        raise ValueError(f"{how}: worker processes rebuild a Python env from its registered id, and {env_id!r} is "
                         f"registered with an entry point in your script or notebook (__main__), which they do not "
                         f"run: register it in a module of yours (gymnasium.register(..., entry_point='mymodule:"
                         f"MyEnv')), imported by the workers too (jes train --import mymodule), or run without "
                         f"workers")


def _unwritable_problem(log_dir: str | None, checkpoint_path: str | None, resume: str | None) -> str | None:
    """Why the run could not write its logs or checkpoint (``None``: it can), found before anything trains: a file is
    created in (and removed from) the folder each goes in, or the nearest folder above it that exists (the run
    makes the rest)."""
    remedies = {
        "log_dir": "pass a log_dir in a folder you can write (jes train: --log-dir DIR), or log_dir=None (--log-dir "
                   "none) to log nothing; nothing has trained yet",
        "checkpoint": "pass a checkpoint_path in a folder you can write (jes train: --checkpoint PATH), or "
                      "checkpoint_path=None (--checkpoint none) to run without one; nothing has trained yet",
    }
    targets = [("log_dir", log_dir, log_dir)] if log_dir is not None else []
    if checkpoint_path is not None:
        targets.append(("checkpoint", checkpoint_path, os.path.dirname(os.path.abspath(checkpoint_path))))
    for what, path, folder in targets:
        name = f"{what} {path!r}" + (" (the resumed checkpoint, which the run goes on writing)"
                                     if what == "checkpoint" and path == resume else "")
        problem = folder_problem(folder)
        if problem is not None:
            return f"{name} cannot be written: {problem[2]}; {remedies[what]}"
    return None


def _overwrite_problem(checkpoint_path: str, resume: str | None) -> str | None:
    """Why a run must not start: its checkpoint file would replace another run's (a second ``jes.train`` with the
    same ``log_dir``), which could then no longer be resumed, evaluated or read. ``None``: nothing is there."""
    if not os.path.exists(checkpoint_path):
        return None
    if os.path.isdir(checkpoint_path):  # (it said "a file this run did not write ... delete that file", a trial)
        return (f"checkpoint {checkpoint_path!r} is a folder, not a checkpoint file: give checkpoint_path the file's "
                f"path (jes train: --checkpoint {os.path.join(checkpoint_path, 'checkpoint.ckpt')}), or give the "
                f"folder as the run's log_dir (--log-dir {checkpoint_path}), whose checkpoint.ckpt is the default")
    if resume is not None and os.path.exists(resume) and os.path.samefile(checkpoint_path, resume):
        return None  # the run it continues
    remedy = "pass another log_dir (or checkpoint_path), or delete that file to start over"
    try:
        earlier = checkpoint.read(checkpoint_path)
    except (checkpoint.CheckpointError, OSError):  # whatever it holds, it is not this run's to replace
        return (f"checkpoint {checkpoint_path!r} already holds a file this run did not write, which this run would "
                f"overwrite: {remedy}")
    return (f"checkpoint {checkpoint_path!r} already holds a checkpoint of another run (env {earlier.env_name!r}, "
            f"generation {earlier.generation}), which this run would overwrite: continue that run with "
            f"resume={checkpoint_path!r}, {remedy}")


def _warn_idle_devices(trainer: Trainer) -> None:
    """Warn when the default chunk makes the whole population one chunk on several devices (a fresh run on local or
    ``jax.distributed`` devices): a chunk runs on one device, a low-rank chunk holds up to 2,048 members, and the
    CLI makes one CPU device per core. With two chunks or more, whether smaller chunks pay is the machine's say."""
    devices, members = len(trainer.devices), trainer.config.num_members
    if trainer.config.chunk_size is not None or trainer.num_chunks > 1 or devices < 2:
        return
    spread = trainer.fit_chunk_size(math.ceil(members / devices))
    if spread >= trainer.chunk_size:  # too few members (or mirrored pairs) to split
        return
    warnings.warn(
        f"{devices} devices, but the population's {members} members make 1 chunk of {trainer.chunk_size} (the "
        f"default chunk for this policy and perturbation), and a chunk runs on one device: {devices - 1} device(s) "
        f"will sit idle. chunk_size={spread} (jes train: --chunk-size {spread}) spreads the members over "
        f"{math.ceil(members / spread)} devices; the chunk size decides the results' bits, so keep it the same "
        f"across the runs you compare", stacklevel=3)


def _warn_serial_chunks(trainer: Trainer) -> None:
    """Warn when the default chunk gives an accelerator (GPU, TPU) several chunks to run one after another: the
    default is sized for CPU caches and never depends on the machine (the chunk size decides the bits), while an
    accelerator runs one wide chunk faster than several narrow ones (issue 23, on an H200: MLP 1024x1024, r = 1,
    4,096 members, seeds 0-4: 8 chunks of 512 at 0.23x batch inference, one chunk of 4,096 at 0.60x)."""
    devices, members = trainer.devices, trainer.config.num_members
    if trainer.config.chunk_size is not None or devices[0].platform == "cpu" or trainer.num_chunks <= len(devices):
        return
    wide = trainer.fit_chunk_size(math.ceil(members / len(devices)))
    warnings.warn(
        f"the population's {members} members make {trainer.num_chunks} chunks of {trainer.chunk_size} (the default "
        f"chunk for this policy and perturbation, sized for CPU caches) on {len(devices)} {devices[0].platform} "
        f"device(s), and a device runs its chunks one after another. chunk_size={wide} (jes train: --chunk-size "
        f"{wide}) gives each device one chunk, if its memory holds it (a low-rank chunk's draws, a full-rank chunk's "
        f"members x parameters floats), which ran faster on a GPU; the chunk size decides the results' bits, so keep "
        f"it the same across the runs you compare", stacklevel=3)


def _best_from_checkpoint(trainer: Trainer, saved: dict | None) -> BestMember | None:
    """The :class:`BestMember` a checkpoint kept (``None`` for checkpoints written before it kept one)."""
    if not saved:
        return None
    stats = saved.get("obs_stats")
    stats = tuple(stats[str(i)] for i in range(3)) if stats else None
    flat = np.asarray(saved["flat_params"], np.float32)
    policy = _policy_of(trainer, flat, stats)
    return BestMember(fitness=float(saved["fitness"]), generation=int(saved["generation"]), member=int(saved["member"]),
                      flat_params=flat, policy=policy)


def _check_same_run(trainer: Trainer, key: Any, resume: str | None) -> None:
    """Every process of a multi-process run must run the same run: a per-process seed, learning rate or checkpoint
    (a habit from data-parallel training) would mix the processes' runs into a result that is none of them, or
    fail inside JAX. Each part of the run is hashed, the hashes all-gathered and compared with process 0's."""
    import hashlib
    import json

    from jax.experimental import multihost_utils

    parts = dict(checkpoint.describe_run(trainer))
    parts["key"] = np.asarray(jax.random.key_data(as_key(key))).tolist() if resume is None else "from the checkpoint"
    parts["resume"] = None  # every process hashes the same fields: the all-gather needs equal shapes
    if resume is not None:
        try:
            with open(resume, "rb") as f:
                parts["resume"] = hashlib.sha256(f.read()).hexdigest()
        except OSError as err:  # not raised here: the others would wait in the all-gather for this process
            parts["resume"] = f"unreadable: {err}"
    names = sorted(parts)
    # A schedule or a lambda is described by its repr, whose memory address differs from process to process.
    text = lambda value: re.sub(r" at 0x[0-9a-fA-F]+", "", json.dumps(value, sort_keys=True, default=str))
    digest = lambda value: np.frombuffer(hashlib.sha256(text(value).encode()).digest()[:8], np.uint32)
    mine = np.stack([digest(parts[name]) for name in names])  # [fields, 2]
    everyone = np.asarray(multihost_utils.process_allgather(mine))  # [processes, fields, 2]
    # The count each process was launched with (`jes launch --processes`, per host): JAX takes the coordinator's
    # and ignores the others, so a host's wrong count went unnoticed. 0: not launched with one.
    launched = np.array([int(os.environ.get(jax_runtime.ENV_NUM_PROCESSES, "0") or 0)], np.int32)
    counts = np.asarray(multihost_utils.process_allgather(launched)).reshape(-1).tolist()
    wrong = [(p, c) for p, c in enumerate(counts) if c and c != jax.process_count()]
    if wrong:
        said = "; ".join(f"process {p} was launched as one of {c}" for p, c in wrong)
        raise ValueError(f"the processes of this jax.distributed run were launched with different process counts "
                         f"({said}, but the run has {jax.process_count()} processes): give every host's `jes launch` "
                         f"the same --processes")
    differing = {p: [n for i, n in enumerate(names) if not np.array_equal(everyone[p, i], everyone[0, i])]
                 for p in range(everyone.shape[0])}
    differing = {p: fields for p, fields in differing.items() if fields}
    if differing:
        names_of = lambda f: f[0] if len(f) == 1 else f"{', '.join(f[:-1])} and {f[-1]}"
        listed = "; ".join(f"process {p}'s {names_of(f)} {'differs' if len(f) == 1 else 'differ'} from process 0's"
                           for p, f in differing.items())
        raise ValueError(f"the processes of this jax.distributed run were given different runs ({listed}): "
                         f"every process must run the same command, with the same key, "
                         f"settings and --resume checkpoint (a per-process seed would mix the processes' runs into "
                         f"one that is none of them)")


def _from_process_0(text: str | None) -> str | None:
    """Process 0's value of a short host string, in every process of a multi-process run."""
    from jax.experimental import multihost_utils

    data = np.zeros(4097, np.uint8)  # [is None, utf-8 bytes...]
    if text is None:
        data[0] = 1
    else:
        raw = text.encode()[:4096]
        data[1:1 + len(raw)] = np.frombuffer(raw, np.uint8)
    data = np.asarray(multihost_utils.broadcast_one_to_all(data))
    return None if data[0] else bytes(data[1:]).rstrip(b"\0").decode()


def _resumed_learning_rate(config: ESConfig, restored: checkpoint.Checkpoint) -> ESConfig:
    """``config`` for a resume of ``restored``: given no ``learning_rate`` (``None``), the run goes on at its file's, as
    ``jes train --resume`` does (``None`` is the optimizer's default, which made another run of it from here on)."""
    ran = restored.meta["config"].get("learning_rate")
    if config.learning_rate is not None or ran is None or "learning_rate" in restored.meta["config_schedules"]:
        return config
    try:
        return config.replace(learning_rate=ran)
    except (TypeError, ValueError):  # a value no config takes (an edited file): the resume's checks name it
        return config


def _apply_new_learning_rate(trainer: Trainer, state: TrainState, old: Any, path: str) -> TrainState:
    """A resumed run with another ``learning_rate``: warn, and put it into the optimizer state.

    Named optimizers keep their rate in ``opt_state.hyperparams`` (``optax.inject_hyperparams``), so the
    restored state would otherwise go on with the old one. Rates are compared as the run uses them, defaults
    resolved: ``learning_rate=0.2`` resuming a run on adam's default 0.2 is the same run, and says nothing.
    """
    new = trainer.config.learning_rate
    if callable(new) or callable(old) or new == old:
        return state
    opt_state = getattr(state.strategy, "opt_state", None)
    hyperparams = getattr(opt_state, "hyperparams", None)
    if not isinstance(hyperparams, dict) or "learning_rate" not in hyperparams:  # a strategy reading it from its context
        warnings.warn(f"resuming {path} with learning_rate={new} (the run used {old}); the remaining generations "
                      f"differ from an uninterrupted run", stacklevel=3)
        return state
    fresh = trainer.init_state(0).strategy.opt_state.hyperparams["learning_rate"]
    ran, now = (float(np.asarray(fetch(rate))) for rate in (hyperparams["learning_rate"], fresh))
    if ran == now:  # one rate, given on one side and the default on the other: the run goes on as it was
        return state
    named = lambda given, rate: f"{given}" if given is not None else f"{rate:.4g}, its default"
    warnings.warn(f"resuming {path} with learning_rate={named(new, now)} (the run used {named(old, ran)}); the "
                  f"remaining generations differ from an uninterrupted run", stacklevel=3)
    opt_state = opt_state._replace(hyperparams=dict(hyperparams, learning_rate=fresh))
    return trainer.place(state.replace(strategy=state.strategy.replace(opt_state=opt_state)))


def _warn_unchecked_on_resume(optimizer: Any, config: ESConfig, path: str) -> None:
    """A resumed run given an optax object or a schedule: warn once that it cannot be checked against the run's.

    A checkpoint records an optax object by its type name and a schedule by its field's name only, so another
    ``optax.adam(1e-4)`` or another schedule would pass :meth:`jes.checkpoint.Checkpoint.check_compatible`.
    """
    unchecked = [f"optimizer={type(optimizer).__name__} (an optax object)"] if (
        optimizer is not None and not isinstance(optimizer, str)) else []
    unchecked += [f"{f.name} (a schedule)" for f in dataclasses.fields(config) if callable(getattr(config, f.name))]
    if unchecked:
        warnings.warn(f"resuming {path} with {', '.join(unchecked)}: jes cannot check that "
                      f"{'it is' if len(unchecked) == 1 else 'they are'} the run's own (it records an optax object's "
                      f"type and a schedule's name only); the resumed run continues with the checkpoint's optimizer "
                      f"state, and a different {'one' if len(unchecked) == 1 else 'one of them'} makes it differ from "
                      f"the run it continues", stacklevel=3)


def _check_checkpoint_every(checkpoint_every: Any) -> None:
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, (int, np.integer)) or checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be an integer >= 0 (generations between checkpoints; 0: only at the "
                         f"end and on Ctrl-C), got {checkpoint_every!r}")


StepFn = Callable[[TrainState, bool, bool], "tuple[TrainState, dict]"]


def run(trainer: Trainer, state: TrainState, *, key: Any = None, callbacks: Iterable[Callback] = (),
        history: dict | None = None, num_generations: int | None = None, step_fn: StepFn | None = None,
        checkpoint_path: str | None = None, checkpoint_every: int = 0, log_dir: str | None = None,
        best: BestMember | dict | None = None, started: float | None = None) -> TrainResult:
    """Host loop: call the generation step until ``num_generations`` (default: config's) are done.

    Args:
        trainer: the trainer whose compiled step runs.
        state: the state to continue from (fresh, or restored).
        key: the run key ``state`` was initialised from, which the result records (``jes.train(key=result.key)``
            reproduces the run). ``None`` (the default): the state's own, which ``trainer`` remembers for each state its
            ``init_state`` made, a checkpoint restored into it or ``jes.run`` returned (the latest 1,024 such
            states); any other state needs it given (``key=result.key`` of the run it continues). A key the state
            was not initialised from is refused (the state holds ``split(run key)[1]``, which tells).
        callbacks: called with each generation's metrics record.
        history: history of earlier generations, when continuing a run. Without it, a state past generation 0
            starts a new history at its next generation (``env_steps`` counted from 0), and ``best`` is the best of
            the generations run here: a warning says so and what to pass.
        num_generations: total generations (including those already in ``state``).
        step_fn: replaces the local compiled step, ``(state, evaluate_centre, evaluate_population) -> (state,
            metrics)`` with the same metrics and the same contract (the centre evaluated is the state passed in's;
            see :meth:`jes.generation.Generation.generation_step`); a distributed master farms the population
            out through it.
        checkpoint_path: where to save checkpoints (``jes.checkpoint``): every ``checkpoint_every``
            generations (0: never periodically), after the last generation, and on KeyboardInterrupt
            (then re-raised) or SIGTERM (as :func:`train`). ``None``: no checkpoints. The run holds its lock while
            it runs (see :func:`train`).
        checkpoint_every: generations between periodic checkpoints to ``checkpoint_path`` (0, the default: none;
            the other saves happen anyway). A non-negative int, checked before the first generation.
        log_dir: where the run's logs go (only recorded in the result and its summary).
        best: the best member of the generations before ``state``: a resumed run's, as its checkpoint keeps it
            (``jes.checkpoint.read(path).best``, a dict, or a :class:`BestMember`). Without it a resumed run's best
            member is the best of the generations it runs, and its checkpoint keeps that one instead.
        started: ``time.perf_counter()`` when the run began (the result's ``wall_time`` counts from it; default: now).
            :func:`train` passes its own start, so the trainer's build and the step's compile, begun there, count.

    Raises:
        ValueError: ``key`` is not the key ``state`` was initialised from, or is not given and ``trainer`` does not
            know the state's (both before anything runs).
        jes.checkpoint.CheckpointInUseError: another run is writing ``checkpoint_path`` (it holds the lock beside it,
            ``<checkpoint_path>.jes-lock``, which this run holds while it runs), before anything runs.
    """
    _check_checkpoint_every(checkpoint_every)
    key = _state_run_key(trainer, state, key)
    generation = int(fetch(state.generation))
    if history is None and generation > 0:
        warnings.warn(f"jes.run: the state is at generation {generation} and no history= was given, so the result's "
                      f"history starts at generation {generation + 1} with env_steps counted from 0, and its best "
                      f"member is the best of the generations run here; to continue a run pass "
                      f"history=result.history, best=result.best (a checkpoint's: history=ckpt.history, "
                      f"best=ckpt.best)", stacklevel=2)
    if isinstance(best, dict):  # a checkpoint's own record of it
        best = _best_from_checkpoint(trainer, best)
    lock, failed, result = None, None, None
    taking_sigterm = interrupts.SigtermAsInterrupt(unless_handled=True)  # as jes.train takes it
    try:  # (the lock inside the try: an interrupt right after it was taken still releases it)
        _take_sigterm(taking_sigterm)
        lock = _lock_checkpoint(checkpoint_path)
        result = _run(trainer, state, key=key, callbacks=callbacks, history=history, num_generations=num_generations,
                    step_fn=step_fn, checkpoint_path=checkpoint_path, checkpoint_every=checkpoint_every,
                    log_dir=log_dir, best=best, started=started)
        return result
    except BaseException as err:
        failed = err
        raise
    finally:
        try:
            if lock is not None:
                lock.release()
        finally:
            _end_if_terminated(taking_sigterm, "run", failed,
                               finished=(result.checkpoint_path or "") if result is not None else None)


def _es_key_data(run_key: Any) -> np.ndarray:
    """The key data of the ES key a state initialised from ``run_key`` holds (:meth:`Trainer.fresh_state`)."""
    return np.asarray(jax.random.key_data(jax.random.split(as_key(run_key))[1]))


def _key_text(key: Any) -> str:
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return str(int(key))
    try:
        return f"key data {np.asarray(jax.random.key_data(as_key(key))).tolist()}"
    except Exception:  # noqa: BLE001 - not a key at all: as_key's own error is raised where it is used
        return repr(key)


def _same_key(a: Any, b: Any) -> bool:
    """Whether two run keys are the same as given (equal int seeds, or typed keys or key data with the same data),
    nothing derived; ``False`` may still be the same key in another form (a seed and its typed key)."""
    seeds = [isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in (a, b)]
    if any(seeds):
        return all(seeds) and int(a) == int(b)
    try:
        dtypes = [k.dtype if hasattr(k, "dtype") else np.asarray(k).dtype for k in (a, b)]
        typed = [jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key) for dtype in dtypes]
        if typed[0] != typed[1] or (typed[0] and jax.random.key_impl(a) != jax.random.key_impl(b)):
            return False
        data = [np.asarray(jax.random.key_data(k) if t else k) for k, t in zip((a, b), typed)]
        return data[0].dtype == data[1].dtype and data[0].shape == data[1].shape and np.array_equal(*data)
    except Exception:  # noqa: BLE001 - not keys of one kind: told by deriving
        return False


def _state_run_key(trainer: Trainer, state: TrainState, key: Any) -> Any:
    """The run key ``state`` was initialised from: ``key`` checked against it, or (``None``) the one ``trainer``
    remembered for the state's ES key (:meth:`Trainer.note_run_key`: a state it made, restored or returned). A state
    holds only ``split(run key)[1]``, which tells a key but cannot give one: a ``key`` the trainer does not already
    know for the state is derived, once, to check it."""
    own = trainer.known_run_key(state)
    if key is None:
        if own is None:
            raise ValueError("jes.run cannot tell this state's run key (it was not made by this trainer's init_state, "
                             "restored into it from a checkpoint, nor returned by a jes.run of it), which the result "
                             "records for jes.train(key=result.key) to reproduce the run: pass key=, the key it was "
                             "initialised from (result.key of the run it continues, or its checkpoint's key)")
        return own
    if own is not None and _same_key(own, key):
        return key
    held = np.asarray(fetch(jax.random.key_data(state.es_key)))
    if not np.array_equal(_es_key_data(key), held):
        theirs = f"it was initialised from {_key_text(own)}" if own is not None else "its own key is not known here"
        raise ValueError(f"jes.run: key={_key_text(key)} is not the run key of this state ({theirs}): the result "
                         f"would record a key that does not reproduce the run; pass the key the state was initialised "
                         f"from, or leave key= out for a state of this trainer's init_state, a checkpoint's, or a "
                         f"result's")
    return key


def _run(trainer: Trainer, state: TrainState, *, key: Any = 0, callbacks: Iterable[Callback] = (),
         history: dict | None = None, num_generations: int | None = None, step_fn: StepFn | None = None,
         checkpoint_path: str | None = None, checkpoint_every: int = 0, log_dir: str | None = None,
         best: BestMember | None = None, started: float | None = None, resumed_from: str | None = None) -> TrainResult:
    """:func:`run` once its checkpoint is locked (:func:`train` holds the lock from before the step's compile);
    ``resumed_from``: the checkpoint :func:`train` resumed, which holds the run as it starts."""
    # In a multi-process run only process 0 writes the checkpoint (every process computes the same state).
    save_to = checkpoint_path if jax.process_index() == 0 else None

    cfg = trainer.config
    total = cfg.num_generations if num_generations is None else num_generations
    history = {k: list(v) for k, v in (history or {}).items()} or {k: [] for k in HISTORY_KEYS}
    start_gen = int(fetch(state.generation))
    env_steps = int(history["env_steps"][-1]) if history.get("env_steps") else 0
    solved_return = cfg.stop_at_return if cfg.stop_at_return is not None else trainer.spec.solved_return
    solved_generation = _first_solved(history, solved_return)
    if solved_generation is not None and cfg.stop_at_return is not None:
        if total > start_gen:  # a resumed run that had already stopped at its target stays stopped: say so
            warnings.warn(f"the run reached stop_at_return={cfg.stop_at_return:g} at generation {solved_generation} "
                          f"(its history), so it trains no more generations; to continue, raise stop_at_return or pass "
                          f"stop_at_return=None (jes train: --stop-at-return none, or a higher value)", stacklevel=3)
        total = start_gen
    t_start = time.perf_counter() if started is None else started

    state = trainer.place(state)
    own_host = None  # a Python simulator's generation made here: its env instances closed when the run ends
    finished, late_interrupt = False, None  # (a Ctrl-C while they close, after the run finished)
    if step_fn is None and trainer.spec.host and start_gen < total:
        own_host = HostGeneration(trainer)
        step_fn = own_host.step  # a Python simulator: envs stepped here, the update compiled
    if step_fn is None and start_gen >= total:  # nothing left to train: nothing to compile (the step is never called)
        step_fn, compile_time = None, 0.0
    elif step_fn is None:
        try:
            compiled, compile_time = trainer.compiled_step(state)
        except KeyboardInterrupt as interrupt:  # while compiling: the run as it started (fresh, or the checkpoint's)
            held = resumed_from if resumed_from is not None and os.path.isfile(resumed_from) else None
            _attach_result(interrupt, lambda: _result(trainer, state, history, key, solved_generation, 0.0, t_start,
                                                      best, held, log_dir))
            if getattr(interrupt, "result", None) is not None:
                interrupt.result._checkpointing = checkpoint_path is not None
            if held is not None:
                interrupt.checkpoint_path = held
            _note_interrupt(interrupt, start_gen, held, compiling=True)
            raise
        # Placed once like the state (in a multi-process run a host bool would be checked across processes each call).
        flags = {flag: jax.device_put(np.bool_(flag), trainer.replicated) for flag in (False, True)}
        step_fn = lambda s, centre, population: compiled(s, flags[bool(centre)], flags[bool(population)])
    else:
        compile_time = 0.0
    # A resumed run's wall_time goes on from its last row (the time between the sessions left out), never back to 0.
    loop_start = time.perf_counter() - (float(history["wall_time"][-1]) if history.get("wall_time") else 0.0)
    saved_generation = None
    best = best if best is not None and best.generation <= start_gen else None
    # `state` and `history` always agree: a generation's row is added with its centre evaluation, which the
    # step runs with the next generation's members (the centre of the state passed in), so the newest state
    # waits in `pending` until then. An interrupt saves `state`; a resumed run evaluates the rest again.
    pending = None  # (record, state after it, best-member candidate) of a generation awaiting its centre
    stopped = None  # a callback's StopTraining: the run ends after the generation it was given
    returned_values = set()  # the callbacks already warned of a returned value (once each per run)

    def mark_if_ended(err: BaseException) -> None:
        """Mark an error (or interrupt) that came once the run had reached its end (during its final checkpoint's
        save): :func:`train` closes its logs as completed, writing the final metrics, which its resume, with nothing
        left, would never write."""
        ended = stopped is not None or int(fetch(state.generation)) >= total or (
            cfg.stop_at_return is not None and solved_generation is not None)
        if ended:
            try:
                err._jes_reached_end = True
            except Exception:  # noqa: BLE001  an exception that takes no attributes: closed as interrupted
                pass

    def so_far(saved_in: str | None) -> TrainResult:
        """The run so far (what a checkpoint of ``state`` holds), for a notebook without one."""
        done = int(fetch(state.generation))
        rows = sum(1 for g in history["generation"] if g <= done)  # rows past the state: dropped, as saved
        kept = {k: v[:rows] for k, v in history.items()}
        return _result(trainer, state, kept, key, _first_solved(kept, solved_return), compile_time, t_start,
                       best, saved_in, log_dir)

    def save_checkpoint():
        nonlocal saved_generation
        # The logs as far as the checkpoint, before it: a killed run's curves go on where its resume starts
        jes_logging.flush_all(callbacks, int(fetch(state.generation)), saving=True)
        # A Ctrl-C (or jes train's SIGTERM) during the save is raised after it, once saved_generation says so.
        with interrupts.interrupts_deferred():
            try:
                checkpoint.save(save_to, trainer, localize(state), history, key, best=best)
            except OSError as err:  # a full disk, a folder made read-only: stop here, keeping what was trained
                raise _save_failed(err) from err
            saved_generation = int(fetch(state.generation))

    def _save_failed(err: OSError) -> CheckpointSaveError:
        done = int(fetch(state.generation))
        earlier = saved_generation  # this run's last good save, at save_to
        kept = (f"; the checkpoint there holds generation {earlier}, saved before" if earlier is not None else "")
        error = CheckpointSaveError(
            f"could not save the checkpoint {save_to!r} ({err.strerror or err}): training stopped at generation "
            f"{done} of {total}{kept}. error.result holds the {done} generation(s) completed: save them elsewhere "
            f"with jes.checkpoint.save(path, r.trainer, r.state, r.history, r.key, best=r.best) (then resume=path; "
            f"r.trainer is None once the error is pickled: pass jes.Trainer(policy, env, optimizer, config) of the "
            f"run) or r.save_policy(path)",
            generation=done, path=save_to, errno=err.errno, num_generations=total, reason=err.strerror or str(err))
        try:
            error.result = so_far(save_to if earlier is not None else None)
        except Exception:  # noqa: BLE001  the save's error goes on whatever making the result raised
            pass
        return error

    def commit(entry: tuple, centre_return: float, centre_steps: int) -> bool:
        """Add a generation's row (its centre now known), advance ``state``; True when the run stops here."""
        nonlocal state, best, env_steps, solved_generation, stopped
        record, after, candidate = entry
        generation_steps = record["env_steps"] + centre_steps
        env_steps += generation_steps
        record.update(centre_return=centre_return, centre_steps=centre_steps, env_steps=env_steps,
                      env_steps_per_second=generation_steps / max(record["generation_time"], 1e-9))
        for k in HISTORY_KEYS:
            history[k].append(record[k])
        # The callbacks (TensorBoard's writes) before the state advances: an interrupt among them leaves the run at the
        # generation before, which a resumed run steps and logs again, where after it the generation's row was saved
        # with some of its scalars never logged (a hole in the curves). The state after the history row, so an
        # interrupt never leaves history behind the state (a checkpoint drops rows past its state but cannot make up
        # a missing one).
        stop, error = call_callbacks(callbacks, record, returned_values)
        if error is not None and jax.process_count() == 1:
            raise error
        if jax.process_count() > 1:  # every process runs the callbacks: they stop together, if any says so (an
            # error is raised once the other processes have heard of it)
            stop = _stop_in_any_process(stop, error, record["generation"])
        state, best = after, candidate
        generation = record["generation"]
        if save_to is not None and checkpoint_every and generation % checkpoint_every == 0:
            save_checkpoint()
        if stop is not None:
            stopped = str(stop) or "StopTraining"
        if solved_generation is None and solved_return is not None and centre_return >= solved_return:
            solved_generation = generation
            return cfg.stop_at_return is not None or stop is not None
        return stop is not None

    offsets_unchecked = True
    try:
        for gen in range(start_gen, total + 1):
            interrupts.raise_if_terminated()  # a SIGTERM whose interrupt Python dropped (a gc callback's) stops it here
            population = gen < total
            if not population and pending is None:
                break
            t_gen = time.perf_counter()
            newest = state if pending is None else pending[1]
            new_state, metrics = step_fn(newest, pending is not None, population)
            metrics = {k: v.item() for k, v in fetch(metrics).items()}
            now = time.perf_counter()
            if offsets_unchecked and population and trainer.normalize_observations:  # once a session, on the host
                offsets_unchecked = False
                notice = offset_warning(*(fetch(x) for x in (new_state.obs_count, new_state.obs_sum,
                                                             new_state.obs_sumsq)))
                if notice is not None:
                    warnings.warn(f"env {trainer.spec.name!r}: {notice}", stacklevel=3)
            if pending is not None:
                entry, pending = pending, None
                if commit(entry, metrics["centre_return"], int(metrics["centre_steps"])):
                    break
            if not population:
                break
            if metrics["bad_member"] >= 0 or metrics["bad_update"]:
                # Keep what was achieved: the last good state goes to the checkpoint and into the error.
                unsaved = ""
                if save_to is not None:
                    try:
                        save_checkpoint()
                    except CheckpointSaveError as err:  # the non-finite values are the news; the run is in .result
                        unsaved = f" The checkpoint could not be saved ({err.reason})."
                partial = _result(trainer, state, history, key, solved_generation, compile_time, t_start, best,
                                  checkpoint_path if not unsaved else None, log_dir)
                if metrics["bad_member"] >= 0:
                    member = metrics["bad_member"]
                    raise NonFiniteFitnessError(
                        f"member {member} of generation {gen + 1} on env {trainer.spec.name!r} has non-finite fitness (NaN or inf); the update was "
                        f"not applied: an env reward or one of its policy outputs was NaN or inf (a too-large "
                        f"noise_std or learning rate can overflow them; so can unnormalised huge observations).{_variance_hint(trainer)} error.result holds the {gen} generation(s) completed.{unsaved}",
                        generation=gen + 1, member=member, result=partial,
                    )
                raise NonFiniteUpdateError(
                    f"the ES update of generation {gen + 1} is not finite (noise_std={metrics['noise_std']:g}, "
                    f"learning_rate={metrics['learning_rate']:g}) and was not applied. A noise_std schedule that reaches "
                    f"0, a too-large learning rate, or raw fitness that overflows cause this. error.result holds the "
                    f"{gen} generation(s) completed.{unsaved}",
                    generation=gen + 1, result=partial,
                )
            # The row's time is this call's; its env steps are its members' plus, once known, its centre's.
            record = dict(metrics, generation=gen + 1, wall_time=now - loop_start, generation_time=now - t_gen,
                          env_steps=int(metrics["env_steps"]))
            candidate = best
            if best is None or metrics["pop_max"] > best.fitness:
                # Kept as (the state before this generation's update, member); regenerated when first asked for.
                candidate = BestMember(fitness=float(metrics["pop_max"]), generation=gen + 1,
                                       member=int(metrics["best_member"]),
                                       regenerate=_member_regenerator(trainer, newest, int(metrics["best_member"])))
            pending = (record, new_state, candidate)
            if not evaluates_centre(gen + 1, total, cfg.eval_every):  # nothing to wait for
                entry, pending = pending, None
                if commit(entry, float("nan"), 0):  # (a callback's StopTraining)
                    break
        # Inside the try: an interrupt during the final save (seconds in a multi-process run, where the best member's
        # program compiles then) is raised once it is written, and one just before it still saves.
        if save_to is not None and saved_generation != int(fetch(state.generation)):
            save_checkpoint()
        finished = True
    except KeyboardInterrupt as interrupt:
        mark_if_ended(interrupt)
        try:
            # A second Ctrl-C (an impatient user, a launcher passing SIGTERM on) waits for the save, then is dropped:
            # this interrupt goes on, carrying the checkpoint and the run so far.
            with interrupts.interrupts_deferred():
                # The logs as far as the run so far, whether or not a save follows (the newest checkpoint may already
                # hold it): a generation interrupted among its callbacks is left out, as the resume logs it again.
                jes_logging.flush_all(callbacks, int(fetch(state.generation)))
                saved_in = None
                if save_to is not None:
                    try:
                        if saved_generation != int(fetch(state.generation)):
                            save_checkpoint()
                        saved_in = save_to
                    except CheckpointSaveError as err:  # the interrupt goes on, saying why no checkpoint was saved
                        interrupt.save_error = err
                        saved_in = save_to if saved_generation is not None else None  # an earlier one of this run
                    if saved_in is not None:
                        interrupt.checkpoint_path = saved_in  # `jes train` names it (an interrupt before here saved none)
                _attach_result(interrupt, lambda: so_far(saved_in))
                _note_interrupt(interrupt, int(fetch(state.generation)), saved_in, saved_generation,
                                getattr(interrupt, "save_error", None),
                                process_0_saves=checkpoint_path if save_to is None else None)
        except KeyboardInterrupt:
            pass
        raise
    except (NonFiniteFitnessError, NonFiniteUpdateError, CheckpointSaveError) as error:
        mark_if_ended(error)
        if not isinstance(error, CheckpointSaveError):  # (every process's metrics say it; process 0 alone saves)
            _stops_every_process(error)
        raise  # each saved what it could and carries the run so far
    except Exception as error:
        mark_if_ended(error)
        # A failure mid-run (a Python simulator that raised, a callback's bug, every device or worker lost): the run
        # so far is kept as an interrupt keeps it, the last good state saved and carried by the error (.result,
        # .checkpoint_path), so hours of training survive a simulator that crashes late.
        saved_in = None
        try:
            with interrupts.interrupts_deferred():
                if save_to is not None:
                    try:
                        if saved_generation != int(fetch(state.generation)):
                            save_checkpoint()
                        saved_in = save_to
                    except CheckpointSaveError as err:
                        error.save_error = err
                        saved_in = save_to if saved_generation is not None else None
                if saved_in is not None:
                    error.checkpoint_path = saved_in
                _attach_result(error, lambda: so_far(saved_in))
        except Exception:  # noqa: BLE001  the run's error goes on whatever keeping its state raised
            pass
        raise
    finally:
        if own_host is not None:  # (a notebook's runs left every run's instances open: MuJoCo renderers, EnvPool's threads)
            try:
                with interrupts.interrupts_deferred():  # raised once they are closed
                    own_host.close()
            except KeyboardInterrupt as interrupt:  # a Ctrl-C while they closed: never in place of the run's own error
                late_interrupt = interrupt if finished else None  # (or interrupt, which goes on as it was)
    result = _result(trainer, state, history, key, solved_generation, compile_time, t_start, best, checkpoint_path,
                     log_dir)
    result.stopped = stopped
    if late_interrupt is not None:  # the run finished, its checkpoint saved: it goes on with the interrupt
        late_interrupt.result = result
        late_interrupt._jes_reached_end = True  # train() closes its logs as completed (the final metrics written)
        if save_to is not None:
            late_interrupt.checkpoint_path = save_to
        _note_interrupt(late_interrupt, int(fetch(state.generation)), save_to,
                        process_0_saves=checkpoint_path if save_to is None else None)
        raise late_interrupt
    return result


def _history_problem(history: dict) -> str | None:
    """What makes a checkpoint's ``history`` one no run continues (``None``: it continues it): each of
    :data:`HISTORY_KEYS` is a 1-d array of numbers in every history jes writes (an empty one: a run saved before its
    first generation)."""
    if not history:
        return None
    missing = [k for k in HISTORY_KEYS if k not in history]
    if missing:
        return f"lacks {', '.join(missing)}"
    for k in HISTORY_KEYS:
        values = history[k]
        if not isinstance(values, np.ndarray) or values.ndim != 1 or values.dtype.kind not in "biuf":
            shown = f"{values.dtype}{list(values.shape)}" if isinstance(values, np.ndarray) else type(values).__name__
            return f"{k} is {shown}, not a 1-d array of numbers"
    return None


def _nothing_left(generation: int, history: dict, config: ESConfig) -> bool:
    """Whether a run at ``generation`` with ``history`` trains no more under ``config``: its generations are done,
    or it reached its ``stop_at_return`` (:func:`_run` then returns at once, without stepping)."""
    return generation >= config.num_generations or (
        config.stop_at_return is not None and _first_solved(history, config.stop_at_return) is not None)


def _variance_hint(trainer: Trainer) -> str:
    """A sentence on the policy's evolved BatchNorm variances, which go NaN below 0 (``""``: it has none)."""
    paths = evolved_variances(jax.eval_shape(trainer.unravel, jax.ShapeDtypeStruct((trainer.num_params,), np.float32)))
    if not paths:
        return ""
    return (f" The policy evolves BatchNorm running variances as parameters ({', '.join(paths[:3])}"
            f"{', ...' if len(paths) > 3 else ''}): a member whose var + epsilon the noise takes below 0 computes "
            f"NaN; use nn.LayerNorm instead (or normalize_observations=True for the inputs).")


def call_callbacks(callbacks: Iterable[Callback], record: dict, warned: set[int]) -> tuple[
        StopTraining | None, Exception | None]:
    """Call each callback with a generation's ``record``, as :func:`train` and :func:`jes.sweep.sweep` do.

    A :class:`StopTraining` is kept (the run ends after this generation) and the other callbacks still see the
    record; another exception stops the calls there. A callback that returns a value is warned of once
    (:func:`_warn_returned_value`; ``warned`` holds the ids of those warned of, for the run).

    Returns:
        ``(the first StopTraining raised or None, the exception that stopped the calls or None)``: the caller raises
        the latter (a ``jax.distributed`` run once its other processes have heard of it).
    """
    stop = None
    for callback in callbacks:
        try:
            returned = callback(record)
        except StopTraining as err:  # after this generation, kept; the other callbacks still see it
            stop = stop or err
        except Exception as err:
            return stop, err
        else:
            if returned is not None and id(callback) not in warned:
                warned.add(id(callback))
                _warn_returned_value(callback, returned)
    return stop, None


def _warn_returned_value(callback: Callable, returned: Any) -> None:
    """A callback that returned a value (``False`` to stop, as Stable-Baselines3's ``_on_step``; ``True`` as
    Keras-style "done") expected it to be read: jes reads none, so the run would go on. Warned once per callback."""
    name = getattr(callback, "__qualname__", None) or type(callback).__qualname__
    shown = repr(returned)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    warnings.warn(f"callback {name} returned {shown}: jes ignores what callbacks return, so the run goes on; "
                  f"raise jes.StopTraining('why') from it to end the run after this generation, or return None",
                  UserWarning, stacklevel=2)


class CallbackFailedInAnotherProcess(RuntimeError):
    """A callback raised an error in another process of a ``jax.distributed`` run: every process stops at that
    generation (process 0 saves the run as at any error midway), this one with this error, which names the failing
    process and its error (that process raises the error itself)."""


_STOPPED, _ERRORED = 1, 2  # a process's word in _stop_in_any_process
_MESSAGE_BYTES = 512


def _stop_in_any_process(stop: StopTraining | None, error: BaseException | None = None,
                         generation: int = 0) -> StopTraining | None:
    """A multi-process run's verdict after this generation's callbacks, the same in every process (each process
    runs its callbacks; one that stopped alone, on a ``StopTraining`` or an error, would leave the others waiting in
    the next step). An error in any process's callbacks stops every process here: the process that raised it raises
    it, the others a :class:`CallbackFailedInAnotherProcess` naming it. Otherwise the :class:`StopTraining` of the
    first process whose callbacks raised one, or ``None``."""
    from jax.experimental import multihost_utils

    mine = np.zeros(1 + _MESSAGE_BYTES, np.uint8)  # [word, utf-8 message...]
    if error is not None:
        raw = f"{type(error).__name__}: {error}".encode()[:_MESSAGE_BYTES]
        mine[0], mine[1:1 + len(raw)] = _ERRORED, np.frombuffer(raw, np.uint8)
    elif stop is not None:
        raw = (str(stop) or "StopTraining").encode()[:_MESSAGE_BYTES]
        mine[0], mine[1:1 + len(raw)] = _STOPPED, np.frombuffer(raw, np.uint8)
    everyone = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, 1 + _MESSAGE_BYTES)

    def message(process: int) -> str:
        return bytes(everyone[process, 1:]).rstrip(b"\0").decode("utf-8", "replace")

    if error is not None:
        raise _stops_every_process(error)  # its own, with its traceback (the others heard of it)
    errored = np.flatnonzero(everyone[:, 0] == _ERRORED)
    if errored.size:
        raise _stops_every_process(CallbackFailedInAnotherProcess(
            f"a callback of process {errored[0]} of this jax.distributed run raised {message(errored[0])} at "
            f"generation {generation}: every process stops there, as a run stops at a callback's error (the run is "
            f"kept at generation {generation - 1}, in process 0's checkpoint and error.result); see process "
            f"{errored[0]}'s output for its traceback"))
    raised = np.flatnonzero(everyone[:, 0] == _STOPPED)
    if not raised.size:
        return None
    return StopTraining(message(raised[0]) if raised[0] == 0 else f"{message(raised[0])} (process {raised[0]})")


def _stops_every_process(error: BaseException) -> BaseException:
    """``error``, marked as one every process of a multi-process run raises at this generation: ``jes train
    --distributed`` and a script's uncaught error then leave the process to JAX's shutdown, which waits for process 0
    to write the checkpoint (:func:`jes.distributed.jax_runtime.end_now_if_multi_process`), where an error of one
    process alone ends it at once."""
    try:
        error.stops_every_process = True
    except Exception:  # noqa: BLE001 - an exception that takes no attributes: ended as one of its process alone
        pass
    return error


def _last_record(history: dict | None, generation: int) -> dict | None:
    """The record (as its loggers got it) of a checkpoint's last history row, when that is ``generation``'s."""
    if not history or generation < 1 or any(k not in history for k in HISTORY_KEYS):
        return None
    rows = history["generation"]
    if not len(rows) or int(rows[-1]) != generation:
        return None
    record = {k: history[k][-1].item() if hasattr(history[k][-1], "item") else history[k][-1] for k in HISTORY_KEYS}
    before = int(history["env_steps"][-2]) if len(rows) > 1 else 0
    record["env_steps_per_second"] = (int(record["env_steps"]) - before) / max(float(record["generation_time"]), 1e-9)
    return record


class _Ran:
    """The run's result once :func:`run` returned it: a Ctrl-C after that (stopping workers, closing the logs)
    carries it and its checkpoint, as an interrupt during the run does, rather than reading as one before any."""

    def __init__(self):
        self.result: TrainResult | None = None

    def __call__(self, result: TrainResult) -> TrainResult:
        self.result = result
        return result

    def interrupted(self, err: BaseException) -> None:
        result = self.result
        if result is not None and isinstance(err, KeyboardInterrupt) and not hasattr(err, "result"):
            if result.checkpoint_path is not None:
                err.checkpoint_path = result.checkpoint_path
            _attach_result(err, lambda: result)


def _carry_run_over(error: BaseException | None, interrupt: KeyboardInterrupt) -> None:
    """A Ctrl-C that replaces ``error`` in flight carries what it carried (the run so far, its checkpoint)."""
    for name in ("result", "checkpoint_path", "save_error"):
        if error is not None and hasattr(error, name) and not hasattr(interrupt, name):
            setattr(interrupt, name, getattr(error, name))


_AUTO_DIR_ATTEMPTS = 10  # auto log dirs tried by runs started in the same second (each found taken by another)


def _lock_checkpoint(path: str | None, resuming: bool = False) -> checkpoint.WriterLock | None:
    """Process 0's :class:`jes.checkpoint.WriterLock` on the checkpoint ``path`` its run writes (``None`` in the other
    processes, or without a checkpoint); every process of a multi-process run raises its refusal.

    Raises:
        jes.checkpoint.CheckpointInUseError: another run is writing ``path``.
    """
    lock, refusal = None, None
    if path is not None and jax.process_index() == 0:
        try:
            lock = checkpoint.WriterLock(path, resuming=resuming).acquire()
        except checkpoint.CheckpointInUseError as err:
            if jax.process_count() == 1:
                raise
            refusal = str(err)
    if jax.process_count() > 1:
        try:
            refusal = _from_process_0(refusal)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
    if refusal is not None:
        raise checkpoint.CheckpointInUseError(refusal, path)
    return lock


def _count(n: int, noun: str) -> str:
    """``"1 generation"``, ``"3 generations"``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def evaluates_centre(generation: int, total: int, eval_every: int) -> bool:
    """Whether generation ``generation`` (1-based) of a run of ``total`` gets a centre evaluation: every
    ``eval_every``-th (0: none) and always the last."""
    return generation == total or (eval_every > 0 and generation % eval_every == 0)


def _first_solved(history: dict, solved_return: float | None) -> int | None:
    """First generation in ``history`` whose centre return reached ``solved_return``."""
    if solved_return is None:
        return None
    for generation, score in zip(history.get("generation", []), history.get("centre_return", [])):
        if score >= solved_return:
            return int(generation)
    return None


def _note_interrupt(interrupt: BaseException, generation: int, saved_in: str | None = None,
                    saved_generation: int | None = None, save_error: BaseException | None = None,
                    compiling: bool = False, process_0_saves: str | None = None) -> None:
    """Say on a Ctrl-C's traceback where the run went (a notebook cell showed a bare ``KeyboardInterrupt:``, its result
    unassigned, and where the auto-named checkpoint was said nowhere). Python 3.11+; once per interrupt.
    ``process_0_saves``: the run's checkpoint, which process 0 of a multi-process run writes (not this process)."""
    if not hasattr(interrupt, "add_note") or getattr(interrupt, "_jes_noted", False) or not hasattr(interrupt, "result"):
        return
    interrupt._jes_noted = True
    result = ("this exception's .result (`except KeyboardInterrupt as e: result = e.result`; in Jupyter/IPython, "
              "after the cell: `result = sys.last_value.result`)")
    if compiling:  # nothing trained in this session: the run as it started (fresh, a checkpoint's, a given state)
        held = f"; the checkpoint {saved_in} it resumed holds it too (resume={saved_in!r})" if saved_in else ""
        interrupt.add_note(f"jes: interrupted while the generation step compiled, before generation {generation + 1}: "
                           f"nothing was trained; the run as it started is {result}{held}")
        return
    if saved_in and save_error is not None:  # an earlier checkpoint of this run, not the newest generations
        where = (f"; saving it failed ({getattr(save_error, 'reason', None) or save_error}): the checkpoint "
                 f"{saved_in} holds generation {saved_generation} (resume={saved_in!r})")
    elif saved_in:
        where = f"; the checkpoint {saved_in} holds it too (resume={saved_in!r})"
    elif process_0_saves:
        where = f"; process 0 of this multi-process run saves it to the checkpoint {process_0_saves}"
    else:
        where = "; no checkpoint holds it (checkpoint_path=None, or none was written)"
    interrupt.add_note(f"jes: interrupted after generation {generation}. The run so far is {result}{where}")


def _attach_result(interrupt: BaseException, make: Callable[[], TrainResult]) -> None:
    """``interrupt.result = make()`` (`except KeyboardInterrupt as e: e.result`; also an error that stopped the run
    midway), unless making it fails: the interrupt goes on whatever that raised."""
    try:
        interrupt.result = make()
    except Exception:  # noqa: BLE001
        pass


def _result(trainer, state, history, key, solved_generation, compile_time, t_start, best=None,
            checkpoint_path=None, log_dir=None) -> TrainResult:
    state = localize(state)  # this process's replica: usable on its own, in every process alike
    trainer.note_run_key(state, key)  # jes.run(trainer, result.state) finds it
    flat = np.asarray(fetch(state.params))
    result = TrainResult(
        params=trainer.params_tree(flat),
        flat_params=flat,
        policy=trainer.policy,
        history={k: np.asarray(v) for k, v in history.items()},
        config=trainer.config,
        key=np.asarray(jax.random.key_data(as_key(key))),
        env_name=trainer.spec.name,
        optimizer=trainer.optimizer_name,
        strategy=trainer.strategy.name,
        solved_generation=solved_generation,
        compile_time=compile_time,
        wall_time=time.perf_counter() - t_start,
        state=state,
        trainer=trainer,
        best=best,
        checkpoint_path=checkpoint_path,
        log_dir=log_dir,
    )
    # (where the run's log dir is, whatever folder the summary is read from later)
    result._log_dir_path = os.path.abspath(log_dir) if log_dir else None
    return result
