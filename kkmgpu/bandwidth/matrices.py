"""The n x n arrays of the Off-the-grid searches, built from the features in row tiles on the device: squared
distances, RBF and polynomial kernel matrices, nearest-neighbour distances, symmetric permutations; the tile
size and the clamping floor they share.
"""

from __future__ import annotations

import math

import numpy as np

from kkmgpu.kernels import blocks as _kernels
from kkmgpu.backend.device import Backend


#: Rows per tile of the temporary arrays (gathers, float64 copies) aim at this many bytes (CPU, GPU).
TILE_BYTES = 32 * 2**20
TILE_BYTES_GPU = 256 * 2**20


def tiny(dtype) -> float:
    """The smallest normal number of ``dtype``: kernel values below it are clamped to it."""
    return float(np.finfo(dtype).tiny)


def tile_rows(n_cols: int, itemsize: int, backend: Backend | None = None) -> int:
    """Rows of a work tile of ``n_cols`` columns: TILE_BYTES(_GPU), within WORK_FRACTION of the free memory."""
    budget = TILE_BYTES_GPU if backend is not None and backend.is_gpu else TILE_BYTES
    return _kernels.tile_rows(n_cols, itemsize, budget, backend=backend)


# --- squared distances and RBF matrices from features ------------------------------------------------

def centered_features(X, backend: Backend):
    """X in float64 on the device, minus its mean (distances unchanged, less cancellation in the GEMM)."""
    xp = backend.xp
    A = backend.asarray(X, dtype=np.float64)
    return A - A.mean(axis=0)


def _distance_tile(A, a_sq, i0, i1, xp):
    """Squared distances of rows i0:i1 of A to all rows, float64, >= 0, exact zeros on the diagonal."""
    D = A[i0:i1] @ A.T
    D *= -2.0
    D += a_sq[i0:i1, None]
    D += a_sq[None, :]
    xp.maximum(D, 0.0, out=D)
    r = xp.arange(i1 - i0)
    D[r, r + i0] = 0.0
    return D


def fill_rbf(out, A, sigma: float, backend: Backend):
    """out <- exp(-D / sigma) from centred float64 features A, in row tiles (float64 arithmetic).

    Entries below the smallest normal number of out's dtype are clamped to it, so the walk's square roots
    and divisions never meet 0 / 0. Returns (number of clamped entries, smallest entry before clamping).
    """
    xp = backend.xp
    n = A.shape[0]
    floor = tiny(out.dtype)
    a_sq = (A * A).sum(axis=1)
    step = tile_rows(n, 8, backend)
    clamped = 0
    smallest = None
    for i0 in range(0, n, step):
        i1 = min(n, i0 + step)
        D = _distance_tile(A, a_sq, i0, i1, xp)
        D *= -1.0 / sigma
        xp.exp(D, out=D)
        tile_min = D.min()
        smallest = tile_min if smallest is None else xp.minimum(smallest, tile_min)
        clamped = clamped + (D < floor).sum()
        xp.maximum(D, floor, out=D)
        out[i0:i1] = D
    return int(clamped), float(smallest)


def fill_neg_half_distances(out, A, backend: Backend):
    """out <- -D / 2 (D the squared distances), so that ``kernel_epilogue`` with zero norms gives exp(-gamma D)."""
    xp = backend.xp
    n = A.shape[0]
    a_sq = (A * A).sum(axis=1)
    step = tile_rows(n, 8, backend)
    for i0 in range(0, n, step):
        i1 = min(n, i0 + step)
        D = _distance_tile(A, a_sq, i0, i1, xp)
        D *= -0.5
        out[i0:i1] = D
    return out


def rbf_from_neg_half(K, G, sigma: float, backend: Backend, zeros=None):
    """K <- exp(-D / sigma) from G = -D / 2: one copy and one fused exp pass (the binary-search probe)."""
    xp = backend.xp
    xp.copyto(K, G)
    if zeros is None:
        zeros = xp.zeros(K.shape[0], dtype=K.dtype)
    backend.ops.kernel_epilogue(K, zeros, zeros, _kernels.EPILOGUE_CODES["rbf"], 1.0 / sigma, 0.0, 1)
    return K


