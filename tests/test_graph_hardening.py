"""The graph objectives under hostile input (issue 27 points 1, 3 and 4), against float64 references:

- offsets: moons * 4 + [5e5, 5e6] and blobs + 1e7 / + 1.7e9 at the default float32 give the labels of the
  caller-centred data (NMI 1 to the truth, as those), the same on every call with the same seed, for every graph
  kind (the features are centred in float64 before the cast: a cast first rounds them to 0.5 or 256);
- scale: X * 1e40 and X * 1e-45 (beyond float32's range) give X's labels; a precomputed affinity A * 1e-60 or * 1e+60 (dense or sparse, float32 and float64) gives A's labels; the
  ratio association and the reported degrees scale with A, the normalized cut does not (cdist's kNN graph);
- identical points: the same labels on every call with the same seed on each device, and the kernel methods'
  warning of fewer distinct points than k, once, at the caller's line;
- a normalized cut whose clusters are the graph's components reports 0, never the rounding just below it;
- predict(X_train) is labels_, except that identical training points take the first copy's label;
- self_tuning with a far outlier: the outlier keeps an edge to its nearest point, exp(-d^2 / sigma^2) with its own
  scale (every other weight underflows); fewer than 8 points say what self_tuning needs, not scale_neighbor.

X * 1e20 and X * 1e-25 are held to X's labels on both devices by tests/test_graphcut.py.

Integer (grid) data, whose distances tie exactly: the features are centred on the mean rounded to the columns'
power-of-two quantum (graph_scale.grid_center), so X - centre is exact and the ties stay ties, broken by index:
X + c (c = 0.5, 12345, 1e9), 3 X and X * 2**-70 give X's graph and labels in float32 and float64, and the
neighbours are those of a stable float64 argsort of X's own distances (with the mean unrounded, X + 12345 gave
another graph in 18 of 20 random integer sets, 2026-11-27).
"""

import re
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.spatial.distance import cdist
from sklearn.datasets import make_blobs, make_moons

from conftest import host, use_device

import kkmgpu
from kkmgpu.metrics import nmi

DISTINCT = r"Number of distinct clusters \(\d\) found smaller than n_clusters \({k}\)"
CPU_AND_GPU = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


_host, _use = host, use_device


def assert_same_partition(a, b, what=""):
    """The same clusters, whatever their numbers: each label of ``a`` goes with one label of ``b`` and back."""
    a, b = _host(a), _host(b)
    pairs = np.unique(np.stack([a, b]), axis=1)
    assert pairs.shape[1] == np.unique(a).size == np.unique(b).size, f"{what}: {pairs.shape[1]} pairs of labels"


def knn_affinity(X, n_neighbors):
    """The symmetric kNN graph (G + G^T) / 2 from float64 cdist, ties to the lower index."""
    D = cdist(X, X, "sqeuclidean")
    np.fill_diagonal(D, np.inf)
    order = np.argsort(D, axis=1, kind="stable")[:, :n_neighbors]
    G = np.zeros(D.shape)
    G[np.repeat(np.arange(X.shape[0]), n_neighbors), order.ravel()] = 1.0
    return 0.5 * (G + G.T)


@pytest.mark.parametrize("device, affinity", [("cpu", "knn"), ("cpu", "mutual_knn"), ("cpu", "self_tuning"),
                                              pytest.param("cuda", "mutual_knn", marks=pytest.mark.gpu)])
def test_offset_data_give_the_labels_of_centred_data(device, affinity):
    """float32 features of 5e7 + x cast before the centring are x rounded to 4: NMI 0.11 here. The moons are
    apart enough that the well-scaled call finds them (NMI 1), on every graph kind."""
    device = _use(device)
    X, y = make_moons(200, noise=0.05, random_state=3)
    X *= 4
    runs = [kkmgpu.fit(X + [5e6, 5e7], 2, objective="ncut", affinity=affinity, device=device, random_state=0,
                       n_init=3) for _ in range(2)]
    np.testing.assert_array_equal(_host(runs[0].labels), _host(runs[1].labels))
    assert nmi(y, _host(runs[0].labels)) == 1.0
    np.testing.assert_array_equal(kkmgpu.predict(runs[0], X + [5e6, 5e7]), _host(runs[0].labels))


