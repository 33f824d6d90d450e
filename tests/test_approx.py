"""method="approx": approximate kernel k-means (Chitta, Jin, Havens and Jain, KDD 2011) held to its formulas.

- From the same initial labels, the labels, objective history and iteration count equal a float64 reference
  that evaluates alpha_c = K_BB^+ K_B^T u_c / n_c and dist = K_ii - 2 (K_B alpha_c)_i + alpha_c^T K_BB alpha_c
  literally (tests/reference.py), with the same landmarks; also with sample weights and a precomputed K.
- It is k-means on the Nystrom features K_B K_BB^(-1/2): scikit-learn's KMeans on those features, started from
  the same partition's centres, ends with the same labels.
- With every point a landmark (m = n) the labels equal the exact method's from the same initialisation.
- The approximate objective bounds the exact objective of its labels from above; predict reproduces the training
  labels and the reference assignment of new points; no n x n array is formed; parameter errors name the rule.
"""

import tracemalloc

import numpy as np
import pytest
from reference import approx_distances, kernel_kmeans_objective, kernel_matrix, reference_approx_kernel_kmeans
from synthetic import blobs, random_partition

import kkmgpu
from kkmgpu.backend.device import resolve_device
from kkmgpu.kernels.spec import KernelSpec
from kkmgpu.methods import approx as _approx
from kkmgpu.metrics import nmi


def landmarks_of(result):
    return np.asarray(result._approx_state.index)


@pytest.mark.parametrize("kernel, params", [("rbf", dict(gamma=0.05)),
                                            ("polynomial", dict(gamma=0.1, degree=2, coef0=1.0))])
def test_same_iterations_as_chittas_formulas_from_the_same_labels(device, kernel, params):
    X, _ = blobs(300, 3, 4, seed=5, spread=2.5)
    init = random_partition(300, 4, seed=2)
    result = kkmgpu.fit(X, 4, method="approx", n_landmarks=40, kernel=kernel, dtype="float64", device=device,
                        init=init, tol=0.0, random_state=7, **params)
    B = landmarks_of(result)
    assert len(B) == 40 and len(set(B.tolist())) == 40
    K = kernel_matrix(X, kernel=kernel, **params)
    ref = reference_approx_kernel_kmeans(K[:, B], K[np.ix_(B, B)], np.diag(K), init, 4, rcond=40 * 2.3e-16)
    np.testing.assert_array_equal(result.labels, ref.labels)
    np.testing.assert_allclose(result.objective_history, ref.objective_history, rtol=1e-8)
    assert result.n_iter == ref.n_iter
    assert result.method == "approx" and result.method_params["n_landmarks"] == 40


def test_sample_weight_and_precomputed_kernel(device, rng):
    X, _ = blobs(240, 3, 3, seed=8)
    K = kernel_matrix(X, kernel="rbf", gamma=0.1)
    w = rng.uniform(0.5, 2.0, size=240)
    w[:20] = 0.0  # zero-weight points are never landmarks
    init = random_partition(240, 3, seed=4)
    from_features = kkmgpu.fit(X, 3, method="approx", n_landmarks=30, gamma=0.1, dtype="float64", device=device,
                               init=init, sample_weight=w, tol=0.0, random_state=1)
    from_K = kkmgpu.fit(K, 3, kernel="precomputed", method="approx", n_landmarks=30, dtype="float64",
                        device=device, init=init, sample_weight=w, tol=0.0, random_state=1)
    B = landmarks_of(from_features)
    assert B.min() >= 20
    np.testing.assert_array_equal(landmarks_of(from_K), B)
    ref = reference_approx_kernel_kmeans(K[:, B], K[np.ix_(B, B)], np.diag(K), init, 3, sample_weight=w,
                                         rcond=30 * 2.3e-16)
    for result in (from_features, from_K):
        np.testing.assert_array_equal(result.labels, ref.labels)
        assert result.objective == pytest.approx(ref.objective, rel=1e-8)


