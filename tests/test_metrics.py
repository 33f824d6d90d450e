"""kkmgpu.metrics against scikit-learn and against a direct feature-space computation."""

import sys

import numpy as np
import pytest
from reference import kernel_kmeans_objective as reference_objective
from reference import kernel_matrix
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from kkmgpu import metrics


def random_labelings(seed):
    """Pairs of labelings of varied size, cluster counts and label values (not 0..k-1)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 400))
    a = rng.integers(0, int(rng.integers(1, 9)), n)
    b = rng.integers(0, int(rng.integers(1, 12)), n)
    # Arbitrary label values: shifted, negative, sparse.
    b = np.array([-3, 5, 17, 100, 2, 8, 9, 11, 40, 41, 42, 43])[b]
    if seed % 3 == 0:  # partly agreeing labelings, not just independent noise
        keep = rng.uniform(size=n) < 0.7
        b = np.where(keep, a + 50, b)
    return a, b


EDGE_CASES = {
    "identical": (np.array([0, 0, 1, 1, 2, 2]), np.array([0, 0, 1, 1, 2, 2])),
    "permuted": (np.array([0, 0, 1, 1, 2, 2]), np.array([5, 5, 3, 3, 9, 9])),
    "one-cluster-both": (np.zeros(7, int), np.zeros(7, int)),
    "one-cluster-vs-many": (np.zeros(6, int), np.arange(6)),
    "singletons-both": (np.arange(6), np.arange(6)[::-1]),
    "two-points": (np.array([0, 1]), np.array([1, 1])),
    "single-point": (np.array([3]), np.array([4])),
}


def nmi_fallback(a, b):
    return metrics._nmi_numpy(a, b)


def ari_fallback(a, b):
    return metrics._ari_numpy(a, b)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (metrics.nmi, normalized_mutual_info_score),
        (metrics.ari, adjusted_rand_score),
        (nmi_fallback, normalized_mutual_info_score),
        (ari_fallback, adjusted_rand_score),
    ],
    ids=["nmi", "ari", "nmi-fallback", "ari-fallback"],
)
def test_matches_sklearn_on_random_labelings(ours, theirs, seed):
    a, b = random_labelings(seed)
    value = ours(a, b)
    assert isinstance(value, float)
    assert value == pytest.approx(theirs(a, b), rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("case", list(EDGE_CASES), ids=list(EDGE_CASES))
@pytest.mark.parametrize(
    ("ours", "theirs"),
    [(nmi_fallback, normalized_mutual_info_score), (ari_fallback, adjusted_rand_score)],
    ids=["nmi-fallback", "ari-fallback"],
)
def test_fallback_edge_cases_match_sklearn(ours, theirs, case):
    a, b = EDGE_CASES[case]
    assert ours(a, b) == pytest.approx(theirs(a, b), abs=1e-12)


def test_public_functions_use_fallback_without_sklearn(monkeypatch):
    # A None entry in sys.modules makes `from sklearn.metrics import ...` raise ImportError.
    a, b = random_labelings(3)
    expected_nmi, expected_ari = normalized_mutual_info_score(a, b), adjusted_rand_score(a, b)
    monkeypatch.setitem(sys.modules, "sklearn.metrics", None)
    assert metrics.nmi(a, b) == pytest.approx(expected_nmi, rel=1e-10)
    assert metrics.ari(a, b) == pytest.approx(expected_ari, rel=1e-10)


def test_metrics_accept_lists_and_reject_mismatch():
    assert metrics.nmi([0, 0, 1, 1], [1, 1, 0, 0]) == pytest.approx(1.0)
    assert metrics.ari([0, 0, 1, 1], [1, 1, 0, 0]) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        metrics.nmi([0, 1, 1], [0, 1])
    with pytest.raises(ValueError):
        metrics.ari([0, 1, 1], [0, 1])


# --------------------------------------------------------------------------- kernel_kmeans_objective


def feature_space_objective(X, labels, weights):
    """sum_i w_i ||x_i - m_c||^2 with m_c the weighted mean, computed in input space."""
    total = 0.0
    for c in np.unique(labels):
        members = labels == c
        mean = np.average(X[members], axis=0, weights=weights[members])
        total += float(np.sum(weights[members] * np.sum((X[members] - mean) ** 2, axis=1)))
    return total


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_objective_with_linear_kernel_is_weighted_sse(seed, weighted):
    rng = np.random.default_rng(seed)
    n, d, k = 90 + 17 * seed, 1 + 2 * seed, 2 + seed
    X = rng.normal(size=(n, d)) * rng.uniform(0.5, 3.0, d) + rng.normal(size=d)
    labels = rng.integers(0, k, n)
    weights = rng.uniform(0.1, 4.0, n) if weighted else np.ones(n)
    K = X @ X.T
    value = metrics.kernel_kmeans_objective(K, labels, sample_weight=weights if weighted else None)
    assert isinstance(value, float)
    assert value == pytest.approx(feature_space_objective(X, labels, weights), rel=1e-9)


@pytest.mark.parametrize("kernel", ["rbf", "laplacian", "polynomial"])
def test_objective_matches_reference(kernel):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(120, 3))
    labels = rng.integers(0, 4, 120)
    weights = rng.uniform(0.2, 2.0, 120)
    K = kernel_matrix(X, kernel=kernel)
    assert metrics.kernel_kmeans_objective(K, labels, weights) == pytest.approx(
        reference_objective(K, labels, weights), rel=1e-10)


def test_objective_ignores_unused_label_values():
    # Labels {0, 2}: cluster 1 is empty and contributes nothing.
    rng = np.random.default_rng(6)
    X = rng.normal(size=(40, 2))
    labels = np.where(rng.uniform(size=40) < 0.5, 0, 2)
    K = X @ X.T
    assert metrics.kernel_kmeans_objective(K, labels) == pytest.approx(
        feature_space_objective(X, labels, np.ones(40)), rel=1e-9)


def test_objective_of_float32_kernel_is_computed_in_float64():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(200, 4))
    labels = rng.integers(0, 3, 200)
    K64 = kernel_matrix(X, kernel="rbf")
    K32 = K64.astype(np.float32)
    # Same entries up to float32 rounding of K; the sums must not add float32 error on top.
    expected = reference_objective(K32.astype(np.float64), labels)
    assert metrics.kernel_kmeans_objective(K32, labels) == pytest.approx(expected, rel=1e-10)
