"""cupyx of the CuPy stand-in: the scatter operations, pinned-memory helpers, and ``cupyx.scipy`` (sparse
matrices and ``eigsh``) as subpackages."""
from __future__ import annotations

import numpy as _np

import cupy as _cp

#: dtypes CuPy's scatter kernels take (atomicAdd / atomicMax / atomicMin; int64 has none)
_SCATTER_TYPES = {
    "add": (_np.int32, _np.float16, _np.float32, _np.float64, _np.uint32, _np.uint64),
    "max": (_np.int32, _np.float32, _np.float64, _np.uint32, _np.uint64),
    "min": (_np.int32, _np.float32, _np.float64, _np.uint32, _np.uint64),
}
_SCATTER_NAMES = {"add": "int32, float16, float32, float64, uint32, uint64,",
                  "max": "int32, float32, float64, uint32, uint64", "min": "int32, float32, float64, uint32, uint64"}


def _scatter(op: str, a, slices, value):
    where = f"cupyx.scatter_{op}"
    if not isinstance(a, _cp.ndarray):
        raise _cp._unsupported(a, where)
    if _cp._is_advanced(slices):
        # CuPy copies the value to the device (core.array) when it indexes by arrays, then casts it to a.dtype
        if a.dtype.type not in _SCATTER_TYPES[op]:
            raise TypeError(f"scatter_{op} only supports {_SCATTER_NAMES[op]} as data type")
        value = value if isinstance(value, _cp.ndarray) else _cp.asarray(value, dtype=a.dtype)
    else:
        _cp._check_elementwise((value,), where)  # a basic slice: an in-place ufunc, device operands only
    ufunc = {"add": _np.add, "max": _np.maximum, "min": _np.minimum}[op]
    if _cp._ledger.ACTIVE:
        moved = a._host[_cp._index(slices)].nbytes
        _cp._count_index(slices)
        _cp._ledger.launch(f"scatter_{op}", moved + _cp._nbytes(_cp._devices_in((slices, value))), moved)
    ufunc.at(a._host, _cp._index(slices), _cp._unwrap(value).astype(a.dtype, copy=False)
             if isinstance(value, _cp.ndarray) else value)


def scatter_add(a, slices, value):
    """``a[slices] += value`` with repeated indices accumulated (an atomicAdd per element)."""
    _scatter("add", a, slices, value)


def scatter_max(a, slices, value):
    _scatter("max", a, slices, value)


def scatter_min(a, slices, value):
    _scatter("min", a, slices, value)


def empty_pinned(shape, dtype=float, order="C"):
    """A host (NumPy) array; pinned memory is an ordinary allocation here."""
    return _np.empty(shape, dtype=dtype, order=order)


def zeros_pinned(shape, dtype=float, order="C"):
    return _np.zeros(shape, dtype=dtype, order=order)


def empty_like_pinned(a, dtype=None, order="K", subok=None, shape=None):
    return _np.empty_like(a, dtype=dtype, order=order, shape=shape)
