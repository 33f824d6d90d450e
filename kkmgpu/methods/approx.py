"""method="approx": approximate kernel k-means (Chitta, Jin, Havens and Jain, KDD 2011; reference [6] and Table 2
of papers/kernel-matrix-trimming.txt).

Centres are restricted to the span of m sampled points B, the landmarks: c = sum_j alpha_j phi(b_j), with

    alpha_c = K_BB^+ K_B^T u_c / n_c                         (u_c: the weights w_j of cluster c, 0 elsewhere)
    dist(i, c) = K_ii - 2 (K_B alpha_c)_i + alpha_c^T K_BB alpha_c

where K_B = K(X, B) is n x m and K_BB = K(B, B). With the Nystrom features A = K_B K_BB^(-1/2) (pseudo-inverse
square root) this is k-means on the rows of A: (K_B alpha_c)_i = a_i . mu_c and alpha_c^T K_BB alpha_c = ||mu_c||^2,
mu_c the weighted mean of A over c, because K_BB^+ K_BB K_BB^+ = K_BB^+. Only the per-point constant
K_ii - ||a_i||^2 differs, which changes no assignment. So the method builds A (n x r, r <= m, one row tile of K_B
at a time: K_B is never held whole) and runs the one Lloyd driver on
:class:`kkmgpu.engine.embedding.EmbeddingOperator`, as method="eigen" does on its eigen-embedding;
``tests/test_approx.py`` checks the labels against the formulas above in float64.

The pseudo-inverse drops the eigenvalues of K_BB at or below m * eps * the largest (eps of the compute precision),
and every negative one (the sigmoid kernel is not positive semi-definite), as the eigen method's prediction does.

The reported objective. For a positive semi-definite (PSD) kernel it is the approximate one, sum_i w_i
dist(i, label_i) with the formula above: an upper bound of the exact kernel k-means objective of the same labels
(the centres are restricted to a subspace of the feature space), and restarts are chosen by it. Without PSD there is
no feature space and no bound: K_ii - ||a_i||^2 is no longer >= 0 (the Schur complement of K_BB) and the approximate
value can be anything (-32.9 where the exact objective of its labels is 2.25, sigmoid kernel). So where the kernel is
not PSD (:func:`bound_holds`: the sigmoid kernel, a polynomial one with coef0 < 0, or any K_BB with an eigenvalue
below -m eps lambda_max), every restart's labels are scored by their exact objective (in tiles, O(sum_c n_c^2 d)
kernel evaluations per restart, no n x n matrix held), the lowest is kept and reported as ``objective`` and
``exact_objective``; ``method_params["reported_objective"]`` says which ("approximate" or "exact").

Memory: K_BB and its float64 eigendecomposition (about (itemsize + 40) m^2 bytes, checked before the landmarks are
drawn), A in float64 (8 n r bytes) and one tile of K_B; never an n x n matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kkmgpu import _validation
from kkmgpu._result import KernelKMeansResult
from kkmgpu.backend.device import check_fits
from kkmgpu.engine.embedding import EmbeddingOperator
from kkmgpu.engine.lloyd import run_restarts
from kkmgpu.engine.sampled import exact_objective
from kkmgpu.engine.source import KernelSource
from kkmgpu.engine.sampling import d2_sample_distinct
from kkmgpu.kernels import blocks as _kernels
from kkmgpu.kernels import spec as _kernel_spec
from kkmgpu.methods import registry

#: default number of landmarks: min(n, max(DEFAULT_LANDMARKS, LANDMARKS_PER_CLUSTER * k))
DEFAULT_LANDMARKS = 1000
LANDMARKS_PER_CLUSTER = 20
LANDMARK_STRATEGIES = ("uniform", "kmeans++")


def default_landmarks(n: int, k: int) -> int:
    return min(n, max(DEFAULT_LANDMARKS, LANDMARKS_PER_CLUSTER * k))


@dataclass(frozen=True)
class ApproxState:
    """What predict needs: the landmarks, the map to the Nystrom features and the centroid sums there."""

    index: np.ndarray        # host int64 (m,): the landmarks' rows in the training data
    projection: object       # device (m, r): K_BB^(-1/2), so that a(x) = k(x, B) @ projection
    centroid_sums: object    # device float64 (k, r): M[c] = sum_{j in c} w_j a_j
    within: np.ndarray       # host float64 (k,): ||M_c||^2
    sizes: np.ndarray        # host float64 (k,)


def check(method, ctx, values):
    """``n_landmarks`` (None or an integer in [k, number of points with positive weight]) and ``landmarks`` (a
    strategy of LANDMARK_STRATEGIES, or the landmarks' indices: :func:`check_landmark_index`)."""
    m, strategy = values["n_landmarks"], values["landmarks"]
    given = not isinstance(strategy, str)
    if method != "approx":
        if m is not None:
            raise ValueError(f"n_landmarks={m!r} only applies to method='approx' (method={method!r}).")
        if given or strategy != "uniform":
            raise ValueError(f"landmarks={_describe(strategy)} only applies to method='approx' (method={method!r}).")
        return None
    if given:
        index = check_landmark_index(strategy, ctx.n, ctx.k)
        if m is not None and _validation.check_int(m, "n_landmarks", minimum=1) != index.size:
            raise ValueError(f"n_landmarks={m} differs from the {index.size} indices given as landmarks; give one "
                             "of the two (n_landmarks=None with landmarks as indices).")
        return {"n_landmarks": int(index.size), "landmarks": index}
    if strategy not in LANDMARK_STRATEGIES:
        raise ValueError(f"landmarks={strategy!r} is not one of {', '.join(map(repr, LANDMARK_STRATEGIES))}, nor "
                         "an array of sample indices.")
    eligible = int((np.asarray(ctx.weights_h) > 0).sum())
    if m is None:
        m = min(eligible, default_landmarks(ctx.n, ctx.k))
    else:
        m = _validation.check_int(m, "n_landmarks", minimum=1)
    if not ctx.k <= m <= eligible:
        raise ValueError(f"n_landmarks={m} must be between k={ctx.k} and the number of samples with a positive "
                         f"sample_weight ({eligible}): the landmarks are distinct samples, and the k centres lie in "
                         "their span.")
    return {"n_landmarks": m, "landmarks": strategy}


def _describe(value):
    """A short repr of a landmarks argument (an index array's shape and dtype, not its values)."""
    if isinstance(value, str):
        return repr(value)
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"<array of shape {tuple(shape)} and dtype {getattr(value, 'dtype', '?')}>"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_landmark_index(landmarks, n, k) -> np.ndarray:
    """Landmarks given as sample indices: a 1-D array-like of at least k distinct integers in [0, n) (a zero
    sample_weight is allowed: the centres may lie in the span of any points). Returns them sorted, host int64."""
    what = f"landmarks={_describe(landmarks)}"
    index = landmarks.get() if hasattr(landmarks, "get") else landmarks  # a CuPy array: its values on the host
    try:
        index = np.asarray(index)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not one of {', '.join(map(repr, LANDMARK_STRATEGIES))}, nor an array of "
                         "sample indices.") from exc
    if index.ndim != 1:
        raise ValueError(f"{what} must be 'uniform', 'kmeans++' or a 1-D array of sample indices; got "
                         f"{index.ndim} dimension(s).")
    if index.dtype == bool:
        raise ValueError(f"{what} is a boolean mask; give the landmarks' indices (np.flatnonzero(mask)).")
    if index.size and index.dtype.kind not in "iu":
        raise ValueError(f"{what} must hold integer sample indices; got dtype {index.dtype}.")
    index = index.astype(np.int64)
    if index.size < k:
        raise ValueError(f"{what} gives {index.size} landmarks; at least k={k} are needed (the k centres lie in "
                         "their span).")
    outside = index[(index < 0) | (index >= n)]
    if outside.size:
        raise ValueError(f"{what} holds the index {int(outside[0])}, outside [0, {n}) (n_samples={n}).")
    index = np.sort(index)
    repeated = index[1:][index[1:] == index[:-1]]
    if repeated.size:
        raise ValueError(f"{what} holds the index {int(repeated[0])} more than once; the landmarks must be "
                         "distinct samples.")
    return index


