"""The one GEMM route of every kernel product, with a precision mode for float32 operands on a GPU.

Every product of features that kkmgpu turns into kernel values (the dense build, the tiled engine, CATS's and
approx's blocks, the nearest-neighbour search) is ``left @ right.T`` through :func:`product` (or, where an
operand is used many times, :func:`left_operand` / :func:`right_operand` once and :func:`gemm` per product).

Precision modes (``fit(gemm_precision=...)``), for float32 operands on a GPU:

``"fp32"``
    IEEE float32 products on the CUDA cores (cuBLAS's default compute type).
``"3xtf32"``
    Each operand split as X = H + L, H = X rounded to TF32 (10 explicit mantissa bits, exact in float32) and
    L = X - H (exact); then ``[H | H | L] @ [H | L | H]^T`` = H H^T + H L^T + L H^T in **one** TF32 tensor-core
    GEMM with three times the inner dimension. The dropped L L^T term is below 2^-22 of the product's terms, so
    the result has float32-level error at about a third of FP32's time on an H100.
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

__all__ = ["PRECISIONS", "DEFAULT_PRECISION", "check_precision", "effective_mode", "inner_factor",
           "tf32_split", "left_operand", "right_operand", "gemm", "product", "compute_type"]

PRECISIONS = ("fp32", "3xtf32", "tf32")

#: The default mode: float32-level kernel error (see docs/performance.md, "GEMM precision") on tensor cores.
DEFAULT_PRECISION = "3xtf32"

_TF32_COMPUTE_TYPE = 7  # CuPy's COMPUTE_TYPE_TF32, where its module does not name it


def check_precision(precision) -> str:
    """``precision`` as one of :data:`PRECISIONS`, or ValueError naming the value and the choices."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"gemm_precision={precision!r} is not one of {', '.join(map(repr, PRECISIONS))}.")
    return precision


def effective_mode(precision: str, backend: Backend, dtype) -> str:
    """The mode a product of ``dtype`` operands really runs on ``backend``: "fp64" for float64, "fp32" on the
    CPU, else ``precision``."""
    if np.dtype(dtype) != np.float32:
        return "fp64"
    if not backend.is_gpu:
        return "fp32"
    return check_precision(precision)


def inner_factor(mode: str) -> int:
    """How many times the inner dimension a mode's GEMM has (3 for the 3xTF32 split, else 1)."""
    return 3 if mode == "3xtf32" else 1


def tf32_split(xp, X):
    """(H, L) with H = X rounded to TF32 (round to nearest even on the 13 dropped mantissa bits) and L = X - H,
    both float32; H + L == X exactly. Infinities and NaN are left in H (L = 0 there)."""
    X = xp.ascontiguousarray(X, dtype=xp.float32)
    bits = X.view(xp.uint32)
    special = (bits & xp.uint32(0x7F800000)) == xp.uint32(0x7F800000)
    lsb = (bits >> xp.uint32(13)) & xp.uint32(1)
    rounded = (bits + xp.uint32(0x0FFF) + lsb) & xp.uint32(0xFFFFE000)
    H = xp.where(special, bits, rounded).astype(xp.uint32).view(xp.float32)
    L = xp.where(special, xp.float32(0), X - H).astype(xp.float32)
    return H, L


def left_operand(X, mode: str, xp):
    """The left operand as ``mode`` reads it: X itself, or ``[H | H | L]`` (rows, 3 d) for "3xtf32"."""
    if mode != "3xtf32":
        return X
    H, L = tf32_split(xp, X)
    return xp.concatenate([H, H, L], axis=1)


def right_operand(X, mode: str, xp):
    """The right operand (its rows are the product's columns) as ``mode`` reads it: X, or ``[H | L | H]``."""
    if mode != "3xtf32":
        return X
    H, L = tf32_split(xp, X)
    return xp.concatenate([H, L, H], axis=1)


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
    mode = effective_mode(precision, backend, A.dtype)
    return gemm(left_operand(A, mode, xp), right_operand(B, mode, xp), backend, mode, out=out)
