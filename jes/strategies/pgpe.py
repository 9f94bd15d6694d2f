"""PGPE (Sehnke et al. 2010) with symmetric sampling, per-parameter sigma, and ClipUp (Toklu et al. 2020)."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jes.optimizers import current_learning_rate, resolve_name
from jes.strategies import noise
from jes.strategies.base import Context, Strategy, check_positive_field, info, pair_noise


@struct.dataclass
class PGPEState:
    """``mean`` ``[P]``, per-parameter ``stdev`` ``[P]``, and the centre optimizer's ``opt_state``."""

    mean: jax.Array
    stdev: jax.Array
    opt_state: Any


@dataclasses.dataclass(frozen=True)
class PGPE(Strategy):
    """Parameter-exploring policy gradients with symmetric sampling.

    Members ``2p``/``2p+1`` are ``mean +/- stdev * z_p``. With shaped fitness ``w``
    (``ESConfig.fitness_shaping``, centred ranks by default) and ``m`` pairs::

        grad_mean  = stdev * sum_p (w+_p - w-_p) / 2 * z_p / m
        grad_stdev = stdev * sum_p ((w+_p + w-_p) / 2 - mean(w)) * (z_p^2 - 1) / m

    ``grad_mean`` goes to the centre optimizer (ClipUp by default: a normalised
    gradient step with momentum whose velocity is clipped to ``max_speed``);
    ``stdev`` takes a plain step of ``stdev_lr * grad_stdev``, its relative change
    clipped to ``stdev_max_change`` per generation (Toklu et al.'s setting).

    Args:
        center_lr: the centre optimizer's learning rate (``None``: ``ESConfig.learning_rate``; else,
            for ClipUp given by name (the default), 0.4 of the initial search radius
            ``stdev_init * sqrt(num_params)``, with ``max_speed`` twice that; else the named
            optimizer's default). ClipUp's step is a norm over all parameters, so a step tied to the
            radius carries over between network sizes; Toklu et al. suggest about 1/30 of the
            radius for long runs, which on Pendulum (MLP 32x32, 512 members) stays near a random
            policy's return for 100 generations (0/5 seeds) where 0.4 solves 4/5
            (benchmarks/README.md).
        stdev_lr: step size of the sigma update.
        stdev_max_change: largest relative change of any sigma in one generation.
        stdev_init: initial sigma (``None``: ``ESConfig.noise_std``).
        stdev_min: floor for sigma.
    """

    center_lr: float | None = None
    stdev_lr: float = 0.2
    stdev_max_change: float = 0.2
    stdev_init: float | None = None
    stdev_min: float = 1e-12

    name = "pgpe"
    sigma_field = "stdev_init"
    uses_optimizer = True
    default_optimizer = "clipup"
    # ClipUp's fixed speed cannot settle closer to an optimum than its learning rate; for function
    # optimisation the mean follows Sehnke's plain gradient (with momentum), whose steps shrink with sigma.
    blackbox_optimizer = "sgd"
    CLIPUP_RADIUS_FRACTION: ClassVar[float] = 0.4

    def default_learning_rate(self, optimizer: Any, num_params: int, noise_std: Any) -> float | None:
        if not isinstance(optimizer, str) or resolve_name(optimizer) != "clipup" or (
                self.stdev_init is None and callable(noise_std)):
            return None
        sigma = float(noise_std) if self.stdev_init is None else float(self.stdev_init)
        return self.CLIPUP_RADIUS_FRACTION * sigma * math.sqrt(num_params)

    def antithetic(self, requested: bool) -> bool:
        return True

    def default_population(self, num_params: int) -> int:
        return 2 * super().default_population(num_params)

    def check_fields(self) -> None:
        check_positive_field(self, "stdev_init")  # before center_lr's default is derived from it
        if not callable(self.center_lr):  # a schedule is optax's to check
            check_positive_field(self, "center_lr", unset="learning_rate")

    def validate(self, ctx: Context) -> None:
        if ctx.num_members % 2:
            raise ValueError(f"pgpe samples symmetric pairs; num_members={ctx.num_members} must be even")
        if not self.stdev_max_change > 0 or not self.stdev_lr >= 0:
            raise ValueError("pgpe needs stdev_max_change > 0 and stdev_lr >= 0")

    def init(self, ctx: Context, mean: jax.Array) -> PGPEState:
        sigma = self.initial_sigma(ctx.initial_noise_std)
        return PGPEState(mean=mean, stdev=jnp.full_like(mean, sigma), opt_state=ctx.optimizer.init(mean))

    def noise_std(self, ctx, state, generation):
        return state.stdev.mean()

    def draw(self, ctx, gen_key, start, size):
        return pair_noise(gen_key, start, size, ctx.num_params)

    def sample(self, ctx, state, gen_key, generation, start, size, draws=None):
        unit = noise.chunk_noise(gen_key, start, size, ctx.num_params, True) if draws is None else noise.mirrored(draws)
        return state.mean[None, :] + state.stdev[None, :] * unit

    def weights(self, ctx, state, fitness):
        shaped = noise.shape_fitness(fitness, ctx.fitness_shaping)
        return shaped - shaped.mean()

    def chunk_stats(self, ctx, state, gen_key, generation, start, weights, draws=None):
        z = self.draw(ctx, gen_key, start, weights.shape[0]) if draws is None else draws
        plus, minus = weights[0::2], weights[1::2]
        return {"mean": ((plus - minus) * 0.5) @ z, "stdev": ((plus + minus) * 0.5) @ (z * z - 1.0)}

    def update(self, ctx, state, stats, fitness, generation):
        pairs = ctx.num_members // 2
        grad = state.stdev * stats["mean"] / pairs
        loss_grad = -grad + ctx.weight_decay * state.mean
        updates, opt_state = ctx.optimizer.update(loss_grad, state.opt_state, state.mean)
        mean = optax.apply_updates(state.mean, updates)
        stdev_grad = state.stdev * stats["stdev"] / pairs
        change = jnp.clip(self.stdev_lr * stdev_grad, -self.stdev_max_change * state.stdev,
                          self.stdev_max_change * state.stdev)
        stdev = jnp.maximum(state.stdev + change, self.stdev_min)
        new = state.replace(mean=mean, stdev=stdev, opt_state=opt_state)
        return new, info(grad, updates, stdev.mean(), current_learning_rate(opt_state))
