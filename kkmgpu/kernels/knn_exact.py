"""Exact nearest neighbours from a low-precision search, on either device: spare candidates, a float64 re-ranking
and a certificate for every row (issue 26 point 1; issue 27).

The searches of :mod:`knn_cpu` and :mod:`knn_cuda` rank points by GEMM-form keys ||a_j||^2 - 2 a_i . a_j in the
working precision (A's dtype; on a GPU in the GEMM precision mode of :mod:`kkmgpu.kernels.gemm`, "tf32"
included). Such keys are only approximately ordered, so :func:`search`

1. prepares the features: A centred in float64 (an offset such as 1e7 then costs nothing), multiplied by a power
   of two 2^-p where its norms would leave the working precision's range (X * 1e20, X * 1e-25: exact, it only
   shifts exponents), then cast to the working dtype: a;
2. keeps each row's m = n_neighbors + :func:`spares` best candidates by the key ||a_j||^2 (1 - c) - 2 a_i . a_j;
3. re-ranks them by their float64 squared distances computed directly, ||x_i - x_j||^2 from the differences of
   A's own values (what scipy's ``cdist`` computes), ties to the lower index;
4. certifies the row: with |D^_ij - D_ij| <= c (||a_i||^2 + ||a_j||^2) + e_abs for the GEMM-form estimate D^ of
   the squared distance D (:func:`error_bound`), every point not kept is at least ||a_i||^2 + r_i - c ||a_i||^2
   - e_abs away, r_i the largest key kept (the shift c ||a_j||^2 in the key takes the candidate's share of the
   error). The row is exact when its n_neighbors-th float64 distance is below that;
5. recomputes the rows that are not certified: float64 keys over all points, certified the same way with the
   float64 bound, and the rows that still fail (exact ties, e.g. many duplicates, at the boundary) by direct
   float64 distances to every point. Where a sample of rows predicts that fewer than CERTIFY_MIN of the rows
   would be certified in the working precision (points nearly on a line), every row starts here.

Candidate lists up to knn_cpu.LIST_MAX (CPU) or knn_cuda.MAX_NEIGHBORS (GPU) are kept sorted during the search;
longer ones take row tiles and a selection, whose cost does not grow with the list.

So the result is the float64 brute-force neighbours of A's values (ties to the lower index) for every row, in any
precision mode; the float64 distances' own rounding is inside the bound.

:func:`query` does the same for new points against A (``predict`` under the graph objectives): the new points are
prepared as A is (the same float64 mean and power of two), and the same bound turns each tile's GEMM-form estimates
of all their distances into intervals, which pick the pairs whose float64 distances are computed directly.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from kkmgpu.backend.device import Backend, argsort_stable, check_fits
from kkmgpu.kernels import gemm as _gemm
from kkmgpu.kernels.blocks import tile_rows

__all__ = ["MIN_SPARES", "CERTIFY_MIN", "spares", "error_bound", "scale_exponent", "prepare", "exact_distances",
           "predicted_certified", "search", "cross_distances", "query"]

#: spare candidates per row beyond n_neighbors: n_neighbors, at least MIN_SPARES and at most MAX_SPARES (on a GPU
#: at most up to knn_cuda.MAX_NEIGHBORS where n_neighbors + MIN_SPARES fit there): long lists have wide gaps
#: between their n_neighbors-th and last distances without doubling the work
MIN_SPARES, MAX_SPARES = 8, 64
#: rows sampled to predict the certified fraction, and the fraction below which every row is searched in float64
CERTIFY_SAMPLE = 256
CERTIFY_MIN = 0.5
#: a centred feature norm in [2^-LIMIT, 2^LIMIT] is used as it is; beyond, the features are scaled by 2^-p
_EXPONENT_LIMIT = {np.dtype(np.float32): 30, np.dtype(np.float64): 400}


def spares(n_neighbors: int) -> int:
    """Spare candidates each row keeps beyond its ``n_neighbors`` for the float64 re-ranking."""
    return max(MIN_SPARES, min(MAX_SPARES, int(n_neighbors)))


def error_bound(mode: str, d: int, dtype) -> tuple[float, float]:
    """(c, e_abs): |D^_ij - D_ij| <= c (||a_i||^2 + ||a_j||^2) + e_abs for the squared distance D^ that a search
    in ``mode`` ("fp64", "fp32", "3xtf32", "tf32"; :func:`kkmgpu.kernels.gemm.effective_mode`) over ``d``
    features estimates from its key, D the float64 distance of the features before their cast to ``dtype``.

    Terms (u the unit roundoff of ``dtype``; gamma_n = n u' / (1 - n u'), the bound of an n-term dot product in
    any summation order, Higham, "Accuracy and Stability of Numerical Algorithms", eq. 3.5):

    - the product 2 a_i . a_j: |2 (G^ - G)| <= 2 c_G sum |a_i a_j| <= c_G (||a_i||^2 + ||a_j||^2), with
      c_G = eps_op + gamma_{f d} (1 + 2^-8), f = 3 for the 3xTF32 split's inner dimension. eps_op is the operands'
      rounding: none for "fp32" and "fp64"; (1 + 2^-10)^2 - 1 for "tf32" (10 explicit mantissa bits, taken as
      truncation, which hardware may do instead of rounding); 5 * 2^-22 for "3xtf32" (the low parts' own
      truncation to TF32, 2^-21 relative to the operand, twice, and the dropped low x low term, 2^-22). On tensor
      cores u' = 2u: their FP32 accumulation is not correctly rounded (Fasi, Higham, Mikaitis and Pranesh, "Numerical
      behavior of NVIDIA tensor cores", PeerJ Comput. Sci. 2021);
    - the key's own roundings in the working dtype (the norm, the shift, the subtraction): 4u;
    - the cast of the centred float64 features to ``dtype``: |D(a) - D(y)| <= 2 (2u + u^2) (||y_i||^2 + ||y_j||^2);
    - float64 rounding of the centring and of the re-ranked distances (theirs and a float64 reference's):
      4 (d + 4) 2^-53;
    - e_abs: underflow in the product and the cast, 16 (f d + 4) times the smallest normal number (tensor cores
      and flush-to-zero arithmetic may drop subnormals).

    The sum is taken 1% larger (the norms of a against those of the exact features, and rounding of the bound).
    """
    dtype = np.dtype(dtype)
    u = float(np.finfo(dtype).eps) / 2
    tiny = float(np.finfo(dtype).tiny)
    f = _gemm.inner_factor(mode)
    u_acc = 2 * u if mode in ("tf32", "3xtf32") else u
    n_terms = f * d
    if n_terms * u_acc >= 0.5:
        raise ValueError(f"d={d} features are too many for a certified search in {mode} ({dtype.name}).")
    gamma = n_terms * u_acc / (1 - n_terms * u_acc)
    eps_op = {"tf32": (1 + 2.0**-10) ** 2 - 1, "3xtf32": 5 * 2.0**-22}.get(mode, 0.0)
    c = eps_op + gamma * (1 + 2.0**-8) + 4 * u + 2 * (2 * u + u * u) + 4 * (d + 4) * 2.0**-53
    return 1.01 * c, 16 * (n_terms + 4) * tiny


def scale_exponent(max_sq: float, dtype) -> int:
    """p such that features whose largest squared norm is ``max_sq`` are used as y 2^-p: 0 while the norm is
    within 2^+-LIMIT (30 for float32, 400 for float64), else the exponent that brings it to [1/2, 1)."""
    if not max_sq > 0:
        return 0
    e = math.frexp(math.sqrt(max_sq))[1]
    return 0 if abs(e) <= _EXPONENT_LIMIT[np.dtype(dtype)] else e


def _chunk(n_cols: int, itemsize: int, backend: Backend) -> int:
    return tile_rows(n_cols, itemsize, backend=backend)


def prepare(A, backend: Backend):
    """(a, sq, mean, p): the features the search ranks by, a = fl((A - mean) 2^-p) in A's dtype (A itself where
    it is centred and in range already: the features that ``fit`` prepares), their squared norms (float64), the
    float64 column means and the scale exponent :func:`scale_exponent`. Raises ValueError for non-finite A."""
    xp = backend.xp
    n, d = A.shape
    mean = A.mean(axis=0, dtype=xp.float64)
    sq = xp.empty(n, dtype=xp.float64)
    step = _chunk(d, 16, backend)
    for i0 in range(0, n, step):
        Y = A[i0:i0 + step].astype(xp.float64) - mean
        sq[i0:i0 + step] = (Y * Y).sum(axis=1)
    max_sq = float(sq.max())
    if not math.isfinite(max_sq):
        raise ValueError("the features contain NaN or infinity (or norms beyond float64); every value must be "
                         "finite for a nearest-neighbour search.")
    p = scale_exponent(max_sq, A.dtype)
    if p == 0 and float((mean * mean).sum()) <= 1e-6 * max_sq:
        return A, _norms(A, backend), mean, 0
    a = xp.empty_like(A)
    scale = 2.0 ** -p
    for i0 in range(0, n, step):
        a[i0:i0 + step] = ((A[i0:i0 + step].astype(xp.float64) - mean) * scale).astype(A.dtype)
    return a, _norms(a, backend), mean, p


def _norms(a, backend: Backend):
    xp = backend.xp
    n, d = a.shape
    sq = xp.empty(n, dtype=xp.float64)
    step = _chunk(d, 8, backend)
    for i0 in range(0, n, step):
        rows = a[i0:i0 + step].astype(xp.float64)
        sq[i0:i0 + step] = (rows * rows).sum(axis=1)
    return sq


def exact_distances(A, rows, index, p: int, backend: Backend):
    """float64 (len(rows), m): ||(x_i - x_j) 2^-p||^2 for i = rows[t], j = index[t, q], from the float64 differences
    of A's values (scaling by a power of two is exact); +inf where index < 0."""
    if not backend.is_gpu:
        from kkmgpu.kernels import knn_cpu

        return knn_cpu.pair_distances(A, np.ascontiguousarray(rows, dtype=np.int64),
                                      np.ascontiguousarray(index, dtype=np.int64), 2.0 ** -p)
    from kkmgpu.kernels import knn_cuda   # a pair's bits do not depend on the chunks (knn_cuda.pair_distances)

    xp = backend.xp
    r, m = index.shape
    out = xp.empty((r, m), dtype=xp.float64)
    step = _chunk(3 * m, 8, backend)
    for t0 in range(0, r, step):
        idx = index[t0:t0 + step]
        pair_rows = xp.repeat(rows[t0:t0 + step].astype(xp.int64), m)
        dist = knn_cuda.pair_distances(A, A, pair_rows, xp.maximum(idx, 0).astype(xp.int64).ravel(), 2.0 ** -p)
        out[t0:t0 + step] = xp.where(idx >= 0, dist.reshape(idx.shape), xp.inf)
    return out


