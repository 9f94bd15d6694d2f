"""Box constraints for black-box search: pycma's ``BoundTransform`` map, in ``jax.numpy``.

The strategy searches an unbounded space; the function is evaluated at :func:`to_box` of each point, which is the
identity in the interior of ``[lower, upper]``, quadratic within a margin of each bound, and periodic (a
reflection) beyond, as pycma's ``BoxConstraintsLinQuadTransformation`` (its default boundary handler,
``cma.BoundTransform``). :func:`from_box` is its inverse on the box (pycma's ``inverse``), used for ``x0``.

Both are elementwise, pure, jittable and vmappable over ``[..., P]`` points with ``[P]`` bounds; ``-inf`` /
``inf`` is an open side. They are not meant for ``jax.grad``: where a side is open, the branches ``jnp.where`` does
not select are infinite there and make the gradient NaN (an evolution strategy never differentiates them). :func:`flat_bounds` turns the user's ``(lower, upper)`` into the flat vectors,
refusing what cannot be meant.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def margins(lower: jax.Array, upper: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The widths ``(al, au)`` of the quadratic zones below ``lower + al`` and above ``upper - au``: pycma's
    ``min((upper - lower) / 2, max(1, |bound|) / 20)`` (its default ``margin_width2``), 1 for an open side."""
    half = (upper - lower) / 2
    al = jnp.where(jnp.isfinite(lower), jnp.minimum(half, jnp.maximum(1, jnp.abs(lower)) / 20), 1)
    au = jnp.where(jnp.isfinite(upper), jnp.minimum(half, jnp.maximum(1, jnp.abs(upper)) / 20), 1)
    return al.astype(lower.dtype), au.astype(upper.dtype)


def to_box(x: jax.Array, lower: jax.Array, upper: jax.Array) -> jax.Array:
    """``x`` (``[..., P]``) mapped into ``[lower, upper]`` (``[P]`` each), as pycma's ``BoundTransform.repair``.

    In pycma's order: points far outside are shifted by whole periods ``2 (upper - lower + al + au)`` into
    ``[lower - 2 al - (upper - lower) / 2, ...]``, mirrored at ``upper + au`` and ``lower - al`` into
    ``[lower - al, upper + au]``, then bent quadratically onto ``[lower, lower + al]`` and
    ``[upper - au, upper]``; identity in ``[lower + al, upper - au]``. With an open side (``inf``) the branches
    that side's arithmetic would make NaN are never selected. The same values as pycma's, except that the
    period shift may be rounded differently (XLA may fuse its multiply and subtract: a few ulps of ``|x|``), and
    that a point whose shift rounding left it outside the box is clipped into it.
    """
    al, au = margins(lower, upper)
    width = upper - lower
    far = (x < lower - 2 * al - width / 2.0) | (x > upper + 2 * au + width / 2.0)
    period = 2 * (width + al + au)
    start = lower - 2 * al - width / 2.0
    x = jnp.where(far, x - period * jnp.floor_divide(x - start, period), x)
    x = jnp.where(x > upper + au, x - 2 * (x - upper - au), x)
    x = jnp.where(x < lower - al, x + 2 * (lower - al - x), x)
    x = jnp.where(x < lower + al, lower + (x - (lower - al)) ** 2 / 4 / al, x)
    x = jnp.where(x > upper - au, upper - (x - (upper + au)) ** 2 / 4 / au, x)
    # The shift of a point many periods out is rounded at that point's magnitude, which can exceed a narrow box's
    # period (|x| = 1e12, a box 1e-6 wide) and leave it outside after the mirrors; pycma lets that through.
    return jnp.clip(x, lower, upper)


