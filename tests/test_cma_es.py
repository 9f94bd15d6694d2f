"""Full-covariance CMA-ES (jes/strategies/cma_es.py): the update against the tutorial's equations in float64,
its constants against pycma's, and the issue's acceptance on 10-d Rosenbrock. (The registry-wide contract,
devices, workers and resume: tests/test_strategies.py, tests/test_strategies_e2e.py, tests/test_distributed.py.)"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest


import jes
from jes.blackbox import FunctionProblem, _config, run_optimization
from jes.strategies import CMAES, Context, noise

cma = pytest.importorskip("cma")

D = 5


def rosenbrock(x):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def _tutorial_generation(state, z, loss, generation, n):
    """One CMA-ES generation in float64, written from Hansen's tutorial (arXiv:1604.00772, Table 1 and
    eqs. 39-47, active CMA) with the whole population in memory, independently of jes's code."""
    mean, sigma, cov, basis, scales, p_s, p_c = state
    d = mean.shape[0]
    mu = n // 2
    raw = np.log((n + 1) / 2) - np.log(np.arange(1, n + 1))
    mu_eff = raw[:mu].sum() ** 2 / (raw[:mu] ** 2).sum()
    mu_eff_minus = raw[mu:].sum() ** 2 / (raw[mu:] ** 2).sum()
    c_s = (mu_eff + 2) / (d + mu_eff + 5)
    d_s = 1 + 2 * max(0.0, np.sqrt((mu_eff - 1) / (d + 1)) - 1) + c_s
    c_c = (4 + mu_eff / d) / (d + 4 + 2 * mu_eff / d)
    c_1 = 2 / ((d + 1.3) ** 2 + mu_eff)
    c_mu = min(1 - c_1, 2 * (mu_eff - 2 + 1 / mu_eff) / ((d + 2) ** 2 + mu_eff))
    alpha = min(1 + c_1 / c_mu, 1 + 2 * mu_eff_minus / (mu_eff + 2), (1 - c_1 - c_mu) / (d * c_mu))
    w = np.where(raw >= 0, raw / raw[raw >= 0].sum(), alpha * raw / -raw[raw < 0].sum())
    w = w.astype(np.float32).astype(np.float64)  # jes keeps the rank weights (constants) in float32
    chi = np.sqrt(d) * (1 - 1 / (4 * d) + 1 / (21 * d ** 2))
    order = np.argsort(loss)
    y = (z @ np.diag(scales) @ basis.T)[order]                    # y_k = B D z_k, best first
    inv_sqrt = basis @ np.diag(1 / scales) @ basis.T               # C^(-1/2) of the sampling distribution
    y_w = w[:mu] @ y[:mu]
    new_mean = mean + sigma * y_w
    p_s = (1 - c_s) * p_s + np.sqrt(c_s * (2 - c_s) * mu_eff) * inv_sqrt @ y_w
    h = float(np.linalg.norm(p_s) / np.sqrt(1 - (1 - c_s) ** (2 * (generation + 1))) < (1.4 + 2 / (d + 1)) * chi)
    p_c = (1 - c_c) * p_c + h * np.sqrt(c_c * (2 - c_c) * mu_eff) * y_w
    w_circ = np.where(w >= 0, w, w * d / np.sum((y @ inv_sqrt.T) ** 2, axis=1))
    delta = (1 - h) * c_c * (2 - c_c)
    cov = ((1 + c_1 * delta - c_1 - c_mu * w.sum()) * cov + c_1 * np.outer(p_c, p_c)
           + c_mu * (w_circ[:, None] * y).T @ y)
    sigma = sigma * np.exp(min(1.0, c_s / d_s * (np.linalg.norm(p_s) / chi - 1)))
    eigenvalues, basis = np.linalg.eigh(cov)
    return (new_mean, sigma, cov, basis, np.sqrt(eigenvalues), p_s, p_c), h


