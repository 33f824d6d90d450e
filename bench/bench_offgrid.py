"""Off-the-grid benchmarks: the paper's Tables 2-4 and Figure 1 (papers/off-the-grid-bandwidth-search.txt, §7).

A script, not a pytest module (``pytest bench/`` collects nothing here). From the repository root::

    python bench/bench_offgrid.py table2   # best NMI / c-NNC and total time of MKNN, GRIDSEARCH, OURS (Tables 2, 3)
    python bench/bench_offgrid.py table4   # Algorithm 2 (depth 10) vs binary search (precision 1e-3) (Table 4)
    python bench/bench_offgrid.py fig1     # time per iteration on MNIST samples, 13 iterations per method (Figure 1)
    python bench/bench_offgrid.py all      # the three in turn
    python bench/bench_offgrid.py plot FILE    # the PNGs of a result file again
    python bench/bench_offgrid.py report FILE  # markdown tables of a result file, the paper's figures in brackets

The committed CPU run (bench/README.md): ``table2 --threads 1 --partitions 30``, ``table4 --threads 1 --chain 3``,
``fig1 --threads 1 --sizes 1000 2000 4000 8000 --runs 2`` and ``fig1 --threads 1 --sizes 16000 --runs 1``.

Every subcommand merges its cases into ``bench/results/<YYYY-MM-DD>-<device>-offgrid.json`` (schema
"kkmgpu-bench-offgrid/1", described in bench/README.md, section "Off-the-grid"); a case with the same id is
replaced, the file is rewritten after every case. ``--device`` (default: cuda where a GPU is usable, else cpu)
picks the device; CuPy is imported only through ``kkmgpu.backend.device``. ``--quick`` scales the repeats down for a
smoke run (the committed run uses the defaults: 10 partitions for table2, 10 repeats for table4).

Data (bench/README.md lists what the paper used and we lack): the five SIPU shape sets as they are, and the real
sets WiFi (UCI wireless indoor localization), Wine and WDBC (scikit-learn's copies) scaled to unit variance, as
the paper does. RBF kernel in the paper's convention k(x, y) = exp(-||x - y||^2 / sigma), gamma = 1 / sigma.
"""

from __future__ import annotations

import argparse
import json
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
from kkmgpu._progress import progress_bar  # noqa: E402

SCHEMA = "kkmgpu-bench-offgrid/1"
DEFAULT_RESULTS_DIR = BENCH_DIR / "results"
WIFI_PATH = REPO_ROOT / ".." / "shared" / "data" / "uci" / "wifi_localization.csv"
SETS = ("aggregation", "compound", "flame", "jain", "r15", "wifi", "wine", "wdbc")
PATH_PLOT_SET = "aggregation"
FIG1_ITERATIONS = 13  # the number of values GRIDSEARCH tests; the paper runs every method for 13 iterations
GPU_FIG1_COMMAND = ("python bench/bench_offgrid.py fig1 --device cuda --sizes 1000 2000 4000 8000 16000 32000 "
                    "--runs 5")

# --- the paper's numbers (Tables 2-4), keyed by our set names; sets we do not have are kept for the record
PAPER_NAMES = {"aggregation": "AGGR.", "compound": "COMPOUND", "flame": "FLAME", "jain": "JAIN", "r15": "R15",
               "wifi": "WiFi", "wine": "WINE", "wdbc": "WDBC", "d31": "D31", "pathbased": "PATHBASED",
               "spiral": "SPIRAL", "audit": "AUDIT", "dermatology": "DERMA."}
