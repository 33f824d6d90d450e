"""Internal cluster-quality indices (no ground truth needed), evaluated on the device in float64.

The definitions are those of the thesis slides (papers/kernel-kmeans-thesis-slides.txt, "Evaluation
Strategy"), in the input space with Euclidean distances, c_l the mean of cluster l, c the mean of all points:

- silhouette: s(x_i) = (b(x_i) - a(x_i)) / max(a(x_i), b(x_i)), a the mean distance to the other members of
  its cluster, b the smallest mean distance to another cluster's members; the score is the mean of s over all
  points (s = 0 for a point alone in its cluster, as scikit-learn and Rousseeuw define it). O(n^2 d): the
  distances are computed in row tiles and reduced per cluster at once, never as an n x n matrix.
- Calinski-Harabasz: (B_k / (k - 1)) / (W_k / (N - k)), B_k = sum_l |pi_l| ||c_l - c||^2,
  W_k = sum_l sum_{x_i in pi_l} ||x_i - c_l||^2.
- Davies-Bouldin: (1/k) sum_l max_{m != l} (S_l + S_m) / ||c_l - m_m||. The slides print S_l as the mean
  *squared* distance to c_l; the index as Davies and Bouldin define it (q = 1) and as scikit-learn computes it
  uses the mean distance, which is what is computed here.
- sum of variances: E = sum_l sum_{x_i in pi_l} ||x_i - c_l||^2 (= W_k, the k-means inertia).
"""

from __future__ import annotations

import numpy as np

from kkmgpu import _validation

from kkmgpu.kernels import blocks as _kernels
from kkmgpu.backend.device import is_cupy_array, resolve_device

__all__ = ["silhouette", "calinski_harabasz", "davies_bouldin", "sum_of_variances"]


def _prepare(X, labels, device, name, *, min_clusters=2):
    """(backend, X float64 centred on the device, codes on the device, host counts (k,), k)."""
    backend = resolve_device(device, (X,))
    with backend.activate():
        X = _validation.check_data(X, backend)
        n = X.shape[0]
        labels_h = labels.get() if is_cupy_array(labels) else np.asarray(labels)
        if labels_h.ndim != 1 or labels_h.shape[0] != n:
            raise ValueError(f"labels have shape {labels_h.shape}; expected ({n},), one label per row of X.")
        _, codes_h = np.unique(labels_h, return_inverse=True)
        codes_h = codes_h.reshape(-1).astype(np.int64)
        k = int(codes_h.max()) + 1 if n else 0
        if min_clusters == 2 and not 2 <= k <= n - 1:
            raise ValueError(f"{name} is defined for 2 <= number of clusters <= n_samples - 1; got {k} distinct "
                             f"label(s) for n_samples={n}.")
        xp = backend.xp
        X = X.astype(xp.float64)
        X = X - X.mean(axis=0)  # distances are translation invariant; centring keeps the GEMM form accurate
        counts = np.bincount(codes_h, minlength=k).astype(np.float64)
        return backend, X, backend.asarray(codes_h), counts, k


def _one_hot(codes, k, xp):
    Y = xp.zeros((codes.shape[0], k), dtype=xp.float64)
    Y[xp.arange(codes.shape[0]), codes] = 1.0
    return Y


def _centroids(X, codes, counts, k, backend):
    xp = backend.xp
    return (_one_hot(codes, k, xp).T @ X) / backend.asarray(counts)[:, None]


def _centroid_rounding(X, Y, counts, backend):
    """Bound (k,) on the rounding error of each centroid (Y.T @ X) / counts of the centred float64 X.

    A centroid is a sum of n_l centred values over n_l: its error is at most about (n_l + 2) eps
    mean_{i in l} |x_i| per coordinate (a data mean that is not representable shifts centroids that coincide
    in exact arithmetic ~1e-17 apart, and leaves ~1e-32 of within-cluster dispersion in clusters of one
    repeated point).
    """
    magnitude = backend.to_host(Y.T @ backend.xp.abs(X)) / counts[:, None]
    return (counts + 2.0) * np.finfo(np.float64).eps * np.sqrt((magnitude ** 2).sum(axis=1))