def choose_landmarks(strategy, m, weights_h, rng, source: KernelSource | None = None, diag=None) -> np.ndarray:
    """The landmarks' indices, sorted: m distinct points with a positive weight (``strategy``: given indices,
    returned as they are).

    "uniform": drawn uniformly without replacement. "kmeans++": D^2 sampling in the kernel's feature space (the
    seeding of k-means++, with m seeds): the first with probability proportional to its weight, each next with
    probability proportional to w_i times its squared feature-space distance to the nearest landmark so far,
    K_ii - 2 K_ib + K_bb, one kernel column per landmark (m passes over the data), on the source's device
    (:func:`kkmgpu.engine.sampling.d2_sample_distinct`: the m uniforms drawn on the host first, one transfer of
    the indices at the end).
    """
    if not isinstance(strategy, str):
        return strategy
    w = np.asarray(weights_h, dtype=np.float64)
    eligible = np.flatnonzero(w > 0)
    if strategy == "uniform":
        return np.sort(rng.choice(eligible, size=m, replace=False)).astype(np.int64)
    backend = source.backend
    xp = backend.xp
    diag = source.diagonal() if diag is None else diag

    def column(b):
        return source.block(0, source.n, source.take(b))[:, 0].astype(xp.float64)

    index = d2_sample_distinct(backend.asarray(diag, dtype=np.float64), backend.asarray(w), m, rng.random(m), column,
                               backend)
    return np.sort(backend.to_host(index)).astype(np.int64)


