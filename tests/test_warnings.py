"""Warnings during a fit: one text for fewer distinct points than clusters on every method, objectives that round
below 0 reported as 0, and every warning attributed to the caller's line (issue 27)."""

import re
import warnings

import numpy as np
import pytest

import kkmgpu
from kkmgpu._degenerate import ROUNDING
from kkmgpu.engine import lloyd as _lloyd

DISTINCT_TEXT = r"Number of distinct clusters \(3\) found smaller than n_clusters \(5\)"

CASES = {  # method and extra fit arguments
    "exact": ("exact", {}),
    "exact-tiled": ("exact", {"engine": "tiled"}),
    "cats": ("cats", {}),
    "eigen": ("eigen", {}),
    "approx": ("approx", {}),
    "trimmed": ("trimmed", {}),
}


def _reference_objective(X, labels, weights):
    """Float64 kernel k-means objective of the labels with the linear kernel: sum_i w_i ||x_i - m_c||^2."""
    total = 0.0
    for c in np.unique(labels):
        members = labels == c
        w = weights[members]
        centre = (w[:, None] * X[members]).sum(axis=0) / w.sum()
        total += float((w * ((X[members] - centre) ** 2).sum(axis=1)).sum())
    return total


@pytest.mark.parametrize("case", list(CASES))
def test_fewer_distinct_points_than_k_warn_alike_and_the_objective_is_not_negative(backend, case):
    """Three distinct points, k=5, float32: every method gives the same warning once, at the caller's line, and
    an objective that is not below 0 (exact: within rounding of the float64 objective of its labels, which is
    that of identical points, 0 up to the split)."""
    method, extra = CASES[case]
    rng = np.random.default_rng(27)
    X = np.repeat(rng.normal(size=(3, 5)), 30, axis=0)  # seed 0 of this shape gave -1.4e-5 before (exact, linear)
    weights = rng.uniform(0.5, 2.0, X.shape[0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = kkmgpu.fit(X, 5, method=method, kernel="linear", dtype="float32", sample_weight=weights,
                            random_state=0, n_init=2, device=backend, **extra)
    distinct = [w for w in caught if issubclass(w.category, kkmgpu.ConvergenceWarning)
                and "distinct clusters" in str(w.message)]
    assert len(distinct) == 1, [str(w.message) for w in caught]
    assert distinct[0].filename == __file__
    assert re.match(DISTINCT_TEXT, str(distinct[0].message))
    assert result.objective >= 0 and np.all(np.asarray(result.objectives) >= 0)
    assert np.all(np.asarray(result.objective_history) >= 0)
    if method == "exact":
        labels = np.asarray(result.labels.get() if hasattr(result.labels, "get") else result.labels)
        scale = float((weights * ((X - np.average(X, axis=0, weights=weights)) ** 2).sum(axis=1)).sum())
        reference = _reference_objective(X, labels, weights)
        assert abs(result.objective - reference) <= ROUNDING * np.finfo(np.float32).eps * scale


@pytest.mark.parametrize("c", [1, 4])
def test_eigen_counts_copies_of_one_point_once_whatever_noise_eigenvalues_the_solver_leaves(backend, c, monkeypatch):
    """method="eigen" on the three points with an eigensolver that leaves K's null space at c eps ||K||_2 instead of
    about 0 (a backward error of c eps ||K||_2, which a backward-stable solver may make; the H100's count said 4 where
    LAPACK's says 3): kept as positive eigenvalues, they move the centres of two clusters of one point about
    c eps ||K||_2 (||y_a||^2 + ||y_b||^2) apart (up to 50 eps times their squared norm here at c = 1, 200 at c = 4),
    and every restart's count says 3 (the former tolerance, 1e-7 times the squared norm, counted 5 at both)."""
    rng = np.random.default_rng(27)
    X = np.repeat(rng.normal(size=(3, 5)), 30, axis=0)
    weights = rng.uniform(0.5, 2.0, X.shape[0])
    real_eigh = np.linalg.eigh

    def noisy_eigh(a, UPLO="L"):
        w, V = real_eigh(a, UPLO)
        top = np.abs(w).max()  # K has rank 3 (eigenvalues near top): the rest is rounding of 0
        return np.where(np.abs(w) < 1e-3 * top, c * np.finfo(w.dtype).eps * top, w).astype(w.dtype), V

    monkeypatch.setattr(np.linalg, "eigh", noisy_eigh)  # the CPU's route and the stand-in's cupy.linalg.eigh
    counts = []  # every restart's count (where one says k, the fit's check of X's distinct points would say 3)
    real_count = _lloyd._count_distinct_centres
    monkeypatch.setattr(_lloyd, "_count_distinct_centres", lambda *a: counts.append(real_count(*a)) or counts[-1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = kkmgpu.fit(X, 5, method="eigen", kernel="linear", dtype="float32", sample_weight=weights,
                            random_state=0, n_init=2, device=backend)
    assert result.method_params["decomposition"].startswith("full")  # the route the noise was put into
    distinct = [str(w.message) for w in caught if "distinct clusters" in str(w.message)]
    assert len(distinct) == 1 and re.match(DISTINCT_TEXT, distinct[0]), distinct
    assert counts == [3, 3], counts


def test_a_negative_objective_beyond_rounding_is_kept():
    """The clamp is for rounding only: a precomputed K that is not PSD (ones off the diagonal, about 0 on it)
    keeps its objective, far below 0."""
    rng = np.random.default_rng(5)
    noise = rng.uniform(-0.1, 0.1, (60, 60))
    K = np.ones((60, 60)) - np.eye(60) + (noise + noise.T) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = kkmgpu.fit(K, 3, kernel="precomputed", dtype="float64", device="cpu", random_state=0)
    labels = np.asarray(result.labels)
    reference = float(np.trace(K)) - sum(float(K[np.ix_(labels == c, labels == c)].sum()) / np.sum(labels == c)
                                         for c in np.unique(labels))
    assert reference < -ROUNDING * np.finfo(np.float64).eps * np.abs(np.diag(K)).sum()  # the case is one
    assert result.objective == pytest.approx(reference, rel=1e-9)


def _blobs(rng, n=90):
    centres = rng.normal(scale=6.0, size=(3, 2))
    return np.repeat(centres, n // 3, axis=0) + rng.normal(size=(n, 2))


TRIGGERS = {  # a fit call and the warning it must give
    "not converged": (lambda X, dev: kkmgpu.fit(X, 3, max_iter=1, init="random", random_state=1, device=dev),
                      kkmgpu.ConvergenceWarning),
    "uninformative kernel": (lambda X, dev: kkmgpu.fit(X, 3, kernel="rbf", gamma=1e-30, random_state=0, device=dev),
                             kkmgpu.UninformativeKernelWarning),
    "offset precision": (lambda X, dev: kkmgpu.fit(X + 1e6, 3, kernel="polynomial", gamma=1e-12, random_state=0,
                                                   device=dev), kkmgpu.PrecisionWarning),
    "n_init ignored": (lambda X, dev: kkmgpu.fit(X, 3, init=np.arange(len(X)) % 3, n_init=5, device=dev),
                       UserWarning),
    "gemm_precision without effect": (lambda X, dev: kkmgpu.fit(X, 3, gemm_precision="tf32", random_state=0,
                                                                device=dev), UserWarning),
    "tf32 deprecated": (lambda X, dev: kkmgpu.fit(X, 3, tf32=False, random_state=0, device=dev), FutureWarning),
    "fewer distinct points": (lambda X, dev: kkmgpu.fit(X[:3].repeat(10, axis=0), 5, method="cats", random_state=0,
                                                        device=dev), kkmgpu.ConvergenceWarning),
    "estimator": (lambda X, dev: kkmgpu.KernelKMeans(3, max_iter=1, init="random", random_state=1,
                                                     device=dev).fit(X), kkmgpu.ConvergenceWarning),
}


@pytest.mark.parametrize("trigger", list(TRIGGERS))
def test_warnings_point_at_the_callers_line(backend, trigger):
    call, category = TRIGGERS[trigger]
    X = _blobs(np.random.default_rng(3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call(X, backend)
    assert any(issubclass(w.category, category) for w in caught), [str(w.message) for w in caught]
    assert [(w.filename, str(w.message)) for w in caught if w.filename != __file__] == []


ENGINE_TRIGGERS = {  # warnings raised deep in kkmgpu.engine (sampled.py, embedding.py), and the text that names them
    "cats not converged": (lambda X, dev: kkmgpu.fit(X, 3, method="cats", max_iter=1, theta=0.0, init="random",
                                                     random_state=1, device=dev),
                           kkmgpu.ConvergenceWarning, "CATS did not meet its stopping rule"),
    "eigen negative eigenvalues": (lambda X, dev: kkmgpu.fit(X, 3, method="eigen", kernel="sigmoid", gamma=0.05,
                                                             coef0=1.0, random_state=0, device=dev),
                                   UserWarning, "negative eigenvalues"),
}


@pytest.mark.parametrize("trigger", list(ENGINE_TRIGGERS))
def test_engine_warnings_point_at_the_callers_line(backend, trigger):
    """CATS's convergence warning and the eigen route's negative-eigenvalue warning are given, and attributed to
    this file (kkmgpu._warn.warn), not to kkmgpu/engine."""
    call, category, text = ENGINE_TRIGGERS[trigger]
    X = _blobs(np.random.default_rng(4))
    _assert_attributed_here(call, X, backend, category, text)


def _duplicated(rng, n_distinct=12, copies=3):
    """n_distinct points of an integer grid, each repeated ``copies`` times and shuffled: every point's nearest
    neighbour is at distance 0, exactly (small integers and their mean are exact in every precision)."""
    grid = np.stack(np.meshgrid(np.arange(4.0), np.arange(3.0)), axis=-1).reshape(-1, 2)[:n_distinct]
    return rng.permutation(np.repeat(3.0 * grid, copies, axis=0))


MODULE_TRIGGERS = {  # one user call per module that still warned with a fixed stacklevel, and its text
    "estimator": (lambda X, dev: kkmgpu.KernelKMeans(3, n_components=4, random_state=0, device=dev).fit(X),
                  UserWarning, "n_components=4 (method='eigen' only) ignored"),
    "engine.tiled": (lambda X, dev: kkmgpu.fit(X, 3, dtype="float64", random_state=0, device=dev),
                     UserWarning, "using engine='tiled'"),
    "bandwidth.critical": (lambda X, dev: kkmgpu.bandwidth_lower_bound(_duplicated(np.random.default_rng(1)),
                                                                       device=dev),
                           UserWarning, "duplicated points"),
    "bandwidth.baselines": (lambda X, dev: kkmgpu.bandwidth.mknn_sigmas(_duplicated(np.random.default_rng(2)),
                                                                        device=dev),
                            UserWarning, "MKNN bandwidths are 0"),
    "bandwidth.search": (lambda X, dev: kkmgpu.search_bandwidth(_duplicated(np.random.default_rng(3), 4, 9), 4,
                                                                depth=1, refine_depth=0, max_values=2,
                                                                random_state=0, device=dev),
                         UserWarning, "pairs are duplicates"),
}


@pytest.mark.parametrize("trigger", list(MODULE_TRIGGERS))
def test_module_warnings_point_at_the_callers_line(backend, trigger, monkeypatch):
    """The estimator's ignored parameters, the tiled engine's fallback and the bandwidth searches' warnings are
    given and attributed to this file (kkmgpu._warn.warn), not to kkmgpu (a fixed stacklevel pointed inside)."""
    from kkmgpu.backend.device import Backend

    call, category, text = MODULE_TRIGGERS[trigger]
    if trigger == "engine.tiled":  # K takes 90^2 * 8 = 64.8 kB: report 30 kB free
        monkeypatch.setattr(Backend, "available_bytes", lambda self: 30_000)
    X = _blobs(np.random.default_rng(6))
    _assert_attributed_here(call, X, backend, category, text)


def test_forced_cpu_warning_points_at_the_callers_line(monkeypatch):
    """KKMGPU_DEVICE=cpu overriding device='cuda' (backend/device.py) is reported at the caller's line."""
    monkeypatch.setenv("KKMGPU_DEVICE", "cpu")
    X = _blobs(np.random.default_rng(7))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = kkmgpu.fit(X, 3, random_state=0, device="cuda")
    given = [w for w in caught if "KKMGPU_DEVICE=cpu forces the CPU" in str(w.message)]
    assert result.device == "cpu" and given, [str(w.message) for w in caught]
    assert [w.filename for w in given] == [__file__] * len(given)


def test_dask_warning_points_at_the_callers_line():
    """kkmgpu.dask.fit's gemm_precision without effect on CPU workers is reported at the caller's line."""
    da = pytest.importorskip("dask.array")
    distributed = pytest.importorskip("distributed")
    import kkmgpu.dask

    X = _blobs(np.random.default_rng(8))
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=":0") as cluster, distributed.Client(cluster) as client:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kkmgpu.dask.fit(da.from_array(X, chunks=45), 3, device="cpu", client=client, gemm_precision="tf32",
                            random_state=0)
    given = [w for w in caught if "has no effect on the workers" in str(w.message)]
    assert given, [str(w.message) for w in caught]
    assert [w.filename for w in given] == [__file__] * len(given)


def _assert_attributed_here(call, X, backend, category, text):
    """call(X, backend) gives a ``category`` warning containing ``text``, each attributed to this file."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call(X, backend)
    given = [w for w in caught if issubclass(w.category, category) and text in str(w.message)]
    assert given, [str(w.message) for w in caught]
    assert [w.filename for w in given] == [__file__] * len(given)


def test_fewer_distinct_points_than_k_warns_only_with_a_count_below_k():
    """3 distinct points, k = 5, normalized cut: the graph's kernel splits copies of a point and mixes points, so
    clusters may hold distinct mixtures. The warning, where given, counts the clusters of distinct composition
    (computed here independently), and that count is below k (it said "(5) found smaller than n_clusters (5)")."""
    point = np.repeat(np.arange(3), 20)
    X = np.random.default_rng(0).normal(size=(3, 2))[point]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        labels = np.asarray(kkmgpu.fit(X, 5, objective="ncut", device="cpu", random_state=0).labels)
    compositions = {tuple(np.bincount(point[labels == c], minlength=3) / (labels == c).sum())
                    for c in range(5) if (labels == c).any()}
    said = [str(w.message) for w in record if "distinct clusters" in str(w.message)]
    if len(compositions) < 5:
        assert len(said) == 1 and said[0].startswith(f"Number of distinct clusters ({len(compositions)}) ")
    else:
        assert said == []
