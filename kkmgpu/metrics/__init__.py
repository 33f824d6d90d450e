"""Clustering metrics: the kernel k-means objective, NMI and ARI, and c-NNC (:func:`cnnc`, in ``_cnnc.py``).

NMI and ARI are scikit-learn's (``normalized_mutual_info_score`` with the arithmetic mean,
``adjusted_rand_score``) when scikit-learn is installed; otherwise the same definitions are
computed here from the contingency table, so kkmgpu needs no scikit-learn at run time.

Internal indices of the thesis slides (kernel-kmeans-thesis-slides.txt), computed on the device in
float64 (:mod:`kkmgpu.metrics.internal`): :func:`silhouette` (tiled, O(n^2 d)), :func:`calinski_harabasz`,
:func:`davies_bouldin` and :func:`sum_of_variances`.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse
from scipy.special import comb

from kkmgpu.backend.device import import_cupy, is_cupy_array
from kkmgpu.metrics.cnnc import cnnc  # c-NNC (Off-the-grid paper, §7): nearest-neighbour clustering cost, lower is better
from kkmgpu.metrics.internal import calinski_harabasz, davies_bouldin, silhouette, sum_of_variances  # thesis slides' indices

__all__ = ["kernel_kmeans_objective", "nmi", "ari", "cnnc",
           "silhouette", "calinski_harabasz", "davies_bouldin", "sum_of_variances"]


def _host(a):
    return a.get() if is_cupy_array(a) else np.asarray(a)


def _check_labelings(labels_true, labels_pred):
    a, b = _host(labels_true), _host(labels_pred)
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(f"labelings must be 1-D; got shapes {a.shape} and {b.shape}.")
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"labelings have different lengths {a.shape[0]} and {b.shape[0]}.")
    return a, b


def kernel_kmeans_objective(K, labels, sample_weight=None) -> float:
    """sum_i w_i ||phi(x_i) - m_{label_i}||^2 with m_c the weighted mean of cluster c in feature space.

    Parameters
    ----------
    K : array of shape (n_samples, n_samples)
        Kernel matrix (NumPy or CuPy); evaluated in float64.
    labels : array of shape (n_samples,)
    sample_weight : array of shape (n_samples,), optional

    Returns
    -------
    float
        sum_i w_i K_ii - sum_c (sum_{i, j in c} w_i w_j K_ij) / n_c.
    """
    xp = import_cupy() if is_cupy_array(K) else np
    K = xp.asarray(K)
    labels = xp.asarray(_host(labels) if xp is np else labels).astype(xp.int64)
    n = K.shape[0]
    if K.ndim != 2 or K.shape[1] != n or labels.shape != (n,):
        raise ValueError(f"K must be (n, n) and labels (n,); got {K.shape} and {labels.shape}.")
    w = xp.ones(n) if sample_weight is None else xp.asarray(sample_weight, dtype=xp.float64)
    k = int(labels.max()) + 1
    Y = xp.zeros((n, k))
    Y[xp.arange(n), labels] = w
    S = K.astype(xp.float64) @ Y                     # S[i, c] = sum_{j in c} w_j K_ij
    sizes = Y.sum(axis=0)
    within = (Y * S).sum(axis=0)                     # C_c
    nonempty = sizes > 0
    total = float((w * xp.diagonal(K).astype(xp.float64)).sum())
    return total - float((within[nonempty] / sizes[nonempty]).sum())


def _contingency(a, b):
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    return sparse.coo_matrix((np.ones(ai.size), (ai, bi))).tocsr()


def _entropy_from_counts(counts):
    counts = counts[counts > 0].astype(np.float64)
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def _nmi_numpy(labels_true, labels_pred) -> float:
    a, b = _check_labelings(labels_true, labels_pred)
    if a.size == 0:
        return 1.0
    classes, clusters = np.unique(a), np.unique(b)
    if classes.size == clusters.size == 1 or classes.size == clusters.size == a.size:
        return 1.0
    C = _contingency(a, b)
    nz_rows, nz_cols = C.nonzero()
    nij = np.asarray(C[nz_rows, nz_cols]).ravel()
    n = float(a.size)
    pi = np.asarray(C.sum(axis=1)).ravel()
    pj = np.asarray(C.sum(axis=0)).ravel()
    mi = float(np.sum(nij / n * (np.log(nij * n) - np.log(pi[nz_rows] * pj[nz_cols]))))
    mi = max(mi, 0.0)
    h_true, h_pred = _entropy_from_counts(pi), _entropy_from_counts(pj)
    denom = (h_true + h_pred) / 2.0
    return float(mi / max(denom, np.finfo(np.float64).eps))


def _ari_numpy(labels_true, labels_pred) -> float:
    a, b = _check_labelings(labels_true, labels_pred)
    n = a.size
    C = _contingency(a, b)
    sum_comb = float(comb(C.data, 2).sum())
    sum_a = float(comb(np.asarray(C.sum(axis=1)).ravel(), 2).sum())
    sum_b = float(comb(np.asarray(C.sum(axis=0)).ravel(), 2).sum())
    total = float(comb(n, 2))
    if total == 0:
        return 1.0
    expected = sum_a * sum_b / total
    maximum = (sum_a + sum_b) / 2.0
    if maximum == expected:
        return 1.0
    return (sum_comb - expected) / (maximum - expected)


def nmi(labels_true, labels_pred) -> float:
    """Normalised mutual information (arithmetic normalisation), as scikit-learn defines it."""
    try:
        from sklearn.metrics import normalized_mutual_info_score
    except ImportError:
        return _nmi_numpy(labels_true, labels_pred)
    a, b = _check_labelings(labels_true, labels_pred)
    return float(normalized_mutual_info_score(a, b))


def ari(labels_true, labels_pred) -> float:
    """Adjusted Rand index, as scikit-learn defines it."""
    try:
        from sklearn.metrics import adjusted_rand_score
    except ImportError:
        return _ari_numpy(labels_true, labels_pred)
    a, b = _check_labelings(labels_true, labels_pred)
    return float(adjusted_rand_score(a, b))
