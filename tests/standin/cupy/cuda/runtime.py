"""cupy.cuda.runtime of the stand-in: one device (ordinal 0) whose memory is the stand-in's accounting."""
from __future__ import annotations

from . import memory as _memory

is_hip = False
errorInvalidDevice = 101
errorMemoryAllocation = 2


class CUDARuntimeError(RuntimeError):
    """A CUDA runtime error (CuPy's message format: ``cudaErrorName: description``)."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


_current = [0]


def _check(device_id) -> int:
    device_id = int(device_id)
    if device_id != 0:
        raise CUDARuntimeError(errorInvalidDevice, "cudaErrorInvalidDevice: invalid device ordinal")
    return device_id


def getDeviceCount() -> int:
    return 1


def getDevice() -> int:
    return _current[0]


def setDevice(device: int) -> None:
    _current[0] = _check(device)


def deviceSynchronize() -> None:
    from .. import _ledger

    if _ledger.ACTIVE:
        _ledger.d2h("synchronize", 0)


def memGetInfo() -> tuple[int, int]:
    """(free, total) bytes of the current device: free excludes what CuPy's pool holds (used and cached)."""
    pool = _memory.get_default_memory_pool()
    return pool.device_free(), pool.device_total()


def runtimeGetVersion() -> int:
    return 12080


def driverGetVersion() -> int:
    return 12080


def getDeviceProperties(device: int) -> dict:
    _check(device)
    return {
        "name": b"CuPy stand-in (NumPy on the CPU)", "totalGlobalMem": _memory.get_default_memory_pool().device_total(),
        "multiProcessorCount": 132, "maxThreadsPerBlock": 1024, "maxThreadsDim": (1024, 1024, 64),
        "maxGridSize": (2**31 - 1, 65535, 65535), "sharedMemPerBlock": 48 * 1024,
        "sharedMemPerBlockOptin": 227 * 1024, "major": 9, "minor": 0, "warpSize": 32,
    }
