"""Affinity graphs (kkmgpu/kernels/graphs.py) against scikit-learn's kneighbors_graph and a float64 reference.

- the symmetric and mutual kNN graphs equal scikit-learn's connectivity graph G symmetrised as (G + G^T) / 2
  (SpectralClustering's affinity, without self-loops) and min(G, G^T), on both devices;
- the self-tuning graph (Zelnik-Manor and Perona) equals exp(-d_ij^2 / (sigma_i sigma_j)) on the union of the
  neighbour lists, sigma_i the distance to the 7th neighbour, computed with scipy's cdist in float64;
- no self-loops, symmetric, row tiles smaller than n give the same graph, duplicates are neighbours at distance 0,
  and bad n_neighbors or kinds raise with the rule;
- new points' affinities to the training points (predict's) equal those of scipy's cdist in float64 for every kind.
"""

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from conftest import require_cuda

from kkmgpu.backend.device import resolve_device
from kkmgpu.kernels import blocks
from kkmgpu.kernels.graphs import affinity_graph, nearest_neighbors


def dense(graph, backend):
    return np.asarray(backend.to_host(graph.toarray()) if backend.is_gpu else graph.toarray())


def reference_self_tuning(X, n_neighbors, scale_neighbor=7):
    D = cdist(X, X, "sqeuclidean")
    np.fill_diagonal(D, np.inf)
    order = np.argsort(D, axis=1, kind="stable")
    n = X.shape[0]
    sigma = np.sqrt(D[np.arange(n), order[:, scale_neighbor - 1]])
    W = np.zeros((n, n))
    for i in range(n):
        for j in order[i, :n_neighbors]:
            W[i, j] = np.exp(-D[i, j] / (sigma[i] * sigma[j]))
    return np.maximum(W, W.T)


@pytest.mark.parametrize("kind", ["knn", "mutual_knn"])
def test_knn_graphs_equal_scikit_learns(device, kind, rng):
    neighbors = pytest.importorskip("sklearn.neighbors")
    X = rng.normal(size=(400, 6))
    backend = resolve_device(device)
    graph = affinity_graph(backend.asarray(X), 10, kind, backend)
    G = neighbors.kneighbors_graph(X, 10, include_self=False)
    expected = (0.5 * (G + G.T) if kind == "knn" else G.minimum(G.T)).toarray()
    if kind == "mutual_knn":  # a point left without an edge keeps the one to its nearest neighbour
        nearest = neighbors.NearestNeighbors(n_neighbors=2).fit(X).kneighbors(X, return_distance=False)[:, 1]
        alone = np.flatnonzero(expected.sum(axis=1) == 0)
        assert alone.size > 0  # the case is exercised
        expected[alone, nearest[alone]] = expected[nearest[alone], alone] = 1.0
    got = dense(graph, backend)
    np.testing.assert_array_equal(got, expected)
    assert np.all(np.diag(got) == 0) and np.array_equal(got, got.T)


def test_self_tuning_graph_equals_the_reference(device, rng):
    X = rng.normal(size=(300, 4)) * rng.uniform(0.2, 3.0, size=(300, 1))  # varied local density
    backend = resolve_device(device)
    graph = affinity_graph(backend.asarray(X), 12, "self_tuning", backend)
    np.testing.assert_allclose(dense(graph, backend), reference_self_tuning(X, 12), rtol=1e-10, atol=1e-14)


def test_tiles_smaller_than_n_give_the_same_graph(monkeypatch, rng):
    X = rng.normal(size=(257, 3))
    backend = resolve_device("cpu")
    whole = affinity_graph(backend.asarray(X), 5, "self_tuning", backend).toarray()
    monkeypatch.setattr(blocks, "TILE_BYTES", 257 * 24 * 7)  # 7-row tiles
    from kkmgpu.kernels import knn_exact

    monkeypatch.setattr(knn_exact, "_chunk", lambda n_cols, itemsize, backend: 7)
    np.testing.assert_array_equal(affinity_graph(backend.asarray(X), 5, "self_tuning", backend).toarray(), whole)


