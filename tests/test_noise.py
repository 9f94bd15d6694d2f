import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jes.strategies import noise as strategy

D = 37


def gen_key(g=3):
    return strategy.generation_key(jax.random.key(42), g)


def test_antithetic_pairs_cancel_exactly():
    noise = strategy.chunk_noise(gen_key(), 0, 16, D, antithetic=True)
    np.testing.assert_array_equal(noise[0::2] + noise[1::2], 0.0)
    assert np.abs(noise).min() > 0  # not trivially zero


def test_member_noise_alone_equals_noise_within_population():
    chunk = strategy.chunk_noise(gen_key(), 8, 8, D, antithetic=True)
    for i in range(8):
        alone = strategy.member_noise(gen_key(), 8 + i, D, antithetic=True)
        np.testing.assert_array_equal(alone, chunk[i])
    plain = strategy.chunk_noise(gen_key(), 4, 4, D, antithetic=False)
    np.testing.assert_array_equal(strategy.member_noise(gen_key(), 6, D, antithetic=False), plain[2])


def test_noise_depends_on_generation_and_member():
    a = strategy.member_noise(gen_key(3), 0, D)
    b = strategy.member_noise(gen_key(4), 0, D)
    c = strategy.member_noise(gen_key(3), 2, D)
    assert not np.allclose(a, b) and not np.allclose(a, c)
    assert abs(float(jnp.std(strategy.chunk_noise(gen_key(), 0, 512, D))) - 1.0) < 0.05


def test_episode_keys_shared_within_pair_and_distinct_across_episodes():
    keys = jax.random.key_data(strategy.episode_keys(gen_key(), jnp.arange(4), 3, antithetic=True))
    np.testing.assert_array_equal(keys[0], keys[1])
    assert not np.array_equal(keys[0], keys[2])
    assert not np.array_equal(keys[0, 0], keys[0, 1])


@pytest.mark.parametrize("antithetic", [True, False])
def test_episode_and_centre_keys_derived_together_are_the_same_keys(antithetic):
    members = jnp.arange(6, 14, dtype=jnp.int32)
    derive = jax.jit(strategy.episode_and_centre_keys, static_argnums=(2, 3))
    member_keys, centre_keys = derive(gen_key(), members, 3, antithetic, jnp.arange(4, 9, dtype=jnp.int32))
    np.testing.assert_array_equal(jax.random.key_data(member_keys),
                                  jax.random.key_data(strategy.episode_keys(gen_key(), members, 3, antithetic)))
    np.testing.assert_array_equal(jax.random.key_data(centre_keys),
                                  jax.random.key_data(strategy.centre_episode_keys(gen_key(), 9)[4:]))


@pytest.mark.parametrize("fitness", [
    np.random.default_rng(0).normal(size=101),
    np.array([3.0, 3.0, 3.0, 1.0, 9.0, 9.0]),      # ties
    np.array([5.0, 5.0]),
])
def test_centered_ranks_bounded_centered_and_ordered(fitness):
    ranks = np.asarray(strategy.centered_ranks(jnp.asarray(fitness, jnp.float32)))
    assert ranks.min() >= -0.5 and ranks.max() <= 0.5
    assert abs(ranks.sum()) < 1e-5
    order = np.argsort(fitness, kind="stable")
    assert np.all(np.diff(ranks[order]) >= 0)
    for value in np.unique(fitness):  # equal fitness, equal weight
        assert np.ptp(ranks[fitness == value]) == 0


def test_centered_ranks_of_distinct_values_span_the_interval():
    ranks = np.asarray(strategy.centered_ranks(jnp.array([2.0, -1.0, 7.0, 0.5])))
    np.testing.assert_allclose(ranks, [1 / 6, -0.5, 0.5, -1 / 6], atol=1e-6)


def test_z_score_and_unknown_shaping():
    z = strategy.shape_fitness(jnp.array([1.0, 2.0, 3.0]), "z_score")
    np.testing.assert_allclose([float(z.mean()), float(z.std())], [0.0, 1.0], atol=1e-5)
    with pytest.raises(ValueError, match="centered_ranks"):
        strategy.shape_fitness(jnp.ones(3), "ranks")


@pytest.mark.parametrize("antithetic", [True, False])
@pytest.mark.parametrize("shaping", strategy.FITNESS_SHAPINGS)
def test_gradient_estimate_points_uphill_on_quadratic(antithetic, shaping):
    target = jnp.linspace(-1.0, 1.0, D)
    theta = jnp.zeros(D)
    sigma, n = 0.05, 256
    key = gen_key()
    eps = strategy.chunk_noise(key, 0, n, D, antithetic)
    fitness = -jnp.sum((theta + sigma * eps - target) ** 2, axis=1)
    weights = strategy.shape_fitness(fitness, shaping)
    grad = strategy.es_gradient(strategy.chunk_weighted_noise(key, 0, weights, D, antithetic), n, sigma)
    true_grad = -2 * (theta - target)
    cosine = float(grad @ true_grad / (jnp.linalg.norm(grad) * jnp.linalg.norm(true_grad)))
    # Raw, non-mirrored fitness has no baseline and is the noisiest estimator; all must clearly point uphill.
    assert cosine > (0.25 if (shaping == "raw" and not antithetic) else 0.6), cosine


