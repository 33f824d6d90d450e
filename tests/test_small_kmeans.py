"""The spectral start's compiled k-means of a small embedding (kkmgpu.engine.small_kmeans) against the Lloyd driver
it replaces on the CPU (run_restarts on the embedding operator): the same seeds, labels, iterations, stop reason,
objective history (to rounding), counts of distinct centres and warnings, on fresh random embeddings with and
without ties, duplicates, outliers and extreme scales."""

import warnings

import numpy as np
import pytest

import kkmgpu
from kkmgpu.backend.device import resolve_device
from kkmgpu.engine import small_kmeans
from kkmgpu.engine.lloyd import ConvergenceWarning, run_restarts
from kkmgpu.methods import graph_spectral

CPU = resolve_device("cpu")


def _driver(E, k, seed, max_iter=300, tol=1e-4):
    operator = graph_spectral._embedding_operator(E, CPU)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = run_restarts(operator, k, init="k-means++", n_init=1, max_iter=max_iter, tol=tol,
                           rng=np.random.default_rng(seed), verbose=False, progress=False)[0]
    return run, [str(w.message) for w in caught]


def _compiled(E, k, seed, max_iter=300, tol=1e-4):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = small_kmeans.kmeans(E, k, np.random.default_rng(seed), max_iter=max_iter, tol=tol)
    return run, [str(w.message) for w in caught]


