"""GPU twins of the fused operations (CuPy), same names and semantics as :mod:`kkmgpu.kernels.kernel_kmeans_cpu`.

The custom kernels come from ``kernels_cuda/kernel_kmeans.cu``, compiled at run time by CuPy
and cached per device. CuPy itself is obtained from :mod:`kkmgpu.backend.cupy_loader`, the one module
that imports it.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

import numpy as np

from kkmgpu.backend.cupy_loader import import_cupy

__all__ = ["kernel_epilogue", "segment_sums", "moved_sums", "block_cluster_sums", "assign_labels", "cluster_totals",
           "offgrid_step", "cuda_source", "indicator_cluster_sums"]

_SOURCE_NAME = "kernel_kmeans.cu"
_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_THREADS = 256
_KERNELS = ("kernel_epilogue", "assign_labels", "segment_sums", "moved_sums", "offgrid_step")
#: segment_sums splits each cluster's entries into pieces (grid.y) until about this many threads run
_TARGET_THREADS = 1 << 21
#: CUDA's limit on grid.y
_MAX_GRID_Y = 65535


def cuda_source(name: str = _SOURCE_NAME) -> str:
    """Text of a ``.cu`` file shipped with kkmgpu (installed wheel) or in the source tree."""
    try:
        return resources.files("kkmgpu.kernels_cuda").joinpath(name).read_text()
    except (ModuleNotFoundError, FileNotFoundError):
        return (Path(__file__).resolve().parents[2] / "kernels_cuda" / name).read_text()  # repo/kkmgpu/kernels/


#: NVRTC options of both CUDA modules (``.ci/nvrtc_check.py`` compiles with the same ones)
NVRTC_OPTIONS = ("-std=c++14",)


def name_expressions() -> list[str]:
    """The template instantiations of ``kernel_kmeans.cu`` that CuPy compiles (and ``.ci/nvrtc_check.py`` checks)."""
    names = [f"{kern}<{t}>" for kern in _KERNELS for t in _TYPES.values()]
    names.append("segment_sums<unsigned short>")  # float16 storage, read as its bit patterns
    names.append("moved_sums<unsigned short>")
    names.append("segment_reduce")  # not a template
    return names


@functools.lru_cache(maxsize=None)
def _module(device_id: int):
    cp = import_cupy()
    with cp.cuda.Device(device_id):
        return cp.RawModule(code=cuda_source(), options=NVRTC_OPTIONS, name_expressions=name_expressions())


def _function(name: str, dtype) -> object:
    dtype = np.dtype(dtype)
    if dtype == np.float16 and name in ("segment_sums", "moved_sums"):
        type_name = "unsigned short"
    elif dtype in _TYPES:
        type_name = _TYPES[dtype]
    else:
        raise ValueError(f"dtype={dtype} is not supported by the CUDA kernel {name}; use float32 or float64.")
    cp = import_cupy()
    return _module(cp.cuda.runtime.getDevice()).get_function(f"{name}<{type_name}>")


def _grid(total: int) -> tuple[int]:
    return (max(1, min(65535 * 8, (total + _THREADS - 1) // _THREADS)),)


def kernel_epilogue(block, row_sq, col_sq, kind, gamma, coef0, degree):
    """In place: kernel values from inner products ``block`` (m, n) and squared row norms."""
    if kind == 0:
        return block
    m, n = block.shape
    if m == 0 or n == 0:
        return block
    cp = import_cupy()
    if not block.flags.c_contiguous:
        raise ValueError("kernel_epilogue needs a C-contiguous block")
    row_sq = cp.ascontiguousarray(row_sq, dtype=block.dtype)
    col_sq = cp.ascontiguousarray(col_sq, dtype=block.dtype)
    if row_sq.size < m or col_sq.size < n:  # the kernel reads row_sq[i] for every row, whatever the kind
        raise ValueError(f"kernel_epilogue needs row_sq ({row_sq.size}) and col_sq ({col_sq.size}) of at least "
                         f"{m} and {n} entries")
    _function("kernel_epilogue", block.dtype)(
        (int(min(m, 65535 * 8)),), (_THREADS,),
        (block, row_sq, col_sq, np.int64(m), np.int64(n), np.int32(kind),
         np.float64(gamma), np.float64(coef0), np.int32(degree)))
    return block


def _weighted_indicator(labels, weights, k, dtype):
    cp = import_cupy()
    n = labels.shape[0]
    Y = cp.zeros((n, k), dtype=dtype)
    Y[cp.arange(n), labels] = weights.astype(dtype, copy=False)
    return Y


def segment_sums(K, rows, clusters, coeffs, S):
    """In place: S[i, clusters[p]] += coeffs[p] * K[rows[p], i]; see :func:`kkmgpu.kernels.kernel_kmeans_cpu.segment_sums`.

    One pass over the entries' rows of K with no one-hot operand (``segment_sums`` in
    kernels_cuda/kernel_kmeans.cu): threads own columns and a piece of one cluster's entries (grid.y), and
    the pieces are added in a fixed order (``segment_reduce``), with no atomics: the same inputs give the same
    bits on every run. ``clusters`` must be non-decreasing (the driver sorts the entries by cluster).
    """
    cp = import_cupy()
    n = K.shape[0]
    n_entries = rows.shape[0]
    if n_entries == 0 or n == 0:
        return S
    if not (K.flags.c_contiguous and S.flags.c_contiguous and S.dtype == cp.float64):
        raise ValueError("segment_sums needs a C-contiguous K and a C-contiguous float64 S")
    k = S.shape[1]
    clusters = cp.ascontiguousarray(clusters, dtype=cp.int32)
    # cluster c's entries start at starts[c] (empty clusters: empty ranges), found without a transfer
    starts = cp.searchsorted(clusters, cp.arange(k + 1, dtype=cp.int32)).astype(cp.int64)
    blocks_x = (n + _THREADS - 1) // _THREADS
    # pieces per cluster: enough threads to fill the device, no more than a cluster's average entries
    pieces = max(1, min(_TARGET_THREADS // (blocks_x * _THREADS * k), -(-n_entries // k), _MAX_GRID_Y))
    per_launch = max(1, _MAX_GRID_Y // pieces)  # clusters per launch (grid.y <= 65,535)
    partial = cp.empty((min(k, per_launch) * pieces, n), dtype=cp.float64) if pieces > 1 else S
    function = _function("segment_sums", K.dtype)
    reduce = _module(cp.cuda.runtime.getDevice()).get_function("segment_reduce")
    rows = cp.ascontiguousarray(rows, dtype=cp.int64)
    coeffs = cp.ascontiguousarray(coeffs, dtype=cp.float64)
    for c0 in range(0, k, per_launch):
        count = min(per_launch, k - c0)
        function((blocks_x, count * pieces), (_THREADS,),
                 (K, rows, coeffs, starts, S, partial, np.int64(n), np.int32(k), np.int32(c0), np.int32(pieces)))
        if pieces > 1:
            reduce((blocks_x,), (_THREADS,),
                   (partial, S, np.int64(n), np.int32(k), np.int32(c0), np.int32(count), np.int32(pieces)))
    return S


def moved_sums(K, rows, coeffs, src, dst, S):
    """In place: S[i, dst[p]] += coeffs[p] K[rows[p], i] and S[i, src[p]] -= coeffs[p] K[rows[p], i]; see
    :func:`kkmgpu.kernels.kernel_kmeans_cpu.moved_sums`.

    One read of each entry's row of K (``moved_sums`` in kernels_cuda/kernel_kmeans.cu): a thread owns a column and
    its row of S, sums each run of entries with one (src, dst) pair and adds the sum into both clusters; no
    atomics. Entries must be sorted by the pair (src, dst).
    """
    cp = import_cupy()
    n = K.shape[0]
    m = rows.shape[0]
    if m == 0 or n == 0:
        return S
    if not (K.flags.c_contiguous and S.flags.c_contiguous and S.dtype == cp.float64):
        raise ValueError("moved_sums needs a C-contiguous K and a C-contiguous float64 S")
    _function("moved_sums", K.dtype)(
        ((n + _THREADS - 1) // _THREADS,), (_THREADS,),
        (K, cp.ascontiguousarray(rows, dtype=cp.int64), cp.ascontiguousarray(coeffs, dtype=cp.float64),
         cp.ascontiguousarray(src, dtype=cp.int32), cp.ascontiguousarray(dst, dtype=cp.int32), S, np.int64(n),
         np.int32(S.shape[1]), np.int64(m)))
    return S


def offgrid_step(K, Kp, divide):
    """In place, one pass: Kp <- sqrt(Kp); K <- K / Kp if divide else K * Kp (Off-the-grid, Algorithm 2)."""
    if K.ndim != 2 or K.shape != Kp.shape or K.dtype != Kp.dtype:
        raise ValueError(f"K {K.shape} {K.dtype} and Kp {Kp.shape} {Kp.dtype} must be 2-D and match "
                         "in shape and dtype.")
    if not (K.flags.c_contiguous and Kp.flags.c_contiguous):
        raise ValueError("offgrid_step needs C-contiguous K and Kp")
    if K.size:
        _function("offgrid_step", K.dtype)(_grid(K.size), (_THREADS,),
                                           (K, Kp, np.int64(K.size), np.int32(bool(divide))))
    return K, Kp


def indicator_cluster_sums(K, labels, weights, k):
    """The plain CuPy way, K @ (W * one-hot): the baseline the custom kernel is benchmarked against."""
    return block_cluster_sums(K, labels, weights, k)


def block_cluster_sums(B, labels, weights, k):
    """S[i, c] = sum_{j in cluster c} weights[j] * B[i, j] for a rectangular block; float64 (m, k)."""
    Y = _weighted_indicator(labels, weights, int(k), B.dtype)
    return (B @ Y).astype(np.float64, copy=False)


def cluster_totals(labels, weights, own, k, sync=True):
    """Weighted sizes and within-cluster totals, as host float64 (k,), one transfer (``sync=False``: the device
    array (2, k) of both, no transfer).

    Summed as [w; w * own] @ one-hot (a cuBLAS product, n x k like S) rather than with atomic scatter-adds,
    whose order changes from run to run: the totals set the distances' offsets, so they must be reproducible
    for the labels to be.
    """
    cp = import_cupy()
    n = labels.shape[0]
    one_hot = cp.zeros((n, k), dtype=cp.float64)
    one_hot[cp.arange(n), labels] = 1.0
    values = cp.stack([weights.astype(cp.float64, copy=False), weights * own])
    if not sync:
        return values @ one_hot
    out = (values @ one_hot).get()
    return out[0], out[1]


def assign_labels(S, diag, sizes, within, labels, counts=None, sync=True):
    """Fused distance + argmin + moved count; see :func:`kkmgpu.kernels.kernel_kmeans_cpu.assign_labels`.

    The moved count and the per-cluster counts come back in one transfer; with ``sync=False`` the third result is
    the device array [moved, count of cluster 0, ..., count of cluster k-1] (uint64) instead, and nothing is
    transferred.
    """
    cp = import_cupy()
    n, k = S.shape
    sizes = cp.asarray(sizes, dtype=cp.float64)
    within = cp.asarray(within, dtype=cp.float64)
    nonempty = sizes > 0
    inv = cp.where(nonempty, 1.0 / cp.where(nonempty, sizes, 1.0), -1.0)
    offset = cp.where(nonempty, within * inv * inv, 0.0)
    S = cp.ascontiguousarray(S, dtype=cp.float64)
    diag = cp.ascontiguousarray(diag)
    if diag.dtype not in (cp.float32, cp.float64):
        diag = diag.astype(cp.float64)
    labels = cp.ascontiguousarray(labels, dtype=cp.int32)
    new_labels = cp.empty(n, dtype=cp.int32)
    min_dist = cp.empty(n, dtype=cp.float64)
    stats = cp.zeros(1 + k, dtype=cp.uint64)  # [moved, count of cluster 0, ..., count of cluster k-1]
    if n:
        _function("assign_labels", diag.dtype)(
            _grid(n), (_THREADS,),
            (S, diag, inv, offset, labels, new_labels, min_dist, stats, np.int64(n), np.int32(k)))
    if not sync:
        return new_labels, min_dist, stats
    stats = stats.get()
    if counts is not None:
        counts[:] = stats[1:]
    return new_labels, min_dist, int(stats[0])
