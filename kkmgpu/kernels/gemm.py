"""The one GEMM route of every kernel product, with a precision mode for float32 operands on a GPU.

Every product of features that kkmgpu turns into kernel values (the dense build, the tiled engine, CATS's and
approx's blocks, the nearest-neighbour search) is ``left @ right.T`` through :func:`product` (or, where an
operand is used many times, :func:`left_operand` / :func:`right_operand` once and :func:`gemm` per product).

Precision modes (``fit(gemm_precision=...)``), for float32 operands on a GPU:

``"fp32"``
    IEEE float32 products on the CUDA cores (cuBLAS's default compute type).
``"3xtf32"``
    Each operand split as X = H + L, H = X rounded to TF32 (10 explicit mantissa bits, exact in float32) and
    L = X - H (exact); then ``[L | H | H] @ [H | L | H]^T`` = L H^T + H L^T + H H^T in **one** TF32 tensor-core
    GEMM with three times the inner dimension. The dropped L L^T term is below 2^-22 of the product's terms, so
    the result has float32-level error, at three TF32 products' cost (the H100's data sheet gives TF32 tensor
    cores about 7x FP32's rate; the modes' GPU times are not yet measured). The small products come first in the
    inner dimension: accumulated after H H^T, each small term would be rounded at the full sum's magnitude
    (measured on the emulated GPU, offset data: [H | H | L] had 4x FP32's error, [L | H | H] 1.1x).
``"tf32"``
    One TF32 tensor-core GEMM: operands rounded to 10 mantissa bits (relative error about 2^-11 per operand).

float64 operands always take an FP64 GEMM and the CPU always computes IEEE float32 (it has no tensor cores):
there every mode is the plain product, and :func:`effective_mode` says so. The CuPy stand-in of the emulated
GPU rounds float32 GEMM operands to TF32 under the TF32 compute type, so the modes' errors are modelled there.
"""

from __future__ import annotations

import contextlib

import numpy as np

from kkmgpu.backend.device import Backend, cupy_linalg_routines

__all__ = ["PRECISIONS", "DEFAULT_PRECISION", "MIN_TENSOR_CORE_SIDE", "check_precision", "effective_mode",
           "inner_factor", "tf32_split", "operand_bytes", "left_operand", "right_operand", "gemm", "product",
           "compute_type"]

PRECISIONS = ("fp32", "3xtf32", "tf32")

#: The default mode: float32-level kernel error (see docs/performance.md, "GEMM precision") on tensor cores.
DEFAULT_PRECISION = "3xtf32"

#: A product with a side (rows, columns or inner dimension) below this is memory-bound in FP32 on a GPU: its
#: 2 m n d flops over the 4 (m d + n d + m n) bytes it reads and writes are under about 16 flop/byte, the FP32
#: roofline's ridge on an H100 (about 50 TFLOP/s over 3.35 TB/s). Tensor cores cannot make it faster, so it
#: runs "fp32", the most accurate mode, whatever the precision asked (and a split would only add traffic).
MIN_TENSOR_CORE_SIDE = 32

_TF32_COMPUTE_TYPE = 7  # CuPy's COMPUTE_TYPE_TF32, where its module does not name it


def check_precision(precision) -> str:
    """``precision`` as one of :data:`PRECISIONS`, or ValueError naming the value and the choices."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"gemm_precision={precision!r} is not one of {', '.join(map(repr, PRECISIONS))}.")
    return precision


def effective_mode(precision: str, backend: Backend, dtype, shape=None) -> str:
    """The mode a product of ``dtype`` operands really runs on ``backend``: "fp64" for float64, "fp32" on the
    CPU, else ``precision``; and "fp32" for a product of ``shape`` (rows, columns, inner dimension) with a side
    below :data:`MIN_TENSOR_CORE_SIDE` (memory-bound: tensor cores would not be faster)."""
    precision = check_precision(precision)
    if np.dtype(dtype) != np.float32:
        return "fp64"
    if not backend.is_gpu:
        return "fp32"
    if shape is not None and min(shape) < MIN_TENSOR_CORE_SIDE:
        return "fp32"
    return precision


def inner_factor(mode: str) -> int:
    """How many times the inner dimension a mode's GEMM has (3 for the 3xTF32 split, else 1)."""
    return 3 if mode == "3xtf32" else 1


