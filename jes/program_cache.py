"""Traced programs kept on disk, so that a warm process skips tracing and lowering jes's generation step
(and its init and member programs).

JAX's persistent compilation cache (:mod:`jes.compilation_cache`) keys compiled programs by their
lowered StableHLO, so a warm process still traces and lowers the step (~1.2 s of a ~4.5 s warm
CartPole run) only to find its key. This cache sits one step earlier: it keeps the lowered program
(``jax.export``, serialized) under a key computed from everything that determines it, and a warm
process calls the deserialized program instead of tracing. The compile of that program still goes
through JAX's cache, which checks it by its HLO as before.

The key must change whenever the program could: it is a hash of the run's parts (policy, env and
env params, config, strategy, optimizer name, chunking, devices, compiler options, argument
shapes), of jax's configuration and ``XLA_FLAGS``, of the installed files (path, size,
mtime) of jax, jaxlib, flax, optax, gymnax, chex and numpy, and of jes's own source text. A file changed
since the process started (its code in memory may be the old one) makes every key uncacheable. It is kept
conservative: a part that cannot be fingerprinted exactly (a lambda or closure, an optax object, a
class or function from any other package, such as your own policy module, whose helpers this key could
not see) makes the run uncacheable and it traces as before. Any failure to read, check,
deserialize or call a cached program falls back to tracing.

Files live in ``<jax compilation cache dir>/jes-programs``; the cache is used only when JAX's
persistent cache is on (``jes.enable_compilation_cache()``, which ``python -m jes`` and the CLI call)
and in single-process runs.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
import sys
import tempfile
import types
from typing import Any

import jax
import numpy as np

FORMAT = 1
_MAGIC = b"jes-program\n"
SUBDIR = "jes-programs"
# Packages whose code may appear in a cacheable run: their versions and installed files are in every key.
PACKAGES = ("jes", "jax", "jaxlib", "flax", "optax", "gymnax", "chex", "numpy")


# Methods the dataclasses module generates (their code says "<string>").
_GENERATED = frozenset({"__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__", "__lt__",
                        "__le__", "__gt__", "__ge__", "__getstate__", "__setstate__", "__replace__", "__match_args__"})


class Uncacheable(Exception):
    """A part of a run that cannot be fingerprinted exactly; the run traces as usual."""


def _top(module: str | None) -> str:
    return (module or "").split(".", 1)[0]


def _importable_path(obj: Any) -> str:
    """``module:qualname`` of a module-level class or function from :data:`PACKAGES`, resolving to ``obj`` itself."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or _top(module) not in PACKAGES:
        raise Uncacheable(f"{obj!r} is not a module-level object of {PACKAGES}")
    if "<" in qualname or getattr(obj, "__closure__", None):
        raise Uncacheable(f"{obj!r} is a closure or local object")
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not obj:
        raise Uncacheable(f"{module}:{qualname} does not resolve to {obj!r}")
    return f"{module}:{qualname}"


def fingerprint(value: Any, depth: int = 0) -> Any:
    """Plain, JSON-able data that is equal for two values only if they build the same program.

    Raises:
        Uncacheable: a value that cannot be fingerprinted exactly.
    """
    if depth > 40:
        raise Uncacheable("nested too deep")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return ["int", type(value).__name__, str(value)]
    if isinstance(value, float):
        return ["float", type(value).__name__, float(value).hex()]
    if isinstance(value, (np.ndarray, np.generic, jax.Array)):
        if isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
            raise Uncacheable("a PRNG key value")
        array = np.asarray(value)
        if array.dtype == object:
            raise Uncacheable("an object array")
        return ["array", type(value).__name__, str(array.dtype), list(array.shape),
                hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()]
    if isinstance(value, (list, tuple)):
        if type(value) not in (list, tuple) and not (isinstance(value, tuple) and hasattr(value, "_fields")):
            raise Uncacheable(f"a {type(value).__name__} sequence")
        return ["seq", type(value).__name__, [fingerprint(v, depth + 1) for v in value]]
    if isinstance(value, dict):
        if type(value) is not dict or not all(isinstance(k, str) for k in value):
            raise Uncacheable("a dict that is not a plain str-keyed dict")
        return ["dict", {k: fingerprint(v, depth + 1) for k, v in sorted(value.items())}]
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)) or (
            callable(value) and not dataclasses.is_dataclass(value) and not hasattr(value, "__dict__")):
        return ["code", _importable_path(value)]
    if isinstance(value, (np.dtype,)):
        return ["dtype", str(value)]
    cls = type(value)
    path = _importable_path(cls)
    if dataclasses.is_dataclass(value):
        fields = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.name == "parent":  # a Flax module's parent: only top-level (unbound) modules are cacheable
                if v is None or type(v).__name__ == "_Sentinel":
                    continue
                raise Uncacheable("a bound Flax module")
            fields[f.name] = fingerprint(v, depth + 1)
        return ["dataclass", path, fields]
    if callable(value) and hasattr(value, "__wrapped__"):  # e.g. a jitted or custom_jvp function
        return ["code", _importable_path(value)]
    state = getattr(value, "__dict__", None)
    if isinstance(state, dict) and not getattr(cls, "__slots__", ()):
        return ["object", path, fingerprint(dict(state), depth + 1)]
    raise Uncacheable(f"a {cls.__qualname__} value")


