"""The strategy contract, parametrised over jes.strategies.names(): a new strategy is tested by registering it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jes
from jes import cli
from jes.strategy_context import build_context
from jes.strategies import noise

NAMES = jes.strategies.names()
MIRRORED = {"openai_es", "pgpe", "ars"}
ADAPTIVE_SIGMA = {"pgpe", "snes", "sep_cma_es", "cma_es"}
D = 6


def _context(name, num_members=8, optimizer=None):
    strategy = jes.strategies.get(name)
    config = jes.ESConfig(num_members=num_members, antithetic=True)
    ctx, _ = build_context(strategy, optimizer, config, D)
    return strategy, ctx


def test_names_and_lookup():
    assert set(NAMES) == {"openai_es", "pgpe", "snes", "sep_cma_es", "ars", "cma_es"}
    assert isinstance(jes.strategies.get("sep-cma-es"), jes.strategies.SepCMAES)
    assert isinstance(jes.strategies.get("CMA-ES"), jes.strategies.CMAES)
    pgpe = jes.strategies.PGPE(center_lr=0.3, stdev_lr=0.05, stdev_max_change=0.1)
    assert jes.strategies.get(pgpe) is pgpe
    with pytest.raises(ValueError, match="valid names are: openai_es, pgpe, snes, sep_cma_es, ars, cma_es"):
        jes.strategies.get("cmaes-full")
    with pytest.raises(TypeError, match="strategy must be a name"):
        jes.strategies.get(3)


@pytest.mark.parametrize("strategy", ["openai_es", "ars"])
def test_a_strategy_name_given_as_the_optimizer_is_named_as_a_strategy(strategy):
    # jes.optimize takes the strategy third, jes.train the optimizer: the error says which is which
    with pytest.raises(ValueError, match="'SNES' is a strategy, not an optimizer: pass strategy='SNES'"):
        _context(strategy, optimizer="SNES")
    with pytest.raises(ValueError, match="'sep-cma-es' is a strategy"):
        _context(strategy, optimizer="sep-cma-es")
    with pytest.raises(ValueError, match=r"unknown optimizer 'adamw'.*or pass any optax.GradientTransformation"):
        _context("openai_es", optimizer="adamw")


@pytest.mark.parametrize("name", ["snes", "sep_cma_es", "ars", "cma_es"])
def test_strategies_without_an_optimizer_refuse_one(name):
    with pytest.raises(ValueError, match="does not use an optax optimizer"):
        _context(name, optimizer="adam")


@pytest.mark.parametrize("name", ["snes", "sep_cma_es", "ars", "cma_es"])
def test_settings_a_strategy_never_reads_are_refused_not_ignored(name, capsys):
    """learning_rate / weight_decay / fitness_shaping for a strategy with its own update gave the same bits as
    leaving them out; each is refused, in jes.optimize, AskTell, jes.train and jes train, naming the setting."""
    fn = lambda x: jnp.sum(x ** 2)
    for setting, text in ((dict(learning_rate=0.001), "learning_rate=0.001"), (dict(weight_decay=0.5), "weight_decay=0.5"),
                          (dict(fitness_shaping="raw"), "fitness_shaping='raw'")):
        message = rf"{text} would be ignored by strategy '{name}': it moves its mean by its own rule"
        with pytest.raises(ValueError, match=message):
            jes.optimize(fn, jnp.ones(4), name, num_generations=1, **setting)
        with pytest.raises(ValueError, match=message):
            jes.AskTell(name, jnp.ones(4), **setting)
        with pytest.raises(ValueError, match=message):
            jes.train(jes.MLPPolicy((4,)), "CartPole-v1", strategy=name, num_members=16, num_generations=1,
                      log_dir=None, progress=False, **setting)
    assert cli.main(["train", "--strategy", name, "--learning-rate", "0.01", "--generations", "1", "--log-dir", "none"]) == 2
    assert f"--learning-rate 0.01 would be ignored by strategy '{name}'" in capsys.readouterr().err
    pgpe = jes.strategies.get("pgpe", center_lr=0.1)
    with pytest.raises(ValueError, match="learning_rate=0.01 would be ignored by strategy 'pgpe': its center_lr=0.1 "
                                         "is the rate; drop it, or drop center_lr"):  # not "use openai_es, pgpe"
        jes.optimize(fn, jnp.ones(4), pgpe, learning_rate=0.01, num_generations=1)


@pytest.mark.parametrize("name", NAMES)
def test_member_is_a_pure_function_of_key_generation_and_index(name):
    strategy, ctx = _context(name)
    state = strategy.init(ctx, jnp.arange(D, dtype=jnp.float32))
    gen_key = noise.generation_key(jax.random.key(7), 3)
    whole = strategy.sample(ctx, state, gen_key, jnp.int32(3), jnp.int32(0), 8)
    second_half = strategy.sample(ctx, state, gen_key, jnp.int32(3), jnp.int32(4), 4)
    np.testing.assert_array_equal(whole[4:], second_half)  # the chunking does not change a member
    again = strategy.sample(ctx, state, noise.generation_key(jax.random.key(7), 3), jnp.int32(3), jnp.int32(0), 8)
    np.testing.assert_array_equal(whole, again)
    other_gen = strategy.sample(ctx, state, noise.generation_key(jax.random.key(7), 4), jnp.int32(4), jnp.int32(0), 8)
    assert not np.array_equal(whole, other_gen)
    if name in MIRRORED:
        mean = np.asarray(state.mean)
        np.testing.assert_allclose(whole[0] - mean, -(whole[1] - mean), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_members_and_statistics_from_the_draws_equal_those_that_draw_their_own(name):
    """Strategy.draw's draws given to sample and chunk_stats (draws=) give the bits of each drawing its own, compiled
    as one program with the draws shared (as jes.optimize's one-chunk step) and as separate programs."""
    strategy, ctx = _context(name)
    state = strategy.init(ctx, jnp.arange(D, dtype=jnp.float32))
    gen_key, generation, start = noise.generation_key(jax.random.key(7), 3), jnp.int32(3), jnp.int32(8)
    weights = jax.tree.map(lambda w: w.astype(jnp.float32),
                           strategy.weights(ctx, state, jnp.sin(jnp.arange(8, dtype=jnp.float32))))

    @jax.jit
    def shared(state):
        draws = strategy.draw(ctx, gen_key, start, 8)
        return (strategy.sample(ctx, state, gen_key, generation, start, 8, draws=draws),
                strategy.chunk_stats(ctx, state, gen_key, generation, start, weights, draws=draws))

    own = (jax.jit(lambda s: strategy.sample(ctx, s, gen_key, generation, start, 8))(state),
           jax.jit(lambda s: strategy.chunk_stats(ctx, s, gen_key, generation, start, weights))(state))
    assert strategy.draw(ctx, gen_key, start, 8) is not None
    for a, b in zip(jax.tree.leaves(shared(state)), jax.tree.leaves(own)):
        assert np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("name", NAMES)
def test_equal_fitness_moves_the_mean_only_where_the_algorithm_says_so(name):
    es = jes.AskTell(name, jnp.ones(D), num_members=8)
    state = es.init(0)
    new, info = es.tell(state, jnp.full(8, 2.5))
    assert int(new.generation) == 1 and int(info["bad_member"]) == -1
    if name in ("sep_cma_es", "cma_es"):  # recombination moves the mean to the weighted mean of the best half
        assert not np.array_equal(new.params, state.params)
    else:  # a mirrored pair, or rank utilities summing to zero, cancel exactly
        np.testing.assert_array_equal(new.params, state.params)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("minimize", [False, True])
def test_update_moves_toward_the_optimum_of_a_quadratic_both_directions(name, minimize):
    target = jnp.linspace(-1.0, 1.0, D)
    loss = lambda x: jnp.sum((x - target) ** 2)
    es = jes.AskTell(name, jnp.zeros(D), num_members=16, minimize=minimize, noise_std=0.1)
    state = es.init(1)
    start = float(loss(es.mean(state)))
    for _ in range(15):
        xs = es.ask(state)
        values = jax.vmap(loss)(xs)
        state, _ = es.tell(state, values if minimize else -values)
    assert float(loss(es.mean(state))) < 0.5 * start


def test_maximising_f_equals_minimising_minus_f_bit_for_bit():
    f = lambda x: jnp.sum(jnp.cos(x) + 0.1 * x)
    up = jes.optimize(f, jnp.zeros(4), "snes", num_generations=5, num_members=8, key=2)
    down = jes.optimize(lambda x: -f(x), jnp.zeros(4), "snes", num_generations=5, num_members=8, key=2, minimize=True)
    assert up.direction == "maximize" and down.direction == "minimize"
    np.testing.assert_array_equal(up.x, down.x)
    assert up.value == -down.value and "minimized" in down.summary()


@pytest.mark.parametrize("name", sorted(ADAPTIVE_SIGMA))
def test_sigma_adapts_to_the_scale_of_the_problem(name):
    sphere = lambda x: jnp.sum(x ** 2)
    # At the optimum with a wide distribution, sigma shrinks...
    near = jes.optimize(sphere, jnp.zeros(D), name, minimize=True, num_generations=30, noise_std=1.0, key=0)
    assert near.history["noise_std"][-1] < 0.5
    # ...and where larger steps pay (maximising a bowl from its bottom: PGPE's symmetric pairs see only
    # the even part of f, so a linear slope would leave its sigma alone by design), sigma grows.
    bowl = jes.optimize(sphere, jnp.zeros(D), name, num_generations=30, noise_std=0.01, key=0)
    assert bowl.history["noise_std"][-1] > 0.02


@pytest.mark.parametrize("name", NAMES)
def test_sphere_acceptance(name):
    """The issue's acceptance: 10-d sphere from 3 * ones, defaults, 400 generations."""
    result = jes.optimize(lambda x: jnp.sum(x ** 2), 3 * jnp.ones(10), name, minimize=True, num_generations=400)
    assert result.value < (1e-6 if name in ADAPTIVE_SIGMA else 1e-2), result.summary()
    assert result.best_value <= result.history["best_value"].min() + 1e-12


def test_ask_tell_matches_optimize_bit_for_bit():
    f = lambda x: -jnp.sum((x - 0.5) ** 2)
    fused = jes.optimize(f, jnp.zeros(5), "pgpe", num_generations=4, num_members=12, chunk_size=4, key=3)
    es = jes.AskTell("pgpe", jnp.zeros(5), num_members=12, chunk_size=4)
    state = es.init(3)
    for _ in range(4):
        state, _ = es.tell(state, jax.vmap(f)(es.ask(state)))
    np.testing.assert_array_equal(fused.x, es.mean(state))


def test_optimize_stops_at_the_target_generation_exactly():
    """Generations are dispatched ahead of reading their metrics back; those past the target are discarded."""
    f = lambda x: jnp.sum((x - 1.0) ** 2)
    stopped = jes.optimize(f, 3 * jnp.ones(6), "snes", minimize=True, num_generations=300, target=1e-3, key=2)
    stop = int(stopped.history["generation"][-1])
    assert 20 < stop < 300 and stopped.value < 1e-3 and stopped.history["mean_value"][-2] >= 1e-3
    plain = jes.optimize(f, 3 * jnp.ones(6), "snes", minimize=True, num_generations=stop, key=2)
    np.testing.assert_array_equal(stopped.x, plain.x)
    np.testing.assert_array_equal(stopped.best_x, plain.best_x)
    np.testing.assert_array_equal(stopped.history["best_value"], plain.history["best_value"])
    assert stopped.num_evaluations == plain.num_evaluations


def test_ask_tell_on_a_pytree_and_non_finite_fitness():
    x0 = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)}
    es = jes.AskTell("snes", x0, num_members=6)
    state = es.init(0)
    xs = es.ask(state)
    assert xs["w"].shape == (6, 2, 3) and xs["b"].shape == (6, 3)
    fitness = jnp.array([1.0, jnp.nan, 0, 0, 0, 0])
    with pytest.raises(jes.NonFiniteValueError, match=r"1 of 6 fitness values are not finite \(member 1: nan\)"):
        es.tell(state, fitness)  # concrete values: raised, as optimize stops
    bad, info = jax.jit(es.tell)(state, fitness)  # traced: the state comes back unchanged, info says why
    assert int(info["bad_member"]) == 1 and int(bad.generation) == 0
    np.testing.assert_array_equal(bad.params, state.params)


