"""OpenAI-ES (Salimans et al. 2017) as pure functions: keys -> noise, fitness shaping, gradient.

Every random quantity is a pure function of (run key, generation, member):

    gen_key     = fold_in(es_key, generation)
    noise(i)    = sign(i) * normal(fold_in(fold_in(gen_key, NOISE), i // 2))   # antithetic
    episode(i,e)= fold_in(fold_in(fold_in(gen_key, EPISODES), i // 2), e)

so any device or host can regenerate member ``i``'s perturbation and
episodes from three numbers, with no noise table and no integer seeds.
Antithetic pairs (2p, 2p+1) share their episode keys (common random numbers),
so the pair's fitness difference measures the perturbation, not the env.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

# Stream tags folded into a generation key so noise, episodes and centre evaluation never share keys.
NOISE_STREAM = 0
EPISODE_STREAM = 1
CENTRE_STREAM = 2

FITNESS_SHAPINGS = ("centered_ranks", "nes_utilities", "z_score", "raw")


def generation_key(es_key: jax.Array, generation: jax.Array | int) -> jax.Array:
    """Key of one generation."""
    return jax.random.fold_in(es_key, generation)


def _noise_source(member: jax.Array, antithetic: bool) -> tuple[jax.Array, jax.Array]:
    """Index of the Gaussian draw a member uses, and its sign."""
    member = jnp.asarray(member, jnp.int32)
    if antithetic:
        return member // 2, jnp.where(member % 2 == 0, 1.0, -1.0).astype(jnp.float32)
    return member, jnp.float32(1.0)


def member_noise(gen_key: jax.Array, member: jax.Array | int, num_params: int, antithetic: bool = True) -> jax.Array:
    """Unit-variance perturbation of one member, shape ``[num_params]``.

    With ``antithetic``, members ``2p`` and ``2p+1`` get ``+eps_p`` and ``-eps_p``.
    """
    source, sign = _noise_source(member, antithetic)
    key = jax.random.fold_in(jax.random.fold_in(gen_key, NOISE_STREAM), source)
    return sign * jax.random.normal(key, (num_params,), jnp.float32)


def chunk_noise(gen_key: jax.Array, start: jax.Array | int, size: int, num_params: int, antithetic: bool = True) -> jax.Array:
    """Noise of members ``start .. start+size-1``, ``[size, num_params]``.

    jes evaluates populations in chunks of whole antithetic pairs (``start``
    and ``size`` even), so each Gaussian is drawn once per pair. Values equal
    :func:`member_noise` member by member.
    """
    members = jnp.asarray(start, jnp.int32) + jnp.arange(size, dtype=jnp.int32)
    if antithetic:
        _check_pairs(size)
        return mirrored(jax.vmap(lambda m: member_noise(gen_key, m, num_params, True))(members[0::2]))
    return jax.vmap(lambda m: member_noise(gen_key, m, num_params, False))(members)


def mirrored(pairs: jax.Array) -> jax.Array:
    """Members ``2p, 2p + 1`` as ``+pairs[p], -pairs[p]``: ``[2 * len(pairs), P]``."""
    return jnp.stack([pairs, -pairs], axis=1).reshape(2 * pairs.shape[0], pairs.shape[1])


def _check_pairs(size: int) -> None:
    if size % 2:
        raise ValueError(f"antithetic chunks must hold whole pairs; got an odd chunk size {size}")


def episode_keys(gen_key: jax.Array, members: jax.Array, num_episodes: int, antithetic: bool = True) -> jax.Array:
    """Keys of each member's episodes, ``[len(members), num_episodes]``; antithetic pairs share them."""
    stream = jax.random.fold_in(gen_key, EPISODE_STREAM)

    def one(member):
        source, _ = _noise_source(member, antithetic)
        member_key = jax.random.fold_in(stream, source)
        return jax.vmap(lambda e: jax.random.fold_in(member_key, e))(jnp.arange(num_episodes))

    return jax.vmap(one)(jnp.asarray(members, jnp.int32))


def centre_episode_keys(gen_key: jax.Array, num_episodes: int) -> jax.Array:
    """Fresh keys for evaluating the unperturbed centre, ``[num_episodes]``."""
    stream = jax.random.fold_in(gen_key, CENTRE_STREAM)
    return jax.vmap(lambda e: jax.random.fold_in(stream, e))(jnp.arange(num_episodes))