def test_it_is_kmeans_on_the_nystrom_features():
    """The same labels as scikit-learn's KMeans on K_B K_BB^(-1/2), both from the same initial partition."""
    sklearn_cluster = pytest.importorskip("sklearn.cluster")
    X, _ = blobs(400, 5, 5, seed=3, spread=3.0)
    w = np.random.default_rng(0).uniform(0.5, 2.0, size=400)
    init = random_partition(400, 5, seed=9)
    result = kkmgpu.fit(X, 5, method="approx", n_landmarks=60, gamma=0.05, dtype="float64", device="cpu",
                        init=init, sample_weight=w, tol=0.0, random_state=3)
    B = landmarks_of(result)
    K_B = kernel_matrix(X, X[B], kernel="rbf", gamma=0.05)
    values, vectors = np.linalg.eigh(K_B[B])
    keep = values > 60 * np.finfo(np.float64).eps * values[-1]
    features = K_B @ (vectors[:, keep] / np.sqrt(values[keep]))
    centres = np.array([np.average(features[init == c], axis=0, weights=w[init == c]) for c in range(5)])
    km = sklearn_cluster.KMeans(5, init=centres, n_init=1, max_iter=300, tol=0.0, algorithm="lloyd")
    km.fit(features, sample_weight=w)
    np.testing.assert_array_equal(result.labels, km.labels_)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_every_point_a_landmark_is_the_exact_method(device, dtype):
    X, _ = blobs(200, 3, 4, seed=12, spread=2.0)
    init = random_partition(200, 4, seed=6)
    approx = kkmgpu.fit(X, 4, method="approx", n_landmarks=200, gamma=0.2, dtype=dtype, device=device, init=init,
                        tol=0.0)
    exact = kkmgpu.fit(X, 4, gamma=0.2, dtype=dtype, device=device, init=init, tol=0.0)
    np.testing.assert_array_equal(approx.labels, exact.labels)
    assert approx.objective == pytest.approx(exact.objective, rel=1e-9 if dtype == "float64" else 1e-5)
    assert approx.method_params["memory_reduction"] == 1.0


def test_the_approximate_objective_bounds_the_exact_one(device):
    X, y = blobs(500, 4, 6, seed=21, spread=3.0)
    K = kernel_matrix(X, kernel="rbf", gamma=0.08)
    for m in (6, 30, 120):
        result = kkmgpu.fit(X, 6, method="approx", n_landmarks=m, gamma=0.08, dtype="float64", device=device,
                            random_state=m, n_init=3)
        exact = kernel_kmeans_objective(K, result.labels, k=6)
        assert result.objective >= exact * (1 - 1e-12)
        B = landmarks_of(result)
        dist = approx_distances(K[:, B], K[np.ix_(B, B)], np.diag(K), result.labels, 6, rcond=m * 2.3e-16)
        assert result.objective == pytest.approx(dist[np.arange(500), result.labels].sum(), rel=1e-8)
    assert nmi(y, result.labels) > 0.9


def test_predict_training_and_new_points(device):
    X, _ = blobs(360, 3, 3, seed=2)
    K = kernel_matrix(X, kernel="rbf", gamma=0.1)
    result = kkmgpu.fit(X[:300], 3, method="approx", n_landmarks=50, gamma=0.1, dtype="float64", device=device,
                        random_state=0)
    np.testing.assert_array_equal(kkmgpu.predict(result, X[:300]), result.labels)
    B = landmarks_of(result)
    # the new points' distances to the approximate centres, from the reference formulas on the joint kernel
    dist = approx_distances(K[:, B], K[np.ix_(B, B)], np.diag(K), np.r_[result.labels, np.full(60, -1)], 3,
                            rcond=50 * 2.3e-16)
    np.testing.assert_array_equal(kkmgpu.predict(result, X[300:], batch_size=7), np.argmin(dist[300:], axis=1))
    precomputed = kkmgpu.fit(K[:300, :300], 3, kernel="precomputed", method="approx", n_landmarks=50,
                             dtype="float64", device=device, random_state=0)
    np.testing.assert_array_equal(kkmgpu.predict(precomputed, K[300:, :300]), np.argmin(dist[300:], axis=1))