def test_optimize_refuses_bad_input():
    with pytest.raises(ValueError, match="scalar"):
        jes.optimize(lambda x: x, jnp.zeros(3), "snes", num_generations=1)
    with pytest.raises(ValueError, match="NaN or inf"):
        jes.optimize(lambda x: jnp.sum(x), jnp.array([0.0, jnp.nan]), "snes", num_generations=1)
    with pytest.raises(ValueError, match="does not use an optax optimizer"):
        jes.optimize(lambda x: jnp.sum(x), jnp.zeros(3), "ars", optimizer="adam", num_generations=1)
    with pytest.raises(TypeError, match="minimize"):
        jes.optimize(lambda x: jnp.sum(x), jnp.zeros(3), "snes", minimize="yes", num_generations=1)
    with pytest.raises(ValueError, match="noise_std schedule"):
        jes.optimize(lambda x: jnp.sum(x), jnp.zeros(3), "snes", noise_std=lambda g: 0.1, num_generations=1)


def test_sep_cma_es_keeps_the_covariance_scale_in_sigma():
    """On Rosenbrock's ridge sigma and diag_c drift apart until float32 underflows diag_c; the update
    keeps mean(diag_c) at 1 (before the fix: mean(diag_c) 1.7e-8 after 400 generations here)."""
    rosenbrock = lambda x: jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)
    result = jes.optimize(rosenbrock, jnp.zeros(D), "sep_cma_es", minimize=True, num_generations=400, key=0)
    diag_c = np.asarray(result.state.strategy.diag_c)
    assert abs(diag_c.mean() - 1.0) < 1e-4 and diag_c.min() > 1e-3


