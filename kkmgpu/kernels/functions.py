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
"laplacian"    exp(-gamma ||x - y||_2)               gamma="scale" = 1 / sqrt(n_features * X.var()).
                                                     Note: the Euclidean norm, not scikit-learn's L1
                                                     ``laplacian_kernel``
"precomputed"  X is the kernel matrix itself
callable       f(A, B, **kernel_params) -> block     called on arrays of the device's namespace
=============  ====================================  ===================================================

Aliases: "poly" -> "polynomial", "neural" and "tanh" -> "sigmoid", "gaussian" -> "rbf".
The Off-the-grid paper writes the RBF kernel as exp(-||x - y||^2 / sigma): gamma = 1 / sigma.
``gamma="scale"`` is scikit-learn's SVC heuristic; it makes gamma * E||x - y||^2 = 2 for
independent features, so kernel values are of order exp(-2) rather than 0 or 1. The laplacian's
"scale" is the same rule for its unsquared distance: gamma * sqrt(E||x - y||^2) = sqrt(2), kernel
values of order exp(-sqrt(2)). Both are scale-invariant: multiplying X by c divides gamma by c^2
(rbf) or c (laplacian) and leaves K unchanged.

Numerical range. The linear, rbf and laplacian kernels are translation invariant, so their
features are centred on the data's mean (``KernelSpec.center``) before any product: a large offset
(values near 1e9) then costs no precision. Polynomial and sigmoid are not; a large mean relative to
the spread warns (:class:`PrecisionWarning`). Features whose squared norms would leave the compute
precision's range are divided by a power of two (``KernelSpec.scale``, absorbed by gamma: exact),
and kernels whose values would exceed the storage precision (linear, polynomial, a precomputed K)
are computed divided by a power of two (``KernelSpec.value_scale``); the clustering does not change
and objectives are reported in the kernel's own units. A kernel that cannot be represented at all
raises ``ValueError``; a kernel that is numerically the identity or a constant on the data warns
(:class:`UninformativeKernelWarning`).

The matrix is built as inner products from a GEMM, then one fused elementwise pass
(``ops.kernel_epilogue``) that turns them into kernel values in place. K(X, X) takes a single
product X X^T written straight into K (BLAS syrk on the CPU: one triangle, mirrored); K(X, Y)
and callables go in row tiles of about ``TILE_BYTES``.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass, field, replace

import numpy as np

from kkmgpu.backend.device import Backend, check_fits, work_bytes

from kkmgpu.kernels.epilogue_codes import EPILOGUE_CODES  # the twins read the same codes
KERNEL_NAMES = ("rbf", "polynomial", "sigmoid", "linear", "laplacian", "precomputed")
KERNEL_ALIASES = {"poly": "polynomial", "neural": "sigmoid", "tanh": "sigmoid", "gaussian": "rbf"}
_USES_GAMMA = ("rbf", "polynomial", "sigmoid", "laplacian")
_DISTANCE_KERNELS = ("rbf", "laplacian")
#: translation-invariant kernels: computed from features centred on the data's mean
CENTERED_KERNELS = ("rbf", "laplacian", "linear")

#: Rows per tile aim at this many bytes of kernel values (the callable's workspace, the GEMM's output).
TILE_BYTES = 64 * 2**20

#: Values are kept below the dtype's largest power of two divided by 2**HEADROOM_BITS (room for the
#: sums of a tile and the distance formula's 4 ||x||^2), and squared norms above its smallest normal
#: number times 2**FLOOR_BITS (room for the products of small coordinates).
HEADROOM_BITS = 10
FLOOR_BITS = 64
#: objectives are reported in the kernel's units: a value scale above 2**MAX_VALUE_SCALE_BITS cannot be
MAX_VALUE_SCALE_BITS = 960


class UninformativeKernelWarning(UserWarning):
    """The kernel matrix is numerically the identity or a constant on the data: it cannot separate clusters."""


class PrecisionWarning(UserWarning):
    """A kernel that is not translation invariant loses most of its significant digits to the data's offset."""


