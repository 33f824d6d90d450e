"""method="eigen": k-means on the kernel's eigen-embedding (papers/kernel-kmeans-trace-objective-eigendecomposition.txt,
Algorithm 16).

The embedding A = V Lambda^(1/2) and its operator are in :mod:`kkmgpu.engine.embedding`; this module chooses the
number of components, runs the restarts on the embedding, reports the objective on K itself and predicts new
points Nystrom-style, a(x) = Lambda^(-1/2) V^T k(X_train, x).
"""

from __future__ import annotations

import contextlib

import numpy as np

from kkmgpu import _validation
from kkmgpu._result import KernelKMeansResult
from kkmgpu.backend.device import Backend, more_memory_situation
from kkmgpu.engine.dense import DenseKernelOperator
from kkmgpu.engine.embedding import (DEFAULT_COMPONENTS, FULL_DECOMPOSITION_MAX_N, PARTIAL_MAX_FRACTION,
                                     EmbeddingOperator, embed)
from kkmgpu.engine.lloyd import _update, run_restarts
from kkmgpu.kernels import blocks as _kernels
from kkmgpu.methods import registry


def resolve_components(n_components, n, k) -> int:
    """The number of eigenpairs to compute (n_components validated at the API boundary)."""
    if n_components is None:
        return n if n <= FULL_DECOMPOSITION_MAX_N else min(n - 1, max(DEFAULT_COMPONENTS, 8 * k))
    return int(n_components)


class EigenState:
    """What :func:`predict` needs: the Nystrom projection and the cluster sums in its basis."""

    def __init__(self, projection, centroid_sums, within, sizes):
        self.projection = projection          # device (n_train, q): V_q Lambda_q^(-1/2)
        self.centroid_sums = centroid_sums    # device float64 (k, q)
        self.within = within                  # host float64 (k,): ||M_c||^2 in the same basis
        self.sizes = sizes                    # host float64 (k,)


def _prediction_state(V, eigenvalues, operator, labels, sizes, k, dtype):
    """Nystrom projection keeping eigenvalues above n * eps(dtype) * lambda_max (smaller ones are noise)."""
    backend = operator.backend
    xp = backend.xp
    n = V.shape[0]
    cutoff = n * np.finfo(dtype).eps * eigenvalues[0]
    keep = np.flatnonzero(eigenvalues > cutoff)
    index = backend.asarray(keep)
    P = V[:, index] * backend.asarray(1.0 / np.sqrt(eigenvalues[keep]), dtype=V.dtype)[None, :]
    M = operator.centroid_sums(labels, k)[:, index].astype(xp.float64)
    within = backend.to_host((M * M).sum(axis=1))
    return EigenState(xp.ascontiguousarray(P), M, within, np.asarray(sizes, dtype=np.float64)), int(keep.size)


def _single_threaded_blas(backend: Backend):
    """On the CPU, BLAS on one thread while Lloyd alternates the thin n x r x k products with numba's
    assignment kernel: multithreaded OpenBLAS competing with numba's OpenMP threads for the cores made an
    iteration 5-17x slower on the 2-core reference machine (n=5000, r=128, k=10: 321 ms vs 19 ms per
    iteration under load; n=500: 10 restarts in 0.83 s vs 0.04 s when idle). Uses threadpoolctl where it
    is installed (it comes with scikit-learn), else changes nothing."""
    if backend.is_gpu:
        return contextlib.nullcontext()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def fit_eigen(K, k, *, r, weights, init, n_init, max_iter, tol, rng, verbose, backend: Backend):
    """Algorithm 16 on a kernel matrix K already on the device.

    Returns (best LloydRun, runs, init_seconds, diagnostics, EigenState, exact objective of the labels
    on K, seconds of the decomposition).
    """
    t0 = backend.timer()
    A, eigenvalues, V, diagnostics = embed(K, r, backend, rng, verbose=verbose)
    t_decomposed = backend.timer()
    operator = EmbeddingOperator(A, weights, backend)
    with _single_threaded_blas(backend):
        best, runs, init_seconds = run_restarts(operator, k, init=init, n_init=n_init, max_iter=max_iter, tol=tol,
                                                rng=rng, verbose=verbose, update="full")
    # The objective of the labels on K itself (one pass over K): equal to best.objective when every
    # component is kept and no eigenvalue was clipped, an upper bound's complement otherwise.
    _, _, _, exact = _update(DenseKernelOperator(K, weights, backend), best.labels, k, backend.xp)
    state, q = _prediction_state(V, eigenvalues, operator, best.labels, best.sizes, k, np.dtype(A.dtype))
    diagnostics["n_components_predict"] = q
    if verbose:
        print(f"[kkmgpu] eigen: {diagnostics['n_components_used']} components "
              f"({100 * diagnostics['captured_fraction']:.4g}% of trace K), objective on K {exact:.10g}")
    return best, runs, init_seconds, diagnostics, state, float(exact), t_decomposed - t0


def predict(result, X_new, backend: Backend, dt, batch_size):
    """Nearest cluster of each new point in the embedding: a(x) = Lambda^(-1/2) V^T k(X_train, x)."""
    xp = backend.xp
    state = result._eigen_state
    P = backend.asarray(state.projection)
    M = backend.asarray(state.centroid_sums).astype(P.dtype)
    step = batch_size or _kernels.tile_rows(result._n_train, dt.itemsize, backend=backend)
    out = []
    for i0, i1, block in _kernels.training_kernel_rows(result, X_new, backend, dt, step):
        S = ((block @ P) @ M.T).astype(xp.float64)  # a(x) . M_c
        labels, _, _ = backend.ops.assign_labels(S, xp.zeros(i1 - i0, dtype=xp.float64), state.sizes,
                                                 state.within, xp.zeros(i1 - i0, dtype=xp.int32))
        out.append(backend.to_host(labels))
    return np.concatenate(out).astype(np.int32)


def check(method, ctx, values):
    return _validation.check_eigen_params(method, n_components=values["n_components"], n=ctx.n, dtype=ctx.dt)


def run(ctx, n_components):
    return _fit_eigen(ctx.X, ctx.k, ctx.spec, ctx.backend, ctx.dt, ctx.precomputed, ctx.weights_h, ctx.init,
                      ctx.n_init, ctx.max_iter, ctx.tol, ctx.rng, ctx.verbose, ctx.keep_on_device, n_components,
                      ctx.t_start, ctx.t_valid)


def _fit_eigen(X, k, spec, backend, dt, precomputed, weights_h, init, n_init, max_iter, tol, rng, verbose,
               keep_on_device, n_components, t_start, t_valid):
    """fit(method="eigen"): K on the device, its (top) eigendecomposition, Lloyd on A = V Lambda^(1/2)."""
    n = X.shape[0]
    K, features = _kernels.kernel_on_device(X, spec, backend, dt, precomputed)
    if not precomputed:
        K = _kernels.build_kernel_matrix(features, features, spec, backend, verbose=verbose, storage=dt)
    weights = backend.asarray(weights_h)
    t_kernel = backend.timer()
    n_eig = resolve_components(n_components, n, k)
    # a smaller n_components saves memory only by taking the top-r route instead of the full decomposition
    lighter = int(PARTIAL_MAX_FRACTION * n) if n > 64 else None
    with more_memory_situation(components=(n_eig, lighter)):
        best, runs, init_seconds, params, state, exact, decomposition_seconds = fit_eigen(
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


registry.register("eigen", "k-means on the kernel's eigen-embedding (the trace objective's Algorithm 16)",
                  ("n_components",), check, run, predict)
