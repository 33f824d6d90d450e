"""A strict NumPy-backed stand-in for CuPy, for running kkmgpu's GPU path on a machine without a GPU.

Device arrays are their own class (:class:`ndarray`, wrapping a NumPy array in ``_host``), so that the host /
device mix-ups that fail on CuPy fail here too, with CuPy's errors:

* no implicit conversion: ``numpy.asarray(d)`` raises TypeError (``__array__`` raises; no
  ``__array_interface__``, ``__array_struct__`` or buffer);
* a NumPy array in an operator, a ufunc, a ``cupy.*`` function (except the host-to-device ones: ``asarray``,
  ``array``, ``asanyarray``), a kernel launch or ``cupyx`` raises TypeError; as in CuPy, NumPy arrays and lists
  are accepted as *indices* and as values of an advanced-index assignment, and a non-scalar NumPy value of a
  basic-slice assignment raises ValueError;
* reductions and element access give 0-d device arrays, not scalars;
* ``asarray`` of host data copies it (a device array never aliases host memory); ``.get()`` copies back;
* every device buffer is accounted for in :mod:`cupy.cuda.memory` (device size, pool, OutOfMemoryError);
* sorts are stable and take ``kind`` None or "stable" only; ``astype`` refuses ``casting`` / ``subok``;
* ``cupy.linalg.eigh`` of a stack of matrices larger than 32 x 32 raises cuSOLVER's error (syevjBatched);
* float32 matrix products under the TF32 compute type round their operands to TF32;
* NumPy functions CuPy 13 lacks are refused (:data:`_DENIED`), so that code written against the stand-in runs
  on every CuPy kkmgpu supports.

Everything else is NumPy's own function behind a wrapper that checks arguments and wraps results. The
stand-in's limits: no asynchrony (every stream is done), NumPy 2 type promotion (CuPy 14's; CuPy 13 promotes
Python and NumPy scalars by value), NumPy's numerics instead of cuBLAS / cuSOLVER / cuSPARSE, one device.
"""
from __future__ import annotations

import sys
import types

import numpy as _np
from numpy import (bool_, byte, complex64, complex128, complexfloating, double, dtype, e, euler_gamma,  # noqa: F401
                   finfo, float16, float32, float64, floating, generic, half, iinfo, inexact, inf, int8, int16,
                   int32, int64, int_, intc, integer, intp, longlong, nan, newaxis, number, pi, short,
                   signedinteger, single, ubyte, uint, uint8, uint16, uint32, uint64, uintc, uintp, ulonglong,
                   unsignedinteger, ushort)

from . import _core, _ledger, cuda  # noqa: F401
from ._core import _routines_linalg as _linalg_core
from .cuda import RawKernel, RawModule  # noqa: F401
from .cuda.memory import get_default_memory_pool, get_default_pinned_memory_pool  # noqa: F401

__version__ = "13.6.0"  # the oldest CuPy kkmgpu supports: the deny-list follows it

_POOL = cuda.memory.get_default_memory_pool()
#: dtypes a CuPy array can have (CuPy's _dtype.all_type_chars)
_TYPE_CHARS = "?bhilqBHILQefdFD"
_IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy "
             "array explicitly.")

#: NumPy functions and classes that CuPy 13 does not have (NumPy 2 aliases CuPy added in 14 included): the
#: stand-in refuses them, so that kkmgpu cannot come to rely on them
_DENIED = frozenset("""
    acos acosh asin asinh atan atan2 atanh bitwise_invert bitwise_left_shift bitwise_right_shift concat
    permute_dims pow matrix_transpose vecdot matvec vecmat unique_all unique_counts unique_inverse unique_values
    astype isdtype cumulative_sum cumulative_prod unstack bitwise_count
    apply_over_axes asmatrix bmat busday_count busday_offset is_busday datetime_as_string datetime_data
    einsum_path fromregex genfromtxt loadtxt savetxt frompyfunc nditer nested_iters setbufsize getbufsize seterr
    geterr seterrcall geterrcall errstate info show_runtime get_include memmap recarray record chararray matrix
    ndenumerate trapezoid
""".split())


# ------------------------------------------------------------------------------------------- wrapping

def _unsupported(x, where: str) -> TypeError:
    if isinstance(x, _np.ndarray):
        return TypeError(f"Unsupported type {type(x)}: {where} got a NumPy (host) array; CuPy does not move it to "
                         "the device implicitly (cupy.asarray it first)")
    return TypeError(f"Unsupported type {type(x)} in {where}")


def _refuse_host(args, where: str) -> None:
    """Raise TypeError if a NumPy array (or a SciPy sparse matrix) is among ``args`` (lists, tuples and dicts
    searched)."""
    for x in args:
        if isinstance(x, _np.ndarray):
            raise _unsupported(x, where)
        if type(x) in (list, tuple):
            _refuse_host(x, where)
        elif isinstance(x, dict):
            _refuse_host(tuple(x.values()), where)
        elif type(x).__module__.startswith("scipy.sparse"):
            raise TypeError(f"Unsupported type {type(x)}: {where} got a SciPy (host) sparse matrix")


def _owner(a: _np.ndarray) -> _np.ndarray:
    """The NumPy array owning ``a``'s memory (``a`` itself, or its base through views)."""
    while True:
        base = a.base
        if isinstance(base, _np.ndarray):
            a = base
        elif base is not None and isinstance(getattr(base, "base", None), _np.ndarray):  # as_strided's wrapper
            a = base.base
        else:
            return a


