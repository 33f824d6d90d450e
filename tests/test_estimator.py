"""The scikit-learn estimator: same numbers as kkmgpu.fit, scikit-learn's conventions and its estimator checks."""

import inspect
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from reference import kernel_matrix, reference_kernel_kmeans
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.metrics import adjusted_rand_score
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

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


def test_unfitted_predict_and_score_raise_not_fitted_error():
    for method in ("predict", "score"):
        with pytest.raises(NotFittedError, match="not fitted yet"):
            getattr(KernelKMeans(2), method)(np.ones((3, 2)))
    assert not hasattr(KernelKMeans(2), "labels_")


def test_default_params_follow_spec():
    """Every option of kkmgpu.fit (sample_weight goes to fit(), keep_on_device is not offered) is a parameter with fit's default, n_clusters is k."""
    import inspect

    fit_defaults = {name: p.default for name, p in inspect.signature(kkmgpu.fit).parameters.items()
                    if p.kind is p.KEYWORD_ONLY and name not in ("keep_on_device", "sample_weight")}
    params = KernelKMeans().get_params()
    assert params.pop("n_clusters") == 8
    assert params == fit_defaults
    assert "progress" in params and "verbose" in params


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


# --------------------------------------------------------------------------- scikit-learn's estimator checks

#: Why the fit with integer sample weights differs from the fit on repeated rows in
#: check_sample_weight_equivalence_on_dense_data (scikit-learn declares the same check an expected failure for
#: its KMeans). test_integer_weights_equal_repeated_rows shows the equivalence where these causes are absent.
SEEDING_BY_POSITION = (
    "k-means++ draws its seeds by position (inverse CDF over the cumulative weights), and the check shuffles the "
    "weighted rows, so the two fits start from different seeds; gamma='scale' also takes the features' variances over the rows, "
    "unweighted, so repeats and zero-weight rows change gamma. With a numeric gamma and the rows in order, "
    "integer weights equal repeated rows.")
CATS_SAMPLING = (
    " CATS besides samples l distinct rows per cluster uniformly (a repeated point can be drawn several times, a "
    "weighted one once) and its default l = ceil(sqrt(n / k)) counts rows: its centroids differ even from one "
    "initial partition.")


def expected_failed_checks(estimator):
    reason = SEEDING_BY_POSITION + (CATS_SAMPLING if estimator.method == "cats" else "")
    return {"check_sample_weight_equivalence_on_dense_data": reason}


# small and quick: CATS does not converge on the checks' structureless data, so its iterations are capped
CHECKED_ESTIMATORS = [
    KernelKMeans(2, method="exact", random_state=0, device="cpu"),
    KernelKMeans(2, method="cats", max_iter=20, random_state=0, device="cpu"),
    KernelKMeans(2, method="eigen", random_state=0, device="cpu"),
]
_STRICT = ({"xfail_strict": True} if "xfail_strict" in inspect.signature(parametrize_with_checks).parameters
           else {})


@pytest.mark.filterwarnings("ignore:n_components=1 \\(method='eigen' only\\) ignored:UserWarning")
@parametrize_with_checks(CHECKED_ESTIMATORS, expected_failed_checks=expected_failed_checks, **_STRICT)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def test_integer_weights_equal_repeated_rows(device):
    """The equivalence the estimator check asks for, where seeding order and gamma='scale' do not interfere."""
    rng = np.random.default_rng(11)
    X, _ = blobs(40, 4, 3, seed=12)
    w = rng.integers(0, 4, 40)
    w[:3] = 1
    for method in ("exact", "eigen"):
        params = dict(method=method, gamma=0.2, dtype="float64", random_state=5, device=device)
        weighted = KernelKMeans(3, **params).fit(X, sample_weight=w)
        repeated = KernelKMeans(3, **params).fit(np.repeat(X, w, axis=0))
        np.testing.assert_array_equal(host(weighted.labels_)[w > 0], np.repeat(host(weighted.labels_), w)[
            np.cumsum(w)[w > 0] - 1])  # (the weighted labels, read at the repeated rows' positions)
        np.testing.assert_array_equal(np.repeat(host(weighted.labels_), w), host(repeated.labels_))
        assert weighted.inertia_ == pytest.approx(repeated.inertia_, rel=1e-10)
        np.testing.assert_array_equal(weighted.predict(X), repeated.predict(X))


