"""Kernel k-means on a Dask cluster: rows partitioned across workers, exact (tiled engine) and CATS.

``import kkmgpu`` does not import this module (nor Dask); ``import kkmgpu.dask`` does, and needs the
``dask`` extra (``pip install "kkmgpu[dask]"``: dask[array] and distributed).

How a run is distributed (W workers, n points, d features, k clusters):

- the rows are split into W contiguous blocks, one per worker; every worker also holds the prepared
  features of *all* n points (the columns of its kernel tiles), gathered once from the Dask array's
  chunks: O(n d) memory per worker, plus its block's n_b x k cluster sums and one kernel tile;
- exact (method="exact"): the single-device Lloyd driver (:func:`kkmgpu.engine.lloyd.run_restarts`) runs on the
  client over an operator whose cluster sums are the workers' row blocks (:class:`_DaskOperator`): each
  iteration every worker computes the cluster sums S of its rows against all points with the tiled engine
  (:class:`kkmgpu.engine.tiled.TiledKernelOperator`, incremental when few points moved), and returns the k-sized
  partial sizes and within-cluster totals; the client reduces them, sends the totals back, every worker
  assigns its rows, and the client gathers the n labels (int32) and broadcasts them. Restarts, stopping
  rules, the full refresh and the empty-cluster refill are the driver's own. Per iteration and worker:
  4 n bytes of labels in, 4 n_b bytes of labels and O(k) numbers out;
- CATS (method="cats"): CATS's own loop and restarts (:func:`kkmgpu.engine.sampled.iterate`, :func:`kkmgpu.engine.sampled.restarts`)
  run on the client over :class:`_DaskCatsPasses`: the client samples the l points per cluster (same random
  stream as :func:`kkmgpu.fit`), the workers return their rows' partial L_c w_c (k x l numbers), the client
  computes the coefficients alpha (k x l) and broadcasts them, the workers assign their rows.

From the same initial labels (and the same ``random_state`` for CATS) the labels equal those of
:func:`kkmgpu.fit` with ``engine="tiled"`` (or "dense") on one device, up to the rounding of sums
taken in another order. Workers use the device their ``device`` argument resolves to on the worker:
with dask-cuda's ``LocalCUDACluster`` each worker sees one GPU.
"""

from __future__ import annotations

import operator
import time

import numpy as np

from kkmgpu import _validation

from kkmgpu.engine import sampled as _cats

from kkmgpu.kernels import functions as _kernels
from kkmgpu.backend.device import Backend, resolve_device
from kkmgpu.engine import lloyd as _lloyd
from kkmgpu.engine.lloyd import initial_labels
from kkmgpu._result import KernelKMeansResult
from kkmgpu.engine.tiled import TiledKernelOperator

try:
    import dask.array as da
    from distributed import default_client
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("kkmgpu.dask needs Dask: pip install 'kkmgpu[dask]' (dask[array] and distributed)") from exc

__all__ = ["fit"]


# ------------------------------------------------------------------------------------------ worker side


class _Block:
    """What one worker keeps for the whole run: all prepared features, its rows' operator and source."""

    def __init__(self, A, weights, spec, r0, r1, device, tile_rows, tf32):
        self.backend = resolve_device(device)
        with self.backend.activate():
            self.A = self.backend.asarray(A)
            self.weights = self.backend.asarray(weights)
            self.r0, self.r1 = r0, r1
            self.operator = TiledKernelOperator(self.A, spec, self.weights, self.backend, tile_rows=tile_rows,
                                                tf32=tf32, row_range=(r0, r1))
            self.source = _cats.KernelSource(self.A, spec, self.backend)


def _host(a):
    """``a`` as a NumPy array (CuPy arrays and scalars through ``.get()``: they refuse implicit conversion)."""
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def _assemble(spec, dtype, *parts):
    """The prepared features of every point (host), from the Dask array's row chunks (NumPy or CuPy).

    Each chunk is prepared (centred, cast) on its own into one preallocated array, so the peak is the
    n x d result plus one chunk in float64, not a float64 copy of all of X.
    """
    backend = Backend("cpu")
    n = sum(int(p.shape[0]) for p in parts)
    out = np.empty((n, int(parts[0].shape[1])), dtype=dtype)
    i0 = 0
    for p in parts:
        i1 = i0 + int(p.shape[0])
        out[i0:i1] = _kernels.prepare_features(_host(p), spec, backend, dtype)
        i0 = i1
    return out


