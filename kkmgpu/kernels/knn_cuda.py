"""GPU twin of the nearest-neighbour search behind the affinity graphs (CuPy + kernels_cuda/knn.cu).

Same functions and semantics as :mod:`kkmgpu.kernels.knn_cpu` (see there for the search): the blocks on and above
the diagonal of the n x n GEMM-form distance matrix, one cuBLAS product in the GEMM precision mode
(:mod:`kkmgpu.kernels.gemm`) serving its rows and, through its transpose, its columns, and the kernel
``knn_offer_block`` keeping each row's ``n_neighbors`` best candidates by (key, index). The keys are candidates:
:mod:`kkmgpu.kernels.knn_exact` re-ranks and certifies them in float64. The products and the kernel never hold
more than one block x block product and its transpose, and nothing is sorted (CuPy's ``argpartition`` sorts whole
rows). CuPy comes from :mod:`kkmgpu.backend.cupy_loader`, the one module that imports it.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from kkmgpu.backend.cupy_loader import import_cupy
from kkmgpu.backend.device import Backend, work_bytes
from kkmgpu.kernels import gemm as _gemm
from kkmgpu.kernels.blocks import upper_blocks
from kkmgpu.kernels.kernel_kmeans_cuda import NVRTC_OPTIONS, cuda_source

__all__ = ["BLOCK", "MAX_NEIGHBORS", "block_rows", "offer_block", "nearest_neighbors", "pair_distances", "search"]

_SOURCE_NAME = "knn.cu"
_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_THREADS = 256  # 8 warps: 8 rows of a block per thread block
#: the largest n_neighbors the kernel keeps: KNN_MAX_NEIGHBORS in knn.cu, the length of each lane's candidate list
#: in local memory (tests/test_twins.py holds the two equal)
MAX_NEIGHBORS = 64
#: rows of one block of the distance matrix: larger than the CPU's 4096 because a GPU needs many rows in flight
#: (one warp per row: 8192 warps are about what an H100's 132 SMs hold at once) and because each block costs a GEMM
#: and two launches from Python, (n / BLOCK)^2 / 2 of them: 7,500 at n = 10^6 instead of 120,000. The product and
#: its transpose then take 2 x 8192^2 x 4 bytes = 512 MiB in float32 (graphs.py shrinks the block to free memory).
BLOCK = 8192


def name_expressions() -> list[str]:
    """The template instantiations of ``knn.cu`` that CuPy compiles (and ``.ci/nvrtc_check.py`` checks)."""
    return [f"{name}<{t}>" for name in ("knn_offer_block", "knn_pair_distances") for t in _TYPES.values()]


@functools.lru_cache(maxsize=None)
def _module(device_id: int):
    cp = import_cupy()
    with cp.cuda.Device(device_id):
        return cp.RawModule(code=cuda_source(_SOURCE_NAME), options=NVRTC_OPTIONS, name_expressions=name_expressions())


def _function(name: str, dtype):
    dtype = np.dtype(dtype)
    if dtype not in _TYPES:
        raise ValueError(f"dtype={dtype} is not supported by the CUDA kernel {name}; use float32 or float64.")
    cp = import_cupy()
    return _module(cp.cuda.runtime.getDevice()).get_function(f"{name}<{_TYPES[dtype]}>")


def pair_distances(Q, A, rows, cols, scale):
    """float64 (len(rows),): ||(Q[rows[t]] - A[cols[t]]) scale||^2 from the float64 differences of the values
    (``knn_pair_distances`` in knn.cu: one warp per pair, a fixed order that depends on the features alone, so a
    pair gives the same bits in every call). Q and A: 2-D, one dtype (float32 or float64), as many columns."""
    cp = import_cupy()
    if Q.ndim != 2 or A.ndim != 2 or Q.shape[1] != A.shape[1] or Q.dtype != A.dtype:
        raise ValueError(f"pair_distances needs 2-D Q and A of one dtype and as many columns, got {Q.shape} "
                         f"{Q.dtype} and {A.shape} {A.dtype}")
    m = int(rows.shape[0])
    out = cp.empty(m, dtype=cp.float64)
    if m == 0:
        return out
    if Q.shape[1] == 0:
        out[:] = 0.0
        return out
    warps_per_block = _THREADS // 32
    blocks = max(1, min(65535 * 8, -(-m // warps_per_block)))
    _function("knn_pair_distances", Q.dtype)(
        (blocks,), (_THREADS,),
        (cp.ascontiguousarray(Q), cp.ascontiguousarray(A), cp.ascontiguousarray(rows, dtype=cp.int64),
         cp.ascontiguousarray(cols, dtype=cp.int64), np.int64(m), np.int64(Q.shape[1]), np.float64(scale), out))
    return out


def offer_block(G, col_sq, row0, col0, best, arg):
    """In place: rows row0 + r of the search (best, arg) take the candidates col0 + j of the block G (b, m) of
    inner products with the keys col_sq[j] - 2 G[r, j]; see :func:`kkmgpu.kernels.knn_cpu.offer_block`.

    Raises ValueError when the list length k = best.shape[1] is not between 1 and :data:`MAX_NEIGHBORS`, for
    dtypes other than float32 and float64, and for arrays of the wrong shape or layout.
    """
    cp = import_cupy()
    b, m = G.shape
    n, k = best.shape
    if not 1 <= k <= MAX_NEIGHBORS:
        raise ValueError(f"n_neighbors={k} must be between 1 and MAX_NEIGHBORS={MAX_NEIGHBORS} for the CUDA "
                         f"kernel knn_offer_block (its per-lane candidate list is fixed at compile time).")
    if not (best.dtype == np.float64 and arg.dtype == np.int64 and arg.shape == best.shape
            and best.flags.c_contiguous and arg.flags.c_contiguous):
        raise ValueError(f"best and arg must be C-contiguous float64 and int64 arrays of one shape; got "
                         f"{best.shape} {best.dtype} and {arg.shape} {arg.dtype}.")
    if not G.flags.c_contiguous:
        raise ValueError("the block G must be C-contiguous")
    if col_sq.shape != (m,) or not 0 <= row0 <= n - b:
        raise ValueError(f"a block G of shape {G.shape} at row0={row0} needs col_sq of shape ({m},) and "
                         f"row0 + {b} <= {n} rows of best; got col_sq of shape {col_sq.shape}.")
    function = _function("knn_offer_block", G.dtype)
    if b == 0 or m == 0:
        return
    warps_per_block = _THREADS // 32
    grid = int(min((b + warps_per_block - 1) // warps_per_block, 65535 * 8))
    function((grid,), (_THREADS,),
             (G, cp.ascontiguousarray(col_sq, dtype=cp.float64), np.int64(b), np.int64(m), np.int64(row0),
              np.int64(col0), np.int32(k), best, arg))


def block_rows(a, backend: Backend, block: int, mode: str) -> int:
    """Rows of the search's blocks for features ``a``: one block x block product, its transpose and the two
    blocks' operands in ``mode`` within the work budget (at most ``block``, at least 32)."""
    entry = 2 * a.dtype.itemsize
    operands = 2 * _gemm.operand_bytes(1, a.shape[1], mode)
    budget = work_bytes(block * block * entry, backend, minimum=32 * 32 * entry)
    fits = math.isqrt(max(1, budget - operands * block) // entry)
    return max(32, min(block, fits))


def search(A, n_neighbors: int, block: int = BLOCK, *, col_sq=None, mode: str = "fp32"):
    """(keys, index), each (n, n_neighbors) on the device: every row's ``n_neighbors`` nearest other rows of A (n, d)
    by (key, index), key = col_sq[j] - 2 a_i . a_j (float64 of the product in ``mode``: "fp32", "3xtf32", "tf32",
    "fp64" for float64 A; :func:`kkmgpu.kernels.gemm.effective_mode`), ascending; slots beyond n - 1 stay
    (+inf, -1). ``col_sq`` (float64, (n,)) defaults to ||a_j||^2. ``block`` rows per block (tests shrink it).
    See :func:`kkmgpu.kernels.knn_cpu.search`."""
    cp = import_cupy()
    n = A.shape[0]
    A = cp.ascontiguousarray(A)
    backend = Backend("cuda", int(cp.cuda.runtime.getDevice()))
    if col_sq is None:
        col_sq = cp.empty(n, dtype=cp.float64)
        for i0 in range(0, n, block):  # float64 norms without a float64 copy of A
            rows = A[i0:i0 + block].astype(cp.float64)
            col_sq[i0:i0 + block] = (rows * rows).sum(axis=1)
    best = cp.full((n, n_neighbors), cp.inf, dtype=cp.float64)
    arg = cp.full((n, n_neighbors), -1, dtype=cp.int64)
    left = None
    for i0, i1, j0, j1 in upper_blocks(n, block):
        if j0 == i0:   # the rows' operand once per row of blocks
            left = _gemm.left_operand(A[i0:i1], mode, cp)
        G = _gemm.gemm(left, _gemm.right_operand(A[j0:j1], mode, cp), backend, mode)
        offer_block(G, col_sq[j0:j1], i0, j0, best, arg)
        if j0 != i0:
            offer_block(cp.ascontiguousarray(G.T), col_sq[i0:i1], j0, i0, best, arg)
    return best, arg


def nearest_neighbors(A, n_neighbors: int, block: int = BLOCK, *, col_sq=None, mode: str = "fp32"):
    """device int64 array (n, n_neighbors): the indices of the ``n_neighbors`` nearest other rows of A (n, d) for
    every row by (key, index) (:func:`search`), nearest key first: the candidates, not yet exact. See
    :func:`kkmgpu.kernels.knn_cpu.nearest_neighbors`."""
    return search(A, n_neighbors, block, col_sq=col_sq, mode=mode)[1]
