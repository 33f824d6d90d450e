"""Kernel blocks between all n points and a few chosen ones (CATS's samples, approx's landmarks, a cluster's members
for the exact objective), from features or a precomputed K, each GEMM operand prepared as few times as it is used.

A block is one GEMM in the spec's precision mode (:mod:`kkmgpu.kernels.gemm`) and one fused epilogue. The chosen
points are the right operand, prepared once per set (:meth:`KernelSource.columns`: their 3xTF32 split and squared
norms) for all the row tiles that use them. The rows' operand is the features of all n points: in "3xtf32" their
split ``[L | H | H]`` (n x 3 d float32) costs about a dozen elementwise launches and some 150 bytes of device traffic
per feature value (the stand-in's ledger, 2026-11-26), far more than the GEMM of a few hundred columns that reads
it, so a caller that reads every row many times (CATS: one or two passes per iteration) prepares it once
(:meth:`KernelSource.prepare_rows`) when it fits the device beside the caller's arrays. Where it does not fit, the
roofline decides: a split per block pays only from :data:`SPLIT_PER_BLOCK_MIN_COLUMNS` columns on; below, those
blocks run "fp32" (as accurate: 3xTF32 gives float32-level error), and :meth:`KernelSource.mode_ran` says so.
The squared norms of the distance kernels' epilogue are computed once per source, not per block.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from kkmgpu.backend.device import MEMORY_HEADROOM, Backend, InsufficientMemoryError, check_fits, work_bytes
from kkmgpu.kernels import blocks as _kernels
from kkmgpu.kernels import gemm as _gemm
from kkmgpu.kernels.epilogue_codes import EPILOGUE_CODES
from kkmgpu.kernels.spec import DISTANCE_KERNELS

__all__ = ["KernelSource", "Columns", "SPLIT_PER_BLOCK_MIN_COLUMNS"]

#: A 3xTF32 product whose rows are split for that product alone pays from this many columns on. Splitting a float32
#: value moves about 150 bytes of device memory (gemm.tf32_split's CuPy steps and the concatenation, counted by the
#: stand-in's ledger); the product saves 2 c (1 / F - 3 / T) seconds per value over "fp32" for c columns. With an
#: H100's F = 51 TFLOP/s (FP32, measured 2026-11-24), T = 399 TFLOP/s (TF32 tensor cores, half the measured BF16
#: rate) and 2.99 TB/s (measured copy bandwidth): 150 / 2.99e12 = c * 2.42e-14 at c of about 2070.
SPLIT_PER_BLOCK_MIN_COLUMNS = 2048


@dataclass
class Columns:
    """Chosen points as the right operand of blocks against any rows: ``samples`` (their features, or their indices
    for a precomputed K), ``right`` (the GEMM operand in ``mode``: the 3xTF32 split or the features), ``sq`` (their
    squared norms, or zeros, as the epilogue reads them) and ``mode`` (None without a GEMM)."""

    samples: object
    right: object = None
    sq: object = None
    mode: str | None = None
    left: object = None  # their 3xTF32 left operand, gathered from the prepared rows (for K(S, S))

    def part(self, s: slice) -> "Columns":
        """The chosen points ``s`` (a slice) of these, as prepared."""
        def cut(a):
            return None if a is None else a[s]
        return Columns(self.samples[s], cut(self.right), cut(self.sq), self.mode, cut(self.left))


class KernelSource:
    """Blocks of the kernel between points and chosen points, from features or a precomputed K.

    ``A`` is prepared features (n, d) and ``spec`` a kernel spec, or, for kernel="precomputed", ``A`` is K itself
    and blocks are gathered from it.
    """

    def __init__(self, A, spec, backend: Backend):
        self.A, self.spec, self.backend = A, spec, backend
        self.n = A.shape[0]
        self.precomputed = spec.name == "precomputed"
        self._sq = None
        self._rows = None          # the prepared all-points left operand ("3xtf32"), or None
        self._rows_refused = False  # preparing it was asked for and did not fit
        self._flops = Counter()    # GEMM flops of the blocks against all points, per mode that ran

    @property
    def itemsize(self):
        return np.dtype(self.A.dtype).itemsize

    def diagonal(self):
        if self.precomputed:
            return self.backend.xp.diagonal(self.A).astype(self.backend.xp.float64)
        return _kernels.kernel_diagonal(self.A, self.spec, self.backend)

    def take(self, index):
        """The chosen points ``index`` (device int64) as features (indices for a precomputed K)."""
        return index if self.precomputed else self.A[index]

    def row_norms(self):
        """What the epilogue reads per point: squared norms for the distance kernels, else zeros (computed once)."""
        if self._sq is None:
            xp = self.backend.xp
            self._sq = (self.A * self.A).sum(axis=1) if self.spec.name in DISTANCE_KERNELS else \
                xp.zeros(self.n, dtype=self.A.dtype)
        return self._sq

    def _base_mode(self, cols):
        """The mode of an n x ``cols`` block by the spec and the shape (None: precomputed or callable)."""
        if self.precomputed:
            return None
        return _kernels.gemm_mode(self.spec, self.backend, self.A.dtype, (self.n, cols, self.A.shape[1]))

    def block_mode(self, cols):
        """The mode an n x ``cols`` block runs in: the spec's (:func:`kkmgpu.kernels.blocks.gemm_mode`), except that
        "3xtf32" becomes "fp32" where the rows were to be prepared, did not fit, and a split per block would not pay
        (fewer than SPLIT_PER_BLOCK_MIN_COLUMNS columns)."""
        mode = self._base_mode(cols)
        if mode == "3xtf32" and self._rows is None and self._rows_refused and cols < SPLIT_PER_BLOCK_MIN_COLUMNS:
            return "fp32"
        return mode

    def prepare_rows(self, cols, reserve=0):
        """Prepare the all-points left operand once, for callers that read every row many times, when blocks of
        ``cols`` columns run "3xtf32" and its n x 3 d float32 (and the split's temporaries, in row chunks) fit the
        device beside ``reserve`` bytes the caller still needs; otherwise record the refusal (see
        :meth:`block_mode`). Returns whether the prepared operand is there."""
        if self._rows is not None or self._rows_refused or self._base_mode(cols) != "3xtf32":
            return self._rows is not None
        xp, (n, d) = self.backend.xp, self.A.shape
        operand = 3 * 4 * n * d
        per_row = _gemm.operand_bytes(1, d, "3xtf32")  # a chunk's H, L and [L | H | H]
        step = max(1, work_bytes(n * per_row, self.backend, minimum=per_row) // per_row)
        available = self.backend.available_bytes()
        if available is not None:  # the chunks within what the operand and the reserve leave
            step = min(step, max(1, (int(available * MEMORY_HEADROOM) - operand - int(reserve)) // per_row))
        try:
            check_fits(operand + int(reserve) + min(n, step) * per_row, self.backend,
                       f"the {n} x {3 * d} float32 3xTF32 split of all points")
        except InsufficientMemoryError:
            self._rows_refused = True
            return False
        rows = xp.empty((n, 3 * d), dtype=xp.float32)
        for r0 in range(0, n, step):
            rows[r0:r0 + step] = _gemm.left_operand(self.A[r0:r0 + step], "3xtf32", xp)
        self._rows = rows
        return True

    def columns(self, samples, index=None):
        """``samples`` (from :meth:`take`; ``index``: their rows, for their squared norms without recomputing) as
        the right operand of :meth:`block`, prepared once in the mode of n x len(samples) blocks (the split copy
        checked against the free memory)."""
        if self.precomputed or self.spec.name == "callable":
            return Columns(samples)
        mode = self.block_mode(samples.shape[0])
        sq = self.row_norms()[index] if index is not None else (
            (samples * samples).sum(axis=1) if self.spec.name in DISTANCE_KERNELS else
            self.backend.xp.zeros(samples.shape[0], dtype=samples.dtype))
        right = left = None
        if mode == "3xtf32":
            rows, d = samples.shape
            check_fits(_gemm.operand_bytes(rows, d, mode), self.backend, f"the chosen points' GEMM operand ({rows} x "
                       f"{3 * d} float32, the 3xTF32 split of gemm_precision='3xtf32')", option=_gemm.SPLIT_ADVICE)
            if self._rows is not None and index is not None:  # [L | H | H] gathered; [H | L | H] its columns moved
                left = self._rows[index]
                right = self.backend.xp.concatenate([left[:, d:2 * d], left[:, :d], left[:, 2 * d:]], axis=1)
            else:
                right = _gemm.right_operand(samples, mode, self.backend.xp)
        return Columns(samples, right, sq, mode, left)

    def _prepared_product(self, left, columns, a_sq):
        """The block of prepared 3xTF32 operands: one GEMM and the fused epilogue."""
        out = self.backend.xp.empty((left.shape[0], columns.right.shape[0]), dtype=self.A.dtype)
        _gemm.gemm(left, columns.right, self.backend, "3xtf32", out=out)
        code = EPILOGUE_CODES[self.spec.name]
        if code != 0:
            self.backend.ops.kernel_epilogue(out, a_sq, columns.sq, code, *self.spec.kernel_args)
        return out

    def block(self, i0, i1, samples, columns=None):
        """K(x_i, s) for i in [i0, i1) and the chosen points ``samples`` (from :meth:`take`; ``columns`` from
        :meth:`columns` where several blocks share them)."""
        return self.rows_block(slice(i0, i1), samples, columns)

    def rows_block(self, rows, samples, columns=None):
        """K(x_i, s) for the rows ``rows`` (a slice, or device indices) and the chosen points."""
        if self.precomputed:
            return self.A[rows][:, samples] if isinstance(rows, slice) else self.A[rows[:, None], samples[None, :]]
        if columns is None:
            columns = self.columns(samples)
        A = self.A[rows]
        sq = None if self.spec.name == "callable" else self.row_norms()[rows]
        t, cols = A.shape[0], samples.shape[0]
        if columns.mode is not None:
            self._flops[columns.mode] += 2 * t * cols * A.shape[1]
        if columns.mode == "3xtf32" and self._rows is not None:
            return self._prepared_product(self._rows[rows], columns, sq)
        spec = self.spec
        if columns.mode == "fp32" and spec.precision != "fp32":  # block_mode's roofline choice
            spec = replace(spec, precision="fp32")
        right = columns.right if columns.mode == "3xtf32" else None
        return _kernels.kernel_block(A, samples, spec, self.backend, a_sq=sq, b_sq=columns.sq, right=right)

    def square(self, samples, columns=None):
        """K(s, s') for the chosen points ``samples`` (from :meth:`take`; ``columns`` for them, if prepared)."""
        if self.precomputed:
            return self.A[samples][:, samples]
        if columns is None:
            return _kernels.kernel_block(samples, samples, self.spec, self.backend)
        if columns.left is not None:
            return self._prepared_product(columns.left, columns, columns.sq)
        spec = self.spec
        if columns.mode == "fp32" and spec.precision != "fp32":
            spec = replace(spec, precision="fp32")
        right = columns.right if columns.mode == "3xtf32" else None
        return _kernels.kernel_block(samples, samples, spec, self.backend, a_sq=columns.sq, b_sq=columns.sq,
                                     right=right)

    def mode_ran(self, default=None):
        """The GEMM mode of most of the flops of the blocks against all points so far (``default`` if none ran)."""
        return self._flops.most_common(1)[0][0] if self._flops else default
