"""The certified nearest-neighbour search (kkmgpu/kernels/knn_exact.py) against a float64 brute-force reference
(scipy's cdist of the float64 values, ties to the lower index), on data built to defeat a low-precision search:

- the error bound of the GEMM-form keys holds in every precision mode, on both devices (and is not vacuous);
- the search keeps the reference's neighbours, nearest first, with their float64 distances, in every mode, on
  float32 points far from the origin with far outliers and many duplicates (where the plain float32 search
  fails), on float64 data offset by 1e7, and on data scaled by 1e20 and 1e-25 (no -1 index, the same neighbours
  as the unscaled data, and the same ncut clustering on both devices);
- rows that cannot be certified are recomputed, in float64 and directly, and stay exact;
- the graph objective's features are centred in float64 before their cast; bad input raises with the rule;
- the search of new points (``query``, predict's) gives the reference's neighbours of each new point among the
  training points, their distances and exactly the pairs within the last neighbour's distance or a training
  point's radius, in every mode, on the hostile data (where the plain float32 GEMM-form distances get lists
  wrong), on scaled and offset data, in row tiles that divide nothing.
"""

import numpy as np
import pytest
from scipy.spatial.distance import cdist

import kkmgpu
from kkmgpu.backend.device import resolve_device
from kkmgpu.kernels import gemm, knn_cpu, knn_exact
from kkmgpu.kernels.graphs import nearest_neighbors
from reference import nearest_neighbors as reference

MODES = list(gemm.PRECISIONS)


def hostile(rng, n=240, d=32):
    """float32 points 300 from the origin in 32 dimensions (a product with a side below 32 runs fp32 in any mode;
    GEMM-form keys of the raw points lose their digits), four outliers 1e4 away (they pull the mean: the centred
    bulk's norms dwarf its neighbour distances), 25 copies of one point and 20 duplicated pairs (exact ties at
    and beyond the n_neighbors-th place)."""
    X = rng.normal(size=(n, d)) + 300.0
    out = rng.normal(size=(4, d))
    X[:4] += 1e4 * out / np.linalg.norm(out, axis=1, keepdims=True)
    X[4:29] = X[4]
    X[29:49] = X[49:69]
    return X.astype(np.float32)


def search(X, k, device, mode, **kwargs):
    backend = resolve_device(device)
    index, sq = knn_exact.search(backend.asarray(X), k, backend, mode, **kwargs)
    return backend.to_host(index), backend.to_host(sq)


@pytest.mark.parametrize("mode", MODES)
def test_error_bound_holds(device, mode, rng):
    """|D^ - D| <= c (||a_i||^2 + ||a_j||^2) + e_abs for D^ = ||a_i||^2 + ||a_j||^2 - 2 a_i . a_j with the
    product in the mode (float32 features with a far outlier), and the observed error reaches at least 1/1000 of
    the bound somewhere (a bound so loose would certify nothing)."""
    backend = resolve_device(device)
    a = rng.normal(size=(200, 64)).astype(np.float32)
    a[0] *= 300.0
    sq = np.einsum("ij,ij->i", a, a, dtype=np.float64)
    G = backend.to_host(gemm.product(backend.asarray(a), backend.asarray(a), backend, mode)).astype(np.float64)
    estimate = sq[:, None] + sq[None, :] - 2.0 * G
    exact = cdist(a.astype(np.float64), a.astype(np.float64), "sqeuclidean")
    c, e_abs = knn_exact.error_bound(gemm.effective_mode(mode, backend, np.float32, (200, 200, 64)), 64,
                                      np.float32)
    bound = c * (sq[:, None] + sq[None, :]) + e_abs
    ratio = np.abs(estimate - exact) / bound
    assert ratio.max() <= 1.0
    assert ratio.max() > 1e-3


def test_plain_float32_search_is_wrong_on_the_hostile_data(rng):
    """The data of the next test defeat the GEMM-form float32 search of the raw points (so that test can fail)."""
    X = hostile(rng)
    plain = np.sort(knn_cpu.nearest_neighbors(X, 10), axis=1)
    wrong = np.any(plain != np.sort(reference(X, 10)[0], axis=1), axis=1)
    assert wrong.sum() >= 10


