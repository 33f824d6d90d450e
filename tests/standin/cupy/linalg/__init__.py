"""cupy.linalg of the stand-in: NumPy's linalg on device arrays, with the limit of cuSOLVER that CuPy's ``eigh``
/ ``eigvalsh`` inherit on a stack of matrices (``a.ndim > 2``): CuPy runs cuSOLVER's batched Jacobi solver
(syevjBatched), which is documented for matrices up to 32 x 32 and rejects larger ones with
CUSOLVER_STATUS_INVALID_VALUE. A single matrix goes to syevd (any size), as in CuPy.
"""
from __future__ import annotations

import numpy as _np

import cupy as _cp

from ..cuda.cusolver import CUSOLVER_STATUS_INVALID_VALUE, CUSOLVERError

LinAlgError = _np.linalg.LinAlgError
#: cuSOLVER's syevjBatched: matrices of a batch up to this size
SYEVJ_BATCHED_MAX_N = 32

#: numpy.linalg functions CuPy 13 does not have (eig / eigvals came in CuPy 14; the rest are NumPy 2 aliases)
_DENIED = frozenset("eig eigvals multi_dot cond matrix_norm vector_norm vecdot matmul matrix_transpose outer "
                    "tensordot diagonal svdvals cross trace".split())


def _check(a, where):
    if not isinstance(a, _cp.ndarray):
        raise _cp._unsupported(a, where)
    if a.ndim < 2:
        raise LinAlgError(f"{a.ndim}-dimensional array given. Array must be at least two-dimensional")
    if a.shape[-1] != a.shape[-2]:
        raise LinAlgError("Last 2 dimensions of the array must be square")


def _batched_limit(a, where):
    if a.ndim > 2 and a.size and a.shape[-1] > SYEVJ_BATCHED_MAX_N:
        raise CUSOLVERError(CUSOLVER_STATUS_INVALID_VALUE,
                            f"{where} of a stack of {a.shape[-1]} x {a.shape[-1]} matrices: CuPy runs cuSOLVER's "
                            f"syevjBatched on a stack, which takes matrices up to {SYEVJ_BATCHED_MAX_N} x "
                            f"{SYEVJ_BATCHED_MAX_N}; decompose them one by one")


def eigh(a, UPLO="L"):
    """Eigenvalues (ascending) and eigenvectors of a symmetric matrix or stack of them (see the module)."""
    _check(a, "cupy.linalg.eigh")
    if UPLO not in ("L", "U"):
        raise ValueError("UPLO argument must be 'L' or 'U'")
    _batched_limit(a, "cupy.linalg.eigh")
    w, v = _np.linalg.eigh(a._host, UPLO=UPLO)
    if _cp._ledger.ACTIVE:
        _cp._ledger.launch("linalg.eigh", a.nbytes, w.nbytes + v.nbytes)
    return _cp._from_host(w), _cp._from_host(v)


def eigvalsh(a, UPLO="L"):
    """Eigenvalues (ascending) of a symmetric matrix or stack of them (see the module)."""
    _check(a, "cupy.linalg.eigvalsh")
    if UPLO not in ("L", "U"):
        raise ValueError("UPLO argument must be 'L' or 'U'")
    _batched_limit(a, "cupy.linalg.eigvalsh")
    w = _np.linalg.eigvalsh(a._host, UPLO=UPLO)
    if _cp._ledger.ACTIVE:
        _cp._ledger.launch("linalg.eigvalsh", a.nbytes, w.nbytes)
    return _cp._from_host(w)


def __getattr__(name):
    if name.startswith("__") or name in _DENIED:
        raise AttributeError(f"module 'cupy.linalg' has no attribute {name!r}" +
                             ("" if name.startswith("__") else " (CuPy 13 does not have it)"))
    attr = getattr(_np.linalg, name)
    if callable(attr) and not isinstance(attr, type):
        attr = _cp._device_function(attr, f"cupy.linalg.{name}")
    globals()[name] = attr
    return attr
