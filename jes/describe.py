"""Plain-data description of a run, and the registry that decides what a description may build.

One describer serves checkpoints (:mod:`jes.checkpoint`), ``.policy`` files (:mod:`jes.trained`) and
the wire protocol (:mod:`jes.distributed.protocol`). A description is JSON/msgpack-able data:

* scalars (``None``, bool, int, float, str) stand for themselves;
* ``{"__seq__": [...], "tuple": bool}`` is a list or tuple;
* ``{"__callable__": "module:qualname"}`` is a registered function (an activation, a dtype);
* ``{"class": "module:QualName", "fields": {...}}`` is an instance of a registered class;
* ``{"__mapping__": {...}}`` is an immutable mapping with string keys (a ``ToLinen``'s ``kwargs``), and
  ``{"__nnx_class__": "module:QualName"}`` a ``ToLinen``'s ``flax.nnx.Module`` class.

Building is the dangerous direction: a description names code, and files and fleets are shared.
A description is therefore *data, not code*: it may only name

1. **registered classes** (:func:`registered_classes`): jes's policies and strategies, and the
   ``flax.linen`` layer classes a policy may contain (Dense, DenseGeneral, Conv, Embed, GRUCell,
   LSTMCell, norms, ...). Wrappers that call what they are given (``partial``, ``nn.Module`` subclasses outside
   the registry) are not in it. Flax's ``nnx.bridge.ToLinen`` is built only as the policy itself and only around
   a ``flax.nnx.Module`` subclass *of the user's own* (item 4, or the policy class of an imported module), never
   a library's class or a function;
2. **registered functions** (:func:`registered_callables`): activations and dtypes, pure functions
   of their array argument;
3. **env families**: gymnax environment classes (subclasses of gymnax's ``Environment`` defined in
   ``gymnax.environments``), built without arguments, and the dataclasses (``EnvParams``) defined
   beside them;
4. classes and functions **defined in** a module the user opted in to (``allowlist(["mypkg.policies"])``,
   ``jes-worker --allow-module mypkg.policies``, ``jes.load_policy(path, allow_modules=[...])``),
   checked on the *resolved* object: the path may not walk through a module or a dunder, and the
   object's own ``__module__`` must be the opted-in module (an alias of ``subprocess.Popen`` inside
   it is refused). Library packages (flax, jax, ...) and :data:`DENIED_MODULES` cannot be opted in.

Fields are plain values, sequences, registered functions and nested registered objects; nothing
else. A class is expected where a class is described and its role decides what kind: a policy must
subclass ``flax.linen.Module``, an env must be a gymnax-style env, everything else a dataclass; a
``__callable__`` must be a function, never a class. The whole description is checked first and only
then built, so a refused description creates nothing. Any failure is a :class:`DescriptionError`
(:class:`RefusedError` when the registry said no; :class:`NotAllowedError` when it names a module the allowlist
does not admit, the one refusal that opting a module in can mend).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import os
import sys
import types
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Sequence

# Library packages whose buildable objects are the registry's, never "everything in the package":
# they hold wrappers that call what they are given (flax.linen.ToLinen, jax.tree_util.Partial, ...).
LIBRARY_PACKAGES = frozenset({"jes", "flax", "jax", "jaxlib", "optax", "gymnax", "brax", "mujoco", "mujoco_playground",
                              "numpy", "chex", "orbax", "tensorboardX", "zmq", "msgpack", "scipy", "etils"})
# Never built, whatever the allowlist says: process, file, import and interpreter machinery.
DENIED_MODULES = frozenset({
    "builtins", "os", "posix", "nt", "sys", "subprocess", "shutil", "importlib", "runpy", "pty", "socket",
    "ctypes", "pickle", "marshal", "code", "codeop", "multiprocessing", "pathlib", "io", "tempfile",
    "webbrowser", "signal", "threading", "asyncio", "types", "inspect", "gc", "pdb", "bdb", "shelve", "dbm",
    "urllib", "http", "ftplib", "smtplib", "zipfile", "tarfile", "logging", "sqlite3", "atexit", "operator",
    "functools", "ctypes", "_posixsubprocess", "_thread", "posixpath", "ntpath", "select", "selectors",
})
_PLAIN = (type(None), bool, int, float, str)
# gymnax's env family: env classes and their parameter dataclasses defined under this package.
_ENV_FAMILY = "gymnax.environments"

_FLAX_LAYERS = ("Dense", "DenseGeneral", "Einsum", "Conv", "ConvTranspose", "ConvLocal", "Embed", "GRUCell",
                "LSTMCell", "OptimizedLSTMCell", "SimpleCell", "MGUCell", "ConvLSTMCell", "RNN", "Bidirectional",
                "LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm", "Dropout", "Sequential")
_ACTIVATIONS = ("relu", "relu6", "sigmoid", "softplus", "soft_sign", "silu", "swish", "log_sigmoid", "elu",
                "leaky_relu", "hard_tanh", "celu", "selu", "gelu", "glu", "hard_sigmoid", "hard_silu", "hard_swish",
                "mish", "softmax", "log_softmax", "standardize", "identity", "sparse_plus", "squareplus")
_NUMPY_FUNCTIONS = ("tanh", "sin", "cos", "abs", "exp", "square", "sqrt", "arctan", "sinh", "cosh",
                    "float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8", "bool_",
                    "complex64")


class DescriptionError(ValueError):
    """A run or object that cannot be described as plain data, or a description that cannot be built."""


class RefusedError(DescriptionError):
    """A description names code outside the registry and the opted-in modules; nothing was built."""


class NotAllowedError(RefusedError):
    """A description names a class or function outside the registry, of a module the allowlist does not admit.

    Attributes:
        module: the module it is in (where it is defined, for an alias).
        can_opt_in: whether opting that module in (``allow_modules``) could admit it: it is not ``__main__``, a
            library package or a denied module. Only then is "allow its module" advice that helps.
    """

    def __init__(self, message: str, module: Any):
        super().__init__(message)
        self.module = module if isinstance(module, str) else ""
        root = _root(self.module)
        self.can_opt_in = (bool(self.module) and self.module != "__main__" and root not in LIBRARY_PACKAGES
                           and root not in DENIED_MODULES)


def _root(module: str) -> str:
    return module.split(".", 1)[0]


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _keys(obj: Any, public: str) -> dict:
    """``{path: obj}`` under its public path and under the path :func:`describe_value` writes for it."""
    keys = {public: obj}
    written = _importable(obj)
    if written is not None:
        keys[written] = obj
    return keys


@functools.lru_cache(maxsize=None)
def registered_classes() -> dict[str, type]:
    """``{"module:QualName": class}``: every class a description may build without an opt-in."""
    import flax.linen as nn  # imported when a description is first built: `import jes.describe` stays light

    from jes import policies, strategies

    found: dict[str, type] = {}
    for name in ("GRUPolicy", "MLPPolicy", "TorchGRUCell", "TorchLinear"):
        found.update(_keys(getattr(policies, name), f"jes.policies:{name}"))
    for name in strategies.names():
        cls = type(strategies.get(name))
        found.update(_keys(cls, f"{cls.__module__}:{cls.__qualname__}"))
    for name in _FLAX_LAYERS:
        if hasattr(nn, name):
            found.update(_keys(getattr(nn, name), f"flax.linen:{name}"))
    for cls in _EXTRA_CLASSES:
        found.update(_keys(cls, f"{cls.__module__}:{cls.__qualname__}"))
    return found


# Classes of jes's own modules that register themselves (jes.perturbations' dataclasses).
_EXTRA_CLASSES: list[type] = []


def register_class(cls: type) -> type:
    """Add one of jes's own plain dataclasses to :func:`registered_classes` (a class decorator)."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and _under(cls.__module__, "jes")):
        raise TypeError(f"only jes's own dataclasses are registered, not {cls!r}")
    _EXTRA_CLASSES.append(cls)
    registered_classes.cache_clear()
    return cls


