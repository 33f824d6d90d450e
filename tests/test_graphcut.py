"""Graph objectives (kkmgpu/methods/graphcut.py): normalized cut and ratio association as weighted kernel k-means.

Against float64 references built from the dense affinity matrix (scipy's cdist, numpy's eigvalsh and the
reference Lloyd iterations of tests/reference.py):

- the reported objective is the normalized cut (or minus the ratio association) of the labels, computed from A
  directly; every entry of the history is that of the partition the iterations held;
- the Lloyd steps are those of weighted kernel k-means on K = sigma D^-1 + D^-1 A D^-1 with weights d (ncut) and
  K = sigma I + A (ratio association): same labels and history as the reference from the same initial labels;
- graph_shift="auto" makes K positive semi-definite, and the objective never rises then (random starts);
- the spectral start separates two spirals and two moons that kernel k-means on an RBF kernel cannot;
- predict equals the reference assignment of new points through their affinities to the training points, from
  float64 distances of the prepared features in every mode; predict(X_train) on fits of X * 1e20, X * 1e-25 and
  X + 1e7 gives predict(X)'s labels;
- method_params records the GEMM precision asked and the mode the neighbour search ran, and an explicit mode
  without effect warns;
- a precomputed affinity gives the fit from X; n_neighbors="search" keeps the lowest c-NNC; bad input raises.
"""

import time
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.spatial.distance import cdist

import kkmgpu
from kkmgpu.metrics import nmi
from tests.reference import assign_new_points, reference_kernel_kmeans
from tests.synthetic import blobs, random_partition


def dense_knn(X, n_neighbors):
    """The symmetric kNN affinity (G + G^T) / 2 of X in float64, from cdist."""
    D = cdist(X, X, "sqeuclidean")
    np.fill_diagonal(D, np.inf)
    n = X.shape[0]
    G = np.zeros((n, n))
    order = np.argsort(D, axis=1, kind="stable")[:, :n_neighbors]
    G[np.repeat(np.arange(n), n_neighbors), order.ravel()] = 1.0
    return 0.5 * (G + G.T), D


def reference_ncut(A, labels, k):
    d = A.sum(axis=1)
    return sum(1.0 - A[np.ix_(labels == c, labels == c)].sum() / d[labels == c].sum()
               for c in range(k) if (labels == c).any())


def reference_ratio_association(A, labels, k):
    return sum(A[np.ix_(labels == c, labels == c)].sum() / (labels == c).sum() for c in range(k) if (labels == c).any())


def graph_kernel(A, objective, shift):
    d = A.sum(axis=1)
    if objective == "ncut":
        return shift / d * np.eye(A.shape[0]) + A / np.outer(d, d), d
    return shift * np.eye(A.shape[0]) + A, np.ones(A.shape[0])


@pytest.mark.parametrize("objective", ["ncut", "ratio_association"])
def test_lloyd_steps_are_weighted_kernel_kmeans_on_the_graph_kernel(device, objective, rng):
    X, _ = blobs(160, 3, 4, int(rng.integers(1 << 30)), spread=2.0)
    A, _ = dense_knn(X, 8)
    init = random_partition(160, 4, int(rng.integers(1 << 30)))
    result = kkmgpu.fit(X, 4, objective=objective, affinity="knn", n_neighbors=8, init=init, graph_shift=0.5,
                        device=device, dtype="float64", tol=0)
    K, w = graph_kernel(A, objective, 0.5)
    ref = reference_kernel_kmeans(K, init, 4, sample_weight=w)
    np.testing.assert_array_equal(result.labels, ref.labels)
    assert result.n_iter == ref.n_iter
    # the history is the objective of each partition held, in the objective's own units
    units = [reference_ncut(A, lab, 4) if objective == "ncut" else -reference_ratio_association(A, lab, 4)
             for lab in ref.history_labels]
    np.testing.assert_allclose(result.objective_history, units, rtol=1e-9, atol=1e-9)
    # and J = sigma (n - k) - k + ncut (ncut) / sigma (n - k) - ratio association: the paper's identity
    offset = 0.5 * (160 - 4) - (4 if objective == "ncut" else 0)
    np.testing.assert_allclose(np.asarray(units) + offset, ref.objective_history, rtol=1e-10)
    assert result.objective == pytest.approx(units[-1], rel=1e-12, abs=1e-12)
    assert result.objective_name == objective and result.objective == result.exact_objective


@pytest.mark.parametrize("affinity", ["knn", "mutual_knn", "self_tuning"])
@pytest.mark.parametrize("objective", ["ncut", "ratio_association"])
def test_auto_shift_is_positive_semidefinite_and_the_objective_never_rises(affinity, objective, rng):
    X, _ = blobs(150, 2, 3, int(rng.integers(1 << 30)), spread=1.5)
    for seed in range(3):
        result = kkmgpu.fit(X, 5, objective=objective, affinity=affinity, n_neighbors=6, init="random", n_init=1,
                            random_state=seed, device="cpu", dtype="float64", tol=0)
        history = np.asarray(result.objective_history)
        assert np.all(np.diff(history) <= 1e-12 * np.abs(history[:-1]).max()), history
    graph = kkmgpu.kernels.graphs.affinity_graph(np.asarray(X - X.mean(axis=0)), 6, affinity,
                                                  kkmgpu.backend.device.resolve_device("cpu"))
    K, _ = graph_kernel(graph.toarray(), objective, result.method_params["graph_shift"])
    assert np.linalg.eigvalsh(K)[0] >= -1e-10