def _from_host(a: _np.ndarray) -> "ndarray":
    """A device array around the NumPy array ``a`` (a result computed here, or a copy of host data); a buffer
    not seen before is charged to the memory pool."""
    if isinstance(a, _np.generic):
        a = _np.asarray(a)
    elif type(a) is not _np.ndarray:
        a = a.view(_np.ndarray)
    if a.dtype.char not in _TYPE_CHARS:
        raise ValueError(f"Unsupported dtype {a.dtype}")
    root = _owner(a)
    if not _POOL.owns(root):
        _POOL.take(root)
    obj = ndarray.__new__(ndarray)
    obj._host = a
    return obj


def _wrap(x, inputs=()):
    """Results of a NumPy call as CuPy returns them: arrays and NumPy scalars as device arrays (0-d for scalars),
    tuples as plain tuples; an input's own array as that input."""
    if isinstance(x, _np.ndarray):
        for d in inputs:
            if d._host is x:
                return d
        return _from_host(x)
    if isinstance(x, _np.generic):
        return _from_host(_np.asarray(x))
    if isinstance(x, tuple):
        return tuple(_wrap(v, inputs) for v in x)
    if isinstance(x, list):
        return [_wrap(v, inputs) for v in x]
    return x


def _unwrap(x):
    if isinstance(x, ndarray):
        return x._host
    if type(x) in (list, tuple):
        return type(x)(_unwrap(v) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _devices_in(args) -> list:
    found = []
    for x in args:
        if isinstance(x, ndarray):
            found.append(x)
        elif type(x) in (list, tuple):
            found.extend(_devices_in(x))
    return found


# ------------------------------------------------------------------------------------------- cost ledger

def _arrays_in(x) -> list:
    """The device arrays in a result: an array, or tuples and lists of them."""
    if isinstance(x, ndarray):
        return [x]
    if isinstance(x, (tuple, list)):
        return [a for v in x for a in _arrays_in(v)]
    return []


def _nbytes(arrays) -> int:
    """Bytes of the distinct device arrays among ``arrays`` (one passed twice is read once)."""
    seen, total = set(), 0
    for a in arrays:
        h = a._host
        key = (h.__array_interface__["data"][0], h.shape, h.strides, h.dtype.char)
        if key not in seen:
            seen.add(key)
            total += h.nbytes
    return total


def _mode(dtype) -> str:
    """The compute mode of a matrix product of ``dtype`` operands (the cost ledger's flops key)."""
    char = _np.dtype(dtype).char
    if char in "dD":
        return "fp64"
    if char in "fF":
        tf32 = _linalg_core.get_compute_type(_np.float32) == _linalg_core.COMPUTE_TYPE_TF32
        return "tf32" if tf32 else "fp32"
    return "fp16" if char == "e" else "int"


#: functions that read what they gather (and their indices), not all of their first operand
_GATHER_FUNCTIONS = frozenset("take take_along_axis choose compress extract".split())


def _cost_of_call(name, inputs, out, result) -> None:
    """The ledger's entry for a NumPy function run as a CuPy one: one launch (or :data:`_ledger.ROUTINES`'s)
    when it gives a new buffer or writes ``out``; nothing for a view, metadata or a host value."""
    short = name.rsplit(".", 1)[-1]
    owners = {id(_owner(d._host)) for d in inputs}
    new = [r for r in _arrays_in(result) if id(_owner(r._host)) not in owners]
    if not new and not isinstance(out, ndarray):
        return
    written = _nbytes(new) + (out.nbytes if isinstance(out, ndarray) else 0)
    operands = [d for d in inputs if d is not out]
    read = written + _nbytes(operands[1:]) if short in _GATHER_FUNCTIONS else _nbytes(operands)
    launches, syncs = _ledger.ROUTINES.get(short, (1, 0))
    _ledger.launch(short, read, written, launches=launches, syncs=syncs)


def _count_index(key) -> None:
    """Host arrays and lists in an index are copied to the device (as CuPy does)."""
    for k in key if isinstance(key, tuple) else (key,):
        if isinstance(k, (_np.ndarray, list)):
            _ledger.h2d(_np.asarray(k).nbytes)


def _has_mask(key) -> bool:
    for k in key if isinstance(key, tuple) else (key,):
        dt = getattr(k, "dtype", None)
        if (dt is not None and dt == _np.bool_ and getattr(k, "ndim", 0) > 0) or \
                (isinstance(k, list) and k and all(isinstance(v, (bool, _np.bool_)) for v in k)):
            return True
    return False


def _count_indexing(kind, a, key, moved_bytes, value=None) -> None:
    """A gather (``a[key]``) or scatter (``a[key] = value``) by arrays: ``moved_bytes`` of selected elements."""
    _count_index(key)
    index_bytes = _nbytes(_devices_in(key if isinstance(key, tuple) else (key,)))
    value_bytes = _nbytes(_devices_in((value,)))
    if _has_mask(key):
        launches, syncs = _ledger.ROUTINES[f"mask_{kind}"]
        read = a.nbytes + index_bytes + value_bytes
    else:
        launches, syncs = 1, 0
        read = (moved_bytes if kind == "getitem" else value_bytes) + index_bytes
    _ledger.launch(kind, read, moved_bytes, launches=launches, syncs=syncs)


def _count_gemm(name, a, b, result, flops) -> None:
    """A matrix product: reads both operands, writes the product, ``flops`` in the operands' compute mode."""
    _ledger.launch(name, a.nbytes + b.nbytes, result.nbytes, flops=flops, mode=_mode(_np.result_type(a, b)))


#: functions whose first argument is a shape, dtypes, or scalars, not an array (CuPy reads sequences there)
_SEQUENCE_FIRST = frozenset("""
    indices tri eye identity fromfunction frombuffer fromiter fromstring broadcast_shapes result_type can_cast
    promote_types min_scalar_type common_type dtype isscalar ndim shape size iterable binary_repr base_repr
    concatenate stack vstack hstack dstack column_stack block select lexsort ravel_multi_index piecewise ix_
    meshgrid broadcast_arrays einsum array asarray asanyarray
""".split())


def _refuse_python_sequence(args, name: str) -> None:
    """CuPy's policy: no Python objects as array input except in the constructors (cupy/cupy#9109:
    ``cupy.min([1, 2, 3])`` raises). A list or tuple holding anything but device arrays as a function's array
    argument (its first one) is refused."""
    if args and type(args[0]) in (list, tuple) and name.rsplit(".", 1)[-1] not in _SEQUENCE_FIRST and \
            not all(isinstance(x, ndarray) for x in _flatten(args[0])):
        raise TypeError(f"Unsupported type {type(args[0])}: {name} takes a device array, not a Python "
                        f"{type(args[0]).__name__} (CuPy takes Python sequences in its constructors only: "
                        "cupy.asarray it first)")


def _device_function(func, name: str, this=None):
    """NumPy's ``func`` as a CuPy function: no host arrays in, device arrays out (``this``: the device array whose
    bound method ``func`` is)."""
    def call(*args, **kwargs):
        _refuse_host(args, name)
        if not name.startswith("cupy.ndarray."):
            _refuse_python_sequence(args, name)
        _refuse_host(tuple(kwargs.values()), name)
        out = func(*_unwrap(args), **_unwrap(kwargs))
        inputs = ([] if this is None else [this]) + _devices_in((*args, *kwargs.values()))
        result = _wrap(out, inputs)
        if _ledger.ACTIVE:
            _cost_of_call(name, inputs, kwargs.get("out"), result)
        return result
    call.__name__ = call.__qualname__ = name.rsplit(".", 1)[-1]
    call.__module__ = name.rsplit(".", 1)[0] if "." in name else "cupy"
    call.__doc__ = f"NumPy's {func.__name__} on device arrays (CuPy stand-in)."
    call.__wrapped__ = func
    return call


def _check_elementwise(args, where: str) -> None:
    """Operands of a ufunc / operator: device arrays and Python or NumPy scalars only (CuPy's _preprocess_args)."""
    for x in args:
        if x is None or isinstance(x, (ndarray, bool, int, float, complex, _np.generic)):
            continue
        raise _unsupported(x, where)


class ufunc:
    """A NumPy ufunc as a CuPy ufunc: operands and ``out`` must be device arrays or scalars."""

    def __init__(self, np_ufunc):
        self._ufunc = np_ufunc
        self.__name__ = np_ufunc.__name__
        self.nin, self.nout, self.nargs = np_ufunc.nin, np_ufunc.nout, np_ufunc.nargs
        self.__doc__ = f"NumPy's {np_ufunc.__name__} on device arrays (CuPy stand-in)."

    def _call(self, method, args, kwargs):
        out = kwargs.get("out")
        outs = out if isinstance(out, tuple) else (out,)
        _check_elementwise((*args, *outs), f"cupy.{self.__name__}" + ("" if method == "__call__" else f".{method}"))
        if "where" in kwargs:
            _check_elementwise((kwargs["where"],), f"cupy.{self.__name__}")
        result = getattr(self._ufunc, method)(*_unwrap(args), **_unwrap(kwargs))
        result = _wrap(result, _devices_in((*args, *outs)))
        if _ledger.ACTIVE:
            _ledger.launch(self.__name__ if method == "__call__" else f"{self.__name__}.{method}",
                           _nbytes(_devices_in(args)), _nbytes(_arrays_in(result)))
        return result

    def __call__(self, *args, **kwargs):
        return self._call("__call__", args, kwargs)

    def reduce(self, *args, **kwargs):
        return self._call("reduce", args, kwargs)

    def accumulate(self, *args, **kwargs):
        return self._call("accumulate", args, kwargs)

    def reduceat(self, *args, **kwargs):
        return self._call("reduceat", args, kwargs)

    def outer(self, *args, **kwargs):
        return self._call("outer", args, kwargs)

    def at(self, a, indices, b=None):
        if not isinstance(a, ndarray):
            raise _unsupported(a, f"cupy.{self.__name__}.at")
        _check_elementwise((b,), f"cupy.{self.__name__}.at")
        if _ledger.ACTIVE:
            _count_index(indices)
            moved = a._host[_index(indices)].nbytes
            _ledger.launch(f"{self.__name__}.at", 2 * moved + _nbytes(_devices_in((indices, b))), moved)
        if b is None:
            self._ufunc.at(a._host, _index(indices))
        else:
            self._ufunc.at(a._host, _index(indices), _unwrap(b))

    def __repr__(self):
        return f"<ufunc '{self.__name__}'>"


# ------------------------------------------------------------------------------------------- the array

class _Flags:
    def __init__(self, c_contiguous, f_contiguous, owndata):
        self.c_contiguous, self.f_contiguous, self.owndata = c_contiguous, f_contiguous, owndata

    def __getitem__(self, key):
        return {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous, "OWNDATA": self.owndata}[key]

    def __repr__(self):
        return f"  C_CONTIGUOUS : {self.c_contiguous}\n  F_CONTIGUOUS : {self.f_contiguous}\n  OWNDATA : {self.owndata}"


class _MemoryPointer:
    """What ``ndarray.data`` is in CuPy: a pointer into device memory (here the host buffer's address)."""

    def __init__(self, a: _np.ndarray):
        self.ptr = a.ctypes.data if a.size else 0
        self.device_id = 0
        self.mem = types.SimpleNamespace(size=_owner(a).nbytes, ptr=_owner(a).ctypes.data)

    @property
    def device(self):
        return cuda.Device(self.device_id)

    def __int__(self):
        return self.ptr


def _is_advanced(key) -> bool:
    """True when an index selects by arrays (CuPy turns lists, NumPy arrays and booleans into device arrays)."""
    for k in key if isinstance(key, tuple) else (key,):
        if isinstance(k, (ndarray, _np.ndarray, list, bool, _np.bool_)):
            return True
    return False


def _index(key):
    """An index for the host array: device arrays unwrapped; NumPy arrays and lists accepted (CuPy copies them to
    the device); anything else as it is."""
    if isinstance(key, tuple):
        return tuple(_unwrap(k) for k in key)
    return _unwrap(key)


def _check_sort_kind(kind, where):
    if kind is not None and kind != "stable":
        raise ValueError(f"{where}: kind={kind!r}; CuPy sorts are stable and take only kind=None or 'stable'")


_DENIED_ATTRS = frozenset("ctypes flat itemset resize setflags getfield setfield byteswap newbyteorder mT "
                          "to_device device_ptr".split())


class ndarray:
    """A device array: CuPy's ndarray, backed by a NumPy array that never leaves the stand-in."""

    __slots__ = ("_host", "__weakref__")
    __array_priority__ = 100

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        if memptr is not None or strides is not None:
            raise NotImplementedError("the CuPy stand-in does not build arrays on external memory (memptr/strides)")
        dt = _np.dtype(dtype)
        _POOL.check(int(_np.prod(shape, dtype=_np.int64)) * dt.itemsize)
        built = _from_host(_np.empty(shape, dtype=dt, order=order))
        self._host = built._host

    # ------------------------------------------------------------- no implicit host conversion
    def __array__(self, *args, **kwargs):
        raise TypeError(_IMPLICIT)

    def __array_ufunc__(self, ufunc_, method, *inputs, **kwargs):
        out = kwargs.get("out", ())
        for x in (*inputs, *(out if isinstance(out, tuple) else (out,))):
            if not (x is None or isinstance(x, (ndarray, _np.ndarray, bool, int, float, complex, _np.generic))):
                return NotImplemented
        try:
            cp_ufunc = globals()[ufunc_.__name__] if ufunc_.__name__ in globals() else __getattr__(ufunc_.__name__)
        except AttributeError:
            return NotImplemented
        if not isinstance(cp_ufunc, ufunc):
            return NotImplemented
        return getattr(cp_ufunc, method)(*inputs, **kwargs)

    def __array_function__(self, func, types_, args, kwargs):
        for t in types_:
            if not issubclass(t, (ndarray, _np.ndarray)):
                return NotImplemented
        namespace = sys.modules[__name__]
        try:
            for part in func.__module__.split(".")[1:]:
                namespace = getattr(namespace, part)
            cupy_func = getattr(namespace, func.__name__)
        except AttributeError:
            return NotImplemented
        return cupy_func(*args, **kwargs)

    @property
    def __cuda_array_interface__(self):
        a = self._host
        return {"shape": a.shape, "typestr": a.dtype.str, "descr": a.dtype.descr, "version": 3, "stream": 1,
                "strides": None if a.flags.c_contiguous else a.strides, "data": (self.data.ptr, False)}

    # ------------------------------------------------------------- host transfer
    def get(self, stream=None, order="C", out=None, blocking=True):
        """A copy on the host (a NumPy array), or the copy written into ``out``."""
        if _ledger.ACTIVE:
            _ledger.d2h("get", self.nbytes)
        if out is not None:
            if not isinstance(out, _np.ndarray):
                raise TypeError("Only numpy.ndarray can be obtained from cupy.ndarray")
            if out.dtype != self.dtype:
                raise TypeError(f"{out.dtype} array cannot be obtained from {self.dtype} array")
            if out.shape != self.shape:
                raise ValueError(f"Shape mismatch. Expected shape: {self.shape}, actual shape: {out.shape}")
            out[...] = self._host
            return out
        order = order.upper()
        if order == "A":
            order = "F" if self._host.flags.f_contiguous and not self._host.flags.c_contiguous else "C"
        return _np.array(self._host, order=order, copy=True)

    def set(self, arr, stream=None):
        """Copy the host array ``arr`` into this array."""
        if not isinstance(arr, _np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if arr.dtype != self.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if arr.shape != self.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if _ledger.ACTIVE:
            _ledger.h2d(arr.nbytes)
        self._host[...] = arr

    # ------------------------------------------------------------- attributes
    @property
    def shape(self):
        return self._host.shape

    @shape.setter
    def shape(self, value):
        self._host.shape = value

    dtype = property(lambda self: self._host.dtype)
    ndim = property(lambda self: self._host.ndim)
    size = property(lambda self: self._host.size)
    nbytes = property(lambda self: self._host.nbytes)
    itemsize = property(lambda self: self._host.itemsize)
    strides = property(lambda self: self._host.strides)
    T = property(lambda self: self if self._host.ndim < 2 else _from_host(self._host.T))
    real = property(lambda self: _wrap(self._host.real))
    imag = property(lambda self: _wrap(self._host.imag))
    data = property(lambda self: _MemoryPointer(self._host))
    device = property(lambda self: cuda.Device(0))

    @property
    def flags(self):
        f = self._host.flags
        return _Flags(f.c_contiguous, f.f_contiguous, _owner(self._host) is self._host)

    @property
    def base(self):
        root = _owner(self._host)
        return None if root is self._host else _from_host(root)

    def __getattr__(self, name):  # NumPy's other methods (sum, reshape, ravel, ...) as device methods
        if name == "_host" or name.startswith("__") or name in _DENIED_ATTRS:
            raise AttributeError(f"'cupy.ndarray' object has no attribute {name!r}")
        attr = getattr(self._host, name)
        if callable(attr):
            method = _device_function(attr, f"cupy.ndarray.{name}", self)

            def bound(*args, **kwargs):
                out = method(*args, **kwargs)
                return self if isinstance(out, ndarray) and out._host is self._host else out
            bound.__name__ = name
            return bound
        if isinstance(attr, (_np.ndarray, _np.generic)):
            return _wrap(attr)
        if attr is None or isinstance(attr, (bool, int, float, complex, str, tuple, _np.dtype)):
            return attr
        raise AttributeError(f"'cupy.ndarray' object has no attribute {name!r} (NumPy's is a host-side "
                             f"{type(attr).__name__})")

    # ------------------------------------------------------------- methods CuPy does differently
    def max(self, *args, **kwargs):
        return self._flushed_reduction("max", args, kwargs)

    def min(self, *args, **kwargs):
        return self._flushed_reduction("min", args, kwargs)

    def _flushed_reduction(self, name, args, kwargs):
        """CuPy builds its kernels with -ftz=true (cupy/cupy#8382): a float32 max / min reads subnormals as 0 (an
        H100 found max |K * 1e-45| = 0). Modelled for these two methods only."""
        host = self._host
        if host.dtype == _np.float32 and host.size:
            subnormal = (host != 0) & (_np.abs(host) < _np.finfo(_np.float32).tiny)
            if subnormal.any():
                return _from_host(_np.where(subnormal, _np.float32(0), host)).__getattr__(name)(*args, **kwargs)
        return self.__getattr__(name)(*args, **kwargs)

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        if casting is not None:
            raise TypeError("casting is not supported yet")
        if subok is not None:
            raise TypeError("subok is not supported yet")
        dt = _np.dtype(dtype)
        if not copy and dt == self.dtype and (order in ("K", "A", None) or
                                               (order == "C" and self._host.flags.c_contiguous) or
                                               (order == "F" and self._host.flags.f_contiguous)):
            return self
        _POOL.check(self.size * dt.itemsize)
        if _ledger.ACTIVE:
            _ledger.launch("astype", self.nbytes, self.size * dt.itemsize)
        return _from_host(self._host.astype(dt, order=order or "K", copy=True))

    def copy(self, order="C"):
        _POOL.check(self.nbytes)
        if _ledger.ACTIVE:
            _ledger.launch("copy", self.nbytes, self.nbytes)
        return _from_host(self._host.copy(order=order))

    def fill(self, value):
        if isinstance(value, _np.ndarray):
            if value.shape != ():
                raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
            value = value.item()
        _check_elementwise((value,), "cupy.ndarray.fill")
        if _ledger.ACTIVE:
            _ledger.launch("fill", _nbytes(_devices_in((value,))), self.nbytes)
        self._host.fill(_unwrap(value))

    def sort(self, axis=-1, kind=None):
        _check_sort_kind(kind, "cupy.ndarray.sort")
        if _ledger.ACTIVE:
            _ledger.launch("sort", self.nbytes, self.nbytes)
        self._host.sort(axis=axis, kind="stable")

    def argsort(self, axis=-1, kind=None):
        _check_sort_kind(kind, "cupy.ndarray.argsort")
        return argsort(self, axis=axis)

    def tolist(self):
        if _ledger.ACTIVE:
            _ledger.d2h("tolist", self.nbytes)
        return self._host.tolist()

    def dot(self, b, out=None):
        return dot(self, b, out=out)

    def item(self):
        if self.size != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        if _ledger.ACTIVE:
            _ledger.d2h("item", self.itemsize)
        return self._host.item()

    # ------------------------------------------------------------- indexing
    def __getitem__(self, key):
        result = _wrap(self._host[_index(key)], (self,))
        if _ledger.ACTIVE and _is_advanced(key):  # basic indexing gives a view (a 0-d one for a scalar index)
            _count_indexing("getitem", self, key, result.nbytes)
        return result

    def __setitem__(self, key, value):
        advanced = _is_advanced(key)
        if isinstance(value, _np.ndarray):
            if not advanced and value.shape != ():
                raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        elif isinstance(value, (list, tuple)):
            if not advanced:
                raise TypeError(f"Unsupported type {type(value)}")
            _refuse_host(value, "cupy.ndarray.__setitem__")
        elif not (isinstance(value, (ndarray, bool, int, float, complex, _np.generic))):
            raise TypeError(f"Unsupported type {type(value)}")
        if _ledger.ACTIVE:
            self._count_setitem(key, value, advanced)
        self._host[_index(key)] = _unwrap(value)

    def _count_setitem(self, key, value, advanced):
        if isinstance(value, (_np.ndarray, list, tuple)):
            _ledger.h2d(_np.asarray(value).nbytes)  # CuPy copies a host value to the device first
        target = self._host[_index(key)]
        if advanced:
            _count_indexing("setitem", self, key, target.nbytes, value)
        else:
            _ledger.launch("setitem", _nbytes(_devices_in((value,))), target.nbytes)

    # ------------------------------------------------------------- conversions
    def __len__(self):
        return len(self._host)

    def __iter__(self):
        if self._host.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(len(self._host)))

    def __bool__(self):
        if _ledger.ACTIVE:
            _ledger.d2h("bool", self.itemsize)
        return bool(self._host)

    def __int__(self):
        if _ledger.ACTIVE:
            _ledger.d2h("int", self.itemsize)
        return int(self._host)

    def __float__(self):
        if _ledger.ACTIVE:
            _ledger.d2h("float", self.itemsize)
        return float(self._host)

    def __complex__(self):
        if _ledger.ACTIVE:
            _ledger.d2h("complex", self.itemsize)
        return complex(self._host)

    # no __index__: CuPy has none (range(d), a_list[d] and operator.index(d) raise TypeError; a device scalar
    # would have to be copied to the host on every use, cupy/cupy#9109)

    def __repr__(self):
        if _ledger.ACTIVE:
            _ledger.d2h("repr", self.nbytes)
        return repr(self._host)

    def __str__(self):
        if _ledger.ACTIVE:
            _ledger.d2h("str", self.nbytes)
        return str(self._host)

    def __format__(self, spec):
        if _ledger.ACTIVE:
            _ledger.d2h("format", self.nbytes)
        return format(self._host, spec)

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    def __reduce__(self):  # pickled through the host, as CuPy does
        if _ledger.ACTIVE:
            _ledger.d2h("pickle", self.nbytes)
        return _rebuild, (self._host.copy(),)

    __hash__ = None


def _rebuild(host):
    return array(host)


def _operator(name: str):
    reflected = name.startswith("__r") and name not in ("__rshift__",)
    inplace = name.startswith("__i") and name not in ("__invert__",)

    def op(self, *others):
        for other in others:
            if isinstance(other, _np.ndarray) or type(other) in (list, tuple):
                raise _unsupported(other, f"cupy.ndarray.{name}")
            if not isinstance(other, (ndarray, bool, int, float, complex, _np.generic)):
                return NotImplemented  # a cupyx sparse matrix, a Dask array, ...: its reflected operator decides
        args = _unwrap(others)
        if "matmul" in name:
            a, b = (args[0], self._host) if reflected else (self._host, args[0])
            a0, b0 = a, b
            a, b = _linalg_core.gemm_operands(a, b)
            product = a @ b
            if _ledger.ACTIVE:
                _count_gemm("matmul", a0, b0, product, 2 * _np.size(product) * (a0.shape[-1] if a0.ndim else 1))
            if inplace:
                self._host[...] = product
                return self
            return _wrap(_np.asarray(product))  # 1-D @ 1-D is a NumPy scalar: a 0-d device array
        out = getattr(self._host, name)(*args)
        if out is NotImplemented:
            return NotImplemented
        result = self if inplace or out is self._host else _wrap(out)
        if _ledger.ACTIVE:
            _ledger.launch(name.strip("_"), _nbytes([self, *_devices_in(others)]), _nbytes(_arrays_in(result)))
        return result
    op.__name__ = name
    return op


for _name in ("add sub mul truediv floordiv mod pow matmul and or xor lshift rshift divmod "
              "radd rsub rmul rtruediv rfloordiv rmod rpow rmatmul rand ror rxor rlshift rrshift rdivmod "
              "iadd isub imul itruediv ifloordiv imod ipow imatmul iand ior ixor ilshift irshift "
              "lt le gt ge eq ne neg pos abs invert").split():
    setattr(ndarray, f"__{_name}__", _operator(f"__{_name}__"))


# ------------------------------------------------------------------------------------------- namespace

def _array_of(obj, dtype, copy, order, ndmin):
    """Host data or device arrays as a new (or, without copy, the same) device array (CuPy's core.array)."""
    if isinstance(obj, ndarray):
        out = obj.astype(dtype if dtype is not None else obj.dtype, order=order, copy=copy)
        if ndmin > out.ndim:
            out = _from_host(out._host.reshape((1,) * (ndmin - out.ndim) + out.shape))
        return out
    if type(obj) in (list, tuple) and obj:
        devices = _devices_in(obj)
        if devices:
            flat = _flatten(obj)
            if all(isinstance(x, ndarray) for x in flat) and len({x.shape for x in flat}) == 1:
                # CuPy concatenates a (nested) sequence of same-shaped device arrays on the device
                host = _np.array(_unwrap(obj), dtype=dtype, order=order if order != "K" else "C", ndmin=ndmin)
                if _ledger.ACTIVE:
                    _ledger.launch("stack", _nbytes(flat), host.nbytes)
                return _from_host(host)
            raise TypeError(_IMPLICIT)  # CuPy hands the mixed sequence to numpy.array, which calls __array__
    if type(obj).__module__.startswith(("scipy.sparse", "cupyx")):
        raise ValueError(f"Unsupported dtype object (a {type(obj).__name__} is not an array)")
    host = _np.array(obj, dtype=dtype, order=order if order in ("C", "F") else "K", ndmin=ndmin, copy=True)
    _POOL.check(host.nbytes)
    if _ledger.ACTIVE:
        _ledger.h2d(host.nbytes)
    return _from_host(host)


def _flatten(seq) -> list:
    flat = []
    for x in seq:
        flat.extend(_flatten(x) if type(x) in (list, tuple) else [x])
    return flat


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, *, blocking=False):
    """Host data (NumPy arrays, scalars, lists) copied to the device, or a device array (copied unless
    ``copy=False`` and nothing changes)."""
    return _array_of(obj, dtype, copy, order, ndmin)