def _make_block(A, weights, spec, r0, r1, device, tile_rows, tf32):
    return _Block(A, weights, spec, r0, r1, device, tile_rows, tf32)


def _block_check_symmetric(block, spec):
    """A callable kernel's symmetry on rows of the block's features (raises ValueError on the worker, re-raised
    by the client)."""
    with block.backend.activate():
        _validation.check_callable_symmetric(block.A, spec, block.backend, np.dtype(block.A.dtype))


def _block_info(block):
    """(backend name, K_ii of the block's rows as host float64, sum_i w_i K_ii over them)."""
    op = block.operator
    return block.backend.name, block.backend.to_host(op.diag).astype(np.float64), op.total_diag


def _block_rows(block, index):
    with block.backend.activate():
        return block.operator.rows(index)


def _block_cluster_sums(block, labels, k):
    with block.backend.activate():
        return block.operator.cluster_sums(block.backend.asarray(labels), k)


def _block_update(block, S, old_labels, new_labels):
    with block.backend.activate():
        be = block.backend
        return block.operator.update_cluster_sums(S.copy(), be.asarray(old_labels), be.asarray(new_labels))


def _block_totals(block, S, labels, k):
    """Partial weighted sizes and within-cluster totals of the block's rows, host float64 (2, k)."""
    with block.backend.activate():
        be, xp = block.backend, block.backend.xp
        lab = be.asarray(labels[block.r0:block.r1])
        own = xp.take_along_axis(S, lab[:, None].astype(xp.int64), axis=1)[:, 0]
        sizes, within = be.ops.cluster_totals(lab, block.weights[block.r0:block.r1], own, k)
        return np.stack([sizes, within])


def _block_cross(block, S, labels, k):
    """Y^T S over the block's rows (k x k): inner products of the cluster centres, for duplicate checks."""
    with block.backend.activate():
        be, xp = block.backend, block.backend.xp
        lab = be.asarray(labels[block.r0:block.r1])
        Y = xp.zeros((block.r1 - block.r0, k), dtype=xp.float64)
        Y[xp.arange(block.r1 - block.r0), lab] = block.weights[block.r0:block.r1]
        return be.to_host(Y.T @ S)


def _block_assign(block, S, labels, sizes, within):
    """Assignment of the block's rows: (new labels int32, distance to the chosen centre, counts per cluster)."""
    with block.backend.activate():
        be = block.backend
        k = sizes.shape[0]
        counts = np.zeros(k, dtype=np.int64)
        new, dist, _ = be.ops.assign_labels(S, block.operator.diag, sizes, within,
                                            be.asarray(labels[block.r0:block.r1]), counts=counts)
        return be.to_host(new).astype(np.int32), be.to_host(dist), counts


def _block_cats_sums(block, labels, index):
    """CATS pass 1 over the block's rows: partial L_c w_c = sum_{i in c} w_i K(S_c, x_i), (k, l) float64."""
    with block.backend.activate():
        be, xp = block.backend, block.backend.xp
        k, l = index.shape
        samples = block.source.take(be.asarray(index.ravel()))
        lab_all = be.asarray(labels)
        Lw = xp.zeros((k, l), dtype=xp.float64)
        step = _kernels.tile_rows(k * l, block.source.itemsize, backend=be)
        for i0 in range(block.r0, block.r1, step):
            i1 = min(block.r1, i0 + step)
            B = block.source.block(i0, i1, samples)
            lab = lab_all[i0:i1]
            own = B.reshape(i1 - i0, k, l)[xp.arange(i1 - i0), lab].astype(xp.float64)
            Y = xp.zeros((i1 - i0, k), dtype=xp.float64)
            Y[xp.arange(i1 - i0), lab] = block.weights[i0:i1]
            Lw += Y.T @ own
        return be.to_host(Lw)


