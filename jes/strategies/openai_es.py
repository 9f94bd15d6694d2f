"""OpenAI-ES (Salimans et al. 2017): antithetic Gaussian perturbations, shaped fitness, an optax step."""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jes.optimizers import current_learning_rate
from jes.strategies import noise
from jes.strategies.base import Context, Strategy, info, isotropic_draws, isotropic_members, isotropic_weighted_noise


@struct.dataclass
class OpenAIESState:
    """``mean`` ``[P]``; ``opt_state`` of the optax optimizer; ``noise_std`` sigma (unused with a schedule)."""

    mean: jax.Array
    opt_state: Any
    noise_std: jax.Array


@dataclasses.dataclass(frozen=True)
class OpenAIES(Strategy):
    """OpenAI-ES: ``theta_i = mean + sigma * eps_i``, gradient ``sum_i F_i eps_i / (n sigma)`` into an optax optimizer.

    Sigma is ``ESConfig.noise_std`` (a constant or a schedule), fitness shaping
    ``ESConfig.fitness_shaping``, weight decay ``ESConfig.weight_decay``, mirrored
    sampling ``ESConfig.antithetic``; the optimizer is ``jes.train``'s.
    """

    name = "openai_es"
    uses_optimizer = True
    default_optimizer = "adam"
    isotropic = True

    def default_population(self, num_params: int) -> int:
        return 64

    def init(self, ctx: Context, mean: jax.Array) -> OpenAIESState:
        return OpenAIESState(mean=mean, opt_state=ctx.optimizer.init(mean), noise_std=jnp.float32(ctx.initial_noise_std))

    def noise_std(self, ctx, state, generation):
        scheduled = ctx.sigma_at(generation)
        return state.noise_std if scheduled is None else scheduled

    def draw(self, ctx, gen_key, start, size):
        return isotropic_draws(ctx, gen_key, start, size)

    def sample(self, ctx, state, gen_key, generation, start, size, draws=None):
        return isotropic_members(ctx, state.mean, self.noise_std(ctx, state, generation), gen_key, start, size, draws)

    def weights(self, ctx, state, fitness):
        return noise.shape_fitness(fitness, ctx.fitness_shaping)

    def chunk_stats(self, ctx, state, gen_key, generation, start, weights, draws=None):
        return isotropic_weighted_noise(ctx, gen_key, start, weights, draws)

    def update(self, ctx, state, stats, fitness, generation):
        sigma = self.noise_std(ctx, state, generation)
        grad = noise.es_gradient(stats, ctx.num_members, sigma)
        loss_grad = -grad + ctx.weight_decay * state.mean
        updates, opt_state = ctx.optimizer.update(loss_grad, state.opt_state, state.mean)
        mean = optax.apply_updates(state.mean, updates)
        lr = current_learning_rate(opt_state)
        return state.replace(mean=mean, opt_state=opt_state), info(grad, updates, sigma, lr)