def _nearest_first(index, dist, k: int, xp):
    """Each row's k first (dist, index) pairs in ascending order, ties to the lower index."""
    if xp is np:
        from kkmgpu.kernels import knn_cpu

        return knn_cpu.nearest_first(np.ascontiguousarray(index, dtype=np.int64), np.ascontiguousarray(dist), k)
    by_index = argsort_stable(xp, index)
    index = xp.take_along_axis(index, by_index, axis=1)
    dist = xp.take_along_axis(dist, by_index, axis=1)
    order = argsort_stable(xp, dist)[:, :k]
    return xp.take_along_axis(index, order, axis=1), xp.take_along_axis(dist, order, axis=1)


def _certified(dist_k, sq, r, c: float, e_abs: float, index, xp):
    # every point not kept is farther than the k-th kept (module docstring, step 4): strictly, so that a tie with
    # a point not kept (whose index could be lower) is never certified
    return (dist_k < sq + r - c * sq - e_abs) & xp.all(index >= 0, axis=1)


def _candidates(a, m, col_sq, mode, backend, block=None):
    """(keys, index) (n, m): each row's m least keys col_sq[j] - 2 a_i . a_j by the device's search: sorted lists
    over the blocks on and above the diagonal (knn_cpu.search up to LIST_MAX, the knn_cuda kernel up to its
    MAX_NEIGHBORS), else row tiles with a selection (:func:`row_tile_candidates`: O(n) a row however long the
    lists)."""
    if backend.is_gpu:
        from kkmgpu.kernels import knn_cuda

        if m <= knn_cuda.MAX_NEIGHBORS:
            if block is None:
                block = knn_cuda.block_rows(a, backend, knn_cuda.BLOCK, mode)
            return knn_cuda.search(a, m, block=block, col_sq=col_sq, mode=mode)
        return row_tile_candidates(a, m, col_sq, mode, backend)
    from kkmgpu.kernels import knn_cpu

    if m <= knn_cpu.LIST_MAX:
        keys, cand = knn_cpu.search(a, m, block=block or knn_cpu.BLOCK, col_sq=col_sq)
        return keys.astype(np.float64), cand
    return row_tile_candidates(a, m, col_sq, mode, backend)