def test_two_circles_with_few_landmarks():
    X, y = kkmgpu.datasets.make_two_circles(1000, random_state=0)
    result = kkmgpu.fit(X, 2, method="approx", n_landmarks=100, gamma=5.0, device="cpu", random_state=0, n_init=10)
    assert nmi(y, result.labels) == pytest.approx(1.0)


def test_no_n_by_n_array():
    n, m = 3000, 60
    X, _ = blobs(n, 5, 5, seed=4)
    tracemalloc.start()
    try:
        kkmgpu.fit(X, 5, method="approx", n_landmarks=m, device="cpu", random_state=0, n_init=2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < n * n * 4 / 4, f"peak {peak} bytes: an n x n float32 array ({n * n * 4} bytes) was formed"


def test_default_landmarks_and_estimator_and_cli(tmp_path, capsys):
    assert _approx.default_landmarks(500, 10) == 500
    assert _approx.default_landmarks(100_000, 10) == 1000
    assert _approx.default_landmarks(100_000, 80) == 1600
    X, y = blobs(400, 3, 4, seed=1)
    model = kkmgpu.KernelKMeans(4, method="approx", n_landmarks=40, gamma=0.1, random_state=0, device="cpu",
                                n_init=3).fit(X)
    assert model.result_.method_params["n_landmarks"] == 40 and model.get_params()["n_landmarks"] == 40
    np.testing.assert_array_equal(model.predict(X), model.labels_)
    assert model.inertia_ == model.result_.objective
    path = tmp_path / "x.csv"
    np.savetxt(path, X, delimiter=",")
    from kkmgpu.cli import main

    assert main(["fit", str(path), "-k", "4", "--method", "approx", "--n-landmarks", "40", "--device", "cpu",
                 "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert "(approximate objective)" in out and "40 (uniform), Nystrom features of rank" in out


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(method="approx", n_landmarks=2), ValueError, r"n_landmarks=2 must be between k=3 and the number of "
                                                       r"samples with a positive sample_weight \(100\)"),
    (dict(method="approx", n_landmarks=101), ValueError, "n_landmarks=101 must be between k=3"),
    (dict(method="approx", n_landmarks=2.5), TypeError, "n_landmarks=2.5 must be an integer"),
    (dict(method="approx", landmarks="farthest"), ValueError, "landmarks='farthest' is not one of 'uniform', 'kmeans"),
    (dict(method="exact", n_landmarks=10), ValueError, "n_landmarks=10 only applies to method='approx'"),
    (dict(method="cats", landmarks="uniform", n_landmarks=5), ValueError, "only applies to method='approx'"),
])
def test_parameter_checks(kwargs, error, match):
    X, _ = blobs(100, 2, 3, seed=0)
    with pytest.raises(error, match=match):
        kkmgpu.fit(X, 3, device="cpu", **kwargs)


def test_kmeans_plus_plus_landmarks_cover_small_clusters(device):
    """D^2 sampling puts a landmark in each of two small far-away blobs (20 points each beside 2000), where
    uniform landmarks rarely do (P(one given small blob is hit by 6 uniform draws) is about 6%). The linear kernel
    makes the feature-space distances Euclidean, where D^2 sampling picks a far blob with probability > 0.9 per
    draw (an RBF kernel saturates every far distance at 2)."""
    rng = np.random.default_rng(5)
    X = np.r_[rng.normal(size=(2000, 2)), rng.normal(size=(20, 2)) + 40.0, rng.normal(size=(20, 2)) - 40.0]
    hits = {"uniform": 0, "kmeans++": 0}
    for seed in range(10):
        for strategy in hits:
            result = kkmgpu.fit(X, 3, method="approx", n_landmarks=6, landmarks=strategy, kernel="linear",
                                device=device, random_state=seed, n_init=1)
            B = landmarks_of(result)
            assert len(set(B.tolist())) == 6
            hits[strategy] += int((B >= 2000).any() and (B < 2020).any() and (B >= 2020).any())
    assert hits["kmeans++"] == 10 and hits["uniform"] <= 1


