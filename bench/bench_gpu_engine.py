"""The GPU engine on MNIST: kernel build, one dense iteration, Lloyd iterations and the end-to-end fit, against
their floors, a plain CuPy implementation and the CPU path, all measured in the same run.

MNIST train + test (pixels / 255, d = 784), k = 10, RBF, float32; n = 10k, 20k, 40k, 70k by default
($KKMGPU_BENCH_ENGINE_SIZES; every n below 70,000 is a seeded uniform sample, 70,000 is all of it). Three
implementations ("engines") run the same four cases:

- ``kkmgpu-cuda``: kkmgpu on the GPU (the fused CUDA kernels of kernels_cuda/kernel_kmeans.cu);
- ``plain-cupy``: the obvious CuPy code (``plain_kernel_matrix``, ``plain_lloyd`` below): K from squared norms,
  ``X @ X.T`` and ``cupy.exp``; per iteration S = K @ one-hot, distances, argmin;
- ``kkmgpu-cpu``: kkmgpu on the CPU (numba twins), at n <= $KKMGPU_BENCH_CPU_MAX_N (default 20000).

Cases (benchmark names ``engine_*`` for kkmgpu, ``plain_cupy_*`` for the baseline):

- ``*_kernel_build``: K from X already on the device, vs max(2 n^2 d / GEMM rate, bytes(K) / write bandwidth);
- ``*_iteration``: one full dense iteration on a K held on the device with fixed labels, timed directly
  (kkmgpu: ``DenseKernelOperator.cluster_sums`` + ``_lloyd._totals`` + ``ops.assign_labels``), vs the memory
  floor bytes(K) / copy bandwidth;
- ``*_fit_iterations``: 20 Lloyd iterations (``kkmgpu.fit(K, kernel="precomputed", update="full", tol=0)``),
  per iteration = ``timings["iterations"] / n_iter``, vs the same floor;
- ``*_fit_end_to_end``: X on the device to labels on the host (``kkmgpu.fit(X, kernel="rbf", init="random",
  n_init=1)``, default ``update="auto"``, max_iter=300, tol=1e-6), after a warm-up fit.

GPU times are CUDA-event times (wall time is kept too); the end-to-end time is the wall time. The floors come
from ``_kkmgpu_bench.Floors`` (the same ones bench_exact.py uses) and the ratios and speed-ups are derived
when the run ends; everything goes into bench/results/<date>-<device>.json. Speeds are recorded, never asserted.
Every GPU case skips with the reason where no GPU is usable, and every case skips where its K does not fit
the device's free memory.
"""

from __future__ import annotations

import os
import statistics
import time
import warnings
from dataclasses import dataclass

import numpy as np
import pytest

import _kkmgpu_bench as kb
from _kkmgpu_bench import ForeignCpu, mnist_sample, register_extension


def _int_list(env: str, default: tuple[int, ...]) -> tuple[int, ...]:
    raw = os.environ.get(env, "").strip()
    return tuple(int(v) for v in raw.split(",") if v.strip()) if raw else default


ENV_SIZES = "KKMGPU_BENCH_ENGINE_SIZES"
ENV_CPU_MAX_N = "KKMGPU_BENCH_CPU_MAX_N"
ENV_ROUNDS = "KKMGPU_BENCH_ENGINE_ROUNDS"

SIZES = _int_list(ENV_SIZES, (10000, 20000, 40000, 70000))
CPU_MAX_N = int(os.environ.get(ENV_CPU_MAX_N, "").strip() or 20000)
ROUNDS = int(os.environ.get(ENV_ROUNDS, "").strip() or os.environ.get("KKMGPU_BENCH_ROUNDS", "").strip() or 5)
ITERATION_ROUNDS = max(10, 4 * ROUNDS)  # one iteration is cheap: more repetitions of it
MAX_ITER = int(os.environ.get("KKMGPU_BENCH_MAX_ITER", "").strip() or 20)
E2E_MAX_ITER, E2E_TOL = 300, 1e-6  # kkmgpu.fit's defaults, passed explicitly to every engine
E2E_TARGET_N, E2E_TARGET_S = 70000, 1.0
N_CLUSTERS = 10
SEED = 0
DTYPE = "float32"
PARTS_REPEATS = 7

BENCHMARKS = {  # benchmark name -> (engine prefix, measure)
    f"{prefix}_{measure}": (prefix, measure)
    for prefix in ("engine", "plain_cupy")
    for measure in ("kernel_build", "iteration", "fit_iterations", "fit_end_to_end")
}
#: the time that speed-ups compare, per measure
TIME_KEY = {"kernel_build": "best", "iteration": "best", "fit_iterations": "per_iteration_best",
            "fit_end_to_end": "best"}


@dataclass(frozen=True)
class Engine:
    name: str            # test id
    device: str          # "cuda" or "cpu": the recorder key, hence the result file
    implementation: str  # "kkmgpu" or "plain-cupy"
    prefix: str          # benchmark name prefix

    @property
    def is_kkmgpu(self) -> bool:
        return self.implementation == "kkmgpu"