# --------------------------------------------------------------------------- input checks


def test_predict_and_score_check_n_features_in():
    X, _ = blobs(60, 3, 3, seed=13)
    est = KernelKMeans(3, random_state=0, device="cpu").fit(X)
    assert est.n_features_in_ == 3
    for method in (est.predict, est.score):
        with pytest.raises(ValueError, match="X has 4 features, but KernelKMeans is expecting 3 features"):
            method(np.ones((5, 4)))


def test_precomputed_kernel_features_are_the_training_points():
    X, _ = blobs(50, 2, 2, seed=14)
    K = kernel_matrix(X, kernel="rbf", gamma=0.5)
    est = KernelKMeans(2, kernel="precomputed", random_state=0, device="cpu").fit(K)
    assert est.n_features_in_ == 50
    assert est.__sklearn_tags__().input_tags.pairwise and not KernelKMeans().__sklearn_tags__().input_tags.pairwise
    assert not KernelKMeans(kernel="no such kernel").__sklearn_tags__().input_tags.pairwise  # fit raises, not tags
    np.testing.assert_array_equal(est.predict(K[:7]), host(est.labels_)[:7])
    with pytest.raises(ValueError, match="X has 49 features, but KernelKMeans is expecting 50"):
        est.predict(K[:7, :49])
    with pytest.raises(ValueError, match="score is not available with kernel='precomputed'.*k\\(x, x\\)"):
        est.score(K[:7])


class ArrayOnly:
    """Defines only __array__ (scikit-learn's _NotAnArray does the same)."""

    def __init__(self, data):
        self.data = np.asarray(data)

    def __array__(self, dtype=None, copy=None):
        return self.data if dtype is None else self.data.astype(dtype)


def test_inputs_that_only_define_array():
    X, _ = blobs(60, 3, 3, seed=15)
    w = np.random.default_rng(16).uniform(0.5, 2.0, 60)
    a = KernelKMeans(3, random_state=0, device="cpu").fit(ArrayOnly(X), sample_weight=ArrayOnly(w))
    b = KernelKMeans(3, random_state=0, device="cpu").fit(X, sample_weight=w)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_array_equal(a.predict(ArrayOnly(X[:9])), b.predict(X[:9]))
    assert a.score(ArrayOnly(X)) == b.score(X)


def test_scikit_learn_error_wording():
    est = KernelKMeans(2, device="cpu")
    with pytest.raises(ValueError, match=r"0 feature\(s\) \(shape=\(5, 0\)\) while a minimum of 1 is required"):
        est.fit(np.empty((5, 0)))
    with pytest.raises(ValueError, match="Complex data not supported"):
        est.fit(np.ones((5, 2)) + 1j)
    with pytest.raises(ValueError, match="n_samples=1 should be >= k=2"):
        est.fit(np.ones((1, 2)))
    with pytest.raises(ValueError, match="Expected 2D array, got 1D array"):
        est.fit(np.ones(5))
    with pytest.raises(ValueError, match="Sample weights must contain at least one non-zero number"):
        est.fit(np.random.default_rng(0).normal(size=(6, 2)), sample_weight=np.zeros(6))


# --------------------------------------------------------------------------- parameters of one method


@pytest.mark.parametrize("method, other", [("exact", {"n_components": 1}), ("eigen", {"n_samples_per_cluster": 4}),
                                           ("cats", {"engine": "dense", "n_components": 3})])
