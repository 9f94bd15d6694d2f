"""Scaling out: one process vs two (jax.distributed) vs a ZeroMQ master with 1 and 2 workers, side by side.

    python benchmarks/scaling.py [--generations 8] [--population 512] [--seeds 0,1,2,3,4]

Part 1 measures, in one run on this machine, OpenAI-ES on CartPole-v1 with a GRU 5x2 (367 params),
the population in chunks of 64, no centre evaluation in the timed generations:

- 1 process, 1 device; 1 process, 2 devices (one per core: jes's default on CPU);
- ``jes launch --processes 2`` (jax.distributed, 1 CPU device each, gloo collectives), with each
  process pinned to its own core (the launcher's default) and unpinned (``--no-pin-cores``);
- a ZeroMQ master in this process with 1 and with 2 ``jes-worker`` processes (pinned one per core).

Each row: median ms/generation over the timed generations (the first and the last, which
evaluates the centre, left out), env steps/s, and whether the final parameters are bit-identical
to the 1-process 1-device run of the same seed. Every figure comes from fresh processes started by this
script. With ``--seeds`` every setup runs once per seed (run key and initial policy), interleaved seed by
seed so that all setups see the same load; cells are the median [min, max] over seeds of each seed's
median, speed-ups are taken seed by seed.

``--part gymnasium`` does the same for a Python simulator (Gymnasium CartPole-v1, the host rollout): 1 process
vs a ZeroMQ master with 1 and 2 workers, then a model of N hosts from the measured per-process rate and the
master's measured CPU per range and per member x parameter of the update.

Part 2 models where each backend stops scaling, from quantities measured here (bytes per chunk
of the program's all-gathers, bytes per ZeroMQ range, master CPU per range, the master's update
cost per member and parameter) extrapolated to 100 and 1,000 hosts; the assumptions are printed
with the table.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHUNK = 64

CHILD = r"""
import hashlib, json, os, sys
import numpy as np
import jes
distributed, devices, gens, population = sys.argv[1] == "1", int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
seed = int(sys.argv[5])
env = sys.argv[6] if len(sys.argv) > 6 else "CartPole-v1"
if not distributed:
    jes.use_cpu_cores(devices)
config = jes.ESConfig(num_members=population, chunk_size=64, num_generations=gens, eval_every=0, eval_episodes=8)
result = jes.train(jes.GRUPolicy(hidden=5, layers=2), env, "adam", key=seed, config=config,
                   distributed=distributed, log_dir=None, checkpoint_path=None, progress=False)
import jax
if jax.process_index() == 0:
    steps = np.diff(result.history["env_steps"], prepend=0)
    print("RESULT", json.dumps(dict(times=[float(t) for t in result.history["generation_time"]],
                                    steps=[float(s) for s in steps], devices=jax.device_count(),
                                    sha=hashlib.sha256(np.asarray(result.flat_params).tobytes()).hexdigest())), flush=True)