def silhouette(X, labels, *, device="auto", batch_size=None) -> float:
    """Mean silhouette coefficient of a clustering, with Euclidean distances in the input space.

    Computed in float64 in row tiles on the device: each tile's distances to all points are reduced
    to per-cluster sums at once, so memory is O(batch_size * n), time O(n^2 d).

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
        NumPy or CuPy array.
    labels : array of shape (n_samples,)
        Cluster labels (any values; at least 2 and at most n_samples - 1 distinct ones).
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
    batch_size : int, optional
        Rows per tile (default: tiles of about 64 MiB of distances).

    Returns
    -------
    float
        In [-1, 1]; higher is better. A point alone in its cluster counts as 0.

    Raises
    ------
    ValueError
        For invalid X or labels, or fewer than 2 or more than n_samples - 1 clusters.

    Examples
    --------
    >>> import numpy as np
    >>> from kkmgpu.metrics import silhouette
    >>> X = np.array([[0.0, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 1.0]])
    >>> round(silhouette(X, [0, 0, 1, 1], device="cpu"), 4)
    0.9002
    """
    if batch_size is not None:
        batch_size = _validation.check_int(batch_size, "batch_size", minimum=1)
    backend, X, codes, counts, k = _prepare(X, labels, device, "the silhouette")
    xp = backend.xp
    with backend.activate():
        n = X.shape[0]
        Y = _one_hot(codes, k, xp)
        sq = (X * X).sum(axis=1)
        counts_d = backend.asarray(counts)
        # the distance expression below holds up to three (b, n) float64 temporaries at once: within WORK_FRACTION
        # of the free memory together
        step = batch_size or min(_kernels.tile_rows(n, 8), _kernels.tile_rows(n, 3 * 8, 2**62, backend=backend))
        total = 0.0
        for i0 in range(0, n, step):
            i1 = min(n, i0 + step)
            D2 = sq[i0:i1, None] + sq[None, :] - 2.0 * (X[i0:i1] @ X.T)
            D = xp.sqrt(xp.maximum(D2, 0.0))
            rows = xp.arange(i1 - i0)
            D[rows, i0 + rows] = 0.0  # the distance of a point to itself is exactly 0
            sums = D @ Y                                     # (b, k): summed distance to each cluster
            own = codes[i0:i1]
            own_count = counts_d[own]
            a = sums[rows, own] / xp.maximum(own_count - 1.0, 1.0)
            mean_other = sums / counts_d[None, :]
            mean_other[rows, own] = xp.inf
            b = mean_other.min(axis=1)
            denom = xp.maximum(a, b)
            s = xp.where((own_count > 1) & (denom > 0), (b - a) / xp.where(denom > 0, denom, 1.0), 0.0)
            total += float(s.sum())
        return total / n


def calinski_harabasz(X, labels, *, device="auto") -> float:
    """Calinski-Harabasz index (B_k / (k - 1)) / (W_k / (n - k)), between over within dispersion.

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
    labels : array of shape (n_samples,)
        At least 2 and at most n_samples - 1 distinct labels.
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"

    Returns
    -------
    float
        >= 0; higher is better. 1.0 when every cluster is a single repeated point (W_k = 0 up to rounding), as in
        scikit-learn.

    Raises
    ------
    ValueError
        For invalid X or labels, or fewer than 2 or more than n_samples - 1 clusters.

    Examples
    --------
    >>> import numpy as np
    >>> from kkmgpu.metrics import calinski_harabasz
    >>> X = np.array([[0.0, 0.0], [0.0, 2.0], [4.0, 0.0], [4.0, 2.0]])
    >>> calinski_harabasz(X, [0, 0, 1, 1], device="cpu")   # B = 16, W = 4
    8.0
    """
    backend, X, codes, counts, k = _prepare(X, labels, device, "the Calinski-Harabasz index")
    with backend.activate():
        n = X.shape[0]
        Y = _one_hot(codes, k, backend.xp)
        C = (Y.T @ X) / backend.asarray(counts)[:, None]
        between = float((backend.asarray(counts) * (C * C).sum(axis=1)).sum())  # X is centred: c = 0
        within = float(((X - C[codes]) ** 2).sum())
        # every cluster one repeated point, up to the rounding of the centroids: scikit-learn's W_k = 0 case
        if within <= float((counts * (2.0 * _centroid_rounding(X, Y, counts, backend)) ** 2).sum()):
            return 1.0
        return between * (n - k) / (within * (k - 1))