def asarray(a, dtype=None, order=None, *, blocking=False):
    """``a`` on the device: a device array itself when nothing changes, host data copied."""
    return _array_of(a, dtype, False, order or "K", 0)


asanyarray = asarray


def ascontiguousarray(a, dtype=None):
    """CuPy's takes device arrays only (its parameter is typed ``_ndarray_base``)."""
    if not isinstance(a, ndarray):
        raise TypeError(f"Argument 'a' has incorrect type (expected cupy._core.core._ndarray_base, got "
                        f"{type(a).__name__})")
    dt = a.dtype if dtype is None else _np.dtype(dtype)
    if dt == a.dtype and a._host.flags.c_contiguous:
        return a if a.ndim else _from_host(a._host.reshape(1))
    if _ledger.ACTIVE:
        _ledger.launch("ascontiguousarray", a.nbytes, a.size * dt.itemsize)
    return _from_host(_np.ascontiguousarray(a._host, dtype=dt))


def asfortranarray(a, dtype=None):
    if not isinstance(a, ndarray):
        raise TypeError(f"Argument 'a' has incorrect type (expected cupy._core.core._ndarray_base, got "
                        f"{type(a).__name__})")
    dt = a.dtype if dtype is None else _np.dtype(dtype)
    if dt == a.dtype and a._host.flags.f_contiguous:
        return a
    if _ledger.ACTIVE:
        _ledger.launch("asfortranarray", a.nbytes, a.size * dt.itemsize)
    return _from_host(_np.asfortranarray(a._host, dtype=dt))


