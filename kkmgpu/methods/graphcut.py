"""Graph objectives: normalized cut and ratio association as weighted kernel k-means (``fit(objective=...)``).

Dhillon, Guan and Kulis (KDD 2004, "Kernel k-means, spectral clustering and normalized cuts") show that for an
affinity graph A with degrees d (D = diag(d)) and a shift sigma,

- the normalized cut, ncut = sum_c links(c, V \\ c) / d(c) = k - sum_c links(c, c) / d(c), is weighted kernel
  k-means with K = sigma D^-1 + D^-1 A D^-1 and weights d: its objective is J = sigma (n - k) - k + ncut;
- the ratio association, sum_c links(c, c) / |c| (to be maximised), is kernel k-means with K = sigma I + A and
  unit weights: J = sigma (n - k) - ratio association,

with links(a, b) = sum_{i in a, j in b} A_ij. K is positive semi-definite, so that every Lloyd step lowers J,
once sigma >= -lambda_min(D^-1/2 A D^-1/2) (ncut) or -lambda_min(A) (ratio association); ``graph_shift="auto"``
takes that sigma, found by Lanczos (eigsh, smallest algebraic) with a 1% margin. Any sigma gives the same
objective up to a constant; a larger one makes points keener to stay where they are.

The graph (:mod:`kkmgpu.kernels.graphs`) and K stay sparse (CSR): the iterations run on the sparse operator
through the usual Lloyd driver (``fit(K, kernel="precomputed", sample_weight=w)``), O(nnz) per iteration.

Initialisation: ``init="spectral"`` (the default for these objectives) clusters the spectral embedding
D^-1/2 V, V the top-k eigenvectors of D^-1/2 A D^-1/2 found by Lanczos (ARPACK) for a connected graph on the
CPU, else by LOBPCG (a block method: it finds repeated eigenvalues such as one per connected component, which
single-vector Lanczos misses), with kernel k-means on a linear kernel; each of ``n_init`` such partitions is
then refined on the graph and the lowest objective kept.
k-means++ in the graph kernel's feature space is available but measured much worse (docs/graphs.md).

The objective reported is the normalized cut itself (``objective="ncut"``) or the negated ratio association
(``objective="ratio_association"``: lower is better, as for every objective of kkmgpu), recomputed in float64
from A for the final labels; ``result.objective_name`` says which.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from kkmgpu import _validation
from kkmgpu.backend.device import import_cupyx, memory_situation, resolve_device
from kkmgpu.engine import sparse as _sparse
from kkmgpu.kernels import gemm as _gemm
from kkmgpu.kernels import graphs as _graphs

OBJECTIVES = ("kernel_kmeans", "ncut", "ratio_association")
GRAPH_OBJECTIVES = ("ncut", "ratio_association")
AFFINITIES = (*_graphs.GRAPHS, "precomputed")
#: scikit-learn's SpectralClustering default, and a good one on the sets of docs/graphs.md
DEFAULT_N_NEIGHBORS = 10
#: ``n_neighbors="search"`` tries these (those below n), keeping the clustering of lowest c-NNC
NEIGHBOR_GRID = (5, 7, 10, 15, 20, 30, 50)
#: LOBPCG's tolerance and iteration cap for the spectral start
EIGEN_TOL = 1e-5
EIGEN_MAXITER = 500


@dataclass
class GraphState:
    """What :func:`predict` needs: the graph's neighbour radii and scales, the training features, the shift."""

    graph: object          # kkmgpu.kernels.graphs.Graph (None for a precomputed affinity)
    features: object       # prepared training features (None for a precomputed affinity)
    center: object         # the mean subtracted from X before the graph was built
    objective: str
    shift: float


# --- checks ----------------------------------------------------------------------------------------------------

def check_objective(objective):
    if not isinstance(objective, str) or objective not in OBJECTIVES:
        raise ValueError(f"objective={objective!r} is not one of {', '.join(map(repr, OBJECTIVES))}.")
    return objective


