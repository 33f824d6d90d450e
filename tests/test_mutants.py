"""Tests written to kill the kinds of mutant of the core numerics that survived the suite (issue 27, point 8).

Each test holds the library to an independent float64 formula. Each was checked against hand-made mutants, applied
to a scratch copy of kkmgpu (the tests importing that copy), on the CPU and, for the CUDA sources, the emulated GPU:

| mutant | killed by |
|---|---|
| spec.with_center: laplacian's gamma times scale**2 (the rbf's rule) | test_laplacian_absorbs_a_feature_scale_once |
| check_symmetric: `diff > rtol` (absolute) | test_symmetry_check_..., test_precomputed_fit_... |
| check_symmetric: max K for max abs K (`rows.max()`) | test_symmetry_check_...[max-negative] |
| lloyd: zero-weight trigger never set (`weights == 1`) | test_refill_when_a_step_leaves_only_zero_weight_... |
| lloyd: the all-points counts decide emptiness (`stats[1:1 + k]`) | the same |
| refill_empty_clusters: `weights >= 0` for positive | the same |
| kernel_kmeans_cpu: float16 table of absolute values; `table[x & 0x7fff]` | test_float16_negative_values_... |
| kernel_kmeans.cu: `K[idx] & 0x7fff` before the float16 conversion | the same, cuda cases |
| offgrid._clear_moves: no margin; `own + margin`; LIMITED_CHECK_RTOL = 1e-3 | test_one_step_checks_margin_... |
| tiled_cpu: rbf without `max(d, 0)`; laplacian `sqrt(d)` | test_tiled_epilogue_clamps_... |
| tiled.cu: float `if (d < 0) d = 0` removed | the same, cuda cases |
| kernel_kmeans_cpu._epilogue / kernel_kmeans.cu: the clamp removed | test_dense_kernel_block_clamps_... |

Survives, equivalent within the stated error bound: the laplacian's `sqrt(abs(d))` for `sqrt(max(d, 0))` (the
rounding of d is as likely positive; either is within sqrt of the GEMM form's rounding of the true value).
assign_labels' per-cluster counts made non-atomic is a planted bug of the CUDA-on-CPU harness
(tests/cuda_planted/racy_counts.cu, tests/test_cudacpu.py).
"""

import numpy as np
import pytest

import kkmgpu
from kkmgpu import _validation
from kkmgpu.backend import device as _backend
from kkmgpu.bandwidth import offgrid as _offgrid
from kkmgpu.engine.dense import DenseKernelOperator
from kkmgpu.engine.tiled import tiled_ops
from kkmgpu.kernels import spec as _kernel_spec
from kkmgpu.kernels.epilogue_codes import EPILOGUE_CODES
from synthetic import host, quiet_fit


def distances(X):
    """||x_i - x_j|| in float64, from the differences (not the GEMM form)."""
    X = np.asarray(X, dtype=np.float64)
    return np.sqrt(((X[:, None, :] - X[None, :, :]) ** 2).sum(-1))


# --------------------------------------------------------------------------- laplacian kernel, scaled features


@pytest.mark.parametrize("dtype,scale", [("float32", 1e20), ("float32", 1e-25), ("float64", 1e170),
                                         ("float64", 1e-170)])
def test_laplacian_absorbs_a_feature_scale_once(device, dtype, scale):
    """K of (X * s) with gamma / s is K of X with gamma: exp(-gamma ||x - y||) is invariant, and the internal
    power-of-two rescaling of features that leave the precision's range must divide gamma's argument by the
    scale, not its square (the rbf's rule)."""
    rng = np.random.default_rng(271)
    X = rng.normal(size=(40, 3))
    gamma = 0.7
    reference = np.exp(-gamma * distances(X))
    Xs = X * scale
    # the data are out of range on purpose: the spec rescales their features (else the test would not test that)
    spec = _kernel_spec.with_center(_kernel_spec.resolve_kernel("laplacian", gamma=gamma / scale, X=Xs), Xs, np,
                                    np.dtype(dtype))
    assert spec.scale != 1.0
    K = host(kkmgpu.kernel_matrix(Xs, kernel="laplacian", gamma=gamma / scale, dtype=dtype, device=device))
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(K, reference, rtol=0, atol=tol)
    unscaled = host(kkmgpu.kernel_matrix(X, kernel="laplacian", gamma=gamma, dtype=dtype, device=device))
    np.testing.assert_allclose(K, unscaled, rtol=0, atol=tol)
    # and a fit from the same start gives the labels of the unscaled data
    init = rng.integers(0, 3, len(X))
    a = quiet_fit(Xs, 3, kernel="laplacian", gamma=gamma / scale, dtype=dtype, device=device, init=init, tol=0.0)
    b = quiet_fit(X, 3, kernel="laplacian", gamma=gamma, dtype=dtype, device=device, init=init, tol=0.0)
    np.testing.assert_array_equal(host(a.labels), host(b.labels))


