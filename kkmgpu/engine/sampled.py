"""CATS: Centroid Approximation Through Sampling (papers/cats-centroid-approximation.txt).

Each iteration samples l points S_c of every cluster and replaces the exact feature-space centroid by
the best combination of the sampled points, m~_c = sum_{s in S_c} alpha_s phi(x_s), with (Eq. 2)

    alpha_c = M_c^+ L_c w_c / n_c,   M_c = K(S_c, S_c) (l x l),  L_c = K(S_c, C) (l x n_c),

then assigns every point to argmin_c K_ii - 2 sum_s alpha_s K(i, s) + alpha_c^T M_c alpha_c. A cluster
holds min(l, n_c) samples and the stack of the M_c is L x L with L = min(l, the largest cluster of the
iteration), so an l beyond the cluster sizes costs nothing. A cluster whose every member is sampled gets
alpha = w / n_c, its exact centroid (what Eq. 2 gives in exact arithmetic), without the pseudoinverse. Only the
n x (k L) block between all points and the samples is evaluated (in row tiles): memory O(n k L) at most
(less when the block is recomputed instead of cached), time O(n k L d) per iteration; the n x n kernel
matrix is never formed. The run stops when the variance of the last ``window`` approximate
distortions, relative to their squared mean, is <= ``theta`` (the paper's rule), when no point moves,
or at ``max_iter``. With every cluster sampled in full (l >= the largest cluster of every iteration) and
``theta=0``, the iterations are exact kernel k-means's: from the same initial labels the labels of
method="exact" with ``tol=0``, up to rounding at exact ties.

An iteration does no n-long work on the host: labels stay on the device, the samples are drawn there
(:func:`kkmgpu.engine.sampling.sample_members`, one seed per iteration from the run's generator), and one
transfer per iteration brings back the k-long sizes and counts, the moved count and the distortion.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from kkmgpu import _warn
from kkmgpu.kernels import blocks as _kernels
from kkmgpu.backend.device import MEMORY_HEADROOM, InsufficientMemoryError, _format_bytes, work_bytes
from kkmgpu.engine.lloyd import ConvergenceWarning, initial_labels, refill_empty_clusters
from kkmgpu.engine.sampling import sample_members
from kkmgpu.engine.source import KernelSource  # noqa: F401  (kkmgpu.engine.sampled.KernelSource, as before)

#: The n x (k L) block is kept between the two passes of an iteration when it takes at most this fraction of the
#: device's free memory left beside the iteration's own arrays (within MEMORY_HEADROOM); otherwise it is recomputed.
CACHE_FRACTION = 0.5
#: The cap on the cached block when the free memory cannot be read.
CACHE_UNKNOWN_MEMORY_BYTES = 4 * 2**30


def default_samples_per_cluster(n: int, k: int) -> int:
    """The paper's experimental choice l = ceil(sqrt(n / k))."""
    return max(1, math.ceil(math.sqrt(n / k)))


class _SourceRows:
    """Kernel rows on demand, for k-means++ seeding without the n x n matrix."""

    def __init__(self, source: KernelSource, weights, diag):
        self.source, self.weights, self.diag, self.backend = source, weights, diag, source.backend
        self.n = source.n

    def rows(self, index):
        return self.backend.to_host(self.device_rows(self.backend.asarray(np.asarray(index, dtype=np.int64))))

    def device_rows(self, idx):
        """Kernel rows K[idx, :] (float64, on the device) for device indices ``idx``."""
        source = self.source
        if source.precomputed:
            block = source.A[idx]
        elif source.spec.name == "callable":
            block = _kernels.kernel_block(source.A[idx], source.A, source.spec, self.backend)
        else:  # a few rows: a memory-bound product, "fp32" by its shape; the norms computed once
            sq = source.row_norms()
            block = _kernels.kernel_block(source.A[idx], source.A, source.spec, self.backend, a_sq=sq[idx], b_sq=sq)
        return block.astype(self.backend.xp.float64)


def variance_stop(history, window, theta):
    """The paper's stopping rule: the reason to stop when the variance of the last ``window`` approximate
    distortions is at most ``theta`` times their squared mean (scale-free), else None."""
    if len(history) < window:
        return None
    last = np.asarray(history[-window:])
    if last.var() <= theta * last.mean() ** 2:
        return f"variance of the last {window} distortions <= theta"
    return None