@functools.lru_cache(maxsize=None)
def registered_callables() -> dict[str, Callable]:
    """``{"module:qualname": function}``: the activations and dtypes a description may name."""
    import jax
    import jax.numpy as jnp
    from flax.linen import dtypes

    found: dict[str, Callable] = {}
    for name in _ACTIVATIONS:
        if hasattr(jax.nn, name):
            found.update(_keys(getattr(jax.nn, name), f"jax.nn:{name}"))
    for name in _NUMPY_FUNCTIONS:
        if hasattr(jnp, name):
            found.update(_keys(getattr(jnp, name), f"jax.numpy:{name}"))
    for name in ("zeros", "ones"):  # initializers that are functions (the others are factories of closures)
        found.update(_keys(getattr(jax.nn.initializers, name), f"jax.nn.initializers:{name}"))
    found.update(_keys(dtypes.promote_dtype, "flax.linen.dtypes:promote_dtype"))
    found.update(_keys(jax.lax.dot_general, "jax.lax:dot_general"))
    return found


@dataclasses.dataclass(frozen=True)
class Allowlist:
    """Modules of the user's own whose classes and functions a description may build, beside the registry.

    Attributes:
        modules: package or module names the user opted in to; each admits objects *defined* in
            itself and everything under it (``"mypkg"`` admits ``mypkg.policies``). Library packages
            (:data:`LIBRARY_PACKAGES`) and :data:`DENIED_MODULES` cannot be opted in.
        classes: exact ``"module:QualName"`` classes admitted besides (a checkpoint's policy class whose
            module the program imported itself); nothing else of their module is.
    """

    modules: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()

    def __post_init__(self):
        for name in self.modules:
            if not isinstance(name, str) or not name or not all(p.isidentifier() for p in name.split(".")):
                raise ValueError(f"allowed module {name!r} is not a dotted module name like 'mypkg.policies'")
            if _root(name) in DENIED_MODULES:
                raise ValueError(f"module {name!r} cannot be allowed: {_root(name)} is never built from a description")
            if _root(name) in LIBRARY_PACKAGES:
                raise ValueError(
                    f"module {name!r} cannot be allowed: {_root(name)} is a library whose buildable classes are "
                    f"jes's registry (jes.describe.registered_classes()); allow the module of your own policy or "
                    f"env instead (e.g. 'mypkg.policies')"
                )

    def allows(self, module: Any) -> bool:
        """Whether objects defined in ``module`` (a dotted name) were opted in."""
        if not isinstance(module, str) or not module or _root(module) in DENIED_MODULES:
            return False
        if _root(module) in LIBRARY_PACKAGES:
            return False
        return any(_under(module, package) for package in self.modules)

    def extended(self, modules: Iterable[str]) -> "Allowlist":
        """This allowlist plus ``modules``."""
        extra = tuple(m for m in modules if m not in self.modules)
        return Allowlist(self.modules + extra, self.classes) if extra else self

    def with_class(self, path: str) -> "Allowlist":
        """This allowlist plus the one class at ``path`` (not its module's other objects)."""
        module = path.partition(":")[0] if isinstance(path, str) else ""
        if not module or _root(module) in DENIED_MODULES or _root(module) in LIBRARY_PACKAGES:
            return self
        return self if path in self.classes else Allowlist(self.modules, self.classes + (path,))


