"""c-NNC (Off-the-grid paper, §7) against a direct Python-loop implementation of the paper's definition."""

import math

import numpy as np
import pytest

from kkmgpu import metrics
from kkmgpu.metrics.cnnc import CnncScorer
from kkmgpu.backend.device import resolve_device


def reference_cnnc(X, labels, k, tie="index"):
    """The paper's definition, literally: NNC(i, c) from the c nearest other points, sum over c = 1..n-1.

    Distances are direct float64 differences (no GEMM); ties are broken by the lower index ("index") or,
    for the control in the tie test, by the higher one ("reverse").
    """
    X = np.asarray(X, dtype=np.float64)
    labels = [int(v) for v in labels]
    n = len(labels)
    C = math.log(n - 1) + np.euler_gamma + 1.0 / (2 * n - 2)
    cluster_total = [0.0] * k
    for i in range(n):
        others = [j for j in range(n) if j != i]
        dist = {j: float(np.sum((X[i] - X[j]) ** 2)) for j in others}
        key = (lambda j: (dist[j], j)) if tie == "index" else (lambda j: (dist[j], -j))
        neighbours = sorted(others, key=key)
        total = 0.0
        for c in range(1, n):
            nnc = sum(labels[i] != labels[neighbours[j]] for j in range(c)) / c
            total += nnc / c
        cluster_total[labels[i]] += total
    sizes = [labels.count(p) for p in range(k)]
    empty = sum(size == 0 for size in sizes)
    return (empty + sum(cluster_total[p] / (C * max(1, sizes[p])) for p in range(k))) / k


