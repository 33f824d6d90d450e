"""Kernel blocks and matrices: features prepared on the device, a GEMM plus one fused epilogue per block.

The kernel's name and parameters are a :class:`kkmgpu.kernels.spec.KernelSpec` (:mod:`kkmgpu.kernels.spec`).
The matrix is built as inner products from a GEMM, then one fused elementwise pass
(``ops.kernel_epilogue``) that turns them into kernel values in place. K(X, X) takes a single
product X X^T written straight into K (BLAS syrk on the CPU: one triangle, mirrored); K(X, Y)
and callables go in row tiles of about ``TILE_BYTES``. Every product goes through :mod:`kkmgpu.kernels.gemm` in
the spec's precision mode (``spec.precision``): with "3xtf32" the columns' operand is split once per matrix and
the rows' per tile, each within the memory guard.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from kkmgpu import _warn
from kkmgpu.backend.device import Backend, check_fits, work_bytes

from kkmgpu.kernels import gemm as _gemm
from kkmgpu.kernels.epilogue_codes import EPILOGUE_CODES  # the twins read the same codes
from kkmgpu.kernels.spec import DISTANCE_KERNELS, KernelSpec, UninformativeKernelWarning, compute_dtype

#: Rows per tile aim at this many bytes of kernel values (the callable's workspace, the GEMM's output).
TILE_BYTES = 64 * 2**20


def upper_blocks(n: int, block: int):
    """(i0, i1, j0, j1) of the blocks on and above the diagonal of an n x n matrix of ``block``-row blocks, row
    by row: what a symmetric product visits once (the nearest-neighbour search of both devices)."""
    for i0 in range(0, n, block):
        for j0 in range(i0, n, block):
            yield i0, min(n, i0 + block), j0, min(n, j0 + block)


def prepare_features(X, spec: KernelSpec, backend: Backend, dtype):
    """X on the device in ``dtype``: centred (translation-invariant kernels) and divided by ``spec.scale``."""
    xp = backend.xp
    X = backend.asarray(X)
    if spec.center is not None or spec.scale != 1.0:
        X = X.astype(xp.float64, copy=False)
        if spec.center is not None:
            X = X - backend.asarray(spec.center)
        if spec.scale != 1.0:
            X = X * (1.0 / spec.scale)
    return backend.asarray(X, dtype=dtype)


def tile_rows(n_cols: int, itemsize: int, tile_bytes: int = TILE_BYTES, backend: Backend | None = None) -> int:
    """Rows of a tile of ``n_cols`` columns within ``tile_bytes`` (and, given ``backend``, within WORK_FRACTION of
    its free memory)."""
    row = max(1, n_cols * itemsize)
    if backend is not None:
        tile_bytes = work_bytes(tile_bytes, backend, minimum=row)
    return max(1, tile_bytes // row)


def training_kernel_rows(result, X_new, backend: Backend, dt, step, index=None):
    """(i0, i1, K(X_new[i0:i1], training points)) in batches of ``step`` rows, for predict: the given rows of a
    precomputed kernel, else kernel blocks of the new points' prepared features against the training ones.
    ``index`` (device int array), if given, keeps only those training points (CATS's samples, approx's landmarks)."""
    spec = result._spec
    m = X_new.shape[0]
    if spec.name != "precomputed":
        A_all = prepare_features(X_new, spec, backend, dt)
        B = backend.asarray(result._train_features)  # a GPU fit predicted under KKMGPU_DEVICE=cpu
        if index is not None:
            B = B[index]
        b_sq = (B * B).sum(axis=1) if spec.name in DISTANCE_KERNELS else None
        right = columns_operand(B, spec, backend, "the training points' GEMM operand")
    for i0 in range(0, m, step):
        i1 = min(m, i0 + step)
        if spec.name == "precomputed":
            block = backend.asarray(X_new[i0:i1], dtype=dt)
            yield i0, i1, block if index is None else block[:, index]
        else:
            yield i0, i1, kernel_block(A_all[i0:i1], B, spec, backend, b_sq=b_sq, right=right)


def gemm_mode(spec: KernelSpec, backend: Backend, dtype, shape=None):
    """The GEMM mode the products of ``spec``'s features run in on ``backend`` (:func:`kkmgpu.kernels.gemm.
    effective_mode`; ``shape`` = (rows, columns, features) of one product), None for kernels without products
    (precomputed, callable)."""
    if spec.name in ("precomputed", "callable"):
        return None
    return _gemm.effective_mode(spec.precision, backend, dtype, shape)


def columns_operand(B, spec: KernelSpec, backend: Backend, what: str):
    """B as the right operand of the products of ``spec`` (B itself, or its 3xTF32 split, prepared once for many
    row blocks), after checking that the split copy fits the device."""
    mode = gemm_mode(spec, backend, B.dtype)
    if mode != "3xtf32":
        return B
    check_fits(_gemm.operand_bytes(B.shape[0], B.shape[1], mode), backend, f"{what} ({B.shape[0]} x "
               f"{3 * B.shape[1]} float32, the 3xTF32 split of gemm_precision='3xtf32')", option=_gemm.SPLIT_ADVICE)
    return _gemm.right_operand(B, mode, backend.xp)


def _inner_products(A, B, spec: KernelSpec, backend: Backend, out, right=None):
    """out = A B^T in the spec's GEMM mode. ``right``: B from :func:`columns_operand` (else prepared here). With
    3xTF32 the rows' operand is split in chunks whose temporaries take at most WORK_FRACTION of the free memory."""
    xp = backend.xp
    (m, d), n = A.shape, B.shape[0]
    mode = gemm_mode(spec, backend, A.dtype, (m, n, d))
    if mode != "3xtf32":
        return _gemm.gemm(A, B, backend, mode, out=out)
    if right is None or right.shape[1] != 3 * d:
        right = _gemm.right_operand(B, mode, xp)
    per_row = _gemm.operand_bytes(1, d, mode)
    step = max(1, work_bytes(m * per_row, backend, minimum=per_row) // per_row)
    for r0 in range(0, m, step):
        _gemm.gemm(_gemm.left_operand(A[r0:r0 + step], mode, xp), right, backend, mode, out=out[r0:r0 + step])
    return out


def kernel_block(A, B, spec: KernelSpec, backend: Backend, out=None, a_sq=None, b_sq=None, right=None):
    """k(A_i, B_j) for prepared (centred, typed) features A (m, d) and B (n, d) into ``out`` (m, n), the product in
    ``spec.precision``'s GEMM mode (``right``: B from :func:`columns_operand`, for blocks that share B)."""
    xp = backend.xp
    m, n = A.shape[0], B.shape[0]
    if spec.name == "callable":
        block = spec.function(A, B, **spec.params)
        block = backend.asarray(block)
        if block.shape != (m, n):
            raise ValueError(f"the kernel callable returned shape {block.shape} for inputs of "
                             f"{m} and {n} rows; expected ({m}, {n}).")
        if not bool(xp.isfinite(block).all()):
            raise ValueError("the kernel callable returned NaN or inf values.")
        if block.dtype != A.dtype:
            block = block.astype(A.dtype)
            if not bool(xp.isfinite(block).all()):
                raise ValueError(f"the kernel callable returned values beyond {np.dtype(A.dtype).name}'s range "
                                 f"(largest {float(np.finfo(A.dtype).max):.5g}); use dtype='float64' or scale the "
                                 "kernel.")
        if out is None:
            return block
        out[...] = block
        return out
    if out is None:
        out = xp.empty((m, n), dtype=A.dtype)
    _inner_products(A, B, spec, backend, out, right)
    code = EPILOGUE_CODES[spec.name]
    if code != 0:
        if spec.name in DISTANCE_KERNELS:
            a_sq = (A * A).sum(axis=1) if a_sq is None else a_sq
            b_sq = (B * B).sum(axis=1) if b_sq is None else b_sq
        else:  # unused by these kernels, but both twins read row_sq[i] for every row: full length
            a_sq, b_sq = xp.zeros(m, dtype=A.dtype), xp.zeros(n, dtype=A.dtype)
        backend.ops.kernel_epilogue(out, a_sq, b_sq, code, *spec.kernel_args)
    return out


# OpenBLAS 0.3.31's multithreaded syrk (what NumPy calls for X @ X.T) crashes with a segmentation
# fault at n = 40,000, d = 784 float32 (measured; n = 30,000 works).  Above this many rows the CPU
# builds K from row tiles of general GEMM instead (measured 15 s at n = 40k on 2 cores).
_CPU_SYRK_MAX_ROWS = 30_000


def build_kernel_matrix(A, B, spec: KernelSpec, backend: Backend, *, tile=None, verbose=False, storage=None):
    """The dense kernel matrix between prepared features A (m, d) and B (n, d).

    ``A is B`` takes one X X^T product into K; otherwise (or with ``tile``) row tiles of ``tile`` rows.
    ``storage`` (default A's dtype) may be float16: tiles are then computed in A's precision and
    rounded into a float16 K (half the memory; sums still accumulate in float32 / float64).

    Checks that the (m, n) array fits the device's free memory before allocating it.
    """
    xp = backend.xp
    m, n = A.shape[0], B.shape[0]
    storage = np.dtype(A.dtype if storage is None else storage)
    itemsize = storage.itemsize
    one_product = (A is B and spec.name != "callable" and tile is None and storage == A.dtype
                   and (backend.is_gpu or m <= _CPU_SYRK_MAX_ROWS))
    # Tiles not computed in place in K (float16 storage, a callable's blocks) take a buffer beside K: one row of it
    # at least must fit too, and the tiles are sized from what K leaves free. With 3xTF32 the split operands sit
    # beside K: both of X for the one product, the columns' for the tiles (the rows' are split per chunk).
    mode = gemm_mode(spec, backend, A.dtype, (m, n, A.shape[1]))
    split = _gemm.operand_bytes(m, A.shape[1], mode) if one_product else _gemm.operand_bytes(n, B.shape[1], mode)
    buffered = storage != A.dtype or spec.name == "callable"
    check_fits(m * n * itemsize + (n * np.dtype(A.dtype).itemsize if buffered else 0) + (2 * split if one_product
               else split), backend, f"the {m} x {n} {storage.name} kernel matrix"
               + (" and its 3xTF32 GEMM operands" if split else ""), option=_gemm.SPLIT_ADVICE if split else None)
    if verbose:
        print(f"[kkmgpu] building the {m} x {n} {spec.name} kernel matrix "
              f"({m * n * itemsize / 2**20:.1f} MiB, {storage.name}) on {backend.name}"
              + (f", GEMM precision {mode}" if mode is not None else ""))
    distance = spec.name in DISTANCE_KERNELS
    a_sq = (A * A).sum(axis=1) if distance else None
    b_sq = (B * B).sum(axis=1) if distance else None
    if one_product:
        # K = kappa(X X^T): one product of X with itself straight into K (NumPy hands it to BLAS
        # syrk, which computes one triangle and mirrors it: a third less time than general GEMM
        # tiles), then one fused elementwise pass over K. With 3xTF32: [L|H|H] [H|L|H]^T, still one GEMM.
        left, right = _gemm.left_operand(A, mode, xp), _gemm.right_operand(A, mode, xp)
        K = xp.empty((m, n), dtype=storage)
        _gemm.gemm(left, right, backend, mode, out=K)
        del left, right
        code = EPILOGUE_CODES[spec.name]
        if code != 0:
            sq = a_sq if distance else xp.zeros(m, dtype=A.dtype)  # read for every row: full length
            backend.ops.kernel_epilogue(K, sq, sq, code, *spec.kernel_args)
    else:
        right = None if spec.name == "callable" else columns_operand(B, spec, backend, "the columns' GEMM operand")
        K = xp.empty((m, n), dtype=storage)
        step = tile or tile_rows(n, np.dtype(A.dtype).itemsize, backend=backend)
        for i0 in range(0, m, step):
            i1 = min(m, i0 + step)
            out = K[i0:i1] if storage == A.dtype else None
            block = kernel_block(A[i0:i1], B, spec, backend, out=out,
                                 a_sq=None if a_sq is None else a_sq[i0:i1], b_sq=b_sq, right=right)
            if out is None:
                _check_storable(block, storage, spec, backend)
                K[i0:i1] = block  # rounded to the storage precision
    if distance and A is B:
        # ||x - x|| is exactly 0; the GEMM form leaves rounding there, which the laplacian's sqrt
        # would amplify to ~1e-8 (float64) in K_ii.
        idx = xp.arange(m)
        K[idx, idx] = 1
    return K


def _check_storable(block, storage, spec, backend):
    """ValueError if a computed tile has values beyond the storage precision's largest (a callable's, in float16)."""
    if block.dtype == storage or block.size == 0:
        return
    largest = float(np.finfo(storage).max)
    xp = backend.xp
    top = float(xp.maximum(block.max(), -block.min()))
    if top > largest:
        raise ValueError(f"{spec.describe()} has values up to {top:.5g} (in its computed units), beyond "
                         f"{storage.name}'s largest value {largest:.5g}; use dtype='float32' or scale the kernel.")


def kernel_diagonal(A, spec: KernelSpec, backend: Backend, *, tile=1024):
    """k(x_i, x_i) for the rows of prepared features A (n, d), float64, without an n x n matrix."""
    xp = backend.xp
    n = A.shape[0]
    if spec.name in DISTANCE_KERNELS:
        return xp.ones(n, dtype=xp.float64)
    sq = (A.astype(xp.float64) ** 2).sum(axis=1)
    if spec.name == "linear":
        return sq
    gamma, coef0, degree = spec.kernel_args
    if spec.name == "polynomial":
        return (gamma * sq + coef0) ** degree
    if spec.name == "sigmoid":
        return xp.tanh(gamma * sq + coef0)
    if spec.name == "callable":
        out = xp.empty(n, dtype=xp.float64)
        for i0 in range(0, n, tile):
            block = kernel_block(A[i0:i0 + tile], A[i0:i0 + tile], spec, backend)
            out[i0:i0 + tile] = xp.diagonal(block)
        return out
    raise ValueError(f"kernel {spec.name!r} has no features to evaluate the diagonal from")


#: rows of K sampled (evenly spaced, no random state consumed) to judge whether it carries information
INFORMATIVE_SAMPLE_ROWS = 32


def check_informative(spec: KernelSpec, backend: Backend, storage, *, X=None, K=None, chunk_rows=65536):
    """Warn (:class:`UninformativeKernelWarning`) when K is numerically the identity or a constant.

    Reads ``INFORMATIVE_SAMPLE_ROWS`` evenly spaced rows of K against every point (blocks from the
    data ``X`` on the device, prepared in chunks of ``chunk_rows``, or rows of a dense precomputed ``K``):
    O(rows n d), no n x n pass. In the
    storage precision (eps), K is

    * numerically the identity when every sampled row's off-diagonal values are at most
      eps sqrt(K_ii K_jj) in magnitude (each point is alone: gamma too large for the distance kernels);
    * numerically constant when every sampled pair's feature-space distance K_ii + K_jj - 2 K_ij is at most
      eps max(|K_ii|, |K_jj|) (all points coincide in feature space: gamma too small, or too large for
      a saturated sigmoid).

    Returns "identity", "constant" or None.
    """
    xp = backend.xp
    n = (X if K is None else K).shape[0]
    if n < 2:
        return None
    rows = np.unique(np.linspace(0, n - 1, min(n, INFORMATIVE_SAMPLE_ROWS)).round().astype(np.int64))
    idx = backend.asarray(rows)
    # every chunk of the sampled rows goes to the host at once: the device holds one chunk, within the work share
    # of its free memory (the memory guard of the run's own arrays comes later)
    per_column = 8 * (2 * rows.size + (X.shape[1] if K is None else 0) + 2)
    chunk = max(1, min(int(chunk_rows), work_bytes(int(chunk_rows) * per_column, backend) // per_column))
    blocks, diags = [], []
    spec = replace(spec, precision="fp32")  # 32 sampled rows: a memory-bound product, judged in plain float32
    if K is None:
        compute = np.dtype(np.float32) if np.dtype(storage) == np.float16 else np.dtype(storage)
        sampled = prepare_features(X[idx], spec, backend, compute)
        for i0 in range(0, n, chunk):
            part = prepare_features(X[i0:i0 + chunk], spec, backend, compute)
            blocks.append(backend.to_host(kernel_block(sampled, part, spec, backend)))
            diags.append(backend.to_host(kernel_diagonal(part, spec, backend)))
            del part
        block, diag = np.concatenate(blocks, axis=1), np.concatenate(diags)
        if spec.name in DISTANCE_KERNELS:  # K_ii = 1 exactly, as the engines store it
            block[np.arange(rows.size), rows] = 1
    else:
        for i0 in range(0, n, chunk):
            blocks.append(backend.to_host(K[idx, i0:i0 + chunk]))
            diags.append(backend.to_host(xp.diagonal(K[i0:i0 + chunk, i0:i0 + chunk])))
        block, diag = np.concatenate(blocks, axis=1), np.concatenate(diags)
    storage = np.dtype(storage)
    with np.errstate(over="ignore", invalid="ignore"):  # a callable's values beyond float16 are refused later
        return _judge_informative(spec, storage, rows, block, diag, X)


def _judge_informative(spec, storage, rows, block, diag, X):
    """The judgement of :func:`check_informative` on the host copies of the sampled rows and the diagonal."""
    block = block.astype(storage).astype(np.float64)  # the values as stored
    diag = diag.astype(storage).astype(np.float64)
    eps = float(np.finfo(storage).eps)
    own = diag[rows][:, None]
    others = diag[None, :]
    off = np.ones(block.shape, dtype=bool)
    off[np.arange(rows.size), rows] = False
    if not off.any():
        return None
    magnitude = np.sqrt(np.abs(own)) * np.sqrt(np.abs(others))
    identity = bool(np.all(np.abs(block[off]) <= eps * magnitude[off])) and bool(np.any(magnitude[off] > 0))
    half_distance = 0.5 * own + 0.5 * others - block  # halved: no overflow near the dtype's largest value
    constant = bool(np.all(np.abs(half_distance[off]) <= 0.5 * eps * np.maximum(np.abs(own), np.abs(others))[off]))
    if not (identity or constant):
        return None
    name = spec.name
    if identity:
        what = (f"numerically the identity in {storage.name} (the sampled off-diagonal values are below {eps:.2g} "
                "times the diagonal: every point is alone in feature space)")
        advice = {"rbf": "decrease gamma", "laplacian": "decrease gamma", "polynomial": "lower gamma or the degree",
                  "sigmoid": "change gamma"}.get(name)
    else:
        what = (f"numerically constant in {storage.name} (the sampled points coincide in feature space: "
                f"K_ii + K_jj - 2 K_ij is below {eps:.2g} times K_ii), so no partition is better than another")
        advice = {"rbf": "increase gamma", "laplacian": "increase gamma", "polynomial": "increase gamma",
                  "linear": "X's points coincide"}.get(name)
        if name == "sigmoid":
            # constant at tanh(coef0): gamma <x, y> is negligible; elsewhere (near +-1): tanh is saturated
            at_coef0 = abs(float(np.median(block[off])) - math.tanh(spec.kernel_args[1])) <= 1e-3
            advice = "increase gamma" if at_coef0 else "decrease gamma (tanh is saturated)"
    if constant and X is not None and bool((X.max(axis=0) == X.min(axis=0)).all()):
        advice = "X's points coincide"
    message = f"the kernel matrix of {spec.describe()} is {what}."
    if advice:
        message += f" {advice[0].upper()}{advice[1:]}."
    if storage != np.float64:
        message += " dtype='float64' may also resolve it."
    _warn.warn(message, UninformativeKernelWarning)
    return "identity" if identity else "constant"


def kernel_on_device(X, spec, backend, dt, precomputed):
    """(K in ``dt`` on the device, prepared features or None): a precomputed K copied (memory checked), else the
    features prepared for building K."""
    if precomputed:
        if X.dtype != dt:
            n = X.shape[0]
            check_fits(X.size * dt.itemsize, backend, f"the {n} x {n} {dt.name} copy of K")
        return backend.asarray(X, dtype=dt), None
    return None, prepare_features(X, spec, backend, compute_dtype(dt))
