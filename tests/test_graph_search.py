"""affinity="search" (issue 28): the graph family and its size chosen together, without labels, by the spectral
gap ratio lambda_{k+1} / lambda_k of the normalised Laplacian among graphs whose components are few and large.

Each candidate's criterion is held to a float64 dense eigendecomposition; the choice to the rule; the fit to the
fixed call on the chosen graph; and the hostile cases (offsets, float32, duplicates, disconnected data, tiny n)."""

import math
import warnings

import numpy as np
import pytest
import scipy.sparse as sps
from scipy.sparse.csgraph import connected_components

import kkmgpu
from kkmgpu.methods import graph_search


def _rings(rng, n=300):
    """Two concentric rings (k = 2) that only a graph separates."""
    t = rng.uniform(0, 2 * np.pi, n)
    r = np.where(np.arange(n) % 2 == 0, 1.0, 3.0)
    y = (np.arange(n) % 2).astype(int)
    return np.c_[r * np.cos(t), r * np.sin(t)] + rng.normal(scale=0.08, size=(n, 2)), y


def _reference(X, family, m, k):
    """(components, smallest, lambda_k, lambda_{k+1}) of the graph kkmgpu builds, in float64, dense."""
    from kkmgpu.backend.device import resolve_device
    from kkmgpu.kernels import graphs
    from kkmgpu.methods.graph_scale import graph_features

    backend = resolve_device("cpu", ())
    A = sps.csr_matrix(graphs.build_graph(graph_features(X, "float64", backend)[1], m, family, backend).graph)
    count, labels = connected_components(A, directed=False)
    d = np.asarray(A.sum(axis=1)).ravel()
    L = np.eye(len(X)) - (A.toarray() / np.sqrt(d)[:, None]) / np.sqrt(d)[None, :]
    lam = np.linalg.eigvalsh(L)
    return count, np.bincount(labels).min(), lam[k - 1], lam[k]


def test_each_candidate_scores_its_graph_and_the_largest_eligible_ratio_is_chosen(device):
    X, y = _rings(np.random.default_rng(0))
    result = kkmgpu.fit(X, 2, objective="ncut", affinity="search", device=device, random_state=0)
    search = result.method_params["graph_search"]
    assert {(c.affinity, c.n_neighbors) for c in search.candidates} == {
        (f, m) for f in graph_search.FAMILIES for m in graph_search.GRID}
    for c in search.candidates:
        count, smallest, lam_k, lam_k1 = _reference(X, c.affinity, c.n_neighbors, 2)
        assert (c.components, c.smallest_component) == (count, smallest)
        assert c.eligible == (count <= 2 and smallest >= graph_search.MIN_COMPONENT_SHARE * len(X) / 2)
        if c.eligible:  # the eigensolver's tolerance (1e-5 on D^-1/2 A D^-1/2) against exact values
            assert c.lambda_k == pytest.approx(lam_k, abs=2e-5)
            assert c.lambda_k1 == pytest.approx(lam_k1, abs=2e-5)
            assert c.ratio == (math.inf if count == 2 else c.lambda_k1 / c.lambda_k)
        else:
            assert math.isnan(c.ratio)
    eligible = [c for c in search.candidates if c.eligible]
    best = max(eligible, key=lambda c: c.ratio)
    prior = [c for c in eligible if (c.affinity, c.n_neighbors) == graph_search.PRIOR]
    assert search.prior == graph_search.PRIOR == ("self_tuning", 10)
    # the default graph unless it is not eligible or another ratio is more than 1.5 times its own
    assert search.chosen == (prior[0] if prior and not best.ratio > 1.5 * prior[0].ratio else best)
    # the fit is the fixed call on the chosen graph (same seed stream: the search draws before it)
    assert (result.method_params["affinity"], result.method_params["n_neighbors"]) == (
        search.chosen.affinity, search.chosen.n_neighbors)
    assert kkmgpu.metrics.nmi(y, result.labels) == pytest.approx(1.0)
    assert result.timings["graph_search"] >= result.timings["total"]
    assert "*" in search.table() and search.chosen.affinity in search.table()
    # predict follows the chosen graph: the training points get their labels
    np.testing.assert_array_equal(kkmgpu.predict(result, X[:50]), np.asarray(result.labels)[:50])


