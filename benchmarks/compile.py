"""Compile time of THE generation step, cold, and steady s/generation, per checkout and variant.

    python benchmarks/compile.py [--repeats 2] [--compare base=/tmp/jes-base,new=.]
                                 [--min-batch 32,256] [--options '{"xla_cpu_parallel_codegen_split_count": 1}']
                                 [--workloads cartpole,pendulum,acrobot] [--eval-every 1,10]

Each measurement is a fresh ``python -c`` child (its checkout's ``jes`` first on ``PYTHONPATH``, run in
the checkout's directory): one CPU device per core, no compilation cache; workload ``cartpole`` (default)
is GRU 5x2 on CartPole-v1 with the defaults (population 512), ``pendulum`` MLP 32x32 on Pendulum-v1 and
``acrobot`` GRU 32 on Acrobot-v1 (population 512 each). It lowers ``trainer.step`` for the initial state,
compiles it (with ``--options`` as XLA compiler options, if given) and runs 12 generations with the
centre evaluated, then 8 more without (``--eval-every``: the ``ESConfig.eval_every`` the trainer is
built with; the program then evaluates the centre on one generation in that many, and "per generation
over a run" weighs the two kinds so). It prints wall and CPU seconds (process time, all threads) for
lowering, compiling and the median generation after the first of each kind; CPU seconds move far less
than wall seconds when other work shares the machine. The hash of the state after the first 12
generations shows whether a variant changed any bit. Variants run interleaved, repeat by repeat.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import print_load, print_provenance  # noqa: E402

CHILD = r"""
import hashlib, inspect, json, statistics, sys, time
import numpy as np
import jax, jax.numpy as jnp
import jes
jes.use_cpu_cores()
min_batch, options, workload, eval_every = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
policy, env = {"cartpole": (jes.GRUPolicy(hidden=5, layers=2), "CartPole-v1"),
               "pendulum": (jes.MLPPolicy(hidden_sizes=(32, 32)), "Pendulum-v1"),
               "acrobot": (jes.GRUPolicy(hidden=32, layers=1), "Acrobot-v1")}[workload]
trainer = jes.Trainer(policy, env, config=jes.ESConfig(eval_every=eval_every), rollout_min_batch=min_batch)
state = trainer.init_state(0)
state.params.block_until_ready()
w0, c0 = time.perf_counter(), time.process_time()
# (state, evaluate_centre, evaluate_population); checkouts before 2026-12-01 take (state, evaluate_centre)
flags = (jnp.bool_(True),) * (len(inspect.signature(trainer.generation_step).parameters) - 1)
lowered = trainer.step.lower(state, *flags)
w1, c1 = time.perf_counter(), time.process_time()
print("MARK compile-start", file=sys.stderr, flush=True)  # --passes: XLA's pass log between the marks
compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
w2, c2 = time.perf_counter(), time.process_time()
print("MARK compile-end", file=sys.stderr, flush=True)
def generations(count, *flags):
    global state
    walls, cpus = [], []
    for _ in range(count):
        a, b = time.perf_counter(), time.process_time()
        state, metrics = compiled(state, *flags)
        jax.block_until_ready(state)
        walls.append(time.perf_counter() - a)
        cpus.append(time.process_time() - b)
    return statistics.median(walls[1:]), statistics.median(cpus[1:])
gen_wall, gen_cpu = generations(12, *flags)
digest = hashlib.sha256(b"".join(np.asarray(x).tobytes() for x in (state.params, state.obs_sum, state.obs_sumsq)))
# without the centre: a generation that is not an evaluation one (eval_every > 1)
off_wall, off_cpu = generations(8, jnp.bool_(False), *flags[1:])
print("RESULT", json.dumps(dict(lower_wall=w1 - w0, lower_cpu=c1 - c0, compile_wall=w2 - w1, compile_cpu=c2 - c1,
                                gen_wall=gen_wall, gen_cpu=gen_cpu, off_wall=off_wall, off_cpu=off_cpu,
                                bits=digest.hexdigest()[:12])), flush=True)
