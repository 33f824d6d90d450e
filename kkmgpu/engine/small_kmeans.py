"""Plain k-means of a small dense embedding on the CPU in one numba call: the spectral start's k-means.

The spectral start of the graph objectives (:func:`kkmgpu.methods.graph_spectral.starts`) runs ten k-means of the
(n, k) embedding E, each from one k-means++ start. Through the general driver (:func:`kkmgpu.engine.lloyd.run_restarts`
on :class:`kkmgpu.engine.embedding.EmbeddingOperator`) an iteration of a small embedding is a dozen NumPy and
BLAS calls of a few microseconds of work each, and the ten runs were the largest part of a small set's fit: 15 ms
of a 37 ms fit of wine (178 points, k = 3) and 34 of 66 ms of compound (2-core CPU), more than scikit-learn's whole
SpectralClustering there. :func:`kmeans` is the same algorithm in one compiled call per run:

- the seeding is :func:`kkmgpu.engine.lloyd.kmeans_plus_plus` (unit weights): the same draws from ``rng`` in the
  same order (one uniform for the first seed, then ``2 + int(log k)`` trials per seed), the same D^2 sampling,
  greedy choice and nearest-seed labels;
- the iterations are :func:`kkmgpu.engine.lloyd.lloyd`'s: S[i, c] = <e_i, sum_{j in c} e_j>, dist(i, c) =
  ||e_i||^2 - 2 S[i, c] / n_c + C_c / n_c^2 (the first of equal distances), stop when no point moves or the
  relative objective change is <= tol (the pending assignment then dropped), at most ``max_iter`` assignments;
- the count of distinct centres and the warnings are the driver's own (:func:`kkmgpu.engine.lloyd.distinct_centres`,
  ``_finish_restarts``).

Only the order of a few sums differs from the driver's BLAS products (the last bits of S). A run that empties a
cluster returns None and the caller runs the driver instead (:func:`kkmgpu.engine.lloyd.refill_empty_clusters`
stays the one rule for it). ``tests/test_small_kmeans.py`` checks the labels, objectives and iteration counts
against the driver.
"""

from __future__ import annotations

import math
import time

import numpy as np
from numba import njit

from kkmgpu.engine import lloyd as _lloyd

#: embeddings (n, k) with n k^2 up to this take :func:`kmeans` on the CPU: its loops are O(n k^2) per iteration
#: where the driver's BLAS products pay a fixed cost per call (one run, one thread, 2-core CPU: 178 x 3 0.41 against
#: 2.04 ms, 1,000 x 2 0.81 / 3.27, 2,000 x 10 2.6 / 4.4, 5,000 x 10 5.5 / 6.6; past it 3,100 x 31 23 / 15 ms)
SMALL = 2 ** 20


def kmeans(E, k, rng, *, max_iter, tol):
    """k-means of the rows of the float64 host array E (n, r) from one k-means++ start drawn from ``rng``: a
    :class:`kkmgpu.engine.lloyd.LloydRun` as ``run_restarts(EmbeddingOperator(E, ones), k, init="k-means++",
    n_init=1, ...)[0]`` gives it (its warnings included), or None where an assignment emptied a cluster (the
    draws from ``rng`` are then made: the caller starts from a generator in the same state)."""
    t0 = time.perf_counter()
    E = np.ascontiguousarray(E, dtype=np.float64)
    n_local_trials = 2 + int(math.log(k))
    first_draw = rng.random()
    draws = np.ascontiguousarray(rng.uniform(size=(k - 1, n_local_trials)))
    diag = (E * E).sum(axis=1)
    labels, history, n_iter, stop, sizes, within, cross = _run(E, diag, int(k), first_draw, draws, int(max_iter),
                                                               float(tol))
    if stop < 0:
        return None
    n_distinct = _distinct(E, labels, sizes, within, cross)
    reasons = ("max_iter", "no point moved", "relative objective change <= tol")
    run = _lloyd.LloydRun(labels=labels, objective=float(history[n_iter if stop != 1 else n_iter - 1]),
                          history=[float(v) for v in history[:n_iter + (stop != 1)]], n_iter=int(n_iter),
                          converged=stop > 0, sizes=sizes, within=within, seconds=time.perf_counter() - t0,
                          n_distinct=n_distinct, stop_reason=reasons[stop])
    return _lloyd._finish_restarts(run, [run], 0.0, k, max_iter, tol)[0]


def _distinct(E, labels, sizes, within, cross) -> int:
    """:func:`kkmgpu.engine.lloyd._count_distinct_centres` for unit weights on a float64 embedding."""
    if np.count_nonzero(sizes > 0) <= 1:
        return int(np.count_nonzero(sizes > 0))
    norm2 = float((E * E).sum(axis=0).max()) if E.shape[1] else 0.0
    spread = norm2 * sizes / np.where(sizes > 0, sizes, 1.0) ** 2 if norm2 else None
    return _lloyd.distinct_centres(cross, sizes, within, float(np.finfo(np.float64).eps), spread)


@njit(cache=True, nogil=True)
def _dot(E, i, j):
    s = 0.0
    for t in range(E.shape[1]):
        s += E[i, t] * E[j, t]
    return s


