"""method="trimmed": Lloyd on the trimmed sparse kernel K* (papers/kernel-matrix-trimming.txt, Section 3), and
any sparse precomputed K clustered as given.

The trimming itself (the votes, Eq. 5's scores, K_hat and K*) is :mod:`kkmgpu.trimming`; this module runs the
Lloyd driver on K* through the sparse operator and predicts new points under K*'s trimming rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kkmgpu import _validation
from kkmgpu.kernels import spec as _kernel_spec
from kkmgpu._result import KernelKMeansResult
from kkmgpu.backend.device import Backend
from kkmgpu.engine import sparse as _sparse
from kkmgpu.engine.lloyd import run_restarts
from kkmgpu.kernels.blocks import build_kernel_matrix, check_fits, prepare_features, tile_rows, training_kernel_rows
from kkmgpu.methods import registry
from kkmgpu.trimming import DEFAULTS, _finish_trim, _trim_rows


@dataclass(frozen=True)
class _TrimState:
    """What predict needs to trim a new point's kernel row as K* trims a training row."""

    thresholds: object   # (n,) device float64: training row j keeps K[j, i] >= thresholds[j]
    row_sizes: object    # (n,) device int64: w_j
    train_diag: object   # (n,) device float64: K_jj of the untrimmed K (nearest training point in feature space)
    extra: int           # ceil(slack n)


def fit_sparse(X, k, *, spec, backend, dt, precomputed, method, weights_h, init, n_init, max_iter, tol, rng,
               verbose, keep_on_device, update, params, t_start, t_valid):
    """fit(method="trimmed") and fit(sparse K, kernel="precomputed"): Lloyd on a CSR kernel matrix.

    method="trimmed": K (built from X, or the dense precomputed X) is trimmed (Section 3) and freed, then
    the Lloyd driver runs on K* through :class:`kkmgpu.engine.sparse.SparseKernelOperator`. A sparse X is
    clustered as given (method="exact").
    """

    xp = backend.xp
    n = X.shape[0]
    features = None
    trimmed = None
    state = None
    if _sparse.is_sparse(X):
        if method != "exact":
            raise ValueError(f"method={method!r} needs a dense matrix or features; a sparse kernel matrix is "
                             "clustered as given with method='exact' (trimming sorts every value of a row: "
                             "pass the dense K to trim it).")
        value_dtype = np.float32 if dt == np.float16 else dt
        if X.dtype != value_dtype:
            check_fits(_sparse.csr_bytes(X, value_dtype), backend, f"the {np.dtype(value_dtype).name} copy of the "
                       "sparse kernel matrix")
        K_star = X if X.dtype == value_dtype else X.astype(value_dtype)
        t_kernel = t_trim = backend.timer()
    else:
        if precomputed:
            if X.dtype != dt:
                check_fits(X.size * dt.itemsize, backend, f"the {n} x {n} {dt.name} copy of K")
            K = backend.asarray(X, dtype=dt)
        else:
            features = prepare_features(X, spec, backend, _kernel_spec.compute_dtype(dt))
            K = build_kernel_matrix(features, features, spec, backend, verbose=verbose, storage=dt)
        t_kernel = backend.timer()
        rows = _trim_rows(K, backend, vote_fraction=params["vote_fraction"], slack=params["slack"], h=params["h"],
                          max_size=params["max_size"], verbose=verbose)
        train_diag = xp.diagonal(K).astype(xp.float64)
        # K is not needed past K_hat: freed before the sparse maximum, which then has K's memory too
        # (MNIST n = 70,000 on a 23 GiB host: K_hat, its transpose and K* would not fit beside a float16 K)
        del K
        trimmed = _finish_trim(rows, backend)
        state = _TrimState(thresholds=backend.asarray(trimmed.thresholds),
                           row_sizes=backend.asarray(trimmed.row_sizes),
                           train_diag=train_diag, extra=int(math.ceil(trimmed.slack * n)))
        K_star = trimmed.K
        t_trim = backend.timer()
    weights = backend.asarray(weights_h)
    operator = _sparse.SparseKernelOperator(K_star, weights, backend)
    best, runs, init_seconds = run_restarts(operator, k, init=init, n_init=n_init, max_iter=max_iter, tol=tol,
                                            rng=rng, verbose=verbose, update=update)
    t_end = backend.timer()
    timings = {"validation": t_valid - t_start, "kernel_build": t_kernel - t_valid, "trimming": t_trim - t_kernel,
               "init": init_seconds, "iterations": float(sum(r.seconds for r in runs)), "total": t_end - t_start}
    method_params = {"nnz": operator.nnz, "density": operator.nnz / float(n) ** 2}
    if trimmed is not None:
        method_params.update(vote_fraction=trimmed.vote_fraction, slack=trimmed.slack, h=trimmed.h,
                             max_size=trimmed.max_size,
                             n_clusters_estimated=trimmed.n_clusters,
                             cluster_sizes_estimated=trimmed.cluster_sizes.tolist(),
                             trimming_timings=dict(trimmed.timings))
    return sparse_result(best, runs, k=k, method=method, spec=spec, backend=backend, dt=dt, weights_h=weights_h,
                         weights=weights, n_init=n_init, timings=timings, method_params=method_params,
                         keep_on_device=keep_on_device, features=features, state=state)


