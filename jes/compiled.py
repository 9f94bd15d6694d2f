"""How a :class:`jes.generation.Generation`'s programs are compiled: ahead of time, in the background, from
the program cache.

The generation step is compiled from its state's shapes alone (:meth:`CompiledPrograms.start_compiling_step`,
in a thread while the caller builds or reads its state), together with the program that regenerates one member
(the best member's parameters, asked for after every generation), so nothing compiles inside the generation
loop. With :mod:`jes.program_cache` on, both are compiled from their exported programs, traced once and stored,
so a cold and a warm process run the same XLA program.

:class:`CompiledPrograms` is a mixin of :class:`jes.generation.Generation`: it uses the generation's ``step``
(the jitted :meth:`generation_step`), ``_member_jit`` (the jitted :meth:`member_params`), ``replicated``,
``devices``, ``_abstract`` and ``_state_shapes``, and adds no state besides ``_compiled``, ``_compile_time``,
``_compiling`` and ``_member_program`` (set by the generation's setup).
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jes import program_cache
from jes.threefry import export_unrolled, lower_unrolled

TrainState = Any  # jes.generation.TrainState (which imports this module)


# The step and member programs hash with threefry unrolled (jes.threefry; False: JAX's rolled CPU lowering, the
# same bits). Full rank's [C, P] draw weighs in large policies' steps: a MinAtar CNN's (66,387 parameters, 512
# members) takes 0.69x the time unrolled; low rank and the reference GRU within noise (benchmarks/threefry.py).
THREEFRY_UNROLLED = True


class CompiledPrograms:
    """The generation step and the member program, compiled ahead of time (see the module docstring)."""

    # Whether the last program compiled (or exported) here hashes with threefry unrolled (see THREEFRY_UNROLLED).
    programs_threefry_unrolled = False

    def member(self, state: TrainState, member: Any) -> jax.Array:
        """:meth:`member_params` compiled: from the program cache when this run's program is there (see
        :meth:`compiled_step`), else traced."""
        if self._member_program is None:
            self._member_program = self._cached_member_program(state) or self._member_jit
        return self._member_program(state, member)

    def _compile_member(self, state: TrainState) -> Callable:
        """:meth:`member_params` compiled ahead of time for ``state``'s shapes (from the program cache if there)."""
        cached = self._cached_member_program(state)
        if cached is not None:
            return cached
        member_arg = jax.ShapeDtypeStruct((), jnp.int32, sharding=self.replicated)
        compiled = self._lower(self._member_jit, self._abstract(state), member_arg).compile(self.step_compiler_options)
        signature = _signature(state)

        def member(s, m):
            if _signature(s) == signature:
                try:
                    return compiled(s, np.int32(m))
                except ValueError:  # placed otherwise than compiled for (checked before it runs): trace instead
                    pass
            return self._member_jit(s, m)

        return member

    def _cached_member_program(self, state: TrainState) -> Callable | None:
        try:
            key = self._program_key("member_params", state)
            if key is None:
                return None
            leaves, treedef = jax.tree.flatten(self._abstract(state))
            def member_params_flat(*args):
                return self.member_params(jax.tree.unflatten(treedef, args[:-1]), args[-1])

            member_arg = jax.ShapeDtypeStruct((), jnp.int32, sharding=self.replicated)
            compiled = self._compile_exported(key, member_params_flat, [*leaves, member_arg],
                                              compiler_options=self.step_compiler_options)
            signature = _signature(state)
            return lambda s, m: (compiled(*jax.tree.leaves(s), np.int32(m)) if _signature(s) == signature
                                 else self._member_jit(s, m))
        except Exception:  # noqa: BLE001 - any failure of the cached path: trace as without a cache
            return None

    def start_compiling_step(self) -> None:
        """Start compiling the step in a background thread, from a fresh state's shapes alone.

        XLA compiles with the GIL released, so building the initial state (or reading a
        checkpoint) overlaps the compile; :meth:`compiled_step` waits for it. Same program,
        same bits: it is lowered from the same shapes and placement as the state's.
        """
        if self._compiled is not None or self._compiling is not None:
            return
        abstract = self._state_shapes()
        out: dict = {}
        # Set when the thread is done. Waited on instead of Thread.join: a join interrupted by Ctrl-C marks the
        # thread stopped on CPython < 3.13 while it still compiles, so is_alive() and a later join return at once.
        done = threading.Event()

        def compile_step():
            try:
                t0 = time.perf_counter()
                try:
                    flag = jax.ShapeDtypeStruct((), jnp.bool_)
                    out["compiled"] = self._compile_step(abstract, flag, flag)
                except Exception:  # compiled_step compiles again in the caller's thread and raises there
                    pass
                out["seconds"] = time.perf_counter() - t0
                # The best member's regeneration program too, so that nothing compiles inside the generation loop.
                try:
                    # Multi-process runs regenerate members from this process's replica (other shardings): traced
                    # then.
                    if self._member_program is None and jax.process_count() == 1:
                        self._member_program = self._compile_member(abstract)
                except Exception:  # noqa: BLE001 - member() traces it when first asked, as without this
                    pass
            finally:
                done.set()

        threading.Thread(target=compile_step, name="jes-compile-step", daemon=True).start()
        self._compiling = (done, out, abstract)

    def finish_compiling(self) -> None:
        """Wait for a step compile :meth:`start_compiling_step` started (its program is kept for
        :meth:`compiled_step`). For a caller that fails before it steps: XLA cannot be interrupted, and a daemon
        thread still compiling when the interpreter exits aborts it ("FATAL: exception not rethrown", status 134)."""
        if self._compiling is None:
            return
        done = self._compiling[0]
        if not done.is_set():  # the caller's error (or Ctrl-C) is reported once the compile is done: say why it waits
            # Called while the caller handles its exception: an interrupt stops the run; an error is reported
            what = ("stopping once the generation step's compile, started in the background, has finished"
                    if isinstance(sys.exc_info()[1], KeyboardInterrupt) or sys.exc_info()[1] is None else
                    "waiting for the generation step's compile, started in the background, to finish before reporting "
                    "the error")
            print(f"jes: {what} (XLA cannot be interrupted, and leaving during it would abort the process)",
                  file=sys.stderr, flush=True)
        while not done.is_set():
            try:
                done.wait(0.2)
            except KeyboardInterrupt:  # another Ctrl-C: still waiting (the first one goes on when this returns)
                continue

    def compiled_step(self, state: TrainState) -> tuple[Callable, float]:
        """The generation step compiled ahead of time for ``state``'s shapes, and the seconds it took.

        Compiled once per run object and reused by every run (seeds, resumes) it serves.
        """
        if self._compiled is None and self._compiling is not None:
            done, out, abstract = self._compiling
            while not done.wait(0.2):  # before forgetting it: a Ctrl-C here leaves it for finish_compiling
                pass
            self._compiling = None
            if "compiled" in out and _signature(state) == _signature(abstract):
                self._compiled, self._compile_time = out["compiled"], out["seconds"]
        if self._compiled is None:
            t0 = time.perf_counter()
            self._compiled = self._compile_step(state, jnp.bool_(True), jnp.bool_(True))
            self._compile_time = time.perf_counter() - t0
        return self._compiled, self._compile_time

    def program_parts(self) -> dict | None:
        """Everything besides argument shapes that determines the step's program, for :mod:`jes.program_cache`.

        ``None`` (never cached; traced every time): subclasses whose members' evaluation this cannot
        describe. :class:`Trainer` describes its policy, env, config, strategy and optimizer name.
        """
        return None

    def step_program_key(self, state: TrainState) -> str | None:
        """The program cache's key of the step for ``state`` (arrays or ``ShapeDtypeStruct``s placed replicated
        on this run's devices), or ``None``: cache off, a run that cannot be fingerprinted, another placement."""
        return self._program_key("generation_step", state)

    def _program_key(self, kind: str, state: TrainState) -> str | None:
        parts = self.program_parts()
        leaves, treedef = jax.tree.flatten(state)
        if parts is None or not all(getattr(x, "sharding", None) == self.replicated for x in leaves):
            return None
        return program_cache.program_key(kind, dict(
            parts, threefry_unrolled=THREEFRY_UNROLLED, state=str(treedef),
            leaves=[(tuple(x.shape), str(x.dtype), bool(getattr(x, "weak_type", False))) for x in leaves]))

    def _compile_step(self, state: TrainState, evaluate_centre: Any, evaluate_population: Any) -> Callable:
        """The step compiled for ``state`` (its shapes, dtypes, placement): from the program cache when it
        holds this run's traced program, else traced (and, when the cache is on, stored for the next process).

        With the cache on, the step is always compiled from its exported program, traced here or read back,
        so a cold and a warm process run the same XLA program (and find each other's compiled copy in JAX's cache).
        """
        key = self.step_program_key(state)
        if key is not None:
            leaves, treedef = jax.tree.flatten(self._abstract(state))

            def flat_step(*args):
                new_state, metrics = self.generation_step(jax.tree.unflatten(treedef, args[:-2]), *args[-2:])
                new_leaves, new_treedef = jax.tree.flatten(new_state)
                if new_treedef != treedef:
                    raise TypeError("the step changed the state's structure")
                return new_leaves, metrics

            try:
                flag = jax.ShapeDtypeStruct((), jnp.bool_, sharding=self.replicated)
                compiled = self._compile_exported(key, flat_step, [*leaves, flag, flag],
                                                  compiler_options=self.step_compiler_options)
                return _FlatStep(compiled, treedef)
            except Exception:  # noqa: BLE001 - any failure of the cached path: trace as without a cache
                pass
        return self._lower(self.step, state, evaluate_centre, evaluate_population).compile()

    def _lower(self, jitted: Any, *args: Any) -> Any:
        """``jitted.lower(*args)``, threefry unrolled where :data:`THREEFRY_UNROLLED` (the same bits; see
        :mod:`jes.threefry`); records whether it was in :attr:`programs_threefry_unrolled`."""
        lowered, self.programs_threefry_unrolled = lower_unrolled(jitted, *args, enabled=THREEFRY_UNROLLED)
        return lowered

    def _compile_exported(self, key: str, flat_fn: Callable, args: list, out_shardings: Any = None,
                          compiler_options: dict | None = None) -> Callable:
        """``flat_fn`` (flat array arguments ``args``, abstract) compiled from the program cache's entry ``key``;
        on a miss traced, exported and stored first. Raises on any failure (callers fall back to tracing)."""
        exported = program_cache.load(key)
        if exported is not None and (
                [(tuple(a.shape), a.dtype) for a in exported.in_avals] != [(tuple(a.shape), a.dtype) for a in args]
                or exported.nr_devices != len(self.devices)):
            exported = None  # a hash collision or a foreign file: never call it
        if exported is None:
            jitted = jax.jit(flat_fn) if out_shardings is None else jax.jit(flat_fn, out_shardings=out_shardings)
            exported, self.programs_threefry_unrolled = export_unrolled(jitted, *args, enabled=THREEFRY_UNROLLED)
            program_cache.store(key, exported)
        return jax.jit(exported.call, compiler_options=compiler_options).lower(*args).compile()

    def compile_count(self) -> int:
        """How many programs ``self.step`` has compiled (1 after any number of generations)."""
        return self.step._cache_size()


def _signature(tree: Any) -> tuple:
    return jax.tree.structure(tree), [(x.shape, x.dtype, getattr(x, "weak_type", False)) for x in jax.tree.leaves(tree)]


class _FlatStep:
    """A compiled exported step over flat state leaves, called like the compiled step:
    ``(state, evaluate_centre, evaluate_population) -> (state, metrics)``."""

    def __init__(self, compiled: Any, treedef: Any):
        self.compiled, self.treedef = compiled, treedef

    def __call__(self, state: TrainState, evaluate_centre: Any, evaluate_population: Any) -> tuple[TrainState, dict]:
        new_leaves, metrics = self.compiled(*jax.tree.leaves(state), evaluate_centre, evaluate_population)
        return jax.tree.unflatten(self.treedef, new_leaves), metrics