@njit(cache=True, nogil=True)
def _search(a, v, right):
    """np.searchsorted(a, v, side="right" if right else "left") on the sorted a (a plain loop: numba's own took
    seconds to compile)."""
    lo, hi = 0, a.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < v or (right and a[mid] == v):
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, nogil=True)
def _seeds(E, diag, k, first_draw, draws):
    """kmeans_plus_plus's seeds and labels (unit weights): the first seed by inverse CDF of the normalised
    cumulative sum, then per seed the trials by D^2 sampling and the one of least potential (the first of equal
    ones)."""
    n = E.shape[0]
    trials = draws.shape[1]
    cdf = np.empty(n)
    total = 0.0
    for i in range(n):
        total += 1.0 / n
        cdf[i] = total
    for i in range(n):
        cdf[i] /= total
    first = min(_search(cdf, first_draw, True), n - 1)
    centres = np.empty(k, dtype=np.int64)
    centres[0] = first
    chosen = np.zeros(n, dtype=np.bool_)
    chosen[first] = True
    closest = np.empty(n)
    potential = 0.0
    for i in range(n):
        closest[i] = max(diag[i] + diag[first] - 2.0 * _dot(E, first, i), 0.0)
        potential += closest[i]
    d = np.empty((trials, n))
    cumulative = np.empty(n)
    for j in range(1, k):
        total = 0.0
        for i in range(n):
            if potential > 0.0:
                total += closest[i]
            elif not chosen[i]:   # every point on a seed: uniform over the unchosen ones
                total += 1.0
            cumulative[i] = total
        best, best_potential, best_candidate = 0, np.inf, 0
        for t in range(trials):
            c = min(_search(cumulative, draws[j - 1, t] * cumulative[n - 1], False), n - 1)
            p = 0.0
            for i in range(n):
                value = min(closest[i], max(diag[i] + diag[c] - 2.0 * _dot(E, c, i), 0.0))
                d[t, i] = value
                p += value
            if t == 0 or p < best_potential:
                best, best_potential, best_candidate = t, p, c
        centres[j] = best_candidate
        chosen[best_candidate] = True
        for i in range(n):
            closest[i] = d[best, i]
        potential = best_potential
    labels = np.empty(n, dtype=np.int32)
    for i in range(n):
        best_c, best_d = 0, np.inf
        for c in range(k):
            value = diag[i] + diag[centres[c]] - 2.0 * _dot(E, centres[c], i)
            if value < best_d:
                best_c, best_d = c, value
        labels[i] = best_c
    for c in range(k):
        labels[centres[c]] = c
    return labels


@njit(cache=True, nogil=True)
def _totals(E, diag, labels, k, sums, S, sizes, within):
    """S, the sizes and totals of ``labels``; the objective."""
    n, r = E.shape
    sums[:] = 0.0
    sizes[:] = 0.0
    within[:] = 0.0
    for i in range(n):
        c = labels[i]
        sizes[c] += 1.0
        for t in range(r):
            sums[c, t] += E[i, t]
    for i in range(n):
        for c in range(k):
            s = 0.0
            for t in range(r):
                s += E[i, t] * sums[c, t]
            S[i, c] = s
        within[labels[i]] += S[i, labels[i]]
    objective = 0.0
    for i in range(n):
        objective += diag[i]
    lost = 0.0
    for c in range(k):
        if sizes[c] > 0:
            lost += within[c] / sizes[c]
    return objective - lost


@njit(cache=True, nogil=True)
def _assign(S, diag, sizes, within, labels, new_labels):
    """lloyd's assignment: (moved, whether a cluster is left empty)."""
    n, k = S.shape
    inv = np.empty(k)
    offset = np.empty(k)
    for c in range(k):
        inv[c] = 1.0 / sizes[c] if sizes[c] > 0 else -1.0
        offset[c] = within[c] * inv[c] * inv[c] if sizes[c] > 0 else 0.0
    counts = np.zeros(k, dtype=np.int64)
    moved = 0
    for i in range(n):
        best, best_d = -1, np.inf
        for c in range(k):
            if inv[c] < 0.0:
                continue
            value = diag[i] - 2.0 * S[i, c] * inv[c] + offset[c]
            if value < best_d:
                best, best_d = c, value
        if best < 0:
            best = labels[i]
        new_labels[i] = best
        counts[best] += 1
        if best != labels[i]:
            moved += 1
    empty = False
    for c in range(k):
        empty = empty or counts[c] == 0
    return moved, empty


@njit(cache=True, nogil=True)
def _run(E, diag, k, first_draw, draws, max_iter, tol):
    """(labels, objectives, n_iter, stop, sizes, within, cross): stop 0 max_iter, 1 no point moved, 2 the relative
    change <= tol, -1 a cluster emptied (the run abandoned)."""
    n, r = E.shape
    labels = _seeds(E, diag, k, first_draw, draws)
    sums = np.empty((k, r))
    S = np.empty((n, k))
    sizes = np.empty(k)
    within = np.empty(k)
    history = np.empty(max_iter + 1)
    history[0] = _totals(E, diag, labels, k, sums, S, sizes, within)
    new_labels = np.empty(n, dtype=np.int32)
    stop, n_iter = 0, 0
    if max_iter >= 1:
        moved, empty = _assign(S, diag, sizes, within, labels, new_labels)
        for n_iter in range(1, max_iter + 1):
            if empty:
                stop = -1
                break
            if moved == 0:
                stop = 1
                break
            labels, new_labels = new_labels, labels
            history[n_iter] = _totals(E, diag, labels, k, sums, S, sizes, within)
            if n_iter < max_iter:
                moved, empty = _assign(S, diag, sizes, within, labels, new_labels)
            if abs(history[n_iter - 1] - history[n_iter]) <= tol * abs(history[n_iter - 1]):
                stop = 2
                break
    cross = np.zeros((k, k))
    for i in range(n):
        for c in range(k):
            cross[labels[i], c] += S[i, c]
    return labels, history, n_iter, stop, sizes.copy(), within.copy(), cross