PAPER_TABLE2 = {  # NMI (MKNN, GRIDSEARCH, OURS), c-NNC (MKNN, GRIDSEARCH, OURS); mean over 50 partitions
    "aggregation": {"nmi": (0.690, 0.864, 0.872), "cnnc": (0.255, 0.210, 0.203)},
    "compound": {"nmi": (0.689, 0.778, 0.730), "cnnc": (0.239, 0.230, 0.215)},
    "d31": {"nmi": (0.810, 0.931, 0.951), "cnnc": (0.356, 0.332, 0.316)},
    "flame": {"nmi": (0.489, 0.521, 0.615), "cnnc": (0.106, 0.096, 0.093)},
    "jain": {"nmi": (0.229, 0.361, 0.353), "cnnc": (0.116, 0.062, 0.062)},
    "pathbased": {"nmi": (0.820, 0.662, 0.902), "cnnc": (0.169, 0.134, 0.137)},
    "r15": {"nmi": (0.922, 0.954, 0.979), "cnnc": (0.302, 0.300, 0.274)},
    "spiral": {"nmi": (0.187, 0.145, 0.239), "cnnc": (0.175, 0.155, 0.151)},
    "audit": {"nmi": (0.717, 0.685, 0.703), "cnnc": (0.097, 0.082, 0.082)},
    "dermatology": {"nmi": (0.889, 0.877, 0.913), "cnnc": (0.249, 0.256, 0.238)},
    "wdbc": {"nmi": (0.531, 0.547, 0.550), "cnnc": (0.123, 0.108, 0.107)},
    "wifi": {"nmi": (0.781, 0.835, 0.856), "cnnc": (0.157, 0.140, 0.137)},
    "wine": {"nmi": (0.923, 0.913, 0.923), "cnnc": (0.143, 0.142, 0.143)},
}
PAPER_TABLE3 = {  # total running time in seconds (MKNN, GRIDSEARCH, OURS), the paper's CPU implementation
    "aggregation": (0.824, 0.486, 0.617), "compound": (0.200, 0.146, 0.172), "d31": (22.029, 11.735, 10.757),
    "flame": (0.064, 0.046, 0.061), "jain": (0.140, 0.097, 0.143), "pathbased": (0.110, 0.077, 0.094),
    "r15": (0.475, 0.329, 0.406), "spiral": (0.157, 0.108, 0.133), "audit": (0.578, 0.467, 1.111),
    "dermatology": (0.152, 0.106, 0.100), "wdbc": (0.325, 0.204, 0.213), "wifi": (7.095, 3.520, 4.402),
    "wine": (0.044, 0.034, 0.036),
}
PAPER_TABLE4 = {  # iteration time binary, ours (s); speed-up; relative sigma error ours, binary
    "aggregation": (0.941, 0.080, 11.7, 1.55e-3, 5.3e-4), "audit": (0.793, 0.069, 11.5, 8.341e-2, 5.8e-4),
    "compound": (0.192, 0.019, 9.9, 2.20e-3, 5.8e-4), "d31": (15.740, 1.148, 13.7, 3.95e-3, 4.8e-4),
    "dermatology": (0.139, 0.014, 9.7, 1.3e-4, 8.368e-2), "flame": (0.063, 0.007, 9.1, 5.1e-3, 5.6e-4),
    "jain": (0.144, 0.014, 10.5, 2.6e-3, 1.17e-2), "pathbased": (0.096, 0.010, 9.7, 1.98e-3, 5.9e-4),
    "r15": (0.430, 0.039, 11.0, 4.912e-2, 5.5e-4), "spiral": (0.102, 0.011, 9.6, 1.13e-3, 6.2e-4),
    "wdbc": (0.398, 0.036, 11.2, 1e-6, 6.2e-4), "wifi": (5.284, 0.442, 11.9, 6e-5, 4.9e-4),
    "wine": (0.042, 0.005, 7.7, 2e-5, 5.7e-4),
}
PAPER = {
    "table2": {"columns": ["MKNN", "GRIDSEARCH", "OURS"], "values": PAPER_TABLE2,
               "protocol": "best NMI / best c-NNC among each method's clusterings, mean over 50 random initial "
                           "partitions (the same partition for the three methods)"},
    "table3": {"columns": ["MKNN", "GRIDSEARCH", "OURS"], "values": PAPER_TABLE3,
               "protocol": "mean total running time of the table-2 experiment, seconds, the authors' Python CPU code"},
    "table4": {"columns": ["binary_iteration_s", "ours_iteration_s", "speedup", "relative_error_ours",
                           "relative_error_binary"], "values": PAPER_TABLE4,
               "protocol": "sigma starts at the 1st percentile of squared pairwise distances; binary search with "
                           "precision 1e-3 vs Algorithm 2 with depth 10; 10 repeats; the caption says 'over 100 "
                           "iterations'. Relative error (sigma_true - sigma_est) / sigma_true; the table's header "
                           "is garbled in the text copy: the first error column is read as OURS, the second as "
                           "BINARYSEARCH (its values sit near precision / 2, as a bisection's would)"},
    "figure1": {"note": "time per iteration (produce and test one sigma) on MNIST samples of 1k, 2k, 4k, 8k points, "
                        "13 iterations per method, mean over 50 runs; only the curve is published, no numbers"},
}


def env_int(name, default):
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


# ------------------------------------------------------------------------------------------ devices, files


def default_device() -> str:
    if os.environ.get("KKMGPU_DEVICE", "").strip().lower() == "cpu":
        return "cpu"
    return "cuda" if _backend.cuda_unavailable_reason() is None else "cpu"


def synchronize(device):
    if device.startswith("cuda"):
        _backend.import_cupy().cuda.Device().synchronize()


def Run(device, argv, results_dir=None):
    """This invocation's cases, merged into <date>-<device>-offgrid.json (``_kkmgpu_bench.ScriptRun``), with the
    load average after every case and the CPU time other processes used during the run."""
    from _kkmgpu_bench import ForeignCpu, ScriptRun

    class OffgridRun(ScriptRun):
        def __init__(self):
            super().__init__(device, argv, script="bench/bench_offgrid.py", topic="offgrid", schema=SCHEMA,
                             results_dir=results_dir, document_extra={"paper": PAPER},
                             versions_extra={"scikit_learn": _sklearn_version()})
            self.foreign = ForeignCpu()

        def case_extra(self):
            return {"load_average_at_end": list(os.getloadavg())}

        def meta_extra(self):
            return {"cpu_use_during_run": self.foreign.seconds()}

    return OffgridRun()


def _sklearn_version():
    try:
        import sklearn

        return sklearn.__version__
    except ImportError:
        return None


# ------------------------------------------------------------------------------------------ data


def standardise(X):
    """Every column to zero mean and unit variance (constant columns are left at zero)."""
    X = np.asarray(X, dtype=np.float64)
    std = X.std(axis=0)
    return (X - X.mean(axis=0)) / np.where(std > 0, std, 1.0)


def load_set(name):
    """(X float64, y int64 0..k-1, description) of one benchmark set."""
    if name in datasets.SHAPE_SETS:
        X, y = datasets.load_shape_set(name)
        return X, y, f"SIPU shape set {name}, raw coordinates"
    if name == "wifi":
        table = datasets.load_array(WIFI_PATH)
        y = table[:, -1].astype(np.int64)
        return standardise(table[:, :-1]), y - y.min(), "UCI wireless indoor localization, unit variance"
    from sklearn import datasets as skd  # scikit-learn is a benchmark (test-extra) dependency only

    if name == "wine":
        X, y = skd.load_wine(return_X_y=True)
        return standardise(X), y.astype(np.int64), "scikit-learn load_wine (UCI Wine), unit variance"
    if name == "wdbc":
        X, y = skd.load_breast_cancer(return_X_y=True)
        return standardise(X), y.astype(np.int64), "scikit-learn load_breast_cancer (UCI WDBC), unit variance"
    raise ValueError(f"unknown set {name!r}; use one of {SETS}")


def load_mnist_subset(n):
    from _kkmgpu_bench import mnist_dir

    X, y = datasets.load_mnist(mnist_dir(), n_samples=n, random_state=0)
    return np.ascontiguousarray(X, dtype=np.float64), y


