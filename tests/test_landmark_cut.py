"""fit(objective="ncut", method="landmark") (issue 29 point 3): the bipartite graph against a float64 brute-force
construction, the transfer cut against the dense eigendecomposition of the whole (n + p)-node bipartite graph, the
reported cut against the dense W_X = B D_Y^-1 B^T, recovery of separated clusters, predict, arguments, hostile data
and the emulated GPU."""

import re

import numpy as np
import pytest
import scipy.linalg
from scipy.spatial.distance import cdist
from sklearn.datasets import make_blobs, make_moons

from conftest import host, use_device

import kkmgpu
from kkmgpu.backend.device import resolve_device
from kkmgpu.methods import landmark_cut as lc
from kkmgpu.methods import landmark_graph as lg
from kkmgpu.metrics import nmi

CPU_AND_GPU = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


_host, _use = host, use_device


def _graph(X, p, r, dtype, device="cpu", seed=0, weights=None):
    """(F, R, B, rows, dy, sigma) of the fit's own steps on X (float64 host features F, prepared as fit does)."""
    backend = resolve_device(device)
    with backend.activate():
        Xd = backend.asarray(X)
        center = Xd.mean(axis=0, dtype=backend.xp.float64)
        R, _ = lg.representatives(Xd, p, center, 0, dtype, np.random.default_rng(seed), backend)
        index, sq = lc._neighbors(Xd, R, r, center, 0, dtype, backend, "fp32", rows=37)   # several tiles
        sigma = lg.sigma_of(sq, backend)
        B = lg.bipartite(index, sq, sigma, p, backend)
        w = backend.asarray(np.ones(X.shape[0]) if weights is None else weights)
        rows, _, dy = lg.degrees(B, w, backend)
        F = lg.features(Xd, 0, X.shape[0], center, 0, dtype, backend)
        return _host(F).astype(np.float64), _host(R).astype(np.float64), B, rows, dy, sigma, backend, w


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_bipartite_graph_is_the_float64_brute_force_one(dtype):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 6)) * [1, 2, 3, 1, 1, 5] + 7.0
    F, R, B, _, _, sigma, _, _ = _graph(X, 25, 4, dtype)
    D = cdist(F, R, "sqeuclidean")                                # the features' own values, in float64
    order = np.argsort(D, axis=1, kind="stable")[:, :4]
    near = np.take_along_axis(D, order, 1)
    assert sigma == pytest.approx(np.sqrt(near).mean(), rel=1e-12)
    ref = np.zeros(D.shape)
    np.put_along_axis(ref, order, np.exp(-near / (2 * sigma ** 2)), 1)
    np.testing.assert_allclose(_host(B.toarray()), ref, rtol=1e-12, atol=0)
    assert np.all(np.diff(_host(B.indptr)) == 4)


def test_transfer_cut_is_the_bipartite_graphs_eigendecomposition():
    X, _ = make_blobs(200, centers=4, cluster_std=1.5, random_state=3)
    k = 4
    _, _, B, rows, dy, _, backend, w = _graph(X, 20, 3, np.float64)
    B, dy, _ = lg.keep_linked(B, dy, backend)
    U, lam, V = lg.transfer_cut(B, rows, dy, w, k, backend)
    Bd = B.toarray()
    n, p = Bd.shape
    A = np.block([[np.zeros((n, n)), Bd], [Bd.T, np.zeros((p, p))]])
    d = A.sum(axis=1)
    gamma, Fv = scipy.linalg.eigh(np.diag(d) - A, np.diag(d))      # L f = gamma D f, f^T D f = 1
    assert gamma[k] - gamma[k - 1] > 1e-3                          # a subspace that is defined
    np.testing.assert_allclose(1.0 - np.sqrt(1.0 - lam), gamma[:k], atol=1e-10)
    np.testing.assert_allclose(gamma[:k] * (2 - gamma[:k]), lam, atol=1e-10)
    # the X parts: u^T D_X u = 1 each (half of f's D-norm), D_X-orthogonal, and the span of the reference's
    Dx = rows
    np.testing.assert_allclose(U.T @ (Dx[:, None] * U), np.eye(k), atol=1e-9)
    ref = Fv[:n, :k] * np.sqrt(2.0)
    angles = scipy.linalg.subspace_angles(np.sqrt(Dx)[:, None] * U, np.sqrt(Dx)[:, None] * ref)
    assert angles.max() < 1e-6
    np.testing.assert_allclose(V.T @ (dy[:, None] * V), np.eye(k), atol=1e-9)


