"""Wire format of distributed jes: authenticated msgpack messages, array and state encoding, run descriptions.

Every message is two ZeroMQ frames, ``[body, mac]``: ``body`` is a msgpack map
with a ``"type"`` string, ``mac`` is HMAC-SHA256 of ``body`` under the shared
secret. Receivers check the frame count, the size and the MAC *before* they
unpack anything, then unpack with msgpack's size limits and validate every
field they use; anything else is a :class:`ProtocolError` (dropped and logged
by the caller). Nothing is ever pickled: arrays travel as
``{"dtype", "shape", "data"}`` with a whitelist of dtypes, and a run is
described by plain data (class paths and fields) that the worker rebuilds.

Messages (worker -> master):
    ``request``   {name, run, gen, hash, last_aid, devices}: idle, give me work.
    ``result``    {run, gen, hash, aid, start, stop, fitness, env_steps, obs_sum, obs_sumsq, seconds}.
    ``heartbeat`` {name}: still alive (sent by the worker's I/O thread while it computes).
    ``bye``       {aid}: leaving; my assignment goes back to the queue.

Messages (master -> worker):
    ``setup``     {run, description, heartbeat_interval}: the run to build (then the worker asks for work).
    ``snapshot``  {run, gen, hash, state}: the full training state.
    ``work``      {run, gen, hash, aid, start, stop, update}: evaluate chunks ``[start, stop)`` of the
                  state with this generation and hash; ``update`` (or ``None``) holds the previous
                  generation's per-chunk results ``{gen, hash, fitness, env_steps, obs_sum, obs_sumsq}``
                  that turn the worker's previous state into this one.
    ``wait``      {}: no work right now.
    ``pong``      {}: answer to a heartbeat.
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import importlib
import os
from typing import Any

import msgpack
import numpy as np

from jes.envs import resolvable_name

PROTOCOL_VERSION = 1
MAC_BYTES = 32
# Per-message ceilings. Master-bound messages are small (fitness and obs sums); worker-bound
# ones may carry a full state snapshot.
MAX_TO_MASTER_BYTES = 16 * 2**20
MAX_TO_WORKER_BYTES = 1024 * 2**20
ALLOWED_DTYPES = ("float32", "float64", "int32", "int64", "uint32", "uint8", "bool")
SECRET_ENV = "JES_SECRET"


class ProtocolError(ValueError):
    """A message that is unauthenticated, malformed, truncated, oversized or unexpected."""


class DescriptionError(ValueError):
    """A run that cannot be described as plain data for remote workers."""


# ------------------------------------------------------------------ secrets
def load_secret(secret: bytes | str | None = None, secret_file: str | None = None) -> bytes:
    """The HMAC key from ``secret``, else ``secret_file``, else the ``JES_SECRET`` environment variable.

    Raises:
        ValueError: no secret anywhere, or one shorter than 16 bytes.
    """
    if secret is None and secret_file is not None:
        try:
            with open(secret_file, "rb") as f:
                secret = f.read().strip()
        except OSError as err:
            raise ValueError(f"cannot read secret file {secret_file!r}: {err}") from err
    if secret is None:
        secret = os.environ.get(SECRET_ENV)
    if secret is None:
        raise ValueError(
            "distributed jes needs a shared secret: pass secret=..., --secret-file FILE, or set the "
            f"{SECRET_ENV} environment variable (e.g. `head -c 32 /dev/urandom | base64 > jes.secret`)"
        )
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    if len(key) < 16:
        raise ValueError(f"the shared secret is {len(key)} bytes; use at least 16 (32 random bytes recommended)")
    return key


# ------------------------------------------------------------------ framing
def encode(message: dict, key: bytes) -> list[bytes]:
    """``[body, mac]`` frames for ``message`` (a dict with a ``"type"``)."""
    body = msgpack.packb(message, use_bin_type=True)
    return [body, hmac.new(key, body, hashlib.sha256).digest()]


def decode(frames: list[bytes], key: bytes, max_bytes: int) -> dict:
    """Check and unpack ``[body, mac]``; raises :class:`ProtocolError` on anything wrong."""
    if len(frames) != 2:
        raise ProtocolError(f"expected 2 frames, got {len(frames)}")
    body, mac = frames
    if len(body) > max_bytes:
        raise ProtocolError(f"oversized message ({len(body)} bytes > {max_bytes})")
    if len(mac) != MAC_BYTES:
        raise ProtocolError(f"bad MAC frame length {len(mac)}")
    if not hmac.compare_digest(hmac.new(key, body, hashlib.sha256).digest(), mac):
        raise ProtocolError("bad MAC (wrong secret or corrupted message)")
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as err:  # msgpack raises several types for malformed input
        raise ProtocolError(f"undecodable body: {type(err).__name__}: {err}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("message is not a map with a 'type'")
    return message


def field(message: dict, name: str, kind: type | tuple, *, optional: bool = False) -> Any:
    """``message[name]`` checked to be of ``kind`` (``bool`` is never accepted as an int)."""
    if name not in message or message[name] is None:
        if optional:
            return None
        raise ProtocolError(f"{message.get('type')!r} message lacks field {name!r}")
    value = message[name]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ProtocolError(f"field {name!r} has type bool")
    if not isinstance(value, kind):
        raise ProtocolError(f"field {name!r} has type {type(value).__name__}")
    return value


# ------------------------------------------------------------------- arrays
def pack_array(array: Any) -> dict:
    """``{"dtype", "shape", "data"}`` of a numpy/JAX array (C order, little endian)."""
    arr = np.asarray(array)  # tobytes() is C order; ascontiguousarray would turn scalars into [1]
    if arr.dtype.name not in ALLOWED_DTYPES:
        raise TypeError(f"cannot send arrays of dtype {arr.dtype}")
    return {"dtype": arr.dtype.name, "shape": list(arr.shape), "data": arr.astype(arr.dtype.newbyteorder("<")).tobytes()}


def unpack_array(value: Any, dtype: str | None = None, shape: tuple | None = None) -> np.ndarray:
    """Inverse of :func:`pack_array`, checking dtype, shape and byte count."""
    if not isinstance(value, dict):
        raise ProtocolError("array field is not a map")
    name, dims, data = value.get("dtype"), value.get("shape"), value.get("data")
    if name not in ALLOWED_DTYPES or not isinstance(dims, list) or not isinstance(data, bytes):
        raise ProtocolError("malformed array")
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**31 for d in dims) or len(dims) > 8:
        raise ProtocolError("malformed array shape")
    dt = np.dtype(name).newbyteorder("<")
    if len(data) != int(np.prod(dims, dtype=np.int64)) * dt.itemsize:
        raise ProtocolError(f"array data has {len(data)} bytes, shape {dims} of {name} needs more or fewer")
    if dtype is not None and name != dtype:
        raise ProtocolError(f"array dtype {name}, expected {dtype}")
    if shape is not None and tuple(dims) != tuple(shape):
        raise ProtocolError(f"array shape {tuple(dims)}, expected {tuple(shape)}")
    return np.frombuffer(data, dt).astype(np.dtype(name)).reshape(dims)


# -------------------------------------------------------------------- state
def state_leaves(state: Any) -> dict:
    """The training state as a nested dict of numpy arrays (the PRNG key as raw ``uint32`` data)."""
    import jax
    from flax import serialization

    raw = state.replace(es_key=jax.random.key_data(state.es_key))
    return jax.tree.map(np.asarray, serialization.to_state_dict(jax.device_get(raw)))


def state_hash(state: Any) -> str:
    """SHA-256 (hex, 32 chars) over every leaf's path, dtype, shape and bytes: equal iff bit-identical."""
    import jax

    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(state_leaves(state))[0]:
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(f"{leaf.dtype.name}{leaf.shape}".encode())
        digest.update(np.ascontiguousarray(leaf).tobytes())
    return digest.hexdigest()[:32]


