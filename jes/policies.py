"""Flax policies for ES: a GRU (with a PyTorch-layout variant) and an MLP.

Policies see ONE observation (no batch axis); jes vmaps them over members and
episodes. Two call conventions are supported:

* feed-forward: ``out = module.apply(params, obs)``
* recurrent (Flax ``RNNCellBase`` convention): the module has
  ``initialize_carry(rng, input_shape)`` and ``carry, out = module.apply(params, carry, obs)``.

``out`` is the raw head output; :mod:`jes.envs` turns it into an action
(argmax for discrete spaces, a tanh squash into the bounds for boxes).
"""
from __future__ import annotations

import math
import sys
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def _torch_uniform(bound: float):
    """PyTorch's default init for RNN and Linear layers: U(-bound, bound)."""

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def _check_count(module: nn.Module, field: str, value: Any, what: str, optional: bool = False) -> None:
    """Raise unless ``value`` (``module``'s ``field``) is a positive integer (or ``None`` when ``optional``): a layer
    of 0 units failed deep inside the init (``1 / sqrt(0)``), and a float would run as its floor."""
    if optional and value is None:
        return
    name = type(module).__name__
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} {field} must be a positive integer ({what}), got {value!r}")
    if value < 1:
        raise ValueError(f"{name} {field} must be a positive integer ({what}), got {value!r}")


def matvec(self: nn.Module, name: str, weight: jax.Array, x: jax.Array) -> jax.Array:
    """``weight @ x`` for the matrix parameter ``name`` (``weight`` that parameter itself, ``[m, n]``; ``x`` ``[n]``).

    A layer of your own that applies a matrix parameter as a matrix-vector product makes this function its method,
    ``matvec = jes.policies.matvec``, and calls ``self.matvec("w", w, x)``: low-rank perturbations
    (:mod:`jes.perturbations`) then add each member's correction there without materialising its matrix. Only this
    function is factored so: a method of your own named ``matvec`` is not (jes could not know what it computes).
    """
    del self, name
    return weight @ x


class TorchGRUCell(nn.Module):
    """GRU cell with PyTorch's parameter layout (``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh``).

    Both bias sets are kept, as in ``torch.nn.GRU``, so parameter counts match
    PyTorch models exactly. Gate order is (reset, update, new), as in PyTorch.
    """

    features: int

    def __post_init__(self):
        _check_count(self, "features", self.features, "hidden units")
        super().__post_init__()

    @nn.compact
    def __call__(self, h: jax.Array, x: jax.Array) -> jax.Array:
        hidden = self.features
        init = _torch_uniform(1.0 / math.sqrt(hidden))
        w_ih = self.param("weight_ih", init, (3 * hidden, x.shape[-1]))
        w_hh = self.param("weight_hh", init, (3 * hidden, hidden))
        b_ih = self.param("bias_ih", init, (3 * hidden,))
        b_hh = self.param("bias_hh", init, (3 * hidden,))
        gi = self.matvec("weight_ih", w_ih, x) + b_ih
        gh = self.matvec("weight_hh", w_hh, h) + b_hh
        i_r, i_z, i_n = jnp.split(gi, 3)
        h_r, h_z, h_n = jnp.split(gh, 3)
        reset = jax.nn.sigmoid(i_r + h_r)
        update = jax.nn.sigmoid(i_z + h_z)
        new = jnp.tanh(i_n + reset * h_n)
        return (1.0 - update) * new + update * h

    matvec = matvec  # low-rank perturbations add each member's correction here (see matvec)


class TorchLinear(nn.Module):
    """Dense layer with PyTorch's default init, U(±1/sqrt(fan_in)) for weight and bias."""

    features: int

    def __post_init__(self):
        _check_count(self, "features", self.features, "output units")
        super().__post_init__()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        init = _torch_uniform(1.0 / math.sqrt(x.shape[-1]))
        weight = self.param("weight", init, (self.features, x.shape[-1]))
        bias = self.param("bias", init, (self.features,))
        return self.matvec("weight", weight, x) + bias

    matvec = matvec


