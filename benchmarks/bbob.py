"""jes, pycma and evosax on the COCO platform's ``bbob`` suite: 24 noiseless functions, instances 1-5.

COCO (``cocoex``, ``cocopp``) is a benchmark-only extra, installed beside jes's environment::

    pip install coco-experiment cocopp          # cocoex 2.8, cocopp 2.9 (not jes dependencies)
    pip install --target /tmp/evosax "evosax==0.3.2" dotmap --no-deps   # only for evosax-cma-es
    PYTHONPATH=.:/tmp/evosax python benchmarks/bbob.py --dims 2,5,10,20 \\
        --optimizers jes-cma-es-ipop,pycma-ipop,evosax-cma-es,jes-sep-cma-es-ipop,jes-snes
    PYTHONPATH=. python benchmarks/bbob.py --post     # the table from the saved records, and cocopp's figures

Every (optimizer, dimension) writes COCO's standard observer output to ``exdata/<optimizer>/dNN`` (cocopp reads
``exdata/<optimizer>`` as one algorithm) and one JSON line per problem to ``exdata/records/<optimizer>.jsonl``.
``--post`` prints, per optimizer and dimension, the fraction of (function, instance, target) triples solved
within the budget over COCO's 51 standard targets ``f - f_opt < 10^k``, ``k = 2, 1.8, ..., -8`` (computed here
from each problem's best f - f_opt seen within the budget; one cell is checked against cocopp's reading of
COCO's own records), runs cocopp on the folders (``ppdata/``) and puts its aggregated ECDF of each dimension
side by side in ``ppdata/bbob_ecdf.png`` (docs/images/bbob_ecdf.png).

The same for every optimizer: budget ``10^4 d`` calls of the COCO problem (``--budget-multiplier``); the start
point ``x0`` uniform in ``[-4, 4]^d`` from ``numpy.random.default_rng([seed, function, instance, d])``
(pycma's and Hansen's bbob setting; the suite's ``initial_solution`` is the origin for every problem);
initial sigma 2; the default population ``4 + floor(3 ln d)``; a problem ends when COCO's final target
(``f - f_opt < 1e-8``, ``problem.final_target_hit``) is hit or the budget is spent. Every call of the problem
goes through :class:`Recorder`, which counts it (COCO's observer sees exactly those calls) and, once the final
target is hit or the budget spent, answers with the best value seen without calling the problem again, so no
optimizer is charged for or credited with what it does after that. Optimizer seed (jes ``key``, pycma
``seed``, evosax key) per problem: ``1 + 10^6 seed + 10^4 function + 10^2 instance + d``.

- ``jes-cma-es-ipop``: ``jes.optimize(f, x0, "cma_es", minimize=True, noise_std=2, restarts="ipop",
  max_evaluations=budget, target=f_opt + 1e-8, host=True)``: IPOP (population doubled per restart, from
  ``x0``, at most 9 restarts as pycma's ``restarts=9``) on jes's default ``StopCriteria``; in JAX's x64 mode,
  so means, samples, covariance and f are float64 (bbob's f_opt offsets, e.g. 79.48 on f1, are beyond float32's
  resolution at 1e-8). ``host=True``: the COCO problem is called on the host for each member and then once
  at each generation's updated mean; those mean evaluations are real calls of the problem, counted by COCO
  and by the budget (``num_members + 1`` calls a generation). ``target`` is tested on f(mean); the
  Recorder's answer after a member hits the final target makes the next mean evaluation end the run.
- ``jes-sep-cma-es-ipop``: the same with ``"sep_cma_es"``.
- ``jes-snes``: ``"snes"`` (no restarts in jes: one run over the whole budget, no stop criteria).
- ``pycma-ipop``: ``cma.fmin2(f, x0, 2, {"maxfevals": budget, "termination_callback": final target hit,
  "seed": seed, "verbose": -9}, restarts=9, incpopsize=2)``, pycma's IPOP-CMA-ES (its defaults otherwise:
  its own stop criteria, its evaluation of the final mean of each run).
- ``evosax-cma-es``: evosax 0.3.2's ``CMA_ES`` (defaults, ``std_init=2``), ask/tell in one compiled program
  each, shared over the problems of a dimension; evosax has no restarts or stop criteria, so one run spends
  the whole budget (or ends at the final target). Also in x64 mode.
"""
from __future__ import annotations

