"""Off-the-grid bandwidth search for kernel k-means (papers/off-the-grid-bandwidth-search.txt).

Kernel convention: the paper writes the RBF kernel as k(x, y) = exp(-||x - y||^2 / sigma), so the
bandwidth sigma of this module is 1 / gamma of :func:`kkmgpu.fit` (``gamma = 1 / sigma``).

- :func:`bandwidth_lower_bound` — Theorem 1: for sigma <= min ||x - y||^2 / log(3 n) kernel k-means moves
  no point from any partition.
- :func:`fast_power` — Algorithm 1: element-wise b ** p with only products, square roots and divisions,
  within a factor (1 +- eps) of the exact power (Theorem 2).
- :func:`critical_bandwidth` — Algorithm 2: the smallest sigma' > sigma at which one kernel k-means step
  from a partition moves a point (Definition 1), bracketed by a dyadic walk of the exponent sigma / sigma'
  with one fused element-wise pass over K per step; :func:`binary_search_critical_bandwidth` is the
  paper's §7.3 baseline (bisection on sigma', exp recomputed per probe).
- :func:`search_bandwidth` — the search of §7.1: from a small sigma, the sequence of critical values, kernel
  k-means run to convergence at each, every distinct clustering scored by c-NNC (and NMI), then a
  hierarchical refinement around the best. :func:`search_mknn` and :func:`search_grid` are the paper's
  baselines with the same result type; :func:`search_polynomial_degree` is the same search over the
  degree of the polynomial kernel (§6.3).

Memory: the walk holds two n x n matrices (K and K') on the device; nothing n x n is made on the host.
"""

from __future__ import annotations

import math
import numbers
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from kkmgpu import _validation

from kkmgpu.bandwidth import offgrid as _offgrid
from kkmgpu.backend.device import check_fits, memory_advice, resolve_device
from kkmgpu.engine.lloyd import DenseKernelOperator, _argsort_stable, initial_labels, lloyd
from kkmgpu._progress import check_progress, progress_bar

__all__ = [
    "BandwidthClustering",
    "BandwidthSearchResult",
    "CriticalBandwidth",
    "bandwidth_lower_bound",
    "binary_search_critical_bandwidth",
    "critical_bandwidth",
    "fast_power",
    "search_bandwidth",
    "search_grid",
    "search_mknn",
    "search_polynomial_degree",
]

#: The paper's GRIDSEARCH values: sigma in {10^-6, ..., 10^6}.
GRID_SIGMAS = tuple(10.0 ** e for e in range(-6, 7))
#: Above this many pairs the 1st percentile of the pairwise squared distances is estimated from a sample.
PERCENTILE_EXACT_MAX_PAIRS = 4_000_000
PERCENTILE_SAMPLE_PAIRS = 1_000_000
MAX_DEPTH = 52


# --- results ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CriticalBandwidth:
    """The critical bandwidth of a partition (Definition 1), as bracketed by a search.

    Attributes
    ----------
    sigma : float
        The estimate: the smallest probed bandwidth at which a point moves (= ``upper``; any bandwidth
        above the critical value makes kernel k-means change the partition). ``inf`` if none was found.
    lower, upper : float
        The bracket: no point moves at ``lower``, a point moves at ``upper`` (``upper = inf`` when no move
        was found before the cap; ``lower = 0`` when points move at the given sigma already).
    n_steps : int
        Passes over K: fused element-wise steps (walk) or exp recomputations (binary search).
    n_full_checks, n_limited_checks : int
        One-step questions answered over all points, and limited checks (§6.2) tried.
    moved : ndarray of int64
        Indices (into the input order) of the points that move at ``upper`` in one assignment step.
    timings : dict
        Seconds: "validation", "kernel_build", "search", "checks" (part of "search"), "total".
    base_sigma : float
        The bandwidth the final dyadic level started from (sigma times a power of two).
    exponent_lower, exponent_upper : float
        base_sigma / lower and base_sigma / upper: dyadic rationals whose difference is 2^-depth.
    depth : int
    reason : str
        Why the search stopped without a bracket (cap, not a fixed point), else "".
    n_rebuilds : int
        Times K was recomputed from X because entries that underflowed at the start could matter.
    """

    sigma: float
    lower: float
    upper: float
    n_steps: int
    n_full_checks: int
    moved: np.ndarray
    timings: dict
    n_limited_checks: int = 0
    base_sigma: float = math.nan
    exponent_lower: float = math.nan
    exponent_upper: float = math.nan
    depth: int = 0
    reason: str = ""
    n_rebuilds: int = 0

    @property
    def gamma(self) -> float:
        """1 / sigma (the gamma of :func:`kkmgpu.fit`)."""
        return 1.0 / self.sigma if self.sigma > 0 else math.inf


@dataclass(frozen=True)
class BandwidthClustering:
    """One distinct clustering found by a bandwidth (or degree) search.

    Attributes
    ----------
    sigma : float or None
        The RBF bandwidth it was found at (k(x, y) = exp(-||x - y||^2 / sigma)); None for a degree search.
    gamma : float
        1 / sigma for the RBF kernel; the polynomial's gamma for a degree search.
    labels : ndarray of shape (n_samples,), int32
    objective : float
        Kernel k-means objective at its own sigma (not comparable across sigmas).
    cnnc : float
        c-NNC (paper §7; lower is better; comparable across sigmas).
    nmi : float or None
        NMI with ``y_true`` when given.
    n_iter : int
        Assignment steps of the kernel k-means run that produced it.
    depth : int
        Walk depth that revealed it: 0 for the run at the starting value and for the baselines.
    converged : bool
    degree : float or None
        The polynomial degree, for a degree search.
    """

    sigma: float | None
    gamma: float
    labels: np.ndarray
    objective: float
    cnnc: float
    nmi: float | None
    n_iter: int
    depth: int
    converged: bool = True
    degree: float | None = None

    @property
    def value(self) -> float:
        """The searched parameter: sigma, or the degree."""
        return self.degree if self.sigma is None else self.sigma


@dataclass(frozen=True)
class BandwidthSearchResult:
    """What :func:`search_bandwidth` and its baselines return.

    Attributes
    ----------
    method : str
        "offgrid", "grid", "mknn" or "polynomial-degree".
    parameter : str
        "sigma" or "degree".
    clusterings : tuple of BandwidthClustering
        Every distinct clustering found, in the order found.
    best_index : int
        Index of the lowest c-NNC (ties by the lower objective).
    evaluations : tuple of dict
        One per kernel k-means run: {"value", "clustering" (index), "depth", "seconds", "new"}.
    brackets : tuple of (float, float, int)
        (lower, upper, depth) of every critical value bracketed (Off-the-grid searches only).
    initial_labels : ndarray of int32
        The initial partition every run starts from (the paper's protocol).
    start : float
        sigma0 (or the starting degree).
    timings : dict
        Seconds: "validation", "kernel_build", "walk", "kernel_kmeans", "scoring", "total".
    costs : dict
        Counters: "kernel_builds" (exp passes), "fused_steps", "full_checks", "limited_checks",
        "limited_checks_decisive", "relayouts", "kernel_kmeans_runs", "kernel_kmeans_iterations".
    n_samples, n_clusters : int
    device, dtype : str
    warnings : tuple of str
        Kernel k-means runs that stopped at max_iter (also raised once as a ConvergenceWarning).
    """

    method: str
    parameter: str
    clusterings: tuple
    best_index: int
    evaluations: tuple
    brackets: tuple
    initial_labels: np.ndarray
    start: float
    timings: dict
    costs: dict
    n_samples: int
    n_clusters: int
    device: str
    dtype: str
    warnings: tuple = field(default=())

    @property
    def best(self) -> BandwidthClustering:
        """The clustering with the lowest c-NNC (ties: lower objective)."""
        return self.clusterings[self.best_index]

    @property
    def n_kernel_passes(self) -> int:
        """n x n passes spent: kernel builds, fused steps and full checks."""
        return int(self.costs.get("kernel_builds", 0) + self.costs.get("fused_steps", 0)
                   + self.costs.get("full_checks", 0))

    def summary(self) -> str:
        """A printable table of the clusterings (the best marked with *)."""
        name = "sigma" if self.parameter == "sigma" else "degree"
        has_nmi = any(c.nmi is not None for c in self.clusterings)
        head = f"  {'#':>3} {name:>12} {'gamma':>12} {'depth':>5} {'iter':>5} {'objective':>14} {'c-NNC':>8}"
        head += f" {'NMI':>6}" if has_nmi else ""
        lines = [f"{self.method} search, n={self.n_samples}, k={self.n_clusters}, {len(self.clusterings)} distinct "
                 f"clusterings, {len(self.evaluations)} kernel k-means runs, {self.timings.get('total', 0):.3g} s "
                 f"on {self.device} ({self.dtype})", head]
        for i, c in enumerate(self.clusterings):
            mark = "*" if i == self.best_index else " "
            row = (f"{mark} {i:>3} {c.value:>12.6g} {c.gamma:>12.6g} {c.depth:>5} {c.n_iter:>5} "
                   f"{c.objective:>14.8g} {c.cnnc:>8.4f}")
            if has_nmi:
                row += f" {c.nmi:>6.3f}" if c.nmi is not None else f" {'':>6}"
            lines.append(row)
        return "\n".join(lines)

    def __repr__(self) -> str:
        b = self.best
        return (f"BandwidthSearchResult(method={self.method!r}, n_clusterings={len(self.clusterings)}, "
                f"best {self.parameter}={b.value:.6g}, best c-NNC={b.cnnc:.4f}"
                + (f", best NMI={b.nmi:.3f}" if b.nmi is not None else "") + ")")

    def plot(self, ax=None):
        """c-NNC (left axis) and objective (right axis) against the parameter, log scale; best marked.

        Parameters
        ----------
        ax : matplotlib Axes, optional
            Where to draw; a new figure by default.

        Returns
        -------
        matplotlib Axes
            The left axes (c-NNC); the objective is on its twin.

        Raises
        ------
        ImportError
            If matplotlib is not installed.
        """
        try:
            import matplotlib.pyplot as plt
        except ImportError as exc:  # pragma: no cover - exercised only without matplotlib
            raise ImportError("plot needs matplotlib: pip install kkmgpu[plot]") from exc
        if ax is None:
            _, ax = plt.subplots(figsize=(6, 3.5))
        order = sorted(range(len(self.clusterings)), key=lambda i: self.clusterings[i].value)
        values = np.array([self.clusterings[i].value for i in order])
        cnnc = np.array([self.clusterings[i].cnnc for i in order])
        objective = np.array([self.clusterings[i].objective for i in order])
        ax.plot(values, cnnc, marker="o", color="C0", label="c-NNC")
        best = self.best
        ax.plot([best.value], [best.cnnc], marker="*", markersize=14, color="C3", linestyle="none",
                label=f"best ({self.parameter}={best.value:.3g})")
        if self.parameter == "sigma":
            ax.set_xscale("log")
        ax.set_xlabel("sigma (k(x, y) = exp(-||x - y||^2 / sigma))" if self.parameter == "sigma" else "degree")
        ax.set_ylabel("c-NNC (lower is better)", color="C0")
        twin = ax.twinx()
        twin.plot(values, objective, marker=".", color="C1", alpha=0.7, label="objective")
        twin.set_ylabel("kernel k-means objective", color="C1")
        ax.legend(loc="best", fontsize="small")
        ax.set_title(f"{self.method} search, k={self.n_clusters}")
        return ax


