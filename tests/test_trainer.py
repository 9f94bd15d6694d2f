import copy
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jes
from jes.loop import run
from jes.rollout import compaction_sizes
from envs_for_tests import Countdown

SMALL = dict(num_members=16, chunk_size=8, num_generations=3, eval_episodes=4)


@pytest.fixture(scope="module")
def small_trainer():
    """A small CartPole trainer whose compiled step the tests share."""
    return jes.Trainer(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam", jes.ESConfig(**SMALL))


def test_same_key_gives_bit_identical_params_and_history(small_trainer):
    a = run(small_trainer, small_trainer.init_state(7), key=7)
    b = run(small_trainer, small_trainer.init_state(7), key=7)
    c = run(small_trainer, small_trainer.init_state(8), key=8)
    np.testing.assert_array_equal(a.flat_params, b.flat_params)
    np.testing.assert_array_equal(a.history["pop_mean"], b.history["pop_mean"])
    np.testing.assert_array_equal(a.history["centre_return"], b.history["centre_return"])
    assert not np.array_equal(a.flat_params, c.flat_params)


def test_train_with_a_fresh_trainer_reproduces_the_run(small_trainer):
    a = run(small_trainer, small_trainer.init_state(7), key=7)
    b = jes.train(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam", key=7, **SMALL)
    np.testing.assert_array_equal(a.flat_params, b.flat_params)
    np.testing.assert_array_equal(b.key, jax.random.key_data(jax.random.key(7)))


def test_no_recompilation_after_first_generation(small_trainer):
    state = small_trainer.init_state(0)
    for gen in range(4):
        state, metrics = small_trainer.step(state, jnp.bool_(gen % 2 == 0), jnp.bool_(gen < 3))
    jax.block_until_ready(state)
    assert small_trainer.compile_count() == 1
    assert int(state.generation) == 3  # the last call evaluated only the centre


def test_step_compiled_in_background_is_the_one_used():
    """jes.train starts the step's compile before building the state; compiled_step then waits for it
    instead of compiling again (test_train_with_a_fresh_trainer_reproduces_the_run: same bits)."""
    trainer = jes.Trainer(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam", jes.ESConfig(**SMALL))
    trainer.start_compiling_step()
    _, out, _ = trainer._compiling
    compiled, _ = trainer.compiled_step(trainer.init_state(7))
    assert compiled is out["compiled"]  # the background program, not a second compile
    trainer.start_compiling_step()  # already compiled: nothing more starts
    assert trainer._compiling is None


def test_fused_generation_equals_chunks_evaluated_apart(small_trainer):
    """What a distributed master does (chunks evaluated one by one, out of order, then
    apply_chunk_results) equals the fused step bit for bit, with normalisation statistics."""
    trainer = jes.Trainer(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam",
                          jes.ESConfig(**dict(SMALL, num_members=24, normalize_observations=True)))
    state = trainer.init_state(3)
    state, _ = trainer.step(state, jnp.bool_(False), jnp.bool_(True))            # non-trivial observation statistics
    fused, metrics = trainer.step(state, jnp.bool_(False), jnp.bool_(True))
    evaluate = jax.jit(trainer.evaluate_chunks)
    parts = {c: evaluate(state, jnp.array([c])) for c in (2, 0, 1)}
    stacked = jax.tree.map(lambda *xs: jnp.concatenate(xs), *(parts[c] for c in range(3)))
    split, split_metrics = jax.jit(trainer.apply_chunk_results)(state, stacked)
    np.testing.assert_array_equal(fused.params, split.params)
    np.testing.assert_array_equal(fused.obs_sum, split.obs_sum)
    np.testing.assert_array_equal(fused.obs_sumsq, split.obs_sumsq)
    assert float(metrics["pop_mean"]) == float(split_metrics["pop_mean"])
    assert int(metrics["env_steps"]) == int(split_metrics["env_steps"])


def _while_loops(jaxpr) -> int:
    """``while`` loops in a jaxpr, nested ones (cond branches, scan and map bodies, shard_map) included."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == "while"
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    count += _while_loops(inner)
    return count


def _arrays(tree) -> list:
    raw = lambda x: jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x
    return [np.asarray(raw(x)) for x in jax.tree.leaves(tree)]


@pytest.fixture(scope="module")
def pendulum_trainer():
    """Continuous actions and observation normalisation: where XLA's rewrites could show in the last bits.
    5 centre episodes over 3 chunks: 2 per chunk's rollout, one slot of the last chunk padding."""
    return jes.Trainer(jes.MLPPolicy(hidden_sizes=(8,)), "Pendulum-v1",
                       config=jes.ESConfig(num_members=24, chunk_size=8, eval_episodes=5, max_episode_steps=40))


def test_step_evaluates_the_centre_passed_in_beside_the_members_bit_for_bit(pendulum_trainer):
    trainer = pendulum_trainer
    yes, no = jnp.bool_(True), jnp.bool_(False)
    state, _ = trainer.step(trainer.init_state(3), no, yes)  # a non-trivial normaliser
    with_centre, metrics = trainer.step(state, yes, yes)
    without, metrics_without = trainer.step(state, no, yes)
    # the members' results do not depend on the centre's episodes sharing their rollout
    for a, b in zip(_arrays(with_centre), _arrays(without)):
        np.testing.assert_array_equal(a, b)
    assert float(metrics["pop_mean"]) == float(metrics_without["pop_mean"])
    assert int(metrics["env_steps"]) == int(metrics_without["env_steps"])
    # the centre is the state passed in's, as Trainer.evaluate_centre (a program of its own) computes it
    returns, steps = jax.jit(trainer.evaluate_centre)(state)
    assert returns.shape == (5,)
    assert np.float32(metrics["centre_return"]) == np.float32(returns.mean())
    assert int(metrics["centre_steps"]) == int(steps.sum()) == 5 * 40
    assert np.isnan(metrics_without["centre_return"]) and int(metrics_without["centre_steps"]) == 0
    # the centre alone: the same evaluation, and the state comes back unchanged
    same, metrics_only = trainer.step(state, yes, no)
    assert np.float32(metrics_only["centre_return"]) == np.float32(metrics["centre_return"])
    np.testing.assert_array_equal(np.asarray(same.params), np.asarray(state.params))
    np.testing.assert_array_equal(np.asarray(same.obs_sum), np.asarray(state.obs_sum))
    assert int(same.generation) == int(state.generation)


def test_the_step_holds_the_rollout_once(pendulum_trainer):
    """One while loop per compaction level of a chunk's batch (8 members + 2 centre episodes: one level); the
    centre evaluated in a rollout of its own would add another (+25-35 % compile on CPU: benchmarks/README.md)."""
    trainer = pendulum_trainer
    state = trainer._state_shapes()
    flag = jax.ShapeDtypeStruct((), jnp.bool_)
    jaxpr = jax.make_jaxpr(trainer.generation_step)(state, flag, flag).jaxpr
    assert trainer.centre_slots == 2
    assert _while_loops(jaxpr) == len(compaction_sizes(8 + 2, trainer.rollout_min_batch)) == 1


def test_compaction_drops_an_idle_optional_group_first():
    assert compaction_sizes(288, 32) == [288, 72]
    assert compaction_sizes(288, 32, optional_slots=32) == [288, 256, 64]
    assert compaction_sizes(40, 32, optional_slots=32) == compaction_sizes(40, 32) == [40]  # 8 left: too few


@pytest.mark.parametrize("env", ["Pendulum-v1", "CartPole-v1"])
def test_with_eval_every_above_one_the_idle_centre_slots_leave_the_batch_with_the_same_bits(env):
    """eval_every > 1: most steps leave the centre's slots idle, so the rollout's first level ends once only the
    members' slots can run (one more compaction level). Batch sizes differ from eval_every=1's; bits do not."""
    config = dict(num_members=24, chunk_size=8, eval_episodes=5, max_episode_steps=40, normalize_observations=True)
    make = lambda every: jes.Trainer(jes.MLPPolicy(hidden_sizes=(8,)), env, config=jes.ESConfig(
        **config, eval_every=every), rollout_min_batch=2)
    every_step, sometimes = make(1), make(3)
    flag = jax.ShapeDtypeStruct((), jnp.bool_)
    loops = [_while_loops(jax.make_jaxpr(t.generation_step)(t._state_shapes(), flag, flag).jaxpr)
             for t in (every_step, sometimes)]
    if every_step.spec.fixed_length:  # Pendulum: every episode runs to the limit, so no compaction levels at all
        assert env == "Pendulum-v1" and loops == [1, 2]
    else:
        assert loops == [len(compaction_sizes(8 + 2, 2)), len(compaction_sizes(8 + 2, 2, optional_slots=2))] == [2, 3]
    yes, no = jnp.bool_(True), jnp.bool_(False)
    state, _ = every_step.step(every_step.init_state(4), no, yes)  # a non-trivial normaliser
    for flags in ((yes, yes), (no, yes), (yes, no)):
        a, metrics_a = every_step.step(state, *flags)
        b, metrics_b = sometimes.step(state, *flags)
        for x, y in zip(_arrays(a), _arrays(b)):
            np.testing.assert_array_equal(x, y)
        for name in ("pop_mean", "centre_return", "centre_steps", "env_steps"):
            np.testing.assert_array_equal(np.asarray(metrics_a[name]), np.asarray(metrics_b[name]))


def test_a_subclass_evaluating_the_centre_its_own_way_is_called_by_the_step():
    class FixedCentre(jes.Trainer):
        def evaluate_centre(self, state, num_episodes=None, key=None):
            n = num_episodes or self.config.eval_episodes
            return jnp.full(n, 7.0), jnp.full(n, 3, jnp.int32)

    trainer = FixedCentre(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam", jes.ESConfig(**SMALL))
    _, metrics = trainer.step(trainer.init_state(0), jnp.bool_(True), jnp.bool_(True))
    assert float(metrics["centre_return"]) == 7.0 and int(metrics["centre_steps"]) == 3 * SMALL["eval_episodes"]


def test_each_row_reports_the_centre_after_its_generation_and_a_stop_keeps_that_state(pendulum_trainer):
    trainer = pendulum_trainer
    result = run(trainer, trainer.init_state(5), key=5, num_generations=3)
    state = trainer.init_state(5)
    evaluate = jax.jit(trainer.evaluate_centre)
    for row in range(3):
        state, _ = trainer.step(state, jnp.bool_(False), jnp.bool_(True))
        assert np.float32(result.history["centre_return"][row]) == np.float32(evaluate(state)[0].mean())
    np.testing.assert_array_equal(result.flat_params, np.asarray(state.params))
    assert int(result.state.generation) == 3 and list(result.history["generation"]) == [1, 2, 3]
    # stop at the first row whose centre reaches the target: the result is that generation's state
    target = float(result.history["centre_return"][1]) - 1e-3
    first = int(np.argmax(result.history["centre_return"] >= target)) + 1
    stopping = copy.copy(trainer)  # the same compiled step: stop_at_return is read by the host loop only
    stopping.config = trainer.config.replace(stop_at_return=target)
    stopped = run(stopping, trainer.init_state(5), key=5, num_generations=3)
    assert stopped.solved_generation == first == int(stopped.state.generation) == len(stopped.history["generation"])
    np.testing.assert_array_equal(stopped.history["centre_return"], result.history["centre_return"][:first])


def test_result_params_are_a_flax_pytree_usable_with_apply(small_trainer):
    result = run(small_trainer, small_trainer.init_state(1), key=1)
    carry = result.policy.initialize_carry(jax.random.key(0), (4,))
    _, logits = result.policy.apply(result.params, carry, jnp.zeros(4))
    assert logits.shape == (2,)
    # unravelled on the host (no program runs): the same leaves as the Trainer's traced unravel
    expected = small_trainer.unravel(jnp.asarray(result.flat_params))
    assert jax.tree.structure(result.params) == jax.tree.structure(expected)
    for got, want in zip(jax.tree.leaves(result.params), jax.tree.leaves(expected)):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    hist = result.history
    assert len(hist["generation"]) == 3 and list(hist["generation"]) == [1, 2, 3]
    assert np.all(np.diff(hist["env_steps"]) > 0) and np.all(hist["pop_max"] >= hist["pop_mean"])
    assert np.isfinite(hist["centre_return"][-1])
    assert result.evaluate(num_episodes=4).shape == (4,)


def test_centre_evaluated_every_n_generations():
    result = jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "sgd",
                       **dict(SMALL, num_generations=5, eval_every=2))
    evaluated = np.isfinite(result.history["centre_return"])
    assert list(evaluated) == [False, True, False, True, True]   # every 2nd, and always the last


@pytest.mark.slow
def test_learns_cartpole_end_to_end():
    result = jes.train(jes.GRUPolicy(hidden=5, layers=2), "CartPole-v1", "adam", key=0,
                       num_members=128, num_generations=25, eval_episodes=16, stop_at_return=475.0)
    assert result.solved_generation is not None, result.history["centre_return"]
    assert result.history["pop_mean"][-1] > 5 * result.history["pop_mean"][0]
    assert np.mean(result.evaluate(num_episodes=32)) >= 400


def test_run_counts_its_wall_time_from_the_start_it_is_given(small_trainer):
    """jes.train passes its own start to run(), so the trainer's build and the step's compile, begun there, count
    (the loop's start was used, and a summary read "5.3s wall (20.7s compile)")."""
    import time

    state = small_trainer.init_state(0)
    result = jes.loop.run(small_trainer, state, num_generations=1, started=time.perf_counter() - 1000.0)
    assert result.wall_time >= 1000.0, result.wall_time


def test_custom_flax_module_and_optax_transform():
    class Linear(nn.Module):
        @nn.compact
        def __call__(self, obs):
            return nn.Dense(2)(obs)

    result = jes.train(Linear(), "CartPole-v1", optax.chain(optax.clip(1.0), optax.adam(0.05)), **SMALL)
    assert result.flat_params.shape == (4 * 2 + 2,)
    # A rate injected inside a chain is logged (it was NaN: only a top-level inject_hyperparams was read).
    chained = optax.chain(optax.clip(1.0), optax.inject_hyperparams(optax.adam)(learning_rate=0.05))
    result = jes.train(Linear(), "CartPole-v1", chained, **SMALL)
    np.testing.assert_array_equal(result.history["learning_rate"], np.float32(0.05))
    assert repr(result) == f"TrainResult({result.summary()})"  # a notebook cell printed every array (35 k chars)


def test_schedules_for_noise_std_and_learning_rate():
    result = jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam",
                       noise_std=optax.linear_schedule(0.2, 0.1, 2), learning_rate=optax.exponential_decay(0.1, 1, 0.5),
                       **SMALL)
    np.testing.assert_allclose(result.history["noise_std"], [0.2, 0.15, 0.1], rtol=1e-6)
    np.testing.assert_allclose(result.history["learning_rate"], [0.1, 0.05, 0.025], rtol=1e-6)


def test_weight_decay_shrinks_parameters():
    base = dict(SMALL, num_generations=4)
    plain = jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "sgd", **base)
    decayed = jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "sgd", weight_decay=0.5, **base)
    assert np.linalg.norm(decayed.flat_params) < np.linalg.norm(plain.flat_params)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("overrides,match", [
    (dict(num_members=7), "odd"),
    (dict(num_members=0), "num_members must be a positive integer"),
    (dict(noise_std=0.0), "noise_std must be a positive"),
    (dict(noise_std=-1.0), "noise_std must be a positive"),
    (dict(learning_rate=0.0), "learning_rate must be a positive"),
    (dict(fitness_shaping="rank"), "centered_ranks"),
    (dict(episodes_per_member=0), "episodes_per_member"),
    (dict(num_members=1, antithetic=False), "at least 2"),
    (dict(weight_decay=float("nan")), "weight_decay"),
])
def test_bad_config_values_raise_clear_errors(overrides, match):
    with pytest.raises(ValueError, match=match):
        jes.ESConfig(**overrides)


