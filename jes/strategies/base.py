"""The strategy seam: what every ES algorithm in jes implements.

A strategy is a frozen dataclass of hyperparameters with pure methods over its
own state pytree (a ``flax.struct`` dataclass with at least a ``mean`` field,
the centre of the search distribution). One generation, however it is spread
over devices, processes or ``jes-worker`` hosts, is::

    gen_key  = fold_in(es_key, generation)
    members  = sample(ctx, state, gen_key, generation, start, size)   # per chunk, [size, P]
    fitness  = evaluate(members)                                       # per chunk, anywhere
    weights  = weights(ctx, state, fitness)                            # whole population, every host
    stats_c  = chunk_stats(ctx, state, gen_key, generation, start, weights[chunk])   # per chunk
    stats    = stats_0 + stats_1 + ...                                 # in chunk order
    state'   = update(ctx, state, stats, fitness, generation)

Member ``i``'s perturbation is a pure function of ``(gen_key, i)``: ``sample``
and ``chunk_stats`` regenerate it from the key rather than keeping it, so a
chunk's statistics can be computed wherever its weights are known, and the
chunk-ordered sum is the same bits whoever computed which chunk.
Where one device holds the chunk for both (``jes.optimize`` with one chunk per
device), ``draws = draw(ctx, gen_key, start, size)`` is computed once and given to
both (``draws=``): the same values, drawn once.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import optax

from jes.strategies import noise
from jes.strategies.noise import sorted_utilities  # noqa: F401  (used by the strategies; it lives beside the fitness shapings)


@dataclasses.dataclass(frozen=True)
class Context:
    """What a strategy needs to know about the run it serves (static: part of the compiled program).

    Attributes:
        num_params: length ``P`` of the flat parameter vector.
        num_members: population size ``n``.
        noise_std: initial (or, for OpenAI-ES, constant or scheduled) perturbation std.
        optimizer: the optax transformation for strategies that use one, else ``None``.
        fitness_shaping: ``"centered_ranks"``, ``"nes_utilities"``, ``"z_score"`` or ``"raw"`` (strategies that
            shape fitness).
        weight_decay: L2 coefficient (strategies that take a gradient step).
        antithetic: whether members ``2p``/``2p+1`` are mirrored pairs.
        perturbation: the structured perturbation (``jes.perturbations.LowRank``) whose shape the
            members of isotropic strategies take, or ``None`` for the strategy's own dense members.
        layout: the perturbation's static layout of the parameters (``None`` without one).
    """

    num_params: int
    num_members: int
    noise_std: Any = 0.2
    optimizer: optax.GradientTransformation | None = None
    fitness_shaping: str = "centered_ranks"
    weight_decay: float = 0.0
    antithetic: bool = True
    perturbation: Any = None
    layout: Any = None

    def sigma_at(self, generation: jax.Array) -> jax.Array | None:
        """The scheduled noise std of ``generation``, or ``None`` when ``noise_std`` is a constant."""
        if callable(self.noise_std):
            return jnp.asarray(self.noise_std(generation), jnp.float32)
        return None

    @property
    def initial_noise_std(self) -> float:
        return 0.0 if callable(self.noise_std) else float(self.noise_std)


class Strategy:
    """Base class of jes strategies (subclasses are frozen dataclasses of hyperparameters).

    Class attributes:
        name: registry name (``jes.strategies.get(name)``).
        uses_optimizer: whether the mean is moved by an optax optimizer (``jes.train``'s
            ``optimizer`` argument); strategies without one refuse an optimizer.
        default_optimizer: optimizer name used when none is given.
    """

    name: ClassVar[str] = ""
    uses_optimizer: ClassVar[bool] = False
    # Whether members are mean + sigma * E_i with one sigma, so a structured perturbation may shape E_i.
    isotropic: ClassVar[bool] = False
    default_optimizer: ClassVar[str | None] = None
    # Optimizer jes.optimize/AskTell use when none is given (None: default_optimizer).
    blackbox_optimizer: ClassVar[str | None] = None
    # The field that sets the initial sigma in place of ESConfig.noise_std (None: the strategy has none).
    sigma_field: ClassVar[str | None] = None

    # ------------------------------------------------------------- run shape
    def antithetic(self, requested: bool) -> bool:
        """Whether this strategy samples mirrored pairs; ``requested`` is ``ESConfig.antithetic``."""
        return requested

    def uses_obs_norm(self, requested: bool) -> bool:
        """Whether policies are fed normalised observations; ``requested`` is ``ESConfig.normalize_observations``."""
        return requested

    def default_population(self, num_params: int) -> int:
        """Population size for :func:`jes.optimize` when none is given."""
        return 4 + int(3 * math.log(max(num_params, 1)))

    def check_fields(self) -> None:
        """Raise ``ValueError`` for a hyperparameter out of range; run before the optimizer is built from them."""

    def validate(self, ctx: Context) -> None:
        """Raise ``ValueError`` for a run this strategy cannot serve."""

    def default_learning_rate(self, optimizer: Any, num_params: int, noise_std: Any) -> float | None:
        """The mean optimizer's learning rate when neither the strategy nor ``ESConfig.learning_rate`` sets
        one (``optimizer`` as given: a name or a transformation); ``None``: the named optimizer's default."""
        return None

    # Hyperparameters whose default (``None``) differs between policies (:func:`jes.train`) and functions
    # (:func:`jes.optimize`, :class:`jes.AskTell`): ``{field: (for policies, for functions)}``; numbers, or
    # booleans for a switch.
    PER_USE_DEFAULTS: ClassVar[dict[str, tuple[float, float] | tuple[bool, bool]]] = {}

    def for_functions(self) -> "Strategy":
        """This strategy with its defaults for :func:`jes.optimize` / :class:`jes.AskTell` where they differ
        from its defaults for policies (hyperparameters left at ``None`` are resolved; set ones are kept)."""
        unset = {name: both[1] for name, both in self.PER_USE_DEFAULTS.items() if getattr(self, name) is None}
        return dataclasses.replace(self, **unset) if unset else self

    def resolved(self, name: str) -> float | bool:
        """Hyperparameter ``name`` of :data:`PER_USE_DEFAULTS` as used: its value, or the policies' default
        (a switch's as a ``bool``, a number's as a ``float``)."""
        value = getattr(self, name)
        value = self.PER_USE_DEFAULTS[name][0] if value is None else value
        return bool(value) if isinstance(self.PER_USE_DEFAULTS[name][0], bool) else float(value)

    def check_per_use_defaults(self) -> None:
        """Raise ``ValueError`` for a :data:`PER_USE_DEFAULTS` number set to a non-positive value, or a switch
        set to something other than ``True``/``False``."""
        for name, (for_policies, _) in self.PER_USE_DEFAULTS.items():
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(for_policies, bool):
                if not isinstance(value, bool):
                    raise ValueError(f"{self.name} {name} must be True or False (or None for the default), got {value!r}")
            elif not (isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 < value < math.inf):
                # (an infinite rate was taken, and the run stopped as "the strategy's update is not finite")
                raise ValueError(f"{self.name} {name} must be positive and finite (or None for the default), "
                                 f"got {value!r}")

    def own_sigma(self) -> float | None:
        """The initial sigma this strategy object sets itself (its :attr:`sigma_field`, e.g.
        ``CMAES(sigma_init=0.5)``), or ``None``: it starts from ``ESConfig.noise_std``."""
        return None if self.sigma_field is None else getattr(self, self.sigma_field)

    def initial_sigma(self, noise_std: float) -> float:
        """The sigma :meth:`init` starts from when ``ESConfig.noise_std`` is ``noise_std`` (a number): the
        strategy's own field when set, else ``noise_std``."""
        own = self.own_sigma()
        return float(noise_std) if own is None else float(own)

    # ------------------------------------------------------------- algorithm
    def init(self, ctx: Context, mean: jax.Array) -> Any:
        raise NotImplementedError

    def draw(self, ctx: Context, gen_key: jax.Array, start: jax.Array, size: int) -> Any:
        """The random draws members ``start .. start+size-1`` are built from, or ``None`` (the default: only
        :meth:`sample` and :meth:`chunk_stats` know them, and each draws its own).

        A generation that holds one chunk per device draws them once and gives them to both (``draws=``) instead
        of having the statistics redraw what the members were sampled from: the same values from the same keys,
        computed once (inside a compiled loop of generations XLA does not merge the two draws itself).
        """
        return None

    def sample(self, ctx: Context, state: Any, gen_key: jax.Array, generation: jax.Array, start: jax.Array,
               size: int, draws: Any = None) -> jax.Array:
        """Flat parameters of members ``start .. start+size-1``, ``[size, P]`` (from ``draws``, :meth:`draw`'s, if given)."""
        raise NotImplementedError

    def weights(self, ctx: Context, state: Any, fitness: jax.Array) -> Any:
        """Per-member weights from the whole population's fitness ``[n]`` (maximised): a pytree of ``[n]`` arrays."""
        raise NotImplementedError

    def chunk_stats(self, ctx: Context, state: Any, gen_key: jax.Array, generation: jax.Array, start: jax.Array,
                    weights: Any, draws: Any = None) -> Any:
        """Sufficient statistics of one chunk from its members' weights (leaves ``[size]``); summed over chunks
        (from ``draws``, :meth:`draw`'s, if given, else redrawn)."""
        raise NotImplementedError

    def update(self, ctx: Context, state: Any, stats: Any, fitness: jax.Array, generation: jax.Array) -> tuple[Any, dict]:
        """New state from the chunk-ordered sum of :meth:`chunk_stats`.

        Returns:
            ``(state, info)``; ``info`` holds scalars ``grad_norm``, ``update_norm``, ``noise_std``
            (mean sigma) and ``learning_rate`` (NaN where they do not apply).
        """
        raise NotImplementedError

    def noise_std(self, ctx: Context, state: Any, generation: jax.Array) -> jax.Array:
        """Mean sigma of the search distribution at ``generation`` (a scalar, for metrics)."""
        raise NotImplementedError

    def describe(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        return f"{type(self).__name__}({fields})"


# ------------------------------------------------------------------ shared pieces
NAN = float("nan")  # a Python float: importing jes must not start a JAX backend (jes.use_cpu_cores relies on it)


def info(grad: jax.Array | None = None, update: jax.Array | None = None, noise_std: jax.Array | None = None,
         learning_rate: Any = None) -> dict:
    """The metrics dict every :meth:`Strategy.update` returns."""
    nan = jnp.float32(NAN)
    norm = lambda x: nan if x is None else jnp.linalg.norm(x)
    return {
        "grad_norm": norm(grad),
        "update_norm": norm(update),
        "noise_std": nan if noise_std is None else jnp.asarray(noise_std, jnp.float32),
        "learning_rate": nan if learning_rate is None else jnp.asarray(learning_rate, jnp.float32),
    }


def unit_noise(gen_key: jax.Array, start: jax.Array, size: int, num_params: int, antithetic: bool) -> jax.Array:
    """Standard-normal perturbations of members ``start..start+size-1`` (:func:`jes.strategies.noise.chunk_noise`)."""
    return noise.chunk_noise(gen_key, start, size, num_params, antithetic)


def isotropic_draws(ctx: Context, gen_key: jax.Array, start: jax.Array, size: int) -> jax.Array | None:
    """:meth:`Strategy.draw` of the isotropic strategies: the mirrored pairs' draws ``[size // 2, P]``
    (:func:`pair_noise`) or every member's ``[size, P]``; ``None`` with a structured perturbation (it draws its own)."""
    if ctx.perturbation is not None:
        return None
    if ctx.antithetic:
        return pair_noise(gen_key, start, size, ctx.num_params)
    return noise.chunk_noise(gen_key, start, size, ctx.num_params, False)


def isotropic_members(ctx: Context, mean: jax.Array, sigma: jax.Array, gen_key: jax.Array, start: jax.Array,
                      size: int, draws: jax.Array | None = None) -> Any:
    """``mean + sigma * E_i`` for members ``start..start+size-1``: dense ``[size, P]`` (``E_i`` = :func:`unit_noise`,
    or from :func:`isotropic_draws`'s ``draws``), or in the form of ``ctx.perturbation`` (see :mod:`jes.perturbations`)."""
    if ctx.perturbation is None:
        if draws is None:
            unit = noise.chunk_noise(gen_key, start, size, ctx.num_params, ctx.antithetic)
        else:
            unit = noise.mirrored(draws) if ctx.antithetic else draws
        return mean[None, :] + sigma * unit
    return ctx.perturbation.members(ctx, mean, sigma, gen_key, start, size)


def isotropic_weighted_noise(ctx: Context, gen_key: jax.Array, start: jax.Array, weights: jax.Array,
                             draws: jax.Array | None = None) -> jax.Array:
    """``sum_i weights[i] * E_i`` over one chunk, ``[P]``, for the ``E_i`` of :func:`isotropic_members` (from
    :func:`isotropic_draws`'s ``draws`` if given)."""
    if ctx.perturbation is None:
        if draws is None:
            return noise.chunk_weighted_noise(gen_key, start, weights, ctx.num_params, ctx.antithetic)
        return noise.weighted_draws(weights, draws, ctx.antithetic)
    return ctx.perturbation.weighted_noise(ctx, gen_key, start, weights)


def pair_noise(gen_key: jax.Array, start: jax.Array, size: int, num_params: int) -> jax.Array:
    """The ``size // 2`` Gaussian draws of the mirrored pairs in a chunk, ``[size // 2, P]`` (member ``2p`` gets ``+eps_p``)."""
    members = jnp.asarray(start, jnp.int32) + jnp.arange(0, size, 2, dtype=jnp.int32)
    return jax.vmap(lambda m: noise.member_noise(gen_key, m, num_params, True))(members)


def check_settings_apply(strategy: Strategy, learning_rate: Any, weight_decay: float, fitness_shaping: str) -> None:
    """Refuse settings of the mean's optimizer step that ``strategy`` never reads (they would be silently ignored:
    the same bits as leaving them out)."""
    message = ignored_settings(strategy, learning_rate, weight_decay, fitness_shaping)
    if message is not None:
        raise ValueError(message)


def ignored_settings(strategy: Strategy, learning_rate: Any, weight_decay: float, fitness_shaping: str,
                     antithetic: bool = True) -> str | None:
    """What :func:`check_settings_apply` refuses, as a message (``None``: every setting given is read);
    ``antithetic`` is ``ESConfig.antithetic`` (``False`` is refused by a strategy that always mirrors)."""
    messages = []
    if not antithetic and strategy.antithetic(False):
        messages.append(f"antithetic=False would be ignored by strategy {strategy.name!r}: it evaluates mirrored "
                        f"pairs by definition; drop it, or use a strategy that samples unmirrored members "
                        f"(openai_es)")
    ignored = []
    own_rate = strategy.uses_optimizer and getattr(strategy, "center_lr", None) is not None
    if learning_rate is not None and (not strategy.uses_optimizer or own_rate):
        ignored.append(f"learning_rate={learning_rate!r}")
    if not strategy.uses_optimizer and weight_decay not in (0, 0.0, None):
        ignored.append(f"weight_decay={weight_decay!r}")
    if not strategy.uses_optimizer and fitness_shaping != "centered_ranks":
        ignored.append(f"fitness_shaping={fitness_shaping!r}")
    if ignored:
        why = (f"its center_lr={strategy.center_lr!r} is the rate" if own_rate else
               f"it moves its mean by its own rule, with its own rates and weights (fields of "
               f"jes.strategies.{type(strategy).__name__})")
        them = 'it' if len(ignored) == 1 else 'them'
        instead = (f"drop {them}, or drop center_lr to have the optimizer's learning_rate move the mean" if own_rate
                   else f"drop {them}, or use a strategy that takes {them} (openai_es, pgpe)")
        messages.insert(0, f"{', '.join(ignored)} would be ignored by strategy {strategy.name!r}: {why}; {instead}")
    return "; and ".join(messages) or None


def given_noise_std(config: Any, overrides: Mapping[str, Any]) -> Any:
    """The ``noise_std`` a caller gave: in ``overrides`` (``jes.train(noise_std=...)``, a grid point), else
    ``config``'s where it is not ``ESConfig``'s default (a default cannot be told from one given equal to it);
    ``None``: none given."""
    if "noise_std" in overrides:
        return overrides["noise_std"]
    default = type(config).__dataclass_fields__["noise_std"].default
    return None if config.noise_std is default or config.noise_std == default else config.noise_std


def both_sigmas(strategy: Strategy, noise_std: Any) -> str | None:
    """A refusal when ``noise_std`` is given to a strategy object that sets its own initial sigma (e.g.
    ``CMAES(sigma_init=0.5)``): the strategy's would win and ``noise_std`` would do nothing (rows of a sweep over it
    would differ only in their label); ``None`` when the strategy starts from ``noise_std`` or none is given."""
    own = strategy.own_sigma()
    if own is None or noise_std is None:
        return None
    return (f"noise_std={noise_std!r} and {type(strategy).__name__}({strategy.sigma_field}={own!r}) both set the "
            f"initial sigma, and the strategy's would win; give one of them: drop noise_std, or the strategy's "
            f"{strategy.sigma_field}")


def check_positive_field(strategy: Strategy, field: str, unset: str = "noise_std") -> None:
    """Raise ``ValueError`` unless ``strategy``'s ``field`` is ``None`` (``unset`` stands in) or a positive finite
    number (an initial sigma or a rate: zero, negative, inf or nan would train nothing, or nan)."""
    value = getattr(strategy, field)
    if value is None:
        return
    try:
        fine = not isinstance(value, bool) and math.isfinite(float(value)) and float(value) > 0
    except (TypeError, ValueError):
        fine = False
    if not fine:
        raise ValueError(f"{strategy.name} {field} must be positive and finite (or None for {unset}), got {value!r}")


def check_optimizer_free(strategy: Strategy, optimizer: Any) -> None:
    if optimizer is not None:
        raise ValueError(
            f"strategy {strategy.name!r} does not use an optax optimizer (it moves its mean by its own rule); "
            f"drop the optimizer argument, or use a strategy that takes one "
            f"(openai_es, pgpe)"
        )


Fn = Callable[..., Any]
