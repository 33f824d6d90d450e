"""method="exact": kernel k-means on the exact kernel matrix, dense on the device or recomputed in tiles."""

from __future__ import annotations

import numpy as np

from kkmgpu import _validation
from kkmgpu._result import KernelKMeansResult
from kkmgpu.engine.dense import DenseKernelOperator
from kkmgpu.engine.lloyd import run_restarts
from kkmgpu.engine.tiled import TiledKernelOperator, choose_engine
from kkmgpu.kernels import blocks as _kernels
from kkmgpu.methods import registry


def check(method, ctx, values):
    engine = _validation.check_engine(values["engine"], method=method, precomputed=ctx.precomputed)
    return {"engine": engine} if method == "exact" else None


def run(ctx, params):
    """fit(method="exact"): the dense K (or a precomputed one) or the tiled engine, then the Lloyd driver."""
    X, k, n, spec, backend, dt = ctx.X, ctx.k, ctx.n, ctx.spec, ctx.backend, ctx.dt
    precomputed, engine, verbose = ctx.precomputed, params["engine"], ctx.verbose
    K, features = _kernels.kernel_on_device(X, spec, backend, dt, precomputed)
    if not precomputed:
        engine = choose_engine(engine, n, dt, backend)
        if engine == "dense":
            K = _kernels.build_kernel_matrix(features, features, spec, backend, verbose=verbose, storage=dt)
        elif verbose:
            print(f"[kkmgpu] tiled engine: {n} x {n} {spec.name} kernel recomputed in tiles from "
                  f"{features.shape[1]} features each iteration (no kernel matrix) on {backend.name}")
    weights = backend.asarray(ctx.weights_h)
    t_kernel = backend.timer()

    if precomputed or engine == "dense":
        operator = DenseKernelOperator(K, weights, backend)
    else:
        operator = TiledKernelOperator(features, spec, weights, backend, verbose=verbose)
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
        method_params={"engine": "dense" if precomputed else engine},
        _spec=spec, _train_features=features, _train_labels=best.labels, _train_weights=weights,
        _within=best.within.copy(), _n_train=n)


def predict(result, X_new, backend, dt, batch_size):
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


registry.register("exact", "the n x n kernel matrix on the device (or the tiled engine past its memory)",
                  ("engine",), check, run, predict)
