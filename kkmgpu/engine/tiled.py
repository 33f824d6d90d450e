"""The matrix-free (tiled) engine: cluster sums recomputed from the features every iteration, no n x n matrix.

For each row tile [i0, i1) one GEMM gives the inner products G = A[i0:i1] A_cols^T (BLAS on the CPU,
cuBLAS on a GPU, in the spec's precision mode: :mod:`kkmgpu.kernels.gemm`), and one fused pass
(:mod:`kkmgpu.kernels.tiled_cpu` / kernels_cuda/tiled.cu) turns every
entry into a kernel value and adds it, weighted, into the cluster sums of its row at once:

    S[i, c] = sum_{j in c} w_j k(x_i, x_j)                          (papers' Eq. 3-4)

Columns are taken in label order, so each row's sums are contiguous runs; their GEMM operand is gathered (and,
in 3xTF32, split) once per pass, the rows' per tile. The incremental form after m
points moved recomputes only the n x m tile of the moved columns: S += K[:, moved] dY. Memory is
O(n d + n k) plus one tile; time 2 n^2 d flops per full pass (2 n m d incremental).

The distance kernels get k(x, x) = 1 exactly on the diagonal (as the dense engine stores K), so from the
same initial labels the tiled and dense engines follow the same iterations up to the rounding of the sums.
"""

from __future__ import annotations


import numpy as np

from kkmgpu import _warn
from kkmgpu.kernels import blocks as _kernels
from kkmgpu.kernels import gemm as _gemm
from kkmgpu.kernels import spec as _kernel_spec
from kkmgpu.backend.device import Backend, _format_bytes, argsort_stable, check_fits
from kkmgpu.engine.dense import moved_points
from kkmgpu import _progress
from kkmgpu._progress import progress_bar

__all__ = ["TiledKernelOperator", "choose_engine", "dense_fits", "tiled_ops"]

#: Largest tile of inner products (bytes); a tile also takes at most TILE_FRACTION of the free memory.
TILE_MAX_BYTES = {"cpu": 64 * 2**20, "cuda": 2 * 2**30}
TILE_FRACTION = 0.25


def tiled_ops(backend: Backend):
    """The module with the tiled engine's fused operations for ``backend`` (CPU twin or GPU twin)."""
    if backend.is_gpu:
        from kkmgpu.kernels import tiled_cuda as ops
    else:
        from kkmgpu.kernels import tiled_cpu as ops
    return ops


def dense_fits(n: int, itemsize: int, backend: Backend) -> bool:
    """Whether the dense n x n kernel matrix fits the device's free memory (the dense engine's own check)."""
    try:
        _kernels.check_fits(n * n * itemsize, backend, "the kernel matrix")
    except MemoryError:
        return False
    return True


def choose_engine(engine: str, n: int, dtype, backend: Backend) -> str:
    """Resolve ``engine="auto"``: "dense" when the n x n matrix fits the free memory, else "tiled".

    Falling back to the tiled engine warns (``UserWarning``, once per fit): each iteration then costs
    2 n^2 d flops instead of one pass over K, which a user should hear about; ``engine="tiled"``
    chooses it explicitly and silently.
    """
    if engine != "auto":
        return engine
    itemsize = np.dtype(dtype).itemsize
    if dense_fits(n, itemsize, backend):
        return "dense"
    available = backend.available_bytes()
    _warn.warn(
        f"engine='auto': the dense {n} x {n} {np.dtype(dtype).name} kernel matrix needs "
        f"{_format_bytes(n * n * itemsize)} but {backend.name} has {_format_bytes(available or 0)} free; using "
        "engine='tiled' (kernel tiles recomputed from X every iteration: O(n d + n k) memory, 2 n^2 d flops per "
        "full pass). Pass engine='tiled' to choose it without this warning.", UserWarning)
    return "tiled"


