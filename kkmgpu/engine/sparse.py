"""Sparse kernel matrices: CSR on either backend and the sparse operator of the Lloyd driver.

Kernel k-means needs only the cluster sums S[i, c] = sum_{j in c} w_j K[i, j] (papers' Eq. 3-4). For a
sparse K (the trimmed K* of kernel-matrix-trimming.txt, Section 3, or any sparse precomputed kernel)
they cost O(nnz) instead of O(n^2):

* CPU (numba, :mod:`kkmgpu.kernels.csr_cpu`, imported only when the CPU path runs): one pass over the CSR rows,
  S[i, labels[j]] += w_j K[i, j], rows in parallel; after an assignment step only the rows of the points
  that moved are read (K is symmetric, so row p is column p): S[:, new_p] += w_p K[:, p],
  S[:, old_p] -= w_p K[:, p].
* GPU: the sparse-dense products S = K @ Y with Y the weighted one-hot indicator (n x k) and S += K[moved].T @ dY
  on ``cupyx.scipy.sparse`` matrices, the moved rows gathered on the device into a size known on the host
  (``gathered_rows``: the iteration's one transfer stays the Lloyd loop's). The products are
  :func:`kkmgpu.kernels.sparse_cuda.product` (``kernels_cuda/sparse.cu``: each row in fixed chunks, no atomics),
  not cuSPARSE's: cuSPARSE adds in an order that changes from run to run with a transposed operand (an H100 gave
  two updates of the same inputs 313 entries of 1,200 apart) and with long rows (rows of 1,000 entries, 2026-11-26),
  so K[moved].T is formed as a CSR matrix and multiplied in a fixed order. The same code runs on the CPU with
  ``scipy.sparse`` (``library_cluster_sums``), which is how the tests hold the two routes to each other on a
  machine without a GPU.

CSR is ``scipy.sparse.csr_matrix`` on the CPU and ``cupyx.scipy.sparse.csr_matrix`` on a GPU; cupyx is
reached only through :func:`kkmgpu.backend.device.import_cupyx`.
"""

from __future__ import annotations

import sys

import numpy as np

from kkmgpu.backend.device import Backend, check_fits, import_cupyx
from kkmgpu.backend.magnitude import largest_magnitude
from kkmgpu.kernels import sparse_cuda as _products

__all__ = ["SparseKernelOperator", "is_sparse", "sparse_module", "to_backend_csr", "library_cluster_sums",
           "library_update_cluster_sums", "gathered_rows", "longest_rows_entries"]


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


def library_cluster_sums(K, labels, weights, k, xp, product=None):
    """S = K @ Y (Y[j, labels[j]] = weights[j]) as one sparse-dense product; K CSR (scipy, or cupyx with the
    fixed-order product: ``product``, a :class:`kkmgpu.kernels.sparse_cuda.CsrProduct` of K made once per matrix, or
    one made for this call)."""
    Y = _indicator(labels, weights, k, xp)
    if xp is np:
        return np.ascontiguousarray(np.asarray(K @ Y))
    return xp.ascontiguousarray((product or _products.CsrProduct(K))(Y))


def longest_rows_entries(K, backend: Backend):
    """Host int64 (n + 1,): entry m is the stored entries of K's m longest rows together, the most that any m rows
    hold. Known on the host before the rows are chosen, it sizes a gather of m rows without a transfer (computed
    once per matrix: one n-long transfer)."""
    xp = backend.xp
    lengths = xp.sort((K.indptr[1:] - K.indptr[:-1]).astype(xp.int64))[::-1]
    return np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(backend.to_host(lengths), dtype=np.int64)])


