"""Schemas of the files jes reads: every field's type checked before it is used, each problem named.

A checkpoint or ``.policy`` file may come from anyone and its checksum proves nothing (anyone can
compute one), so a reader validates the decoded content against a schema before it touches a
field: a malformed file gives one :class:`SchemaError` naming the field and what was found,
never a raw ``KeyError`` / ``TypeError`` from deep inside the reader.

Spec forms (small on purpose):

* a type or a tuple of types (``None`` stands for ``type(None)``): ``isinstance``, where ``int``
  never admits ``bool``; a tuple holding other specs is a choice of alternatives;
* ``{"key": spec, "key?": spec}``: a dict with string keys; keys ending in ``?`` may be missing;
  other keys are allowed (files of later minor versions);
* ``[spec]``: a list whose items all match ``spec``;
* :class:`Check`: a spec plus a predicate (a range, a length);
* :class:`Array`: a numpy array of a dtype kind and number of dimensions;
* :data:`ANY`: anything.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

import numpy as np
from flax import serialization

ANY = object()
INT = (int,)
NUMBER = (int, float)
# Shapes and counts a file may state; beyond these it is junk, not a run (and building it would exhaust memory).
MAX_DIM = 1 << 31


class SchemaError(ValueError):
    """Decoded file content that does not match the schema of its format."""


@dataclasses.dataclass(frozen=True)
class Check:
    """``spec`` and then ``predicate(value)``, failing with ``need`` (e.g. ``"an int >= 0"``)."""

    spec: Any
    predicate: Callable[[Any], bool]
    need: str


@dataclasses.dataclass(frozen=True)
class Array:
    """A numpy array whose dtype kind is in ``kinds`` (``"f"``, ``"iu"``, ...) with ``ndim`` dimensions (any if None)."""

    kinds: str
    ndim: int | None = None


def non_negative_int() -> Check:
    return Check(INT, lambda v: 0 <= v < MAX_DIM, f"an int in [0, {MAX_DIM})")


def shape() -> Check:
    return Check([INT], lambda v: all(0 <= d < MAX_DIM for d in v) and len(v) <= 8
                 and int(np.prod(v, dtype=np.float64)) < MAX_DIM, "a shape (a list of at most 8 sizes)")


def _type_name(value: Any) -> str:
    return type(value).__name__


def _is_instance(value: Any, types: tuple) -> bool:
    types = tuple(type(None) if t is None else t for t in types)
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def problems(value: Any, spec: Any, where: str = "") -> list[str]:
    """Every mismatch of ``value`` against ``spec``, as ``"where: expected ..., found ..."`` lines."""
    label = where or "content"
    if spec is ANY:
        return []
    if isinstance(spec, type) or spec is None:
        spec = (spec,)
    if isinstance(spec, tuple) and not all(t is None or isinstance(t, type) for t in spec):
        # alternatives: the first that matches, else the problems of each
        found = [problems(value, alternative, where) for alternative in spec]
        return [] if any(not f for f in found) else [" or ".join(p for f in found for p in f[:1])]
    if isinstance(spec, tuple):
        if _is_instance(value, spec):
            return []
        names = "/".join("None" if t is None or t is type(None) else t.__name__ for t in spec)
        return [f"{label}: expected {names}, found {_type_name(value)}"]
    if isinstance(spec, Check):
        found = problems(value, spec.spec, where)
        if found:
            return found
        try:
            ok = bool(spec.predicate(value))
        except Exception:  # noqa: BLE001 - a predicate on junk: the value does not qualify
            ok = False
        return [] if ok else [f"{label}: expected {spec.need}, found {value!r:.80}"]
    if isinstance(spec, Array):
        if not isinstance(value, np.ndarray):
            return [f"{label}: expected an array, found {_type_name(value)}"]
        if value.dtype.kind not in spec.kinds or (spec.ndim is not None and value.ndim != spec.ndim):
            return [f"{label}: expected a {spec.ndim}-d array of kind {spec.kinds!r}, found {value.dtype}"
                    f"{list(value.shape)}"]
        return []
    if isinstance(spec, list):
        if not isinstance(value, list):
            return [f"{label}: expected a list, found {_type_name(value)}"]
        return [p for i, item in enumerate(value) for p in problems(item, spec[0], f"{label}[{i}]")]
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return [f"{label}: expected a map, found {_type_name(value)}"]
        if not all(isinstance(k, str) for k in value):
            return [f"{label}: keys must be strings"]
        found = []
        for key, sub in spec.items():
            name, optional = (key[:-1], True) if key.endswith("?") else (key, False)
            if name not in value:
                if not optional:
                    found.append(f"{label}: missing {name!r}")
                continue
            found.extend(problems(value[name], sub, f"{where}.{name}" if where else name))
        return found
    raise TypeError(f"unknown schema spec {spec!r}")


def validate(value: Any, spec: Any, what: str) -> None:
    """Raise :class:`SchemaError` listing every mismatch (``what`` names the file and part)."""
    found = problems(value, spec)
    if found:
        shown = found[:8] + ([f"... and {len(found) - 8} more"] if len(found) > 8 else [])
        raise SchemaError(f"{what} is malformed:\n  " + "\n  ".join(shown))


# A description as jes.describe writes it: an object, a value (recursively checked by jes.describe when built).
OBJECT = {"class": str, "fields?": dict}


def read_file(path: str, what: str, suffix: str) -> bytes:
    """The bytes of the jes file (``what``: "checkpoint", "policy file") at ``path``.

    Raises:
        FileNotFoundError: nothing at ``path``, or a directory there (a run's folder given for its file: the error
            names the folder's ``*suffix`` files, e.g. ``runs/x/checkpoint.ckpt``).
    """
    if os.path.isdir(path):
        inside = sorted(name for name in os.listdir(path) if name.endswith(suffix))
        hint = (f"give the file: {', '.join(os.path.join(path, name) for name in inside[:3])}" if inside else
                f"it holds no {suffix} file")
        raise FileNotFoundError(f"{path!r} is a directory, not a {what}; {hint}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no {what} at {path!r}")
    with open(path, "rb") as f:
        return f.read()


def decode(payload: bytes, content_spec: Any, meta_spec: Any, what: str) -> tuple[dict, dict]:
    """A jes file's msgpack ``payload`` with its JSON ``meta`` text, both validated: ``(content, meta)``.

    Raises:
        SchemaError: the payload or the meta does not decode, or does not match its spec (``what`` names the file).
    """
    not_jes = "; it was not written by jes (or by a jes this one cannot read)"
    try:
        content = serialization.msgpack_restore(payload)
    except Exception as err:  # noqa: BLE001 - a checksum-valid payload that does not decode: written by something else
        raise SchemaError(f"{what} cannot be decoded: {type(err).__name__}: {err}{not_jes}") from err
    try:
        validate(content, content_spec, what)
        try:
            meta = json.loads(content["meta"])
        except ValueError as err:
            raise SchemaError(f"{what} cannot be decoded: its meta is not JSON: {err}") from err
        except RecursionError as err:  # "[[[[..." deeper than Python's recursion limit
            raise SchemaError(f"{what} cannot be decoded: its meta is nested too deeply to be jes's") from err
        validate(meta, meta_spec, f"{what}: meta")
    except SchemaError as err:
        raise SchemaError(f"{err}{not_jes}") from err
    return content, meta


def _numeric(value: Any) -> np.ndarray | None:
    """``value`` as a numeric numpy array, or ``None`` (the readers' shape and type checks name anything else)."""
    if isinstance(value, (np.ndarray, np.generic)) and np.asarray(value).dtype.kind in "fiu":
        return np.asarray(value)
    return None


def non_finite(value: Any) -> int:
    """How many values of a numeric array are NaN or infinite (0 for anything else)."""
    array = _numeric(value)
    return 0 if array is None else int(array.size - np.count_nonzero(np.isfinite(array)))


def obs_stats_problem(count: tuple[str, Any]) -> str | None:
    """What makes a count of observations no normaliser can use (it divides the sums: positive and finite), naming
    the field, or ``None``. No run writes such a count (jes starts it at 0.01)."""
    name, value = count
    array = _numeric(value)
    if array is not None and not (np.isfinite(array).all() and (array > 0).all()):
        shown = f"is {array.item()!r}" if array.size == 1 else "holds values that are not positive and finite"
        return f"{name} {shown}; a count of observations is positive and finite"
    return None


def obs_sums_warning(*sums: tuple[str, Any]) -> str | None:
    """What is not finite among sums of observations and of their squares (``(name, value)`` pairs), or ``None``.
    A run whose env's observations left float32's range (a brax physics blow-up) writes such sums itself, so a file
    holding them loads, with this said."""
    for name, value in sums:
        bad = non_finite(value)
        if bad:
            return (f"{name} holds {bad} non-finite value(s) (NaN or infinite): observations normalised with it "
                    f"are NaN or 0 (observations past float32's range in the run, or the file was edited)")
    return None