def test_unknown_config_field():
    with pytest.raises(TypeError, match=r"'population' \(did you mean 'num_members'\?\).* and ESConfig's fields "
                                        r"\(num_members, "):
        jes.train(jes.MLPPolicy(), "CartPole-v1", "adam", population=8)


def test_unknown_env_and_optimizer_names_list_valid_ones():
    with pytest.raises(ValueError, match="Acrobot-v1"):
        jes.train(jes.MLPPolicy(), "Cartpole", "adam")
    with pytest.raises(ValueError, match="novograd"):
        jes.train(jes.MLPPolicy(), "CartPole-v1", "adamw2")
    with pytest.raises(TypeError, match="GradientTransformation"):
        jes.train(jes.MLPPolicy(), "CartPole-v1", 0.1)


def test_policy_output_not_fitting_action_space():
    with pytest.raises(ValueError, match=r"outputs shape \(3,\) but env 'CartPole-v1' needs \(2,\)"):
        jes.Trainer(jes.MLPPolicy(hidden_sizes=(4,), num_outputs=3), "CartPole-v1")
    with pytest.raises(TypeError, match="flax.linen.Module"):
        jes.Trainer(lambda obs: obs, "CartPole-v1")

    class BatchedCNN(nn.Module):  # written for (batch, h, w, c) input: it keeps the first axis
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Conv(4, (3, 3))(x))
            return nn.Dense(3)(x.reshape((x.shape[0], -1)))

    # the old advice said to set the output size to 3, which it already was
    with pytest.raises(ValueError, match=r"outputs shape \(10, 3\) .*it sees ONE observation of shape \(10, 10, 4\), "
                                         r"with no batch axis"):
        jes.Trainer(BatchedCNN(), "Breakout-MinAtar")


