"""kkmgpu.fit against the float64 reference of tests/reference.py, from the same initial labels."""

import warnings

import numpy as np
import pytest
from conftest import SHAPE_TABLE, shape_set
from reference import (
    KERNELS,
    default_kernel_params,
    kernel_kmeans_objective,
    kernel_matrix,
    reference_kernel_kmeans,
)

import kkmgpu
import reference

# (n_samples, n_features, k, seed): awkward sizes, 1-D data, k = 1 and k = 7.
CASES = [
    (37, 1, 3, 0),
    (203, 4, 5, 1),
    (500, 10, 7, 2),
    (64, 3, 1, 3),
    (150, 2, 2, 4),
]
CASE_IDS = [f"n{n}-d{d}-k{k}-s{s}" for n, d, k, s in CASES]

RTOL64 = 1e-6


def make_data(n, d, seed):
    """Gaussian blobs around 5 random centres, plus a generator for the rest of the test's draws."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=2.0, size=(5, d))
    X = centers[rng.integers(0, 5, n)] + rng.normal(size=(n, d))
    return X, rng


def random_partition(rng, n, k):
    """Uniform labels with every cluster non-empty."""
    labels = rng.integers(0, k, n)
    labels[rng.permutation(n)[:k]] = np.arange(k)
    return labels


def nearest_seed_partition(X, k, rng):
    """Each point goes to the nearest of k distinct random points (a sensible, non-empty start)."""
    seeds = X[rng.choice(len(X), size=k, replace=False)]
    d2 = ((X[:, None, :] - seeds[None, :, :]) ** 2).sum(-1)
    return np.argmin(d2, axis=1)


def run_fit(X, k, init, device, *, dtype="float64", tol=0.0, max_iter=300, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        return kkmgpu.fit(
            X, k, init=np.asarray(init), device=device, dtype=dtype, tol=tol, max_iter=max_iter, **kwargs
        )


def host(a):
    """Labels as a host NumPy array whatever device they live on."""
    return np.asarray(a.get() if hasattr(a, "get") else a)


def assert_same_run(result, ref, *, rtol=RTOL64):
    """Exact labels, same number of assignment steps and stop reason, objective and history to rtol."""
    np.testing.assert_array_equal(host(result.labels), ref.labels)
    assert result.n_iter == ref.n_iter
    assert result.converged == ref.converged
    scale = np.abs(ref.objective_history).max()
    assert result.objective == pytest.approx(ref.objective, rel=rtol, abs=rtol * scale)
    history = np.asarray(result.objective_history, dtype=np.float64)
    assert history.shape == ref.objective_history.shape
    np.testing.assert_allclose(history, ref.objective_history, rtol=rtol, atol=rtol * scale)


def assert_resolved_params(result, expected):
    for name, value in expected.items():
        assert name in result.kernel_params, f"{name} missing from kernel_params={result.kernel_params}"
        assert result.kernel_params[name] == pytest.approx(value, rel=1e-12)


# --------------------------------------------------------------------------- built-in kernels, float64


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_float64_matches_reference(kernel, case, weighted, device):
    n, d, k, seed = case
    X, rng = make_data(n, d, seed)
    init = random_partition(rng, n, k)
    weights = rng.uniform(0.2, 3.0, n) if weighted else None
    max_iter = 60 if kernel == "sigmoid" else 300

    params = default_kernel_params(X, kernel)
    ref = reference_kernel_kmeans(kernel_matrix(X, kernel=kernel), init, k, weights, max_iter=max_iter)
    result = run_fit(X, k, init, device, kernel=kernel, sample_weight=weights, max_iter=max_iter)

    assert_resolved_params(result, params)
    if kernel == "sigmoid" and not (ref.converged and result.converged):
        # Not PSD: Lloyd may cycle. Where either side cycles, only the stop reason is compared.
        assert result.converged == ref.converged
        assert np.all(np.isfinite(result.objective_history))
        return
    assert_same_run(result, ref)


@pytest.mark.parametrize(
    ("kernel", "params"),
    [
        ("rbf", {"gamma": 0.7}),
        ("laplacian", {"gamma": 2.5}),
        ("polynomial", {"gamma": 0.3, "degree": 2, "coef0": 0.5}),
        ("polynomial", {"gamma": 0.05, "degree": 1, "coef0": 0.0}),
        ("sigmoid", {"gamma": 0.01, "coef0": 0.2}),
    ],
    ids=["rbf", "laplacian", "poly-deg2", "poly-deg1", "sigmoid"],
)
def test_explicit_kernel_params_match_reference(kernel, params, device):
    X, rng = make_data(180, 3, 11)
    init = random_partition(rng, 180, 4)
    ref_params = default_kernel_params(X, kernel, **params)
    ref = reference_kernel_kmeans(kernel_matrix(X, kernel=kernel, params=ref_params), init, 4)
    result = run_fit(X, 4, init, device, kernel=kernel, **params)
    assert_resolved_params(result, ref_params)
    assert_same_run(result, ref)


@pytest.mark.parametrize("alias", ["poly", "neural"])
def test_kernel_aliases(alias, device):
    canonical = {"poly": "polynomial", "neural": "sigmoid"}[alias]
    X, rng = make_data(120, 2, 12)
    init = random_partition(rng, 120, 3)
    ref = reference_kernel_kmeans(kernel_matrix(X, kernel=canonical), init, 3)
    result = run_fit(X, 3, init, device, kernel=alias)
    assert_same_run(result, ref)


# --------------------------------------------------------------------------- empty clusters, stopping rules


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_empty_initial_clusters_are_refilled_like_reference(weighted, device):
    """Clusters 1 and 3 start empty: the first assignment step must refill them, farthest point first."""
    n, k = 160, 5
    X, rng = make_data(n, 3, 21)
    init = rng.choice([0, 2, 4], size=n)
    weights = rng.uniform(0.5, 2.0, n) if weighted else None
    ref = reference_kernel_kmeans(kernel_matrix(X, kernel="rbf"), init, k, weights)
    result = run_fit(X, k, init, device, kernel="rbf", sample_weight=weights)
    assert len(ref.history_labels) > 1 and np.unique(ref.history_labels[1]).size == k  # the path is exercised
    assert_same_run(result, ref)
    assert np.unique(host(result.labels)).size == k


def test_max_iter_stops_early_and_warns(device):
    X, rng = make_data(300, 4, 22)
    init = random_partition(rng, 300, 6)
    K = kernel_matrix(X, kernel="rbf")
    ref = reference_kernel_kmeans(K, init, 6, max_iter=2)
    assert not ref.converged  # this start needs more than two steps
    with pytest.warns(kkmgpu.ConvergenceWarning):
        result = kkmgpu.fit(X, 6, kernel="rbf", init=init, dtype="float64", tol=0.0, max_iter=2, device=device)
    assert_same_run(result, ref)
    assert result.n_iter == 2


@pytest.mark.parametrize("tol", [1e-2, 1e-3])
def test_tolerance_stop_matches_reference(tol, device):
    X, rng = make_data(400, 5, 23)
    init = random_partition(rng, 400, 6)
    K = kernel_matrix(X, kernel="rbf")
    ref = reference_kernel_kmeans(K, init, 6, tol=tol)
    full = reference_kernel_kmeans(K, init, 6, tol=0.0)
    assert ref.n_iter < full.n_iter  # the tolerance rule, not unchanged labels, ends this run
    result = run_fit(X, 6, init, device, kernel="rbf", tol=tol)
    assert_same_run(result, ref)


def test_exact_ties_take_lowest_cluster_index(device):
    """A point exactly halfway between two centres goes to the lower cluster index, as in the reference.

    Integer coordinates and the linear kernel keep every distance exact; the middle point has weight 0,
    so it does not move the centres (-2 and 2) and is at distance 4 from both.
    """
    X = np.array([[-2.0], [0.0], [2.0]])
    weights = np.array([1.0, 0.0, 1.0])
    init = np.array([0, 1, 1])
    ref = reference_kernel_kmeans(X @ X.T, init, 2, weights)
    np.testing.assert_array_equal(ref.labels, [0, 0, 1])
    result = run_fit(X, 2, init, device, kernel="linear", sample_weight=weights)
    assert_same_run(result, ref)


# --------------------------------------------------------------------------- precomputed and callable kernels


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_precomputed_kernel_matches_reference(weighted, device):
    X, rng = make_data(203, 3, 31)
    K = kernel_matrix(X, kernel="laplacian", gamma=0.8)
    init = random_partition(rng, 203, 4)
    weights = rng.uniform(0.2, 3.0, 203) if weighted else None
    ref = reference_kernel_kmeans(K, init, 4, weights)
    result = run_fit(K, 4, init, device, kernel="precomputed", sample_weight=weights)
    assert_same_run(result, ref)


def shifted_quadratic(A, B, shift=1.0):
    """(<a, b> + shift)^2, written with operators NumPy and CuPy arrays share."""
    return (A @ B.T + shift) ** 2


def test_callable_kernel_matches_reference(device):
    X, rng = make_data(150, 3, 32)
    init = random_partition(rng, 150, 3)
    K = (np.einsum("ik,jk->ij", X, X) + 0.5) ** 2
    ref = reference_kernel_kmeans(K, init, 3)
    result = run_fit(X, 3, init, device, kernel=shifted_quadratic, kernel_params={"shift": 0.5})
    assert_same_run(result, ref)


# --------------------------------------------------------------------------- shared shapes data sets

def standardized_shape_set(name):
    X, y = shape_set(name)  # the real set, or a generated look-alike where the shared data is missing
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    return X, y, int(y.max()) + 1


@pytest.mark.parametrize("name", list(SHAPE_TABLE))
def test_shape_sets_match_reference(name, device):
    X, _, k = standardized_shape_set(name)
    init = nearest_seed_partition(X, k, np.random.default_rng(41))
    ref = reference_kernel_kmeans(kernel_matrix(X, kernel="rbf"), init, k)
    result = run_fit(X, k, init, device, kernel="rbf")
    assert_resolved_params(result, default_kernel_params(X, "rbf"))
    assert_same_run(result, ref)


# --------------------------------------------------------------------------- float32 against the float64 reference

# float32 kernel entries carry ~1e-7 relative error and sums over a few hundred points ~1e-5; 1e-4 leaves room
# for the cancellation in K_ii - 2 S/n_c + C/n_c^2. A near-tie may flip a point, so labels must agree on 99%.
RTOL32 = 1e-4
MIN_LABEL_AGREEMENT = 0.99


def assert_float32_close(result, K, ref, weights=None):
    labels = host(result.labels)
    assert np.mean(labels == ref.labels) >= MIN_LABEL_AGREEMENT
    # The reported objective is that of the returned labels, computed in float64 by the reference...
    assert result.objective == pytest.approx(kernel_kmeans_objective(K, labels, weights, k=ref.labels.max() + 1),
                                             rel=RTOL32)
    # ...and it is as good as the float64 run's.
    assert result.objective == pytest.approx(ref.objective, rel=RTOL32)
    assert result.dtype == "float32"


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("kernel", ["rbf", "polynomial", "linear", "laplacian"])
def test_float32_close_to_float64_reference(kernel, weighted, device):
    X, rng = make_data(500, 6, 51)
    init = nearest_seed_partition(X, 5, rng)
    weights = rng.uniform(0.2, 3.0, 500) if weighted else None
    K = kernel_matrix(X, kernel=kernel)
    ref = reference_kernel_kmeans(K, init, 5, weights)
    result = run_fit(X, 5, init, device, kernel=kernel, sample_weight=weights, dtype="float32", tol=0.0)
    assert_float32_close(result, K, ref, weights)


@pytest.mark.parametrize("name", list(SHAPE_TABLE))
def test_shape_sets_float32_close_to_reference(name, device):
    X, _, k = standardized_shape_set(name)
    init = nearest_seed_partition(X, k, np.random.default_rng(41))
    K = kernel_matrix(X, kernel="rbf")
    ref = reference_kernel_kmeans(K, init, k)
    result = run_fit(X, k, init, device, kernel="rbf", dtype="float32", tol=0.0)
    assert_float32_close(result, K, ref)


# --------------------------------------------------------------------------- kkmgpu.kernel_matrix

# Entry-wise bounds relative to max|K|: float64 to 1e-12, float32 to 1e-5 (~100 ulp). A distance kernel's
# diagonal is exp(0) = 1 and must come out as 1 to the same accuracy.
KERNEL_ATOL = {"float64": 1e-12, "float32": 1e-5}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_matrix_matches_reference(kernel, dtype, device):
    rng = np.random.default_rng(61)
    X = rng.normal(scale=2.0, size=(150, 5)) + 3.0  # off-centre on purpose
    Y = rng.normal(scale=2.0, size=(40, 5)) + 3.0
    expected_sym = kernel_matrix(X, kernel=kernel)
    expected_rect = kernel_matrix(X, Y, kernel=kernel)  # defaults resolved from X
    K = host(kkmgpu.kernel_matrix(X, kernel=kernel, dtype=dtype, device=device))
    K_rect = host(kkmgpu.kernel_matrix(X, Y, kernel=kernel, dtype=dtype, device=device))
    assert K.dtype == np.dtype(dtype) and K.shape == (150, 150) and K_rect.shape == (150, 40)
    atol = KERNEL_ATOL[dtype] * np.abs(expected_sym).max()
    np.testing.assert_allclose(K_rect, expected_rect, rtol=0, atol=atol)
    if kernel in ("rbf", "laplacian"):
        np.testing.assert_allclose(np.diag(K), 1.0, rtol=0, atol=atol, err_msg="k(x, x) = exp(0) must be 1")
    np.testing.assert_allclose(K, expected_sym, rtol=0, atol=atol)


def test_kernel_matrix_callable_receives_params(device):
    rng = np.random.default_rng(62)
    X = rng.normal(size=(30, 2))
    K = host(kkmgpu.kernel_matrix(X, kernel=shifted_quadratic, kernel_params={"shift": 2.0}, dtype="float64",
                                  device=device))
    np.testing.assert_allclose(K, (X @ X.T + 2.0) ** 2, rtol=1e-12)


@pytest.mark.parametrize("update", ["full", "incremental", "auto"])
def test_update_modes_match_the_reference(device, update):
    """Full passes, incremental updates (S += K[:, moved] dY) and the automatic choice all give the
    reference's labels and objective from the same initial labels (float64)."""
    rng = np.random.default_rng(77)
    X = np.vstack([rng.normal(c, 1.2, size=(90, 3)) for c in (0.0, 3.0, 6.0)])
    init = rng.integers(0, 3, X.shape[0])
    gamma = 0.3
    K = reference.kernel_matrix(X, kernel="rbf", gamma=gamma)
    ref = reference.reference_kernel_kmeans(K, init, 3, max_iter=300, tol=0.0)
    res = kkmgpu.fit(X, 3, kernel="rbf", gamma=gamma, init=init, dtype="float64", tol=0.0, device=device,
                     update=update)
    ref_labels, ref_objective = ref.labels, ref.objective
    assert res.n_iter == ref.n_iter > 3
    np.testing.assert_array_equal(res.labels, ref_labels)
    assert res.objective == pytest.approx(ref_objective, rel=1e-9)