def _embedding(rng, n, k, kind):
    centres = rng.standard_normal((k, k)) * 3
    E = centres[rng.integers(0, k, n)] + rng.standard_normal((n, k))
    if kind == "rounded":          # many exact ties in distances
        E = np.round(E, 1)
    elif kind == "outliers":
        E[rng.choice(n, size=max(1, n // 50), replace=False)] *= 1e6
    elif kind == "tiny":
        E *= 1e-20
    elif kind == "huge":
        E *= 1e20
    return E


def _assert_same(a, b):
    assert np.array_equal(np.asarray(a.labels), b.labels)
    assert (a.n_iter, a.stop_reason, a.converged, a.n_distinct) == (b.n_iter, b.stop_reason, b.converged,
                                                                   b.n_distinct)
    np.testing.assert_allclose(b.history, a.history, rtol=1e-12, atol=1e-12 * abs(a.history[0]))
    assert b.objective == b.history[-1]
    np.testing.assert_array_equal(b.sizes, a.sizes)
    np.testing.assert_allclose(b.within, a.within, rtol=1e-12, atol=1e-12 * np.abs(a.within).max())


@pytest.mark.parametrize("kind", ["plain", "rounded", "outliers", "tiny", "huge"])
def test_the_compiled_run_is_the_drivers_run(kind):
    rng = np.random.default_rng(11)
    compared = 0
    for trial in range(12):
        n, k = int(rng.integers(20, 1500)), int(rng.integers(1, 9))
        E = _embedding(rng, n, k, kind)
        seed = int(rng.integers(2 ** 31))
        b, warned_b = _compiled(E, k, seed)
        if b is None:     # an emptied cluster: the driver's refill runs instead (tested below)
            continue
        a, warned_a = _driver(E, k, seed)
        _assert_same(a, b)
        assert warned_a == warned_b
        compared += 1
    assert compared >= 8


@pytest.mark.parametrize("max_iter, tol", [(0, 1e-4), (1, 1e-4), (2, 0.0), (300, 0.0), (300, 0.5)])
def test_the_stopping_rules_are_the_drivers(max_iter, tol):
    rng = np.random.default_rng(3)
    E = _embedding(rng, 400, 6, "plain") + rng.standard_normal((400, 6)) * 2   # overlapping: many iterations
    for seed in range(4):
        a, warned_a = _driver(E, 6, seed, max_iter, tol)
        b, warned_b = _compiled(E, 6, seed, max_iter, tol)
        _assert_same(a, b)
        assert warned_a == warned_b
        assert len(b.history) == b.n_iter + (b.stop_reason != "no point moved") or max_iter == 0


def test_identical_points_give_up_to_the_driver_and_the_start_is_the_drivers(monkeypatch):
    """k above the number of distinct points: the seeds fall on copies of one point, an assignment empties a
    cluster, the compiled run returns None, and the start's labels are the driver's (its refill)."""
    E = np.repeat(np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]), [30, 20], axis=0)
    assert small_kmeans.kmeans(E, 3, np.random.default_rng(0), max_iter=300, tol=1e-4) is None
    operator = graph_spectral._embedding_operator(E, CPU)
    seeds = np.arange(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours = [run.labels for run in graph_spectral._embedding_kmeans(operator, 3, seeds, CPU, 1)]
        monkeypatch.setattr(small_kmeans, "SMALL", -1)
        theirs = [np.asarray(run.labels) for run in graph_spectral._embedding_kmeans(operator, 3, seeds, CPU, 1)]
    for a, b in zip(ours, theirs):
        assert np.array_equal(np.asarray(a), b)


@pytest.mark.parametrize("case", ["two-copies", "one-point", "k=1", "n=k"])
def test_degenerate_embeddings_are_the_drivers(case):
    """Copies of two points (k = 2), every point the same (k = 1), one cluster, as many points as clusters."""
    rng = np.random.default_rng(8)
    E, k = {"two-copies": (np.repeat(np.array([[0.0, 0.0], [1.0, 1.0]]), [5, 5], axis=0), 2),
            "one-point": (np.ones((7, 3)), 1),
            "k=1": (rng.standard_normal((50, 1)), 1),
            "n=k": (rng.standard_normal((4, 4)), 4)}[case]
    for seed in range(3):
        a, warned_a = _driver(E, k, seed)
        b, warned_b = _compiled(E, k, seed)
        _assert_same(a, b)
        assert warned_a == warned_b


@pytest.mark.parametrize("name", ["blobs", "moons"])
def test_a_fit_with_the_compiled_start_is_the_fit_with_the_drivers(monkeypatch, name):
    from sklearn.datasets import make_blobs, make_moons

    if name == "blobs":
        X, _ = make_blobs(600, centers=5, cluster_std=1.5, random_state=4)
        k = 5
    else:
        X, _ = make_moons(500, noise=0.08, random_state=4)
        k = 2
    runs, compiled = [], small_kmeans.kmeans
    monkeypatch.setattr(small_kmeans, "kmeans", lambda *a, **kw: runs.append(compiled(*a, **kw)) or runs[-1])
    ours = kkmgpu.fit(X, k, objective="ncut", device="cpu", random_state=7)
    assert len(runs) == 10 and all(run is not None for run in runs)   # the start's ten k-means were compiled runs
    monkeypatch.setattr(small_kmeans, "SMALL", -1)
    theirs = kkmgpu.fit(X, k, objective="ncut", device="cpu", random_state=7)
    assert np.array_equal(np.asarray(ours.labels), np.asarray(theirs.labels))
    np.testing.assert_allclose(ours.objective, theirs.objective, rtol=1e-12)


def test_the_count_of_few_distinct_centres_is_the_array_count(monkeypatch):
    """lloyd.distinct_centres tests up to FEW_CENTRES clusters' pairs in Python floats: the same count as its NumPy
    pairs, on centres with copies at relative distances 0, 1e-9, 1e-7 and 1e-5 (around its tolerance), empty and
    weighted clusters, sizes whose squares underflow, scales 1e-8 ... 1e8, with and without the eigen-embedding's
    spread term."""
    from kkmgpu.engine import lloyd

    rng = np.random.default_rng(21)
    counts = set()
    for trial in range(600):
        k = int(rng.integers(2, lloyd.FEW_CENTRES + 1))
        centres = rng.normal(size=(k, 3)) * 10.0 ** rng.integers(-8, 8)
        copies = rng.integers(0, k, k // 2)
        centres[rng.integers(0, k, k // 2)] = centres[copies] * (1 + rng.choice([0, 1e-9, 1e-7, 1e-5], k // 2)[:, None])
        sizes = rng.integers(0, 4, k).astype(np.float64) * (rng.uniform(0.1, 10, k) if trial % 3 == 0 else 1.0)
        if trial % 5 == 0:    # weights so small that a size's square underflows to 0 (x / 0 as NumPy gives it)
            sizes *= 1e-170
        cross = (centres * sizes[:, None]) @ (centres * sizes[:, None]).T
        cross += rng.normal(size=cross.shape) * 1e-12 * np.abs(cross).max()
        within = np.diag(cross).copy()
        eps = [0.0, np.finfo(np.float64).eps, np.finfo(np.float32).eps][trial % 3]
        spread = None if trial % 2 else rng.uniform(0, 1, k)
        few = lloyd.distinct_centres(cross, sizes, within, eps, spread)
        with monkeypatch.context() as m:
            m.setattr(lloyd, "FEW_CENTRES", 0)
            assert lloyd.distinct_centres(cross, sizes, within, eps, spread) == few
        counts.add((few, int(np.count_nonzero(sizes > 0))))
    assert any(a < b for a, b in counts) and any(a == b > 1 for a, b in counts)   # both outcomes met
