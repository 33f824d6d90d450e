"""CATS benchmarks: CATS against exact kernel k-means from the same initial partitions, and CATS's scaling in n.

Mostly a script; one pytest-benchmark case, ``test_coefficient_solve`` (the solve of alpha_c = M_c^+ rhs_c of one
iteration by the two GPU routes: per-cluster eigh against one batched regularized solve), runs with
``python -m pytest bench/bench_cats.py --benchmark-only`` (cpu, and cuda where a GPU is usable; restrict with
$KKMGPU_BENCH_DEVICES). The subcommands, from the repository root::

    python bench/bench_cats.py quality     # shape sets + MNIST sample: distortion ratio and NMI(CATS, exact)
    python bench/bench_cats.py lsweep      # the paper's l sweep, l = 8, 16, 33, 66, on an MNIST sample
    python bench/bench_cats.py mnist       # all 70,000 MNIST points, CATS vs exact over 10 seeds
    python bench/bench_cats.py scaling     # time per iteration vs n (synthetic d = 784 and birch1), slope, PNG
    python bench/bench_cats.py plot FILE   # the scaling PNG of a result file again

Every subcommand merges its cases into ``bench/results/<YYYY-MM-DD>-<device>-cats.json`` (schema
"kkmgpu-bench-cats/1", described in bench/README.md, section "CATS"); a case with the same id is replaced.
``--device`` (default: cuda where a GPU is usable, else cpu) picks the device; CuPy is imported only through
``kkmgpu.backend.device.import_cupy()``. Sizes and seeds come from options or the environment variables listed by
``python bench/bench_cats.py SUBCOMMAND --help``.

Protocol shared by quality, lsweep and mnist: RBF kernel with one gamma for both methods (the library's default
"scale" rule, 1 / (d X.var()), computed on the data and passed explicitly); per seed one initial partition
("k-means++": D^2 seeding in feature space with kernel rows, every point to its nearest seed; or "random": uniform
labels with k random points fixed to 0..k-1), handed to both methods as ``init=labels``. The exact method runs
with the library defaults (tol 1e-6, max_iter 300) on the kernel matrix built once per data set; CATS with its
defaults (window 5, theta 1e-6, max_iter 300) and ``random_state=seed``. Distortion = the kernel k-means objective
sum_i ||phi(x_i) - m_{label_i}||^2 with exact centroids; both partitions are evaluated by the same tiled float32
routine (kkmgpu.engine.sampled.exact_objective), so the ratio does not mix precisions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
try:
    import kkmgpu  # noqa: F401
except ImportError:  # benchmark the working tree this folder belongs to
    sys.path.insert(0, str(REPO_ROOT))

import kkmgpu  # noqa: E402
from kkmgpu import datasets  # noqa: E402
from kkmgpu.backend import device as _backend
from kkmgpu.engine import sampled as _cats
from kkmgpu.kernels import blocks as _kernels
from kkmgpu.kernels import spec as _kernel_spec
from kkmgpu.metrics import nmi  # noqa: E402

SCHEMA = "kkmgpu-bench-cats/1"
DEFAULT_RESULTS_DIR = BENCH_DIR / "results"
BIRCH_PATH = REPO_ROOT / ".." / "shared" / "data" / "large" / "birch1.csv"
PAPER = {
    "mnist": {"distortion_exact": 19.1273, "distortion_cats": 19.134, "time_exact_s": 1854, "time_cats_s": 110,
              "nmi_cats_exact": 0.91, "note": "paper's Table 1 (MNIST, 100 trials, l = sqrt(n/k)); its distortion "
                                             "scale is not stated, only the ratio 1.00035 is comparable"},
    "lsweep": {"l": [8, 16, 33, 66], "distortion": [0.34, 0.33, 0.33, 0.34], "time_s": [65, 71, 96, 233],
               "nmi_cats_exact": [0.92, 0.94, 0.99, 0.99], "true_nmi": [0.64, 0.65, 0.63, None],
               "note": "paper's l table (data set and n not stated; 'True NMI' has three values for four l)"},
}


def env_int(name, default):
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


def env_list(name, default):
    value = os.environ.get(name, "").strip()
    return [item.strip() for item in value.split(",") if item.strip()] if value else default


# ------------------------------------------------------------------------------------------ pytest-benchmark

#: sizes l of M_c for test_coefficient_solve (the larger ones on a GPU only: the CPU takes seconds per call)
SOLVE_SIZES = (48, 128, 384, 1024)
SOLVE_CPU_MAX = 128
SOLVE_CLUSTERS = 10


def rbf_sample_squares(k, l, seed=0, d=16):
    """k RBF kernel matrices of l points each (gamma = 1 / (2 d), points standard normal in d dimensions), float64,
    and right-hand sides M_c 1 / l (what L_c w_c / n_c is when the cluster's centroid is the samples' mean)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(k, l, d))
    sq = (X * X).sum(axis=2)
    dist = np.maximum(sq[:, :, None] + sq[:, None, :] - 2.0 * np.einsum("kid,kjd->kij", X, X), 0.0)
    M = np.exp(-dist / (2.0 * d))
    return M, M.sum(axis=2) / l