def test_choose_prefers_eligible_then_fewest_components():
    C = graph_search.Candidate
    a = C("knn", 5, 1, 100, True, 0.01, 0.03, 3.0)
    b = C("knn", 10, 1, 100, True, 0.02, 0.10, 5.0)
    c = C("mutual_knn", 5, 2, 50, True, 0.0, 0.05, math.inf)   # k well-sized components: clear-cut
    d = C("mutual_knn", 5, 9, 1, False, math.nan, math.nan, math.nan)
    assert graph_search.choose([a, b, d]) == b
    assert graph_search.choose([a, b, c, d]) == c
    e = C("mutual_knn", 7, 4, 2, False, math.nan, math.nan, math.nan)
    assert graph_search.choose([d, e]) == e  # none eligible: the fewest components


def test_the_prior_is_kept_unless_beaten_by_more_than_the_factor():
    """affinity="search" keeps its prior (the default graph) unless another eligible ratio is more than
    PRIOR_FACTOR (1.5) times the prior's; an ineligible prior, or one with no candidate, does not count."""
    C, f = graph_search.Candidate, graph_search.PRIOR_FACTOR
    p = C("self_tuning", 10, 1, 100, True, 0.02, 0.04, 2.0)
    close = C("knn", 5, 1, 100, True, 0.01, 0.02 * f, 2.0 * f)          # exactly 1.5 times: not more
    beyond = C("knn", 20, 1, 100, True, 0.01, 0.02 * f + 1e-6, 2.0 * f + 1e-4)
    split = C("mutual_knn", 5, 2, 50, True, 0.0, 0.05, math.inf)
    prior = ("self_tuning", 10)
    assert graph_search.choose([close, p], prior) == p
    assert graph_search.choose([close, p]) == close                      # no prior: the largest ratio
    assert graph_search.choose([close, p, beyond], prior) == beyond
    assert graph_search.choose([p, split], prior) == split               # k well-sized components beat any ratio
    kept_split = C("self_tuning", 10, 2, 50, True, 0.0, 0.05, math.inf)
    assert graph_search.choose([kept_split, split], prior) == kept_split  # inf is not beaten
    ineligible = C("self_tuning", 10, 5, 3, False, math.nan, math.nan, math.nan)
    assert graph_search.choose([ineligible, close], prior) == close
    assert graph_search.choose([close, beyond], prior) == beyond          # the prior is not a candidate


def test_outliers_cut_off_by_a_sparse_graph_do_not_win(device):
    """A mutual-kNN graph that leaves a few far points in components of their own has lambda_k = 0 (k
    components): its ratio is infinite, but it is not eligible, and the search finds the two rings."""
    rng = np.random.default_rng(1)
    X, y = _rings(rng)
    X = np.r_[X, [[40.0, 40.0], [40.5, 40.0], [-40.0, 40.0], [-40.0, 40.3]]]
    result = kkmgpu.fit(X, 2, objective="ncut", affinity="search", device=device, random_state=0)
    chosen = result.method_params["graph_search"].chosen
    assert chosen.eligible and chosen.components <= 2
    assert kkmgpu.metrics.nmi(y, np.asarray(result.labels)[:len(y)]) > 0.9


def test_disconnected_data_in_k_well_sized_groups():
    """Two far-apart blobs, k = 2: graphs of two components of 150 points each are eligible with lambda_2 = 0,
    and one of them is chosen; the labels are the blobs."""
    rng = np.random.default_rng(2)
    X = np.r_[rng.normal(size=(150, 3)), rng.normal(size=(150, 3)) + 50.0]
    result = kkmgpu.fit(X, 2, objective="ncut", affinity="search", device="cpu", random_state=0)
    chosen = result.method_params["graph_search"].chosen
    assert chosen.components == 2 and chosen.ratio == math.inf
    assert kkmgpu.metrics.nmi(np.repeat([0, 1], 150), result.labels) == pytest.approx(1.0)


