"""Kernel functions: names, parameters and their defaults, and the scales that keep them representable.

Built-in kernels (x, y rows of X, <.,.> the dot product):

=============  ====================================  ===================================================
name           k(x, y)                               defaults
=============  ====================================  ===================================================
"rbf"          exp(-gamma ||x - y||^2)               gamma="scale" = 1 / (n_features * v), v below
"polynomial"   (gamma <x, y> + coef0) ** degree      gamma = 1 / n_features, coef0 = 1, degree = 3
"sigmoid"      tanh(gamma <x, y> + coef0)            gamma = 1 / n_features, coef0 = 1 (the papers'
                                                     "neural" kernel tanh(a x.y + b); not PSD)
"linear"       <x, y>                                (plain k-means)
"laplacian"    exp(-gamma ||x - y||_2)               gamma="scale" = 1 / sqrt(n_features * v).
                                                     Note: the Euclidean norm, not scikit-learn's L1
                                                     ``laplacian_kernel``
"precomputed"  X is the kernel matrix itself
callable       f(A, B, **kernel_params) -> block     called on arrays of the device's namespace
=============  ====================================  ===================================================

Aliases: "poly" -> "polynomial", "neural" and "tanh" -> "sigmoid", "gaussian" -> "rbf".
The Off-the-grid paper writes the RBF kernel as exp(-||x - y||^2 / sigma): gamma = 1 / sigma.
``gamma="scale"`` takes v = X.var(axis=0).mean(), the mean of the per-feature centred variances
(in float64): gamma * E||x - y||^2 = 2 for independent points, so kernel values are of order
exp(-2) rather than 0 or 1. The laplacian's "scale" is the same rule for its unsquared distance:
gamma * sqrt(E||x - y||^2) = sqrt(2), kernel values of order exp(-sqrt(2)). Both are
scale-invariant (multiplying X by c divides gamma by c^2 (rbf) or c (laplacian) and leaves K
unchanged) and, like the kernels themselves, translation-invariant: X + c, for any per-column
offset c, gives the same gamma. scikit-learn's SVC rule 1 / (n_features * X.var()) uses the
variance of all of X's entries, so per-column offsets count as spread there (columns offset by
1e9 and 3e8 give a gamma near 1e-18 and a numerically constant K); on data whose columns have
equal means the two rules agree.

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

Kernel blocks and matrices are built by :mod:`kkmgpu.kernels.blocks`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace

import numpy as np

from kkmgpu import _warn
from kkmgpu.kernels.gemm import DEFAULT_PRECISION, check_precision


KERNEL_NAMES = ("rbf", "polynomial", "sigmoid", "linear", "laplacian", "precomputed")


KERNEL_ALIASES = {"poly": "polynomial", "neural": "sigmoid", "tanh": "sigmoid", "gaussian": "rbf"}


_USES_GAMMA = ("rbf", "polynomial", "sigmoid", "laplacian")


DISTANCE_KERNELS = ("rbf", "laplacian")


#: translation-invariant kernels: computed from features centred on the data's mean
CENTERED_KERNELS = ("rbf", "laplacian", "linear")


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
    ``precision`` is the GEMM precision mode of every product of features (:mod:`kkmgpu.kernels.gemm`): whatever
    takes the spec (kernel blocks, the dense build, the tiled engine, predict) computes its products in it.
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
    precision: str = DEFAULT_PRECISION

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


def compute_dtype(storage: np.dtype) -> np.dtype:
    """Arithmetic precision for a storage precision: float16 storage is computed in float32."""
    return np.dtype(np.float32) if storage == np.float16 else storage


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
                   X=None, xp=np, precision=DEFAULT_PRECISION) -> KernelSpec:
    """Validate the kernel arguments and fill in the documented defaults from ``X``.

    ``X`` (n, d) is needed for the data-scale defaults of gamma; for "precomputed" it is unused. ``precision``:
    the GEMM precision mode of the kernel's products (ValueError naming the choices otherwise).
    """
    return replace(_resolve(kernel, gamma, degree, coef0, kernel_params, X, xp), precision=check_precision(precision))


def _resolve(kernel, gamma, degree, coef0, kernel_params, X, xp) -> KernelSpec:
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
        gamma = "scale" if name in DISTANCE_KERNELS else "auto"
    if isinstance(gamma, str):
        if gamma == "scale":
            gamma_value = scale_gamma(name, n_features, feature_variance(X, xp))
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


def feature_variance(X, xp) -> float:
    """The mean of X's per-feature centred variances, in float64 (``gamma="scale"``'s v): unchanged by any
    per-column offset, unlike the variance of all of X's entries. 0 for empty X."""
    if not X.size:
        return 0.0
    return float(xp.var(X.astype(xp.float64, copy=False), axis=0).mean())


def scale_gamma(name: str, n_features: int, var: float) -> float:
    """gamma="scale" for ``name`` from the number of features and the mean per-feature variance
    (:func:`feature_variance`).

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
        _warn.warn(
            f"{spec.describe()} is not translation invariant and X's mean (norm {math.sqrt(mean_sq):.3g}) is large "
            f"against its spread (total standard deviation {math.sqrt(spread):.3g}): in {compute.name} the inner "
            f"products <x, y> keep about {max(0.0, -math.log10(lost)):.1f} significant digits of what differs "
            "between points. Centre X first (or use dtype='float64') unless the offset is meant to matter.",
            PrecisionWarning)
