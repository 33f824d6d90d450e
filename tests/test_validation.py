"""Bad arguments fail at the boundary with an exception whose message names the value."""

import warnings

import numpy as np
import pytest

import kkmgpu
from conftest import free_device_memory
from kkmgpu.backend import device as _backend


@pytest.fixture
def X():
    return np.random.default_rng(0).normal(size=(40, 3))


def fit(X, k=3, **kwargs):
    kwargs.setdefault("device", "cpu")
    return kkmgpu.fit(X, k, **kwargs)


# --------------------------------------------------------------------------- X


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_X(X, bad):
    X[7, 1] = bad
    with pytest.raises(ValueError, match=r"(?i)nan|inf|finite"):
        fit(X)


@pytest.mark.parametrize("shape", [(40,), (4, 5, 2)], ids=["1d", "3d"])
def test_X_ndim(shape):
    X = np.random.default_rng(1).normal(size=shape)
    with pytest.raises(ValueError, match=r"(?i)2-?d|ndim|dimension"):
        fit(X, 2)


def test_X_empty():
    with pytest.raises(ValueError):
        fit(np.empty((0, 3)), 1)


@pytest.mark.parametrize(
    "bad", [np.ones((5, 2), dtype=complex), np.array([["a", "b"]] * 5)], ids=["complex", "strings"])
def test_X_not_real_numbers(bad):
    with pytest.raises(ValueError, match=r"(?i)dtype|numeric"):
        fit(bad, 2)


# --------------------------------------------------------------------------- k


@pytest.mark.parametrize("k", [0, -2])
def test_k_below_one(X, k):
    with pytest.raises(ValueError, match=str(k)):
        fit(X, k)


def test_k_above_n(X):
    with pytest.raises(ValueError, match="41"):
        fit(X, 41)


@pytest.mark.parametrize("k", ["3", None])
def test_k_wrong_type(X, k):
    with pytest.raises(TypeError, match=repr(k) if k is not None else "None"):
        fit(X, k)


def test_k_non_integer_float(X):
    with pytest.raises((TypeError, ValueError), match="2.5"):
        fit(X, 2.5)


def test_k_numpy_integer_accepted(X):
    result = fit(X, np.int64(3), random_state=0)
    assert result.n_clusters == 3


# --------------------------------------------------------------------------- kernel and its parameters


def test_unknown_kernel(X):
    with pytest.raises(ValueError, match="cosine_xyz"):
        fit(X, kernel="cosine_xyz")


@pytest.mark.parametrize("kernel", ["rbf", "laplacian", "polynomial", "sigmoid"])
@pytest.mark.parametrize("gamma", [0.0, -0.25])
def test_gamma_not_positive(X, kernel, gamma):
    with pytest.raises(ValueError, match=r"gamma.*" + str(gamma).replace(".", r"\.").replace("-", r"\-")):
        fit(X, kernel=kernel, gamma=gamma)


def test_gamma_unknown_string(X):
    with pytest.raises(ValueError, match="wide"):
        fit(X, gamma="wide")


@pytest.mark.parametrize("degree", [0, -1])
def test_degree_below_one(X, degree):
    with pytest.raises(ValueError, match=r"degree.*" + str(degree)):
        fit(X, kernel="polynomial", degree=degree)


def test_degree_not_integer(X):
    with pytest.raises((TypeError, ValueError), match=r"degree.*2\.5"):
        fit(X, kernel="polynomial", degree=2.5)


def test_precomputed_not_square():
    K = np.random.default_rng(2).uniform(size=(10, 12))
    with pytest.raises(ValueError, match=r"(?i)square|\(10, 12\)"):
        fit(K, 2, kernel="precomputed")


def test_precomputed_not_symmetric():
    A = np.random.default_rng(3).uniform(size=(10, 10))
    K = A @ A.T
    K[2, 7] += 0.5
    with pytest.raises(ValueError, match=r"(?i)symmetric"):
        fit(K, 2, kernel="precomputed")


