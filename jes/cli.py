"""The ``jes`` command: ``jes train``, ``jes eval CHECKPOINT``, ``jes sweep CONFIG``, ``jes plot RUN_DIR...``, ``jes keys NAME``.

Only argparse is imported until a command runs, so ``jes --help`` answers at once.
"""
from __future__ import annotations

import argparse
import ast
import inspect
import math
import os
import re
import signal
import sys
import tempfile
import traceback
import warnings
from typing import Any

EPILOG = """examples:
  jes train --env CartPole-v1 --policy gru --hidden 5 --layers 2 --optimizer novograd --population 256
  jes train --policy mypkg.policies:MyPolicy --policy-arg features=16 --policy-arg depth=2
  jes train --resume runs/<name>/checkpoint.ckpt          # continues with the flags stored in the checkpoint
  jes train --resume runs/<name>/checkpoint.ckpt --generations 100
  jes eval runs/<name>/checkpoint.ckpt --episodes 100
  jes eval runs/<name>/checkpoint.ckpt --render cartpole.gif     # brax envs: --render hopper.html
  jes eval centre.policy --render cartpole.gif                   # a saved policy file draws the same episode
  jes plot runs/run-a runs/run-b -o curves.png
  jes sweep sweep.toml
  jes keys trainhost                                      # a master's own CURVE key pair

exit status (train, eval, sweep, plot):
  0    done
  1    jes sweep: the table is written, but some runs failed (their rows say status failed, the reason in error)
  2    an error stopped the command: a bad argument or file, a refused run, a run stopped midway (jes train
       keeps it in its checkpoint), or an unexpected error (its traceback is printed first)
  130  interrupted (Ctrl-C); 143: terminated (SIGTERM); jes train saves its checkpoint on both
"""

# ESConfig's defaults, spelled out so that --help needs no import of jes.config (and so JAX);
# tests/test_cli.py checks they match.
CONFIG_DEFAULTS = {"num_members": 512, "num_generations": 25, "noise_std": 0.2, "episodes_per_member": 1,
                   "eval_every": 1, "eval_episodes": 64, "weight_decay": 0.0, "fitness_shaping": "centered_ranks"}
# flag dest -> ESConfig field
CONFIG_FLAGS = {
    "population": "num_members", "generations": "num_generations", "learning_rate": "learning_rate",
    "noise_std": "noise_std", "episodes_per_member": "episodes_per_member", "eval_every": "eval_every",
    "eval_episodes": "eval_episodes", "chunk_size": "chunk_size", "max_episode_steps": "max_episode_steps",
    "stop_at_return": "stop_at_return", "weight_decay": "weight_decay", "fitness_shaping": "fitness_shaping",
    "perturbation": "perturbation", "rank": "perturbation_rank",
}


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Adds "(default: X)" to a flag's help unless the help already says its default or there is none."""

    def _get_help_string(self, action):
        text = action.help or ""
        if ("default" in text or action.default in (None, argparse.SUPPRESS, []) or not action.option_strings
                or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))):
            return text
        return f"{text} (default: %(default)s)"