def _feed_forward(what):
    class FeedForward(nn.Module):
        @nn.compact
        def __call__(self, obs):
            return what(nn.Dense(2)(obs), obs)
    return FeedForward()


def _recurrent(carry, what):
    class Recurrent(nn.Module):
        def initialize_carry(self, rng, input_shape):
            return carry(input_shape)

        @nn.compact
        def __call__(self, c, obs):
            return what(nn.Dense(2)(obs), c)
    return Recurrent()


def test_a_policy_breaking_the_call_conventions_gets_an_error_naming_the_convention():
    """A tuple from a feed-forward module, a recurrent one returning no carry or another carry, an initialize_carry
    of the old Flax signature, mutable BatchNorm / random Dropout: each surfaced as JAX or Flax internals."""
    zeros = lambda shape: jnp.zeros((4,))
    cases = [
        (_feed_forward(lambda out, obs: (out, obs)), r"returned a tuple of 2, not an output array: a feed-forward "
                                                     r"policy returns its output; a recurrent one defines "
                                                     r"initialize_carry\(rng, input_shape\) and returns \(carry, output\)"),
        (_recurrent(zeros, lambda out, c: out), r"a recurrent policy \(it has initialize_carry\) returns \(carry, "
                                                r"output\), but Recurrent returned an array of shape \(2,\)"),
        (_recurrent(zeros, lambda out, c: ((c, c), out)), r"returns a carry of structure .* but its initialize_carry "
                                                          r"gives"),
        (_recurrent(zeros, lambda out, c: (jnp.zeros(5), out)), r"returns the carry of shape \(5,\) float32, but its "
                                                                r"initialize_carry gives \(4,\) float32"),
        (_recurrent(lambda shape: jnp.zeros((1,) + shape[0]), lambda out, c: (c, out)),
         r"initialize_carry\(rng, input_shape\) failed .* with a key and the observation shape \(4,\)"),
    ]
    for policy, message in cases:
        with pytest.raises(ValueError, match=message):
            jes.Trainer(policy, "CartPole-v1")

    class TrainingBatchNorm(nn.Module):
        @nn.compact
        def __call__(self, obs):
            return nn.Dense(2)(nn.BatchNorm(use_running_average=False)(obs[None])[0])

    class RandomDropout(nn.Module):
        @nn.compact
        def __call__(self, obs):
            return nn.Dense(2)(nn.Dropout(0.5, deterministic=False)(obs))

    for policy in (TrainingBatchNorm(), RandomDropout()):
        with pytest.raises(ValueError, match=r"cannot be applied as a pure function of its parameters .* use "
                                             r"nn.BatchNorm\(use_running_average=True\), nn.Dropout\(deterministic=True\)"):
            jes.Trainer(policy, "CartPole-v1")


def test_nan_fitness_names_member_and_generation_and_keeps_last_good_state():
    env = Countdown()
    params = env.default_params.replace(nan_reward=True)
    with pytest.raises(jes.NonFiniteFitnessError, match=r"member \d+ of generation 1 ") as info:
        jes.train(jes.MLPPolicy(hidden_sizes=(4,)), (env, params), "adam", log_dir=None, **SMALL)
    err = info.value
    assert err.generation == 1 and 0 <= err.member < 16
    assert int(err.result.state.generation) == 0 and len(err.result.history["generation"]) == 0
    assert np.all(np.isfinite(err.result.flat_params))


