"""Policy classes of a module of the user's own (importable by name, not jes's registry), for the pickling tests."""
from typing import Callable

import flax.linen as nn
from flax import nnx
import jax.numpy as jnp


def swish(x):
    return x * nn.sigmoid(x)


class SwishPolicy(nn.Module):
    """A policy whose activation is a function of this module: a pickled one names both."""
    num_outputs: int = 2
    act: Callable = swish

    @nn.compact
    def __call__(self, obs):
        return nn.Dense(self.num_outputs)(self.act(nn.Dense(4)(obs)))


class AbsPolicy(SwishPolicy):
    """A policy whose activation is a builtin, which a policy file names but no loader builds (builtins is denied)."""
    act: Callable = abs


class EmbedPolicy(nn.Module):
    """A table of ``num`` rows looked up by an integer observation (a Discrete observation space's id)."""
    num: int = 16
    num_outputs: int = 4

    @nn.compact
    def __call__(self, obs):  # (Flax initialises it on float32 zeros: cast)
        return nn.Dense(self.num_outputs)(nn.Embed(self.num, 8)(obs.astype(jnp.int32)))


class NnxMLP(nnx.Module):
    """A flax.nnx policy (trained through ``nnx.bridge.ToLinen``): one hidden layer of ``features``, ``num_outputs``
    outputs."""

    def __init__(self, num_outputs: int, *, features: int = 8, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(4, features, rngs=rngs)
        self.head = nnx.Linear(features, num_outputs, rngs=rngs)

    def __call__(self, obs):
        return self.head(jnp.tanh(self.hidden(obs)))


class NnxRecurrent(nnx.Module):
    """A recurrent nnx module (initialize_carry, (carry, output)), which Flax's bridge cannot run for jes."""

    def __init__(self, num_outputs: int = 2, *, rngs: nnx.Rngs):
        self.cell = nnx.GRUCell(4, 3, rngs=rngs)
        self.head = nnx.Linear(3, num_outputs, rngs=rngs)

    def initialize_carry(self, rng, input_shape):
        return jnp.zeros(3)

    def __call__(self, carry, obs):
        carry, hidden = self.cell(carry, obs)
        return carry, self.head(hidden)


class NnxBatchNorm(NnxMLP):
    """An NnxMLP with an nnx.BatchNorm on its hidden layer, in training mode unless ``running``: its statistics'
    update Flax's bridge drops without a word, and each observation is normalised by itself (every output its bias)."""

    def __init__(self, num_outputs: int, *, running: bool = False, rngs: nnx.Rngs):
        super().__init__(num_outputs, rngs=rngs)
        self.norm = nnx.BatchNorm(num_outputs, use_running_average=running, rngs=rngs)

    def __call__(self, obs):
        return self.norm(super().__call__(obs))


class Calls(nnx.Variable):
    """A state variable of one's own: how many times the module was called."""


class NnxCounter(NnxMLP):
    """An NnxMLP that counts its calls in a variable of its own (an update Flax's bridge drops, changing no output)."""

    def __init__(self, num_outputs: int, *, rngs: nnx.Rngs):
        super().__init__(num_outputs, rngs=rngs)
        self.calls = Calls(jnp.zeros((), jnp.float32))

    def __call__(self, obs):
        self.calls.value += 1
        return super().__call__(obs)


class NnxDropout(NnxMLP):
    """An NnxMLP with nnx.Dropout, whose RNG stream jes does not give."""

    def __init__(self, num_outputs: int, *, rngs: nnx.Rngs):
        super().__init__(num_outputs, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, deterministic=True, rngs=rngs)

    def __call__(self, obs):
        return self.dropout(super().__call__(obs))