# The subcommands, in the order --help lists them (``python -m jes COMMAND ...`` runs them too: jes/__main__.py)
COMMANDS = ("train", "eval", "sweep", "plot", "keys", "launch")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jes", description="JAX-accelerated Evolution Strategies.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    from jes import __version__  # (jes.__version__ as a flag too, as pip's and pytest's: a trial)

    parser.add_argument("--version", action="version", version=f"jes {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")

    d = CONFIG_DEFAULTS
    train = commands.add_parser("train", help="train a policy with an evolution strategy", epilog=EPILOG,
                                formatter_class=_HelpFormatter)
    train.add_argument("--env", default=None,
                       help="gymnax id, 'brax/<name>[?backend=...]', either with '?keep_obs=0,2' to hide observations, "
                            "or 'gymnasium:<id>' (a Python simulator, stepped on the host) (default: CartPole-v1)")
    train.add_argument("--policy", default=None, metavar="{gru,mlp,MODULE:CLASS}",
                       help="policy: gru, mlp, or your own flax.linen.Module as module.path:ClassName, importable "
                            "from the current directory or PYTHONPATH (default: gru)")
    train.add_argument("--allow-module", action="append", default=[], metavar="MODULE",
                       help="with --resume: a module the checkpoint's policy may come from besides jes/flax "
                            "(repeatable; --policy MODULE:CLASS allows its module too)")
    train.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                       help="import this module of your own first (repeatable), e.g. one that registers your "
                            "Gymnasium env id with gymnasium.register, for --env 'gymnasium:<your id>' (local "
                            "--workers import the module behind the id themselves; remote ones: jes-worker --import)")
    train.add_argument("--policy-arg", action="append", default=[], metavar="KEY=VALUE",
                       help="a field of the policy, repeatable (e.g. --policy-arg features=16); values are Python "
                            "literals (16, 0.5, True, (32, 32)) or else strings")
    train.add_argument("--hidden", type=int, default=None, help="hidden units per layer of gru/mlp (default: 5)")
    train.add_argument("--layers", type=int, default=None,
                       help="GRU (or MLP hidden) layers of gru/mlp; --policy mlp --layers 0: a linear policy (default: 2)")
    train.add_argument("--strategy", default=None, help="openai_es, pgpe, snes, sep_cma_es, ars or cma_es (default: openai_es)")
    train.add_argument("--optimizer", default=None,
                       help="adam, adabelief, novograd, radam, amsgrad, sgd or clipup, for openai_es and pgpe "
                            "(default: adam for openai_es, clipup for pgpe)")
    train.add_argument("--population", type=int, default=None,
                       help=f"population size, ESConfig.num_members (default: {d['num_members']})")
    train.add_argument("--generations", type=int, default=None, help=f"generations to run (default: {d['num_generations']})")
    train.add_argument("--learning-rate", type=float, default=None,
                       help="optimizer step size (default: per optimizer: adam 0.2, novograd 1.5, radam 0.8, sgd 1.0, ...)")
    train.add_argument("--noise-std", type=float, default=None, help=f"perturbation std sigma (default: {d['noise_std']})")
    train.add_argument("--episodes-per-member", type=int, default=None,
                       help=f"episodes averaged into each member's fitness (default: {d['episodes_per_member']})")
    train.add_argument("--fitness-shaping", choices=("centered_ranks", "nes_utilities", "z_score", "raw"), default=None,
                       help=f"how fitness becomes weights (default: {d['fitness_shaping']})")
    train.add_argument("--weight-decay", type=float, default=None, help=f"L2 coefficient (default: {d['weight_decay']})")
    train.add_argument("--perturbation", choices=("full_rank", "low_rank"), default=None,
                       help="shape of each member's perturbation: dense noise, or a rank-r product per weight matrix "
                            "(EGGROLL; batch-inference speed for large policies; openai_es and ars) (default: full_rank)")
    train.add_argument("--rank", type=int, default=None, help="rank r of --perturbation low_rank (default: 1)")
    train.add_argument("--no-antithetic", action="store_true",
                       help="independent perturbations instead of mirrored pairs (allows an odd --population)")
    train.add_argument("--eval-every", type=int, default=None,
                       help=f"evaluate the centre every N generations (default: {d['eval_every']})")
    train.add_argument("--eval-episodes", type=int, default=None,
                       help=f"episodes per centre evaluation (default: {d['eval_episodes']})")
    train.add_argument("--chunk-size", type=int, default=None,
                       help="members per compiled chunk (default: min(256, population); low rank: up to 2,048, fewer for "
                            "large policies)")
    train.add_argument("--max-episode-steps", type=int, default=None, help="episode length limit (default: the env's own)")
    train.add_argument("--stop-at-return", type=_float_or_none, default=None, metavar="RETURN",
                       help="stop once the centre reaches this return; 'none' clears a resumed run's (default: run "
                            "every generation)")
    train.add_argument("--no-normalize-observations", action="store_true", help="turn off observation normalisation")
    train.add_argument("--seed", type=int, default=0, help="run key seed (ignored with --resume: the key is in the checkpoint)")
    train.add_argument("--log-dir", default="runs/<auto>",
                       help="TensorBoard directory (default: runs/<env>-<policy>-<optimizer>-<time>); 'none' turns it "
                            "off, and with it the default checkpoint, which goes in the log dir (keep one with "
                            "--checkpoint PATH)")
    train.add_argument("--checkpoint", default=None,
                       help="checkpoint file (default: checkpoint.ckpt in the log dir, or the --resume file; none with "
                            "--log-dir none); 'none' turns it off")
    train.add_argument("--checkpoint-every", type=int, default=10, help="generations between checkpoints")
    train.add_argument("--save-policy", default=None, metavar="PATH",
                       help="when the run ends, also write its final centre to PATH as a policy file (for jes eval PATH "
                            "and jes.load_policy: loading one runs no code of the file's)")
    train.add_argument("--resume", default=None, nargs="?", const=True, metavar="CHECKPOINT",
                       help="continue from this checkpoint with the policy, env, strategy, optimizer and config stored in "
                            "it; flags may change --generations, --stop-at-return, --eval-every, --eval-episodes and "
                            "(with a warning) --learning-rate; other changes are refused. Without a file: the run's "
                            "own checkpoint (--checkpoint, or the one in --log-dir) if it is there, else a fresh run: "
                            "one command line for a batch job's first start and its requeues")
    train.add_argument("--devices", type=int, default=None, help="number of local devices to use (default: all)")
    train.add_argument("--listen", default=None, metavar="HOST:PORT", help="be a distributed master listening here")
    train.add_argument("--workers", type=int, default=0, metavar="N",
                       help="local jes-worker processes sharing the population, e.g. for a Python (Gymnasium) env: "
                            "--env gymnasium:CartPole-v1 --workers 2; any env works (default 0: this process alone; "
                            "results are the same bits)")
    train.add_argument("--distributed", action="store_true",
                       help="one run over all processes of a jax.distributed runtime (start them with jes launch, "
                            "srun, or on every host of a TPU pod)")
    train.add_argument("--secret-file", default=None,
                       help="file holding the shared secret workers authenticate with (default: $JES_SECRET)")
    progress = train.add_mutually_exclusive_group()
    progress.add_argument("--progress", dest="progress", action="store_true", default=None,
                          help="always show the progress bar (default: a bar on a terminal, else a line per generation)")
    progress.add_argument("--no-progress", dest="progress", action="store_false", help="print no progress at all")

    timing = train.add_argument_group(
        "distributed master options (with --listen or --workers; passed to jes.train(master_options=...) and "
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
                        help="the master's own CURVE secret key (NAME.secret from `jes keys NAME`), so that a worker "
                             "holding the shared secret cannot pose as the master; workers pass --curve-server-key "
                             "NAME.public (without it every connection is still CURVE-encrypted, keys from the secret)")

    evaluate = commands.add_parser("eval", help="evaluate a checkpoint's centre policy or a saved policy file",
                                   formatter_class=_HelpFormatter)
    evaluate.add_argument("checkpoint", metavar="FILE",
                          help="a checkpoint written by jes train, or a policy file written by TrainResult.save_policy "
                               "(the same episodes as its training's centre evaluation)")
    evaluate.add_argument("--episodes", type=int, default=100, help="fresh episodes to average")
    evaluate.add_argument("--seed", type=int, default=12345, help="key of the evaluation episodes")
    evaluate.add_argument("--render", default=None, metavar="PATH",
                          help="also draw one episode of the policy (a checkpoint's centre, or a policy file's): a .gif "
                               "for gymnax CartPole/Pendulum and Gymnasium envs (their rgb_array frames), a .html for "
                               "brax envs")
    evaluate.add_argument("--render-steps", type=int, default=None, help="steps to draw at most (default: the episode limit)")
    evaluate.add_argument("--save-policy", default=None, metavar="PATH",
                          help="also write the checkpoint's centre to PATH as a policy file (for jes eval PATH and "
                               "jes.load_policy: loading one runs no code of the file's)")
    evaluate.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                          help="import this module of your own first (repeatable), e.g. one that registers the "
                               "Gymnasium env id the run used")
    evaluate.add_argument("--allow-module", action="append", default=[], metavar="MODULE",
                          help="a module the checkpoint's policy may come from besides jes/flax (repeatable); "
                               "a checkpoint never imports a module on its own say-so")

    plot = commands.add_parser("plot", help="draw learning curves of runs from their TensorBoard logs into a PNG",
                               formatter_class=_HelpFormatter)
    plot.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="TensorBoard run directories written by jes train")
    plot.add_argument("-o", "--output", default="curves.png", help="PNG file to write")
    plot.add_argument("--labels", default=None, help="comma-separated legend labels (default: directory names, with the folders above them where two share a name)")

    sweep = commands.add_parser(
        "sweep", help="grid search described by a JSON or TOML file",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit status:\n"
               "  0    every run completed (or a callback stopped it)\n"
               "  1    some runs failed: the table is written; their rows say status failed, the reason in error\n"
               "  2    an error stopped the sweep (its traceback first when unexpected); the finished configurations'\n"
               "       rows are written, with sweep_complete false: continue it with --resume\n"
               "  130  interrupted (Ctrl-C); 143: terminated (SIGTERM); the finished configurations' rows are\n"
               "       written as for 2 (the table is rewritten after each compile group, so a sweep killed\n"
               "       outright keeps every group but the running one): continue it with --resume")
    sweep.add_argument("config", help="sweep file (.json or .toml); see jes.sweep.load_sweep_file")
    sweep.add_argument("--out-dir", default=None, help="where sweep.csv/sweep.json go (overrides the file's out_dir; default: the file's, else sweep_results/); 'none': no table")
    sweep.add_argument("--resume", action="store_true",
                       help="continue the interrupted sweep whose table is in the out dir (give the same sweep file): "
                            "the compile groups whose every configuration finished are kept, the others run whole, "
                            "and the merged table is written; refused when that table is another sweep's")
    sweep.add_argument("--vmap", action="store_true",
                       help="run seeds and learning_rate/noise_std values as one vmapped program (faster on "
                            "accelerators; may differ from standalone runs in the last bits). Default: one after "
                            "another through one compiled step, bit-identical to standalone runs")
    sweep.add_argument("--no-vmap", action="store_true", help=argparse.SUPPRESS)  # the default since 0.3

    launch = commands.add_parser(
        "launch", help="start the processes of a multi-process (jax.distributed) run on this machine",
        formatter_class=_HelpFormatter,
        description="Starts N copies of COMMAND as one jax.distributed run: each gets the coordinator address and "
                    "its process id (read by jes.train(..., distributed=True), jes train --distributed and "
                    "jes.distributed.initialize()). Output is forwarded with a [pI] prefix; if one process fails, "
                    "the others are stopped. Ctrl-C or SIGTERM is passed on to every process as a Ctrl-C (process 0 "
                    "saves its checkpoint) and waited for.",
        epilog="examples:\n  jes launch --processes 2 -- jes train --distributed --generations 20\n"
               "  jes launch --processes 2 --devices-per-process 2 -- python my_script.py\n"
               "  on each of 2 hosts without a scheduler (4 processes):\n"
               "    host0$ jes launch --processes 4 --local-processes 2 --coordinator host0:6000 -- python s.py\n"
               "    host1$ jes launch --processes 4 --local-processes 2 --first-process-id 2 "
               "--coordinator host0:6000 -- python s.py")
    launch.add_argument("--processes", type=int, required=True, metavar="N", help="processes in the whole run")
    launch.add_argument("--devices-per-process", type=int, default=1, metavar="K",
                        help="CPU devices each process exposes (accelerators: CUDA_VISIBLE_DEVICES etc.)")
    launch.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                        help="process 0's coordination address (default: a free port on 127.0.0.1). JAX's "
                             "coordination service does not authenticate: a loopback address is listened on alone, "
                             "any other host on every interface (JAX_COORDINATOR_BIND_ADDRESS=IP:PORT picks one); "
                             "use a trusted network")
    launch.add_argument("--first-process-id", type=int, default=0, help="id of the first process started here")
    launch.add_argument("--local-processes", type=int, default=None,
                        help="processes to start here (default: all from --first-process-id on)")
    launch.add_argument("--no-pin-cores", dest="pin_cores", action="store_false",
                        help="let every process use every core (by default each gets its own share of the cores)")
    launch.add_argument("--no-prefix", action="store_true", help="forward output lines without the [pI] prefix")
    launch.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="what every process runs")

    keys = commands.add_parser("keys", help="make a CURVE key pair of a distributed master's own")
    keys.add_argument("name", help="writes NAME.secret (the master's, mode 600) and NAME.public (for workers)")
    return parser


