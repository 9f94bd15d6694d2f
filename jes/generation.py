"""Device code: the training state and THE compiled generation step.

The function compiled per generation is :meth:`Generation.generation_step`.
Inside it, a ``shard_map`` over a 1-D mesh of local devices gives each device
a slice of fixed-size member chunks; each device evaluates its chunks one
after another with the same compiled chunk program; fitness is all-gathered,
the strategy turns the whole population's fitness into per-member weights,
each device computes its chunks' sufficient statistics from regenerated noise,
those are all-gathered and summed in chunk order, and the strategy's update
runs replicated. The centre's evaluation episodes (of the state passed in) run
in the chunks' rollouts beside the members, so the program holds the rollout
once. Because every chunk is computed by
the same program and the reduction order is fixed, the result is
bit-identical whether a population is evaluated on one device, several
devices, or several hosts.

:class:`Generation` holds everything that does not depend on what a member
is evaluated on; :class:`Trainer` evaluates members as policies on
environment episodes, :class:`jes.blackbox.FunctionProblem` on a function.
How the step and the member program are compiled (ahead of time, in the
background, from the program cache) is :mod:`jes.compiled`; how a member's
parameters are formed and applied is :mod:`jes.perturbations`; what a strategy is built with for a run
(its context, optimizer and learning rate) is :mod:`jes.strategy_context`.
"""
from __future__ import annotations

import collections
import math
import threading
from typing import Any, Callable

import flax.linen as nn
import flax.errors
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jes import perturbations, program_cache, strategies
from jes.arrays import as_key, fetch, host_unravel, int32_seed, localize, positive_count, resolve_devices  # noqa: F401 (re-exported)
from jes.compiled import CompiledPrograms
from jes.config import ESConfig
from jes.cpu import compiler_options
from jes.envs import EnvSpec, make_env
from jes.policies import PolicyFns, check_carry, fit_to_outputs, kind_of, nnx_refusal, nnx_updates
from jes.rollout import OBS_EPS, obs_mean_std, obs_normaliser, run_episodes, run_slots, sum_obs_stats
from jes.strategies import noise
from jes.strategies.base import Context, Strategy
from jes.strategy_context import build_context, check_strategy_supports, run_learning_rate  # noqa: F401 (moved there)

try:  # jax >= 0.7
    from jax import shard_map as _shard_map
except ImportError:  # pragma: no cover - older jax
    from jax.experimental.shard_map import shard_map as _shard_map

AXIS = "members"
HOST_CHUNK_SIZE = 32  # default members per chunk of a host (Python) env


@struct.dataclass
class TrainState:
    """Everything that changes from one generation to the next.

    Attributes:
        strategy: the strategy's state (its ``mean`` is the centre, ``[num_params]`` float32).
        generation: generations completed, int32 scalar.
        es_key: typed PRNG key from which every generation's noise and episodes derive.
        obs_count, obs_sum, obs_sumsq: running observation statistics.
    """

    strategy: Any
    generation: jax.Array
    es_key: jax.Array
    obs_count: jax.Array
    obs_sum: jax.Array
    obs_sumsq: jax.Array

    @property
    def params(self) -> jax.Array:
        """The centre of the search distribution, a flat ``[num_params]`` vector."""
        return self.strategy.mean


@struct.dataclass
class ChunkResults:
    """What evaluating chunks of members gives, one row per chunk.

    A new per-chunk quantity is one field here: it travels from devices, workers and
    sweeps to :meth:`Generation.apply_chunk_results` without touching the code between.

    Attributes:
        fitness: ``[..., C]`` (0 for padding members).
        env_steps: ``[...]`` int32 env steps (function evaluations for :func:`jes.optimize`).
        obs_sum, obs_sumsq: ``[..., *obs_shape]`` sums of observations and their squares.
    """

    fitness: jax.Array
    env_steps: jax.Array
    obs_sum: jax.Array
    obs_sumsq: jax.Array

    def as_tuple(self) -> tuple:
        """``(fitness, env_steps, obs_sum, obs_sumsq)``: the wire protocol's field order."""
        return self.fitness, self.env_steps, self.obs_sum, self.obs_sumsq


RUN_KEYS_KEPT = 1024  # states whose run key a trainer remembers (Generation.note_run_key); the oldest go first


def es_key_bytes(state: Any) -> tuple | None:
    """A state's ES key data as host bytes (with its dtype and shape), or ``None`` for a traced one (inside
    ``jit``/``vmap``) or a state without one: what :meth:`Generation.note_run_key` remembers a run key by."""
    es_key = getattr(state, "es_key", None)
    if es_key is None or isinstance(es_key, jax.core.Tracer):
        return None
    try:
        es_key = localize(es_key)
        if isinstance(es_key, jax.Array) and jnp.issubdtype(es_key.dtype, jax.dtypes.prng_key):
            es_key = jax.random.key_data(es_key)  # a concrete key's data: no program runs
        data = np.asarray(jax.device_get(es_key))
    except Exception:  # noqa: BLE001 - not a key, nor its data: no run key to remember by it
        return None
    return data.dtype.str, data.shape, data.tobytes()