def row_tile_candidates(a, m: int, col_sq, mode: str, backend: Backend, rows=None):
    """(keys, index) (len(rows), m), not sorted: the m least keys col_sq[j] - 2 a_i . a_j over all other points
    of each row i in ``rows`` (default: every row), in row tiles of the product in ``mode`` and a selection
    (``argpartition`` on a GPU, :func:`kkmgpu.kernels.knn_cpu.select_rows` on the CPU)."""
    xp = backend.xp
    n = a.shape[0]
    rows = xp.arange(n) if rows is None else rows
    index = xp.empty((rows.shape[0], m), dtype=xp.int64)
    keys = xp.empty((rows.shape[0], m), dtype=xp.float64 if backend.is_gpu else a.dtype)
    right = _gemm.right_operand(a, mode, xp)
    cols = col_sq.astype(a.dtype)
    step = _chunk(n, 3 * a.dtype.itemsize + 8, backend)
    for t0 in range(0, rows.shape[0], step):
        R = rows[t0:t0 + step]
        D = _gemm.gemm(_gemm.left_operand(a[R], mode, xp), right, backend, mode)
        D *= -2
        D += cols[None, :]
        D[xp.arange(R.shape[0]), R] = xp.inf
        if backend.is_gpu:
            part = xp.argpartition(D, m - 1, axis=1)[:, :m] if m < n - 1 else xp.argsort(D, axis=1)[:, :m]
            index[t0:t0 + step] = part
            keys[t0:t0 + step] = xp.take_along_axis(D, part, axis=1)
        else:
            from kkmgpu.kernels import knn_cpu

            knn_cpu.select_rows(D, m, keys[t0:t0 + step], index[t0:t0 + step])
    return keys.astype(xp.float64, copy=False), index