def _loaded_since_ns() -> int:
    """A time before this process loaded any code the key covers: jes's import, or the process's start if earlier."""
    import jes  # noqa: PLC0415 - the package's own import time

    since = jes.IMPORTED_AT_NS
    try:
        since = min(since, os.stat(f"/proc/{os.getpid()}").st_mtime_ns)
    except OSError:
        pass
    return since


def _check_origin(obj: Any, jes_dir: str) -> None:
    for _ in range(100):  # the function a decorator (flax's method wrappers, functools.wraps) wraps
        inner = getattr(obj, "__wrapped__", None)
        if inner is None:
            break
        obj = inner
    module = getattr(obj, "__module__", None) or ""
    top = _top(module)
    if top not in PACKAGES and top not in sys.stdlib_module_names and top != "builtins":
        raise Uncacheable(f"{obj!r} comes from {module!r}, outside {PACKAGES}")
    code = getattr(obj, "__code__", None)
    if code is not None and code.co_filename == "<string>" and code.co_name in _GENERATED:
        return  # written by dataclasses (flax modules, struct dataclasses, jes's frozen configs)
    if top == "jes" and code is not None and not os.path.abspath(code.co_filename).startswith(jes_dir + os.sep):
        raise Uncacheable(f"{obj!r} claims jes but was defined in {code.co_filename}")


def check_code(classes: list, instance: Any = None) -> None:
    """Refuse code replaced at run time, which no file on disk describes (a monkeypatched method or function).

    Checks every function and class bound at module level in the loaded ``jes`` modules, every function
    in the dicts of ``classes`` and their bases, and functions set on ``instance``: each must come from
    :data:`PACKAGES` or the standard library, and jes's own from jes's files.

    Raises:
        Uncacheable: something else was found.
    """
    import jes  # noqa: PLC0415 - where jes's files are

    jes_dir = os.path.dirname(os.path.abspath(jes.__file__))
    for name, module in list(sys.modules.items()):
        if module is None or _top(name) != "jes":
            continue
        for value in list(vars(module).values()):
            if isinstance(value, (types.FunctionType, type)):
                _check_origin(value, jes_dir)
    for cls in classes:
        for klass in cls.__mro__:
            if klass is object:
                continue
            _check_origin(klass, jes_dir)
            for value in list(vars(klass).values()):
                if isinstance(value, (staticmethod, classmethod)):
                    value = value.__func__
                elif isinstance(value, property):
                    value = value.fget
                if isinstance(value, types.FunctionType):
                    _check_origin(value, jes_dir)
    for value in list(vars(instance).values()) if instance is not None else ():
        if isinstance(value, types.MethodType):
            value = value.__func__
        if isinstance(value, types.FunctionType):
            _check_origin(value, jes_dir)