def test_callable_kernel_bad_shape(X):
    def wrong(A, B):
        return A @ B[:5].T

    with pytest.raises(ValueError, match=r"(?i)shape"):
        fit(X, kernel=wrong)


# --------------------------------------------------------------------------- sample_weight


def test_sample_weight_length(X):
    with pytest.raises(ValueError, match="39"):
        fit(X, sample_weight=np.ones(39))


@pytest.mark.parametrize("bad", [-0.5, np.nan, np.inf], ids=["negative", "nan", "inf"])
def test_sample_weight_values(X, bad):
    w = np.ones(40)
    w[5] = bad
    with pytest.raises(ValueError, match=r"(?i)sample_weight"):
        fit(X, sample_weight=w)


def test_sample_weight_all_zero(X):
    with pytest.raises(ValueError, match=r"(?i)sample_weight"):
        fit(X, sample_weight=np.zeros(40))


# --------------------------------------------------------------------------- init, n_init, max_iter, tol, method


def test_init_labels_wrong_length(X):
    with pytest.raises(ValueError, match="39"):
        fit(X, init=np.arange(39) % 3)


@pytest.mark.parametrize("bad", [3, -1])
def test_init_labels_out_of_range(X, bad):
    init = np.arange(40) % 3
    init[4] = bad
    with pytest.raises(ValueError, match=r"(?i)init"):
        fit(X, init=init)


def test_init_labels_not_integer(X):
    init = (np.arange(40) % 3).astype(float) + 0.5
    with pytest.raises((TypeError, ValueError), match=r"(?i)init"):
        fit(X, init=init)


def test_unknown_init_string(X):
    with pytest.raises(ValueError, match="kmeans-parallel"):
        fit(X, init="kmeans-parallel")


@pytest.mark.parametrize("n_init", [0, -3])
def test_n_init_below_one(X, n_init):
    with pytest.raises(ValueError, match=r"n_init.*" + str(n_init)):
        fit(X, n_init=n_init)


def test_n_init_bad_string(X):
    with pytest.raises((TypeError, ValueError), match="often"):
        fit(X, n_init="often")


@pytest.mark.parametrize("max_iter", [0, -1])
def test_max_iter_below_one(X, max_iter):
    with pytest.raises(ValueError, match=r"max_iter.*" + str(max_iter)):
        fit(X, max_iter=max_iter)


def test_max_iter_not_integer(X):
    with pytest.raises(TypeError, match=r"max_iter.*10\.5"):
        fit(X, max_iter=10.5)


@pytest.mark.parametrize("tol", [np.nan, np.inf])
def test_tol_not_finite(X, tol):
    with pytest.raises(ValueError, match=r"tol"):
        fit(X, tol=tol)


def test_coef0_not_finite(X):
    with pytest.raises(ValueError, match=r"coef0.*nan"):
        fit(X, kernel="sigmoid", coef0=np.nan)


def test_kernel_matrix_feature_mismatch(X):
    with pytest.raises(ValueError, match=r"5 features"):
        kkmgpu.kernel_matrix(X, np.ones((4, 5)), device="cpu")


def test_tol_negative(X):
    with pytest.raises(ValueError, match=r"tol.*-0\.001|tol.*-1e-03"):
        fit(X, tol=-1e-3)


def test_unknown_method(X):
    with pytest.raises(ValueError, match="quantum"):
        fit(X, method="quantum")


# --------------------------------------------------------------------------- dtype and device


@pytest.mark.parametrize("dtype", ["bfloat16", "int32", "complex64", "float128"])
def test_bad_dtype(X, dtype):
    with pytest.raises((ValueError, TypeError), match=dtype):
        fit(X, dtype=dtype)


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "gpu0"])
def test_bad_device_string(X, device):
    with pytest.raises(ValueError, match=device):
        fit(X, device=device)


