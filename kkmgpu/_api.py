"""The functional API: :func:`fit`, :func:`predict` and :func:`kernel_matrix`."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from kkmgpu import _validation

from kkmgpu.kernels import functions as _kernels
from kkmgpu.backend.device import gemm_precision, memory_situation, resolve_device
from kkmgpu import trimming
from kkmgpu.engine import sampled as _cats
from kkmgpu.engine import embedding as _eigen
from kkmgpu.methods import registry as _methods
from kkmgpu.engine import sparse as _sparse
from kkmgpu.engine.lloyd import DenseKernelOperator, run_restarts
from kkmgpu._progress import active as progress_active, check_progress, progress_bar, scope as progress_scope
from kkmgpu.engine.tiled import TiledKernelOperator, choose_engine
from kkmgpu._result import KernelKMeansResult
from kkmgpu.bandwidth import search_bandwidth

__all__ = ["fit", "predict", "kernel_matrix"]


def _prepare_inputs(X, backend, spec_args, dtype, precomputed, center_linear=True):
    """Validated data on the device and the resolved kernel spec (centre and scales from X, see with_center)."""
    X = _validation.check_data(X, backend, square=precomputed)
    spec = _kernels.resolve_kernel(X=X, xp=backend.xp, **spec_args)
    spec = _kernels.with_center(spec, X, backend.xp, dtype, center_linear=center_linear)
    return X, spec


def kernel_matrix(X, Y=None, *, kernel="rbf", gamma=None, degree=3, coef0=None, kernel_params=None,
                  device="auto", dtype="float32"):
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
    if _kernels.canonical_kernel_name(kernel) == "precomputed":
        raise ValueError("kernel='precomputed' makes no sense for kernel_matrix; pass a kernel function.")
    with memory_situation(dtype=dt), backend.activate():
        X, spec = _prepare_inputs(X, backend, dict(kernel=kernel, gamma=gamma, degree=degree, coef0=coef0,
                                                   kernel_params=kernel_params), dt, False, center_linear=False)
        ct = _validation.compute_dtype(dt)
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
        device="auto", dtype="float32", init="k-means++", n_init="auto", max_iter=300, tol=1e-6,
        sample_weight=None, random_state=None, verbose=False, keep_on_device=False,
        update="auto", n_samples_per_cluster=None, window=None, theta=None, rcond=None,
        exact_objective=False, n_components=None, engine="auto", tf32=False, trim_vote_fraction=None,
        trim_slack=None, trim_h=None, trim_max_size=None, progress=False) -> KernelKMeansResult:
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
        block. See :mod:`kkmgpu.kernels.functions` for formulas and defaults.
    gamma : float or {"scale", "auto", "search"}, optional
        Kernel coefficient. Default "scale" = 1 / (n_features * X.var()) for rbf, 1 / sqrt(n_features *
        X.var()) for laplacian (the same rule for its unsquared distance; both independent of X's units),
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
    method : {"exact", "cats", "eigen", "trimmed"}, default="exact"
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
        (scipy.sparse or cupyx.scipy.sparse) is clustered as given, in O(nnz) per iteration.
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
        "auto" takes the GPU when CuPy and a device are usable, else the CPU.
        ``KKMGPU_DEVICE=cpu`` in the environment forces the CPU.
    dtype : {"float32", "float64", "float16"}, default="float32"
        Storage precision of the kernel matrix. "float16" halves its memory (MNIST-70k: 9.8 GB
        instead of 19.6 GB); features and kernel values are then computed in float32 and rounded
        on storage (about 3 significant digits), and cluster sums still accumulate in float64.
    init : {"k-means++", "random"} or array of shape (n_samples,), default="k-means++"
        "random" is a random partition (as in the papers); "k-means++" seeds in feature space with
        kernel distances; an array gives the initial labels (a deterministic run, identical on
        every backend).
    n_init : int or "auto", default="auto"
        Restarts; the lowest objective is kept. "auto": 10 for "random", 1 otherwise.
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
    tf32 : bool, default=False
        Run the float32 GEMMs (tiled tiles, the dense build) on TF32 tensor cores (NVIDIA Ampere or
        newer): inputs rounded to 10 mantissa bits, kernel values to about 1e-3 relative; see the
        README for the measured effect on labels. A no-op with a warning on the CPU.

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

    Returns
    -------
    KernelKMeansResult

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
    if isinstance(gamma, str) and gamma == "search":  # the Off-the-grid search, then this fit at the best gamma
        call = {name: value for name, value in locals().items() if name not in ("X", "k", "gamma")}
        return _fit_with_search(X, k, fit_kwargs=call)
    with progress_scope(progress):
        return _fit(X, k, kernel=kernel, gamma=gamma, degree=degree, coef0=coef0, kernel_params=kernel_params,
                    method=method, device=device, dtype=dtype, init=init, n_init=n_init, max_iter=max_iter,
                    tol=tol, sample_weight=sample_weight, random_state=random_state, verbose=verbose,
                    keep_on_device=keep_on_device, update=update, n_samples_per_cluster=n_samples_per_cluster,
                    window=window, theta=theta, rcond=rcond, exact_objective=exact_objective,
                    n_components=n_components, engine=engine, tf32=tf32, trim_vote_fraction=trim_vote_fraction,
                    trim_slack=trim_slack, trim_h=trim_h, trim_max_size=trim_max_size)


def _fit(X, k, *, kernel, gamma, degree, coef0, kernel_params, method, device, dtype, init, n_init, max_iter, tol,
         sample_weight, random_state, verbose, keep_on_device, update, n_samples_per_cluster, window, theta, rcond,
         exact_objective, n_components, engine, tf32, trim_vote_fraction, trim_slack, trim_h, trim_max_size):
    """:func:`fit` after the bandwidth-search branch, inside the progress scope."""
    t_start = time.perf_counter()
    dt = _validation.check_dtype(dtype)
    max_iter, tol, n_init = _validation.check_params(method=method, max_iter=max_iter, tol=tol,
                                                     n_init=n_init, init=init, update=update)
    rng = _validation.make_rng(random_state)
    precomputed = _kernels.canonical_kernel_name(kernel) == "precomputed"
    backend = resolve_device(device, (X,))
    with memory_situation(dtype=dt, method=method, engine=engine, precomputed=precomputed), backend.activate():
        X, spec = _prepare_inputs(X, backend, dict(kernel=kernel, gamma=gamma, degree=degree, coef0=coef0,
                                                   kernel_params=kernel_params), dt, precomputed)
        n = X.shape[0]
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
            _validation.check_callable_symmetric(X, spec, backend, _validation.compute_dtype(dt))
        ctx = _methods.FitContext(X=X, k=k, n=n, spec=spec, backend=backend, dt=dt, precomputed=precomputed,
                                  weights_h=weights_h, init=init, n_init=n_init, max_iter=max_iter, tol=tol,
                                  rng=rng, verbose=verbose, keep_on_device=keep_on_device, update=update,
                                  t_start=t_start)
        values = dict(engine=engine, tf32=tf32, n_samples_per_cluster=n_samples_per_cluster, window=window,
                      theta=theta, rcond=rcond, exact_objective=exact_objective, n_components=n_components,
                      trim_vote_fraction=trim_vote_fraction, trim_slack=trim_slack, trim_h=trim_h,
                      trim_max_size=trim_max_size)
        resolved = None
        for entry in _methods.METHODS.values():  # each method checks its own; others' given ones are errors
            own = entry.check(method, ctx, values)
            if entry.name == method:
                resolved = own
        if not _sparse.is_sparse(X):
            _kernels.check_informative(spec, backend, dt, **({"K": X} if precomputed else {"X": X}))
        ctx.t_valid = backend.timer()
        if _sparse.is_sparse(X) and method != "trimmed":  # a sparse precomputed K is clustered as given
            result = trimming._fit_sparse(X, k, spec=spec, backend=backend, dt=dt, precomputed=precomputed,
                                          method=method, weights_h=weights_h, init=init, n_init=n_init,
                                          max_iter=max_iter, tol=tol, rng=rng, verbose=verbose,
                                          keep_on_device=keep_on_device, update=update, params=None,
                                          t_start=t_start, t_valid=ctx.t_valid)
        else:
            result = _methods.METHODS[method].run(ctx, resolved)
        return _in_user_units(result, user_weights, weight_scale, spec)


# --- the methods: their checks and runners, registered -------------------------------------------------------

def _check_exact(method, ctx, values):
    engine = _validation.check_engine(values["engine"], values["tf32"], method=method, precomputed=ctx.precomputed,
                                      backend=ctx.backend, dtype=ctx.dt)
    return {"engine": engine, "tf32": values["tf32"]} if method == "exact" else None


def _kernel_on_device(X, spec, backend, dt, precomputed):
    """(K in ``dt`` on the device, prepared features or None): a precomputed K copied (memory checked), else the
    features prepared for building K."""
    if precomputed:
        if X.dtype != dt:
            n = X.shape[0]
            _kernels.check_fits(X.size * dt.itemsize, backend, f"the {n} x {n} {dt.name} copy of K")
        return backend.asarray(X, dtype=dt), None
    return None, _kernels.prepare_features(X, spec, backend, _validation.compute_dtype(dt))


def _fit_exact(ctx, params):
    """fit(method="exact"): the dense K (or a precomputed one) or the tiled engine, then the Lloyd driver."""
    X, k, n, spec, backend, dt = ctx.X, ctx.k, ctx.n, ctx.spec, ctx.backend, ctx.dt
    precomputed, engine, tf32, verbose = ctx.precomputed, params["engine"], params["tf32"], ctx.verbose
    K, features = _kernel_on_device(X, spec, backend, dt, precomputed)
    if not precomputed:
        engine = choose_engine(engine, n, dt, backend)
        if engine == "dense":
            with gemm_precision(backend, tf32):
                K = _kernels.build_kernel_matrix(features, features, spec, backend, verbose=verbose, storage=dt)
        elif verbose:
            print(f"[kkmgpu] tiled engine: {n} x {n} {spec.name} kernel recomputed in tiles from "
                  f"{features.shape[1]} features each iteration (no kernel matrix) on {backend.name}")
    weights = backend.asarray(ctx.weights_h)
    t_kernel = backend.timer()

    if precomputed or engine == "dense":
        operator = DenseKernelOperator(K, weights, backend)
    else:
        operator = TiledKernelOperator(features, spec, weights, backend, tf32=tf32, verbose=verbose)
    best, runs, init_seconds = run_restarts(operator, k, init=ctx.init, n_init=ctx.n_init, max_iter=ctx.max_iter,
                                            tol=ctx.tol, rng=ctx.rng, verbose=verbose, update=ctx.update)
    t_end = backend.timer()

    labels = best.labels if ctx.keep_on_device else backend.to_host(best.labels).astype(np.int32)
    timings = {
        "validation": ctx.t_valid - ctx.t_start,
        "kernel_build": t_kernel - ctx.t_valid,
        "init": init_seconds,
        "iterations": float(sum(r.seconds for r in runs)),
        "total": t_end - ctx.t_start,
    }
    return KernelKMeansResult(
        labels=labels, objective=float(best.objective),
        objective_history=np.asarray(best.history, dtype=np.float64), n_iter=int(best.n_iter),
        converged=bool(best.converged), n_clusters=k, method="exact", kernel=spec.name,
        kernel_params=spec.resolved_params, device=backend.name, dtype=dt.name, timings=timings,
        cluster_sizes=best.sizes.copy(), n_init=ctx.n_init,
        objectives=np.array([r.objective for r in runs], dtype=np.float64), sample_weight=ctx.weights_h,
        exact_objective=float(best.objective), stop_reason=best.stop_reason,
        method_params={"engine": "dense" if precomputed else engine, "tf32": tf32},
        _spec=spec, _train_features=features, _train_labels=best.labels, _train_weights=weights,
        _within=best.within.copy(), _n_train=n)


def _check_cats(method, ctx, values):
    params = _validation.check_cats_params(
        method, n_samples_per_cluster=values["n_samples_per_cluster"], window=values["window"],
        theta=values["theta"], rcond=values["rcond"], exact_objective=values["exact_objective"], n=ctx.n, k=ctx.k,
        dtype=ctx.dt)
    return None if params is None else dict(params, exact_objective=values["exact_objective"])


def _run_cats(ctx, params):
    return _fit_cats(ctx.X, ctx.k, ctx.spec, ctx.backend, ctx.dt, ctx.precomputed, ctx.weights_h, ctx.init,
                     ctx.n_init, ctx.max_iter, ctx.rng, ctx.verbose, ctx.keep_on_device,
                     {key: params[key] for key in ("l", "window", "theta", "rcond")}, params["exact_objective"],
                     ctx.t_start, ctx.t_valid)


def _check_eigen(method, ctx, values):
    return _validation.check_eigen_params(method, n_components=values["n_components"], n=ctx.n, dtype=ctx.dt)


def _run_eigen(ctx, n_components):
    return _fit_eigen(ctx.X, ctx.k, ctx.spec, ctx.backend, ctx.dt, ctx.precomputed, ctx.weights_h, ctx.init,
                      ctx.n_init, ctx.max_iter, ctx.tol, ctx.rng, ctx.verbose, ctx.keep_on_device, n_components,
                      ctx.t_start, ctx.t_valid)


def _check_trimmed(method, ctx, values):
    return _validation.check_trim_params(method, vote_fraction=values["trim_vote_fraction"],
                                         slack=values["trim_slack"], h=values["trim_h"],
                                         max_size=values["trim_max_size"], defaults=trimming.DEFAULTS)


def _run_trimmed(ctx, params):
    return trimming._fit_sparse(ctx.X, ctx.k, spec=ctx.spec, backend=ctx.backend, dt=ctx.dt,
                                precomputed=ctx.precomputed, method="trimmed", weights_h=ctx.weights_h,
                                init=ctx.init, n_init=ctx.n_init, max_iter=ctx.max_iter, tol=ctx.tol, rng=ctx.rng,
                                verbose=ctx.verbose, keep_on_device=ctx.keep_on_device, update=ctx.update,
                                params=params, t_start=ctx.t_start, t_valid=ctx.t_valid)




def _scale_precomputed(K, spec, max_abs, dt, backend):
    """A precomputed K whose values exceed the storage precision's range, divided by a power of two.

    The clustering does not depend on a common scale of K; ``spec.value_scale`` records the divisor and
    the objectives are reported in K's units. Values are kept below :func:`_kernels.storage_limit`.
    """
    limit = _kernels.storage_limit(dt, K.shape[0])
    if not max_abs > limit:
        return K, spec
    bits = math.ceil(math.log2(max_abs) - math.log2(limit))
    if not _sparse.is_sparse(K):
        _kernels.check_fits(K.nbytes, backend, f"the rescaled copy of the {K.shape[0]} x {K.shape[0]} kernel matrix")
    K = K * (2.0 ** -bits)
    return K, dataclasses.replace(spec, value_scale=2.0 ** bits)


#: method_params of method="eigen" in the kernel's units (eigenvalues of K)
_EIGEN_VALUE_PARAMS = ("negative_eigenvalue_mass", "largest_eigenvalue", "smallest_eigenvalue")


def _in_user_units(result, user_weights, weight_scale, spec):
    """The result with objectives, sizes and weights in the caller's units; ValueError if an objective is not finite.

    The iterations ran on weights / ``weight_scale`` and on K / ``spec.value_scale`` (both powers of two,
    so the labels are those of the original units): the objective is linear in both.
    """
    factor = weight_scale * spec.value_scale
    changes = {"sample_weight": user_weights}
    if factor != 1.0:
        changes.update(
            objective=float(result.objective) * factor,
            objective_history=np.asarray(result.objective_history, dtype=np.float64) * factor,
            objectives=np.asarray(result.objectives, dtype=np.float64) * factor,
            exact_objective=None if result.exact_objective is None else float(result.exact_objective) * factor)
    if weight_scale != 1.0:
        changes.update(cluster_sizes=np.asarray(result.cluster_sizes, dtype=np.float64) * weight_scale,
                       _weight_scale=weight_scale)
    if spec.value_scale != 1.0 and result.method == "eigen":
        params = dict(result.method_params)
        for key in _EIGEN_VALUE_PARAMS:
            if key in params:
                params[key] = float(params[key]) * spec.value_scale
        changes["method_params"] = params
    result = dataclasses.replace(result, **changes)
    for name in ("objective", "exact_objective"):
        value = getattr(result, name)
        if value is not None and not math.isfinite(value):
            raise ValueError(f"the {name.replace('_', ' ')} is {value} for {spec.describe()} in dtype={result.dtype!r} "
                             f"(largest value {float(np.finfo(np.dtype(result.dtype)).max):.5g}); the kernel or the "
                             "weights leave the representable range on these data. Scale X or the weights, change "
                             "the kernel's parameters, or use dtype='float64'.")
    return result


def _fit_eigen(X, k, spec, backend, dt, precomputed, weights_h, init, n_init, max_iter, tol, rng, verbose,
               keep_on_device, n_components, t_start, t_valid):
    """fit(method="eigen"): K on the device, its (top) eigendecomposition, Lloyd on A = V Lambda^(1/2)."""
    n = X.shape[0]
    K, features = _kernel_on_device(X, spec, backend, dt, precomputed)
    if not precomputed:
        K = _kernels.build_kernel_matrix(features, features, spec, backend, verbose=verbose, storage=dt)
    weights = backend.asarray(weights_h)
    t_kernel = backend.timer()
    n_eig = _eigen.resolve_components(n_components, n, k)
    best, runs, init_seconds, params, state, exact, decomposition_seconds = _eigen.fit_eigen(
        K, k, r=n_eig, weights=weights, init=init, n_init=n_init, max_iter=max_iter, tol=tol, rng=rng,
        verbose=verbose, backend=backend)
    del K
    t_end = backend.timer()
    timings = {
        "validation": t_valid - t_start,
        "kernel_build": t_kernel - t_valid,
        "eigendecomposition": decomposition_seconds,
        "init": init_seconds,
        "iterations": float(sum(r.seconds for r in runs)),
        "total": t_end - t_start,
    }
    return KernelKMeansResult(
        labels=best.labels if keep_on_device else backend.to_host(best.labels).astype(np.int32),
        objective=float(best.objective), objective_history=np.asarray(best.history, dtype=np.float64),
        n_iter=int(best.n_iter), converged=bool(best.converged), n_clusters=k, method="eigen", kernel=spec.name,
        kernel_params=spec.resolved_params, device=backend.name, dtype=dt.name, timings=timings,
        cluster_sizes=best.sizes.copy(), n_init=n_init,
        objectives=np.array([r.objective for r in runs], dtype=np.float64), sample_weight=weights_h,
        exact_objective=exact, stop_reason=best.stop_reason, method_params=params,
        _spec=spec, _train_features=features, _train_labels=best.labels, _train_weights=weights,
        _within=best.within.copy(), _n_train=n, _eigen_state=state)


class _CatsProgress:
    """CATS's per-iteration callback drawn on a bar over the initialisations."""

    def __init__(self, bar):
        self.bar, self.restart = bar, 0

    def __call__(self, step):
        restart = step["restart"] or 0
        if restart != self.restart:
            self.bar.update(restart - self.restart)
            self.restart = restart
        prefix = "" if step["restart"] is None else f"init {restart}, "
        self.bar.set_postfix_str(f"{prefix}iteration {step['iteration']}/{step['max_iter']}: "
                                 f"distortion {step['distortion']:.6g}, {step['moved']} moved")


