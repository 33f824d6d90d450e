"""cupyx.scipy.sparse of the CuPy stand-in: CSR / CSC / COO matrices backed by SciPy's.

A matrix keeps a SciPy sparse matrix in ``_sp`` whose arrays are device buffers (charged to the memory pool);
``data`` / ``indices`` / ``indptr`` (``row`` / ``col`` for COO) are device arrays on those buffers, ``get()``
copies the matrix to the host (a SciPy matrix) and ``toarray()`` gives a dense *device* array. As in CuPy:

* values are bool, float32, float64, complex64 or complex128 (an integer matrix raises ValueError), indices
  int32;
* the constructors take device arrays, device matrices, SciPy matrices (copied to the device) or a shape; NumPy
  arrays raise (``data, indices, and indptr should be 1-D``, ``Unsupported initializer format``);
* products, sums and methods take device operands (NumPy arrays and SciPy matrices raise TypeError) and give
  device results: ``A @ dense`` a device array, reductions 0-d device arrays, ``A.sum(axis)`` a 2-D device array.

Every method is SciPy's, on the host copy of the arrays; the known limits are those of SciPy (exact sparse
arithmetic instead of cuSPARSE's order of summation).

Under the cost ledger (``cupy.cuda.standin_ledger``) every operation on the device is one launch reading its
operands' arrays and writing its result's; one whose result has a data-dependent number of stored entries (a
sparse-sparse operation, zero or duplicate elimination, a conversion from COO, a row or column gather)
synchronises, as cuSPARSE's nnz queries make CuPy do; a SciPy matrix given to a constructor is a host-to-device
copy of its arrays, ``get()`` a device-to-host one.
"""
from __future__ import annotations

import numpy as _np
import scipy.sparse as _sps

import cupy as _cp

_VALUE_CHARS = "?fdFD"
_CLASSES = {}  # SciPy format -> stand-in class


def _check_dtype(dtype) -> None:
    if _np.dtype(dtype).char not in _VALUE_CHARS:
        raise ValueError("Only bool, float32, float64, complex64 and complex128 are supported")


def _int32(a: _np.ndarray, what: str) -> _np.ndarray:
    if a.dtype == _np.int32:
        return a
    if a.size and (a.max() > _np.iinfo(_np.int32).max or a.min() < 0):
        raise ValueError(f"{what} does not fit CuPy 13's int32 sparse indices")
    return a.astype(_np.int32)


def _adopt(sp):
    """A SciPy matrix made CuPy-like in place (int32 indices) and its arrays charged to the device pool."""
    if sp.format in ("csr", "csc"):
        sp.indices = _int32(sp.indices, "the column (CSR) / row (CSC) indices")
        sp.indptr = _int32(sp.indptr, "the index pointer (nnz)")
        arrays = (sp.data, sp.indices, sp.indptr)
    elif sp.format == "coo":
        sp.row, sp.col = _int32(sp.row, "the row indices"), _int32(sp.col, "the column indices")
        arrays = (sp.data, sp.row, sp.col)
    else:
        raise TypeError(f"the CuPy stand-in has no {sp.format} matrix")
    for a in arrays:
        _cp._from_host(a)  # charges the buffer once
    return sp


def _sp_bytes(sp) -> int:
    """Bytes of a SciPy matrix's arrays (what the device matrix holds)."""
    names = ("data", "row", "col") if sp.format == "coo" else ("data", "indices", "indptr")
    return sum(getattr(sp, name).nbytes for name in names)


def _operand_bytes(x) -> int:
    if isinstance(x, spmatrix):
        return _sp_bytes(x._sp)
    if isinstance(x, _cp.ndarray):
        return x.nbytes
    if isinstance(x, (tuple, list)):
        return sum(_operand_bytes(v) for v in x)
    return 0


#: methods whose sparse result has a data-dependent number of stored entries (counted on the host: a sync)
_NNZ_METHODS = frozenset("eliminate_zeros sum_duplicates multiply maximum minimum".split())


def _count(name, operands, result, nnz_sync=False) -> None:
    """The ledger's entry for one sparse operation (see the module docstring)."""
    if _cp._ledger.ACTIVE:
        written = _operand_bytes(result)
        sync = (nnz_sync and isinstance(result, spmatrix)) or name in _NNZ_METHODS
        _cp._ledger.launch(f"sparse.{name}", sum(_operand_bytes(x) for x in operands), written, syncs=int(sync))


