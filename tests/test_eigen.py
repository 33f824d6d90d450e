"""method="eigen" (Algorithm 16 of kernel-kmeans-trace-objective-eigendecomposition.txt) held to the papers.

- with every component, A A^T = K (Theorem 40), so the Lloyd objective on A equals the kernel k-means
  objective of the same labels on K (Corollary 7), and iterations from the same labels follow the float64
  reference of tests/reference.py exactly;
- the top-r route: eigenvalues equal the r largest of numpy's float64 eigvalsh, and the objective is plain
  k-means (inertia) on the reference embedding V_r Lambda_r^(1/2);
- negative eigenvalues (the sigmoid kernel is not PSD) are clipped, counted, warned about, and the objective
  is the one of the clipped matrix V max(Lambda, 0) V^T;
- two circles are separated; predict (Nystrom embedding) reproduces the training labels and the reference
  assignment of new points; Lloyd on the embedding never allocates an n x n array; parameter checks.
"""

import tracemalloc
import warnings

import numpy as np
import pytest
from reference import assign_new_points, kernel_kmeans_objective, kernel_matrix, reference_kernel_kmeans
from synthetic import blobs, random_partition

import kkmgpu
from kkmgpu.backend import device as _backend
from kkmgpu.engine import embedding as _eigen
from kkmgpu.engine.lloyd import run_restarts
from kkmgpu.methods import eigen as _eigen_method
from kkmgpu.metrics import nmi