def test_reported_objective_is_the_normalized_cut_of_the_labels(device, rng):
    X, _ = blobs(200, 4, 3, int(rng.integers(1 << 30)))
    result = kkmgpu.fit(X, 3, objective="ncut", affinity="knn", n_neighbors=9, device=device, random_state=0)
    A, _ = dense_knn(X, 9)
    assert result.objective == pytest.approx(reference_ncut(A, np.asarray(result.labels), 3), rel=1e-9, abs=1e-12)
    assert result.objective_history[-1] == pytest.approx(result.objective, rel=1e-4, abs=1e-6)  # float32 K
    assert result.kernel == "graph:knn" and result.kernel_params == {"affinity": "knn", "n_neighbors": 9}
    assert result.method_params["objective"] == "ncut" and result.method_params["init"] == "spectral"


@pytest.mark.parametrize("maker", ["spirals", "moons"])
def test_spectral_start_separates_shapes_that_an_rbf_kernel_cannot(device, maker):
    if maker == "spirals":
        X, y = kkmgpu.datasets.make_two_spirals(800, random_state=1)
    else:
        datasets = pytest.importorskip("sklearn.datasets")
        X, y = datasets.make_moons(800, noise=0.06, random_state=1)
    graph = kkmgpu.fit(X, 2, objective="ncut", device=device, random_state=0)
    rbf = kkmgpu.fit(X, 2, device=device, random_state=0, n_init=10)
    assert nmi(y, graph.labels) > 0.9 > 0.5 > nmi(y, rbf.labels)
    kpp = kkmgpu.fit(X, 2, objective="ncut", init="k-means++", n_init=3, device=device, random_state=0)
    assert graph.objective < kpp.objective  # the documented reason for the default start


@pytest.mark.parametrize("components", [1, 3])
def test_spectral_embedding_is_the_top_eigenvectors_of_the_normalised_graph(device, components, rng):
    """The spectral start's eigenpairs equal numpy's eigh of D^-1/2 A D^-1/2 in float64: by Lanczos (ARPACK) for
    a connected graph on the CPU, by LOBPCG for a graph of three components (the eigenvalue 1 three times, which
    a single-vector Krylov method cannot be trusted to find) and on a GPU."""
    from kkmgpu.backend.device import resolve_device
    from kkmgpu.methods.graphcut import spectral_embedding

    centres = rng.normal(size=(3, 2)) * (60.0 if components == 3 else 2.0)
    X = np.concatenate([c + rng.normal(size=(150, 2)) for c in centres])
    A, _ = dense_knn(X, 8)
    d = A.sum(axis=1)
    backend = resolve_device(device)
    Ad = sp.csr_matrix(A)
    if backend.is_gpu:
        import cupyx.scipy.sparse

        Ad = cupyx.scipy.sparse.csr_matrix(Ad)
    k = 5
    E, w, _, solver = spectral_embedding(Ad, backend.asarray(d), k, backend, np.random.default_rng(0), tol=1e-8)
    assert solver == ("lobpcg" if backend.is_gpu else "arpack")
    want_w, want_V = np.linalg.eigh(A / np.sqrt(np.outer(d, d)))
    want_w, want_V = want_w[::-1][:k], want_V[:, ::-1][:, :k]
    np.testing.assert_allclose(w, want_w, atol=1e-6)
    assert np.sum(np.isclose(w, 1.0, atol=1e-6)) == components
    V = np.asarray(backend.to_host(E)) * np.sqrt(d)[:, None]   # back to eigenvectors: the same subspace
    np.testing.assert_allclose(np.linalg.svd(want_V.T @ V, compute_uv=False), 1.0, atol=1e-5)


def test_precomputed_affinity_gives_the_fit_from_X(rng):
    X, _ = blobs(180, 3, 3, int(rng.integers(1 << 30)))
    from_X = kkmgpu.fit(X, 3, objective="ncut", affinity="knn", n_neighbors=7, device="cpu", dtype="float64",
                        random_state=4)
    A, _ = dense_knn(X, 7)
    for given in (A, sp.csr_matrix(A)):
        pre = kkmgpu.fit(given, 3, objective="ncut", affinity="precomputed", device="cpu", dtype="float64",
                         random_state=4)
        np.testing.assert_array_equal(pre.labels, from_X.labels)
        assert pre.objective == pytest.approx(from_X.objective, rel=1e-12)
    with pytest.raises(ValueError, match="precomputed affinity matrix; predict needs the training features"):
        kkmgpu.predict(pre, X[:3])


@pytest.mark.filterwarnings("ignore:gemm_precision='tf32' has no effect:UserWarning")
@pytest.mark.parametrize("dtype, d, precision", [("float64", 2, "3xtf32"), ("float32", 32, "tf32")])
def test_predict_places_new_points_through_their_training_neighbours(device, dtype, d, precision, rng):
    """The reference: float64 distances (cdist) of the features as fit and predict prepare them (X and X_new
    minus X's mean, in ``dtype``); in float32 with 32 features a GPU searches in TF32."""
    X, _ = blobs(240, d, 3, int(rng.integers(1 << 30)), spread=2.0)
    X_new = X[:40] + rng.normal(scale=0.3, size=(40, d))
    result = kkmgpu.fit(X, 3, objective="ncut", n_neighbors=8, device=device, dtype=dtype, random_state=1,
                        gemm_precision=precision)
    features, new = ((Y - X.mean(axis=0)).astype(dtype).astype(np.float64) for Y in (X, X_new))
    A, D = dense_knn(features, 8)
    d = A.sum(axis=1)
    radius = np.sort(D, axis=1)[:, 7]
    D_new = cdist(new, features, "sqeuclidean")
    own = D_new <= np.sort(D_new, axis=1)[:, 7:8]
    W = 0.5 * own + 0.5 * (D_new < radius[None, :])
    shift = result.method_params["graph_shift"]
    K, _ = graph_kernel(A, "ncut", shift)
    expected = assign_new_points(W / np.outer(W.sum(axis=1), d), K, result.labels, 3, sample_weight=d)
    np.testing.assert_array_equal(kkmgpu.predict(result, X_new), expected)


