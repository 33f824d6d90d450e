"""The Lloyd driver: one implementation of kernel k-means iterations for every backend and operator.

Per iteration it needs only the cluster sums S[i, c] = sum_{j in c} w_j K[i, j] (papers' Eq. 3-4),
which an *operator* produces (dense, sparse, tiled, embedding, and the workers' row blocks of
:mod:`kkmgpu.dask`), the weighted sizes n_c = sum_{j in c} w_j and the within-cluster totals
C_c = sum_{i in c} w_i S[i, c]:

    dist(i, c) = K_ii - 2 S[i, c] / n_c + C_c / n_c^2        (Eq. 4)
    objective  = sum_i w_i dist(i, label_i) = sum_i w_i K_ii - sum_c C_c / n_c

An operator has ``n``, ``weights``, ``backend``, ``diag``, ``total_diag``, ``rows(index)`` (k-means++),
``cluster_sums(labels, k)``, ``incremental_cost(n_moved)`` and optionally ``update_cluster_sums``. The driver
treats S as opaque: an operator whose S is not one array on ``backend`` (the Dask operator: one block per
worker) also provides ``totals(S, labels, k)``, ``assign(S, sizes, within, labels, counts)`` and
``cross(S, labels, k)``; the others get the single-device versions below.

An iteration makes one device-to-host transfer: the sizes and totals of the new S together with the next
assignment's moved count and cluster counts (the assignment runs before the host has read the objective; when the
objective says stop, its result is dropped). The incremental update is told the moved count from that transfer.
k-means++ seeding runs on the device: the draws are made on the host up front, one transfer at the end.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from kkmgpu import _progress, _warn
from kkmgpu._progress import progress_bar
from kkmgpu.backend.device import work_bytes
from kkmgpu.kernels.spec import compute_dtype


class ConvergenceWarning(UserWarning):
    """Lloyd iterations stopped at max_iter, or fewer distinct clusters than requested remain."""


@dataclass
class LloydRun:
    labels: object            # device int32 (n,)
    objective: float
    history: list
    n_iter: int
    converged: bool
    sizes: np.ndarray         # weighted n_c, float64 host (k,)
    within: np.ndarray        # C_c, float64 host (k,)
    seconds: float
    n_distinct: int
    stop_reason: str = "max_iter"


def _totals(operator, S, labels, k, xp):
    """Weighted sizes n_c, within-cluster totals C_c and the objective of ``labels`` from S."""
    if hasattr(operator, "totals"):
        return operator.totals(S, labels, k)
    own = xp.take_along_axis(S, labels[:, None].astype(xp.int64), axis=1)[:, 0]
    sizes_h, within_h = operator.backend.ops.cluster_totals(labels, operator.weights, own, k)
    nonempty = sizes_h > 0
    objective = operator.total_diag - float(np.sum(within_h[nonempty] / sizes_h[nonempty]))
    return sizes_h, within_h, objective


def _update(operator, labels, k, xp):
    """Cluster sums, weighted sizes, within-cluster totals and the objective of ``labels``."""
    S = operator.cluster_sums(labels, k)
    return (S, *_totals(operator, S, labels, k, xp))


def refill_empty_clusters(new_labels, min_dist, weights, k):
    """Move the points farthest from their centre into empty clusters (host arrays, in place).

    Empty clusters are filled in increasing index, each with the positive-weight point of largest
    ``min_dist`` whose cluster keeps at least one positive-weight point. Returns the number of
    clusters still empty (possible only with fewer than k positive-weight points).
    """
    positive = weights > 0
    counts = np.bincount(new_labels[positive], minlength=k)
    empty = np.flatnonzero(counts == 0)
    if empty.size == 0:
        return 0
    candidates = np.flatnonzero(positive)
    order = candidates[np.argsort(-min_dist[candidates], kind="stable")]
    pos = 0
    still_empty = 0
    for c in empty:
        while pos < order.size and counts[new_labels[order[pos]]] <= 1:
            pos += 1
        if pos >= order.size:
            still_empty += 1
            continue
        p = order[pos]
        pos += 1
        counts[new_labels[p]] -= 1
        new_labels[p] = c
        min_dist[p] = 0.0
        counts[c] += 1
    return still_empty


def _device_totals(operator, S, labels, k, xp):
    """(2, k): the weighted sizes n_c and within-cluster totals C_c of ``labels`` from S, left on the device (for an
    operator with its own ``totals``, on the host)."""
    if hasattr(operator, "totals"):
        sizes, within, _ = operator.totals(S, labels, k)
        return np.stack([sizes, within])
    own = xp.take_along_axis(S, labels[:, None].astype(xp.int64), axis=1)[:, 0]
    return operator.backend.ops.cluster_totals(labels, operator.weights, own, k, sync=False)


def _assign(operator, S, totals, labels, k, positive):
    """The assignment step without a transfer: (new labels, distance to the chosen centre, statistics), the
    statistics [number moved, points per cluster (k), and with ``positive`` (the indicator of positive weights)
    positive-weight points per cluster (k)] left on the device."""
    if hasattr(operator, "assign"):
        counts = np.empty(k, dtype=np.int64)
        new_labels, min_dist, n_changed = operator.assign(S, totals[0], totals[1], labels, counts)
        stats = np.r_[n_changed, counts]
    else:
        new_labels, min_dist, stats = operator.backend.ops.assign_labels(S, operator.diag, totals[0], totals[1],
                                                                         labels, sync=False)
    if positive is not None:
        xp = operator.backend.xp
        per_cluster = operator.backend.ops.cluster_totals(new_labels, positive, positive, k, sync=False)[0]
        stats = xp.concatenate([xp.asarray(stats).astype(xp.float64), per_cluster])
    return new_labels, min_dist, stats


def _fetch(backend, totals, step, k):
    """The one transfer of an iteration: (sizes, within) from ``totals`` and, host float64, the statistics of the
    pending assignment ``step`` (None when there is none)."""
    xp = backend.xp
    parts = [xp.asarray(totals).ravel()] + ([xp.asarray(step[2]).astype(xp.float64)] if step is not None else [])
    flat = np.asarray(backend.to_host(xp.concatenate(parts) if len(parts) > 1 else parts[0]), dtype=np.float64)
    return flat[:k], flat[k:2 * k], (flat[2 * k:] if step is not None else None)


def _objective(operator, sizes, within):
    nonempty = sizes > 0
    return operator.total_diag - float(np.sum(within[nonempty] / sizes[nonempty]))


def _count_distinct_centres(operator, labels, S, sizes, within, k, xp) -> int:
    """Clusters whose feature-space centres are pairwise distinct (duplicate points can merge them)."""
    if np.count_nonzero(sizes > 0) <= 1:
        return int(np.count_nonzero(sizes > 0))
    if hasattr(operator, "cross"):
        cross = operator.cross(S, labels, k)
    else:
        Y = xp.zeros((labels.shape[0], k), dtype=xp.float64)
        Y[xp.arange(labels.shape[0]), labels] = operator.weights
        cross = operator.backend.to_host(Y.T @ S)  # cross[a, b] = sum_{i in a} w_i S[i, b] = <m_a, m_b> n_a n_b
    spread = None
    norm2 = getattr(operator, "spectral_norm", None)
    if norm2:  # ||y_c||^2 = sum_{i in c} w_i^2 / n_c^2 for the noise term of distinct_centres
        squares = operator.backend.to_host(xp.bincount(labels, weights=operator.weights ** 2, minlength=k))
        spread = norm2 * squares / np.where(sizes > 0, sizes, 1.0) ** 2
    return distinct_centres(cross, sizes, within, _rounding_eps(operator), spread)


#: Two centres a, b coincide when their squared distance is at most max(DISTINCT_RELATIVE, DISTINCT_ROUNDING eps)
#: times the largest squared centre norm, plus DISTINCT_ROUNDING eps ||K||_2 (||y_a||^2 + ||y_b||^2) for an
#: eigen-embedding, eps that of the precision the kernel values were computed in. The first is the relative floor
#: of float64 and, in float32, the rounding of K, the way kkmgpu._degenerate.ROUNDING bounds an objective's
#: rounding. The second is an eigensolver's backward error: noise eigenvalues up to c eps ||K||_2 (kept where
#: positive) move the centres y_a, y_b (weights / n_c on the members) of copies of one point
#: (y_a - y_b)^T E (y_a - y_b) apart. At 1e-7 alone (below float32's eps) two clusters of one point counted as
#: distinct on an H100 (method="eigen", float32, 2026-11-26).
DISTINCT_RELATIVE = 1e-7
DISTINCT_ROUNDING = 64


def _rounding_eps(operator) -> float:
    """eps of the arithmetic the operator's kernel values come from: its ``value_dtype`` where it keeps values in
    another precision (the embedding's float64 copy of a float32 decomposition), else its K's or features' dtype
    (float16 storage is computed in float32)."""
    dtype = getattr(operator, "value_dtype", None)
    if dtype is None:
        values = getattr(operator, "K", None)
        dtype = getattr(values if values is not None else getattr(operator, "A", None), "dtype", np.float64)
    return float(np.finfo(compute_dtype(np.dtype(dtype))).eps)


def distinct_centres(cross, sizes, within, eps=0.0, spread=None) -> int:
    """How many nonempty clusters have pairwise distinct centres, from cross[a, b] = sum_{i in a} w_i S[i, b]
    (``eps``: that of the kernel values' precision; ``spread``: ||K||_2 ||y_c||^2 per cluster for an
    eigen-embedding, else None; see DISTINCT_ROUNDING)."""
    nonempty = np.flatnonzero(sizes > 0)
    if nonempty.size <= 1:
        return int(nonempty.size)
    if nonempty.size <= FEW_CENTRES:
        return _distinct_few(np.asarray(cross, dtype=np.float64).tolist(), np.asarray(sizes, dtype=np.float64).tolist(),
                             np.asarray(within, dtype=np.float64).tolist(), nonempty.tolist(), eps,
                             None if spread is None else np.asarray(spread, dtype=np.float64).tolist())
    norm = within / np.where(sizes > 0, sizes, 1.0) ** 2
    scale = max(float(np.max(np.abs(norm[nonempty]))), np.finfo(float).tiny)
    tolerance = max(DISTINCT_RELATIVE, DISTINCT_ROUNDING * eps) * scale
    # every pair's test at once (the same arithmetic per pair as one at a time), then the greedy pass over them
    sub = np.ix_(nonempty, nonempty)
    d2 = norm[nonempty][:, None] + norm[nonempty][None, :] - 2.0 * np.asarray(cross, dtype=np.float64)[sub] / (
        sizes[nonempty][:, None] * sizes[nonempty][None, :])
    limit = tolerance + (0.0 if spread is None else DISTINCT_ROUNDING * eps * (spread[nonempty][:, None]
                                                                              + spread[nonempty][None, :]))
    close = d2 <= limit
    distinct = []
    for a in range(nonempty.size):
        if not close[a, distinct].any():
            distinct.append(a)
    return len(distinct)


#: up to this many nonempty clusters, :func:`distinct_centres` tests the pairs in Python floats (the same arithmetic
#: in the same order, so the same count): NumPy's calls on arrays of a few entries took 120 microseconds at k = 3
#: (2-core CPU), paid at the end of every run, ten runs and more per graph fit
FEW_CENTRES = 12


def _divide(x: float, y: float) -> float:
    """x / y as NumPy's float64 gives it where y is 0 (a size's square underflowed): inf of x's sign, or NaN."""
    try:
        return x / y
    except ZeroDivisionError:
        return math.nan if x == 0.0 or x != x else math.copysign(math.inf, x) * math.copysign(1.0, y)