def from_box(y: jax.Array, lower: jax.Array, upper: jax.Array) -> jax.Array:
    """The point of ``[lower - al, upper + au]`` that :func:`to_box` maps to ``y`` (inside the box), pycma's
    ``BoundTransform.inverse``: the identity in the interior, so an ``x0`` away from the bounds is the search's
    start unchanged; ``lower`` itself starts at ``lower - al``."""
    al, au = margins(lower, upper)
    below = (lower - al) + 2 * jnp.sqrt(jnp.maximum(al * (y - lower), 0))
    above = (upper + au) - 2 * jnp.sqrt(jnp.maximum(au * (upper - y), 0))
    return jnp.where(y < lower + al, below, jnp.where(y < upper - au, y, above))


def _coordinate(x0: Any, index: int) -> str:
    """Flat coordinate ``index`` of ``x0`` as the user wrote it: ``x0[3]``, ``x0[1, 2]``, ``x0['w'][0]``."""
    paths, _ = jax.tree_util.tree_flatten_with_path(x0)
    for path, leaf in paths:
        size = int(np.size(leaf))
        if index < size:
            where = np.unravel_index(index, np.shape(leaf)) if np.ndim(leaf) else ()
            inside = f"[{', '.join(str(int(i)) for i in where)}]" if where else ""
            return f"x0{jax.tree_util.keystr(path)}{inside}"
        index -= size
    raise IndexError(index)


def _real(value: Any) -> bool:
    """A real number or an array of them (not bool, complex or a string)."""
    if isinstance(value, (bool, np.bool_, str, bytes)):
        return False
    try:
        dtype = np.asarray(value).dtype
    except (TypeError, ValueError):
        return False
    return np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating)


def _is_none(value: Any) -> bool:
    return value is None


def _leaf_side(bound: Any, leaf: Any, name: str, fill: float, fix: str) -> np.ndarray:
    """The bound given for one leaf of ``x0`` as float64 ``[leaf.size]``: ``None`` (open), a number, an array of the
    leaf's shape, or (nested) lists of numbers and ``None`` (pycma's ``[0, None, 1]``) shaped like it."""
    shape = np.shape(leaf)
    if bound is None:
        return np.full(int(np.prod(shape)), fill)
    if isinstance(bound, (list, tuple)):
        items = jax.tree.leaves(bound, is_leaf=_is_none)
        if not all(v is None or _real(v) for v in items):
            raise TypeError(f"bounds: {name} must hold real numbers or None, got {bound!r:.80}; {fix}")
        try:
            bound = np.asarray(jax.tree.map(lambda v: fill if v is None else np.asarray(v, np.float64), bound,
                                            is_leaf=_is_none), np.float64)
        except (ValueError, TypeError):  # ragged, or a container inside
            raise ValueError(f"bounds: {name} is ragged, not one array: {bound!r:.80} (x0 is shaped {shape}); "
                             f"{fix}") from None
    elif jax.tree.structure(bound).num_nodes != 1:  # a dict or other container where x0 has an array
        raise ValueError(f"bounds: {name} is structured as {jax.tree.structure(bound)}, but x0 as an array shaped "
                         f"{shape}; {fix}")
    elif not _real(bound):
        kind = type(bound).__name__ + (f" {bound.dtype}" if hasattr(bound, "dtype") else "")
        raise TypeError(f"bounds: {name} must hold real numbers, got {kind}; {fix}")
    bound = np.asarray(bound, np.float64)
    if bound.ndim == 0:
        return np.full(int(np.prod(shape)), float(bound))
    if bound.shape != shape:
        raise ValueError(f"bounds: {name} is shaped {bound.shape}, but x0 {shape}; {fix}")
    return bound.ravel()


def _side(value: Any, x0: Any, name: str, fill: float) -> np.ndarray:
    """One side of the bounds as float64, raveled in ``x0``'s order (``fill``, the open side's infinity, for
    ``None``): one bound for all of ``x0``, or per leaf of ``x0`` (``x0``'s structure, each leaf's bound as
    :func:`_leaf_side` takes it; ``None`` where ``x0`` has ``None``)."""
    leaves, treedef = jax.tree.flatten(x0)
    fix = f"give a number (every coordinate), None (no {name} bound) or an array / pytree shaped like x0"
    if value is None or (not isinstance(value, (list, tuple, dict)) and np.ndim(value) == 0 and _real(value)):
        return np.full(sum(int(np.size(leaf)) for leaf in leaves), fill if value is None else float(value))
    try:
        given = treedef.flatten_up_to(value)
    except (ValueError, TypeError):
        raise ValueError(f"bounds: {name} is structured as {jax.tree.structure(value, is_leaf=_is_none)}, but x0 "
                         f"as {treedef}; {fix}") from None
    return np.concatenate([_leaf_side(bound, leaf, name, fill, fix) for leaf, bound in zip(leaves, given)])


