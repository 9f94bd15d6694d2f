"""Malformed checkpoint and ``.policy`` files for the readers' fuzz test and ``benchmarks/fuzz_files.py``.

Every input is a whole file on disk: random bytes, truncations, valid headers and checksums over junk
payloads, and valid files with one field replaced by a value of a wrong type (in the content and in
the meta, at every depth the readers look at).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import struct
from typing import Callable, Iterator

import msgpack
import numpy as np
from flax import serialization

HEADER = struct.Struct("<8sQ32s")
MAGICS = {"checkpoint": b"JESCKPT1", "policy": b"JESPOLI1"}
WRONG_VALUES = [None, True, 0, -1, 2 ** 40, 1.5, float("nan"), "x", "", [], [1, "a"], {}, {"class": 5},
                {"class": "os:system", "fields": {}}, [[[]]], {"__seq__": 3}]


def frame(kind: str, payload: bytes) -> bytes:
    """A file of ``kind`` with a correct header (length and sha256) around ``payload``."""
    return HEADER.pack(MAGICS[kind], len(payload), hashlib.sha256(payload).digest()) + payload


def _junk(rng: random.Random, depth: int = 0):
    choice = rng.randrange(9 if depth < 3 else 6)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([True, False, rng.randrange(-2 ** 31, 2 ** 31), rng.random() * 1e6])
    if choice == 2:
        return "".join(rng.choice("abc{}[]:\"0") for _ in range(rng.randrange(8)))
    if choice == 3:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(8)))
    if choice == 4:
        return rng.choice(WRONG_VALUES)
    if choice == 5:
        return np.asarray(rng.random() * 100, rng.choice([np.float32, np.int32, np.uint32]))
    if choice == 6:
        return [_junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["meta", "state", "history", "key", "params", "best", "policy", "class", "fields", "x"]
    return {rng.choice(keys): _junk(rng, depth + 1) for _ in range(rng.randrange(4))}


def _content(data: bytes) -> dict:
    return serialization.msgpack_restore(data[HEADER.size:])


def _with_content(kind: str, content: dict) -> bytes:
    return frame(kind, serialization.msgpack_serialize(content))


def field_paths(value, prefix=()) -> Iterator[tuple]:
    """Every path into nested dicts/lists (the leaves and the containers)."""
    yield prefix
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from field_paths(sub, prefix + (key,))
    elif isinstance(value, list):
        for i, sub in enumerate(value[:3]):
            yield from field_paths(sub, prefix + (i,))


def _replace(value, path: tuple, new):
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _replace(value[path[0]], path[1:], new)
    return copy


def _delete(value, path: tuple):
    copy = dict(value) if isinstance(value, dict) else list(value)
    if len(path) == 1:
        del copy[path[0]]
        return copy
    copy[path[0]] = _delete(value[path[0]], path[1:])
    return copy


def cases(kind: str, valid: bytes, count: int, seed: int = 0) -> Iterator[tuple[str, bytes]]:
    """``count`` malformed variants of the valid file ``valid`` of ``kind`` (``"checkpoint"`` / ``"policy"``)."""
    rng = random.Random(seed)
    content = _content(valid)
    meta = json.loads(content["meta"])
    meta_paths = [p for p in field_paths(meta) if p]
    content_paths = [p for p in field_paths({k: v for k, v in content.items() if k != "meta"}) if p]
    fixed: list[tuple[str, Callable[[], bytes]]] = [
        ("empty file", lambda: b""),
        ("header only", lambda: valid[:HEADER.size]),
        ("payload a list", lambda: frame(kind, msgpack.packb([1, 2, 3]))),
        ("no meta", lambda: _with_content(kind, {k: v for k, v in content.items() if k != "meta"})),
        ("meta not JSON", lambda: _with_content(kind, dict(content, meta="{not json"))),
        ("empty meta", lambda: _with_content(kind, dict(content, meta="{}"))),
        ("meta a JSON list", lambda: _with_content(kind, dict(content, meta="[]"))),
        ("meta nested deeply", lambda: _with_content(kind, dict(content, meta="[" * 100_000 + "]" * 100_000))),
        ("trailing bytes", lambda: frame(kind, valid[HEADER.size:] + b"\x00\x01")),
        ("other magic", lambda: frame("policy" if kind == "checkpoint" else "checkpoint", valid[HEADER.size:])),
    ]
    for case in fixed:
        yield case[0], case[1]()
    for i in range(max(0, count - len(fixed))):
        how = i % 6
        if how == 0:
            yield "random bytes", bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
        elif how == 1:
            cut = rng.randrange(len(valid))
            yield f"truncated at {cut}", valid[:cut]
        elif how == 2:
            yield "junk payload", frame(kind, msgpack.packb(_junk(rng), default=lambda o: None))
        elif how == 3:
            path, new = rng.choice(meta_paths), rng.choice(WRONG_VALUES + [_junk(rng)])
            bad_meta = _replace(meta, path, new)
            yield f"meta{list(path)} = {new!r:.40}", _with_content(kind, dict(content, meta=json.dumps(bad_meta, default=repr)))
        elif how == 4:
            path = rng.choice(content_paths)
            if rng.random() < 0.3:
                yield f"content{list(path)} deleted", _with_content(kind, _delete(content, path))
            else:
                new = _junk(rng)
                yield f"content{list(path)} = {type(new).__name__}", _with_content(kind, _replace(content, path, new))
        else:
            data = bytearray(valid)
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(HEADER.size, len(data))] = rng.randrange(256)
            yield "flipped payload bytes, checksum recomputed", frame(kind, bytes(data[HEADER.size:]))


def run(kind: str, valid: bytes, count: int, read: Callable[[str], object], expected: tuple, directory: str,
        seed: int = 0) -> tuple[int, list[str]]:
    """Feed ``count`` cases to ``read(path)``; returns ``(cases run, descriptions of raw exceptions)``."""
    raw, seen = [], 0
    path = os.path.join(directory, f"fuzz.{kind}")
    for label, data in cases(kind, valid, count, seed):
        with open(path, "wb") as f:
            f.write(data)
        seen += 1
        try:
            read(path)
        except expected:
            pass
        except Exception as err:  # noqa: BLE001 - what the fuzz test counts
            raw.append(f"{label}: {type(err).__name__}: {err}")
    return seen, raw