@dataclass
class CatsState:
    """The approximate centroids of a CATS partition: what prediction needs."""

    index: np.ndarray      # (k, l) training indices of the sampled points (padding repeats a member)
    alpha: object          # (k, l) float64 on the device, 0 on padding
    offsets: np.ndarray    # alpha_c^T M_c alpha_c, (k,) float64
    nonempty: np.ndarray   # (k,) bool


def _project(B, alpha, xp):
    """T[i, c] = sum_s B[i, c*l + s] alpha[c, s] for a block B (t, k*l)."""
    t = B.shape[0]
    k, l = alpha.shape
    return xp.einsum("tkl,kl->tk", B.reshape(t, k, l).astype(xp.float64), alpha)


def sample_width(counts, l):
    """L = min(l, the most positive-weight members of a cluster), at least 1: the width of this iteration's
    sample stack, sized by the clusters and not by l (``counts``: host, the positive-weight members per cluster)."""
    return max(1, min(int(l), int(np.max(counts, initial=0))))


def _sample(labels, positive, counts, l, seed, backend):
    """Indices (k, L) on the device of min(l, n_c) uniformly sampled positive-weight members of every cluster, and
    their host mask (L from :func:`sample_width`; the rows of smaller clusters are padded by repeating a member):
    :func:`kkmgpu.engine.sampling.sample_members`."""
    return sample_members(labels, positive, counts, sample_width(counts, l), seed, backend)


def full_clusters(weights, index, mask, counts, sizes_h, backend):
    """Which clusters are sampled in full (every positive-weight member; host bool), and alpha (k, L) = w_s / n_c
    on them (on the device).

    For such a cluster S_c = C, and alpha = w / n_c is a minimiser of Eq. 1 (the exact centroid); the paper's
    M^+ L w / n is the same point of feature space in exact arithmetic, but its eigenvalue cutoff (rcond)
    would perturb it: the exact centroid keeps CATS equal to exact kernel k-means where it samples everything.
    """
    full = mask.sum(axis=1) == counts
    per_size = 1.0 / np.where(sizes_h > 0, sizes_h, 1.0)
    return full, weights[index] * backend.asarray(np.where(mask & full[:, None], per_size[:, None], 0.0))


def _counts(labels, weights, positive, k, backend, dist=None, previous=None):
    """The iteration's one transfer: weighted sizes and positive-weight members of every cluster of ``labels``
    (host float64 and int64, (k,)), and with ``dist`` and ``previous`` labels the points moved and the distortion
    sum_i w_i dist_i."""
    xp, ops = backend.xp, backend.ops
    parts = [ops.cluster_totals(labels, weights, weights, k, sync=False)[0],
             ops.cluster_totals(labels, positive, positive, k, sync=False)[0]]
    if dist is not None:
        parts += [xp.asarray(xp.count_nonzero(labels != previous)).astype(xp.float64).reshape(1),
                  xp.asarray((weights * dist).sum()).reshape(1)]
    flat = np.asarray(backend.to_host(xp.concatenate(parts)), dtype=np.float64)
    sizes, counts = flat[:k], flat[k:2 * k].astype(np.int64)
    return (sizes, counts) if dist is None else (sizes, counts, int(flat[2 * k]), float(flat[2 * k + 1]))


#: M_c for all clusters come from one (k l) x (k l) kernel block when it takes at most this many bytes
#: (one GEMM and one epilogue instead of k small ones, whose fixed cost dominates on the CPU).
ONE_SQUARE_MAX_BYTES = 256 * 2**20


def _sample_squares(source, samples, backend, k, l, columns=None):
    """M (k, l, l) float64: M[c] = K(S_c, S_c) (``columns``: the samples as prepared for the blocks, if they are)."""
    xp = backend.xp
    # the one square and its float64 copy are temporaries: within WORK_FRACTION of the free memory too
    if (k * l) ** 2 * 8 <= ONE_SQUARE_MAX_BYTES and (k * l) ** 2 * (8 + source.itemsize) <= work_bytes(2**62, backend):
        Q = source.square(samples, columns).astype(xp.float64).reshape(k, l, k, l)
        c = xp.arange(k)
        return Q[c, :, c, :]  # the k diagonal blocks
    parts = [slice(c * l, (c + 1) * l) for c in range(k)]
    return xp.stack([source.square(samples[s], None if columns is None else columns.part(s))
                     for s in parts]).astype(xp.float64)


