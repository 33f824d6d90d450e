"""The Lloyd driver's observable choices (kkmgpu.engine.lloyd): how the cluster sums follow a step (full pass vs the
incremental update), what its verbose log and progress bar say, and the timings it reports. Written for the
mutation run's survivors (docs/mutation-testing.md): each test fails under a plausible slip in that logic."""

import re
import sys
import warnings

import numpy as np
import pytest

import kkmgpu
from kkmgpu import _progress
from kkmgpu.engine import lloyd as _lloyd
from kkmgpu.backend.device import Backend
from kkmgpu.engine.dense import DenseKernelOperator
from kkmgpu.engine.lloyd import lloyd, run_restarts


def _problem(seed=0, n=240, k=4, d=3):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=3.0, size=(k, d))
    y = rng.integers(0, k, n)
    X = centres[y] + rng.normal(size=(n, d))
    K = np.exp(-0.2 * ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1))
    init = (y + (rng.random(n) < 0.3) * rng.integers(1, k, n)) % k  # 30% of the points start misplaced
    return K, init.astype(np.int32), k


class _Counting(DenseKernelOperator):
    """A dense operator that counts its full passes and incremental updates."""

    def __init__(self, K, weights, backend):
        super().__init__(K, weights, backend)
        self.full = self.incremental = 0

    def cluster_sums(self, labels, k):
        self.full += 1
        return super().cluster_sums(labels, k)

    def update_cluster_sums(self, S, old_labels, new_labels, **kwargs):
        self.incremental += 1
        return super().update_cluster_sums(S, old_labels, new_labels, **kwargs)


def _operator(K, weights=None):
    backend = Backend("cpu")
    w = np.ones(K.shape[0]) if weights is None else weights
    return _Counting(K, w, backend)


@pytest.mark.parametrize("update", ["full", "incremental", "auto"])
def test_update_rule_routes_the_cluster_sums(update):
    K, init, k = _problem()
    reference = lloyd(_operator(K), init, k, tol=0.0, update="full")
    op = _operator(K)
    run = lloyd(op, init, k, tol=0.0, update=update)
    # the same labels and objectives whichever way S follows a step
    np.testing.assert_array_equal(np.asarray(run.labels), np.asarray(reference.labels))
    np.testing.assert_allclose(run.history, reference.history, rtol=1e-12)
    steps = run.n_iter - (1 if run.converged and run.stop_reason == "no point moved" else 0)
    assert steps >= 3
    if update == "full":
        assert op.incremental == 0 and op.full == 1 + steps
    elif update == "incremental":
        assert op.full == 1 and op.incremental == steps  # fewer than FULL_REFRESH_EVERY steps: no refresh
    else:
        # "auto": incremental exactly when it reads less than a full pass (the operator's cost m / n < 1)
        assert op.incremental >= 1 and op.full + op.incremental == 1 + steps


def test_incremental_cost_is_the_rows_read():
    """The dense update reads K's rows of the m moved points once (into the new cluster and out of the old one at
    once): m / n of a pass."""
    K, _, _ = _problem(n=50)
    op = _operator(K)
    assert op.incremental_cost(0) == 0.0
    assert op.incremental_cost(10) == pytest.approx(0.2)
    assert op.incremental_cost(50) == pytest.approx(1.0)


def test_full_refresh_after_a_run_of_incremental_steps(monkeypatch):
    K, init, k = _problem(seed=2, n=400, k=6)  # 12 steps from this start
    monkeypatch.setattr(_lloyd, "FULL_REFRESH_EVERY", 2)
    op = _operator(K)
    run = lloyd(op, init, k, tol=0.0, update="incremental")
    steps = run.n_iter - (1 if run.stop_reason == "no point moved" else 0)
    assert steps >= 6
    # incremental, incremental, full, incremental, incremental, full, ...
    assert op.full == 1 + steps // 3 and op.incremental == steps - steps // 3


def test_verbose_log_follows_the_objectives(capsys):
    K, init, k = _problem(seed=1)
    run = lloyd(_operator(K), init, k, tol=0.0, verbose=True)
    lines = capsys.readouterr().out.strip().splitlines()
    values = [float(m.group(1)) for line in lines for m in [re.search(r"objective ([-0-9.e+]+)", line)] if m]
    np.testing.assert_allclose(values, run.history, rtol=1e-9)
    assert lines[0].startswith("[kkmgpu] iteration 0: objective")
    moved = [int(m.group(1)) for line in lines for m in [re.search(r"(\d+) points moved", line)] if m]
    assert len(moved) == len(run.history) - 1 and all(m > 0 for m in moved)
    assert lines[-1] == f"[kkmgpu] iteration {run.n_iter}: no point changed cluster, converged"