def _sep_cma_reference(mean, sigma, diag_c, path_sigma, path_c, z, loss, generation):
    """One sep-CMA-ES generation in float64 from Hansen's tutorial (arXiv:1604.00772) with Ros & Hansen's
    (2008) ``(d + 2) / 3`` learning-rate factor, written out independently of jes's code."""
    n, d = z.shape
    mu = n // 2
    w = np.log(mu + 0.5) - np.log(np.arange(1, mu + 1))
    w /= w.sum()
    mu_eff = 1 / np.sum(w ** 2)
    c_s = (mu_eff + 2) / (d + mu_eff + 5)
    d_s = 1 + 2 * max(0.0, np.sqrt((mu_eff - 1) / (d + 1)) - 1) + c_s
    c_c = 4 / (d + 4)
    c_1 = 2 / ((d + 1.3) ** 2 + mu_eff) * (d + 2) / 3
    c_mu = min(1 - c_1, 2 * (mu_eff - 2 + 1 / mu_eff) / ((d + 2) ** 2 + mu_eff) * (d + 2) / 3)
    chi = np.sqrt(d) * (1 - 1 / (4 * d) + 1 / (21 * d ** 2))
    best = np.argsort(loss)[:mu]
    y = np.sqrt(diag_c) * z[best]                       # y_k = C^(1/2) z_k, best first
    y_w = w @ y
    new_mean = mean + sigma * y_w
    path_sigma = (1 - c_s) * path_sigma + np.sqrt(c_s * (2 - c_s) * mu_eff) * (w @ z[best])  # C^(-1/2) y_w
    h = float(np.linalg.norm(path_sigma) / np.sqrt(1 - (1 - c_s) ** (2 * (generation + 1))) < (1.4 + 2 / (d + 1)) * chi)
    path_c = (1 - c_c) * path_c + h * np.sqrt(c_c * (2 - c_c) * mu_eff) * y_w
    delta = (1 - h) * c_c * (2 - c_c)
    diag_c = (1 - c_1 - c_mu) * diag_c + c_1 * (path_c ** 2 + delta * diag_c) + c_mu * (w @ y ** 2)
    sigma = sigma * np.exp(c_s / d_s * (np.linalg.norm(path_sigma) / chi - 1))
    return (new_mean, sigma, diag_c, path_sigma, path_c), h


