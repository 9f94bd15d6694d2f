"""Learning parity of low-rank (EGGROLL) perturbations: generations to solve, full rank vs r = 1 vs r = 4.

Per cell (env, policy) and perturbation, over seeds: how many seeds reach the env's threshold (the
centre's mean return over fresh episodes), and the generations they needed (median and range).
One trainer per (cell, perturbation); seeds share its compiled step.

    python benchmarks/lowrank_parity.py --seeds 0,1,2,3,4
    python benchmarks/lowrank_parity.py --cells cartpole-gru,pendulum-32 --seeds 0,1,2,3,4,5,6,7,8,9
    python benchmarks/lowrank_parity.py --breakout-baselines --seeds 0,1,2,3,4   # the Breakout threshold's scale
    python benchmarks/lowrank_parity.py --stats full.txt low.txt   # low rank against full rank, from saved output

``--stats`` reads this script's printed output (one line per seed; any number of files, e.g. full rank and the low
ranks run as two processes, or seeds split over several), prints each perturbation's table row over all the seeds
it read (as one run over them would, the final centre returns from the lines' one-decimal values), and compares
each perturbation with full rank, cell by cell, over the seeds both ran:
solve counts (Fisher's exact test, two-sided, and McNemar's exact test, which pairs the seeds: a binomial test on
the seeds only one of the two solved), the ratio of the medians of generations to solve with a bootstrap
interval (seeds resampled together, 5,000 draws, numpy's generator seeded 0, so the interval reproduces), and the
median of per-seed ratios over the seeds both solved.
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import jes  # noqa: E402
from jes.loop import run  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from inference_ratio import MinAtarCNN  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import print_load, print_provenance  # noqa: E402

CELLS = {
    # name: (env, policy, threshold, generations, config)
    "cartpole-gru": ("CartPole-v1", lambda: jes.GRUPolicy(5, 2), 475.0, 50, dict(num_members=512)),
    "cartpole-mlp64": ("CartPole-v1", lambda: jes.MLPPolicy((64, 64)), 475.0, 50, dict(num_members=512)),
    "pendulum-32": ("Pendulum-v1", lambda: jes.MLPPolicy((32, 32)), -200.0, 100, dict(num_members=512)),
    "pendulum-256": ("Pendulum-v1", lambda: jes.MLPPolicy((256, 256)), -200.0, 100, dict(num_members=512)),
    "brax-inverted-pendulum": ("brax/inverted_pendulum?backend=spring", lambda: jes.MLPPolicy((16,)), 950.0, 100,
                               dict(num_members=64, noise_std=0.1, learning_rate=0.03, eval_episodes=16)),
    # Threshold 5: uniformly random actions score about 0.5, a scripted ball tracker 84 (--breakout-baselines);
    # sigma 0.05 because full rank at the default 0.2 stays on an early plateau (1.4-1.7) for 300 generations.
    "minatar-breakout": ("Breakout-MinAtar", lambda: MinAtarCNN(hidden=64), 5.0, 150,
                         dict(num_members=256, episodes_per_member=4, noise_std=0.05, learning_rate=0.01,
                              eval_episodes=32, max_episode_steps=1000)),
}
PERTURBATIONS = {"full rank": jes.FullRank(), "r=1": jes.LowRank(1), "r=4": jes.LowRank(4)}


def breakout_baselines(seeds: list[int], episodes: int = 64, steps: int = 1000) -> None:
    """Breakout-MinAtar's mean return per seed (``episodes`` episodes, keys from the seed) of uniformly random
    actions and of a scripted tracker that moves the paddle (channel 0) towards the ball's column (channel 1)."""
    import gymnax
    import jax
    import jax.numpy as jnp

    env, params = gymnax.make("Breakout-MinAtar")

    def track(obs, _):
        paddle, ball = jnp.argmax(obs[..., 0].sum(0)), jnp.argmax(obs[..., 1].sum(0))
        return jnp.where(ball < paddle, 1, jnp.where(ball > paddle, 2, 0))  # actions: no-op, left, right

    def uniform(_, key):
        return jax.random.randint(key, (), 0, env.num_actions)

    def episode(policy, key):
        key, reset_key = jax.random.split(key)
        obs, state = env.reset(reset_key, params)

        def step(carry, _):
            obs, state, key, ret, done = carry
            key, act_key, step_key = jax.random.split(key, 3)
            obs, state, reward, now_done, _ = env.step(step_key, state, policy(obs, act_key), params)[:5]
            return (obs, state, key, ret + reward * (1 - done), jnp.maximum(done, now_done)), None

        carry = (obs, state, key, jnp.float32(0), jnp.float32(0))
        return jax.lax.scan(step, carry, None, steps)[0][3]

    for name, policy in (("uniformly random actions", uniform), ("scripted ball tracker", track)):
        play = jax.jit(jax.vmap(lambda key: episode(policy, key)))
        means = [float(play(jax.random.split(jax.random.key(seed), episodes)).mean()) for seed in seeds]
        print(f"{name}: mean return over {episodes} episodes, seeds {seeds}: " + ", ".join(f"{m:.2f}" for m in means))