def allowlist(allow_modules: Iterable[str] | str | None = None) -> Allowlist:
    """The registry plus the user's own ``allow_modules`` (e.g. ``["mypkg.policies"]``)."""
    if isinstance(allow_modules, str):
        allow_modules = [allow_modules]
    return Allowlist().extended(allow_modules or ())


# ------------------------------------------------------------------ describe
def _path_of(obj: Any) -> str | None:
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(name, str) or not module or "<" in name:
        return None
    return f"{module}:{name}"


def _importable(obj: Any) -> str | None:
    """``"module:qualname"`` if importing that path gives back ``obj`` itself."""
    path = _path_of(obj)
    if path is None:
        return None
    module, qualname = path.split(":")
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception:  # noqa: BLE001 - any failure means "not importable by name"
        return None
    return path if found is obj else None


def code_name(value: Any, depth: int = 0) -> str | None:
    """A name of a callable that cannot be imported by name, the same in another process that runs the same code.

    A lambda or nested function: ``"module:qualname:line code=HASH"`` (``"__main__:<lambda>:12 code=3f2a9c1b0d4e"``:
    a lambda's qualified name says only ``<lambda>``, its first line tells it from the module's others, and a short
    hash of its compiled code (:func:`code_hash`) tells an edited one on the same line), plus ``" closing over [...]"``
    with the plain data it captures and its defaults (``sha256:...`` of that data where it is long: it is only
    compared); ``functools.partial``: ``"functools.partial(name, [args], {kwargs})"``. ``None`` where that cannot be
    said without a memory address (it captures an object that is not plain data, a callable object): its ``repr``
    then differs in every process.
    """
    if depth > 4:
        return None
    if isinstance(value, functools.partial):
        func = _path_of(value.func) or code_name(value.func, depth + 1)
        captured = _captured(list(value.args) + [value.keywords or {}], depth)
        return None if func is None or captured is None else f"functools.partial({func}, {captured})"
    code, module, qualname = (getattr(value, a, None) for a in ("__code__", "__module__", "__qualname__"))
    if not isinstance(code, types.CodeType) or not isinstance(module, str) or not module or not isinstance(qualname, str):
        return None
    name = f"{module}:{qualname}:{code.co_firstlineno} code={code_hash(code)}"
    try:
        values = [cell.cell_contents for cell in value.__closure__ or ()]
    except ValueError:  # a cell not yet filled
        return None
    values += list(value.__defaults__ or ()) + [dict(value.__kwdefaults__ or {})]
    if values == [{}]:
        return name
    captured = _captured(values, depth)
    return None if captured is None else f"{name} closing over {captured}"


def _captured(values: list, depth: int) -> str | None:
    """JSON of the plain data ``values`` (functions by name), or ``None`` when one is not plain data."""
    def plain(v):
        if isinstance(v, _PLAIN):
            return v
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict) and all(isinstance(k, str) for k in v):
            return {k: plain(x) for k, x in v.items()}
        if callable(v) and not isinstance(v, type):
            name = _path_of(v) or code_name(v, depth + 1)
            if name is not None:
                return name
        raise DescriptionError("not plain data")
    try:
        text = json.dumps(plain(values), sort_keys=True)
    except (DescriptionError, RecursionError, ValueError, TypeError):
        return None
    # Long data (a table, a token or path in a long closure) is only compared: its hash, not a copy in every file
    # and error message.
    return text if len(text) <= MAX_CAPTURED_CHARS else f"sha256:{hashlib.sha256(text.encode()).hexdigest()}"


# Captured data longer than this (as JSON) is recorded by its sha256.
MAX_CAPTURED_CHARS = 200


def code_hash(code: types.CodeType) -> str:
    """A short hash of a function's compiled code: its bytecode, constants and names, and those of the functions
    defined in it. The same source gives the same hash in another process (of the same Python version); an edit to
    a lambda that leaves it on the same line changes it."""
    digest = hashlib.sha256()

    def feed(c: types.CodeType, depth: int) -> None:
        digest.update(c.co_code)
        digest.update(repr(c.co_names).encode())
        for const in c.co_consts:
            if isinstance(const, types.CodeType) and depth < 16:
                digest.update(b"<code>")
                feed(const, depth + 1)
            else:
                digest.update(_const_text(const).encode())
            digest.update(b"\0")

    feed(code, 0)
    return digest.hexdigest()[:12]


def _const_text(const: Any) -> str:
    """``repr`` of a code constant, the same in every process: a frozenset's (``x in {"a", "b"}``) order depends on
    string hashing, so its items are sorted."""
    if isinstance(const, frozenset):
        return "frozenset(" + repr(sorted(_const_text(c) for c in const)) + ")"
    if isinstance(const, tuple):
        return "(" + ", ".join(_const_text(c) for c in const) + ",)"
    return repr(const)


