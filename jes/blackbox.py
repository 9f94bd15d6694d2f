"""Evolution strategies for any function: ``jes.optimize`` and the pure ``AskTell`` interface.

Both reuse the chunked, sharded, compiled generation of :mod:`jes.generation`: member
``i`` of generation ``g`` is regenerated from ``(key, g, i)``, and the strategy's
statistics are reduced in chunk order, so results are bit-identical over devices.

Direction: jes *maximises* fitness. ``minimize=True`` negates your function inside and
reports values in your function's own units; every result says which way it went.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from jes.config import ESConfig
from jes.generation import ChunkResults, Generation, TrainState, as_key
from jes.strategies import get as get_strategy


def _flatten_x0(x0: Any) -> tuple[jax.Array, Callable]:
    flat, unravel = ravel_pytree(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), x0))
    if flat.ndim != 1 or flat.shape[0] == 0:
        raise ValueError("x0 must be a non-empty array or pytree of arrays (the initial mean)")
    if not bool(jnp.isfinite(flat).all()):
        raise ValueError("x0 holds NaN or inf; give a finite starting point")
    return flat, unravel


class FunctionProblem(Generation):
    """The compiled generation for maximising ``sign * fitness_fn(params)`` (``fitness_fn`` may be ``None`` for ask/tell).

    Args:
        fitness_fn: maps one parameter pytree shaped like ``x0`` to a scalar; vmapped over members.
        x0: initial mean (array or pytree).
        strategy: name or strategy object.
        config: population, sigma, learning rate, shaping, chunk size (RL fields are ignored).
        optimizer: for strategies that use one.
        minimize: minimise ``fitness_fn`` instead of maximising it.
    """

    def __init__(self, fitness_fn: Callable | None, x0: Any, strategy: Any, config: ESConfig, optimizer: Any = None,
                 minimize: bool = False, devices: Any = None):
        if not isinstance(minimize, bool):
            raise TypeError(f"minimize must be True or False, got {minimize!r}")
        self.fitness_fn = fitness_fn
        self.minimize = minimize
        self.sign = -1.0 if minimize else 1.0
        self.x0, self.unravel = _flatten_x0(x0)
        self.num_params = int(self.x0.shape[0])
        self.config = config
        strategy = get_strategy(strategy).for_functions()
        if optimizer is None and strategy.uses_optimizer:
            optimizer = strategy.blackbox_optimizer or strategy.default_optimizer
        self._setup(strategy, optimizer, devices)
        self.normalize_observations = False

    def initial_mean(self, init_key):
        return self.x0

    def objective(self, flat: jax.Array) -> jax.Array:
        """The user's function at one flat parameter vector, as a float32 scalar."""
        value = jnp.asarray(self.fitness_fn(self.unravel(flat)))
        if value.shape != ():
            raise ValueError(f"fitness_fn must return a scalar, got shape {value.shape}")
        return value.astype(jnp.float32)

    def evaluate_members(self, state, flat, members, gen_key, active):
        fitness = self.sign * jax.vmap(self.objective)(flat)
        zeros = jnp.zeros((), jnp.float32)
        return ChunkResults(fitness=jnp.where(active, fitness, 0.0), env_steps=active.sum().astype(jnp.int32),
                            obs_sum=zeros, obs_sumsq=zeros)

    def centre_score(self, state):
        return self.sign * self.objective(state.params), jnp.int32(1)

    def population(self, state: TrainState) -> jax.Array:
        """Flat parameters of every member of the state's generation, ``[num_members, P]``."""
        flat, _, _ = jax.lax.map(lambda c: self.sample_chunk(state, c), jnp.arange(self.num_chunks, dtype=jnp.int32))
        return flat.reshape(-1, self.num_params)[: self.config.num_members]


def _config(num_members: int, num_generations: int, noise_std: Any, learning_rate: Any, fitness_shaping: str,
            weight_decay: float, chunk_size: int | None, strategy) -> ESConfig:
    return ESConfig(num_members=num_members, num_generations=num_generations, noise_std=noise_std,
                    learning_rate=learning_rate, fitness_shaping=fitness_shaping, weight_decay=weight_decay,
                    antithetic=strategy.antithetic(True), chunk_size=chunk_size, normalize_observations=False,
                    eval_every=1)


def _default_members(strategy, num_params: int) -> int:
    n = strategy.default_population(num_params)
    return n + n % 2 if strategy.antithetic(True) else n