ENGINES = (
    Engine("kkmgpu-cuda", "cuda", "kkmgpu", "engine"),
    Engine("plain-cupy", "cuda", "plain-cupy", "plain_cupy"),
    Engine("kkmgpu-cpu", "cpu", "kkmgpu", "engine"),
)
engines = pytest.mark.parametrize("engine", ENGINES, ids=[engine.name for engine in ENGINES])


# --------------------------------------------------------------------------------------------
# the plain CuPy implementation (array namespace ``xp``; the benchmark runs it with CuPy only)


def plain_kernel_matrix(X, gamma: float, xp):
    """RBF K = exp(-gamma ||x_i - x_j||^2) from squared norms, one X @ X.T and ``xp.exp``.

    The operations update K in place, so the build holds one n x n array (the one-line
    ``exp(-gamma * (sq[:, None] + sq[None, :] - 2 * X @ X.T))`` needs about four, which does not fit an 80 GB
    GPU at n = 70,000); every line after the product is one more pass over K.
    """
    sq = (X * X).sum(axis=1)
    K = X @ X.T
    K *= -2.0
    K += sq[:, None]
    K += sq[None, :]
    xp.maximum(K, 0.0, out=K)
    K *= -gamma
    xp.exp(K, out=K)
    return K


def plain_cluster_sums(K, labels, weights, k: int):
    """S = K @ (weights * one-hot), float64 (n, k): ``kkmgpu.kernels.kernel_kmeans_cuda.indicator_cluster_sums``."""
    from kkmgpu.kernels import kernel_kmeans_cuda as _gpu_kernels

    return _gpu_kernels.indicator_cluster_sums(K, labels, weights, k)


def plain_totals(S, diag, labels, k: int, xp):
    """Cluster sizes, within-cluster totals C_c = sum_{i in c} S[i, c] and the objective of ``labels``."""
    sizes = xp.bincount(labels, minlength=k).astype(xp.float64)
    own = S[xp.arange(labels.shape[0]), labels]
    within = xp.bincount(labels, weights=own, minlength=k)
    safe = xp.where(sizes > 0, sizes, 1.0)
    objective = float(diag.sum()) - float(xp.where(sizes > 0, within / safe, 0.0).sum())
    return sizes, within, objective


def plain_statistics(K, diag, labels, weights, k: int, xp):
    """S, sizes, within-cluster totals and objective of ``labels`` (one read of K)."""
    S = plain_cluster_sums(K, labels, weights, k)
    return (S, *plain_totals(S, diag, labels, k, xp))


def plain_assign(S, diag, sizes, within, xp):
    """argmin_c K_ii - 2 S[i, c] / n_c + C_c / n_c^2 (empty clusters excluded)."""
    safe = xp.where(sizes > 0, sizes, 1.0)
    dist = diag[:, None] - 2.0 * S / safe + within / (safe * safe)
    dist = xp.where(sizes > 0, dist, xp.inf)
    return xp.argmin(dist, axis=1).astype(xp.int32)


def plain_step(K, diag, labels, weights, k: int, xp) -> int:
    """One Lloyd iteration from fixed labels: statistics, assignment, number of points that move."""
    S, sizes, within, _ = plain_statistics(K, diag, labels, weights, k, xp)
    new_labels = plain_assign(S, diag, sizes, within, xp)
    return int((new_labels != labels).sum())


def plain_lloyd(K, labels, k: int, *, max_iter: int, tol: float, xp):
    """Lloyd iterations with kkmgpu's stopping rule (no point moves, or |dJ| <= tol |J|); no empty-cluster repair.

    Returns (labels, n_iter, objective, converged).
    """
    n = K.shape[0]
    weights = xp.ones(n, dtype=xp.float64)
    diag = xp.diagonal(K).astype(xp.float64)
    S, sizes, within, objective = plain_statistics(K, diag, labels, weights, k, xp)
    n_iter, converged = 0, False
    for n_iter in range(1, max_iter + 1):
        new_labels = plain_assign(S, diag, sizes, within, xp)
        if int((new_labels != labels).sum()) == 0:
            converged = True
            break
        labels = new_labels
        S, sizes, within, new_objective = plain_statistics(K, diag, labels, weights, k, xp)
        done = abs(objective - new_objective) <= tol * abs(objective)
        objective = new_objective
        if done:
            converged = True
            break
    return labels, n_iter, objective, converged


def plain_fit(X, k: int, *, seed: int, max_iter: int, tol: float, xp):
    """X (on the device) to host labels: gamma "scale", plain K, kkmgpu's init="random" partition, plain Lloyd."""
    from kkmgpu.engine.lloyd import random_partition

    n, d = X.shape
    gamma = 1.0 / (d * float(X.var(dtype=xp.float64)))
    K = plain_kernel_matrix(X, gamma, xp)
    labels0 = xp.asarray(random_partition(n, k, np.random.default_rng(seed)))
    labels, n_iter, objective, converged = plain_lloyd(K, labels0, k, max_iter=max_iter, tol=tol, xp=xp)
    del K
    return kb.to_host(labels).astype(np.int32), n_iter, objective, converged


