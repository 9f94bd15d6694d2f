"""SNES: separable natural evolution strategies (Schaul, Glasmachers & Schmidhuber 2011)."""
from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jes.strategies.base import (Context, Strategy, check_optimizer_free, check_positive_field, info, sorted_utilities,
                                unit_noise)


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


def linear_utilities(n: int) -> jax.Array:
    """Centred linear ranks, best first (``(n - k) / (n - 1) - 1/2`` for rank ``k``), scaled to the L2 norm of
    :func:`snes_utilities` ``(n)``: every member weighs in, and the weighted noise sums that move the mean and
    sigma have the same per-coordinate spread as with the log utilities, so ``mean_lr`` and ``sigma_lr`` keep
    their scale.

    Computed on the host in float64 (``n`` is static) and given to XLA as a constant: computed in the graph,
    the norms' reductions were compiled differently in a distributed master's update than in a local step,
    and 0 vs 2 workers differed in the last bit (tests/test_distributed.py).
    """
    k = np.arange(1, n + 1, dtype=np.float64)
    lin = (n - k) / (n - 1) - 0.5
    raw = np.maximum(0.0, math.log(n / 2 + 1) - np.log(k))
    log_utilities = raw / raw.sum() - 1.0 / n
    return jnp.asarray(lin * (np.linalg.norm(log_utilities) / np.linalg.norm(lin)), jnp.float32)


@dataclasses.dataclass(frozen=True)
class SNES(Strategy):
    """Separable NES: ``x_k = mean + sigma * z_k`` with natural-gradient updates on mean and log-sigma.

    With utilities ``u_k`` by fitness rank::

        mean  += mean_lr * sigma * sum_k u_k z_k
        sigma *= exp(sigma_lr / 2 * sum_k u_k (z_k^2 - 1))

    Args:
        mean_lr: ``eta_mu`` (``None``: 20 for policies with :func:`jes.train`, the paper's 1 for
            :func:`jes.optimize` / :class:`jes.AskTell`). The paper's 1 goes with its population
            ``4 + 3 ln d``; with a policy's large population (512) the utility-weighted noise sum is
            ~10x smaller per coordinate, and the mean moves too little to leave a random policy's
            return on Pendulum in 100 generations.
        sigma_lr: ``eta_sigma``; ``None`` gives the paper's ``(3 + ln d) / (5 sqrt d)``.
        sigma_init: initial sigma (``None``: ``ESConfig.noise_std``).
        linear_utilities: weigh members by centred linear ranks (:func:`linear_utilities`) instead of the
            paper's log utilities of the top half (:func:`snes_utilities`) (``None``: ``True`` for policies,
            ``False`` for :func:`jes.optimize` / :class:`jes.AskTell`).

    Policy defaults (issue 8; Pendulum, MLP 32x32, 512 members, 100 generations,
    ``benchmarks/sep_cma_diag.py``): with one noisy episode per member, the log utilities put most
    weight on a few top ranks, likely the luckiest episodes more than the best policies; the step is mostly
    selection noise, and runs sit on a plateau near -880 or hover near -200 (the paper's utilities
    with ``mean_lr`` 10: 2 of seeds 0-9 and 2 of seeds 10-19 reach -200). Linear ranks use every
    member's order, a better-averaged gradient at the same step noise, and take a larger step:
    ``mean_lr`` 20 reaches -200 on 8 of seeds 0-9 and 8 of seeds 10-19 (benchmarks/README.md). The price:
    CartPole in 4-6 generations (was 3-5), Acrobot in 1-13 (was 1-4), seeds 0-4.
    """

    mean_lr: float | None = None
    sigma_lr: float | None = None
    sigma_init: float | None = None
    linear_utilities: bool | None = None

    name = "snes"
    sigma_field = "sigma_init"
    PER_USE_DEFAULTS: ClassVar[dict] = {"mean_lr": (20.0, 1.0), "linear_utilities": (True, False)}

    def antithetic(self, requested: bool) -> bool:
        return False

    def validate(self, ctx: Context) -> None:
        check_optimizer_free(self, ctx.optimizer)
        self.check_per_use_defaults()
        check_positive_field(self, "sigma_init")
        # (a negative rate grew sigma on every generation and diverged; NaN stopped as "the update is not finite")
        value = self.sigma_lr
        number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
        if value is not None and not (number and math.isfinite(value) and value >= 0):
            raise ValueError(f"snes sigma_lr must be a finite number >= 0 (0 keeps sigma fixed; None for the paper's "
                             f"(3 + ln d) / (5 sqrt d)), got {value!r}")

    def _sigma_lr(self, d: int) -> float:
        return (3 + math.log(d)) / (5 * math.sqrt(d)) if self.sigma_lr is None else float(self.sigma_lr)

    def init(self, ctx, mean):
        sigma = self.initial_sigma(ctx.initial_noise_std)
        return SNESState(mean=mean, sigma=jnp.full_like(mean, sigma))

    def noise_std(self, ctx, state, generation):
        return state.sigma.mean()

    def draw(self, ctx, gen_key, start, size):
        return unit_noise(gen_key, start, size, ctx.num_params, False)

    def sample(self, ctx, state, gen_key, generation, start, size, draws=None):
        z = self.draw(ctx, gen_key, start, size) if draws is None else draws
        return state.mean[None, :] + state.sigma[None, :] * z

    def weights(self, ctx, state, fitness):
        n = fitness.shape[0]
        return sorted_utilities(fitness, linear_utilities(n) if self.resolved("linear_utilities") else snes_utilities(n))

    def chunk_stats(self, ctx, state, gen_key, generation, start, weights, draws=None):
        z = self.draw(ctx, gen_key, start, weights.shape[0]) if draws is None else draws
        return {"mean": weights @ z, "sigma": weights @ (z * z - 1.0)}

    def update(self, ctx, state, stats, fitness, generation):
        step = self.resolved("mean_lr") * state.sigma * stats["mean"]
        sigma = state.sigma * jnp.exp(0.5 * self._sigma_lr(ctx.num_params) * stats["sigma"])
        return state.replace(mean=state.mean + step, sigma=sigma), info(stats["mean"], step, sigma.mean(), self.resolved("mean_lr"))
