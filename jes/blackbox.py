"""Evolution strategies for any function: ``jes.optimize`` and the pure ``AskTell`` interface.

Both reuse the chunked, sharded, compiled generation of :mod:`jes.generation`: member
``i`` of generation ``g`` is regenerated from ``(key, g, i)``, and the strategy's
statistics are reduced in chunk order, so results are bit-identical over devices.

Direction: jes *maximises* fitness. ``minimize=True`` negates your function inside and
reports values in your function's own units; every result says which way it went.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import math
import pickle
import time
import warnings
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from jes import bounds as box_bounds
from jes import perturbations
from jes.config import ESConfig
from jes.cpu import compiler_options
from jes.generation import ChunkResults, Generation, TrainState, as_key
from jes.logging import check_callbacks
from jes.strategies import get as get_strategy
from jes.strategies.base import both_sigmas, check_settings_apply
from jes.threefry import lower_unrolled


def _x0_dtype(x0: Any) -> Any:
    """The search's float dtype: float64 where JAX's x64 mode is on and ``x0`` holds float64 leaves, or only
    integer (or bool) leaves (searched in the mode's default float, as ``jnp.asarray(x0, float)`` would be);
    else float32."""
    if not jax.config.jax_enable_x64:
        return jnp.float32
    dtypes = [jnp.asarray(x).dtype for x in jax.tree.leaves(x0)]
    if any(dtype == jnp.float64 for dtype in dtypes):
        return jnp.float64
    integral = dtypes and all(jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_ for dtype in dtypes)
    return jnp.float64 if integral else jnp.float32


def _is_number(x: Any) -> bool:
    """A Python or NumPy real number, or a concrete 0-d NumPy or JAX array of one (``jnp.float32(1.0)``,
    ``jnp.mean(a)``)."""
    if isinstance(x, (np.ndarray, jax.Array)) and not isinstance(x, jax.core.Tracer) and x.ndim == 0:
        return jnp.issubdtype(x.dtype, jnp.integer) or jnp.issubdtype(x.dtype, jnp.floating)
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _as_vector_if_numbers(x0: Any) -> Any:
    """A plain list or tuple of scalars (Python or NumPy real numbers, 0-d arrays; pycma's ``x0=[1.0, 2.0, 3.0]``,
    ``[jnp.mean(a), 2.0]``) as one 1-D NumPy vector; anything else (arrays, dicts, lists holding an array of
    one or more dimensions, nested lists, named tuples: genuine pytrees) as it is."""
    if type(x0) in (list, tuple) and x0 and all(_is_number(x) for x in x0):
        return np.asarray(x0)
    return x0


def _warn_if_float64_lost(x0: Any) -> None:
    """Warn (from the caller of ``optimize`` / ``AskTell``) where ``x0`` holds float64 NumPy arrays that the search
    cannot keep: JAX's x64 mode is off."""
    if not jax.config.jax_enable_x64 and any(isinstance(x, (np.ndarray, np.floating)) and x.dtype == np.float64
                                              for x in jax.tree.leaves(x0)):
        warnings.warn("x0 is float64, but JAX's x64 mode is off: the search runs in float32 (about 7 significant "
                      "digits: f values with a large offset resolve only ~1e-7 of it). For float64 means, samples "
                      "and f, call jax.config.update('jax_enable_x64', True) before anything else in JAX; to search "
                      "in float32 on purpose, give x0 as float32", stacklevel=3)


def _warn_if_integer_leaves(x0: Any) -> None:
    """Warn (from the caller of ``optimize`` / ``AskTell``) where a pytree ``x0`` holds integer (or bool) leaves
    beside others: every parameter is searched as a float, so the function gets e.g. ``n_cells = 4.38``."""
    leaves = jax.tree_util.tree_leaves_with_path(_as_vector_if_numbers(x0))  # pycma's x0=[0, 0, 0]: one vector
    if len(leaves) < 2:  # one array or vector of integers: documented as searched in the default float
        return
    integral = [jax.tree_util.keystr(path) for path, x in leaves
                if jnp.issubdtype(jnp.asarray(x).dtype, jnp.integer) or jnp.asarray(x).dtype == jnp.bool_]
    if integral:
        warnings.warn(f"x0's {', '.join(integral)} {'is an integer' if len(integral) == 1 else 'are integers'}, but "
                      f"jes searches every parameter as a float (it has no integer variables): your function gets "
                      f"non-integer values there (4.38, say); round them inside it, and give x0 those leaves as "
                      f"floats to silence this", stacklevel=3)


def _flatten_x0(x0: Any) -> tuple[jax.Array, Callable]:
    x0 = _as_vector_if_numbers(x0)
    if any(jnp.iscomplexobj(leaf) for leaf in jax.tree.leaves(x0)):  # (its imaginary part was dropped, with a
        raise TypeError("x0 holds complex values; jes searches real numbers: give the real and imaginary parts as "
                        "two real leaves (a pytree such as {'re': x.real, 'im': x.imag})")  # NumPy warning alone)
    dtype = _x0_dtype(x0)
    flat, unravel = ravel_pytree(jax.tree.map(lambda x: jnp.asarray(x, dtype), x0))
    if flat.ndim != 1 or flat.shape[0] == 0:
        raise ValueError("x0 must be a non-empty array or pytree of arrays (the initial mean)")
    if not bool(jnp.isfinite(flat).all()):
        raise ValueError("x0 holds NaN or inf; give a finite starting point")
    if jax.tree.structure(x0).num_nodes == 1:  # one array: a reshape, not the pytree's eager split per call
        shape = jnp.shape(x0)
        return flat, lambda f: f if f.shape == shape else f.reshape(shape)
    return flat, unravel


def _named(value: Any) -> str:
    """``value`` for an error message: ``None``, ``str '1.0'``, ``dict {...}`` (cut short)."""
    if value is None:
        return "None"
    shown = repr(value)
    return f"{type(value).__name__} {shown if len(shown) <= 60 else shown[:57] + '...'}"


def _check_fitness(value: Any, asarray: Callable, num_members: int | None = None) -> Any:
    """The one check of fitness values, :func:`optimize`'s (a function's return: ``num_members=None``, a scalar)
    and :meth:`AskTell.tell`'s (``[num_members]``): ``value`` as ``asarray`` makes it (``jnp.asarray`` for traced
    or JAX values, ``np.asarray`` for host ones), refused unless it has the shape and an integer or floating
    dtype (not bool, complex, a string, ``None`` or a Python object)."""
    real = ("fitness_fn must return a real number" if num_members is None else
            "tell takes real fitness values (one per member)")
    if value is None or isinstance(value, (str, bytes)):
        raise TypeError(f"{real}, got {_named(value)}")
    array = asarray(value)
    if array.dtype == object:
        raise TypeError(f"{real}, got {_named(value)}")
    shape = () if num_members is None else (num_members,)
    if array.shape != shape:
        raise ValueError(f"fitness_fn must return a scalar, got shape {array.shape}" if num_members is None else
                         f"tell takes one fitness value per member ({num_members}), got shape {array.shape}")
    if not (jnp.issubdtype(array.dtype, jnp.integer) or jnp.issubdtype(array.dtype, jnp.floating)):
        raise TypeError(f"{real}, got {array.dtype}")
    return array


class FunctionProblem(Generation):
    """The compiled generation for maximising ``sign * fitness_fn(params)`` (``fitness_fn`` may be ``None`` for ask/tell).

    A device holding one chunk draws its members' noise once per generation for their evaluation and their
    statistics (:attr:`Generation.shares_draws`): on a cheap function the draws are a good part of a generation.

    Args:
        fitness_fn: maps one parameter pytree shaped like ``x0`` to a scalar; vmapped over members.
        x0: initial mean (array or pytree).
        strategy: name or strategy object.
        config: population, sigma, learning rate, shaping, chunk size (RL fields are ignored).
        optimizer: for strategies that use one.
        minimize: minimise ``fitness_fn`` instead of maximising it.
        bounds: ``(lower, upper)`` as :func:`optimize` takes them, or ``None``: the strategy searches an unbounded
            space whose points ``fitness_fn`` sees through :meth:`in_box` (the search starts at ``x0``'s preimage).
    """

    shares_draws = True
    # Whether the last block program compiled hashes with threefry unrolled (see THREEFRY_UNROLLED).
    threefry_unrolled = False

    def __init__(self, fitness_fn: Callable | None, x0: Any, strategy: Any, config: ESConfig, optimizer: Any = None,
                 minimize: bool = False, devices: Any = None, bounds: Any = None):
        if not isinstance(minimize, bool):
            raise TypeError(f"minimize must be True or False, got {minimize!r}")
        self.fitness_fn = fitness_fn
        self.minimize = minimize
        self.sign = -1.0 if minimize else 1.0
        self.x0, self.unravel = _flatten_x0(x0)
        # (lower, upper) flat in the search's dtype, or None (no coordinate bounded); x0 is then the search's
        # start's image: the search starts at its preimage (pycma's x0 = inverse(x0); the identity inside)
        self.bounds = box_bounds.flat_bounds(bounds, _as_vector_if_numbers(x0), self.x0)
        # and the map's constants, made once on the host: the same bits wherever a point is mapped (Box)
        self.box = None if self.bounds is None else box_bounds.box_of(*self.bounds)
        self._box_arguments = None if self.box is None else jax.tree.map(jnp.asarray, self.box)  # on the device once
        if self.bounds is not None:
            self.bounds = tuple(jnp.asarray(side) for side in self.bounds)
            self.x0 = _from_box(self.x0, *self.bounds)
        self.num_params = int(self.x0.shape[0])
        self.config = config
        strategy = get_strategy(strategy).for_functions()
        if optimizer is None and strategy.uses_optimizer:
            optimizer = strategy.blackbox_optimizer or strategy.default_optimizer
        self._setup(strategy, optimizer, devices)
        self.normalize_observations = False
        # float64 fitness (x64 mode) keeps its precision through the centre's evaluation too (see step_chunks)
        self.fitness_dtype = (self._traced_dtype() if fitness_fn is not None else jnp.dtype(jnp.float32))
        self.best_dtype = self.fitness_dtype  # of the centre's and the members' values, hence of the best one
        self.objective_jit = jax.jit(self.objective)  # f(final mean): traced once per problem, not once per run
        self._result_programs_ready = False
        # seconds per call of the block program in this problem's last block (None: no block run yet)
        self._block_call_seconds: float | None = None

    def initial_mean(self, init_key):
        return self.x0

    def _traced_dtype(self) -> jnp.dtype:
        """The objective's dtype, from tracing it once: a function that is not JAX code (NumPy, ``float()`` or
        an ``if`` on its input) fails here with an error saying so, not deep inside JAX."""
        not_traceable = (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError,
                         jax.errors.TracerBoolConversionError, jax.errors.TracerIntegerConversionError,
                         jax.errors.NonConcreteBooleanIndexError)
        try:
            return jax.eval_shape(self.objective, self.x0).dtype
        except not_traceable as err:
            # JAX's own reason: its lines before where it happened and the link (the first, "Abstract tracer value
            # encountered", names no cause; the next says which function or argument)
            lines = []
            for line in str(err).splitlines():
                if line.startswith(("The error occurred while tracing", "See https://")):
                    break
                lines.append(line.strip())
            lines = [line for line in lines if line]
            if len(lines) > 1 and lines[0].startswith("Abstract tracer value encountered"):
                lines = lines[1:]
            said = " ".join(lines)
            said = said if len(said) <= 400 else said[:397] + "..."
            if isinstance(err, jax.errors.NonConcreteBooleanIndexError) or "size argument" in said:
                raise TypeError(f"fitness_fn is traced by JAX (vmapped over the members and compiled), where every "
                                f"array's shape must be known without the values, and it makes one whose shape "
                                f"depends on them (JAX: {said}): give such a function a static size "
                                f"(jnp.nonzero(x, size=n, fill_value=0), jnp.unique(x, size=n)) or use a mask "
                                f"(jnp.where(x > 0, x, 0) for x[x > 0]), or pass host=True to call it as plain "
                                f"Python / NumPy code, one point at a time") from err
            raise TypeError(f"fitness_fn is traced by JAX (vmapped over the members and compiled), and it turned a "
                            f"traced value into a NumPy array or a Python number or bool ({type(err).__name__}): write "
                            f"it with jax.numpy, or pass host=True to call it as plain Python / NumPy code, one point "
                            f"at a time (JAX: {said})") from err

    def in_box(self, flat: jax.Array) -> jax.Array:
        """Points of the search (``[..., P]``) as ``fitness_fn`` sees them and results report them: mapped into the
        bounds (:func:`jes.bounds.to_box`), or as they are without bounds. The box's constants enter the programs
        that evaluate ``fitness_fn`` as constants, and those of results and host points (:func:`_into_box`) as
        arguments: the same bits (see :class:`jes.bounds.Box`), so ``f(result.x)`` is ``result.value``."""
        return flat if self.box is None else box_bounds.into_box(flat, self.box)

    def objective(self, flat: jax.Array) -> jax.Array:
        """The user's function at one flat point of the search (mapped :meth:`in_box`), as a float32 scalar (float64
        if it returns one, which it can in JAX's x64 mode)."""
        value = _check_fitness(self.fitness_fn(self.unravel(self.in_box(flat))), jnp.asarray)
        return value.astype(jnp.float64 if value.dtype == jnp.float64 else jnp.float32)

    def evaluate_members(self, state, flat, members, gen_key, active):
        # In a cond of its own (a runtime predicate, so XLA keeps it): the user's function is then compiled as
        # one computation, the same in the one-generation step and in the block program's loop body. Fused
        # with its surroundings, its reductions (jnp.sum) were emitted differently in the two programs and the
        # values differed in the last bits (snes, sep_cma_es on Rosenbrock; the ranks, hence states, did not).
        evaluate = lambda x: self.sign * jax.vmap(self.objective)(x)
        fitness = jax.lax.cond(active.any(), evaluate,
                               lambda x: jnp.zeros(x.shape[:1], self.fitness_dtype), flat)
        zeros = jnp.zeros((), jnp.float32)
        return ChunkResults(fitness=jnp.where(active, fitness, 0.0), env_steps=active.sum().astype(jnp.int32),
                            obs_sum=zeros, obs_sumsq=zeros)

    def centre_score(self, state):
        return self.sign * self.objective(state.params), jnp.int32(1)

    def step_chunks(self, state, chunk_ids, evaluate_centre, evaluate_population, draws=None):
        """As :meth:`Generation.step_chunks`; with float64 fitness the centre is evaluated here (each device's
        chunk 0 slot), as the generation step keeps a chunk-evaluated centre's dtype and would round a
        separately evaluated one to float32."""
        results, centre = super().step_chunks(state, chunk_ids, evaluate_centre, evaluate_population, draws)
        if self.fitness_dtype != jnp.float64:
            return results, centre
        score = jax.lax.cond(evaluate_centre, lambda s: self.sign * self.objective(s.params),
                             lambda s: jnp.full((), jnp.nan, jnp.float64), state)
        k = chunk_ids.shape[0]
        return results, (jnp.full((k, 1), score), jnp.ones((k, 1), jnp.int32))

    def centre_from_chunks(self, centre):
        returns, steps = centre
        return returns[0, 0], steps[0, 0]

    def params_tree(self, flat_params: jax.Array) -> Any:
        """A flat point of the search as the pytree ``fitness_fn`` gets there (shaped like ``x0``, mapped
        :meth:`in_box`), in ``x0``'s float dtype (float64 in x64 mode)."""
        if not (isinstance(flat_params, jax.Array) and flat_params.dtype == self.x0.dtype):
            flat_params = jnp.asarray(flat_params, self.x0.dtype)
        if self.box is not None:
            flat_params = _into_box(flat_params, self._box_arguments)
        return self.unravel(flat_params)

    def generation_block(self, state: TrainState, best: tuple, evaluate_centre: jax.Array, calls: jax.Array,
                         population_calls: jax.Array, threshold: jax.Array, *, capacity: int) -> tuple:
        """Up to ``calls`` calls of :meth:`generation_step` in one program (a ``while_loop``), stopping inside.

        Call ``j`` is exactly the call the one-generation host loop makes: it evaluates the centre of the state
        it is given (``evaluate_centre`` for ``j = 0``, always after) and, for ``j < population_calls``, runs
        that state's generation. The loop ends after ``calls`` calls, or after the call whose centre reaches
        ``threshold`` (``sign * centre >= threshold`` in the maximised units; NaN: no target; that call's
        generation is then discarded, as the host loop discards it), or after a call with a non-finite fitness
        or update (the step already left the state unchanged).

        Args:
            state: the state of the first call. best: ``(value, state, member)``, the best value seen (maximised
                units; ``-inf`` at first), the state whose population (``member >= 0``) or centre (``-1``) gave it.
            capacity: static length of the per-call metrics buffers (``calls <= capacity``).

        Returns:
            ``(calls made, state, best, metrics)``: ``metrics[dtype]`` ``[capacity, len(names)]`` holds the
            metrics :meth:`block_layout` names for that dtype, one row per call (rows ``>= calls made`` undefined);
            ``cond_max``/``cond_min`` are the covariance condition source's extremes after the call.
        """
        step = self._block_step
        layout = self.block_layout(state)
        # One [capacity] buffer per metric inside the loop, stacked per dtype after it: XLA:CPU runs a loop body's
        # kernels one after another, without its concurrent scheduler's overhead, only when every buffer they
        # touch holds at most 512 bytes, which a [100, 7] float32 stack of rows does not (d = 10 Rosenbrock:
        # 25 us a generation with the stacks in the loop; see benchmarks/README.md).
        buffers = {k: jnp.zeros(capacity, dtype) for dtype, names in layout.items() for k in names}

        def body(carry):
            j, _, state, (best_value, best_state, best_member), buffers = carry
            centre_on = (j > 0) | evaluate_centre
            population_on = j < population_calls
            new_state, row = step(state, centre_on, population_on)
            centre = row["centre_return"]
            hit = centre_on & (centre >= threshold.astype(centre.dtype))
            bad = population_on & ((row["bad_member"] >= 0) | row["bad_update"])
            # the host loop's order: the centre (completing the row before), then the target, then the members
            by_centre = centre_on & (centre > best_value)
            best_value = jnp.where(by_centre, centre.astype(best_value.dtype), best_value)
            best_member = jnp.where(by_centre, -1, best_member)
            by_member = population_on & ~hit & ~bad & (row["pop_max"] > best_value)
            best_value = jnp.where(by_member, row["pop_max"].astype(best_value.dtype), best_value)
            best_member = jnp.where(by_member, row["best_member"], best_member)
            keep_state = by_centre | by_member
            best_state = jax.tree.map(lambda n, o: jnp.where(keep_state, n, o), state, best_state)
            state = jax.tree.map(lambda n, o: jnp.where(hit, o, n), new_state, state)
            buffers = {k: buffer.at[j].set(row[k]) for k, buffer in buffers.items()}
            return j + 1, hit | bad | ~population_on, state, (best_value, best_state, best_member), buffers

        carry = (jnp.int32(0), jnp.bool_(False), state, best, buffers)
        j, _, state, best, buffers = jax.lax.while_loop(lambda c: (c[0] < calls) & ~c[1], body, carry)
        return j, state, best, {dtype: jnp.stack([buffers[k] for k in names], axis=1) for dtype, names in layout.items()}

    def _block_step(self, state, evaluate_centre, evaluate_population):
        """:meth:`generation_step` and the row of metrics the block program keeps of it."""
        new_state, metrics = self.generation_step(state, evaluate_centre, evaluate_population)
        row = {k: metrics[k] for k in BLOCK_METRICS}
        source = _condition_source(new_state.strategy)
        if source is not None:
            row["cond_max"], row["cond_min"] = jnp.max(source), jnp.min(source)
        return new_state, row

    def block_layout(self, state: TrainState) -> dict[str, tuple[str, ...]]:
        """The metrics :meth:`generation_block` keeps per call, grouped by dtype (``{dtype name: metric names}``):
        each group is one array, so a block's rows come back in a few transfers, not one per metric."""
        flag = jax.ShapeDtypeStruct((), jnp.bool_)
        shapes = jax.eval_shape(self._block_step, state, flag, flag)[1]
        layout: dict[str, list] = {}
        for name, shape in shapes.items():
            layout.setdefault(jnp.dtype(shape.dtype).name, []).append(name)
        return {dtype: tuple(names) for dtype, names in layout.items()}

    def default_block_capacity(self, state: TrainState) -> int:
        """The default calls per block program (``generations_per_call=None``): the most whose metric buffers,
        one ``[capacity]`` array per metric, hold at most ``SEQUENTIAL_BUFFER_BYTES`` each (128 float32, 64
        float64), so that XLA:CPU runs the loop body's kernels one after another (see :meth:`generation_block`)."""
        if "_default_block_capacity" not in self.__dict__:  # block_layout traces the step: once per problem
            widest = max(jnp.dtype(dtype).itemsize for dtype in self.block_layout(state))
            self._default_block_capacity = max(1, SEQUENTIAL_BUFFER_BYTES // widest)
        return self._default_block_capacity

    def compiled_block(self, state: TrainState, capacity: int) -> tuple[Callable, float, dict]:
        """:meth:`generation_block` compiled for ``state``'s shapes and ``capacity`` (once per problem), the
        seconds it took, and its metrics' :meth:`block_layout`."""
        programs = self.__dict__.setdefault("_block_programs", {})
        if capacity not in programs:
            t0 = time.perf_counter()
            best = (jnp.full((), -jnp.inf, self.best_dtype), state, jnp.int32(-1))
            flag, count = jnp.bool_(True), jnp.int32(1)
            jitted = jax.jit(functools.partial(self.generation_block, capacity=capacity),
                             compiler_options=compiler_options(self.devices))
            # the same bits either way, and unrolled faster at every size measured (see THREEFRY_UNROLLED)
            args = (state, best, flag, count, count, jnp.zeros((), self.best_dtype))
            lowered, self.threefry_unrolled = lower_unrolled(jitted, *args, enabled=THREEFRY_UNROLLED)
            compiled = lowered.compile()
            programs[capacity] = (compiled, time.perf_counter() - t0, self.block_layout(state))
        return programs[capacity]

    def compile_result_programs(self, state: TrainState) -> float:
        """Compile, once per problem, the two programs a run's result needs (the best member's regeneration and
        f at the final mean), and return the seconds it took (0 after the first call): compiled on first use
        instead, they landed in whichever run first had a member as its best, seconds into its wall time."""
        if self._result_programs_ready:
            return 0.0
        t0 = time.perf_counter()
        if self._member_program is None and jax.process_count() == 1:
            self._member_program = self._compile_member(state)
        jax.block_until_ready(self.objective_jit(state.params))  # traced and compiled by jit's own cache
        self._result_programs_ready = True
        return time.perf_counter() - t0

    def population(self, state: TrainState) -> jax.Array:
        """Flat parameters of every member of the state's generation, ``[num_members, P]``."""
        flat, _, _ = jax.lax.map(lambda c: self.sample_chunk(state, c), jnp.arange(self.num_chunks, dtype=jnp.int32))
        return flat.reshape(-1, self.num_params)[: self.config.num_members]


# The box map as one program each (per shape and dtype, shared by every problem): for results and host points,
# where eager jnp would dispatch (and first compile) each of its dozen operations. The box is an argument here and
# a constant in the programs that evaluate the function: the same bits either way (jes.bounds.Box).
_into_box = jax.jit(box_bounds.into_box)
_from_box = jax.jit(box_bounds.from_box)

# Block programs hash with threefry unrolled (jes.threefry; False: JAX's rolled CPU lowering, the same bits).
# Faster at every draw size measured, rows interleaved in one process (benchmarks/README.md, "Side by side with
# evosax"): d = 100 (17 x 100 floats) 0.65-0.81x evosax's s/run unrolled against 1.1-1.7x rolled; d = 10
# (10 x 10, paired, seeds 1-3) 44 against 53 ms per Rosenbrock run (sep_cma_es), 37 against 41 (snes), once the step
# lost its all-gather on one device. (An unpaired d = 10 run, before that, had favoured rolled loops below 128 floats.)
THREEFRY_UNROLLED = True

# XLA:CPU's thunk executor runs a computation's kernels sequentially (no scheduling overhead) when every buffer
# they use holds at most this many bytes (ThunkExecutor::Options::execute_sequential_buffer_threshold, fixed in
# XLA, not an option) or when it has at most 8 kernels; else it builds a dependency graph and schedules them on
# its thread pool, which costs ~7 us per d = 10 generation. Measured d = 10 Rosenbrock, sep_cma_es, 64
# generations per call: 18.1 us a generation with [capacity] metric buffers of 256 bytes, 25.4 us with 1,600.
SEQUENTIAL_BUFFER_BYTES = 512

# What the block program reads back per call (the host loop's rows and checks)
BLOCK_METRICS = ("pop_max", "pop_min", "pop_mean", "noise_std", "centre_return", "best_member", "bad_member",
                 "bad_update")


def _config(num_members: int, num_generations: int, noise_std: Any, learning_rate: Any, fitness_shaping: str,
            weight_decay: float, chunk_size: int | None, strategy) -> ESConfig:
    check_settings_apply(strategy, learning_rate, weight_decay, fitness_shaping)
    if strategy.antithetic(True) and isinstance(num_members, int) and num_members % 2:  # before ESConfig's refusal,
        # which advises antithetic=False: not an argument here (a strategy's own sampling decides it)
        raise ValueError(f"num_members={num_members} is odd, but strategy {strategy.name!r} evaluates mirrored pairs; "
                         f"use an even population (e.g. {num_members + 1})")
    return ESConfig(num_members=num_members, num_generations=num_generations, noise_std=noise_std,
                    learning_rate=learning_rate, fitness_shaping=fitness_shaping, weight_decay=weight_decay,
                    antithetic=strategy.antithetic(True), chunk_size=chunk_size, normalize_observations=False,
                    eval_every=1)


DEFAULT_NOISE_STD = 0.2  # optimize's and AskTell's initial sigma when neither noise_std nor the strategy sets one


def _noise_std(strategy, noise_std: Any) -> Any:
    """``noise_std`` as given to :func:`optimize` / :class:`AskTell`, as ``ESConfig`` takes it: ``None`` is the
    strategy object's own initial sigma where it sets one (``CMAES(sigma_init=...)``: ``ESConfig.noise_std`` is
    then not read by it), else ``DEFAULT_NOISE_STD``. Both given is refused: one of them would be ignored (pycma
    takes one ``sigma0``)."""
    if noise_std is None:
        return DEFAULT_NOISE_STD
    refused = both_sigmas(strategy, noise_std)
    if refused is not None:
        raise ValueError(refused)
    return noise_std


def _default_members(strategy, num_params: int) -> int:
    n = strategy.default_population(num_params)
    return n + n % 2 if strategy.antithetic(True) else n


@dataclasses.dataclass(frozen=True)
class StopCriteria:
    """When one run of :func:`optimize` has converged or stalled (pycma's criteria, simplified); with
    ``restarts`` a stop starts the next run.

    Checked after every generation, on values the host reads back anyway (so a stop is the same generation
    whatever else happens):

    - ``tolfun``: the best values of the last ``10 + ceil(30 d / n)`` generations and the current
      generation's values all lie within ``tolfun`` of each other.
    - ``tolx``: the search distribution's mean standard deviation (``history["noise_std"]``) is below ``tolx``.
      (``tolfun=0`` and ``tolx=0`` turn those two off; ``max_condition=float("inf")`` the condition's.)
    - ``stagnation``: over the last ``120 + 30 d / n`` generations, the median of the newest 30 % of the
      generations' best and median values is no better than that of the oldest 30 % (``stagnation=False`` turns it
      off). That span is the least of Hansen's (2009) window, which grows to 20 % of the generations run (at most
      20,000); jes keeps it fixed, so a long run is stopped on the recent generations alone.
    - ``max_condition``: the covariance's condition number exceeds it (cma_es: ``max(D)^2 / min(D)^2``;
      sep_cma_es: ``max(diag_c) / min(diag_c)``). ``None``: 1e14 for float64 states and for sep_cma_es's diagonal
      covariance; for cma_es's float32 ones ``1 / (2 eps)`` (4.2e6), before the eigendecomposition stops resolving
      the small axes (its eigenvalues are floored at ``eps`` times the largest, so ``D``'s ratio squared never
      exceeds ``1 / eps``, 8.4e6; past it float32 rounding makes the covariance indefinite). A diagonal covariance
      has no eigendecomposition: float32 holds its variances' ratios far beyond that.
    - ``flat_fitness``: every member of the generation had the same value, in more than ``flat_fitness``
      generations in a row (as pycma's ``tolflatfitness``, whose default is 1; ``None``, jes's default, turns it
      off). A flat generation carries no ranking: the strategies' step-size rules then shrink the search on no
      evidence, which is how a run whose members all land where ``fitness_fn`` returns one penalty value (an
      infeasible region) collapses; ``flat_fitness=1`` stops it at the second such generation, and with
      ``restarts`` the next run starts at once. It also stops a float32 run whose members' values have become
      equal in float32 (numerical convergence, which ``tolfun`` would stop some generations later); plateaus such
      as bbob's step ellipsoid (f7) trigger it too.
    """

    tolfun: float = 1e-11
    tolx: float = 1e-11
    stagnation: bool = True
    max_condition: float | None = None
    flat_fitness: int | None = None

    def __post_init__(self):
        value = self.flat_fitness
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0):
            raise ValueError(f"StopCriteria.flat_fitness must be a number of generations >= 0 or None (off), "
                             f"got {value!r}")
        for name in ("tolfun", "tolx", "max_condition"):  # (a None or a string failed in the first check, mid-run)
            value = getattr(self, name)
            if name == "max_condition" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not (
                    value >= 0):
                off = "0 turns it off" if name != "max_condition" else "None: by the state's dtype; inf turns it off"
                raise ValueError(f"StopCriteria.{name} must be a number >= 0 ({off}), got {value!r}")
        if not isinstance(self.stagnation, (bool, np.bool_)):
            raise ValueError(f"StopCriteria.stagnation must be True or False, got {self.stagnation!r}")

    def check(self, rows: list, num_params: int, num_members: int, condition: float | None, dtype,
              diagonal: bool = False) -> str | None:
        """The name of the criterion that fires after the newest of ``rows`` (per generation: best value,
        lowest value, median-like ``pop_mean``, ``noise_std``, signed to maximise), else ``None``; ``diagonal``:
        the condition is a diagonal covariance's (no eigendecomposition limits it)."""
        g = len(rows)
        best, worst, middle, noise_std = rows[-1]
        window = 10 + -(-30 * num_params // num_members)
        if g >= window:
            recent = [r[0] for r in rows[-window:]]
            if max(max(recent), best) - min(min(recent), worst) < self.tolfun:
                return "tolfun"
        if noise_std < self.tolx:
            return "tolx"
        limit = self.max_condition
        if limit is None:
            # (1e7 for a float32 full covariance was out of reach of its floored eigenvalues: never fired, and runs
            # went on with an indefinite covariance, NaN noise_std, until a non-finite update ended a restart loop)
            limit = 1e14 if np.dtype(dtype) == np.float64 or diagonal else 0.5 / float(np.finfo(np.float32).eps)
        if condition is not None and not condition <= limit:
            return "max_condition"
        if self.flat_fitness is not None and g > self.flat_fitness:
            if all(r[0] == r[1] for r in rows[-(self.flat_fitness + 1):]):
                return "flat_fitness"
        if self.stagnation:
            span = int(120 + 30 * num_params / num_members)
            if g >= span:
                part = max(1, int(0.3 * span))
                old, new = rows[-span:][:part], rows[-part:]
                if (np.median([r[0] for r in new]) <= np.median([r[0] for r in old])
                        and np.median([r[2] for r in new]) <= np.median([r[2] for r in old])):
                    return "stagnation"
        return None


def _condition_source(strategy_state: Any) -> jax.Array | None:
    """What the condition number of the search distribution's covariance is read from (``None``: no covariance)."""
    if hasattr(strategy_state, "scales"):
        return strategy_state.scales
    if hasattr(strategy_state, "diag_c"):
        return strategy_state.diag_c
    return None


def _diagonal(strategy_state: Any) -> bool:
    """Whether the condition number is a diagonal covariance's (sep_cma_es), not read from an eigendecomposition."""
    return not hasattr(strategy_state, "scales") and hasattr(strategy_state, "diag_c")


def _condition(values: np.ndarray | None, strategy_state: Any) -> float | None:
    if values is None:
        return None
    values = np.asarray(values, np.float64)
    ratio = float(values.max() / values.min()) if values.min() > 0 else np.inf
    return ratio ** 2 if hasattr(strategy_state, "scales") else ratio


def _own_statistics(pop_max: Any, pop_min: Any, pop_mean: Any, sign: float) -> dict:
    """A generation's fitness statistics, from the maximised units the update works in (``sign * f``) back in
    ``f``'s own: ``best_value`` (the best member's f: the smallest when minimising), ``pop_min`` / ``pop_max``
    (the smallest and the largest f) and ``pop_mean``. The one conversion behind :func:`optimize`'s history and
    :meth:`AskTell.tell`'s ``info``, for Python numbers and (traced) JAX scalars alike."""
    best, worst = sign * pop_max, sign * pop_min
    low, high = (best, worst) if sign < 0 else (worst, best)
    return dict(best_value=best, pop_min=low, pop_max=high, pop_mean=sign * pop_mean)


@dataclasses.dataclass
class OptimizeResult:
    """What :func:`optimize` returns. Values are in the units of *your* function.

    Attributes:
        direction: ``"minimize"`` or ``"maximize"``: which way ``fitness_fn`` was optimised.
        x: the final mean, shaped like ``x0`` (with ``bounds``, mapped into the box, as ``fitness_fn`` saw it).
        value: ``fitness_fn(x)``.
        best_x, best_value: the best member ever evaluated (regenerated from its key) or the
            mean, whichever was better.
        history: per generation: ``generation``, ``mean_value`` (f at the mean after the update),
            ``best_value`` (best member of the generation), ``pop_mean``, ``noise_std``,
            ``evaluations`` (cumulative).
        num_evaluations: function evaluations, the population's and the mean's (in a :class:`NonFiniteValueError`'s
            result, those of the failing generation too).
        strategy: the strategy's name. state: final state (continue with ``AskTell`` or the problem).
        problem: the :class:`FunctionProblem` that ran (your function, its compiled programs, the devices), or
            ``None`` in a result that was pickled (sent back from a ``multiprocessing`` / joblib worker): those
            cannot be pickled and are left out; every other field pickles. ``copy.deepcopy`` copies the result
            and shares its ``problem``.
        stop_reason: ``"num_generations"``, ``"max_evaluations"``, ``"target"``, the
            :class:`StopCriteria` criterion that ended the (last) run, ``"stopped"`` (a callback raised
            :class:`jes.StopTraining`), ``"non_finite"`` (the result a :class:`NonFiniteValueError` holds) or
            ``"error"`` (the run so far that an exception the function or a callback raised carries as its
            ``result``). With ``restarts``: ``"max_evaluations"`` also when the next
            run would not fit the budget (not one generation of it), ``"max_restarts"`` when the restarts are
            used up; each run's own reason is in ``runs``.
        runs: with ``restarts``, one dict per run: ``population``, ``noise_std`` (the sigma the run started from),
            ``generations``, ``evaluations``, ``value`` (f at its final mean), ``best_value``, ``stop_reason``;
            ``x`` / ``value`` / ``state`` are then those of the run whose final mean was best, ``history``
            runs on across the runs (``evaluations`` cumulative).
    """

    direction: str
    x: Any
    value: float
    best_x: Any
    best_value: float
    history: dict
    num_evaluations: int
    strategy: str
    wall_time: float
    compile_time: float
    state: TrainState
    problem: FunctionProblem
    stop_reason: str = "num_generations"
    runs: list = dataclasses.field(default_factory=list)

    def __getstate__(self) -> dict:
        # pickle (multiprocessing, joblib): without the problem, which holds the user's function (often a lambda or
        # a closure), compiled programs and devices; a result that comes back from a worker needs none of them.
        # 64-bit JAX arrays as NumPy's: a jax.Array unpickles through jnp, which cuts them to 32 bits where JAX's
        # x64 mode is off (a float64 result of a worker with x64 came back float32 to a parent without it)
        return dict(jax.tree.map(_wide_as_numpy, self.__dict__), problem=None)

    def __setstate__(self, state: dict) -> None:
        wide = [leaf for leaf in jax.tree.leaves(state) if isinstance(leaf, _WideArray)]
        if wide and not jax.config.jax_enable_x64:
            warnings.warn("this OptimizeResult holds float64 arrays (JAX's x64 mode was on where it was made), and x64 "
                          "mode is off here: its arrays (x, best_x, the state's) come back as NumPy float64 arrays, "
                          "not JAX arrays, which would be float32 here. Call jax.config.update('jax_enable_x64', "
                          "True) before unpickling it to have them as JAX arrays", stacklevel=2)
        if wide:  # as it was where x64 mode is on: JAX arrays again
            state = jax.tree.map(lambda x: x.restored() if isinstance(x, _WideArray) else x, state)
        self.__dict__.update(state)

    def __copy__(self) -> "OptimizeResult":
        return dataclasses.replace(self)

    def __deepcopy__(self, memo: dict) -> "OptimizeResult":
        copied = copy.copy(self)
        memo[id(self)] = copied
        for name, value in self.__dict__.items():
            if name != "problem":  # shared: compiled programs and the user's function are not data to copy
                setattr(copied, name, copy.deepcopy(value, memo))
        return copied

    def summary(self) -> str:
        generations = len(self.history['generation'])
        return (f"{self.strategy} {self.direction}d f: f(mean) = {self.value:.6g}, best f = {self.best_value:.6g} "
                f"after {generations} generation{'' if generations == 1 else 's'}, {self.num_evaluations} evaluations "
                f"({self.wall_time:.1f}s, {self.compile_time:.1f}s compile)")


class _WideArray:
    """A pickled result's 64-bit JAX array, as the NumPy array it holds (unpickled as it is, x64 mode or not)."""

    def __init__(self, array: np.ndarray):
        self.array = array

    def restored(self) -> Any:
        """A JAX array again where x64 mode is on, else the NumPy array (JAX would cut it to 32 bits)."""
        return jnp.asarray(self.array) if jax.config.jax_enable_x64 else self.array


def _wide_as_numpy(leaf: Any) -> Any:
    """A 64-bit JAX array as a :class:`_WideArray`; the rest as is."""
    if (isinstance(leaf, jax.Array) and isinstance(leaf.dtype, np.dtype) and leaf.dtype.itemsize == 8
            and leaf.dtype.kind in "fiu"):  # (not a typed key array: its dtype is JAX's own)
        return _WideArray(np.asarray(leaf))
    return leaf


def _check_run_arguments(target: Any, callbacks: Any, stop: Any) -> None:
    """Types of :func:`optimize`'s run arguments, named before anything runs (a wrong one failed deep inside)."""
    if target is not None and (isinstance(target, (bool, np.bool_, str, bytes)) or np.ndim(target) != 0
                               or not np.issubdtype(np.asarray(target).dtype, np.number)
                               or np.iscomplexobj(target)):  # a Python, NumPy or JAX real scalar
        raise TypeError(f"target must be a number (the value to reach) or None, got {target!r}")
    _check_target(target)
    check_callbacks(callbacks)
    if stop is not None and not isinstance(stop, StopCriteria):
        raise TypeError(f"stop must be a jes.StopCriteria (e.g. jes.StopCriteria(tolx=1e-8)) or None, got {stop!r}")


def _check_target(target: Any) -> None:
    if target is not None and math.isnan(float(target)):  # every comparison with NaN is False: never reached
        raise ValueError("target is NaN, which no value reaches (every comparison with NaN is false); give the "
                         "value to reach, or target=None for no target")


def _check_perturbation(perturbation: Any) -> None:
    if perturbation is None or not perturbations.get(perturbation).structured:  # full rank (a bad name: get's error)
        return
    raise ValueError(f"optimize() takes no perturbation={perturbation!r}: low-rank perturbations factor the weight "
                     "matrices of a policy's layers (jes.train), and a black-box fitness_fn would be handed each "
                     "member's materialised parameters anyway; leave perturbation out (full rank) or train a Flax "
                     "policy with jes.train(..., perturbation=jes.LowRank(rank=1))")


def optimize(
    fitness_fn: Callable[[Any], Any],
    x0: Any,
    strategy: Any = "openai_es",
    *,
    minimize: bool = False,
    num_members: int | None = None,
    num_generations: int | None = None,
    key: Any = 0,
    noise_std: Any = None,
    optimizer: Any = None,
    learning_rate: Any = None,
    fitness_shaping: str = "centered_ranks",
    weight_decay: float = 0.0,
    chunk_size: int | None = None,
    target: float | None = None,
    devices: Any = None,
    callbacks: Sequence[Callable[[dict], Any]] = (),
    restarts: str | None = None,
    max_restarts: int = 9,
    max_evaluations: int | None = None,
    stop: StopCriteria | None = None,
    generations_per_call: int | None = None,
    host: bool = False,
    perturbation: Any = None,
    bounds: Any = None,
) -> OptimizeResult:
    """Optimise ``fitness_fn`` with an evolution strategy, many generations per compiled call.

    Example:
        >>> r = jes.optimize(lambda x: jnp.sum(x ** 2), 3 * jnp.ones(10), "sep_cma_es", minimize=True)
        >>> r.direction, r.value        # ('minimize', 2.2e-06) after the default 100 generations (key 0)

    Args:
        fitness_fn: maps a parameter pytree shaped like ``x0`` (or a flat vector) to a scalar;
            jittable (it is vmapped over members).
        x0: initial mean: an array, a pytree of arrays, or a list / tuple of numbers (pycma's ``[1.0, 2.0]``),
            which is one 1-D vector (``fitness_fn`` gets an array, not a list). Searched in float32, or in float64
            in JAX's x64 mode where ``x0`` is float64 or integer.
        strategy: ``jes.strategies.names()`` or a strategy object.
        minimize: minimise instead of maximise (the default). Reported values are ``fitness_fn``'s own.
        num_members: population (``None``: the strategy's default for this dimension, e.g.
            ``4 + 3 ln d`` for snes/sep_cma_es, 64 for openai_es/ars).
        num_generations: generations to run (``None``: 100, or unlimited when ``max_evaluations`` is given, which
            then ends the run as pycma's ``maxfevals`` does; with ``restarts``, per run, unlimited: each
            run ends by ``stop``, ``target`` or ``max_evaluations``).
        key: int seed or ``jax.random`` key.
        noise_std: initial sigma (openai_es/ars: fixed sigma; openai_es also takes a schedule). ``None``: the
            strategy object's own initial sigma where it sets one (``CMAES(sigma_init=0.5)``), else 0.2; both
            given is refused (the strategy's would silently win).
        optimizer, learning_rate: the mean's optimizer for openai_es/pgpe (``None``: the strategy's default).
        fitness_shaping: for openai_es/pgpe.
        weight_decay: L2 coefficient for openai_es/pgpe (the other strategies refuse one): adds ``weight_decay *
            mean`` to the step's loss gradient, pulling the mean towards 0 whichever the direction (0: none).
        chunk_size: members per compiled chunk (part of the run's identity).
        target: stop once f(mean) reaches this value (below it when minimising, above when maximising); NaN
            is refused (no value reaches it).
        devices: local devices to shard the population over.
        callbacks: called with each generation's record (with ``restarts``: ``generation`` and ``evaluations``
            counted on over the runs, as in ``result.history``, ``run``, the run's index, and ``run_generation``,
            the generation within the run). One that raises :class:`jes.StopTraining` ends the run after that
            generation (a time budget of your own, say; the callbacks after it still see the generation), which
            ``optimize`` returns with ``stop_reason="stopped"`` (no restart follows). Any other exception from a
            callback, and with ``host=True`` also one from ``fitness_fn`` (a simulator that fails) or a Ctrl-C, goes
            on carrying the run so far as ``error.result`` (an :class:`OptimizeResult`: its best point, state and
            history; with ``restarts``, every run so far), as a non-finite value's error does.
        restarts: ``"ipop"`` (Auger & Hansen 2005: after each stop, restart from ``x0`` with twice the
            population) or ``"bipop"`` (Hansen 2009, pycma's variant: IPOP runs interleaved with runs of
            population ``n * (n_ipop / n)^(u^2)``, sigma ``sigma0 * 10^(-2 u')`` and at most
            ``ceil(0.5 * E_large / (population + 1))`` generations, ``u, u'`` uniform from the run's key, whenever
            those and run 0 have used fewer evaluations than the IPOP runs, ``E_large``; so run 1 is an IPOP run);
            for ``cma_es`` and ``sep_cma_es``. Run ``k``'s key is the run key for ``k = 0``, else
            ``fold_in(fold_in(key, RESTART_STREAM), k)``. ``sigma0``, every IPOP run's initial sigma, is
            ``noise_std`` or the strategy's own (``CMAES(sigma_init=...)``); ``result.runs`` lists each run's.
        max_restarts: restarts after the first run (``"bipop"``: IPOP restarts; its small-population runs do not
            count, as in pycma).
        max_evaluations: evaluations budget (population and mean), over all runs; without ``num_generations``
            it alone ends a run that nothing else stops (pycma's ``maxfevals``), not the default 100 generations.
        stop: :class:`StopCriteria` ending a run (``None``: the defaults with ``restarts``, none without).
        generations_per_call: at most this many generations run inside one compiled call (a ``while_loop``
            over the generation step, with the target and non-finite checks inside); the host reads the
            block's metrics back once. ``None``: 128 with float32 values, 64 with float64 ones (the most whose
            per-generation metric buffers keep XLA:CPU's loop body on its sequential executor, see
            :meth:`FunctionProblem.default_block_capacity`). Blocks adapt their length to ~0.25 s (from 8
            generations, at most
            doubling), so ``callbacks`` and progress arrive at block granularity, each generation's record in
            order. ``StopCriteria`` are checked on the host on every generation's row; a stop before a block's
            end reruns that block's start for exactly the generations kept. Same bits as ``1`` (one compiled
            call per generation, dispatched ahead) and as :class:`AskTell`, whatever the block lengths.
        host: ``fitness_fn`` is plain host code (Python, NumPy, a simulator or a C library; not traced): it is
            called with one NumPy point shaped like ``x0`` (float64 where ``x0`` is, in x64 mode; a writable copy
            that it may repair in place, the member being the point before) at a time, for
            each member in member order and then once at the updated mean, exactly ``num_members + 1`` calls a
            generation, never a call past a stop, ``max_evaluations`` or a non-finite value. Sampling and the update run as two
            compiled programs per generation, shared by every run, restart and problem with the same strategy,
            settings, dimension and dtype (compiled once per process). Everything else (``restarts``,
            ``stop``, ``target``, ``max_evaluations``, ``callbacks``) works as for a JAX function; the
            generations are the same as ``optimize``'s for a JAX function with the same values (in x64 mode,
            or for float32 values); ``generations_per_call`` and ``devices`` do not apply.
        perturbation: only ``None`` / ``"full_rank"``: every member is a dense perturbation of the whole vector.
            Low-rank perturbations (``jes.LowRank``) factor the weight matrices of a policy's layers so that
            its forward pass never forms them; ``fitness_fn`` is opaque, so it would be handed each member's
            materialised matrices anyway. They are refused with an error saying so.
        bounds: box constraints ``(lower, upper)``, pycma's ``'bounds': [lower, upper]`` with its default
            ``BoundTransform``: each side a number, ``None`` (open; so are ``-inf`` / ``inf``), an array or pytree
            shaped like ``x0`` (leaves may be ``None``, or lists of numbers and ``None`` shaped like the leaf).
            The strategy searches an unbounded space and ``fitness_fn`` is called only at points mapped into the
            box (:func:`jes.bounds.to_box`: the identity inside, quadratic near each bound, reflected beyond);
            ``x``, ``best_x``, ``value`` (f at ``x``) are in the box, ``state`` is the search's (unbounded). The
            search starts at ``x0``'s preimage (``x0`` itself away from the bounds). Refused: ``lower >= upper``,
            NaN, a shape unlike ``x0``'s and an ``x0`` outside the box, each error naming the coordinate.

    Returns:
        An :class:`OptimizeResult`.
    """
    _check_perturbation(perturbation)
    _check_run_arguments(target, callbacks, stop)
    callbacks = tuple(callbacks)  # an iterator would be used up by the first generation
    strategy = get_strategy(strategy)
    noise_std = _noise_std(strategy, noise_std)
    flat, _ = _flatten_x0(x0)
    box_bounds.flat_bounds(bounds, _as_vector_if_numbers(x0), flat)  # refused before anything is built or run
    _warn_if_float64_lost(x0)
    _warn_if_integer_leaves(x0)
    if num_members is None:
        num_members = _default_members(strategy, int(flat.shape[0]))
    if not isinstance(host, bool):
        raise TypeError(f"host must be True or False, got {host!r}")
    if host and not callable(fitness_fn):
        raise TypeError(f"fitness_fn must be callable, got {type(fitness_fn).__name__}")
    if host and devices is not None:
        raise ValueError("host=True evaluates on the host and runs sampling and updates on one device; "
                         "leave devices=None")
    if max_evaluations is not None:
        if isinstance(max_evaluations, (float, np.floating)) and float(max_evaluations).is_integer():
            max_evaluations = int(max_evaluations)  # 1e4, as pycma's maxfevals is often written
        if isinstance(max_evaluations, bool) or not isinstance(max_evaluations, (int, np.integer)):
            raise TypeError(f"max_evaluations must be a whole number, got {max_evaluations!r}")
        if max_evaluations < num_members + 1:  # no generation would run: the result would be x0, never evaluated
            raise ValueError(f"max_evaluations={max_evaluations} is less than one generation's evaluations "
                             f"({num_members} members and the mean: {num_members + 1}); raise it to at least "
                             f"{num_members + 1} or lower num_members")

    def build(members, generations, sigma_factor=None):
        """The problem of a run: ``sigma_factor`` (restarts) scales the initial sigma, the strategy's own where it
        sets one (a BIPOP small run's ``10^(-2 u')``)."""
        sigma, run_strategy = noise_std, strategy
        if sigma_factor is not None:
            own = strategy.own_sigma()
            if own is None:
                sigma = noise_std * sigma_factor
            else:
                run_strategy = dataclasses.replace(strategy, **{strategy.sigma_field: float(own) * sigma_factor})
        config = _config(members, generations, sigma, learning_rate, fitness_shaping, weight_decay, chunk_size,
                         run_strategy)
        if host:
            return HostFunctionProblem(fitness_fn, x0, run_strategy, config, optimizer=optimizer, minimize=minimize,
                                       bounds=bounds)
        return FunctionProblem(fitness_fn, x0, run_strategy, config, optimizer=optimizer, minimize=minimize,
                               devices=devices, bounds=bounds)

    if restarts is None:
        if max_restarts != 9:  # (its default) given without restarts: it would be ignored
            raise ValueError(f"max_restarts={max_restarts!r} without restarts: it counts IPOP/BIPOP restarts; pass "
                             f"restarts='ipop' (or 'bipop') with it, or leave it out")
        if num_generations is None and max_evaluations is not None:  # the budget decides (pycma's maxfevals)
            budget_generations = max_evaluations // (num_members + 1)
            return run_optimization(build(num_members, budget_generations), key, 10 ** 9, target=target,
                                    callbacks=callbacks, stop=stop, max_evaluations=max_evaluations,
                                    generations_per_call=generations_per_call)
        num_generations = 100 if num_generations is None else num_generations
        return run_optimization(build(num_members, num_generations), key, num_generations, target=target,
                                callbacks=callbacks, stop=stop, max_evaluations=max_evaluations,
                                generations_per_call=generations_per_call)
    if restarts not in ("ipop", "bipop"):
        raise ValueError(f"restarts must be 'ipop', 'bipop' or None, got {restarts!r}")
    if strategy.name not in ("cma_es", "sep_cma_es"):
        raise ValueError(f"restarts are for cma_es and sep_cma_es (their stop criteria read the covariance); "
                         f"got {strategy.name!r}")
    if not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be a non-negative int, got {max_restarts!r}")
    if callable(noise_std):
        raise ValueError("restarts need a constant noise_std (the initial sigma of each run)")
    noise_std = float(noise_std)  # build's, for every run
    return _optimize_with_restarts(build, key, restarts, num_members, num_generations, max_restarts,
                                   max_evaluations, StopCriteria() if stop is None else stop, target, callbacks,
                                   generations_per_call)


RESTART_STREAM = 0x5EED  # folded into the run key before the restart index: restart keys never meet other keys


def restart_key(key: Any, index: int) -> jax.Array:
    """The key of run ``index`` of a restarted :func:`optimize` (run 0: the run key itself)."""
    key = as_key(key)
    return key if index == 0 else jax.random.fold_in(jax.random.fold_in(key, RESTART_STREAM), index)


def _optimize_with_restarts(build, key, restarts, num_members, num_generations, max_restarts, max_evaluations, stop,
                            target, callbacks, generations_per_call=None) -> OptimizeResult:
    """IPOP / BIPOP: runs of :func:`run_optimization` until the target, the budget or ``max_restarts``.

    BIPOP keeps pycma's regime bookkeeping (``cma.fmin``'s ``bipop``): run 0 has the default population and its
    evaluations count for the small regime; every later run is a small one while the small regime has used fewer
    evaluations than the large one (``max(1, large)``), else a large one with twice the last large population.
    A small run has population ``n * (n_large / n)^(u^2)`` (``n_large``: the last large run's), sigma
    ``sigma0 * 10^(-2 u')`` (``sigma0``: every large run's, ``noise_std`` or the strategy's own ``sigma_init``) and
    at most ``ceil(0.5 * large evaluations / (population + 1))`` generations (pycma: ``maxiter = 0.5 * sum(large
    evaluations) / popsize``; a jes generation is ``population + 1`` evaluations), ``u, u'`` uniform from the
    run's key; small runs do not count against ``max_restarts``.

    Callbacks get each record as the combined history has it: ``generation`` and ``evaluations`` counted on
    across the runs, ``run`` the run's index and ``run_generation`` the generation within the run.
    """
    t_start = time.perf_counter()
    generations = 10 ** 9 if num_generations is None else num_generations
    used, large_population, budgets = 0, num_members, {"large": 0, "small": 0}
    results, runs, small_runs, ended_by = [], [], 0, None
    for index in itertools.count():
        run_key = restart_key(key, index)
        run_generations = generations
        # run 0: the default population, on the small regime's budget (pycma)
        regime = "small" if restarts == "bipop" and index == 0 else "large"
        if restarts == "bipop" and index > 0 and budgets["small"] < max(1, budgets["large"]):
            regime = "small"
            small_runs += 1
            u = np.asarray(jax.random.uniform(jax.random.fold_in(run_key, 1), (2,)), np.float64)
            members = max(4, int(num_members * (large_population / num_members) ** (u[0] ** 2)))  # as pycma
            sigma_factor = 10 ** (-2 * u[1])
            run_generations = min(generations, max(1, math.ceil(0.5 * budgets["large"] / (members + 1))))
        else:
            if index > 0:
                large_population *= 2
            members, sigma_factor = large_population, None
        remaining = None if max_evaluations is None else max_evaluations - used
        if remaining is not None and remaining < members + 1:  # not one generation of this run fits
            ended_by = "max_evaluations"
            break
        offset, run = used, index
        generations_before = sum(len(r.history["generation"]) for r in results)

        def shifted(record, offset=offset, run=run, generations_before=generations_before):
            record = dict(record, generation=record["generation"] + generations_before,
                          evaluations=record["evaluations"] + offset, run=run, run_generation=record["generation"])
            for callback in callbacks:
                callback(record)

        problem = build(members, 1, sigma_factor)
        sigma = problem.strategy.initial_sigma(problem.config.noise_std)  # what this run starts from
        try:
            result = run_optimization(problem, run_key, run_generations, target=target,
                                      callbacks=(shifted,) if callbacks else (), stop=stop, max_evaluations=remaining,
                                      generations_per_call=generations_per_call)
        except NonFiniteValueError as err:  # every run so far, this one up to its last good generation
            results.append(err.result)
            runs.append(_run_record(members, sigma, err.result))
            before = sum(len(r.history["generation"]) for r in results[:-1])  # the history's numbering runs on
            raise NonFiniteValueError(f"restart run {index} (population {members}), generation {before + err.generation}"
                                      f" of the history: {err}", before + err.generation, err.member,
                                      _combined(results, runs, used + err.result.num_evaluations, t_start)) from None
        except BaseException as err:  # a callback's or the function's error: every run so far, this one's too
            partial = getattr(err, "result", None)
            if isinstance(partial, OptimizeResult) and partial.problem is problem:
                err.result = _combined([*results, partial], [*runs, _run_record(members, sigma, partial)],
                                       used + partial.num_evaluations, t_start)
            raise
        used += result.num_evaluations
        budgets[regime] += result.num_evaluations
        results.append(result)
        runs.append(_run_record(members, sigma, result))
        if result.stop_reason in ("target", "max_evaluations", "stopped"):  # (stopped: a callback's StopTraining)
            break
        if index + 1 - small_runs > max_restarts:  # run 0 and the large runs (pycma: irun - runs_with_small)
            ended_by = "max_restarts"
            break
    combined = _combined(results, runs, used, t_start)
    return combined if ended_by is None else dataclasses.replace(combined, stop_reason=ended_by)


def _run_record(members: int, sigma: float, result: OptimizeResult) -> dict:
    """One run of a restarted :func:`optimize`, as ``OptimizeResult.runs`` lists it."""
    return dict(population=members, noise_std=sigma, generations=len(result.history["generation"]),
                evaluations=result.num_evaluations, value=result.value, best_value=result.best_value,
                stop_reason=result.stop_reason)


def _combined(results: list, runs: list, used: int, t_start: float) -> OptimizeResult:
    """The runs of a restarted :func:`optimize` as one result: the best final mean, the best value seen, the
    histories end to end (``run``: each row's run)."""
    sign = results[0].problem.sign
    final = max(results, key=lambda r: sign * r.value)
    best = max(results, key=lambda r: sign * r.best_value)
    history, offset, generation = {k: [] for k in results[0].history}, 0, 0
    history["run"], history["run_generation"] = [], []
    for index, r in enumerate(results):
        for k, v in r.history.items():
            history[k].append(v + (offset if k == "evaluations" else generation if k == "generation" else 0))
        history["run"].append(np.full(len(r.history["generation"]), index))
        history["run_generation"].append(np.asarray(r.history["generation"]))  # as the callbacks' records have it
        offset, generation = offset + r.num_evaluations, generation + len(r.history["generation"])
    return dataclasses.replace(
        final, best_x=best.best_x, best_value=best.best_value,
        history={k: np.concatenate(v) for k, v in history.items()}, num_evaluations=used,
        wall_time=time.perf_counter() - t_start, compile_time=sum(r.compile_time for r in results),
        stop_reason=results[-1].stop_reason, runs=runs)


def run_optimization(problem: FunctionProblem, key: Any = 0, num_generations: int | None = None, *,
                     target: float | None = None, callbacks: Sequence[Callable[[dict], Any]] = (),
                     stop: StopCriteria | None = None, max_evaluations: int | None = None,
                     generations_per_call: int | None = None) -> OptimizeResult:
    """The host loop of :func:`optimize` for a built problem (reuse one problem, and its compiled programs, over seeds).

    ``stop``: end the run when a :class:`StopCriteria` criterion fires; ``max_evaluations``: run no generation
    that would take the count (population and mean) past it. ``generations_per_call``: see :func:`optimize`.
    """
    if generations_per_call is not None and (isinstance(generations_per_call, bool)
                                             or not isinstance(generations_per_call, int) or generations_per_call < 1):
        raise ValueError(f"generations_per_call must be an int >= 1 (or None: the default), got {generations_per_call!r}")
    _check_target(target)
    num_generations = problem.config.num_generations if num_generations is None else num_generations
    stop_reason = "num_generations"
    if max_evaluations is not None and max_evaluations // (problem.config.num_members + 1) < num_generations:
        num_generations, stop_reason = max(0, max_evaluations // (problem.config.num_members + 1)), "max_evaluations"
    if isinstance(problem, HostFunctionProblem):
        return _run_on_host(problem, key, num_generations, stop_reason, target, callbacks, stop)
    return _run_compiled(problem, key, num_generations, stop_reason, target, callbacks, stop, generations_per_call)


def _callbacks_stop(callbacks: Sequence[Callable[[dict], Any]], record: dict, warned: set,
                    partial: Callable[[], OptimizeResult]) -> bool:
    """Call each callback with a generation's ``record`` as :func:`jes.train` does (:func:`jes.loop.call_callbacks`):
    whether one raised :class:`jes.StopTraining` (the run ends after this generation, which the callbacks after
    it still see); another exception is raised, carrying ``partial()``, the run up to this generation."""
    from jes.loop import call_callbacks  # (lazily: the training loop's module, whose callbacks these are)

    stop, error = call_callbacks(callbacks, record, warned)
    if error is not None:
        _carry_result(error, partial, "a callback raised")
        raise error
    return stop is not None


def _carry_result(err: BaseException, partial: Callable[[], OptimizeResult], what: str) -> None:
    """Attach the run so far, ``partial()``, to ``err`` (``err.result``) with a note saying so, unless it carries
    this run's already (a :class:`NonFiniteValueError`'s). Never replaces ``err``: an exception that takes no
    attribute or note, or a result that cannot be made, leaves it as it is."""
    try:
        result = partial()
        held = getattr(err, "result", None)
        if isinstance(held, OptimizeResult) and held.problem is result.problem:
            return
        err.result = result
        if hasattr(err, "add_note"):  # Python 3.11+
            err.add_note(f"({what} after generation {len(result.history['generation'])} of the run; error.result "
                         f"holds the run so far: its best point, state and history)")
    except Exception:  # noqa: BLE001 - the user's error goes on as it came
        pass


def _run_compiled(problem: FunctionProblem, key: Any, num_generations: int, stop_reason: str, target: float | None,
                  callbacks: Sequence[Callable[[dict], Any]], stop: StopCriteria | None,
                  generations_per_call: int | None) -> OptimizeResult:
    """:func:`run_optimization` for a JAX function (``num_generations`` already cut to ``max_evaluations``)."""

    def check_mean(generation: int, centre: float) -> None:
        """Raise :class:`NonFiniteValueError` when f at generation ``generation``'s updated mean is not finite
        (it could never meet a target), its result the run of the generations before, rerun (the same programs,
        so the same bits: the block program keeps no state but its last)."""
        if math.isfinite(centre):
            return

        def partial():
            rerun = run_optimization(problem, key, generation - 1, generations_per_call=generations_per_call)
            return dataclasses.replace(rerun, stop_reason="non_finite", wall_time=time.perf_counter() - t_start,
                                       num_evaluations=generation * (problem.config.num_members + 1))
        _check_finite(dict(bad_member=-1, bad_update=False, bad_mean=True), generation - 1, partial)

    rows = []  # per generation, for the stop criteria
    minimize, num_members = problem.minimize, problem.config.num_members
    state = problem.init_state(key)
    t_start = time.perf_counter()
    sign = problem.sign
    history = {k: [] for k in ("generation", "mean_value", "best_value", "pop_mean", "noise_std", "evaluations")}
    if generations_per_call is None:
        generations_per_call = problem.default_block_capacity(state)
    if generations_per_call > 1:
        state, best_value, best_state, best_member, evaluations, stop_reason, compile_time = _run_in_blocks(
            problem, state, num_generations, stop_reason, target, callbacks, stop, generations_per_call, history,
            t_start, check_mean)
        return _result(problem, state, history, best_value, best_state, best_member, evaluations, stop_reason,
                       t_start, compile_time)
    compiled, compile_time = problem.compiled_step(state)
    compile_time += problem.compile_result_programs(state)
    best_value, best_of = -np.inf, (state, None)  # (state, member): regenerated once, at the end
    evaluations = 0
    flags = {flag: jnp.bool_(flag) for flag in (False, True)}
    gen, ahead, done = 0, 1, False
    single_device = len(problem.devices) == 1
    # Each call also evaluates the centre of the state it is given, which completes the row of the generation
    # before (a last call evaluates only that): `pending` holds the newest row until then, `head` the newest state.
    pending, head = None, state

    warned: set = set()  # callbacks warned of a returned value

    def finish(record, after, centre) -> bool:
        nonlocal stop_reason
        nonlocal best_value, best_of
        check_mean(record["generation"], centre)
        if centre > best_value:
            best_value, best_of = centre, (after, None)
        record["mean_value"] = sign * centre
        for k in history:
            history[k].append(record[k])
        if _callbacks_stop(callbacks, record, warned, lambda: _result(
                problem, after, history, best_value, best_of[0], -1 if best_of[1] is None else best_of[1],
                record["evaluations"], "error", t_start, compile_time)):
            stop_reason = "stopped"
            return True
        reached = target is not None and (record["mean_value"] <= target if minimize else record["mean_value"] >= target)
        if reached:
            stop_reason = "target"
        return reached

    while not done:
        population = gen < num_generations
        if not population and pending is None:
            break
        # Dispatch `ahead` generations before reading any metrics back: on a cheap function the host round
        # trip per generation is the cost. Generations past a stop are discarded (same programs, same order,
        # so the same bits whatever `ahead` is); `ahead` grows while a generation takes under ~2 ms.
        # On one device only: with several CPU devices and many generations in flight, XLA:CPU's all-gather
        # rendezvous could wait past its 40 s limit on a loaded machine and abort the process
        # (benchmarks/README.md); one generation in flight never did.
        t_block = time.perf_counter()
        block = []
        for _ in range(min(ahead, num_generations - gen) if population else 1):
            # the centre of `head` only when its row is still open (not for the initial state)
            new_state, metrics = compiled(head, flags[pending is not None or bool(block)], flags[population])
            block.append((head, new_state, metrics))
            head = new_state
        conditions = [_condition_source(after.strategy) if stop is not None else None for _, after, _ in block]
        fetched, conditions = jax.device_get(([metrics for _, _, metrics in block], conditions))
        for (before, after, _), metrics, condition in zip(block, fetched, conditions):
            m = {k: v.item() for k, v in metrics.items()}
            if pending is not None:
                (record, state), pending = pending, None
                if finish(record, state, m["centre_return"]):  # the centre of `before`, which is `state`
                    done = True
                    break
            if not population:
                break
            _check_finite(m, gen, lambda: _result(
                problem, before, history, best_value, best_of[0], -1 if best_of[1] is None else best_of[1],
                evaluations + num_members, "non_finite", t_start, compile_time))  # its members were evaluated
            evaluations += num_members + 1
            if m["pop_max"] > best_value:
                best_value, best_of = m["pop_max"], (before, int(m["best_member"]))
            gen += 1
            own = _own_statistics(m["pop_max"], m["pop_min"], m["pop_mean"], sign)
            pending = (dict(generation=gen, best_value=own["best_value"], pop_mean=own["pop_mean"],
                            noise_std=m["noise_std"], evaluations=evaluations), after)
            if stop is not None:
                rows.append((m["pop_max"], m["pop_min"], m["pop_mean"], m["noise_std"]))
                reason = stop.check(rows, problem.num_params, num_members, _condition(condition, after.strategy),
                                    after.params.dtype, _diagonal(after.strategy))
                if reason is not None:  # the generations dispatched after this one are discarded
                    stop_reason, num_generations, head = reason, gen, after
                    break
        per_generation = (time.perf_counter() - t_block) / len(block)
        ahead = min(2 * ahead, 64) if per_generation < 0.002 and single_device else max(1, ahead // 2)
    best_state, best_member = best_of
    return _result(problem, state, history, best_value, best_state, -1 if best_member is None else best_member,
                   evaluations, stop_reason, t_start, compile_time)


def _result(problem, state, history, best_value, best_state, best_member, evaluations, stop_reason, t_start,
            compile_time) -> OptimizeResult:
    best_flat = best_state.params if best_member < 0 else problem.member(best_state, np.int32(best_member))
    return OptimizeResult(
        direction="minimize" if problem.minimize else "maximize",
        x=problem.params_tree(state.params), value=float(problem.objective_jit(state.params)),
        best_x=problem.params_tree(best_flat), best_value=problem.sign * best_value,
        history={k: np.asarray(v) for k, v in history.items()}, num_evaluations=evaluations,
        strategy=problem.strategy.name, wall_time=time.perf_counter() - t_start, compile_time=compile_time,
        state=state, problem=problem, stop_reason=stop_reason,
    )


def _threshold(problem: FunctionProblem, target: float | None) -> np.ndarray:
    """The target as the block program tests it, ``centre >= threshold`` (maximised units, the centre's dtype):
    the smallest value of that dtype at or above ``sign * target``, so that the test holds exactly when the host
    loop's (``sign * centre <= target`` minimising, ``>=`` maximising, in float64) does. NaN: no target."""
    dtype = np.dtype(problem.best_dtype)
    if target is None:
        return np.array(np.nan, dtype)
    wanted = problem.sign * float(target)
    value = np.array(wanted, dtype)
    if float(value) < wanted:
        value = np.nextafter(value, np.array(np.inf, dtype))
    return value


BLOCK_SECONDS = 0.25  # a block's wall time the adaptive block length aims at (progress and callbacks this often)


def _block_size(call_seconds: float) -> int:
    """Calls of the block program that take about ``BLOCK_SECONDS`` at ``call_seconds`` each (at least 1)."""
    return max(1, int(BLOCK_SECONDS / max(call_seconds, 1e-9)))


def _run_in_blocks(problem, state, num_generations, stop_reason, target, callbacks, stop, capacity, history,
                   t_start, check_mean):
    """:func:`run_optimization`'s loop over :meth:`FunctionProblem.generation_block` calls: the same calls of the
    same generation step as one call per generation, their rows read back once per block.

    A block holds at most ``capacity`` calls and aims at ``BLOCK_SECONDS`` of wall time, at most doubling from
    one block to the next. The first block holds 8 calls, or, when the problem has run blocks before (another
    seed), as many as its last block's time per call allows: a short run on a cheap function is then one or two
    calls of the program, not four or five. Block lengths never change the results. The target and non-finite
    values stop a block inside; a :class:`StopCriteria` is checked on
    the host, on the rows read back: when it fires before a block's last row, the block is run again from its
    start for exactly that many calls (the same program, so the same bits) to get the state it stopped on.
    """
    compiled, compile_time, layout = problem.compiled_block(state, capacity)
    compile_time += problem.compile_result_programs(state)
    sign, minimize, num_members = problem.sign, problem.minimize, problem.config.num_members
    # NumPy scalars as the program's small arguments: a jnp scalar is an eager computation of its own per call
    best = (np.full((), -np.inf, problem.best_dtype), state, np.int32(-1))
    threshold = _threshold(problem, target)
    flags = {flag: np.bool_(flag) for flag in (False, True)}
    gen, evaluations, pending, rows = 0, 0, None, []
    size = min(capacity, 8 if problem._block_call_seconds is None else _block_size(problem._block_call_seconds))

    warned: set = set()  # callbacks warned of a returned value

    def finish(record, centre, upto) -> str | None:
        """The record's row and callbacks: ``"target"`` or ``"stopped"`` (a callback's StopTraining) to end the run
        there, else ``None``. ``upto()``: the block's state and best up to this centre, for an error's result."""
        check_mean(record["generation"], centre)
        record["mean_value"] = sign * centre
        for k in history:
            history[k].append(record[k])

        def partial():
            after, (value, best_state, member) = upto()
            return _result(problem, after, history, float(value), best_state, int(member), record["evaluations"],
                           "error", t_start, compile_time)
        if _callbacks_stop(callbacks, record, warned, partial):
            return "stopped"
        reached = target is not None and (record["mean_value"] <= target if minimize else record["mean_value"] >= target)
        return "target" if reached else None

    while num_generations > gen or pending is not None:
        population_calls = min(num_generations - gen, size)
        # the last generation's centre in the same block when it fits (a centre-only call)
        calls = population_calls + (population_calls == num_generations - gen and population_calls < capacity)
        start = (state, best, flags[pending is not None])
        t_block = time.perf_counter()
        made, after, new_best, metrics = compiled(*start, np.int32(calls), np.int32(population_calls), threshold)
        made, metrics = jax.device_get((made, metrics))
        made, done, stopped_at = int(made), False, None
        # One conversion per metric and block (Python numbers, as .item() gives them), not one per generation:
        # on a cheap function the host's work per generation is a good part of a generation's time.
        col = {k: metrics[dtype][:made, i].tolist() for dtype, names in layout.items() for i, k in enumerate(names)}
        centres, pop_max, pop_mean, noise_std = col["centre_return"], col["pop_max"], col["pop_mean"], col["noise_std"]
        pop_min = col["pop_min"]
        bad_member, bad_update = col["bad_member"], col["bad_update"]
        def upto(i):
            """The block's state and best after its call ``i``, a centre-only call (its generations up to there):
            the block again, shorter (the same programs, the same bits for the calls it makes)."""
            _, after, new_best, _ = compiled(*start, np.int32(i + 1), np.int32(i), threshold)
            return after, new_best

        for i in range(made):
            if pending is not None:
                record, pending = pending, None
                ended = finish(record, centres[i], lambda i=i: upto(i))
                if ended is not None:
                    stop_reason, done = ended, True
                    if made != i + 1:  # a callback's stop: the block ran on past this centre
                        made = i + 1
                        after, new_best = upto(i)
                    break
            if i >= population_calls:  # the centre-only call
                done = True
                break
            if bad_member[i] >= 0 or bad_update[i]:  # the block stopped here, its state the one before
                _check_finite({k: v[i] for k, v in col.items()}, gen, lambda: _result(
                    problem, after, history, float(new_best[0]), new_best[1], int(new_best[2]),
                    evaluations + num_members, "non_finite", t_start, compile_time))  # its members were evaluated
            evaluations += num_members + 1
            gen += 1
            own = _own_statistics(pop_max[i], pop_min[i], pop_mean[i], sign)
            pending = dict(generation=gen, best_value=own["best_value"], pop_mean=own["pop_mean"],
                           noise_std=noise_std[i], evaluations=evaluations)
            if stop is not None:
                rows.append((pop_max[i], pop_min[i], pop_mean[i], noise_std[i]))
                condition = None
                if "cond_max" in col:
                    condition = _condition(np.array([col["cond_max"][i], col["cond_min"][i]]), state.strategy)
                reason = stop.check(rows, problem.num_params, num_members, condition, state.params.dtype,
                                    _diagonal(state.strategy))
                if reason is not None:
                    stop_reason, num_generations, stopped_at = reason, gen, i
                    break
        if done and made != i + 1:
            raise AssertionError("internal: the block program and the host loop disagree on where the run ends")
        if stopped_at is not None and stopped_at + 1 < made:
            made, after, new_best, _ = compiled(*start, np.int32(stopped_at + 1), np.int32(stopped_at + 1), threshold)
        state, best = after, new_best
        if done:
            break
        problem._block_call_seconds = (time.perf_counter() - t_block) / max(1, made)
        size = min(capacity, 2 * size, _block_size(problem._block_call_seconds))
    best_value, best_state, best_member = best
    return (state, float(best_value), best_state, int(best_member), evaluations, stop_reason, compile_time)


@dataclasses.dataclass(frozen=True)
class _HostPrograms:
    """Everything the compiled sampling and update of a host-evaluated run depend on, hashable: ``jax.jit``'s
    cache, keyed on it as a static argument, shares the programs between equal runs (restarts, seeds, other
    functions of the same dimension), where a problem object per run would trace and compile them anew."""

    strategy: Any
    config: ESConfig
    optimizer: Any
    num_params: int
    dtype: str
    minimize: bool

    def problem(self) -> FunctionProblem:
        """The problem whose methods the programs trace (built while tracing them: its constants are concrete)."""
        with jax.ensure_compile_time_eval():
            return FunctionProblem(None, np.zeros(self.num_params, self.dtype), self.strategy, self.config,
                                   optimizer=self.optimizer, minimize=self.minimize, devices=1)


@functools.partial(jax.jit, static_argnums=0)
def _host_init(programs: _HostPrograms, run_key: jax.Array, mean: jax.Array) -> TrainState:
    return programs.problem().fresh_state(run_key, mean)


@functools.partial(jax.jit, static_argnums=0)
def _host_ask(programs: _HostPrograms, state: TrainState) -> jax.Array:
    return programs.problem().population(state)


@functools.partial(jax.jit, static_argnums=0)
def _host_tell(programs: _HostPrograms, state: TrainState, fitness: jax.Array) -> tuple[TrainState, dict]:
    problem = programs.problem()
    dtype = jnp.float64 if fitness.dtype == jnp.float64 else jnp.float32
    new_state, metrics = problem.apply_fitness(state, fitness.astype(dtype) * problem.sign)
    info = {k: metrics[k] for k in ("pop_max", "pop_min", "pop_mean", "noise_std", "bad_member", "bad_update")}
    source = _condition_source(new_state.strategy)
    if source is not None:
        info["cond_max"], info["cond_min"] = jnp.max(source), jnp.min(source)
    return new_state, info


class HostFunctionProblem(FunctionProblem):
    """A :class:`FunctionProblem` whose function runs on the host (``jes.optimize(..., host=True)``): no function
    is traced; :func:`run_optimization` alternates the compiled sampling, the host calls and the compiled update.

    Args:
        host_fn: maps one NumPy point shaped like ``x0`` to a scalar (a Python or NumPy number).
        x0, strategy, config, optimizer, minimize, bounds: as for :class:`FunctionProblem`.
    """

    def __init__(self, host_fn: Callable, x0: Any, strategy: Any, config: ESConfig, optimizer: Any = None,
                 minimize: bool = False, bounds: Any = None):
        if not callable(host_fn):
            raise TypeError(f"host_fn must be callable, got {type(host_fn).__name__}")
        super().__init__(None, x0, strategy, config, optimizer=optimizer, minimize=minimize, devices=1, bounds=bounds)
        self.host_fn = host_fn
        # num_generations is the host loop's, no program's: runs of any length share the programs
        self.programs = _HostPrograms(self.strategy, dataclasses.replace(config, num_generations=1), optimizer,
                                      self.num_params, str(self.x0.dtype), minimize)
        try:
            hash(self.programs)
        except TypeError as e:
            raise TypeError(f"host=True needs hashable settings (its compiled programs are shared by equal runs): "
                            f"{e}") from None
        leaves, self._treedef = jax.tree.flatten(jax.eval_shape(self.unravel, self.x0))
        self._shapes = [leaf.shape for leaf in leaves]
        self._ends = np.cumsum([leaf.size for leaf in leaves])[:-1]
        self._host_x0 = np.asarray(self.x0)

    def init_state(self, key: Any = 0) -> TrainState:
        return _host_init(self.programs, as_key(key), self.x0)

    def point(self, flat: np.ndarray) -> Any:
        """A flat NumPy vector as ``x0``'s structure, NumPy leaves (no device round trip): a writable copy, so a
        function that repairs its point in place (as pycma's points allow) changes neither the member nor the mean."""
        parts = np.split(np.array(flat, copy=True), self._ends)
        return jax.tree.unflatten(self._treedef, [part.reshape(shape) for part, shape in zip(parts, self._shapes)])

    def host_in_box(self, flat: np.ndarray) -> np.ndarray:
        """Flat points of the search (``[..., P]``) mapped :meth:`in_box`, as NumPy (the same array without bounds)."""
        return flat if self.box is None else np.asarray(_into_box(flat, self._box_arguments))

    def call(self, flat: np.ndarray) -> float:
        """The host function at one flat point (already :meth:`host_in_box`), as a float."""
        return float(_check_fitness(self.host_fn(self.point(flat)), np.asarray))

    def fitness_for_update(self, values: np.ndarray) -> tuple[np.ndarray, bool]:
        """``values`` (float64) as the update takes them, and whether they were shifted: float64 in x64 mode;
        else as :func:`float32_for_update` makes them."""
        if self.x0.dtype == jnp.float64:
            return values, False
        return float32_for_update(values)


def float32_for_update(values: np.ndarray) -> tuple[np.ndarray, bool]:
    """Finite float64 ``values`` as float32 for an update, and whether they were shifted: as they are where float32
    holds them exactly, else shifted by their median first (every strategy here uses fitness through ranks or
    differences, which the shift keeps, and ARS its spread). :func:`optimize`'s host loop and
    :meth:`AskTell.tell` both, so the two give the same bits for the same values."""
    with np.errstate(over="ignore"):  # (a value beyond float32 is not equal to its cast: shifted below)
        narrow = values.astype(np.float32)
    if np.array_equal(narrow, values):
        return narrow, False
    shifted = values - np.median(values)
    top = float(np.finfo(np.float32).max)
    if np.any(np.abs(shifted) > top):  # a large finite penalty (1e100): beyond float32 even after the shift
        warnings.warn(f"fitness values beyond float32's range ({top:.3g}) after the shift by their median (e.g. "
                      f"{float(values[np.argmax(np.abs(shifted))]):.3g}) are taken as +-{top:.3g}: members beyond "
                      f"it rank as equals; turn on JAX's x64 mode (jax.config.update('jax_enable_x64', True)) and give "
                      f"a float64 x0 to keep float64 values, or return penalties within float32's range",
                      stacklevel=3)
        shifted = np.clip(shifted, -top, top)
    return shifted.astype(np.float32), True


def _run_on_host(problem: HostFunctionProblem, key: Any, num_generations: int, stop_reason: str,
                 target: float | None, callbacks: Sequence[Callable[[dict], Any]],
                 stop: StopCriteria | None) -> OptimizeResult:
    """:func:`run_optimization` for a host function: per generation the compiled sampling, ``num_members`` host
    calls in member order, the compiled update, one host call at the new mean; then the same record, target,
    best and stop bookkeeping as the compiled loops (best: the members before the mean they lead to)."""
    t_start = time.perf_counter()
    programs, sign, num_members = problem.programs, problem.sign, problem.config.num_members
    compile_time = 0.0

    def timed(fn, *args):
        nonlocal compile_time
        before, t0 = fn._cache_size(), time.perf_counter()
        out = jax.block_until_ready(fn(programs, *args))
        if fn._cache_size() > before:  # this call traced and compiled (once per process for equal runs)
            compile_time += time.perf_counter() - t0
        return out

    state = timed(_host_init, as_key(key), problem.x0)
    history = {k: [] for k in ("generation", "mean_value", "best_value", "pop_mean", "noise_std", "evaluations")}
    rows, evaluations, gen = [], 0, 0
    best_value, best_flat = -np.inf, problem._host_x0
    value = float("nan")  # f at the final mean: NaN when no generation ran (nothing was evaluated)
    def result(state, stop_reason, calls=0):  # calls: of a generation that failed (counted, not in the history)
        return OptimizeResult(
            direction="minimize" if problem.minimize else "maximize", x=problem.params_tree(state.params),
            value=value, best_x=problem.params_tree(jnp.asarray(best_flat)), best_value=sign * best_value,
            history={k: np.asarray(v) for k, v in history.items()}, num_evaluations=evaluations + calls,
            strategy=problem.strategy.name, wall_time=time.perf_counter() - t_start, compile_time=compile_time,
            state=state, problem=problem, stop_reason=stop_reason)

    from jes.loop import call_callbacks  # (lazily: the training loop's module, whose callbacks these are)

    # A callback's StopTraining ends the run there; any other exception (the function raised, a callback's error,
    # Ctrl-C) carries the run so far (error.result): hours of a slow simulator's calls are never lost with it.
    before, in_flight, warned = state, 0, set()  # the generation's state before its update, its calls not counted
    try:
        while gen < num_generations:
            members = np.asarray(timed(_host_ask, state))
            values = np.empty(num_members, np.float64)
            before = state
            for i, x in enumerate(problem.host_in_box(members)):  # the best is kept as a point of the search
                in_flight = i + 1
                values[i] = problem.call(x)
                if not math.isfinite(values[i]):  # no call after it: an external counter sees error.result's count
                    _check_finite(dict(bad_member=i, bad_update=False), gen,
                                  lambda: result(before, "non_finite", calls=i + 1))
            fitness, shifted = problem.fitness_for_update(values)
            state, info = timed(_host_tell, state, fitness)
            info = {k: v.item() for k, v in jax.device_get(info).items()}
            _check_finite(info, gen, lambda: result(before, "non_finite", calls=num_members))
            mean = np.asarray(state.params)
            in_flight = num_members + 1
            mean_value = problem.call(problem.host_in_box(mean))
            if not math.isfinite(mean_value):  # before the best is updated: the result is the run of gen generations
                _check_finite(dict(bad_member=-1, bad_update=False, bad_mean=True), gen,
                              lambda: result(before, "non_finite", calls=num_members + 1))
            signed = sign * values
            if shifted:  # the update's statistics of the shifted values: the float64 ones instead
                info.update(pop_max=float(signed.max()), pop_min=float(signed.min()), pop_mean=float(signed.mean()))
            if info["pop_max"] > best_value:
                best_value, best_flat = info["pop_max"], members[int(np.argmax(signed))]
            value = mean_value
            evaluations += num_members + 1
            gen += 1
            in_flight = 0
            if sign * value > best_value:
                best_value, best_flat = sign * value, mean
            own = _own_statistics(info["pop_max"], info["pop_min"], info["pop_mean"], sign)
            record = dict(generation=gen, mean_value=value, best_value=own["best_value"], pop_mean=own["pop_mean"],
                          noise_std=info["noise_std"], evaluations=evaluations)
            for k in history:
                history[k].append(record[k])
            stopped, error = call_callbacks(callbacks, record, warned)
            if error is not None:
                raise error  # (with the run so far, below)
            if stopped is not None:  # a callback's StopTraining: the run ends after this generation
                stop_reason = "stopped"
                break
            if target is not None and (value <= target if problem.minimize else value >= target):
                stop_reason = "target"
                break
            if stop is not None:
                rows.append((info["pop_max"], info["pop_min"], info["pop_mean"], info["noise_std"]))
                condition = None
                if "cond_max" in info:
                    condition = _condition(np.array([info["cond_max"], info["cond_min"]]), state.strategy)
                reason = stop.check(rows, problem.num_params, num_members, condition, state.params.dtype,
                                    _diagonal(state.strategy))
                if reason is not None:
                    stop_reason = reason
                    break
    except BaseException as err:
        _carry_result(err, lambda: result(state if in_flight == 0 else before, "error", calls=in_flight),
                      "the function raised" if in_flight else "the run stopped")
        raise
    return result(state, stop_reason)


def _ask_tell_from_arguments(cls: type, arguments: dict, dtype: str | None = None) -> "AskTell":
    """Unpickle an :class:`AskTell` to search in the float dtype it searched in (``dtype``; ``None``: pickled before
    jes recorded it): a float32 search of a float64 ``x0`` (x64 mode off where it was pickled) stays float32 in x64
    mode; a float64 search is refused where x64 mode is off, since it would go on in float32 (its pickled states'
    float64 arrays are cut to float32 as they load), not as it was."""
    if dtype == "float32" and jax.config.jax_enable_x64:
        narrow = lambda x: x.astype(np.float32) if isinstance(x, (np.ndarray, np.floating)) and x.dtype == np.float64 else x  # noqa: E731
        arguments = dict(arguments, x0=jax.tree.map(narrow, arguments["x0"]))
    if dtype == "float64" and not jax.config.jax_enable_x64:
        raise RuntimeError(
            "this AskTell searched in float64 (JAX's x64 mode was on where it was pickled), but x64 mode is off here: "
            "it would go on in float32, and its states' float64 arrays would load as float32. Call "
            "jax.config.update('jax_enable_x64', True) (or set JAX_ENABLE_X64=1) before unpickling it and its states")
    return cls(**arguments)


@jax.tree_util.register_static
class AskTell:
    """A strategy driven by your own evaluation loop: pure, jittable ``init``, ``ask`` and ``tell``.

    Example:
        >>> es = jes.AskTell("snes", x0=jnp.zeros(5), num_members=16, minimize=True)
        >>> state = es.init(jax.random.key(0))
        >>> for _ in range(100):
        ...     xs = es.ask(state)                       # pytree, leading axis num_members
        ...     state, info = es.tell(state, my_loss(xs))  # your evaluation, anywhere
        >>> es.mean(state)

    ``ask`` and ``tell`` are pure and jittable, so a JAX ``my_loss`` can run whole blocks of generations in the
    user's own compiled loop (traced once)::

        @jax.jit
        def generations(state):
            def body(state, _):
                state, info = es.tell(state, jax.vmap(my_loss)(es.ask(state)))
                return state, info["best_value"]  # the generation's smallest loss
            return jax.lax.scan(body, state, None, length=100)

    Member ``i`` of generation ``g`` is a pure function of ``(key, g, i)`` and ``tell`` reduces
    statistics in the same chunk order as :func:`optimize`, so with the same settings the two
    give bit-identical means.

    Args:
        strategy: name or strategy object.
        x0: initial mean (array, pytree, or a list / tuple of numbers: one vector), as in :func:`optimize`.
        num_members: population (``None``: the strategy's default).
        minimize: the fitness you pass to ``tell`` is to be minimised (default: maximised); ``tell``'s
            ``info`` stays in its own units either way.
        noise_std, optimizer, learning_rate, fitness_shaping, weight_decay, chunk_size: as in :func:`optimize`.
        bounds: ``(lower, upper)``, as in :func:`optimize`: ``ask``'s members and ``mean`` are in the box (the
            search's own points, in ``state``, are unbounded: ``state.params`` is not ``mean(state)``).
    """

    def __init__(self, strategy: Any, x0: Any, num_members: int | None = None, *, minimize: bool = False,
                 noise_std: Any = None, optimizer: Any = None, learning_rate: Any = None,
                 fitness_shaping: str = "centered_ranks", weight_decay: float = 0.0, chunk_size: int | None = None,
                 bounds: Any = None):
        # What pickling rebuilds it from (its compiled pieces and x0's unravel closures do not pickle); x0's and the
        # bounds' host arrays copied, so a caller changing theirs in place later does not change what is pickled.
        self._arguments = dict(strategy=strategy, x0=copy.deepcopy(x0), num_members=num_members, minimize=minimize,
                               noise_std=noise_std, optimizer=optimizer, learning_rate=learning_rate,
                               fitness_shaping=fitness_shaping, weight_decay=weight_decay, chunk_size=chunk_size,
                               bounds=copy.deepcopy(bounds))
        strategy = get_strategy(strategy)
        noise_std = _noise_std(strategy, noise_std)
        flat, _ = _flatten_x0(x0)
        _warn_if_float64_lost(x0)
        _warn_if_integer_leaves(x0)
        num_members = _default_members(strategy, int(flat.shape[0])) if num_members is None else num_members
        config = _config(num_members, 1, noise_std, learning_rate, fitness_shaping, weight_decay, chunk_size, strategy)
        self.problem = FunctionProblem(None, x0, strategy, config, optimizer=optimizer, minimize=minimize, devices=1,
                                       bounds=bounds)
        self.num_members = num_members
        self.minimize = minimize
        self.direction = "minimize" if minimize else "maximize"

    def __reduce__(self):
        """Pickles as its constructor's arguments (a strategy name or object, x0, ...; an optax object given as
        ``optimizer`` and a schedule given as ``learning_rate`` or ``noise_std`` do not pickle: closures): rebuilt,
        it asks and tells the same bits. Its states pickle on their own."""
        for name in ("optimizer", "learning_rate", "noise_std"):
            value = self._arguments[name]
            if value is None or isinstance(value, (str, int, float)):
                continue
            try:
                pickle.dumps(value)
            except Exception as err:  # pickle's own "Can't pickle local object 'chain.<locals>.init_fn'" names no
                raise TypeError(f"this AskTell cannot be pickled: its {name} ({type(value).__name__}) does not pickle "
                                f"(an optax object or schedule is a closure); make it with the optimizer's name and "
                                f"a number to pickle it") from err  # argument
        return _ask_tell_from_arguments, (type(self), self._arguments, str(self.problem.x0.dtype))

    def __copy__(self) -> "AskTell":
        """A new AskTell sharing this one's parts (pickling's rebuild is not needed to copy, nor always possible)."""
        copied = object.__new__(type(self))
        copied.__dict__.update(self.__dict__)
        return copied

    def __deepcopy__(self, memo: dict) -> "AskTell":
        return self.__copy__()  # nothing in it changes after construction

    def init(self, key: Any) -> TrainState:
        """Initial state (holds the strategy state, the key and the generation)."""
        return self.problem.init_state(key)

    def ask(self, state: TrainState) -> Any:
        """The generation's members as a pytree shaped like ``x0`` with a leading ``[num_members]`` axis (in the
        bounds, where there are)."""
        self._check_state(state, "ask(state)")
        return self._ask(state)

    @jax.jit
    def _ask(self, state: TrainState) -> Any:
        return jax.vmap(self.problem.unravel)(self.problem.in_box(self.problem.population(state)))

    def _check_state(self, state: Any, call: str) -> None:
        """Refuse what is not a state of this AskTell (another's: another strategy, dimension or dtype), naming the
        difference, where it failed deep inside (a broadcast of shapes, a missing attribute of a strategy state)."""
        if not isinstance(state, TrainState):
            got = (f"an array shaped {tuple(state.shape)}" if hasattr(state, "shape") and hasattr(state, "dtype")
                   else _named(state))
            raise TypeError(f"{call} takes the state from init() or the last tell(), got {got}")
        expected = self.__dict__.get("_state_shapes")
        if expected is None:  # (once: the shapes of a state of init)
            expected = self.__dict__["_state_shapes"] = jax.eval_shape(lambda: self.init(0))
        mine, theirs = jax.tree.structure(expected), jax.tree.structure(state)
        what = None
        if mine != theirs:
            kinds = [type(s.strategy).__name__ for s in (state, expected)]
            what = (f"its strategy state is a {kinds[0]}, this AskTell's a {kinds[1]}" if len(kinds) == 2
                    and kinds[0] != kinds[1] else "its fields differ from this AskTell's states'")
        else:
            for path, want, have in zip(jax.tree_util.tree_leaves_with_path(expected), jax.tree.leaves(expected),
                                        jax.tree.leaves(state)):
                shape, dtype = tuple(getattr(have, "shape", ())), getattr(have, "dtype", None)
                if shape != tuple(want.shape) or (dtype is not None and dtype != want.dtype):
                    what = (f"its {jax.tree_util.keystr(path[0])} is {dtype}{list(shape)}, this AskTell's "
                            f"{want.dtype}{list(want.shape)}")
                    break
        if what is not None:
            raise ValueError(f"{call}: this state is not one of this AskTell's ({self.problem.strategy.name}, "
                             f"{self.problem.num_params} parameters): {what}. A state continues only in an AskTell "
                             f"made as the one whose init() or tell() gave it (the same strategy, x0 and options)")

    def tell(self, state: TrainState, fitness: Any) -> tuple[TrainState, dict]:
        """The next state from the members' fitness ``[num_members]`` (minimised if ``minimize``); jittable.

        ``info`` is a dict of scalars. Its fitness statistics are in your fitness's own units whichever way it
        is optimised, as :func:`optimize`'s history is: ``pop_min`` and ``pop_max`` (the smallest and the
        largest value: with ``minimize``, ``pop_min`` is the best loss), ``pop_mean``, ``pop_std``,
        ``best_value`` (the best member's value: ``pop_min`` when minimising, else ``pop_max``) and
        ``best_member`` (its index). The others describe the search and its update (``noise_std``,
        ``learning_rate``, ``grad_norm``, ``update_norm``, ``param_norm``, ...).

        ``fitness`` is checked as :func:`optimize` checks a function's values: real numbers (integer or float; not
        bool or complex), exactly ``[num_members]`` of them.

        A non-finite fitness (or an update that is not finite: a step size or covariance that overflowed) makes
        no update. Called with concrete values (a host loop), ``tell`` then raises :class:`NonFiniteValueError`, as
        :func:`optimize` stops, with the ``generation`` (1-based) and ``member`` (-1: the update); the state you
        hold is the last good one. Traced (inside your ``jax.jit`` / ``lax.scan``) it cannot raise: the state
        comes back unchanged, ``info["bad_member"] >= 0`` (or ``info["bad_update"]``) says so, and ``ask`` would
        give the same members again; check ``info`` there. A point where your function is undefined or infeasible
        can get a large finite penalty instead, which is ranked last.

        Cost: called with concrete values, ``tell`` waits once for the device, after its update, to read
        ``info["bad_member"]`` and ``info["bad_update"]``. A host loop therefore cannot dispatch the next ``ask``
        before this generation's update is done. On a small problem that is most of the time of a loop
        iteration (on a 2-core CPU, ``cma_es`` with d=10 and 16 members: about 0.3 ms per ``ask``/``tell``
        instead of 0.15 ms without the wait). To avoid it, run your loop inside ``jax.jit`` / ``lax.scan``
        and check ``info`` yourself.

        Float64 fitness is ranked in float64 (a list or tuple of numbers is taken as a float64 NumPy array): in a
        float64 search (JAX's x64 mode and a float64 ``x0``) as it is; in a float32 one, a float64 NumPy array that
        float32 cannot hold exactly
        is shifted by its median on the host before it becomes float32, which keeps its order (every
        strategy here depends on fitness through ranks or differences, ARS also its spread), as
        :func:`optimize`'s host loop takes them (the same bits), and ``info``'s ``pop_min``,
        ``pop_max``, ``pop_mean``, ``best_value`` and ``best_member`` are made on the host from the values you
        passed, as NumPy float64 (int32) scalars: ``best_value - 1e9`` of a function offset by 1e9 keeps its
        digits. The others (``pop_std``, ...) are the shifted float32 values'.

        ``state`` comes first, from :meth:`init` or the last ``tell``: pycma's ``es.tell(X, f)`` has no equivalent,
        as jes regenerates the members from the state's key and generation and cannot be told other points.
        """
        if not isinstance(state, TrainState):
            got = (f"an array shaped {tuple(state.shape)}" if hasattr(state, "shape") and hasattr(state, "dtype")
                   else _named(state))
            raise TypeError(f"tell(state, fitness) takes the state from init() or the last tell() first, got "
                            f"{got}; unlike pycma's es.tell(X, f) it takes no points: jes regenerates "
                            f"the members asked from the state, so pass tell(state, fitness) with fitness in ask's "
                            f"order")
        self._check_state(state, "tell(state, fitness)")
        if isinstance(fitness, (list, tuple)):  # pycma's tell(X, [f(x) for x in X]): Python floats are float64,
            fitness = np.asarray(fitness, np.float64)  # ranked as a float64 array is (float32 tied them at 1e9)
        values = _check_fitness(fitness, jnp.asarray if isinstance(fitness, jax.Array) else np.asarray,
                                self.num_members)
        traced = isinstance(values, jax.core.Tracer) or isinstance(state.generation, jax.core.Tracer)
        new_state, info = self._tell_checked(state, fitness)
        if traced:
            return new_state, info
        # one wait for the device, after the update (the fitness is not read on its own)
        bad_member, bad_update = (int(x) for x in jax.device_get((info["bad_member"], info["bad_update"])))
        if bad_member >= 0:
            generation = int(state.generation) + 1
            host = np.asarray(values)  # only here, raising: a device fitness is read once more
            bad = np.flatnonzero(~np.isfinite(host))
            what = (f"{bad.size} of {self.num_members} fitness values are not finite (member {bad_member}: "
                    f"{host[bad_member]})" if bad.size else
                    f"member {bad_member}'s fitness {host[bad_member]} is not finite as float32 (JAX's x64 mode is off)")
            raise NonFiniteValueError(
                f"AskTell.tell, generation {generation}: {what}; a non-finite value cannot be ranked, so no update "
                f"was made (jes.optimize stops the same way), and asking again would give the same members. Return "
                f"a large finite penalty where your function is undefined or infeasible (it is ranked last)",
                generation, bad_member)
        if bad_update:
            generation = int(state.generation) + 1
            raise NonFiniteValueError(
                f"AskTell.tell, generation {generation}: the strategy's update is not finite (its step size or "
                f"covariance overflowed), so no update was made (jes.optimize stops the same way)", generation, -1)
        return new_state, info

    def _tell_checked(self, state: TrainState, fitness: Any) -> tuple[TrainState, dict]:
        if (self.problem.x0.dtype != jnp.float64 and isinstance(fitness, np.ndarray) and fitness.dtype == np.float64
                and np.isfinite(fitness).all()):  # (a float32 search, x64 mode or not: as jes.optimize's host loop)
            narrow, _ = float32_for_update(fitness)  # as jes.optimize's host loop takes them: the same bits
            state, info = self._tell(state, narrow)
            # info's statistics were of the shifted float32 values: shifted back in float32, an offset of 1e9
            # swallowed what the ranking resolved (best_value - 1e9 read 0.0 for 4.9e-5). Made here instead, in
            # float64, from the values given (the best member too: float32 may have tied it with another)
            signed = self.problem.sign * fitness
            best_member = int(np.argmax(signed))
            own = _own_statistics(np.float64(signed[best_member]), np.float64(signed.min()),
                                  np.float64(signed.mean()), self.problem.sign)
            return state, dict(info, **own, best_member=np.int32(best_member))
        return self._tell(state, fitness)

    @jax.jit
    def _tell(self, state: TrainState, fitness: jax.Array) -> tuple[TrainState, dict]:
        fitness = jnp.asarray(fitness)
        dtype = jnp.float64 if fitness.dtype == jnp.float64 else jnp.float32
        fitness = fitness.astype(dtype).reshape(self.num_members) * self.problem.sign
        new_state, info = self.problem.apply_fitness(state, fitness)
        own = _own_statistics(info["pop_max"], info["pop_min"], info["pop_mean"], self.problem.sign)
        return new_state, dict(info, **own)

    def mean(self, state: TrainState) -> Any:
        """The current mean, shaped like ``x0`` (mapped into the bounds, where there are)."""
        return self.problem.params_tree(state.params)


class NonFiniteValueError(FloatingPointError):
    """A member's value, the strategy's update or the value at the updated mean was NaN or infinite: :func:`optimize`
    stopped before using it (a NaN mean can never meet a target).

    Attributes:
        generation: the generation it happened in (1-based, as in the history; with ``restarts``, numbered on
            across the runs, as the combined history is; from :meth:`AskTell.tell`, the state's generation + 1).
        member: the first member with a non-finite value (-1: the members' values were finite, the update or the
            value at the updated mean was not; the message says which).
        result: the :class:`OptimizeResult` up to the last good generation (with ``restarts``, every run so far),
            ``stop_reason`` ``"non_finite"``; the same bits as a run of that many generations, except
            ``num_evaluations``, which counts every evaluation made: the failing generation's too (``host=True``:
            its calls up to and including the non-finite one, and nothing is called after it; a JAX function:
            its whole population, evaluated at once, and the mean's evaluation where that was the one).
            ``None`` from :meth:`AskTell.tell` (the state you passed it is the last good one). Pickles (without
            the result's ``problem``, see :class:`OptimizeResult`).
    """

    def __init__(self, message: str, generation: int, member: int, result: "OptimizeResult | None" = None):
        super().__init__(message)
        self.generation, self.member, self.result = generation, member, result

    def __reduce__(self):  # copy / pickle (multiprocessing, joblib) with the attributes
        return type(self), (self.args[0], self.generation, self.member, self.result)


def _check_finite(metrics: dict, generation: int, partial: Callable[[], "OptimizeResult"]) -> None:
    """Raise :class:`NonFiniteValueError` for a generation (0-based ``generation``) whose fitness or update was not
    finite, with ``partial()``, the run's result up to the generation before, as its ``result``."""
    if metrics["bad_member"] >= 0 or metrics["bad_update"] or metrics.get("bad_mean", False):
        if metrics["bad_member"] >= 0:
            what = f"member {metrics['bad_member']} has a non-finite value; the update was not applied"
        elif metrics["bad_update"]:
            what = "the strategy's update is not finite; the update was not applied"
        else:
            what = "the value at the updated mean is not finite"
        sigma = metrics.get("noise_std")
        known = sigma is not None and math.isfinite(float(sigma))  # a bad generation's own info may be NaN
        result = partial()
        raise NonFiniteValueError(
            f"generation {generation + 1}: {what}, and the run stopped (its result up to generation {generation} is "
            f"error.result) after {result.num_evaluations} evaluations, this generation's included. Check fitness_fn "
            f"for NaN/inf in the region searched" + (f" (sigma {float(sigma):.3g} there)" if known else "")
            + "; an infeasible point can return a large finite penalty instead." + _maximised_a_loss(result),
            generation + 1, int(metrics["bad_member"]), result)


def _maximised_a_loss(result: "OptimizeResult") -> str:
    """A hint for a run that maximised and diverged upwards (f at the mean grew a thousandfold and more before
    the non-finite value): most likely a loss given without ``minimize=True`` (jes maximises by default,
    pycma minimises)."""
    values = np.asarray(result.history["mean_value"], np.float64)
    if result.direction != "maximize" or values.size < 2 or not values[-1] > 1e3 * max(1.0, abs(values[0])):
        return ""
    return (f" The run was maximising fitness_fn (jes's default) and f at the mean grew from {values[0]:.3g} to "
            f"{values[-1]:.3g}: if it is a loss, pass minimize=True.")