def test_other_methods_parameters_are_ignored_with_a_warning(method, other):
    X, _ = blobs(80, 3, 3, seed=17)
    params = dict(method=method, dtype="float64", random_state=3, device="cpu")
    plain = KernelKMeans(3, **params).fit(X)
    with pytest.warns(UserWarning, match=f"only\\) ignored with method='{method}'") as record:
        mixed = KernelKMeans(3, **params, **other).fit(X)
    assert len(record) == 1
    assert all(f"{name}={value!r} (method=" in str(record[0].message) for name, value in other.items())
    np.testing.assert_array_equal(mixed.labels_, plain.labels_)
    assert mixed.inertia_ == plain.inertia_


def test_own_methods_parameters_reach_the_fit():
    X, _ = blobs(80, 3, 3, seed=18)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # defaults of the other methods' parameters warn about nothing
        cats = KernelKMeans(3, method="cats", n_samples_per_cluster=7, random_state=0, device="cpu").fit(X)
        eigen = KernelKMeans(3, method="eigen", n_components=5, random_state=0, device="cpu").fit(X)
    assert cats.result_.method_params["l"] == 7
    assert eigen.result_.method_params["n_components"] == 5
    with pytest.raises(ValueError, match="n_components=0 must be >= 1"):
        KernelKMeans(3, method="eigen", n_components=0, device="cpu").fit(X)


@pytest.mark.parametrize("method", ["exact", "cats", "eigen", "trimmed", "approx"])
def test_gemm_precision_is_every_methods_parameter(device, method):
    """gemm_precision belongs to no single method: each takes it silently, records it, and clones keep it."""
    X, _ = blobs(80, 3, 3, seed=23)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = KernelKMeans(3, method=method, gemm_precision="fp32", random_state=0, device=device).fit(X)
    assert est.result_.method_params["gemm_precision"] == "fp32" == est.result_.method_params["gemm_mode"]
    assert clone(est).get_params()["gemm_precision"] == "fp32" and est.get_params()["tf32"] is None
    with pytest.raises(ValueError, match=r"gemm_precision='fp16' is not one of 'fp32', '3xtf32', 'tf32'"):
        KernelKMeans(3, method=method, gemm_precision="fp16", device=device).fit(X)


# --------------------------------------------------------------------------- score


def reference_score(X_train, labels_train, w_train, X_new, labels_new, w_new, kernel, params):
    """-sum_i w_i ||phi(x_i) - m_{c_i}||^2 in float64, m_c the weighted mean of training cluster c."""
    K_new = kernel_matrix(X_new, X_train, kernel=kernel, params=params)
    K_train = kernel_matrix(X_train, kernel=kernel, params=params)
    diag = np.array([kernel_matrix(x[None], kernel=kernel, params=params)[0, 0] for x in X_new])
    total = 0.0
    for i, c in enumerate(labels_new):
        members = labels_train == c
        n_c = w_train[members].sum()
        S = K_new[i, members] @ w_train[members]
        C = w_train[members] @ K_train[np.ix_(members, members)] @ w_train[members]
        total += w_new[i] * (diag[i] - 2.0 * S / n_c + C / n_c**2)
    return -total


SCORE_CASES = [("exact", "rbf", {"gamma": 0.3}), ("exact", "polynomial", {"gamma": 0.1, "degree": 2, "coef0": 1.0}),
               ("cats", "rbf", {"gamma": 0.3}), ("eigen", "laplacian", {"gamma": 0.5}), ("trimmed", "rbf", {"gamma": 0.3})]


