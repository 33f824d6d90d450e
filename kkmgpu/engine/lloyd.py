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
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass

import numpy as np

from kkmgpu import _progress
from kkmgpu._progress import progress_bar


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


def _assign(operator, S, sizes, within, labels, counts):
    """The assignment step: (new labels, distance to the chosen centre, number moved); ``counts`` filled in."""
    if hasattr(operator, "assign"):
        return operator.assign(S, sizes, within, labels, counts)
    return operator.backend.ops.assign_labels(S, operator.diag, sizes, within, labels, counts=counts)


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
    return distinct_centres(cross, sizes, within)


def distinct_centres(cross, sizes, within) -> int:
    """How many nonempty clusters have pairwise distinct centres, from cross[a, b] = sum_{i in a} w_i S[i, b]."""
    nonempty = np.flatnonzero(sizes > 0)
    if nonempty.size <= 1:
        return int(nonempty.size)
    norm = within / np.where(sizes > 0, sizes, 1.0) ** 2
    scale = max(float(np.max(np.abs(norm[nonempty]))), np.finfo(float).tiny)
    distinct = []
    for a in nonempty:
        same = False
        for b in distinct:
            d2 = norm[a] + norm[b] - 2.0 * cross[a, b] / (sizes[a] * sizes[b])
            if d2 <= 1e-7 * scale:
                same = True
                break
        if not same:
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
    weights_h = backend.to_host(operator.weights)
    has_zero_weights = bool((weights_h == 0).any())
    counts = np.empty(k, dtype=np.int64)
    labels = backend.asarray(init_labels, dtype=np.int32)
    S, sizes, within, objective = _update(operator, labels, k, xp)
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
        new_labels, min_dist, n_changed = _assign(operator, S, sizes, within, labels, counts)
        if counts.min() == 0 or has_zero_weights:
            labels_h = backend.to_host(new_labels).astype(np.int32)
            if np.bincount(labels_h[weights_h > 0], minlength=k).min() == 0:
                dist_h = backend.to_host(min_dist)
                refill_empty_clusters(labels_h, dist_h, weights_h, k)
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
            S = operator.update_cluster_sums(S, labels, new_labels)
            since_full += 1
        else:
            S = operator.cluster_sums(new_labels, k)
            since_full = 0
        labels = new_labels
        sizes, within, new_objective = _totals(operator, S, labels, k, xp)
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

    Returns the initial labels: every point assigned to its nearest seed (as scikit-learn's
    ``_kmeans_plusplus`` seeds, with sample weights in the sampling).
    """
    backend = operator.backend
    n = operator.n
    w = backend.to_host(operator.weights).astype(np.float64)
    diag = backend.to_host(operator.diag)
    if n_local_trials is None:
        n_local_trials = 2 + int(math.log(k))
    p = w / w.sum()
    centres = [int(rng.choice(n, p=p))]
    closest = np.maximum(diag + diag[centres[0]] - 2.0 * operator.rows([centres[0]])[0], 0.0)
    potential = float(w @ closest)
    for _ in range(1, k):
        if potential <= 0:  # every point coincides with a seed: pick any unused positive-weight point
            remaining = np.setdiff1d(np.flatnonzero(w > 0), centres)
            if remaining.size == 0:  # fewer positive-weight points than k (fit rejects this; kept for safety)
                remaining = np.setdiff1d(np.arange(n), centres)
            candidates = np.array([int(rng.choice(remaining))])
        else:
            cumulative = np.cumsum(w * closest)
            draws = rng.uniform(size=n_local_trials) * cumulative[-1]
            candidates = np.minimum(np.searchsorted(cumulative, draws), n - 1)
        rows = operator.rows(candidates)
        d = np.maximum(diag[None, :] + diag[candidates][:, None] - 2.0 * rows, 0.0)
        d = np.minimum(closest[None, :], d)
        potentials = d @ w
        best = int(np.argmin(potentials))
        centres.append(int(candidates[best]))
        closest = d[best]
        potential = float(potentials[best])
    rows = operator.rows(centres)
    dist = diag[None, :] + diag[centres][:, None] - 2.0 * rows
    labels = np.argmin(dist, axis=0).astype(np.int32)
    labels[np.asarray(centres)] = np.arange(k, dtype=np.int32)  # a seed belongs to its own cluster
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
    """The warnings of :func:`run_restarts` (stacklevel: the caller of the public function that ran it)."""
    if not best.converged:
        warnings.warn(f"kernel k-means did not converge in max_iter={max_iter} iterations "
                      f"(last relative objective change above tol={tol:g}); increase max_iter.",
                      ConvergenceWarning, stacklevel=4)
    if best.n_distinct < k:
        warnings.warn(f"Number of distinct clusters ({best.n_distinct}) found smaller than "
                      f"n_clusters ({k}): their centres coincide in feature space. Possibly due to duplicate "
                      "points in X, or to a kernel that does not separate the points (numerically constant on "
                      "these data, e.g. an rbf or laplacian gamma far too small: see UninformativeKernelWarning).",
                      ConvergenceWarning, stacklevel=4)
    return best, runs, init_seconds