def _fit_cats(X, k, spec, backend, dt, precomputed, weights_h, init, n_init, max_iter, rng, verbose,
              keep_on_device, params, want_exact, t_start, t_valid):
    """fit(method="cats"): sampled-centroid iterations on features (or on a given K), no n x n matrix."""
    n = X.shape[0]
    if precomputed:
        source_array = backend.asarray(X, dtype=dt)
    else:
        source_array = _kernels.prepare_features(X, spec, backend, _validation.compute_dtype(dt))
    source = _cats.KernelSource(source_array, spec, backend)
    t_prepared = backend.timer()
    with progress_bar(n_init, desc="CATS", unit="init", enabled=progress_active()) as bar:
        best, runs, init_seconds, diag = _cats.run_restarts(
            source, weights_h, k, init=init, n_init=n_init, max_iter=max_iter, window=params["window"],
            theta=params["theta"], rcond=params["rcond"], l=params["l"], rng=rng, verbose=verbose,
            callback=_CatsProgress(bar))
        bar.update(n_init - bar.n)
    t_iter = backend.timer()
    labels_h = backend.to_host(best.labels).astype(np.int32)
    exact = _cats.exact_objective(source, labels_h, weights_h, k, diag=diag) if want_exact else None
    t_end = backend.timer()
    timings = {
        "validation": t_valid - t_start,
        "kernel_build": t_prepared - t_valid,  # CATS builds no kernel matrix: feature preparation only
        "init": init_seconds,
        "iterations": float(sum(r.seconds for r in runs)),
        "exact_objective": t_end - t_iter,
        "total": t_end - t_start,
    }
    state = best.state
    return KernelKMeansResult(
        labels=best.labels if keep_on_device else labels_h, objective=float(best.objective),
        objective_history=np.asarray(best.history, dtype=np.float64), n_iter=int(best.n_iter),
        converged=bool(best.converged), n_clusters=k, method="cats", kernel=spec.name,
        kernel_params=spec.resolved_params, device=backend.name, dtype=dt.name, timings=timings,
        cluster_sizes=best.sizes.astype(np.float64), n_init=n_init,
        objectives=np.array([r.objective for r in runs], dtype=np.float64), sample_weight=weights_h,
        exact_objective=exact, stop_reason=best.stop_reason, method_params=params,
        _spec=spec, _train_features=None if precomputed else source_array, _train_labels=best.labels,
        _train_weights=backend.asarray(weights_h), _within=np.zeros(k), _n_train=n,
        _cats_state=state)


