"""CPU twins (numba) of the tiled engine's fused operations, same names and signatures as
:mod:`kkmgpu.kernels.tiled_cuda` (kernels_cuda/tiled.cu).

A tile ``G`` (t, m) holds the inner products <x_i, y_j> of the rows i = row0 .. row0 + t - 1 with m column
points, straight from a GEMM. Every operation turns an entry into a kernel value

    v(i, j) = kappa(G[i, j]) computed in G's precision (float32 math for float32 tiles, as the dense
              engine's epilogue computes the K it stores),
    v(i, j) = 1 for the distance kernels (rbf, laplacian) where col_points[j] == row0 + i,

and consumes it at once, so no n x n matrix exists. ``kind`` is an ``EPILOGUE_CODES`` value (0: the tile
already holds kernel values, e.g. a callable's block). ``row_sq`` (t,) and ``col_sq`` (m,) are the squared
norms, used by the distance kernels only. Cluster sums accumulate in float64.

Operations
----------
tile_cluster_sums(G, row_sq, col_sq, kind, gamma, coef0, degree, clusters, coeffs, col_points, row0, S)
    In place S[i, clusters[j]] += coeffs[j] * v(i, j): the full cluster sums (papers' Eq. 3-4) of a row
    tile, with the columns in label order (any order is summed correctly; label order is the fast one).
tile_moved_sums(G, row_sq, col_sq, kind, gamma, coef0, degree, new_clusters, old_clusters, coeffs,
                col_points, row0, S)
    In place S[i, new[j]] += coeffs[j] v(i, j) and S[i, old[j]] -= coeffs[j] v(i, j): the incremental
    update S += K[:, moved] dY for the m points that moved.
tile_epilogue(G, row_sq, col_sq, kind, gamma, coef0, degree, col_points, row0)
    In place G <- v: kernel rows (k-means++ seeding).

On the CPU ``G`` is overwritten with the kernel values by every operation; on the GPU by ``tile_epilogue``
and ``tile_moved_sums`` (callers treat G as scratch). The GPU twins add in an order fixed by the shapes, with
no float atomics (kernels_cuda/tiled.cu): the same inputs give the same bits on every run there, and the twins
agree to rounding.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from kkmgpu.kernels.epilogue_codes import EPILOGUE_CODES

__all__ = ["tile_cluster_sums", "tile_moved_sums", "tile_epilogue"]

_RBF = EPILOGUE_CODES["rbf"]
_POLY = EPILOGUE_CODES["polynomial"]
_SIGMOID = EPILOGUE_CODES["sigmoid"]
_LAPLACIAN = EPILOGUE_CODES["laplacian"]


@njit(inline="always")
def _row_epilogue(row, a, col_sq, kind, gamma, coef0, degree, col_points, point):
    # one loop per kind, so that each body vectorises; the arithmetic is in the tile's precision, as in tiled.cu
    # (a, col_sq, gamma and coef0 come in the row's type; 2 g is g + g, exact either way)
    m = row.shape[0]
    zero = row.dtype.type(0)
    if kind == _RBF:
        for j in range(m):
            d = a + col_sq[j] - (row[j] + row[j])
            row[j] = math.exp(-gamma * max(d, zero))
    elif kind == _LAPLACIAN:
        for j in range(m):
            d = a + col_sq[j] - (row[j] + row[j])
            row[j] = math.exp(-gamma * math.sqrt(max(d, zero)))
    elif kind == _POLY:
        one = row.dtype.type(1)
        for j in range(m):
            base = gamma * row[j] + coef0
            v = one
            for _ in range(degree):
                v *= base
            row[j] = v
    elif kind == _SIGMOID:
        for j in range(m):
            row[j] = math.tanh(gamma * row[j] + coef0)
    if kind == _RBF or kind == _LAPLACIAN:
        for j in range(m):
            if col_points[j] == point:
                row[j] = 1.0


@njit(parallel=True, cache=True)
def _tile_cluster_sums(G, row_sq, col_sq, kind, gamma, coef0, degree, seg_starts, seg_clusters, coeffs,
                       col_points, row0, S):
    t = G.shape[0]
    for i in prange(t):
        row = G[i]
        a = row_sq[i]
        _row_epilogue(row, a, col_sq, kind, gamma, coef0, degree, col_points, row0 + i)
        for g in range(seg_clusters.shape[0]):
            acc = 0.0
            for j in range(seg_starts[g], seg_starts[g + 1]):
                acc += coeffs[j] * row[j]
            S[i, seg_clusters[g]] += acc


@njit(parallel=True, cache=True)
def _tile_moved_sums(G, row_sq, col_sq, kind, gamma, coef0, degree, new_clusters, old_clusters, coeffs,
                     col_points, row0, S):
    t, m = G.shape
    for i in prange(t):
        row = G[i]
        a = row_sq[i]
        _row_epilogue(row, a, col_sq, kind, gamma, coef0, degree, col_points, row0 + i)
        for j in range(m):
            wv = coeffs[j] * row[j]
            S[i, new_clusters[j]] += wv
            S[i, old_clusters[j]] -= wv


@njit(parallel=True, cache=True)
def _tile_epilogue(G, row_sq, col_sq, kind, gamma, coef0, degree, col_points, row0):
    t = G.shape[0]
    for i in prange(t):
        a = row_sq[i]
        _row_epilogue(G[i], a, col_sq, kind, gamma, coef0, degree, col_points, row0 + i)


def _tile_norms(row_sq, col_sq, G):
    """(row_sq, col_sq) in G's dtype, one per row / column of the tile G (zeros when None: unused)."""
    out = []
    for sq, size, what in ((row_sq, G.shape[0], "row_sq"), (col_sq, G.shape[1], "col_sq")):
        if sq is None:
            out.append(np.zeros(max(1, size), dtype=G.dtype))
        elif sq.shape != (size,):
            raise ValueError(f"{what} has shape {sq.shape}; the tile G of shape {G.shape} needs ({size},).")
        else:
            out.append(np.ascontiguousarray(sq, dtype=G.dtype))
    return out