def _none(value: str | None) -> str | None:
    return None if value is not None and value.lower() == "none" else value


def _float_or_none(text: str) -> float | str:
    """A number, or ``"none"`` (``--stop-at-return none``: no target, clearing a resumed run's)."""
    if text.strip().lower() == "none":
        return "none"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r} (a return, or 'none')") from None


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _policy_args(pairs: list[str]) -> dict:
    """``["features=16", "name=x"]`` -> ``{"features": 16, "name": "x"}``."""
    args = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--policy-arg {pair!r} is not KEY=VALUE; e.g. --policy-arg features=16")
        args[key.strip()] = _literal(value.strip())
    return args


def _import_policy_class(spec: str):
    import importlib

    import flax.linen as nn

    from jes.describe import current_directory_importable

    module_name, _, qualname = spec.partition(":")
    current_directory_importable()
    try:
        obj = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"--policy {spec}: cannot import it ({err}); give module.path:ClassName importable from "
                         f"the current directory or PYTHONPATH") from err
    nnx = sys.modules.get("flax.nnx")  # a module of nnx classes imported it
    if nnx is not None and inspect.isclass(obj) and issubclass(obj, nnx.Module):
        return obj  # trained through Flax's bridge (_build_policy)
    if not (inspect.isclass(obj) and issubclass(obj, nn.Module)):
        raise ValueError(f"--policy {spec} is {type(obj).__name__}, not a flax.linen.Module class (nor a flax.nnx one)")
    return obj


def _nnx_policy(kind: str, cls: type, extra: dict):
    """``nnx.bridge.ToLinen(cls, kwargs=extra)``: a flax.nnx class with its constructor's keyword arguments
    (``--policy-arg``); a ``num_outputs`` argument not given is filled in from the env."""
    from flax import nnx

    from jes.describe import LIBRARY_PACKAGES, library_nnx_class

    if cls.__module__.split(".", 1)[0] in LIBRARY_PACKAGES:  # its run could be trained, but never evaluated or saved
        raise ValueError(library_nnx_class(f"--policy {kind}", f"{cls.__module__}:{cls.__qualname__}"))
    parameters = inspect.signature(cls.__init__).parameters
    named = [p for p in parameters if p not in ("self", "rngs")]
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    unknown = sorted(set(extra) - set(named))
    if unknown and not takes_any:
        raise ValueError(f"--policy-arg {', '.join(unknown)}: {cls.__name__}.__init__ has no such argument; its "
                         f"arguments are {', '.join(named)}")
    if "num_outputs" in named and "num_outputs" not in extra:
        extra = dict(extra, num_outputs=None)  # jes sets it from the env's action space
    return nnx.bridge.ToLinen(cls, kwargs=extra)