def check_graph_args(*, affinity, n_neighbors, graph_shift, kernel, gamma, method, sample_weight, n):
    """Validated (affinity, n_neighbors, graph_shift); n_neighbors may be "search"."""
    if not isinstance(affinity, str) or affinity not in AFFINITIES:
        raise ValueError(f"affinity={affinity!r} is not one of {', '.join(map(repr, AFFINITIES))}.")
    if method != "exact":
        raise ValueError(f"the graph objectives run on the sparse graph kernel with method='exact'; got "
                         f"method={method!r}.")
    if not (isinstance(kernel, str) and kernel == "rbf") or gamma is not None:
        raise ValueError("the graph objectives cluster an affinity graph, not a kernel: leave kernel and gamma at "
                         "their defaults and choose the graph with affinity= and n_neighbors= (a precomputed "
                         "affinity matrix: affinity='precomputed').")
    if sample_weight is not None:
        raise ValueError("sample_weight does not apply to the graph objectives: the normalized cut weights every "
                         "point by its degree, the ratio association by 1.")
    if isinstance(n_neighbors, str):
        if n_neighbors != "search":
            raise ValueError(f"n_neighbors={n_neighbors!r} must be an integer or 'search'.")
        if affinity == "precomputed":
            raise ValueError("n_neighbors='search' builds graphs from X; it does not apply to affinity='precomputed'.")
    elif affinity != "precomputed":
        n_neighbors = _validation.check_int(n_neighbors, "n_neighbors", minimum=1)
        if n_neighbors > n - 1:
            raise ValueError(f"n_neighbors={n_neighbors} must be between 1 and n_samples - 1 = {n - 1}.")
    if not (isinstance(graph_shift, str) and graph_shift == "auto"):
        if isinstance(graph_shift, bool) or not isinstance(graph_shift, (int, float, np.floating, np.integer)) \
                or not math.isfinite(graph_shift) or graph_shift < 0:
            raise ValueError(f"graph_shift={graph_shift!r} must be 'auto' or a finite number >= 0.")
        graph_shift = float(graph_shift)
    return affinity, n_neighbors, graph_shift


def _check_affinity_matrix(X, backend):
    """A precomputed affinity on ``backend`` as float64 CSR: square, symmetric, finite, non-negative."""
    xp = backend.xp
    if _sparse.is_sparse(X):
        A = _sparse.to_backend_csr(X, backend, np.float64)
    else:
        dense = _validation.check_data(X, backend, square=True)
        A = _sparse.sparse_module(backend).csr_matrix(dense.astype(xp.float64))
    if A.shape[0] != A.shape[1]:
        raise ValueError(f"affinity='precomputed' needs a square matrix; got shape {A.shape}.")
    if A.nnz and not bool(xp.isfinite(A.data).all()):
        raise ValueError("the affinity matrix has non-finite entries; every entry must be finite.")
    if A.nnz and float(A.data.min()) < 0:
        raise ValueError(f"the affinity matrix has a negative entry ({float(A.data.min()):.4g}); affinities must be "
                         ">= 0.")
    _sparse.check_symmetric_sparse(A, backend, name="the affinity matrix")
    A.eliminate_zeros()
    A.sort_indices()
    return A


def checked_fit(X, k, *, fit_exact, objective, affinity, n_neighbors, graph_shift, kernel, gamma, method,
                sample_weight, device, dtype, init, n_init, max_iter, tol, random_state, verbose, keep_on_device,
                progress, gemm_precision=_gemm.DEFAULT_PRECISION):
    """:func:`kkmgpu.fit` with a graph objective: the checks, then :func:`fit` or :func:`search_neighbors`
    (``gemm_precision``: the mode of a GPU's neighbour search, whose neighbours are exact in every mode)."""
    n = _validation.as_array(X).shape[0] if not _sparse.is_sparse(X) else X.shape[0]
    affinity, n_neighbors, graph_shift = check_graph_args(
        affinity=affinity, n_neighbors=n_neighbors, graph_shift=graph_shift, kernel=kernel, gamma=gamma,
        method=method, sample_weight=sample_weight, n=n)
    if isinstance(init, str) and init not in (*_validation.INIT_NAMES, "spectral"):
        raise ValueError(f"init={init!r} is not valid; use 'auto', 'spectral', 'k-means++', 'random' or an array "
                         "of labels.")
    max_iter, tol, n_init = _validation.check_params(method="exact", max_iter=max_iter, tol=tol, n_init=n_init,
                                                     init="random" if isinstance(init, str) else init,
                                                     update="auto")
    if isinstance(init, str) and n_init == "auto":
        n_init = 1 if init == "k-means++" else 10
    if _gemm.check_precision(gemm_precision) != _gemm.DEFAULT_PRECISION:
        _warn_without_effect(X, affinity, gemm_precision, device, dtype, n)
    kwargs = dict(objective=objective, affinity=affinity, graph_shift=graph_shift, device=device, dtype=dtype,
                  init=init, n_init=n_init, max_iter=max_iter, tol=tol, verbose=verbose,
                  keep_on_device=keep_on_device, progress=progress, fit_exact=fit_exact,
                  gemm_precision=_gemm.check_precision(gemm_precision))
    if n_neighbors == "search":
        return search_neighbors(X, k, random_state=random_state, **kwargs)
    return fit(X, k, n_neighbors=n_neighbors, random_state=random_state, **kwargs)


