"""Device resolution and array movement: the one module of kkmgpu that imports CuPy.

Everything else is written once against the array namespace ``xp`` that a
:class:`Backend` hands out (``numpy`` on the CPU, ``cupy`` on a GPU) and calls
the fused operations through ``backend.ops``, whose CPU twin is numba code
(:mod:`kkmgpu.kernels.kernel_kmeans_cpu`) and whose GPU twin is CuPy code
(:mod:`kkmgpu.kernels.kernel_kmeans_cuda`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
import re
import sys
import time
from dataclasses import dataclass

import numpy as np

from kkmgpu import _warn
from kkmgpu.backend.cupy_loader import cupy_linalg_routines, import_cupy, import_cupyx  # noqa: F401  (re-exported for the rest of kkmgpu)

__all__ = [
    "Backend",
    "DeviceUnavailableError",
    "InsufficientMemoryError",
    "check_fits",
    "cuda_unavailable_reason",
    "import_cupy",
    "import_cupyx",
    "is_cupy_array",
    "memory_advice",
    "memory_situation",
    "resolve_device",
    "work_bytes",
]

ENV_DEVICE = "KKMGPU_DEVICE"
#: Fraction of the free memory a dense allocation may take; the rest is headroom
#: for the GEMM workspace, the n x k cluster sums and the allocator.
MEMORY_HEADROOM = 0.9
#: Fraction of the free memory a temporary work buffer (a row tile of kernel values, distances, ...) may take,
#: whatever its fixed cap: what the memory guard leaves free must hold the tiles of the pass that follows.
WORK_FRACTION = 0.25

_DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


class DeviceUnavailableError(RuntimeError):
    """A GPU was asked for (``device="cuda"`` or ``"cuda:N"``) but none is usable."""


class InsufficientMemoryError(MemoryError):
    """A dense array (usually the n x n kernel matrix) does not fit the device's free memory."""


def is_cupy_array(x) -> bool:
    """True if ``x`` is a CuPy array, without importing CuPy."""
    cp = sys.modules.get("cupy")
    return cp is not None and isinstance(x, cp.ndarray)


@functools.lru_cache(maxsize=None)
def cuda_unavailable_reason() -> str | None:
    """Why the GPU path cannot run here, or None when CuPy and a CUDA device are usable."""
    try:
        cp = import_cupy()
    except ImportError as exc:
        return (f"CuPy is not installed ({exc}); install kkmgpu[cuda12] or kkmgpu[cuda13] "
                "to match your CUDA driver")
    except Exception as exc:  # a broken CuPy install raises all sorts of errors
        return f"CuPy failed to import: {type(exc).__name__}: {exc}"
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"the CUDA driver is missing or unusable ({type(exc).__name__}: {exc})"
    if count < 1:
        return "CuPy found no CUDA device"
    return None


def _cuda_device_count() -> int:
    return import_cupy().cuda.runtime.getDeviceCount()


#: a reading of the host's free memory is reused for this many seconds: a small graph fit asked 15-20 times (47
#: microseconds a read of /proc/meminfo, 2-core CPU), and free memory that changed within it is inside the headroom
AVAILABLE_REUSE_SECONDS = 0.01
_last_reading = (-math.inf, None)


def _cpu_available_bytes() -> int | None:
    global _last_reading
    now = time.monotonic()
    when, value = _last_reading
    if now - when < AVAILABLE_REUSE_SECONDS:
        return value
    value = _read_available_bytes()
    _last_reading = (now, value)
    return value


def _read_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