# --------------------------------------------------------------------------- dense symmetry check


def symmetric_case(rng, n, dtype, scale, sign):
    """A symmetric K (values of both signs, max |K| on the side ``sign``) times ``scale``, and a copy whose upper
    triangle is off by two units in the last place (what a float kernel computed twice may differ by)."""
    X = rng.normal(size=(n, 3))
    base = np.exp(-distances(X) ** 2 / 4) - 0.3
    K = (sign * base * scale).astype(dtype)
    iu = np.triu_indices(n, 1)
    eps = float(np.finfo(dtype).eps)
    rounded = K.copy()
    rounded[iu] = (K[iu].astype(np.float64) * (1 + 2 * eps * rng.choice([-1.0, 1.0], iu[0].size))).astype(dtype)
    return K, rounded


@pytest.mark.parametrize("dtype,scale", [(np.float32, 1e-30), (np.float32, 1e30), (np.float64, 1e-200),
                                         (np.float64, 1e200)])
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["max-positive", "max-negative"])
def test_symmetry_check_is_relative_to_max_abs_K(device, dtype, scale, sign):
    """Rounding-level asymmetry is accepted and a 1e-3 relative asymmetry refused, at any scale of K and whichever
    sign its largest magnitude has."""
    rng = np.random.default_rng(272)
    backend = _backend.resolve_device(device)
    n = 50
    K, rounded = symmetric_case(rng, n, dtype, scale, sign)
    largest = float(np.abs(K.astype(np.float64)).max())
    assert _validation.check_symmetric(backend.asarray(rounded), backend) == pytest.approx(largest, rel=1e-6, abs=0)
    asymmetric = rounded.copy()
    asymmetric[3, 17] += dtype(1e-3 * largest * sign)
    with pytest.raises(ValueError, match=r"not a symmetric kernel matrix \(max \|K - K.T\| = .* \* max\|K\|\)"):
        _validation.check_symmetric(backend.asarray(asymmetric), backend)
    # small tiles: the maximum and the differences are gathered over several of them
    tiled = _validation.check_symmetric(backend.asarray(rounded), backend, block=7)
    assert tiled == pytest.approx(largest, rel=1e-6, abs=0)
    with pytest.raises(ValueError, match="not a symmetric kernel matrix"):
        _validation.check_symmetric(backend.asarray(asymmetric), backend, block=7)


@pytest.mark.parametrize("scale", [1e-30, 1e30])
def test_precomputed_fit_accepts_rounding_asymmetry_at_any_scale(device, scale):
    rng = np.random.default_rng(273)
    K, rounded = symmetric_case(rng, 40, np.float32, scale, 1.0)
    result = quiet_fit(rounded, 3, kernel="precomputed", device=device, random_state=0)
    reference = quiet_fit(K / np.float32(scale), 3, kernel="precomputed", device=device, random_state=0)
    np.testing.assert_array_equal(host(result.labels), host(reference.labels))
    asymmetric = rounded.copy()
    asymmetric[5, 2] *= np.float32(1.01)
    with pytest.raises(ValueError, match="not a symmetric kernel matrix"):
        quiet_fit(asymmetric, 3, kernel="precomputed", device=device, random_state=0)


# --------------------------------------------------------------------------- refill of a cluster of zero weights


def one_step_with_refill(K, labels, w, k):
    """Labels after one assignment step (Eq. 4, float64, ties to the lowest index) and the documented refill: a
    cluster without positive-weight points is empty; empty clusters, in increasing index, each take the
    positive-weight point farthest from its centre whose cluster keeps a positive-weight point."""
    n = len(labels)
    dist = np.full((n, k), np.inf)
    for c in range(k):
        members = labels == c
        size = w[members].sum()
        if size > 0:
            S = K[:, members] @ w[members]
            dist[:, c] = np.diag(K) - 2 * S / size + w[members] @ S[members] / size ** 2
    new = dist.argmin(axis=1)
    far = dist[np.arange(n), new]
    positive = w > 0
    for c in range(k):
        if (positive & (new == c)).any():
            continue
        keeps = np.array([positive[i] and (positive & (new == new[i])).sum() >= 2 for i in range(n)])
        candidates = np.flatnonzero(keeps)
        p = candidates[np.argmax(far[candidates])]
        new[p] = c
    return new


