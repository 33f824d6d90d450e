"""Kernel functions: names, parameters and their defaults, and the tiled kernel-matrix builder.

Built-in kernels (x, y rows of X, <.,.> the dot product):

=============  ====================================  ===================================================
name           k(x, y)                               defaults
=============  ====================================  ===================================================
"rbf"          exp(-gamma ||x - y||^2)               gamma="scale" = 1 / (n_features * X.var())
"polynomial"   (gamma <x, y> + coef0) ** degree      gamma = 1 / n_features, coef0 = 1, degree = 3
"sigmoid"      tanh(gamma <x, y> + coef0)            gamma = 1 / n_features, coef0 = 1 (the papers'
                                                     "neural" kernel tanh(a x.y + b); not PSD)
"linear"       <x, y>                                (plain k-means)
"laplacian"    exp(-gamma ||x - y||_2)               gamma="scale" as for rbf. Note: the Euclidean norm,
                                                     not scikit-learn's L1 ``laplacian_kernel``
"precomputed"  X is the kernel matrix itself
callable       f(A, B, **kernel_params) -> block     called on arrays of the device's namespace
=============  ====================================  ===================================================

Aliases: "poly" -> "polynomial", "neural" and "tanh" -> "sigmoid", "gaussian" -> "rbf".
The Off-the-grid paper writes the RBF kernel as exp(-||x - y||^2 / sigma): gamma = 1 / sigma.
``gamma="scale"`` is scikit-learn's SVC heuristic; it makes gamma * E||x - y||^2 = 2 for
independent features, so kernel values are of order exp(-2) rather than 0 or 1.

The matrix is built as inner products from a GEMM, then one fused elementwise pass
(``ops.kernel_epilogue``) that turns them into kernel values in place. K(X, X) takes a single
product X X^T written straight into K (BLAS syrk on the CPU: one triangle, mirrored); K(X, Y)
and callables go in row tiles of about ``TILE_BYTES``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from ._backend import Backend, check_fits, work_bytes

EPILOGUE_CODES = {"linear": 0, "rbf": 1, "polynomial": 2, "sigmoid": 3, "laplacian": 4}
KERNEL_NAMES = ("rbf", "polynomial", "sigmoid", "linear", "laplacian", "precomputed")
KERNEL_ALIASES = {"poly": "polynomial", "neural": "sigmoid", "tanh": "sigmoid", "gaussian": "rbf"}
_USES_GAMMA = ("rbf", "polynomial", "sigmoid", "laplacian")
_DISTANCE_KERNELS = ("rbf", "laplacian")

#: Rows per tile aim at this many bytes of kernel values (the callable's workspace, the GEMM's output).
TILE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class KernelSpec:
    """A kernel with every parameter resolved to a number.

    ``center`` is the feature mean subtracted before the distance kernels' GEMM (they are
    translation invariant; centring keeps ||x||^2 + ||y||^2 - 2 <x, y> accurate in float32).
    """

    name: str
    gamma: float | None = None
    degree: int = 3
    coef0: float = 0.0
    function: object = None
    params: dict = field(default_factory=dict)
    center: np.ndarray | None = None

    @property
    def resolved_params(self) -> dict:
        if self.name in ("rbf", "laplacian"):
            return {"gamma": self.gamma}
        if self.name == "polynomial":
            return {"gamma": self.gamma, "degree": self.degree, "coef0": self.coef0}
        if self.name == "sigmoid":
            return {"gamma": self.gamma, "coef0": self.coef0}
        if self.name == "callable":
            return dict(self.params)
        return {}


def canonical_kernel_name(kernel) -> str:
    """The canonical name of a kernel argument, or "callable"; ValueError/TypeError otherwise."""
    if callable(kernel):
        return "callable"
    if not isinstance(kernel, str):
        raise TypeError(f"kernel={kernel!r} must be a string or a callable.")
    name = KERNEL_ALIASES.get(kernel.lower(), kernel.lower())
    if name not in KERNEL_NAMES:
        raise ValueError(f"kernel={kernel!r} is not known; use one of {list(KERNEL_NAMES)}, "
                         f"an alias {sorted(KERNEL_ALIASES)}, or a callable.")
    return name


def _finite_number(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite real number.")
    return float(value)


def resolve_kernel(kernel, *, gamma=None, degree=3, coef0=None, kernel_params=None,
                   X=None, xp=np) -> KernelSpec:
    """Validate the kernel arguments and fill in the documented defaults from ``X``.

    ``X`` (n, d) is needed for the data-scale defaults of gamma; for "precomputed" it is unused.
    """
    name = canonical_kernel_name(kernel)
    if kernel_params is not None and not isinstance(kernel_params, dict):
        raise TypeError(f"kernel_params={kernel_params!r} must be a dict or None.")
    if name == "callable":
        return KernelSpec("callable", function=kernel, params=dict(kernel_params or {}))
    if kernel_params:
        raise ValueError(f"kernel_params={kernel_params!r} is only used with a callable kernel; "
                         f"pass gamma / degree / coef0 directly for kernel={name!r}.")
    if name in ("precomputed", "linear"):
        return KernelSpec(name)

    n_features = X.shape[1]
    if gamma is None:
        gamma = "scale" if name in _DISTANCE_KERNELS else "auto"
    if isinstance(gamma, str):
        if gamma == "scale":
            var = float(xp.var(X.astype(xp.float64, copy=False))) if X.size else 0.0
            gamma_value = 1.0 / (n_features * var) if var > 0 else 1.0
        elif gamma == "auto":
            gamma_value = 1.0 / n_features
        else:
            raise ValueError(f"gamma={gamma!r} is not valid; use a positive number, 'scale' or 'auto'.")
    else:
        gamma_value = _finite_number(gamma, "gamma")
        if gamma_value <= 0:
            raise ValueError(f"gamma={gamma!r} must be > 0.")

    degree_value = 3
    coef0_value = 0.0
    if name == "polynomial":
        if isinstance(degree, bool) or not isinstance(degree, numbers.Real) or not float(degree).is_integer() \
                or degree < 1:
            raise ValueError(f"degree={degree!r} must be an integer >= 1.")
        degree_value = int(degree)
    if name in ("polynomial", "sigmoid"):
        coef0_value = 1.0 if coef0 is None else _finite_number(coef0, "coef0")
    return KernelSpec(name, gamma=gamma_value, degree=degree_value, coef0=coef0_value)


def with_center(spec: KernelSpec, X, xp) -> KernelSpec:
    """The spec with the feature mean of X recorded (distance kernels only)."""
    if spec.name not in _DISTANCE_KERNELS:
        return spec
    center = xp.asarray(X).mean(axis=0, dtype=xp.float64)
    return KernelSpec(spec.name, spec.gamma, spec.degree, spec.coef0, spec.function, spec.params,
                      center=center)


def prepare_features(X, spec: KernelSpec, backend: Backend, dtype):
    """X on the device in ``dtype``, centred for the distance kernels."""
    xp = backend.xp
    X = backend.asarray(X)
    if spec.center is not None:
        X = X.astype(xp.float64, copy=False) - backend.asarray(spec.center)
    return backend.asarray(X, dtype=dtype)


def tile_rows(n_cols: int, itemsize: int, tile_bytes: int = TILE_BYTES, backend: Backend | None = None) -> int:
    """Rows of a tile of ``n_cols`` columns within ``tile_bytes`` (and, given ``backend``, within WORK_FRACTION of
    its free memory)."""
    row = max(1, n_cols * itemsize)
    if backend is not None:
        tile_bytes = work_bytes(tile_bytes, backend, minimum=row)
    return max(1, tile_bytes // row)


def kernel_block(A, B, spec: KernelSpec, backend: Backend, out=None, a_sq=None, b_sq=None):
    """k(A_i, B_j) for prepared (centred, typed) features A (m, d) and B (n, d) into ``out`` (m, n)."""
    xp = backend.xp
    m, n = A.shape[0], B.shape[0]
    if spec.name == "callable":
        block = spec.function(A, B, **spec.params)
        block = backend.asarray(block, dtype=A.dtype)
        if block.shape != (m, n):
            raise ValueError(f"the kernel callable returned shape {block.shape} for inputs of "
                             f"{m} and {n} rows; expected ({m}, {n}).")
        if not bool(xp.isfinite(block).all()):
            raise ValueError("the kernel callable returned NaN or inf values.")
        if out is None:
            return block
        out[...] = block
        return out
    if out is None:
        out = xp.empty((m, n), dtype=A.dtype)
    xp.matmul(A, B.T, out=out)
    code = EPILOGUE_CODES[spec.name]
    if code != 0:
        if spec.name in _DISTANCE_KERNELS:
            a_sq = (A * A).sum(axis=1) if a_sq is None else a_sq
            b_sq = (B * B).sum(axis=1) if b_sq is None else b_sq
        else:  # unused by these kernels, but both twins read row_sq[i] for every row: full length
            a_sq, b_sq = xp.zeros(m, dtype=A.dtype), xp.zeros(n, dtype=A.dtype)
        backend.ops.kernel_epilogue(out, a_sq, b_sq, code, spec.gamma or 0.0, spec.coef0, spec.degree)
    return out


# OpenBLAS 0.3.31's multithreaded syrk (what NumPy calls for X @ X.T) crashes with a segmentation
# fault at n = 40,000, d = 784 float32 (measured; n = 30,000 works).  Above this many rows the CPU
# builds K from row tiles of general GEMM instead (measured 15 s at n = 40k on 2 cores).
_CPU_SYRK_MAX_ROWS = 30_000


def build_kernel_matrix(A, B, spec: KernelSpec, backend: Backend, *, tile=None, verbose=False, storage=None):
    """The dense kernel matrix between prepared features A (m, d) and B (n, d).

    ``A is B`` takes one X X^T product into K; otherwise (or with ``tile``) row tiles of ``tile`` rows.
    ``storage`` (default A's dtype) may be float16: tiles are then computed in A's precision and
    rounded into a float16 K (half the memory; sums still accumulate in float32 / float64).

    Checks that the (m, n) array fits the device's free memory before allocating it.
    """
    xp = backend.xp
    m, n = A.shape[0], B.shape[0]
    storage = np.dtype(A.dtype if storage is None else storage)
    itemsize = storage.itemsize
    # Tiles not computed in place in K (float16 storage, a callable's blocks) take a buffer beside K: one row of it
    # at least must fit too, and the tiles are sized from what K leaves free.
    buffered = storage != A.dtype or spec.name == "callable"
    check_fits(m * n * itemsize + (n * np.dtype(A.dtype).itemsize if buffered else 0), backend,
               f"the {m} x {n} {storage.name} kernel matrix")
    if verbose:
        print(f"[kkmgpu] building the {m} x {n} {spec.name} kernel matrix "
              f"({m * n * itemsize / 2**20:.1f} MiB, {storage.name}) on {backend.name}")
    K = xp.empty((m, n), dtype=storage)
    distance = spec.name in _DISTANCE_KERNELS
    a_sq = (A * A).sum(axis=1) if distance else None
    b_sq = (B * B).sum(axis=1) if distance else None
    one_product = (A is B and spec.name != "callable" and tile is None and storage == A.dtype
                   and (backend.is_gpu or m <= _CPU_SYRK_MAX_ROWS))
    if one_product:
        # K = kappa(X X^T): one product of X with itself straight into K (NumPy hands it to BLAS
        # syrk, which computes one triangle and mirrors it: a third less time than general GEMM
        # tiles), then one fused elementwise pass over K.
        xp.matmul(A, A.T, out=K)
        code = EPILOGUE_CODES[spec.name]
        if code != 0:
            sq = a_sq if distance else xp.zeros(m, dtype=A.dtype)  # read for every row: full length
            backend.ops.kernel_epilogue(K, sq, sq, code, spec.gamma or 0.0, spec.coef0, spec.degree)
    else:
        step = tile or tile_rows(n, np.dtype(A.dtype).itemsize, backend=backend)
        for i0 in range(0, m, step):
            i1 = min(m, i0 + step)
            out = K[i0:i1] if storage == A.dtype else None
            block = kernel_block(A[i0:i1], B, spec, backend, out=out,
                                 a_sq=None if a_sq is None else a_sq[i0:i1], b_sq=b_sq)
            if out is None:
                K[i0:i1] = block  # rounded to the storage precision
    if distance and A is B:
        # ||x - x|| is exactly 0; the GEMM form leaves rounding there, which the laplacian's sqrt
        # would amplify to ~1e-8 (float64) in K_ii.
        idx = xp.arange(m)
        K[idx, idx] = 1
    return K


def kernel_diagonal(A, spec: KernelSpec, backend: Backend, *, tile=1024):
    """k(x_i, x_i) for the rows of prepared features A (n, d), float64, without an n x n matrix."""
    xp = backend.xp
    n = A.shape[0]
    if spec.name in _DISTANCE_KERNELS:
        return xp.ones(n, dtype=xp.float64)
    sq = (A.astype(xp.float64) ** 2).sum(axis=1)
    if spec.name == "linear":
        return sq
    if spec.name == "polynomial":
        return (spec.gamma * sq + spec.coef0) ** spec.degree
    if spec.name == "sigmoid":
        return xp.tanh(spec.gamma * sq + spec.coef0)
    if spec.name == "callable":
        out = xp.empty(n, dtype=xp.float64)
        for i0 in range(0, n, tile):
            block = kernel_block(A[i0:i0 + tile], A[i0:i0 + tile], spec, backend)
            out[i0:i0 + tile] = xp.diagonal(block)
        return out
    raise ValueError(f"kernel {spec.name!r} has no features to evaluate the diagonal from")
