"""Tiled (matrix-free) engine benchmarks: time per exact iteration against the arithmetic floor 2 n^2 d / GEMM rate.

A script, not a pytest module. From the repository root::

    python bench/bench_tiled.py scaling            # MNIST samples n = 10k, 20k, 50k (d = 784): per iteration vs floor,
                                                   # plus the dense engine at n = 10k, 20k for comparison
    python bench/bench_tiled.py big                # ONE exact iteration at n = 200,000 (CPU) or 1,000,000 (GPU),
                                                   # d = 784, replicated-and-jittered MNIST
    python bench/bench_tiled.py labels             # tiled vs dense labels from the same initial labels (float32,
                                                   # n = 10k); on a GPU also TF32 vs float32 GEMMs
    python bench/bench_tiled.py all                # the three

``--device cpu|cuda`` (default: cuda where a GPU is usable, else cpu), ``--n`` overrides the sizes. Cases merge into
``bench/results/<YYYY-MM-DD>-<device>-tiled.json`` (schema "kkmgpu-bench-tiled/1"); a case with the same id is
replaced. On a GPU (H100 / H200) the command for the issue's 1,000,000-point figure is::

    python bench/bench_tiled.py big --device cuda              # n = 1,000,000, d = 784, float32
    python bench/bench_tiled.py big --device cuda --tf32       # the same with TF32 GEMMs

Protocol. Features: MNIST pixels / 255 (a seeded sample for n <= 70,000; above that all 70,000 points repeated and
jittered with N(0, 0.02^2) noise, then the first n rows), float32, RBF kernel with gamma = 1 / (d Var X), k = 10,
weights 1, a random initial partition (seed 0). One "iteration" = what a full Lloyd iteration of the tiled engine
does: the full cluster-sum pass (GEMM tiles + fused epilogue/accumulation), the totals and the assignment step.
Its floor is 2 n^2 d / R, with R the float32 GEMM rate measured in the same run, on the same device and library, on
GEMMs of the engine's own tile shape (t x d) @ (d x n) and on a (4096 x d) @ (d x min(n, 20000)) product; the larger
rate (the stricter floor) is used. Load averages at start and end are recorded: on a shared machine they say how
contended the timings were, and the ratio to the floor (both measured in the same minutes) is the figure to quote.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
try:
    import kkmgpu
except ImportError:  # benchmark the working tree this folder belongs to
    sys.path.insert(0, str(REPO_ROOT))
    import kkmgpu
from kkmgpu import datasets  # noqa: E402
from kkmgpu.backend import device as _backend
from kkmgpu.kernels import blocks as _kernels
from kkmgpu.kernels import gemm as _gemm
from kkmgpu.kernels import spec as _kernel_spec
from kkmgpu.engine import lloyd as _lloyd
from kkmgpu.engine.dense import DenseKernelOperator  # noqa: E402
from kkmgpu.engine.tiled import TiledKernelOperator  # noqa: E402

SCHEMA = "kkmgpu-bench-tiled/1"
K = 10
D = 784
JITTER = 0.02


def default_device() -> str:
    if os.environ.get("KKMGPU_DEVICE", "").strip().lower() == "cpu":
        return "cpu"
    return "cuda" if _backend.cuda_unavailable_reason() is None else "cpu"


def Run(device, argv, topic="tiled", schema=SCHEMA, script="bench/bench_tiled.py", doc=None):
    """This invocation's cases, merged into <date>-<device>-<topic>.json (``_kkmgpu_bench.ScriptRun``), with the
    protocol of ``doc`` (its text after "Protocol. ") in the document and the load average after every case."""
    from _kkmgpu_bench import ScriptRun, _json_default

    class TiledRun(ScriptRun):
        def case_extra(self):
            return {"load_average_at_case_end": list(os.getloadavg())}

        def add(self, case):
            case = super().add(case)
            print(json.dumps({k: v for k, v in case.items() if not isinstance(v, (list, dict))},
                             default=_json_default))
            return case

    protocol = (doc or __doc__).split("Protocol. ", 1)[1].strip()
    return TiledRun(device, argv, script=script, topic=topic, schema=schema, document_extra={"protocol": protocol})


# ------------------------------------------------------------------------------------------ data and timing


def features(n, seed=0):
    """MNIST pixels / 255 (float32): a sample for n <= 70,000, else all points repeated and jittered."""
    if n <= 70_000:
        X, _ = datasets.load_mnist(n_samples=n, random_state=seed)
        return np.ascontiguousarray(X, dtype=np.float32)
    X, _ = datasets.load_mnist()
    X = np.asarray(X, dtype=np.float32)
    rng = np.random.default_rng(seed)
    out = np.empty((n, X.shape[1]), dtype=np.float32)
    for i0 in range(0, n, X.shape[0]):
        i1 = min(n, i0 + X.shape[0])
        out[i0:i1] = X[:i1 - i0]
        if i0 > 0:  # the first copy is MNIST itself
            out[i0:i1] += rng.normal(0.0, JITTER, size=(i1 - i0, X.shape[1])).astype(np.float32)
    return out


def _seconds(backend, fn, repeats):
    best = []
    for _ in range(repeats):
        t0 = backend.timer()
        fn()
        best.append(backend.timer() - t0)
    return best


def gemm_rates(backend, A, tile_rows, tf32=False, tile_repeats=3):
    """float32 GEMM rates (flop/s) measured now: the engine's tile shape, and a 4096-row product."""
    xp = backend.xp
    n, d = A.shape
    rates = {}
    with _gemm.compute_type(backend, "tf32" if tf32 else "fp32"):
        t = min(tile_rows, n)
        out = xp.empty((t, n), dtype=A.dtype)
        B = A[::-1].copy()  # a different operand: no symmetric (syrk) shortcut
        xp.matmul(A[:t], B.T, out=out)
        secs = _seconds(backend, lambda: xp.matmul(A[:t], B.T, out=out), tile_repeats)
        rates["tile_gemm"] = {"shape": [t, d, n], "seconds": secs, "flops_per_s": 2.0 * t * n * d / min(secs)}
        m, c = min(4096, n), min(n, 20_000)
        square = xp.empty((m, c), dtype=A.dtype)
        xp.matmul(A[:m], B[:c].T, out=square)
        secs = _seconds(backend, lambda: xp.matmul(A[:m], B[:c].T, out=square), 3)
        rates["square_gemm"] = {"shape": [m, d, c], "seconds": secs, "flops_per_s": 2.0 * m * c * d / min(secs)}
    rates["rate_flops_per_s"] = max(r["flops_per_s"] for r in rates.values() if isinstance(r, dict))
    return rates