def test_predict_on_scaled_and_offset_training_points_gives_the_labels_of_X(device, rng):
    """predict(result, X_train) for fits of X * 1e20 (float32's squares overflow), X * 1e-25 (they underflow) and
    X + 1e7 (float64 input that a cast before the centring would round to whole numbers; default dtype float32)
    gives predict(X)'s labels on X's fit, and those are its labels_ (no identical points here)."""
    X, _ = blobs(300, 3, 3, int(rng.integers(1 << 30)), spread=2.0)
    X *= 0.1
    base = kkmgpu.fit(X, 3, objective="ncut", device=device, random_state=0)
    want = kkmgpu.predict(base, X)
    np.testing.assert_array_equal(want, base.labels)
    for Xs in (X * 1e20, X * 1e-25, X + 1e7):
        result = kkmgpu.fit(Xs, 3, objective="ncut", device=device, random_state=0)
        np.testing.assert_array_equal(result.labels, base.labels)
        np.testing.assert_array_equal(kkmgpu.predict(result, Xs), want)


def test_fit_records_the_gemm_precision_and_warns_where_it_has_no_effect(device, rng, knn_search_modes):
    """method_params: "gemm_precision" as asked, "gemm_mode" the mode the neighbour search reported running (the
    default 3xtf32 on a GPU's float32 features of 32 columns, fp32 on the CPU, fp64 for float64, None for a
    precomputed affinity). An explicit mode warns where it has no effect (the CPU, float64, a precomputed
    affinity), once, pointing at the caller; where it runs, it does not."""
    ran = knn_search_modes
    X, _ = blobs(120, 32, 2, int(rng.integers(1 << 30)), spread=3.0)
    gpu = device == "cuda"

    def params(data=X, **kwargs):
        ran.clear()
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            result = kkmgpu.fit(data, 2, objective="ncut", device=device, random_state=0, **kwargs)
        mine = [w for w in record if "gemm_precision" in str(w.message)]
        assert all(w.filename == __file__ for w in mine)
        assert ran == ([] if kwargs.get("affinity") == "precomputed" else [result.method_params["gemm_mode"]])
        return result.method_params, [str(w.message) for w in mine]

    got, said = params()
    assert got["gemm_precision"] == "3xtf32" and got["gemm_mode"] == ("3xtf32" if gpu else "fp32") and said == []
    got, said = params(gemm_precision="tf32")
    assert got["gemm_precision"] == "tf32" and got["gemm_mode"] == ("tf32" if gpu else "fp32")
    assert said == ([] if gpu else ["gemm_precision='tf32' has no effect: the CPU computes IEEE float32 GEMMs; the "
                                    "modes apply to NVIDIA GPUs with tensor cores (Ampere or newer)."])
    got, said = params(gemm_precision="fp32", dtype="float64")
    assert got["gemm_mode"] == "fp64" and len(said) == 1
    assert said[0].startswith("gemm_precision='fp32' has no effect: " + ("dtype='float64'" if gpu else "the CPU"))
    got, said = params(dense_knn(X, 10)[0], affinity="precomputed", gemm_precision="fp32")
    assert got["gemm_precision"] == "fp32" and got["gemm_mode"] is None
    assert said == ["gemm_precision='fp32' has no effect: affinity='precomputed' has no kernel products of "
                    "features."]


def test_mutual_and_self_tuning_predict_agree_with_the_fit_on_training_points(rng):
    X, y = kkmgpu.datasets.make_two_spirals(600, random_state=2)
    for affinity in ("mutual_knn", "self_tuning"):
        result = kkmgpu.fit(X, 2, objective="ncut", affinity=affinity, device="cpu", random_state=0)
        moved = X + rng.normal(scale=0.01, size=X.shape)
        assert np.mean(kkmgpu.predict(result, moved) == result.labels) > 0.97


def test_neighbour_search_keeps_the_largest_spectral_gap_ratio(rng):
    """n_neighbors="search" scores the default family's graphs with 5 ... 30 neighbours by lambda_{k+1} / lambda_k
    of their normalised Laplacians (each against a dense float64 eigendecomposition of the graph the fit would
    build) and fits the eligible one of largest ratio, with no prior."""
    from kkmgpu.methods.graph_search import GraphSearch

    X, y = blobs(150, 2, 3, int(rng.integers(1 << 30)), spread=3.0)
    result = kkmgpu.fit(X, 3, objective="ncut", n_neighbors="search", device="cpu", random_state=0)
    search = result.method_params["graph_search"]
    assert isinstance(search, GraphSearch) and search.prior is None
    assert [(c.affinity, c.n_neighbors) for c in search.candidates] == [("self_tuning", m)
                                                                       for m in (5, 7, 10, 15, 20, 30)]
    for c in search.candidates:
        single = kkmgpu.fit(X, 3, objective="ncut", n_neighbors=c.n_neighbors, device="cpu", random_state=0,
                            n_init=1)
        A = single._graph_state.graph.graph.toarray().astype(np.float64)
        d = A.sum(axis=1)
        lam = np.sort(1 - np.linalg.eigvalsh(A / np.sqrt(np.outer(d, d))))
        if c.eligible:
            assert c.ratio == pytest.approx(lam[3] / lam[2], rel=1e-4)
    best = max((c for c in search.candidates if c.eligible), key=lambda c: c.ratio)
    assert search.chosen == best and result.method_params["n_neighbors"] == best.n_neighbors
    assert result.kernel_params == {"affinity": "self_tuning", "n_neighbors": best.n_neighbors}


