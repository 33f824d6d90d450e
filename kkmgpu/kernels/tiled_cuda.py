"""GPU twins of the tiled engine's fused operations (CuPy + kernels_cuda/tiled.cu).

Same names, signatures and semantics as :mod:`kkmgpu.kernels.tiled_cpu`; see there for the operations.
CuPy comes from :mod:`kkmgpu.backend.cupy_loader`, the one module that imports it.
"""

from __future__ import annotations

import functools

import numpy as np

from kkmgpu.backend.cupy_loader import import_cupy
from kkmgpu.kernels.kernel_kmeans_cuda import NVRTC_OPTIONS, cuda_source

__all__ = ["tile_cluster_sums", "tile_moved_sums", "tile_epilogue"]

_SOURCE_NAME = "tiled.cu"
_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_THREADS = 256
#: per-cluster sums live in shared memory up to this many clusters (k doubles per block), else global atomics
SHARED_MAX_CLUSTERS = 4096


def name_expressions() -> list[str]:
    """The template instantiations of ``tiled.cu`` that CuPy compiles (and ``.ci/nvrtc_check.py`` checks)."""
    names = [f"{kern}<{t}, {flag}>" for kern in ("tile_cluster_sums", "tile_moved_sums")
             for t in _TYPES.values() for flag in ("true", "false")]
    names += [f"tile_epilogue<{t}>" for t in _TYPES.values()]
    return names


@functools.lru_cache(maxsize=None)
def _module(device_id: int):
    cp = import_cupy()
    with cp.cuda.Device(device_id):
        return cp.RawModule(code=cuda_source(_SOURCE_NAME), options=NVRTC_OPTIONS,
                            name_expressions=name_expressions())


def _function(name: str, dtype, shared=None):
    dtype = np.dtype(dtype)
    if dtype not in _TYPES:
        raise ValueError(f"dtype={dtype} is not supported by the CUDA kernel {name}; use float32 or float64.")
    template = _TYPES[dtype] if shared is None else f"{_TYPES[dtype]}, {'true' if shared else 'false'}"
    cp = import_cupy()
    return _module(cp.cuda.runtime.getDevice()).get_function(f"{name}<{template}>")


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


def tile_cluster_sums(G, row_sq, col_sq, kind, gamma, coef0, degree, clusters, coeffs, col_points, row0, S):
    """In place S[i, clusters[j]] += coeffs[j] * kappa(G[i, j]); see :func:`kkmgpu.kernels.tiled_cpu.tile_cluster_sums`."""
    cp = import_cupy()
    t, m = G.shape
    if t == 0 or m == 0:
        return S
    _check(G, S)
    k = S.shape[1]
    shared = k <= SHARED_MAX_CLUSTERS
    _function("tile_cluster_sums", G.dtype, shared)(
        (int(min(t, 65535 * 8)),), (_THREADS,),
        (G, *_tile_norms(cp, row_sq, col_sq, G), np.int64(t), np.int64(m),
         np.int32(kind), np.float64(gamma), np.float64(coef0), np.int32(degree),
         cp.ascontiguousarray(clusters, dtype=cp.int32), cp.ascontiguousarray(coeffs, dtype=cp.float64),
         cp.ascontiguousarray(col_points, dtype=cp.int64), np.int64(row0), S, np.int32(k)),
        shared_mem=8 * k if shared else 0)
    return S


def tile_moved_sums(G, row_sq, col_sq, kind, gamma, coef0, degree, new_clusters, old_clusters, coeffs, col_points,
                    row0, S):
    """In place S[i, new[j]] += w_j kappa(G[i, j]), S[i, old[j]] -= w_j kappa(G[i, j]); see the CPU twin."""
    cp = import_cupy()
    t, m = G.shape
    if t == 0 or m == 0:
        return S
    _check(G, S)
    k = S.shape[1]
    shared = k <= SHARED_MAX_CLUSTERS
    _function("tile_moved_sums", G.dtype, shared)(
        (int(min(t, 65535 * 8)),), (_THREADS,),
        (G, *_tile_norms(cp, row_sq, col_sq, G), np.int64(t), np.int64(m),
         np.int32(kind), np.float64(gamma), np.float64(coef0), np.int32(degree),
         cp.ascontiguousarray(new_clusters, dtype=cp.int32), cp.ascontiguousarray(old_clusters, dtype=cp.int32),
         cp.ascontiguousarray(coeffs, dtype=cp.float64), cp.ascontiguousarray(col_points, dtype=cp.int64),
         np.int64(row0), S, np.int32(k)),
        shared_mem=8 * k if shared else 0)
    return S


def tile_epilogue(G, row_sq, col_sq, kind, gamma, coef0, degree, col_points, row0):
    """In place G[i, j] <- kappa(G[i, j]) with the unit diagonal of the distance kernels; see the CPU twin."""
    cp = import_cupy()
    t, m = G.shape
    if t == 0 or m == 0:
        return G
    _check(G)
    _function("tile_epilogue", G.dtype)(
        (int(min(t, 65535 * 8)),), (_THREADS,),
        (G, *_tile_norms(cp, row_sq, col_sq, G), np.int64(t), np.int64(m),
         np.int32(kind), np.float64(gamma), np.float64(coef0), np.int32(degree),
         cp.ascontiguousarray(col_points, dtype=cp.int64), np.int64(row0)))
    return G
