"""Affinity graphs on the device, in row tiles, kept in CSR (issue 17: normalized cut as weighted kernel k-means).

- ``"knn"``: the symmetric k-nearest-neighbour graph A = (G + G^T) / 2, G_ij = 1 when j is among the n_neighbors
  nearest points of i: 1 on mutual pairs, 1/2 on one-sided ones (scikit-learn's
  ``SpectralClustering(affinity="nearest_neighbors")`` builds the same, with each point its own first neighbour);
- ``"mutual_knn"``: A_ij = 1 when each is among the other's n_neighbors nearest (the intersection); a point left
  without any edge keeps the one to its nearest neighbour (so that every degree is positive);
- ``"self_tuning"``: the kNN graph with RBF weights and local scales (Zelnik-Manor and Perona, NIPS 2004),
  A_ij = exp(-||x_i - x_j||^2 / (sigma_i sigma_j)) on the union of the neighbour lists, sigma_i the distance of x_i
  to its ``scale_neighbor``-th nearest point (the paper's 7th).

Neighbours exclude the point itself; a duplicate point is a neighbour at distance 0. The neighbours are exact on
both devices and in every GEMM precision mode: those of a float64 brute-force search of the features' values, ties
to the lower index. On a GPU, candidates come from GEMM-form squared distances in the precision mode, over the
blocks on and above the diagonal of the distance matrix (never an n x n matrix: ``knn_cuda`` for lists up to its
``MAX_NEIGHBORS``; longer lists take row tiles and ``argpartition``), with spare candidates that are re-ranked by
direct float64 distances and certified by an error bound of the keys, and rows that cannot be certified are
recomputed (``knn_exact``). On the CPU, ``knn_bounds`` decides: for large data whose variance sits in a few
directions, an exact search by principal-component lower bounds that picks neighbours by float64 distances
directly; otherwise the same certified search on the CPU's brute-force block search (``knn_cpu``). The graph has
no self-loops and is symmetric.
"""

from __future__ import annotations
from dataclasses import dataclass

from kkmgpu.backend.device import Backend
from kkmgpu.kernels.gemm import DEFAULT_PRECISION, check_precision

GRAPHS = ("knn", "mutual_knn", "self_tuning")
#: Zelnik-Manor and Perona's local scale: the distance to the 7th nearest neighbour
SCALE_NEIGHBOR = 7


def nearest_neighbors(A, n_neighbors: int, backend: Backend, precision: str = DEFAULT_PRECISION):
    """(index, sq_dist): the ``n_neighbors`` nearest other points of every row of A (n, d), nearest first.

    Exact: the neighbours a float64 brute-force search of A's values finds (ties to the lower index), whatever
    the precision of the search that proposes them (:mod:`kkmgpu.kernels.knn_exact`). ``index`` is a device int64
    array (n, n_neighbors); ``sq_dist`` their float64 squared distances, computed directly from the rows of A.
    ``precision``: the GEMM precision mode of a GPU's float32 search ("fp32", "3xtf32", "tf32";
    :mod:`kkmgpu.kernels.gemm`); the CPU and float64 always take the plain product.
    """
    n = A.shape[0]
    if not 1 <= n_neighbors <= n - 1:
        raise ValueError(f"n_neighbors={n_neighbors} must be between 1 and n_samples - 1 = {n - 1}.")
    check_precision(precision)
    if backend.is_gpu:
        from kkmgpu.kernels import knn_exact

        return knn_exact.search(A, n_neighbors, backend, precision)
    from kkmgpu.kernels import knn_bounds

    return knn_bounds.nearest_neighbors(A, n_neighbors, distances=True)


def affinity_graph(A, n_neighbors: int, kind: str, backend: Backend, *, scale_neighbor: int = SCALE_NEIGHBOR,
                   precision: str = DEFAULT_PRECISION):
    """The ``kind`` affinity graph of the rows of A (prepared features on ``backend``) as a symmetric CSR matrix
    (scipy.sparse on the CPU, cupyx.scipy.sparse on a GPU), float64, no self-loops, explicit zeros removed."""
    return build_graph(A, n_neighbors, kind, backend, scale_neighbor=scale_neighbor, precision=precision).graph