def flat_bounds(bounds: Any, x0: Any, flat_x0: jax.Array) -> tuple[np.ndarray, np.ndarray] | None:
    """``bounds = (lower, upper)`` as flat ``[P]`` vectors in ``flat_x0``'s dtype, or ``None`` where no
    coordinate is bounded (``bounds=None``, ``(None, None)``, infinities): the same search as no bounds.

    Each side is a number, ``None`` (open), an array shaped like ``x0`` or a pytree like it (``None`` where ``x0``
    has ``None``; leaves numbers, ``None`` or arrays of the leaf's shape, or (nested) lists of numbers and ``None``
    shaped like the leaf, pycma's ``[0, None, 1]``). Refused, in one line naming the coordinate and the fix: NaN,
    ``lower >= upper`` (also where the search's dtype rounds them together), a shape or structure unlike ``x0``'s,
    and an ``x0`` outside the box (pycma raises there too: its inverse map, which gives the search's start, is
    defined on the box only).
    """
    if bounds is None:
        return None
    pair = isinstance(bounds, (list, tuple)) or (isinstance(bounds, (np.ndarray, jax.Array)) and bounds.ndim > 0)
    if not pair or len(bounds) != 2:
        raise TypeError(f"bounds must be a pair (lower, upper), e.g. bounds=(0, 1) or bounds=([0, 0], [1, None]) "
                        f"(pycma's 'bounds': [lower, upper]), got {bounds!r:.80}")
    dtype = np.dtype(flat_x0.dtype)
    given = []
    for value, name, fill in ((bounds[0], "lower", -np.inf), (bounds[1], "upper", np.inf)):
        side = _side(value, x0, name, fill)
        if np.isnan(side).any():
            at = _coordinate(x0, int(np.flatnonzero(np.isnan(side))[0]))
            raise ValueError(f"bounds: {name} is NaN at {at}; give a number, or None / "
                             f"{'-inf' if fill < 0 else 'inf'} for no {name} bound")
        given.append(side)
    with np.errstate(over="ignore"):  # beyond the dtype's range: an open side, as the search cannot go there
        lower, upper = (side.astype(dtype) for side in given)  # the search's: the checks hold for what it uses
    crossed = np.flatnonzero(lower >= upper)
    if crossed.size:
        i = int(crossed[0])
        rounded = (f" (they differ by less than {dtype.name} resolves there: widen the box, or search in float64 "
                   f"with JAX's x64 mode and a float64 x0)" if given[0][i] < given[1][i] else "")
        raise ValueError(f"bounds: lower >= upper at {_coordinate(x0, i)} (lower {lower[i]:g}, upper {upper[i]:g}"
                         f"{f', and {crossed.size - 1} more coordinates' if crossed.size > 1 else ''}){rounded}; "
                         f"every lower bound must be below its upper bound (None or -inf / inf for an open side)")
    start = np.asarray(flat_x0)
    outside = np.flatnonzero((start < lower) | (start > upper))
    if outside.size:
        i = int(outside[0])
        raise ValueError(f"x0 is outside the bounds at {_coordinate(x0, i)}: {start[i]:g} not in [{lower[i]:g}, "
                         f"{upper[i]:g}]{f' (and {outside.size - 1} more coordinates)' if outside.size > 1 else ''}; "
                         f"start inside the box (pycma refuses it too)")
    if not (np.isfinite(lower).any() or np.isfinite(upper).any()):
        return None
    return lower, upper