@pytest.mark.parametrize("env", ["Acrobot-v1", "Pendulum-v1", "MountainCar-v0", "MountainCarContinuous-v0"])
def test_trains_on_each_classic_control_env(env):
    result = jes.train(jes.MLPPolicy(hidden_sizes=(4,)), env, "adam", max_episode_steps=40,
                       **dict(SMALL, num_generations=2))
    hist = result.history
    assert np.all(np.isfinite(hist["pop_mean"])) and np.isfinite(hist["centre_return"][-1])
    assert hist["env_steps"][-1] > 0 and np.all(np.isfinite(result.flat_params))
    # Every episode is cut at 40 steps: returns are per-episode scalars, not broadcast sums.
    assert abs(hist["pop_mean"][-1]) <= 40 * (17 if env == "Pendulum-v1" else 1.0) + 100


def test_resumed_run_keeps_its_solved_generation_and_stays_stopped(tmp_path):
    path = str(tmp_path / "run.ckpt")
    common = dict(SMALL, num_generations=4, stop_at_return=5.0, log_dir=None, progress=False)  # CartPole scores >= 8
    first = jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam", checkpoint_path=path, **common)
    assert first.solved_generation == 1 and len(first.history["generation"]) == 1
    again = jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam", resume=path, **common)
    assert again.solved_generation == 1 and len(again.history["generation"]) == 1
    np.testing.assert_array_equal(again.flat_params, first.flat_params)


def test_non_finite_update_is_not_applied_and_named(tmp_path):
    """A sigma schedule that reaches 0 makes the antithetic estimate 0/0: finite fitness, NaN step."""
    path = str(tmp_path / "run.ckpt")
    with pytest.raises(jes.NonFiniteUpdateError, match=r"generation 3 is not finite \(noise_std=0") as info:
        jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam", noise_std=optax.linear_schedule(0.2, 0.0, 2),
                  log_dir=None, checkpoint_path=path, **dict(SMALL, num_generations=5))
    err = info.value
    assert err.generation == 3 and int(err.result.state.generation) == 2
    assert np.all(np.isfinite(err.result.flat_params)) and len(err.result.history["generation"]) == 2
    from jes import checkpoint
    assert checkpoint.read(path).generation == 2   # the last good state was saved before raising


def test_max_episode_steps_moves_the_envs_own_limit():
    from envs_for_tests import Countdown

    env = Countdown()
    long = env.default_params.replace(episode_length=100)        # env's own limit is 20 steps
    for limit in (7, 30):
        result = jes.train(jes.MLPPolicy(hidden_sizes=(4,)), (env, long), "adam", max_episode_steps=limit,
                           log_dir=None, **dict(SMALL, num_generations=1))
        assert result.history["pop_mean"][-1] == limit and result.trainer.spec.params.max_steps_in_episode == limit


def test_nothing_compiles_inside_the_generation_loop_after_generation_1(tmp_path):
    """The step and the best member's regeneration program are compiled before or during generation 1; later
    generations (checkpoints, which regenerate the best member, included) run without a compile (JAX's log)."""
    import logging

    compiles, seen = [], {"generation": 0}

    class Record(logging.Handler):
        def emit(self, record):
            message = record.getMessage()
            if message.startswith("Compiling "):
                compiles.append((seen["generation"], message[:100]))

    handler, logger = Record(), logging.getLogger("jax")
    logger.addHandler(handler)
    previous = jax.config.jax_log_compiles
    jax.config.update("jax_log_compiles", True)
    try:
        jes.train(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam", key=8, num_generations=5, num_members=16,
                  eval_episodes=4, log_dir=str(tmp_path / "run"), checkpoint_every=1, progress=False,
                  callbacks=[lambda row: seen.update(generation=row["generation"])])
    finally:
        jax.config.update("jax_log_compiles", previous)
        logger.removeHandler(handler)
    assert any(g == 0 for g, _ in compiles)  # the log is seen: the step compiled before generation 1 ended
    inside = [(g, m) for g, m in compiles if 1 <= g < 5]
    assert inside == [], inside


@pytest.mark.hard_timeout(600)
@pytest.mark.parametrize("perturbation", ["full_rank", "low_rank"])
def test_step_and_member_programs_with_threefry_unrolled_give_the_bits_of_jax_rolled_lowering(perturbation, monkeypatch):
    """The step and member programs hash with threefry unrolled (jes.compiled.THREEFRY_UNROLLED): another XLA
    program (the hash's rolled loops are gone), the same bits as JAX's own rolled CPU lowering, generation for
    generation; the member regenerated by each program too."""
    import jes.compiled

    config = jes.ESConfig(num_members=16, chunk_size=8, eval_episodes=4, perturbation=perturbation)

    def generations(unrolled):
        monkeypatch.setattr(jes.compiled, "THREEFRY_UNROLLED", unrolled)
        trainer = jes.Trainer(jes.MLPPolicy(hidden_sizes=(8,)), "CartPole-v1", "adam", config)
        state = trainer.init_state(3)
        step, _ = trainer.compiled_step(state)
        out = []
        for _ in range(3):
            state, metrics = step(state, jnp.bool_(True), jnp.bool_(True))
            out.append((jax.device_get(state), jax.device_get(metrics)))
        member = np.asarray(trainer._compile_member(state)(state, 5))
        program = getattr(trainer._compiled, "compiled", trainer._compiled)  # the program cache's _FlatStep, or not
        loops = program.as_text().count(" while(")
        return out, member, trainer.programs_threefry_unrolled, loops

    unrolled, member_u, flag_u, loops_u = generations(True)
    rolled, member_r, flag_r, loops_r = generations(False)
    assert flag_u and not flag_r
    assert loops_u < loops_r, (loops_u, loops_r)  # another program: the hash's rolled loops are gone
    for (state_u, metrics_u), (state_r, metrics_r) in zip(unrolled, rolled):
        for a, b in zip(jax.tree.leaves(state_u), jax.tree.leaves(state_r)):
            a, b = (np.asarray(jax.random.key_data(x)) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else
                    np.asarray(x) for x in (a, b))
            assert a.tobytes() == b.tobytes()
        for name in metrics_u:
            assert np.asarray(metrics_u[name]).tobytes() == np.asarray(metrics_r[name]).tobytes(), name
    assert member_u.tobytes() == member_r.tobytes()


def test_an_unwritable_checkpoint_or_log_folder_is_refused_before_anything_trains(tmp_path, monkeypatch):
    """A checkpoint path in a folder that cannot be written was found only at the first save, after training, and
    the run was thrown away with an error naming the save's temporary file."""
    import jes.loop

    ran = []
    monkeypatch.setattr(jes.loop, "_run", lambda *args, **kwargs: ran.append(1))  # train()'s host loop
    common = dict(SMALL, progress=False)
    policy = jes.MLPPolicy(hidden_sizes=(4,))
    # /proc takes no new files, whoever runs the tests (root included)
    with pytest.raises(PermissionError, match=r"checkpoint '/proc/jes-test\.ckpt' cannot be written: a file cannot "
                                              r"be created in '/proc' .*checkpoint_path=") as err:
        jes.train(policy, "CartPole-v1", "adam", log_dir=None, checkpoint_path="/proc/jes-test.ckpt", **common)
    assert ".tmp" not in str(err.value)
    with pytest.raises(PermissionError, match=r"log_dir '/proc/jes-test-runs/a' cannot be written: a file cannot be "
                                              r"created in '/proc' .*log_dir="):
        jes.train(policy, "CartPole-v1", "adam", log_dir="/proc/jes-test-runs/a", checkpoint_path=None, **common)
    (tmp_path / "afile").write_text("")
    with pytest.raises(PermissionError, match="is a file, not a folder"):
        jes.train(policy, "CartPole-v1", "adam", log_dir=None, checkpoint_path=str(tmp_path / "afile" / "x.ckpt"),
                  **common)
    assert not ran and os.listdir(tmp_path) == ["afile"]  # nothing trained, and the probe left nothing behind
    jes.train(policy, "CartPole-v1", "adam", log_dir=None, checkpoint_path=str(tmp_path / "new" / "run.ckpt"), **common)
    assert ran and os.listdir(tmp_path) == ["afile"]  # a folder still to be made is fine (the save makes it)


