"""CPU twins of the fused operations (numba), same names and semantics as :mod:`kkmgpu.kernels.kernel_kmeans_cuda`.

Imported only when the CPU backend runs, so ``import kkmgpu`` does not pay for numba.

Operations
----------
kernel_epilogue(block, row_sq, col_sq, kind, gamma, coef0, degree)
    In place: turn a block of inner products G[i, j] = <x_i, y_j> into kernel values.
segment_sums(K, rows, clusters, coeffs, S)
    In place S[i, clusters[p]] += coeffs[p] K[rows[p], i] for a symmetric K, entries sorted by
    cluster: the full cluster sums S[i, c] = sum_{j in c} w_j K[i, j] (papers' Eq. 3-4) and their
    incremental update for the points that moved.
moved_sums(K, rows, coeffs, src, dst, S)
    In place S[i, dst[p]] += coeffs[p] K[rows[p], i], S[i, src[p]] -= the same: the incremental update after
    points moved from cluster src to dst, reading each moved row of K once.
block_cluster_sums(B, labels, weights, k)
    The same for a rectangular block B (m, n_train) between new and training points.
assign_labels(S, diag, sizes, within, labels)
    Fused distance + argmin + "did it move": new labels, distance to the chosen centre,
    number of points that changed cluster.
cluster_totals(labels, weights, own, k)
    Weighted cluster sizes and within-cluster totals, on the host.
offgrid_step(K, Kp, divide)
    In place Kp <- sqrt(Kp); K <- K / Kp or K * Kp (Off-the-grid, Algorithm 2).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from kkmgpu.kernels.epilogue_codes import EPILOGUE_CODES

__all__ = ["kernel_epilogue", "segment_sums", "moved_sums", "block_cluster_sums", "assign_labels", "cluster_totals",
           "offgrid_step"]

_RBF = EPILOGUE_CODES["rbf"]
_POLY = EPILOGUE_CODES["polynomial"]
_SIGMOID = EPILOGUE_CODES["sigmoid"]
_LAPLACIAN = EPILOGUE_CODES["laplacian"]
_LINEAR = EPILOGUE_CODES["linear"]


@njit(parallel=True, cache=True)
def _epilogue(G, row_sq, col_sq, kind, gamma, coef0, degree):
    # arithmetic in G's precision, as kernel_kmeans.cu's kkm_kernel_value: the norms, gamma and coef0 come in
    # G's type, and 2 g is g + g (exact either way)
    m, n = G.shape
    zero = G.dtype.type(0)
    one = G.dtype.type(1)
    for i in prange(m):
        a = row_sq[i]
        for j in range(n):
            g = G[i, j]
            if kind == _RBF or kind == _LAPLACIAN:
                d = a + col_sq[j] - (g + g)  # squared Euclidean distance from the GEMM
                if d < zero:
                    d = zero
                if kind == _RBF:
                    G[i, j] = math.exp(-gamma * d)
                else:
                    G[i, j] = math.exp(-gamma * math.sqrt(d))
            elif kind == _POLY:
                base = gamma * g + coef0
                v = one
                for _ in range(degree):
                    v *= base
                G[i, j] = v
            elif kind == _SIGMOID:
                G[i, j] = math.tanh(gamma * g + coef0)


def kernel_epilogue(block, row_sq, col_sq, kind, gamma, coef0, degree):
    """In place: kernel values from inner products ``block`` (m, n) and squared row norms.

    ``row_sq`` (m,) and ``col_sq`` (n,) are used by the distance kernels (rbf, laplacian) only. The arithmetic
    runs in the block's precision (float32 math for a float32 block), as on the GPU.
    """
    if kind == _LINEAR:
        return block
    ty = block.dtype.type
    _epilogue(block, np.asarray(row_sq, dtype=block.dtype), np.asarray(col_sq, dtype=block.dtype), int(kind),
              ty(gamma), ty(coef0), int(degree))
    return block


def _decode(x, table):  # pragma: no cover - compiled through the overload below
    """A stored kernel value as a number: float16 is kept as its uint16 bits and looked up in ``table``."""
    raise NotImplementedError


@overload(_decode, inline="always")
def _decode_overload(x, table):
    if isinstance(x, types.Integer):
        return lambda x, table: table[x]
    return lambda x, table: x


#: float16 bit pattern -> float32 value, for the 65,536 patterns (numba has no float16 type).
_HALF_TABLE = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


def _storage_view(K):
    """(array numba can read, decode table): float16 K is passed as uint16 bits plus the lookup table."""
    if K.dtype == np.float16:
        return K.view(np.uint16), _HALF_TABLE
    return K, np.empty(0, dtype=K.dtype)


@njit(inline="always")
def _run_sum(K, table, rows, coeffs, p, end, c0, c1, acc, part):
    # acc[t] = sum over the entries p .. end - 1 of coeffs[q] * K[rows[q], c0 + t]: partial sums in K's precision
    # (float32 for float16 storage; full SIMD width) over blocks of 128 rows, four rows at a time, then added into
    # float64, which keeps float64-level accuracy and reads each row's strip once.
    m = c1 - c0
    acc[:] = 0.0
    while p < end:
        stop = min(end, p + 128)
        part[:] = 0.0
        while p + 4 <= stop:
            w0 = coeffs[p]
            w1 = coeffs[p + 1]
            w2 = coeffs[p + 2]
            w3 = coeffs[p + 3]
            r0 = K[rows[p], c0:c1]
            r1 = K[rows[p + 1], c0:c1]
            r2 = K[rows[p + 2], c0:c1]
            r3 = K[rows[p + 3], c0:c1]
            for t in range(m):
                part[t] += ((w0 * _decode(r0[t], table) + w1 * _decode(r1[t], table))
                            + (w2 * _decode(r2[t], table) + w3 * _decode(r3[t], table)))
            p += 4
        while p < stop:
            w0 = coeffs[p]
            r0 = K[rows[p], c0:c1]
            for t in range(m):
                part[t] += w0 * _decode(r0[t], table)
            p += 1
        for t in range(m):
            acc[t] += part[t]


@njit(parallel=True, cache=True)
def _segment_sums(K, table, rows, seg_starts, seg_clusters, coeffs, width, S):
    # K is symmetric, so S[i, c] += coeff * K[row, i] reads a contiguous run of the row. Each thread
    # owns a strip of columns; for each segment (entries of one cluster) it streams the strip of
    # the segment's rows four at a time (_run_sum), so K is read once per entry (papers' Eq. 3-4).
    n = K.shape[0]
    nstrips = (n + width - 1) // width
    nseg = seg_clusters.shape[0]
    for s in prange(nstrips):
        c0 = s * width
        c1 = min(n, c0 + width)
        m = c1 - c0
        acc = np.empty(m, dtype=np.float64)
        part = np.empty(m, dtype=table.dtype)
        for g in range(nseg):
            c = seg_clusters[g]
            _run_sum(K, table, rows, coeffs, seg_starts[g], seg_starts[g + 1], c0, c1, acc, part)
            for t in range(m):
                S[c0 + t, c] += acc[t]


def _strip_width(n: int) -> int:
    """Columns per thread's strip of K in the cluster-sum passes: 1024 (4 KiB runs of a float32 row), narrower
    for small n so that every thread gets a strip."""
    return int(min(1024, max(64, 16 * -(-n // (16 * numba.get_num_threads())))))


def segment_sums(K, rows, clusters, coeffs, S):
    """In place: S[i, clusters[p]] += coeffs[p] * K[rows[p], i] for a symmetric K (n, n).

    Entries are sorted by cluster. With ``rows`` the points in label order and ``coeffs`` their
    weights (and S zero) this is the full cluster-sum pass; with +w / -w entries for the points that
    moved it is the incremental update S += K[:, moved] dY.

    Parameters
    ----------
    K : float16, float32 or float64 array of shape (n, n), C-contiguous, symmetric
    rows : int64 array of shape (n_entries,)
    clusters : int32 array of shape (n_entries,), non-decreasing
    coeffs : float64 array of shape (n_entries,)
    S : float64 array of shape (n, k), C-contiguous; updated in place
    """
    n_entries = rows.shape[0]
    if n_entries == 0 or K.shape[0] == 0:
        return S
    bounds = np.flatnonzero(np.diff(clusters)) + 1
    seg_starts = np.concatenate(([0], bounds, [n_entries])).astype(np.int64)
    seg_clusters = np.ascontiguousarray(clusters[seg_starts[:-1]], dtype=np.int64)
    width = _strip_width(K.shape[0])
    values, table = _storage_view(K)
    _segment_sums(values, table, np.ascontiguousarray(rows, dtype=np.int64), seg_starts, seg_clusters,
                  np.asarray(coeffs, dtype=table.dtype), width, S)
    return S


@njit(parallel=True, cache=True)
def _moved_sums(K, table, rows, run_starts, src, dst, coeffs, width, S):
    # The CUDA kernel's order: each strip of columns walks the runs of one (src, dst) pair in order and adds a
    # run's sum into both clusters; each row of K is read once. Partial sums in K's precision over blocks of 128
    # rows, then float64, as _segment_sums does (so a point moved back cancels its own entry exactly).
    n = K.shape[0]
    nstrips = (n + width - 1) // width
    for s in prange(nstrips):
        c0 = s * width
        c1 = min(n, c0 + width)
        m = c1 - c0
        acc = np.empty(m, dtype=np.float64)
        part = np.empty(m, dtype=table.dtype)
        for r in range(run_starts.shape[0] - 1):
            _run_sum(K, table, rows, coeffs, run_starts[r], run_starts[r + 1], c0, c1, acc, part)
            a = src[run_starts[r]]
            b = dst[run_starts[r]]
            for t in range(m):
                S[c0 + t, b] += acc[t]
                S[c0 + t, a] -= acc[t]


def moved_sums(K, rows, coeffs, src, dst, S):
    """In place: S[i, dst[p]] += coeffs[p] * K[rows[p], i] and S[i, src[p]] -= coeffs[p] * K[rows[p], i] for a
    symmetric K (n, n): the incremental update S += K[:, moved] dY after the points ``rows`` moved from cluster
    ``src`` to ``dst`` (coeffs: their weights), each moved row of K read once.

    Parameters
    ----------
    K : float16, float32 or float64 array of shape (n, n), C-contiguous, symmetric
    rows : int64 array of shape (m,)
    coeffs : float64 array of shape (m,)
    src, dst : int32 arrays of shape (m,), the entries sorted by the pair (src, dst)
    S : float64 array of shape (n, k), C-contiguous; updated in place
    """
    m = rows.shape[0]
    if m == 0 or K.shape[0] == 0:
        return S
    src = np.ascontiguousarray(src, dtype=np.int32)
    dst = np.ascontiguousarray(dst, dtype=np.int32)
    bounds = np.flatnonzero((np.diff(src) != 0) | (np.diff(dst) != 0)) + 1
    run_starts = np.concatenate(([0], bounds, [m])).astype(np.int64)
    width = _strip_width(K.shape[0])
    values, table = _storage_view(K)
    _moved_sums(values, table, np.ascontiguousarray(rows, dtype=np.int64), run_starts, src, dst,
                np.asarray(coeffs, dtype=table.dtype), width, S)
    return S


@njit(parallel=True, cache=True)
def _offgrid_step(K, Kp, divide):
    n = K.shape[0]
    for i in prange(n):
        for j in range(K.shape[1]):
            r = np.sqrt(Kp[i, j])
            Kp[i, j] = r
            if divide:
                K[i, j] = K[i, j] / r
            else:
                K[i, j] = K[i, j] * r


def offgrid_step(K, Kp, divide):
    """In place, one pass over both matrices: Kp <- sqrt(Kp); K <- K / Kp if divide else K * Kp.

    The element-wise step of the Off-the-grid bandwidth search (off-the-grid-bandwidth-search.txt,
    Algorithm 2, lines 5-9). K and Kp: arrays of the same shape and dtype (2-D, C-contiguous).
    """
    if K.ndim != 2 or K.shape != Kp.shape or K.dtype != Kp.dtype:
        raise ValueError(f"K {K.shape} {K.dtype} and Kp {Kp.shape} {Kp.dtype} must be 2-D and match "
                         "in shape and dtype.")
    _offgrid_step(K, Kp, bool(divide))
    return K, Kp


@njit(parallel=True, cache=True)
def _block_cluster_sums(B, labels, weights, k, out):
    m, n = B.shape
    for i in prange(m):
        for c in range(k):
            out[i, c] = 0.0
        for j in range(n):
            out[i, labels[j]] += weights[j] * B[i, j]


def block_cluster_sums(B, labels, weights, k):
    """S[i, c] = sum_{j in cluster c} weights[j] * B[i, j] for a rectangular block; float64 (m, k)."""
    out = np.empty((B.shape[0], k), dtype=np.float64)
    _block_cluster_sums(B, labels, weights, int(k), out)
    return out


@njit(parallel=True, cache=True)
def _assign(S, diag, inv_size, offset, labels, new_labels, min_dist):
    # dist(i, c) = K_ii - 2 S[i, c] / n_c + C_c / n_c^2  (papers' Eq. 4); offset[c] = C_c / n_c^2,
    # inv_size[c] = 1 / n_c, or a negative value marking an empty cluster.
    n, k = S.shape
    changed = 0
    for i in prange(n):
        best = -1
        best_d = np.inf
        for c in range(k):
            if inv_size[c] < 0.0:
                continue
            d = diag[i] - 2.0 * S[i, c] * inv_size[c] + offset[c]
            if d < best_d:
                best_d = d
                best = c
        if best < 0:  # every cluster empty cannot happen for n >= 1, kept for safety
            best = labels[i]
        new_labels[i] = best
        min_dist[i] = best_d
        if best != labels[i]:
            changed += 1
    return changed


def cluster_totals(labels, weights, own, k, sync=True):
    """Weighted sizes n_c = sum_{i in c} w_i and totals C_c = sum_{i in c} w_i own_i, as host float64 (k,)
    (``sync=False``: the two stacked, (2, k), as the GPU twin returns them without a transfer)."""
    sizes = np.bincount(labels, weights=weights, minlength=k).astype(np.float64)
    within = np.bincount(labels, weights=weights * own, minlength=k).astype(np.float64)
    return (sizes, within) if sync else np.stack([sizes, within])


def assign_labels(S, diag, sizes, within, labels, counts=None, sync=True):
    """Fused distance + argmin + moved count.

    Parameters
    ----------
    S : float64 array of shape (n, k)
        Cluster sums.
    diag : array of shape (n,)
        K_ii.
    sizes, within : float64 arrays of shape (k,)
        Weighted sizes n_c and within-cluster totals C_c; clusters with n_c == 0 are skipped.
    labels : int32 array of shape (n,)
        Current labels.
    counts : int64 host array of shape (k,), optional
        Filled with the number of points per new label.
    sync : bool
        False: the third result is the array [n_changed, count of cluster 0, ..., count of cluster k-1]
        (int64), as the GPU twin returns it on the device without a transfer.

    Returns
    -------
    new_labels : int32 array of shape (n,)
    min_dist : float64 array of shape (n,)
    n_changed : int
    """
    sizes = np.asarray(sizes, dtype=np.float64)
    nonempty = sizes > 0
    inv = np.where(nonempty, 1.0 / np.where(nonempty, sizes, 1.0), -1.0)
    offset = np.where(nonempty, within * inv * inv, 0.0)
    new_labels = np.empty(S.shape[0], dtype=np.int32)
    min_dist = np.empty(S.shape[0], dtype=np.float64)
    changed = _assign(S, np.asarray(diag, dtype=np.float64), inv, offset, labels, new_labels, min_dist)
    if not sync:
        return new_labels, min_dist, np.r_[changed, np.bincount(new_labels, minlength=sizes.shape[0])].astype(np.int64)
    if counts is not None:
        counts[:] = np.bincount(new_labels, minlength=counts.shape[0])
    return new_labels, min_dist, int(changed)