def test_weights_count_points_as_copies():
    X, _ = make_blobs(120, centers=3, random_state=5)
    w = np.random.default_rng(0).integers(1, 4, size=120).astype(np.float64)
    _, _, B, rows, dy, _, backend, wd = _graph(X, 15, 3, np.float64, weights=w)
    copies = np.repeat(np.arange(120), w.astype(int))
    Bc = B[copies]
    rows_c, _, dy_c = lg.degrees(Bc, np.ones(copies.size), backend)
    np.testing.assert_allclose(dy, dy_c, rtol=1e-12)
    B1, dy1, _ = lg.keep_linked(B, dy, backend)
    B2, dy2, _ = lg.keep_linked(Bc, dy_c, backend)
    _, lam1, _ = lg.transfer_cut(B1, rows, dy1, wd, 3, backend)
    _, lam2, _ = lg.transfer_cut(B2, rows_c, dy2, np.ones(copies.size), 3, backend)
    np.testing.assert_allclose(lam1, lam2, atol=1e-12)
    labels = np.random.default_rng(1).integers(0, 3, size=120)
    P, size = lg.cluster_totals(B1, labels, wd, rows, 3, backend)
    P2, size2 = lg.cluster_totals(B2, labels[copies], np.ones(copies.size), rows_c, 3, backend)
    assert lg.ncut(P, size, dy1, backend)[0] == pytest.approx(lg.ncut(P2, size2, dy2, backend)[0], rel=1e-12)


def _dense_ncut(B, labels):
    """The normalized cut of ``labels`` on W = B D_Y^-1 B^T, from the dense W: sum_c cut(c, rest) / vol(c)."""
    W = B @ np.diag(1.0 / B.sum(axis=0)) @ B.T
    d = W.sum(axis=1)
    return sum(W[labels == c][:, labels != c].sum() / d[labels == c].sum() for c in np.unique(labels))


@pytest.mark.parametrize("max_iter", [0, 300])
def test_objective_is_the_cut_on_the_points_graph_and_predict_gives_labels(max_iter):
    X, y = make_blobs(400, centers=5, cluster_std=2.5, random_state=2)
    result = kkmgpu.fit(X, 5, objective="ncut", method="landmark", n_landmarks=40, device="cpu", random_state=0,
                        max_iter=max_iter, tol=0.0)
    state = result._graph_state
    B, _ = lc.new_graph(state, X, resolve_device("cpu"))
    assert result.objective == pytest.approx(_dense_ncut(B.toarray(), result.labels), rel=1e-10)
    assert result.objective_name == "ncut" and result.method == "landmark" and result.converged
    history = result.objective_history
    assert np.all(np.diff(history) <= 1e-12 * history[0])          # every refinement step lowers the cut
    np.testing.assert_array_equal(kkmgpu.predict(result, X), result.labels)
    assert result.method_params["n_landmarks"] == 40 and result.method_params["landmark_neighbors"] == 5


def test_recovers_blobs_and_moons_and_disconnected_clusters():
    X, y = make_blobs(1500, centers=6, cluster_std=0.7, random_state=0)
    result = kkmgpu.fit(X, 6, objective="ncut", method="landmark", n_landmarks=120, device="cpu", random_state=0)
    assert nmi(y, result.labels) > 0.97
    X, y = make_moons(1000, noise=0.06, random_state=0)
    result = kkmgpu.fit(X, 2, objective="ncut", method="landmark", n_landmarks=100, device="cpu", random_state=0)
    assert nmi(y, result.labels) > 0.95
    # far apart clusters: one component each, lambda = 0 as often, their cut 0
    X, y = make_blobs(600, centers=np.array([[0, 0], [1e3, 0], [0, 1e3], [1e3, 1e3]]), random_state=1)
    result = kkmgpu.fit(X, 4, objective="ncut", method="landmark", n_landmarks=60, device="cpu", random_state=0)
    assert nmi(y, result.labels) == pytest.approx(1.0)
    np.testing.assert_allclose(result.method_params["eigenvalues"], 0.0, atol=1e-12)
    assert result.objective == 0.0