def _distinct_few(cross, sizes, within, nonempty, eps, spread) -> int:
    """:func:`distinct_centres` on Python lists (``nonempty``: the clusters of positive size, in order)."""
    norm = {c: _divide(within[c], sizes[c] * sizes[c]) for c in nonempty}
    scale = max(max(abs(norm[c]) for c in nonempty), float(np.finfo(float).tiny))
    tolerance = max(DISTINCT_RELATIVE, DISTINCT_ROUNDING * eps) * scale
    rounding = DISTINCT_ROUNDING * eps
    distinct = []
    for a in nonempty:
        row = cross[a]
        for b in distinct:
            limit = tolerance + (0.0 if spread is None else rounding * (spread[a] + spread[b]))
            if norm[a] + norm[b] - _divide(2.0 * row[b], sizes[a] * sizes[b]) <= limit:
                break
        else:
            distinct.append(a)
    return len(distinct)


#: After this many incremental updates in a row, S is recomputed in full (bounds rounding drift).
FULL_REFRESH_EVERY = 16


def lloyd(operator, init_labels, k, *, max_iter=300, tol=1e-6, verbose=False, restart=None,
          update="auto", bar=None) -> LloydRun:
    """Kernel k-means iterations from ``init_labels`` (device int32) until no label moves,
    the relative objective change is <= tol, or max_iter assignment steps.

    ``update``: how S follows an assignment step. "auto" updates it from the moved points when that
    reads fewer bytes of K than a full pass (and the operator supports it), "incremental" always
    does, "full" never does; either way S is recomputed in full after FULL_REFRESH_EVERY
    incremental steps in a row. ``bar`` (a :func:`kkmgpu._progress.progress_bar`) shows the iteration,
    objective and moved points.
    """
    backend = operator.backend
    xp = backend.xp
    t0 = backend.timer()
    # zero weights: the assignment also counts each cluster's positive-weight points (an empty cluster is one
    # without any); otherwise its counts of all points tell
    positive = (operator.weights > 0).astype(xp.float64) if bool((operator.weights == 0).any()) else None
    labels = backend.asarray(init_labels, dtype=np.int32)
    S = operator.cluster_sums(labels, k)
    totals = _device_totals(operator, S, labels, k, xp)
    step = _assign(operator, S, totals, labels, k, positive) if max_iter >= 1 else None
    sizes, within, stats = _fetch(backend, totals, step, k)
    objective = _objective(operator, sizes, within)
    history = [objective]
    since_full = 0
    converged = False
    stop_reason = "max_iter"
    n_iter = 0
    name = getattr(operator, "log_name", "kkmgpu")
    prefix = f"[{name}] init {restart}: " if restart is not None else f"[{name}] "
    if verbose:
        print(f"{prefix}iteration 0: objective {objective:.10g}")
    for n_iter in range(1, max_iter + 1):
        new_labels, min_dist, _ = step
        n_changed = int(stats[0])
        counts = stats[1 + k:] if positive is not None else stats[1:]  # positive-weight points per cluster
        if counts.min() == 0:
            labels_h = backend.to_host(new_labels).astype(np.int32)
            refill_empty_clusters(labels_h, backend.to_host(min_dist), backend.to_host(operator.weights), k)
            new_labels = backend.asarray(labels_h)
            n_changed = int((new_labels != labels).sum())
        if n_changed == 0:
            converged, stop_reason = True, "no point moved"
            if verbose:
                print(f"{prefix}iteration {n_iter}: no point changed cluster, converged")
            break
        use_incremental = (update == "incremental" or (
            update == "auto" and operator.incremental_cost(n_changed) < 1.0)) \
            and hasattr(operator, "update_cluster_sums") and since_full < FULL_REFRESH_EVERY
        if use_incremental:
            moved = {"n_moved": n_changed} if getattr(operator, "takes_moved_count", False) else {}
            S = operator.update_cluster_sums(S, labels, new_labels, **moved)
            since_full += 1
        else:
            S = operator.cluster_sums(new_labels, k)
            since_full = 0
        labels = new_labels
        totals = _device_totals(operator, S, labels, k, xp)
        # the next assignment before the transfer, so that one transfer serves both; dropped if this step ends the run
        step = _assign(operator, S, totals, labels, k, positive) if n_iter < max_iter else None
        sizes, within, stats = _fetch(backend, totals, step, k)
        new_objective = _objective(operator, sizes, within)
        history.append(new_objective)
        if bar is not None:
            bar.set_postfix_str(f"{'' if restart is None else f'init {restart}, '}iteration {n_iter}: "
                                f"objective {new_objective:.6g}, {n_changed} moved")
        if verbose:
            print(f"{prefix}iteration {n_iter}: objective {new_objective:.10g}, {n_changed} points moved")
        done = abs(objective - new_objective) <= tol * abs(objective)
        objective = new_objective
        if done:
            converged, stop_reason = True, "relative objective change <= tol"
            if verbose:
                print(f"{prefix}relative objective change <= tol={tol:g}, converged")
            break
    n_distinct = _count_distinct_centres(operator, labels, S, sizes, within, k, xp)
    return LloydRun(labels=labels, objective=objective, history=history, n_iter=n_iter,
                    converged=converged, sizes=sizes, within=within,
                    seconds=backend.timer() - t0, n_distinct=n_distinct, stop_reason=stop_reason)