def _block_features(block):
    return block.backend.to_host(block.A)


def _block_samples(block, index):
    return block.backend.to_host(block.A[block.backend.asarray(index.ravel())])


def _block_cats_assign(block, labels, index, alpha, offsets, nonempty):
    """CATS pass 2 over the block's rows: nearest approximate centroid, its distance, sum_i w_i dist_i."""
    with block.backend.activate():
        be, xp = block.backend, block.backend.xp
        samples = block.source.take(be.asarray(index.ravel()))
        alpha_d = be.asarray(alpha)
        k, l = index.shape
        T = xp.empty((block.r1 - block.r0, k), dtype=xp.float64)
        step = _kernels.tile_rows(k * l, block.source.itemsize, backend=be)
        for i0 in range(block.r0, block.r1, step):
            i1 = min(block.r1, i0 + step)
            T[i0 - block.r0:i1 - block.r0] = _cats._project(block.source.block(i0, i1, samples), alpha_d, xp)
        new, dist, _ = be.ops.assign_labels(T, block.operator.diag, nonempty.astype(np.float64), offsets,
                                            be.asarray(labels[block.r0:block.r1]))
        return be.to_host(new).astype(np.int32), be.to_host(dist)


# ------------------------------------------------------------------------------------------ client side


class _Cluster:
    """The blocks of one run and the futures that address them."""

    def __init__(self, client, blocks, addresses, bounds):
        self.client, self.blocks, self.addresses, self.bounds = client, blocks, addresses, bounds

    def map(self, fn, *args, per_block=None, first=False):
        """Submit ``fn(block, *args, *per_block[b])`` (``fn(block, *per_block[b], *args)`` with ``first``)
        on each block's worker; futures in block order."""
        futures = []
        for b, (block, address) in enumerate(zip(self.blocks, self.addresses)):
            extra = tuple(per_block[b]) if per_block is not None else ()
            call = (block, *extra, *args) if first else (block, *args, *extra)
            futures.append(self.client.submit(fn, *call, workers=[address], allow_other_workers=False,
                                              pure=False))
        return futures

    def gather(self, futures):
        return self.client.gather(futures)

    def parts(self, futures, index):
        """Item ``index`` of each future's tuple, fetched without the other items."""
        picks = [self.client.submit(operator.itemgetter(index), f, workers=[a], pure=False)
                 for f, a in zip(futures, self.addresses)]
        return self.client.gather(picks)

    def broadcast(self, array):
        return self.client.scatter(array, broadcast=True, hash=False)


class _LazyParts:
    """Item ``index`` of each block's result, concatenated on the client only when asked (``np.asarray``)."""

    def __init__(self, cluster, futures, index):
        self.cluster, self.futures, self.index = cluster, futures, index

    def __array__(self, dtype=None, copy=None):
        out = np.concatenate(self.cluster.parts(self.futures, self.index))
        return out if dtype is None else out.astype(dtype)


