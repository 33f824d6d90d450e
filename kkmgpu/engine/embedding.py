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

import math

import numpy as np

from kkmgpu import _warn
from kkmgpu.backend.device import Backend, check_fits, import_cupyx

#: ``n_components=None`` decomposes K fully up to this many points ...
FULL_DECOMPOSITION_MAX_N = 4096
#: ... and above it takes the top max(DEFAULT_COMPONENTS, 8 k) eigenpairs.
DEFAULT_COMPONENTS = 128
#: Negative eigenvalues are "material" (warned about) when their magnitudes sum to more than this
#: fraction of sum |lambda| over the computed eigenvalues.
MATERIAL_NEGATIVE_FRACTION = 1e-3
#: A requested top-r above this fraction of n is computed by the full decomposition and truncated.
PARTIAL_MAX_FRACTION = 0.5


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
        _warn.warn(
            f"the kernel matrix has {diagnostics['n_negative_eigenvalues']} negative eigenvalues of total "
            f"magnitude {negative_mass:.4g} ({100 * diagnostics['negative_fraction']:.2g}% of sum |lambda|); "
            "they were clipped to 0, so method='eigen' minimises the objective of the nearest positive "
            "semidefinite matrix, not of K (is the kernel positive semidefinite?).",
            UserWarning)
    index = backend.asarray(np.flatnonzero(keep))
    V = xp.ascontiguousarray(V[:, index])
    A = V * backend.asarray(np.sqrt(positive), dtype=V.dtype)[None, :]
    return xp.ascontiguousarray(A), positive, V, diagnostics


class EmbeddingOperator:
    """Cluster sums on the embedding A (n, r) with K ~ A A^T, without forming A A^T.

    S = A (A^T Y) with Y the weighted one-hot labels: O(n r k) per pass and O(n r) memory; the
    operator interface of :mod:`kkmgpu.engine.lloyd` (``n``, ``weights``, ``backend``, ``diag``,
    ``total_diag``, ``rows``, ``device_rows``, ``cluster_sums``, ``incremental_cost``): nothing n long leaves the
    device in an iteration.

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
        self.value_dtype = np.dtype(A.dtype)  # the rounding of the values (lloyd's count of distinct centres)
        self.A = A.astype(xp.float64, copy=False)
        self.weights = weights
        self.backend = backend
        self.n = A.shape[0]
        self.diag = (self.A * self.A).sum(axis=1)      # ||a_i||^2 = (A A^T)_ii
        # ||A A^T||_2: A's columns are orthogonal, of squared norms the kept eigenvalues
        self.spectral_norm = float((self.A * self.A).sum(axis=0).max()) if self.A.shape[1] else 0.0
        self.total_diag = float((weights * self.diag).sum())

    def rows(self, index):
        """(A A^T)[index, :] as a float64 host array."""
        return self.backend.to_host(self.device_rows(self.backend.asarray(np.asarray(index))))

    def device_rows(self, index):
        """(A A^T)[index, :], float64 on the device, for device indices ``index`` (k-means++ seeding)."""
        return self.A[index] @ self.A.T

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


