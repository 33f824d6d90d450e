"""Exact nearest neighbours of low-dimensional points on the CPU by SciPy's k-d tree (issue 29 point 1).

The same result as :func:`kkmgpu.kernels.knn_exact.search` (the float64 brute-force neighbours of A's values, ties
to the lower index, and their float64 squared distances computed directly), found by ``scipy.spatial.cKDTree``
instead of GEMM-form keys over all pairs: a query costs about log n distance evaluations a row where the
brute-force search costs n, which pays in few dimensions (2-D shape sets, the many-cluster sets of
``bench/bench_graphs.py``).

Each row asks the tree for its m + 1 nearest (m = n_neighbors + :func:`knn_exact.spares`, the row itself among
them), re-ranks the others by their directly computed float64 distances, and certifies the row: the tree's
distances are those of the same float64 differences summed in another order, within TREE_ROUNDING (d + 4) eps of
them relatively, so every point the tree did not return is farther than its last returned distance t less that
margin. A row whose n_neighbors-th distance is below t^2 (1 - margin) is exact; the others (exact ties at the
boundary, e.g. more duplicates of a point than m) are recomputed by :mod:`knn_exact`'s float64 route.
"""

from __future__ import annotations

import numpy as np

from kkmgpu.backend.device import Backend
from kkmgpu.kernels import knn_exact

__all__ = ["MAX_FEATURES", "search"]

#: up to this many features the CPU's neighbour search takes the k-d tree (``bench/bench_knn_tree.py`` measured
#: where it stops paying against the brute-force search)
MAX_FEATURES = 8
#: the certificate's relative margin is TREE_ROUNDING (d + 4) eps (module docstring): a generous multiple of the
#: two summations' rounding, (d + 1) eps each
TREE_ROUNDING = 4


def applies(n: int, d: int, n_neighbors: int) -> bool:
    """Whether :func:`search` takes the tree for an (n, d) search of ``n_neighbors`` (else it returns None)."""
    return d <= MAX_FEATURES and n_neighbors + knn_exact.spares(n_neighbors) < n - 1


def search(A, n_neighbors: int, *, workers: int = 1, report: dict | None = None):
    """(index, sq) as :func:`kkmgpu.kernels.knn_exact.search` gives them on the CPU, or None where the tree does
    not apply: more than MAX_FEATURES features, every other point a candidate anyway, or features whose norms
    knn_exact would scale by a power of two (beyond 2^+-400). ``workers``: the threads of the tree's queries.
    Raises ValueError for non-finite features (as knn_exact does)."""
    from scipy.spatial import cKDTree

    n, d = A.shape
    k = int(n_neighbors)
    if not applies(n, d, k):
        return None
    backend = Backend("cpu")
    _, _, mean, p = knn_exact.prepare(A, backend)
    if p:
        return None
    m = k + knn_exact.spares(k)
    report = {} if report is None else report
    values = np.asarray(A, dtype=np.float64)
    tree_dist, cand = cKDTree(values).query(values, k=m + 1, workers=workers)
    rows = np.arange(n)
    own = cand == rows[:, None]
    own[~own.any(axis=1), m] = True     # the row not returned (more than m copies of it): drop the last instead
    cand = cand[~own].reshape(n, m)
    index, dist = knn_exact._nearest_first(cand, knn_exact.exact_distances(A, rows, cand, 0, backend), k, np)
    margin = TREE_ROUNDING * (d + 4) * np.finfo(np.float64).eps
    bad = np.flatnonzero(~(dist[:, k - 1] < tree_dist[:, m] ** 2 * (1.0 - margin)))
    report.update(mode="k-d tree", spares=m - k, candidates_certified=1.0 - bad.size / n)
    if bad.size:
        index[bad], dist[bad] = knn_exact._recompute(A, bad, k, m, mean, p, backend, report)
    else:
        report.update(float64_rows=0, direct_rows=0)
    if not np.isfinite(dist).all():
        raise ValueError(f"squared distances of the features (up to {float(np.abs(A).max()):.3g} in magnitude) "
                         "overflow float64; scale the data down.")
    return index, dist