def asnumpy(a, stream=None, order="C", out=None, *, blocking=True):
    """A device array copied to the host; anything else through numpy.asarray (as CuPy does)."""
    if isinstance(a, ndarray):
        return a.get(stream=stream, order=order, out=out, blocking=blocking)
    if hasattr(a, "get") and type(a).__module__.startswith("cupyx"):
        return a.get()
    if out is not None:
        out[...] = a
        return out
    return _np.asarray(a, order=order)


def get_array_module(*args):
    """``cupy`` if any argument is a device array or a cupyx sparse matrix, else ``numpy``."""
    for a in args:
        if isinstance(a, ndarray) or type(a).__module__.startswith("cupyx"):
            return sys.modules[__name__]
    return _np


def is_available() -> bool:
    return True


def _allocate(shape, dtype, fill=None) -> None:
    """Refuse an allocation the device cannot hold before the host makes it; ``fill``: the ledger's name of the
    kernel that fills it (None: ``empty``, no kernel)."""
    nbytes = int(_np.prod(shape, dtype=_np.int64)) * _np.dtype(dtype).itemsize
    _POOL.check(nbytes)
    if fill is not None and _ledger.ACTIVE:
        _ledger.launch(fill, 0, nbytes)


def zeros(shape, dtype=float, order="C"):
    _allocate(shape, dtype, "zeros")
    return _from_host(_np.zeros(shape, dtype=dtype, order=order))


