"""c-NNC, the nearest-neighbour clustering cost of the Off-the-grid paper (papers/off-the-grid-bandwidth-search.txt).

For a point x_i let nu_1(x_i), nu_2(x_i), ... be the other points of X in order of increasing Euclidean
distance (x_i itself excluded), and c(x) the cluster of x. Then

    NNC(i, c)          = (1 / c) sum_{j=1}^{c} I{c(x_i) != c(nu_j(x_i))}
    NNC_cluster(pi)    = 1 / (C max{1, |pi|}) sum_{i in pi} sum_{c=1}^{n-1} (1 / c) NNC(i, c)
    C                  = log(n - 1) + gamma_Euler + 1 / (2n - 2)
    c-NNC(P)           = (D + sum_{pi in P} NNC_cluster(pi)) / k,   D = number of empty clusters among the k.

The paper writes the inner sum up to n; a point has only n - 1 other points, so the sum stops at n - 1 (C is the
asymptotic expansion of the harmonic number H_{n-1}, which is what bounds the per-point sum, so this is the reading
that makes C the right normaliser).

Computation, on the device of ``backend.xp``, in row tiles (memory O(tile * n), never the n x n matrix at once
unless it is small enough to keep): squared distances of the tile to every point by one GEMM
(||x||^2 + ||y||^2 - 2 x.y in float64, on data shifted by its rounded mean), the point itself moved to the front
and dropped, a stable argsort per row (ties, e.g. duplicate points, are broken by point index, the lower index
counting as nearer), the neighbours' labels gathered and compared with the point's own. The per-point sum uses
the identity

    sum_{c=1}^{n-1} (1 / c^2) sum_{j<=c} m_j  =  sum_{j=1}^{n-1} m_j T_j,   T_j = sum_{c=j}^{n-1} 1 / c^2,

(m_j the mismatch indicator of the j-th neighbour: the cumulative mismatch counts weighted by 1/c^2, summed by
parts), so each tile needs one matrix-vector product instead of a cumulative sum.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from kkmgpu.backend.device import Backend, is_cupy_array, work_bytes

#: Bytes a row tile of the neighbour search may take (distances, argsort output, gathered labels, mismatches).
TILE_BYTES_CPU = 64 * 2**20
TILE_BYTES_GPU = 512 * 2**20
#: Bytes per (row, column) element of a tile: float64 distances, int64 argsort output, int32 order,
#: int32 gathered labels, float64 mismatches.
_BYTES_PER_ELEMENT = 8 + 8 + 4 + 4 + 8
#: The neighbour order (int32, n x (n - 1)) is kept between scores when it takes at most this many bytes.
KEEP_ORDER_BYTES_CPU = 256 * 2**20
KEEP_ORDER_BYTES_GPU = 1024 * 2**20
EULER_GAMMA = 0.57721566490153286061


def normaliser(n: int) -> float:
    """C = log(n - 1) + gamma_Euler + 1 / (2n - 2) (paper §7), for n >= 2 points."""
    return math.log(n - 1) + EULER_GAMMA + 1.0 / (2.0 * n - 2.0)


def tail_weights(n: int) -> np.ndarray:
    """T_j = sum_{c=j}^{n-1} 1 / c^2 for j = 1..n-1 (float64, host), summed from the small end."""
    c = np.arange(1, n, dtype=np.float64)
    return np.cumsum((1.0 / c**2)[::-1])[::-1].copy()


def default_batch_size(n: int, backend: Backend) -> int:
    """Rows per tile of the neighbour search: TILE_BYTES_(CPU|GPU), within WORK_FRACTION of the free memory."""
    row = _BYTES_PER_ELEMENT * max(n, 1)
    budget = work_bytes(TILE_BYTES_GPU if backend.is_gpu else TILE_BYTES_CPU, backend, minimum=row)
    return int(max(1, min(n, budget // row)))


def check_batch_size(batch_size, n: int, backend: Backend) -> int:
    if batch_size is None:
        return default_batch_size(n, backend)
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral):
        raise TypeError(f"batch_size={batch_size!r} must be an integer number of rows or None.")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1 (rows per tile).")
    return int(min(batch_size, n))


def check_labels(labels, n: int, k=None):
    """Host int64 labels (n,) and k; labels must be integers in [0, k), k defaults to labels.max() + 1."""
    a = labels.get() if is_cupy_array(labels) else np.asarray(labels)
    if a.ndim != 1 or a.shape[0] != n:
        raise ValueError(f"labels have shape {a.shape}; expected ({n},), one label per row of X.")
    if a.dtype.kind not in "iu":
        if a.dtype.kind == "f" and np.isfinite(a).all() and (a == np.round(a)).all():
            a = a.astype(np.int64)
        else:
            raise ValueError(f"labels have dtype {a.dtype}; integer cluster indices are required.")
    a = a.astype(np.int64)
    if a.min() < 0:
        raise ValueError(f"labels must be >= 0; got the value {int(a.min())}.")
    if k is None:
        k = int(a.max()) + 1
    else:
        if isinstance(k, bool) or not isinstance(k, numbers.Integral):
            raise TypeError(f"k={k!r} must be an integer number of clusters or None.")
        k = int(k)
        if k < 1:
            raise ValueError(f"k={k} must be >= 1.")
        if a.max() >= k:
            raise ValueError(f"labels must lie in [0, k={k}); got the value {int(a.max())}.")
    return a, k


class NeighbourOrder:
    """Every point's other points in order of increasing distance, produced in row tiles on the device.

    ``tiles()`` yields ``(i0, i1, order)`` with ``order`` an int32 device array of shape (i1 - i0, n - 1):
    ``order[r, j - 1]`` is the index of the j-th nearest neighbour of point i0 + r (ties by lower index).
    When n x (n - 1) int32 fit ``keep_bytes`` the tiles are computed once and kept, so scoring many
    labelings of the same X (the bandwidth search) sorts only once.
    """

    def __init__(self, X, backend: Backend, batch_size: int, keep_bytes: int | None = None):
        xp = backend.xp
        self.backend = backend
        self.n = int(X.shape[0])
        Xc = X.astype(xp.float64)
        # Shifting by the rounded mean leaves distances unchanged and limits cancellation in the GEMM form;
        # an integer shift keeps integer-valued data (grids, duplicates) exact, so their distance ties stay ties.
        self.X = Xc - xp.round(Xc.mean(axis=0))
        self.sq_norms = (self.X * self.X).sum(axis=1)
        self.batch_size = batch_size
        if keep_bytes is None:  # kept beside whatever else the caller holds: within WORK_FRACTION of the free memory
            keep_bytes = work_bytes(KEEP_ORDER_BYTES_GPU if backend.is_gpu else KEEP_ORDER_BYTES_CPU, backend, 0)
        self.keep = self.n * (self.n - 1) * 4 <= keep_bytes
        self._kept = None

    def _tile(self, i0, i1):
        xp = self.backend.xp
        n = self.n
        D = self.sq_norms[i0:i1, None] + self.sq_norms[None, :] - 2.0 * (self.X[i0:i1] @ self.X.T)
        xp.maximum(D, 0.0, out=D)
        rows = xp.arange(i1 - i0)
        D[rows, rows + i0] = -1.0              # the point itself sorts first and is dropped
        order = xp.argsort(D, axis=1, kind="stable") if xp is np else xp.argsort(D, axis=1)
        del D
        return order[:, 1:].astype(xp.int32)

    def tiles(self):
        if self._kept is not None:
            yield from self._kept
            return
        kept = [] if self.keep else None
        for i0 in range(0, self.n, self.batch_size):
            i1 = min(self.n, i0 + self.batch_size)
            tile = (i0, i1, self._tile(i0, i1))
            if kept is not None:
                kept.append(tile)
            yield tile
        if kept is not None:
            self._kept = kept


def per_point_sums(order: NeighbourOrder, labels_d):
    """s_i = sum_{c=1}^{n-1} (1/c) NNC(i, c) for every point, as a float64 device array (n,)."""
    xp = order.backend.xp
    weights = order.backend.asarray(tail_weights(order.n))
    out = xp.empty(order.n, dtype=xp.float64)
    for i0, i1, tile in order.tiles():
        mismatch = (labels_d[tile] != labels_d[i0:i1, None]).astype(xp.float64)
        out[i0:i1] = mismatch @ weights
    return out


def cnnc_from_order(order: NeighbourOrder, labels_h: np.ndarray, k: int) -> float:
    """c-NNC of validated host labels (int64 in [0, k)) given the neighbour order of X."""
    n = order.n
    labels_d = order.backend.asarray(labels_h.astype(np.int32))
    s = per_point_sums(order, labels_d)
    # summed on the host: a GPU's weighted bincount adds with atomics, in an order that changes run to run
    totals = np.bincount(labels_h, weights=order.backend.to_host(s).astype(np.float64), minlength=k)
    sizes = np.bincount(labels_h, minlength=k)
    empty = int((sizes == 0).sum())
    clusters = float(np.sum(totals / (normaliser(n) * np.maximum(1, sizes))))
    return (empty + clusters) / k


class CnncScorer:
    """c-NNC of many labelings of the same data: the neighbour order is computed once (kept when it fits).

    Used by the bandwidth search, which scores every clustering it produces. ``X`` must already be a
    validated 2-D finite array with at least two rows; labels are validated per call.

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
    backend : Backend
    batch_size : int, optional
        Rows per tile (default: a tile of about 64 MiB on the CPU, 512 MiB on a GPU).
    """

    def __init__(self, X, backend: Backend, batch_size=None):
        with backend.activate():
            X = backend.asarray(X)
            self.order = NeighbourOrder(X, backend, check_batch_size(batch_size, X.shape[0], backend))
        self.backend = backend
        self.n = self.order.n

    def __call__(self, labels, k=None) -> float:
        labels_h, k = check_labels(labels, self.n, k)
        with self.backend.activate():
            return cnnc_from_order(self.order, labels_h, k)


def cnnc(X, labels, k=None, *, device="auto", batch_size=None) -> float:
    """c-NNC, the nearest-neighbour clustering cost of a partition (Off-the-grid paper, §7); lower is better.

    With nu_j(x_i) the j-th nearest other point of x_i (Euclidean; ties broken by lower point index) and
    NNC(i, c) the fraction of the c nearest neighbours of x_i that lie outside x_i's cluster,

        NNC_cluster(pi) = 1 / (C max{1, |pi|}) sum_{i in pi} sum_{c=1}^{n-1} NNC(i, c) / c,
        c-NNC = (D + sum_pi NNC_cluster(pi)) / k,

    with C = log(n - 1) + gamma_Euler + 1 / (2n - 2) and D the number of empty clusters among the k. The
    paper writes the inner sum to n; a point has n - 1 neighbours, so it stops at n - 1. Without empty
    clusters 0 <= c-NNC <= 1; an empty cluster adds 1 / k (trivial partitions are penalised). The value does
    not depend on any kernel or bandwidth, so it compares clusterings found with different ones.

    Computed on the device in row tiles (squared distances by GEMM in float64, a stable sort per row,
    mismatches weighted by 1/c^2): O(n^2 (d + log n)) time, O(batch_size * n) memory.

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
        The data the clustering was made from (NumPy or CuPy); n_samples >= 2.
    labels : array of shape (n_samples,)
        Cluster index of every row, integers in [0, k).
    k : int, optional
        Number of clusters of the partition (empty ones count in D). Default ``labels.max() + 1``.
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
    batch_size : int, optional
        Rows per tile; default a tile of about 64 MiB on the CPU (512 MiB on a GPU).

    Returns
    -------
    float
        The c-NNC value, in [0, 1] when no cluster is empty.

    Raises
    ------
    ValueError
        If X is not 2-D and finite or has fewer than 2 rows, labels do not have one integer in [0, k)
        per row, k < 1, or batch_size < 1.
    TypeError
        If k or batch_size is not an integer.
    DeviceUnavailableError
        If a GPU is requested but none is usable.

    Examples
    --------
    Two pairs far apart: each point's nearest neighbour shares its cluster, the other two do not, so every
    point contributes 1/2^2 + 2/3^2, divided by C = log 3 + gamma + 1/6:

    >>> import numpy as np
    >>> from kkmgpu.metrics import cnnc
    >>> X = np.array([[0.0], [1.0], [10.0], [11.0]])
    >>> round(cnnc(X, [0, 0, 1, 1], device="cpu"), 6)
    0.256295
    >>> round(cnnc(X, [0, 0, 1, 1], k=3, device="cpu"), 6)   # one empty cluster adds 1/3
    0.504197
    """
    from kkmgpu import _validation
    from kkmgpu.backend.device import resolve_device

    backend = resolve_device(device, (X, labels))
    with backend.activate():
        X = _validation.check_data(X, backend)
        n = X.shape[0]
        if n < 2:
            raise ValueError(f"X has {n} row; c-NNC needs at least 2 points (every point needs a neighbour).")
        labels_h, k = check_labels(labels, n, k)
        order = NeighbourOrder(X, backend, check_batch_size(batch_size, n, backend), keep_bytes=0)
        return cnnc_from_order(order, labels_h, k)
