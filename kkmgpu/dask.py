"""Kernel k-means on a Dask cluster: rows partitioned across workers, exact (tiled engine) and CATS.

``import kkmgpu`` does not import this module (nor Dask); ``import kkmgpu.dask`` does, and needs the
``dask`` extra (``pip install "kkmgpu[dask]"``: dask[array] and distributed).

How a run is distributed (W workers, n points, d features, k clusters):

- the rows are split into W contiguous blocks, one per worker; every worker also holds the prepared
  features of *all* n points (the columns of its kernel tiles), gathered once from the Dask array's
  chunks: O(n d) memory per worker, plus its block's n_b x k cluster sums and one kernel tile;
- exact (method="exact"): the single-device Lloyd driver (:func:`kkmgpu.engine.lloyd.run_restarts`) runs on the
  client over an operator whose cluster sums are the workers' row blocks (:class:`_distributed.DaskOperator`): each
  iteration every worker computes the cluster sums S of its rows against all points with the tiled engine
  (:class:`kkmgpu.engine.tiled.TiledKernelOperator`, incremental when few points moved), and returns the k-sized
  partial sizes and within-cluster totals; the client reduces them, sends the totals back, every worker
  assigns its rows, and the client gathers the n labels (int32) and broadcasts them. Restarts, stopping
  rules, the full refresh and the empty-cluster refill are the driver's own. Per iteration and worker:
  4 n bytes of labels in, 4 n_b bytes of labels and O(k) numbers out;
- CATS (method="cats"): CATS's own loop and restarts (:func:`kkmgpu.engine.sampled.iterate`, :func:`kkmgpu.engine.sampled.restarts`)
  run on the client over :class:`_distributed.DaskCatsPasses`: the client samples the l points per cluster (same random
  stream as :func:`kkmgpu.fit`), the workers return their rows' partial L_c w_c (k x l numbers), the client
  computes the coefficients alpha (k x l) and broadcasts them, the workers assign their rows.

From the same initial labels (and the same ``random_state`` for CATS) the labels equal those of
:func:`kkmgpu.fit` with ``engine="tiled"`` (or "dense") on one device, up to the rounding of sums
taken in another order. Workers use the device their ``device`` argument resolves to on the worker:
with dask-cuda's ``LocalCUDACluster`` each worker sees one GPU.
"""

from __future__ import annotations

import time

import numpy as np

from kkmgpu import _api  # noqa: F401  (registers the methods that _validation.check_params accepts)
from kkmgpu import _warn
from kkmgpu import _validation

from kkmgpu.engine import sampled as _cats

from kkmgpu.kernels import spec as _kernel_spec
from kkmgpu.kernels.gemm import DEFAULT_PRECISION
from kkmgpu.engine import lloyd as _lloyd
from kkmgpu.engine.lloyd import initial_labels
from kkmgpu._result import KernelKMeansResult, in_user_units
from kkmgpu.engine import distributed as _distributed

try:
    import dask.array as da
    from distributed import default_client
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("kkmgpu.dask needs Dask: pip install 'kkmgpu[dask]' (dask[array] and distributed)") from exc

__all__ = ["fit"]


def _resolve_spec(X, kernel, gamma, degree, coef0, kernel_params, dtype, precision=DEFAULT_PRECISION):
    """The kernel spec with gamma's data-scale default, and the centre and power-of-two scales that
    :func:`kkmgpu.kernels.spec.with_center` gives in-memory data, from statistics computed over the chunks."""
    name = _kernel_spec.canonical_kernel_name(kernel)
    if name == "precomputed":
        raise ValueError("kkmgpu.dask.fit clusters features; kernel='precomputed' is not supported there.")
    d = X.shape[1]
    needs_gamma = name in ("rbf", "polynomial", "sigmoid", "laplacian")
    if gamma is None and needs_gamma:
        gamma = "scale" if name in ("rbf", "laplacian") else "auto"
    X64 = X.astype(np.float64)
    mean, hi, lo, spread = da.compute(X64.mean(axis=0), X64.max(axis=0), X64.min(axis=0), X64.var(axis=0).sum())
    # CuPy chunks give CuPy results
    mean, hi, lo, spread = (_distributed.host(mean).astype(np.float64), _distributed.host(hi).astype(np.float64),
                            _distributed.host(lo).astype(np.float64), float(_distributed.host(spread)))
    if needs_gamma and gamma == "scale":  # the mean per-feature variance, as kkmgpu.kernels.spec.feature_variance
        gamma = _kernel_spec.scale_gamma(name, d, spread / d)
    elif needs_gamma and gamma == "auto":
        gamma = 1.0 / d
    spec = _kernel_spec.resolve_kernel(kernel, gamma=gamma, degree=degree, coef0=coef0, kernel_params=kernel_params,
                                   X=np.zeros((1, d)), xp=np, precision=precision)
    return _kernel_spec.with_center(spec, None, np, dtype, stats=(mean, hi, lo, spread, X.shape[0]))