def test_a_save_failing_mid_run_stops_there_and_carries_the_run_so_far(tmp_path, monkeypatch):
    """A save that failed mid-run (a full disk) raised the bare OSError: the trained parameters were lost."""
    from jes import checkpoint

    path = str(tmp_path / "run.ckpt")
    real, saves = checkpoint._write_payload, []

    def full_from_the_second_save(f, payload):
        saves.append(1)
        if len(saves) >= 2:
            raise OSError(28, "No space left on device", f"{tmp_path}/.run.ckpt.123@host.x.tmp")
        real(f, payload)

    monkeypatch.setattr(checkpoint, "_write_payload", full_from_the_second_save)
    with pytest.raises(jes.CheckpointSaveError) as info:
        jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam", log_dir=None, progress=False,
                  checkpoint_path=path, checkpoint_every=1, **dict(SMALL, num_generations=4))
    err = info.value
    assert isinstance(err, OSError) and err.errno == 28 and err.generation == 2 and err.path == path
    message = str(err)
    assert "training stopped at generation 2 of 4" in message and "No space left on device" in message
    assert ".tmp" not in message and "error.result" in message and "generation 1" in message
    result = err.result
    assert int(result.state.generation) == 2 and result.history["generation"].tolist() == [1, 2]
    assert np.all(np.isfinite(result.flat_params)) and result.checkpoint_path == path
    assert checkpoint.read(path).generation == 1  # the save that succeeded is intact
    monkeypatch.undo()
    again = str(tmp_path / "elsewhere.ckpt")  # the run so far saves elsewhere and resumes from there
    checkpoint.save(again, result.trainer, result.state, result.history, result.key, best=result.best)
    resumed = jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam", log_dir=None, progress=False,
                        resume=again, **dict(SMALL, num_generations=4))
    uninterrupted = jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam", log_dir=None, progress=False,
                              checkpoint_path=None, **dict(SMALL, num_generations=4))
    np.testing.assert_array_equal(resumed.flat_params, uninterrupted.flat_params)


def test_a_save_failing_on_ctrl_c_still_carries_the_run_and_says_why_none_was_saved(tmp_path, monkeypatch):
    from jes import checkpoint

    calls = []

    def step_then_interrupt(*args, **kwargs):  # Ctrl-C arrives during the second generation's callbacks
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt

    def full(f, payload):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "_write_payload", full)
    with pytest.raises(KeyboardInterrupt) as info:
        jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam", log_dir=None, progress=False,
                  checkpoint_path=str(tmp_path / "run.ckpt"), callbacks=[step_then_interrupt],
                  **dict(SMALL, num_generations=4))
    interrupt = info.value
    assert isinstance(interrupt.save_error, jes.CheckpointSaveError) and interrupt.save_error.generation == 1
    assert getattr(interrupt, "checkpoint_path", None) is None and int(interrupt.result.state.generation) == 1
    assert os.listdir(tmp_path) == []
    assert interrupt.__notes__[0].endswith("; no checkpoint holds it (checkpoint_path=None, or none was written)")


def test_the_summary_names_the_log_dir_the_run_wrote_from_any_folder(tmp_path, monkeypatch):
    """A review: whether the log dir was written was looked up when the summary was read, so a relative log_dir read
    from another folder was called "none written"."""
    monkeypatch.chdir(tmp_path)
    result = jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam", log_dir="logs_rel", progress=False,
                       checkpoint_path=None, **dict(SMALL, num_generations=1))
    monkeypatch.chdir("/")
    assert result.summary().endswith("; logs: logs_rel; checkpoint: off")


def test_a_ctrl_c_whose_save_failed_names_the_generation_its_earlier_checkpoint_holds(tmp_path, monkeypatch):
    """A review: the interrupt's note said the checkpoint "holds it too" where the save at the interrupt had failed and
    the file held an earlier generation."""
    from jes import checkpoint

    write, calls = checkpoint._write_payload, []

    def fills_up(f, payload):  # the first save (generation 1) is written, the disk is full from then on
        calls.append(1)
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        return write(f, payload)

    def interrupt_at_4(record):  # the state is generation 3's, the checkpoint generation 2's: saved at the interrupt
        if record["generation"] == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "_write_payload", fills_up)
    path = str(tmp_path / "run.ckpt")
    with pytest.raises(KeyboardInterrupt) as info:
        jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam", log_dir=None, progress=False,
                  checkpoint_path=path, checkpoint_every=2, callbacks=[interrupt_at_4], **dict(SMALL, num_generations=5))
    monkeypatch.undo()
    note = info.value.__notes__[0]
    assert note.startswith("jes: interrupted after generation 3.") and "saving it failed (" in note, note
    assert checkpoint.read(path).generation == 2
    assert note.endswith(f"the checkpoint {path} holds generation 2 (resume={path!r})")



def a_full_log_disk(monkeypatch, fails_from=None, interrupt_at=None):
    """TensorBoard's log disk fills up: its writes fail from generation ``fails_from`` on (``None``: never; or a Ctrl-C
    comes among generation ``interrupt_at``'s), and its close fails on the same disk."""
    from jes.logging import TensorBoardLogger

    write, close = TensorBoardLogger.__call__, TensorBoardLogger.close

    def full(self, record):
        if record["generation"] == interrupt_at:
            raise KeyboardInterrupt
        if fails_from is not None and record["generation"] >= fails_from:
            raise OSError(28, "No space left on device")
        write(self, record)

    def close_on_a_full_disk(self):
        close(self)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(TensorBoardLogger, "__call__", full)
    monkeypatch.setattr(TensorBoardLogger, "close", close_on_a_full_disk)


def test_a_logger_that_cannot_close_never_replaces_the_error_that_stopped_the_run(tmp_path, monkeypatch):
    """A full disk under the log dir: the write that failed mid-run stopped the run with the run so far and its
    checkpoint (.result, .checkpoint_path), and then closing the logs failed on the same disk and raised a new
    OSError in its place, which carried neither: the error lost the run, and `jes train` printed a bare errno."""
    from jes import checkpoint

    a_full_log_disk(monkeypatch, fails_from=2)
    path = str(tmp_path / "run.ckpt")
    with pytest.warns(UserWarning, match=r"could not close TensorBoardLogger \(OSError: \[Errno 28\] No space left on "
                                         r"device\); what it had not written yet is missing from its logs"):
        with pytest.raises(OSError, match="No space left on device") as info:
            jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam", log_dir=str(tmp_path / "logs"),
                      progress=False, checkpoint_path=path, checkpoint_every=1, **SMALL)
    err = info.value
    assert err.checkpoint_path == path and checkpoint.read(path).generation == 1
    assert err.result.history["generation"].tolist() == [1] and int(err.result.state.generation) == 1


