"""Save and restore the full training state, atomically, without pickle.

File layout (one file per checkpoint)::

    b"JESCKPT1" | payload length (u64, little endian) | sha256(payload) (32 bytes) | payload

The payload is msgpack (``flax.serialization``) of ``{"meta": <JSON text>,
"state": <TrainState as a state dict of arrays>, "history": {name: array},
"key": <uint32 run key data>}``. ``meta`` describes the run (policy class and
fields, env name, optimizer name, config, parameter count, generation) so a
checkpoint can be verified against a trainer, or a trainer rebuilt from it.

A save writes a temporary file in the same directory, fsyncs it and
``os.replace``\\ s it over the target, so a crash or an error midway leaves the
previous checkpoint as it was. A truncated or corrupted file fails the length
or checksum test and :func:`read` says so, naming the file. Ctrl-C (and a SIGTERM
that Python handles, as ``jes train``'s) during a save waits for the save to
finish and is raised after it (:func:`interrupts_deferred`); SIGKILL leaves the
previous checkpoint.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import socket
import struct
import sys
import tempfile
import time
import warnings
import weakref
from typing import Any, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from jes import describe, schema, strategies
from jes.atomic import file_mode
from jes.interrupts import interrupts_deferred  # noqa: F401  (jes.checkpoint.interrupts_deferred, as before)

try:
    import fcntl
except ImportError:  # Windows: runs take no lock on their checkpoints (WriterLock)
    fcntl = None
from jes.config import ESConfig
from jes.generation import Trainer, TrainState, as_key, localize
from jes.envs import brax as brax_envs
from jes.envs import gymnasium as gymnasium_envs
from jes.envs import gymnax as gymnax_envs
from jes.envs.wrappers import KEEP_OPTION, nan_option, split_option, with_option
from jes.optimizers import resolve_name as resolve_optimizer_name
from jes.rollout import OBS_EPS

MAGIC = b"JESCKPT1"
# 2: the strategy's state under state['strategy'], policy fields in the jes.describe form (format 1 is upgraded
# on read). 3: PGPE's default ClipUp step follows the search radius (format <= 2 files keep the old 0.15).
# 4: sep-CMA-ES's policy defaults mean_lr 10/1.5, sigma_scale 1.5, unbiased_csa (format <= 3 files keep 10, 1, False).
# 5: SNES's policy defaults mean_lr 20, linear_utilities (format <= 4 files keep 10, False).
# 6: a Box action space with some bounds infinite maps each dimension by its own bounds (format <= 5 runs gave it the
# raw outputs: a resume of one warns, jes.loop.train).
# 7: a gymnax env's changed params and registered id are in its name ("CartPole-v1?gravity=20.0"; format <= 6 files
# named the bare id or the env's own name: Checkpoint.names_env accepts those with a warning).
# 8: a brax env's actions are in [-1, 1], brax's action space (format <= 7 runs squashed them into the actuators'
# ctrl_range, which humanoid, humanoidstandup, inverted_pendulum and pusher then scaled again: restore_state warns).
# 9: a strategy that is not the class registered under its name (your own, or a subclass that keeps its parent's name)
# records its class, "module:qualname" (format <= 8 files record none: a resume of one with a class of your own warns
# that it cannot check; a format 9 file without a class ran the registered class, and a resume with another is refused).
FORMAT_VERSION = 9
_HEADER = struct.Struct("<8sQ32s")
# Config fields that do not change what the parameters become, so a resumed run may change them.
RESUMABLE_CONFIG_CHANGES = frozenset({"num_generations", "stop_at_return", "eval_every", "eval_episodes"})
# Config fields a resumed run may change although they change what follows (jes.train warns and applies them).
RESUMABLE_WITH_WARNING = frozenset({"learning_rate"})


class CheckpointError(ValueError):
    """A checkpoint file is unreadable, corrupt, or does not match the run it is loaded into."""


# ------------------------------------------------------------------ description
def describe_policy(policy: nn.Module) -> dict:
    """``{"class": "module:QualName", "fields": {...}}`` of a Flax module, JSON-able (see :mod:`jes.describe`).

    Field values that cannot be rebuilt by name (a lambda activation) are recorded, not refused, so
    such a run can still be checkpointed and resumed into a trainer you build yourself: a lambda or nested
    function by its module, qualified name, first line, code hash and the plain data it closes over
    (:func:`jes.describe.code_name`), which ``resume=`` in another process matches.
    """
    return describe.describe_object(policy, "policy", lenient=True)


def warn_unresumable(policy: nn.Module, path: str) -> None:
    """Warn, as a run starts, when its checkpoint at ``path`` will record a field of ``policy`` by a memory address
    (a closure over an object, a callable object): ``resume=`` in another process could never match it."""
    fields = describe.unstable_fields(describe_policy(policy))
    if fields:
        warnings.warn(f"checkpoint {path} will record {', '.join(fields)} by its memory address, which differs in "
                      f"every process: resume= in another process will refuse it. Use a module-level function (or a "
                      f"lambda closing over plain data only), or restore it into a trainer you build: "
                      f"jes.checkpoint.read(path).restore_state(trainer)", stacklevel=3)


def _upgrade_v1(value: Any) -> Any:
    """A format-1 policy field value (lists, ``{"callable"}``, ``{"repr"}``) in the :mod:`jes.describe` form."""
    if isinstance(value, list):  # format 1 stored tuples (Flax freezes list fields to tuples) as lists
        return {"__seq__": [_upgrade_v1(v) for v in value], "tuple": True}
    if isinstance(value, dict) and "callable" in value:
        path = value["callable"]
        return {"__unimportable__": path} if "<" in path else {"__callable__": path}
    if isinstance(value, dict) and "repr" in value:
        return {"__repr__": value["repr"]}
    return value


def _keep_old_pgpe_step(meta: dict) -> None:
    """Format <= 2: PGPE's default ClipUp step was 0.15; pin it, so that a rebuilt run continues as it started."""
    strategy, config = meta.get("strategy") or {}, meta.get("config") or {}
    fields = strategy.get("fields") or {}
    optimizer = meta.get("optimizer")
    if (strategy.get("name") == "pgpe" and fields.get("center_lr", 0) is None and config.get("learning_rate") is None
            and "learning_rate" not in (meta.get("config_schedules") or ()) and isinstance(optimizer, str)
            and optimizer.lower() == "clipup"):
        fields["center_lr"] = 0.15


# Policy defaults a strategy had before a format version, for files written earlier: {version: (name, fields)}.
# Fields the file left unset (or did not have) are pinned to these, so a rebuilt run continues as it started
# and today's defaults are refused by check_compatible.
_OLD_POLICY_DEFAULTS = {
    # Format 4: sep-CMA-ES's mean_lr 10 -> 10/1.5, sigma 1.5 x noise_std, CSA without p_sigma's start-up bias.
    4: ("sep_cma_es", {"mean_lr": 10.0, "sigma_scale": 1.0, "unbiased_csa": False}),
    # Format 5: SNES's mean_lr 10 -> 20, the paper's log utilities -> centred linear ranks.
    5: ("snes", {"mean_lr": 10.0, "linear_utilities": False}),
}


# The default chunk of a low-rank run before files recorded the chunk they ran (2026-12-03): up to this many
# members, and at most this many floats of draws (jes.perturbations.low_rank.CHUNK_SIZE has today's rule).
_OLD_LOW_RANK_CHUNK = (2048, 2 ** 26)


def _check_chunk_size(meta: dict, path: str) -> None:
    """The recorded chunk size against the file's own config (an edited or corrupt file: a chunk of 2^30
    members would pad a generation to that many)."""
    ran, config = meta.get("chunk_size"), meta["config"]
    if ran is None:
        return
    given, members = config.get("chunk_size"), config.get("num_members")
    antithetic = config.get("antithetic", True)
    if given is not None:
        fits, need = ran == given, f"its config's chunk_size {given!r}"
    else:
        fits = isinstance(members, int) and ran <= members + 1 and not (antithetic and ran % 2)
        need = f"its config's num_members {members!r}{' (whole mirrored pairs: an even chunk)' if antithetic else ''}"
    if not fits:
        raise CheckpointError(f"checkpoint {path} is inconsistent: it records chunks of {ran} members, which does not "
                              f"fit {need}; the file was edited or is corrupt: use an earlier checkpoint")


def _keep_old_policy_defaults(meta: dict) -> None:
    """Pin the policy defaults of every :data:`_OLD_POLICY_DEFAULTS` change newer than the file."""
    strategy = meta.get("strategy") or {}
    for version, (name, old) in _OLD_POLICY_DEFAULTS.items():
        if meta.get("version", 0) < version and strategy.get("name") == name:
            fields = strategy.setdefault("fields", {})
            for field, value in old.items():
                if fields.get(field) is None:
                    fields[field] = value