# --- initialisation ----------------------------------------------------------------------------

def random_partition(n, k, rng: np.random.Generator) -> np.ndarray:
    """A random partition: uniform labels, with k random points fixed to 0..k-1 so none is empty."""
    labels = rng.integers(0, k, size=n).astype(np.int32)
    labels[rng.permutation(n)[:k]] = np.arange(k, dtype=np.int32)
    return labels


def kmeans_plus_plus(operator, k, rng: np.random.Generator, n_local_trials=None) -> np.ndarray:
    """Greedy k-means++ seeding in feature space, with d(i, j)^2 = K_ii + K_jj - 2 K_ij.

    Returns the initial labels (host int32): every point assigned to its nearest seed (as scikit-learn's
    ``_kmeans_plusplus`` seeds, with sample weights in the sampling).

    Runs on the operator's device: the distances, the D^2 sampling (a cumulative sum searched for the draws) and
    the choice among the trials. The draws are made on the host first, in the order a host loop makes them (one
    uniform for the first seed, as ``rng.choice(n, p=w / sum w)`` does, then ``n_local_trials`` per seed), and
    sent at once; the labels come back at the end: no transfer per seed when the operator gives kernel rows on
    the device (``device_rows``), otherwise one per seed (the trials' indices). When every point coincides with a
    seed (zero potential) the next seed is drawn uniformly among the unchosen positive-weight points.
    """
    backend = operator.backend
    rows = _rows_on_device(operator)
    centres = kmeans_plus_plus_seeds(operator, k, rng, n_local_trials, rows)
    diag = backend.asarray(operator.diag, dtype=np.float64)
    return backend.to_host(_nearest_seed(operator, rows, centres, diag, k)).astype(np.int32)