def test_cuda_without_gpu_raises_device_unavailable(X, monkeypatch):
    """No usable GPU (simulated, so that the case runs with and without one): device="cuda" raises naming why."""
    monkeypatch.delenv("KKMGPU_DEVICE", raising=False)
    monkeypatch.setattr(_backend, "cuda_unavailable_reason", lambda: "no CUDA device in this test")
    with pytest.raises(kkmgpu.DeviceUnavailableError, match=r"device='cuda'.*no CUDA device in this test"):
        fit(X, device="cuda")
    assert issubclass(kkmgpu.DeviceUnavailableError, RuntimeError)
    assert kkmgpu.fit(X, 2, device="auto", random_state=0).device == "cpu"  # auto falls back instead


def test_cuda_ordinal_out_of_range(X, monkeypatch):
    monkeypatch.delenv("KKMGPU_DEVICE", raising=False)
    with pytest.raises(kkmgpu.DeviceUnavailableError, match="cuda:999"):
        fit(X, device="cuda:999")


def test_insufficient_memory(X, monkeypatch, device):
    monkeypatch.setattr(_backend.Backend, "available_bytes", lambda self: 4096)
    assert issubclass(kkmgpu.InsufficientMemoryError, MemoryError)
    with pytest.raises(kkmgpu.InsufficientMemoryError, match=r"4096"):
        fit(X, device=device, dtype="float64", engine="dense")


def test_insufficient_memory_names_bytes_needed(monkeypatch):
    n = 3000
    X = np.random.default_rng(4).normal(size=(n, 2))
    monkeypatch.setattr(_backend.Backend, "available_bytes", lambda self: 10_000_000)
    with pytest.raises(kkmgpu.InsufficientMemoryError, match=str(n * n * 4)):
        fit(X, 2, dtype="float32", engine="dense")


# ------------------------------------------------------------------------ device memory on the GPU




def _search_summary(result):
    best = result.clusterings[result.best_index]
    return (len(result.clusterings), result.best_index, best.gamma)


def _critical_summary(result):
    assert result.n_steps > 0 and result.lower > 0  # the walk ran
    return (result.sigma, result.lower)


