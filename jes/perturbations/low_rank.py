"""Low-rank perturbations (EGGROLL: Sarkar et al., "Evolution Strategies at the Hyperscale", 2025).

Member ``i`` of a generation deviates from the mean by ``sigma * E_i``. For every weight matrix
``W`` (a leaf applied by a layer this module can factor, in its matrix view ``m x n``)::

    E_i[W] = A_i B_i^T / sqrt(r),    A_i ~ N(0, I) (m x r),  B_i ~ N(0, I) (n x r)

and for every other leaf (biases, norms, matrices of layers it cannot factor) ``E_i`` is dense
Gaussian noise, as in full rank. All of member ``i``'s draws come from one key,
``fold_in(fold_in(gen_key, LOW_RANK_STREAM), i)`` (``i // 2`` for antithetic pairs, which share
factors with opposite sign: ``A`` and the dense noise flip, ``B`` does not).

The forward pass never forms ``W + sigma E_i``: inside the rollout's vmap over members the shared
``W`` is unbatched, so ``x W`` is one GEMM for all members, and a Flax method interceptor adds each
member's correction ``sigma / sqrt(r) (x A_i) B_i^T``. Factored layers:

* ``flax.linen.Dense`` (and ``DenseGeneral`` over the last input axis, ``axis=-1``, with one output axis),
  ``GRUCell``, ``LSTMCell``, ``MGUCell`` and ``SimpleCell`` (built from ``Dense``): kernel ``(in, out)``
  (``ConvLSTMCell``, built from ``Conv``: as ``Conv`` below); a subclass of a layer
  here only if it keeps the layer's ``__call__`` (one that overrides it may apply its matrix otherwise);
* ``flax.linen.Conv`` without feature groups or a mask: kernel ``(kh, kw, cin, cout)`` as ``(kh*kw*cin) x cout``,
  the correction the layer's patches times ``A`` and ``B^T``, the patches never formed by a convolution: ``x A``
  as each kernel offset's product with the padded input summed over the offsets, or from the input's shifted
  windows (:func:`_conv_correction`; with input dilation, the layer's own conv with a constant identity kernel);
* ``flax.linen.Embed``: the table ``(num, features)``, the correction ``A_i[ids] B_i^T``;
* :func:`jes.policies.matvec` as a layer's ``matvec`` method (``weight @ x``), given the parameter ``name`` itself
  (a matrix ``[m, n]``) and a vector ``x [n]`` (jes's PyTorch-layout ``TorchLinear`` and ``TorchGRUCell``; your own
  layers: ``matvec = jes.policies.matvec``). A method of one's own merely named ``matvec`` is not factored.
  Only the policy's own scopes count: a layer applied with ``.apply`` inside the policy is not the policy's layer.

A layer that may apply a function of its matrix rather than the matrix falls back to dense noise, with the
warning below saying why: a subclass that overrides ``__call__``, variables mapped by ``nn.map_variables`` (as in
``nn.WeightNorm``, ``nn.SpectralNorm``), a layer given its own ``dot_general`` / ``conv_general_dilated``, a
``matvec`` given anything but the parameter itself.

Matrices applied any other way (``OptimizedLSTMCell``, which concatenates its per-gate kernels into one
product; a custom ``self.param`` used with ``@``; an ``Embed`` table also used by ``Embed.attend``, as in
tied embeddings; a layer's matrix also read directly, outside the layer's call: :func:`read_elsewhere`) get dense
noise, materialised for that leaf only, with one warning naming them.

The update direction of a chunk is ``sum_i w_i E_i``: per matrix one product ``A^T diag(w) B`` of
the chunk's stacked factors, summed over chunks in chunk order like every other statistic.
"""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
import numbers
import os
import sys
import warnings
from typing import Any, Callable, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jes import policies
from jes.strategies import noise

# A stream of its own: low-rank draws never reuse full-rank noise, episode or centre keys.
LOW_RANK_STREAM = 3


class LowRankWarning(UserWarning):
    """What low rank does with a policy's layout that costs it speed: a rank too large for every matrix it factors
    (warned as this class), or a matrix it cannot factor (:class:`LowRankFallbackWarning`, a subclass).

    Its own category, so that a caller that only evaluates the centre (``jes eval``) or a user who has read it once
    can filter it: ``warnings.simplefilter("ignore", jes.perturbations.LowRankWarning)``."""


class LowRankFallbackWarning(LowRankWarning):
    """A matrix leaf low rank cannot factor gets dense (full-rank) noise, materialised per member for that leaf.

    ``warnings.simplefilter("ignore", jes.perturbations.LowRankFallbackWarning)`` silences this one only."""


@dataclasses.dataclass(frozen=True)
class Leaf:
    """Where one parameter leaf sits: its key path, shape and offset in the flat vector, and how it is perturbed."""

    path: tuple[str, ...]
    shape: tuple[int, ...]
    offset: int
    size: int
    factored: bool
    rows: int = 0
    cols: int = 0


@dataclasses.dataclass(frozen=True)
class Layout:
    """Static: every leaf in flat (ravel) order, and the length of one member's draw."""

    leaves: tuple[Leaf, ...]
    rank: int

    @property
    def factored(self) -> tuple[Leaf, ...]:
        return tuple(leaf for leaf in self.leaves if leaf.factored)

    @property
    def dense(self) -> tuple[Leaf, ...]:
        return tuple(leaf for leaf in self.leaves if not leaf.factored)

    @property
    def dense_size(self) -> int:
        return sum(leaf.size for leaf in self.dense)

    @property
    def draw_size(self) -> int:
        return self.dense_size + sum(self.rank * (leaf.rows + leaf.cols) for leaf in self.factored)

    def split(self, z: jax.Array) -> tuple[jax.Array, list[jax.Array], list[jax.Array]]:
        """One member's draw ``[F]`` (or a batch ``[k, F]``) as dense noise and each factored leaf's ``(A^T, B^T)``,
        ``[r, m]`` and ``[r, n]``: rank-major, so the forward pass reads each factor column contiguously."""
        lead = z.shape[:-1]
        dense, pos = z[..., : self.dense_size], self.dense_size
        a_list, b_list = [], []
        for leaf in self.factored:
            a = z[..., pos: pos + leaf.rows * self.rank].reshape(lead + (self.rank, leaf.rows))
            pos += leaf.rows * self.rank
            b = z[..., pos: pos + leaf.cols * self.rank].reshape(lead + (self.rank, leaf.cols))
            pos += leaf.cols * self.rank
            a_list.append(a)
            b_list.append(b)
        return dense, a_list, b_list

    def assemble(self, dense: jax.Array, matrices: list[jax.Array]) -> jax.Array:
        """The flat ``[P]`` vector with dense leaves from ``dense`` ``[Pd]`` and factored leaves from ``matrices``."""
        pieces, pos, j = [], 0, 0
        for leaf in self.leaves:
            if leaf.factored:
                pieces.append(matrices[j].reshape(leaf.size))
                j += 1
            else:
                pieces.append(dense[pos: pos + leaf.size])
                pos += leaf.size
        return jnp.concatenate(pieces) if pieces else jnp.zeros((0,), jnp.float32)

    def dense_leaves(self, dense: jax.Array) -> list[jax.Array]:
        """Concatenated dense leaves ``[..., Pd]`` as one array per leaf, ``[..., *shape]``."""
        lead, pieces, pos = dense.shape[:-1], [], 0
        for leaf in self.dense:
            pieces.append(dense[..., pos: pos + leaf.size].reshape(lead + leaf.shape))
            pos += leaf.size
        return pieces

    def dense_of(self, flat: jax.Array) -> jax.Array:
        """The dense leaves of a flat ``[P]`` vector, concatenated ``[Pd]``."""
        parts = [flat[leaf.offset: leaf.offset + leaf.size] for leaf in self.dense]
        return jnp.concatenate(parts) if parts else jnp.zeros((0,), flat.dtype)


