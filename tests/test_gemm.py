"""The GEMM precision modes (kkmgpu.kernels.gemm, ``fit(gemm_precision=...)``): the 3xTF32 split, the kernel error
of each mode against float64 on both devices, the same labels as float64 on well-separated data through every
method that computes kernel products, the deprecated ``tf32`` alias, and the memory guard of the split operands.

On the emulated GPU (KKMGPU_EMULATE_GPU=1) the CuPy stand-in rounds float32 GEMM operands to TF32 under the TF32
compute type, as tensor cores read them; the CPU computes every mode as plain float32.
"""

import contextlib
import warnings

import numpy as np
import pytest

import kkmgpu
import reference
from conftest import cuda_skip_reason, free_device_memory
from kkmgpu.backend import device as _backend
from kkmgpu.backend.device import Backend
from kkmgpu.kernels import gemm

U32 = 2.0**-24  # float32's unit roundoff
MODES = gemm.PRECISIONS


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _xp(device):
    return _backend.import_cupy() if device == "cuda" else np


# ------------------------------------------------------------------------------------------ the split


def test_split_is_exact_and_rounds_to_nearest_even(device):
    """H is X rounded to 10 explicit mantissa bits, ties to even (a float64 reference: round(x / q) q with q the
    spacing of TF32 at x); H + L == X exactly; infinities and NaN stay in H with L = 0."""
    xp = _xp(device)
    rng = np.random.default_rng(1)
    X = (rng.normal(size=(64, 50)) * np.exp2(rng.integers(-60, 60, size=(64, 50)))).astype(np.float32)
    X[0, :6] = [1 + 2.0**-11, 1 + 3 * 2.0**-11, -(1 + 2.0**-11), 2 - 2.0**-12, np.inf, np.nan]  # ties, carry, special
    H, L = (_host(a) for a in gemm.tf32_split(xp, xp.asarray(X)))
    finite = np.isfinite(X)
    x = X[finite].astype(np.float64)
    q = np.exp2(np.floor(np.log2(np.abs(x))) - 10)
    np.testing.assert_array_equal(H[finite], np.round(x / q) * q)
    np.testing.assert_array_equal(H[finite].astype(np.float64) + L[finite], x)
    assert np.all(H[~finite][:1] == np.inf) and np.isnan(H[0, 5]) and np.all(L[~finite] == 0)
    assert H[0, 0] == 1 and H[0, 1] == 1 + 2.0**-9 and H[0, 3] == 2  # to even, to even, carry into the exponent


def test_right_operand_in_chunks_and_gathered_equals_the_whole(device):
    xp = _xp(device)
    rng = np.random.default_rng(2)
    X = xp.asarray(rng.normal(size=(97, 33)).astype(np.float32))
    index = xp.asarray(rng.permutation(97))
    whole = _host(gemm.right_operand(X[index], "3xtf32", xp))
    assert whole.shape == (97, 99)
    np.testing.assert_array_equal(_host(gemm.right_operand(X, "3xtf32", xp, index=index, chunk_rows=10)), whole)
    np.testing.assert_array_equal(_host(gemm.right_operand(X, "fp32", xp, index=index, chunk_rows=10)),
                                  _host(X[index]))
    H, L = (_host(a) for a in gemm.tf32_split(xp, X))
    np.testing.assert_array_equal(_host(gemm.left_operand(X, "3xtf32", xp)), np.concatenate([L, H, H], axis=1))


def test_effective_mode():
    cpu, gpu = Backend("cpu"), Backend("cuda", 0)
    assert [gemm.effective_mode(m, cpu, np.float32) for m in MODES] == ["fp32"] * 3
    assert [gemm.effective_mode(m, gpu, np.float64) for m in MODES] == ["fp64"] * 3
    assert [gemm.effective_mode(m, gpu, np.float32) for m in MODES] == list(MODES)
    side = gemm.MIN_TENSOR_CORE_SIDE
    assert gemm.effective_mode("tf32", gpu, np.float32, (1000, 1000, side - 1)) == "fp32"  # memory-bound
    assert gemm.effective_mode("tf32", gpu, np.float32, (side - 1, 1000, 1000)) == "fp32"
    assert gemm.effective_mode("tf32", gpu, np.float32, (side, side, side)) == "tf32"
    with pytest.raises(ValueError, match=r"gemm_precision='bf16' is not one of 'fp32', '3xtf32', 'tf32'"):
        gemm.effective_mode("bf16", gpu, np.float32)