import argparse
import json
import math
import importlib.util
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)  # before any array exists: float64 means, samples and fitness

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import print_load, print_provenance  # noqa: E402

OPTIMIZERS = ("jes-cma-es-ipop", "pycma-ipop", "evosax-cma-es", "jes-sep-cma-es-ipop", "jes-snes")
TARGETS = 10.0 ** np.linspace(2, -8, 51)  # COCO's standard bbob targets on f - f_opt
FINAL_TARGET = 1e-8


class Recorder:
    """The objective every optimizer calls: counts calls of the COCO problem and keeps the best f seen.

    After the final target is hit or the budget is spent it answers with the best value seen and does not call
    the problem (COCO's observer never sees those points, and no optimizer gains from them)."""

    def __init__(self, problem, budget: int):
        self.problem, self.budget = problem, budget
        self.calls, self.best = 0, math.inf

    @property
    def done(self) -> bool:
        return self.calls >= self.budget or self.problem.final_target_hit

    def __call__(self, x) -> float:
        if self.done:
            return self.best
        value = float(self.problem(np.asarray(x, np.float64)))
        self.calls += 1
        self.best = min(self.best, value)
        return value


def f_opt(suite_name: str, problem_id: str) -> float:
    """f at the problem's optimum, evaluated on an unobserved copy of the problem (COCO counts nothing)."""
    suite = _unobserved_suites.setdefault(suite_name, __import__("cocoex").Suite(suite_name, "", ""))
    twin = suite.get_problem(problem_id)
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as scratch:
        os.chdir(scratch)  # _best_parameter("print") writes the optimum's coordinates into the working folder
        try:
            twin._best_parameter("print")
            x_opt = np.loadtxt("._bbob_problem_best_parameter.txt", ndmin=1)
        finally:
            os.chdir(here)
    return float(twin(x_opt))


_unobserved_suites: dict = {}


def problem_seed(seed: int, function: int, instance: int, dim: int) -> int:
    return 1 + 10 ** 6 * seed + 10 ** 4 * function + 10 ** 2 * instance + dim


def default_population(dim: int) -> int:
    return 4 + int(3 * math.log(dim))


# --------------------------------------------------------------------------------------------- optimizers
def run_jes(strategy: str, restarts: str | None):
    import jes

    def run(recorder, x0, sigma, budget, key, target):
        if restarts is None:
            r = jes.optimize(recorder, x0, strategy, minimize=True, noise_std=sigma, num_generations=budget,
                             max_evaluations=budget, target=target, key=key, host=True)
        else:
            r = jes.optimize(recorder, x0, strategy, minimize=True, noise_std=sigma, restarts=restarts,
                             max_evaluations=budget, target=target, key=key, host=True)
        return dict(runs=len(r.runs) or 1, stop_reason=r.stop_reason, jes_evaluations=r.num_evaluations,
                    compile_seconds=round(r.compile_time, 2))
    return run


def run_pycma(recorder, x0, sigma, budget, key, target):
    import cma

    options = {"maxfevals": budget, "termination_callback": lambda es: recorder.problem.final_target_hit,
               "seed": key, "verbose": -9, "verb_log": 0, "verb_disp": 0}
    _, es = cma.fmin2(recorder, x0, sigma, options, restarts=9, incpopsize=2)
    # the last run's population is 2^(runs - 1) times the first's
    runs = 1 + round(math.log2(es.sp.popsize / default_population(len(x0))))
    return dict(runs=runs, population=es.sp.popsize, stop_reason=",".join(sorted(es.stop())))