@pytest.mark.parametrize("offset", [0.0, 1e9])
def test_the_choice_is_translation_and_scale_invariant_in_float32(offset):
    X, y = _rings(np.random.default_rng(3))
    base = kkmgpu.fit(X, 2, objective="ncut", affinity="search", device="cpu", random_state=0, dtype="float32")
    moved = kkmgpu.fit((X + offset) * 1e-20 if offset == 0 else X + offset, 2, objective="ncut", affinity="search",
                       device="cpu", random_state=0, dtype="float32")
    a, b = (r.method_params["graph_search"].chosen for r in (base, moved))
    assert (a.affinity, a.n_neighbors) == (b.affinity, b.n_neighbors)
    np.testing.assert_array_equal(base.labels, moved.labels)


def test_duplicates_and_tiny_inputs():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(6, 2))[np.repeat(np.arange(6), 5)]  # 30 points, 6 distinct
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        result = kkmgpu.fit(X, 2, objective="ncut", affinity="search", device="cpu", random_state=0)
    assert np.isfinite(result.objective) and len(np.unique(result.labels)) == 2
    small = kkmgpu.fit(rng.normal(size=(6, 2)), 2, objective="ncut", affinity="search", device="cpu", random_state=0)
    assert {c.affinity for c in small.method_params["graph_search"].candidates} == {"knn", "mutual_knn"}
    with pytest.raises(ValueError, match="needs at least 3 samples"):
        kkmgpu.fit(np.eye(2), 2, objective="ncut", affinity="search", device="cpu")


def test_bad_arguments_name_the_rule():
    X = np.random.default_rng(5).normal(size=(40, 2))
    with pytest.raises(ValueError, match=r"affinity='search' chooses the graph's family and its n_neighbors"):
        kkmgpu.fit(X, 2, objective="ncut", affinity="search", n_neighbors=7)
    with pytest.raises(ValueError, match=r"affinity='nearest' is not one of .*'search'"):
        kkmgpu.fit(X, 2, objective="ncut", affinity="nearest")
    with pytest.raises(ValueError, match="belong to the graph objectives"):
        kkmgpu.fit(X, 2, affinity="search")


def test_plot_draws_every_family_and_circles_the_choice():
    matplotlib = pytest.importorskip("matplotlib")  # a test dependency: always present in CI
    matplotlib.use("Agg")
    import kkmgpu.plot

    X, _ = _rings(np.random.default_rng(6))
    result = kkmgpu.fit(X, 2, objective="ncut", affinity="search", device="cpu", random_state=0)
    search = result.method_params["graph_search"]
    ax = kkmgpu.plot.plot_graph_search(result)
    labels = [line.get_label() for line in ax.get_lines()]
    assert set(graph_search.FAMILIES) <= set(labels)
    chosen = [line for line in ax.get_lines() if line.get_label().startswith("chosen")]
    assert len(chosen) == 1 and chosen[0].get_xdata()[0] == search.chosen.n_neighbors
    eligible = [c for c in search.candidates if c.eligible and math.isfinite(c.ratio)]
    drawn = {(line.get_label(), x, y) for line in ax.get_lines() for x, y in zip(line.get_xdata(), line.get_ydata())}
    assert all((c.affinity, c.n_neighbors, c.ratio) in drawn for c in eligible)
    assert search.plot().get_yscale() == "log"


def test_plot_of_a_neighbour_search_draws_its_one_family():
    """n_neighbors="search" keeps the same evidence (issue 28 point 4): kkmgpu.plot draws the family's ratios at
    5 ... 30 neighbours and circles the size the fit used."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import kkmgpu.plot

    X, _ = _rings(np.random.default_rng(7))
    result = kkmgpu.fit(X, 2, objective="ncut", affinity="mutual_knn", n_neighbors="search", device="cpu",
                        random_state=0)
    search = result.method_params["graph_search"]
    ax = kkmgpu.plot.plot_graph_search(result)
    assert {line.get_label() for line in ax.get_lines()
            if not line.get_label().startswith(("_", "chosen"))} == {"mutual_knn"}
    assert ax.get_title().startswith("n_neighbors='search', mutual_knn")
    drawn = {(x, y) for line in ax.get_lines() if line.get_label() == "mutual_knn"
             for x, y in zip(line.get_xdata(), line.get_ydata())}
    assert drawn == {(c.n_neighbors, c.ratio) for c in search.candidates if c.eligible and math.isfinite(c.ratio)}
    chosen = [line for line in ax.get_lines() if line.get_label().startswith("chosen")]
    assert len(chosen) == 1 and chosen[0].get_xdata()[0] == result.method_params["n_neighbors"]
