"""Gymnasium throughput and MuJoCo learning curves: jes's host rollout vs a plain loop vs EvoTorch's GymNE.

Throughput (``--envs CartPole-v1,Hopper-v5``): env steps per second of evaluating a generation's members,
printed side by side, the rows interleaved seed by seed so all of them see the same machine load: jes's
host rollout in 1 process and as a master with 2 local worker processes; a plain loop stepping one env at a
time with the same jitted policy called for that env alone; EvoTorch 0.6's ``GymNE`` (benchmark-only:
``pip install evotorch==0.6.1``) under PGPE, in-process (``num_actors=0``) and over 2 Ray actors. CartPole:
jes's GRU 5x2 (367 parameters) against EvoTorch's MLP 4-52-2 (366; EvoTorch has no GRU of that shape);
Hopper: the same MLP 32x32 (tanh) in both. Per seed each row is the median of ``--repeats`` generations;
the table gives the median [min, max] over ``--seeds`` and jes's 1-process rate over each row's. Mean
episode lengths are printed too (short episodes cost more resets per step). EnvPool (``pip install
envpool``, benchmark-only) is measured as a batch backend for CartPole when it is installed.
``--mujoco Hopper-v5`` adds jes learning curves (MLP 32x32, adam) over the same seeds.

    PYTHONPATH=. python benchmarks/gymnasium_envs.py --envs CartPole-v1,Hopper-v5 --seeds 0,1,2,3,4 --mujoco Hopper-v5

``--table`` runs instead the portable-es table (benchmarks/portable_es.py) on Gymnasium's CartPole-v1: GRU 5x2,
256 antithetic pairs, 25 generations, the five optimizers, seeds 0..4 (``--table-seeds``):

    PYTHONPATH=. python benchmarks/gymnasium_envs.py --table --table-seeds 5
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))

import gymnasium  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jes  # noqa: E402
from jes.distributed.local import LOCAL_MASTER_OPTIONS, LocalWorkers, new_secret  # noqa: E402
from jes.distributed.master import Master  # noqa: E402
from jes.generation import Trainer  # noqa: E402
from jes.host_step import HostGeneration  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import print_load, print_provenance, seeds_or_count  # noqa: E402

ENV = "gymnasium:CartPole-v1"
NAN = float("nan")

# The workloads of the throughput table: the env, jes's policy, and EvoTorch's network of (about) the same size.
WORKLOADS = {
    "CartPole-v1": dict(policy=lambda: jes.GRUPolicy(hidden=5, layers=2), label="GRU 5x2", optimizer="novograd",
                        evotorch="Linear(obs_length, 52) >> Tanh() >> Linear(52, act_length)", evotorch_label="MLP 4-52-2"),
    "Hopper-v5": dict(policy=lambda: jes.MLPPolicy(hidden_sizes=(32, 32)), label="MLP 32x32", optimizer="adam",
                      evotorch="Linear(obs_length, 32) >> Tanh() >> Linear(32, 32) >> Tanh() >> Linear(32, act_length)",
                      evotorch_label="MLP 32x32"),
}


def plain_loop(trainer: Trainer, state, env_id: str, members: int) -> float:
    """Env steps/s of evaluating ``members`` members one env and one policy call at a time."""
    params = [trainer.params_tree(np.asarray(trainer.member(state, np.int32(m)))) for m in range(members)]
    scale = trainer.obs_scale(state)

    @jax.jit
    def act(p, c, o):
        c, out = trainer.fns.apply(p, c, (o - scale[0]) * scale[1])
        return c, trainer.spec.action(out)

    env = gymnasium.make(env_id, disable_env_checker=True)
    to_env = (lambda a: int(a)) if trainer.spec.discrete else (lambda a: np.asarray(a))
    act(params[0], trainer.fns.initial_carry(), jnp.zeros(trainer.spec.obs_shape, jnp.float32))  # compile
    steps, t0 = 0, time.perf_counter()
    for m, p in enumerate(params):
        obs, _ = env.reset(seed=m)
        carry = trainer.fns.initial_carry()
        for _ in range(trainer.spec.max_steps):
            carry, action = act(p, carry, jnp.asarray(obs, jnp.float32))
            obs, _, terminated, truncated, _ = env.step(to_env(action))
            steps += 1
            if terminated or truncated:
                break
    return steps / (time.perf_counter() - t0)


def env_alone(env_id: str, seconds: float = 1.0) -> float:
    """Env steps/s of the env by itself: one instance, a constant action, reset when an episode ends. The
    ceiling of any rollout that steps this env in one process."""
    env = gymnasium.make(env_id, disable_env_checker=True)
    action = env.action_space.sample() * 0
    env.reset(seed=0)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        _, _, terminated, truncated, _ = env.step(action)
        steps += 1
        if terminated or truncated:
            env.reset()
    return steps / (time.perf_counter() - t0)


class EvoTorchRows:
    """EvoTorch 0.6's ``GymNE`` + PGPE on ``env_id``: in-process (``num_actors=0``) and over Ray actors, each
    problem made once (actors started and warm) and a fresh searcher per seed."""

    def __init__(self, env_id: str, network: str, members: int, actors: tuple[int, ...]):
        from evotorch.neuroevolution import GymNE

        self.members = members
        self.problems = {n: GymNE(env=env_id, network=network, num_actors=n, observation_normalization=False,
                                  num_episodes=1) for n in actors}
        self.size = next(iter(self.problems.values())).solution_length
        for n in actors:
            self.generation(n, self.searcher(n, 0))  # actors started, torch warm

    def searcher(self, num_actors: int, seed: int):
        """A PGPE searcher on the problem with ``num_actors`` actors, seeded with ``seed``."""
        import torch
        from evotorch.algorithms import PGPE

        torch.manual_seed(seed)
        return PGPE(self.problems[num_actors], popsize=self.members, center_learning_rate=0.03,
                    stdev_learning_rate=0.1, stdev_init=0.1)

    def generation(self, num_actors: int, searcher) -> tuple[float, float]:
        """One generation of ``searcher``: env steps/s and the mean episode length."""
        problem = self.problems[num_actors]
        before = problem.status.get("total_interaction_count", 0)  # absent before a problem's first step
        count = problem.status.get("total_episode_count", 0)
        t0 = time.perf_counter()
        searcher.step()
        steps = problem.status["total_interaction_count"] - before
        return steps / (time.perf_counter() - t0), steps / (problem.status["total_episode_count"] - count)

    def close(self) -> None:
        for problem in self.problems.values():
            if problem.num_actors:
                problem.kill_actors()


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


def mujoco_curve(env_id: str, generations_: int, members: int, seeds: list[int]) -> None:
    """jes learning curves on a MuJoCo env over ``seeds``: centre return and population mean per generation
    (median [min, max] over the seeds), env steps/s and wall time."""
    runs = []
    for seed in seeds:
        t0 = time.perf_counter()
        result = jes.train(jes.MLPPolicy(hidden_sizes=(32, 32)), f"gymnasium:{env_id}", "adam", key=seed,
                           num_members=members, num_generations=generations_, eval_every=1, eval_episodes=4,
                           log_dir=None, progress=False)
        runs.append((result.history, time.perf_counter() - t0, result.trainer.num_params))
    print(f"\ngymnasium:{env_id}, MLP 32x32 ({runs[0][2]} params), {members} members, adam, 1 process, "
          f"keys {','.join(map(str, seeds))}: median [min, max] over the keys")
    print(f"{'gen':>4}{'centre return':>26}{'population mean':>26}{'env steps/s':>22}")

    def cell(values, fmt):
        return f"{format(np.median(values), fmt)} [{format(min(values), fmt)}, {format(max(values), fmt)}]"

    for i in range(generations_):
        centre = [h["centre_return"][i] for h, _, _ in runs]
        mean = [h["pop_mean"][i] for h, _, _ in runs]
        rate = [(h["env_steps"][i] - (h["env_steps"][i - 1] if i else 0)) / h["generation_time"][i] for h, _, _ in runs]
        print(f"{i + 1:>4}{cell(centre, '.1f'):>26}{cell(mean, '.1f'):>26}{cell(rate, ',.0f'):>22}")
    steps = [int(h["env_steps"][-1]) for h, _, _ in runs]
    print(f"env steps per run {cell(steps, ',')}; wall s per run (trainer built, compiles included) "
          f"{cell([w for _, w, _ in runs], '.1f')}")


def throughput(env_id: str, members: int, repeats: int, seeds: list[int], warm: int, evotorch: bool) -> None:
    """The rows of one env's throughput table, interleaved seed by seed so every row sees the same load."""
    work = WORKLOADS[env_id]
    config = jes.ESConfig(num_members=members, eval_episodes=8)
    trainer = Trainer(work["policy"](), f"gymnasium:{env_id}", work["optimizer"], config)
    host = HostGeneration(trainer)
    states = {}
    for seed in seeds:
        states[seed] = trainer.init_state(seed)
        for _ in range(warm):
            states[seed], _ = host.step(states[seed], False, True)
    host.step(states[seeds[0]], False, True)  # compile
    label = f"{work['label']} ({trainer.num_params} params)"
    rows: dict[str, list[tuple[float, float]]] = {}
    secret = new_secret()
    evo = EvoTorchRows(env_id, work["evotorch"], members, (0, 2)) if evotorch else None
    try:
        with Master(trainer, "127.0.0.1:0", secret=secret, env=f"gymnasium:{env_id}", optimizer=work["optimizer"],
                    **LOCAL_MASTER_OPTIONS) as server, LocalWorkers(f"127.0.0.1:{server.port}", secret, 2):
            server.wait_for_workers(states[seeds[0]], 2, timeout=300)
            server.step(states[seeds[0]], False, True)  # workers warm
            for seed in seeds:
                # Each row is one generation (its own state moving on); the rows take turns generation by
                # generation, so a change of machine load falls on all of them.
                own = dict(host=states[seed], master=states[seed])
                searchers = {n: evo.searcher(n, seed) for n in (0, 2)} if evo is not None else {}

                def jes_row(kind, step):
                    t0 = time.perf_counter()
                    own[kind], metrics = step(own[kind], False, True)
                    steps = int(metrics["env_steps"])
                    return steps / (time.perf_counter() - t0), steps / (members * config.episodes_per_member)

                # The master serves only inside its calls: after a seed's other rows, its workers are back and
                # warm on this seed's run before its generations are timed.
                server.wait_for_workers(states[seed], 2, timeout=300)
                server.step(states[seed], False, True)
                timed = {"the env alone: 1 env, a constant action, no policy": lambda: (env_alone(env_id), NAN),
                         "plain loop: 1 env, 1 jitted policy call per step":
                             lambda: (plain_loop(trainer, states[seed], env_id, min(members, 32)), NAN),
                         f"jes host rollout, 1 process, {label}": lambda: jes_row("host", host.step),
                         "jes host rollout, master + 2 local worker processes":
                             lambda: (jes_row("master", server.step)[0], NAN)}
                for n, searcher in searchers.items():
                    name = (f"EvoTorch 0.6 GymNE+PGPE, {'1 process' if n == 0 else f'{n} Ray actors'}, "
                            f"{work['evotorch_label']} ({evo.size} params)")
                    timed[name] = lambda n=n, searcher=searcher: evo.generation(n, searcher)
                if env_id == "CartPole-v1" and importlib.util.find_spec("envpool") is not None:
                    timed["EnvPool batch (C++ pool) + jes GRU, 1 call per step"] = \
                        lambda: envpool_rate(trainer, states[seed], members)
                cells: dict[str, list] = {name: [] for name in timed}
                for _ in range(repeats):
                    for name, one in timed.items():
                        cells[name].append(one())
                for name, got in cells.items():
                    rows.setdefault(name, []).append((float(np.median([r for r, _ in got])),
                                                      float(np.mean([l for _, l in got]))))
    finally:
        if evo is not None:
            evo.close()
    print(f"\nGymnasium {env_id}, {members} members, keys/seeds {','.join(map(str, seeds))}, after {warm} training "
          f"generations; env steps/s: per seed the median of {repeats} generations (the rows taking turns generation "
          f"by generation), then the median [min, max] over the seeds; the ratio per seed, then its median [min, "
          f"max]; load average now {os.getloadavg()[0]:.1f}")
    jes_one = [r for r, _ in rows[f"jes host rollout, 1 process, {label}"]]
    print(f"{'':<60}{'env steps/s':>26}{'jes 1 process / row':>24}{'episode':>9}")
    for name, cells in rows.items():
        rates = [r for r, _ in cells]
        ratios = [j / r for j, r in zip(jes_one, rates)]
        lengths = [l for _, l in cells if not np.isnan(l)]
        length = float(np.mean(lengths)) if lengths else NAN
        spread = f"{np.median(rates):,.0f} [{min(rates):,.0f}, {max(rates):,.0f}]"
        ratio = f"{np.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}]"
        print(f"{name:<60}{spread:>26}{ratio:>24}{'' if np.isnan(length) else f'{length:.1f}':>9}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envs", default="CartPole-v1", help=f"comma-separated, of {', '.join(WORKLOADS)}")
    parser.add_argument("--members", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5, help="timed generations per seed and row")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated keys/seeds")
    parser.add_argument("--warm-generations", type=int, default=0, help="train first, so episodes are longer")
    parser.add_argument("--no-evotorch", action="store_true")
    parser.add_argument("--mujoco", default=None, metavar="ID", help="also learning curves on e.g. Hopper-v5")
    parser.add_argument("--mujoco-generations", type=int, default=10)
    parser.add_argument("--mujoco-members", type=int, default=64)
    parser.add_argument("--table", action="store_true", help="the portable-es table on Gymnasium CartPole-v1 instead")
    parser.add_argument("--table-seeds", type=seeds_or_count, default="5",
                        help="--table: a comma list of seeds (0,1,2 or 0-4) or a count N, seeds 0..N-1 (default 5)")
    parser.add_argument("--table-optimizers", default=None, help="comma-separated (default: the five)")
    args = parser.parse_args()
    if not args.table and not args.no_evotorch and importlib.util.find_spec("evotorch") is None:
        parser.error("evotorch is not importable here: pip install evotorch (a peer for comparison, never a jes "
                     "dependency), or pass --no-evotorch to time jes alone")
    if args.table:  # portable_es.benchmark prints the provenance, its seeds included
        spec = importlib.util.spec_from_file_location("portable_es", os.path.join(_HERE, "portable_es.py"))
        portable_es = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(portable_es)
        table = argparse.Namespace(optimizers=args.table_optimizers or ",".join(portable_es.OPTIMIZERS),
                                   seeds=args.table_seeds,
                                   generations=25, pairs=256, eval_episodes=64)
        portable_es.benchmark(ENV, jes.GRUPolicy(hidden=5, layers=2), table)
        return
    for env_id in args.envs.split(","):  # before any run: not after the envs before it have run for minutes
        if env_id not in WORKLOADS:
            parser.error(f"--envs: unknown env {env_id!r}; choose from {', '.join(WORKLOADS)}")
    for env_id in dict.fromkeys([*args.envs.split(","), *([args.mujoco] if args.mujoco else [])]):
        try:  # a MuJoCo env needs gymnasium[mujoco] (mujoco, imageio): said now, not as a traceback mid-run
            gymnasium.make(env_id).close()
        except Exception as err:  # noqa: BLE001 - any reason it cannot be made
            parser.error(f"cannot make Gymnasium's {env_id!r} here: {type(err).__name__}: {err} (MuJoCo envs need "
                         f"pip install \"gymnasium[mujoco]\")")
    print_provenance()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    seeds = [int(s) for s in args.seeds.split(",")]
    for env_id in args.envs.split(","):
        members = args.members if env_id == "CartPole-v1" else args.mujoco_members
        throughput(env_id, members, args.repeats, seeds, args.warm_generations, not args.no_evotorch)
    if args.mujoco:
        mujoco_curve(args.mujoco, args.mujoco_generations, args.mujoco_members, seeds)


if __name__ == "__main__":
    main()
    print_load()