def pytest_generate_tests(metafunc):
    """The cases of test_coefficient_solve (bench/conftest.py adds ``device``); no pytest import in the script."""
    if metafunc.function.__name__ == "test_coefficient_solve":
        metafunc.parametrize("route", ["eigh", "regularized"])
        metafunc.parametrize("l", SOLVE_SIZES)


def test_coefficient_solve(benchmark, device, route, l):
    """alpha_c = M_c^+ rhs_c for k = 10 clusters of l samples. "eigh" is the default route (one batched LAPACK
    call on the CPU; on a GPU one syevd per cluster for M_c above 32 x 32, cuSOLVER's batched-Jacobi limit);
    "regularized" is one batched solve of (M_c^2 + eps^2 I) x = M_c rhs_c (kkmgpu.engine.sampled._regularized_solve, what
    GPU_LARGE_M_SOLVER = "regularized" runs). ``extra_info["offsets_max_rel_diff"]``: the largest relative
    difference of the offsets alpha^T M alpha from the eigh route's (what the assignment reads)."""
    import pytest

    be = _backend.resolve_device(device)
    if not be.is_gpu and l > SOLVE_CPU_MAX:
        pytest.skip(f"l={l} takes seconds per call on the CPU; measured on a GPU only")
    solve = {"eigh": _cats._pinv_solve, "regularized": _cats._regularized_solve}[route]
    with be.activate():
        M, rhs = (be.asarray(a) for a in rbf_sample_squares(SOLVE_CLUSTERS, l, seed=l))

        def call():
            x = solve(M, rhs, 1e-6, be)
            be.synchronize()
            return x

        x = benchmark(call)
        reference = _cats._pinv_solve(M, rhs, 1e-6, be)
        offsets, reference_offsets = (be.to_host(be.xp.einsum("kl,klm,km->k", y, M, y)) for y in (x, reference))
    benchmark.extra_info.update({
        "k": SOLVE_CLUSTERS, "l": l, "route": route, "device": device, "rcond": 1e-6,
        "per_cluster_eigh": bool(route == "eigh" and be.is_gpu and l > _cats.GPU_BATCHED_EIGH_MAX),
        "offsets_max_rel_diff": float(np.max(np.abs(offsets / reference_offsets - 1.0)))})


def test_cats_fit(benchmark, device):
    """CATS end to end on 5,000 MNIST points (k = 10, default l, theta = 0, from a fixed random partition, at
    most 20 iterations): the CATS case of ``bench/compare_commits.py`` (a change of structure must not slow it)."""
    X, _ = datasets.load_mnist(n_samples=5000, random_state=0)
    init = np.random.default_rng(0).integers(0, 10, len(X))

    def call():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a ConvergenceWarning at max_iter is expected and not measured
            return kkmgpu.fit(X, 10, method="cats", init=init, max_iter=20, theta=0.0, random_state=0,
                              device=device)

    result = benchmark.pedantic(call, rounds=3, warmup_rounds=1, iterations=1)
    benchmark.extra_info.update({"n": len(X), "k": 10, "device": device, "n_iter": int(result.n_iter),
                                 "objective": float(result.objective)})


# ------------------------------------------------------------------------------------------ devices, files


def default_device() -> str:
    if os.environ.get("KKMGPU_DEVICE", "").strip().lower() == "cpu":
        return "cpu"
    return "cuda" if _backend.cuda_unavailable_reason() is None else "cpu"


def synchronize(device):
    if device.startswith("cuda"):
        _backend.import_cupy().cuda.Device().synchronize()


def free_bytes(device):
    return _backend.resolve_device(device).available_bytes()


def Run(device, argv, results_dir=None):
    """This invocation's cases, merged into <date>-<device>-cats.json (``_kkmgpu_bench.ScriptRun``)."""
    from _kkmgpu_bench import ScriptRun

    return ScriptRun(device, argv, script="bench/bench_cats.py", topic="cats", schema=SCHEMA,
                     results_dir=results_dir, document_extra={"paper": PAPER})


# ------------------------------------------------------------------------------------------ protocol pieces


def default_gamma(X):
    return 1.0 / (X.shape[1] * float(np.var(X, dtype=np.float64)))


def random_partition(n, k, rng):
    labels = rng.integers(0, k, n).astype(np.int32)
    labels[rng.permutation(n)[:k]] = np.arange(k, dtype=np.int32)
    return labels


def kmeanspp_partition(X, k, gamma, rng, device):
    """D^2 seeding with RBF kernel rows (d^2 = 2 - 2 K(x, s)), every point to its nearest seed."""
    n = X.shape[0]

    def rows(index):
        block = kkmgpu.kernel_matrix(X[index], X, kernel="rbf", gamma=gamma, device=device)
        return np.asarray(block.get() if hasattr(block, "get") else block, dtype=np.float64)

    seeds = [int(rng.integers(n))]
    closest = np.maximum(2.0 - 2.0 * rows([seeds[0]])[0], 0.0)
    for _ in range(1, k):
        total = closest.sum()
        seeds.append(int(rng.choice(n, p=closest / total)) if total > 0 else int(rng.integers(n)))
        closest = np.minimum(closest, np.maximum(2.0 - 2.0 * rows([seeds[-1]])[0], 0.0))
    labels = np.argmax(rows(seeds), axis=0).astype(np.int32)
    labels[seeds] = np.arange(k, dtype=np.int32)
    return labels