#: float64 m x m arrays held at once while K_BB is decomposed: K_BB itself, eigh's copy of it, the eigenvectors and
#: LAPACK syevd's workspace (about 2 m^2 values); K_BB in the compute precision comes before them.
EIGH_MATRICES = 5


def check_landmark_memory(m, compute, backend):
    """Raise :class:`kkmgpu.backend.device.InsufficientMemoryError` (a MemoryError naming n_landmarks and the bytes)
    unless K_BB and its eigendecomposition fit the device: checked before the landmarks are drawn."""
    need = m * m * (np.dtype(compute).itemsize + 8 * EIGH_MATRICES)
    check_fits(need, backend, f"the {m} x {m} landmark kernel matrix K_BB of method='approx' (n_landmarks={m}) and "
               f"its float64 eigendecomposition")


def nystrom_features(source: KernelSource, index, backend, verbose=False):
    """(A, projection, diagnostics): A = K_B K_BB^(-1/2) (n, r) in float64, built one row tile of K_B at a time,
    and the projection K_BB^(-1/2) (m, r) in the compute precision."""
    xp = backend.xp
    n, m = source.n, len(index)
    index_d = backend.asarray(index)
    samples = source.take(index_d)
    columns = source.columns(samples, index_d)  # the landmarks' GEMM operand, prepared once for every row tile
    K_BB = source.square(samples, columns).astype(xp.float64)
    K_BB = 0.5 * (K_BB + K_BB.T)
    eigenvalues, U = xp.linalg.eigh(K_BB)
    eigenvalues = backend.to_host(eigenvalues)
    compute = np.dtype(source.A.dtype)
    largest = float(eigenvalues[-1]) if eigenvalues.size else 0.0
    cutoff = m * float(np.finfo(compute).eps) * max(largest, 0.0)
    keep = np.flatnonzero(eigenvalues > cutoff)
    if keep.size == 0:
        raise ValueError(f"the kernel matrix of the {m} landmarks has no eigenvalue above {cutoff:.3g} (largest "
                         f"{largest:.3g}): the kernel is numerically zero or negative definite on these points.")
    projection = U[:, backend.asarray(keep)] * backend.asarray(1.0 / np.sqrt(eigenvalues[keep]))[None, :]
    projection = xp.ascontiguousarray(projection.astype(compute))
    r = int(keep.size)
    check_fits(n * r * 8, backend, f"the {n} x {r} float64 Nystrom features of method='approx' (n_landmarks={m})")
    A = xp.empty((n, r), dtype=xp.float64)
    step = _kernels.tile_rows(m + r, max(np.dtype(compute).itemsize, 8), backend=backend)
    for i0 in range(0, n, step):
        i1 = min(n, i0 + step)
        A[i0:i1] = source.block(i0, i1, samples, columns).astype(compute, copy=False) @ projection
    diagnostics = {"n_landmarks": m, "n_components_used": r, "memory_reduction": m / n,
                   "negative_eigenvalues": int((eigenvalues < 0).sum()),
                   "dropped_eigenvalues": int(m - r),
                   "smallest_eigenvalue": float(eigenvalues[0]), "eigenvalue_cutoff": cutoff}
    if verbose:
        print(f"[kkmgpu] approx: {m} landmarks, Nystrom features of rank {r} "
              f"({m - r} eigenvalues of K_BB dropped, {diagnostics['negative_eigenvalues']} negative)")
    return A, projection, diagnostics


def bound_holds(spec, diagnostics) -> bool:
    """Whether the approximate objective bounds the exact objective of its labels from above: the kernel is
    positive semi-definite as far as the fit can tell. Not for the sigmoid kernel, a polynomial one with coef0 < 0
    (neither is PSD in general), or any kernel whose K_BB has an eigenvalue below -cutoff (the pseudo-inverse's
    m * eps * the largest, which bounds the rounding of a PSD K_BB's eigenvalues): K_BB is a principal submatrix
    of K, so K is then not PSD."""
    if spec.name == "sigmoid" or (spec.name == "polynomial" and spec.coef0 < 0):
        return False
    return not diagnostics["smallest_eigenvalue"] < -diagnostics["eigenvalue_cutoff"]