# ------------------------------------------------------------------ layers it can factor
NOT_FACTORABLE = "not applied by a layer jes can factor"
DENSE_PARAMS = "a DenseParams kernel, which the module around it applies itself"
DENSE_PARAMS_HELP = ("OptimizedLSTMCell (DenseParams' user in flax) concatenates its gates' kernels into one product; "
                     "nn.LSTMCell is the same cell with each gate a Dense, which jes factors.")
NNX_LAYER = "a flax.nnx layer (inside nnx.bridge.ToLinen), which jes cannot factor"
NNX_HELP = ("jes factors flax.linen layers, whose calls it intercepts; an nnx module's layers are called by the module "
            "itself. Write the policy's matrices as flax.linen layers (nn.Dense, nn.Conv, ...) for low rank.")
FACTORABLE = ("Layers jes can factor: Dense; DenseGeneral over the last input axis with one output axis; Conv without "
              "feature groups or a mask; Embed; GRUCell, LSTMCell, MGUCell and SimpleCell (built from Dense) and "
              "ConvLSTMCell (built from Conv); `matvec = jes.policies.matvec` as a layer's method; "
              "subclasses of these only if they keep their __call__ (see jes.perturbations.low_rank).")


def _dense_general_ok(module: nn.DenseGeneral) -> bool:
    features = module.features if isinstance(module.features, (tuple, list)) else (module.features,)
    axis = module.axis if isinstance(module.axis, (tuple, list)) else (module.axis,)
    return len(features) == 1 and tuple(axis) == (-1,) and not module.batch_dims


# The layers whose matrix a call can factor, and the parameter that holds it.
LAYERS = ((nn.Dense, "kernel"), (nn.DenseGeneral, "kernel"), (nn.Conv, "kernel"), (nn.Embed, "embedding"))


def _layer_of(module: nn.Module) -> tuple[type, str] | None:
    return next(((layer, name) for layer, name in LAYERS if isinstance(module, layer)), None)


def _mapped(module: nn.Module) -> bool:
    """Whether ``module`` sees its variables through ``nn.map_variables`` (as ``nn.WeightNorm`` and ``nn.SpectralNorm``
    apply a layer): the matrix it applies may then be a function of the parameter (masked, scaled, normalised)."""
    # A lift around it rewrites the same entry: "remat(map_variables(Dense_0))"
    return module.scope is not None and any("map_variables(" in str(p) for p in module.scope.debug_path)


def _jitted(module: nn.Module) -> bool:
    """Whether ``module`` runs inside ``nn.jit``: flax caches that trace, and a member's call can reuse one traced
    without jes's correction (a policy wrapped in nn.jit got none: its members were the centre in those layers)."""
    return module.scope is not None and any(str(p).startswith("jit(") or "(jit(" in str(p) or str(p) == "jit()"
                                            for p in module.scope.debug_path)


JITTED = "it runs inside nn.jit, whose cached trace jes's correction cannot reach (drop the nn.jit: jes compiles " \
         "the whole generation anyway)"


def why_not_factored(module: nn.Module) -> str | None:
    """Why a call of a factorable layer (Dense, DenseGeneral, Conv, Embed or a subclass) may apply its matrix
    otherwise than the correction assumes; ``None`` when it applies it as the layer's own product of the parameter."""
    layer, _ = _layer_of(module)
    if type(module).__call__ is not layer.__call__:
        return (f"a subclass of {layer.__name__} that overrides __call__ (it may apply the matrix otherwise: masked, "
                f"transposed, ...)")
    if _mapped(module):
        return ("its variables are mapped by nn.map_variables (as nn.WeightNorm and nn.SpectralNorm apply a layer), "
                "so the matrix it applies may not be the parameter itself")
    if _jitted(module):
        return JITTED
    own = [f for f in ("dot_general", "dot_general_cls", "conv_general_dilated", "conv_general_dilated_cls")
           if getattr(module, f, None) is not None]
    if own:
        return f"{layer.__name__} with its own {own[0]} (a custom product the correction would not follow)"
    if layer is nn.DenseGeneral and not _dense_general_ok(module):
        return (f"DenseGeneral(features={module.features!r}, axis={module.axis!r}, batch_dims={module.batch_dims!r}): "
                f"jes factors DenseGeneral over axis=-1 with one output axis and no batch_dims")
    if layer is nn.Conv and module.feature_group_count != 1:
        return f"Conv with feature_group_count={module.feature_group_count} (jes factors Conv without feature groups)"
    if layer is nn.Conv and module.mask is not None:
        return "Conv with a mask (jes factors Conv without one)"
    return None


def why_matvec_not_factored(module: nn.Module, name: str, weight: Any, x: Any) -> str | None:
    """Why a call ``matvec(name, weight, x)`` may not be ``parameter @ x`` of a matrix parameter and a vector; ``None``
    when it is (``weight`` the very object the module's scope holds)."""
    if _mapped(module):
        return ("its variables are mapped by nn.map_variables, so the matrix matvec applies may not be the parameter "
                "itself")
    if _jitted(module):
        return JITTED
    if weight is not module.scope.get_variable("params", name):
        return "matvec was given a function of the parameter (transposed, masked, cast, ...), not the parameter itself"
    if weight.ndim != 2 or jnp.ndim(x) != 1:
        return (f"matvec applied it as a {weight.ndim}-d weight to a {jnp.ndim(x)}-d input; jes factors "
                f"matvec(name, weight [m, n], x [n])")
    return None


def is_jes_matvec(module: nn.Module) -> bool:
    """Whether ``module``'s ``matvec`` method is :func:`jes.policies.matvec` (``matvec = jes.policies.matvec``), the
    one ``matvec`` jes factors: a method of the user's own by that name may compute anything (``sigmoid(w @ x)``)
    or take other arguments."""
    return inspect.unwrap(getattr(type(module), "matvec", None) or (lambda: None)) is policies.matvec


def matvec_arguments(args: tuple, kwargs: dict) -> tuple[str, Any, Any]:
    """``(name, weight, x)`` of a call of :func:`jes.policies.matvec`, however its arguments were given."""
    bound = _MATVEC_SIGNATURE.bind(None, *args, **kwargs)
    return bound.arguments["name"], bound.arguments["weight"], bound.arguments["x"]


_MATVEC_SIGNATURE = inspect.signature(policies.matvec)


def factored_params(module: nn.Module, method: str) -> tuple[str, ...]:
    """Names of ``module``'s matrix parameters a call of ``method`` applies in a way this module can factor."""
    if method == "matvec":
        return ("*",) if is_jes_matvec(module) else ()  # "*": the name is one of the call's arguments
    layer = _layer_of(module) if method == "__call__" else None
    return (layer[1],) if layer is not None and why_not_factored(module) is None else ()


# From this rank on a correction is two batched products (below it, unrolled: see low_rank_product).
PRODUCT_RANK = 3


def low_rank_product(x: jax.Array, a_t: jax.Array, b_t: jax.Array) -> jax.Array:
    """``x @ A @ B^T`` for ``x`` ``[..., m]``, ``A^T`` ``[r, m]``, ``B^T`` ``[r, n]``: ``[..., n]``.

    Rank 1 and 2 unrolled (a dot and a scaled vector per rank): faster on XLA:CPU than the two batched
    products a vmap makes of ``(x @ A) @ B^T``, which win from rank 3 on (MLP 1024 x 1024, 512 members,
    one layer: +10 % over the shared GEMM at r = 1 unrolled, +35 % at r = 4 as products, +53 % unrolled)."""
    rank = a_t.shape[0]
    if rank >= PRODUCT_RANK:
        return (x @ a_t.T) @ b_t
    out = (x @ a_t[0])[..., None] * b_t[0]
    for k in range(1, rank):
        out = out + (x @ a_t[k])[..., None] * b_t[k]
    return out