# ------------------------------------------------------------------------------------------ kernel error


def _error_bound(mode, d, S, a=None, gamma=None, K=None):
    """Entrywise bound of |K_mode - K_float64| (Higham's dot-product bound, gamma_n ~ n u).

    Inner products g = <x_i, x_j> of float32 features (rounded from float64: 2u) in a float32 GEMM: |dg| <= (d + 2) u
    S_ij with S = |X| |X|^T. On tensor cores the FP32 accumulation is not correctly rounded (it truncates: Fasi,
    Higham, Mikaitis and Pranesh, PeerJ Comput. Sci. 2021), so each of its additions counts 2u, as in
    kkmgpu.kernels.knn_exact.error_bound. 3xTF32 sums 3 d terms and adds the low parts' truncation to TF32 (2^-21
    of the operand, twice) and the dropped L L^T (2^-22): 5 2^-22 S; TF32 rounds both operands to 2^-11: 2^-10 S.
    The rbf kernel exp(-gamma (a_i + a_j - 2 g)) moves by K gamma |dD| (norms a in float32: (d + 1) u) plus the
    epilogue's float32 rounding (4 u K).
    """
    dg = {"fp32": (d + 2) * U32, "3xtf32": (2 * 3 * d + 2) * U32 + 5 * 2.0**-22,
          "tf32": (2 * d + 2) * U32 + 2.0**-10}[mode]
    if K is None:  # linear
        return dg * S
    dD = (d + 1) * U32 * (a[:, None] + a[None, :]) + 2 * dg * S
    return K * (gamma * dD * 1.01 + 4 * U32)


@pytest.mark.filterwarnings("ignore:gemm_precision='tf32' has no effect:UserWarning")
@pytest.mark.parametrize("kernel", ["linear", "rbf"])
def test_kernel_error_of_each_mode_is_bounded(device, kernel):
    """Every mode stays within its bound of the float64 kernel; on a GPU 3xTF32's error is at most FP32's times the
    ratio of their bounds (6.2 at d = 48: 3 d truncated additions against d rounded ones) and TF32's clearly above
    both (on the CPU every mode is plain float32: one K). For the linear kernel the H100 gave 3.0 times FP32's error
    (2026-11-26), the emulated GPU, which rounds its accumulation, 1.6."""
    rng = np.random.default_rng({"linear": 3, "rbf": 4}[kernel])
    n, d = 160, 48
    X = rng.normal(size=(n, d)) + rng.normal(scale=2.0, size=d)
    gamma = 1.0 / (d * X.var())
    if kernel == "linear":
        K64 = reference.kernel_matrix(X, kernel="linear")
        S = np.abs(X) @ np.abs(X).T
        bound = {m: _error_bound(m, d, S) for m in MODES}
    else:
        K64 = reference.kernel_matrix(X, kernel="rbf", params={"gamma": gamma})
        Xc = X - X.mean(axis=0)  # what kernel_matrix multiplies: centred features
        S, a = np.abs(Xc) @ np.abs(Xc).T, (Xc * Xc).sum(axis=1)
        bound = {m: _error_bound(m, d, S, a, gamma, K64) for m in MODES}
    errors, Ks = {}, {}
    for mode in MODES:
        Ks[mode] = _host(kkmgpu.kernel_matrix(X, kernel=kernel, gamma=gamma if kernel == "rbf" else None,
                                              device=device, gemm_precision=mode)).astype(np.float64)
        dK = np.abs(Ks[mode] - K64)
        assert np.all(dK <= bound[mode]), (mode, float(np.max(dK / bound[mode])))
        errors[mode] = float(dK.max())
    if device == "cpu":
        np.testing.assert_array_equal(Ks["3xtf32"], Ks["fp32"])
        np.testing.assert_array_equal(Ks["tf32"], Ks["fp32"])
    else:
        factor = _error_bound("3xtf32", d, 1.0) / _error_bound("fp32", d, 1.0)
        assert errors["3xtf32"] <= factor * errors["fp32"], (factor, errors)
        assert errors["tf32"] >= 30 * max(errors["fp32"], errors["3xtf32"]), errors


# ------------------------------------------------------------------------------------------ through fit