@pytest.mark.parametrize("block", [3, 7, 64, 2048])
def test_cpu_block_search_equals_the_float64_reference(block, rng):
    """The CPU search over blocks on and above the diagonal (each product serving its rows and its columns) finds
    the same neighbours as a float64 cdist, for blocks of three rows, blocks that do not divide n, and one block."""
    from kkmgpu.kernels.knn_cpu import nearest_neighbors as nearest_neighbors_cpu

    X = rng.normal(size=(203, 4))
    D = cdist(X, X, "sqeuclidean")
    np.fill_diagonal(D, np.inf)
    expected = np.sort(np.argsort(D, axis=1)[:, :9], axis=1)
    np.testing.assert_array_equal(np.sort(nearest_neighbors_cpu(X, 9, block=block), axis=1), expected)


def test_cpu_column_pass_equals_offering_the_transposed_block(rng):
    """The CPU search serves the rows of J from the columns of G in strips (G^T never formed): the same lists as
    offer_block on G^T, with lists already holding candidates, tied keys, and strips that do not divide m."""
    from kkmgpu.kernels.knn_cpu import STRIP, _offer_columns, offer_block

    n, k = 400, 6
    G = rng.integers(-3, 4, size=(90, 2 * STRIP + 13)).astype(np.float64)   # small integers: many tied keys
    row_sq = rng.integers(0, 6, size=90).astype(np.float64)
    best = np.sort(rng.integers(-2, 8, size=(n, k)).astype(np.float64), axis=1)
    best[::5] = np.inf                                                       # some lists still empty
    arg = np.where(np.isinf(best), -1, rng.integers(0, n, size=(n, k)))
    want = best.copy(), arg.copy()
    offer_block(np.ascontiguousarray(G.T), row_sq, 150, 40, *want)
    got = best.copy(), arg.copy()
    _offer_columns(G, row_sq, 40, 150, *got)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_cpu_block_search_equals_the_row_tile_route(rng):
    """The CPU twin and the GPU route for lists longer than knn_cuda's (row tiles of GEMM-form keys,
    argpartition; run here with NumPy) keep the same candidates of float32 features, with the same keys."""
    from kkmgpu.kernels.knn_cpu import search
    from kkmgpu.kernels.knn_exact import row_tile_candidates

    A = rng.normal(size=(500, 12)).astype(np.float32)
    col_sq = rng.uniform(0.9, 1.0, size=500) * np.einsum("ij,ij->i", A, A, dtype=np.float64)  # shifted norms
    keys, index = search(A, 15, block=96, col_sq=col_sq)
    tile_keys, tile_index = row_tile_candidates(A, 15, col_sq, "fp32", resolve_device("cpu"))
    order = np.argsort(tile_keys, axis=1, kind="stable")
    np.testing.assert_array_equal(np.sort(index, axis=1), np.sort(tile_index, axis=1))
    np.testing.assert_allclose(np.take_along_axis(tile_keys, order, axis=1), keys, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_neighbors", [9, 70])
def test_nearest_neighbors_nearest_first_equal_the_float64_reference(device, n_neighbors, rng, monkeypatch):
    """On a GPU both routes, the knn_cuda kernel for candidate lists up to its MAX_NEIGHBORS (64) and row tiles
    with argpartition beyond, like the CPU search, keep a float64 cdist's neighbours, nearest first, with their
    float64 distances."""
    from kkmgpu.kernels import knn_cuda, knn_exact

    searched = []
    search = knn_cuda.search
    monkeypatch.setattr(knn_cuda, "search", lambda *a, **kw: searched.append(1) or search(*a, **kw))
    X = rng.normal(size=(180, 5))
    backend = resolve_device(device)
    index, sq = nearest_neighbors(backend.asarray(X), n_neighbors, backend)
    D = cdist(X, X, "sqeuclidean")
    np.fill_diagonal(D, np.inf)
    expected = np.argsort(D, axis=1, kind="stable")[:, :n_neighbors]
    np.testing.assert_array_equal(backend.to_host(index), expected)
    np.testing.assert_allclose(backend.to_host(sq), np.take_along_axis(D, expected, axis=1), rtol=1e-12)
    assert len(searched) == (backend.is_gpu and n_neighbors + knn_exact.MIN_SPARES <= knn_cuda.MAX_NEIGHBORS)


@pytest.mark.gpu
def test_gpu_search_blocks_fit_the_work_budget(monkeypatch, rng):
    """The GPU search holds a block x block product and its transpose within the work budget: smaller blocks
    there, the same neighbours."""
    require_cuda()
    from kkmgpu.kernels import knn_cuda

    blocks_used = []
    search = knn_cuda.search
    monkeypatch.setattr(knn_cuda, "search",
                        lambda A, k, block, **kw: blocks_used.append(block) or search(A, k, block, **kw))
    monkeypatch.setattr(knn_cuda, "work_bytes", lambda cap, backend, minimum=1: max(minimum, 2 * 40 * 40 * 8 + 9))
    X = rng.normal(size=(150, 3))
    backend = resolve_device("cuda")
    index, _ = nearest_neighbors(backend.asarray(X), 6, backend, "fp32")
    assert blocks_used == [40]
    np.testing.assert_array_equal(backend.to_host(index), nearest_neighbors(X, 6, resolve_device("cpu"))[0])


@pytest.mark.parametrize("kind", ["knn", "mutual_knn", "self_tuning"])
def test_graph_from_a_longer_neighbour_list_is_the_same(kind, rng):
    """n_neighbors='search' searches once for its largest value: a graph built from the first n_neighbors of a
    longer list equals the graph built from its own search."""
    from kkmgpu.kernels.graphs import build_graph

    A = rng.normal(size=(300, 5))
    backend = resolve_device("cpu")
    longer = nearest_neighbors(A, 30, backend)
    for n_neighbors in (3, 10, 30):
        np.testing.assert_array_equal(build_graph(A, n_neighbors, kind, backend, neighbors=longer).graph.toarray(),
                                      affinity_graph(A, n_neighbors, kind, backend).toarray())
    with pytest.raises(ValueError, match="do not hold the 31 nearest of 300 points"):
        build_graph(A, 31, kind, backend, neighbors=longer)


def test_nearest_neighbors_sorted_and_duplicates_at_zero():
    X = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [3.0, 0.0], [7.0, 0.0]])
    backend = resolve_device("cpu")
    index, sq = nearest_neighbors(backend.asarray(X), 2, backend)
    assert index[0].tolist() == [1, 2] and index[1].tolist() == [0, 2]
    np.testing.assert_array_equal(sq[0], [0.0, 1.0])
    np.testing.assert_array_equal(sq[4], [16.0, 36.0])
    assert np.all(np.diff(sq, axis=1) >= 0)


