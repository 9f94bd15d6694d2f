"""The ``jes`` command: ``jes train``, ``jes eval CHECKPOINT``, ``jes sweep CONFIG``, ``jes plot RUN_DIR...``.

Examples::

    jes train --env CartPole-v1 --policy gru --hidden 5 --layers 2 --optimizer novograd --population 256
    jes train --resume runs/<name>/checkpoint.ckpt        # same flags as the interrupted run
    jes eval runs/<name>/checkpoint.ckpt --episodes 100
    jes eval runs/<name>/checkpoint.ckpt --render cartpole.gif     # brax envs: --render hopper.html
    jes plot runs/run-a runs/run-b -o curves.png
    jes sweep sweep.toml
"""
from __future__ import annotations

import argparse
import inspect
import math
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jes", description="JAX-accelerated Evolution Strategies.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{train,eval,sweep,plot,keys}")

    train = commands.add_parser("train", help="train a policy with an evolution strategy",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    train.add_argument("--env", default="CartPole-v1", help="gymnax id, 'brax/<name>[?backend=...]', either with '?keep_obs=0,2' to hide observations")
    train.add_argument("--policy", choices=("gru", "mlp"), default="gru", help="policy architecture")
    train.add_argument("--hidden", type=int, default=5, help="hidden units per layer")
    train.add_argument("--layers", type=int, default=2, help="number of GRU (or MLP hidden) layers")
    train.add_argument("--strategy", default="openai_es", help="openai_es, pgpe, snes, sep_cma_es or ars")
    train.add_argument("--optimizer", default=None,
                       help="adam, adabelief, novograd, radam, amsgrad, sgd or clipup, for openai_es and pgpe "
                            "(default: adam for openai_es, clipup for pgpe)")
    train.add_argument("--population", type=int, default=None, help="population size (ESConfig.num_members)")
    train.add_argument("--generations", type=int, default=None, help="generations to run")
    train.add_argument("--learning-rate", type=float, default=None, help="optimizer step size (default: per optimizer)")
    train.add_argument("--noise-std", type=float, default=None, help="perturbation std sigma")
    train.add_argument("--episodes-per-member", type=int, default=None)
    train.add_argument("--eval-every", type=int, default=None, help="evaluate the centre every N generations")
    train.add_argument("--eval-episodes", type=int, default=None, help="episodes per centre evaluation")
    train.add_argument("--chunk-size", type=int, default=None, help="members per compiled chunk")
    train.add_argument("--max-episode-steps", type=int, default=None)
    train.add_argument("--stop-at-return", type=float, default=None, help="stop once the centre reaches this return")
    train.add_argument("--no-normalize-observations", action="store_true", help="turn off observation normalisation")
    train.add_argument("--seed", type=int, default=0, help="run key seed")
    train.add_argument("--log-dir", default="runs/<auto>",
                       help="TensorBoard directory (default runs/<env>-<policy>-<optimizer>-<time>); 'none' turns it off")
    train.add_argument("--checkpoint", default=None,
                       help="checkpoint file (default: checkpoint.ckpt in the log dir, or the --resume file); 'none' turns it off")
    train.add_argument("--checkpoint-every", type=int, default=10, help="generations between checkpoints")
    train.add_argument("--resume", default=None, help="continue from this checkpoint (give the run's original flags)")
    train.add_argument("--devices", type=int, default=None, help="number of local devices to use (default: all)")
    train.add_argument("--listen", default=None, metavar="HOST:PORT", help="be a distributed master listening here")
    train.add_argument("--secret-file", default=None,
                       help="file holding the shared secret workers authenticate with (default: $JES_SECRET)")
    timing = train.add_argument_group(
        "distributed master options (with --listen; passed to jes.train(master_options=...) and "
        "jes.distributed.master.Master)")
    timing.add_argument("--heartbeat-interval", type=float, default=None, metavar="S",
                        help="seconds between worker heartbeats (Master default 1)")
    timing.add_argument("--worker-timeout", type=float, default=None, metavar="S",
                        help="a worker silent this long is dropped and its range re-queued (Master default 10)")
    timing.add_argument("--first-range-timeout", type=float, default=None, metavar="S",
                        help="deadline of a worker's first range, before its speed is known (Master default 60)")
    timing.add_argument("--min-range-deadline", type=float, default=None, metavar="S",
                        help="shortest deadline of later ranges, which get 4x their expected time (Master default 5)")
    timing.add_argument("--range-seconds", type=float, default=None, metavar="S",
                        help="about this much work per range at a worker's measured speed (Master default 1)")
    timing.add_argument("--max-range-chunks", type=int, default=None, metavar="N",
                        help="most chunks in one range (Master default: no cap)")
    timing.add_argument("--audit", type=float, default=None, metavar="FRACTION",
                        help="re-evaluate this fraction of delivered ranges on another worker and compare bit for bit "
                             "(Master default 0: off)")
    timing.add_argument("--curve-secret-key", default=None, metavar="FILE",
                        help="encrypt with ZeroMQ CURVE using this secret key (NAME.secret from `jes keys NAME`); "
                             "workers pass --curve-server-key NAME.public")
    progress = train.add_mutually_exclusive_group()
    progress.add_argument("--progress", dest="progress", action="store_true", default=None, help="always show the progress bar")
    progress.add_argument("--no-progress", dest="progress", action="store_false", help="never show the progress bar")

    evaluate = commands.add_parser("eval", help="evaluate a checkpoint's centre policy",
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    evaluate.add_argument("checkpoint", help="a checkpoint file written by jes train")
    evaluate.add_argument("--episodes", type=int, default=100, help="fresh episodes to average")
    evaluate.add_argument("--seed", type=int, default=12345, help="key of the evaluation episodes")
    evaluate.add_argument("--render", default=None, metavar="PATH",
                          help="also draw one episode: a .gif for gymnax CartPole/Pendulum, a .html for brax envs")
    evaluate.add_argument("--render-steps", type=int, default=None, help="steps to draw at most (default: the episode limit)")

    plot = commands.add_parser("plot", help="draw learning curves of runs from their TensorBoard logs into a PNG",
                               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    plot.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="TensorBoard run directories written by jes train")
    plot.add_argument("-o", "--output", default="curves.png", help="PNG file to write")
    plot.add_argument("--labels", default=None, help="comma-separated legend labels (default: directory names)")

    sweep = commands.add_parser("sweep", help="grid search described by a JSON or TOML file")
    sweep.add_argument("config", help="sweep file (.json or .toml); see jes.sweep.load_sweep_file")
    sweep.add_argument("--out-dir", default=None, help="where sweep.csv/sweep.json go (overrides the file)")
    sweep.add_argument("--no-vmap", action="store_true", help="run seeds one after another instead of vmapped")

    keys = commands.add_parser("keys", help="make a CURVE key pair for an encrypted distributed master")
    keys.add_argument("name", help="writes NAME.secret (the master's, mode 600) and NAME.public (for workers)")
    return parser


def _none(value: str | None) -> str | None:
    return None if value is not None and value.lower() == "none" else value


def _train(args: argparse.Namespace) -> int:
    import jes
    from jes.sweep import build_policy

    overrides = {
        name: value for name, value in (
            ("num_members", args.population), ("num_generations", args.generations),
            ("learning_rate", args.learning_rate), ("noise_std", args.noise_std),
            ("episodes_per_member", args.episodes_per_member), ("eval_every", args.eval_every),
            ("eval_episodes", args.eval_episodes), ("chunk_size", args.chunk_size),
            ("max_episode_steps", args.max_episode_steps), ("stop_at_return", args.stop_at_return),
        ) if value is not None
    }
    if args.no_normalize_observations:
        overrides["normalize_observations"] = False
    kwargs = dict(key=args.seed, devices=args.devices, log_dir=_none(args.log_dir), progress=args.progress,
                  checkpoint_every=args.checkpoint_every, resume=args.resume, **overrides)
    if args.checkpoint is not None:
        kwargs["checkpoint_path"] = _none(args.checkpoint)
    if args.listen is not None or args.secret_file is not None:
        accepted = inspect.signature(jes.train).parameters
        if "master" not in accepted or "secret" not in accepted:
            print("jes train: --listen/--secret-file need distributed training (jes.train(master=..., secret=...)), "
                  "which this installation of jes does not have; run without them", file=sys.stderr)
            return 2
        if args.listen is None:
            print("jes train: --secret-file is for a distributed master; add --listen HOST:PORT", file=sys.stderr)
            return 2
        from jes.distributed.protocol import load_secret  # same reading rules as jes-worker --secret-file

        # No --secret-file: secret=None makes jes.train read the JES_SECRET environment variable.
        secret = load_secret(secret_file=args.secret_file) if args.secret_file is not None else None
        kwargs.update(master=args.listen, secret=secret)
    master_options = {name: value for name, value in (
        ("heartbeat_interval", args.heartbeat_interval), ("worker_timeout", args.worker_timeout),
        ("assign_timeout", args.first_range_timeout), ("min_deadline", args.min_range_deadline),
        ("target_range_seconds", args.range_seconds), ("max_range_chunks", args.max_range_chunks),
        ("curve_secret_key", args.curve_secret_key), ("audit", args.audit),
    ) if value is not None}
    if master_options:
        if args.listen is None:
            print("jes train: the distributed timing flags are for a master; add --listen HOST:PORT", file=sys.stderr)
            return 2
        if "master_options" not in inspect.signature(jes.train).parameters:
            print("jes train: this jes.train takes no master_options; run without the distributed timing flags",
                  file=sys.stderr)
            return 2
        kwargs["master_options"] = master_options

    policy = build_policy({"type": args.policy, "hidden": args.hidden, "layers": args.layers})
    result = jes.train(policy, args.env, args.optimizer, strategy=args.strategy, **kwargs)
    print(result.summary())
    return 0


def _eval(args: argparse.Namespace) -> int:
    import jax
    import numpy as np

    from jes import checkpoint
    from jes.generation import as_key

    trainer, state, ckpt = checkpoint.load(args.checkpoint)
    returns, _ = jax.jit(trainer.evaluate_centre, static_argnums=1)(state, args.episodes, as_key(args.seed))
    returns = np.asarray(returns)
    print(f"{args.checkpoint}: {ckpt.env_name}, {type(trainer.policy).__name__}, {ckpt.optimizer}, generation "
          f"{ckpt.generation}: centre return {returns.mean():.2f} +/- {returns.std():.2f} over {args.episodes} episodes")
    if args.render is not None:
        from jes.render import render

        render(trainer, state, args.render, as_key(args.seed), args.render_steps)
        print(f"rendered one episode to {args.render}")
    return 0


def _plot(args: argparse.Namespace) -> int:
    from jes.plot import plot_runs

    labels = args.labels.split(",") if args.labels else None
    if labels is not None and len(labels) != len(args.run_dirs):
        raise ValueError(f"--labels has {len(labels)} names for {len(args.run_dirs)} run directories")
    print(f"learning curves of {len(args.run_dirs)} run(s) written to {plot_runs(args.run_dirs, args.output, labels)}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from jes.sweep import load_sweep_file, sweep

    kwargs = load_sweep_file(args.config)
    if args.out_dir is not None:
        kwargs["out_dir"] = args.out_dir
    result = sweep(**kwargs, vmap=not args.no_vmap)
    keys = [k for k in result.rows[0] if k in kwargs["grid"]]
    for row in result.rows:
        values = ", ".join(f"{k}={row[k]}" for k in keys) or "base"
        score = row["final_centre_return_mean"]
        print(f"{values}: final centre return {score:.1f} +/- {row['final_centre_return_std']:.1f}"
              if math.isfinite(score) else f"{values}: no centre evaluation")
    print(f"table: {result.csv_path} and {result.json_path}")
    return 0


def _keys(args: argparse.Namespace) -> int:
    import os

    from jes.distributed.protocol import curve_keypair

    public, secret = curve_keypair()
    public_path, secret_path = f"{args.name}.public", f"{args.name}.secret"
    for path in (public_path, secret_path):
        if os.path.exists(path):
            print(f"jes keys: {path} exists; not overwriting it", file=sys.stderr)
            return 2
    fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    with open(public_path, "w") as f:
        f.write(public + "\n")
    print(f"master:  jes train --listen HOST:PORT --curve-secret-key {secret_path} ...  (keep it private)\n"
          f"workers: jes-worker --master HOST:PORT --curve-server-key {public_path} ...  (copy it to them)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``jes`` console script."""
    args = _parser().parse_args(argv)
    if args.command == "keys":
        return _keys(args)  # needs no JAX
    from jes.compilation_cache import enable_compilation_cache
    from jes.cpu import use_cpu_cores

    use_cpu_cores()  # one CPU device per core (results are identical for any device count)
    enable_compilation_cache()
    handler = {"train": _train, "eval": _eval, "sweep": _sweep, "plot": _plot}[args.command]
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("\ninterrupted (jes train saved a checkpoint unless --checkpoint none; continue with --resume)",
              file=sys.stderr)
        return 130
    except (FileNotFoundError, ValueError, ImportError) as err:
        print(f"jes {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