def predicted_certified(A, mean, p: int, sq, k: int, m: int, c: float, e_abs: float, backend: Backend,
                        sample: int = CERTIFY_SAMPLE) -> float:
    """The fraction of rows that a search with the bound (c, e_abs) and m candidates would certify, measured on
    ``sample`` rows (a fixed seed): a row is counted when its k-th float64 distance D_k is below its m-th D_m
    less the bound of the m-th point, c (||a_i||^2 + ||a_(m)||^2) + e_abs (the certificate, module docstring step
    4, with error-free keys). Their distances to all points come from float64 GEMM-form products."""
    xp = backend.xp
    n, d = A.shape
    rows = xp.asarray(np.sort(np.random.default_rng(0).choice(n, size=min(n, sample), replace=False)))
    Y = (A[rows].astype(xp.float64) - mean) * 2.0 ** -p
    D = xp.empty((rows.shape[0], n), dtype=xp.float64)
    step = _chunk(3 * d, 8, backend)
    for j0 in range(0, n, step):
        D[:, j0:j0 + step] = -2.0 * (Y @ ((A[j0:j0 + step].astype(xp.float64) - mean) * 2.0 ** -p).T)
    D += sq[None, :]
    D += sq[rows, None]
    D[xp.arange(rows.shape[0]), rows] = xp.inf
    D_k = xp.partition(D, k - 1, axis=1)[:, k - 1]
    far = xp.argpartition(D, m - 1, axis=1)[:, m - 1]
    D_m = D[xp.arange(rows.shape[0]), far]
    return float((D_k < D_m - c * (sq[rows] + sq[far]) - e_abs).mean())


