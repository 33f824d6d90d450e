"""Scaling of exact (dense) kernel k-means on MNIST samples: n = 1k, 2k, 5k, 10k; k = 10; RBF; pixels / 255.

For every device and n this module measures times; the floors are measured in the same run on the same
device and the ratios derived when the run ends (``_kkmgpu_bench.derive_floors``):

- ``kernel_build``: ``kkmgpu.kernel_matrix`` vs max(2 n^2 d / GEMM rate, bytes(K) / write bandwidth);
- ``exact_iterations``: the full-pass (``update="full"``) Lloyd iterations of ``kkmgpu.fit(K, kernel="precomputed")`` from fixed random
  initial labels; per-iteration time = ``timings["iterations"] / n_iter`` (every iteration computes the
  cluster sums, assigns, and evaluates the objective) vs the memory floor bytes(K) / copy bandwidth;
- ``fit_end_to_end``: ``kkmgpu.fit(X, kernel="rbf")`` (build K + iterate, default ``update="auto"``, so late
  iterations update the cluster sums incrementally) vs the sum of the two floors;
- ``tslearn_iterations`` (n <= 5k): ``tslearn.clustering.KernelKMeans(kernel="precomputed")`` on the same K,
  per-iteration time, and the speedup of kkmgpu over it.

Speeds are recorded as ratios in the result file (bench/results/), never asserted.
"""

from __future__ import annotations

import os
import statistics
import time
import warnings
from dataclasses import dataclass

import numpy as np
import pytest

from _kkmgpu_bench import (
    HOST,
    ForeignCpu,
    mnist_sample,
    synchronize,
    to_host,
)


def _int_list(env: str, default: tuple[int, ...]) -> tuple[int, ...]:
    raw = os.environ.get(env, "").strip()
    return tuple(int(v) for v in raw.split(",") if v.strip()) if raw else default


SIZES = _int_list("KKMGPU_BENCH_SIZES", (1000, 2000, 5000, 10000))
TSLEARN_SIZES = _int_list("KKMGPU_BENCH_TSLEARN_SIZES", (1000, 2000, 5000))
N_CLUSTERS = 10
MAX_ITER = int(os.environ.get("KKMGPU_BENCH_MAX_ITER", "20"))
SHORT_ITER = 2  # the short run of the marginal (two-point) per-iteration estimate
ROUNDS = int(os.environ.get("KKMGPU_BENCH_ROUNDS", "5"))
SEED = 0
DTYPE = "float32"


def _core():
    """The kkmgpu module once its core (fit, kernel_matrix) exists, else skip with the reason."""
    import kkmgpu

    missing = [name for name in ("fit", "kernel_matrix") if not hasattr(kkmgpu, name)]
    if missing:
        pytest.skip(f"kkmgpu has no {', '.join(missing)} yet")
    return kkmgpu


def _convergence_warning():
    import kkmgpu

    return getattr(kkmgpu, "ConvergenceWarning", Warning)


@dataclass(frozen=True)
class Problem:
    n: int
    X: np.ndarray  # (n, 784) float32 in [0, 1]
    gamma: float
    init_labels: np.ndarray  # (n,) int32, fixed random partition

    @property
    def d(self) -> int:
        return self.X.shape[1]

    @property
    def kernel_bytes(self) -> int:
        return self.n * self.n * np.dtype(DTYPE).itemsize

    def describe(self) -> dict:
        return {"n": self.n, "d": self.d, "k": N_CLUSTERS, "kernel": "rbf", "gamma": self.gamma,
                "gamma_rule": "scale = 1 / (n_features * X.var()) on the sample", "dtype": DTYPE,
                "data": f"MNIST train+test, seeded uniform sample (seed {SEED}), pixels / 255",
                "bytes_K": self.kernel_bytes}