def _wrap(x):
    """SciPy / NumPy results as CuPy gives them: device matrices and device arrays."""
    if _sps.issparse(x):
        if x.format not in _CLASSES:
            x = x.tocsr()
        sp = x if isinstance(x, _sps.spmatrix) else _CLASSES[x.format]._scipy_class(x)  # sparse arrays: matrices
        cls = _CLASSES[sp.format]
        obj = cls.__new__(cls)
        obj._sp = _adopt(sp)
        return obj
    if isinstance(x, _np.matrix):
        return _cp._from_host(_np.asarray(x))
    if isinstance(x, (_np.ndarray, _np.generic)):
        return _cp._wrap(x)
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    return x


def _unwrap(x, where: str):
    """Operands for SciPy: device matrices and arrays to their host storage; host data refused."""
    if isinstance(x, spmatrix):
        return x._sp
    if isinstance(x, _cp.ndarray):
        return x._host
    if isinstance(x, _np.ndarray) or _sps.issparse(x):
        raise TypeError(f"Unsupported type {type(x)}: {where} got host data (a NumPy array or a SciPy matrix); "
                        "move it to the device first")
    if type(x) in (list, tuple):
        return type(x)(_unwrap(v, where) for v in x)
    return x


class spmatrix:
    """Base class of the stand-in's sparse matrices."""

    __array_priority__ = 101
    _scipy_class = None
    format = None

    def __init__(self, arg1, shape=None, dtype=None, copy=False):
        if _cp._ledger.ACTIVE and _sps.issparse(arg1):
            _cp._ledger.h2d(_sp_bytes(arg1 if arg1.format in ("csr", "csc", "coo") else arg1.tocsr()))
        sp = self._build(arg1, shape, dtype, copy)
        if dtype is not None:
            _check_dtype(dtype)
            sp = sp.astype(dtype, copy=False)
        _check_dtype(sp.dtype)
        self._sp = _adopt(sp)

    def _build(self, arg1, shape, dtype, copy):
        cls = self._scipy_class
        if isinstance(arg1, spmatrix):
            return cls(arg1._sp, shape=shape, copy=copy or arg1.format == self.format)
        if _sps.issparse(arg1):  # a SciPy matrix: copied to the device (CuPy: cupy.array of each array)
            _check_dtype(dtype if dtype is not None else arg1.dtype)
            return cls(arg1, shape=shape, dtype=dtype, copy=True)
        if isinstance(arg1, tuple) and len(arg1) == 2 and all(isinstance(v, int) for v in arg1):
            return cls(arg1, dtype=dtype if dtype is not None else "d")
        if isinstance(arg1, _cp.ndarray):
            if arg1.ndim > 2:
                raise ValueError("expected dimension <= 2 array or matrix")
            return cls(_np.atleast_2d(arg1._host), shape=shape, dtype=dtype)
        if isinstance(arg1, tuple):
            return self._from_arrays(arg1, shape, dtype, copy)
        raise ValueError(f"Unsupported initializer format ({type(arg1).__module__}.{type(arg1).__name__}; a "
                         "NumPy array must be moved to the device first)")

    def _from_arrays(self, arg1, shape, dtype, copy):
        raise ValueError("Unsupported initializer format")

    # ---------------------------------------------------------------- attributes
    shape = property(lambda self: self._sp.shape)
    dtype = property(lambda self: self._sp.dtype)
    nnz = property(lambda self: self._sp.nnz)
    ndim = 2
    size = property(lambda self: self._sp.nnz)

    @property
    def has_canonical_format(self):
        return bool(self._sp.has_canonical_format)

    @has_canonical_format.setter
    def has_canonical_format(self, value):  # CuPy's flag, settable as in SciPy (True implies sorted indices)
        self._sp.has_canonical_format = bool(value)

    @property
    def has_sorted_indices(self):
        return bool(self._sp.has_sorted_indices)

    def _array(self, name):
        return _cp._from_host(getattr(self._sp, name))

    def _set_array(self, name, value):
        if not isinstance(value, _cp.ndarray):
            raise TypeError(f"{name} must be a device array, got {type(value)}")
        setattr(self._sp, name, value._host)
        _adopt(self._sp)

    # ---------------------------------------------------------------- host transfer
    def get(self, stream=None):
        """A copy of the matrix on the host (SciPy's matrix of the same format)."""
        if _cp._ledger.ACTIVE:
            _cp._ledger.d2h("sparse.get", _sp_bytes(self._sp))
        return self._sp.copy()

    def toarray(self, order=None, out=None):
        result = _cp._from_host(self._sp.toarray(order=order))
        _count("toarray", (self,), result)
        return result

    def todense(self, order=None, out=None):
        return self.toarray(order=order)

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed: use .get() for a SciPy matrix or "
                        ".toarray().get() for a dense NumPy array")

    # ---------------------------------------------------------------- SciPy's methods, on the device
    def __getattr__(self, name):
        if name == "_sp" or name.startswith("__"):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute {name!r}")
        attr = getattr(self._sp, name)
        if not callable(attr):
            return _wrap(attr)
        where = f"cupyx.scipy.sparse.{type(self).__name__}.{name}"

        def method(*args, **kwargs):
            before = self.format
            out = attr(*_unwrap(args, where), **{k: _unwrap(v, where) for k, v in kwargs.items()})
            _adopt(self._sp)  # an in-place method may have replaced the arrays
            result = self if out is self._sp else _wrap(out)
            if out is None or isinstance(result, (spmatrix, _cp.ndarray)):
                _count(name, (self, *args, *kwargs.values()), self if out is None else result,
                       nnz_sync=before == "coo" and name in ("tocsr", "tocsc"))
            return result
        method.__name__ = name
        return method

    def sum(self, axis=None, dtype=None, out=None):
        """SciPy's sum; along an axis CuPy runs a cuSPARSE product with a vector of ones (axis 0: with the
        transposed operand), whose order of summation :func:`_run_dependent` models."""
        where = "cupyx.scipy.sparse.sum"
        total = self._sp.sum(axis=axis, dtype=dtype, out=_unwrap(out, where))
        if axis is not None and dtype is None and out is None:
            along = self._sp if axis in (1, -1) else self._sp.T
            if _run_dependent(along):
                values = _shuffled_product(along, _np.ones(along.shape[1], dtype=along.dtype))
                total = _np.asmatrix(values.reshape(total.shape).astype(total.dtype))
        result = _wrap(total)
        _count("sum", (self,), result)
        return result

    def astype(self, t):
        _check_dtype(t)
        result = _wrap(self._sp.astype(t))
        _count("astype", (self,), result)
        return result

    def copy(self):
        result = _wrap(self._sp.copy())
        _count("copy", (self,), result)
        return result

    def __getitem__(self, key):
        operands = (self, *(key if isinstance(key, tuple) else (key,)))
        if isinstance(key, tuple):
            key = tuple(k._host if isinstance(k, _cp.ndarray) else k for k in key)
        elif isinstance(key, _cp.ndarray):
            key = key._host
        result = _wrap(self._sp[key])
        _count("getitem", operands, result, nnz_sync=True)
        return result

    def __len__(self):
        raise TypeError("sparse matrix length is ambiguous; use getnnz() or shape[0]")

    def __repr__(self):
        return f"<{self.shape[0]}x{self.shape[1]} device sparse matrix of type {self.dtype} with {self.nnz} " \
               f"stored elements in {self.format.upper()} format (CuPy stand-in)>"