def _prepare(X, backend, dtype=np.float32):
    Xd = backend.asarray(X)
    spec = _kernel_spec.resolve_kernel("rbf", X=Xd, xp=backend.xp, precision="fp32")  # plain FP32 unless --tf32
    spec = _kernel_spec.with_center(spec, Xd, backend.xp)
    return _kernels.prepare_features(Xd, spec, backend, dtype), spec


def _iteration(op, labels, xp, backend):
    S, sizes, within, _ = _lloyd._update(op, labels, K, xp)
    backend.ops.assign_labels(S, op.diag, sizes, within, labels)


# ------------------------------------------------------------------------------------------ cases


def case_scaling(run, backend, n, tf32=False, dense=False):
    xp = backend.xp
    X = features(n)
    A, spec = _prepare(X, backend)
    del X
    weights = backend.asarray(np.ones(n))
    labels = backend.asarray(_lloyd.random_partition(n, K, np.random.default_rng(0)))
    op = TiledKernelOperator(A, _kernel_spec.replace(spec, precision="tf32" if tf32 else "fp32"), weights, backend)
    tile = op.tile_rows(n)
    floors = gemm_rates(backend, A, tile, tf32=tf32)
    # one timed pass at the big sizes (a 1,000,000-point GPU iteration takes about 40 s: a warm-up and three
    # repeats would not fit a device call's step); the smaller sizes are warmed up and repeated
    small = n <= 20_000 or (backend.is_gpu and n <= 200_000)
    repeats = 3 if small else 1
    if small:
        _iteration(op, labels, xp, backend)  # warm-up (numba compilation is cached, first-touch of buffers)
    times = _seconds(backend, lambda: _iteration(op, labels, xp, backend), repeats)
    # incremental update with 1% of the points moved (what late iterations cost)
    old = labels
    new_h = backend.to_host(labels).copy()
    moved = np.random.default_rng(1).choice(n, n // 100, replace=False)
    new_h[moved] = (new_h[moved] + 1) % K
    new = backend.asarray(new_h)
    S = op.cluster_sums(old, K)
    incr = _seconds(backend, lambda: op.update_cluster_sums(S, old, new), 1)
    floors_end = gemm_rates(backend, A, tile, tf32=tf32, tile_repeats=2)
    rate = max(floors["rate_flops_per_s"], floors_end["rate_flops_per_s"])
    floor = 2.0 * n * n * D / rate
    case = {"id": f"{'big' if n > 70_000 else 'scaling'}-n{n}{'-tf32' if tf32 else ''}", "n": n, "d": D, "k": K,
            "dtype": "float32", "kernel": "rbf", "tf32": tf32, "tile_rows": tile,
            "iteration_seconds": times, "iteration_seconds_best": min(times),
            "incremental_1pct_seconds": incr[0], "floor_seconds": floor, "ratio_to_floor": min(times) / floor,
            "gemm_rate_flops_per_s": rate, "gemm_floors_start": floors, "gemm_floors_end": floors_end,
            "achieved_flops_per_s": 2.0 * n * n * D / min(times)}
    if dense:
        Kd = None
        t0 = backend.timer()
        Kd = _kernels.build_kernel_matrix(A, A, spec, backend)
        build = backend.timer() - t0
        dop = DenseKernelOperator(Kd, weights, backend)
        _iteration(dop, labels, xp, backend)
        dense_times = _seconds(backend, lambda: _iteration(dop, labels, xp, backend), 3)
        case.update(dense_build_seconds=build, dense_iteration_seconds=dense_times,
                    tiled_over_dense_iteration=min(times) / min(dense_times))
        del Kd, dop
    return run.add(case)


def case_labels(run, backend, n=10_000, tf32_compare=False):
    """Tiled vs dense from the same initial labels (float32): fraction of equal labels, objectives, iterations."""
    X = features(n)
    init = _lloyd.random_partition(n, K, np.random.default_rng(2))
    results = {}
    device = backend.name
    for engine, tf32 in [("dense", False), ("tiled", False)] + ([("tiled", True)] if tf32_compare else []):
        t0 = time.perf_counter()
        r = kkmgpu.fit(X, K, init=init, device=device, engine=engine, tf32=tf32)
        results[(engine, tf32)] = (r, time.perf_counter() - t0)
    dense, _ = results[("dense", False)]
    case = {"id": f"labels-n{n}", "n": n, "d": D, "k": K, "dtype": "float32", "init": "random partition, seed 2"}
    for (engine, tf32), (r, seconds) in results.items():
        key = engine + ("_tf32" if tf32 else "")
        case[key] = {"n_iter": r.n_iter, "objective": r.objective, "seconds": seconds,
                     "iterations_seconds": r.timings["iterations"], "stop_reason": r.stop_reason,
                     "fraction_labels_equal_dense": float(np.mean(r.labels == dense.labels)),
                     "objective_relative_to_dense": r.objective / dense.objective - 1.0}
    return run.add(case)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="bench_tiled.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["scaling", "big", "labels", "all"])
    parser.add_argument("--device", default=None, choices=["cpu", "cuda"])
    parser.add_argument("--n", type=int, nargs="*", default=None, help="sizes (override the defaults)")
    parser.add_argument("--tf32", action="store_true", help="TF32 GEMMs (GPU only)")
    args = parser.parse_args(argv)
    device = args.device or default_device()
    backend = _backend.resolve_device(device)
    if args.tf32 and not backend.is_gpu:
        parser.error("--tf32 needs a GPU (device cuda)")
    run = Run(device, argv)
    print(f"[bench_tiled] device {run.ident['name']}, results in {run.path}")
    with backend.activate():
        if args.what in ("scaling", "all"):
            for n in args.n or ([10_000, 20_000, 50_000] if not backend.is_gpu else [20_000, 50_000, 100_000]):
                case_scaling(run, backend, n, tf32=args.tf32, dense=n <= (50_000 if backend.is_gpu else 20_000))
        if args.what in ("labels", "all"):
            case_labels(run, backend, tf32_compare=backend.is_gpu)
        if args.what in ("big", "all"):
            for n in args.n or [1_000_000 if backend.is_gpu else 200_000]:
                case_scaling(run, backend, n, tf32=args.tf32)
    print(f"[bench_tiled] wrote {run.path}")


if __name__ == "__main__":
    main()
