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
from A for the final labels; ``result.objective_name`` says which. ``verbose`` prints that objective too, for each
start's iterations (J less its constant), never the shifted J; ``progress`` shows one bar over the starts, with
nested bars for the graph build, the shift and the spectral start.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from dataclasses import dataclass

import numpy as np

from kkmgpu import _degenerate, _progress, _validation, _warn
from kkmgpu.backend.device import memory_situation, resolve_device
from kkmgpu.engine import sparse as _sparse
from kkmgpu.engine.lloyd import ConvergenceWarning
from kkmgpu.kernels import gemm as _gemm
from kkmgpu.kernels import graphs as _graphs
from kkmgpu.kernels import sparse_cuda as _products
from kkmgpu.kernels import spec as _kernel_spec
from kkmgpu.methods import graph_scale as _scale
from kkmgpu.methods import graph_refine as _refine
from kkmgpu.methods import graph_spectral as _spectral
from kkmgpu.methods.graph_scale import graph_features
from kkmgpu.methods.graph_spectral import psd_shift, spectral_embedding  # noqa: F401  (re-exported)

OBJECTIVES = ("kernel_kmeans", "ncut", "ratio_association")
GRAPH_OBJECTIVES = ("ncut", "ratio_association")
AFFINITIES = (*_graphs.GRAPHS, "precomputed")
#: the default graph of the graph objectives: self-tuning (Zelnik-Manor and Perona) with 10 neighbours, the best
#: single fixed graph on the tuning half of bench/bench_selection.py (docs/selection.md, round 2)
DEFAULT_AFFINITY = "self_tuning"
DEFAULT_N_NEIGHBORS = 10
#: ``n_neighbors="search"`` tries these (those below n) in the given family: the sizes its rule was chosen on
NEIGHBOR_GRID = (5, 7, 10, 15, 20, 30)


@dataclass
class GraphState:
    """What :func:`predict` needs: the graph's neighbour radii and scales, the training features, the shift."""

    graph: object          # kkmgpu.kernels.graphs.Graph (None for a precomputed affinity)
    features: object       # prepared training features (None for a precomputed affinity)
    center: object         # the mean subtracted from X before the graph was built
    objective: str
    shift: float           # sigma, in the units of A / 2**exponent
    exponent: int = 0      # the fit ran on A / 2**exponent (normalize_scale)
    scaled: int = 0        # the features are (X - center) / 2**scaled (feature_exponent)


# --- checks ----------------------------------------------------------------------------------------------------

def check_objective(objective):
    if not isinstance(objective, str) or objective not in OBJECTIVES:
        raise ValueError(f"objective={objective!r} is not one of {', '.join(map(repr, OBJECTIVES))}.")
    return objective


def check_graph_args(*, affinity, n_neighbors, graph_shift, kernel, gamma, method, sample_weight, n):
    """Validated (affinity, n_neighbors, graph_shift); n_neighbors may be "search"; affinity="search" takes
    n_neighbors "search" or its default (it chooses both) and gives n_neighbors="search"."""
    if not isinstance(affinity, str) or affinity not in (*AFFINITIES, "search"):
        raise ValueError(f"affinity={affinity!r} is not one of {', '.join(map(repr, (*AFFINITIES, 'search')))}.")
    if affinity == "search":
        if not (isinstance(n_neighbors, str) and n_neighbors == "search") and not (
                isinstance(n_neighbors, (int, np.integer)) and n_neighbors == DEFAULT_N_NEIGHBORS):
            raise ValueError(f"affinity='search' chooses the graph's family and its n_neighbors together; got "
                             f"n_neighbors={n_neighbors!r}: leave it at its default (or 'search'), or fix the family.")
        n_neighbors = "search"
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
    if affinity == "self_tuning" and n <= _graphs.SCALE_NEIGHBOR:
        raise ValueError(f"affinity='self_tuning' needs at least {_graphs.SCALE_NEIGHBOR + 1} samples: each point's "
                         f"local scale is its distance to its {_graphs.SCALE_NEIGHBOR}th nearest neighbour "
                         f"(Zelnik-Manor and Perona); got {n}. Use affinity='knn' or 'mutual_knn'.")
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
    if affinity == "search":
        from kkmgpu.methods.graph_search import search_affinity
        return search_affinity(X, k, random_state=random_state, fit=fit, **kwargs)
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

degrees = _products.row_sums   # (A, backend) -> A 1, float64, in a fixed order on both devices