def test_the_issues_offset_moons():
    """Issue 27's case: moons * 4 + [5e5, 5e6] (float32 rounds a cast-first feature to 0.5) gave NMI 0.013."""
    X, y = make_moons(1000, noise=0.05, random_state=0)
    X *= 4
    assert nmi(y, kkmgpu.fit(X + [5e5, 5e6], 2, objective="ncut", device="cpu", random_state=0).labels) == 1.0


def test_blobs_far_from_the_origin_keep_their_labels():
    """Blobs + 1e7 and + 1.7e9 gave other labels than the blobs, and + 1.7e9 other labels on each call."""
    X, y = make_blobs(240, centers=4, cluster_std=0.6, random_state=1)
    for shift, calls in ((1e7, 1), (1.7e9, 2)):
        runs = [kkmgpu.fit(X + shift, 4, objective="ncut", device="cpu", random_state=0, n_init=3)
                for _ in range(calls)]
        assert nmi(y, runs[0].labels) == 1.0
        np.testing.assert_array_equal(runs[-1].labels, runs[0].labels)


@pytest.mark.parametrize("device", CPU_AND_GPU)
def test_features_beyond_float32s_range_give_the_labels_of_x(device):
    """X * 1e40 is infinite in float32 ("the features contain NaN or infinity", though X is finite) and X * 1e-45
    keeps a digit or none (NMI 0.30); both are scaled by a power of two before the cast (issue 27). self_tuning's
    weights d^2 / (sigma_i sigma_j) do not change with the scale either; predict prepares new points alike."""
    device = _use(device)
    X, _ = make_blobs(100, centers=3, cluster_std=1.5, random_state=2)
    base = kkmgpu.fit(X, 3, objective="ncut", affinity="self_tuning", device=device, random_state=0, n_init=3)
    for scale in (1e40, 1e-45):
        result = kkmgpu.fit(X * scale, 3, objective="ncut", affinity="self_tuning", device=device, random_state=0,
                            n_init=3)
        assert_same_partition(result.labels, base.labels, f"X * {scale:g}")
        np.testing.assert_array_equal(kkmgpu.predict(result, X * scale), _host(result.labels))


@pytest.mark.parametrize("device", CPU_AND_GPU)
def test_a_scaled_precomputed_affinity_gives_the_labels_of_the_affinity(device):
    """A * 1e+60 made D^-1 A D^-1 about 1e-60, 0 in float32: ARI 0 (issue 27); A * 1e-60 overflowed no range
    but is held too. The ratio association (-sum links(c, c) / |c|) and the degrees are linear in A."""
    device = _use(device)
    X, _ = make_blobs(100, centers=3, cluster_std=1.5, random_state=4)
    A = knn_affinity(X, 10)
    d = A.sum(axis=1)
    for dtype, cases in (("float32", ((1e-60, "dense"), (1e60, "sparse"))), ("float64", ((1e60, "dense"),))):
        base = kkmgpu.fit(A, 3, objective="ncut", affinity="precomputed", dtype=dtype, device=device, random_state=0,
                          n_init=3)
        for scale, form in cases:
            As = A * scale if form == "dense" else sp.csr_matrix(A * scale)
            result = kkmgpu.fit(As, 3, objective="ncut", affinity="precomputed", dtype=dtype, device=device,
                                random_state=0, n_init=3)
            assert_same_partition(result.labels, base.labels, f"{dtype} {scale} {form}")
            assert result.objective == pytest.approx(base.objective, rel=1e-9)
            labels = _host(result.labels)
            sizes = np.bincount(labels, weights=d * scale, minlength=3)
            np.testing.assert_allclose(result.cluster_sizes, sizes, rtol=1e-12)
    ratio = [kkmgpu.fit(A * s, 3, objective="ratio_association", affinity="precomputed", device=device,
                        random_state=0, n_init=3, graph_shift=0.5 * s) for s in (1.0, 1e60)]
    assert_same_partition(ratio[1].labels, ratio[0].labels, "ratio association")
    labels = _host(ratio[1].labels)
    reference = -sum(A[np.ix_(labels == c, labels == c)].sum() / np.sum(labels == c) for c in range(3))
    assert ratio[1].objective == pytest.approx(1e60 * reference, rel=1e-9)
    assert ratio[1].method_params["graph_shift"] == pytest.approx(0.5e60, rel=1e-12)


