"""The functional API: :func:`fit`, :func:`predict` and :func:`kernel_matrix`."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from kkmgpu import _degenerate, _validation, _warn

from kkmgpu.kernels import blocks as _kernels

from kkmgpu.kernels import spec as _kernel_spec
from kkmgpu.kernels.gemm import DEFAULT_PRECISION
from kkmgpu.backend.device import memory_situation, resolve_device
from kkmgpu.engine import sparse as _sparse
from kkmgpu.methods import registry as _methods
from kkmgpu.methods import exact, cats, eigen, trimmed, approx  # noqa: F401  (each registers itself, in this order)
from kkmgpu.methods import graphcut, landmark_cut
from kkmgpu._progress import check_progress, scope as progress_scope
from kkmgpu._result import KernelKMeansResult, in_user_units
from kkmgpu import _gamma_search

__all__ = ["fit", "predict", "kernel_matrix"]


def _prepare_inputs(X, backend, spec_args, dtype, precomputed, center_linear=True):
    """Validated data on the device and the resolved kernel spec (centre and scales from X, see with_center)."""
    X = _validation.check_data(X, backend, square=precomputed)
    spec = _kernel_spec.resolve_kernel(X=X, xp=backend.xp, **spec_args)
    spec = _kernel_spec.with_center(spec, X, backend.xp, dtype, center_linear=center_linear)
    return X, spec


def kernel_matrix(X, Y=None, *, kernel="rbf", gamma=None, degree=3, coef0=None, kernel_params=None,
                  device="auto", dtype="float32", gemm_precision=DEFAULT_PRECISION):
    """The kernel matrix between the rows of X and Y, built in tiles on the chosen device.

    Parameters
    ----------
    X : array of shape (n_samples_X, n_features)
    Y : array of shape (n_samples_Y, n_features), optional
        Defaults to X. Data-scale defaults (``gamma="scale"``) are taken from X.
    kernel, gamma, degree, coef0, kernel_params
        As for :func:`fit` ("precomputed" is not accepted here).
    device : {"auto", "cpu", "cuda", "cuda:N"}
    dtype : {"float32", "float64", "float16"}
        Storage precision (float16 is computed in float32, then rounded).
    gemm_precision : {"3xtf32", "fp32", "tf32"}, default="3xtf32"
        As for :func:`fit`.

    Returns
    -------
    K : array of shape (n_samples_X, n_samples_Y)
        NumPy on the CPU, CuPy on a GPU.

    Raises
    ------
    InsufficientMemoryError
        If the matrix would not fit the device's free memory.
    """
    dt = _validation.check_dtype(dtype)
    backend = resolve_device(device, (X,) if Y is None else (X, Y))
    if _kernel_spec.canonical_kernel_name(kernel) == "precomputed":
        raise ValueError("kernel='precomputed' makes no sense for kernel_matrix; pass a kernel function.")
    with memory_situation(dtype=dt), backend.activate():
        X, spec = _prepare_inputs(X, backend, dict(kernel=kernel, gamma=gamma, degree=degree, coef0=coef0,
                                                   kernel_params=kernel_params, precision=gemm_precision), dt, False,
                                  center_linear=False)
        ct = _kernel_spec.compute_dtype(dt)
        _validation.gemm_mode_ran(gemm_precision, spec, backend, dt, X.shape[0], X.shape[1])
        A = _kernels.prepare_features(X, spec, backend, ct)
        if Y is None:
            B = A
        else:
            Y = _validation.check_data(Y, backend, name="Y")
            if Y.shape[1] != X.shape[1]:
                raise ValueError(f"Y has {Y.shape[1]} features but X has {X.shape[1]}; they must match.")
            B = _kernels.prepare_features(Y, spec, backend, ct)
        K = _kernels.build_kernel_matrix(A, B, spec, backend, storage=dt)
        if spec.value_scale != 1.0:  # computed as K / value_scale (a power of two): back to the kernel's units
            top = float(backend.xp.abs(K).max()) * spec.value_scale
            if top > float(np.finfo(dt).max):
                raise ValueError(f"{spec.describe()} has values up to {top:.5g} on these data, beyond {dt.name}'s "
                                 f"largest value {float(np.finfo(dt).max):.5g}; use dtype='float64' or scale X.")
            if spec.value_scale > float(np.finfo(dt).max):  # the factor itself is not a float16
                K = (K.astype(np.float32) * np.float32(spec.value_scale)).astype(dt)
            else:
                K *= spec.value_scale
        return K


def fit(X, k, *, kernel="rbf", gamma=None, degree=3, coef0=None, kernel_params=None, method="exact",
        device="auto", dtype="float32", init="auto", n_init="auto", max_iter=300, tol=1e-6,
        sample_weight=None, random_state=None, verbose=False, keep_on_device=False,
        update="auto", n_samples_per_cluster=None, window=None, theta=None, rcond=None,
        exact_objective=False, n_components=None, engine="auto", gemm_precision=DEFAULT_PRECISION,
        trim_vote_fraction=None, trim_slack=None, trim_h=None, trim_max_size=None, n_landmarks=None,
        landmarks="uniform", objective="kernel_kmeans", affinity=graphcut.DEFAULT_AFFINITY,
        n_neighbors=graphcut.DEFAULT_N_NEIGHBORS, graph_shift="auto", progress=False, tf32=None,
        landmark_neighbors=None) -> KernelKMeansResult:
    """Cluster the rows of X into k clusters with kernel k-means.

    Lloyd iterations on the kernel matrix (papers' Eq. 3-4): every point moves to the cluster whose
    feature-space mean is nearest, until no point moves or the objective stops improving.

    Parameters
    ----------
    X : array of shape (n_samples, n_features), or (n_samples, n_samples) for kernel="precomputed"
        NumPy or CuPy array, or array-like. With a CuPy input and ``device="auto"`` its GPU is used.
    k : int
        Number of clusters, 1 <= k <= n_samples.
    kernel : str or callable, default="rbf"
        "rbf", "polynomial", "sigmoid" (the papers' "neural" kernel), "linear", "laplacian",
        "precomputed", or a callable ``f(A, B, **kernel_params)`` returning the (len(A), len(B))
        block. See :mod:`kkmgpu.kernels.spec` for formulas and defaults.
    gamma : float or {"scale", "auto", "search"}, optional
        Kernel coefficient. Default "scale" = 1 / (n_features * v) for rbf, 1 / sqrt(n_features * v) for
        laplacian, v = X.var(axis=0).mean() the mean per-feature variance (the same rule for the
        laplacian's unsquared distance; both independent of X's units and of per-column offsets),
        "auto" = 1 / n_features for polynomial and sigmoid. The Off-the-grid paper's sigma is 1 / gamma.
        "search" (rbf, method="exact"): :func:`kkmgpu.search_bandwidth` with this call's k, init,
        random_state, sample_weight, max_iter, tol, device and dtype picks the clustering of lowest
        c-NNC; the fit then runs at its gamma from its labels, and the search result is in
        ``result.method_params["bandwidth_search"]`` (n_init is not used: one initial partition). fit's
        defaults init="k-means++", dtype="float32" differ from search_bandwidth's "random", "float64":
        pass the same to both to get the same search.
    degree : int, default=3
        Degree of the polynomial kernel.
    coef0 : float, optional
        Constant of the polynomial and sigmoid kernels (default 1).
    kernel_params : dict, optional
        Keyword arguments of a callable kernel.
    method : {"exact", "cats", "eigen", "trimmed", "approx", "landmark"}, default="exact"
        "exact" holds the dense n x n kernel matrix on the device. "cats" (Centroid Approximation
        Through Sampling, papers/cats-centroid-approximation.txt) approximates each centroid by the
        best combination of ``n_samples_per_cluster`` sampled members and never forms the n x n
        matrix: O(n k l d) time and at most O(n k l) memory per iteration. "eigen"
        (papers/kernel-kmeans-trace-objective-eigendecomposition.txt, Algorithm 16) decomposes
        K = V Lambda V^T on the device and runs Lloyd k-means on A = V Lambda^(1/2) (A A^T = K),
        negative eigenvalues clipped to 0 and reported in ``result.method_params``. "trimmed"
        (papers/kernel-matrix-trimming.txt, Section 3) builds K, trims every row below the size of its
        cluster estimated by voting (:func:`kkmgpu.trim_kernel_matrix`), frees K and iterates on the sparse
        K* = max(K_hat, K_hat^T) in O(nnz) per iteration (the voting counts every point once;
        ``sample_weight`` weights the iterations); ``result.method_params`` records the estimated
        number of clusters, their sizes and the density nnz / n^2. A sparse X with kernel="precomputed"
        (scipy.sparse or cupyx.scipy.sparse) is clustered as given, in O(nnz) per iteration. "approx"
        (approximate kernel k-means, Chitta et al. 2011) restricts the centres to the span of
        ``n_landmarks`` sampled points: k-means on their Nystrom features K_B K_BB^(-1/2), O(n m) memory,
        no n x n matrix; ``result.objective`` is its approximate objective (an upper bound of the exact one).
        "landmark" (objective="ncut"): the cut through ``n_landmarks`` (default min(1500, max(k, n // 4)))
        k-means representatives, O(n (d + r)) memory, no n x n work (:mod:`kkmgpu.methods.landmark_cut`; docs/graphs.md, "Landmark route").
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
        "auto" takes the GPU when CuPy and a device are usable, else the CPU.
        ``KKMGPU_DEVICE=cpu`` in the environment forces the CPU.
    dtype : {"float32", "float64", "float16"}, default="float32"
        Storage precision of the kernel matrix. "float16" halves its memory (MNIST-70k: 9.8 GB
        instead of 19.6 GB); features and kernel values are then computed in float32 and rounded
        on storage (about 3 significant digits), and cluster sums still accumulate in float64.
    init : {"auto", "k-means++", "random", "spectral"} or array of shape (n_samples,), default="auto"
        "random" is a random partition (as in the papers); "k-means++" seeds in feature space with
        kernel distances; "spectral" (graph objectives only) clusters the top-k eigenvectors of the
        normalised graph (Lanczos or LOBPCG), then refines; an array gives the initial labels (a deterministic run,
        identical on every backend). "auto": "spectral" for a graph objective, else "k-means++".
    n_init : int or "auto", default="auto"
        Restarts; the lowest objective is kept. "auto": 10 for "random" and "spectral", 1 otherwise.
    max_iter : int, default=300
        Maximum number of assignment steps per restart.
    tol : float, default=1e-6
        Stop when |J_prev - J| <= tol * |J_prev| (J the objective). Iterations always stop when
        no point changes cluster.
    sample_weight : array of shape (n_samples,), optional
        Non-negative finite weights: cluster means and the objective are weighted. Only their ratios
        matter: they are divided by a power of two near their maximum for the iterations (weights of
        1e38 or 1e-50 give the labels of weights of 1), and ``objective`` and ``cluster_sizes`` are
        reported in the given weights' units (the objective is linear in a common scale of the weights).
    random_state : int, numpy Generator or None
        Seeds initialisation; the same seed gives the same labels on the same backend.
    verbose : bool, default=False
        Print the kernel build and the objective at every iteration.
    progress : bool, default=False
        Show a progress bar (tqdm when installed, plain lines on stderr otherwise) over the
        initialisations, with the iteration and objective; with ``engine="tiled"`` also one over the rows
        of every pass; with ``gamma="search"`` one over the search's runs.
    keep_on_device : bool, default=False
        Return ``labels`` as a device (CuPy) array instead of NumPy int32.
    update : {"auto", "full", "incremental"}, default="auto"
        How the cluster sums follow an assignment step: "full" re-reads all of K; "incremental"
        adds K[:, moved] dY for the m points that moved (reads 2m of the n rows); "auto" takes
        whichever reads fewer bytes. Labels are the same either way; S is recomputed in full at
        least every 16 steps.
    engine : {"auto", "dense", "tiled"}, default="auto"
        method="exact": "dense" builds and keeps the n x n kernel matrix (raises
        InsufficientMemoryError when it does not fit); "tiled" never forms it and recomputes kernel
        tiles from X every iteration (a GEMM tile, the kernel epilogue and the per-cluster sums fused;
        the incremental update recomputes only the n x m tiles of the m points that moved):
        O(n d + n k) memory, 2 n^2 d flops per full pass, the same labels as "dense" from the same
        initial labels up to rounding. "auto" is "dense" when K fits the device's free memory, else
        "tiled" with a UserWarning. The tiled engine computes in float32 for dtype="float16".
    gemm_precision : {"3xtf32", "fp32", "tf32"}, default="3xtf32"
        The precision of every GEMM of features into kernel values (the dense build, the tiled engine, CATS's,
        approx's and eigen's blocks, predict), float32 data on an NVIDIA GPU with tensor cores (Ampere or
        newer): "3xtf32" splits each operand into a TF32 part and its remainder (one tensor-core GEMM of 3 times
        the features, float32-level error); "fp32" is plain IEEE float32; "tf32" one tensor-core GEMM (inputs
        rounded to 10 mantissa bits: kernel values to about 1e-4). docs/performance.md ("GEMM precision") has
        the errors measured on MNIST. The CPU and dtype="float64" always compute plainly (an explicit mode other
        than the default warns there); ``result.method_params`` records "gemm_precision" and "gemm_mode", the
        mode that ran. ``tf32=True`` is a deprecated alias of "tf32".

    n_samples_per_cluster : int, optional
        CATS: the l points sampled (uniformly, seeded) from each cluster per iteration, l >= 1. A cluster
        with at most l positive-weight members uses all of them and gets its exact centroid. An iteration's
        work is sized by L = min(l, its largest cluster) (the k x L x L stack of M_c, the n x (k L) kernel
        block), so a large l costs no more than the clusters need; l >= n samples every cluster in full.
        Default ceil(sqrt(n / k)), the paper's choice.
    window, theta : int, float, optional
        CATS's stopping rule: halt when the variance of the last ``window`` approximate distortions is
        <= ``theta`` times their squared mean (a scale-free form of the paper's rule). Defaults 5, 1e-6.
        With ``theta=0`` CATS stops only when no point moves (or at ``max_iter``). With ``theta=0`` and
        l at least the largest cluster of every iteration (l >= n always is), CATS is exact kernel k-means:
        from the same initial labels (``init`` an array) it gives the labels and n_iter of method="exact"
        with ``tol=0``, up to rounding at exact ties, whatever ``dtype`` and ``rcond``. A ``theta`` > 0 may
        stop it earlier, while points still move.
    rcond : float, optional
        CATS: eigenvalues of M_c below ``rcond`` times its largest are treated as zero in the
        pseudoinverse M_c^+ (clusters sampled in full do not use it). Default 1e-6 (float32 / float16
        data), 1e-12 (float64).
    exact_objective : bool, default=False
        CATS: also compute the exact kernel k-means objective of the final labels (in tiles, time
        O(sum_c n_c^2 d), no n x n matrix) into ``result.exact_objective``.
    n_components : int, optional
        method="eigen": the number r of largest eigenpairs of K to embed with, 1 <= r <= n_samples.
        Default: all n (the exact route) for n <= 4096; above that the top max(128, 8 k), found
        by LAPACK's MRRR solver on the CPU or Lanczos (cupyx eigsh) on a GPU. Lloyd then costs
        O(n r k) per iteration; ``result.exact_objective`` is the objective of the labels on K.
    trim_vote_fraction, trim_slack, trim_h, trim_max_size : float, float, int, float, optional
        method="trimmed": each row votes with the top ``trim_vote_fraction`` (default 0.1) of its sorted
        values' derivative, taken with steps 1..``trim_h`` (default 3), for sizes up to ``trim_max_size`` n
        (default 0.5; 1 is the paper as written), and keeps its w_i + ceil(``trim_slack`` n) (default 0.01 n)
        largest values. See :func:`kkmgpu.trim_kernel_matrix`.
    n_landmarks : int, optional
        method="approx": the number m of landmarks, k <= m <= the number of samples with a positive weight.
        Default min(n, max(1000, 20 k)). Memory and the feature build grow as n m; m = n is exact kernel
        k-means on a positive definite kernel.
    landmarks : {"uniform", "kmeans++"} or array-like of int, default="uniform"
        method="approx": how the landmarks are drawn among the samples with a positive weight, from
        ``random_state``: uniformly without replacement, or by k-means++'s D^2 sampling in the kernel's feature
        space (m passes over the data; it covers small clusters); or the landmarks' sample indices, at least k
        distinct integers in [0, n). For a kernel that is not positive semi-definite ``objective`` is the exact
        one of the labels (docs/approx.md).
    objective : {"kernel_kmeans", "ncut", "ratio_association"}, default="kernel_kmeans"
        "ncut" minimises the normalized cut of an affinity graph, "ratio_association" maximises its ratio
        association, both as weighted kernel k-means on the sparse graph kernel (Dhillon, Guan and Kulis,
        2004; :mod:`kkmgpu.methods.graphcut`): clusters of any shape (two spirals), spectral quality without a
        full eigensolver. ``result.objective`` is then the normalized cut (or the negated ratio association)
        and ``result.objective_name`` says which. kernel, gamma, sample_weight and method do not apply.
    affinity : {"knn", "mutual_knn", "self_tuning", "precomputed", "search"}, default="self_tuning"
        Graph objectives: the graph built from X in row tiles (:mod:`kkmgpu.kernels.graphs`): the symmetric
        kNN graph (G + G^T) / 2, the mutual kNN graph, or kNN with self-tuning RBF weights (each point's scale
        its distance to its 7th neighbour; the default: the best fixed graph on the tuning half of
        docs/selection.md; needs at least 8 points); "precomputed": X is a symmetric non-negative affinity
        matrix (dense or scipy/cupyx sparse; ``predict`` needs X). "search": the family and n_neighbors chosen
        together without labels (the default graph unless another of at most k large components has a spectral
        gap ratio lambda_{k+1} / lambda_k over 1.5 times its own, :mod:`kkmgpu.methods.graph_search`); the
        evidence is ``result.method_params["graph_search"]`` (``.table()``, ``.plot()``).
    n_neighbors : int or "search", default=10
        Graph objectives: neighbours per point (scikit-learn's SpectralClustering default). "search" scores
        the affinity's graphs with 5, 7, 10, 15, 20 and 30 neighbours (below n) by the same spectral gap ratio
        and fits the largest (no prior); the evidence is ``result.method_params["graph_search"]``. On the
        validation half of docs/selection.md it beats the family's fixed 10 neighbours only for mutual_knn (knn
        and self_tuning score lower than their 10): ``affinity="search"`` is the search to reach for first.
    graph_shift : float or "auto", default="auto"
        Graph objectives: sigma of the graph kernel. "auto": the smallest one making it positive
        semi-definite (plus 1%), so that the objective never rises between iterations.
    landmark_neighbors : int, optional
        method="landmark": the r nearest landmarks each point links to, 1 <= r <= n_landmarks (default 5).

    Returns
    -------
    KernelKMeansResult
        An objective in [-64 eps sum_i w_i |K_ii|, 0) is rounding of 0 and reported as 0 (eps: the compute dtype's).

    Raises
    ------
    ValueError, TypeError
        For invalid data or parameters; the message names the value and the rule.
    DeviceUnavailableError
        If a GPU is requested but none is usable.
    InsufficientMemoryError
        If the dense kernel matrix would not fit the device's free memory (method="cats": if an
        iteration's arrays would not, checked before each iteration).

    Examples
    --------
    >>> import numpy as np, kkmgpu
    >>> X, y = kkmgpu.datasets.make_two_circles(400, random_state=0)
    >>> result = kkmgpu.fit(X, 2, kernel="rbf", gamma=5.0, device="cpu", random_state=0, n_init=10)
    >>> float(kkmgpu.metrics.nmi(y, result.labels))
    1.0
    """
    progress = check_progress(progress)
    gemm_precision, tf32 = _validation.check_gemm_precision(gemm_precision, tf32), None
    objective = graphcut.check_objective(objective)
    if isinstance(init, str) and init == "auto":
        init = "spectral" if objective in graphcut.GRAPH_OBJECTIVES else "k-means++"
    if landmark_cut.routed(method, objective, n_landmarks, landmark_neighbors):  # ncut through landmarks (issue 29)
        return landmark_cut.fit(X, k, fit=fit, **{p: v for p, v in locals().items() if p in landmark_cut.FIT_ARGS})
    if objective in graphcut.GRAPH_OBJECTIVES:
        return graphcut.checked_fit(X, k, fit_exact=fit, objective=objective, affinity=affinity, n_neighbors=n_neighbors,
                                    graph_shift=graph_shift, kernel=kernel, gamma=gamma, method=method,
                                    sample_weight=sample_weight, device=device, dtype=dtype, init=init,
                                    n_init=n_init, max_iter=max_iter, tol=tol, random_state=random_state,
                                    verbose=verbose, keep_on_device=keep_on_device, progress=progress,
                                    gemm_precision=gemm_precision)
    if (affinity, n_neighbors, graph_shift) != (graphcut.DEFAULT_AFFINITY, graphcut.DEFAULT_N_NEIGHBORS, "auto"):
        raise ValueError("affinity, n_neighbors and graph_shift belong to the graph objectives; pass "
                         "objective='ncut' or 'ratio_association' to use them.")
    if isinstance(init, str) and init == "spectral":
        raise ValueError("init='spectral' starts the graph objectives (objective='ncut' or 'ratio_association'); "
                         "for kernel k-means use 'k-means++', 'random' or an array of labels.")
    if isinstance(gamma, str) and gamma == "search":  # the Off-the-grid search, then this fit at the best gamma
        call = {name: value for name, value in locals().items() if name not in ("X", "k", "gamma")}
        return _gamma_search.fit_with_search(X, k, fit_kwargs=call, fit=fit)
    with progress_scope(progress):
        return _fit(X, k, kernel=kernel, gamma=gamma, degree=degree, coef0=coef0, kernel_params=kernel_params,
                    method=method, device=device, dtype=dtype, init=init, n_init=n_init, max_iter=max_iter,
                    tol=tol, sample_weight=sample_weight, random_state=random_state, verbose=verbose,
                    keep_on_device=keep_on_device, update=update, n_samples_per_cluster=n_samples_per_cluster,
                    window=window, theta=theta, rcond=rcond, exact_objective=exact_objective,
                    n_components=n_components, engine=engine, gemm_precision=gemm_precision,
                    trim_vote_fraction=trim_vote_fraction,
                    trim_slack=trim_slack, trim_h=trim_h, trim_max_size=trim_max_size, n_landmarks=n_landmarks,
                    landmarks=landmarks)


def _fit(X, k, *, kernel, gamma, degree, coef0, kernel_params, method, device, dtype, init, n_init, max_iter, tol,
         sample_weight, random_state, verbose, keep_on_device, update, n_samples_per_cluster, window, theta, rcond,
         exact_objective, n_components, engine, gemm_precision, trim_vote_fraction, trim_slack, trim_h, trim_max_size,
         n_landmarks, landmarks):
    """:func:`fit` after the bandwidth-search branch, inside the progress scope."""
    t_start = time.perf_counter()
    dt = _validation.check_dtype(dtype)
    max_iter, tol, n_init = _validation.check_params(method=method, max_iter=max_iter, tol=tol,
                                                     n_init=n_init, init=init, update=update)
    rng = _validation.make_rng(random_state)
    precomputed = _kernel_spec.canonical_kernel_name(kernel) == "precomputed"
    backend = resolve_device(device, (X,))
    with memory_situation(dtype=dt, method=method, engine=engine, precomputed=precomputed), backend.activate():
        X, spec = _prepare_inputs(X, backend, dict(kernel=kernel, gamma=gamma, degree=degree, coef0=coef0,
                                                   kernel_params=kernel_params, precision=gemm_precision), dt,
                                  precomputed)
        n = X.shape[0]
        mode = _validation.gemm_mode_ran(gemm_precision, spec, backend, dt, n, X.shape[1])
        k = _validation.check_k(k, n)
        user_weights = _validation.check_sample_weight(sample_weight, n)
        weights_h, weight_scale = _validation.normalize_weights(user_weights)
        init, n_init = _validation.check_init(init, n, k, n_init)
        if (weights_h > 0).sum() < k:
            raise ValueError(f"only {(weights_h > 0).sum()} samples have a positive sample_weight; "
                             f"at least k={k} are required.")
        if precomputed:
            X, spec = _scale_precomputed(X, spec, _validation.check_symmetric(X, backend), dt, backend)
        elif spec.name == "callable":
            _validation.check_callable_symmetric(X, spec, backend, _kernel_spec.compute_dtype(dt))
        ctx = _methods.FitContext(X=X, k=k, n=n, spec=spec, backend=backend, dt=dt, precomputed=precomputed,
                                  weights_h=weights_h, init=init, n_init=n_init, max_iter=max_iter, tol=tol,
                                  rng=rng, verbose=verbose, keep_on_device=keep_on_device, update=update,
                                  t_start=t_start)
        values = dict(engine=engine, n_samples_per_cluster=n_samples_per_cluster, window=window,
                      theta=theta, rcond=rcond, exact_objective=exact_objective, n_components=n_components,
                      trim_vote_fraction=trim_vote_fraction, trim_slack=trim_slack, trim_h=trim_h,
                      trim_max_size=trim_max_size, n_landmarks=n_landmarks, landmarks=landmarks)
        resolved = None
        for entry in _methods.METHODS.values():  # each method checks its own; others' given ones are errors
            own = entry.check(method, ctx, values)
            if entry.name == method:
                resolved = own
        if not _sparse.is_sparse(X):
            _kernels.check_informative(spec, backend, dt, **({"K": X} if precomputed else {"X": X}))
        ctx.t_valid = backend.timer()
        with _warn.collect() as given:
            if _sparse.is_sparse(X) and method != "trimmed":  # a sparse precomputed K is clustered as given
                result = trimmed.fit_sparse(X, k, spec=spec, backend=backend, dt=dt, precomputed=precomputed,
                                            method=method, weights_h=weights_h, init=init, n_init=n_init,
                                            max_iter=max_iter, tol=tol, rng=rng, verbose=verbose,
                                            keep_on_device=keep_on_device, update=update, params=None,
                                            t_start=t_start, t_valid=ctx.t_valid)
            else:
                result = _methods.METHODS[method].run(ctx, resolved)
        result = _degenerate.checked(result, X, spec, weights_h, k, backend, dt, precomputed, given)
        params = result.method_params or {}  # a method may record the mode its products ran in (CATS's roofline)
        result = dataclasses.replace(result, method_params={**params, "gemm_precision": gemm_precision,
                                                            "gemm_mode": params.get("gemm_mode", mode)})
        return in_user_units(result, user_weights, weight_scale, spec)



def _scale_precomputed(K, spec, max_abs, dt, backend):
    """A precomputed K whose values leave the storage precision's range, divided by a power of two.

    The clustering does not depend on a common scale of K; ``spec.value_scale`` records the divisor and
    the objectives are reported in K's units. Values are kept below :func:`_kernel_spec.storage_limit`, and a K
    whose largest |value| is below the dtype's smallest normal number times 2**FLOOR_BITS (float32 subnormals:
    K * 1e-45 rounds to a few multiples of 1.4e-45) is brought up to a largest |value| in [1, 2) (float16: [0.5, 1)).
    """
    limit = _kernel_spec.storage_limit(dt, K.shape[0])
    floor = min(float(np.finfo(dt).tiny) * 2.0 ** _kernel_spec.FLOOR_BITS, limit / 2)
    if max_abs > limit:
        bits = math.ceil(math.log2(max_abs) - math.log2(limit))
    elif 0 < max_abs < floor:
        given = np.dtype(K.dtype) if np.dtype(K.dtype).kind == "f" else np.dtype(np.float64)
        if max_abs < np.finfo(given).tiny:
            raise ValueError(f"the precomputed kernel's largest |value| is {max_abs:.3g}, below {given.name}'s "
                             f"smallest normal number ({float(np.finfo(given).tiny):.3g}): every value is subnormal "
                             "and has lost its precision. Scale K (or pass it in float64).")
        bits = math.floor(math.log2(max_abs)) - min(0, math.floor(math.log2(limit)) - 1)
    else:
        return K, spec
    if not _sparse.is_sparse(K):
        _kernels.check_fits(K.nbytes, backend, f"the rescaled copy of the {K.shape[0]} x {K.shape[0]} kernel matrix")
    K = K * (2.0 ** -bits)
    return K, dataclasses.replace(spec, value_scale=2.0 ** bits)


def predict(result: KernelKMeansResult, X_new, *, batch_size=None):
    """Assign new points to the clusters of a fit, through the kernel to the training points.

    dist(x, c) = k(x, x) - 2 sum_{j in c} w_j k(x, x_j) / n_c + C_c / n_c^2; the k(x, x) term does not
    change the argmin and is skipped.

    Graph objectives: the new points' affinities to the training points stand for k(x, x_j), and a new point
    equal to a training point takes that point's label, so predict(result, X_train) is the fit's labels except
    where the fit split identical training points among clusters: every copy takes the first one's
    (docs/graphs.md, "Predicting new points").

    Parameters
    ----------
    result : KernelKMeansResult
        From :func:`fit` (on any device; prediction runs on the same device).
    X_new : array of shape (n_new, n_features)
        For kernel="precomputed": the kernel between the new and the training points,
        shape (n_new, n_train).
    batch_size : int, optional
        Rows of X_new per kernel block, an integer >= 1 (default: blocks of about 64 MiB).

    Returns
    -------
    labels : ndarray of shape (n_new,), int32

    Raises
    ------
    TypeError
        If ``result`` is not a KernelKMeansResult or ``batch_size`` is not an integer.
    ValueError
        If X_new does not match the training data, ``batch_size < 1``, or ``result`` keeps no training
        features (:func:`kkmgpu.dask.fit` without ``keep_features=True``).
    """
    if not isinstance(result, KernelKMeansResult):
        raise TypeError(f"result must be a KernelKMeansResult from kkmgpu.fit; got {type(result).__name__}.")
    if batch_size is not None:
        batch_size = _validation.check_int(batch_size, "batch_size", minimum=1)
    if result.method == "landmark":  # the normalized cut through landmarks: the new points' bipartite rows
        return landmark_cut.checked_predict(result, X_new, batch_size)
    if result._graph_state is not None:  # a graph objective: new points' affinities to the training points
        backend = resolve_device(result.device)
        with backend.activate():
            return graphcut.predict(result, X_new, backend, batch_size)
    spec = result._spec
    if spec.name != "precomputed" and result._train_features is None:
        raise ValueError("this result keeps no training features, which predict compares new points with: it comes "
                         "from kkmgpu.dask.fit(..., keep_features=False), the default. Refit with "
                         "keep_features=True to predict.")
    backend = resolve_device(result.device)
    dt = _kernel_spec.compute_dtype(np.dtype(result.dtype))
    k = result.n_clusters
    with backend.activate():
        X_new = _validation.check_data(X_new, backend, name="X_new", kernel_rows=spec.name == "precomputed")
        if spec.name == "precomputed":
            if X_new.shape[1] != result._n_train:
                raise ValueError(f"X_new has {X_new.shape[1]} columns; with kernel='precomputed' it must be the "
                                 f"kernel to the {result._n_train} training points.")
        elif X_new.shape[1] != result._train_features.shape[1]:
            raise ValueError(f"X_new has {X_new.shape[1]} features but the model was fit on "
                             f"{result._train_features.shape[1]}.")
        if spec.name == "precomputed" and spec.value_scale != 1.0:  # the fit ran on K / value_scale
            X_new = X_new * (1.0 / spec.value_scale)
        predict_rows = trimmed.predict if result._trim_state is not None else _methods.METHODS[result.method].predict
        if not _sparse.is_sparse(X_new):  # (trimmed, or a sparse precomputed K: nearest on the sparse K*)
            return predict_rows(result, X_new, backend, dt, batch_size)
        # sparse kernel rows: dense a batch at a time (the methods' predict reads dense rows)
        step = batch_size or _kernels.tile_rows(result._n_train, dt.itemsize, backend=backend)
        return np.concatenate([predict_rows(result, X_new[i0:i0 + step].toarray(), backend, dt, batch_size)
                               for i0 in range(0, X_new.shape[0], step)])
