"""``jes.train``: the training state, the one compiled generation step, and the host loop.

The function compiled per generation is :meth:`Trainer.generation_step`.
Inside it, a ``shard_map`` over a 1-D mesh of local devices gives each device
a slice of fixed-size member chunks; each device evaluates its chunks one
after another with the same compiled chunk program, fitness and per-chunk
gradient partials are all-gathered, and the rest (shaping, the gradient
summed in chunk order, the optax update, the centre evaluation) runs
replicated. Because every chunk is computed by the same program and the
reduction order is fixed, the result is bit-identical whether a population is
evaluated on one device, several devices, or several hosts.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Callable, Iterable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jes import strategy
from jes.config import ESConfig
from jes.envs import EnvSpec, make_env
from jes.optimizers import current_learning_rate, make_optimizer
from jes.policies import PolicyFns, fit_to_outputs
from jes.rollout import run_episodes

try:  # jax >= 0.7
    from jax import shard_map as _shard_map
except ImportError:  # pragma: no cover - older jax
    from jax.experimental.shard_map import shard_map as _shard_map

AXIS = "members"
# Initial pseudo-count of the running observation statistics (OpenAI ES's RunningStat).
_OBS_EPS = 1e-2


@struct.dataclass
class TrainState:
    """Everything that changes from one generation to the next.

    Attributes:
        params: flat parameter vector of the centre, ``[num_params]`` float32.
        opt_state: the optax state.
        generation: generations completed, int32 scalar.
        es_key: typed PRNG key from which every generation's noise and episodes derive.
        noise_std: base noise std (used when ``noise_std`` is not a schedule).
        obs_count, obs_sum, obs_sumsq: running observation statistics.
    """

    params: jax.Array
    opt_state: Any
    generation: jax.Array
    es_key: jax.Array
    noise_std: jax.Array
    obs_count: jax.Array
    obs_sum: jax.Array
    obs_sumsq: jax.Array


class NonFiniteFitnessError(ValueError):
    """A member's fitness was NaN or infinite; training stopped before using it.

    Attributes:
        generation: the generation being evaluated (1-based, as in the history).
        member: index of the first offending member.
        result: the :class:`TrainResult` up to the last good generation.
    """

    def __init__(self, message: str, generation: int, member: int, result: "TrainResult | None" = None):
        super().__init__(message)
        self.generation = generation
        self.member = member
        self.result = result


class NonFiniteUpdateError(ValueError):
    """A generation's ES update (or the parameters it would give) was not finite; it was not applied.

    Attributes:
        generation: the generation whose update failed (1-based, as in the history).
        result: the :class:`TrainResult` up to the last good generation.
    """

    def __init__(self, message: str, generation: int, result: "TrainResult | None" = None):
        super().__init__(message)
        self.generation = generation
        self.result = result


def as_key(key: Any) -> jax.Array:
    """A typed PRNG key from an int seed, a typed key, or raw ``uint32[2]`` key data."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return jax.random.key(int(key))
    arr = jnp.asarray(key)
    if jnp.issubdtype(arr.dtype, jax.dtypes.prng_key):
        return arr
    if arr.dtype == jnp.uint32 and arr.shape == (2,):
        return jax.random.wrap_key_data(arr)
    raise TypeError(f"key must be an int seed or a jax.random key, got {type(key).__name__} {getattr(arr, 'shape', '')}")


def resolve_devices(devices: Any) -> list:
    """``None`` -> all local devices; an int n -> the first n; or an explicit list of devices."""
    local = jax.local_devices()
    if devices is None:
        return list(local)
    if isinstance(devices, int) and not isinstance(devices, bool):
        if not 1 <= devices <= len(local):
            raise ValueError(f"devices={devices}, but this process sees {len(local)} local device(s): {local}")
        return list(local[:devices])
    devices = list(devices)
    if not devices:
        raise ValueError("devices must name at least one device")
    return devices