def pack_state(state: Any) -> dict:
    """A :class:`jes.TrainState` as nested msgpack-able maps of packed arrays."""
    import jax

    return jax.tree.map(pack_array, state_leaves(state))


def unpack_state(trainer: Any, packed: Any) -> Any:
    """Rebuild a state for ``trainer`` from :func:`pack_state` output, checking every leaf against the template."""
    import jax
    from flax import serialization

    template = trainer.init_state(0)
    template_leaves = state_leaves(template)

    def restore(tmpl: dict | np.ndarray, value: Any, where: str):
        if isinstance(tmpl, dict):
            if not isinstance(value, dict) or set(value) != set(tmpl):
                raise ProtocolError(f"state snapshot structure differs at {where or 'top'}")
            return {k: restore(tmpl[k], value[k], f"{where}/{k}") for k in tmpl}
        return unpack_array(value, tmpl.dtype.name, tmpl.shape)

    leaves = restore(template_leaves, packed, "")
    raw_template = template.replace(es_key=jax.random.key_data(template.es_key))
    state = serialization.from_state_dict(raw_template, leaves)
    state = state.replace(es_key=jax.random.wrap_key_data(np.asarray(state.es_key, np.uint32)))
    return trainer.place(state)


# --------------------------------------------------------- run descriptions
_PLAIN = (type(None), bool, int, float, str)


def _path_of(obj: Any) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


def import_path(path: str) -> Any:
    """The object at ``"package.module:attribute"``."""
    if not isinstance(path, str) or path.count(":") != 1:
        raise DescriptionError(f"{path!r} is not an importable 'module:attribute' path")
    module, attr = path.split(":")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise DescriptionError(f"cannot import {path!r} on this worker: {err}") from err
    return obj


def _importable(obj: Any) -> str | None:
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not name or "<" in name:
        return None
    path = f"{module}:{name}"
    try:
        return path if import_path(path) is obj else None
    except DescriptionError:
        return None