class Generation(CompiledPrograms):
    """The compiled generation of an ES run over any member evaluation (subclasses define it).

    Subclasses set, before calling :meth:`_setup`: ``self.config`` and the flat-parameter
    ``self.unravel``/``self.num_params``, and implement :meth:`evaluate_members` and
    :meth:`centre_score`, or, to evaluate the centre inside the members' chunks,
    :meth:`step_chunks` and :meth:`centre_from_chunks` (as :class:`Trainer` does).
    """

    config: ESConfig
    strategy: Strategy
    ctx: Context
    num_params: int
    obs_shape: tuple[int, ...] = ()
    normalize_observations: bool = False
    # Whether the step draws a one-chunk device's noise once for its members and their statistics (see chunk_draws).
    # On for functions (jes.blackbox), where the draws are a good part of a generation; off here and for policies,
    # whose generation is the rollout (low rank, paired, seeds 0-2: 0.96-1.01x env steps/s, MinAtar CNNs, MLP 256^2).
    shares_draws: bool = False

    def _setup(self, strategy: Any, optimizer: Any, devices: Any) -> None:
        config = self.config
        self.strategy = strategies.get(strategy)
        self._optimizer_arg = optimizer  # for the program cache's key: only names are cacheable
        self.perturbation = perturbations.get(config.perturbation, config.perturbation_rank)
        layout = self.perturbation_layout() if self.perturbation.structured else None
        self.ctx, self.optimizer_name = build_context(self.strategy, optimizer, config, self.num_params, layout)
        self.optimizer = self.ctx.optimizer
        self.antithetic = self.ctx.antithetic
        self.devices = resolve_devices(devices)
        self.mesh = Mesh(np.array(self.devices), (AXIS,))
        # Whether every device of the run is this process's (a jax.distributed run's are not): see generation_step
        self.one_process = all(d.process_index == jax.process_index() for d in self.devices)
        if config.chunk_size is not None:
            self.chunk_size = config.chunk_size
        else:
            self.chunk_size = self.fit_chunk_size(self.default_chunk_size)
        self.num_chunks = math.ceil(config.num_members / self.chunk_size)
        per_device = math.ceil(self.num_chunks / len(self.devices))
        self.padded_chunks = per_device * len(self.devices)
        self.replicated = NamedSharding(self.mesh, P())
        # The step's XLA options (CPU: which fusion emitters; the perturbation may want XLA's default ones)
        self.step_compiler_options = compiler_options(self.devices, self.perturbation.cpu_fusion_emitters(layout),
                                                      self.perturbation.cpu_tree_reductions)
        self.step = jax.jit(self.generation_step, compiler_options=self.step_compiler_options)
        # Placed replicated by the program itself, as the step wants it (no recompile, no copy).
        self._init_from_key = jax.jit(self.fresh_state, out_shardings=self.replicated)
        self._init_from_seed = jax.jit(self._fresh_state_from_seed, out_shardings=self.replicated)
        self._member_jit = jax.jit(self.member_params, compiler_options=self.step_compiler_options)
        self._member_program = None
        self._compiled = None
        self._compile_time = 0.0
        self._compiling = None
        self._init_program = None
        self._shapes = None
        self._host_unravel = None
        # The run keys of the states made, restored or returned here, by their ES key's data (see note_run_key)
        self._run_keys: collections.OrderedDict = collections.OrderedDict()
        self._run_keys_lock = threading.Lock()

    def perturbation_layout(self) -> Any:
        """The structured perturbation's static layout of the parameters (``None``: only full rank applies)."""
        return None

    @property
    def default_chunk_size(self) -> int:
        """Most members in a chunk when ``config.chunk_size`` is ``None``."""
        return 256

    def fit_chunk_size(self, most: int) -> int:
        """The chunk a default of ``most`` members gives this run: at most the population, whole mirrored pairs."""
        size = min(self.config.num_members, most)
        return size + (size % 2 if self.antithetic else 0)

    # ----------------------------------------------------------------- state
    def init_state(self, key: Any = 0) -> TrainState:
        """Fresh training state: the initial mean from ``split(run_key)[0]``, ES streams from ``split(run_key)[1]``.

        One compiled program (cached like the step) rather than dozens of eager operations.
        """
        seed = int32_seed(key)
        if seed is not None:
            # jax.random.key(int) itself runs a compiled seeding of an int32; do it in the same program.
            if self._init_program is None:
                self._init_program = self._cached_init_program() or self._init_from_seed
            state = self._init_program(seed)
        else:
            state = self._init_from_key(as_key(key))
        self.note_run_key(state, key)  # once made: a key refused above is not remembered
        return state

    def note_run_key(self, state: TrainState, key: Any) -> None:
        """Remember ``key`` as the run key of ``state`` (made by :meth:`init_state`, restored into this trainer from a
        checkpoint, or returned by :func:`jes.run`), by its ES key's data: a state holds only ``split(run key)[1]``,
        from which :func:`jes.run` cannot tell the run key its result records. Nothing is remembered inside
        ``jit``/``vmap`` (a traced key or state); the :data:`RUN_KEYS_KEPT` latest states' keys are kept."""
        if isinstance(key, jax.core.Tracer):
            return
        held = es_key_bytes(state)
        if held is None:
            return
        if isinstance(key, np.ndarray):
            key = key.copy()  # as it is now: the caller's array may change
        with self._run_keys_lock:
            self._run_keys.pop(held, None)
            self._run_keys[held] = key
            while len(self._run_keys) > RUN_KEYS_KEPT:
                self._run_keys.popitem(last=False)

    def known_run_key(self, state: TrainState) -> Any:
        """The run key :meth:`note_run_key` remembered for ``state``'s ES key, or ``None``: one lookup of its bytes,
        nothing derived."""
        held = es_key_bytes(state)
        if held is None:
            return None
        with self._run_keys_lock:
            return self._run_keys.get(held)

    def _state_shapes(self) -> TrainState:
        """Shapes, dtypes and placement of this run's states (``ShapeDtypeStruct`` leaves, placed replicated)."""
        if self._shapes is None:
            shapes = jax.eval_shape(lambda: self.fresh_state(jax.random.key(0)))
            self._shapes = self._abstract(shapes)
        return self._shapes

    def _abstract(self, tree: Any) -> Any:
        """``ShapeDtypeStruct`` leaves of ``tree``'s arrays (or structs), placed replicated on this run's devices."""
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=getattr(x, "weak_type", False),
                                                           sharding=self.replicated), tree)

    def _cached_init_program(self) -> Callable | None:
        """``seed -> fresh state`` from the program cache (or traced and stored there), or ``None``: cache off or
        uncacheable run, or any failure (then :attr:`_init_from_seed` traces it as without a cache)."""
        try:
            shapes = self._state_shapes()
            key = self._program_key("init_from_seed", shapes)
            if key is None:
                return None
            treedef = jax.tree.structure(shapes)
            def init_from_seed_flat(seed):
                return jax.tree.leaves(self._fresh_state_from_seed(seed))

            compiled = self._compile_exported(key, init_from_seed_flat, [jax.ShapeDtypeStruct((), jnp.int32, sharding=self.replicated)],
                                              out_shardings=self.replicated)
            return lambda seed: jax.tree.unflatten(treedef, compiled(seed))
        except Exception:  # noqa: BLE001 - any failure of the cached path: trace as without a cache
            return None

    def _fresh_state_from_seed(self, seed: jax.Array) -> TrainState:
        return self.fresh_state(jax.random.key(seed))

    def fresh_state(self, run_key: jax.Array, mean: jax.Array | None = None) -> TrainState:
        """The fresh state of :meth:`init_state` for a typed run key (traceable; not yet placed); ``mean``: the
        initial mean ``[P]`` as an argument instead of :meth:`initial_mean` (one program for any start point)."""
        init_key, es_key = jax.random.split(run_key)
        zeros = jnp.zeros(self.obs_shape, jnp.float32)
        return TrainState(
            strategy=self.strategy.init(self.ctx, self.initial_mean(init_key) if mean is None else mean),
            generation=jnp.int32(0),
            es_key=es_key,
            obs_count=jnp.float32(OBS_EPS),
            obs_sum=zeros,
            obs_sumsq=jnp.full(self.obs_shape, OBS_EPS, jnp.float32),
        )

    def _policy_obs_dtype(self) -> Any:
        """The dtype of the observations the rollout applies the policy to: float32, or a wider float an env gives
        with jax_enable_x64 (gymnax's CartPole and Pendulum give float64 then; normalised with float32 statistics,
        they stay float64). A check with float32 observations passed a recurrent policy whose carry follows its
        input's dtype (nn.GRUCell's), which then failed inside the rollout's while_loop with JAX's own error."""
        if self.spec.host or not jax.config.jax_enable_x64:  # (float32 observations: nothing to trace)
            return jnp.float32
        try:
            reset = jax.eval_shape(lambda k: self.spec.env.reset_env(k, self.spec.params), jax.random.key(0))[0]
        except Exception:  # noqa: BLE001 - the env's own checks say what is wrong with it, elsewhere
            return jnp.float32
        dtype = jnp.dtype(getattr(reset, "dtype", jnp.float32))
        return dtype if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize > 4 else jnp.float32

    def initial_mean(self, init_key: jax.Array) -> jax.Array:
        raise NotImplementedError

    @property
    def run_label(self) -> str:
        """``"adam"`` for OpenAI-ES (as before strategies existed), else ``"pgpe-clipup"``, ``"snes"``, ...; a low-rank
        run adds its rank (``"adam-lowrank-r2"``), so its summary and default run directory say which it was."""
        return run_label(self.strategy.name, self.optimizer_name, self.config)

    def place(self, state: TrainState) -> TrainState:
        """Put a state (fresh, restored, or from another process) replicated on this run's devices.

        The compiled step returns replicated state; feeding it the same placement keeps it at one compilation.
        In a multi-process run every process must call this with the same values (JAX checks it).
        """
        if self.replicated.is_fully_addressable:
            return jax.device_put(state, self.replicated)

        def one(x):
            if isinstance(x, jax.Array) and x.sharding == self.replicated:
                return x
            if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
                data = np.asarray(jax.device_get(jax.random.key_data(localize(x))))
                return jax.random.wrap_key_data(jax.device_put(data, self.replicated), impl=jax.random.key_impl(x))
            # Host values go to every process's devices (jax checks that all processes hold the same).
            return jax.device_put(np.asarray(jax.device_get(localize(x))), self.replicated)

        return jax.tree.map(one, state)

    def params_tree(self, flat_params: jax.Array) -> Any:
        """The parameter pytree of a flat parameter vector.

        A host (numpy) vector is split and reshaped on the host, then placed: no program runs, so a fresh
        process compiles nothing for it (the eager unravel was four small compiles after every run).
        """
        if isinstance(flat_params, np.ndarray):
            if self._host_unravel is None:
                self._host_unravel = host_unravel(self.unravel, self.num_params)
            return self._host_unravel(flat_params)
        return self.unravel(jnp.asarray(flat_params, jnp.float32))

    def obs_norm(self, state: TrainState) -> tuple[jax.Array, jax.Array] | None:
        """``(mean, std)`` of observations so far, or ``None`` without normalisation.

        The policy sees ``(obs - mean) * rsqrt(var)`` (:meth:`obs_scale`), which can differ from
        ``(obs - mean) / std`` in the last bit."""
        if not self.normalize_observations:
            return None
        return obs_mean_std(state.obs_count, state.obs_sum, state.obs_sumsq)

    def obs_scale(self, state: TrainState) -> tuple[jax.Array, jax.Array] | None:
        """``(mean, 1 / std)`` the rollout normalises observations with, or ``None`` without normalisation."""
        if not self.normalize_observations:
            return None
        return obs_normaliser(state.obs_count, state.obs_sum, state.obs_sumsq)

    def noise_std(self, state: TrainState) -> jax.Array:
        """Mean sigma of the search distribution at the state's generation."""
        return self.strategy.noise_std(self.ctx, state.strategy, state.generation)

    # -------------------------------------------------------- device pieces
    def evaluate_members(self, state: TrainState, flat: jax.Array, members: jax.Array, gen_key: jax.Array,
                         active: jax.Array) -> ChunkResults:
        """Fitness (and counters) of one chunk of members with flat parameters ``flat`` ``[C, P]``."""
        raise NotImplementedError

    def centre_score(self, state: TrainState) -> tuple[jax.Array, jax.Array]:
        """``(score, steps)`` of the unperturbed centre, reported apart from the population."""
        raise NotImplementedError

    def sample_chunk(self, state: TrainState, chunk: jax.Array, draws: Any = None) -> tuple[Any, jax.Array, jax.Array]:
        """Chunk ``chunk``'s members (flat parameters ``[C, P]``, or a structured perturbation's form, see
        :mod:`jes.perturbations`), their indices ``[C]``, and which are real (``draws``: see :meth:`chunk_draws`)."""
        size = self.chunk_size
        gen_key = noise.generation_key(state.es_key, state.generation)
        start = chunk * size
        members = start + jnp.arange(size, dtype=jnp.int32)
        if draws is None:
            flat = self.strategy.sample(self.ctx, state.strategy, gen_key, state.generation, start, size)
        else:
            flat = self.strategy.sample(self.ctx, state.strategy, gen_key, state.generation, start, size, draws=draws)
        return flat, members, members < self.config.num_members

    def chunk_draws(self, state: TrainState, chunk_ids: jax.Array) -> Any:
        """The strategy's random draws (:meth:`Strategy.draw`) of one device's chunks, leaves ``[k, ...]``, drawn once
        for the members and their statistics; ``None`` (each draws its own) unless :attr:`shares_draws` and the
        device holds one chunk (more would keep every chunk's draws in memory at once) or the strategy has none."""
        if not self.shares_draws or chunk_ids.shape[0] != 1:
            return None
        gen_key = noise.generation_key(state.es_key, state.generation)
        draws = self.strategy.draw(self.ctx, gen_key, chunk_ids[0] * self.chunk_size, self.chunk_size)
        return None if draws is None else jax.tree.map(lambda x: x[None], draws)

    def member_params(self, state: TrainState, member: jax.Array) -> jax.Array:
        """Flat parameters ``[P]`` of one member of the state's generation, regenerated from its key.

        A structured perturbation's member is materialised here (``mean + sigma * E_i``), which the
        rollout never does: its forward pass matches this one to float rounding, not bit for bit."""
        if self.ctx.perturbation is not None:
            gen_key = noise.generation_key(state.es_key, state.generation)
            unit = self.ctx.perturbation.member_noise(self.ctx, gen_key, member)
            return state.params + self.noise_std(state) * unit
        flat, _, _ = self.sample_chunk(state, member // self.chunk_size)
        return flat[member % self.chunk_size]

    def evaluate_chunk(self, state: TrainState, chunk: jax.Array, evaluate_population: Any = True,
                       draws: Any = None) -> ChunkResults:
        """Evaluate members ``[chunk*C, (chunk+1)*C)`` of the state's generation (padding members get fitness 0;
        with ``evaluate_population`` false, every member is treated as padding; ``draws``: see :meth:`chunk_draws`)."""
        flat, members, active = self.sample_chunk(state, chunk, draws)
        gen_key = noise.generation_key(state.es_key, state.generation)
        return self.evaluate_members(state, flat, members, gen_key, active & evaluate_population)

    def evaluate_chunks(self, state: TrainState, chunks: jax.Array) -> ChunkResults:
        """Evaluate several chunks one after another (``lax.map``), with no centre evaluation (a sweep's unit of work;
        devices, workers and masters evaluate chunks with :meth:`step_chunks`, which can run the centre's slots)."""
        return jax.lax.map(lambda c: self.evaluate_chunk(state, c), chunks)

    def weights(self, state: TrainState, fitness: jax.Array) -> Any:
        """The strategy's per-member weights padded to whole chunks (device padding included): leaves ``[padded_chunks, C]``.

        Computed inside a ``cond`` (zeros when a fitness is non-finite), a computation of its own: fused
        into the chunk statistics, a weight's last multiply could become an FMA in one program and not in
        another (one device or two), and change the result's last bits.
        """
        n = self.config.num_members
        weigh = lambda f: self.strategy.weights(self.ctx, state.strategy, f)
        skip = lambda f: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(weigh, f))
        # The case that was seen: the one-device step's loop over its chunks kept ARS's `pair_w * scale` apart
        # from the statistics' `w+ - w-`; the two-device step, one chunk per device, fused them into an FMA.
        # An optimization barrier does not stop that fusion: XLA:CPU expands barriers before fusing.
        shaped = jax.lax.cond(jnp.isfinite(fitness).all(), weigh, skip, fitness)

        def pad(leaf):
            # float64 only where the weights and the mean are (x64 mode: ARS's fitness differences, z_score shaping
            # of float64 fitness), else float32, cast explicitly (a float64 leaf set into a float32 buffer is a JAX
            # FutureWarning): a float64 step on a float32 mean would make the update's cond branches differ
            wide = leaf.dtype == jnp.float64 and state.params.dtype == jnp.float64
            dtype = jnp.float64 if wide else jnp.float32
            padded = jnp.zeros(self.padded_chunks * self.chunk_size, dtype).at[:n].set(leaf.astype(dtype))
            return padded.reshape(self.padded_chunks, self.chunk_size)

        return jax.tree.map(pad, shaped)

    def chunk_stats(self, state: TrainState, chunks: jax.Array, weights: Any, draws: Any = None) -> Any:
        """The strategy's sufficient statistics of each chunk, leaves ``[k, ...]``; ``weights`` leaves are ``[k, C]``
        (``draws``: the chunks' draws, see :meth:`chunk_draws`; ``None``: redrawn)."""
        gen_key = noise.generation_key(state.es_key, state.generation)

        def one(args):
            chunk, w, d = args
            start = chunk * self.chunk_size
            if d is None:
                return self.strategy.chunk_stats(self.ctx, state.strategy, gen_key, state.generation, start, w)
            return self.strategy.chunk_stats(self.ctx, state.strategy, gen_key, state.generation, start, w, draws=d)

        return jax.lax.map(one, (chunks, weights, draws))

    @staticmethod
    def reduce_chunks(values: Any) -> Any:
        """Sum per-chunk values (leaves ``[k, ...]``) one chunk after another, in chunk order.

        A fixed sequential order makes the float32 sum the same wherever the chunks were computed.
        """
        def one(v):
            return jax.lax.scan(lambda acc, x: (acc + x, None), jnp.zeros_like(v[0]), v)[0]

        return jax.tree.map(one, values)

    def update_from_stats(self, state: TrainState, fitness: jax.Array, stats: Any, totals: ChunkResults) -> tuple[TrainState, dict]:
        """The strategy's update from chunk-ordered statistics, and the generation's metrics.

        A generation with a non-finite fitness leaves the state unchanged and reports the
        first bad member in ``metrics["bad_member"]`` (else -1) with NaN update metrics
        (``grad_norm``, ...); one whose update gives a non-finite strategy state leaves it
        unchanged too and sets ``metrics["bad_update"]``. The update runs in a ``cond`` of its
        own for the reason given in :meth:`weights`.

        Args:
            fitness: ``[num_members]``; stats: the summed statistics; totals: generation totals
                of the other per-chunk fields (``fitness`` unused).
        """
        bad = ~jnp.isfinite(fitness)
        bad_fitness = bad.any()
        update = lambda s: self.strategy.update(self.ctx, s, stats, fitness, state.generation)

        def skip(s):
            return s, jax.tree.map(lambda x: jnp.full(x.shape, jnp.nan, x.dtype), jax.eval_shape(update, s)[1])

        new_strategy, info = jax.lax.cond(bad_fitness, skip, update, state.strategy)
        finite = jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(new_strategy)
                            if jnp.issubdtype(x.dtype, jnp.floating)])
        # Finite fitness can still give a non-finite step (a sigma schedule reaching 0, overflowing raw
        # fitness): never apply it either.
        bad_update = ~bad_fitness & ~finite.all()
        any_bad = bad_fitness | bad_update
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(any_bad, o, n), new, old)
        new_state = state.replace(
            strategy=keep(new_strategy, state.strategy),
            generation=jnp.where(any_bad, state.generation, state.generation + 1),
        )
        if self.normalize_observations:
            new_state = new_state.replace(
                obs_count=keep(state.obs_count + totals.env_steps.astype(jnp.float32), state.obs_count),
                obs_sum=keep(state.obs_sum + totals.obs_sum, state.obs_sum),
                obs_sumsq=keep(state.obs_sumsq + totals.obs_sumsq, state.obs_sumsq),
            )
        safe = jnp.where(bad, jnp.nan, fitness)
        metrics = {
            "pop_mean": jnp.nanmean(safe),
            "pop_max": jnp.nanmax(safe),
            "pop_min": jnp.nanmin(safe),
            "pop_std": jnp.nanstd(safe),
            "env_steps": totals.env_steps,
            **info,
            "param_norm": jnp.linalg.norm(new_state.params),
            "best_member": jnp.argmax(jnp.where(bad, -jnp.inf, fitness)).astype(jnp.int32),
            "bad_member": jnp.where(bad_fitness, jnp.argmax(bad), -1).astype(jnp.int32),
            "bad_update": bad_update,
        }
        return new_state, metrics

    def apply_fitness(self, state: TrainState, fitness: jax.Array, totals: ChunkResults | None = None) -> tuple[TrainState, dict]:
        """The update from a full fitness vector ``[num_members]`` (``totals``: generation totals of the other fields)."""
        if totals is None:
            zeros = jnp.zeros(self.obs_shape, jnp.float32)
            totals = ChunkResults(fitness=fitness, env_steps=jnp.int32(0), obs_sum=zeros, obs_sumsq=zeros)
        weights = jax.tree.map(lambda w: w[: self.num_chunks], self.weights(state, fitness))
        stats = self.chunk_stats(state, jnp.arange(self.num_chunks, dtype=jnp.int32), weights)
        return self.update_from_stats(state, fitness, self.reduce_chunks(stats), totals)

    def apply_chunk_results(self, state: TrainState, results: ChunkResults) -> tuple[TrainState, dict]:
        """The update from every chunk's results, as :meth:`evaluate_chunks` returns them for chunks ``0..num_chunks-1``.

        This is what a distributed master runs once all chunks are in; it is bit-identical to
        :meth:`generation_step` for the same generation, however the chunks were spread.
        """
        flat = results.fitness.reshape(-1)[: self.config.num_members]
        return self.apply_fitness(state, flat, self.reduce_chunks(results))

    def step_chunks(self, state: TrainState, chunk_ids: jax.Array, evaluate_centre: jax.Array,
                    evaluate_population: jax.Array, draws: Any = None) -> tuple[ChunkResults, Any]:
        """One device's part of the step: its chunks' results (leaves ``[k, ...]``; no member evaluated unless
        ``evaluate_population``) and its part of the centre's evaluation, or ``None`` when the centre is
        evaluated apart (by :meth:`centre_score`, as here). ``draws``: the chunks' (:meth:`chunk_draws`), or ``None``.

        A subclass that evaluates the centre inside its chunks returns ``(returns, steps)``, each ``[k, S]``:
        centre episode ``j`` in slot ``j % S`` of chunk ``j // S`` (see :meth:`Trainer.step_chunks`).
        """
        return jax.lax.map(lambda a: self.evaluate_chunk(state, a[0], evaluate_population, a[1]),
                           (chunk_ids, draws)), None

    def centre_from_chunks(self, centre: Any) -> tuple[jax.Array, jax.Array]:
        """``(score, steps)`` of the centre from every real chunk's part ``[num_chunks, S]`` (see :meth:`step_chunks`)."""
        raise NotImplementedError

    def generation_step(self, state: TrainState, evaluate_centre: jax.Array,
                        evaluate_population: jax.Array) -> tuple[TrainState, dict]:
        """One whole generation: sample, evaluate every member, weigh, update; and the centre's evaluation.

        This is the function jes compiles (``self.step``). Both flags are traced bools, so turning
        them on or off never recompiles:

        - ``evaluate_centre``: also evaluate the centre **of the state passed in**, the mean the members
          were drawn around (``metrics["centre_return"]``, ``metrics["centre_steps"]``; NaN and 0
          when off). :class:`Trainer` runs its episodes in the members' rollout, so the program holds
          the rollout once; a host loop reports a generation's centre with the next call
          (:func:`jes.loop.run`).
        - ``evaluate_population``: with ``False`` no member is evaluated and the state comes back
          unchanged (a run's last centre evaluation); the population metrics are then meaningless.
        """
        per_device = self.padded_chunks // len(self.devices)

        def sharded(state, chunk_ids, evaluate_centre, evaluate_population):
            real = self.num_chunks  # device padding chunks are dropped before any reduction
            if len(self.devices) == 1:
                # the identity: an all-gather over one device was still a collective thunk of its own, ~15-25 %
                # of a small black-box generation (benchmarks/README.md); dropping it kept every pinned bit
                gather = lambda tree: jax.tree.map(lambda x: x[:real], tree)
            else:
                gather = lambda tree: jax.tree.map(lambda x: jax.lax.all_gather(x, AXIS, tiled=True)[:real], tree)
            draws = self.chunk_draws(state, chunk_ids)
            if draws is None:  # (a subclass's step_chunks may not take draws)
                results, centre = self.step_chunks(state, chunk_ids, evaluate_centre, evaluate_population)
            else:
                results, centre = self.step_chunks(state, chunk_ids, evaluate_centre, evaluate_population, draws)
            results = gather(results)
            fitness_all = results.fitness.reshape(-1)[: self.config.num_members]
            weights = self.weights(state, fitness_all)
            index = jax.lax.axis_index(AXIS)
            if self.ctx.perturbation is None or self.one_process:
                # Each device its own chunks' statistics, gathered: in one process a copy between its devices (a
                # low-rank run's update split over them instead of each device computing all of it)
                local = jax.tree.map(lambda w: jax.lax.dynamic_slice_in_dim(w, index * per_device, per_device), weights)
                stats = gather(self.chunk_stats(state, chunk_ids, local, draws))
            else:
                # Across processes, every device rebuilds the whole update from the fitness alone (factors come
                # from keys): no P-sized statistics cross processes, and the per-chunk sums are the same bits.
                every = jnp.arange(real, dtype=jnp.int32)
                stats = self.chunk_stats(state, every, jax.tree.map(lambda w: w[:real], weights))
            # Per-chunk values gathered in chunk order, then reduced sequentially: device count cannot change the sums.
            new_state, metrics = self.update_from_stats(state, fitness_all, self.reduce_chunks(stats),
                                                        self.reduce_chunks(results))
            return new_state, metrics, None if centre is None else gather(centre)

        chunk_ids = jnp.arange(self.padded_chunks, dtype=jnp.int32)
        chunk_ids = jax.lax.with_sharding_constraint(chunk_ids, NamedSharding(self.mesh, P(AXIS)))
        new_state, metrics, centre = _shard_map(
            sharded, mesh=self.mesh, in_specs=(P(), P(AXIS), P(), P()), out_specs=(P(), P(), P()), check_vma=False,
        )(state, chunk_ids, evaluate_centre, evaluate_population)
        if centre is None:
            centre_return, centre_steps = jax.lax.cond(
                evaluate_centre, self.centre_score, lambda s: (jnp.float32(jnp.nan), jnp.int32(0)), state)
        else:
            centre_return, centre_steps = self.centre_from_chunks(centre)
            centre_return = jnp.where(evaluate_centre, centre_return, jnp.nan)
            centre_steps = jnp.where(evaluate_centre, centre_steps, 0)
        new_state = jax.tree.map(lambda n, o: jnp.where(evaluate_population, n, o), new_state, state)
        return new_state, dict(metrics, centre_return=centre_return, centre_steps=centre_steps)