def search(A, n_neighbors: int, backend: Backend, precision: str = _gemm.DEFAULT_PRECISION, *, block=None,
           report: dict | None = None):
    """(index, sq): the ``n_neighbors`` nearest other rows of A (n, d) for every row, nearest first, by float64
    squared distances of A's values (ties to the lower index), and those distances; found by the device's
    low-precision search in ``precision`` and certified (module docstring). ``block``: the search's block rows
    (tests shrink it). ``report``: a dict that takes the mode, the spare count, the fraction of rows the
    working-precision candidates were predicted to certify (:func:`predicted_certified`; absent when the search is
    in float64 or every point is a candidate), the rows certified from the candidates and the rows recomputed in
    float64 and directly.

    Where fewer than CERTIFY_MIN of the sampled rows would be certified (points nearly on a line, whose
    neighbour distances are below the working precision's bound), the working-precision search is skipped: every
    row is searched with float64 keys (step 5)."""
    xp = backend.xp
    n, d = A.shape
    k = int(n_neighbors)
    a, sq, mean, p = prepare(A, backend)
    mode = _gemm.effective_mode(precision, backend, a.dtype, shape=(n, n, d))
    c, e_abs = error_bound(mode, d, a.dtype)
    m = k + spares(k)
    if backend.is_gpu:   # the kernel's lists hold MAX_NEIGHBORS: fewer spares rather than the slower row tiles
        from kkmgpu.kernels.knn_cuda import MAX_NEIGHBORS

        if k + MIN_SPARES <= MAX_NEIGHBORS:
            m = min(m, MAX_NEIGHBORS)
    m = min(n - 1, m)
    report = {} if report is None else report
    report.update(mode=mode, spares=m - k)
    if m < n - 1 and mode != "fp64":
        report["predicted_certified"] = predicted_certified(A, mean, p, sq, k, m, c, e_abs, backend)
        if report["predicted_certified"] < CERTIFY_MIN:
            report["candidates_certified"] = 0.0
            index, dist = _recompute(A, xp.arange(n), k, m, mean, p, backend, report)
            return index, _unscaled_checked(dist, p, A, xp)
    keys, cand = _candidates(a, m, (1.0 - c) * sq, mode, backend, block)
    dist = exact_distances(A, xp.arange(n), cand, p, backend)
    r = keys.max(axis=1)
    index, dist = _nearest_first(cand, dist, k, xp)
    if m < n - 1:
        bad = xp.flatnonzero(~_certified(dist[:, k - 1], sq, r, c, e_abs, cand, xp))
    else:   # every other point is a candidate: nothing to certify
        bad = xp.flatnonzero(xp.any(cand < 0, axis=1))
    report.update(candidates_certified=1.0 - int(bad.shape[0]) / n)
    if bad.shape[0]:
        index[bad], dist[bad] = _recompute(A, bad, k, m, mean, p, backend, report)
    else:
        report.update(float64_rows=0, direct_rows=0)
    return index, _unscaled_checked(dist, p, A, xp)


def _unscaled_checked(dist, p: int, A, xp):
    if not bool(xp.isfinite(dist := _unscaled(dist, p)).all()):
        raise ValueError(f"squared distances of the features (up to {float(xp.abs(A).max()):.3g} in magnitude) "
                         "overflow float64; scale the data down.")
    return dist


def _recompute(A, rows, k: int, m: int, mean, p: int, backend: Backend, report: dict):
    """(index, dist) of ``rows`` (module docstring, step 5): each row's m least float64 GEMM-form keys over all
    points, re-ranked and certified with the float64 bound; the rows that still fail by direct distances to every
    point. Up to half the rows take row tiles (:func:`row_tile_candidates`); more take the device's search of
    every row (:func:`_candidates`: half the products, and sorted lists instead of a selection of each row)."""
    xp = backend.xp
    n, d = A.shape
    check_fits(n * d * 8, backend, f"the float64 features of the recomputed rows' search ({n} x {d})")
    a64 = _prepared(A, mean, p, backend, xp.float64)
    sq = _norms(a64, backend)
    c, e_abs = error_bound("fp64", d, np.float64)
    if 2 * rows.shape[0] > n:
        keys, part = _candidates(a64, m, (1.0 - c) * sq, "fp64", backend)
        keys, part = keys[rows], part[rows]
    else:
        keys, part = row_tile_candidates(a64, m, (1.0 - c) * sq, "fp64", backend, rows=rows)
    del a64
    index, dist = _nearest_first(part, exact_distances(A, rows, part, p, backend), k, xp)
    failed = xp.flatnonzero(~_certified(dist[:, k - 1], sq[rows], keys.max(axis=1), c, e_abs, part, xp))
    report.update(float64_rows=int(rows.shape[0]), direct_rows=int(failed.shape[0]))
    if failed.shape[0]:
        index[failed], dist[failed] = _direct(A, rows[failed], k, p, backend)
    return index, dist