def episode_and_centre_keys(gen_key: jax.Array, members: jax.Array, num_episodes: int, antithetic: bool,
                            centre_episodes: jax.Array) -> tuple[jax.Array, jax.Array]:
    """:func:`episode_keys` of ``members`` and the keys of centre episodes ``centre_episodes`` (indices into
    :func:`centre_episode_keys`), the same keys, derived level by level together: each level is one threefry
    computation in the compiled program instead of two."""
    tags = jnp.array([EPISODE_STREAM, CENTRE_STREAM], jnp.int32)
    episode_stream, centre_stream = jax.vmap(lambda tag: jax.random.fold_in(gen_key, tag))(tags)
    sources, _ = _noise_source(jnp.asarray(members, jnp.int32), antithetic)
    num_members, num_centre = sources.shape[0], centre_episodes.shape[0]
    streams = jnp.concatenate([jnp.broadcast_to(episode_stream, (num_members,)),
                               jnp.broadcast_to(centre_stream, (num_centre,))])
    keys = jax.vmap(jax.random.fold_in)(streams, jnp.concatenate([sources, jnp.asarray(centre_episodes, jnp.int32)]))
    episodes = jnp.arange(num_episodes)
    member_keys = jax.vmap(lambda key: jax.vmap(lambda e: jax.random.fold_in(key, e))(episodes))(keys[:num_members])
    return member_keys, keys[num_members:]


def search_method() -> str:
    """``jnp.searchsorted``'s method for fitness ranks: the same indices (so the same bits) whichever it is.

    Its binary search is a while loop by default, and on a GPU each iteration waits on the host: on an H200 the
    ranks of 512 members took 0.68 ms a call as a loop, 0.09 ms unrolled, and a low-rank MLP 256x256 generation
    (512 members, r = 1) went from 0.74x to 0.83x batch inference (issue 23; before jes put loops in CUDA graphs,
    :func:`jes.cpu.gpu_compiler_options`). On the CPU the loop is faster from
    2,048 members (measured at 512, 2,048 and 4,096: 1.2 ms against 2.0 ms at 4,096), so it stays there. Chosen by
    JAX's default backend when the program is traced (a CPU program in a GPU process gets the unrolled search: the
    same bits, slower from 2,048 members); part of the program cache's key (``Trainer.program_parts``).
    """
    return "scan" if jax.default_backend() == "cpu" else "scan_unrolled"


