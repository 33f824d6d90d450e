"""The scikit-learn-style estimator: same numbers as kkmgpu.fit, sklearn conventions."""

import warnings

import numpy as np
import pytest
from reference import kernel_matrix, reference_kernel_kmeans
from sklearn.base import clone
from sklearn.metrics import adjusted_rand_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import kkmgpu
from kkmgpu import KernelKMeans


def host(a):
    return np.asarray(a.get() if hasattr(a, "get") else a)


def blobs(n=200, d=3, n_centers=4, seed=0, spread=3.0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=spread, size=(n_centers, d))
    y = rng.integers(0, n_centers, n)
    return centers[y] + rng.normal(size=(n, d)), y


@pytest.fixture(autouse=True)
def _no_convergence_noise():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        yield


def test_fit_matches_functional_api(device):
    X, _ = blobs()
    est = KernelKMeans(4, kernel="rbf", dtype="float64", random_state=7, device=device)
    assert est.fit(X) is est
    result = kkmgpu.fit(X, 4, kernel="rbf", dtype="float64", random_state=7, device=device)
    np.testing.assert_array_equal(host(est.labels_), host(result.labels))
    assert est.inertia_ == pytest.approx(result.objective, rel=1e-12)
    assert est.n_iter_ == result.n_iter
    assert isinstance(est.result_, kkmgpu.KernelKMeansResult)
    assert est.inertia_ == est.result_.objective


def test_fit_from_labels_matches_reference(device):
    X, _ = blobs(150, 2, 3, 1)
    init = np.random.default_rng(2).integers(0, 3, 150)
    init[:3] = [0, 1, 2]
    est = KernelKMeans(3, kernel="laplacian", dtype="float64", init=init, tol=0.0, device=device).fit(X)
    ref = reference_kernel_kmeans(kernel_matrix(X, kernel="laplacian"), init, 3)
    np.testing.assert_array_equal(host(est.labels_), ref.labels)
    assert est.inertia_ == pytest.approx(ref.objective, rel=1e-6)
    assert est.n_iter_ == ref.n_iter


def test_sample_weight_passed_through(device):
    X, _ = blobs(120, 2, 3, 3)
    w = np.random.default_rng(4).uniform(0.2, 3.0, 120)
    init = np.arange(120) % 3
    est = KernelKMeans(3, dtype="float64", init=init, tol=0.0, device=device).fit(X, sample_weight=w)
    ref = reference_kernel_kmeans(kernel_matrix(X, kernel="rbf"), init, 3, w)
    np.testing.assert_array_equal(host(est.labels_), ref.labels)
    assert est.inertia_ == pytest.approx(ref.objective, rel=1e-6)


def test_fit_predict_and_predict(device):
    X, y = blobs(240, 2, 3, 5, spread=5.0)
    est = KernelKMeans(3, dtype="float64", n_init=3, tol=0.0, random_state=0, device=device)
    labels = est.fit_predict(X)
    np.testing.assert_array_equal(labels, host(est.labels_))
    assert adjusted_rand_score(y, labels) > 0.9
    np.testing.assert_array_equal(est.predict(X), labels)
    X_new, _ = blobs(30, 2, 3, 5, spread=5.0)
    assert est.predict(X_new).shape == (30,)


def test_fit_predict_ignores_y(device):
    X, y = blobs(90, 2, 3, 6)
    a = KernelKMeans(3, random_state=1, device=device).fit_predict(X, y)
    b = KernelKMeans(3, random_state=1, device=device).fit_predict(X)
    np.testing.assert_array_equal(a, b)


def test_unfitted_predict_raises():
    from sklearn.exceptions import NotFittedError

    with pytest.raises((NotFittedError, AttributeError)):
        KernelKMeans(2).predict(np.ones((3, 2)))
    assert not hasattr(KernelKMeans(2), "labels_")


def test_default_params_follow_spec():
    params = KernelKMeans().get_params()
    assert params == {
        "n_clusters": 8, "kernel": "rbf", "gamma": None, "degree": 3, "coef0": None, "kernel_params": None,
        "method": "exact", "device": "auto", "dtype": "float32", "init": "k-means++", "n_init": "auto",
        "max_iter": 300, "tol": 1e-6, "random_state": None, "verbose": False, "update": "auto",
        "n_samples_per_cluster": None, "window": None, "theta": None, "rcond": None, "exact_objective": False,
        "n_components": None, "engine": "auto", "tf32": False, "trim_vote_fraction": None, "trim_slack": None,
        "trim_h": None, "trim_max_size": None,
    }


def test_get_set_params():
    est = KernelKMeans(3, kernel="polynomial", degree=2, gamma=0.5)
    assert est.get_params()["degree"] == 2
    assert est.set_params(degree=4, n_clusters=5) is est
    assert est.degree == 4 and est.n_clusters == 5
    with pytest.raises(ValueError):
        est.set_params(not_a_param=1)


def test_constructor_does_not_validate():
    # sklearn convention: validation happens in fit, so set_params/clone work on any values.
    est = KernelKMeans(n_clusters=-1, gamma=-3.0)
    with pytest.raises(ValueError):
        est.fit(np.random.default_rng(0).normal(size=(10, 2)))


def test_clone(device):
    X, _ = blobs(100, 2, 3, 7)
    est = KernelKMeans(3, kernel="laplacian", gamma=0.9, random_state=4, dtype="float64", device=device)
    est.fit(X)
    copy = clone(est)
    assert copy.get_params() == est.get_params()
    assert not hasattr(copy, "labels_")
    np.testing.assert_array_equal(host(copy.fit(X).labels_), host(est.labels_))


def test_pipeline(device):
    X, y = blobs(200, 3, 3, 8, spread=4.0)
    X = X * np.array([100.0, 0.01, 5.0])  # wildly different feature scales
    pipe = make_pipeline(StandardScaler(), KernelKMeans(3, n_init=3, tol=0.0, random_state=0, device=device))
    labels = pipe.fit_predict(X)
    assert labels.shape == (200,)
    assert adjusted_rand_score(y, labels) > 0.9
    np.testing.assert_array_equal(pipe.predict(X), labels)
    scaled = StandardScaler().fit_transform(X)
    direct = KernelKMeans(3, n_init=3, tol=0.0, random_state=0, device=device).fit(scaled)
    np.testing.assert_array_equal(labels, host(direct.labels_))


def test_repr():
    assert "KernelKMeans" in repr(KernelKMeans(3, kernel="linear"))
