"""cupy._core._routines_linalg of the stand-in: cuBLAS compute types (what ``CUPY_TF32=1`` and
kkmgpu.backend.device.gemm_precision switch) and the TF32 rounding the stand-in's float32 GEMMs apply under TF32."""
from __future__ import annotations

import os

import numpy as _np

COMPUTE_TYPE_TBD = 0
COMPUTE_TYPE_DEFAULT = 1
COMPUTE_TYPE_PEDANTIC = 2
COMPUTE_TYPE_FP16 = 3
COMPUTE_TYPE_FP32 = 4
COMPUTE_TYPE_FP64 = 5
COMPUTE_TYPE_BF16 = 6
COMPUTE_TYPE_TF32 = 7

_compute_types = {}  # dtype char ('e', 'f', 'd') -> compute type


def _key(dtype) -> str:
    char = _np.dtype(dtype).char
    if char not in "efdFD":
        raise TypeError(f"dtype {_np.dtype(dtype)} has no cuBLAS compute type")
    return char.lower()


def get_compute_type(dtype) -> int:
    key = _key(dtype)
    if key not in _compute_types:  # CuPy reads CUPY_TF32 once, on first use
        tf32 = key == "f" and os.environ.get("CUPY_TF32", "0") != "0"
        _compute_types[key] = COMPUTE_TYPE_TF32 if tf32 else COMPUTE_TYPE_DEFAULT
    return _compute_types[key]


def set_compute_type(dtype, compute_type) -> None:
    if compute_type not in range(COMPUTE_TYPE_TBD, COMPUTE_TYPE_TF32 + 1):
        raise ValueError(f"compute_type={compute_type!r} is not one of CuPy's COMPUTE_TYPE_* values")
    _compute_types[_key(dtype)] = compute_type


def tf32_round(x: _np.ndarray) -> _np.ndarray:
    """float32 values rounded to TF32 (8-bit exponent, 10 explicit mantissa bits; round to nearest even), as the
    tensor cores read them. Infinities and NaN pass unchanged."""
    x = _np.ascontiguousarray(x, dtype=_np.float32)
    bits = x.view(_np.uint32)
    keep = bits & _np.uint32(0x7F800000) == _np.uint32(0x7F800000)  # inf / nan
    lsb = (bits >> _np.uint32(13)) & _np.uint32(1)
    rounded = (bits + _np.uint32(0x0FFF) + lsb) & _np.uint32(0xFFFFE000)
    return _np.where(keep, bits, rounded).astype(_np.uint32).view(_np.float32)


def gemm_operands(*operands):
    """The operands of a matrix product as cuBLAS reads them: rounded to TF32 when they are all float32 and the
    float32 compute type is TF32, else unchanged."""
    if operands and all(isinstance(a, _np.ndarray) and a.dtype == _np.float32 for a in operands) and \
            get_compute_type(_np.float32) == COMPUTE_TYPE_TF32:
        return tuple(tf32_round(a) for a in operands)
    return operands
