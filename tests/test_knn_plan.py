"""The neighbour searches' route choices (issue 27 point 6) and their tie order and rounding margin (point 8),
against a float64 brute-force reference (scipy's cdist of the float64 values, ties to the lower index):

- the bounded search's plan keeps the brute-force search on rank-1 data (its float32 bounds' rounding margin
  exceeds the neighbour distances there), and a bounded search that the plan misjudged is measured after its
  candidate walks and abandoned for the brute-force search, exact;
- the brute-force search predicts from a sample of rows that the working precision certifies too few rows of
  rank-1 data and searches them in float64 from the start; long candidate lists take row tiles with a selection
  on the CPU (not sorted lists); both exact on both devices;
- the CPU's selection and re-ranking keep (value, column) order under many ties;
- ties (integer-valued points, many duplicates, equal distances across and within blocks) go to the lower index
  in both searches, each forced, in products that divide nothing; the float32 bounded search stays exact where
  its bounds' rounding exceeds the neighbour distances (without its margin it is not).
"""

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from kkmgpu.backend.device import resolve_device
from kkmgpu.kernels import knn_bounds, knn_cpu, knn_exact
from reference import nearest_neighbors as reference


def rank_one(rng, n, d=64):
    return np.outer(rng.normal(size=n), rng.normal(size=d)).astype(np.float32)


def on_a_line(rng, n=600, d=40):
    """float32 points on a line: 9 in 10 within 1e-4 of one point (neighbour distances about 1e-13 of the
    squared norms of the centred points, under float32's rounding; float64's certifies them), the rest spread
    along it, plus noise 1e-7 off the line."""
    t = np.where(np.arange(n) % 10 == 0, rng.normal(size=n), 1.0 + 1e-4 * rng.normal(size=n))
    return (np.outer(t, rng.normal(size=d)) + 1e-7 * rng.normal(size=(n, d))).astype(np.float32)


def exact_search(X, k, device, **kwargs):
    backend = resolve_device(device)
    report = {}
    index, sq = knn_exact.search(backend.asarray(X), k, backend, report=report, **kwargs)
    return backend.to_host(index), backend.to_host(sq), report


def test_plan_keeps_the_brute_force_search_on_rank_one_data(rng):
    """Points on a line (n = 9000, 64 float32 features): the bounds' rounding margin covers all points, so the
    plan (which counts the points within each sampled row's distance plus that margin) does not prune."""
    assert knn_bounds.plan(rank_one(rng, 9000), 10)[0] is None


def test_a_misjudged_bounded_search_falls_back_to_brute_force(rng, monkeypatch):
    """A plan that chose pruning on rank-1 data: after the candidate walks nearly no row is certified, so the
    search measures that walking the rest would cost more than the brute-force search, abandons it, and is
    exact."""
    X = on_a_line(rng, 1500, 64)
    monkeypatch.setattr(knn_bounds, "MIN_ROWS", 1000)
    real_plan = knn_bounds.plan
    monkeypatch.setattr(knn_bounds, "plan", lambda A, k, **kw: ((16, k + 2), real_plan(A, k, **kw)[1]))
    report = {}
    index, sq = knn_bounds.nearest_neighbors(X, 6, distances=True, report=report)
    assert report["route"] == "brute force" and report["abandoned"]["certified"] < 0.5
    want_index, want_sq = reference(X, 6)
    np.testing.assert_array_equal(index, want_index)
    np.testing.assert_allclose(sq, want_sq, rtol=1e-12, atol=0)


def test_brute_force_search_of_points_on_a_line_is_in_float64(device, rng):
    """float32 points on a line: the sampled rows predict that float32 candidates certify few rows; every row is
    searched with float64 keys instead (none from float32 candidates), and the result is exact."""
    X = on_a_line(rng)
    index, sq, report = exact_search(X, 7, device)
    assert report["predicted_certified"] < knn_exact.CERTIFY_MIN
    assert report["candidates_certified"] == 0.0 and report["float64_rows"] == 600
    want_index, want_sq = reference(X, 7)
    np.testing.assert_array_equal(index, want_index)
    np.testing.assert_allclose(sq, want_sq, rtol=1e-12, atol=0)


