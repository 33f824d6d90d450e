"""Sparse x dense products with a fixed order of summation: the same bits on every call, on both devices.

:func:`product` is what kkmgpu's graph routes and sparse engine use for every CSR matrix times a dense vector or
matrix (degrees, cluster sums, the eigensolvers' operator, the landmark route's transfer cut):

* CPU: SciPy's CSR product, which adds each row's entries in order (one pass, no threads), unchanged.
* GPU: the kernels of ``kernels_cuda/sparse.cu``. cuSPARSE's CSR products, which CuPy runs for ``csr @ x`` and
  ``csr.sum(axis=...)``, split long rows between threads and add the pieces in an order that changes from run to
  run: on an H100 (2026-11-26, ``bench/probes/sparse_determinism.py``) rows of 50 entries repeated their bits and
  rows of 1,000 or 25,000 did not, and two ``method="landmark"`` fits of the same seed gave cuts 8e-11 apart. Here
  each row's entries are cut into chunks of :data:`CHUNK` (a constant, not a device size), one thread adds a chunk
  in entry order and another adds the row's chunks in order; float64 throughout, no atomics, no transfer.

The result is float64 on the GPU and SciPy's dtype on the CPU (the callers cast). CuPy comes from
:mod:`kkmgpu.backend.cupy_loader`, the one module that imports it.
"""

from __future__ import annotations

import functools

import numpy as np

from kkmgpu.backend.cupy_loader import import_cupy, import_cupyx
from kkmgpu.kernels.kernel_kmeans_cuda import NVRTC_OPTIONS, cuda_source

__all__ = ["CHUNK", "CsrProduct", "csr_product", "name_expressions", "operator", "product", "row_sums"]

_SOURCE_NAME = "sparse.cu"
_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_THREADS = 256
#: entries a thread adds in order before the row's chunks are added (KKM_CSR_CHUNK in sparse.cu)
CHUNK = 64
#: grid-stride launches: at most this many blocks (2^19 threads of 256 fill an H100 many times over)
_MAX_BLOCKS = 65535 * 8


def name_expressions() -> list[str]:
    """The template instantiations of ``sparse.cu`` that CuPy compiles (and ``.ci/nvrtc_check.py`` checks)."""
    return [f"csr_chunk_sums<{t}>" for t in _TYPES.values()] + ["csr_chunk_combine"]


@functools.lru_cache(maxsize=None)
def _module(device_id: int):
    cp = import_cupy()
    with cp.cuda.Device(device_id):
        return cp.RawModule(code=cuda_source(_SOURCE_NAME), options=NVRTC_OPTIONS, name_expressions=name_expressions())


def _grid(total: int) -> tuple[int]:
    return (max(1, min(_MAX_BLOCKS, -(-total // _THREADS))),)


class CsrProduct:
    """X -> float64 A @ X on the GPU in a fixed order (module docstring), A's chunk table made once: what an
    eigensolver's operator calls hundreds of times. A is a ``cupyx.scipy.sparse`` matrix (n, m) (any format;
    converted to CSR, int32 indices as CuPy keeps them), X a device array (m,) or (m, c); (n,) or (n, c) back."""

    def __init__(self, A):
        cp = import_cupy()
        if not import_cupyx("scipy.sparse").issparse(A):
            raise TypeError(f"csr_product needs a cupyx.scipy.sparse matrix, got {type(A).__name__}")
        A = A.tocsr()
        self.shape = A.shape
        self.nnz = int(A.nnz)
        data = A.data
        self.data = cp.ascontiguousarray(data if np.dtype(data.dtype) in _TYPES else data.astype(cp.float64))
        self.indptr = cp.ascontiguousarray(A.indptr, dtype=cp.int32)
        self.indices = cp.ascontiguousarray(A.indices, dtype=cp.int32)
        n = A.shape[0]
        lengths = (self.indptr[1:] - self.indptr[:-1]).astype(cp.int64)
        self.chunk_ptr = cp.zeros(n + 1, dtype=cp.int64)
        cp.cumsum((lengths + (CHUNK - 1)) // CHUNK, out=self.chunk_ptr[1:])
        # at most one chunk per row is not full: no count comes back to size the partial sums
        self.max_chunks = self.nnz // CHUNK + n
        # each chunk's row, for every slot up to the bound (those past the count are never read)
        self.chunk_row = cp.searchsorted(self.chunk_ptr, cp.arange(self.max_chunks, dtype=cp.int64), side="right")
        self.chunk_row -= 1

    def __call__(self, X):
        cp = import_cupy()
        if X.ndim not in (1, 2) or X.shape[0] != self.shape[1]:
            raise ValueError(f"cannot multiply a sparse matrix of shape {self.shape} by an array of shape "
                             f"{X.shape}")
        vector = X.ndim == 1
        X2 = cp.ascontiguousarray(X.reshape(X.shape[0], -1), dtype=cp.float64)
        n, cols = self.shape[0], X2.shape[1]
        out = cp.zeros((n, cols), dtype=cp.float64)
        if n and cols and self.nnz:
            partial = cp.empty((self.max_chunks, cols), dtype=cp.float64)
            module = _module(cp.cuda.runtime.getDevice())
            sums = module.get_function(f"csr_chunk_sums<{_TYPES[np.dtype(self.data.dtype)]}>")
            sums(_grid(self.max_chunks * cols), (_THREADS,),
                 (self.indptr, self.indices, self.data, X2, self.chunk_ptr, self.chunk_row, np.int64(n), np.int64(cols),
                  np.int64(self.max_chunks), partial))
            module.get_function("csr_chunk_combine")(_grid(n * cols), (_THREADS,),
                                                     (partial, self.chunk_ptr, np.int64(n), np.int64(cols), out))
        return out[:, 0] if vector else out


def csr_product(A, X):
    """float64 A @ X on the GPU, in a fixed order (module docstring): A a ``cupyx.scipy.sparse`` matrix (n, m),
    X a device array (m,) or (m, c). Returns (n,) or (n, c)."""
    return CsrProduct(A)(X)


def operator(A, backend):
    """A as the eigensolvers' operand: on a GPU a ``cupyx.scipy.sparse.linalg.LinearOperator`` whose products are
    :class:`CsrProduct`'s (CuPy's eigsh and lobpcg would otherwise multiply by cuSPARSE, whose long rows add in a
    run-dependent order), on the CPU A itself."""
    if not backend.is_gpu:
        return A
    multiply = CsrProduct(A)
    return import_cupyx("scipy.sparse.linalg").LinearOperator(A.shape, matvec=multiply, matmat=multiply,
                                                              dtype=np.float64)


def product(A, X, backend):
    """A @ X for a sparse A of the backend's kind and a dense X (vector or matrix), in a fixed order of summation
    on both devices: SciPy on the CPU, :func:`csr_product` (float64) on a GPU. A dense array back, 1-D for a
    1-D X."""
    if backend.is_gpu:
        return csr_product(A, X)
    return np.asarray(A @ X)


def row_sums(A, backend):
    """A 1 (float64, 1-D) in a fixed order on both devices (CuPy's ``A.sum(axis=1)`` is a cuSPARSE product)."""
    xp = backend.xp
    if not backend.is_gpu:
        return np.asarray(A.sum(axis=1)).ravel().astype(np.float64)
    return csr_product(A, xp.ones(A.shape[1], dtype=xp.float64))