def random_case(seed):
    """Random data (continuous, so no distance ties) and labels; some cases leave clusters empty."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 40))
    d = int(rng.integers(1, 6))
    X = rng.normal(size=(n, d)) * rng.uniform(0.5, 5.0) + rng.uniform(-10, 10, size=d)
    used = int(rng.integers(1, min(n, 6) + 1))
    labels = rng.integers(0, used, n)
    k = used + int(rng.integers(0, 3))          # k > used: clusters used..k-1 are empty
    if seed % 4 == 0 and used > 1:             # an empty cluster in the middle of the index range
        labels[labels == 0] = 1
    return X, labels, k


@pytest.mark.parametrize("seed", range(10))
def test_matches_direct_reference(device, seed):
    X, labels, k = random_case(seed)
    assert metrics.cnnc(X, labels, k, device=device) == pytest.approx(reference_cnnc(X, labels, k),
                                                                      rel=1e-12, abs=1e-14)


def test_empty_clusters_count_in_D(device, rng):
    X = rng.normal(size=(25, 3))
    labels = rng.integers(0, 3, 25) * 2           # clusters 0, 2, 4 used; 1, 3, 5 (k=6) empty
    labels[:3] = [0, 2, 4]
    value = metrics.cnnc(X, labels, 6, device=device)
    assert value == pytest.approx(reference_cnnc(X, labels, 6), rel=1e-12)
    # the same partition with its clusters renamed 0, 1, 2 and k = 3: the cluster sum is unchanged
    dense = np.unique(labels, return_inverse=True)[1]
    assert value == pytest.approx((3 + 3 * metrics.cnnc(X, dense, 3, device=device)) / 6, rel=1e-12)


def test_one_cluster_is_zero(device, rng):
    X = rng.normal(size=(30, 2))
    assert metrics.cnnc(X, np.zeros(30, int), device=device) == 0.0
    assert reference_cnnc(X, np.zeros(30, int), 1) == 0.0


def test_ties_from_duplicate_points_break_by_index(device):
    # integer coordinates: every squared distance is an exact integer in both implementations
    rng = np.random.default_rng(7)
    base = rng.integers(-2, 3, size=(8, 2)).astype(np.float64)
    X = np.concatenate([base, base[:5], base[2:6], base[:3]])      # many duplicates and equal distances
    labels = rng.integers(0, 3, X.shape[0])
    labels[:3] = [0, 1, 2]
    expected = reference_cnnc(X, labels, 3)
    # the tie rule matters for this input (so the comparison below can fail)
    assert abs(expected - reference_cnnc(X, labels, 3, tie="reverse")) > 1e-6
    assert metrics.cnnc(X, labels, device=device) == pytest.approx(expected, rel=1e-12)
    for batch_size in (1, 3, X.shape[0]):
        assert metrics.cnnc(X, labels, device=device, batch_size=batch_size) == pytest.approx(expected, rel=1e-12)


def test_singletons_reach_the_harmonic_bound(device, rng):
    # every neighbour of every point is in another cluster: each point sums 1/c over c = 1..n-1
    n = 50
    X = rng.normal(size=(n, 3))
    value = metrics.cnnc(X, np.arange(n), device=device)
    harmonic = sum(1.0 / c for c in range(1, n))
    assert value == pytest.approx(harmonic / (math.log(n - 1) + np.euler_gamma + 1 / (2 * n - 2)), rel=1e-12)
    assert 0.99 < value < 1.0


@pytest.mark.parametrize("seed", range(5))
def test_bounds_without_empty_clusters(device, seed):
    rng = np.random.default_rng(100 + seed)
    n, k = 120, int(rng.integers(2, 8))
    X = rng.normal(size=(n, 4))
    labels = rng.integers(0, k, n)
    labels[:k] = np.arange(k)
    value = metrics.cnnc(X, labels, device=device)
    assert 0.0 < value < 1.0


def test_separated_blobs_score_far_below_random_labels(device, rng):
    centres = np.array([[0.0, 0.0], [20.0, 0.0], [0.0, 20.0], [20.0, 20.0]])
    truth = np.repeat(np.arange(4), 60)
    X = centres[truth] + rng.normal(size=(truth.size, 2))
    good = metrics.cnnc(X, truth, device=device)
    shuffled = metrics.cnnc(X, rng.permutation(truth), device=device)
    assert good < 0.25 * shuffled
    # the best possible labelling is no better than the truth here; splitting one blob in two is worse
    split = truth.copy()
    split[(truth == 0) & (X[:, 0] > 0)] = 4
    split[truth == 3] = 2                       # and blobs 2 and 3 merged: 4 clusters, none empty
    assert metrics.cnnc(X, np.unique(split, return_inverse=True)[1], device=device) > good


def test_invariant_to_point_order_and_cluster_names(device, rng):
    X, labels = rng.normal(size=(60, 3)), rng.integers(0, 4, 60)
    labels[:4] = np.arange(4)
    value = metrics.cnnc(X, labels, device=device)
    perm = rng.permutation(60)
    assert metrics.cnnc(X[perm], labels[perm], device=device) == pytest.approx(value, rel=1e-12)
    rename = np.array([2, 0, 3, 1])
    assert metrics.cnnc(X, rename[labels], device=device) == pytest.approx(value, rel=1e-12)


def test_scorer_reuses_the_neighbour_order(device, rng):
    X = rng.normal(size=(45, 2))
    backend = resolve_device(device)
    kept = CnncScorer(X, backend, batch_size=8)
    assert kept.order.keep
    for seed in range(3):
        labels = np.random.default_rng(seed).integers(0, 3, 45)
        expected = reference_cnnc(X, labels, 4)
        assert kept(labels, 4) == pytest.approx(expected, rel=1e-12)     # second and third calls: kept tiles
        assert metrics.cnnc(X, labels, 4, device=device, batch_size=45) == pytest.approx(expected, rel=1e-12)


def test_float32_input_and_float_integer_labels(device, rng):
    X = rng.normal(size=(30, 3)).astype(np.float32)
    labels = rng.integers(0, 3, 30)
    expected = reference_cnnc(X.astype(np.float64), labels, 3)
    assert metrics.cnnc(X, labels.astype(np.float64), device=device) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(labels=np.zeros(9, int)), ValueError, r"shape \(9,\); expected \(10,\)"),
    (dict(labels=np.array([0, 1, -1, 0, 1, 0, 1, 0, 1, 0])), ValueError, r"must be >= 0; got the value -1"),
    (dict(labels=np.arange(10) % 3, k=2), ValueError, r"\[0, k=2\); got the value 2"),
    (dict(labels=np.full(10, 0.5)), ValueError, r"dtype float64; integer"),
    (dict(labels=np.zeros(10, int), k=0), ValueError, r"k=0 must be >= 1"),
    (dict(labels=np.zeros(10, int), k=2.0), TypeError, r"k=2.0 must be an integer"),
    (dict(labels=np.zeros(10, int), batch_size=0), ValueError, r"batch_size=0 must be >= 1"),
    (dict(labels=np.zeros(10, int), batch_size=2.5), TypeError, r"batch_size=2.5 must be an integer"),
    (dict(labels=np.zeros(10, int), device="gpu"), ValueError, r"device='gpu' is not valid"),
])
def test_invalid_input(kwargs, error, match):
    X = np.random.default_rng(3).normal(size=(10, 2))
    labels = kwargs.pop("labels")
    with pytest.raises(error, match=match):
        metrics.cnnc(X, labels, **kwargs)


def test_invalid_data():
    with pytest.raises(ValueError, match="must be 2-D"):
        metrics.cnnc(np.arange(5.0), np.zeros(5, int), device="cpu")
    X = np.random.default_rng(4).normal(size=(6, 2))
    X[2, 1] = np.nan
    with pytest.raises(ValueError, match="NaN or infinity"):
        metrics.cnnc(X, np.zeros(6, int), device="cpu")
    with pytest.raises(ValueError, match="X has 1 row; c-NNC needs at least 2 points"):
        metrics.cnnc(np.ones((1, 3)), [0], device="cpu")
