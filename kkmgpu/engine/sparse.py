"""Sparse kernel matrices: CSR on either backend and the sparse operator of the Lloyd driver.

Kernel k-means needs only the cluster sums S[i, c] = sum_{j in c} w_j K[i, j] (papers' Eq. 3-4). For a
sparse K (the trimmed K* of kernel-matrix-trimming.txt, Section 3, or any sparse precomputed kernel)
they cost O(nnz) instead of O(n^2):

* CPU (numba, :mod:`kkmgpu.kernels.csr_cpu`, imported only when the CPU path runs): one pass over the CSR rows,
  S[i, labels[j]] += w_j K[i, j], rows in parallel; after an assignment step only the rows of the points
  that moved are read (K is symmetric, so row p is column p): S[:, new_p] += w_p K[:, p],
  S[:, old_p] -= w_p K[:, p].
* GPU (library calls, no custom kernel): the sparse-dense products S = K @ Y with Y the weighted one-hot
  indicator (n x k) and S += K[moved].T @ dY, by cuSPARSE through ``cupyx.scipy.sparse``. The same code
  runs on the CPU with ``scipy.sparse`` (``library_cluster_sums``), which is how the tests hold the two
  routes to each other on a machine without a GPU.

CSR is ``scipy.sparse.csr_matrix`` on the CPU and ``cupyx.scipy.sparse.csr_matrix`` on a GPU; cupyx is
reached only through :func:`kkmgpu.backend.device.import_cupyx`.
"""

from __future__ import annotations

import sys

import numpy as np

from kkmgpu.backend.device import Backend, check_fits, import_cupyx

__all__ = ["SparseKernelOperator", "is_sparse", "sparse_module", "to_backend_csr", "library_cluster_sums",
           "library_update_cluster_sums"]


def is_sparse(X) -> bool:
    """True for a scipy.sparse or cupyx.scipy.sparse matrix / array (without importing CuPy)."""
    scipy_sparse = sys.modules.get("scipy.sparse")
    if scipy_sparse is not None and scipy_sparse.issparse(X):
        return True
    cupyx_sparse = sys.modules.get("cupyx.scipy.sparse")
    return cupyx_sparse is not None and bool(cupyx_sparse.issparse(X))


def sparse_module(backend: Backend):
    """``scipy.sparse`` on the CPU, ``cupyx.scipy.sparse`` on a GPU."""
    if not backend.is_gpu:
        import scipy.sparse

        return scipy.sparse
    return import_cupyx("scipy.sparse")


def to_backend_csr(A, backend: Backend, dtype=None):
    """A sparse matrix (CSR/CSC/COO, scipy or cupyx) as canonical CSR on ``backend``.

    Canonical: sorted column indices, no duplicate entries (summed), explicit zeros removed.
    """
    sp = sparse_module(backend)
    on_gpu = sys.modules.get("cupyx.scipy.sparse") is not None and sys.modules["cupyx.scipy.sparse"].issparse(A)
    if backend.is_gpu:
        if on_gpu:
            A = A.tocsr()
        else:
            # cupyx holds only bool/float32/float64/complex values and raises on an integer scipy matrix, so
            # the requested dtype is applied on the host, before the transfer.
            A = A.tocsr()
            A = A.astype(dtype) if dtype is not None and A.dtype != dtype else A.copy()
            # canonical on the host: cuSPARSE's zero elimination takes workspace outside CuPy's pool, which
            # fails as a kernel launch error (not an out-of-memory one) when the device is nearly full
            A.sum_duplicates()
            A.eliminate_zeros()
            A.sort_indices()
            check_fits(csr_bytes(A), backend, f"the {A.shape[0]} x {A.shape[1]} sparse matrix ({A.nnz} stored "
                       "entries) on the device")
            return sp.csr_matrix(A)  # the transfer is the copy
    else:
        A = A.get().tocsr() if on_gpu else A.tocsr()
        A = sp.csr_matrix(A)  # a sparse *array* becomes a matrix, so A @ dense and A[rows] behave alike
    if dtype is not None and A.dtype != dtype:
        if backend.is_gpu:
            check_fits(csr_bytes(A, dtype), backend, f"the {np.dtype(dtype).name} copy of the sparse matrix")
        A = A.astype(dtype)
    else:
        if backend.is_gpu:
            check_fits(csr_bytes(A), backend, "the copy of the sparse matrix")
        A = A.copy()
    A.sum_duplicates()
    A.eliminate_zeros()
    A.sort_indices()
    return A