def davies_bouldin(X, labels, *, device="auto") -> float:
    """Davies-Bouldin index: the mean over clusters of max_{m != l} (S_l + S_m) / ||c_l - c_m||.

    S_l is the mean Euclidean distance of cluster l's points to its centroid (Davies and Bouldin's q = 1,
    as scikit-learn computes it; the thesis slides print the mean squared distance).

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
    labels : array of shape (n_samples,)
        At least 2 and at most n_samples - 1 distinct labels.
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"

    Returns
    -------
    float
        >= 0; lower is better. Pairs of coinciding centroids contribute 0, and the index is 0 when all
        centroids or all clusters' spreads are 0 (scikit-learn's conventions).

    Raises
    ------
    ValueError
        For invalid X or labels, or fewer than 2 or more than n_samples - 1 clusters.

    Examples
    --------
    >>> import numpy as np
    >>> from kkmgpu.metrics import davies_bouldin
    >>> X = np.array([[0.0, 0.0], [0.0, 2.0], [4.0, 0.0], [4.0, 2.0]])
    >>> davies_bouldin(X, [0, 0, 1, 1], device="cpu")       # (1 + 1) / 4
    0.5
    """
    backend, X, codes, counts, k = _prepare(X, labels, device, "the Davies-Bouldin index")
    xp = backend.xp
    with backend.activate():
        Y = _one_hot(codes, k, xp)
        C = (Y.T @ X) / backend.asarray(counts)[:, None]
        distance = xp.sqrt(((X - C[codes]) ** 2).sum(axis=1))
        spread = backend.to_host(Y.T @ distance) / counts
        C_h = backend.to_host(C)
        gaps = np.sqrt(np.maximum(((C_h[:, None, :] - C_h[None, :, :]) ** 2).sum(axis=2), 0.0))
        # centroids closer than their rounding errors together coincide as far as float64 can tell: they count
        # as coinciding (scikit-learn's convention for equal centroids), not as a ratio of ~1e15
        error = _centroid_rounding(X, Y, counts, backend)
        gaps[gaps <= error[:, None] + error[None, :]] = 0.0
        if np.allclose(spread, 0) or np.allclose(gaps, 0):
            return 0.0
        gaps[gaps == 0] = np.inf
        ratio = (spread[:, None] + spread[None, :]) / gaps
        np.fill_diagonal(ratio, -np.inf)
        return float(ratio.max(axis=1).mean())


def sum_of_variances(X, labels, *, device="auto") -> float:
    """Sum of variances E = sum_l sum_{x_i in pi_l} ||x_i - c_l||^2 (the thesis slides' definition).

    The within-cluster sum of squares (k-means inertia) of the partition in the input space.

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
    labels : array of shape (n_samples,)
        Any number of distinct labels (one cluster gives the total sum of squares).
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"

    Returns
    -------
    float
        >= 0; lower is better (it falls as k grows, so compare partitions with the same k).

    Raises
    ------
    ValueError
        For invalid X or labels.

    Examples
    --------
    >>> import numpy as np
    >>> from kkmgpu.metrics import sum_of_variances
    >>> X = np.array([[0.0, 0.0], [0.0, 2.0], [4.0, 0.0], [4.0, 2.0]])
    >>> sum_of_variances(X, [0, 0, 1, 1], device="cpu")
    4.0
    """
    backend, X, codes, counts, k = _prepare(X, labels, device, "the sum of variances", min_clusters=1)
    with backend.activate():
        C = _centroids(X, codes, counts, k, backend)
        return float(((X - C[codes]) ** 2).sum())
