"""jes.perturbations: low-rank (EGGROLL) members, named after the paper's claims.

Forward equivalence (the factored forward pass equals the materialised ``W + sigma/sqrt(r) A B^T`` one)
for every supported layer type; noise determinism from (key, generation, member); an antithetic pair
with equal fitness moves nothing; the accumulated update has rank > r; no member ever holds ``[C, P]``.
"""
import math
import os
import re
import subprocess
import sys
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jes
from jes import perturbations
from jes.perturbations import low_rank
from jes.policies import PolicyFns, TorchLinear
from jes.strategies import noise


class ConvPolicy(nn.Module):
    """A MinAtar-style CNN: Conv, then Dense."""

    num_outputs: int = 3

    @nn.compact
    def __call__(self, obs):
        x = nn.relu(nn.Conv(4, (3, 3), padding="SAME")(obs.astype(jnp.float32)))
        x = nn.relu(nn.Conv(3, (2, 2), strides=(2, 2), padding="VALID")(x))
        return nn.Dense(self.num_outputs)(x.reshape(-1))


class ConvVariants(nn.Module):
    """Conv layers the shifted-window correction has to get right: kernel dilation, circular, reflect and explicit
    padding, unequal strides; and one it leaves to the identity-kernel patches (input dilation)."""

    @nn.compact
    def __call__(self, obs):
        x = nn.relu(nn.Conv(3, (3, 3), kernel_dilation=2, padding="SAME")(obs))
        x = nn.relu(nn.Conv(3, (2, 3), padding="CIRCULAR")(x))
        x = nn.relu(nn.Conv(2, (3, 3), padding="REFLECT")(x))
        x = nn.relu(nn.Conv(3, (3, 2), strides=(2, 1), padding=((1, 0), (0, 2)))(x))
        x = nn.relu(nn.Conv(2, (2, 2), input_dilation=2, padding=1)(x))
        return nn.Dense(2)(x.reshape(-1))


class EmbedPolicy(nn.Module):
    num_outputs: int = 2

    @nn.compact
    def __call__(self, obs):
        ids = jnp.clip(jnp.round(jnp.abs(obs) * 3).astype(jnp.int32), 0, 7)
        return nn.DenseGeneral(self.num_outputs)(nn.Embed(8, 5)(ids).reshape(-1))


class LSTMPolicy(nn.Module):
    num_outputs: int = 2

    @nn.nowrap
    def initialize_carry(self, rng, input_shape):
        return nn.LSTMCell(6, parent=None).initialize_carry(rng, (1,))

    @nn.compact
    def __call__(self, carry, obs):
        carry, h = nn.LSTMCell(6)(carry, obs)
        return carry, nn.Dense(self.num_outputs)(h)


class RecurrentPolicy(nn.Module):
    """A flax.linen recurrent cell (``SimpleCell``, ``MGUCell``, or ``OptimizedLSTMCell``: not factorable) and a Dense
    head."""

    cell: str = "simple"
    num_outputs: int = 2

    def make(self, **kw):
        return {"simple": nn.SimpleCell, "mgu": nn.MGUCell, "optimized_lstm": nn.OptimizedLSTMCell}[self.cell](6, **kw)

    @nn.nowrap
    def initialize_carry(self, rng, input_shape):
        return self.make(parent=None).initialize_carry(rng, (1,))

    @nn.compact
    def __call__(self, carry, obs):
        carry, h = self.make()(carry, obs)
        return carry, nn.Dense(self.num_outputs)(h)


class ConvLSTMPolicy(nn.Module):
    """A ``ConvLSTMCell`` (built from ``Conv``) over a 5x5x2 observation and a Dense head."""

    num_outputs: int = 2

    @nn.nowrap
    def initialize_carry(self, rng, input_shape):
        return nn.ConvLSTMCell(3, (3, 3), parent=None).initialize_carry(rng, (5, 5, 2))

    @nn.compact
    def __call__(self, carry, obs):
        carry, h = nn.ConvLSTMCell(3, (3, 3))(carry, obs)
        return carry, nn.Dense(self.num_outputs)(h.reshape(-1))


class RawMatmul(nn.Module):
    """A matrix applied with a bare ``@``: low rank cannot factor it, so it falls back to dense noise."""

    num_outputs: int = 2

    @nn.compact
    def __call__(self, obs):
        w = self.param("w", nn.initializers.lecun_normal(), (obs.shape[-1], 4))
        return nn.Dense(self.num_outputs)(jnp.tanh(obs @ w))


def _doubled_dot(lhs, rhs, *args, **kwargs):
    return jax.lax.dot_general(lhs, 2.0 * rhs, *args, **kwargs)


def _doubled_conv(lhs, rhs, *args, **kwargs):
    return jax.lax.conv_general_dilated(lhs, 2.0 * rhs, *args, **kwargs)


class TransformedMatrices(nn.Module):
    """Layers that apply a function of their matrix, not the matrix: masked through ``nn.map_variables``, doubled by
    their own product, transposed or stacked for ``matvec``. Each must fall back (the correction of the raw matrix
    would give another forward pass than the member's materialised parameters)."""

    num_outputs: int = 2

    matvec = jes.policies.matvec

    @nn.compact
    def __call__(self, obs):
        lower = lambda vs: jax.tree.map(lambda w: w * jnp.tril(jnp.ones_like(w)) if w.ndim == 2 else w, vs)
        masked = nn.map_variables(nn.Dense, "params", trans_in_fn=lower, init=self.is_initializing())(4)(obs)
        lifted = nn.map_variables(nn.remat(nn.Dense), "params", trans_in_fn=lower, init=self.is_initializing())(4)(obs)
        torch = nn.map_variables(TorchLinear, "params", trans_in_fn=lower, init=self.is_initializing())(4)(obs)
        doubled = nn.Dense(4, dot_general=_doubled_dot)(obs)
        conv = nn.Conv(2, (3,), padding="SAME", conv_general_dilated=_doubled_conv)(obs[:, None]).reshape(-1)
        w = self.param("transposed", nn.initializers.lecun_normal(), (4, 3))
        stacked = self.param("stacked", nn.initializers.lecun_normal(), (2, 2, 4))
        h = jnp.concatenate([masked, lifted, torch, doubled, conv, self.matvec("transposed", w.T, obs),
                             self.matvec("stacked", stacked, obs).reshape(-1)])
        return nn.Dense(self.num_outputs)(jnp.tanh(h))


class TiedEmbedding(nn.Module):
    """An Embed table used twice: looked up (factorable) and by ``attend`` (tied output weights, not)."""

    num_outputs: int = 2

    @nn.compact
    def __call__(self, obs):
        embed = nn.Embed(8, 5)
        h = embed(jnp.clip(obs.astype(jnp.int32), 0, 7)).sum(0)
        return nn.Dense(self.num_outputs)(embed.attend(jnp.tanh(h)))


class TiedDirect(nn.Module):
    """Tied weights read directly, outside their layer's call: an Embed table projected back with
    ``h @ embedding.T`` and a Dense kernel reused as ``kernel.T`` (the member's forward kept the centre's matrix in
    those uses, silently, until the layout traced for them)."""

    num_outputs: int = 2

    def setup(self):
        self.embed, self.enc, self.head = nn.Embed(8, 5), nn.Dense(5, use_bias=False), nn.Dense(self.num_outputs)

    def __call__(self, obs):
        h = jnp.tanh(self.embed(jnp.clip(obs.astype(jnp.int32), 0, 7)).sum(0) + self.enc(obs))
        decoded = h @ self.enc.variables["params"]["kernel"].T
        return self.head(jnp.concatenate([jnp.tanh(h @ self.embed.embedding.T), decoded]))


class MatvecOfAnotherLeaf(nn.Module):
    """A factored matvec matrix ``w`` also handed, transposed, as another parameter's weight: that use is a direct read
    (the first tied-weight check cut every matvec call's output off and missed it; review)."""

    matvec = jes.policies.matvec

    @nn.compact
    def __call__(self, obs):
        w = self.param("w", nn.initializers.lecun_normal(), (3, 3))
        v = self.param("v", nn.initializers.lecun_normal(), (3, 3))
        h = jnp.tanh(self.matvec("w", w, obs))
        return nn.Dense(2)(jnp.tanh(self.matvec("v", w.T, h)) + self.matvec("v", v, h))


class LiftedLayers(nn.Module):
    """Dense layers applied inside nn.while_loop, nn.custom_vjp, nn.scan (parameters broadcast), nn.cond and nn.remat:
    factored, none of them a direct read (a first version of the tied-weight check flagged the while loop's and the
    custom_vjp's; review). ``direct`` adds a read of a kernel inside the scan's body, which is flagged."""

    direct: bool = False

    def setup(self):
        self.loop, self.vjp, self.scanned, self.branch, self.head = (nn.Dense(4) for _ in range(5))

    def __call__(self, obs):
        h = jnp.tanh(self.loop(obs))
        _, h = nn.while_loop(lambda m, c: c[0] < 2, lambda m, c: (c[0] + 1, jnp.tanh(m.loop(c[1]))), self, (0, h))
        f = lambda m, x: m.vjp(x)  # noqa: E731
        h = jnp.tanh(nn.custom_vjp(f, forward_fn=lambda m, x: nn.vjp(f, m, x),
                                   backward_fn=lambda v, g: v(g))(self, h))

        def step(m, c, _):
            c = jnp.tanh(m.scanned(c))
            return (c + c @ m.scanned.variables["params"]["kernel"] if self.direct else c), None

        h, _ = nn.scan(step, variable_broadcast="params", split_rngs={"params": False}, length=2)(self, h, None)
        h = nn.cond(h[0] > 0, lambda m, x: m.branch(x), lambda m, x: -m.branch(x), self, h)
        return nn.remat(lambda m, x: m.head(jnp.tanh(x)))(self, h)