class _DaskOperator:
    """The Lloyd driver's operator (:mod:`kkmgpu.engine.lloyd`) over the workers' row blocks.

    S is one future per block (its rows' cluster sums, on the worker's device); labels live on the client and
    are broadcast once per labelling. ``totals``, ``assign`` and ``cross`` reduce the blocks' k-sized parts on
    the client, so :func:`kkmgpu.engine.lloyd.lloyd` runs unchanged: its stopping rules, incremental updates, refresh
    and empty-cluster refill are the single-device ones. ``rows`` serves k-means++ (every worker holds all
    features: the blocks take turns)."""

    log_name = "kkmgpu.dask"

    def __init__(self, cluster, weights_h, diag_h, total_diag):
        self.cluster, self.weights, self.diag, self.total_diag = cluster, weights_h, diag_h, total_diag
        self.backend = Backend("cpu")
        self.n = weights_h.shape[0]
        self._next = 0
        self._broadcast = []  # (labels array, its future): the few most recent labellings

    def _future(self, labels):
        for array, future in self._broadcast:
            if array is labels:
                return future
        future = self.cluster.broadcast(labels)
        self._broadcast = [(labels, future)] + self._broadcast[:2]
        return future

    def _per_block(self, fn, S, *args):  # fn(block, its cluster sums, *args) on the block's worker
        return self.cluster.map(fn, *args, per_block=[(s,) for s in S], first=True)

    def rows(self, index):
        b = self._next % len(self.cluster.blocks)
        self._next += 1
        future = self.cluster.client.submit(_block_rows, self.cluster.blocks[b], np.asarray(index, dtype=np.int64),
                                            workers=[self.cluster.addresses[b]], pure=False)
        return future.result()

    def cluster_sums(self, labels, k):
        return self.cluster.map(_block_cluster_sums, self._future(labels), k)

    def incremental_cost(self, n_moved):
        """As the tiled engine's: tiles against the moved points relative to a full pass."""
        return n_moved / max(1, self.n)

    def update_cluster_sums(self, S, old_labels, new_labels):
        return self._per_block(_block_update, S, self._future(old_labels), self._future(new_labels))

    def totals(self, S, labels, k):
        sizes, within = np.sum(self.cluster.gather(self._per_block(_block_totals, S, self._future(labels), k)),
                               axis=0)
        nonempty = sizes > 0
        return sizes, within, self.total_diag - float(np.sum(within[nonempty] / sizes[nonempty]))

    def assign(self, S, sizes, within, labels, counts):
        assigned = self._per_block(_block_assign, S, self._future(labels), sizes, within)
        new_labels = np.concatenate(self.cluster.parts(assigned, 0))
        counts[:] = np.sum(self.cluster.parts(assigned, 2), axis=0)
        return new_labels, _LazyParts(self.cluster, assigned, 1), int((new_labels != labels).sum())

    def cross(self, S, labels, k):
        return np.sum(self.cluster.gather(self._per_block(_block_cross, S, self._future(labels), k)), axis=0)


def _resolve_spec(X, kernel, gamma, degree, coef0, kernel_params, dtype):
    """The kernel spec with gamma's data-scale default, and the centre and power-of-two scales that
    :func:`kkmgpu.kernels.functions.with_center` gives in-memory data, from statistics computed over the chunks."""
    name = _kernels.canonical_kernel_name(kernel)
    if name == "precomputed":
        raise ValueError("kkmgpu.dask.fit clusters features; kernel='precomputed' is not supported there.")
    d = X.shape[1]
    needs_gamma = name in ("rbf", "polynomial", "sigmoid", "laplacian")
    if gamma is None and needs_gamma:
        gamma = "scale" if name in ("rbf", "laplacian") else "auto"
    X64 = X.astype(np.float64)
    mean, var, hi, lo, spread = da.compute(X64.mean(axis=0), X64.var(), X64.max(axis=0), X64.min(axis=0),
                                           X64.var(axis=0).sum())
    # CuPy chunks give CuPy results
    mean, var, hi, lo, spread = (_host(mean).astype(np.float64), float(_host(var)), _host(hi).astype(np.float64),
                                 _host(lo).astype(np.float64), float(_host(spread)))
    if needs_gamma and gamma == "scale":
        gamma = _kernels.scale_gamma(name, d, float(var))
    elif needs_gamma and gamma == "auto":
        gamma = 1.0 / d
    spec = _kernels.resolve_kernel(kernel, gamma=gamma, degree=degree, coef0=coef0, kernel_params=kernel_params,
                                   X=np.zeros((1, d)), xp=np)
    return _kernels.with_center(spec, None, np, dtype, stats=(mean, hi, lo, spread, X.shape[0]))


def _check_dask_array(X):
    if not isinstance(X, da.Array):
        raise TypeError(f"X must be a dask.array.Array (rows in chunks); got {type(X).__name__}. Use "
                        "dask.array.from_array(X, chunks=...) or kkmgpu.fit for an in-memory array.")
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (n_samples, n_features); got ndim={X.ndim} with shape {X.shape}.")
    if any(isinstance(s, float) and np.isnan(s) for s in X.shape):
        raise ValueError("X has unknown chunk sizes; call X.compute_chunk_sizes() first.")
    n, d = X.shape
    if n < 1 or d < 1:
        raise ValueError(f"X has shape {X.shape}; at least one sample and one feature are required.")
    if X.dtype.kind not in "biuf":
        raise ValueError(f"X has dtype {X.dtype}; a real numeric array is required.")
    X = X.rechunk({1: -1})  # every chunk holds whole rows
    if X.dtype.kind == "f" and not bool(da.isfinite(X).all().compute()):
        raise ValueError("X contains NaN or infinity; every value must be finite.")
    return X