@pytest.mark.parametrize("mode", MODES)
def test_search_equals_the_float64_reference_on_hostile_data(device, mode, rng):
    """Every row's neighbours, nearest first, and their float64 distances, in each precision mode. The 25 copies,
    and the rows whose 10th neighbour is among them, cannot be certified (their 10th distance ties points not
    kept) and are searched directly; in TF32 the outliers' pull on the mean leaves margins wider than the
    neighbour distances, so every row is recomputed, while the other modes certify most rows from their
    candidates."""
    X = hostile(rng)
    report = {}
    index, sq = search(X, 10, device, mode, report=report)
    want_index, want_sq = reference(X, 10)
    np.testing.assert_array_equal(index, want_index)
    np.testing.assert_allclose(sq, want_sq, rtol=1e-12, atol=0)
    assert report["direct_rows"] >= 25
    assert report["spares"] == knn_exact.spares(10)
    if report["mode"] != "tf32":
        assert report["candidates_certified"] > 0.5


def test_float64_data_offset_by_1e7(device, rng):
    """float64 points 1e7 from the origin, about 1 apart: exact (the search centres them in float64 first)."""
    X = rng.normal(size=(150, 5)) + 1e7
    index, sq = search(X, 8, device, "fp32")
    want_index, want_sq = reference(X, 8)
    np.testing.assert_array_equal(index, want_index)
    np.testing.assert_allclose(sq, want_sq, rtol=1e-9, atol=0)