class EvosaxCMA:
    """evosax's CMA_ES for one dimension: ask and tell compiled once, shared by that dimension's problems."""

    def __init__(self, dim: int, sigma: float):
        import jax.numpy as jnp
        from evosax.algorithms import CMA_ES

        self.es = CMA_ES(population_size=default_population(dim), solution=jnp.zeros(dim))
        self.params = self.es.default_params.replace(std_init=sigma)
        self.ask, self.tell = jax.jit(self.es.ask), jax.jit(self.es.tell)
        self.population = default_population(dim)

    def __call__(self, recorder, x0, sigma, budget, key, target):
        import jax.numpy as jnp

        key = jax.random.key(key)
        state = self.es.init(key, jnp.asarray(x0), self.params)
        generations, stop_reason = 0, "budget"
        while recorder.calls + self.population <= budget and not recorder.problem.final_target_hit:
            key, ask_key, tell_key = jax.random.split(key, 3)
            xs, state = self.ask(ask_key, state, self.params)
            xs_host = np.asarray(xs)
            if not np.isfinite(xs_host).all():  # its sigma collapsed or overflowed: the run cannot go on
                stop_reason = "non-finite members"
                break
            fitness = np.array([recorder(x) for x in xs_host])
            state, _ = self.tell(tell_key, xs, jnp.asarray(fitness), state, self.params)
            generations += 1
        if recorder.problem.final_target_hit:
            stop_reason = "final target"
        return dict(runs=1, generations=generations, stop_reason=stop_reason)


# ------------------------------------------------------------------------------------------------ running
def run_cell(name: str, dim: int, functions: list[int], instances: list[int], args) -> list[dict]:
    """One optimizer on one dimension: COCO's observer output in ``exdata/<name>/dNN``; each problem's record
    appended to ``exdata/records/<name>.jsonl`` as it ends (the dimension's old records dropped first), and
    returned."""
    path = os.path.join(args.out, "records", f"{name}.jsonl")
    kept = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
    with open(path, "w") as f:  # a rerun of a cell replaces it
        f.writelines(json.dumps(r) + "\n" for r in kept if r["dim"] != dim)
    import cocoex

    sigma = 2.0
    folder = os.path.join(args.out, name, f"d{dim:02d}")
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    # cocoex writes to exdata/<result_folder>; the folder is given relative to the working directory
    observer = cocoex.Observer("bbob", f"result_folder: {os.path.relpath(folder, 'exdata')} algorithm_name: {name}")
    options = (f"dimensions: {dim} function_indices: {','.join(map(str, functions))} "
               f"instance_indices: {','.join(map(str, instances))}")
    suite = cocoex.Suite("bbob", "", options)
    if name == "jes-cma-es-ipop":
        optimizer = run_jes("cma_es", "ipop")
    elif name == "jes-sep-cma-es-ipop":
        optimizer = run_jes("sep_cma_es", "ipop")
    elif name == "jes-snes":
        optimizer = run_jes("snes", None)
    elif name == "pycma-ipop":
        optimizer = run_pycma
    else:
        optimizer = EvosaxCMA(dim, sigma)
    records = []
    for problem in suite:
        function, instance = problem.id_function, problem.id_instance
        best_f = f_opt("bbob", problem.id)
        problem.observe_with(observer)
        budget = int(args.budget_multiplier * dim)
        recorder = Recorder(problem, budget)
        x0 = np.random.default_rng([args.seed, function, instance, dim]).uniform(-4, 4, dim)
        key = problem_seed(args.seed, function, instance, dim)
        t0 = time.perf_counter()
        info = optimizer(recorder, x0, sigma, budget, key, best_f + FINAL_TARGET)
        record = dict(optimizer=name, dim=dim, function=function, instance=instance, seed=key,
                      evaluations=recorder.calls, coco_evaluations=int(problem.evaluations),
                      best_delta=recorder.best - best_f, f_opt=best_f, final_target_hit=bool(problem.final_target_hit),
                      seconds=time.perf_counter() - t0, **info)
        if record["coco_evaluations"] != record["evaluations"]:
            raise AssertionError(f"{problem.id}: COCO counted {problem.evaluations} calls, the recorder {recorder.calls}")
        records.append(record)
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"  {name} {problem.id}: {recorder.calls} evaluations, f - f_opt = {record['best_delta']:.3g}, "
              f"{record['seconds']:.1f}s {info}", flush=True)
        problem.free()
    return records


