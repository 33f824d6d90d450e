"""The matrix-free tiled engine: its fused twins against a float64 reference, the operator against the
reference cluster sums, and whole runs against the dense engine from the same initial labels."""

import re
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

import kkmgpu
import reference
from conftest import cuda_skip_reason
from kkmgpu.kernels import blocks as _kernels
from kkmgpu.kernels import spec as _kernel_spec
from kkmgpu.engine import lloyd as _lloyd
from kkmgpu.engine.dense import DenseKernelOperator
from kkmgpu.engine import tiled as _tiled
from kkmgpu.backend.device import Backend, InsufficientMemoryError

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ["rbf", "polynomial", "sigmoid", "linear", "laplacian", "callable"]
PARAMS = {"rbf": dict(gamma=0.15), "laplacian": dict(gamma=0.4), "polynomial": dict(gamma=0.2, degree=3, coef0=1.0),
          "sigmoid": dict(gamma=0.05, coef0=0.3), "linear": {}, "callable": {}}
#: tolerances of float64 results against the float64 reference, and of float32 ones
TOL = {np.float64: dict(rtol=1e-10, atol=1e-10), np.float32: dict(rtol=2e-5, atol=2e-5)}


def _callable_kernel(A, B):
    """A PSD kernel given as a callable: (<a, b> / 4 + 1)^2 (written with the array's own operators)."""
    return (A @ B.T / 4.0 + 1.0) ** 2


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request):
    if request.param == "cuda":
        reason = cuda_skip_reason()
        if reason:
            pytest.skip(reason)
        return Backend("cuda", 0)
    return Backend("cpu")


def _reference_K(X, name):
    if name == "callable":
        return (X @ X.T / 4.0 + 1.0) ** 2
    p = PARAMS[name]
    return reference.kernel_matrix(X, kernel=name, params=p)


def _spec(X, name, xp=np):
    kernel = _callable_kernel if name == "callable" else name
    spec = _kernel_spec.resolve_kernel(kernel, X=X, xp=xp, **PARAMS[name])
    # the linear kernel's values change with the centre (fit centres it; its clustering does not change):
    # here the operators are held to the reference K of the uncentred X
    return _kernel_spec.with_center(spec, X, xp, center_linear=False)


def _blobs(rng, n, d=5, k=3):
    centres = rng.normal(scale=3.0, size=(k, d))
    return centres[rng.integers(0, k, n)] + rng.normal(size=(n, d))


def _indicator_sums(K, labels, w, k):
    Y = np.zeros((K.shape[1], k))
    Y[np.arange(K.shape[1]), labels] = w
    return K @ Y


def _operators(X, name, dtype, backend, w, tile_rows):
    spec = _spec(X, name)
    A = _kernels.prepare_features(X, spec, backend, dtype)
    weights = backend.asarray(w)
    K = _kernels.build_kernel_matrix(A, A, spec, backend)
    dense = DenseKernelOperator(K, weights, backend)
    tiled = _tiled.TiledKernelOperator(A, spec, weights, backend, tile_rows=tile_rows)
    return dense, tiled


# --------------------------------------------------------------------------------------- the twins


def _reference_values(name, G, a, b, gamma, coef0, degree):
    if name in ("rbf", "laplacian"):
        d2 = np.maximum(a[:, None] + b[None, :] - 2 * G, 0)
        return np.exp(-gamma * (d2 if name == "rbf" else np.sqrt(d2)))
    if name == "polynomial":
        return (gamma * G + coef0) ** degree
    if name == "sigmoid":
        return np.tanh(gamma * G + coef0)
    return G


def _twin_inputs(rng, t, m, dtype, name):
    R = rng.normal(size=(t, 4))
    C = rng.normal(size=(m, 4))
    row0 = 5
    col_points = rng.permutation(max(m, t + row0 + 1))[:m].astype(np.int64)
    if m > 3 and t > 2:
        col_points[:2] = [row0 + 1, row0 + t - 1]  # two diagonal entries inside the tile
        C[0], C[1] = R[1], R[t - 1]
    G = (R @ C.T).astype(dtype)
    a = (R * R).sum(1).astype(dtype)
    b = (C * C).sum(1).astype(dtype)
    V = _reference_values(name, G.astype(np.float64), a.astype(np.float64), b.astype(np.float64), 0.3, 0.7, 3)
    if name in ("rbf", "laplacian"):
        rows = row0 + np.arange(t)
        V[rows[:, None] == col_points[None, :]] = 1.0
    return G, a, b, col_points, row0, V


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["rbf", "laplacian", "polynomial", "sigmoid", "linear"])
# the last three split the columns into pieces on the GPU (tiled_cuda.pieces): sorted, and unsorted (whole rows)
@pytest.mark.parametrize("t,m,k,sort", [(1, 1, 1, True), (7, 13, 3, True), (33, 130, 5, False), (130, 257, 70, True),
                                        (40, 2000, 40, True), (9, 1000, 4, False), (3, 3000, 2, True)])
