"""The Off-the-grid bandwidth search (papers/off-the-grid-bandwidth-search.txt) against float64 references.

- critical_bandwidth's bracket against a dense brute-force sweep of sigma' (one assignment step each), on
  random sets and a shape set; the bracket's width in the exponent; binary search within its precision;
- Theorem 1: no point moves below bandwidth_lower_bound, from random partitions (k small and k ~ n), and
  the paper's tight example of §4 moves just above it;
- the fused updates (offgrid_step) against exp(-D / sigma') in float32 and float64; fast_power within
  Theorem 2's (1 +- eps);
- limited checks give the full checks' answers;
- search_bandwidth on two circles: a clustering with NMI 1.0, all clusterings distinct fixed points of
  kernel k-means at their sigma (independent float64 check); fit(gamma="search"), the estimator, predict;
- the baselines (grid, MKNN), the polynomial degree search, and the validation errors.
"""

import math
import warnings

import numpy as np
import pytest
from conftest import shape_set

import kkmgpu
from kkmgpu.backend import device as _backend
from kkmgpu.bandwidth import matrices as _matrices
from kkmgpu.bandwidth import offgrid as _offgrid
from kkmgpu.bandwidth.search import _canonical


def host(a):
    return np.asarray(a.get() if hasattr(a, "get") else a)


def sq_distances(X):
    X = np.asarray(X, dtype=np.float64)
    D = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(D, 0.0)
    return D


def one_step_moves(D, labels, sigma, weights=None):
    """Indices that one kernel k-means assignment step moves, K = exp(-D / sigma), plain float64 (Eq. 2)."""
    labels = np.asarray(labels)
    n = labels.size
    k = int(labels.max()) + 1
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    K = np.exp(-D / sigma)
    Y = np.zeros((n, k))
    Y[np.arange(n), labels] = w
    S = K @ Y
    sizes = Y.sum(0)
    C = (Y * S).sum(0)
    nonempty = sizes > 0
    safe = np.where(nonempty, sizes, 1.0)
    dist = np.where(nonempty, 1.0 - 2.0 * S / safe + C / safe**2, np.inf)
    return np.flatnonzero(dist.argmin(1) != labels)


