"""What a strategy is built with for a run: its :class:`~jes.strategies.base.Context` (the optimizer built, the
perturbation checked against it) and the learning rate its mean moves with, defaults resolved.

Shared by the generation step (:mod:`jes.generation`), the training loop's hyperparameter record
(:mod:`jes.loop`) and a sweep's up-front checks of its grid points (:mod:`jes.sweep`).
"""
from __future__ import annotations

from typing import Any

from jes import perturbations, strategies
from jes.config import ESConfig
from jes.optimizers import DEFAULT_LEARNING_RATES, make_optimizer, resolve_name
from jes.strategies.base import Context, Strategy


def check_strategy_supports(strategy: Strategy, perturbation: Any) -> None:
    """Raises ``ValueError`` when ``strategy`` cannot use ``perturbation`` (a structured one needs one sigma)."""
    if perturbation.structured and not strategy.isotropic:
        supported = [n for n in strategies.names() if strategies.get(n).isotropic]
        keeps = "a full covariance matrix" if strategy.name == "cma_es" else "a sigma per parameter"
        raise ValueError(
            f"{perturbation.name} perturbations need one sigma shared by all parameters (members mean + sigma * E_i), "
            f"but {strategy.name} keeps {keeps}, which a rank-r product cannot carry: use "
            f"{' or '.join(supported)} for {perturbation.name} perturbations, or {strategy.name} with full_rank ones "
            f"(the perturbation: jes.train's perturbation=, the CLI's --perturbation)"
        )


def build_context(strategy: Strategy, optimizer: Any, config: ESConfig, num_params: int,
                  layout: Any = None) -> tuple[Context, str | None]:
    """The strategy's :class:`Context` for ``config``, its optimizer built; and the optimizer's name.

    ``layout``: the structured perturbation's layout of the parameters (``None``: full rank).

    Raises:
        ValueError: an optimizer given to a strategy that does not use one, or a run the
            strategy cannot serve (e.g. an odd population for mirrored sampling, or a structured
            perturbation for a strategy with per-parameter sigmas).
    """
    perturbation = perturbations.get(config.perturbation, config.perturbation_rank)
    check_strategy_supports(strategy, perturbation)
    strategy.check_fields()
    if perturbation.structured:
        if layout is None:
            raise ValueError(f"{perturbation.name} perturbations factor a policy's weight matrices; this run has a "
                             f"flat parameter vector (jes.optimize / AskTell): use perturbation='full_rank'")
    if isinstance(optimizer, str) and strategies.canonical_name(optimizer):
        raise ValueError(f"{optimizer!r} is a strategy, not an optimizer: pass strategy={optimizer!r} (the optimizer, "
                         f"jes.train's third argument, is a name such as 'adam' or an optax.GradientTransformation)")
    if strategy.uses_optimizer:
        optimizer = strategy.default_optimizer if optimizer is None else optimizer
        built = make_optimizer(optimizer, _learning_rate_setting(strategy, optimizer, config, num_params))
        name = optimizer if isinstance(optimizer, str) else type(optimizer).__name__
    else:
        strategies.base.check_optimizer_free(strategy, optimizer)
        built, name = None, None
    antithetic = strategy.antithetic(config.antithetic)
    ctx = Context(num_params=num_params, num_members=config.num_members, noise_std=config.noise_std,
                  optimizer=built, fitness_shaping=config.fitness_shaping, weight_decay=config.weight_decay,
                  antithetic=antithetic, perturbation=perturbation if perturbation.structured else None,
                  layout=layout if perturbation.structured else None)
    if callable(config.noise_std) and strategy.name != "openai_es":
        own = ("keeps noise_std fixed (give a number: its sigma)" if strategy.name == "ars" else
               "adapts its own sigma (give a number: its initial sigma)")
        raise ValueError(f"a noise_std schedule is an openai_es feature, which only openai_es takes; {strategy.name} "
                         f"{own}")
    if antithetic and config.num_members % 2:
        raise ValueError(f"num_members={config.num_members} is odd, but {strategy.name} evaluates mirrored pairs; "
                         f"use an even population")
    if antithetic and config.chunk_size is not None and config.chunk_size % 2:
        raise ValueError(f"chunk_size={config.chunk_size} must be even: {strategy.name} evaluates whole mirrored pairs")
    strategy.validate(ctx)
    return ctx, name


def _learning_rate_setting(strategy: Strategy, optimizer: Any, config: ESConfig, num_params: int) -> Any:
    """The rate the mean's optimizer is built with: the strategy's own (pgpe's ``center_lr``), else
    ``config.learning_rate``, else the strategy's default for this run; ``None``: the named optimizer's default."""
    learning_rate = getattr(strategy, "center_lr", None)
    learning_rate = config.learning_rate if learning_rate is None else learning_rate
    if learning_rate is None:
        learning_rate = strategy.default_learning_rate(optimizer, num_params, config.noise_std)
    return learning_rate


def run_learning_rate(strategy: Strategy, optimizer: Any, config: ESConfig, num_params: int) -> Any:
    """The learning rate (a number or a schedule) a run of ``config`` moves its mean with, defaults resolved as
    :func:`build_context` resolves them; ``None`` for a strategy without an optimizer, or an optax object's (its
    rate is inside it)."""
    if not strategy.uses_optimizer:
        return None
    optimizer = strategy.default_optimizer if optimizer is None else optimizer
    learning_rate = _learning_rate_setting(strategy, optimizer, config, num_params)
    if learning_rate is None and isinstance(optimizer, str):
        learning_rate = DEFAULT_LEARNING_RATES[resolve_name(optimizer)]
    return learning_rate