@pytest.mark.parametrize("problem", ["quadratic", "slope"])
def test_generations_match_a_float64_reference(problem):
    """Five generations of jes's cma_es in float64 (JAX x64 mode), through the strategy seam with the population
    in two chunks, against the tutorial's equations in numpy: mean, sigma, covariance, both paths. On the
    slope p_sigma outgrows the threshold and h_sigma = 0 stalls p_c."""
    n = 10 if problem == "quadratic" else 40
    if problem == "quadratic":
        loss = lambda x: np.sum(np.arange(1.0, D + 1) * (x - 0.3) ** 2) + x[0] * x[1]
    else:
        loss = lambda x: np.sum(np.arange(1.0, D + 1) * x)
    strategy = CMAES(eigen_interval=1)
    ctx = Context(num_params=D, num_members=n, noise_std=0.5)
    key = jax.random.key(3)
    with jax.enable_x64(True):
        state = strategy.init(ctx, jnp.zeros(D, jnp.float64))
        ref = (np.zeros(D), 0.5, np.eye(D), np.eye(D), np.ones(D), np.zeros(D), np.zeros(D))
        stalled = []
        for generation in range(5):
            g = jnp.int32(generation)
            gen_key = noise.generation_key(key, g)
            xs = np.concatenate([np.asarray(strategy.sample(ctx, state, gen_key, g, jnp.int32(s), n // 2))
                                 for s in (0, n // 2)])
            assert xs.dtype == np.float64
            z = np.asarray(noise.chunk_noise(gen_key, 0, n, D, False), np.float64)
            values = np.array([loss(x) for x in xs])
            np.testing.assert_allclose(xs, ref[0] + ref[1] * z @ np.diag(ref[4]) @ ref[3].T, rtol=1e-9, atol=1e-12)
            ref, h = _tutorial_generation(ref, z, values, generation, n)
            stalled.append(h == 0)
            weights = strategy.weights(ctx, state, jnp.asarray(-values))  # jes maximises
            halves = [jax.tree.map(lambda w: w[s:s + n // 2], weights) for s in (0, n // 2)]
            parts = [strategy.chunk_stats(ctx, state, gen_key, g, jnp.int32(s), w) for s, w in zip((0, n // 2), halves)]
            stats = jax.tree.map(lambda a, b: a + b, *parts)
            state, _ = strategy.update(ctx, state, stats, jnp.asarray(-values), g)
            for name, mine, theirs in (("mean", state.mean, ref[0]), ("sigma", state.sigma, ref[1]),
                                       ("cov", state.cov, ref[2]), ("path_sigma", state.path_sigma, ref[5]),
                                       ("path_c", state.path_c, ref[6])):
                np.testing.assert_allclose(np.asarray(mine), theirs, rtol=1e-10, atol=1e-12, err_msg=name)
            # the sampling distribution after the eigendecomposition is the covariance
            np.testing.assert_allclose(np.asarray(state.basis * state.scales ** 2) @ np.asarray(state.basis).T,
                                       ref[2], rtol=1e-10, atol=1e-12)
    assert any(stalled) == (problem == "slope")


@pytest.mark.parametrize("d, n", [(10, 10), (6, 12), (3, 7)])
def test_constants_agree_with_pycma_where_both_follow_the_tutorial(d, n):
    """Positive recombination weights, mu_eff, c_1 and c_c are pycma 4's; pycma 4 departs from the tutorial in
    c_sigma (``/(d + mu_eff + 3)``), c_mu and the negative weights' scale, which jes keeps as the tutorial has them."""
    es = cma.CMAEvolutionStrategy(np.zeros(d), 0.5, {"popsize": n, "verbose": -9})
    c = CMAES.constants(d, n)
    theirs = np.asarray(es.sp.weights)
    np.testing.assert_allclose(c["weights"][: n // 2], theirs[: n // 2], rtol=1e-12)
    assert np.all(np.asarray(c["weights"][n // 2:]) <= 0) and np.all(theirs[n // 2:] <= 0)
    assert c["mu_eff"] == pytest.approx(es.sp.weights.mueff, rel=1e-12)
    assert c["c_1"] == pytest.approx(es.sp.c1, rel=1e-12) and c["c_c"] == pytest.approx(es.sp.cc, rel=1e-12)


def test_lazy_eigendecomposition_keeps_the_basis_between_updates():
    """The tutorial's interval max(1, 1 / (10 d (c_1 + c_mu))) is 1 below d ~ 200; set, the basis the members are
    drawn from changes only every ``eigen_interval`` generations while the covariance changes every generation."""
    assert CMAES().eigen_interval_for(10, 10) == 1 and CMAES().eigen_interval_for(1000, 24) > 1
    es = jes.AskTell(CMAES(eigen_interval=3), jnp.zeros(D), num_members=8, minimize=True, noise_std=0.5)
    state = es.init(0)
    bases, covs = [], []
    for _ in range(6):
        state, _ = es.tell(state, jax.vmap(lambda x: jnp.sum(jnp.arange(1.0, D + 1) * x ** 2))(es.ask(state)))
        bases.append(np.asarray(state.strategy.basis))
        covs.append(np.asarray(state.strategy.cov))
    assert np.array_equal(bases[0], np.eye(D)) and np.array_equal(bases[1], np.eye(D))
    assert not np.array_equal(bases[2], bases[1]) and np.array_equal(bases[3], bases[2])
    assert np.array_equal(bases[4], bases[2]) and not np.array_equal(bases[5], bases[4])
    assert all(not np.array_equal(a, b) for a, b in zip(covs, covs[1:]))


def test_refuses_a_covariance_that_would_not_fit_and_names_the_alternatives():
    with pytest.raises(ValueError, match="use sep_cma_es .*snes / openai_es"):
        CMAES().validate(Context(num_params=20_000, num_members=16))
    with pytest.raises(ValueError, match="max_params=8"):
        jes.optimize(lambda x: jnp.sum(x ** 2), jnp.zeros(9), CMAES(max_params=8), num_generations=1)
    with pytest.raises(ValueError, match="does not use an optax optimizer"):
        jes.optimize(lambda x: jnp.sum(x ** 2), jnp.zeros(3), "cma_es", optimizer="adam", num_generations=1)
    with pytest.raises(ValueError, match="eigen_interval"):
        CMAES(eigen_interval=0).validate(Context(num_params=3, num_members=8))


@pytest.fixture(scope="module")
def rosenbrock_runs():
    """10-d Rosenbrock from zeros, sigma0 0.5, the default population (10), seeds 0-4: jes and pycma."""
    strategy = jes.strategies.get("cma_es")
    n = strategy.default_population(10)
    config = _config(n, 10_000 // (n + 1), 0.5, None, "centered_ranks", 0.0, None, strategy)
    problem = FunctionProblem(rosenbrock, jnp.zeros(10), strategy, config, minimize=True)
    ours = [run_optimization(problem, key=seed, target=1e-8) for seed in range(5)]
    theirs = []
    f = lambda x: float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2))
    for seed in range(5):
        es = cma.CMAEvolutionStrategy(np.zeros(10), 0.5, {"seed": seed + 1, "verbose": -9, "maxfevals": 30_000,
                                                          "tolfun": 0, "tolx": 0, "tolfunhist": 0})
        while not es.stop() and f(es.mean) >= 1e-8:
            xs = es.ask()
            es.tell(xs, [f(x) for x in xs])
        theirs.append(es.countevals if f(es.mean) < 1e-8 else None)
    return ours, theirs


def test_rosenbrock_acceptance(rosenbrock_runs):
    """The issue's acceptance: 10-d Rosenbrock from zeros to f < 1e-8 within 10^4 evaluations (population
    and mean counted) on 5 of 5 seeds."""
    ours, _ = rosenbrock_runs
    for r in ours:
        assert r.value < 1e-8 and r.num_evaluations <= 10_000, r.summary()


def test_rosenbrock_evaluations_are_within_pycmas_spread(rosenbrock_runs):
    """A loose bound (benchmarks/pycma_compare.py prints the table): jes's median within 1.3x pycma's,
    counting the population only, as pycma does."""
    ours, theirs = rosenbrock_runs
    pop = [len(r.history["generation"]) * r.problem.config.num_members for r in ours]
    solved = [e for e in theirs if e is not None]
    assert len(solved) >= 3, theirs
    assert np.median(pop) <= 1.3 * np.median(solved), (pop, theirs)
