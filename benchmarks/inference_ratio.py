"""ES against batch inference: env steps/s of a whole jes generation vs the same episodes with ONE parameter set.

For each policy size and population, side by side in one process:

* (a) jes full rank: the compiled generation step (sample, rollout, update), members with their own weights;
* (b) jes low rank (EGGROLL), r = 1 and 4: the same step, a shared GEMM plus each member's rank-r correction;
* (c) batch inference: the same rollout (same env, episodes, slots and compaction) with one shared parameter
  set, the policy applied as one GEMM per env step, no noise and no update.

Printed: medians over ``--repeats`` timed generations (after one warm-up), env steps/s, and the ratios
(a)/(c), (b)/(c). The centre is not evaluated in the timed generations. Full rank is skipped where its
members would stream more than ``--full-rank-limit`` parameter floats per env step (C x P; it is then
memory-bound and takes minutes per generation here).

    python benchmarks/inference_ratio.py                           # Pendulum MLP H x H, H in 64, 256, 1024
    python benchmarks/inference_ratio.py --envs minatar --hidden 64 --members 512
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jes  # noqa: E402
from jes.rollout import run_slots  # noqa: E402
from jes.strategies import noise  # noqa: E402


class MinAtarCNN(nn.Module):
    """A MinAtar-sized CNN: one 3x3 conv with ``channels`` filters, then a ``hidden`` dense layer and the head."""

    channels: int = 16
    hidden: int = 64
    num_outputs: int | None = None

    @nn.compact
    def __call__(self, obs):
        x = nn.relu(nn.Conv(self.channels, (3, 3), padding="VALID")(obs.astype(jnp.float32)))
        x = nn.relu(nn.Dense(self.hidden)(x.reshape(-1)))
        return nn.Dense(self.num_outputs)(x)


class SharedParams:
    """The rollout's view of slots that all use one parameter set (closed over: one GEMM per step)."""

    def __init__(self, fns, variables):
        self.fns, self.variables = fns, variables

    def initial_carry(self):
        return self.fns.initial_carry()

    def apply(self, _, carry, obs):
        return self.fns.apply(self.variables, carry, obs)


def time_generations(trainer, repeats):
    state = trainer.init_state(0)
    step = trainer.step
    state, metrics = step(state, False, True)  # compile + warm-up
    jax.block_until_ready(state)
    times, steps = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        state, metrics = step(state, False, True)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - start)
        steps.append(int(metrics["env_steps"]))
    return statistics.median(times), statistics.median(steps)


def time_inference(trainer, repeats):
    """The members' episodes of generation 0 (same keys, slots and compaction) with the centre's parameters."""
    state = trainer.init_state(0)
    members = jnp.arange(trainer.config.num_members, dtype=jnp.int32)
    keys = noise.episode_keys(noise.generation_key(state.es_key, 0), members, 1, trainer.antithetic).reshape(-1)

    @jax.jit
    def rollout(flat, keys):
        shared = SharedParams(trainer.fns, trainer.unravel(flat))
        slot_params = jnp.zeros((keys.shape[0], 0), jnp.float32)
        out = run_slots(shared, trainer.spec, slot_params, keys, jnp.zeros(keys.shape[0], bool),
                        obs_scale=trainer.obs_scale(state), min_slots=trainer.rollout_min_batch)
        return out["returns"], out["steps"].sum()

    jax.block_until_ready(rollout(state.params, keys))
    times, steps = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        _, total = jax.block_until_ready(rollout(state.params, keys))
        times.append(time.perf_counter() - start)
        steps.append(int(total))
    return statistics.median(times), statistics.median(steps)


def workload(env: str, hidden: int):
    if env == "pendulum":
        return jes.MLPPolicy((hidden, hidden)), "Pendulum-v1", f"MLP {hidden}x{hidden}"
    if env == "minatar":
        return MinAtarCNN(hidden=hidden), "Breakout-MinAtar", f"CNN 16c3x3 + {hidden}"
    raise ValueError(env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="pendulum", help="pendulum and/or minatar, comma-separated")
    parser.add_argument("--hidden", default="64,256,1024")
    parser.add_argument("--members", default="512,4096")
    parser.add_argument("--ranks", default="1,4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--full-rank-limit", type=float, default=1.5e8,
                        help="skip full rank above this many member parameter floats (members x P)")
    parser.add_argument("--limit", type=float, default=5e8,
                        help="skip a whole cell above this many GEMM multiply-adds per env step (members x P)")
    args = parser.parse_args()
    ranks = [int(r) for r in args.ranks.split(",")]
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs; medians of "
          f"{args.repeats} generations; env steps/s")
    header = ["env / policy", "P", "members", "full rank", *[f"low rank r={r}" for r in ranks], "inference",
              "full / inf", *[f"r={r} / inf" for r in ranks]]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for env_name in args.envs.split(","):
        for hidden in (int(h) for h in args.hidden.split(",")):
            for members in (int(m) for m in args.members.split(",")):
                policy, env, label = workload(env_name, hidden)
                base = dict(num_members=members, eval_episodes=2, max_episode_steps=args.max_steps,
                            normalize_observations=False)
                trainers = {"full": jes.Trainer(policy, env, "adam", jes.ESConfig(**base))}
                num_params = trainers["full"].num_params
                if members * num_params > args.limit:
                    print(f"| {label} | {num_params:,} | {members} | skipped: members x P = "
                          f"{members * num_params:.1e} per step is beyond this machine's time budget |")
                    continue
                for r in ranks:
                    trainers[r] = jes.Trainer(policy, env, "adam", jes.ESConfig(**base, perturbation=jes.LowRank(r)))
                inf_time, inf_steps = time_inference(trainers["full"], args.repeats)
                rates = {"inf": inf_steps / inf_time}
                for name, trainer in trainers.items():
                    if name == "full" and members * num_params > args.full_rank_limit:
                        rates[name] = None
                        continue
                    seconds, steps = time_generations(trainer, args.repeats)
                    rates[name] = steps / seconds
                fmt = lambda v: "skipped" if v is None else f"{v:,.0f}"
                ratio = lambda v: "-" if v is None else f"{v / rates['inf']:.2f}"
                row = [label, f"{num_params:,}", str(members), fmt(rates["full"]), *[fmt(rates[r]) for r in ranks],
                       fmt(rates["inf"]), ratio(rates["full"]), *[ratio(rates[r]) for r in ranks]]
                print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
