"""Progress and verbose output of the graph objectives (kkmgpu/methods/graphcut.py, issue 29 point 2).

- ``verbose=True`` prints the objective reported, the normalized cut (or the negated ratio association in A's
  units), never the shifted kernel objective J that the inner Lloyd driver minimises: every printed iteration of the
  lowest start is ``result.objective_history``, every start's last value ``result.objectives``, and the final line
  ``result.objective``, which is the float64 cut of the labels computed here from the dense affinity;
- the graph build, the graph kernel's shift, the spectral start (with the number of connected components a scipy
  labelling of the dense graph finds) are announced by ``verbose`` and by ``progress`` (the plain printer);
- neither changes the labels, and the fit leaves numba's thread count as it found it.
"""

import re
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

import kkmgpu
from kkmgpu import _progress
from tests.test_graphcut import dense_knn, reference_ncut, reference_ratio_association

NUMBER = r"(-?[0-9.]+(?:e[-+]?[0-9]+)?)"


def _without_tqdm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)


def _clusters(rng, sizes, d=3, gap=40.0):
    """Gaussian clusters far apart (each its own component of a small kNN graph), shuffled."""
    centres = rng.normal(scale=gap, size=(len(sizes), d))
    X = np.concatenate([c + rng.normal(size=(m, d)) for c, m in zip(centres, sizes)])
    return X[rng.permutation(X.shape[0])]


def _printed(out, objective):
    """{start: [values of its iterations]}, {start: its last value}, the final value: from the verbose lines."""
    iterations, last = {}, {}
    for start, value in re.findall(rf"\[{objective}\] start (\d+): iteration \d+: {objective} {NUMBER}", out):
        iterations.setdefault(int(start), []).append(float(value))
    for start, value in re.findall(rf"\[{objective}\] start (\d+): {objective} {NUMBER} after", out):
        last[int(start)] = float(value)
    final = re.findall(rf"\[{objective}\] the lowest of \d+ start\(s\): {objective} {NUMBER}", out)
    return iterations, last, float(final[-1])


@pytest.mark.parametrize("objective", ["ncut", "ratio_association"])
def test_verbose_prints_the_objective_reported_not_the_shifted_one(device, objective, rng, capsys):
    """Random partitions as the starts, so that the refinements take several steps; a precomputed affinity scaled
    by 1e12 for the ratio association (its values are reported in A's units, the fit runs on A / 2**e)."""
    X = _clusters(rng, [40, 25, 55])
    A, _ = dense_knn(X, 6)
    k, n_init = 3, 3
    scale = 1.0 if objective == "ncut" else 1e12
    given = A * scale
    init = rng.integers(0, k, size=X.shape[0])
    init[:k] = np.arange(k)
    kwargs = dict(objective=objective, device=device, dtype="float64", n_init=n_init, random_state=0, tol=0)
    if objective == "ncut":
        kwargs.update(affinity="knn", n_neighbors=6, init="random")
    else:
        kwargs.update(affinity="precomputed", init="random")
    data = X if objective == "ncut" else sp.csr_matrix(given)
    quiet = kkmgpu.fit(data, k, **kwargs)
    capsys.readouterr()
    result = kkmgpu.fit(data, k, verbose=True, **kwargs)
    out = capsys.readouterr().out
    np.testing.assert_array_equal(result.labels, quiet.labels)
    want = reference_ncut(A, result.labels, k) if objective == "ncut" else \
        -reference_ratio_association(given, result.labels, k)
    assert result.objective == pytest.approx(want, rel=1e-10, abs=1e-12)
    # a string init runs its n_init restarts inside one refinement: one "init r" line each, then the lowest's steps
    restarts = [float(v) for v in re.findall(rf"\[{objective}\] init \d+: {objective} {NUMBER}", out)]
    np.testing.assert_allclose(restarts, result.objectives, rtol=1e-9, atol=1e-12)
    steps = [float(v) for v in re.findall(rf"\[{objective}\] iteration \d+: {objective} {NUMBER}", out)]
    np.testing.assert_allclose(steps, result.objective_history, rtol=1e-9, atol=1e-12)
    final = float(re.findall(rf"\[{objective}\] the lowest of {n_init} start\(s\): {objective} {NUMBER}", out)[-1])
    assert final == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert f"[{objective}] the graph kernel's shift sigma" in out
    # the inner driver's lines (the shifted J: near sigma (n - k) for ncut, 1e12-sized for the association) are gone
    assert "[kkmgpu]" not in out and "objective" not in out.replace("objective=", "")


def test_verbose_spectral_starts_print_each_start_and_the_components(device, rng, capsys):
    """Five components; each spectral start's printed refinement ends at its entry of ``result.objectives``, the
    lowest start's printed iterations are ``result.objective_history``, the final value the float64 cut."""
    X = _clusters(rng, [30, 45, 20, 35, 25])
    A, _ = dense_knn(X, 5)
    components = connected_components(sp.csr_matrix(A), directed=False)[0]
    k, n_init = 5, 4
    result = kkmgpu.fit(X, k, objective="ncut", affinity="knn", n_neighbors=5, device=device, dtype="float64",
                        n_init=n_init, random_state=1, verbose=True)
    out = capsys.readouterr().out
    iterations, last, final = _printed(out, "ncut")
    assert sorted(last) == list(range(n_init)) == sorted(iterations)
    np.testing.assert_allclose([last[r] for r in range(n_init)], result.objectives, rtol=1e-9, atol=1e-12)
    lowest = int(np.argmin(result.objectives))
    np.testing.assert_allclose(iterations[lowest], result.objective_history, rtol=1e-9, atol=1e-12)
    want = reference_ncut(A, result.labels, k)
    assert result.objective == pytest.approx(want, rel=1e-10, abs=1e-12)
    assert final == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert "[ncut] the 'knn' graph of 5 neighbours: 155 points" in out
    solver = result.method_params["eigensolver"]
    where = f" on {components} components" if device == "cpu" and solver == "arpack" else ""
    assert f"[ncut] spectral start: the top {k} eigenvectors of D^-1/2 A D^-1/2 by {solver}{where}" in out
    assert len(re.findall(r"\[ncut\] spectral start \d+: k-means of the embedding", out)) == n_init