@dataclass
class Graph:
    """An affinity graph and what extends it to new points (:func:`query_affinity`)."""

    graph: object        # symmetric CSR, float64
    kind: str
    n_neighbors: int
    radius_sq: object    # (n,) float64: squared distance of each point to its n_neighbors-th neighbour
    sigma: object        # (n,) float64 local scales (self_tuning), else None
    scale_neighbor: int
    precision: str = DEFAULT_PRECISION   # the GEMM precision mode of the search (and of query_affinity's)


def build_graph(A, n_neighbors: int, kind: str, backend: Backend, *, scale_neighbor: int = SCALE_NEIGHBOR,
                neighbors=None, precision: str = DEFAULT_PRECISION, progress: bool = False) -> Graph:
    """:func:`affinity_graph` with the neighbour radii and local scales that :func:`query_affinity` needs.

    ``neighbors``: (index, sq_dist) of :func:`nearest_neighbors` on the same A with at least the reach this graph
    needs (nearest first), so that graphs of several ``n_neighbors`` share one search. ``precision``: the GEMM
    precision mode of the search (:func:`nearest_neighbors`; the neighbours are exact in every mode).
    ``progress``: a bar over the two steps, the neighbour search and the affinities (:mod:`kkmgpu._progress`)."""
    from kkmgpu._progress import progress_bar

    with progress_bar(2, desc="graph", unit="step", enabled=progress) as bar:
        reach = max(n_neighbors, scale_neighbor) if kind == "self_tuning" else n_neighbors
        bar.set_postfix_str(f"{reach} nearest neighbours of {A.shape[0]} points" if neighbors is None
                            else "neighbours given")
        return _build(A, n_neighbors, kind, backend, scale_neighbor, neighbors, precision, bar)


def _build(A, n_neighbors, kind, backend, scale_neighbor, neighbors, precision, bar) -> Graph:
    from kkmgpu.engine.sparse import sparse_module, symmetrise

    if kind not in GRAPHS:
        raise ValueError(f"affinity={kind!r} is not one of {', '.join(map(repr, GRAPHS))}.")
    xp = backend.xp
    sp = sparse_module(backend)
    n = A.shape[0]
    if not 1 <= n_neighbors <= n - 1:
        raise ValueError(f"n_neighbors={n_neighbors} must be between 1 and n_samples - 1 = {n - 1}.")
    reach = max(n_neighbors, scale_neighbor) if kind == "self_tuning" else n_neighbors
    if kind == "self_tuning" and not 1 <= scale_neighbor <= n - 1:
        raise ValueError(f"scale_neighbor={scale_neighbor} must be between 1 and n_samples - 1 = {n - 1}.")
    if neighbors is None:
        index, sq = nearest_neighbors(A, reach, backend, precision)
    else:
        index, sq = neighbors
        if index.shape != (n, index.shape[1]) or index.shape[1] < reach:
            raise ValueError(f"neighbors of shape {index.shape} do not hold the {reach} nearest of {n} points.")
        index, sq = index[:, :reach], sq[:, :reach]
    bar.update()
    bar.set_postfix_str(f"{kind} affinities")
    rows = xp.repeat(xp.arange(n, dtype=xp.int64), n_neighbors)
    cols = index[:, :n_neighbors].ravel()
    sigma = xp.sqrt(sq[:, scale_neighbor - 1]) if kind == "self_tuning" else None
    if kind == "self_tuning":
        scale = sigma[rows] * sigma[cols]
        d2 = sq[:, :n_neighbors].ravel()
        # coincident scales of 0 (duplicates at the scale neighbour): the pair is at distance 0, weight 1
        data = xp.where(scale > 0, xp.exp(-d2 / xp.where(scale > 0, scale, 1.0)), (d2 == 0).astype(xp.float64))
    else:
        data = xp.ones(rows.shape[0], dtype=xp.float64)
    G = sp.coo_matrix((data, (rows, cols)), shape=(n, n)).tocsr()
    if kind == "knn":
        graph = (G + G.T.tocsr()) * 0.5
        graph = graph.tocsr()
        graph.sort_indices()
    else:
        graph = symmetrise(G, backend, "minimum" if kind == "mutual_knn" else "maximum", f"the {kind} graph")
    alone = xp.flatnonzero(xp.diff(graph.indptr) == 0) if kind != "knn" else None
    if alone is not None and alone.shape[0]:  # a point left without an edge keeps the one to its own nearest
        near = index[alone, 0]
        if kind == "mutual_knn":  # no other point has it among its nearest
            weight = xp.ones(alone.shape[0])
        else:  # self_tuning: every weight underflowed, d^2 / (sigma_i sigma_j) beyond 745 (a far outlier, whose
            # neighbours' scales are small): its own scale on both sides, exp(-d^2 / sigma_i^2) >= exp(-1)
            own = sigma[alone] ** 2
            weight = xp.where(own > 0, xp.exp(-sq[alone, 0] / xp.where(own > 0, own, 1.0)), 1.0)
        extra = sp.coo_matrix((weight, (alone, near)), shape=(n, n)).tocsr()    # one entry per row
        graph = graph.maximum(symmetrise(extra, backend, "maximum", f"the {kind} graph's added edges")).tocsr()
        graph.sort_indices()
    bar.update()
    return Graph(graph=graph, kind=kind, n_neighbors=n_neighbors, radius_sq=sq[:, n_neighbors - 1].copy(),
                 sigma=sigma, scale_neighbor=scale_neighbor, precision=precision)