# --------------------------------------------------------------------------------------------
# devices, memory, clocks


def _cupy():
    from kkmgpu.backend.device import import_cupy

    return import_cupy()


def _backend(device: str):
    from kkmgpu.backend.device import Backend

    if device == "cuda":
        return Backend("cuda", int(_cupy().cuda.runtime.getDevice()))
    return Backend("cpu")


def _free_pool(device: str) -> None:
    if device == "cuda":
        _cupy().get_default_memory_pool().free_all_blocks()


def _skip_unless_usable(engine: Engine, n: int) -> None:
    """Skip (with the reason) where the engine's device is not usable or not wanted at this n."""
    wanted = os.environ.get(kb.ENV_DEVICES, "").strip()
    if wanted and engine.device not in [name.strip().lower() for name in wanted.split(",")]:
        pytest.skip(f"{engine.name}: {kb.ENV_DEVICES}={wanted!r} leaves out {engine.device}")
    if engine.device == "cuda":
        reason = kb._cuda_unavailable_reason()
        if reason is not None:
            pytest.skip(f"{engine.name} needs a usable GPU: {reason}")
    elif n > CPU_MAX_N:
        pytest.skip(f"{engine.name} at n={n}: K would take {n * n * 4 / 1e9:.3g} GB (float32); the CPU runs "
                    f"n <= {ENV_CPU_MAX_N}={CPU_MAX_N}")


def _extra_bytes(problem) -> int:
    """Device memory besides K: X, its float64 centred copy, S and the n x k temporaries, slack."""
    return problem.n * problem.d * (4 + 8 + 4) + 8 * problem.n * N_CLUSTERS * 8 + 256 * 2**20


def _skip_unless_fits(device: str, nbytes: int, what: str) -> None:
    """Skip unless ``nbytes`` fit the free memory of ``device`` with kkmgpu's headroom."""
    from kkmgpu.backend.device import MEMORY_HEADROOM

    _free_pool(device)
    available = _backend(device).available_bytes()
    if available is not None and nbytes > MEMORY_HEADROOM * available:
        pytest.skip(f"{what} needs {nbytes / 2**30:.1f} GiB but {device} has {available / 2**30:.1f} GiB free "
                    f"(at most {MEMORY_HEADROOM:.0%} of it is used)")


def _to_device(device: str, a):
    if device == "cuda":
        out = _cupy().asarray(a)
        kb.synchronize("cuda")
        return out
    return a


