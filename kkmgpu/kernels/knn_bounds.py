"""Exact nearest neighbours with principal-component lower bounds (CPU): the same neighbours as the brute-force
search of :mod:`kkmgpu.kernels.knn_cpu`, for a fraction of its products on data whose variance sits in a few
directions (images, embeddings), and the brute-force search itself where it would not pay.

Rotate the centred points onto their principal axes, y = V^T (x - mean) (V orthonormal: distances unchanged),
and keep the first ``g`` coordinates p and the length r of the rest. For any two points

    ||x_i - x_j||^2 = ||p_i - p_j||^2 + ||t_i - t_j||^2 >= ||p_i - p_j||^2 + (r_i - r_j)^2 = ||z_i - z_j||^2,

z = (p, r) in g + 1 dimensions. So:

1. the brute-force search on z (g + 1 features instead of d) gives each point its ``n_candidates`` least bounds;
2. each point's candidates are walked in order of bound, their exact float64 distances computed directly from
   the rows of A, until a bound exceeds the point's current ``n_neighbors``-th exact distance tau (less a
   rounding margin): that candidate, every later one and every point off the list (whose bounds are no less) are
   farther than tau, so the point's neighbours are final (certified);
3. a point whose list ran out first takes its bounds to all points (one row of z products) and walks, in order of
   bound, every point whose bound is within its tau: exact as well.

Whether and with how many principal axes is decided on a sample of rows (:func:`plan`): their true neighbour
distances and their bounds at each width of ``GRID`` estimate the cost of every choice against the brute-force
search, in units of one feature of the half-matrix product pass, from costs measured on a 2-core CPU. On
MNIST-70k (784 pixels, 10 neighbours) it picks 192 axes and 40 candidates, and the search takes 15 s against
29 s for brute force (``bench/bench_graphs.py search``). On data without a few dominant directions it keeps
the brute-force search. The sampled rows' counts include the rounding margin (below): on rank-1 data it covers
every point, and the plan keeps the brute-force search. A planned search measures itself after its candidate walks
and falls back to the brute-force search where walking the uncertified rows would cost more (``abandoned`` in the
report).

The rounding margin covers the float rounding of the centred rows, the rotation and the products on z (a
worst-case bound, 4 (d + g + 8) u (||z_i|| + max ||z||)^2, u the unit roundoff of A's precision): a candidate
is ruled out only when its bound exceeds tau by more than that.
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit, prange

from kkmgpu.kernels import knn_cpu
from kkmgpu.kernels.knn_cpu import _insert

__all__ = ["GRID", "nearest_neighbors", "plan"]

#: principal axes the plan considers (those under d / 2)
GRID = (16, 32, 48, 64, 96, 128, 192, 256, 384)
#: rows the plan samples, and the entries of its (sampled rows, n) products at a time
SAMPLE = 256
PLAN_ENTRIES = 2**24
#: below these the brute-force search is cheap enough not to plan at all
MIN_ROWS, MIN_FEATURES = 8192, 64
#: the plan prunes only when its estimate is under this fraction of the brute-force search's
PAYS = 0.8
#: a row whose candidates ran out: its products with every point, its scan and its walk, in features of the pass
#: (MNIST-70k, 2 cores: 0.38 ms a row)
UNCERTIFIED = 170


def _epilogue(k: int) -> float:
    # the passes' cost per pair, in features of the product (MNIST-70k, 2 cores: 10 neighbours about 80, 32 about
    # 110, 64 about 200)
    return max(80.0, 24.0 + 2.75 * k)


@njit(nogil=True, cache=True)
def _walk(A, i, cand, bound, margin, best, arg) -> bool:
    """Row i's exact neighbours from candidates in ascending ``bound`` (lower bounds of their squared distances,
    to within ``margin``), into row i of best/arg ((dist, index) ascending): True once a bound rules out the
    rest."""
    k = best.shape[1]
    d = A.shape[1]
    for p in range(cand.shape[0]):
        j = cand[p]
        if j < 0:
            break
        if arg[i, k - 1] >= 0 and bound[p] - margin > best[i, k - 1]:
            return True
        if j == i:
            continue
        s = 0.0
        for t in range(d):
            diff = np.float64(A[i, t]) - np.float64(A[j, t])
            s += diff * diff
        if s < best[i, k - 1] or (s == best[i, k - 1] and j < arg[i, k - 1]):
            _insert(best, arg, i, s, j)
    return False


@njit(parallel=True, cache=True)
def _walk_lists(A, cand, bound, margin, best, arg, certified):
    for i in prange(A.shape[0]):
        certified[i] = _walk(A, i, cand[i], bound[i], margin[i], best, arg)


@njit(parallel=True, cache=True)
def _walk_all(A, rows, G, zsq, margin, best, arg):
    # rows whose candidate lists ran out: their bounds to every point (G: their products with all of z), every
    # point within tau walked in order of bound
    n = G.shape[1]
    k = best.shape[1]
    for t in prange(rows.shape[0]):
        i = rows[t]
        tau = best[i, k - 1] + margin[i]
        bound = np.empty(n)
        near = np.empty(n, dtype=np.int64)
        m = 0
        for j in range(n):
            b = zsq[i] + zsq[j] - 2.0 * G[t, j]
            if b <= tau:
                bound[m] = b
                near[m] = j
                m += 1
        order = np.argsort(bound[:m], kind="mergesort")
        best[i, :] = np.inf
        arg[i, :] = -1
        _walk(A, i, near[:m][order], bound[:m][order], margin[i], best, arg)


def _principal_axes(A, sample: int = 16384, seed: int = 0):
    # (mean, V): float64, V's columns the principal axes by decreasing variance (of a sample of rows: any
    # orthonormal V keeps the bounds valid, a sample's axes are as good as all rows')
    n = A.shape[0]
    mean = A.mean(axis=0, dtype=np.float64)
    rows = np.sort(np.random.default_rng(seed).choice(n, size=min(n, sample), replace=False))
    Xc = A[rows] - mean.astype(A.dtype)
    _, V = np.linalg.eigh((Xc.T @ Xc).astype(np.float64))
    return mean, np.ascontiguousarray(V[:, ::-1])


def _rotated(A, mean, V, widths, chunk: int = 8192):
    """(P, tails): the first max(widths) rotated coordinates (n, max(widths)) in A's precision, and for every
    width g the length of the coordinates from g on (n, len(widths)), float64, summed over the stretches between
    widths (sums of squares: nothing cancels)."""
    n, d = A.shape
    m, Vt = mean.astype(A.dtype), V.astype(A.dtype)
    gmax = max(widths)
    P = np.empty((n, gmax), dtype=A.dtype)
    tails = np.empty((n, len(widths)))
    edges = list(widths) + [d]
    for i0 in range(0, n, chunk):
        Y = (A[i0:i0 + chunk] - m) @ Vt
        P[i0:i0 + chunk] = Y[:, :gmax]
        acc = np.zeros(Y.shape[0])
        for w in range(len(widths) - 1, -1, -1):
            acc += np.einsum("ij,ij->i", Y[:, edges[w]:edges[w + 1]], Y[:, edges[w]:edges[w + 1]], dtype=np.float64)
            tails[i0:i0 + chunk, w] = np.sqrt(acc)
    return P, tails


@njit(parallel=True, cache=True)
def _survivors(psq_rows, psq, cross, tail_rows, tail, tau, counts, w):
    # counts[s, w]: the points whose bound at width w is within the sampled row s's tau
    for s in prange(cross.shape[0]):
        c = 0
        for j in range(cross.shape[1]):
            dt = tail_rows[s] - tail[j]
            c += psq_rows[s] + psq[j] - 2.0 * cross[s, j] + dt * dt <= tau[s]
        counts[s, w] = c


def _margin(zsq, d: int, g: int, dtype):
    """The rounding margin of each point's bounds (module docstring), from the squared norms of z at width g."""
    znorm = np.sqrt(zsq)
    return 4.0 * (d + g + 8) * (np.finfo(dtype).eps / 2) * (znorm + znorm.max()) ** 2