def empty(shape, dtype=float, order="C"):
    _allocate(shape, dtype)
    return _from_host(_np.empty(shape, dtype=dtype, order=order))


def ones(shape, dtype=float, order="C"):
    _allocate(shape, dtype, "ones")
    return _from_host(_np.ones(shape, dtype=dtype, order=order))


def full(shape, fill_value, dtype=None, order="C"):
    if isinstance(fill_value, _np.ndarray) and fill_value.shape != ():
        raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
    _check_elementwise((fill_value,) if not isinstance(fill_value, _np.ndarray) else (), "cupy.full")
    value = _unwrap(fill_value)
    dt = _np.dtype(dtype) if dtype is not None else _np.asarray(value).dtype
    _allocate(shape, dt, "full")
    return _from_host(_np.full(shape, value, dtype=dt, order=order))


def _like(np_func, name):
    def create(a, *args, dtype=None, order="K", subok=None, shape=None, **kwargs):
        if not isinstance(a, ndarray):
            raise _unsupported(a, f"cupy.{name}")
        _check_elementwise(args, f"cupy.{name}")
        _allocate(a.shape if shape is None else shape, a.dtype if dtype is None else dtype,
                  None if name == "empty_like" else name)
        return _from_host(np_func(a._host, *_unwrap(args), dtype=dtype, order=order, shape=shape))
    create.__name__ = name
    return create