def gathered_rows(K, index, slots, xp):
    """The rows ``index`` (device, distinct) of the CSR K as a canonical CSR matrix of ``slots`` stored entries, on
    the device without a transfer: ``slots`` (at least their entries, at most K's, e.g. from
    :func:`longest_rows_entries`) is known on the host, where K[index] would first count its entries there (CuPy
    syncs for the nnz). Row r < m is K[index[r]]; the slots past the gathered entries are zeros in
    slots // n + 1 trailing rows, each column at most once per row and in order (canonical, as K is)."""
    n, m = K.shape[1], index.shape[0]
    after = K.indptr[index + 1].astype(xp.int64)  # one past each row's last entry in K
    ends = xp.cumsum(after - K.indptr[index], dtype=xp.int64)  # ... and in the gathered rows
    shift = xp.empty(m + 1, dtype=xp.int64)  # slot + shift[row] = the slot's entry of K
    shift[:m] = after - ends
    shift[m] = -ends[m - 1]  # the padding's: slot - (gathered entries), below slots, so within K
    slot = xp.arange(slots, dtype=xp.int64)
    row = xp.searchsorted(ends, slot, side="right")  # m past the gathered entries
    source = slot + shift[row]
    real = row < m
    columns = xp.where(real, K.indices[source], source % n).astype(K.indices.dtype, copy=False)
    values = xp.where(real, K.data[source], 0).astype(K.data.dtype, copy=False)
    padding_rows = slots // n + 1
    bounds = xp.minimum(ends[m - 1] + xp.arange(n, n * padding_rows + 1, n, dtype=xp.int64), slots)
    indptr = xp.concatenate([xp.zeros(1, dtype=xp.int64), ends, bounds]).astype(K.indptr.dtype, copy=False)
    sp = sys.modules["scipy.sparse"] if xp is np else import_cupyx("scipy.sparse")
    rows = sp.csr_matrix((values, columns, indptr), shape=(m + padding_rows, n))
    rows.has_canonical_format = True  # K's rows are, and the padding rows hold each column once, in order
    return rows


def library_update_cluster_sums(K, S, old_labels, new_labels, weights, xp, n_moved=None, slots=None):
    """S += K[moved].T @ dY in place, dY[p] = +w_p at the new cluster and -w_p at the old one (K symmetric).

    ``n_moved`` (how many labels differ) and ``slots`` (at least the moved rows' stored entries, e.g.
    :func:`longest_rows_entries` at ``n_moved``), when given, spare the transfers that count them: the moved points
    and their rows are then gathered on the device (:func:`kkmgpu.engine.dense.moved_points`,
    :func:`gathered_rows`) and the product is one fixed-order product (``sparse_cuda.csr_product``) over ``slots``
    entries, with the gathered rows' transpose as a CSR matrix (the same inputs give the same bits on every run).
    """
    from kkmgpu.engine.dense import moved_points

    if n_moved is None:
        n_moved = int(xp.count_nonzero(old_labels != new_labels))
    if n_moved == 0:
        return S
    moved = moved_points(old_labels, new_labels, n_moved, xp)
    if slots is None:
        slots = int((K.indptr[moved + 1] - K.indptr[moved]).astype(xp.int64).sum())
    if slots == 0:
        return S
    rows = gathered_rows(K, moved, int(slots), xp)
    dY = xp.zeros((rows.shape[0], S.shape[1]), dtype=xp.float64)  # the padding rows' stay zero
    r = xp.arange(n_moved)
    w = weights[moved]
    dY[r, new_labels[moved]] = w  # a moved point's old and new clusters differ: two entries per row
    dY[r, old_labels[moved]] = -w
    moved_columns = rows.T.tocsr()  # K[moved].T as CSR (a transposition: each row's columns in order)
    moved_columns.has_canonical_format = True  # as ``rows`` is: no check (on a GPU, a transfer)
    S += xp.asarray(moved_columns @ dY if xp is np else _products.csr_product(moved_columns, dY))
    return S


# ------------------------------------------------------------------------------------------- operator


