"""cupy.cuda.memory of the stand-in: the device's size, the bytes of live device arrays and CuPy's memory pool.

The model (what kkmgpu's memory guard, tiling and ``engine="auto"`` read):

* The device has ``total`` bytes: ``KKMGPU_STANDIN_DEVICE_MEMORY`` (bytes) when set, else 16 GiB (fixed, so that
  runs do not depend on the host's free memory), changed at run time with :func:`set_device_memory` or the
  :func:`cupy.cuda.standin_device_memory` context manager.
* Every device array owns a buffer (views share their base's); a buffer takes its size rounded up to 512 bytes
  (CuPy's allocation unit) from the default :class:`MemoryPool` while it lives.
* A freed buffer stays cached in the pool (``free_bytes``) until reused or ``free_all_blocks()``, as in CuPy:
  ``runtime.memGetInfo()`` then reports ``free = total - pool.total_bytes()`` (used and cached), which is why
  kkmgpu adds ``pool.free_bytes()`` to it.
* An allocation that would take ``used_bytes`` past ``total`` (or past the pool's limit) raises
  :class:`OutOfMemoryError` with CuPy's wording (CuPy first frees the cached blocks and retries; so does this).
"""
from __future__ import annotations

import contextlib
import os
import threading
import weakref

import numpy as _np

ENV_DEVICE_MEMORY = "KKMGPU_STANDIN_DEVICE_MEMORY"
DEFAULT_DEVICE_MEMORY = 16 * 2**30
#: CuPy rounds every allocation up to this many bytes
ALLOCATION_UNIT = 512


class OutOfMemoryError(MemoryError):
    """Out-of-memory error (CuPy's signature and wording).

    Parameters
    ----------
    size : int
        Size of memory about to be allocated.
    total : int
        Size of memory successfully allocated so far.
    limit : int
        Allocation limit (0: none set).
    """

    def __init__(self, size, total, limit=0):
        if limit == 0:
            msg = f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes)."
        else:
            msg = (f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes, "
                   f"limit set to: {limit:,} bytes).")
        super().__init__(msg)


def _device_memory_from_env() -> int:
    raw = os.environ.get(ENV_DEVICE_MEMORY, "").strip()
    if not raw:
        return DEFAULT_DEVICE_MEMORY
    try:
        value = int(float(raw))
    except ValueError:
        raise ValueError(f"{ENV_DEVICE_MEMORY}={raw!r} is not a number of bytes") from None
    if value <= 0:
        raise ValueError(f"{ENV_DEVICE_MEMORY}={raw!r} must be a positive number of bytes")
    return value


def _round(nbytes: int) -> int:
    return -(-int(nbytes) // ALLOCATION_UNIT) * ALLOCATION_UNIT


class MemoryPool:
    """CuPy's default device memory pool, reduced to its accounting (``used_bytes``, ``free_bytes``,
    ``total_bytes``, ``free_all_blocks``, ``set_limit``, ``get_limit``, ``n_free_blocks``)."""

    def __init__(self):
        self._lock = threading.RLock()  # finalizers may run on any thread, and inside an allocation
        self._device_total = _device_memory_from_env()
        self._used = 0
        self._cached = 0
        self._limit = 0
        self._peak = 0
        self._owners = {}  # id(buffer) -> bytes taken

    # ---------------------------------------------------------------- CuPy's API
    def used_bytes(self) -> int:
        return self._used

    def free_bytes(self) -> int:
        return self._cached

    def total_bytes(self) -> int:
        return self._used + self._cached

    def n_free_blocks(self) -> int:
        return 1 if self._cached else 0

    def free_all_blocks(self, stream=None) -> None:
        with self._lock:
            self._cached = 0

    def set_limit(self, size=None, fraction=None) -> None:
        if size is not None and fraction is not None:
            raise ValueError("size and fraction cannot be specified at the same time")
        if fraction is not None:
            if not 0 <= fraction <= 1:
                raise ValueError(f"memory limit fraction out of range: {fraction}")
            size = int(fraction * self._device_total)
        self._limit = 0 if size is None else int(size)

    def get_limit(self) -> int:
        return self._limit

    # ------------------------------------------------------------- the stand-in's
    def standin_peak_bytes(self, reset: bool = False) -> int:
        """The most ``used_bytes`` reached since the last reset (not a CuPy API); ``reset`` starts over from now."""
        peak = self._peak
        if reset:
            self._peak = self._used
        return peak

    def device_total(self) -> int:
        return self._device_total

    def device_free(self) -> int:
        return max(0, self._device_total - self.total_bytes())

    def set_device_total(self, nbytes: int) -> int:
        """Set the device's size in bytes; returns the previous size."""
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise ValueError(f"device memory size {nbytes} must be a positive number of bytes")
        with self._lock:
            previous, self._device_total = self._device_total, nbytes
            self._cached = min(self._cached, max(0, nbytes - self._used))
        return previous

    def _cap(self) -> int:
        return min(self._device_total, self._limit) if self._limit else self._device_total

    def check(self, nbytes: int) -> None:
        """Raise OutOfMemoryError unless ``nbytes`` more could be allocated now (before a host allocation)."""
        size = _round(nbytes)
        if self._used + size > self._cap():
            raise OutOfMemoryError(size, self._used, self._limit)

    def take(self, buffer: _np.ndarray) -> None:
        """Account for a new device buffer (a NumPy array owning its data) until it is garbage collected."""
        key = id(buffer)
        with self._lock:
            if key in self._owners:
                return
            size = _round(buffer.nbytes)
            if self._used + size > self._cap():
                self._cached = 0  # CuPy frees the cached blocks and retries before it gives up
                raise OutOfMemoryError(size, self._used, self._limit)
            self._cached = max(0, self._cached - size)  # reuse cached blocks first
            self._used += size
            self._peak = max(self._peak, self._used)
            self._owners[key] = size
        weakref.finalize(buffer, self._give_back, key)

    def owns(self, buffer: _np.ndarray) -> bool:
        return id(buffer) in self._owners

    def _give_back(self, key: int) -> None:
        with self._lock:
            size = self._owners.pop(key, 0)
            self._used -= size
            self._cached += size


_POOL = MemoryPool()


def get_default_memory_pool() -> MemoryPool:
    return _POOL


class PinnedMemoryPool:
    """CuPy's pinned (host) memory pool: nothing to account for on a CPU."""

    def used_bytes(self):
        return 0

    def free_bytes(self):
        return 0

    def total_bytes(self):
        return 0

    def n_free_blocks(self):
        return 0

    def free_all_blocks(self, stream=None):
        pass

    def set_limit(self, size=None, fraction=None):
        pass


_PINNED_POOL = PinnedMemoryPool()


def get_default_pinned_memory_pool() -> PinnedMemoryPool:
    return _PINNED_POOL


def set_device_memory(nbytes: int) -> int:
    """Set the emulated device's memory size in bytes (not a CuPy API); returns the previous size."""
    return _POOL.set_device_total(nbytes)


@contextlib.contextmanager
def device_memory(nbytes: int):
    """Context manager: the emulated device has ``nbytes`` of memory inside (not a CuPy API).

    The pool's cached blocks are dropped on entry, so that ``memGetInfo`` reports ``nbytes`` minus the live
    device arrays, whatever ran before.
    """
    previous = _POOL.set_device_total(nbytes)
    _POOL.free_all_blocks()
    try:
        yield
    finally:
        _POOL.set_device_total(previous)