def kmeans_plus_plus_seeds(operator, k, rng: np.random.Generator, n_local_trials=None, rows=None):
    """The k seeds of :func:`kmeans_plus_plus` (device int64, in the order chosen)."""
    backend = operator.backend
    xp = backend.xp
    n = operator.n
    w = backend.asarray(operator.weights, dtype=np.float64)
    diag = backend.asarray(operator.diag, dtype=np.float64)
    rows = _rows_on_device(operator) if rows is None else rows
    if n_local_trials is None:
        n_local_trials = 2 + int(math.log(k))
    first_draw = rng.random()
    draws = backend.asarray(rng.uniform(size=(k - 1, n_local_trials)))
    # the first seed as rng.choice(n, p=w / w.sum()) draws it: inverse CDF of the normalised cumulative sum
    cdf = xp.cumsum(w / w.sum())
    cdf /= cdf[-1]
    first = xp.searchsorted(cdf, backend.asarray(np.array([first_draw])), side="right")
    centres = xp.empty(k, dtype=xp.int64)
    centres[:1] = first
    chosen = xp.zeros(n, dtype=bool)
    chosen[first] = True
    positive = w > 0
    closest = xp.maximum(diag + diag[first] - 2.0 * rows(first)[0], 0.0)
    potential = w @ closest
    for j in range(1, k):
        # D^2 sampling; with zero potential (every point on a seed) uniform over the unchosen positive-weight
        # points, or over the unchosen points when none is left
        fallback = positive & ~chosen
        fallback = xp.where(fallback.any(), fallback, ~chosen).astype(xp.float64)
        cumulative = xp.cumsum(xp.where(potential > 0, w * closest, fallback))
        candidates = xp.minimum(xp.searchsorted(cumulative, draws[j - 1] * cumulative[-1]), n - 1)
        d = xp.maximum(diag[None, :] + diag[candidates][:, None] - 2.0 * rows(candidates), 0.0)
        d = xp.minimum(closest[None, :], d)
        potentials = d @ w
        best = xp.argmin(potentials)
        centres[j] = candidates[best]
        chosen[candidates[best]] = True
        closest = d[best]
        potential = potentials[best]
    return centres