def _with_rank_factors(xa: jax.Array, b_t: jax.Array) -> jax.Array:
    """``xa @ B^T`` for ``xa`` ``[..., r]`` (each rank's ``x A``), ``B^T`` ``[r, n]``: ``[..., n]`` (rank 1 and 2 as
    scaled vectors, as in :func:`low_rank_product`)."""
    rank = b_t.shape[0]
    if rank >= PRODUCT_RANK:
        return xa @ b_t
    out = xa[..., 0:1] * b_t[0]
    for k in range(1, rank):
        out = out + xa[..., k:k + 1] * b_t[k]
    return out


# A Conv correction's rows (prod(kernel) * cin) up to which x A is a reduction of its patches times A; above, a product
# (see _conv_correction).
CONV_UNROLLED_ROWS = 64


def _kernel_sizes(module: nn.Conv) -> tuple[int, ...]:
    """A Conv layer's kernel size as a tuple (flax takes an int for a 1-D kernel)."""
    return (module.kernel_size,) if isinstance(module.kernel_size, int) else tuple(module.kernel_size)


def _conv_geometry(module: nn.Conv, x: jax.Array) -> tuple[jax.Array, list[tuple[int, int, int, int]]] | None:
    """A Conv layer's padded input ``[..., *padded_spatial, cin]`` and, per spatial axis, ``(kernel size, dilation,
    stride, output size)``: output position ``o`` at kernel offset ``k`` reads padded position ``o * stride + k *
    dilation``. ``None`` for what this does not cover (input dilation, negative explicit padding, an input smaller
    than the dilated kernel)."""
    from flax.linen.linear import canonicalize_padding

    sizes = _kernel_sizes(module)
    nd = len(sizes)

    def per_dim(v):
        return (1,) * nd if v is None else ((v,) * nd if isinstance(v, int) else tuple(v))

    strides, dilation = per_dim(module.strides), per_dim(module.kernel_dilation)
    if any(d != 1 for d in per_dim(module.input_dilation)) or x.ndim < nd + 1:
        return None
    padding = canonicalize_padding(module.padding, nd)
    dilated = [(k - 1) * d + 1 for k, d in zip(sizes, dilation)]
    mode = "constant"
    if padding in ("CIRCULAR", "REFLECT"):  # as flax pads them, before a VALID conv
        pads, mode = [((k - 1) // 2, k // 2) for k in dilated], {"CIRCULAR": "wrap", "REFLECT": "reflect"}[padding]
    elif padding == "CAUSAL":
        pads = [(dilation[0] * (sizes[0] - 1), 0)]
    elif isinstance(padding, str):
        pads = jax.lax.padtype_to_pads(x.shape[-nd - 1:-1], dilated, strides, padding)
    else:
        pads = [tuple(p) for p in padding]
    if any(lo < 0 or hi < 0 for lo, hi in pads):
        return None
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - nd - 1) + [tuple(p) for p in pads] + [(0, 0)], mode=mode)
    out = [(padded.shape[x.ndim - nd - 1 + d] - dilated[d]) // strides[d] + 1 for d in range(nd)]
    if min(out) < 1:  # an input smaller than the dilated kernel: an empty output, left to the identity-kernel conv
        return None
    return padded, list(zip(sizes, dilation, strides, out))


def _conv_windows(padded: jax.Array, geometry: list[tuple[int, int, int, int]]) -> list[jax.Array]:
    """The padded input's shifted (strided, dilated) windows, one ``[..., *out_spatial, cin]`` per kernel offset in
    the kernel's row-major order: concatenated along the channels, the layer's patches (``conv(x, K) = patches @
    K.reshape(-1, cout)``)."""
    return [padded[(Ellipsis,) + tuple(slice(o * d, o * d + (n - 1) * s + 1, s)
                                       for o, (_, d, s, n) in zip(offset, geometry)) + (slice(None),)]
            for offset in itertools.product(*(range(k) for k, _, _, _ in geometry))]


def _conv_correction_form(padded: jax.Array, geometry: list[tuple[int, int, int, int]], rank: int) -> str:
    """How :func:`_conv_correction` computes ``x A``, from shapes only (never the number of members or slots):
    ``"patches"`` (the windows' concatenation times ``A``, a product) from rank ``PRODUCT_RANK`` or above
    ``CONV_UNROLLED_ROWS`` rows; else ``"offsets"`` where each offset's product at every padded position takes fewer
    floats than the windows (``r * padded positions < cin * output positions``, e.g. stride 1 and ``cin`` well
    above ``r``) and the einsum's subscripts suffice (leading axes + 2 per spatial axis up to 26), else
    ``"windows"`` (stacked and reduced)."""
    nd, cin = len(geometry), padded.shape[-1]
    if rank >= PRODUCT_RANK or math.prod(k for k, _, _, _ in geometry) * cin > CONV_UNROLLED_ROWS:
        return "patches"
    if (rank * math.prod(padded.shape[-nd - 1:-1]) < cin * math.prod(n for _, _, _, n in geometry)
            and padded.ndim - 1 + nd <= len(_SUBSCRIPTS)):
        return "offsets"
    return "windows"


_SUBSCRIPTS = "abcdefghijklmnopqrstuvwxyz"  # _conv_offsets_xa's einsum: leading axes, spatial axes, kernel offsets


def _conv_offsets_xa(padded: jax.Array, geometry: list[tuple[int, int, int, int]], a_t: jax.Array) -> jax.Array:
    """``x A`` of a Conv layer, ``[..., *out_spatial, r]``, from each kernel offset's product taken at every padded
    position (one product over the channels, ``[..., r, k_1, p_1, ..., k_n, p_n]``); output position ``o`` sums,
    over the offsets, the product at ``o * stride + k * dilation``. Per spatial axis that read is one reshape: the
    ``(k, p)`` axes flattened and padded by ``k_size * dilation`` at the end, then viewed as ``(k, p + dilation)``,
    put ``k * (p + dilation) + o * stride = k * p + (o * stride + k * dilation)`` at ``[k, o * stride]``, and
    ``o * stride + k * dilation <= p - 1`` for every output position, so no read leaves its offset's row; the
    offsets' sum is then a reduction over the ``k`` axes, which XLA computes once."""
    nd, cin, rank = len(geometry), padded.shape[-1], a_t.shape[0]
    batch = padded.ndim - nd - 1
    lead, space, kern = _SUBSCRIPTS[:batch], _SUBSCRIPTS[batch:batch + nd], _SUBSCRIPTS[batch + nd:batch + 2 * nd]
    a = a_t.reshape((rank,) + tuple(k for k, _, _, _ in geometry) + (cin,))
    products = jnp.einsum(f"{lead}{space}Y,Z{kern}Y->{lead}Z" + "".join(k + p for k, p in zip(kern, space)),
                          padded, a)
    for d, (size, dilation, stride, out) in enumerate(geometry):  # axis pair (k_d, p_d) at batch + 1 + 2d
        axis = batch + 1 + 2 * d
        shape = products.shape
        flat = products.reshape(shape[:axis] + (size * shape[axis + 1],) + shape[axis + 2:])
        flat = jnp.pad(flat, [(0, 0)] * axis + [(0, size * dilation)] + [(0, 0)] * (flat.ndim - axis - 1))
        skewed = flat.reshape(shape[:axis] + (size, shape[axis + 1] + dilation) + shape[axis + 2:])
        products = jax.lax.slice_in_dim(skewed, 0, (out - 1) * stride + 1, stride, axis=axis + 1)
    xa = jnp.sum(products, axis=tuple(batch + 1 + 2 * d for d in range(nd)))  # [..., r, *out_spatial]
    return jnp.moveaxis(xa, batch, -1)


def _conv_correction(module: nn.Conv, x: jax.Array, a_t: jax.Array, b_t: jax.Array) -> jax.Array | None:
    """``patches(x) A B^T`` of a Conv layer from its padded input (``None``: see :func:`_conv_geometry`); no
    convolution with an identity kernel, whose patches cost ``rows^2`` multiply-adds per position.

    Three forms (:func:`_conv_correction_form`), each computing ``x A`` as a value XLA computes once (a product or a
    reduction), where the same terms summed as elementwise adds were copied into every fusion that read the layer's
    output, once per output channel (MinAtar CNN 16c3x3 + 256, r = 1, 512 members, in one process against batch
    inference, seeds 0-2, 2026-12-03: the policy's forward pass alone 0.25x as adds, 0.62x as a reduction):

    * ``"offsets"`` (:func:`_conv_offsets_xa`): one product per member over the channels at every padded position,
      then a reduction over the offsets (against the windows: MinAtar CNN 16c3x3 (cin 4) + 64 / 256 / 1,024, r = 1,
      512 members, one device, whole generations against batch inference, seeds 0-4: 0.53x / 0.67x / 0.75x ->
      0.61x / 0.76x / 0.75x; the CNN + 256's forward pass alone 0.67x -> 0.76x; README's tables, 2026-12-04 and
      2026-12-06);
    * ``"windows"``: the windows stacked (which XLA:CPU writes once) and reduced against ``A``;
    * ``"patches"``: the windows concatenated (the patches) times ``A``: from rank ``PRODUCT_RANK``, whose programs
      XLA's newer emitters compile, and which ran the windows' per-rank reductions slower (r = 4, 512 members, one
      device: 0.24x / 0.36x / 0.47x with the windows, 0.31x / 0.40x / 0.45x with the patches).
    """
    grid = _conv_geometry(module, x)
    if grid is None:
        return None
    padded, geometry = grid
    form = _conv_correction_form(padded, geometry, a_t.shape[0])
    if form == "offsets":
        return _with_rank_factors(_conv_offsets_xa(padded, geometry, a_t), b_t)
    windows = _conv_windows(padded, geometry)
    if form == "patches":
        return low_rank_product(jnp.concatenate(windows, axis=-1), a_t, b_t)  # the patches [..., *out_spatial, rows]
    # The windows stacked before the last spatial axis, [..., K, out_last, cin]: the copy writes rows of out_last * cin
    # floats, where the patches' concatenation along the channels wrote cin at a time (MinAtar CNN 16c3x3 + 256,
    # r = 1, 512 members: 0.56x -> 0.63x batch inference, seeds 0-2, one process, 2026-12-04: a 3-seed diagnostic; the
    # README's CNN rows over seeds 0-4 are the published figures).
    cin = windows[0].shape[-1]
    stacked = jnp.stack(windows, axis=-3)
    a = a_t.reshape((a_t.shape[0], len(windows), 1, cin))  # [r, K, 1, cin]
    xa = jnp.stack([jnp.sum(stacked * a[k], axis=(-3, -1)) for k in range(a_t.shape[0])], axis=-1)  # [..., *out, r]
    return _with_rank_factors(xa, b_t)


def _corrected(module: nn.Module, method: str, next_fun: Callable, args: tuple, kwargs: dict,
               factors: Callable[[str], Any], inner: list) -> Any:
    out = next_fun(*args, **kwargs)
    if method == "matvec":  # weight [m, n] @ x [n]: A (B^T x)
        name, _, x = matvec_arguments(args, kwargs)
        ab = factors(name)
        return out if ab is None else _in_dtype_of(out, out + low_rank_product(x, ab[1], ab[0]))
    ab = factors(factored_params(module, method)[0])
    if ab is None:
        return out
    a_t, b_t = ab
    x = args[0] if args else next(iter(kwargs.values()))
    return _in_dtype_of(out, _correction(module, x, out, a_t, b_t, inner))


def _in_dtype_of(out: jax.Array, corrected: jax.Array) -> jax.Array:
    """The corrected output in the layer's own dtype (a ``Dense(..., dtype=bfloat16)`` stays bfloat16: a recurrent
    carry built from it keeps its type); the float32 factors would promote it."""
    return corrected if corrected.dtype == out.dtype else corrected.astype(out.dtype)


def _correction(module: nn.Module, x: jax.Array, out: jax.Array, a_t: jax.Array, b_t: jax.Array, inner: list) -> Any:
    """The layer's output ``out`` plus the member's correction (``__call__`` of a factored layer)."""
    if isinstance(module, nn.Embed):  # rows of the table: A[ids] B^T
        return out + jnp.tensordot(jnp.take(a_t, x, axis=1), b_t, axes=([0], [0]))
    if isinstance(module, nn.Conv):  # conv(x, reshape(A B^T)) = patches(x) A B^T
        correction = _conv_correction(module, x, a_t, b_t)
        if correction is not None:
            return out + correction
        # Input dilation: the patches from the layer's own convolution with a constant identity kernel, the same
        # for every member (one batched conv over the members; a conv with each member's own kernel reshape(A)
        # would be a grouped conv with a group per member, slower still: MinAtar CNN 0.45x batch inference's env
        # steps/s against 0.29x, seeds 0-4, before the shifted windows above).
        rows = a_t.shape[1]
        conv = module.clone(parent=None, features=rows, use_bias=False, name=None)
        identity = jnp.eye(rows, dtype=a_t.dtype).reshape(_kernel_sizes(module) + (-1, rows))
        inner.append(True)  # the correction's own conv is not a member's layer: no correction of its own
        try:
            patches = conv.apply({"params": {"kernel": identity}}, x)
        finally:
            inner.pop()
        return out + low_rank_product(patches, a_t, b_t)
    return out + low_rank_product(x, a_t, b_t)


def _apply_root(module: nn.Module) -> Any:
    """The root scope of the ``.apply`` a bound module runs in; ``None`` for an unbound module and for a lifted
    transform's scope (nn.scan, nn.vmap, nn.remat, nn.jit: parentless, but at the module's path in the policy)."""
    scope = getattr(module, "scope", None)
    if scope is None:
        return None
    root = scope.root
    return root if not root.path and not getattr(root, "debug_path", ()) else None


def _applied_on_its_own(module: nn.Module, roots: list) -> bool:
    """Whether ``module`` runs in an ``.apply`` of its own inside the policy (``nn.Dense(4).apply({"params": {"kernel":
    w * mask}}, x)``): its variables are whatever that apply was given, not the policy's leaves at the same path.
    ``roots`` holds the policy's apply's root scope, the first one seen (recorded here)."""
    root = _apply_root(module)
    if root is not None and not roots:
        roots.append(root)
    return root is not None and root is not roots[0]


def _probe(fns: Any, intercept: Callable) -> Callable:
    """``(variables, obs) -> fns.apply(...)`` with ``intercept`` around the policy's methods (the initial carry made
    outside: the interceptor takes the first apply it sees for the policy's)."""

    def probe(v, o):
        carry = fns.initial_carry()
        with nn.intercept_methods(intercept):
            return fns.apply(v, carry, o)

    return probe


def _interceptor(factors: dict, record: dict | None = None) -> Callable:
    inner: list = []  # non-empty while a correction runs a module of its own
    roots: list = []

    def intercept(next_fun, args, kwargs, context):
        module, method = context.module, context.method_name
        if inner or _applied_on_its_own(module, roots):
            return next_fun(*args, **kwargs)
        names = factored_params(module, method)
        if record is not None and module.scope is not None and method == "__call__" and _layer_of(module) \
                and not names:  # a factorable layer applying its matrix its own way: that leaf gets dense noise
            record.setdefault("reasons", {})[("params",) + tuple(module.scope.path) + (_layer_of(module)[1],)] = \
                why_not_factored(module)
        if record is not None and not names and module.scope is not None and method not in ("__call__", "setup") \
                and factored_params(module, "__call__"):
            # A factorable layer's matrix used by another of its methods (Embed.attend: tied embeddings) is not
            # corrected there: that matrix gets dense noise instead (see layout)
            record.setdefault("other_uses", {})[("params",) + tuple(module.scope.path)] = method
        if not names or module.scope is None:
            if record is not None and module.scope is not None:
                modules = record.setdefault("modules", {})
                modules.setdefault(("params",) + tuple(module.scope.path), type(module).__name__)
            return next_fun(*args, **kwargs)
        prefix = ("params",) + tuple(module.scope.path)
        if record is not None:
            record.setdefault("modules", {}).setdefault(prefix, type(module).__name__)
            call = matvec_arguments(args, kwargs) if names == ("*",) else None  # (name, weight, x)
            handled = record.setdefault("handled", set())
            handled.update(prefix + (call[0] if n == "*" else n,) for n in names)
            out = next_fun(*args, **kwargs)
            # The matrix as this call applies it: a lifted transform (nn.scan, nn.vmap) hands the layer a slice
            # of a stacked leaf, which the member's factors (drawn for the whole leaf) would not fit.
            applied = record.setdefault("applied_shapes", {})
            for n in names:
                weight = call[1] if n == "*" else module.scope.get_variable("params", n)
                applied[prefix + (call[0] if n == "*" else n,)] = tuple(getattr(weight, "shape", ()))
            if call is not None:  # matvec(name, weight, x): the parameter itself, a matrix, times a vector
                why = why_matvec_not_factored(module, *call)
                if why is not None:
                    record.setdefault("reasons", {})[prefix + (call[0],)] = why
            return out
        return _corrected(module, method, next_fun, args, kwargs, lambda name: factors.get(prefix + (name,)), inner)

    return intercept


def _live_inputs(jaxpr: Any, used_outputs: list) -> list:
    """Which of ``jaxpr``'s inputs its used outputs (and its effects) read: liveness through the bodies of jit, remat,
    cond, scan, while and custom_jvp/vjp (their forward function only: jes never differentiates), conservative (every
    input) for any other primitive."""
    live = {v for v, u in zip(jaxpr.outvars, used_outputs) if u and not _literal(v)}
    for eqn in reversed(jaxpr.eqns):
        outs = [v in live for v in eqn.outvars]
        if eqn.effects:
            outs = [True] * len(outs)
        if not any(outs):
            continue
        ins = _live_eqn_inputs(eqn, outs)
        live.update(v for v, u in zip(eqn.invars, ins) if u and not _literal(v))
    return [v in live for v in jaxpr.invars]


def _literal(v: Any) -> bool:
    return hasattr(v, "val")  # a jaxpr's Literal (a constant) holds its value; a Var does not


def _live_eqn_inputs(eqn: Any, outs: list) -> list:
    name, params, n = eqn.primitive.name, eqn.params, len(eqn.invars)

    def body(j):
        return getattr(j, "jaxpr", j)  # a ClosedJaxpr's jaxpr, or an open Jaxpr

    if name in ("pjit", "jit", "closed_call", "core_call", "remat", "remat2", "checkpoint", "custom_jvp_call",
                "custom_vjp_call"):
        sub = params.get("jaxpr", params.get("call_jaxpr"))
        if sub is not None and len(body(sub).invars) == n:
            return _live_inputs(body(sub), outs)
    if name == "cond":
        branches = [_live_inputs(body(b), outs) for b in params["branches"]]
        return [True] + [any(b[i] for b in branches) for i in range(n - 1)]
    if name == "scan":
        consts, carries, j = params["num_consts"], params["num_carry"], body(params["jaxpr"])
        carry = list(outs[:carries])
        while True:
            ins = _live_inputs(j, carry + list(outs[carries:]))
            grown = [a or b for a, b in zip(carry, ins[consts:consts + carries])]
            if grown == carry:
                return ins[:consts] + carry + ins[consts + carries:]
            carry = grown
    if name == "while":
        cn, bn = params["cond_nconsts"], params["body_nconsts"]
        cond_ins = _live_inputs(body(params["cond_jaxpr"]), [True])
        carry = [a or b for a, b in zip(outs, cond_ins[cn:])]
        while True:
            ins = _live_inputs(body(params["body_jaxpr"]), carry)
            grown = [a or b for a, b in zip(carry, ins[bn:])]
            if grown == carry:
                return cond_ins[:cn] + ins[:bn] + carry
            carry = grown
    return [True] * n


def read_elsewhere(fns: Any, variables: Any, obs: Any, keys: set) -> set:
    """Which of ``keys`` (matrix leaves a layer jes corrects applies) the policy also reads outside such a call: a
    tied weight read directly (``h @ self.embed.embedding.T``, a Dense kernel reused as ``kernel.T``), whose member
    would keep the centre's matrix there. Traced once (no compilation) with every corrected call's output replaced
    by zeros: a leaf the remaining program still needs is read elsewhere."""
    roots: list = []

    def intercept(next_fun, args, kwargs, context):
        module, method = context.module, context.method_name
        if _applied_on_its_own(module, roots):
            return next_fun(*args, **kwargs)
        out = next_fun(*args, **kwargs)
        names = factored_params(module, method) if module.scope is not None else ()
        if not names:
            return out
        # The use jes corrects: its output replaced by one that depends on the call's inputs (what flows on from
        # them is still traced) and not on the layer's matrix (matvec's weight argument is that matrix)
        if names == ("*",):
            name, weight, x = matvec_arguments(args, kwargs)
            if weight is not module.scope.get_variable("params", name):
                return out  # not the parameter itself (another leaf, a function of one): a use jes does not correct
            inputs = (x,)
        else:
            inputs = (args, kwargs)
        arrays = [x for x in jax.tree.leaves(inputs) if hasattr(x, "dtype") and hasattr(x, "shape")]
        through = sum((jnp.sum(jnp.real(jnp.asarray(x)).astype(jnp.float32)) * 0 for x in arrays), jnp.float32(0))
        return jax.tree.map(lambda x: jnp.zeros_like(x) + through.astype(jnp.result_type(x)), out)

    closed = jax.make_jaxpr(_probe(fns, intercept))(variables, obs)
    used = _live_inputs(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
    paths = [_key_path(path) for path, _ in jax.tree_util.tree_flatten_with_path(variables)[0]]
    return {key for key, needed in zip(paths, used) if needed and key in keys}


READ_ELSEWHERE = ("also read outside the layer's call (a tied weight read directly: `h @ self.embed.embedding.T`, a "
                  "kernel reused as `kernel.T`), a use jes cannot correct")


def _owner(key: tuple[str, ...], modules: dict) -> str:
    """The layer a parameter belongs to, with the layers around it: ``DenseParams (in OptimizedLSTMCell)``."""
    key = ("params",) + key[1:]  # another collection's variable (batch_stats/...) belongs to the same layer
    names = [modules[key[:i]] for i in range(len(key) - 1, 0, -1) if key[:i] in modules]
    if not names:
        return "?"
    return names[0] + "".join(f" (in {n})" for n in names[1:2])


def _caller_outside_jes() -> int:
    """The ``stacklevel`` of the first frame outside the jes package, for a warning raised by the caller of this
    function: it then names the user's line (``jes.train(...)``, ``jes.Trainer(...)``), however deep jes is."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _key_path(path) -> tuple[str, ...]:
    return tuple(str(getattr(p, "key", getattr(p, "idx", p))) for p in path)


def normal_from_bits(bits: jax.Array) -> jax.Array:
    """float32 standard normals from uint32 random bits, as ``jax.random.normal(key, shape, float32)`` computes them
    from ``jax.random.bits(key, shape, uint32)``: the mantissa filled to a uniform in ``(-1, 1)``, then ``sqrt(2)
    erfinv`` (tests/test_perturbations.py compares the two bit for bit, so a jax that changes its transform fails
    there)."""
    lo = jnp.asarray(np.nextafter(np.float32(-1.0), np.float32(0.0)), jnp.float32)
    hi = jnp.asarray(np.float32(1.0))
    mantissa = jax.lax.shift_right_logical(bits, jnp.uint32(32 - 23)) | jnp.uint32(np.float32(1.0).view(np.uint32))
    floats = jax.lax.bitcast_convert_type(mantissa, jnp.float32) - jnp.float32(1.0)
    uniform = jax.lax.max(lo, floats * (hi - lo) + lo)
    return jax.lax.mul(jnp.float32(np.sqrt(2)), jax.lax.erf_inv(uniform))


# ------------------------------------------------------------------ the perturbation
@dataclasses.dataclass(frozen=True)
class LowRank:
    """Rank-``rank`` perturbations of every weight matrix (EGGROLL); dense noise for the other leaves.

    Args:
        rank: ``r``, the rank of each member's perturbation of each matrix (1 in the paper's headline
            runs). The generation's update ``sum_i w_i E_i`` has rank up to ``min(m, n, r * members)``.
    """

    rank: int = 1

    name: ClassVar[str] = "low_rank"
    structured: ClassVar[bool] = True
    # Without XLA:CPU's tree reduction rewriter (jes.cpu.compiler_options), a corrected layer's x A stays one fused
    # loop, not a product written to memory and reduced in two steps (MinAtar CNN 16c3x3 + 256, r = 1, 512 members:
    # 0.64x -> 0.66x batch inference, seeds 0-2, one process, 2026-12-04, a 3-seed diagnostic; newer-emitter programs
    # ran without it before)
    cpu_tree_reductions: ClassVar[bool] = False

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, numbers.Integral) or self.rank < 1:
            raise ValueError(f"LowRank rank must be a positive integer, got {self.rank!r}")
        object.__setattr__(self, "rank", int(self.rank))  # a numpy integer as a plain int (hashing, file names)

    def cpu_fusion_emitters(self, layout: Layout) -> bool:
        """Whether the generation step compiles with XLA:CPU's default (newer) fusion emitters rather than jes's
        older ones (:func:`jes.cpu.compiler_options`): from rank :data:`PRODUCT_RANK` on, whose batched products
        the older emitters run much slower, and at any rank for a policy without a factored Conv layer. A function
        of the perturbation and the layout only, like the chunk size: the emitters can change bits, so every
        program of the run (every device, worker and process) uses the same.

        Measured in one process, env steps/s against batch inference, 512 members, seeds 0-2, 2026-12-03:
        rank 1, MLP 256x256 0.46x with the older emitters, 0.75x with the newer (their tanh is faster); MinAtar
        CNN 16c3x3 + 64 / 256 / 1024 (ReLU) 0.40x / 0.58x / 0.70x with the older, 0.34x / 0.52x / 0.63x with the
        newer. Earlier (README's table before and after), rank 4: MLP 256x256 0.26x -> 0.58x with the newer. The
        newer emitters compile a small policy's step longer (GRU 5x2 on CartPole: up to 1.8x)."""
        return self.rank >= PRODUCT_RANK or not any(len(leaf.shape) > 2 for leaf in layout.factored)

    def default_chunk_size(self, layout: Layout) -> int:
        """Most members in a chunk when ``ESConfig.chunk_size`` is ``None``: see :data:`CHUNK_SIZE`. A function of
        the layout only (never of the devices or the machine): the chunk size decides the bits."""
        size = CHUNK_SIZE
        while size > CACHED_CHUNK_SIZE and size * layout.draw_size > CACHED_CHUNK_FLOATS:
            size //= 2
        return max(2, min(size, CHUNK_FLOATS // max(1, layout.draw_size)))

    # ------------------------------------------------------------- static layout
    def layout(self, fns: Any, variables: Any) -> Layout:
        """Which leaves of ``variables`` (shapes suffice) are factored: traced once with a recording interceptor.

        Warns once (LowRankFallbackWarning), naming every matrix leaf (ndim >= 2) it cannot factor and why; those
        get dense noise.
        """
        record: dict = {}
        obs = jax.ShapeDtypeStruct(fns.obs_shape, jnp.float32)

        jax.eval_shape(_probe(fns, _interceptor({}, record)), variables, obs)
        handled, modules = record.get("handled", set()), record.get("modules", {})
        other_uses, applied = record.get("other_uses", {}), record.get("applied_shapes", {})
        reasons = record.get("reasons", {})

        flat = [(_key_path(path), tuple(leaf.shape))
                for path, leaf in jax.tree_util.tree_flatten_with_path(variables)[0]]
        stacked = {key for key, shape in flat if key in handled and applied.get(key, shape) != shape
                   and key not in reasons}
        candidates = {key for key, shape in flat if len(shape) >= 2 and key in handled and key[:-1] not in other_uses
                      and key not in stacked and key not in reasons}
        elsewhere = read_elsewhere(fns, variables, obs, candidates) if candidates else set()
        leaves, offset, fallbacks = [], 0, []
        for key, shape in flat:
            size = math.prod(shape)
            factored = key in candidates and key not in elsewhere
            if len(shape) >= 2 and not factored and key[-1] != "bias":  # biases get dense noise, as documented
                if key[0] != "params":  # e.g. SpectralNorm's power-iteration vector u in batch_stats
                    why = (f"a variable of the {key[0]!r} collection (jes evolves every collection), not a matrix a "
                           f"layer applies")
                elif key in reasons:
                    why = reasons[key]
                elif key in elsewhere:
                    why = READ_ELSEWHERE
                elif key[:-1] in other_uses:
                    why = f"also used by {modules.get(key[:-1], '?')}.{other_uses[key[:-1]]}, which jes cannot factor"
                elif key in stacked:
                    why = (f"applied in slices of shape {list(applied[key])} (stacked by a lifted transform such as "
                           f"nn.scan or nn.vmap), which jes cannot factor")
                elif _owner(key, modules).split(" ")[0] == "DenseParams":  # a kernel the module around it applies
                    why = DENSE_PARAMS
                elif _owner(key, modules).split(" ")[0] == "ToLinen":  # flax.nnx layers: no linen method to intercept
                    why = NNX_LAYER
                else:
                    why = NOT_FACTORABLE
                fallbacks.append(f"  {'/'.join(key)} {list(shape)} of layer {_owner(key, modules)}: {why}")
            rows, cols = (math.prod(shape[:-1]), shape[-1]) if factored else (0, 0)
            leaves.append(Leaf(key, shape, offset, size, factored, rows, cols))
            offset += size
        if fallbacks:  # one warning for the policy, however many leaves (an OptimizedLSTMCell has 8)
            others, many = sum(leaf.factored for leaf in leaves), len(fallbacks) > 1
            help_line = f"\n{FACTORABLE}" if any(line.endswith(NOT_FACTORABLE) for line in fallbacks) else ""
            help_line += f"\n{DENSE_PARAMS_HELP}" if any(line.endswith(DENSE_PARAMS) for line in fallbacks) else ""
            help_line += f"\n{NNX_HELP}" if any(line.endswith(NNX_LAYER) for line in fallbacks) else ""
            if not others:  # (a run labelled low rank whose every matrix gets dense noise)
                help_line += ("\nNo matrix of this policy is factored: every member is materialised, as with full "
                              "rank; use jes.FullRank() (jes train: --perturbation full_rank), or layers jes can factor.")
            warnings.warn(
                f"LowRank: {len(fallbacks)} matrix parameter{'s' if many else ''} of this policy "
                f"get{'' if many else 's'} full-rank noise, materialised per member for "
                f"{'these leaves' if many else 'this leaf'} only ({others} other{'s are' if others != 1 else ' is'} "
                f"factored):\n" + "\n".join(fallbacks) + help_line,
                LowRankFallbackWarning, stacklevel=_caller_outside_jes(),
            )
        if not any(len(shape) >= 2 for _, shape in flat):  # nothing to factor, nor to warn of above
            warnings.warn(
                f"LowRank(rank={self.rank}): this policy has no matrix parameter ("
                f"{'none at all' if not flat else 'its only leaf is a vector or scalar' if len(flat) == 1 else f'its {len(flat)} leaves are vectors or scalars'}: "
                f"biases, scales), so every member draws full-rank noise for all of it, as with "
                f"full rank, under a run labelled low rank: use jes.FullRank() (jes train: --perturbation full_rank)",
                LowRankWarning, stacklevel=_caller_outside_jes(),
            )
        factored = [leaf for leaf in leaves if leaf.factored]
        # the smallest rank whose factors are no smaller than every matrix: any rank below gains on one
        below = max((-(-leaf.rows * leaf.cols // (leaf.rows + leaf.cols)) for leaf in factored), default=1)
        largest = max(factored, key=lambda leaf: (max(leaf.rows, leaf.cols), min(leaf.rows, leaf.cols)), default=None)
        if largest is not None and self.rank > max(largest.rows, largest.cols):
            # Refused, not only warned: a rank above both sides of every matrix buys nothing (a product A B^T has the
            # matrix's rank at most), and the factors and the step's compile grow with it (a new user's --rank 100000
            # on a 353-parameter MLP compiled for 12 minutes). Ranks up to it stay allowed (warned below).
            m, n = largest.rows, largest.cols
            raise ValueError(
                f"LowRank(rank={self.rank}) is larger than both sides of every matrix this policy's perturbation "
                f"factors (the largest: {'/'.join(largest.path)} {m}x{n}, whose products have rank {min(m, n)} at "
                f"most): each member would draw {self.rank * (m + n):,} floats for its {m * n:,}, and the step's "
                f"compile grows with the rank. Use jes.FullRank() (jes train: --perturbation full_rank)"
                + (f", or a rank below {below}, where the factors are smaller than a matrix (--rank {below - 1})"
                   if below > 1 else ""))
        if factored and all(self.rank * (leaf.rows + leaf.cols) >= leaf.rows * leaf.cols for leaf in factored):
            sides = ", ".join(f"{'/'.join(leaf.path)} {leaf.rows}x{leaf.cols}" for leaf in factored[:4])
            warnings.warn(
                f"LowRank(rank={self.rank}): a member's factors of every matrix it factors "
                f"({sides}{', ...' if len(factored) > 4 else ''}) are no smaller than the matrix (r * (m + n) >= "
                f"m * n floats), and no cheaper to apply: use jes.FullRank() (jes train: --perturbation full_rank)"
                + (f", or a rank below {below} (--rank {below - 1})" if below > 1 else ""),
                LowRankWarning, stacklevel=_caller_outside_jes(),
            )
        return Layout(tuple(leaves), self.rank)

    # ------------------------------------------------------------- noise from keys
    def _draw(self, layout: Layout, gen_key: jax.Array, source: jax.Array) -> jax.Array:
        key = jax.random.fold_in(jax.random.fold_in(gen_key, LOW_RANK_STREAM), source)
        return jax.random.normal(key, (layout.draw_size,), jnp.float32)

    def _draws(self, layout: Layout, gen_key: jax.Array, sources: jax.Array) -> jax.Array:
        """:meth:`_draw` of each of ``sources`` ``[k]``, ``[k, F]``, the same values, with the hash computed apart from
        what reads the draw: the random bits in a ``cond`` of their own (a runtime predicate, always true), so XLA
        cannot fuse the hash into the draw's consumers; the normal transform after it, as ``jax.random.normal``
        computes it (:func:`normal_from_bits`). Fused into its consumers (the draw's slices for dense leaves, the
        centre added, a layer's own concatenation of its kernels), the threefry hash, unrolled (jes.threefry), was
        copied into each consumer's loop, and LLVM's vectoriser took exponential time on the copies
        (OptimizedLSTMCell's fallback kernels on 2 devices: minutes to compile one step instead of seconds)."""
        def bits(s):
            keys = jax.vmap(lambda one: jax.random.fold_in(jax.random.fold_in(gen_key, LOW_RANK_STREAM), one))(s)
            return jax.vmap(lambda k: jax.random.bits(k, (layout.draw_size,), jnp.uint32))(keys)

        zeros = lambda s: jnp.zeros((s.shape[0], layout.draw_size), jnp.uint32)
        return normal_from_bits(jax.lax.cond(jnp.all(sources >= 0), bits, zeros, sources))

    def _sources(self, start: jax.Array, size: int, antithetic: bool) -> tuple[jax.Array, jax.Array]:
        members = jnp.asarray(start, jnp.int32) + jnp.arange(size, dtype=jnp.int32)
        if antithetic:
            return members // 2, jnp.where(members % 2 == 0, 1.0, -1.0).astype(jnp.float32)
        return members, jnp.ones(size, jnp.float32)

    def members(self, ctx: Any, mean: jax.Array, sigma: jax.Array, gen_key: jax.Array, start: jax.Array,
                size: int) -> dict:
        """Members ``start .. start+size-1``, compact: ``{"noise": [[G, *shape], ...], "a": [[G, r, m], ...], "b":
        [[G, r, n], ...], "sign": [C]}``, one draw per antithetic pair (``G = C / 2``; ``G = C`` without antithetic
        sampling): each dense leaf's ``sigma * eps`` (its own array, so the forward pass reads it in place),
        ``sigma / sqrt(r) * A^T`` and ``B^T`` unsigned, and each member's sign (member ``2p`` is ``+``, ``2p + 1``
        is ``-``). :meth:`FactoredMembers.slot_params` picks the form the rollout starts from, and
        :meth:`FactoredMembers.take` gives members their own form."""
        layout = ctx.layout
        sources, signs = self._sources(start, size, ctx.antithetic)
        if ctx.antithetic:
            noise._check_pairs(size)
            sources = sources[0::2]
        z = self._draws(layout, gen_key, sources)
        dense, a_list, b_list = layout.split(z)
        scale = sigma / math.sqrt(self.rank)
        return {"noise": layout.dense_leaves(sigma * dense), "a": [scale * a for a in a_list], "b": b_list,
                "sign": signs}

    def weighted_noise(self, ctx: Any, gen_key: jax.Array, start: jax.Array, weights: jax.Array) -> jax.Array:
        """``sum_i weights[i] * E_i`` over one chunk, ``[P]``: per matrix one ``A^T diag(w) B`` product."""
        layout, size = ctx.layout, weights.shape[0]
        sources, _ = self._sources(start, size, ctx.antithetic)
        if ctx.antithetic:
            noise._check_pairs(size)
            sources, w = sources[0::2], weights[0::2] - weights[1::2]
        else:
            w = weights
        z = self._draws(layout, gen_key, sources)
        dense, a_list, b_list = layout.split(z)
        k = w.shape[0]
        matrices = []
        for a_t, b_t in zip(a_list, b_list):  # [k, r, m], [k, r, n]: one [m, k r] x [k r, n] product
            m, n, r = a_t.shape[2], b_t.shape[2], self.rank
            weighted = (a_t * w[:, None, None]).reshape(k * r, m)
            matrices.append(noise.rows_product(weighted, b_t.reshape(k * r, n)) / math.sqrt(r))
        return layout.assemble(w @ dense, matrices)

    def member_noise(self, ctx: Any, gen_key: jax.Array, member: jax.Array) -> jax.Array:
        """``E_member`` as a flat ``[P]`` vector (the member materialised: for its parameters, not the rollout)."""
        layout = ctx.layout
        sources, signs = self._sources(jnp.asarray(member, jnp.int32), 1, ctx.antithetic)
        dense, a_list, b_list = layout.split(self._draw(layout, gen_key, sources[0]))
        matrices = [a_t.T @ b_t / math.sqrt(self.rank) for a_t, b_t in zip(a_list, b_list)]
        return signs[0] * layout.assemble(dense, matrices)

    # ------------------------------------------------------------- forward pass
    def member_fns(self, fns: Any, unravel: Callable, centre: jax.Array, layout: Layout) -> "FactoredMembers":
        """The rollout's view of members given by :meth:`members`, around the flat ``centre`` ``[P]``."""
        return FactoredMembers(fns, layout, unravel(centre))


# A low-rank run's default chunk (LowRank.default_chunk_size). Its members hold O(r (m + n)) floats each, so a chunk
# can be large, and the shared GEMM is faster on more rows, up to a point (MLP 256x256, r = 1, 4,096 members, one
# device, seeds 0-4: 0.73x batch inference with chunks of 1,024, 0.76x with 2,048, 0.70x with 4,096): up to
# CHUNK_SIZE members. But every env step reads the whole chunk's factors, so a chunk whose draws outgrow a server's
# last-level cache runs at memory bandwidth: MLP 256x256 at r = 4 (4,625 floats a member), 4,096 members, chunks
# of 2,048 (38 MB of draws) against 512 (9.5 MB), one process, seeds 0-4, 2-core EPYC with 32 MB of L3: 0.36x
# [0.34, 0.37] against 0.43x [0.32, 0.50] batch inference (the README's tables: 0.33x before, 0.55x and 0.43x after).
# So the chunk halves while its draws exceed CACHED_CHUNK_FLOATS, down to CACHED_CHUNK_SIZE members, below which
# the shared GEMM loses rows (chunks of 2,048 vs 512, 4,096 members, seeds 0-4: MLP 1024x1024 r = 1 0.91x / 0.89x,
# r = 4 0.74x / 0.75x; CNN 16c3x3 + 1024 r = 1 0.80x / 0.88x, r = 4 0.64x / 0.59x: within their spreads).
# CHUNK_FLOATS bounds a chunk whose layers jes cannot factor (dense leaves).
CHUNK_SIZE = 2048
CACHED_CHUNK_SIZE = 512
CACHED_CHUNK_FLOATS = 2 ** 22  # 16 MiB of float32 draws
CHUNK_FLOATS = 2 ** 26  # 256 MiB

# Rank-1 members whose draw (dense noise and factors) has at least this many floats start the rollout compact: an
# antithetic pair's slots share one draw in the first batch (FactoredMembers). Env steps/s of the compact form against
# every slot in its own form, 512 members, interleaved in one process, median [min, max] over seeds 0-4
# (`benchmarks/inference_ratio.py --compare-forms`, docs/guides/perturbations.md): r = 1: MLP 1024 x 1024 (6,149
# floats) 1.23x [0.91, 1.36], CNN 16c3x3 + 1024 (4,170) 1.05x [1.02, 1.23]; MLP 64 x 64, 256 x 256, CNN + 64, + 256
# (389-1,866) 0.95-1.01x; r = 4: 0.92-1.14x, mixed, so rank 1 only.
COMPACT_MIN_DRAW = 3072


def compact_by_default(layout: Layout) -> bool:
    """Whether members of ``layout`` start the rollout compact (rank 1, a draw of :data:`COMPACT_MIN_DRAW` or more)."""
    return layout.rank == 1 and layout.draw_size >= COMPACT_MIN_DRAW


class FactoredMembers:
    """``(member, carry, obs) -> (carry, out)`` with the centre's matrices shared and each member's factors added.

    Slots come in two forms. In their own form, ``{"dense": [[S, *shape], ...], "a": [[S, r, m], ...], "b":
    [[S, r, n], ...]}`` (the sign in ``dense`` and ``a``), :meth:`apply` is vmapped over slots. A large rank-1 member
    (a draw of :data:`COMPACT_MIN_DRAW` floats or more) starts the rollout compact instead (:meth:`slot_params`):
    the slots of an antithetic pair's episodes share one draw (its ``B`` read once for them all; the rest XLA
    expands per slot once, before the time loop), applied to the whole batch by :meth:`apply_batch`; the
    rollout's first compaction gives the running slots their own form (:meth:`take`). Which form a chunk starts
    in depends on the layout only, so every device, worker and process runs the same program for it.
    """

    def __init__(self, fns: Any, layout: Layout, centre_tree: Any, compact: bool | None = None):
        self.fns, self.layout = fns, layout
        self.centre_leaves, self.treedef = jax.tree.flatten(centre_tree)
        self.centre_dense = [c for c, leaf in zip(self.centre_leaves, layout.leaves) if not leaf.factored]
        # None: by the member's size (compact_by_default); True / False force a form (benchmarks, tests)
        self.compact = compact_by_default(layout) if compact is None else compact

    def slot_params(self, members: dict, episodes: int = 1) -> dict:
        """``episodes`` slots per member (``members`` from :meth:`LowRank.members`; slot ``i * episodes + e`` is
        member ``i``'s episode ``e``): compact (the draws as they are, a sign per slot) when slots share draws and
        the draw is large, else each slot in its own form."""
        sign = jnp.repeat(members["sign"], episodes) if episodes > 1 else members["sign"]
        compact = dict(members, sign=sign)
        if self._group_size(compact) == 1 or not self.compact:
            return self.take(compact, jnp.arange(sign.shape[0], dtype=jnp.int32))
        return compact

    @staticmethod
    def _group_size(params: dict) -> int:
        """Slots that share one draw (``2 * episodes`` for antithetic pairs)."""
        draws = [x.shape[0] for x in params["noise"] + params["a"]]
        return params["sign"].shape[0] // draws[0] if draws else 1

    def _member(self, noise_leaves: list, a_list: list, b_list: list, sign: jax.Array) -> dict:
        """Slots' own form from their draws and signs (leaves ``[..., *shape]``, ``sign`` ``[...]``; or one slot's)."""
        shaped = lambda x: sign.reshape(sign.shape + (1,) * (x.ndim - sign.ndim))
        return {"dense": [c + shaped(n) * n for c, n in zip(self.centre_dense, noise_leaves)],
                "a": [shaped(a) * a for a in a_list], "b": b_list}

    def take(self, params: dict, slots: jax.Array) -> dict:
        """Slots ``slots`` of either form, each in its own form (for :meth:`apply`)."""
        if "sign" not in params:
            return jax.tree.map(lambda x: x[slots], params)
        group, sign = slots // self._group_size(params), params["sign"][slots]
        pick = lambda leaves: [x[group] for x in leaves]
        return self._member(pick(params["noise"]), pick(params["a"]), pick(params["b"]), sign)

    def apply_batch(self, params: dict, carry: Any, obs: jax.Array) -> tuple[Any, jax.Array]:
        """:meth:`apply` of every slot, ``[S, ...]``; of the compact form: a vmap over the draws, and in it over the
        slots sharing each draw (whose factors are then one array for them all)."""
        if "sign" not in params:
            return jax.vmap(self.apply)(params, carry, obs)
        slots, size = params["sign"].shape[0], self._group_size(params)
        split = lambda t: jax.tree.map(lambda x: x.reshape((slots // size, size) + x.shape[1:]), t)

        def group(noise_leaves, a_list, b_list, signs, c, o):
            one = lambda s, c1, o1: self.apply(self._member(noise_leaves, a_list, b_list, s), c1, o1)
            return jax.vmap(one)(signs, c, o)

        c, out = jax.vmap(group)(params["noise"], params["a"], params["b"], split(params["sign"]), split(carry),
                                 split(obs))
        return jax.tree.map(lambda x: x.reshape((slots,) + x.shape[2:]), (c, out))

    def initial_carry(self) -> Any:
        return self.fns.initial_carry()

    def apply(self, member: dict, carry: Any, obs: jax.Array) -> tuple[Any, jax.Array]:
        """One slot, its member in its own form (:meth:`take`)."""
        leaves, dense = list(self.centre_leaves), iter(member["dense"])
        factors, j = {}, 0
        for i, leaf in enumerate(self.layout.leaves):
            if leaf.factored:
                factors[leaf.path] = (member["a"][j], member["b"][j])
                j += 1
            else:
                leaves[i] = next(dense)
        variables = jax.tree.unflatten(self.treedef, leaves)
        with nn.intercept_methods(_interceptor(factors)):
            return self.fns.apply(variables, carry, obs)