def test_tile_cluster_sums_matches_float64_formula(backend, name, dtype, t, m, k, sort):
    rng = np.random.default_rng([t, m, k, len(name)])
    G, a, b, col_points, row0, V = _twin_inputs(rng, t, m, dtype, name)
    clusters = rng.integers(0, k, m).astype(np.int32)
    if sort:
        clusters.sort()
    coeffs = rng.uniform(-1.0, 2.0, m)
    S0 = rng.normal(size=(t, k))
    expected = S0 + _indicator_sums(V, clusters, coeffs, k)
    ops = _tiled.tiled_ops(backend)
    S = backend.asarray(S0.copy())
    ops.tile_cluster_sums(backend.asarray(G), backend.asarray(a), backend.asarray(b),
                          _kernels.EPILOGUE_CODES[name], 0.3, 0.7, 3, backend.asarray(clusters),
                          backend.asarray(coeffs), backend.asarray(col_points), row0, S)
    scale = np.abs(V).max() * np.abs(coeffs).sum()  # the size of the sums being accumulated
    np.testing.assert_allclose(backend.to_host(S), expected, rtol=TOL[dtype]["rtol"],
                               atol=TOL[dtype]["atol"] * max(1.0, scale))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["rbf", "laplacian", "polynomial", "sigmoid", "linear"])
@pytest.mark.parametrize("t,m,k", [(1, 1, 2), (9, 4, 3), (140, 37, 6), (20, 700, 9)])
def test_tile_moved_sums_matches_float64_formula(backend, name, dtype, t, m, k):
    rng = np.random.default_rng([t, m, k, len(name), 2])
    G, a, b, col_points, row0, V = _twin_inputs(rng, t, m, dtype, name)
    old = rng.integers(0, k, m).astype(np.int32)
    new = ((old + rng.integers(1, k, m)) % k).astype(np.int32)
    w = rng.uniform(0.1, 2.0, m)
    S0 = rng.normal(size=(t, k))
    expected = S0 + _indicator_sums(V, new, w, k) - _indicator_sums(V, old, w, k)
    S = backend.asarray(S0.copy())
    _tiled.tiled_ops(backend).tile_moved_sums(
        backend.asarray(G), backend.asarray(a), backend.asarray(b), _kernels.EPILOGUE_CODES[name], 0.3, 0.7, 3,
        backend.asarray(new), backend.asarray(old), backend.asarray(w), backend.asarray(col_points), row0, S)
    scale = np.abs(V).max() * w.sum()
    np.testing.assert_allclose(backend.to_host(S), expected, rtol=TOL[dtype]["rtol"],
                               atol=TOL[dtype]["atol"] * max(1.0, scale))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["rbf", "laplacian", "polynomial", "sigmoid", "linear"])
def test_tile_epilogue_matches_float64_formula(backend, name, dtype):
    rng = np.random.default_rng([len(name), 3])
    G, a, b, col_points, row0, V = _twin_inputs(rng, 21, 50, dtype, name)
    out = backend.to_host(_tiled.tiled_ops(backend).tile_epilogue(
        backend.asarray(G), backend.asarray(a), backend.asarray(b), _kernels.EPILOGUE_CODES[name], 0.3, 0.7, 3,
        backend.asarray(col_points), row0))
    assert out.dtype == dtype
    np.testing.assert_allclose(out, V, rtol=TOL[dtype]["rtol"], atol=TOL[dtype]["atol"] * np.abs(V).max())
    if name in ("rbf", "laplacian"):
        assert out[1, 0] == 1.0 and out[20, 1] == 1.0  # the diagonal entries are exactly 1


@pytest.mark.parametrize("op", ["tile_cluster_sums", "tile_moved_sums", "tile_epilogue"])
def test_twins_reject_squared_norms_of_the_wrong_length(backend, op):
    G = backend.asarray(np.zeros((3, 4)))
    S = backend.asarray(np.zeros((3, 2)))
    c = backend.asarray(np.zeros(4, dtype=np.int32))
    w = backend.asarray(np.ones(4))
    points = backend.asarray(np.arange(4, dtype=np.int64))
    fn = getattr(_tiled.tiled_ops(backend), op)
    rest = {"tile_cluster_sums": (c, w, points, 0, S), "tile_moved_sums": (c, c, w, points, 0, S),
            "tile_epilogue": (points, 0)}[op]
    with pytest.raises(ValueError, match=r"col_sq has shape \(3,\); the tile G of shape \(3, 4\) needs \(4,\)"):
        fn(G, backend.asarray(np.ones(3)), backend.asarray(np.ones(3)), 1, 0.5, 0.0, 3, *rest)
    with pytest.raises(ValueError, match=r"row_sq has shape \(4,\)"):
        fn(G, backend.asarray(np.ones(4)), backend.asarray(np.ones(4)), 1, 0.5, 0.0, 3, *rest)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["rbf", "laplacian", "polynomial", "sigmoid", "linear"])