zeros_like = _like(_np.zeros_like, "zeros_like")
empty_like = _like(_np.empty_like, "empty_like")
ones_like = _like(_np.ones_like, "ones_like")
full_like = _like(_np.full_like, "full_like")


def arange(start, stop=None, step=1, dtype=None):
    for x in (start, stop, step):
        if isinstance(x, (ndarray, _np.ndarray)):
            raise TypeError(f"cupy.arange takes Python or NumPy scalars, not a {type(x).__module__}.ndarray "
                            "(CuPy cannot read a device scalar as a bound: convert it with int() first)")
    out = _from_host(_np.arange(start, stop, step, dtype=dtype) if stop is not None else
                     _np.arange(start, step=step, dtype=dtype))
    if _ledger.ACTIVE:
        _ledger.launch("arange", 0, out.nbytes)
    return out


def copyto(dst, src, casting="same_kind", where=None):
    if not isinstance(dst, ndarray):
        raise _unsupported(dst, "cupy.copyto (dst)")
    if isinstance(src, _np.ndarray):
        if src.size != 1:
            raise ValueError("non-scalar numpy.ndarray cannot be used for copyto")
        src = src.reshape(())[()]
    _check_elementwise((src, where), "cupy.copyto")
    if _ledger.ACTIVE:
        _ledger.launch("copyto", _nbytes(_devices_in((src, where))), dst.nbytes)
    _np.copyto(dst._host, _unwrap(src), casting=casting, where=True if where is None else _unwrap(where))