def test_invalid_arguments_say_the_rule():
    X, _ = make_blobs(100, centers=3, random_state=0)

    def fit(**kwargs):
        return kkmgpu.fit(X, kwargs.pop("k", 3), objective=kwargs.pop("objective", "ncut"), method="landmark",
                          device="cpu", **kwargs)

    for kwargs, message in [({"n_landmarks": 101}, "n_landmarks=101 must be between k=3 and n_samples=100"),
                            ({"n_landmarks": 2}, "n_landmarks=2 must be between k=3"),
                            ({"n_landmarks": 10, "landmark_neighbors": 11}, "landmark_neighbors=11 must be between 1"),
                            ({"landmark_neighbors": 0}, "landmark_neighbors=0 must be between 1"),
                            ({"objective": "ratio_association"}, "use objective='ncut'"),
                            ({"affinity": "knn"}, "leave affinity, n_neighbors and graph_shift"),
                            ({"init": "k-means++"}, "init='k-means++'"),
                            ({"sample_weight": np.r_[0.0, np.ones(99)]}, "1 zero weight"),
                            ({"max_iter": -1}, "max_iter")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            fit(**kwargs)
    with pytest.raises(TypeError, match="landmark_neighbors"):
        fit(landmark_neighbors=2.5)
    with pytest.raises((TypeError, ValueError), match="dtype"):
        fit(dtype="int8")
    with pytest.raises(ValueError, match="landmark_neighbors=3 only applies to method='landmark'"):
        kkmgpu.fit(X, 3, objective="ncut", landmark_neighbors=3, device="cpu")
    with pytest.raises(ValueError, match="n_landmarks=10 applies to the graph objectives only with method='landmark'"):
        kkmgpu.fit(X, 3, objective="ncut", n_landmarks=10, device="cpu")


def test_hostile_scales_offsets_float32_duplicates_and_an_outlier():
    X, y = make_blobs(500, centers=np.array([[0, 0], [10, 0], [0, 10], [10, 10]]), cluster_std=0.8, random_state=4)
    kw = dict(objective="ncut", method="landmark", n_landmarks=50, device="cpu", random_state=0)
    base = kkmgpu.fit(X, 4, dtype="float64", **kw)
    assert nmi(y, base.labels) == pytest.approx(1.0)
    for variant in (X * 1e-20, X * 1e20 + 1e20, X + 1e7, X.astype(np.float32)):
        for dtype in ("float32", "float64"):
            labels = kkmgpu.fit(variant, 4, dtype=dtype, **kw).labels
            assert nmi(base.labels, labels) == pytest.approx(1.0)
    # 60 distinct points, each 5 times: duplicate landmarks are harmless
    D = np.repeat(X[:60], 5, axis=0)
    result = kkmgpu.fit(D, 4, **kw)
    assert np.isfinite(result.objective) and result.objective >= 0
    np.testing.assert_array_equal(kkmgpu.predict(result, D), result.labels)
    assert all(np.unique(result.labels[i * 5:(i + 1) * 5]).size == 1 for i in range(60))
    # a point 1e6 away: its weights keep their row shape (no zero degree), the rest is clustered as before
    Xo = np.vstack([X, [[1e6, 1e6]]])
    result = kkmgpu.fit(Xo, 4, **kw)
    assert np.isfinite(result.objective) and nmi(y, result.labels[:-1]) > 0.99


def assert_same_partition(a, b):
    """The same clusters whatever their numbers: the pairs (a_i, b_i) match each label of a with one of b."""
    a, b = np.asarray(_host(a)), np.asarray(_host(b))
    pairs = np.unique(np.stack([a, b]), axis=1)
    assert pairs.shape[1] == np.unique(a).size == np.unique(b).size, pairs


@pytest.mark.parametrize("device", CPU_AND_GPU)
def test_devices_agree_and_the_estimator_runs(device):
    """The GPU finds the CPU's clusters and cut (to float64 rounding; docs/devices-and-memory.md: devices agree to
    rounding, not to the bit). The clusters' numbers may differ: they follow the order of the embedding's k-means++
    seeds, a discrete draw that values moved in the last bits by another summation order can change (an H100 gave
    the CPU's 5 clusters with 3 of them renumbered, 2026-11-26). predict gives the fit's own numbering."""
    _use(device)
    X, y = make_blobs(800, centers=5, cluster_std=1.2, random_state=7)
    kw = dict(objective="ncut", method="landmark", n_landmarks=60, random_state=3, dtype="float64")
    cpu = kkmgpu.fit(X, 5, device="cpu", **kw)
    result = kkmgpu.fit(X, 5, device=device, **kw)
    assert_same_partition(result.labels, cpu.labels)
    assert result.objective == pytest.approx(cpu.objective, rel=1e-9)
    np.testing.assert_array_equal(_host(kkmgpu.predict(result, X)), _host(result.labels))
    model = kkmgpu.KernelKMeans(5, objective="ncut", method="landmark", n_landmarks=60, random_state=3,
                                device=device, dtype="float64").fit(X)
    assert_same_partition(model.labels_, cpu.labels)
    assert model.score(X) == pytest.approx(-cpu.objective, rel=1e-9)


def test_same_inputs_same_bits(device):
    """Two fits with the same inputs and seed give the same labels and cut bit for bit, on both devices. On a GPU
    every product with a dense operand takes the sparse one untransposed: cuSPARSE's transposed product adds in an
    order that changes between calls (modelled by the CuPy stand-in), and B^T w that way gave two fits of the same
    seed other labels."""
    _use(device)
    X, _ = make_blobs(600, centers=4, n_features=5, cluster_std=2.5, random_state=11)
    kw = dict(objective="ncut", method="landmark", random_state=0, device=device)
    first, second = kkmgpu.fit(X, 4, **kw), kkmgpu.fit(X, 4, **kw)
    np.testing.assert_array_equal(_host(first.labels), _host(second.labels))
    assert first.objective == second.objective
    np.testing.assert_array_equal(first.objective_history, second.objective_history)


def test_the_cli_fits_with_method_landmark(tmp_path, capsys):
    from kkmgpu.cli.commands import main

    X, y = make_blobs(600, centers=3, random_state=0)
    path = tmp_path / "blobs.csv"
    np.savetxt(path, X, delimiter=",")
    out = tmp_path / "labels.csv"
    assert main(["fit", str(path), "-k", "3", "--objective", "ncut", "--method", "landmark", "--n-landmarks", "40",
                 "--landmark-neighbors", "4", "--device", "cpu", "--seed", "0", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "bipartite to 40 landmarks, 4 neighbours" in text and "(normalized cut)" in text
    expected = kkmgpu.fit(X, 3, objective="ncut", method="landmark", n_landmarks=40, landmark_neighbors=4,
                          device="cpu", random_state=0).labels
    np.testing.assert_array_equal(np.loadtxt(out, dtype=int), expected)


def test_kmeans_on_a_sample_of_the_embedding_assigns_every_point_to_its_nearest_centre(monkeypatch):
    monkeypatch.setattr(lc, "KMEANS_SAMPLE", 300)
    X, y = make_blobs(1200, centers=4, cluster_std=1.0, random_state=8)
    result = kkmgpu.fit(X, 4, objective="ncut", method="landmark", n_landmarks=60, device="cpu", random_state=0,
                        max_iter=0)
    assert nmi(y, result.labels) > 0.95
    np.testing.assert_array_equal(kkmgpu.predict(result, X), result.labels)   # the nearest-centre rule, every row


def test_the_feature_exponent_from_column_extremes_is_graph_scales():
    from kkmgpu.methods import graph_scale

    backend = resolve_device("cpu")
    rng = np.random.default_rng(0)
    for X in (rng.normal(size=(300, 4)), rng.normal(size=(300, 4)) * 1e-20, rng.normal(size=(300, 4)) * 1e20 + 1e20,
              (rng.normal(size=(300, 4)) * 1e30).astype(np.float32), np.ones((5, 3))):
        center = X.mean(axis=0, dtype=np.float64)
        for dtype in (np.float32, np.float64):
            assert lc._exponent(X, center, dtype, backend) == graph_scale.feature_exponent(X, center, dtype, backend)


def test_identical_points_warn_once_at_the_callers_line():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = kkmgpu.fit(np.ones((30, 3)), 2, objective="ncut", method="landmark", n_landmarks=5, device="cpu",
                            random_state=0)
    said = [w for w in caught if "distinct clusters" in str(w.message)]
    assert len(said) == 1 and said[0].filename == __file__, [(str(w.message), w.filename) for w in caught]
    assert result.objective == 0.0 and np.unique(result.labels).size == 1


def test_verbose_and_progress_report_every_step(capsys):
    X, _ = make_blobs(500, centers=3, random_state=0)
    result = kkmgpu.fit(X, 3, objective="ncut", method="landmark", n_landmarks=30, device="cpu", random_state=0,
                        verbose=True, progress=True)
    captured = capsys.readouterr()
    said = [line for line in captured.out.splitlines() if line.startswith("[kkmgpu] landmark:")]
    for step in ("30 representatives", "bipartite graph: 500 points", "transfer cut: lambda", "k-means on the",
                 "refinement: ncut"):
        assert any(step in line for line in said), (step, said)
    assert f"{result.objective:.6g}" in said[-1]                     # the cut itself, as result.objective
    assert "ncut (landmark): 5/5 step" in captured.err
