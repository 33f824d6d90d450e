"""Degenerate data after a fit: fewer distinct points than clusters, and objectives that round below 0.

Both are checked once here for every method, so that they say the same thing whichever ran.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kkmgpu import _warn
from kkmgpu.engine import sparse as _sparse
from kkmgpu.engine.lloyd import ConvergenceWarning
from kkmgpu.kernels import blocks as _kernels
from kkmgpu.kernels import spec as _kernel_spec

#: an objective in [-ROUNDING * eps * sum_i w_i |K_ii|, 0) is rounding of 0 (eps: the compute dtype's)
ROUNDING = 64


def checked(result, X, spec, weights_h, k, backend, dt, precomputed, given):
    """The fit's result after both checks (``given``: the warnings the method gave, see :func:`_warn.collect`)."""
    warn_fewer_distinct(X, result.labels, weights_h, k, backend, given)
    return clamp_rounding(result, X, spec, weights_h, backend, dt, precomputed)


def warn_fewer_distinct(X, labels, weights_h, k, backend, given):
    """The fewer-distinct-clusters warning where X (features, or the rows of a dense K) has fewer distinct
    positive-weight points than k and the method has not given it (``given``: see :func:`_warn.collect`)."""
    if "fewer_distinct" in given or _sparse.is_sparse(X):
        return
    keep = np.flatnonzero(weights_h > 0)
    head = np.asarray(backend.to_host(X[backend.asarray(keep[:max(4 * k, 1024)])]))
    if np.unique(head, axis=0).shape[0] >= k:  # the usual case, decided on a few rows
        return
    rows = np.asarray(backend.to_host(X[backend.asarray(keep)]))
    points, point = np.unique(rows, axis=0, return_inverse=True)
    if points.shape[0] >= k:
        return
    # clusters coincide when they hold the same distinct points in the same weight proportions
    mass = np.zeros((k, points.shape[0]))
    labels_h, point = np.asarray(backend.to_host(labels))[keep], point.ravel()
    kept = labels_h >= 0  # a method may leave points unassigned (negative labels)
    np.add.at(mass, (labels_h[kept], point[kept]), weights_h[keep][kept])
    sizes = mass.sum(axis=1)
    shares = mass[sizes > 0] / sizes[sizes > 0, None]
    distinct = np.unique(np.round(shares, 12), axis=0).shape[0]
    if distinct < k:  # k clusters of distinct mixtures of fewer points (a graph's kernel) have distinct centres
        _warn.fewer_distinct(distinct, k, ConvergenceWarning)


def clamp_rounding(result, X, spec, weights_h, backend, dt, precomputed):
    """The result with objectives in [-ROUNDING * eps * sum_i w_i |K_ii|, 0) set to 0: the kernel k-means
    objective of a PSD kernel is a sum of squared distances, and such a value is the rounding of 0 (identical
    points split among clusters). Larger negative values (kernels that are not PSD) are left as they are."""
    values = [result.objective, result.exact_objective, *np.ravel(result.objective_history),
              *np.ravel(result.objectives)]
    if not any(v is not None and v < 0 for v in values):
        return result
    if precomputed:
        diag = (X.diagonal() if _sparse.is_sparse(X) else backend.xp.diagonal(X)).astype(np.float64)
    else:
        compute = _kernel_spec.compute_dtype(dt)
        diag = _kernels.kernel_diagonal(_kernels.prepare_features(X, spec, backend, compute), spec, backend)
    scale = float(np.sum(weights_h * np.abs(np.asarray(backend.to_host(diag)))))
    bound = ROUNDING * float(np.finfo(_kernel_spec.compute_dtype(dt)).eps) * scale

    def clamp(v):
        if v is None:
            return None
        v = np.asarray(v, dtype=np.float64)
        out = np.where((v < 0) & (v >= -bound), 0.0, v)
        return float(out) if out.ndim == 0 else out

    return dataclasses.replace(result, objective=clamp(result.objective),
                               exact_objective=clamp(result.exact_objective),
                               objective_history=clamp(result.objective_history), objectives=clamp(result.objectives))