def check_parameter_dtypes(name: str, variables: Any) -> None:
    """Refuse a policy whose variables are not all float32: jes evolves them as one float32 vector.

    Raveling promotes mixed dtypes, so the vector's dtype hides a bf16 layer beside float32 ones (each member
    rounded back to bf16: small perturbations lost) and an int or bool variable (perturbed in float32 and cast
    back: a mask's False turned True, an integer drifting). Each leaf is checked, and the first not float32 named.

    Raises:
        TypeError: naming the variable's path and dtype, and what to do.
    """
    for path, leaf in jax.tree_util.tree_leaves_with_path(variables):
        dtype = jnp.dtype(leaf.dtype)
        if dtype == jnp.float32:
            continue
        # DictKey .key, SequenceKey .idx, GetAttrKey .name (a box's .value, where one is left: PolicyFns.init unboxes)
        where = "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)
        if jnp.issubdtype(dtype, jnp.inexact):  # bf16, f16, f64, complex
            unsupported = " (complex parameters are not supported)" if jnp.issubdtype(dtype, jnp.complexfloating) else ""
            raise TypeError(f"policy parameters must be float32{unsupported}, got {dtype} at {where} of policy {name}: "
                            f"jes evolves one float32 vector of them; keep param_dtype float32 (the default) and "
                            f"compute in another type with the layers' dtype= (e.g. nn.Dense(64, dtype=jnp.bfloat16))")
        raise TypeError(f"policy {name}'s variable {where} is {dtype}{list(leaf.shape)}: jes evolves every variable "
                        f"as float32 parameters (it would perturb and train it); make a fixed {dtype} value a "
                        f"constant of the module (a field, or an array built in __call__), not a variable")