def graph_kernel(A, d, objective, shift, backend):
    """(K, weights): K = shift D^-1 + D^-1 A D^-1 with weights d (ncut), or K = shift I + A with weights 1."""
    xp = backend.xp
    n = A.shape[0]
    if objective == "ncut":
        inv = _spectral.diag(1.0 / d, backend)
        K = inv @ A @ inv + _spectral.diag(shift / d, backend)
        weights = d
    else:
        K = A + _spectral.diag(xp.full(n, shift, dtype=xp.float64), backend)
        weights = xp.ones(n, dtype=xp.float64)
    K = K.tocsr()
    K.sort_indices()
    return K, weights


def graph_objective(A, d, labels, k, objective, backend) -> float:
    """ncut = sum_c links(c, V - c) / d(c), or -sum_c links(c, c) / |c|, in float64 (empty clusters add 0).

    The cut is summed from the edges between clusters themselves, not as k - sum_c links(c, c) / d(c): each point's
    weight to other clusters (A with its within-cluster entries zeroed, summed by rows on the device), then those
    n values by cluster on the host in point order. A partition along the graph's components then has cut exactly
    0 on every device, the sums do not depend on a device's order, and the host receives n values whatever the
    partition. The difference form cancelled: on an H100 links(c, c) (cuSPARSE) and d(c) (another summation order)
    of a perfect partition differed in the last bit, and 2.2e-16 was reported (2026-11-26)."""
    xp = backend.xp
    sp = _sparse.sparse_module(backend)
    n = A.shape[0]
    lab = backend.asarray(labels).astype(xp.int64)
    if objective == "ncut":
        host_labels = backend.to_host(lab)
        size = np.bincount(host_labels, weights=backend.to_host(d), minlength=k)
        A = A.tocsr()
        row = A.tocoo().row  # the entries' rows, in A's CSR order
        across = sp.csr_matrix((A.data * (lab[row] != lab[A.indices]), A.indices, A.indptr), shape=A.shape)
        outward = np.asarray(backend.to_host(_products.row_sums(across, backend)), dtype=np.float64)
        cut = np.bincount(host_labels, weights=outward, minlength=k)
        return float(np.sum(cut[size > 0] / size[size > 0]) + 0.0)
    Y = sp.csr_matrix((xp.ones(n, dtype=xp.float64), (xp.arange(n), lab)), shape=(n, k))
    within = backend.to_host(xp.asarray((Y.T @ (A @ Y)).diagonal())).astype(np.float64)
    size = np.bincount(backend.to_host(lab), minlength=k).astype(np.float64)
    return float(-np.sum(within[size > 0] / size[size > 0]))


def offset(objective, shift, n, k) -> float:
    """J - reported objective: sigma (n - k) - k for ncut, sigma (n - k) for the ratio association (an A without
    self loops: fit adds theirs, sum_i A_ii / d_i or tr A)."""
    return shift * (n - k) - (k if objective == "ncut" else 0.0)


