"""Plain float64 NumPy reference for kernel k-means, written for clarity, not speed.

Independent of ``kkmgpu`` on purpose: nothing here imports the package, so the tests hold the
library to the equations (kernel-matrix-trimming.txt Eq. 1-4, with sample weights) rather than to
itself.

Kernels are computed directly (``scipy.spatial.distance.cdist`` for distances, plain inner products
otherwise), never with the ``||x||^2 - 2<x, y> + ||y||^2`` GEMM trick the library uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.spatial.distance import cdist

__all__ = [
    "KERNELS",
    "ReferenceResult",
    "assign_new_points",
    "cluster_distances",
    "default_kernel_params",
    "kernel_kmeans_objective",
    "kernel_matrix",
    "reference_approx_kernel_kmeans",
    "reference_kernel_kmeans",
]

KERNELS = ("rbf", "polynomial", "sigmoid", "linear", "laplacian")


# --------------------------------------------------------------------------- kernels


def default_kernel_params(X, kernel, *, gamma=None, degree=3, coef0=None):
    """Resolve defaults as the spec states them (gamma "scale" = 1 / (d v); laplacian 1 / sqrt(d v), v the mean over
    the features of each feature's centred variance)."""
    X = np.asarray(X, dtype=np.float64)
    n_features = X.shape[1]
    if kernel == "linear":
        return {}
    if kernel in ("rbf", "laplacian"):
        if gamma is None or gamma == "scale":  # laplacian: the same rule for the unsquared distance
            v = float(np.mean(np.mean((X - X.mean(axis=0)) ** 2, axis=0)))
            gamma = 1.0 / (n_features * v) if kernel == "rbf" else 1.0 / np.sqrt(n_features * v)
        return {"gamma": float(gamma)}
    if kernel == "polynomial":
        return {
            "gamma": float(1.0 / n_features if gamma is None else gamma),
            "degree": int(degree),
            "coef0": float(1.0 if coef0 is None else coef0),
        }
    if kernel == "sigmoid":
        return {
            "gamma": float(1.0 / n_features if gamma is None else gamma),
            "coef0": float(1.0 if coef0 is None else coef0),
        }
    raise ValueError(f"unknown kernel {kernel!r}")


def kernel_matrix(X, Y=None, *, kernel="rbf", gamma=None, degree=3, coef0=None, params=None):
    """Kernel block K[i, j] = kappa(X[i], Y[j]) in float64.

    ``params`` (a dict as returned by :func:`default_kernel_params`) overrides the defaults; without
    it the defaults are resolved from ``X`` (the training data), as the library does.
    """
    X = np.asarray(X, dtype=np.float64)
    Y = X if Y is None else np.asarray(Y, dtype=np.float64)
    if params is None:
        params = default_kernel_params(X, kernel, gamma=gamma, degree=degree, coef0=coef0)
    if kernel == "linear":
        return np.einsum("ik,jk->ij", X, Y)
    if kernel == "rbf":
        return np.exp(-params["gamma"] * cdist(X, Y, metric="sqeuclidean"))
    if kernel == "laplacian":
        return np.exp(-params["gamma"] * cdist(X, Y, metric="euclidean"))
    inner = np.einsum("ik,jk->ij", X, Y)
    if kernel == "polynomial":
        return (params["gamma"] * inner + params["coef0"]) ** params["degree"]
    if kernel == "sigmoid":
        return np.tanh(params["gamma"] * inner + params["coef0"])
    raise ValueError(f"unknown kernel {kernel!r}")


# --------------------------------------------------------------------------- Eq. 4


def _weights(n, sample_weight):
    if sample_weight is None:
        return np.ones(n, dtype=np.float64)
    return np.asarray(sample_weight, dtype=np.float64)


def cluster_distances(K, labels, k, sample_weight=None):
    """dist[i, c] = K_ii - 2 S[i, c] / n_c + C_c / n_c^2, inf where cluster c is empty.

    n_c = sum_{j in c} w_j;  S[i, c] = sum_{j in c} w_j K[i, j];  C_c = sum_{i in c} w_i S[i, c].
    """
    K = np.asarray(K, dtype=np.float64)
    n = K.shape[0]
    w = _weights(n, sample_weight)
    dist = np.full((n, k), np.inf)
    diag = np.diag(K)
    for c in range(k):
        members = np.flatnonzero(labels == c)
        if members.size == 0:
            continue
        n_c = w[members].sum()
        S_c = K[:, members] @ w[members]
        C_c = w[members] @ S_c[members]
        dist[:, c] = diag - 2.0 * S_c / n_c + C_c / n_c**2
    return dist


def kernel_kmeans_objective(K, labels, sample_weight=None, k=None):
    """sum_i w_i dist(i, label_i) with the centres of ``labels`` themselves (empty clusters allowed)."""
    labels = np.asarray(labels)
    k = int(labels.max()) + 1 if k is None else k
    w = _weights(len(labels), sample_weight)
    dist = cluster_distances(K, labels, k, w)
    return float(np.sum(w * dist[np.arange(len(labels)), labels]))


def _refill_empty_clusters(labels, point_dist, k):
    """Move the farthest points into empty clusters, lowest empty cluster index first.

    ``point_dist[i]`` is point i's distance to the centre it was assigned to in the assignment step.
    A point is a candidate only if its current cluster would keep at least one point.
    """
    labels = labels.copy()
    counts = np.bincount(labels, minlength=k)
    for c in range(k):
        if counts[c] > 0:
            continue
        candidates = np.flatnonzero(counts[labels] >= 2)
        if candidates.size == 0:
            break
        far = candidates[np.argmax(point_dist[candidates])]  # first index on ties
        counts[labels[far]] -= 1
        labels[far] = c
        counts[c] += 1
    return labels


@dataclass
class ReferenceResult:
    labels: np.ndarray
    objective: float
    objective_history: np.ndarray
    n_iter: int
    converged: bool
    history_labels: list = field(default_factory=list)


def reference_kernel_kmeans(K, init_labels, k, sample_weight=None, max_iter=300, tol=0.0):
    """Weighted Lloyd iterations of Eq. 4 on a kernel matrix ``K`` from ``init_labels``.

    history[0] is the objective of the initial labels; each assignment step that changes a label
    appends the objective of the new labels. Stops when no label changes, when
    |J_prev - J_new| <= tol * |J_prev|, or after ``max_iter`` assignment steps.
    """
    K = np.asarray(K, dtype=np.float64)
    n = K.shape[0]
    w = _weights(n, sample_weight)
    labels = np.asarray(init_labels, dtype=np.int64).copy()
    objective = kernel_kmeans_objective(K, labels, w, k=k)
    history = [objective]
    history_labels = [labels.copy()]
    converged = False
    n_iter = 0
    for _ in range(max_iter):
        n_iter += 1
        dist = cluster_distances(K, labels, k, w)
        new = np.argmin(dist, axis=1)
        point_dist = dist[np.arange(n), new]
        new = _refill_empty_clusters(new, point_dist, k)
        n_changed = int(np.count_nonzero(new != labels))
        if n_changed == 0:
            converged = True
            break
        labels = new
        previous, objective = objective, kernel_kmeans_objective(K, labels, w, k=k)
        history.append(objective)
        history_labels.append(labels.copy())
        if abs(previous - objective) <= tol * abs(previous):
            converged = True
            break
    return ReferenceResult(
        labels=labels,
        objective=objective,
        objective_history=np.asarray(history),
        n_iter=n_iter,
        converged=converged,
        history_labels=history_labels,
    )


def assign_new_points(K_new_train, K_train, labels, k, sample_weight=None):
    """Nearest centre for new points: argmin_c -2 S[m, c] / n_c + C_c / n_c^2.

    ``K_new_train`` is (m, n_train); S[m, c] = sum_{j in c} w_j K(new_m, x_j). The K(new, new) term
    is the same for every cluster and is left out.
    """
    K_new_train = np.asarray(K_new_train, dtype=np.float64)
    K_train = np.asarray(K_train, dtype=np.float64)
    labels = np.asarray(labels)
    w = _weights(K_train.shape[0], sample_weight)
    score = np.full((K_new_train.shape[0], k), np.inf)
    for c in range(k):
        members = np.flatnonzero(labels == c)
        if members.size == 0:
            continue
        n_c = w[members].sum()
        S_c = K_new_train[:, members] @ w[members]
        C_c = w[members] @ (K_train[np.ix_(members, members)] @ w[members])
        score[:, c] = -2.0 * S_c / n_c + C_c / n_c**2
    return np.argmin(score, axis=1)


def approx_distances(K_B, K_BB, diag, labels, k, sample_weight=None, rcond=None):
    """Approximate kernel k-means (Chitta et al., KDD 2011): centres in the span of the landmarks B,

    alpha_c = K_BB^+ K_B^T u_c / n_c  (u_c = w on cluster c, 0 elsewhere),
    dist[i, c] = K_ii - 2 (K_B alpha_c)_i + alpha_c^T K_BB alpha_c, inf where cluster c is empty.

    ``K_B`` is (n, m), ``K_BB`` (m, m), ``diag`` the K_ii; ``rcond`` the pseudo-inverse's cutoff relative to the
    largest singular value (numpy's ``pinv``).
    """
    K_B = np.asarray(K_B, dtype=np.float64)
    pinv = np.linalg.pinv(np.asarray(K_BB, dtype=np.float64), rcond=1e-15 if rcond is None else rcond,
                          hermitian=True)
    w = _weights(K_B.shape[0], sample_weight)
    dist = np.full((K_B.shape[0], k), np.inf)
    for c in range(k):
        u = np.where(labels == c, w, 0.0)
        n_c = u.sum()
        if n_c == 0:
            continue
        alpha = pinv @ (K_B.T @ u) / n_c
        dist[:, c] = diag - 2.0 * (K_B @ alpha) + alpha @ K_BB @ alpha
    return dist


def reference_approx_kernel_kmeans(K_B, K_BB, diag, init_labels, k, sample_weight=None, max_iter=300, tol=0.0,
                                   rcond=None):
    """Lloyd iterations of approximate kernel k-means (:func:`approx_distances`) from ``init_labels``; the
    objective is sum_i w_i dist(i, label_i). Same stopping and empty-cluster rules as reference_kernel_kmeans."""
    n = np.asarray(K_B).shape[0]
    w = _weights(n, sample_weight)
    labels = np.asarray(init_labels, dtype=np.int64).copy()

    def objective_of(lab):
        dist = approx_distances(K_B, K_BB, diag, lab, k, w, rcond)
        return float(np.sum(w * dist[np.arange(n), lab]))

    objective = objective_of(labels)
    history, history_labels = [objective], [labels.copy()]
    converged, n_iter = False, 0
    for _ in range(max_iter):
        n_iter += 1
        dist = approx_distances(K_B, K_BB, diag, labels, k, w, rcond)
        new = np.argmin(dist, axis=1)
        new = _refill_empty_clusters(new, dist[np.arange(n), new], k)
        if np.count_nonzero(new != labels) == 0:
            converged = True
            break
        labels = new
        previous, objective = objective, objective_of(labels)
        history.append(objective)
        history_labels.append(labels.copy())
        if abs(previous - objective) <= tol * abs(previous):
            converged = True
            break
    return ReferenceResult(labels=labels, objective=objective, objective_history=np.asarray(history),
                           n_iter=n_iter, converged=converged, history_labels=history_labels)


def nearest_neighbors(X, k):
    """(index, sq): each row's k nearest other rows by float64 distance of X's values, ties to the lower index."""
    X64 = np.asarray(X, dtype=np.float64)
    D = cdist(X64, X64, "sqeuclidean")
    np.fill_diagonal(D, np.inf)
    index = np.argsort(D, axis=1, kind="stable")[:, :k]
    return index, np.take_along_axis(D, index, axis=1)
