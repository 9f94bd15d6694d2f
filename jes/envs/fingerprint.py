"""Fingerprints of env values: bytes fed to a digest that are the same wherever the values are the same.

Brax env instances are named with a fingerprint of their physics (:func:`jes.envs.brax.physics_fingerprint`), JAX env
objects of one's own with one of their params and attributes (:func:`jes.envs.gymnax.values_fingerprint`), so that a
file of one warns when it is resumed on, or loaded for, an object holding other values.
"""
from __future__ import annotations

import dataclasses
import enum
import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def feed(digest: Any, value: Any, depth: int = 0) -> None:
    """Feed ``value`` to ``digest`` as bytes that are the same wherever it holds the same values: in every process
    and run, on any device, with 64-bit JAX or not. Numbers and arrays are fed by kind, shape and values in one
    canonical dtype (floats as float32, the precision of brax's physics without x64; ints as int64; a Python float
    and a 0-d float32 array alike: brax's spring ``System`` keeps its timestep as a float, ``tree_replace`` may
    make it an array); dataclasses (a ``System``, its parts) field by field, in order; sequences and dicts item by
    item. A MuJoCo ``MjModel`` (the rendering model a ``System`` keeps; physics reads the ``System``'s own arrays),
    a module, a function and an object of any other type count by their type or qualified name."""
    def put(tag: str, data: bytes = b"") -> None:
        digest.update(f"{tag}:{len(data)}:".encode() + data)

    if depth > 32:
        return put("deep")
    if isinstance(value, enum.Enum):   # before str and int: an IntEnum or StrEnum is one of them too
        return put(f"enum {type(value).__qualname__}", repr(value.value).encode())
    if value is None:
        return put("none")
    if isinstance(value, str):
        return put("str", value.encode())
    if isinstance(value, bytes):
        return put("bytes", bytes(value))
    if isinstance(value, (bool, int, float, complex, np.generic, np.ndarray, jax.Array)):
        try:
            array = np.asarray(value)
        except Exception:  # noqa: BLE001 - key arrays and the like: by their type
            return put(f"object {type(value).__module__}.{type(value).__qualname__}")
        if isinstance(value, int) and not isinstance(value, bool) and array.dtype.kind not in "iu":
            return put("bigint", str(value).encode())   # beyond 64 bits
        if array.dtype.kind == "b":
            canonical = array.astype(np.bool_)
        elif array.dtype.kind == "u" and array.dtype.itemsize == 8:
            canonical = array.astype("<u8")
        elif array.dtype.kind in "iu":
            canonical = array.astype("<i8")
        elif array.dtype.kind == "c":
            canonical = array.astype("<c8")
        elif np.issubdtype(array.dtype, np.floating) or jnp.issubdtype(array.dtype, jnp.floating):
            canonical = array.astype("<f4")
        elif array.dtype.kind == "O":   # an array of objects: item by item (its bytes are their addresses)
            put(f"objects {list(array.shape)}")
            for item in array.ravel().tolist():
                feed(digest, item, depth + 1)
            return None
        else:
            canonical = array
        return put(f"array {canonical.dtype.str}{list(canonical.shape)}", np.ascontiguousarray(canonical).tobytes())
    if type(value).__name__ == "MjModel" and type(value).__module__.split(".")[0] == "mujoco":
        return put("MjModel")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        put(f"dataclass {type(value).__qualname__}", str(len(fields)).encode())
        for field in fields:
            put("field", field.name.encode())
            feed(digest, getattr(value, field.name), depth + 1)
        return None
    if isinstance(value, (tuple, list)):
        put("sequence", str(len(value)).encode())
        for item in value:
            feed(digest, item, depth + 1)
        return None
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda item: repr(item[0]))
        put("dict", str(len(items)).encode())
        for key, item in items:
            feed(digest, key, depth + 1)
            feed(digest, item, depth + 1)
        return None
    if isinstance(value, types.ModuleType):
        return put("module", value.__name__.encode())
    if callable(value) and hasattr(value, "__qualname__"):
        return put("callable", f"{getattr(value, '__module__', '')}.{value.__qualname__}".encode())
    return put(f"object {type(value).__module__}.{type(value).__qualname__}")