def test_long_lists_take_row_tiles_on_the_cpu(device, rng, monkeypatch):
    """150 neighbours (lists of 214 candidates, beyond knn_cpu.LIST_MAX and the GPU kernel's MAX_NEIGHBORS) of
    3-d points, many equidistant (a grid of integers): the row tiles' selection, not sorted lists; exact."""
    monkeypatch.setattr(knn_cpu, "search", lambda *a, **kw: pytest.fail("sorted lists of 214 candidates"))
    X = rng.integers(0, 9, size=(700, 3)).astype(np.float32) + rng.normal(scale=0.01, size=(700, 3)).astype(
        np.float32) * (rng.random((700, 1)) < 0.5)
    index, sq, report = exact_search(X, 150, device)
    assert report["spares"] == knn_exact.MAX_SPARES
    want_index, want_sq = reference(X, 150)
    np.testing.assert_array_equal(index, want_index)
    np.testing.assert_allclose(sq, want_sq, rtol=1e-12, atol=0)


@pytest.mark.parametrize("n, m", [(40, 39), (300, 7), (2000, 450)])
def test_selection_and_reranking_keep_value_then_column_order(n, m, rng):
    """select_rows keeps each row's m least (value, column) pairs; nearest_first orders (dist, index) pairs,
    ties to the lower index: many ties (small integers), the row's own entry +inf, m up to n - 1."""
    D = rng.integers(0, 12, size=(25, n)).astype(np.float32)
    D[np.arange(25), np.arange(25)] = np.inf
    keys = np.empty((25, m), dtype=np.float32)
    index = np.empty((25, m), dtype=np.int64)
    knn_cpu.select_rows(D, m, keys, index)
    want = np.argsort(D, axis=1, kind="stable")[:, :m]
    np.testing.assert_array_equal(np.sort(index, axis=1), np.sort(want, axis=1))
    np.testing.assert_array_equal(keys, np.take_along_axis(D, index, axis=1))
    shuffled = np.stack([rng.permutation(n)[:m] for _ in range(25)])
    dist = rng.integers(0, 5, size=(25, m)).astype(np.float64)
    got_index, got_dist = knn_cpu.nearest_first(shuffled, dist, min(m, 9))
    order = np.stack([np.lexsort((shuffled[t], dist[t]))[:min(m, 9)] for t in range(25)])
    np.testing.assert_array_equal(got_index, np.take_along_axis(shuffled, order, axis=1))
    np.testing.assert_array_equal(got_dist, np.take_along_axis(dist, order, axis=1))


def ties(rng, n=400, d=4):
    """Integer points in a small box (every GEMM exact, many equal distances) with runs of duplicates, shuffled so
    that copies and equidistant points sit in different blocks."""
    X = rng.integers(0, 4, size=(n, d)).astype(np.float32)
    X[rng.choice(n, 60, replace=False)] = X[rng.choice(n, 60)]
    return X


@pytest.mark.parametrize("block", [37, 400])
def test_lists_keep_the_lower_index_of_equal_keys(device, block, rng):
    """The search's lists by (key, index), exact keys: the reference's order across blocks (of 37 rows on the CPU,
    148 on a GPU), the transposed pass (on the CPU also panels of 11 columns and the merge of two workers' lists),
    and within one block."""
    X = ties(rng)
    if device == "cpu":
        index = knn_cpu.search(X, 12, block=block, panel=11 if block < 400 else 256, workers=2)[1]
    else:
        from kkmgpu.kernels import knn_cuda

        backend = resolve_device(device)
        index = backend.to_host(knn_cuda.search(backend.asarray(X), 12, block=4 * block if block < 400 else block)[1])
    np.testing.assert_array_equal(index, reference(X, 12)[0])


