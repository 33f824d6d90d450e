"""Kernel matrix trimming (papers/kernel-matrix-trimming.txt, Section 3) and sparse kernel k-means.

The voting, scoring and trimming are held to a slow direct implementation written here from the paper's text
(plain Python loops, float64), to hand-computed values of Eq. 5, and to the paper's Figure 3; the sparse
operator to dense float64 products and to the dense operator.
"""

import math
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import kkmgpu
from kkmgpu.backend import device as _backend
from kkmgpu.engine import sparse as _sparse
from kkmgpu.trimming import size_scores, sorted_row_derivative, trim_kernel_matrix

FIGURE3_SIZES = [43, 19, 10, 9, 6, 6]


# ------------------------------------------------------------------------------------ direct reference


def reference_score(v, j):
    """Eq. 5 for one size, with the nearest non-zero multiples of j below and above v."""
    below = max(1, math.floor(v / j)) * j
    above = max(1, math.ceil(v / j)) * j
    return (1 - 1 / j) * max(math.exp(-abs(v - below) / j), math.exp(-abs(v - above) / j))


def reference_trim(K, vote_fraction=0.1, slack=0.01, h=3, max_size=0.5):
    """Section 3 with loops: returns (row sizes w_i, thresholds, dense K*, winners)."""
    K = np.asarray(K, dtype=np.float64)
    n = K.shape[0]
    m = math.ceil(vote_fraction * n)
    largest = max(1, math.floor(max_size * n))
    votes = []
    for i in range(n):
        d = sorted(K[i], reverse=True)  # d[q] = the (q + 1)-th largest value: candidate size q + 1
        deriv = []
        for q in range(n):
            total = 0.0
            for t in range(1, h + 1):
                total += (d[max(q - t, 0)] - d[min(q + t, n - 1)]) / (2 * t)
            deriv.append(total if q < largest else 0.0)
        # the m largest positive values; ties go to the smaller size
        order = sorted(range(n), key=lambda q: (-deriv[q], q))[:m]
        votes.append({q + 1 for q in order if deriv[q] > 0})
    sizes = [0] * n
    winners = []
    while True:
        v_star = {}
        for i in range(n):
            if sizes[i] == 0:
                for j in votes[i]:
                    v_star[j] = v_star.get(j, 0) + 1
        if not v_star:
            break
        w = max(sorted(v_star), key=lambda j: reference_score(v_star[j], j))  # first maximum: smallest size
        takers = [i for i in range(n) if sizes[i] == 0 and w in votes[i]]
        for i in takers:
            sizes[i] = w
        winners.append((w, len(takers)))
    sizes = [s if s else n for s in sizes]
    extra = math.ceil(slack * n)
    thresholds = np.array([sorted(K[i], reverse=True)[min(n, sizes[i] + extra) - 1] for i in range(n)])
    K_hat = np.where(K >= thresholds[:, None], K, 0.0)
    return np.array(sizes), thresholds, np.maximum(K_hat, K_hat.T), winners


def block_matrix(sizes, rng=None, noise=0.0):
    labels = np.repeat(np.arange(len(sizes)), sizes)
    K = (labels[:, None] == labels[None, :]).astype(np.float64)
    if noise:
        E = rng.uniform(-noise, noise, K.shape)
        K = 0.1 + 0.8 * K + (E + E.T) / 2
    return K, labels


def blobs(n, d, k, rng, spread=0.6):
    centres = rng.normal(0, 4.0, (k, d))
    labels = rng.integers(0, k, n)
    return centres[labels] + rng.normal(0, spread, (n, d)), labels


def rbf(X, gamma):
    sq = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    return np.exp(-gamma * sq)


def dense(A):
    A = A.get() if hasattr(A, "get") else A
    return np.asarray(A.toarray() if hasattr(A, "toarray") else A)


# ------------------------------------------------------------------------------------ the paper's pieces


