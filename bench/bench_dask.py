"""kkmgpu.dask scaling on a LocalCluster of CPU workers: strong scaling (n fixed) and weak scaling (n per worker fixed).

A script, not a pytest module. From the repository root::

    python bench/bench_dask.py strong              # n = 20,000, 1, 2 and 4 workers
    python bench/bench_dask.py weak                # n = 5,000 per worker, 1, 2 and 4 workers
    python bench/bench_dask.py all

``--workers 1 2 4``, ``--n``, ``--n-per-worker`` override the defaults. Cases merge into
``bench/results/<YYYY-MM-DD>-<device>-dask.json`` (schema "kkmgpu-bench-dask/1").

Protocol. Each configuration starts its own ``distributed.LocalCluster(n_workers=W, threads_per_worker=1,
processes=True)`` with NUMBA/OpenBLAS/OpenMP limited to one thread per worker, so W workers use W cores (on the
2-core benchmark machine W = 4 oversubscribes the cores two to one: its figures measure the overhead of doing so,
not a speed-up). Data: a seeded MNIST sample (pixels / 255, d = 784, float32) as a dask array with one row chunk
per worker; RBF kernel, gamma = 1 / (d Var X), k = 10, a random initial partition (seed 0). Exact: ``max_iter=2,
tol=0, update="full"``, so every one of the n_iter + 1 cluster-sum passes is a full tiled pass over the worker's
rows against all n points: seconds per pass = iteration seconds / (n_iter + 1). CATS: ``max_iter=3``, l =
ceil(sqrt(n / k)), seconds per iteration = iteration seconds / n_iter. "setup" = gathering X onto every worker
and the diagonal (once per fit). Floor of an exact pass: 2 n^2 d / (min(W, cores) R1), with R1 the float32 GEMM
rate of ONE worker thread measured in the same run on a (2048 x 784) @ (784 x n) product. The single-process
engine (``kkmgpu.fit(engine="tiled")`` with all cores) is timed on the same data for reference. Bytes per
iteration are the model of kkmgpu.dask's protocol (labels broadcast to every worker: 4 n W bytes; labels gathered:
4 n; k-sized totals), not a measurement.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from bench_tiled import Run, features  # noqa: E402  (also puts the working tree on sys.path)

import kkmgpu  # noqa: E402
from kkmgpu.engine import lloyd as _lloyd  # noqa: E402

SCHEMA = "kkmgpu-bench-dask/1"
K = 10
ONE_THREAD = {name: "1" for name in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                     "MKL_NUM_THREADS")}


def _one_thread_gemm_rate(n, d=784, m=2048):
    import numpy as np  # runs on a worker

    rng = np.random.default_rng(0)
    A = rng.random((m, d), dtype=np.float32)
    B = rng.random((n, d), dtype=np.float32)
    out = np.empty((m, n), dtype=np.float32)
    np.matmul(A, B.T, out=out)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        np.matmul(A, B.T, out=out)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * m * n * d / best


def _cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def case(run, scaling, n, workers, reference_seconds=None):
    import dask.array as da
    from distributed import Client, LocalCluster

    import kkmgpu.dask

    X = features(n)
    init = _lloyd.random_partition(n, K, np.random.default_rng(0))
    load_start = list(os.getloadavg())
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      env=ONE_THREAD) as cluster, Client(cluster) as client:
        client.wait_for_workers(workers)
        rate = max(client.run(_one_thread_gemm_rate, n).values())
        Xd = da.from_array(X, chunks=(-(-n // workers), -1))
        t0 = time.perf_counter()
        exact = kkmgpu.dask.fit(Xd, K, init=init, max_iter=2, tol=0.0, update="full", client=client)
        exact_wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        cats = kkmgpu.dask.fit(Xd, K, method="cats", init=init, max_iter=3, random_state=0, client=client)
        cats_wall = time.perf_counter() - t0
        rate_end = max(client.run(_one_thread_gemm_rate, n).values())
    rate = max(rate, rate_end)
    per_pass = exact.timings["iterations"] / (exact.n_iter + 1)
    floor = 2.0 * n * n * 784 / (min(workers, _cores()) * rate)
    result = {
        "id": f"{scaling}-n{n}-w{workers}", "scaling": scaling, "n": n, "d": 784, "k": K, "workers": workers,
        "cores": _cores(), "oversubscribed": workers > _cores(), "n_per_worker": n / workers,
        "load_average_at_case_start": load_start,
        "exact": {"n_iter": exact.n_iter, "setup_seconds": exact.timings["kernel_build"],
                  "iterations_seconds": exact.timings["iterations"], "seconds_per_pass": per_pass,
                  "wall_seconds": exact_wall, "objective": exact.objective},
        "cats": {"n_iter": cats.n_iter, "l": cats.method_params["l"], "setup_seconds": cats.timings["kernel_build"],
                 "iterations_seconds": cats.timings["iterations"],
                 "seconds_per_iteration": cats.timings["iterations"] / cats.n_iter, "wall_seconds": cats_wall},
        "one_thread_gemm_flops_per_s": rate, "floor_seconds_per_pass": floor, "ratio_to_floor": per_pass / floor,
        "bytes_per_iteration_model": {"labels_broadcast": 4 * n * workers, "labels_gathered": 4 * n,
                                      "totals": 2 * 8 * K * workers * 2},
    }
    if reference_seconds is not None:
        result["single_process_tiled_seconds_per_pass"] = reference_seconds
    return run.add(result)


def single_process_seconds_per_pass(n):
    X = features(n)
    init = _lloyd.random_partition(n, K, np.random.default_rng(0))
    r = kkmgpu.fit(X, K, init=init, max_iter=2, tol=0.0, update="full", engine="tiled", device="cpu")
    return r.timings["iterations"] / (r.n_iter + 1)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="bench_dask.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["strong", "weak", "all"])
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--n-per-worker", type=int, default=5_000)
    args = parser.parse_args(argv)
    run = Run("cpu", argv, topic="dask", schema=SCHEMA, script="bench/bench_dask.py", doc=__doc__)
    print(f"[bench_dask] results in {run.path}")
    if args.what in ("strong", "all"):
        reference = single_process_seconds_per_pass(args.n)
        for w in args.workers:
            case(run, "strong", args.n, w, reference)
    if args.what in ("weak", "all"):
        for w in args.workers:
            n = args.n_per_worker * w
            case(run, "weak", n, w, single_process_seconds_per_pass(n))
    print(f"[bench_dask] wrote {run.path}")


if __name__ == "__main__":
    main()
