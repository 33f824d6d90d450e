"""The CPU's exact nearest-neighbour search with principal-component lower bounds (kkmgpu/kernels/knn_bounds.py)
and the threaded brute-force search under it (kkmgpu/kernels/knn_cpu.py ``search``), against a float64 cdist.

- the bounded search keeps a float64 cdist's neighbours, nearest first (ties to the lower index), with their
  float64 distances: when every row is certified from its candidate list, when none is (each row then walks all
  points within its bound), when the list holds every point, with duplicated points, in float32 far from the
  origin and in float64;
- it stays exact on float32 data scaled by 1e20 and 1e-25 (squared norms beyond float32's range), through a
  power of two;
- its plan prunes data whose variance sits in a few directions and keeps the brute-force search for isotropic
  data, the same when its sampled rows are taken a few at a time; with prune="auto" small inputs take the
  certified brute-force search, exact as well;
- the threaded search gives the same lists for any number of workers and any product shape.
"""

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from kkmgpu.kernels import knn_bounds, knn_cpu


def low_rank(rng, n, d, rank, noise=0.05, dtype=np.float64):
    X = rng.normal(size=(n, rank)) @ (rng.normal(size=(rank, d)) * np.linspace(3, 0.5, rank)[:, None])
    return (X + noise * rng.normal(size=(n, d))).astype(dtype)


def reference(X, k):
    """(index, sq): each row's k nearest other rows by float64 distance of X's values, ties to the lower index."""
    X64 = X.astype(np.float64)
    D = cdist(X64, X64, "sqeuclidean")
    np.fill_diagonal(D, np.inf)
    index = np.argsort(D, axis=1, kind="stable")[:, :k]
    return index, np.take_along_axis(D, index, axis=1)


def check(X, k, rtol, **kwargs):
    index, sq = knn_bounds.nearest_neighbors(X, k, prune=True, distances=True, **kwargs)
    want_index, want_sq = reference(X, k)
    np.testing.assert_array_equal(index, want_index)
    np.testing.assert_allclose(sq, want_sq, rtol=rtol, atol=0)


@pytest.mark.parametrize("n_candidates", [40, 10, 2000])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bounded_search_equals_the_float64_reference(n_candidates, dtype, rng):
    """40 candidates for 10 neighbours certify most rows from their lists; 10 certify none (every row walks all
    points whose bound is within its 10th distance); 2000 >= n - 1 makes every point every row's candidate."""
    X = low_rank(rng, 700, 60, 6, dtype=dtype)
    check(X, 10, rtol=1e-12, axes=8, n_candidates=n_candidates)


def test_both_routes_are_taken(rng, monkeypatch):
    """With few candidates some rows are certified from their lists and the others walk all points; the report
    counts them."""
    X = low_rank(rng, 600, 50, 5)
    walked = []
    walk_all = knn_bounds._walk_all
    monkeypatch.setattr(knn_bounds, "_walk_all", lambda A, rows, *a: walked.append(rows.size) or walk_all(A, rows, *a))
    check(X, 8, rtol=1e-12, axes=4, n_candidates=12)
    assert 0 < sum(walked) < 600
    report, first = {}, sum(walked)
    knn_bounds.nearest_neighbors(X, 8, prune=True, axes=4, n_candidates=12, report=report)
    assert report["route"] == "bounded" and report["walked_all_rows"] == first == sum(walked) - first
    assert report["certified"] == 1 - first / 600


def test_duplicates_are_neighbours_at_zero_in_index_order(rng):
    X = low_rank(rng, 300, 40, 4)
    X = np.concatenate([X, X[:50], X[:20]])      # rows 0-19 three times, 20-49 twice
    check(X, 6, rtol=1e-12, axes=5, n_candidates=9)


def test_rounding_margin_keeps_float32_far_from_the_origin_exact(rng):
    """float32 points 10^3 from the origin and about 10^-2 apart, where GEMM-form distances of the raw points
    would lose nearly every digit: the bounds are of the centred points, and the search stays exact."""
    X = (1e3 + 1e-2 * low_rank(rng, 500, 70, 5)).astype(np.float32)
    index, _ = knn_bounds.nearest_neighbors(X, 7, prune=True, distances=True, axes=6, n_candidates=12)
    np.testing.assert_array_equal(index, reference(X, 7)[0])