@dataclasses.dataclass
class OptimizeResult:
    """What :func:`optimize` returns. Values are in the units of *your* function.

    Attributes:
        direction: ``"minimize"`` or ``"maximize"``: which way ``fitness_fn`` was optimised.
        x: the final mean, shaped like ``x0``.
        value: ``fitness_fn(x)``.
        best_x, best_value: the best member ever evaluated (regenerated from its key) or the
            mean, whichever was better.
        history: per generation: ``generation``, ``mean_value`` (f at the mean after the update),
            ``best_value`` (best member of the generation), ``pop_mean``, ``noise_std``,
            ``evaluations`` (cumulative).
        num_evaluations: function evaluations, the population's and the mean's.
        strategy: the strategy's name. state: final state (continue with ``AskTell`` or the problem).
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

    def summary(self) -> str:
        return (f"{self.strategy} {self.direction}d f: f(mean) = {self.value:.6g}, best f = {self.best_value:.6g} "
                f"after {len(self.history['generation'])} generations, {self.num_evaluations} evaluations "
                f"({self.wall_time:.1f}s, {self.compile_time:.1f}s compile)")


def optimize(
    fitness_fn: Callable[[Any], Any],
    x0: Any,
    strategy: Any = "openai_es",
    *,
    minimize: bool = False,
    num_members: int | None = None,
    num_generations: int = 100,
    key: Any = 0,
    noise_std: Any = 0.2,
    optimizer: Any = None,
    learning_rate: Any = None,
    fitness_shaping: str = "centered_ranks",
    weight_decay: float = 0.0,
    chunk_size: int | None = None,
    target: float | None = None,
    devices: Any = None,
    callbacks: Sequence[Callable[[dict], Any]] = (),
) -> OptimizeResult:
    """Optimise ``fitness_fn`` with an evolution strategy, one compiled program per generation.

    Example:
        >>> r = jes.optimize(lambda x: jnp.sum(x ** 2), 3 * jnp.ones(10), "sep_cma_es", minimize=True)
        >>> r.direction, r.value        # ('minimize', 1e-9...)

    Args:
        fitness_fn: maps a parameter pytree shaped like ``x0`` (or a flat vector) to a scalar;
            jittable (it is vmapped over members).
        x0: initial mean.
        strategy: ``jes.strategies.names()`` or a strategy object.
        minimize: minimise instead of maximise (the default). Reported values are ``fitness_fn``'s own.
        num_members: population (``None``: the strategy's default for this dimension, e.g.
            ``4 + 3 ln d`` for snes/sep_cma_es, 64 for openai_es/ars).
        num_generations: generations to run.
        key: int seed or ``jax.random`` key.
        noise_std: initial sigma (openai_es/ars: fixed sigma; openai_es also takes a schedule).
        optimizer, learning_rate: the mean's optimizer for openai_es/pgpe (``None``: the strategy's default).
        fitness_shaping: for openai_es/pgpe.
        chunk_size: members per compiled chunk (part of the run's identity).
        target: stop once f(mean) reaches this value (below it when minimising, above when maximising).
        devices: local devices to shard the population over.
        callbacks: called with each generation's record.

    Returns:
        An :class:`OptimizeResult`.
    """
    strategy = get_strategy(strategy)
    flat, _ = _flatten_x0(x0)
    if num_members is None:
        num_members = _default_members(strategy, int(flat.shape[0]))
    config = _config(num_members, num_generations, noise_std, learning_rate, fitness_shaping, weight_decay,
                     chunk_size, strategy)
    problem = FunctionProblem(fitness_fn, x0, strategy, config, optimizer=optimizer, minimize=minimize, devices=devices)
    return run_optimization(problem, key, num_generations, target=target, callbacks=callbacks)


def run_optimization(problem: FunctionProblem, key: Any = 0, num_generations: int | None = None, *,
                     target: float | None = None, callbacks: Sequence[Callable[[dict], Any]] = ()) -> OptimizeResult:
    """The host loop of :func:`optimize` for a built problem (reuse one problem, and its compiled step, over seeds)."""
    num_generations = problem.config.num_generations if num_generations is None else num_generations
    minimize, num_members = problem.minimize, problem.config.num_members
    state = problem.init_state(key)
    t_start = time.perf_counter()
    compiled, compile_time = problem.compiled_step(state)
    sign = problem.sign
    history = {k: [] for k in ("generation", "mean_value", "best_value", "pop_mean", "noise_std", "evaluations")}
    best_value, best_of = -np.inf, (state, None)  # (state, member): regenerated once, at the end
    evaluations = 0
    flags = {flag: jnp.bool_(flag) for flag in (False, True)}
    gen, ahead, done = 0, 1, False
    single_device = len(problem.devices) == 1
    # Each call also evaluates the centre of the state it is given, which completes the row of the generation
    # before (a last call evaluates only that): `pending` holds the newest row until then, `head` the newest state.
    pending, head = None, state

    def finish(record, after, centre) -> bool:
        nonlocal best_value, best_of
        if centre > best_value:
            best_value, best_of = centre, (after, None)
        record["mean_value"] = sign * centre
        for k in history:
            history[k].append(record[k])
        for callback in callbacks:
            callback(record)
        return target is not None and (record["mean_value"] <= target if minimize else record["mean_value"] >= target)

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
        fetched = jax.device_get([metrics for _, _, metrics in block])
        for (before, after, _), metrics in zip(block, fetched):
            m = {k: v.item() for k, v in metrics.items()}
            if pending is not None:
                (record, state), pending = pending, None
                if finish(record, state, m["centre_return"]):  # the centre of `before`, which is `state`
                    done = True
                    break
            if not population:
                break
            if m["bad_member"] >= 0 or m["bad_update"]:
                what = (f"member {m['bad_member']} has a non-finite value" if m["bad_member"] >= 0
                        else "the strategy's update is not finite")
                raise FloatingPointError(f"generation {gen + 1}: {what}; the update was not applied. Check fitness_fn "
                                         f"for NaN/inf in the region searched (noise_std={problem.config.noise_std}).")
            evaluations += num_members + 1
            if m["pop_max"] > best_value:
                best_value, best_of = m["pop_max"], (before, int(m["best_member"]))
            gen += 1
            pending = (dict(generation=gen, best_value=sign * m["pop_max"], pop_mean=sign * m["pop_mean"],
                            noise_std=m["noise_std"], evaluations=evaluations), after)
        per_generation = (time.perf_counter() - t_block) / len(block)
        ahead = min(2 * ahead, 64) if per_generation < 0.002 and single_device else max(1, ahead // 2)
    best_state, best_member = best_of
    best_flat = np.asarray(best_state.params if best_member is None else problem.member(best_state, jnp.int32(best_member)))
    x = problem.params_tree(state.params)
    return OptimizeResult(
        direction="minimize" if minimize else "maximize",
        x=x, value=float(jax.jit(problem.objective)(state.params)),
        best_x=problem.params_tree(jnp.asarray(best_flat)), best_value=sign * best_value,
        history={k: np.asarray(v) for k, v in history.items()}, num_evaluations=evaluations,
        strategy=problem.strategy.name, wall_time=time.perf_counter() - t_start, compile_time=compile_time,
        state=state, problem=problem,
    )


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

    Member ``i`` of generation ``g`` is a pure function of ``(key, g, i)`` and ``tell`` reduces
    statistics in the same chunk order as :func:`optimize`, so with the same settings the two
    give bit-identical means.

    Args:
        strategy: name or strategy object.
        x0: initial mean (array or pytree).
        num_members: population (``None``: the strategy's default).
        minimize: the fitness you pass to ``tell`` is to be minimised (default: maximised).
        noise_std, optimizer, learning_rate, fitness_shaping, weight_decay, chunk_size: as in :func:`optimize`.
    """

    def __init__(self, strategy: Any, x0: Any, num_members: int | None = None, *, minimize: bool = False,
                 noise_std: Any = 0.2, optimizer: Any = None, learning_rate: Any = None,
                 fitness_shaping: str = "centered_ranks", weight_decay: float = 0.0, chunk_size: int | None = None):
        strategy = get_strategy(strategy)
        flat, _ = _flatten_x0(x0)
        num_members = _default_members(strategy, int(flat.shape[0])) if num_members is None else num_members
        config = _config(num_members, 1, noise_std, learning_rate, fitness_shaping, weight_decay, chunk_size, strategy)
        self.problem = FunctionProblem(None, x0, strategy, config, optimizer=optimizer, minimize=minimize, devices=1)
        self.num_members = num_members
        self.minimize = minimize
        self.direction = "minimize" if minimize else "maximize"

    def init(self, key: Any) -> TrainState:
        """Initial state (holds the strategy state, the key and the generation)."""
        return self.problem.init_state(key)

    @jax.jit
    def ask(self, state: TrainState) -> Any:
        """The generation's members as a pytree shaped like ``x0`` with a leading ``[num_members]`` axis."""
        return jax.vmap(self.problem.unravel)(self.problem.population(state))

    @jax.jit
    def tell(self, state: TrainState, fitness: jax.Array) -> tuple[TrainState, dict]:
        """The next state from the members' fitness ``[num_members]`` (minimised if ``minimize``).

        A non-finite fitness leaves the state unchanged and sets ``info["bad_member"] >= 0``.
        """
        fitness = jnp.asarray(fitness, jnp.float32).reshape(self.num_members) * self.problem.sign
        return self.problem.apply_fitness(state, fitness)

    def mean(self, state: TrainState) -> Any:
        """The current mean, shaped like ``x0``."""
        return self.problem.params_tree(state.params)