def test_restart_log_and_best_of_restarts(capsys):
    K, _, k = _problem(seed=2)
    op = _operator(K)
    best, runs, init_seconds = run_restarts(op, k, init="random", n_init=3, max_iter=300, tol=0.0,
                                            rng=np.random.default_rng(5), verbose=True)
    out = capsys.readouterr().out
    for r, run in enumerate(runs):
        assert f"[kkmgpu] init {r}: iteration 0: objective" in out
        assert f"[kkmgpu] init {r}: objective {run.objective:.10g} after {run.n_iter} iterations" in out
    assert best.objective == min(run.objective for run in runs)
    assert best is runs[int(np.argmin([run.objective for run in runs]))]  # the first of equal ones
    assert 0.0 < init_seconds < sum(run.seconds for run in runs) + 1.0
    single, _, _ = run_restarts(_operator(K), k, init="random", n_init=1, max_iter=300, tol=0.0,
                                rng=np.random.default_rng(5), verbose=True)
    out = capsys.readouterr().out
    assert "init 0" not in out and out.startswith("[kkmgpu] iteration 0: objective")


def test_progress_bar_text_follows_the_iterations(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    monkeypatch.setattr(_progress._PlainBar, "MIN_INTERVAL", 0.0)
    K, _, k = _problem(seed=4)
    best, runs, _ = run_restarts(_operator(K), k, init="random", n_init=2, max_iter=300, tol=0.0,
                                 rng=np.random.default_rng(1), verbose=False, progress=True)
    err = capsys.readouterr().err.strip().splitlines()
    last = runs[-1]
    assert err[-1].startswith("kernel k-means: 2/2 init (100%)")
    assert err[-1].endswith(f"init 1, iteration {last.n_iter - 1}: objective {last.history[-1]:.6g}, "
                            f"{err[-1].rsplit(', ', 1)[1]}")
    with _progress.scope(True):  # progress=None follows the enclosing scope (fit(progress=True))
        run_restarts(_operator(K), k, init="random", n_init=1, max_iter=300, tol=0.0,
                     rng=np.random.default_rng(1), verbose=False)
    assert capsys.readouterr().err.startswith("kernel k-means: 1/1 init (100%)")
    run_restarts(_operator(K), k, init="random", n_init=1, max_iter=300, tol=0.0, rng=np.random.default_rng(1),
                 verbose=False)
    assert capsys.readouterr().err == ""


def test_convergence_warnings_name_their_limits():
    K, init, k = _problem(seed=6)
    with pytest.warns(kkmgpu.ConvergenceWarning, match=r"did not converge in max_iter=1 iterations .*tol=1e-12"):
        run_restarts(_operator(K), k, init=init, n_init=1, max_iter=1, tol=1e-12, rng=np.random.default_rng(0),
                     verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a converged run with distinct centres warns about nothing
        run_restarts(_operator(K), k, init=init, n_init=1, max_iter=300, tol=0.0, rng=np.random.default_rng(0),
                     verbose=False)


def test_fit_timings_are_consistent():
    K, init, k = _problem(seed=7)
    r = kkmgpu.fit(K, k, kernel="precomputed", init="random", n_init=3, random_state=0, device="cpu")
    t = r.timings
    assert t["init"] > 0 and t["iterations"] > 0
    assert t["init"] + t["iterations"] <= t["total"] * 1.01


# --------------------------------------------------------------------------- the device paths (issue 26, point 4)

def _host(a):
    return np.asarray(a.get() if hasattr(a, "get") else a)


def _resolve(device):
    from kkmgpu.backend.device import resolve_device

    return resolve_device(device)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("n,k,n_moved", [(1, 2, 1), (70, 3, 9), (300, 6, 300)])
def test_moved_sums_reads_the_moved_rows_into_both_clusters(device, dtype, n, k, n_moved):
    """ops.moved_sums (CUDA kernel and numba twin): S + K[:, moved] dY with dY = +w at the new cluster and -w at the
    old one, against float64; entries sorted by their (old, new) pair, runs of one pair and pairs seen once."""
    backend = _resolve(device)
    rng = np.random.default_rng([n, k, n_moved, np.dtype(dtype).itemsize])
    X = rng.normal(size=(n, 3))
    K = np.exp(-0.5 * ((X[:, None] - X[None]) ** 2).sum(-1)).astype(dtype)
    moved = rng.choice(n, n_moved, replace=False)
    src = rng.integers(0, k, n_moved).astype(np.int32)
    dst = ((src + rng.integers(1, k, n_moved)) % k).astype(np.int32)
    order = np.lexsort((dst, src))
    rows, src, dst = moved[order].astype(np.int64), src[order], dst[order]
    w = rng.uniform(0.5, 1.5, n_moved)
    S0 = rng.normal(size=(n, k))
    dY = np.zeros((n, k))
    np.add.at(dY, (rows, dst), w)
    np.add.at(dY, (rows, src), -w)
    expected = S0 + K.astype(np.float64) @ dY
    with backend.activate():
        S = backend.asarray(S0.copy())
        backend.ops.moved_sums(backend.asarray(K), backend.asarray(rows), backend.asarray(w), backend.asarray(src),
                               backend.asarray(dst), S)
    tol = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-12}[dtype]
    np.testing.assert_allclose(_host(S), expected, rtol=0, atol=tol * (1 + w.sum()))


@pytest.mark.parametrize("n_moved", [0, 1, 37, 240])
def test_dense_update_reads_each_moved_row_once(device, n_moved, monkeypatch):
    """The dense incremental update hands ops.moved_sums each moved point once, in (old, new) pair order, and gives
    the cluster sums a full pass gives (float64 K: to rounding); the moved points are found on the device."""
    from kkmgpu.engine import dense as _dense

    backend = _resolve(device)
    K, old, k = _problem(seed=8)
    rng = np.random.default_rng(9)
    new = old.copy()
    moved = rng.choice(len(old), n_moved, replace=False)
    new[moved] = (old[moved] + rng.integers(1, k, n_moved)) % k
    w = rng.uniform(0.5, 1.5, len(old))
    calls = []
    original = backend.ops.moved_sums

    def spy(K_, rows, coeffs, src, dst, S):
        calls.append((_host(rows), _host(coeffs), _host(src), _host(dst)))
        return original(K_, rows, coeffs, src, dst, S)

    monkeypatch.setattr(backend.ops, "moved_sums", spy)
    with backend.activate():
        op = DenseKernelOperator(backend.asarray(K), backend.asarray(w), backend)
        np.testing.assert_array_equal(_host(_dense.moved_points(backend.asarray(old), backend.asarray(new),
                                                                n_moved, backend.xp)), np.sort(moved))
        S = op.cluster_sums(backend.asarray(old), k)
        S = _host(op.update_cluster_sums(S, backend.asarray(old), backend.asarray(new), n_moved=n_moved))
    Y = np.zeros((len(new), k))
    Y[np.arange(len(new)), new] = w
    np.testing.assert_allclose(S, K @ Y, rtol=1e-12, atol=1e-12)
    if n_moved == 0:
        assert calls == []
        return
    (rows, coeffs, src, dst), = calls
    np.testing.assert_array_equal(np.sort(rows), np.sort(moved))  # each moved row once
    np.testing.assert_array_equal(src, old[rows])
    np.testing.assert_array_equal(dst, new[rows])
    np.testing.assert_array_equal(coeffs, w[rows])
    pairs = src.astype(np.int64) * k + dst
    assert np.all(np.diff(pairs) >= 0)


def reference_kmeans_plus_plus_seeds(K, w, k, rng, n_local_trials, follow=None):
    """Greedy weighted k-means++ seeds in float64 NumPy, one seed at a time, drawing from ``rng`` as the library
    does: one uniform for the first seed (inverse CDF of w / sum w, searched to the right), then ``n_local_trials``
    per seed (inverse CDF of w D^2); with zero potential, uniform over the unchosen positive-weight points.

    ``follow``: another run's seeds. Among the candidates, duplicates of the best one (the same row of D^2: the same
    point in feature space) have the same potential in exact arithmetic, but a GPU's product adds identical rows in
    orders that may differ (cuBLAS: an H100 chose 34 where NumPy's first of equal potentials was 36). Where
    ``follow[j]`` is such a duplicate it is taken as seed j, and the reference goes on from it; any other seed is
    replaced by the reference's, so that the sequences differ there."""
    n = K.shape[0]
    diag = np.diag(K)
    D2 = np.maximum(diag[:, None] + diag[None, :] - 2.0 * K, 0.0)
    first_u = rng.random()
    draws = rng.uniform(size=(k - 1, n_local_trials))
    cdf = np.cumsum(w / w.sum())
    seeds = [int(np.searchsorted(cdf / cdf[-1], first_u, side="right"))]
    closest = D2[seeds[0]].copy()
    for j in range(1, k):
        p = w * closest
        if p.sum() <= 0:
            p = np.zeros(n)
            free = [i for i in range(n) if w[i] > 0 and i not in seeds] or [i for i in range(n) if i not in seeds]
            p[free] = 1.0
        c = np.cumsum(p)
        candidates = np.minimum(np.searchsorted(c, draws[j - 1] * c[-1]), n - 1)
        potentials = np.minimum(closest[None, :], D2[candidates]) @ w  # one product: duplicates tie exactly
        best = int(candidates[int(np.argmin(potentials))])
        if follow is not None and follow[j] in candidates and np.array_equal(D2[follow[j]], D2[best]):
            best = int(follow[j])
        seeds.append(best)
        closest = np.minimum(closest, D2[best])
    return np.array(seeds)


@pytest.mark.parametrize("case", ["plain", "zero weights", "fewer distinct points than k"])
def test_device_kmeans_plus_plus_picks_the_reference_seeds(device, case):
    """k-means++ on the device picks the seeds a float64 NumPy loop picks from the same uniforms (several seeds
    of the generator), through an operator's device rows or its host rows, and labels each point by its nearest
    seed."""
    backend = _resolve(device)
    rng = np.random.default_rng(10)
    X = rng.normal(size=(90, 2)) + np.repeat(rng.normal(scale=4.0, size=(6, 2)), 15, axis=0)
    w = rng.uniform(0.5, 2.0, 90)
    k = 6
    if case == "zero weights":
        w[::4] = 0.0
    if case == "fewer distinct points than k":
        X = X[rng.integers(0, 3, 90)]
        k = 5
    K = np.exp(-0.1 * ((X[:, None] - X[None]) ** 2).sum(-1))
    trials = 2 + int(np.log(k))

    class HostRows:  # an operator with kernel rows on the host only (as the tiled and sparse ones)
        def __init__(self, op):
            self.op, self.backend, self.n, self.weights, self.diag = op, op.backend, op.n, op.weights, op.diag

        def rows(self, index):
            return self.op.rows(index)

    with backend.activate():
        op = DenseKernelOperator(backend.asarray(K), backend.asarray(w), backend)
        for s in range(8):
            seeds = _host(_lloyd.kmeans_plus_plus_seeds(op, k, np.random.default_rng(s)))
            expected = reference_kmeans_plus_plus_seeds(K, w, k, np.random.default_rng(s), trials, follow=seeds)
            np.testing.assert_array_equal(seeds, expected)
            through_host = _host(_lloyd.kmeans_plus_plus_seeds(HostRows(op), k, np.random.default_rng(s)))
            np.testing.assert_array_equal(through_host, reference_kmeans_plus_plus_seeds(
                K, w, k, np.random.default_rng(s), trials, follow=through_host))
            labels = _lloyd.kmeans_plus_plus(op, k, np.random.default_rng(s))
            D2 = np.diag(K)[None, :] + np.diag(K)[expected][:, None] - 2.0 * K[expected]
            nearest = np.argmin(D2, axis=0)
            nearest[expected] = np.arange(k)
            np.testing.assert_array_equal(labels, nearest)
            assert np.all(w[expected] > 0) or case != "zero weights"


def test_seeds_nearest_in_groups_when_the_rows_do_not_fit(monkeypatch):
    """With room for the rows of two seeds at a time, each point still goes to its nearest seed (first of ties)."""
    K, _, _ = _problem(seed=11, n=120, k=4)
    k = 7
    op = _operator(K)
    full = _lloyd.kmeans_plus_plus(op, k, np.random.default_rng(3))
    monkeypatch.setattr(_lloyd, "work_bytes", lambda cap, backend, minimum=1: 2 * 2 * 8 * op.n)
    np.testing.assert_array_equal(_lloyd.kmeans_plus_plus(op, k, np.random.default_rng(3)), full)


def test_a_stop_on_the_objective_drops_the_pending_assignment(device):
    """The loop assigns the next step before it reads the objective; when the objective stops the run, the labels,
    history and sizes are those of the last step taken, as a run capped at that many steps gives."""
    backend = _resolve(device)
    K, _, k = _problem(seed=12, n=300)
    init = _lloyd.random_partition(300, k, np.random.default_rng(12))  # stops on tol after 5 steps
    with backend.activate():
        op = DenseKernelOperator(backend.asarray(K), backend.asarray(np.ones(len(init))), backend)
        stopped = lloyd(op, init, k, tol=1e-3)
        assert stopped.stop_reason == "relative objective change <= tol" and stopped.n_iter >= 2
        capped = lloyd(op, init, k, tol=0.0, max_iter=stopped.n_iter)
    np.testing.assert_array_equal(_host(stopped.labels), _host(capped.labels))
    np.testing.assert_array_equal(stopped.history, capped.history)
    np.testing.assert_array_equal(stopped.sizes, np.bincount(_host(stopped.labels), minlength=k))
