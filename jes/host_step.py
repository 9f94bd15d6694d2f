"""A host env's generation: members sampled and the update applied by compiled programs, episodes stepped here.

A host env (``spec.host``: a Python simulator, :mod:`jes.envs.gymnasium`) cannot run inside the compiled
generation step. Its generation is: sample each chunk's members (compiled), step the envs on the host with
one jitted policy step per env step (:mod:`jes.host_rollout`), then the compiled update from the per-chunk
results (:meth:`jes.generation.Generation.apply_chunk_results`), bit-identical whoever evaluated which chunk.

:class:`HostGeneration` is that generation for one :class:`~jes.generation.Trainer`; :func:`programs` gives
whoever evaluates chunks (this process, a master, a worker) the chunk and centre programs of any env, jitted
for compiled envs and host rollouts for host envs.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jes import host_rollout
from jes.cpu import compiler_options
from jes.generation import ChunkResults, Trainer, TrainState, fetch, positive_count
from jes.rollout import batch_act
from jes.strategies import noise
from jes.threefry import UnrolledJit


class HostGeneration:
    """A host env's chunk evaluation, centre evaluation and generation for ``trainer`` (its jitted pieces and its
    env instances, built once and reused).

    Args:
        trainer: a :class:`~jes.generation.Trainer` whose env is a host env (``trainer.spec.host``).
    """

    def __init__(self, trainer: Trainer):
        if not trainer.spec.host:
            raise TypeError(f"env {trainer.spec.name!r} is compiled, not a host env")
        self.trainer = trainer
        epm = trainer.config.episodes_per_member

        def prepare(state, chunk):
            flat, members, active = trainer.sample_chunk(state, chunk)
            gen_key = noise.generation_key(state.es_key, state.generation)
            keys = noise.episode_keys(gen_key, members, epm, trainer.antithetic).reshape(-1)
            params = trainer.member_fns(state.params).slot_params(flat, epm)
            return params, host_rollout.episode_seeds(keys), jnp.repeat(~active, epm), active

        def prepare_centre(state, key, num_episodes):
            key = noise.generation_key(state.es_key, state.generation) if key is None else key
            keys = noise.centre_episode_keys(key, num_episodes)
            params = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_episodes,) + x.shape), trainer.unravel(state.params))
            return params, host_rollout.episode_seeds(keys)

        def member_step(centre, params, carry, obs, scale):
            member_fns = trainer.member_fns(centre)
            forward = getattr(member_fns, "apply_batch", None) or jax.vmap(member_fns.apply)
            return batch_act(forward, trainer.spec, params, carry, obs, scale)

        # Threefry unrolled (the same bits: jes.threefry), and the step's XLA options (which can change bits)
        options = trainer.step_compiler_options
        self._prepare = UnrolledJit(prepare, compiler_options=options)
        self._prepare_centre = jax.jit(prepare_centre, static_argnums=2, compiler_options=options)
        self._member_step = jax.jit(member_step, compiler_options=options)
        # The centre's normaliser and policy step: the very programs TrainedPolicy.evaluate runs (jes's options for
        # the plain policy, not the perturbation's), so result.evaluate, policy files and jes eval give these bits
        self._centre = host_rollout.CentreEvaluator(trainer.fns.apply, trainer.spec, compiler_options(trainer.devices))
        self._scale = jax.jit(trainer.obs_scale, compiler_options=options)
        self._apply = UnrolledJit(lambda s, *r: trainer.apply_chunk_results(s, ChunkResults(*r)), compiler_options=options)
        self.pool = host_rollout.HostEnvPool(trainer.spec.env)

    def evaluate_chunks(self, state: TrainState, chunk_ids: Any) -> tuple[np.ndarray, ...]:
        """Chunks ``chunk_ids`` of the population evaluated on the host, all their slots stepped together: numpy
        ``(fitness [k, C], env_steps [k], obs_sum [k, *obs], obs_sumsq [k, *obs])``, as ``Trainer.evaluate_chunks``.

        Raises:
            jes.host_rollout.HostEnvError: an env failed (the message names env, member and generation).
        """
        trainer = self.trainer
        chunks = [int(c) for c in np.asarray(chunk_ids).reshape(-1)]
        epm, size = trainer.config.episodes_per_member, trainer.chunk_size
        slots = size * epm
        generation = int(fetch(state.generation)) + 1  # 1-based, as in the history and errors
        prepared = [self._prepare(state, np.int32(c)) for c in chunks]
        scale = self._scale(state)
        centre = state.params
        if trainer.ctx.perturbation is None:
            # Full-rank members: each slot has its own parameters and the vmapped step's per-slot bits do not depend
            # on the batch (as the compiled rollout's compaction relies on), so all chunks go in one call.
            params = jax.tree.map(lambda *xs: jax.device_put(np.concatenate([np.asarray(x) for x in xs])),
                                  *[p[0] for p in prepared]) if len(chunks) > 1 else prepared[0][0]
            groups = [(params, slots * len(chunks))]
        else:
            # A structured perturbation's shared GEMM depends on its batch: one call per chunk, its own shape.
            groups = [(p[0], slots) for p in prepared]
        groups = [(lambda c, o, p=p: self._member_step(centre, p, c, o, scale), n) for p, n in groups]
        seeds = np.concatenate([np.asarray(p[1]) for p in prepared])
        done = np.concatenate([np.asarray(p[2]) for p in prepared])

        def label(slot):
            chunk, within = divmod(slot, slots)
            member, episode = divmod(within, epm)
            return f"member {chunks[chunk] * size + member} (episode {episode}) of generation {generation}"

        out = host_rollout.run_host_slots(trainer.spec, self.pool, groups, trainer.fns.initial_carry(), seeds, done,
                                          trainer.normalize_observations, label)
        fitness, env_steps, obs_sum, obs_sumsq = [], [], [], []
        zeros = np.zeros(trainer.obs_shape, np.float32)
        for k, p in enumerate(prepared):
            rows = slice(k * slots, (k + 1) * slots)
            returns = out["returns"][rows].reshape(size, epm)
            fitness.append(np.where(np.asarray(p[3]), returns.mean(axis=1, dtype=np.float32), np.float32(0)))
            env_steps.append(np.int32(out["steps"][rows].sum()))
            if trainer.normalize_observations:  # chunk by chunk: the same shapes, the same numpy sums, wherever it ran
                obs_sum.append(np.add.reduce(np.ascontiguousarray(out["obs_sum"][rows]), axis=0))
                obs_sumsq.append(np.add.reduce(np.ascontiguousarray(out["obs_sumsq"][rows]), axis=0))
            else:
                obs_sum.append(zeros)
                obs_sumsq.append(zeros)
        return (np.stack(fitness).astype(np.float32), np.asarray(env_steps, np.int32), np.stack(obs_sum),
                np.stack(obs_sumsq))

    __call__ = evaluate_chunks  # called like the jitted chunk program

    def _cache_size(self) -> int:  # as the jitted chunk program's, for workers' compile checks
        return self._member_step._cache_size()

    def evaluate_centre(self, state: TrainState, num_episodes: int | None = None,
                        key: jax.Array | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``Trainer.evaluate_centre`` on the host: numpy returns and steps of the centre, each ``[num_episodes]``."""
        trainer = self.trainer
        num_episodes = (trainer.config.eval_episodes if num_episodes is None
                        else positive_count(num_episodes, "num_episodes"))
        params, seeds = self._prepare_centre(state, key, num_episodes)
        obs_stats = (state.obs_count, state.obs_sum, state.obs_sumsq) if trainer.normalize_observations else None
        generation = int(fetch(state.generation))
        return self._centre(self.pool, params, obs_stats, trainer.fns.initial_carry(), seeds,
                            lambda slot: f"centre episode {slot} after generation {generation}")

    def centre(self, state: TrainState) -> tuple[np.float32, np.int32]:
        """``(mean return, env steps)`` of the centre's ``eval_episodes`` episodes (the centre program)."""
        returns, steps = self.evaluate_centre(state)
        return np.float32(np.mean(returns, dtype=np.float32)), np.int32(steps.sum())

    def step(self, state: TrainState, evaluate_centre: Any, evaluate_population: Any = True) -> tuple[TrainState, dict]:
        """One generation in this process (a ``step_fn`` for :func:`jes.loop.run`): every chunk on the host, then
        the compiled update; the same results and metrics as a master spreading the chunks over workers."""
        state = self.trainer.place(state)
        if evaluate_centre:
            centre_return, centre_steps = self.centre(state)
        else:
            centre_return, centre_steps = np.float32(np.nan), np.int32(0)
        if not evaluate_population:
            return state, dict(centre_return=centre_return, centre_steps=centre_steps)
        results = self.evaluate_chunks(state, np.arange(self.trainer.num_chunks, dtype=np.int32))
        new_state, metrics = self._apply(state, *(jnp.asarray(r) for r in results))
        return new_state, dict(metrics, centre_return=centre_return, centre_steps=centre_steps)

    def close(self) -> None:
        """Close the env instances."""
        self.pool.close()