def query_affinity(graph: Graph, A_train, Q, backend: Backend, rows: int | None = None):
    """(W, nearest): affinities of new points Q (prepared as the training features A_train, same dtype) to the
    training points as ``graph`` would give them, a CSR matrix (n_new, n_train), and each new point's nearest
    training point (ties to the lower index).

    j is a neighbour of the new point q when it is among q's n_neighbors nearest training points (ties at the
    n_neighbors-th distance included), and q one of j's when it is nearer than j's n_neighbors-th neighbour
    (``radius_sq``); the pair's weight follows ``graph.kind`` as in :func:`build_graph` (knn: 1/2 per direction;
    mutual_knn: both; self_tuning: either, with q's own scale its ``scale_neighbor``-th nearest training point).
    The distances are exact, float64 distances of the features' values in every GEMM precision mode
    (:func:`kkmgpu.kernels.knn_exact.query`, in the graph's mode, ``rows`` new points at a time), as the graph's own.
    """
    from kkmgpu.engine.sparse import sparse_module
    from kkmgpu.kernels import knn_exact

    xp = backend.xp
    n, m = A_train.shape[0], Q.shape[0]
    reach = max(graph.n_neighbors, graph.scale_neighbor) if graph.kind == "self_tuning" else graph.n_neighbors
    index, dist, (r, j, D) = knn_exact.query(A_train, Q, min(reach, n), backend, graph.precision,
                                             radius_sq=graph.radius_sq, rows=rows)
    own = D <= dist[:, graph.n_neighbors - 1][r]                    # j among q's nearest
    other = D < graph.radius_sq[j]                                 # q among j's nearest
    if graph.kind == "knn":
        data = 0.5 * own + 0.5 * other
    elif graph.kind == "mutual_knn":
        data = (own & other).astype(xp.float64)
    else:
        scale = xp.sqrt(dist[:, graph.scale_neighbor - 1])[r] * graph.sigma[j]
        data = xp.where(scale > 0, xp.exp(-D / xp.where(scale > 0, scale, 1.0)), (D == 0).astype(xp.float64))
        data = xp.where(own | other, data, 0.0)
    keep = data != 0
    W = sparse_module(backend).coo_matrix((data[keep], (r[keep], j[keep])), shape=(m, n)).tocsr()
    W.sort_indices()
    return W, index[:, 0]