def _warn_without_effect(X, affinity, gemm_precision, device, dtype, n):
    """The kernel methods' warning (:func:`kkmgpu._validation.gemm_mode_ran`) where an explicit gemm_precision
    has no effect on the neighbour search (CPU, float64, a side below 32) or there is none (precomputed)."""
    from kkmgpu.kernels.spec import KernelSpec

    d = 0 if affinity == "precomputed" else _validation.as_array(X).shape[1]
    spec = KernelSpec("precomputed" if affinity == "precomputed" else "linear", precision=gemm_precision)
    _validation.gemm_mode_ran(gemm_precision, spec, resolve_device(device, (X,)), _validation.check_dtype(dtype),
                              n, d, subject=f"affinity={affinity!r}")


# --- the kernel ------------------------------------------------------------------------------------------------

def degrees(A, backend):
    return backend.xp.asarray(A.sum(axis=1)).ravel().astype(backend.xp.float64)


def psd_shift(A, d, objective, backend, rng) -> float:
    """The smallest sigma making K positive semi-definite, with a 1% margin (0 when it already is)."""
    M = _normalized(A, d, backend) if objective == "ncut" else A
    n = A.shape[0]
    if n <= 2:
        lam = float(np.linalg.eigvalsh(np.asarray(backend.to_host(M.toarray())))[0])
    else:
        v0 = backend.asarray(rng.standard_normal(n))
        eigsh = _eigsh(backend)
        lam = float(eigsh(M, k=1, which="SA", v0=v0, tol=1e-6, return_eigenvectors=False)[0])
    return max(0.0, -lam) * 1.01


def _eigsh(backend):
    if backend.is_gpu:
        return import_cupyx("scipy.sparse.linalg").eigsh
    from scipy.sparse.linalg import eigsh
    return eigsh


def _diag(values, backend):
    """diag(values) in CSR (built from its arrays: cupyx and SciPy alike)."""
    xp = backend.xp
    n = values.shape[0]
    index = xp.arange(n + 1, dtype=xp.int32)
    return _sparse.sparse_module(backend).csr_matrix((values.astype(xp.float64), index[:n], index), shape=(n, n))


def _normalized(A, d, backend):
    """D^-1/2 A D^-1/2 in CSR."""
    s = _diag(d ** -0.5, backend)
    return (s @ A @ s).tocsr()


def graph_kernel(A, d, objective, shift, backend):
    """(K, weights): K = shift D^-1 + D^-1 A D^-1 with weights d (ncut), or K = shift I + A with weights 1."""
    xp = backend.xp
    n = A.shape[0]
    if objective == "ncut":
        inv = _diag(1.0 / d, backend)
        K = inv @ A @ inv + _diag(shift / d, backend)
        weights = d
    else:
        K = A + _diag(xp.full(n, shift, dtype=xp.float64), backend)
        weights = xp.ones(n, dtype=xp.float64)
    K = K.tocsr()
    K.sort_indices()
    return K, weights