class _DaskCatsPasses:
    """CATS's two passes over the workers' row blocks, for :func:`kkmgpu.engine.sampled.iterate`: each worker returns its
    rows' partial L_c w_c, the client computes the coefficients from the samples' features (fetched from one
    worker) and broadcasts them, each worker assigns its rows."""

    log_name = "kkmgpu.dask"

    def __init__(self, cluster, spec, weights_h, diag_h):
        self.cluster, self.spec, self.weights, self.diag = cluster, spec, weights_h, diag_h
        self.backend = Backend("cpu")

    def begin(self, labels_h, k, width, l):
        self.labels_f = self.cluster.broadcast(labels_h)

    def centroids(self, index, mask, sizes_h, rcond, full, alpha_full):
        cluster = self.cluster
        self.index = index
        Lw = np.sum(cluster.gather(cluster.map(_block_cats_sums, self.labels_f, index)), axis=0)
        samples = cluster.client.submit(_block_samples, cluster.blocks[0], index, workers=[cluster.addresses[0]],
                                        pure=False).result()
        source = _cats.KernelSource(samples, self.spec, self.backend)
        return _cats._centroid_coefficients(source, samples, self.backend, mask.astype(np.float64), Lw, sizes_h,
                                            rcond, self.diag[index.ravel()], full=full, alpha_full=alpha_full)

    def assign(self, alpha, offsets, nonempty):
        results = self.cluster.gather(self.cluster.map(_block_cats_assign, self.labels_f, self.index, alpha, offsets,
                                                       nonempty))
        return np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results])

    def distortion(self, dist):
        return float((self.weights * dist).sum())