def test_refill_when_a_step_leaves_only_zero_weight_points_in_a_cluster(device):
    """Cluster 2 starts with two positive-weight points at the ends of a line and zero-weight points at its middle,
    its centre: the step sends the two to clusters 0 and 1 while the zero-weight points stay. Cluster 2 then holds
    no weight and is empty: the refill must give it a positive-weight point in that same step."""
    rng = np.random.default_rng(274)
    X = np.r_[rng.normal(0.0, 0.3, 10), rng.normal(10.0, 0.3, 10), [0.2, 9.8], 5.0 + 0.01 * rng.normal(size=3)]
    X = X[:, None]
    labels = np.r_[np.zeros(10, int), np.ones(10, int), [2, 2, 2, 2, 2]]
    w = np.r_[rng.uniform(0.5, 2.0, 22), np.zeros(3)]
    K = X @ X.T
    expected = one_step_with_refill(K, labels, w, 3)
    plain = np.argmin([[(x - X[(labels == c) & (w > 0)].T @ w[(labels == c) & (w > 0)] / w[labels == c].sum()) ** 2
                        for c in range(3)] for x in X[:, 0]], axis=1)
    assert (plain[w > 0] != 2).all() and (plain[w == 0] == 2).all()  # the step empties cluster 2 of weight
    one = quiet_fit(X, 3, kernel="linear", init=labels, sample_weight=w, dtype="float64", device=device,
                    max_iter=1, tol=0.0)
    np.testing.assert_array_equal(host(one.labels), expected)
    assert np.bincount(expected[w > 0], minlength=3).min() > 0
    full = quiet_fit(X, 3, kernel="linear", init=labels, sample_weight=w, dtype="float64", device=device, tol=0.0)
    assert np.bincount(host(full.labels)[w > 0], minlength=3).min() > 0


# --------------------------------------------------------------------------- float16 storage, negative values


@pytest.mark.parametrize("kind", ["sigmoid", "centred-linear"])
def test_float16_negative_values_decode_with_their_sign(device, kind):
    """Cluster sums over float16 K (full pass and incremental update) equal the float64 sums of the float16 values,
    the negative ones included."""
    rng = np.random.default_rng(275)
    n, k = 300, 4
    X = rng.normal(size=(n, 5))
    if kind == "sigmoid":
        K = np.tanh(0.3 * X @ X.T - 0.5)
    else:
        Xc = X - X.mean(0)
        K = Xc @ Xc.T / 8
    K16 = K.astype(np.float16)
    assert (K16 < 0).mean() > 0.3 and np.isfinite(K16).all()
    K64 = K16.astype(np.float64)
    w = rng.uniform(0.5, 2.0, n)
    backend = _backend.resolve_device(device)
    op = DenseKernelOperator(backend.asarray(K16), backend.asarray(w), backend)
    labels = rng.integers(0, k, n).astype(np.int32)

    def reference(lab):
        Y = np.zeros((n, k))
        Y[np.arange(n), lab] = w
        return K64 @ Y

    # partial sums run in float32 over blocks of rows: about 1e-7 of the sum of |terms|
    atol = 1e-6 * (np.abs(K64) @ w).max()
    S = op.cluster_sums(backend.asarray(labels), k)
    np.testing.assert_allclose(host(S), reference(labels), rtol=0, atol=atol)
    moved = labels.copy()
    which = rng.choice(n, 20, replace=False)
    moved[which] = (moved[which] + 1) % k
    S = op.update_cluster_sums(S, backend.asarray(labels), backend.asarray(moved))
    np.testing.assert_allclose(host(S), reference(moved), rtol=0, atol=atol)
    np.testing.assert_array_equal(host(op.diag), np.diag(K64))


# --------------------------------------------------------------------------- critical bandwidth, rounding margin


def near_tie_set(rng, delta=1e-2):
    """Cluster 1 is cluster 0 mirrored at x = 0 (members in the same order). Zero-weight points of cluster 0:
    two on the mirror (exactly as near to both clusters: they stay) and a pair at x = +-delta (one of them is
    nearer to cluster 1 by far more than rounding: it moves)."""
    half = np.vstack([[-3.0, 3.0] + 0.3 * rng.normal(size=(8, 2)), [3.0, -3.0] + 0.3 * rng.normal(size=(4, 2))])
    probes = np.array([[0.0, 0.3], [0.0, -1.1], [delta, 0.3], [-delta, 0.3]])
    X = np.vstack([half, probes, half * [-1.0, 1.0]])
    labels = np.r_[np.zeros(16, int), np.ones(12, int)].astype(np.int32)
    w = np.r_[np.ones(12), np.zeros(4), np.ones(12)]
    return X, labels, w


