"""CMA-ES with a full covariance matrix (Hansen 2016, "The CMA Evolution Strategy: A Tutorial", arXiv:1604.00772).

Quadratic in the dimension in memory and per generation, cubic in its (lazy) eigendecomposition: for
``P`` above a few thousand use ``sep_cma_es`` (diagonal covariance) or ``openai_es`` / ``snes``.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jes.strategies.base import (Context, Strategy, check_optimizer_free, check_positive_field, info, sorted_utilities,
                                unit_noise)
from jes.cpu import pin_lapack_threads
from jes.strategies.noise import rows_product

# Above this many parameters the [P, P] matrices (covariance, eigenbasis, one rank-mu statistic per chunk)
# take gigabytes and each eigendecomposition seconds to minutes: refused, with the alternatives named.
MAX_PARAMS = 10_000


@struct.dataclass
class CMAState:
    """``mean`` ``[P]``, step size ``sigma``, covariance ``cov`` ``[P, P]``, its eigenbasis ``basis`` ``[P, P]``
    (columns) and the square roots of its eigenvalues ``scales`` ``[P]`` as of the last eigendecomposition,
    and the evolution paths ``path_sigma``, ``path_c`` ``[P]``.

    Members are drawn from ``N(mean, sigma^2 B diag(scales)^2 B^T)``: the basis lags ``cov`` by at most
    :meth:`CMAES.eigen_interval` - 1 generations, as in pycma's lazy update.
    """

    mean: jax.Array
    sigma: jax.Array
    cov: jax.Array
    basis: jax.Array
    scales: jax.Array
    path_sigma: jax.Array
    path_c: jax.Array


@dataclasses.dataclass(frozen=True)
class CMAES(Strategy):
    """(mu/mu_w, lambda)-CMA-ES with active covariance update, the tutorial's default constants.

    ``x_k = mean + sigma * B D z_k`` with ``z_k`` regenerated from ``(gen_key, k)``. Ranked best first,
    the ``mu = n // 2`` best members get the positive log-linear weights that move the mean; the rest get
    the tutorial's negative weights (active CMA, as pycma's default ``CMA_active``), used in the rank-mu
    update only and rescaled by ``P / ||z_k||^2``. Each chunk contributes ``sum_k w_k z_k`` and
    ``sum_k w'_k z_k z_k^T``; the update maps them through ``B D`` once, so the ``[P, P]`` sums are over
    ``z`` only and chunk-ordered like every jes strategy's.

    Args:
        sigma_init: initial step size (``None``: ``ESConfig.noise_std``, i.e. ``jes.optimize``'s ``noise_std``).
        eigen_interval: generations between eigendecompositions of the covariance (``None``: the tutorial's
            ``max(1, floor(1 / (10 P (c_1 + c_mu))))``).
        max_params: refuse dimensions above this (memory ~``(chunks + 4) * 4 P^2`` bytes).
    """

    sigma_init: float | None = None
    eigen_interval: int | None = None
    max_params: int = MAX_PARAMS

    name = "cma_es"
    sigma_field = "sigma_init"

    def antithetic(self, requested: bool) -> bool:
        return False  # mirrored samples bias the rank-mu estimate of the covariance

    def validate(self, ctx: Context) -> None:
        pin_lapack_threads()  # (where the run is built: a program from jes's cache is not traced again)
        check_optimizer_free(self, ctx.optimizer)
        if ctx.num_members < 4:
            raise ValueError(f"cma_es needs num_members >= 4 (it recombines the best half), got {ctx.num_members}")
        if ctx.num_params > self.max_params:
            gib = 4 * ctx.num_params ** 2 / 2 ** 30
            raise ValueError(
                f"cma_es keeps a full {ctx.num_params} x {ctx.num_params} covariance ({gib:.1f} GiB per matrix, "
                f"several matrices) and decomposes it every few generations; above max_params={self.max_params} "
                f"use sep_cma_es (diagonal covariance), or snes / openai_es, which are linear in the dimension "
                f"(or raise cma_es max_params if you have the memory)")
        if self.eigen_interval is not None and (not isinstance(self.eigen_interval, int) or self.eigen_interval < 1):
            raise ValueError(f"cma_es eigen_interval must be a positive int (or None), got {self.eigen_interval!r}")
        check_positive_field(self, "sigma_init")

    @staticmethod
    def constants(d: int, n: int) -> dict:
        """The tutorial's defaults (its Table 1) for dimension ``d`` and population ``n`` (computed in float64;
        ``weight_sum`` of the weights as used, rounded to float32)."""
        mu = n // 2
        raw = [math.log((n + 1) / 2) - math.log(i + 1) for i in range(n)]
        positive, negative = raw[:mu], raw[mu:]
        mu_eff = sum(positive) ** 2 / sum(w * w for w in positive)
        mu_eff_minus = sum(negative) ** 2 / sum(w * w for w in negative) if any(negative) else 0.0
        c_sigma = (mu_eff + 2) / (d + mu_eff + 5)
        d_sigma = 1 + 2 * max(0.0, math.sqrt((mu_eff - 1) / (d + 1)) - 1) + c_sigma
        c_c = (4 + mu_eff / d) / (d + 4 + 2 * mu_eff / d)
        c_1 = 2 / ((d + 1.3) ** 2 + mu_eff)
        c_mu = min(1 - c_1, 2 * (mu_eff - 2 + 1 / mu_eff) / ((d + 2) ** 2 + mu_eff))
        alpha_mu = 1 + c_1 / c_mu
        alpha_mu_eff = 1 + 2 * mu_eff_minus / (mu_eff + 2)
        alpha_posdef = (1 - c_1 - c_mu) / (d * c_mu)
        negative_total = -sum(w for w in negative if w < 0)
        negative_scale = min(alpha_mu, alpha_mu_eff, alpha_posdef) / negative_total if negative_total > 0 else 0.0
        weights = [w / sum(positive) for w in positive] + [w * negative_scale if w < 0 else 0.0 for w in negative]
        chi_n = math.sqrt(d) * (1 - 1 / (4 * d) + 1 / (21 * d * d))
        eigen_interval = max(1, int(1 / (10 * d * (c_1 + c_mu))))
        return dict(weights=weights, mu=mu, mu_eff=mu_eff, c_sigma=c_sigma, d_sigma=d_sigma, c_c=c_c, c_1=c_1,
                    c_mu=c_mu, weight_sum=sum(float(np.float32(w)) for w in weights), chi_n=chi_n, eigen_interval=eigen_interval)

    def eigen_interval_for(self, d: int, n: int) -> int:
        """Generations between eigendecompositions."""
        return self.constants(d, n)["eigen_interval"] if self.eigen_interval is None else int(self.eigen_interval)

    def init(self, ctx, mean):
        sigma = self.initial_sigma(ctx.initial_noise_std)
        d, dtype = mean.shape[0], mean.dtype
        eye = jnp.eye(d, dtype=dtype)
        zeros = jnp.zeros_like(mean)
        return CMAState(mean=mean, sigma=jnp.asarray(sigma, dtype), cov=eye, basis=eye, scales=jnp.ones_like(mean),
                        path_sigma=zeros, path_c=zeros)

    def noise_std(self, ctx, state, generation):
        return state.sigma * jnp.sqrt(jnp.diagonal(state.cov)).mean()

    def draw(self, ctx, gen_key, start, size):
        return unit_noise(gen_key, start, size, ctx.num_params, False)

    def sample(self, ctx, state, gen_key, generation, start, size, draws=None):
        z = (self.draw(ctx, gen_key, start, size) if draws is None else draws).astype(state.mean.dtype)
        return state.mean[None, :] + state.sigma * (z * state.scales[None, :]) @ state.basis.T

    def weights(self, ctx, state, fitness):
        # Ranked in the fitness's dtype, returned in float32 whatever the state's: the generation pads weights
        # into float32 arrays (they are rank constants; float64 means and covariances still sum float64
        # products of them).
        w = jnp.asarray(self.constants(ctx.num_params, fitness.shape[0])["weights"], fitness.dtype)
        narrow = lambda u: sorted_utilities(fitness, u).astype(jnp.float32)
        return {"mean": narrow(jnp.maximum(w, 0.0)), "cov": narrow(w)}

    def chunk_stats(self, ctx, state, gen_key, generation, start, weights, draws=None):
        z = (self.draw(ctx, gen_key, start, weights["mean"].shape[0]) if draws is None else draws).astype(state.mean.dtype)
        w = weights["cov"].astype(z.dtype)
        # Active CMA's negative weights act on directions rescaled to length sqrt(P) (tutorial eq. 46):
        # ||C^(-1/2) y_k|| = ||z_k|| for the distribution the member was drawn from.
        # The squared norms as a matrix-vector product, not a reduce: XLA:CPU fused `sum(z * z, axis=1)` into
        # the one-device program's chunk loop differently than into the two-device one (last bits of C).
        squared = (z * z) @ jnp.ones(z.shape[1], z.dtype)
        w = jnp.where(w < 0, w * (ctx.num_params * (1.0 / squared)), w)
        return {"z": weights["mean"].astype(z.dtype) @ z, "zz": rows_product(z * w[:, None], z)}

    def update(self, ctx, state, stats, fitness, generation):
        d = ctx.num_params
        c = self.constants(d, ctx.num_members)
        c_s, c_c, c_1, c_mu = c["c_sigma"], c["c_c"], c["c_1"], c["c_mu"]
        transform = state.basis * state.scales[None, :]  # B D: z -> y
        y_w = transform @ stats["z"]
        step = state.sigma * y_w
        mean = state.mean + step
        # C^(-1/2) y_w = B D^-1 B^T B D z_w = B z_w
        path_sigma = (1 - c_s) * state.path_sigma + math.sqrt(c_s * (2 - c_s) * c["mu_eff"]) * (state.basis @ stats["z"])
        norm = jnp.linalg.norm(path_sigma)
        t = (generation + 1).astype(norm.dtype)
        # rsqrt and reciprocal products rather than divisions: see sep_cma_es.py (same bits in every program).
        unbiased_norm = norm * jax.lax.rsqrt(1 - (1 - c_s) ** (2 * t))
        h_sigma = (unbiased_norm < (1.4 + 2 / (d + 1)) * c["chi_n"]).astype(norm.dtype)
        path_c = (1 - c_c) * state.path_c + h_sigma * math.sqrt(c_c * (2 - c_c) * c["mu_eff"]) * y_w
        rank_mu = transform @ stats["zz"] @ transform.T
        decay = 1 + c_1 * (1 - h_sigma) * c_c * (2 - c_c) - c_1 - c_mu * c["weight_sum"]
        cov = decay * state.cov + c_1 * jnp.outer(path_c, path_c) + c_mu * rank_mu
        cov = 0.5 * (cov + cov.T)
        # pycma's cap on one generation's step-size change (a factor e).
        sigma = state.sigma * jnp.exp(jnp.minimum(1.0, (c_s / c["d_sigma"]) * (norm * (1.0 / c["chi_n"]) - 1)))

        def decompose(cov):
            pin_lapack_threads()  # (traced here: the bits of eigh's LAPACK call must not depend on the cores)
            eigenvalues, basis = jnp.linalg.eigh(cov)
            # A covariance that float rounding made indefinite keeps its basis; its tiny eigenvalues are floored.
            floor = jnp.finfo(cov.dtype).eps * jnp.max(eigenvalues)
            return basis, jnp.sqrt(jnp.maximum(eigenvalues, floor))

        due = (generation + 1) % self.eigen_interval_for(d, ctx.num_members) == 0
        basis, scales = jax.lax.cond(due, decompose, lambda _: (state.basis, state.scales), cov)
        new = CMAState(mean=mean, sigma=sigma, cov=cov, basis=basis, scales=scales, path_sigma=path_sigma,
                       path_c=path_c)
        return new, info(y_w, step, sigma * jnp.sqrt(jnp.diagonal(cov)).mean(), 1.0)
