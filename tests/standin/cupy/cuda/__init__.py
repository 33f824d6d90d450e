"""cupy.cuda of the stand-in: one device (0), streams and events that are already done, kernels compiled for the
CPU by the CUDA-on-CPU harness (tests/cudacpu), and the device-memory accounting of :mod:`cupy.cuda.memory`.

Not CuPy API, for tests: :func:`standin_device_memory` (context manager) and :func:`standin_set_device_memory`
set the emulated device's size in bytes (also ``KKMGPU_STANDIN_DEVICE_MEMORY`` at import); :func:`standin_ledger`
(context manager) counts what the operations inside would cost on a GPU (launches, synchronisations, transfers,
device bytes, matrix-product flops: ``cupy._ledger``).
"""
from __future__ import annotations

import os
import sys
import time

import numpy as _np

from .. import _ledger
from . import cusolver, driver, memory, runtime  # noqa: F401  (submodules as attributes, as in CuPy)
from .memory import (MemoryPool, OutOfMemoryError, PinnedMemoryPool,  # noqa: F401
                     get_default_memory_pool, get_default_pinned_memory_pool)
from .runtime import CUDARuntimeError  # noqa: F401

standin_device_memory = memory.device_memory
standin_set_device_memory = memory.set_device_memory
standin_ledger = _ledger.ledger

#: launch limits of the emulated device (an H100, compute capability 9.0)
MAX_BLOCK_DIMS = (1024, 1024, 64)
MAX_THREADS_PER_BLOCK = 1024
MAX_GRID_DIMS = (2**31 - 1, 65535, 65535)
DEFAULT_DYNAMIC_SHARED = 48 * 1024
MAX_DYNAMIC_SHARED_OPTIN = 227 * 1024


def is_available() -> bool:
    return True


def get_device_id() -> int:
    return runtime.getDevice()


class Device:
    """A CUDA device of the stand-in (only ordinal 0 exists); a context manager that makes it current."""

    def __init__(self, device=None):
        self.id = runtime.getDevice() if device is None else runtime._check(device)
        self._previous = []

    def __enter__(self):
        self._previous.append(runtime.getDevice())
        runtime.setDevice(self.id)
        return self

    def __exit__(self, *exc):
        runtime.setDevice(self._previous.pop())

    def use(self):
        runtime.setDevice(self.id)

    def synchronize(self):
        if _ledger.ACTIVE:
            _ledger.d2h("synchronize", 0)

    @property
    def compute_capability(self) -> str:
        return "90"

    @property
    def mem_info(self) -> tuple[int, int]:
        return runtime.memGetInfo()

    @property
    def attributes(self) -> dict:
        props = runtime.getDeviceProperties(self.id)
        return {"MaxThreadsPerBlock": props["maxThreadsPerBlock"], "MultiProcessorCount": props["multiProcessorCount"],
                "MaxSharedMemoryPerBlockOptin": props["sharedMemPerBlockOptin"], "WarpSize": props["warpSize"]}

    def __int__(self):
        return self.id

    def __index__(self):
        return self.id

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return f"<CUDA Device {self.id}>"