def _rows_on_device(operator):
    """index (device int64) -> float64 kernel rows K[index, :] on the operator's device: the operator's own
    ``device_rows``, or its host ``rows`` sent over."""
    if hasattr(operator, "device_rows"):
        return operator.device_rows
    backend = operator.backend
    return lambda index: backend.asarray(operator.rows(backend.to_host(index)), dtype=np.float64)


def _nearest_seed(operator, rows, centres, diag, k):
    """Each point's nearest seed (the first of equal ones), the seeds in their own clusters; seeds in groups whose
    rows fit a work buffer."""
    xp = operator.backend.xp
    n = operator.n
    per_group = max(1, work_bytes(2 * 8 * k * n, operator.backend, 2 * 8 * n) // (2 * 8 * n))
    labels = nearest = None
    for c0 in range(0, k, per_group):
        group = centres[c0:c0 + per_group]
        dist = diag[None, :] + diag[group][:, None] - 2.0 * rows(group)
        part = xp.argmin(dist, axis=0)
        value = xp.take_along_axis(dist, part[None, :], axis=0)[0]
        if labels is None:
            labels, nearest = part, value
        else:
            closer = value < nearest
            labels = xp.where(closer, part + c0, labels)
            nearest = xp.where(closer, value, nearest)
    labels = labels.astype(xp.int32)
    labels[centres] = xp.arange(k, dtype=xp.int32)  # a seed belongs to its own cluster
    return labels


def initial_labels(init, n, k, rng, seeding_rows):
    """Labels to start from: a random partition, k-means++ seeds, or the given labels.

    ``seeding_rows`` is the operator k-means++ reads kernel rows from (``.rows``, ``.diag``, ...).
    """
    if isinstance(init, str):
        if init == "random":
            return random_partition(n, k, rng)
        return kmeans_plus_plus(seeding_rows, k, rng)
    return np.asarray(init, dtype=np.int32)


def run_restarts(operator, k, *, init, n_init, max_iter, tol, rng, verbose, update="auto", progress=None):
    """Run Lloyd from ``n_init`` initialisations; keep the lowest objective. Returns (best, seconds list).

    ``progress``: a bar over the initialisations, its text following each iteration (None: as the
    enclosing :func:`kkmgpu._progress.scope` says, i.e. ``fit(progress=...)``).
    """
    progress = _progress.active() if progress is None else progress
    runs = []
    with progress_bar(n_init, desc="kernel k-means", unit="init", enabled=progress) as bar:
        best, init_seconds = _restarts(operator, k, init, n_init, max_iter, tol, rng, verbose, update, bar, runs)
    return _finish_restarts(best, runs, init_seconds, k, max_iter, tol)


def _restarts(operator, k, init, n_init, max_iter, tol, rng, verbose, update, bar, runs):
    best = None
    init_seconds = 0.0
    for r in range(n_init):
        t0 = time.perf_counter()
        labels0 = initial_labels(init, operator.n, k, rng, operator)
        init_seconds += time.perf_counter() - t0
        run = lloyd(operator, labels0, k, max_iter=max_iter, tol=tol, verbose=verbose, update=update,
                    restart=r if n_init > 1 else None, bar=bar)
        bar.update()
        runs.append(run)
        if verbose and n_init > 1:
            print(f"[{getattr(operator, 'log_name', 'kkmgpu')}] init {r}: objective {run.objective:.10g} after "
                  f"{run.n_iter} iterations")
        if best is None or run.objective < best.objective:
            best = run
    return best, init_seconds


def _finish_restarts(best, runs, init_seconds, k, max_iter, tol):
    """The warnings of :func:`run_restarts`, attributed to the user's line."""
    if not best.converged:
        _warn.warn(f"kernel k-means did not converge in max_iter={max_iter} iterations "
                   f"(last relative objective change above tol={tol:g}); increase max_iter.", ConvergenceWarning)
    if best.n_distinct < k:
        _warn.fewer_distinct(best.n_distinct, k, ConvergenceWarning)
    return best, runs, init_seconds
