"""Argument checks shared by the bandwidth searches (positive numbers, depths, dtypes, labels, RBF matrices,
the Lloyd parameters).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from kkmgpu import _validation


MAX_DEPTH = 52


def _check_positive(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a finite number > 0.")
    return float(value)


def _check_depth(depth, name="depth", minimum=1):
    return _validation.check_int(depth, name, minimum=minimum, maximum=MAX_DEPTH)


def _check_walk_dtype(dtype):
    dt = _validation.check_dtype(dtype)
    if dt == np.float16:
        raise ValueError("dtype='float16' is not supported by the bandwidth search (square roots of half-precision "
                         "kernel values lose the exponent's precision); use 'float32' or 'float64'.")
    return dt


def _check_labels(labels, n):
    if labels is None:
        raise ValueError("labels are required: the partition whose critical bandwidth is sought.")
    a = labels.get() if hasattr(labels, "get") and not isinstance(labels, np.ndarray) else np.asarray(labels)
    if a.ndim != 1 or a.shape[0] != n:
        raise ValueError(f"labels have shape {a.shape}; expected ({n},), one label per sample.")
    if a.dtype.kind not in "iu":
        if a.dtype.kind == "f" and np.isfinite(a).all() and (a == np.round(a)).all():
            a = a.astype(np.int64)
        else:
            raise ValueError(f"labels have dtype {a.dtype}; integer cluster indices are required.")
    if n and a.min() < 0:
        raise ValueError(f"labels must be >= 0; got the value {int(a.min())}.")
    return a.astype(np.int32), int(a.max()) + 1 if n else 0


def _check_rbf_matrix(K, backend):
    """K must be a symmetric matrix of RBF values: finite, in [0, 1], unit diagonal."""
    xp = backend.xp
    if K.dtype.kind != "f" or K.dtype == np.float16:
        raise ValueError(f"K has dtype {K.dtype}; a float32 or float64 RBF kernel matrix is required.")
    tol = 1e3 * float(np.finfo(K.dtype).eps)
    diag = xp.diagonal(K)
    worst = float(xp.abs(diag.astype(xp.float64) - 1.0).max())
    if worst > tol:
        raise ValueError(f"K is not an RBF kernel matrix: its diagonal must be 1 (exp(0)); max |K_ii - 1| = "
                         f"{worst:.3g} > {tol:.1g}.")
    lo, hi = float(K.min()), float(K.max())
    if lo < 0 or hi > 1 + tol:
        raise ValueError(f"K is not an RBF kernel matrix: its entries must lie in [0, 1]; got values in "
                         f"[{lo:.3g}, {hi:.3g}].")
    _validation.check_symmetric(K, backend)


def _check_common(max_iter, tol, max_values):
    max_iter = _validation.check_int(max_iter, "max_iter", minimum=1)
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not np.isfinite(tol) or tol < 0:
        raise ValueError(f"tol={tol!r} must be a finite number >= 0.")
    max_values = _validation.check_int(max_values, "max_values", minimum=1)
    return max_iter, float(tol), max_values