class Programs(NamedTuple):
    """What a device, a worker or a master evaluates a generation's chunks and centre with (:func:`programs`).

    Attributes:
        chunks: ``(state, chunk_ids [k], evaluate_centre, evaluate_population) -> (fitness [k, C], env_steps [k],
            obs_sum [k, *obs], obs_sumsq [k, *obs], centre_returns [k, S], centre_steps [k, S])``, the flags numpy
            bools (one program for both values): the chunks exactly as the local step evaluates them, each with its
            :attr:`centre_slots` centre episodes (live with ``evaluate_centre``, idle otherwise).
        centre: ``state -> (mean return, env steps)`` of the centre's ``eval_episodes`` episodes evaluated apart, as
            the step does when its chunks carry no centre (:attr:`centre_slots` 0).
        reduce: ``(centre_returns [num_chunks, S], centre_steps [num_chunks, S]) -> (mean return, env steps)``: the
            step's own reduction of every chunk's centre slots (``None`` when :attr:`centre_slots` is 0).
        centre_slots: ``S``, the centre episodes each chunk carries (:attr:`jes.Trainer.centre_slots`); 0 where the
            step evaluates the centre apart (host envs, structured perturbations, a subclass's own evaluation).
    """

    chunks: Callable[..., tuple]
    centre: Callable[[TrainState], tuple]
    reduce: Callable[[Any, Any], tuple] | None
    centre_slots: int


