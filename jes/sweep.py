"""Grid search over run configurations and seeds.

Any :class:`~jes.ESConfig` field (and ``optimizer``) may be given a list of
values; the Cartesian product runs. Values that change the compiled program's
shapes (population, chunk size, optimizer, ...) each get their own
:class:`~jes.Trainer`, compiled once; within one of those, every seed and every
value of the *batchable* hyperparameters -- ``learning_rate`` (kept in
``opt_state.hyperparams``) and ``noise_std`` (kept in ``state.noise_std``) --
shares that program.

By default (``vmap=False``) they run one after another through the trainer's
own compiled step, so every swept run is **bit-identical** to the same run made
alone with :func:`jes.train` (same key, same config: same parameters and
history; tested). With ``vmap=True`` the generation is ``jax.vmap``-ed over a
stacked batch of TrainStates (:class:`~jes.TrainState`) instead: one program for the
whole batch, faster on accelerators, but a different XLA program (batched
matrix products and reductions are fused and reassociated differently), so
parameters and every metric derived from them may differ from a standalone
run in the last bits (seen: 113 of 367 GRU parameters, by up to 2.4e-7, after
5 generations).

Results come back as one row per configuration (seeds aggregated), written as
CSV and JSON, and as one TensorBoard run per configuration.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import math
import os
import pickle
import re
import sys
import time
import warnings
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jes import interrupts, perturbations, strategies as jes_strategies
from jes.arrays import check_seed
from jes.atomic import folder_problem, write_atomically
from jes.checkpoint import CheckpointInUseError, WriterLock
from jes.config import ESConfig, checked_config
from jes.logging import TensorBoardLogger, claim_dir, default_run_name, event_files, has_event_files
from jes.policies import GRUPolicy, MLPPolicy
from jes.generation import Trainer, TrainState
from jes.loop import (HISTORY_KEYS, Callback, CentrePolicy, _count, _take_sigterm, call_callbacks, check_keywords,
                      evaluates_centre, run_hparams, trained_policy)
from jes.optimizers import DEFAULT_LEARNING_RATES, resolve_name
from jes.strategies.base import both_sigmas, given_noise_std, ignored_settings
from jes.strategy_context import build_context, check_strategy_supports
from jes.trained import TrainedPolicy
from jes.threefry import lower_unrolled

# Hyperparameters that live in the TrainState, so different values share one compiled program.
BATCHABLE = ("learning_rate", "noise_std")
GRID_KEYS = tuple(f.name for f in dataclasses.fields(ESConfig)) + ("optimizer", "strategy")
NOT_CONFIG = ("optimizer", "strategy")


@dataclasses.dataclass
class SweepRun(CentrePolicy):
    """One (configuration, seed) of a sweep. Its final centre is a policy, as a :class:`~jes.TrainResult`'s is
    (:class:`~jes.loop.CentrePolicy`): ``run.save_policy(path)``, ``run.evaluate()``, ``run.act(carry, obs)``,
    ``run.trained_policy()``.

    Attributes:
        status: ``"completed"``, ``"stopped"`` (a callback raised :class:`~jes.StopTraining`: ``stopped`` holds its
            message) or ``"failed"`` (its fitness or update went non-finite: ``error`` says which and when; its
            ``state``, ``params`` and ``history`` are the run's up to the generation before, as
            :func:`jes.train`'s ``error.result``).
        params: the final centre as Flax variables (as :class:`~jes.TrainResult`'s), usable with the sweep's policy's
            ``apply`` once its output size is set (``GRUPolicy(..., num_outputs=2)``; ``jes.train`` fills it in).
        flat_params: the same as one numpy vector.
        trained: the final centre as a :class:`jes.trained.TrainedPolicy`, built by :func:`sweep` from ``flat_params``
            and ``state``'s normaliser (``None`` in a copy made with ``dataclasses.replace``, which would otherwise
            keep the old parameters' policy, and after a pickle round trip where the policy's module cannot be
            pickled: a lambda activation, say).
    """

    config_index: int
    seed: int
    config: ESConfig
    optimizer: str
    flat_params: np.ndarray
    history: dict
    state: TrainState
    params: Any = None
    status: str = "completed"
    error: str | None = None
    stopped: str | None = None
    trained: TrainedPolicy | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def trained_policy(self) -> TrainedPolicy:
        """The final centre as a :class:`jes.trained.TrainedPolicy` (the configuration's policy and action mapping,
        the run's observation normaliser): what :meth:`save_policy` writes and :meth:`evaluate` plays."""
        if self.trained is None:
            why = self.__dict__.get("_not_pickled") or ("it was not made by jes.sweep (by hand, or a copy made with "
                                                        "dataclasses.replace, or pickled by an older jes)")
            raise ValueError(f"this SweepRun holds no trained policy: {why}; apply run.params with the sweep's policy, "
                             f"or re-run its configuration with jes.train")
        return self.trained

    def __getstate__(self) -> dict:
        # The trained policy pickles as its policy file does, or as pickle pickles its module where no file can name
        # it; a module pickle cannot take either (a lambda activation) is left out, and the rest of the run pickles
        # (pickled here once, as bytes, and read back by __setstate__)
        state = dict(self.__dict__, trained=None)
        if self.trained is not None:
            try:
                state["_trained_pickle"] = pickle.dumps(self.trained)
            except (pickle.PicklingError, AttributeError, TypeError) as err:
                state["_not_pickled"] = f"its policy could not be pickled with it ({type(err).__name__}: {err})"
        return state

    def __setstate__(self, state: dict) -> None:
        blob = state.pop("_trained_pickle", None)
        self.__dict__.update(state)
        if blob is not None:
            self.trained = pickle.loads(blob)

    def __repr__(self) -> str:
        # The dataclass repr printed the parameters, the history and the state (kilobytes in a notebook's output)
        centre = self.history.get("centre_return", np.array([]))
        finite = centre[np.isfinite(centre)]
        score = f"final centre return {float(finite[-1]):.1f}" if finite.size else "no centre evaluation"
        ended = "" if self.status == "completed" else f"{self.status}: {self.error or self.stopped}, "
        return (f"SweepRun(configuration {self.config_index}, seed {self.seed}, {ended}"
                f"{_count(len(self.history.get('generation', ())), 'generation')}, {score}, {np.size(self.flat_params)} params)")


@dataclasses.dataclass
class SweepResult:
    """What :func:`sweep` returns.

    Attributes:
        rows: one dict per configuration: the grid values, seeds, ``status`` (``completed``; ``stopped`` when a
            callback stopped a seed early; ``failed`` when a seed's fitness or update went non-finite), ``failed``
            (how many seeds failed), ``error`` and ``stopped`` (each seed's message, else ``None``), final/best
            returns aggregated over the seeds that did not fail (``*_mean``/``*_std``, ``best_pop_max``; NaN when
            every seed failed), ``solved_fraction`` (over every seed, a failed one unsolved),
            ``env_steps_per_seed`` (the mean over every seed of what it ran), timings.
        runs: every (configuration, seed) with its final parameters and history (resumed: those this call ran).
        csv_path, json_path: where the table was written (``None`` without ``out_dir``).
    """

    rows: list[dict]
    runs: list[SweepRun]
    csv_path: str | None = None
    json_path: str | None = None

    def __repr__(self) -> str:
        # The dataclass repr printed every run's parameters, history and state: 33 kB for a 2x2 sweep of a small GRU
        # Over the rows (each names its seeds): a resumed sweep's runs are only the ones its call ran ("x 0 seed(s)")
        seeds = len({seed for row in self.rows for seed in str(row.get("seeds", "")).split()}
                    | {str(r.seed) for r in self.runs})
        scores = [(row.get("final_centre_return_mean", math.nan), index) for index, row in enumerate(self.rows)]
        scores = [(score, index) for score, index in scores if isinstance(score, float) and math.isfinite(score)]
        best = ""
        if scores:
            score, index = max(scores)
            best = (f"; best: configuration {index}, final centre return {score:.1f} +/- "
                    f"{self.rows[index].get('final_centre_return_std', math.nan):.1f}")
        failed = sum(int(row.get("failed") or 0) for row in self.rows)  # (the kept rows' failed runs too)
        best += f"; {failed} run(s) failed" if failed else ""
        return (f"SweepResult({len(self.rows)} configuration(s) x {seeds} seed(s): {len(self.runs)} runs{best}; "
                f"table: {self.csv_path or 'not written'})")

    def run(self, config_index: int, seed: int) -> SweepRun:
        """The run of configuration ``config_index`` (row order) and ``seed``."""
        for r in self.runs:
            if r.config_index == config_index and r.seed == seed:
                return r
        kept = (0 <= config_index < len(self.rows) and not any(r.config_index == config_index for r in self.runs)
                and str(seed) in str(self.rows[config_index].get("seeds", "")).split())  # (not a seed it never ran)
        raise KeyError(f"no run for configuration {config_index} and seed {seed}" + (
            " (its row was kept from the table of the sweep this result resumed: a resumed sweep's runs are the ones "
            "its call ran)" if kept else ""))


def point_config(base: ESConfig, point: Mapping[str, Any]) -> ESConfig:
    """``base`` with a grid point's ESConfig fields; a full-rank point drops a swept ``perturbation_rank`` (the
    rank of low-rank points), so a grid can cross ``perturbation`` with ranks."""
    fields = {k: v for k, v in point.items() if k not in NOT_CONFIG}
    perturbation = fields.get("perturbation", base.perturbation)
    rank = getattr(perturbation, "rank", None)
    if rank is not None and "perturbation_rank" in point and point["perturbation_rank"] != rank:
        # ESConfig takes a rank of 1 beside a LowRank object as unset: the row would say 1 and run the object's rank
        raise ValueError(f"grid point perturbation={perturbation!r}, perturbation_rank={point['perturbation_rank']}: "
                         f"the rank is given twice; sweep 'perturbation': ['low_rank'] with 'perturbation_rank', or "
                         f"LowRank objects alone")
    if getattr(perturbation, "name", perturbation) == "full_rank":
        fields["perturbation_rank"] = 1
    return base.replace(**fields)


def check_points(points: list[dict], base: ESConfig, strategy: Any, optimizer: Any = None) -> None:
    """Every grid point's config, strategy and optimizer, checked before anything trains (a bad point raises here,
    not after the points before it have run and written their logs).

    Refused: what :class:`~jes.Trainer` would refuse without building the env or policy (a strategy with an
    optimizer it does not use, a perturbation it cannot carry, an odd population for mirrored pairs, ...), settings
    the point's strategy never reads (``learning_rate`` for ars, snes, sep_cma_es, cma_es: :func:`jes.train`
    refuses them too; in a sweep the rows would differ only in their label), ``noise_std`` (in the grid, or
    ``base``'s other than the default) beside a strategy object's own initial sigma (``SNES(sigma_init=0.3)``: the
    strategy's would win), and ``stop_at_return`` (it would stop each run at its own target; a callback raising
    :class:`~jes.StopTraining` stops runs early).
    """
    strategy_names = sorted({jes_strategies.get(p.get("strategy", strategy)).name for p in points})
    for point in points:
        try:
            config = point_config(base, point)
            point_strategy = jes_strategies.get(point.get("strategy", strategy))
            perturbation = perturbations.get(config.perturbation, config.perturbation_rank)
            try:
                check_strategy_supports(point_strategy, perturbation)
            except ValueError as err:
                raise ValueError(f"{err}; a sweep runs every point of its grid: sweep the strategies that refuse "
                                 f"{perturbation.name} perturbations in a sweep of their own") from None
            if config.stop_at_return is not None:
                raise ValueError(f"stop_at_return={config.stop_at_return!r} does not apply in a sweep: a sweep runs "
                                 f"every generation of every configuration (so rows compare like with like); drop "
                                 f"it, or stop runs early with a callback that raises jes.StopTraining "
                                 f"(sweep(callbacks=[...])), or train the configuration alone with jes.train")
            ignored = ignored_settings(point_strategy, config.learning_rate, config.weight_decay,
                                       config.fitness_shaping, config.antithetic)
            if ignored is not None:
                if len(strategy_names) > 1:
                    ignored += (f"; this grid crosses strategies {strategy_names}: split it into one sweep per "
                                f"strategy, or sweep these settings only with strategies that read them")
                raise ValueError(ignored)
            sigmas = both_sigmas(point_strategy, given_noise_std(base, point))
            if sigmas is not None:
                raise ValueError(sigmas)
            # What the Trainer refuses of the strategy, optimizer and config (a full-rank stand-in: the
            # perturbation was checked above, and its layout needs the policy); the env and the policy's size
            # are checked when each group's Trainer is built, before any group runs.
            build_context(point_strategy, point.get("optimizer", optimizer),
                          config.replace(perturbation="full_rank", perturbation_rank=1), num_params=1)
        except ValueError as err:
            shown = ", ".join(f"{k}={v!r}" for k, v in point.items())
            raise ValueError(f"sweep grid point ({shown or 'the base config'}): {err}") from err


def _perturbation_name(base: ESConfig, point: Mapping[str, Any]) -> str:
    perturbation = point.get("perturbation", base.perturbation)
    return getattr(perturbation, "name", perturbation)


def _without_full_rank_duplicates(points: list[dict], base: ESConfig) -> list[dict]:
    """``points`` with each full-rank point's ``perturbation_rank`` set to 1 (the rank only shapes low-rank
    perturbations) and the full-rank points that thereby repeat an earlier one dropped: crossing
    ``perturbation`` with ranks runs full rank once, not once per rank under each rank's label.

    Raises:
        ValueError: the grid sweeps ``perturbation_rank`` but no point is low rank.
    """
    ranks = sorted({p["perturbation_rank"] for p in points if "perturbation_rank" in p})
    if len(ranks) > 1 and all(_perturbation_name(base, p) == "full_rank" for p in points):
        raise ValueError(f"the grid sweeps perturbation_rank={ranks}, but every point is full rank, where the rank "
                         f"means nothing: set config=ESConfig(perturbation='low_rank') (a sweep file: perturbation = "
                         f"\"low_rank\" under [config]), or sweep 'perturbation': ['full_rank', 'low_rank'] beside the "
                         f"ranks")
    kept, seen = [], set()
    for point in points:
        if _perturbation_name(base, point) == "full_rank" and "perturbation_rank" in point:
            point = dict(point, perturbation_rank=1)
            key = tuple((k, repr(v)) for k, v in point.items())  # grid values (arrays, optimizers) need not compare
            if key in seen:
                continue
            seen.add(key)
        kept.append(point)
    return kept


def expand_grid(grid: Mapping[str, Any]) -> list[dict]:
    """The Cartesian product of ``grid``: a value that is a list is swept, anything else is fixed.

    Raises:
        ValueError: an unknown key or an empty list.
    """
    unknown = sorted(set(grid) - set(GRID_KEYS))
    if unknown:
        raise ValueError(f"unknown sweep key(s) {', '.join(unknown)}; sweepable keys are: {', '.join(GRID_KEYS)}")
    axes = []
    for name, values in grid.items():
        values = list(values) if isinstance(values, (list, tuple)) else [values]
        if not values:
            raise ValueError(f"sweep key {name!r} has an empty list of values; give at least one")
        axes.append([(name, v) for v in values])
    return [dict(combo) for combo in itertools.product(*axes)]


def _checked_seeds(seeds: Any) -> list[int]:
    """``seeds`` as a list of distinct ints, or an error naming what is wrong (a float seed would run its floor)."""
    if isinstance(seeds, (str, bytes, Mapping)) or not hasattr(seeds, "__iter__") or np.ndim(seeds) > 1:
        raise TypeError(f"seeds must be a list of distinct integers (e.g. [0, 1, 2]), got {seeds!r}")
    seeds = list(seeds)  # a list, tuple, range, set or 1-D NumPy / JAX array
    integral = lambda s: (isinstance(s, (int, np.integer)) or (np.ndim(s) == 0 and hasattr(s, "dtype")
                                                               and np.issubdtype(s.dtype, np.integer)))
    bad = [s for s in seeds if isinstance(s, (bool, np.bool_)) or not integral(s)]
    if bad:
        raise TypeError(f"seeds must be a list of distinct integers (e.g. [0, 1, 2]); {bad[0]!r} is not an integer")
    seeds = [check_seed(s) for s in seeds]  # 32-bit seeds: 2**32 would run seed 0's key as a "distinct" seed
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be a non-empty list of distinct integers, got {seeds}")
    return seeds


def _check_outputs(out_dir: str | None, log_dir: str | None, run_names: list[str], resume: bool = False) -> None:
    """Before anything runs: refuse to replace an earlier sweep's table (unless resuming it); warn when
    configurations' log folders hold an earlier run's event files (TensorBoard would show both). ``run_names``: the
    folders of the configurations this call runs (a resumed sweep's kept ones hold its own logs)."""
    if out_dir is not None and not resume:
        tables = [name for name in ("sweep.csv", "sweep.json", RESUME_FILE)
                  if os.path.exists(os.path.join(out_dir, name))]
        if tables:
            raise FileExistsError(f"out_dir {out_dir!r} already holds an earlier sweep's table ({', '.join(tables)}), "
                                  f"which this sweep would overwrite: pass another out_dir (jes sweep: --out-dir), "
                                  f"resume it with the same arguments and resume=True (jes sweep --resume) if it is "
                                  f"this sweep's, interrupted, or delete those files to start over")
    if log_dir is not None:
        earlier = [name for name in run_names if has_event_files(os.path.join(log_dir, name))]
        if earlier and resume:  # the folders of the groups it reruns, in the log_dir it kept
            warnings.warn(f"log_dir {log_dir!r} already holds TensorBoard event files in {len(earlier)} of the "
                          f"{len(run_names)} configuration folders this resumed sweep reruns (e.g. {earlier[0]!r}): "
                          f"this sweep's own, of a group killed while it logged, or another sweep's; the rerun's go "
                          f"beside them and TensorBoard will show both: delete those folders' event files first for "
                          f"one curve each", stacklevel=3)
        elif earlier:
            warnings.warn(f"log_dir {log_dir!r} already holds TensorBoard event files of an earlier sweep in "
                          f"{len(earlier)} of this sweep's {len(run_names)} configuration folders (e.g. "
                          f"{earlier[0]!r}); this sweep's go beside them and TensorBoard will show both: pass a new "
                          f"log_dir", stacklevel=3)


# A grid value's text longer than this, or with a memory address in it, is named by its kind and grid index instead.
MAX_VALUE_NAME = 40
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")
# The longest file name most file systems take (bytes); os.pathconf says where it can.
NAME_MAX = 255


def value_name(value: Any, values: Sequence[Any]) -> str:
    """How a sweep names grid value ``value`` of the list ``values`` (its key's) in configuration folder names and
    in the table: its text (``0.01``, ``adam``, ``LowRank(rank=2)``) where that is short and the same in every
    process; else its kind and its index in ``values``: ``optax_1`` (an optax ``GradientTransformation``),
    ``schedule_0`` (a function, by its ``__name__``), ``SNES_2`` (another object, by its type). An optax object's
    or a function's text holds memory addresses (another folder in every process) and can pass the file system's
    255-byte limit on a name."""
    text = str(value)
    if len(text) <= MAX_VALUE_NAME and not _ADDRESS.search(text):
        return text
    index = next((i for i, v in enumerate(values) if v is value), None)
    if index is None:  # not in the list as given (a value the sweep made): by its place among equal ones
        index = next((i for i, v in enumerate(values) if repr(v) == repr(value)), 0)
    if isinstance(value, optax.GradientTransformation):
        kind = "optax"
    elif callable(value) and getattr(value, "__name__", "<lambda>").isidentifier():
        kind = value.__name__
    else:
        kind = "function" if callable(value) and not isinstance(value, type) else type(value).__name__
    return f"{kind}_{index}"


def _grid_lists(grid: Mapping[str, Any]) -> dict[str, list]:
    return {k: list(v) if isinstance(v, (list, tuple)) else [v] for k, v in grid.items()}


def _run_name(values: Mapping[str, Any], grid: Mapping[str, Any] | None = None) -> str:
    """The folder name of a configuration with swept ``values``; ``grid`` (the sweep's) names long values."""
    lists = _grid_lists(grid or {})
    text = ",".join(f"{k}={value_name(v, lists.get(k, [v]))}" for k, v in values.items()) or "base"
    return "".join(c if c.isalnum() or c in "-_.=," else "_" for c in text)


def _check_run_names(log_dir: str, run_names: list[str], points: list[dict]) -> None:
    """Before anything trains: every configuration's log folder has a name the file system takes, and its own."""
    try:
        limit = os.pathconf(next(p for p in _parents(log_dir) if os.path.isdir(p)), "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError, StopIteration):  # no such setting here (Windows)
        limit = NAME_MAX
    for name, point in zip(run_names, points):
        if len(os.fsencode(name)) > limit:
            raise ValueError(f"sweep grid point ({_point_text(point)}): its TensorBoard folder name {name!r} is "
                             f"{len(os.fsencode(name))} bytes, longer than the {limit} this file system takes; "
                             f"sweep fewer keys in one grid (fixed values are left out of the name), or pass "
                             f"log_dir=None (jes sweep: log_dir = \"none\")")
    repeat = _first_repeat(run_names)
    if repeat is not None:
        first, again = repeat
        raise ValueError(f"sweep grid points ({_point_text(points[first])}) and ({_point_text(points[again])}) would "
                         f"both log into {os.path.join(log_dir, run_names[again])!r}: remove the repeated value from "
                         f"the grid")


def _check_repeated_points(names: list[str], points: list[dict]) -> None:
    """Before anything trains, without a log_dir: no two grid points are one configuration (``names``: each point's
    swept values as :func:`value_name` names them)."""
    repeat = _first_repeat(names)
    if repeat is not None:
        first, again = repeat
        raise ValueError(f"sweep grid points ({_point_text(points[first])}) and ({_point_text(points[again])}) are "
                         f"one configuration, which would run (and fill the table) twice: remove the repeated value "
                         f"from the grid")


def _first_repeat(names: list[str]) -> tuple[int, int] | None:
    """The indices of the first name given again and of its first occurrence, ``(first, again)``, else ``None``."""
    first: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in first:
            return first[name], i
        first[name] = i
    return None


def _point_text(point: dict) -> str:
    """A grid point's swept values as an error names them."""
    return ", ".join(f"{k}={v!r}" for k, v in point.items()) or "the base config"


def _parents(path: str):
    """``path`` and the folders above it, up to the current directory's."""
    while True:
        yield path or "."
        if not path or os.path.dirname(path) == path:
            return
        path = os.path.dirname(path)


def _with_hyperparams(state: TrainState, values: Mapping[str, Any]) -> TrainState:
    strategy = state.strategy
    if "noise_std" in values:
        strategy = strategy.replace(noise_std=jnp.float32(values["noise_std"]))
    if "learning_rate" in values:
        hyper = dict(strategy.opt_state.hyperparams, learning_rate=jnp.float32(values["learning_rate"]))
        strategy = strategy.replace(opt_state=strategy.opt_state._replace(hyperparams=hyper))
    return state.replace(strategy=strategy)


def _batchable(name: str, base: ESConfig, optimizer: Any, values: list) -> bool:
    """Whether ``name`` can vary inside one compiled program for this sweep."""
    if name not in BATCHABLE or any(callable(v) for v in values):
        return False
    if name == "learning_rate":  # only named optimizers keep the rate in opt_state (inject_hyperparams)
        optimizers = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
        return all(isinstance(o, str) for o in optimizers) and all(v is not None for v in values)
    return not callable(base.noise_std)


def compile_batch(trainer: Trainer, states: TrainState) -> tuple[Any, Any, float]:
    """Compile the batched programs for stacked ``states`` (leading axis ``B``).

    The generation is assembled from :meth:`Trainer.evaluate_chunks` and
    :meth:`Trainer.apply_chunk_results` (bit-identical to the fused step) and vmapped; the centre
    evaluation is a second vmapped program, of the states passed in (the fused step's contract), run
    only with the generation after an evaluated one.

    Returns:
        ``(generation(states) -> (states, metrics), centre(states) -> (mean return [B], steps [B]), seconds)``.
    """
    chunks = jnp.arange(trainer.num_chunks, dtype=jnp.int32)

    def generation(state):
        return trainer.apply_chunk_results(state, trainer.evaluate_chunks(state, chunks))

    def centre(state):
        returns, steps = trainer.evaluate_centre(state)
        return returns.mean(), steps.sum()

    t0 = time.perf_counter()
    # threefry unrolled (jes.threefry): the same bits as the runs made alone, whose step hashes unrolled too
    # and the step's XLA options, which can change bits (XLA:CPU's fusion emitters order some sums otherwise)
    options = trainer.step_compiler_options
    generation_fn = lower_unrolled(jax.jit(jax.vmap(generation)), states)[0].compile(options)
    centre_fn = lower_unrolled(jax.jit(jax.vmap(centre)), states)[0].compile(options)
    return generation_fn, centre_fn, time.perf_counter() - t0


@dataclasses.dataclass(frozen=True)
class RunEnd:
    """How one run (entry) of a batch ended.

    Attributes:
        status: ``"completed"`` (every generation), ``"stopped"`` (a callback raised :class:`~jes.StopTraining`) or
            ``"failed"`` (non-finite fitness or update: the generation was not applied).
        generation: the last generation the run completed (its history's last row).
        message: ``None`` when completed; the ``StopTraining`` message; or what failed, at which generation.
    """

    status: str
    generation: int
    message: str | None = None


def run_batch(trainer: Trainer, states: TrainState, num_generations: int | None = None,
              vmap: bool = True, compiled: tuple | None = None, *, labels: Sequence[str] | None = None,
              callbacks: Sequence[Callback] = (), records: Sequence[Mapping[str, Any]] | None = None,
              ) -> tuple[TrainState, dict, float, list[RunEnd]]:
    """Run a stacked batch of states (leading axis ``B``) for ``num_generations`` generations.

    With ``vmap`` the batch runs as one program (see :func:`compile_batch`; pass its result as
    ``compiled`` to reuse it); without, each entry runs one after another through the trainer's
    own compiled step, its state kept as that step returns it (no slicing, stacking or placing per generation).

    An entry whose fitness or update goes non-finite ends there, at the generation before (the update is not
    applied, as :func:`jes.train` does), as does one for which a callback raises :class:`~jes.StopTraining`, after
    the generation it was given; the other entries go on, their bits what they would be without it (its state is
    frozen: without ``vmap`` it is no longer stepped; with it, its slot of the batch is put back each generation).
    Its history rows after its end are NaN (integer columns: their last value).

    Args:
        labels: how each entry is named in messages (default ``batch entry <b>``).
        callbacks: called with each running entry's record of each generation (``jes.train``'s keys, and
            ``records[b]``'s); other exceptions than ``StopTraining`` propagate (the batch stops).
        records: what each entry's record carries besides its metrics (a sweep's ``config_index``, ``point``,
            ``seed``, ``run``).

    Returns:
        ``(final states [B, ...], history {name: [generations, B]}, compile seconds, how each entry ended)``.
    """
    cfg = trainer.config
    total = cfg.num_generations if num_generations is None else num_generations
    size = jax.tree.leaves(states)[0].shape[0]
    start = int(np.asarray(jax.device_get(states.generation))[0])
    labels = list(labels) if labels is not None else [f"batch entry {b}" for b in range(size)]
    records = list(records) if records is not None else [{} for _ in range(size)]
    active = np.ones(size, bool)  # entries still training
    ends: list[RunEnd | None] = [None] * size
    if vmap:
        generation_fn, centre_fn, compile_time = compiled if compiled is not None else compile_batch(trainer, states)

        def step(s, centre, population):
            # The fused step's contract: the centre evaluated is the state passed in's.
            centre_return, centre_steps = centre_fn(s) if centre else (None, None)
            new, metrics = generation_fn(s) if population else (s, {})
            if population and not active.all():  # the batch steps every slot: an ended entry's is put back
                new = frozen(new, s, ~active)
            metrics = dict(metrics, centre_return=centre_return, centre_steps=centre_steps) if centre else metrics
            return new, {k: np.asarray(v) for k, v in jax.device_get(metrics).items()}

        def frozen(new, old, mask):
            """``new`` with the entries of ``mask`` put back to ``old``'s (the batch keeps its shape)."""
            keep = jnp.asarray(mask)
            return jax.tree.map(lambda n, o: jnp.where(keep.reshape(keep.shape + (1,) * (n.ndim - 1)), o, n), new, old)

        states_out = lambda s: s
    else:
        t0 = time.perf_counter()
        # Each entry's state as the compiled step takes and returns it (replicated on the trainer's devices): slicing
        # the stacked batch and placing each slice every generation cost 3-4x the generation on 2 CPU devices.
        states = [trainer.place(jax.tree.map(lambda x: x[b], states)) for b in range(size)]
        single, _ = trainer.compiled_step(states[0])
        compile_time = time.perf_counter() - t0
        flags = {flag: jax.device_put(np.bool_(flag), trainer.replicated) for flag in (False, True)}

        def step(s, centre, population):
            outs = {b: single(s[b], flags[bool(centre)], flags[bool(population)]) for b in np.flatnonzero(active)}
            fetched = jax.device_get({b: out[1] for b, out in outs.items()})
            # An entry that ended is not stepped: its metrics are NaN (or 0) here, read only for running entries.
            template = {k: np.asarray(v) for k, v in next(iter(fetched.values())).items()}
            filler = {k: np.array(np.nan if np.issubdtype(v.dtype, np.floating) else 0, v.dtype)
                      for k, v in template.items()}
            metrics = {k: np.stack([np.asarray(fetched[b][k]) if b in fetched else filler[k] for b in range(size)])
                       for k in template}
            return [outs[b][0] if b in outs else s[b] for b in range(size)], metrics

        def frozen(new, old, mask):
            return [old[b] if mask[b] else new[b] for b in range(size)]

        states_out = lambda s: jax.tree.map(lambda *x: jnp.stack(x), *s)

    history = {k: [] for k in HISTORY_KEYS}
    env_steps = np.zeros(size, np.int64)
    loop_start = time.perf_counter()
    pending = None  # (record, states after it): a generation whose centre the next call evaluates (as jes.loop.run)
    warned = set()  # callbacks warned of a returned value

    def commit(record, centre_return, centre_steps, running) -> np.ndarray:
        """Add a generation's row for the ``running`` entries; returns the entries a callback stopped after it."""
        nonlocal env_steps
        centre_steps = np.where(running, centre_steps, 0)
        generation_steps = np.where(running, record["env_steps"], 0) + centre_steps
        env_steps = env_steps + generation_steps
        record.update(centre_return=np.where(running, centre_return, np.nan).astype(np.float32), env_steps=env_steps)
        for k in HISTORY_KEYS:
            history[k].append(record[k])
        stopping = np.zeros(size, bool)
        for b in np.flatnonzero(running) if callbacks else ():
            entry = {k: np.asarray(v)[b].item() for k, v in record.items()}
            entry.update(centre_steps=int(centre_steps[b]),
                         env_steps_per_second=int(generation_steps[b]) / max(entry["generation_time"], 1e-9),
                         **records[b])
            # A StopTraining ends this entry after this generation, kept; the others go on
            stop, error = call_callbacks(callbacks, entry, warned)
            if error is not None:
                if hasattr(error, "add_note"):  # Python 3.11+
                    error.add_note(f"raised by a sweep callback for {labels[b]} at generation {entry['generation']}")
                raise error
            if stop is not None:
                stopping[b] = True
                ends[b] = RunEnd("stopped", int(entry["generation"]), str(stop) or "StopTraining")
        active[stopping] = False
        return stopping

    for gen in range(start, total + 1):
        interrupts.raise_if_terminated()  # a SIGTERM whose interrupt Python dropped (a gc callback's) stops it here
        population = gen < total
        if (not population and pending is None) or not active.any():
            break
        t_gen = time.perf_counter()
        newest = states if pending is None else pending[1]
        running = active.copy()
        new_states, metrics = step(newest, pending is not None, population)
        if pending is not None:
            (record, states), pending = pending, None
            stopping = commit(record, metrics["centre_return"], metrics["centre_steps"], running)
            if stopping.any():  # they end at the generation committed, not the one just stepped
                new_states = frozen(new_states, states, stopping)
        if not population:
            break
        failed = active & ((metrics["bad_member"] >= 0) | metrics["bad_update"].astype(bool))
        for b in np.flatnonzero(failed):
            what = (f"non-finite fitness (NaN or inf) of member {int(metrics['bad_member'][b])}"
                    if metrics["bad_member"][b] >= 0 else "a non-finite ES update")
            hint = ("lower its noise_std or learning_rate, or check the env's rewards" if metrics["bad_member"][b] >= 0
                    else "lower its learning_rate, or keep its noise_std schedule above 0")
            ends[b] = RunEnd("failed", gen, f"{what} at generation {gen + 1}, not applied (the run is kept at "
                                            f"generation {gen}): {hint}")
            print(f"sweep: {labels[b]} failed: {ends[b].message}; the other runs go on", file=sys.stderr)
        if failed.any():
            active[failed] = False
            new_states = frozen(new_states, states, failed)
        if not active.any():
            break
        now = time.perf_counter()
        running = active.copy()
        record = {k: (np.where(running, v, np.nan).astype(v.dtype) if np.issubdtype(v.dtype, np.floating) else v)
                  for k, v in metrics.items()}
        record.update(generation=np.full(size, gen + 1), wall_time=np.full(size, now - loop_start),
                      generation_time=np.full(size, now - t_gen), env_steps=metrics["env_steps"])
        if evaluates_centre(gen + 1, total, cfg.eval_every):
            pending = (record, new_states)
        else:
            states = new_states
            commit(record, np.full(size, np.nan, np.float32), np.zeros(size, np.int64), running)
    for b in range(size):
        if ends[b] is None:
            ends[b] = RunEnd("completed", int(history["generation"][-1][b]) if history["generation"] else 0)
    history = {k: np.stack(v) if v else np.zeros((0, size)) for k, v in history.items()}
    return states_out(states), history, compile_time, ends


def sweep(
    policy: nn.Module,
    env: Any,
    optimizer: Any = None,
    *,
    grid: Mapping[str, Any],
    strategy: Any = "openai_es",
    seeds: Sequence[int] = (0,),
    config: ESConfig | None = None,
    env_params: Any = None,
    devices: Any = None,
    vmap: bool = False,
    log_dir: str | None = "runs/<auto>",
    out_dir: str | None = None,
    callbacks: Sequence[Callback] = (),
    resume: bool = False,
    **overrides: Any,
) -> SweepResult:
    """Run every configuration of ``grid`` for every seed.

    Example:
        >>> result = jes.sweep.sweep(jes.GRUPolicy(5, 2), "CartPole-v1", "adam", seeds=[0, 1, 2, 3],
        ...                          grid={"num_members": [128, 256], "learning_rate": [0.01, 0.03]})
        >>> result.rows  # 4 rows, each aggregated over 4 seeds

    Args:
        policy, env, optimizer, env_params, devices: as for :func:`jes.train`.
        grid: ``{ESConfig field, "optimizer" or "strategy": value or list of values}``.
        strategy: the strategy (name or object) where the grid does not sweep ``"strategy"``.
        seeds: run keys; all seeds of a configuration share one compiled program.
        config: the base :class:`ESConfig` the grid values replace fields of.
        vmap: ``False`` (default) runs seeds and ``learning_rate``/``noise_std`` values one after another
            through the trainer's compiled step: bit-identical to standalone runs. ``True`` runs them as
            one vmapped program: faster on accelerators, may differ from standalone runs in the last bits.
        log_dir: parent directory of one TensorBoard run per configuration (the mean over its seeds that did not
            fail, or over every seed when each one failed; ``sweep/seeds``: how many seeds each generation's mean
            holds); default ``runs/sweep-<time>``; ``None`` turns it off.
        out_dir: where ``sweep.csv``, ``sweep.json`` and ``sweep.resume.json`` go (``None``: not written). One that
            holds a table already is refused unless ``resume``; one another sweep is running in (it holds
            ``out_dir/sweep.jes-lock``) is refused (``CheckpointInUseError``), and one that cannot be written too
            (``PermissionError``, as a ``log_dir`` that cannot be), before anything trains.
        callbacks: functions called with each run's record of each generation (:func:`jes.train`'s keys, and
            ``config_index``, ``point`` -- the grid point's values as the table shows them --, ``seed`` and ``run``,
            e.g. ``"learning_rate=0.05, seed 1"``). One that raises :class:`~jes.StopTraining` ends that run after
            the generation it was given (kept; its row says ``status: stopped`` and the message in ``stopped``); the
            other runs go on, bit for bit as without it. Any other exception stops the sweep as an error does
            (below), with a note naming the run.
        resume: continue the interrupted sweep in ``out_dir`` (below).
        overrides: :class:`ESConfig` fields replacing ``config``'s, as :func:`jes.train`'s keywords do
            (``perturbation=jes.LowRank(2)``, ``num_generations=50``); the grid's values replace them in turn.

    A run whose fitness or update goes non-finite fails alone: the generation is not applied, the run is kept at the
    one before (its state, parameters and history), its row says ``status: failed``, how many of its seeds failed in
    ``failed`` and why in ``error``, a line on stderr names its grid point and seed, and every other run and group
    goes on, bit for bit as without it; the sweep ends with one line naming the failed runs and where their reasons
    are. A row's aggregates are over its seeds that did not fail (a diverged seed has no final value, and its
    returns before it diverged would skew the mean); ``solved_fraction`` is over every seed, counting a failed one
    as not solved. ``jes sweep`` then exits with status 1 after writing the table.

    ``stop_at_return`` is refused: it would stop every run at its own target. So are settings a
    point's strategy never reads (``learning_rate`` with ars, snes, sep_cma_es, cma_es), ``noise_std`` beside a
    strategy object's own initial sigma (``SNES(sigma_init=0.3)``), and an optimizer with a strategy that uses
    none, for every point before any point runs.

    Each row's ``env_steps_per_seed`` is the mean over its seeds of the env steps each seed's run took (its
    members' and centre evaluations'; seeds differ where episodes end early); ``generations`` is the most any of its
    seeds completed (a failed or stopped seed completed fewer).

    The table in ``out_dir`` is rewritten (atomically) after each compile group finishes: the rows so far, each with
    ``sweep_complete: false``, until the last group's write of the whole table; beside it, ``sweep.resume.json``
    records what the sweep is and its finished rows. Interrupted (Ctrl-C; SIGTERM too, in the main thread of a
    program with no SIGTERM handler of its own, after which the process ends as SIGTERM ends it) or stopped by an
    error (a callback's, a Python simulator's, ...) after some configurations finished, the sweep writes their rows,
    says so on stderr, and re-raises (the error's ``sweep_note`` says what was written, its ``sweep_result`` holds
    the finished rows and the runs this call ran); killed outright (SIGKILL), it keeps the groups it had finished.

    ``resume=True`` (``jes sweep --resume``) continues the sweep whose table is in ``out_dir`` (required): called
    with the same arguments (another sweep's table is refused, naming what differs), it keeps the compile groups
    whose every row is there, runs the others whole, and writes the table an uninterrupted sweep writes (but for
    its wall-clock columns). ``rows`` then holds every row, ``runs`` only the runs this call ran (``callbacks`` see
    only those); a group with a failed or stopped run is kept like any other. The kept groups' TensorBoard runs are
    left as they are (the default ``log_dir`` is the first call's). With no sweep in ``out_dir`` yet, every group
    runs. Objects are compared by their repr less memory addresses (an optax or env object's says little: resume
    with the same ones).

    Each row records the ``learning_rate`` it ran with and where it came from
    (``learning_rate_source``: ``grid``, ``config``, ``optimizer default``, ``optax object`` or ``strategy``): in a
    sweep over optimizers each takes its own default unless the grid or config sets a rate,
    which then replaces every optimizer's default (with a warning).

    Configuration folders and the table's columns name each swept value by :func:`value_name`: its text, or for
    an optax object, a function or another long value its kind and grid index (``optimizer=optax_1`` is
    ``grid["optimizer"][1]``). Every folder name is checked before anything trains (one the file system refuses,
    or two configurations in one folder, raise ``ValueError``).
    """
    base = checked_config(config)
    if overrides:  # (as jes.train: sweep(..., perturbation=jes.LowRank(2)) was a TypeError)
        check_keywords(overrides, sweep)
        base = base.replace(**overrides)
    seeds = _checked_seeds(seeds)
    points = _without_full_rank_duplicates(expand_grid(dict(grid)), base)
    check_points(points, base, strategy, optimizer)
    swept = [k for k, v in grid.items() if isinstance(v, (list, tuple)) and len(v) > 1]
    varying = {k: [p[k] for p in points] for k in grid}
    strategy_names = {jes_strategies.get(s).name for s in (grid.get("strategy", strategy) if isinstance(
        grid.get("strategy", strategy), (list, tuple)) else [grid.get("strategy", strategy)])}
    # Only OpenAI-ES keeps sigma and the learning rate as plain state fields that can differ inside one program.
    batched = [k for k in grid if strategy_names == {"openai_es"}
               and _batchable(k, base, grid.get("optimizer", optimizer), varying[k])]
    optimizers = grid.get("optimizer", optimizer)
    named = {o for o in (optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]) if isinstance(o, str)}
    if len(named) > 1 and ("learning_rate" in grid or base.learning_rate is not None):
        rates = grid.get("learning_rate", base.learning_rate)
        warnings.warn(
            f"sweeping optimizers {sorted(named)} with learning_rate={rates}: every optimizer runs with these rates "
            f"instead of its own default ({', '.join(f'{o} {DEFAULT_LEARNING_RATES.get(resolve_name(o))}' for o in sorted(named))}); "
            f"leave learning_rate out to compare optimizers at their defaults (the table's learning_rate column "
            f"shows the rate each row used)", stacklevel=2)
    if resume and out_dir is None:
        raise ValueError("resume=True needs the out_dir of the sweep to resume (jes sweep --resume: the sweep file's "
                         "out_dir, or --out-dir)")
    identity = _identity(policy, env, optimizer, strategy, points, seeds, base, env_params, vmap)
    lock, made = _lock_out_dir(out_dir), []  # (made: the default log folder, removed if the sweep leaves it empty)
    try:
        kept, kept_log_dir = _resumed(out_dir, identity) if resume else ({}, None)
        if kept:
            _warn_unchecked_on_resume(out_dir, optimizer, strategy, base, points)
        if log_dir == "runs/<auto>" and kept_log_dir:  # a resumed sweep logs beside the configurations it kept
            log_dir = kept_log_dir
        elif log_dir == "runs/<auto>":  # made now: a sweep started in the same second takes the next name
            log_dir = claim_dir(os.path.join("runs", "sweep-" + default_run_name("", "", "").strip("-")))
            made.append(log_dir)
        if log_dir is not None:
            # (jes sweep has no --log-dir: its sweep file's log_dir says where)
            _check_writable(log_dir, "log_dir", "pass a log_dir in a folder you can write (a sweep file: log_dir = "
                                                "\"DIR\"), or log_dir=None (a sweep file: log_dir = \"none\") to log "
                                                "nothing")
        run_names = [_run_name({k: p[k] for k in swept}, grid) for p in points]
        if log_dir is not None:
            _check_run_names(log_dir, run_names, points)
        else:  # no folders to share, but a repeated value still runs (and tabulates) one configuration twice
            lists = _grid_lists(grid)  # (by the values' names, not the folder names: "a/b" and "a_b" differ)
            _check_repeated_points([repr([(k, value_name(p[k], lists[k])) for k in swept]) for p in points], points)

        # Group grid points by everything that changes the compiled program.
        groups: dict[tuple, list[int]] = {}
        for index, point in enumerate(points):
            shape_key = tuple((k, repr(v)) for k, v in point.items() if k not in batched)
            groups.setdefault(shape_key, []).append(index)
        # Resumed: a group whose every row is in the table is kept; any other runs whole (a vmapped group's batch size is
        # part of its program, so a part of one would not give the bits the whole gives)
        to_run = [indices for indices in groups.values() if not all(i in kept for i in indices)]
        _check_outputs(out_dir, log_dir, [run_names[i] for indices in to_run for i in indices], resume)

        # Every group's Trainer before any group runs: what they refuse (the env, the policy's size) stops the sweep
        # before it trains or logs anything. Building one compiles nothing.
        trainers = []
        for indices in to_run:
            first = points[indices[0]]
            try:
                trainers.append(Trainer(policy, env, first.get("optimizer", optimizer), point_config(base, first),
                                        env_params=env_params, devices=devices, strategy=first.get("strategy", strategy)))
            except ValueError as err:
                shown = ", ".join(f"{k}={v!r}" for k, v in first.items())
                raise ValueError(f"sweep grid point ({shown or 'the base config'}): {err}") from err

        rows: list[dict] = [kept.get(i, {}) for i in range(len(points))]
        runs: list[SweepRun] = []
        shown = [_shown_point(point, grid, base) for point in points]
        # Runs are named in progress and failure lines by the values that tell their points apart (a fixed value in the
        # grid, such as a sweep file's [config] scalar, would repeat in every label; a swept jes.LowRank(2) and
        # jes.LowRank(4) differ in perturbation_rank, which the grid does not name)
        differing = {k for k in shown[0] if len({repr(s.get(k)) for s in shown}) > 1} if shown else set()
        named = [{k: v for k, v in s.items() if k in differing} for s in shown]
        # SIGTERM (kill, timeout, a cluster scheduler) as Ctrl-C, where it would end the process unhandled: the finished
        # rows are written, then the process ends as SIGTERM ends it (as jes.train takes it)
        taking_sigterm, ended_by = interrupts.SigtermAsInterrupt(unless_handled=True), None
        try:
            _take_sigterm(taking_sigterm)  # not over JAX's preemption notifier (jax.distributed)
            try:
                for group, (indices, trainer) in enumerate(zip(to_run, trainers)):
                    interrupts.raise_if_terminated()  # (a SIGTERM dropped while the last group finished or compiled)
                    _run_group(trainer, indices, points, seeds, batched, shown, named, vmap, callbacks, base, swept,
                               grid, optimizer, run_names, log_dir, rows, runs)
                    if out_dir is not None and group + 1 < len(to_run):
                        # The finished groups' table, so that a sweep killed outright (SIGKILL, an OOM) keeps them
                        with interrupts.interrupts_deferred():
                            _save(out_dir, identity, rows, log_dir, complete=False)
                runs.sort(key=lambda r: (r.config_index, r.seed))
                result = SweepResult(rows=rows, runs=runs)
                if out_dir is not None:
                    with interrupts.interrupts_deferred():  # (a SIGTERM now ends the sweep once its table is whole)
                        result.csv_path, result.json_path = _save(out_dir, identity, rows, log_dir, complete=True)
            except BaseException as err:  # Ctrl-C (KeyboardInterrupt), a non-finite update, a full disk...: keep what finished
                _keep_finished(err, rows, out_dir, identity, log_dir, runs)
                raise
        except BaseException as err:
            ended_by = err
            raise
        finally:
            _let_go(lock, made)  # before a SIGTERM taken as Ctrl-C ends the process (as SIGTERM would have)
            _end_if_terminated(taking_sigterm, ended_by)
        failed = [r for r in runs if r.status == "failed"]
        if failed:  # (once: jes sweep adds no line of its own, only its exit status 1)
            where = (f"the error column of their rows in {result.csv_path} and {result.json_path}" if result.csv_path
                     else "the error column of their rows (result.rows) and result.run(config_index, seed).error")
            print(f"sweep: {len(failed)} of {len(runs)} runs failed "
                  f"({'; '.join(run_label(named[r.config_index], r.seed) for r in failed)}); the reasons are in {where}; "
                  f"each row's means are over its seeds that did not fail", file=sys.stderr)
        return result
    finally:
        _let_go(lock, made)


# The lock a sweep holds on its out_dir while it runs: out_dir/sweep.jes-lock (jes.checkpoint.WriterLock's file)
LOCK_NAME = "sweep"


def _lock_out_dir(out_dir: str | None) -> WriterLock | None:
    """Hold ``out_dir`` for this sweep (``None`` without one): a second sweep (or a second ``--resume`` of this one)
    writing the same table would replace this one's rows with its own, and each would report the other's table.

    Raises:
        PermissionError (or the folder's own OSError): ``out_dir`` cannot be written, before anything trains.
        CheckpointInUseError: another sweep holds it; the message names it.
    """
    if out_dir is None:
        return None
    _check_writable(out_dir, "out_dir", "pass an out_dir in a folder you can write (jes sweep: --out-dir DIR), or "
                                        "out_dir=None (jes sweep: --out-dir none) to write no table")
    lock = WriterLock(os.path.join(out_dir, LOCK_NAME))
    try:
        return lock.acquire()
    except CheckpointInUseError as err:
        who = err.holder or "its holder has not named itself yet"
        raise CheckpointInUseError(
            f"out_dir {out_dir!r} is in use: another sweep is running there ({who}). Two sweeps writing one out_dir "
            f"replace each other's tables (a second --resume of one sweep too). Let that sweep end (or stop it) first, "
            f"or give this sweep another out_dir (jes sweep: --out-dir). (A sweep holds {lock.path!r} while it runs; "
            f"the lock ends with its process, however it ends.)",
            path=out_dir, holder=err.holder) from None


def _check_writable(folder: str, what: str, remedy: str) -> None:
    """Refuse, before anything trains, a ``folder`` in which files cannot be created (its results would be lost
    after the training: a table, or TensorBoard runs, written only once their group finished)."""
    problem = folder_problem(folder)
    if problem is not None:
        raise PermissionError(f"{what} {folder!r} cannot be written: {problem[2]}; {remedy}; nothing has trained yet")


def _let_go(lock: WriterLock | None, made: list[str]) -> None:
    """Release the sweep's lock and remove the default log folder it made if it is still empty (a sweep that ended
    before it logged anything); again, nothing."""
    for folder in made:
        try:
            os.rmdir(folder)  # only an empty folder
        except OSError:
            pass
    if lock is not None:
        lock.release()


def _warn_unchecked_on_resume(out_dir: str, optimizer: Any, strategy: Any, base: ESConfig, points: list[dict]) -> None:
    """A resumed sweep given values its identity knows only by name (an optax object, a schedule or another function,
    a strategy object): warn that the kept rows may not be of the same values (the sweep checks what it can by repr,
    with memory addresses left out: two ``optax.adam`` of other rates, or two lambdas, read the same)."""
    values = [("optimizer", optimizer), ("strategy", strategy)]
    values += [(f.name, getattr(base, f.name)) for f in dataclasses.fields(base)]
    values += [(k, v) for point in points for k, v in point.items()]
    unchecked = []
    for name, value in values:
        if value is None or isinstance(value, (bool, int, float, str)) or dataclasses.is_dataclass(value):
            continue  # (a dataclass's repr holds its fields: jes.LowRank, a strategy's config, a flax module)
        if (callable(value) or isinstance(value, optax.GradientTransformation)) and name not in unchecked:
            unchecked.append(name)
    if unchecked:
        warnings.warn(f"resuming the sweep in {out_dir!r} with {', '.join(unchecked)} given as an optax object or a "
                      f"function: jes knows {'it' if len(unchecked) == 1 else 'them'} by name only and cannot check "
                      f"that the kept rows ran with the same (another optax.adam rate, or a changed lambda, reads the "
                      f"same); the table mixes both if not", stacklevel=3)


def _run_group(trainer: Trainer, indices: list[int], points: list[dict], seeds: list[int], batched: list[str],
               shown: list[dict], named: list[dict], vmap: bool, callbacks: Sequence[Callback], base: ESConfig,
               swept: list[str], grid: Mapping[str, Any], optimizer: Any, run_names: list[str], log_dir: str | None,
               rows: list[dict], runs: list[SweepRun]) -> None:
    """Run one compile group's configurations for every seed: its runs go into ``runs``, its rows into ``rows`` (at
    their configuration's index), its TensorBoard runs into ``log_dir``."""
    members = [(i, seed) for i in indices for seed in seeds]
    states = [_with_hyperparams(trainer.init_state(seed), {k: points[i][k] for k in batched}) for i, seed in members]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *states)
    labels = [run_label(named[i], seed) for i, seed in members]
    t0 = time.perf_counter()
    final, history, compile_time, ends = run_batch(
        trainer, stacked, vmap=vmap, labels=labels, callbacks=callbacks,
        records=[dict(config_index=i, point=dict(shown[i]), seed=seed, run=label)
                 for (i, seed), label in zip(members, labels)])
    wall = time.perf_counter() - t0 - compile_time
    final = jax.device_get(final)
    for b, (i, seed) in enumerate(members):
        member_state = jax.tree.map(lambda x: x[b], final)
        ran = history["generation"][:, b] <= ends[b].generation  # its rows: none after it failed or stopped
        runs.append(SweepRun(
            config_index=i, seed=seed, config=point_config(base, points[i]),
            optimizer=trainer.optimizer_name, flat_params=np.asarray(member_state.params),
            params=trainer.params_tree(np.asarray(member_state.params)),
            history={k: v[ran, b] for k, v in history.items()}, state=member_state,
            status=ends[b].status, error=ends[b].message if ends[b].status == "failed" else None,
            stopped=ends[b].message if ends[b].status == "stopped" else None,
        ))
        runs[-1].trained = trained_policy(trainer, member_state.params, member_state)
    finished, logged = {}, []  # (logged: each configuration's folder and the event files it held before)
    for i in indices:
        cols = [b for b, (j, _) in enumerate(members) if j == i]
        seed_ends = [ends[b] for b in cols]
        ran = _ran({k: v[:, cols] for k, v in history.items()}, seed_ends)
        finished[i] = _row(points[i], swept, seeds, ran, seed_ends, compile_time, wall, len(members), trainer,
                           base.learning_rate, grid, points[i].get("optimizer", optimizer))
        if log_dir is not None:
            folder = os.path.join(log_dir, run_names[i])
            logged.append((folder, set(event_files(folder))))
            try:
                _log_configuration(folder, ran, points[i], base, trainer, seeds, points[i].get("optimizer", optimizer),
                                   seed_ends, finished[i])
            except BaseException:
                # Cut short (Ctrl-C): the group's event files written so far go, as its rows stay out of the table,
                # so that its rerun on resume logs each configuration once (TensorBoard showed both before)
                for where, before in logged:
                    for path in set(event_files(where)) - before:
                        try:
                            os.unlink(path)
                        except OSError:
                            pass
                raise
    # The group's rows once its logs are written, all together: a group cut short in its logging (Ctrl-C) has none
    # in the table, so a resume reruns it rather than keeping it beside a TensorBoard run half written
    for i, row in finished.items():
        rows[i] = row


def _end_if_terminated(taking: interrupts.SigtermAsInterrupt, ended_by: BaseException | None = None) -> None:
    """Give SIGTERM its handler back; if one came while the sweep ran (taken as Ctrl-C: the finished rows are written
    by now, and :func:`_keep_finished` said where), end the process as SIGTERM ends it (status 143). ``ended_by``:
    the interrupt or error that ended the sweep, if any."""
    taking.restore(ended_by)
    if taking.terminated:
        print("jes.sweep: terminated by SIGTERM", file=sys.stderr, flush=True)
        interrupts.terminate_as_sigterm()


# What a sweep writes beside its table for resume=True: what the sweep is (its identity) and its finished rows as
# Python holds them (sweep.json turns NaN into null, which would come back as an empty CSV field, not "nan")
RESUME_FILE = "sweep.resume.json"


def _plain(value: Any) -> Any:
    """``value`` as JSON data the same in every process: a plain value as it is, another by its repr less memory
    addresses (whole: :func:`value_name`'s ``EnvParams_0`` or ``SNES_0`` would not tell other field values apart)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return _ADDRESS.sub("0x", repr(value))


def _identity(policy: Any, env: Any, optimizer: Any, strategy: Any, points: list[dict], seeds: list[int],
              base: ESConfig, env_params: Any, vmap: bool) -> dict:
    """What makes a sweep's table the same sweep's, as JSON data: a resumed sweep must give the rows an uninterrupted
    one gives. (Objects are known by their repr: an env object's or an optax object's tells little, a function's its
    name.)"""
    identity = {
        "env": _plain(env),
        "env_params": _plain(env_params),
        "policy": _plain(policy),
        "strategy": _plain(strategy),
        "optimizer": _plain(optimizer),
        "config": {f.name: _plain(getattr(base, f.name)) for f in dataclasses.fields(base)},
        "grid points": [{k: _plain(v) for k, v in point.items()} for point in points],
        "seeds": list(seeds),
        "vmap": bool(vmap),
    }
    return json.loads(json.dumps(identity))  # as it reads back


def _resumed(out_dir: str, identity: dict) -> tuple[dict[int, dict], str | None]:
    """The finished rows (by configuration index) of the sweep in ``out_dir`` and the log_dir it logged to; nothing
    when ``out_dir`` holds no sweep yet.

    Raises:
        ValueError: ``out_dir`` holds another sweep's table, or one that cannot be checked.
    """
    path = os.path.join(out_dir, RESUME_FILE)
    start = f"cannot resume the sweep in out_dir {out_dir!r}"
    if not os.path.exists(path):
        tables = [name for name in ("sweep.csv", "sweep.json") if os.path.exists(os.path.join(out_dir, name))]
        if tables:
            raise ValueError(f"{start}: it holds a sweep table but no {RESUME_FILE} (which a sweep writes beside "
                             f"its table; an older jes wrote none) to check that it is this sweep's; pass another out_dir to run this "
                             f"sweep anew")
        return {}, None  # nothing to resume: every group runs (a job script may pass --resume from its first start)
    try:
        with open(path) as f:
            saved = json.load(f)
        rows = {int(index): row for index, row in saved["rows"]}
        there = saved["identity"]
        # (the parts a difference is shown from too: a config that is not a map, or grid points not a list, raised a
        # bare AttributeError or TypeError while the message was made)
        if not (isinstance(there, dict) and all(isinstance(row, dict) for row in rows.values())
                and isinstance(saved.get("log_dir"), (str, type(None))) and isinstance(there.get("config", {}), dict)
                and isinstance(there.get("grid points", []), list)):
            raise TypeError("its identity, rows or log_dir are not what a sweep writes")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{start}: its {RESUME_FILE} cannot be read ({type(err).__name__}: {err}); pass another "
                         f"out_dir to run this sweep anew") from err
    differs = [key for key in identity if there.get(key) != identity[key]]
    if differs:
        key = differs[0]
        if key == "config":
            theirs = there.get(key) or {}  # (a file without one: a bare KeyError before)
            fields = [k for k in identity[key] if theirs.get(k) != identity[key][k]]
            detail = "; ".join(f"{k}: {theirs.get(k)!r} there, {identity[key][k]!r} here" for k in fields)
        elif key == "grid points":
            detail = f"{len(there.get(key) or [])} there, {len(identity[key])} here; the first that differs: " + next(
                f"{a} there, {b} here" for a, b in itertools.zip_longest(there.get(key) or [], identity[key])
                if a != b)
        else:
            detail = f"{there.get(key)!r} there, {identity[key]!r} here"
        also = f" (also: {', '.join(differs[1:])})" if differs[1:] else ""
        raise ValueError(f"{start}: its table is of another sweep: its {key} "
                         f"{'differ' if key.endswith('s') else 'differs'} ({detail}){also}; resume it with the "
                         f"arguments (or sweep file) it was started with, or pass another out_dir to run this sweep")
    versions = saved.get("versions")  # (a jes before 0.2.0's sweeps recorded none)
    if isinstance(versions, dict) and versions != _versions():
        changed = ", ".join(f"{k} {versions.get(k)} there, {v} here" for k, v in _versions().items()
                            if versions.get(k) != v)
        warnings.warn(f"resuming the sweep in out_dir {out_dir!r} with other versions than its kept rows ran with "
                      f"({changed}): the groups run now may differ from what the uninterrupted sweep would have "
                      f"given (default chunk sizes and compiled programs can change between versions); rerun it "
                      f"whole (another out_dir) for one table of one version", stacklevel=3)
    return rows, saved.get("log_dir")


def _versions() -> dict:
    """The versions a sweep's rows ran with (recorded beside them for a resume to compare)."""
    import flax  # noqa: PLC0415
    import jaxlib  # noqa: PLC0415

    from jes import __version__  # noqa: PLC0415

    return {"jes": __version__, "jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__}


def _save(out_dir: str, identity: dict, rows: list[dict], log_dir: str | None, complete: bool) -> tuple[str, str]:
    """Write the table of the finished ``rows`` (empty dicts: not yet run; each marked ``sweep_complete: false``
    unless ``complete``) and :data:`RESUME_FILE`, each atomically; returns the table's paths."""
    finished = [row if complete else dict(row, sweep_complete=False) for row in rows if row]
    # Absolute: a resume from another working directory logs beside the configurations it keeps
    state = {"identity": identity, "log_dir": None if log_dir is None else os.path.abspath(log_dir), "complete": complete,
             "versions": _versions(), "rows": [[index, row] for index, row in enumerate(rows) if row]}
    # The resume file first: what a resume trusts (a table without it could be neither resumed nor run anew)
    write_atomically(os.path.join(out_dir, RESUME_FILE), lambda f: json.dump(state, f, indent=1), mode="w")
    return write_table(finished, out_dir)


def _keep_finished(err: BaseException, rows: list[dict], out_dir: str | None, identity: dict,
                   log_dir: str | None, runs: list[SweepRun]) -> None:
    """On an interrupted or failed sweep: write the finished configurations' rows (marked ``sweep_complete:
    false``) and :data:`RESUME_FILE` with them, say so on stderr, and attach what was written to ``err``
    (``err.sweep_note``, for ``jes sweep``) and what finished (``err.sweep_result``: a :class:`SweepResult` of the
    finished rows and the runs this call ran, for a caller whose table could not be written)."""
    finished, total = [row for row in rows if row], len(rows)
    what = "interrupted" if isinstance(err, KeyboardInterrupt) else f"stopped by {type(err).__name__}"
    if not finished:
        note = f"sweep {what} before any of its {total} configurations finished: no table was written"
    elif out_dir is None:
        note = (f"sweep {what} after {len(finished)} of {total} configurations finished; no out_dir, so no table "
                f"was written")
    else:
        try:
            csv_path, json_path = _save(out_dir, identity, rows, log_dir, complete=False)
        except Exception as write_err:  # noqa: BLE001 - the sweep's own error is the one to raise
            note = (f"sweep {what} after {len(finished)} of {total} configurations finished; their table could not "
                    f"be written ({type(write_err).__name__}: {write_err})")
        else:
            note = (f"sweep {what} after {len(finished)} of {total} configurations finished: their rows are in "
                    f"{csv_path} and {json_path} (sweep_complete: false); to run the rest, call the sweep again with "
                    f"the same arguments and resume=True (jes sweep --resume): it keeps the compile groups whose "
                    f"every configuration finished and reruns the others whole")
    try:
        err.sweep_note = note
        err.sweep_result = SweepResult(rows=[row for row in rows if row],
                                       runs=sorted(runs, key=lambda r: (r.config_index, r.seed)))
    except AttributeError:  # an exception type that takes no attributes
        pass
    print(note, file=sys.stderr)


def _shown_point(point: Mapping[str, Any], grid: Mapping[str, Any] | None = None, base: ESConfig | None = None) -> dict:
    """A grid point's values as the table shows them."""
    lists = _grid_lists(grid or {})
    # Other values by their names (value_name: "optax_1" is grid index 1), as their folders: a repr with memory
    # addresses told two optax objects apart by their addresses alone, and another in every process
    shown = {k: (v if isinstance(v, (bool, int, float, str)) or v is None else value_name(v, lists.get(k, [v])))
             for k, v in point.items()}
    if "perturbation" in point or "perturbation_rank" in point:
        # By name and rank, as the config stores them (a swept jes.LowRank(2) is "low_rank" and 2, not its repr)
        config = point_config(base or ESConfig(), point)
        shown["perturbation"], shown["perturbation_rank"] = config.perturbation, config.perturbation_rank
    return shown


def run_label(shown: Mapping[str, Any], seed: int) -> str:
    """How messages name one run of a sweep: its grid point's values (as the table shows them) and its seed."""
    return ", ".join([*(f"{k}={v}" for k, v in shown.items()), f"seed {seed}"])


def _ran(history: dict, ends: Sequence[RunEnd]) -> dict:
    """``history`` ``{name: [generations, seeds]}`` as float64, NaN in each seed's rows after its end."""
    ran = history["generation"] <= np.array([end.generation for end in ends])[None, :]
    out = {k: np.where(ran, v.astype(np.float64), np.nan) for k, v in history.items()}
    out["generation"] = history["generation"]
    return out


def _final_centre(history: dict, ends: Sequence[RunEnd]) -> np.ndarray:
    """Each seed's last centre return; NaN for a failed seed (it has no final state) or one never evaluated."""
    centre = history["centre_return"]
    out = np.full(centre.shape[1], np.nan)
    for b in range(centre.shape[1]):
        finite = centre[:, b][np.isfinite(centre[:, b])]
        if finite.size and ends[b].status != "failed":
            out[b] = finite[-1]
    return out


def _row(point: dict, swept: list, seeds: list, history: dict, ends: Sequence[RunEnd], compile_time: float,
         wall: float, batch_size: int, trainer: Trainer, base_rate: Any = None,
         grid: Mapping[str, Any] | None = None, optimizer: Any = None) -> dict:
    """One configuration's row from its seeds' ``history`` (as :func:`_ran` gives it) and ``ends``.

    Its aggregates (``*_mean``, ``*_std``, ``best_pop_max``) are over the seeds that finished (completed, or stopped
    by a callback), ``failed`` counts the others; ``solved_fraction`` is over every seed, a failed one unsolved;
    ``env_steps_per_seed`` is over every seed (what each cost, a failed one's up to its failure). No seed finished:
    the aggregates are NaN."""
    finished = np.array([end.status != "failed" for end in ends])
    final_centre = _final_centre(history, ends)
    # (initial: a group whose every seed failed at its first generation has no rows)
    best_centre = np.max(np.where(np.isfinite(history["centre_return"]), history["centre_return"], -np.inf), axis=0,
                         initial=-np.inf)
    mean = lambda values: float(np.mean(values[finished])) if finished.any() else math.nan
    std = lambda values: float(np.std(values[finished])) if finished.any() else math.nan
    solved = trainer.spec.solved_return
    # Each seed's last row (-1: it failed at its first generation and has none)
    last = [int(np.sum(history["generation"][:, b] <= end.generation)) - 1 for b, end in enumerate(ends)]
    at_end = lambda name, failed_too=False: np.array([
        history[name][g, b] if g >= 0 and (failed_too or end.status != "failed") else math.nan
        for b, (g, end) in enumerate(zip(last, ends))])
    pop_max = history["pop_max"][:, finished]
    pop_max = pop_max[np.isfinite(pop_max)]
    row = _shown_point(point, grid)
    if "perturbation" in point or "perturbation_rank" in point:
        row["perturbation"], row["perturbation_rank"] = trainer.config.perturbation, trainer.config.perturbation_rank
    if "learning_rate" not in point:
        # Say which rate each row ran with: in a multi-optimizer sweep each optimizer has its own default.
        first = history["learning_rate"][0] if len(history["learning_rate"]) else np.array([math.nan])
        first = first[np.isfinite(first)]  # (a seed that failed at its first generation has none)
        # (the rate as the float32 it ran as, shortest: adam's default read 0.20000000298023224 in the table)
        row["learning_rate"] = float(str(np.float32(first[0]))) if first.size else None
    row["learning_rate_source"] = ("grid" if "learning_rate" in point else "config" if base_rate is not None
                                   # an optax object's rate is whatever it was built with (learning_rate is refused)
                                   else "optax object" if trainer.optimizer_name and not isinstance(optimizer, str)
                                   and optimizer is not None
                                   else "optimizer default" if trainer.optimizer_name else "strategy")
    statuses = {end.status for end in ends}
    messages = lambda status, text: "; ".join(text(seed, end) for seed, end in zip(seeds, ends)
                                              if end.status == status) or None
    row.update(
        seeds=" ".join(map(str, seeds)),
        status="failed" if "failed" in statuses else "stopped" if "stopped" in statuses else "completed",
        failed=int(np.sum(~finished)),
        generations=max(end.generation for end in ends),
        final_centre_return_mean=mean(final_centre),
        final_centre_return_std=std(final_centre),
        best_centre_return_mean=mean(best_centre),
        final_pop_mean_mean=mean(at_end("pop_mean")),
        best_pop_max=float(np.max(pop_max)) if pop_max.size else math.nan,
        # Over every seed: a failed seed did not solve the env (its NaN compares False)
        solved_fraction=float(np.mean(final_centre >= solved)) if solved is not None else math.nan,
        env_steps_per_seed=float(np.mean(np.nan_to_num(at_end("env_steps", failed_too=True)))),
        compile_time=compile_time,
        group_run_time=wall,
        group_batch_size=batch_size,
        error=messages("failed", lambda seed, end: f"seed {seed}: {end.message}"),
        stopped=messages("stopped", lambda seed, end: f"seed {seed} after generation {end.generation}: {end.message}"),
    )
    return row


SEEDS_TAG = "sweep/seeds"  # how many seeds each point of a configuration's curves averages


def _log_configuration(log_dir: str, history: dict, point: dict, base: ESConfig, trainer: Trainer, seeds: list,
                       optimizer: Any = None, ends: Sequence[RunEnd] | None = None,
                       row: Mapping[str, Any] | None = None) -> None:
    """One TensorBoard run: each generation's metrics averaged over the seeds that did not fail (those the row
    aggregates), so a seed that diverges midway never makes the curves jump; over every seed when each one failed.
    A seed a callback stopped leaves the mean after its last generation; ``sweep/seeds`` says how many seeds each
    generation's mean holds. The HPARAMS entry's final metrics are ``row``'s (the table's means over seeds: the best
    centre return of the mean curve is lower than the mean of each seed's best), where it is given and finite."""
    hparams = dict(run_hparams(trainer, point_config(base, point), optimizer), strategy=trainer.strategy.name,
                   seeds=" ".join(map(str, seeds)))
    finished = np.array([end.status != "failed" for end in ends]) if ends is not None else None
    if finished is not None and finished.any():
        history = {k: v[:, finished] for k, v in history.items()}
    final = None if row is None else {"hparams/final_pop_mean": row.get("final_pop_mean_mean"),
                                      "hparams/best_centre_return": row.get("best_centre_return_mean"),
                                      "hparams/generations": row.get("generations")}
    logger = TensorBoardLogger(log_dir, hparams, final=final)
    try:
        for g in range(len(history["generation"])):
            ran = np.isfinite(history["pop_mean"][g])  # the seeds that ran this generation (NaN after a seed's end)
            if not ran.any():  # every seed had ended (other configurations ran on)
                continue
            record = {}
            for k, v in history.items():
                row = v[g].astype(np.float64)
                record[k] = float(np.nanmean(row)) if np.isfinite(row).any() else math.nan
            record["generation"] = int(history["generation"][g, 0])
            logger(record)
            logger.writer.add_scalar(SEEDS_TAG, int(ran.sum()), record["generation"])
    finally:
        logger.close()


def write_table(rows: list[dict], out_dir: str) -> tuple[str, str]:
    """Write ``rows`` as ``sweep.csv`` and ``sweep.json`` in ``out_dir``, each atomically (a file killed midway
    leaves the one before); returns both paths."""
    os.makedirs(out_dir or ".", exist_ok=True)  # ("": the current folder, as for the lock and sweep.resume.json)
    csv_path, json_path = os.path.join(out_dir, "sweep.csv"), os.path.join(out_dir, "sweep.json")
    columns = list(dict.fromkeys(k for row in rows for k in row))
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    write_atomically(csv_path, lambda f: f.write(text.getvalue()), mode="w")
    write_atomically(json_path, lambda f: json.dump(
        [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()} for row in rows],
        f, indent=2), mode="w")
    return csv_path, json_path


# ----------------------------------------------------------------- sweep files
def build_policy(spec: Mapping[str, Any]) -> nn.Module:
    """A policy from ``{"type": "gru", "hidden": 5, "layers": 2}`` or ``{"type": "mlp", "hidden": 32, "layers": 2}``."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"policy must be a table of type, hidden and layers (TOML: [policy] with type = \"gru\", "
                         f"hidden = 5, layers = 2), got {spec!r}")
    spec = dict(spec)
    kind = spec.pop("type", "gru")
    if not isinstance(kind, str):
        raise ValueError(f"policy type must be \"gru\" or \"mlp\", got {kind!r}")
    kind = kind.lower()
    hidden, layers = spec.pop("hidden", 5), spec.pop("layers", 2)
    for name, value in (("hidden", hidden), ("layers", layers)):
        # a float would run as its floor (2.7 as 2), and 0 layers is no network
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"policy {name} must be a positive integer, got {value!r}")
    hidden, layers = int(hidden), int(layers)
    if spec:
        raise ValueError(f"unknown policy key(s) {', '.join(sorted(spec))}; a policy takes type, hidden, layers")
    if kind == "gru":
        return GRUPolicy(hidden=hidden, layers=layers)
    if kind == "mlp":
        return MLPPolicy(hidden_sizes=(hidden,) * layers)
    raise ValueError(f"unknown policy type {kind!r}; use 'gru' or 'mlp'")


def _without_repeated_keys(pairs: list[tuple[str, Any]]) -> dict:
    """A JSON object as a dict, refusing a key given twice (``json`` keeps the last one silently: a grid's
    ``"learning_rate": [0.1]`` dropped for a later ``"learning_rate": [0.2, 0.3]``), as TOML refuses one."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"the key {key!r} is given twice in one object (JSON would keep only the last): give it "
                             f"once, with a list of its values to sweep them")
        seen[key] = value
    return seen