def _build_policy(args: argparse.Namespace):
    """The policy the flags name (``None`` when no policy flag was given)."""
    import dataclasses

    extra = _policy_args(args.policy_arg)
    if args.policy is None and args.hidden is None and args.layers is None and not extra:
        return None
    kind = args.policy or "gru"
    if kind.lower() in ("gru", "mlp"):
        from jes.sweep import build_policy

        sized = {"mlp": ("hidden_sizes",), "gru": ("hidden", "layers")}[kind.lower()]
        twice = [f for f in sized if f in extra]
        if twice and (args.hidden is not None or args.layers is not None):  # (--policy-arg won, silently: a trial)
            raise ValueError(f"--policy-arg {twice[0]}=... and --hidden/--layers both size the policy; give one")

        # None is "not given"; a 0 was replaced by the default (--hidden 0 trained 5 units silently)
        hidden, layers = (5 if args.hidden is None else args.hidden), (2 if args.layers is None else args.layers)
        if hidden < 1:
            raise ValueError(f"--hidden must be a positive integer (units per layer), got {hidden}")
        if layers < 0:
            raise ValueError(f"--layers must be a positive integer (or 0 with --policy mlp: a linear policy), got {layers}")
        if layers == 0 and kind.lower() == "gru":
            raise ValueError("--layers 0: a GRU policy needs at least one layer (--policy mlp --layers 0 is a linear "
                             "policy)")
        if layers == 0:  # an MLP without hidden layers: the head alone, a linear policy
            if args.hidden is not None:
                raise ValueError(f"--hidden {args.hidden} has no layer to size with --layers 0 (a linear policy): "
                                 f"drop --hidden, or give --layers 1 or more")
            from jes.policies import MLPPolicy

            policy = MLPPolicy(hidden_sizes=())
        else:
            policy = build_policy({"type": kind, "hidden": hidden, "layers": layers})
        cls = type(policy)
    elif ":" in kind:
        if args.hidden is not None or args.layers is not None:
            raise ValueError(f"--hidden/--layers are for --policy gru/mlp; give {kind}'s fields with --policy-arg KEY=VALUE")
        cls, policy = _import_policy_class(kind), None
    else:
        raise ValueError(f"--policy {kind!r}: use gru, mlp, or your own module as module.path:ClassName")
    nnx = sys.modules.get("flax.nnx")
    if nnx is not None and issubclass(cls, nnx.Module):  # an nnx class: its constructor's keyword arguments
        return _nnx_policy(kind, cls, extra)
    fields = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in ("parent", "name")]
    unknown = sorted(set(extra) - set(fields))
    if unknown:
        raise ValueError(f"--policy-arg {', '.join(unknown)}: {cls.__name__} has no such field; its fields are "
                         f"{', '.join(fields)}")
    try:
        return policy.clone(**extra) if policy is not None else cls(**extra)
    except (TypeError, ValueError) as err:  # a field's own refusal (GRUPolicy(hidden=0)), one line
        raise ValueError(f"--policy {kind} with {extra}: {err}") from err


def _with_checkpoint_flags(args: argparse.Namespace, saved: Any, policy: Any) -> Any:
    """The policy of ``--resume`` given some of ``--policy gru/mlp``, ``--hidden``, ``--layers``: the flags left out
    taken from the checkpoint's policy (a GRUPolicy's or an MLPPolicy of equal widths), not from the defaults (a
    trial: ``--resume CKPT --policy mlp`` of an MLP 16 x 1 run was refused as "hidden_sizes [5, 5]", and ``--hidden 16
    --layers 1`` as a GRUPolicy); a flag given that differs is then refused by the resume, naming it."""
    from jes.policies import GRUPolicy, MLPPolicy

    if type(saved) is GRUPolicy:
        kind, hidden, layers = "gru", saved.hidden, saved.layers
    elif type(saved) is MLPPolicy and len(set(saved.hidden_sizes)) <= 1:
        kind, hidden, layers = "mlp", (saved.hidden_sizes[0] if saved.hidden_sizes else None), len(saved.hidden_sizes)
    else:
        return policy
    if (args.policy or kind).lower() != kind:
        return policy
    filled = argparse.Namespace(**vars(args))
    filled.policy = kind
    filled.hidden = args.hidden if args.hidden is not None else hidden
    filled.layers = args.layers if args.layers is not None else layers
    return _build_policy(filled)


