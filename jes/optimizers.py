"""Optimizers by name -> optax ``GradientTransformation``, with ES defaults.

Named optimizers are wrapped in ``optax.inject_hyperparams`` so the learning
rate lives in the optimizer state: it can be logged, checkpointed, and
vmapped over in a sweep without recompiling.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Union

import jax
import jax.numpy as jnp

import optax

Schedule = Callable[[int], float]
LearningRate = Union[float, Schedule]

# Tuned with the default population (512), noise_std 0.2 and observation normalisation on
# CartPole-v1 (median generations to solve over 5 seeds: adam/adabelief/amsgrad 0.2 -> 6-7,
# novograd 1.5 -> 5, radam 0.8 with b2=0.9 -> 8, sgd 1.0 -> 6); see benchmarks/README.md.
DEFAULT_LEARNING_RATES = {
    "adam": 0.2,
    "adabelief": 0.2,
    "novograd": 1.5,
    "radam": 0.8,
    "amsgrad": 0.2,
    "sgd": 1.0,
    "clipup": 0.15,
}
ALIASES = {"adamm": "amsgrad"}

# The global L2 norm of a pytree: optax.tree.norm, which optax.global_norm (deprecated since optax 0.2.5, a
# DeprecationWarning per trace) calls, so ClipUp's bits are the same either way; older optax has only global_norm.
_global_norm = getattr(getattr(optax, "tree", None), "norm", None) or optax.global_norm


def _builders() -> dict[str, Callable[..., optax.GradientTransformation]]:
    return {
        "adam": optax.adam,
        "adabelief": optax.adabelief,
        "novograd": optax.novograd,
        # b2=0.9 shortens RAdam's rectification warm-up from hundreds of steps to ~10: ES runs are short.
        "radam": lambda learning_rate: optax.radam(learning_rate, b2=0.9),
        "amsgrad": optax.amsgrad,
        "sgd": lambda learning_rate: optax.sgd(learning_rate, momentum=0.9),
        "clipup": clipup,
    }


class ClipUpState(NamedTuple):
    velocity: Any


class ScheduledClipUpState(NamedTuple):
    """ClipUp's state under a learning-rate schedule: the step count the schedule is read at."""
    velocity: Any
    count: jax.Array


def clipup(learning_rate: LearningRate, max_speed: float | None = None, momentum: float = 0.9) -> optax.GradientTransformation:
    """ClipUp (Toklu et al. 2020): a normalised gradient step with heavy-ball momentum, speed clipped.

    ``v <- momentum * v - learning_rate * g / |g|``; if ``|v| > max_speed``, ``v`` is rescaled to
    ``max_speed``; the update is ``v``. ``max_speed`` defaults to twice the learning rate, the
    paper's recommendation. Norms are over the whole parameter pytree. A schedule (a callable
    ``learning_rate``) is read at each update's step count, as optax's optimizers read theirs.
    """
    max_speed_value = None if max_speed is None else float(max_speed)
    scheduled = callable(learning_rate)

    def init(params):
        velocity = jax.tree.map(jnp.zeros_like, params)
        return ScheduledClipUpState(velocity, jnp.zeros([], jnp.int32)) if scheduled else ClipUpState(velocity)

    def update(grads, state, params=None):
        del params
        lr = learning_rate(state.count) if scheduled else learning_rate
        limit = 2.0 * lr if max_speed_value is None else max_speed_value
        norm = _global_norm(grads)
        scale = jnp.where(norm > 0, lr / jnp.where(norm > 0, norm, 1.0), 0.0)
        velocity = jax.tree.map(lambda v, g: momentum * v - scale * g, state.velocity, grads)
        speed = _global_norm(velocity)
        clip = jnp.where(speed > limit, limit / jnp.where(speed > 0, speed, 1.0), 1.0)
        velocity = jax.tree.map(lambda v: v * clip, velocity)
        if scheduled:
            return velocity, ScheduledClipUpState(velocity, optax.safe_int32_increment(state.count))
        return velocity, ClipUpState(velocity=velocity)

    return optax.GradientTransformation(init, update)


def optimizer_names() -> list[str]:
    """Names :func:`make_optimizer` accepts (aliases included)."""
    return sorted(DEFAULT_LEARNING_RATES) + sorted(ALIASES)


def resolve_name(name: str) -> str:
    """Canonical optimizer name, or a ``ValueError`` listing the valid ones."""
    key = name.lower()
    key = ALIASES.get(key, key)
    if key not in DEFAULT_LEARNING_RATES:
        raise ValueError(f"unknown optimizer {name!r}; valid names are: {', '.join(optimizer_names())}; or pass any "
                         f"optax.GradientTransformation (e.g. optax.adamw(1e-3))")
    return key


def make_optimizer(optimizer: "str | optax.GradientTransformation", learning_rate: LearningRate | None = None) -> optax.GradientTransformation:
    """Build the optimizer.

    Args:
        optimizer: a name (``adam``, ``adabelief``, ``novograd``, ``radam``,
            ``amsgrad``/``adamm``, ``sgd``) or any optax ``GradientTransformation``.
        learning_rate: constant or optax schedule; ``None`` takes the named
            optimizer's ES default. Must be ``None`` for a transformation you built.

    Returns:
        A ``GradientTransformation`` that *minimises*; jes feeds it the negated ES gradient.
    """
    if isinstance(optimizer, str):
        name = resolve_name(optimizer)
        lr = DEFAULT_LEARNING_RATES[name] if learning_rate is None else learning_rate
        if not callable(lr) and not float(lr) > 0:
            raise ValueError(f"learning_rate must be positive, got {lr}")
        return optax.inject_hyperparams(_builders()[name])(learning_rate=lr)
    if isinstance(optimizer, optax.GradientTransformation) or (
        hasattr(optimizer, "init") and hasattr(optimizer, "update")
    ):
        if learning_rate is not None:
            raise ValueError(
                "learning_rate applies to optimizers given by name; set it inside your optax transformation instead"
            )
        return optimizer
    raise TypeError(
        f"optimizer must be a name ({', '.join(optimizer_names())}) or an optax GradientTransformation, "
        f"got {type(optimizer).__name__}"
    )


def current_learning_rate(opt_state) -> float | None:
    """Learning rate stored by ``inject_hyperparams`` in ``opt_state``, at its top or anywhere inside (an
    ``optax.chain(clip, inject_hyperparams(adam)(...))``): the first one found, depth first; ``None`` when there is
    none (an ``optax.adam(schedule)`` keeps no rate in its state)."""
    hyper = getattr(opt_state, "hyperparams", None)
    if isinstance(hyper, dict) and "learning_rate" in hyper:
        return hyper["learning_rate"]
    if isinstance(opt_state, (tuple, list)):
        for inner in opt_state:
            found = current_learning_rate(inner)
            if found is not None:
                return found
    return None