"""


def child_env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))


def parse(output: str) -> dict:
    for line in output.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise RuntimeError(f"no result in the child's output:\n{output[-3000:]}")


def timed(result: dict) -> tuple[float, float]:
    """Median s/generation and env steps/s over the generations between the first and the last."""
    times, steps = result["times"][1:-1], result["steps"][1:-1]
    return statistics.median(times), sum(steps) / sum(times)


def run_local(devices: int, gens: int, population: int, seed: int = 0, env: str = "CartPole-v1") -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, "0", str(devices), str(gens), str(population), str(seed), env],
                         capture_output=True, text=True, env=child_env(), timeout=900)
    return parse(out.stdout + out.stderr)


def run_jax_distributed(processes: int, gens: int, population: int, pin: bool = False, seed: int = 0) -> dict:
    cmd = [sys.executable, "-m", "jes.cli", "launch", "--processes", str(processes), "--devices-per-process", "1",
           *([] if pin else ["--no-pin-cores"]), "--", sys.executable, "-c", CHILD, "1", "1", str(gens), str(population),
           str(seed)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"jes launch failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return parse(out.stdout)


def run_zeromq(workers: int, gens: int, population: int, seed: int = 0, env: str = "CartPole-v1") -> dict:
    """A master in this process (1 CPU device) with ``workers`` local jes-workers, one per core."""
    import jax

    import jes
    from jes.distributed.master import Master

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from distributed import SECRET, free_port, start_workers, stop

    config = jes.ESConfig(num_members=population, chunk_size=CHUNK, num_generations=gens, eval_every=0,
                          eval_episodes=8)
    trainer = jes.Trainer(jes.GRUPolicy(hidden=5, layers=2), env, "adam", config)
    port = free_port()
    allowed = sorted(os.sched_getaffinity(0))  # the cores this process may use (taskset, a cgroup's cpuset)
    cores = [str(allowed[i % len(allowed)]) for i in range(workers)]
    procs = start_workers(port, cores)
    try:
        with Master(trainer, f"127.0.0.1:{port}", secret=SECRET, env=env, optimizer="adam",
                    status_interval=1e9) as master:
            state = trainer.init_state(seed)
            if master.wait_for_workers(state, workers, 600) < workers:
                raise RuntimeError("the workers did not come up")
            times, steps, cpu, ranges, sent, received = [], [], 0.0, 0, 0, 0
            for gen in range(gens):
                before = (time.process_time(), master.stats["assigned_ranges"], master.stats["bytes_sent"],
                          master.stats["bytes_received"])
                t0 = time.perf_counter()
                state, metrics = master.step(state, False)
                jax.block_until_ready(state)
                times.append(time.perf_counter() - t0)
                steps.append(float(metrics["env_steps"]))
                if 0 < gen < gens - 1:  # as timed() counts
                    cpu += time.process_time() - before[0]
                    ranges += master.stats["assigned_ranges"] - before[1]
                    sent += master.stats["bytes_sent"] - before[2]
                    received += master.stats["bytes_received"] - before[3]
            timed_gens = max(gens - 2, 1)
            return dict(times=times, steps=steps, devices=workers,
                        sha=hashlib.sha256(np.asarray(jax.device_get(state.params)).tobytes()).hexdigest(),
                        master_cpu_per_gen=cpu / timed_gens, ranges_per_gen=ranges / timed_gens,
                        bytes_per_gen=(sent + received) / timed_gens, master_chunks=master.stats["master_chunks"])
    finally:
        stop(procs)


def program_quantities(population: int) -> dict:
    """Bytes per chunk that the compiled step all-gathers, and the cost of the update as a master does it."""
    import jax
    import jax.numpy as jnp

    import jes

    out = {}
    for label, policy, perturbation in (
            ("GRU 5x2", jes.GRUPolicy(hidden=5, layers=2), "full_rank"),
            ("MLP 256-256-128", jes.MLPPolicy(hidden_sizes=(256, 256, 128)), "full_rank"),
            ("MLP 1024-1024 low rank r=1", jes.MLPPolicy(hidden_sizes=(1024, 1024)), "low_rank")):
        config = jes.ESConfig(num_members=population, chunk_size=CHUNK, eval_every=0, perturbation=perturbation)
        trainer = jes.Trainer(policy, "CartPole-v1", "adam", config, devices=1)
        state = trainer.init_state(0)
        chunks = jnp.arange(1, dtype=jnp.int32)
        results = jax.eval_shape(trainer.evaluate_chunks, state, chunks)
        weights = jax.eval_shape(lambda s: jax.tree.map(lambda w: w[:1], trainer.weights(s, jnp.zeros(population))), state)
        stats = jax.eval_shape(trainer.chunk_stats, state, chunks, weights)
        nbytes = lambda tree: sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))
        # The update a ZeroMQ master runs once every range is in: noise regenerated for every member.
        all_results = jax.tree.map(lambda x: jnp.zeros((trainer.num_chunks, *x.shape[1:]), x.dtype), results)
        update = jax.jit(trainer.apply_chunk_results)
        jax.block_until_ready(update(state, all_results))
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            jax.block_until_ready(update(state, all_results))
            samples.append(time.perf_counter() - t0)
        # Low-rank statistics are never gathered: every host rebuilds them from the fitness (keys give the factors).
        out[label] = dict(params=trainer.num_params, results_bytes_per_chunk=nbytes(results),
                          stats_bytes_per_chunk=0 if perturbation == "low_rank" else nbytes(stats),
                          update_s_per_member_param=statistics.median(samples) / (population * trainer.num_params))
    return out


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def seconds(s: float) -> str:
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.1f} s"


GYM = "gymnasium:CartPole-v1"


def run_setups(setups, seeds: list[int]) -> dict:
    """Every ``(label, fn)`` setup run once per seed, seed by seed (fresh processes each): label -> results."""
    results = {label: [] for label, _ in setups}
    for seed in seeds:
        for label, fn in setups:
            print(f"running: seed {seed}, {label} ...", file=sys.stderr, flush=True)
            results[label].append(fn(seed))
    return results


def spread(values, fmt):
    values = np.asarray(values, dtype=float)
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(np.median(values))} [{fmt.format(values.min())}, {fmt.format(values.max())}]"


def gymnasium_part(gens: int, pop: int, seeds: list[int]) -> None:
    """A Python simulator over processes: measured on this machine (1 process vs a ZeroMQ master with 1 and 2
    workers, Gymnasium CartPole-v1) for each seed, then modelled to N hosts from the measured medians."""
    setups = (("1 process (host rollout)", lambda seed: run_local(1, gens, pop, seed, GYM)),
              ("ZeroMQ: master + 1 worker", lambda seed: run_zeromq(1, gens, pop, seed, GYM)),
              ("ZeroMQ: master + 2 workers (1 per core)", lambda seed: run_zeromq(2, gens, pop, seed, GYM)))
    results = run_setups(setups, seeds)
    base = results[setups[0][0]]
    cell = spread
    print(f"\nOpenAI-ES (adam), {GYM}, GRU 5x2 (367 params), population {pop} in chunks of {CHUNK}, {gens} "
          f"generations, per seed the median over generations 2..{gens - 1}, then median [min, max] over seeds "
          f"{','.join(map(str, seeds))}; load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print("| setup | ms / generation | env steps / s | speed-up vs 1 process | bit-identical to 1 process |")
    print("|---|---|---|---|---|")
    for label, runs in results.items():
        times = [timed(r)[0] for r in runs]
        rates = [timed(r)[1] for r in runs]
        speed = [timed(b)[0] / t for b, t in zip(base, times)]
        same = sum(r["sha"] == b["sha"] for r, b in zip(runs, base))
        print(f"| {label} | {cell([t * 1000 for t in times], '{:.1f}')} | {cell(rates, '{:,.0f}')} | "
              f"{cell(speed, '{:.2f}x')} | {'yes' if same == len(runs) else 'NO'} ({same}/{len(runs)} seeds) |")
    zmq = results[setups[-1][0]]
    per_range_cpu = statistics.median(r["master_cpu_per_gen"] / max(r["ranges_per_gen"], 1) for r in zmq)
    per_range_bytes = statistics.median(r["bytes_per_gen"] / max(r["ranges_per_gen"], 1) for r in zmq)
    ranges_per_gen = statistics.median(r["ranges_per_gen"] for r in zmq)
    base_rate = statistics.median(timed(r)[1] for r in base)
    update = program_quantities(pop)["GRU 5x2"]["update_s_per_member_param"]
    steps_per_member = statistics.median(statistics.median(r["steps"][1:-1]) / pop for r in zmq)
    print(f"\nZeroMQ, 2 workers (medians over the seeds): {ranges_per_gen:.1f} ranges per generation, "
          f"{human(per_range_bytes)} and {seconds(per_range_cpu)} of master CPU per range (the update included), "
          f"{steps_per_member:.1f} env steps per member")
    update_own = update * pop * 367  # the update's share of the measured per-range CPU (2 workers: one update)
    per_range = max(per_range_cpu - update_own / max(ranges_per_gen, 1), 0.0)
    print(f"\nModel: N hosts, each a jes-worker process evaluating one range of {pop} members per generation at "
          f"the measured 1-process rate ({base_rate:,.0f} env steps/s); the master spends the measured "
          f"{seconds(per_range)} of CPU per range (the update taken out) and regenerates every member for the update "
          f"(measured {update * 1e9:.2f} ns per member x parameter), serially, after the ranges are in (no overlap: a "
          "lower bound); the network moves the measured bytes per range. Two episode lengths: the measured one (an "
          f"untrained policy, {steps_per_member:.1f} steps) and 500 steps (a solved CartPole-v1 policy).\n")
    print("| hosts | population | master CPU / gen | env steps / s, measured episodes | efficiency | "
          "env steps / s, 500-step episodes | efficiency |")
    print("|---|---|---|---|---|---|---|")
    for hosts in (1, 2, 10, 100, 1000):
        population = pop * hosts
        master = hosts * per_range + update * population * 367
        cells = []
        for length in (steps_per_member, 500.0):
            evaluate = pop * length / base_rate  # one range on one host
            cells += [f"{population * length / (evaluate + master):,.0f}", f"{evaluate / (evaluate + master):.0%}"]
        print(f"| {hosts:,} | {population:,} | {seconds(master)} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--population", type=int, default=512)
    parser.add_argument("--seeds", default="0", help="run keys, comma-separated; every setup runs once per seed")
    parser.add_argument("--part", choices=("jax", "gymnasium", "all"), default="jax",
                        help="jax: a gymnax env over devices, processes and workers, and the model; gymnasium: a "
                             "Python simulator over worker processes and its N-host model")
    args = parser.parse_args()
    if args.generations < 3:  # timed() leaves out the first and the last generation
        parser.error("--generations must be at least 3: the first generation (compile) and the last are not timed")
    gens, pop = args.generations, args.population
    seeds = [int(x) for x in args.seeds.split(",")]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from provenance import print_load, print_provenance

    print_provenance(seeds)
    if args.part in ("gymnasium", "all"):
        gymnasium_part(gens, pop, seeds)
        if args.part == "gymnasium":
            print_load()
            return
    setups = (("1 process, 1 device", lambda seed: run_local(1, gens, pop, seed)),
              ("1 process, 2 devices (1 per core)", lambda seed: run_local(2, gens, pop, seed)),
              ("jax.distributed: 2 processes x 1 device, unpinned (--no-pin-cores)",
               lambda seed: run_jax_distributed(2, gens, pop, seed=seed)),
              ("jax.distributed: 2 processes x 1 device, 1 core each (jes launch's default)",
               lambda seed: run_jax_distributed(2, gens, pop, pin=True, seed=seed)),
              ("ZeroMQ: master + 1 worker", lambda seed: run_zeromq(1, gens, pop, seed)),
              ("ZeroMQ: master + 2 workers (1 per core)", lambda seed: run_zeromq(2, gens, pop, seed)))
    results = run_setups(setups, seeds)
    base = results[setups[0][0]]


    print(f"\nOpenAI-ES, CartPole-v1, GRU 5x2 (367 params), population {pop} in chunks of {CHUNK}, "
          f"{gens} generations, per seed the median over generations 2..{gens - 1}; seeds {args.seeds}"
          f"{' (median [min, max] over seeds)' if len(seeds) > 1 else ''}; load average at the end: "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print("| setup | ms / generation | env steps / s | speed-up vs 1x1 | bit-identical to 1x1 |")
    print("|---|---|---|---|---|")
    for label, _ in setups:
        t = [timed(r)[0] for r in results[label]]
        rate = [timed(r)[1] for r in results[label]]
        speed = [timed(b)[0] / timed(r)[0] for b, r in zip(base, results[label])]
        same = sum(r["sha"] == b["sha"] for b, r in zip(base, results[label]))
        print(f"| {label} | {spread(np.array(t) * 1000, '{:.1f}')} | {spread(rate, '{:,.0f}')} | "
              f"{spread(speed, '{:.2f}')}x | {'yes' if same == len(seeds) else 'NO'} ({same}/{len(seeds)} seeds) |")
    zmq_runs = results[setups[-1][0]]
    zmq = {k: float(np.median([r[k] for r in zmq_runs])) for k in
           ("ranges_per_gen", "bytes_per_gen", "master_cpu_per_gen", "master_chunks")}
    per_range = [r["master_cpu_per_gen"] / max(r["ranges_per_gen"], 1) for r in zmq_runs]
    print(f"\nZeroMQ, 2 workers (medians over seeds): {zmq['ranges_per_gen']:.1f} ranges (round trips) per generation, "
          f"{human(zmq['bytes_per_gen'])} on the wire per generation, master CPU {seconds(zmq['master_cpu_per_gen'])} "
          f"per generation ({seconds(float(np.median(per_range)))} per range [{seconds(min(per_range))}, "
          f"{seconds(max(per_range))}], the update included); chunks the master evaluated itself: "
          f"{zmq['master_chunks']:.0f}")

    quantities = program_quantities(pop)
    per_range_cpu = float(np.median(per_range))
    per_range_bytes = float(np.median([r["bytes_per_gen"] / max(r["ranges_per_gen"], 1) for r in zmq_runs]))
    print("\nModel: where each backend stops scaling. Assumptions: one device per host, "
          f"{pop} members per host (population grows with the hosts), chunks of {CHUNK}, every host evaluates "
          "its own chunks; jax.distributed all-gathers each chunk's fitness record and sufficient statistics to "
          "every device (the chunk-ordered sum that keeps results bit-identical; low-rank runs gather only the fitness "
          "records and every host rebuilds the statistics from keys); a ZeroMQ master sends one range "
          f"per host per generation at the measured {human(per_range_bytes)} and {seconds(per_range_cpu)} of master "
          "CPU per range, and runs the update itself, regenerating every member's noise (measured cost per "
          "member x parameter on this CPU, linear extrapolation). Measured inputs: bytes per chunk from the compiled "
          "program's shapes (no seed involved); bytes and master CPU per range: the medians over seeds "
          f"{args.seeds} of the ZeroMQ 2-worker row above; the update's cost: the median of 5 timed calls on "
          "seed 0's initial state.\n")
    print("| policy | hosts | population | jax.distributed: bytes received per host / gen | "
          "ZeroMQ: round trips / gen | ZeroMQ: bytes through the master / gen | ZeroMQ: master CPU / gen |")
    print("|---|---|---|---|---|---|---|")
    for label, q in quantities.items():
        for hosts in (1, 2, 100, 1000):
            population = pop * hosts
            chunks = population // CHUNK
            gathered = chunks * (q["results_bytes_per_chunk"] + q["stats_bytes_per_chunk"])
            master_cpu = hosts * per_range_cpu + q["update_s_per_member_param"] * population * q["params"]
            print(f"| {label} ({q['params']:,} params) | {hosts:,} | {population:,} | {human(gathered)} | {hosts:,} | "
                  f"{human(hosts * per_range_bytes)} | {seconds(master_cpu)} |")
    print_load()


if __name__ == "__main__":
    main()