SEED_LINE = re.compile(r"^\s*(?P<cell>\S+) (?P<label>.+) seed (?P<seed>\d+): solved at (?P<gen>\d+|None), "
                       r"centre (?P<centre>[^\s,]+)")


def read_seed_lines(paths: list[str], centres: dict | None = None) -> dict:
    """``{(cell, perturbation): {seed: generations to solve or None}}`` from this script's printed output; with
    ``centres``, also each seed's final centre return as printed (one decimal) into it, keyed alike."""
    runs: dict = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                m = SEED_LINE.match(line)
                if m:
                    gen = None if m["gen"] == "None" else int(m["gen"])
                    seeds = runs.setdefault((m["cell"], m["label"]), {})
                    if seeds.get(int(m["seed"]), gen) != gen:
                        raise SystemExit(f"--stats: {m['cell']} {m['label']} seed {m['seed']} appears twice with "
                                         f"other results ({seeds[int(m['seed'])]} and {gen}; last in {path}): runs "
                                         f"of other settings or code? Give --stats one run per seed")
                    seeds[int(m["seed"])] = gen
                    if centres is not None:
                        centres.setdefault((m["cell"], m["label"]), {})[int(m["seed"])] = float(m["centre"])
    if not runs:
        raise SystemExit(f"--stats: no per-seed lines ('<cell> <perturbation> seed N: solved at ...') in {paths}")
    return runs


def median_ratio(mine: np.ndarray, full: np.ndarray) -> float:
    """Median generations to solve over the seeds ``mine`` solved, over the same of ``full`` (nan: none solved)."""
    mine, full = mine[~np.isnan(mine)], full[~np.isnan(full)]
    return float(np.median(mine) / np.median(full)) if len(mine) and len(full) else float("nan")


