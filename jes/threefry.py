"""JAX's threefry hash lowered unrolled inside jes's own programs on CPU: the same bits, less time per draw.

On CPU, JAX lowers each threefry hash (every ``fold_in``, ``split`` and the bits behind ``normal``) as a
rolled 5-iteration loop, to keep compile times short; elsewhere it lowers the 20 rounds unrolled. The hash
is integer arithmetic, so both lowerings give the same bits; only speed and compile time differ:

* Inside the while loop of :meth:`jes.blackbox.FunctionProblem.generation_block`, whose generations are a
  few small kernels each, those loops are most of a generation on a mid-sized problem: jes's key derivation
  and ``[17, 100]`` Gaussian draw in a while loop of generations take 64.9 us per generation rolled against
  9.7 us unrolled (one process, medians of 15 blocks of 200 generations), and ``jes.optimize`` at d = 100 went
  from 1.1-1.7x evosax's time per run to 0.65-0.81x (docs/benchmarks.md, "Side by side with evosax").
* In the training programs (the step and member program, :mod:`jes.compiled`; workers', masters' and host envs'
  programs and sweeps, :class:`UnrolledJit`) a full-rank chunk's ``[C, P]`` draw is the large one: a full-rank
  MinAtar CNN's generation (66,387 parameters, 512 members) takes 0.69x the time unrolled; low rank's draws are small and its step is unchanged (``benchmarks/threefry.py``, seeds 0-4).

:func:`lower_unrolled` lowers one traced program with JAX's unrolled rule, through JAX's per-lowering rule
override, and :func:`export_unrolled` exports one (the program cache's path) the same way: nothing global
changes (other programs, other threads and JAX's lowering cache, which keys on the override, see JAX's own
rules). They rely on private names of ``jax._src``; where those are missing they lower as JAX would.
"""
from __future__ import annotations

from typing import Any

import jax


def _rules() -> Any:
    try:
        from jax._src.random import threefry2x32 as tf

        return ((tf.threefry2x32_p, tf._threefry2x32_lowering_rule),)
    except (ImportError, AttributeError):  # pragma: no cover - another jax layout: JAX's own lowering
        return None


def _override() -> Any:
    rules = _rules()
    try:
        from jax._src.interpreters import mlir

        return None if rules is None else mlir.LoweringParameters(override_lowering_rules=rules)
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - another jax layout: JAX's own lowering
        return None


def lower_unrolled(jitted: Any, *args: Any, enabled: bool = True) -> tuple[Any, bool]:
    """``jitted.lower(*args)`` with threefry unrolled (``enabled=False``: as JAX lowers it); returns ``(lowered,
    whether the override applied)``."""
    override = _override() if enabled else None
    if override is not None:
        try:
            return jitted.trace(*args).lower(_private_parameters=override), True
        except TypeError:  # pragma: no cover - a jax whose lower() takes no such parameter
            pass
    return jitted.lower(*args), False


def export_unrolled(jitted: Any, *args: Any, enabled: bool = True) -> tuple[Any, bool]:
    """``jax.export.export(jitted)(*args)`` with threefry unrolled (``enabled=False``: as JAX lowers it); returns
    ``(exported, whether it applied)``."""
    rules = _rules() if enabled else None
    if rules is not None:
        try:
            from jax._src.export import _export

            return _export._export_internal(jitted, override_lowering_rules=rules)(*args), True
        except (ImportError, AttributeError, TypeError):  # pragma: no cover - another jax layout
            pass
    return jax.export.export(jitted)(*args), False


class UnrolledJit:
    """``jax.jit(fn, **jit_kwargs)`` whose programs hash with threefry unrolled (:func:`lower_unrolled`): each new
    signature of its positional arguments (structure, shapes, dtypes, placement) is lowered and compiled once;
    called like the jitted function. A call its compiled program refuses (another placement than it was compiled
    for) runs through the plain ``jax.jit``, which gives the same bits."""

    def __init__(self, fn: Any, compiler_options: dict | None = None, **jit_kwargs: Any):
        # XLA options can change bits (XLA:CPU's fusion emitters order some sums otherwise): a program computing part
        # of a generation compiles with the step's (Trainer.step_compiler_options), as the step does.
        self._options = compiler_options
        self._jitted = jax.jit(fn, compiler_options=compiler_options, **jit_kwargs)
        # Called inside another traced program, it is part of that program and its options (JAX refuses
        # compiler_options on a nested jit).
        self._nested = jax.jit(fn, **jit_kwargs)
        self._programs: dict = {}
        self._fell_back = False  # whether a call ran through the plain jax.jit (its cache then counts too)

    @staticmethod
    def _signature(args: tuple) -> Any:
        leaves, treedef = jax.tree.flatten(args)
        return treedef, tuple((jax.typeof(x), x.sharding if isinstance(x, jax.Array) else None) for x in leaves)

    def __call__(self, *args: Any) -> Any:
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args)):
            return self._nested(*args)  # inside another traced program: part of that program, as jax.jit is
        key = self._signature(args)
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = lower_unrolled(self._jitted, *args)[0].compile(self._options)
        if program is not False:
            try:
                return program(*args)
            except (TypeError, ValueError):  # placed otherwise than compiled for: jax.jit from now on
                self._programs[key] = False
        self._fell_back = True
        return self._jitted(*args)

    def _cache_size(self) -> int:
        """Programs compiled so far (as ``jax.jit``'s own ``_cache_size``, for compile checks)."""
        compiled = sum(p is not False for p in self._programs.values())
        return compiled + (self._jitted._cache_size() if self._fell_back else 0)
