"""ES on brax continuous control: what this CPU can do, and the GPU configuration of Salimans et al.

    python benchmarks/brax_envs.py                      # inverted_pendulum (spring) until solved (950 of 1000), then hopper
    python benchmarks/brax_envs.py --task inverted_pendulum
    python benchmarks/brax_envs.py --task hopper [--generations 30]      # a fixed budget
    python benchmarks/brax_envs.py --gpu-humanoid       # Salimans et al. 2017 on Humanoid: needs a GPU (pip install ".[cuda,brax]")
    python benchmarks/brax_envs.py --gpu-ant            # the same setup on Ant

Reported per task over seeds (``--seeds``, default 0-9; one trainer, so one compile, per task): how many seeds
solved it, the generations they needed, the final centre return (mean +- std), env steps/s of the generations
(compile excluded, median), compile time and the median wall time per seed.

The GPU configurations follow the paper: noise sigma 0.02, Adam with learning rate 0.01, 10,000 episodes per
generation (5,000 antithetic pairs), a 256x256 tanh MLP, observation normalisation, centred ranks, L2 0.005,
1000-step episodes. They use brax's ``mjx`` backend (MuJoCo physics, as in the paper); ``--backend spring``
trades fidelity for speed. Not measured: the machine these tables were made on has no GPU.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

# Scripts here must not shadow packages (brax.py did): drop this directory from the path all the same.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
sys.path.insert(0, os.path.dirname(HERE))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import jes  # noqa: E402


def provenance(seeds: list[int]) -> None:
    """The command, seeds, date and load (benchmarks/provenance.py's lines; this script keeps its directory off sys.path)."""
    import datetime
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    one, five, fifteen = os.getloadavg()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository, as provenance.py's ROOT
    print(f"# command: python {os.path.relpath(os.path.abspath(sys.argv[0]), root)} {' '.join(sys.argv[1:])}".rstrip())
    if seeds:
        print(f"# seeds: {','.join(map(str, seeds))} ({len(seeds)})")
    print(f"# {stamp}, load average {one:.2f} / {five:.2f} / {fifteen:.2f} on {os.cpu_count()} CPUs", flush=True)

CPU_TASKS = {
    # name: (env, policy, config, optimizer)
    "inverted_pendulum": ("brax/inverted_pendulum?backend=spring", jes.MLPPolicy(hidden_sizes=(16,)),
                          dict(num_members=64, num_generations=100, noise_std=0.1, learning_rate=0.03,
                               eval_episodes=16, stop_at_return=950.0), "adam"),
    "hopper": ("brax/hopper?backend=spring", jes.MLPPolicy(hidden_sizes=(32, 32)),
               dict(num_members=64, num_generations=30, noise_std=0.05, learning_rate=0.03, eval_episodes=16), "adam"),
}


def salimans_config(env: str, backend: str) -> tuple[str, jes.MLPPolicy, dict, str]:
    """Salimans et al. (2017)'s MuJoCo setup for ``env`` (humanoid or ant) as a jes run."""
    config = dict(num_members=10_000, chunk_size=1_000, num_generations=200, noise_std=0.02, learning_rate=0.01,
                  weight_decay=0.005, fitness_shaping="centered_ranks", normalize_observations=True,
                  max_episode_steps=1000, eval_every=5, eval_episodes=100, stop_at_return=6000.0 if env == "humanoid" else None)
    return f"brax/{env}?backend={backend}", jes.MLPPolicy(hidden_sizes=(256, 256), activation=jax.numpy.tanh), config, "adam"


def run_task(label: str, env: str, policy: jes.MLPPolicy, config: dict, optimizer: str, generations: int | None,
             seeds: list[int], overrides: dict | None = None) -> None:
    """One trainer (one compile) and one run per seed; a row of seed statistics."""
    from jes.loop import run

    if generations is not None:
        config = dict(config, num_generations=generations)
    config = dict(config, **{k: v for k, v in (overrides or {}).items() if v is not None})
    trainer = jes.Trainer(policy, env, optimizer, jes.ESConfig(**config))
    solved, finals, rates, walls, compile_time = [], [], [], [], None
    for seed in seeds:
        t0 = time.perf_counter()
        result = run(trainer, trainer.init_state(seed), key=seed)
        walls.append(time.perf_counter() - t0)
        history = result.history
        compile_time = result.compile_time if compile_time is None else compile_time
        solved.append(result.solved_generation)
        finals.append(result.final_centre_return)
        rates.append(int(history["env_steps"][-1]) / max(float(history["generation_time"].sum()), 1e-9))
        print(f"#   {label} seed {seed}: solved at {result.solved_generation}, final centre {result.final_centre_return:.1f}",
              flush=True)
    ok = [g for g in solved if g is not None]
    # the median as provenance.median_text prints it (6.5 stays 6.5); this script keeps its directory off sys.path
    gens = f"{float(np.median(ok)):.1f}".removesuffix(".0") + f" ({min(ok)}-{max(ok)})" if ok else "-"
    print(f"| {label} | `{env}` | {trainer.num_params} | {config['num_members']} | {config['num_generations']} | "
          f"{len(ok)}/{len(seeds)} | {gens} | {np.mean(finals):.1f} +- {np.std(finals):.1f} | {np.median(rates):,.0f} | "
          f"{compile_time:.0f} s | {np.median(walls):.0f} s |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=sorted(CPU_TASKS), action="append", help="CPU task(s) to run (default: all)")
    parser.add_argument("--generations", type=int, default=None, help="override the task's generation budget")
    parser.add_argument("--population", type=int, default=None, help="override the task's population")
    parser.add_argument("--learning-rate", type=float, default=None, help="override the task's adam learning rate")
    parser.add_argument("--gpu-humanoid", action="store_true", help="Salimans et al.'s Humanoid run (GPU)")
    parser.add_argument("--gpu-ant", action="store_true", help="the same configuration on Ant (GPU)")
    parser.add_argument("--backend", default="mjx", help="physics backend of the GPU runs")
    parser.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9", help="run keys, comma-separated (one run each)")
    args = parser.parse_args()
    jes.use_cpu_cores()
    jes.enable_compilation_cache()
    print(f"# jax {jax.__version__} on {jax.default_backend()} ({platform.machine()}, {len(jax.devices())} device(s), "
          f"{os.cpu_count()} CPUs)", flush=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    provenance(seeds)
    print(f"# seeds {seeds}; solved: the centre's mean return over fresh episodes reached the task's threshold")
    print("| task | env | params | population | generation budget | solved | generations to solve, median (range) | "
          "final centre return (mean +- std) | env steps/s (median) | compile | wall per seed (median) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    gpu = [name for name, wanted in (("humanoid", args.gpu_humanoid), ("ant", args.gpu_ant)) if wanted]
    overrides = dict(num_members=args.population, learning_rate=args.learning_rate)
    if gpu:
        if jax.default_backend() == "cpu":
            print("# warning: no GPU found; this configuration takes days on a CPU", file=sys.stderr)
        for name in gpu:  # --generations, --population and --learning-rate override these runs' as the CPU tasks'
            run_task(f"gpu-{name}", *salimans_config(name, args.backend), args.generations, seeds, overrides)
        return
    for name in args.task or list(CPU_TASKS):
        run_task(name, *CPU_TASKS[name], args.generations, seeds, overrides)
    provenance([])


if __name__ == "__main__":
    main()
