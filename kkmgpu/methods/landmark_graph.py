"""The landmark route's graph and eigenproblem (:mod:`kkmgpu.methods.landmark_cut`): representatives, the sparse
bipartite graph between the points and them, the transfer cut, and the normalized cut on the points.

Notation (U-SPEC, Huang et al., TKDE 2020; transfer cut, Li, Wu and Chang, CVPR 2012): B (n x p, CSR) holds the
edge weights between the n points and the p representatives, each point linked to its r nearest;
d_X = B 1 (the points' degrees, weighted by sample_weight w: w_i (B 1)_i), d_Y = B^T w (the representatives'),
W_Y = B^T diag(w / (B 1)) B (p x p). The transfer cut solves (D_Y - W_Y) v = lambda D_Y v for the k smallest lambda;
each is an eigenpair of the (n + p)-node bipartite graph's L f = gamma D f, gamma (2 - gamma) = lambda, whose
X part is u = D_X^-1 B v / (1 - gamma) (the paper's Eq. 7-8), with D_X = diag(B 1).

The same u are the generalized eigenvectors of the graph the bipartite one induces on the points, two steps of
its random walk, W_X = B D_Y^-1 B^T (W_X u = (1 - lambda) D_X u, since B^T D_X^-1 B = W_Y), whose degrees are
B 1 again. Its normalized cut is defined by the points' labels alone, and it is what the refinement lowers:
weighted kernel k-means with K = D_X^-1 W_X D_X^-1 = Phi Phi^T, Phi = D_X^-1 B D_Y^-1/2 (PSD, so every batch
Lloyd step lowers the objective without a shift), weights d_X (Dhillon, Guan and Kulis, KDD 2004), in O(n r k) per
step: the cluster sums are B D_Y^-1 P^T with P = Y^T diag(w) B (k x p).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from kkmgpu.backend.device import argsort_stable
from kkmgpu.engine import sparse as _sparse
from kkmgpu.kernels import gemm as _gemm
from kkmgpu.kernels import knn_exact
from kkmgpu.kernels import sparse_cuda as _products
from kkmgpu.kernels.blocks import tile_rows
from kkmgpu.methods import graph_spectral as _spectral
from kkmgpu.methods.graph_scale import graph_features

#: the representatives are the centres of k-means on min(SAMPLE_FACTOR p, n) points drawn uniformly (U-SPEC's
#: hybrid selection), after LLOYD_ITERATIONS Lloyd steps from p of them
SAMPLE_FACTOR = 10
LLOYD_ITERATIONS = 3     # 3 and 5 gave the same NMI on MNIST-70k at p = 1500 (0.749-0.768), 3 in less time


def features(Xd, i0, i1, center, exponent, dtype, backend):
    """The prepared features of rows i0:i1 (centred in float64 on ``center``, scaled by 2**-exponent, cast to the
    compute precision: :func:`kkmgpu.methods.graph_scale.graph_features` on the tile): X is never copied whole."""
    return graph_features(Xd[i0:i1], dtype, backend, center, exponent)[1]


def representatives(Xd, p, center, exponent, dtype, rng, backend):
    """(R, sample): p representatives (device, (p, d), the features' dtype): scikit-learn's KMeans (Lloyd, random
    initial centres, one run, LLOYD_ITERATIONS steps, seeded from ``rng``) on the prepared features of
    min(SAMPLE_FACTOR p, n) rows drawn uniformly, run on the host on either device; ``sample`` its row count."""
    from sklearn.cluster import KMeans
    from sklearn.exceptions import ConvergenceWarning

    n = Xd.shape[0]
    m = min(SAMPLE_FACTOR * p, n)
    pick = np.sort(rng.choice(n, size=m, replace=False))
    S = backend.to_host(graph_features(Xd[backend.asarray(pick)], dtype, backend, center, exponent)[1])
    seed = int(rng.integers(2 ** 31 - 1))
    if p == m:   # every sampled point is a centre: nothing to iterate
        return backend.asarray(S), m
    with warnings.catch_warnings():  # fewer distinct points than p: duplicate centres, which the graph tolerates
        warnings.simplefilter("ignore", ConvergenceWarning)
        # in float64 (10 p rows): in float32 a far outlier's 1e30 squared norm in the inertia and the empty-cluster
        # relocation left 6 distinct centres of 1500 beside 3,000 points spread over 10 (docs/graphs.md)
        km = KMeans(p, init="random", n_init=1, max_iter=LLOYD_ITERATIONS, tol=0.0, algorithm="lloyd",
                    random_state=seed).fit(S.astype(np.float64))
    return backend.asarray(np.ascontiguousarray(km.cluster_centers_, dtype=S.dtype)), m


def nearest(F, R, r, backend, precision=_gemm.DEFAULT_PRECISION):
    """(index, sq_dist) (len(F), r): each row's r nearest representatives, nearest first, by float64 squared
    distances of the values (ties to the lower index). The keys ||r_j||^2 - 2 f_i . r_j of one GEMM
    (:func:`kkmgpu.kernels.gemm.product`, the working precision) pick r + spares candidates per row
    (:func:`kkmgpu.kernels.knn_exact.spares`), which are re-ranked by their float64 distances computed directly."""
    xp = backend.xp
    b, p = F.shape[0], R.shape[0]
    m = min(p, r + knn_exact.spares(r))
    keys = _gemm.product(F, R, backend, precision)
    keys *= -2
    keys += ((R.astype(xp.float64) ** 2).sum(axis=1)).astype(keys.dtype)[None, :]
    if m == p:
        cand = xp.broadcast_to(xp.arange(p, dtype=xp.int64)[None, :], (b, p))
    elif backend.is_gpu:
        cand = xp.argpartition(keys, m - 1, axis=1)[:, :m].astype(xp.int64)
    else:
        from kkmgpu.kernels import knn_cpu

        cand = np.empty((b, m), dtype=np.int64)
        knn_cpu.select_rows(keys, m, np.empty((b, m), dtype=keys.dtype), cand)
    del keys
    rows = xp.repeat(xp.arange(b, dtype=xp.int64), m)
    dist = knn_exact.cross_distances(F, R, rows, xp.ascontiguousarray(cand).ravel(), 0, backend).reshape(b, m)
    by_index = argsort_stable(xp, cand)         # nearest first, ties to the lower index
    cand, dist = xp.take_along_axis(cand, by_index, 1), xp.take_along_axis(dist, by_index, 1)
    order = argsort_stable(xp, dist)[:, :r]
    return xp.take_along_axis(cand, order, 1), xp.take_along_axis(dist, order, 1)


def edge_weights(sq_dist, sigma, xp):
    """exp(-d^2 / (2 sigma^2)) (U-SPEC's Gaussian), computed as each row's shape exp(-(d^2 - d_1^2) / (2 sigma^2))
    times its scale exp(-d_1^2 / (2 sigma^2)), the scale kept at least float64's smallest normal number: a point far
    beyond every representative (an outlier) keeps the row its weights tend to, D_X^-1 B, with a negligible degree,
    instead of a row of zeros. sigma = 0 (every distance 0): weights 1."""
    if sigma == 0.0:
        return xp.ones(sq_dist.shape, dtype=xp.float64)
    scale2 = 2.0 * sigma * sigma
    shape = xp.exp(-(sq_dist - sq_dist[:, :1]) / scale2)
    return shape * xp.maximum(xp.exp(-sq_dist[:, :1] / scale2), np.finfo(np.float64).tiny)


def bipartite(index, sq_dist, sigma, p, backend):
    """B (n, p) CSR float64 on the device: row i holds the weights of its r representatives."""
    xp = backend.xp
    n, r = index.shape
    W = edge_weights(sq_dist, sigma, xp)
    indptr = xp.arange(0, n * r + 1, r, dtype=xp.int32)
    order = argsort_stable(xp, index)     # columns ascending within a row (canonical CSR)
    cols = xp.take_along_axis(index, order, 1).astype(xp.int32).ravel()
    vals = xp.take_along_axis(W, order, 1).ravel()
    return _sparse.sparse_module(backend).csr_matrix((vals, cols, indptr), shape=(n, p))


def transposed(M):
    """M^T as a CSR matrix, for products with dense operands (:func:`kkmgpu.kernels.sparse_cuda.product`, the
    fixed order of summation on both devices): cuSPARSE's products add in an order that changes from run to run
    with a transposed operand (what CuPy runs for ``M.T @ x``) or long rows (B^T's rows hold n r / p entries), so
    that two fits with the same seed gave other labels, then cuts 8e-11 apart on an H100 (2026-11-26)."""
    return M.T.tocsr()


def degrees(B, weights, backend):
    """(row_sums, d_X, d_Y): B 1, w (B 1) and B^T w, float64 on the device."""
    xp = backend.xp
    rows = _products.row_sums(B, backend)
    return rows, weights * rows, xp.asarray(_products.product(transposed(B), weights, backend)).ravel()


def keep_linked(B, dy, backend):
    """(B', dy', kept): the representatives of positive degree only (one no point links to, or only points of
    weight 0, has no equation in the transfer cut), columns renumbered."""
    xp = backend.xp
    kept = xp.flatnonzero(dy > 0)
    if int(kept.shape[0]) == B.shape[1]:
        return B, dy, kept
    new = xp.full(B.shape[1], -1, dtype=xp.int32)
    new[kept] = xp.arange(kept.shape[0], dtype=xp.int32)
    # a dropped column can still hold entries (edges whose Gaussian weight underflowed to 0, or points of weight
    # 0): they go too. Renumbering them to -1 in place gave scipy a CSR with negative indices (a heap corruption)
    B = B.tocoo()
    col = new[B.col]
    keep = col >= 0
    B2 = _sparse.sparse_module(backend).coo_matrix((B.data[keep], (B.row[keep], col[keep])),
                                                   shape=(B.shape[0], int(kept.shape[0]))).tocsr()
    return B2, dy[kept], kept


def transfer_cut(B, rows, dy, weights, k, backend):
    """(U, lam, V): the transfer cut's k smallest lambda (host, ascending) of (D_Y - W_Y) v = lambda D_Y v, the
    v (host (p, k), v^T D_Y v = 1) and the X parts u = D_X^-1 B v / sqrt(1 - lambda) of the bipartite graph's
    eigenvectors (device (n, k), float64; then u^T D_X u = v^T D_Y v = 1). Every representative must have
    d_Y > 0 (:func:`keep_linked`). Dense and on the host: p x p, O(p^3)."""
    import scipy.linalg

    xp = backend.xp
    p = B.shape[1]
    Bw = (_spectral.diag(weights / rows, backend) @ B).tocsr()
    WY = backend.to_host((B.T @ Bw).toarray())
    dyh = np.asarray(backend.to_host(dy), dtype=np.float64)
    s = dyh ** -0.5
    M = s[:, None] * WY * s[None, :]
    M = 0.5 * (M + M.T)
    # 1 - lambda, the largest k, by LAPACK's MRRR (evr) on one BLAS thread: at p = 1000 on the loaded 2-core CPU
    # 0.25 s, against 7-12 s with two threads (their waits), and 2.1 s for the default driver on a quieter one
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"):
        mu, Q = scipy.linalg.eigh(M, subset_by_index=[p - k, p - 1], driver="evr")
    mu, Q = mu[::-1], Q[:, ::-1]
    V = np.ascontiguousarray(Q * s[:, None])
    lam = np.clip(1.0 - mu, 0.0, 2.0)
    root = np.sqrt(np.clip(mu, 0.0, None))
    inv = np.divide(1.0, root, out=np.zeros_like(root), where=root > 0)
    U = xp.asarray(_products.product(B, backend.asarray(V * inv[None, :]), backend)) / rows[:, None]
    return U, lam, V


def cluster_totals(B, labels, weights, rows, k, backend):
    """(P, size): P = Y^T diag(w) B (k, p) and size_c = d(c) = sum_{i in c} w_i (B 1)_i (float64, device)."""
    xp = backend.xp
    n = B.shape[0]
    Y = _sparse.sparse_module(backend).csr_matrix((weights, (xp.arange(n), labels.astype(xp.int64))), shape=(n, k))
    P = xp.asarray((Y.T @ B).toarray())
    return P, xp.asarray(_products.product(transposed(Y), rows, backend)).ravel()


def ncut(P, size, dy, backend):
    """(cut, links): the normalized cut of the labels on the points' graph W_X = B D_Y^-1 B^T, the sum over the
    non-empty clusters c of links(c, V \\ c) / d(c), links(c, V \\ c) = sum_j P_cj (T_j - P_cj) / d_Y_j with
    T = sum_c P_c (exactly 0 for a cluster that holds all its landmarks' edges: a sum of zeros is exact), and
    links(c, c) = sum_j P_cj^2 / d_Y_j (float64, host)."""
    T = P.sum(axis=0)
    links = np.asarray(backend.to_host(((P * P) / dy[None, :]).sum(axis=1)), dtype=np.float64)
    across = np.asarray(backend.to_host((P * (T[None, :] - P) / dy[None, :]).sum(axis=1)), dtype=np.float64)
    size = np.asarray(backend.to_host(size), dtype=np.float64)
    full = size > 0
    return float(np.sum(np.maximum(across[full], 0.0) / size[full])), links


def assign(Bq, rows_q, P, size, links, dy, backend):
    """The refinement's assignment of the points whose bipartite rows are Bq (row sums ``rows_q``): the cluster of
    least -2 (Phi_i . M_c) / d(c) + ||M_c||^2 / d(c)^2, Phi_i . M_c = (B D_Y^-1 P^T)_ic / (B 1)_i (the weighted
    kernel k-means distance up to the point's own constant; empty clusters never chosen)."""
    xp = backend.xp
    size_d = backend.asarray(size)
    safe = xp.where(size_d > 0, size_d, 1.0)
    S = xp.asarray(_products.product(Bq, xp.ascontiguousarray((P / dy[None, :]).T), backend))
    score = -2.0 * S / (rows_q[:, None] * safe[None, :]) + (backend.asarray(links) / safe ** 2)[None, :]
    score = xp.where(size_d[None, :] > 0, score, xp.inf)
    return xp.argmin(score, axis=1)


def refine(B, rows, dy, weights, labels, k, max_iter, tol, backend, totals, report=None):
    """Batch Lloyd steps of weighted kernel k-means on K = Phi Phi^T (module docstring) from ``labels``, whose
    ``totals`` (P, size, cut, links) the caller has (:func:`cluster_totals`, :func:`ncut`): every step lowers the
    normalized cut on W_X. Stops when no point moves, the cut's relative decrease is at most ``tol``, or after
    ``max_iter`` steps. Returns (labels, history (the cut before and after each step that moved points), n_iter,
    converged, the final labels' totals). ``report(step, cut)`` is called after each step."""
    P, size, value, links = totals
    history = [value]
    for step in range(1, max_iter + 1):
        new = assign(B, rows, P, size, links, dy, backend)
        if not bool((new != labels).any()):
            return labels, history, step, True, (P, size, value, links)
        labels = new
        P, size = cluster_totals(B, labels, weights, rows, k, backend)
        value, links = ncut(P, size, dy, backend)
        previous = history[-1]
        history.append(value)
        if report is not None:
            report(step, value)
        if abs(previous - value) <= tol * abs(previous):
            return labels, history, step, True, (P, size, value, links)
    return labels, history, max_iter, False, (P, size, value, links)


def sigma_of(sq_dist, backend) -> float:
    """U-SPEC's bandwidth: the mean of the r nearest representatives' distances over all points."""
    xp = backend.xp
    return float(xp.sqrt(xp.maximum(sq_dist, 0.0)).mean())


def rows_per_tile(p, d, itemsize, backend) -> int:
    """Rows of a neighbour-search tile: its keys (p), the float64 candidate distances and its features (d)."""
    return tile_rows(p + d + 64, max(itemsize, 8), backend=backend)


def check_finite_sigma(sigma):
    if not math.isfinite(sigma):
        raise ValueError(f"the mean distance to the nearest representatives is {sigma}: the data's distances "
                         "overflow float64; scale the data.")