def _train(args: argparse.Namespace) -> int:
    import jes
    from jes import strategies

    overrides = {field: getattr(args, dest) for dest, field in CONFIG_FLAGS.items() if getattr(args, dest) is not None}
    if overrides.get("stop_at_return") == "none":
        overrides["stop_at_return"] = None  # given as None: clears a resumed run's target (absent keeps it)
    if args.devices is not None and args.devices < 1:
        raise ValueError(f"--devices must be a positive number of local devices (default: all), got {args.devices}")
    if args.workers < 0:
        raise ValueError(f"--workers must be an integer >= 0 (0: this process alone), got {args.workers}")
    if args.no_normalize_observations:
        overrides["normalize_observations"] = False
    if args.no_antithetic:
        overrides["antithetic"] = False
    if args.optimizer is not None and strategies.canonical_name(args.optimizer):
        raise ValueError(f"--optimizer {args.optimizer}: {args.optimizer!r} is a strategy, not an optimizer: give it as "
                         f"--strategy {args.optimizer} (--optimizer takes adam, sgd, clipup, ...)")
    if args.optimizer is not None:
        from jes.optimizers import optimizer_names, resolve_name

        try:
            resolve_name(args.optimizer)
        except ValueError:  # its advice (an optax object) is for Python: the command line takes names
            raise ValueError(f"--optimizer {args.optimizer}: unknown optimizer; the command line takes "
                             f"{', '.join(optimizer_names())} (another optax optimizer: jes.train from Python)") from None
    policy = _build_policy(args)
    env, strategy, optimizer, config = args.env, args.strategy, args.optimizer, None
    if args.resume is True:  # --resume without a file: the run's own checkpoint if it is there, else a fresh run
        from jes.loop import own_checkpoint_to_resume

        if args.distributed:  # every process takes process 0's answer (jes.train would start the runtime anyway)
            from jes.distributed import jax_runtime

            jax_runtime.ensure_initialized()

        args.resume = own_checkpoint_to_resume(
            True, _none(args.log_dir), "<log_dir>/checkpoint.ckpt" if args.checkpoint is None else _none(args.checkpoint),
            command=True)
    if args.resume is not None:
        # The checkpoint stores the run: anything not given on the command line comes from it.
        from jes import checkpoint

        ckpt = checkpoint.read(args.resume)
        if env is not None and not ckpt.names_env(env) and not ckpt.names_env(jes.make_env(env).name):
            raise ValueError(f"--env {env}: the checkpoint's run is on {ckpt.env_name!r}; a resume continues that "
                             f"run (drop --env), or start a new run without --resume")
        if policy is None:
            policy = ckpt.policy(allow_modules=args.allow_module)
        elif (args.policy or "gru").lower() in ("gru", "mlp"):
            policy = _with_checkpoint_flags(args, ckpt.policy(allow_modules=args.allow_module), policy)
        env = ckpt.env_name if env is None else env
        strategy = checkpoint.build_strategy(ckpt.meta.get("strategy"), args.resume) if strategy is None else strategy
        if optimizer is None and (args.strategy is None or strategies.get(strategy).uses_optimizer):
            optimizer = ckpt.optimizer  # not a strategy's given on the command line that takes none (its refusal
            # would tell the user to drop an optimizer they did not give; the resume says what differs)
        config = ckpt.config()
        if config.chunk_size is None and args.chunk_size is None:  # the chunk it ran, whatever today's default
            older = ckpt.meta.get("chunk_size") is None and config.perturbation == "low_rank"  # not recorded
            with warnings.catch_warnings():  # jes.train warns about the policy's layers itself
                warnings.simplefilter("ignore", jes.perturbations.LowRankWarning)
                trainer = jes.Trainer(policy, env, optimizer, config, strategy=strategy) if older else None
            ran = ckpt.chunk_size_ran(trainer)
            config = config if ran is None else config.replace(chunk_size=ran)
    policy = jes.GRUPolicy(hidden=5, layers=2) if policy is None else policy
    kwargs = dict(key=args.seed, devices=args.devices, log_dir=_none(args.log_dir), progress=args.progress,
                  checkpoint_every=args.checkpoint_every, resume=args.resume, config=config, **overrides)
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
    if args.workers:
        kwargs.update(num_workers=args.workers)
    if args.listen is not None or args.workers:
        _log_distributed()

    master_options = {name: value for name, value in (
        ("heartbeat_interval", args.heartbeat_interval), ("worker_timeout", args.worker_timeout),
        ("assign_timeout", args.first_range_timeout), ("min_deadline", args.min_range_deadline),
        ("target_range_seconds", args.range_seconds), ("max_range_chunks", args.max_range_chunks),
        ("curve_secret_key", args.curve_secret_key), ("audit", args.audit),
    ) if value is not None}
    if master_options:
        if args.listen is None and not args.workers:  # (local workers have a master too: jes.train merges these)
            print("jes train: the distributed timing flags are for a master; add --listen HOST:PORT (workers on other "
                  "hosts) or --workers N (local ones)", file=sys.stderr)
            return 2
        if "master_options" not in inspect.signature(jes.train).parameters:
            print("jes train: this jes.train takes no master_options; run without the distributed timing flags",
                  file=sys.stderr)
            return 2
        kwargs["master_options"] = master_options

    if args.distributed:
        if args.listen is not None:
            print("jes train: --distributed (JAX's multi-process runtime) and --listen (a ZeroMQ master for jes-worker "
                  "fleets) are two different backends; choose one", file=sys.stderr)
            return 2
        if args.devices is not None:
            print("jes train: --devices is for one process; a --distributed run uses every device of every process "
                  "(jes launch --devices-per-process K chooses them)", file=sys.stderr)
            return 2
        kwargs["distributed"] = True
    if args.save_policy is not None:
        log_dir = _none(args.log_dir)
        own = os.path.join(log_dir, "checkpoint.ckpt") if args.checkpoint is None and log_dir and \
            log_dir != "runs/<auto>" else None
        _check_policy_path(args.save_policy, (args.checkpoint, args.resume, own))
    try:
        result = jes.train(policy, env or "CartPole-v1", optimizer, strategy=strategy or "openai_es", **kwargs)
    except BaseException as err:
        # (Ctrl-C and SIGTERM: said with the checkpoint they leave, by _saved_note)
        if args.save_policy is not None and isinstance(err, (jes.CheckpointSaveError, jes.NonFiniteFitnessError,
                                                             jes.NonFiniteUpdateError)):
            kept = getattr(getattr(err, "result", None), "checkpoint_path", None)
            kept = kept if isinstance(err, jes.NonFiniteFitnessError | jes.NonFiniteUpdateError) and kept and \
                os.path.exists(kept) else "CHECKPOINT"
            print(f"jes train: --save-policy {args.save_policy} was not written (the run did not finish); jes eval "
                  f"{kept} --save-policy {args.save_policy} writes a checkpoint's centre", file=sys.stderr)
        if isinstance(err, jes.CheckpointSaveError):
            return _save_failed(err)
        raise
    import jax

    try:
        if jax.process_index() == 0:  # every process of a --distributed run has the same result
            print(result.summary())
            if args.save_policy is not None:
                _save_policy(result.trained_policy(), args.save_policy, result.checkpoint_path)
                args.policy_written = True  # (an interrupt after it: _saved_note says nothing of it)
    except KeyboardInterrupt as interrupt:  # the run is done and saved: name its checkpoint
        interrupt.checkpoint_path = result.checkpoint_path
        raise
    return 0


def _save_failed(err) -> int:
    """A checkpoint save that failed mid-run (:class:`jes.loop.CheckpointSaveError`): say so, print the run so far,
    and save it where a file can still be written (the current directory, else the temporary one), to resume."""
    from jes import checkpoint

    print(f"jes train: could not save the checkpoint {err.path} ({err.reason}): "
          f"training stopped at generation {err.generation} of {err.num_generations}", file=sys.stderr)
    result = err.result
    if result is None:
        return 2
    print(result.summary())
    failed = os.path.dirname(os.path.abspath(err.path))
    tried = []
    for folder in dict.fromkeys((os.getcwd(), tempfile.gettempdir())):
        if os.path.abspath(folder) == failed:
            continue
        base, ext = os.path.splitext(f"rescued-{os.path.basename(err.path)}")
        path = os.path.join(folder, base + ext)
        number = 0
        while os.path.lexists(path):  # never over another file
            number += 1
            path = os.path.join(folder, f"{base}_{number}{ext}")
        try:
            checkpoint.save(path, result.trainer, result.state, result.history, result.key, best=result.best)
        except OSError as rescue_error:
            tried.append(f"{path}: {rescue_error.strerror or rescue_error}")
            continue
        shown = os.path.relpath(path) if folder == os.getcwd() else path
        print(f"jes train: the run so far (generation {err.generation}) is saved in {shown}: continue it with jes train "
              f"--resume {shown} (add --checkpoint PATH to write the rest elsewhere)", file=sys.stderr)
        return 2
    print(f"jes train: the run so far could not be saved anywhere either ({'; '.join(tried) or 'no folder left'})",
          file=sys.stderr)
    return 2