def _params(G, gamma, coef0):
    """gamma and coef0 in G's precision: the epilogue's arithmetic runs in it, as on the GPU."""
    return G.dtype.type(gamma), G.dtype.type(coef0)


def _check(G, S=None):
    if G.ndim != 2 or not G.flags.c_contiguous or G.dtype not in (np.float32, np.float64):
        raise ValueError(f"the tile G must be a C-contiguous float32 or float64 2-D array; got {G.dtype} "
                         f"{G.shape}")
    if S is not None and not (S.flags.c_contiguous and S.dtype == np.float64 and S.shape[0] == G.shape[0]):
        raise ValueError(f"S must be a C-contiguous float64 array with {G.shape[0]} rows; got {S.shape} {S.dtype}")


def tile_cluster_sums(G, row_sq, col_sq, kind, gamma, coef0, degree, clusters, coeffs, col_points, row0, S):
    """In place: S[i, clusters[j]] += coeffs[j] * v(i, j) for a tile of inner products G.

    Parameters
    ----------
    G : float32 or float64 array of shape (t, m), C-contiguous
        Inner products of t rows with m column points (scratch: overwritten).
    row_sq, col_sq : arrays of shape (t,) and (m,), or None
        Squared norms of the rows and columns (distance kernels).
    kind, gamma, coef0, degree
        The kernel (``EPILOGUE_CODES``) and its parameters.
    clusters : int32 array of shape (m,)
        Cluster of each column (label order makes the sums contiguous runs).
    coeffs : float64 array of shape (m,)
        Weight of each column.
    col_points : int64 array of shape (m,)
        Index of each column's point, for the unit diagonal of the distance kernels.
    row0 : int
        Index of the tile's first row.
    S : float64 array of shape (t, k), C-contiguous; updated in place
    """
    t, m = G.shape
    if t == 0 or m == 0:
        return S
    _check(G, S)
    clusters = np.asarray(clusters)
    bounds = np.flatnonzero(np.diff(clusters)) + 1
    seg_starts = np.concatenate(([0], bounds, [m])).astype(np.int64)
    seg_clusters = np.ascontiguousarray(clusters[seg_starts[:-1]], dtype=np.int64)
    _tile_cluster_sums(G, *_tile_norms(row_sq, col_sq, G), int(kind), *_params(G, gamma, coef0), int(degree),
                       seg_starts, seg_clusters, np.ascontiguousarray(coeffs, dtype=np.float64),
                       np.ascontiguousarray(col_points, dtype=np.int64), int(row0), S)
    return S


def tile_moved_sums(G, row_sq, col_sq, kind, gamma, coef0, degree, new_clusters, old_clusters, coeffs, col_points,
                    row0, S):
    """In place: S[i, new_clusters[j]] += coeffs[j] v(i, j) and S[i, old_clusters[j]] -= coeffs[j] v(i, j).

    The incremental update S += K[:, moved] dY for the m moved points whose inner products are the
    columns of G; other parameters as for :func:`tile_cluster_sums`.
    """
    t, m = G.shape
    if t == 0 or m == 0:
        return S
    _check(G, S)
    _tile_moved_sums(G, *_tile_norms(row_sq, col_sq, G), int(kind), *_params(G, gamma, coef0), int(degree),
                     np.ascontiguousarray(new_clusters, dtype=np.int32),
                     np.ascontiguousarray(old_clusters, dtype=np.int32),
                     np.ascontiguousarray(coeffs, dtype=np.float64),
                     np.ascontiguousarray(col_points, dtype=np.int64), int(row0), S)
    return S


def tile_epilogue(G, row_sq, col_sq, kind, gamma, coef0, degree, col_points, row0):
    """In place: G[i, j] <- v(i, j), kernel rows from a tile of inner products."""
    t, m = G.shape
    if t == 0 or m == 0:
        return G
    _check(G)
    _tile_epilogue(G, *_tile_norms(row_sq, col_sq, G), int(kind), *_params(G, gamma, coef0), int(degree),
                   np.ascontiguousarray(col_points, dtype=np.int64), int(row0))
    return G