@pytest.mark.parametrize("dtype, rel", [("float64", 1e-9), ("float32", 1e-4)])
@pytest.mark.parametrize("method, kernel, params", SCORE_CASES)
def test_score_is_minus_the_objective_in_the_fitted_clusters(device, method, kernel, params, dtype, rel):
    X, _ = blobs(150, 3, 3, seed=19, spread=4.0)
    X_new, _ = blobs(40, 3, 3, seed=20, spread=4.0)
    rng = np.random.default_rng(21)
    w, w_new = rng.uniform(0.2, 3.0, 150), rng.uniform(0.2, 3.0, 40)
    est = KernelKMeans(3, method=method, kernel=kernel, **params, dtype=dtype, random_state=2, device=device)
    est.fit(X, sample_weight=w)
    full = {"gamma": params["gamma"], "degree": params.get("degree", 3), "coef0": params.get("coef0", 1.0)}
    labels = host(est.labels_)
    for Z, wz in ((X_new, w_new), (X_new, None), (X, w)):
        expected = reference_score(X, labels, w, Z, est.predict(Z), np.ones(len(Z)) if wz is None else wz,
                                   kernel, full)
        assert est.score(Z, sample_weight=wz) == pytest.approx(expected, rel=rel)


def test_score_of_the_training_data_is_minus_inertia(device):
    X, _ = blobs(150, 3, 4, seed=22)
    for method, extra in (("exact", {}), ("cats", {"exact_objective": True}), ("eigen", {})):
        est = KernelKMeans(4, method=method, **extra, dtype="float64", random_state=1, device=device).fit(X)
        np.testing.assert_array_equal(est.predict(X), host(est.labels_))  # so its objective is inertia_
        assert est.score(X) == pytest.approx(-est.inertia_, rel=1e-9)


def test_grid_search_without_scoring_uses_score():
    X, _ = blobs(120, 3, 4, seed=23, spread=4.0)
    base = KernelKMeans(2, gamma=0.2, random_state=0, device="cpu")
    grid = {"n_clusters": [2, 3, 4]}
    search = GridSearchCV(base, grid, cv=KFold(3)).fit(X)
    for params, mean in zip(search.cv_results_["params"], search.cv_results_["mean_test_score"]):
        folds = [clone(base).set_params(**params).fit(X[train]).score(X[test]) for train, test in KFold(3).split(X)]
        assert mean == pytest.approx(np.mean(folds), rel=1e-12)
    assert np.all(search.cv_results_["mean_test_score"] < 0)
    assert search.best_estimator_.n_clusters == 4  # the objective falls with k, as KMeans's score rises


@pytest.mark.gpu
def test_device_arrays_keep_their_type():
    """CuPy inputs skip scikit-learn's host conversion (only n_features_in_ is checked): same results as host input."""
    from conftest import require_cuda

    require_cuda()
    X, _ = blobs(90, 3, 3, seed=24)
    w = np.random.default_rng(25).uniform(0.5, 2.0, 90)
    on_host = KernelKMeans(3, gamma=0.3, dtype="float64", random_state=0, device="cuda").fit(X, sample_weight=w)
    import kkmgpu.backend.device as _backend

    cp = _backend.import_cupy()
    est = KernelKMeans(3, gamma=0.3, dtype="float64", random_state=0, device="cuda")
    est.fit(cp.asarray(X), sample_weight=cp.asarray(w))
    assert est.n_features_in_ == 3
    np.testing.assert_array_equal(host(est.labels_), host(on_host.labels_))
    np.testing.assert_array_equal(host(est.predict(cp.asarray(X[:11]))), host(on_host.labels_)[:11])
    assert est.score(cp.asarray(X[:11]), sample_weight=cp.asarray(w[:11])) == pytest.approx(
        on_host.score(X[:11], sample_weight=w[:11]), rel=1e-12)
    with pytest.raises(ValueError, match="X has 2 features, but KernelKMeans is expecting 3"):
        est.predict(cp.asarray(X[:, :2]))


# --------------------------------------------------------------------------- scikit-learn stays optional

ROOT = Path(__file__).resolve().parents[1]


def run_python(code):
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_import_kkmgpu_does_not_load_scikit_learn():
    out = run_python("import sys, kkmgpu\n"
                     "print('sklearn' in sys.modules, 'KernelKMeans' in dir(kkmgpu))\n"
                     "kkmgpu.KernelKMeans\n"
                     "print('sklearn' in sys.modules)")
    assert out.split() == ["False", "True", "True"]


