"""The fused operations' twins (numba on the CPU, CuPy + kernels_cuda/*.cu on the GPU) against plain
float64 NumPy, on fresh random inputs of awkward sizes."""

import re
import subprocess
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import cuda_skip_reason, require_cuda
import kkmgpu
from kkmgpu.kernels import blocks as _kernels
from kkmgpu.kernels import spec as _kernel_spec
from kkmgpu.backend.device import Backend
from kkmgpu.engine.dense import DenseKernelOperator

ROOT = Path(__file__).resolve().parents[1]
SIZES = [(1, 1), (7, 13), (130, 67), (1025, 33)]
TOL = {np.float32: dict(rtol=2e-5, atol=2e-6), np.float64: dict(rtol=1e-12, atol=1e-12)}


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request):
    if request.param == "cuda":
        reason = cuda_skip_reason()
        if reason:
            pytest.skip(reason)
        return Backend("cuda", 0)
    return Backend("cpu")


def _reference_kernel(name, G, a, b, gamma, coef0, degree):
    if name == "rbf":
        return np.exp(-gamma * np.maximum(a[:, None] + b[None, :] - 2 * G, 0))
    if name == "laplacian":
        return np.exp(-gamma * np.sqrt(np.maximum(a[:, None] + b[None, :] - 2 * G, 0)))
    if name == "polynomial":
        return (gamma * G + coef0) ** degree
    if name == "sigmoid":
        return np.tanh(gamma * G + coef0)
    return G


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["rbf", "laplacian", "polynomial", "sigmoid", "linear"])
@pytest.mark.parametrize("m,n", SIZES)
def test_kernel_epilogue_matches_float64_formula(backend, name, dtype, m, n):
    rng = np.random.default_rng([m, n, len(name)])
    A = rng.normal(size=(m, 5))
    B = rng.normal(size=(n, 5))
    G = A @ B.T
    a, b = (A * A).sum(1), (B * B).sum(1)
    gamma, coef0, degree = 0.37, 0.8, 3
    expected = _reference_kernel(name, G, a, b, gamma, coef0, degree)
    block = backend.asarray(G.copy(), dtype=dtype)
    backend.ops.kernel_epilogue(block, backend.asarray(a, dtype=dtype), backend.asarray(b, dtype=dtype),
                                _kernels.EPILOGUE_CODES[name], gamma, coef0, degree)
    got = backend.to_host(block)
    assert got.dtype == dtype
    # float32 inputs already carry rounding of the inner products: compare against the formula on them
    G32, a32, b32 = (x.astype(dtype).astype(np.float64) for x in (G, a, b))
    np.testing.assert_allclose(got, _reference_kernel(name, G32, a32, b32, gamma, coef0, degree), **TOL[dtype])
    if dtype == np.float64:
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def _indicator_sums(K, labels, w, k):
    Y = np.zeros((K.shape[1], k))
    Y[np.arange(K.shape[1]), labels] = w
    return K.astype(np.float64) @ Y


