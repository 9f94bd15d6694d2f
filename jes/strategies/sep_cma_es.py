"""sep-CMA-ES: CMA-ES with a diagonal covariance matrix (Ros & Hansen 2008), linear in the dimension."""
from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from jes.strategies.base import (Context, Strategy, check_optimizer_free, check_positive_field, info, sorted_utilities,
                                unit_noise)


@struct.dataclass
class SepCMAState:
    """``mean`` ``[P]``, global step size ``sigma``, diagonal covariance ``diag_c`` ``[P]``, evolution paths."""

    mean: jax.Array
    sigma: jax.Array
    diag_c: jax.Array
    path_sigma: jax.Array
    path_c: jax.Array


@dataclasses.dataclass(frozen=True)
class SepCMAES(Strategy):
    """Separable CMA-ES with the standard default weights, cumulative step-size adaptation and evolution paths.

    ``x_k = mean + sigma * sqrt(diag_c) * z_k``; the best ``mu = n // 2`` members get
    the log-linear recombination weights; the rank-one and rank-mu learning rates are
    the full CMA-ES defaults multiplied by ``(d + 2) / 3`` (Ros & Hansen 2008).

    Args:
        sigma_init: initial step size (``None``: ``sigma_scale * ESConfig.noise_std``).
        mean_lr: ``c_m`` (``None``: ``10 / 1.5`` for policies with :func:`jes.train`, the standard 1 for
            :func:`jes.optimize` / :class:`jes.AskTell`). With a policy's large population (512, so
            ``mu_eff`` ~ 132) the recombined step is ~``sigma / sqrt(mu_eff)`` per coordinate; on a
            function CSA then grows sigma, but a policy's return punishes large perturbations, so
            sigma stays put and with ``c_m = 1`` the mean barely moves (Pendulum stays near a random
            policy's return for 100 generations). ``c_m * sigma`` is 10 x ``noise_std`` for policies,
            as ``c_m = 10`` at ``sigma = noise_std`` was before (CartPole in 3-5 generations).
        sigma_scale: the initial sigma in units of ``ESConfig.noise_std`` when ``sigma_init`` is ``None``
            (``None``: 1.5 for policies, 1 for functions). With ``mean_lr`` this is "mutate large,
            inherit small" (Beyer 1998) for a noisy return: selection's signal grows with the sampling
            width, the mean step's noise with ``c_m * sigma``, so sampling 1.5x wider and inheriting
            1/1.5 of the earlier ``c_m = 10`` raises the signal at the same step.
        unbiased_csa: cumulative step-size adaptation with ``||p_sigma||`` divided by
            ``sqrt(1 - (1 - c_sigma)^(2 t))``, the normalisation the ``h_sigma`` test already uses (``None``:
            ``True`` for policies, ``False`` (the standard update) for functions). ``p_sigma`` starts at 0,
            so for the first ~``1 / c_sigma`` generations (10 here) its length is below ``chi_n`` and CSA
            shrinks sigma (0.2 -> 0.16 on Pendulum); on a policy's noisy return the path then stays at
            ``chi_n``, so sigma keeps that loss for the whole run (functions keep the standard update).

    Pendulum (MLP 32x32, 512 members, 100 generations, ``benchmarks/sep_cma_diag.py``): seeds 0-19 reach
    -200 on 1/20 with the earlier policy defaults (``c_m = 10`` at ``sigma = noise_std``, standard CSA), on
    13/20 with these (SNES: 6/20), measured before the update was made device-independent; since then
    ``benchmarks/strategies.py`` solves seeds 0-9 on 8/10 (seeds 0-4: 5/5; before these defaults: 1/5).
    Runs still fail on a plateau near -880 or by hovering between -150 and -800 once near -200: the mean
    moves ~5 in norm every generation with ``||p_sigma|| ~ chi_n``, a step that is mostly selection
    noise and that CSA does not shrink (benchmarks/README.md, issue 8, with the variants that did not help).
    """

    sigma_init: float | None = None
    mean_lr: float | None = None
    sigma_scale: float | None = None
    unbiased_csa: bool | None = None

    name = "sep_cma_es"
    sigma_field = "sigma_init"
    PER_USE_DEFAULTS: ClassVar[dict] = {"mean_lr": (10.0 / 1.5, 1.0), "sigma_scale": (1.5, 1.0),
                                        "unbiased_csa": (True, False)}

    def antithetic(self, requested: bool) -> bool:
        return False

    def validate(self, ctx: Context) -> None:
        check_optimizer_free(self, ctx.optimizer)
        if ctx.num_members < 4:
            raise ValueError(f"sep_cma_es needs num_members >= 4 (it recombines the best half), got {ctx.num_members}")
        self.check_per_use_defaults()
        check_positive_field(self, "sigma_init", unset="sigma_scale * noise_std")

    # The standard constants, functions of the dimension d and population n only (static).
    def constants(self, d: int, n: int) -> dict:
        return self.constants_for(d, n, mu=n // 2, rate_scale=(d + 2) / 3)

    @staticmethod
    def constants_for(d: int, n: int, mu: int, rate_scale: float) -> dict:
        """The constants recombining the best ``mu`` of ``n`` with CMA-ES's c_1, c_mu times ``rate_scale``."""
        raw = [math.log(mu + 0.5) - math.log(i + 1) for i in range(mu)]
        total = sum(raw)
        weights = [w / total for w in raw]
        mu_eff = 1.0 / sum(w * w for w in weights)
        c_sigma = (mu_eff + 2) / (d + mu_eff + 5)
        d_sigma = 1 + 2 * max(0.0, math.sqrt((mu_eff - 1) / (d + 1)) - 1) + c_sigma
        c_c = 4 / (d + 4)
        c_1 = 2 / ((d + 1.3) ** 2 + mu_eff)
        c_mu = min(1 - c_1, 2 * (mu_eff - 2 + 1 / mu_eff) / ((d + 2) ** 2 + mu_eff))
        c_1, c_mu = c_1 * rate_scale, min(1 - c_1 * rate_scale, c_mu * rate_scale)
        chi_n = math.sqrt(d) * (1 - 1 / (4 * d) + 1 / (21 * d * d))
        return dict(weights=weights + [0.0] * (n - mu), mu_eff=mu_eff, c_sigma=c_sigma, d_sigma=d_sigma, c_c=c_c,
                    c_1=c_1, c_mu=c_mu, chi_n=chi_n)

    def init(self, ctx, mean):
        sigma = self.initial_sigma(ctx.initial_noise_std)
        zeros = jnp.zeros_like(mean)
        return SepCMAState(mean=mean, sigma=jnp.asarray(sigma, mean.dtype), diag_c=jnp.ones_like(mean), path_sigma=zeros,
                           path_c=zeros)

    def initial_sigma(self, noise_std: float) -> float:
        """``sigma_init``, else ``noise_std * sigma_scale``."""
        return noise_std * self.resolved("sigma_scale") if self.sigma_init is None else float(self.sigma_init)

    def noise_std(self, ctx, state, generation):
        return state.sigma * jnp.sqrt(state.diag_c).mean()

    def draw(self, ctx, gen_key, start, size):
        return unit_noise(gen_key, start, size, ctx.num_params, False)

    def sample(self, ctx, state, gen_key, generation, start, size, draws=None):
        z = self.draw(ctx, gen_key, start, size) if draws is None else draws
        return state.mean[None, :] + (state.sigma * jnp.sqrt(state.diag_c))[None, :] * z

    def weights(self, ctx, state, fitness):
        c = self.constants(ctx.num_params, fitness.shape[0])
        return sorted_utilities(fitness, jnp.asarray(c["weights"], jnp.float32))

    def chunk_stats(self, ctx, state, gen_key, generation, start, weights, draws=None):
        z = self.draw(ctx, gen_key, start, weights.shape[0]) if draws is None else draws
        return {"z": weights @ z, "z2": weights @ (z * z)}

    def update(self, ctx, state, stats, fitness, generation):
        d = ctx.num_params
        c = self.constants(d, ctx.num_members)
        scale = jnp.sqrt(state.diag_c)
        y_w = scale * stats["z"]
        step = self.resolved("mean_lr") * state.sigma * y_w
        mean = state.mean + step
        c_s, c_c = c["c_sigma"], c["c_c"]
        path_sigma = (1 - c_s) * state.path_sigma + math.sqrt(c_s * (2 - c_s) * c["mu_eff"]) * stats["z"]
        norm = jnp.linalg.norm(path_sigma)
        t = (generation + 1).astype(jnp.float32)
        # Divisions by a square root or by a traced scalar are written as explicit rsqrt / reciprocal products:
        # XLA:CPU rewrites `a / sqrt(b)` and `a / b` into those forms only where it sees the producer, so the
        # same update compiled into the one- and two-device programs could differ in the last bit.
        unbiased_norm = norm * jax.lax.rsqrt(1 - (1 - c_s) ** (2 * t))
        h_sigma = (unbiased_norm < (1.4 + 2 / (d + 1)) * c["chi_n"]).astype(jnp.float32)
        path_c = (1 - c_c) * state.path_c + h_sigma * math.sqrt(c_c * (2 - c_c) * c["mu_eff"]) * y_w
        rank_mu = state.diag_c * stats["z2"]  # sum_k w_k y_k^2 with y_k = sqrt(diag_c) z_k
        diag_c = ((1 - c["c_1"] - c["c_mu"]) * state.diag_c
                  + c["c_1"] * (path_c * path_c + (1 - h_sigma) * c_c * (2 - c_c) * state.diag_c)
                  + c["c_mu"] * rank_mu)
        if self.resolved("unbiased_csa"):  # the start-up bias of p_sigma (from 0) removed, as in h_sigma
            sigma = state.sigma * jnp.exp((c_s / c["d_sigma"]) * (unbiased_norm / c["chi_n"] - 1))
        else:
            sigma = state.sigma * jnp.exp((c_s / c["d_sigma"]) * (norm / c["chi_n"] - 1))
        # Only sigma * sqrt(diag_c) is the distribution: on ridges (Rosenbrock) sigma drifts up while diag_c
        # drifts down by as much, until float32 underflows diag_c. Moving the mean of diag_c into sigma
        # (and rescaling p_c, kept in diag_c's units) is the same distribution and the same dynamics.
        scale = diag_c.mean()
        sigma, diag_c, path_c = sigma * jnp.sqrt(scale), diag_c * (1.0 / scale), path_c * jax.lax.rsqrt(scale)
        new = SepCMAState(mean=mean, sigma=sigma, diag_c=diag_c, path_sigma=path_sigma, path_c=path_c)
        return new, info(y_w, step, sigma * jnp.sqrt(diag_c).mean(), self.resolved("mean_lr"))
