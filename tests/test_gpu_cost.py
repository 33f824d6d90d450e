"""What one Lloyd iteration of every method would cost on a GPU: budgets held on the CuPy stand-in's cost ledger.

The ledger (``cupy.cuda.standin_ledger``, tests/standin/cupy/_ledger.py) counts kernel launches, device-to-host
synchronisations, host <-> device bytes, device bytes and matrix-product flops as the emulated GPU path runs, so
CI sees a GPU cost regression without a GPU (docs/gpu-emulation.md, "Cost ledger").

One iteration's counts come from two fits that differ only in ``max_iter`` (A and B, from the same seeded start,
``tol=0``): the first A iterations, the set-up and the wrap-up are the same in both, so the difference over
B - A is what an iteration costs, with no hook inside the loops. The budgets (issue 26):

* synchronisations per iteration at most :data:`SYNC_BUDGET`: one for every method (a Lloyd iteration's host learns
  the moved count and the cluster counts, the only things it decides on; CATS's its cluster counts);
* launches per iteration the same at n and 2n, and at k and 2k: no per-point or per-cluster launches;
* no n-length transfer per iteration: host <-> device bytes the same at n and 2n (a transfer of even one byte
  per point would add n bytes at 2n);
* CATS in 3xTF32 splits all points' features once per fit, not per iteration.

The cases run on the stand-in only (``KKMGPU_EMULATE_GPU=1``); without it they skip like every ``cuda`` case,
and on a real GPU they skip because the ledger is the stand-in's (``bash bench/gpu_session.sh`` measures there).
"""

import functools
import warnings

import numpy as np
import pytest

import kkmgpu
from conftest import cuda_skip_reason

pytestmark = pytest.mark.gpu

N, K, D = 150, 3, 4
#: (A, B): the iterations compared; from the third on, the moved points are few enough for the incremental
#: updates of update="auto" (ncut) on these data
ITERATIONS = (2, 4)

#: case -> fit's keywords; every case runs init="random", n_init=1, tol=0, random_state=0 on the device
CASES = {
    "exact-dense-full": dict(engine="dense", update="full"),
    "exact-dense-incremental": dict(engine="dense", update="incremental"),
    "exact-tiled-full": dict(engine="tiled", update="full"),
    "exact-tiled-incremental": dict(engine="tiled", update="incremental"),
    "cats": dict(method="cats", n_samples_per_cluster=16, theta=0.0),
    "eigen": dict(method="eigen"),
    "approx": dict(method="approx"),
    "trimmed": dict(method="trimmed", update="incremental"),
    "ncut": dict(objective="ncut"),
}

#: device-to-host synchronisations one iteration may make (issue 26: "a dense incremental iteration makes at most
#: one device-to-host transfer"; a Lloyd iteration needs one, the moved count and cluster counts it stops and
#: refills on, and every incremental update takes the moved count from it: the tiled and sparse ones gather the
#: moved points, and the sparse one their rows of K, on the device into sizes known on the host). CATS: one, the
#: cluster counts its sampling and stopping rules read.
SYNC_BUDGET = dict.fromkeys(CASES, 1)


def _standin():
    """The stand-in's CuPy (skips where the cuda cases skip, and on a real GPU)."""
    reason = cuda_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    from kkmgpu.backend.device import import_cupy

    cp = import_cupy()
    if not hasattr(cp.cuda, "standin_ledger"):
        pytest.skip("the CuPy stand-in's cost ledger (cupy.cuda.standin_ledger) not found: this CuPy is the real "
                    "one, whose costs bench/gpu_session.sh measures")
    return cp


#: cases on D_WIDE features (products wide enough for the tensor-core modes: every side at least 32)
WIDE_CASES = {f"cats-{mode}": dict(method="cats", n_samples_per_cluster=16, theta=0.0, gemm_precision=mode)
              for mode in ("fp32", "3xtf32")}
D_WIDE = 40


#: the data's seed per case (26 unless named): ncut on seed 26's 150 points stops moving at the 4th iteration
DATA_SEED = {"ncut": 27}


def _data(n, d=D, seed=26):
    return np.random.default_rng(seed).random((n, d)).astype(np.float32)