def fit(X, k, *, kernel="rbf", gamma=None, degree=3, coef0=None, kernel_params=None, method="exact",
        device="auto", dtype="float32", init="k-means++", n_init="auto", max_iter=300, tol=1e-6,
        sample_weight=None, random_state=None, verbose=False, update="auto", tf32=False,
        n_samples_per_cluster=None, window=None, theta=None, rcond=None, tile_rows=None, keep_features=False,
        client=None) -> KernelKMeansResult:
    """Kernel k-means of a Dask array, rows partitioned across the workers of a Dask cluster.

    Parameters
    ----------
    X : dask.array.Array of shape (n_samples, n_features)
        NumPy or CuPy chunks; columns are rechunked to one chunk. Its chunks are gathered once onto
        every worker (each worker holds all n x d prepared features: the columns of its kernel tiles).
    k : int
        Number of clusters, 1 <= k <= n_samples.
    kernel, gamma, degree, coef0, kernel_params, dtype, init, n_init, max_iter, tol, sample_weight, \
random_state, verbose, update, tf32
        As for :func:`kkmgpu.fit`; gamma's "scale" default and the centring mean are computed from X with
        Dask. ``kernel="precomputed"`` is not supported; dtype "float16" computes in float32.
    method : {"exact", "cats"}, default="exact"
        "exact": the tiled engine on every worker (no n x n matrix anywhere). "cats": CATS with the
        per-cluster sums and the assignment distributed.
    device : {"auto", "cpu", "cuda"}, default="auto"
        Resolved on each worker ("auto": the worker's GPU when CuPy sees one, as with dask-cuda's
        ``LocalCUDACluster``, else its CPU).
    n_samples_per_cluster, window, theta, rcond
        CATS's parameters, as for :func:`kkmgpu.fit`.
    tile_rows : int, optional
        Rows per kernel tile on the workers (default: from each worker's free memory).
    keep_features : bool, default=False
        Gather the n x d prepared features to the client and keep them in the result, which
        :func:`kkmgpu.predict` needs; off by default because they may not fit the client.
    client : distributed.Client, optional
        Default: the current client (``distributed.default_client()``).

    Returns
    -------
    KernelKMeansResult
        ``device`` is the workers' device ("cpu" or "cuda:0"); ``method_params`` adds the number of
        workers and the row bounds of their blocks.

    Raises
    ------
    TypeError, ValueError
        For invalid data or parameters; the message names the value and the rule.
    RuntimeError
        If the client's cluster has no workers (checked before anything is computed, which would wait forever).

    Examples
    --------
    >>> import dask.array as da, kkmgpu, kkmgpu.dask
    >>> from distributed import Client, LocalCluster
    >>> X, y = kkmgpu.datasets.make_two_circles(200, random_state=0)
    >>> with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \\
    ...         Client(cluster) as client:
    ...     result = kkmgpu.dask.fit(da.from_array(X, chunks=50), 2, gamma=5.0, device="cpu", random_state=0,
    ...                              n_init=10, client=client)
    >>> float(kkmgpu.metrics.nmi(y, result.labels))
    1.0
    """
    t_start = time.perf_counter()
    client = client or default_client()
    dt = _validation.check_dtype(dtype)
    ct = _validation.compute_dtype(dt)
    if method not in ("exact", "cats"):
        raise ValueError(f"method={method!r} is not available in kkmgpu.dask; use 'exact' or 'cats'.")
    max_iter, tol, n_init = _validation.check_params(method=method, max_iter=max_iter, tol=tol, n_init=n_init,
                                                     init=init, update=update)
    if not isinstance(tf32, bool):
        raise TypeError(f"tf32={tf32!r} must be True or False.")
    if tile_rows is not None:
        tile_rows = _validation.check_int(tile_rows, "tile_rows", minimum=1)
    if not isinstance(device, str) or device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device={device!r} is not valid for kkmgpu.dask; use 'auto', 'cpu' or 'cuda' (each "
                         "worker resolves it to its own device).")
    rng = _validation.make_rng(random_state)
    # Client.nthreads() asks the scheduler directly; scheduler_info() can return the client's cached identity,
    # which a periodic refresh may have just replaced by one without the workers (seen as a flaky empty list)
    addresses = sorted(client.nthreads())
    if not addresses:
        raise RuntimeError("the Dask cluster has no workers; start some (or wait with client.wait_for_workers(n)) "
                           "before kkmgpu.dask.fit (it would wait for them forever).")
    X = _check_dask_array(X)
    n = X.shape[0]
    k = _validation.check_k(k, n)
    user_weights = _validation.check_sample_weight(sample_weight, n)
    weights_h, weight_scale = _validation.normalize_weights(user_weights)  # only the weights' ratios matter
    init, n_init = _validation.check_init(init, n, k, n_init)
    if (weights_h > 0).sum() < k:
        raise ValueError(f"only {(weights_h > 0).sum()} samples have a positive sample_weight; "
                         f"at least k={k} are required.")
    cats_params = _validation.check_cats_params(
        method, n_samples_per_cluster=n_samples_per_cluster, window=window, theta=theta, rcond=rcond,
        exact_objective=False, n=n, k=k, dtype=dt)
    spec = _resolve_spec(X, kernel, gamma, degree, coef0, kernel_params, dt)
    t_valid = time.perf_counter()

    # one block of contiguous rows per worker; every worker gets all features once
    n_blocks = min(len(addresses), n)
    addresses = addresses[:n_blocks]
    bounds = np.linspace(0, n, n_blocks + 1).astype(np.int64)
    parts = client.compute(X.to_delayed().ravel().tolist())
    weights_f = client.scatter(weights_h, broadcast=True, hash=False)
    blocks = []
    for b, address in enumerate(addresses):
        A_f = client.submit(_assemble, spec, ct, *parts, workers=[address], allow_other_workers=False, pure=False)
        blocks.append(client.submit(_make_block, A_f, weights_f, spec, int(bounds[b]), int(bounds[b + 1]), device,
                                    tile_rows, tf32, workers=[address], allow_other_workers=False, pure=False))
    del A_f  # the host copy of the features is released once its block holds them (on a GPU: on the device)
    cluster = _Cluster(client, blocks, addresses, bounds)
    if spec.name == "callable":  # as kkmgpu.fit: a callable kernel must be symmetric, as a precomputed K is
        client.submit(_block_check_symmetric, blocks[0], spec, workers=[addresses[0]], allow_other_workers=False,
                      pure=False).result()
    info = cluster.gather(cluster.map(_block_info))
    device_name = info[0][0]
    diag_h = np.concatenate([i[1] for i in info])
    total_diag = float(sum(i[2] for i in info))
    del parts
    t_prepared = time.perf_counter()
    operator = _DaskOperator(cluster, weights_h, diag_h, total_diag)

    if method == "exact":  # the single-device driver, restarts and warnings, on the workers' blocks
        best_run, lloyd_runs, init_seconds = _lloyd.run_restarts(
            operator, k, init=init, n_init=n_init, max_iter=max_iter, tol=tol, rng=rng, verbose=verbose,
            update=update, progress=False)
        runs = [dict(objective=r.objective, seconds=r.seconds) for r in lloyd_runs]
        best = dict(labels=best_run.labels, objective=best_run.objective, history=best_run.history,
                    n_iter=best_run.n_iter, converged=best_run.converged, sizes=best_run.sizes,
                    within=best_run.within, stop_reason=best_run.stop_reason)
    else:  # CATS's loop and restarts (kkmgpu.engine.sampled), its two passes over the workers' blocks
        passes = _DaskCatsPasses(cluster, spec, weights_h, diag_h)
        cats_run, cats_runs, init_seconds = _cats.restarts(
            lambda: initial_labels(init, n, k, rng, operator),
            lambda labels0, restart: _cats.iterate(
                passes, weights_h, k, labels0, l=cats_params["l"], max_iter=max_iter, window=cats_params["window"],
                theta=cats_params["theta"], rcond=cats_params["rcond"], rng=rng, verbose=verbose, restart=restart),
            n_init, max_iter, stacklevel=3)
        runs = [dict(objective=r.objective, seconds=r.seconds) for r in cats_runs]
        best = dict(labels=cats_run.labels, objective=cats_run.objective, history=cats_run.history,
                    n_iter=cats_run.n_iter, converged=cats_run.converged, sizes=cats_run.sizes,
                    stop_reason=cats_run.stop_reason, state=cats_run.state)
    features = None
    if keep_features:
        features = client.submit(_block_features, blocks[0], workers=[addresses[0]], pure=False).result()
    t_end = time.perf_counter()
    params = {"n_workers": n_blocks, "row_bounds": bounds.tolist(), "engine": "tiled" if method == "exact" else None,
              "tf32": tf32}
    if method == "cats":
        params.update(cats_params)
    labels = best["labels"].astype(np.int32)
    from kkmgpu._api import _in_user_units  # objectives, sizes and weights back in the caller's units, finite

    return _in_user_units(KernelKMeansResult(
        labels=labels, objective=float(best["objective"]),
        objective_history=np.asarray(best["history"], dtype=np.float64), n_iter=int(best["n_iter"]),
        converged=bool(best["converged"]), n_clusters=k, method=method, kernel=spec.name,
        kernel_params=spec.resolved_params, device=device_name, dtype=dt.name,
        timings={"validation": t_valid - t_start, "kernel_build": t_prepared - t_valid, "init": init_seconds,
                 "iterations": float(sum(run["seconds"] for run in runs)), "total": t_end - t_start},
        cluster_sizes=np.asarray(best["sizes"], dtype=np.float64), n_init=n_init,
        objectives=np.array([run["objective"] for run in runs], dtype=np.float64), sample_weight=weights_h,
        exact_objective=float(best["objective"]) if method == "exact" else None, stop_reason=best["stop_reason"],
        method_params=params, _spec=spec, _train_features=features, _train_labels=labels,
        _train_weights=weights_h, _within=np.asarray(best.get("within", np.zeros(k)), dtype=np.float64), _n_train=n,
        _cats_state=best.get("state")), user_weights, weight_scale, spec)
