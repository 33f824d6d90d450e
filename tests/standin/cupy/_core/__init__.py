"""cupy._core of the stand-in: only what kkmgpu reaches (the cuBLAS compute type switch)."""
from . import _routines_linalg  # noqa: F401