def _joining(np_func, name):
    def join(arrays, *args, **kwargs):
        for a in arrays:
            if not isinstance(a, ndarray):
                raise TypeError(f"Only cupy arrays can be {'concatenated' if name == 'concatenate' else 'stacked'} "
                                f"(cupy.{name} got a {type(a).__module__}.{type(a).__name__})")
        result = _wrap(np_func(_unwrap(list(arrays)), *args, **_unwrap(kwargs)))
        if _ledger.ACTIVE:
            _ledger.launch(name, _nbytes(list(arrays)), result.nbytes)
        return result
    join.__name__ = name
    return join


concatenate = _joining(_np.concatenate, "concatenate")
stack = _joining(_np.stack, "stack")
vstack = _joining(_np.vstack, "vstack")
hstack = _joining(_np.hstack, "hstack")
dstack = _joining(_np.dstack, "dstack")
column_stack = _joining(_np.column_stack, "column_stack")


def sort(a, axis=-1, kind=None):
    _check_sort_kind(kind, "cupy.sort")
    if not isinstance(a, ndarray):
        raise _unsupported(a, "cupy.sort")
    if _ledger.ACTIVE:
        _ledger.launch("sort", a.nbytes, a.nbytes)
    return _from_host(_np.sort(a._host, axis=axis, kind="stable"))


