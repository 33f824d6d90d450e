"""Launch cudacpu kernels in a process of their own, for the sanitizer tests and CI (stdlib + NumPy + cudacpu).

    python tests/cudacpu --sanitize address,undefined -- python tests/cuda_planted/drive.py oob
    python tests/cudacpu --sanitize thread -- python tests/cuda_planted/drive.py real

Cases: ``reference`` (every kernel of reference.cu against NumPy), ``real`` (every kernel of kernels_cuda/*.cu,
every instantiation kkmgpu asks for, on small inputs against float64 NumPy formulas), and the planted bugs
``oob``, ``shared_overrun``, ``overflow``, ``misaligned``, ``missing_barrier``, ``racy``, ``racy_counts``,
``divergent``. A planted case that runs to its end
prints ``NOT CAUGHT`` and exits 3; the sanitizer is expected to stop the process first. ``reference`` and
``real`` print ``OK`` and exit 0, or the mismatches and exit 1.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
ROOT = TESTS.parent


def _setup():
    for p in (str(TESTS), str(ROOT)):
        if p not in sys.path:
            sys.path.insert(0, p)


def module(name, name_expressions=()):
    import cudacpu
    return cudacpu.Module((HERE / name).read_text(), name_expressions, ("-std=c++14",),
                          source_path=HERE / name)


class Checks:
    def __init__(self):
        self.failures = []

    def close(self, what, got, want, rtol, atol=0.0):
        import numpy as np
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True):
            diff = np.max(np.abs(got - want)) if got.shape == want.shape else f"shapes {got.shape} {want.shape}"
            self.failures.append(f"{what}: max |got - want| = {diff}")

    def equal(self, what, got, want):
        import numpy as np
        if not np.array_equal(np.asarray(got), np.asarray(want)):
            self.failures.append(f"{what}: got {np.asarray(got).ravel()[:12]}, want {np.asarray(want).ravel()[:12]}")

    def finish(self):
        if self.failures:
            print("MISMATCH\n" + "\n".join(self.failures))
            return 1
        print("OK")
        return 0


# ---- correct kernels ---------------------------------------------------------------------------------------------
def reference_case(checks):
    import numpy as np
    rng = np.random.default_rng(20240611)
    mod = module("reference.cu", ("scale<float>", "scale<double>"))

    x = rng.normal(size=1000)
    total = np.zeros(1)
    mod.get_function("block_sums")((3,), (128,), (x, total, np.int64(x.size)), shared_mem=128 * 8)
    checks.close("block_sums", total[0], x.sum(), rtol=1e-12, atol=1e-12)

    grid, block = (3, 2, 2), (4, 3, 2)
    threads, blocks = 24, 12
    out = np.zeros(threads * blocks * 12, np.uint32)
    mod.get_function("write_indices")(grid, block, (out,))
    want = expected_indices(grid, block)
    checks.equal("write_indices", out.reshape(-1, 12), want)

    n = 100  # 4 warps of a 128-thread block: the last one partly past n
    x = rng.random(n)
    out = np.zeros(4 * 5)
    mod.get_function("warp_stats")((1,), (128,), (x, out, np.int32(n)))
    checks.close("warp_stats", out.reshape(4, 5), expected_warp_stats(x, 4), rtol=1e-12, atol=1e-12)

    for dtype, name in ((np.float32, "scale<float>"), (np.float64, "scale<double>")):
        x = rng.normal(size=300).astype(dtype)
        y = np.zeros_like(x)
        a = dtype(1.5)
        mod.get_function(name)((2,), (64,), (y, x, a, np.int64(x.size)))
        checks.close(name, y, 1.5 * x.astype(np.float64), rtol=1e-6 if dtype == np.float32 else 1e-15)

    labels = rng.integers(-2, 9, size=700).astype(np.int32)  # some out of range
    counts = np.zeros(7, np.uint64)
    in_range = np.zeros(1, np.uint32)
    mod.get_function("histogram")((3,), (256,), (labels, np.int64(labels.size), counts, np.int32(7), in_range))
    ok = (labels >= 0) & (labels < 7)
    checks.equal("histogram", counts, np.bincount(labels[ok], minlength=7))
    checks.equal("histogram in range (__syncthreads_count)", in_range, [ok.sum()])


def expected_indices(grid, block):
    """Rows of (threadIdx, blockIdx, blockDim, gridDim) in write_indices' order."""
    import numpy as np
    rows = []
    for bz in range(grid[2]):
        for by in range(grid[1]):
            for bx in range(grid[0]):
                for tz in range(block[2]):
                    for ty in range(block[1]):
                        for tx in range(block[0]):
                            rows.append((tx, ty, tz, bx, by, bz, *block, *grid))
    return np.array(rows, np.uint32)