def tf32_split(xp, X):
    """(H, L) with H = X rounded to TF32 (round to nearest even on the 13 dropped mantissa bits) and L = X - H,
    both float32; H + L == X exactly (for |X| below float32's largest power of two). Infinities and NaN are left
    in H (L = 0 there). Temporaries: about three arrays of X's size besides H and L (in-place steps)."""
    X = xp.ascontiguousarray(X, dtype=xp.float32)
    bits = X.view(xp.uint32)
    rounded = bits >> xp.uint32(13)
    rounded &= xp.uint32(1)
    rounded += xp.uint32(0x0FFF)
    rounded += bits
    rounded &= xp.uint32(0xFFFFE000)
    special = (bits & xp.uint32(0x7F800000)) == xp.uint32(0x7F800000)
    H = xp.where(special, bits, rounded).view(xp.float32)
    del rounded
    with np.errstate(invalid="ignore"):  # inf - inf where special (NumPy warns; CuPy does not)
        L = xp.where(special, xp.float32(0), X - H)
    return H, L


#: The way to need less memory that a 3xTF32 operand's memory check names first.
SPLIT_ADVICE = "gemm_precision='fp32' (no 3xTF32 split: GEMM operands a third the size)"


def operand_bytes(rows: int, d: int, mode: str) -> int:
    """Peak bytes of preparing an operand of ``rows`` rows and ``d`` float32 features in ``mode`` (the prepared
    copy and the split's temporaries): 5 rows d 4 for "3xtf32" (H, L and the 3 d-wide copy), 0 for the modes that
    read X itself."""
    return 5 * 4 * int(rows) * int(d) if mode == "3xtf32" else 0


def _stacked(X, mode, xp, order):
    if mode != "3xtf32":
        return X
    H, L = tf32_split(xp, X)
    parts = {"H": H, "L": L}
    return xp.concatenate([parts[p] for p in order], axis=1)


def left_operand(X, mode: str, xp):
    """The left operand as ``mode`` reads it: X itself, or ``[L | H | H]`` (rows, 3 d) for "3xtf32"."""
    return _stacked(X, mode, xp, "LHH")


def right_operand(X, mode: str, xp, index=None, chunk_rows=None):
    """The right operand (its rows are the product's columns) as ``mode`` reads it: X, or ``[H | L | H]``.

    ``index`` (a device integer array) takes the rows X[index] (a gather); ``chunk_rows`` prepares the rows that
    many at a time into one array, so that the split's temporaries are those of a chunk
    (:func:`operand_bytes` of ``chunk_rows`` rows) beside the (rows, 3 d) result.
    """
    if mode != "3xtf32":
        return X if index is None else X[index]
    rows = X.shape[0] if index is None else index.shape[0]
    step = rows if chunk_rows is None else max(1, int(chunk_rows))
    if step >= rows:
        return _stacked(X if index is None else X[index], mode, xp, "HLH")
    out = xp.empty((rows, 3 * X.shape[1]), dtype=xp.float32)
    for j0 in range(0, rows, step):
        part = X[j0:j0 + step] if index is None else X[index[j0:j0 + step]]
        out[j0:j0 + step] = _stacked(part, mode, xp, "HLH")
    return out


@contextlib.contextmanager
def compute_type(backend: Backend, mode: str):
    """cuBLAS's float32 compute type set to TF32 for the modes on tensor cores, restored afterwards."""
    if not (backend.is_gpu and mode in ("tf32", "3xtf32")):
        yield
        return
    linalg = cupy_linalg_routines()
    previous = linalg.get_compute_type(np.float32)
    linalg.set_compute_type(np.float32, getattr(linalg, "COMPUTE_TYPE_TF32", _TF32_COMPUTE_TYPE))
    try:
        yield
    finally:
        linalg.set_compute_type(np.float32, previous)


def gemm(left, right, backend: Backend, mode: str, out=None):
    """``left @ right.T`` for operands from :func:`left_operand` / :func:`right_operand` of the same ``mode``."""
    xp = backend.xp
    with compute_type(backend, mode):
        if out is None:
            return xp.matmul(left, right.T)
        return xp.matmul(left, right.T, out=out)


def product(A, B, backend: Backend, precision: str = DEFAULT_PRECISION, out=None):
    """``A @ B.T`` (A (m, d), B (n, d), one dtype) in ``precision``'s mode on ``backend``; into ``out`` if given."""
    xp = backend.xp
    mode = effective_mode(precision, backend, A.dtype, shape=(A.shape[0], B.shape[0], A.shape[1]))
    return gemm(left_operand(A, mode, xp), right_operand(B, mode, xp), backend, mode, out=out)