def test_nes_utilities_weigh_the_top_half_by_log_rank_and_sum_to_zero():
    from jes.strategies.snes import snes_utilities

    fitness = jnp.array([3.0, -2.0, 10.0, 0.5, 7.0, 1.0], jnp.float32)
    weights = np.asarray(jax.jit(lambda f: strategy.shape_fitness(f, "nes_utilities"))(fitness))
    k = np.arange(1, 7, dtype=np.float64)
    raw = np.maximum(0.0, np.log(6 / 2 + 1) - np.log(k))
    expected_by_rank = raw / raw.sum() - 1 / 6            # best first
    ranks = np.argsort(np.argsort(-np.asarray(fitness)))  # 0: best
    np.testing.assert_allclose(weights, expected_by_rank[ranks], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(weights.sum(), 0.0, atol=1e-6)
    # The three best by log rank; the bottom half (ranks 4-6: log(6/2 + 1) - log(k) <= 0) each pays 1/6 alone.
    assert weights[2] > weights[4] > weights[0] > weights[5]
    np.testing.assert_allclose(weights[[5, 3, 1]], -1 / 6, rtol=1e-6)
    # The same utilities as SNES's own (computed in the graph there), up to float32 rounding.
    np.testing.assert_allclose(np.asarray(strategy.nes_utilities(6)), np.asarray(snes_utilities(6)), atol=1e-7)
    assert strategy.nes_utilities(6).dtype == jnp.float32


def test_nes_utilities_of_ties_are_shared_and_an_all_equal_population_weighs_nothing():
    weights = np.asarray(strategy.shape_fitness(jnp.array([1.0, 5.0, 5.0, 0.0]), "nes_utilities"))
    assert weights[1] == weights[2]
    u = np.asarray(strategy.nes_utilities(4))
    np.testing.assert_allclose(weights[[1, 0, 3]], [(u[0] + u[1]) / 2, u[2], u[3]], rtol=1e-6)
    np.testing.assert_array_equal(strategy.shape_fitness(jnp.full(8, 2.5), "nes_utilities"), 0.0)


def test_the_command_line_offers_every_fitness_shaping():
    from jes import cli

    parser = cli._parser()
    train = next(a for a in parser._subparsers._group_actions[0].choices["train"]._actions
                 if "--fitness-shaping" in a.option_strings)
    assert tuple(train.choices) == strategy.FITNESS_SHAPINGS


def test_odd_antithetic_chunk_rejected():
    with pytest.raises(ValueError, match="whole pairs"):
        strategy.chunk_noise(gen_key(), 0, 3, D, antithetic=True)


@pytest.mark.parametrize("n", [2, 7, 512, 4099])
def test_fitness_ranks_are_the_same_bits_with_the_accelerators_unrolled_search(monkeypatch, n):
    # On a GPU or TPU the ranks' binary search is unrolled (a loop's every iteration waits on the host there): the
    # indices, and so the weights, must not change with it. A fresh function each phase: traced anew, no cache to clear
    from jes.strategies import base, noise

    rng = np.random.default_rng(n)
    fitness = jnp.asarray(np.round(rng.normal(size=n), 1), jnp.float32)   # many ties
    utilities = jnp.asarray(rng.normal(size=n), jnp.float32)

    def run():
        ranks = jax.jit(lambda f: noise.centered_ranks(f))
        weights = jax.jit(lambda f, u: base.sorted_utilities(f, u))
        return ([np.asarray(ranks(fitness)).view(np.uint32), np.asarray(weights(fitness, utilities)).view(np.uint32)],
                ranks.lower(fitness).as_text().count("stablehlo.while"))

    on_cpu, cpu_loops = run()
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    unrolled, accelerator_loops = run()
    assert cpu_loops == 2 and accelerator_loops == 0
    for a, b in zip(on_cpu, unrolled):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("strategy_name, optimizer", [("openai_es", "adam"), ("snes", None)])
def test_a_run_gives_the_same_bits_with_the_accelerators_unrolled_ranks_search(monkeypatch, strategy_name, optimizer):
    # The whole step, as its ranks' search is compiled inside it with the rest of the update
    import jes
    from jes.strategies import noise

    def run():
        config = jes.ESConfig(num_members=32, num_generations=2, max_episode_steps=20, eval_episodes=1,
                              perturbation=jes.LowRank(1) if strategy_name == "openai_es" else "full_rank")
        result = jes.train(jes.MLPPolicy((16,)), "Pendulum-v1", optimizer, strategy=strategy_name, config=config,
                           progress=False, log_dir=None)
        # the search is part of the program cache's key: the suite's cache cannot hand the second run the first's
        assert result.trainer.program_parts()["ranks_search"] == noise.search_method()
        return np.asarray(result.flat_params).view(np.uint32)

    on_cpu = run()
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert noise.search_method() == "scan_unrolled"
    np.testing.assert_array_equal(run(), on_cpu)