def test_size_scores_match_hand_computed_values():
    # j = 1: weight 1 - 1/1 = 0. j = 2, v = 3: multiples 2 and 4, both 1/2 away: 0.5 e^-0.5.
    # j = 3, v = 3: a whole multiple: 2/3. j = 4, v = 6: 4 and 8, both 2/4 away: 0.75 e^-0.5.
    expected = [0.0, 0.5 * math.exp(-0.5), 2 / 3, 0.75 * math.exp(-0.5)]
    np.testing.assert_allclose(size_scores(np.array([5, 3, 3, 6])), expected, rtol=1e-12)
    # The paper's example: 148 votes for size 50 (about 3 clusters) scores high, 23 votes does not;
    # 23 < 50, so its nearest non-zero multiple is 50 itself (27 away), not 0.
    votes = np.zeros(50)
    votes[49] = 148
    assert size_scores(votes)[49] == pytest.approx(0.98 * math.exp(-2 / 50), rel=1e-12)
    votes[49] = 23
    assert size_scores(votes)[49] == pytest.approx(0.98 * math.exp(-27 / 50), rel=1e-12)
    # The multiple below wins: 7 votes for size 3 lie 1 above 6 and 2 below 9: (2/3) e^(-1/3).
    # No vote at all: the nearest non-zero multiple is j itself, a whole j away: (1 - 1/j) e^-1.
    np.testing.assert_allclose(size_scores(np.array([0, 0, 7, 0])),
                               [0.0, 0.5 * math.exp(-1), 2 / 3 * math.exp(-1 / 3), 0.75 * math.exp(-1)],
                               rtol=1e-12)


def test_size_scores_match_the_direct_formula_on_random_votes(rng):
    votes = rng.integers(0, 400, 300)
    expected = [reference_score(int(v), j + 1) for j, v in enumerate(votes)]
    np.testing.assert_allclose(size_scores(votes), expected, rtol=1e-12, atol=1e-15)


def test_sorted_row_derivative_matches_the_direct_sum(rng):
    rows = -np.sort(-rng.normal(size=(4, 37)), axis=1)
    for h in (1, 3, 5):
        got = sorted_row_derivative(rows, h)
        for i in range(4):
            for q in range(37):
                want = sum((rows[i, max(q - t, 0)] - rows[i, min(q + t, 36)]) / (2 * t) for t in range(1, h + 1))
                assert got[i, q] == pytest.approx(want, rel=1e-12, abs=1e-14)


def test_derivative_of_a_step_by_hand():
    # A row with w = 5 ones then zeros (descending). By hand, with h = 3, at position j:
    # j = w - 2: only t = 3 spans the drop: 1/6; j = w - 1: t = 2, 3: 1/4 + 1/6 = 5/12;
    # j = w and j = w + 1: every t spans it: 1/2 + 1/4 + 1/6 = 11/12; then 5/12 and 1/6 again.
    row = np.array([[1.0] * 5 + [0.0] * 11])
    expected = np.zeros(16)
    expected[2:8] = [1 / 6, 5 / 12, 11 / 12, 11 / 12, 5 / 12, 1 / 6]  # positions j = 3..8 (0-based 2..7)
    np.testing.assert_allclose(sorted_row_derivative(row, 3)[0], expected, rtol=1e-15, atol=0)