@dataclass(frozen=True)
class KernelSpec:
    """A kernel with every parameter resolved to a number.

    ``center`` is the feature mean subtracted before the translation-invariant kernels' GEMM
    (linear, rbf, laplacian; centring keeps ||x||^2 + ||y||^2 - 2 <x, y> accurate in float32).
    ``scale`` (a power of two) divides the centred features, ``value_scale`` (a power of two) the
    kernel values: the device computes K / value_scale from (X - center) / scale with the parameters
    of ``kernel_args``. Both are 1 unless the data's range needs them (see :func:`with_center`).
    """

    name: str
    gamma: float | None = None
    degree: int = 3
    coef0: float = 0.0
    function: object = None
    params: dict = field(default_factory=dict)
    center: np.ndarray | None = None
    scale: float = 1.0
    value_scale: float = 1.0
    internal_gamma: float | None = None
    internal_coef0: float | None = None

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

    @property
    def kernel_args(self) -> tuple:
        """(gamma, coef0, degree) for the epilogue on prepared features: K / value_scale from (X - center) / scale."""
        gamma = self.gamma if self.internal_gamma is None else self.internal_gamma
        coef0 = self.coef0 if self.internal_coef0 is None else self.internal_coef0
        return gamma or 0.0, coef0, self.degree

    def describe(self) -> str:
        """``kernel='rbf' with gamma=...`` for messages."""
        params = ", ".join(f"{key}={value!r}" if not isinstance(value, float) else f"{key}={value:.6g}"
                           for key, value in self.resolved_params.items())
        return f"kernel={self.name!r}" + (f" with {params}" if params else "")


def storage_limit(dtype, n: int = 1) -> float:
    """The largest kernel value kept in ``dtype`` for n points: its largest power of two over 2**HEADROOM_BITS,
    and low enough that the float64 within-cluster totals (up to 4 n^2 max|K| with normalised weights) and
    their squares (CATS's variance rule squares the distortions) stay finite."""
    # float16: values up to 1, since GPU products of float16 blocks (CATS's projections) return float16 sums
    bits = 0 if np.dtype(dtype) == np.float16 else math.floor(math.log2(float(np.finfo(dtype).max))) - HEADROOM_BITS
    sums = 511 - HEADROOM_BITS - 2 - 2 * math.ceil(math.log2(max(1, n)))
    return 2.0 ** min(bits, sums)


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
            gamma_value = scale_gamma(name, n_features, var)
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


def scale_gamma(name: str, n_features: int, var: float) -> float:
    """gamma="scale" for ``name`` from the number of features and the variance of all of X's values.

    rbf: 1 / (d var), so gamma E||x - y||^2 = 2 for independent features (scikit-learn's SVC rule);
    laplacian: 1 / sqrt(d var), the same rule for the unsquared distance (gamma sqrt(E||x - y||^2) =
    sqrt(2)). Both make K independent of the data's units. 1 for constant data.
    """
    if not var > 0 or not math.isfinite(var):
        return 1.0
    if name == "laplacian":
        return 1.0 / math.sqrt(n_features * var)
    return 1.0 / (n_features * var)


def _log2_sum_squares(m):
    """log2(sum m_f^2) for non-negative float64 m without overflow or underflow; -inf when all are 0."""
    top = float(m.max()) if m.size else 0.0
    if top <= 0 or not math.isfinite(top):
        return -math.inf if top <= 0 else math.inf
    return math.log2(float(((m / top) ** 2).sum())) + 2 * math.log2(top)


def _fmt_pow2(bits: float) -> str:
    return f"2^{bits:.0f} (about 1e{bits * math.log10(2):.0f})"


