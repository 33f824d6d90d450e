"""The one place kkmgpu imports CuPy: :mod:`kkmgpu.backend.device` and the GPU twins (``_gpu_kernels``, ``_tiled_gpu``)
get it from here, so the backend and the twins it loads do not import each other."""

from __future__ import annotations

import importlib


def import_cupy():
    """Import and return CuPy (the only place in kkmgpu that does)."""
    return importlib.import_module("cupy")


def import_cupyx(submodule: str | None = None):
    """Import and return cupyx (CuPy's extension namespace), or its ``submodule`` (e.g. "scipy.sparse"); also
    only here."""
    return importlib.import_module("cupyx" if submodule is None else f"cupyx.{submodule}")


def cupy_linalg_routines():
    """CuPy's module of cuBLAS compute-type switches (TF32 for float32 GEMMs)."""
    try:
        return importlib.import_module("cupy._core._routines_linalg")
    except ImportError:  # CuPy's development tree moves the CUDA routines under cupy._core._gpu
        return importlib.import_module("cupy._core._gpu._routines_linalg")