@pytest.mark.parametrize("k", [4, 5000])  # runs of hundreds of columns, and of one or two
def test_cuda_twin_equals_numba_twin(name, k):
    reason = cuda_skip_reason()
    if reason:
        pytest.skip(reason)
    rng = np.random.default_rng([k, len(name)])
    cpu, gpu = Backend("cpu"), Backend("cuda", 0)
    G, a, b, col_points, row0, _ = _twin_inputs(rng, 64, 3001, np.float32, name)
    clusters = np.sort(rng.integers(0, k, 3001)).astype(np.int32)
    old = rng.integers(0, k, 3001).astype(np.int32)
    coeffs = rng.uniform(0.1, 2.0, 3001)
    results = []
    for be in (cpu, gpu):
        ops = _tiled.tiled_ops(be)
        S = be.asarray(np.zeros((64, k)))
        # the CPU twins overwrite G with kernel values (G is scratch): each call gets its own copy
        ops.tile_cluster_sums(be.asarray(G.copy()), be.asarray(a), be.asarray(b), _kernels.EPILOGUE_CODES[name], 0.3,
                              0.7, 3, be.asarray(clusters), be.asarray(coeffs), be.asarray(col_points), row0, S)
        ops.tile_moved_sums(be.asarray(G.copy()), be.asarray(a), be.asarray(b), _kernels.EPILOGUE_CODES[name], 0.3,
                            0.7, 3, be.asarray(clusters), be.asarray(old), be.asarray(coeffs), be.asarray(col_points),
                            row0, S)
        results.append(be.to_host(S))
    # both compute every kernel value in float32 and accumulate in float64; only the math library (CUDA's expf
    # and tanhf are within 2 ulps), FMA contraction and the summation order differ
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6, atol=1e-6 * np.abs(results[0]).max())


#: the harness's thread orders (CUDACPU_SCHEDULE / CUDACPU_SEED, read at every launch); a real GPU ignores them
SCHEDULES = [("forward", "0"), ("reverse", "0"), ("random", "1"), ("random", "2")]


def _tile_sums_bits(be, G, a, b, clusters, new, old, coeffs, col_points, row0, k):
    """The bits of one tile_cluster_sums and one tile_moved_sums pass (rbf) on ``be``."""
    ops = _tiled.tiled_ops(be)
    out = []
    for moved in (False, True):
        S = be.asarray(np.zeros((G.shape[0], k)))
        args = (be.asarray(G.copy()), be.asarray(a), be.asarray(b), 1, 0.3, 0.7, 3)
        if moved:
            ops.tile_moved_sums(*args, be.asarray(new), be.asarray(old), be.asarray(coeffs),
                                be.asarray(col_points), row0, S)
        else:
            ops.tile_cluster_sums(*args, be.asarray(clusters), be.asarray(coeffs), be.asarray(col_points), row0, S)
        out.append(be.to_host(S).view(np.uint64).copy())
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [7, 700])  # long runs per cluster, and runs of about three columns
def test_cuda_tile_sums_same_bits_under_every_schedule(monkeypatch, dtype, k):
    """No float atomic decides a result: the tiled kernels give the same bits whatever order the threads run in.
    Emulated, each pass runs under the harness's forward, reverse and two random schedules (atomics apply in
    program order there, so an accumulation whose order follows the threads' changes bits with the schedule); on
    a real GPU the schedules are ignored and the passes are plain repeats. The sums are also held to float64."""
    reason = cuda_skip_reason()
    if reason:
        pytest.skip(reason)
    rng = np.random.default_rng([k, np.dtype(dtype).itemsize, 23])
    t, m = 24, 2001  # split into 7 pieces on the GPU (tiled_cuda.pieces)
    G, a, b, col_points, row0, V = _twin_inputs(rng, t, m, dtype, "rbf")
    clusters = np.sort(rng.integers(0, k, m)).astype(np.int32)
    old = rng.integers(0, k, m).astype(np.int32)
    new = ((old + rng.integers(1, k, m)) % k).astype(np.int32)
    coeffs = rng.uniform(-1.0, 2.0, m)
    gpu = Backend("cuda", 0)
    runs = []
    for schedule, seed in SCHEDULES:
        monkeypatch.setenv("CUDACPU_SCHEDULE", schedule)
        monkeypatch.setenv("CUDACPU_SEED", seed)
        runs.append(_tile_sums_bits(gpu, G, a, b, clusters, new, old, coeffs, col_points, row0, k))
    for (schedule, seed), run in zip(SCHEDULES[1:], runs[1:]):
        for what, got, want in zip(("tile_cluster_sums", "tile_moved_sums"), run, runs[0]):
            assert np.array_equal(got, want), (
                f"{what}: {np.count_nonzero(got != want)} of {got.size} sums differ in their bits between the "
                f"forward schedule and {schedule} (seed {seed})")
    scale = np.abs(coeffs).sum()
    np.testing.assert_allclose(runs[0][0].view(np.float64), _indicator_sums(V, clusters, coeffs, k),
                               rtol=TOL[dtype]["rtol"], atol=TOL[dtype]["atol"] * scale)
    np.testing.assert_allclose(runs[0][1].view(np.float64),
                               _indicator_sums(V, new, coeffs, k) - _indicator_sums(V, old, coeffs, k),
                               rtol=TOL[dtype]["rtol"], atol=TOL[dtype]["atol"] * scale)