class TiledKernelOperator:
    """Cluster sums of kernel k-means from prepared features, K recomputed in tiles (never stored).

    Implements the operator interface of :mod:`kkmgpu.engine.lloyd` (``n``, ``weights``, ``backend``,
    ``diag``, ``total_diag``, ``rows``, ``cluster_sums``, ``incremental_cost``, ``update_cluster_sums``).

    Parameters
    ----------
    A : array of shape (n, d)
        Prepared features (:func:`kkmgpu.kernels.blocks.prepare_features`), float32 or float64, on the device.
    spec : KernelSpec
        Any kernel but "precomputed". Its ``precision`` is the GEMM mode of the tiles' products.
    weights : float64 array of shape (n,) on the device
    backend : Backend
    tile_rows : int, optional
        Rows per tile (default: a tile's inner products and, in 3xTF32, its rows' split operand within
        ``TILE_MAX_BYTES`` and TILE_FRACTION of the free memory).
    row_range : (int, int), optional
        Compute S only for the rows [r0, r1) (against every point): a Dask worker's block. ``diag`` and
        ``total_diag`` then refer to those rows.
    verbose : bool, default=False
        Print the progress of every full pass (about every 10% of its tiles): a pass can take minutes.
    progress : bool, optional
        A progress bar over the rows of every full pass (gone when the pass ends); default: as
        ``fit(progress=...)`` says.
    """

    #: :func:`kkmgpu.engine.lloyd.lloyd` passes the number of moved points to :meth:`update_cluster_sums`.
    takes_moved_count = True

    def __init__(self, A, spec, weights, backend: Backend, *, tile_rows=None, row_range=None, verbose=False,
                 progress=None):
        if spec.name == "precomputed":
            raise ValueError("the tiled engine computes K from features; kernel='precomputed' has none.")
        xp = backend.xp
        self.A, self.spec, self.weights, self.backend = A, spec, weights, backend
        self.n = A.shape[0]
        self.r0, self.r1 = (0, self.n) if row_range is None else (int(row_range[0]), int(row_range[1]))
        self.verbose = bool(verbose)
        self.progress = _progress.active() if progress is None else bool(progress)
        self.ops = tiled_ops(backend)
        self.kind = 0 if spec.name == "callable" else _kernels.EPILOGUE_CODES[spec.name]
        self.sq = (A * A).sum(axis=1) if spec.name in _kernel_spec.DISTANCE_KERNELS else None
        self.diag = _kernels.kernel_diagonal(A[self.r0:self.r1], spec, backend)
        self.total_diag = float((weights[self.r0:self.r1] * self.diag).sum())
        itemsize = np.dtype(A.dtype).itemsize
        if tile_rows is not None:
            self._tile_bytes = None
            self._fixed_rows = max(1, int(tile_rows))
        else:
            cap = TILE_MAX_BYTES["cuda" if backend.is_gpu else "cpu"]
            available = backend.available_bytes()
            self._tile_bytes = cap if available is None else max(itemsize * self.n, min(cap, int(TILE_FRACTION
                                                                                                 * available)))
            self._fixed_rows = None
        self._itemsize = itemsize
        self._xp = xp

    # -- tiles -------------------------------------------------------------------------------------

    def pass_mode(self, n_cols: int):
        """The GEMM mode of a pass over ``n_cols`` columns (every tile of the pass takes it), None for a callable."""
        return _kernels.gemm_mode(self.spec, self.backend, self.A.dtype, (self.r1 - self.r0, n_cols, self.A.shape[1]))

    def tile_rows(self, n_cols: int, mode=None) -> int:
        """Rows per tile for a tile of ``n_cols`` columns (``mode``: the pass's GEMM mode, default
        :meth:`pass_mode`; a 3xTF32 tile also holds its rows' split operand)."""
        if self._fixed_rows is not None:
            return self._fixed_rows
        row = n_cols * self._itemsize + _gemm.operand_bytes(1, self.A.shape[1], mode or self.pass_mode(n_cols))
        return max(1, min(self.r1 - self.r0, self._tile_bytes // max(1, row)))

    def _columns(self, index, mode, step):
        """The columns A[index] as the pass's right GEMM operand (gathered, split in 3xTF32 a tile's rows at a
        time), after checking that it fits beside a tile of ``step`` rows."""
        n_cols, d = index.shape[0], self.A.shape[1]
        operand = n_cols * d * (3 * 4 if mode == "3xtf32" else self._itemsize)
        tile = step * (n_cols * self._itemsize + _gemm.operand_bytes(1, d, mode or "fp32"))
        split = mode == "3xtf32"
        check_fits(operand + tile, self.backend, f"the tiled engine's pass: {n_cols} columns"
                   + (" (their 3xTF32 split)" if split else "") + f" and a {step}-row tile",
                   option=_gemm.SPLIT_ADVICE if split else None)
        if mode is None:
            return self.A[index]
        return _gemm.right_operand(self.A, mode, self._xp, index=index, chunk_rows=step)

    def _inner(self, i0, i1, cols, buffer, mode):
        """G = A[i0:i1] cols^T (a GEMM in the pass's ``mode``), or a callable's kernel block; returns (G, kind)."""
        rows = self.A[i0:i1]
        if self.spec.name == "callable":
            return _kernels.kernel_block(rows, cols, self.spec, self.backend), 0
        out = buffer[:i1 - i0]
        _gemm.gemm(_gemm.left_operand(rows, mode, self._xp), cols, self.backend, mode, out=out)
        return out, self.kind

    def _tiles(self, n_cols, step):
        buffer = None if self.spec.name == "callable" else \
            self._xp.empty((min(step, self.r1 - self.r0), n_cols), dtype=self.A.dtype)
        for i0 in range(self.r0, self.r1, step):
            yield i0, min(self.r1, i0 + step), buffer

    def _params(self):
        return self.spec.kernel_args

    # -- the operator interface ----------------------------------------------------------------------

    def rows(self, index):
        """K[index, :] (every point) as a float64 host array."""
        return self.backend.to_host(self.device_rows(self.backend.asarray(np.asarray(index, dtype=np.int64))))

    def device_rows(self, index):
        """K[index, :] (every point), float64 on the device, for k-means++ seeding: only the few indices cross to
        the host (the epilogue places each row's unit diagonal by its host index)."""
        xp = self._xp
        if self.spec.name == "callable":
            return _kernels.kernel_block(self.A[index], self.A, self.spec, self.backend).astype(xp.float64)
        points = np.asarray(self.backend.to_host(index), dtype=np.int64).reshape(-1)
        out = xp.empty((points.size, self.n), dtype=xp.float64)
        everyone = xp.arange(self.n, dtype=xp.int64)
        for r, point in enumerate(points.tolist()):
            G = _gemm.product(self.A[point:point + 1], self.A, self.backend, self.spec.precision)
            self.ops.tile_epilogue(G, None if self.sq is None else self.sq[point:point + 1], self.sq, self.kind,
                                   *self._params(), everyone, point)
            out[r] = G[0]
        return out

    def cluster_sums(self, labels, k):
        """S (rows r0..r1, k) float64 for ``labels`` (device int32 (n,)), one GEMM tile at a time."""
        xp = self._xp
        order = argsort_stable(xp, labels)
        mode = self.pass_mode(self.n)
        tile = self.tile_rows(self.n, mode)
        cols = self._columns(order, mode, tile)  # columns in label order: each row's cluster sums are contiguous runs
        clusters = labels[order].astype(xp.int32)
        coeffs = self.weights[order]
        col_sq = None if self.sq is None else self.sq[order]
        S = xp.zeros((self.r1 - self.r0, k), dtype=xp.float64)
        rows = self.r1 - self.r0
        step = max(1, rows // 10)  # of the verbose progress lines
        bar = progress_bar(rows, desc="tiled pass", unit="row", enabled=self.progress, leave=False)
        for i0, i1, buffer in self._tiles(self.n, tile):
            G, kind = self._inner(i0, i1, cols, buffer, mode)
            self.ops.tile_cluster_sums(G, None if self.sq is None else self.sq[i0:i1], col_sq, kind,
                                       *self._params(), clusters, coeffs, order, i0,
                                       S[i0 - self.r0:i1 - self.r0])
            if self.verbose and ((i1 - self.r0) // step > (i0 - self.r0) // step or i1 == self.r1):
                print(f"[kkmgpu] tiled pass: {i1 - self.r0} of {rows} rows")
            bar.update(i1 - i0)
        bar.close()
        return S

    def incremental_cost(self, n_moved):
        """Flops of the incremental update (n x m tiles) relative to a full pass (n x n)."""
        return n_moved / max(1, self.n)

    def update_cluster_sums(self, S, old_labels, new_labels, n_moved=None):
        """S for ``new_labels`` from S for ``old_labels``, in place: only the moved points' columns.

        ``n_moved``: how many labels differ, if known (the Lloyd loop's transfer; else counted here, one transfer).
        The moved points are gathered on the device in increasing order without a transfer
        (:func:`kkmgpu.engine.dense.moved_points`).
        """
        xp = self._xp
        m = int(xp.count_nonzero(old_labels != new_labels)) if n_moved is None else int(n_moved)
        if m == 0:
            return S
        moved = moved_points(old_labels, new_labels, m, xp)
        mode = self.pass_mode(m)
        step = self.tile_rows(m, mode)
        cols = self._columns(moved, mode, step)
        col_sq = None if self.sq is None else self.sq[moved]
        new_c = new_labels[moved].astype(xp.int32)
        old_c = old_labels[moved].astype(xp.int32)
        coeffs = self.weights[moved]
        for i0, i1, buffer in self._tiles(m, step):
            G, kind = self._inner(i0, i1, cols, buffer, mode)
            self.ops.tile_moved_sums(G, None if self.sq is None else self.sq[i0:i1], col_sq, kind,
                                     *self._params(), new_c, old_c, coeffs, moved, i0,
                                     S[i0 - self.r0:i1 - self.r0])
        return S