def _memory_cases(n=300):
    """(name, run(device), bytes of the run's main arrays) for the memory-bound routes of the GPU path."""
    import scipy.sparse

    rng = np.random.default_rng(8)
    X = np.concatenate([rng.normal(c, 0.4, size=(n // 4, 3)) for c in (0.0, 3.0, 6.0, 9.0)])
    y = np.repeat(np.arange(4), n // 4)  # the blobs: a fixed point at a small bandwidth
    init = rng.integers(0, 4, n)
    sq = (X * X).sum(axis=1)
    K = np.exp(-0.2 * np.maximum(sq[:, None] + sq[None, :] - 2.0 * (X @ X.T), 0.0))
    Ksp = scipy.sparse.csr_matrix(np.where(K > 0.05, K, 0.0))
    model = {}
    X_new = rng.normal(4.0, 4.0, size=(2000, 3))

    def predict(device):
        if device not in model:
            model[device] = kkmgpu.fit(X, 4, device=device, init=init, dtype="float32")
        return kkmgpu.predict(model[device], X_new)

    return [
        ("exact-float32", lambda d: kkmgpu.fit(X, 4, device=d, init=init, dtype="float32").labels, n * n * 4),
        ("exact-float64", lambda d: kkmgpu.fit(X, 4, device=d, init=init, dtype="float64").labels, n * n * 8),
        ("exact-float16", lambda d: kkmgpu.fit(X, 4, device=d, init=init, dtype="float16").labels, n * n * 2),
        ("precomputed", lambda d: kkmgpu.fit(K.astype(np.float32), 4, kernel="precomputed", device=d, init=init,
                                              dtype="float32").labels, n * n * 4),
        ("precomputed-sparse", lambda d: kkmgpu.fit(Ksp, 4, kernel="precomputed", device=d, init=init,
                                                     dtype="float64").labels, Ksp.nnz * 12),
        ("trimmed", lambda d: kkmgpu.fit(X, 4, method="trimmed", device=d, init=init).labels, n * n * 4),
        # l = 40 > 32: the GPU decomposes the M_c one by one (cuSOLVER's batched Jacobi limit)
        ("cats", lambda d: kkmgpu.fit(X, 4, method="cats", device=d, init=init, random_state=0, exact_objective=True,
                                      n_samples_per_cluster=40).labels, n * 4 * 40 * 8),  # the n x (k l) block
        # seeded: above 4 million pairs (n = 8192 on a real GPU) sigma0 is the percentile of 1 million sampled pairs,
        # about 1% apart between unseeded runs (the H100 gave a best gamma 2.7e-3 apart at one free memory)
        ("search-bandwidth", lambda d: _search_summary(kkmgpu.search_bandwidth(X, 4, device=d, init=init,
                                                                                max_values=6, random_state=0)),
         2 * n * n * 8),
        # sigma=1: at 0.5 a far tail point of one blob joins the loosest blob once n is in the thousands
        ("critical-bandwidth", lambda d: _critical_summary(kkmgpu.critical_bandwidth(X, y, sigma=1.0, device=d)),
         2 * n * n * 8),
        ("predict", predict, n * n * 4),
        ("silhouette", lambda d: (kkmgpu.metrics.silhouette(X, init, device=d),), n * n * 8),
    ]


_MEMORY_CASES = ("exact-float32", "exact-float64", "exact-float16", "precomputed", "precomputed-sparse", "trimmed",
                 "cats", "search-bandwidth", "critical-bandwidth", "predict", "silhouette")


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:engine='auto'")  # the dense K does not fit: the tiled engine, as it should
@pytest.mark.parametrize("case", range(len(_MEMORY_CASES)), ids=_MEMORY_CASES)
def test_tight_gpu_memory_gives_insufficient_memory_error_or_the_same_result(case):
    """However little memory the GPU has free, a run either raises kkmgpu's InsufficientMemoryError (its memory
    guard) or completes with the result it has with plenty: CuPy's OutOfMemoryError must never escape (a guard
    that accepts and then runs out, or a work buffer sized without looking at the free memory)."""
    from conftest import require_cuda

    require_cuda()
    # The emulated device accounts for every byte, so a few hundred points show the guard's gaps; a real GPU also
    # holds the libraries' workspaces (cuBLAS, cuSOLVER) beside CuPy's pool: there the arrays must dwarf them.
    emulated = hasattr(_backend.import_cupy().cuda, "standin_device_memory")
    name, run, nbytes = _memory_cases(300 if emulated else 8192)[case]
    assert name == _MEMORY_CASES[case]
    expected = run("cuda")
    outcomes = []
    for fraction in (0.5, 1.02, 1.3, 3.0, 10.0):
        with free_device_memory(int(nbytes * fraction / _backend.MEMORY_HEADROOM)):
            try:
                got = run("cuda")
            except kkmgpu.InsufficientMemoryError:
                outcomes.append((fraction, "InsufficientMemoryError"))
                continue
        outcomes.append((fraction, "ok"))
        if isinstance(expected, np.ndarray):
            assert np.mean(np.asarray(got) == expected) >= 0.99, (name, fraction)
        else:
            assert got == pytest.approx(expected, rel=1e-6), (name, fraction)
    assert outcomes[-1][1] == "ok", outcomes  # ten times the main arrays is plenty


# --------------------------------------------------------------------------- predict


def test_predict_wrong_n_features(X):
    result = fit(X, random_state=0)
    with pytest.raises(ValueError, match=r"(?i)feature|\b4\b"):
        kkmgpu.predict(result, np.ones((5, 4)))


def test_predict_non_finite(X):
    result = fit(X, random_state=0)
    X_new = np.ones((5, 3))
    X_new[1, 1] = np.nan
    with pytest.raises(ValueError, match=r"(?i)nan|finite"):
        kkmgpu.predict(result, X_new)


def test_predict_precomputed_wrong_width():
    A = np.random.default_rng(5).normal(size=(30, 2))
    K = A @ A.T
    result = fit(K, 2, kernel="precomputed", random_state=0)
    with pytest.raises(ValueError, match="29"):
        kkmgpu.predict(result, np.ones((4, 29)))


def test_unknown_update_mode(X):
    with pytest.raises(ValueError, match=r"update='sometimes'.*auto.*full.*incremental"):
        fit(X, update="sometimes")


@pytest.mark.parametrize("batch_size, error", [(-1, ValueError), (0, ValueError), (2.5, TypeError),
                                               ("10", TypeError), (True, TypeError)])
@pytest.mark.parametrize("method", ["exact", "cats", "eigen"])
def test_predict_batch_size(X, batch_size, error, method):
    result = fit(X, random_state=0, method=method)
    with pytest.raises(error, match=rf"batch_size={batch_size!r}.*(integer|>= 1)"):
        kkmgpu.predict(result, X[:5], batch_size=batch_size)
    # a valid batch size changes nothing (3 rows per block on 40 points: 14 blocks)
    np.testing.assert_array_equal(kkmgpu.predict(result, X, batch_size=np.int64(3)), kkmgpu.predict(result, X))


# --------------------------------------------------------------------------- input types


@pytest.mark.parametrize("method", ["exact", "cats", "eigen"])
def test_boolean_precomputed_kernel_is_its_0_1_matrix(method, device):
    """A boolean K (an adjacency matrix) clusters as the 0/1 float matrix it stands for, as scikit-learn treats
    boolean arrays as numbers."""
    rng = np.random.default_rng(7)
    groups = np.repeat([0, 1, 2], 12)
    K = (groups[:, None] == groups[None, :]) | np.eye(36, dtype=bool)
    flip = np.triu(rng.uniform(size=(36, 36)) < 0.05, 1)
    K ^= flip | flip.T                                   # symmetric noise
    init = rng.integers(0, 3, 36)
    kwargs = dict(kernel="precomputed", init=init, method=method, random_state=0, device=device)
    if method == "eigen":
        kwargs["dtype"] = "float64"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # eigen: such a K is not PSD (its negative eigenvalues)
        result = fit(K, 3, **kwargs)
        expected = fit(K.astype(np.float64), 3, **kwargs)
    np.testing.assert_array_equal(result.labels, expected.labels)
    assert result.objective == pytest.approx(expected.objective, rel=1e-6)
    np.testing.assert_array_equal(kkmgpu.predict(result, K[:6]), kkmgpu.predict(expected, K[:6].astype(float)))


def test_boolean_features_are_0_1():
    X = np.random.default_rng(8).uniform(size=(30, 4)) < 0.5
    result = fit(X, 2, kernel="linear", random_state=0)
    expected = fit(X.astype(np.float32), 2, kernel="linear", random_state=0)
    np.testing.assert_array_equal(result.labels, expected.labels)
    np.testing.assert_array_equal(kkmgpu.predict(result, X[:5]), expected.labels[:5])


def test_numeric_object_array_is_converted(X):
    as_objects = X.astype(object)
    as_objects[0, 0] = int(3)                            # mixed Python numbers, as scikit-learn accepts
    X = X.copy()
    X[0, 0] = 3.0
    np.testing.assert_array_equal(fit(as_objects, random_state=0).labels, fit(X, random_state=0).labels)


@pytest.mark.parametrize("bad, match", [
    (None, r"NaN or infinity.*None or pd.NA"),           # None -> NaN, then the non-finite error
    ("abc", r"could not be converted to a numeric array.*'abc'"),
    (1 + 2j, r"could not be converted to a numeric array.*complex"),
], ids=["None", "string", "complex"])
def test_object_array_with_non_numbers(X, bad, match):
    X = X.astype(object)
    X[3, 2] = bad
    with pytest.raises(ValueError, match=match):
        fit(X)


def test_pandas_nullable_columns():
    pd = pytest.importorskip("pandas")
    X = np.random.default_rng(9).normal(size=(40, 2))
    frame = pd.DataFrame({"a": pd.array(X[:, 0], dtype="Float64"), "b": pd.array(X[:, 1] > 0, dtype="boolean")})
    expected = np.column_stack([X[:, 0], X[:, 1] > 0]).astype(np.float64)
    np.testing.assert_array_equal(fit(frame, 2, random_state=0).labels, fit(expected, 2, random_state=0).labels)
    frame.loc[5, "a"] = pd.NA
    with pytest.raises(ValueError, match=r"X contains NaN or infinity.*pd.NA"):
        fit(frame, 2)
    with pytest.raises(ValueError, match=r"X_new contains NaN or infinity.*pd.NA"):
        kkmgpu.predict(fit(expected, 2, random_state=0), frame)
    with pytest.raises(ValueError, match=r"could not be converted to a numeric array.*NAType"):
        fit(pd.DataFrame({"a": pd.Series([1.0, pd.NA, 3.0], dtype=object)}), 2)


# --------------------------------------------------------------------------- callable kernels


@pytest.mark.parametrize("method, kwargs", [("exact", {}), ("exact", {"engine": "tiled"}), ("cats", {}),
                                            ("eigen", {}), ("trimmed", {})])
def test_non_symmetric_callable_kernel_is_rejected_as_a_precomputed_one(X, method, kwargs, device):
    def skewed(A, B):
        return A @ (B + 1.0).T                           # k(a, b) = a.b + sum(a) != k(b, a)

    with pytest.raises(ValueError, match=r"kernel callable's matrix on 40 rows of X is not a symmetric kernel matrix"):
        fit(X, kernel=skewed, method=method, device=device, **kwargs)
    with pytest.raises(ValueError, match=r"not a symmetric kernel matrix"):
        fit(skewed(X, X), kernel="precomputed", method=method, device=device)
    # a symmetric callable (with rounding of its own) is accepted and equals its precomputed matrix
    symmetric = fit(X, kernel=lambda A, B: (A @ B.T + 1.0) ** 2, init=np.arange(40) % 3, method=method,
                    dtype="float64", random_state=0, device=device, **kwargs)
    precomputed = fit((X @ X.T + 1.0) ** 2, kernel="precomputed", init=np.arange(40) % 3, method=method,
                      dtype="float64", random_state=0, device=device)
    np.testing.assert_array_equal(symmetric.labels, precomputed.labels)


# --------------------------------------------------------------------------- device environment, memory advice


def test_junk_device_environment_variable(X, monkeypatch):
    monkeypatch.setenv("KKMGPU_DEVICE", "junk")
    assert fit(X, device="cpu", random_state=0).device == "cpu"  # an explicit device='cpu' never reads it
    assert kkmgpu.kernel_matrix(X, device="cpu").shape == (40, 40)
    for device in ("auto", "cuda"):
        with pytest.raises(ValueError, match=r"environment variable KKMGPU_DEVICE='junk' is not valid.*'auto', "
                                             r"'cpu', 'cuda' or 'cuda:N'"):
            fit(X, device=device)


@pytest.mark.parametrize("kwargs, advised, not_advised", [
    (dict(dtype="float32", engine="dense"), ["dtype='float16'", "engine='tiled'", "method='cats'"],
     ["dtype='float32'"]),
    (dict(dtype="float64", engine="dense"), ["dtype='float32'", "engine='tiled'", "method='cats'"],
     ["dtype='float16'"]),
    (dict(dtype="float32", method="eigen"), ["method='cats'"], ["dtype='float", "engine=", "n_components"]),
    (dict(dtype="float64", method="eigen"), ["dtype='float32'", "method='cats'"], ["engine=", "n_components"]),
    (dict(dtype="float32", method="trimmed"), ["dtype='float16'", "method='cats'"], ["engine=", "float32'"]),
    (dict(dtype="float32", kernel="precomputed"), ["dtype='float16'"], ["engine=", "method='cats'", "float32'"]),
], ids=["dense-float32", "dense-float64", "eigen-float32", "eigen-float64", "trimmed", "precomputed"])
def test_insufficient_memory_advice_fits_the_call(monkeypatch, kwargs, advised, not_advised):
    """The advice names only what would reduce this call's memory: never the dtype it already has, the tiled
    engine and CATS where they apply."""
    X = np.random.default_rng(4).normal(size=(300, 2))
    if kwargs.get("kernel") == "precomputed":
        X = X @ X.T                                      # float64: fit makes a float32 copy
    monkeypatch.setattr(_backend.Backend, "available_bytes", lambda self: 100_000)
    with pytest.raises(kkmgpu.InsufficientMemoryError) as info:
        fit(X, 2, **kwargs)
    message = str(info.value)
    assert "fewer points" in message
    for text in advised:
        assert text in message, message
    for text in not_advised:
        assert text not in message, message


def test_insufficient_memory_advice_of_the_search(monkeypatch):
    X = np.random.default_rng(4).normal(size=(300, 2))
    monkeypatch.setattr(_backend.Backend, "available_bytes", lambda self: 100_000)
    for dtype, advised in (("float64", True), ("float32", False)):
        with pytest.raises(kkmgpu.InsufficientMemoryError, match="K and K'") as info:
            kkmgpu.search_bandwidth(X, 2, device="cpu", dtype=dtype)
        assert ("dtype='float32'" in str(info.value)) == advised
        assert "engine=" not in str(info.value) and "method='cats'" not in str(info.value)


def test_eigen_memory_advice_names_n_components_only_where_it_helps(monkeypatch):
    """Issue 27: the eigen route's advice said "n_components well below n_samples / 2" even at n_components=16,
    where the n x n kernel matrix itself did not fit. Lowering n_components saves only the full decomposition's
    workspace (3 n^2 against one n x n copy for the top eigenpairs): the advice names it, with the value that
    takes the lighter route, only when the full decomposition is what failed because of n_components."""
    n = 300
    X = np.random.default_rng(27).normal(size=(n, 2))
    K_bytes = n * n * 4                                  # float32
    headroom = _backend.MEMORY_HEADROOM
    # K does not fit: no n_components helps, whatever its value (16 here, the case)
    monkeypatch.setattr(_backend.Backend, "available_bytes", lambda self: int(0.5 * K_bytes / headroom))
    for n_components in (16, None):
        with pytest.raises(kkmgpu.InsufficientMemoryError, match="kernel matrix") as info:
            fit(X, 2, method="eigen", n_components=n_components, device="cpu")
        assert "n_components" not in str(info.value), str(info.value)
        assert "method='approx'" in str(info.value) and "fewer points" in str(info.value)
    # K and one copy fit, the full decomposition (3 n^2) does not: n_components <= n / 2 is the way out
    monkeypatch.setattr(_backend.Backend, "available_bytes", lambda self: int(2.0 * K_bytes / headroom))
    with pytest.raises(kkmgpu.InsufficientMemoryError, match="full eigendecomposition") as info:
        fit(X, 2, method="eigen", n_components=n, device="cpu")
    assert f"n_components <= {n // 2} instead of {n}" in str(info.value), str(info.value)
    small = fit(X, 2, method="eigen", n_components=n // 2, device="cpu", random_state=0)  # the advice works
    assert small.method_params["n_components"] == n // 2