#: the longest CSR row (stored entries) whose product with a dense operand the stand-in adds in order: an H100
#: (2026-11-26, bench/probes/sparse_determinism.py) repeated the bits of rows of 50 entries on every call and not
#: those of rows of 1,000 or 25,000 (cuSPARSE splits long rows between threads); the bound between is not known
LONG_ROW = 50


def _run_dependent(sp):
    """Whether cuSPARSE's product of ``sp`` with a dense operand adds in a run-dependent order: a CSC matrix (the
    transposed CSR operand, as cuSPARSE documents) or a CSR one with a row longer than :data:`LONG_ROW`."""
    if sp.format == "csc":
        return True
    return sp.format == "csr" and sp.shape[0] > 0 and int(_np.diff(sp.indptr).max(initial=0)) > LONG_ROW


def _shuffled_product(sp, B):
    """sparse @ dense as cuSPARSE runs it where :func:`_run_dependent` holds (an H100 gave two updates of the same
    inputs 313 entries of 1,200 apart, 2026-11-26): the stored entries added in a new random order on every
    call."""
    if B.ndim not in (1, 2) or B.shape[0] != sp.shape[1]:
        return sp @ B   # SciPy's error
    coo = sp.tocoo()
    order = _np.random.default_rng().permutation(coo.nnz)
    rows, cols, vals = coo.row[order], coo.col[order], coo.data[order]
    B2 = B.reshape(B.shape[0], -1)
    out = _np.zeros((sp.shape[0], B2.shape[1]), dtype=_np.result_type(sp.dtype, B.dtype))
    _np.add.at(out, rows, vals[:, None] * B2[cols])
    return out if B.ndim == 2 else out[:, 0]


