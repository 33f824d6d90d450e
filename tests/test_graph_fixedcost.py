"""The graph objectives' fixed costs (issue 29 point 1, small sets): the refinements run by the Lloyd driver with
one ``fit`` per fit, duplicate starts refined once, the closed-form start of a graph with at least k components,
the serial k-means of small embeddings and the one-thread neighbour search give what the full route gives."""

import numpy as np
import pytest
import scipy.sparse as sp

import kkmgpu
from kkmgpu.backend.device import Backend
from kkmgpu.methods import graph_refine, graph_spectral


def _blobs(rng, sizes, spread=0.3, gap=6.0, d=2):
    X = np.concatenate([rng.normal(size=(m, d)) * spread + gap * c for c, m in enumerate(sizes)])
    return X, np.repeat(np.arange(len(sizes)), sizes)


def _every_start_through_fit(self, labels0):
    """The reference: each start refined by fit(K, kernel="precomputed") itself, duplicates included."""
    n_init = self.n_init if isinstance(labels0, str) else 1
    return self.fit_exact(self.K, self.k, init=labels0, n_init=n_init, random_state=self.rng, **self.common)


def _same(a, b):
    assert np.array_equal(np.asarray(a.labels), np.asarray(b.labels))
    assert a.objective == b.objective
    np.testing.assert_array_equal(a.objectives, b.objectives)
    np.testing.assert_array_equal(a.objective_history, b.objective_history)
    np.testing.assert_array_equal(a.cluster_sizes, b.cluster_sizes)
    assert a.n_iter == b.n_iter and a.stop_reason == b.stop_reason
    assert a.method_params["graph_shift"] == b.method_params["graph_shift"]