def initial_partition(kind, X, k, gamma, seed, device):
    rng = np.random.default_rng(seed)
    if kind == "random":
        return random_partition(X.shape[0], k, rng)
    if kind == "k-means++":
        return kmeanspp_partition(X, k, gamma, rng, device)
    raise ValueError(f"init={kind!r}: use 'random' or 'k-means++'")


class Objective:
    """Exact kernel k-means objective of any labels of X (RBF, gamma), tiled, float32 kernel, no n x n matrix."""

    def __init__(self, X, gamma, device):
        self.backend = _backend.resolve_device(device)
        with self.backend.activate():
            Xd = self.backend.asarray(X)
            spec = _kernel_spec.resolve_kernel("rbf", gamma=gamma, X=Xd, xp=self.backend.xp)
            spec = _kernel_spec.with_center(spec, Xd, self.backend.xp)
            self.source = _cats.KernelSource(_kernels.prepare_features(Xd, spec, self.backend, np.float32),
                                             spec, self.backend)
        self.n = X.shape[0]

    def __call__(self, labels, k):
        labels = np.asarray(labels.get() if hasattr(labels, "get") else labels, dtype=np.int32)
        with self.backend.activate():
            return float(_cats.exact_objective(self.source, labels, np.ones(self.n), k))


def exact_dtype(n, device, requested):
    """float32 where the n x n matrix fits the free memory with room to spare, else float16 (documented)."""
    if requested != "auto":
        return requested
    available = free_bytes(device)
    return "float32" if available is None or n * n * 4 <= 0.8 * available else "float16"


#: On the CPU, K(X, X) in float32 is one NumPy product X @ X.T (OpenBLAS syrk), which segfaults in this
#: environment's multithreaded OpenBLAS (scipy-openblas 0.3.31) for n >= about 40,000 with d = 784 (also
#: numpy/numpy#19685). From this n the benchmark passes Y = X, which builds K in row tiles of plain GEMM instead.
SYRK_SAFE_N = 35000


def build_kernel(X, gamma, device, dtype):
    synchronize(device)
    t0 = time.perf_counter()
    Y = X if device == "cpu" and dtype == "float32" and X.shape[0] > SYRK_SAFE_N else None
    K = kkmgpu.kernel_matrix(X, Y, kernel="rbf", gamma=gamma, device=device, dtype=dtype)
    synchronize(device)
    return K, time.perf_counter() - t0


def host(a):
    return np.asarray(a.get() if hasattr(a, "get") else a)


def run_exact(K, k, labels0, dtype, device):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        r = kkmgpu.fit(K, k, kernel="precomputed", init=labels0, dtype=dtype, device=device)
    return r, host(r.labels)


