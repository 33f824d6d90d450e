"""The measurements of ``bash bench/gpu_session.sh quick`` (and ``targets``), one part per process.

Each part runs in its own process under its own time limit (gpu_session.sh gives it one) and writes
``<work>/<part>.json`` after every case, so a part cut off by its limit keeps what it measured; ``collect`` then
merges the parts, the test groups' JUnit files and the steps' times into ONE result file. From the repository
root::

    python bench/bench_quick.py engine      # MNIST-70k exact: end to end cold and warm, build, one full and one
                                            # incremental iteration (0.1%, 1%, 10% moved), plain CuPy beside
    python bench/bench_quick.py tiled       # tiled engine at 200,000 points: one full pass vs the GEMM floor of
                                            # its precision mode, plain CuPy's tiled pass; labels vs dense at 20k
    python bench/bench_quick.py cats        # CATS at 1,000,000 points, l = 32: ms per iteration vs its GEMM floor
    python bench/bench_quick.py ncut        # fit(objective="ncut") end to end on MNIST-70k
    python bench/bench_quick.py tiled-1m    # (phase targets) one tiled pass at 1,000,000 points
    python bench/bench_quick.py ncut-1m     # (phase targets) fit(objective="ncut") at 1,000,000 points
    python bench/bench_quick.py approx-1m   # (phase targets) fit(method="approx", n_landmarks=2000) at 1,000,000
    python bench/bench_quick.py collect --phase quick --dest DIR   # the one JSON (and its summary table)

``--work DIR`` (default ``$KKMGPU_QUICK_WORK``, else /tmp/kkmgpu-quick) holds the parts' files. ``--smoke``
scales every size down (n of a few thousand) so that the whole chain runs in minutes on a CPU; with
``--emulate`` the CUDA path runs on the CuPy stand-in of tests/standin (the real kernels_cuda/*.cu compiled for
the CPU): a check of the code path, never a speed. Smoke results are named ``...-quick-smoke`` and belong
outside bench/results/.

Protocol. Device "cuda", float32, RBF with gamma "scale", k = 10. MNIST is train + test, pixels / 255; above
70,000 points (and for the smoke run's repeats) it is repeated, copy j > 0 of row i plus row (i + 7919 j) mod 8192
of one seeded N(0, 0.02^2) noise block, assembled on the device (the host draws 6.4 million numbers, not 784
million; the copies of a row never share a noise row). GPU times are CUDA-event times where one call is timed, wall times (device synchronised) for
end-to-end fits. Floors are measured in the same process: copy and write bandwidth (bench/_kkmgpu_bench.Floors),
and the GEMM of each precision mode on the case's own shapes (``_kkmgpu_bench.gemm_mode_seconds``: the operands
prepared outside the clock, the one cuBLAS call inside). Where ``fit`` takes ``gemm_precision`` the default mode
is measured first and "fp32" beside it; a case's ``gemm_precision`` names the mode it ran. Nothing is asserted:
every case records its seconds, floor and ratio, and ``collect`` states which of the issue's targets were met.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
STANDIN_DIR = REPO_ROOT / "tests" / "standin"
SCHEMA = "kkmgpu-bench-quick/1"
K = 10
JITTER = 0.02
NOISE_ROWS = 8192  # a power of two: 7919 j mod 8192 never repeats for j < 8192 (the copies of a row differ)
NOISE_STRIDE = 7919

FULL = dict(engine_n=70_000, labels_n=20_000, tiled_n=200_000, cats_n=1_000_000, cats_l=32, ncut_n=70_000,
            tiled_big_n=1_000_000, ncut_big_n=1_000_000, approx_n=1_000_000, approx_m=2000, base_rows=70_000,
            repeats=3, iteration_repeats=10, copy_bytes=None)
SMOKE = dict(engine_n=1500, labels_n=800, tiled_n=2000, cats_n=6000, cats_l=32, ncut_n=1200,
             tiled_big_n=2500, ncut_big_n=2500, approx_n=6000, approx_m=100, base_rows=1000,
             repeats=1, iteration_repeats=2, copy_bytes=32 * 2**20)

#: the issue's targets (point 7), with the case and quantity each is read from, and the phase that measures it
TARGETS = [
    ("MNIST-70k exact end to end, warm", "engine-e2e-warm-default", "seconds", "<=", 0.25, "quick"),
    ("kernel build / GEMM floor of its precision mode", "engine-build-default", "ratio", "<=", 1.3, "quick"),
    ("one full dense iteration / memory floor", "engine-iteration-full", "ratio", "<=", 1.15, "quick"),
    ("tiled iteration at 1,000,000 points (seconds)", "tiled-pass-1m-default", "seconds", "<=", 12.0,
     "targets"),
    ("tiled labels equal to dense at 20k (fraction)", "tiled-labels-default", "fraction_equal", ">=", 1.0, "quick"),
    ("CATS at 1,000,000, l = 32 (seconds per iteration)", "cats-1m-default", "seconds", "<=", 0.030, "quick"),
    ('objective="ncut" on MNIST-70k (seconds)', "ncut-70k", "seconds", "<=", 2.0, "quick"),
    ('objective="ncut" at 1,000,000 (seconds)', "ncut-1m", "seconds", "<=", 60.0, "targets"),
    ("approx at 1,000,000, m = 2000 (seconds)", "approx-1m-m2000-default", "seconds", "<=", 5.0, "targets"),
]


# ------------------------------------------------------------------------------------------ the part's file


class Part:
    """One part's cases, rewritten to ``<work>/<name>.json`` after every case (a part cut off keeps them)."""

    def __init__(self, name, work, smoke, emulated):
        self.name, self.path = name, Path(work) / f"{name}.json"
        self.doc = {"part": name, "smoke": smoke, "emulated": emulated, "cases": [], "errors": [],
                    "started": _now(), "finished": None}
        self.t0 = time.perf_counter()
        self.write()

    def add(self, case):
        self.doc["cases"].append(case)
        print(f"[{self.name}] " + json.dumps(_brief(case), default=_json), flush=True)
        self.write()
        return case

    def attempt(self, where, fn):
        """``fn()``, an exception recorded (and the part going on) instead of raised."""
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - recorded in the part's file; collect reports it
            self.error(where, exc)
            return None

    def error(self, where, exc):
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        self.doc["errors"].append({"where": where, "error": text})
        print(f"[{self.name}] {where} FAILED: {text}", flush=True)
        traceback.print_exc()
        self.write()

    def write(self, finished=False):
        if finished:
            self.doc["finished"] = _now()
            self.doc["seconds"] = time.perf_counter() - self.t0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, default=_json) + "\n")
        tmp.replace(self.path)


