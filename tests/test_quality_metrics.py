"""The internal quality indices of kkmgpu.metrics against scikit-learn's and the thesis slides' formulas.

silhouette, Calinski-Harabasz and Davies-Bouldin are compared with ``sklearn.metrics`` on fresh seeded data
(including singleton clusters, non-contiguous and string labels, and tiles smaller than n); the sum of
variances with the slides' formula written out point by point. Undefined cases (one cluster, one cluster per
point) raise a clear error.
"""

import numpy as np
import pytest

from kkmgpu import metrics

sk_metrics = pytest.importorskip("sklearn.metrics", reason="scikit-learn is needed for the reference scores")

PAIRS = [
    (metrics.silhouette, sk_metrics.silhouette_score),
    (metrics.calinski_harabasz, sk_metrics.calinski_harabasz_score),
    (metrics.davies_bouldin, sk_metrics.davies_bouldin_score),
]


def clustered(rng, n, d, k, spread=3.0):
    centers = rng.normal(scale=spread, size=(k, d))
    y = rng.integers(0, k, n)
    return centers[y] + rng.normal(size=(n, d)), y


@pytest.mark.parametrize("ours, theirs", PAIRS, ids=["silhouette", "calinski_harabasz", "davies_bouldin"])
@pytest.mark.parametrize("n, d, k", [(50, 2, 3), (613, 7, 9), (400, 40, 2)])
def test_matches_scikit_learn(device, rng, ours, theirs, n, d, k):
    X, y = clustered(rng, n, d, k)
    X = X + 100.0  # far from the origin: the distances must not lose digits to the offset
    assert ours(X, y, device=device) == pytest.approx(theirs(X, y), rel=1e-9, abs=1e-12)
    noisy = rng.integers(0, k, n)  # a poor partition gives a different score, to the same precision
    assert ours(X, noisy, device=device) == pytest.approx(theirs(X, noisy), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("batch_size", [1, 7, 64, 1000])
def test_silhouette_tiles(device, rng, batch_size):
    X, y = clustered(rng, 230, 4, 5, spread=1.0)
    expected = sk_metrics.silhouette_score(X, y)
    assert metrics.silhouette(X, y, device=device, batch_size=batch_size) == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("ours, theirs", PAIRS, ids=["silhouette", "calinski_harabasz", "davies_bouldin"])
def test_singleton_cluster_and_arbitrary_labels(device, rng, ours, theirs):
    X, y = clustered(rng, 120, 3, 3)
    y = np.array(["a", "b", "c"])[y]
    y[5] = "lonely"  # a cluster of one point: silhouette 0 for it, as scikit-learn defines it
    assert ours(X, y, device=device) == pytest.approx(theirs(X, y), rel=1e-9)
    codes = np.unique(y, return_inverse=True)[1] * 7 + 3  # non-contiguous integers
    assert ours(X, codes, device=device) == pytest.approx(theirs(X, y), rel=1e-9)


def test_float32_input_and_duplicate_points(device, rng):
    X, y = clustered(rng, 200, 3, 4)
    X[10:20] = X[10]  # duplicates: zero distances inside a cluster
    X32 = X.astype(np.float32)
    for ours, theirs in PAIRS:
        assert ours(X32, y, device=device) == pytest.approx(theirs(X32.astype(np.float64), y), rel=1e-9)


@pytest.mark.parametrize("k", [1, 4])
def test_sum_of_variances_is_the_slides_formula(device, rng, k):
    X, y = clustered(rng, 300, 5, max(k, 1))
    y = y if k > 1 else np.zeros(300, dtype=int)
    expected = 0.0
    for c in np.unique(y):  # E = sum_l sum_{x_i in pi_l} ||x_i - c_l||^2
        members = X[y == c]
        centre = members.mean(axis=0)
        expected += sum(float(np.dot(x - centre, x - centre)) for x in members)
    assert metrics.sum_of_variances(X, y, device=device) == pytest.approx(expected, rel=1e-10)


def test_sum_of_variances_is_kmeans_inertia(rng):
    cluster = pytest.importorskip("sklearn.cluster", reason="scikit-learn is needed for KMeans")
    X, _ = clustered(rng, 500, 3, 5)
    km = cluster.KMeans(5, n_init=1, random_state=0).fit(X)
    assert metrics.sum_of_variances(X, km.labels_, device="cpu") == pytest.approx(km.inertia_, rel=1e-6)


def test_calinski_harabasz_is_the_slides_formula(rng):
    X, y = clustered(rng, 150, 2, 3)
    c = X.mean(axis=0)
    B = sum((y == l).sum() * np.sum((X[y == l].mean(axis=0) - c) ** 2) for l in range(3))
    W = sum(np.sum((X[y == l] - X[y == l].mean(axis=0)) ** 2) for l in range(3))
    assert metrics.calinski_harabasz(X, y, device="cpu") == pytest.approx((B / 2) / (W / 147), rel=1e-10)


def test_silhouette_by_hand():
    X = np.array([[0.0], [0.1], [100.0], [100.1]])
    # a = 0.1 for every point; b = 100.05 for the outer points, 99.95 for the inner ones
    expected = 1 - 0.05 * (1 / 100.05 + 1 / 99.95)
    assert metrics.silhouette(X, [0, 0, 1, 1], device="cpu") == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("fn", [metrics.silhouette, metrics.calinski_harabasz, metrics.davies_bouldin])
def test_undefined_number_of_clusters_raises(fn):
    X = np.arange(12.0).reshape(6, 2)
    with pytest.raises(ValueError, match=r"2 <= number of clusters <= n_samples - 1; got 1 distinct"):
        fn(X, np.zeros(6), device="cpu")
    with pytest.raises(ValueError, match=r"got 6 distinct label\(s\) for n_samples=6"):
        fn(X, np.arange(6), device="cpu")


@pytest.mark.parametrize("fn", [metrics.silhouette, metrics.calinski_harabasz, metrics.davies_bouldin,
                                metrics.sum_of_variances])
def test_bad_input_raises(fn):
    X = np.arange(12.0).reshape(6, 2)
    with pytest.raises(ValueError, match=r"labels have shape \(5,\); expected \(6,\)"):
        fn(X, [0, 1, 0, 1, 0], device="cpu")
    bad = X.copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match="NaN or infinity"):
        fn(bad, [0, 1, 0, 1, 0, 1], device="cpu")
    with pytest.raises(ValueError, match="must be 2-D"):
        fn(X[:, 0], [0, 1, 0, 1, 0, 1], device="cpu")


def test_silhouette_batch_size_checked():
    with pytest.raises(ValueError, match="batch_size=0 must be >= 1"):
        metrics.silhouette(np.arange(12.0).reshape(6, 2), [0, 1] * 3, device="cpu", batch_size=0)


@pytest.mark.parametrize("name", ["silhouette", "cnnc"])
def test_quadratic_metrics_are_tiled(rng, name):
    """tracemalloc sees NumPy's allocations: with 100-row tiles the O(n^2) metrics peak far below one n x n
    float64 array, and give the value of a single whole-matrix tile."""
    import tracemalloc

    n = 3000
    X, y = clustered(rng, n, 3, 4)
    fn = getattr(metrics, name)  # c-NNC is reachable from kkmgpu.metrics with the other indices
    assert name in metrics.__all__
    whole = fn(X, y, device="cpu", batch_size=n)
    tracemalloc.start()
    try:
        tiled = fn(X, y, device="cpu", batch_size=100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < n * n * 8 / 4, f"peak {peak} bytes: close to an n x n float64 array ({n * n * 8} bytes)"
    assert tiled == pytest.approx(whole, rel=1e-12)