def solved_fraction(records: list[dict]) -> float:
    deltas = np.array([r["best_delta"] for r in records])
    return float((deltas[:, None] < TARGETS[None, :]).mean())


def load_records(out: str) -> dict:
    table: dict = {}
    folder = os.path.join(out, "records")
    for file in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        with open(os.path.join(folder, file)) as f:
            for line in f:
                r = json.loads(line)
                table.setdefault((r["optimizer"], r["dim"]), {})[(r["function"], r["instance"])] = r
    return table


def print_table(out: str) -> None:
    table = load_records(out)
    names = [n for n in OPTIMIZERS if any(k[0] == n for k in table)]
    dims = sorted({k[1] for k in table})
    print("\nfraction of (function, instance, target) triples solved within 10^4 d evaluations "
          "(51 targets 10^[2..-8]; problems run):")
    print("| optimizer | " + " | ".join(f"d={d}" for d in dims) + " |")
    print("|---|" + "---|" * len(dims))
    # where not every optimizer ran a dimension completely, its cells count the functions all of them ran on
    # every instance
    common = {}
    for d in dims:
        cells = [set(table[k]) for k in table if k[1] == d]
        problems = set.intersection(*cells)
        instances = {i for cell in cells for _, i in cell}
        whole = {f for f, _ in problems if all((f, i) in problems for i in instances)}
        common[d] = {key for key in problems if key[0] in whole}
    for name in names:
        cells = []
        for d in dims:
            records = [r for key, r in table.get((name, d), {}).items() if key in common[d]]
            if not records:
                cells.append("-")
                continue
            functions = sorted({r["function"] for r in records})
            seconds = sum(r["seconds"] for r in records)
            which = f"{len(functions)} f" if len(functions) == 24 else f"f{functions[0]}-f{functions[-1]}"
            cells.append(f"{solved_fraction(records):.3f} ({len(records)} = {which}, {seconds:.0f} s)")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\nfinal target 1e-8 hit (problems):")
    for name in names:
        print(f"  {name}: " + ", ".join(
            f"d={d}: {sum(r['final_target_hit'] for r in table.get((name, d), {}).values())}/"
            f"{len(table.get((name, d), {}))}" for d in dims))


def cocopp_fraction(folder: str, budget_multiplier: float) -> float:
    """The solved fraction of one (optimizer, dimension) folder from COCO's own records, read by cocopp."""
    import cocopp

    hits = []
    for ds in cocopp.load(folder):
        evals = np.array(ds.detEvals(list(TARGETS)))  # [targets, instances], NaN: not reached
        hits.append(np.isfinite(evals) & (evals <= budget_multiplier * ds.dim))
    return float(np.concatenate(hits, axis=1).mean())


def post(out: str, budget_multiplier: float) -> None:
    """The table; one cell against cocopp's reading of COCO's records; cocopp's figures (``ppdata/``); and the
    aggregated ECDFs of every dimension side by side in ``ppdata/bbob_ecdf.png``."""
    import warnings

    warnings.simplefilter("ignore")  # cocopp's many deprecation and archive warnings
    print_table(out)
    import cocopp

    table = load_records(out)
    name, dim = min(table, key=lambda k: (OPTIMIZERS.index(k[0]), k[1]))
    print(f"\ncross-check {name} d={dim}: here {solved_fraction(list(table[(name, dim)].values())):.4f}, "
          f"cocopp {cocopp_fraction(os.path.join(out, name, f'd{dim:02d}'), budget_multiplier):.4f}", flush=True)
    # a figure only for dimensions every optimizer ran completely (24 functions x 5 instances)
    dims = sorted(d for d in {k[1] for k in table} if all(len(v) == 120 for k, v in table.items() if k[1] == d))
    folders = [os.path.join(out, n) for n in OPTIMIZERS if os.path.isdir(os.path.join(out, n))]
    partial = [os.path.join(out, n, f"d{d:02d}") for n, d in table if d not in dims]
    if partial:  # cocopp reads every folder below the ones it is given: moved to exdata/partial/
        print("left out of cocopp (not run completely by every optimizer):", ", ".join(partial))
        for folder in partial:
            os.makedirs(os.path.join(out, "partial"), exist_ok=True)
            shutil.move(folder, os.path.join(out, "partial", "-".join(folder.split(os.sep)[-2:])))
    cocopp.genericsettings.figure_file_formats = ["png"]
    cocopp.main(" ".join(["-o", "ppdata"] + folders))
    montage(dims)