def test_prepared_float32_features(rng):
    """The graphs take features prepared as fit prepares them (float32, centred): same graph as from X."""
    X = rng.normal(size=(200, 5)) + 1e3
    backend = resolve_device("cpu")
    from kkmgpu.kernels import spec as kernel_spec

    spec = kernel_spec.with_center(kernel_spec.resolve_kernel("rbf", gamma=1.0, X=X, xp=np), X, np, np.float32)
    A = blocks.prepare_features(X, spec, backend, np.dtype(np.float32))
    got = affinity_graph(A, 8, "knn", backend).toarray()
    neighbors = pytest.importorskip("sklearn.neighbors")
    G = neighbors.kneighbors_graph(X, 8, include_self=False)
    assert np.mean(got == (0.5 * (G + G.T)).toarray()) > 0.999  # float32 rounding may swap a tied 8th neighbour


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_neighbors=0, kind="knn"), "n_neighbors=0 must be between 1 and n_samples - 1 = 19"),
    (dict(n_neighbors=20, kind="knn"), "n_neighbors=20 must be between 1 and n_samples - 1 = 19"),
    (dict(n_neighbors=3, kind="rbf"), "affinity='rbf' is not one of 'knn', 'mutual_knn', 'self_tuning'"),
    (dict(n_neighbors=3, kind="self_tuning", scale_neighbor=25), "scale_neighbor=25 must be between 1 and"),
])
def test_bad_arguments(kwargs, match):
    backend = resolve_device("cpu")
    X = np.random.default_rng(0).normal(size=(20, 2))
    with pytest.raises(ValueError, match=match):
        affinity_graph(backend.asarray(X), backend=backend, **kwargs)


