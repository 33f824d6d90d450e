"""method="cats": centroids approximated from sampled members (papers/cats-centroid-approximation.txt).

The iterations (sampling, the centroid coefficients of Eq. 2, assignment, the stopping rule) are the engine's
sampled-centroid loop, :mod:`kkmgpu.engine.sampled`; this module checks the parameters, runs the restarts with a
progress bar, builds the result and predicts new points from the final approximate centroids.
"""

from __future__ import annotations

import numpy as np

from kkmgpu import _validation
from kkmgpu.kernels import spec as _kernel_spec
from kkmgpu._progress import active as progress_active, progress_bar
from kkmgpu._result import KernelKMeansResult
from kkmgpu.engine import sampled as _cats
from kkmgpu.kernels import blocks as _kernels
from kkmgpu.methods import registry


def check(method, ctx, values):
    params = _validation.check_cats_params(
        method, n_samples_per_cluster=values["n_samples_per_cluster"], window=values["window"],
        theta=values["theta"], rcond=values["rcond"], exact_objective=values["exact_objective"], n=ctx.n, k=ctx.k,
        dtype=ctx.dt)
    return None if params is None else dict(params, exact_objective=values["exact_objective"])


def run(ctx, params):
    return _fit_cats(ctx.X, ctx.k, ctx.spec, ctx.backend, ctx.dt, ctx.precomputed, ctx.weights_h, ctx.init,
                     ctx.n_init, ctx.max_iter, ctx.rng, ctx.verbose, ctx.keep_on_device,
                     {key: params[key] for key in ("l", "window", "theta", "rcond")}, params["exact_objective"],
                     ctx.t_start, ctx.t_valid)


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
        source_array = _kernels.prepare_features(X, spec, backend, _kernel_spec.compute_dtype(dt))
    source = _cats.KernelSource(source_array, spec, backend)
    t_prepared = backend.timer()
    with progress_bar(n_init, desc="CATS", unit="init", enabled=progress_active()) as bar:
        best, runs, init_seconds, diag = _cats.run_restarts(
            source, weights_h, k, init=init, n_init=n_init, max_iter=max_iter, window=params["window"],
            theta=params["theta"], rcond=params["rcond"], l=params["l"], rng=rng, verbose=verbose,
            callback=_CatsProgress(bar))
        bar.update(n_init - bar.n)
    t_iter = backend.timer()
    ran = source.mode_ran()  # the iterations' blocks' GEMM mode (fp32 where the 3xTF32 split could not be kept)
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
        exact_objective=exact, stop_reason=best.stop_reason,
        method_params=params if ran is None else dict(params, gemm_mode=ran),
        _spec=spec, _train_features=None if precomputed else source_array, _train_labels=best.labels,
        _train_weights=backend.asarray(weights_h), _within=np.zeros(k), _n_train=n,
        _cats_state=state)


def predict(result, X_new, backend, dt, batch_size):
    """argmin_c -2 sum_s alpha_s k(x, s) + alpha_c^T M_c alpha_c with the final approximate centroids."""
    xp = backend.xp
    state = result._cats_state
    index = backend.asarray(state.index.ravel())
    alpha = backend.asarray(state.alpha)
    step = batch_size or _kernels.tile_rows(index.shape[0], dt.itemsize, backend=backend)
    flags = state.nonempty.astype(np.float64)
    out = []
    for i0, i1, block in _kernels.training_kernel_rows(result, X_new, backend, dt, step, index=index):
        T = _cats._project(block, alpha, xp)
        labels, _, _ = backend.ops.assign_labels(T, xp.zeros(i1 - i0, dtype=xp.float64), flags,
                                                 state.offsets, xp.zeros(i1 - i0, dtype=xp.int32))
        out.append(backend.to_host(labels))
    return np.concatenate(out).astype(np.int32)


registry.register("cats", "centroids approximated from sampled members (CATS): no n x n matrix",
                  ("n_samples_per_cluster", "window", "theta", "rcond", "exact_objective"), check, run, predict)