def with_center(spec: KernelSpec, X, xp, dtype=None, *, center_linear=True, stats=None) -> KernelSpec:
    """The spec with the centre and the scales its features and values need on the data X (n, d).

    * ``center``: the feature mean, for the translation-invariant kernels (linear, rbf, laplacian). The
      linear kernel's values change with the centre (its clustering does not): ``center_linear=False``
      keeps them (:func:`kkmgpu.kernel_matrix`).
    * ``scale``: a power of two dividing the centred features when their squared norms would leave the
      compute precision's range (X * 1e20 in float32, or X * 1e-30), absorbed by gamma (exact).
    * ``value_scale``: a power of two dividing the kernel values when they would exceed the storage
      precision ``dtype`` (default float32): the linear kernel (scale^2) and the polynomial kernel
      ((gamma <x, y> + coef0)^degree = b^degree ((gamma / b) <x, y> + coef0 / b)^degree).

    ``stats``: (mean, max, min, total variance, n) of X's columns in float64 on the host, when X itself is not
    at hand (``kkmgpu.dask`` computes them over the chunks); X is then ignored.

    Raises ValueError when the polynomial kernel's values exceed float64's range on these data.
    Polynomial and sigmoid (not translation invariant) warn with :class:`PrecisionWarning` when the
    data's mean is so large against their spread that the compute precision keeps fewer than about
    three significant digits of the inner products that differ between points.
    """
    if spec.name in ("precomputed", "callable"):
        return spec
    storage = np.dtype(np.float32 if dtype is None else dtype)
    compute = np.dtype(np.float32) if storage == np.float16 else storage
    if stats is None:
        X = xp.asarray(X)
        mean = X.mean(axis=0, dtype=xp.float64)
        hi = X.max(axis=0).astype(xp.float64)
        lo = X.min(axis=0).astype(xp.float64)
        n = X.shape[0]
    else:
        xp = np
        mean, hi, lo, spread, n = (np.asarray(stats[0], dtype=np.float64), np.asarray(stats[1], dtype=np.float64),
                                   np.asarray(stats[2], dtype=np.float64), float(stats[3]), int(stats[4]))
    centered = spec.name in CENTERED_KERNELS and (center_linear or spec.name != "linear")
    if centered:
        reach = xp.maximum(hi - mean, mean - lo)
    else:
        reach = xp.maximum(xp.abs(hi), xp.abs(lo))
    reach = np.asarray(reach.get() if hasattr(reach, "get") else reach, dtype=np.float64)
    log_sq = _log2_sum_squares(reach)  # an upper bound of log2 max ||x - center||^2
    if log_sq == math.inf:
        raise ValueError(f"X's range overflows float64 (max |x - center| = {float(reach.max()):.3g}); "
                         f"{spec.describe()} cannot be computed. Scale X.")
    upper = math.log2(storage_limit(compute, n))
    lower = math.log2(float(np.finfo(compute).tiny)) + FLOOR_BITS
    scale_bits = 0
    if spec.name == "linear":
        upper = min(upper, math.log2(storage_limit(storage, n)))
    if log_sq > upper:
        scale_bits = math.ceil((log_sq - upper) / 2)
    elif -math.inf < log_sq < lower:
        scale_bits = math.floor(log_sq / 2)
    scale = 2.0 ** scale_bits
    log_sq -= 2 * scale_bits
    value_scale = 1.0
    internal_gamma = None if spec.gamma is None else spec.gamma * scale ** (2 if spec.name != "laplacian" else 1)
    internal_coef0 = None
    if spec.name == "linear":
        value_scale = scale * scale
    elif spec.name == "polynomial":
        # |gamma <x, y> + coef0| <= gamma max||x||^2 + |coef0| (Cauchy-Schwarz): its degree-th power bounds |K|
        base = internal_gamma * 2.0 ** log_sq + abs(spec.coef0)
        log_base = math.log2(base) if base > 0 else -math.inf
        limit = math.log2(storage_limit(storage, n))
        b_bits = 0
        if spec.degree * log_base > limit:
            b_bits = math.ceil(log_base - limit / spec.degree)
        elif -math.inf < spec.degree * log_base < lower:
            b_bits = math.ceil(log_base)
        if spec.degree * b_bits > MAX_VALUE_SCALE_BITS:
            raise ValueError(
                f"{spec.describe()} has values up to about {_fmt_pow2(spec.degree * log_base)} on these "
                f"data, beyond float64's range (largest "
                f"{np.finfo(np.float64).max:.3g}) and {storage.name}'s (largest {float(np.finfo(storage).max):.5g}): "
                "neither K nor the objective can be represented. Lower the degree or gamma, or scale X.")
        if b_bits:
            b = 2.0 ** b_bits
            value_scale = 2.0 ** (spec.degree * b_bits)
            internal_gamma = internal_gamma / b
            internal_coef0 = spec.coef0 / b
    if spec.name in ("polynomial", "sigmoid"):
        if stats is None:
            spread = float(X.var(axis=0, dtype=xp.float64).sum())
        _warn_offset(spec, spread, mean, compute)
    return replace(spec, center=mean if centered else None, scale=scale, value_scale=value_scale,
                   internal_gamma=internal_gamma, internal_coef0=internal_coef0)


