"""The distributed operators: the Lloyd driver's operator and CATS's passes over row blocks held by Dask workers.

Worker side: a :class:`Block` is one worker's rows (a :class:`kkmgpu.engine.tiled.TiledKernelOperator` over its
rows against all points), and the ``block_*`` functions are what the client submits to it. Client side:
:class:`Cluster` addresses the blocks; :class:`DaskOperator` is the operator :func:`kkmgpu.engine.lloyd.lloyd`
runs over (S is one future per block; sizes, totals, assignment and the distinct-centre check are reduced on the
client), and :class:`DaskCatsPasses` gives :func:`kkmgpu.engine.sampled.iterate` its two passes. This module
does not import Dask: the client is handed in by :func:`kkmgpu.dask.fit`.
"""

from __future__ import annotations

import operator

import numpy as np

from kkmgpu import _validation
from kkmgpu.backend.device import Backend, resolve_device
from kkmgpu.engine import sampled as _cats
from kkmgpu.engine.tiled import TiledKernelOperator
from kkmgpu.kernels import blocks as _kernels


class Block:
    """What one worker keeps for the whole run: all prepared features, its rows' operator and source."""

    def __init__(self, A, weights, spec, r0, r1, device, tile_rows):
        self.backend = resolve_device(device)
        with self.backend.activate():
            self.A = self.backend.asarray(A)
            self.weights = self.backend.asarray(weights)
            self.r0, self.r1 = r0, r1
            self.operator = TiledKernelOperator(self.A, spec, self.weights, self.backend, tile_rows=tile_rows,
                                                row_range=(r0, r1))
            self.source = _cats.KernelSource(self.A, spec, self.backend)


def host(a):
    """``a`` as a NumPy array (CuPy arrays and scalars through ``.get()``: they refuse implicit conversion)."""
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def assemble(spec, dtype, *parts):
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
        out[i0:i1] = _kernels.prepare_features(host(p), spec, backend, dtype)
        i0 = i1
    return out


def make_block(A, weights, spec, r0, r1, device, tile_rows):
    return Block(A, weights, spec, r0, r1, device, tile_rows)


def block_check_symmetric(block, spec):
    """A callable kernel's symmetry on rows of the block's features (raises ValueError on the worker, re-raised
    by the client)."""
    with block.backend.activate():
        _validation.check_callable_symmetric(block.A, spec, block.backend, np.dtype(block.A.dtype))


def block_info(block):
    """(backend name, K_ii of the block's rows as host float64, sum_i w_i K_ii over them, the GEMM mode of a full
    pass: :func:`kkmgpu.kernels.gemm.effective_mode` of the spec's precision there)."""
    op = block.operator
    return (block.backend.name, block.backend.to_host(op.diag).astype(np.float64), op.total_diag,
            _kernels.gemm_mode(op.spec, block.backend, block.A.dtype, (block.A.shape[0],) * 2 + (block.A.shape[1],)))


def block_rows(block, index):
    with block.backend.activate():
        return block.operator.rows(index)


def block_cluster_sums(block, labels, k):
    with block.backend.activate():
        return block.operator.cluster_sums(block.backend.asarray(labels), k)


def block_update(block, S, old_labels, new_labels):
    with block.backend.activate():
        be = block.backend
        return block.operator.update_cluster_sums(S.copy(), be.asarray(old_labels), be.asarray(new_labels))


def block_totals(block, S, labels, k):
    """Partial weighted sizes and within-cluster totals of the block's rows, host float64 (2, k)."""
    with block.backend.activate():
        be, xp = block.backend, block.backend.xp
        lab = be.asarray(labels[block.r0:block.r1])
        own = xp.take_along_axis(S, lab[:, None].astype(xp.int64), axis=1)[:, 0]
        sizes, within = be.ops.cluster_totals(lab, block.weights[block.r0:block.r1], own, k)
        return np.stack([sizes, within])


