"""CPU twin of the nearest-neighbour search behind the affinity graphs (numba): imported only when the CPU path
runs. The GPU twin, with the same functions and signatures, is :mod:`kkmgpu.kernels.knn_cuda`
(``kernels_cuda/knn.cu``).

The squared distances are in GEMM form, ||a_i||^2 + ||a_j||^2 - 2 a_i . a_j, and the search visits only the
blocks on and above the diagonal of the n x n distance matrix: one GEMM A[I] A[J]^T serves the rows of I (its rows)
and the rows of J (its columns), so the search costs half the flops of a row-tile pass, and nothing larger than
one block x block product is ever held. Each row keeps its ``n_neighbors`` best candidates in a small sorted list
that a candidate enters only when it beats the list's worst, one pass over each block. Candidates are ordered by
(key, index), so that of equal keys the lower index is kept, on both twins.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["BLOCK", "offer_block", "nearest_neighbors"]

#: rows of one block of the distance matrix (a 2048 x 2048 float32 product: 16 MiB)
BLOCK = 2048


@njit(parallel=True, cache=True)
def offer_block(G, col_sq, row0, col0, best, arg):
    """In place: rows row0 + r of the search (best, arg: (n, k) keys ascending and their indices, empty slots
    (+inf, -1)) take the candidates col0 + j of the block G (b, m) of inner products, with the keys
    col_sq[j] - 2 G[r, j] in float64 (their own ||a_i||^2 is the same for every candidate, so it is left out),
    ordered by (key, index); a point is never its own neighbour."""
    b, m = G.shape
    k = best.shape[1]
    for r in prange(b):
        i = row0 + r
        worst, worst_index = best[i, k - 1], arg[i, k - 1]
        for j in range(m):
            v = col_sq[j] - 2.0 * G[r, j]
            c = col0 + j
            if (v < worst or (v == worst and c < worst_index)) and c != i:
                p = k - 1
                while p > 0 and (v < best[i, p - 1] or (v == best[i, p - 1] and c < arg[i, p - 1])):
                    best[i, p] = best[i, p - 1]
                    arg[i, p] = arg[i, p - 1]
                    p -= 1
                best[i, p] = v
                arg[i, p] = c
                worst, worst_index = best[i, k - 1], arg[i, k - 1]


def nearest_neighbors(A, n_neighbors: int, block: int = BLOCK):
    """int64 array (n, n_neighbors): the indices of the ``n_neighbors`` nearest other rows of A (n, d) for every
    row, by GEMM-form squared distances in A's precision; not sorted by distance. ``block`` rows per block
    (tests shrink it to reach the edges)."""
    n = A.shape[0]
    sq = np.einsum("ij,ij->i", A, A, dtype=np.float64)
    best = np.full((n, n_neighbors), np.inf)
    arg = np.full((n, n_neighbors), -1, dtype=np.int64)
    for i0 in range(0, n, block):
        i1 = min(n, i0 + block)
        for j0 in range(i0, n, block):
            j1 = min(n, j0 + block)
            G = A[i0:i1] @ A[j0:j1].T
            offer_block(G, sq[j0:j1], i0, j0, best, arg)
            if j0 != i0:
                offer_block(np.ascontiguousarray(G.T), sq[i0:i1], j0, i0, best, arg)
    return arg