def checkpoint_allowlist(policy_class: str, allow_modules: Any = ()) -> describe.Allowlist:
    """What a file may build: :func:`jes.describe.allowlist` (the registry) plus ``allow_modules``, plus
    the file's policy class itself *if your program has already imported its module* (and it is not part
    of Python's standard library or a library package such as flax).

    A checkpoint or ``.policy`` file may come from anyone, so it names only registered code
    (:mod:`jes.describe`): a module that is not imported yet is never imported on a file's say-so, and
    of an imported module only the one policy class is admitted (it must be a ``flax.linen.Module``
    subclass defined there), not its functions: pass ``allow_modules=["mypkg.policies"]`` (CLI:
    ``--allow-module``) to admit the rest of your module.
    """
    allow = describe.allowlist(allow_modules)
    module = policy_class.partition(":")[0] if isinstance(policy_class, str) else ""
    root = module.split(".", 1)[0]
    if module in sys.modules and root not in sys.stdlib_module_names and not allow.allows(module):
        allow = allow.with_class(policy_class)
    return allow


def build_policy(description: dict, path: str = "<checkpoint>", allow_modules: Any = (),
                 checkpoint: bool = True) -> nn.Module:
    """The policy module a :func:`describe_policy` description names, built within :func:`checkpoint_allowlist`.

    ``checkpoint``: the description is a checkpoint's (a failure then suggests restoring its state into a trainer
    built by hand), not a ``.policy`` file's.
    """
    allow = checkpoint_allowlist(describe.policy_class_of(description), allow_modules)
    try:
        return describe.build_object(description, allow, "policy", role="policy")
    except describe.DescriptionError as err:
        if isinstance(description, dict) and str(description.get("class", "")).startswith("__main__:"):
            raise CheckpointError(
                f"{path}: cannot rebuild the policy: its class {description['class'].split(':', 1)[1]} was defined in "
                f"the script or notebook that trained it (__main__), which no other program can import. Resume or "
                f"evaluate it from there (jes.train(policy, env, ..., resume=path); jes.checkpoint.read(path)"
                f".restore_state(trainer)), or move the class to a module of its own for the next run") from err
        advice = []
        # Opting a module in mends only a refusal of a module that can be opted in: not a registered class that
        # refuses its fields, a class of the wrong role, or a library's class outside the registry.
        if isinstance(err, describe.NotAllowedError) and err.can_opt_in:
            advice.append("Import your policy's module first or pass allow_modules=[...] (CLI: --allow-module MODULE)")
        if checkpoint:
            advice.append(f"{'or build' if advice else 'Build'} the Trainer yourself and use "
                          f"jes.checkpoint.read(path).restore_state(trainer)")
        tail = (". " + ", ".join(advice)) if advice else ""
        raise CheckpointError(f"{path}: cannot rebuild the policy: {err}{tail}") from err


def _registered_class(name: Any) -> str | None:
    """``"module:qualname"`` of the strategy class registered as ``name`` (``None``: no registered strategy)."""
    key = strategies.canonical_name(name) if isinstance(name, str) else None
    return None if key is None else _class_path(strategies.REGISTRY[key])


def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def strategy_class(description: dict | None) -> str | None:
    """The class a :func:`describe_strategy` description ran: its recorded ``"class"``, else (a registered strategy,
    or a file from before classes were recorded) the class registered under its name; ``None`` where neither says."""
    description = description or {"name": "openai_es"}
    return description.get("class") or _registered_class(description.get("name"))


def describe_strategy(strategy: Any) -> dict:
    """``{"name": "pgpe", "fields": {...}}``: a registered strategy by name with its (plain) hyperparameters.

    A strategy of another class (your own, or a subclass of a registered one that keeps its name) also records
    ``"class": "module:qualname"``, so that a resume with another class is refused; it is only compared, never
    imported (:func:`build_strategy` builds registered strategies only). Registered strategies record no class:
    their descriptions are, byte for byte, those files recorded before format 9.
    """
    description = {"name": strategy.name,
                   "fields": {f.name: getattr(strategy, f.name) for f in dataclasses.fields(strategy)}}
    path = _class_path(type(strategy))
    if path != _registered_class(strategy.name):
        description["class"] = path
    return description


def rebuilds_strategy(description: dict | None) -> bool:
    """Whether :func:`build_strategy` can rebuild the strategy ``description`` names: a registered one, not a class
    of your own (a file names no code)."""
    if description is None:
        return True
    registered = _registered_class(description.get("name"))
    return registered is not None and strategy_class(description) == registered


def build_strategy(description: dict | None, path: str = "<checkpoint>") -> Any:
    """The strategy a :func:`describe_strategy` description names (``None``: OpenAI-ES, as in format 1).

    Only registered strategies by name, with plain-number/string hyperparameters: a file names no code. A recorded
    class of your own is never imported or built: the error says how to restore the run into a trainer of yours.
    """
    if description is None:
        return strategies.get("openai_es")
    if not rebuilds_strategy(description):
        name, cls = description.get("name"), description.get("class")
        ran = f"strategy {name!r}" + (f" of class {cls}" if cls else "")
        why = ("a class of your own" if cls else
               f"unknown strategy {name!r}; this jes registers {', '.join(strategies.names())}")
        raise CheckpointError(
            f"checkpoint {path} ran {ran} ({why}): a file names no code, so jes rebuilds only registered strategies. "
            f"Build the Trainer with your strategy object and restore the run into it: "
            f"jes.checkpoint.read(path).restore_state(jes.Trainer(policy, env, optimizer, config, "
            f"strategy=YourStrategy(...))), or resume it with jes.train(..., strategy=YourStrategy(...), resume=path); "
            f"`jes eval path` and jes.checkpoint.read(path).centre_for_evaluation() evaluate its centre without it")
    fields = description.get("fields", {})
    if not all(v is None or isinstance(v, (bool, int, float, str)) for v in fields.values()):
        raise CheckpointError(f"strategy hyperparameters must be plain values, got {fields!r}")
    try:
        return strategies.get(str(description["name"]), **fields)
    except Exception as err:  # noqa: BLE001 - a hyperparameter the strategy refuses
        raise CheckpointError(f"cannot rebuild the strategy {description!r}: {err}") from err


def describe_run(trainer: Trainer) -> dict:
    """What a checkpoint records about the run, to verify or rebuild it."""
    config = trainer.config
    return {
        "strategy": describe_strategy(trainer.strategy),
        "policy": describe_policy(trainer.policy),
        "env_name": trainer.spec.name,
        "obs_shape": list(trainer.spec.obs_shape),
        "optimizer": trainer.optimizer_name,
        "num_params": trainer.num_params,
        "config": config.to_dict(),
        "config_schedules": sorted(f.name for f in dataclasses.fields(config) if callable(getattr(config, f.name))),
        # the members per chunk the run evaluated (the chunk decides the bits; config.chunk_size may be None,
        # and the default it stood for can change between jes versions)
        "chunk_size": trainer.chunk_size,
    }


# ------------------------------------------------------------------ file format
def _state_dict(state: TrainState) -> dict:
    state = localize(state)  # a multi-process run's state: this process's replica
    host = jax.device_get(state.replace(es_key=jax.random.key_data(state.es_key)))
    return serialization.to_state_dict(jax.tree.map(np.asarray, host))


def _best_dict(best: Any) -> dict:
    if isinstance(best, dict):  # a checkpoint's own (Checkpoint.best, as jes.checkpoint.read gives it)
        stats = best.get("obs_stats")
        return {"fitness": np.asarray(best["fitness"], np.float64), "generation": np.asarray(best["generation"], np.int64),
                "member": np.asarray(best["member"], np.int64),
                "flat_params": np.asarray(best["flat_params"], np.float32),
                **({"obs_stats": {str(i): np.asarray(stats[str(i)]) for i in range(3)}} if stats else {})}
    stats = best.policy.obs_stats if best.policy is not None else None
    return {"fitness": np.asarray(best.fitness, np.float64), "generation": np.asarray(best.generation, np.int64),
            "member": np.asarray(best.member, np.int64),
            "flat_params": np.asarray(best.flat_params, np.float32),
            **({"obs_stats": {str(i): np.asarray(x) for i, x in enumerate(stats)}} if stats is not None else {})}


def _write_payload(f, payload: bytes) -> None:
    """Write header and payload to an open file (a seam the tests use to simulate a failing disk)."""
    f.write(_HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest()))
    f.write(payload)