def stats(paths: list[str], draws: int = 5000, level: float = 0.90) -> None:
    """Each perturbation against full rank per cell, over the seeds both ran (see the module docstring)."""
    from scipy.stats import binomtest, fisher_exact

    centres: dict = {}
    runs = read_seed_lines(paths, centres)
    # Each perturbation over all its seeds, as a run prints it (several files: one table for their seeds together)
    print("each perturbation over the seeds read (final centre return: mean +- std of the seed lines' one-decimal "
          "values)")
    print("| cell | perturbation | seeds | solved | generations to solve, median (range) | final centre return |")
    print("|---|---|---|---|---|---|")
    for (cell, label), seeds in runs.items():
        ok = [g for g in seeds.values() if g is not None]
        finals = list(centres[cell, label].values())
        order = sorted(seeds)
        span = f"{order[0]}-{order[-1]}" if order == list(range(order[0], order[-1] + 1)) else f"{len(order)} seeds"
        print(f"| {cell} | {label} | {span} | {len(ok)}/{len(seeds)} | "
              f"{f'{np.median(ok):g} ({min(ok)}-{max(ok)})' if ok else '-'} | "
              f"{np.mean(finals):.1f} +- {np.std(finals):.1f} |")
    print()
    print(f"low rank against full rank over the seeds both ran; bootstrap: {draws} draws of the seeds, "
          f"{level:.0%} interval, numpy default_rng(0)")
    print("| cell | perturbation | seeds | solved (full rank) | Fisher p | only this / only full rank solved: McNemar p | median gens (full rank) | ratio of medians "
          f"[{level:.0%} interval] | per-seed ratio, median (seeds both solved) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (cell, label), mine in runs.items():
        full = runs.get((cell, "full rank"))
        if label == "full rank" or full is None:
            continue
        seeds = sorted(set(mine) & set(full))
        if not seeds:
            print(f"| {cell} | {label} | no seeds in common with full rank | | | | | | |")
            continue
        a = np.array([np.nan if mine[s] is None else mine[s] for s in seeds], float)
        b = np.array([np.nan if full[s] is None else full[s] for s in seeds], float)
        solved_a, solved_b, n = int((~np.isnan(a)).sum()), int((~np.isnan(b)).sum()), len(seeds)
        p = fisher_exact([[solved_a, n - solved_a], [solved_b, n - solved_b]])[1]
        only_a = int((~np.isnan(a) & np.isnan(b)).sum())  # seeds this perturbation solved and full rank did not
        only_b = int((np.isnan(a) & ~np.isnan(b)).sum())
        paired = (f"{only_a} / {only_b}: {binomtest(only_a, only_a + only_b, 0.5).pvalue:.2f}" if only_a + only_b
                  else "0 / 0: -")
        rng = np.random.default_rng(0)
        boot = np.array([median_ratio(a[i], b[i]) for i in (rng.integers(0, n, n) for _ in range(draws))])
        unsolved = int(np.isnan(boot).sum())  # draws where one side solved none of its resampled seeds
        if solved_a and solved_b:
            low, high = np.nanquantile(boot, [(1 - level) / 2, (1 + level) / 2])
            interval = f"[{low:.2f}, {high:.2f}]" + (f", {unsolved} draws left out: a side solved none" if unsolved else "")
        else:
            interval = "[-]"
        both = ~np.isnan(a) & ~np.isnan(b)
        per_seed = f"{np.median(a[both] / b[both]):.2f} ({int(both.sum())})" if both.any() else "-"
        medians = (f"{np.nanmedian(a):g} ({np.nanmedian(b):g})" if solved_a and solved_b else "-")
        span = f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else f"{n} seeds"
        print(f"| {cell} | {label} | {span} | {solved_a}/{n} ({solved_b}/{n}) | {p:.2f} | {paired} | {medians} | "
              f"{median_ratio(a, b):.2f} {interval} | {per_seed} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", default="cartpole-gru,cartpole-mlp64,pendulum-32,pendulum-256",
                        help="comma-separated, of: " + ", ".join(CELLS))
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--perturbations", default=",".join(PERTURBATIONS),
                        help="comma-separated, of: " + ", ".join(PERTURBATIONS) + ' (quote "full rank")')
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a cell's ESConfig field (e.g. --set noise_std=0.1, --set num_generations=300); "
                             "repeatable; the perturbation comes from --perturbations")
    parser.add_argument("--breakout-baselines", action="store_true",
                        help="print Breakout-MinAtar's returns of random and scripted play over --seeds, then stop")
    parser.add_argument("--stats", nargs="+", metavar="OUTPUT",
                        help="compare with full rank from this script's saved output (see above), then stop")
    args = parser.parse_args()
    print_provenance()
    if args.stats:
        return stats(args.stats)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.breakout_baselines:
        return breakout_baselines(seeds)
    overrides = {}
    for item in args.set:
        field, _, value = item.partition("=")
        if field in ("perturbation", "perturbation_rank"):
            parser.error(f"--set {item!r}: give the perturbations as --perturbations, of: {', '.join(PERTURBATIONS)}")
        try:
            overrides[field] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            field = None
        if field not in jes.ESConfig.__dataclass_fields__:
            parser.error(f"--set {item!r}: expected FIELD=VALUE with an ESConfig field and a Python literal")
    cells, labels = args.cells.split(","), args.perturbations.split(",")
    for flag, names, known in (("--cells", cells, CELLS), ("--perturbations", labels, PERTURBATIONS)):
        unknown = [name for name in names if name not in known]
        if unknown:
            parser.error(f"{flag}: unknown {', '.join(map(repr, unknown))}; known: {', '.join(map(repr, known))}")
    rows = []
    for cell in cells:
        env, make_policy, threshold, generations, extra = CELLS[cell]
        extra = {"num_generations": generations, "stop_at_return": threshold, **extra, **overrides}
        for label in labels:
            config = jes.ESConfig(perturbation=PERTURBATIONS[label], **extra)
            trainer = jes.Trainer(make_policy(), env, "adam", config)
            solved, finals, started = [], [], time.perf_counter()
            for seed in seeds:
                result = run(trainer, trainer.init_state(seed), key=seed)
                solved.append(result.solved_generation)
                finals.append(result.final_centre_return)
                print(f"  {cell} {label} seed {seed}: solved at {result.solved_generation}, centre "
                      f"{result.final_centre_return:.1f}", flush=True)
            ok = [g for g in solved if g is not None]
            rows.append((cell, trainer.num_params, label, f"{len(ok)}/{len(seeds)}",
                         f"{np.median(ok):g} ({min(ok)}-{max(ok)})" if ok else "-",
                         f"{np.mean(finals):.1f} +- {np.std(finals):.1f}", f"{time.perf_counter() - started:.0f}"))
    print(f"\nseeds {seeds}; adam, ESConfig defaults unless the cell sets them; threshold on the centre's mean return"
          + (f"; overridden: {overrides}" if overrides else ""))
    print("| cell | P | perturbation | solved | generations to solve, median (range) | final centre return | wall s |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(v) for v in row) + " |")


if __name__ == "__main__":
    main()
    print_load()