"""


PIPELINE = re.compile(r"Running HLO pass pipeline on module (\S+): (.*)$")
PASS = re.compile(r"HLO pass: (\S+) time: ([\d.]+) (us|ms|s) ")
UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
STAMP = re.compile(r"^[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+)")


def pass_times(stderr: str) -> dict:
    """XLA's own log of the step's compile (``TF_CPP_VMODULE=hlo_pass_pipeline=1``): the wall seconds of the HLO
    pass pipelines (first to last pass line, from the log's timestamps), seconds per pipeline, and the costliest
    leaf passes (a pass that is itself a pipeline, e.g. ``simplification``, is counted through its passes)."""
    inside, module, pipeline, first, last = False, None, None, None, None
    modules: dict = {}
    for line in stderr.splitlines():
        if "MARK compile-start" in line:
            inside = True
        elif "MARK compile-end" in line:
            break
        elif inside and (m := PIPELINE.search(line)):
            module, pipeline = m.group(1), m.group(2)
        elif inside and module and (m := PASS.search(line)):
            by_pipeline = modules.setdefault(module, {}).setdefault(pipeline, {})
            by_pipeline[m.group(1)] = by_pipeline.get(m.group(1), 0.0) + float(m.group(2)) * UNIT[m.group(3)]
            if (stamp := STAMP.match(line)) is not None:
                clock = int(stamp.group(1)) * 3600 + int(stamp.group(2)) * 60 + float(stamp.group(3))
                first, last = clock if first is None else first, clock
    if not modules:
        return dict(module=None, wall=0.0, pipelines={}, passes={})
    name = max(modules, key=lambda k: sum(sum(p.values()) for p in modules[k].values()))
    nested = set(modules[name])  # passes that are pipelines themselves: counted through their own passes
    pipelines, passes = {}, {}
    for pipeline, times in modules[name].items():
        pipelines[pipeline] = sum(v for k, v in times.items() if k not in nested)
        for k, v in times.items():
            if k not in nested:
                passes[k] = passes.get(k, 0.0) + v
    return dict(module=name, wall=(last - first) if first is not None else 0.0, pipelines=pipelines, passes=passes)


def run_child(pythonpath: str, min_batch: int, options: str, workload: str, eval_every: int,
              passes: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(pythonpath))
    if passes:
        env.update(TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="hlo_pass_pipeline=1")
    env.pop("XLA_FLAGS", None)
    env.pop("JES_COMPILATION_CACHE", None)
    # cwd: `python -c` puts the working directory first on sys.path, ahead of PYTHONPATH, so run in the checkout
    # (before 2026-12-01 children ran in the caller's directory and --compare from the repo root timed it twice).
    proc = subprocess.run([sys.executable, "-c", CHILD, str(min_batch), options, workload, str(eval_every)], env=env, capture_output=True,
                          cwd=os.path.abspath(pythonpath),
                          text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    if passes:
        result["passes"] = pass_times(proc.stderr)
    return result


def print_passes(rows: dict) -> None:
    """Where the compile goes: XLA's HLO pass pipelines (wall, from the log) against the whole compile, and the
    costliest passes, medians over the repeats."""
    for key, runs in rows.items():
        w, ev, label, mb, opts = key
        logged = [(r, r["passes"]) for r in runs if r.get("passes", {}).get("module")]
        if not logged:
            continue
        med = lambda f: statistics.median(f(r, p) for r, p in logged)
        compile_wall = med(lambda r, p: r["compile_wall"])
        hlo = med(lambda r, p: p["wall"])
        print(f"\n{w} eval_every={ev} {label} min_batch={mb} options={opts}: module {logged[0][1]['module']}; compile "
              f"{compile_wall:.2f} s wall / {med(lambda r, p: r['compile_cpu']):.2f} s CPU with the pass log on: HLO "
              f"pass pipelines {hlo:.2f} s wall ({hlo / compile_wall:.0%}), then {compile_wall - hlo:.2f} s "
              f"({1 - hlo / compile_wall:.0%}) of LLVM code generation, buffer assignment and thunk emission")
        print("| HLO pipeline (its passes' times) | s |")
        print("|---|---|")
        pipelines = sorted(logged[0][1]["pipelines"], key=lambda k: -med(lambda r, p, k=k: p["pipelines"].get(k, 0.0)))
        for name in pipelines[:6]:
            print(f"| {name} | {med(lambda r, p, k=name: p['pipelines'].get(k, 0.0)):.3f} |")
        print("| costliest passes | s |")
        names = sorted(logged[0][1]["passes"], key=lambda k: -med(lambda r, p, k=k: p["passes"].get(k, 0.0)))
        for name in names[:8]:
            print(f"| {name} | {med(lambda r, p, k=name: p['passes'].get(k, 0.0)):.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--compare", default=f"jes={os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}",
                        help="label=PATH,... checkouts to compare (default: this one)")
    parser.add_argument("--min-batch", default="32", help="comma-separated rollout_min_batch values")
    parser.add_argument("--workloads", default="cartpole", help="comma-separated: cartpole, pendulum, acrobot")
    parser.add_argument("--eval-every", default="1", help="comma-separated ESConfig.eval_every values")
    parser.add_argument("--options", action="append", default=None,
                        help="a JSON dict of XLA compiler options (repeatable; default: none)")
    parser.add_argument("--passes", action="store_true",
                        help="also log XLA's per-pass times (TF_CPP_VMODULE=hlo_pass_pipeline=1) and print where "
                             "the compile goes")
    args = parser.parse_args()
    print_provenance()
    checkouts = [item.split("=", 1) for item in args.compare.split(",")]
    variants = [(w, ev, label, path, int(mb), opts) for w in args.workloads.split(",")
                for ev in (int(x) for x in args.eval_every.split(",")) for label, path in checkouts
                for mb in args.min_batch.split(",") for opts in (args.options or ["{}"])]
    rows: dict = {(w, ev, label, mb, opts): [] for w, ev, label, _, mb, opts in variants}
    for repeat in range(args.repeats):
        for w, ev, label, path, mb, opts in variants:
            r = run_child(path, mb, opts, w, ev, args.passes)
            rows[(w, ev, label, mb, opts)].append(r)
            print(f"{w} eval_every={ev} {label} min_batch={mb} options={opts} repeat {repeat}: "
                  + json.dumps({k: v for k, v in r.items() if k != "passes"}), flush=True)
    print()
    print("| workload | eval_every | checkout | rollout_min_batch | compiler options | lower s (wall / CPU) | "
          "compile s (wall / CPU) | s/generation with centre (wall / CPU) | without centre | per generation over a run "
          "(wall / CPU) | bits |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (w, ev, label, mb, opts), runs in rows.items():
        med = lambda k: statistics.median(r[k] for r in runs)
        share = 1 / ev if ev > 0 else 0.0
        run_wall, run_cpu = (share * med(f"gen_{k}") + (1 - share) * med(f"off_{k}") for k in ("wall", "cpu"))
        bits = ",".join(sorted({r["bits"] for r in runs}))
        print(f"| {w} | {ev} | {label} | {mb} | {opts} | {med('lower_wall'):.2f} / {med('lower_cpu'):.2f} | "
              f"{med('compile_wall'):.2f} / {med('compile_cpu'):.2f} | {med('gen_wall'):.4f} / {med('gen_cpu'):.4f} | "
              f"{med('off_wall'):.4f} / {med('off_cpu'):.4f} | {run_wall:.4f} / {run_cpu:.4f} | {bits} |")
    if args.passes:
        print_passes(rows)
    print(f"\n(medians over {args.repeats} repeats; load average at the end: {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
    print_load()
