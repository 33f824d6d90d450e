"""CPU twin of the nearest-neighbour search behind the affinity graphs (numba): imported only when the CPU path
runs. The GPU twin, with the same functions and signatures, is :mod:`kkmgpu.kernels.knn_cuda`
(``kernels_cuda/knn.cu``).

The squared distances are in GEMM form, ||a_i||^2 + ||a_j||^2 - 2 a_i . a_j, and the search visits only the
blocks on and above the diagonal of the n x n distance matrix: one GEMM A[I] A[J]^T serves the rows of I (its rows)
and the rows of J (its columns, read in strips, so that G^T is never formed), so the search costs half the flops
of a row-tile pass, and nothing larger than one block x block product is ever held. Each row keeps its
``n_neighbors`` best candidates in a small sorted list that a candidate enters only when it beats the list's
worst, one pass over each block. Candidates are ordered by (key, index), so that of equal keys the lower index is
kept, on both twins.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from kkmgpu.kernels.blocks import upper_blocks

__all__ = ["BLOCK", "nearest_neighbors", "offer_block"]

#: rows of one block of the distance matrix (a 4096 x 4096 float32 product: 64 MiB). On MNIST-70k (2-core CPU)
#: 4096 took 35 s against 43 s for 2048 and 37-40 s for 6144 and 8192: larger GEMMs run nearer the BLAS peak
BLOCK = 4096
#: columns of G one thread walks down when its columns are the rows of the search
STRIP = 64


@njit(inline="always")
def _insert(best, arg, i, v, c):
    # (v, c) into row i's list, which it beats at its last place
    p = best.shape[1] - 1
    while p > 0 and (v < best[i, p - 1] or (v == best[i, p - 1] and c < arg[i, p - 1])):
        best[i, p] = best[i, p - 1]
        arg[i, p] = arg[i, p - 1]
        p -= 1
    best[i, p] = v
    arg[i, p] = c


# The screens: does a stretch of a row of G hold any key at or under its threshold? An OR over slices indexed
# from 0 (so that numba drops its negative-index checks and LLVM vectorises: 2.5x faster, measured); a stretch they
# pass is then walked exactly, in (key, index) order.
@njit(cache=True)
def _any_key_under(G_stretch, sq_stretch, worst):
    hit = False
    for j in range(G_stretch.shape[0]):
        hit |= sq_stretch[j] - 2.0 * G_stretch[j] <= worst
    return hit


@njit(cache=True)
def _any_column_under(G_stretch, row_sq_r, worst):
    hit = False
    for c in range(G_stretch.shape[0]):
        hit |= row_sq_r - 2.0 * G_stretch[c] <= worst[c]
    return hit


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
        for j0 in range(0, m, STRIP):
            j1 = min(m, j0 + STRIP)
            if not _any_key_under(G[r, j0:j1], col_sq[j0:j1], worst):   # most stretches hold no candidate
                continue
            for j in range(j0, j1):
                v = col_sq[j] - 2.0 * G[r, j]
                c = col0 + j
                if (v < worst or (v == worst and c < worst_index)) and c != i:
                    _insert(best, arg, i, v, c)
                    worst, worst_index = best[i, k - 1], arg[i, k - 1]


@njit(parallel=True, cache=True)
def _offer_columns(G, row_sq, row0, col0, best, arg):
    # offer_block for G^T without forming it: the rows col0 + c of the search (the columns of G) take the
    # candidates row0 + r; each thread walks down all rows of G over its own strip of STRIP columns
    b, m = G.shape
    k = best.shape[1]
    for s in prange((m + STRIP - 1) // STRIP):
        c0 = s * STRIP
        c1 = min(m, c0 + STRIP)
        worst = np.empty(c1 - c0)
        worst_index = np.empty(c1 - c0, dtype=np.int64)
        for c in range(c0, c1):
            worst[c - c0] = best[col0 + c, k - 1]
            worst_index[c - c0] = arg[col0 + c, k - 1]
        for r in range(b):
            cand = row0 + r
            if not _any_column_under(G[r, c0:c1], row_sq[r], worst):
                continue
            for c in range(c0, c1):
                v = row_sq[r] - 2.0 * G[r, c]
                w = worst[c - c0]
                if (v < w or (v == w and cand < worst_index[c - c0])) and cand != col0 + c:
                    i = col0 + c
                    _insert(best, arg, i, v, cand)
                    worst[c - c0] = best[i, k - 1]
                    worst_index[c - c0] = arg[i, k - 1]


def nearest_neighbors(A, n_neighbors: int, block: int = BLOCK):
    """int64 array (n, n_neighbors): the indices of the ``n_neighbors`` nearest other rows of A (n, d) for every
    row, by GEMM-form squared distances in A's precision; not sorted by distance. ``block`` rows per block
    (tests shrink it to reach the edges)."""
    n = A.shape[0]
    sq = np.einsum("ij,ij->i", A, A, dtype=np.float64)
    best = np.full((n, n_neighbors), np.inf)
    arg = np.full((n, n_neighbors), -1, dtype=np.int64)
    for i0, i1, j0, j1 in upper_blocks(n, block):
        G = A[i0:i1] @ A[j0:j1].T
        offer_block(G, sq[j0:j1], i0, j0, best, arg)
        if j0 != i0:
            _offer_columns(G, sq[i0:i1], i0, j0, best, arg)
    return arg