def test_a_ctrl_c_on_a_full_log_disk_still_carries_the_run_and_its_checkpoint(tmp_path, monkeypatch):
    a_full_log_disk(monkeypatch, interrupt_at=2)
    path = str(tmp_path / "run.ckpt")
    with pytest.warns(UserWarning, match="could not close TensorBoardLogger"):
        with pytest.raises(KeyboardInterrupt) as info:
            jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam", log_dir=str(tmp_path / "logs"),
                      progress=False, checkpoint_path=path, **SMALL)
    assert info.value.checkpoint_path == path and info.value.result.history["generation"].tolist() == [1]


def test_a_run_that_finished_keeps_its_result_when_its_logs_cannot_close(tmp_path, monkeypatch):
    """The run trained and saved every generation; a log that could not be closed raised instead of returning it."""
    from jes import checkpoint

    a_full_log_disk(monkeypatch)
    path = str(tmp_path / "run.ckpt")
    with pytest.warns(UserWarning, match="could not close TensorBoardLogger .*the run's result and checkpoint are not "
                                         "affected"):
        result = jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam", log_dir=str(tmp_path / "logs"),
                           progress=False, checkpoint_path=path, **SMALL)
    assert result.history["generation"].tolist() == [1, 2, 3] and checkpoint.read(path).generation == 3


class LogsOnAFullDisk(jes.logging.Logger):
    def __call__(self, record):
        pass

    def close(self):
        self.closed = True
        raise OSError(28, "No space left on device")


def test_close_all_raises_the_first_failure_unless_told_to_warn():
    """jes.logging.close_all closes every logger, then raises the first failure (or, with warn, warns of each)."""
    first, second = LogsOnAFullDisk(), LogsOnAFullDisk()
    with pytest.raises(OSError, match="No space left"):
        jes.logging.close_all([first, second])
    assert first.closed and second.closed
    with pytest.warns(UserWarning, match="could not close LogsOnAFullDisk") as caught:
        jes.logging.close_all([LogsOnAFullDisk(), LogsOnAFullDisk()], warn=True)
    assert len(caught) == 2


def test_close_all_under_warnings_as_errors_closes_every_logger_and_never_replaces_the_runs_error(tmp_path,
                                                                                                  monkeypatch):
    """With -W error the first warning raised inside close_all's loop: the loggers after it stayed open, and in
    jes.train the warning replaced the error that stopped the run (which carries .result and .checkpoint_path)."""
    import warnings as _warnings

    from jes import checkpoint

    first, second = LogsOnAFullDisk(), LogsOnAFullDisk()
    with _warnings.catch_warnings():
        _warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="could not close LogsOnAFullDisk"):
            jes.logging.close_all([first, second], warn=True)
    assert first.closed and second.closed
    a_full_log_disk(monkeypatch, fails_from=2)
    path = str(tmp_path / "run.ckpt")
    with _warnings.catch_warnings():
        _warnings.simplefilter("error", UserWarning)
        with pytest.raises(OSError, match="No space left on device") as info:
            jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam", log_dir=str(tmp_path / "logs"),
                      progress=False, checkpoint_path=path, checkpoint_every=1, **SMALL)
    assert not isinstance(info.value, UserWarning)
    assert info.value.checkpoint_path == path and checkpoint.read(path).generation == 1
    assert os.listdir(tmp_path) != [] and not os.path.exists(path + checkpoint.LOCK_SUFFIX)


def test_runs_started_together_on_one_auto_folder_each_get_their_own(tmp_path, monkeypatch):
    """Two runs started in the same second picked one runs/<name>-<second> folder; the lock refused the second,
    where unique_dir had given it <name>_1. Only a path one chose is refused."""
    from jes import checkpoint

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(jes.logging, "default_run_name", lambda *args: "same-second")
    real_unique = jes.logging.unique_dir
    picks = iter(["runs/same-second"])  # the first pick made before the first run made the folder
    monkeypatch.setattr(jes.logging, "unique_dir", lambda path: next(picks, None) or real_unique(path))
    with checkpoint.WriterLock(os.path.join("runs", "same-second", "checkpoint.ckpt")):  # the first run
        result = jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam", progress=False,
                           **dict(SMALL, num_generations=1))
        assert result.checkpoint_path == os.path.join("runs", "same-second_1", "checkpoint.ckpt")
        with pytest.raises(checkpoint.CheckpointInUseError):  # a checkpoint one named
            jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam", progress=False,
                      checkpoint_path=os.path.join("runs", "same-second", "checkpoint.ckpt"), log_dir=None,
                      **dict(SMALL, num_generations=1))


@pytest.mark.hard_timeout(600)
@pytest.mark.parametrize("stop_at", [2, 3])  # 2 evaluates its centre (eval_every=2): committed a step later
def test_a_callback_raising_stop_training_ends_the_run_after_that_generation_keeping_it(tmp_path, stop_at):
    """Raising from a callback used to drop the generation whose record it had just seen; jes.StopTraining keeps it
    and ends the run as at its last generation (history, best, checkpoint, logs), and resuming goes on from there
    bit-identical to a run never stopped."""
    common = dict(progress=False, num_members=16, chunk_size=8, num_generations=5, eval_episodes=2, eval_every=2)
    seen = []

    def plateau(record):
        if record["generation"] == stop_at:
            raise jes.StopTraining("plateau")

    log_dir = str(tmp_path / "run")
    result = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=3, log_dir=log_dir,
                       callbacks=[plateau, lambda record: seen.append(record["generation"])], **common)
    assert list(result.history["generation"]) == list(range(1, stop_at + 1))
    assert seen == list(range(1, stop_at + 1))  # the callbacks after the one that raised still saw it
    assert result.stopped == "plateau" and "stopped by a callback: plateau" in result.summary()
    assert int(result.state.generation) == stop_at and result.best.generation <= stop_at
    saved = jes.checkpoint.read(result.checkpoint_path)
    assert saved.generation == stop_at and list(saved.history["generation"]) == list(range(1, stop_at + 1))
    scalars = jes.logging.read_scalars(log_dir)
    assert [step for step, _ in scalars["population/mean_return"]] == list(range(1, stop_at + 1))
    assert scalars["hparams/generations"] == [(stop_at, float(stop_at))]  # closed as at a normal end
    resumed = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", resume=result.checkpoint_path, **common)
    full = jes.train(jes.MLPPolicy((4,)), "CartPole-v1", "adam", key=3, log_dir=None, checkpoint_path=None, **common)
    assert resumed.stopped is None and full.stopped is None
    np.testing.assert_array_equal(resumed.flat_params, full.flat_params)
    np.testing.assert_array_equal(resumed.history["pop_mean"], full.history["pop_mean"])