def _separated(seed, n=240, d=40, k=4):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=4.0, size=(k, d))
    y = rng.permutation(np.arange(n) % k)
    return centres[y] + rng.normal(size=(n, d)), k


@contextlib.contextmanager
def _gemm_modes(monkeypatch):
    """The modes of every GEMM of kernel products run inside (kkmgpu.kernels.gemm.gemm is the one route)."""
    seen = []
    real = gemm.gemm

    def spy(left, right, backend, mode, out=None):
        seen.append(mode)
        return real(left, right, backend, mode, out=out)

    with monkeypatch.context() as m:
        m.setattr(gemm, "gemm", spy)
        yield seen


@pytest.mark.parametrize("method,kwargs", [("exact", dict(engine="dense")), ("exact", dict(engine="tiled")),
                                           ("cats", dict(n_samples_per_cluster=12)), ("approx", dict(n_landmarks=60))],
                         ids=["dense", "tiled", "cats", "approx"])
def test_each_mode_gives_the_float64_labels(device, method, kwargs, monkeypatch):
    """On well-separated clusters every mode gives float64's labels, fit and predict; the fit records the mode asked
    for and the mode that ran, and its kernel products (predict's too) run in that mode."""
    X, k = _separated({"dense": 5, "tiled": 6}.get(kwargs.get("engine"), 7))
    init = np.random.default_rng(8).integers(0, k, X.shape[0])
    common = dict(method=method, init=init, random_state=9, device=device, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        warnings.filterwarnings("ignore", "gemm_precision='tf32' has no effect: the CPU", UserWarning)
        expected = kkmgpu.fit(X, k, dtype="float64", **common)
        assert expected.method_params["gemm_mode"] == "fp64"
        for mode in MODES:
            ran = mode if device == "cuda" else "fp32"
            with _gemm_modes(monkeypatch) as seen:
                result = kkmgpu.fit(X, k, gemm_precision=mode, **common)
            assert result.method_params["gemm_precision"] == mode and result.method_params["gemm_mode"] == ran
            assert ran in seen and set(seen) <= {ran, "fp32"}  # products with a side below 32 run fp32
            np.testing.assert_array_equal(_host(result.labels), _host(expected.labels))
            with _gemm_modes(monkeypatch) as seen:
                labels = kkmgpu.predict(result, X[:80])
            assert set(seen) == {ran}
            np.testing.assert_array_equal(labels, _host(expected.labels)[:80])


def test_eigen_and_trimmed_build_K_in_the_mode(device, monkeypatch):
    X, k = _separated(10, n=160)
    for method in ("eigen", "trimmed"):
        with _gemm_modes(monkeypatch) as seen, warnings.catch_warnings():
            warnings.filterwarnings("ignore", "gemm_precision='tf32' has no effect: the CPU", UserWarning)
            result = kkmgpu.fit(X, k, method=method, gemm_precision="tf32", device=device, random_state=0,
                                **({"init": "k-means++"} if method == "trimmed" else {}))
        ran = "tf32" if device == "cuda" else "fp32"
        assert ran in seen and result.method_params["gemm_mode"] == ran


# ------------------------------------------------------------------------------------------ the API


def test_tf32_is_a_deprecated_alias():
    X, k = _separated(11, n=90)
    with pytest.warns(FutureWarning, match=r"tf32=True is deprecated; use gemm_precision='tf32'"):
        with pytest.warns(UserWarning, match="gemm_precision='tf32' has no effect: the CPU"):
            result = kkmgpu.fit(X, k, device="cpu", random_state=0, tf32=True)
    assert result.method_params["gemm_precision"] == "tf32"
    with pytest.warns(FutureWarning, match=r"tf32=False is deprecated; use gemm_precision='fp32'"):
        result = kkmgpu.fit(X, k, device="cpu", random_state=0, tf32=False, gemm_precision="fp32")
    assert result.method_params["gemm_precision"] == "fp32"
    with pytest.warns(FutureWarning, match=r"tf32=False is deprecated; use gemm_precision='3xtf32'"):
        result = kkmgpu.fit(X, k, device="cpu", random_state=0, tf32=False)
    assert result.method_params["gemm_precision"] == gemm.DEFAULT_PRECISION
    with pytest.raises(ValueError, match=r"tf32=True and gemm_precision='fp32' disagree"):
        kkmgpu.fit(X, k, device="cpu", tf32=True, gemm_precision="fp32")
    with pytest.raises(TypeError, match=r"tf32='yes' must be True or False"):
        kkmgpu.fit(X, k, device="cpu", tf32="yes")
    with pytest.warns(FutureWarning, match="tf32=True is deprecated"), pytest.warns(UserWarning, match="no effect"):
        model = kkmgpu.KernelKMeans(k, method="cats", device="cpu", random_state=0, tf32=True).fit(X)
    assert model.result_.method_params["gemm_precision"] == "tf32"


@pytest.mark.parametrize("value", ["bf16", "TF32", None, 3])
def test_bad_gemm_precision_names_the_choices(value):
    X, k = _separated(12, n=60)
    match = rf"gemm_precision={value!r} is not one of 'fp32', '3xtf32', 'tf32'"
    for call in (lambda: kkmgpu.fit(X, k, device="cpu", gemm_precision=value),
                 lambda: kkmgpu.kernel_matrix(X, device="cpu", gemm_precision=value),
                 lambda: kkmgpu.KernelKMeans(k, device="cpu", gemm_precision=value).fit(X)):
        with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(")", r"\)")):
            call()


