"""``python -m jes``: train the reference GRU on CartPole-v1 until solved and print the result.

Exit status 0 when the centre policy solved CartPole (a centre return >= 475), 1 when it did not within
``--generations``, 2 for a bad argument. ``python -m jes train ...`` (or eval, sweep, plot, keys, launch) runs that
command of the ``jes`` command line instead, as ``jes train ...`` does."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from jes.cli import COMMANDS

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in COMMANDS:  # the jes command line, where no console script is on PATH
        from jes.cli import main as jes_main

        return jes_main(argv)
    parser = argparse.ArgumentParser(prog="python -m jes", description=__doc__)
    parser.add_argument("--optimizer", default="adam",
                        help="adam, adabelief, amsgrad, clipup, novograd, radam or sgd (jes train has more options)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--generations", type=int, default=25)
    args = parser.parse_args(argv)

    import numpy as np

    import jes
    from jes import strategies
    from jes.optimizers import optimizer_names, resolve_name

    # jes.train's own advice (strategy=..., an optax object) is for Python: this command takes a name alone
    if strategies.canonical_name(args.optimizer):
        print(f"python -m jes: --optimizer {args.optimizer}: {args.optimizer!r} is a strategy, not an optimizer; this "
              f"quickstart trains OpenAI-ES with an optimizer (adam, ...): for {args.optimizer}, run jes train "
              f"--strategy {args.optimizer}", file=sys.stderr)
        return 2
    try:
        resolve_name(args.optimizer)
    except ValueError:
        print(f"python -m jes: --optimizer {args.optimizer}: unknown optimizer; python -m jes takes "
              f"{', '.join(optimizer_names())}", file=sys.stderr)
        return 2
    from jes.compilation_cache import enable_compilation_cache
    from jes.cpu import use_cpu_cores

    use_cpu_cores()  # one CPU device per core: same result, faster generations
    enable_compilation_cache()
    try:
        result = jes.train(
            jes.GRUPolicy(hidden=5, layers=2), "CartPole-v1", args.optimizer,
            key=args.seed, num_generations=args.generations, stop_at_return=475.0,
        )
    except ValueError as err:  # --generations 0, --optimizer bogus: one line, as jes train gives it
        print(f"python -m jes: {str(err).replace('num_generations', '--generations')}", file=sys.stderr)
        return 2
    if sys.stdout.isatty():  # the progress bar is gone: the generations as a table (elsewhere a line each was printed)
        for gen, mean, best, centre in zip(result.history["generation"], result.history["pop_mean"],
                                           result.history["pop_max"], result.history["centre_return"]):
            print(f"generation {gen:3d}  population mean {mean:6.1f}  max {best:6.1f}  centre {centre:6.1f}")
    score = float(np.mean(result.evaluate(num_episodes=100)))
    print(result.summary())
    print(f"centre policy over 100 fresh episodes: {score:.1f} (solved is >= 475)")
    return 0 if result.solved_generation else 1


if __name__ == "__main__":
    sys.exit(main())
