"""The result types of the bandwidth (and degree) searches: :class:`CriticalBandwidth`,
:class:`BandwidthClustering` and :class:`BandwidthSearchResult`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


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