def reference_gaps(D, labels, w, sigma):
    """d(i, 1) - d(i, 0) in float64 (Eq. 4) for the RBF kernel exp(-D / sigma)."""
    K = np.exp(-D / sigma)
    Y = np.zeros((len(labels), 2))
    Y[np.arange(len(labels)), labels] = w
    S = K @ Y
    sizes = Y.sum(0)
    dist = 1.0 - 2.0 * S / sizes + (Y * S).sum(0) / sizes ** 2
    return dist[:, 1] - dist[:, 0]


def test_one_step_checks_margin_sits_between_rounding_and_real_gaps(device, monkeypatch):
    """The limited check sums the candidates' rows in another order than the full pass. Emulated here: its cluster
    sums of cluster 1 come out a few ulps larger. Exact ties must still stay (a move by rounding is no move), and
    the point nearer to cluster 1 by 1e-6 .. 1e-2 must move, in the limited check and the full one."""
    monkeypatch.setattr(_offgrid, "LIMITED_CHECK_MAX_COST", 1e9)  # use limited checks even where they do not pay
    original = _offgrid.OneStepQuestion._rows_cluster_sums

    def other_order(self, K, rows):
        S = original(self, K, rows)
        return S * self.backend.asarray(np.array([1.0, 1.0 + 4e-16]))

    monkeypatch.setattr(_offgrid.OneStepQuestion, "_rows_cluster_sums", other_order)
    rng = np.random.default_rng(276)
    X, labels, w = near_tie_set(rng)
    D = distances(X) ** 2
    backend = _backend.resolve_device(device)
    question = _offgrid.OneStepQuestion(backend, backend.asarray(labels), backend.asarray(w), 2, limited=True)
    assert question.limited
    n_decisive = 0
    for sigma in np.geomspace(1.5, 40.0, 12):  # below ~50 only the near tie moves
        gaps = reference_gaps(D, labels, w, sigma)
        movers = np.flatnonzero((labels == 0) & (gaps < 0))
        assert movers.tolist() == [14] and -1e-2 < gaps[14] < -1e-6  # the near tie moves, clearly but barely
        np.testing.assert_array_equal(gaps[[12, 13]], 0.0)           # the exact ties do not
        Ks = backend.asarray(np.exp(-D / sigma))
        n_full, moved_full = question.full(Ks)
        assert n_full == 1 and host(moved_full).tolist() == [14]
        limited = question.limited_check(Ks)
        assert limited is not None and host(limited).tolist() == [14]
        n_decisive += 1
    assert question.n_limited_decisive == n_decisive


# --------------------------------------------------------------------------- distance epilogues, clamp at 0


def duplicates_far_out(rng, offset):
    """float32 points with many exact duplicates, far from the origin: ||x||^2 + ||y||^2 - 2 <x, y> of a duplicate
    pair rounds to either sign."""
    base = rng.normal(size=(6, 4)) + offset
    return np.vstack([base[rng.integers(0, 6, 40)], rng.normal(size=(8, 4)) + offset]).astype(np.float32)


@pytest.mark.parametrize("kernel", ["rbf", "laplacian"])
def test_tiled_epilogue_clamps_negative_rounded_distances(device, kernel):
    """The tiled engine's three epilogues (rows, cluster sums, moved sums) on float32 inner products of duplicates
    far from the origin: every value at most 1 exactly, and within the rounding of the squared distance of the
    float64 kernel. The columns are given other point indices than the rows, so no value is the unit diagonal."""
    rng = np.random.default_rng(277)
    X = duplicates_far_out(rng, 30.0)
    n = len(X)
    backend = _backend.resolve_device(device)
    ops = tiled_ops(backend)
    gamma = 0.05
    kind = EPILOGUE_CODES[kernel]
    sq = (X * X).sum(1)
    G = X @ X.T
    assert ((sq[:, None] + sq[None, :] - 2 * G) < 0).sum() > 50  # the case: many distances round below 0
    D = distances(X)
    reference = np.exp(-gamma * (D ** 2 if kernel == "rbf" else D))
    rounding = 8 * np.finfo(np.float32).eps * float(sq.max())  # error of the squared distance from the GEMM form
    atol = gamma * (rounding if kernel == "rbf" else np.sqrt(rounding)) + 1e-6
    far_points = backend.asarray(np.arange(n, dtype=np.int64) + 10 * n)

    def args():
        return backend.asarray(G.copy()), backend.asarray(sq), backend.asarray(sq)

    Gd, a, b = args()
    rows = host(ops.tile_epilogue(Gd, a, b, kind, gamma, 0.0, 3, far_points, 0))
    # one point per cluster (cluster j = column j): S is the kernel block itself
    clusters = backend.asarray(np.arange(n, dtype=np.int32))
    Gd, a, b = args()
    S = host(ops.tile_cluster_sums(Gd, a, b, kind, gamma, 0.0, 3, clusters, backend.asarray(np.ones(n)), far_points,
                                   0, backend.xp.zeros((n, n))))
    Gd, a, b = args()
    S_moved = host(ops.tile_moved_sums(Gd, a, b, kind, gamma, 0.0, 3, clusters,
                                       backend.asarray(np.full(n, n, dtype=np.int32)), backend.asarray(np.ones(n)),
                                       far_points, 0, backend.xp.zeros((n, n + 1))))[:, :n]
    for got in (rows, S, S_moved):
        assert np.isfinite(got).all() and got.max() <= 1.0, float(np.nanmax(got) - 1.0)
        np.testing.assert_allclose(got, reference, rtol=0, atol=atol)