def test_figure3_votes_and_rounds_by_hand():
    # The Figure 3 block matrix (n = 93, 10 votes per row): a row of a cluster of size w has the six positive
    # derivative values above at sizes w-2..w+3 and votes for exactly those. So, by hand:
    # v*_j = 12 for j = 4..6 (the two 6-clusters), 12 + 9 = 21 for j = 7, 12 + 9 + 10 = 31 for j = 8, 9,
    # 9 + 10 = 19 for j = 10..12, 10 for j = 13, 19 for j = 17..22 and 43 for j = 41..46.
    expected = np.zeros(93, dtype=np.int64)
    for w, count in zip(FIGURE3_SIZES, FIGURE3_SIZES):
        expected[w - 3:w + 3] += count
    assert expected[3:13].tolist() == [12, 12, 12, 21, 31, 31, 19, 19, 19, 10]
    K, _ = block_matrix(FIGURE3_SIZES)
    result = trim_kernel_matrix(K, device="cpu")
    np.testing.assert_array_equal(result.votes, expected)
    # Round 1: s_43 = 42/43 (43 votes, one whole multiple) beats every other size (s_j <= 0.96 elsewhere).
    # Round 2: only the 19-cluster's sizes 17..22 and the small ones are left: s_19 = 18/19.
    # Round 3, v* = 12 (j = 4..6), 21, 31, 31, 19, 19, 19, 10 (j = 7..13): s_7 = 6/7 = 0.857 (21 = 3 x 7) beats
    # s_6 = 5/6, s_10 = 0.9 e^-0.1 = 0.814, s_4 = 0.75, ...; its voters are the two 6-clusters and the 9-cluster.
    # Round 4: the 10-cluster's votes alone (10 for j = 8..13): s_10 = 0.9 beats s_11 = (10/11) e^(-1/11) = 0.830.
    assert result.winners.tolist() == [[43, 43], [19, 19], [7, 21], [10, 10]]
    scores = size_scores(np.where(np.arange(1, 94) <= 13, expected, 0))  # the votes left for round 3
    assert int(np.argmax(scores)) + 1 == 7 and scores[6] == pytest.approx(6 / 7, rel=1e-12)