def _warn_offset(spec, spread, mean, compute):
    """PrecisionWarning when ||mean||^2 / total variance * eps(compute) > 1e-3 (polynomial, sigmoid)."""
    mean_sq = float((mean * mean).sum())
    if mean_sq == 0 or spread == 0:  # centred already, or constant data (UninformativeKernelWarning's case)
        return
    lost = mean_sq / spread * float(np.finfo(compute).eps) if spread > 0 else math.inf
    if lost > 1e-3:
        warnings.warn(
            f"{spec.describe()} is not translation invariant and X's mean (norm {math.sqrt(mean_sq):.3g}) is large "
            f"against its spread (total standard deviation {math.sqrt(spread):.3g}): in {compute.name} the inner "
            f"products <x, y> keep about {max(0.0, -math.log10(lost)):.1f} significant digits of what differs "
            "between points. Centre X first (or use dtype='float64') unless the offset is meant to matter.",
            PrecisionWarning, stacklevel=4)


def prepare_features(X, spec: KernelSpec, backend: Backend, dtype):
    """X on the device in ``dtype``: centred (translation-invariant kernels) and divided by ``spec.scale``."""
    xp = backend.xp
    X = backend.asarray(X)
    if spec.center is not None or spec.scale != 1.0:
        X = X.astype(xp.float64, copy=False)
        if spec.center is not None:
            X = X - backend.asarray(spec.center)
        if spec.scale != 1.0:
            X = X * (1.0 / spec.scale)
    return backend.asarray(X, dtype=dtype)


