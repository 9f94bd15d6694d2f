"""jes and evosax side by side on the same black-box functions and RL envs (evosax is a benchmark-only extra).

    pip install --target /tmp/evosax "evosax==0.3.2" dotmap --no-deps   # beside jes's environment
    PYTHONPATH=/tmp/evosax python benchmarks/evosax_compare.py [--dims 10,100] [--seeds 0,1,2]
    PYTHONPATH=/tmp/evosax python benchmarks/evosax_compare.py --part rl [--envs CartPole-v1,Pendulum-v1]
        [--rl-seeds 0,1,2,3,4] [--rl-strategies sep_cma_es,snes,openai_es,pgpe] [--rl-variants default,mean_lr10]
    PYTHONPATH=/tmp/evosax python benchmarks/evosax_compare.py --part all    # both, one run

evosax is not a jes dependency; it is put on ``PYTHONPATH`` for this script only (its other
requirements, jax, flax, numpy and matplotlib, are jes's or gymnax's already).

Functions (``--part functions``, the default): both libraries get the same function, start point,
initial sigma, population (jes's default for the dimension, ``4 + 3 ln d``), evaluation budget (as
``benchmarks/strategies.py``: ``2e4 * sqrt(d / 10)``, each generation counted as its members plus one
evaluation of the mean) and seeds; each library's own defaults otherwise. The strategies compared are
the two that have no optimizer or learning rate to choose, so "defaults" means the paper's algorithm in
both: sep-CMA-ES and SNES. Both minimise; the target is on f(mean). evosax runs its generations inside
compiled ``lax.scan`` blocks of 25 generations (stopping after the block that reaches the target), jes
through ``jes.optimize``'s blocks of generations (``--generations-per-call``, default jes's own: 128 with float32 values; stopping at the
target inside the block); the libraries alternate per seed, so both see the same machine load;
each compiles once per configuration, shared by the seeds; "s" is the median wall time per run over
the seeds (the first seed's includes the compile).

RL (``--part rl``): the envs, policies, thresholds, populations and generation budgets of
``benchmarks/strategies.py``'s ``ENVS``. jes runs as that script runs it (``jes.Trainer`` and
``jes.loop.run``, i.e. ``jes.train``'s defaults: one episode per member, observation normalisation,
the centre evaluated on 64 fresh episodes after every generation, stop at the threshold). evosax 0.3
has no rollout, so its ask/tell is wrapped around jes's own rollout (:class:`EvosaxRL`): the same
policy functions, env, episode semantics, chunking and observation normaliser, one compiled program per
(env, algorithm) doing ask -> rollout -> tell -> centre evaluation, shared by the seeds. evosax gets
the same initial mean (the policy's init for the seed) and initial sigma (0.2) and otherwise its
defaults, except where a default has no meaning for a policy (see ``RL_PAIRS``). Both run on ONE
CPU device (no ``jes.use_cpu_cores()``), so the per-generation times compare the programs, not the
sharding; the libraries are interleaved per seed so both see the same machine load.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jes  # noqa: E402
from jes import blackbox  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from strategies import ENVS, FUNCTIONS  # noqa: E402  (same functions, start points and sigmas; same envs,

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import median_text, print_load, print_provenance  # noqa: E402
#                                                 policies, thresholds, populations and generation budgets)

PAIRS = {"sep_cma_es": "Sep_CMA_ES", "snes": "SNES"}


class EvosaxRun:
    """One evosax configuration, compiled once and shared by the seeds (as jes shares its program)."""

    BLOCK = 25  # generations per compiled call; the run stops after the block that reaches the target

    def __init__(self, algorithm, fn, x0, sigma, population, generations):
        self.es = algorithm(population_size=population, solution=x0)
        self.params = self.es.default_params.replace(std_init=sigma)
        self.x0, self.fn, self.generations = x0, fn, generations

        def generation(state, k):
            ask_key, tell_key = jax.random.split(k)
            xs, state = self.es.ask(ask_key, state, self.params)
            state, _ = self.es.tell(tell_key, xs, jax.vmap(fn)(xs), state, self.params)
            return state, fn(state.mean)

        self.block = jax.jit(lambda state, keys: jax.lax.scan(generation, state, keys))

    def __call__(self, seed, target):
        """f(mean) after each generation run (all of them, or up to the block that reached ``target``)."""
        key = jax.random.key(seed)
        state = self.es.init(key, self.x0, self.params)
        keys = jax.random.split(jax.random.fold_in(key, 1), self.generations)
        values = []
        for start in range(0, self.generations, self.BLOCK):
            chunk = keys[start:start + self.BLOCK]
            if chunk.shape[0] < self.BLOCK:  # the last, shorter block: pad, keep the real generations
                chunk = jnp.concatenate([chunk, keys[:self.BLOCK - chunk.shape[0]]])
            state, block_values = self.block(state, chunk)
            values.extend(np.asarray(block_values)[: min(self.BLOCK, self.generations - start)].tolist())
            if target is not None and min(values) < target:
                break
        return np.asarray(values)


# ------------------------------------------------------------------------------------------------ RL part
# Each jes strategy and the evosax algorithm it is compared with, with the evosax settings: a function
# (algorithms, trainer) -> (algorithm object, its params). evosax gets jes's initial mean (the policy's
# init for the seed, set in EvosaxRL.run) and jes's initial sigma (ESConfig.noise_std, 0.2) wherever the
# algorithm has one; everything else is evosax's own default, except where that default has no meaning
# for a policy (Open_ES's optimizer: sgd with lr 1e-3; PGPE's ClipUp: lr 0.01, max speed 0.02), where it
# gets jes's optimizer and learning rate, so that the pair is the same algorithm.
def _sigma(trainer):
    return float(trainer.config.noise_std)


def _sep_cma_es(algorithms, trainer, mean_lr=None):
    es = algorithms.Sep_CMA_ES(population_size=trainer.config.num_members, solution=jnp.zeros(trainer.num_params))
    params = es.default_params.replace(std_init=jnp.float32(_sigma(trainer)))
    if mean_lr is not None:  # evosax's c_mean is 1 (the paper's); jes's policy default is 10
        params = params.replace(c_mean=mean_lr)
    return es, params


def _snes(algorithms, trainer, mean_lr=None):
    import optax
    # evosax's SNES takes its mean step through an optax optimizer: sgd(1.0) by default (the paper's eta_mu = 1;
    # jes's policy default is 10)
    kwargs = {} if mean_lr is None else {"optimizer": optax.sgd(learning_rate=mean_lr)}
    es = algorithms.SNES(population_size=trainer.config.num_members, solution=jnp.zeros(trainer.num_params), **kwargs)
    return es, es.default_params.replace(std_init=jnp.float32(_sigma(trainer)))


def _open_es(algorithms, trainer):
    import optax
    # evosax's defaults (sgd, lr 1e-3; sigma 1.0) cannot move a policy in 50-100 generations; given jes's
    # adam with jes's lr (0.2, optax.adam's other defaults, as jes.optimizers builds it) and sigma 0.2
    from jes.optimizers import DEFAULT_LEARNING_RATES

    lr = DEFAULT_LEARNING_RATES["adam"]
    es = algorithms.Open_ES(population_size=trainer.config.num_members, solution=jnp.zeros(trainer.num_params),
                            use_antithetic_sampling=True, optimizer=optax.adam(learning_rate=lr),
                            std_schedule=optax.constant_schedule(_sigma(trainer)))
    return es, es.default_params


def _open_es_defaults(algorithms, trainer):
    import optax
    # evosax's own optimizer default (sgd, lr 1e-3); sigma 0.2 as jes's (evosax's default is 1.0)
    es = algorithms.Open_ES(population_size=trainer.config.num_members, solution=jnp.zeros(trainer.num_params),
                            std_schedule=optax.constant_schedule(_sigma(trainer)))
    return es, es.default_params


def _pgpe_defaults(algorithms, trainer):
    # evosax's own ClipUp default (lr 0.01, max speed 0.02); sigma 0.2 as jes's (evosax's default is 1.0)
    es = algorithms.PGPE(population_size=trainer.config.num_members, solution=jnp.zeros(trainer.num_params))
    return es, es.default_params.replace(std_init=_sigma(trainer))


def _pgpe(algorithms, trainer):
    from evosax.core.optimizer import clipup
    # evosax's default ClipUp (lr 0.01, max speed 0.02) is 150-280x shorter than jes's policy default (0.4 of
    # the search radius sigma * sqrt(P), max speed twice that): given jes's. Its sigma step (std_lr 0.1) stays
    # evosax's (jes: 0.2), as does the rest.
    lr = trainer.strategy.default_learning_rate("clipup", trainer.num_params, trainer.config.noise_std)
    es = algorithms.PGPE(population_size=trainer.config.num_members, solution=jnp.zeros(trainer.num_params),
                         optimizer=clipup(learning_rate=lr, max_velocity=2 * lr))
    return es, es.default_params.replace(std_init=_sigma(trainer))


RL_PAIRS = {
    # jes strategy: {evosax variant: (label, algorithm builder, mirrored halves: members i and i + n/2)}
    "sep_cma_es": {"default": ("evosax Sep_CMA_ES", _sep_cma_es, False),
                   "mean_lr10": ("evosax Sep_CMA_ES c_mean=10", lambda a, t: _sep_cma_es(a, t, 10.0), False)},
    "snes": {"default": ("evosax SNES", _snes, False),
             "mean_lr10": ("evosax SNES sgd(10)", lambda a, t: _snes(a, t, 10.0), False)},
    "openai_es": {"default": ("evosax Open_ES adam(0.2)", _open_es, True),
                  "evosax_defaults": ("evosax Open_ES sgd(1e-3)", _open_es_defaults, True)},
    "pgpe": {"default": ("evosax PGPE jes's ClipUp lr", _pgpe, True),
             "evosax_defaults": ("evosax PGPE ClipUp(0.01)", _pgpe_defaults, True)},
}


class EvosaxRL:
    """evosax's ask/tell around jes's own rollout, one compiled generation per (env, algorithm), shared by seeds.

    The population is evaluated exactly as a jes.Trainer evaluates its members: the trainer's policy
    functions, env spec and flat-parameter unravel, chunks of ``trainer.chunk_size`` members one after
    another (``lax.map``, as jes does on one device), ``episodes_per_member`` episodes each, running
    observation normalisation with jes's statistics (same initial pseudo-count, updated from member
    rollouts after each generation, as jes does). Mirrored evosax members (i and i + n/2) share their
    episodes, as jes's mirrored pairs do. After each update the centre (evosax's mean) is evaluated on
    ``eval_episodes`` fresh episodes with the updated normaliser, as jes does.
    """

    def __init__(self, trainer, es, params, mirrored):
        from jes.cpu import compiler_options
        from jes.rollout import OBS_EPS, obs_normaliser, run_episodes
        from jes.strategies import noise

        self.trainer, self.es, self.params, self.OBS_EPS = trainer, es, params, OBS_EPS
        cfg = trainer.config
        n, size = cfg.num_members, trainer.chunk_size
        if n % size:
            raise ValueError(f"population {n} is not whole chunks of {size}")
        chunks, episodes = n // size, cfg.episodes_per_member
        norm = trainer.normalize_observations
        fns, spec, unravel, min_slots = trainer.fns, trainer.spec, trainer.unravel, trainer.rollout_min_batch

        def scale(obs):
            return obs_normaliser(*obs) if norm else None

        def generation(state, obs, gen_key):
            ask_key, tell_key, episode_key, centre_key = jax.random.split(gen_key, 4)
            xs, state = es.ask(ask_key, state, params)  # [n, P]: the solution is a flat vector
            source = jnp.arange(n) % (n // 2) if mirrored else jnp.arange(n)
            keys = jax.vmap(lambda m: jax.vmap(lambda e: jax.random.fold_in(jax.random.fold_in(episode_key, m), e))(
                jnp.arange(episodes)))(source)

            def chunk(args):
                flat, k = args
                out = run_episodes(fns, spec, jax.vmap(unravel)(flat), k, jnp.ones(size, bool), obs_scale=scale(obs),
                                   collect_obs_stats=norm, min_slots=min_slots)
                return out.returns.mean(axis=1), out.steps.sum(), out.obs_sum, out.obs_sumsq

            returns, steps, obs_sum, obs_sumsq = jax.lax.map(
                chunk, (xs.reshape(chunks, size, -1), keys.reshape(chunks, size, episodes)))
            returns = returns.reshape(n)
            # evosax MINIMISES (its ranks, weights and best-so-far all treat lower fitness as better): it is told
            # the negated returns. A NaN return (non-finite policy output) ranks worst in evosax.
            state, _ = es.tell(tell_key, xs, -returns, state, params)
            if norm:
                obs = (obs[0] + steps.sum().astype(jnp.float32), obs[1] + obs_sum.sum(0), obs[2] + obs_sumsq.sum(0))
            centre_keys = noise.centre_episode_keys(centre_key, cfg.eval_episodes)[None]
            centre_params = jax.tree.map(lambda x: x[None], unravel(state.mean))
            centre = run_episodes(fns, spec, centre_params, centre_keys, jnp.ones((1,), bool), obs_scale=scale(obs),
                                  min_slots=min_slots)
            env_steps = steps.sum() + centre.steps.sum()  # members' and centre's, as jes's history counts them
            return state, obs, centre.returns[0].mean(), jnp.isnan(returns).sum(), env_steps

        self.generation = jax.jit(generation, compiler_options=compiler_options())
        self.compiled = None
        self.compile_time = 0.0

    def run(self, seed, threshold):
        """``(solved generation or None, final centre return, per-generation seconds, per-generation env steps,
        NaN member count)``."""
        trainer = self.trainer
        run_key = jax.random.key(seed)
        x0 = trainer.init_state(seed).params  # jes's initial mean for this seed: the policy's init
        state = self.es.init(jax.random.fold_in(run_key, 0), x0, self.params)
        zeros = jnp.zeros(trainer.obs_shape, jnp.float32)
        obs = (jnp.float32(self.OBS_EPS), zeros, jnp.full(trainer.obs_shape, self.OBS_EPS, jnp.float32))
        es_key = jax.random.fold_in(run_key, 1)
        if self.compiled is None:
            t0 = time.perf_counter()
            self.compiled = self.generation.lower(state, obs, jax.random.fold_in(es_key, 0)).compile()
            self.compile_time = time.perf_counter() - t0
        times, steps, solved, centre, nans = [], [], None, float("nan"), 0
        for g in range(trainer.config.num_generations):
            t0 = time.perf_counter()
            state, obs, c, bad, n = self.compiled(state, obs, jax.random.fold_in(es_key, g))
            c, bad, n = float(c), int(bad), int(n)  # read back every generation (the stopping test), as jes does
            times.append(time.perf_counter() - t0)
            steps.append(n)
            nans += bad
            if np.isfinite(c):
                centre = c
            if c >= threshold:
                solved = g + 1
                break
        return solved, centre, times, steps, nans


def _row(env, strategy, library, solved, finals, gen_times, gen_steps, compile_time, members, eval_episodes,
         nans=None):
    ok = [g for g in solved if g is not None]
    evals = [g * (members + eval_episodes) for g in ok]
    return dict(env=env, strategy=strategy, library=library, solved=f"{len(ok)}/{len(solved)}",
                gens=f"{median_text(ok)} ({min(ok)}-{max(ok)})" if ok else "-",
                evals=median_text(evals) if ok else "-",
                final=f"{np.mean(finals):.1f} +- {np.std(finals):.1f}",
                per_seed=" ".join(f"{f:.0f}" for f in finals),
                s_per_gen=f"{np.median(gen_times):.3f}" if gen_times else "-", compile=f"{compile_time:.1f}",
                steps_per_s=f"{sum(gen_steps) / sum(gen_times) / 1e3:.0f}k" if gen_times else "-",
                nans="-" if nans is None else str(nans))


def rl(args, algorithms):
    """The RL part: jes.train's generation against evosax's ask/tell on jes's rollout, same envs and budgets."""
    from jes.loop import run

    seeds = [int(s) for s in args.rl_seeds.split(",")]
    variants = args.rl_variants.split(",")
    rows = []
    print(f"RL part on {len(jax.devices())} device(s) for both libraries; seeds {seeds}", flush=True)
    for env in args.envs.split(","):
        make_policy, threshold, generations, members = ENVS[env]
        generations = args.rl_generations or generations
        for name in args.rl_strategies.split(","):
            # jes: as benchmarks/strategies.py runs it (jes.train's defaults: eval every generation on 64 episodes,
            # one episode per member, observation normalisation, stop at the env's threshold)
            config = jes.ESConfig(num_members=members, num_generations=generations, stop_at_return=threshold)
            trainer = jes.Trainer(make_policy(), env, None, config, strategy=name)
            runs = {"jes": dict(solved=[], finals=[], times=[], steps=[], compile=0.0)}
            evosax_runs = {}
            for variant in variants:
                if variant in RL_PAIRS[name]:
                    label, build, mirrored = RL_PAIRS[name][variant]
                    es, params = build(algorithms, trainer)
                    evosax_runs[label] = EvosaxRL(trainer, es, params, mirrored)
                    runs[label] = dict(solved=[], finals=[], times=[], steps=[], compile=0.0, nans=0)
            if args.rl_no_jes:
                del runs["jes"]
            for seed in seeds:  # libraries interleaved per seed, so both see the same machine load
                if "jes" in runs:
                    result = run(trainer, trainer.init_state(seed), key=seed)
                    r = runs["jes"]
                    r["solved"].append(result.solved_generation)
                    r["finals"].append(result.final_centre_return)
                    r["times"].extend(result.history["generation_time"][1:])
                    r["steps"].extend(np.diff(result.history["env_steps"]).tolist())  # cumulative -> per generation
                    r["compile"] = result.compile_time
                    print(f"  {env} {name} jes seed {seed}: solved at {result.solved_generation}, centre "
                          f"{result.final_centre_return:.1f}", flush=True)
                for label, ev in evosax_runs.items():
                    solved, final, times, steps, nans = ev.run(seed, threshold)
                    r = runs[label]
                    r["solved"].append(solved)
                    r["finals"].append(final)
                    r["times"].extend(times[1:])
                    r["steps"].extend(steps[1:])
                    r["compile"] = ev.compile_time
                    r["nans"] += nans
                    print(f"  {env} {name} {label} seed {seed}: solved at {solved}, centre {final:.1f}"
                          f"{f', {nans} NaN members' if nans else ''}", flush=True)
            for label, r in runs.items():
                rows.append(_row(env, name, label, r["solved"], r["finals"], r["times"], r["steps"], r["compile"],
                                 members, config.eval_episodes, r.get("nans")))
    print("\n| env | strategy | library | solved | generations to solve, median (range) "
          "| evaluations to solve (median) | final centre return (mean +- std) | per seed "
          "| s/generation (median) | env steps/s | compile s | NaN members |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['env']} | {r['strategy']} | {r['library']} | {r['solved']} | {r['gens']} | {r['evals']} | "
              f"{r['final']} | {r['per_seed']} | {r['s_per_gen']} | {r['steps_per_s']} | {r['compile']} "
              f"| {r['nans']} |", flush=True)