class Trainer:
    """Builds the compiled pieces of an ES run for one (policy, env, optimizer, config).

    Most users call :func:`train`; the trainer's pieces are what distributed
    workers and sweeps reuse: :meth:`init_state`, :meth:`generation_step`
    (compiled as :attr:`step`), :meth:`evaluate_chunks` and :meth:`apply_fitness`.

    Args:
        policy: a Flax module (``jes.GRUPolicy``, ``jes.MLPPolicy`` or your own).
        env: a gymnax env id, env object, or ``(env, env_params)``.
        optimizer: an optimizer name or an optax ``GradientTransformation``.
        config: the :class:`ESConfig`.
        env_params: gymnax env params overriding the env's defaults.
        devices: local devices to shard the population over (``None``: all).
        rollout_min_batch: smallest batch the rollout compacts still-running episodes into
            (see :func:`jes.rollout.run_episodes`). Purely a speed/compile-time trade-off:
            results are bit-identical for any value (tested on CPU; other backends may pick
            other kernels for other batch shapes). 16 runs long-tailed generations 1.1-1.3x
            faster than 32 but compiles ~1 s longer (benchmarks/README.md).
    """

    def __init__(
        self,
        policy: nn.Module,
        env: Any,
        optimizer: Any = "adam",
        config: ESConfig | None = None,
        env_params: Any = None,
        devices: Any = None,
        rollout_min_batch: int = 32,
    ):
        self.config = config = config or ESConfig()
        if isinstance(rollout_min_batch, bool) or not isinstance(rollout_min_batch, int) or rollout_min_batch < 1:
            raise ValueError(f"rollout_min_batch must be a positive integer, got {rollout_min_batch!r}")
        self.rollout_min_batch = rollout_min_batch
        self.spec: EnvSpec = make_env(env, env_params, config.max_episode_steps)
        self.policy = fit_to_outputs(policy, self.spec.num_outputs)
        self.fns = PolicyFns(self.policy, self.spec.obs_shape)
        self.optimizer = make_optimizer(optimizer, config.learning_rate)
        self.optimizer_name = optimizer if isinstance(optimizer, str) else type(optimizer).__name__

        variables = self._init_variables(jax.random.key(0), abstract=True)
        template = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), variables)
        flat, self.unravel = ravel_pytree(template)
        if flat.dtype != jnp.float32:
            raise TypeError(f"policy parameters must be float32, got {flat.dtype}")
        self.num_params = int(flat.shape[0])

        self.devices = resolve_devices(devices)
        self.mesh = Mesh(np.array(self.devices), (AXIS,))
        self.chunk_size = config.resolved_chunk_size
        self.num_chunks = math.ceil(config.num_members / self.chunk_size)
        per_device = math.ceil(self.num_chunks / len(self.devices))
        self.padded_chunks = per_device * len(self.devices)
        self.replicated = NamedSharding(self.mesh, P())
        self.step = jax.jit(self.generation_step)
        self._compiled = None
        self._compile_time = 0.0

    # ----------------------------------------------------------------- setup
    def _init_variables(self, key: jax.Array, abstract: bool = False) -> Any:
        init = jax.eval_shape if abstract else (lambda f, *a: f(*a))
        try:
            variables = init(self.fns.init, key)
            carry = self.fns.initial_carry()
            obs = jax.ShapeDtypeStruct(self.spec.obs_shape, jnp.float32)
            _, out = jax.eval_shape(self.fns.apply, variables, carry, obs)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"policy {type(self.policy).__name__} cannot be applied to one observation of env "
                f"{self.spec.name!r} (shape {self.spec.obs_shape}): {err}"
            ) from err
        expected = (self.spec.num_outputs,)
        if tuple(out.shape) != expected:
            kind = "one logit per discrete action" if self.spec.discrete else f"one value per action dimension {self.spec.action_shape}"
            raise ValueError(
                f"policy {type(self.policy).__name__} outputs shape {tuple(out.shape)} but env {self.spec.name!r} needs "
                f"{expected} ({kind}); set the policy's output size to {self.spec.num_outputs} "
                f"(jes.GRUPolicy/MLPPolicy do this when num_outputs=None)"
            )
        return variables

    def init_state(self, key: Any = 0) -> TrainState:
        """Fresh training state: policy init from ``split(run_key)[0]``, ES streams from ``split(run_key)[1]``."""
        run_key = as_key(key)
        init_key, es_key = jax.random.split(run_key)
        flat, _ = ravel_pytree(self._init_variables(init_key))
        noise_std = self.config.noise_std
        base_std = 0.0 if callable(noise_std) else float(noise_std)
        zeros = jnp.zeros(self.spec.obs_shape, jnp.float32)
        return self.place(TrainState(
            params=flat,
            opt_state=self.optimizer.init(flat),
            generation=jnp.int32(0),
            es_key=es_key,
            noise_std=jnp.float32(base_std),
            obs_count=jnp.float32(_OBS_EPS),
            obs_sum=zeros,
            obs_sumsq=jnp.full(self.spec.obs_shape, _OBS_EPS, jnp.float32),
        ))

    def place(self, state: TrainState) -> TrainState:
        """Put a state (fresh, restored, or from another process) replicated on this trainer's devices.

        The compiled step returns replicated state; feeding it the same placement keeps it at one compilation.
        """
        return jax.device_put(state, self.replicated)

    def params_tree(self, flat_params: jax.Array) -> Any:
        """Flax variables (usable with ``policy.apply``) from a flat parameter vector."""
        return self.unravel(jnp.asarray(flat_params, jnp.float32))

    # -------------------------------------------------------- device pieces
    def noise_std(self, state: TrainState) -> jax.Array:
        """Sigma of the state's generation (schedule or constant)."""
        schedule = self.config.noise_std
        if callable(schedule):
            return jnp.asarray(schedule(state.generation), jnp.float32)
        return state.noise_std

    def obs_norm(self, state: TrainState) -> tuple[jax.Array, jax.Array] | None:
        """``(mean, std)`` of observations so far, or ``None`` without normalisation."""
        if not self.config.normalize_observations:
            return None
        mean = state.obs_sum / state.obs_count
        var = state.obs_sumsq / state.obs_count - mean * mean
        return mean, jnp.sqrt(jnp.maximum(var, _OBS_EPS))

    def evaluate_chunk(self, state: TrainState, chunk: jax.Array) -> tuple[jax.Array, ...]:
        """Evaluate members ``[chunk*C, (chunk+1)*C)`` of the state's generation.

        Returns:
            ``(fitness [C], env_steps [], obs_sum [obs], obs_sumsq [obs])``; fitness of
            padding members (index >= num_members) is 0.
        """
        cfg, size = self.config, self.chunk_size
        gen_key = strategy.generation_key(state.es_key, state.generation)
        start = chunk * size
        members = start + jnp.arange(size, dtype=jnp.int32)
        active = members < cfg.num_members
        noise = strategy.chunk_noise(gen_key, start, size, self.num_params, cfg.antithetic)
        flat = state.params[None, :] + self.noise_std(state) * noise
        params = jax.vmap(self.unravel)(flat)
        keys = strategy.episode_keys(gen_key, members, cfg.episodes_per_member, cfg.antithetic)
        out = run_episodes(
            self.fns, self.spec, params, keys, active,
            obs_norm=self.obs_norm(state), collect_obs_stats=cfg.normalize_observations,
            min_slots=self.rollout_min_batch,
        )
        fitness = jnp.where(active, out.returns.mean(axis=1), 0.0)
        return fitness, out.steps.sum(), out.obs_sum, out.obs_sumsq

    def evaluate_chunks(self, state: TrainState, chunks: jax.Array) -> tuple[jax.Array, ...]:
        """Evaluate several chunks one after another (``lax.map``): the unit of work of a device or worker.

        Returns:
            ``(fitness [k, C], env_steps [k], obs_sum [k, obs], obs_sumsq [k, obs])``.
        """
        return jax.lax.map(lambda c: self.evaluate_chunk(state, c), chunks)

    def chunk_partials(self, state: TrainState, chunks: jax.Array, weights: jax.Array) -> jax.Array:
        """``sum_i w_i eps_i`` for each chunk, ``[k, num_params]``; ``weights`` is ``[k, C]``."""
        gen_key = strategy.generation_key(state.es_key, state.generation)

        def one(args):
            chunk, w = args
            return strategy.chunk_weighted_noise(gen_key, chunk * self.chunk_size, w, self.num_params, self.config.antithetic)

        return jax.lax.map(one, (chunks, weights))

    def shaped_weights(self, fitness: jax.Array) -> jax.Array:
        """Shaped fitness padded to whole chunks (device padding included), ``[padded_chunks, C]``, zeros for padding."""
        n = self.config.num_members
        safe = jnp.where(jnp.isfinite(fitness), fitness, 0.0)
        shaped = strategy.shape_fitness(safe, self.config.fitness_shaping)
        padded = jnp.zeros(self.padded_chunks * self.chunk_size, jnp.float32).at[:n].set(shaped)
        return padded.reshape(self.padded_chunks, self.chunk_size)

    def update_from_partials(
        self, state: TrainState, fitness: jax.Array, partials: jax.Array, env_steps: jax.Array,
        obs_sum: jax.Array, obs_sumsq: jax.Array,
    ) -> tuple[TrainState, dict]:
        """Sum the chunk partials in chunk order, take the optax step, and build the metrics.

        A generation with a non-finite fitness leaves the state unchanged and
        reports the first bad member in ``metrics["bad_member"]`` (else -1); one whose
        update or new parameters are not finite leaves it unchanged too and sets
        ``metrics["bad_update"]``.
        """
        cfg = self.config
        sigma = self.noise_std(state)
        total = self.reduce_chunks(partials)
        grad = strategy.es_gradient(total, cfg.num_members, sigma)
        loss_grad = -grad + cfg.weight_decay * state.params
        updates, opt_state = self.optimizer.update(loss_grad, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)

        bad = ~jnp.isfinite(fitness)
        bad_fitness = bad.any()
        # Finite fitness can still give a non-finite step (a sigma schedule reaching 0, overflowing raw
        # fitness): never apply it either.
        bad_update = ~bad_fitness & ~(jnp.isfinite(updates).all() & jnp.isfinite(params).all())
        any_bad = bad_fitness | bad_update
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(any_bad, o, n), new, old)
        obs_count = state.obs_count + env_steps.astype(jnp.float32)
        new_state = state.replace(
            params=keep(params, state.params),
            opt_state=keep(opt_state, state.opt_state),
            generation=jnp.where(any_bad, state.generation, state.generation + 1),
        )
        if cfg.normalize_observations:
            new_state = new_state.replace(
                obs_count=keep(obs_count, state.obs_count),
                obs_sum=keep(state.obs_sum + obs_sum, state.obs_sum),
                obs_sumsq=keep(state.obs_sumsq + obs_sumsq, state.obs_sumsq),
            )
        lr = current_learning_rate(opt_state)
        safe = jnp.where(bad, jnp.nan, fitness)
        metrics = {
            "pop_mean": jnp.nanmean(safe),
            "pop_max": jnp.nanmax(safe),
            "pop_min": jnp.nanmin(safe),
            "pop_std": jnp.nanstd(safe),
            "env_steps": env_steps,
            "noise_std": sigma,
            "learning_rate": jnp.float32(jnp.nan) if lr is None else jnp.asarray(lr, jnp.float32),
            "grad_norm": jnp.linalg.norm(grad),
            "update_norm": jnp.linalg.norm(updates),
            "param_norm": jnp.linalg.norm(new_state.params),
            "bad_member": jnp.where(bad_fitness, jnp.argmax(bad), -1).astype(jnp.int32),
            "bad_update": bad_update,
        }
        return new_state, metrics

    def reduce_chunks(self, values: jax.Array) -> jax.Array:
        """Sum per-chunk values ``[k, ...]`` one chunk after another, in chunk order.

        A fixed sequential order makes the float32 sum the same wherever the chunks were computed.
        """
        return jax.lax.scan(lambda acc, v: (acc + v, None), jnp.zeros_like(values[0]), values)[0]

    def apply_fitness(self, state: TrainState, fitness: jax.Array, env_steps: jax.Array | int = 0,
                      obs_sum: jax.Array | None = None, obs_sumsq: jax.Array | None = None) -> tuple[TrainState, dict]:
        """The ES update from a full fitness vector ``[num_members]``.

        ``env_steps``, ``obs_sum`` and ``obs_sumsq`` are generation totals (see
        :meth:`apply_chunk_results` to reduce per-chunk results exactly as the fused step does).
        """
        zeros = jnp.zeros(self.spec.obs_shape, jnp.float32)
        weights = self.shaped_weights(fitness)[: self.num_chunks]
        partials = self.chunk_partials(state, jnp.arange(self.num_chunks, dtype=jnp.int32), weights)
        return self.update_from_partials(
            state, fitness, partials, jnp.asarray(env_steps, jnp.int32),
            zeros if obs_sum is None else obs_sum, zeros if obs_sumsq is None else obs_sumsq,
        )

    def apply_chunk_results(self, state: TrainState, fitness: jax.Array, env_steps: jax.Array,
                            obs_sum: jax.Array, obs_sumsq: jax.Array) -> tuple[TrainState, dict]:
        """The update from every chunk's results, as :meth:`evaluate_chunks` returns them for chunks ``0..num_chunks-1``.

        This is what a distributed master runs once all chunks are in; it is bit-identical to
        :meth:`generation_step` for the same generation, however the chunks were spread.

        Args:
            fitness: ``[num_chunks, C]``; env_steps: ``[num_chunks]``; obs_sum, obs_sumsq: ``[num_chunks, *obs_shape]``.
        """
        flat = fitness.reshape(-1)[: self.config.num_members]
        return self.apply_fitness(state, flat, self.reduce_chunks(env_steps), self.reduce_chunks(obs_sum),
                                  self.reduce_chunks(obs_sumsq))

    def evaluate_centre(self, state: TrainState, num_episodes: int | None = None, key: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """Returns and steps of the unperturbed centre on fresh episodes, each ``[num_episodes]``."""
        num_episodes = num_episodes or self.config.eval_episodes
        if key is None:
            key = strategy.generation_key(state.es_key, state.generation)
        keys = strategy.centre_episode_keys(key, num_episodes)[None]
        params = jax.tree.map(lambda x: x[None], self.unravel(state.params))
        out = run_episodes(self.fns, self.spec, params, keys, jnp.ones((1,), bool), obs_norm=self.obs_norm(state),
                           min_slots=self.rollout_min_batch)
        return out.returns[0], out.steps[0]

    def generation_step(self, state: TrainState, evaluate_centre: jax.Array) -> tuple[TrainState, dict]:
        """One whole generation: sample, evaluate every member, shape, update, maybe evaluate the centre.

        This is the function jes compiles (``self.step``); ``evaluate_centre`` is a
        traced bool so turning the centre evaluation on or off never recompiles.
        """
        devices = len(self.devices)
        per_device = self.padded_chunks // devices

        def sharded(state, chunk_ids):
            real = self.num_chunks  # device padding chunks are dropped before any reduction
            gather = lambda x: jax.lax.all_gather(x, AXIS, tiled=True)[:real]
            fitness, steps, obs_sum, obs_sumsq = self.evaluate_chunks(state, chunk_ids)
            fitness_all = gather(fitness).reshape(-1)[: self.config.num_members]
            weights = self.shaped_weights(fitness_all)
            index = jax.lax.axis_index(AXIS)
            local_weights = jax.lax.dynamic_slice_in_dim(weights, index * per_device, per_device)
            partials = gather(self.chunk_partials(state, chunk_ids, local_weights))
            # Per-chunk values gathered in chunk order, then reduced sequentially: device count cannot change the sums.
            return self.update_from_partials(
                state, fitness_all, partials, self.reduce_chunks(gather(steps)),
                self.reduce_chunks(gather(obs_sum)), self.reduce_chunks(gather(obs_sumsq)),
            )

        chunk_ids = jnp.arange(self.padded_chunks, dtype=jnp.int32)
        chunk_ids = jax.lax.with_sharding_constraint(chunk_ids, NamedSharding(self.mesh, P(AXIS)))
        new_state, metrics = _shard_map(
            sharded, mesh=self.mesh, in_specs=(P(), P(AXIS)), out_specs=(P(), P()), check_vma=False,
        )(state, chunk_ids)

        def centre(s):
            returns, steps = self.evaluate_centre(s)
            return returns.mean(), steps.sum()

        centre_return, centre_steps = jax.lax.cond(
            evaluate_centre & (metrics["bad_member"] < 0) & ~metrics["bad_update"],
            centre,
            lambda s: (jnp.float32(jnp.nan), jnp.int32(0)),
            new_state,
        )
        metrics = dict(metrics, centre_return=centre_return, centre_steps=centre_steps)
        return new_state, metrics

    def compiled_step(self, state: TrainState) -> tuple[Callable, float]:
        """The generation step compiled ahead of time for ``state``'s shapes, and the seconds it took.

        Compiled once per trainer and reused by every run (seeds, resumes) it serves.
        """
        if self._compiled is None:
            t0 = time.perf_counter()
            self._compiled = self.step.lower(state, jnp.bool_(True)).compile()
            self._compile_time = time.perf_counter() - t0
        return self._compiled, self._compile_time

    def compile_count(self) -> int:
        """How many programs ``self.step`` has compiled (1 after any number of generations)."""
        return self.step._cache_size()


@dataclasses.dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        params: final centre as Flax variables, usable with ``result.policy.apply``.
        flat_params: the same as one numpy vector.
        policy: the policy module as trained (output size filled in).
        history: per-generation arrays: ``generation``, ``pop_mean``, ``pop_max``, ``pop_min``,
            ``pop_std``, ``centre_return`` (NaN where not evaluated), ``wall_time`` (s since start,
            compile excluded), ``generation_time``, ``env_steps`` (cumulative), ``noise_std``,
            ``learning_rate``, ``grad_norm``, ``update_norm``, ``param_norm``.
        config: the :class:`ESConfig`.
        key: raw ``uint32`` data of the run key (``jes.train(..., key=result.key)`` reproduces the run).
        env_name: the environment id.
        optimizer: the optimizer's name (or type name).
        solved_generation: first generation (1-based) whose centre evaluation reached the
            env's solved return, or ``None``.
        compile_time: seconds spent compiling the generation step.
        wall_time: seconds of the whole run including compile.
        state: the final :class:`TrainState` (to continue training).
        trainer: the :class:`Trainer` that ran it.
    """

    params: Any
    flat_params: np.ndarray
    policy: nn.Module
    history: dict
    config: ESConfig
    key: np.ndarray
    env_name: str
    optimizer: str
    solved_generation: int | None
    compile_time: float
    wall_time: float
    state: TrainState
    trainer: Trainer

    @property
    def final_centre_return(self) -> float:
        """The last centre evaluation's mean return (NaN if none ran)."""
        scores = self.history["centre_return"]
        finite = scores[np.isfinite(scores)]
        return float(finite[-1]) if finite.size else float("nan")

    def evaluate(self, num_episodes: int = 64, key: Any = 12345) -> np.ndarray:
        """Returns of the final centre on ``num_episodes`` fresh episodes drawn from ``key``."""
        fn = jax.jit(self.trainer.evaluate_centre, static_argnums=1)
        returns, _ = fn(self.state, num_episodes, as_key(key))
        return np.asarray(returns)

    def summary(self) -> str:
        """One readable line about the run."""
        solved = f"solved at generation {self.solved_generation}" if self.solved_generation else "not solved"
        return (
            f"{self.env_name} with {self.optimizer}: {len(self.history['generation'])} generations, "
            f"centre return {self.final_centre_return:.1f}, {solved}; "
            f"{self.trainer.num_params} params, {self.wall_time:.1f}s wall ({self.compile_time:.1f}s compile)"
        )


HISTORY_KEYS = (
    "generation", "pop_mean", "pop_max", "pop_min", "pop_std", "centre_return", "wall_time",
    "generation_time", "env_steps", "noise_std", "learning_rate", "grad_norm", "update_norm", "param_norm",
)

Callback = Callable[[dict], Any]


def train(
    policy: nn.Module,
    env: Any,
    optimizer: Any = "adam",
    *,
    key: Any = 0,
    config: ESConfig | None = None,
    env_params: Any = None,
    devices: Any = None,
    callbacks: Sequence[Callback] = (),
    log_dir: str | None = "runs/<auto>",
    progress: bool | None = None,
    checkpoint_path: str | None = "<log_dir>/checkpoint.ckpt",
    checkpoint_every: int = 10,
    resume: str | None = None,
    master: str | None = None,
    secret: bytes | str | None = None,
    rollout_min_batch: int = 32,
    **overrides: Any,
) -> TrainResult:
    """Train ``policy`` on ``env`` with OpenAI-ES.

    Example:
        >>> result = jes.train(jes.GRUPolicy(hidden=5, layers=2), "CartPole-v1", "novograd")
        >>> result.params  # Flax variables for result.policy.apply

    Args:
        policy: a Flax module mapping one observation to action outputs.
        env: a gymnax env id (``"CartPole-v1"``), env object, or ``(env, env_params)``.
        optimizer: ``"adam"``, ``"adabelief"``, ``"novograd"``, ``"radam"``, ``"amsgrad"``,
            ``"sgd"``, or any optax ``GradientTransformation``.
        key: int seed or ``jax.random`` key; same key and config give bit-identical results.
        config: an :class:`ESConfig`; keyword ``overrides`` (e.g. ``num_members=256``) replace its fields.
        env_params: gymnax env params.
        devices: local devices to shard the population over (``None``: all local devices).
        callbacks: functions called with each generation's metrics dict (host side); see :mod:`jes.logging`.
        log_dir: TensorBoard directory; the default is ``runs/<env>-<policy>-<optimizer>-<time>``;
            ``None`` turns TensorBoard logging off.
        progress: tqdm progress bar; ``None`` shows it only when stdout is a terminal.
        checkpoint_path: checkpoint file, written every ``checkpoint_every`` generations, at the end,
            and on Ctrl-C. The default is ``checkpoint.ckpt`` in ``log_dir`` (the ``resume`` file when
            resuming); ``None`` turns checkpoints off.
        checkpoint_every: generations between checkpoints (0: only at the end and on Ctrl-C).
        resume: a checkpoint to continue from; the run then ends bit-identical to one never
            interrupted. The run key comes from the checkpoint (``key`` is ignored); the policy, env,
            optimizer and config must match it (``num_generations`` may grow).
        master: listen address (``":5555"``, ``"0.0.0.0:5555"``) to spread each generation over
            ``jes-worker --master HOST:PORT`` processes (:mod:`jes.distributed`); the result is
            bit-identical to a local run. The policy, env, optimizer (by name) and config must be
            describable as plain data.
        secret: shared HMAC key for ``master`` (``None``: the ``JES_SECRET`` environment variable).
        rollout_min_batch: see :class:`Trainer` (a speed/compile-time knob; results do not depend on it).

    Returns:
        A :class:`TrainResult`.
    """
    from jes import checkpoint as ckpt, logging as jes_logging  # host-side modules that import this one

    config = (config or ESConfig()).replace(**overrides) if overrides else (config or ESConfig())
    trainer = Trainer(policy, env, optimizer, config, env_params=env_params, devices=devices,
                      rollout_min_batch=rollout_min_batch)
    history = None
    if resume is not None:
        restored = ckpt.read(resume)
        state, history, key = restored.restore_state(trainer), restored.history, restored.key
    else:
        state = trainer.init_state(key)
    if log_dir == "runs/<auto>":
        name = jes_logging.default_run_name(trainer.spec.name, type(trainer.policy).__name__, trainer.optimizer_name)
        log_dir = jes_logging.unique_dir(os.path.join("runs", name))
    if checkpoint_path == "<log_dir>/checkpoint.ckpt":
        checkpoint_path = resume if resume is not None else (
            os.path.join(log_dir, "checkpoint.ckpt") if log_dir is not None else None)
    loggers = [jes_logging.ProgressBar(config.num_generations, int(state.generation), enabled=progress)]
    if log_dir is not None:
        hparams = dict(config.to_dict(), env=trainer.spec.name, policy=type(trainer.policy).__name__,
                       optimizer=trainer.optimizer_name, num_params=trainer.num_params,
                       key=str(np.asarray(jax.random.key_data(as_key(key))).tolist()))
        loggers.append(jes_logging.TensorBoardLogger(log_dir, hparams))
    try:
        if master is not None:
            from jes.distributed.master import Master  # host-side module that imports this one
            with Master(trainer, master, secret=secret, env=env, optimizer=optimizer, env_params=env_params) as server:
                return run(trainer, state, key=key, callbacks=[*loggers, *callbacks], history=history,
                           checkpoint_path=checkpoint_path, checkpoint_every=checkpoint_every, step_fn=server.step)
        return run(trainer, state, key=key, callbacks=[*loggers, *callbacks], history=history,
                   checkpoint_path=checkpoint_path, checkpoint_every=checkpoint_every)
    finally:
        jes_logging.close_all(loggers)


StepFn = Callable[[TrainState, bool], "tuple[TrainState, dict]"]


def run(trainer: Trainer, state: TrainState, *, key: Any = 0, callbacks: Iterable[Callback] = (),
        history: dict | None = None, num_generations: int | None = None, step_fn: StepFn | None = None,
        checkpoint_path: str | None = None, checkpoint_every: int = 0) -> TrainResult:
    """Host loop: call the generation step until ``num_generations`` (default: config's) are done.

    Args:
        trainer: the trainer whose compiled step runs.
        state: the state to continue from (fresh, or restored).
        key: the run key (recorded in the result).
        callbacks: called with each generation's metrics record.
        history: history of earlier generations, when continuing a run.
        num_generations: total generations (including those already in ``state``).
        step_fn: replaces the local compiled step, ``(state, evaluate_centre) -> (state, metrics)``
            with the same metrics; a distributed master farms the population out through it.
        checkpoint_path: where to save checkpoints (``jes.checkpoint``): every ``checkpoint_every``
            generations (0: never periodically), after the last generation, and on KeyboardInterrupt
            (then re-raised). ``None``: no checkpoints.
    """
    if checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be >= 0, got {checkpoint_every}")

    def save_checkpoint():
        from jes import checkpoint  # host-side module that imports this one
        checkpoint.save(checkpoint_path, trainer, state, history, key)

    cfg = trainer.config
    total = cfg.num_generations if num_generations is None else num_generations
    history = {k: list(v) for k, v in (history or {}).items()} or {k: [] for k in HISTORY_KEYS}
    start_gen = int(state.generation)
    env_steps = int(history["env_steps"][-1]) if history.get("env_steps") else 0
    solved_return = cfg.stop_at_return if cfg.stop_at_return is not None else trainer.spec.solved_return
    solved_generation = _first_solved(history, solved_return)
    if solved_generation is not None and cfg.stop_at_return is not None:
        total = start_gen  # a resumed run that had already stopped at its target stays stopped
    t_start = time.perf_counter()

    state = trainer.place(state)
    if step_fn is None:
        compiled, compile_time = trainer.compiled_step(state)
        step_fn = lambda s, evaluate: compiled(s, jnp.bool_(evaluate))
    else:
        compile_time = 0.0
    loop_start = time.perf_counter()
    saved_generation = None
    try:
        for gen in range(start_gen, total):
            last = gen + 1 == total
            evaluate = last or (cfg.eval_every > 0 and (gen + 1) % cfg.eval_every == 0)
            t_gen = time.perf_counter()
            new_state, metrics = step_fn(state, evaluate)
            metrics = {k: v.item() for k, v in jax.device_get(metrics).items()}
            if metrics["bad_member"] >= 0 or metrics["bad_update"]:
                # Keep what was achieved: the last good state goes to the checkpoint and into the error.
                if checkpoint_path is not None:
                    save_checkpoint()
                partial = _result(trainer, state, history, key, solved_generation, compile_time, t_start)
                if metrics["bad_member"] >= 0:
                    member = metrics["bad_member"]
                    raise NonFiniteFitnessError(
                        f"member {member} of generation {gen + 1} has non-finite fitness (NaN or inf); the update was "
                        f"not applied. Check the env's rewards and the policy's outputs (a too-large noise_std or "
                        f"learning rate can overflow them). error.result holds the {gen} generation(s) completed.",
                        generation=gen + 1, member=member, result=partial,
                    )
                raise NonFiniteUpdateError(
                    f"the ES update of generation {gen + 1} is not finite (noise_std={metrics['noise_std']:g}, "
                    f"learning_rate={metrics['learning_rate']:g}) and was not applied. A noise_std schedule that reaches "
                    f"0, a too-large learning rate, or raw fitness that overflows cause this. error.result holds the "
                    f"{gen} generation(s) completed.",
                    generation=gen + 1, result=partial,
                )
            now = time.perf_counter()
            generation_steps = int(metrics["env_steps"]) + int(metrics["centre_steps"])
            env_steps += generation_steps
            record = dict(metrics, generation=gen + 1, wall_time=now - loop_start, generation_time=now - t_gen, env_steps=env_steps,
                          env_steps_per_second=generation_steps / max(now - t_gen, 1e-9))
            for k in HISTORY_KEYS:
                history[k].append(record[k])
            state = new_state  # after the history row, so an interrupt never leaves history behind the state
            for callback in callbacks:
                callback(record)
            if checkpoint_path is not None and checkpoint_every and (gen + 1) % checkpoint_every == 0:
                save_checkpoint()
                saved_generation = gen + 1
            if solved_generation is None and solved_return is not None and metrics["centre_return"] >= solved_return:
                solved_generation = gen + 1
                if cfg.stop_at_return is not None:
                    break
    except KeyboardInterrupt:
        if checkpoint_path is not None:
            save_checkpoint()
        raise
    if checkpoint_path is not None and saved_generation != int(state.generation):
        save_checkpoint()
    return _result(trainer, state, history, key, solved_generation, compile_time, t_start)


def _first_solved(history: dict, solved_return: float | None) -> int | None:
    """First generation in ``history`` whose centre return reached ``solved_return``."""
    if solved_return is None:
        return None
    for generation, score in zip(history.get("generation", []), history.get("centre_return", [])):
        if score >= solved_return:
            return int(generation)
    return None


def _result(trainer, state, history, key, solved_generation, compile_time, t_start) -> TrainResult:
    flat = np.asarray(jax.device_get(state.params))
    return TrainResult(
        params=trainer.params_tree(flat),
        flat_params=flat,
        policy=trainer.policy,
        history={k: np.asarray(v) for k, v in history.items()},
        config=trainer.config,
        key=np.asarray(jax.random.key_data(as_key(key))),
        env_name=trainer.spec.name,
        optimizer=trainer.optimizer_name,
        solved_generation=solved_generation,
        compile_time=compile_time,
        wall_time=time.perf_counter() - t_start,
        state=state,
        trainer=trainer,
    )