def _now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _json(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def _brief(case):
    return {k: v for k, v in case.items() if not isinstance(v, (dict, list))}


# ------------------------------------------------------------------------------------------ context


class Ctx:
    """What every part uses: the backend, sizes, clocks, floors, the precision modes to measure."""

    def __init__(self, args):
        import kkmgpu
        from kkmgpu.backend import device as _backend
        import _kkmgpu_bench as kb

        self.kkmgpu, self.kb, self.args = kkmgpu, kb, args
        self.sizes = SMOKE if args.smoke else FULL
        reason = _backend.cuda_unavailable_reason()
        if reason is not None:
            raise SystemExit(f"bench_quick needs the CUDA backend (a GPU, or --emulate): {reason}")
        self.backend = _backend.resolve_device("cuda")
        self.xp = self.backend.xp
        self.cp = _backend.import_cupy()
        self.floors = kb.Floors(copy_bytes=self.sizes["copy_bytes"])
        params = inspect.signature(kkmgpu.fit).parameters
        self.has_modes = "gemm_precision" in params
        try:
            from kkmgpu.kernels import gemm as _gemm
            self.default_mode = _gemm.DEFAULT_PRECISION if self.has_modes else "fp32"
        except ImportError:
            self.default_mode = "fp32"
        # (label, mode to pass or None for the library's default, the mode that runs)
        self.modes = [("default", None, self.default_mode)]
        if self.has_modes and self.default_mode != "fp32" and not args.default_mode_only:
            self.modes.append(("fp32", "fp32", "fp32"))

    def mode_kw(self, mode, fn=None):
        """``gemm_precision=mode`` where ``fn`` (default: fit) takes it and a mode is named."""
        fn = fn or self.kkmgpu.fit
        if mode is None or "gemm_precision" not in inspect.signature(fn).parameters:
            return {}
        return {"gemm_precision": mode}

    def sync(self):
        self.cp.cuda.Device().synchronize()

    def wall(self, fn):
        """(seconds, result) of ``fn()`` by the host clock, the device synchronised before and after."""
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - t0, out

    def event(self, fn):
        """(seconds, result) of ``fn()`` between two CUDA events."""
        start, stop = self.cp.cuda.Event(), self.cp.cuda.Event()
        self.sync()
        start.record()
        out = fn()
        stop.record()
        stop.synchronize()
        return self.cp.cuda.get_elapsed_time(start, stop) / 1e3, out

    def best(self, fn, repeats, warm=True):
        if warm:
            fn()
        times = [self.event(fn)[0] for _ in range(repeats)]
        return min(times), statistics.median(times)

    def free(self):
        self.sync()
        self.cp.get_default_memory_pool().free_all_blocks()

    def fit(self, *args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", self.kkmgpu.ConvergenceWarning)
            return self.kkmgpu.fit(*args, device="cuda", **kwargs)

    def mnist(self, n, seed=0):
        """(X host float32, y) of n MNIST points: all 70,000 at n = 70,000, else a seeded sample."""
        from kkmgpu import datasets

        X, y = datasets.load_mnist(n_samples=None if n >= 70_000 else n, random_state=seed)
        return np.ascontiguousarray(X, dtype=np.float32), np.asarray(y)

    def features(self, n, seed=0):
        """(n, 784) float32 on the device: MNIST, repeated with noise above ``base_rows`` (the protocol)."""
        xp = self.xp
        base = self.sizes["base_rows"]
        X, _ = self.mnist(min(n, base), seed)
        Xd = xp.asarray(X)
        if n <= X.shape[0]:
            return Xd
        noise = np.random.default_rng(seed).standard_normal((NOISE_ROWS, X.shape[1]), dtype=np.float32)
        noise = xp.asarray(noise * np.float32(JITTER))
        out = xp.empty((n, X.shape[1]), dtype=xp.float32)
        rows = xp.arange(X.shape[0])
        for j, i0 in enumerate(range(0, n, X.shape[0])):
            m = min(X.shape[0], n - i0)
            out[i0:i0 + m] = Xd[:m]
            if j > 0:
                out[i0:i0 + m] += noise[(rows[:m] + NOISE_STRIDE * j) % NOISE_ROWS]
        del Xd, noise
        return out

    def describe(self):
        return {"device": "cuda", "dtype": "float32", "kernel": "rbf", "k": K}


def _ratio(seconds, floor):
    return None if seconds is None or not floor else seconds / floor


def _partition(n, seed=0):
    from kkmgpu.engine.lloyd import random_partition

    return random_partition(n, K, np.random.default_rng(seed))


# ------------------------------------------------------------------------------------------ engine (70k)


def part_engine(ctx, part):
    import bench_gpu_engine as plain

    n = ctx.sizes["engine_n"]
    X, y = ctx.mnist(n)
    d = X.shape[1]
    base = {**ctx.describe(), "n": n, "d": d, "data": "MNIST train+test, pixels / 255"}
    e2e = dict(kernel="rbf", init="random", random_state=0, n_init=1, max_iter=300, tol=1e-6, dtype="float32")
    # cold: the first CUDA work of this process, from X on the host (gpu_session.sh gives the process an empty
    # CuPy kernel cache, so the CUDA context, the compiles, cuBLAS's handle and the pool's growth all count)
    t0 = time.perf_counter()
    r = ctx.fit(X, K, **e2e)
    labels = ctx.backend.to_host(r.labels)
    seconds = time.perf_counter() - t0
    part.add({**base, "id": "engine-e2e-cold", "what": "end to end, the first fit of a fresh process, X on the host "
              "(CUDA context and compiles included)", "gemm_precision": ctx.default_mode, "seconds": seconds,
              "n_iter": int(r.n_iter), "labels_shape": list(labels.shape),
              "cupy_cache_dir": os.environ.get("CUPY_CACHE_DIR"), "timings": dict(r.timings)})
    del r
    Xd = ctx.xp.asarray(X)
    bw = ctx.floors.bandwidths("cuda")
    floors = {"iteration": n * n * 4 / bw["copy_bandwidth_Bps"], "write": n * n * 4 / bw["write_bandwidth_Bps"]}
    for _, _, runs in ctx.modes:
        floors[runs] = ctx.kb.gemm_mode_seconds(ctx.backend, Xd, Xd, runs, repeats=3)
        ctx.free()
    part.attempt("end to end", lambda: e2e_cases(ctx, part, Xd, y, base, e2e, floors, plain))
    ctx.free()
    gamma = 1.0 / (d * float(X.astype(np.float64).var()))
    part.attempt("build", lambda: build_cases(ctx, part, Xd, gamma, base, floors, plain))
    ctx.free()
    # one iteration on a K held on the device: full, then incremental after 0.1%, 1%, 10% of the points moved
    Kd = ctx.kkmgpu.kernel_matrix(Xd, kernel="rbf", gamma=gamma, device="cuda", dtype="float32")
    del Xd
    part.attempt("iterations", lambda: iteration_cases(ctx, part, Kd, base, plain))
    del Kd
    ctx.free()


def e2e_cases(ctx, part, Xd, y, base, e2e, floors, plain):
    from kkmgpu.metrics import nmi

    for label, mode, runs in ctx.modes:
        walls, result = [], None
        for _ in range(ctx.sizes["repeats"]):
            seconds, result = ctx.wall(lambda: ctx.fit(Xd, K, **e2e, **ctx.mode_kw(mode)))
            walls.append(seconds)
        floor = max(floors[runs], floors["write"]) + result.n_iter * floors["iteration"]
        part.add({**base, "id": f"engine-e2e-warm-{label}", "what": "end to end (X on the device to labels on the "
                  "host), warm", "gemm_precision": runs, "seconds": min(walls), "median_s": statistics.median(walls),
                  "n_iter": int(result.n_iter), "nmi_vs_digits": float(nmi(y, ctx.backend.to_host(result.labels))),
                  "floor_s": floor, "floor_rule": "build floor + n_iter full-iteration floors (an upper bound of "
                  "the work)", "ratio": _ratio(min(walls), floor), "timings": dict(result.timings)})
        del result
    plain_fit = lambda: plain.plain_fit(Xd, K, seed=0, max_iter=300, tol=1e-6, xp=ctx.cp)  # noqa: E731
    ctx.wall(plain_fit)
    seconds, out = ctx.wall(plain_fit)
    part.add({**base, "id": "plain-cupy-e2e", "what": "plain CuPy end to end (bench_gpu_engine.plain_fit), warm",
              "gemm_precision": "fp32", "seconds": seconds, "n_iter": int(out[1])})
    _speedup(part, "engine-e2e-warm-default", seconds)


def build_cases(ctx, part, Xd, gamma, base, floors, plain):
    for label, mode, runs in ctx.modes:
        kw = dict(kernel="rbf", gamma=gamma, device="cuda", dtype="float32",
                  **ctx.mode_kw(mode, ctx.kkmgpu.kernel_matrix))

        def build():
            return ctx.kkmgpu.kernel_matrix(Xd, **kw)
        best, median = ctx.best(build, ctx.sizes["repeats"])
        ctx.free()
        floor = max(floors[runs], floors["write"])
        part.add({**base, "id": f"engine-build-{label}", "what": "kernel_matrix(X) on the device",
                  "gemm_precision": runs, "seconds": best, "median_s": median, "floor_s": floor,
                  "floor_parts_s": {"gemm": floors[runs], "write": floors["write"]}, "ratio": _ratio(best, floor)})
    best, _ = ctx.best(lambda: plain.plain_kernel_matrix(Xd, gamma, ctx.cp), max(1, ctx.sizes["repeats"] - 1))
    floor = None if floors.get("fp32") is None else max(floors["fp32"], floors["write"])
    part.add({**base, "id": "plain-cupy-build", "what": "plain CuPy build (bench_gpu_engine.plain_kernel_matrix)",
              "gemm_precision": "fp32", "seconds": best, "floor_s": floor, "ratio": _ratio(best, floor)})
    _speedup(part, "engine-build-default", best)


def rest_of_iteration(op, S, labels, xp):
    """What a Lloyd iteration of kkmgpu.engine.lloyd does after its cluster sums: the totals, the assignment and
    its transfer to the host (the working tree's own functions, in either of their two forms)."""
    from kkmgpu.engine import lloyd as _lloyd

    if hasattr(_lloyd, "_device_totals"):  # one transfer per iteration
        totals = _lloyd._device_totals(op, S, labels, K, xp)
        step = _lloyd._assign(op, S, totals, labels, K, None)
        return _lloyd._fetch(op.backend, totals, step, K)
    sizes, within, _ = _lloyd._totals(op, S, labels, K, xp)
    return _lloyd._assign(op, S, sizes, within, labels, np.empty(K, dtype=np.int64))


def iteration_cases(ctx, part, Kd, base, plain):
    from kkmgpu.engine.dense import DenseKernelOperator

    xp = ctx.xp
    n = Kd.shape[0]
    bw = ctx.floors.bandwidths("cuda")
    iteration_floor = n * n * 4 / bw["copy_bandwidth_Bps"]
    weights = xp.ones(n, dtype=xp.float64)
    op = DenseKernelOperator(Kd, weights, ctx.backend)
    labels_h = _partition(n)
    labels = xp.asarray(labels_h)
    repeats = ctx.sizes["iteration_repeats"]
    best, median = ctx.best(lambda: rest_of_iteration(op, op.cluster_sums(labels, K), labels, xp), repeats)
    full = best
    # the library's own loop: (time of 1 + m iterations - time of 1) / m, update="full", points still moving
    m = 20 if not ctx.args.smoke else 3
    fit_kw = dict(kernel="precomputed", init=labels_h, update="full", tol=0, dtype="float32")
    ctx.fit(Kd, K, max_iter=1, **fit_kw)
    one = min(ctx.fit(Kd, K, max_iter=1, **fit_kw).timings["iterations"] for _ in range(2))
    many = ctx.fit(Kd, K, max_iter=1 + m, **fit_kw)
    marginal = (many.timings["iterations"] - one) / max(1, many.n_iter - 1)
    part.add({**base, "id": "engine-iteration-full", "what": "one full dense iteration (cluster sums, totals, "
              "assignment, its transfer) on K held on the device", "seconds": best, "median_s": median,
              "floor_s": iteration_floor, "ratio": _ratio(best, iteration_floor),
              "fit_marginal_s": marginal, "fit_marginal_ratio": _ratio(marginal, iteration_floor),
              "fit_marginal_rule": f"fit(K, precomputed, update='full', tol=0): (timings['iterations'] at "
                                   f"max_iter={1 + m} - at max_iter=1) / {many.n_iter - 1}"})
    diag = xp.diagonal(Kd).astype(xp.float64)
    plain_best, _ = ctx.best(lambda: plain.plain_step(Kd, diag, labels, weights, K, xp), max(2, repeats // 2))
    part.add({**base, "id": "plain-cupy-iteration", "what": "plain CuPy iteration (bench_gpu_engine.plain_step)",
              "seconds": plain_best, "floor_s": iteration_floor, "ratio": _ratio(plain_best, iteration_floor)})
    _speedup(part, "engine-iteration-full", plain_best)
    S0 = op.cluster_sums(labels, K)
    rng = np.random.default_rng(1)
    for fraction in (0.001, 0.01, 0.1):
        m = max(1, int(round(fraction * n)))
        moved = rng.choice(n, m, replace=False)
        new_h = labels_h.copy()
        new_h[moved] = (new_h[moved] + 1) % K
        new = xp.asarray(new_h)
        kw = {"n_moved": m} if getattr(op, "takes_moved_count", False) else {}
        copies = [S0.copy() for _ in range(repeats + 1)]

        def step():
            return rest_of_iteration(op, op.update_cluster_sums(copies.pop(), labels, new, **kw), new, xp)
        best, median = ctx.best(step, repeats)
        check = op.update_cluster_sums(S0.copy(), labels, new, **kw)
        error = float(xp.abs(check - op.cluster_sums(new, K)).max() / xp.abs(S0).max())
        floor = m * n * 4 / bw["copy_bandwidth_Bps"]
        part.add({**base, "id": f"engine-iteration-incremental-{fraction:g}", "what": f"one incremental dense "
                  f"iteration after {fraction:.1%} of the points moved (update of S, totals, assignment, transfer)",
                  "moved": m, "seconds": best, "median_s": median, "floor_s": floor,
                  "floor_rule": "the moved rows of K read once: m n 4 bytes / copy bandwidth",
                  "ratio": _ratio(best, floor), "fraction_of_full_iteration": best / full,
                  "speedup_vs_plain_cupy_full_iteration": plain_best / best,
                  "max_relative_difference_to_full_sums": error})


def _speedup(part, case_id, plain_seconds):
    for case in part.doc["cases"]:
        if case["id"] == case_id and case.get("seconds"):
            case["plain_cupy_s"] = plain_seconds
            case["speedup_vs_plain_cupy"] = plain_seconds / case["seconds"]
    part.write()


# ------------------------------------------------------------------------------------------ tiled


def _tiled_operator(ctx, Xd, mode):
    """(prepared features, tiled operator) for raw features ``Xd`` in GEMM mode ``mode``, through the spec's
    precision where the kernel spec has one, else the operator's ``tf32`` flag."""
    from kkmgpu.engine.tiled import TiledKernelOperator
    from kkmgpu.kernels import blocks as _blocks
    from kkmgpu.kernels import spec as _spec

    xp = ctx.xp
    kw = {"precision": mode} if "precision" in inspect.signature(_spec.resolve_kernel).parameters else {}
    spec = _spec.with_center(_spec.resolve_kernel("rbf", X=Xd, xp=xp, **kw), Xd, xp)
    A = _blocks.prepare_features(Xd, spec, ctx.backend, np.float32)
    weights = xp.ones(Xd.shape[0], dtype=xp.float64)
    op_kw = {"tf32": mode == "tf32"} if "tf32" in inspect.signature(TiledKernelOperator).parameters else {}
    return A, TiledKernelOperator(A, spec, weights, ctx.backend, **op_kw)


def _tiled_pass(ctx, op, labels):
    return rest_of_iteration(op, op.cluster_sums(labels, K), labels, ctx.xp)


def tiled_pass_cases(ctx, part, n, tag, modes, repeats):
    Xd = ctx.features(n)
    labels = ctx.xp.asarray(_partition(n))
    base = {**ctx.describe(), "n": n, "d": Xd.shape[1], "data": "MNIST repeated with device noise (protocol)"}
    for label, mode, runs in modes:
        _, small = _tiled_operator(ctx, Xd[:2048], runs)  # the kernels compile on a small pass
        _tiled_pass(ctx, small, labels[:2048])
        del small
        A, op = _tiled_operator(ctx, Xd, runs)
        times = [ctx.wall(lambda: _tiled_pass(ctx, op, labels))[0] for _ in range(repeats)]
        tile = op.tile_rows(n)
        gemm = ctx.kb.gemm_mode_seconds(ctx.backend, A[:tile], A, runs, repeats=2)
        floor = gemm * n / min(tile, n)
        new_h = _partition(n)
        moved = np.random.default_rng(1).choice(n, max(1, n // 100), replace=False)
        new_h[moved] = (new_h[moved] + 1) % K
        S = op.cluster_sums(labels, K)
        new = ctx.xp.asarray(new_h)
        kw = {"n_moved": moved.size} if getattr(op, "takes_moved_count", False) else {}  # each moved label differs
        incremental, _ = ctx.wall(lambda: op.update_cluster_sums(S, labels, new, **kw))
        part.add({**base, "id": f"tiled-pass-{tag}-{label}", "what": "one full tiled iteration (cluster sums, "
                  "totals, assignment)", "gemm_precision": runs, "seconds": min(times), "all_s": times,
                  "tile_rows": tile, "floor_s": floor, "floor_rule": "2 n^2 d flops at the rate of this mode's "
                  "GEMM on the engine's tile shape (t x d) @ (d x n), measured now", "ratio": _ratio(min(times), floor),
                  "incremental_1pct_s": incremental})
        del A, op, S
        ctx.free()
    return Xd, labels


def plain_tiled_pass(ctx, Xd, labels, gamma):
    """Plain CuPy: per row tile G = X_t X^T, K_t = exp(-gamma (|x_i|^2 + |x_j|^2 - 2 G)), S_t = K_t @ one-hot;
    then the distances and argmin. The same work as one tiled iteration, written the obvious way."""
    xp = ctx.xp
    n = Xd.shape[0]
    sq = (Xd * Xd).sum(axis=1)
    onehot = xp.zeros((n, K), dtype=xp.float32)
    onehot[xp.arange(n), labels] = 1
    S = xp.empty((n, K), dtype=xp.float32)
    t = max(1, min(n, (2 << 30) // (4 * n)))  # tiles of 2 GiB
    for i0 in range(0, n, t):
        G = Xd[i0:i0 + t] @ Xd.T
        G *= -2.0
        G += sq[i0:i0 + t, None]
        G += sq[None, :]
        xp.maximum(G, 0.0, out=G)
        G *= -gamma
        xp.exp(G, out=G)
        S[i0:i0 + t] = G @ onehot
        del G
    sizes = onehot.sum(axis=0)
    within = (S * onehot).sum(axis=0)
    safe = xp.where(sizes > 0, sizes, 1)
    return xp.argmin(1.0 - 2.0 * S / safe + within / (safe * safe), axis=1)


def part_tiled(ctx, part, n=None, tag="200k", modes=None, repeats=None, plain=True, labels_check=True):
    n = n or ctx.sizes["tiled_n"]
    repeats = repeats or max(1, ctx.sizes["repeats"] - 1)
    Xd, labels = tiled_pass_cases(ctx, part, n, tag, modes or ctx.modes, repeats)
    if plain:
        gamma = 1.0 / (Xd.shape[1] * float(Xd.astype(ctx.xp.float64).var()))
        plain_tiled_pass(ctx, Xd[:2048], labels[:2048], gamma)
        seconds, _ = ctx.wall(lambda: plain_tiled_pass(ctx, Xd, labels, gamma))
        part.add({**ctx.describe(), "id": f"plain-cupy-tiled-pass-{tag}", "n": n, "what": "plain CuPy tiled pass "
                  "(GEMM tiles, exp, product with the one-hot matrix, argmin)", "gemm_precision": "fp32",
                  "seconds": seconds})
        _speedup(part, f"tiled-pass-{tag}-default", seconds)
    del Xd, labels
    ctx.free()
    if not labels_check:
        return
    m = ctx.sizes["labels_n"]
    X, _ = ctx.mnist(m)
    init = _partition(m, seed=2)
    for label, mode, runs in ctx.modes[:1]:
        dense = ctx.fit(X, K, init=init, engine="dense", **ctx.mode_kw(mode))
        tiled = ctx.fit(X, K, init=init, engine="tiled", **ctx.mode_kw(mode))
        same = float(np.mean(ctx.backend.to_host(dense.labels) == ctx.backend.to_host(tiled.labels)))
        part.add({**ctx.describe(), "id": f"tiled-labels-{label}", "n": m, "what": "tiled vs dense labels from the "
                  "same initial partition (seed 2)", "gemm_precision": runs, "fraction_equal": same,
                  "n_iter": {"dense": int(dense.n_iter), "tiled": int(tiled.n_iter)},
                  "objective_relative_difference": tiled.objective / dense.objective - 1.0})


# ------------------------------------------------------------------------------------------ CATS, ncut, approx


def part_cats(ctx, part):
    n, l = ctx.sizes["cats_n"], ctx.sizes["cats_l"]
    Xd = ctx.features(n)
    init = _partition(n)
    cats = dict(method="cats", n_samples_per_cluster=l, theta=0.0, max_iter=5, random_state=0)
    ctx.fit(Xd[:4000], K, init=init[:4000], **{**cats, "max_iter": 2})  # compiles, CUDA context
    base = {**ctx.describe(), "n": n, "d": Xd.shape[1], "l": l, "max_iter": 5,
            "data": "MNIST repeated with device noise (protocol)"}
    for label, mode, runs in ctx.modes:
        fits = []
        for _ in range(max(2, ctx.sizes["repeats"] - 1)):
            r = ctx.fit(Xd, K, init=init, **cats, **ctx.mode_kw(mode))
            fits.append({"per_iteration_s": r.timings["iterations"] / max(1, r.n_iter), "n_iter": int(r.n_iter),
                         "timings": dict(r.timings)})
        best = min(f["per_iteration_s"] for f in fits)
        gemm = ctx.kb.gemm_mode_seconds(ctx.backend, Xd, Xd[:K * l], runs, repeats=5)
        ctx.free()
        part.add({**base, "id": f"cats-1m-{label}", "what": "CATS seconds per iteration (timings['iterations'] / "
                  "n_iter, best of the fits)", "gemm_precision": runs, "seconds": best, "fits": fits,
                  "floor_s": gemm, "floor_rule": "the GEMM of every point with the k l samples, (n x d) @ (d x k l), "
                  "in this mode, measured now", "ratio": _ratio(best, gemm)})


def _ncut_case(ctx, part, tag, Xd, y, repeat_under):
    from kkmgpu.metrics import nmi

    ctx.fit(Xd[:3000], K, objective="ncut", random_state=0)  # compiles
    times = []
    while True:
        seconds, r = ctx.wall(lambda: ctx.fit(Xd, K, objective="ncut", random_state=0))
        times.append(seconds)
        if len(times) >= 2 or seconds > repeat_under:
            break
    part.add({**ctx.describe(), "id": f"ncut-{tag}", "n": Xd.shape[0],
              "what": 'fit(X, 10, objective="ncut") end to end (graph, spectral start, iterations), X on the device',
              "gemm_precision": ctx.default_mode,
              "seconds": min(times), "all_s": times, "n_iter": int(r.n_iter), "timings": dict(r.timings),
              "nmi_vs_digits": None if y is None else float(nmi(y, ctx.backend.to_host(r.labels)))})


def part_ncut(ctx, part):
    n = ctx.sizes["ncut_n"]
    X, y = ctx.mnist(n)
    _ncut_case(ctx, part, "70k", ctx.xp.asarray(X), y, repeat_under=10.0)


def part_ncut_big(ctx, part):
    n = ctx.sizes["ncut_big_n"]
    _ncut_case(ctx, part, "1m", ctx.features(n), None, repeat_under=0.0)


def plain_approx(ctx, Xd, m, gamma, max_iter=300, seed=0):
    """Plain CuPy Nystrom k-means: F = K_nB V diag(w)^(-1/2) from m uniform landmarks (eigenvalues below 1e-6 of
    the largest dropped), then Lloyd on F's rows from a random partition. (labels, n_iter)."""
    xp = ctx.xp
    n = Xd.shape[0]
    B = Xd[xp.asarray(np.sort(np.random.default_rng(seed).choice(n, m, replace=False)))]

    def rbf(P, Q):
        G = P @ Q.T
        G *= -2.0
        G += (P * P).sum(axis=1)[:, None]
        G += (Q * Q).sum(axis=1)[None, :]
        xp.maximum(G, 0.0, out=G)
        G *= -gamma
        return xp.exp(G, out=G)

    w, V = xp.linalg.eigh(rbf(B, B).astype(xp.float64))
    keep = w > 1e-6 * w[-1]
    F = rbf(Xd, B) @ (V[:, keep] / xp.sqrt(w[keep])).astype(xp.float32)
    labels = xp.asarray(_partition(n, seed))
    n_iter = 0
    for n_iter in range(1, max_iter + 1):
        onehot = xp.zeros((n, K), dtype=xp.float32)
        onehot[xp.arange(n), labels] = 1
        C = (onehot.T @ F) / xp.maximum(onehot.sum(axis=0), 1)[:, None]
        new = xp.argmin((C * C).sum(axis=1)[None, :] - 2.0 * (F @ C.T), axis=1)
        if int((new != labels).sum()) == 0:
            break
        labels = new
    return ctx.backend.to_host(labels), n_iter


def part_approx_big(ctx, part):
    n, m = ctx.sizes["approx_n"], ctx.sizes["approx_m"]
    Xd = ctx.features(n)
    approx = dict(method="approx", n_landmarks=m, random_state=0)
    ctx.fit(Xd[:5000], K, **{**approx, "n_landmarks": min(m, 500)})  # compiles
    base = {**ctx.describe(), "n": n, "d": Xd.shape[1], "m": m, "data": "MNIST repeated with device noise (protocol)"}
    for label, mode, runs in ctx.modes:
        times = []
        for _ in range(2):
            seconds, r = ctx.wall(lambda: ctx.fit(Xd, K, **approx, **ctx.mode_kw(mode)))
            times.append(seconds)
        part.add({**base, "id": f"approx-1m-m2000-{label}",
                  "what": 'fit(X, 10, method="approx", n_landmarks=m) end to end, X on the device',
                  "gemm_precision": runs, "seconds": min(times), "all_s": times, "n_iter": int(r.n_iter),
                  "timings": dict(r.timings)})
    gamma = 1.0 / (Xd.shape[1] * float(Xd.astype(ctx.xp.float64).var()))
    plain_approx(ctx, Xd[:5000], min(m, 500), gamma, max_iter=3)
    seconds, (_, n_iter) = ctx.wall(lambda: plain_approx(ctx, Xd, m, gamma))
    part.add({**base, "id": "plain-cupy-approx-1m-m2000", "what": "plain CuPy Nystrom k-means (plain_approx)",
              "gemm_precision": "fp32", "seconds": seconds, "n_iter": n_iter})
    _speedup(part, "approx-1m-m2000-default", seconds)


PARTS = {
    "engine": part_engine,
    "tiled": part_tiled,
    "cats": part_cats,
    "ncut": part_ncut,
    "tiled-1m": lambda ctx, part: part_tiled(ctx, part, n=ctx.sizes["tiled_big_n"], tag="1m", modes=ctx.modes[:1],
                                             repeats=1, plain=False, labels_check=False),
    "ncut-1m": part_ncut_big,
    "approx-1m": part_approx_big,
}


# ------------------------------------------------------------------------------------------ collect


def _junit(path):
    """Counts, time and the first failures of one pytest JUnit file (None when the file is missing)."""
    import xml.etree.ElementTree as ET

    if not path.exists():
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        return {"unreadable": str(exc)}
    counts = {"tests": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures = []
    for case in root.iter("testcase"):
        counts["tests"] += 1
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "errors", "skipped": "skipped"}[child.tag]
                if child.tag != "skipped" and len(failures) < 10:
                    failures.append({"test": f"{case.get('classname')}::{case.get('name')}",
                                     "message": (child.get("message") or "").splitlines()[0][:300]
                                     if child.get("message") else ""})
        counts[outcome] += 1
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts["seconds"] = float(suite.get("time", 0)) if suite is not None else None
    return {**counts, "failures": failures}


def _read_steps(work):
    steps = []
    path = work / "steps.tsv"
    if path.exists():
        for line in path.read_text().splitlines():
            name, kind, limit, seconds, rc, note = (line.split("\t") + [""] * 6)[:6]
            steps.append({"name": name, "kind": kind, "limit_s": int(limit or 0),
                          "seconds": float(seconds) if seconds else None, "exit": int(rc) if rc else None,
                          "note": note or None})
    return steps


def _status(step, junit):
    if step["note"] and step["exit"] is None:
        return "not run"
    if step["exit"] in (124, 137):
        return "timed out"
    if junit is not None and (junit.get("failed") or junit.get("errors")):
        return "failed"
    return "passed" if step["exit"] == 0 else f"error (exit {step['exit']})"


def _targets(cases, phase, smoke):
    by_id = {case["id"]: case for case in cases}
    out = []
    for text, case_id, quantity, rule, limit, where in TARGETS:
        case = by_id.get(case_id)
        value = None if case is None else case.get(quantity)
        met = None if value is None or smoke else {"<=": value <= limit, ">=": value >= limit}[rule]
        out.append({"target": text, "case": case_id, "quantity": quantity, "rule": rule, "limit": limit,
                    "value": value, "met": met, "measured_by_phase": where,
                    "gemm_precision": None if case is None else case.get("gemm_precision"),
                    "speedup_vs_plain_cupy": None if case is None else case.get("speedup_vs_plain_cupy"),
                    "note": ("smoke run at a few thousand points: no verdict" if smoke and case is not None else None
                             if case is not None else "not in this file: phase " + where if where != phase
                             else "not measured (see steps and errors)")})
    return out


def collect(args):
    import _kkmgpu_bench as kb

    work = Path(args.work)
    steps = _read_steps(work)
    tests, cases, errors, parts = {}, [], [], {}
    for step in steps:
        if step["kind"] == "test":
            junit = _junit(work / f"tests-{step['name']}.xml")
            tests[step["name"]] = {"status": _status(step, junit), "limit_s": step["limit_s"],
                                   "seconds": step["seconds"], "exit": step["exit"], "note": step["note"],
                                   **(junit or {"tests": None})}
            step["status"] = tests[step["name"]]["status"]
        elif step["kind"] == "bench":
            path = work / f"{step['name']}.json"
            doc = json.loads(path.read_text()) if path.exists() else None
            step["status"] = _status(step, None) if doc is None or not doc["errors"] else "failed"
            if doc is not None:
                parts[step["name"]] = {"seconds": doc.get("seconds"), "finished": doc.get("finished") is not None,
                                       "cases": len(doc["cases"])}
                cases += [{**case, "part": step["name"]} for case in doc["cases"]]
                errors += [{**error, "part": step["name"]} for error in doc["errors"]]
    identity = kb.device_identity("cuda")
    started = [s for s in steps if s["seconds"] is not None]
    document = {
        "schema": SCHEMA, "phase": args.phase, "smoke": args.smoke, "emulated": args.emulate,
        "device": identity["slug"], "device_name": identity["name"], "gpu": identity["gpu"],
        "git": kb.git_state(), "written": _now(), "versions": kb.versions(), "host": kb.host_info(),
        "budget": {"budget_s": args.budget, "steps_seconds": sum(s["seconds"] for s in started)},
        "gemm_precision_default": _default_mode(), "protocol": __doc__.split("Protocol. ", 1)[1].strip(),
        "steps": steps, "tests": tests, "parts": parts, "errors": errors, "cases": cases,
        "targets": _targets(cases, args.phase, args.smoke),
    }
    tag = f"{args.phase}-smoke" if args.smoke else args.phase
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{datetime.date.today().isoformat()}-{identity['slug']}-{tag}.json"
    path.write_text(json.dumps(document, indent=1, default=_json) + "\n")
    (work / "result-path").write_text(str(path))
    for line in summary(document):
        print(line)
    print(f"wrote {path}")


def _default_mode():
    try:
        import kkmgpu

        if "gemm_precision" not in inspect.signature(kkmgpu.fit).parameters:
            return None
        from kkmgpu.kernels import gemm as _gemm
        return _gemm.DEFAULT_PRECISION
    except ImportError:
        return None


def _fmt(value, scale=1.0, digits=3):
    return "-" if value is None else f"{value * scale:.{digits}g}"


def summary(doc):
    lines = [f"== {doc['phase']} on {doc['device_name']}" + (" (SMOKE: emulated, no speed)" if doc["emulated"]
                                                             else "") + f", commit {(doc['git'] or {}).get('commit')}"]
    for step in doc["steps"]:
        lines.append(f"  step {step['name']:<14} {step.get('status', '-'):<12} {_fmt(step['seconds'], digits=4):>7} s "
                     f"of {step['limit_s']} s" + (f"  ({step['note']})" if step["note"] else ""))
    for name, group in doc["tests"].items():
        if group.get("tests") is not None:
            lines.append(f"  tests {name:<14} {group['passed']} passed, {group['failed']} failed, "
                         f"{group['errors']} errors, {group['skipped']} skipped")
        for failure in group.get("failures", [])[:3]:
            lines.append(f"      FAILED {failure['test']}: {failure['message'][:120]}")
    lines.append(f"  {'case':<38} {'mode':<7} {'seconds':>9} {'floor':>9} {'ratio':>6} {'x plain':>7}")
    for case in doc["cases"]:
        lines.append(f"  {case['id']:<38} {str(case.get('gemm_precision') or '-'):<7} "
                     f"{_fmt(case.get('seconds'), digits=4):>9} {_fmt(case.get('floor_s'), digits=4):>9} "
                     f"{_fmt(case.get('ratio')):>6} {_fmt(case.get('speedup_vs_plain_cupy')):>7}")
    for error in doc["errors"]:
        lines.append(f"  ERROR in {error['part']} ({error['where']}): {error['error'][:200]}")
    lines.append("  targets (issue 26, point 7):")
    for target in doc["targets"]:
        met = {True: "met", False: "MISSED", None: "-"}[target["met"]]
        lines.append(f"    {met:<6} {target['target']}: {_fmt(target['value'], digits=4)} {target['rule']} "
                     f"{target['limit']:g}" + (f" [{target['note']}]" if target["note"] else ""))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(prog="bench_quick.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=[*PARTS, "collect"])
    parser.add_argument("--work", default=os.environ.get("KKMGPU_QUICK_WORK") or "/tmp/kkmgpu-quick")
    parser.add_argument("--smoke", action="store_true", help="sizes scaled down to a few thousand points")
    parser.add_argument("--emulate", action="store_true", help="the CuPy stand-in of tests/standin (no GPU)")
    parser.add_argument("--default-mode-only", action="store_true", help="measure only the default GEMM mode")
    parser.add_argument("--phase", default="quick", help="collect: the phase named in the result file")
    parser.add_argument("--dest", default=str(BENCH_DIR / "results"), help="collect: folder of the result file")
    parser.add_argument("--budget", type=int, default=None, help="collect: the phase's time budget (recorded)")
    args = parser.parse_args(argv)
    if args.emulate:
        sys.path.insert(0, str(STANDIN_DIR))
    sys.path.insert(0, str(BENCH_DIR))
    try:
        import kkmgpu  # noqa: F401
    except ImportError:  # benchmark the working tree this folder belongs to
        sys.path.insert(0, str(REPO_ROOT))
    if args.part == "collect":
        collect(args)
        return 0
    ctx = Ctx(args)
    part = Part(args.part, args.work, args.smoke, args.emulate)
    status = 0
    try:
        with ctx.backend.activate():
            PARTS[args.part](ctx, part)
    except Exception as exc:  # recorded in the part's file; collect reports it
        part.error(args.part, exc)
        status = 1
    finally:
        part.write(finished=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