def _direct(A, rows, k: int, p: int, backend: Backend):
    """(index, dist) of ``rows`` from their direct float64 distances to every point, ties to the lower index."""
    xp = backend.xp
    n, d = A.shape
    out_index = xp.empty((rows.shape[0], k), dtype=xp.int64)
    out_dist = xp.empty((rows.shape[0], k), dtype=xp.float64)
    step = _chunk(n, 16, backend)
    for t0 in range(0, rows.shape[0], step):
        R = rows[t0:t0 + step]
        cols = _chunk(3 * d * R.shape[0], 8, backend)
        dist = xp.empty((R.shape[0], n), dtype=xp.float64)
        for j0 in range(0, n, cols):
            j1 = min(n, j0 + cols)
            block = xp.broadcast_to(xp.arange(j0, j1, dtype=xp.int64), (R.shape[0], j1 - j0))
            dist[:, j0:j1] = exact_distances(A, R, block, p, backend)
        dist[xp.arange(R.shape[0]), R] = xp.inf
        order = argsort_stable(xp, dist)[:, :k]
        out_index[t0:t0 + step] = order
        out_dist[t0:t0 + step] = xp.take_along_axis(dist, order, axis=1)
    return out_index, out_dist


def cross_distances(Q, A, rows, cols, p: int, backend: Backend):
    """float64 (len(rows),): ||(q_i - a_j) 2^-p||^2 for i = rows[t], j = cols[t], from the float64 differences of
    the values of Q and A (one dtype), summed in feature order on the CPU as :func:`exact_distances` sums them; on
    a GPU by :func:`kkmgpu.kernels.knn_cuda.pair_distances`, whose order depends on the features alone (CuPy's row
    sums of a gathered block chose theirs by the block's shape, which followed free memory: two landmark fits of
    one seed differed in the last bits on an H100, 2026-11-26)."""
    if not backend.is_gpu:
        return _cross_cpu(Q, A, np.ascontiguousarray(rows, dtype=np.int64),
                          np.ascontiguousarray(cols, dtype=np.int64), 2.0 ** -p)
    from kkmgpu.kernels import knn_cuda

    return knn_cuda.pair_distances(Q, A, rows, cols, 2.0 ** -p)


@njit(parallel=True, cache=True)
def _cross_cpu(Q, A, rows, cols, scale):
    out = np.empty(rows.shape[0])
    for t in prange(rows.shape[0]):
        i = rows[t]
        j = cols[t]
        s = 0.0
        for f in range(A.shape[1]):
            diff = (np.float64(Q[i, f]) - np.float64(A[j, f])) * scale
            s += diff * diff
        out[t] = s
    return out


