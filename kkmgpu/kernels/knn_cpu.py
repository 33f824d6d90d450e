"""CPU twin of the nearest-neighbour search behind the affinity graphs (numba): imported only when the CPU path
runs. The GPU twin, with the same functions and signatures, is :mod:`kkmgpu.kernels.knn_cuda`
(``kernels_cuda/knn.cu``).

The squared distances are in GEMM form, ||a_i||^2 + ||a_j||^2 - 2 a_i . a_j, and the search visits only the
blocks on and above the diagonal of the n x n distance matrix: one GEMM A[I] A[J]^T serves the rows of I (its rows)
and the rows of J (its columns, read in strips, so that G^T is never formed), so the search costs half the flops
of a row-tile pass. Each row keeps its ``n_neighbors`` best candidates in a small sorted list that a candidate
enters only when it beats the list's worst, one pass over each block. Candidates are ordered by (key, index), so
that of equal keys the lower index is kept, on both twins; the keys are in A's precision.

``offer_block`` (the twin of the CUDA kernel) runs its rows in parallel; :func:`search` (what
:func:`nearest_neighbors` runs) instead cuts the blocks into block x panel products that stay in cache and hands
them to worker threads, each with one BLAS thread and lists of its own (merged at the end). The exact search with
lower bounds, :mod:`kkmgpu.kernels.knn_bounds`, runs it on its projected features.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba import njit, prange

from kkmgpu.kernels.blocks import upper_blocks

__all__ = ["BLOCK", "PANEL", "LIST_MAX", "nearest_first", "nearest_neighbors", "offer_block", "pair_distances",
           "search", "select_rows"]

#: rows of one product (the rows of a block of the distance matrix)
BLOCK = 2048
#: columns of one product: a 2048 x 256 float32 product (2 MiB) stays in cache for both passes, and one BLAS
#: thread runs such a GEMM near its peak (MNIST-70k projected on 200 axes + 1, 32 neighbours, 2 cores: 9.8 s,
#: the same as 512 columns)
PANEL = 256
#: columns of G one thread walks down when its columns are the rows of the search
STRIP = 64
#: the longest lists :func:`search` keeps: a sorted list costs O(length) for each candidate it takes, about
#: length (1 + ln(n / length)) of them a row, so longer lists take row tiles and :func:`select_rows`, O(n) a row
#: (20,000 x 3 points, 2 cores: 512 candidates 112 s in lists, 2000 candidates a few seconds in row tiles;
#: bench/bench_knn_plan.py)
LIST_MAX = 128


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
        hit |= sq_stretch[j] - (G_stretch[j] + G_stretch[j]) <= worst
    return hit


@njit(cache=True)
def _any_column_under(G_stretch, row_sq_r, worst):
    hit = False
    for c in range(G_stretch.shape[0]):
        hit |= row_sq_r - (G_stretch[c] + G_stretch[c]) <= worst[c]
    return hit


@njit(inline="always")
def _offer_row(G, col_sq, row0, col0, best, arg, r):
    # row row0 + r of the search takes the candidates col0 + j of G's row r
    m = G.shape[1]
    k = best.shape[1]
    i = row0 + r
    worst, worst_index = best[i, k - 1], arg[i, k - 1]
    for j0 in range(0, m, STRIP):
        j1 = min(m, j0 + STRIP)
        if not _any_key_under(G[r, j0:j1], col_sq[j0:j1], worst):   # most stretches hold no candidate
            continue
        for j in range(j0, j1):
            v = col_sq[j] - (G[r, j] + G[r, j])
            c = col0 + j
            if (v < worst or (v == worst and c < worst_index)) and c != i:
                _insert(best, arg, i, v, c)
                worst, worst_index = best[i, k - 1], arg[i, k - 1]


@njit(parallel=True, cache=True)
def offer_block(G, col_sq, row0, col0, best, arg):
    """In place: rows row0 + r of the search (best, arg: (n, k) keys ascending and their indices, empty slots
    (+inf, -1)) take the candidates col0 + j of the block G (b, m) of inner products, with the keys
    col_sq[j] - 2 G[r, j] in col_sq's precision (their own ||a_i||^2 is the same for every candidate, so it is
    left out), ordered by (key, index); a point is never its own neighbour."""
    for r in prange(G.shape[0]):
        _offer_row(G, col_sq, row0, col0, best, arg, r)


@njit(nogil=True, cache=True)
def _offer_block_serial(G, col_sq, row0, col0, best, arg):
    # offer_block on the calling thread (one worker of the threaded search)
    for r in range(G.shape[0]):
        _offer_row(G, col_sq, row0, col0, best, arg, r)


@njit(inline="always")
def _offer_strip(G, row_sq, row0, col0, best, arg, c0, c1):
    # the rows col0 + c, c in [c0, c1), of the search (columns of G) take the candidates row0 + r, walking down
    # all rows of G over that strip
    b = G.shape[0]
    k = best.shape[1]
    worst = np.empty(c1 - c0, dtype=best.dtype)
    worst_index = np.empty(c1 - c0, dtype=np.int64)
    for c in range(c0, c1):
        worst[c - c0] = best[col0 + c, k - 1]
        worst_index[c - c0] = arg[col0 + c, k - 1]
    for r in range(b):
        cand = row0 + r
        if not _any_column_under(G[r, c0:c1], row_sq[r], worst):
            continue
        for c in range(c0, c1):
            v = row_sq[r] - (G[r, c] + G[r, c])
            w = worst[c - c0]
            if (v < w or (v == w and cand < worst_index[c - c0])) and cand != col0 + c:
                i = col0 + c
                _insert(best, arg, i, v, cand)
                worst[c - c0] = best[i, k - 1]
                worst_index[c - c0] = arg[i, k - 1]


@njit(parallel=True, cache=True)
def _offer_columns(G, row_sq, row0, col0, best, arg):
    # offer_block for G^T without forming it: each thread walks down all rows of G over its own strip of STRIP
    # columns
    m = G.shape[1]
    for s in prange((m + STRIP - 1) // STRIP):
        _offer_strip(G, row_sq, row0, col0, best, arg, s * STRIP, min(m, s * STRIP + STRIP))


@njit(nogil=True, cache=True)
def _offer_columns_serial(G, row_sq, row0, col0, best, arg):
    m = G.shape[1]
    for c0 in range(0, m, STRIP):
        _offer_strip(G, row_sq, row0, col0, best, arg, c0, min(m, c0 + STRIP))


@njit(nogil=True, cache=True)
def _merge(best, arg, other_best, other_arg):
    # in place: best/arg take other's candidates (another worker's lists of the same rows; every pair was offered
    # to one worker only, so no candidate is in both)
    n, k = best.shape
    for i in range(n):
        for p in range(k):
            v, c = other_best[i, p], other_arg[i, p]
            if c < 0 or not (v < best[i, k - 1] or (v == best[i, k - 1] and c < arg[i, k - 1])):
                break   # other's list is sorted: nothing after it enters either
            _insert(best, arg, i, v, c)


def _workers() -> int:
    return max(1, numba.get_num_threads())


def search(A, n_neighbors: int, block: int = BLOCK, panel: int = PANEL, workers: int | None = None, *,
           col_sq=None):
    """(keys, index), each (n, n_neighbors): every row's ``n_neighbors`` nearest other rows of A (n, d) by
    (key, index), key = col_sq[j] - 2 a_i . a_j in A's precision, ascending; slots beyond n - 1 stay (+inf, -1).
    ``col_sq`` (float64, (n,)) defaults to ||a_j||^2 (then add ||a_i||^2 for the squared distance); the exact
    search (:mod:`kkmgpu.kernels.knn_exact`) passes shifted norms. The products are the plain ones in A's dtype
    (the CPU has no tensor cores: every GEMM precision mode is this one there).

    The blocks on and above the diagonal are cut into ``block`` x ``panel`` products, small enough to stay in
    cache while both passes read them (a 2048 x 256 float32 product: 2 MiB). ``workers`` threads (numba's
    thread count) each take products from a shared queue, run their GEMM on one BLAS thread and both passes
    serially into lists of their own, and the lists are merged at the end: no two threads ever write the same
    list, and one BLAS and one numba thread pool never spin against each other (MNIST-70k projected on 200
    axes + 1, 32 neighbours, 2 cores: 9.8 s against 16.6 s for 4096-row blocks with parallel BLAS and parallel
    passes in turn; all 784 pixels, 10 neighbours: 27 s against 34 s).
    """
    n = A.shape[0]
    workers = _workers() if workers is None else max(1, int(workers))
    panel = max(1, min(panel, block))
    if col_sq is None:
        col_sq = np.einsum("ij,ij->i", A, A, dtype=np.float64)
    sq = np.ascontiguousarray(col_sq, dtype=A.dtype)
    tasks = [(i0, i1, p0, min(j1, p0 + panel), j0 != i0)
             for i0, i1, j0, j1 in upper_blocks(n, block) for p0 in range(j0, j1, panel)]
    lists = [(np.full((n, n_neighbors), np.inf, dtype=A.dtype), np.full((n, n_neighbors), -1, dtype=np.int64))
             for _ in range(min(workers, len(tasks)))]
    queue = iter(tasks)
    lock = threading.Lock()
    stop = threading.Event()   # set when the caller is interrupted: the workers leave after their product

    def work(best, arg):
        buffer = np.empty(min(block, n) * min(panel, n), dtype=A.dtype)
        while not stop.is_set():
            with lock:
                task = next(queue, None)
            if task is None:
                return
            i0, i1, p0, p1, off_diagonal = task
            G = buffer[:(i1 - i0) * (p1 - p0)].reshape(i1 - i0, p1 - p0)
            np.matmul(A[i0:i1], A[p0:p1].T, out=G)
            _offer_block_serial(G, sq[p0:p1], i0, p0, best, arg)
            if off_diagonal:   # a block on the diagonal serves its rows both ways in its own products
                _offer_columns_serial(G, sq[i0:i1], i0, p0, best, arg)

    with _one_blas_thread():
        if len(lists) == 1:
            work(*lists[0])
        else:
            pool = ThreadPoolExecutor(len(lists))
            try:
                for future in [pool.submit(work, *state) for state in lists]:
                    future.result()
            finally:
                stop.set()
                pool.shutdown(wait=True)
    best, arg = lists[0]
    for other in lists[1:]:
        _merge(best, arg, *other)
    return best, arg


def _one_blas_thread():
    # the workers' GEMMs run side by side, one BLAS thread each (threadpoolctl, a dependency)
    return _blas_controller().limit(limits=1, user_api="blas")


@functools.lru_cache(maxsize=None)
def _blas_controller():
    # threadpoolctl's view of the loaded thread pools, found once: threadpool_limits scans the process's
    # libraries on every call (2-6 ms, most of a 1,000-point search on the 2-core CPU)
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def nearest_neighbors(A, n_neighbors: int, block: int = BLOCK, panel: int = PANEL, workers: int | None = None, *,
                      col_sq=None):
    """int64 array (n, n_neighbors): the indices of the ``n_neighbors`` nearest other rows of A (n, d) for every
    row by (key, index), GEMM-form keys in A's precision (:func:`search`), nearest key first: the candidates, not
    yet exact (:mod:`kkmgpu.kernels.knn_exact` certifies them). ``block`` and ``panel``: the products' rows and
    columns (tests shrink them to reach the edges)."""
    return search(A, n_neighbors, block=block, panel=panel, workers=workers, col_sq=col_sq)[1]


@njit(cache=True)
def _compact(keys, index, count, m):
    # keep the m least of the first count entries by (key, index), in their order (the buffer is in index order);
    # returns the m-th key, which a later (higher) index must beat strictly
    threshold = np.partition(keys[:count].copy(), m - 1)[m - 1]
    ties = m
    for c in range(count):
        ties -= keys[c] < threshold
    kept = 0
    for c in range(count):
        if keys[c] < threshold or (keys[c] == threshold and ties > 0):
            ties -= keys[c] == threshold
            keys[kept] = keys[c]
            index[kept] = index[c]
            kept += 1
    return threshold


@njit(parallel=True, cache=True)
def select_rows(D, m, keys, index):
    """In place: keys[r] and index[r] (each of length m, unsorted) the m least finite entries of the row D[r] and
    their columns, by (value, column): of equal values the lower column is taken; (+inf, -1) where a row has
    fewer. O(columns) a row, rows in parallel: a scan in column order keeps the entries under the m-th least so
    far in a buffer of 2m, cut back to m (a quickselect) when full."""
    for r in prange(D.shape[0]):
        row = D[r]
        buffer_keys = np.empty(2 * m, dtype=D.dtype)
        buffer_index = np.empty(2 * m, dtype=np.int64)
        count = 0
        bound = np.inf
        for j in range(row.shape[0]):
            if row[j] < bound:
                buffer_keys[count] = row[j]
                buffer_index[count] = j
                count += 1
                if count == 2 * m:
                    bound = _compact(buffer_keys, buffer_index, count, m)
                    count = m
        if count > m:
            _compact(buffer_keys, buffer_index, count, m)
            count = m
        for c in range(m):
            keys[r, c] = buffer_keys[c] if c < count else np.inf
            index[r, c] = buffer_index[c] if c < count else -1


@njit(parallel=True, cache=True)
def nearest_first(index, dist, k):
    """(index, dist) (r, k): each row's k first (dist, index) pairs of (index, dist) (r, m) in ascending order,
    ties to the lower index; rows in parallel (the CPU's re-ranking of long candidate lists)."""
    r = index.shape[0]
    out_index = np.empty((r, k), dtype=np.int64)
    out_dist = np.empty((r, k))
    for t in prange(r):
        by_index = np.argsort(index[t])
        order = by_index[np.argsort(dist[t][by_index], kind="mergesort")[:k]]
        out_index[t] = index[t][order]
        out_dist[t] = dist[t][order]
    return out_index, out_dist


@njit(parallel=True, cache=True)
def pair_distances(A, rows, index, scale):
    """float64 (len(rows), m): ||(a_i - a_j) scale||^2 for i = rows[t], j = index[t, q], summed in feature order
    from the float64 differences of A's values (``scale`` a power of two: exact); +inf where j < 0. The exact
    search's re-ranking (:func:`kkmgpu.kernels.knn_exact.exact_distances`; CuPy array code on a GPU)."""
    r, m = index.shape
    d = A.shape[1]
    out = np.empty((r, m))
    for t in prange(r):
        i = rows[t]
        for q in range(m):
            j = index[t, q]
            if j < 0:
                out[t, q] = np.inf
                continue
            s = 0.0
            for f in range(d):
                diff = (np.float64(A[i, f]) - np.float64(A[j, f])) * scale
                s += diff * diff
            out[t, q] = s
    return out