def _eval(args: argparse.Namespace) -> int:
    import jax
    import numpy as np

    from jes import checkpoint, trained
    from jes.generation import as_key, run_label
    from jes.perturbations import LowRankWarning

    if args.episodes < 1:
        raise ValueError(f"--episodes must be a positive number of episodes, got {args.episodes}")
    if args.render_steps is not None and args.render_steps < 1:  # before the episodes, not after (as max_steps)
        raise ValueError(f"--render-steps must be a positive number of steps, got {args.render_steps}")
    if args.render_steps is not None and args.render is None:
        raise ValueError(f"--render-steps {args.render_steps} is the length of the --render episode: add --render "
                         f"PATH, or drop --render-steps")
    is_policy = _starts_with(args.checkpoint, trained.POLICY_MAGIC) or (
        args.checkpoint.endswith(".policy") and not _starts_with(args.checkpoint, checkpoint.MAGIC))
    if args.save_policy is not None and is_policy:
        raise ValueError(f"--save-policy: {args.checkpoint} is a policy file already (copy it to "
                         f"{args.save_policy}); --save-policy writes a checkpoint's centre")
    if args.save_policy is not None:
        _check_policy_path(args.save_policy, (args.checkpoint,))
    # A policy file by its first bytes, or by its name when they are neither kind's (a damaged .policy file is then
    # called a policy file, not a checkpoint)
    if is_policy:
        policy = trained.load_policy(args.checkpoint, allow_modules=args.allow_module)
        if args.render is not None:  # before the episodes are evaluated, as a checkpoint's
            from jes.render import check_render_path

            check_render_path(policy.env_spec(), args.render)
        returns = policy.evaluate(args.episodes, as_key(args.seed))
        print(f"{args.checkpoint}: {policy.env_name}, {type(policy.policy).__name__}, saved policy: return "
              f"{returns.mean():.2f} +/- {returns.std():.2f} over {args.episodes} episodes")
        if args.render is not None:
            policy.render(args.render, as_key(args.seed), args.render_steps)
            print(f"rendered one episode to {args.render}")
        return 0
    with warnings.catch_warnings():
        # Only the centre is evaluated: which leaves the members' low-rank noise cannot factor does not matter here
        # (the run warned when it started).
        warnings.simplefilter("ignore", LowRankWarning)
        ckpt = checkpoint.read(args.checkpoint)
        # a run given an optax object, schedules or a strategy class of your own: evaluated with stand-ins for them
        # (evaluation never reads them)
        trainer, state = ckpt.centre_for_evaluation(allow_modules=args.allow_module)
    # the run's own optimizer as its file records it: the stand-in trainer's is "sgd" wherever the run had an optax
    # object or a schedule (a trial: `jes eval` named "sgd" for an optax.chain(...) run)
    label = run_label(trainer.strategy.name, ckpt.meta.get("optimizer"), trainer.config)
    if not ckpt.rebuilds_its_strategy():  # the stand-in's label would name OpenAI-ES's "sgd": the file's strategy
        ran = ckpt.meta["strategy"]
        label = f"strategy {ran['name']}" + (f" ({ran['class']})" if ran.get("class") else "")
    if args.render is not None:  # before 100 episodes are evaluated
        from jes.render import check_render_path

        check_render_path(trainer.spec, args.render)
    if args.save_policy is not None:  # before the episodes, as --render's path is checked
        from jes.loop import trained_policy

        _save_policy(trained_policy(trainer, state.params, state), args.save_policy)
    if trainer.spec.host:  # a Python simulator (Gymnasium): episodes stepped here, the policy compiled
        from jes.host_step import HostGeneration

        returns, _ = HostGeneration(trainer).evaluate_centre(state, args.episodes, as_key(args.seed))
    else:
        returns, _ = jax.jit(trainer.evaluate_centre, static_argnums=1)(state, args.episodes, as_key(args.seed))
    returns = np.asarray(returns)
    # run_label: the optimizer ("adam"), else the strategy ("snes", "pgpe-clipup"); ckpt.optimizer is None for snes
    print(f"{args.checkpoint}: {ckpt.env_name}, {type(trainer.policy).__name__}, {label}, generation "
          f"{ckpt.generation}: centre return {returns.mean():.2f} +/- {returns.std():.2f} over {args.episodes} episodes")
    if args.render is not None:
        from jes.render import render

        render(trainer, state, args.render, as_key(args.seed), args.render_steps)
        print(f"rendered one episode to {args.render}")
    return 0


def _check_policy_path(path: str, others: tuple) -> None:
    """Refuse, before anything runs, a --save-policy path that would replace the run's own checkpoint, is a folder, or
    lies where no file can be made (its nearest existing folder is a file, or not writable); missing folders are made
    when it is written (as the log dir's are)."""
    _refuse_the_checkpoint(path, others)
    if os.path.isdir(path):
        raise ValueError(f"--save-policy {path} is a folder: give a file's path (x.policy)")
    from jes import trained

    if os.path.exists(path) and not _starts_with(path, trained.POLICY_MAGIC):  # another run's checkpoint, say
        raise ValueError(f"--save-policy {path} exists and is not a policy file (a checkpoint, or another file): it "
                         f"would be replaced; give a path of its own, or delete it first")
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise ValueError(f"--save-policy {path}: {folder} is a file, not a folder: give another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--save-policy {path}: the folder {folder} is not writable here: give another path")


def _refuse_the_checkpoint(path: str, others: tuple) -> None:
    target = os.path.realpath(path)
    for other in others:
        if isinstance(other, str) and os.path.realpath(other) == target:
            raise ValueError(f"--save-policy {path} is the run's checkpoint: a policy file would replace it; give the "
                             f"policy file a path of its own (x.policy)")


def _save_policy(policy, path: str, checkpoint_path: str | None = None) -> None:
    """Write ``policy`` to ``path`` (making its folders) and say so; a failure is said with what still holds the
    centre."""
    _refuse_the_checkpoint(path, (checkpoint_path,))  # (an automatic log dir's checkpoint is known only now)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        policy.save(path)
    except (OSError, ValueError) as err:
        kept = f"; the run's checkpoint {checkpoint_path} holds it (jes eval {checkpoint_path} --save-policy PATH)" \
            if checkpoint_path else ""
        raise ValueError(f"--save-policy: could not write {path}: {err}{kept}") from err
    print(f"saved the centre policy to {path} (jes eval {path}; jes.load_policy)")


def _log_distributed() -> None:
    """The master's log (workers joining and leaving, its status lines) on stderr at INFO, as jes-worker logs."""
    import logging

    logger = logging.getLogger("jes.distributed")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        # Not on to the root logger too: a library's logging.info() (MuJoCo MJX's, building a brax env) gives the root
        # a handler of its own, and every master line came twice (a trial). The root is left alone: a handler put on
        # it silenced every library's warnings (JAX's among them), which Python prints while the root has none.
        logger.propagate = False
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)