def argsort(a, axis=-1, kind=None):
    _check_sort_kind(kind, "cupy.argsort")
    if not isinstance(a, ndarray):
        raise _unsupported(a, "cupy.argsort")
    out = _from_host(_np.argsort(a._host, axis=axis, kind="stable"))
    if _ledger.ACTIVE:
        _ledger.launch("argsort", a.nbytes, out.nbytes)
    return out


def _gemm(np_func, name):
    """matmul / dot / tensordot / inner: float32 operands rounded to TF32 under the TF32 compute type."""
    def product(a, b, *args, **kwargs):
        for x in (a, b):
            if not isinstance(x, ndarray):
                raise _unsupported(x, f"cupy.{name}")
        _refuse_host(args, f"cupy.{name}")
        _refuse_host(tuple(kwargs.values()), f"cupy.{name}")
        ha, hb = _linalg_core.gemm_operands(a._host, b._host)
        result = _wrap(np_func(ha, hb, *_unwrap(args), **_unwrap(kwargs)), _devices_in(tuple(kwargs.values())))
        if _ledger.ACTIVE:
            out = result._host
            if name == "tensordot":  # a.size * b.size = contracted^2 * out.size
                flops = 2 * (a.size * b.size * max(out.size, 1)) ** 0.5
            else:
                flops = 2 * out.size * (a.shape[-1] if a.ndim else 1)
            _count_gemm(name, a._host, b._host, out, flops)
        return result
    product.__name__ = name
    return product


matmul = _gemm(_np.matmul, "matmul")
dot = _gemm(_np.dot, "dot")
tensordot = _gemm(_np.tensordot, "tensordot")
inner = _gemm(_np.inner, "inner")


def einsum(*operands, **kwargs):
    subscripts, arrays = (operands[0], operands[1:]) if isinstance(operands[0], str) else (None, operands)
    for x in arrays:
        if not isinstance(x, ndarray):
            raise _unsupported(x, "cupy.einsum")
    hosts = _linalg_core.gemm_operands(*(x._host for x in arrays))
    args = (subscripts, *hosts) if subscripts is not None else hosts
    result = _wrap(_np.einsum(*args, **_unwrap(kwargs)))
    if _ledger.ACTIVE:
        _count_einsum(subscripts, arrays, result)
    return result


def _count_einsum(subscripts, arrays, result) -> None:
    """A contraction of two or more operands: 2 times the product of every index's size, in the operands'
    compute mode; one operand (a sum, a transpose): a plain launch."""
    read = _nbytes(arrays)
    written = _nbytes(_arrays_in(result))
    if len(arrays) < 2 or not isinstance(subscripts, str) or "." in subscripts:
        if len(arrays) >= 2:
            _ledger.note("einsum without explicit subscripts: flops not counted")
        _ledger.launch("einsum", read, written)
        return
    sizes = {}
    for term, x in zip(subscripts.split("->")[0].replace(" ", "").split(","), arrays):
        sizes.update(zip(term, x.shape))
    flops = 2 * float(_np.prod([float(v) for v in sizes.values()]))
    _ledger.launch("einsum", read, written, flops=flops, mode=_mode(_np.result_type(*(x.dtype for x in arrays))))


def _device_scalar(np_func, name):
    """Functions whose CuPy result is a 0-d device array where NumPy returns a Python scalar."""
    wrapped = _device_function(np_func, f"cupy.{name}")

    def call(*args, **kwargs):
        out = wrapped(*args, **kwargs)
        return _from_host(_np.asarray(out)) if isinstance(out, (bool, int, float)) else out
    call.__name__ = name
    return call


count_nonzero = _device_scalar(_np.count_nonzero, "count_nonzero")
allclose = _device_scalar(_np.allclose, "allclose")
array_equal = _device_scalar(_np.array_equal, "array_equal")
array_equiv = _device_scalar(_np.array_equiv, "array_equiv")


def __getattr__(name):
    """Every other NumPy function or ufunc as a device function, CuPy 13's gaps refused."""
    if name.startswith("__") or name in _DENIED:
        raise AttributeError(f"module 'cupy' has no attribute {name!r}" +
                             ("" if name.startswith("__") else " (CuPy 13 does not have it; the stand-in refuses it)"))
    try:
        attr = getattr(_np, name)
    except AttributeError:
        raise AttributeError(f"module 'cupy' has no attribute {name!r}") from None
    if isinstance(attr, _np.ufunc):
        value = ufunc(attr)
    elif isinstance(attr, type):
        if not (issubclass(attr, (_np.generic, Exception, Warning)) or attr in (_np.dtype, _np.finfo, _np.iinfo)):
            raise AttributeError(f"module 'cupy' has no attribute {name!r} (NumPy's {name} class is host-only)")
        value = attr
    elif isinstance(attr, types.ModuleType):
        raise AttributeError(f"module 'cupy' has no attribute {name!r} (the stand-in does not provide "
                             f"cupy.{name})")
    elif callable(attr):
        value = _device_function(attr, f"cupy.{name}")
    else:
        value = attr
    globals()[name] = value
    return value


from . import linalg  # noqa: E402