# --- fit -------------------------------------------------------------------------------------------------------

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
    count = n_init if isinstance(init, str) and init == "spectral" else 1     # the starts the bar counts
    with memory_situation(dtype=_validation.check_dtype(dtype)), backend.activate(), \
            _progress.progress_bar(count, desc=objective, unit="start", enabled=progress) as bar:
        # one bar per fit: the graph's, the start's and the shift's bars are nested in it (gone when done)
        state_graph, features, center, scaled = None, None, None, 0
        if affinity == "precomputed":
            A = _check_affinity_matrix(X, backend)
            n = A.shape[0]
        else:
            Xd = _validation.check_data(X, backend)
            n = Xd.shape[0]
            center = _scale.grid_center(Xd, backend)
            scaled = _scale.feature_exponent(Xd, center, _scale.feature_dtype(dtype), backend)
            features = graph_features(Xd, dtype, backend, center, scaled)[1]
            with _spectral.search_threads(features.shape, backend):
                state_graph = _graphs.build_graph(features, n_neighbors, affinity, backend, neighbors=neighbors,
                                                  precision=gemm_precision, progress=progress)
            A = state_graph.graph
        k = _validation.check_k(k, n)
        A, exponent = _scale.normalize_scale(A)
        d = degrees(A, backend)
        _check_degrees(d, affinity, backend)
        t_graph = time.perf_counter()
        if verbose:
            what = "the precomputed affinity" if affinity == "precomputed" else \
                f"the {affinity!r} graph of {int(n_neighbors)} neighbours"
            print(f"[{objective}] {what}: {n} points, {int(A.nnz)} stored edges, {t_graph - t_start:.3g} s",
                  flush=True)
        bar.set_postfix_str("graph built")
        if graph_shift == "auto":
            with _progress.progress_bar(1, desc="graph shift", unit="eigenvalue", enabled=progress) as inner, \
                    _spectral.one_thread(backend):
                shift = _spectral.psd_shift(A, d, objective, backend, rng)
                inner.update()
        else:  # the ratio association's sigma is in A's units, the normalized cut's has none
            shift = graph_shift if objective == "ncut" else math.ldexp(graph_shift, -exponent)
        K, weights = graph_kernel(A, d, objective, shift, backend)
        t_kernel = time.perf_counter()
        if verbose:
            how = "from the smallest eigenvalue, by Lanczos" if graph_shift == "auto" else "given"
            print(f"[{objective}] the graph kernel's shift sigma = {shift:.6g} ({how}), {t_kernel - t_graph:.3g} s",
                  flush=True)
        starts, spectral = _spectral.starts(init, n_init, A, d, k, backend, rng, verbose=verbose, progress=progress,
                                            name=objective)
        t_init = time.perf_counter()
        # J's constant: the shift's, and A's self loops (sum_i w_i K_ii holds sum_i A_ii / d_i, or tr A)
        loops = _self_loops(A, d, backend) if objective == "ncut" else float(backend.to_host(A.diagonal().sum()))
        shifted = offset(objective, shift, n, k) + loops
        bound = _degenerate.ROUNDING * float(np.finfo(_kernel_spec.compute_dtype(
            _validation.check_dtype(dtype))).eps) * (shift * n + k + loops)

        def reported(values):
            """J of the refinement as the objective reported: the cut (or the negated association in A's units)."""
            values = np.asarray(values, dtype=np.float64) - shifted
            # a cut is >= 0: values just below are rounding (kkmgpu._degenerate.ROUNDING)
            return _not_below_rounding(values, bound) if objective == "ncut" else np.ldexp(values, exponent)

        with warnings.catch_warnings(record=True) as caught, _spectral.one_thread(backend):  # said once below
            warnings.simplefilter("always")
            runs = []
            refine = _refine.Refinements(K, weights, k, backend, fit_exact=fit_exact, dtype=dtype, n_init=n_init,
                                  max_iter=max_iter, tol=tol, rng=rng, keep_on_device=keep_on_device,
                                  progress=progress)
            for r, labels0 in enumerate(starts):
                runs.append(refine(labels0))
                cut = float(reported(runs[-1].objective))
                lowest = float(reported(min(run.objective for run in runs)))
                bar.set_postfix_str(f"start {r}: {objective} {cut:.6g}, lowest {lowest:.6g}")
                bar.update()
                if verbose:
                    _say_refinement(runs[-1], r if len(starts) > 1 else None, objective, reported)
            best = refine.result(min(runs, key=lambda r: r.objective))
        _say_again(caught, None if affinity == "precomputed" else Xd, best.labels, backend.to_host(weights), k,
                   backend)
        final = graph_objective(A, d, best.labels, k, objective, backend)
        t_end = time.perf_counter()
        timings = {"graph": t_graph - t_start, "kernel_build": t_kernel - t_graph, "init": t_init - t_kernel,
                   "iterations": float(sum(r.timings.get("iterations", 0.0) for r in runs)), "total": t_end - t_start}
        mode = None if features is None else _gemm.effective_mode(gemm_precision, backend, features.dtype,
                                                                  shape=(n, n, features.shape[1]))  # the search's
        unit = 0 if objective == "ncut" else exponent  # objectives and shift back in A's units (exact: 2**e)
        params = {"objective": objective, "affinity": affinity, "graph_shift": math.ldexp(shift, unit),
                  "nnz": int(A.nnz), "init": init if isinstance(init, str) else "array",
                  "gemm_precision": gemm_precision, "gemm_mode": mode, **spectral}
        if state_graph is not None:
            params["n_neighbors"] = int(n_neighbors)
        # every restart: one per start of its own (arrays), n_init of a single string start (k-means++, random)
        objectives = reported(np.concatenate([np.asarray(r.objectives, dtype=np.float64) for r in runs]))
        history = reported(best.objective_history)
        final = _not_below_rounding(final, bound) if objective == "ncut" else float(np.ldexp(final, exponent))
        if verbose:
            print(f"[{objective}] the lowest of {len(objectives)} start(s): {objective} {final:.10g} (recomputed in "
                  f"float64 from the graph), {t_end - t_start:.3g} s", flush=True)
        sizes = np.ldexp(np.asarray(best.cluster_sizes, dtype=np.float64), exponent if objective == "ncut" else 0)
        return dataclasses.replace(
            best, objective=final, objective_history=history, objectives=objectives, exact_objective=final,
            n_init=len(objectives), objective_name=objective, kernel=f"graph:{affinity}",
            kernel_params={"affinity": affinity, **({"n_neighbors": int(n_neighbors)} if state_graph is not None
                                                    else {})},
            cluster_sizes=sizes, sample_weight=np.ldexp(np.asarray(best.sample_weight, dtype=np.float64),
                                                        exponent if objective == "ncut" else 0),
            method_params=params, timings=timings, _train_features=None, _trim_state=None,
            _graph_state=GraphState(graph=state_graph, features=features, center=center, objective=objective,
                                    shift=shift, exponent=exponent, scaled=scaled))