@pytest.mark.parametrize("device", CPU_AND_GPU)
def test_identical_points_split_alike_on_every_call_and_warn(device):
    """100 identical points, k=3: ARPACK's unseeded restarts split them [84, 15, 1] one call and otherwise the
    next (issue 27); one distinct point is fewer than k, which every kernel method says."""
    device = _use(device)
    X = np.ones((100, 2))
    labels = []
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = kkmgpu.fit(X, 3, objective="ncut", device=device, random_state=0, n_init=3)
        labels.append(_host(result.labels))
        distinct = [w for w in caught if re.match(DISTINCT.format(k=3), str(w.message))]
        assert len(distinct) == 1 and distinct[0].filename == __file__, [str(w.message) for w in caught]
        assert issubclass(distinct[0].category, kkmgpu.ConvergenceWarning)
    for other in labels[1:]:
        np.testing.assert_array_equal(other, labels[0])


@pytest.mark.parametrize("device", CPU_AND_GPU)
def test_a_cut_of_zero_is_reported_as_zero_not_below(device):
    """Three blobs far apart: the kNN graph's components are the clusters, the normalized cut 0. The history and
    the restarts' objectives were J - (sigma (n - k) - k) from float32 J, -1e-7 (issue 27); a cut is >= 0."""
    device = _use(device)
    rng = np.random.default_rng(0)
    X = np.repeat(rng.normal(size=(3, 2)) * 100, 30, axis=0) + rng.normal(size=(90, 2))
    result = kkmgpu.fit(X, 3, objective="ncut", dtype="float32", device=device, random_state=0)
    labels = _host(result.labels)
    assert nmi(np.repeat(np.arange(3), 30), labels) == 1.0
    A = knn_affinity(X, 10)
    assert sum(A[np.ix_(labels == c, labels != c)].sum() for c in range(3)) == 0.0  # the reference cut
    assert result.objective == 0.0
    assert np.all(np.asarray(result.objective_history) >= 0) and np.all(np.asarray(result.objectives) >= 0)
    eps = np.finfo(np.float32).eps
    assert np.all(np.asarray(result.objectives) <= 64 * eps * (result.method_params["graph_shift"] * 90 + 3))


def _first_copy(X):
    """For each row, the index of the first row equal to it."""
    _, first, inverse = np.unique(X, axis=0, return_index=True, return_inverse=True)
    return first[inverse.ravel()]


@pytest.mark.parametrize("device, affinity, objective", [
    ("cpu", "knn", "ncut"), ("cpu", "self_tuning", "ncut"), ("cpu", "mutual_knn", "ratio_association"),
    pytest.param("cuda", "knn", "ncut", marks=pytest.mark.gpu)])
def test_predict_on_the_training_points_gives_labels(device, affinity, objective):
    """Overlapping blobs, where 2-6 of 250 training points were predicted into another cluster (issue 27: a
    training point queried as a new one counts itself among its neighbours, and misses the fit's own diagonal
    term); duplicated rows appended: each takes its first copy's label, whatever the fit gave the copies."""
    device = _use(device)
    X, _ = make_blobs(250, centers=3, cluster_std=2.5, random_state=2)
    X = np.vstack([X, X[:5], X[:5]])
    result = kkmgpu.fit(X, 3, objective=objective, affinity=affinity, device=device, random_state=0)
    labels = _host(result.labels)
    np.testing.assert_array_equal(kkmgpu.predict(result, X), labels[_first_copy(X)])