class GRUPolicy(nn.Module):
    """Stacked GRU policy, the reference recurrent policy of jes.

    With ``torch_layout=True`` (default) it is the portable-es ``RNNClassifier``:
    PyTorch-layout GRU layers (both bias sets) and a linear head that reads the
    hidden states of *all* layers concatenated. Hidden 5 x 2 layers on CartPole
    (4 obs, 2 actions) has 367 parameters; hidden 5 x 3 layers on Acrobot
    (6 obs, 3 actions) has 603. With ``torch_layout=False`` it uses
    ``flax.linen.GRUCell`` and a head on the last layer only.

    Attributes:
        hidden: hidden units per layer.
        layers: number of stacked GRU layers.
        num_outputs: head size; ``None`` lets :func:`jes.train` fill it in from
            the environment's action space.
        torch_layout: PyTorch parameter layout and init (see above).
    """

    hidden: int = 5
    layers: int = 2
    num_outputs: int | None = None
    torch_layout: bool = True

    def __post_init__(self):  # at construction, so every entry point (jes train, a sweep, a checkpoint) says it
        _check_count(self, "hidden", self.hidden, "units per GRU layer")
        _check_count(self, "layers", self.layers, "stacked GRU layers; an MLPPolicy(hidden_sizes=()) is linear")
        _check_count(self, "num_outputs", self.num_outputs, "the head's size; None: set from the env", optional=True)
        super().__post_init__()

    @nn.nowrap
    def initialize_carry(self, rng: jax.Array, input_shape: tuple[int, ...]) -> jax.Array:
        """Zero hidden state, shape ``(layers, hidden)``; the GRU is reset to it at episode start."""
        del rng, input_shape
        return jnp.zeros((self.layers, self.hidden), jnp.float32)

    @nn.compact
    def __call__(self, carry: jax.Array, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        if self.num_outputs is None:
            raise ValueError(
                "GRUPolicy.num_outputs is None: pass num_outputs=..., or let jes.train set it from the env"
            )
        x = jnp.ravel(obs).astype(jnp.float32)
        states = []
        for layer in range(self.layers):
            if self.torch_layout:
                h = TorchGRUCell(self.hidden, name=f"gru_{layer}")(carry[layer], x)
            else:
                h, _ = nn.GRUCell(self.hidden, name=f"gru_{layer}")(carry[layer], x)
            states.append(h)
            x = h
        new_carry = jnp.stack(states)
        if self.torch_layout:
            out = TorchLinear(self.num_outputs, name="head")(jnp.ravel(new_carry))
        else:
            out = nn.Dense(self.num_outputs, name="head")(x)
        return new_carry, out


# MLPPolicy's activations by name (flax.linen's functions of these names)
ACTIVATIONS = ("tanh", "relu", "gelu", "elu", "selu", "silu", "swish", "sigmoid", "softplus", "leaky_relu", "celu",
               "relu6", "hard_tanh", "hard_sigmoid", "hard_silu", "log_sigmoid", "soft_sign")


class MLPPolicy(nn.Module):
    """Feed-forward policy: ``hidden_sizes`` dense layers with ``activation``, then a linear head.

    Attributes:
        hidden_sizes: widths of the hidden layers; ``()`` is a linear policy (the head alone).
        num_outputs: head size; ``None`` lets :func:`jes.train` fill it in.
        activation: nonlinearity between layers: a function, or the name of one of Flax's (``"relu"``, ``"gelu"``,
            ...: :data:`ACTIVATIONS`, which the command line's ``--policy-arg activation=relu`` gives).
    """

    hidden_sizes: Sequence[int] = (32, 32)
    num_outputs: int | None = None
    activation: Callable[[jax.Array], jax.Array] | str = jnp.tanh

    def __post_init__(self):
        if isinstance(self.hidden_sizes, (str, bytes)) or not isinstance(self.hidden_sizes, Sequence):
            raise TypeError(f"MLPPolicy hidden_sizes must be a sequence of layer widths, e.g. (32, 32) (or (): a "
                            f"linear policy), got {self.hidden_sizes!r}")
        for index, width in enumerate(self.hidden_sizes):
            _check_count(self, f"hidden_sizes[{index}]", width, "a hidden layer's width; () for no hidden layer")
        _check_count(self, "num_outputs", self.num_outputs, "the head's size; None: set from the env", optional=True)
        if isinstance(self.activation, str) and self.activation not in ACTIVATIONS:
            raise ValueError(f"MLPPolicy activation {self.activation!r} is not one of Flax's activations by name: "
                             f"{', '.join(ACTIVATIONS)} (or pass a function)")
        if not isinstance(self.activation, str) and not callable(self.activation):  # ('str' object is not callable,
            raise TypeError(f"MLPPolicy activation must be a function or a name of {', '.join(ACTIVATIONS)}, got "
                            f"{self.activation!r}")  # at the first step, before: a trial)
        super().__post_init__()

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        if self.num_outputs is None:
            raise ValueError(
                "MLPPolicy.num_outputs is None: pass num_outputs=..., or let jes.train set it from the env"
            )
        activation = getattr(nn, self.activation) if isinstance(self.activation, str) else self.activation
        x = jnp.ravel(obs).astype(jnp.float32)
        for width in self.hidden_sizes:
            x = activation(nn.Dense(width)(x))
        return nn.Dense(self.num_outputs, name="head")(x)


def is_recurrent(policy: nn.Module) -> bool:
    """True when ``policy`` follows the recurrent convention (has ``initialize_carry``)."""
    return callable(getattr(policy, "initialize_carry", None))


def fit_to_outputs(policy: nn.Module, num_outputs: int) -> nn.Module:
    """Return ``policy`` with ``num_outputs`` filled in when it has such a field left as ``None``."""
    if not isinstance(policy, nn.Module):
        nnx = sys.modules.get("flax.nnx")  # an nnx module's user has imported flax.nnx
        if nnx is not None and isinstance(policy, nnx.Module):
            name = type(policy).__name__
            raise TypeError(
                f"policy is a flax.nnx module ({name}); jes trains flax.linen modules, made from a class and its "
                f"fields so that every member, worker and saved file can rebuild it. Give the class and its "
                f"constructor's arguments (without rngs) through Flax's bridge instead of an instance: "
                f"flax.nnx.bridge.ToLinen({name}, args=(...), kwargs={{...}}); jes initialises it from the run's key. "
                f"See the policies guide (flax.nnx)")
        raise TypeError(
            f"policy must be a flax.linen.Module (e.g. jes.GRUPolicy(), jes.MLPPolicy()), got {type(policy).__name__}"
        )
    if is_to_linen(policy):  # an nnx class's num_outputs=None argument
        if policy.kwargs.get("num_outputs", 0) is None:
            from flax.core import FrozenDict

            return policy.clone(kwargs=FrozenDict({**policy.kwargs, "num_outputs": num_outputs}))
        return policy
    if getattr(policy, "num_outputs", 0) is None:
        return policy.clone(num_outputs=num_outputs)
    return policy


def is_to_linen(policy: Any) -> bool:
    """Whether ``policy`` is a flax.nnx module behind Flax's bridge (``nnx.bridge.ToLinen``; false where the bridge
    was never imported, so flax.nnx is not imported for the question)."""
    wrappers = sys.modules.get("flax.nnx.bridge.wrappers")
    return wrappers is not None and isinstance(policy, wrappers.ToLinen)


def nnx_refusal(policy: nn.Module, err: BaseException, recurrent: bool = False) -> None:
    """Raise what an nnx module behind Flax's bridge (``nnx.bridge.ToLinen``) cannot do, where ``err`` came from
    building or calling it: be recurrent (the bridge cannot run its ``initialize_carry`` outside a call) or draw
    random numbers (``nnx.Dropout``'s missing RNG stream); return for any other policy or error."""
    if not is_to_linen(policy):
        return
    name = f"policy ToLinen ({getattr(policy.nnx_class, '__qualname__', policy.nnx_class)})"
    if recurrent:
        raise ValueError(f"{name} is recurrent, and Flax's bridge cannot run an nnx module's initialize_carry outside "
                         f"a call ({type(err).__name__}); jes trains recurrent policies written with flax.linen "
                         f"(nn.GRUCell, nn.LSTMCell, jes.GRUPolicy)") from err
    if isinstance(err, KeyError) and "Rng" in str(err):  # nnx's "No RngStream named 'dropout' found in Rngs"
        raise ValueError(f"{name} cannot be built as a pure function of its parameters (KeyError: {err}); jes gives an "
                         f"nnx module only its parameters' RNG stream and keeps no state it updates: leave nnx.Dropout "
                         f"out of the policy, and give nnx.BatchNorm use_running_average=True") from err


def nnx_updates(policy: nn.Module, variables: Any, obs: Any) -> list[str]:
    """The normalisation statistics a flax.nnx module behind Flax's bridge would update as it acts (an
    ``nnx.BatchNorm`` left in training mode: its ``batch_stats``), which the bridge drops without a word where the
    collection is not mutable: the paths of those its call, traced with every collection mutable, returns as other
    than the variable it was given. Other collections a call updates (a counter, ``sow``'s intermediates, an
    ``nnx.Rngs`` count) are left alone: dropped, they change no output. Empty for any other policy."""
    if not is_to_linen(policy):
        return []
    leaves, treedef = jax.tree_util.tree_flatten_with_path(variables)

    def call(values, o):
        return policy.apply(jax.tree.unflatten(treedef, values), o, mutable=True)[1]

    closed, returned = jax.make_jaxpr(call, return_shape=True)([leaf for _, leaf in leaves], obs)
    given = {jax.tree_util.keystr(path): var for (path, _), var in zip(leaves, closed.jaxpr.invars)}
    return [jax.tree_util.keystr(path) for (path, _), var in zip(jax.tree_util.tree_flatten_with_path(returned)[0],
                                                                  closed.jaxpr.outvars)
            if getattr(path[0], "key", None) == "batch_stats" and given.get(jax.tree_util.keystr(path)) is not var]


def kind_of(value: Any) -> str:
    """A returned value's kind in an error: ``a tuple of 2``, ``a dict``, ``an array of shape (2,)``."""
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    if hasattr(value, "shape"):
        return f"an array of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def check_carry(name: str, initial: Any, returned: Any) -> None:
    """A recurrent policy's returned carry must be its initial carry's structure, shapes and dtypes (a while loop
    carries it from step to step)."""
    first, second = jax.tree.structure(initial), jax.tree.structure(returned)
    if first != second:
        raise ValueError(f"policy {name} returns a carry of structure {second}, but its initialize_carry gives "
                         f"{first}: return the carry in the structure initialize_carry makes it")
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(initial)[0], jax.tree.leaves(returned)):
        if (tuple(a.shape), a.dtype) != (tuple(b.shape), b.dtype):
            where = jax.tree_util.keystr(path) or "the carry"
            raise ValueError(f"policy {name} returns {where} of shape {tuple(b.shape)} {b.dtype}, but its "
                             f"initialize_carry gives {tuple(a.shape)} {a.dtype}: the carry keeps its shape and "
                             f"dtype from step to step")


