"""ARS: augmented random search, V1-t and V2-t (Mania, Guy & Recht 2018)."""
from __future__ import annotations

import dataclasses
import numbers
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from jes.strategies.base import (Context, Strategy, check_optimizer_free, check_positive_field, info, isotropic_draws,
                                isotropic_members, isotropic_weighted_noise)


@struct.dataclass
class ARSState:
    """``mean`` ``[P]`` and the exploration noise ``noise_std`` (fixed, as in the paper)."""

    mean: jax.Array
    noise_std: jax.Array


@dataclasses.dataclass(frozen=True)
class ARS(Strategy):
    """Augmented random search: mirrored directions ``mean +/- nu * delta_p``; the best ``b`` directions,
    ranked by ``max(r+, r-)``, step the mean by ``step_size / (b * sigma_R) * sum (r+ - r-) delta``,
    ``sigma_R`` the std of those ``2b`` rewards (raw rewards, no shaping).

    Args:
        step_size: ``alpha`` (``None``: 1.0 for policies with :func:`jes.train`, 0.1 for
            :func:`jes.optimize` / :class:`jes.AskTell`). The step is normalised by the reward std, so
            its size does not follow the returns' scale; on CartPole and Pendulum (MLP 32x32, 512
            members) 1.0 solves in fewer generations than 0.1, which leaves Pendulum unsolved in 100
            generations, while on smooth functions 1.0 stalls where 0.1 converges (benchmarks/README.md).
        top_directions: ``b`` (``None``: half the directions; ``b`` = all directions is ARS V1/V2
            without "-t").
        version: ``"v2"`` (observations normalised by the run's running statistics, V2-t) or
            ``"v1"`` (raw observations, V1-t; overrides ``ESConfig.normalize_observations``).
        noise_std_init: ``nu``, the initial noise std (``None``: ``ESConfig.noise_std``).
    """

    step_size: float | None = None
    top_directions: int | None = None
    version: str = "v2"
    noise_std_init: float | None = None

    name = "ars"
    sigma_field = "noise_std_init"
    isotropic = True
    PER_USE_DEFAULTS: ClassVar[dict] = {"step_size": (1.0, 0.1)}

    def antithetic(self, requested: bool) -> bool:
        return True

    def uses_obs_norm(self, requested: bool) -> bool:
        return requested and self.version == "v2"

    def default_population(self, num_params: int) -> int:
        return 64

    def validate(self, ctx: Context) -> None:
        check_optimizer_free(self, ctx.optimizer)
        self.check_per_use_defaults()
        check_positive_field(self, "noise_std_init")
        if self.version not in ("v1", "v2"):
            raise ValueError(f"ars version must be 'v1' or 'v2', got {self.version!r}")
        if ctx.num_members % 2:
            raise ValueError(f"ars samples mirrored directions; num_members={ctx.num_members} must be even")
        pairs = ctx.num_members // 2
        b = self.top_directions  # (a float such as 2.5 failed deep in the weights: "cannot be interpreted as an integer")
        whole = isinstance(b, numbers.Integral) and not isinstance(b, bool)
        if b is not None and not (whole and 1 <= b <= pairs):
            raise ValueError(f"ars top_directions must be in 1..{pairs} (the number of directions), "
                             f"got {self.top_directions}")

    def _top(self, num_members: int) -> int:
        return max(1, num_members // 4) if self.top_directions is None else self.top_directions

    def init(self, ctx, mean):
        nu = self.initial_sigma(ctx.initial_noise_std)
        return ARSState(mean=mean, noise_std=jnp.float32(nu))

    def noise_std(self, ctx, state, generation):
        return state.noise_std

    def draw(self, ctx, gen_key, start, size):
        return isotropic_draws(ctx, gen_key, start, size)

    def sample(self, ctx, state, gen_key, generation, start, size, draws=None):
        return isotropic_members(ctx, state.mean, state.noise_std, gen_key, start, size, draws)

    def weights(self, ctx, state, fitness):
        plus, minus = fitness[0::2], fitness[1::2]
        b = self._top(fitness.shape[0])
        order = jnp.argsort(-jnp.maximum(plus, minus), stable=True)
        selected = jnp.zeros(plus.shape, bool).at[order[:b]].set(True)
        used = jnp.concatenate([jnp.where(selected, plus, 0.0), jnp.where(selected, minus, 0.0)])
        mean = used.sum() / (2 * b)
        # Two passes: E[r^2] - E[r]^2 cancels in float32 for returns with a large offset (a function at 1e5 +
        # something: the std of the part that varies came out as rounding noise, and the step with it)
        deviation = jnp.where(jnp.concatenate([selected, selected]), used - mean, 0.0)
        reward_std = jnp.sqrt((deviation * deviation).sum() / (2 * b))
        scale = jnp.where(reward_std > 0, 1.0 / (b * jnp.where(reward_std > 0, reward_std, 1.0)), 0.0)
        pair_w = jnp.stack([jnp.where(selected, plus, 0.0), jnp.where(selected, minus, 0.0)], axis=1)
        return (pair_w * scale).reshape(-1)

    def chunk_stats(self, ctx, state, gen_key, generation, start, weights, draws=None):
        return isotropic_weighted_noise(ctx, gen_key, start, weights, draws)

    def update(self, ctx, state, stats, fitness, generation):
        step = self.resolved("step_size") * stats
        return state.replace(mean=state.mean + step), info(stats, step, state.noise_std, self.resolved("step_size"))
