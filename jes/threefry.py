"""JAX's threefry hash lowered unrolled inside jes's black-box programs on CPU: the same bits, less time per draw.

On CPU, JAX lowers each threefry hash (every ``fold_in``, ``split`` and the bits behind ``normal``) as a
rolled 5-iteration loop, to keep compile times short; elsewhere it lowers the 20 rounds unrolled. Inside the
while loop of :meth:`jes.blackbox.FunctionProblem.generation_block`, whose generations are a few small
kernels each, those loops are most of a generation on a mid-sized problem: jes's key derivation and
``[17, 100]`` Gaussian draw in a while loop of generations take 64.9 us per generation rolled against
9.7 us unrolled (one process, medians of 15 blocks of 200 generations), and ``jes.optimize`` at d = 100 went
from 1.1-1.7x evosax's time per run to 0.65-0.81x (docs/benchmarks.md, "Side by side with evosax"). The
hash is integer arithmetic, so both lowerings give the same bits; only speed and compile time differ.

:func:`unrolled_on_cpu` swaps the CPU lowering rule for the duration of a ``with`` block (one at a time,
under a lock; another thread lowering meanwhile gets the same bits either way). It relies on two private
names of ``jax._src``; where they are missing it does nothing.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

_LOCK = threading.Lock()


def _rules():
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32 as tf

        return mlir, tf.threefry2x32_p, tf._threefry2x32_lowering_rule, tf._threefry2x32_cpu_lowering_rule
    except (ImportError, AttributeError):  # pragma: no cover - another jax layout: JAX's own lowering
        return None


@contextlib.contextmanager
def unrolled_on_cpu() -> Iterator[bool]:
    """Within the block, programs lowered for CPU hash unrolled; yields whether the swap happened."""
    rules = _rules()
    if rules is None:  # pragma: no cover
        yield False
        return
    mlir, primitive, unrolled, rolled = rules
    with _LOCK:
        mlir.register_lowering(primitive, unrolled, platform="cpu")
        try:
            yield True
        finally:
            mlir.register_lowering(primitive, rolled, platform="cpu")