def _binary(name):
    def op(self, other):
        if not isinstance(other, (spmatrix, _cp.ndarray, bool, int, float, complex, _np.generic)):
            if isinstance(other, _np.ndarray) or _sps.issparse(other):
                _unwrap(other, f"cupyx.scipy.sparse {name}")  # raises
            return NotImplemented
        if name == "__matmul__" and isinstance(other, _cp.ndarray) and _run_dependent(self._sp):
            out = _shuffled_product(self._sp, _unwrap(other, f"cupyx.scipy.sparse {name}"))
        elif name == "__rmatmul__" and isinstance(other, _cp.ndarray) and other.ndim in (1, 2):
            # dense @ sparse: CuPy multiplies the transpose, (A^T @ B^T)^T, a transposed operand (run-dependent)
            B = _unwrap(other, f"cupyx.scipy.sparse {name}")
            out = _shuffled_product(self._sp.T.tocsc(), B.T).T if B.shape[-1] == self._sp.shape[0] else B @ self._sp
        else:
            out = getattr(self._sp, name)(_unwrap(other, f"cupyx.scipy.sparse {name}"))
        if out is NotImplemented:
            return NotImplemented
        result = _wrap(out)
        _count(name.strip("_"), (self, other), result, nnz_sync=isinstance(other, spmatrix) or name in (
            "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"))
        return result
    op.__name__ = name
    return op


for _name in ("add radd sub rsub mul rmul matmul rmatmul truediv pow eq ne lt le gt ge").split():
    setattr(spmatrix, f"__{_name}__", _binary(f"__{_name}__"))
def _unary(name, func):
    def op(self):
        result = _wrap(func(self._sp))
        _count(name, (self,), result)
        return result
    op.__name__ = f"__{name}__"
    return op


spmatrix.__neg__ = _unary("neg", lambda sp: -sp)
spmatrix.__abs__ = _unary("abs", abs)
spmatrix.__hash__ = None


class _compressed(spmatrix):
    data = property(lambda self: self._array("data"), lambda self, v: self._set_array("data", v))
    indices = property(lambda self: self._array("indices"), lambda self, v: self._set_array("indices", v))
    indptr = property(lambda self: self._array("indptr"), lambda self, v: self._set_array("indptr", v))

    def _from_arrays(self, arg1, shape, dtype, copy):
        if len(arg1) == 3:
            data, indices, indptr = arg1
            if not all(isinstance(a, _cp.ndarray) and a.ndim == 1 for a in arg1):
                raise ValueError("data, indices, and indptr should be 1-D (device arrays: a NumPy array must be "
                                 "moved to the device first)")
            if len(data) != len(indices):
                raise ValueError("indices and data should have the same size")
            return self._scipy_class((data._host, indices._host, indptr._host), shape=shape, copy=copy)
        if len(arg1) == 2:
            return coo_matrix(arg1, shape=shape, dtype=dtype, copy=copy)._sp.asformat(self.format)
        raise ValueError("Unsupported initializer format")


class csr_matrix(_compressed):
    """Compressed Sparse Row matrix on the device."""
    format = "csr"
    _scipy_class = _sps.csr_matrix


class csc_matrix(_compressed):
    """Compressed Sparse Column matrix on the device."""
    format = "csc"
    _scipy_class = _sps.csc_matrix


class coo_matrix(spmatrix):
    """COOrdinate format matrix on the device."""
    format = "coo"
    _scipy_class = _sps.coo_matrix
    data = property(lambda self: self._array("data"), lambda self, v: self._set_array("data", v))
    row = property(lambda self: self._array("row"), lambda self, v: self._set_array("row", v))
    col = property(lambda self: self._array("col"), lambda self, v: self._set_array("col", v))

    def _from_arrays(self, arg1, shape, dtype, copy):
        if len(arg1) == 2 and isinstance(arg1[1], tuple) and len(arg1[1]) == 2:
            data, (row, col) = arg1
            if not all(isinstance(a, _cp.ndarray) and a.ndim == 1 for a in (data, row, col)):
                raise ValueError("row, column, and data arrays must be 1-D device arrays (a NumPy array must be "
                                 "moved to the device first)")
            return _sps.coo_matrix((data._host, (row._host, col._host)), shape=shape, copy=copy)
        raise ValueError("Unsupported initializer format")


_CLASSES.update(csr=csr_matrix, csc=csc_matrix, coo=coo_matrix)


def issparse(x) -> bool:
    """True for the stand-in's (device) sparse matrices; a SciPy matrix is not one."""
    return isinstance(x, spmatrix)


isspmatrix = issparse


def isspmatrix_csr(x) -> bool:
    return isinstance(x, csr_matrix)


def isspmatrix_csc(x) -> bool:
    return isinstance(x, csc_matrix)


def isspmatrix_coo(x) -> bool:
    return isinstance(x, coo_matrix)


def hstack(blocks, format=None, dtype=None):
    return _wrap(_sps.hstack([_unwrap(b, "cupyx.scipy.sparse.hstack") for b in blocks], format=format, dtype=dtype))


def vstack(blocks, format=None, dtype=None):
    return _wrap(_sps.vstack([_unwrap(b, "cupyx.scipy.sparse.vstack") for b in blocks], format=format, dtype=dtype))