def csr_bytes(A, dtype=None) -> int:
    """Bytes of the CSR arrays of ``A`` (values in ``dtype``, default A's; int32 indices as on a GPU)."""
    itemsize = np.dtype(A.dtype if dtype is None else dtype).itemsize
    return int(A.nnz) * (itemsize + 4) + 4 * (A.shape[0] + 1)


# ------------------------------------------------------------------------------------ library (GPU) twin


def _indicator(labels, weights, k, xp):
    Y = xp.zeros((labels.shape[0], int(k)), dtype=xp.float64)
    Y[xp.arange(labels.shape[0]), labels] = weights
    return Y


def library_cluster_sums(K, labels, weights, k, xp):
    """S = K @ Y (Y[j, labels[j]] = weights[j]) as one sparse-dense product; K float64 CSR (scipy or cupyx)."""
    return xp.ascontiguousarray(xp.asarray(K @ _indicator(labels, weights, k, xp)))


def library_update_cluster_sums(K, S, old_labels, new_labels, weights, xp):
    """S += K[moved].T @ dY in place, dY[p] = +w_p at the new cluster and -w_p at the old one (K symmetric)."""
    moved = xp.flatnonzero(old_labels != new_labels)
    if moved.shape[0] == 0:
        return S
    m = moved.shape[0]
    dY = xp.zeros((m, S.shape[1]), dtype=xp.float64)
    rows = xp.arange(m)
    w = weights[moved]
    dY[rows, new_labels[moved]] += w
    dY[rows, old_labels[moved]] -= w
    S += xp.asarray(K[moved].T @ dY)
    return S


# ------------------------------------------------------------------------------------------- operator


class SparseKernelOperator:
    """Cluster sums from a sparse symmetric kernel matrix in CSR (the Lloyd driver's operator interface).

    Same interface as :class:`kkmgpu.engine.dense.DenseKernelOperator`: ``n``, ``weights``, ``backend``, ``diag``,
    ``total_diag``, ``rows(index)``, ``cluster_sums(labels, k)``, ``incremental_cost(n_moved)`` and
    ``update_cluster_sums(S, old, new)``. A full pass costs O(nnz) on the CPU (numba) and one cuSPARSE
    product on a GPU (which needs float64 values: a float32 K is copied to float64 once, 1.5x its CSR
    bytes, so the sums accumulate in float64 as the dense operator's do).

    Parameters
    ----------
    K : CSR matrix of shape (n, n)
        Canonical CSR on ``backend`` (see :func:`to_backend_csr`), symmetric.
    weights : array of shape (n,)
        Sample weights on the device, float64.
    backend : Backend
    """

    def __init__(self, K, weights, backend: Backend):
        self.backend = backend
        self.K = K
        self.n = K.shape[0]
        self.nnz = int(K.nnz)
        self.weights = weights
        xp = backend.xp
        self.diag = xp.asarray(K.diagonal()).astype(xp.float64)
        self.total_diag = float((weights * self.diag).sum())  # sum_i w_i K*_ii, the same every iteration
        if backend.is_gpu and K.dtype != np.float64:
            check_fits(csr_bytes(K, np.float64), backend, "the float64 copy of the sparse kernel matrix (cuSPARSE "
                       "products accumulate in its dtype)")
            self._K64 = K.astype(np.float64)
        else:
            self._K64 = K

    def rows(self, index):
        """K[index, :] as a dense float64 host array."""
        return self.backend.to_host(self.device_rows(self.backend.asarray(np.asarray(index, dtype=np.int64))))

    def device_rows(self, index):
        """K[index, :] as a dense float64 array on the device, for device indices (k-means++ seeding)."""
        return self.K[index].toarray().astype(self.backend.xp.float64)

    def cluster_sums(self, labels, k):
        if self.backend.is_gpu:
            return library_cluster_sums(self._K64, labels, self.weights, k, self.backend.xp)
        from kkmgpu.kernels.csr_cpu import csr_cluster_sums

        return csr_cluster_sums(self.K, labels, self.weights, k)

    def incremental_cost(self, n_moved):
        """Work of the incremental update relative to a full pass: the moved rows, read serially."""
        return 2.0 * n_moved / max(1, self.n)

    def update_cluster_sums(self, S, old_labels, new_labels):
        if self.backend.is_gpu:
            return library_update_cluster_sums(self._K64, S, old_labels, new_labels, self.weights,
                                               self.backend.xp)
        from kkmgpu.kernels.csr_cpu import csr_update_cluster_sums

        return csr_update_cluster_sums(self.K, S, old_labels, new_labels, self.weights)