#: cuSOLVER's batched Jacobi eigensolver (syevjBatched, what cupy.linalg.eigh runs on a stack of matrices) is
#: documented for matrices up to 32 x 32; larger M_c are decomposed one by one (syevd) on a GPU.
GPU_BATCHED_EIGH_MAX = 32

#: How M_c^+ (L_c w_c / n_c) is solved on a GPU when M_c is larger than GPU_BATCHED_EIGH_MAX: "eigh" (the
#: pseudoinverse, one syevd per cluster), "regularized" (one batched solve for all clusters, see
#: :func:`_regularized_solve`) or "auto": the regularized solve from L = GPU_REGULARIZED_MIN on, where it was
#: measured faster (bench/bench_cats.py::test_coefficient_solve on an H100, 2026-11-24, k = 10: 13.5 ms against
#: 17.5 ms at L = 128, 40.8 against 116.9 at L = 1024; at L = 48 it took 14.0 ms against 7.3), the per-cluster
#: eigendecomposition below. The CPU and small M_c always take the batched eigendecomposition.
GPU_LARGE_M_SOLVER = "auto"
GPU_REGULARIZED_MIN = 128

#: Power-iteration steps that estimate the largest |eigenvalue| of every M_c for the regularized solve.
POWER_STEPS = 30


def _batched_eigh(M, backend):
    """Eigenvalues (k, l) and eigenvectors (k, l, l) of the symmetric stack M (k, l, l)."""
    xp = backend.xp
    if not backend.is_gpu or M.shape[-1] <= GPU_BATCHED_EIGH_MAX:
        return xp.linalg.eigh(M)
    pairs = [xp.linalg.eigh(M[c]) for c in range(M.shape[0])]
    return xp.stack([w for w, _ in pairs]), xp.stack([V for _, V in pairs])


def _pinv_solve(M, rhs, rcond, backend):
    """x_c = M_c^+ rhs_c for the symmetric stack M (m, l, l) and rhs (m, l): eigenvalues |lambda| <= rcond times
    the largest |lambda| of M_c are treated as zero (batched eigendecomposition)."""
    xp = backend.xp
    lam, V = _batched_eigh(M, backend)
    cutoff = rcond * xp.max(xp.abs(lam), axis=1, keepdims=True)
    inv = xp.where(xp.abs(lam) > cutoff, 1.0 / xp.where(lam == 0, 1.0, lam), 0.0)
    return xp.einsum("kls,ks->kl", V, inv * xp.einsum("kls,kl->ks", V, rhs))


def _spectral_radius(M, xp, steps=POWER_STEPS):
    """max |eigenvalue| of every symmetric M_c (m, l, l), estimated by power iteration (from below)."""
    m, l = M.shape[0], M.shape[1]
    v = xp.ones((m, l), dtype=xp.float64) + xp.arange(l, dtype=xp.float64)[None, :] / (7.0 * l)
    radius = xp.zeros((m, 1), dtype=xp.float64)
    for _ in range(steps):
        v = xp.einsum("kls,ks->kl", M, v)
        radius = xp.sqrt((v * v).sum(axis=1, keepdims=True))
        v = v / xp.where(radius > 0, radius, 1.0)
    return radius


def _regularized_solve(M, rhs, rcond, backend):
    """x_c = (M_c^2 + eps_c^2 I)^-1 M_c rhs_c, eps_c = max(rcond, sqrt(l u)) times the largest |eigenvalue| of M_c
    (u the float64 rounding unit): one solve call for all clusters, no eigendecomposition (CuPy's
    linalg.solve runs cuBLAS's batched LU, getrfBatched / getrsBatched, for l <= 256 and one cuSOLVER gesv per
    matrix above: an LU, not an eigendecomposition).

    In the eigenbasis of M_c this multiplies a component by lambda / (lambda^2 + eps^2) instead of the
    pseudoinverse's 1 / lambda (|lambda| > rcond max|lambda|) or 0: the same cutoff, made soft (a factor 1/2 at
    |lambda| = eps, within 1% of 1 / lambda above 10 eps), for either sign of lambda (non-PSD kernels).
    M_c^2 + eps_c^2 I is positive definite; its condition number is about 1 / rcond^2, hence the floor sqrt(l u)
    (the rounding of M_c^2) on rcond.
    """
    xp = backend.xp
    m, l = M.shape[0], M.shape[1]
    eps = max(float(rcond), math.sqrt(l * np.finfo(np.float64).eps)) * _spectral_radius(M, xp)
    eps = xp.where(eps > 0, eps, 1.0)  # M_c = 0 (an empty cluster): x = 0 whatever eps
    A = M @ M
    j = xp.arange(l)
    A[:, j, j] += eps ** 2
    b = xp.einsum("kls,ks->kl", M, rhs)
    return xp.linalg.solve(A, b[:, :, None])[:, :, 0]