def montage(dims: list[int]) -> None:
    """cocopp's newest aggregated ECDF of each of ``dims`` side by side in ``ppdata/bbob_ecdf.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pictures = []
    for d in dims:
        found = [os.path.join(root, f) for root, _, files in os.walk("ppdata") for f in files
                 if f == f"pprldmany_{d:02d}D_noiselessall.png"]
        if found:
            pictures.append((d, max(found, key=os.path.getmtime)))
    if pictures:
        fig, axes = plt.subplots(1, len(pictures), figsize=(4.2 * len(pictures), 3.4), squeeze=False)
        for ax, (d, path) in zip(axes[0], pictures):
            ax.imshow(plt.imread(path))
            ax.set_title(f"bbob, 24 functions x 5 instances, d = {d}", fontsize=9)
            ax.axis("off")
        fig.tight_layout()
        fig.savefig(os.path.join("ppdata", "bbob_ecdf.png"), dpi=110)
        print("aggregated ECDFs:", ", ".join(p for _, p in pictures), "-> ppdata/bbob_ecdf.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--optimizers", default="jes-cma-es-ipop,pycma-ipop")
    parser.add_argument("--dims", default="2,5,10,20")
    parser.add_argument("--functions", default="1-24", help="e.g. 1-24 or 1,8,15")
    parser.add_argument("--instances", default="1-5")
    parser.add_argument("--budget-multiplier", type=float, default=1e4)
    parser.add_argument("--seed", type=int, default=0,
                        help="one number, every problem's x0 and optimizer seed derive from it (not a count or a "
                             "list: COCO's instances 1-5 are the repetitions)")
    parser.add_argument("--out", default="exdata")
    parser.add_argument("--post", action="store_true", help="only print the table and run cocopp")
    args = parser.parse_args()
    needed = "cocopp" if args.post else "cocoex"
    if importlib.util.find_spec(needed) is None:  # before any run, not after
        package = "cocopp" if args.post else "coco-experiment"  # cocoex is in coco-experiment, cocopp its own
        parser.error(f"{needed} is not importable here: pip install {package} (COCO's {needed}; a "
                     f"benchmark tool, never a jes dependency)")
    print_provenance()
    if args.post:
        post(args.out, args.budget_multiplier)
        return

    def span(text):
        out = []
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
        return out

    names = args.optimizers.split(",")
    unknown = [n for n in names if n not in OPTIMIZERS]
    if unknown:
        parser.error(f"unknown optimizers {unknown}; choose from {', '.join(OPTIMIZERS)}")
    functions, instances = span(args.functions), span(args.instances)
    print(f"functions {functions}, instances {instances}, seed {args.seed}, budget {args.budget_multiplier:g} x d",
          flush=True)
    os.makedirs(os.path.join(args.out, "records"), exist_ok=True)
    for dim in map(int, args.dims.split(",")):
        for name in names:
            t0 = time.perf_counter()
            records = run_cell(name, dim, functions, instances, args)
            print(f"{name} d={dim}: solved fraction {solved_fraction(records):.3f} over {len(records)} problems, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
    print_table(args.out)


if __name__ == "__main__":
    main()
    print_load()
