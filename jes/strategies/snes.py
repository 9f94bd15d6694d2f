"""SNES: separable natural evolution strategies (Schaul, Glasmachers & Schmidhuber 2011)."""
from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from jes.strategies.base import Context, Strategy, check_optimizer_free, info, sorted_utilities, unit_noise


@struct.dataclass
class SNESState:
    """``mean`` ``[P]`` and per-dimension ``sigma`` ``[P]``."""

    mean: jax.Array
    sigma: jax.Array


def snes_utilities(n: int) -> jax.Array:
    """Rank-based utilities, best first: ``max(0, log(n/2 + 1) - log(k)) / sum - 1/n`` (they sum to 0)."""
    k = jnp.arange(1, n + 1, dtype=jnp.float32)
    raw = jnp.maximum(0.0, math.log(n / 2 + 1) - jnp.log(k))
    return raw / raw.sum() - 1.0 / n


@dataclasses.dataclass(frozen=True)
class SNES(Strategy):
    """Separable NES: ``x_k = mean + sigma * z_k`` with natural-gradient updates on mean and log-sigma.

    With utilities ``u_k`` by fitness rank::

        mean  += mean_lr * sigma * sum_k u_k z_k
        sigma *= exp(sigma_lr / 2 * sum_k u_k (z_k^2 - 1))

    Args:
        mean_lr: ``eta_mu`` (``None``: 10 for policies with :func:`jes.train`, the paper's 1 for
            :func:`jes.optimize` / :class:`jes.AskTell`). The paper's 1 goes with its population
            ``4 + 3 ln d``; with a policy's large population (512) the utility-weighted noise sum is
            ~10x smaller per coordinate, and the mean moves too little to leave a random policy's
            return on Pendulum in 100 generations (0/5 seeds; 10 solves 4/5, benchmarks/README.md).
        sigma_lr: ``eta_sigma``; ``None`` gives the paper's ``(3 + ln d) / (5 sqrt d)``.
        sigma_init: initial sigma (``None``: ``ESConfig.noise_std``).
    """

    mean_lr: float | None = None
    sigma_lr: float | None = None
    sigma_init: float | None = None

    name = "snes"
    PER_USE_DEFAULTS: ClassVar[dict] = {"mean_lr": (10.0, 1.0)}

    def antithetic(self, requested: bool) -> bool:
        return False

    def validate(self, ctx: Context) -> None:
        check_optimizer_free(self, ctx.optimizer)
        self.check_per_use_defaults()

    def _sigma_lr(self, d: int) -> float:
        return (3 + math.log(d)) / (5 * math.sqrt(d)) if self.sigma_lr is None else float(self.sigma_lr)

    def init(self, ctx, mean):
        sigma = ctx.initial_noise_std if self.sigma_init is None else float(self.sigma_init)
        return SNESState(mean=mean, sigma=jnp.full_like(mean, sigma))

    def noise_std(self, ctx, state, generation):
        return state.sigma.mean()

    def sample(self, ctx, state, gen_key, generation, start, size):
        return state.mean[None, :] + state.sigma[None, :] * unit_noise(gen_key, start, size, ctx.num_params, False)

    def weights(self, ctx, state, fitness):
        return sorted_utilities(fitness, snes_utilities(fitness.shape[0]))

    def chunk_stats(self, ctx, state, gen_key, generation, start, weights):
        z = unit_noise(gen_key, start, weights.shape[0], ctx.num_params, False)
        return {"mean": weights @ z, "sigma": weights @ (z * z - 1.0)}

    def update(self, ctx, state, stats, fitness, generation):
        step = self.resolved("mean_lr") * state.sigma * stats["mean"]
        sigma = state.sigma * jnp.exp(0.5 * self._sigma_lr(ctx.num_params) * stats["sigma"])
        return state.replace(mean=state.mean + step, sigma=sigma), info(stats["mean"], step, sigma.mean(), self.resolved("mean_lr"))