def query(A, Q, n_neighbors: int, backend: Backend, precision: str = _gemm.DEFAULT_PRECISION, *, radius_sq=None,
          rows: int | None = None, report: dict | None = None):
    """(index, dist, pairs): the rows of A (n, d) nearest to each new point, a row of Q (m, d) of A's dtype, by
    float64 squared distances of the values (a row of A equal to the point is at distance 0), exact in every mode.

    ``index``, ``dist`` (m, n_neighbors): each point's ``n_neighbors`` nearest rows of A, nearest first, ties to
    the lower index, and their distances. ``pairs`` (row, col, dist): every pair (i, j) with dist <= dist[i, -1]
    (the ties of the last place included) or, given ``radius_sq`` (n,), dist < radius_sq[j]; in row order, columns
    ascending within a row.

    A and Q are prepared as :func:`search` prepares A (:func:`prepare` of A: Q takes A's float64 mean and power of
    two, then A's dtype). For each tile of ``rows`` points (default: within the work budget) the GEMM-form
    estimates D^ of the distances to all of A, the product in ``precision``'s mode, give intervals
    D^ +- (c (||q_i||^2 + ||a_j||^2) + e_abs) (:func:`error_bound`) that hold the float64 distances. A pair's
    float64 distance is computed directly when its interval starts at or below the n_neighbors-th least interval
    end of its row, or below radius_sq[j]: those pairs hold every pair the result needs, so every row is exact
    (a loose bound only costs more direct distances). ``report`` takes the mode and the direct distances' count.
    """
    xp = backend.xp
    n, d = A.shape
    m = Q.shape[0]
    k = int(n_neighbors)
    if not 1 <= k <= n:
        raise ValueError(f"n_neighbors={k} must be between 1 and the {n} points searched.")
    if Q.ndim != 2 or Q.shape[1] != d or Q.dtype != A.dtype:
        raise ValueError(f"the new points ({Q.shape}, {Q.dtype}) need {d} features of A's dtype {A.dtype}.")
    if m and not bool(xp.isfinite(Q).all()):
        raise ValueError("the new points contain NaN or infinity; every value must be finite for a "
                         "nearest-neighbour search.")
    a, sq, mean, p = prepare(A, backend)
    q = Q if a is A else _prepared(Q, mean, p, backend)
    q_sq = _norms(q, backend)   # (a point far beyond A's range may overflow here: its intervals are unbounded)
    mode = _gemm.effective_mode(precision, backend, a.dtype, shape=(m, n, d))
    c, e_abs = error_bound(mode, d, a.dtype)
    if mode == "3xtf32":
        check_fits(_gemm.operand_bytes(n, d, mode), backend, f"the training points' GEMM operand ({n} x {3 * d} "
                   "float32, the 3xTF32 split)", option=_gemm.SPLIT_ADVICE)
    right = _gemm.right_operand(a, mode, xp)
    scale = 2.0 ** -p
    radius = None if radius_sq is None else xp.asarray(radius_sq, dtype=xp.float64) * scale * scale
    index = xp.empty((m, k), dtype=xp.int64)
    dist = xp.empty((m, k), dtype=xp.float64)
    pairs, direct = [], 0
    step = max(1, int(rows)) if rows is not None else _chunk(n, 6 * 8, backend)
    for i0 in range(0, m, step):
        i1 = min(m, i0 + step)
        est = _gemm.gemm(_gemm.left_operand(q[i0:i1], mode, xp), right, backend, mode).astype(xp.float64)
        norms = q_sq[i0:i1, None] + sq[None, :]
        est *= -2.0
        est += norms
        norms *= c
        norms += e_abs             # the bound
        wild = ~xp.isfinite(est)   # an overflowing product bounds nothing
        upper = xp.where(wild, xp.inf, est + norms)
        lower = xp.where(wild, -xp.inf, est - norms)
        del est, norms, wild
        reach = xp.partition(upper, k - 1, axis=1)[:, k - 1] if k < n else upper.max(axis=1)
        keep = lower <= reach[:, None]
        if radius is not None:
            keep |= lower < radius[None, :]
        del upper, lower
        r, j = xp.nonzero(keep)
        del keep
        dd = cross_distances(Q, A, r + i0, j, p, backend)
        direct += int(r.shape[0])
        order = argsort_stable(xp, dd)          # nearest first, ties in column order (nonzero's)
        order = order[argsort_stable(xp, r[order])]
        start = xp.searchsorted(r[order], xp.arange(i1 - i0))
        place = order[start[:, None] + xp.arange(k)]
        index[i0:i1], dist[i0:i1] = j[place], dd[place]
        within = dd <= dd[place[:, -1]][r]
        if radius is not None:
            within |= dd < radius[j]
        pairs.append((r[within] + i0, j[within], dd[within]))
    if report is not None:
        report.update(mode=mode, direct_pairs=direct)
    empty = xp.empty(0, dtype=xp.int64)
    rr, jj, dd = (xp.concatenate(part) for part in zip(*pairs)) if pairs else (empty, empty, xp.empty(0))
    dist = _unscaled(dist, p)
    if m and not bool(xp.isfinite(dist).all()):
        raise ValueError(f"squared distances of the new points (up to {float(xp.abs(Q).max()):.3g} in magnitude) "
                         "to the training points overflow float64; scale the data down.")
    return index, dist, (rr, jj, _unscaled(dd, p))


def _prepared(Q, mean, p: int, backend: Backend, dtype=None):
    """fl((Q - mean) 2^-p) in ``dtype`` (default Q's), as :func:`prepare` makes A's."""
    xp = backend.xp
    out = xp.empty(Q.shape, dtype=Q.dtype if dtype is None else dtype)
    step = _chunk(Q.shape[1], 16, backend)
    scale = 2.0 ** -p
    for i0 in range(0, Q.shape[0], step):
        out[i0:i0 + step] = ((Q[i0:i0 + step].astype(xp.float64) - mean) * scale).astype(out.dtype)
    return out


def _unscaled(dist, p: int):
    dist = dist * 2.0 ** p   # (4.0 ** p overflows a Python float first)
    dist *= 2.0 ** p
    return dist