def tile_rows(n_cols: int, itemsize: int, tile_bytes: int = TILE_BYTES, backend: Backend | None = None) -> int:
    """Rows of a tile of ``n_cols`` columns within ``tile_bytes`` (and, given ``backend``, within WORK_FRACTION of
    its free memory)."""
    row = max(1, n_cols * itemsize)
    if backend is not None:
        tile_bytes = work_bytes(tile_bytes, backend, minimum=row)
    return max(1, tile_bytes // row)


def training_kernel_rows(result, X_new, backend: Backend, dt, step):
    """(i0, i1, K(X_new[i0:i1], training points)) in batches of ``step`` rows, for predict: the given rows of a
    precomputed kernel, else kernel blocks of the new points' prepared features against the training ones."""
    spec = result._spec
    m = X_new.shape[0]
    if spec.name != "precomputed":
        A_all = prepare_features(X_new, spec, backend, dt)
        B = backend.asarray(result._train_features)  # a GPU fit predicted under KKMGPU_DEVICE=cpu
        b_sq = (B * B).sum(axis=1) if spec.name in _DISTANCE_KERNELS else None
    for i0 in range(0, m, step):
        i1 = min(m, i0 + step)
        if spec.name == "precomputed":
            yield i0, i1, backend.asarray(X_new[i0:i1], dtype=dt)
        else:
            yield i0, i1, kernel_block(A_all[i0:i1], B, spec, backend, b_sq=b_sq)


def kernel_block(A, B, spec: KernelSpec, backend: Backend, out=None, a_sq=None, b_sq=None):
    """k(A_i, B_j) for prepared (centred, typed) features A (m, d) and B (n, d) into ``out`` (m, n)."""
    xp = backend.xp
    m, n = A.shape[0], B.shape[0]
    if spec.name == "callable":
        block = spec.function(A, B, **spec.params)
        block = backend.asarray(block)
        if block.shape != (m, n):
            raise ValueError(f"the kernel callable returned shape {block.shape} for inputs of "
                             f"{m} and {n} rows; expected ({m}, {n}).")
        if not bool(xp.isfinite(block).all()):
            raise ValueError("the kernel callable returned NaN or inf values.")
        if block.dtype != A.dtype:
            block = block.astype(A.dtype)
            if not bool(xp.isfinite(block).all()):
                raise ValueError(f"the kernel callable returned values beyond {np.dtype(A.dtype).name}'s range "
                                 f"(largest {float(np.finfo(A.dtype).max):.5g}); use dtype='float64' or scale the "
                                 "kernel.")
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
        backend.ops.kernel_epilogue(out, a_sq, b_sq, code, *spec.kernel_args)
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
            backend.ops.kernel_epilogue(K, sq, sq, code, *spec.kernel_args)
    else:
        step = tile or tile_rows(n, np.dtype(A.dtype).itemsize, backend=backend)
        for i0 in range(0, m, step):
            i1 = min(m, i0 + step)
            out = K[i0:i1] if storage == A.dtype else None
            block = kernel_block(A[i0:i1], B, spec, backend, out=out,
                                 a_sq=None if a_sq is None else a_sq[i0:i1], b_sq=b_sq)
            if out is None:
                _check_storable(block, storage, spec, backend)
                K[i0:i1] = block  # rounded to the storage precision
    if distance and A is B:
        # ||x - x|| is exactly 0; the GEMM form leaves rounding there, which the laplacian's sqrt
        # would amplify to ~1e-8 (float64) in K_ii.
        idx = xp.arange(m)
        K[idx, idx] = 1
    return K


def _check_storable(block, storage, spec, backend):
    """ValueError if a computed tile has values beyond the storage precision's largest (a callable's, in float16)."""
    if block.dtype == storage or block.size == 0:
        return
    largest = float(np.finfo(storage).max)
    xp = backend.xp
    top = float(xp.maximum(block.max(), -block.min()))
    if top > largest:
        raise ValueError(f"{spec.describe()} has values up to {top:.5g} (in its computed units), beyond "
                         f"{storage.name}'s largest value {largest:.5g}; use dtype='float32' or scale the kernel.")


def kernel_diagonal(A, spec: KernelSpec, backend: Backend, *, tile=1024):
    """k(x_i, x_i) for the rows of prepared features A (n, d), float64, without an n x n matrix."""
    xp = backend.xp
    n = A.shape[0]
    if spec.name in _DISTANCE_KERNELS:
        return xp.ones(n, dtype=xp.float64)
    sq = (A.astype(xp.float64) ** 2).sum(axis=1)
    if spec.name == "linear":
        return sq
    gamma, coef0, degree = spec.kernel_args
    if spec.name == "polynomial":
        return (gamma * sq + coef0) ** degree
    if spec.name == "sigmoid":
        return xp.tanh(gamma * sq + coef0)
    if spec.name == "callable":
        out = xp.empty(n, dtype=xp.float64)
        for i0 in range(0, n, tile):
            block = kernel_block(A[i0:i0 + tile], A[i0:i0 + tile], spec, backend)
            out[i0:i0 + tile] = xp.diagonal(block)
        return out
    raise ValueError(f"kernel {spec.name!r} has no features to evaluate the diagonal from")


#: rows of K sampled (evenly spaced, no random state consumed) to judge whether it carries information
INFORMATIVE_SAMPLE_ROWS = 32


def check_informative(spec: KernelSpec, backend: Backend, storage, *, X=None, K=None, chunk_rows=65536):
    """Warn (:class:`UninformativeKernelWarning`) when K is numerically the identity or a constant.

    Reads ``INFORMATIVE_SAMPLE_ROWS`` evenly spaced rows of K against every point (blocks from the
    data ``X`` on the device, prepared in chunks of ``chunk_rows``, or rows of a dense precomputed ``K``):
    O(rows n d), no n x n pass. In the
    storage precision (eps), K is

    * numerically the identity when every sampled row's off-diagonal values are at most
      eps sqrt(K_ii K_jj) in magnitude (each point is alone: gamma too large for the distance kernels);
    * numerically constant when every sampled pair's feature-space distance K_ii + K_jj - 2 K_ij is at most
      eps max(|K_ii|, |K_jj|) (all points coincide in feature space: gamma too small, or too large for
      a saturated sigmoid).

    Returns "identity", "constant" or None.
    """
    xp = backend.xp
    n = (X if K is None else K).shape[0]
    if n < 2:
        return None
    rows = np.unique(np.linspace(0, n - 1, min(n, INFORMATIVE_SAMPLE_ROWS)).round().astype(np.int64))
    idx = backend.asarray(rows)
    # every chunk of the sampled rows goes to the host at once: the device holds one chunk, within the work share
    # of its free memory (the memory guard of the run's own arrays comes later)
    per_column = 8 * (2 * rows.size + (X.shape[1] if K is None else 0) + 2)
    chunk = max(1, min(int(chunk_rows), work_bytes(int(chunk_rows) * per_column, backend) // per_column))
    blocks, diags = [], []
    if K is None:
        compute = np.dtype(np.float32) if np.dtype(storage) == np.float16 else np.dtype(storage)
        sampled = prepare_features(X[idx], spec, backend, compute)
        for i0 in range(0, n, chunk):
            part = prepare_features(X[i0:i0 + chunk], spec, backend, compute)
            blocks.append(backend.to_host(kernel_block(sampled, part, spec, backend)))
            diags.append(backend.to_host(kernel_diagonal(part, spec, backend)))
            del part
        block, diag = np.concatenate(blocks, axis=1), np.concatenate(diags)
        if spec.name in _DISTANCE_KERNELS:  # K_ii = 1 exactly, as the engines store it
            block[np.arange(rows.size), rows] = 1
    else:
        for i0 in range(0, n, chunk):
            blocks.append(backend.to_host(K[idx, i0:i0 + chunk]))
            diags.append(backend.to_host(xp.diagonal(K[i0:i0 + chunk, i0:i0 + chunk])))
        block, diag = np.concatenate(blocks, axis=1), np.concatenate(diags)
    storage = np.dtype(storage)
    with np.errstate(over="ignore", invalid="ignore"):  # a callable's values beyond float16 are refused later
        return _judge_informative(spec, storage, rows, block, diag, X)


def _judge_informative(spec, storage, rows, block, diag, X):
    """The judgement of :func:`check_informative` on the host copies of the sampled rows and the diagonal."""
    block = block.astype(storage).astype(np.float64)  # the values as stored
    diag = diag.astype(storage).astype(np.float64)
    eps = float(np.finfo(storage).eps)
    own = diag[rows][:, None]
    others = diag[None, :]
    off = np.ones(block.shape, dtype=bool)
    off[np.arange(rows.size), rows] = False
    if not off.any():
        return None
    magnitude = np.sqrt(np.abs(own)) * np.sqrt(np.abs(others))
    identity = bool(np.all(np.abs(block[off]) <= eps * magnitude[off])) and bool(np.any(magnitude[off] > 0))
    half_distance = 0.5 * own + 0.5 * others - block  # halved: no overflow near the dtype's largest value
    constant = bool(np.all(np.abs(half_distance[off]) <= 0.5 * eps * np.maximum(np.abs(own), np.abs(others))[off]))
    if not (identity or constant):
        return None
    name = spec.name
    if identity:
        what = (f"numerically the identity in {storage.name} (the sampled off-diagonal values are below {eps:.2g} "
                "times the diagonal: every point is alone in feature space)")
        advice = {"rbf": "decrease gamma", "laplacian": "decrease gamma", "polynomial": "lower gamma or the degree",
                  "sigmoid": "change gamma"}.get(name)
    else:
        what = (f"numerically constant in {storage.name} (the sampled points coincide in feature space: "
                f"K_ii + K_jj - 2 K_ij is below {eps:.2g} times K_ii), so no partition is better than another")
        advice = {"rbf": "increase gamma", "laplacian": "increase gamma", "polynomial": "increase gamma",
                  "linear": "X's points coincide"}.get(name)
        if name == "sigmoid":
            # constant at tanh(coef0): gamma <x, y> is negligible; elsewhere (near +-1): tanh is saturated
            at_coef0 = abs(float(np.median(block[off])) - math.tanh(spec.kernel_args[1])) <= 1e-3
            advice = "increase gamma" if at_coef0 else "decrease gamma (tanh is saturated)"
    if constant and X is not None and bool((X.max(axis=0) == X.min(axis=0)).all()):
        advice = "X's points coincide"
    message = f"the kernel matrix of {spec.describe()} is {what}."
    if advice:
        message += f" {advice[0].upper()}{advice[1:]}."
    if storage != np.float64:
        message += " dtype='float64' may also resolve it."
    warnings.warn(message, UninformativeKernelWarning, stacklevel=4)
    return "identity" if identity else "constant"