def solve_route(l, backend):
    """How the coefficients of an iteration with L = ``l`` samples per cluster are solved on ``backend``:
    "batched eigh", "eigh per cluster" or "regularized" (see GPU_LARGE_M_SOLVER)."""
    if not backend.is_gpu or l <= GPU_BATCHED_EIGH_MAX:
        return "batched eigh"
    route = GPU_LARGE_M_SOLVER
    if route == "auto":
        route = "regularized" if l >= GPU_REGULARIZED_MIN else "eigh"
    return "regularized" if route == "regularized" else "eigh per cluster"


def _solve_coefficients(M, rhs, rcond, backend):
    """M_c^+ rhs_c, by the route this backend and size take (:func:`solve_route`)."""
    if solve_route(M.shape[-1], backend) == "regularized":
        return _regularized_solve(M, rhs, rcond, backend)
    return _pinv_solve(M, rhs, rcond, backend)


def _centroid_coefficients(source, samples, backend, mask_d, Lw, sizes_h, rcond, diag_s, full=None,
                           alpha_full=None, columns=None):
    """alpha_c = M_c^+ (L_c w_c) / n_c for the clusters sampled in part (all at once), ``alpha_full`` (from
    :func:`full_clusters`) for those sampled in full; and the offsets alpha_c^T M_c alpha_c (both on the device).
    ``columns``: the samples as the blocks' prepared operand (:meth:`KernelSource.columns`), if they are."""
    xp = backend.xp
    k, l = mask_d.shape
    M = _sample_squares(source, samples, backend, k, l, columns)
    M = (M + M.transpose(0, 2, 1)) / 2
    j = xp.arange(l)
    M[:, j, j] = diag_s.reshape(k, l)  # k(s, s) exactly (the GEMM form leaves rounding there)
    M *= mask_d[:, :, None] * mask_d[:, None, :]
    if full is None:
        full = np.zeros(k, dtype=bool)
    alpha = xp.zeros((k, l), dtype=xp.float64) if alpha_full is None else backend.asarray(alpha_full)
    partial = np.flatnonzero(~full)
    if partial.size:
        sizes = backend.asarray(np.where(sizes_h > 0, sizes_h, 1.0)[partial])
        rhs = Lw[partial] / sizes[:, None]
        Mp = M if partial.size == k else M[partial]
        alpha[partial] = _solve_coefficients(Mp, rhs, rcond, backend) * mask_d[partial]
    return alpha, xp.einsum("kl,klm,km->k", alpha, M, alpha)  # the offsets stay on the device


def iteration_need(n, k, width, itemsize, backend):
    """(rows per tile, bytes one iteration with L = ``width`` samples per cluster holds however small its tiles)."""
    # a tile of the n x (k L) block has a float64 copy in _project: both within WORK_FRACTION of the free memory
    step = min(_kernels.tile_rows(k * width, itemsize),
               _kernels.tile_rows(k * width, itemsize + 8, 2**62, backend=backend))
    # T (n x k) and, for alpha, M, its symmetrised copy and the eigenvectors (k x L x L, about six such at once),
    # float64, with one tile
    return step, 8 * (n * k + 6 * k * width * width) + step * k * width * (itemsize + 8)


