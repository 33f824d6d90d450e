"""The oracle itself: tests/reference.py against scikit-learn and explicit loops."""

import numpy as np
import pytest
from reference import (
    assign_new_points,
    cluster_distances,
    default_kernel_params,
    kernel_kmeans_objective,
    kernel_matrix,
    reference_kernel_kmeans,
)
from sklearn.cluster import KMeans
from sklearn.metrics import pairwise


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(23, 4)) * 1.5 + 0.3, rng.normal(size=(9, 4))


@pytest.mark.parametrize(
    ("kernel", "sklearn_kernel", "params"),
    [
        ("rbf", pairwise.rbf_kernel, {"gamma": 0.3}),
        ("polynomial", pairwise.polynomial_kernel, {"gamma": 0.2, "degree": 3, "coef0": 1.5}),
        ("sigmoid", pairwise.sigmoid_kernel, {"gamma": 0.1, "coef0": -0.4}),
        ("linear", pairwise.linear_kernel, {}),
    ],
)
def test_kernels_match_sklearn(data, kernel, sklearn_kernel, params):
    X, Y = data
    np.testing.assert_allclose(kernel_matrix(X, Y, kernel=kernel, params=params), sklearn_kernel(X, Y, **params),
                               rtol=1e-12, atol=1e-12)


def test_laplacian_uses_l2_norm(data):
    X, Y = data
    expected = np.array([[np.exp(-0.7 * np.sqrt(np.sum((x - y) ** 2))) for y in Y] for x in X])
    np.testing.assert_allclose(kernel_matrix(X, Y, kernel="laplacian", gamma=0.7), expected, rtol=1e-14)


def test_default_params(data):
    X, _ = data
    assert default_kernel_params(X, "rbf")["gamma"] == pytest.approx(1.0 / (4 * X.var(axis=0).mean()))
    # translation invariant, per column: X + c gives the same gamma for any offsets c
    c = np.array([1.7e3, -3e2, 0.0, 5e1])
    assert default_kernel_params(X + c, "rbf")["gamma"] == pytest.approx(default_kernel_params(X, "rbf")["gamma"])
    assert default_kernel_params(X, "polynomial") == {"gamma": 0.25, "degree": 3, "coef0": 1.0}
    assert default_kernel_params(X, "sigmoid") == {"gamma": 0.25, "coef0": 1.0}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_linear_kernel_kmeans_is_lloyd_kmeans(seed):
    """With the linear kernel, kernel k-means from given labels is scikit-learn's Lloyd k-means."""
    rng = np.random.default_rng(seed)
    n, k = 150 + 50 * seed, 3 + seed
    X = rng.normal(size=(n, 3)) + rng.normal(scale=3.0, size=(k, 3))[rng.integers(0, k, n)]
    init = rng.integers(0, k, n)
    init[:k] = np.arange(k)
    weights = rng.uniform(0.5, 2.0, n)
    ref = reference_kernel_kmeans(X @ X.T, init, k, weights)
    centres = np.stack([np.average(X[init == c], axis=0, weights=weights[init == c]) for c in range(k)])
    km = KMeans(k, init=centres, n_init=1, tol=0.0, max_iter=300, algorithm="lloyd").fit(X, sample_weight=weights)
    np.testing.assert_array_equal(ref.labels, km.labels_)
    assert ref.objective == pytest.approx(km.inertia_, rel=1e-9)
    assert ref.converged and np.all(np.diff(ref.objective_history) <= 1e-9 * ref.objective_history[0])


def test_distances_are_feature_space_distances():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(30, 2))
    labels = rng.integers(0, 3, 30)
    labels[:3] = [0, 1, 2]
    w = rng.uniform(0.5, 2.0, 30)
    dist = cluster_distances(X @ X.T, labels, 4, w)  # cluster 3 is empty
    for c in range(3):
        mean = np.average(X[labels == c], axis=0, weights=w[labels == c])
        np.testing.assert_allclose(dist[:, c], ((X - mean) ** 2).sum(1), rtol=1e-10, atol=1e-12)
    assert np.all(np.isinf(dist[:, 3]))
    assert kernel_kmeans_objective(X @ X.T, labels, w) == pytest.approx(
        float(np.sum(w * dist[np.arange(30), labels])))
    X_new = rng.normal(size=(8, 2))
    nearest = assign_new_points(X_new @ X.T, X @ X.T, labels, 3, w)
    means = np.stack([np.average(X[labels == c], axis=0, weights=w[labels == c]) for c in range(3)])
    np.testing.assert_array_equal(nearest, ((X_new[:, None] - means[None]) ** 2).sum(-1).argmin(1))


def test_refill_moves_farthest_point_from_clusters_that_keep_one():
    # Points on a line; init puts everything in cluster 0 except one point in cluster 1: cluster 2 is empty.
    X = np.array([[0.0], [0.1], [0.2], [5.0], [9.0]])
    init = np.array([0, 0, 0, 0, 1])
    ref = reference_kernel_kmeans(X @ X.T, init, 3, max_iter=1)
    # Step 1: the centres are 1.325 and 9; point 3 (5.0) is nearest cluster 0 but farthest from its centre
    # among the points whose cluster keeps another point, so it fills cluster 2.
    np.testing.assert_array_equal(ref.history_labels[1], [0, 0, 0, 2, 1])
    assert ref.n_iter == 1 and not ref.converged