def test_plan_prunes_low_rank_data_and_not_isotropic_data(rng):
    choice, _ = knn_bounds.plan(low_rank(rng, 9000, 256, 12, dtype=np.float32), 10)
    assert choice is not None
    axes, n_candidates = choice
    assert axes in knn_bounds.GRID and axes <= 128 and n_candidates > 10
    choice, _ = knn_bounds.plan(rng.normal(size=(9000, 256)).astype(np.float32), 10)
    assert choice is None


def test_plan_is_the_same_in_groups_of_sampled_rows(rng, monkeypatch):
    """The plan's (sampled rows, n) products are taken a few rows at a time on large n: the same choice."""
    X = low_rank(rng, 9000, 256, 12, dtype=np.float32)
    whole = knn_bounds.plan(X, 10, sample=64)[0]
    monkeypatch.setattr(knn_bounds, "PLAN_ENTRIES", 7 * 9000)   # groups of 7 rows: 9 full groups and one of 1
    assert knn_bounds.plan(X, 10, sample=64)[0] == whole


def test_planned_search_equals_the_reference(rng):
    """prune=True without axes: the plan's own choice, on data it prunes."""
    X = low_rank(rng, 2500, 200, 8, dtype=np.float32)
    choice, _ = knn_bounds.plan(X, 5)
    assert choice is not None
    check(X, 5, rtol=1e-12)


def test_auto_takes_the_brute_force_search_below_min_rows(rng, monkeypatch):
    """Below MIN_ROWS no plan: the certified brute-force search (kkmgpu/kernels/knn_exact.py), nearest first with
    float64 distances, here of float32 points far from the origin."""
    X = (50.0 + low_rank(rng, 400, 80, 6)).astype(np.float32)
    monkeypatch.setattr(knn_bounds, "plan", lambda *a, **kw: pytest.fail("planned below MIN_ROWS"))
    report = {}
    index, sq = knn_bounds.nearest_neighbors(X, 9, distances=True, report=report)
    want_index, want_sq = reference(X, 9)
    np.testing.assert_array_equal(index, want_index)
    np.testing.assert_allclose(sq, want_sq, rtol=1e-12, atol=0)
    assert report["route"] == "brute force" and report["candidates_certified"] > 0.5


@pytest.mark.parametrize("scale", [1e20, 1e-25])
def test_bounded_search_on_data_beyond_float32_range(scale, rng):
    """float32 data times 1e20 or 1e-25: their products overflow or underflow float32; the bounded search runs on
    the data times a power of two and returns the reference's neighbours and distances."""
    X = (low_rank(rng, 500, 60, 5) * scale).astype(np.float32)
    check(X, 8, rtol=1e-12, axes=6, n_candidates=16)


@pytest.mark.parametrize("block, panel, workers", [(2048, 256, 2), (64, 17, 3), (5, 2, 2), (100, 1000, 1)])
def test_threaded_search_is_the_same_for_any_workers_and_products(block, panel, workers, rng):
    """Each worker keeps lists of its own over a queue of block x panel products; merged, they equal one pass
    (and the float64 reference), including products that do not divide n and more workers than cores."""
    X = rng.normal(size=(503, 6))
    keys, index = knn_cpu.search(X, 9, block=block, panel=panel, workers=workers)
    want = reference(X, 9)[0]
    np.testing.assert_array_equal(index, want)                # (key, index) order: nearest first
    sq = np.einsum("ij,ij->i", X, X)
    np.testing.assert_allclose(keys + sq[:, None], reference(X, 9)[1], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rounding_margin_keeps_exact_ties_of_integer_grid_data(dtype):
    """Points on an integer grid in 2-D have many exactly tied distances; with one axis for the bounds the margin
    of a few units in the last place is all that keeps a tied point from being pruned (a margin of the wrong sign,
    4 (d + g - 8) u, dropped such ties: 100+ rows came out with the higher index). Ties to the lower index, as the
    float64 reference."""
    X = np.random.default_rng(7).integers(-20, 21, (400, 2)).astype(dtype)
    check(X, 5, rtol=0, axes=1, n_candidates=8)