def graph_objective(A, d, labels, k, objective, backend) -> float:
    """ncut = k - sum_c links(c, c) / d(c), or -sum_c links(c, c) / |c|, in float64 (empty clusters add 0)."""
    xp = backend.xp
    sp = _sparse.sparse_module(backend)
    n = A.shape[0]
    lab = backend.asarray(labels).astype(xp.int64)
    Y = sp.csr_matrix((xp.ones(n, dtype=xp.float64), (xp.arange(n), lab)), shape=(n, k))
    within = backend.to_host(xp.asarray((Y.T @ (A @ Y)).diagonal())).astype(np.float64)
    if objective == "ncut":
        size = np.bincount(backend.to_host(lab), weights=backend.to_host(d), minlength=k)
        return float(np.sum(1.0 - within[size > 0] / size[size > 0]) + 0.0)
    size = np.bincount(backend.to_host(lab), minlength=k).astype(np.float64)
    return float(-np.sum(within[size > 0] / size[size > 0]))


def offset(objective, shift, n, k) -> float:
    """J - reported objective: sigma (n - k) - k for ncut, sigma (n - k) for the ratio association."""
    return shift * (n - k) - (k if objective == "ncut" else 0.0)


# --- the spectral start ----------------------------------------------------------------------------------------

def spectral_embedding(A, d, k, backend, rng, *, tol=EIGEN_TOL, maxiter=EIGEN_MAXITER):
    """(E, eigenvalues, iterations, solver): E = D^-1/2 V (n, k), V the top-k eigenvectors of D^-1/2 A D^-1/2.

    On the CPU, for a connected graph, by Lanczos (ARPACK's ``eigsh``, largest algebraic, random start vector);
    otherwise by LOBPCG (its start block's first column D^1/2 1, the known top eigenvector). A graph of c
    components has the eigenvalue 1 c times, which a single-vector Krylov method cannot be trusted to find
    more than once and a block method finds; CuPy's Lanczos also breaks down on such invariant subspaces
    (:func:`kkmgpu.engine.embedding._lanczos_failed`), so a GPU keeps LOBPCG.
    Both draw the same start block from ``rng``, so the k-means++ seeds after it are the same on both devices.
    On MNIST-70k's 10-neighbour graph (2-core CPU) eigsh takes 1.1 s against LOBPCG's 5.2 s (120 iterations),
    with the same eigenvalues to 8 digits. ``iterations``: LOBPCG's, or ARPACK's matrix-vector products;
    ``solver``: "arpack", "lobpcg" or "dense" (small n).
    """
    xp = backend.xp
    n = A.shape[0]
    N = _normalized(A, d, backend)
    if n <= 5 * k + 1:  # LOBPCG needs n well above the block size: the dense decomposition
        w, V = np.linalg.eigh(np.asarray(backend.to_host(N.toarray())))
        w, V = w[::-1][:k], backend.asarray(np.ascontiguousarray(V[:, ::-1][:, :k]))
        E = V * (d ** -0.5)[:, None]
        return E, np.sort(np.asarray(w, dtype=np.float64))[::-1], 0, "dense"
    X0 = rng.standard_normal((n, k))
    V, solver = None, "arpack"
    if not backend.is_gpu and _connected(A):
        w, V, iterations = _arpack_top(N, k, X0[:, 0], tol=tol, maxiter=maxiter)
    if V is None:   # a GPU, or ARPACK did not converge
        X0[:, 0] = np.sqrt(backend.to_host(d))
        lobpcg = import_cupyx("scipy.sparse.linalg").lobpcg if backend.is_gpu else _scipy_lobpcg()
        w, V, history = lobpcg(N, backend.asarray(X0), largest=True, tol=tol, maxiter=maxiter,
                               retResidualNormsHistory=True)
        w = backend.to_host(xp.asarray(w))
        iterations, solver = len(history), "lobpcg"
    E = V * (d ** -0.5)[:, None]
    return E, np.sort(np.asarray(w, dtype=np.float64))[::-1], iterations, solver


def _connected(A) -> bool:
    from scipy.sparse.csgraph import connected_components

    return connected_components(A, directed=False, return_labels=False) == 1