def expected_warp_stats(x, warps):
    import numpy as np
    v = np.zeros(32 * warps)
    v[:x.size] = x
    v = v.reshape(warps, 32)
    big = v > 0.5
    return np.stack([v.sum(1), big.sum(1), v.max(1), big.any(1), big.all(1)], axis=1).astype(np.float64)


# ---- the project's kernels ----------------------------------------------------------------------------------------
def _kappa(G, a, b, kind, gamma, coef0, degree):
    import numpy as np
    if kind in (1, 4):
        d = np.maximum(a[:, None] + b[None, :] - 2 * G, 0)
        return np.exp(-gamma * d) if kind == 1 else np.exp(-gamma * np.sqrt(d))
    if kind == 2:
        return (gamma * G + coef0) ** degree
    if kind == 3:
        return np.tanh(gamma * G + coef0)
    return G.copy()


def real_case(checks):
    """Every kernel kkmgpu instantiates, launched as kkmgpu's launchers do (256 threads), on small inputs."""
    import numpy as np
    import cudacpu
    from kkmgpu.kernels import kernel_kmeans_cuda as _gpu_kernels
    from kkmgpu.kernels import knn_cuda as _knn_gpu
    from kkmgpu.kernels import tiled_cuda as _tiled_gpu

    rng = np.random.default_rng(7)
    dense = cudacpu.Module(_gpu_kernels.cuda_source(), _gpu_kernels.name_expressions(), _gpu_kernels.NVRTC_OPTIONS)
    tiled = cudacpu.Module(_gpu_kernels.cuda_source("tiled.cu"), _tiled_gpu.name_expressions(),
                           _gpu_kernels.NVRTC_OPTIONS)
    i64, i32, f64 = np.int64, np.int32, np.float64
    gamma, coef0, degree = 0.37, 0.8, 3
    for dtype, T in ((np.float32, "float"), (np.float64, "double")):
        rtol = 2e-6 if dtype == np.float32 else 1e-12
        # kernel_epilogue: m x n block, every kind
        m, n = 5, 37
        A, B = rng.normal(size=(m, 3)), rng.normal(size=(n, 3))
        G, a, b = A @ B.T, (A * A).sum(1), (B * B).sum(1)
        for kind in (1, 2, 3, 4):
            blk = G.astype(dtype)
            dense.get_function(f"kernel_epilogue<{T}>")(
                (m,), (256,), (blk, a.astype(dtype), b.astype(dtype), i64(m), i64(n), i32(kind), f64(gamma),
                               f64(coef0), i32(degree)))
            want = _kappa(G.astype(dtype).astype(np.float64), a.astype(dtype).astype(np.float64),
                          b.astype(dtype).astype(np.float64), kind, gamma, coef0, degree)
            checks.close(f"kernel_epilogue<{T}> kind {kind}", blk, want, rtol=rtol, atol=rtol)

        # assign_labels: one empty cluster
        n, k = 70, 4
        S, diag = rng.random((n, k)) * 5, (rng.random(n) + 1).astype(dtype)
        sizes = np.array([3.0, 0.0, 5.0, 2.0])
        within = rng.random(k) * sizes ** 2
        labels = rng.integers(0, k, n).astype(np.int32)
        inv = np.where(sizes > 0, 1 / np.where(sizes > 0, sizes, 1), -1.0)
        offset = np.where(sizes > 0, within * inv * inv, 0.0)
        new, dist, stats = np.empty(n, np.int32), np.empty(n), np.zeros(1 + k, np.uint64)
        dense.get_function(f"assign_labels<{T}>")(
            (1,), (256,), (S, diag, inv, offset, labels, new, dist, stats, i64(n), i32(k)))
        d = diag.astype(np.float64)[:, None] - 2 * S * inv + offset
        d[:, sizes == 0] = np.inf
        checks.equal(f"assign_labels<{T}> labels", new, d.argmin(1))
        checks.close(f"assign_labels<{T}> distances", dist, d.min(1), rtol=1e-12, atol=1e-12)
        checks.equal(f"assign_labels<{T}> stats", stats, [(d.argmin(1) != labels).sum(),
                                                          *np.bincount(d.argmin(1), minlength=k)])

        # offgrid_step, both directions
        for divide in (0, 1):
            K0, Kp0 = rng.random((6, 9)).astype(dtype) + 0.5, rng.random((6, 9)).astype(dtype) + 0.5
            K, Kp = K0.copy(), Kp0.copy()
            dense.get_function(f"offgrid_step<{T}>")((1,), (256,), (K, Kp, i64(K.size), i32(divide)))
            r = np.sqrt(Kp0.astype(np.float64))
            checks.close(f"offgrid_step<{T}> divide={divide}", K, K0 / r if divide else K0 * r, rtol=rtol)
            checks.close(f"offgrid_step<{T}> sqrt", Kp, r, rtol=rtol)

    # segment_sums (float16 storage as its bits too): 2-D grid, one chunk of entries per cluster
    n, k = 40, 3
    X = rng.normal(size=(n, 2))
    Kf = np.exp(-((X[:, None] - X[None]) ** 2).sum(-1))
    labels = rng.integers(0, k, n).astype(np.int32)
    rows = np.argsort(labels, kind="stable").astype(np.int64)
    w = rng.random(n)
    for dtype, T in ((np.float32, "float"), (np.float64, "double"), (np.float16, "unsigned short")):
        K = Kf.astype(dtype)
        Kk = K.view(np.uint16) if dtype == np.float16 else K
        S = np.zeros((n, k))
        starts = np.searchsorted(labels[rows], np.arange(k + 1)).astype(np.int64)  # cluster c's entries
        Y = np.zeros((n, k))
        Y[np.arange(n), labels] = w
        dense.get_function(f"segment_sums<{T}>")(  # one piece per cluster: straight into S
            (1, k), (256,), (Kk, rows, w[rows], starts, S, S, i64(n), i32(k), i32(0), i32(1)))
        checks.close(f"segment_sums<{T}> one piece", S, K.astype(np.float64) @ Y, rtol=1e-12, atol=1e-12)
        pieces, S = 3, np.zeros((n, k))  # three pieces per cluster: partial sums, then segment_reduce
        partial = np.full((k * pieces, n), np.nan)
        dense.get_function(f"segment_sums<{T}>")(
            (1, k * pieces), (256,), (Kk, rows, w[rows], starts, S, partial, i64(n), i32(k), i32(0), i32(pieces)))
        dense.get_function("segment_reduce")((1,), (256,), (partial, S, i64(n), i32(k), i32(0), i32(k), i32(pieces)))
        checks.close(f"segment_sums<{T}> + segment_reduce", S, K.astype(np.float64) @ Y, rtol=1e-12, atol=1e-12)
        # moved_sums: 11 points moved, entries in (old, new) pair order; S(old labels) -> S(new labels)
        moved = rng.choice(n, 11, replace=False)
        new = labels.copy()
        new[moved] = (labels[moved] + rng.integers(1, k, 11)) % k
        order = np.lexsort((new[moved], labels[moved]))
        m_rows = moved[order].astype(np.int64)
        S = K.astype(np.float64) @ Y
        dense.get_function(f"moved_sums<{T}>")(
            (1,), (256,), (Kk, m_rows, w[m_rows], labels[m_rows], new[m_rows], S, i64(n), i32(k), i64(11)))
        Y2 = np.zeros((n, k))
        Y2[np.arange(n), new] = w
        checks.close(f"moved_sums<{T}>", S, K.astype(np.float64) @ Y2, rtol=1e-12, atol=1e-12)

    # the tiled engine: t x m tile, row0 > 0 so the unit diagonal lands inside; the sums with the columns split into
    # three pieces (finished by tile_combine), sorted and unsorted (tile_order_check: then whole rows per warp),
    # in long runs (k = 5) and short ones (k = 300), and the moved points' signed entries; two blocks
    t, m, row0, pieces = 6, 700, 2, 3
    Xc = rng.normal(size=(m, 3))
    Xr = Xc[row0:row0 + t]
    G, a, b = Xr @ Xc.T, (Xr * Xr).sum(1), (Xc * Xc).sum(1)
    points = np.arange(m, dtype=np.int64)
    for dtype, T in ((np.float32, "float"), (np.float64, "double")):
        for kind in (1, 2, 4):
            v = _kappa(G.astype(dtype).astype(np.float64), a.astype(dtype).astype(np.float64),
                       b.astype(dtype).astype(np.float64), kind, gamma, coef0, degree)
            if kind in (1, 4):
                v[np.arange(t), row0 + np.arange(t)] = 1.0
            rtol = 2e-6 if dtype == np.float32 else 1e-12
            args = (G.astype(dtype), a.astype(dtype), b.astype(dtype), i64(t), i64(m), i32(kind), f64(gamma),
                    f64(coef0), i32(degree))
            Gt = G.astype(dtype)
            tiled.get_function(f"tile_epilogue<{T}>")((t,), (256,), (Gt, *args[1:], points, i64(row0)))
            checks.close(f"tile_epilogue<{T}> kind {kind}", Gt, v, rtol=rtol, atol=rtol)
            if kind in (1, 4):
                checks.equal(f"tile_epilogue<{T}> kind {kind} diagonal", Gt[np.arange(t), row0 + np.arange(t)],
                             np.ones(t, dtype))
            vt = Gt.astype(np.float64)  # the values the kernels compute (the same device function)
            for k in (5, 300):
                w = rng.random(m)
                for order in ("sorted", "unsorted"):
                    clusters = rng.integers(0, k, m).astype(np.int32)
                    if order == "sorted":
                        clusters.sort()
                    flag = np.zeros(1, np.int32)
                    tiled.get_function("tile_order_check")((2,), (256,), (clusters, i64(m), flag))
                    checks.equal(f"tile_order_check {order}", flag, [int(order == "unsorted")])
                    S, partial = np.zeros((t, k)), np.full(2 * t * pieces, np.nan)
                    tiled.get_function(f"tile_cluster_sums<{T}>")(
                        (2,), (256,), (*args, clusters, w, points, i64(row0), S, i32(k), partial, i32(pieces), flag))
                    tiled.get_function("tile_combine")(
                        (1,), (256,), (clusters, partial, i64(t), i64(m), i32(pieces), flag, S, i32(k)))
                    Y = np.zeros((m, k))
                    Y[np.arange(m), clusters] = w
                    checks.close(f"tile_cluster_sums<{T}> kind {kind} k {k} {order}", S, vt @ Y, rtol=1e-12,
                                 atol=1e-12)
                new, old = rng.integers(0, k, m).astype(np.int32), rng.integers(0, k, m).astype(np.int32)
                keys = np.concatenate([new, old])
                entries = np.argsort(keys, kind="stable")
                S, partial = np.zeros((t, k)), np.full(2 * t * pieces, np.nan)
                tiled.get_function(f"tile_moved_sums<{T}>")(
                    (2,), (256,), (Gt, i64(t), i64(m), keys[entries], np.concatenate([w, -w])[entries],
                                   entries % m, i64(2 * m), S, i32(k), partial, i32(pieces)))
                tiled.get_function("tile_combine")(
                    (1,), (256,), (keys[entries], partial, i64(t), i64(2 * m), i32(pieces), np.zeros(1, np.int32),
                                   S, i32(k)))
                D = np.zeros((m, k))
                D[np.arange(m), new] += w
                D[np.arange(m), old] -= w
                checks.close(f"tile_moved_sums<{T}> kind {kind} k {k}", S, vt @ D, rtol=1e-12, atol=1e-12)

    # knn_offer_block: a block holding its own rows (each point skipped), 5 warps of 8 per thread block, half the
    # rows' lists already holding candidates, one column (only lane 0 of a warp takes any); each row keeps the k
    # least (key, index), keys col_sq - 2 G in double
    knn = cudacpu.Module(_gpu_kernels.cuda_source("knn.cu"), _knn_gpu.name_expressions(), _gpu_kernels.NVRTC_OPTIONS)
    b, row0, col0 = 37, 3, 0
    n = row0 + b + 2
    for dtype, T in ((np.float32, "float"), (np.float64, "double")):
        for k, m in ((1, 45), (5, 45), (1, 1)):
            G, col_sq = rng.normal(size=(b, m)).astype(dtype), rng.random(m) * 4
            best, arg = np.full((n, k), np.inf), np.full((n, k), -1, np.int64)
            best[::2, 0], arg[::2, 0] = -1.5, 1000 + np.arange(0, n, 2)
            want_best, want_arg = best.copy(), arg.copy()
            keys = col_sq[None, :] - 2.0 * G.astype(np.float64)
            for r in range(b):
                i = row0 + r
                cand = np.flatnonzero(col0 + np.arange(m) != i)
                key, index = np.r_[best[i], keys[r, cand]], np.r_[arg[i], col0 + cand]
                order = np.lexsort((index, key))[:k]
                want_best[i], want_arg[i] = key[order], index[order]
            knn.get_function(f"knn_offer_block<{T}>")(
                ((b + 7) // 8,), (256,), (G, col_sq, i64(b), i64(m), i64(row0), i64(col0), i32(k), best, arg))
            checks.equal(f"knn_offer_block<{T}> k={k} m={m} indices", arg, want_arg)
            checks.equal(f"knn_offer_block<{T}> k={k} m={m} keys", best, want_best)

    # knn_pair_distances: one warp per pair (3 warps of 8 per block, so blocks stride), d below and above 32
    for dtype, T in ((np.float32, "float"), (np.float64, "double")):
        for d in (3, 70):
            Q, A = rng.normal(size=(9, d)).astype(dtype), rng.normal(size=(11, d)).astype(dtype)
            rows, cols = rng.integers(0, 9, 29).astype(np.int64), rng.integers(0, 11, 29).astype(np.int64)
            out = np.zeros(29)
            knn.get_function(f"knn_pair_distances<{T}>")(
                (3,), (256,), (Q, A, rows, cols, i64(29), i64(d), f64(0.5), out))
            want = (((Q[rows].astype(np.float64) - A[cols].astype(np.float64)) * 0.5) ** 2).sum(1)
            checks.close(f"knn_pair_distances<{T}> d={d}", out, want, rtol=1e-13, atol=0)

    # csr_chunk_sums + csr_chunk_combine: rows of 0, 1, 64, 65 and 200 entries (chunks of 64), 1 and 3 columns
    from kkmgpu.kernels import sparse_cuda as _sparse_gpu
    sparse = cudacpu.Module(_gpu_kernels.cuda_source("sparse.cu"), _sparse_gpu.name_expressions(),
                            _gpu_kernels.NVRTC_OPTIONS)
    lengths = np.array([0, 1, 64, 65, 200, 0])
    indptr = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    nnz, n_rows, n_cols = int(indptr[-1]), lengths.size, 300
    indices = rng.integers(0, n_cols, nnz).astype(np.int32)
    chunk_ptr = np.r_[0, np.cumsum((lengths + 63) // 64)].astype(np.int64)
    max_chunks = nnz // 64 + n_rows
    chunk_row = (np.searchsorted(chunk_ptr, np.arange(max_chunks), side="right") - 1).astype(np.int64)
    for dtype, T in ((np.float32, "float"), (np.float64, "double")):
        data = rng.normal(size=nnz).astype(dtype)
        for cols in (1, 3):
            X = rng.normal(size=(n_cols, cols))
            partial, out = np.zeros((max_chunks, cols)), np.zeros((n_rows, cols))
            sparse.get_function(f"csr_chunk_sums<{T}>")(
                (2,), (256,), (indptr, indices, data, X, chunk_ptr, chunk_row, i64(n_rows), i64(cols),
                               i64(max_chunks), partial))
            sparse.get_function("csr_chunk_combine")((1,), (256,), (partial, chunk_ptr, i64(n_rows), i64(cols), out))
            want = np.stack([np.add.reduceat(np.r_[data.astype(np.float64) * X[indices, j], 0.0],
                                             indptr[:-1])[:n_rows] * (lengths > 0) for j in range(cols)], axis=1)
            checks.close(f"csr_chunk_sums<{T}> cols={cols}", out, want, rtol=1e-12, atol=1e-12)


# ---- planted bugs ------------------------------------------------------------------------------------------------
def racy_counts_inputs(rng, n, k):
    """(S, diag, inv_size, offset, labels) for assign_labels on n points and k nonempty clusters."""
    import numpy as np
    sizes = rng.uniform(20, 25, k)  # similar sizes and small offsets: every cluster takes about n / k points
    return (rng.random((n, k)) * 5, rng.random(n) + 1, 1 / sizes, 0.01 * rng.random(k),
            rng.integers(0, k, n).astype(np.int32))


def planted_case(name):
    import numpy as np
    rng = np.random.default_rng(5)
    if name == "oob":
        x = rng.random(64).astype(np.float32)
        y = np.zeros_like(x)
        module("oob_read.cu").get_function("shift_left")((1,), (64,), (x, y, np.int32(64)))
    elif name == "shared_overrun":
        k, n = 6, 50
        out = np.zeros(k)
        module("shared_overrun.cu").get_function("bucket_sums")(
            (1,), (32,), (rng.integers(0, k, n).astype(np.int32), rng.random(n), np.int32(n), np.int32(k), out),
            shared_mem=8 * k)
    elif name == "missing_barrier":
        x = rng.random(64)
        y = np.zeros_like(x)
        module("missing_barrier.cu").get_function("rotate_double")((2,), (32,), (x, y), shared_mem=32 * 8)
        print("result", " ".join(f"{v:.6f}" for v in y[:8]))
    elif name == "racy":
        x = rng.random(200)
        total = np.zeros(1)
        module("racy_accumulate.cu").get_function("racy_total")((4,), (64,), (x, total, np.int64(x.size)))
        print("total", total[0], "expected", x.sum())
    elif name == "racy_counts":
        n, k, stats = 1000, 3, np.zeros(4, np.uint64)
        S, diag, inv, offset, labels = racy_counts_inputs(rng, n, k)
        module("racy_counts.cu", ("assign_labels<double>",)).get_function("assign_labels<double>")(
            (4,), (64,), (S, diag, inv, offset, labels, np.empty(n, np.int32), np.empty(n), stats, np.int64(n),
                          np.int32(k)))
        print("counts", stats[1:], "expected", n)
    elif name == "overflow":
        n = 1000
        x = rng.random(n).astype(np.float32)
        module("undefined_behaviour.cu").get_function("strided_gather")(
            (4,), (256,), (x, np.zeros_like(x), np.int32(3_000_000), np.int32(n)))
    elif name == "misaligned":
        x = rng.random(33)
        module("undefined_behaviour.cu").get_function("misaligned_read")((1,), (32,), (x, np.zeros(32)))
    elif name == "divergent":
        x = rng.random(64).astype(np.float32)
        module("divergent_barrier.cu").get_function("half_barrier")(
            (2,), (32,), (x, np.zeros_like(x), np.int32(64)), shared_mem=32 * 4)
    else:
        raise SystemExit(f"unknown case {name!r}")
    print("NOT CAUGHT")
    return 3


def main(argv):
    if len(argv) != 1:
        print(__doc__)
        return 2
    _setup()
    case = argv[0]
    if case in ("reference", "real"):
        checks = Checks()
        (reference_case if case == "reference" else real_case)(checks)
        return checks.finish()
    return planted_case(case)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