@pytest.mark.parametrize("problem", ["quadratic", "slope"])
def test_sep_cma_es_generations_match_a_float64_reference(problem):
    """Four generations of ask/tell against the tutorial's equations: mean, the distribution's per-coordinate
    std ``sigma * sqrt(diag_c)``, both evolution paths (``p_c`` compared as ``sigma * p_c``, which does not
    depend on how the scale is split between sigma and diag_c). On the slope, p_sigma outgrows the
    threshold and h_sigma = 0 stalls p_c."""
    if problem == "quadratic":
        loss, num_members = lambda x: jnp.sum(jnp.arange(1.0, D + 1) * (x - 0.3) ** 2) + x[0] * x[1], 10
    else:
        loss, num_members = lambda x: jnp.sum(jnp.arange(1.0, D + 1) * x), 40
    es = jes.AskTell("sep_cma_es", jnp.zeros(D), num_members=num_members, minimize=True, noise_std=0.5)
    state = es.init(3)
    ref, stalled = [np.zeros(D), 0.5, np.ones(D), np.zeros(D), np.zeros(D)], []
    for generation in range(4):
        xs = np.asarray(es.ask(state), np.float64)
        s = state.strategy
        z = (xs - np.asarray(s.mean)) / (float(s.sigma) * np.sqrt(np.asarray(s.diag_c, np.float64)))
        values = np.asarray(jax.vmap(loss)(jnp.asarray(xs, jnp.float32)), np.float64)
        ref, h = _sep_cma_reference(*ref, z, values, generation)
        stalled.append(h == 0)
        state, _ = es.tell(state, jnp.asarray(values, jnp.float32))
        s = state.strategy
        np.testing.assert_allclose(s.mean, ref[0], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(float(s.sigma) * np.sqrt(s.diag_c), ref[1] * np.sqrt(ref[2]), rtol=1e-4)
        np.testing.assert_allclose(s.path_sigma, ref[3], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(float(s.sigma) * np.asarray(s.path_c), ref[1] * ref[4], rtol=1e-4, atol=1e-6)
    assert any(stalled) == (problem == "slope")


@pytest.mark.parametrize("name, field, for_policies, for_functions", [
    ("ars", "step_size", 1.0, 0.1), ("snes", "mean_lr", 20.0, 1.0), ("sep_cma_es", "mean_lr", 10.0 / 1.5, 1.0),
    ("sep_cma_es", "sigma_scale", 1.5, 1.0)])
def test_per_use_defaults(name, field, for_policies, for_functions):
    """A step left at None is the policies' default in jes.train and the functions' one in optimize/AskTell;
    a step you set is kept for both, and a non-positive one is refused."""
    strategy = jes.strategies.get(name)
    assert getattr(strategy, field) is None and strategy.resolved(field) == for_policies
    assert getattr(strategy.for_functions(), field) == for_functions
    assert getattr(jes.strategies.get(name, **{field: 0.3}).for_functions(), field) == 0.3
    assert getattr(jes.AskTell(name, jnp.zeros(4), num_members=8).problem.strategy, field) == for_functions
    for value in (0.0, float("inf"), float("nan")):  # inf was taken: the first update was "not finite"
        with pytest.raises(ValueError, match=f"{name} {field} must be positive and finite"):
            jes.AskTell(jes.strategies.get(name, **{field: value}), jnp.zeros(4), num_members=8)


def test_snes_policy_defaults_weigh_members_by_linear_ranks():
    """For policies SNES's utilities are centred linear ranks scaled to the log utilities' L2 norm; for functions
    (and when switched off) the paper's log utilities of the top half (issue 8)."""
    from jes.strategies.snes import linear_utilities, snes_utilities
    strategy = jes.strategies.get("snes")
    assert strategy.resolved("linear_utilities") is True and strategy.for_functions().linear_utilities is False
    assert jes.AskTell("snes", jnp.zeros(4), num_members=8).problem.strategy.linear_utilities is False
    with pytest.raises(ValueError, match="snes linear_utilities must be True or False"):
        jes.AskTell(jes.strategies.SNES(linear_utilities=1), jnp.zeros(4), num_members=8)
    for n in (8, 9, 512):
        u = np.asarray(linear_utilities(n))
        assert abs(u.sum()) < 1e-6 and np.all(np.diff(u) < 0)
        np.testing.assert_allclose(np.linalg.norm(u), np.linalg.norm(snes_utilities(n)), rtol=1e-5)
        np.testing.assert_allclose(np.diff(u), np.diff(u)[0], rtol=1e-4)
    ctx = jes.strategies.Context(num_params=D, num_members=8, noise_std=0.2)
    fitness = jnp.asarray([3.0, 1.0, 4.0, 1.5, 5.0, 9.0, 2.0, 6.0])
    order = np.argsort(-np.asarray(fitness))
    for s, ref in ((strategy, linear_utilities(8)), (strategy.for_functions(), snes_utilities(8))):
        w = np.asarray(s.weights(ctx, None, fitness))
        np.testing.assert_allclose(w[order], ref, rtol=1e-6)


def _learning_rate(strategy, optimizer=None, num_params=D, **config):
    ctx, _ = build_context(strategy, optimizer, jes.ESConfig(num_members=8, **config), num_params)
    return float(ctx.optimizer.init(jnp.zeros(num_params)).hyperparams["learning_rate"])


def test_pgpe_clipup_step_follows_the_search_radius():
    """PGPE's default ClipUp step is 0.4 of the initial radius sigma * sqrt(P); set ones win; other optimizers keep theirs."""
    pgpe = jes.strategies.PGPE()
    assert _learning_rate(pgpe, num_params=100) == pytest.approx(0.4 * 0.2 * 10)
    assert _learning_rate(pgpe, "ClipUp", num_params=100, noise_std=0.5) == pytest.approx(0.4 * 0.5 * 10)
    assert _learning_rate(jes.strategies.PGPE(stdev_init=0.1), num_params=400) == pytest.approx(0.4 * 0.1 * 20)
    assert _learning_rate(jes.strategies.PGPE(center_lr=0.7), num_params=100) == pytest.approx(0.7)
    assert _learning_rate(pgpe, num_params=100, learning_rate=0.3) == pytest.approx(0.3)
    assert _learning_rate(pgpe, "adam", num_params=100) == pytest.approx(0.2)  # adam's own default
    # jes.optimize moves PGPE's mean with SGD at its default step, as before.
    ctx = jes.AskTell("pgpe", jnp.zeros(4), num_members=8).problem.ctx
    assert float(ctx.optimizer.init(jnp.zeros(4)).hyperparams["learning_rate"]) == 1.0


def test_sep_cma_es_policy_defaults_sample_wider_and_correct_the_csa_start():
    """For policies: sigma starts at 1.5 x noise_std and CSA divides ||p_sigma|| by sqrt(1 - (1 - c_s)^(2t));
    for functions (and when switched off) the standard CSA from sigma = noise_std (issue 8)."""
    strategy = jes.strategies.get("sep_cma_es")
    assert strategy.resolved("unbiased_csa") is True and strategy.for_functions().unbiased_csa is False
    assert jes.AskTell("sep_cma_es", jnp.zeros(4), num_members=8).problem.strategy.unbiased_csa is False
    assert jes.strategies.get("sep_cma_es", unbiased_csa=False).for_functions().unbiased_csa is False
    with pytest.raises(ValueError, match="sep_cma_es unbiased_csa must be True or False"):
        jes.AskTell(jes.strategies.SepCMAES(unbiased_csa=1), jnp.zeros(4), num_members=8)
    ctx = jes.strategies.Context(num_params=D, num_members=8, noise_std=0.2)
    assert float(strategy.init(ctx, jnp.zeros(D)).sigma) == pytest.approx(0.3)
    assert float(strategy.for_functions().init(ctx, jnp.zeros(D)).sigma) == pytest.approx(0.2)
    assert float(jes.strategies.SepCMAES(sigma_init=0.25).init(ctx, jnp.zeros(D)).sigma) == pytest.approx(0.25)

    plain = jes.strategies.SepCMAES(mean_lr=1.0, sigma_scale=1.0, unbiased_csa=False)
    unbiased = jes.strategies.SepCMAES(mean_lr=1.0, sigma_scale=1.0, unbiased_csa=True)
    state = plain.init(ctx, jnp.zeros(D))
    stats = {"z": jnp.linspace(-0.5, 0.5, D), "z2": jnp.full((D,), 1.1)}
    fitness = jnp.zeros(8)
    c = plain.constants(D, 8)
    for generation in (0, 5):
        g = jnp.int32(generation)
        a, _ = plain.update(ctx, state, stats, fitness, g)
        b, _ = unbiased.update(ctx, state, stats, fitness, g)
        np.testing.assert_array_equal(a.mean, b.mean)
        np.testing.assert_array_equal(a.path_sigma, b.path_sigma)
        norm = float(jnp.linalg.norm(a.path_sigma))
        bias = (1 - (1 - c["c_sigma"]) ** (2 * (generation + 1))) ** 0.5
        expected = np.exp(c["c_sigma"] / c["d_sigma"] * norm / c["chi_n"] * (1 / bias - 1))
        assert float(b.sigma) / float(a.sigma) == pytest.approx(expected, rel=1e-5)


def test_clipup_reads_a_learning_rate_schedule_at_each_step():
    """clipup(schedule) took the schedule's step-0 value for ever."""
    import optax

    opt = jes.optimizers.clipup(optax.linear_schedule(1.0, 0.0, 4), momentum=0.0)
    params = jnp.zeros(3)
    state = opt.init(params)
    steps = []
    for _ in range(5):
        update, state = opt.update(jnp.array([1.0, 0.0, 0.0]), state)
        steps.append(float(update[0]))
    assert steps == [-1.0, -0.75, -0.5, -0.25, 0.0]
    constant = jes.optimizers.clipup(0.5, momentum=0.0)  # a constant keeps the state older checkpoints hold
    assert type(constant.init(params)).__name__ == "ClipUpState"


@pytest.mark.parametrize("name", ["pgpe", "ars"])
def test_antithetic_false_is_refused_by_strategies_that_always_mirror(name, capsys):
    """pgpe and ars evaluate mirrored pairs by definition: antithetic=False was ignored (and recorded as False);
    it is refused, and an odd population is told to go even, not to add --no-antithetic."""
    with pytest.raises(ValueError, match=rf"antithetic=False would be ignored by strategy '{name}': it evaluates "
                                         r"mirrored pairs by definition"):
        jes.train(jes.MLPPolicy((4,)), "CartPole-v1", strategy=name, num_members=16, num_generations=1,
                  antithetic=False, log_dir=None, progress=False)
    assert cli.main(["train", "--strategy", name, "--no-antithetic", "--generations", "1", "--log-dir", "none"]) == 2
    assert f"--no-antithetic would be ignored by strategy '{name}'" in capsys.readouterr().err
    assert cli.main(["train", "--strategy", name, "--population", "31", "--generations", "1", "--log-dir", "none"]) == 2
    err = capsys.readouterr().err
    assert "--population 31 is odd" in err and "even population (e.g. 32)" in err and "--no-antithetic" not in err


@pytest.mark.parametrize("strategy, field", [("snes", "sigma_init"), ("sep_cma_es", "sigma_init"), ("cma_es", "sigma_init"),
                                             ("ars", "noise_std_init"), ("pgpe", "stdev_init"), ("pgpe", "center_lr")])
@pytest.mark.parametrize("value", [0.0, -0.1, float("inf"), float("nan")])
def test_initial_sigmas_and_pgpe_center_lr_must_be_positive_and_finite(strategy, field, value):
    """SNES/SepCMAES/ARS took a zero, negative or non-finite initial sigma; PGPE's refusal named learning_rate
    with a number derived from stdev_init or center_lr. Each names its own field."""
    with pytest.raises(ValueError, match=rf"{strategy} {field} must be positive and finite \(or None for "):
        jes.AskTell(jes.strategies.get(strategy, **{field: value}), jnp.zeros(4), num_members=8)


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), "0.1"])
def test_snes_sigma_lr_must_be_a_finite_number_at_least_zero(value):
    """SNES(sigma_lr=-1) ran and diverged (sigma grew every generation, f 1e15 from 3); NaN stopped the run as "the
    strategy's update is not finite", naming no field."""
    with pytest.raises(ValueError, match=r"snes sigma_lr must be a finite number >= 0 \(0 keeps sigma fixed"):
        jes.AskTell(jes.strategies.SNES(sigma_lr=value), jnp.zeros(4), num_members=8)
    jes.AskTell(jes.strategies.SNES(sigma_lr=0.0), jnp.zeros(4), num_members=8)  # a fixed sigma: allowed


@pytest.mark.parametrize("value", [2.5, 2.0, True, 0, 5])
def test_ars_top_directions_must_be_a_whole_number_of_directions(value):
    """ARS(top_directions=2.5) was taken and failed in the weights with "'float' object cannot be interpreted as an
    integer"."""
    with pytest.raises(ValueError, match=r"ars top_directions must be in 1..4 \(the number of directions\)"):
        jes.AskTell(jes.strategies.ARS(top_directions=value), jnp.zeros(4), num_members=8)
    jes.AskTell(jes.strategies.ARS(top_directions=np.int64(2)), jnp.zeros(4), num_members=8)