class MaskedDense(nn.Dense):
    """A Dense subclass that overrides ``__call__`` (a lower-triangular mask on its kernel): the factored correction
    of ``Dense`` would ignore the mask, so its kernel falls back to dense noise."""

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features))
        return x @ (kernel * jnp.tril(jnp.ones_like(kernel)))


class TransposedDense(nn.Dense):
    """A Dense subclass that keeps its kernel as ``(out, in)`` and applies ``x @ kernel.T``."""

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", self.kernel_init, (self.features, x.shape[-1]))
        return x @ kernel.T


class DenseSubclasses(nn.Module):
    num_outputs: int = 2

    @nn.compact
    def __call__(self, obs):
        h = jnp.tanh(MaskedDense(4)(obs))
        return nn.Dense(self.num_outputs)(jnp.tanh(TransposedDense(6)(h)))


class OwnMatvecs(nn.Module):
    """Methods of the user's own named ``matvec``: one computing something else (``sigmoid(w @ x)``), one with
    another signature; and jes's ``matvec`` called with keywords. Only the last is factored: the others' matrices
    fall back (they were taken for jes's ``matvec(name, weight, x)``: a wrong forward, or a crash inside jes)."""

    num_outputs: int = 2

    class Gated(nn.Module):
        def matvec(self, name, w, x):
            return jax.nn.sigmoid(w @ x)

        @nn.compact
        def __call__(self, x):
            return self.matvec("w", self.param("w", nn.initializers.lecun_normal(), (4, x.shape[-1])), x)

    class TwoArguments(nn.Module):
        def matvec(self, w, x):
            return w @ x

        @nn.compact
        def __call__(self, x):
            return self.matvec(self.param("w", nn.initializers.lecun_normal(), (4, x.shape[-1])), x)

    class Keywords(nn.Module):
        matvec = jes.policies.matvec

        @nn.compact
        def __call__(self, x):
            w = self.param("w", nn.initializers.lecun_normal(), (4, x.shape[-1]))
            return self.matvec(name="w", weight=w, x=x) + self.matvec("w", w, x=x)

    @nn.compact
    def __call__(self, obs):
        h = jnp.concatenate([self.Gated()(obs), self.TwoArguments()(obs), self.Keywords()(obs)])
        return nn.Dense(self.num_outputs)(jnp.tanh(h))


class AppliedOnItsOwn(nn.Module):
    """A Dense applied with ``.apply`` inside the policy, on a masked copy of the policy's own ``kernel``: its scope
    path is ``()``, so its kernel was taken for the policy's top-level ``params/kernel`` and corrected as the raw
    matrix (a wrong forward, no warning)."""

    num_outputs: int = 2

    @nn.compact
    def __call__(self, obs):
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (obs.shape[-1], 4))
        h = nn.Dense(4, use_bias=False).apply({"params": {"kernel": kernel * jnp.tril(jnp.ones_like(kernel))}}, obs)
        return nn.Dense(self.num_outputs)(jnp.tanh(h))


class JitChild(nn.Module):
    """A layer inside nn.jit, whose cached trace a member's call may reuse without jes's correction."""

    num_outputs: int = 2

    @nn.compact
    def __call__(self, obs):
        return nn.Dense(self.num_outputs)(jnp.tanh(nn.jit(nn.Dense)(4)(obs)))


class KeptConv(nn.Conv):
    """A subclass of a layer jes factors that keeps its ``__call__``: factored as the layer is."""


POLICIES = {
    "mlp (Dense)": (jes.MLPPolicy((8, 8), num_outputs=2), (4,)),
    "gru torch layout (matvec)": (jes.GRUPolicy(5, 2, num_outputs=2), (4,)),
    "gru flax layout (GRUCell)": (jes.GRUPolicy(5, 2, num_outputs=2, torch_layout=False), (4,)),
    "lstm (LSTMCell)": (LSTMPolicy(), (3,)),
    "cnn (Conv)": (ConvPolicy(), (6, 6, 2)),
    "embed + DenseGeneral": (EmbedPolicy(), (3,)),
    "bare matmul (fallback)": (RawMatmul(), (3,)),
    "tied embedding, Embed.attend (fallback)": (TiedEmbedding(), (3,)),
    "tied weights read directly (fallback)": (TiedDirect(), (3,)),
    "a matvec matrix handed as another parameter's weight (fallback)": (MatvecOfAnotherLeaf(), (3,)),
    "layers inside while_loop, custom_vjp, scan, cond, remat": (LiftedLayers(), (4,)),
    "a kernel read directly inside nn.scan (fallback)": (LiftedLayers(direct=True), (4,)),
    "Dense subclasses overriding __call__ (fallback)": (DenseSubclasses(), (4,)),
    "SimpleCell": (RecurrentPolicy(cell="simple"), (3,)),
    "MGUCell": (RecurrentPolicy(cell="mgu"), (3,)),
    "ConvLSTMCell (Conv)": (ConvLSTMPolicy(), (5, 5, 2)),
    "a bare Conv as the whole policy": (nn.Conv(2, (3,), padding="SAME"), (5, 1)),
    "conv variants (dilation, circular, reflect, explicit, input dilation)": (ConvVariants(), (7, 7, 2)),
    "causal 1-D conv": (nn.Conv(2, (3,), padding="CAUSAL"), (6, 1)),
    "a Conv subclass keeping __call__": (KeptConv(2, (3, 3), padding="SAME"), (5, 5, 2)),
    "a 1-D Conv with an int kernel size and input dilation": (nn.Conv(2, 3, input_dilation=2, padding=1), (5, 2)),
    "functions of the matrix: mapped, own product, transposed, stacked (fallback)": (TransformedMatrices(), (4,)),
    "methods of one's own named matvec (fallback), jes's with keywords": (OwnMatvecs(), (3,)),
    "a Dense applied on its own inside the policy (fallback)": (AppliedOnItsOwn(), (3,)),
    "a policy wrapped in nn.jit (fallback: its members were the centre)": (nn.jit(jes.MLPPolicy)((8,), num_outputs=2),
                                                                           (4,)),
    "a Dense inside nn.jit (fallback)": (JitChild(), (4,)),
}


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_conv_correction_from_the_padded_input_equals_the_identity_kernel_patches(rank):
    """The Conv correction from the padded input (each kernel offset's product at every padded position, the
    shifted windows stacked, or their patches times A) equals patches(x) A B^T with the patches from a conv with
    an identity kernel: SAME, strided VALID, dilated, circular and causal padding, 1-D, 2-D and 3-D kernels, with
    a batch axis of the policy's own, each form seen at ranks 1 and 2 (from PRODUCT_RANK on, the patches' product
    only); input dilation is left to the identity-kernel patches (None)."""
    from jes.perturbations.low_rank import _conv_correction, _conv_correction_form, _conv_geometry, low_rank_product

    forms = set()
    convs = [nn.Conv(3, (3, 3), padding="SAME"), nn.Conv(3, (3, 3), strides=2, padding="VALID"),
             nn.Conv(3, (3, 3), strides=3, padding="VALID"), nn.Conv(3, (3, 3), padding="CIRCULAR"),
             nn.Conv(3, (2, 3), strides=(1, 2), kernel_dilation=(2, 1), padding="SAME"),
             nn.Conv(3, (3,), kernel_dilation=2, padding="CAUSAL"), nn.Conv(3, (2, 2, 2), padding="SAME")]
    for cin in (1, 2, 8):
        for conv in convs:
            nd = len(conv.kernel_size)
            x = jax.random.normal(jax.random.key(0), (2,) + (7,) * nd + (cin,))  # a batch of 2 inside a member
            rows = math.prod(conv.kernel_size) * cin
            a_t = jax.random.normal(jax.random.key(1), (rank, rows))
            b_t = jax.random.normal(jax.random.key(2), (rank, 3))
            forms.add(_conv_correction_form(*_conv_geometry(conv, x), rank))
            identity = jnp.eye(rows).reshape(tuple(conv.kernel_size) + (cin, rows))
            patches = conv.clone(features=rows, use_bias=False).apply({"params": {"kernel": identity}}, x)
            np.testing.assert_allclose(np.asarray(_conv_correction(conv, x, a_t, b_t)),
                                       np.asarray(low_rank_product(patches, a_t, b_t)), rtol=1e-5, atol=1e-5)
        dilated_input = nn.Conv(3, (3, 3), input_dilation=2, padding=1)
        assert _conv_correction(dilated_input, jnp.ones((7, 7, cin)), jnp.ones((rank, 9 * cin)), b_t) is None
    assert forms == ({"patches"} if rank >= low_rank.PRODUCT_RANK else {"offsets", "windows", "patches"})