def _arpack_top(N, k, v0, *, tol, maxiter):
    """(w, V, matvecs) of the k largest eigenpairs of the sparse symmetric N by ARPACK, or (None, None, 0)
    where it does not converge within ``maxiter`` restarts."""
    from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh

    count = [0]

    def matvec(x):
        count[0] += 1
        return N @ x

    op = LinearOperator(N.shape, matvec=matvec, matmat=lambda X: N @ X, dtype=N.dtype)
    try:
        w, V = eigsh(op, k=k, which="LA", tol=tol, maxiter=maxiter, v0=v0)
    except ArpackNoConvergence:
        return None, None, 0
    order = np.argsort(w)[::-1]
    return w[order], np.ascontiguousarray(V[:, order]), count[0]


def _scipy_lobpcg():
    import warnings

    from scipy.sparse.linalg import lobpcg

    def quiet(*args, **kwargs):
        with warnings.catch_warnings():  # "not reaching the requested tolerance": the start needs no more
            warnings.simplefilter("ignore", UserWarning)
            return lobpcg(*args, **kwargs)
    return quiet


# --- fit -------------------------------------------------------------------------------------------------------

def graph_features(Xd, dtype, backend, center=None):
    """(center, features): X centred in float64 (on its mean, or ``center``), then cast to the compute precision
    (an offset such as 1e7 would otherwise take the float32 digits before the centring could)."""
    from kkmgpu.kernels.blocks import tile_rows

    xp = backend.xp
    ct = np.float64 if _validation.check_dtype(dtype) == np.float64 else np.float32
    center = Xd.mean(axis=0, dtype=xp.float64) if center is None else backend.asarray(center).astype(xp.float64)
    features = xp.empty(Xd.shape, dtype=ct)
    step = tile_rows(Xd.shape[1], 8, backend=backend)
    for i0 in range(0, Xd.shape[0], step):
        features[i0:i0 + step] = (Xd[i0:i0 + step].astype(xp.float64) - center).astype(ct)
    return center, features


def fit(X, k, *, objective, affinity, n_neighbors, graph_shift, device, dtype, init, n_init, max_iter, tol,
        random_state, verbose, keep_on_device, progress, fit_exact, neighbors=None,
        gemm_precision=_gemm.DEFAULT_PRECISION):
    """:func:`kkmgpu.fit` with a graph objective (arguments already checked by ``fit`` as far as it could).

    ``fit_exact``: kkmgpu.fit itself, for the sparse precomputed runs (and the linear k-means of the start).
    ``neighbors``: (index, sq_dist) of :func:`kkmgpu.kernels.graphs.nearest_neighbors` on the same features with
    at least the reach the graph needs, found once by :func:`search_neighbors` for all its fits.
    ``gemm_precision``: the GEMM precision mode of a GPU's neighbour search (the neighbours are exact in each).
    """
    t_start = time.perf_counter()
    rng = _validation.make_rng(random_state)
    backend = resolve_device(device, (X,))
    with memory_situation(dtype=_validation.check_dtype(dtype)), backend.activate():
        state_graph, features, center = None, None, None
        if affinity == "precomputed":
            A = _check_affinity_matrix(X, backend)
            n = A.shape[0]
        else:
            Xd = _validation.check_data(X, backend)
            n = Xd.shape[0]
            center, features = graph_features(Xd, dtype, backend)
            state_graph = _graphs.build_graph(features, n_neighbors, affinity, backend, neighbors=neighbors,
                                              precision=gemm_precision)
            A = state_graph.graph
        k = _validation.check_k(k, n)
        d = degrees(A, backend)
        isolated = int((d <= 0).sum())
        if isolated:
            raise ValueError(f"{isolated} point(s) have no edge in the affinity graph (degree 0); every point needs "
                             "at least one neighbour. Use more neighbours or affinity='knn'.")
        t_graph = time.perf_counter()
        shift = psd_shift(A, d, objective, backend, rng) if graph_shift == "auto" else graph_shift
        K, weights = graph_kernel(A, d, objective, shift, backend)
        t_kernel = time.perf_counter()
        starts, spectral = _starts(init, n_init, A, d, k, backend, rng)
        t_init = time.perf_counter()
        runs = []
        for labels0 in starts:
            runs.append(fit_exact(K, k, kernel="precomputed", sample_weight=backend.to_host(weights),
                                  device=backend.name, dtype=dtype, init=labels0,
                                  n_init=1 if not isinstance(labels0, str) else n_init,
                                  max_iter=max_iter, tol=tol, random_state=rng, verbose=verbose,
                                  keep_on_device=keep_on_device, progress=progress))
        best = min(runs, key=lambda r: r.objective)
        shifted = offset(objective, shift, n, k)
        final = graph_objective(A, d, best.labels, k, objective, backend)
        t_end = time.perf_counter()
        timings = {"graph": t_graph - t_start, "kernel_build": t_kernel - t_graph, "init": t_init - t_kernel,
                   "iterations": float(sum(r.timings.get("iterations", 0.0) for r in runs)), "total": t_end - t_start}
        mode = None if features is None else _gemm.effective_mode(gemm_precision, backend, features.dtype,
                                                                  shape=(n, n, features.shape[1]))  # the search's
        params = {"objective": objective, "affinity": affinity, "graph_shift": shift, "nnz": int(A.nnz),
                  "init": init if isinstance(init, str) else "array", "gemm_precision": gemm_precision,
                  "gemm_mode": mode, **spectral}
        if state_graph is not None:
            params["n_neighbors"] = int(n_neighbors)
        objectives = np.array([r.objective - shifted for r in runs], dtype=np.float64)
        if len(runs) > 1:  # several starts of their own: one restart each
            objectives = np.concatenate([np.asarray(r.objectives, dtype=np.float64) - shifted for r in runs])
        return dataclasses.replace(
            best, objective=final, objective_history=np.asarray(best.objective_history) - shifted,
            objectives=objectives, exact_objective=final, n_init=len(objectives), objective_name=objective,
            kernel=f"graph:{affinity}", kernel_params={"affinity": affinity, **(
                {"n_neighbors": int(n_neighbors)} if state_graph is not None else {})},
            method_params=params, timings=timings, _train_features=None, _trim_state=None,
            _graph_state=GraphState(graph=state_graph, features=features, center=center, objective=objective,
                                    shift=shift))