class PolicyFns:
    """Uniform ``(params, carry, obs) -> (carry, out)`` view of a feed-forward or recurrent module."""

    def __init__(self, policy: nn.Module, obs_shape: tuple[int, ...]):
        self.policy = policy
        self.obs_shape = tuple(obs_shape)
        self.recurrent = is_recurrent(policy)

    def initial_carry(self) -> Any:
        """Carry at episode start for one env (``()`` for feed-forward policies)."""
        if not self.recurrent:
            return ()
        try:
            carry = self.policy.initialize_carry(jax.random.key(0), self.obs_shape)
        except AttributeError as unbound:
            # A cell made in setup() (self.cell.initialize_carry) exists only in a bound module: bound without
            # variables, as Flax's apply(method=) binds it (setup runs; nothing is initialised)
            try:
                carry = self.policy.apply({}, jax.random.key(0), self.obs_shape,
                                          method=type(self.policy).initialize_carry)
            except Exception:  # noqa: BLE001 - not that: the error of the call as given is the one to show
                raise unbound from None
        # Arrays, whatever initialize_carry built its leaves as: a Python number ((h, 0), a step counter) failed
        # in the rollout's broadcast of the carry over its slots ('int' object has no attribute 'shape')
        return jax.tree.map(jnp.asarray, carry)

    def init(self, key: jax.Array) -> Any:
        """Initial Flax variables for one observation of ``obs_shape``."""
        obs = jnp.zeros(self.obs_shape, jnp.float32)
        if self.recurrent:
            variables = self.policy.init(key, self.initial_carry(), obs)
        else:
            variables = self.policy.init(key, obs)
        # Sharding annotations (nn.with_partitioning / nn.Partitioned boxes) name mesh axes of a model-parallel
        # layout; jes lays out members, not parameters, across devices: the plain arrays are the parameters
        return nn.meta.unbox(variables)

    def apply(self, params: Any, carry: Any, obs: jax.Array) -> tuple[Any, jax.Array]:
        if self.recurrent:
            return self.policy.apply(params, carry, obs)
        return carry, self.policy.apply(params, obs)


def evolved_variances(variables: Any) -> list[str]:
    """The paths of ``variables``' BatchNorm running variances (``batch_stats/.../var``), which jes evolves as
    parameters: a member whose ``var + epsilon`` the noise takes below 0 computes ``rsqrt`` of it, NaN."""
    stats = variables.get("batch_stats", {}) if hasattr(variables, "get") else {}
    return ["batch_stats" + jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(stats)
            if getattr(path[-1], "key", None) == "var"]
