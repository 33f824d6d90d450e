"""Numerical range of kernels and weights (issue 14, points 1, 2, 3, 5).

Every method either computes the clustering of the float64 reference or raises a ValueError that names the kernel
and the dtype's limit; no result carries a non-finite objective. References: tests/reference.py (float64).
"""

import warnings

import numpy as np
import pytest

import kkmgpu
from kkmgpu import metrics

import reference

METHODS = [("exact", {}), ("exact", {"engine": "tiled"}), ("cats", {"n_samples_per_cluster": 500}),
           ("eigen", {}), ("trimmed", {})]
METHOD_IDS = ["dense", "tiled", "cats", "eigen", "trimmed"]


def _blobs(rng, n=240, d=3, k=3, spread=6.0):
    centres = rng.normal(scale=spread, size=(k, d))
    y = np.arange(n) % k
    return centres[y] + rng.normal(size=(n, d)), y


def _fit(X, k, **kw):
    kw.setdefault("random_state", 0)  # CATS samples: a fixed seed, so both fits of a comparison draw the same
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # NumPy overflow warnings are failures here
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        return kkmgpu.fit(X, k, **kw)


def _check_against_reference(result, K64, init, k, sample_weight=None):
    """The labels are a fixed point as good as the float64 reference's from the same start; objective finite."""
    ref = reference.reference_kernel_kmeans(K64, init, k, sample_weight=sample_weight)
    assert np.isfinite(result.objective)
    exact = reference.kernel_kmeans_objective(K64, result.labels, sample_weight)
    assert exact <= ref.objective * (1 + 1e-4) + 1e-9 * abs(ref.objective)
    return ref


# --------------------------------------------------------------------------- point 1: overflow


@pytest.mark.parametrize("method,extra", METHODS, ids=METHOD_IDS)
@pytest.mark.parametrize("factor", [1e20, 1e-30])
def test_rbf_far_outside_float32_range_gives_the_unscaled_labels(device, method, extra, factor):
    rng = np.random.default_rng(1)
    X, y = _blobs(rng)
    init = rng.integers(0, 3, len(X))
    base = _fit(X, 3, init=init, method=method, device=device, **extra)
    scaled = _fit(X * factor, 3, init=init, method=method, device=device, **extra)
    assert np.isfinite(scaled.objective)
    assert metrics.nmi(base.labels, scaled.labels) == pytest.approx(1.0)
    # gamma="scale" is scale-invariant: the same kernel, the same objective
    assert scaled.objective == pytest.approx(base.objective, rel=1e-4)
    assert scaled.kernel_params["gamma"] == pytest.approx(base.kernel_params["gamma"] / factor**2, rel=1e-9)


@pytest.mark.parametrize("method,extra", METHODS[:2] + METHODS[3:], ids=["dense", "tiled", "eigen", "trimmed"])
def test_linear_kernel_scaled_by_1e20_objective_in_the_data_units(device, method, extra):
    rng = np.random.default_rng(2)
    X, y = _blobs(rng)
    init = rng.integers(0, 3, len(X))
    base = _fit(X, 3, kernel="linear", init=init, method=method, device=device, **extra)
    scaled = _fit(X * 1e20, 3, kernel="linear", init=init, method=method, device=device, **extra)
    np.testing.assert_array_equal(scaled.labels, base.labels)
    assert scaled.objective == pytest.approx(base.objective * 1e40, rel=1e-5)


def test_cats_on_data_scaled_by_1e20_runs_and_matches(device):
    """CATS used to raise LinAlgError from inside on X * 1e20 (RBF)."""
    rng = np.random.default_rng(3)
    X, y = _blobs(rng)
    result = _fit(X * 1e20, 3, method="cats", device=device, random_state=0, n_init=3)
    assert np.isfinite(result.objective)
    assert metrics.nmi(y, result.labels) == pytest.approx(1.0)


@pytest.mark.parametrize("method,extra", [m for m in METHODS if m[0] != "cats"],
                         ids=["dense", "tiled", "eigen", "trimmed"])
