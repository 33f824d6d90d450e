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