class Clock:
    """Times ``fn()``: CUDA events on the GPU (work on the current stream between the two records, the
    device synchronised before the first), wall time always."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        if self.cuda:
            self._cp = _cupy()
            self._start, self._stop = self._cp.cuda.Event(), self._cp.cuda.Event()

    @property
    def name(self) -> str:
        return "CUDA events" if self.cuda else "time.perf_counter"

    def __call__(self, fn):
        """(seconds, wall seconds, fn's return); seconds = event time on the GPU, wall time on the CPU."""
        if not self.cuda:
            t0 = time.perf_counter()
            out = fn()
            wall = time.perf_counter() - t0
            return wall, wall, out
        self._cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        self._start.record()
        out = fn()
        self._stop.record()
        self._stop.synchronize()
        wall = time.perf_counter() - t0
        return self._cp.cuda.get_elapsed_time(self._start, self._stop) / 1e3, wall, out


def _best_of(clock: Clock, fn, repeats: int) -> float:
    fn()  # warm
    return min(clock(fn)[0] for _ in range(repeats))


def _rounds(benchmark, clock: Clock, fn, summarize, rounds: int, warmup_rounds: int = 1) -> list[dict]:
    """Run ``fn`` under pytest-benchmark; per timed round {seconds, wall, **summarize(fn's return)}.

    ``fn``'s return is summarised and dropped at once, so no round keeps device memory alive.
    """
    calls = []

    def timed():
        seconds, wall, out = clock(fn)
        record = {"seconds": seconds, "wall": wall, **summarize(out)}
        del out
        calls.append(record)

    benchmark.pedantic(timed, rounds=rounds, warmup_rounds=warmup_rounds, iterations=1)
    return calls[-rounds:]  # a disabled benchmark runs fn once, without warm-up


def _summary(values) -> dict:
    values = list(values)
    return {"best": min(values), "median": statistics.median(values), "rounds": len(values)}


def _quiet_fit(kkmgpu, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", getattr(kkmgpu, "ConvergenceWarning", Warning))
        return kkmgpu.fit(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# fixtures


@dataclass(frozen=True)
class Problem:
    n: int
    X: np.ndarray            # (n, 784) float32 in [0, 1]
    y: np.ndarray            # digits
    gamma: float             # "scale" on the sample, passed explicitly to the build and iteration cases
    init_labels: np.ndarray  # (n,) int32: kkmgpu's init="random" partition for random_state=SEED

    @property
    def d(self) -> int:
        return self.X.shape[1]

    @property
    def kernel_bytes(self) -> int:
        return self.n * self.n * np.dtype(DTYPE).itemsize

    def describe(self) -> dict:
        return {"n": self.n, "d": self.d, "k": N_CLUSTERS, "kernel": "rbf", "gamma": self.gamma,
                "gamma_rule": "scale = 1 / (n_features * X.var()) on the sample", "dtype": DTYPE,
                "data": ("MNIST train+test, all 70,000 points" if self.n == 70000 else
                         f"MNIST train+test, seeded uniform sample (seed {SEED})") + ", pixels / 255",
                "bytes_K": self.kernel_bytes}


@pytest.fixture(scope="module", params=SIZES, ids=lambda n: f"n{n}")
def n(request):
    return request.param


@pytest.fixture(scope="module")
def problem(mnist, n) -> Problem:
    from kkmgpu.engine.lloyd import random_partition

    X, y = mnist_sample(mnist, n, seed=SEED)
    gamma = 1.0 / (X.shape[1] * float(X.astype(np.float64).var()))
    labels = random_partition(n, N_CLUSTERS, np.random.default_rng(SEED))
    return Problem(n=n, X=X, y=y, gamma=gamma, init_labels=labels)


class KernelCache:
    """At most one K per device (built by ``kkmgpu.kernel_matrix``), shared by the iteration cases of one n."""

    def __init__(self):
        self._held: dict[str, tuple[int, object]] = {}

    def get(self, device: str, problem: Problem):
        held = self._held.get(device)
        if held is not None and held[0] == problem.n:
            return held[1]
        self.release(device)
        _skip_unless_fits(device, problem.kernel_bytes + _extra_bytes(problem),
                          f"the {problem.n} x {problem.n} float32 K on {device}")
        import kkmgpu

        X = _to_device(device, problem.X)
        K = kkmgpu.kernel_matrix(X, kernel="rbf", gamma=problem.gamma, device=device, dtype=DTYPE)
        del X
        kb.synchronize(device)
        self._held[device] = (problem.n, K)
        return K

    def release(self, device: str | None = None) -> None:
        for name in [device] if device else list(self._held):
            if self._held.pop(name, None) is not None:
                _free_pool(name)


@pytest.fixture(scope="module")
def kernels():
    cache = KernelCache()
    yield cache
    cache.release()


def _case(engine: Engine, measure: str, problem: Problem, machine: ForeignCpu, clock: Clock, **fields) -> dict:
    return {"benchmark": f"{engine.prefix}_{measure}", "measure": measure, "implementation": engine.implementation,
            "engine": engine.name, **problem.describe(), "device": engine.device,
            "cpu_use_during_case": machine.seconds(), "clock": clock.name, **fields}


# --------------------------------------------------------------------------------------------
# the cases; in each n the build cases run first (nothing held), then the cases on a shared K, then the
# end-to-end fits (K released first)


@engines
def test_kernel_build(benchmark, engine, problem, floors, recorder, kernels):
    """K from X on the device: kkmgpu.kernel_matrix (GEMM + fused epilogue) or the plain CuPy ops."""
    _skip_unless_usable(engine, problem.n)
    kernels.release()
    _skip_unless_fits(engine.device, problem.kernel_bytes + _extra_bytes(problem),
                      f"the {problem.n} x {problem.n} float32 K on {engine.device}")
    import kkmgpu

    machine = ForeignCpu()
    X = _to_device(engine.device, problem.X)
    if engine.is_kkmgpu:
        def build():
            return kkmgpu.kernel_matrix(X, kernel="rbf", gamma=problem.gamma, device=engine.device, dtype=DTYPE)
        call = f"kkmgpu.kernel_matrix(X, kernel='rbf', gamma=g, device={engine.device!r}, dtype='float32')"
    else:
        cp = _cupy()

        def build():
            return plain_kernel_matrix(X, problem.gamma, cp)
        call = "plain_kernel_matrix(X, g, cupy): sq norms, X @ X.T, in-place scale/shift, cupy.maximum, cupy.exp"

    clock = Clock(engine.device)
    rounds = _rounds(benchmark, clock, build, lambda K: {"shape": tuple(K.shape)},
                     rounds=max(2, ROUNDS // 2))
    assert rounds[-1]["shape"] == (problem.n, problem.n)
    del X
    _free_pool(engine.device)
    floors.bandwidths(engine.device)  # measured now (nothing held); again and floors derived when the run ends
    floors.gemm_rate(engine.device, problem.n, problem.d)
    recorder.add(engine.device, _case(
        engine, "kernel_build", problem, machine, clock, call=call,
        time_s={**_summary(r["seconds"] for r in rounds),
                "wall_best": min(r["wall"] for r in rounds),
                "wall_median": statistics.median(r["wall"] for r in rounds)},
        note="X is on the device before the clock starts; each call allocates a fresh K (from CuPy's memory "
             "pool after the warm-up round on the GPU; first-touched inside the call on the CPU)"))


def _same_kernel_gemv_seconds(K, device: str) -> float:
    """Best time of K @ ones (float32 gemv with NumPy's BLAS or cuBLAS): one read of this K by the vendor library."""
    xp = _cupy() if device == "cuda" else np
    v = xp.ones(K.shape[1], dtype=K.dtype)
    return _best_of(Clock(device), lambda: K @ v, 10)


@engines
def test_iteration(benchmark, engine, problem, floors, recorder, kernels):
    """One full dense iteration from fixed labels on a K held on the device: cluster sums, totals, assignment."""
    _skip_unless_usable(engine, problem.n)
    K = kernels.get(engine.device, problem)
    machine = ForeignCpu()
    backend = _backend(engine.device)
    xp = backend.xp
    k = N_CLUSTERS
    labels = backend.asarray(problem.init_labels, dtype=np.int32)
    weights = backend.asarray(np.ones(problem.n, dtype=np.float64))
    clock = Clock(engine.device)
    if engine.is_kkmgpu:
        from kkmgpu.engine.dense import DenseKernelOperator
        from kkmgpu.engine.lloyd import _totals

        op = DenseKernelOperator(K, weights, backend)
        ops = backend.ops

        def step():
            S = op.cluster_sums(labels, k)
            sizes, within, objective = _totals(op, S, labels, k, xp)
            new_labels, _, n_changed = ops.assign_labels(S, op.diag, sizes, within, labels)
            return n_changed

        S0 = op.cluster_sums(labels, k)
        sizes0, within0, objective0 = _totals(op, S0, labels, k, xp)
        parts = {
            "cluster_sums": _best_of(clock, lambda: op.cluster_sums(labels, k), PARTS_REPEATS),
            "totals": _best_of(clock, lambda: _totals(op, S0, labels, k, xp), PARTS_REPEATS),
            "assign_labels": _best_of(clock, lambda: ops.assign_labels(S0, op.diag, sizes0, within0, labels),
                                      PARTS_REPEATS),
        }
        call = ("op.cluster_sums(labels, k); _lloyd._totals(op, S, labels, k, xp); "
                "backend.ops.assign_labels(S, op.diag, sizes, within, labels)  (op = kkmgpu.engine.dense.DenseKernelOperator)")
    else:
        diag = xp.diagonal(K).astype(xp.float64)

        def step():
            return plain_step(K, diag, labels, weights, k, xp)

        S0, sizes0, within0, objective0 = plain_statistics(K, diag, labels, weights, k, xp)
        parts = {
            "cluster_sums": _best_of(clock, lambda: plain_cluster_sums(K, labels, weights, k), PARTS_REPEATS),
            "totals": _best_of(clock, lambda: plain_totals(S0, diag, labels, k, xp), PARTS_REPEATS),
            "assign_labels": _best_of(clock, lambda: int((plain_assign(S0, diag, sizes0, within0, xp)
                                                          != labels).sum()), PARTS_REPEATS),
        }
        call = ("S = K @ one-hot (_gpu_kernels.indicator_cluster_sums); sizes, totals (bincount); "
                "distances, argmin, moved count (plain_step)")
    rounds = _rounds(benchmark, clock, step, lambda moved: {"moved": int(moved)}, rounds=ITERATION_ROUNDS)
    del S0
    gemv = _same_kernel_gemv_seconds(K, engine.device)
    floors.bandwidths(engine.device)
    recorder.add(engine.device, _case(
        engine, "iteration", problem, machine, clock, call=call,
        init=f"fixed labels: kkmgpu's init='random' partition (seed {SEED})",
        moved=rounds[-1]["moved"], objective=float(objective0),
        time_s={**_summary(r["seconds"] for r in rounds),
                "wall_best": min(r["wall"] for r in rounds),
                "wall_median": statistics.median(r["wall"] for r in rounds),
                "parts_best": parts, "same_K_gemv": gemv},
        definition=("one Lloyd iteration with the labels held fixed: the cluster sums (one read of K), the sizes, "
                    "within-cluster totals and objective, the fused distance + argmin + moved count, host round "
                    "trips included; time_s.parts_best times each step alone; floor = bytes(K) / copy bandwidth")))


@engines
def test_fit_iterations(benchmark, engine, problem, floors, recorder, kernels):
    """20 full-pass Lloyd iterations from fixed labels on the held K; per iteration."""
    _skip_unless_usable(engine, problem.n)
    K = kernels.get(engine.device, problem)
    machine = ForeignCpu()
    clock = Clock(engine.device)
    if engine.is_kkmgpu:
        import kkmgpu

        def lloyd():
            return _quiet_fit(kkmgpu, K, N_CLUSTERS, kernel="precomputed", init=problem.init_labels,
                              update="full", max_iter=MAX_ITER, tol=0, device=engine.device, dtype=DTYPE)

        def summarize(result):
            return {"n_iter": int(result.n_iter), "objective": float(result.objective),
                    "converged": bool(result.converged), "timings": dict(result.timings),
                    "per_iteration": result.timings["iterations"] / max(int(result.n_iter), 1)}
        call = (f"kkmgpu.fit(K, 10, kernel='precomputed', init=labels, update='full', max_iter={MAX_ITER}, "
                f"tol=0, device={engine.device!r}, dtype='float32')")
        definition = ("per_iteration = result.timings['iterations'] / result.n_iter (the library's own timer: "
                      "the initial cluster sums, then per iteration assignment, empty-cluster check, cluster sums, "
                      "totals); floor = bytes(K) / copy bandwidth")
    else:
        xp = _backend(engine.device).xp
        labels0 = xp.asarray(problem.init_labels)

        def lloyd():
            return plain_lloyd(K, labels0, N_CLUSTERS, max_iter=MAX_ITER, tol=0.0, xp=xp)

        def summarize(out):
            return {"n_iter": int(out[1]), "objective": float(out[2]), "converged": bool(out[3]), "timings": None}
        call = f"plain_lloyd(K, labels, 10, max_iter={MAX_ITER}, tol=0, xp=cupy)"
        definition = ("per_iteration = time of the plain_lloyd call (clock below) / n_iter (it also starts with "
                      "the initial cluster sums); floor = bytes(K) / copy bandwidth")

    rounds = _rounds(benchmark, clock, lloyd, summarize, rounds=ROUNDS)
    for r in rounds:
        r.setdefault("per_iteration", r["seconds"] / max(r["n_iter"], 1))
    assert all(r["n_iter"] >= 1 and np.isfinite(r["objective"]) for r in rounds)
    best = min(rounds, key=lambda r: r["per_iteration"])
    per_iteration = _summary(r["per_iteration"] for r in rounds)
    floors.bandwidths(engine.device)
    recorder.add(engine.device, _case(
        engine, "fit_iterations", problem, machine, clock, call=call, definition=definition,
        max_iter=MAX_ITER, tol=0, update="full" if engine.is_kkmgpu else "full (K @ one-hot every iteration)",
        init=f"fixed labels: kkmgpu's init='random' partition (seed {SEED})",
        n_iter=best["n_iter"], converged=best["converged"], objective=best["objective"],
        time_s={"per_iteration_best": per_iteration["best"], "per_iteration_median": per_iteration["median"],
                "call_best": min(r["seconds"] for r in rounds), "wall_best": min(r["wall"] for r in rounds),
                "rounds": len(rounds)},
        timings_best_round=best["timings"]))


@engines
def test_fit_end_to_end(benchmark, engine, problem, floors, recorder, kernels):
    """X on the device to labels on the host, after a warm-up fit (init='random', n_init=1, max_iter=300)."""
    _skip_unless_usable(engine, problem.n)
    kernels.release()
    _skip_unless_fits(engine.device, problem.kernel_bytes + _extra_bytes(problem),
                      f"the end-to-end fit at n={problem.n} (its {problem.n} x {problem.n} float32 K)")
    import kkmgpu

    machine = ForeignCpu()
    X = _to_device(engine.device, problem.X)
    clock = Clock(engine.device)
    if engine.is_kkmgpu:
        def fit():
            return _quiet_fit(kkmgpu, X, N_CLUSTERS, kernel="rbf", init="random", random_state=SEED, n_init=1,
                              max_iter=E2E_MAX_ITER, tol=E2E_TOL, device=engine.device, dtype=DTYPE)

        def summarize(result):
            return {"labels": np.asarray(result.labels), "n_iter": int(result.n_iter),
                    "objective": float(result.objective), "converged": bool(result.converged),
                    "timings": dict(result.timings)}
        call = (f"kkmgpu.fit(X, 10, kernel='rbf', init='random', random_state={SEED}, n_init=1, "
                f"max_iter={E2E_MAX_ITER}, tol={E2E_TOL:g}, device={engine.device!r}, dtype='float32') "
                "(gamma='scale', update='auto')")
    else:
        cp = _cupy()

        def fit():
            return plain_fit(X, N_CLUSTERS, seed=SEED, max_iter=E2E_MAX_ITER, tol=E2E_TOL, xp=cp)

        def summarize(out):
            return {"labels": out[0], "n_iter": int(out[1]), "objective": float(out[2]),
                    "converged": bool(out[3]), "timings": None}
        call = (f"plain_fit(X, 10, seed={SEED}, max_iter={E2E_MAX_ITER}, tol={E2E_TOL:g}, xp=cupy): gamma 'scale', "
                "plain_kernel_matrix, kkmgpu's init='random' partition, plain_lloyd, labels to the host")

    rounds = _rounds(benchmark, clock, fit, summarize, rounds=max(2, ROUNDS // 2))
    del X
    _free_pool(engine.device)
    best = min(rounds, key=lambda r: r["wall"])
    from kkmgpu.metrics import nmi

    floors.bandwidths(engine.device)
    recorder.add(engine.device, _case(
        engine, "fit_end_to_end", problem, machine, clock, call=call,
        max_iter=E2E_MAX_ITER, tol=E2E_TOL, init=f"random partition (kkmgpu init='random', random_state={SEED})",
        n_iter=best["n_iter"], n_iter_rounds=[r["n_iter"] for r in rounds], converged=best["converged"],
        objective=best["objective"], nmi_vs_digits=float(nmi(problem.y, best["labels"])),
        seconds=best["wall"],
        time_s={**_summary(r["wall"] for r in rounds), "clock_best": min(r["seconds"] for r in rounds)},
        timings_best_round=best["timings"],
        definition=("time = wall time from X on the device to labels on the host (device synchronised), after "
                    "a warm-up fit; time_s.clock_best is the clock below (CUDA events on the GPU); floor = kernel "
                    "build floor + n_iter x full-pass floor (an upper bound of the work: update='auto' reads only "
                    "the moved rows of K once few points move)")))


# --------------------------------------------------------------------------------------------
# floors, ratios, speed-ups, terminal lines and targets (hooked into _kkmgpu_bench, run when the run ends)


def _floors_of(case: dict, floors, device: str) -> dict:
    bandwidths = floors.bandwidths(device)
    n, d, bytes_k = case["n"], case["d"], case["bytes_K"]
    out = {"iteration": bytes_k / bandwidths["copy_bandwidth_Bps"], "copy_bandwidth_Bps":
           bandwidths["copy_bandwidth_Bps"], "write_bandwidth_Bps": bandwidths["write_bandwidth_Bps"]}
    if case["measure"] in ("kernel_build", "fit_end_to_end"):
        gemm_rate = floors.gemm_rate(device, n, d)
        out["gemm_float32_flops"] = gemm_rate
        out["gemm"] = 2.0 * n * n * d / gemm_rate
        out["write"] = bytes_k / bandwidths["write_bandwidth_Bps"]
        out["build"] = max(out["gemm"], out["write"])
    return out


def derive_engine_floors(case: dict, floors, device: str) -> None:
    """Floors and ratios of one engine case (in place); see bench/README.md, "The GPU engine run"."""
    f = _floors_of(case, floors, device)
    times, measure = case["time_s"], case["measure"]
    if measure == "kernel_build":
        case["floor_s"] = f["build"]
        case["floor_parts_s"] = {"gemm": f["gemm"], "write": f["write"]}
        case["floor_inputs"] = {"gemm_float32_flops": f["gemm_float32_flops"],
                                "flops": 2.0 * case["n"] ** 2 * case["d"],
                                "write_bandwidth_Bps": f["write_bandwidth_Bps"]}
        case["ratio"] = times["best"] / f["build"]
        case["ratio_median"] = times["median"] / f["build"]
    elif measure in ("iteration", "fit_iterations"):
        best, median = (("best", "median") if measure == "iteration"
                        else ("per_iteration_best", "per_iteration_median"))
        case["floor_s"] = f["iteration"]
        case["floor_inputs"] = {"bytes_K": case["bytes_K"], "copy_bandwidth_Bps": f["copy_bandwidth_Bps"]}
        case["ratio"] = times[best] / f["iteration"]
        case["ratio_median"] = times[median] / f["iteration"]
        if times.get("same_K_gemv"):
            case["ratio_to_same_K_gemv"] = times[best] / times["same_K_gemv"]
        if times.get("parts_best"):
            case["parts_ratio"] = {part: seconds / f["iteration"] for part, seconds in times["parts_best"].items()}
    elif measure == "fit_end_to_end":
        floor = f["build"] + case["n_iter"] * f["iteration"]
        case["floor_s"] = floor
        case["floor_parts_s"] = {"kernel_build": f["build"], "iterations": case["n_iter"] * f["iteration"]}
        case["ratio"] = times["best"] / floor
        case["ratio_median"] = times["median"] / floor


def _engine_cases(recorder) -> list[dict]:
    return [case for device in ("cuda", "cpu") for case in recorder.cases.get(device, [])
            if case["benchmark"] in BENCHMARKS]


def derive_speedups(recorder) -> None:
    """On every GPU case: speed-up over the plain CuPy case and over the CPU case of the same measure and n,
    all of this run (``speedup_vs_plain_cupy``, ``speedup_vs_cpu``, ``compared_with``)."""
    cases = _engine_cases(recorder)
    index = {(c["device"], c["implementation"], c["measure"], c["n"]): c for c in cases}
    for case in cases:
        if case["device"] != "cuda":
            continue
        key = TIME_KEY[case["measure"]]
        mine = case["time_s"][key]
        compared = {}
        for label, other_key in (("plain_cupy", ("cuda", "plain-cupy")), ("cpu", ("cpu", "kkmgpu"))):
            other = index.get((*other_key, case["measure"], case["n"]))
            if other is None or other is case:
                continue
            theirs = other["time_s"][key]
            compared[label] = {"id": other["id"], "device": other["device"], "implementation": other["implementation"],
                               "time_s": theirs, "n_iter": other.get("n_iter"), "speedup": theirs / mine}
            case[f"speedup_vs_{label}"] = theirs / mine
        case["compared_with"] = compared
        case["speedup_time"] = f"time_s.{key}"


def _ms(seconds) -> str:
    return f"{'-':>9}" if seconds is None else f"{seconds * 1e3:9.2f}"


def _x(value) -> str:
    return f"{'-':>7}" if value is None else f"{value:7.2f}"


def summary(recorder) -> list[str]:
    cases = _engine_cases(recorder)
    if not cases:
        return []
    by_row: dict[tuple, dict] = {}
    for case in cases:
        by_row.setdefault((case["engine"], case["n"]), {})[case["measure"]] = case
    order = {engine.name: i for i, engine in enumerate(ENGINES)}
    lines = ["GPU engine (bench_gpu_engine.py): times in ms, ratio = time / floor of this run; "
             "x plain / x cpu = speed-up of the GPU row over plain CuPy / the CPU (iteration, end-to-end)",
             f"{'engine':>11} {'n':>6} {'build':>9} {'ratio':>7} {'iter':>9} {'ratio':>7} {'fit/iter':>9} "
             f"{'ratio':>7} {'e2e':>9} {'n_iter':>6} {'x plain':>7} {'x cpu':>7} {'x plain':>7} {'x cpu':>7}"]
    for engine_name, n in sorted(by_row, key=lambda key: (key[1], order.get(key[0], 99))):
        row = by_row[(engine_name, n)]
        kbld, it, fi, e2e = (row.get(m) for m in ("kernel_build", "iteration", "fit_iterations", "fit_end_to_end"))
        lines.append(" ".join([
            f"{engine_name:>11}", f"{n:>6}",
            _ms(kbld and kbld["time_s"]["best"]), _x(kbld and kbld.get("ratio")),
            _ms(it and it["time_s"]["best"]), _x(it and it.get("ratio")),
            _ms(fi and fi["time_s"]["per_iteration_best"]), _x(fi and fi.get("ratio")),
            _ms(e2e and e2e["time_s"]["best"]), f"{e2e['n_iter'] if e2e else '-':>6}",
            _x(it and it.get("speedup_vs_plain_cupy")), _x(it and it.get("speedup_vs_cpu")),
            _x(e2e and e2e.get("speedup_vs_plain_cupy")), _x(e2e and e2e.get("speedup_vs_cpu")),
        ]))
    lines.append(f"targets (GPU, kkmgpu): build ratio <= 1.5, iteration ratio <= 1.25, end-to-end at "
                 f"n={E2E_TARGET_N} < {E2E_TARGET_S * 1e3:.0f} ms (the result file's 'targets')")
    return lines


def _targets() -> list[dict]:
    stated = "an NVIDIA H100 / H200 GPU (the GPU engine issue)"
    out = []
    for n in SIZES:
        out.append({"target": f"kernel build within 1.5x of max(GEMM, write) floor at n = {n}",
                    "case": f"engine_kernel_build-n{n}", "quantity": "ratio", "rule": "<=", "limit": 1.5,
                    "stated_for": stated, "device_kind": "cuda"})
        out.append({"target": f"one full dense iteration (direct) within 1.25x of the memory floor at n = {n}",
                    "case": f"engine_iteration-n{n}", "quantity": "ratio", "rule": "<=", "limit": 1.25,
                    "stated_for": stated, "device_kind": "cuda"})
        out.append({"target": f"per-iteration time of fit(update='full') within 1.25x of the memory floor at n = {n}",
                    "case": f"engine_fit_iterations-n{n}", "quantity": "ratio", "rule": "<=", "limit": 1.25,
                    "stated_for": stated, "device_kind": "cuda"})
    out.append({"target": f"end-to-end exact fit on MNIST (n = {E2E_TARGET_N}) from X on the device to labels "
                          f"under {E2E_TARGET_S:g} s (CATS paper: 1,854 s on a CPU)",
                "case": f"engine_fit_end_to_end-n{E2E_TARGET_N}", "quantity": "seconds", "rule": "<",
                "limit": E2E_TARGET_S, "stated_for": stated, "device_kind": "cuda"})
    return out


register_extension(
    "gpu_engine",
    floor_derivers={name: derive_engine_floors for name in BENCHMARKS},
    run_deriver=derive_speedups,
    summary=summary,
    targets=_targets(),
)