@pytest.mark.parametrize("scale, mode", [(1e20, "3xtf32"), (1e-25, "tf32")])
def test_scaled_data_keep_the_neighbours(device, scale, mode, rng):
    """float32 data times 1e20 (squared norms overflow float32) or 1e-25 (they underflow): no -1 index, the
    reference's neighbours, those of the unscaled data; most rows certified from their candidates."""
    X = rng.normal(size=(200, 32)).astype(np.float32)   # 32 features: a side below 32 would run fp32 in any mode
    Xs = (X.astype(np.float64) * scale).astype(np.float32)
    report = {}
    index, sq = search(Xs, 7, device, mode, report=report)
    assert index.min() >= 0 and report["candidates_certified"] > 0.5
    want_index, want_sq = reference(Xs, 7)
    np.testing.assert_array_equal(index, want_index)
    np.testing.assert_allclose(sq, want_sq, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(index, reference(X, 7)[0])


def test_ncut_on_scaled_data_is_the_same_clustering(device, rng):
    """fit(X * 1e20, objective='ncut') and X * 1e-25 run (no -1 neighbour) and give fit(X)'s labels: the kNN graph
    is the same."""
    X = np.concatenate([rng.normal(size=(50, 2)), rng.normal(size=(50, 2)) + 6.0])
    labels = [kkmgpu.fit(X * s, 2, objective="ncut", device=device, random_state=0).labels for s in (1.0, 1e20, 1e-25)]
    np.testing.assert_array_equal(labels[1], labels[0])
    np.testing.assert_array_equal(labels[2], labels[0])


@pytest.mark.parametrize("how", ["no spares", "no spares, small tiles", "loose bound"])
def test_uncertified_rows_are_recomputed(device, how, rng, monkeypatch):
    """With no spare candidates (the n_neighbors-th key is the largest kept) or an error bound too loose to
    certify anything, the rows are recomputed with float64 keys over all points: still exact, also in tiles of
    13 rows (and column blocks of 7 in the recomputation) that divide nothing."""
    if how.startswith("no spares"):
        monkeypatch.setattr(knn_exact, "spares", lambda k: 0)
        if how.endswith("small tiles"):
            monkeypatch.setattr(knn_exact, "_chunk", lambda n_cols, itemsize, backend: 13)
    else:
        bound = knn_exact.error_bound
        monkeypatch.setattr(knn_exact, "error_bound",
                            lambda mode, d, dtype: bound(mode, d, dtype) if mode == "fp64" else (0.5, 0.0))
    X = (rng.normal(size=(200, 5)) + 20.0).astype(np.float32)
    report = {}
    index, sq = search(X, 6, device, "fp32", report=report)
    np.testing.assert_array_equal(index, reference(X, 6)[0])
    assert report["candidates_certified"] < 0.5 and report["float64_rows"] > 100


def test_graph_features_are_centred_in_float64(device, rng):
    """fit's graph features of float64 data 1e7 from the origin, in float32: X minus its mean to float32's
    precision (casting first would round every value to a whole number)."""
    from kkmgpu.methods.graphcut import graph_features

    backend = resolve_device(device)
    X = rng.normal(size=(300, 4)) + 1e7
    center, features = graph_features(backend.asarray(X), "float32", backend)
    want = X - X.mean(axis=0)
    np.testing.assert_allclose(backend.to_host(features), want, rtol=0, atol=1e-6 * np.abs(want).max())


def test_bad_input_raises(rng):
    backend = resolve_device("cpu")
    X = rng.normal(size=(30, 3))
    X[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN or infinity"):
        nearest_neighbors(X, 4, backend)
    with pytest.raises(ValueError, match="gemm_precision='fp16' is not one of 'fp32', '3xtf32', 'tf32'"):
        nearest_neighbors(X, 4, backend, "fp16")


@pytest.mark.gpu
def test_the_precision_reaches_the_gpu_search(rng, monkeypatch):
    """build_graph(precision="tf32") runs the GPU search's products in that mode, not the default (32 features:
    tensor-core sized), and the graph is the CPU's."""
    from conftest import require_cuda
    from kkmgpu.kernels import knn_cuda
    from kkmgpu.kernels.graphs import build_graph

    require_cuda()
    modes = []
    search_gpu = knn_cuda.search
    monkeypatch.setattr(knn_cuda, "search",
                        lambda *a, mode, **kw: modes.append(mode) or search_gpu(*a, mode=mode, **kw))
    backend = resolve_device("cuda")
    X = rng.normal(size=(120, 32)).astype(np.float32)
    graph = build_graph(backend.asarray(X), 5, "knn", backend, precision="tf32")
    assert modes == ["tf32"]
    np.testing.assert_array_equal(backend.to_host(graph.graph.toarray()),
                                  build_graph(X, 5, "knn", resolve_device("cpu")).graph.toarray())


def query_reference(Q, A, k, radius_sq):
    """(index, dist, within, D) of new points Q among the rows of A by cdist in float64, ties to the lower index:
    within[i, j] when D_ij <= the k-th distance of i or D_ij < radius_sq[j]."""
    D = cdist(np.asarray(Q, dtype=np.float64), np.asarray(A, dtype=np.float64), "sqeuclidean")
    index = np.argsort(D, axis=1, kind="stable")[:, :k]
    dist = np.take_along_axis(D, index, axis=1)
    return index, dist, (D <= dist[:, -1:]) | (D < radius_sq[None, :]), D


def query(A, Q, k, device, mode, radius_sq, **kwargs):
    backend = resolve_device(device)
    index, dist, pairs = knn_exact.query(backend.asarray(A), backend.asarray(Q), k, backend, mode,
                                         radius_sq=backend.asarray(radius_sq), **kwargs)
    return backend.to_host(index), backend.to_host(dist), tuple(backend.to_host(x) for x in pairs)


def check_query(got, want, n):
    index, dist, (rows, cols, pair_dist) = got
    want_index, want_dist, within, D = want
    np.testing.assert_array_equal(index, want_index)
    np.testing.assert_allclose(dist, want_dist, rtol=1e-12, atol=0)
    assert np.all(np.diff(rows * n + cols) > 0)    # each pair once, in row order, columns ascending
    np.testing.assert_array_equal(np.column_stack([rows, cols]), np.argwhere(within))
    np.testing.assert_allclose(pair_dist, D[rows, cols], rtol=1e-12, atol=0)


def new_points(A, rng):
    """Copies of 30 training points (one of the 25 copies among them: exact ties), 30 points moved by 0.05 and
    10 between the bulk and an outlier, float32."""
    moved = A[rng.choice(A.shape[0], 30)] + rng.normal(scale=0.05, size=(30, A.shape[1]))
    between = A[rng.choice(np.arange(100, A.shape[0]), 10)] * 0.5 + A[:10] * 0.5
    return np.concatenate([A[np.r_[4, rng.choice(A.shape[0], 29)]], moved, between]).astype(np.float32)


def test_plain_float32_query_is_wrong_on_the_hostile_data(rng):
    """The float32 GEMM-form distances of the raw new points (what predict used) get neighbour lists wrong here."""
    A = hostile(rng)
    Q = new_points(A, rng)
    sq_a, sq_q = (A * A).sum(axis=1), (Q * Q).sum(axis=1)
    plain = np.argsort(sq_q[:, None] + sq_a[None, :] - 2 * (Q @ A.T), axis=1, kind="stable")[:, :10]
    want = query_reference(Q, A, 10, np.zeros(A.shape[0]))[0]
    assert np.any(np.sort(plain, axis=1) != np.sort(want, axis=1), axis=1).sum() >= 10


@pytest.mark.parametrize("mode", MODES)
def test_query_equals_the_float64_reference_on_hostile_data(device, mode, rng):
    """New points against the hostile set (radii: each training point's 10th neighbour distance), in tiles of
    13 rows: each point's 10 nearest, their distances and the pairs within. The bound leaves fewer than a third of
    the pairs to direct distances except in TF32, whose margins exceed the neighbour distances there."""
    A = hostile(rng)
    Q = new_points(A, rng)
    radius = reference(A, 10)[1][:, -1] * (1 + 1e-9)   # off every distance: a GPU's sums may round one differently
    report = {}
    got = query(A, Q, 10, device, mode, radius, rows=13, report=report)
    check_query(got, query_reference(Q, A, 10, radius), A.shape[0])
    if report["mode"] != "tf32":
        assert report["direct_pairs"] < Q.shape[0] * A.shape[0] / 3


@pytest.mark.parametrize("scale, offset, dtype", [(1e20, 0.0, np.float32), (1e-25, 0.0, np.float32),
                                                  (1.0, 1e7, np.float64)])
def test_query_on_scaled_and_offset_data(device, scale, offset, dtype, rng):
    """float32 data times 1e20 or 1e-25 and float64 data 1e7 from the origin: the reference's neighbours and
    pairs (radii: the training points' 5th neighbour distances), those of the unscaled data."""
    X = rng.normal(size=(200, 32))
    A, Q = (X * scale + offset).astype(dtype)[:150], (X * scale + offset).astype(dtype)[150:]
    radius = reference(A, 5)[1][:, -1] * (1 + 1e-9)
    got = query(A, Q, 5, device, "3xtf32", radius)
    check_query(got, query_reference(Q, A, 5, radius), 150)
    np.testing.assert_array_equal(got[0], query_reference(X[150:], X[:150], 5, radius)[0])


def test_query_bad_input_raises(rng):
    backend = resolve_device("cpu")
    A = rng.normal(size=(30, 3))
    Q = rng.normal(size=(4, 3))
    Q[1, 2] = np.inf
    with pytest.raises(ValueError, match="new points contain NaN or infinity"):
        knn_exact.query(A, Q, 3, backend)
    with pytest.raises(ValueError, match=r"need 3 features of A's dtype float64"):
        knn_exact.query(A, Q[:, :2], 3, backend)
    with pytest.raises(ValueError, match="n_neighbors=31 must be between 1 and the 30 points"):
        knn_exact.query(A, Q[:1], 31, backend)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_query_of_points_at_the_data_mean_finds_the_point_itself(device, dtype):
    """A new point equal to a training point at A's mean (both of norm 0 once centred) is at distance 0 from it:
    the error interval of that pair must not be flipped (a mutant subtracting the absolute error from the norms
    dropped the pair and gave the next point, 0.5 away). Against cdist in float64; the overflow check's message."""
    A = np.array([[0, 0], [1, 0], [-1, 0], [0, 1], [0, -1]], dtype=dtype)
    Q = np.array([[0, 0], [0.5, 0.5]], dtype=dtype)
    got = query(A, Q, 1, device, "fp32", np.zeros(len(A)))
    check_query(got, query_reference(Q, A, 1, np.zeros(len(A))), len(A))
    assert got[1][0, 0] == 0.0


def test_error_bound_refuses_too_many_features_and_names_them():
    """The certified search's bound grows with d; where it would reach the precision itself it refuses, naming d
    and the mode (fp32: at d = 2**23), and just below it is finite and positive."""
    with pytest.raises(ValueError, match=r"d=8388608 features are too many for a certified search in fp32 "
                                         r"\(float32\)"):
        knn_exact.error_bound("fp32", 2 ** 23, np.float32)
    c, e_abs = knn_exact.error_bound("fp32", 2 ** 23 - 1, np.float32)
    assert np.isfinite(c) and c > 0 and np.isfinite(e_abs) and e_abs >= 0


def test_features_beyond_float64_squares_raise():
    with pytest.raises(ValueError, match="squared distances of the features"):
        knn_exact.search(np.array([[1e154], [-1e154], [0.9e154]]), 2, resolve_device("cpu"))


def test_3xtf32_bound_counts_three_products_per_feature():
    """3xTF32 sums three products per feature (hi*hi + hi*lo + lo*hi), so its bound reaches the precision at a third
    of fp32's feature count or below: 1.4 million features are refused in 3xtf32 and accepted in fp32."""
    with pytest.raises(ValueError, match=r"d=1400000 features are too many for a certified search in 3xtf32"):
        knn_exact.error_bound("3xtf32", 1_400_000, np.float32)
    c_fp32, _ = knn_exact.error_bound("fp32", 3_000_000, np.float32)
    c_3x, _ = knn_exact.error_bound("3xtf32", 300_000, np.float32)
    assert np.isfinite(c_fp32) and c_3x >= knn_exact.error_bound("fp32", 300_000, np.float32)[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [1, 5, 33, 784])
def test_pair_distances_are_float64_exact_to_rounding_and_the_same_bits_in_any_batch(device, dtype, d, rng):
    """cross_distances and exact_distances: each pair within a few float64 ulps of the exactly rounded distance
    of the float64 values (math.fsum), offsets of 1e6 and scales of 2^-p included; a pair's bits do not depend on
    how many pairs a call holds (on an H100 CuPy's row sums of a gathered block did: two landmark fits of one seed
    differed in the last bits), and rows and their batches give the same bits as exact_distances."""
    import math

    backend = resolve_device(device)
    Q = (rng.standard_normal((30, d)) + 1e6).astype(dtype)
    A = (rng.standard_normal((50, d)) + 1e6).astype(dtype)
    rows = rng.integers(0, 30, 400)
    cols = rng.integers(0, 50, 400)
    p = 3
    want = np.array([math.fsum(((Q[i].astype(np.float64) - A[j].astype(np.float64)) * 2.0 ** -p) ** 2)
                     for i, j in zip(rows, cols)])
    with backend.activate():
        Qd, Ad = backend.asarray(Q), backend.asarray(A)
        whole = backend.to_host(knn_exact.cross_distances(Qd, Ad, backend.asarray(rows), backend.asarray(cols), p,
                                                          backend))
        parts = np.concatenate([backend.to_host(knn_exact.cross_distances(
            Qd, Ad, backend.asarray(rows[s]), backend.asarray(cols[s]), p, backend))
            for s in (slice(0, 1), slice(1, 37), slice(37, 400))])
        index = rng.integers(-1, 50, (20, 7))
        own = rng.integers(0, 50, 20)
        exact = backend.to_host(knn_exact.exact_distances(Ad, backend.asarray(own), backend.asarray(index), p,
                                                          backend))
        single = backend.to_host(knn_exact.cross_distances(Ad, Ad, backend.asarray(np.repeat(own, 7)),
                                                           backend.asarray(np.maximum(index, 0).ravel()), p, backend))
    np.testing.assert_array_equal(whole, parts)
    np.testing.assert_allclose(whole, want, rtol=(d + 2) * np.finfo(np.float64).eps, atol=0)
    np.testing.assert_array_equal(exact, np.where(index >= 0, single.reshape(index.shape), np.inf))