def describe_value(value: Any, what: str) -> Any:
    """Plain-data form of a field value: scalars, lists, importable functions and classes."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        return {"__seq__": [describe_value(v, what) for v in value], "tuple": isinstance(value, tuple)}
    if callable(value):
        path = _importable(value)
        if path is None:
            raise DescriptionError(
                f"{what} holds the callable {value!r}, which workers cannot import by name; use a module-level "
                f"function or class (importable as 'module:name'), not a lambda, closure or schedule"
            )
        return {"__callable__": path}
    if dataclasses.is_dataclass(value):
        return describe_object(value, what)
    raise DescriptionError(f"{what} holds {type(value).__name__} {value!r}, which is not plain data")


def build_value(value: Any) -> Any:
    if isinstance(value, dict) and "__seq__" in value:
        items = [build_value(v) for v in value["__seq__"]]
        return tuple(items) if value.get("tuple") else items
    if isinstance(value, dict) and "__callable__" in value:
        return import_path(value["__callable__"])
    if isinstance(value, dict) and "class" in value:
        return build_object(value)
    if isinstance(value, dict):
        raise DescriptionError(f"unknown value form {sorted(value)}")
    return value


def describe_object(obj: Any, what: str) -> dict:
    """``{"class": "module:Class", "fields": {...}}`` for a dataclass (Flax modules are) or a no-argument object."""
    path = _importable(type(obj))
    if path is None:
        raise DescriptionError(
            f"{what} is a {type(obj).__qualname__} from {type(obj).__module__}, which workers cannot import; "
            f"define it at module level in an importable module"
        )
    fields = {}
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            if f.name in ("parent", "name") or not f.init:
                continue
            fields[f.name] = describe_value(getattr(obj, f.name), f"{what}.{f.name}")
    return {"class": path, "fields": fields}


def build_object(desc: dict) -> Any:
    cls = import_path(desc["class"])
    if not isinstance(cls, type):
        raise DescriptionError(f"{desc['class']} is not a class")
    return cls(**{k: build_value(v) for k, v in desc.get("fields", {}).items()})


def describe_run(trainer: Any, env: Any, optimizer: Any, env_params: Any = None) -> dict:
    """Plain data from which a worker rebuilds an identical :class:`jes.Trainer`.

    Raises:
        DescriptionError: a part that cannot travel as data (an optax transformation you built,
            a schedule, a lambda, a class defined in ``__main__`` or a notebook...).
    """
    if not isinstance(optimizer, str):
        raise DescriptionError(
            f"distributed runs need the optimizer by name ({type(optimizer).__name__} given): workers rebuild "
            f"it from its name; use e.g. optimizer='adam' and config.learning_rate"
        )
    config = {}
    for f in dataclasses.fields(trainer.config):
        value = getattr(trainer.config, f.name)
        if callable(value):
            raise DescriptionError(
                f"ESConfig.{f.name} is a schedule ({value!r}); distributed runs need plain numbers so that "
                f"workers can rebuild the run"
            )
        config[f.name] = describe_value(value, f"ESConfig.{f.name}")
    if isinstance(env, str):
        env_desc: Any = env
    elif isinstance(env, tuple):
        raise DescriptionError("pass the env by name or as an env object with env_params=..., not as a tuple")
    elif resolvable_name(env) is not None:   # brax / masked env objects travel by name (it carries the backend)
        env_desc = trainer.spec.name
    else:
        env_desc = describe_object(env, "env")
    if type(trainer.policy).__module__ == "__main__":
        raise DescriptionError(
            f"policy class {type(trainer.policy).__qualname__} is defined in __main__; move it to an importable module"
        )
    return {
        "version": PROTOCOL_VERSION,
        "policy": describe_object(trainer.policy, "policy"),
        "env": env_desc,
        "env_params": None if env_params is None else describe_object(env_params, "env_params"),
        "optimizer": optimizer,
        "config": config,
    }


def build_run(description: dict, devices: Any = None) -> Any:
    """A :class:`jes.Trainer` from :func:`describe_run` output."""
    from jes.config import ESConfig
    from jes.trainer import Trainer

    if not isinstance(description, dict) or description.get("version") != PROTOCOL_VERSION:
        raise DescriptionError(f"run description of another protocol version ({description.get('version')!r})")
    try:
        policy = build_object(description["policy"])
        env = description["env"] if isinstance(description["env"], str) else build_object(description["env"])
        env_params = None if description["env_params"] is None else build_object(description["env_params"])
        config = ESConfig(**{k: build_value(v) for k, v in description["config"].items()})
    except (KeyError, TypeError) as err:
        raise DescriptionError(f"malformed run description: {err}") from err
    return Trainer(policy, env, description["optimizer"], config, env_params=env_params, devices=devices)


def run_id(description: dict, state_key_data: bytes) -> str:
    """Identity of a run: its description and its PRNG key."""
    digest = hashlib.sha256(msgpack.packb(description, use_bin_type=True))
    digest.update(state_key_data)
    return digest.hexdigest()[:16]
