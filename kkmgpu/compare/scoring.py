"""The comparison's metrics (:data:`METRICS`): every partition scored the same way (:func:`evaluate`),
and the RBF gamma every method shares (:func:`shared_gamma`)."""

from __future__ import annotations

import numpy as np

METRICS = ("nmi", "ari", "silhouette", "calinski_harabasz", "davies_bouldin", "sum_of_variances",
           "kernel_objective", "cnnc")
#: metric -> True when lower values are better (used to mark the best value per data set)
LOWER_IS_BETTER = {"nmi": False, "ari": False, "silhouette": False, "calinski_harabasz": False,
                   "davies_bouldin": True, "sum_of_variances": True, "kernel_objective": True, "cnnc": True,
                   "time_s": True}


def evaluate(X, y, labels, *, K=None, device="auto"):
    """Every metric of :data:`METRICS` for one partition.

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
        The data the partition was made from (the internal indices and c-NNC use it).
    y : array of shape (n_samples,)
        The true classes (for NMI and ARI).
    labels : array of shape (n_samples,)
        The partition to score.
    K : array of shape (n_samples, n_samples), optional
        The kernel matrix the kernel k-means objective is taken on (NaN without it).
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
        Where the O(n^2) metrics run.

    Returns
    -------
    values : dict
        Metric name -> float. An undefined metric (e.g. the silhouette of a single cluster) or a missing
        one (c-NNC in a kkmgpu without it) is NaN.
    notes : list of str
        Why each NaN metric is undefined.

    Raises
    ------
    ValueError
        If y or labels is not one value per row of X.
    """
    from kkmgpu import metrics

    labels = np.asarray(labels)
    n = np.shape(X)[0]
    for name, value in (("y", np.asarray(y)), ("labels", labels)):
        if value.shape != (n,):
            raise ValueError(f"{name} has shape {value.shape}; expected ({n},), one value per row of X.")
    values, notes = {}, []
    calls = {
        "nmi": lambda: metrics.nmi(y, labels),
        "ari": lambda: metrics.ari(y, labels),
        "silhouette": lambda: metrics.silhouette(X, labels, device=device),
        "calinski_harabasz": lambda: metrics.calinski_harabasz(X, labels, device=device),
        "davies_bouldin": lambda: metrics.davies_bouldin(X, labels, device=device),
        "sum_of_variances": lambda: metrics.sum_of_variances(X, labels, device=device),
        "kernel_objective": (None if K is None else lambda: metrics.kernel_kmeans_objective(K, labels)),
        "cnnc": (lambda: metrics.cnnc(X, labels, device=device)) if hasattr(metrics, "cnnc") else None,
    }
    for name in METRICS:
        call = calls[name]
        if call is None:
            values[name] = float("nan")
            continue
        try:
            values[name] = float(call())
        except ValueError as exc:
            values[name] = float("nan")
            notes.append(f"{name}: {exc}")
    return values, notes


def shared_gamma(X) -> float:
    """kkmgpu's gamma="scale" for rbf: 1 / (n_features * v), v the mean per-feature centred variance
    (:func:`kkmgpu.kernels.spec.feature_variance`; scikit-learn's SVC rule uses X.var() instead, the same
    when the columns' means are equal)."""
    from ..kernels.spec import feature_variance, scale_gamma
    return scale_gamma("rbf", X.shape[1], feature_variance(np.asarray(X), np))