def test_progress_announces_the_graph_the_start_and_each_start(monkeypatch, device, rng, capsys):
    """The plain printer (no tqdm), every tenth printed: the graph's two steps, the shift, the spectral start's
    1 + n_init steps, and the fit's own bar over the starts, whose last text holds the lowest cut reported."""
    _without_tqdm(monkeypatch)
    monkeypatch.setattr(_progress._PlainBar, "MIN_INTERVAL", 0.0)
    X = _clusters(rng, [50, 30, 40], gap=6.0)
    k, n_init = 3, 3
    quiet = kkmgpu.fit(X, k, objective="ncut", device=device, random_state=2, n_init=n_init)
    capsys.readouterr()
    result = kkmgpu.fit(X, k, objective="ncut", device=device, random_state=2, n_init=n_init, progress=True)
    out, err = capsys.readouterr()
    np.testing.assert_array_equal(result.labels, quiet.labels)
    assert out == ""
    lines = err.splitlines()
    assert any(line.startswith("graph: 1/2 step ( 50%)") and "10 nearest neighbours of 120 points" in line
               for line in lines), lines
    assert any(line.startswith("graph: 2/2 step (100%)") for line in lines)
    assert any(line.startswith("graph shift: 1/1 eigenvalue (100%)") for line in lines)
    steps = 1 + n_init
    assert any(line.startswith(f"spectral start: 1/{steps} step") and "eigenvectors by" in line for line in lines)
    assert any(line.startswith(f"spectral start: {steps}/{steps} step (100%)") for line in lines)
    assert lines[-1].startswith(f"ncut: {n_init}/{n_init} start (100%)")
    lowest = float(re.findall(rf"lowest {NUMBER}$", lines[-1])[0])
    assert lowest == pytest.approx(float(np.min(result.objectives)), rel=1e-5, abs=1e-9)
    # the order: the graph, then the start, then the starts' refinements
    first = {name: next(i for i, line in enumerate(lines) if line.startswith(name))
             for name in ("graph:", "spectral start:", "ncut:")}
    assert first["graph:"] < first["spectral start:"] < first["ncut:"]


def test_a_graph_fit_leaves_numbas_thread_count_as_it_found_it(monkeypatch, rng):
    """The spectral start and the refinements run on one thread on the CPU (graph_spectral.one_thread), and give
    the caller's setting back, also when the start raises."""
    import numba

    from kkmgpu.methods import graph_spectral

    X = _clusters(rng, [30, 30], gap=8.0)
    before = numba.get_num_threads()
    kkmgpu.fit(X, 2, objective="ncut", device="cpu", random_state=0, n_init=2)
    assert numba.get_num_threads() == before
    seen = []

    def failing(*args, **kwargs):
        seen.append(numba.get_num_threads())
        raise RuntimeError("the eigensolver failed")

    monkeypatch.setattr(graph_spectral, "spectral_embedding", failing)
    with pytest.raises(RuntimeError, match="the eigensolver failed"):
        kkmgpu.fit(X, 2, objective="ncut", device="cpu", random_state=0)
    assert seen == [1] and numba.get_num_threads() == before


def test_the_spectral_starts_do_not_depend_on_the_threads_they_ran_on(monkeypatch, rng):
    """On the CPU the k-means of the embedding run side by side in threads (one per numba thread), each from its
    own stream drawn from random_state: the starts are the same on one thread as on two, the workers are threads of
    their own, and the refinements after them see the same stream."""
    import threading

    import numba

    from kkmgpu.engine import lloyd, small_kmeans
    from kkmgpu.methods import graph_spectral

    X = _clusters(rng, [40, 25, 55, 30], gap=5.0)
    where = []

    def spy(function):
        def spied(*args, **kwargs):
            where.append(threading.current_thread().name)
            return function(*args, **kwargs)
        return spied

    # the driver, and the compiled k-means that small embeddings take (kkmgpu.engine.small_kmeans)
    monkeypatch.setattr(lloyd, "run_restarts", spy(lloyd.run_restarts))
    monkeypatch.setattr(small_kmeans, "kmeans", spy(small_kmeans.kmeans))
    monkeypatch.setattr(graph_spectral, "SERIAL_KMEANS", 0)   # side by side at this size too
    before = numba.get_num_threads()
    results = {}
    try:
        many = min(2, numba.config.NUMBA_NUM_THREADS)    # 1 on a one-core machine: then both runs are serial
        for threads in (1, many):
            where.clear()
            numba.set_num_threads(threads)
            results[threads] = kkmgpu.fit(X, 4, objective="ncut", device="cpu", random_state=5, n_init=6)
            names = set(where[:6])       # the starts' six k-means (the refinements' own runs come after)
            assert all(name.startswith("kkmgpu-start") for name in names) == (threads > 1), names
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(results[1].labels, results[many].labels)
    np.testing.assert_array_equal(results[1].objectives, results[many].objectives)
    assert graph_spectral._cpu_threads() == before