def _symmetric_kernel(rng, n, dtype):
    A = rng.normal(size=(n, 3))
    return np.exp(-0.5 * ((A[:, None, :] - A[None, :, :]) ** 2).sum(-1)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,k", [(1, 1), (5, 5), (37, 1), (203, 7), (1500, 3), (2100, 70)])
def test_full_cluster_sums_match_indicator_product(backend, n, k, dtype):
    """The operator's full pass (segment_sums over the points in label order) = K @ (W * one-hot)."""
    rng = np.random.default_rng([n, k])
    K = _symmetric_kernel(rng, n, dtype)
    labels = rng.integers(0, k, n).astype(np.int32)
    if k > 1 and n > k:
        labels[labels == k - 1] = 0  # an empty cluster
    w = rng.uniform(0.1, 2.0, n)
    w[rng.random(n) < 0.1] = 0.0  # zero weights are allowed
    op = DenseKernelOperator(backend.asarray(K), backend.asarray(w), backend)
    S = backend.to_host(op.cluster_sums(backend.asarray(labels), k))
    assert S.shape == (n, k) and S.dtype == np.float64
    np.testing.assert_allclose(S, _indicator_sums(K, labels, w, k),
                               rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-9)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,k,n_moved", [(2, 2, 1), (40, 3, 0), (257, 5, 1), (300, 4, 37), (1100, 9, 1100)])
def test_incremental_update_equals_full_recomputation(backend, n, k, n_moved, dtype):
    """S(old) updated by the moved rows (S += K[:, moved] dY) equals S(new) computed in full."""
    rng = np.random.default_rng([n, k, n_moved])
    K = _symmetric_kernel(rng, n, dtype)
    old = rng.integers(0, k, n).astype(np.int32)
    new = old.copy()
    moved = rng.choice(n, n_moved, replace=False)
    new[moved] = (old[moved] + rng.integers(1, k, n_moved)) % k if k > 1 else old[moved]
    w = rng.uniform(0.5, 1.5, n)
    op = DenseKernelOperator(backend.asarray(K), backend.asarray(w), backend)
    S = op.cluster_sums(backend.asarray(old), k)
    S = backend.to_host(op.update_cluster_sums(S, backend.asarray(old), backend.asarray(new)))
    expected = _indicator_sums(K, new, w, k)
    np.testing.assert_allclose(S, expected, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-9)


@pytest.mark.parametrize("pieces", ["many", "one"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_segment_sums_accumulates_unsorted_rows_with_signed_coefficients(backend, dtype, pieces, monkeypatch):
    """The raw twin: entries sorted by cluster, rows in any order, repeated rows, negative coefficients. On a
    GPU both launch shapes: many pieces per cluster (partial sums, then segment_reduce) and one (into S)."""
    if backend.is_gpu and pieces == "one":
        from kkmgpu.kernels import kernel_kmeans_cuda as _gpu_kernels

        monkeypatch.setattr(_gpu_kernels, "_TARGET_THREADS", 1)
    rng = np.random.default_rng(123)
    n, k, m = 517, 6, 999
    K = _symmetric_kernel(rng, n, dtype)
    rows = rng.integers(0, n, m)
    clusters = np.sort(rng.integers(0, k, m)).astype(np.int32)
    coeffs = rng.normal(size=m)
    S0 = rng.normal(size=(n, k))
    expected = S0.copy()
    for r, c, a in zip(rows, clusters, coeffs):
        expected[:, c] += a * K[r].astype(np.float64)
    S = backend.asarray(S0.copy())
    backend.ops.segment_sums(backend.asarray(K), backend.asarray(rows), backend.asarray(clusters),
                             backend.asarray(coeffs), S)
    np.testing.assert_allclose(backend.to_host(S), expected, rtol=2e-5 if dtype == np.float32 else 1e-11,
                               atol=2e-4 if dtype == np.float32 else 1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("divide", [False, True])
@pytest.mark.parametrize("shape", [(1, 1), (33, 33), (130, 257)])
def test_offgrid_step_is_sqrt_then_product_or_quotient(backend, dtype, divide, shape):
    rng = np.random.default_rng([*shape, divide])
    D = rng.uniform(0.0, 4.0, shape)
    K0 = np.exp(-D / 0.7)
    Kp0 = np.exp(-D / 1.3)
    K, Kp = backend.asarray(K0.astype(dtype)), backend.asarray(Kp0.astype(dtype))
    backend.ops.offgrid_step(K, Kp, divide)
    root = np.sqrt(Kp0.astype(dtype).astype(np.float64))
    expected = K0.astype(dtype) / root if divide else K0.astype(dtype) * root
    tol = dict(rtol=3e-7, atol=0) if dtype == np.float32 else dict(rtol=1e-15, atol=0)
    np.testing.assert_allclose(backend.to_host(Kp), root, **tol)
    np.testing.assert_allclose(backend.to_host(K), expected, **tol)
    # the papers' identity: one step turns exp(-D/s) into exp(-D (1/s -+ 1/(2 s')))
    sign = -1.0 if divide else 1.0
    np.testing.assert_allclose(backend.to_host(K), np.exp(-D * (1 / 0.7 + sign / (2 * 1.3))),
                               rtol=2e-6 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("kernel", ["rbf", "polynomial"])
def test_lloyd_incremental_equals_full_recomputation(backend, kernel):
    """From the same initial labels the driver with incremental updates gives the full pass's labels,
    history and objective (float64)."""
    from kkmgpu.engine import lloyd as _lloyd

    rng = np.random.default_rng(2024)
    X = np.vstack([rng.normal(c, 1.0, size=(120, 4)) for c in (0.0, 2.5, 5.0)])
    K = kkmgpu.kernel_matrix(X, kernel=kernel, dtype="float64", device="cpu")
    init = rng.integers(0, 3, X.shape[0]).astype(np.int32)
    w = rng.uniform(0.5, 2.0, X.shape[0])
    runs = []
    for update in ("full", "incremental"):
        op = DenseKernelOperator(backend.asarray(K), backend.asarray(w), backend)
        runs.append(_lloyd.lloyd(op, init, 3, max_iter=100, tol=0.0, update=update))
    full, incr = runs
    assert incr.n_iter == full.n_iter > 2
    np.testing.assert_array_equal(backend.to_host(incr.labels), backend.to_host(full.labels))
    np.testing.assert_allclose(incr.history, full.history, rtol=1e-12)


@pytest.mark.parametrize("m,n,k", [(1, 4, 2), (19, 33, 4), (300, 77, 9)])
def test_block_cluster_sums_rectangular(backend, m, n, k):
    rng = np.random.default_rng([m, n, k])
    B = rng.random((m, n))
    labels = rng.integers(0, k, n).astype(np.int32)
    w = rng.uniform(0.5, 1.5, n)
    S = backend.to_host(backend.ops.block_cluster_sums(backend.asarray(B), backend.asarray(labels),
                                                       backend.asarray(w), k))
    np.testing.assert_allclose(S, _indicator_sums(B, labels, w, k), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n,k", [(1, 1), (9, 3), (500, 8), (1031, 1)])
def test_assign_labels_is_argmin_of_eq4(backend, n, k):
    rng = np.random.default_rng([n, k, 4])
    S = rng.random((n, k)) * 10
    diag = rng.random(n) + 1
    sizes = rng.integers(1, 50, k).astype(np.float64)
    if k > 2:
        sizes[1] = 0.0  # empty cluster: never chosen
    within = rng.random(k) * sizes ** 2
    labels = rng.integers(0, k, n).astype(np.int32)
    new, dist, changed = backend.ops.assign_labels(backend.asarray(S), backend.asarray(diag), sizes, within,
                                                   backend.asarray(labels))
    new, dist = backend.to_host(new), backend.to_host(dist)
    with np.errstate(divide="ignore", invalid="ignore"):
        D = diag[:, None] - 2 * S / sizes + within / sizes ** 2
    D[:, sizes == 0] = np.inf
    np.testing.assert_array_equal(new, D.argmin(1))
    np.testing.assert_allclose(dist, D.min(1), rtol=1e-12)
    assert changed == int((D.argmin(1) != labels).sum())
    assert new.dtype == np.int32


def test_build_in_tiles_equals_one_block():
    rng = np.random.default_rng(11)
    X = rng.normal(size=(53, 6))
    be = Backend("cpu")
    spec = _kernel_spec.resolve_kernel("rbf", X=X)
    spec = _kernel_spec.with_center(spec, X, np)
    A = _kernels.prepare_features(X, spec, be, np.float64)
    whole = _kernels.build_kernel_matrix(A, A, spec, be)  # symmetric path: one X X^T product
    tiled = _kernels.build_kernel_matrix(A, A, spec, be, tile=4)  # general path: row tiles
    np.testing.assert_allclose(whole, tiled, rtol=1e-14, atol=1e-15)  # BLAS blocking may differ by an ulp
    np.testing.assert_array_equal(whole, whole.T)
    d2 = ((X[:, None] - X[None]) ** 2).sum(-1)
    np.testing.assert_allclose(whole, np.exp(-spec.gamma * d2), rtol=1e-12, atol=1e-13)


def test_large_symmetric_cpu_build_uses_row_tiles(monkeypatch):
    # OpenBLAS's syrk crashes at n = 40k; above _CPU_SYRK_MAX_ROWS the symmetric CPU build must
    # take the tiled GEMM path and still give the same matrix (small limit here to exercise it).
    rng = np.random.default_rng(12)
    X = rng.normal(size=(77, 5))
    be = Backend("cpu")
    spec = _kernel_spec.with_center(_kernel_spec.resolve_kernel("laplacian", X=X), X, np)
    A = _kernels.prepare_features(X, spec, be, np.float64)
    calls = []
    real_block = _kernels.kernel_block
    monkeypatch.setattr(_kernels, "kernel_block", lambda *a, **kw: calls.append(1) or real_block(*a, **kw))
    monkeypatch.setattr(_kernels, "_CPU_SYRK_MAX_ROWS", 30)
    K = _kernels.build_kernel_matrix(A, A, spec, be)
    assert len(calls) >= 1  # went through the tiles
    d = np.sqrt(((X[:, None] - X[None]) ** 2).sum(-1))
    np.testing.assert_allclose(K, np.exp(-spec.gamma * d), rtol=1e-12, atol=1e-7)
    np.testing.assert_array_equal(np.diag(K), 1.0)


def test_cuda_sources_are_found_and_declare_the_twins():
    from kkmgpu.kernels.kernel_kmeans_cuda import cuda_source  # importable without CuPy

    src = cuda_source()
    for name in ("kernel_epilogue", "assign_labels", "segment_sums", "offgrid_step"):
        assert re.search(rf"__global__ void {name}\(", src), name


@pytest.mark.parametrize("name", ["kernel_kmeans.cu", "tiled.cu", "knn.cu", "sparse.cu"])
def test_cuda_sources_are_found_in_the_source_tree(monkeypatch, name):
    """Without an installed ``kkmgpu.kernels_cuda`` package (a source checkout, as .ci/nvrtc_check.py runs) the
    launchers read kernels_cuda/ from the repository: the same text as the file."""
    from kkmgpu.kernels import kernel_kmeans_cuda

    def not_installed(package):
        raise ModuleNotFoundError(f"No module named {package!r}")

    monkeypatch.setattr(kernel_kmeans_cuda.resources, "files", not_installed)
    assert kernel_kmeans_cuda.cuda_source(name) == (ROOT / "kernels_cuda" / name).read_text()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
def test_every_cu_file_compiles_with_nvcc(tmp_path):
    from kkmgpu.kernels import kernel_kmeans_cuda, knn_cuda, sparse_cuda, tiled_cuda

    launchers = {"kernel_kmeans.cu": kernel_kmeans_cuda, "tiled.cu": tiled_cuda, "knn.cu": knn_cuda,
                 "sparse.cu": sparse_cuda}
    for cu in sorted((ROOT / "kernels_cuda").glob("*.cu")):
        out = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "--ptx", "-o", str(tmp_path / "x.ptx"), str(cu)],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        # every instantiation the launcher asks for (float and double of each kernel) is built
        assert (tmp_path / "x.ptx").read_text().count(".entry") >= len(launchers[cu.name].name_expressions())


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed on this machine")
def test_cuda_half_to_float_in_the_harness_matches_numpy_for_every_bit_pattern():
    """kernel_kmeans.cu's kkm_half_to_float as the CPU harness (tests/cudacpu) builds it, where the PTX conversion
    gives way to the harness's own: NumPy's float16 -> float32 for all 65,536 patterns, bit for bit but for the
    payloads of NaNs (quieted by the compiler's conversion; the GPU instruction need not keep them either)."""
    import cudacpu
    from kkmgpu.kernels.kernel_kmeans_cuda import NVRTC_OPTIONS, cuda_source

    code = cuda_source() + (
        '\nextern "C" __global__ void half_table(const unsigned short* h, float* out, long long n)\n{\n'
        "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;"
        " i += (long long)gridDim.x * blockDim.x)\n        out[i] = kkm_half_to_float(h[i]);\n}\n")
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    out = np.empty(bits.size, dtype=np.float32)
    cudacpu.Module(code, (), NVRTC_OPTIONS, sanitize="").get_function("half_table")(
        (64,), (256,), (bits, out, np.int64(bits.size)))
    expected = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(expected)
    assert nan.sum() == 2 * 1023 and np.isnan(out[nan]).all()
    np.testing.assert_array_equal(out[~nan].view(np.uint32), expected[~nan].view(np.uint32))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
def test_cuda_half_to_float_is_the_hardware_conversion(tmp_path):
    """On the GPU float16 storage is widened by the conversion instruction (cvt.f32.f16), not integer code."""
    out = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "--ptx", "-o", str(tmp_path / "k.ptx"),
                          str(ROOT / "kernels_cuda" / "kernel_kmeans.cu")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    ptx = (tmp_path / "k.ptx").read_text()
    half = re.search(r"\.entry _Z12segment_sumsItE.*?\n}\n", ptx, re.S)
    assert half, "segment_sums<unsigned short> not in the PTX"
    assert "cvt.f32.f16" in half.group(0)
    assert "cvt.f32.f16" not in re.search(r"\.entry _Z12segment_sumsIfE.*?\n}\n", ptx, re.S).group(0)


@pytest.mark.parametrize("n,k", [(1, 1), (300, 4), (1100, 9)])
def test_float16_storage_cluster_sums(backend, n, k):
    """float16 storage: sums of the stored (rounded) values, accumulated without further loss."""
    rng = np.random.default_rng([n, k, 16])
    K16 = _symmetric_kernel(rng, n, np.float16)
    labels = rng.integers(0, k, n).astype(np.int32)
    w = rng.uniform(0.5, 1.5, n)
    op = DenseKernelOperator(backend.asarray(K16), backend.asarray(w), backend)
    S = backend.to_host(op.cluster_sums(backend.asarray(labels), k))
    np.testing.assert_allclose(S, _indicator_sums(K16, labels, w, k), rtol=1e-6, atol=1e-6)


# ---- nearest-neighbour selection (knn.cu): the kernel against its numba twin, both searches against cdist ----------
#: b rows x m columns of a block at (row0, col0), lists of k; rows and columns not multiples of 32, one column (only
#: lane 0 of a warp takes a candidate), a block that holds its own rows (the point itself skipped), fewer candidates
#: than slots, k = 1 and k = MAX_NEIGHBORS
KNN_BLOCKS = [(1, 1, 1, 0, 0), (9, 1, 1, 0, 20), (37, 45, 1, 3, 3), (70, 33, 7, 0, 70), (41, 300, 64, 5, 0),
              (33, 20, 64, 0, 0)]


def _knn_state(n, k, *held):
    """(best, arg) of n rows after the CPU twin's offers of (keys (n, m), col0) in ``held``: candidates col0 + j
    with those keys (partly full lists when there are fewer than k)."""
    from kkmgpu.kernels import knn_cpu

    best, arg = np.full((n, k), np.inf), np.full((n, k), -1, dtype=np.int64)
    for keys, col0 in held:
        knn_cpu.offer_block(-0.5 * keys, np.zeros(keys.shape[1]), 0, col0, best, arg)
    return best, arg


def _offer_both_twins(G, col_sq, row0, col0, best, arg):
    """(best, arg) after one offer_block of each twin from the same inputs (the CUDA one through the host)."""
    require_cuda()
    from kkmgpu.kernels import knn_cpu, knn_cuda

    gpu = Backend("cuda", 0)
    best_gpu, arg_gpu = gpu.asarray(best), gpu.asarray(arg)
    knn_cuda.offer_block(gpu.asarray(G), gpu.asarray(col_sq), row0, col0, best_gpu, arg_gpu)
    knn_cpu.offer_block(G, col_sq, row0, col0, best, arg)
    return (best, arg), (gpu.to_host(best_gpu), gpu.to_host(arg_gpu))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("state", ["empty", "held"])
@pytest.mark.parametrize("b,m,k,row0,col0", KNN_BLOCKS)
def test_knn_offer_block_twins_keep_the_same_lists(b, m, k, row0, col0, state, dtype):
    rng = np.random.default_rng([b, m, k, row0, col0, len(state), np.dtype(dtype).itemsize])
    n = row0 + b + 3
    G, col_sq = rng.normal(size=(b, m)).astype(dtype), rng.random(m) * 4
    if state == "held":
        best, arg = _knn_state(n, k, (rng.normal(size=(n, k // 2 + 5)) * 2 + 2, 1000))
    else:
        best, arg = np.full((n, k), np.inf), np.full((n, k), -1, dtype=np.int64)
    (cpu_best, cpu_arg), (gpu_best, gpu_arg) = _offer_both_twins(G, col_sq, row0, col0, best.copy(), arg.copy())
    np.testing.assert_array_equal(gpu_arg, cpu_arg)
    np.testing.assert_array_equal(gpu_best, cpu_best)
    _assert_k_least(G, col_sq, row0, col0, best, arg, cpu_best, cpu_arg)


def _assert_k_least(G, col_sq, row0, col0, best, arg, got_best, got_arg):
    """Each offered row's list is the k least (key, index) of its held list and the block's candidates (Python's
    tuple order); the other rows are untouched."""
    keys = col_sq[None, :] - 2.0 * G.astype(np.float64)
    b, k = G.shape[0], best.shape[1]
    for r in range(b):
        i = row0 + r
        cand = [(v, col0 + j) for j, v in enumerate(keys[r]) if col0 + j != i]
        want = sorted(cand + list(zip(best[i], arg[i])))[:k]
        assert [a for _, a in want] == got_arg[i].tolist() and [v for v, _ in want] == got_best[i].tolist()
    untouched = np.r_[0:row0, row0 + b:best.shape[0]]
    np.testing.assert_array_equal(got_arg[untouched], arg[untouched])
    np.testing.assert_array_equal(got_best[untouched], best[untouched])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [1, 5, 64])
def test_knn_offer_block_twins_break_ties_by_the_lower_index(k, dtype):
    """Small integer keys repeat many times, in the held lists (indices below and above the block's) and the block:
    of equal keys the lower index stays."""
    rng = np.random.default_rng([k, np.dtype(dtype).itemsize, 7])
    b, m, n, col0 = 50, 130, 50, 100
    held = rng.integers(-5, 1, size=(n, k // 2 + 2)).astype(np.float64)
    best, arg = _knn_state(n, k, (held, 0), (held[:, ::-1].copy(), 1000))
    G, col_sq = rng.integers(-2, 3, size=(b, m)).astype(dtype), rng.integers(0, 3, size=m).astype(np.float64)
    (cpu_best, cpu_arg), (gpu_best, gpu_arg) = _offer_both_twins(G, col_sq, 0, col0, best.copy(), arg.copy())
    np.testing.assert_array_equal(gpu_arg, cpu_arg)
    np.testing.assert_array_equal(gpu_best, cpu_best)
    _assert_k_least(G, col_sq, 0, col0, best, arg, cpu_best, cpu_arg)
    offered = (cpu_arg >= col0) & (cpu_arg < col0 + m)
    assert offered.any() and (cpu_arg < col0).any()  # held and offered candidates kept
    if k > 1:  # held ones above the block's indices kept too, and equal keys side by side
        assert (cpu_arg >= 1000).any() and (np.diff(cpu_best, axis=1) == 0).any()


def test_knn_kernel_list_length_is_the_launchers():
    from kkmgpu.kernels import knn_cuda
    from kkmgpu.kernels.kernel_kmeans_cuda import cuda_source

    assert re.search(rf"#define KNN_MAX_NEIGHBORS {knn_cuda.MAX_NEIGHBORS}\b", cuda_source("knn.cu"))


@pytest.mark.gpu
def test_knn_offer_block_refuses_long_lists_and_other_dtypes():
    require_cuda()
    from kkmgpu.kernels import knn_cuda

    gpu = Backend("cuda", 0)
    G, col_sq = gpu.asarray(np.ones((4, 4))), gpu.asarray(np.ones(4))
    k = knn_cuda.MAX_NEIGHBORS + 1
    best, arg = gpu.asarray(np.full((4, k), np.inf)), gpu.asarray(np.zeros((4, k), np.int64))
    with pytest.raises(ValueError, match=f"n_neighbors={k} must be between 1 and MAX_NEIGHBORS=64"):
        knn_cuda.offer_block(G, col_sq, 0, 0, best, arg)
    best, arg = gpu.asarray(np.full((4, 2), np.inf)), gpu.asarray(np.zeros((4, 2), np.int64))
    with pytest.raises(ValueError, match="dtype=float16 is not supported"):
        knn_cuda.offer_block(gpu.asarray(np.ones((4, 4), np.float16)), col_sq, 0, 0, best, arg)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("block", [37, 64, 4096])
def test_knn_search_equals_the_float64_reference(backend, block, dtype):
    """Each twin's whole search (blocks on and above the diagonal, each product serving its rows and, transposed, its
    columns) keeps the neighbours of a float64 cdist, for blocks that do not divide n and one block."""
    if backend.is_gpu:
        from kkmgpu.kernels.knn_cuda import nearest_neighbors
    else:
        from kkmgpu.kernels.knn_cpu import nearest_neighbors
    from scipy.spatial.distance import cdist

    rng = np.random.default_rng([block, np.dtype(dtype).itemsize, 11])
    X = rng.normal(size=(150, 4)).astype(dtype)
    D = cdist(X.astype(np.float64), X.astype(np.float64), "sqeuclidean")
    np.fill_diagonal(D, np.inf)
    for k in (1, 9, 64):
        index = backend.to_host(nearest_neighbors(backend.asarray(X), k, block=block))
        np.testing.assert_array_equal(np.sort(index, axis=1), np.sort(np.argsort(D, axis=1)[:, :k], axis=1))