@pytest.fixture(autouse=True)
def _one_blas_thread():
    """LAPACK on one thread: the results do not depend on it, and on a shared 2-core machine a multithreaded
    OpenBLAS eigh of a 400 x 400 matrix was measured at 2-4 s instead of 0.03 s when other jobs hold a core."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(1, user_api="blas"):
        yield


RTOL = {"float64": 1e-9, "float32": 2e-4}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_all_components_objective_equals_kernel_objective(device, dtype):
    X, _ = blobs(300, 4, 5, seed=11)
    K = kernel_matrix(X, kernel="rbf", gamma=0.1)
    result = kkmgpu.fit(X, 5, method="eigen", gamma=0.1, dtype=dtype, device=device, random_state=3)
    reference = kernel_kmeans_objective(K, result.labels)
    assert result.method_params["n_components"] == 300
    assert result.objective == pytest.approx(reference, rel=RTOL[dtype])
    assert result.exact_objective == pytest.approx(reference, rel=RTOL[dtype])
    assert result.method == "eigen" and result.timings["eigendecomposition"] >= 0


def test_same_iterations_as_the_reference_from_the_same_labels(device):
    X, _ = blobs(250, 3, 4, seed=5, spread=2.0)
    K = kernel_matrix(X, kernel="rbf", gamma=0.3)
    init = random_partition(250, 4, seed=2)
    ref = reference_kernel_kmeans(K, init, 4)
    result = kkmgpu.fit(X, 4, method="eigen", gamma=0.3, dtype="float64", device=device, init=init, tol=0.0)
    np.testing.assert_array_equal(result.labels, ref.labels)
    np.testing.assert_allclose(result.objective_history, ref.objective_history, rtol=1e-9)
    assert result.n_iter == ref.n_iter


def test_precomputed_kernel_and_sample_weight(device, rng):
    X, _ = blobs(200, 3, 3, seed=8)
    K = kernel_matrix(X, kernel="polynomial", gamma=0.2, degree=2, coef0=1.0)
    w = rng.uniform(0.5, 2.0, size=200)
    init = random_partition(200, 3, seed=4)
    ref = reference_kernel_kmeans(K, init, 3, sample_weight=w)
    result = kkmgpu.fit(K, 3, kernel="precomputed", method="eigen", dtype="float64", device=device, init=init,
                        sample_weight=w, tol=0.0)
    np.testing.assert_array_equal(result.labels, ref.labels)
    assert result.objective == pytest.approx(ref.objective, rel=1e-9)


def test_embedding_reproduces_the_kernel_matrix(device):
    X, _ = blobs(150, 3, 3, seed=1)
    K_ref = kernel_matrix(X, kernel="laplacian", gamma=0.3)
    backend = _backend.resolve_device(device)
    A, eigenvalues, _, info = _eigen.embed(backend.asarray(K_ref), 150, backend, np.random.default_rng(0))
    A = backend.to_host(A)
    expected = np.linalg.eigvalsh(K_ref)[::-1]
    np.testing.assert_allclose(eigenvalues, expected[expected > 0][:eigenvalues.size], rtol=1e-8,
                               atol=1e-12 * expected[0])
    np.testing.assert_allclose(A @ A.T, K_ref, atol=1e-10 * expected[0])
    assert info["captured_fraction"] == pytest.approx(1.0, abs=1e-10)


@pytest.mark.parametrize("r", [2, 7, 40])
def test_top_components_match_the_reference_spectrum_and_kmeans_on_it(device, r):
    X, _ = blobs(400, 5, 6, seed=21)
    K = kernel_matrix(X, kernel="rbf", gamma=0.05)
    w_ref, V_ref = np.linalg.eigh(K)
    w_ref, V_ref = w_ref[::-1][:r], V_ref[:, ::-1][:, :r]
    A_ref = V_ref * np.sqrt(w_ref)
    result = kkmgpu.fit(X, 6, method="eigen", n_components=r, gamma=0.05, dtype="float64", device=device,
                        random_state=0)
    params = result.method_params
    assert params["n_components"] == r and params["n_components_used"] == r
    assert params["largest_eigenvalue"] == pytest.approx(w_ref[0], rel=1e-9)
    assert params["smallest_eigenvalue"] == pytest.approx(w_ref[-1], rel=1e-8)
    assert params["captured_fraction"] == pytest.approx(w_ref.sum() / np.trace(K), rel=1e-9)
    # plain k-means objective (inertia) of the labels on the reference embedding
    labels = np.asarray(result.labels)
    inertia = sum(((A_ref[labels == c] - A_ref[labels == c].mean(axis=0)) ** 2).sum() for c in np.unique(labels))
    assert result.objective == pytest.approx(inertia, rel=1e-8)
    assert result.exact_objective == pytest.approx(kernel_kmeans_objective(K, labels), rel=1e-9)
    assert result.exact_objective >= result.objective * (1 - 1e-12)  # dropped components only add


def test_negative_eigenvalues_are_clipped_and_reported(device):
    X, _ = blobs(200, 4, 3, seed=3)
    params = {"gamma": 0.5, "coef0": 1.0}
    K = kernel_matrix(X, kernel="sigmoid", params=params)
    w, V = np.linalg.eigh(K)
    negative = w[w < 0]
    assert np.abs(negative).sum() > 1e-3 * np.abs(w).sum()  # the sigmoid kernel is far from PSD here
    with pytest.warns(UserWarning, match="negative eigenvalues"):
        result = kkmgpu.fit(X, 3, method="eigen", kernel="sigmoid", gamma=0.5, coef0=1.0, dtype="float64",
                            device=device, random_state=0)
    info = result.method_params
    assert info["negative_eigenvalue_mass"] == pytest.approx(np.abs(negative).sum(), rel=1e-8)
    # eigenvalues within rounding of 0 may fall on either side
    noise = 1e-9 * w.max()
    assert np.count_nonzero(w < -noise) <= info["n_negative_eigenvalues"] <= np.count_nonzero(w < noise)
    assert info["smallest_eigenvalue"] == pytest.approx(w[0], rel=1e-8)
    K_clipped = (V * np.maximum(w, 0.0)) @ V.T
    assert result.objective == pytest.approx(kernel_kmeans_objective(K_clipped, result.labels), rel=1e-8)
    assert result.exact_objective == pytest.approx(kernel_kmeans_objective(K, result.labels), rel=1e-8)


def test_psd_kernel_does_not_warn(device):
    X, _ = blobs(300, 3, 4, seed=9)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        result = kkmgpu.fit(X, 4, method="eigen", gamma=0.2, device=device, random_state=0)
    assert result.method_params["negative_fraction"] <= _eigen.MATERIAL_NEGATIVE_FRACTION


def test_two_circles_are_separated(device):
    X, y = kkmgpu.datasets.make_two_circles(400, random_state=0)
    result = kkmgpu.fit(X, 2, method="eigen", gamma=5.0, device=device, n_init=10, random_state=0)
    assert nmi(y, result.labels) == pytest.approx(1.0)
    few = kkmgpu.fit(X, 2, method="eigen", gamma=5.0, n_components=20, device=device, n_init=10, random_state=0)
    assert nmi(y, few.labels) == pytest.approx(1.0)


@pytest.mark.parametrize("n_components", [None, 12])
def test_predict_embeds_new_points(device, n_components):
    X, y = blobs(500, 3, 4, seed=13, spread=6.0)
    X_train, X_new = X[:400], X[400:]
    result = kkmgpu.fit(X_train, 4, method="eigen", gamma=0.1, dtype="float64", device=device, n_init=3,
                        random_state=1, n_components=n_components)
    np.testing.assert_array_equal(kkmgpu.predict(result, X_train), result.labels)
    # well separated blobs: the Nystrom embedding gives the exact kernel assignment of new points
    K_train = kernel_matrix(X_train, kernel="rbf", gamma=0.1)
    K_new = kernel_matrix(X_new, X_train, kernel="rbf", gamma=0.1)
    expected = assign_new_points(K_new, K_train, np.asarray(result.labels), 4)
    np.testing.assert_array_equal(kkmgpu.predict(result, X_new, batch_size=37), expected)


def test_predict_precomputed(device):
    X, _ = blobs(300, 2, 3, seed=17, spread=6.0)
    K = kernel_matrix(X, kernel="rbf", gamma=0.2)
    result = kkmgpu.fit(K[:250, :250], 3, kernel="precomputed", method="eigen", dtype="float64", device=device,
                        random_state=0)
    expected = assign_new_points(K[250:, :250], K[:250, :250], np.asarray(result.labels), 3)
    np.testing.assert_array_equal(kkmgpu.predict(result, K[250:, :250]), expected)


def test_lloyd_on_the_embedding_allocates_no_n_by_n_array():
    n, r, k = 3000, 8, 5
    rng = np.random.default_rng(0)
    A = rng.normal(size=(n, r))
    backend = _backend.Backend("cpu")
    operator = _eigen.EmbeddingOperator(A, np.ones(n), backend)
    tracemalloc.start()
    try:
        best, _, _ = run_restarts(operator, k, init="k-means++", n_init=2, max_iter=300, tol=0.0,
                                  rng=np.random.default_rng(1), verbose=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < n * n * 8 / 10, f"peak {peak} bytes: an n x n array ({n * n * 8} bytes) was formed"
    # and the cluster sums equal (A A^T) Y of the final labels
    Y = np.zeros((n, k))
    Y[np.arange(n), best.labels] = 1.0
    np.testing.assert_allclose(operator.cluster_sums(best.labels, k), (A @ A.T) @ Y, rtol=1e-10, atol=1e-9)


def test_default_components_for_large_n():
    assert _eigen_method.resolve_components(None, 1000, 10) == 1000
    assert _eigen_method.resolve_components(None, _eigen.FULL_DECOMPOSITION_MAX_N + 1, 10) == _eigen.DEFAULT_COMPONENTS
    assert _eigen_method.resolve_components(None, 10_000, 40) == 320
    assert _eigen_method.resolve_components(17, 10_000, 40) == 17


def test_estimator_and_verbose(capsys):
    X, y = kkmgpu.datasets.make_two_circles(300, random_state=0)
    model = kkmgpu.KernelKMeans(2, method="eigen", n_components=30, gamma=5.0, n_init=10, random_state=0,
                                device="cpu", verbose=True).fit(X)
    assert nmi(y, model.labels_) == pytest.approx(1.0)
    assert model.get_params()["n_components"] == 30
    assert model.inertia_ == model.result_.exact_objective
    np.testing.assert_array_equal(model.predict(X), model.labels_)
    assert "eigen: top 30 eigenpairs" in capsys.readouterr().out


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(method="exact", n_components=5), ValueError, "only applies to method='eigen'"),
    (dict(method="eigen", n_components=0), ValueError, "n_components=0 must be >= 1"),
    (dict(method="eigen", n_components=101), ValueError, "n_components=101 must be <= n_samples=100"),
    (dict(method="eigen", n_components=2.5), TypeError, "n_components=2.5 must be an integer"),
    (dict(method="eigen", dtype="float16"), ValueError, "float16.*not supported by method='eigen'"),
    (dict(method="eigenvalues"), ValueError, "method='eigenvalues' is not available"),
])
def test_parameter_checks(kwargs, error, match):
    X, _ = blobs(100, 2, 2, seed=0)
    with pytest.raises(error, match=match):
        kkmgpu.fit(X, 2, device="cpu", **kwargs)


@pytest.mark.parametrize("kernel, k, init", [("rbf", 10, "k-means++"), ("linear", 8, "k-means++"),
                                             ("linear", 10, "random"), ("rbf", 6, "random")])
def test_duplicate_points_converge(device, kernel, k, init):
    """k above the number of distinct points: Lloyd stops after a few steps with the objective of its labels
    on K (float32 cluster sums made tied points flip between clusters and ran all max_iter steps with an
    objective alternating between two rounding-noise values); from k-means++ seeds every cluster holds copies
    of one point and the objective is 0 up to rounding."""
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(5), 40)
    X = rng.normal(size=(5, 4))[groups]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Number of distinct clusters (5) found smaller than n_clusters"
        result = kkmgpu.fit(X, k, method="eigen", kernel=kernel, init=init, device=device, random_state=0)
    assert result.converged and result.n_iter <= 10, (result.n_iter, result.stop_reason)
    labels = np.asarray(result.labels)
    K = kernel_matrix(X, kernel=kernel, params=dict(result.kernel_params))
    reference, scale = kernel_kmeans_objective(K, labels), np.trace(K)
    assert result.objective == pytest.approx(reference, abs=1e-6 * scale)
    assert result.exact_objective == pytest.approx(reference, abs=1e-6 * scale)
    if init == "k-means++":
        assert all(np.unique(groups[labels == c]).size == 1 for c in range(k))  # a refinement of the groups
        assert abs(reference) <= 1e-9 * scale


def test_embedding_rows_and_seeds_stay_on_the_device(device):
    """The embedding operator's kernel rows for k-means++ are (A A^T)[index] in float64 on its device, and seeding
    through them picks what seeding through the dense K = A A^T picks (the same rows, the same draws)."""
    from kkmgpu.engine.dense import DenseKernelOperator
    from kkmgpu.engine.lloyd import kmeans_plus_plus

    backend = _backend.resolve_device(device)
    A = np.random.default_rng(70).normal(size=(120, 6))
    w = np.random.default_rng(71).uniform(0.5, 2.0, 120)
    with backend.activate():
        op = _eigen.EmbeddingOperator(backend.asarray(A), backend.asarray(w), backend)
        rows = op.device_rows(backend.asarray(np.array([3, 50, 3])))
        assert not isinstance(rows, np.ndarray) or device == "cpu"
        np.testing.assert_allclose(np.asarray(rows.get() if hasattr(rows, "get") else rows), (A @ A.T)[[3, 50, 3]],
                                   rtol=1e-12, atol=1e-12)
        dense = DenseKernelOperator(backend.asarray(A @ A.T), backend.asarray(w), backend)
        for seed in range(3):
            np.testing.assert_array_equal(kmeans_plus_plus(op, 5, np.random.default_rng(seed)),
                                          kmeans_plus_plus(dense, 5, np.random.default_rng(seed)))
