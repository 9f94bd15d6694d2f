"""Keys, placement and host copies of the arrays a run holds: helpers shared by the core and host services.

``as_key`` / ``int32_seed`` turn what users pass as a key into typed keys; ``resolve_devices`` picks the
devices a population is sharded over; ``localize`` / ``fetch`` read replicated arrays in single- and
multi-process runs alike; ``host_unravel`` splits a flat parameter vector on the host without a program.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np


def as_key(key: Any) -> jax.Array:
    """A typed PRNG key from an int seed, a typed key, or raw ``uint32[2]`` key data."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return jax.random.key(int(check_seed(key)))
    try:
        arr = jnp.asarray(key)
    except (TypeError, ValueError):  # a string, None, an object: not an array at all
        raise TypeError(f"key must be an int seed or a jax.random key, got {type(key).__name__} {key!r:.40}") from None
    if jnp.issubdtype(arr.dtype, jax.dtypes.prng_key) and arr.shape == ():
        return arr
    if arr.dtype == jnp.uint32 and arr.shape == (2,):
        return jax.random.wrap_key_data(arr)
    batch = arr.shape if jnp.issubdtype(arr.dtype, jax.dtypes.prng_key) else (
        arr.shape[:-1] if arr.dtype == jnp.uint32 and arr.ndim > 1 and arr.shape[-1] == 2 else None)
    if batch:  # jax.random.split(key, n): JAX's own "split accepts a single key" came from deep inside
        raise TypeError(f"key must be one jax.random key, got a batch of {math.prod(batch)} keys (shape "
                        f"{tuple(batch)}, e.g. from jax.random.split(key, n)): pass one of them (keys[0])")
    raise TypeError(f"key must be an int seed or a jax.random key, got {type(key).__name__} {getattr(arr, 'shape', '')}")


def check_seed(seed: Any) -> int:
    """``seed`` as an int, or a ``ValueError`` for one outside ``-2**31 .. 2**31 - 1``: JAX seeds its keys with 32
    bits, so larger seeds alias smaller ones (``2**32`` ran seed 0, ``2**32 - 1`` seed -1) or overflow."""
    if not -2**31 <= int(seed) < 2**31:
        raise ValueError(f"seed {seed} is outside -2**31 .. 2**31 - 1: JAX seeds keys with 32 bits, so a larger "
                         f"seed runs the key of a smaller one (2**32 ran seed 0's) or overflows; pick a seed in that "
                         f"range")
    return int(seed)


def positive_count(value: Any, name: str) -> int:
    """``value`` as a positive int, or a ``ValueError`` naming ``name`` (0 episodes meant the default; 2.5 ran 2)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def int32_seed(key: Any) -> np.int32 | None:
    """``key`` as an ``int32`` seed when it is an int seed in range, else ``None``.

    A program seeded from it (``jax.random.key(seed)`` inside) gives the same key as eager ``as_key(key)``,
    without the eager seeding's own compile in a fresh process."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool) and -2**31 <= key < 2**31:
        return np.int32(key)
    return None


def host_unravel(unravel: Callable, size: int) -> Callable[[np.ndarray], Any]:
    """``flat -> unravel(flat)`` for a ``ravel_pytree`` unravel of ``size`` float32s, split and reshaped in numpy,
    then placed: the same arrays as the eager ``unravel``, but no program runs (each eager split or reshape is a
    compile in a fresh process, ~0.1 s together after every run and for every evaluation). The layout is traced
    once, here."""
    leaves, treedef = jax.tree.flatten(jax.eval_shape(unravel, jax.ShapeDtypeStruct((size,), jnp.float32)))
    if any(leaf.dtype != np.float32 for leaf in leaves):
        return lambda flat: unravel(jnp.asarray(flat, jnp.float32))
    ends = np.cumsum([leaf.size for leaf in leaves])[:-1]

    def on_host(flat: np.ndarray) -> Any:
        parts = np.split(np.asarray(flat, np.float32), ends)
        return jax.tree.unflatten(treedef, jax.device_put([part.reshape(leaf.shape) for part, leaf in zip(parts, leaves)]))

    return on_host


def resolve_devices(devices: Any) -> list:
    """The devices a run's population is sharded over.

    In one process: ``None`` -> all local devices; an int n -> the first n; or an explicit list.
    In a multi-process ``jax.distributed`` run: every device of every process (``None`` only),
    so that each process holds its share of the population.
    """
    if jax.process_count() > 1:
        if devices is not None:
            raise ValueError(
                f"devices={devices!r}: in a multi-process jax.distributed run the population is sharded over "
                f"every device of every process ({jax.device_count()} here); leave devices=None and choose "
                f"each process's devices when it starts (jes launch --devices-per-process, CUDA_VISIBLE_DEVICES, "
                f"JAX_NUM_CPU_DEVICES)")
        return list(jax.devices())
    local = jax.local_devices()
    if devices is None:
        return list(local)
    if isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
        devices = int(devices)
        if devices < 1:  # "devices=0, but this process sees 2" did not say that 0 itself was the problem
            raise ValueError(f"devices must be a positive number of local devices (None: all {len(local)}), got "
                             f"{devices}")
        if devices > len(local):
            raise ValueError(f"devices={devices}, but this process sees {len(local)} local device(s): {local}")
        return list(local[:devices])
    if isinstance(devices, jax.Device):
        devices = [devices]
    if isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__"):
        raise TypeError(f"devices must be None (all local devices), a count or a list of jax devices (e.g. "
                        f"jax.devices('cpu')[:2]), got {devices!r}")
    devices = list(devices)
    if not devices:
        raise ValueError("devices must name at least one device")
    if not all(isinstance(d, jax.Device) for d in devices):
        raise TypeError(f"devices must be jax devices (e.g. jax.devices('cpu')[:2]), got {devices!r}")
    return devices


def localize(tree: Any) -> Any:
    """This process's copy of each replicated array in ``tree`` (a no-op in a single-process run).

    In a multi-process run the compiled step returns arrays that span every process's devices;
    host code (metrics, checkpoints, results) reads them through this process's own replica.
    Only valid for replicated arrays, which is what the step returns.
    """
    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return x.addressable_data(0)
        return x

    return jax.tree.map(one, tree)


def fetch(tree: Any) -> Any:
    """Host (numpy) values of a tree of replicated arrays, in single- and multi-process runs alike."""
    return jax.device_get(localize(tree))
