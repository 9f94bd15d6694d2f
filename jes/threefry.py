"""JAX's threefry hash lowered unrolled inside jes's black-box programs on CPU: the same bits, less time per draw.

On CPU, JAX lowers each threefry hash (every ``fold_in``, ``split`` and the bits behind ``normal``) as a
rolled 5-iteration loop, to keep compile times short; elsewhere it lowers the 20 rounds unrolled. Inside the
while loop of :meth:`jes.blackbox.FunctionProblem.generation_block`, whose generations are a few small
kernels each, those loops are most of a generation on a mid-sized problem: jes's key derivation and
``[17, 100]`` Gaussian draw in a while loop of generations take 64.9 us per generation rolled against
9.7 us unrolled (one process, medians of 15 blocks of 200 generations), and ``jes.optimize`` at d = 100 went
from 1.1-1.7x evosax's time per run to 0.65-0.81x (docs/benchmarks.md, "Side by side with evosax"). The
hash is integer arithmetic, so both lowerings give the same bits; only speed and compile time differ.

:func:`lower_unrolled` lowers one traced program with JAX's unrolled rule, through JAX's per-lowering rule
override: nothing global changes (other programs, other threads and JAX's lowering cache, which keys on the
override, see JAX's own rules). It relies on private names of ``jax._src``; where they are missing it lowers
as JAX would.
"""
from __future__ import annotations

from typing import Any


def _override() -> Any:
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32 as tf

        return mlir.LoweringParameters(
            override_lowering_rules=((tf.threefry2x32_p, tf._threefry2x32_lowering_rule),))
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - another jax layout: JAX's own lowering
        return None


def lower_unrolled(jitted: Any, *args: Any) -> tuple[Any, bool]:
    """``jitted.lower(*args)`` with threefry unrolled; returns ``(lowered, whether the override applied)``."""
    override = _override()
    if override is not None:
        try:
            return jitted.trace(*args).lower(_private_parameters=override), True
        except TypeError:  # pragma: no cover - a jax whose lower() takes no such parameter
            pass
    return jitted.lower(*args), False