def test_kmeans_plus_plus_landmarks_are_weighted_and_reproducible(device, rng):
    X, _ = blobs(300, 3, 4, seed=3)
    w = rng.uniform(0.5, 2.0, size=300)
    w[::3] = 0.0
    runs = [kkmgpu.fit(X, 4, method="approx", n_landmarks=40, landmarks="kmeans++", sample_weight=w,
                       device=device, random_state=11) for _ in range(2)]
    B = landmarks_of(runs[0])
    np.testing.assert_array_equal(B, landmarks_of(runs[1]))
    np.testing.assert_array_equal(runs[0].labels, runs[1].labels)
    assert np.all(w[B] > 0) and len(set(B.tolist())) == 40


def reference_d2_landmarks(K, w, m, rng):
    """D^2 sampling without replacement in float64 NumPy, one landmark at a time by ``rng.choice``: the first with
    probability w_i / sum w, each next with probability w_i times its squared distance to the nearest landmark;
    once that is 0 everywhere outside the landmarks, uniform over the positive-weight points left."""
    diag = np.diag(K)
    chosen, closest, index = np.zeros(len(w), dtype=bool), None, []
    for _ in range(m):
        p = np.where(chosen, 0.0, w if closest is None else w * np.maximum(closest, 0.0))
        if p.sum() <= 0:
            p = np.where(chosen, 0.0, (w > 0).astype(float))
        c = int(rng.choice(len(w), p=p / p.sum()))
        chosen[c] = True
        index.append(c)
        dist = diag + diag[c] - 2.0 * K[c]
        closest = dist if closest is None else np.minimum(closest, dist)
    return np.sort(index)


@pytest.mark.parametrize("duplicates", [False, True])
def test_kmeans_plus_plus_landmarks_are_the_host_loops_draws(device, duplicates):
    """The landmarks D^2 sampling draws on the device are those of a NumPy loop over rng.choice from the same
    seed, with zero weights and, with duplicated points, past the point where every distance is 0."""
    rng = np.random.default_rng(21)
    X, _ = blobs(200, 3, 4, seed=22)
    if duplicates:
        X = X[rng.integers(0, 12, 200)]  # 12 distinct points, 30 landmarks
    w = rng.uniform(0.5, 2.0, 200)
    w[::5] = 0.0
    K = kernel_matrix(X, kernel="rbf", gamma=0.1)
    backend = resolve_device(device)
    with backend.activate():
        source = _approx.KernelSource(backend.asarray(K), KernelSpec("precomputed"), backend)
        for seed in range(4):
            got = _approx.choose_landmarks("kmeans++", 30, w, np.random.default_rng(seed), source)
            np.testing.assert_array_equal(got, reference_d2_landmarks(K, w, 30, np.random.default_rng(seed)))


def test_sigmoid_kernel_drops_negative_directions():
    """The sigmoid kernel is not PSD: K_BB's negative eigenvalues are dropped from the Nystrom features (and
    counted), and the fit stays finite."""
    X = np.random.default_rng(0).uniform(0, 1, size=(400, 20))
    result = kkmgpu.fit(X, 4, method="approx", n_landmarks=80, kernel="sigmoid", gamma=0.0045 * 10, coef0=0.11,
                        device="cpu", random_state=0)
    params = result.method_params
    assert params["n_components_used"] + params["dropped_eigenvalues"] == 80
    assert params["negative_eigenvalues"] <= params["dropped_eigenvalues"]
    assert np.isfinite(result.objective)