def _package_files(name: str, since_ns: int) -> str:
    """Hash of a package's installed files: (path, size, mtime) of each, and the text of jes's own.

    Raises:
        Uncacheable: a file changed while this process ran (the code in memory may be the old one, so
            the key of the files on disk would not describe it).
    """
    module = sys.modules.get(name)
    if module is not None:
        files = getattr(module, "__file__", None)
    else:  # not imported (so not in the program either): its files still count, without the cost of importing it
        spec = importlib.util.find_spec(name)
        if spec is None:
            return "absent"
        files = spec.origin
    if not files:
        raise Uncacheable(f"package {name} has no files")
    root = os.path.dirname(files)
    digest = hashlib.sha256(name.encode())  # versions change files, so the files stand for them too
    for directory, subdirs, names in os.walk(root):
        subdirs.sort()
        for filename in sorted(names):
            if not filename.endswith((".py", ".so", ".pyd", ".dylib")):
                continue
            path = os.path.join(directory, filename)
            stat = os.stat(path)
            # A whole-second mtime may come from a file system with coarse timestamps (FAT's are 2 s): give it 2 s
            # of slack. Nanosecond timestamps need none, so a checkout made just before the process still counts.
            slack = 2_000_000_000 if stat.st_mtime_ns % 1_000_000_000 == 0 else 0
            if stat.st_mtime_ns >= since_ns - slack:
                raise Uncacheable(f"{path} changed after this process started")
            if name == "jes":  # jes's own edits often keep sizes and may keep mtimes: hash its text
                with open(path, "rb") as f:
                    digest.update(path.encode() + b"\0" + hashlib.sha256(f.read()).digest())
            else:
                digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def environment() -> dict:
    """What every key includes: versions and files of the packages, jax's and flax's configuration, XLA_FLAGS."""
    import flax  # noqa: PLC0415 - imported by every caller already; here for its config

    since = _loaded_since_ns()
    return {
        "format": FORMAT,
        "python": sys.version,
        "packages": {name: _package_files(name, since) for name in PACKAGES},
        "jax_config": {k: repr(v) for k, v in sorted(jax.config.values.items())},
        "flax_config": {k: repr(getattr(flax.config, k)) for k in sorted(dir(flax.config)) if k.startswith(("flax_", "nnx_"))},
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "platform": [(d.platform, getattr(d.client, "platform_version", "")) for d in jax.local_devices()[:1]],
    }


def cache_dir() -> str | None:
    """``<jax compilation cache dir>/jes-programs``, or ``None`` when JAX's persistent cache is off.

    Also ``None`` in multi-process runs and without the ``flatbuffers`` package (``jax.export``
    serializes with it; jes depends on it, but an environment may lack it).
    """
    base = jax.config.jax_compilation_cache_dir
    if not base or jax.process_count() > 1 or jax.config.jax_disable_jit:
        return None
    if importlib.util.find_spec("flatbuffers") is None:
        return None
    return os.path.join(base, SUBDIR)


def program_key(kind: str, parts: Any) -> str | None:
    """Hex key of a program from its ``kind`` and the run's ``parts``, or ``None`` when uncacheable or off."""
    if cache_dir() is None:
        return None
    try:
        text = json.dumps({"kind": kind, "parts": fingerprint(parts), "environment": environment()},
                          sort_keys=True, separators=(",", ":"))
    except (Uncacheable, OSError, TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def _path(key: str) -> str | None:
    directory = cache_dir()
    return None if directory is None else os.path.join(directory, f"{key}.jesprog")


def _own(fd: int) -> bool:
    """Whether the open file ``fd`` belongs to this process's user. Its checksum proves only that it is intact: anyone
    who can write a shared cache folder can compute a key (from the same installed files and configuration) and store
    a program of their own under it, which a run would call. A file another user made is never read (where the OS has
    no owners, every file passes)."""
    return not hasattr(os, "geteuid") or os.fstat(fd).st_uid == os.geteuid()


def load(key: str) -> Any:
    """The :class:`jax.export.Exported` stored under ``key``, or ``None`` (missing, corrupt, unreadable)."""
    path = _path(key)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            if not _own(f.fileno()):  # planted by another user of a shared cache folder: never called
                return None
            blob = f.read()
        header, _, payload = blob.partition(b"\n\n")
        magic, stored_key, digest = header.split(b"\n")[:3]
        if (magic + b"\n" != _MAGIC or stored_key.decode() != key
                or hashlib.sha256(payload).hexdigest() != digest.decode()):
            return None
        return jax.export.deserialize(bytearray(payload))
    except Exception:  # noqa: BLE001 - any unreadable entry is a miss; the caller traces
        return None


def store(key: str, exported: Any) -> bool:
    """Write ``exported`` under ``key`` atomically; ``False`` (and nothing written) on any failure."""
    path, temp = _path(key), None
    if path is None:
        return False
    try:
        payload = bytes(exported.serialize())
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # A fresh name, created exclusively: a predictable one ("<path>.<pid>.tmp") let anyone who can write the folder
        # plant a link there to a file of this user's, which the write then overwrote
        fd, temp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=os.path.dirname(path))
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + key.encode() + b"\n" + hashlib.sha256(payload).hexdigest().encode() + b"\n\n" + payload)
        os.replace(temp, path)
        return True
    except Exception:  # noqa: BLE001 - a cache that cannot be written only costs the next run a trace
        if temp is not None and os.path.exists(temp):
            try:
                os.remove(temp)
            except OSError:
                pass
        return False