def random_partition(n, k, seed):
    """The paper's random initial k-partition: uniform labels, k random points fixed to 0..k-1 (none empty)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n).astype(np.int32)
    labels[rng.permutation(n)[:k]] = np.arange(k, dtype=np.int32)
    return labels


def squared_distance_percentile(X, q=1.0):
    """The q-th percentile of the squared pairwise distances over pairs i < j (float64, exact for n <= 20k)."""
    from scipy.spatial.distance import pdist

    return float(np.percentile(pdist(X, "sqeuclidean"), q))


def sampled_squared_distance_percentile(X, seed, q=1.0, pairs=1_000_000, chunk=20_000):
    """The q-th percentile of the squared distances of ``pairs`` random pairs i != j (seeded), in chunks.

    The rule search_bandwidth(sigma0="percentile") applies above 4 million pairs, computed here without its
    pairs x d temporaries (1M x 784 float64 = 6.3 GB each, over the 4 GB per-process rule of this machine).
    """
    rng = np.random.default_rng(seed)
    n = X.shape[0]
    i = rng.integers(0, n, size=pairs)
    j = rng.integers(0, n - 1, size=pairs)
    j = j + (j >= i)
    d = np.empty(pairs)
    for a in range(0, pairs, chunk):
        diff = X[i[a:a + chunk]] - X[j[a:a + chunk]]
        d[a:a + chunk] = np.einsum("ij,ij->i", diff, diff)
    return float(np.percentile(d, q))


def host(a):
    return np.asarray(a.get() if hasattr(a, "get") else a)


def stats(values):
    a = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if a.size == 0:
        return None
    return {"mean": float(a.mean()), "std": float(a.std(ddof=1)) if a.size > 1 else 0.0,
            "min": float(a.min()), "max": float(a.max()), "count": int(a.size)}


# ------------------------------------------------------------------------------------------ the API under test


def bandwidth_api():
    """kkmgpu.bandwidth (the search under test), with a clear message when this checkout does not have it yet."""
    try:
        from kkmgpu import bandwidth
    except ImportError as exc:
        raise SystemExit(f"kkmgpu.bandwidth cannot be imported ({exc}); the Off-the-grid benchmarks need it.")
    return bandwidth


def warm_up(bw, device):
    """Every timed function once on a small problem, so no figure includes numba compilation."""
    rng = np.random.default_rng(12345)
    X = np.concatenate([rng.normal(size=(30, 3)), rng.normal(size=(30, 3)) + 4.0])
    labels0 = random_partition(60, 2, seed=0)
    for dtype in ("float64", "float32"):
        for method in METHODS:
            run_method(bw, method, X, 2, labels0, None, device, 0, dtype=dtype, n_values=3)
    sigma = squared_distance_percentile(X, 1.0)
    labels = converge(X, 2, labels0, sigma, device)
    timed(bw.critical_bandwidth, X, labels, sigma=sigma, depth=10, device=device)
    timed(bw.binary_search_critical_bandwidth, X, labels, sigma=sigma, precision=1e-3, sigma_max=1e6, device=device)
    timed(bw.binary_search_critical_bandwidth, X, labels, sigma=sigma, precision=1e-300, rtol=1e-10, device=device)


def timed(fn, *args, **kwargs):
    """(fn(*args, **kwargs), wall seconds), the device synchronised before and after."""
    device = kwargs.get("device", "cpu")
    synchronize(device)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        warnings.simplefilter("ignore", UserWarning)  # e.g. MKNN's dropped zero bandwidths; results record them
        result = fn(*args, **kwargs)
    synchronize(device)
    return result, time.perf_counter() - t0


# ------------------------------------------------------------------------------------------ table 2 (and 3)

METHODS = ("mknn", "grid", "ours")
METHOD_LABELS = {"mknn": "MKNN", "grid": "GRIDSEARCH", "ours": "OURS"}


def run_method(bw, method, X, k, labels0, y, device, seed, dtype="float64", n_values=None, sigma0="percentile"):
    """One search from the initial partition ``labels0``; ``n_values`` caps it at that many sigma values
    (Figure 1: MKNN with that many neighbour ranks, GRIDSEARCH's 13 values, OURS with max_values)."""
    common = dict(init=labels0, y_true=y, device=device, random_state=seed, dtype=dtype)
    if method == "mknn":
        return timed(bw.search_mknn, X, k, n_neighbors=n_values, **common)
    if method == "grid":
        sigmas = bw.GRID_SIGMAS if n_values is None else bw.GRID_SIGMAS[:n_values]
        return timed(bw.search_grid, X, k, sigmas=sigmas, **common)
    return timed(bw.search_bandwidth, X, k, sigma0=sigma0, depth=1, refine_depth=2,
                 max_values=50 if n_values is None else n_values, **common)


def summarise_search(result, seconds):
    clusterings = list(result.clusterings)
    nmis = [c.nmi for c in clusterings if c.nmi is not None]
    cnncs = [c.cnnc for c in clusterings if c.cnnc is not None]
    timings = {key: float(value) for key, value in dict(result.timings).items() if isinstance(value, (int, float))}
    return {
        "seconds": seconds,
        "seconds_without_scoring": seconds - timings.get("scoring", 0.0),
        "seconds_producing_and_running": sum(timings.get(key, 0.0) for key in ("kernel_build", "walk",
                                                                                "kernel_kmeans")),
        "n_clusterings": len(clusterings),
        "n_values": len(result.evaluations),
        "best_nmi": max(nmis) if nmis else None,
        "best_cnnc": min(cnncs) if cnncs else None,
        "sigmas": [float(c.sigma) for c in clusterings],
        "nmi": nmis, "cnnc": cnncs,
        "n_iter": [int(c.n_iter) for c in clusterings],
        "timings": timings,
        "costs": dict(result.costs),
        "warnings": list(result.warnings),
    }


def cmd_table2(args, run, bw):
    device = run.device
    bar = progress_bar(len(args.sets) * args.partitions, desc="table2", unit="partition", enabled=args.progress)
    for name in args.sets:
        X, y, description = load_set(name)
        n, k = X.shape[0], int(y.max()) + 1
        rows = []
        for p in range(args.partitions):
            labels0 = random_partition(n, k, seed=p)
            row = {"partition_seed": p}
            for method in METHODS:
                result, seconds = run_method(bw, method, X, k, labels0, y, device, p)
                row[method] = summarise_search(result, seconds)
            rows.append(row)
            bar.update()
            bar.write(f"[table2] {name} partition {p}: " + " | ".join(
                f"{METHOD_LABELS[m]} NMI {row[m]['best_nmi']:.3f} c-NNC {row[m]['best_cnnc']:.3f} "
                f"{row[m]['seconds']:.2f} s ({row[m]['n_clusterings']} distinct of {row[m]['n_values']} runs)"
                for m in METHODS))
        summary = {m: {"best_nmi": stats(r[m]["best_nmi"] for r in rows),
                       "best_cnnc": stats(r[m]["best_cnnc"] for r in rows),
                       "seconds": stats(r[m]["seconds"] for r in rows),
                       "n_clusterings": stats(r[m]["n_clusterings"] for r in rows)} for m in METHODS}
        paper2, paper3 = PAPER_TABLE2.get(name), PAPER_TABLE3.get(name)
        run.add({"id": f"table2-{name}", "benchmark": "table2", "data": name, "description": description,
                 "n": n, "d": X.shape[1], "k": k, "partitions": args.partitions,
                 "protocol": "per partition seed p: random_partition(n, k, seed=p) handed as init= to "
                             "search_mknn, search_grid and search_bandwidth(sigma0='percentile', depth=1, "
                             "refine_depth=2); best NMI (max) and best c-NNC (min) among each method's "
                             "clusterings; seconds = wall time of the whole search call (kernel builds, kernel "
                             "k-means runs and the NMI / c-NNC evaluation of every clustering included)",
                 "summary": summary,
                 "paper": None if paper2 is None else {"nmi": dict(zip(METHODS, paper2["nmi"])),
                                                        "cnnc": dict(zip(METHODS, paper2["cnnc"])),
                                                        "seconds": dict(zip(METHODS, paper3))},
                 "rows": rows})
        print_table2_line(name, summary)
        if name == PATH_PLOT_SET:
            print(f"[table2] path plot: {plot_path(run.path, name)}", flush=True)
    bar.close()


def print_table2_line(name, summary):
    p2, p3 = PAPER_TABLE2.get(name), PAPER_TABLE3.get(name)
    ours = " ".join(f"{summary[m]['best_nmi']['mean']:.3f}" for m in METHODS)
    oursc = " ".join(f"{summary[m]['best_cnnc']['mean']:.3f}" for m in METHODS)
    ourt = " ".join(f"{summary[m]['seconds']['mean']:.3f}" for m in METHODS)
    paper = "" if p2 is None else (f" | paper NMI {' '.join(f'{v:.3f}' for v in p2['nmi'])} c-NNC "
                                   f"{' '.join(f'{v:.3f}' for v in p2['cnnc'])} s {' '.join(f'{v:.3f}' for v in p3)}")
    print(f"[table2] {name}: NMI {ours} c-NNC {oursc} s {ourt} (MKNN GRID OURS){paper}", flush=True)


# ------------------------------------------------------------------------------------------ table 4


def converge(X, k, labels0, sigma, device):
    """Kernel k-means at sigma from labels0 to a fixed point (tol=0: only 'no point moved' stops it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        r = kkmgpu.fit(X, k, kernel="rbf", gamma=1.0 / sigma, init=labels0, dtype="float64", tol=0.0, max_iter=1000,
                       device=device)
    return host(r.labels).astype(np.int32)


def _search_row(result, seconds, true):
    est = float(result.sigma)
    return {"sigma": est, "lower": float(result.lower), "upper": float(result.upper), "seconds": seconds,
            "search_s": float(result.timings["search"]), "n_steps": int(result.n_steps),
            "n_full_checks": int(result.n_full_checks), "n_limited_checks": int(result.n_limited_checks),
            "relative_error": (true - est) / true, "reason": result.reason}


def cmd_table4(args, run, bw):
    device = run.device
    bar = progress_bar(len(args.sets) * args.repeats, desc="table4", unit="repeat", enabled=args.progress)
    for name in args.sets:
        X, y, description = load_set(name)
        n, k = X.shape[0], int(y.max()) + 1
        sigma0 = squared_distance_percentile(X, 1.0)
        rows, skipped = [], []
        for r in range(args.repeats):
            bar.update()
            sigma = sigma0
            labels = converge(X, k, random_partition(n, k, seed=1000 + r), sigma, device)
            for it in range(args.chain):
                reference, t_ref = timed(bw.binary_search_critical_bandwidth, X, labels, sigma=sigma,
                                         precision=1e-300, rtol=args.reference_rtol, device=device)
                true = float(reference.sigma)
                if reference.lower == 0.0 or not np.isfinite(true):
                    skipped.append({"repeat": r, "iteration": it, "sigma_start": sigma, "reason": reference.reason
                                    or "no critical value below the cap"})
                    print(f"[table4] {name} repeat {r} iteration {it}: skipped ({skipped[-1]['reason']})", flush=True)
                    break
                ours, t_ours = timed(bw.critical_bandwidth, X, labels, sigma=sigma, depth=10, device=device)
                binary, t_binary = timed(bw.binary_search_critical_bandwidth, X, labels, sigma=sigma, precision=1e-3,
                                         sigma_max=args.binary_sigma_max, device=device)
                row = {"repeat": r, "iteration": it, "sigma_start": sigma, "sigma_true": true,
                       "ours": _search_row(ours, t_ours, true), "binary": _search_row(binary, t_binary, true),
                       "reference": {"sigma": true, "lower": float(reference.lower), "upper": float(reference.upper),
                                     "seconds": t_ref, "n_steps": int(reference.n_steps)}}
                rows.append(row)
                print(f"[table4] {name} repeat {r} iteration {it}: sigma {sigma:.6g} -> true {true:.10g}; ours "
                      f"{row['ours']['sigma']:.8g} ({t_ours * 1e3:.1f} ms, {row['ours']['n_steps']} steps, rel err "
                      f"{row['ours']['relative_error']:.2e}); binary {row['binary']['sigma']:.8g} "
                      f"({t_binary * 1e3:.1f} ms, {row['binary']['n_steps']} probes, rel err "
                      f"{row['binary']['relative_error']:.2e})", flush=True)
                if it + 1 < args.chain:  # the next search starts from the clustering just past the critical value
                    sigma = float(reference.upper)
                    labels = converge(X, k, labels, sigma, device)
        if not rows:
            run.add({"id": f"table4-{name}", "benchmark": "table4", "data": name, "n": n, "skipped": skipped})
            continue

        def mean_of(key, field):
            return stats(row[key][field] for row in rows)

        summary = {
            "iterations": len(rows),
            "ours_iteration_s": mean_of("ours", "seconds"), "binary_iteration_s": mean_of("binary", "seconds"),
            "ours_search_s": mean_of("ours", "search_s"), "binary_search_s": mean_of("binary", "search_s"),
            "speedup_of_means": float(np.mean([r["binary"]["seconds"] for r in rows])
                                      / np.mean([r["ours"]["seconds"] for r in rows])),
            "speedup_of_means_search_only": float(np.mean([r["binary"]["search_s"] for r in rows])
                                                  / np.mean([r["ours"]["search_s"] for r in rows])),
            "relative_error_ours": stats(abs(r["ours"]["relative_error"]) for r in rows),
            "relative_error_binary": stats(abs(r["binary"]["relative_error"]) for r in rows),
            "signed_relative_error_ours": mean_of("ours", "relative_error"),
            "signed_relative_error_binary": mean_of("binary", "relative_error"),
            "steps_ours": mean_of("ours", "n_steps"), "probes_binary": mean_of("binary", "n_steps"),
            "ours_error_above_bound": sum(abs(r["ours"]["relative_error"]) > 2.0 ** (1 - 10) * (1 + 1e-9)
                                          for r in rows),
        }
        paper = PAPER_TABLE4.get(name)
        run.add({"id": f"table4-{name}", "benchmark": "table4", "data": name, "description": description,
                 "n": n, "d": X.shape[1], "k": k, "sigma0": sigma0, "repeats": args.repeats, "chain": args.chain,
                 "binary_sigma_max": args.binary_sigma_max, "reference_rtol": args.reference_rtol,
                 "protocol": "sigma0 = 1st percentile of squared pairwise distances (pairs i < j); per repeat r a "
                             "random partition (seed 1000 + r) converged by kernel k-means at sigma0 (float64, tol=0); "
                             "then from the same (X, labels, sigma): critical_bandwidth(depth=10) (OURS) and "
                             "binary_search_critical_bandwidth(precision=1e-3 absolute, sigma_max="
                             f"{args.binary_sigma_max:g}) (BINARYSEARCH); the true value is "
                             "binary_search_critical_bandwidth(rtol=" f"{args.reference_rtol:g}" ", bracket found by "
                             "doubling); with chain > 1 the next search starts from the partition converged at the "
                             "true value's upper end. seconds = wall time of one call from X (validation, kernel "
                             "build, search); search_s = its timings['search'] (the walk / the bisection alone). "
                             "relative error = (true - estimate) / true; summaries over |.|",
                 "summary": summary,
                 "paper": None if paper is None else dict(zip(PAPER["table4"]["columns"], paper)),
                 "rows": rows, "skipped": skipped})
        print(f"[table4] {name}: iteration binary {summary['binary_iteration_s']['mean'] * 1e3:.1f} ms, ours "
              f"{summary['ours_iteration_s']['mean'] * 1e3:.1f} ms, speed-up {summary['speedup_of_means']:.1f}x "
              f"(search only {summary['speedup_of_means_search_only']:.1f}x); |rel err| ours "
              f"{summary['relative_error_ours']['mean']:.2e} binary {summary['relative_error_binary']['mean']:.2e}"
              + ("" if paper is None else f" | paper {paper[0]:.3f} s / {paper[1]:.3f} s = {paper[2]}x, "
                                          f"err {paper[3]:.2e} / {paper[4]:.2e}"), flush=True)


# ------------------------------------------------------------------------------------------ figure 1


def cmd_fig1(args, run, bw):
    from _kkmgpu_bench import ForeignCpu

    from kkmgpu.metrics import cnnc as _cnnc

    device = run.device
    # score every clustering of a search from one neighbour sort (kept order: n (n - 1) int32)
    _cnnc.KEEP_ORDER_BYTES_CPU = _cnnc.KEEP_ORDER_BYTES_GPU = int(args.cnnc_keep_bytes)
    bar = progress_bar(len(args.sizes) * args.runs, desc="fig1", unit="run", enabled=args.progress)
    for n in args.sizes:
        kept = n * (n - 1) * 4 if n * (n - 1) * 4 <= args.cnnc_keep_bytes else 0
        need = 2 * n * n * 4 + kept + n * 784 * 8 * 3  # K and K' (or K and -D/2) in float32, the kept order, X
        if device == "cpu" and need > args.max_bytes:
            print(f"[fig1] n={n} skipped: about {need / 2**30:.2f} GiB exceeds --max-bytes "
                  f"{args.max_bytes / 2**30:.2f} GiB", flush=True)
            run.add({"id": f"fig1-{device}-n{n}", "benchmark": "fig1", "n": n,
                     "skipped": f"about {need} bytes (two n x n float32 matrices, the kept c-NNC neighbour order, X) "
                                f"exceed this run's limit of {int(args.max_bytes)} bytes"})
            continue
        X, y = load_mnist_subset(n)
        k = 10
        t0 = time.perf_counter()
        sigma0 = sampled_squared_distance_percentile(X, seed=0)
        sigma0_seconds = time.perf_counter() - t0
        rows = []
        for r in range(args.runs):
            bar.update()
            labels0 = random_partition(n, k, seed=r)
            row = {"run": r}
            for method in METHODS:
                busy = ForeignCpu()
                result, seconds = run_method(bw, method, X, k, labels0, y, device, r, dtype="float32",
                                             n_values=FIG1_ITERATIONS, sigma0=sigma0)
                s = summarise_search(result, seconds)
                s["per_iteration_s"] = seconds / max(1, s["n_values"])
                s["per_iteration_without_scoring_s"] = s["seconds_without_scoring"] / max(1, s["n_values"])
                s["per_iteration_core_s"] = s["seconds_producing_and_running"] / max(1, s["n_values"])
                s["cpu_use"] = busy.seconds()
                row[method] = s
            rows.append(row)
            print(f"[fig1] n={n} run {r}: " + " | ".join(
                f"{METHOD_LABELS[m]} {row[m]['per_iteration_core_s'] * 1e3:.0f} ms/it core, "
                f"{row[m]['per_iteration_without_scoring_s'] * 1e3:.0f} w/o scoring, "
                f"{row[m]['per_iteration_s'] * 1e3:.0f} wall ({row[m]['n_values']} values, "
                f"{row[m]['n_clusterings']} distinct, {row[m]['seconds']:.1f} s)" for m in METHODS), flush=True)
        summary = {m: {"per_iteration_s": stats(r[m]["per_iteration_s"] for r in rows),
                       "per_iteration_core_s": stats(r[m]["per_iteration_core_s"] for r in rows),
                       "per_iteration_without_scoring_s": stats(r[m]["per_iteration_without_scoring_s"] for r in rows),
                       "seconds": stats(r[m]["seconds"] for r in rows),
                       "n_values": stats(r[m]["n_values"] for r in rows),
                       "n_clusterings": stats(r[m]["n_clusterings"] for r in rows),
                       "kernel_kmeans_iterations": stats(r[m]["costs"]["kernel_kmeans_iterations"] for r in rows),
                       "best_nmi": stats(r[m]["best_nmi"] for r in rows),
                       "best_cnnc": stats(r[m]["best_cnnc"] for r in rows)} for m in METHODS}
        for other in ("grid", "mknn"):
            for key in ("per_iteration_s", "per_iteration_without_scoring_s", "per_iteration_core_s"):
                summary[f"{other}_over_ours_{key}"] = (summary[other][key]["mean"] / summary["ours"][key]["mean"])
        run.add({"id": f"fig1-{device}-n{n}", "benchmark": "fig1", "data": "MNIST", "n": n, "d": X.shape[1], "k": k,
                 "runs": args.runs, "iterations": FIG1_ITERATIONS, "dtype": "float32", "sigma0": sigma0,
                 "sigma0_seconds": sigma0_seconds,
                 "protocol": f"seeded uniform MNIST sample (seed 0) of n points, pixels / 255; per run r one random "
                             f"partition (seed r) handed to the three searches, each capped at {FIG1_ITERATIONS} "
                             "sigma values (MKNN: neighbour ranks 1..13; GRIDSEARCH: 10^-6..10^6; OURS: "
                             "max_values=13, depth 1, refine_depth 2); kernel k-means runs to a fixed point at each; "
                             "float32 K. OURS gets sigma0 = the 1st percentile of 1M seeded random pairs' squared "
                             "distances, computed once per n outside the timed call (sigma0_seconds). Per iteration: "
                             "'core' = (kernel_build + walk + kernel_kmeans seconds of the search's own timings) / "
                             "values run: producing and testing the sigmas; 'without scoring' = wall time of the call "
                             "minus timings['scoring'] (adds validation and MKNN's neighbour distances) / values; "
                             "'wall' = wall time / values (adds the c-NNC and NMI of every distinct clustering, the "
                             "same code for the three methods)",
                 "summary": summary, "rows": rows})
        print(f"[fig1] n={n}: ms per iteration (core) MKNN "
              f"{summary['mknn']['per_iteration_core_s']['mean'] * 1e3:.0f} GRID "
              f"{summary['grid']['per_iteration_core_s']['mean'] * 1e3:.0f} OURS "
              f"{summary['ours']['per_iteration_core_s']['mean'] * 1e3:.0f}", flush=True)
    if not device.startswith("cuda"):
        reason = _backend.cuda_unavailable_reason() or "this run was asked for the CPU"
        run.add({"id": "fig1-cuda", "benchmark": "fig1", "n": None,
                 "skipped": f"GPU section not run: {reason}", "command": GPU_FIG1_COMMAND})
    bar.close()
    print(f"[fig1] plot: {plot_fig1(run.path)}")


# ------------------------------------------------------------------------------------------ plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_path(path: Path, name=PATH_PLOT_SET, output: Path | None = None) -> Path | None:
    """c-NNC and NMI of every clustering of the three searches from partition 0 of one table-2 set, vs sigma."""
    document = json.loads(Path(path).read_text())
    case = next((c for c in document["cases"] if c["id"] == f"table2-{name}" and c.get("rows")), None)
    if case is None:
        return None
    plt = _pyplot()
    row = case["rows"][0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    styles = {"mknn": ("s", "C1"), "grid": ("^", "C2"), "ours": ("o", "C0")}
    for ax, key, label in ((axes[0], "cnnc", "c-NNC (lower is better)"), (axes[1], "nmi", "NMI with the classes")):
        for method, (marker, color) in styles.items():
            pts = sorted(zip(row[method]["sigmas"], row[method][key]))
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, linestyle="-",
                    alpha=0.8, label=f"{METHOD_LABELS[method]} ({len(pts)} distinct clusterings)")
        ax.set_xscale("log")
        ax.set_xlabel("sigma (k(x, y) = exp(-||x - y||^2 / sigma))")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{name} (n = {case['n']}, k = {case['k']}), partition seed {row['partition_seed']}: the "
                 f"clusterings each search produced", fontsize=10)
    output = output or Path(path).with_name(Path(path).stem + f"-path-{name}.png")
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def plot_fig1(path: Path, output: Path | None = None) -> Path:
    """Time per iteration vs n for the three methods: producing and testing a sigma (left), the whole call (right)."""
    plt = _pyplot()
    document = json.loads(Path(path).read_text())
    cases = [c for c in document["cases"] if c["benchmark"] == "fig1" and "summary" in c]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), constrained_layout=True, sharey=True)
    styles = {"mknn": ("s", "C1"), "grid": ("^", "C2"), "ours": ("o", "C0")}
    panels = (("per_iteration_core_s", "kernel builds + walk + kernel k-means, per sigma value"),
              ("per_iteration_s", "wall time of the search call / values (with setup and c-NNC scoring)"))
    for ax, (key, title) in zip(axes, panels):
        for device in sorted({c["device"] for c in cases}):
            for method, (marker, color) in styles.items():
                pts = sorted((c["n"], c["summary"][method][key]) for c in cases
                             if c["device"] == device and key in c["summary"][method])
                if not pts:
                    continue
                mean = np.array([p[1]["mean"] for p in pts])
                std = np.array([p[1]["std"] for p in pts])
                ax.errorbar([p[0] for p in pts], mean, yerr=std, marker=marker, color=color, capsize=3,
                            linestyle="-" if device == "cpu" else "--", label=f"{METHOD_LABELS[method]} ({device})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n (MNIST sample, d = 784, k = 10)")
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    axes[0].set_ylabel(f"seconds per iteration ({FIG1_ITERATIONS} sigma values per method)")
    fig.suptitle(f"Off-the-grid Figure 1 on {document['device_name']}", fontsize=10)
    output = output or Path(path).with_name(Path(path).stem + "-fig1.png")
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


# ------------------------------------------------------------------------------------------ report


def report(path: Path) -> str:
    """Markdown tables of a result file, measured next to the paper's figures (what bench/README.md quotes)."""
    document = json.loads(Path(path).read_text())
    cases = {c["id"]: c for c in document["cases"]}
    out = []
    t2 = [cases[f"table2-{name}"] for name in SETS if f"table2-{name}" in cases]
    if t2:
        out += ["| set (n, k) | NMI MKNN | NMI GRID | NMI OURS | c-NNC MKNN | c-NNC GRID | c-NNC OURS | partitions |",
                "|---|---|---|---|---|---|---|---|"]
        for c in t2:
            s, p = c["summary"], c.get("paper") or {}
            out.append(f"| {c['data']} ({c['n']}, {c['k']}) | " + " | ".join(
                [_paper_cell(s, p, "best_nmi", "nmi", m) for m in METHODS] +
                [_paper_cell(s, p, "best_cnnc", "cnnc", m) for m in METHODS]) + f" | {c['partitions']} |")
        out += ["", "| set | seconds MKNN | seconds GRID | seconds OURS | distinct clusterings MKNN / GRID / OURS |",
                "|---|---|---|---|---|"]
        for c in t2:
            s, p = c["summary"], (c.get("paper") or {}).get("seconds", {})
            out.append(f"| {c['data']} | " + " | ".join(
                f"{s[m]['seconds']['mean']:.3f}" + (f" ({p[m]:.3f})" if m in p else "") for m in METHODS)
                + " | " + " / ".join(f"{s[m]['n_clusterings']['mean']:.1f}" for m in METHODS) + " |")
    t4 = [cases[f"table4-{name}"] for name in SETS
          if f"table4-{name}" in cases and "summary" in cases[f"table4-{name}"]]
    if t4:
        out += ["", "| set (n) | binary s / iteration | ours s / iteration | speed-up (wall) "
                    "| speed-up (search only) | mean abs rel. error ours | binary | iterations |",
                "|---|---|---|---|---|---|---|---|"]
        for c in t4:
            s, p = c["summary"], c.get("paper") or {}

            def paren(key, fmt):
                return f" ({format(p[key], fmt)})" if key in p else ""

            out.append(f"| {c['data']} ({c['n']}) | {s['binary_iteration_s']['mean']:.4f}"
                       f"{paren('binary_iteration_s', '.3f')} | {s['ours_iteration_s']['mean']:.4f}"
                       f"{paren('ours_iteration_s', '.3f')} | {s['speedup_of_means']:.1f}x"
                       f"{paren('speedup', '.1f')} | {s['speedup_of_means_search_only']:.1f}x | "
                       f"{s['relative_error_ours']['mean']:.1e}{paren('relative_error_ours', '.1e')} | "
                       f"{s['relative_error_binary']['mean']:.1e}{paren('relative_error_binary', '.1e')} | "
                       f"{s['iterations']} |")
    f1 = sorted((c for c in document["cases"] if c["benchmark"] == "fig1" and "summary" in c
                 and "grid_over_ours_per_iteration_core_s" in c["summary"]), key=lambda c: c["n"])
    if f1:
        out += ["", "| n | runs | core ms / it MKNN | GRID | OURS | wall ms / it MKNN | GRID | OURS "
                    "| GRID / OURS (core) |", "|---|---|---|---|---|---|---|---|---|"]
        for c in f1:
            s = c["summary"]
            out.append(f"| {c['n']} | {c['runs']} | " + " | ".join(
                f"{s[m]['per_iteration_core_s']['mean'] * 1e3:.0f}" for m in METHODS) + " | " + " | ".join(
                f"{s[m]['per_iteration_s']['mean'] * 1e3:.0f}" for m in METHODS)
                + f" | {s['grid_over_ours_per_iteration_core_s']:.2f} |")
    return "\n".join(out)


def _paper_cell(summary, paper, key, paper_key, method):
    mine = summary[method][key]["mean"]
    theirs = (paper.get(paper_key) or {}).get(method)
    return f"{mine:.3f} ({theirs:.3f})" if theirs is not None else f"{mine:.3f}"


# ------------------------------------------------------------------------------------------ main


def set_threads(n):
    """Limit numba's and the BLAS's threads to n (n = 0: leave them); returns what is in effect."""
    import numba

    if n > 0:
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
        try:
            from threadpoolctl import threadpool_limits

            set_threads.limits = threadpool_limits(limits=n)  # kept alive for the whole run
        except ImportError:
            pass
    info = {"numba": numba.get_num_threads(), "requested": n or None}
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = [pool.get("num_threads") for pool in threadpool_info()]
    except ImportError:
        pass
    return info


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="bench_offgrid.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p, table2=False, table4=False, fig1=False):
        p.add_argument("--device", default=os.environ.get("KKMGPU_BENCH_OFFGRID_DEVICE") or default_device(),
                       help="cpu, cuda or cuda:N (default: $KKMGPU_BENCH_OFFGRID_DEVICE, else cuda where usable)")
        p.add_argument("--results-dir", default=None, help="default $KKMGPU_BENCH_RESULTS_DIR, else bench/results")
        p.add_argument("--threads", type=int, default=env_int("KKMGPU_BENCH_OFFGRID_THREADS", 0),
                       help="numba and BLAS threads (default 0: leave them as they are). On a machine shared with "
                            "other busy processes 1 avoids oversubscription, which slows small parallel regions by "
                            "an order of magnitude")
        p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=sys.stderr.isatty(),
                       help="a progress bar over the table's runs (default: on when stderr is a terminal)")
        p.add_argument("--quick", action="store_true",
                       help="smoke run: 2 partitions, 2 repeats, 1 fig1 run at n = 1000, 2000 (not for committing)")
        if table2 or table4:
            p.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
        if table2:
            p.add_argument("--partitions", type=int, default=env_int("KKMGPU_BENCH_OFFGRID_PARTITIONS", 10),
                           help="random initial partitions per set ($KKMGPU_BENCH_OFFGRID_PARTITIONS, default 10)")
        if table4:
            p.add_argument("--repeats", type=int, default=env_int("KKMGPU_BENCH_OFFGRID_REPEATS", 10),
                           help="random partitions per set ($KKMGPU_BENCH_OFFGRID_REPEATS, default 10)")
            p.add_argument("--chain", type=int, default=env_int("KKMGPU_BENCH_OFFGRID_CHAIN", 1),
                           help="consecutive critical-value searches per repeat (default 1)")
            p.add_argument("--reference-rtol", type=float, default=1e-10,
                           help="relative precision of the binary search that gives the true value (default 1e-10)")
            p.add_argument("--binary-sigma-max", type=float, default=1e6,
                           help="upper end of BINARYSEARCH's bracket (default 1e6, the paper's; its grid's top)")
        if fig1:
            p.add_argument("--sizes", nargs="+", type=int, default=[1000, 2000, 4000, 8000, 16000])
            p.add_argument("--runs", type=int, default=env_int("KKMGPU_BENCH_OFFGRID_RUNS", 2),
                           help="random partitions per n ($KKMGPU_BENCH_OFFGRID_RUNS, default 2)")
            p.add_argument("--max-bytes", type=float, default=3.6 * 2**30,
                           help="CPU: skip an n whose n x n arrays exceed this (default 3.6 GiB, under the 4 GB "
                                "per-process rule of the shared machine)")
            p.add_argument("--cnnc-keep-bytes", type=float, default=1.1 * 2**30,
                           help="keep the c-NNC neighbour order up to this size (default 1.1 GiB: n = 16k), so every "
                                "clustering of a search is scored without sorting again")
        return p

    common(sub.add_parser("table2", help="Tables 2 and 3: quality and total time of the three searches"), table2=True)
    common(sub.add_parser("table4", help="Table 4: Algorithm 2 vs binary search"), table4=True)
    common(sub.add_parser("fig1", help="Figure 1: time per iteration on MNIST samples"), fig1=True)
    common(sub.add_parser("all", help="table2, table4 and fig1 in turn"), table2=True, table4=True, fig1=True)
    p = sub.add_parser("plot", help="the Figure 1 and path PNGs of a result file")
    p.add_argument("path", type=Path)
    p = sub.add_parser("report", help="markdown tables of a result file, the paper's figures in brackets")
    p.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    if args.command == "report":
        print(report(args.path))
        return 0
    if args.command == "plot":
        print(plot_fig1(args.path))
        print(plot_path(args.path))
        return 0
    if args.device.startswith("cuda") and _backend.cuda_unavailable_reason() is not None:
        parser.error(f"--device {args.device}: {_backend.cuda_unavailable_reason()}")
    if args.quick:
        for name, value in (("partitions", 2), ("repeats", 2), ("runs", 1), ("sizes", [1000, 2000])):
            if hasattr(args, name):
                setattr(args, name, value)
    bw = bandwidth_api()
    threads = set_threads(args.threads)
    run = Run(args.device, argv, args.results_dir)
    run.meta["threads"] = threads
    print(f"results: {run.path}", flush=True)
    warm_up(bw, args.device)
    commands = {"table2": [cmd_table2], "table4": [cmd_table4], "fig1": [cmd_fig1],
                "all": [cmd_table2, cmd_table4, cmd_fig1]}[args.command]
    for command in commands:
        command(args, run, bw)
    run.write()
    return 0



def test_search_bandwidth_speed(benchmark, device):
    """The Off-the-grid search on 2,000 MNIST points (k = 10, at most 8 bandwidths, the paper's defaults
    otherwise): the search case of ``bench/compare_commits.py``."""
    X, _ = datasets.load_mnist(n_samples=2000, random_state=0)

    def call():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return kkmgpu.search_bandwidth(X, 10, max_values=8, random_state=0, device=device)

    result = benchmark.pedantic(call, rounds=3, warmup_rounds=1, iterations=1)
    benchmark.extra_info.update({"n": len(X), "k": 10, "device": device, "n_values": len(result.clusterings),
                                 "best_gamma": float(result.clusterings[result.best_index].gamma)})

if __name__ == "__main__":
    sys.exit(main())