def test_conv_correction_edges():
    """Many leading axes: the offsets' einsum takes at most 26 subscripts, beyond them the windows (both equal the
    patches' product); an input smaller than the dilated kernel (an empty output) is left to the identity-kernel
    conv (None)."""
    from jes.perturbations.low_rank import _conv_correction, _conv_correction_form, _conv_geometry, low_rank_product

    conv = nn.Conv(3, (3,), padding="SAME")
    a_t, b_t = jax.random.normal(jax.random.key(1), (1, 12)), jax.random.normal(jax.random.key(2), (1, 3))
    for leading, form in ((24, "offsets"), (25, "windows")):
        x = jax.random.normal(jax.random.key(0), (1,) * leading + (5, 4))
        assert _conv_correction_form(*_conv_geometry(conv, x), 1) == form
        patches = conv.clone(features=12, use_bias=False).apply(
            {"params": {"kernel": jnp.eye(12).reshape(3, 4, 12)}}, x)
        np.testing.assert_allclose(np.asarray(_conv_correction(conv, x, a_t, b_t)),
                                   np.asarray(low_rank_product(patches, a_t, b_t)), rtol=1e-5, atol=1e-5)
    dilated = nn.Conv(3, (4,), kernel_dilation=3, padding="VALID")
    assert _conv_geometry(dilated, jnp.ones((6, 2))) is None
    assert _conv_correction(dilated, jnp.ones((6, 2)), jnp.ones((1, 8)), b_t) is None


class Ctx:
    """The two Context fields a perturbation reads."""

    def __init__(self, layout, antithetic=True):
        self.layout, self.antithetic = layout, antithetic


