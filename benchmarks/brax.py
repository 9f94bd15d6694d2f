"""ES on brax continuous control: what this CPU can do, and the GPU configuration of Salimans et al.

    python benchmarks/brax.py                      # inverted_pendulum (spring) until solved (950 of 1000), then hopper
    python benchmarks/brax.py --task inverted_pendulum
    python benchmarks/brax.py --task hopper [--generations 30]      # a fixed budget
    python benchmarks/brax.py --gpu-humanoid       # Salimans et al. 2017 on Humanoid: needs a GPU (pip install ".[cuda,brax]")
    python benchmarks/brax.py --gpu-ant            # the same setup on Ant

Reported per run: generations, the centre policy's return on fresh episodes, env steps, env steps/s of the
generations (compile excluded), compile time, wall time. Seeds vmapped are not used here: one run per task.

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

# This file is named brax.py: drop its own directory from the path so `import brax` finds the package.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
sys.path.insert(0, os.path.dirname(HERE))

import jax  # noqa: E402

import jes  # noqa: E402

CPU_TASKS = {
    # name: (env, policy, config, optimizer)
    "inverted_pendulum": ("brax/inverted_pendulum?backend=spring", jes.MLPPolicy(hidden_sizes=(16,)),
                          dict(num_members=32, num_generations=60, noise_std=0.1, learning_rate=0.05,
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


def run_task(label: str, env: str, policy: jes.MLPPolicy, config: dict, optimizer: str, generations: int | None) -> None:
    if generations is not None:
        config = dict(config, num_generations=generations)
    t0 = time.perf_counter()
    result = jes.train(policy, env, optimizer, key=0, log_dir=f"runs/brax-{label}", progress=False, **config)
    wall = time.perf_counter() - t0
    history = result.history
    gen_time = float(history["generation_time"].sum())
    steps = int(history["env_steps"][-1])
    print(f"| {label} | `{env}` | {result.trainer.num_params} | {config['num_members']} | {len(history['generation'])} | "
          f"{result.final_centre_return:.1f} | {steps:,} | {steps / max(gen_time, 1e-9):,.0f} | "
          f"{result.solved_generation or '-'} | {result.compile_time:.0f} s | {wall:.0f} s |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=sorted(CPU_TASKS), action="append", help="CPU task(s) to run (default: all)")
    parser.add_argument("--generations", type=int, default=None, help="override the task's generation budget")
    parser.add_argument("--gpu-humanoid", action="store_true", help="Salimans et al.'s Humanoid run (GPU)")
    parser.add_argument("--gpu-ant", action="store_true", help="the same configuration on Ant (GPU)")
    parser.add_argument("--backend", default="mjx", help="physics backend of the GPU runs")
    args = parser.parse_args()
    jes.use_cpu_cores()
    jes.enable_compilation_cache()
    print(f"# jax {jax.__version__} on {jax.default_backend()} ({platform.machine()}, {len(jax.devices())} device(s), "
          f"{os.cpu_count()} CPUs)", flush=True)
    print("| task | env | params | population | generations | final centre return | env steps | env steps/s | solved at | compile | wall |")
    print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    gpu = [name for name, wanted in (("humanoid", args.gpu_humanoid), ("ant", args.gpu_ant)) if wanted]
    if gpu:
        if jax.default_backend() == "cpu":
            print("# warning: no GPU found; this configuration takes days on a CPU", file=sys.stderr)
        for name in gpu:
            run_task(f"gpu-{name}", *salimans_config(name, args.backend), args.generations)
        return
    for name in args.task or list(CPU_TASKS):
        run_task(name, *CPU_TASKS[name], args.generations)


if __name__ == "__main__":
    main()
