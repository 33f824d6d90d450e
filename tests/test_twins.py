"""The fused operations' twins (numba on the CPU, CuPy + kernels_cuda/*.cu on the GPU) against plain
float64 NumPy, on fresh random inputs of awkward sizes."""

import re
import subprocess
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import cuda_skip_reason
from kkmgpu import _kernels
from kkmgpu._backend import Backend

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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,k", [(1, 1), (5, 5), (37, 1), (203, 7), (1500, 3), (2100, 70)])
def test_cluster_sums_match_indicator_product(backend, n, k, dtype):
    rng = np.random.default_rng([n, k])
    A = rng.normal(size=(n, 3))
    K = np.exp(-0.5 * ((A[:, None, :] - A[None, :, :]) ** 2).sum(-1))  # symmetric, as the operator requires
    labels = rng.integers(0, k, n).astype(np.int32)
    if k > 1 and n > k:
        labels[labels == k - 1] = 0  # an empty cluster
    w = rng.uniform(0.1, 2.0, n)
    w[rng.random(n) < 0.1] = 0.0  # zero weights are allowed
    Kd = backend.asarray(K, dtype=dtype)
    S = backend.to_host(backend.ops.cluster_sums(Kd, backend.asarray(labels), backend.asarray(w), k))
    expected = _indicator_sums(K.astype(dtype), labels, w, k)
    assert S.shape == (n, k) and S.dtype == np.float64
    np.testing.assert_allclose(S, expected, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-9)


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
    spec = _kernels.resolve_kernel("rbf", X=X)
    spec = _kernels.with_center(spec, X, np)
    A = _kernels.prepare_features(X, spec, be, np.float64)
    whole = _kernels.build_kernel_matrix(A, A, spec, be)  # symmetric path: one X X^T product
    tiled = _kernels.build_kernel_matrix(A, A, spec, be, tile=4)  # general path: row tiles
    np.testing.assert_allclose(whole, tiled, rtol=1e-14, atol=1e-15)  # BLAS blocking may differ by an ulp
    np.testing.assert_array_equal(whole, whole.T)
    d2 = ((X[:, None] - X[None]) ** 2).sum(-1)
    np.testing.assert_allclose(whole, np.exp(-spec.gamma * d2), rtol=1e-12, atol=1e-13)


def test_cuda_sources_are_found_and_declare_the_twins():
    from kkmgpu._gpu_kernels import cuda_source  # importable without CuPy

    src = cuda_source()
    for name in ("kernel_epilogue", "assign_labels"):
        assert re.search(rf"__global__ void {name}\(", src), name


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
def test_every_cu_file_compiles_with_nvcc(tmp_path):
    for cu in sorted((ROOT / "kernels_cuda").glob("*.cu")):
        out = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "--ptx", "-o", str(tmp_path / "x.ptx"), str(cu)],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert (tmp_path / "x.ptx").read_text().count(".entry") >= 4
