"""Gymnasium throughput and a MuJoCo learning curve: jes's host rollout vs a plain loop vs EvoTorch's GymNE.

CartPole-v1: env steps per second of evaluating a generation's members, medians over ``--repeats``
generations, printed side by side: jes's host rollout (GRU 5x2, 367 parameters) in 1 process and as a master
with 2 local worker processes; a plain loop stepping one env at a time with the same jitted policy called for
that env alone; EvoTorch 0.6's ``GymNE`` (benchmark-only: ``pip install evotorch==0.6.1``) with an MLP
4-52-2 of 366 parameters (EvoTorch has no GRU of that shape) under PGPE, in-process (``num_actors=0``)
and over 2 Ray actors. Mean episode lengths are printed too (short episodes cost more resets per step).
``--mujoco Hopper-v5`` adds a jes learning curve on a MuJoCo env (MLP 32x32) with env steps/s and wall time.
EnvPool (``pip install envpool``, benchmark-only) is measured as a batch backend when it is installed.

    PYTHONPATH=. python benchmarks/gymnasium_envs.py --members 256 --repeats 5 --seed 0 --mujoco Hopper-v5

``--table`` runs instead the portable-es table (benchmarks/portable_es.py) on Gymnasium's CartPole-v1: GRU 5x2,
256 antithetic pairs, 25 generations, the five optimizers, seeds 0..4 (``--table-seeds``):

    PYTHONPATH=. python benchmarks/gymnasium_envs.py --table --table-seeds 5
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


def evotorch_rates(members: int, repeats: int, num_actors: int, seed: int) -> tuple[list[float], float]:
    """EvoTorch GymNE + PGPE on CartPole-v1: env steps/s per generation and the mean episode length."""
    import torch
    from evotorch.algorithms import PGPE
    from evotorch.neuroevolution import GymNE

    torch.manual_seed(seed)
    problem = GymNE(env="CartPole-v1", network="Linear(obs_length, 52) >> Tanh() >> Linear(52, act_length)",
                    num_actors=num_actors, observation_normalization=False, num_episodes=1)
    searcher = PGPE(problem, popsize=members, center_learning_rate=0.03, stdev_learning_rate=0.1, stdev_init=0.1)
    searcher.step()  # actors started and warm
    rates, lengths = [], []
    for _ in range(repeats):
        before = problem.status["total_interaction_count"]
        episodes = problem.status["total_episode_count"]
        t0 = time.perf_counter()
        searcher.step()
        steps = problem.status["total_interaction_count"] - before
        rates.append(steps / (time.perf_counter() - t0))
        lengths.append(steps / (problem.status["total_episode_count"] - episodes))
    if num_actors:
        problem.kill_actors()
    return rates, float(np.mean(lengths)), problem.solution_length


def envpool_rate(trainer: Trainer, state, members: int) -> tuple[float, float] | None:
    """EnvPool as a batch backend: ``members`` CartPole envs in one C++ pool, the same GRU as one jitted vmapped call
    per step, each env's first episode counted (EnvPool seeds a pool, not each episode, and auto-resets). ``None``
    when envpool is not installed."""
    try:
        import envpool
    except ImportError:
        return None
    flat = jnp.stack([trainer.member(state, np.int32(m)) for m in range(members)])
    params = jax.vmap(trainer.unravel)(flat)
    scale = trainer.obs_scale(state)

    @jax.jit
    def act(p, c, o):
        return jax.vmap(lambda p, c, o: (lambda c, out: (c, trainer.spec.action(out)))(
            *trainer.fns.apply(p, c, (o - scale[0]) * scale[1])))(p, c, o)

    pool = envpool.make_gymnasium("CartPole-v1", num_envs=members, seed=0, num_threads=1)  # 1: its threads spin
    carry = jax.tree.map(lambda c: jnp.broadcast_to(c, (members,) + c.shape), trainer.fns.initial_carry())
    obs, _ = pool.reset()
    act(params, carry, jnp.asarray(obs, jnp.float32))  # compile
    live, steps, t0 = np.ones(members, bool), 0, time.perf_counter()
    while live.any():
        carry, actions = act(params, carry, jnp.asarray(obs, jnp.float32))
        obs, _, terminated, truncated, _ = pool.step(np.asarray(actions))
        steps += int(live.sum())
        live &= ~(terminated | truncated)
    return steps / (time.perf_counter() - t0), steps / members


def mujoco_curve(env_id: str, generations_: int, members: int, seed: int) -> None:
    """A jes learning curve on a MuJoCo env: centre return, population mean, env steps/s and wall time."""
    result = jes.train(jes.MLPPolicy(hidden_sizes=(32, 32)), f"gymnasium:{env_id}", "adam", key=seed,
                       num_members=members, num_generations=generations_, eval_every=1, eval_episodes=4,
                       log_dir=None, progress=False)
    h = result.history
    print(f"\ngymnasium:{env_id}, MLP 32x32 ({result.trainer.num_params} params), {members} members, adam, key {seed}, "
          f"1 process:")
    print(f"{'gen':>4}{'centre':>10}{'pop mean':>10}{'env steps':>12}{'steps/s':>10}{'wall s':>8}")
    for i, g in enumerate(h["generation"]):
        steps = h["env_steps"][i] - (h["env_steps"][i - 1] if i else 0)
        print(f"{int(g):>4}{h['centre_return'][i]:>10.1f}{h['pop_mean'][i]:>10.1f}{int(h['env_steps'][i]):>12,}"
              f"{steps / h['generation_time'][i]:>10,.0f}{h['wall_time'][i]:>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warm-generations", type=int, default=0, help="train first, so episodes are longer")
    parser.add_argument("--no-evotorch", action="store_true")
    parser.add_argument("--mujoco", default=None, metavar="ID", help="also a learning curve on e.g. Hopper-v5")
    parser.add_argument("--mujoco-generations", type=int, default=5)
    parser.add_argument("--mujoco-members", type=int, default=64)
    parser.add_argument("--table", action="store_true", help="the portable-es table on Gymnasium CartPole-v1 instead")
    parser.add_argument("--table-seeds", type=int, default=5)
    args = parser.parse_args()
    if args.table:
        import importlib.util

        spec = importlib.util.spec_from_file_location("portable_es", os.path.join(_HERE, "portable_es.py"))
        portable_es = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(portable_es)
        table = argparse.Namespace(optimizers=",".join(portable_es.OPTIMIZERS), seeds=args.table_seeds,
                                   generations=25, pairs=256, eval_episodes=64)
        portable_es.benchmark(ENV, jes.GRUPolicy(hidden=5, layers=2), table)
        return
    print("command: python benchmarks/gymnasium_envs.py " + " ".join(sys.argv[1:]))
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    config = jes.ESConfig(num_members=args.members, eval_episodes=8)
    trainer = Trainer(jes.GRUPolicy(hidden=5, layers=2), ENV, "novograd", config)
    state = trainer.init_state(args.seed)
    host = HostGeneration(trainer)
    for _ in range(args.warm_generations):
        state, _ = host.step(state, False, True)
    _, first = host.step(state, False, True)  # compile
    one = generations(host.step, state, args.repeats)
    jes_length = int(first["env_steps"]) / (args.members * config.episodes_per_member)
    secret = new_secret()
    with Master(trainer, "127.0.0.1:0", secret=secret, env=ENV, optimizer="novograd",
                **LOCAL_MASTER_OPTIONS) as server, LocalWorkers(f"127.0.0.1:{server.port}", secret, 2):
        server.wait_for_workers(state, 2, timeout=300)
        server.step(state, False, True)  # workers warm
        two = generations(server.step, state, args.repeats)
    plain = [plain_loop(trainer, state, min(args.members, 32)) for _ in range(args.repeats)]
    evo = {} if args.no_evotorch else {n: evotorch_rates(args.members, args.repeats, n, args.seed) for n in (0, 2)}
    print(f"\nGymnasium CartPole-v1, {args.members} members, key/seed {args.seed}, after {args.warm_generations} "
          f"generations; env steps/s, median of {args.repeats} generations:")
    print(f"{'':<58}{'steps/s':>10}{'episode':>9}")
    print(f"{'plain loop (1 env, 1 policy call per step), GRU 5x2':<58}{np.median(plain):>10,.0f}")
    print(f"{f'jes host rollout, 1 process, GRU 5x2 ({trainer.num_params})':<58}{np.median(one):>10,.0f}{jes_length:>9.1f}")
    print(f"{'jes host rollout, master + 2 local workers':<58}{np.median(two):>10,.0f}")
    for n, (rates, length, size) in evo.items():
        label = f"EvoTorch 0.6 GymNE+PGPE, {'1 process' if n == 0 else f'{n} Ray actors'}, MLP ({size})"
        print(f"{label:<58}{np.median(rates):>10,.0f}{length:>9.1f}")
    pooled = [envpool_rate(trainer, state, args.members) for _ in range(args.repeats)]
    if pooled[0] is not None:
        rate, length = np.median([r for r, _ in pooled]), pooled[0][1]
        print(f"{'EnvPool batch (C++ pool) + jes GRU, 1 call per step':<58}{rate:>10,.0f}{length:>9.1f}")
    if args.mujoco:
        mujoco_curve(args.mujoco, args.mujoco_generations, args.mujoco_members, args.seed)


if __name__ == "__main__":
    main()