def _check_degrees(d, affinity, backend):
    """ValueError naming the points of degree 0: with no edge at all, no cut or association is defined for them."""
    isolated = np.flatnonzero(np.asarray(backend.to_host(d)) <= 0)
    if not isolated.size:
        return
    where = ", ".join(map(str, isolated[:5])) + (", ..." if isolated.size > 5 else "")
    if affinity == "precomputed":
        raise ValueError(f"{isolated.size} point(s) have no edge in the affinity matrix (degree 0: no positive entry "
                         f"in row {where}); every point needs at least one. Give each such point an affinity to "
                         "another, or leave it out.")
    raise ValueError(f"{isolated.size} point(s) ({where}) have no edge in the {affinity!r} graph (degree 0).")


def _self_loops(A, d, backend) -> float:
    """sum_i A_ii / d_i: with the shift, sum_i w_i K_ii of the normalized cut's kernel (the scale of its J)."""
    return float(backend.to_host(backend.xp.asarray(A.diagonal() / d).sum()))


def _not_below_rounding(value, bound):
    """``value`` (a float or an array) with entries in [-bound, 0) set to 0."""
    out = np.asarray(value, dtype=np.float64)
    out = np.where((out < 0) & (out >= -bound), 0.0, out) + 0.0
    return float(out) if out.ndim == 0 else out


def _say_refinement(run, start, objective, reported):
    """``verbose``: the refinement of one start as the objective reported (the cut, not the shifted J the inner
    Lloyd driver minimises), iteration by iteration; ``start`` None for a single one."""
    prefix = f"[{objective}] " + ("" if start is None else f"start {start}: ")
    restarts = np.atleast_1d(reported(run.objectives))
    if restarts.size > 1:   # a string init: its own restarts, the history of the lowest
        for r, value in enumerate(restarts):
            print(f"{prefix}init {r}: {objective} {value:.10g}", flush=True)
    for i, value in enumerate(np.atleast_1d(reported(run.objective_history))):
        print(f"{prefix}iteration {i}: {objective} {value:.10g}", flush=True)
    print(f"{prefix}{objective} {float(reported(run.objective)):.10g} after {run.n_iter} iterations "
          f"({run.stop_reason})", flush=True)


def _say_again(caught, Xd, labels, weights_h, k, backend):
    """The refinement's warnings once each, at the caller's line; fewer distinct points in X than k (the kernel
    methods' warning, :func:`kkmgpu._degenerate.warn_fewer_distinct`) said once, in place of the refinement's."""
    distinct = None
    with _warn.collect() as given:
        if Xd is not None and not _k_distinct_rows(Xd, k, backend):
            _degenerate.warn_fewer_distinct(Xd, labels, weights_h, k, backend, set())
    seen = set()
    for w in caught:
        key = (w.category, str(w.message))
        if key in seen:
            continue
        seen.add(key)
        if "distinct clusters" in str(w.message) and issubclass(w.category, ConvergenceWarning):
            distinct = distinct or w
            continue
        _warn.warn(str(w.message), w.category)
    if distinct is not None and "fewer_distinct" not in given:
        _warn.warn(str(distinct.message), distinct.category)


def _k_distinct_rows(Xd, k, backend, rows=1024) -> bool:
    """Whether X's first ``rows`` rows hold k distinct points (by value: -0.0 is 0.0), read a few at a time; then
    X has at least k and warn_fewer_distinct would say nothing (every point of a graph fit has a positive
    weight). Its sort of 1,024 MNIST rows took 80 ms of a 0.45 s fit (2-core CPU)."""
    seen, step, end = set(), 4 * k, min(rows, Xd.shape[0])
    for i0 in range(0, end, step):
        seen.update(row.tobytes() for row in np.asarray(backend.to_host(Xd[i0:min(end, i0 + step)])) + 0.0)
        if len(seen) >= k:
            return True
    return False