def functions(args, algorithms):
    """The black-box function part (one table, both libraries)."""
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"command: {' '.join(sys.argv)}; seeds {seeds}; jes generations_per_call={args.generations_per_call}")
    print("\n| function | d | strategy | library | population | evaluations to f < 1e-6 (median, runs that reached it) "
          "| final f(mean) (median) | s per run (median) | s per run / evosax's | ms per generation (median) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for fname in args.functions.split(","):
        fn, start, sigma, target = FUNCTIONS[fname]
        for d in (int(x) for x in args.dims.split(",")):
            x0 = start * jnp.ones(d)
            budget = int(2e4 * (d / 10) ** 0.5)
            for name in args.strategies.split(","):
                strategy = jes.strategies.get(name).for_functions()
                population = strategy.default_population(d)
                generations = max(1, budget // (population + 1))
                config = blackbox._config(population, generations, sigma, None, "centered_ranks", 0.0, None, strategy)
                problem = blackbox.FunctionProblem(fn, x0, strategy, config, minimize=True)
                results = {"jes": [], "evosax": []}
                evosax_run = EvosaxRun(getattr(algorithms, PAIRS[name]), fn, x0, sigma, population, generations)
                for seed in seeds:
                    t0 = time.perf_counter()
                    r = blackbox.run_optimization(problem, seed, target=target,
                                                  generations_per_call=args.generations_per_call)
                    reached = int(r.history["evaluations"][-1]) if target is not None and r.value < target else None
                    seconds = time.perf_counter() - t0
                    results["jes"].append((reached, float(r.value), seconds, seconds / len(r.history["generation"])))
                    t0 = time.perf_counter()
                    values = evosax_run(seed, target)
                    hit = np.flatnonzero(values < target) if target is not None else []
                    reached = int((hit[0] + 1) * (population + 1)) if len(hit) else None
                    final = values[hit[0]] if len(hit) else values[-1]  # where jes stops too: at the target
                    seconds = time.perf_counter() - t0
                    results["evosax"].append((reached, float(final), seconds, seconds / len(values)))
                evosax_seconds = np.median([r[2] for r in results["evosax"]])
                for library, rows in results.items():
                    got = [e for e, _, _, _ in rows if e is not None]
                    ev = "n/a" if target is None else (
                        f"{median_text(got)} ({len(got)}/{len(rows)})" if got else f"- (0/{len(rows)})")
                    seconds = np.median([r[2] for r in rows])
                    print(f"| {fname} | {d} | {name} | {library} | {population} | {ev} | "
                          f"{np.median([r[1] for r in rows]):.3g} | {seconds:.4f} | {seconds / evosax_seconds:.2f} | "
                          f"{1e3 * np.median([r[3] for r in rows]):.3f} |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("functions", "rl", "all"), default="functions")
    parser.add_argument("--dims", default="10,100")
    parser.add_argument("--seeds", default="0,1,2", help="seeds of the function part")
    parser.add_argument("--functions", default=",".join(FUNCTIONS))
    parser.add_argument("--generations-per-call", type=int, default=None,
                        help="jes.optimize's generations per compiled call (1: one call per generation; "
                             "default: jes's, 128 with float32 values)")
    parser.add_argument("--strategies", default=",".join(PAIRS), help="strategies of the function part")
    parser.add_argument("--envs", default="CartPole-v1,Pendulum-v1", help="envs of the RL part (from strategies.ENVS)")
    parser.add_argument("--rl-seeds", default="0,1,2,3,4", help="seeds of the RL part")
    parser.add_argument("--rl-strategies", default=",".join(RL_PAIRS), help="strategies of the RL part")
    parser.add_argument("--rl-variants", default="default",
                        help="evosax settings in the RL part, comma-separated: 'default' (see RL_PAIRS), 'mean_lr10' "
                             "(snes, sep_cma_es with jes's policy mean step), 'evosax_defaults' (openai_es, pgpe "
                             "with evosax's own optimizer and learning rate)")
    parser.add_argument("--rl-no-jes", action="store_true", help="RL part: run the evosax variants only")
    parser.add_argument("--rl-generations", type=int, default=0, help="override the per-env generation budget")
    args = parser.parse_args(argv)
    print_provenance()
    try:
        import evosax
        from evosax import algorithms
    except ImportError:
        sys.exit("evosax is not importable: install it beside jes as the docstring says (it is not a jes dependency)")
    print(f"jax {jax.__version__}, evosax {getattr(evosax, '__version__', '0.3.x')}, jes on {jax.devices()}")
    if args.part in ("functions", "all"):
        functions(args, algorithms)
    if args.part in ("rl", "all"):
        rl(args, algorithms)


if __name__ == "__main__":
    main()
    print_load()