def _check_dask_array(X):
    if not isinstance(X, da.Array):
        raise TypeError(f"X must be a dask.array.Array (rows in chunks); got {type(X).__name__}. Use "
                        "dask.array.from_array(X, chunks=...) or kkmgpu.fit for an in-memory array.")
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (n_samples, n_features); got ndim={X.ndim} with shape {X.shape}.")
    if any(isinstance(s, float) and np.isnan(s) for s in X.shape):
        raise ValueError("X has unknown chunk sizes; call X.compute_chunk_sizes() first.")
    n, d = X.shape
    if n < 1 or d < 1:
        raise ValueError(f"X has shape {X.shape}; at least one sample and one feature are required.")
    if X.dtype.kind not in "biuf":
        raise ValueError(f"X has dtype {X.dtype}; a real numeric array is required.")
    X = X.rechunk({1: -1})  # every chunk holds whole rows
    if X.dtype.kind == "f" and not bool(da.isfinite(X).all().compute()):
        raise ValueError("X contains NaN or infinity; every value must be finite.")
    return X


def fit(X, k, *, kernel="rbf", gamma=None, degree=3, coef0=None, kernel_params=None, method="exact",
        device="auto", dtype="float32", init="k-means++", n_init="auto", max_iter=300, tol=1e-6,
        sample_weight=None, random_state=None, verbose=False, update="auto", gemm_precision=DEFAULT_PRECISION,
        n_samples_per_cluster=None, window=None, theta=None, rcond=None, tile_rows=None, keep_features=False,
        client=None, tf32=None) -> KernelKMeansResult:
    """Kernel k-means of a Dask array, rows partitioned across the workers of a Dask cluster.

    Parameters
    ----------
    X : dask.array.Array of shape (n_samples, n_features)
        NumPy or CuPy chunks; columns are rechunked to one chunk. Its chunks are gathered once onto
        every worker (each worker holds all n x d prepared features: the columns of its kernel tiles).
    k : int
        Number of clusters, 1 <= k <= n_samples.
    kernel, gamma, degree, coef0, kernel_params, dtype, init, n_init, max_iter, tol, sample_weight, \
random_state, verbose, update, gemm_precision
        As for :func:`kkmgpu.fit` (``tf32`` too, deprecated); gamma's "scale" default and the centring mean are computed from X with
        Dask. ``kernel="precomputed"`` is not supported; dtype "float16" computes in float32.
    method : {"exact", "cats"}, default="exact"
        "exact": the tiled engine on every worker (no n x n matrix anywhere). "cats": CATS with the
        per-cluster sums and the assignment distributed.
    device : {"auto", "cpu", "cuda"}, default="auto"
        Resolved on each worker ("auto": the worker's GPU when CuPy sees one, as with dask-cuda's
        ``LocalCUDACluster``, else its CPU).
    n_samples_per_cluster, window, theta, rcond
        CATS's parameters, as for :func:`kkmgpu.fit`.
    tile_rows : int, optional
        Rows per kernel tile on the workers (default: from each worker's free memory).
    keep_features : bool, default=False
        Gather the n x d prepared features to the client and keep them in the result, which
        :func:`kkmgpu.predict` needs; off by default because they may not fit the client.
    client : distributed.Client, optional
        Default: the current client (``distributed.default_client()``).

    Returns
    -------
    KernelKMeansResult
        ``device`` is the workers' device ("cpu" or "cuda:0"); ``method_params`` adds the number of
        workers and the row bounds of their blocks.

    Raises
    ------
    TypeError, ValueError
        For invalid data or parameters; the message names the value and the rule.
    RuntimeError
        If the client's cluster has no workers (checked before anything is computed, which would wait forever).

    Examples
    --------
    >>> import dask.array as da, kkmgpu, kkmgpu.dask
    >>> from distributed import Client, LocalCluster
    >>> X, y = kkmgpu.datasets.make_two_circles(200, random_state=1)
    >>> with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \\
    ...         Client(cluster) as client:
    ...     result = kkmgpu.dask.fit(da.from_array(X, chunks=50), 2, gamma=5.0, device="cpu", random_state=0,
    ...                              n_init=10, client=client)
    >>> float(kkmgpu.metrics.nmi(y, result.labels))
    1.0
    """
    t_start = time.perf_counter()
    client = client or default_client()
    dt = _validation.check_dtype(dtype)
    ct = _kernel_spec.compute_dtype(dt)
    if method not in ("exact", "cats"):
        raise ValueError(f"method={method!r} is not available in kkmgpu.dask; use 'exact' or 'cats'.")
    max_iter, tol, n_init = _validation.check_params(method=method, max_iter=max_iter, tol=tol, n_init=n_init,
                                                     init=init, update=update)
    gemm_precision = _validation.check_gemm_precision(gemm_precision, tf32)
    if tile_rows is not None:
        tile_rows = _validation.check_int(tile_rows, "tile_rows", minimum=1)
    if not isinstance(device, str) or device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device={device!r} is not valid for kkmgpu.dask; use 'auto', 'cpu' or 'cuda' (each "
                         "worker resolves it to its own device).")
    rng = _validation.make_rng(random_state)
    # Client.nthreads() asks the scheduler directly; scheduler_info() can return the client's cached identity,
    # which a periodic refresh may have just replaced by one without the workers (seen as a flaky empty list)
    addresses = sorted(client.nthreads())
    if not addresses:
        raise RuntimeError("the Dask cluster has no workers; start some (or wait with client.wait_for_workers(n)) "
                           "before kkmgpu.dask.fit (it would wait for them forever).")
    X = _check_dask_array(X)
    n = X.shape[0]
    k = _validation.check_k(k, n)
    user_weights = _validation.check_sample_weight(sample_weight, n)
    weights_h, weight_scale = _validation.normalize_weights(user_weights)  # only the weights' ratios matter
    init, n_init = _validation.check_init(init, n, k, n_init)
    if (weights_h > 0).sum() < k:
        raise ValueError(f"only {(weights_h > 0).sum()} samples have a positive sample_weight; "
                         f"at least k={k} are required.")
    cats_params = _validation.check_cats_params(
        method, n_samples_per_cluster=n_samples_per_cluster, window=window, theta=theta, rcond=rcond,
        exact_objective=False, n=n, k=k, dtype=dt)
    spec = _resolve_spec(X, kernel, gamma, degree, coef0, kernel_params, dt, gemm_precision)
    t_valid = time.perf_counter()

    # one block of contiguous rows per worker; every worker gets all features once
    n_blocks = min(len(addresses), n)
    addresses = addresses[:n_blocks]
    bounds = np.linspace(0, n, n_blocks + 1).astype(np.int64)
    parts = client.compute(X.to_delayed().ravel().tolist())
    weights_f = client.scatter(weights_h, broadcast=True, hash=False)
    blocks = []
    for b, address in enumerate(addresses):
        A_f = client.submit(_distributed.assemble, spec, ct, *parts, workers=[address], allow_other_workers=False, pure=False)
        blocks.append(client.submit(_distributed.make_block, A_f, weights_f, spec, int(bounds[b]), int(bounds[b + 1]), device,
                                    tile_rows, workers=[address], allow_other_workers=False, pure=False))
    del A_f  # the host copy of the features is released once its block holds them (on a GPU: on the device)
    cluster = _distributed.Cluster(client, blocks, addresses, bounds)
    if spec.name == "callable":  # as kkmgpu.fit: a callable kernel must be symmetric, as a precomputed K is
        client.submit(_distributed.block_check_symmetric, blocks[0], spec, workers=[addresses[0]], allow_other_workers=False,
                      pure=False).result()
    info = cluster.gather(cluster.map(_distributed.block_info))
    device_name, gemm_mode = info[0][0], info[0][3]
    if gemm_precision not in (DEFAULT_PRECISION, gemm_mode):
        _warn.warn(f"gemm_precision={gemm_precision!r} has no effect on the workers ({device_name}, dtype="
                   f"{dt.name!r}, {n} x {X.shape[1]}): their products run in {gemm_mode!r}.", UserWarning)
    diag_h = np.concatenate([i[1] for i in info])
    total_diag = float(sum(i[2] for i in info))
    del parts
    t_prepared = time.perf_counter()
    operator = _distributed.DaskOperator(cluster, weights_h, diag_h, total_diag)

    if method == "exact":  # the single-device driver, restarts and warnings, on the workers' blocks
        best_run, lloyd_runs, init_seconds = _lloyd.run_restarts(
            operator, k, init=init, n_init=n_init, max_iter=max_iter, tol=tol, rng=rng, verbose=verbose,
            update=update, progress=False)
        runs = [dict(objective=r.objective, seconds=r.seconds) for r in lloyd_runs]
        best = dict(labels=best_run.labels, objective=best_run.objective, history=best_run.history,
                    n_iter=best_run.n_iter, converged=best_run.converged, sizes=best_run.sizes,
                    within=best_run.within, stop_reason=best_run.stop_reason)
    else:  # CATS's loop and restarts (kkmgpu.engine.sampled), its two passes over the workers' blocks
        passes = _distributed.DaskCatsPasses(cluster, spec, weights_h, diag_h)
        cats_run, cats_runs, init_seconds = _cats.restarts(
            lambda: initial_labels(init, n, k, rng, operator),
            lambda labels0, restart: _cats.iterate(
                passes, weights_h, k, labels0, l=cats_params["l"], max_iter=max_iter, window=cats_params["window"],
                theta=cats_params["theta"], rcond=cats_params["rcond"], rng=rng, verbose=verbose, restart=restart),
            n_init, max_iter)
        runs = [dict(objective=r.objective, seconds=r.seconds) for r in cats_runs]
        best = dict(labels=cats_run.labels, objective=cats_run.objective, history=cats_run.history,
                    n_iter=cats_run.n_iter, converged=cats_run.converged, sizes=cats_run.sizes,
                    stop_reason=cats_run.stop_reason, state=cats_run.state)
    features = None
    if keep_features:
        features = client.submit(_distributed.block_features, blocks[0], workers=[addresses[0]], pure=False).result()
    t_end = time.perf_counter()
    params = {"n_workers": n_blocks, "row_bounds": bounds.tolist(), "engine": "tiled" if method == "exact" else None,
              "gemm_precision": gemm_precision, "gemm_mode": gemm_mode}
    if method == "cats":
        params.update(cats_params)
    labels = best["labels"].astype(np.int32)

    return in_user_units(KernelKMeansResult(
        labels=labels, objective=float(best["objective"]),
        objective_history=np.asarray(best["history"], dtype=np.float64), n_iter=int(best["n_iter"]),
        converged=bool(best["converged"]), n_clusters=k, method=method, kernel=spec.name,
        kernel_params=spec.resolved_params, device=device_name, dtype=dt.name,
        timings={"validation": t_valid - t_start, "kernel_build": t_prepared - t_valid, "init": init_seconds,
                 "iterations": float(sum(run["seconds"] for run in runs)), "total": t_end - t_start},
        cluster_sizes=np.asarray(best["sizes"], dtype=np.float64), n_init=n_init,
        objectives=np.array([run["objective"] for run in runs], dtype=np.float64), sample_weight=weights_h,
        exact_objective=float(best["objective"]) if method == "exact" else None, stop_reason=best["stop_reason"],
        method_params=params, _spec=spec, _train_features=features, _train_labels=labels,
        _train_weights=weights_h, _within=np.asarray(best.get("within", np.zeros(k)), dtype=np.float64), _n_train=n,
        _cats_state=best.get("state")), user_weights, weight_scale, spec)