def run_cats(X, k, labels0, gamma, l, seed, device, theta=None, window=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        r = kkmgpu.fit(X, k, kernel="rbf", gamma=gamma, method="cats", init=labels0, n_samples_per_cluster=l,
                       random_state=seed, exact_objective=True, device=device, theta=theta, window=window)
    return r, host(r.labels)


def stats(values):
    a = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if a.size == 0:
        return None
    return {"mean": float(a.mean()), "std": float(a.std(ddof=1)) if a.size > 1 else 0.0,
            "min": float(a.min()), "max": float(a.max()), "count": int(a.size)}


def load_mnist_subset(n):
    from _kkmgpu_bench import mnist_dir

    X, y = datasets.load_mnist(mnist_dir(), n_samples=None if n >= 70000 else n, random_state=0)
    return np.ascontiguousarray(X, dtype=np.float32), y


# ------------------------------------------------------------------------------------------ CATS vs exact


def compare(run, *, name, X, y, k, seeds, inits, ls, exact_dtype_requested, extra=None, theta=None, window=None):
    """Both methods from the same partitions; one case per (init, l) with per-seed rows and summaries."""
    device = run.device
    n = X.shape[0]
    gamma = default_gamma(X)
    dtype = exact_dtype(n, device, exact_dtype_requested)
    print(f"[{name}] n={n} k={k} gamma={gamma:.6g} exact dtype={dtype} device={device}", flush=True)
    K, build_s = build_kernel(X, gamma, device, dtype)
    print(f"[{name}] kernel matrix built in {build_s:.1f} s", flush=True)
    objective = Objective(X, gamma, device)
    rows = {(init, l): [] for init in inits for l in ls}
    for init in inits:
        for seed in seeds:
            labels0 = initial_partition(init, X, k, gamma, seed, device)
            exact, e_labels = run_exact(K, k, labels0, dtype, device)
            e_obj = objective(e_labels, k)
            e_time = build_s + exact.timings["total"] - exact.timings["validation"]
            for l in ls:
                cats, c_labels = run_cats(X, k, labels0, gamma, l, seed, device, theta, window)
                c_time = cats.timings["total"] - cats.timings.get("exact_objective", 0.0)
                row = {
                    "seed": seed,
                    "exact": {"objective_own": exact.objective, "objective": e_obj, "n_iter": exact.n_iter,
                              "stop_reason": exact.stop_reason, "time_s": e_time, "timings": exact.timings,
                              "nmi_true": nmi(y, e_labels)},
                    "cats": {"approximate_distortion": cats.objective, "objective": cats.exact_objective,
                             "n_iter": cats.n_iter, "stop_reason": cats.stop_reason, "time_s": c_time,
                             "timings": cats.timings, "nmi_true": nmi(y, c_labels)},
                    "distortion_ratio": cats.exact_objective / e_obj,
                    "approximate_over_exact": cats.objective / e_obj,
                    "nmi_cats_exact": nmi(e_labels, c_labels),
                }
                rows[(init, l)].append(row)
                print(f"[{name}] init={init} seed={seed} l={l}: ratio {row['distortion_ratio']:.5f} "
                      f"NMI(cats,exact) {row['nmi_cats_exact']:.3f} true NMI exact {row['exact']['nmi_true']:.3f} "
                      f"cats {row['cats']['nmi_true']:.3f} | exact {e_time:.1f} s ({exact.n_iter} it) "
                      f"cats {c_time:.1f} s ({cats.n_iter} it, {cats.stop_reason})", flush=True)
                run.add(case_of(name, X, k, gamma, dtype, build_s, init, l, rows[(init, l)], extra, theta, window))
    del K
    return rows


def case_of(name, X, k, gamma, dtype, build_s, init, l, rows, extra, theta=None, window=None):
    n, d = X.shape
    summary = {
        "exact_distortion": stats(r["exact"]["objective"] for r in rows),
        "exact_distortion_per_point": stats(r["exact"]["objective"] / n for r in rows),
        "cats_distortion": stats(r["cats"]["objective"] for r in rows),
        "cats_distortion_per_point": stats(r["cats"]["objective"] / n for r in rows),
        "cats_approximate_distortion_per_point": stats(r["cats"]["approximate_distortion"] / n for r in rows),
        "distortion_ratio": stats(r["distortion_ratio"] for r in rows),
        "nmi_cats_exact": stats(r["nmi_cats_exact"] for r in rows),
        "nmi_true_exact": stats(r["exact"]["nmi_true"] for r in rows),
        "nmi_true_cats": stats(r["cats"]["nmi_true"] for r in rows),
        "time_exact_s": stats(r["exact"]["time_s"] for r in rows),
        "time_cats_s": stats(r["cats"]["time_s"] for r in rows),
        "n_iter_exact": stats(r["exact"]["n_iter"] for r in rows),
        "n_iter_cats": stats(r["cats"]["n_iter"] for r in rows),
        "time_per_iteration_cats_s": stats(r["cats"]["timings"]["iterations"] / r["cats"]["n_iter"] for r in rows),
        "time_per_iteration_exact_s": stats(r["exact"]["timings"]["iterations"] / r["exact"]["n_iter"] for r in rows),
    }
    suffix = ("" if theta is None else f"-theta{theta:g}") + ("" if window is None else f"-window{window}")
    return {"id": f"{name}-n{n}-{init}-l{l}{suffix}", "benchmark": name, "n": n, "d": d, "k": k, "kernel": "rbf",
            "gamma": gamma, "gamma_rule": "scale: 1 / (d X.var())", "l": l, "init": init,
            "cats_theta": 1e-6 if theta is None else theta, "cats_window": 5 if window is None else window,
            "exact_dtype": dtype, "exact_kernel_build_s": build_s,
            "time_rule": "exact: kernel build (once per data set, counted in every seed) + fit total - validation; "
                         "cats: fit total - exact_objective",
            "seeds": [r["seed"] for r in rows], "summary": summary, "rows": rows, **(extra or {})}


def print_table(rows_by_key, n):
    print(f"\n{'init':>10} {'l':>4} {'ratio mean':>11} {'max':>8} {'NMI(C,E)':>9} {'min':>6} {'tNMI E':>7} "
          f"{'tNMI C':>7} {'t exact s':>10} {'t cats s':>9} {'it E':>5} {'it C':>5} {'D_E/n':>8} {'D_C/n':>8}")
    for (init, l), rows in rows_by_key.items():
        if not rows:
            continue
        r = lambda f: np.mean([f(x) for x in rows])  # noqa: E731
        print(f"{init:>10} {l:>4} {r(lambda x: x['distortion_ratio']):11.5f} "
              f"{max(x['distortion_ratio'] for x in rows):8.5f} {r(lambda x: x['nmi_cats_exact']):9.3f} "
              f"{min(x['nmi_cats_exact'] for x in rows):6.3f} {r(lambda x: x['exact']['nmi_true']):7.3f} "
              f"{r(lambda x: x['cats']['nmi_true']):7.3f} {r(lambda x: x['exact']['time_s']):10.2f} "
              f"{r(lambda x: x['cats']['time_s']):9.2f} {r(lambda x: x['exact']['n_iter']):5.1f} "
              f"{r(lambda x: x['cats']['n_iter']):5.1f} {r(lambda x: x['exact']['objective']) / n:8.5f} "
              f"{r(lambda x: x['cats']['objective']) / n:8.5f}")


def cmd_lsweep(args, run):
    X, y = load_mnist_subset(args.n)
    rows = compare(run, name="lsweep", X=X, y=y, k=10, seeds=list(range(args.seeds)), inits=args.init,
                   ls=[int(v) for v in args.l], exact_dtype_requested=args.exact_dtype, theta=args.theta,
                   window=args.window,
                   extra={"data": f"MNIST, seeded uniform sample (seed 0) of {X.shape[0]} of the 70,000 points, "
                                  "pixels / 255"})
    print_table(rows, X.shape[0])


def cmd_mnist(args, run):
    X, y = load_mnist_subset(args.n)
    n, k = X.shape[0], 10
    l = _cats.default_samples_per_cluster(n, k)
    rows = compare(run, name="mnist", X=X, y=y, k=k, seeds=list(range(args.seeds)), inits=args.init, ls=[l],
                   exact_dtype_requested=args.exact_dtype, theta=args.theta, window=args.window,
                   extra={"data": f"MNIST, {'all 70,000 points' if n >= 70000 else f'{n} of 70,000 (seed 0)'}, "
                                  "pixels / 255", "l_rule": "ceil(sqrt(n / k))"})
    print_table(rows, n)


# ------------------------------------------------------------------------------------------ quality


def cmd_quality(args, run):
    """Shape sets (standardised) and an MNIST sample: protocols "same-starts", "single-start", "n_init"."""
    device = run.device
    sets = {}
    for name in datasets.SHAPE_SETS:
        X, y = datasets.load_shape_set(name)
        sets[name] = ((X - X.mean(axis=0)) / X.std(axis=0), y)
    Xm, ym = load_mnist_subset(args.n)
    sets[f"mnist{Xm.shape[0]}"] = (Xm, ym)
    for name, (X, y) in sets.items():
        k = int(y.max()) + 1
        gamma = default_gamma(X)
        K, _ = build_kernel(X, gamma, device, "float32")
        objective = Objective(X, gamma, device)
        per_seed = []
        for seed in range(args.seeds):
            t0 = time.perf_counter()
            starts = [initial_partition("k-means++", X, k, gamma, seed * 1000 + j, device)
                      for j in range(args.starts)]
            exact = [run_exact(K, k, s, "float32", device) for s in starts]
            cats = [run_cats(X, k, s, gamma, None, seed, device) for s in starts]
            e_obj = [objective(lab, k) for _, lab in exact]
            c_obj = [r.exact_objective for r, _ in cats]
            single = [{"ratio": c / e, "nmi": nmi(el, cl)} for c, e, (_, el), (_, cl) in zip(c_obj, e_obj, exact, cats)]
            be = int(np.argmin([r.objective for r, _ in exact]))   # each method keeps its own lowest objective
            bc = int(np.argmin([r.objective for r, _ in cats]))    # (CATS: approximate distortion), as n_init does
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
                lib_e = kkmgpu.fit(X, k, gamma=gamma, n_init=args.starts, random_state=seed, device=device)
                lib_c = kkmgpu.fit(X, k, gamma=gamma, n_init=args.starts, random_state=seed, device=device,
                                   method="cats", exact_objective=True)
            row = {
                "seed": seed,
                "same_starts": {"ratio": c_obj[bc] / e_obj[be], "nmi": nmi(exact[be][1], cats[bc][1]),
                                "nmi_true_exact": nmi(y, exact[be][1]), "nmi_true_cats": nmi(y, cats[bc][1])},
                "single_start": single,
                "n_init": {"ratio": lib_c.exact_objective / objective(host(lib_e.labels), k),
                           "nmi": nmi(host(lib_e.labels), host(lib_c.labels))},
                "exact_labels": exact[be][1],
                "seconds": time.perf_counter() - t0,
            }
            per_seed.append(row)
            print(f"[quality] {name} seed {seed}: same-starts ratio {row['same_starts']['ratio']:.4f} NMI "
                  f"{row['same_starts']['nmi']:.3f} | single-start max ratio {max(s['ratio'] for s in single):.4f} "
                  f"min NMI {min(s['nmi'] for s in single):.3f} | n_init ratio {row['n_init']['ratio']:.4f} "
                  f"NMI {row['n_init']['nmi']:.3f} ({row['seconds']:.1f} s)", flush=True)
        # context: how much two exact runs from different seeds agree
        between = [nmi(a["exact_labels"], b["exact_labels"]) for i, a in enumerate(per_seed)
                   for b in per_seed[i + 1:]]
        for row in per_seed:
            del row["exact_labels"]
        summary = {
            "same_starts_ratio": stats(r["same_starts"]["ratio"] for r in per_seed),
            "same_starts_nmi": stats(r["same_starts"]["nmi"] for r in per_seed),
            "same_starts_nmi_ge_0.9": sum(r["same_starts"]["nmi"] >= 0.9 for r in per_seed),
            "single_start_ratio": stats(s["ratio"] for r in per_seed for s in r["single_start"]),
            "single_start_nmi": stats(s["nmi"] for r in per_seed for s in r["single_start"]),
            "single_start_ratio_gt_1.01": sum(s["ratio"] > 1.01 for r in per_seed for s in r["single_start"]),
            "n_init_ratio": stats(r["n_init"]["ratio"] for r in per_seed),
            "n_init_nmi": stats(r["n_init"]["nmi"] for r in per_seed),
            "n_init_nmi_ge_0.9": sum(r["n_init"]["nmi"] >= 0.9 for r in per_seed),
            "exact_vs_exact_between_seeds_nmi": stats(between),
            "nmi_true_exact": stats(r["same_starts"]["nmi_true_exact"] for r in per_seed),
            "nmi_true_cats": stats(r["same_starts"]["nmi_true_cats"] for r in per_seed),
        }
        run.add({"id": f"quality-{name}", "benchmark": "quality", "data": name, "n": X.shape[0], "d": X.shape[1],
                 "k": k, "kernel": "rbf", "gamma": gamma, "l": _cats.default_samples_per_cluster(X.shape[0], k),
                 "starts": args.starts, "seeds": list(range(args.seeds)),
                 "protocol": {
                     "same_starts": f"{args.starts} k-means++ partitions per seed; exact (float32 K, tol 1e-6) and "
                                    "CATS (defaults, random_state=seed) from each; each keeps its lowest own "
                                    "objective (CATS: approximate distortion); ratio = exact objective of CATS's "
                                    "partition / exact's (same tiled float32 routine); NMI between the two",
                     "single_start": "the same, for each start separately (no selection)",
                     "n_init": f"the library's own restarts: fit(n_init={args.starts}, random_state=seed) for both "
                               "methods (k-means++; CATS's later starts differ from exact's because its "
                               "sampling draws from the same generator)",
                     "exact_vs_exact_between_seeds_nmi": "NMI between exact's same-starts winners of different "
                                                         "seeds (how much exact agrees with itself)"},
                 "summary": summary, "rows": per_seed})
        s = summary
        print(f"[quality] {name}: same-starts ratio max {s['same_starts_ratio']['max']:.4f}, NMI mean "
              f"{s['same_starts_nmi']['mean']:.3f} min {s['same_starts_nmi']['min']:.3f}; exact-vs-exact NMI mean "
              f"{s['exact_vs_exact_between_seeds_nmi']['mean']:.3f}", flush=True)


# ------------------------------------------------------------------------------------------ scaling


def gaussian_mixture(n, d=784, k=10, seed=0):
    """k Gaussian blobs in d dimensions (unit noise, centres N(0, 0.5^2 I) apart), float32, seeded."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=0.5, size=(k, d)).astype(np.float32)
    X = np.empty((n, d), dtype=np.float32)
    step = 65536
    for i0 in range(0, n, step):
        i1 = min(n, i0 + step)
        X[i0:i1] = centres[rng.integers(0, k, i1 - i0)] + rng.standard_normal((i1 - i0, d), dtype=np.float32)
    return X


def load_birch():
    if not BIRCH_PATH.is_file():
        return None
    table = np.loadtxt(BIRCH_PATH, delimiter=",", skiprows=1, dtype=np.float64)
    X = table[:, :2]
    return ((X - X.mean(axis=0)) / X.std(axis=0)).astype(np.float32)


def time_cats_iterations(X, k, l, iters, rounds, device):
    labels0 = random_partition(X.shape[0], k, np.random.default_rng(0))
    best, fits = math.inf, []
    for _ in range(rounds):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
            r = kkmgpu.fit(X, k, method="cats", n_samples_per_cluster=l, init=labels0, theta=0.0, max_iter=iters,
                           random_state=0, device=device)
        per = r.timings["iterations"] / r.n_iter
        best = min(best, per)
        fits.append({"per_iteration_s": per, "n_iter": r.n_iter, "timings": r.timings})
    return best, fits


def time_exact_iterations(X, k, iters, rounds, device):
    gamma = default_gamma(X)
    K, build_s = build_kernel(X, gamma, device, "float32")
    labels0 = random_partition(X.shape[0], k, np.random.default_rng(0))
    best, fits = math.inf, []
    for _ in range(rounds):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
            r = kkmgpu.fit(K, k, kernel="precomputed", init=labels0, tol=0.0, max_iter=iters, device=device)
        per = r.timings["iterations"] / r.n_iter
        best = min(best, per)
        fits.append({"per_iteration_s": per, "n_iter": r.n_iter, "timings": r.timings})
    del K
    return best, build_s, fits


def slope(ns, ts):
    if len(ns) < 2:
        return None
    return float(np.polyfit(np.log(ns), np.log(ts), 1)[0])


def cmd_scaling(args, run):
    device = run.device
    gpu = device.startswith("cuda")
    sizes = [int(v) for v in args.sizes] if args.sizes else \
        ([10000, 20000, 50000, 100000, 200000, 500000, 1000000] if gpu else [10000, 20000, 50000, 100000])
    exact_sizes = [int(v) for v in args.exact_sizes] if args.exact_sizes else \
        ([10000, 20000, 50000, 100000] if gpu else [10000, 20000, 50000])
    iters, rounds = args.iters, args.rounds
    time_cats_iterations(gaussian_mixture(2000, d=16), 10, 8, 2, 1, device)  # JIT compilation, CUDA context
    birch = load_birch()
    datasets_ = [("gauss784", 10, lambda n: gaussian_mixture(n, seed=0))]
    if birch is not None:
        datasets_.append(("birch1", 100, lambda n: np.ascontiguousarray(birch[:n])))
    else:
        print(f"[scaling] birch1 skipped: {BIRCH_PATH} not found", flush=True)
    for data, k, make in datasets_:
        ns = [n for n in sizes if data != "birch1" or n <= birch.shape[0]]
        series = {}
        for n in ns:
            X = make(n)
            for rule in ("sqrt", "fixed"):
                l = _cats.default_samples_per_cluster(n, k) if rule == "sqrt" else args.fixed_l
                best, fits = time_cats_iterations(X, k, l, iters, rounds, device)
                series.setdefault(rule, []).append((n, best))
                print(f"[scaling] {data} n={n} l={l} ({rule}): {best * 1e3:.1f} ms per iteration", flush=True)
                run.add({"id": f"scaling-cats-{data}-{rule}-n{n}", "benchmark": "scaling_cats", "data": data,
                         "n": n, "d": X.shape[1], "k": k, "l": l, "l_rule": rule, "max_iter": iters, "theta": 0.0,
                         "rounds": rounds, "per_iteration_best_s": best, "fits": fits,
                         "method": "fit(method='cats', init=random partition seed 0, theta=0, max_iter) ; "
                                   "per iteration = timings['iterations'] / n_iter, best of the rounds"})
            if data == "gauss784" and n in exact_sizes:
                need = n * n * 4
                available = free_bytes(device)
                if available is not None and need > 0.8 * available:
                    print(f"[scaling] exact n={n} skipped: K needs {need / 2**30:.1f} GiB", flush=True)
                else:
                    best, build_s, fits = time_exact_iterations(X, k, iters, rounds, device)
                    series.setdefault("exact", []).append((n, best))
                    print(f"[scaling] {data} n={n} exact: {best * 1e3:.1f} ms per iteration, K build {build_s:.1f} s",
                          flush=True)
                    tiles = device == "cpu" and n > SYRK_SAFE_N
                    run.add({"id": f"scaling-exact-{data}-n{n}", "benchmark": "scaling_exact", "data": data, "n": n,
                             "d": X.shape[1], "k": k, "max_iter": iters, "rounds": rounds, "dtype": "float32",
                             "kernel_build": "row tiles of GEMM (kernel_matrix(X, X)): syrk segfaults here" if tiles
                             else "kernel_matrix(X)",
                             "per_iteration_best_s": best, "kernel_build_s": build_s, "fits": fits})
            del X
        fit = {rule: {"slope": slope([n for n, _ in pts], [t for _, t in pts]), "n": [n for n, _ in pts],
                      "per_iteration_s": [t for _, t in pts]} for rule, pts in series.items()}
        for rule, f in fit.items():
            shown = "n/a (fewer than two sizes)" if f["slope"] is None else f"{f['slope']:.3f}"
            print(f"[scaling] {data} {rule}: log-log slope of time per iteration vs n = {shown}", flush=True)
        run.add({"id": f"scaling-fit-{data}", "benchmark": "scaling_fit", "data": data, "n": max(ns), "k": k,
                 "fixed_l": args.fixed_l, "fit": fit,
                 "expected": {"sqrt": "l = ceil(sqrt(n/k)): n^1.5 (delta = 0.5)", "fixed": "fixed l: n^1",
                              "exact": "n^2 (one pass over the n x n matrix)"}})
    if not gpu:
        run.add({"id": "scaling-gpu-1m", "benchmark": "scaling_note", "n": 1000000,
                 "skipped": f"n up to 1,000,000 runs on a GPU only: {_backend.cuda_unavailable_reason()}"})
    png = plot(run.path)
    print(f"[scaling] plot: {png}")


def plot(path: Path, output: Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    document = json.loads(Path(path).read_text())
    cases = document["cases"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), constrained_layout=True)
    for ax, data in zip(axes, ("gauss784", "birch1")):
        styles = {"sqrt": ("o-", "C0", "CATS, l = ceil(sqrt(n/k))"), "fixed": ("s-", "C1", "CATS, fixed l"),
                  "exact": ("^--", "C2", "exact (float32 K)")}
        for rule, (marker, color, label) in styles.items():
            bench = "scaling_exact" if rule == "exact" else "scaling_cats"
            pts = sorted((c["n"], c["per_iteration_best_s"]) for c in cases
                         if c["benchmark"] == bench and c["data"] == data and (rule == "exact" or c["l_rule"] == rule))
            if not pts:
                continue
            ns, ts = zip(*pts)
            s = slope(ns, ts)
            extra = f" (l = {next(c['l'] for c in cases if c['benchmark'] == bench and c.get('l_rule') == rule)})" \
                if rule == "fixed" else ""
            ax.loglog(ns, [t * 1e3 for t in ts], marker, color=color,
                      label=f"{label}{extra}: slope {s:.2f}" if s is not None else label)
        anchor = sorted((c["n"], c["per_iteration_best_s"]) for c in cases if c["benchmark"] == "scaling_cats"
                        and c["data"] == data and c["l_rule"] == "sqrt")
        if len(anchor) >= 2:  # guide lines through the largest n of the l = sqrt(n/k) series
            n_hi, t_hi = anchor[-1]
            grid = np.array([anchor[0][0], n_hi], dtype=float)
            for power, style in ((1.0, ":"), (1.5, "-."), (2.0, "--")):
                ax.loglog(grid, t_hi * 1e3 * (grid / n_hi) ** power, style, color="0.6", linewidth=0.8)
                ax.annotate(f"n^{power:g}", (grid[0], t_hi * 1e3 * (grid[0] / n_hi) ** power), fontsize=7,
                            color="0.4", ha="left", va="bottom")
        ax.set_xlabel("n")
        ax.set_ylabel("time per iteration (ms)")
        d = next((c["d"] for c in cases if c.get("data") == data and "d" in c), "?")
        k = next((c["k"] for c in cases if c.get("data") == data and "k" in c), "?")
        ax.set_title(f"{data} (d = {d}, k = {k}) on {document['device_name']}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    output = output or Path(path).with_name(Path(path).stem + "-scaling.png")
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


# ------------------------------------------------------------------------------------------ main


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="bench_cats.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("--device", default=os.environ.get("KKMGPU_BENCH_CATS_DEVICE") or default_device(),
                       help="cpu, cuda or cuda:N (default: $KKMGPU_BENCH_CATS_DEVICE, else cuda where usable)")
        p.add_argument("--results-dir", default=None,
                       help="default $KKMGPU_BENCH_RESULTS_DIR, else bench/results")
        return p

    seeds = env_int("KKMGPU_BENCH_CATS_SEEDS", 10)
    inits = env_list("KKMGPU_BENCH_CATS_INIT", None)
    p = common(sub.add_parser("quality", help="shape sets + MNIST sample, three protocols"))
    p.add_argument("--n", type=int, default=env_int("KKMGPU_BENCH_CATS_QUALITY_N", 3000),
                   help="MNIST sample size ($KKMGPU_BENCH_CATS_QUALITY_N, default 3000)")
    p.add_argument("--seeds", type=int, default=seeds, help="$KKMGPU_BENCH_CATS_SEEDS, default 10")
    p.add_argument("--starts", type=int, default=5, help="k-means++ starts per seed (default 5)")
    p = common(sub.add_parser("lsweep", help="l = 8, 16, 33, 66 on an MNIST sample"))
    p.add_argument("--n", type=int, default=env_int("KKMGPU_BENCH_CATS_SWEEP_N", 10000),
                   help="MNIST sample size ($KKMGPU_BENCH_CATS_SWEEP_N, default 10000: sqrt(n/k) = 32)")
    p.add_argument("--seeds", type=int, default=seeds, help="$KKMGPU_BENCH_CATS_SEEDS, default 10")
    p.add_argument("--l", nargs="+", default=["8", "16", "33", "66"])
    p.add_argument("--init", nargs="+", default=inits or ["k-means++", "random"],
                   help="initial partitions ($KKMGPU_BENCH_CATS_INIT, comma list; default k-means++ random)")
    p.add_argument("--exact-dtype", default=os.environ.get("KKMGPU_BENCH_CATS_EXACT_DTYPE", "auto"))
    p = common(sub.add_parser("mnist", help="MNIST (all 70,000 points by default), CATS vs exact"))
    p.add_argument("--n", type=int, default=env_int("KKMGPU_BENCH_CATS_N", 70000),
                   help="$KKMGPU_BENCH_CATS_N, default 70000")
    p.add_argument("--seeds", type=int, default=seeds, help="$KKMGPU_BENCH_CATS_SEEDS, default 10")
    p.add_argument("--init", nargs="+", default=inits or ["k-means++"],
                   help="$KKMGPU_BENCH_CATS_INIT (comma list), default k-means++")
    p.add_argument("--exact-dtype", default=os.environ.get("KKMGPU_BENCH_CATS_EXACT_DTYPE", "auto"),
                   help="storage of the exact method's K: auto (float32 where it fits 80%% of the free memory, "
                        "else float16: MNIST-70k on a 24 GiB host), float32, float16 "
                        "($KKMGPU_BENCH_CATS_EXACT_DTYPE)")
    for name in ("lsweep", "mnist"):
        p = sub.choices[name]
        p.add_argument("--theta", type=float, default=None, help="CATS's theta (default: the library's, 1e-6)")
        p.add_argument("--window", type=int, default=None, help="CATS's window (default: the library's, 5)")
    p = common(sub.add_parser("scaling", help="CATS time per iteration vs n, log-log slope, PNG"))
    p.add_argument("--sizes", nargs="+", default=env_list("KKMGPU_BENCH_CATS_SIZES", None),
                   help="n values ($KKMGPU_BENCH_CATS_SIZES; default 10k..100k on the CPU, 10k..1M on a GPU)")
    p.add_argument("--exact-sizes", nargs="+", default=env_list("KKMGPU_BENCH_CATS_EXACT_SIZES", None),
                   help="n values of the exact comparison (default 10k, 20k, 50k on the CPU; to 100k on a GPU)")
    p.add_argument("--iters", type=int, default=env_int("KKMGPU_BENCH_CATS_ITERS", 5))
    p.add_argument("--rounds", type=int, default=env_int("KKMGPU_BENCH_CATS_ROUNDS", 2))
    p.add_argument("--fixed-l", type=int, default=32)
    p = sub.add_parser("plot", help="the scaling PNG of a result file")
    p.add_argument("path", type=Path)
    p.add_argument("-o", "--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.command == "plot":
        print(plot(args.path, args.output))
        return 0
    if args.device.startswith("cuda") and _backend.cuda_unavailable_reason() is not None:
        parser.error(f"--device {args.device}: {_backend.cuda_unavailable_reason()}")
    if hasattr(args, "init"):
        args.init = [item for value in args.init for item in value.split(",") if item]
    run = Run(args.device, argv, args.results_dir)
    print(f"results: {run.path}", flush=True)
    {"quality": cmd_quality, "lsweep": cmd_lsweep, "mnist": cmd_mnist, "scaling": cmd_scaling}[args.command](args, run)
    run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