def _abandon(uncertified: float, axes: int, n_neighbors: int, d: int) -> bool:
    """Whether the rows whose lists ran out (the fraction ``uncertified``), each walked against every point,
    would cost more than the brute-force search of all rows (the plan's units)."""
    return uncertified * 2.0 * (axes + 2 + UNCERTIFIED) > d + _epilogue(n_neighbors)


def plan(A, n_neighbors: int, *, sample: int = SAMPLE, seed: int = 0):
    """``(choice, rotation)``: choice (axes, n_candidates) for the bounded search of A's ``n_neighbors`` nearest
    neighbours, or None where the brute-force search is estimated cheaper; rotation (mean, V, P, tails, widths)
    (:func:`_rotated`), or None where there was nothing to plan."""
    n, d = A.shape
    widths = tuple(g for g in GRID if g <= d // 2)
    if not widths or n <= 2 * n_neighbors + 2:
        return None, None
    mean, V = _principal_axes(A)
    P, tails = _rotated(A, mean, V, widths)
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(n, size=min(sample, n), replace=False))
    sq = np.einsum("ij,ij->i", A, A, dtype=np.float64)
    psq = np.zeros((len(widths), n))
    g0 = 0
    for w, g in enumerate(widths):
        psq[w] = (psq[w - 1] if w else 0.0) + np.einsum("ij,ij->i", P[:, g0:g], P[:, g0:g], dtype=np.float64)
        g0 = g
    tails_by_width = np.ascontiguousarray(tails.T)
    counts = np.zeros((rows.size, len(widths)), dtype=np.int64)
    group = max(1, min(rows.size, PLAN_ENTRIES // n))   # sampled rows at a time: (group, n) products
    for s0 in range(0, rows.size, group):
        some = rows[s0:s0 + group]
        D = A[some] @ A.T                                # the sampled rows' distances, less their own norms
        D *= -2
        D += sq.astype(A.dtype)[None, :]
        D[np.arange(some.size), some] = np.inf
        tau = (np.partition(D, n_neighbors - 1, axis=1)[:, n_neighbors - 1] + sq[some]) * (1 + 1e-3)
        del D
        cross = np.zeros((some.size, n), dtype=A.dtype)
        g0 = 0
        for w, g in enumerate(widths):
            cross += P[some, g0:g] @ P[:, g0:g].T
            g0 = g
            tail = tails_by_width[w]
            reach = tau + _margin(psq[w] + tail * tail, d, g, A.dtype)[some]   # what the walks will reach
            _survivors(psq[w, some], psq[w], cross, tail[some], tail, reach, counts[s0:s0 + group], w)
    counts -= 1   # each sampled row's own bound, 0
    brute = d + _epilogue(n_neighbors)
    best = (PAYS * brute, None)
    rotate = 4.0 * d * d / n
    for w, g in enumerate(widths):
        survivors = counts[:, w]
        walk = 8.0 * d * (survivors.mean() + 1) / n
        for q in (0.8, 0.9, 0.95, 0.98):
            K = int(min(n - 1, max(n_neighbors + 1, np.ceil(np.quantile(survivors, q)) + 1)))
            uncertified = float(np.mean(survivors >= K))
            cost = rotate + (g + 2) + _epilogue(K) + uncertified * 2.0 * (g + 2 + UNCERTIFIED) + walk
            if cost < best[0]:
                best = (cost, (g, K))
    return best[1], (mean, V, P, tails, widths)


def nearest_neighbors(A, n_neighbors: int, *, prune="auto", axes=None, n_candidates=None, distances=False,
                      chunk: int = 512, report: dict | None = None):
    """int64 array (n, n_neighbors): the indices of the ``n_neighbors`` nearest other rows of A (n, d) for every
    row, nearest first, by exact float64 distances of the rows of A (ties to the lower index). With
    ``distances``: (index, sq), sq their float64 squared distances.

    ``prune``: "auto" plans (:func:`plan`) at n >= MIN_ROWS and d >= MIN_FEATURES, else runs the certified
    brute-force search (:func:`kkmgpu.kernels.knn_exact.search` on :func:`kkmgpu.kernels.knn_cpu.search`), or up
    to knn_tree.MAX_FEATURES features SciPy's k-d tree with the same certificate (:mod:`kkmgpu.kernels.knn_tree`,
    the same lists); True
    prunes, with ``axes`` and ``n_candidates`` if given (tests), else with the plan's choice if it has one; False
    never prunes. ``report``: a dict that takes the route, the choice, the seconds of each step and the rows
    certified from their lists (``bench/bench_graphs.py search``).
    """
    from kkmgpu.backend.device import Backend
    from kkmgpu.kernels import knn_exact

    n, d = A.shape
    report = {} if report is None else report
    clock = time.perf_counter
    t = clock()

    def brute():
        import numba

        from kkmgpu.kernels import knn_tree

        found = knn_tree.search(A, n_neighbors, workers=numba.get_num_threads(), report=report)
        route = "k-d tree" if found is not None else "brute force"
        index, sq = found if found is not None else knn_exact.search(A, n_neighbors, Backend("cpu"), report=report)
        report.update(route=route, seconds={"search": clock() - t})
        return (index, sq) if distances else index

    if prune is False or (prune == "auto" and (n < MIN_ROWS or d < MIN_FEATURES)):
        return brute()
    original = A
    # norms beyond float32's or float64's range (X * 1e20, X * 1e-25): a power of two brings them back, exactly
    p = knn_exact.scale_exponent(float(np.abs(A).max()) ** 2 * d, A.dtype)
    if p:
        A = A * A.dtype.type(2.0 ** -p)
    planned = axes is None or n_candidates is None
    if planned:
        choice, rotation = plan(A, n_neighbors)
        if choice is None:
            A = original
            return brute()
        axes, n_candidates = choice
        _, _, P, tails, widths = rotation
        w = widths.index(axes)
    else:
        axes = int(min(axes, d))
        mean, V = _principal_axes(A)
        P, tails = _rotated(A, mean, V, (axes,))
        w = 0
    seconds = {"plan": clock() - t}
    Z = np.empty((n, axes + 1), dtype=A.dtype)
    Z[:, :axes] = P[:, :axes]
    Z[:, axes] = tails[:, w]
    del P, tails
    n_candidates = int(min(n - 1, max(n_neighbors, n_candidates)))
    t = clock()
    keys, cand = knn_cpu.search(Z, n_candidates)
    seconds["search_z"] = clock() - t
    zsq = np.einsum("ij,ij->i", Z, Z, dtype=np.float64)
    bound = keys.astype(np.float64) + zsq[:, None]
    margin = _margin(zsq, d, axes, A.dtype)
    best = np.full((n, n_neighbors), np.inf)
    arg = np.full((n, n_neighbors), -1, dtype=np.int64)
    certified = np.zeros(n, dtype=np.bool_)
    t = clock()
    _walk_lists(A, cand, bound, margin, best, arg, certified)
    seconds["walk_lists"] = clock() - t
    rest = np.flatnonzero(~certified) if n_candidates < n - 1 else np.empty(0, dtype=np.int64)
    if planned and prune == "auto" and _abandon(rest.size / n, axes, n_neighbors, d):
        # the plan misjudged (its sample against all rows): measured, the brute-force search is cheaper now
        report["abandoned"] = {"choice": (axes, n_candidates), "certified": 1.0 - rest.size / n, "seconds": seconds}
        A, t = original, clock()
        return brute()
    t = clock()   # (with every point every point's candidate, the walks saw them all)
    for r0 in range(0, rest.size, chunk):
        rows = rest[r0:r0 + chunk]
        _walk_all(A, rows, Z[rows] @ Z.T, zsq, margin, best, arg)
    seconds["walk_all"] = clock() - t
    report.update(route="bounded", choice=(axes, n_candidates), seconds=seconds,
                  certified=1.0 - rest.size / n, walked_all_rows=int(rest.size))
    if p:
        best *= 2.0 ** p
        best *= 2.0 ** p
    return (arg, best) if distances else arg