def tie_bounds(values: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Where each of ``values`` starts and ends among them sorted ascending: ``(first index, one past the last)``
    of its run of equal values (the binary search by :func:`search_method`)."""
    ordered = jnp.sort(values)
    return (jnp.searchsorted(ordered, values, side="left", method=search_method()),
            jnp.searchsorted(ordered, values, side="right", method=search_method()))


def centered_ranks(fitness: jax.Array) -> jax.Array:
    """Centered ranks in ``[-0.5, 0.5]`` summing to 0; tied values share their average rank.

    Args:
        fitness: ``[n]`` raw fitness values, ``n >= 2``.
    """
    n = fitness.shape[0]
    low, end = tie_bounds(fitness)
    ranks = (low + end - 1).astype(jnp.float32) * 0.5
    return ranks / (n - 1) - 0.5


def sorted_utilities(fitness: jax.Array, utilities: jax.Array) -> jax.Array:
    """Assign ``utilities`` (best first, ``[n]``) to members by fitness rank; ties share their utility's mean.

    Averaging tied utilities makes members with equal fitness weigh the same, so an all-equal population
    moves nothing where the utilities sum to zero (centred ranks, ``nes_utilities``); weights that do not (cma_es's
    and sep_cma_es's recombination weights) still move it.
    """
    low, high = tie_bounds(-fitness)
    cumulative = jnp.concatenate([jnp.zeros(1, utilities.dtype), jnp.cumsum(utilities)])
    return (cumulative[high] - cumulative[low]) / jnp.maximum(high - low, 1).astype(utilities.dtype)


def nes_utilities(n: int) -> jax.Array:
    """The NES rank utilities of ``n`` members, best first: ``max(0, log(n/2 + 1) - log(k)) / sum - 1/n`` for rank
    ``k`` (Wierstra et al. 2014; SNES's, EvoTorch's ``"nes"`` ranking): the top half weighs in by log rank, every
    member pays ``1/n``, and they sum to 0.

    Computed on the host in float64 (``n`` is static) and given to XLA as a float32 constant, so a master's update
    and a local step use the same bits (see :func:`jes.strategies.snes.linear_utilities`).
    """
    k = np.arange(1, n + 1, dtype=np.float64)
    raw = np.maximum(0.0, math.log(n / 2 + 1) - np.log(k))
    return jnp.asarray(raw / raw.sum() - 1.0 / n, jnp.float32)


def z_score(fitness: jax.Array, eps: float = 1e-8) -> jax.Array:
    """``(f - mean) / (std + eps)``."""
    return (fitness - fitness.mean()) / (fitness.std() + eps)


def shape_fitness(fitness: jax.Array, method: str) -> jax.Array:
    """Apply a named fitness shaping (see :data:`FITNESS_SHAPINGS`)."""
    if method == "centered_ranks":
        return centered_ranks(fitness)
    if method == "nes_utilities":
        return sorted_utilities(fitness, nes_utilities(fitness.shape[0]))
    if method == "z_score":
        return z_score(fitness)
    if method == "raw":  # float64 fitness (x64 mode) kept: rounded to float32, an offset of 1e6 swallowed the differences
        return fitness if fitness.dtype == jnp.float64 else fitness.astype(jnp.float32)
    raise ValueError(f"unknown fitness_shaping {method!r}; choose one of {', '.join(FITNESS_SHAPINGS)}")


def chunk_weighted_noise(gen_key: jax.Array, start: jax.Array | int, weights: jax.Array, num_params: int, antithetic: bool) -> jax.Array:
    """``sum_i weights[i] * noise(start + i)`` over one chunk, shape ``[num_params]``.

    With antithetic pairs each pair is folded first, ``(w+ - w-) * eps``: half
    the work, and a pair with equal weights cancels exactly.
    """
    size = weights.shape[0]
    members = jnp.asarray(start, jnp.int32) + jnp.arange(size, dtype=jnp.int32)
    if antithetic:
        _check_pairs(size)
        eps = jax.vmap(lambda m: member_noise(gen_key, m, num_params, True))(members[0::2])
        return weighted_draws(weights, eps, True)
    return weighted_draws(weights, chunk_noise(gen_key, start, size, num_params, False), False)


def weighted_draws(weights: jax.Array, draws: jax.Array, antithetic: bool) -> jax.Array:
    """:func:`chunk_weighted_noise` from the chunk's draws: the pairs' ``[C // 2, P]`` (antithetic) or the members' ``[C, P]``."""
    if antithetic:
        return (weights[0::2] - weights[1::2]) @ draws
    return weights @ draws


def es_gradient(weighted_sum: jax.Array, num_members: int, noise_std: jax.Array) -> jax.Array:
    """The paper's ascent direction: ``sum_i F_i eps_i / (n * sigma)``."""
    return weighted_sum / (num_members * noise_std)


# Rows of the contracted axis per product in rows_product. XLA:CPU (jaxlib 0.10.2, YNNPACK) splits the contracted
# axis of a transposed product among the process's threads from ~1,024 rows on: A^T B with A, B [1024, 256] had
# other bits in a process on one core than on two (at 512 rows and below the same, on 2 cores; products in the
# normal layout, x [512, 1024] @ W [1024, 1024], the same at every size tried).
ROWS_PER_PRODUCT = 128


def rows_product(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a.T @ b`` for ``a`` ``[k, m]``, ``b`` ``[k, n]``: ``[m, n]``, with the ``k`` rows taken
    :data:`ROWS_PER_PRODUCT` at a time and the products summed in row order, so that its bits do not depend on the
    cores the process may use (one product, the same op as ``a.T @ b``, up to that many rows)."""
    rows = a.shape[0]
    if rows <= ROWS_PER_PRODUCT:
        return a.T @ b
    out = None
    for start in range(0, rows, ROWS_PER_PRODUCT):
        part = a[start:start + ROWS_PER_PRODUCT].T @ b[start:start + ROWS_PER_PRODUCT]
        out = part if out is None else out + part
    return out
