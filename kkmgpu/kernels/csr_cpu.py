"""CPU twin of the sparse cluster sums (numba): imported only when the CPU path runs, so ``import kkmgpu``
does not pay for numba. The GPU twin is the fixed-order product route in :mod:`kkmgpu.engine.sparse`
(``library_*``, :mod:`kkmgpu.kernels.sparse_cuda`).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["csr_cluster_sums", "csr_update_cluster_sums"]


@njit(parallel=True, cache=True)
def _csr_cluster_sums(indptr, indices, data, labels, weights, S):
    n = indptr.shape[0] - 1
    k = S.shape[1]
    for i in prange(n):
        acc = np.zeros(k)  # a private accumulator: 1.3x faster than adding into S[i] (measured, n = 20k)
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            acc[labels[j]] += weights[j] * data[p]
        for c in range(k):
            S[i, c] = acc[c]


def csr_cluster_sums(K, labels, weights, k):
    """S[i, c] = sum_{j in c} weights[j] K[i, j] for a scipy CSR K, float64 (n, k), O(nnz) (numba)."""
    S = np.empty((K.shape[0], int(k)), dtype=np.float64)
    _csr_cluster_sums(K.indptr, K.indices, K.data, np.asarray(labels, dtype=np.int32),
                      np.asarray(weights, dtype=np.float64), S)
    return S


@njit(cache=True)
def _csr_move_update(indptr, indices, data, moved, old_labels, new_labels, weights, S):
    # K symmetric: column p = row p, so S[:, c] += w_p K[:, p] reads row p only. Serial: the scatter
    # into S[j, .] from different moved points would race.
    for t in range(moved.shape[0]):
        p = moved[t]
        a = old_labels[p]
        b = new_labels[p]
        w = weights[p]
        for q in range(indptr[p], indptr[p + 1]):
            j = indices[q]
            v = w * data[q]
            S[j, b] += v
            S[j, a] -= v


def csr_update_cluster_sums(K, S, old_labels, new_labels, weights):
    """S for ``new_labels`` from S for ``old_labels``, in place (scipy CSR K, symmetric), O(nnz of moved rows)."""
    old_labels = np.asarray(old_labels, dtype=np.int32)
    new_labels = np.asarray(new_labels, dtype=np.int32)
    moved = np.flatnonzero(old_labels != new_labels).astype(np.int64)
    _csr_move_update(K.indptr, K.indices, K.data, moved, old_labels, new_labels,
                     np.asarray(weights, dtype=np.float64), S)
    return S