def test_estimator_without_scikit_learn():
    out = run_python(
        "import sys\n"
        "sys.modules['sklearn'] = None  # import sklearn raises ImportError\n"
        "import numpy as np, kkmgpu\n"
        "X = np.random.default_rng(0).normal(size=(60, 3)); X[:30] += 6\n"
        "est = kkmgpu.KernelKMeans(2, random_state=0, device='cpu')\n"
        "try:\n"
        "    est.predict(X)\n"
        "except ValueError as exc:\n"
        "    print(type(exc).__name__, isinstance(exc, AttributeError))\n"
        "est.set_params(gamma=0.5).fit(X)\n"
        "print(est.get_params()['gamma'], est.n_features_in_, bool((est.predict(X) == est.labels_).all()))\n"
        "print(abs(est.score(X) + est.inertia_) <= 1e-6 * est.inertia_)\n"
        "try:\n"
        "    est.predict(X[:, :2])\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
        "print(repr(kkmgpu.KernelKMeans(3, kernel='linear')))\n")
    assert out.splitlines() == [
        "NotFittedError True", "0.5 3 True", "True",
        "X has 2 features, but KernelKMeans is expecting 3 features as input.",
        "KernelKMeans(kernel='linear', n_clusters=3)"]


def _thresholded_rbf(A, B, gamma, cut):
    d2 = ((A[:, None, :] - B[None, :, :]) ** 2).sum(axis=2)
    K = np.exp(-gamma * d2)
    K[K < cut] = 0.0
    return K


def test_predict_on_sparse_kernel_rows_after_a_sparse_fit(device):
    """Issue 27: predict on sparse K rows after a sparse-K fit said sparse input needs kernel='precomputed',
    which it was. The rows (n_new, n_train), CSR or COO, get the float64 reference's nearest cluster
    (argmin_c -2 sum_{j in c} K_xj / n_c + C_c / n_c^2, from the fit's labels), the labels of the same rows
    dense, and on the training rows labels_."""
    import scipy.sparse as sp

    rng = np.random.default_rng(27)
    X, _ = blobs(150, 2, 3, 27, spread=6.0)
    X_new = X[rng.choice(150, 40)] + rng.normal(scale=0.3, size=(40, 2))
    K = _thresholded_rbf(X, X, 0.5, 1e-3)
    K_new = _thresholded_rbf(X_new, X, 0.5, 1e-3)
    est = KernelKMeans(3, kernel="precomputed", dtype="float64", n_init=3, random_state=0,
                       device=device).fit(sp.csr_matrix(K))
    labels = host(est.labels_)
    one_hot = np.eye(3)[labels]
    sizes = one_hot.sum(axis=0)
    within = np.einsum("ic,ij,jc->c", one_hot, K, one_hot)
    expected = np.argmin(-2.0 * (K_new @ one_hot) / sizes + within / sizes ** 2, axis=1)
    for rows in (sp.csr_matrix(K_new), sp.coo_matrix(K_new)):
        np.testing.assert_array_equal(est.predict(rows), expected)
        np.testing.assert_array_equal(kkmgpu.predict(est.result_, rows, batch_size=7), expected)
    np.testing.assert_array_equal(est.predict(K_new), expected)
    np.testing.assert_array_equal(est.predict(sp.csr_matrix(K)), labels)
    with pytest.raises(ValueError, match="kernel to the 150 training points"):
        kkmgpu.predict(est.result_, sp.csr_matrix(K_new[:, :100]))
    dense_fit = KernelKMeans(3, dtype="float64", random_state=0, device=device).fit(X)
    with pytest.raises(TypeError, match="kernel='precomputed'"):  # features fit: sparse rows are still refused
        dense_fit.predict(sp.csr_matrix(X_new))
