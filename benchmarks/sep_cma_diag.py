"""Per-generation diagnosis of sep-CMA-ES (and SNES) on Pendulum: why runs peak near -200 and fall back.

    python benchmarks/sep_cma_diag.py --seeds 0 --strategy sep_cma_es --generations 100
    python benchmarks/sep_cma_diag.py --seeds 0 --strategy snes

Same run as benchmarks/strategies.py's Pendulum row (MLP 32x32, 512 members, fresh centre
episodes every generation) without stopping at the threshold. Prints per generation: centre
return, population mean / max, mean sigma (sigma * mean sqrt(diag_c) for sep-CMA-ES), sep-CMA-ES's
global sigma, diag_c's min/max, ||p_sigma|| / chi_n, the mean step norm and ||mean||.
``--kw`` sets hyperparameters (``mean_lr=10,sigma_scale=1,unbiased_csa=False``: sep-CMA-ES's policy
defaults before issue 8); ``--strategy variant`` is sep-CMA-ES with two more knobs tried for issue 8
(``mu_frac``: recombine the best ``mu_frac * n``; ``rate_scale=0``: plain CMA-ES c_1, c_mu instead of
Ros & Hansen's ``(d + 2) / 3`` times them). The last line sums up: seeds solved and each seed's
(seed, first generation at the threshold, best centre return).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import struct  # noqa: E402

import jes  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Variant(jes.strategies.SepCMAES):
    """sep-CMA-ES with two more knobs tried for issue 8 (defaults: the strategy as it is)."""

    mu_frac: float = 0.5       # recombine the best mu_frac * n
    rate_scale: float = 1.0    # 1: Ros & Hansen's (d + 2) / 3 on c_1, c_mu; 0: plain CMA-ES rates

    def constants(self, d, n):
        return self.constants_for(d, n, mu=max(1, int(n * self.mu_frac)),
                                  rate_scale=1 + self.rate_scale * ((d + 2) / 3 - 1))


@struct.dataclass
class SNESMomentumState:
    mean: jax.Array
    sigma: jax.Array
    velocity: jax.Array


@dataclasses.dataclass(frozen=True)
class SNESVariant(jes.strategies.SNES):
    """SNES with knobs tried for issue 8 (defaults: SNES as it is).

    ``momentum``: the mean follows an exponential average of the utility-weighted noise sum,
    ``v = momentum * v + (1 - momentum) * sum_k u_k z_k`` (bias-corrected like Adam's first moment
    when ``debias``), ``mean += mean_lr * sigma * v``: the same expected step on a steady gradient,
    with the selection noise averaged over ~``(1 + momentum) / (1 - momentum)`` generations.
    ``mu_frac``: utilities ``max(0, log(mu_frac * n + 1) - log k)`` (0.5: SNES's top half).
    """

    momentum: float = 0.0
    debias: float = 1.0
    mu_frac: float = 0.5
    linear: float = 0.0       # 1: centred linear ranks scaled to the L2 norm of SNES's utilities
    speed: float = 0.0        # > 0: step = speed * ||sigma|| * v / ||v|| (fixed length, like ClipUp at max speed)

    def init(self, ctx, mean):
        s = super().init(ctx, mean)
        return SNESMomentumState(mean=s.mean, sigma=s.sigma, velocity=jnp.zeros_like(mean))

    def weights(self, ctx, state, fitness):
        n = fitness.shape[0]
        k = jnp.arange(1, n + 1, dtype=jnp.float32)
        raw = jnp.maximum(0.0, math.log(self.mu_frac * n + 1) - jnp.log(k))
        u = raw / raw.sum() - 1.0 / n
        if self.linear:
            lin = (n - k) / (n - 1) - 0.5
            ref = jes.strategies.snes.snes_utilities(n)
            u = lin * jnp.linalg.norm(ref) / jnp.linalg.norm(lin)
        return jes.strategies.base.sorted_utilities(fitness, u)

    def update(self, ctx, state, stats, fitness, generation):
        beta = self.momentum
        v = beta * state.velocity + (1 - beta) * stats["mean"]
        t = jnp.asarray(generation, jnp.float32) + 1
        vhat = v / (1 - beta ** t) if (self.debias and beta > 0) else v
        if self.speed:
            step = self.speed * jnp.linalg.norm(state.sigma) * vhat / jnp.linalg.norm(vhat)
        else:
            step = self.resolved("mean_lr") * state.sigma * vhat
        sigma = state.sigma * jnp.exp(0.5 * self._sigma_lr(ctx.num_params) * stats["sigma"])
        new = state.replace(mean=state.mean + step, sigma=sigma, velocity=v)
        return new, jes.strategies.base.info(stats["mean"], step, sigma.mean(), self.resolved("mean_lr"))


def make(strategy: str, kwargs: dict):
    if strategy == "variant":
        return Variant(**kwargs)
    if strategy == "snes_variant":
        return SNESVariant(**kwargs)
    return jes.strategies.get(strategy).__class__(**kwargs) if kwargs else jes.strategies.get(strategy)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", default="sep_cma_es")
    p.add_argument("--seeds", default="0")
    p.add_argument("--generations", type=int, default=100)
    p.add_argument("--kw", default="", help="strategy kwargs, e.g. mean_lr=5,sigma_init=0.1")
    p.add_argument("--env", default="Pendulum-v1")
    p.add_argument("--every", type=int, default=1, help="print every this many generations")
    p.add_argument("--stop", action="store_true", help="stop at the threshold (like the benchmark)")
    args = p.parse_args(argv)
    jes.use_cpu_cores()
    kwargs = {}
    for item in filter(None, args.kw.split(",")):
        k, v = item.split("=")
        words = {"None": None, "True": True, "False": False}
        kwargs[k] = words[v] if v in words else float(v)
    strategy = make(args.strategy, kwargs)
    import benchmarks.strategies as bs
    make_policy, threshold, _, members = bs.ENVS[args.env]
    config = jes.ESConfig(num_members=members, num_generations=args.generations)
    trainer = jes.Trainer(make_policy(), args.env, None, config, strategy=strategy)
    print(strategy.describe(), "params", trainer.num_params if hasattr(trainer, "num_params") else "?")
    summary = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        state = trainer.place(trainer.init_state(seed))
        compiled, _ = trainer.compiled_step(state)
        flag = jax.device_put(np.bool_(True), trainer.replicated)
        best, solved = -1e9, None
        for gen in range(args.generations):
            old = state.strategy
            state, m = compiled(state, flag, flag)
            m = {k: float(v) for k, v in m.items()}
            s = state.strategy
            cr = m["centre_return"]  # the centre of the state passed in: after `gen` generations
            best = max(best, cr)
            if solved is None and cr >= threshold:
                solved = gen
            step = float(jnp.linalg.norm(s.mean - old.mean))
            if hasattr(s, "diag_c"):
                d = s.mean.shape[0]
                chi = math.sqrt(d) * (1 - 1 / (4 * d) + 1 / (21 * d * d))
                extra = (f"sig {float(s.sigma):.4f} dc[{float(s.diag_c.min()):.2f},{float(s.diag_c.max()):.2f}] "
                         f"|ps|/chi {float(jnp.linalg.norm(s.path_sigma)) / chi:.3f} "
                         f"|pc| {float(jnp.linalg.norm(s.path_c)):.2f}")
            else:
                sg = s.sigma if hasattr(s, "sigma") else s.stdev
                extra = f"sig[{float(sg.min()):.3f},{float(sg.max()):.3f}]"
            if (gen + 1) % args.every == 0 or cr >= threshold:
                print(f"s{seed} g{gen + 1:3d} centre {cr:8.1f} pop {m['pop_mean']:8.1f}/{m['pop_max']:7.1f} "
                      f"std {m['noise_std']:.4f} {extra} step {step:.3f} |m| {float(jnp.linalg.norm(s.mean)):.2f}",
                      flush=True)
            if args.stop and solved:
                break
        summary.append((seed, solved, best))
        print(f"seed {seed}: solved at {solved}, best centre {best:.1f}", flush=True)
    print("SUMMARY", args.strategy, args.kw, f"{sum(1 for _, g, _ in summary if g)}/{len(summary)}",
          [(s, g, round(b)) for s, g, b in summary])


if __name__ == "__main__":
    main()