def load_sweep_file(path: str) -> dict:
    """Read a JSON or TOML sweep description into :func:`sweep` keyword arguments.

    The file has ``env``, ``optimizer`` (a name or list), ``seeds``, optional ``log_dir`` (``"none"``: no
    TensorBoard logs, as ``jes train --log-dir none``) and ``out_dir`` (``"none"``: no table), a ``policy`` table (``type``, ``hidden``, ``layers``) and a ``config`` table of
    :class:`ESConfig` fields whose values may be lists. For example (TOML)::

        env = "CartPole-v1"
        optimizer = ["adam", "novograd"]
        seeds = [0, 1, 2, 3]
        out_dir = "sweeps/cartpole"
        [policy]
        type = "gru"
        hidden = 5
        layers = 2
        [config]
        num_members = 256
        learning_rate = [0.01, 0.03]
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"no sweep file at {path!r}")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        if path.endswith(".toml"):
            try:
                import tomllib
            except ImportError:  # Python < 3.11
                import tomli as tomllib
            spec = tomllib.loads(raw.decode())
        elif path.endswith(".json"):
            spec = json.loads(raw, object_pairs_hook=_without_repeated_keys)
        else:
            raise ValueError(f"sweep file {path} must end in .json or .toml")
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"sweep file {path} cannot be parsed: {err}") from err
    except RecursionError:
        raise ValueError(f"sweep file {path} cannot be parsed: it is nested too deeply") from None
    if not isinstance(spec, Mapping):  # a JSON list or value ("sequence item 0: expected str instance" before)
        raise ValueError(f"sweep file {path} must hold a table of keys (env, seeds, config, ...): a JSON object, "
                         f"got {type(spec).__name__} {spec!r:.60}")
    allowed = {"env", "optimizer", "strategy", "seeds", "log_dir", "out_dir", "policy", "config"}
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise ValueError(f"sweep file {path}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    if "env" not in spec:
        raise ValueError(f"sweep file {path} needs an env, e.g. env = \"CartPole-v1\"")
    names = lambda v: isinstance(v, str) or (isinstance(v, list) and bool(v) and all(isinstance(x, str) for x in v))
    expected = {
        "env": (lambda v: isinstance(v, str), 'an env name, e.g. env = "CartPole-v1"'),
        "optimizer": (lambda v: v is None or names(v), 'an optimizer name or a list of names, e.g. optimizer = "adam" or ["adam", "sgd"]'),
        "strategy": (lambda v: v is None or names(v),
                     'a strategy name or a list of names, e.g. strategy = "openai_es" or ["openai_es", "pgpe"]'),
        "out_dir": (lambda v: v is None or isinstance(v, str), 'a directory, e.g. out_dir = "sweeps/cartpole" '
                                                               '("none", or JSON null: no table)'),
        "config": (lambda v: isinstance(v, Mapping), "a table of ESConfig fields ([config] in TOML, an object in JSON)"),
        "policy": (lambda v: isinstance(v, Mapping), "a table of type, hidden and layers ([policy] in TOML, an object "
                                                     "in JSON)"),
    }
    for key, (fine, what) in expected.items():
        if key in spec and not fine(spec[key]):
            raise ValueError(f"sweep file {path}: {key} must be {what}, got {spec[key]!r}")
    try:
        policy = build_policy(spec.get("policy", {}))
    except ValueError as err:
        raise ValueError(f"sweep file {path}: {err}") from None
    grid = dict(spec.get("config", {}))
    both = [key for key in ("optimizer", "strategy") if key in spec and key in grid]
    if both:
        raise ValueError(f"sweep file {path}: {both[0]} is given both at the top level and in [config]; give it once "
                         f"(a name or a list of names at the top level)")
    optimizer = spec.get("optimizer")
    if isinstance(optimizer, list):
        grid["optimizer"] = optimizer
        optimizer = optimizer[0]
    strategy = spec.get("strategy", "openai_es")
    if isinstance(strategy, list):
        grid["strategy"] = strategy
        strategy = strategy[0]
    kwargs = dict(policy=policy, env=spec["env"], optimizer=optimizer, grid=grid,
                  strategy=strategy,
                  seeds=spec.get("seeds", [0]), out_dir=spec.get("out_dir", "sweep_results"))
    if isinstance(kwargs["out_dir"], str) and kwargs["out_dir"].lower() == "none":  # as log_dir's (TOML has no null)
        kwargs["out_dir"] = None
    try:
        kwargs["seeds"] = _checked_seeds(kwargs["seeds"])
    except (TypeError, ValueError) as err:
        raise ValueError(f"sweep file {path}: {err}") from None
    if "log_dir" in spec:
        log_dir = spec["log_dir"]
        if log_dir is not None and not isinstance(log_dir, str):
            raise ValueError(f"sweep file {path}: log_dir must be a directory or \"none\", got {log_dir!r}")
        kwargs["log_dir"] = None if log_dir is None or log_dir.lower() == "none" else log_dir
    return kwargs


class _CallableModule(type(sys)):
    """``jes.sweep`` is this module and, called, its :func:`sweep`: ``jes.sweep(policy, env, optimizer, grid=...)``
    is ``jes.sweep.sweep(...)``, as ``jes.train(...)`` and ``jes.optimize(...)`` are calls (without it, Python's
    "'module' object is not callable")."""

    __call__ = staticmethod(sweep)  # the function itself: no frame of its own between a warning and the caller


sys.modules[__name__].__class__ = _CallableModule
