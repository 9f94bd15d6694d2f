"""Gymnasium CartPole-v1 throughput: jes's host rollout (1 and 2 processes) vs a plain one-env-at-a-time loop.

Env steps per second of evaluating a generation's members (GRU 5x2, 367 parameters), medians over
``--repeats`` generations, printed side by side. The plain loop steps one env at a time and calls the
same jitted policy once per step for that env alone. EvoTorch's GymNE is not measured here (not installed).

    PYTHONPATH=. python benchmarks/gymnasium.py --members 256 --repeats 5
"""
from __future__ import annotations

import argparse
import os
import sys
import time

# Run as a script, this file's folder is sys.path[0] and this file would shadow the gymnasium package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import gymnasium  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jes  # noqa: E402
from jes.distributed.local import LOCAL_MASTER_OPTIONS, LocalWorkers, new_secret  # noqa: E402
from jes.distributed.master import Master  # noqa: E402
from jes.generation import Trainer  # noqa: E402
from jes.host_step import HostGeneration  # noqa: E402

ENV = "gymnasium:CartPole-v1"


def plain_loop(trainer: Trainer, state, members: int) -> float:
    """Env steps/s of evaluating ``members`` members one env and one policy call at a time."""
    params = [trainer.params_tree(np.asarray(trainer.member(state, np.int32(m)))) for m in range(members)]
    scale = trainer.obs_scale(state)

    @jax.jit
    def act(p, c, o):
        c, out = trainer.fns.apply(p, c, (o - scale[0]) * scale[1])
        return c, trainer.spec.action(out)

    env = gymnasium.make("CartPole-v1", disable_env_checker=True)
    steps, t0 = 0, time.perf_counter()
    for m, p in enumerate(params):
        obs, _ = env.reset(seed=m)
        carry = trainer.fns.initial_carry()
        for _ in range(trainer.spec.max_steps):
            carry, action = act(p, carry, jnp.asarray(obs, jnp.float32))
            obs, _, terminated, truncated, _ = env.step(int(action))
            steps += 1
            if terminated or truncated:
                break
    return steps / (time.perf_counter() - t0)


def generations(step, state, repeats: int) -> list[float]:
    """Env steps/s of ``repeats`` generations of ``step`` (members only; the centre is not evaluated)."""
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, metrics = step(state, False, True)
        rates.append(int(metrics["env_steps"]) / (time.perf_counter() - t0))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warm-generations", type=int, default=3, help="train first, so episodes are not all ~10 steps")
    args = parser.parse_args()
    config = jes.ESConfig(num_members=args.members, eval_episodes=8)
    trainer = Trainer(jes.GRUPolicy(hidden=5, layers=2), ENV, "novograd", config)
    state = trainer.init_state(0)
    host = HostGeneration(trainer)
    for _ in range(args.warm_generations):
        state, _ = host.step(state, False, True)
    host.step(state, False, True)  # compile
    one = generations(host.step, state, args.repeats)
    secret = new_secret()
    with Master(trainer, "127.0.0.1:0", secret=secret, env=ENV, optimizer="novograd",
                **LOCAL_MASTER_OPTIONS) as server, LocalWorkers(f"127.0.0.1:{server.port}", secret, 2):
        server.wait_for_workers(state, 2, timeout=300)
        server.step(state, False, True)  # workers warm
        two = generations(server.step, state, args.repeats)
    plain = [plain_loop(trainer, state, min(args.members, 32)) for _ in range(args.repeats)]
    print(f"Gymnasium CartPole-v1, GRU 5x2 ({trainer.num_params} params), {args.members} members, after "
          f"{args.warm_generations} generations; env steps/s, median of {args.repeats}:")
    print(f"{'plain loop (1 env, 1 policy call per step)':<48}{np.median(plain):>12,.0f}")
    print(f"{'jes host rollout, 1 process':<48}{np.median(one):>12,.0f}")
    print(f"{'jes host rollout, master + 2 local workers':<48}{np.median(two):>12,.0f}")


if __name__ == "__main__":
    main()