def test_polynomial_degree_50_is_computed_not_nan(device, method, extra):
    """(gamma <x, y> + 1)^50 on standard-normal data reaches 1e46, beyond float32: computed divided by a power of
    two, the objective reported in the kernel's units against the float64 reference."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(150, 2))
    K64 = reference.kernel_matrix(X, kernel="polynomial", degree=50)
    assert np.abs(K64).max() > np.finfo(np.float32).max  # the case is the overflowing one
    init = rng.integers(0, 3, len(X))
    result = _fit(X, 3, kernel="polynomial", degree=50, init=init, method=method, device=device, **extra)
    assert np.isfinite(result.objective)
    exact = reference.kernel_kmeans_objective(K64, result.labels)
    if method != "eigen":  # eigen's objective is that of the embedding (clipped eigenvalues)
        # float32 kernel values of up to 1e46 and an objective of 1e37: sum w K_ii - sum C_c / n_c cancels most digits
        assert result.objective == pytest.approx(exact, rel=2e-2)
        exact64 = _fit(X, 3, kernel="polynomial", degree=50, init=init, method=method, device=device,
                       dtype="float64", **extra)
        assert exact64.objective == pytest.approx(reference.kernel_kmeans_objective(K64, exact64.labels), rel=1e-6)


def test_polynomial_beyond_float64_raises_naming_kernel_and_limit(device):
    X = np.random.default_rng(5).normal(size=(60, 2)) * 1e20
    with pytest.raises(ValueError, match=r"kernel='polynomial' with gamma=.*degree=50.*float64's range.*float32"):
        kkmgpu.fit(X, 2, kernel="polynomial", degree=50, device=device)


@pytest.mark.parametrize("method,dtype", [(m, d) for m in ("exact", "cats", "eigen", "trimmed")
                                          for d in ("float32", "float16", "float64")
                                          if (m, d) != ("eigen", "float16")])  # eigen refuses float16
def test_precomputed_kernel_times_1e300(device, dtype, method):
    rng = np.random.default_rng(6)
    X, y = _blobs(rng, n=150, spread=15.0)
    K = reference.kernel_matrix(X, gamma=0.1)
    init = rng.integers(0, 3, len(X))
    extra = {"exact_objective": True} if method == "cats" else {}
    base = _fit(K, 3, kernel="precomputed", init=init, method=method, dtype=dtype, device=device, **extra)
    result = _fit(K * 1e300, 3, kernel="precomputed", init=init, method=method, dtype=dtype, device=device, **extra)
    assert np.isfinite(result.objective)
    # K * 1e300 is K rescaled by 1e300 / 2^e on storage: other roundings, the same clustering
    assert metrics.nmi(y, base.labels) == pytest.approx(1.0)
    if (method, dtype) == ("cats", "float16"):
        # CATS from a random partition in float16 lands on either side of a local minimum with any rounding of K
        # (K * 1e300 / 2^e is not K * 2^-e): only the range is checked here
        assert np.isfinite(result.exact_objective)
        return
    assert metrics.nmi(y, result.labels) == pytest.approx(1.0)
    rel = {"float16": 3e-2, "float32": 1e-4, "float64": 1e-9}[dtype]
    if method == "exact":
        assert result.objective == pytest.approx(reference.kernel_kmeans_objective(K * 1e300, result.labels), rel=rel)
    if method != "eigen":
        # CATS's objective is its approximate distortion: the exact one of the labels is compared
        rel = 0.2 if dtype == "float16" else rel
        assert result.exact_objective / 1e300 == pytest.approx(base.exact_objective, rel=rel)
    labels = kkmgpu.predict(result, K[:40] * 1e300)
    np.testing.assert_array_equal(labels, np.asarray(result.labels)[:40])


@pytest.mark.parametrize("kernel,params", [("linear", {}), ("polynomial", {"degree": 4, "coef0": 3.0})])
def test_float16_storage_of_values_above_65504(device, kernel, params):
    rng = np.random.default_rng(7)
    X, y = _blobs(rng, spread=400.0)
    K64 = reference.kernel_matrix(X - X.mean(0) if kernel == "linear" else X, kernel=kernel, **params)
    assert np.abs(K64).max() > np.finfo(np.float16).max
    init = rng.integers(0, 3, len(X))
    result = _fit(X, 3, kernel=kernel, init=init, dtype="float16", device=device, **params)
    _check_against_reference(result, K64, init, 3)
    # float16 keeps about 3 digits of K; the objective sum w K_ii - sum C_c / n_c cancels some of them
    assert result.objective == pytest.approx(reference.kernel_kmeans_objective(K64, result.labels), rel=5e-2)


@pytest.mark.parametrize("kernel,params", [("sigmoid", {"gamma": 0.05, "coef0": -0.5}),
                                           ("polynomial", {"degree": 3, "coef0": -1.0, "gamma": 0.1})])
def test_float16_storage_of_negative_kernel_values(device, kernel, params):
    rng = np.random.default_rng(8)
    X, y = _blobs(rng, n=180)
    K64 = reference.kernel_matrix(X, kernel=kernel, **params)
    assert K64.min() < -0.1  # the case: negative values stored in float16
    K16 = kkmgpu.kernel_matrix(X, kernel=kernel, dtype="float16", device=device, **params)
    K16 = K16.get() if hasattr(K16, "get") else K16
    np.testing.assert_allclose(K16.astype(np.float64), K64, rtol=2e-3, atol=2e-3 * np.abs(K64).max())
    init = rng.integers(0, 3, len(X))
    result = _fit(X, 3, kernel=kernel, init=init, dtype="float16", device=device, **params)
    exact = reference.kernel_kmeans_objective(K64, result.labels)
    assert result.objective == pytest.approx(exact, rel=2e-2, abs=2e-3 * np.abs(K64).max() * len(X))


def test_kernel_matrix_overflow_raises_with_dtype_limit():
    X = np.random.default_rng(9).normal(size=(30, 2)) * 1e20
    with pytest.raises(ValueError, match=r"kernel='linear'.*float32's largest value 3.4028e\+38"):
        kkmgpu.kernel_matrix(X, kernel="linear", device="cpu")
    K = kkmgpu.kernel_matrix(X, kernel="linear", device="cpu", dtype="float64")  # representable there
    np.testing.assert_allclose(K, X @ X.T, rtol=1e-12)


def test_callable_values_beyond_float16_raise():
    X = np.random.default_rng(10).normal(size=(40, 2))

    def big(A, B):
        return 1e6 * (A @ B.T + 10.0)

    with pytest.raises(ValueError, match="float16's largest value"):
        kkmgpu.fit(X, 2, kernel=big, dtype="float16", device="cpu")


# --------------------------------------------------------------------------- point 2: offsets


def _offset_data(rng, n_per=100):
    centres = np.array([0.0, 14_400.0, 28_800.0])
    y = np.repeat(np.arange(3), n_per)
    X = 1.7e9 + centres[y][:, None] + rng.normal(scale=600.0, size=(3 * n_per, 2))
    return X, y


@pytest.mark.parametrize("method,extra", [m for m in METHODS if m[0] != "trimmed"],
                         ids=["dense", "tiled", "cats", "eigen"])
def test_linear_kernel_with_a_large_offset_is_plain_kmeans(device, method, extra):
    rng = np.random.default_rng(11)
    X, y = _offset_data(rng)
    result = _fit(X, 3, kernel="linear", method=method, device=device, random_state=0, n_init=3, **extra)
    assert metrics.nmi(y, result.labels) == pytest.approx(1.0)
    # the objective of a PSD kernel is >= 0; here it is the k-means inertia of the labels
    Xc = X - X.mean(0)
    inertia = sum(((Xc[result.labels == c] - Xc[result.labels == c].mean(0)) ** 2).sum() for c in range(3))
    assert result.objective >= 0
    if method != "cats":
        assert result.objective == pytest.approx(inertia, rel=1e-3)
    # predict uses the centre of the fit
    np.testing.assert_array_equal(kkmgpu.predict(result, X[::7]), np.asarray(result.labels)[::7])


@pytest.mark.parametrize("kernel", ["rbf", "laplacian"])
def test_distance_kernels_are_translation_invariant(device, kernel):
    rng = np.random.default_rng(12)
    X, y = _blobs(rng)
    init = rng.integers(0, 3, len(X))
    base = _fit(X, 3, kernel=kernel, init=init, device=device)
    moved = _fit(X + 1.7e9, 3, kernel=kernel, init=init, device=device)
    np.testing.assert_array_equal(moved.labels, base.labels)
    assert moved.objective == pytest.approx(base.objective, rel=1e-5)


@pytest.mark.parametrize("kernel", ["rbf", "laplacian"])
@pytest.mark.parametrize("method,extra", [("exact", {}), ("exact", {"engine": "tiled"}), ("eigen", {})],
                         ids=["dense", "tiled", "eigen"])
def test_default_gamma_is_translation_invariant_per_column(device, kernel, method, extra):
    """gamma="scale" takes the features' centred variances: offsets of up to 1e9 that differ between columns leave
    gamma, K and the labels as they are, in float32 (the variance of all entries counted the offsets as spread:
    gamma near 1e-18, a constant K and random labels)."""
    rng = np.random.default_rng(21)
    X, y = _blobs(rng)
    offsets = np.array([1.7e9, -3e8, 1e9])
    init = rng.integers(0, 3, len(X))
    base = _fit(X, 3, kernel=kernel, init=init, dtype="float32", method=method, device=device, **extra)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kkmgpu.UninformativeKernelWarning)
        moved = _fit(X + offsets, 3, kernel=kernel, init=init, dtype="float32", method=method, device=device,
                     **extra)
    expected = reference.default_kernel_params(X, kernel)["gamma"]
    assert base.kernel_params["gamma"] == pytest.approx(expected, rel=1e-9)
    # X + offsets in float64 rounds X by up to 1e9 * 2^-53 ~ 1e-7: the same gamma to about that
    assert moved.kernel_params["gamma"] == pytest.approx(expected, rel=1e-6)
    np.testing.assert_array_equal(moved.labels, base.labels)
    if kernel == "rbf":  # (the laplacian kernel's default splits these blobs less cleanly, offsets or not)
        assert metrics.nmi(y, moved.labels) == pytest.approx(1.0)


def test_default_gamma_of_float32_data_with_column_offsets(device):
    """Data stored in float32 far from the origin (1.7e9 and 3e8 in two columns, groups 14,400 apart): the default
    gamma comes from the columns' spread, not their offsets, and the groups are found."""
    X, y = _offset_data(np.random.default_rng(22))
    X = (X + np.array([0.0, -1.4e9])).astype(np.float32)  # columns near 1.7e9 and 3e8
    result = _fit(X, 3, device=device, random_state=0)
    assert result.kernel_params["gamma"] == pytest.approx(reference.default_kernel_params(X, "rbf")["gamma"],
                                                          rel=1e-9)
    assert metrics.nmi(y, result.labels) == pytest.approx(1.0)


