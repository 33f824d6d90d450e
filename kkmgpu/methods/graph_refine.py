"""The graph objectives' refinements: each start refined by weighted kernel k-means on the graph kernel
(:mod:`kkmgpu.methods.graphcut`), as ``fit(K, kernel="precomputed")`` would refine it, with its fixed work paid
once per fit (issue 29 point 1: the small sets' fixed costs)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kkmgpu import _degenerate, _result, _validation
from kkmgpu.engine import sparse as _sparse
from kkmgpu.kernels import spec as _kernel_spec
from kkmgpu.methods import trimmed as _trimmed


class Refinements:
    """The refinement of each start on the graph kernel, as ``fit_exact(K, k, kernel="precomputed",
    sample_weight=weights, init=labels0)`` gives it, with less fixed work per start.

    A start whose labels equal an earlier start's takes that start's refinement (the Lloyd driver is deterministic
    from given labels: it draws nothing). Label starts are run by the driver itself (:func:`run_restarts`) on the
    operator ``fit_exact`` would build, K in the storage dtype and the weights over their power of two
    (:func:`kkmgpu._validation.normalize_weights`), with the objectives in its units; the lowest one's result is
    then assembled as ``fit_exact`` assembles it (:meth:`result`: :func:`kkmgpu.methods.trimmed.sparse_result`,
    the degenerate-result checks, the caller's units). ``fit_exact``'s checks and conversions (1-2 ms a call against
    0.3 ms for the driver on two moons, 1,000 points, 2-core CPU; K's symmetry check alone 0.8 ms) are thus not paid
    at all: K is the graph kernel, symmetric by construction. Where ``fit_exact`` would change K's scale (values
    beyond the storage dtype's range: ``spec.value_scale``) or clamp a negative objective, every start runs through
    ``fit_exact``."""

    def __init__(self, K, weights, k, backend, *, fit_exact, dtype, n_init, max_iter, tol, rng, keep_on_device,
                 progress):
        self.K, self.k, self.backend, self.fit_exact, self.rng = K, k, backend, fit_exact, rng
        self.dtype, self.keep_on_device = _validation.check_dtype(dtype), keep_on_device
        self.common = dict(kernel="precomputed", sample_weight=backend.to_host(weights), device=backend.name,
                           dtype=dtype, max_iter=max_iter, tol=tol, verbose=False, keep_on_device=keep_on_device,
                           progress=progress)  # a nested bar
        self.n_init, self.max_iter, self.tol, self.progress = n_init, max_iter, tol, progress
        self.done = {}       # the labels' bytes: the refinement
        self.light = set()   # ids of the refinements run by the driver alone
        self.operator = self._operator(K, self.dtype, backend)

    def _operator(self, K, dt, backend):
        """The operator of ``fit_exact``'s sparse run, or None where ``fit_exact`` would rescale K."""
        top = float(backend.to_host(abs(K.data).max())) if K.nnz else 0.0
        limit = _kernel_spec.storage_limit(dt, K.shape[0])
        if not min(float(np.finfo(dt).tiny) * 2.0 ** _kernel_spec.FLOOR_BITS, limit / 2) <= top <= limit:
            return None
        value_dtype = np.float32 if dt == np.float16 else dt
        self.user_weights = _validation.check_sample_weight(self.common["sample_weight"], K.shape[0])
        self.weights_h, self.weight_scale = _validation.normalize_weights(self.user_weights)
        self.K_value = K if K.dtype == value_dtype else K.astype(value_dtype)
        return _sparse.SparseKernelOperator(self.K_value, backend.asarray(self.weights_h), backend)

    def __call__(self, labels0):
        if isinstance(labels0, str):   # k-means++ or random in the graph kernel's space: fit_exact's restarts
            return self.fit_exact(self.K, self.k, init=labels0, n_init=self.n_init, random_state=self.rng,
                                  **self.common)
        key = np.asarray(labels0, dtype=np.int32).tobytes()
        if key not in self.done:
            run = self._light(labels0) if self.operator is not None else None
            if run is None:
                run = self.fit_exact(self.K, self.k, init=labels0, n_init=1, random_state=self.rng, **self.common)
            else:
                self.light.add(id(run))
            self.done[key] = run
        return self.done[key]

    def _light(self, labels0):
        """The driver's refinement from ``labels0`` in ``fit_exact``'s units, or None where it would clamp."""
        from kkmgpu.engine.lloyd import run_restarts

        best, runs, _ = run_restarts(self.operator, self.k, init=np.asarray(labels0, dtype=np.int32), n_init=1,
                                     max_iter=self.max_iter, tol=self.tol, rng=self.rng, verbose=False,
                                     progress=self.progress)
        scale = self.weight_scale
        run = Refined(labels=best.labels, objective=float(best.objective) * scale,
                       objective_history=np.asarray(best.history, dtype=np.float64) * scale,
                       objectives=np.array([r.objective for r in runs], dtype=np.float64) * scale,
                       n_iter=int(best.n_iter), stop_reason=best.stop_reason,
                       timings={"iterations": float(sum(r.seconds for r in runs))}, start=labels0,
                       lloyd=(best, runs))
        if min(run.objective, run.objective_history.min(initial=0.0), run.objectives.min()) < 0:
            return None   # fit_exact's clamp (kkmgpu._degenerate.clamp_rounding) may apply
        return run

    def result(self, best):
        """``fit_exact``'s result for the start of the lowest refinement ``best``: as ``fit_exact`` builds it
        from the same Lloyd run (``fit``: :func:`kkmgpu.methods.trimmed.fit_sparse`'s result, the degenerate
        checks, the caller's units). Its timings hold the iterations only and its ``method_params`` the
        operator's size; the graph objectives replace both."""
        if id(best) not in self.light:
            return best
        run, runs = best.lloyd
        n = self.K.shape[0]
        spec = _kernel_spec.resolve_kernel("precomputed")   # fit_exact's, at its default gemm_precision
        result = _trimmed.sparse_result(
            run, runs, k=self.k, method="exact", spec=spec, backend=self.backend, dt=self.dtype,
            weights_h=self.weights_h, weights=self.operator.weights, n_init=1, timings=dict(best.timings),
            method_params={"nnz": self.operator.nnz, "density": self.operator.nnz / float(n) ** 2},
            keep_on_device=self.keep_on_device)
        result = _degenerate.checked(result, self.K_value, spec, self.weights_h, self.k, self.backend, self.dtype,
                                     True, set())
        return _result.in_user_units(result, self.user_weights, self.weight_scale, spec)


@dataclass
class Refined:
    """A start's refinement by the Lloyd driver alone (:class:`Refinements`): what ``fit`` reads of it."""

    labels: object
    objective: float
    objective_history: np.ndarray
    objectives: np.ndarray
    n_iter: int
    stop_reason: str
    timings: dict
    start: np.ndarray
    lloyd: tuple = None     # (the driver's best run, all its runs): what :meth:`Refinements.result` assembles