def test_an_explicit_mode_warns_only_where_it_has_no_effect(device):
    X, k = _separated(13, n=90)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kkmgpu.fit(X, k, device=device, random_state=0)  # the default never warns
        kkmgpu.fit(X, k, device=device, random_state=0, gemm_precision="fp32")  # fp32 runs as asked everywhere
        if device == "cuda":
            assert kkmgpu.fit(X, k, device=device, gemm_precision="tf32").method_params["gemm_mode"] == "tf32"
    with pytest.warns(UserWarning, match="gemm_precision='tf32' has no effect: dtype='float64'" if device == "cuda"
                      else "gemm_precision='tf32' has no effect: the CPU"):
        kkmgpu.fit(X, k, device=device, dtype="float64", gemm_precision="tf32")
    with pytest.warns(UserWarning, match="gemm_precision='fp32' has no effect"):
        kkmgpu.kernel_matrix(X, device=device, dtype="float64", gemm_precision="fp32")  # float64 runs FP64
    K = reference.kernel_matrix(X, kernel="rbf", params={"gamma": 1.0 / (X.shape[1] * X.var())})
    with pytest.warns(UserWarning, match="has no effect: kernel='precomputed' has no kernel products"):
        result = kkmgpu.fit(K, k, kernel="precomputed", device=device, gemm_precision="tf32")
    assert result.method_params["gemm_mode"] is None


# ------------------------------------------------------------------------------------------ the memory guard




@pytest.mark.gpu
def test_memory_guard_counts_the_split_operands():
    """The dense build's 3xTF32 operands (three times X, twice) are checked before anything is allocated, naming
    gemm_precision='fp32' first among the ways out; the tiled engine's split columns and per-tile rows stay within a
    small device (the emulated one charges every buffer: an allocation past it would raise)."""
    reason = cuda_skip_reason()
    if reason:
        pytest.skip(reason)
    rng = np.random.default_rng(14)
    wide = rng.normal(size=(200, 1000))
    # a few MiB: on a real GPU the free memory kkmgpu reads is modelled (a ballast leaving 6 MiB on the H100 ran
    # out outside CuPy's pool before the guard's arithmetic was tested)
    with free_device_memory(6 * 2**20, fill=False):
        kkmgpu.fit(wide, 2, device="cuda", engine="dense", gemm_precision="fp32", random_state=0)
        with pytest.raises(kkmgpu.InsufficientMemoryError,
                           match=r"kernel matrix and its 3xTF32 GEMM operands needs .*To need less: "
                                 r"gemm_precision='fp32'"):
            kkmgpu.fit(wide, 2, device="cuda", engine="dense", random_state=0)
    X, k = _separated(15, n=1000, d=64)
    init = rng.integers(0, k, 1000)
    kwargs = dict(device="cuda", engine="tiled", init=init, max_iter=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        roomy = kkmgpu.fit(X, k, **kwargs)
        with free_device_memory(2 * 2**20, fill=False):  # tiles of about 70 rows
            small = kkmgpu.fit(X, k, **kwargs)
    assert small.method_params["gemm_mode"] == "3xtf32"
    np.testing.assert_array_equal(_host(small.labels), _host(roomy.labels))
