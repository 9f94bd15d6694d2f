from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import jes
from jes.policies import PolicyFns


def count(policy, obs_dim):
    fns = PolicyFns(policy, (obs_dim,))
    return ravel_pytree(fns.init(jax.random.key(0)))[0].size


def test_portable_es_parameter_counts():
    assert count(jes.GRUPolicy(hidden=5, layers=2, num_outputs=2), 4) == 367   # CartPole
    assert count(jes.GRUPolicy(hidden=5, layers=3, num_outputs=3), 6) == 603   # Acrobot


def test_trainer_fills_in_output_size_and_counts_match():
    assert jes.Trainer(jes.GRUPolicy(hidden=5, layers=2), "CartPole-v1").num_params == 367
    assert jes.Trainer(jes.GRUPolicy(hidden=5, layers=3), "Acrobot-v1").num_params == 603


def test_torch_gru_cell_matches_pytorch_equations():
    cell = jes.TorchGRUCell(3)
    x, h = jnp.array([0.5, -1.0]), jnp.array([0.1, 0.2, -0.3])
    params = cell.init(jax.random.key(1), h, x)["params"]
    w_ih, w_hh, b_ih, b_hh = (np.asarray(params[k], np.float64) for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
    gi, gh = w_ih @ np.asarray(x) + b_ih, w_hh @ np.asarray(h) + b_hh
    sig = lambda v: 1 / (1 + np.exp(-v))
    r, z = sig(gi[:3] + gh[:3]), sig(gi[3:6] + gh[3:6])
    n = np.tanh(gi[6:] + r * gh[6:])
    expected = (1 - z) * n + z * np.asarray(h)
    np.testing.assert_allclose(cell.apply({"params": params}, h, x), expected, rtol=1e-5, atol=1e-6)


def test_gru_carry_is_used_and_starts_at_zero():
    policy = jes.GRUPolicy(hidden=4, layers=2, num_outputs=2)
    fns = PolicyFns(policy, (3,))
    params = fns.init(jax.random.key(0))
    carry = fns.initial_carry()
    np.testing.assert_array_equal(carry, np.zeros((2, 4)))
    obs = jnp.ones(3)
    c1, out1 = fns.apply(params, carry, obs)
    _, out2 = fns.apply(params, c1, obs)
    assert not np.allclose(out1, out2)  # same observation, different memory


def test_flax_layout_variant_and_mlp():
    flax_gru = jes.GRUPolicy(hidden=5, layers=2, num_outputs=2, torch_layout=False)
    assert count(flax_gru, 4) != 367
    mlp = jes.MLPPolicy(hidden_sizes=(8,), num_outputs=3)
    assert count(mlp, 4) == 4 * 8 + 8 + 8 * 3 + 3
    assert not PolicyFns(mlp, (4,)).recurrent


def test_missing_output_size_is_explained():
    with pytest.raises(ValueError, match="num_outputs"):
        PolicyFns(jes.MLPPolicy(), (4,)).init(jax.random.key(0))


def test_bfloat16_parameters_are_refused_saying_to_compute_in_bfloat16_instead():
    import flax.linen as nn

    class Half(nn.Module):
        @nn.compact
        def __call__(self, obs):
            return nn.Dense(2, param_dtype=jnp.bfloat16)(obs)

    with pytest.raises(TypeError, match=r"must be float32, got bfloat16.*dtype= \(e.g. nn.Dense\(64, dtype=jnp.bfloat16\)\)"):
        jes.Trainer(Half(), "CartPole-v1", "adam", jes.ESConfig(num_members=4))


class _Masked(nn.Module):
    """A bool mask in a collection of its own."""
    @nn.compact
    def __call__(self, obs):
        mask = self.variable("consts", "mask", lambda: jnp.array([True, False, True, False]))
        return nn.Dense(2)(jnp.where(mask.value, obs, 0.0))


class _Counted(nn.Module):
    """An int32 parameter."""
    @nn.compact
    def __call__(self, obs):
        count = self.param("count", lambda key: jnp.int32(3))
        return nn.Dense(2)(obs * count)


class _PartlyHalf(nn.Module):
    """One float16 (or bfloat16) layer beside a float32 one."""
    dtype: Any = jnp.bfloat16

    @nn.compact
    def __call__(self, obs):
        return nn.Dense(2)(nn.Dense(8, param_dtype=self.dtype)(obs))


@pytest.mark.parametrize("policy, message", [
    (_Masked(), r"^policy _Masked's variable consts/mask is bool\[4\]: jes evolves every variable as float32 "
                r"parameters.*make a fixed bool value a constant of the module"),
    (_Counted(), r"^policy _Counted's variable params/count is int32\[\]: .*constant of the module"),
])
def test_int_and_bool_variables_are_refused_naming_them(policy, message):
    """They were raveled into the float32 vector, perturbed and cast back: a mask's False turned True in every member
    and in the result, an int parameter drifted (3 trained to 2)."""
    with pytest.raises(TypeError, match=message):
        jes.Trainer(policy, "CartPole-v1", "adam", jes.ESConfig(num_members=4))
    with pytest.raises(TypeError, match=message):
        jes.Trainer(policy, "CartPole-v1", "adam", jes.ESConfig(num_members=4, perturbation="low_rank",
                                                               perturbation_rank=1))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_a_policy_with_some_low_precision_parameters_is_refused_naming_the_first(dtype):
    """Only a module whose parameters were all bfloat16 was refused: a bf16 layer beside a float32 one trained with
    each member rounded to bf16 (at a small noise_std ~40 % of its entries unperturbed)."""
    name = jnp.dtype(dtype).name
    with pytest.raises(TypeError, match=rf"^policy parameters must be float32, got {name} at params/Dense_1/bias of "
                                        rf"policy _PartlyHalf: .*dtype= \(e.g. nn.Dense\(64, dtype=jnp.bfloat16\)\)"):
        jes.Trainer(_PartlyHalf(dtype), "CartPole-v1", "adam", jes.ESConfig(num_members=4))


class _Complex(nn.Module):
    @nn.compact
    def __call__(self, obs):
        w = self.param("w", lambda key: jnp.ones((4,), jnp.complex64))
        return nn.Dense(2)(obs * w.real)


class _BoxedInt(nn.Module):
    """An int32 parameter boxed by nn.with_partitioning (a leaf under the box's .value)."""
    @nn.compact
    def __call__(self, obs):
        w = self.param("w", nn.with_partitioning(lambda key, shape: jnp.ones(shape, jnp.int32), (None,)), (4,))
        return nn.Dense(2)(obs * w)


def test_a_complex_parameter_gets_the_float32_message_saying_complex_is_not_supported():
    """It was told it was an int or bool variable to make a constant."""
    with pytest.raises(TypeError, match=r"^policy parameters must be float32 \(complex parameters are not supported\), "
                                        r"got complex64 at params/w of policy _Complex: "):
        jes.Trainer(_Complex(), "CartPole-v1", "adam", jes.ESConfig(num_members=4))


def test_a_boxed_variable_is_named_by_its_path_without_punctuation():
    """A GetAttrKey was written by its str: params/w/.value (the box is now unboxed: params/w)."""
    with pytest.raises(TypeError, match=r"^policy _BoxedInt's variable params/w is int32\[4\]: "):
        jes.Trainer(_BoxedInt(), "CartPole-v1", "adam", jes.ESConfig(num_members=4))


class _Sharded(nn.Module):
    """Kernels annotated for a model-parallel mesh (flax's nn.with_partitioning): boxed nn.Partitioned values."""

    @nn.compact
    def __call__(self, obs):
        h = nn.Dense(8, kernel_init=nn.with_partitioning(nn.initializers.lecun_normal(), (None, "model")))(obs)
        return nn.Dense(2)(jnp.tanh(h))


@pytest.mark.parametrize("perturbation", [jes.FullRank(), jes.LowRank(1)])
def test_a_policy_with_sharding_annotations_trains_on_its_plain_arrays(perturbation, recwarn):
    """It failed deep in lowering ("Resource axis: model of P(None, 'model') is not found in mesh"), and low rank
    warned that the Dense kernel (keyed .../kernel/.value) was not applied by a layer it can factor."""
    result = jes.train(_Sharded(), "CartPole-v1", "adam", perturbation=perturbation, num_members=8,
                       num_generations=1, eval_episodes=1, log_dir=None, checkpoint_path=None, progress=False)
    assert jax.tree_util.tree_structure(result.params) == jax.tree_util.tree_structure(
        {"params": {"Dense_0": {"bias": 0, "kernel": 0}, "Dense_1": {"bias": 0, "kernel": 0}}})
    assert not [w for w in recwarn if issubclass(w.category, jes.perturbations.LowRankWarning)]


def test_flax_rnn_as_a_policy_is_refused_saying_to_pass_its_cell():
    """nn.RNN scans a time axis; given one observation it failed deep in Flax with a bare IndexError."""
    with pytest.raises(ValueError, match=r"^policy RNN is Flax's nn.RNN, which scans a sequence along a time axis.*"
                                         r"pass the cell as the policy \(GRUCell, as nn.RNN was given it\)$"):
        jes.Trainer(nn.RNN(nn.GRUCell(2)), "CartPole-v1", "adam", jes.ESConfig(num_members=4))


def test_an_index_error_applying_the_policy_is_one_line_naming_it():
    class Indexing(nn.Module):
        @nn.compact
        def __call__(self, obs):
            return nn.Dense(2)(obs[:, 0])  # obs has no batch axis

    with pytest.raises(ValueError, match=r"^policy Indexing cannot be applied to one observation of env 'CartPole-v1' "
                                         r"\(shape \(4,\)\): "):
        jes.Trainer(Indexing(), "CartPole-v1", "adam", jes.ESConfig(num_members=4))


@pytest.mark.parametrize("make, error, message", [
    (lambda: jes.GRUPolicy(hidden=0), ValueError, "GRUPolicy hidden must be a positive integer"),
    (lambda: jes.GRUPolicy(layers=0), ValueError, "GRUPolicy layers must be a positive integer"),
    (lambda: jes.GRUPolicy(hidden=2.5), TypeError, "GRUPolicy hidden must be a positive integer"),
    (lambda: jes.GRUPolicy(num_outputs=0), ValueError, "GRUPolicy num_outputs must be a positive integer"),
    (lambda: jes.MLPPolicy(hidden_sizes=(0,)), ValueError, r"MLPPolicy hidden_sizes\[0\] must be a positive integer"),
    (lambda: jes.MLPPolicy(hidden_sizes=(8, -1)), ValueError, r"MLPPolicy hidden_sizes\[1\]"),
    (lambda: jes.MLPPolicy(hidden_sizes=16), TypeError, "MLPPolicy hidden_sizes must be a sequence"),
    (lambda: jes.TorchGRUCell(0), ValueError, "TorchGRUCell features must be a positive integer"),
    (lambda: jes.policies.TorchLinear(0), ValueError, "TorchLinear features must be a positive integer"),
])
def test_a_policy_of_no_units_is_refused_when_made_with_its_field_named(make, error, message):
    """GRUPolicy(hidden=0) and MLPPolicy(hidden_sizes=(0,)) ended in ZeroDivisionError inside the init (and
    layers=0 in "Need at least one array to stack") once a run built the policy."""
    with pytest.raises(error, match=message):
        make()


def test_an_mlp_without_hidden_layers_is_a_linear_policy_and_numpy_sizes_are_accepted():
    assert count(jes.MLPPolicy(hidden_sizes=(), num_outputs=2), 4) == 4 * 2 + 2
    assert count(jes.MLPPolicy(hidden_sizes=[np.int64(3)], num_outputs=2), 4) == 4 * 3 + 3 + 3 * 2 + 2


class _RunningBatchNorm(nn.Module):
    num_outputs: int = 2

    @nn.compact
    def __call__(self, obs):
        return nn.Dense(self.num_outputs)(nn.relu(nn.BatchNorm(use_running_average=True)(nn.Dense(8)(obs))))


def test_a_nan_of_an_evolved_batchnorm_variance_is_named_with_the_layer_to_use():
    """A BatchNorm(use_running_average=True) policy's running var is evolved like a parameter: a member whose var the
    noise takes below 0 computed NaN, and the error blamed noise_std, the learning rate or the observations only. It
    now names the variances and LayerNorm; a policy without any says nothing of them."""
    from jes.policies import evolved_variances

    assert evolved_variances(_RunningBatchNorm().init(jax.random.key(0), jnp.ones(4))) == [
        "batch_stats['BatchNorm_0']['var']"]
    assert evolved_variances(jes.MLPPolicy((4,), num_outputs=2).init(jax.random.key(0), jnp.ones(4))) == []
    small = dict(num_members=16, num_generations=3, eval_episodes=2, log_dir=None, progress=False, noise_std=2.0)
    with pytest.raises(jes.NonFiniteFitnessError,
                       match=r"The policy evolves BatchNorm running variances as parameters \(batch_stats\['BatchNorm_0'\]"
                             r"\['var'\]\): a member whose var \+ epsilon the noise takes below 0 computes NaN; use "
                             r"nn.LayerNorm instead"):
        jes.train(_RunningBatchNorm(), "CartPole-v1", "adam", key=0, **small)


class _SetupLSTM(nn.Module):
    """A recurrent policy whose cell is made in setup(), and whose initialize_carry asks that cell."""
    num_outputs: int = 2

    def setup(self):
        self.cell = nn.OptimizedLSTMCell(3)
        self.head = nn.Dense(self.num_outputs)

    def initialize_carry(self, rng, input_shape):
        return self.cell.initialize_carry(rng, input_shape)

    def __call__(self, carry, obs):
        carry, h = self.cell(carry, obs)
        return carry, self.head(h)


def test_a_recurrent_policy_whose_cell_is_made_in_setup_trains():
    """initialize_carry of a cell made in setup() failed ("LSTMPol object has no attribute cell": jes called it on the
    unbound module, which has no submodules): it is called bound without variables when that fails, and trains."""
    result = jes.train(_SetupLSTM(), "CartPole-v1", "adam", key=0, num_members=8, num_generations=2, eval_episodes=2,
                       log_dir=None, progress=False)
    assert np.isfinite(result.history["pop_mean"]).all() and result.flat_params.size == 4 * 12 + 3 * 12 + 12 + 3 * 2 + 2
    carry = result.trained_policy().initial_carry()
    assert [np.shape(c) for c in carry] == [(3,), (3,)]


X64_CELL = """
import jax, flax.linen as nn, jes
assert jax.config.jax_enable_x64
try:
    jes.train(nn.GRUCell(2), "CartPole-v1", num_members=8, num_generations=1, eval_episodes=2, log_dir=None,
              progress=False)
except ValueError as err:
    print(err)
"""


def test_a_recurrent_cell_in_x64_mode_is_refused_up_front_naming_the_envs_float64_observations():
    """With jax_enable_x64, gymnax's CartPole gives float64 observations and the rollout applies the policy to them;
    the up-front check applied float32 ones, so nn.GRUCell (whose carry follows its input's dtype) passed it and failed
    inside the rollout's while_loop with JAX's own TypeError. x64 cannot be turned on and off safely mid-suite, so a
    process of its own runs it."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", X64_CELL], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "float64 as the env gives it with jax_enable_x64" in out.stdout, out.stdout
    assert "returns the carry of shape (2,) float64, but its initialize_carry gives (2,) float32" in out.stdout


class _CountingGRU(nn.Module):
    """A recurrent policy whose carry holds a Python number: a step counter started at ``0``, as ``(h, 0)``."""

    num_outputs: int = 2

    @nn.compact
    def __call__(self, carry, obs):
        h, steps = carry
        h, out = nn.GRUCell(4)(h, obs)
        return (h, steps + 1), nn.Dense(self.num_outputs)(out) + 0.0 * steps

    def initialize_carry(self, rng, input_shape):
        return jnp.zeros(4), 0


@pytest.mark.hard_timeout(600)
def test_a_carry_holding_a_python_number_trains_and_acts_counting_its_steps():
    """initialize_carry's leaves may be Python numbers (its check took them, as jax.eval_shape does): the rollout's
    broadcast of the carry over its slots failed with "'int' object has no attribute 'shape'"."""
    small = dict(num_members=8, num_generations=1, eval_episodes=2, log_dir=None, progress=False)
    for perturbation in (jes.FullRank(), jes.LowRank(1)):
        result = jes.train(_CountingGRU(), "CartPole-v1", "adam", perturbation=perturbation, **small)
        carry = result.initial_carry()
        for _ in range(3):
            carry, _ = result.act(carry, np.zeros(4, np.float32))
        assert int(carry[1]) == 3 and carry[1].dtype == jnp.int32
