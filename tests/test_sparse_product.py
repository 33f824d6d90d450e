"""Sparse x dense products in a fixed order (kkmgpu/kernels/sparse_cuda.py, kernels_cuda/sparse.cu): held to a
float64 reference summed with math.fsum, the same bits on every call, on both devices; rows of every length (empty,
one chunk, many chunks), float32 and float64 values, vectors and matrices, values of 1e+-150."""

import math

import numpy as np
import pytest
import scipy.sparse as sp

from kkmgpu.backend import device as _backend
from kkmgpu.kernels import sparse_cuda


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _matrix(rng, lengths, n_cols, dtype, scale=1.0):
    """CSR with the given row lengths (distinct random columns per row), values of both signs."""
    rows, cols = [], []
    for i, length in enumerate(lengths):
        rows += [i] * length
        cols += list(rng.choice(n_cols, size=length, replace=False))
    data = (rng.standard_normal(len(rows)) * scale).astype(dtype)
    return sp.csr_matrix((data, (rows, cols)), shape=(len(lengths), n_cols))


def _reference(A, X):
    """float64 A @ X, each entry an exactly rounded sum (math.fsum of the float64 products)."""
    A = A.tocsr()
    X2 = np.asarray(X, dtype=np.float64).reshape(A.shape[1], -1)
    out = np.zeros((A.shape[0], X2.shape[1]))
    for i in range(A.shape[0]):
        s, e = A.indptr[i], A.indptr[i + 1]
        vals = A.data[s:e].astype(np.float64)
        for j in range(X2.shape[1]):
            out[i, j] = math.fsum(vals * X2[A.indices[s:e], j])
    return out if np.ndim(X) == 2 else out[:, 0]


def _to_device(A, backend):
    from kkmgpu.engine import sparse as _sparse
    return _sparse.to_backend_csr(A, backend) if backend.is_gpu else A


CHUNK = sparse_cuda.CHUNK


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cols", [None, 1, 3, 37])
def test_product_is_the_float64_sum_of_every_row(device, dtype, cols):
    """Rows of 0, 1, CHUNK - 1, CHUNK, CHUNK + 1 and 5 CHUNK + 3 entries, and a long row beside short ones: every
    entry within a few float64 ulps of the row's exact sum (of |products|), on both devices."""
    rng = np.random.default_rng(5)
    lengths = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK + 3, 0, 2, 3 * CHUNK]
    A = _matrix(rng, lengths, 400, dtype)
    X = rng.standard_normal(400 if cols is None else (400, cols))
    ref = _reference(A, X)
    backend = _backend.resolve_device(device)
    with backend.activate():
        got = _host(sparse_cuda.product(_to_device(A, backend), backend.asarray(X), backend)).astype(np.float64)
    assert got.shape == ref.shape
    magnitude = _reference(abs(A), np.abs(X))
    np.testing.assert_array_less(np.abs(got - ref), 4 * len(lengths) * np.finfo(np.float64).eps * magnitude + 1e-300)
    assert np.all(got[0] == 0) and np.all(got[6] == 0)


def test_same_inputs_same_bits_and_the_order_is_the_documented_one(device):
    """Two calls give the same bits; on a GPU the value is the chunked order of sparse.cu (each chunk of CHUNK
    entries added in order, then the chunks in order), reproduced here in Python."""
    rng = np.random.default_rng(6)
    lengths = [7 * CHUNK + 5, CHUNK, 3, 0, 2 * CHUNK + 1]
    A = _matrix(rng, lengths, 1000, np.float64)
    X = rng.standard_normal((1000, 2)) * 10.0 ** rng.integers(-8, 8, size=(1000, 1))
    backend = _backend.resolve_device(device)
    with backend.activate():
        Ad, Xd = _to_device(A, backend), backend.asarray(X)
        first = _host(sparse_cuda.product(Ad, Xd, backend))
        second = _host(sparse_cuda.product(Ad, Xd, backend))
    np.testing.assert_array_equal(first, second)
    if backend.is_gpu:
        expected = np.zeros((len(lengths), 2))
        for i in range(len(lengths)):
            s, e = A.indptr[i], A.indptr[i + 1]
            for j in range(2):
                total = 0.0
                for c0 in range(s, e, CHUNK):
                    acc = 0.0
                    for t in range(c0, min(c0 + CHUNK, e)):
                        acc += A.data[t] * X[A.indices[t], j]
                    total += acc
                expected[i, j] = total
        # the kernel may fuse a product and an add (FMA): a float64 rounding per term at most
        np.testing.assert_allclose(first, expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("scale", [1e-150, 1e150])
def test_extreme_values_stay_finite_and_exact_to_rounding(device, scale):
    rng = np.random.default_rng(7)
    A = _matrix(rng, [3 * CHUNK, 1, 0, CHUNK + 2], 300, np.float64, scale=scale)
    X = rng.standard_normal(300)
    ref = _reference(A, X)
    backend = _backend.resolve_device(device)
    with backend.activate():
        got = _host(sparse_cuda.product(_to_device(A, backend), backend.asarray(X), backend))
    assert np.all(np.isfinite(got))
    magnitude = _reference(abs(A), np.abs(X))
    np.testing.assert_array_less(np.abs(got - ref), 16 * np.finfo(np.float64).eps * magnitude + 1e-300)


def test_row_sums_are_the_degrees(device):
    rng = np.random.default_rng(8)
    A = _matrix(rng, [0, 4 * CHUNK + 9, 1, CHUNK, 0, 0], 500, np.float64)  # empty rows first and last
    ref = _reference(A, np.ones(500))
    backend = _backend.resolve_device(device)
    with backend.activate():
        got = _host(sparse_cuda.row_sums(_to_device(A, backend), backend))
    assert got.dtype == np.float64 and got.shape == (6,)
    np.testing.assert_allclose(got, ref, rtol=1e-13, atol=0)


def test_the_kernel_chunk_is_the_documented_constant():
    from pathlib import Path

    source = (Path(__file__).resolve().parents[1] / "kernels_cuda" / "sparse.cu").read_text()
    assert f"#define KKM_CSR_CHUNK {CHUNK} " in source


def test_shape_mismatch_and_dense_operands_are_refused(device):
    backend = _backend.resolve_device(device)
    with backend.activate():
        A = _to_device(sp.random(5, 4, density=0.5, format="csr", random_state=0), backend)
        with pytest.raises(ValueError, match=r"shape \(5, 4\).*\(3,\)|mismatch"):
            sparse_cuda.product(A, backend.xp.ones(3), backend)
        if backend.is_gpu:
            with pytest.raises(TypeError, match="cupyx.scipy.sparse"):
                sparse_cuda.csr_product(backend.xp.ones((5, 4)), backend.xp.ones(4))