@functools.lru_cache(maxsize=None)
def per_iteration(case, n, k):
    """(Counts of one iteration, its ledgers' launch names and sync sites per iteration, the Counts of its matrix
    products, the GEMM mode the fit recorded) for ``case``."""
    cp = _standin()
    X = _data(n, D_WIDE if case in WIDE_CASES else D, DATA_SEED.get(case, 26))
    ledgers = []
    for max_iter in ITERATIONS:
        with cp.cuda.standin_ledger() as ledger, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ConvergenceWarning: max_iter is reached on purpose
            result = kkmgpu.fit(X, k, device="cuda", init="random", n_init=1, random_state=0, max_iter=max_iter,
                                tol=0.0, **{**CASES, **WIDE_CASES}[case])
        assert result.n_iter == max_iter and not result.converged, (
            f"{case}: the fit stopped after {result.n_iter} of {max_iter} iterations (converged={result.converged}: "
            "its last iteration moved no point); the comparison needs data that keep moving")
        ledgers.append(ledger)
    first, last = ledgers
    steps = ITERATIONS[1] - ITERATIONS[0]
    names = last.launch_names.copy()
    names.subtract(first.launch_names)
    sites = last.sync_sites.copy()
    sites.subtract(first.sync_sites)
    none = type(last.counts)()
    gemm = (last.by_name.get("matmul", none) - first.by_name.get("matmul", none)) / steps
    return ((last.counts - first.counts) / steps, {name: v / steps for name, v in names.items() if v},
            {site: v / steps for site, v in sites.items() if v}, gemm, result.method_params["gemm_mode"])


def _describe(case, n, k):
    counts, names, sites = per_iteration(case, n, k)[:3]
    lines = [f"{case} at n={n}, k={k}, per iteration: {counts}"]
    lines += [f"  sync {v:g} x {kind} at {where}" for (kind, where), v in sites.items()]
    lines += [f"  launch {v:g} x {name}" for name, v in sorted(names.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)


@pytest.mark.parametrize("case", CASES)
def test_syncs_per_iteration_within_budget(case):
    counts = per_iteration(case, N, K)[0]
    assert counts.syncs <= SYNC_BUDGET[case], _describe(case, N, K)


@pytest.mark.parametrize("case", CASES)
def test_launches_per_iteration_do_not_grow_with_n(case):
    small, large = per_iteration(case, N, K)[0], per_iteration(case, 2 * N, K)[0]
    assert large.launches == small.launches, _describe(case, N, K) + "\n" + _describe(case, 2 * N, K)


@pytest.mark.parametrize("case", CASES)
def test_launches_per_iteration_do_not_grow_with_k(case):
    small, large = per_iteration(case, N, K)[0], per_iteration(case, N, 2 * K)[0]
    assert large.launches == small.launches, _describe(case, N, K) + "\n" + _describe(case, N, 2 * K)


@pytest.mark.parametrize("case", CASES)
def test_no_n_length_transfer_per_iteration(case):
    small, large = per_iteration(case, N, K)[0], per_iteration(case, 2 * N, K)[0]
    moved = [c.h2d_bytes + c.d2h_bytes for c in (small, large)]
    assert moved[1] == moved[0], _describe(case, N, K) + "\n" + _describe(case, 2 * N, K)


def test_iteration_counts_follow_the_work():
    """The ledger sees the work itself: a full dense iteration reads K (n^2 float32) at least once and a tiled one
    multiplies 2 n^2 d (times three in 3xTF32) float32 flops, at n and 2n."""
    for n in (N, 2 * N):
        dense = per_iteration("exact-dense-full", n, K)[0]
        assert dense.read_bytes >= 4 * n * n
        tiled = per_iteration("exact-tiled-full", n, K)[0]
        gemm = sum(v for mode, v in tiled.flops.items() if mode in ("fp32", "tf32"))
        assert gemm in (2 * n * n * D, 3 * 2 * n * n * D), _describe("exact-tiled-full", n, K)


def test_cats_3xtf32_splits_all_points_once_per_fit_not_per_iteration():
    """CATS in 3xTF32 reads all points' split operand ([L | H | H], n x 3 d), prepared once per fit: an iteration's
    device bytes outside the GEMM exceed fp32's by the same amount at n and 2n (the samples' operand, k L rows),
    where a split of the n x d features (about a dozen elementwise passes) would add well over one read of them
    per point; the GEMM itself reads at most the operand's two extra thirds more per pass (two passes at most)."""
    extra = {}
    for n in (N, 2 * N):
        (fp32, _, _, fp32_gemm, fp32_mode), (split, _, _, split_gemm, split_mode) = (
            per_iteration(f"cats-{mode}", n, K) for mode in ("fp32", "3xtf32"))
        assert (fp32_mode, split_mode) == ("fp32", "3xtf32")
        assert split.syncs == fp32.syncs and split.launches <= fp32.launches + 4, _describe("cats-3xtf32", n, K)
        extra[n] = ((split.device_bytes - split_gemm.device_bytes) - (fp32.device_bytes - fp32_gemm.device_bytes),
                    split_gemm.device_bytes - fp32_gemm.device_bytes)
    elementwise, gemm = (extra[2 * N][i] - extra[N][i] for i in (0, 1))
    assert elementwise < 4 * N * D_WIDE, (extra, _describe("cats-3xtf32", 2 * N, K))
    assert gemm <= 2 * 8 * N * D_WIDE, (extra, _describe("cats-3xtf32", 2 * N, K))