def run_label(strategy_name: str, optimizer_name: str | None, config: ESConfig) -> str:
    """:attr:`Trainer.run_label` of a run of these (a checkpoint's recorded optimizer, say)."""
    if strategy_name == "openai_es":
        label = optimizer_name
    else:
        label = f"{strategy_name}-{optimizer_name}" if optimizer_name else strategy_name
    if config.perturbation == "low_rank":
        label += f"-lowrank-r{config.perturbation_rank}"
    return label


class Trainer(Generation):
    """The compiled pieces of an ES run of a policy on an env, for one (policy, env, strategy, optimizer, config).

    Most users call :func:`jes.train`; the trainer's pieces are what distributed
    workers and sweeps reuse: :meth:`init_state`, :meth:`generation_step`
    (compiled as :attr:`step`), :meth:`step_chunks` (a worker's chunks, centre slots
    included), :meth:`evaluate_chunks`, :meth:`centre_from_chunks` and :meth:`apply_chunk_results`.

    Args:
        policy: a Flax module (``jes.GRUPolicy``, ``jes.MLPPolicy`` or your own).
        env: a gymnax env id, env object, or ``(env, env_params)``.
        optimizer: an optimizer name or an optax ``GradientTransformation`` for strategies that
            use one (``None``: the strategy's default, ``"adam"`` for OpenAI-ES).
        config: the :class:`ESConfig`.
        env_params: gymnax env params overriding the env's defaults.
        devices: local devices to shard the population over (``None``: all).
        rollout_min_batch: smallest batch the rollout compacts still-running episodes into
            (see :func:`jes.rollout.run_episodes`). Purely a speed/compile-time trade-off:
            results are bit-identical for any value (tested on CPU).
        strategy: a strategy name (``jes.strategies.names()``) or object; default OpenAI-ES.
    """

    def __init__(
        self,
        policy: nn.Module,
        env: Any,
        optimizer: Any = None,
        config: ESConfig | None = None,
        env_params: Any = None,
        devices: Any = None,
        rollout_min_batch: int = 32,
        strategy: Any = "openai_es",
    ):
        self.config = config = config or ESConfig()
        if isinstance(rollout_min_batch, bool) or not isinstance(rollout_min_batch, int) or rollout_min_batch < 1:
            raise ValueError(f"rollout_min_batch must be a positive integer, got {rollout_min_batch!r}")
        self.rollout_min_batch = rollout_min_batch
        self.spec: EnvSpec = make_env(env, env_params, config.max_episode_steps)
        self.obs_shape = self.spec.obs_shape
        if isinstance(policy, nn.RNN):  # it failed deep in Flax (IndexError) or scanned an observation's axis
            raise ValueError(f"policy {type(policy).__name__} is Flax's nn.RNN, which scans a sequence along a time "
                             f"axis, but jes gives a policy one observation a step and carries its carry between steps "
                             f"itself: pass the cell as the policy ({type(policy.cell).__name__}, as nn.RNN was given it)")
        self.policy = fit_to_outputs(policy, self.spec.num_outputs)
        self.fns = PolicyFns(self.policy, self.spec.obs_shape)
        unravel, abstract = [], []

        def flat_template():
            variables = self._init_variables(jax.random.key(0), abstract=True)
            abstract.append(variables)  # shapes and dtypes
            flat, fn = ravel_pytree(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), variables))
            unravel.append(fn)  # static (shapes and sizes only), so usable outside this trace
            return flat

        # Shapes only: traced, never run (running it was a dozen tiny compiles at start-up).
        flat = jax.eval_shape(flat_template)
        self.unravel = unravel[0]
        check_parameter_dtypes(type(self.policy).__name__, abstract[0])
        self.num_params = int(flat.shape[0])
        self._setup(strategy, optimizer, devices)
        # (never a Discrete observation's integer id: normalised, it would be another id)
        self.normalize_observations = (self.strategy.uses_obs_norm(config.normalize_observations)
                                       and not self.spec.categorical_obs)

    def program_parts(self) -> dict | None:
        if type(self) is not Trainer or not (self._optimizer_arg is None or isinstance(self._optimizer_arg, str)):
            return None  # an optax object cannot be fingerprinted; a subclass may change any method
        try:  # methods and functions replaced at run time (monkeypatching) are in no file the key covers
            program_cache.check_code([type(self), type(self.policy), type(self.spec.env), type(self.strategy)], self)
        except program_cache.Uncacheable:
            return None
        return dict(
            policy=self.policy, spec=self.spec, config=self.config, strategy=self.strategy,
            optimizer=self._optimizer_arg, optimizer_name=self.optimizer_name,
            rollout_min_batch=self.rollout_min_batch, normalize_observations=self.normalize_observations,
            num_params=self.num_params, obs_shape=tuple(self.obs_shape), chunk_size=self.chunk_size,
            num_chunks=self.num_chunks, padded_chunks=self.padded_chunks,
            devices=[[d.platform, d.device_kind, d.id, d.process_index] for d in self.devices],
            compiler_options=self.step_compiler_options, ranks_search=noise.search_method(),  # JAX's default backend's
        )

    def _init_variables(self, key: jax.Array, abstract: bool = False) -> Any:
        init = jax.eval_shape if abstract else (lambda f, *a: f(*a))
        name = type(self.policy).__name__
        if self.fns.recurrent:
            try:
                initial = jax.eval_shape(self.fns.initial_carry)
            except Exception as err:  # noqa: BLE001 - the user's initialize_carry, whatever it raised
                nnx_refusal(self.policy, err, recurrent=True)
                raise ValueError(f"policy {name}'s initialize_carry(rng, input_shape) failed ({type(err).__name__}: "
                                 f"{err}); jes calls it as Flax's recurrent cells take it, with a key and the "
                                 f"observation shape {self.spec.obs_shape}") from err
        obs = jax.ShapeDtypeStruct(self.spec.obs_shape, self._policy_obs_dtype())
        try:
            variables = init(self.fns.init, key)
            carry = self.fns.initial_carry()
            if self.fns.recurrent:
                returned = jax.eval_shape(self.policy.apply, variables, carry, obs)
                if not (isinstance(returned, tuple) and len(returned) == 2):
                    raise TypeError(f"a recurrent policy (it has initialize_carry) returns (carry, output), but "
                                    f"{name} returned {kind_of(returned)}")
                new_carry, out = returned
                check_carry(name, initial, new_carry)
            else:
                out = jax.eval_shape(lambda v, o: self.policy.apply(v, o), variables, obs)
            if not hasattr(out, "shape"):
                raise TypeError(f"policy {name} returned {kind_of(out)}, not an output array: a feed-forward policy "
                                f"returns its output; a recurrent one defines initialize_carry(rng, input_shape) and "
                                f"returns (carry, output)")
        except flax.errors.FlaxError as err:  # a mutable collection (BatchNorm statistics) or an RNG (Dropout)
            raise ValueError(
                f"policy {name} cannot be applied as a pure function of its parameters ({err}); jes evaluates "
                f"members with no mutable collections or RNGs: use nn.BatchNorm(use_running_average=True), "
                f"nn.Dropout(deterministic=True)") from err
        except (TypeError, ValueError, IndexError, KeyError) as err:
            nnx_refusal(self.policy, err)  # (a KeyError: nnx.Dropout's missing RNG stream; otherwise as any error)
            if isinstance(err, KeyError):
                raise
            wide = obs.dtype != jnp.float32  # (x64: the env's float64 observations, which the rollout applies it to)
            raise ValueError(
                f"policy {name} cannot be applied to one observation of env "
                f"{self.spec.name!r} (shape {self.spec.obs_shape}"
                + (f", {obs.dtype} as the env gives it with jax_enable_x64: cast it in the policy, "
                   f"obs.astype(jnp.float32), to compute in float32" if wide else "") + f"): {err}"
            ) from err
        updates = [] if self.fns.recurrent else nnx_updates(self.policy, variables, obs)
        if updates:  # the bridge drops them: a training-mode nnx.BatchNorm's outputs ignore the observation
            raise ValueError(
                f"policy ToLinen ({getattr(self.policy.nnx_class, '__qualname__', self.policy.nnx_class)}) "
                f"updates {', '.join(updates[:4])}{' ...' if len(updates) > 4 else ''} as it acts, which "
                f"Flax's bridge drops without a word (an nnx.BatchNorm in training mode then normalises each "
                f"observation by itself: every output is its bias); jes evaluates members as pure functions "
                f"of their parameters: give nnx.BatchNorm use_running_average=True")
        expected = (self.spec.num_outputs,)
        if tuple(out.shape) != expected:
            kind = "one logit per discrete action" if self.spec.discrete else f"one value per action dimension {self.spec.action_shape}"
            last = out.shape[-1] if out.ndim else None
            fix = (f"it sees ONE observation of shape {self.spec.obs_shape}, with no batch axis (jes vmaps it): "
                   f"flatten all of its axes (x.reshape(-1)) where it treats the first as a batch"
                   if out.ndim > 1 and last == self.spec.num_outputs else
                   f"set the policy's output size to {self.spec.num_outputs} (jes.GRUPolicy/MLPPolicy do this when "
                   f"num_outputs=None)")
            raise ValueError(
                f"policy {type(self.policy).__name__} outputs shape {tuple(out.shape)} but env {self.spec.name!r} needs "
                f"{expected} ({kind}); {fix}"
            )
        return variables

    def initial_mean(self, init_key: jax.Array) -> jax.Array:
        flat, _ = ravel_pytree(self._init_variables(init_key))
        return flat

    @property
    def default_chunk_size(self) -> int:
        # A host env's chunk is the unit a local process or worker takes: small enough to spread a
        # population over processes, and never dependent on how many there are (it decides the bits).
        if self.spec.host:
            return HOST_CHUNK_SIZE
        if self.perturbation.structured:  # its members are small: the perturbation sizes their chunks
            return self.perturbation.default_chunk_size(self.ctx.layout)
        return 256

    def perturbation_layout(self) -> Any:
        return self.perturbation.layout(self.fns, self._init_variables(jax.random.key(0), abstract=True))

    def member_fns(self, centre: jax.Array) -> Any:
        """The rollout's view of a chunk's members around the flat ``centre`` (see :mod:`jes.perturbations`)."""
        return self.perturbation.member_fns(self.fns, self.unravel, centre, self.ctx.layout)

    @property
    def centre_slots(self) -> int:
        """Centre evaluation episodes each chunk's rollout carries in the step (``eval_episodes`` over the chunks)."""
        return -(-self.config.eval_episodes // self.num_chunks)

    def _centre_in_chunks(self) -> bool:
        """Whether the step runs the centre's episodes in its chunks' rollouts (:meth:`step_chunks`)."""
        return (type(self).evaluate_members is Trainer.evaluate_members and self.ctx.perturbation is None
                and type(self).evaluate_centre is Trainer.evaluate_centre)

    def evaluate_members(self, state, flat, members, gen_key, active):
        if not self._centre_in_chunks():
            return self._evaluate_slots(state, flat, members, gen_key, active)[0]
        # A chunk evaluated apart by itself (evaluate_chunks: a vmapped sweep) carries the step's centre slots, idle:
        # XLA:CPU's code for the rollout depends on its batch size (a Pendulum member's fitness did, from 16 members a
        # chunk). Workers and masters run the step's own chunks instead (jes.host_step.programs: step_chunks), whose
        # centre slots are live on a generation that evaluates the centre, as the step's are.
        size = self.centre_slots
        episodes = members[0] // self.chunk_size * size + jnp.arange(size, dtype=jnp.int32)
        return self._evaluate_slots(state, flat, members, gen_key, active, episodes, jnp.zeros(size, bool))[0]

    def _evaluate_slots(self, state, flat, members, gen_key, active, centre_episodes=None, centre_active=None):
        """The members' results, and the returns and steps of centre episodes run in the same rollout batch.

        Every slot runs the same code on its own parameters and key, so a member's (and a centre episode's)
        results do not depend on what else shares the batch, but can on the batch's size (XLA:CPU's code for it)
        and on when it compacts (which slots still run): a chunk evaluated apart is evaluated by
        :meth:`step_chunks` with the step's flags (:func:`jes.host_step.programs`), or carries the step's centre
        slots idle (:meth:`evaluate_members`).
        """
        cfg = self.config
        epm = cfg.episodes_per_member
        member_fns = self.member_fns(state.params)
        slot_params = member_fns.slot_params(flat, epm)
        if centre_episodes is None:
            keys = noise.episode_keys(gen_key, members, epm, self.antithetic).reshape(-1)
        else:
            keys, centre_keys = noise.episode_and_centre_keys(gen_key, members, epm, self.antithetic, centre_episodes)
            keys = keys.reshape(-1)
        done = jnp.repeat(~active, epm)
        num_member_slots = members.shape[0] * epm
        optional = 0
        if centre_episodes is not None:
            size = centre_keys.shape[0]
            centre = jax.tree.map(lambda x: jnp.broadcast_to(x, (size,) + x.shape), self.unravel(state.params))
            slot_params = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), slot_params, centre)
            keys = jnp.concatenate([keys, centre_keys])
            done = jnp.concatenate([done, ~centre_active])
            # With eval_every > 1 most steps leave the centre's slots idle: let the rollout drop them at once.
            optional = 0 if cfg.eval_every == 1 else size
        out = run_slots(member_fns, self.spec, slot_params, keys, done, obs_scale=self.obs_scale(state),
                        collect_obs_stats=self.normalize_observations, min_slots=self.rollout_min_batch,
                        optional_slots=optional)
        returns = out["returns"][:num_member_slots].reshape(-1, epm)
        fitness = jnp.where(active, returns.mean(axis=1), 0.0)
        obs_sum, obs_sumsq = sum_obs_stats(out, num_member_slots, self.obs_shape)
        results = ChunkResults(fitness=fitness, env_steps=out["steps"][:num_member_slots].sum(), obs_sum=obs_sum,
                               obs_sumsq=obs_sumsq)
        return results, out["returns"][num_member_slots:], out["steps"][num_member_slots:]

    def step_chunks(self, state, chunk_ids, evaluate_centre, evaluate_population):
        """Each chunk's rollout also runs :attr:`centre_slots` of the centre's evaluation episodes: episode ``j``
        (key ``centre_episode_keys(gen_key, ...)[j]``, as :meth:`evaluate_centre`) in chunk ``j // centre_slots``.

        Workers and a master evaluate their chunks with this very function (one chunk a call,
        :func:`jes.host_step.programs`) and send the centre slots' returns and steps to the master, which reduces
        them with :meth:`centre_from_chunks`: the same bits as here whoever evaluated which chunk.

        A subclass that overrides :meth:`evaluate_members` or :meth:`evaluate_centre` gets them called as
        written (members by chunk, the centre apart), as workers, a master and a sweep call them."""
        # Structured members apply a GEMM whose bits depend on the batch size, so their chunks run alone
        # (the centre apart), as every worker and device runs them.
        if not self._centre_in_chunks():
            return super().step_chunks(state, chunk_ids, evaluate_centre, evaluate_population)
        gen_key = noise.generation_key(state.es_key, state.generation)
        size = self.centre_slots

        def one(chunk):
            flat, members, active = self.sample_chunk(state, chunk)
            episodes = chunk * size + jnp.arange(size, dtype=jnp.int32)
            centre_active = evaluate_centre & (episodes < self.config.eval_episodes)
            results, returns, steps = self._evaluate_slots(state, flat, members, gen_key, active & evaluate_population,
                                                           episodes, centre_active)
            return results, (returns, steps)

        return jax.lax.map(one, chunk_ids)

    def centre_from_chunks(self, centre):
        returns, steps = (x.reshape(-1)[: self.config.eval_episodes] for x in centre)
        return returns.mean(), steps.sum(dtype=jnp.int32)

    def centre_score(self, state):
        returns, steps = self.evaluate_centre(state)
        # int32 as the cond's other branch (in JAX's x64 mode a sum is int64): a no-op otherwise
        return returns.mean(), steps.sum(dtype=jnp.int32)

    def evaluate_centre(self, state: TrainState, num_episodes: int | None = None, key: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """Returns and steps of the unperturbed centre on fresh episodes, each ``[num_episodes]``."""
        num_episodes = self.config.eval_episodes if num_episodes is None else positive_count(num_episodes, "num_episodes")
        if key is None:
            key = noise.generation_key(state.es_key, state.generation)
        keys = noise.centre_episode_keys(key, num_episodes)[None]
        params = jax.tree.map(lambda x: x[None], self.unravel(state.params))
        out = run_episodes(self.fns, self.spec, params, keys, jnp.ones((1,), bool), obs_scale=self.obs_scale(state),
                           min_slots=self.rollout_min_batch)
        return out.returns[0], out.steps[0]