def setup(policy, obs_shape, rank):
    fns = PolicyFns(policy, obs_shape)
    variables = fns.init(jax.random.key(1))
    flat, unravel = jax.flatten_util.ravel_pytree(variables)
    lowrank = jes.LowRank(rank)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layout = lowrank.layout(fns, variables)
    return fns, flat, unravel, lowrank, layout


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("rank", [1, 3])
def test_low_rank_forward_equals_the_materialised_member(name, rank):
    policy, obs_shape = POLICIES[name]
    fns, flat, unravel, lowrank, layout = setup(policy, obs_shape, rank)
    ctx, sigma, gen_key = Ctx(layout), jnp.float32(0.3), jax.random.key(7)
    members = lowrank.members(ctx, flat, sigma, gen_key, jnp.int32(4), 4)
    factored = lowrank.member_fns(fns, unravel, flat, layout)
    obs = jax.random.normal(jax.random.key(2), obs_shape)
    carry = fns.initial_carry()
    own = factored.take(factored.slot_params(members), jnp.arange(4))  # each member in its own form
    for i in range(4):
        member = jax.tree.map(lambda x: x[i], own)
        dense = flat + sigma * lowrank.member_noise(ctx, gen_key, jnp.int32(4 + i))
        want = fns.apply(unravel(dense), carry, obs)
        got = factored.apply(member, carry, obs)
        for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5)
    # The member really is perturbed: it differs from the centre.
    centre = fns.apply(unravel(flat), carry, obs)
    assert not np.allclose(np.asarray(jax.tree.leaves(centre)[-1]), np.asarray(jax.tree.leaves(got)[-1]))


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("antithetic", [True, False])
def test_the_compact_slots_of_a_batch_equal_each_members_materialised_forward(name, antithetic, monkeypatch):
    """The rollout's first batch applies large members' slots compact (an antithetic pair's episodes share one draw;
    forced here for small ones): every slot's output is its member's materialised forward, and so is each slot
    taken into its own form."""
    monkeypatch.setattr(low_rank, "COMPACT_MIN_DRAW", 0)
    policy, obs_shape = POLICIES[name]
    fns, flat, unravel, lowrank, layout = setup(policy, obs_shape, 1)
    ctx, sigma, gen_key = Ctx(layout, antithetic=antithetic), jnp.float32(0.3), jax.random.key(9)
    factored = lowrank.member_fns(fns, unravel, flat, layout)
    episodes = 2
    slots = factored.slot_params(lowrank.members(ctx, flat, sigma, gen_key, jnp.int32(2), 4), episodes)
    obs = jax.random.normal(jax.random.key(3), (8,) + obs_shape)
    carry = jax.tree.map(lambda c: jnp.broadcast_to(c, (8,) + c.shape), fns.initial_carry())
    batch_carry, batch_out = jax.jit(factored.apply_batch)(slots, carry, obs)
    own_carry, own_out = jax.jit(jax.vmap(factored.apply))(factored.take(slots, jnp.arange(8)), carry, obs)
    for slot in range(8):
        dense = flat + sigma * lowrank.member_noise(ctx, gen_key, jnp.int32(2 + slot // episodes))
        want = fns.apply(unravel(dense), jax.tree.map(lambda c: c[slot], carry), obs[slot])
        for got in ((batch_carry, batch_out), (own_carry, own_out)):
            for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
                np.testing.assert_allclose(np.asarray(g[slot]), np.asarray(w), rtol=2e-5, atol=2e-5)
    assert not np.allclose(np.asarray(batch_out[0]), np.asarray(batch_out[2]))  # slots 0 and 2: two members
    assert ("sign" in slots) == (antithetic or episodes > 1)  # compact wherever slots share a draw


@pytest.mark.hard_timeout(300)
def test_compact_chunks_give_the_same_bits_in_the_step_and_chunk_by_chunk_as_workers_run_them(monkeypatch):
    """Large members start the rollout compact and are taken into their own form at its first compaction (CartPole's
    episodes end early): the one-device step (every chunk in one program) and the chunks evaluated one program at a
    time, as workers and devices do, give the same bits; the large-member threshold is lowered to reach it here."""
    monkeypatch.setattr(low_rank, "COMPACT_MIN_DRAW", 0)
    config = jes.ESConfig(num_members=32, chunk_size=16, episodes_per_member=2, eval_episodes=2,
                          perturbation=jes.LowRank(1), normalize_observations=True)
    trainer = jes.Trainer(jes.MLPPolicy((16, 16)), "CartPole-v1", "adam", config)
    state = trainer.init_state(3)
    members, _, _ = trainer.sample_chunk(state, jnp.int32(0))
    assert "sign" in trainer.member_fns(state.params).slot_params(members, 2)
    stepped, metrics = trainer.step(state, False, True)
    results = jax.jit(lambda s: trainer.evaluate_chunks(s, jnp.arange(2, dtype=jnp.int32)))(state)
    applied, _ = jax.jit(trainer.apply_chunk_results)(state, results)
    assert np.array_equal(np.asarray(stepped.params), np.asarray(applied.params))
    assert np.array_equal(np.asarray(stepped.obs_sum), np.asarray(applied.obs_sum))
    steps = np.asarray(results.env_steps)
    assert int(metrics["env_steps"]) == steps.sum() and steps.sum() < 32 * 2 * 500  # episodes ended early


@pytest.mark.parametrize("name", [n for n in POLICIES if "fallback" not in n])
def test_every_matrix_of_the_supported_layers_is_factored(name):
    policy, obs_shape = POLICIES[name]
    fns = PolicyFns(policy, obs_shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error", perturbations.LowRankFallbackWarning)  # no fallback warning
        layout = jes.LowRank(2).layout(fns, fns.init(jax.random.key(0)))
    assert all(leaf.factored == (len(leaf.shape) >= 2) for leaf in layout.leaves)
    assert layout.factored


def test_a_matrix_it_cannot_factor_falls_back_to_dense_noise_with_a_warning_naming_it():
    policy, obs_shape = POLICIES["bare matmul (fallback)"]
    fns = PolicyFns(policy, obs_shape)
    with pytest.warns(UserWarning, match=r"(?s)1 matrix parameter of this policy gets full-rank noise.*\n  params/w "
                                         r"\[3, 4\] of layer RawMatmul: not applied by a layer jes can factor\nLayers"):
        layout = jes.LowRank(1).layout(fns, fns.init(jax.random.key(0)))
    assert {leaf.path[-1]: leaf.factored for leaf in layout.leaves} == {"w": False, "kernel": True, "bias": False}


def test_a_layer_applying_a_function_of_its_matrix_falls_back_naming_why():
    fns = PolicyFns(TransformedMatrices(), (4,))
    with pytest.warns(perturbations.LowRankFallbackWarning) as caught:
        layout = jes.LowRank(1).layout(fns, fns.init(jax.random.key(0)))
    message = str(caught[0].message)
    assert message.startswith("LowRank: 7 matrix parameters of this policy get full-rank noise")
    for why in (r"Map_variablesDense_0/kernel \[4, 4\] of layer Dense \(in TransformedMatrices\): its variables are "
                r"mapped by nn.map_variables",
                r"Map_variablesCheckpointDense_0/kernel \[4, 4\] of layer Dense .*: its variables are mapped",
                r"Map_variablesTorchLinear_0/weight \[4, 4\] of layer TorchLinear .*: its variables are mapped by "
                r"nn.map_variables, so the matrix matvec applies",
                r"Dense_0/kernel \[4, 4\] of layer Dense .*: Dense with its own dot_general",
                r"Conv_0/kernel \[3, 1, 2\] of layer Conv .*: Conv with its own conv_general_dilated",
                r"transposed \[4, 3\] of layer TransformedMatrices: matvec was given a function of the parameter",
                r"stacked \[2, 2, 4\] of layer TransformedMatrices: matvec applied it as a 3-d weight to a 1-d input"):
        assert re.search(why, message), why
    assert [leaf.path[1:] for leaf in layout.factored] == [("Dense_1", "kernel")]  # the head only


def test_only_jes_matvec_and_the_policys_own_scopes_are_factored():
    fns = PolicyFns(OwnMatvecs(), (3,))
    with pytest.warns(perturbations.LowRankFallbackWarning) as caught:
        layout = jes.LowRank(1).layout(fns, fns.init(jax.random.key(0)))
    factored = {"/".join(leaf.path[1:]) for leaf in layout.factored}
    assert factored == {"Keywords_0/w", "Dense_0/kernel"}, factored
    message = str(caught[0].message)
    assert "Gated_0/w [4, 3]" in message and "TwoArguments_0/w [4, 3]" in message
    assert "`matvec = jes.policies.matvec`" in message
    fns = PolicyFns(AppliedOnItsOwn(), (3,))
    with pytest.warns(perturbations.LowRankFallbackWarning, match=r"params/kernel \[3, 4\] of layer AppliedOnItsOwn"):
        layout = jes.LowRank(1).layout(fns, fns.init(jax.random.key(0)))
    assert [leaf.path[1:] for leaf in layout.factored] == [("Dense_1", "kernel")]  # the head (the inner Dense is Dense_0)


class SpectralNormed(nn.Module):
    """A Dense under ``nn.SpectralNorm``: its power-iteration vector ``u`` is a matrix-shaped variable of the
    ``batch_stats`` collection, which jes evolves with the parameters."""

    num_outputs: int = 2

    @nn.compact
    def __call__(self, obs):
        return nn.Dense(self.num_outputs)(jnp.tanh(nn.SpectralNorm(nn.Dense(4))(obs, update_stats=False)))


def test_a_variable_of_another_collection_is_named_with_its_layer_and_collection():
    fns = PolicyFns(SpectralNormed(), (3,))
    with pytest.warns(perturbations.LowRankFallbackWarning) as caught:
        layout = jes.LowRank(1).layout(fns, fns.init(jax.random.key(0)))
    message = str(caught[0].message)
    assert re.search(r"batch_stats/SpectralNorm_0/Dense_1/kernel/u \[1, 4\] of layer SpectralNorm "
                     r"\(in SpectralNormed\): a variable of the 'batch_stats' collection \(jes evolves every "
                     r"collection\), not a matrix a layer applies", message), message
    assert [leaf.path[1:] for leaf in layout.factored] == [("Dense_0", "kernel")]  # the head only


def test_the_draws_are_jax_random_normal_bit_for_bit():
    """LowRank._draws hashes apart from the draw's consumers (see its docstring) and turns the bits into normals
    itself: the values must be ``jax.random.normal``'s, bit for bit (a jax that changes its transform fails here)."""
    for seed in range(3):
        key = jax.random.fold_in(jax.random.key(seed), 11)
        want = jax.random.normal(key, (50_001,), jnp.float32)
        got = jax.jit(lambda k: low_rank.normal_from_bits(jax.random.bits(k, (50_001,), jnp.uint32)))(key)
        assert np.array_equal(np.asarray(want).view(np.uint32), np.asarray(got).view(np.uint32))
    fns = PolicyFns(jes.MLPPolicy((8,), num_outputs=2), (4,))
    layout = jes.LowRank(2).layout(fns, fns.init(jax.random.key(0)))
    lowrank, gen_key, sources = jes.LowRank(2), jax.random.key(5), jnp.arange(3, 9, dtype=jnp.int32)
    want = jax.vmap(lambda s: lowrank._draw(layout, gen_key, s))(sources)
    got = jax.jit(lambda s: lowrank._draws(layout, gen_key, s))(sources)
    assert np.array_equal(np.asarray(want).view(np.uint32), np.asarray(got).view(np.uint32))


def test_a_dense_subclass_that_overrides_call_falls_back_to_dense_noise_with_a_warning():
    fns = PolicyFns(DenseSubclasses(), (4,))
    with pytest.warns(perturbations.LowRankFallbackWarning, match=r"MaskedDense_0/kernel \[4, 4\] of layer MaskedDense .*\n.*TransposedDense_0/kernel \[6, 4\]"):
        layout = jes.LowRank(1).layout(fns, fns.init(jax.random.key(0)))
    assert {leaf.path[1]: leaf.factored for leaf in layout.leaves if len(leaf.shape) == 2} == {
        "MaskedDense_0": False, "TransposedDense_0": False, "Dense_0": True}


class Bf16Recurrent(nn.Module):
    """A recurrent policy whose carry is a bfloat16 Dense layer's output."""

    num_outputs: int = 2

    @nn.nowrap
    def initialize_carry(self, rng, input_shape):
        return jnp.zeros((6,), jnp.bfloat16)

    @nn.compact
    def __call__(self, carry, obs):
        h = jnp.tanh(nn.Dense(6, dtype=jnp.bfloat16)(jnp.concatenate([obs, carry.astype(jnp.float32)])))
        return h, nn.Dense(self.num_outputs)(h.astype(jnp.float32))


def test_a_factored_layer_keeps_its_output_dtype_so_a_bfloat16_carry_trains():
    trainer = jes.Trainer(Bf16Recurrent(), "CartPole-v1", "adam",
                          jes.ESConfig(num_members=8, eval_episodes=2, max_episode_steps=20, perturbation="low_rank"))
    state = trainer.init_state(0)
    factored = trainer.member_fns(state.params)
    members, _, _ = trainer.sample_chunk(state, jnp.int32(0))
    member = factored.take(factored.slot_params(members), jnp.arange(1))
    carry, _ = factored.apply(jax.tree.map(lambda x: x[0], member), factored.initial_carry(), jnp.ones(4))
    assert carry.dtype == jnp.bfloat16
    stepped, _ = trainer.step(state, False, True)  # the rollout's while loop keeps the carry's type
    assert int(stepped.generation) == 1


def test_an_embedding_also_used_by_attend_falls_back_to_dense_noise_with_a_warning_naming_the_method():
    fns = PolicyFns(TiedEmbedding(), (3,))
    warning = r"params/Embed_0/embedding \[8, 5\] of layer Embed \(in TiedEmbedding\): also used by Embed.attend"
    with pytest.warns(UserWarning, match=warning):
        layout = jes.LowRank(1).layout(fns, fns.init(jax.random.key(0)))
    assert {leaf.path[1:]: leaf.factored for leaf in layout.leaves if len(leaf.shape) == 2} == {
        ("Dense_0", "kernel"): True, ("Embed_0", "embedding"): False}


def test_tied_weights_read_directly_fall_back_to_dense_noise_with_a_warning_naming_them():
    fns = PolicyFns(TiedDirect(), (3,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layout = jes.LowRank(1).layout(fns, fns.init(jax.random.key(0)))
    assert len(caught) == 1 and caught[0].category is perturbations.LowRankFallbackWarning
    for line in ("params/embed/embedding [8, 5] of layer Embed (in TiedDirect): also read outside the layer's call",
                 "params/enc/kernel [3, 5] of layer Dense (in TiedDirect): also read outside the layer's call"):
        assert line in str(caught[0].message)
    assert {leaf.path[1:]: leaf.factored for leaf in layout.leaves if len(leaf.shape) == 2} == {
        ("embed", "embedding"): False, ("enc", "kernel"): False, ("head", "kernel"): True}


def test_one_fallback_warning_names_every_leaf_its_layer_and_the_cell_around_it():
    fns = PolicyFns(RecurrentPolicy(cell="optimized_lstm"), (3,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layout = jes.LowRank(1).layout(fns, fns.init(jax.random.key(0)))
    assert len(caught) == 1 and caught[0].category is perturbations.LowRankFallbackWarning  # one, for all 8 leaves
    message = str(caught[0].message)
    assert message.startswith("LowRank: 8 matrix parameters of this policy get full-rank noise")
    # (a trial: the reason was the generic "not applied by a layer jes can factor"; now why, and what to use)
    assert message.count("of layer DenseParams (in OptimizedLSTMCell): a DenseParams kernel, which the module around "
                         "it applies itself\n") == 8  # the help follows the last
    assert message.endswith("\nOptimizedLSTMCell "
                            "(DenseParams' user in flax) concatenates its gates' kernels into one product; nn.LSTMCell "
                            "is the same cell with each gate a Dense, which jes factors.")
    assert [leaf.path[-1] for leaf in layout.factored] == ["kernel"]  # the head; the cell's 8 gate kernels fall back


def test_a_flax_nnx_policys_layers_fall_back_naming_nnx_and_what_low_rank_needs():
    """An nnx module (through nnx.bridge.ToLinen) calls its layers itself: its matrices fall back, said as nnx's,
    not with the generic reason and the list of linen layers it does not use."""
    from flax import nnx

    import policies_for_tests as mine

    fns = PolicyFns(nnx.bridge.ToLinen(mine.NnxMLP, args=(2,)), (4,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layout = jes.LowRank(1).layout(fns, fns.init(jax.random.key(0)))
    message = str(caught[0].message)
    assert len(caught) == 1 and caught[0].category is perturbations.LowRankFallbackWarning
    assert message.count("of layer ToLinen: a flax.nnx layer (inside nnx.bridge.ToLinen), which jes cannot factor\n") == 2
    assert "Write the policy's matrices as flax.linen layers" in message and "Layers jes can factor" not in message
    assert not layout.factored


class BiasOnly(nn.Module):
    @nn.compact
    def __call__(self, obs):
        return self.param("bias", nn.initializers.zeros, (2,)) + 0 * obs[:2]


def test_low_rank_on_a_policy_without_matrices_warns_that_it_is_full_rank():
    """Trial: a policy whose every parameter is a vector trained under LowRank without a word (the guide promises
    that a policy with no matrix jes can factor is told so)."""
    fns = PolicyFns(BiasOnly(), (4,))
    with pytest.warns(perturbations.LowRankWarning, match=r"LowRank\(rank=1\): this policy has no matrix parameter "
                      r"\(its only leaf is a vector or scalar: biases, scales\).*use jes.FullRank\(\)"):
        layout = jes.LowRank(1).layout(fns, fns.init(jax.random.key(0)))
    assert not layout.factored


def test_a_rank_no_smaller_than_every_factored_matrix_warns_that_full_rank_would_do():
    fns = PolicyFns(jes.MLPPolicy((8,), num_outputs=2), (4,))  # kernels 4x8 (32 floats) and 8x2 (16)
    variables = fns.init(jax.random.key(0))
    with pytest.warns(perturbations.LowRankWarning, match=r"LowRank\(rank=3\): a member's factors of every matrix it "
                      r"factors \(params/Dense_0/kernel 4x8, params/head/kernel 8x2\) are no smaller than the matrix.*"
                      r"use jes.FullRank\(\) \(jes train: --perturbation full_rank\), or a rank below 3 \(--rank 2\)$"):  # r = 3: 36 and 30 floats
        jes.LowRank(3).layout(fns, variables)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(jes.LowRank(2).layout(fns, variables).factored) == 2  # r = 2: 24 floats of the 4x8: no warning
    assert issubclass(perturbations.LowRankFallbackWarning, perturbations.LowRankWarning)
    linear = PolicyFns(jes.MLPPolicy((), num_outputs=1), (4,))  # one 4x1 kernel: no rank gains on it
    with pytest.warns(perturbations.LowRankWarning, match=r"params/head/kernel 4x1\).*use jes.FullRank\(\) \(jes train: --perturbation full_rank\)$"):
        jes.LowRank(1).layout(linear, linear.init(jax.random.key(0)))


def test_a_rank_above_both_sides_of_every_factored_matrix_is_refused_before_anything_compiles():
    """A new user's ``--rank 100000`` on a 353-parameter MLP was only warned about, then compiled for 12 minutes: a
    rank larger than every matrix on both sides is refused, naming the largest and what to use; up to it, warned."""
    fns = PolicyFns(jes.MLPPolicy((16, 16), num_outputs=1), (3,))  # kernels 3x16, 16x16, 16x1
    variables = fns.init(jax.random.key(0))
    for rank in (17, 100000):
        with pytest.raises(ValueError, match=rf"LowRank\(rank={rank}\) is larger than both sides of every matrix this "
                           r"policy's perturbation factors \(the largest: params/Dense_1/kernel 16x16, whose products "
                           r"have rank 16 at most\).*Use jes.FullRank\(\) \(jes train: --perturbation full_rank\), or a "
                           r"rank below 8, where the factors are smaller than a matrix \(--rank 7\)$"):
            jes.LowRank(rank).layout(fns, variables)
    with pytest.warns(perturbations.LowRankWarning, match=r"LowRank\(rank=16\): a member's factors"):
        assert len(jes.LowRank(16).layout(fns, variables).factored) == 3
    with pytest.raises(ValueError, match=r"LowRank\(rank=5\) is larger .* 3x4, whose products have rank 3"):
        jes.Trainer(jes.MLPPolicy((4,)), "Pendulum-v1", "adam", jes.ESConfig(num_members=8, perturbation=jes.LowRank(5)))
    linear = PolicyFns(jes.MLPPolicy((), num_outputs=1), (4,))  # one 4x1 kernel: no rank is cheaper than it
    with pytest.raises(ValueError, match=r"rank 1 at most\).*Use jes.FullRank\(\) \(jes train: --perturbation full_rank\)$"):
        jes.LowRank(5).layout(linear, linear.init(jax.random.key(0)))


def test_a_policy_with_no_factorable_matrix_is_told_that_full_rank_is_what_it_gets():
    class AllRaw(nn.Module):
        num_outputs: int = 1

        @nn.compact
        def __call__(self, x):
            return x @ self.param("w", nn.initializers.normal(), (x.shape[-1], self.num_outputs))

    fns = PolicyFns(AllRaw(), (3,))
    with pytest.warns(perturbations.LowRankFallbackWarning, match=r"(?s)params/w \[3, 1\] of layer AllRaw.*\nNo matrix "
                      r"of this policy is factored: every member is materialised, as with full rank; use "
                      r"jes.FullRank\(\) \(jes train: --perturbation full_rank\), or layers jes can factor.$"):
        jes.LowRank(1).layout(fns, fns.init(jax.random.key(0)))


class _ScannedBlock(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        return nn.tanh(nn.Dense(8)(x)), None


class ScannedLayers(nn.Module):
    """Three Dense layers stacked by ``nn.scan``: each call applies an [8, 8] slice of a [3, 8, 8] kernel."""

    num_outputs: int = 2

    @nn.compact
    def __call__(self, obs):
        x = nn.Dense(8)(obs)
        x, _ = nn.scan(_ScannedBlock, variable_axes={"params": 0}, split_rngs={"params": True}, length=3)()(x, None)
        return nn.Dense(self.num_outputs)(x)


def test_a_kernel_stacked_by_nn_scan_falls_back_to_dense_noise_and_the_run_trains():
    fns = PolicyFns(ScannedLayers(), (4,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layout = jes.LowRank(1).layout(fns, fns.init(jax.random.key(0)))
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "/Dense_0/kernel [3, 8, 8]" in messages[0] \
        and "slices of shape [8, 8]" in messages[0] and "nn.scan" in messages[0], messages  # the stacked bias is quiet
    assert caught[0].filename == __file__  # the warning names the caller's line, not one inside jes
    assert [(leaf.shape, leaf.factored) for leaf in layout.leaves if leaf.path[-1] == "kernel"] == [
        ((4, 8), True), ((8, 2), True), ((3, 8, 8), False)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = jes.train(ScannedLayers(), "CartPole-v1", "adam", perturbation=jes.LowRank(1), num_members=16,
                           num_generations=2, eval_episodes=2, log_dir=None, checkpoint_path=None, progress=False)
    assert np.isfinite(result.history["pop_mean"]).all()


def test_factors_are_a_pure_function_of_key_generation_and_member():
    policy, obs_shape = POLICIES["mlp (Dense)"]
    fns, flat, unravel, lowrank, layout = setup(policy, obs_shape, 2)
    ctx, sigma = Ctx(layout), jnp.float32(0.1)
    gen_key = noise.generation_key(jax.random.key(3), 5)
    whole = lowrank.members(ctx, flat, sigma, gen_key, jnp.int32(0), 8)
    halves = [lowrank.members(ctx, flat, sigma, gen_key, jnp.int32(s), 4) for s in (0, 4)]
    for leaf_whole, *leaf_halves in zip(jax.tree.leaves(whole), *map(jax.tree.leaves, halves)):
        assert np.array_equal(np.asarray(leaf_whole), np.concatenate([np.asarray(h) for h in leaf_halves]))
    again = lowrank.members(ctx, flat, sigma, gen_key, jnp.int32(0), 8)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(again)))
    other = lowrank.members(ctx, flat, sigma, noise.generation_key(jax.random.key(3), 6), jnp.int32(0), 8)
    assert not np.array_equal(np.asarray(whole["b"][0]), np.asarray(other["b"][0]))
    # Mirrored pairs share one draw (4 draws for 8 members) with opposite sign: A and the dense noise flip, B does not.
    assert whole["a"][0].shape[0] == 4 and whole["sign"].tolist() == [1, -1] * 4
    factored = lowrank.member_fns(fns, unravel, flat, layout)
    own = factored.take(whole, jnp.arange(8))
    assert np.array_equal(np.asarray(own["a"][0][0]), -np.asarray(own["a"][0][1]))
    assert np.array_equal(np.asarray(own["b"][0][0]), np.asarray(own["b"][0][1]))
    centre, eps = np.asarray(factored.centre_dense[0]), np.asarray(whole["noise"][0][0])
    assert np.array_equal(np.asarray(own["dense"][0][0]), centre + eps)
    assert np.array_equal(np.asarray(own["dense"][0][1]), centre - eps)


def test_an_antithetic_pair_with_equal_fitness_gives_no_update():
    policy, obs_shape = POLICIES["gru torch layout (matvec)"]
    fns, flat, unravel, lowrank, layout = setup(policy, obs_shape, 1)
    weights = jnp.array([0.7, 0.7, -0.2, -0.2, 1.5, 1.5], jnp.float32)
    update = lowrank.weighted_noise(Ctx(layout), jax.random.key(0), jnp.int32(0), weights)
    assert update.shape == flat.shape and not np.any(np.asarray(update))


def test_the_weighted_sum_is_sum_w_E_and_accumulates_a_rank_above_r():
    policy, obs_shape = POLICIES["mlp (Dense)"]
    fns, flat, unravel, lowrank, layout = setup(policy, obs_shape, 1)
    ctx, gen_key = Ctx(layout), jax.random.key(9)
    weights = jax.random.normal(jax.random.key(4), (16,))
    update = np.asarray(lowrank.weighted_noise(ctx, gen_key, jnp.int32(0), weights))
    by_member = sum(float(weights[i]) * np.asarray(lowrank.member_noise(ctx, gen_key, jnp.int32(i))) for i in range(16))
    np.testing.assert_allclose(update, by_member, rtol=1e-4, atol=1e-5)
    kernel = next(leaf for leaf in layout.factored if leaf.shape == (8, 8))
    matrix = update[kernel.offset: kernel.offset + kernel.size].reshape(8, 8)
    assert np.linalg.matrix_rank(matrix) > 1
    one = np.asarray(lowrank.member_noise(ctx, gen_key, jnp.int32(0)))[kernel.offset: kernel.offset + kernel.size]
    assert np.linalg.matrix_rank(one.reshape(8, 8)) == 1  # each member's perturbation is rank r = 1


def test_a_chunk_of_members_holds_factors_never_a_dense_population():
    """O(C r (m + n)) perturbation floats per chunk for an MLP 256x256 (P ~ 67k), never C x P: one draw per
    mirrored pair (C / 2 of them) and a sign per member."""
    trainer = jes.Trainer(jes.MLPPolicy((256, 256)), "Pendulum-v1", "adam",
                          jes.ESConfig(num_members=64, perturbation="low_rank", perturbation_rank=2))
    state = jax.eval_shape(lambda: trainer.init_state(0))
    members, _, _ = jax.eval_shape(trainer.sample_chunk, state, jnp.int32(0))
    floats = sum(math.prod(x.shape) for x in jax.tree.leaves(members))
    C, P = trainer.chunk_size, trainer.num_params
    assert P > 60_000 and floats < C * P / 20
    factored = sum(leaf.rows + leaf.cols for leaf in trainer.ctx.layout.factored)
    assert floats == C // 2 * (2 * factored + trainer.ctx.layout.dense_size) + C


@pytest.mark.parametrize("hidden, rank, members, chunk", [
    (64, 4, 4096, 2048),  # 1,169 floats a member: 2,048 of them hold 9.6 MB of draws
    (256, 1, 4096, 2048),  # 1,541 floats: 12.6 MB
    (256, 4, 4096, 512),  # 4,625 floats: 2,048 would hold 38 MB, 512 hold 9.5 MB
    (1024, 4, 4096, 512),  # 18,449 floats: never below 512 members (the shared GEMM's rows)
    (256, 4, 300, 300),  # a population below the cap is one chunk
])
def test_a_low_rank_chunk_holds_up_to_2048_members_and_about_16_mb_of_draws(hidden, rank, members, chunk):
    trainer = jes.Trainer(jes.MLPPolicy((hidden, hidden)), "Pendulum-v1", "adam",
                          jes.ESConfig(num_members=members, perturbation=jes.LowRank(rank)))
    assert trainer.chunk_size == chunk
    assert trainer.num_chunks == -(-members // chunk)


def test_a_low_rank_chunk_of_unfactorable_leaves_is_bounded_by_its_floats():
    dense = low_rank.Layout(leaves=(low_rank.Leaf(path=("w",), shape=(1024, 1024), offset=0, size=2 ** 20, factored=False),), rank=1)
    assert dense.draw_size == 2 ** 20 and jes.LowRank(1).default_chunk_size(dense) == 64  # 256 MiB of draws
    assert jes.LowRank(1).default_chunk_size(low_rank.Layout(leaves=(), rank=1)) == 2048


def test_strategies_with_per_parameter_sigmas_refuse_low_rank_naming_the_ones_that_take_it():
    for name, keeps in (("pgpe", "a sigma per parameter"), ("snes", "a sigma per parameter"),
                        ("sep_cma_es", "a sigma per parameter"), ("cma_es", "a full covariance matrix")):
        with pytest.raises(ValueError, match=f"{name} keeps {keeps}.*openai_es or ars"):
            jes.Trainer(jes.MLPPolicy((4,)), "CartPole-v1", None,
                        jes.ESConfig(num_members=8, perturbation="low_rank"), strategy=name)
    one_sigma = [n for n in jes.strategies.names() if jes.strategies.get(n).isotropic]
    assert one_sigma == ["openai_es", "ars"]  # the names ESConfig's message gives without importing strategies
    with pytest.raises(ValueError, match="perturbation_rank=4 is the rank of low-rank perturbations.*'full_rank'.*"
                                         "with strategy openai_es or ars"):
        jes.ESConfig(perturbation_rank=4)
    with pytest.raises(ValueError, match="unknown perturbation"):
        jes.ESConfig(perturbation="sparse")
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        jes.LowRank(0)
    config = jes.ESConfig(perturbation=jes.LowRank(4))
    assert (config.perturbation, config.perturbation_rank) == ("low_rank", 4)
    assert perturbations.get(config.perturbation, config.perturbation_rank) == jes.LowRank(4)
    assert perturbations.get("low_rank") == jes.LowRank(1) and perturbations.get("full_rank", 1) == jes.FullRank()
    with pytest.raises(ValueError, match="rank=4 is the rank of low-rank perturbations, but the name is 'full_rank'"):
        perturbations.get("full_rank", rank=4)
    with pytest.raises(ValueError, match=r"rank=4\): the object's rank is 2; give the rank once"):
        perturbations.get(jes.LowRank(2), rank=4)
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        perturbations.get("low_rank", rank=0)


def test_a_rank_given_twice_must_agree_and_a_replaced_perturbation_brings_its_own_rank():
    with pytest.raises(ValueError, match=r"LowRank\(rank=3\) has rank 3, but perturbation_rank=2: give the rank once"):
        jes.ESConfig(perturbation=jes.LowRank(3), perturbation_rank=2)
    assert jes.ESConfig(perturbation=jes.LowRank(3), perturbation_rank=3).perturbation_rank == 3
    low4 = jes.ESConfig(perturbation="low_rank", perturbation_rank=4)
    assert low4.replace(perturbation=jes.LowRank(2)).perturbation_rank == 2  # train(perturbation=...) overrides
    for full in (jes.FullRank(), "full_rank"):  # full rank has no rank: switching to it drops it, by object or name
        assert (low4.replace(perturbation=full).perturbation, low4.replace(perturbation=full).perturbation_rank) \
            == ("full_rank", 1)
    assert low4.replace(perturbation="low_rank").perturbation_rank == 4
    for cls in (jes.LowRank, jes.FullRank):  # the class without parentheses: it read as rank 1
        with pytest.raises(ValueError, match=rf"perturbation={cls.__name__} is the class; pass an instance"):
            jes.ESConfig(perturbation=cls)
        with pytest.raises(ValueError, match="is the class"):
            low4.replace(perturbation=cls)


def test_numpy_integers_are_taken_as_ranks_and_counts_and_stored_as_ints():
    config = jes.ESConfig(num_members=np.int64(32), perturbation="low_rank", perturbation_rank=np.int32(2))
    assert (type(config.num_members), type(config.perturbation_rank)) == (int, int)
    assert type(jes.LowRank(np.int64(3)).rank) is int and jes.LowRank(np.int64(3)) == jes.LowRank(3)
    for bad in (True, 1.5, "2", np.float32(2.0)):
        with pytest.raises(ValueError, match="must be a positive integer"):
            jes.LowRank(bad)


def test_a_checkpoint_keeps_the_chunk_its_run_evaluated_when_the_default_changes(tmp_path, monkeypatch):
    """A run with the default chunk (``chunk_size=None``) resumed by a jes whose default for that policy differs:
    refused naming the chunk to give; given, the resumed run is the uninterrupted one's bits; rebuilt from the file
    alone (``jes.checkpoint.load``, ``jes eval``) it gets its own chunk."""
    kwargs = dict(key=4, log_dir=None, progress=False, num_members=16, eval_episodes=2, perturbation=jes.LowRank(2))
    policy = jes.MLPPolicy((8, 8))
    monkeypatch.setattr(low_rank, "CHUNK_SIZE", 8)  # the default that wrote the file
    full = jes.train(policy, "Pendulum-v1", "adam", num_generations=4, checkpoint_path=None, **kwargs)
    path = str(tmp_path / "half.ckpt")
    jes.train(policy, "Pendulum-v1", "adam", num_generations=2, checkpoint_path=path, **kwargs)
    assert jes.checkpoint.read(path).meta["chunk_size"] == 8
    monkeypatch.undo()  # today's default: one chunk of 16
    with pytest.raises(jes.checkpoint.CheckpointError, match=r"evaluated 8 members a chunk, this run 16 .*chunk_size=8"):
        jes.train(policy, "Pendulum-v1", "adam", num_generations=4, resume=path, checkpoint_path=None, **kwargs)
    resumed = jes.train(policy, "Pendulum-v1", "adam", num_generations=4, resume=path, checkpoint_path=None,
                        chunk_size=8, **kwargs)
    assert np.array_equal(resumed.flat_params, full.flat_params)
    trainer, _, _ = jes.checkpoint.load(path)
    assert trainer.chunk_size == 8


def test_a_checkpoint_from_before_jes_recorded_its_chunk_keeps_the_default_of_its_jes(tmp_path, monkeypatch):
    """A low-rank file without a recorded chunk, its config's chunk_size None: the default of the jes that wrote it
    (``checkpoint._OLD_LOW_RANK_CHUNK``; here a stand-in of 8 members) is the chunk it ran, not today's."""
    import test_checkpoint

    kwargs = dict(key=4, log_dir=None, progress=False, num_members=16, eval_episodes=2, perturbation=jes.LowRank(2))
    policy = jes.MLPPolicy((8, 8))
    with monkeypatch.context() as patch:
        patch.setattr(low_rank, "CHUNK_SIZE", 8)
        full = jes.train(policy, "Pendulum-v1", "adam", num_generations=3, checkpoint_path=None, **kwargs)
        path = str(tmp_path / "new.ckpt")
        jes.train(policy, "Pendulum-v1", "adam", num_generations=2, checkpoint_path=path, **kwargs)
    old = test_checkpoint._rewrite_meta(path, str(tmp_path / "old.ckpt"), lambda meta: meta.pop("chunk_size"))
    monkeypatch.setattr(jes.checkpoint, "_OLD_LOW_RANK_CHUNK", (8, 2 ** 26))
    with pytest.raises(jes.checkpoint.CheckpointError, match=r"evaluated 8 members a chunk, this run 16 .*chunk_size=8"):
        jes.train(policy, "Pendulum-v1", "adam", num_generations=3, resume=old, checkpoint_path=None, **kwargs)
    resumed = jes.train(policy, "Pendulum-v1", "adam", num_generations=3, resume=old, checkpoint_path=None,
                        chunk_size=8, **kwargs)
    assert np.array_equal(resumed.flat_params, full.flat_params)
    assert jes.checkpoint.load(old)[0].chunk_size == 8
    monkeypatch.setattr(jes.checkpoint, "_OLD_LOW_RANK_CHUNK", (2048, 2 ** 26))  # a default that was today's
    assert jes.checkpoint.load(old)[0].chunk_size == 16


@pytest.mark.parametrize("chunk, config", [(2 ** 15, {}), (7, {}), (8, {"chunk_size": 4})])
def test_a_recorded_chunk_that_does_not_fit_the_files_config_is_refused(chunk, config, tmp_path):
    import test_checkpoint

    path = str(tmp_path / "run.ckpt")
    jes.train(jes.MLPPolicy((4,)), "Pendulum-v1", "adam", key=1, num_generations=1, num_members=16, eval_episodes=2,
              perturbation=jes.LowRank(1), log_dir=None, progress=False, checkpoint_path=path)
    edited = test_checkpoint._rewrite_meta(path, str(tmp_path / "edited.ckpt"),
                                           lambda meta: (meta.update(chunk_size=chunk), meta["config"].update(config)))
    with pytest.raises(jes.checkpoint.CheckpointError, match=f"inconsistent: it records chunks of {chunk} members"):
        jes.checkpoint.read(edited)


def test_a_low_rank_run_interrupted_and_resumed_is_bit_identical(tmp_path):
    kwargs = dict(key=4, log_dir=None, progress=False, num_members=16, chunk_size=8, eval_episodes=2,
                  perturbation=jes.LowRank(2))
    policy = jes.MLPPolicy((8, 8))
    full = jes.train(policy, "Pendulum-v1", "adam", num_generations=4, checkpoint_path=None, **kwargs)
    path = str(tmp_path / "half.ckpt")
    jes.train(policy, "Pendulum-v1", "adam", num_generations=2, checkpoint_path=path, **kwargs)
    resumed = jes.train(policy, "Pendulum-v1", "adam", num_generations=4, resume=path, checkpoint_path=None, **kwargs)
    assert np.array_equal(resumed.flat_params, full.flat_params)
    assert np.array_equal(resumed.history["pop_mean"], full.history["pop_mean"])
    assert jes.checkpoint.read(path).meta["config"]["perturbation"] == "low_rank"


class WarnsWhenTraced(nn.Module):
    """An MLP (kernels 3x4 and 4x1 on Pendulum) whose call warns, as a library's deprecation would."""

    num_outputs: int = 1

    @nn.compact
    def __call__(self, x):
        warnings.warn("WarnsWhenTraced: a field of this policy is deprecated", FutureWarning)
        return nn.Dense(self.num_outputs)(nn.tanh(nn.Dense(4)(x)))


def test_a_resume_refused_for_another_rank_says_only_why(tmp_path):
    """Trial: ``jes train --resume CKPT --rank 8`` printed the rebuilt policy's "no smaller than the matrix" warning
    before refusing the checkpoint of a rank-1 run, as if the rank's size were the problem; a resume that passes the
    check still gives the warning. Other warnings of the rebuilt run are given as they come, refused or not (a
    review: holding every warning back until the check lost them where it refused)."""
    kwargs = dict(key=0, log_dir=None, progress=False, num_members=8, chunk_size=8, eval_episodes=1)
    policy = WarnsWhenTraced()  # kernels 3x4 and 4x1
    path = str(tmp_path / "r1.ckpt")
    jes.train(policy, "Pendulum-v1", "adam", num_generations=1, checkpoint_path=path, perturbation=jes.LowRank(1),
              **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(jes.checkpoint.CheckpointError, match=r"checkpoint has 'low_rank' \(rank 1\), this run has "
                           r"'low_rank' \(rank 2\)"):
            jes.train(policy, "Pendulum-v1", "adam", num_generations=2, resume=path, checkpoint_path=None,
                      perturbation=jes.LowRank(2), **kwargs)
    assert not [w for w in caught if issubclass(w.category, perturbations.LowRankWarning)]
    assert [w for w in caught if "a field of this policy is deprecated" in str(w.message)]
    wide = str(tmp_path / "r2.ckpt")
    with pytest.warns(perturbations.LowRankWarning, match=r"LowRank\(rank=2\): a member's factors"):
        jes.train(policy, "Pendulum-v1", "adam", num_generations=1, checkpoint_path=wide, perturbation=jes.LowRank(2),
                  **kwargs)
    with pytest.warns(perturbations.LowRankWarning, match=r"LowRank\(rank=2\): a member's factors"):
        jes.train(policy, "Pendulum-v1", "adam", num_generations=2, resume=wide, checkpoint_path=None,
                  perturbation=jes.LowRank(2), **kwargs)


@pytest.mark.hard_timeout(300)
def test_a_low_rank_run_without_mirrored_pairs_matches_its_materialised_members_and_trains():
    policy, obs_shape = POLICIES["mlp (Dense)"]
    fns, flat, unravel, lowrank, layout = setup(policy, obs_shape, 2)
    ctx, sigma, gen_key = Ctx(layout, antithetic=False), jnp.float32(0.2), jax.random.key(5)
    members = lowrank.members(ctx, flat, sigma, gen_key, jnp.int32(0), 4)
    factored = lowrank.member_fns(fns, unravel, flat, layout)
    obs = jax.random.normal(jax.random.key(2), obs_shape)
    outs = []
    for i in range(4):
        dense = flat + sigma * lowrank.member_noise(ctx, gen_key, jnp.int32(i))
        want = fns.apply(unravel(dense), fns.initial_carry(), obs)[1]
        own = factored.take(factored.slot_params(members), jnp.array([i]))
        got = factored.apply(jax.tree.map(lambda x: x[0], own), fns.initial_carry(), obs)[1]
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)
        outs.append(np.asarray(got))
    assert not np.allclose(outs[0], outs[1])  # no mirrored pairs: member 1 is not member 0 flipped
    weights = jax.random.normal(jax.random.key(4), (4,))
    by_member = sum(float(weights[i]) * np.asarray(lowrank.member_noise(ctx, gen_key, jnp.int32(i))) for i in range(4))
    np.testing.assert_allclose(np.asarray(lowrank.weighted_noise(ctx, gen_key, jnp.int32(0), weights)), by_member,
                               rtol=1e-4, atol=1e-5)
    result = jes.train(jes.MLPPolicy((8,)), "CartPole-v1", "adam", key=1, num_generations=3, num_members=32,
                       antithetic=False, perturbation=jes.LowRank(1), log_dir=None, progress=False, eval_episodes=4)
    assert np.all(np.isfinite(result.flat_params)) and len(result.history["pop_mean"]) == 3


class ConvOverObs(nn.Module):
    """A 1-D Conv over Pendulum's observation, then a head: a policy with a factored Conv layer."""

    num_outputs: int = 1

    @nn.compact
    def __call__(self, obs):
        x = nn.relu(nn.Conv(4, (2,), padding="SAME")(obs.astype(jnp.float32)[:, None]))
        return nn.Dense(self.num_outputs)(x.reshape(-1))


@pytest.mark.parametrize("policy, rank, newer", [("mlp", 1, True), ("mlp", 4, True), ("conv", 1, False),
                                                 ("conv", 4, True)])
def test_the_step_compiles_with_the_fusion_emitters_its_layers_and_rank_want(policy, rank, newer):
    """The step keeps XLA:CPU's default (newer) fusion emitters from rank 3 (its batched products run faster there)
    and at any rank without a factored Conv layer (their tanh is faster); a Conv policy below rank 3 gets jes's older
    ones. The options are part of the program's cache key (they can change bits: tests/test_distributed.py checks
    that a master's and workers' programs use the step's)."""
    module = jes.MLPPolicy((16, 16)) if policy == "mlp" else ConvOverObs()
    trainer = jes.Trainer(module, "Pendulum-v1", "adam",
                          jes.ESConfig(num_members=16, eval_episodes=2, max_episode_steps=30, perturbation=jes.LowRank(rank)))
    options = jes.cpu.compiler_options(fusion_emitters=newer, tree_reductions=False)
    older_exist = jes.cpu._knows_option(jes.cpu.OLDER_EMITTERS_OPTION, False)   # jaxlib 0.11 dropped them
    assert ("xla_cpu_use_fusion_emitters" in options) == (not newer and older_exist)
    assert "tree_reduction_rewriter" in options["xla_disable_hlo_passes"].split(",")  # x A one fused loop
    assert trainer.step_compiler_options == options
    if policy == "mlp":  # a module of a test file has no cache key (program_parts is None)
        assert trainer.program_parts()["compiler_options"] == options
    state, _ = trainer.step(trainer.init_state(3), jnp.bool_(True), jnp.bool_(True))
    assert int(state.generation) == 1


class _ConvThenDense(nn.Module):
    """Matrices only (no biases): a member differs from the centre by its corrections alone."""

    @nn.compact
    def __call__(self, obs):
        x = nn.relu(nn.Conv(4, (3, 3), padding="VALID", use_bias=False)(obs))
        return nn.Dense(2, use_bias=False)(x.reshape(-1))


def _inference_ratio_module(monkeypatch):
    """benchmarks/inference_ratio.py, imported for a test (removed from sys.modules after it)."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "inference_ratio.py")
    spec = importlib.util.spec_from_file_location("inference_ratio_under_test", path)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(__import__("sys").modules, spec.name, bench)  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    return bench


def test_the_benchmarks_skip_corrections_diagnostic_leaves_out_the_named_layers_corrections_only(monkeypatch):
    bench = _inference_ratio_module(monkeypatch)
    monkeypatch.setattr(low_rank, "_correction", low_rank._correction)  # restored after the test
    fns, flat, unravel, lowrank, layout = setup(_ConvThenDense(), (6, 6, 3), 1)
    ctx, sigma, gen_key = Ctx(layout), jnp.float32(0.3), jax.random.key(7)
    obs = jax.random.normal(jax.random.key(2), (6, 6, 3))
    centre = np.asarray(fns.apply(unravel(flat), fns.initial_carry(), obs)[1])

    def member_outputs():  # traced afresh: the corrections are chosen when the forward is traced
        members = lowrank.members(ctx, flat, sigma, gen_key, jnp.int32(0), 4)
        factored = lowrank.member_fns(fns, unravel, flat, layout)
        own = factored.take(factored.slot_params(members), jnp.arange(4))
        return [np.asarray(factored.apply(jax.tree.map(lambda x: x[i], own), fns.initial_carry(), obs)[1])
                for i in range(4)]

    assert all(not np.allclose(out, centre) for out in member_outputs())
    bench.skip_corrections(["dense", "embed"])  # the Conv's corrections stay: members still differ from the centre
    assert all(not np.allclose(out, centre) for out in member_outputs())
    assert bench.LEFT_OUT == {"dense"}  # what the run's table then says was not left out: no Embed here
    bench.skip_corrections(["conv"])  # now neither layer is corrected: every member is the centre, bit for bit
    assert all(np.array_equal(out, centre) for out in member_outputs())
    assert bench.LEFT_OUT == {"dense", "conv"}
    argument_error = __import__("argparse").ArgumentTypeError
    with pytest.raises(argument_error, match="conv, dense, embed"):
        bench.layer_names_arg("conv,lstm")
    with pytest.raises(argument_error, match="pendulum, minatar"):
        bench.env_names_arg("pendulum,atari")


def test_the_benchmarks_fixed_length_envs_run_every_episode_to_its_time_limit(monkeypatch):
    bench = _inference_ratio_module(monkeypatch)
    steps = {}
    for name, env in (("own", "Breakout-MinAtar"), ("fixed", bench.fixed_length("Breakout-MinAtar"))):
        config = jes.ESConfig(num_members=8, eval_episodes=2, max_episode_steps=40, normalize_observations=False,
                              perturbation=jes.LowRank(1))
        trainer = jes.Trainer(jes.MLPPolicy((4,)), env, "adam", config)
        _, metrics = trainer.step(trainer.init_state(0), jnp.bool_(False), jnp.bool_(True))
        steps[name] = (int(metrics["env_steps"]), trainer.spec.fixed_length)
    # A new policy loses Breakout's ball within some 6-28 steps; with the termination left out, all 40 are played
    assert steps["fixed"] == (8 * 40, True) and steps["own"][0] < 8 * 40 and not steps["own"][1]


def test_the_parity_benchmarks_stats_compare_each_perturbation_with_full_rank_seed_by_seed(tmp_path, monkeypatch, capsys):
    import importlib.util
    import os
    import sys
    benchmarks = os.path.join(os.path.dirname(__file__), "..", "benchmarks")
    monkeypatch.syspath_prepend(benchmarks)
    spec = importlib.util.spec_from_file_location("lowrank_parity_under_test", os.path.join(benchmarks, "lowrank_parity.py"))
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)
    spec.loader.exec_module(bench)
    full, low = tmp_path / "full.txt", tmp_path / "low.txt"
    full.write_text("".join(f"  mycell full rank seed {s}: solved at {g}, centre 1.0\n" for s, g in
                            enumerate([10, 20, 30, 40, None, 7])))  # seed 5: full rank only, left out
    low.write_text("noise\n" + "".join(f"  mycell r=1 seed {s}: solved at {g}, centre 1.0\n" for s, g in
                                       enumerate([30, None, None, 40, None]))
                   + "  other r=1 seed 0: solved at 5, centre 1.0\n  other full rank seed 9: solved at 5, centre 1.0\n")
    bench.stats([str(full), str(low)], draws=200)
    out = capsys.readouterr().out.splitlines()
    # Each perturbation's row over every seed its lines gave, whichever files they came from
    assert "| mycell | full rank | 0-5 | 5/6 | 20 (7-40) | 1.0 +- 0.0 |" in out
    assert "| mycell | r=1 | 0-4 | 2/5 | 35 (30-40) | 1.0 +- 0.0 |" in out and "| other | r=1 | 0-0 | 1/1 | 5 (5-5) | 1.0 +- 0.0 |" in out
    row = [line for line in out if line.startswith("| mycell | r=1 | 0-4 | 2/5 (")]
    # seeds 0-4: r = 1 solved 2 (30, 40: median 35), full rank 4 (median 25): 1.40; per seed 3.0 and 1.0;
    # Fisher's exact test on [[2, 3], [4, 1]]: p = 0.52; paired, only full rank solved seeds 1 and 2, r = 1 none
    # alone: McNemar's exact p = 2 * 0.5 ** 2 = 0.50. Resamples where r = 1 solved none are counted, not hidden.
    assert len(row) == 1 and row[0].startswith("| mycell | r=1 | 0-4 | 2/5 (4/5) | 0.52 | 0 / 2: 0.50 | 35 (25) | 1.40 [")
    assert row[0].endswith("draws left out: a side solved none | 2.00 (2) |")
    low_bound, high_bound = (float(v) for v in row[0].split("[")[1].split("]")[0].split(", ")[:2])
    assert 0.25 <= low_bound < 1.40 < high_bound <= 4.0  # ratios the resampled medians can take
    assert "| other | r=1 | no seeds in common with full rank |" in "\n".join(out)
    (tmp_path / "empty.txt").write_text("no seeds here\n")
    with pytest.raises(SystemExit, match="no per-seed lines"):
        bench.stats([str(tmp_path / "empty.txt")])
    (tmp_path / "again.txt").write_text("  mycell r=1 seed 0: solved at 31, centre 1.0\n")
    with pytest.raises(SystemExit, match="seed 0 appears twice with other results"):
        bench.stats([str(low), str(tmp_path / "again.txt")])


X64_TRAIN = """
import jax, numpy as np, jes
assert jax.config.jax_enable_x64
for perturbation in ("low_rank", "full_rank"):
    r = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", num_members=8, num_generations=2, eval_episodes=2,
                  max_episode_steps=20, perturbation=perturbation, perturbation_rank=1, log_dir=None, progress=False)
    assert np.isfinite(r.flat_params).all() and np.isfinite(r.history["centre_return"][-1]), r.history
    print(perturbation, "trained")
"""


def test_low_rank_trains_in_jax_x64_mode():
    """In x64 mode a centre's summed steps were int64 while the step's other branch gave int32: the generation's
    cond refused to trace ("cond branches must have equal output types"). x64 cannot be turned on and off safely
    mid-suite, so a process of its own runs it."""
    env = dict(os.environ, JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", X64_TRAIN], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["low_rank", "trained", "full_rank", "trained"], out.stdout