def random_partition(n: int, k: int, seed: int) -> np.ndarray:
    """Uniform labels with the first k points of a random permutation set to 0..k-1 (no empty cluster)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, size=n).astype(np.int32)
    labels[rng.permutation(n)[:k]] = np.arange(k, dtype=np.int32)
    return labels


@pytest.fixture(scope="module", params=SIZES, ids=lambda n: f"n{n}")
def n(request):
    return request.param


@pytest.fixture(scope="module")
def problem(mnist, n) -> Problem:
    X, _ = mnist_sample(mnist, n, seed=SEED)
    gamma = 1.0 / (X.shape[1] * float(X.astype(np.float64).var()))
    return Problem(n=n, X=X, gamma=gamma, init_labels=random_partition(n, N_CLUSTERS, SEED))


@pytest.fixture(scope="module")
def kernel(problem, device):
    """K built once per (device, n) by kkmgpu.kernel_matrix and shared by the cases that iterate on it."""
    kkmgpu = _core()
    K = kkmgpu.kernel_matrix(problem.X, kernel="rbf", gamma=problem.gamma, device=device, dtype=DTYPE)
    synchronize(device)
    yield K
    del K
    if device.startswith("cuda"):
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()


def _pedantic(benchmark, fn, rounds: int, warmup_rounds: int = 1) -> list:
    """Run ``fn`` under pytest-benchmark and return [(wall seconds, fn's return)] of the timed rounds."""
    calls = []

    def timed():
        t0 = time.perf_counter()
        out = fn()
        calls.append((time.perf_counter() - t0, out))

    benchmark.pedantic(timed, rounds=rounds, warmup_rounds=warmup_rounds, iterations=1)
    return calls[-rounds:]  # a disabled benchmark runs fn once, without warm-up


def _summary(seconds) -> dict:
    seconds = list(seconds)
    return {"best": min(seconds), "median": statistics.median(seconds), "rounds": len(seconds)}


def _fit_numbers(result, wall: float) -> dict:
    timings = dict(result.timings)
    return {"wall": wall, "n_iter": int(result.n_iter), "objective": float(result.objective),
            "converged": bool(result.converged), "timings": timings,
            "objective_evaluations": len(result.objective_history),
            "per_iteration": timings["iterations"] / max(int(result.n_iter), 1)}


def _same_kernel_gemv_seconds(K, device: str) -> float:
    """Best time of K @ ones (float32 gemv: reads K once) with NumPy's BLAS or cuBLAS."""
    if device.startswith("cuda"):
        import cupy

        v = cupy.ones(K.shape[1], dtype=K.dtype)
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        K @ v
        best = float("inf")
        for _ in range(10):
            start.record()
            K @ v
            stop.record()
            stop.synchronize()
            best = min(best, cupy.cuda.get_elapsed_time(start, stop) / 1e3)
        return best
    v = np.ones(K.shape[1], dtype=K.dtype)
    K @ v
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        K @ v
        best = min(best, time.perf_counter() - t0)
    return best


def test_kernel_build(benchmark, problem, device, floors, recorder):
    kkmgpu = _core()
    machine = ForeignCpu()

    def build():
        K = kkmgpu.kernel_matrix(problem.X, kernel="rbf", gamma=problem.gamma, device=device, dtype=DTYPE)
        synchronize(device)
        shape = K.shape
        del K
        return shape

    calls = _pedantic(benchmark, build, rounds=max(2, ROUNDS // 2))
    assert calls[-1][1] == (problem.n, problem.n)
    floors.bandwidths(device)  # measured once, early; measured again and floors derived at the end of the run
    floors.gemm_rate(device, problem.n, problem.d)
    recorder.add(device, {
        "benchmark": "kernel_build", **problem.describe(), "device": device,
        "cpu_use_during_case": machine.seconds(),
        "time_s": _summary(wall for wall, _ in calls),
        "note": "each call allocates a fresh K (on the CPU its pages are first touched inside the call)",
    })


def test_exact_iterations(benchmark, problem, kernel, device, floors, recorder):
    kkmgpu = _core()
    machine = ForeignCpu()
    convergence_warning = _convergence_warning()

    def lloyd(max_iter):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", convergence_warning)
            result = kkmgpu.fit(kernel, N_CLUSTERS, kernel="precomputed", init=problem.init_labels,
                                max_iter=max_iter, tol=0, device=device, dtype=DTYPE, update="full")
        synchronize(device)
        return result

    calls = _pedantic(benchmark, lambda: lloyd(MAX_ITER), rounds=ROUNDS)
    rounds = [_fit_numbers(result, wall) for wall, result in calls]
    del calls
    assert all(r["n_iter"] >= 1 and np.isfinite(r["objective"]) for r in rounds)

    # Cross-check that needs no timer of the library: wall time of a long minus a short run from the same
    # labels, over the difference of their iteration counts (cancels validation, set-up and transfers).
    short = []
    for _ in range(3):
        t0 = time.perf_counter()
        result = lloyd(SHORT_ITER)
        short.append(_fit_numbers(result, time.perf_counter() - t0))
    long_wall = min(r["wall"] for r in rounds)
    long_iterations = min(r["timings"]["iterations"] for r in rounds)
    extra_iterations = rounds[0]["n_iter"] - short[0]["n_iter"]
    marginal = marginal_timer = None
    if extra_iterations > 0:
        marginal = (long_wall - min(r["wall"] for r in short)) / extra_iterations
        marginal_timer = (long_iterations - min(r["timings"]["iterations"] for r in short)) / extra_iterations

    per_iteration = _summary(r["per_iteration"] for r in rounds)
    floors.bandwidths(device)  # measured (if not yet) now; the floors are derived at the end of the run
    recorder.add(device, {
        "benchmark": "exact_iterations", **problem.describe(), "device": device,
        "cpu_use_during_case": machine.seconds(),
        "max_iter": MAX_ITER, "tol": 0, "init": f"fixed random partition (seed {SEED})",
        "n_iter": rounds[0]["n_iter"], "converged": rounds[0]["converged"], "objective": rounds[0]["objective"],
        "objective_evaluations": rounds[0]["objective_evaluations"],
        "time_s": {
            "per_iteration_best": per_iteration["best"],
            "per_iteration_median": per_iteration["median"],
            "per_iteration_marginal_wall": marginal,
            "per_iteration_marginal_timer": marginal_timer,
            "iterations_best": long_iterations,
            "fit_call_best": long_wall,
            "fit_call_median": statistics.median(r["wall"] for r in rounds),
            "rounds": len(rounds),
            # one streaming read of this very K by the vendor BLAS (sgemv K @ 1): where K's memory is slower
            # than the copy buffers', this shows it (diagnostic; the floor is the copy one)
            "same_K_gemv": _same_kernel_gemv_seconds(kernel, device),
        },
        "timings_best_round": min(rounds, key=lambda r: r["wall"])["timings"],
        "update": "full (every iteration re-reads all of K; the default 'auto' switches to incremental updates "
                  "once fewer than n/2 points move, which the fit_end_to_end case uses)",
        "definition": ("per_iteration = result.timings['iterations'] / result.n_iter (includes the initial cluster "
                       "sums, the assignment, the update of S and the objective); floor = bytes(K) / copy bandwidth"),
    })


def test_fit_end_to_end(benchmark, problem, device, floors, recorder):
    kkmgpu = _core()
    machine = ForeignCpu()
    convergence_warning = _convergence_warning()

    def fit():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", convergence_warning)
            result = kkmgpu.fit(problem.X, N_CLUSTERS, kernel="rbf", gamma=problem.gamma, init=problem.init_labels,
                                max_iter=MAX_ITER, tol=0, device=device, dtype=DTYPE)
        synchronize(device)
        return result

    calls = _pedantic(benchmark, fit, rounds=max(2, ROUNDS // 2))
    rounds = [_fit_numbers(result, wall) for wall, result in calls]
    del calls
    best = min(rounds, key=lambda r: r["wall"])
    floors.gemm_rate(device, problem.n, problem.d)
    recorder.add(device, {
        "benchmark": "fit_end_to_end", **problem.describe(), "device": device,
        "cpu_use_during_case": machine.seconds(),
        "max_iter": MAX_ITER, "tol": 0, "init": f"fixed random partition (seed {SEED})",
        "n_iter": best["n_iter"], "objective": best["objective"],
        "time_s": {"best": best["wall"], "median": statistics.median(r["wall"] for r in rounds),
                   "rounds": len(rounds)},
        "timings_best_round": best["timings"],
        "definition": "floor = kernel build floor + n_iter * memory floor of one dense iteration",
    })


def test_tslearn_iterations(benchmark, problem, kernel, device, bench_devices, recorder):
    """tslearn's KernelKMeans on the same K, per iteration (it converts K to float64 inside fit)."""
    if problem.n not in TSLEARN_SIZES:
        pytest.skip(f"tslearn is measured at n in {TSLEARN_SIZES} (KKMGPU_BENCH_TSLEARN_SIZES)")
    if device != bench_devices[0]:
        pytest.skip(f"tslearn runs on the host; measured once per n, with the K of device {bench_devices[0]!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tslearn warns at import when h5py is missing
        tslearn_clustering = pytest.importorskip("tslearn.clustering", reason="tslearn is not installed")
    machine = ForeignCpu()
    K = np.ascontiguousarray(to_host(kernel))

    def fit(max_iter):
        model = tslearn_clustering.KernelKMeans(n_clusters=N_CLUSTERS, kernel="precomputed", max_iter=max_iter,
                                                tol=0.0, n_init=1, random_state=SEED)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "2-Dimensional data passed ..."
            model.fit(K)
        if model.n_iter_ == 0:
            pytest.skip("tslearn found an empty cluster in all of its 10 attempts")
        return {"n_iter": int(model.n_iter_), "inertia": float(model.inertia_)}

    calls = _pedantic(benchmark, lambda: fit(MAX_ITER), rounds=max(2, ROUNDS // 2))
    long_wall = min(wall for wall, _ in calls)
    long_iter = calls[0][1]["n_iter"]
    short = []
    for _ in range(max(2, ROUNDS // 2)):
        t0 = time.perf_counter()
        out = fit(SHORT_ITER)
        short.append((time.perf_counter() - t0, out))
    short_wall = min(wall for wall, _ in short)
    short_iter = short[0][1]["n_iter"]
    marginal = (long_wall - short_wall) / (long_iter - short_iter)
    recorder.add(HOST, {
        "benchmark": "tslearn_iterations", **problem.describe(), "device": "host cpu",
        "cpu_use_during_case": machine.seconds(),
        "implementation": "tslearn.clustering.KernelKMeans(kernel='precomputed', n_init=1, tol=0)",
        "max_iter": MAX_ITER, "n_iter": long_iter, "short_max_iter": SHORT_ITER, "short_n_iter": short_iter,
        "init": f"tslearn's own random labels (random_state={SEED}); it takes no initial labels",
        "internal_dtype": "float64 (tslearn converts the float32 K in fit)",
        "time_s": {
            "per_iteration_marginal": marginal,
            "per_iteration_fit_over_n_iter": long_wall / long_iter,
            "fit_call_best": long_wall,
            "fit_call_short_best": short_wall,
            "setup_estimate": long_wall - long_iter * marginal,
            "rounds": len(calls),
        },
        "definition": ("per_iteration_marginal = (fit time at max_iter={0} - fit time at max_iter={1}) / "
                       "(n_iter difference); speedup = that / kkmgpu per_iteration_best at the same n "
                       "(per_iteration_fit_over_n_iter also counts tslearn's float64 conversion of K)"
                       ).format(MAX_ITER, SHORT_ITER),
    })