def unstable_fields(description: Any, where: str = "policy") -> list[str]:
    """Where a lenient description (:func:`describe_object`) recorded a value by a ``repr`` holding a memory address:
    a value the same code gives another process is recorded otherwise there, so a file holding it matches no run
    of another process."""
    if isinstance(description, dict):
        if "class" in description and isinstance(description.get("fields"), dict):
            return [f for k, v in description["fields"].items() for f in unstable_fields(v, f"{where}.{k}")]
        if "__seq__" in description:
            return [f for i, v in enumerate(description["__seq__"]) for f in unstable_fields(v, f"{where}[{i}]")]
        text = description.get("__unimportable__", description.get("__repr__"))
        return [f"{where} ({text})"] if isinstance(text, str) and " at 0x" in text else []
    return []


def describe_value(value: Any, what: str, *, lenient: bool = False) -> Any:
    """Plain-data form of a field value: scalars, lists/tuples, importable functions and classes, dataclasses.

    Args:
        value: the value.
        what: where it sits (``"policy.activation"``), for error messages.
        lenient: record what cannot travel as ``{"__unimportable__": path}`` / ``{"__repr__": text}``
            (which :func:`build_value` refuses) instead of raising; checkpoints use this so a run with a
            lambda can still be saved and resumed into a trainer the user builds.

    Raises:
        DescriptionError: a lambda, closure, schedule, class from ``__main__``, or other non-data value.
    """
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        return {"__seq__": [describe_value(v, f"{what}[{i}]", lenient=lenient) for i, v in enumerate(value)],
                "tuple": isinstance(value, tuple)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return describe_object(value, what, lenient=lenient)
    if callable(value):
        path = _importable(value)
        if path is not None and not path.startswith("__main__:"):
            return {"__callable__": path}
        if lenient:
            recorded = _path_of(value) or repr(value)
            if " at 0x" in recorded:  # a lambda, a closure: its repr differs in every process; a stable one stays
                recorded = code_name(value) or recorded  # as jes always wrote it, so its checkpoints still resume
            return {"__unimportable__": recorded}
        raise DescriptionError(
            f"{what} holds the callable {value!r}, which cannot be imported by name; use a module-level "
            f"function or class (importable as 'module:name'), not a lambda, closure, schedule or __main__ object"
        )
    if lenient:
        return {"__repr__": repr(value)}
    # (a dict "was not plain data": a file describes numbers, strings, lists, tuples, importable functions and classes
    # and dataclasses, no mappings)
    kind = "a dict" if isinstance(value, Mapping) else type(value).__name__
    raise DescriptionError(f"{what} holds {kind} {value!r}, which a policy file or checkpoint cannot describe (it holds "
                           f"numbers, strings, lists, tuples, importable functions and classes, and dataclasses)"
                           + ("; give it as a tuple of (key, value) pairs" if isinstance(value, Mapping) else ""))


def describe_object(obj: Any, what: str, *, lenient: bool = False) -> dict:
    """``{"class": "module:Class", "fields": {...}}`` of a dataclass (Flax modules are) or a no-argument object.

    Raises:
        DescriptionError: its class is not importable by name (defined in ``__main__``, a notebook, a function).
    """
    cls = type(obj)
    path = _importable(cls)
    if _path_of(cls) == TO_LINEN:
        return _describe_to_linen(obj, what, lenient)
    if _is_to_linen(cls) and not lenient:  # its own fields would not travel; a file builds only ToLinen itself
        raise DescriptionError(f"{what} is {cls.__module__}:{cls.__qualname__}, a subclass of Flax's ToLinen, which a "
                               f"file cannot name; give your nnx module to flax.nnx.bridge.ToLinen itself")
    if (path is None or cls.__module__ == "__main__") and lenient:  # a checkpoint of a notebook's own class
        path = _path_of(cls) or f"{cls.__module__}:{cls.__qualname__}"  # recorded; building it will fail
    elif path is None or cls.__module__ == "__main__":
        raise DescriptionError(
            f"{what} is a {cls.__qualname__} from {cls.__module__}, which cannot be imported by name; define it at "
            f"module level in an importable module (not __main__ or a notebook)"
        )
    fields = {}
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            if f.name in ("parent", "name") or not f.init:
                continue
            value = getattr(obj, f.name)
            if value is f.default and callable(value) and _importable(value) is None:
                continue  # a default initializer (a closure): the rebuilt object has it too
            fields[f.name] = describe_value(getattr(obj, f.name), f"{what}.{f.name}", lenient=lenient)
    return {"class": path, "fields": fields}


# flax.nnx's bridge into linen: an nnx module class (and its constructor's arguments) as a linen module. Resolved
# without an opt-in, imported only when a description names it (`import flax.nnx` costs ~0.2 s).
TO_LINEN = "flax.nnx.bridge.wrappers:ToLinen"


def _to_linen_class() -> type:
    from flax.nnx.bridge import wrappers

    return wrappers.ToLinen


def _is_to_linen(cls: type) -> bool:
    """Whether ``cls`` is ToLinen or a subclass (false where flax.nnx's bridge was never imported)."""
    wrappers = sys.modules.get("flax.nnx.bridge.wrappers")
    return wrappers is not None and isinstance(cls, type) and issubclass(cls, wrappers.ToLinen)


def _describe_to_linen(obj: Any, what: str, lenient: bool) -> dict:
    """``nnx.bridge.ToLinen(MyModule, args=..., kwargs=...)``: the nnx class by name (it must be importable, as a
    linen policy's class must) and its constructor's arguments as plain data; ``metadata_fn`` only where it is
    not flax's default."""
    nnx_class = obj.nnx_class
    path = _importable(nnx_class) if isinstance(nnx_class, type) else None
    if path is None or nnx_class.__module__ == "__main__":
        shown = (f"{nnx_class.__module__}:{nnx_class.__qualname__}" if isinstance(nnx_class, type)
                 else repr(nnx_class))
        if not lenient:
            raise DescriptionError(
                f"{what}.nnx_class is {shown}, which cannot be imported by name; define the nnx module at module "
                f"level in an importable module (not __main__ or a notebook)" if isinstance(nnx_class, type) else
                f"{what}.nnx_class is {shown}, not a class: give ToLinen the nnx module's class and its constructor's "
                f"arguments as args=(...), kwargs={{...}}")
        described_class: Any = {"__unimportable__": shown}
    elif _root(nnx_class.__module__) in LIBRARY_PACKAGES:
        if not lenient:
            raise DescriptionError(library_nnx_class(f"{what}.nnx_class", path))
        described_class = {"__unimportable__": path}
    else:
        described_class = {"__nnx_class__": path}
    kwargs = dict(obj.kwargs)
    if not all(isinstance(k, str) for k in kwargs):
        raise DescriptionError(f"{what}.kwargs has keys that are not strings: {sorted(map(repr, kwargs))}")
    fields = {
        "nnx_class": described_class,
        "args": describe_value(tuple(obj.args), f"{what}.args", lenient=lenient),
        "kwargs": {"__mapping__": {k: describe_value(v, f"{what}.kwargs[{k!r}]", lenient=lenient)
                                   for k, v in kwargs.items()}},
        "skip_rng": describe_value(obj.skip_rng, f"{what}.skip_rng", lenient=lenient),
    }
    default = {f.name: f.default for f in dataclasses.fields(obj)}.get("metadata_fn")
    if getattr(obj, "metadata_fn", default) is not default:
        fields["metadata_fn"] = describe_value(obj.metadata_fn, f"{what}.metadata_fn", lenient=lenient)
    return {"class": TO_LINEN, "fields": fields}


def library_nnx_class(what: str, path: str) -> str:
    return (f"{what} is {path}, a class of {_root(path.partition(':')[0])}'s own: a file names as a ToLinen's nnx class "
            f"only a class of your own module (a library's cannot be allowed); define an nnx module of your own that "
            f"holds it (self.layer = nnx.Linear(...) in its __init__) and give that class to ToLinen")


def _check_to_linen(value: dict, role: str, what: str) -> None:
    """A ToLinen calls the class it is given: built only as the policy itself, its ``nnx_class`` only in the
    ``{"__nnx_class__": "module:Class"}`` form (a flax.nnx.Module subclass, checked where it resolves), its kwargs a
    mapping."""
    if role != "policy":
        raise RefusedError(f"{what}: ToLinen is built only as the policy itself (a flax.nnx module of your own through "
                           f"Flax's bridge), not inside another object")
    fields = value.get("fields", {})
    described = fields.get("nnx_class") if isinstance(fields, dict) else None
    if isinstance(described, dict) and set(described) == {"__unimportable__"}:  # a checkpoint's record of one
        raise DescriptionError(f"{what}.nnx_class: {described['__unimportable__']} was recorded but cannot be rebuilt "
                               f"from a description (a class of __main__ or a notebook, or of a library); resume the "
                               f"run where that class is, with jes.train(ToLinen(...), ..., resume=path)")
    if not (isinstance(described, dict) and set(described) == {"__nnx_class__"}):
        raise RefusedError(f"{what}.nnx_class: a ToLinen's nnx_class must name a flax.nnx.Module subclass, as "
                           f"{{'__nnx_class__': 'module:Class'}}")
    kwargs = fields.get("kwargs", {"__mapping__": {}})
    if not (isinstance(kwargs, dict) and set(kwargs) == {"__mapping__"}):
        raise RefusedError(f"{what}.kwargs: a ToLinen's kwargs must be a mapping, as {{'__mapping__': {{...}}}}")


def policy_class_of(description: Any) -> str | None:
    """The ``"module:QualName"`` of the user's class a policy description stands for: its class, or a ``ToLinen``'s
    nnx module class (what an imported module admits, :func:`jes.checkpoint.checkpoint_allowlist`)."""
    if not isinstance(description, dict):
        return None
    path = description.get("class")
    if path == TO_LINEN:  # only the form _check_to_linen builds: anything else admits nothing
        fields = description.get("fields")
        described = fields.get("nnx_class") if isinstance(fields, dict) else None
        exact = isinstance(described, dict) and set(described) == {"__nnx_class__"}
        path = described["__nnx_class__"] if exact else None
    return path if isinstance(path, str) else None


def current_directory_importable() -> None:
    """Put the working directory on ``sys.path``, as ``python -m`` does and the ``jes`` and ``jes-worker`` console
    scripts do not: a module of the user's own (``--policy MODULE:CLASS``, ``--allow-module MODULE``) imports from
    where they run the command. What may be built from it is still only what the allowlist admits."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def import_modules(modules: Sequence[str], flag: str = "--import") -> None:
    """Import the user's ``modules`` (``--import MODULE``: e.g. one that registers a Gymnasium id with
    ``gymnasium.register``) from the working directory or PYTHONPATH. The user names them on the command line,
    never a message or a file.

    Raises:
        ValueError: a module that does not import (the message names it and the error).
    """
    if modules:
        current_directory_importable()
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - any failure of the user's module is reported as theirs
            raise ValueError(f"{flag} {module}: {type(err).__name__}: {err}") from err


def own_modules(description: Any) -> tuple[str, ...]:
    """The modules outside jes's registry whose classes or functions ``description`` names (a policy of the user's
    own, its layers, an activation): what a worker this process starts itself must allow to rebuild the run.
    Modules of libraries and denied modules are left out (they are never allowed)."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key in ("class", "__callable__", "callable", "__nnx_class__"):
                path = value.get(key)
                if isinstance(path, str) and ":" in path:
                    module = path.partition(":")[0]
                    if (module and module != "__main__" and _root(module) not in LIBRARY_PACKAGES
                            and _root(module) not in DENIED_MODULES and module not in found):
                        found.append(module)
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    walk(description)
    return tuple(found)


