"""Box constraints (jes/bounds.py and ``bounds=`` of jes.optimize / jes.AskTell): pycma's BoundTransform map, the
function never called outside the box, results in the box, refusals, and the same bits run to run and over devices."""
import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jes
from jes import bounds as box
from subprocess_for_tests import checkout_env

cma = pytest.importorskip("cma")

# Sides of every kind: a unit box, a symmetric one, pycma's docstring's [1, 11], one-sided both ways, large and
# tiny magnitudes, a box 1e-6 wide (its quadratic zones meet in the middle) and an unbounded coordinate.
LOWER = np.array([0.0, -1.0, 1.0, -np.inf, 2.0, -1e3, 5.0, -np.inf, 0.0])
UPPER = np.array([1.0, 1.0, 11.0, 5.0, np.inf, 1e-3, 5.0 + 1e-6, np.inf, 1e9])
GRID = np.concatenate([np.linspace(-30, 30, 6001), [-1e6, 1e6, -1e12, 1e12, 1234.5678, -0.15, 1.05]])


def sphere_to(point):
    return lambda x: jnp.sum((x - point) ** 2)


def test_to_box_is_pycmas_bound_transform_on_a_grid_reaching_far_outside():
    """The same values as ``cma.BoundTransform(bounds).repair`` up to rounding (float64): within 2 ulps of
    ``max(|x|, |y|)`` (the period shift of a far point is rounded at ``|x|``, and XLA fuses a multiply and a
    subtraction into one FMA where NumPy rounds twice), and always inside the box, also where pycma's rounding of
    a point 1e12 out, 1e6 periods of a box 1e-6 wide, is not."""
    handler = cma.BoundTransform([list(LOWER), list(UPPER)])
    points = np.broadcast_to(GRID[:, None], (GRID.size, LOWER.size)).copy()
    theirs = np.array([handler.repair(row.copy()) for row in points])
    with jax.enable_x64(True):
        ours = np.asarray(jax.jit(box.to_box)(jnp.asarray(points), jnp.asarray(LOWER), jnp.asarray(UPPER)))
        al, au = (np.asarray(m) for m in box.margins(jnp.asarray(LOWER), jnp.asarray(UPPER)))
    assert ours.dtype == np.float64
    assert ((LOWER <= ours) & (ours <= UPPER)).all()
    unresolved = (np.abs(points) > 1e11) & (UPPER - LOWER < 1e-5)  # rounding at |x| exceeds the whole box there
    ulps = np.abs(ours - theirs) / np.spacing(np.maximum(np.abs(points), np.abs(theirs)))
    assert ulps[~unresolved].max() <= 2, ulps[~unresolved].max()
    with jax.enable_x64(True):  # the map the problems use: the box's constants made by NumPy on the host
        hosts = np.asarray(jax.jit(box.into_box)(jnp.asarray(points), jax.tree.map(jnp.asarray,
                                                                                   box.box_of(LOWER, UPPER))))
    assert ((LOWER <= hosts) & (hosts <= UPPER)).all()
    ulps = np.abs(hosts - theirs) / np.spacing(np.maximum(np.abs(points), np.abs(theirs)))
    assert ulps[~unresolved].max() <= 2, ulps[~unresolved].max()
    assert np.array_equal(al[:3], [0.05, 0.05, 0.05]) and au[2] == 0.55  # pycma's margin_width2
    inside = (points >= LOWER + al) & (points <= UPPER - au)
    assert np.array_equal(ours[inside], points[inside])  # the identity in the interior, bit for bit
    # the inverse, on points of the box, is pycma's too; and to_box(from_box(y)) gives y back
    targets = np.clip(points, LOWER, UPPER)
    with jax.enable_x64(True):
        back = np.asarray(jax.jit(box.from_box)(jnp.asarray(targets), jnp.asarray(LOWER), jnp.asarray(UPPER)))
        again = np.asarray(jax.jit(box.to_box)(jnp.asarray(back), jnp.asarray(LOWER), jnp.asarray(UPPER)))
    assert np.allclose(back, [handler.inverse(row.copy()) for row in targets], rtol=1e-14, atol=0)
    assert np.allclose(again, targets, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("x64", [False, True])
def test_a_point_too_many_periods_out_to_count_is_still_mapped_into_the_box(x64):
    """In a box so narrow that |x| / period overflows the dtype (float32 (0, 1e-30) at |x| = 1e10), the map gave NaN
    (inf periods shifted, then mirrored: inf - inf); it gives a point of the box, as pycma's repair gives a finite
    one (outside the box, there). A non-finite x still gives NaN, for the search to stop on."""
    with jax.enable_x64(x64):
        dtype = np.float64 if x64 else np.float32
        lower, upper = np.array([0.0, -1.0], dtype), np.array([1e-30 if not x64 else 1e-300, 1.0], dtype)
        points = np.array([[1e10, 1e10], [-1e10, -1e10], [5.7e13, 3.0], [-3e30, 0.5], [0.0, 0.0]], dtype)
        y = np.asarray(jax.jit(box.into_box)(jnp.asarray(points), jax.tree.map(jnp.asarray, box.box_of(lower, upper))))
        assert np.isfinite(y).all() and ((lower <= y) & (y <= upper)).all(), y
        assert np.isnan(np.asarray(box.to_box(jnp.asarray([[np.inf, np.inf]], dtype), lower, upper))).all()


def bits(x):
    """``x``'s bits, to compare with ``np.array_equal`` (float32 as uint32, float64 as uint64)."""
    x = np.asarray(x)
    return x.view(np.uint64 if x.dtype == np.float64 else np.uint32)


@pytest.mark.parametrize("x64", [False, True])
def test_into_box_gives_the_same_bits_in_every_program(x64):
    """A box made once (box_of) maps a point to the same bits with its constants folded into the program or passed
    as arguments, over a population [N, P] or one point [P], in a scan: the points the function gets
    and those results report are the same (a division by a bound-derived value was not: XLA multiplies by the
    reciprocal where it is a constant or broadcast)."""
    with jax.enable_x64(x64):
        dtype = np.float64 if x64 else np.float32
        lower, upper = LOWER.astype(dtype), UPPER.astype(dtype)
        rng = np.random.default_rng(0)
        # every branch: the interior, both quadratic zones, the mirrors, points many periods out
        points = np.concatenate([rng.uniform(-3, 13, (300, LOWER.size)), rng.normal(0, 1e4, (40, LOWER.size)),
                                 np.broadcast_to(GRID[::50, None], (GRID[::50].size, LOWER.size))]).astype(dtype)
        b = box.box_of(lower, upper)
        arguments = jax.tree.map(jnp.asarray, b)
        x = jnp.asarray(points)
        reference = bits(jax.jit(box.into_box)(x, arguments))
        mapped = {
            "constants": jax.jit(lambda x: box.into_box(x, b))(x),
            "vmapped constants": jax.jit(jax.vmap(lambda p: box.into_box(p, b)))(x),
            "one point, arguments": np.stack([jax.jit(box.into_box)(p, arguments) for p in x[:40]]),
            "one point, constants": np.stack([jax.jit(lambda p: box.into_box(p, b))(p) for p in x[:40]]),
            "in a scan, times a function": jax.jit(lambda x: jax.lax.scan(
                lambda c, p: (c, box.into_box(p, b) * 2), 0, x)[1])(x) / 2,
        }  # not eagerly, op by op: it rounds a product before its sum, where compiled programs use one FMA
        for name, y in mapped.items():
            assert np.array_equal(bits(y), reference[:len(y)]), name
        y = np.asarray(jax.jit(box.into_box)(x, arguments))
        assert y.dtype == dtype and ((lower <= y) & (y <= upper)).all()


FIRST = (lambda x: x[0] + 0.0 * x[1], lambda x: float(x[0]))  # the tester's: the value is coordinate 0, exactly
LARGEST = (jnp.max, lambda x: float(np.max(x)))


# Each case had f(x) or f(best_x) one bit off the reported value, and host=True's value off it, before the box's
# constants were made once (keys and dimensions found by trying a few)
@pytest.mark.parametrize("strategy, functions, dimension, keys", [
    ("sep_cma_es", FIRST, 2, (2, 3)), ("snes", LARGEST, 3, (0, 3)), ("cma_es", LARGEST, 2, (1,)),
    ("openai_es", FIRST, 3, (0, 3)),
])
def test_the_function_is_evaluated_at_the_point_reported_bit_for_bit(strategy, functions, dimension, keys):
    """f(result.x) is result.value and f(result.best_x) result.best_value, bit for bit, for functions whose value
    is exactly a coordinate, minimised onto a bound; host=True on the same values is the same run (the values and
    the state), and AskTell told f at ask's points makes the same means and reports the same point as x. (The box's
    constants were folded into the evaluating program and passed to the results' map: values one bit apart.)"""
    fitness_fn, host_fn = functions
    x0 = np.full(dimension, 0.5, np.float32)
    settings = dict(minimize=True, num_generations=30, noise_std=0.3, bounds=(0.0, 1.0))
    for key in keys:
        r = jes.optimize(fitness_fn, jnp.asarray(x0), strategy, key=key, **settings)
        assert np.array_equal(bits(jax.jit(fitness_fn)(r.x)), bits(np.float32(r.value))), (key, r.value)
        assert np.array_equal(bits(jax.jit(fitness_fn)(r.best_x)), bits(np.float32(r.best_value))), key
        h = jes.optimize(host_fn, x0, strategy, key=key, host=True, **settings)
        assert np.array_equal(bits(h.state.params), bits(r.state.params)), key
        assert np.array_equal(bits(np.float32(h.value)), bits(np.float32(r.value))), (key, h.value, r.value)
        assert np.array_equal(bits(np.float32(h.best_value)), bits(np.float32(r.best_value))), key
        assert np.array_equal(bits(h.x), bits(r.x)) and np.array_equal(bits(h.best_x), bits(r.best_x)), key
    es = jes.AskTell(strategy, x0=jnp.asarray(x0), minimize=True, noise_std=0.3, bounds=(0.0, 1.0))
    state = es.init(keys[-1])
    for _ in r.history["generation"]:
        state, _ = es.tell(state, jax.vmap(fitness_fn)(es.ask(state)))
    assert np.array_equal(bits(state.params), bits(r.state.params))
    assert np.array_equal(bits(es.mean(state)), bits(r.x))


def test_the_search_starts_where_pycma_does():
    """x0 on or near a bound starts the search at its preimage, as pycma's ``mean = inverse(x0)``; the reported mean
    is x0 again."""
    x0 = np.array([1.0, 0.5, 0.0, 0.99, 3.0])
    lower, upper = [0, 0, 0, 0, None], [1, 1, 1, 1, None]
    es = cma.CMAEvolutionStrategy(list(x0), 0.3, {"bounds": [lower, upper], "verbose": -9})
    with jax.enable_x64(True):
        ask_tell = jes.AskTell("cma_es", x0, bounds=(lower, upper))
        state = ask_tell.init(0)
        assert np.allclose(np.asarray(state.params), es.mean, rtol=1e-15, atol=1e-15)
        assert np.allclose(np.asarray(ask_tell.mean(state)), x0, rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize("strategy", ["cma_es", "sep_cma_es", "snes"])
def test_a_sphere_whose_optimum_is_outside_the_box_converges_to_its_corner_and_edge(strategy):
    """f = |x - 3|^2 on [-1, 1] x [-1, 2] x [-1, inf) x [-inf, 0.5] x [-1, 10]: the optimum in the box is
    (1, 2, 3, 0.5, 3). Bounded coordinates end within 1e-6 of their bound; the free ones within 2e-3 of 3, as
    close as float32's f (about 11.25, resolved to ~1e-6) can tell."""
    r = jes.optimize(sphere_to(3.0), jnp.zeros(5), strategy, minimize=True, num_generations=300, noise_std=0.5,
                     key=1, bounds=([-1, -1, -1, None, -1], [1, 2, None, 0.5, 10]))
    x = np.asarray(r.x)
    assert np.abs(x[[0, 1, 3]] - [1, 2, 0.5]).max() < 1e-6, x
    assert np.abs(x[[2, 4]] - 3).max() < 2e-3, x
    assert abs(r.value - 11.25) < 1e-5 and abs(r.best_value - 11.25) < 1e-5


def nan_outside(lower, upper, point):
    """|x - point|^2 inside [lower, upper], NaN outside: jes raises NonFiniteValueError at the first point outside."""
    return lambda x: jnp.where(jnp.all((x >= lower) & (x <= upper)), jnp.sum((x - point) ** 2), jnp.nan)


@pytest.mark.parametrize("strategy", ["cma_es", "openai_es", "pgpe", "ars"])
def test_the_function_never_gets_a_point_outside_the_box(strategy):
    """Sigma 5 on a box [-1, 1]^4 with the optimum at 3: most members fall outside in the search's space, and the
    function, NaN outside, is only ever called inside (NaN would stop the run with NonFiniteValueError)."""
    r = jes.optimize(nan_outside(-1.0, 1.0, 3.0), jnp.zeros(4), strategy, minimize=True, num_generations=40,
                     noise_std=5.0, key=2, bounds=(-1, 1))
    for point in (r.x, r.best_x):
        assert ((np.asarray(point) >= -1) & (np.asarray(point) <= 1)).all()
    assert np.isfinite(r.history["mean_value"]).all() and np.isfinite(r.history["best_value"]).all()


def test_restarts_and_callbacks_stay_in_the_box():
    """IPOP restarts: every run's points are in the box (NaN outside), and so are x and best_x of the whole."""
    records = []
    r = jes.optimize(nan_outside(-2.0, 0.5, 1.0), jnp.zeros(3), "sep_cma_es", minimize=True, noise_std=3.0,
                     restarts="ipop", max_restarts=1, max_evaluations=1500, key=3, bounds=(-2, 0.5),
                     callbacks=[records.append])
    assert len(r.runs) == 2 and len(records) == len(r.history["generation"])
    for point in (r.x, r.best_x):
        assert ((np.asarray(point) >= -2) & (np.asarray(point) <= 0.5)).all()
    assert np.allclose(np.asarray(r.x), 0.5, atol=1e-5) and abs(r.value - 0.75) < 1e-4


def test_a_host_function_gets_points_in_the_box_only():
    """host=True: every member and every mean the host function is called with is inside; x and best_x are too."""
    seen = []

    def host_loss(x):
        seen.append(np.array(x, copy=True))
        return float(np.sum((x - 3.0) ** 2))

    r = jes.optimize(host_loss, np.zeros(3, np.float32), "cma_es", minimize=True, noise_std=4.0, num_generations=30,
                     host=True, bounds=(-1, [1, 1, None]), key=4)
    seen = np.array(seen)
    assert len(seen) == r.num_evaluations and (seen >= -1).all() and (seen[:, :2] <= 1).all()
    assert (seen[:, 2] > 1).any()  # the open side is open
    for point in (np.asarray(r.x), np.asarray(r.best_x)):
        assert (point >= -1).all() and (point[:2] <= 1).all()


def test_ask_gives_members_in_the_box_on_the_host_and_in_a_scan():
    es = jes.AskTell("snes", x0=jnp.zeros(4), num_members=16, minimize=True, noise_std=5.0, bounds=(-1, 1))
    state = es.init(0)
    for _ in range(5):
        xs = np.asarray(es.ask(state))
        assert xs.shape == (16, 4) and (xs >= -1).all() and (xs <= 1).all()
        assert (np.abs(np.asarray(es.problem.population(state))) > 1).any()  # the search's own points are not
        state, _ = es.tell(state, np.sum((xs - 3) ** 2, axis=1))
    assert ((np.asarray(es.mean(state)) >= -1) & (np.asarray(es.mean(state)) <= 1)).all()

    @jax.jit
    def generations(state):
        def body(state, _):
            xs = es.ask(state)
            state, info = es.tell(state, jax.vmap(sphere_to(3.0))(xs))
            return state, (jnp.min(xs), jnp.max(xs))
        return jax.lax.scan(body, state, None, length=10)

    _, (low, high) = generations(es.init(0))
    assert (np.asarray(low) >= -1).all() and (np.asarray(high) <= 1).all()


def test_a_pytree_x0_takes_bounds_per_leaf():
    x0 = {"w": jnp.zeros((2, 2)), "b": jnp.zeros(3)}
    lower = {"w": -1.0, "b": None}
    upper = {"w": jnp.array([[1.0, 2.0], [0.5, 1.0]]), "b": jnp.array([0.1, jnp.inf, 1.0])}
    loss = lambda p: jnp.sum((p["w"] - 3) ** 2) + jnp.sum((p["b"] - 3) ** 2)
    r = jes.optimize(loss, x0, "sep_cma_es", minimize=True, num_generations=200, noise_std=0.5, bounds=(lower, upper))
    assert np.allclose(np.asarray(r.x["w"]), [[1, 2], [0.5, 1]], atol=1e-5)
    assert np.allclose(np.asarray(r.x["b"]), [0.1, 3, 1], atol=3e-3)


X0 = np.array([0.0, 0.5, 1.0], np.float32)


@pytest.mark.parametrize("bounds, error, match", [
    ((0, [1, 1, 0]), ValueError, r"^bounds: lower >= upper at x0\[2\] \(lower 0, upper 0\); every lower bound must be "
                                 r"below its upper bound \(None or -inf / inf for an open side\)$"),
    ((2, 1), ValueError, r"lower >= upper at x0\[0\] \(lower 2, upper 1, and 2 more coordinates\)"),
    ((np.inf, None), ValueError, r"lower >= upper at x0\[0\]"),
    ((0, [1, 1]), ValueError, r"^bounds: upper is shaped \(2,\), but x0 \(3,\); give a number \(every coordinate\), None "
                              r"\(no upper bound\) or an array / pytree shaped like x0$"),
    (([0, np.nan, 0], 1), ValueError, r"^bounds: lower is NaN at x0\[1\]; give a number, or None / -inf for no lower "
                                      r"bound$"),
    ((0, 0.75), ValueError, r"^x0 is outside the bounds at x0\[2\]: 1 not in \[0, 0.75\]; start inside the box "
                            r"\(pycma refuses it too\)$"),
    ((0.1, 0.9), ValueError, r"outside the bounds at x0\[0\]: 0 not in \[0.1, 0.9\] \(and 1 more coordinates\)"),
    ((0, 1, 2), TypeError, r"^bounds must be a pair \(lower, upper\)"),
    (5.0, TypeError, r"^bounds must be a pair \(lower, upper\)"),
    (("0", 1), TypeError, r"bounds: lower must hold real numbers"),
    (({"a": 0}, 1), ValueError, r"bounds: lower is structured as .*, but x0 as"),
    ({0, 1}, TypeError, r"^bounds must be a pair \(lower, upper\)"),
    (np.array(1.0), TypeError, r"^bounds must be a pair \(lower, upper\)"),
    (([[0, 0, 0]], 1), ValueError, r"^bounds: lower is shaped \(1, 3\), but x0 \(3,\)"),
    (([0, [0], 0], 1), ValueError, r"^bounds: lower is ragged, not one array"),
    (([0, "0", 0], 1), TypeError, r"^bounds: lower must hold real numbers or None"),
    # float32 rounds 1 + 1e-8 to 1: refused as crossed, saying why and what to do
    (([0, 0, 1], [1, 1, 1 + 1e-8]), ValueError, r"lower >= upper at x0\[2\] \(lower 1, upper 1\) \(they differ by less "
                                          r"than float32 resolves there: widen the box, or search in float64"),
])
def test_bad_bounds_are_refused_in_one_line_naming_the_fix(bounds, error, match):
    for make in (lambda: jes.optimize(sphere_to(0.0), X0, "snes", bounds=bounds, num_generations=1),
                 lambda: jes.AskTell("snes", X0, bounds=bounds)):
        with pytest.raises(error, match=match) as caught:
            make()
        assert "\n" not in str(caught.value)


def test_a_coordinate_of_a_pytree_or_matrix_is_named_as_written():
    with pytest.raises(ValueError, match=r"lower >= upper at x0\['w'\]\[1, 0\]"):
        jes.AskTell("snes", {"w": jnp.zeros((2, 2))}, bounds=({"w": -1.0}, {"w": np.array([[1, 1], [-1, 1]])}))


def test_sides_as_nested_lists_and_around_none_in_x0_are_read_per_leaf():
    """Per leaf of ``x0``: nested lists (with ``None``) for a matrix, lists for a vector leaf of a pytree, ``None``
    where ``x0`` has ``None`` (an empty node); a side out of range of the search's dtype is open."""
    x0 = {"w": np.full((2, 2), 0.5, np.float32), "skip": None, "b": np.zeros(2, np.float32)}
    flat = jnp.concatenate([jnp.ravel(x0["b"]), jnp.ravel(x0["w"])])  # jax's order: sorted keys
    lower, upper = box.flat_bounds(({"w": [[0, None], [0, 0]], "skip": None, "b": [-1, None]},
                                    {"w": 1, "skip": None, "b": [1e39, 2]}), x0, flat)
    assert lower.tolist() == [-1, -np.inf, 0, -np.inf, 0, 0] and upper.tolist() == [np.inf, 2, 1, 1, 1, 1]
    assert lower.dtype == upper.dtype == np.float32


def test_no_bounds_and_open_bounds_are_the_same_run_bit_for_bit():
    runs = [jes.optimize(sphere_to(1.0), jnp.zeros(3), "sep_cma_es", minimize=True, num_generations=20, key=5,
                         bounds=b) for b in (None, (None, None), (-np.inf, np.inf))]
    for r in runs[1:]:
        assert np.asarray(r.x).tobytes() == np.asarray(runs[0].x).tobytes()
        assert r.history["mean_value"].tobytes() == runs[0].history["mean_value"].tobytes()


def leaves_bytes(result):
    return [np.asarray(leaf).tobytes() for leaf in jax.tree.leaves(
        (result.x, result.best_x, result.value, result.best_value, result.history, result.state.params,
         result.state.strategy))]


def test_the_same_key_gives_the_same_bits_with_bounds():
    run = lambda: jes.optimize(sphere_to(3.0), jnp.zeros(4), "cma_es", minimize=True, num_generations=25, key=6,
                               noise_std=2.0, bounds=(-1, [1, 2, None, 0.5]))
    assert leaves_bytes(run()) == leaves_bytes(run())


def test_x64_mode_keeps_float64_with_bounds():
    with jax.enable_x64(True):
        r = jes.optimize(lambda x: jnp.sum((x - 3) ** 2) + 79.48, np.zeros(3), "cma_es", minimize=True,
                         num_generations=150, noise_std=0.5, bounds=(-1, 1))
        assert np.asarray(r.x).dtype == np.float64 and r.state.params.dtype == jnp.float64
        assert abs(r.value - (12 + 79.48)) < 1e-10  # beyond float32's resolution at 91.48
        es = jes.AskTell("snes", np.zeros(3), bounds=(-1, 1))
        assert es.ask(es.init(0)).dtype == jnp.float64


TWO_DEVICES = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np
    import jes
    jes.enable_compilation_cache()   # the session's cache (tests/conftest.py)
    assert len(jax.devices()) == 2, jax.devices()
    loss = lambda x: jnp.sum((x - 3.0) ** 2)
    out = {}
    for strategy in ("sep_cma_es", "openai_es"):
        runs = {d: jes.optimize(loss, np.zeros(6, np.float32), strategy, minimize=True, num_members=8, chunk_size=4,
                                num_generations=12, key=3, devices=d, noise_std=2.0, bounds=(-1, [1, 1, 1, 2, None, 0.5]))
                for d in (1, 2)}
        out[strategy] = {d: [np.asarray(leaf).tobytes().hex() for leaf in jax.tree.leaves(
                             (r.x, r.best_x, r.value, r.history, r.state.params, r.state.strategy))]
                         + [len(r.problem.devices)] for d, r in runs.items()}
    print(json.dumps(out))
""")


def test_bounds_on_two_devices_equal_one_device_bit_for_bit():
    env = checkout_env(XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    try:
        proc = subprocess.run([sys.executable, "-c", TWO_DEVICES], capture_output=True, text=True, env=env, timeout=600)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the two-device script ran past 600 s:\n{e.stdout}\n{e.stderr}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for strategy, runs in json.loads(proc.stdout.strip().splitlines()[-1]).items():
        assert runs["1"][-1] == 1 and runs["2"][-1] == 2
        assert runs["1"][:-1] == runs["2"][:-1], strategy