@pytest.mark.parametrize("kernel", ["rbf", "laplacian"])
def test_dense_kernel_block_clamps_negative_rounded_distances(device, kernel):
    """The dense builder's epilogue (kernel_epilogue) on the same features, not centred: values at most 1 and within
    rounding of the float64 kernel."""
    from kkmgpu.kernels import blocks as _blocks
    rng = np.random.default_rng(278)
    X = duplicates_far_out(rng, 30.0)
    backend = _backend.resolve_device(device)
    gamma = 0.05
    spec = _kernel_spec.resolve_kernel(kernel, gamma=gamma, X=X, precision="fp32")  # not centred
    K = host(_blocks.kernel_block(backend.asarray(X), backend.asarray(X), spec, backend))
    D = distances(X)
    reference = np.exp(-gamma * (D ** 2 if kernel == "rbf" else D))
    sq = (X.astype(np.float64) ** 2).sum(1)
    rounding = 8 * np.finfo(np.float32).eps * float(sq.max())
    atol = gamma * (rounding if kernel == "rbf" else np.sqrt(rounding)) + 1e-6
    assert np.isfinite(K).all() and K.max() <= 1.0, float(np.nanmax(K) - 1.0)
    np.testing.assert_allclose(K, reference, rtol=0, atol=atol)


# --------------------------------------------------------------------------- graph_spectral.py (run 6 survivors)
# Each test below failed on hand-applied survivors (psd_shift, spectral_embedding, _arpack_top, starts) and passes here.


def weighted_graph(rng, sizes, bipartite=False):
    """A symmetric sparse affinity of ``len(sizes)`` connected blocks (a ring plus 3 m random edges each), weights
    uniform in [0.1, 2] so that the degrees differ; ``bipartite``: edges between even and odd indices only, so that
    -1 is an eigenvalue of D^-1/2 A D^-1/2 (as large in magnitude as the top one)."""
    import scipy.sparse as sp

    blocks = []
    for m in sizes:
        ring = np.arange(m)
        rows, cols = rng.integers(0, m, (2, 3 * m))
        if bipartite:
            cols = (cols - ((rows + cols) % 2 == 0)) % m
        rows, cols = np.r_[ring, rows], np.r_[(ring + 1) % m, cols]
        keep = rows != cols
        W = sp.coo_matrix((rng.uniform(0.1, 2.0, keep.sum()), (rows[keep], cols[keep])), shape=(m, m)).tocsr()
        blocks.append(W + W.T)
    return sp.block_diag(blocks, format="csr")


def normalized_reference(A):
    """(N, d, eigenvalues descending, eigenvectors) of N = D^-1/2 A D^-1/2 in float64 (dense eigh)."""
    dense = A.toarray()
    d = dense.sum(axis=1)
    N = dense / np.sqrt(np.outer(d, d))
    w, V = np.linalg.eigh(N)
    return N, d, w[::-1], V[:, ::-1]


def on_device(A, d, backend):
    if backend.is_gpu:
        import cupyx.scipy.sparse

        return cupyx.scipy.sparse.csr_matrix(A), backend.asarray(d)
    return A, d