def test_predict_of_split_identical_points_gives_the_first_copys_label():
    X = np.vstack([np.ones((100, 2)), [[9.0, 9.0], [9.0, 9.5]]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = kkmgpu.fit(X, 3, objective="ncut", device="cpu", random_state=0)
    assert np.unique(result.labels[:100]).size > 1  # the case is one: the fit split the copies
    np.testing.assert_array_equal(kkmgpu.predict(result, X), result.labels[_first_copy(X)])


@pytest.mark.parametrize("device", CPU_AND_GPU)
def test_a_far_outlier_keeps_an_edge_to_its_nearest_point_in_the_self_tuning_graph(device):
    """exp(-d^2 / (sigma_o sigma_j)) underflows for every neighbour j of an outlier 1e6 away (sigma_j about 1):
    degree 0 and "use more neighbours", at 299 neighbours too (issue 27). It keeps the edge to its nearest point
    at its own scale, exp(-d_1^2 / sigma_o^2); every other weight is the paper's."""
    from kkmgpu.backend.device import resolve_device
    from kkmgpu.kernels.graphs import build_graph

    backend = resolve_device(_use(device))
    X, _ = make_blobs(80, centers=2, random_state=6)
    X = np.vstack([X, [[1e6, -1e6]]])
    graph = build_graph(backend.asarray(X), 10, "self_tuning", backend).graph
    A = _host(graph.toarray())
    D = cdist(X, X, "sqeuclidean")
    np.fill_diagonal(D, np.inf)
    order = np.argsort(D, axis=1, kind="stable")
    sigma = np.sqrt(D[np.arange(81), order[:, 6]])
    expected = np.zeros_like(A)
    for i in range(81):
        for j in order[i, :10]:
            expected[i, j] = np.exp(-D[i, j] / (sigma[i] * sigma[j]))
    expected = np.maximum(expected, expected.T)
    assert not expected[80].any()  # the case is one: every weight of the outlier underflows
    nearest = order[80, 0]
    expected[80, nearest] = expected[nearest, 80] = np.exp(-D[80, nearest] / sigma[80] ** 2)
    np.testing.assert_allclose(A, expected, rtol=1e-12, atol=0)


def test_a_far_outlier_joins_its_nearest_points_cluster():
    X, _ = make_blobs(120, centers=3, cluster_std=0.6, random_state=0)
    Xo = np.vstack([X, [[1e6, 1e6]]])
    nearest = int(np.argmin(((X - 1e6) ** 2).sum(axis=1)))
    alone = kkmgpu.fit(X, 3, objective="ncut", affinity="self_tuning", device="cpu", random_state=0)
    for n_neighbors in (10, 120):
        result = kkmgpu.fit(Xo, 3, objective="ncut", affinity="self_tuning", n_neighbors=n_neighbors, device="cpu",
                            random_state=0)
        if n_neighbors == 10:
            assert_same_partition(result.labels[:120], alone.labels)
        assert result.labels[120] == result.labels[nearest]
        assert kkmgpu.predict(result, [[2e6, 2e6]])[0] == result.labels[nearest]


@pytest.mark.parametrize("n", [6, 7])
def test_too_few_points_for_self_tuning_say_what_it_needs(n):
    X = np.random.default_rng(n).normal(size=(n, 2))
    with pytest.raises(ValueError, match=f"affinity='self_tuning' needs at least 8 samples.*got {n}") as caught:
        kkmgpu.fit(X, 2, objective="ncut", affinity="self_tuning", n_neighbors=3, device="cpu")
    assert "scale_neighbor" not in str(caught.value)
    remedy = kkmgpu.fit(X, 2, objective="ncut", affinity="knn", n_neighbors=3, device="cpu", random_state=0)
    assert np.unique(remedy.labels).size == 2


# --- predict's assignment rule, the neighbour search and the reported cut (mutants of graphcut.py that survived) --

def _reference_affinities(X, Q, n_neighbors, affinity, scale_neighbor=7):
    """float64 reference of the training graph A (n, n) and of the new points' rows W (m, n), as docs/graphs.md
    ("Predicting new points") defines them: j is a neighbour of q when among q's n_neighbors nearest training
    points, q one of j's when nearer than j's n_neighbors-th neighbour; self_tuning's scale is the 7th distance."""
    D = cdist(X, X, "sqeuclidean")
    np.fill_diagonal(D, np.inf)
    order = np.argsort(D, axis=1, kind="stable")
    n = X.shape[0]
    G = np.zeros((n, n), dtype=bool)
    G[np.repeat(np.arange(n), n_neighbors), order[:, :n_neighbors].ravel()] = True
    radius = D[np.arange(n), order[:, n_neighbors - 1]]
    Dq = cdist(Q, X, "sqeuclidean")
    own = Dq <= np.sort(Dq, axis=1)[:, n_neighbors - 1:n_neighbors]
    other = Dq < radius[None, :]
    if affinity == "knn":
        return 0.5 * (G.astype(float) + G.T), 0.5 * own + 0.5 * other
    if affinity == "mutual_knn":
        return (G & G.T).astype(float), (own & other).astype(float)
    sigma = np.sqrt(D[np.arange(n), order[:, scale_neighbor - 1]])
    sigma_q = np.sqrt(np.sort(Dq, axis=1)[:, scale_neighbor - 1])
    A = np.where(G | G.T, np.exp(-D / np.outer(sigma, sigma)), 0.0)
    return A, np.where(own | other, np.exp(-Dq / np.outer(sigma_q, sigma)), 0.0)


def _reference_scores(A, W, labels, k, objective, shift):
    """The fit's rule in A's units: C_c / n_c^2 - 2 links(x, c) / (d_x n_c) with C_c = links(c, c) + shift n_c and
    n_c = d(c) (ncut: K = shift D^-1 + D^-1 A D^-1, weights d), or / n_c with n_c = |c| (ratio: K = shift I + A)."""
    d, dx = A.sum(axis=1), W.sum(axis=1)
    score = np.full((W.shape[0], k), np.inf)
    for c in range(k):
        members = labels == c
        size = d[members].sum() if objective == "ncut" else members.sum()
        links = W[:, members].sum(axis=1) / (np.where(dx > 0, dx, 1.0) if objective == "ncut" else 1.0)
        score[:, c] = (A[np.ix_(members, members)].sum() + shift * size) / size ** 2 - 2.0 * links / size
    return score


@pytest.mark.parametrize("device, affinity, objective", [
    ("cpu", "knn", "ncut"), ("cpu", "mutual_knn", "ncut"), ("cpu", "mutual_knn", "ratio_association"),
    ("cpu", "self_tuning", "ncut"), ("cpu", "self_tuning", "ratio_association"),
    pytest.param("cuda", "mutual_knn", "ncut", marks=pytest.mark.gpu),
    pytest.param("cuda", "self_tuning", "ratio_association", marks=pytest.mark.gpu)])
def test_predict_of_new_points_between_clusters_follows_the_fits_rule(device, affinity, objective):
    """New points in and far around three unequal overlapping blobs (where the rule, not the nearest point, decides):
    argmin_c C_c / n_c^2 - 2 links(x, c) / (d_x n_c) (ncut) or - 2 links(x, c) / |c| (ratio association), from a
    float64 reference of the graph, of the new points' affinities and of K with the given shift; a point without
    an edge (mutual kNN) takes its nearest training point's cluster. self_tuning's A has its largest entry below 1
    (the fit divides it by 2**-1). int32 labels, and no warning (no 0 / 0 for the points without an edge)."""
    device = _use(device)
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(c, 1.0, size=(s, 2)) for c, s in zip([(0, 0), (4, 0), (2, 3.5)], (40, 80, 120))])
    Q = rng.uniform(-8, 12, size=(300, 2))
    result = kkmgpu.fit(X, 3, objective=objective, affinity=affinity, n_neighbors=8, graph_shift=0.5, device=device,
                        dtype="float64", random_state=0, n_init=2)
    labels = _host(result.labels)
    A, W = _reference_affinities(X, Q, 8, affinity)
    score = _reference_scores(A, W, labels, 3, objective, 0.5)
    nearest = np.argmin(cdist(Q, X, "sqeuclidean"), axis=1)
    expected = np.where(W.sum(axis=1) > 0, np.argmin(score, axis=1), labels[nearest])
    top = np.sort(score, axis=1)
    assert np.all(top[:, 1] - top[:, 0] > 1e-6 * np.abs(top[:, :2]).max(axis=1)), "a near tie: not a fair case"
    assert np.sum(expected != labels[nearest]) >= 2  # the case is one: the rule is not the nearest point's label
    if affinity == "mutual_knn":
        alone = W.sum(axis=1) == 0
        assert np.any(alone & (np.argmin(score, axis=1) != labels[nearest]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = kkmgpu.predict(result, Q)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, expected)


def test_predict_of_training_points_among_new_ones_gives_their_labels():
    """A training point keeps its label also when queried beside new points (the rule gives 4 of these 250
    overlapping blob points another cluster, as X + 1e-9 shows); the new points get the rule's labels."""
    X, _ = make_blobs(250, centers=3, cluster_std=2.5, random_state=2)
    result = kkmgpu.fit(X, 3, objective="ncut", device="cpu", dtype="float64", random_state=0, n_init=2)
    moved = kkmgpu.predict(result, X + 1e-9)
    assert np.any(moved != result.labels)  # the case is one
    both = kkmgpu.predict(result, np.vstack([X, X + 1e-9]))
    np.testing.assert_array_equal(both[:250], result.labels)
    np.testing.assert_array_equal(both[250:], moved)


def test_predict_names_x_new_in_its_errors():
    X, _ = make_blobs(60, centers=2, random_state=3)
    result = kkmgpu.fit(X, 2, objective="ncut", device="cpu", random_state=0, n_init=1)
    with pytest.raises(ValueError, match="X_new contains NaN or infinity"):
        kkmgpu.predict(result, [[np.nan, 0.0]])
    with pytest.raises(ValueError, match="X_new has 3 features but the model was fit on 2"):
        kkmgpu.predict(result, np.ones((4, 3)))


def test_a_positive_normalized_cut_is_reported_as_it_is():
    """Overlapping blobs: 0 < ncut < 1. The reported objective is the float64 cut of the labels, a float; the
    history ends at it and every restart's value is a cut (> 0 here): only values in [-bound, 0) are rounding."""
    X, _ = make_blobs(150, centers=3, cluster_std=2.0, random_state=5)
    result = kkmgpu.fit(X, 3, objective="ncut", affinity="knn", device="cpu", random_state=0, n_init=3)
    A = knn_affinity(X, 10)
    labels = result.labels
    cut = sum(A[np.ix_(labels == c, labels != c)].sum() / A[labels == c].sum() for c in range(3))
    assert 0 < cut < 1
    assert type(result.objective) is float and result.objective == pytest.approx(cut, rel=1e-9)
    assert result.objective_history[-1] == pytest.approx(cut, rel=1e-4)
    assert np.all(result.objectives > 0) and np.min(result.objectives) == pytest.approx(cut, rel=1e-4)


@pytest.mark.parametrize("n", [3, 4, 7, 8])
def test_neighbour_search_fits_the_grid_below_n_from_one_neighbour_search(n, monkeypatch, capsys):
    """n_neighbors="search" scores each of 5, 7, 10, 15, 20, 30 up to n - 1 (n - 1 alone for 3 to 6 points), with
    the neighbours searched once, for the largest value; verbose says each graph's ratio;
    timings["graph_search"] spans the whole search, the fit's timings["total"] within it."""
    from kkmgpu.kernels import graphs
    import time

    searched, search = [], graphs.nearest_neighbors
    monkeypatch.setattr(graphs, "nearest_neighbors",
                        lambda A, m, *args, **kwargs: searched.append(m) or search(A, m, *args, **kwargs))
    X = np.random.default_rng(n).normal(size=(n, 2))
    start = time.perf_counter()
    result = kkmgpu.fit(X, 2, objective="ncut", affinity="knn", n_neighbors="search", device="cpu", random_state=0,
                        n_init=1, verbose=True)
    wall = time.perf_counter() - start
    rows = result.method_params["graph_search"].candidates
    grid = [v for v in (5, 7, 10, 15, 20, 30) if v <= n - 1] or [n - 1]
    assert [(row.affinity, row.n_neighbors) for row in rows] == [("knn", m) for m in grid]
    assert searched == [grid[-1]]
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[kkmgpu] affinity=")]
    assert len(said) == len(grid) and all(f"n_neighbors={row.n_neighbors}:" in line for line, row in zip(said, rows))
    assert result.timings["total"] <= result.timings["graph_search"] <= wall


def test_neighbour_search_needs_three_points():
    with pytest.raises(ValueError, match="n_neighbors='search' needs at least 3 samples; got 2"):
        kkmgpu.fit(np.eye(2), 2, objective="ncut", affinity="knn", n_neighbors="search", device="cpu")


@pytest.mark.parametrize("device", CPU_AND_GPU)
def test_neighbour_search_runs_on_the_fits_features_on_the_device_asked_and_repeats(device):
    """A 3 x 4 lattice jittered by 1e-9: the float32 features (the default dtype) tie, and take the lower index,
    where float64 ones do not, so their graphs differ. The search's result, on the device asked (a CuPy input with
    device="auto" on a GPU), reports the normalized cut of its labels on the kNN graph of the float32 features
    (float64 distances of their values) for its n_neighbors; the same seed gives the same search, another seed
    the same evidence (the criterion does not depend on the starts)."""
    from kkmgpu.backend.device import resolve_device

    device = _use(device)
    rng = np.random.default_rng(1)
    X = np.stack(np.meshgrid(np.arange(3.0), np.arange(4.0)), -1).reshape(-1, 2)[rng.permutation(12)]
    X += 1e-9 * rng.normal(size=X.shape)
    data = X if device == "cpu" else resolve_device("cuda").asarray(X)
    runs = [kkmgpu.fit(data, 2, objective="ncut", affinity="knn", n_neighbors="search",
                       device="cpu" if device == "cpu" else "auto", random_state=seed, init="random", n_init=1)
            for seed in (0, 0, 1)]
    assert runs[0].device.startswith(device)
    rows = [[(c.n_neighbors, c.components, c.eligible) for c in run.method_params["graph_search"].candidates]
            for run in runs]
    assert rows[1] == rows[0] == rows[2]
    assert runs[1].method_params["graph_search"] == runs[0].method_params["graph_search"]
    np.testing.assert_array_equal(_host(runs[1].labels), _host(runs[0].labels))
    value, labels = runs[0].method_params["n_neighbors"], _host(runs[0].labels)
    A = knn_affinity((X - X.mean(axis=0)).astype(np.float32).astype(np.float64), value)
    assert np.any(knn_affinity(X, value) != A)  # the case is one
    cut = sum(A[np.ix_(labels == c, labels != c)].sum() / A[labels == c].sum() for c in range(2))
    assert runs[0].objective == pytest.approx(cut, rel=1e-9)


def test_predict_into_a_cluster_of_one_point_of_small_degree():
    """A start with a far point alone in its cluster keeps it there (its own distance is 0). Its self_tuning
    degree is about 0.01, below the fit's weight scale and below 1: new points between it and the blobs follow the
    same rule as any (the float64 reference), and most of them join it."""
    X, y = make_blobs(80, centers=[(0, 0), (6, 0)], cluster_std=1.0, random_state=0)
    X, y = np.vstack([X, [[3.0, 12.0]]]), np.append(y, 2)
    Q = np.random.default_rng(0).uniform((-2, 2), (8, 14), size=(200, 2))
    result = kkmgpu.fit(X, 3, objective="ncut", affinity="self_tuning", init=y, graph_shift=0.5, device="cpu",
                        dtype="float64", random_state=0)
    np.testing.assert_array_equal(result.labels, y)
    A, W = _reference_affinities(X, Q, 10, "self_tuning")
    assert A[80].sum() < 0.1 and np.all(W.sum(axis=1) > 0)
    expected = np.argmin(_reference_scores(A, W, y, 3, "ncut", 0.5), axis=1)
    assert np.sum(expected == 2) > 100
    np.testing.assert_array_equal(kkmgpu.predict(result, Q), expected)


def test_predict_prepares_new_points_with_the_fits_power_of_two():
    """X * 1e40 and X * 1e-45 are divided by the fit's power of two; new points of a smaller extent (which would
    have another one of their own) take it too, and get the labels that the fit of X gives them."""
    X, _ = make_blobs(100, centers=3, cluster_std=1.5, random_state=2)
    Q = X.mean(axis=0) + np.random.default_rng(2).uniform(-1, 1, size=(30, 2))
    base = kkmgpu.fit(X, 3, objective="ncut", device="cpu", random_state=0, n_init=3)
    want = kkmgpu.predict(base, Q)
    for scale in (1e40, 1e-45):
        result = kkmgpu.fit(X * scale, 3, objective="ncut", device="cpu", random_state=0, n_init=3)
        np.testing.assert_array_equal(result.labels, base.labels)
        np.testing.assert_array_equal(kkmgpu.predict(result, Q * scale), want)


@pytest.mark.gpu
def test_neighbour_search_runs_in_the_gemm_precision_asked(knn_search_modes):
    """n_neighbors="search" searches the neighbours once, in the GEMM precision mode asked (tf32 here, float32
    features of 32 columns on a GPU), and method_params["gemm_mode"] is the mode it ran in."""
    _use("cuda")
    ran = knn_search_modes
    X = np.random.default_rng(0).normal(size=(40, 32))
    result = kkmgpu.fit(X, 2, objective="ncut", n_neighbors="search", device="cuda", gemm_precision="tf32",
                        random_state=0, n_init=1)
    assert ran == ["tf32"] and result.method_params["gemm_mode"] == "tf32"


def _host_graph(result):
    """The fit's graph as a SciPy CSR matrix (a GPU's is a cupyx one)."""
    import scipy.sparse as sps

    graph = result._graph_state.graph.graph
    return sps.csr_matrix(graph.get() if hasattr(graph, "get") else graph)


def _integer_set(seed):
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(60, 200)), int(rng.integers(1, 5))
    return np.round(rng.normal(size=(n, d)) * 2.0), int(rng.integers(2, 7))