def run(ctx, params):
    """fit(method="approx"): landmarks, the Nystrom features, then the Lloyd driver on their embedding."""
    X, k, n, spec, backend, dt = ctx.X, ctx.k, ctx.n, ctx.spec, ctx.backend, ctx.dt
    ct = _kernel_spec.compute_dtype(dt)
    if ctx.precomputed:
        if X.dtype != ct:
            check_fits(X.size * ct.itemsize, backend, f"the {n} x {n} {ct.name} copy of K")
        source_array, features = backend.asarray(X, dtype=ct), None
    else:
        source_array = features = _kernels.prepare_features(X, spec, backend, ct)
    check_landmark_memory(params["n_landmarks"], ct, backend)
    source = KernelSource(source_array, spec, backend)
    diag = source.diagonal()
    index = choose_landmarks(params["landmarks"], params["n_landmarks"], ctx.weights_h, ctx.rng, source, diag)
    A, projection, diagnostics = nystrom_features(source, index, backend, verbose=ctx.verbose)
    weights = backend.asarray(ctx.weights_h)
    t_kernel = backend.timer()
    operator = EmbeddingOperator(A, weights, backend)
    best, runs, init_seconds = run_restarts(operator, k, init=ctx.init, n_init=ctx.n_init, max_iter=ctx.max_iter,
                                            tol=ctx.tol, rng=ctx.rng, verbose=ctx.verbose, update="full")
    t_exact = None
    if bound_holds(spec, diagnostics):
        # the approximate objective of Chitta et al. is the embedding's plus sum_i w_i (K_ii - ||a_i||^2)
        offset = float((weights * (diag - operator.diag)).sum())
        objectives = [r.objective + offset for r in runs]
        reported, exact = "approximate", None
    else:
        # no bound without PSD: each restart's labels scored by the exact objective (O(sum_c n_c^2 d)), the lowest
        # chosen; the history stays the embedding's objective, the one the iterations minimise
        offset, t0 = 0.0, backend.timer()
        objectives = [exact_objective(source, backend.to_host(r.labels).astype(np.int64), ctx.weights_h, k, diag)
                      for r in runs]
        best = runs[int(np.argmin(objectives))]
        reported, exact, t_exact = "exact", float(min(objectives)), backend.timer() - t0
    M = operator.centroid_sums(best.labels, k)
    state = ApproxState(index=index, projection=projection, centroid_sums=M,
                        within=backend.to_host((M * M).sum(axis=1)), sizes=np.asarray(best.sizes, dtype=np.float64))
    del A, operator
    t_end = backend.timer()
    timings = {
        "validation": ctx.t_valid - ctx.t_start,
        "kernel_build": t_kernel - ctx.t_valid,  # landmarks, K_BB's eigendecomposition and the Nystrom features
        "init": init_seconds,
        "iterations": float(sum(r.seconds for r in runs)),
        "total": t_end - ctx.t_start,
    }
    if t_exact is not None:
        timings["exact_objective"] = t_exact
    method_params = dict(params, **diagnostics, reported_objective=reported)
    return KernelKMeansResult(
        labels=best.labels if ctx.keep_on_device else backend.to_host(best.labels).astype(np.int32),
        objective=float(best.objective) + offset if exact is None else exact,
        objective_history=np.asarray(best.history, dtype=np.float64) + offset, n_iter=int(best.n_iter),
        converged=bool(best.converged), n_clusters=k, method="approx", kernel=spec.name,
        kernel_params=spec.resolved_params, device=backend.name, dtype=dt.name, timings=timings,
        cluster_sizes=best.sizes.copy(), n_init=ctx.n_init,
        objectives=np.array(objectives, dtype=np.float64), sample_weight=ctx.weights_h,
        exact_objective=exact, stop_reason=best.stop_reason, method_params=method_params,
        _spec=spec, _train_features=features, _train_labels=best.labels, _train_weights=weights,
        _within=best.within.copy(), _n_train=n, _approx_state=state)


def predict(result, X_new, backend, dt, batch_size):
    """Nearest approximate centre: a(x) = k(x, B) K_BB^(-1/2), then argmin_c -2 a(x) . M_c / n_c + ||M_c||^2 / n_c^2."""
    xp = backend.xp
    state = result._approx_state
    index = backend.asarray(state.index)
    P = backend.asarray(state.projection)
    M = backend.asarray(state.centroid_sums)
    step = batch_size or _kernels.tile_rows(len(state.index), max(dt.itemsize, 8), backend=backend)
    out = []
    for i0, i1, block in _kernels.training_kernel_rows(result, X_new, backend, dt, step, index=index):
        S = ((block.astype(P.dtype, copy=False) @ P).astype(xp.float64)) @ M.T
        labels, _, _ = backend.ops.assign_labels(xp.ascontiguousarray(S), xp.zeros(i1 - i0, dtype=xp.float64),
                                                 state.sizes, state.within, xp.zeros(i1 - i0, dtype=xp.int32))
        out.append(backend.to_host(labels))
    return np.concatenate(out).astype(np.int32)


registry.register("approx", "centres in the span of m sampled landmarks (approximate kernel k-means): O(n m) memory",
                  ("n_landmarks", "landmarks"), check, run, predict)
