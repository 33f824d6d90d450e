"""GPU twins of the tiled engine's fused operations (CuPy + kernels_cuda/tiled.cu).

Same names, signatures and semantics as :mod:`kkmgpu.kernels.tiled_cpu`; see there for the operations.
CuPy comes from :mod:`kkmgpu.backend.cupy_loader`, the one module that imports it.
"""

from __future__ import annotations

import functools

import numpy as np

from kkmgpu.backend.cupy_loader import import_cupy
from kkmgpu.backend.device import argsort_stable
from kkmgpu.kernels.kernel_kmeans_cuda import NVRTC_OPTIONS, cuda_source

__all__ = ["tile_cluster_sums", "tile_moved_sums", "tile_epilogue"]

_SOURCE_NAME = "tiled.cu"
_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
#: threads per block (tiled.cu's KKM_THREADS: the summing kernels' launch bounds)
_THREADS = 256
#: rows per warp in the summing kernels (tiled.cu's KKM_ROWS)
ROWS_PER_WARP = 4
#: work items (a warp's rows and piece of the entries): the entries are split into pieces until about this many
#: exist, some ten times the warps a large GPU holds at once (132 SMs x 24), so that the last round of the grid's
#: loop leaves little idle. A constant, not the device's size, so that the bits do not depend on the device.
TARGET_WARPS = 32768
#: fewest entries per piece (8 chunks of 32)
MIN_PIECE = 256
#: resident blocks per SM the grid is sized for (3 blocks of 256 threads fit the kernels' launch bounds)
BLOCKS_PER_SM = 3


def name_expressions() -> list[str]:
    """The kernels of ``tiled.cu`` that CuPy compiles (and ``.ci/nvrtc_check.py`` checks)."""
    names = [f"{kern}<{t}>" for kern in ("tile_cluster_sums", "tile_moved_sums", "tile_epilogue")
             for t in _TYPES.values()]
    return names + ["tile_combine", "tile_order_check"]  # not templates


@functools.lru_cache(maxsize=None)
def _module(device_id: int):
    cp = import_cupy()
    with cp.cuda.Device(device_id):
        return cp.RawModule(code=cuda_source(_SOURCE_NAME), options=NVRTC_OPTIONS,
                            name_expressions=name_expressions())


