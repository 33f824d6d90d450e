"""The k-d tree route of the CPU's exact neighbour search (kkmgpu/kernels/knn_tree.py): the same lists and float64
distances as a float64 brute-force reference (ties to the lower index) on random points, lattices full of exact
ties, many duplicates, offsets and scales of 1e+-20, float32; None where it does not apply."""

import numpy as np
import pytest

from kkmgpu.kernels import knn_bounds, knn_tree


def reference(X, k):
    """float64 brute force: direct squared distances of X's values, self excluded, ties to the lower index."""
    V = np.asarray(X, dtype=np.float64)
    D = ((V[:, None, :] - V[None, :, :]) ** 2).sum(axis=2)
    np.fill_diagonal(D, np.inf)
    order = np.argsort(D, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(D, order, axis=1)


def check(X, k, *, certified_below=None):
    report = {}
    index, sq = knn_tree.search(X, k, report=report)
    want_index, want_sq = reference(X, k)
    np.testing.assert_array_equal(index, want_index)
    np.testing.assert_allclose(sq, want_sq, rtol=1e-13, atol=0)
    assert report["mode"] == "k-d tree"
    if certified_below is not None:   # the certificate refused the rows with ties at the boundary
        assert report["candidates_certified"] < certified_below and report["float64_rows"] > 0
    return report


@pytest.mark.parametrize("d", [1, 2, 3, knn_tree.MAX_FEATURES])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_random_points_equal_the_brute_force_reference(d, dtype):
    rng = np.random.default_rng(400 + d)
    X = (rng.normal(size=(500, d)) * rng.uniform(0.01, 10.0, size=d)).astype(dtype)
    report = check(X, 7)
    assert report["candidates_certified"] > 0.99


@pytest.mark.parametrize("k", [3, 4, 5, 9, 13])
def test_a_lattice_of_exact_ties_keeps_the_lower_indices(k):
    """Integer points, shuffled: every row has groups of 4 or 8 neighbours at exactly equal distances, which the
    n_neighbors-th often splits; the tree returns them in its own order and the float64 re-ranking keeps the
    lower indices, as the reference does."""
    g = np.arange(12, dtype=np.float64)
    X = np.stack(np.meshgrid(g, g), axis=-1).reshape(-1, 2)
    X = X[np.random.default_rng(401).permutation(X.shape[0])]
    check(X, k)


def test_more_duplicates_of_a_point_than_candidates():
    """40 copies of one point (more than n_neighbors + spares): a row may not find itself among the tree's
    answers; its lists are still the lowest-index copies at distance 0."""
    rng = np.random.default_rng(402)
    X = np.concatenate([np.tile([[3.0, -1.0]], (40, 1)), rng.normal(size=(200, 2))])
    X = X[rng.permutation(X.shape[0])]
    check(X, 10, certified_below=1.0)


@pytest.mark.parametrize("scale, offset", [(1e20, 0.0), (1e-20, 0.0), (1.0, 1e9), (1e-3, -1e7)])
def test_offsets_and_scales(scale, offset):
    rng = np.random.default_rng(403)
    X = rng.normal(size=(300, 2)) * scale + offset
    check(X, 6)


def test_where_it_does_not_apply_it_returns_none_and_the_search_is_still_exact():
    rng = np.random.default_rng(404)
    wide = rng.normal(size=(200, knn_tree.MAX_FEATURES + 1))
    assert knn_tree.search(wide, 5) is None
    few = rng.normal(size=(12, 2))
    assert knn_tree.search(few, 5) is None          # every other point a candidate anyway
    huge = rng.normal(size=(200, 2)) * 1e130        # norms knn_exact scales by a power of two
    assert knn_tree.search(huge, 5) is None
    report = {}
    index, sq = knn_bounds.nearest_neighbors(huge, 5, distances=True, report=report)
    assert report["route"] == "brute force"
    np.testing.assert_array_equal(index, reference(huge / 1e130, 5)[0])
    with pytest.raises(ValueError, match="NaN or infinity"):
        knn_tree.search(np.where(np.eye(20, 2) > 0, np.nan, 1.0) + rng.normal(size=(20, 2)), 3)


def test_the_graph_search_takes_the_tree_in_few_dimensions():
    rng = np.random.default_rng(405)
    X = rng.normal(size=(400, 2))
    report = {}
    index, sq = knn_bounds.nearest_neighbors(X, 10, distances=True, report=report)
    assert report["route"] == "k-d tree"
    want_index, want_sq = reference(X, 10)
    np.testing.assert_array_equal(index, want_index)
    np.testing.assert_allclose(sq, want_sq, rtol=1e-13, atol=0)