class _HostChunks:
    """A host env's chunk program with the signature of :attr:`Programs.chunks`: its centre runs apart (no slots)."""

    def __init__(self, host: HostGeneration):
        self.host = host

    def __call__(self, state: TrainState, chunk_ids: Any, evaluate_centre: Any = False,
                 evaluate_population: Any = True) -> tuple:
        results = self.host.evaluate_chunks(state, chunk_ids)
        none = np.zeros((results[0].shape[0], 0))
        return (*results, none.astype(np.float32), none.astype(np.int32))

    def _cache_size(self) -> int:  # as the jitted chunk program's, for workers' compile checks
        return self.host._cache_size()


def close_programs(programs: Programs | None) -> None:
    """Close the env instances a host env's :func:`programs` made (a MuJoCo renderer, an EnvPool's threads), where
    their owner (a master, a worker given another run) is done with them; compiled programs hold none."""
    if programs is not None and isinstance(programs.chunks, _HostChunks):
        programs.chunks.host.close()


def programs(trainer: Trainer) -> Programs:
    """The :class:`Programs` a device, a worker or a master evaluates with, for any env: jitted programs for
    compiled envs, one :class:`HostGeneration`'s host rollouts for host envs."""
    if trainer.spec.host:
        host = HostGeneration(trainer)
        return Programs(_HostChunks(host), host.centre, None, 0)
    # threefry unrolled (jes.threefry): the same bits as jax.jit's programs, full rank's draws faster; the step's
    # XLA options, which can change bits (XLA:CPU's fusion emitters)
    options = trainer.step_compiler_options
    if not (isinstance(trainer, Trainer) and trainer._centre_in_chunks()):
        # The step scores the centre apart (Trainer.centre_score), as here; its members' chunks run alone.
        def apart(s, c, evaluate_centre, evaluate_population):
            results = ChunkResults.as_tuple(trainer.evaluate_chunks(s, c))
            none = jnp.zeros((c.shape[0], 0), jnp.float32)
            return (*results, none, none.astype(jnp.int32))

        centre = UnrolledJit(lambda s: tuple(f(x) for f, x in zip((jnp.mean, jnp.sum), trainer.evaluate_centre(s))),
                             compiler_options=options)
        return Programs(UnrolledJit(apart, compiler_options=options), centre, None, 0)

    # The step runs centre episode j in slot j % S of chunk j // S, in the chunk's rollout batch, and reduces the
    # [chunks, S] buffer of their returns (Trainer.centre_from_chunks). A chunk evaluated here is the step's own
    # (Trainer.step_chunks, flags and all): its members' and centre slots' bits are the step's, since XLA:CPU's code
    # for a rollout depends on its batch's size and compaction on which episodes share it. The reduction is a
    # program of its own on the buffer (a mean fused with the episodes' program, or with padding, rounds otherwise).
    def chunks(s, c, evaluate_centre, evaluate_population):
        results, (returns, steps) = trainer.step_chunks(s, c, evaluate_centre, evaluate_population)
        return (*ChunkResults.as_tuple(results), returns, steps)

    reduce = UnrolledJit(lambda returns, steps: trainer.centre_from_chunks((returns, steps)), compiler_options=options)
    chunk_program = UnrolledJit(chunks, compiler_options=options)

    def centre(state):
        """The centre alone (a generation without members, outside a fleet): every chunk, members idle."""
        flags = np.bool_(True), np.bool_(False)
        # chunk ids placed as a master places its own (jnp): the program a master compiled for its chunks, reused
        outs = [chunk_program(state, jnp.array([c], jnp.int32), *flags) for c in range(trainer.num_chunks)]
        return reduce(*(np.concatenate([np.asarray(o[j]) for o in outs]) for j in (4, 5)))

    return Programs(chunk_program, centre, reduce, trainer.centre_slots)