@functools.lru_cache(maxsize=None)
def _multiprocessors(device_id: int) -> int:
    return int(import_cupy().cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"])


def _function(name: str, dtype=None):
    cp = import_cupy()
    if dtype is not None:
        dtype = np.dtype(dtype)
        if dtype not in _TYPES:
            raise ValueError(f"dtype={dtype} is not supported by the CUDA kernel {name}; use float32 or float64.")
        name = f"{name}<{_TYPES[dtype]}>"
    return _module(cp.cuda.runtime.getDevice()).get_function(name)


def pieces(t: int, n_entries: int, gather: bool = False) -> int:
    """Pieces the entries of a tile of ``t`` rows are split into (one warp per row block and piece). Gathered
    entries (the moved points') take at least one piece per warp of a block: a block's warps then share rows."""
    row_blocks = -(-t // ROWS_PER_WARP)
    want = max(TARGET_WARPS // row_blocks, _THREADS // 32 if gather else 1)
    return max(1, min(want, n_entries // MIN_PIECE))


def _grid(items: int) -> tuple[int]:
    """Blocks for ``items`` warp work items: all of them, at most what the device's SMs hold at once."""
    cp = import_cupy()
    resident = BLOCKS_PER_SM * _multiprocessors(cp.cuda.runtime.getDevice())
    return (max(1, min(resident, -(-items // (_THREADS // 32)))),)


def _tile_norms(cp, row_sq, col_sq, G):
    """(row_sq, col_sq) in G's dtype, one per row / column of the tile G (zeros when None: unused)."""
    out = []
    for sq, size, what in ((row_sq, G.shape[0], "row_sq"), (col_sq, G.shape[1], "col_sq")):
        if sq is None:
            out.append(cp.zeros(max(1, size), dtype=G.dtype))
        elif sq.shape != (size,):
            raise ValueError(f"{what} has shape {sq.shape}; the tile G of shape {G.shape} needs ({size},).")
        else:
            out.append(cp.ascontiguousarray(sq, dtype=G.dtype))
    return out


def _check(G, S=None):
    if not G.flags.c_contiguous:
        raise ValueError("the tile G must be C-contiguous")
    if S is not None and not (S.flags.c_contiguous and S.dtype == np.float64 and S.shape[0] == G.shape[0]):
        raise ValueError(f"S must be a C-contiguous float64 array with {G.shape[0]} rows; got {S.shape} {S.dtype}")


def _sums(cp, kernel, dtype, t, n_entries, args_before, clusters, S, unsorted):
    """Launch a summing kernel over ``n_entries`` entries of a t-row tile, then tile_combine when it split them."""
    k = S.shape[1]
    p = pieces(t, n_entries, gather=kernel == "tile_moved_sums")
    partial = cp.empty(2 * t * p if p > 1 else 1, dtype=cp.float64)
    row_blocks = -(-t // ROWS_PER_WARP)
    _function(kernel, dtype)(_grid(row_blocks * p), (_THREADS,),
                             (*args_before, S, np.int32(k), partial, np.int32(p), *unsorted))
    if p > 1:
        flag = unsorted[0] if unsorted else cp.zeros(1, dtype=cp.int32)
        _function("tile_combine")((max(1, min(-(-t // _THREADS), 65535)),), (_THREADS,),
                                  (clusters, partial, np.int64(t), np.int64(n_entries), np.int32(p), flag, S,
                                   np.int32(k)))


def tile_cluster_sums(G, row_sq, col_sq, kind, gamma, coef0, degree, clusters, coeffs, col_points, row0, S):
    """In place S[i, clusters[j]] += coeffs[j] * kappa(G[i, j]); see :func:`kkmgpu.kernels.tiled_cpu.tile_cluster_sums`.

    No float atomics: each sum is added in an order fixed by the shapes (``tiled.cu``), so the same inputs give
    the same bits on every run. Columns in label order are split into :func:`pieces` per row; whether they are
    is checked on the device (any order is summed correctly, a warp then taking whole rows).
    """
    cp = import_cupy()
    t, m = G.shape
    if t == 0 or m == 0:
        return S
    _check(G, S)
    clusters = cp.ascontiguousarray(clusters, dtype=cp.int32)
    unsorted = cp.zeros(1, dtype=cp.int32)
    _function("tile_order_check")(_grid(-(-m // 32)), (_THREADS,), (clusters, np.int64(m), unsorted))
    _sums(cp, "tile_cluster_sums", G.dtype, t, m,
          (G, *_tile_norms(cp, row_sq, col_sq, G), np.int64(t), np.int64(m), np.int32(kind), np.float64(gamma),
           np.float64(coef0), np.int32(degree), clusters, cp.ascontiguousarray(coeffs, dtype=cp.float64),
           cp.ascontiguousarray(col_points, dtype=cp.int64), np.int64(row0)),
          clusters, S, (unsorted,))
    return S


def tile_moved_sums(G, row_sq, col_sq, kind, gamma, coef0, degree, new_clusters, old_clusters, coeffs, col_points,
                    row0, S):
    """In place S[i, new[j]] += w_j kappa(G[i, j]), S[i, old[j]] -= w_j kappa(G[i, j]); see the CPU twin.

    G becomes the kernel values (``tile_epilogue``, each computed once); then the 2 m signed entries (+w_j in the
    new cluster, -w_j in the old one), sorted by cluster on the device, are summed like full cluster sums: no
    atomics, the same bits on every run.
    """
    cp = import_cupy()
    t, m = G.shape
    if t == 0 or m == 0:
        return S
    _check(G, S)
    tile_epilogue(G, row_sq, col_sq, kind, gamma, coef0, degree, col_points, row0)
    keys = cp.concatenate([cp.ascontiguousarray(new_clusters, dtype=cp.int32),
                           cp.ascontiguousarray(old_clusters, dtype=cp.int32)])
    order = argsort_stable(cp, keys)
    coeffs = cp.ascontiguousarray(coeffs, dtype=cp.float64)
    clusters = cp.ascontiguousarray(keys[order])
    _sums(cp, "tile_moved_sums", G.dtype, t, 2 * m,
          (G, np.int64(t), np.int64(m), clusters, cp.ascontiguousarray(cp.concatenate([coeffs, -coeffs])[order]),
           cp.ascontiguousarray(order % m, dtype=cp.int64), np.int64(2 * m)),
          clusters, S, ())
    return S


def tile_epilogue(G, row_sq, col_sq, kind, gamma, coef0, degree, col_points, row0):
    """In place G[i, j] <- kappa(G[i, j]) with the unit diagonal of the distance kernels; see the CPU twin."""
    cp = import_cupy()
    t, m = G.shape
    if t == 0 or m == 0:
        return G
    _check(G)
    norms = _tile_norms(cp, row_sq, col_sq, G)
    if kind == 0:  # the tile already holds the kernel values
        return G
    _function("tile_epilogue", G.dtype)(
        (max(1, min(t, 8 * _multiprocessors(cp.cuda.runtime.getDevice()))),), (_THREADS,),
        (G, *norms, np.int64(t), np.int64(m),
         np.int32(kind), np.float64(gamma), np.float64(coef0), np.int32(degree),
         cp.ascontiguousarray(col_points, dtype=cp.int64), np.int64(row0)))
    return G