def save(path: str, trainer: Trainer, state: TrainState, history: dict | None = None, key: Any = 0,
         best: Any = None) -> str:
    """Write a checkpoint of ``state`` (and the run's history and key) to ``path``, atomically.

    Args:
        path: target file; its directory is created if missing.
        trainer: the trainer that produced ``state`` (its description goes into the file).
        state: the :class:`TrainState` after ``state.generation`` generations.
        history: per-generation lists or arrays (rows past ``state.generation`` are dropped).
        key: the run key (int seed, typed key or ``uint32`` key data).
        best: the run's best member so far (:class:`jes.loop.BestMember`, or a checkpoint's own
            :attr:`Checkpoint.best`), kept across a resume.

    Returns:
        ``path``. If anything fails, the previous file at ``path`` is left untouched.
    """
    with interrupts_deferred():  # a Ctrl-C mid-save would drop it (seconds, when the best member compiles)
        return _save(path, trainer, state, history, key, best)


def _best_generation(best: Any) -> int:
    """The generation of ``best``: a :class:`jes.loop.BestMember` or a checkpoint's best dict (checked here, before
    anything is written)."""
    if isinstance(best, dict):
        missing = sorted({"fitness", "generation", "member", "flat_params"} - best.keys())
        if missing:
            raise TypeError(f"best must be a run's best member (result.best) or a checkpoint's (jes.checkpoint.read("
                            f"path).best), got a dict without {', '.join(missing)}")
        return int(best["generation"])
    if not all(hasattr(best, a) for a in ("fitness", "generation", "member", "flat_params", "policy")):
        raise TypeError(f"best must be a run's best member (result.best) or a checkpoint's (jes.checkpoint.read("
                        f"path).best), got {type(best).__name__}")
    return int(best.generation)


def _save(path: str, trainer: Trainer, state: TrainState, history: dict | None, key: Any, best: Any) -> str:
    generation = int(state.generation)
    history = history or {}
    gens = np.asarray(history.get("generation", []))
    keep = gens <= generation if gens.size else slice(None)
    history_arrays = {k: np.asarray(v)[keep] if len(v) == len(gens) else np.asarray(v) for k, v in history.items()}
    run_key = as_key(key)
    meta = dict(
        describe_run(trainer), format="jes-checkpoint", version=FORMAT_VERSION, generation=generation,
        key_impl=str(jax.random.key_impl(run_key)), es_key_impl=str(jax.random.key_impl(state.es_key)),
        saved_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    payload = serialization.msgpack_serialize({
        "meta": json.dumps(meta),
        "state": _state_dict(state),
        "history": history_arrays,
        "key": np.asarray(jax.random.key_data(run_key)),
        **({"best": _best_dict(best)} if best is not None and _best_generation(best) <= generation else {}),
    })

    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    prefix = f".{os.path.basename(path)}."
    started = time.time()
    tmp = None
    try:
        # Inside the try: a Ctrl-C landing in mkstemp right after it created the file still removes it.
        fd, tmp = tempfile.mkstemp(prefix=prefix + _temp_owner() + ".", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "wb") as f:
            _write_payload(f, payload)
            f.flush()
            os.fsync(f.fileno())
        # As other files (a 0600 checkpoint kept a shared run from its group), or as the file it replaces was
        os.chmod(tmp, file_mode(path))
        os.replace(tmp, path)
    except BaseException:
        if tmp is None:  # interrupted inside mkstemp: the file may exist without our knowing its name
            _remove_stale_temp_files(directory, prefix, newer_than=started - 1.0)
        else:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        raise
    # Temp files of earlier saves killed midway (kill -9, power loss) are never renamed: sweep them.
    _remove_stale_temp_files(directory, prefix, older_than=started)
    try:  # make the rename itself durable
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the file itself is synced
    return path


# A save's temp file is named ``.<name>.<pid>@<host>.<random>.tmp``: the sweep of leftovers removes only those of
# processes that are gone, never another live writer's save in flight (two runs saving to one path).
FOREIGN_TEMP_AGE = 24 * 3600.0  # seconds after which a temp file of another host (a shared filesystem) is stale


def _host() -> str:
    return socket.gethostname().replace(".", "_")  # no dots: they separate a temp name's parts


def _temp_owner() -> str:
    return f"{os.getpid()}@{_host()}"


def _owner_gone(owner: str) -> bool | None:
    """Whether the process ``pid@host`` has ended (``None``: another host's, or a name without an owner)."""
    pid, _, host = owner.partition("@")
    if not pid.isdigit() or host != _host():
        return None
    if int(pid) == os.getpid():
        return True  # this process's own: none of its saves is in flight while it sweeps
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def _remove_stale_temp_files(directory: str, prefix: str, older_than: float | None = None,
                             newer_than: float | None = None) -> None:
    """Remove leftovers of saves killed midway: ``<prefix>...tmp`` files in ``directory`` of processes that are gone
    (this one's included; and those of a jes that named no owner), modified before ``older_than`` / after
    ``newer_than``; another host's only after ``FOREIGN_TEMP_AGE``; a live process's never."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    now = time.time()
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        full = os.path.join(directory, name)
        parts = name[len(prefix):-len(".tmp")].split(".")  # ours: [random] (older jes) or [pid@host, random]
        if len(parts) > 2 or (len(parts) == 2 and "@" not in parts[0]):
            continue  # another path's: ".ckpt.bak.<...>.tmp" also starts with ".ckpt."
        owner = parts[0]
        gone = _owner_gone(owner)
        try:
            mtime = os.stat(full).st_mtime
            if gone is False or (gone is None and "@" in owner and mtime > now - FOREIGN_TEMP_AGE):
                continue  # a save in flight (another run writing the same path), or possibly one
            if (older_than is not None and mtime < older_than) or (newer_than is not None and mtime >= newer_than):
                os.unlink(full)
        except OSError:
            pass  # gone already, or not ours to remove


# ------------------------------------------------------------------ the writer's lock
LOCK_SUFFIX = ".jes-lock"  # the lock of checkpoint PATH is PATH.jes-lock (not PATH.lock: filelock's, a job script's own)
_LOCK_ATTEMPTS = 20  # lock files found removed by the run that held them (ending as this one starts) before giving up
_HELD_LOCKS: "weakref.WeakSet[WriterLock]" = weakref.WeakSet()  # this process's held locks, for _close_in_child


def _close_in_child() -> None:
    """After ``fork()`` (without exec: multiprocessing's "fork", a callback's background process), close the child's
    copy of every held lock's descriptor: a ``flock`` belongs to the open file, which the child shares, so a child
    outliving a killed run would keep its checkpoint locked. Closing a copy leaves the parent's lock as it is (only
    ``LOCK_UN``, or closing the last copy, ends it); the child holds nothing and never removes the file."""
    for lock in list(_HELD_LOCKS):
        lock._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


class CheckpointInUseError(OSError):
    """Another run is writing the checkpoint (it holds the lock beside it): a second run writing it too would overwrite
    that run's saves with its own, and the last writer's would be all that is kept.

    Attributes:
        path: the checkpoint.
        holder: who holds it, as its lock file says (``"pid 4242 on host node7, since 2026-05-01 10:00:00"``), or
            ``None`` when it says nothing yet.
    """

    def __init__(self, message: str, path: str | None = None, holder: str | None = None):
        super().__init__(message)  # one argument: the message as it is, no "[Errno n]"
        self.path, self.holder = path, holder

    def __reduce__(self):  # copy / pickle (multiprocessing, joblib) with the attributes
        return type(self), (self.args[0], self.path, self.holder)


class WriterLock:
    """The lock a run holds on its checkpoint while it writes it (:func:`jes.train` and :func:`jes.run` take it):
    ``<checkpoint>.jes-lock`` beside the file, locked with ``flock`` and naming its holder (pid, host, start).

    The operating system releases a ``flock`` when its process ends, however it ends: a run killed with ``kill -9``
    leaves its lock file, never a lock, and the next run takes the file over. Processes forked without exec close their copy of
    the descriptor (a ``flock`` belongs to the open file they share), and a lock dropped while held closes its own. :meth:`release` removes the file while it
    still holds it, so a run that opened the file meanwhile finds it gone when it gets the lock, and opens a new one
    (two runs never hold two files of one name). Without ``fcntl`` (Windows) nothing is locked; on a filesystem that
    takes no locks the run is warned once and goes on unlocked; a folder that cannot take the file is left to the
    run's own check of its folders (or its first save) to report.
    """

    def __init__(self, checkpoint_path: str, resuming: bool = False):
        self.checkpoint_path = checkpoint_path
        self.path = checkpoint_path + LOCK_SUFFIX
        self.resuming = resuming  # a resumed run's (it writes the file it resumes from): the refusal's advice differs
        self._fd: int | None = None
        self._closer: weakref.finalize | None = None  # closes the descriptor of a lock dropped while held
        self._made: list[str] = []  # folders made for the lock file, outermost first: removed with it when empty

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "WriterLock":
        """Take the lock (a no-op when held, or where nothing can be locked).

        Raises:
            CheckpointInUseError: another process (or another run of this one) holds it; the message names it.
        """
        if fcntl is None or self._fd is not None:
            return self
        folder = os.path.dirname(os.path.abspath(self.path))
        missing = []
        while not os.path.isdir(folder) and not os.path.lexists(folder):
            missing.insert(0, folder)
            folder = os.path.dirname(folder)
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        except OSError:
            return self
        self._made = missing
        fd = None  # the descriptor being tried: closed on any way out that does not hold it (a Ctrl-C included)
        try:
            for _ in range(_LOCK_ATTEMPTS):
                fd, writable = self._open()
                if fd is None:
                    if not os.path.isdir(os.path.dirname(os.path.abspath(self.path))):
                        try:  # removed meanwhile (another run's empty folder, removed as it ended): make it again
                            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                            continue
                        except OSError:
                            pass
                    break  # a folder that takes no file: the run's folder check (or its first save) says so
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = _lock_holder(fd)
                    os.close(fd)
                    fd = None
                    raise self._in_use(holder) from None
                except OSError as err:  # ENOLCK, EOPNOTSUPP: a filesystem without locks (some network ones)
                    try:
                        if writable and os.fstat(fd).st_size == 0 and self._names(fd):
                            os.unlink(self.path)  # made just now (a holder names itself): nothing to leave behind
                    except OSError:
                        pass
                    os.close(fd)
                    fd = None
                    self._warn_unlocked(f"cannot lock {self.path} ({err.strerror or err}): this filesystem takes no "
                                        f"file locks")
                    break
                if not self._names(fd):  # removed by the run that held it, as it ended: take the file there now
                    os.close(fd)
                    fd = None
                    continue
                if not writable:  # another user's file, left by a killed run: replace it with one naming this run
                    try:
                        os.unlink(self.path)
                    except OSError:  # a folder that keeps others' files (/tmp's sticky bit): hold it as it is
                        self._hold(fd)
                        return self
                    os.close(fd)
                    fd = None
                    continue
                self._hold(fd)
                try:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}, since "
                                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
                except OSError:  # a full disk: locked all the same, only nameless
                    pass
                return self
            else:  # every try found the file removed as it was locked: runs starting and ending on it without end
                self._warn_unlocked(f"cannot lock {self.path}: it was removed each of the {_LOCK_ATTEMPTS} times "
                                    f"it was locked (other runs starting and ending on this checkpoint)")
        except BaseException:
            if self._fd is not None:  # held, then interrupted while naming itself (a Ctrl-C): let it go again
                self.release()
            elif fd is not None:
                os.close(fd)
            raise
        finally:
            if self._fd is None:
                self._remove_made_folders()
        return self

    def release(self) -> None:
        """Remove the lock file and release the lock (a no-op when not held)."""
        fd = self._forget(close=False)
        if fd is not None:
            try:
                if self._names(fd):  # not a file someone put there after removing this one by hand
                    os.unlink(self.path)  # before the lock ends: see the class
            except OSError:
                pass
            finally:
                os.close(fd)
        self._remove_made_folders()

    def __enter__(self) -> "WriterLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def _hold(self, fd: int) -> None:
        self._fd = fd
        # A backstop: a lock dropped while held (a window no release reached) closes its descriptor, ending the lock
        self._closer = weakref.finalize(self, _close_quietly, fd)
        _HELD_LOCKS.add(self)

    def _forget(self, close: bool = True) -> int | None:
        """Stop holding: the descriptor, closed (``close``) or returned for the caller to close."""
        fd, self._fd = self._fd, None
        if self._closer is not None:
            self._closer.detach()
            self._closer = None
        _HELD_LOCKS.discard(self)
        if fd is not None and close:
            _close_quietly(fd)
            return None
        return fd

    def _warn_unlocked(self, why: str) -> None:
        warnings.warn(f"{why}, so jes cannot keep another run from writing checkpoint {self.checkpoint_path} at the "
                      f"same time (the last writer's saves would be all that is kept); the run goes on unlocked: make "
                      f"sure no other run writes it", stacklevel=5)

    def _open(self) -> tuple[int | None, bool]:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666), True  # the umask applies
        except PermissionError:  # another user's lock file: a lock needs no write access
            try:
                return os.open(self.path, os.O_RDONLY), False
            except OSError:
                return None, False
        except OSError:
            return None, False

    def _names(self, fd: int) -> bool:
        """Whether the lock file's name still names the file ``fd`` has open."""
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.path))
        except OSError:
            return False

    def _remove_made_folders(self) -> None:
        for folder in reversed(self._made):
            try:
                os.rmdir(folder)  # only while empty: a refused run leaves no folder it made, a run that saved keeps it
            except OSError:
                break
        self._made = []

    def _in_use(self, holder: str | None) -> CheckpointInUseError:
        host = socket.gethostname()
        mine = holder is not None and holder.startswith(f"pid {os.getpid()} on host {host},")
        who = f"{holder}{': this process' if mine else ''}" if holder else "its holder has not named itself yet"
        gone = _gone_pid(holder, host) if holder and not mine else None
        if gone is not None:
            who += (f"; pid {gone} is gone, and a process it started (a forked child) still holds the lock: "
                    f"`fuser -v {self.path}` names it")
        if self.resuming:
            advice = ("A resumed run writes the checkpoint it resumes from: let that run end (or stop it) before "
                      "resuming it, or give this resumed run its own checkpoint_path (it reads the checkpoint and "
                      "writes its saves there)")
        else:
            advice = ("Let that run end (or stop it) before running on this checkpoint, or give this run another "
                      "log_dir (or checkpoint_path)")
        return CheckpointInUseError(
            f"checkpoint {self.checkpoint_path!r} is in use: another run is writing it ({who}). Two runs writing one "
            f"checkpoint overwrite each other's saves, and the last writer's are all that is kept. {advice}. "
            f"(A run holds {self.path!r} while it writes the checkpoint; the lock ends with its process and the "
            f"processes it forked, however they end.)", path=self.checkpoint_path, holder=holder)