def assert_eigenpairs(E, w, N, d, k, want_w, atol_w, residual):
    """E = D^-1/2 V with V's columns unit eigenvectors of N, column j paired with w[j], w the top k descending."""
    assert len(w) == k and E.shape == (N.shape[0], k)
    np.testing.assert_allclose(w, want_w[:k], rtol=0, atol=atol_w)
    V = host(E) * np.sqrt(d)[:, None]
    np.testing.assert_allclose(np.linalg.norm(V, axis=0), 1.0, rtol=0, atol=1e-6)
    assert np.linalg.norm(N @ V - V * np.asarray(w)[None, :], axis=0).max() <= residual


@pytest.mark.parametrize("sizes", [[21], [6, 6]], ids=["connected", "two-components"])
def test_spectral_embedding_dense_route_gives_the_top_eigenpairs(device, sizes):
    """n <= 5 k + 1: the dense decomposition, its eigenvalues the top k of N in descending order, each column of
    E * D^1/2 a unit eigenvector for the eigenvalue in its place, no iterations, solver "dense"."""
    from kkmgpu.methods.graph_spectral import spectral_embedding

    rng = np.random.default_rng(280)
    k = 4 if len(sizes) == 1 else 3  # n <= 5 k + 1 both
    A = weighted_graph(rng, sizes)
    N, d, want_w, _ = normalized_reference(A)
    backend = _backend.resolve_device(device)
    E, w, iterations, solver = spectral_embedding(*on_device(A, d, backend), k, backend, np.random.default_rng(0))
    assert (solver, iterations) == ("dense", 0)
    assert_eigenpairs(E, w, N, d, k, want_w, atol_w=1e-12, residual=1e-10)


@pytest.mark.parametrize("sizes", [[200], [150, 150]], ids=["connected", "two-components"])  # above DENSE_COMPONENT
def test_spectral_embedding_iterative_routes_honour_tol_and_find_the_largest_algebraic(device, sizes):
    """A bipartite graph (the eigenvalue -1 as large in magnitude as 1): the largest algebraic eigenvalues, not
    the largest in magnitude; each column paired with its eigenvalue; residuals within the tol asked (1e-9), by
    ARPACK for a connected graph on the CPU, else by LOBPCG. The solver's default tolerance leaves 1e-6."""
    from kkmgpu.methods.graph_spectral import spectral_embedding

    rng = np.random.default_rng(281)
    k = 4
    A = weighted_graph(rng, sizes, bipartite=True)
    N, d, want_w, _ = normalized_reference(A)
    assert want_w[-1] == pytest.approx(-1.0, abs=1e-12)
    backend = _backend.resolve_device(device)
    tol = 1e-9
    E, w, iterations, solver = spectral_embedding(*on_device(A, d, backend), k, backend, np.random.default_rng(0),
                                                  tol=tol)
    assert solver == ("lobpcg" if backend.is_gpu else "arpack") and iterations > 0
    assert_eigenpairs(E, w, N, d, k, want_w, atol_w=1e-10, residual=10 * tol)


def test_arpack_top_counts_its_products_honours_tol_and_gives_up_at_maxiter():
    """``_arpack_top``'s count is the number of products ARPACK asked for (counted here by an operator of our
    own, from the same start and restart seed, at the same tol); a looser tol asks fewer; a maxiter too small
    for the tol gives (None, None, ...) and the spectral start hands over to LOBPCG, whose own shortfall at that
    maxiter is no warning (the start needs no more)."""
    import warnings

    from scipy.sparse.linalg import LinearOperator, eigsh

    from kkmgpu.methods.graph_spectral import _arpack_top, spectral_embedding

    rng = np.random.default_rng(282)
    A = weighted_graph(rng, [300])
    _, d, want_w, _ = normalized_reference(A)
    Nd = (A.multiply(1 / np.sqrt(np.outer(d, d)))).tocsr()
    v0 = rng.standard_normal(300)
    k = 5
    counts = {}
    for tol in (1e-10, 1e-3):
        products = [0]

        def matvec(x):
            products[0] += 1
            return Nd @ x

        eigsh(LinearOperator(Nd.shape, matvec=matvec, dtype=np.float64), k=k, which="LA", tol=tol, maxiter=500,
              v0=v0, rng=np.random.default_rng(7))
        w, V, count = _arpack_top(Nd, k, v0, tol=tol, maxiter=500, rng=np.random.default_rng(7))
        np.testing.assert_allclose(w, want_w[:k], rtol=0, atol=1e-8 if tol < 1e-6 else 1e-3)
        assert count == products[0]
        counts[tol] = count
    assert counts[1e-3] < counts[1e-10]
    w, V, _ = _arpack_top(Nd, k, v0, tol=1e-12, maxiter=1, rng=np.random.default_rng(7))
    assert w is None and V is None
    backend = _backend.resolve_device("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        E, w, iterations, solver = spectral_embedding(A, d, k, backend, np.random.default_rng(0), tol=1e-12,
                                                      maxiter=1)
    assert solver == "lobpcg" and iterations >= 1 and np.isfinite(host(E)).all()