def iteration_plan(n, k, width, itemsize, backend, l):
    """Rows per tile and whether the n x (k L) block is kept between the passes, for one iteration with L =
    ``width`` samples per cluster; raises :class:`InsufficientMemoryError` before anything is allocated when the
    iteration's arrays do not fit the device. The block is kept when it takes at most CACHE_FRACTION of the free
    memory the iteration's own arrays leave within MEMORY_HEADROOM (CACHE_UNKNOWN_MEMORY_BYTES when the free
    memory cannot be read)."""
    block_bytes = n * k * width * itemsize
    available = backend.available_bytes()
    step, need = iteration_need(n, k, width, itemsize, backend)
    if available is not None and need > int(available * MEMORY_HEADROOM):
        raise InsufficientMemoryError(
            f"the CATS iteration's arrays (n={n}, k={k}, {width} samples per cluster: the smaller of "
            f"n_samples_per_cluster={l} and the largest cluster) need {_format_bytes(need)} ({need} bytes) but "
            f"device {backend.name} has {_format_bytes(available)} ({available} bytes) available; an allocation "
            f"may use at most {MEMORY_HEADROOM:.0%} of the free memory. Use a smaller n_samples_per_cluster (the "
            f"default is ceil(sqrt(n / k)) = {default_samples_per_cluster(n, k)}) or another device.")
    if available is None:
        return step, block_bytes <= CACHE_UNKNOWN_MEMORY_BYTES
    return step, block_bytes <= CACHE_FRACTION * (int(available * MEMORY_HEADROOM) - need)


@dataclass
class CatsRun:
    labels: object
    objective: float          # final approximate distortion
    history: list             # approximate distortion per iteration
    n_iter: int
    converged: bool
    stop_reason: str
    sizes: np.ndarray
    state: CatsState
    seconds: float


class DevicePasses:
    """CATS's two passes over all n rows on one device: the n x (k L) block against the samples in row tiles
    (kept between the passes when it fits), the coefficients on the same device.

    The loop (:func:`iterate`) asks: ``begin(labels, k, width, l)``, ``centroids(index, mask, sizes_h, rcond,
    full, alpha_full)`` -> (alpha, offsets) with pass 1 inside, ``assign(alpha, offsets, nonempty)`` -> (new
    labels, distances), and ``distortion(dist)``; labels, index, alpha_full, alpha, offsets and distances are
    arrays on ``backend`` (no transfer), mask, sizes_h, full and nonempty host arrays of k rows.
    :mod:`kkmgpu.dask` has the same over the workers' row blocks."""

    log_name = "kkmgpu"

    def __init__(self, source: KernelSource, weights_h, diag):
        self.source, self.backend, self.diag = source, source.backend, diag
        self.weights = self.backend.asarray(weights_h)
        self.n = source.n

    def begin(self, labels, k, width, l):
        self.labels = self.backend.asarray(labels)
        self.k, self.width = k, width
        # every row is read once or twice per iteration: its 3xTF32 split is prepared once per fit where it fits
        # beside the iteration's own arrays (KernelSource.prepare_rows; else the roofline's choice, block_mode)
        self.source.prepare_rows(k * width, iteration_need(self.n, k, width, self.source.itemsize, self.backend)[1])
        self.step, self.cache = iteration_plan(self.n, k, width, self.source.itemsize, self.backend, l)

    def centroids(self, index, mask, sizes_h, rcond, full, alpha_full):
        # pass 1: L_c w_c = sum_{i in c} w_i K(S_c, x_i), from row tiles of the n x (k L) block (only the clusters
        # sampled in part need it)
        backend, xp, k, width = self.backend, self.backend.xp, self.k, self.width
        index_d = backend.asarray(index.ravel())
        self.samples = self.source.take(index_d)
        self.columns = self.source.columns(self.samples, index_d)  # prepared once for both passes and M
        sampled_in_part = not full.all()
        self.cache = self.cache and sampled_in_part
        Lw = xp.zeros((k, width), dtype=xp.float64)
        self.blocks = []
        for i0 in range(0, self.n if sampled_in_part else 0, self.step):
            i1 = min(self.n, i0 + self.step)
            B = self.source.block(i0, i1, self.samples, self.columns)
            lab = self.labels[i0:i1]
            own = B.reshape(i1 - i0, k, width)[xp.arange(i1 - i0), lab].astype(xp.float64)  # (t, L)
            Y = xp.zeros((i1 - i0, k), dtype=xp.float64)
            Y[xp.arange(i1 - i0), lab] = self.weights[i0:i1]
            Lw += Y.T @ own
            if self.cache:
                self.blocks.append(B)
        return _centroid_coefficients(self.source, self.samples, backend, backend.asarray(mask.astype(np.float64)),
                                      Lw, sizes_h, rcond, self.diag[index_d], full=full, alpha_full=alpha_full,
                                      columns=self.columns)

    def assign(self, alpha, offsets, nonempty):
        # pass 2: every point to the nearest approximate centroid
        backend, xp = self.backend, self.backend.xp
        T = xp.empty((self.n, self.k), dtype=xp.float64)
        for b, i0 in enumerate(range(0, self.n, self.step)):
            i1 = min(self.n, i0 + self.step)
            B = self.blocks[b] if self.cache else self.source.block(i0, i1, self.samples, self.columns)
            T[i0:i1] = _project(B, alpha, xp)
        self.blocks = []
        new_labels, min_dist, _ = backend.ops.assign_labels(T, self.diag, nonempty.astype(np.float64), offsets,
                                                             self.labels, sync=False)
        return new_labels, min_dist

    def distortion(self, dist):
        return float((self.weights * self.backend.asarray(dist)).sum())