def test_stop_training_without_a_message_and_from_jes_run(tmp_path):
    trainer = jes.Trainer(jes.MLPPolicy((4,)), "CartPole-v1", "adam", jes.ESConfig(**SMALL))

    def stop(record):
        raise jes.StopTraining

    result = run(trainer, trainer.init_state(0), callbacks=[stop], checkpoint_path=str(tmp_path / "c.ckpt"))
    assert list(result.history["generation"]) == [1] and result.stopped == "StopTraining"
    assert jes.checkpoint.read(str(tmp_path / "c.ckpt")).generation == 1
    assert "StopTraining" in jes.__all__ and issubclass(jes.StopTraining, Exception)



def test_a_callback_that_returns_a_value_is_warned_once_that_it_is_not_read():
    """A callback returning False to stop (Stable-Baselines3's _on_step) saw the run go on silently: warned once per
    callback that the value is not read and StopTraining ends a run; a callback returning None is not warned of."""
    trainer = jes.Trainer(jes.MLPPolicy((4,)), "CartPole-v1", "adam", jes.ESConfig(**SMALL))

    import warnings

    def sb3_style(record):
        return False

    class Done:
        def __call__(self, record):
            return {"done": True, "long": "x" * 100}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run(trainer, trainer.init_state(0), callbacks=[sb3_style, Done(), lambda record: None],
                     num_generations=3)
    assert list(result.history["generation"]) == [1, 2, 3] and result.stopped is None  # the run went on
    said = [str(w.message) for w in caught if "callbacks return" in str(w.message)]
    assert said == [
        "callback test_a_callback_that_returns_a_value_is_warned_once_that_it_is_not_read.<locals>.sb3_style returned "
        "False: jes ignores what callbacks return, so the run goes on; raise jes.StopTraining('why') from it to end "
        "the run after this generation, or return None",
        "callback test_a_callback_that_returns_a_value_is_warned_once_that_it_is_not_read.<locals>.Done returned "
        "{'done': True, 'long': 'xxxxxxxxxxxxx...: jes ignores what callbacks return, so the run goes on; raise "
        "jes.StopTraining('why') from it to end the run after this generation, or return None"]

# ------------------------------------------------------------------ pickling results; jes.run's key
def _same_result(a, b) -> None:
    """Every data field of two results is the same, bit for bit."""
    for name in ("flat_params", "key"):
        assert np.asarray(getattr(a, name)).tobytes() == np.asarray(getattr(b, name)).tobytes(), name
    assert a.history.keys() == b.history.keys()
    for name in a.history:
        assert np.asarray(a.history[name]).tobytes() == np.asarray(b.history[name]).tobytes(), name
    for x, y in zip(jax.tree.leaves(jax.tree.map(np.asarray, a.params)), jax.tree.leaves(b.params)):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()
    state_a = a.state.replace(es_key=jax.random.key_data(a.state.es_key))
    state_b = b.state.replace(es_key=jax.random.key_data(b.state.es_key))
    assert jax.tree.structure(state_a) == jax.tree.structure(state_b)
    for x, y in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b)):
        assert np.asarray(x).dtype == np.asarray(y).dtype and np.asarray(x).tobytes() == np.asarray(y).tobytes()
    for name in ("env_name", "optimizer", "strategy", "solved_generation", "compile_time", "wall_time", "log_dir",
                 "checkpoint_path"):
        assert getattr(a, name) == getattr(b, name), name
    assert (a.best is None) == (b.best is None)
    if a.best is not None:
        assert (a.best.fitness, a.best.generation, a.best.member) == (b.best.fitness, b.best.generation, b.best.member)
        assert a.best.flat_params.tobytes() == b.best.flat_params.tobytes()
        assert a.best.policy.obs_stats is not None
        for x, y in zip(a.best.policy.obs_stats, b.best.policy.obs_stats):
            assert np.asarray(x).tobytes() == np.asarray(y).tobytes()
    assert type(a.policy) is type(b.policy) and a.policy == b.policy
    assert a.summary() == b.summary()


def test_a_result_and_the_errors_that_hold_one_pickle_and_deepcopy(tmp_path):
    """A TrainResult pickles without its trainer (compiled functions, devices): every data field comes back bit for
    bit, the trained policy acts and evaluates as before, what needs the trainer says what to do; deepcopy shares the
    trainer. A NonFiniteUpdateError, which holds the run so far, pickles and deep-copies too."""
    import pickle

    path = str(tmp_path / "run.ckpt")
    r = jes.train(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam", key=7, log_dir=None, progress=False,
                  checkpoint_path=path, **SMALL)
    back = pickle.loads(pickle.dumps(r))
    assert back.trainer is None and r.trainer is not None
    _same_result(r, back)
    assert back.config == r.config and back.checkpoint_path == path
    np.testing.assert_array_equal(back.evaluate(4), r.evaluate(4))
    assert back.trained_policy().flat_params.tobytes() == r.trained_policy().flat_params.tobytes()
    carry, obs = back.initial_carry(), np.ones(4, np.float32)
    assert int(back.act(carry, obs)[1]) == int(r.act(carry, obs)[1])
    assert pickle.loads(pickle.dumps(back)).summary() == r.summary()  # a pickled result pickles again
    with pytest.raises(ValueError, match=r"render\(\) needs the run's trainer.*jes.Trainer.*resume.*run.ckpt"):
        back.render(str(tmp_path / "episode.gif"))
    deep = copy.deepcopy(r)
    assert deep.trainer is r.trainer and deep.history is not r.history and deep.state is not r.state
    _same_result(r, deep)
    assert pickle.loads(pickle.dumps(r.best)).flat_params.tobytes() == r.best.flat_params.tobytes()

    with pytest.raises(jes.NonFiniteUpdateError) as caught:  # sigma scheduled to 0: a closure in the config
        jes.train(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam", key=0, log_dir=None, progress=False,
                  **dict(SMALL, num_generations=4, noise_std=optax.linear_schedule(0.1, 0.0, 2)))
    for err in (pickle.loads(pickle.dumps(caught.value)), copy.deepcopy(caught.value)):
        assert type(err) is jes.NonFiniteUpdateError and str(err) == str(caught.value)
        assert err.generation == caught.value.generation
        _same_result(caught.value.result, err.result)
    schedule = pickle.loads(pickle.dumps(caught.value)).result.config.noise_std
    assert isinstance(schedule, jes.loop.NotPickled)
    with pytest.raises(TypeError, match="config.noise_std .*schedule.* was not pickled"):
        schedule(0)


WORKER_SCRIPT = '''
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np


def job(seed):
    import jes
    return jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", "adam", key=seed, num_members=16,
                     num_generations=2, eval_episodes=4, log_dir=None, progress=False)


if __name__ == "__main__":
    import jes
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        result = pool.submit(job, 3).result(timeout=float(sys.argv[1]))
    assert isinstance(result, jes.TrainResult) and result.trainer is None, result
    here = job(3)
    assert result.flat_params.tobytes() == here.flat_params.tobytes()  # the worker's bits, unpickled
    assert result.best.flat_params.tobytes() == here.best.flat_params.tobytes()
    assert all(np.asarray(result.history[k]).tobytes() == np.asarray(here.history[k]).tobytes()
               for k in here.history if k not in ("wall_time", "generation_time"))
    np.testing.assert_array_equal(result.evaluate(4), here.evaluate(4))
    print("the result came back")
'''


