"""cupyx.scipy.sparse.linalg of the CuPy stand-in: ``eigsh`` (CuPy 13's signature and checks) over SciPy's
ARPACK, ``lobpcg`` over SciPy's, and ``LinearOperator``. A sparse operand whose cuSPARSE products add in a
run-dependent order (``cupyx.scipy.sparse._run_dependent``: long CSR rows, CSC) is multiplied that way inside
them too, as CuPy's solvers multiply by cuSPARSE."""
from __future__ import annotations

import numpy as _np
import scipy.sparse.linalg as _spla

import cupy as _cp
from cupyx.scipy import sparse as _sparse


class LinearOperator:
    """CuPy's ``cupyx.scipy.sparse.linalg.LinearOperator`` (shape, matvec, matmat, dtype): ``matvec`` and
    ``matmat`` take and give device arrays."""

    def __init__(self, shape, matvec=None, rmatvec=None, matmat=None, dtype=None, rmatmat=None):
        if matvec is None:
            raise TypeError("matvec is required")
        self.shape = tuple(int(s) for s in shape)
        self.ndim = 2
        self.dtype = _np.dtype(_np.float64 if dtype is None else dtype)
        self._matvec, self._matmat = matvec, matmat

    def matvec(self, x):
        return self._matvec(x)

    def matmat(self, X):
        if self._matmat is not None:
            return self._matmat(X)
        return _cp.stack([self._matvec(X[:, j]) for j in range(X.shape[1])], axis=1)

    def __matmul__(self, x):
        return self.matvec(x) if x.ndim == 1 else self.matmat(x)

    def _host(self):
        """SciPy's LinearOperator over this one (host arrays in and out)."""
        def matvec(x):
            return self.matvec(_cp.asarray(_np.ascontiguousarray(x).ravel())).get()

        def matmat(X):
            return self.matmat(_cp.asarray(_np.ascontiguousarray(X))).get()
        return _spla.LinearOperator(self.shape, matvec=matvec, matmat=matmat, dtype=self.dtype)


def _host_operand(a, name):
    """The host operand of eigsh / lobpcg: SciPy's matrix, ndarray or LinearOperator; a sparse matrix whose
    cuSPARSE products are run-dependent becomes an operator that multiplies as the stand-in's ``@`` does."""
    if isinstance(a, LinearOperator):
        return a._host()
    if isinstance(a, _sparse.spmatrix):
        host = a._sp
        if _sparse._run_dependent(host):
            return _spla.LinearOperator(host.shape, matvec=lambda x: _sparse._shuffled_product(host, x),
                                        matmat=lambda X: _sparse._shuffled_product(host, X), dtype=host.dtype)
        return host
    if isinstance(a, _cp.ndarray):
        return a._host
    raise TypeError(f"Unsupported type {type(a)}: {name} takes a cupy.ndarray, a cupyx.scipy.sparse matrix or a "
                    "LinearOperator")


def eigsh(a, k=6, *, which="LM", v0=None, ncv=None, maxiter=None, tol=0, return_eigenvectors=True):
    """``k`` eigenvalues (ascending) and eigenvectors of the real symmetric ``a``.

    As CuPy's (thick-restart Lanczos there, ARPACK here): ``a`` a device array or device sparse matrix,
    ``1 <= k < n``, ``which`` in {'LM', 'LA', 'SA'}, ``v0`` a device array; the results are device arrays in
    ``a``'s dtype, eigenvalues ascending.
    """
    host = _host_operand(a, "eigsh")
    n = a.shape[0]
    if len(a.shape) != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"expected square matrix (shape: {a.shape})")
    if a.dtype.char not in "fdFD":
        raise TypeError(f"unsupprted dtype (actual: {a.dtype})")  # sic, CuPy's message
    if k <= 0:
        raise ValueError(f"k must be greater than 0 (actual: {k})")
    if k >= n:
        raise ValueError(f"k must be smaller than n (actual: {k})")
    if which not in ("LM", "LA", "SA"):
        raise ValueError(f"which must be 'LM', 'LA' or 'SA' (actual: {which})")
    if v0 is not None and not isinstance(v0, _cp.ndarray):
        raise TypeError(f"Unsupported type {type(v0)}: v0 must be a device array")
    ncv = min(max(2 * k, k + 32), n - 1) if ncv is None else min(max(ncv, k + 2), n - 1)
    if ncv < k + 2:  # CuPy's first thick restart writes V[k + 1] into its (ncv, n) basis (H100, n = 3, k = 1)
        raise IndexError(f"Index {k + 1} is out of bounds for axis 0 with size {ncv}")
    if k >= n - 1 or ncv <= k:  # ARPACK needs k < ncv <= n: the whole spectrum instead
        dense = host @ _np.eye(n) if isinstance(host, _spla.LinearOperator) else (
            host.toarray() if hasattr(host, "toarray") else host)
        w, x = _np.linalg.eigh(dense)
        pick = {"LA": _np.argsort(w)[-k:], "SA": _np.argsort(w)[:k], "LM": _np.argsort(_np.abs(w))[-k:]}[which]
        w, x = w[pick].astype(a.dtype), x[:, pick].astype(a.dtype)
    else:
        w, x = _spla.eigsh(host, k=k, which=which, v0=None if v0 is None else v0._host, ncv=ncv,
                           maxiter=10 * n if maxiter is None else maxiter, tol=tol)
    order = _np.argsort(w)
    if _cp._ledger.ACTIVE:  # CuPy's Lanczos iterations (their launches and syncs) are not modelled
        _cp._ledger.note("eigsh counted as one launch")
        _cp._ledger.launch("eigsh", _sparse._operand_bytes(a), w.nbytes + (x.nbytes if return_eigenvectors else 0))
    if not return_eigenvectors:
        return _cp._from_host(_np.ascontiguousarray(w[order]))
    return _cp._from_host(_np.ascontiguousarray(w[order])), _cp._from_host(_np.ascontiguousarray(x[:, order]))


def lobpcg(A, X, B=None, M=None, Y=None, tol=None, maxiter=None, largest=True, verbosityLevel=0,
           retLambdaHistory=False, retResidualNormsHistory=False):
    """LOBPCG as CuPy's (its signature; SciPy's underneath): ``A`` a device array or device sparse matrix, ``X``
    a device array (n, k); eigenvalues and eigenvectors come back as device arrays, the histories as lists."""
    host = _host_operand(A, "lobpcg")
    if not isinstance(X, _cp.ndarray):
        raise TypeError(f"Unsupported type {type(X)}: X must be a device array")
    for name, operand in (("B", B), ("M", M), ("Y", Y)):
        if operand is not None:
            raise NotImplementedError(f"the stand-in's lobpcg takes no {name}")
    out = _spla.lobpcg(host, X._host, tol=tol, maxiter=20 if maxiter is None else maxiter, largest=largest,
                       verbosityLevel=verbosityLevel, retLambdaHistory=retLambdaHistory,
                       retResidualNormsHistory=retResidualNormsHistory)
    w, v = out[0], out[1]
    if _cp._ledger.ACTIVE:
        _cp._ledger.note("lobpcg counted as one launch")
        _cp._ledger.launch("lobpcg", _sparse._operand_bytes(A) + X.nbytes, w.nbytes + v.nbytes)
    result = [_cp._from_host(_np.ascontiguousarray(w)), _cp._from_host(_np.ascontiguousarray(v))]
    return tuple(result + [list(h) for h in out[2:]]) if len(out) > 2 else tuple(result)