@pytest.mark.parametrize("route", ["brute force", "float64", "direct"])
def test_exact_search_keeps_the_lower_index_of_ties(device, route, rng, monkeypatch):
    """The certified brute-force search on tied points, each way a row can end: its candidates, the float64
    search (the prediction forced below), the direct distances (no spares, so no row certifies): the
    reference's neighbours in order."""
    if route == "float64":
        monkeypatch.setattr(knn_exact, "CERTIFY_MIN", 2.0)
    if route == "direct":
        monkeypatch.setattr(knn_exact, "spares", lambda k: 0)
    X = ties(rng)
    index, sq, report = exact_search(X, 12, device, block=150)   # blocks that divide nothing
    np.testing.assert_array_equal(index, reference(X, 12)[0])
    if route == "direct":
        assert report["direct_rows"] == 400


@pytest.mark.parametrize("n_candidates", [14, 60])
def test_bounded_search_keeps_the_lower_index_of_ties(n_candidates, rng):
    """The bounded search on tied points (one principal axis: equidistant points have different bounds, so they
    are walked out of index order): the reference's neighbours in order, from the lists and from the walks of
    all points."""
    X = ties(rng)
    index = knn_bounds.nearest_neighbors(X, 12, prune=True, axes=1, n_candidates=n_candidates)
    np.testing.assert_array_equal(index, reference(X, 12)[0])


def test_float32_bounded_search_needs_its_rounding_margin(rng, monkeypatch):
    """float32 points in tight groups along a line: neighbour distances (about 1e-8 of the squared norms) below
    the float32 bounds' rounding. With the margin the search is exact; without it, rows stop their walks early
    and miss neighbours (so this test sees the margin)."""
    X = on_a_line(rng)
    want = reference(X, 4)[0]
    np.testing.assert_array_equal(knn_bounds.nearest_neighbors(X, 4, prune=True, axes=2, n_candidates=6), want)
    margin = knn_bounds._margin
    monkeypatch.setattr(knn_bounds, "_margin", lambda *a: 0.0 * margin(*a))
    wrong = knn_bounds.nearest_neighbors(X, 4, prune=True, axes=2, n_candidates=6) != want
    assert wrong.any(axis=1).sum() >= 1


def test_offers_in_any_order_keep_the_lower_index_of_equal_keys(device, rng):
    """Equal keys offered out of index order (the later columns first, as the threaded search's workers and the
    GPU's transposed products may): offer_block on both devices, the CPU's transposed pass and its merge of two
    workers' lists keep the lower index, as one pass in index order does."""
    from kkmgpu.kernels.knn_cpu import _merge, _offer_columns

    keys = rng.integers(0, 6, size=(30, 40)).astype(np.float64)
    G = np.concatenate([keys, keys], axis=1) * -0.5           # columns 40-79 repeat columns 0-39's keys
    want = np.argsort(-2.0 * G, axis=1, kind="stable")[:, :7] + 100
    backend = resolve_device(device)
    if device == "cpu":
        offer = knn_cpu.offer_block
    else:
        from kkmgpu.kernels import knn_cuda

        offer = knn_cuda.offer_block
    best, arg = backend.asarray(np.full((30, 7), np.inf)), backend.asarray(np.full((30, 7), -1, dtype=np.int64))
    for c0 in (40, 0):   # the repeated keys' higher indices first
        offer(backend.asarray(np.ascontiguousarray(G[:, c0:c0 + 40])), backend.asarray(np.zeros(40)), 0,
              100 + c0, best, arg)
    np.testing.assert_array_equal(backend.to_host(arg), want)
    if device == "cpu":
        best_t, arg_t = np.full((300, 7), np.inf), np.full((300, 7), -1, dtype=np.int64)
        for c0 in (40, 0):   # the same keys through the transposed pass: rows 100 + c of the search
            _offer_columns(np.ascontiguousarray(G[:, c0:c0 + 40].T), np.zeros(40), 100 + c0, 0, best_t, arg_t)
        np.testing.assert_array_equal(arg_t[:30], want)
        halves = []
        for c0 in (40, 0):   # two workers' lists, the one with the lower indices merged in last
            b, a = np.full((30, 7), np.inf), np.full((30, 7), -1, dtype=np.int64)
            knn_cpu.offer_block(np.ascontiguousarray(G[:, c0:c0 + 40]), np.zeros(40), 0, 100 + c0, b, a)
            halves.append((b, a))
        _merge(*halves[0], *halves[1])
        np.testing.assert_array_equal(halves[0][1], want)