def _starts_with(path: str, magic: bytes) -> bool:
    """Whether the file at ``path`` begins with ``magic`` (``False`` when it cannot be read: the loader says why)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(magic)) == magic
    except OSError:
        return False


def _plot(args: argparse.Namespace) -> int:
    from jes.plot import plot_runs

    labels = args.labels.split(",") if args.labels else None
    if labels is not None and len(labels) != len(args.run_dirs):
        raise ValueError(f"--labels has {len(labels)} names for {len(args.run_dirs)} run directories")
    written = plot_runs(args.run_dirs, args.output, labels)  # (a folder holding two runs gets a curve each, warned)
    print(f"learning curves of {len(args.run_dirs)} run folder(s) written to {written}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from jes.sweep import load_sweep_file, sweep

    kwargs = load_sweep_file(args.config)
    if args.out_dir is not None:
        kwargs["out_dir"] = _none(args.out_dir)  # --out-dir none: no table, as --log-dir none is no logs
    result = sweep(**kwargs, vmap=args.vmap and not args.no_vmap, resume=args.resume)
    # the grid's values that differ between rows (a file's fixed [config] values are in the grid too)
    keys = [k for k in result.rows[0] if k in kwargs["grid"] and len({repr(r.get(k)) for r in result.rows}) > 1]
    for row in result.rows:
        values = ", ".join(f"{k}={row[k]}" for k in keys) or "base"
        score, seeds, failed = row["final_centre_return_mean"], len(row["seeds"].split()), row.get("failed", 0)
        if failed == seeds:
            print(f"{values}: failed ({row['error']})")
            continue
        # (the aggregates are over the seeds that did not fail)
        over = f" over {seeds - failed} of {seeds} seeds ({failed} failed: {row['error']})" if failed else ""
        print(f"{values}: final centre return {score:.1f} +/- {row['final_centre_return_std']:.1f}{over}"
              if math.isfinite(score) else f"{values}: no centre evaluation{over}")
    print(f"table: {result.csv_path} and {result.json_path}" if result.csv_path else
          "table: not written (out_dir none)")  # (it said "table: None and None")
    # The table is written; sweep() said which runs failed and where the reasons are (the rows: a resumed sweep's
    # result holds only the runs it ran)
    return 1 if any(row.get("failed") for row in result.rows) else 0


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


def _launch(args: argparse.Namespace) -> int:
    from jes.distributed.launch import launch

    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    try:
        return launch(command, args.processes, devices_per_process=args.devices_per_process,
                      coordinator=args.coordinator, first_process_id=args.first_process_id,
                      local_processes=args.local_processes, prefix=not args.no_prefix, pin_cores=args.pin_cores)
    except ValueError as err:
        print(f"jes launch: {err}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``jes`` console script."""
    args = _parser().parse_args(argv)
    status = _main(args)
    if status and "jax" in sys.modules:
        from jes.distributed import jax_runtime

        jax_runtime.end_now_if_multi_process(status, getattr(args, "error", None))
    return status


def _main(args: argparse.Namespace) -> int:
    if args.command == "keys":
        return _keys(args)  # needs no JAX
    if args.command == "launch":
        return _launch(args)  # needs no JAX either: the processes it starts import it
    from jes.compilation_cache import enable_compilation_cache
    from jes.cpu import use_cpu_cores

    use_cpu_cores()  # one CPU device per core (results are identical for any device count)
    launched = os.environ.get("JES_NUM_PROCESSES", "")
    if args.command == "train" and not args.distributed and launched.isdigit() and int(launched) > 1:
        print(f"jes train: jes launch started {launched} processes of this command, but without --distributed each "
              f"would train the whole run alone, all writing the same files: add --distributed", file=sys.stderr)
        return 2
    if getattr(args, "distributed", False):
        from jes.distributed import jax_runtime

        try:  # before anything computes (reading a checkpoint to resume from included)
            jax_runtime.ensure_initialized()
        except jax_runtime.DistributedSetupError as err:
            print(f"jes {args.command}: {err}", file=sys.stderr)
            return 2
    enable_compilation_cache()
    if getattr(args, "allow_module", None):
        from jes.describe import current_directory_importable

        current_directory_importable()  # the allowed modules import from here, as --policy's does
    if getattr(args, "imports", None):
        from jes.describe import import_modules

        try:
            import_modules(args.imports)
        except ValueError as err:
            print(f"jes {args.command}: error: {err}", file=sys.stderr)
            return 2
    from jes.host_rollout import HostEnvError

    from jes.interrupts import sigterm_as_interrupt

    handler = {"train": _train, "eval": _eval, "sweep": _sweep, "plot": _plot}[args.command]
    formatwarning = warnings.formatwarning  # a warning as one line, not jes's source file and line that raised it
    warnings.formatwarning = lambda message, category, *_args, **_kw: f"jes {args.command}: {category.__name__}: {message}\n"
    # timeout, Slurm, docker stop: as Ctrl-C (a checkpoint, local workers stopped), then 143 (jes.train's own taking of
    # SIGTERM, which would end the process after its save, leaves this handler in charge)
    terminated: list[int] = []
    try:
        with sigterm_as_interrupt() as terminated:
            status = handler(args)
        if terminated:  # its interrupt dropped by Python (in a gc callback) after the run's last check: it finished
            print("\nterminated (after the command had finished its work)", file=sys.stderr)
            return 128 + signal.SIGTERM
        return status
    except KeyboardInterrupt as interrupt:
        print(f"\n{'terminated' if terminated else 'interrupted'}{_saved_note(args, interrupt)}", file=sys.stderr)
        return 128 + signal.SIGTERM if terminated else 130
    except (OSError, ValueError, ImportError) as err:  # a busy --listen port, a missing file, a bad value
        args.error = err  # (main: whether every process of a --distributed run stopped with it)
        # (or one that stopped a run midway, a full log disk: jes.train saved the run so far)
        print(f"jes {args.command}: {_for_command(str(err), args.command)}"
              f"{_kept_note(args, err, 'continue with --resume {path} once its cause is fixed')}", file=sys.stderr)
        _print_run_so_far(args, err)
        return 2
    except HostEnvError as err:  # a Python simulator's step or reset raised: its message names env, member, generation
        args.error = err  # (main: whether every process of a --distributed run stopped with it)
        print(f"jes {args.command}: {err}{_kept_note(args, err, 'fix the env, then continue with --resume {path}')}",
              file=sys.stderr)
        _print_run_so_far(args, err)
        return 2
    except Exception as err:  # noqa: BLE001  unexpected (a bug, an XLA runtime error): an error all the same, with its
        # traceback; 2 as any error that stopped the command, never 1, which says jes sweep's runs failed
        args.error = err
        traceback.print_exc()
        print(f"jes {args.command}: unexpected {type(err).__name__}: {err}"
              f"{_kept_note(args, err, 'continue with --resume {path} once its cause is fixed')}", file=sys.stderr)
        _print_run_so_far(args, err)
        return 2
    finally:
        warnings.formatwarning = formatwarning


def _kept_note(args: argparse.Namespace, err: BaseException, advice: str) -> str:
    """Where ``jes train`` kept a run an error stopped midway: the checkpoint :func:`jes.train` saved its last good
    state in (``err.checkpoint_path``), with ``advice`` (``{path}``: the checkpoint); ``""`` when it saved none."""
    saved = getattr(err, "checkpoint_path", None)
    if args.command != "train" or not saved or not os.path.exists(saved):
        return ""
    return f" (the run so far is in checkpoint {saved}: {advice.format(path=saved)})"


