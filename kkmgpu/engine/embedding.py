"""The eigendecomposition route (papers/kernel-kmeans-trace-objective-eigendecomposition.txt, Algorithm 16).

K = V Lambda V^T (Theorem 40); A = V Lambda^(1/2) satisfies A A^T = K, so kernel k-means on K is plain
k-means on the rows of A (Corollary 7). Here:

1. K is decomposed on the device: every eigenpair (``xp.linalg.eigh``: LAPACK syevd on the CPU, cuSOLVER
   syevd on a GPU), or only the top r (``n_components``). The top r come from LAPACK's MRRR driver
   (``scipy.linalg.eigh(..., subset_by_index=..., driver="evr")``, deterministic and several times faster
   than ARPACK on a dense matrix held in memory) on the CPU, and from
   ``cupyx.scipy.sparse.linalg.eigsh(which="LA")`` (thick-restart Lanczos, seeded start vector) on a GPU,
   checked by its residuals and replaced by cuSOLVER syevd when it broke down (:func:`_lanczos_failed`).
2. Negative eigenvalues (rounding in a PSD kernel, or a kernel that is not PSD, such as the sigmoid) are
   clipped to 0; their number and total magnitude are reported in ``result.method_params`` and warned
   about when they are material.
3. Lloyd iterations run on A through the project's one driver (:func:`kkmgpu.engine.lloyd.run_restarts`) with
   :class:`EmbeddingOperator`, which forms the cluster sums S = A (A^T Y) in O(n r k) without the n x n
   product A A^T.

Out-of-sample points are embedded Nystrom-style, a(x) = Lambda^(-1/2) V^T k(X_train, x), which gives
back the training rows of A for training points.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import numpy as np

from kkmgpu.kernels import functions as _kernels
from kkmgpu.backend.device import Backend, check_fits, import_cupyx
from kkmgpu.engine.lloyd import DenseKernelOperator, _update, run_restarts

#: ``n_components=None`` decomposes K fully up to this many points ...
FULL_DECOMPOSITION_MAX_N = 4096
#: ... and above it takes the top max(DEFAULT_COMPONENTS, 8 k) eigenpairs.
DEFAULT_COMPONENTS = 128
#: Negative eigenvalues are "material" (warned about) when their magnitudes sum to more than this
#: fraction of sum |lambda| over the computed eigenvalues.
MATERIAL_NEGATIVE_FRACTION = 1e-3
#: A requested top-r above this fraction of n is computed by the full decomposition and truncated.
PARTIAL_MAX_FRACTION = 0.5


def resolve_components(n_components, n, k) -> int:
    """The number of eigenpairs to compute (n_components validated at the API boundary)."""
    if n_components is None:
        return n if n <= FULL_DECOMPOSITION_MAX_N else min(n - 1, max(DEFAULT_COMPONENTS, 8 * k))
    return int(n_components)


def _top_eigenpairs(K, r, backend: Backend, rng, verbose):
    """The r largest (algebraic) eigenvalues of the symmetric K, descending, and their eigenvectors.

    Returns (eigenvalues float64 host (r,), V device (n, r) in K's dtype, route str).
    """
    xp = backend.xp
    n = K.shape[0]
    itemsize = np.dtype(K.dtype).itemsize
    full = r >= n or r > PARTIAL_MAX_FRACTION * n or n <= 64
    if full:
        # syevd overwrites a copy of K with the eigenvectors and needs about 2 n^2 more of workspace
        check_fits(3 * n * n * itemsize, backend, f"the full eigendecomposition of the {n} x {n} kernel matrix")
        if verbose:
            print(f"[kkmgpu] eigen: full eigendecomposition of the {n} x {n} kernel matrix on {backend.name}")
        w, V = xp.linalg.eigh(K)
        w, V = w[::-1][:r], V[:, ::-1][:, :r]
        route = "full (syevd)"
    elif backend.is_gpu:
        if verbose:
            print(f"[kkmgpu] eigen: top {r} eigenpairs of the {n} x {n} kernel matrix by Lanczos on {backend.name}")
        eigsh = _cupyx_eigsh()
        # a start vector of its own stream: the fit's random stream then feeds k-means++ the same draws as on the
        # CPU (whose MRRR solver takes none), so one random_state gives the same seeds on both devices
        v0 = backend.asarray(np.random.default_rng(0x5EED).uniform(-1.0, 1.0, size=n), dtype=K.dtype)
        try:
            w, V = eigsh(K, k=r, which="LA", v0=v0)
        except np.linalg.LinAlgError:          # NaN in the Lanczos tridiagonal (see _lanczos_failed)
            w = V = None
        if w is not None:
            order = xp.argsort(w)[::-1]
            w, V = w[order], V[:, order]
        route = "top-r (cupyx eigsh, Lanczos)"
        if w is None or _lanczos_failed(K, w, V, xp):
            check_fits(3 * n * n * itemsize, backend, f"the full eigendecomposition of the {n} x {n} kernel matrix "
                       "(cupyx eigsh failed: NaN or non-orthonormal Ritz vectors)")
            if verbose:
                print("[kkmgpu] eigen: cupyx eigsh failed (Lanczos breakdown); full eigendecomposition instead")
            w, V = xp.linalg.eigh(K)
            w, V = w[::-1][:r], V[:, ::-1][:, :r]
            route = "full (syevd; cupyx eigsh failed)"
    else:
        import scipy.linalg

        check_fits(n * n * itemsize, backend, f"the working copy of the {n} x {n} kernel matrix")
        if verbose:
            print(f"[kkmgpu] eigen: top {r} eigenpairs of the {n} x {n} kernel matrix by LAPACK evr on the CPU")
        w, V = scipy.linalg.eigh(K, subset_by_index=[n - r, n - 1], driver="evr", check_finite=False)
        w, V = w[::-1], V[:, ::-1]
        route = "top-r (LAPACK evr)"
    return backend.to_host(w).astype(np.float64), xp.ascontiguousarray(V), route


def _cupyx_eigsh():
    return import_cupyx("scipy.sparse.linalg").eigsh


def _lanczos_failed(K, w, V, xp) -> bool:
    """True when cupyx eigsh's top-r pairs are not eigenpairs of K: non-finite values, residuals
    ||K v - w v|| above sqrt(eps) max|w|, or Ritz vectors that are not orthonormal (ghost copies).

    CuPy's thick-restart Lanczos has no guard for beta -> 0 (an invariant subspace found early: K = I for a
    narrow bandwidth, a degenerate or numerically rank-deficient kernel) up to at least CuPy 14.2; it then
    returns NaN or garbage (cupy/cupy#7495, #8486, fixed by #10098). One GEMM K V (n^2 r) checks the result.
    """
    if not (bool(xp.isfinite(w).all()) and bool(xp.isfinite(V).all())):
        return True
    tol = math.sqrt(float(np.finfo(K.dtype).eps))
    scale = float(xp.abs(w).max()) if w.size else 0.0
    if scale == 0.0:
        return False                            # K's top eigenvalues are 0: embed reports it
    V = V.astype(K.dtype, copy=False)
    residual = K @ V - V * w.astype(K.dtype)[None, :]
    if float(xp.sqrt((residual * residual).sum(axis=0)).max()) > tol * scale:
        return True
    gram = V.T @ V
    gram[xp.arange(V.shape[1]), xp.arange(V.shape[1])] -= 1.0
    return float(xp.abs(gram).max()) > tol


def embed(K, r, backend: Backend, rng, *, verbose=False):
    """A = V Lambda_+^(1/2) from the top r eigenpairs of K, and the spectrum diagnostics.

    Columns whose clipped eigenvalue is 0 are dropped (they are zero). Returns (A device (n, r+),
    eigenvalues host float64 (r+,) descending and positive, V device (n, r+), diagnostics dict).
    """
    xp = backend.xp
    w, V, route = _top_eigenpairs(K, r, backend, rng, verbose)
    trace = float(xp.diagonal(K).astype(xp.float64).sum())
    negative = w < 0
    negative_mass = float(np.abs(w[negative]).sum())
    absolute = float(np.abs(w).sum())
    keep = w > 0
    positive = w[keep]
    diagnostics = {
        "n_components": int(r),
        "n_components_used": int(keep.sum()),
        "decomposition": route,
        "n_negative_eigenvalues": int(negative.sum()),
        "negative_eigenvalue_mass": negative_mass,
        "negative_fraction": negative_mass / absolute if absolute > 0 else 0.0,
        "largest_eigenvalue": float(w[0]) if w.size else 0.0,
        "smallest_eigenvalue": float(w[-1]) if w.size else 0.0,
        "captured_fraction": float(positive.sum()) / trace if trace > 0 else float("nan"),
    }
    if positive.size == 0:
        raise ValueError(f"the kernel matrix has no positive eigenvalue among the top {r} (largest "
                         f"{diagnostics['largest_eigenvalue']:.3g}); the eigendecomposition route needs a "
                         "kernel with a positive semidefinite part.")
    if diagnostics["negative_fraction"] > MATERIAL_NEGATIVE_FRACTION:
        warnings.warn(
            f"the kernel matrix has {diagnostics['n_negative_eigenvalues']} negative eigenvalues of total "
            f"magnitude {negative_mass:.4g} ({100 * diagnostics['negative_fraction']:.2g}% of sum |lambda|); "
            "they were clipped to 0, so method='eigen' minimises the objective of the nearest positive "
            "semidefinite matrix, not of K (is the kernel positive semidefinite?).",
            UserWarning, stacklevel=4)
    index = backend.asarray(np.flatnonzero(keep))
    V = xp.ascontiguousarray(V[:, index])
    A = V * backend.asarray(np.sqrt(positive), dtype=V.dtype)[None, :]
    return xp.ascontiguousarray(A), positive, V, diagnostics


class EmbeddingOperator:
    """Cluster sums on the embedding A (n, r) with K ~ A A^T, without forming A A^T.

    S = A (A^T Y) with Y the weighted one-hot labels: O(n r k) per pass and O(n r) memory; the
    operator interface of :mod:`kkmgpu.engine.lloyd` (``n``, ``weights``, ``backend``, ``diag``,
    ``total_diag``, ``rows``, ``cluster_sums``, ``incremental_cost``).

    Everything is computed from a float64 copy of A (n r values, small beside K). With S in float32 and
    ||a_i||^2 in float64, the distance of a point to a cluster it ties with (duplicate points, k above the
    number of distinct points) was float32 noise of either sign that changed with every reassignment: a point
    moved into an emptied cluster moved back at the next step, the objective (0 up to rounding) alternated
    between two noise values that no relative-change test can accept, and Lloyd ran all max_iter steps.
    In float64 the assignment is plain k-means on fixed points, whose objective only decreases.
    """

    def __init__(self, A, weights, backend: Backend):
        xp = backend.xp
        if A.dtype != xp.float64:
            check_fits(A.shape[0] * A.shape[1] * 8, backend, f"the float64 copy of the {A.shape[0]} x {A.shape[1]} "
                       "embedding")
        self.A = A.astype(xp.float64, copy=False)
        self.weights = weights
        self.backend = backend
        self.n = A.shape[0]
        self.diag = (self.A * self.A).sum(axis=1)      # ||a_i||^2 = (A A^T)_ii
        self.total_diag = float((weights * self.diag).sum())

    def rows(self, index):
        """(A A^T)[index, :] as a float64 host array (for k-means++ seeding)."""
        B = self.A[self.backend.asarray(np.asarray(index))]
        return self.backend.to_host(B @ self.A.T).astype(np.float64)

    def centroid_sums(self, labels, k):
        """M (k, r), float64: M[c] = sum_{j in c} w_j a_j (one product with the weighted one-hot Y)."""
        xp = self.backend.xp
        Y = xp.zeros((self.n, k), dtype=self.A.dtype)
        Y[xp.arange(self.n), labels] = self.weights
        return Y.T @ self.A

    def cluster_sums(self, labels, k):
        """S = A M^T (n, k), float64: S[i, c] = sum_{j in c} w_j (A A^T)_ij."""
        M = self.centroid_sums(labels, k)
        xp = self.backend.xp
        return self.A @ xp.ascontiguousarray(M.T)

    def incremental_cost(self, n_moved):
        """A full pass is O(n r k) and reads A once: never worth an incremental update."""
        return float("inf")


class EigenState:
    """What :func:`predict` needs: the Nystrom projection and the cluster sums in its basis."""

    def __init__(self, projection, centroid_sums, within, sizes):
        self.projection = projection          # device (n_train, q): V_q Lambda_q^(-1/2)
        self.centroid_sums = centroid_sums    # device float64 (k, q)
        self.within = within                  # host float64 (k,): ||M_c||^2 in the same basis
        self.sizes = sizes                    # host float64 (k,)


def _prediction_state(V, eigenvalues, operator, labels, sizes, k, dtype):
    """Nystrom projection keeping eigenvalues above n * eps(dtype) * lambda_max (smaller ones are noise)."""
    backend = operator.backend
    xp = backend.xp
    n = V.shape[0]
    cutoff = n * np.finfo(dtype).eps * eigenvalues[0]
    keep = np.flatnonzero(eigenvalues > cutoff)
    index = backend.asarray(keep)
    P = V[:, index] * backend.asarray(1.0 / np.sqrt(eigenvalues[keep]), dtype=V.dtype)[None, :]
    M = operator.centroid_sums(labels, k)[:, index].astype(xp.float64)
    within = backend.to_host((M * M).sum(axis=1))
    return EigenState(xp.ascontiguousarray(P), M, within, np.asarray(sizes, dtype=np.float64)), int(keep.size)


def _single_threaded_blas(backend: Backend):
    """On the CPU, BLAS on one thread while Lloyd alternates the thin n x r x k products with numba's
    assignment kernel: multithreaded OpenBLAS competing with numba's OpenMP threads for the cores made an
    iteration 5-17x slower on the 2-core reference machine (n=5000, r=128, k=10: 321 ms vs 19 ms per
    iteration under load; n=500: 10 restarts in 0.83 s vs 0.04 s when idle). Uses threadpoolctl where it
    is installed (it comes with scikit-learn), else changes nothing."""
    if backend.is_gpu:
        return contextlib.nullcontext()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def fit_eigen(K, k, *, r, weights, init, n_init, max_iter, tol, rng, verbose, backend: Backend):
    """Algorithm 16 on a kernel matrix K already on the device.

    Returns (best LloydRun, runs, init_seconds, diagnostics, EigenState, exact objective of the labels
    on K, seconds of the decomposition).
    """
    t0 = backend.timer()
    A, eigenvalues, V, diagnostics = embed(K, r, backend, rng, verbose=verbose)
    t_decomposed = backend.timer()
    operator = EmbeddingOperator(A, weights, backend)
    with _single_threaded_blas(backend):
        best, runs, init_seconds = run_restarts(operator, k, init=init, n_init=n_init, max_iter=max_iter, tol=tol,
                                                rng=rng, verbose=verbose, update="full")
    # The objective of the labels on K itself (one pass over K): equal to best.objective when every
    # component is kept and no eigenvalue was clipped, an upper bound's complement otherwise.
    _, _, _, exact = _update(DenseKernelOperator(K, weights, backend), best.labels, k, backend.xp)
    state, q = _prediction_state(V, eigenvalues, operator, best.labels, best.sizes, k, np.dtype(A.dtype))
    diagnostics["n_components_predict"] = q
    if verbose:
        print(f"[kkmgpu] eigen: {diagnostics['n_components_used']} components "
              f"({100 * diagnostics['captured_fraction']:.4g}% of trace K), objective on K {exact:.10g}")
    return best, runs, init_seconds, diagnostics, state, float(exact), t_decomposed - t0


def predict_eigen(result, X_new, backend: Backend, dt, batch_size):
    """Nearest cluster of each new point in the embedding: a(x) = Lambda^(-1/2) V^T k(X_train, x)."""
    xp = backend.xp
    state = result._eigen_state
    P = backend.asarray(state.projection)
    M = backend.asarray(state.centroid_sums).astype(P.dtype)
    step = batch_size or _kernels.tile_rows(result._n_train, dt.itemsize, backend=backend)
    out = []
    for i0, i1, block in _kernels.training_kernel_rows(result, X_new, backend, dt, step):
        S = ((block @ P) @ M.T).astype(xp.float64)  # a(x) . M_c
        labels, _, _ = backend.ops.assign_labels(S, xp.zeros(i1 - i0, dtype=xp.float64), state.sizes,
                                                 state.within, xp.zeros(i1 - i0, dtype=xp.int32))
        out.append(backend.to_host(labels))
    return np.concatenate(out).astype(np.int32)