def sparse_result(best, runs, *, k, method, spec, backend, dt, weights_h, weights, n_init, timings, method_params,
                  keep_on_device, features=None, state=None) -> KernelKMeansResult:
    """The result of Lloyd runs on a CSR kernel matrix (``best`` the lowest of ``runs``, :func:`run_restarts`), in
    the units they ran in (weights ``weights_h`` normalised, K's value scale): :func:`fit_sparse`'s, and the graph
    objectives' refinement of their lowest start (:class:`kkmgpu.methods.graph_refine.Refinements`)."""
    return KernelKMeansResult(
        labels=best.labels if keep_on_device else backend.to_host(best.labels).astype(np.int32),
        objective=float(best.objective), objective_history=np.asarray(best.history, dtype=np.float64),
        n_iter=int(best.n_iter), converged=bool(best.converged), n_clusters=k, method=method, kernel=spec.name,
        kernel_params=spec.resolved_params, device=backend.name, dtype=dt.name, timings=timings,
        cluster_sizes=best.sizes.copy(), n_init=n_init,
        objectives=np.array([r.objective for r in runs], dtype=np.float64), sample_weight=weights_h,
        exact_objective=float(best.objective), stop_reason=best.stop_reason, method_params=method_params,
        _spec=spec, _train_features=features, _train_labels=best.labels, _train_weights=weights,
        _within=best.within.copy(), _n_train=best.labels.shape[0], _trim_state=state)


def predict(result, X_new, backend: Backend, dt, batch_size=None):
    """Nearest cluster of new points under K*'s trimming rule (``predict`` for method="trimmed").

    A new point x gets the kernel row k(x, x_j) to the training points, trimmed as K* trims a training row:
    the entry to x_j is kept if x_j would keep it (k(x, x_j) >= thresholds[j], the K_hat^T side) or if x
    keeps it itself, x taking the estimated size w of its nearest training point in feature space
    (argmin_j K_jj - 2 k(x, x_j)) and cutting below its own (w + ceil(slack n))-th largest value (the K_hat
    side); then dist(x, c) = -2 S_c(x) / n_c + C*_c / n_c^2 (k(x, x) does not change the argmin). For a
    training point this row is exactly its row of K*, so predicting the training set repeats the fit's last
    assignment step.
    """

    xp = backend.xp
    state = result._trim_state
    k = result.n_clusters
    n = result._n_train
    sizes = np.asarray(result.cluster_sizes, dtype=np.float64) / result._weight_scale
    within = np.asarray(result._within, dtype=np.float64)
    train_labels = backend.asarray(result._train_labels, dtype=np.int32)
    train_weights = backend.asarray(result._train_weights, dtype=np.float64)
    thresholds = backend.asarray(state.thresholds)
    row_sizes = backend.asarray(state.row_sizes)
    diag = backend.asarray(state.train_diag)
    # the block, its sorted copy and two trimmed sides
    step = batch_size or max(1, tile_rows(n, 8, backend=backend) // 4)
    out = []
    for i0, i1, block in training_kernel_rows(result, X_new, backend, dt, step):
        rows = xp.arange(i1 - i0)
        nearest = xp.argmin(diag[None, :] - 2.0 * block, axis=1)
        cut = xp.minimum(row_sizes[nearest] + state.extra, n)
        own = xp.sort(block, axis=1)[rows, n - cut]  # the cut-th largest of each new row
        zero = xp.zeros((), dtype=block.dtype)
        trimmed_block = xp.maximum(xp.where(block >= own[:, None].astype(block.dtype), block, zero),   # K_hat
                                   xp.where(block >= thresholds[None, :].astype(block.dtype), block, zero))
        S = backend.ops.block_cluster_sums(xp.ascontiguousarray(trimmed_block), train_labels, train_weights, k)
        labels, _, _ = backend.ops.assign_labels(S, xp.zeros(i1 - i0, dtype=xp.float64), sizes, within,
                                                 xp.zeros(i1 - i0, dtype=xp.int32))
        out.append(backend.to_host(labels))
    return np.concatenate(out).astype(np.int32)


def check(method, ctx, values):
    return _validation.check_trim_params(method, vote_fraction=values["trim_vote_fraction"],
                                         slack=values["trim_slack"], h=values["trim_h"],
                                         max_size=values["trim_max_size"], defaults=DEFAULTS)


def run(ctx, params):
    return fit_sparse(ctx.X, ctx.k, spec=ctx.spec, backend=ctx.backend, dt=ctx.dt,
                                precomputed=ctx.precomputed, method="trimmed", weights_h=ctx.weights_h,
                                init=ctx.init, n_init=ctx.n_init, max_iter=ctx.max_iter, tol=ctx.tol, rng=ctx.rng,
                                verbose=ctx.verbose, keep_on_device=ctx.keep_on_device, update=ctx.update,
                                params=params, t_start=ctx.t_start, t_valid=ctx.t_valid)


registry.register("trimmed", "Lloyd on the trimmed sparse kernel K* (kernel matrix trimming, Section 3)",
                  ("trim_vote_fraction", "trim_slack", "trim_h", "trim_max_size"), check, run, predict)