# --------------------------------------------------------------------- build
def resolve(path: Any, allow: Allowlist, what: str, kind: str = "class") -> Any:
    """The class (``kind="class"``) or function (``"callable"``) at ``"module:qualname"``, if admitted.

    Admitted: a registered object (:func:`registered_classes`, :func:`registered_callables`), a
    class of gymnax's env family, or an object *defined in* a module ``allow`` opted in to.

    Raises:
        RefusedError: none of these, a denied or library module, or a path through a module or dunder.
        DescriptionError: malformed, or an opted-in module that is not importable here.
    """
    if not isinstance(path, str) or path.count(":") != 1:
        raise DescriptionError(f"{what}: {path!r} is not a 'module:attribute' path")
    registry = registered_classes() if kind == "class" else registered_callables()
    if path in registry:
        return registry[path]
    if kind == "class" and path == TO_LINEN:
        return _to_linen_class()
    module_name, qualname = path.split(":")
    parts = qualname.split(".")
    if not all(p.isidentifier() and not p.startswith("__") for p in parts):
        raise RefusedError(f"{what}: {path!r} names a dunder or malformed attribute")
    # Nor a dunder module (``pkg.__main__`` runs a package's command line when imported, ``pkg.__init__`` imports it
    # twice): a description names objects of ordinary modules; importing runs a module's top-level code.
    if not all(p.isidentifier() and not p.startswith("__") for p in module_name.split(".")):
        raise RefusedError(f"{what}: {path!r} names a dunder or malformed module")
    family = kind == "class" and _under(module_name, _ENV_FAMILY) and len(parts) == 1
    single = kind == "class" and path in allow.classes
    if not family and not single and not allow.allows(module_name):
        registered = "classes" if kind == "class" else "functions (activations, dtypes)"
        raise NotAllowedError(
            f"{what}: {path!r} is not one of jes's registered {registered} and is outside the allowed modules "
            f"{list(allow.modules)}; a description is data and names only registered code. For a policy or env of "
            f"your own, allow its module with allow_modules=[...] / --allow-module MODULE", module_name
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - an allowed module that fails to import here
        raise DescriptionError(f"{what}: cannot import {module_name!r} here: {type(err).__name__}: {err}") from err
    for part in parts:
        try:
            obj = getattr(obj, part)
        except AttributeError as err:
            raise DescriptionError(f"{what}: cannot import {path!r} here: {err}") from err
        if isinstance(obj, types.ModuleType):
            raise RefusedError(f"{what}: {path!r} walks into the module {obj.__name__}; name objects by their "
                               f"defining module")
    defined_in = getattr(obj, "__module__", None)
    if family:
        from gymnax.environments.environment import Environment  # gymnax is a dependency of jes

        from jes.lazy_gymnax import keep_mnist_private

        keep_mnist_private()  # MNISTBandit, built here, reads MNIST from the user's own folder, not /tmp's

        is_env = isinstance(obj, type) and issubclass(obj, Environment)
        if not (isinstance(defined_in, str) and _under(defined_in, _ENV_FAMILY) and isinstance(obj, type)
                and (is_env or dataclasses.is_dataclass(obj))):
            raise RefusedError(f"{what}: {path!r} is not a gymnax environment class or its parameter dataclass")
        return obj
    if not allow.allows(defined_in) and not (single and defined_in == module_name):
        raise NotAllowedError(f"{what}: {path!r} resolves to {obj!r} defined in {defined_in!r}, which is not allowed",
                              defined_in)
    return obj


def _check_role(cls: type, role: str, what: str) -> None:
    if role == "policy":
        import flax.linen as nn  # an allowed dependency, imported only when a policy is built

        ok, need = issubclass(cls, nn.Module), "a flax.linen.Module subclass"
    elif role == "env":
        ok = all(callable(getattr(cls, m, None)) for m in ("reset_env", "step_env", "action_space", "observation_space"))
        need = "a gymnax-style environment class (reset_env, step_env, action_space, observation_space)"
    else:
        ok, need = dataclasses.is_dataclass(cls), "a dataclass"
    if not ok:
        raise RefusedError(f"{what}: {cls.__module__}:{cls.__qualname__} is not {need}")


# The keys that say which form a described value takes (one per value).
_FORM_KEYS = ("__seq__", "__mapping__", "__nnx_class__", "__callable__", "callable", "class", "__unimportable__",
              "__repr__")
# How deeply a description may nest (jes's own policies: a few levels); deeper is malformed, not a RecursionError.
MAX_DEPTH = 64


def _walk(value: Any, allow: Allowlist, what: str, build: bool, role: str = "value", depth: int = 0) -> Any:
    if isinstance(value, _PLAIN):
        return value
    if depth >= MAX_DEPTH:
        shown = what if len(what) <= 120 else f"{what[:60]}...{what[-60:]}"
        raise DescriptionError(f"{shown}: nested deeper than {MAX_DEPTH} levels; not a description jes writes")
    if isinstance(value, list):  # checkpoints of format 1 stored tuples as lists
        items = [_walk(v, allow, f"{what}[{i}]", build, depth=depth + 1) for i, v in enumerate(value)]
        return tuple(items) if build else None
    if not isinstance(value, dict):
        raise DescriptionError(f"{what}: {type(value).__name__} is not a description")
    forms = [k for k in _FORM_KEYS if k in value]
    if len(forms) > 1:  # one value, one form: a reader must never see another one than the check did
        raise DescriptionError(f"{what}: malformed value: both {forms[0]!r} and {forms[1]!r}")
    if forms and forms[0] in ("__mapping__", "__nnx_class__") and len(value) != 1:
        raise DescriptionError(f"{what}: malformed {forms[0]}: other keys {sorted(k for k in value if k != forms[0])}")
    if "__seq__" in value:
        seq = value["__seq__"]
        if not isinstance(seq, list):
            raise DescriptionError(f"{what}: malformed sequence")
        items = [_walk(v, allow, f"{what}[{i}]", build, depth=depth + 1) for i, v in enumerate(seq)]
        return (tuple(items) if value.get("tuple") else items) if build else None
    if "__mapping__" in value:  # a ToLinen's kwargs: string keys, an immutable mapping as the field was
        items = value["__mapping__"]
        if not isinstance(items, dict) or not all(isinstance(k, str) for k in items):
            raise DescriptionError(f"{what}: malformed mapping")
        built = {k: _walk(v, allow, f"{what}[{k!r}]", build, depth=depth + 1) for k, v in items.items()}
        if not build:
            return None
        from flax.core import FrozenDict

        return FrozenDict(built)
    if "__nnx_class__" in value:  # a ToLinen's module class: a flax.nnx.Module subclass from an allowed module
        path = value["__nnx_class__"]
        if role != "nnx_class":
            raise RefusedError(f"{what}: an nnx module class stands only as a ToLinen's nnx_class")
        if isinstance(path, str) and _root(path.partition(":")[0]) in LIBRARY_PACKAGES:
            raise RefusedError(library_nnx_class(what, path))
        cls = resolve(path, allow, what)
        from flax import nnx

        if not (isinstance(cls, type) and issubclass(cls, nnx.Module)):
            raise RefusedError(f"{what}: {value['__nnx_class__']!r} is not a flax.nnx.Module subclass")
        return cls
    if "__callable__" in value or "callable" in value:  # "callable": checkpoints of format 1
        obj = resolve(value.get("__callable__", value.get("callable")), allow, what, kind="callable")
        registered = any(obj is fn for fn in registered_callables().values())  # dtypes are classes
        if (isinstance(obj, type) and not registered) or not callable(obj):
            raise RefusedError(f"{what}: {obj!r} is not a function")
        return obj
    if "class" in value:
        cls = resolve(value["class"], allow, what)
        if not isinstance(cls, type):
            raise RefusedError(f"{what}: {value['class']!r} is not a class")
        _check_role(cls, role, what)
        if value["class"] == TO_LINEN or _is_to_linen(cls):
            _check_to_linen(value, role, what)
        fields = value.get("fields", {})
        if not isinstance(fields, dict) or not all(isinstance(k, str) for k in fields):
            raise DescriptionError(f"{what}: malformed fields")
        if dataclasses.is_dataclass(cls):
            known = {f.name for f in dataclasses.fields(cls) if f.init}
            unknown = sorted(set(fields) - known)
        else:
            unknown = sorted(fields)
        if unknown:
            raise DescriptionError(f"{what}: {cls.__qualname__} has no field(s) {unknown}")
        to_linen = value["class"] == TO_LINEN or _is_to_linen(cls)
        kwargs = {k: _walk(v, allow, f"{what}.{k}", build, role="nnx_class" if to_linen and k == "nnx_class" else "value",
                           depth=depth + 1) for k, v in fields.items()}
        if not build:
            return None
        try:
            return cls(**kwargs)
        except Exception as err:  # noqa: BLE001 - an allowed class rejecting its fields
            detail = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__  # a bare assert says nothing
            raise DescriptionError(f"{what}: {cls.__qualname__}(...) failed: {detail}") from err
    if "__unimportable__" in value or "__repr__" in value:
        raise DescriptionError(f"{what}: {value.get('__unimportable__', value.get('__repr__'))} was recorded but "
                               f"cannot be rebuilt from a description")
    raise DescriptionError(f"{what}: unknown value form {sorted(value)}")


def build_value(value: Any, allow: Allowlist, what: str = "value", role: str = "value") -> Any:
    """The value a :func:`describe_value` description stands for, built only if ``allow`` admits all of it.

    ``role`` (``"policy"``, ``"env"``, ``"value"``) is the kind of class a top-level object must be.
    The whole description is checked before anything is constructed.

    Raises:
        RefusedError: some part is outside the allowlist or of the wrong kind (nothing was built).
        DescriptionError: malformed, not importable here, or a constructor rejected its fields.
    """
    _walk(value, allow, what, build=False, role=role)
    return _walk(value, allow, what, build=True, role=role)


def build_object(description: Any, allow: Allowlist, what: str = "object", role: str = "value") -> Any:
    """An object from :func:`describe_object` output (see :func:`build_value`)."""
    if not isinstance(description, dict) or "class" not in description:
        raise DescriptionError(f"{what}: expected {{'class': ..., 'fields': ...}}, got {type(description).__name__}")
    return build_value(description, allow, what, role)


# ---------------------------------------------------------------------- runs
def describe_run(policy: Any, config: Any, env: Any, optimizer: Any, env_params: Any = None,
                 **extra: Any) -> dict:
    """Plain data from which :func:`build_run_parts` rebuilds a run's pieces.

    Args:
        policy: the Flax policy module.
        config: the :class:`jes.ESConfig` (schedules cannot travel).
        env: a gymnax env name or env object (described by class).
        optimizer: an optimizer *name*.
        env_params: env parameters (a dataclass) or ``None``.
        extra: further named parts, each a dataclass or plain value described generically
            (e.g. ``strategy=jes.strategies.PGPE(...)``); built back with the default role.

    Raises:
        DescriptionError: a part that cannot travel as data (an optax transformation you built, a
            schedule, a lambda, a class defined in ``__main__`` or a notebook...).
    """
    if optimizer is not None and not isinstance(optimizer, str):
        raise DescriptionError(
            f"distributed runs need the optimizer by name ({type(optimizer).__name__} given): workers rebuild "
            f"it from its name; use e.g. optimizer='adam' and config.learning_rate"
        )
    fields = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if callable(value):
            raise DescriptionError(
                f"ESConfig.{f.name} is a schedule ({value!r}); distributed runs need plain numbers so that "
                f"workers can rebuild the run"
            )
        fields[f.name] = describe_value(value, f"ESConfig.{f.name}")
    if isinstance(env, tuple) and len(env) == 2 and env_params is None:
        env, env_params = env  # gymnax's (env, params): travels as the env object and its params, as make_env reads it
    if isinstance(env, tuple):
        raise DescriptionError("pass the env by name or as an env object with env_params=..., or as (env, params) "
                               "without env_params=")
    return {
        "policy": describe_object(policy, "policy"),
        "env": env if isinstance(env, str) else describe_object(env, "env"),
        "env_params": None if env_params is None else describe_object(env_params, "env_params"),
        "optimizer": optimizer,
        "config": fields,
        **{name: describe_value(value, name) for name, value in extra.items()},
    }


RUN_KEYS = ("policy", "env", "env_params", "optimizer", "config")


def build_run_parts(description: Any, allow: Allowlist, make_config: Callable[..., Any] | None = None) -> dict:
    """The pieces of a run (policy, env, env_params, optimizer, config, and any extra parts) from :func:`describe_run`.

    Everything is checked against ``allow`` first; nothing is constructed if any part is refused.

    Raises:
        RefusedError, DescriptionError: as :func:`build_value`.
    """
    if not isinstance(description, dict) or any(k not in description for k in RUN_KEYS):
        raise DescriptionError(f"malformed run description: needs {list(RUN_KEYS)}")
    if make_config is None:
        from jes.config import ESConfig  # imported here so that `import jes.describe` stays light

        make_config = ESConfig
    optimizer, env, config = description["optimizer"], description["env"], description["config"]
    if optimizer is not None and not isinstance(optimizer, str):
        raise DescriptionError("malformed run description: the optimizer must be a name")
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise DescriptionError("malformed run description: config must be a map of fields")
    extra = {k: v for k, v in description.items() if k not in RUN_KEYS and k != "version"}
    policy, env_params = description["policy"], description["env_params"]
    if not isinstance(policy, dict) or "class" not in policy:
        raise DescriptionError("malformed run description: the policy must be an object description")
    if not isinstance(env, str) and not (isinstance(env, dict) and "class" in env):
        raise DescriptionError("malformed run description: the env must be a name or an object description")
    if env_params is not None and not (isinstance(env_params, dict) and "class" in env_params):
        raise DescriptionError("malformed run description: env_params must be an object description (an EnvParams "
                               "dataclass) or None")
    roles = [("policy", policy, "policy")]
    if not isinstance(env, str):
        roles.append(("env", env, "env"))
    if env_params is not None:
        roles.append(("env_params", env_params, "value"))
    # Check everything, then build: a refusal anywhere creates nothing.
    for name, value, role in roles:
        _walk(value, allow, name, build=False, role=role)
    for name, value in config.items():
        _walk(value, allow, f"config.{name}", build=False)
    for name, value in extra.items():
        _walk(value, allow, name, build=False)
    parts = {name: _walk(value, allow, name, build=True, role=role) for name, value, role in roles}
    parts.setdefault("env", env)
    parts.setdefault("env_params", None)
    try:
        parts["config"] = make_config(**{k: _walk(v, allow, f"config.{k}", build=True) for k, v in config.items()})
    except DescriptionError:
        raise
    except Exception as err:  # noqa: BLE001 - unknown or invalid config fields
        raise DescriptionError(f"malformed run description: config: {type(err).__name__}: {err}") from err
    parts["optimizer"] = optimizer
    parts.update({name: _walk(value, allow, name, build=True) for name, value in extra.items()})
    return parts