def test_grid_center_rounds_to_the_columns_quantum_and_leaves_other_means_alone():
    """The centre of grid data is a multiple of its columns' quantum (X - centre then exact); the mean of data with
    full-length mantissas comes back bit for bit."""
    from kkmgpu.backend.device import resolve_device
    from kkmgpu.methods.graph_scale import grid_center

    backend = resolve_device("cpu")
    X = np.array([[1.0, 2.5, 3e20], [3.0, 4.5, 4e20], [-8.0, 0.25, 1e20], [2.0, 4.25, 1e20]])
    center = grid_center(X, backend)
    np.testing.assert_array_equal(center[:2], [0.0, 3.0])   # means -0.5, 2.875 to their quanta 1 and 0.25, ties to even
    assert center[2] % 2.0 ** 20 == 0 and abs(center[2] - X[:, 2].mean()) <= 2.0 ** 19
    for column in range(3):  # exact: adding the centre back gives X
        np.testing.assert_array_equal((X[:, column] - center[column]) + center[column], X[:, column])
    Y = np.random.default_rng(1).normal(size=(500, 4)) * [1.0, 1e-30, 1e30, 3.0] + [0.0, 1e-29, 7e30, -2.0]
    np.testing.assert_array_equal(grid_center(Y, backend), Y.mean(axis=0))
    Z = np.zeros((5, 2))
    Z[:, 1] = 7.0
    np.testing.assert_array_equal(grid_center(Z, backend), [0.0, 7.0])
    W = np.array([[1e300, 1e-300, 5e-324], [-1e300, 3e-300, 0.0], [2e300, -1e-300, 1e-323]])
    center = grid_center(W, backend)       # the extremes of float64: finite, within the data's range
    assert np.isfinite(center).all() and (W.min(axis=0) <= center).all() and (center <= W.max(axis=0)).all()