# --- validation helpers ------------------------------------------------------------------------------------

def _check_positive(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a finite number > 0.")
    return float(value)


def _check_depth(depth, name="depth", minimum=1):
    return _validation.check_int(depth, name, minimum=minimum, maximum=MAX_DEPTH)


def _check_walk_dtype(dtype):
    dt = _validation.check_dtype(dtype)
    if dt == np.float16:
        raise ValueError("dtype='float16' is not supported by the bandwidth search (square roots of half-precision "
                         "kernel values lose the exponent's precision); use 'float32' or 'float64'.")
    return dt


def _check_labels(labels, n):
    if labels is None:
        raise ValueError("labels are required: the partition whose critical bandwidth is sought.")
    a = labels.get() if hasattr(labels, "get") and not isinstance(labels, np.ndarray) else np.asarray(labels)
    if a.ndim != 1 or a.shape[0] != n:
        raise ValueError(f"labels have shape {a.shape}; expected ({n},), one label per sample.")
    if a.dtype.kind not in "iu":
        if a.dtype.kind == "f" and np.isfinite(a).all() and (a == np.round(a)).all():
            a = a.astype(np.int64)
        else:
            raise ValueError(f"labels have dtype {a.dtype}; integer cluster indices are required.")
    if n and a.min() < 0:
        raise ValueError(f"labels must be >= 0; got the value {int(a.min())}.")
    return a.astype(np.int32), int(a.max()) + 1 if n else 0


def _check_rbf_matrix(K, backend):
    """K must be a symmetric matrix of RBF values: finite, in [0, 1], unit diagonal."""
    xp = backend.xp
    if K.dtype.kind != "f" or K.dtype == np.float16:
        raise ValueError(f"K has dtype {K.dtype}; a float32 or float64 RBF kernel matrix is required.")
    tol = 1e3 * float(np.finfo(K.dtype).eps)
    diag = xp.diagonal(K)
    worst = float(xp.abs(diag.astype(xp.float64) - 1.0).max())
    if worst > tol:
        raise ValueError(f"K is not an RBF kernel matrix: its diagonal must be 1 (exp(0)); max |K_ii - 1| = "
                         f"{worst:.3g} > {tol:.1g}.")
    lo, hi = float(K.min()), float(K.max())
    if lo < 0 or hi > 1 + tol:
        raise ValueError(f"K is not an RBF kernel matrix: its entries must lie in [0, 1]; got values in "
                         f"[{lo:.3g}, {hi:.3g}].")
    _validation.check_symmetric(K, backend)


def _percentile_sigma(A, backend, rng, q=1.0):
    """The q-th percentile of the pairwise squared distances (pairs i < j): exact for up to
    PERCENTILE_EXACT_MAX_PAIRS pairs, else from PERCENTILE_SAMPLE_PAIRS pairs drawn with ``rng``."""
    xp = backend.xp
    n = A.shape[0]
    pairs = n * (n - 1) // 2
    if pairs <= PERCENTILE_EXACT_MAX_PAIRS:
        a_sq = (A * A).sum(axis=1)
        step = _offgrid.tile_rows(n, 8, backend)
        values = []
        for i0 in range(0, n, step):
            i1 = min(n, i0 + step)
            D = _offgrid._distance_tile(A, a_sq, i0, i1, xp)
            upper = xp.arange(n)[None, :] > xp.arange(i0, i1)[:, None]
            values.append(backend.to_host(D[upper]))
        d = np.concatenate(values)
    else:
        i = rng.integers(0, n, size=PERCENTILE_SAMPLE_PAIRS)
        j = rng.integers(0, n - 1, size=PERCENTILE_SAMPLE_PAIRS)
        j = j + (j >= i)
        # in chunks: 1M pairs x d features at once would be 6.3 GB per temporary for d = 784
        chunk = max(1, _offgrid.tile_rows(A.shape[1], 2 * 8, backend))
        d = np.empty(PERCENTILE_SAMPLE_PAIRS, dtype=np.float64)
        for p0 in range(0, PERCENTILE_SAMPLE_PAIRS, chunk):
            p1 = min(PERCENTILE_SAMPLE_PAIRS, p0 + chunk)
            diff = A[backend.asarray(i[p0:p1])] - A[backend.asarray(j[p0:p1])]
            d[p0:p1] = backend.to_host((diff * diff).sum(axis=1))
    value = float(np.percentile(d, q))
    if value <= 0:
        positive = d[d > 0]
        if positive.size == 0:
            raise ValueError("every pair of points coincides; there is no bandwidth to search.")
        warnings.warn(f"at least {q:g}% of the point pairs are duplicates (squared distance 0); sigma0 is the "
                      f"{q:g}th percentile of the positive squared distances instead.", UserWarning, stacklevel=3)
        value = float(np.percentile(positive, q))
    return value


# --- Theorem 1 and Algorithm 1 -----------------------------------------------------------------------------

def bandwidth_lower_bound(X, *, device="auto") -> float:
    """Theorem 1's bound: for sigma <= min ||x - y||^2 / log(3 n) kernel k-means moves no point.

    With the RBF kernel exp(-||x - y||^2 / sigma) (gamma = 1 / sigma), every off-diagonal kernel value is
    then <= 1 / (3 n), and from *any* partition no point is nearer (in feature space) to another cluster's
    mean than to its own. The minimum is over pairs of distinct points, found in row tiles on the device
    (GEMM-form distances locate the closest pairs, whose distances are then recomputed as ||x - y||^2
    directly); no n x n matrix is made.

    Duplicate points: Theorem 1 assumes distinct points (two copies of a point have kernel value 1 at every
    sigma, and kernel k-means can move a copy at any bandwidth when the copies are split between clusters).
    With duplicates the bound is computed over the pairs at positive distance and a UserWarning names the
    number of duplicated points; the guarantee then holds for partitions that keep copies together.

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
        NumPy or CuPy array, n_samples >= 2.
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"

    Returns
    -------
    float
        min_{x != y} ||x - y||^2 / log(3 n).

    Raises
    ------
    ValueError
        If X has fewer than 2 rows, is not finite, or all its points coincide.

    Examples
    --------
    >>> import numpy as np, kkmgpu
    >>> X = np.array([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]])
    >>> round(kkmgpu.bandwidth_lower_bound(X, device="cpu"), 5)   # 1 / log(9)
    0.45512
    """
    backend = resolve_device(device, (X,))
    with backend.activate():
        X = _validation.check_data(X, backend)
        n = X.shape[0]
        if n < 2:
            raise ValueError(f"X has {n} row; the bound needs at least 2 points.")
        A = _offgrid.centered_features(X, backend)
        d_min, dup_pairs, dup_points = _offgrid.min_pairwise_sq_distance(A, backend)
    if not math.isfinite(d_min) or d_min <= 0:
        raise ValueError("every pair of points in X coincides; Theorem 1's bound is undefined.")
    if dup_pairs:
        warnings.warn(f"X has {dup_points} duplicated points ({dup_pairs} pairs at distance 0); the bound is taken "
                      "over the pairs at positive distance, and it guarantees no moves only for partitions that "
                      "keep identical points in the same cluster (Theorem 1 assumes distinct points).",
                      UserWarning, stacklevel=2)
    return d_min / math.log(3.0 * n)


def fast_power(B, p, depth):
    """Algorithm 1: element-wise B ** p from products, square roots and divisions only.

    p = z + f with z integral and f in [0, 1): B ** z by repeated squaring (Lemma 1), B ** f' with f' the
    dyadic rational within 2^-depth of f reached by the +-2^-j steps of Lemma 2 over the successive
    square roots of B. So the result r satisfies B ** (p - 2^-depth) <= r <= B ** (p + 2^-depth) up to
    rounding: a (1 +- eps) approximation of B ** p with eps = exp(|log B| 2^-depth) - 1 (Theorem 2).
    On 2-D float32 / float64 arrays each fractional step is one fused pass (``offgrid_step``).

    Parameters
    ----------
    B : array
        Positive finite values (NumPy or CuPy; array-likes become NumPy). Integer arrays are computed in float64.
    p : float
        Exponent > 0.
    depth : int
        Dyadic depth of the fractional part, 1 <= depth <= 52.

    Returns
    -------
    array of B's shape, the same kind (NumPy or CuPy) as B

    Raises
    ------
    ValueError
        If B has a value <= 0 or not finite, p <= 0, or depth is out of range.

    Examples
    --------
    >>> import numpy as np, kkmgpu
    >>> r = kkmgpu.fast_power(np.array([2.0, 0.5]), 2.5, depth=1)   # 2.5 is dyadic at depth 1: exact
    >>> np.allclose(r, [2.0 ** 2.5, 0.5 ** 2.5])
    True
    """
    from kkmgpu.backend.device import Backend, is_cupy_array

    p = _check_positive(p, "p")
    depth = _check_depth(depth)
    if is_cupy_array(B):
        backend = Backend("cuda", int(B.device.id))
    else:
        backend = Backend("cpu")
        B = np.asarray(B)
    xp = backend.xp
    with backend.activate():
        if B.dtype.kind not in "biuf":
            raise ValueError(f"B has dtype {B.dtype}; real positive values are required.")
        if B.dtype.kind != "f" or B.dtype == np.float16:
            B = B.astype(xp.float64)
        if B.size and not bool(xp.isfinite(B).all()):
            raise ValueError("B contains NaN or infinity; fast_power needs finite positive values.")
        if B.size and float(B.min()) <= 0:
            raise ValueError(f"B has values <= 0 (min {float(B.min()):.3g}); fast_power needs B > 0 "
                             "(square roots and real powers of negative numbers are not defined).")
        return _offgrid.fast_power_inplace(xp.ascontiguousarray(B), p, depth, backend)


# --- shared machinery: layout, kernel k-means runs, scoring ------------------------------------------------

class _Layout:
    """Points held in a permuted order (K in cluster order for the limited checks).

    ``order[i]`` is the input index of the point at position i.
    """

    def __init__(self, backend, n, weights_h):
        self.backend = backend
        self.order = backend.xp.arange(n, dtype=backend.xp.int64)
        self.weights = backend.asarray(weights_h)

    def to_input(self, labels_l):
        xp = self.backend.xp
        out = xp.empty_like(labels_l)
        out[self.order] = labels_l
        return self.backend.to_host(out).astype(np.int32)

    def from_input(self, labels_h):
        return self.backend.asarray(np.asarray(labels_h, dtype=np.int32))[self.order]

    def regroup(self, K, Kp, labels_l, k, limited, costs):
        """Kp <- K for the walk; in cluster order (K permuted too) when the limited checks will be used."""
        xp = self.backend.xp
        labels_h = self.backend.to_host(labels_l)
        if limited and _worth_limiting(labels_h, k) and (np.diff(labels_h) < 0).any():
            perm = _argsort_stable(xp, labels_l).astype(xp.int64)
            _offgrid.permute_into(Kp, K, perm, self.backend)
            xp.copyto(K, Kp)
            self.order = self.order[perm]
            self.weights = self.weights[perm]
            costs["relayouts"] += 1
            return labels_l[perm]
        xp.copyto(Kp, K)
        return labels_l


def _worth_limiting(labels_h, k):
    counts = np.bincount(labels_h, minlength=k).astype(np.float64)
    n = labels_h.size
    m = min(n, max(32, n // (4 * max(1, k))))
    return k > 1 and (np.sum(counts ** 2) + m * n) / max(1, n) ** 2 < _offgrid.LIMITED_CHECK_MAX_COST


def _canonical(labels_h):
    """Labels renumbered by first appearance: equal for the same partition under any label permutation."""
    _, first, inverse = np.unique(labels_h, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return rank[inverse.ravel()]


class _Recorder:
    """Distinct clusterings with their scores, the evaluations, costs and timings of one search."""

    def __init__(self, X, k, backend, y_true, method, parameter, bar=None):
        self.X = X
        self.bar = progress_bar(desc="", enabled=False) if bar is None else bar
        self.k = k
        self.backend = backend
        self.y_true = y_true
        self.method = method
        self.parameter = parameter
        self.clusterings = []
        self.keys = {}
        self.evaluations = []
        self.brackets = []
        self.warnings = []
        self.timings = {"validation": 0.0, "kernel_build": 0.0, "walk": 0.0, "kernel_kmeans": 0.0, "scoring": 0.0}
        self.costs = {"kernel_builds": 0, "fused_steps": 0, "full_checks": 0, "limited_checks": 0,
                      "limited_checks_decisive": 0, "relayouts": 0, "kernel_kmeans_runs": 0,
                      "kernel_kmeans_iterations": 0, "rebuilds": 0}
        self._scorer = None

    def _cnnc(self, labels_h):
        if self._scorer is None:
            try:
                from kkmgpu.metrics.cnnc import CnncScorer
                self._scorer = CnncScorer(self.X, self.backend)
            except ImportError:  # the public function is the contract; the scorer reuses the neighbour order
                from kkmgpu.metrics import cnnc
                self._scorer = lambda labels, k: cnnc(self.X, labels, k, device=self.backend.name)
        return float(self._scorer(labels_h, self.k))

    def record(self, value, labels_h, run, depth, seconds, *, sigma=None, gamma=None, degree=None):
        """Add one kernel k-means result; returns its clustering index."""
        key = _canonical(labels_h).tobytes()
        new = key not in self.keys
        if new:
            t0 = time.perf_counter()
            score = self._cnnc(labels_h)
            nmi = None
            if self.y_true is not None:
                from kkmgpu.metrics import nmi as _nmi
                nmi = float(_nmi(self.y_true, labels_h))
            self.timings["scoring"] += time.perf_counter() - t0
            labels_ro = labels_h.copy()
            labels_ro.flags.writeable = False
            self.keys[key] = len(self.clusterings)
            self.clusterings.append(BandwidthClustering(
                sigma=sigma, gamma=gamma, labels=labels_ro, objective=float(run.objective), cnnc=score, nmi=nmi,
                n_iter=int(run.n_iter), depth=int(depth), converged=bool(run.converged), degree=degree))
        index = self.keys[key]
        self.evaluations.append({"value": float(value), "clustering": index, "depth": int(depth),
                                 "seconds": float(seconds), "new": new})
        self.bar.update()
        best = self.clusterings[self.best_index()]
        self.bar.set_postfix_str(f"{self.parameter} {value:.4g}, {len(self.clusterings)} clusterings, "
                                 f"best c-NNC {best.cnnc:.4f}")
        return index

    def best_index(self):
        return min(range(len(self.clusterings)),
                   key=lambda i: (self.clusterings[i].cnnc, self.clusterings[i].objective))

    def add_question(self, question):
        self.costs["full_checks"] += question.n_full
        self.costs["limited_checks"] += question.n_limited
        self.costs["limited_checks_decisive"] += question.n_limited_decisive

    def result(self, initial_labels, start, n, device, dtype, t_start):
        self.bar.close()
        self.timings["total"] = time.perf_counter() - t_start
        if self.warnings:
            from kkmgpu.engine.lloyd import ConvergenceWarning
            warnings.warn(f"{self.method} search: {len(self.warnings)} kernel k-means runs did not reach a fixed "
                          "point; increase max_iter.", ConvergenceWarning, stacklevel=3)
        init = np.asarray(initial_labels, dtype=np.int32).copy()
        init.flags.writeable = False
        return BandwidthSearchResult(
            method=self.method, parameter=self.parameter, clusterings=tuple(self.clusterings),
            best_index=self.best_index(), evaluations=tuple(self.evaluations), brackets=tuple(self.brackets),
            initial_labels=init, start=float(start), timings=dict(self.timings), costs=dict(self.costs),
            n_samples=n, n_clusters=self.k, device=device, dtype=dtype, warnings=tuple(self.warnings))


def _run_kernel_kmeans(K, weights, labels_l, k, backend, max_iter, tol, recorder, verbose=False):
    """Kernel k-means on K from ``labels_l`` until no point moves: Lloyd with ``tol``, then continued with
    tol=0 when it stopped on the objective (a fixed point is what the critical value refers to)."""
    t0 = time.perf_counter()
    operator = DenseKernelOperator(K, weights, backend)
    run = lloyd(operator, labels_l, k, max_iter=max_iter, tol=tol, verbose=verbose)
    iterations = run.n_iter
    if run.stop_reason != "no point moved":
        more = lloyd(operator, run.labels, k, max_iter=max_iter, tol=0.0, verbose=verbose)
        iterations += more.n_iter
        more.n_iter = iterations
        run = more
    if not run.converged:
        recorder.warnings.append(f"kernel k-means did not reach a fixed point in max_iter={max_iter} steps")
    recorder.costs["kernel_kmeans_runs"] += 1
    recorder.costs["kernel_kmeans_iterations"] += int(iterations)
    seconds = backend.timer() - t0
    recorder.timings["kernel_kmeans"] += seconds
    return run, seconds


def _prepare(X, k, device, dtype, sample_weight, y_true, random_state, init):
    backend = resolve_device(device, (X,))
    dt = _check_walk_dtype(dtype)
    rng = _validation.make_rng(random_state)
    with backend.activate():
        X = _validation.check_data(X, backend)
        n = X.shape[0]
        k = _validation.check_k(k, n)
        if n < 2:
            raise ValueError(f"X has {n} row; a bandwidth search needs at least 2 points.")
        weights_h = _validation.check_sample_weight(sample_weight, n)
        if (weights_h > 0).sum() < k:
            raise ValueError(f"only {(weights_h > 0).sum()} samples have a positive sample_weight; "
                             f"at least k={k} are required.")
        if isinstance(init, str) and init not in _validation.INIT_NAMES:
            raise ValueError(f"init={init!r} is not valid; use one of {list(_validation.INIT_NAMES)} or an "
                             "array of labels.")
        init, _ = _validation.check_init(init, n, k, 1)
        if y_true is not None:
            y_true = (y_true.get() if hasattr(y_true, "get") and not isinstance(y_true, np.ndarray)
                      else np.asarray(y_true))
            if y_true.ndim != 1 or y_true.shape[0] != n:
                raise ValueError(f"y_true has shape {y_true.shape}; expected ({n},), one label per sample.")
    return backend, dt, rng, X, n, k, weights_h, init, y_true


def _check_common(max_iter, tol, max_values):
    max_iter = _validation.check_int(max_iter, "max_iter", minimum=1)
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not np.isfinite(tol) or tol < 0:
        raise ValueError(f"tol={tol!r} must be a finite number >= 0.")
    max_values = _validation.check_int(max_values, "max_values", minimum=1)
    return max_iter, float(tol), max_values


def _alloc_pair(n, dt, backend):
    check_fits(2 * n * n * dt.itemsize, backend, f"the two {n} x {n} {dt.name} matrices K and K' of the walk",
               advice=memory_advice(dtype=dt, method="search"))
    xp = backend.xp
    return xp.empty((n, n), dtype=dt), xp.empty((n, n), dtype=dt)


# --- Algorithm 2 -------------------------------------------------------------------------------------------

def critical_bandwidth(X=None, labels=None, *, K=None, sigma, depth=10, sample_weight=None, limit_checks=True,
                       max_sigma=None, dtype="float64", device="auto", verbose=False) -> CriticalBandwidth:
    """The critical bandwidth of a partition (Definition 1) by Algorithm 2's dyadic walk.

    For sigma' > sigma, K_sigma' = K_sigma ** p element-wise with p = sigma / sigma' (paper §5.1). The walk
    keeps K = K_base ** e and K' = K_base ** 2^-j and moves e by +-2^-j with one fused pass over both
    (K' <- sqrt(K'); K <- K / K' when no point moved at the last probe, K * K' when one did; see
    :mod:`kkmgpu.bandwidth.offgrid` on the pseudocode's branches). At each probe it asks one question — would one
    kernel k-means assignment step from ``labels`` move any point? — first of the candidate points only
    (§6.2's limiting checks: those whose nearest other cluster is closest, and those that moved at the last
    change; only when one clearly moves), else of all points, so the answer is the full check's.

    Doubling phase: probe 2 sigma_base; while no point moves, 2 sigma_base becomes the base (no copy: K and
    K' are both K_base ** (1/2) then). Bisection phase: ``depth - 1`` further probes in the exponent interval
    [1/2, 1], so the returned bracket satisfies base_sigma / lower - base_sigma / upper = 2^-depth; the
    relative width of the bracket in sigma is at most 2^(1 - depth). The critical value lies in
    [lower, upper] (exactly when the set of moving bandwidths is an interval above it, which Definition 1
    does not promise in general).

    Cap: the doubling stops, with ``upper = inf``, when the next probe lies where no point can move (with X:
    if ``labels`` is a strict fixed point of plain k-means with smallest gap g, no point moves at any
    sigma' >= 0.75 max D^2 / g, since sigma dist_sigma(i, c) -> 2 ||x_i - m_c||^2), when K is all ones to the
    dtype's precision (max_ij D_ij / sigma_base < sqrt(eps): rounding would decide), or when the next probe
    would exceed ``max_sigma``.

    Underflow: kernel values below the smallest normal number are clamped to it. They can matter once the
    walk has doubled sigma a few times (float32: once, float64: 3-4 times); with X given, K is then
    recomputed from X at the current base (counted in ``n_rebuilds``); with only K given a UserWarning says
    that those entries are not known.

    Parameters
    ----------
    X : array of shape (n_samples, n_features), optional
        The data; K_sigma is built from it (RBF, exp(-||x - y||^2 / sigma), float64 arithmetic).
    labels : array of shape (n_samples,)
        The partition, normally converged kernel k-means output at sigma; integers >= 0.
    K : array of shape (n_samples, n_samples), optional
        Instead of X: the RBF kernel matrix at bandwidth ``sigma`` (symmetric, unit diagonal, values in
        [0, 1]); it is copied, not modified.
    sigma : float
        The bandwidth of K (gamma = 1 / sigma).
    depth : int, default=10
        Probes in the final dyadic level, 1 <= depth <= 52.
    sample_weight : array of shape (n_samples,), optional
    limit_checks : bool, default=True
        Use §6.2's limited checks where their expected reads are below half a full pass (K is then held
        in cluster order); the answers are the same either way.
    max_sigma : float, optional
        Do not probe beyond this bandwidth.
    dtype : {"float64", "float32"}, default="float64"
        Precision of K and K' when built from X (with K given: K's dtype).
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
    verbose : bool, default=False

    Returns
    -------
    CriticalBandwidth
        ``sigma`` (= ``upper``), the bracket, the moving points at ``upper``, counts and timings. If points
        move at ``sigma`` already (labels not a fixed point) it returns lower=0, upper=sigma with a warning.

    Raises
    ------
    ValueError
        Neither or both of X and K, K not an RBF matrix, bad labels (length, not integers, negative),
        sigma <= 0, depth out of [1, 52], dtype float16, bad sample_weight.
    InsufficientMemoryError
        If K and K' (two n x n arrays) do not fit the device.

    Examples
    --------
    >>> import kkmgpu
    >>> X, y = kkmgpu.datasets.make_two_circles(100, random_state=0)
    >>> labels = kkmgpu.fit(X, 2, gamma=10.0, init="random", random_state=0, device="cpu", dtype="float64",
    ...                     tol=0.0).labels                        # a fixed point at sigma = 1 / 10
    >>> cb = kkmgpu.critical_bandwidth(X, labels, sigma=0.1, depth=8, device="cpu")
    >>> bool(cb.lower < cb.upper), round(cb.base_sigma / cb.lower - cb.base_sigma / cb.upper, 6)
    (True, 0.003906)
    """
    t_start = time.perf_counter()
    if (X is None) == (K is None):
        raise ValueError("pass exactly one of X (the data) and K (the RBF kernel matrix at sigma).")
    sigma = _check_positive(sigma, "sigma")
    depth = _check_depth(depth)
    if max_sigma is not None:
        max_sigma = _check_positive(max_sigma, "max_sigma")
    source = X if K is None else K
    backend = resolve_device(device, (source,))
    xp = backend.xp
    with backend.activate():
        source = _validation.check_data(source, backend, name="X" if K is None else "K", square=K is not None)
        n = source.shape[0]
        labels_h, k = _check_labels(labels, n)
        weights_h = _validation.check_sample_weight(sample_weight, n)
        if K is not None:
            _check_rbf_matrix(source, backend)
            dt = np.dtype(source.dtype)
        else:
            dt = _check_walk_dtype(dtype)
            A_input = _offgrid.centered_features(source, backend)
        t_valid = backend.timer()

        layout = _Layout(backend, n, weights_h)
        use_limited = bool(limit_checks) and depth > 1 and _worth_limiting(labels_h, k)
        if use_limited:
            perm = _argsort_stable(np, labels_h).astype(np.int64)
            layout.order = backend.asarray(perm)
            layout.weights = backend.asarray(weights_h[perm])
        labels_l = layout.from_input(labels_h)
        Kw, Kp = _alloc_pair(n, dt, backend)
        if K is None:
            A = A_input[layout.order]
            info = _offgrid.BaseInfo(sigma, *_offgrid.fill_rbf(Kw, A, sigma, backend))

            def rebuild(Kbuf, s):
                return _offgrid.BaseInfo(s, *_offgrid.fill_rbf(Kbuf, A, s, backend))
        else:
            _offgrid.permute_into(Kw, source, layout.order, backend)
            floor = _offgrid.tiny(dt)
            n_clamped = int((Kw < floor).sum())
            smallest = float(Kw.min())
            if n_clamped:
                xp.maximum(Kw, floor, out=Kw)
            info = _offgrid.BaseInfo(sigma, n_clamped, smallest)
            rebuild = None
        t_kernel = backend.timer()

        question = _offgrid.OneStepQuestion(backend, labels_l, layout.weights, k, limited=use_limited)
        timings = {"validation": t_valid - t_start, "kernel_build": t_kernel - t_valid}
        nonempty = int((np.bincount(labels_h, minlength=k) > 0).sum())
        if nonempty <= 1:
            return _critical_result(math.inf, sigma, math.inf, 0, question, np.empty(0, np.int64), timings,
                                    t_kernel, t_start, backend, sigma, depth,
                                    "a single non-empty cluster: no point can change cluster")
        n_moved, moved = question.full(Kw)
        if n_moved:
            warnings.warn(f"labels are not a fixed point of kernel k-means at sigma={sigma:g}: {n_moved} points "
                          "move already, so the critical bandwidth is <= sigma (lower=0, upper=sigma).",
                          UserWarning, stacklevel=2)
            moved_h = np.sort(backend.to_host(layout.order[moved]).astype(np.int64))
            return _critical_result(sigma, 0.0, sigma, 0, question, moved_h, timings, t_kernel, t_start, backend,
                                    sigma, depth, "labels are not a fixed point at sigma")
        xp.copyto(Kp, Kw)
        beyond = (None if K is not None else
                  _offgrid.linear_regime_sigma(A, labels_l, layout.weights, k, backend))
        outcome = _offgrid.walk_rbf(Kw, Kp, question, sigma, depth, backend, info=info, rebuild=rebuild,
                                    max_sigma=max_sigma, no_move_beyond=beyond, verbose=verbose)
        for msg in outcome.warnings:
            warnings.warn(msg, UserWarning, stacklevel=2)
        if not outcome.found:
            return _critical_result(math.inf, outcome.base, math.inf, outcome.n_steps, question,
                                    np.empty(0, np.int64), timings, t_kernel, t_start, backend, outcome.base, depth,
                                    outcome.capped, n_rebuilds=outcome.n_rebuilds)
        lower = outcome.base / outcome.e_lower
        upper = outcome.base / outcome.e_upper
        n_moved, moved = question.full(Kw)         # the exact set of movers at upper (K holds K_upper)
        moved_h = (np.sort(backend.to_host(layout.order[moved]).astype(np.int64)) if n_moved
                   else np.empty(0, np.int64))
        return _critical_result(upper, lower, upper, outcome.n_steps, question, moved_h, timings, t_kernel, t_start,
                                backend, outcome.base, depth, "" if n_moved else
                                "rounding: the full check at upper found no mover", e=(outcome.e_lower,
                                                                                       outcome.e_upper),
                                n_rebuilds=outcome.n_rebuilds)


def _critical_result(estimate, lower, upper, n_steps, question, moved, timings, t_search, t_start, backend,
                     base, depth, reason, e=(math.nan, math.nan), n_rebuilds=0):
    t_end = backend.timer()
    timings = dict(timings)
    timings["search"] = t_end - t_search
    timings["checks"] = question.seconds
    timings["total"] = t_end - t_start
    moved = np.asarray(moved, dtype=np.int64)
    moved.flags.writeable = False
    return CriticalBandwidth(sigma=float(estimate), lower=float(lower), upper=float(upper), n_steps=int(n_steps),
                             n_full_checks=question.n_full, moved=moved, timings=timings,
                             n_limited_checks=question.n_limited, base_sigma=float(base), exponent_lower=float(e[0]),
                             exponent_upper=float(e[1]), depth=int(depth), reason=reason, n_rebuilds=int(n_rebuilds))


def binary_search_critical_bandwidth(X=None, labels=None, *, K=None, D=None, sigma, precision=1e-3, rtol=None,
                                     sigma_max=None, sample_weight=None, limit_checks=True, dtype="float64",
                                     device="auto", verbose=False) -> CriticalBandwidth:
    """The paper's §7.3 baseline: bisection on sigma', K = exp(-D / sigma') recomputed at every probe.

    D (the squared distances) is computed once, from X, or taken as given, or recovered from K as
    -sigma log K; each probe is one copy and one fused exp pass over the n x n matrix, followed by the same
    one-step question as :func:`critical_bandwidth`. The bracket starts at [sigma, sigma_max] (the paper used
    sigma_max = 1e6); with ``sigma_max=None`` the upper end is found by doubling sigma (as the walk does).
    Bisection stops when upper - lower <= precision (absolute, as in the paper) or, with ``rtol``,
    when upper - lower <= rtol * lower.

    Parameters
    ----------
    X, labels, K, sigma, sample_weight, limit_checks, dtype, device, verbose
        As for :func:`critical_bandwidth`.
    D : array of shape (n_samples, n_samples), optional
        Squared Euclidean distances, instead of X or K.
    precision : float, default=1e-3
        Absolute precision on sigma'.
    rtol : float, optional
        Relative precision on sigma' (stop at whichever of the two is reached first).
    sigma_max : float, optional
        Initial upper end of the bracket; ``upper = inf`` if no point moves there.

    Returns
    -------
    CriticalBandwidth
        ``n_steps`` counts the exp recomputations (probes).
    """
    t_start = time.perf_counter()
    given = [a is not None for a in (X, K, D)]
    if sum(given) != 1:
        raise ValueError("pass exactly one of X (the data), K (the RBF kernel matrix at sigma) and D (squared "
                         "distances).")
    sigma = _check_positive(sigma, "sigma")
    precision = _check_positive(precision, "precision")
    if rtol is not None:
        rtol = _check_positive(rtol, "rtol")
    if sigma_max is not None:
        sigma_max = _check_positive(sigma_max, "sigma_max")
        if sigma_max <= sigma:
            raise ValueError(f"sigma_max={sigma_max:g} must be > sigma={sigma:g}.")
    source = X if X is not None else (K if K is not None else D)
    backend = resolve_device(device, (source,))
    xp = backend.xp
    with backend.activate():
        source = _validation.check_data(source, backend, name="X" if X is not None else ("K" if K is not None
                                                                                          else "D"),
                                        square=X is None)
        n = source.shape[0]
        labels_h, k = _check_labels(labels, n)
        weights_h = _validation.check_sample_weight(sample_weight, n)
        if K is not None:
            _check_rbf_matrix(source, backend)
            dt = np.dtype(source.dtype)
        elif D is not None:
            dt = _check_walk_dtype(dtype)
            if float(source.min()) < 0:
                raise ValueError("D has negative entries; squared distances are >= 0.")
            _validation.check_symmetric(source, backend)
        else:
            dt = _check_walk_dtype(dtype)
        t_valid = backend.timer()

        layout = _Layout(backend, n, weights_h)
        use_limited = bool(limit_checks) and _worth_limiting(labels_h, k)
        if use_limited:
            perm = _argsort_stable(np, labels_h).astype(np.int64)
            layout.order = backend.asarray(perm)
            layout.weights = backend.asarray(weights_h[perm])
        labels_l = layout.from_input(labels_h)
        G, Kw = _alloc_pair(n, dt, backend)        # G = -D / 2 and the probe's K
        if X is not None:
            _offgrid.fill_neg_half_distances(G, _offgrid.centered_features(source, backend)[layout.order], backend)
        else:
            _offgrid.permute_into(G, source, layout.order, backend)
            if K is not None:
                if int((G <= 0).sum()):
                    warnings.warn("K has entries that underflowed to 0; their distances are unknown and taken as "
                                  f"-sigma log(tiny) ({_offgrid.exp_log_range(dt):.0f} sigma).", UserWarning,
                                  stacklevel=2)
                xp.maximum(G, _offgrid.tiny(dt), out=G)
                xp.log(G, out=G)
                G *= 0.5 * sigma                     # -D / 2 = (sigma / 2) log K
            else:
                G *= -0.5
        zeros = xp.zeros(n, dtype=dt)
        d_max = -2.0 * float(G.min())
        t_kernel = backend.timer()

        question = _offgrid.OneStepQuestion(backend, labels_l, layout.weights, k, limited=use_limited)
        timings = {"validation": t_valid - t_start, "kernel_build": t_kernel - t_valid}
        probes = 0

        def moves_at(s, allow_limited):
            nonlocal probes
            _offgrid.rbf_from_neg_half(Kw, G, s, backend, zeros)
            probes += 1
            moved, idx = question.ask(Kw, allow_limited=allow_limited)
            if verbose:
                print(f"[kkmgpu] binary search: sigma'={s:.8g}: {'a point moves' if moved else 'no move'}")
            return moved

        if int((np.bincount(labels_h, minlength=k) > 0).sum()) <= 1:
            return _critical_result(math.inf, sigma, math.inf, 0, question, np.empty(0, np.int64), timings,
                                    t_kernel, t_start, backend, sigma, 0,
                                    "a single non-empty cluster: no point can change cluster")
        _offgrid.rbf_from_neg_half(Kw, G, sigma, backend, zeros)
        probes += 1
        n_moved, moved = question.full(Kw)
        if n_moved:
            warnings.warn(f"labels are not a fixed point of kernel k-means at sigma={sigma:g}: {n_moved} points "
                          "move already, so the critical bandwidth is <= sigma (lower=0, upper=sigma).",
                          UserWarning, stacklevel=2)
            moved_h = np.sort(backend.to_host(layout.order[moved]).astype(np.int64))
            return _critical_result(sigma, 0.0, sigma, probes, question, moved_h, timings, t_kernel, t_start,
                                    backend, sigma, 0, "labels are not a fixed point at sigma")
        lower = sigma
        flat = _offgrid.flat_log(dt)
        if sigma_max is not None:
            if not moves_at(sigma_max, False):
                return _critical_result(math.inf, sigma_max, math.inf, probes, question, np.empty(0, np.int64),
                                        timings, t_kernel, t_start, backend, sigma, 0,
                                        f"no point moves at sigma_max={sigma_max:g}")
            upper = sigma_max
        else:
            upper = 2.0 * sigma
            while not moves_at(upper, False):
                lower = upper
                if d_max / upper < flat:
                    return _critical_result(math.inf, lower, math.inf, probes, question, np.empty(0, np.int64),
                                            timings, t_kernel, t_start, backend, sigma, 0,
                                            f"K is all ones to {dt.name} precision at sigma={upper:.6g}")
                upper *= 2.0
        while upper - lower > precision and not (rtol is not None and upper - lower <= rtol * lower):
            mid = 0.5 * (lower + upper)
            if mid <= lower or mid >= upper:
                break
            if moves_at(mid, True):
                upper = mid
            else:
                lower = mid
        _offgrid.rbf_from_neg_half(Kw, G, upper, backend, zeros)
        n_moved, moved = question.full(Kw)
        moved_h = (np.sort(backend.to_host(layout.order[moved]).astype(np.int64)) if n_moved
                   else np.empty(0, np.int64))
        return _critical_result(upper, lower, upper, probes, question, moved_h, timings, t_kernel, t_start, backend,
                                sigma, 0, "" if n_moved else "rounding: the full check at upper found no mover")


# --- the search of §7.1 ----------------------------------------------------------------------------------

def search_bandwidth(X, k, *, sigma0="percentile", depth=1, refine_depth=2, max_values=50, init="random",
                     sample_weight=None, y_true=None, max_iter=300, tol=1e-6, random_state=None, device="auto",
                     dtype="float64", limit_checks=True, max_sigma=None, verbose=False,
                     progress=False) -> BandwidthSearchResult:
    """The Off-the-grid search (paper §7.1): every distinct kernel k-means clustering along the critical
    bandwidths, scored by c-NNC, refined around the best.

    1. K at sigma0; kernel k-means from the initial partition.
    2. Main path: :func:`critical_bandwidth`'s walk at ``depth`` from the current clustering finds the next
       bandwidth at which a point moves; kernel k-means from the current labels runs to convergence there;
       repeat until the cap (K all ones to precision, or ``max_sigma``) or ``max_values`` runs.
    3. Refinement, for depth d = depth + 1 .. refine_depth: around the best clustering so far (lowest
       c-NNC), kernel k-means at its sigma from the initial partition, then the walk at depth d from that
       clustering up to the sigma of the run that followed the best on the coarser path (§6.2's
       hierarchical search, as in the paper's published experiments).

    Every kernel k-means run goes to a fixed point (no point moves): Lloyd with ``tol``, continued with
    tol=0 if it stopped on the objective. Every distinct partition is scored once by
    :func:`kkmgpu.metrics.cnnc` (and NMI with ``y_true``).

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
    k : int
    sigma0 : "percentile", "bound" or float, default="percentile"
        Starting bandwidth: the 1st percentile of the pairwise squared distances (the paper's choice;
        exact for up to 4 million pairs, else estimated from 1 million pairs drawn with ``random_state``),
        Theorem 1's bound (:func:`bandwidth_lower_bound`), or a number.
    depth : int, default=1
        Walk depth of the main path (1: the next critical value to within a factor 2).
    refine_depth : int, default=2
        Last depth of the hierarchical refinement (no refinement when <= depth).
    max_values : int, default=50
        Cap on the kernel k-means runs of the whole search.
    init : "random", "k-means++" or array of shape (n_samples,), default="random"
        The initial partition shared by every start (k-means++ seeds in the feature space at sigma0).
    sample_weight, y_true : arrays of shape (n_samples,), optional
    max_iter, tol : as for :func:`kkmgpu.fit`.
    random_state : int, Generator or None
    device : {"auto", "cpu", "cuda", "cuda:N"}
    dtype : {"float64", "float32"}, default="float64"
        Precision of K and K'.
    limit_checks : bool, default=True
        §6.2's limited checks where they save reads (same answers).
    max_sigma : float, optional
        Do not probe beyond this bandwidth.
    verbose : bool
        Print every step of the search.
    progress : bool, default=False
        A progress bar over the kernel k-means runs (of at most ``max_values``); tqdm when installed.

    Returns
    -------
    BandwidthSearchResult

    Raises
    ------
    ValueError, TypeError
        Bad data or parameters (the message names the value and the rule).
    InsufficientMemoryError
        If K and K' do not fit the device.

    Notes
    -----
    ``kkmgpu.fit(X, k, gamma="search")`` (and ``KernelKMeans(gamma="search")``, ``kkmgpu fit --gamma search``)
    runs this search with the fit's ``init``, ``dtype``, ``random_state``, ``sample_weight``, ``max_iter``,
    ``tol`` and ``device``, and every other parameter at its default here. The fit's defaults are
    ``init="k-means++"`` and ``dtype="float32"``, where this function defaults to the paper's random partition
    and float64: the initial partition decides which clusterings the walk meets, and the precision decides
    where it stops (K all ones to precision). ``search_bandwidth(X, k, init="k-means++", dtype="float32",
    random_state=s)`` is exactly the search of ``fit(X, k, gamma="search", random_state=s)``: the same
    clusterings, the same best sigma and labels; ``fit(..., gamma="search", init="random", dtype="float64")``
    is this function's default search. ``random_state`` is consumed the same way by both (the percentile
    sample above 4 million pairs, then the initial partition).

    Examples
    --------
    >>> import kkmgpu
    >>> X, y = kkmgpu.datasets.make_two_circles(300, random_state=0)
    >>> res = kkmgpu.search_bandwidth(X, 2, y_true=y, random_state=0, device="cpu")   # doctest: +SKIP
    >>> print(res.summary())                                                           # doctest: +SKIP
    """
    t_start = time.perf_counter()
    depth = _check_depth(depth)
    refine_depth = _validation.check_int(refine_depth, "refine_depth", minimum=0, maximum=MAX_DEPTH)
    max_iter, tol, max_values = _check_common(max_iter, tol, max_values)
    if max_sigma is not None:
        max_sigma = _check_positive(max_sigma, "max_sigma")
    if not (isinstance(sigma0, str) and sigma0 in ("percentile", "bound")):
        if isinstance(sigma0, str):
            raise ValueError(f"sigma0={sigma0!r} is not valid; use 'percentile', 'bound' or a number > 0.")
        sigma0 = _check_positive(sigma0, "sigma0")
    backend, dt, rng, X, n, k, weights_h, init, y_true = _prepare(X, k, device, dtype, sample_weight, y_true,
                                                                   random_state, init)
    xp = backend.xp
    rec = _Recorder(X, k, backend, y_true, "offgrid", "sigma",
                    progress_bar(max_values, desc="bandwidth search", unit="run", enabled=check_progress(progress)))
    with backend.activate():
        A0 = _offgrid.centered_features(X, backend)
        if sigma0 == "percentile":
            sigma0 = _percentile_sigma(A0, backend, rng)
        elif sigma0 == "bound":
            sigma0 = bandwidth_lower_bound(X, device=backend.name)
        rec.timings["validation"] = time.perf_counter() - t_start
        K, Kp = _alloc_pair(n, dt, backend)
        layout = _Layout(backend, n, weights_h)

        def build(s):
            t0 = time.perf_counter()
            info = _offgrid.BaseInfo(s, *_offgrid.fill_rbf(K, A0[layout.order], s, backend))
            rec.costs["kernel_builds"] += 1
            rec.timings["kernel_build"] += backend.timer() - t0
            return info

        def rebuild(Kbuf, s):
            rec.costs["rebuilds"] += 1
            return build(s)

        info = build(sigma0)
        labels0 = initial_labels(init, n, k, rng, DenseKernelOperator(K, layout.weights, backend))
        labels0 = np.asarray(labels0, dtype=np.int32)
        if verbose:
            print(f"[kkmgpu] search: sigma0={sigma0:.6g}, n={n}, k={k}, {backend.name}, {dt.name}")

        def path(sigma, labels_l, info, walk_depth, stop=math.inf):
            """Walk, run, record, repeat; returns the number of runs made."""
            runs = 0
            while len(rec.evaluations) < max_values:
                t0 = time.perf_counter()
                limited = bool(limit_checks) and walk_depth > 1   # depth 1 has no bisection step to limit
                labels_l = layout.regroup(K, Kp, labels_l, k, limited, rec.costs)
                question = _offgrid.OneStepQuestion(backend, labels_l, layout.weights, k, limited=limited)
                if int((np.bincount(backend.to_host(labels_l), minlength=k) > 0).sum()) <= 1:
                    break
                beyond = _offgrid.linear_regime_sigma(A0[layout.order], labels_l, layout.weights, k, backend)
                outcome = _offgrid.walk_rbf(K, Kp, question, sigma, walk_depth, backend, info=info, rebuild=rebuild,
                                            max_sigma=max_sigma, no_move_beyond=beyond, verbose=verbose)
                info = outcome.info
                rec.add_question(question)
                rec.costs["fused_steps"] += outcome.n_steps
                rec.timings["walk"] += backend.timer() - t0
                if not outcome.found:
                    if verbose:
                        print(f"[kkmgpu] search: stop, {outcome.capped}")
                    break
                lower, upper = outcome.base / outcome.e_lower, outcome.base / outcome.e_upper
                rec.brackets.append((lower, upper, walk_depth))
                if upper > stop * (1 + 1e-12):
                    break
                run, _ = _run_kernel_kmeans(K, layout.weights, labels_l, k, backend, max_iter, tol, rec)
                labels_l = run.labels
                index = rec.record(upper, layout.to_input(labels_l), run, walk_depth, backend.timer() - t0,
                                   sigma=upper, gamma=1.0 / upper)
                runs += 1
                sigma = upper
                if verbose:
                    c = rec.clusterings[index]
                    print(f"[kkmgpu] search: sigma={upper:.6g} (critical in [{lower:.6g}, {upper:.6g}]): "
                          f"clustering {index}, c-NNC {c.cnnc:.4f}, {run.n_iter} iterations")
            return runs

        # 1. the run at sigma0, 2. the main path
        run, seconds = _run_kernel_kmeans(K, layout.weights, layout.from_input(labels0), k, backend, max_iter,
                                          tol, rec)
        rec.record(sigma0, layout.to_input(run.labels), run, 0, seconds, sigma=sigma0, gamma=1.0 / sigma0)
        path(sigma0, run.labels, info, depth)

        # 3. hierarchical refinement around the best
        for d in range(depth + 1, refine_depth + 1):
            if len(rec.evaluations) >= max_values:
                break
            best = rec.best_index()
            evals = sorted(rec.evaluations, key=lambda e: e["value"])
            values_best = [e["value"] for e in evals if e["clustering"] == best]
            sigma_best = values_best[0]
            after = [e["value"] for e in evals if e["value"] > values_best[-1] * (1 + 1e-12)]
            stop = after[0] if after else math.inf
            layout = _Layout(backend, n, weights_h)
            info = build(sigma_best)
            run, seconds = _run_kernel_kmeans(K, layout.weights, layout.from_input(labels0), k, backend, max_iter,
                                              tol, rec)
            rec.record(sigma_best, layout.to_input(run.labels), run, d, seconds, sigma=sigma_best,
                       gamma=1.0 / sigma_best)
            if verbose:
                print(f"[kkmgpu] search: refinement at depth {d} in [{sigma_best:.6g}, {stop:.6g}]")
            path(sigma_best, run.labels, info, d, stop=stop)
        del K, Kp
    return rec.result(labels0, sigma0, n, backend.name, dt.name, t_start)


def _evaluate_sigmas(X, k, sigmas, method, *, init, sample_weight, y_true, max_iter, tol, random_state, device,
                     dtype, verbose, t_start, progress=False):
    """Kernel k-means at each bandwidth from one initial partition (the baselines)."""
    backend, dt, rng, X, n, k, weights_h, init, y_true = _prepare(X, k, device, dtype, sample_weight, y_true,
                                                                   random_state, init)
    xp = backend.xp
    rec = _Recorder(X, k, backend, y_true, method, "sigma")
    with backend.activate():
        A = _offgrid.centered_features(X, backend)
        if callable(sigmas):
            sigmas = sigmas(A, backend)
        rec.bar = progress_bar(len(sigmas), desc=f"bandwidth {method}", unit="run", enabled=check_progress(progress))
        rec.timings["validation"] = time.perf_counter() - t_start
        weights = backend.asarray(weights_h)
        check_fits(n * n * dt.itemsize, backend, f"the {n} x {n} {dt.name} kernel matrix",
                   advice=memory_advice(dtype=dt, method="search"))
        K = xp.empty((n, n), dtype=dt)
        try:                                       # keep -D / 2 when it fits: one exp pass per sigma, no GEMM
            check_fits(2 * n * n * dt.itemsize, backend, "D")
            G = _offgrid.fill_neg_half_distances(xp.empty((n, n), dtype=dt), A, backend)
            zeros = xp.zeros(n, dtype=dt)
        except MemoryError:
            G = None
        labels0 = None
        for s in sigmas:
            t0 = time.perf_counter()
            if G is not None:
                _offgrid.rbf_from_neg_half(K, G, s, backend, zeros)
            else:
                _offgrid.fill_rbf(K, A, s, backend)
            rec.costs["kernel_builds"] += 1
            rec.timings["kernel_build"] += backend.timer() - t0
            if labels0 is None:
                labels0 = np.asarray(initial_labels(init, n, k, rng, DenseKernelOperator(K, weights, backend)),
                                     dtype=np.int32)
            run, seconds = _run_kernel_kmeans(K, weights, backend.asarray(labels0), k, backend, max_iter, tol, rec)
            index = rec.record(s, backend.to_host(run.labels).astype(np.int32), run, 0, backend.timer() - t0,
                               sigma=s, gamma=1.0 / s)
            if verbose:
                c = rec.clusterings[index]
                print(f"[kkmgpu] {method}: sigma={s:.6g}: clustering {index}, c-NNC {c.cnnc:.4f}, "
                      f"{run.n_iter} iterations")
    return rec.result(labels0, sigmas[0], n, backend.name, dt.name, t_start)


def search_grid(X, k, *, sigmas=GRID_SIGMAS, init="random", sample_weight=None, y_true=None, max_iter=300, tol=1e-6,
                random_state=None, device="auto", dtype="float64", verbose=False,
                progress=False) -> BandwidthSearchResult:
    """The paper's GRIDSEARCH baseline: kernel k-means at sigma = 10^-6, 10^-5, ..., 10^6 (13 values) from
    one initial partition, every distinct clustering scored by c-NNC (and NMI).

    K = exp(-D / sigma) is recomputed per value from the squared distances D kept on the device (when D and
    K fit; else from X).

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
    k : int
    sigmas : sequence of float, default=GRID_SIGMAS
        The bandwidths (each > 0), in the paper's convention exp(-||x - y||^2 / sigma).
    init, sample_weight, y_true, max_iter, tol, random_state, device, dtype, verbose
        As for :func:`search_bandwidth`.

    Returns
    -------
    BandwidthSearchResult
        method "grid"; ``evaluations`` has one entry per value.

    Raises
    ------
    ValueError
        A sigma <= 0 or not finite, an empty ``sigmas``, or the errors of :func:`search_bandwidth`.
    """
    t_start = time.perf_counter()
    max_iter, tol, _ = _check_common(max_iter, tol, 1)
    sigmas = [_check_positive(s, "sigma") for s in sigmas]
    if not sigmas:
        raise ValueError("sigmas is empty; give at least one bandwidth.")
    return _evaluate_sigmas(X, k, sigmas, "grid", init=init, sample_weight=sample_weight, y_true=y_true,
                            max_iter=max_iter, tol=tol, random_state=random_state, device=device, dtype=dtype,
                            verbose=verbose, t_start=t_start, progress=progress)


def mknn_sigmas(X, n_neighbors=None, *, device="auto"):
    """The MKNN bandwidths: sigma_j = 2 (mean_i d_j(x_i))^2 for j = 1..J, J = int(2 (log n + 1)).

    d_j(x_i) is the Euclidean distance from x_i to its j-th nearest other point. The mean distance to the
    j-th neighbour (Von Luxburg's heuristic) is a scale s for the kernel exp(-||x - y||^2 / (2 s^2)); in the
    paper's convention exp(-||x - y||^2 / sigma) that is sigma = 2 s^2 (its footnote 1). The paper's
    published code averages 2 d_j^2 instead (and counts the point itself as its 1st neighbour).
    Values that come out 0 (duplicate points) are dropped with a UserWarning.

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
    n_neighbors : int, optional
        J; default int(2 (log n + 1)), at most n - 1.
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"

    Returns
    -------
    list of float
        sigma_1, ..., sigma_J (zeros dropped).

    Raises
    ------
    ValueError
        Bad X, or every bandwidth is 0 (the nearest neighbours coincide with the points).
    """
    backend = resolve_device(device, (X,))
    with backend.activate():
        X = _validation.check_data(X, backend)
        return _mknn_sigmas(_offgrid.centered_features(X, backend), backend, n_neighbors)


def _mknn_sigmas(A, backend, n_neighbors=None):
    n = A.shape[0]
    if n_neighbors is None:
        n_neighbors = int(2 * (math.log(n) + 1))
    n_neighbors = max(1, min(int(n_neighbors), n - 1))
    d = _offgrid.nearest_neighbour_distances(A, n_neighbors, backend)
    sigmas = [2.0 * float(m) ** 2 for m in d.mean(axis=0)]
    kept = [s for s in sigmas if s > 0]
    if len(kept) < len(sigmas):
        warnings.warn(f"{len(sigmas) - len(kept)} MKNN bandwidths are 0 (duplicate points) and were dropped.",
                      UserWarning, stacklevel=3)
    if not kept:
        raise ValueError("every MKNN bandwidth is 0: the nearest neighbours coincide with the points.")
    return kept


def search_mknn(X, k, *, n_neighbors=None, init="random", sample_weight=None, y_true=None, max_iter=300, tol=1e-6,
                random_state=None, device="auto", dtype="float64", verbose=False,
                progress=False) -> BandwidthSearchResult:
    """The paper's MKNN baseline: sigma from the mean distance to the j-th nearest neighbour, j = 1..J.

    J = int(2 (log n + 1)) unless ``n_neighbors`` is given; see :func:`mknn_sigmas` for the conversion to
    the paper's kernel convention (sigma = 2 s^2). Kernel k-means runs from one initial partition at every
    value; every distinct clustering is scored by c-NNC (and NMI). The neighbour distances are computed in
    row tiles on the device.

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
    k : int
    n_neighbors : int, optional
        J (>= 1); default int(2 (log n + 1)).
    init, sample_weight, y_true, max_iter, tol, random_state, device, dtype, verbose
        As for :func:`search_bandwidth`.

    Returns
    -------
    BandwidthSearchResult
        method "mknn"; ``evaluations`` has one entry per neighbour rank.

    Raises
    ------
    ValueError, TypeError
        ``n_neighbors`` not an integer >= 1, or the errors of :func:`search_bandwidth`.
    """
    t_start = time.perf_counter()
    max_iter, tol, _ = _check_common(max_iter, tol, 1)
    if n_neighbors is not None:
        n_neighbors = _validation.check_int(n_neighbors, "n_neighbors", minimum=1)
    return _evaluate_sigmas(X, k, lambda A, backend: _mknn_sigmas(A, backend, n_neighbors), "mknn", init=init,
                            sample_weight=sample_weight, y_true=y_true, max_iter=max_iter, tol=tol,
                            random_state=random_state, device=device, dtype=dtype, verbose=verbose, t_start=t_start,
                            progress=progress)


# --- §6.3: the polynomial degree ----------------------------------------------------------------------------

def search_polynomial_degree(X, k, *, degree0=1, gamma=None, coef0=1.0, depth=None, integer_degrees=True,
                             max_degree=64, max_values=50, init="random", sample_weight=None, y_true=None,
                             max_iter=300, tol=1e-6, random_state=None, device="auto", dtype="float64",
                             limit_checks=True, verbose=False, progress=False) -> BandwidthSearchResult:
    """The Off-the-grid search over the degree d of the polynomial kernel (gamma <x, y> + coef0) ** d (§6.3).

    With B = K_1 (the base, element-wise), K_d' = B ** d' = K_d ** (d' / d): the same dyadic walk as for
    the bandwidth, on the exponent q = d' / d >= 1 (doubling the degree while no point moves, then
    bisecting in [d_base, 2 d_base]). Real powers need B > 0 element-wise.

    Critical degree: for a partition P converged at degree d, the infimum of the real degrees d' > d at
    which one kernel k-means step from P with the matrix B ** d' moves a point (Definition 1 with d in the
    place of sigma). B ** d' for a non-integer d' need not be positive semidefinite, so with
    ``integer_degrees=True`` (default) kernel k-means runs at an integer degree (a valid polynomial kernel):
    the walk's depth is raised after its doubling phase until the bracket [lower, upper] is at most one
    degree wide, and the next degree is the first integer m > lower when a point moves at m (one more full
    check at B ** m when m < upper), else the next integer (>= upper). So no integer degree between two
    evaluated ones moves a point from the earlier clustering, as far as the bracket is exact. With False
    kernel k-means runs at the upper end itself.

    Parameters
    ----------
    degree0 : float, default=1
        Starting degree (>= 1; an integer when ``integer_degrees``).
    gamma : float, optional
        Default 1 / n_features (as :func:`kkmgpu.fit`).
    coef0 : float, default=1.0
    depth : int, optional
        Probes per dyadic level (final width 2^(1 - depth) d_base). Default 1 with ``integer_degrees``
        (raised per walk to 1 + ceil(log2(d_base)), the depth that resolves one degree), else 8.
    max_degree : float, default=64
        Cap on the probed degrees.
    Other parameters as for :func:`search_bandwidth`.

    Returns
    -------
    BandwidthSearchResult
        method "polynomial-degree", parameter "degree"; every clustering's ``degree`` is set.

    Raises
    ------
    ValueError
        If B = gamma <x, y> + coef0 has a value <= 0 (use a larger coef0), or bad parameters.
    """
    t_start = time.perf_counter()
    degree0 = _check_positive(degree0, "degree0")
    if degree0 < 1:
        raise ValueError(f"degree0={degree0!r} must be >= 1.")
    if integer_degrees and degree0 != int(degree0):
        raise ValueError(f"degree0={degree0!r} must be an integer with integer_degrees=True.")
    max_degree = _check_positive(max_degree, "max_degree")
    if depth is not None:
        depth = _check_depth(depth)
    coef0 = float(coef0) if isinstance(coef0, numbers.Real) and not isinstance(coef0, bool) else coef0
    if not isinstance(coef0, float) or not math.isfinite(coef0):
        raise ValueError(f"coef0={coef0!r} must be a finite number.")
    max_iter, tol, max_values = _check_common(max_iter, tol, max_values)
    backend, dt, rng, X, n, k, weights_h, init, y_true = _prepare(X, k, device, dtype, sample_weight, y_true,
                                                                   random_state, init)
    if gamma is None:
        gamma = 1.0 / X.shape[1]
    gamma = _check_positive(gamma, "gamma")
    xp = backend.xp
    rec = _Recorder(X, k, backend, y_true, "polynomial-degree", "degree",
                    progress_bar(max_values, desc="degree search", unit="run", enabled=check_progress(progress)))
    with backend.activate():
        X64 = backend.asarray(X, dtype=np.float64)
        rec.timings["validation"] = time.perf_counter() - t_start
        K, Kp = _alloc_pair(n, dt, backend)
        layout = _Layout(backend, n, weights_h)

        def build(d):
            t0 = time.perf_counter()
            smallest, _ = _offgrid.fill_polynomial(K, X64[layout.order], gamma, coef0, d, backend)
            rec.costs["kernel_builds"] += 1
            rec.timings["kernel_build"] += backend.timer() - t0
            if smallest <= 0:
                raise ValueError(f"the polynomial base gamma <x, y> + coef0 has a minimum {smallest:.6g} <= 0; the "
                                 "degree walk takes real powers of it, which needs B > 0 element-wise. Use a larger "
                                 f"coef0 (> {coef0 - smallest:.6g}) or a smaller gamma.")
            if not bool(xp.isfinite(K).all()):
                raise ValueError(f"(gamma <x, y> + coef0) ** {d:g} overflows {dt.name}; lower the degree or scale X.")

        build(degree0)
        labels0 = np.asarray(initial_labels(init, n, k, rng, DenseKernelOperator(K, layout.weights, backend)),
                             dtype=np.int32)
        run, seconds = _run_kernel_kmeans(K, layout.weights, layout.from_input(labels0), k, backend, max_iter, tol,
                                          rec)
        rec.record(degree0, layout.to_input(run.labels), run, 0, seconds, gamma=gamma, degree=degree0)
        degree, labels_l = degree0, run.labels
        while len(rec.evaluations) < max_values:
            t0 = time.perf_counter()
            walk_depth = depth if depth is not None else (1 if integer_degrees else 8)
            limited = bool(limit_checks) and (walk_depth > 1 or integer_degrees)
            labels_l = layout.regroup(K, Kp, labels_l, k, limited, rec.costs)
            if int((np.bincount(backend.to_host(labels_l), minlength=k) > 0).sum()) <= 1:
                break
            question = _offgrid.OneStepQuestion(backend, labels_l, layout.weights, k, limited=limited)
            outcome = _offgrid.walk_degree(K, Kp, question, degree, walk_depth, backend, max_degree=max_degree,
                                           max_width=1.0 if integer_degrees else None, verbose=verbose)
            rec.costs["fused_steps"] += outcome.n_steps
            rec.timings["walk"] += backend.timer() - t0
            if not outcome.found:
                rec.add_question(question)
                if verbose:
                    print(f"[kkmgpu] degree search: stop, {outcome.capped}")
                break
            lower, upper = outcome.base * outcome.e_lower, outcome.base * outcome.e_upper
            walk_depth = int(outcome.depth)
            rec.brackets.append((lower, upper, walk_depth))
            if integer_degrees:
                # K holds B ** upper. The first integer above lower (no move there) is the next degree when a
                # point moves at it; the bracket is at most one degree wide, so otherwise the one after it is.
                held = upper                             # the degree K holds
                first = float(math.floor(lower + 1e-9) + 1)
                degree = first
                if first < upper - 1e-9 and first <= max_degree:
                    build(first)
                    held = first
                    t1 = time.perf_counter()
                    if question.full(K)[0] == 0:
                        degree = first + 1.0
                    rec.timings["walk"] += backend.timer() - t1
                rec.add_question(question)
                if degree > max_degree:
                    break
                if abs(degree - held) > 1e-9:
                    build(degree)
            else:
                rec.add_question(question)
                degree = upper
            run, _ = _run_kernel_kmeans(K, layout.weights, labels_l, k, backend, max_iter, tol, rec)
            labels_l = run.labels
            index = rec.record(degree, layout.to_input(labels_l), run, walk_depth, backend.timer() - t0,
                               gamma=gamma, degree=degree)
            if verbose:
                print(f"[kkmgpu] degree search: degree {degree:g} (critical in [{lower:.4g}, {upper:.4g}]): "
                      f"clustering {index}, c-NNC {rec.clusterings[index].cnnc:.4f}")
        del K, Kp
    return rec.result(labels0, degree0, n, backend.name, dt.name, t_start)