@pytest.mark.parametrize("n", [2, 3, 300])
@pytest.mark.parametrize("objective", ["ncut", "ratio_association"])
def test_psd_shift_is_minus_the_smallest_eigenvalue_plus_one_percent(device, objective, n):
    """graph_shift="auto"'s sigma = 1.01 max(0, -lambda_min) of D^-1/2 A D^-1/2 (ncut) or of A (ratio
    association), float64 eigvalsh as the reference; n = 2 and 3 (the dense route: CuPy's Lanczos raised
    IndexError at n = 3 on an H100, which the stand-in now models) and 300 (Lanczos); and what fit
    reports (in A's units for the ratio association; the cut's sigma has none)."""
    import scipy.sparse as sp

    from kkmgpu.methods.graph_spectral import psd_shift

    rng = np.random.default_rng(283)
    if n == 2:
        A = sp.csr_matrix(np.array([[0.0, 1.5], [1.5, 0.0]] if objective == "ncut" else [[0.25, 1.5], [1.5, 0.5]]))
    else:
        A = weighted_graph(rng, [n])
    dense = A.toarray()
    d = dense.sum(axis=1)
    M = dense / np.sqrt(np.outer(d, d)) if objective == "ncut" else dense
    want = 1.01 * max(0.0, -np.linalg.eigvalsh(M)[0])
    assert want > 0
    backend = _backend.resolve_device(device)
    shift = psd_shift(*on_device(A, d, backend), objective, backend, np.random.default_rng(0))
    # Lanczos stops at a residual of SHIFT_TOL = 1e-3 relative (an eigenvalue within 0.1%, inside the 1% margin);
    # the eigenvalue's error is about the residual squared: 1.6e-6 relative here
    rel = 1e-12 if n <= 3 else 1e-4
    assert shift == pytest.approx(want, rel=rel, abs=0)
    assert shift > -np.linalg.eigvalsh(M)[0]          # K is positive semi-definite with room
    if n == 300:
        result = quiet_fit(dense, 2, objective=objective, affinity="precomputed", device=device, dtype="float64",
                           random_state=0)
        assert result.method_params["graph_shift"] == pytest.approx(want, rel=rel, abs=0)


def test_spectral_start_is_recorded_in_method_params_and_prints_nothing(device, capsys):
    """method_params holds the spectral start as docs/graphs.md lists it: ``spectral_eigenvalues`` (the top k of
    D^-1/2 A D^-1/2), ``eigensolver`` (ARPACK for a connected graph on the CPU, LOBPCG on a GPU),
    ``eigensolver_iterations`` and ``spectral_seconds`` (part of the fit's time); with verbose=False the start's
    k-means on the embedding prints nothing."""
    rng = np.random.default_rng(284)
    A = weighted_graph(rng, [200])
    _, _, want_w, _ = normalized_reference(A)
    backend = _backend.resolve_device(device)
    result = quiet_fit(A.toarray(), 3, objective="ncut", affinity="precomputed", device=device, random_state=0,
                       n_init=2, verbose=False)
    params = result.method_params
    np.testing.assert_allclose(params["spectral_eigenvalues"], want_w[:3], rtol=0, atol=1e-6)
    assert params["eigensolver"] == ("lobpcg" if backend.is_gpu else "arpack")
    assert isinstance(params["eigensolver_iterations"], int) and params["eigensolver_iterations"] > 0
    assert 0.0 < params["spectral_seconds"] <= result.timings["total"]
    assert capsys.readouterr().out == ""


def test_identical_points_give_the_same_fit_on_every_call_with_a_seed(device):
    """100 identical points (the graph an invariant subspace of every Krylov method): two fits with the same
    random_state give the same labels, sigma and spectral eigenvalues; every eigensolver's start and restart
    vectors come from the seed."""
    X = np.ones((100, 2))
    fits = [quiet_fit(X, 3, objective="ncut", device=device, random_state=0, n_init=3) for _ in range(3)]
    for other in fits[1:]:
        np.testing.assert_array_equal(host(other.labels), host(fits[0].labels))
        for key in ("graph_shift", "spectral_eigenvalues"):
            assert other.method_params[key] == fits[0].method_params[key], key