@pytest.mark.parametrize("device", CPU_AND_GPU)
@pytest.mark.parametrize("affinity", ["knn", "mutual_knn", "self_tuning"])
def test_integer_data_keep_their_graph_and_labels_under_offsets_and_exact_scales(device, affinity):
    """Exact ties of integer data stay ties (broken by index) whatever the offset or exact scale, in both
    precisions: X + c and X * f give X's graph (its edges; its weights to rounding) and labels."""
    device = _use(device)
    gpu = device == "cuda"   # fewer cases on a GPU (the same code; the stand-in's launches are slow in CI)
    for seed in range(1 if gpu else 3):
        X, k = _integer_set(seed)
        for dtype in ("float32",) if gpu else ("float64", "float32"):
            base = kkmgpu.fit(X, k, objective="ncut", affinity=affinity, device=device, random_state=0, dtype=dtype)
            A = _host_graph(base)
            for moved in (X + 1e9, 3.0 * X) if gpu else (X + 0.5, X + 12345.0, X + 1e9, 3.0 * X, X * 2.0 ** -70):
                other = kkmgpu.fit(moved, k, objective="ncut", affinity=affinity, device=device, random_state=0,
                                   dtype=dtype)
                B = _host_graph(other)
                # the same edges; the same weights, up to self-tuning's sqrt(9 d^2) against 3 sqrt(d^2) for 3 X
                np.testing.assert_array_equal(B.indptr, A.indptr)
                np.testing.assert_array_equal(B.indices, A.indices)
                np.testing.assert_allclose(B.data, A.data, rtol=1e-13, atol=0)
                if np.array_equal(B.data, A.data):   # the same graph, bit for bit: the same labels
                    np.testing.assert_array_equal(_host(other.labels), _host(base.labels))
                else:                                # weights 1 ulp apart: the same partition
                    assert_same_partition(other.labels, base.labels, f"seed {seed}, {dtype}")


@pytest.mark.parametrize("device", CPU_AND_GPU)
def test_integer_data_neighbours_are_a_stable_sort_of_their_exact_distances(device):
    """The kNN graph of integer data (many exact ties) links each point to the first n_neighbors of a stable
    float64 argsort of its distances in X itself (ties to the lower index), also after an offset."""
    device = _use(device)
    from kkmgpu.backend.device import resolve_device
    from kkmgpu.kernels.graphs import nearest_neighbors
    from kkmgpu.methods.graph_scale import graph_features

    backend = resolve_device(device)
    for seed in range(1 if device == "cuda" else 3):
        X, _ = _integer_set(seed)
        D = cdist(X, X, "sqeuclidean")
        np.fill_diagonal(D, np.inf)
        want = np.argsort(D, axis=1, kind="stable")[:, :8]
        for moved in (X, X + 12345.0):
            features = graph_features(backend.asarray(moved), "float64", backend)[1]
            index, _ = nearest_neighbors(features, 8, backend)
            np.testing.assert_array_equal(_host(index)[:, :8], want)