def _gone_pid(holder: str, host: str) -> int | None:
    """The pid a lock file names, where it was on this host and no process has it now; else ``None``."""
    m = re.match(r"pid (\d+) on host (.*), since ", holder)
    if m is None or m.group(2) != host:
        return None
    try:
        os.kill(int(m.group(1)), 0)
    except ProcessLookupError:
        return int(m.group(1))
    except (OSError, OverflowError, ValueError):  # another user's (EPERM): alive
        return None
    return None


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _lock_holder(fd: int) -> str | None:
    """What a lock file says of its holder (one line of printable text), or ``None``."""
    try:
        text = os.pread(fd, 300, 0).decode("utf-8", "replace")
    except OSError:
        return None
    line = "".join(c for c in text.split("\n", 1)[0] if c.isprintable()).strip()[:200]
    return line or None


@dataclasses.dataclass
class Checkpoint:
    """A checkpoint as read from disk (integrity checked, not yet matched to a trainer).

    Attributes:
        path: the file.
        meta: the run description (see :func:`describe_run`) plus ``generation``, ``version``.
        state_dict: the training state as nested dicts of numpy arrays.
        history: per-generation numpy arrays (as in ``TrainResult.history``).
        key: ``uint32`` data of the run key.
        best: the run's best member as the file keeps it (``fitness``, ``generation``, ``member``, ``flat_params``,
            ``obs_stats``), or ``None``: pass it on to a resumed run, ``jes.run(..., best=checkpoint.best)``.
    """

    path: str
    meta: dict
    state_dict: dict
    history: dict
    key: np.ndarray
    best: dict | None = None

    def __repr__(self) -> str:
        # The dataclass repr printed every history array (45 k characters for 300 generations in a notebook cell)
        return (f"Checkpoint({self.path!r}: {self.env_name}, generation {self.generation}, "
                f"{len(self.history.get('generation', ()))} history rows, "
                f"{'a best member' if self.best else 'no best member'})")

    @property
    def generation(self) -> int:
        return int(self.meta["generation"])

    @property
    def env_name(self) -> str:
        return self.meta["env_name"]

    @property
    def optimizer(self) -> str:
        return self.meta["optimizer"]

    @property
    def run_key(self) -> jax.Array:
        """The run key as a typed key."""
        try:
            return jax.random.wrap_key_data(jnp.asarray(self.key), impl=self.meta["key_impl"])
        except Exception as err:  # noqa: BLE001 - key data of another shape than its implementation's
            raise CheckpointError(f"checkpoint {self.path}: its run key does not fit {self.meta['key_impl']}: {err}") from err

    def chunk_size_ran(self, trainer: Trainer | None = None) -> int | None:
        """The members per chunk the file's run evaluated, where its config alone does not say (``None``: its
        ``config.chunk_size`` says it, or the default it stood for is today's).

        Recorded by files since jes recorded it. For earlier low-rank files that left the chunk to jes, the
        default of the jes that wrote them (up to 2,048 members, at most 2^26 floats of draws; see
        :data:`_OLD_LOW_RANK_CHUNK`), from ``trainer``'s layout (the same policy and rank)."""
        if self.meta.get("chunk_size") is not None:
            return self.meta["chunk_size"]
        config = self.meta["config"]
        if trainer is None or config.get("chunk_size") is not None or config.get("perturbation") != "low_rank" \
                or not trainer.perturbation.structured or trainer.spec.host:
            return None
        most, floats = _OLD_LOW_RANK_CHUNK
        return trainer.fit_chunk_size(max(2, min(most, floats // max(1, trainer.ctx.layout.draw_size))))

    def config(self) -> ESConfig:
        """The run's :class:`ESConfig` (fails for runs that used schedules, which cannot be stored)."""
        if self.meta["config_schedules"]:
            raise CheckpointError(
                f"{self.path}: the run used schedule(s) for {', '.join(self.meta['config_schedules'])}, which a "
                f"checkpoint cannot store; build the Trainer with the same config yourself and call "
                f"jes.checkpoint.read(path).restore_state(trainer)"
            )
        fields = dict(self.meta["config"])
        if fields.get("perturbation", "full_rank") == "full_rank":
            fields["perturbation_rank"] = 1  # ignored by full-rank runs; older jes stored a --rank given without low_rank
        try:
            return ESConfig(**fields)
        except Exception as err:  # noqa: BLE001 - unknown fields or values a config refuses
            raise CheckpointError(f"checkpoint {self.path}: its config cannot be rebuilt: {type(err).__name__}: {err}") from err

    def policy(self, allow_modules: Any = ()) -> nn.Module:
        """The policy module, rebuilt from its recorded class and fields (see :func:`checkpoint_allowlist`)."""
        return build_policy(self.meta["policy"], self.path, allow_modules)

    def build_trainer(self, devices: Any = None, allow_modules: Any = (), **config_changes: Any) -> Trainer:
        """A :class:`Trainer` for the recorded policy, env, optimizer and config (``config_changes`` applied).

        ``allow_modules``: packages besides jes's defaults the policy may come from (see :func:`checkpoint_allowlist`).
        """
        config = self.config()
        if config_changes:
            config = config.replace(**config_changes)
        policy, strategy = self.policy(allow_modules), build_strategy(self.meta.get("strategy"), self.path)
        build = lambda c: Trainer(policy, self.env_name, self.optimizer, c, devices=devices, strategy=strategy)
        try:
            trainer = build(config)
            ran = self.chunk_size_ran(trainer)  # a default chunk that has changed since: the run's own, as it ran
            if config.chunk_size is None and ran is not None and ran != trainer.chunk_size:
                trainer = build(config.replace(chunk_size=ran))
        except Exception as err:  # noqa: BLE001 - an env, optimizer or policy this jes cannot build
            raise CheckpointError(f"checkpoint {self.path}: cannot rebuild its run: {type(err).__name__}: {err}") from err
        if trainer.num_params != self.meta["num_params"]:
            raise CheckpointError(f"checkpoint {self.path}: its policy has {trainer.num_params} parameters here, the "
                                  f"file says {self.meta['num_params']}")
        return trainer

    def rebuilds_its_optimizer(self) -> bool:
        """Whether :meth:`build_trainer` can rebuild the run as it ran: an optimizer given by name, no schedules
        (an optax object or a schedule is not data a file can hold)."""
        if self.meta["config_schedules"]:
            return False
        try:
            return self.optimizer is None or bool(resolve_optimizer_name(self.optimizer))
        except ValueError:
            return False

    def rebuilds_its_strategy(self) -> bool:
        """Whether :meth:`build_trainer` can rebuild the run's strategy: a registered one (a strategy class of your
        own is recorded by name and class, which a file never imports)."""
        return rebuilds_strategy(self.meta.get("strategy"))

    def centre_for_evaluation(self, devices: Any = None, allow_modules: Any = ()) -> tuple[Trainer, TrainState]:
        """A trainer and state that evaluate (and render) the run's centre as the run did, also for a run whose
        optimizer, schedules or strategy (a class of your own) no file can rebuild: those are stood in for
        (``"sgd"``, constants, OpenAI-ES), which evaluation never reads; the centre, the observation statistics and
        the generation are the file's. Not for resuming (its optimizer and strategy state are not the run's)."""
        if self.rebuilds_its_optimizer() and self.rebuilds_its_strategy():
            trainer = self.build_trainer(devices=devices, allow_modules=allow_modules)
            return trainer, self.restore_state(trainer)
        fields = dict(self.meta["config"])
        for name in self.meta["config_schedules"]:
            fields[name] = ESConfig.__dataclass_fields__[name].default
        policy = self.policy(allow_modules)
        # Evaluation reads the centre (every strategy's state has its ``mean``), never the strategy
        strategy = build_strategy(self.meta.get("strategy"), self.path) if self.rebuilds_its_strategy() \
            else strategies.get("openai_es")
        if not self.rebuilds_its_strategy() and _collected_obs_stats(self.state_dict):
            # Whether a run normalises is its strategy's say (Strategy.uses_obs_norm, which a class of your own may
            # override), not the config's alone: statistics only move in a run that normalised
            fields["normalize_observations"] = True
        optimizer = "sgd" if strategy.uses_optimizer else None
        try:
            trainer = Trainer(policy, self.env_name, optimizer, ESConfig(**fields), devices=devices, strategy=strategy)
        except Exception as err:  # noqa: BLE001 - an env or policy this jes cannot build
            raise CheckpointError(f"checkpoint {self.path}: cannot rebuild its run: {type(err).__name__}: {err}") from err
        self._warn_if_ids_were_normalised(trainer)
        saved = self.state_dict
        try:
            mean = np.asarray(saved["strategy"]["mean"], np.float32)
            obs = {k: np.asarray(saved[k], np.float32) for k in ("obs_count", "obs_sum", "obs_sumsq")}
        except (KeyError, TypeError) as err:
            raise CheckpointError(f"checkpoint {self.path}: its state holds no centre and observation statistics "
                                  f"({err})") from err
        if mean.shape != (trainer.num_params,) or obs["obs_sum"].shape != tuple(trainer.spec.obs_shape):
            raise CheckpointError(f"checkpoint {self.path}: its centre has shape {list(mean.shape)}, this policy "
                                  f"{trainer.num_params} parameters")
        # The stand-in state is fresh, not the file's: allocate it only where the file holds as much (less the
        # optimizer's state, stood in for), so a small file naming a big run (a CMA-ES covariance) is refused.
        shapes = _abstract_raw_state(trainer)
        need = _nbytes(shapes) - _nbytes(getattr(shapes.strategy, "opt_state", None))
        have = _nbytes(saved)
        if need > have + _STATE_SLACK_BYTES:
            raise CheckpointError(f"checkpoint {self.path}: its run's state takes {need} bytes, but the file holds "
                                  f"{have} bytes of state; the file was edited or is corrupt: use an earlier checkpoint")
        with self._allocating():
            template = localize(trainer.init_state(0))
        with self._allocating():
            state = template.replace(strategy=template.strategy.replace(mean=jnp.asarray(mean)),
                                     generation=jnp.asarray(self.generation, template.generation.dtype),
                                     **{k: jnp.asarray(v, getattr(template, k).dtype) for k, v in obs.items()})
            return trainer, trainer.place(state)

    def names_env(self, name: str) -> bool:
        """Whether this checkpoint's env is ``name``: the same name, or, in a file written before names held a gymnax
        env's changed params and its registered id (format < 7), the bare id or env name that file recorded for it
        (``"CartPole-v1"`` for ``"CartPole-v1?gravity=20.0"``, ``"DiscountingChain-v0"`` for
        ``"DiscountingChain-bsuite"``)."""
        if name == self.env_name:
            return True
        if self._brax_name_today() == name:
            return True
        if self.meta.get("version", 1) >= 7:
            return False
        head, instance, tail = name.partition(gymnax_envs.INSTANCE_SUFFIX)  # an instance's class and fingerprint
        plain, keep = split_option(head + (tail[tail.index("?"):] if instance and "?" in tail else ""), KEEP_OPTION)
        base, _, options = plain.partition("?")
        if base not in gymnax_envs.env_names() or any(  # only a gymnax id's params options: brax's backend and
                item.partition("=")[0] not in gymnax_envs.params_fields(base) for item in options.split("&") if item):
            return False  # Gymnasium's episode_seconds named other envs then as now
        names = [base, gymnax_envs.registered_label(base)]
        return self.env_name in [n if keep is None else with_option(n, KEEP_OPTION, keep) for n in names if n]

    def _brax_name_today(self) -> str | None:
        """This file's brax env name as today's jes writes it, where that may differ: a file written before brax names
        left out options equal to the env's defaults (format < 8: ``"brax/inverted_pendulum?backend=spring&
        n_frames=4"`` is ``"brax/inverted_pendulum?backend=spring"`` now; the same env). ``None`` otherwise."""
        if self.meta.get("version", 1) >= 8 or not self.env_name.startswith(brax_envs.PREFIX) \
                or "?" not in self.env_name or self.env_name.endswith(brax_envs.INSTANCE_SUFFIX):
            return None
        try:
            return brax_envs.make(self.env_name).name
        except (ImportError, ValueError, TypeError):  # not buildable here: compared by the name as written
            return None

    def check_compatible(self, trainer: Trainer) -> None:
        """Raise :class:`CheckpointError` naming every difference that would change the resumed parameters."""
        mine, theirs = describe_run(trainer), self.meta
        problems = []
        their_strategy = theirs.get("strategy") or describe_strategy(build_strategy(None))
        my_strategy = json.loads(json.dumps(mine["strategy"]))
        without_class = lambda d: {k: v for k, v in d.items() if k != "class"}
        if without_class(my_strategy) != without_class(their_strategy):
            problems.append(f"strategy: checkpoint has {their_strategy}, this run has {mine['strategy']}")
        elif "class" not in their_strategy and theirs["version"] < 9:
            if "class" in my_strategy:  # a subclass that kept its parent's name was recorded so: said, not refused
                warnings.warn(f"checkpoint {self.path} was written before jes recorded a strategy's class (format "
                              f"{theirs['version']}): it names strategy {their_strategy['name']!r}, which cannot say "
                              f"whether it ran your {my_strategy['class']} or another class of that name; resuming "
                              f"with {my_strategy['class']} as given", stacklevel=3)
        elif strategy_class(their_strategy) != strategy_class(my_strategy):
            ran, runs = (strategy_class(d) or f"an unrecorded class named {d['name']!r}"
                         for d in (their_strategy, my_strategy))
            problems.append(f"strategy class: checkpoint ran {ran}, this run has {runs} (both named "
                            f"{my_strategy['name']!r}: another algorithm). Resume with the strategy object the run used "
                            f"(its class, imported from where it was defined), or start a fresh run; a strategy class "
                            f"that changes the algorithm should have a name of its own (name = \"my_es\")")
        for field, label in (("env_name", "env"), ("policy", "policy"), ("optimizer", "optimizer"),
                             ("num_params", "parameter count"), ("obs_shape", "observation shape")):
            if field == "optimizer" and _same_optimizer_name(mine[field], theirs[field]):
                continue  # "adamm" and "AMSGrad" build amsgrad
            notice = None
            if field == "env_name":
                notice = (brax_envs.instance_warning(str(theirs[field]), str(mine[field]), f"checkpoint {self.path}",
                                                     resuming=True)
                          or gymnax_envs.instance_warning(str(theirs[field]), str(mine[field]),
                                                          f"checkpoint {self.path}", resuming=True))
            if notice is not None:   # another sys or params, or ones that cannot be checked: said, not refused
                warnings.warn(notice, stacklevel=3)
                continue
            if field == "env_name" and mine[field] != theirs[field] and mine[field] == self._brax_name_today():
                continue  # the same brax env, named as today's jes names it
            if field == "env_name" and mine[field] != theirs[field] \
                    and gymnasium_envs.legacy_factory_name(mine[field]) == theirs[field]:
                warnings.warn(f"checkpoint {self.path} names its env {theirs[field]!r}, as jes did before it named a "
                              f"gymnasium.Env class, factory or instance of your own by its module and qualified name: it "
                              f"cannot say whether it ran {mine[field]!r}; resuming on it as given", stacklevel=3)
                continue
            if field == "env_name" and mine[field] != theirs[field] \
                    and _lambda_moved(str(theirs[field]), str(mine[field])):
                warnings.warn(f"checkpoint {self.path} ran the env lambda {theirs[field]!r}, this run passes "
                              f"{mine[field]!r}: the same module, another line (a cell or lines above it edited?). "
                              f"jes cannot tell whether it builds the same env; resuming on it as given",
                              stacklevel=3)
                continue
            if field == "env_name" and mine[field] != theirs[field] and self.names_env(mine[field]):
                warnings.warn(f"checkpoint {self.path} was written before jes recorded a gymnax env's params and "
                              f"registered id in its name (format {theirs['version']}): it names its env "
                              f"{theirs[field]!r}, which cannot say whether it ran {mine[field]!r}; resuming on "
                              f"{mine[field]!r} as given", stacklevel=3)
                continue
            if field == "policy" and json.loads(json.dumps(mine[field])) != theirs[field]:
                notes: list = []
                if _same_policy(theirs[field], json.loads(json.dumps(mine[field])), notes):
                    for note in notes:  # the same policy but for functions recorded otherwise: said, not refused
                        warnings.warn(f"checkpoint {self.path} {note}", stacklevel=3)
                    continue
                if notes or describe.unstable_fields(theirs[field]):
                    problems.append(f"{label}: checkpoint has {theirs[field]}, this run has {mine[field]} (a lambda or "
                                    f"closure is recorded by its module, qualified name, first line and code hash, and "
                                    f"by what it closes over; one recorded by its memory address matches no other process: "
                                    f"define it with def at module level, or restore the state into a trainer you "
                                    f"build: jes.checkpoint.read(path).restore_state(trainer))")
                    continue
            if json.loads(json.dumps(mine[field])) != theirs[field]:
                problems.append(f"{label}: checkpoint has {theirs[field]}, this run has {mine[field]}")
        if mine["env_name"] == theirs["env_name"] and str(theirs["env_name"]).endswith(gymnasium_envs.INSTANCE_SUFFIX):
            # gymnax params are in the name and brax physics compared with it; an instance's are its own objects (its
            # class's code, wrappers, attributes set after make()), which no file could hold or compare: said, not
            # refused (a fingerprint of them would refuse legitimate resumes)
            warnings.warn(f"checkpoint {self.path} ran the gymnasium.Env instance {theirs['env_name']!r}: a file "
                          f"records an instance by its class or id only, not what was set on it (physics such as "
                          f"gravity, attributes, wrappers), so jes cannot check that the instance given now is the one "
                          f"it ran; restoring it for this instance as given", stacklevel=3)
        schedules = set(theirs["config_schedules"]) | set(mine["config_schedules"])
        perturbation = lambda c: repr(c.get("perturbation", "full_rank")) + (
            f" (rank {c.get('perturbation_rank')})" if c.get("perturbation") == "low_rank" else "")
        if perturbation(theirs["config"]) != perturbation(mine["config"]):  # one line: a rank only low rank has
            problems.append(f"config.perturbation: checkpoint has {perturbation(theirs['config'])}, this run has "
                            f"{perturbation(mine['config'])}")
        ran = self.chunk_size_ran(trainer)
        if ran is not None and ran != trainer.chunk_size:
            problems.append(f"chunk size: checkpoint's run evaluated {ran} members a chunk, this run "
                            f"{trainer.chunk_size} (the chunk decides the bits, and jes's default chunk for this "
                            f"policy may have changed since: resume with chunk_size={ran})")
        for name, value in theirs["config"].items():
            if name in RESUMABLE_CONFIG_CHANGES or name in RESUMABLE_WITH_WARNING or name in schedules \
                    or name in ("perturbation", "perturbation_rank") or (name == "chunk_size" and ran is not None):
                continue
            if mine["config"].get(name) != value:
                problems.append(f"config.{name}: checkpoint has {value!r}, this run has {mine['config'].get(name)!r}")
        if set(theirs["config_schedules"]) != set(mine["config_schedules"]):
            # (it said "schedules: checkpoint has ['learning_rate'], this run has []" beside "a resumed run may change
            # learning_rate": a trial)
            for name in sorted(set(theirs["config_schedules"]) ^ set(mine["config_schedules"])):
                if name in theirs["config_schedules"]:
                    problems.append(f"config.{name}: the checkpoint's run had a schedule, this run "
                                    f"{mine['config'].get(name)!r}: a run with a schedule resumes with a schedule "
                                    f"(its step goes on from the checkpoint's generation): pass it again, "
                                    f"jes.train(..., {name}=your_schedule, resume=path) (a command line cannot give "
                                    f"one: resume from Python)")
                else:
                    problems.append(f"config.{name}: the checkpoint's run had {theirs['config'].get(name)!r}, this "
                                    f"run a schedule: a run resumes with the kind of {name} it had (a number may "
                                    f"change to another number; a schedule starts a fresh run)")
        if problems:
            raise CheckpointError(
                f"checkpoint {self.path} does not match this run:\n  " + "\n  ".join(problems)
                + "\nResume with the same policy, env, optimizer and config (a resumed run may change "
                + ", ".join(sorted(RESUMABLE_CONFIG_CHANGES | RESUMABLE_WITH_WARNING)) + "), or start a fresh run."
            )

    def _warn_if_ids_were_normalised(self, trainer: Trainer) -> None:
        """Warn where this file's run normalised a Discrete observation's ids, which this jes hands on as they are."""
        if getattr(trainer.spec, "categorical_obs", False) and _collected_obs_stats(self.state_dict):
            warnings.warn(f"{self.path} was written by a jes that normalised env {trainer.spec.name}'s Discrete "
                          f"observations (integer ids, z-scored); this jes hands the policy the ids as they are "
                          f"(CHANGELOG.md), so its parameters see other inputs here: a resumed run is not the run it "
                          f"continues, and returns (resumed or evaluated) differ from those it logged", stacklevel=3)

    def restore_state(self, trainer: Trainer, checked: bool = False) -> TrainState:
        """The :class:`TrainState`, checked against ``trainer`` (``checked``: the caller ran :meth:`check_compatible`
        already) and placed on its devices."""
        if not checked:
            self.check_compatible(trainer)
        if self.meta["version"] < 8 and getattr(trainer.spec.env, "mapped_otherwise_before", False):
            warnings.warn(f"{self.path} was written by a jes that squashed brax env {trainer.spec.name!r}'s actions into "
                          f"its actuators' ctrl_range, which the env then scaled again; this jes gives it actions in "
                          f"[-1, 1], as brax's own trainers do (CHANGELOG.md), so its parameters act otherwise here: "
                          f"a resumed run is not the run it continues, and returns differ from those it logged",
                          stacklevel=2)
        self._warn_if_ids_were_normalised(trainer)
        # Shapes only: a file describes its run in a few bytes, so nothing of that run is allocated before the
        # file's own arrays are seen to be that run's (then what is allocated is what the file stores).
        template = _abstract_raw_state(trainer)
        try:
            restored = serialization.from_state_dict(template, _migrate(self.state_dict, self.meta))
        except Exception as err:  # noqa: BLE001 - whatever a malformed state dict makes flax raise
            raise CheckpointError(f"checkpoint {self.path}: training state does not fit this run's structure: {err}") from err
        problems = []

        def check(path, want, got):
            if not isinstance(got, (np.ndarray, np.generic, bool, int, float)):
                problems.append(f"{jax.tree_util.keystr(path)}: expected {want.dtype}{list(want.shape)}, file has "
                                f"{type(got).__name__}")
                return got
            got = np.asarray(got)
            if want.shape != got.shape or want.dtype != got.dtype:
                problems.append(f"{jax.tree_util.keystr(path)}: expected {want.dtype}{list(want.shape)}, "
                                f"file has {got.dtype}{list(got.shape)}")
            return got

        restored = jax.tree_util.tree_map_with_path(check, template, restored)
        if self.best is not None:
            want = {"flat_params": (trainer.num_params,), "1": tuple(trainer.spec.obs_shape),
                    "2": tuple(trainer.spec.obs_shape), "0": ()}
            for name, array in [("flat_params", self.best["flat_params"]), *(self.best.get("obs_stats") or {}).items()]:
                if tuple(array.shape) != want[name]:
                    problems.append(f"best.{name}: expected shape {list(want[name])}, file has {list(array.shape)}")
        if problems:
            raise CheckpointError(f"checkpoint {self.path} holds arrays of other shapes than this run:\n  "
                                  + "\n  ".join(problems))
        with self._allocating():
            restored = jax.tree.map(jnp.asarray, restored)
            try:
                es_key = jax.random.wrap_key_data(restored.es_key, impl=self.meta["es_key_impl"])
            except Exception as err:  # noqa: BLE001 - key data of another shape than its implementation's
                raise CheckpointError(f"checkpoint {self.path}: its es_key does not fit {self.meta['es_key_impl']}: "
                                      f"{err}") from err
            state = trainer.place(restored.replace(es_key=es_key))
            trainer.note_run_key(state, self.key)  # jes.run records it as the result's key
            return state

    @contextlib.contextmanager
    def _allocating(self) -> Iterator[None]:
        """Memory this file's run needs that the machine has not: a :class:`CheckpointError` naming the file."""
        try:
            yield
        except (jax.errors.JaxRuntimeError, MemoryError) as err:
            raise CheckpointError(f"checkpoint {self.path}: its run's state does not fit in memory here: "
                                  f"{type(err).__name__}: {err}") from err


# State a run's fresh state may hold beyond what its file stores (scalars, fields an older format lacked).
_STATE_SLACK_BYTES = 1 << 20


def _abstract_raw_state(trainer: Trainer) -> TrainState:
    """The shapes and dtypes of ``trainer``'s state as a file stores it (``es_key`` as its key data), as
    ``ShapeDtypeStruct`` leaves: traced, never allocated."""
    def raw():
        state = trainer.fresh_state(jax.random.key(0))
        return state.replace(es_key=jax.random.key_data(state.es_key))
    return jax.eval_shape(raw)


def _nbytes(tree: Any) -> int:
    """Bytes of a tree's array (or ``ShapeDtypeStruct``) leaves."""
    return sum(int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(tree) if hasattr(x, "shape") and hasattr(x, "dtype"))


_ADDRESS_REPR = re.compile(r"^<function (\S+) at 0x[0-9a-fA-F]+>$")
# module, qualified name, line, code hash (absent before jes hashed the code), what it closes over
_CODE_NAME = re.compile(r"^([^:]+):(\S+):(\d+)(?: code=([0-9a-f]+))?( closing over .*)?$")


def _same_policy(theirs: Any, mine: Any, notes: list) -> bool:
    """Whether two policy descriptions differ only in how a lambda or nested function is recorded, noting each such
    difference in ``notes`` (even when they differ otherwise): one recorded by its ``repr`` with a memory address
    (as jes did before :func:`jes.describe.code_name`) where this run's has the same qualified name, or the same
    module's function at another line (a cell or lines above it edited) or with other code (edited on its line)."""
    if isinstance(theirs, dict) and isinstance(mine, dict) and set(theirs) == set(mine) == {"__unimportable__"}:
        a, b = str(theirs["__unimportable__"]), str(mine["__unimportable__"])
        if a == b:
            return True
        old, new = _ADDRESS_REPR.match(a), _CODE_NAME.match(b)
        if old is not None and new is not None and old.group(1) == new.group(2):
            notes.append(f"recorded the function {a} by its memory address, as jes did before it named such a function "
                         f"by its module, qualified name and line: it cannot say whether it ran {b}; resuming with it "
                         f"as given")
            return True
        old = _CODE_NAME.match(a)
        if old is not None and new is not None and old.group(1, 2, 5) == new.group(1, 2, 5):
            moved, edited = old.group(3) != new.group(3), old.group(4) != new.group(4)
            what = ("another line and other code (moved and edited?)" if moved and edited else
                    "another line (a cell or lines above it edited?)" if moved else
                    "the same line but other code (edited?)")
            notes.append(f"ran the function {a}, this run passes {b}: the same module, {what}. jes cannot tell "
                         f"whether it computes the same; resuming with it as given")
            return True
        notes.append(f"ran the function {a}, this run passes {b}")
        return False
    if isinstance(theirs, dict) and isinstance(mine, dict):
        same = set(theirs) == set(mine)
        return all([_same_policy(theirs[k], mine[k], notes) for k in theirs if k in mine]) and same
    if isinstance(theirs, list) and isinstance(mine, list):
        return len(theirs) == len(mine) and all([_same_policy(a, b, notes) for a, b in zip(theirs, mine)])
    return theirs == mine


def _lambda_moved(theirs: str, mine: str) -> bool:
    """Whether two env names are the same module's lambda factory at other lines (``"__main__.<lambda>:12 (a
    gymnasium.Env factory)"``): a notebook cell edited above it moves it, and its line is all that tells lambdas
    of one module apart."""
    pattern = re.compile(r"^(.*\.<lambda>):\d+" + re.escape(gymnasium_envs.FACTORY_SUFFIX) + "$")
    a, b = pattern.match(theirs), pattern.match(mine)
    return a is not None and b is not None and a.group(1) == b.group(1)


def _same_optimizer_name(a: Any, b: Any) -> bool:
    """Whether two recorded optimizer names build the same optimizer (aliases and case aside)."""
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    try:
        return resolve_optimizer_name(a) == resolve_optimizer_name(b)
    except ValueError:
        return False


def _collected_obs_stats(state_dict: Any) -> bool:
    """Whether a file's observation statistics moved from their start (``OBS_EPS``): only a run that normalised
    its observations collects them."""
    count = state_dict.get("obs_count") if isinstance(state_dict, dict) else None
    try:
        return bool(np.asarray(count, np.float32) != np.float32(OBS_EPS))
    except (TypeError, ValueError):  # not one number: the caller's read of the statistics names the problem
        return False


def _migrate(state_dict: dict, meta: dict) -> dict:
    """Format 1 (before strategies) kept OpenAI-ES's params/opt_state/noise_std at the top of the state."""
    if meta.get("version", 1) >= 2 or "strategy" in state_dict:
        return state_dict
    state_dict = dict(state_dict)
    state_dict["strategy"] = {"mean": state_dict.pop("params"), "opt_state": state_dict.pop("opt_state"),
                              "noise_std": state_dict.pop("noise_std")}
    return state_dict


# The key implementations a file may name, and the uint32 words of one key of each (its key data's shape).
KEY_SIZES = {"threefry2x32": 2, "rbg": 4, "unsafe_rbg": 4}
KEY_IMPLS = tuple(KEY_SIZES)
_ARRAY_MAP = schema.Check(dict, lambda d: all(isinstance(v, np.ndarray) for v in d.values()), "a map of arrays")
CONTENT_SCHEMA = {
    "meta": str, "state": dict, "history": _ARRAY_MAP, "key": schema.Array("u", 1),
    "best?": {"fitness": schema.Array("fiu", 0), "generation": schema.Array("iu", 0), "member": schema.Array("iu", 0),
              "flat_params": schema.Array("f", 1), "obs_stats?": {"0": schema.Array("fiu"), "1": schema.Array("f"),
                                                                  "2": schema.Array("f")}},
}
_KEY_IMPL = schema.Check(str, lambda v: v in KEY_IMPLS, f"one of {list(KEY_IMPLS)}")
META_SCHEMA = {
    "version": schema.non_negative_int(), "generation": schema.non_negative_int(), "policy": schema.OBJECT,
    "strategy?": (None, {"name": str, "fields?": dict, "class?": str}), "env_name": str, "obs_shape": schema.shape(),
    "optimizer": (str, None), "num_params": schema.non_negative_int(), "config": dict, "config_schedules": [str],
    "key_impl": _KEY_IMPL, "es_key_impl": _KEY_IMPL,
    "chunk_size?": schema.Check(schema.INT, lambda v: 1 <= v < schema.MAX_DIM, "a positive int"),
}


def _file_state(meta: dict, content: dict) -> dict:
    """A file's state in today's layout (a malformed format-1 state as it is: restore_state names what it lacks)."""
    try:
        return _migrate(content["state"], meta)
    except (KeyError, TypeError):
        return content["state"]


def _scalar_int(value: Any) -> int | None:
    """A 0-d integer array's value, or ``None`` (a value of another kind is named by restore_state's checks)."""
    if isinstance(value, (np.ndarray, np.generic)) and np.ndim(value) == 0 and np.asarray(value).dtype.kind in "iu":
        return int(value)
    return None


def _check_state_against_meta(meta: dict, content: dict, path: str) -> None:
    """What the meta repeats of the state (the generation, the key implementations), against the state: a file whose
    two disagree was edited or is corrupt, and which of them tells the truth nobody knows."""
    state = _file_state(meta, content)
    problems = []
    generation = _scalar_int(state.get("generation"))
    if generation is not None and generation != meta["generation"]:
        problems.append(f"its meta records generation {meta['generation']}, its state is at generation {generation}")
    for field, data, what in (("key_impl", content["key"], "its run key"),
                              ("es_key_impl", state.get("es_key"), "its state's es_key")):
        size = KEY_SIZES[meta[field]]
        if isinstance(data, np.ndarray) and data.shape != (size,):
            problems.append(f"its meta records {field} {meta[field]!r} (keys of {size} uint32), {what} holds "
                            f"{data.size} uint32 of shape {list(data.shape)}")
    best = _scalar_int((content.get("best") or {}).get("generation"))
    if best is not None and best > meta["generation"]:
        problems.append(f"its best member is of generation {best}, after its run's generation {meta['generation']}")
    if problems:
        raise CheckpointError(f"checkpoint {path} is inconsistent: " + "; ".join(problems)
                              + ". The file was edited or is corrupt: use an earlier checkpoint")


def _check_values(meta: dict, content: dict, path: str) -> None:
    """Values no run writes: an env name setting a parameter to NaN and a count of observations that is not positive
    and finite are refused; parameters or sums of observations that are not finite (a diverged run, a file to look
    at) are warned about."""
    if nan_option(meta["env_name"]) is not None:
        raise CheckpointError(f"checkpoint {path} is malformed: its env name {meta['env_name']!r} sets "
                              f"{nan_option(meta['env_name'])}: an env parameter cannot be NaN (not a number)")
    state = _file_state(meta, content)
    best = content.get("best") or {}
    stats = best.get("obs_stats") or {}
    for fields in ([(f"state.{name}", state.get(name)) for name in ("obs_count", "obs_sum", "obs_sumsq")],
                   [(f"best.obs_stats[{i}] (its {name})", stats.get(str(i)))
                    for i, name in enumerate(("obs_count", "obs_sum", "obs_sumsq"))]):
        problem = schema.obs_stats_problem(fields[0])
        if problem is not None:
            raise CheckpointError(f"checkpoint {path} holds observation statistics no normaliser can use: {problem}")
        warning = schema.obs_sums_warning(*fields[1:])
        if warning is not None:
            warnings.warn(f"checkpoint {path}: {warning}", stacklevel=3)
    strategy = state.get("strategy")
    for what, params in (("its centre", strategy.get("mean") if isinstance(strategy, dict) else None),
                         ("its best member's parameters", best.get("flat_params"))):
        bad = schema.non_finite(params)
        if bad:
            warnings.warn(f"checkpoint {path}: {bad} of {np.size(params)} values of {what} are not finite (NaN or "
                          f"infinite); the run diverged, or the file was edited", stacklevel=3)


def read(path: str) -> Checkpoint:
    """Read and integrity-check a checkpoint file, validating every field it holds.

    Raises:
        FileNotFoundError: no file at ``path`` (or a directory).
        CheckpointError: not a jes checkpoint, truncated, corrupted, malformed (naming the field), from a
            newer format, inconsistent (a meta field that contradicts the state it repeats: the generation,
            a key implementation), holding a count of observations that is not positive and finite, or naming
            an env that sets a parameter to NaN.

    Warns:
        UserWarning: a centre, best member or sums of observations that are not finite (a diverged run's file
            loads, for a look at it).
    """
    data = schema.read_file(path, "checkpoint", ".ckpt")
    if len(data) < _HEADER.size:
        raise CheckpointError(f"checkpoint {path} is truncated: {len(data)} bytes, shorter than the {_HEADER.size}-byte header")
    magic, length, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        hint = " (it is a policy file: use jes.load_policy)" if magic.startswith(b"JESPOLI") else ""
        raise CheckpointError(f"{path} is not a jes checkpoint (starts with {magic!r}, expected {MAGIC!r}){hint}")
    payload = data[_HEADER.size:]
    if len(payload) != length:
        raise CheckpointError(f"checkpoint {path} is truncated or padded: payload is {len(payload)} bytes, header says "
                              f"{length}; use an earlier checkpoint")
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"checkpoint {path} is corrupt: its sha256 checksum does not match; use an earlier checkpoint")
    try:
        content, meta = schema.decode(payload, CONTENT_SCHEMA, META_SCHEMA, f"checkpoint {path}")
    except schema.SchemaError as err:
        raise CheckpointError(str(err)) from err
    if meta["version"] > FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has format version {meta['version']}; this jes reads up to "
                              f"{FORMAT_VERSION}; upgrade jes")
    if meta["version"] < 2:
        try:
            meta["policy"] = dict(meta["policy"], fields={k: _upgrade_v1(v) for k, v in meta["policy"].get("fields", {}).items()})
        except RecursionError:
            raise CheckpointError(f"checkpoint {path} is malformed: its policy description is nested too deeply to be "
                                  f"jes's") from None
    if meta["version"] < 3:
        _keep_old_pgpe_step(meta)
    _keep_old_policy_defaults(meta)
    _check_chunk_size(meta, path)
    _check_state_against_meta(meta, content, path)
    _check_values(meta, content, path)
    return Checkpoint(path=path, meta=meta, state_dict=content["state"], history=dict(content["history"]),
                      key=content["key"], best=content.get("best"))


def load(path: str, trainer: Trainer | None = None, devices: Any = None,
         allow_modules: Any = ()) -> tuple[Trainer, TrainState, Checkpoint]:
    """Read ``path`` and restore its state into ``trainer`` (rebuilt from the file when ``None``).

    Rebuilding builds only what :func:`checkpoint_allowlist` admits: jes's default packages,
    ``allow_modules``, and your policy's module if you imported it already.

    Returns:
        ``(trainer, state, checkpoint)``.
    """
    checkpoint = read(path)
    if trainer is None:
        trainer = checkpoint.build_trainer(devices=devices, allow_modules=allow_modules)
    return trainer, checkpoint.restore_state(trainer), checkpoint