def check_symmetric_sparse(K, backend: Backend, rtol=None, name="X"):
    """Raise ValueError unless the sparse K equals K.T within a tolerance for its dtype (O(nnz)); returns max |K|."""
    if rtol is None:
        rtol = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 1e-5}.get(np.dtype(K.dtype), 1e-10)
    if K.nnz == 0:
        return 0.0
    if backend.is_gpu:  # K.T in CSR and K - K.T (up to twice K's entries) beside K
        check_fits(3 * csr_bytes(K), backend, f"the symmetry check of the sparse {name} (its transpose and the "
                   "difference)")
    max_abs = max(float(K.data.max()), -float(K.data.min()))  # max |K| without a copy of the values
    scale = max_abs or 1.0
    D = (K - K.T.tocsr()).tocsr()
    diff = max(float(D.data.max()), -float(D.data.min())) if D.nnz else 0.0
    if diff > rtol * scale:
        raise ValueError(f"{name} is not a symmetric kernel matrix (max |K - K.T| = {diff:.3g} > "
                         f"{rtol:g} * max|K|); kernel k-means needs a symmetric kernel.")
    return max_abs


def all_finite_sparse(K, backend: Backend) -> bool:
    """True if every stored value of the sparse K is finite."""
    return bool(backend.xp.isfinite(K.data).all())


def rows_above_threshold(K, thresholds, backend: Backend, batch, value_dtype, kept_estimate):
    """CSR of a dense K's row i keeping K[i, j] >= thresholds[i], zeros dropped (K_hat of the trimming),
    built in row batches of ``batch``: the pieces, then one concatenation (twice the result at the peak)."""
    xp = backend.xp
    n = K.shape[0]
    check_fits(2 * kept_estimate * (np.dtype(value_dtype).itemsize + 4) + 16 * (n + 1), backend,
               f"the kept values of the {n} x {n} matrix (about {kept_estimate} entries)")
    counts, indices, data = [], [], []
    for i0 in range(0, n, batch):
        i1 = min(n, i0 + batch)
        block = K[i0:i1]
        keep = (block >= thresholds[i0:i1, None].astype(block.dtype)) & (block != 0)
        counts.append(keep.sum(axis=1, dtype=xp.int64))
        indices.append(xp.nonzero(keep)[1].astype(xp.int32))
        data.append(block[keep].astype(value_dtype))
    indptr = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(xp.concatenate(counts))])
    index_dtype = xp.int32 if int(indptr[-1]) < 2**31 else xp.int64
    return sparse_module(backend).csr_matrix(
        (xp.concatenate(data), xp.concatenate(indices).astype(index_dtype, copy=False), indptr.astype(index_dtype)),
        shape=(n, n))


def symmetrise(A, backend: Backend, how: str = "maximum", what: str = "the symmetrised matrix"):
    """max(A, A^T) or min(A, A^T) of a square CSR matrix, in CSR with sorted indices and no explicit zeros.

    Holds A, its transpose and a result of up to twice their entries at once; checked against the free memory
    first (``what`` names the matrix in the error). A negative entry stored in one direction only loses the
    maximum to the other direction's zero, and is dropped.
    """
    entry = A.dtype.itemsize + A.indices.dtype.itemsize
    check_fits(3 * A.nnz * entry + 8 * (A.shape[0] + 1), backend,
               f"{what} ({A.nnz} entries, their transpose and the {how})")
    AT = A.T.tocsr()
    out = (A.maximum(AT) if how == "maximum" else A.minimum(AT)).tocsr()
    del AT
    out.eliminate_zeros()
    out.sort_indices()
    return out
