"""``fit(X, k, objective="ncut", method="landmark")``: the normalized cut at millions of points through p
representatives (U-SPEC, Huang et al., TKDE 2020; transfer cut, Li, Wu and Chang, CVPR 2012).

1. p representatives (``n_landmarks``, default min(1500, max(k, n // 4))): k-means centres of min(10 p, n) points drawn
   uniformly (U-SPEC's hybrid selection; :func:`kkmgpu.methods.landmark_graph.representatives`);
2. the sparse bipartite graph B (n x p, CSR): each point linked to its r nearest representatives
   (``landmark_neighbors``, default 5) found by blocked GEMM distances, one row tile at a time, with Gaussian
   weights exp(-d^2 / (2 sigma^2)), sigma the mean distance of those r (U-SPEC's choice); the features are centred
   in float64 and scaled by a power of two as the exact graphs' are (offsets of 1e20, scales of 1e-20);
3. the transfer cut: the k smallest eigenpairs of the p x p problem (D_Y - W_Y) v = lambda D_Y v, dense, and the
   points' parts of the (n + p)-node graph's eigenvectors (:func:`kkmgpu.methods.landmark_graph.transfer_cut`);
   representatives no point links to are dropped (d_Y = 0), and several components (lambda = 0 repeated) are
   nothing special to a dense eigensolver;
4. k-means on the rows of that n x k embedding, each row scaled to unit length (Ng, Jordan and Weiss; measured
   better than the raw rows on MNIST-70k, docs/graphs.md), ``n_init`` k-means++ restarts, the lowest k-means
   objective kept; then, unless ``max_iter=0``, batch Lloyd steps of weighted kernel k-means for the normalized
   cut of the graph W_X = B D_Y^-1 B^T that the bipartite graph induces on the points (the module docstring of
   landmark_graph), O(n r k) each.

``result.objective`` is the normalized cut of the labels on W_X (float64): the bipartite graph's cut needs labels
of the representatives too, while W_X has the same spectral embedding (its generalized eigenvectors are the u of
step 3) and its cut is defined by the points' labels alone, and is what step 4 lowers.

Memory: the n x r neighbours and B (O(n r)), the n x k embedding, one row tile of n_tile x p keys, and the p x p
eigenproblem: never an n x n or n x p dense matrix, nor a copy of X. Time: O(n p d) for the graph (the GEMM),
O(p^3) for the eigenproblem, O(n k^2) per k-means step and O(n r k) per refinement step.

``sample_weight``: positive weights count each point that many times (weighted degrees: d_Y = B^T w, weights
w_i (B 1)_i in the cut); a zero weight is refused (the point would still decide which representatives have an
edge).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from kkmgpu import _degenerate, _progress, _validation
from kkmgpu._result import KernelKMeansResult
from kkmgpu.backend.device import memory_situation, resolve_device
from kkmgpu.kernels import gemm as _gemm
from kkmgpu.kernels import sparse_cuda as _products
from kkmgpu.methods import graph_scale as _scale
from kkmgpu.methods import landmark_graph as _lg

#: defaults: p = default_landmarks(n, k) representatives, each point linked to its DEFAULT_NEIGHBORS nearest
#: (U-SPEC's r). Tuned on MNIST-70k alone (2-core CPU, seeds 0-3, NMI): p = 1500 gave 0.745-0.768 (3 or 5 Lloyd
#: steps for the representatives alike), p = 1000 0.718-0.744; r = 10 gave 0.67-0.68 against r = 5's 0.72-0.75
DEFAULT_LANDMARKS = 1500
DEFAULT_NEIGHBORS = 5
#: below 4 DEFAULT_LANDMARKS points, p = n // SMALL_N_SHARE (at least k): with p = n every point was its own
#: representative, and the bipartite graph mostly each point's edge to itself (mean NMI 0.547 on the selection
#: benchmark's tuning half; n // 2, n // 4, n // 8: 0.693, 0.706, 0.662; bench/selection_tuning/landmark_p.py)
SMALL_N_SHARE = 4


def default_landmarks(n, k) -> int:
    """The default p: min(DEFAULT_LANDMARKS, max(k, n // SMALL_N_SHARE)), and at most n."""
    return min(DEFAULT_LANDMARKS, max(k, n // SMALL_N_SHARE), n)


#: the k-means of the embedding runs on at most this many of its rows (then every row to its nearest centre)
KMEANS_SAMPLE = 100_000


@dataclass
class LandmarkState:
    """What predict needs: the features' preparation, the representatives kept, sigma, and the assignment rule's
    totals (the refinement's P, d(c), links; or the embedding's map and centres when there was no refinement)."""

    center: object           # float64 (d,) subtracted from X: the columns' medians of a strided sample of rows
    exponent: int            # the features are (X - center) / 2**exponent
    dtype: object            # the features' dtype
    reps: object             # device (p', d): the representatives with an edge
    sigma: float             # in the prepared features' units
    r: int
    dy: object               # device (p',)
    refined: bool
    P: object = None         # device (k, p'): Y^T diag(w) B
    size: object = None      # host (k,): d(c)
    links: object = None     # host (k,)
    vmap: object = None      # device (p', k): V / sqrt(1 - lambda), u = D_X^-1 B vmap
    centres: object = None   # device (k, k): the embedding k-means centres
    precision: str = _gemm.DEFAULT_PRECISION   # the GEMM mode of the fit's neighbour search


def check_args(X, k, *, objective, n_landmarks, landmark_neighbors, affinity, n_neighbors, graph_shift, kernel,
               gamma, sample_weight, dtype, init, n_init, max_iter, tol, defaults):
    """Validated (n, k, p, r, weights, init, n_init, max_iter, tol); ``defaults``: fit's (affinity, n_neighbors)."""
    if objective != "ncut":
        raise ValueError(f"method='landmark' minimises the normalized cut: use objective='ncut' (got "
                         f"objective={objective!r}).")
    if (affinity, n_neighbors) != tuple(defaults) or not (isinstance(graph_shift, str) and graph_shift == "auto"):
        raise ValueError("method='landmark' builds its own bipartite graph (each point to its landmark_neighbors "
                         "nearest landmarks, Gaussian weights): leave affinity, n_neighbors and graph_shift at their "
                         f"defaults (got affinity={affinity!r}, n_neighbors={n_neighbors!r}, "
                         f"graph_shift={graph_shift!r}).")
    if not (isinstance(kernel, str) and kernel == "rbf") or gamma is not None:
        raise ValueError("the graph objectives cluster an affinity graph, not a kernel: leave kernel and gamma at "
                         "their defaults with method='landmark'.")
    _validation.check_dtype(dtype)
    shape = getattr(X, "shape", None)
    if shape is None or len(shape) != 2:
        X = _validation.as_array(X)
        shape = X.shape
    n = int(shape[0])
    k = _validation.check_k(k, n)
    p = default_landmarks(n, k) if n_landmarks is None else _validation.check_int(n_landmarks, "n_landmarks")
    if not k <= p <= n:
        raise ValueError(f"n_landmarks={p} must be between k={k} and n_samples={n}: the landmarks are k-means "
                         "centres of the points, and the k eigenvectors come from them.")
    r = min(DEFAULT_NEIGHBORS, p) if landmark_neighbors is None else _validation.check_int(
        landmark_neighbors, "landmark_neighbors")
    if not 1 <= r <= p:
        raise ValueError(f"landmark_neighbors={r} must be between 1 and n_landmarks={p}: each point links to that "
                         "many of its nearest landmarks.")
    weights = _validation.check_sample_weight(sample_weight, n)
    if sample_weight is not None and not (weights > 0).all():
        raise ValueError(f"sample_weight has {int((weights <= 0).sum())} zero weight(s); method='landmark' needs "
                         "positive weights (each point's edges shape the graph). Leave such points out.")
    weights = weights / 2.0 ** math.frexp(float(weights.max()))[1]
    if sample_weight is not None and not (weights > 0).all():
        raise ValueError(f"sample_weight spans {float(np.max(sample_weight)):.3g} to {float(np.min(sample_weight)):.3g}: "
                         "relative to the largest, the smallest weights underflow float64 (below 2**-1074), so those "
                         "points would weigh 0. method='landmark' needs every weight within float64's range of the "
                         "largest; leave the negligible points out or compress the weights' range.")
    if isinstance(init, str):
        if init != "spectral":
            raise ValueError(f"init={init!r}: method='landmark' starts from its transfer-cut embedding ('spectral' or "
                             "'auto') or from an array of labels.")
        n_init = 10 if n_init == "auto" else _validation.check_int(n_init, "n_init", minimum=1)
    else:
        init, n_init = _validation.check_init(init, n, k, 1)
    max_iter = _validation.check_int(max_iter, "max_iter", minimum=0)
    if isinstance(tol, bool) or not isinstance(tol, (int, float, np.floating, np.integer)) or not tol >= 0 \
            or not math.isfinite(tol):
        raise ValueError(f"tol={tol!r} must be a finite number >= 0.")
    return n, k, p, r, weights, init, n_init, max_iter, float(tol)


#: the keyword arguments of kkmgpu.fit that this route reads
FIT_ARGS = ("objective", "n_landmarks", "landmark_neighbors", "affinity", "n_neighbors", "graph_shift", "kernel",
            "gamma", "sample_weight", "device", "dtype", "init", "n_init", "max_iter", "tol", "random_state", "verbose",
            "keep_on_device", "progress", "gemm_precision")


def routed(method, objective, n_landmarks, landmark_neighbors) -> bool:
    """Whether :func:`kkmgpu.fit` takes this route (method="landmark"); ValueError for its parameters elsewhere."""
    if isinstance(method, str) and method == "landmark":
        return True
    if landmark_neighbors is not None:
        raise ValueError(f"landmark_neighbors={landmark_neighbors!r} only applies to method='landmark' "
                         f"(method={method!r}).")
    if objective in ("ncut", "ratio_association") and n_landmarks is not None:
        raise ValueError(f"n_landmarks={n_landmarks!r} applies to the graph objectives only with method='landmark' "
                         f"(method={method!r}).")
    return False


def fit(X, k, *, objective="ncut", n_landmarks=None, landmark_neighbors=None, affinity, n_neighbors,
        graph_shift="auto", kernel="rbf", gamma=None, sample_weight=None, device="auto", dtype="float32",
        init="spectral", n_init="auto", max_iter=300, tol=1e-6, random_state=None, verbose=False,
        keep_on_device=False, progress=False, gemm_precision=_gemm.DEFAULT_PRECISION, fit=None):
    """:func:`kkmgpu.fit` with objective="ncut", method="landmark" (module docstring); ``fit``: kkmgpu.fit, whose
    default affinity and n_neighbors this route requires (it builds its own graph)."""
    t_start = time.perf_counter()
    if fit is not None:
        import inspect

        parameters = inspect.signature(fit).parameters
        defaults = (parameters["affinity"].default, parameters["n_neighbors"].default)
    else:
        defaults = None
    n, k, p, r, weights_h, init, n_init, max_iter, tol = check_args(
        X, k, objective=objective, n_landmarks=n_landmarks, landmark_neighbors=landmark_neighbors, affinity=affinity,
        n_neighbors=n_neighbors, graph_shift=graph_shift, kernel=kernel, gamma=gamma, sample_weight=sample_weight,
        dtype=dtype, init=init, n_init=n_init, max_iter=max_iter, tol=tol,
        defaults=defaults if defaults is not None else (affinity, n_neighbors))
    gemm_precision = _gemm.check_precision(gemm_precision)
    rng = _validation.make_rng(random_state)
    backend = resolve_device(device, (X,))
    say = (lambda text: print(f"[kkmgpu] landmark: {text}", flush=True)) if verbose else (lambda text: None)
    timings = {}
    with memory_situation(dtype=_validation.check_dtype(dtype)), backend.activate(), _progress.progress_bar(
            5, desc="ncut (landmark)", unit="step", enabled=progress) as bar:
        xp = backend.xp
        Xd = _validation.check_data(X, backend)
        ct = _scale.feature_dtype(dtype)
        # the bulk's median, not the mean: one point at 1e15 moves the mean far from every other point, and the
        # GEMM-form keys |r|^2 - 2 x.r then lose their digits to the offset (NMI 0.003 in float64, 0.79 here)
        center = backend.asarray(_scale.bulk(Xd, backend)[0])
        exponent = _exponent(Xd, center, ct, backend)
        weights = backend.asarray(weights_h)
        clock = time.perf_counter()
        timings["validation"] = clock - t_start

        def step(name, text):
            nonlocal clock
            now = time.perf_counter()
            timings[name] = now - clock
            clock = now
            bar.set_postfix_str(text)
            bar.update()
            say(f"{text} ({timings[name]:.2f} s)")

        R, sample = _lg.representatives(Xd, p, center, exponent, ct, rng, backend)
        step("representatives", f"{p} representatives: k-means centres of {sample} sampled points")
        index, sq = _neighbors(Xd, R, r, center, exponent, ct, backend, gemm_precision, progress=progress)
        sigma = _lg.sigma_of(sq, backend)
        _lg.check_finite_sigma(sigma)
        B = _lg.bipartite(index, sq, sigma, p, backend)
        del index, sq
        rows, dx, dy = _lg.degrees(B, weights, backend)
        B, dy, kept = _lg.keep_linked(B, dy, backend)
        p_kept = int(B.shape[1])
        if p_kept < k:
            raise ValueError(f"only {p_kept} of the {p} landmarks are among a point's {r} nearest; the transfer cut "
                             f"needs at least k={k}. Raise landmark_neighbors or lower k (the data may have fewer "
                             "distinct points than k).")
        step("graph", f"bipartite graph: {n} points x {p_kept} landmarks, {r} edges a point, sigma {sigma:.4g}")
        U, lam, V = _lg.transfer_cut(B, rows, dy, weights, k, backend)
        gamma_values = 1.0 - np.sqrt(np.clip(1.0 - lam, 0.0, None))
        step("eigen", "transfer cut: lambda " + ", ".join(f"{v:.4g}" for v in lam))
        E = _unit_rows(U, xp)
        centres = None
        if isinstance(init, str):
            labels, centres, start_cut, embedding_converged = _embedding_kmeans(
                backend.to_host(E), k, n_init, rng, weights_h, B, rows, dy, weights, backend)
        else:
            labels = backend.asarray(init).astype(xp.int64)
            embedding_converged = True
        P, size = _lg.cluster_totals(B, labels, weights, rows, k, backend)
        start_cut, links = _lg.ncut(P, size, dy, backend)
        step("kmeans", f"k-means on the {n} x {k} embedding ({n_init} starts): ncut {start_cut:.6g}")
        cut = start_cut
        if max_iter > 0:
            labels, history, n_iter, converged, (P, size, cut, links) = _lg.refine(
                B, rows, dy, weights, labels, k, max_iter, tol, backend, (P, size, start_cut, links),
                report=(lambda it, value: say(f"refinement step {it}: ncut {value:.10g}")) if verbose else None)
        else:
            history, n_iter, converged = [start_cut], 0, embedding_converged
        step("refinement", f"refinement: ncut {start_cut:.6g} -> {cut:.6g} in {n_iter} step(s)")
        timings.update(kernel_build=timings["representatives"] + timings["graph"] + timings["eigen"],
                       init=timings["kmeans"], iterations=timings["refinement"], total=time.perf_counter() - t_start)
        state = LandmarkState(center=center, exponent=exponent, dtype=ct, reps=R[kept], sigma=sigma, r=r, dy=dy,
                              refined=max_iter > 0, P=P, size=backend.to_host(size), links=links,
                              vmap=backend.asarray(V * _inverse_root(lam)[None, :]), centres=centres,
                              precision=gemm_precision)
        unit = math.ldexp(sigma, exponent)     # sigma in X's units
        params = {"objective": "ncut", "affinity": f"bipartite to {p_kept} landmarks", "n_neighbors": r,
                  "n_landmarks": p, "landmarks_linked": p_kept, "landmark_neighbors": r,
                  "sigma": unit, "sample_size": sample, "eigenvalues": lam.tolist(),
                  "bipartite_eigenvalues": gamma_values.tolist(), "nnz": int(B.nnz), "start_ncut": start_cut,
                  "refined": max_iter > 0, "init": init if isinstance(init, str) else "array",
                  "gemm_precision": gemm_precision,
                  "gemm_mode": _gemm.effective_mode(gemm_precision, backend, ct, shape=(n, p, Xd.shape[1]))}
        sizes_h = np.asarray(backend.to_host(size), dtype=np.float64)
        _degenerate.warn_fewer_distinct(Xd, labels, weights_h, k, backend, set())
        history = np.asarray(history, dtype=np.float64)
        return KernelKMeansResult(
            labels=labels.astype(xp.int32) if keep_on_device else backend.to_host(labels).astype(np.int32),
            objective=cut, objective_history=history, n_iter=int(n_iter), converged=bool(converged), n_clusters=k,
            method="landmark", kernel="graph:landmark", kernel_params={"n_landmarks": p, "landmark_neighbors": r,
                                                                         "sigma": unit},
            device=backend.name, dtype=np.dtype(dtype).name, timings=timings, cluster_sizes=sizes_h, n_init=n_init,
            objectives=np.array([cut]), sample_weight=_validation.check_sample_weight(sample_weight, n),
            exact_objective=cut,
            stop_reason=("no point moved" if converged else "max_iter") if max_iter > 0 else "no refinement",
            method_params=params, objective_name="ncut", _train_labels=labels, _n_train=n, _graph_state=state)


def _embedding_kmeans(E, k, n_init, rng, weights_h, B, rows, dy, weights, backend):
    """(labels (device int64), centres (device (k, k)), cut, converged): scikit-learn's k-means (k-means++, one
    start each, seeded from ``rng``) ``n_init`` times on the host rows of E, weighted by sample_weight; the start of
    lowest normalized cut on W_X is kept (its cut, not the k-means objective on E, is what the fit minimises:
    measured better on MNIST-70k). Above KMEANS_SAMPLE points the k-means runs on that many rows drawn uniformly
    (one draw for every start), and every point then goes to its nearest centre: O(n k^2) per start beyond it."""
    import warnings

    from sklearn.cluster import KMeans
    from sklearn.exceptions import ConvergenceWarning

    n = E.shape[0]
    pick = np.sort(rng.choice(n, size=KMEANS_SAMPLE, replace=False)) if n > KMEANS_SAMPLE else None
    best = None
    for _ in range(n_init):
        km = KMeans(k, init="k-means++", n_init=1, random_state=int(rng.integers(2 ** 31 - 1)), algorithm="lloyd")
        with warnings.catch_warnings():   # fewer distinct rows than k: said once by fit, at the caller's line
            warnings.simplefilter("ignore", ConvergenceWarning)
            if pick is None:
                km.fit(E, sample_weight=weights_h)
                labels = km.labels_
            else:
                labels = km.fit(E[pick], sample_weight=weights_h[pick]).predict(E)
        labels = backend.asarray(labels.astype(np.int64))
        P, size = _lg.cluster_totals(B, labels, weights, rows, k, backend)
        cut = _lg.ncut(P, size, dy, backend)[0]
        if best is None or cut < best[2]:
            best = (labels, km.cluster_centers_, cut, km.n_iter_ < km.max_iter)
    labels, centres, cut, converged = best
    return labels, backend.asarray(np.ascontiguousarray(centres, dtype=np.float64)), cut, converged


def _exponent(Xd, center, ct, backend) -> int:
    """:func:`kkmgpu.methods.graph_scale.feature_exponent`'s power of two, from the columns' extremes: the largest
    |x - center| is the largest of max - center and center - min over the columns (the extremes exact in float64),
    two passes over X in its own dtype instead of a float64 copy of every tile (26 s of 165 s at 10^6 x 784)."""
    xp = backend.xp
    if not xp.issubdtype(Xd.dtype, xp.floating):
        return _scale.feature_exponent(Xd, center, ct, backend)
    high = Xd.max(axis=0).astype(xp.float64) - center
    low = center - Xd.min(axis=0).astype(xp.float64)
    return _scale.exponent_of(float(xp.maximum(high, low).max()), ct)


def _neighbors(Xd, R, r, center, exponent, ct, backend, precision, rows=None, progress=False):
    """(index, sq_dist) (n, r) of every row of Xd, one tile of prepared features at a time (a nested bar over the
    tiles with ``progress``)."""
    xp = backend.xp
    n = Xd.shape[0]
    step = rows or _lg.rows_per_tile(R.shape[0], Xd.shape[1], np.dtype(ct).itemsize, backend)
    index = xp.empty((n, r), dtype=xp.int64)
    sq = xp.empty((n, r), dtype=xp.float64)
    for i0 in _progress.iterate(range(0, n, step), desc="nearest landmarks", unit="tile", enabled=progress):
        i1 = min(n, i0 + step)
        index[i0:i1], sq[i0:i1] = _lg.nearest(_lg.features(Xd, i0, i1, center, exponent, ct, backend), R, r,
                                              backend, precision)
    return index, sq


def _unit_rows(U, xp):
    norms = xp.sqrt((U * U).sum(axis=1))
    return U / xp.where(norms > 0, norms, 1.0)[:, None]


def _inverse_root(lam):
    root = np.sqrt(np.clip(1.0 - lam, 0.0, None))
    return np.divide(1.0, root, out=np.zeros_like(root), where=root > 0)


def new_graph(state, X_new, backend, batch_size=None):
    """(B, rows): the new points' bipartite rows to the fit's linked representatives, with the fit's sigma."""
    Xn = _validation.check_data(X_new, backend, name="X_new")
    if Xn.shape[1] != state.reps.shape[1]:
        raise ValueError(f"X_new has {Xn.shape[1]} features but the model was fit on {state.reps.shape[1]}.")
    index, sq = _neighbors(Xn, state.reps, state.r, state.center, state.exponent, state.dtype, backend,
                           state.precision, rows=batch_size)
    B = _lg.bipartite(index, sq, state.sigma, state.reps.shape[0], backend)
    return B, _products.row_sums(B, backend)


def checked_predict(result, X_new, batch_size=None):
    """:func:`kkmgpu.predict` of a landmark fit, on its device."""
    backend = resolve_device(result.device)
    with backend.activate():
        return predict(result, X_new, backend, batch_size)


def predict(result, X_new, backend, batch_size=None):
    """Labels of new points by the fit's own last rule on their r nearest representatives: the refinement's
    assignment (weighted kernel k-means on W_X), or without refinement the nearest embedding centre of their
    rows u = D_X^-1 B V (I - Lambda)^-1/2, scaled to unit length. A training point gets its own bipartite row back,
    so predict(X_train) is labels_ wherever the fit ended with no point moving."""
    state: LandmarkState = result._graph_state
    xp = backend.xp
    B, rows = new_graph(state, X_new, backend, batch_size)
    if state.refined:
        labels = _lg.assign(B, rows, state.P, state.size, state.links, state.dy, backend)
    else:
        E = _unit_rows(xp.asarray(_products.product(B, state.vmap, backend)) / rows[:, None], xp)
        C = state.centres
        score = (C * C).sum(axis=1)[None, :] - 2.0 * (E @ C.T)
        labels = xp.argmin(score, axis=1)
    return backend.to_host(labels).astype(np.int32)


def score_rows(result, X, sample_weight=None) -> float:
    """The normalized cut of the rows of X under their predicted labels on their own graph W_X (their bipartite
    rows to the fit's representatives): the estimator's -score. The training rows give result.objective."""
    state: LandmarkState = result._graph_state
    backend = resolve_device(result.device)
    with backend.activate():
        xp = backend.xp
        B, rows = new_graph(state, X, backend)
        labels = backend.asarray(predict(result, X, backend)).astype(xp.int64)
        w = backend.asarray(_validation.check_sample_weight(sample_weight, B.shape[0]))
        dy = xp.asarray(_products.product(_lg.transposed(B), w, backend)).ravel()
        B, dy, _ = _lg.keep_linked(B, dy, backend)
        P, size = _lg.cluster_totals(B, labels, w, rows, result.n_clusters, backend)
        return _lg.ncut(P, size, dy, backend)[0]