def test_a_scipy_without_eigsh_rng_runs_lobpcg_and_the_same_shift(monkeypatch):
    """SciPy before 1.15 (supported: scipy>=1.9) has an ``eigsh`` without ``rng``; emulated by a wrapper of that
    signature: the PSD shift still comes from eigsh (without rng) and the spectral start from LOBPCG."""
    import scipy.sparse.linalg as spla

    from kkmgpu.methods.graph_spectral import psd_shift, spectral_embedding

    real = spla.eigsh

    def eigsh(A, k=6, M=None, sigma=None, which="LM", v0=None, ncv=None, maxiter=None, tol=0,
              return_eigenvectors=True, Minv=None, OPinv=None, mode="normal"):
        return real(A, k=k, M=M, sigma=sigma, which=which, v0=v0, ncv=ncv, maxiter=maxiter, tol=tol,
                    return_eigenvectors=return_eigenvectors, Minv=Minv, OPinv=OPinv, mode=mode)

    monkeypatch.setattr(spla, "eigsh", eigsh)
    rng = np.random.default_rng(285)
    A = weighted_graph(rng, [120])
    N, d, want_w, _ = normalized_reference(A)
    backend = _backend.resolve_device("cpu")
    shift = psd_shift(A, d, "ncut", backend, np.random.default_rng(0))
    assert shift == pytest.approx(1.01 * -np.linalg.eigvalsh(N)[0], rel=1e-6, abs=0)
    E, w, _, solver = spectral_embedding(A, d, 3, backend, np.random.default_rng(0), tol=1e-9)
    assert solver == "lobpcg"
    assert_eigenpairs(E, w, N, d, 3, want_w, atol_w=1e-10, residual=1e-8)


def test_each_spectral_start_is_a_converged_kmeans_partition_of_the_embedding(device, monkeypatch):
    """Each of the n_init spectral starts is k-means run to convergence on the embedding E (from the same seed):
    every point is nearest, in float64, to the centroid of its own cluster (up to rounding-level ties). The
    start's k-means stops at a relative change of EMBEDDING_TOL; at 0 it runs until no point moves."""
    from kkmgpu.methods import graph_spectral
    from kkmgpu.methods.graph_spectral import spectral_embedding, starts

    monkeypatch.setattr(graph_spectral, "EMBEDDING_TOL", 0.0)

    rng = np.random.default_rng(286)
    A = weighted_graph(rng, [300])
    d = np.asarray(A.sum(axis=1)).ravel()
    backend = _backend.resolve_device(device)
    k = 5
    E = host(spectral_embedding(*on_device(A, d, backend), k, backend, np.random.default_rng(0))[0])
    labels, _ = starts("spectral", 3, *on_device(A, d, backend), k, backend, np.random.default_rng(0))
    assert len(labels) == 3
    for L in labels:
        centroids = np.stack([E[L == c].mean(axis=0) for c in range(k)])
        D = ((E[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=-1)
        gap = D[np.arange(len(L)), L] - D.min(axis=1)
        assert np.all(gap <= 1e-9 * D.max(axis=1)), int((gap > 0).sum())


@pytest.mark.parametrize("k", [3, 8, 20])
def test_spectral_embedding_of_many_components_is_the_top_of_their_spectra(k):
    """A graph of 9 components, small (dense per component) and large (ARPACK per component), unequal: the top k
    eigenpairs of the whole N on the CPU by solving each component alone, k below, near and above the number of
    components (the eigenvalue 1 nine times: the first 9 columns are then the components' own top vectors), each
    against the dense eigh of the whole matrix; a seed gives the same embedding twice."""
    from kkmgpu.methods.graph_spectral import DENSE_COMPONENT, spectral_embedding

    rng = np.random.default_rng(409)
    sizes = [5, 30, 300, 12, 150, 2, 70, 40, 220]
    assert min(sizes) <= DENSE_COMPONENT < max(sizes)
    A = weighted_graph(rng, sizes)
    N, d, want_w, _ = normalized_reference(A)
    assert np.sum(np.isclose(want_w, 1.0, atol=1e-10)) == len(sizes)
    backend = _backend.resolve_device("cpu")
    E, w, iterations, solver = spectral_embedding(A, d, k, backend, np.random.default_rng(0), tol=1e-10)
    # k up to the 9 components: k of the eigenvalues 1, each component's own vector in closed form (no ARPACK)
    assert solver == "arpack" and (iterations > 0) == (k > len(sizes))
    assert_eigenpairs(E, w, N, d, k, want_w, atol_w=1e-8, residual=1e-8)
    again = spectral_embedding(A, d, k, backend, np.random.default_rng(0), tol=1e-10)[0]
    np.testing.assert_array_equal(host(E), host(again))