def iterate(passes, weights_h, k, init_labels, *, l, max_iter, window, theta, rcond, rng, verbose=False,
            restart=None, callback=None) -> CatsRun:
    """CATS iterations from ``init_labels`` over ``passes`` (:class:`DevicePasses`, or the Dask workers' blocks):
    sampling, the fully sampled clusters' exact centroids, the empty-cluster refill and the stopping rules are
    here, once; the passes over the rows are the ``passes``' own. See the module docstring."""
    backend = passes.backend
    xp = backend.xp
    t0 = backend.timer()
    weights = backend.asarray(weights_h)
    positive = weights > 0
    weight_positive = positive.astype(xp.float64)
    labels = backend.asarray(init_labels, dtype=np.int32)
    sizes_h, counts = _counts(labels, weights, weight_positive, k, backend)
    history = []
    converged, stop_reason = False, "max_iter"
    name = getattr(passes, "log_name", "kkmgpu")
    prefix = f"[{name}] cats init {restart}: " if restart is not None else f"[{name}] cats "
    state = None
    n_iter = 0
    for n_iter in range(1, max_iter + 1):
        width = sample_width(counts, l)
        passes.begin(labels, k, width, l)
        index, mask = _sample(labels, positive, counts, l, int(rng.integers(2**63, dtype=np.uint64)), backend)
        full, alpha_full = full_clusters(weights, index, mask, counts, sizes_h, backend)
        alpha, offsets = passes.centroids(index, mask, sizes_h, rcond, full, alpha_full)
        nonempty = sizes_h > 0
        new, dist = passes.assign(alpha, offsets, nonempty)
        new = backend.asarray(new)
        new_sizes, new_counts, n_changed, distortion = _counts(new, weights, weight_positive, k, backend, dist,
                                                               labels)
        if new_counts.min() == 0:  # a cluster lost its last positive-weight member: refilled on the host (rare)
            new_h = backend.to_host(new).astype(np.int32)
            dist = np.array(backend.to_host(dist), dtype=np.float64)
            refill_empty_clusters(new_h, dist, weights_h, k)
            new = backend.asarray(new_h)
            new_sizes, new_counts = _counts(new, weights, weight_positive, k, backend)
            n_changed = int(backend.to_host(xp.count_nonzero(new != labels)))
            distortion = passes.distortion(dist)
        history.append(distortion)
        state = (index, alpha, offsets, nonempty)
        labels, sizes_h, counts = new, new_sizes, new_counts
        if verbose:
            print(f"{prefix}iteration {n_iter}: approximate distortion {distortion:.10g}, {n_changed} points moved")
        if callback is not None:
            callback(dict(restart=restart, iteration=n_iter, max_iter=max_iter, distortion=distortion,
                          moved=int(n_changed), samples_per_cluster=width))
        if n_changed == 0:
            converged, stop_reason = True, "no point moved"
            break
        stop = variance_stop(history, window, theta)
        if stop:
            converged, stop_reason = True, stop
            break
    if verbose:
        print(f"{prefix}stopped after {n_iter} iterations: {stop_reason}")
    if state is not None:
        index, alpha, offsets, nonempty = state
        state = CatsState(index=np.asarray(backend.to_host(index), dtype=np.int64), alpha=alpha,
                          offsets=np.asarray(backend.to_host(offsets), dtype=np.float64), nonempty=nonempty)
    return CatsRun(labels=labels, objective=history[-1], history=history, n_iter=n_iter,
                   converged=converged, stop_reason=stop_reason, sizes=sizes_h, state=state,
                   seconds=backend.timer() - t0)