def test_estimator_and_cli(tmp_path, capsys):
    X, y = kkmgpu.datasets.make_two_spirals(500, random_state=3)
    model = kkmgpu.KernelKMeans(2, objective="ncut", n_neighbors=10, device="cpu", random_state=0).fit(X)
    assert nmi(y, model.labels_) > 0.9 and model.inertia_ == model.result_.objective
    np.testing.assert_array_equal(model.predict(X[:50] + 1e-3), model.labels_[:50])
    path = tmp_path / "spirals.csv"
    np.savetxt(path, np.c_[X, y], delimiter=",")
    from kkmgpu.__main__ import main

    assert main(["fit", str(path), "-k", "2", "--objective", "ncut", "--affinity", "knn", "--n-neighbors", "10",
                 "--labels-last-column", "--device", "cpu", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert "(normalized cut)" in out and "knn, 10 neighbours" in out


@pytest.mark.parametrize("kwargs, match", [
    (dict(objective="cut"), "objective='cut' is not one of 'kernel_kmeans', 'ncut', 'ratio_association'"),
    (dict(objective="ncut", affinity="rbf"), "affinity='rbf' is not one of"),
    (dict(objective="ncut", n_neighbors=0), "n_neighbors=0 must be >= 1"),
    (dict(objective="ncut", n_neighbors=40), "n_neighbors=40 must be between 1 and n_samples - 1 = 29"),
    (dict(objective="ncut", n_neighbors="many"), "n_neighbors='many' must be an integer or 'search'"),
    (dict(objective="ncut", graph_shift=-1.0), "graph_shift=-1.0 must be 'auto' or a finite number >= 0"),
    (dict(objective="ncut", kernel="linear"), "leave kernel and gamma at their defaults"),
    (dict(objective="ncut", gamma=2.0), "leave kernel and gamma at their defaults"),
    (dict(objective="ncut", method="cats"), "method='exact'; got method='cats'"),
    (dict(objective="ncut", sample_weight=np.ones(30)), "sample_weight does not apply to the graph objectives"),
    (dict(objective="ncut", init="sideways"), "init='sideways' is not valid"),
    (dict(init="spectral"), "init='spectral' starts the graph objectives"),
    (dict(n_neighbors=5), "affinity, n_neighbors and graph_shift belong to the graph objectives"),
])
def test_bad_arguments_name_the_value_and_the_rule(kwargs, match):
    X = np.random.default_rng(0).normal(size=(30, 2))
    with pytest.raises(ValueError, match=match):
        kkmgpu.fit(X, 2, device="cpu", **kwargs)


def test_bad_precomputed_affinities():
    A = np.ones((6, 6)) - np.eye(6)
    bad = A.copy()
    bad[0, 1] = -1.0
    with pytest.raises(ValueError, match="negative entry"):
        kkmgpu.fit(bad, 2, objective="ncut", affinity="precomputed", device="cpu")
    bad = A.copy()
    bad[0, 1] = 3.0
    with pytest.raises(ValueError, match="symmetric"):
        kkmgpu.fit(bad, 2, objective="ncut", affinity="precomputed", device="cpu")
    lonely = A.copy()
    lonely[0, :] = lonely[:, 0] = 0.0
    with pytest.raises(ValueError, match="1 point\\(s\\) have no edge"):
        kkmgpu.fit(lonely, 2, objective="ncut", affinity="precomputed", device="cpu")


# --- survivors of mutation run 6 (docs/mutation-testing.md): _check_affinity_matrix, _warn_without_effect, fit,
# graph_objective and _say_again ---------------------------------------------------------------------------------

def test_an_affinity_in_float32_is_taken_in_float64(device, rng):
    """A precomputed affinity of float32 weights, dense or sparse, gives the fit of the same values in float64: the
    degrees (result.sample_weight) are their float64 row sums, the reported cut that of the float64 matrix."""
    X, _ = blobs(120, 2, 3, int(rng.integers(1 << 30)), spread=2.0)
    A, _ = dense_knn(X, 8)
    W = np.triu(rng.uniform(0.1, 1.0, size=A.shape), 1)
    A = (A * (W + W.T)).astype(np.float32)
    A64 = A.astype(np.float64)
    d = A64.sum(axis=1)
    want = kkmgpu.fit(A64, 3, objective="ncut", affinity="precomputed", device=device, dtype="float64",
                      random_state=0, n_init=2)
    for given in (A, sp.csr_matrix(A)):
        result = kkmgpu.fit(given, 3, objective="ncut", affinity="precomputed", device=device, dtype="float64",
                            random_state=0, n_init=2)
        np.testing.assert_array_equal(result.labels, want.labels)
        np.testing.assert_allclose(result.sample_weight, d, rtol=1e-14)
        labels = np.asarray(result.labels)
        assert result.objective == pytest.approx(reference_ncut(A64, labels, 3), rel=1e-13, abs=1e-15)


def test_bad_precomputed_affinities_name_the_rule():
    """A sparse affinity is checked as a dense one: square, finite, >= 0, symmetric; each message says which."""
    A = sp.csr_matrix(np.ones((6, 6)) - np.eye(6))

    def fails(given, match):
        with pytest.raises(ValueError, match=match):
            kkmgpu.fit(given, 2, objective="ncut", affinity="precomputed", device="cpu")

    fails(sp.csr_matrix(np.ones((5, 6))), r"affinity='precomputed' needs a square matrix; got shape \(5, 6\)")
    for value in (np.inf, np.nan):
        bad = A.copy()
        bad.data[0] = value
        fails(bad, "the affinity matrix has non-finite entries; every entry must be finite")
    bad = A.toarray()
    bad[0, 1] = bad[1, 0] = -0.5
    fails(sp.csr_matrix(bad), r"negative entry \(-0\.5\); affinities must be >= 0")
    bad[0, 1] = bad[1, 0] = 1.0
    bad[0, 2] = 3.0
    for given in (bad, sp.csr_matrix(bad)):
        fails(given, "the affinity matrix is not a symmetric")


@pytest.mark.parametrize("objective", ["ncut", "ratio_association"])
def test_graph_objective_of_labels_with_empty_and_singleton_clusters(device, objective, rng):
    """graph_objective (the reported objective, and KernelKMeans.score's on the rows scored) equals the float64
    reference where clusters are empty (the first, a middle and the last label unused), a singleton, or of total
    degree below 1 (small weights): empty clusters add 0."""
    from kkmgpu.backend.device import resolve_device
    from kkmgpu.engine.sparse import to_backend_csr
    from kkmgpu.methods.graphcut import degrees, graph_objective

    backend = resolve_device(device)
    n, k = 40, 7
    A = rng.uniform(0.0, 1e-3, size=(n, n)) * (rng.random((n, n)) < 0.3)
    A = A + A.T + np.diag(rng.uniform(1e-4, 1e-3, size=n))  # self loops: a singleton's links(c, c) > 0
    labels = rng.choice([1, 3, 5], size=n)
    labels[7] = 4                                            # a singleton; 0, 2 and 6 stay empty
    Ad = to_backend_csr(sp.csr_matrix(A), backend, np.float64)
    value = graph_objective(Ad, degrees(Ad, backend), backend.asarray(labels), k, objective, backend)
    want = reference_ncut(A, labels, k) if objective == "ncut" else -reference_ratio_association(A, labels, k)
    assert value == pytest.approx(want, rel=1e-12)


def test_explicit_gemm_precision_warns_only_where_it_has_no_effect(device, rng, knn_search_modes):
    """The warning's presence, category and reason (its attribution is test_fit_records_the_gemm_precision_...'s):
    tf32 on 32 float32 features runs on a GPU and warns on the CPU; fp32 on float32 features runs everywhere; a
    precomputed affinity, dense or sparse, has no products to run. method_params["gemm_mode"] is the mode the
    neighbour search ran (device="cpu" stays on the CPU where a GPU is usable)."""
    ran = knn_search_modes
    X, _ = blobs(120, 32, 2, int(rng.integers(1 << 30)), spread=3.0)
    gpu = device == "cuda"

    def said(data=X, **kwargs):
        ran.clear()
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            result = kkmgpu.fit(data, 2, objective="ncut", device=device, random_state=0, n_init=2, **kwargs)
        mine = [w for w in record if "gemm_precision" in str(w.message)]
        assert all(w.category is UserWarning for w in mine)
        return result.method_params, ran[:], [str(w.message) for w in mine]

    params, searched, messages = said(gemm_precision="tf32")
    assert params["gemm_mode"] == ("tf32" if gpu else "fp32") and searched == [params["gemm_mode"]]
    assert messages == ([] if gpu else ["gemm_precision='tf32' has no effect: the CPU computes IEEE float32 GEMMs; "
                                        "the modes apply to NVIDIA GPUs with tensor cores (Ampere or newer)."])
    params, searched, messages = said(gemm_precision="fp32")
    assert params["gemm_mode"] == "fp32" and searched == ["fp32"] and messages == []
    A = dense_knn(X, 10)[0]
    for given in (A, sp.csr_matrix(A)):
        params, searched, messages = said(given, affinity="precomputed", gemm_precision="fp32")
        assert params["gemm_mode"] is None and searched == []
        assert messages == ["gemm_precision='fp32' has no effect: affinity='precomputed' has no kernel products of "
                            "features."]


def _warned(record, fragment):
    return [w for w in record if fragment in str(w.message)]


@pytest.mark.parametrize("objective", ["ncut", "ratio_association"])
def test_refinement_warnings_are_said_once_each(device, objective):
    """Ten random starts that each stop at max_iter=1 or hold fewer distinct clusters than k: each warning once, a
    ConvergenceWarning with its own text. Three blocks of identical rows (a precomputed affinity, graph_shift=0:
    the points of a block coincide in the graph kernel's feature space) for k=4: 3 distinct clusters, said by
    the refinement; 40 identical points for k=3: 1, said from X (kkmgpu._degenerate) in place of the refinement."""
    cases = [(np.kron(np.eye(3), np.ones((10, 10))), 4, dict(affinity="precomputed"), 3),
             (np.ones((40, 2)), 3, {}, 1)]
    for X, k, kwargs, distinct in cases:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            kkmgpu.fit(X, k, objective=objective, graph_shift=0.0, n_init=10, max_iter=1, device=device,
                       random_state=0, init="random", **kwargs)  # random starts: none is a fixed point
        stopped, few = _warned(record, "did not converge"), _warned(record, "distinct clusters")
        assert len(stopped) == 1 and len(few) == 1, [str(w.message) for w in record]
        assert str(stopped[0].message).startswith("kernel k-means did not converge in max_iter=1 iterations")
        assert str(few[0].message).startswith(f"Number of distinct clusters ({distinct}) found smaller than "
                                              f"n_clusters ({k})")
        assert stopped[0].category is few[0].category is kkmgpu.ConvergenceWarning


def test_ncut_shift_is_unitless_and_reported_as_used(device, rng):
    """The normalized cut's sigma has no units (K = sigma D^-1 + D^-1 A D^-1 scales with A as a whole), so A * s
    with graph_shift=0.5 runs the Lloyd steps of A's kernel with sigma 0.5 for s = 1, 2**-20, 1e30, and
    method_params reports 0.5; graph_shift="auto" reports -1.01 lambda_min(D^-1/2 A D^-1/2) (docs/graphs.md)."""
    X, _ = blobs(100, 2, 3, int(rng.integers(1 << 30)), spread=2.0)
    A, _ = dense_knn(X, 7)
    init = random_partition(100, 3, int(rng.integers(1 << 30)))
    K, w = graph_kernel(A, "ncut", 0.5)
    ref = reference_kernel_kmeans(K, init, 3, sample_weight=w)
    for scale in (1.0, 2.0 ** -20, 1e30):
        result = kkmgpu.fit(A * scale, 3, objective="ncut", affinity="precomputed", graph_shift=0.5, init=init,
                            device=device, dtype="float64", tol=0)
        assert result.method_params["graph_shift"] == 0.5
        np.testing.assert_array_equal(result.labels, ref.labels)
        assert result.n_iter == ref.n_iter
    auto = kkmgpu.fit(A, 3, objective="ncut", affinity="precomputed", device=device, random_state=0)
    d = A.sum(axis=1)
    lam = np.linalg.eigvalsh(A / np.sqrt(np.outer(d, d)))[0]
    assert auto.method_params["graph_shift"] == pytest.approx(-1.01 * lam, rel=1e-4)   # Lanczos to SHIFT_TOL


def test_float32_features_near_their_largest_value_and_predict_on_them(device, rng):
    """float32 X * 2**120 (entries near 1e37: their float32 sum is infinite, the float64 mean is not) gives X's
    labels, and new points, nearer the mean than any training point is far from it (their own power-of-two scale
    is another), are placed as X's fit places them: they are prepared with the training's scale."""
    X, _ = blobs(200, 3, 3, int(rng.integers(1 << 30)), spread=2.0)
    X = (X - X.min(axis=0) + 1.0).astype(np.float32)
    s = np.float32(2.0 ** 120)
    base = kkmgpu.fit(X, 3, objective="ncut", device=device, random_state=0, n_init=2)
    result = kkmgpu.fit(X * s, 3, objective="ncut", device=device, random_state=0, n_init=2)
    np.testing.assert_array_equal(result.labels, base.labels)
    center = X.mean(axis=0)
    X_new = (center + 0.1 * (X[:40] - center)).astype(np.float32)
    np.testing.assert_array_equal(kkmgpu.predict(result, X_new * s), kkmgpu.predict(base, X_new))


# --- survivors of mutation run 6 (docs/mutation-testing.md): check_graph_args, checked_fit, fit, _check_degrees and
# graph_spectral.diag ---------------------------------------------------------------------------------------------

def test_bad_graph_arguments_and_isolated_points_name_the_value_and_the_rule():
    """Each rule of the graph objectives' checks, with the part of its message that states the rule or the advice;
    points of degree 0 are named (the first five, then "...")."""
    import re

    X = np.random.default_rng(1).normal(size=(30, 2))

    def fails(fragment, data=X, error=ValueError, **kwargs):
        with pytest.raises(error, match=re.escape(fragment)):
            kkmgpu.fit(data, 2, objective="ncut", device="cpu", **kwargs)

    fails("affinity='gaussian' is not one of 'knn', 'mutual_knn', 'self_tuning', 'precomputed'", affinity="gaussian")
    fails("(a precomputed affinity matrix: affinity='precomputed')", kernel="linear")
    fails("the normalized cut weights every point by its degree, the ratio association by 1.",
          sample_weight=np.ones(30))
    fails("n_neighbors='search' builds graphs from X; it does not apply to affinity='precomputed'",
          data=np.ones((8, 8)) - np.eye(8), affinity="precomputed", n_neighbors="search")
    fails("n_neighbors=30 must be between 1 and n_samples - 1 = 29", n_neighbors=30)
    for bad in ("big", np.nan, np.inf, True, None, [1.0]):
        fails(f"graph_shift={bad!r} must be 'auto' or a finite number >= 0", graph_shift=bad)
    fails("init='sideways' is not valid; use 'auto', 'spectral', 'k-means++', 'random' or an array of labels",
          init="sideways")
    # sparse features are not an affinity: the features' own message, not one about their number of columns
    fails("sparse input is accepted only as a kernel matrix", data=sp.csr_matrix(X), error=TypeError)
    for rows, named in (([0], "0"), ([2, 7], "2, 7"), ([0, 1, 2, 3, 4], "0, 1, 2, 3, 4"),
                        ([0, 1, 2, 3, 4, 5], "0, 1, 2, 3, 4, ..."), ([1, 2, 3, 4, 5, 6, 7], "1, 2, 3, 4, 5, ...")):
        A = np.ones((12, 12)) - np.eye(12)
        A[rows, :] = A[:, rows] = 0.0
        fails(f"{len(rows)} point(s) have no edge in the affinity matrix (degree 0: no positive entry in row "
              f"{named}); every point needs at least one.", data=A, affinity="precomputed")
        fails("Give each such point an affinity to another, or leave it out.", data=sp.csr_matrix(A),
              affinity="precomputed")


def test_features_as_a_list_give_the_fit_of_the_array(rng):
    X, _ = blobs(90, 2, 3, int(rng.integers(1 << 30)), spread=2.0)
    want = kkmgpu.fit(X, 3, objective="ncut", device="cpu", random_state=0, n_init=2)
    got = kkmgpu.fit(X.tolist(), 3, objective="ncut", device="cpu", random_state=0, n_init=2)
    np.testing.assert_array_equal(got.labels, want.labels)


def test_every_restart_is_reported_and_auto_restarts_follow_the_docs(device, rng):
    """result.n_init is the number of restarts run and result.objectives the final objective of each (in the
    objective's units, the lowest the reported one up to float32 rounding), for a string start (one refinement
    with n_init restarts: k-means++, random) as for spectral starts; n_init="auto" is 1 for "k-means++", 10 for
    "random" and "spectral" (kkmgpu.fit's docs)."""
    X, _ = blobs(120, 2, 4, int(rng.integers(1 << 30)), spread=4.0)
    for init, n_init, runs in (("k-means++", 3, 3), ("random", 2, 2), ("spectral", 2, 2), ("k-means++", "auto", 1),
                               ("random", "auto", 10), ("spectral", "auto", 10)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")   # nor a warning about restarts of an array start
            result = kkmgpu.fit(X, 4, objective="ncut", init=init, n_init=n_init, device=device, random_state=0)
        assert result.n_init == runs and result.objectives.shape == (runs,), (init, n_init, result.objectives)
        assert result.objectives.min() == pytest.approx(result.objective, rel=1e-4, abs=1e-5)


def test_graph_fit_timings_are_parts_of_the_total(rng):
    """result.timings: the graph build, kernel build, start and iterations each take >= 0 s (the iterations > 0),
    together no more than the total, which is no more than the call's own wall time."""
    X, _ = blobs(100, 2, 3, int(rng.integers(1 << 30)), spread=2.0)
    begin = time.perf_counter()
    result = kkmgpu.fit(X, 3, objective="ncut", device="cpu", random_state=0, n_init=2)
    wall = time.perf_counter() - begin
    t = result.timings
    parts = [t["graph"], t["kernel_build"], t["init"], t["iterations"]]
    assert min(parts) >= 0.0 and t["iterations"] > 0.0
    assert sum(parts) <= t["total"] <= wall


@pytest.mark.parametrize("objective", ["ncut", "ratio_association"])
def test_reported_sizes_weights_and_params_are_in_the_affinity_units(device, objective, rng):
    """A precomputed affinity A * s (s = 2**-20, 1e30, 3: normalize_scale divides by a power of two): cluster_sizes
    are d(c) of the given matrix (ncut) or the counts |c|, sample_weight its degrees or 1, kernel_params names the
    affinity only, method_params["init"] is "array" for an array start, the dtype the one asked."""
    X, _ = blobs(90, 2, 3, int(rng.integers(1 << 30)), spread=2.0)
    A, _ = dense_knn(X, 7)
    init = random_partition(90, 3, int(rng.integers(1 << 30)))
    for s in (2.0 ** -20, 1e30, 3.0):
        result = kkmgpu.fit(A * s, 3, objective=objective, affinity="precomputed", init=init, device=device,
                            dtype="float32", random_state=0)
        labels = np.asarray(result.labels)
        d = (A * s).sum(axis=1)
        weights = d if objective == "ncut" else np.ones(90)
        np.testing.assert_allclose(result.sample_weight, weights, rtol=1e-14)
        np.testing.assert_allclose(result.cluster_sizes, np.bincount(labels, weights=weights, minlength=3),
                                   rtol=1e-12)
        assert result.kernel_params == {"affinity": "precomputed"}
        assert result.method_params["init"] == "array" and result.dtype == "float32"


def test_float64_fit_records_fp64_and_the_precision_asked(device, rng):
    """dtype="float64" runs the refinement in float64 and the neighbour search in fp64 (method_params), and
    method_params keeps the precision asked; features of 2 columns run fp32 on every device (a side below 32)."""
    X, _ = blobs(100, 2, 3, int(rng.integers(1 << 30)), spread=2.0)
    with pytest.warns(UserWarning, match="gemm_precision='tf32' has no effect"):
        result = kkmgpu.fit(X, 3, objective="ncut", device=device, dtype="float64", random_state=0, n_init=2,
                            gemm_precision="tf32")
    assert result.dtype == "float64" and result.method_params["gemm_mode"] == "fp64"
    assert result.method_params["gemm_precision"] == "tf32"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        result = kkmgpu.fit(X, 3, objective="ncut", device=device, random_state=0, n_init=2, gemm_precision="tf32")
    assert result.dtype == "float32" and result.method_params["gemm_mode"] == "fp32"
    assert result.method_params["gemm_precision"] == "tf32" and result.device.startswith(device)


def test_verbose_graph_fit_prints_the_iterations(capsys, rng):
    X, _ = blobs(80, 2, 3, int(rng.integers(1 << 30)), spread=2.0)
    kkmgpu.fit(X, 3, objective="ncut", device="cpu", random_state=0, n_init=2, verbose=True)
    assert "[ncut] start 0: iteration 0: ncut" in capsys.readouterr().out   # the cut (tests/test_graph_progress.py)
    kkmgpu.fit(X, 3, objective="ncut", n_neighbors="search", device="cpu", random_state=0, n_init=1, verbose=True)
    assert "[ncut] iteration 0: ncut" in capsys.readouterr().out


def test_seeded_string_starts_and_neighbour_search_repeat(rng):
    """random_state reaches the refinement's own k-means++ / random starts and every fit of n_neighbors="search":
    the same seed gives the same clustering (on data without clusters, where starts decide the result)."""
    X = rng.uniform(size=(80, 2))
    for kwargs in (dict(init="k-means++", n_init=2), dict(init="random", n_init=2),
                   dict(init="random", n_init=1, n_neighbors="search")):
        a, b = (kkmgpu.fit(X, 6, objective="ncut", device="cpu", random_state=3, **kwargs) for _ in range(2))
        np.testing.assert_array_equal(a.labels, b.labels)
        np.testing.assert_array_equal(a.objectives, b.objectives)


def test_keep_on_device_leaves_the_labels_on_the_device(device, rng):
    X, _ = blobs(80, 2, 3, int(rng.integers(1 << 30)), spread=2.0)
    result = kkmgpu.fit(X, 3, objective="ncut", device=device, random_state=0, n_init=2, keep_on_device=True)
    host = kkmgpu.fit(X, 3, objective="ncut", device=device, random_state=0, n_init=2)
    assert isinstance(result.labels, np.ndarray) == (device == "cpu") and isinstance(host.labels, np.ndarray)
    np.testing.assert_array_equal(kkmgpu.backend.device.resolve_device(device).to_host(result.labels), host.labels)


@pytest.mark.parametrize("objective", ["ncut", "ratio_association"])
def test_history_of_an_affinity_with_self_loops_is_in_the_objective_units(device, objective, rng):
    """With self loops (A_ii > 0), sum_i w_i K_ii holds sum_i A_ii / d_i (ncut) or tr A: J = sigma (n - k) - k +
    ncut + sum_i A_ii / d_i, or sigma (n - k) + tr A - ratio association. The history and the restarts' objectives,
    J less its constant, are the objective of their partitions (float64 reference), the last the reported one."""
    X, _ = blobs(90, 2, 3, int(rng.integers(1 << 30)), spread=2.0)
    A, _ = dense_knn(X, 7)
    A += np.diag(rng.uniform(0.5, 3.0, size=90))
    init = random_partition(90, 3, int(rng.integers(1 << 30)))
    K, w = graph_kernel(A, objective, 0.5)
    ref = reference_kernel_kmeans(K, init, 3, sample_weight=w)
    result = kkmgpu.fit(A, 3, objective=objective, affinity="precomputed", graph_shift=0.5, init=init,
                        device=device, dtype="float64", tol=0)
    np.testing.assert_array_equal(result.labels, ref.labels)
    units = [reference_ncut(A, lab, 3) if objective == "ncut" else -reference_ratio_association(A, lab, 3)
             for lab in ref.history_labels]
    np.testing.assert_allclose(result.objective_history, units, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(result.objectives, [result.objective], rtol=1e-9, atol=1e-9)


def test_a_perfect_cut_in_float32_is_reported_as_zero(device):
    """k components with random weights (with self loops or not) and their own partition: the cut is 0. In float32
    the history's J less its constant is 0 up to rounding, within 64 eps (sigma n + k + sum_i A_ii / d_i) (kkmgpu.fit's
    docs); a value below 0 is that rounding and reported as 0, never as a negative cut."""
    import scipy.linalg

    k, m = 4, 15
    eps = float(np.finfo(np.float32).eps)
    for loops, shift, seed in ((False, 0.0, 0), (True, 0.0, 2), (True, 100.0, 0), (False, 1e4, 4)):
        rng = np.random.default_rng(seed)
        A = scipy.linalg.block_diag(*[B + B.T for B in (rng.uniform(0.5, 2.0, size=(m, m)) for _ in range(k))])
        A[np.diag_indices(k * m)] = rng.uniform(0, 50, size=k * m) if loops else 0.0
        result = kkmgpu.fit(A, k, objective="ncut", affinity="precomputed", graph_shift=shift,
                            init=np.repeat(np.arange(k), m), dtype="float32", device=device)
        bound = 64 * eps * (shift * k * m + k + np.sum(np.diag(A) / A.sum(axis=1)))
        assert result.objective == 0.0 and np.all(result.objectives >= 0.0), (loops, shift, result.objectives)
        assert np.all(result.objective_history >= 0.0) and result.objective_history[-1] <= bound


def test_progress_reaches_each_start_refinement(monkeypatch, rng):
    """progress=True: each start's refinement opens its own (nested, transient) bar of kernel k-means, shown while a
    long refinement runs (the spectral start's own k-means shows none); progress=False shows none."""
    from kkmgpu._progress import progress_bar
    from kkmgpu.engine import lloyd

    opened = []

    def spy(*args, desc, enabled, **kwargs):
        opened.append((desc, enabled))
        return progress_bar(*args, desc=desc, enabled=enabled, **kwargs)

    from kkmgpu.methods import graph_refine

    refined = []
    light = graph_refine.Refinements._light

    def counted(self, labels0):
        refined.append(1)
        return light(self, labels0)

    monkeypatch.setattr(lloyd, "progress_bar", spy)
    monkeypatch.setattr(graph_refine.Refinements, "_light", counted)
    X, _ = blobs(80, 2, 3, int(rng.integers(1 << 30)), spread=2.0)
    for progress in (True, False):
        opened.clear()
        refined.clear()
        kkmgpu.fit(X, 3, objective="ncut", device="cpu", random_state=0, n_init=2, progress=progress)
        # one bar per distinct start refined (an equal start takes the earlier one's refinement)
        assert 1 <= len(refined) <= 2
        assert [enabled for desc, enabled in opened if desc == "kernel k-means"].count(True) == len(refined) * progress


def test_identical_points_warn_from_x_with_the_default_settings():
    """40 copies of one point, k = 3: the refinement separates them (their graph rows differ), X does not; the
    warning about fewer distinct points than clusters is said, once, from X (kkmgpu._degenerate)."""
    X = np.tile(np.random.default_rng(2).normal(size=(1, 2)), (40, 1))
    with pytest.warns(kkmgpu.ConvergenceWarning) as record:
        kkmgpu.fit(X, 3, objective="ncut", device="cpu", random_state=0)
    said = [str(w.message) for w in record if "distinct clusters" in str(w.message)]
    assert len(said) == 1 and said[0].startswith("Number of distinct clusters (1) found smaller than n_clusters (3)")


def test_tol_reaches_the_refinement(device, rng):
    """A tol above every relative change stops the refinement after its first assignment step: the labels of the
    reference's first step from the same initial labels (tol=0 runs on)."""
    X, _ = blobs(120, 2, 4, int(rng.integers(1 << 30)), spread=2.0)
    A, _ = dense_knn(X, 8)
    init = random_partition(120, 4, int(rng.integers(1 << 30)))
    K, w = graph_kernel(A, "ncut", 0.5)
    ref = reference_kernel_kmeans(K, init, 4, sample_weight=w)
    assert ref.n_iter > 2
    result = kkmgpu.fit(X, 4, objective="ncut", affinity="knn", n_neighbors=8, init=init, graph_shift=0.5,
                        device=device, dtype="float64", tol=1e9)
    assert result.n_iter == 1
    np.testing.assert_array_equal(result.labels, ref.history_labels[1])