@pytest.mark.parametrize("objective", ["ncut", "ratio_association"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_refinements_equal_those_of_fit_on_every_start(monkeypatch, objective, dtype):
    rng = np.random.default_rng(5)
    X = np.concatenate([_blobs(rng, [60, 45, 30], spread=1.2, gap=3.0)[0], rng.uniform(-3, 9, size=(20, 2))])
    for seed in range(3):
        fast = kkmgpu.fit(X, 3, objective=objective, dtype=dtype, device="cpu", random_state=seed)
        with monkeypatch.context() as m:
            m.setattr(graph_refine.Refinements, "__call__", _every_start_through_fit)
            full = kkmgpu.fit(X, 3, objective=objective, dtype=dtype, device="cpu", random_state=seed)
        _same(fast, full)
        assert len(fast.objectives) == 10


def test_duplicate_starts_are_refined_once_and_fit_runs_once():
    rng = np.random.default_rng(1)
    X, _ = _blobs(rng, [50, 50])            # well apart: every spectral start the same partition
    calls = []
    real = kkmgpu.fit

    def counted(*args, **kwargs):
        if kwargs.get("kernel") == "precomputed":
            calls.append(kwargs["init"])
        return real(*args, **kwargs)

    from kkmgpu.methods import graphcut
    result = graphcut.checked_fit(
        X, 2, fit_exact=counted, objective="ncut", affinity="self_tuning", n_neighbors=10, graph_shift="auto",
        kernel="rbf", gamma=None, method="exact", sample_weight=None, device="cpu", dtype="float32", init="spectral",
        n_init="auto", max_iter=300, tol=1e-6, random_state=0, verbose=False, keep_on_device=False, progress=False)
    assert calls == []                      # the lowest start's result assembled from its run, fit not called
    assert len(result.objectives) == 10 and np.all(result.objectives == result.objectives[0])


def _result_through_fit(self, best):
    """The reference of :meth:`Refinements.result`: the lowest start run once more through fit itself."""
    if id(best) not in self.light:
        return best
    return self.fit_exact(self.K, self.k, init=best.start, n_init=1, random_state=self.rng, **self.common)


def _host(value):
    """A device array (CuPy) on the host; anything else as it is."""
    return value.get() if hasattr(value, "get") and hasattr(value, "shape") else value


def _hostile_graph_inputs():
    rng = np.random.default_rng(11)
    X, _ = _blobs(rng, [40, 30, 25], spread=1.0, gap=3.0)
    yield "blobs", X, {}
    yield "integer grid + 1e9", np.round(X * 4) + 1e9, {}
    yield "duplicates", np.repeat(X[:30], 3, axis=0), {}
    yield "scale 1e-20 float64", X * 1e-20, {"dtype": "float64"}
    yield "outlier", np.vstack([X, [[1e6, -1e6]]]), {}
    D2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(axis=2)
    A = np.exp(-D2 / 4.0)
    np.fill_diagonal(A, 0.0)
    for scale in (1e-200, 1e200):
        yield f"precomputed x {scale:g}", sp.csr_matrix(A * scale), {"affinity": "precomputed"}
    W = A.copy()
    W[:10, :] *= 1e-8
    W[:, :10] *= 1e-8                       # ten points whose edges are 1e-8 (1e-16 among themselves) of the rest
    yield "precomputed, extreme edge weights", sp.csr_matrix(W), {"affinity": "precomputed"}


@pytest.mark.parametrize("objective", ["ncut", "ratio_association"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_assembled_result_is_fits_result(monkeypatch, device, objective, dtype):
    """The lowest start's result assembled from its Lloyd run equals fit's result for that start in every field
    (labels, objectives, sizes, weights, the state predict reads) and predicts the same labels, on hostile data
    (on a GPU: the first, fourth and last inputs)."""
    import dataclasses

    rng = np.random.default_rng(3)
    inputs = list(_hostile_graph_inputs())
    for name, X, kwargs in (inputs if device == "cpu" else [inputs[0], inputs[3], inputs[-1]]):
        kwargs = {"dtype": dtype, **kwargs}
        fast = kkmgpu.fit(X, 3, objective=objective, device=device, random_state=0, **kwargs)
        with monkeypatch.context() as m:
            m.setattr(graph_refine.Refinements, "result", _result_through_fit)
            full = kkmgpu.fit(X, 3, objective=objective, device=device, random_state=0, **kwargs)
        for field in dataclasses.fields(fast):
            a, b = (_host(getattr(r, field.name)) for r in (fast, full))
            if field.name == "timings":
                assert a.keys() == b.keys(), name
            elif field.name == "_graph_state":
                assert (a is None) == (b is None), name
            elif field.name == "method_params":     # all but a time
                assert {**a, "spectral_seconds": 0} == {**b, "spectral_seconds": 0}, name
            elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"{name}: {field.name}")
            else:
                assert a == b, f"{name}: {field.name} {a!r} != {b!r}"
        if kwargs.get("affinity") != "precomputed":
            Q = X[rng.permutation(X.shape[0])[:20]] + rng.normal(size=(20, 2)) * 0.1 * np.std(X)
            np.testing.assert_array_equal(kkmgpu.predict(fast, Q), kkmgpu.predict(full, Q), err_msg=name)


def test_a_kernel_beyond_the_storage_range_takes_fit_on_every_start(monkeypatch):
    """A point whose edges are 1e-300 of the others': K = D^-1 A D^-1 reaches ~1e300, beyond float32, which fit
    rescales (spec.value_scale); the refinements then go through fit on each distinct start, as before."""
    rng = np.random.default_rng(2)
    X, _ = _blobs(rng, [30, 30])
    D2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(axis=2)
    A = np.exp(-D2)
    np.fill_diagonal(A, 0.0)
    A[0, 1:] *= 1e-300
    A[1:, 0] *= 1e-300
    A = sp.csr_matrix(np.where(A > 1e-320, A, 0.0))
    fast = kkmgpu.fit(A, 2, objective="ncut", affinity="precomputed", device="cpu", random_state=0)
    with monkeypatch.context() as m:
        m.setattr(graph_refine.Refinements, "__call__", _every_start_through_fit)
        full = kkmgpu.fit(A, 2, objective="ncut", affinity="precomputed", device="cpu", random_state=0)
    _same(fast, full)


def _reference_top(N, k):
    w, V = np.linalg.eigh(N.toarray())
    return w[::-1][:k], V[:, ::-1][:, :k]


@pytest.mark.parametrize("sizes,k", [([40, 35, 30, 25], 3), ([40, 35, 30], 3), ([40, 35, 30, 12, 8], 2)])
def test_at_least_k_components_give_the_largest_volumes_indicators(sizes, k):
    rng = np.random.default_rng(3)
    X, y = _blobs(rng, sizes, spread=0.2, gap=20.0)
    backend = Backend("cpu")
    from kkmgpu.kernels import graphs
    A = graphs.affinity_graph(X, 6, "knn", backend)
    d = np.asarray(A.sum(axis=1)).ravel()
    E, w, _, solver = graph_spectral.spectral_embedding(A, d, k, backend, np.random.default_rng(0))
    assert solver == "arpack" and np.array_equal(w, np.ones(k))
    V = E * np.sqrt(d)[:, None]
    N = graph_spectral.normalized(A, d, backend)
    np.testing.assert_allclose(N @ V, V, atol=1e-12)                     # eigenvectors of the eigenvalue 1
    np.testing.assert_allclose(V.T @ V, np.eye(k), atol=1e-12)           # orthonormal
    volume = np.bincount(y, weights=d)
    chosen = np.argsort(-volume, kind="stable")[:k]
    for column, c in enumerate(chosen):
        assert np.all(V[y != c, column] == 0) and np.all(V[y == c, column] > 0)
    assert np.allclose(_reference_top(N, k)[0], 1.0)


def test_fewer_components_than_k_match_the_dense_spectrum():
    rng = np.random.default_rng(4)
    X, _ = _blobs(rng, [120, 90], spread=1.0, gap=30.0)
    backend = Backend("cpu")
    from kkmgpu.kernels import graphs
    A = graphs.affinity_graph(X, 8, "self_tuning", backend)
    d = np.asarray(A.sum(axis=1)).ravel()
    k = 5
    E, w, _, _ = graph_spectral.spectral_embedding(A, d, k, backend, np.random.default_rng(0))
    N = graph_spectral.normalized(A, d, backend)
    ref, _ = _reference_top(N, k)
    np.testing.assert_allclose(w, ref, atol=1e-6)
    V = E * np.sqrt(d)[:, None]
    np.testing.assert_allclose(N @ V, V * w[None, :], atol=1e-4)   # ARPACK's tolerance 1e-5, relative


def test_serial_and_side_by_side_kmeans_give_the_same_fit(monkeypatch):
    rng = np.random.default_rng(6)
    X, _ = _blobs(rng, [40, 40, 40, 40], spread=1.5, gap=4.0)
    monkeypatch.setattr(graph_spectral, "SERIAL_KMEANS", 0)
    side = kkmgpu.fit(X, 4, objective="ncut", device="cpu", random_state=3)
    monkeypatch.setattr(graph_spectral, "SERIAL_KMEANS", 2 ** 62)
    monkeypatch.setattr(graph_spectral, "SERIAL_SEARCH", 0)      # and the search on the usual threads
    serial = kkmgpu.fit(X, 4, objective="ncut", device="cpu", random_state=3)
    _same(side, serial)


@pytest.mark.parametrize("k", [2, 3, 7])
def test_the_distinct_rows_shortcut_agrees_with_unique(k):
    """_k_distinct_rows(X, k) is True exactly where np.unique finds k distinct rows among the first 1,024 (by value:
    -0.0 and 0.0 are one point), so the fewer-distinct warning is checked in full only where it may apply."""
    from kkmgpu.methods.graphcut import _k_distinct_rows

    rng = np.random.default_rng(k)
    backend = Backend("cpu")
    for points in (1, k - 1, k, 2 * k, 50):
        base = rng.integers(-2, 3, size=(max(points, 1), 3)).astype(np.float64)
        base[0] = 0.0
        X = base[rng.integers(0, base.shape[0], size=200)]
        X[rng.random(200) < 0.3] *= -1.0          # -0.0 where a row holds 0.0
        X[-1] = -base[0]
        want = np.unique(X[:1024] + 0.0, axis=0).shape[0] >= k
        assert _k_distinct_rows(X, k, backend) == want
        assert _k_distinct_rows(X.astype(np.float32), k, backend) == want
    wide = rng.normal(size=(2000, 4))
    wide[:1024] = wide[0]                          # the rows past the first 1,024 are not read
    assert not _k_distinct_rows(wide, k, backend)


@pytest.mark.parametrize("k", [1, 2, 31, 100])
def test_the_embeddings_centroid_sums_are_the_sparse_products_bit_for_bit(k):
    """The CPU's centroid sums of the embedding (one numba pass, graph_spectral._row_sums_by_cluster) are the
    sparse one-hot product's and a bincount's per column, bit for bit (each point's term added in index order),
    and the distinct-centre count does not depend on how the pairs are tested (lloyd.distinct_centres against the
    pairwise loop it replaced); empty clusters included."""
    from kkmgpu.engine.lloyd import distinct_centres

    rng = np.random.default_rng(12)
    n, r = 997, 7
    V = rng.normal(size=(n, r)) * 10.0 ** rng.integers(-6, 6, size=(n, 1))
    labels = rng.integers(0, max(1, k - 1), n)          # the last cluster empty where k > 1
    M = graph_spectral._row_sums_by_cluster(V, labels, k)
    Y = sp.csr_matrix((np.ones(n), (labels, np.arange(n))), shape=(k, n))
    np.testing.assert_array_equal(M, Y @ V)
    np.testing.assert_array_equal(M, np.stack([np.bincount(labels, weights=V[:, j], minlength=k)
                                               for j in range(r)], axis=1))
    # distinct centres: duplicates of some centres among them, against the one-pair-at-a-time greedy count
    centres = rng.normal(size=(k, 3))
    centres[k // 2:] = centres[: k - k // 2]
    sizes = rng.integers(0, 4, k).astype(np.float64)
    cross = (centres * sizes[:, None]) @ (centres * sizes[:, None]).T
    within = np.diag(cross).copy()
    norm = within / np.where(sizes > 0, sizes, 1.0) ** 2
    tolerance = 1e-7 * max(float(np.abs(norm[sizes > 0]).max(initial=0.0)), np.finfo(float).tiny)
    kept = []
    for a in np.flatnonzero(sizes > 0):
        if not any(norm[a] + norm[b] - 2.0 * cross[a, b] / (sizes[a] * sizes[b]) <= tolerance for b in kept):
            kept.append(a)
    assert distinct_centres(cross, sizes, within) == len(kept)
