"""The run configuration: a frozen, validated dataclass with defaults that solve CartPole."""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Callable, Union

from jes.strategies.noise import FITNESS_SHAPINGS

Schedule = Callable[[Any], Any]
FloatOrSchedule = Union[float, Schedule]


@dataclasses.dataclass(frozen=True)
class ESConfig:
    """Hyperparameters of an OpenAI-ES run.

    Attributes:
        num_members: population size (perturbed policies per generation). Must be
            even with ``antithetic``.
        num_generations: generations to run.
        noise_std: perturbation std sigma, a constant or an optax-style schedule of the generation.
        learning_rate: optimizer step size (constant or schedule); ``None`` takes the
            named optimizer's default. Refused (ValueError) with a ``GradientTransformation`` you pass: set
            the rate inside it.
        episodes_per_member: episodes averaged into one member's fitness, each with its own key.
        fitness_shaping: ``"centered_ranks"`` (default), ``"nes_utilities"`` (NES log-rank utilities of the top
            half: :func:`jes.strategies.noise.nes_utilities`; most are about ``1/n`` in size, so a step that is not
            normalised, as pgpe's or sgd's, moves less with them than with centered ranks; adam's does not),
            ``"z_score"`` or ``"raw"``.
        antithetic: mirrored sampling, members ``2p``/``2p+1`` use ``+eps``/``-eps`` (pgpe and ars always
            mirror: they refuse ``False``).
        weight_decay: L2 coefficient; adds ``weight_decay * theta`` to the loss gradient.
        eval_every: evaluate the unperturbed centre every this many generations (0: never,
            except the last generation).
        eval_episodes: fresh episodes per centre evaluation.
        max_episode_steps: episode step limit; ``None`` uses the env's own.
        chunk_size: members evaluated together in one compiled chunk. Results do not
            depend on how chunks are spread over devices or hosts, so this is part of
            the run's identity. ``None`` picks ``min(num_members, 256)`` (for low-rank perturbations up to
            2,048, halved while the chunk's draws exceed 16 MiB, down to 512, and at most 2^26 floats of
            draws; 32 for Python simulators),
            rounded to pairs. A checkpoint records the chunk its run evaluated. The default is sized for CPU
            caches; a device runs its chunks one after another, so on a GPU or TPU give each device one chunk
            (``num_members / devices``, if its memory holds it; ``jes.train`` warns when the default gives a GPU or TPU
            several).
        normalize_observations: running mean/std observation normalisation (OpenAI ES),
            updated from member rollouts.
        stop_at_return: stop once a centre evaluation reaches this mean return
            (``None``: run all generations).
        perturbation: the shape of each member's perturbation (:mod:`jes.perturbations`):
            ``"full_rank"`` (default, dense noise; every strategy) or ``"low_rank"`` (EGGROLL: each
            weight matrix perturbed by a rank-``perturbation_rank`` product, applied without
            materialising per-member matrices; ``openai_es`` and ``ars``). A ``jes.LowRank(rank=r)``
            or ``jes.FullRank()`` object is accepted and stored as these two fields.
        perturbation_rank: ``r`` of low-rank perturbations.
    """

    num_members: int = 512
    num_generations: int = 25
    noise_std: FloatOrSchedule = 0.2
    learning_rate: FloatOrSchedule | None = None
    episodes_per_member: int = 1
    fitness_shaping: str = "centered_ranks"
    antithetic: bool = True
    weight_decay: float = 0.0
    eval_every: int = 1
    eval_episodes: int = 64
    max_episode_steps: int | None = None
    chunk_size: int | None = None
    normalize_observations: bool = True
    stop_at_return: float | None = None
    perturbation: Any = "full_rank"
    perturbation_rank: int = 1

    def __post_init__(self):
        if isinstance(self.perturbation, type):  # jes.LowRank without parentheses read as rank 1 before
            raise ValueError(f"perturbation={self.perturbation.__name__} is the class; pass an instance: "
                             f"{self.perturbation.__name__}() (e.g. jes.LowRank(rank=2)), or its name "
                             f"('full_rank', 'low_rank')")
        if not isinstance(self.perturbation, str) and hasattr(self.perturbation, "name"):
            given = self.perturbation  # a jes.LowRank / jes.FullRank object: stored as plain fields
            rank = getattr(given, "rank", None)
            if rank is not None and self.perturbation_rank not in (1, rank):
                raise ValueError(f"perturbation={given!r} has rank {rank}, but perturbation_rank={self.perturbation_rank}: "
                                 f"give the rank once (jes.LowRank(rank={self.perturbation_rank}), or drop "
                                 f"perturbation_rank)")
            object.__setattr__(self, "perturbation", given.name)
            if rank is not None:
                object.__setattr__(self, "perturbation_rank", rank)
        if self.perturbation not in ("full_rank", "low_rank"):
            raise ValueError(f"unknown perturbation {self.perturbation!r}; choose 'full_rank' or 'low_rank' "
                             f"(or pass jes.FullRank() / jes.LowRank(rank=r))")
        def positive_int(name):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
            object.__setattr__(self, name, int(value))  # numpy integers (a grid from np.arange) as plain ints

        for name in ("num_members", "num_generations", "episodes_per_member", "eval_episodes", "perturbation_rank"):
            positive_int(name)
        if self.perturbation == "full_rank" and self.perturbation_rank != 1:
            raise ValueError(f"perturbation_rank={self.perturbation_rank} is the rank of low-rank perturbations, but "
                             f"perturbation is 'full_rank'; add perturbation='low_rank' (jes train: --perturbation "
                             f"low_rank --rank {self.perturbation_rank}; with strategy openai_es or ars, whose one "
                             f"sigma low rank needs), or drop the rank")
        if self.antithetic and self.num_members % 2:
            raise ValueError(
                f"num_members={self.num_members} is odd, but antithetic sampling evaluates mirrored pairs; "
                f"use an even population (e.g. {self.num_members + 1}) or antithetic=False"
            )
        if self.num_members < 2:
            raise ValueError(f"num_members must be at least 2 (fitness is shaped across the population), got {self.num_members}")
        for name in ("noise_std", "learning_rate"):
            value = getattr(self, name)
            if value is None and name == "learning_rate":
                continue
            if callable(value):
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number or a schedule, got {value!r}")
            object.__setattr__(self, name, float(value) if not isinstance(value, int) else value)  # numpy scalars
        if self.fitness_shaping not in FITNESS_SHAPINGS:
            raise ValueError(
                f"unknown fitness_shaping {self.fitness_shaping!r}; choose one of {', '.join(FITNESS_SHAPINGS)}"
            )
        if isinstance(self.weight_decay, bool) or not isinstance(self.weight_decay, numbers.Real) \
                or not math.isfinite(self.weight_decay) or self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if not isinstance(self.weight_decay, (int, float)):
            object.__setattr__(self, "weight_decay", float(self.weight_decay))  # numpy scalars as plain floats
        if self.stop_at_return is not None:
            if isinstance(self.stop_at_return, bool) or not isinstance(self.stop_at_return, numbers.Real) \
                    or math.isnan(self.stop_at_return):
                raise ValueError(f"stop_at_return must be a number (a mean return) or None, got "
                                 f"{self.stop_at_return!r}")  # NaN was taken: no return ever reaches it
            object.__setattr__(self, "stop_at_return", float(self.stop_at_return))
        if not isinstance(self.eval_every, int) or self.eval_every < 0:
            raise ValueError(f"eval_every must be an integer >= 0, got {self.eval_every!r}")
        if self.max_episode_steps is not None and (not isinstance(self.max_episode_steps, int) or self.max_episode_steps <= 0):
            raise ValueError(f"max_episode_steps must be a positive integer or None, got {self.max_episode_steps!r}")
        if self.chunk_size is not None:
            positive_int("chunk_size")
            if self.antithetic and self.chunk_size % 2:
                raise ValueError(f"chunk_size={self.chunk_size} must be even with antithetic sampling (whole pairs)")

    def replace(self, **changes) -> "ESConfig":
        """A copy with fields changed (validated again)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            valid = ", ".join(f.name for f in dataclasses.fields(self))
            raise TypeError(f"unknown ESConfig field(s) {', '.join(unknown)}; valid fields are: {valid}")
        given = changes.get("perturbation")
        if given is not None and "perturbation_rank" not in changes:
            # A perturbation object replaces the rank with its own; full rank has none, so switching to it drops
            # the rank (a resumed low-rank run given --perturbation full_rank then reports the mismatch itself).
            if not isinstance(given, str):
                changes["perturbation_rank"] = getattr(given, "rank", None) or 1
            elif given == "full_rank":
                changes["perturbation_rank"] = 1
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain-data view (schedules shown by their repr)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = repr(value) if callable(value) else value
        return out


def checked_config(config: object) -> "ESConfig":
    """``config`` (``None``: the defaults) as an :class:`ESConfig`, or a ``TypeError`` saying what to pass: a dict of
    fields failed later as "'dict' object has no attribute 'replace'"."""
    if config is None:
        return ESConfig()
    if not isinstance(config, ESConfig):
        hint = (f"jes.ESConfig(**{{...}}) of your dict, or its fields as keywords ({next(iter(config))}=...)"
                if isinstance(config, dict) and config else "jes.ESConfig(num_members=256, ...)")
        raise TypeError(f"config must be a jes.ESConfig, got {type(config).__name__}: pass {hint}")
    return config