def cats(source: KernelSource, weights_h, k, init_labels, *, l, max_iter, window, theta, rcond,
         rng, verbose=False, restart=None, diag=None, callback=None):
    """CATS iterations from ``init_labels`` on one device; see the module docstring.

    ``callback``, if given, is called after every iteration with a dict: restart (None for a single run),
    iteration, max_iter, distortion (the approximate distortion), moved (points that changed cluster) and
    samples_per_cluster (this iteration's L); a hook for progress reports.
    """
    passes = DevicePasses(source, weights_h, source.diagonal() if diag is None else diag)
    return iterate(passes, weights_h, k, init_labels, l=l, max_iter=max_iter, window=window, theta=theta,
                   rcond=rcond, rng=rng, verbose=verbose, restart=restart, callback=callback)


def restarts(make_labels, run, n_init, max_iter):
    """CATS from ``n_init`` initialisations (``make_labels()`` draws one, ``run(labels0, restart)`` iterates):
    the lowest final approximate distortion wins. Returns (best, runs, seconds spent initialising); the
    warning points at the caller's line (:func:`kkmgpu._warn.warn`)."""
    best, runs, init_seconds = None, [], 0.0
    for r in range(n_init):
        t0 = time.perf_counter()
        labels0 = make_labels()
        init_seconds += time.perf_counter() - t0
        result = run(labels0, r if n_init > 1 else None)
        runs.append(result)
        if best is None or result.objective < best.objective:
            best = result
    if not best.converged:
        _warn.warn(f"CATS did not meet its stopping rule in max_iter={max_iter} iterations; increase "
                   "max_iter or theta.", ConvergenceWarning)
    return best, runs, init_seconds


def exact_objective(source: KernelSource, labels_h, weights_h, k, diag=None, tile=2048):
    """sum_i w_i ||phi(x_i) - m_{label_i}||^2 with exact centroids, in tiles (O(sum_c n_c^2 d) time); each cluster's
    members prepared once as the columns of its tiles (:meth:`KernelSource.columns`)."""
    backend = source.backend
    xp = backend.xp
    if diag is None:
        diag = source.diagonal()
    total = float((backend.asarray(weights_h) * diag).sum())
    for c in range(k):
        members = np.flatnonzero(labels_h == c)
        w = weights_h[members]
        if members.size == 0 or w.sum() <= 0:
            continue
        idx = backend.asarray(members.astype(np.int64))
        wd = backend.asarray(w)
        within = 0.0
        # a tile holds the block in the source's dtype and its float64 copy: sized within the free memory
        rows_per_tile = min(tile, _kernels.tile_rows(members.size, source.A.dtype.itemsize + 8, backend=backend))
        samples = source.take(idx)
        columns = source.columns(samples, idx)
        for i0 in range(0, members.size, rows_per_tile):
            block = source.rows_block(idx[i0:i0 + rows_per_tile], samples, columns)
            within += float(wd[i0:i0 + rows_per_tile] @ (block.astype(xp.float64) @ wd))
        total -= within / w.sum()
    return total


def run_restarts(source: KernelSource, weights_h, k, *, init, n_init, max_iter, window, theta, rcond, l, rng,
                 verbose, callback=None):
    """CATS from n_init initialisations; the lowest final approximate distortion wins (``callback``: see
    :func:`cats`; restart is the initialisation's number when n_init > 1)."""
    backend = source.backend
    diag = source.diagonal()
    seeding = _SourceRows(source, backend.asarray(weights_h), diag)
    passes = DevicePasses(source, weights_h, diag)
    best, runs, init_seconds = restarts(
        lambda: initial_labels(init, source.n, k, rng, seeding),
        lambda labels0, restart: iterate(passes, weights_h, k, labels0, l=l, max_iter=max_iter, window=window,
                                         theta=theta, rcond=rcond, rng=rng, verbose=verbose, restart=restart,
                                         callback=callback),
        n_init, max_iter)
    return best, runs, init_seconds, diag