@pytest.mark.parametrize("kind", ["knn", "mutual_knn", "self_tuning"])
def test_query_affinity_equals_the_float64_reference(device, kind, rng):
    """New points' affinities to the training points (predict's), on float32 features 300 from the origin, the
    search in TF32 (the CPU's float32), in tiles of 11 rows: j among the point's 6 nearest (ties included), the
    point nearer than j's 6th neighbour, weights by kind (self-tuning: the 7th neighbours' scales), and the
    nearest training point, all as scipy's cdist of the same values in float64 gives them."""
    from kkmgpu.kernels.graphs import build_graph, query_affinity

    backend = resolve_device(device)
    A = (rng.normal(size=(160, 32)) + 300.0).astype(np.float32)
    Q = (A[:50] + rng.normal(scale=0.3, size=(50, 32))).astype(np.float32)
    graph = build_graph(backend.asarray(A), 6, kind, backend, precision="tf32")
    W, nearest = query_affinity(graph, backend.asarray(A), backend.asarray(Q), backend, rows=11)
    A64, Q64 = A.astype(np.float64), Q.astype(np.float64)
    D_train = cdist(A64, A64, "sqeuclidean")
    np.fill_diagonal(D_train, np.inf)
    D_train.sort(axis=1)
    D = cdist(Q64, A64, "sqeuclidean")
    D_sorted = np.sort(D, axis=1)
    own, other = D <= D_sorted[:, 5:6], D < D_train[None, :, 5]
    if kind == "knn":
        want = 0.5 * own + 0.5 * other
    elif kind == "mutual_knn":
        want = (own & other).astype(np.float64)
    else:
        scale = np.sqrt(D_sorted[:, 6:7]) * np.sqrt(D_train[None, :, 6])
        want = np.where(own | other, np.exp(-D / scale), 0.0)
    np.testing.assert_allclose(dense(W, backend), want, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(backend.to_host(nearest), np.argmin(D, axis=1))
    assert other.sum() > 0 and (own & ~other).sum() > 0    # both directions occur


def test_the_smallest_graphs_allowed_equal_the_references(device, rng):
    """The validators' boundaries: one neighbour per point (knn, mutual_knn) and the self-tuning graph of exactly 8
    points (its 7th neighbour, the local scale, is then every point's farthest) are built, equal to the references."""
    neighbors = pytest.importorskip("sklearn.neighbors")
    backend = resolve_device(device)
    X = rng.normal(size=(60, 3))
    G = neighbors.kneighbors_graph(X, 1, include_self=False)
    np.testing.assert_array_equal(dense(affinity_graph(backend.asarray(X), 1, "knn", backend), backend),
                                  (0.5 * (G + G.T)).toarray())
    mutual = dense(affinity_graph(backend.asarray(X), 1, "mutual_knn", backend), backend)
    assert np.all(mutual.sum(axis=1) > 0) and np.array_equal(mutual, mutual.T)
    np.testing.assert_array_equal(mutual > 0, (G + G.T).toarray() > 0)  # each keeps its nearest neighbour's edge
    X8 = rng.normal(size=(8, 3))
    np.testing.assert_allclose(dense(affinity_graph(backend.asarray(X8), 3, "self_tuning", backend), backend),
                               reference_self_tuning(X8, 3), rtol=1e-10, atol=1e-14)


def test_the_graph_keeps_the_gemm_precision_asked(rng):
    """build_graph records the precision its neighbour search was asked for (predict and score search again in it),
    and an unknown precision is refused by name."""
    from kkmgpu.kernels.graphs import build_graph

    backend = resolve_device("cpu")
    X = backend.asarray(rng.normal(size=(40, 3)).astype(np.float32))
    assert build_graph(X, 5, "knn", backend, precision="fp32").precision == "fp32"
    assert build_graph(X, 5, "knn", backend, precision="tf32").precision == "tf32"
    with pytest.raises(ValueError, match="gemm_precision='bf16' is not one of"):
        affinity_graph(X, 5, "knn", backend, precision="bf16")