def test_cuda_source_declares_the_twins():
    from kkmgpu.kernels.kernel_kmeans_cuda import cuda_source

    src = cuda_source("tiled.cu")
    for name in ("tile_cluster_sums", "tile_moved_sums", "tile_epilogue"):
        assert re.search(rf"__global__ void (__launch_bounds__\([^)]*\)\s*)?{name}\(", src), name


def _kernel_parameters(src, name):
    """The C types of a __global__ kernel's parameters in tiled.cu, with T spelled out as "T"."""
    body = re.search(rf"__global__ void (?:__launch_bounds__\([^)]*\)\s*)?{name}\((.*?)\)\s*{{", src, re.S).group(1)
    types = []
    for param in body.split(","):
        words = param.replace("__restrict__", "").replace("const", "").split()
        types.append(" ".join(words[:-1]).replace(" *", "*"))
    return types


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("t,m", [(70, 9), (3, 5000), (40_000, 300)])
def test_cuda_launchers_pass_what_the_kernels_declare(monkeypatch, dtype, t, m):
    """Without a GPU: the CuPy launchers of kkmgpu.kernels.tiled_cuda hand each kernel of tiled.cu arguments of exactly
    its parameter types (CuPy does not check them: a mismatch would read garbage), with a grid sized to the device's
    SMs, the entries split into pieces only where rows are too few to fill it, and tile_combine after a split."""
    from types import SimpleNamespace

    from kkmgpu.kernels import tiled_cuda as _tiled_gpu
    from kkmgpu.kernels.kernel_kmeans_cuda import cuda_source

    src = cuda_source("tiled.cu")
    sms = 7
    fake_cp = SimpleNamespace(zeros=np.zeros, empty=np.empty, ascontiguousarray=np.ascontiguousarray,
                              concatenate=np.concatenate, int32=np.int32, int64=np.int64, float64=np.float64,
                              cuda=SimpleNamespace(runtime=SimpleNamespace(
                                  getDevice=lambda: 0, getDeviceProperties=lambda i: {"multiProcessorCount": sms})))
    fake_cp.argsort = lambda a: np.argsort(a, kind="stable")
    monkeypatch.setattr(_tiled_gpu, "import_cupy", lambda: fake_cp)
    monkeypatch.setattr(_tiled_gpu, "argsort_stable", lambda xp, a: np.argsort(a, kind="stable"))
    _tiled_gpu._multiprocessors.cache_clear()
    calls = []

    def fake_function(name, dtype_=None):
        def launch(grid, block, args, shared_mem=0):
            calls.append((name, None if dtype_ is None else np.dtype(dtype_), grid, block, args, shared_mem))
        return launch

    monkeypatch.setattr(_tiled_gpu, "_function", fake_function)
    rng = np.random.default_rng([t, m, np.dtype(dtype).itemsize])
    G = rng.normal(size=(t, m)).astype(dtype)
    sq_t, sq_m = rng.random(t).astype(dtype), rng.random(m).astype(dtype)
    k = 5
    c = rng.integers(0, k, m).astype(np.int64)  # converted to int32 by the launcher
    w, points, S = rng.random(m), np.arange(m), np.zeros((t, k))
    _tiled_gpu.tile_cluster_sums(G, sq_t, sq_m, 1, 0.5, 0.0, 3, c, w, points, 5, S)
    _tiled_gpu.tile_moved_sums(G, None, None, 2, 0.5, 1.0, 3, c, c, w, points, 5, S)
    _tiled_gpu.tile_epilogue(G, sq_t, sq_m, 4, 0.5, 0.0, 3, points, 5)
    _tiled_gpu._multiprocessors.cache_clear()
    names = [call[0] for call in calls]
    split = {m: _tiled_gpu.pieces(t, m), 2 * m: _tiled_gpu.pieces(t, 2 * m, gather=True)}
    assert names == (["tile_order_check", "tile_cluster_sums"] + ["tile_combine"] * (split[m] > 1)
                     + ["tile_epilogue", "tile_moved_sums"] + ["tile_combine"] * (split[2 * m] > 1)
                     + ["tile_epilogue"])
    c_types = {"T*": np.dtype(dtype), "int*": np.dtype(np.int32), "double*": np.dtype(np.float64),
               "long long*": np.dtype(np.int64)}
    scalar_types = {"long long": np.int64, "int": np.int32, "double": np.float64}
    row_blocks = -(-t // _tiled_gpu.ROWS_PER_WARP)
    for name, dt, grid, block, args, shared_mem in calls:
        assert dt == (np.dtype(dtype) if name.startswith(("tile_cluster", "tile_moved", "tile_epi")) else None)
        declared = _kernel_parameters(src, name)
        assert len(args) == len(declared), name
        for arg, c_type in zip(args, declared):
            if c_type.endswith("*"):
                assert isinstance(arg, np.ndarray) and arg.dtype == c_types[c_type] and arg.flags.c_contiguous, \
                    (name, c_type, type(arg), getattr(arg, "dtype", None))
            else:
                assert type(arg) is scalar_types[c_type], (name, c_type, type(arg))
        assert block == (256,) and len(grid) == 1 and shared_mem == 0
        if name in ("tile_cluster_sums", "tile_moved_sums"):
            entries = m if name == "tile_cluster_sums" else 2 * m
            p = int(args[-1] if name == "tile_moved_sums" else args[-2])
            assert p == split[entries] and 1 <= p <= max(1, entries // _tiled_gpu.MIN_PIECE)
            # pieces only to fill the device (and, for gathered entries, the 8 warps of a block)
            assert p == 1 or row_blocks * p <= _tiled_gpu.TARGET_WARPS or p <= 8
            partial = args[-2] if name == "tile_moved_sums" else args[-3]
            assert partial.size == (2 * t * p if p > 1 else 1)
            # every work item (a warp's rows and piece) has a warp, in at most the blocks the SMs hold at once
            assert grid[0] == min(_tiled_gpu.BLOCKS_PER_SM * sms, -(-row_blocks * p // 8))
        elif name == "tile_epilogue":
            assert grid == (min(t, 8 * sms),)
    moved_args = next(args for name, _, _, _, args, _ in calls if name == "tile_moved_sums")
    clusters, coeffs, cols = moved_args[3], moved_args[4], moved_args[5]
    assert (np.diff(clusters) >= 0).all()  # the signed entries, sorted by cluster
    np.testing.assert_array_equal(np.sort(cols), np.repeat(np.arange(m), 2))
    np.testing.assert_array_equal(np.sort(coeffs), np.sort(np.concatenate([w, -w])))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
def test_tiled_cu_compiles_with_nvcc_and_has_no_float_atomics(tmp_path):
    out = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "--ptx", "-o", str(tmp_path / "tiled.ptx"),
                          str(ROOT / "kernels_cuda" / "tiled.cu")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    ptx = (tmp_path / "tiled.ptx").read_text()
    # float and double of the three twins, and the two helpers
    assert ptx.count(".entry") == 8
    for name in ("tile_cluster_sums", "tile_moved_sums", "tile_epilogue"):
        assert len(re.findall(rf"\.entry \w*{name}", ptx)) == 2, name
    # no float atomic decides a sum (tile_order_check's integer OR is order-free)
    assert not re.findall(r"\b(?:atom|red)\.[\w.]*\.f(?:16|32|64)\b", ptx)
    assert re.findall(r"\b(?:atom|red)\.[\w.]*\.or\.b32\b", ptx)


# --------------------------------------------------------------------------------------- the operator


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", KERNELS)
def test_tiled_cluster_sums_and_rows_match_reference(backend, name, dtype):
    rng = np.random.default_rng([len(name), 11])
    n, k = 157, 6
    X = _blobs(rng, n)
    K = _reference_K(X, name)
    labels = rng.integers(0, k, n).astype(np.int32)
    labels[labels == 4] = 0  # an empty cluster
    w = rng.uniform(0.2, 2.0, n)
    w[rng.random(n) < 0.1] = 0.0
    spec = _spec(X, name)
    A = _kernels.prepare_features(X, spec, backend, dtype)
    op = _tiled.TiledKernelOperator(A, spec, backend.asarray(w), backend, tile_rows=23)  # 157 = 6 * 23 + 19
    S = backend.to_host(op.cluster_sums(backend.asarray(labels), k))
    scale = np.abs(K).max() * w.sum()
    tol = TOL[dtype]
    np.testing.assert_allclose(S, _indicator_sums(K, labels, w, k), rtol=tol["rtol"], atol=tol["atol"] * scale)
    np.testing.assert_allclose(backend.to_host(op.diag), np.diag(K), rtol=tol["rtol"], atol=0)
    np.testing.assert_allclose(op.total_diag, w @ np.diag(K), rtol=tol["rtol"])
    idx = [0, 156, 40]
    np.testing.assert_allclose(op.rows(idx), K[idx], rtol=tol["rtol"], atol=tol["atol"] * np.abs(K).max())
    if name in ("rbf", "laplacian"):
        assert (op.rows(idx)[np.arange(3), idx] == 1.0).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", ["rbf", "polynomial", "callable"])
@pytest.mark.parametrize("n_moved", [0, 1, 29, 140])
def test_incremental_update_equals_full_recomputation(backend, name, dtype, n_moved):
    rng = np.random.default_rng([n_moved, len(name), 12])
    n, k = 140, 5
    X = _blobs(rng, n)
    old = rng.integers(0, k, n).astype(np.int32)
    new = old.copy()
    moved = rng.choice(n, n_moved, replace=False)
    new[moved] = (old[moved] + rng.integers(1, k, n_moved)) % k
    w = rng.uniform(0.5, 1.5, n)
    spec = _spec(X, name)
    op = _tiled.TiledKernelOperator(_kernels.prepare_features(X, spec, backend, dtype), spec, backend.asarray(w),
                                    backend, tile_rows=17)
    S = op.cluster_sums(backend.asarray(old), k)
    updated = backend.to_host(op.update_cluster_sums(S, backend.asarray(old), backend.asarray(new)))
    full = backend.to_host(op.cluster_sums(backend.asarray(new), k))
    K = _reference_K(X, name)
    scale = np.abs(K).max() * w.sum()
    tol = TOL[dtype]
    np.testing.assert_allclose(updated, full, rtol=tol["rtol"], atol=tol["atol"] * scale)
    np.testing.assert_allclose(updated, _indicator_sums(K, new, w, k), rtol=tol["rtol"], atol=tol["atol"] * scale)
    assert op.incremental_cost(n_moved) == n_moved / n


@pytest.mark.parametrize("n_moved", [0, 1, 29, 140])
def test_incremental_update_told_the_moved_count_gives_the_same_bits(backend, n_moved):
    """The Lloyd loop tells the update how many points moved (``takes_moved_count``): the moved points are then
    gathered on the device without a transfer, in the order flatnonzero gives; the sums are the bits of the update
    that counts them itself, and equal the float64 reference's."""
    rng = np.random.default_rng([n_moved, 26])
    n, k = 140, 5
    X = _blobs(rng, n)
    old = rng.integers(0, k, n).astype(np.int32)
    new = old.copy()
    moved = rng.choice(n, n_moved, replace=False)
    new[moved] = (old[moved] + rng.integers(1, k, n_moved)) % k
    w = rng.uniform(0.5, 1.5, n)
    spec = _spec(X, "rbf")
    op = _tiled.TiledKernelOperator(_kernels.prepare_features(X, spec, backend, np.float32), spec,
                                    backend.asarray(w), backend, tile_rows=23)
    assert op.takes_moved_count
    S = op.cluster_sums(backend.asarray(old), k)
    counted = backend.to_host(op.update_cluster_sums(S.copy(), backend.asarray(old), backend.asarray(new)))
    told = backend.to_host(op.update_cluster_sums(S, backend.asarray(old), backend.asarray(new), n_moved=n_moved))
    np.testing.assert_array_equal(told, counted)
    K = _reference_K(X, "rbf")
    tol = TOL[np.float32]
    np.testing.assert_allclose(told, _indicator_sums(K, new, w, k), rtol=tol["rtol"], atol=tol["atol"] * w.sum())


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", KERNELS)
def test_tiled_run_equals_dense_run_from_same_init(backend, name, dtype):
    """Lloyd from the same initial labels: tiled (tiles of 29 rows, n = 211 not a multiple) == dense."""
    rng = np.random.default_rng([len(name), 13])
    n, k = 211, 3
    X = _blobs(rng, n)
    init = rng.integers(0, k, n).astype(np.int32)
    w = rng.uniform(0.5, 2.0, n)
    dense, tiled = _operators(X, name, dtype, backend, w, tile_rows=29)
    runs = [_lloyd.lloyd(op, init, k, max_iter=100, tol=0.0) for op in (dense, tiled)]
    labels = [backend.to_host(r.labels) for r in runs]
    K = _reference_K(X, name)
    if dtype == np.float64:
        np.testing.assert_array_equal(labels[1], labels[0])
        assert runs[1].n_iter == runs[0].n_iter
        np.testing.assert_allclose(runs[1].history, runs[0].history, rtol=1e-9)
        np.testing.assert_allclose(runs[1].objective,
                                   reference.kernel_kmeans_objective(K, labels[1], w, k), rtol=1e-9)
    else:
        assert np.mean(labels[1] == labels[0]) >= 0.99
        np.testing.assert_allclose(runs[1].objective, runs[0].objective, rtol=1e-4)
        np.testing.assert_allclose(runs[1].objective,
                                   reference.kernel_kmeans_objective(K, labels[1], w, k), rtol=1e-4)


# --------------------------------------------------------------------------------------- through fit


@pytest.mark.parametrize("update", ["auto", "incremental", "full"])
def test_fit_engine_tiled_equals_dense(device, monkeypatch, update):
    rng = np.random.default_rng(14)
    X = _blobs(rng, 301, d=6, k=4)
    monkeypatch.setitem(_tiled.TILE_MAX_BYTES, "cpu", 40 * 301 * 8)  # tiles of 40 rows: 301 is no multiple
    monkeypatch.setitem(_tiled.TILE_MAX_BYTES, "cuda", 40 * 301 * 8)
    kw = dict(kernel="rbf", gamma=0.1, device=device, dtype="float64", random_state=3, update=update, n_init=2)
    dense = kkmgpu.fit(X, 4, engine="dense", **kw)
    tiled = kkmgpu.fit(X, 4, engine="tiled", **kw)
    np.testing.assert_array_equal(tiled.labels, dense.labels)
    np.testing.assert_allclose(tiled.objective_history, dense.objective_history, rtol=1e-9)
    assert tiled.method_params["engine"] == "tiled" and dense.method_params["engine"] == "dense"
    X_new = rng.normal(scale=3.0, size=(50, 6))
    np.testing.assert_array_equal(kkmgpu.predict(tiled, X_new), kkmgpu.predict(dense, X_new))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tiled_fit_same_inputs_same_bits(device, monkeypatch, dtype):
    """engine="tiled", full passes and incremental updates: two fits with the same inputs and seed give identical
    labels and objectives (tests/test_properties.py::test_same_inputs_same_bits holds the dense engine to it).
    Emulated, the second fit runs under the harness's reverse thread schedule and a third under a random one, so
    an order-dependent accumulation in tiled.cu fails here without a GPU; on a GPU the fits are plain repeats."""
    rng = np.random.default_rng(24)
    X = np.concatenate([rng.normal(c, 0.6, size=(150, 3)) for c in (0.0, 2.0, 4.0, 6.0)])
    kw = dict(kernel="rbf", gamma=0.5, init="k-means++", n_init=2, random_state=5, dtype=dtype, device=device,
              engine="tiled", update="incremental")
    runs = []
    for schedule, seed in SCHEDULES[:3]:
        monkeypatch.setenv("CUDACPU_SCHEDULE", schedule)
        monkeypatch.setenv("CUDACPU_SEED", seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
            runs.append(kkmgpu.fit(X, 4, **kw))
    for run in runs[1:]:
        np.testing.assert_array_equal(run.labels, runs[0].labels)
        assert run.objective == runs[0].objective
        np.testing.assert_array_equal(run.objective_history, runs[0].objective_history)
    assert runs[0].method_params["engine"] == "tiled"


def test_auto_engine_falls_back_to_tiled_when_K_does_not_fit(device, monkeypatch):
    rng = np.random.default_rng(15)
    X = _blobs(rng, 250)
    init = rng.integers(0, 3, 250)
    expected = kkmgpu.fit(X, 3, init=init, device=device, dtype="float64")
    assert expected.method_params["engine"] == "dense"
    # K takes 250^2 * 8 = 500 kB; report 200 kB free
    monkeypatch.setattr(Backend, "available_bytes", lambda self: 200_000)
    with pytest.warns(UserWarning, match="using engine='tiled'"):
        result = kkmgpu.fit(X, 3, init=init, device=device, dtype="float64")
    assert result.method_params["engine"] == "tiled"
    np.testing.assert_array_equal(result.labels, expected.labels)
    np.testing.assert_allclose(result.objective, expected.objective, rtol=1e-9)
    with pytest.raises(InsufficientMemoryError, match="kernel matrix"):
        kkmgpu.fit(X, 3, init=init, device=device, dtype="float64", engine="dense")


def test_estimator_passes_engine():
    X = _blobs(np.random.default_rng(16), 120)
    model = kkmgpu.KernelKMeans(3, engine="tiled", device="cpu", random_state=0).fit(X)
    assert model.result_.method_params == {"engine": "tiled", "gemm_precision": "3xtf32", "gemm_mode": "fp32"}
    assert model.get_params()["engine"] == "tiled"


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(engine="sparse"), ValueError, r"engine='sparse' is not valid"),
    (dict(engine="tiled", kernel="precomputed"), ValueError, r"engine='tiled' recomputes"),
    (dict(engine="tiled", method="cats"), ValueError, r"only applies to method='exact'"),
    (dict(tf32=1), TypeError, r"tf32=1 must be True or False"),
])
def test_engine_validation(kwargs, error, match):
    X = np.random.default_rng(17).normal(size=(30, 3))
    if kwargs.get("kernel") == "precomputed":
        X = X @ X.T
    with pytest.raises(error, match=match):
        kkmgpu.fit(X, 2, device="cpu", **kwargs)


def test_tf32_is_a_noop_with_a_warning_on_the_cpu():
    X = _blobs(np.random.default_rng(18), 90)
    plain = kkmgpu.fit(X, 3, device="cpu", engine="tiled", random_state=1)
    with pytest.warns(UserWarning, match="gemm_precision='tf32' has no effect: the CPU"):
        tf32 = kkmgpu.fit(X, 3, device="cpu", engine="tiled", random_state=1, gemm_precision="tf32")
    np.testing.assert_array_equal(tf32.labels, plain.labels)
    assert tf32.method_params["gemm_mode"] == "fp32"


@pytest.mark.gpu
def test_tf32_on_gpu_changes_few_labels():
    """TF32 GEMMs (10-bit mantissas) stay close to float32; the measured effect is reported in the README."""
    reason = cuda_skip_reason()
    if reason:
        pytest.skip(reason)
    X = _blobs(np.random.default_rng(19), 3000, d=40, k=5)  # d >= gemm.MIN_TENSOR_CORE_SIDE
    init = np.random.default_rng(20).integers(0, 5, 3000)
    plain = kkmgpu.fit(X, 5, device="cuda", engine="tiled", init=init, gemm_precision="fp32")
    tf32 = kkmgpu.fit(X, 5, device="cuda", engine="tiled", init=init, gemm_precision="tf32")
    assert tf32.method_params["gemm_mode"] == "tf32"
    assert np.mean(tf32.labels == plain.labels) >= 0.99
    np.testing.assert_allclose(tf32.objective, plain.objective, rtol=1e-3)


@pytest.mark.gpu
def test_tf32_gemms_are_in_effect_and_bounded():
    """gemm_precision="tf32" must really switch the tiled engine's GEMMs to TF32 (else the measured "effect" of TF32
    would be that of float32): its cluster sums are further from the float64 reference than float32's, within
    TF32's rounding (inputs to 11 significant bits); "3xtf32" stays at float32's level."""
    reason = cuda_skip_reason()
    if reason:
        pytest.skip(reason)
    rng = np.random.default_rng(22)
    n, d, k = 1024, 256, 4
    X = rng.normal(size=(n, d))
    w = rng.uniform(0.5, 1.5, n)
    labels = rng.integers(0, k, n).astype(np.int32)
    expected = _indicator_sums(X @ X.T, labels, w, k)  # linear kernel, float64
    norms = np.linalg.norm(X, axis=1)
    bound = norms[:, None] * (w * norms).sum()  # |S[i, c] error| <= u * |x_i| sum_j w_j |x_j| per unit roundoff u
    be = Backend("cuda", 0)
    spec = _spec(X, "linear")
    A = _kernels.prepare_features(X, spec, be, np.float32)
    errors = {}
    for mode in ("fp32", "3xtf32", "tf32"):
        op = _tiled.TiledKernelOperator(A, _kernel_spec.replace(spec, precision=mode), be.asarray(w), be,
                                        tile_rows=300)
        S = be.to_host(op.cluster_sums(be.asarray(labels), k))
        errors[mode] = float(np.max(np.abs(S - expected) / bound))
    assert errors["fp32"] < 1e-6 and errors["3xtf32"] < 1e-6
    assert errors["tf32"] < 2.0**-10
    assert errors["tf32"] > 20 * max(errors["fp32"], errors["3xtf32"]), errors


def test_verbose_reports_the_progress_of_a_full_pass(capsys):
    rng = np.random.default_rng(21)
    X = _blobs(rng, 95)
    spec = _spec(X, "rbf")
    be = Backend("cpu")
    op = _tiled.TiledKernelOperator(_kernels.prepare_features(X, spec, be, np.float64), spec, np.ones(95), be,
                                    tile_rows=4, verbose=True)
    op.cluster_sums(rng.integers(0, 3, 95).astype(np.int32), 3)
    lines = capsys.readouterr().out.splitlines()
    assert 9 <= len(lines) <= 11  # about every 10% of the rows
    assert lines[-1] == "[kkmgpu] tiled pass: 95 of 95 rows"