def block_cross(block, S, labels, k):
    """Y^T S over the block's rows (k x k): inner products of the cluster centres, for duplicate checks."""
    with block.backend.activate():
        be, xp = block.backend, block.backend.xp
        lab = be.asarray(labels[block.r0:block.r1])
        Y = xp.zeros((block.r1 - block.r0, k), dtype=xp.float64)
        Y[xp.arange(block.r1 - block.r0), lab] = block.weights[block.r0:block.r1]
        return be.to_host(Y.T @ S)


def block_assign(block, S, labels, sizes, within):
    """Assignment of the block's rows: (new labels int32, distance to the chosen centre, counts per cluster)."""
    with block.backend.activate():
        be = block.backend
        k = sizes.shape[0]
        counts = np.zeros(k, dtype=np.int64)
        new, dist, _ = be.ops.assign_labels(S, block.operator.diag, sizes, within,
                                            be.asarray(labels[block.r0:block.r1]), counts=counts)
        return be.to_host(new).astype(np.int32), be.to_host(dist), counts


def block_cats_sums(block, labels, index):
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


def block_features(block):
    return block.backend.to_host(block.A)


def block_samples(block, index):
    return block.backend.to_host(block.A[block.backend.asarray(index.ravel())])


def block_cats_assign(block, labels, index, alpha, offsets, nonempty):
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


class Cluster:
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


class LazyParts:
    """Item ``index`` of each block's result, concatenated on the client only when asked (``np.asarray``)."""

    def __init__(self, cluster, futures, index):
        self.cluster, self.futures, self.index = cluster, futures, index

    def __array__(self, dtype=None, copy=None):
        out = np.concatenate(self.cluster.parts(self.futures, self.index))
        return out if dtype is None else out.astype(dtype)


class DaskOperator:
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
        future = self.cluster.client.submit(block_rows, self.cluster.blocks[b], np.asarray(index, dtype=np.int64),
                                            workers=[self.cluster.addresses[b]], pure=False)
        return future.result()

    def cluster_sums(self, labels, k):
        return self.cluster.map(block_cluster_sums, self._future(labels), k)

    def incremental_cost(self, n_moved):
        """As the tiled engine's: tiles against the moved points relative to a full pass."""
        return n_moved / max(1, self.n)

    def update_cluster_sums(self, S, old_labels, new_labels):
        return self._per_block(block_update, S, self._future(old_labels), self._future(new_labels))

    def totals(self, S, labels, k):
        sizes, within = np.sum(self.cluster.gather(self._per_block(block_totals, S, self._future(labels), k)),
                               axis=0)
        nonempty = sizes > 0
        return sizes, within, self.total_diag - float(np.sum(within[nonempty] / sizes[nonempty]))

    def assign(self, S, sizes, within, labels, counts):
        assigned = self._per_block(block_assign, S, self._future(labels), sizes, within)
        new_labels = np.concatenate(self.cluster.parts(assigned, 0))
        counts[:] = np.sum(self.cluster.parts(assigned, 2), axis=0)
        return new_labels, LazyParts(self.cluster, assigned, 1), int((new_labels != labels).sum())

    def cross(self, S, labels, k):
        return np.sum(self.cluster.gather(self._per_block(block_cross, S, self._future(labels), k)), axis=0)


class DaskCatsPasses:
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
        Lw = np.sum(cluster.gather(cluster.map(block_cats_sums, self.labels_f, index)), axis=0)
        samples = cluster.client.submit(block_samples, cluster.blocks[0], index, workers=[cluster.addresses[0]],
                                        pure=False).result()
        source = _cats.KernelSource(samples, self.spec, self.backend)
        return _cats._centroid_coefficients(source, samples, self.backend, mask.astype(np.float64), Lw, sizes_h,
                                            rcond, self.diag[index.ravel()], full=full, alpha_full=alpha_full)

    def assign(self, alpha, offsets, nonempty):
        results = self.cluster.gather(self.cluster.map(block_cats_assign, self.labels_f, self.index, alpha, offsets,
                                                       nonempty))
        return np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results])

    def distortion(self, dist):
        return float((self.weights * dist).sum())