def _print_run_so_far(args: argparse.Namespace, err: BaseException) -> None:
    """The summary of the run so far an error that stopped ``jes train`` midway carries (``err.result``), as a run
    that ends prints its own."""
    result = getattr(err, "result", None)
    if args.command != "train" or result is None:
        return
    import jax

    if jax.process_index() == 0:  # every process of a --distributed run has the same result
        print(result.summary())


def _saved_note(args: argparse.Namespace, interrupt: KeyboardInterrupt) -> str:
    """What an interrupted ``jes train`` leaves to resume from: the checkpoint it saved on the interrupt, or the one
    it resumed from (an interrupt before the first generation, while compiling, saves none); for ``jes sweep``,
    nothing: it has no checkpoints, and :func:`jes.sweep.sweep` has said on stderr which configurations finished and
    where their table is."""
    if args.command != "train":
        return ""
    if getattr(args, "distributed", False):
        import jax

        # Only once the runtime is up: process_index() would start the backend (an interrupt while connecting)
        if jax.distributed.is_initialized() and jax.process_index() != 0:  # process 0 alone writes the checkpoint (and says where)
            return f" (process {jax.process_index()}; process 0 writes the run's checkpoint and names it)"
    save_error = getattr(interrupt, "save_error", None)  # the save on the interrupt failed (a full disk)
    failed = f"saving it failed ({getattr(save_error, 'reason', None) or save_error})" if save_error else None
    policy = getattr(args, "save_policy", None) if not getattr(args, "policy_written", False) else None
    for path in (getattr(interrupt, "checkpoint_path", None), args.resume):
        if isinstance(path, str) and os.path.exists(path):  # (args.resume is True for --resume given no file)
            unwritten = f"; --save-policy {policy} was not written: jes eval {path} --save-policy {policy} writes " \
                "its centre" if policy else ""
            if failed:
                return f" (the newest generations are not in checkpoint {path}: {failed}; continue from it with --resume {path}{unwritten})"
            return f" (checkpoint {path}; continue with --resume {path}{unwritten})"
    if failed:
        why = failed
    elif args.checkpoint is not None and _none(args.checkpoint) is None:
        why = "--checkpoint none"
    elif args.checkpoint is None and args.resume is None and _none(args.log_dir) is None:
        why = ("--log-dir none turns off the default checkpoint (which goes in the log dir); pass --checkpoint PATH to "
               "keep one")
    else:  # an interrupt once the generations run saves the run (a second Ctrl-C waits for the save): none came before
        why = "interrupted before the first generation ran"
    unwritten = f"; nor --save-policy {policy}: the run ended before it" if policy else ""
    return f" (no checkpoint was saved: {why}; there is nothing to --resume{unwritten})"


def _for_command(message: str, command: str) -> str:
    """A library error's advice as the command being run takes it: ``jes train``'s config fields as its flags
    (:func:`_flag_named`); ``jes eval``'s own ``--import MODULE`` for the module registering an env, and, for a
    policy file whose env no name rebuilds, the Python call that takes the env (the command line takes no env=)."""
    from jes.envs.gymnasium import IMPORT_HINT
    from jes.trained import ENV_HINT

    if command == "train":
        return _flag_named(message)
    if command == "eval":
        message = message.replace(IMPORT_HINT, "with jes eval --import MODULE")
        message = message.replace(ENV_HINT, "from Python, jes.load_policy(path, env=your_env).evaluate() (or "
                                            ".render(path)) takes the env itself")
    return message


def _flag_named(message: str) -> str:
    """An ESConfig error as the command line gave the value: "perturbation_rank must be ..." names --rank too,
    "num_members=15 is odd ... or antithetic=False" reads "--population 15 is odd ... or --no-antithetic". Only
    whole words outside quotes are rewritten: a path or a sweep's run folder (``num_members=16,noise_std=0.02``)
    in a message stays as it is."""
    for dest, field in CONFIG_FLAGS.items():
        if message.startswith(f"{field} "):
            message = f"--{dest.replace('_', '-')} ({field}){message[len(field):]}"
            break
    words = {f"{field}=": "--" + dest.replace("_", "-") + " " for dest, field in CONFIG_FLAGS.items()}
    words["antithetic="] = None  # antithetic=False only, as --no-antithetic
    # a word of its own: after a space or "(", before a space, ")", ";", ":", ", " or the end
    pattern = re.compile(r"(?<![^\s(])(" + "|".join(map(re.escape, words)) + r")(-?[\d.][\w.+-]*|False)(?=,?\s|[);:]|,?$)")

    def rewrite(m: re.Match) -> str:
        flag, value = words[m.group(1)], m.group(2)
        if flag is None:
            return "--no-antithetic" if value == "False" else m.group(0)
        return m.group(0) if value == "False" else flag + value

    parts = re.split(r"('[^']*'|\"[^\"]*\")", message)  # odd parts: quoted, left as they are
    message = "".join(part if i % 2 else pattern.sub(rewrite, part) for i, part in enumerate(parts))
    message = re.sub(r"^devices=(\d+), but ", r"--devices \1: ", message)  # jes.train's arguments, as flags
    # a quoted setting a strategy ignores: "fitness_shaping='raw' would be ignored" (the quotes keep it out of the above)
    message = re.sub(r"(?<![\w-])fitness_shaping='(\w+)'", r"--fitness-shaping \1", message)
    message = re.sub(r"^checkpoint_every (.*), got (-?\d+)$", r"--checkpoint-every \2: \1", message)
    # (only jes.train's arguments: "jes.train(policy, env, ..., resume=path)" is a Python call, advice for Python)
    for argument, flag in (("continue that run with resume=", "continue that run with --resume "),
                           ("another log_dir (or checkpoint_path)", "another --log-dir (or "
                           "--checkpoint)"),  # jes.train's arguments of a refused overwrite, as flags
                           ("its own checkpoint_path", "its own --checkpoint PATH"),  # a refused resume's
                           # and of a folder that cannot be written (jes.loop._unwritable_problem)
                           ("pass a log_dir in a folder you can write (jes train: --log-dir DIR), or log_dir=None "
                            "(--log-dir none)", "give --log-dir DIR in a folder you can write, or --log-dir none"),
                           ("pass a checkpoint_path in a folder you can write (jes train: --checkpoint PATH), or "
                            "checkpoint_path=None (--checkpoint none)",
                            "give --checkpoint PATH in a folder you can write, or --checkpoint none")):
        message = message.replace(argument, flag)
    return message


if __name__ == "__main__":
    sys.exit(main())