def converged_labels(X, k, sigma, seed):
    """A fixed point of float64 kernel k-means at sigma from a random partition."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        r = kkmgpu.fit(X, k, gamma=1.0 / sigma, init="random", n_init=1, random_state=seed, dtype="float64",
                       device="cpu", tol=0.0)
    return host(r.labels)


def first_move_on_grid(D, labels, lo, hi, n_points=400):
    """(last grid sigma' without a move, first with one) on a geometric grid over [lo, hi]."""
    grid = np.geomspace(lo, hi, n_points)
    previous = lo
    for g in grid:
        if one_step_moves(D, labels, g).size:
            return previous, g
        previous = g
    return previous, math.inf


def random_set(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(30, 70))
    k = int(rng.integers(2, 5))
    X = rng.normal(size=(n, 2)) * rng.uniform(0.1, 10.0)
    D = sq_distances(X)
    sigma = float(np.percentile(D[np.triu_indices(n, 1)], rng.uniform(2.0, 20.0)))
    return X, D, k, sigma


def assert_bracket_matches_sweep(D, labels, cb, depth, sigma):
    assert math.isfinite(cb.upper) and sigma <= cb.lower < cb.upper
    assert one_step_moves(D, labels, cb.lower).size == 0       # no move at lower (exact exp, float64)
    assert one_step_moves(D, labels, cb.upper).size > 0        # a move at upper
    np.testing.assert_array_equal(np.sort(cb.moved), one_step_moves(D, labels, cb.upper))
    # the dyadic level: base / lower - base / upper = 2^-depth, and base = sigma 2^m
    assert cb.base_sigma / cb.lower - cb.base_sigma / cb.upper == pytest.approx(2.0 ** -depth, rel=1e-9)
    assert cb.exponent_lower - cb.exponent_upper == pytest.approx(2.0 ** -depth, rel=1e-12)
    # the stated precision: a relative width of at most 2^(1 - depth) in sigma
    assert cb.upper / cb.lower - 1.0 <= 2.0 ** (1 - depth) * (1 + 1e-9)
    # the brute-force critical value (first moving sigma' of a dense sweep from the partition's own sigma,
    # Definition 1's infimum to the grid's resolution) lies in the bracket: nothing moves on (sigma, lower)
    _, first_moving = first_move_on_grid(D, labels, sigma, cb.upper)
    assert cb.lower * (1 - 1e-12) <= first_moving <= cb.upper


# --- Algorithm 2 against brute force -------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_critical_bandwidth_matches_dense_sweep(device, seed):
    X, D, k, sigma = random_set(seed)
    labels = converged_labels(X, k, sigma, seed)
    assert one_step_moves(D, labels, sigma).size == 0
    depth = [6, 8, 10, 12][seed]
    cb = kkmgpu.critical_bandwidth(X, labels, sigma=sigma, depth=depth, device=device)
    assert cb.reason == "" and cb.sigma == cb.upper
    assert cb.n_steps >= depth and cb.n_full_checks >= 1
    assert_bracket_matches_sweep(D, labels, cb, depth, sigma)
    # binary search (§7.3) lands in the same place within its precision
    bs = kkmgpu.binary_search_critical_bandwidth(X, labels, sigma=sigma, precision=1e-6 * sigma, device=device)
    assert bs.upper - bs.lower <= 1e-6 * sigma
    assert one_step_moves(D, labels, bs.lower).size == 0 and one_step_moves(D, labels, bs.upper).size > 0
    assert cb.lower <= bs.upper and bs.lower <= cb.upper


def test_critical_bandwidth_on_a_shape_set(device):
    X, _ = shape_set("jain")  # the real set, or a generated look-alike where the shared data is missing
    D = sq_distances(X)
    sigma = float(np.percentile(D[np.triu_indices(len(X), 1)], 1.0))
    labels = converged_labels(X, 2, sigma, 0)
    cb = kkmgpu.critical_bandwidth(X, labels, sigma=sigma, depth=7, device=device)
    assert_bracket_matches_sweep(D, labels, cb, 7, sigma)
    # the same walk from the kernel matrix instead of X
    K = np.exp(-D / sigma)
    cbk = kkmgpu.critical_bandwidth(K=K, labels=labels, sigma=sigma, depth=7, device=device)
    assert (cbk.lower, cbk.upper) == pytest.approx((cb.lower, cb.upper), rel=1e-12)


def test_float32_walk_brackets_the_same_value(device):
    X, D, k, sigma = random_set(5)
    labels = converged_labels(X, k, sigma, 5)
    c64 = kkmgpu.critical_bandwidth(X, labels, sigma=sigma, depth=8, device=device)
    c32 = kkmgpu.critical_bandwidth(X, labels, sigma=sigma, depth=8, device=device, dtype="float32")
    assert (c32.lower, c32.upper) == pytest.approx((c64.lower, c64.upper), rel=1e-12)


def test_not_a_fixed_point_and_single_cluster(device):
    X, D, k, sigma = random_set(7)
    labels = np.arange(len(X)) % k                            # arbitrary: points move at sigma already
    assert one_step_moves(D, labels, sigma).size
    with pytest.warns(UserWarning, match="not a fixed point"):
        cb = kkmgpu.critical_bandwidth(X, labels, sigma=sigma, device=device)
    assert (cb.lower, cb.upper) == (0.0, sigma) and cb.moved.size
    cb = kkmgpu.critical_bandwidth(X, np.zeros(len(X), int), sigma=sigma, device=device)
    assert cb.upper == math.inf and "single" in cb.reason


def test_cap_reports_inf(device):
    # two well separated pairs split 2 / 2: a fixed point for every sigma (plain k-means included)
    X = np.array([[0.0, 0.0], [0.1, 0.0], [10.0, 0.0], [10.1, 0.0]])
    D = sq_distances(X)
    cb = kkmgpu.critical_bandwidth(X, [0, 0, 1, 1], sigma=0.01, depth=4, device=device)
    assert cb.upper == math.inf and cb.sigma == math.inf and "plain k-means" in cb.reason
    for s in cb.lower * np.array([1.0, 2.0, 8.0]):
        assert one_step_moves(D, [0, 0, 1, 1], s).size == 0
    # from K alone (no features for the linear-regime bound): doubling until K is all ones to precision
    cb = kkmgpu.critical_bandwidth(K=np.exp(-D / 2).astype(np.float32), labels=[0, 0, 1, 1], sigma=2.0, depth=4,
                                   device=device)
    assert cb.upper == math.inf and "all ones to float32" in cb.reason
    threshold = D.max() / math.sqrt(np.finfo(np.float32).eps)          # max D / sigma < sqrt(eps) beyond it
    assert threshold < cb.lower <= 2 * threshold
    cb = kkmgpu.critical_bandwidth(X, [0, 0, 1, 1], sigma=0.01, max_sigma=1.0, device=device)
    assert cb.upper == math.inf and "max_sigma" in cb.reason and cb.lower <= 1.0


def test_linear_regime_bound(device):
    """Beyond linear_regime_sigma no point moves (a strict plain k-means fixed point); None otherwise."""
    backend = _backend.resolve_device(device)
    rng = np.random.default_rng(8)
    X = np.concatenate([rng.normal(size=(25, 2)) + [4, 0], rng.normal(size=(25, 2)) - [4, 0],
                        rng.normal(size=(25, 2)) + [0, 5]])
    D = sq_distances(X)
    r = kkmgpu.fit(X, 3, kernel="linear", init="random", n_init=5, random_state=0, device="cpu", dtype="float64")
    labels = host(r.labels)
    A = backend.asarray(X - X.mean(0))
    lab = backend.asarray(labels.astype(np.int32))
    w = backend.asarray(np.ones(len(X)))
    bound = _offgrid.linear_regime_sigma(A, lab, w, 3, backend)
    assert bound is not None and bound > D.max()
    for s in bound * np.array([1.0, 3.0, 10.0]):
        assert one_step_moves(D, labels, s).size == 0
    swapped = labels.copy()
    swapped[np.flatnonzero(labels == 0)[:3]] = 1                     # not a plain k-means fixed point
    assert _offgrid.linear_regime_sigma(A, backend.asarray(swapped.astype(np.int32)), w, 3, backend) is None


def test_underflowed_entries_are_rebuilt_from_X(device):
    # blob B (5 points) sits with the far blob C in cluster 1, 1 away from blob A (cluster 0). At sigma = 0.002
    # the A-B kernel values exp(-500) underflow in float32; the critical value is ~400 times larger, where
    # they decide the move of B to A
    rng = np.random.default_rng(3)
    X = np.concatenate([rng.normal(size=(15, 2)) * 0.05, rng.normal(size=(5, 2)) * 0.05 + [0.0, 1.0],
                        rng.normal(size=(20, 2)) * 0.05 + [3.0, 0.0]])
    D = sq_distances(X)
    sigma = 0.002
    labels = np.r_[np.zeros(15, int), np.ones(25, int)]
    assert one_step_moves(D, labels, sigma).size == 0
    cb = kkmgpu.critical_bandwidth(X, labels, sigma=sigma, depth=6, dtype="float32", device=device)
    assert cb.n_rebuilds >= 1 and cb.upper > 100 * sigma
    assert_bracket_matches_sweep(D, labels, cb, 6, sigma)
    assert set(cb.moved) <= set(range(15, 20))
    with pytest.warns(UserWarning, match="smallest normal float32"):
        kkmgpu.critical_bandwidth(K=np.exp(-D / sigma).astype(np.float32), labels=labels, sigma=sigma, depth=6,
                                  device=device)


# --- Theorem 1 ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,k", [(5, 2), (30, 3), (30, 29), (30, 30), (120, 4), (120, 110)])
def test_no_point_moves_below_the_lower_bound(device, n, k):
    rng = np.random.default_rng(n * 1000 + k)
    X = rng.normal(size=(n, 3)) * rng.uniform(0.01, 100.0)
    bound = kkmgpu.bandwidth_lower_bound(X, device=device)
    D = sq_distances(X)
    d_min = D[np.triu_indices(n, 1)].min()
    assert bound == pytest.approx(d_min / math.log(3 * n), rel=1e-10)
    for trial in range(3):
        labels = rng.integers(0, k, n)
        labels[rng.permutation(n)[:k]] = np.arange(k)       # no empty cluster
        for sigma in (bound, bound * 0.3):
            assert one_step_moves(D, labels, sigma).size == 0
        r = kkmgpu.fit(X, k, gamma=1.0 / bound, init=labels, device=device, dtype="float64")
        np.testing.assert_array_equal(host(r.labels), labels)
        assert r.stop_reason == "no point moved" and r.n_iter == 1


def tight_example(m, eps=1.0):
    """§4's instance: pi_1 (m points) and y pairwise at eps; pi_2 \\ {y} pairwise eps, 2 eps from y."""
    dim = 2 * m + 1
    points = []
    for i in range(m + 1):                                   # pi_1 and y: a regular simplex
        v = np.zeros(dim)
        v[i] = math.sqrt(eps / 2)
        points.append(v)
    for j in range(m - 1):
        v = np.zeros(dim)
        v[m + 1 + j] = math.sqrt(eps / 2)
        v[-1] = math.sqrt(eps)
        points.append(v)
    return np.array(points), np.r_[np.zeros(m, int), np.ones(m, int)]


@pytest.mark.parametrize("m", [10, 40])
def test_tight_example_moves_just_above_the_bound(device, m):
    X, labels = tight_example(m)
    n = 2 * m
    D = sq_distances(X)
    bound = kkmgpu.bandwidth_lower_bound(X, device=device)
    assert bound == pytest.approx(1.0 / math.log(3 * n), rel=1e-9)
    assert one_step_moves(D, labels, bound).size == 0
    above = 1.0 / math.log(n / 3)                            # the paper's sigma = eps / log(n / 3)
    np.testing.assert_array_equal(one_step_moves(D, labels, above), [m])   # y switches to pi_1
    cb = kkmgpu.critical_bandwidth(X, labels, sigma=bound, depth=10, device=device)
    assert bound < cb.lower < cb.upper <= above
    np.testing.assert_array_equal(cb.moved, [m])


def test_lower_bound_duplicates_and_errors(device):
    X = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [3.0, 0.0]])
    with pytest.warns(UserWarning, match="2 duplicated points"):
        bound = kkmgpu.bandwidth_lower_bound(X, device=device)
    assert bound == pytest.approx(1.0 / math.log(12.0))
    with pytest.raises(ValueError, match="coincides"):
        kkmgpu.bandwidth_lower_bound(np.ones((3, 2)), device=device)
    with pytest.raises(ValueError, match="at least 2"):
        kkmgpu.bandwidth_lower_bound(np.ones((1, 2)), device=device)
    # near-duplicates far from the origin: the GEMM form alone would round their distance away
    Y = np.array([[1e4, 1e4], [1e4 + 1e-3, 1e4], [1e4 + 5.0, 1e4]])
    assert kkmgpu.bandwidth_lower_bound(Y, device=device) == pytest.approx(1e-6 / math.log(9.0), rel=1e-6)