class Event:
    """A CUDA event: everything is synchronous here, so an event is done when recorded."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.disable_timing = disable_timing
        self._time = None

    def record(self, stream=None):
        self._time = time.perf_counter()

    def synchronize(self):
        if _ledger.ACTIVE:
            _ledger.d2h("synchronize", 0)

    @property
    def done(self) -> bool:
        return True


def get_elapsed_time(start_event: Event, end_event: Event) -> float:
    """Milliseconds between two recorded events."""
    if start_event._time is None or end_event._time is None:
        raise CUDARuntimeError(600, "cudaErrorNotReady: device not ready (an event was never recorded)")
    return (end_event._time - start_event._time) * 1e3


class Stream:
    """A CUDA stream: work runs at once on the calling thread, so every stream is always done."""

    null = None  # set below

    def __init__(self, null=False, non_blocking=False, ptr=0):
        self.ptr = 0 if null else id(self)

    def __enter__(self):
        _stream_stack.append(self)
        return self

    def __exit__(self, *exc):
        _stream_stack.pop()

    def use(self):
        _stream_stack[0] = self
        return self

    def synchronize(self):
        if _ledger.ACTIVE:
            _ledger.d2h("synchronize", 0)

    def record(self, event=None):
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event):
        pass

    @property
    def done(self) -> bool:
        return True


Stream.null = Stream(null=True)
_stream_stack = [Stream.null]


def get_current_stream() -> Stream:
    return _stream_stack[-1]


# ------------------------------------------------------------------------------------------------ kernels

def _harness():
    """The CUDA-on-CPU harness (tests/cudacpu), imported on the first kernel build: a stand-in that launches
    nothing needs neither it nor g++."""
    tests_dir = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    if tests_dir not in sys.path:
        sys.path.insert(0, tests_dir)
    import cudacpu

    return cudacpu


def _dims(value, what) -> tuple[int, int, int]:
    dims = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, (int, _np.integer)) for d in dims):
        raise TypeError(f"{what}={value!r} must be an int or a tuple of 1 to 3 ints")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


def _invalid_launch(reason: str):
    return driver.CUDADriverError(driver.CUDA_ERROR_INVALID_VALUE,
                                  f"CUDA_ERROR_INVALID_VALUE: invalid argument ({reason})")


class _Kernel:
    """A kernel of a :class:`RawModule` (what ``get_function`` returns): ``kernel(grid, block, args,
    shared_mem=0)``."""

    def __init__(self, function, name):
        self._function = function
        self.name = name

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return self._function.max_dynamic_shared_size_bytes

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value):
        value = int(value)
        if not 0 <= value <= MAX_DYNAMIC_SHARED_OPTIN:
            raise _invalid_launch(f"max_dynamic_shared_size_bytes={value} is above the device's opt-in limit "
                                  f"{MAX_DYNAMIC_SHARED_OPTIN}")
        self._function.max_dynamic_shared_size_bytes = value

    def __call__(self, grid, block, args, *, shared_mem=0, stream=None, enable_cooperative_groups=False):
        import cupy

        grid, block = _dims(grid, "grid"), _dims(block, "block")
        if any(b < 1 or b > m for b, m in zip(block, MAX_BLOCK_DIMS)) or block[0] * block[1] * block[2] > \
                MAX_THREADS_PER_BLOCK:
            raise _invalid_launch(f"block {block}: each dimension within {MAX_BLOCK_DIMS} and at most "
                                  f"{MAX_THREADS_PER_BLOCK} threads")
        if any(g < 1 or g > m for g, m in zip(grid, MAX_GRID_DIMS)):
            raise _invalid_launch(f"grid {grid}: each dimension from 1 to {MAX_GRID_DIMS}")
        if not 0 <= int(shared_mem) <= self.max_dynamic_shared_size_bytes:
            raise _invalid_launch(f"shared_mem={shared_mem} above max_dynamic_shared_size_bytes="
                                  f"{self.max_dynamic_shared_size_bytes}")
        if not isinstance(args, (tuple, list)):
            raise TypeError(f"args must be a tuple of kernel arguments, got {type(args).__name__}")
        for i, a in enumerate(args):
            if isinstance(a, cupy.ndarray) or (isinstance(a, _np.generic) and a.dtype.kind in "biufc"):
                continue
            if isinstance(a, (bool, int, float, complex)):
                # CuPy passes these as int64 / float64 / bool whatever the parameter's type: a silent mismatch
                raise TypeError(f"{self.name} argument {i}: Python {type(a).__name__} {a!r}; pass a NumPy scalar of "
                                "the parameter's exact type (CuPy would pass it as a 64-bit value)")
            raise TypeError(f"{self.name} argument {i}: Unsupported type {type(a)}")
        self._function(grid, block, tuple(args), shared_mem=int(shared_mem))
        if _ledger.ACTIVE:
            _kernel_cost(self.name, getattr(self._function, "params", None), args)


def _kernel_cost(name, params, args) -> None:
    """One launch of a raw kernel: the arrays behind ``const`` pointers read, the others read and written (each
    distinct buffer once), the arguments of ``_ledger.ROW_GATHERS`` read at their rows only."""
    import cupy

    base = name.split("<", 1)[0]
    gathers = _ledger.ROW_GATHERS.get(base, {})
    names = [p.name for p in params] if params else []
    read = written = 0
    seen = set()
    for i, a in enumerate(args):
        if not isinstance(a, cupy.ndarray):
            continue
        h = a._host
        key = (h.__array_interface__["data"][0], h.nbytes)
        if key in seen:
            continue
        seen.add(key)
        param = params[i] if params and i < len(params) else None
        nbytes = h.nbytes
        if param is not None and param.name in gathers:
            rows_name = gathers[param.name]
            if rows_name in names and h.ndim >= 1 and h.shape[0]:
                nbytes = args[names.index(rows_name)].size * (h.nbytes // h.shape[0])
            else:
                _ledger.note(f"{base}: argument {param.name} counted in full (no argument {rows_name} to gather by)")
        if param is None:
            _ledger.note(f"{base}: parameter list unknown, every array counted as read and written")
        read += nbytes
        if param is None or not param.const:
            written += nbytes
    _ledger.launch(base, read, written)


class RawModule:
    """CUDA source compiled for the CPU by the harness on the first ``get_function`` (CuPy compiles lazily too)."""

    def __init__(self, code=None, *, path=None, options=(), backend="nvrtc", translate_cucomplex=False,
                 enable_cooperative_groups=False, name_expressions=None, jitify=False):
        if (code is None) == (path is None):
            raise TypeError("One (and only one) of the two arguments code and path must be given")
        if code is None:
            with open(path) as fh:
                code = fh.read()
        self.code, self.options = code, tuple(options)
        self.name_expressions = tuple(name_expressions) if name_expressions is not None else None
        self._module = None

    def get_function(self, name) -> _Kernel:
        if self._module is None:
            self._module = _harness().Module(self.code, self.name_expressions or (), self.options)
        return _Kernel(self._module.get_function(name), name)


class RawKernel(_Kernel):
    """One ``extern "C"`` kernel of a CUDA source."""

    def __init__(self, code, name, options=(), backend="nvrtc", translate_cucomplex=False, *,
                 enable_cooperative_groups=False, jitify=False):
        self.code, self.name, self.options = code, name, tuple(options)
        self._kernel = None

    @property
    def _function(self):
        if self._kernel is None:
            self._kernel = RawModule(code=self.code, options=self.options).get_function(self.name)
        return self._kernel._function