def predict(result: KernelKMeansResult, X_new, *, batch_size=None):
    """Assign new points to the clusters of a fit, through the kernel to the training points.

    dist(x, c) = k(x, x) - 2 sum_{j in c} w_j k(x, x_j) / n_c + C_c / n_c^2; the k(x, x) term does not
    change the argmin and is skipped.

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
    spec = result._spec
    if spec.name != "precomputed" and result._train_features is None:
        raise ValueError("this result keeps no training features, which predict compares new points with: it comes "
                         "from kkmgpu.dask.fit(..., keep_features=False), the default. Refit with "
                         "keep_features=True to predict.")
    backend = resolve_device(result.device)
    dt = _validation.compute_dtype(np.dtype(result.dtype))
    k = result.n_clusters
    with backend.activate():
        X_new = _validation.check_data(X_new, backend, name="X_new")
        if spec.name == "precomputed":
            if X_new.shape[1] != result._n_train:
                raise ValueError(f"X_new has {X_new.shape[1]} columns; with kernel='precomputed' it must be the "
                                 f"kernel to the {result._n_train} training points.")
        elif X_new.shape[1] != result._train_features.shape[1]:
            raise ValueError(f"X_new has {X_new.shape[1]} features but the model was fit on "
                             f"{result._train_features.shape[1]}.")
        if spec.name == "precomputed" and spec.value_scale != 1.0:  # the fit ran on K / value_scale
            X_new = X_new * (1.0 / spec.value_scale)
        if result._trim_state is not None:  # trimmed, or a sparse precomputed K: nearest on the sparse K*
            return trimming._predict_trimmed(result, X_new, backend, dt, batch_size)
        return _methods.METHODS[result.method].predict(result, X_new, backend, dt, batch_size)


def _predict_exact(result, X_new, backend, dt, batch_size):
    """Nearest exact centroid: -2 S[x, c] / n_c + C_c / n_c^2 with S from kernel rows against the training points."""
    k, xp = result.n_clusters, backend.xp
    sizes = np.asarray(result.cluster_sizes, dtype=np.float64) / result._weight_scale
    within = np.asarray(result._within, dtype=np.float64)
    train_labels = backend.asarray(result._train_labels, dtype=np.int32)
    train_weights = backend.asarray(result._train_weights, dtype=np.float64)
    step = batch_size or _kernels.tile_rows(result._n_train, dt.itemsize, backend=backend)
    out = []
    for i0, i1, block in _kernels.training_kernel_rows(result, X_new, backend, dt, step):
        S = backend.ops.block_cluster_sums(block, train_labels, train_weights, k)
        zeros = xp.zeros(i1 - i0, dtype=xp.float64)
        labels, _, _ = backend.ops.assign_labels(S, zeros, sizes, within, xp.zeros(i1 - i0, dtype=xp.int32))
        out.append(backend.to_host(labels))
    return np.concatenate(out).astype(np.int32)


def _predict_cats(result, X_new, backend, dt, batch_size):
    """argmin_c -2 sum_s alpha_s k(x, s) + alpha_c^T M_c alpha_c with the final approximate centroids."""
    xp = backend.xp
    state = result._cats_state
    spec = result._spec
    k = result.n_clusters
    index = backend.asarray(state.index.ravel())
    alpha = backend.asarray(state.alpha)
    m = X_new.shape[0]
    step = batch_size or _kernels.tile_rows(index.shape[0], dt.itemsize, backend=backend)
    if spec.name == "precomputed":
        A_all = None
    else:
        A_all = _kernels.prepare_features(X_new, spec, backend, dt)
        samples = backend.asarray(result._train_features)[index]
    flags = state.nonempty.astype(np.float64)
    out = []
    for i0 in range(0, m, step):
        i1 = min(m, i0 + step)
        if A_all is None:
            block = backend.asarray(X_new[i0:i1], dtype=dt)[:, index]
        else:
            block = _kernels.kernel_block(A_all[i0:i1], samples, spec, backend)
        T = _cats._project(block, alpha, xp)
        labels, _, _ = backend.ops.assign_labels(T, xp.zeros(i1 - i0, dtype=xp.float64), flags,
                                                 state.offsets, xp.zeros(i1 - i0, dtype=xp.int32))
        out.append(backend.to_host(labels))
    return np.concatenate(out).astype(np.int32)


# --- fit(gamma="search") -------------------------------------------------------------------------------------

def _fit_with_search(X, k, *, fit_kwargs):
    """:func:`kkmgpu.fit` with ``gamma="search"``: the best clustering of :func:`search_bandwidth`, refit.

    The search runs with the call's k, init, random_state, sample_weight, max_iter, tol, device and dtype
    (float16 searches in float32), so ``search_bandwidth`` called with the same values (fit's defaults are
    init="k-means++" and dtype="float32", not the search's "random" and "float64") finds the same clusterings;
    kernel k-means is then fit at the best gamma = 1 / sigma from the best clustering's labels (a fixed point
    there, so normally one step), giving a normal result that predict accepts. The search result is in
    ``result.method_params["bandwidth_search"]``.
    """
    kernel = fit_kwargs.get("kernel", "rbf")
    if callable(kernel) or _kernels.canonical_kernel_name(kernel) != "rbf":
        raise ValueError(f"gamma='search' is the Off-the-grid RBF bandwidth search; it needs kernel='rbf', "
                         f"got kernel={kernel!r}.")
    method = fit_kwargs.get("method", "exact")
    if method != "exact":
        raise ValueError(f"gamma='search' needs method='exact' (the search holds the dense kernel matrix); "
                         f"got method={method!r}.")
    init = fit_kwargs.get("init", "k-means++")
    dtype = _validation.check_dtype(fit_kwargs.get("dtype", "float32"))
    search_dtype = np.float32 if dtype == np.float16 else dtype
    t0 = time.perf_counter()
    rng = _validation.make_rng(fit_kwargs.get("random_state"))
    search = search_bandwidth(X, k, init=init, sample_weight=fit_kwargs.get("sample_weight"),
                              max_iter=fit_kwargs.get("max_iter", 300), tol=fit_kwargs.get("tol", 1e-6),
                              random_state=rng, device=fit_kwargs.get("device", "auto"), dtype=search_dtype,
                              verbose=fit_kwargs.get("verbose", False), progress=fit_kwargs.get("progress", False))
    seconds = time.perf_counter() - t0
    best = search.best
    kwargs = dict(fit_kwargs)
    kwargs.update(kernel="rbf", gamma=best.gamma, init=best.labels, n_init=1, random_state=rng)
    result = fit(X, k, **kwargs)
    timings = dict(result.timings)
    timings["bandwidth_search"] = seconds
    timings["total"] = timings.get("total", 0.0) + seconds
    method_params = dict(result.method_params)
    method_params["bandwidth_search"] = search
    method_params["sigma"] = best.sigma
    return dataclasses.replace(result, timings=timings, method_params=method_params)


# --- the registry (after every runner and predictor above is defined) --------------------------------------

_methods.register("exact", "the n x n kernel matrix on the device (or the tiled engine past its memory)",
                  ("engine", "tf32"), _check_exact, _fit_exact, _predict_exact)
_methods.register("cats", "centroids approximated from sampled members (CATS): no n x n matrix",
                  ("n_samples_per_cluster", "window", "theta", "rcond", "exact_objective"), _check_cats, _run_cats,
                  _predict_cats)
_methods.register("eigen", "k-means on the kernel's eigen-embedding (the trace objective's Algorithm 16)",
                  ("n_components",), _check_eigen, _run_eigen, _eigen.predict_eigen)
_methods.register("trimmed", "Lloyd on the trimmed sparse kernel K* (kernel matrix trimming, Section 3)",
                  ("trim_vote_fraction", "trim_slack", "trim_h", "trim_max_size"), _check_trimmed, _run_trimmed,
                  trimming._predict_trimmed)
