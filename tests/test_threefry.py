"""jes.threefry: programs lowered with threefry unrolled give the bits of JAX's rolled CPU lowering."""
import jax
import jax.numpy as jnp
import numpy as np

import jes.cpu
from jes.threefry import UnrolledJit, export_unrolled, lower_unrolled


def draws(key_data, start):
    """A population's draws as jes makes them: a key per member folded in, a normal vector each."""
    key = jax.random.wrap_key_data(key_data)
    members = start + jnp.arange(16, dtype=jnp.int32)
    return jax.vmap(lambda m: jax.random.normal(jax.random.fold_in(key, m), (300,)))(members)


ARGS = (jax.random.key_data(jax.random.key(11)), jnp.int32(5))


def test_a_program_lowered_unrolled_has_no_rolled_hash_loops_and_the_same_bits():
    lowered, applied = lower_unrolled(jax.jit(draws), *ARGS)
    assert applied
    unrolled, rolled = lowered.compile(), jax.jit(draws).lower(*ARGS).compile()
    assert unrolled.as_text().count(" while(") < rolled.as_text().count(" while(")
    assert np.asarray(unrolled(*ARGS)).tobytes() == np.asarray(rolled(*ARGS)).tobytes()


def test_an_exported_program_unrolled_gives_the_same_bits():
    exported, applied = export_unrolled(jax.jit(draws), *ARGS)
    assert applied
    assert np.asarray(exported.call(*ARGS)).tobytes() == np.asarray(jax.jit(draws)(*ARGS)).tobytes()


def test_unrolled_jit_compiles_once_per_signature_and_gives_jax_jits_bits():
    fn = UnrolledJit(draws)
    first = fn(*ARGS)
    assert np.asarray(first).tobytes() == np.asarray(jax.jit(draws)(*ARGS)).tobytes()
    other = (ARGS[0], jnp.int32(9))  # the same signature: no new program
    assert np.asarray(fn(*other)).tobytes() == np.asarray(jax.jit(draws)(*other)).tobytes()
    assert fn._cache_size() == 1
    fn(np.asarray(ARGS[0]), 5)  # numpy and a Python int (weakly typed): another signature
    assert fn._cache_size() == 2


def test_unrolled_jit_with_compiler_options_runs_alone_and_inside_another_program():
    """A program of a generation compiles with the step's XLA options; called inside another traced program it is
    part of that one (JAX refuses compiler_options on a nested jit)."""
    options = jes.cpu.compiler_options()   # the step's (None off the CPU); jax 0.11 has no older emitters to ask for
    draw = UnrolledJit(lambda key: jax.random.normal(key, (64,)).sum(), compiler_options=options)
    alone = draw(jax.random.key(3))
    inside = jax.jit(lambda key: draw(key) * 2.0)(jax.random.key(3))
    assert np.asarray(inside) == 2.0 * np.asarray(alone)
    assert draw._cache_size() == 1