def test_trimming_holds_no_dense_n_by_n_temporary(rng):
    # Beyond K: the vote bits (n^2 / 8 bytes), row batches and K_hat / K* in CSR (at most 4 times K_hat's
    # entries at once). Any n x n temporary of 1 byte or more per entry (a bool mask, a float copy, an argsort)
    # would break this bound (about 0.6 n^2 bytes here); K itself is float64, 64 times the bits.
    import tracemalloc

    n, batch, size = 4000, 8, 20
    labels = np.repeat(np.arange(n // size), size)[rng.permutation(n)]
    K = (labels[:, None] == labels[None, :]).astype(np.float64)
    backend = _backend.resolve_device("cpu")
    tracemalloc.start()
    try:
        from kkmgpu.trimming import _trim

        result = _trim(K, backend, batch_size=batch)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.cluster_sizes.tolist() == [size] * (n // size) and result.nnz == n * size
    bound = n * -(-n // 8) + 4 * result.nnz * (8 + 4) + batch * n * 80 + 2 ** 20
    assert peak < bound < n * n, (peak, bound)


def test_figure3_block_matrix_gives_the_papers_estimate(device, rng):
    # Paper, Figure 3: ground truth 6 clusters of 43, 19, 10, 9, 6, 6; "estimated cluster number is 6 clusters
    # with sizes 43, 19, 10, 7, 7, 7". The 9 and the two 6 overlap in their votes (sizes w-2..w+3 around each
    # drop), and 21 of their elements voted for 7: three clusters of 7.
    K, labels = block_matrix(FIGURE3_SIZES)
    perm = rng.permutation(K.shape[0])
    result = trim_kernel_matrix(K[perm][:, perm], device=device)
    assert result.n_clusters == 6
    assert result.cluster_sizes.tolist() == [43, 19, 10, 7, 7, 7]
    # close to the truth: the two large ones exact, every size within 3 of the true one of the same rank
    assert np.abs(result.cluster_sizes - np.sort(FIGURE3_SIZES)[::-1]).max() <= 3
    # every element of the 43 and 19 clusters got its own cluster's size
    true_sizes = np.array(FIGURE3_SIZES)[labels][perm]
    assert (result.row_sizes[true_sizes >= 19] == true_sizes[true_sizes >= 19]).all()
    # the trimmed matrix keeps exactly the within-cluster entries (the slack 1 reaches only zeros)
    np.testing.assert_array_equal(dense(result.K), K[perm][:, perm])


def test_figure3_with_noise_and_a_vote_per_derivative_position(rng):
    # With noise on every entry, a row's derivative is positive everywhere; 6 votes per row (the width of the
    # drop's footprint for h = 3) keep the votes on the drops, and the estimate is the noiseless one.
    K, _ = block_matrix(FIGURE3_SIZES, rng=rng, noise=0.05)
    result = trim_kernel_matrix(K, vote_fraction=6 / 93, device="cpu")
    assert result.cluster_sizes.tolist() == [43, 19, 10, 7, 7, 7]


@pytest.mark.parametrize("params", [{}, {"vote_fraction": 0.2, "slack": 0.05, "h": 2, "max_size": 1.0},
                                    {"vote_fraction": 0.05, "slack": 0.0, "h": 4, "max_size": 0.3}])
def test_trimming_matches_the_direct_reference(params, rng):
    X, _ = blobs(90, 3, 4, rng)
    K = rbf(X, 0.1)
    sizes, thresholds, K_star, winners = reference_trim(K, **params)
    result = trim_kernel_matrix(K, device="cpu", **params)
    np.testing.assert_array_equal(result.row_sizes, sizes)
    np.testing.assert_allclose(result.thresholds, thresholds, rtol=0, atol=0)
    assert result.winners.tolist() == [list(w) for w in winners]
    np.testing.assert_allclose(dense(result.K), K_star, rtol=0, atol=0)
    assert result.nnz == np.count_nonzero(K_star)
    assert result.density == pytest.approx(np.count_nonzero(K_star) / 90 ** 2)
    counts = [round(m / w) for w, m in winners]
    assert result.n_clusters == sum(counts)
    assert sorted(result.cluster_sizes.tolist(), reverse=True) == sorted(
        [w for (w, _), c in zip(winners, counts) for _ in range(c)], reverse=True)


def test_negative_entries_follow_the_papers_maximum(rng):
    # K* = max(K_hat, K_hat^T): a negative value kept by one row only loses to the other side's zero.
    X = rng.normal(size=(60, 5))
    K = np.tanh(0.3 * X @ X.T - 0.5)  # a sigmoid kernel with many negative entries
    _, _, K_star, _ = reference_trim(K)
    result = trim_kernel_matrix(K, device="cpu")
    assert (K < 0).any()
    np.testing.assert_allclose(dense(result.K), K_star, rtol=0, atol=0)


def test_row_batches_do_not_change_the_result(rng):
    X, _ = blobs(150, 4, 5, rng)
    K = rbf(X, 0.05).astype(np.float32)
    whole = trim_kernel_matrix(K, device="cpu")
    batched = trim_kernel_matrix(K, device="cpu", batch_size=7)
    np.testing.assert_array_equal(whole.row_sizes, batched.row_sizes)
    np.testing.assert_array_equal(whole.thresholds, batched.thresholds)
    assert (whole.K != batched.K).nnz == 0
    assert whole.K.dtype == np.float32


def test_max_size_bounds_the_sizes(rng):
    X, _ = blobs(120, 3, 3, rng)
    K = rbf(X, 0.05)
    for max_size in (0.2, 0.5, 1.0):
        result = trim_kernel_matrix(K, max_size=max_size, device="cpu")
        voted = result.row_sizes < 120  # rows without any vote keep everything (size n)
        assert (result.row_sizes[voted] <= math.floor(max_size * 120)).all()


def test_trimmed_matrix_is_symmetric_and_keeps_each_rows_top_values(rng):
    X, _ = blobs(200, 5, 6, rng)
    K = rbf(X, 0.02).astype(np.float32)
    result = trim_kernel_matrix(K, device="cpu")
    Ks = result.K
    assert (Ks != Ks.T).nnz == 0
    cut = np.minimum(result.row_sizes + math.ceil(0.01 * 200), 200)
    kept = np.diff(Ks.indptr)
    assert (kept >= cut).all()  # row i keeps at least its w_i + 0.01 n largest values
    assert result.density == pytest.approx(Ks.nnz / 200 ** 2)


def test_backends_agree(device, rng):
    X, _ = blobs(160, 4, 4, rng)
    K = rbf(X, 0.05).astype(np.float32)
    cpu = trim_kernel_matrix(K, device="cpu")
    other = trim_kernel_matrix(K, device=device)
    assert other.device.startswith(device)
    np.testing.assert_array_equal(cpu.row_sizes, other.row_sizes)
    np.testing.assert_array_equal(cpu.thresholds, other.thresholds)
    np.testing.assert_array_equal(dense(cpu.K), dense(other.K))
    if device == "cuda":
        assert type(other.K).__module__.startswith("cupyx")


def test_plot(rng):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    K, _ = block_matrix(FIGURE3_SIZES)
    axes = trim_kernel_matrix(K, device="cpu").plot()
    assert len(axes) == 2 and axes[1].get_ylabel() == "votes v*_j"
    import matplotlib.pyplot as plt

    plt.close("all")


# ------------------------------------------------------------------------------------ sparse operator


def random_symmetric_csr(n, density, rng, dtype=np.float64):
    A = sp.random(n, n, density=density, format="csr", dtype=np.float64, random_state=rng)
    A = (A + A.T + sp.identity(n)).tocsr()
    return A.astype(dtype)


def test_sparse_cluster_sums_match_dense_float64(device, rng):
    n, k = 300, 7
    A = random_symmetric_csr(n, 0.05, rng)
    labels = rng.integers(0, k, n).astype(np.int32)
    weights = rng.uniform(0.5, 2.0, n)
    Y = np.zeros((n, k))
    Y[np.arange(n), labels] = weights
    expected = A.toarray() @ Y
    backend = _backend.resolve_device(device)
    with backend.activate():
        K = _sparse.to_backend_csr(A, backend)
        op = _sparse.SparseKernelOperator(K, backend.asarray(weights), backend)
        S = op.cluster_sums(backend.asarray(labels), k)
        np.testing.assert_allclose(backend.to_host(S), expected, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(backend.to_host(op.diag), A.diagonal(), rtol=0)
        assert op.total_diag == pytest.approx(float(weights @ A.diagonal()))
        np.testing.assert_allclose(op.rows([3, 11]), A.toarray()[[3, 11]], rtol=0)
        # the incremental update after some points moved equals a full pass on the new labels
        new = labels.copy()
        moved = rng.choice(n, 40, replace=False)
        new[moved] = (new[moved] + rng.integers(1, k, 40)) % k
        S = op.update_cluster_sums(S, backend.asarray(labels), backend.asarray(new))
        Y[:] = 0
        Y[np.arange(n), new] = weights
        np.testing.assert_allclose(backend.to_host(S), A.toarray() @ Y, rtol=1e-10, atol=1e-10)


def test_numba_and_library_routes_agree(rng):
    # The CPU twin (numba) against the route a GPU takes (sparse-dense products), both on the CPU here.
    from kkmgpu.kernels.csr_cpu import csr_cluster_sums, csr_update_cluster_sums

    n, k = 500, 9
    A = random_symmetric_csr(n, 0.03, rng, dtype=np.float32)
    A64 = A.astype(np.float64)
    labels = rng.integers(0, k, n).astype(np.int32)
    new = labels.copy()
    new[rng.choice(n, 60, replace=False)] = rng.integers(0, k, 60)
    w = rng.uniform(0.1, 3.0, n)
    S1 = csr_cluster_sums(A, labels, w, k)
    S2 = _sparse.library_cluster_sums(A64, labels, w, k, np)
    np.testing.assert_allclose(S1, S2, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(csr_update_cluster_sums(A, S1, labels, new, w),
                               _sparse.library_update_cluster_sums(A64, S2, labels, new, w, np),
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
@pytest.mark.parametrize("update", ["full", "incremental"])
def test_sparse_and_dense_give_identical_labels_on_an_untrimmed_matrix(device, fmt, update, rng):
    X, _ = blobs(240, 3, 5, rng, spread=1.5)
    K = rbf(X, 0.05)
    init = rng.integers(0, 5, 240)
    init[:5] = np.arange(5)
    kw = dict(kernel="precomputed", init=init, device=device, dtype="float64", update=update)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        dense_fit = kkmgpu.fit(K, 5, **kw)
        sparse_fit = kkmgpu.fit(sp.csr_matrix(K).asformat(fmt), 5, **kw)
    np.testing.assert_array_equal(dense_fit.labels, sparse_fit.labels)
    assert sparse_fit.objective == pytest.approx(dense_fit.objective, rel=1e-10)
    assert sparse_fit.n_iter == dense_fit.n_iter
    assert sparse_fit.method_params["density"] == 1.0


def test_sparse_fit_on_a_trimmed_matrix_matches_a_dense_fit_on_its_dense_copy(rng):
    X, y = blobs(300, 4, 4, rng)
    K = rbf(X, 0.05)
    K_star = trim_kernel_matrix(K, device="cpu").K
    init = rng.integers(0, 4, 300)
    init[:4] = np.arange(4)
    a = kkmgpu.fit(K_star, 4, kernel="precomputed", init=init, dtype="float64", device="cpu")
    b = kkmgpu.fit(K_star.toarray(), 4, kernel="precomputed", init=init, dtype="float64", device="cpu")
    np.testing.assert_array_equal(a.labels, b.labels)
    assert a.objective == pytest.approx(b.objective, rel=1e-10)


# ------------------------------------------------------------------------------------ fit / predict


def test_fit_trimmed_clusters_K_star_and_records_the_estimate(device, rng):
    X, _ = blobs(300, 4, 4, rng)
    gamma = 0.05
    init = rng.integers(0, 4, 300)
    init[:4] = np.arange(4)
    result = kkmgpu.fit(X, 4, kernel="rbf", gamma=gamma, method="trimmed", init=init, device=device,
                        dtype="float64")
    K = kkmgpu.kernel_matrix(X, kernel="rbf", gamma=gamma, device="cpu", dtype="float64")
    trimmed = trim_kernel_matrix(K, device="cpu")
    on_K_star = kkmgpu.fit(trimmed.K, 4, kernel="precomputed", init=init, device="cpu", dtype="float64")
    np.testing.assert_array_equal(result.labels, on_K_star.labels)
    assert result.method == "trimmed"
    params = result.method_params
    assert params["n_clusters_estimated"] == trimmed.n_clusters
    assert params["cluster_sizes_estimated"] == trimmed.cluster_sizes.tolist()
    assert params["density"] == pytest.approx(trimmed.density)
    assert params["nnz"] == trimmed.nnz
    assert {"vote_fraction", "slack", "h", "max_size"} <= set(params)
    assert result.timings["trimming"] > 0


def test_fit_trimmed_frees_the_dense_K_before_the_sparse_maximum(monkeypatch, rng):
    # K* = max(K_hat, K_hat^T) needs only K_hat: fit drops its dense K first, so the maximum (K_hat, its
    # transpose and up to twice their entries) gets K's memory too (MNIST n = 70,000 needed it on 23 GiB).
    import gc
    import weakref

    from kkmgpu.methods import trimmed as _method

    built, alive_at_maximum = [], []
    real_build, real_symmetrise = _method.build_kernel_matrix, _sparse.symmetrise

    def build(*args, **kwargs):
        K = real_build(*args, **kwargs)
        built.append(weakref.ref(K))
        return K

    def symmetrise(A, *args, **kwargs):
        gc.collect()
        alive_at_maximum.append(built[-1]() is not None)
        return real_symmetrise(A, *args, **kwargs)

    monkeypatch.setattr(_method, "build_kernel_matrix", build)
    monkeypatch.setattr(_sparse, "symmetrise", symmetrise)
    X, _ = blobs(200, 3, 4, rng)
    result = kkmgpu.fit(X, 3, kernel="rbf", gamma=0.05, method="trimmed", device="cpu", dtype="float32")
    assert alive_at_maximum == [False]
    K = kkmgpu.kernel_matrix(X, kernel="rbf", gamma=0.05, device="cpu", dtype="float32")
    assert result.method_params["nnz"] == trim_kernel_matrix(K, device="cpu").nnz


def test_fit_trimmed_forwards_the_trimming_parameters(rng):
    X, _ = blobs(150, 3, 3, rng)
    kw = dict(kernel="rbf", gamma=0.05, method="trimmed", device="cpu", random_state=0)
    loose = kkmgpu.fit(X, 3, trim_slack=0.2, **kw)
    tight = kkmgpu.fit(X, 3, trim_slack=0.0, **kw)
    assert loose.method_params["slack"] == 0.2 and tight.method_params["slack"] == 0.0
    assert loose.method_params["nnz"] > tight.method_params["nnz"]
    model = kkmgpu.KernelKMeans(3, gamma=0.05, method="trimmed", trim_vote_fraction=0.2, trim_h=2,
                                trim_max_size=0.8, device="cpu", random_state=0).fit(X)
    assert model.result_.method_params["vote_fraction"] == 0.2
    assert model.result_.method_params["h"] == 2
    assert model.result_.method_params["max_size"] == 0.8
    assert model.get_params()["trim_h"] == 2


def reference_predict(K_new, thresholds, row_sizes, train_diag, extra, labels, k):
    """The documented rule with loops: trim each new row as K* trims a training row, then Eq. 4."""
    n = K_new.shape[1]
    sizes = np.bincount(labels, minlength=k).astype(float)
    out = []
    for row in K_new:
        nearest = int(np.argmin(train_diag - 2 * row))
        cut = min(n, row_sizes[nearest] + extra)
        own = np.sort(row)[::-1][cut - 1]
        trimmed = np.maximum(np.where(row >= own, row, 0), np.where(row >= thresholds, row, 0))
        return_sums = [trimmed[labels == c].sum() for c in range(k)]
        out.append(return_sums)
    return np.asarray(out), sizes


def test_predict_trims_new_rows_like_training_rows(device, rng):
    X, _ = blobs(260, 3, 4, rng)
    X_new = X[:40] + rng.normal(0, 0.3, (40, 3))
    gamma = 0.05
    result = kkmgpu.fit(X, 4, kernel="rbf", gamma=gamma, method="trimmed", device=device, random_state=1,
                        dtype="float64")
    assert result.converged
    # a training point's trimmed row is its row of K*: predicting the training set repeats the last step
    np.testing.assert_array_equal(kkmgpu.predict(result, X), result.labels)
    K = rbf(X, gamma)
    trimmed = trim_kernel_matrix(K, device="cpu")
    sq = ((X_new[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    S, sizes = reference_predict(np.exp(-gamma * sq), trimmed.thresholds, trimmed.row_sizes, np.ones(260),
                                 math.ceil(0.01 * 260), np.asarray(result.labels), 4)
    Kt = trimmed.K.toarray()
    labels = np.asarray(result.labels)
    within = np.array([Kt[np.ix_(labels == c, labels == c)].sum() for c in range(4)])
    expected = np.argmin(-2 * S / sizes + within / sizes ** 2, axis=1)
    np.testing.assert_array_equal(kkmgpu.predict(result, X_new), expected)


def test_predict_on_a_sparse_precomputed_fit(rng):
    X, _ = blobs(200, 3, 3, rng)
    K = rbf(X, 0.05)
    K[K < 0.05] = 0
    result = kkmgpu.fit(sp.csr_matrix(K), 3, kernel="precomputed", device="cpu", random_state=0, dtype="float64")
    np.testing.assert_array_equal(kkmgpu.predict(result, K), result.labels)


# ------------------------------------------------------------------------------------ validation


@pytest.mark.parametrize("kwargs, message", [
    ({"vote_fraction": 0.0}, "vote_fraction=0.0 must be a number in (0, 1]"),
    ({"vote_fraction": 1.5}, "vote_fraction=1.5"),
    ({"slack": -0.1}, "slack=-0.1 must be a number in [0, 1]"),
    ({"max_size": 0}, "max_size=0 must be a number in (0, 1]"),
    ({"h": 0}, "h=0 must be >= 1"),
])
def test_trim_parameters_are_validated(kwargs, message):
    K, _ = block_matrix([5, 5])
    with pytest.raises(ValueError) as info:
        trim_kernel_matrix(K, device="cpu", **kwargs)
    assert message in str(info.value)


def test_fit_validates_the_trimming_parameters():
    X = np.random.default_rng(0).normal(size=(30, 2))
    with pytest.raises(ValueError, match=r"trim_slack=2 must be a number in \[0, 1\]"):
        kkmgpu.fit(X, 2, method="trimmed", trim_slack=2, device="cpu")
    with pytest.raises(TypeError, match="trim_h=1.5 must be an integer"):
        kkmgpu.fit(X, 2, method="trimmed", trim_h=1.5, device="cpu")
    with pytest.raises(ValueError, match="trim_vote_fraction applies only to method='trimmed'"):
        kkmgpu.fit(X, 2, trim_vote_fraction=0.2, device="cpu")


def test_bad_matrices_are_rejected(rng):
    K, _ = block_matrix([5, 5])
    for bad_value in (np.nan, np.inf):
        bad = K.copy()
        bad[2, 3] = bad[3, 2] = bad_value
        with pytest.raises(ValueError, match="K contains NaN or infinity"):
            trim_kernel_matrix(bad, device="cpu")
    with pytest.raises(ValueError, match="K must be 2-D"):
        trim_kernel_matrix(K[0], device="cpu")
    with pytest.raises(ValueError, match="batch_size=0 must be >= 1"):
        trim_kernel_matrix(K, batch_size=0, device="cpu")
    with pytest.raises(TypeError, match="needs a dense kernel matrix"):
        trim_kernel_matrix(sp.csr_matrix(K), device="cpu")
    with pytest.raises(ValueError, match="square"):
        trim_kernel_matrix(K[:, :9], device="cpu")
    asym = K.copy()
    asym[0, 1] = 0.5
    with pytest.raises(ValueError, match="not a symmetric kernel matrix"):
        trim_kernel_matrix(asym, device="cpu")
    with pytest.raises(ValueError, match="not a symmetric kernel matrix"):
        kkmgpu.fit(sp.csr_matrix(asym), 2, kernel="precomputed", device="cpu")
    bad = sp.csr_matrix(K)
    bad.data[0] = np.nan
    with pytest.raises(ValueError, match="NaN or infinity"):
        kkmgpu.fit(bad, 2, kernel="precomputed", device="cpu")
    with pytest.raises(TypeError, match="sparse input is accepted only as a kernel matrix"):
        kkmgpu.fit(sp.csr_matrix(K), 2, kernel="rbf", device="cpu")
    with pytest.raises(ValueError, match="method='trimmed' needs a dense matrix"):
        kkmgpu.fit(sp.csr_matrix(K), 2, kernel="precomputed", method="trimmed", device="cpu")
    with pytest.raises(ValueError, match="square kernel matrix"):
        kkmgpu.fit(sp.csr_matrix(K[:, :9]), 2, kernel="precomputed", device="cpu")
