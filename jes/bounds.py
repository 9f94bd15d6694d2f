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

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


def margins(lower: jax.Array, upper: jax.Array, xp: Any = jnp) -> tuple[jax.Array, jax.Array]:
    """The widths ``(al, au)`` of the quadratic zones below ``lower + al`` and above ``upper - au``: pycma's
    ``min((upper - lower) / 2, max(1, |bound|) / 20)`` (its default ``margin_width2``), 1 for an open side
    (``xp``: ``jax.numpy``, or ``numpy`` on the host)."""
    half = (upper - lower) / 2
    al = xp.where(xp.isfinite(lower), xp.minimum(half, xp.maximum(1, xp.abs(lower)) / 20), 1)
    au = xp.where(xp.isfinite(upper), xp.minimum(half, xp.maximum(1, xp.abs(upper)) / 20), 1)
    return al.astype(lower.dtype), au.astype(upper.dtype)


class Box(NamedTuple):
    """:func:`to_box`'s constants for one box, ``[P]`` each, derived from ``(lower, upper)`` by :func:`box_of`.

    :func:`into_box` only adds, subtracts, multiplies, compares, selects and takes remainders with them, which XLA
    compiles to the same bits whether they are constants of the program, its arguments, or broadcast over a
    population. A division by a bound-derived value is not like that: XLA turns ``x / c`` into ``x * (1 / c)`` where
    ``c`` is a constant or broadcast, and not where it is an argument of the same shape (the last bit of a point in a
    quadratic zone then depended on the program it was mapped in). Hence ``scale_lower = 1 / (4 al)`` and ``inverse_period``, made once.
    """

    lower: Any
    upper: Any
    mirror_lower: Any  # lower - al: points below are mirrored up at it
    mirror_upper: Any  # upper + au
    zone_lower: Any  # lower + al: below it, the quadratic zone onto [lower, lower + al]
    zone_upper: Any  # upper - au
    scale_lower: Any  # 1 / (4 al)
    scale_upper: Any  # 1 / (4 au)
    far_lower: Any  # lower - 2 al - (upper - lower) / 2: the period's start; points below are shifted by periods
    far_upper: Any  # upper + 2 au + (upper - lower) / 2
    period: Any  # 2 (upper - lower + al + au)
    inverse_period: Any  # 1 / period


def box_of(lower: Any, upper: Any) -> Box:
    """The :class:`Box` of ``[lower, upper]`` (``[P]`` each, ``-inf`` / ``inf`` an open side), in their dtype: with
    NumPy where both are concrete (computed once, on the host: jes makes its problems' boxes so), else traced."""
    xp = jnp if isinstance(lower, jax.core.Tracer) or isinstance(upper, jax.core.Tracer) else np
    lower, upper = xp.asarray(lower), xp.asarray(upper)
    dtype = lower.dtype
    with np.errstate(all="ignore"):  # open sides: inf - inf in branches to_box never selects there
        al, au = margins(lower, upper, xp)
        width = upper - lower
        period = (2 * (width + al + au)).astype(dtype)
        return Box(*(xp.asarray(v).astype(dtype) for v in (
            lower, upper, lower - al, upper + au, lower + al, upper - au, 1 / (4 * al), 1 / (4 * au),
            lower - 2 * al - width / 2, upper + 2 * au + width / 2, period, 1 / period)))


def into_box(x: jax.Array, box: Box) -> jax.Array:
    """``x`` (``[..., P]``) mapped into the box (:func:`to_box`) with the box's constants made once
    (:func:`box_of`): the same bits in every program that maps a point, whichever way the constants enter it."""
    far = (x < box.far_lower) | (x > box.far_upper)
    # pycma's x - period * floor((x - start) / period), with the whole periods counted without a division (not the
    # same bits in every program, see Box): the remainder is exact, so (x - start) - remainder is a whole number of
    # periods to within its rounding, and rounding its ratio to an integer is exact either way
    offset = x - box.far_lower
    periods = jnp.round((offset - jnp.remainder(offset, box.period)) * box.inverse_period)
    # In a box so narrow that the count overflows (float32 (0, 1e-30) at |x| = 1e10) no shift: the mirrors and the
    # clip below still give a point of the box, where the shift by inf periods made NaN (pycma's is outside there)
    x = jnp.where(far & jnp.isfinite(periods), x - box.period * periods, x)
    x = jnp.where(x > box.mirror_upper, x - 2 * (x - box.mirror_upper), x)
    x = jnp.where(x < box.mirror_lower, x + 2 * (box.mirror_lower - x), x)
    x = jnp.where(x < box.zone_lower, box.lower + (x - box.mirror_lower) ** 2 * box.scale_lower, x)
    x = jnp.where(x > box.zone_upper, box.upper - (x - box.mirror_upper) ** 2 * box.scale_upper, x)
    # The shift of a point many periods out is rounded at that point's magnitude, which can exceed a narrow box's
    # period (|x| = 1e12, a box 1e-6 wide) and leave it outside after the mirrors; pycma lets that through.
    return jnp.clip(x, box.lower, box.upper)


def to_box(x: jax.Array, lower: jax.Array, upper: jax.Array) -> jax.Array:
    """``x`` (``[..., P]``) mapped into ``[lower, upper]`` (``[P]`` each), as pycma's ``BoundTransform.repair``.

    In pycma's order: points far outside are shifted by whole periods ``2 (upper - lower + al + au)`` into
    ``[lower - 2 al - (upper - lower) / 2, ...]``, mirrored at ``upper + au`` and ``lower - al`` into
    ``[lower - al, upper + au]``, then bent quadratically onto ``[lower, lower + al]`` and
    ``[upper - au, upper]``; identity in ``[lower + al, upper - au]``. With an open side (``inf``) the branches
    that side's arithmetic would make NaN are never selected. The same values as pycma's up to rounding (a few
    ulps of ``|x|`` for a point shifted by periods, an ulp or two of the result in a quadratic zone, as it
    multiplies by ``1 / (4 al)`` where pycma divides), except that a point whose shift rounding left it outside
    the box is clipped into it.

    ``into_box(x, box_of(lower, upper))``: to map points with the same bits in several programs, make the
    :class:`Box` once and use :func:`into_box` (traced bounds make the box inside each program).
    """
    return into_box(x, box_of(lower, upper))


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