def _starts(init, n_init, A, d, k, backend, rng):
    """The initial partitions: ``n_init`` spectral ones, or ``init`` itself (a string the driver resolves)."""
    if not (isinstance(init, str) and init == "spectral"):
        return [init], {}
    t0 = time.perf_counter()
    E, w, iterations, solver = spectral_embedding(A, d, k, backend, rng)
    seconds = time.perf_counter() - t0
    from kkmgpu.engine.embedding import EmbeddingOperator
    from kkmgpu.engine.lloyd import run_restarts

    operator = EmbeddingOperator(E, backend.xp.ones(A.shape[0], dtype=backend.xp.float64), backend)
    starts = []
    for _ in range(n_init):  # k-means on the embedding (never its n x n Gram matrix), one k-means++ start each
        best, _, _ = run_restarts(operator, k, init="k-means++", n_init=1, max_iter=300, tol=1e-6, rng=rng,
                                  verbose=False, progress=False)
        starts.append(backend.to_host(best.labels).astype(np.int32))
    return starts, {"spectral_eigenvalues": w.tolist(), "eigensolver": solver, "eigensolver_iterations": iterations,
                    "spectral_seconds": seconds}


def search_neighbors(X, k, *, random_state, device, **kwargs):
    """``n_neighbors="search"``: :func:`fit` with every value of NEIGHBOR_GRID below n; the clustering of lowest
    c-NNC (:class:`kkmgpu.metrics.cnnc.CnncScorer` on X, the neighbour order computed once) is returned, with
    the scores in ``method_params["n_neighbors_search"]`` as (n_neighbors, c-NNC, objective) rows. The nearest
    neighbours are searched once, for the largest value, and every graph takes its own from them."""
    from kkmgpu.metrics.cnnc import CnncScorer

    t0 = time.perf_counter()
    backend = resolve_device(device, (X,))
    with backend.activate():
        Xd = _validation.check_data(X, backend)
        n = Xd.shape[0]
        if n < 3:
            raise ValueError(f"n_neighbors='search' needs at least 3 samples; got {n}.")
        scorer = CnncScorer(Xd, backend)
        grid = [v for v in NEIGHBOR_GRID if v <= n - 1] or [n - 1]
        reach = max(grid[-1], _graphs.SCALE_NEIGHBOR if kwargs["affinity"] == "self_tuning" else 1)
        neighbors = _graphs.nearest_neighbors(graph_features(Xd, kwargs["dtype"], backend)[1], min(reach, n - 1),
                                              backend, kwargs.get("gemm_precision", _gemm.DEFAULT_PRECISION))
    rng = _validation.make_rng(random_state)
    rows, best, best_score = [], None, math.inf
    for value in grid:
        result = fit(X, k, n_neighbors=value, random_state=rng, device=backend.name, neighbors=neighbors, **kwargs)
        score = scorer(result.labels if not backend.is_gpu else backend.to_host(result.labels), k)
        rows.append((value, score, result.objective))
        if kwargs.get("verbose"):
            print(f"[kkmgpu] n_neighbors={value}: c-NNC {score:.5f}, {result.objective_name} {result.objective:.6g}")
        if score < best_score:
            best, best_score = result, score
    params = dict(best.method_params, n_neighbors_search=rows, cnnc=best_score)
    timings = dict(best.timings, n_neighbors_search=time.perf_counter() - t0)
    return dataclasses.replace(best, method_params=params, timings=timings)