class SparseKernelOperator:
    """Cluster sums from a sparse symmetric kernel matrix in CSR (the Lloyd driver's operator interface).

    Same interface as :class:`kkmgpu.engine.dense.DenseKernelOperator`: ``n``, ``weights``, ``backend``, ``diag``,
    ``total_diag``, ``rows(index)``, ``cluster_sums(labels, k)``, ``incremental_cost(n_moved)`` and
    ``update_cluster_sums(S, old, new, n_moved)``. A full pass costs O(nnz) on the CPU (numba) and one
    fixed-order product on a GPU (:class:`kkmgpu.kernels.sparse_cuda.CsrProduct`, made once per matrix: it reads
    float32 or float64 values and sums in float64, as the dense operator does, so a float32 K needs no float64
    copy, which cuSPARSE's products did).

    Parameters
    ----------
    K : CSR matrix of shape (n, n)
        Canonical CSR on ``backend`` (see :func:`to_backend_csr`), symmetric.
    weights : array of shape (n,)
        Sample weights on the device, float64.
    backend : Backend
    """

    #: :func:`kkmgpu.engine.lloyd.lloyd` passes the number of moved points to :meth:`update_cluster_sums`.
    takes_moved_count = True

    def __init__(self, K, weights, backend: Backend):
        self.backend = backend
        self.K = K
        self.n = K.shape[0]
        self.nnz = int(K.nnz)
        self.weights = weights
        xp = backend.xp
        self.diag = xp.asarray(K.diagonal()).astype(xp.float64)
        self.total_diag = float((weights * self.diag).sum())  # sum_i w_i K*_ii, the same every iteration
        self._longest = None  # longest_rows_entries of K, on the first GPU update
        self._product = None  # the GPU's fixed-order K @ Y, made on the first full pass

    def rows(self, index):
        """K[index, :] as a dense float64 host array."""
        return self.backend.to_host(self.device_rows(self.backend.asarray(np.asarray(index, dtype=np.int64))))

    def device_rows(self, index):
        """K[index, :] as a dense float64 array on the device, for device indices (k-means++ seeding)."""
        return self.K[index].toarray().astype(self.backend.xp.float64)

    def cluster_sums(self, labels, k):
        if self.backend.is_gpu:
            if self._product is None:   # its chunk table, each chunk's row and one pass's partial sums
                chunks = self.nnz // _products.CHUNK + self.n
                check_fits(8 * (self.n + 1 + chunks * (1 + k)), self.backend,
                           "the fixed-order sparse product's chunk table and partial sums")
                self._product = _products.CsrProduct(self.K)
            return library_cluster_sums(self.K, labels, self.weights, k, self.backend.xp, product=self._product)
        from kkmgpu.kernels.csr_cpu import csr_cluster_sums

        return csr_cluster_sums(self.K, labels, self.weights, k)

    def incremental_cost(self, n_moved):
        """Work of the incremental update relative to a full pass: the moved rows, read serially."""
        return 2.0 * n_moved / max(1, self.n)

    def update_cluster_sums(self, S, old_labels, new_labels, n_moved=None):
        """S for ``new_labels`` from S for ``old_labels``, in place, from the moved points' rows of K.

        ``n_moved``: how many labels differ, if known (the Lloyd loop's transfer). On a GPU the moved rows are then
        gathered without a transfer, into as many slots as the ``n_moved`` longest rows of K hold
        (:func:`longest_rows_entries`, once per matrix), and multiplied in a fixed order; checked against the free
        memory.
        """
        if self.backend.is_gpu:
            xp = self.backend.xp
            if n_moved is None:  # counted here (a transfer), then gathered as when told: the same product, bits
                n_moved = int(xp.count_nonzero(old_labels != new_labels))
            if self._longest is None:
                self._longest = longest_rows_entries(self.K, self.backend)
            slots = int(self._longest[min(int(n_moved), self.n)])
            # the gather's int64 temporaries (slot, row, its clamp, source, the cumulative lengths' gathers), the
            # gathered values and columns, and their transpose's (and its n + 1 row pointers)
            check_fits(slots * (6 * 8 + 2 * (self.K.dtype.itemsize + 4)) + 4 * (self.n + 1), self.backend,
                       f"the gather of the {n_moved} moved rows of the sparse kernel matrix (up to {slots} "
                       "stored entries)")
            return library_update_cluster_sums(self.K, S, old_labels, new_labels, self.weights,
                                               self.backend.xp, n_moved=n_moved, slots=slots)
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
    max_abs = largest_magnitude(K.data)  # max |K| from the bits: no copy, no subnormal flushed by a GPU
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