def search_neighbors(X, k, *, random_state, device, **kwargs):
    """``n_neighbors="search"``: every size of NEIGHBOR_GRID below n in the given family, scored by the spectral
    gap ratio of :mod:`kkmgpu.methods.graph_search` (no prior), then :func:`fit` on the one chosen; the evidence is
    ``method_params["graph_search"]``. The nearest neighbours are searched once, for the largest size."""
    from kkmgpu.methods.graph_search import search_affinity

    return search_affinity(X, k, random_state=random_state, device=device, fit=fit, families=(kwargs["affinity"],),
                           grid=NEIGHBOR_GRID, prior=None, **kwargs)


# --- predict ---------------------------------------------------------------------------------------------------

def predict(result, X_new, backend, batch_size=None):
    """Labels of new points: their affinities to the training points (as the graph would give them), then the
    nearest cluster in the graph kernel's feature space (the fit's own assignment rule). The new points are
    prepared as the training features (centred in float64 on the training mean, cast, scaled by the fit's power of
    two); their neighbours are exact in every GEMM precision mode (knn_exact.query, ``batch_size`` at a time).

    A new point whose prepared features equal a training point's is that point: it takes its label (of the first
    such training point, the lowest index). The rule above would not always give it: the new point counts the
    training point among its own neighbours, at distance 0, where the training point's graph row leaves itself
    out, and the fit's kernel adds sigma D^-1 on the training point's own diagonal. So predict(X_train) is
    labels_, except where the fit split identical training points among clusters: all copies take the first one's.
    """
    state: GraphState = result._graph_state
    if state.graph is None:
        raise ValueError("this result was fit on a precomputed affinity matrix; predict needs the training "
                         "features to find new points' neighbours. Fit from X (affinity='knn', ...) to predict.")
    xp = backend.xp
    X_new = _validation.check_data(X_new, backend, name="X_new")
    if X_new.shape[1] != state.features.shape[1]:
        raise ValueError(f"X_new has {X_new.shape[1]} features but the model was fit on "
                         f"{state.features.shape[1]}.")
    Q = graph_features(X_new, state.features.dtype, backend, state.center, state.scaled)[1]   # as the training's
    W, nearest = _graphs.query_affinity(state.graph, state.features, Q, backend, rows=batch_size)
    W = W * (2.0 ** -state.exponent)                  # the fit's units, A / 2**exponent (normalize_scale)
    labels = backend.asarray(result._train_labels).astype(xp.int64)
    k = result.n_clusters
    n = labels.shape[0]
    sp = _sparse.sparse_module(backend)
    Y = sp.csr_matrix((xp.ones(n, dtype=xp.float64), (xp.arange(n), labels)), shape=(n, k))
    links = xp.asarray((W @ Y).toarray())                       # (m, k): sum of affinities to each cluster
    # the fit's units: weights d / s (s = result._weight_scale), C_c = sum_{i,j in c} w_i w_j K_ij, n_c = d(c) / s;
    # dist(x, c) = K_xx - 2 sum_{j in c} w_j K_xj / n_c + C_c / n_c^2 with K_xj = a_xj / (d_x d_j) (ncut) or a_xj
    sizes = backend.asarray(np.ldexp(np.asarray(result.cluster_sizes, dtype=np.float64),      # d(c) or |c|
                                     -state.exponent if state.objective == "ncut" else 0))
    internal = sizes / result._weight_scale
    within = backend.asarray(np.asarray(result._within, dtype=np.float64))
    safe, safe_internal = xp.where(sizes > 0, sizes, 1.0), xp.where(internal > 0, internal, 1.0)
    dx = _products.row_sums(W, backend)
    if state.objective == "ncut":
        score = within / safe_internal ** 2 - 2.0 * links / (xp.where(dx > 0, dx, 1.0)[:, None] * safe)
    else:
        score = within / safe_internal ** 2 - 2.0 * links / safe
    score = xp.where(sizes[None, :] > 0, score, xp.inf)
    out = xp.argmin(score, axis=1)
    out = xp.where(dx > 0, out, labels[nearest])  # no neighbour at all (mutual kNN): the nearest point's cluster
    out = xp.where(xp.all(Q == state.features[nearest], axis=1), labels[nearest], out)   # a training point itself
    return backend.to_host(out).astype(np.int32)