# --- predict ---------------------------------------------------------------------------------------------------

def predict(result, X_new, backend, batch_size=None):
    """Labels of new points: their affinities to the training points (as the graph would give them), then the
    nearest cluster in the graph kernel's feature space (the fit's own assignment rule). The new points are
    prepared as the training features (centred in float64 on the training mean, cast, scaled by the fit's power of
    two); their neighbours are exact in every GEMM precision mode (knn_exact.query, ``batch_size`` at a time)."""
    state: GraphState = result._graph_state
    if state.graph is None:
        raise ValueError("this result was fit on a precomputed affinity matrix; predict needs the training "
                         "features to find new points' neighbours. Fit from X (affinity='knn', ...) to predict.")
    xp = backend.xp
    X_new = _validation.check_data(X_new, backend, name="X_new")
    if X_new.shape[1] != state.features.shape[1]:
        raise ValueError(f"X_new has {X_new.shape[1]} features but the model was fit on "
                         f"{state.features.shape[1]}.")
    Q = graph_features(X_new, state.features.dtype, backend, center=state.center)[1]   # as the training features
    W, nearest = _graphs.query_affinity(state.graph, state.features, Q, backend, rows=batch_size)
    labels = backend.asarray(result._train_labels).astype(xp.int64)
    k = result.n_clusters
    n = labels.shape[0]
    sp = _sparse.sparse_module(backend)
    Y = sp.csr_matrix((xp.ones(n, dtype=xp.float64), (xp.arange(n), labels)), shape=(n, k))
    links = xp.asarray((W @ Y).toarray())                       # (m, k): sum of affinities to each cluster
    # the fit's units: weights d / s (s = result._weight_scale), C_c = sum_{i,j in c} w_i w_j K_ij, n_c = d(c) / s;
    # dist(x, c) = K_xx - 2 sum_{j in c} w_j K_xj / n_c + C_c / n_c^2 with K_xj = a_xj / (d_x d_j) (ncut) or a_xj
    sizes = backend.asarray(np.asarray(result.cluster_sizes, dtype=np.float64))      # d(c) or |c|
    internal = sizes / result._weight_scale
    within = backend.asarray(np.asarray(result._within, dtype=np.float64))
    safe, safe_internal = xp.where(sizes > 0, sizes, 1.0), xp.where(internal > 0, internal, 1.0)
    dx = xp.asarray(W.sum(axis=1)).ravel()
    if state.objective == "ncut":
        score = within / safe_internal ** 2 - 2.0 * links / (xp.where(dx > 0, dx, 1.0)[:, None] * safe)
    else:
        score = within / safe_internal ** 2 - 2.0 * links / safe
    score = xp.where(sizes[None, :] > 0, score, xp.inf)
    out = xp.argmin(score, axis=1)
    out = xp.where(dx > 0, out, labels[nearest])  # no neighbour at all (mutual kNN): the nearest point's cluster
    return backend.to_host(out).astype(np.int32)