@pytest.mark.parametrize("kernel", ["polynomial", "sigmoid"])
def test_offset_cancellation_warns_for_kernels_that_are_not_translation_invariant(kernel):
    X, _ = _offset_data(np.random.default_rng(13))
    with pytest.warns(kkmgpu.PrecisionWarning, match=rf"kernel='{kernel}'.*not translation invariant"):
        kkmgpu.fit(X, 3, kernel=kernel, gamma=1e-18, device="cpu", random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kkmgpu.PrecisionWarning)
        kkmgpu.fit(X - X.mean(0), 3, kernel=kernel, gamma=1e-8, device="cpu", random_state=0)


@pytest.mark.parametrize("kernel", ["rbf", "laplacian", "linear"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_psd_kernel_objectives_are_not_negative(device, kernel, dtype):
    X, _ = _offset_data(np.random.default_rng(14))
    result = _fit(X, 3, kernel=kernel, dtype=dtype, device=device, random_state=0)
    K64 = reference.kernel_matrix(X - X.mean(0), kernel=kernel, **reference.default_kernel_params(X, kernel))
    rounding = np.finfo(dtype).eps * np.trace(K64)
    assert result.objective >= -rounding
    assert all(h >= -rounding for h in result.objective_history)


# --------------------------------------------------------------------------- point 3: uninformative kernels


@pytest.mark.parametrize("factor", [1e-3, 1.0, 1e3])
def test_laplacian_default_gamma_is_scale_invariant(device, factor):
    rng = np.random.default_rng(15)
    X, y = _blobs(rng)
    init = rng.integers(0, 3, len(X))
    base = _fit(X, 3, kernel="laplacian", init=init, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kkmgpu.UninformativeKernelWarning)
        scaled = _fit(X * factor, 3, kernel="laplacian", init=init, device=device)
    np.testing.assert_array_equal(scaled.labels, base.labels)
    d = X.shape[1]
    assert scaled.kernel_params["gamma"] == pytest.approx(1 / np.sqrt(d * (X * factor).var(axis=0).mean()), rel=1e-9)
    K64 = reference.kernel_matrix(X, kernel="laplacian", gamma=base.kernel_params["gamma"])
    off = K64[~np.eye(len(X), dtype=bool)]
    assert 0.01 < np.median(off) < 0.9  # values of order exp(-sqrt 2), neither 0 nor 1


@pytest.mark.parametrize("kernel", ["rbf", "laplacian"])
@pytest.mark.parametrize("method", ["exact", "cats", "eigen", "trimmed"])
def test_identity_and_constant_kernels_warn_with_the_direction(device, kernel, method):
    X, _ = _blobs(np.random.default_rng(16))
    quiet = {"category": kkmgpu.ConvergenceWarning}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", **quiet)
        warnings.filterwarnings("ignore", category=UserWarning, message=".*negative eigenvalues")
        with pytest.warns(kkmgpu.UninformativeKernelWarning, match="identity.*Decrease gamma"):
            kkmgpu.fit(X, 3, kernel=kernel, gamma=1e6, method=method, device=device, random_state=0)
        with pytest.warns(kkmgpu.UninformativeKernelWarning, match="constant.*Increase gamma"):
            kkmgpu.fit(X, 3, kernel=kernel, gamma=1e-12, method=method, device=device, random_state=0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", kkmgpu.UninformativeKernelWarning)
            kkmgpu.fit(X, 3, kernel=kernel, method=method, device=device, random_state=0)


def test_constant_kernel_convergence_warning_does_not_only_blame_duplicates():
    X, _ = _blobs(np.random.default_rng(17))
    with pytest.warns(kkmgpu.ConvergenceWarning, match="kernel that does not separate"):
        with pytest.warns(kkmgpu.UninformativeKernelWarning):
            kkmgpu.fit(X, 3, gamma=1e-12, device="cpu", random_state=0)


def test_precomputed_identity_and_saturated_sigmoid_warn():
    X, _ = _blobs(np.random.default_rng(18))
    with pytest.warns(kkmgpu.UninformativeKernelWarning, match="kernel='precomputed' is numerically the identity"):
        kkmgpu.fit(np.eye(len(X)), 3, kernel="precomputed", device="cpu", random_state=0)
    with pytest.warns(kkmgpu.UninformativeKernelWarning, match="constant.*Increase gamma"):
        kkmgpu.fit(X, 3, kernel="sigmoid", gamma=1e-12, device="cpu", random_state=0)


# --------------------------------------------------------------------------- point 5: weights


@pytest.mark.parametrize("scale", [1e38, 1e-50, 1e200, 3.0])
@pytest.mark.parametrize("method,extra", METHODS, ids=METHOD_IDS)
def test_uniform_weights_of_any_scale_give_the_unweighted_clustering(device, method, extra, scale):
    rng = np.random.default_rng(19)
    X, y = _blobs(rng)
    init = rng.integers(0, 3, len(X))
    base = _fit(X, 3, init=init, method=method, device=device, **extra)
    weighted = _fit(X, 3, init=init, method=method, device=device, sample_weight=np.full(len(X), scale), **extra)
    np.testing.assert_array_equal(weighted.labels, base.labels)
    assert np.isfinite(weighted.objective)
    assert weighted.objective == pytest.approx(base.objective * scale, rel=1e-5 if method == "eigen" else 1e-6)
    np.testing.assert_allclose(weighted.cluster_sizes, np.asarray(base.cluster_sizes) * scale, rtol=1e-12)
    np.testing.assert_array_equal(weighted.sample_weight, np.full(len(X), scale))
    np.testing.assert_array_equal(kkmgpu.predict(weighted, X[:30]), kkmgpu.predict(base, X[:30]))


def test_weights_against_the_float64_reference(device):
    rng = np.random.default_rng(20)
    X, y = _blobs(rng)
    w = rng.uniform(0.5, 4.0, len(X)) * 1e-60
    w[::17] = 0.0  # zero weights stay allowed
    init = rng.integers(0, 3, len(X))
    result = _fit(X, 3, init=init, sample_weight=w, device=device, dtype="float64")
    K64 = reference.kernel_matrix(X)
    ref = _check_against_reference(result, K64, init, 3, sample_weight=w)
    np.testing.assert_array_equal(result.labels, ref.labels)
    assert result.objective == pytest.approx(ref.objective, rel=1e-9)


@pytest.mark.parametrize("bad,match", [(-1.0, "negative"), (np.nan, "NaN"), (np.inf, "infinity")])
def test_bad_weights_are_rejected(bad, match):
    X = np.random.default_rng(21).normal(size=(20, 2))
    w = np.ones(20)
    w[3] = bad
    with pytest.raises(ValueError, match=match):
        kkmgpu.fit(X, 2, sample_weight=w, device="cpu")
