"""The frozen result of a kernel k-means fit."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np


def _readonly(a):
    if isinstance(a, np.ndarray):
        a = a.view()
        a.flags.writeable = False
    return a


@dataclass(frozen=True, repr=False)
class KernelKMeansResult:
    """What :func:`kkmgpu.fit` returns.

    Attributes
    ----------
    labels : ndarray of shape (n_samples,)
        Cluster index of every point, NumPy int32 (a device array with ``keep_on_device=True``).
    objective : float
        Kernel k-means objective of ``labels``: sum_i w_i ||phi(x_i) - m_{label_i}||^2. With a graph objective
        (``fit(objective="ncut")``) the normalized cut of ``labels``, or the negated ratio association.
    objective_history : ndarray of shape (n_iter + 1,) or shorter
        Objective of the initial partition, then after every assignment step that moved points
        (a final step in which no point moved adds no entry).
    n_iter : int
        Assignment steps of the best restart.
    converged : bool
        False when the best restart stopped at ``max_iter``.
    n_clusters : int
    method : str
    kernel : str
        Canonical kernel name ("rbf", ..., "precomputed", "callable").
    kernel_params : dict
        The resolved kernel parameters (e.g. the numeric gamma that "scale" chose).
    device : str
        "cpu" or "cuda:N".
    dtype : str
        Storage precision of the kernel matrix.
    timings : dict
        Seconds: "validation", "kernel_build", "init", "iterations" (all restarts), "total".
    cluster_sizes : ndarray of shape (n_clusters,)
        Weighted cluster sizes n_c.
    n_init : int
        Restarts run; ``objectives`` holds the final objective of each.
    sample_weight : ndarray of shape (n_samples,)
        The weights used (ones when none were given), float64.
    exact_objective : float or None
        The kernel k-means objective of ``labels`` with exact centroids: equal to ``objective`` for
        method="exact"; for method="cats" computed only with ``exact_objective=True`` (``objective``
        and ``objective_history`` then hold CATS's approximate distortion); for method="eigen" the
        objective of ``labels`` on K itself (``objective`` is the one on the embedding A A^T, equal to
        it with every eigenpair and no eigenvalue clipped); for method="approx" equal to ``objective`` where the
        kernel is not positive semi-definite, else None (``objective`` is then the approximate upper bound).
    stop_reason : str
        Why the best restart stopped ("no point moved", "relative objective change <= tol", the CATS
        variance rule, "max_iter").
    objective_name : str
        The objective minimised: "kernel_kmeans", "ncut" or "ratio_association" (``fit(objective=...)``).
    method_params : dict
        The resolved parameters of the method (for CATS: l, window, theta, rcond; for method="eigen":
        n_components, n_components_used, decomposition, n_negative_eigenvalues, negative_eigenvalue_mass,
        negative_fraction, largest/smallest_eigenvalue, captured_fraction, n_components_predict).
    """

    labels: object
    objective: float
    objective_history: np.ndarray
    n_iter: int
    converged: bool
    n_clusters: int
    method: str
    kernel: str
    kernel_params: dict
    device: str
    dtype: str
    timings: dict
    cluster_sizes: np.ndarray
    n_init: int
    objectives: np.ndarray
    sample_weight: np.ndarray
    exact_objective: float | None = None
    stop_reason: str = ""
    method_params: dict = field(default_factory=dict)
    objective_name: str = "kernel_kmeans"
    # what predict needs: training features (prepared, on the device), weights, and the cluster totals
    _spec: object = field(default=None, repr=False)
    _train_features: object = field(default=None, repr=False)
    _train_labels: object = field(default=None, repr=False)
    _train_weights: object = field(default=None, repr=False)
    _within: np.ndarray = field(default=None, repr=False)
    _n_train: int = 0
    _cats_state: object = field(default=None, repr=False)
    _trim_state: object = field(default=None, repr=False)
    _eigen_state: object = field(default=None, repr=False)
    _approx_state: object = field(default=None, repr=False)
    _graph_state: object = field(default=None, repr=False)
    #: the iterations ran on sample_weight / _weight_scale: cluster_sizes / _weight_scale matches _within
    _weight_scale: float = 1.0

    def __post_init__(self):
        for name in ("labels", "objective_history", "cluster_sizes", "objectives", "sample_weight", "_within"):
            object.__setattr__(self, name, _readonly(getattr(self, name)))
        object.__setattr__(self, "kernel_params", dict(self.kernel_params))
        object.__setattr__(self, "timings", dict(self.timings))
        object.__setattr__(self, "method_params", dict(self.method_params))

    def __repr__(self) -> str:
        return (f"KernelKMeansResult(n_samples={self._n_train}, n_clusters={self.n_clusters}, "
                f"method={self.method!r}, kernel={self.kernel!r}, objective={self.objective:.6g}, "
                f"n_iter={self.n_iter}, converged={self.converged}, device={self.device!r}, "
                f"dtype={self.dtype!r}, seconds={self.timings.get('total', float('nan')):.3g})")

    def plot_objective(self, ax=None):
        """Plot the objective per iteration (needs matplotlib). Returns the Axes."""
        try:
            import matplotlib.pyplot as plt
        except ImportError as exc:  # pragma: no cover - exercised only without matplotlib
            raise ImportError("plot_objective needs matplotlib: pip install kkmgpu[plot]") from exc
        if ax is None:
            _, ax = plt.subplots(figsize=(5, 3.5))
        history = np.asarray(self.objective_history)
        ax.plot(np.arange(history.size), history, marker="o")
        ax.set_xlabel("iteration")
        ax.set_ylabel({"ncut": "normalized cut", "ratio_association": "-ratio association"}.get(
            self.objective_name, "kernel k-means objective"))
        ax.set_title(f"{self.kernel} kernel, k={self.n_clusters}, {self.device}")
        return ax


#: method_params of method="eigen" in the kernel's units (eigenvalues of K)
EIGEN_VALUE_PARAMS = ("negative_eigenvalue_mass", "largest_eigenvalue", "smallest_eigenvalue")


def in_user_units(result, user_weights, weight_scale, spec):
    """The result with objectives, sizes and weights in the caller's units; ValueError if an objective is not finite.

    The iterations ran on weights / ``weight_scale`` and on K / ``spec.value_scale`` (both powers of two,
    so the labels are those of the original units): the objective is linear in both.
    """
    factor = weight_scale * spec.value_scale
    changes = {"sample_weight": user_weights}
    if factor != 1.0:
        changes.update(
            objective=float(result.objective) * factor,
            objective_history=np.asarray(result.objective_history, dtype=np.float64) * factor,
            objectives=np.asarray(result.objectives, dtype=np.float64) * factor,
            exact_objective=None if result.exact_objective is None else float(result.exact_objective) * factor)
    if weight_scale != 1.0:
        changes.update(cluster_sizes=np.asarray(result.cluster_sizes, dtype=np.float64) * weight_scale,
                       _weight_scale=weight_scale)
    if spec.value_scale != 1.0 and result.method == "eigen":
        params = dict(result.method_params)
        for key in EIGEN_VALUE_PARAMS:
            if key in params:
                params[key] = float(params[key]) * spec.value_scale
        changes["method_params"] = params
    result = dataclasses.replace(result, **changes)
    for name in ("objective", "exact_objective"):
        value = getattr(result, name)
        if value is not None and not math.isfinite(value):
            raise ValueError(f"the {name.replace('_', ' ')} is {value} for {spec.describe()} in dtype={result.dtype!r} "
                             f"(largest value {float(np.finfo(np.dtype(result.dtype)).max):.5g}); the kernel or the "
                             "weights leave the representable range on these data. Scale X or the weights, change "
                             "the kernel's parameters, or use dtype='float64'.")
    return result