@pytest.mark.hard_timeout(660)
def test_a_spawned_worker_process_returns_its_result(tmp_path):
    """One seed per process (ProcessPoolExecutor, joblib): jes.train's result comes back through a spawn pool."""
    from subprocess_for_tests import run_script

    script = tmp_path / "workers.py"
    script.write_text(WORKER_SCRIPT)
    done = run_script(script, "300")
    assert done.returncode == 0 and "the result came back" in done.stdout, done.stdout + done.stderr


def test_run_records_the_states_own_key_and_refuses_another(small_trainer, tmp_path):
    """jes.run without key= records the key the state was initialised from (jes.train(key=result.key) reproduces
    the run); a key= the state was not initialised from is refused, naming both; a state whose key this trainer
    cannot know needs it given."""
    import warnings

    a = jes.run(small_trainer, small_trainer.init_state(7), num_generations=2)
    np.testing.assert_array_equal(a.key, jax.random.key_data(jax.random.key(7)))
    again = jes.train(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam", key=a.key, log_dir=None,
                      progress=False, **dict(SMALL, num_generations=2))
    assert again.flat_params.tobytes() == a.flat_params.tobytes()
    with pytest.raises(ValueError, match=r"key=8 is not the run key of this state \(it was initialised from 7\)"):
        jes.run(small_trainer, small_trainer.init_state(7), key=8, num_generations=1)
    other = jes.Trainer(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam", jes.ESConfig(**SMALL))
    with pytest.raises(ValueError, match="cannot tell this state's run key.*pass key="):
        jes.run(other, a.state, history=a.history, best=a.best)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # continued with its history: nothing to warn of
        b = jes.run(other, a.state, key=a.key, history=a.history, best=a.best)
    np.testing.assert_array_equal(b.key, a.key)
    # restored from a checkpoint: the checkpoint's key
    path = str(tmp_path / "run.ckpt")
    jes.run(small_trainer, small_trainer.init_state(5), num_generations=1, checkpoint_path=path)
    ckpt = jes.checkpoint.read(path)
    c = jes.run(other, ckpt.restore_state(other), history=ckpt.history, best=ckpt.best)
    np.testing.assert_array_equal(c.key, jax.random.key_data(jax.random.key(5)))


def test_run_on_a_state_past_generation_0_without_its_history_warns(small_trainer):
    a = jes.run(small_trainer, small_trainer.init_state(7), num_generations=2)
    with pytest.warns(UserWarning, match=r"generation 2 and no history= was given.*history=result.history, "
                                         r"best=result.best"):
        b = jes.run(small_trainer, a.state)
    assert list(b.history["generation"]) == [3]


def test_a_refused_or_traced_init_state_leaves_the_trainers_keys_alone(small_trainer):
    """A key init_state refuses is not remembered, and nothing is inside jit or vmap (no tracer kept): jes.run of
    the trainer's own states goes on working, with or without key=."""
    state = small_trainer.init_state(1)
    with pytest.raises(ValueError, match="outside -2\\*\\*31"):
        small_trainer.init_state(2**40)
    batched = jax.vmap(small_trainer.init_state)(jax.random.split(jax.random.key(0), 3))
    assert batched.es_key.shape == (3,)
    jax.jit(lambda: small_trainer.init_state(9).params)()
    for kwargs in ({"key": 1}, {}):
        result = jes.run(small_trainer, state, num_generations=1, **kwargs)
        np.testing.assert_array_equal(result.key, jax.random.key_data(jax.random.key(1)))
    assert not any(isinstance(k, jax.core.Tracer) for k in small_trainer._run_keys.values())


def test_every_state_the_trainer_made_restored_or_returned_is_known(small_trainer, tmp_path, monkeypatch):
    """jes.run without key= finds the run key of any of the trainer's latest states (1024; insertion-ordered): ten
    init_states then the first of them; a result's state (even one run with an explicit key on a state the trainer
    did not make); threads making states together. A key the trainer knows for the state is taken as it is."""
    import threading

    states = [small_trainer.init_state(seed) for seed in range(10)]
    first = jes.run(small_trainer, states[0], num_generations=1)
    np.testing.assert_array_equal(first.key, jax.random.key_data(jax.random.key(0)))
    other = jes.Trainer(jes.GRUPolicy(hidden=3, layers=1), "CartPole-v1", "adam", jes.ESConfig(**SMALL))
    given = jes.run(other, first.state, key=first.key, history=first.history, best=first.best, num_generations=2)
    on = jes.run(other, given.state, history=given.history, best=given.best)  # the state it returned: known
    np.testing.assert_array_equal(on.key, first.key)

    # nothing derived for a key the trainer knows for the state (nor for key=None); another form is checked
    def derived(key):
        raise AssertionError("derived a known key")

    with monkeypatch.context() as m:
        m.setattr(jes.loop, "_es_key_data", derived)
        assert jes.run(small_trainer, states[3], key=3, num_generations=1).key.tolist() == [0, 3]
        assert jes.run(small_trainer, states[4], num_generations=1).key.tolist() == [0, 4]
        with pytest.raises(AssertionError, match="derived"):
            jes.run(small_trainer, states[5], key=jax.random.key(5), num_generations=1)
    assert jes.run(small_trainer, states[5], key=jax.random.key(5), num_generations=1).key.tolist() == [0, 5]

    made = {}

    def make(seeds):
        for seed in seeds:
            made[seed] = small_trainer.init_state(seed)

    threads = [threading.Thread(target=make, args=(range(100 + 40 * i, 140 + 40 * i),)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(small_trainer.known_run_key(state) == seed for seed, state in made.items())

    monkeypatch.setattr(jes.generation, "RUN_KEYS_KEPT", 3)  # the oldest state's key goes first
    kept = [small_trainer.init_state(seed) for seed in (20, 21, 22, 20, 23)]
    assert [small_trainer.known_run_key(s) for s in kept] == [20, None, 22, 20, 23]
    with pytest.raises(ValueError, match="cannot tell this state's run key.*pass key="):
        jes.run(small_trainer, kept[1])


def test_an_unknown_keyword_of_train_names_the_nearest_argument_or_field():
    """A trial: ``checkpoint="x"`` said "unknown ESConfig field(s) checkpoint; valid fields are: ..." without the
    argument meant (``checkpoint_path``), which is train's own, not a field."""
    for given, meant in (("checkpoint", "checkpoint_path"), ("num_member", "num_members"), ("workers", "num_workers")):
        with pytest.raises(TypeError, match=rf"jes.train\(\) got unknown keyword argument\(s\) '{given}' \(did you "
                                            rf"mean '{meant}'\?\): it takes its own \(policy, .*checkpoint_path"):
            jes.train(jes.MLPPolicy(hidden_sizes=(4,)), "CartPole-v1", **{given: 1})