@dataclass(frozen=True)
class Backend:
    """Where arrays live and which twin of the fused operations runs.

    Attributes
    ----------
    kind : {"cpu", "cuda"}
    index : int or None
        CUDA device ordinal (None on the CPU).
    """

    kind: str
    index: int | None = None

    @property
    def name(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"

    @property
    def xp(self):
        return np if self.kind == "cpu" else import_cupy()

    @property
    def ops(self):
        """The module with the fused operations for this backend (CPU twin or GPU twin)."""
        if self.kind == "cpu":
            from kkmgpu.kernels import kernel_kmeans_cpu as ops
        else:
            from kkmgpu.kernels import kernel_kmeans_cuda as ops
        return ops

    def activate(self):
        """Context manager making this backend's device current."""
        if self.kind == "cpu":
            return contextlib.nullcontext()
        return _device_scope(self)

    def asarray(self, a, dtype=None):
        """``a`` as a C-contiguous array on this device (copied only when needed)."""
        if self.kind == "cpu":
            if is_cupy_array(a):
                a = a.get()
            return np.ascontiguousarray(a, dtype=dtype)
        cp = import_cupy()
        with cp.cuda.Device(self.index):
            return cp.ascontiguousarray(cp.asarray(a, dtype=dtype))

    def to_host(self, a):
        """``a`` as a NumPy array."""
        if is_cupy_array(a):
            return a.get()
        return np.asarray(a)

    def synchronize(self) -> None:
        if self.kind == "cuda":
            import_cupy().cuda.Device(self.index).synchronize()

    def timer(self) -> float:
        """``time.perf_counter()`` after the device has finished queued work."""
        self.synchronize()
        return time.perf_counter()

    def available_bytes(self) -> int | None:
        """Free memory on this device (None when it cannot be determined)."""
        if self.kind == "cpu":
            return _cpu_available_bytes()
        cp = import_cupy()
        with cp.cuda.Device(self.index):
            free, _total = cp.cuda.runtime.memGetInfo()
            return int(free) + int(cp.get_default_memory_pool().free_bytes())


def _format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


#: What the call that allocates is doing (dtype, method, engine, precomputed), for check_fits's advice.
_MEMORY_SITUATION = contextvars.ContextVar("kkmgpu_memory_situation", default=None)


@contextlib.contextmanager
def memory_situation(**situation):
    """Within this context, :func:`check_fits` advises from ``situation`` (the keywords of :func:`memory_advice`):
    the public entry points set it once, so the allocations deep inside need not know what the call was."""
    token = _MEMORY_SITUATION.set(situation)
    try:
        yield
    finally:
        _MEMORY_SITUATION.reset(token)


@contextlib.contextmanager
def more_memory_situation(**more):
    """:func:`memory_situation` of the enclosing call with ``more`` (what a method learns once it runs)."""
    token = _MEMORY_SITUATION.set({**(_MEMORY_SITUATION.get() or {}), **more})
    try:
        yield
    finally:
        _MEMORY_SITUATION.reset(token)


@contextlib.contextmanager
def _device_scope(backend):
    """The GPU current, and an allocation that fails although the memory checks passed (a library's workspace
    or a temporary beside the arrays the checks count) raised as :class:`InsufficientMemoryError` with the
    advice for the call, never as CuPy's OutOfMemoryError. Nested scopes translate once (the innermost)."""
    cp = import_cupy()
    with cp.cuda.Device(backend.index):
        try:
            yield
        except cp.cuda.memory.OutOfMemoryError as exc:
            cp.get_default_memory_pool().free_all_blocks()
            available = backend.available_bytes()
            free = "" if available is None else f"; {_format_bytes(available)} free now"
            raise InsufficientMemoryError(
                f"the GPU ran out of memory during the computation ({exc}{free}). "
                + memory_advice(**(_MEMORY_SITUATION.get() or {}))) from exc


def memory_advice(*, dtype=None, method=None, engine=None, precomputed=False, components=None) -> str:
    """The ways to need less memory that apply to a call with this storage ``dtype``, ``method`` and ``engine``
    (a sentence ending in a full stop).

    ``components``: (r, lighter) for method="eigen" once the kernel matrix is built: the r eigenpairs asked for,
    and the largest r that takes the top-r route (None where r does not choose the route). Only then does a
    smaller n_components save memory, so only then is it advised, with that value.
    """
    options = []
    dt = None if dtype is None else np.dtype(dtype)
    if dt == np.float64:
        options.append("dtype='float32' (half the memory)")
    elif dt == np.float32 and method in (None, "exact", "trimmed") and engine != "tiled":
        options.append("dtype='float16' (half the memory of the kernel matrix, about 3 significant digits)")
    if method == "exact" and not precomputed and engine != "tiled":
        options.append("engine='tiled' (no n x n matrix: kernel tiles recomputed from X, O(n d) memory)")
    if method == "eigen" and components is not None and components[1] is not None and components[0] > components[1]:
        options.append(f"n_components <= {components[1]} instead of {components[0]} (the top eigenpairs need one "
                       "n x n working copy at most, the full decomposition three)")
    if method in ("exact", "eigen", "trimmed") and not precomputed:
        options.append("method='cats' (sampled centroids, no n x n matrix: O(n k l) memory)")
    if method in ("exact", "eigen", "trimmed") and not precomputed:
        options.append("method='approx' (centres in the span of m landmarks: O(n m) memory)")
    if method == "cats":
        options.append("a smaller n_samples_per_cluster")
    if method == "approx":
        options.append("a smaller n_landmarks (memory grows as n m)")
    options.append("fewer points, or a device with more free memory")
    return "To need less: " + "; ".join(options) + "."


def check_fits(nbytes: int, backend: Backend, what: str, advice: str | None = None,
               option: str | None = None) -> None:
    """Raise :class:`InsufficientMemoryError` unless ``nbytes`` fit the device with headroom.

    The message ends with ``advice``, by default :func:`memory_advice` for the :func:`memory_situation` the
    allocation happens in, with ``option`` (one more way to need less) listed first.
    """
    available = backend.available_bytes()
    if available is None:
        return
    budget = int(available * MEMORY_HEADROOM)
    if nbytes > budget:
        if advice is None:
            advice = memory_advice(**(_MEMORY_SITUATION.get() or {}))
            if option is not None:
                advice = advice.replace("To need less: ", f"To need less: {option}; ", 1)
        raise InsufficientMemoryError(
            f"{what} needs {_format_bytes(nbytes)} ({nbytes} bytes) but device {backend.name} has "
            f"{_format_bytes(available)} ({available} bytes) available; an allocation may use at most "
            f"{MEMORY_HEADROOM:.0%} of the free memory. {advice}"
        )


def work_bytes(cap: int, backend: Backend, minimum: int = 1) -> int:
    """Bytes a temporary work buffer may take on ``backend`` now: ``cap``, but at most WORK_FRACTION of the free
    memory, and at least ``minimum`` (one row of the tile must fit; the guard of the arrays that stay decides
    whether the run fits at all)."""
    available = backend.available_bytes()
    if available is None:
        return max(int(cap), int(minimum))
    return max(int(minimum), min(int(cap), int(WORK_FRACTION * available)))


def resolve_device(device="auto", arrays=()) -> Backend:
    """Turn a ``device`` argument into a :class:`Backend`.

    ``"auto"`` takes the GPU when CuPy and a device are usable (the device of a CuPy input
    first), else the CPU. ``"cuda"`` / ``"cuda:N"`` raise :class:`DeviceUnavailableError`
    with the reason when no GPU is usable. The environment variable ``KKMGPU_DEVICE=cpu``
    forces the CPU; any other value of it replaces ``"auto"``. An explicit ``"cpu"`` never reads
    the variable; otherwise a value of it that is not a device is a ValueError.
    """
    if device is None:
        device = "auto"
    if not isinstance(device, str) or not _DEVICE_PATTERN.match(device.strip().lower()):
        raise ValueError(
            f"device={device!r} is not valid; use 'auto', 'cpu', 'cuda' or 'cuda:N' (N a device ordinal).")
    device = device.strip().lower()
    if device == "cpu":
        return Backend("cpu")

    raw = os.environ.get(ENV_DEVICE, "")
    env = raw.strip().lower()
    if env:
        if not _DEVICE_PATTERN.match(env):
            raise ValueError(
                f"the environment variable {ENV_DEVICE}={raw!r} is not valid; set it to 'auto', 'cpu', 'cuda' "
                f"or 'cuda:N' (N a device ordinal), or unset it (it is read when device={device!r}; "
                "device='cpu' ignores it).")
        if env == "cpu":
            if device.startswith("cuda"):
                _warn.warn(f"device={device!r} ignored: {ENV_DEVICE}=cpu forces the CPU.",
                           UserWarning)
            return Backend("cpu")
        if device == "auto":
            device = env

    if device == "cpu":
        return Backend("cpu")

    if device == "auto":
        if cuda_unavailable_reason() is not None:
            return Backend("cpu")
        for a in arrays:
            if is_cupy_array(a):
                return Backend("cuda", int(a.device.id))
        return Backend("cuda", int(import_cupy().cuda.runtime.getDevice()))

    reason = cuda_unavailable_reason()
    if reason is not None:
        raise DeviceUnavailableError(
            f"device={device!r} was requested but no GPU is usable: {reason}. "
            "Use device='cpu' (or 'auto' to fall back to the CPU).")
    count = _cuda_device_count()
    if device == "cuda":
        for a in arrays:
            if is_cupy_array(a):
                return Backend("cuda", int(a.device.id))
        return Backend("cuda", int(import_cupy().cuda.runtime.getDevice()))
    index = int(device.split(":")[1])
    if index >= count:
        raise DeviceUnavailableError(
            f"device={device!r} was requested but only {count} CUDA device(s) are visible "
            f"(ordinals 0..{count - 1}).")
    return Backend("cuda", index)


def argsort_stable(xp, a):
    """Indices that sort ``a``, equal keys in their original order (CuPy's argsort is always stable; NumPy's
    needs ``kind="stable"``)."""
    return xp.argsort(a, kind="stable") if xp is np else xp.argsort(a)