def min_pairwise_sq_distance(A, backend: Backend):
    """(smallest positive squared distance, number of duplicate pairs, number of duplicated points).

    Tiles of GEMM-form distances (float64) locate the candidates; the candidate pairs' distances are then
    recomputed as ||x_i - x_j||^2 directly, so the minimum is exact to rounding of the data, not of the GEMM.
    """
    xp = backend.xp
    n = A.shape[0]
    a_sq = (A * A).sum(axis=1)
    step = tile_rows(n, 8, backend)
    eps = float(np.finfo(np.float64).eps)
    scale = float(a_sq.max()) if n else 0.0
    # GEMM-form error bound: (d + 4) eps (||x||^2 + ||y||^2) <= 2 (d + 4) eps max ||x||^2
    slack = 2.0 * (A.shape[1] + 4) * eps * scale
    # pass 1: the smallest GEMM-form distance above the slack (pairs below it may be duplicates)
    best = math.inf
    for i0 in range(0, n, step):
        i1 = min(n, i0 + step)
        D = _distance_tile(A, a_sq, i0, i1, xp)
        r = xp.arange(i1 - i0)
        D[r, r + i0] = xp.inf
        D[D <= slack] = xp.inf
        best = min(best, float(D.min()))
    threshold = (best if math.isfinite(best) else 0.0) + 2.0 * slack
    # pass 2: every pair (i < j) with GEMM-form distance <= threshold, recomputed exactly
    exact_min = math.inf
    duplicate_pairs = 0
    duplicated = np.zeros(n, dtype=bool)
    for i0 in range(0, n, step):
        i1 = min(n, i0 + step)
        D = _distance_tile(A, a_sq, i0, i1, xp)
        r = xp.arange(i1 - i0)
        D[r, r + i0] = xp.inf
        ii, jj = xp.nonzero(D <= threshold)
        ii = ii + i0
        keep = ii < jj
        ii, jj = ii[keep], jj[keep]
        chunk = tile_rows(A.shape[1], 8, backend)   # pairs per exact recomputation (many duplicates: many pairs)
        for p0 in range(0, int(ii.size), chunk):
            a, b = ii[p0:p0 + chunk], jj[p0:p0 + chunk]
            diff = A[a] - A[b]
            d = (diff * diff).sum(axis=1)
            zero = d == 0
            n_zero = int(zero.sum())
            if n_zero:
                duplicate_pairs += n_zero
                duplicated[backend.to_host(a[zero])] = True
                duplicated[backend.to_host(b[zero])] = True
            positive = d[~zero]
            if positive.size:
                exact_min = min(exact_min, float(positive.min()))
    if not math.isfinite(exact_min) and math.isfinite(best):
        exact_min = best  # only reachable if the slack swallowed every pair (data of ~1 ulp spread)
    return exact_min, duplicate_pairs, int(duplicated.sum())


def fill_polynomial(out, X, gamma: float, coef0: float, degree: float, backend: Backend):
    """out <- (gamma <x, y> + coef0) ** degree from float64 features X (not centred), in row tiles.

    Returns (smallest base value, number of clamped entries); entries are clamped below to the smallest
    normal number of out's dtype. The caller checks that the base is positive before using the result.
    """
    xp = backend.xp
    n = X.shape[0]
    floor = tiny(out.dtype)
    step = tile_rows(n, 8, backend)
    smallest = None
    clamped = 0
    for i0 in range(0, n, step):
        i1 = min(n, i0 + step)
        B = X[i0:i1] @ X.T
        B *= gamma
        B += coef0
        tile_min = B.min()
        smallest = tile_min if smallest is None else xp.minimum(smallest, tile_min)
        if float(degree) == int(degree):
            P = B ** int(degree)
        else:
            P = xp.power(xp.maximum(B, 0.0), degree)
        clamped = clamped + (P < floor).sum()
        xp.maximum(P, floor, out=P)
        out[i0:i1] = P
    return float(smallest), int(clamped)


def nearest_neighbour_distances(A, n_neighbors: int, backend: Backend):
    """Euclidean distances of every point to its 1st..n_neighbors-th nearest other point, host (n, n_neighbors).

    Row tiles of GEMM-form squared distances on the device; the point itself is excluded (its own entry is
    set to +inf), duplicates count as neighbours at distance 0.
    """
    xp = backend.xp
    n = A.shape[0]
    a_sq = (A * A).sum(axis=1)
    step = tile_rows(n, 16, backend)
    out = np.empty((n, n_neighbors), dtype=np.float64)
    for i0 in range(0, n, step):
        i1 = min(n, i0 + step)
        D = _distance_tile(A, a_sq, i0, i1, xp)
        r = xp.arange(i1 - i0)
        D[r, r + i0] = xp.inf
        if n_neighbors < n - 1:
            D = xp.partition(D, n_neighbors - 1, axis=1)[:, :n_neighbors]
        D = xp.sort(D[:, :n_neighbors], axis=1)
        out[i0:i1] = backend.to_host(xp.sqrt(D))
    return out


def permute_into(dst, src, perm, backend: Backend):
    """dst <- src[perm][:, perm] in row tiles (dst and src distinct n x n arrays)."""
    xp = backend.xp
    n = src.shape[0]
    step = tile_rows(n, 2 * src.dtype.itemsize, backend)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        rows = src[perm[r0:r1]]
        dst[r0:r1] = xp.take(rows, perm, axis=1)
    return dst