# --- the fused updates and Algorithm 1 -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_fused_updates_equal_exp(device, dtype, rtol):
    backend = _backend.resolve_device(device)
    xp = backend.xp
    rng = np.random.default_rng(11)
    X = rng.normal(size=(50, 3))
    D = sq_distances(X)
    sigma = 0.5
    K = backend.asarray(np.exp(-D / sigma), dtype=dtype)
    Kp = K.copy()
    e = 1.0
    for j in range(1, 13):
        divide = bool(rng.integers(0, 2)) or j == 1
        backend.ops.offgrid_step(K, Kp, divide)
        e = e - 2.0 ** -j if divide else e + 2.0 ** -j
        expected = np.exp(-D * e / sigma)
        got = host(K).astype(np.float64)
        big = expected > 1e-30
        np.testing.assert_allclose(got[big], expected[big], rtol=rtol)
        np.testing.assert_allclose(host(Kp).astype(np.float64), np.exp(-D * 2.0 ** -j / sigma), rtol=rtol)
    assert isinstance(K, xp.ndarray)


def test_walk_leaves_the_kernel_at_upper(device):
    """After a walk K holds K_upper = exp(-D / upper) (what kernel k-means runs on next)."""
    X, D, k, sigma = random_set(2)
    labels = converged_labels(X, k, sigma, 2)
    backend = _backend.resolve_device(device)
    order = np.argsort(labels, kind="stable")
    Xo, lo = X[order], labels[order]
    K = backend.asarray(np.exp(-sq_distances(Xo) / sigma))
    Kp = K.copy()
    question = _offgrid.OneStepQuestion(backend, backend.asarray(lo.astype(np.int32)),
                                        backend.asarray(np.ones(len(X))), k, limited=True)
    info = _offgrid.BaseInfo(sigma, 0, float(host(K).min()))
    out = _offgrid.walk_rbf(K, Kp, question, sigma, 9, backend, info=info)
    upper = out.base / out.e_upper
    np.testing.assert_allclose(host(K), np.exp(-sq_distances(Xo) / upper), rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("seed", range(4))
def test_fast_power_within_theorem_2(device, seed):
    backend = _backend.resolve_device(device)
    rng = np.random.default_rng(seed)
    b = np.exp(rng.uniform(-8, 8, size=(40, 30)))
    for p, depth in [(rng.uniform(0.05, 1.0), int(rng.integers(1, 14))),
                     (rng.uniform(1.0, 12.0), int(rng.integers(1, 14))), (3.0, 1), (2.75, 2)]:
        r = kkmgpu.fast_power(backend.asarray(b), p, depth)
        assert type(r) is type(backend.asarray(b))
        log_err = np.abs(np.log(host(r)) - p * np.log(b))
        bound = 2.0 ** -depth * np.abs(np.log(b)) + 1e-12 * (1 + p * np.abs(np.log(b)))
        assert np.all(log_err <= bound)
        eps = np.exp(2.0 ** -depth * np.abs(np.log(b))) - 1.0            # Theorem 2's (1 +- eps)
        ratio = host(r) / b ** p
        assert np.all(ratio <= 1 + eps + 1e-12) and np.all(ratio >= 1 - eps - 1e-12)
    # a dyadic exponent is exact; 1-D input and integer input take the plain path
    np.testing.assert_allclose(host(kkmgpu.fast_power(backend.asarray(b[0]), 1.625, 3)), b[0] ** 1.625, rtol=1e-13)
    np.testing.assert_allclose(kkmgpu.fast_power([2, 3], 2.5, 1), [2 ** 2.5, 3 ** 2.5], rtol=1e-14)


# --- limited checks ---------------------------------------------------------------------------------------------

def test_limited_checks_answer_like_full_checks(device, monkeypatch):
    monkeypatch.setattr(_offgrid, "LIMITED_CHECK_MAX_COST", 1e9)   # use them even where they would not pay
    backend = _backend.resolve_device(device)
    for seed in range(2):
        X, D, k, sigma = random_set(20 + seed)
        labels = converged_labels(X, k, sigma, seed)
        with_limited = kkmgpu.critical_bandwidth(X, labels, sigma=sigma, depth=10, device=device)
        without = kkmgpu.critical_bandwidth(X, labels, sigma=sigma, depth=10, device=device, limit_checks=False)
        assert (with_limited.lower, with_limited.upper) == (without.lower, without.upper)
        assert with_limited.n_limited_checks > 0 and without.n_limited_checks == 0
        np.testing.assert_array_equal(with_limited.moved, without.moved)
        # question by question, over a sweep of bandwidths
        order = np.argsort(labels, kind="stable")
        lo = labels[order]
        Do = D[np.ix_(order, order)]
        question = _offgrid.OneStepQuestion(backend, backend.asarray(lo.astype(np.int32)),
                                            backend.asarray(np.ones(len(X))), k, limited=True)
        assert question.limited
        for s in np.geomspace(sigma, 8 * sigma, 15):
            K = backend.asarray(np.exp(-Do / s))
            n_full, moved_full = question.full(K)
            limited = question.limited_check(K)
            if limited is not None:
                assert n_full > 0 and set(host(limited)) <= set(host(moved_full))
            assert (n_full > 0) == (one_step_moves(Do, lo, s).size > 0)


# --- the search of §7.1 ------------------------------------------------------------------------------------------

def test_search_bandwidth_two_circles(device):
    X, y = kkmgpu.datasets.make_two_circles(200, factor=0.3, random_state=0)
    res = kkmgpu.search_bandwidth(X, 2, y_true=y, random_state=0, device=device)
    assert res.method == "offgrid" and len(res.clusterings) >= 3
    assert max(c.nmi for c in res.clusterings) == pytest.approx(1.0)
    keys = [_canonical(c.labels).tobytes() for c in res.clusterings]
    assert len(set(keys)) == len(keys)                              # every clustering distinct
    D = sq_distances(X)
    for c in res.clusterings:                                      # a fixed point of kernel k-means at its sigma
        assert c.gamma == pytest.approx(1.0 / c.sigma)
        assert one_step_moves(D, c.labels, c.sigma).size == 0
        assert c.cnnc == pytest.approx(kkmgpu.metrics.cnnc(X, c.labels, 2, device="cpu"), rel=1e-9)
        assert c.objective == pytest.approx(kkmgpu.metrics.kernel_kmeans_objective(np.exp(-D / c.sigma), c.labels),
                                            rel=1e-9)
    best = res.best
    assert best.cnnc == min(c.cnnc for c in res.clusterings)
    values = [e["value"] for e in res.evaluations if e["depth"] == 1]
    assert values == sorted(values)                                # the main path walks upwards
    assert res.evaluations[0]["value"] == pytest.approx(np.percentile(D[np.triu_indices(200, 1)], 1.0))
    assert {e["depth"] for e in res.evaluations} >= {0, 1, 2}
    assert res.costs["fused_steps"] >= len(res.brackets) and res.n_kernel_passes > 0
    assert best.nmi == pytest.approx(1.0)                          # c-NNC picks the two rings here
    assert "*" in res.summary() and "c-NNC" in res.summary()


def test_sampled_percentile_start(device, monkeypatch):
    """Above PERCENTILE_EXACT_MAX_PAIRS sigma0 is the 1st percentile of sampled pairs' squared distances,
    computed in chunks: equal to a direct float64 computation on the same draws, and near the exact value."""
    from kkmgpu.bandwidth import search

    backend = _backend.resolve_device(device)
    rng = np.random.default_rng(31)
    X = rng.normal(size=(400, 6)) * rng.uniform(0.5, 3.0, size=6)
    monkeypatch.setattr(search, "PERCENTILE_EXACT_MAX_PAIRS", 1000)
    monkeypatch.setattr(search, "PERCENTILE_SAMPLE_PAIRS", 30_000)
    monkeypatch.setattr(_matrices, "TILE_BYTES", 16 * 6 * 97)            # chunks of 97 pairs
    monkeypatch.setattr(_matrices, "TILE_BYTES_GPU", 16 * 6 * 97)
    A = _matrices.centered_features(X, backend)
    value = search._percentile_sigma(A, backend, np.random.default_rng(5))
    draws = np.random.default_rng(5)
    i = draws.integers(0, 400, size=30_000)
    j = draws.integers(0, 399, size=30_000)
    j = j + (j >= i)
    assert value == pytest.approx(np.percentile(((X[i] - X[j]) ** 2).sum(1), 1.0), rel=1e-12)
    exact = np.percentile(sq_distances(X)[np.triu_indices(400, 1)], 1.0)
    assert value == pytest.approx(exact, rel=0.1)
    res = kkmgpu.search_bandwidth(X, 3, max_values=2, refine_depth=0, random_state=np.random.default_rng(5),
                                  device=device)
    assert res.start == pytest.approx(value, rel=1e-12)


def test_search_options_and_plot(device):
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    X, y = kkmgpu.datasets.make_two_circles(120, factor=0.3, random_state=1)
    res = kkmgpu.search_bandwidth(X, 2, sigma0="bound", depth=2, refine_depth=2, init="k-means++", max_values=6,
                                  random_state=0, device=device, dtype="float32",
                                  sample_weight=np.linspace(0.5, 2.0, 120))
    assert len(res.evaluations) <= 6 and res.dtype == "float32"
    assert res.start == pytest.approx(kkmgpu.bandwidth_lower_bound(X, device="cpu"))
    assert all(c.nmi is None for c in res.clusterings)
    ax = res.plot()
    assert ax.get_xscale() == "log"
    res = kkmgpu.search_bandwidth(X, 2, sigma0=0.05, refine_depth=0, max_values=3, random_state=0, device=device)
    assert res.start == 0.05 and all(e["depth"] <= 1 for e in res.evaluations)


def test_fit_with_gamma_search(device):
    X, y = kkmgpu.datasets.make_two_circles(120, factor=0.3, random_state=2)
    r = kkmgpu.fit(X, 2, gamma="search", init="random", random_state=0, device=device, dtype="float64")
    search = r.method_params["bandwidth_search"]
    assert isinstance(search, kkmgpu.BandwidthSearchResult)
    assert r.kernel_params["gamma"] == pytest.approx(search.best.gamma)
    assert r.method_params["sigma"] == pytest.approx(1.0 / r.kernel_params["gamma"])
    assert _canonical(host(r.labels)).tobytes() == _canonical(search.best.labels).tobytes()
    np.testing.assert_array_equal(kkmgpu.predict(r, X), host(r.labels))
    model = kkmgpu.KernelKMeans(2, gamma="search", init="random", random_state=0, device=device, dtype="float64")
    np.testing.assert_array_equal(model.fit_predict(X), host(r.labels))
    with pytest.raises(ValueError, match="kernel='rbf'"):
        kkmgpu.fit(X, 2, kernel="polynomial", gamma="search", device=device)
    with pytest.raises(ValueError, match="method='exact'"):
        kkmgpu.fit(X, 2, gamma="search", method="cats", device=device)


@pytest.mark.parametrize("fit_options, search_options", [
    ({}, {"init": "k-means++", "dtype": "float32"}),                 # fit's defaults
    ({"init": "random", "dtype": "float64"}, {}),                    # search_bandwidth's defaults
])
def test_one_search_one_answer(device, tmp_path, capsys, fit_options, search_options):
    """fit(gamma="search"), search_bandwidth, the estimator and the CLI run one search: the same clusterings,
    the same best sigma, the same labels, for the same data, seed, init and dtype (their defaults for init and
    dtype differ, as the docs say)."""
    from kkmgpu.cli import main

    rng = np.random.default_rng(4)
    X = np.vstack([rng.normal(size=(40, 2)) * s + c for s, c in ((1.0, (0, 0)), (2.0, (9, 0)), (0.5, (0, 7)))])
    k = 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        search = kkmgpu.search_bandwidth(X, k, random_state=0, device=device, **search_options)
        result = kkmgpu.fit(X, k, gamma="search", random_state=0, device=device, **fit_options)
        from_generator = kkmgpu.fit(X, k, gamma="search", random_state=np.random.default_rng(0), device=device,
                                    **fit_options)
        model = kkmgpu.KernelKMeans(k, gamma="search", random_state=0, device=device, **fit_options).fit(X)
    for run in (result, from_generator):
        in_fit = run.method_params["bandwidth_search"]
        assert in_fit.dtype == search.dtype
        np.testing.assert_array_equal(in_fit.initial_labels, search.initial_labels)
        assert [c.sigma for c in in_fit.clusterings] == [c.sigma for c in search.clusterings]
        assert in_fit.best_index == search.best_index
        assert run.method_params["sigma"] == search.best.sigma
        np.testing.assert_array_equal(host(run.labels), search.best.labels)
    np.testing.assert_array_equal(model.labels_, search.best.labels)
    np.save(tmp_path / "x.npy", X)
    options = [f"--{name}={value}" for name, value in fit_options.items()]
    assert main(["fit", str(tmp_path / "x.npy"), "-k", str(k), "--gamma", "search", "--seed", "0", "--device",
                 device, "-o", str(tmp_path / "labels.csv"), *options]) == 0
    np.testing.assert_array_equal(np.loadtxt(tmp_path / "labels.csv", dtype=np.int64), search.best.labels)
    assert f"sigma={search.best.sigma:.6g}" in capsys.readouterr().out


# --- baselines and the polynomial degree -------------------------------------------------------------------------

def test_grid_and_mknn_baselines(device):
    from scipy.spatial import cKDTree

    X, y = kkmgpu.datasets.make_two_circles(100, factor=0.3, random_state=3)
    grid = kkmgpu.search_grid(X, 2, y_true=y, random_state=0, device=device)
    assert grid.method == "grid" and [e["value"] for e in grid.evaluations] == [10.0 ** e for e in range(-6, 7)]
    assert len({e["clustering"] for e in grid.evaluations}) == len(grid.clusterings)
    mknn = kkmgpu.search_mknn(X, 2, y_true=y, random_state=0, device=device)
    J = int(2 * (math.log(100) + 1))
    d, _ = cKDTree(X).query(X, k=J + 1)
    expected = 2.0 * d[:, 1:].mean(axis=0) ** 2                  # sigma = 2 s^2, s the mean j-th NN distance
    np.testing.assert_allclose([e["value"] for e in mknn.evaluations], expected, rtol=1e-9)
    # the same initial partition for every value and method (same seed)
    np.testing.assert_array_equal(grid.initial_labels, mknn.initial_labels)
    for res in (grid, mknn):
        D = sq_distances(X)
        for e in res.evaluations:
            c = res.clusterings[e["clustering"]]
            assert c.cnnc >= 0 and 0 <= c.nmi <= 1
        assert res.best.cnnc == min(c.cnnc for c in res.clusterings)


def poly_one_step_moves(K, labels):
    """Indices one kernel k-means assignment step moves on the kernel matrix K (plain float64, Eq. 2)."""
    labels = np.asarray(labels)
    k = int(labels.max()) + 1
    Y = np.eye(k)[labels]
    S = K @ Y
    sizes = Y.sum(0)
    safe = np.where(sizes > 0, sizes, 1.0)
    dist = np.where(sizes > 0, np.diag(K)[:, None] - 2 * S / safe + (Y * S).sum(0) / safe**2, np.inf)
    return np.flatnonzero(dist.argmin(1) != labels)


def test_polynomial_degree_search(device):
    rng = np.random.default_rng(4)
    X = np.concatenate([rng.normal(size=(30, 2)) * 0.3 + [2, 0], rng.normal(size=(30, 2)) * 0.3 + [0, 2]])
    res = kkmgpu.search_polynomial_degree(X, 2, coef0=2.0, gamma=0.5, max_degree=16, random_state=0, device=device)
    assert res.method == "polynomial-degree" and res.parameter == "degree"
    degrees = [e["value"] for e in res.evaluations]
    assert degrees[0] == 1 and degrees == sorted(degrees) and all(d == int(d) for d in degrees)
    for (lower, upper, _), d in zip(res.brackets, degrees[1:]):
        assert lower < upper <= lower + 1.0 and d in (math.floor(lower) + 1, math.floor(lower) + 2)
    G = 0.5 * X @ X.T + 2.0
    for c in res.clusterings:                               # fixed points at their (integer) degree
        assert poly_one_step_moves(G ** c.degree, c.labels).size == 0
    with pytest.raises(ValueError, match="larger coef0"):
        kkmgpu.search_polynomial_degree(X - X.mean(0), 2, coef0=0.0, device=device)


@pytest.mark.parametrize("seed", [1, 2, 10])
def test_polynomial_degree_search_matches_integer_sweep(device, seed):
    """§6.3 against brute force: every bracket has no move at its lower end, a move at its upper end (real
    powers of B, float64) and is at most one degree wide; no integer degree strictly between two evaluated
    degrees moves a point from the earlier clustering (the search does not skip a critical integer degree)."""
    rng = np.random.default_rng(seed)
    X = np.concatenate([rng.normal(size=(25, 2)) * 0.4 + [2, 0], rng.normal(size=(25, 2)) * 0.4 + [0, 2],
                        rng.normal(size=(25, 2)) * 0.4 + [1, 1]])
    res = kkmgpu.search_polynomial_degree(X, 3, coef0=4.0, gamma=0.5, max_degree=32, random_state=seed,
                                          device=device)
    B = 0.5 * X @ X.T + 4.0
    ev = res.evaluations
    assert len(ev) >= 4
    for (lower, upper, depth), a, b in zip(res.brackets, ev[:-1], ev[1:]):
        labels = res.clusterings[a["clustering"]].labels
        assert a["value"] <= lower < upper <= lower + 1.0 and depth >= 1
        assert poly_one_step_moves(B ** lower, labels).size == 0
        assert poly_one_step_moves(B ** upper, labels).size > 0
        for m in range(int(a["value"]) + 1, int(b["value"])):
            assert poly_one_step_moves(B ** m, labels).size == 0, (a["value"], m, b["value"])
        if b["value"] < upper:                             # the first integer above lower, chosen because it moves
            assert poly_one_step_moves(B ** b["value"], labels).size > 0


# --- validation -----------------------------------------------------------------------------------------------------

def test_validation_errors(device):
    X, D, k, sigma = random_set(9)
    labels = converged_labels(X, k, sigma, 9)
    cb = kkmgpu.critical_bandwidth
    with pytest.raises(ValueError, match="depth=0 must be >= 1"):
        cb(X, labels, sigma=sigma, depth=0, device=device)
    with pytest.raises(ValueError, match="depth=60 must be <= 52"):
        cb(X, labels, sigma=sigma, depth=60, device=device)
    with pytest.raises(TypeError, match="depth"):
        cb(X, labels, sigma=sigma, depth=2.5, device=device)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="sigma="):
            cb(X, labels, sigma=bad, device=device)
    with pytest.raises(ValueError, match="one label per sample"):
        cb(X, labels[:-1], sigma=sigma, device=device)
    with pytest.raises(ValueError, match="integer cluster indices"):
        cb(X, labels + 0.5, sigma=sigma, device=device)
    with pytest.raises(ValueError, match=">= 0"):
        cb(X, labels - 1, sigma=sigma, device=device)
    with pytest.raises(ValueError, match="labels are required"):
        cb(X, sigma=sigma, device=device)
    with pytest.raises(ValueError, match="exactly one of X"):
        cb(X, labels, K=np.exp(-D / sigma), sigma=sigma, device=device)
    with pytest.raises(ValueError, match="exactly one of X"):
        cb(labels=labels, sigma=sigma, device=device)
    with pytest.raises(ValueError, match="float16"):
        cb(X, labels, sigma=sigma, dtype="float16", device=device)
    K = np.exp(-D / sigma)
    with pytest.raises(ValueError, match="diagonal must be 1"):
        cb(K=K * 0.9, labels=labels, sigma=sigma, device=device)
    with pytest.raises(ValueError, match=r"lie in \[0, 1\]"):
        cb(K=K - 0.5 * (1 - np.eye(len(K))), labels=labels, sigma=sigma, device=device)
    asym = K.copy()
    asym[0, 1] += 0.1
    with pytest.raises(ValueError, match="symmetric"):
        cb(K=asym, labels=labels, sigma=sigma, device=device)
    with pytest.raises(ValueError, match="square"):
        cb(K=K[:, :-1], labels=labels, sigma=sigma, device=device)
    with pytest.raises(ValueError, match="precision="):
        kkmgpu.binary_search_critical_bandwidth(X, labels, sigma=sigma, precision=0, device=device)
    with pytest.raises(ValueError, match="sigma_max"):
        kkmgpu.binary_search_critical_bandwidth(X, labels, sigma=sigma, sigma_max=sigma / 2, device=device)
    with pytest.raises(ValueError, match="values <= 0"):
        kkmgpu.fast_power(np.array([1.0, 0.0]), 0.5, 3)
    with pytest.raises(ValueError, match="p="):
        kkmgpu.fast_power(np.array([1.0, 2.0]), 0.0, 3)
    with pytest.raises(ValueError, match="depth=0"):
        kkmgpu.fast_power(np.array([1.0, 2.0]), 0.5, 0)
    with pytest.raises(ValueError, match="sigma0="):
        kkmgpu.search_bandwidth(X, 2, sigma0="median", device=device)
    with pytest.raises(ValueError, match="sigma0="):
        kkmgpu.search_bandwidth(X, 2, sigma0=-1.0, device=device)
    with pytest.raises(ValueError, match="k=100"):
        kkmgpu.search_bandwidth(X, 100, device=device)
    with pytest.raises(ValueError, match="init="):
        kkmgpu.search_bandwidth(X, 2, init="kmeans", device=device)
    with pytest.raises(ValueError, match="y_true"):
        kkmgpu.search_bandwidth(X, 2, y_true=np.zeros(3), device=device)
    with pytest.raises(ValueError, match="max_values"):
        kkmgpu.search_bandwidth(X, 2, max_values=0, device=device)
    with pytest.raises(ValueError, match="sigma="):
        kkmgpu.search_grid(X, 2, sigmas=[1.0, -1.0], device=device)


def test_memory_check(device, monkeypatch):
    backend = _backend.resolve_device(device)
    X, _, k, sigma = random_set(1)
    labels = converged_labels(X, k, sigma, 1)
    n = len(X)
    monkeypatch.setattr(type(backend), "available_bytes", lambda self: n * n * 8)   # room for one matrix only
    with pytest.raises(kkmgpu.InsufficientMemoryError, match="K and K'"):
        kkmgpu.critical_bandwidth(X, labels, sigma=sigma, device=device)


def test_cli_gamma_search(tmp_path, capsys):
    from kkmgpu.cli import main

    X, _ = kkmgpu.datasets.make_two_circles(80, factor=0.3, random_state=0)
    np.save(tmp_path / "x.npy", X)
    assert main(["fit", str(tmp_path / "x.npy"), "-k", "2", "--gamma", "search", "--device", "cpu", "--seed",
                 "0", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    assert "bandwidth search" in out and "lowest c-NNC" in out
