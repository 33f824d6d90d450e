"""Kernel matrix trimming benchmark: the paper's Table 1 on MNIST, and the cost of trimming and of sparse iterations.

A script, not a pytest module (``pytest bench/`` collects nothing here). From the repository root::

    python bench/bench_trimming.py table1              # MNIST: baseline vs trimmed NMI, nz / n^2, times, memory
    python bench/bench_trimming.py table1 --n 70000    # the paper's full size (a GPU, or a host with ~40 GB free)
    python bench/bench_trimming.py table1 --n max      # the largest n this host's free memory holds (CPU)
    python bench/bench_trimming.py literal --n 3000    # max_size=1 (the paper as written) vs the default 0.5
    python bench/bench_trimming.py figure3             # the paper's Figure 3: K, K* and the votes, as a PNG

Protocol of ``table1`` (papers/kernel-matrix-trimming.txt, Section 4): MNIST pixels / 255 (all 70,000 points on a
GPU by default, else 20,000 points, or --n max: the largest sample the host's free memory holds), k = 10; kernels
as in the paper, written in the library's conventions: neural tanh(0.0045 x.y + 0.11) (kernel="sigmoid",
gamma=0.0045, coef0=0.11), polynomial (x.y + 1)^5 (gamma=1, coef0=1, degree=5), RBF exp(-||x - y||^2) (gamma=1),
plus RBF with the library's data-scale gamma (1 / (d X.var())) because gamma = 1 makes K numerically the identity on
pixels / 255 (see bench/README.md).
K is built once per kernel (float32); the baseline is dense kernel k-means on K, "trimmed" is kernel k-means on
K* = trim_kernel_matrix(K) with the library's defaults. Each of the --runs runs (10, as the paper) starts both
from the same random partition (seed = run index: uniform labels, k random points fixed to 0..k-1, as
``init="random"``), library defaults otherwise (tol 1e-6, max_iter 300). NMI against the digit labels
(kkmgpu.metrics.nmi, arithmetic normalisation). Trimming: wall time and its phases, peak memory beyond K
(tracemalloc on the CPU, the CuPy pool on a GPU), nnz / n^2, estimated clusters. Iterations: the time of one full
cluster-sum pass of the dense and of the sparse operator (best of 5) and the mean time per Lloyd iteration of
the runs, all measured in this run, quoted as ratios.

Results merge into ``bench/results/<YYYY-MM-DD>-<device>-trimming.json`` (schema "kkmgpu-bench-trimming/1",
bench/README.md, section "Kernel matrix trimming"); a case with the same id is replaced. The load average is
recorded at the start and end of the run and of every case: timings on a shared machine are contended.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import resource
import sys
import time
import tracemalloc
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
from kkmgpu.engine import lloyd as _lloyd
from kkmgpu.engine.dense import DenseKernelOperator  # noqa: E402
from kkmgpu.engine import sparse as _sparse
from kkmgpu.metrics import nmi  # noqa: E402
from kkmgpu._progress import progress_bar  # noqa: E402

SCHEMA = "kkmgpu-bench-trimming/1"
DEFAULT_RESULTS_DIR = BENCH_DIR / "results"
K_CLUSTERS = 10
#: The paper's Table 1: NMI mean (std) over 10 runs, and nz / n^2 of the trimmed matrix.
PAPER = {
    "table1": {
        "neural": {"baseline": [0.4982, 0.0226], "trimmed": [0.4959, 0.0066], "reduction": 0.0743},
        "polynomial": {"baseline": [0.4945, 0.0136], "trimmed": [0.5108, 0.0095], "reduction": 0.0866},
        "rbf": {"baseline": [0.4936, 0.0136], "trimmed": [0.5687, 0.0312], "reduction": 0.0439},
        "note": "MNIST, all 70,000 points, pixels / 255, 10 runs each; NMI as mean (std)",
    },
}
KERNELS = {
    "neural": {"kernel": "sigmoid", "gamma": 0.0045, "coef0": 0.11},
    "polynomial": {"kernel": "polynomial", "gamma": 1.0, "coef0": 1.0, "degree": 5},
    "rbf": {"kernel": "rbf", "gamma": 1.0},
    "rbf-scale": {"kernel": "rbf", "gamma": None},  # gamma = 1 / (d X.var()), resolved per sample
}


# ------------------------------------------------------------------------------------------ devices, files


def default_device() -> str:
    if os.environ.get("KKMGPU_DEVICE", "").strip().lower() == "cpu":
        return "cpu"
    return "cuda" if _backend.cuda_unavailable_reason() is None else "cpu"


def Run(device, argv, results_dir=None):
    """This invocation's cases, merged into <date>-<device>-trimming.json (``_kkmgpu_bench.ScriptRun``), with
    the process's peak resident memory."""
    from _kkmgpu_bench import ScriptRun

    class TrimmingRun(ScriptRun):
        def meta_extra(self):
            return {"peak_rss_bytes": peak_rss_bytes()}

    return TrimmingRun(device, argv, script="bench/bench_trimming.py", topic="trimming", schema=SCHEMA,
                       results_dir=results_dir, document_extra={"paper": PAPER})


# ------------------------------------------------------------------------------------------ measurements


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def synchronize(device):
    if device.startswith("cuda"):
        _backend.import_cupy().cuda.Device().synchronize()


def host(a):
    return np.asarray(a.get() if hasattr(a, "get") else a)


def stats(values):
    a = np.asarray(values, dtype=np.float64)
    return {"mean": float(a.mean()), "std": float(a.std(ddof=1)) if a.size > 1 else 0.0,
            "min": float(a.min()), "max": float(a.max()), "count": int(a.size)}


def load_mnist(n):
    from _kkmgpu_bench import mnist_dir

    X, y = datasets.load_mnist(mnist_dir(), n_samples=None if n >= 70000 else n, random_state=0)
    return np.ascontiguousarray(X, dtype=np.float32), y


def random_partition(n, seed):
    return _lloyd.random_partition(n, K_CLUSTERS, np.random.default_rng(seed))


class MemoryPeak:
    """Peak memory allocated inside the block beyond what was held at its start (tracemalloc / CuPy pool)."""

    def __init__(self, device):
        self.device = device
        self.peak = None

    def __enter__(self):
        if self.device.startswith("cuda"):
            pool = _backend.import_cupy().get_default_memory_pool()
            pool.free_all_blocks()
            self._start = pool.used_bytes()
        else:
            gc.collect()
            tracemalloc.start()
        return self

    def __exit__(self, *exc):
        if self.device.startswith("cuda"):
            self.peak = int(_backend.import_cupy().get_default_memory_pool().total_bytes() - self._start)
        else:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            self.peak = int(peak)
        return False


def best_seconds(fn, device, repeats=5):
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return min(times)


def csr_bytes(K):
    return int(K.data.nbytes + K.indices.nbytes + K.indptr.nbytes)


def fit_runs(K, y, runs, device, label):
    rows = []
    for seed in range(runs):
        labels0 = random_partition(K.shape[0], seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
            r = kkmgpu.fit(K, K_CLUSTERS, kernel="precomputed", init=labels0, device=device)
        labels = host(r.labels)
        rows.append({"seed": seed, "nmi": float(nmi(y, labels)), "objective": r.objective, "n_iter": r.n_iter,
                     "converged": r.converged, "iterations_s": r.timings["iterations"],
                     "seconds_per_iteration": r.timings["iterations"] / max(1, r.n_iter)})
        print(f"  [{label}] run {seed}: NMI {rows[-1]['nmi']:.4f}, {r.n_iter} iterations, "
              f"{r.timings['iterations']:.2f} s", flush=True)
    return rows


def pass_seconds(K, device):
    """One full cluster-sum pass of the operator the fit would use for K (best of 5), labels of seed 0."""
    backend = _backend.resolve_device(device)
    with backend.activate():
        weights = backend.asarray(np.ones(K.shape[0]))
        labels = backend.asarray(random_partition(K.shape[0], 0))
        if _sparse.is_sparse(K):
            op = _sparse.SparseKernelOperator(K, weights, backend)
        else:
            op = DenseKernelOperator(K, weights, backend)
        op.cluster_sums(labels, K_CLUSTERS)  # compile / warm up
        return best_seconds(lambda: op.cluster_sums(labels, K_CLUSTERS), device)


def kernel_case(run, name, X, y, runs, max_size, do_baseline=True):
    device = run.device
    n = X.shape[0]
    params = dict(KERNELS[name])
    if params.get("gamma", 0) is None:
        params["gamma"] = 1.0 / (X.shape[1] * float(np.var(X, dtype=np.float64)))
    load_start = list(os.getloadavg())
    synchronize(device)
    t0 = time.perf_counter()
    Y = X if device == "cpu" and n > 30000 else None  # tiled GEMM on the CPU above 30k rows (see _kernels)
    K = kkmgpu.kernel_matrix(X, Y, device=device, dtype="float32", **params)
    synchronize(device)
    build_s = time.perf_counter() - t0
    print(f"[{name}] n={n} {params} K built in {build_s:.1f} s", flush=True)
    with MemoryPeak(device) as mem:
        trimmed = kkmgpu.trim_kernel_matrix(K, device=device, max_size=max_size, verbose=True)
    print(f"[{name}] trimmed in {trimmed.timings['total']:.1f} s, density {trimmed.density:.4f}, "
          f"{trimmed.n_clusters} clusters estimated, peak {mem.peak / 2**20:.0f} MiB beyond K", flush=True)
    dense_pass = pass_seconds(K, device) if do_baseline else None
    sparse_pass = pass_seconds(trimmed.K, device)
    baseline = fit_runs(K, y, runs, device, f"{name} baseline") if do_baseline else None
    k_bytes = int(K.nbytes)
    del K
    gc.collect()
    trimmed_rows = fit_runs(trimmed.K, y, runs, device, f"{name} trimmed")
    case = {
        "id": f"table1/{name}/n{n}/max_size{max_size:g}", "benchmark": "table1", "kernel": name,
        "kernel_params": params, "n": n, "k": K_CLUSTERS, "runs": runs, "dtype": "float32",
        "init": "random partition, seed = run index, the same for baseline and trimmed",
        "trim_params": {"vote_fraction": trimmed.vote_fraction, "slack": trimmed.slack, "h": trimmed.h,
                        "max_size": trimmed.max_size},
        "kernel_build_s": build_s, "kernel_bytes": k_bytes,
        "trimming": {"seconds": trimmed.timings["total"], "phases_s": trimmed.timings,
                     "peak_bytes_beyond_K": mem.peak, "peak_measure": "CuPy pool" if device != "cpu" else "tracemalloc",
                     "nnz": trimmed.nnz, "density": trimmed.density, "csr_bytes": csr_bytes(trimmed.K),
                     "n_clusters_estimated": trimmed.n_clusters,
                     "cluster_sizes_estimated": trimmed.cluster_sizes.tolist(),
                     "voting_rounds": int(len(trimmed.winners))},
        "iteration": {"dense_pass_s": dense_pass, "sparse_pass_s": sparse_pass,
                      "sparse_over_dense": None if dense_pass is None else sparse_pass / dense_pass},
        "baseline": None if baseline is None else {"nmi": stats([r["nmi"] for r in baseline]),
                                                   "seconds_per_iteration": stats([r["seconds_per_iteration"]
                                                                                   for r in baseline]),
                                                   "rows": baseline},
        "trimmed": {"nmi": stats([r["nmi"] for r in trimmed_rows]),
                    "seconds_per_iteration": stats([r["seconds_per_iteration"] for r in trimmed_rows]),
                    "rows": trimmed_rows},
        "paper": PAPER["table1"].get(name),
        "load_average_start": load_start, "load_average_end": list(os.getloadavg()),
    }
    if baseline is not None:
        case["iteration"]["lloyd_iteration_ratio_trimmed_over_baseline"] = (
            case["trimmed"]["seconds_per_iteration"]["mean"] / case["baseline"]["seconds_per_iteration"]["mean"])
    run.add(case)
    b = case["baseline"]["nmi"] if baseline is not None else None
    t = case["trimmed"]["nmi"]
    print(f"[{name}] NMI baseline {b['mean']:.4f} ({b['std']:.4f})" if b else f"[{name}]",
          f"trimmed {t['mean']:.4f} ({t['std']:.4f}), nz/n^2 {trimmed.density:.4f}; pass dense "
          f"{dense_pass if dense_pass is None else round(dense_pass * 1e3, 2)} ms, sparse {sparse_pass * 1e3:.2f} ms",
          flush=True)
    return case


#: Peak RSS of a table1 run per entry of K, measured on the CPU at n = 20,000: 3.31e9 bytes / 4e8 (K float32,
#: trimming's workspace, K* and the fits); 70,000 points thus need about 40 GB.
PEAK_BYTES_PER_ENTRY = 8.3


def default_n(device):
    if device.startswith("cuda"):
        return 70000
    return 20000  # K float32 1.6 GB; peak RSS 3.3 GB measured (8 minutes on 2 cores)


def largest_n(device):
    """The largest MNIST sample (a multiple of 1,000, at most 70,000) whose measured peak fits 85% of free memory."""
    if device.startswith("cuda"):
        return 70000
    available = _backend.resolve_device("cpu").available_bytes()
    if available is None:
        return default_n(device)
    return max(1000, min(70000, int(math.sqrt(0.85 * available / PEAK_BYTES_PER_ENTRY)) // 1000 * 1000))


def sample_size(text):
    """--n: a positive integer, or "max" (:func:`largest_n`)."""
    if text == "max":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--n {text!r} must be a positive integer or 'max'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--n {value} must be >= 1")
    return value


def cmd_table1(args, run):
    X, y = load_mnist(args.n)
    with progress_bar(len(args.kernels), desc="table1", unit="kernel", enabled=args.progress) as bar:
        for name in args.kernels:
            kernel_case(run, name, X, y, args.runs, args.max_size)
            bar.update()


def cmd_literal(args, run):
    X, y = load_mnist(args.n)
    with progress_bar(2 * len(args.kernels), desc="literal", unit="case", enabled=args.progress) as bar:
        for name in args.kernels:
            for max_size in (1.0, 0.5):
                kernel_case(run, name, X, y, args.runs, max_size, do_baseline=max_size == 1.0)
                bar.update()


def cmd_figure3(args, run):
    """The paper's Figure 3 setting: a block matrix (clusters of 43, 19, 10, 9, 6, 6), trimmed; PNG + case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [43, 19, 10, 9, 6, 6]
    labels = np.repeat(np.arange(len(sizes)), sizes)
    K = (labels[:, None] == labels[None, :]).astype(np.float64)
    trimmed = kkmgpu.trim_kernel_matrix(K, device=run.device)
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    axes[0].imshow(K, cmap="gray_r")
    axes[0].set_title("K: clusters of " + ", ".join(map(str, sizes)))
    axes[1].imshow(host(trimmed.K.toarray()), cmap="gray_r")
    axes[1].set_title("K*: estimated " + ", ".join(map(str, trimmed.cluster_sizes.tolist())))
    trimmed.plot(axes=axes[2:])
    axes[3].set_xlim(0, 50)
    fig.tight_layout()
    png = run.path.with_name(run.path.stem + "-figure3.png")
    png.parent.mkdir(parents=True, exist_ok=True)  # a new --results-dir
    fig.savefig(png, dpi=110)
    plt.close(fig)
    run.add({"id": "figure3", "benchmark": "figure3", "true_sizes": sizes,
             "paper_estimate": [43, 19, 10, 7, 7, 7], "n_clusters_estimated": trimmed.n_clusters,
             "cluster_sizes_estimated": trimmed.cluster_sizes.tolist(), "winners": trimmed.winners.tolist(),
             "density": trimmed.density, "png": png.name})
    print(f"[figure3] estimated {trimmed.cluster_sizes.tolist()} (paper: 43, 19, 10, 7, 7, 7); {png}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="bench_trimming.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, default_kernels in (("table1", ["neural", "polynomial", "rbf", "rbf-scale"]),
                                  ("literal", ["neural", "rbf-scale"])):
        p = sub.add_parser(name)
        p.add_argument("--device", default=os.environ.get("KKMGPU_BENCH_TRIM_DEVICE") or default_device())
        p.add_argument("--n", type=sample_size, default=None,
                       help="MNIST sample size, or 'max' for the largest the free memory holds (default: 70000 "
                            "on a GPU, 20000 on the CPU; 3000 for literal)")
        p.add_argument("--runs", type=int, default=10)
        p.add_argument("--kernels", nargs="+", default=default_kernels, choices=sorted(KERNELS))
        p.add_argument("--max-size", type=float, default=kkmgpu.trimming.DEFAULT_MAX_SIZE)
        p.add_argument("--results-dir", default=None)
        p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=sys.stderr.isatty(),
                       help="a progress bar over the kernels (default: on when stderr is a terminal)")
    p = sub.add_parser("figure3")
    p.add_argument("--device", default=os.environ.get("KKMGPU_BENCH_TRIM_DEVICE") or default_device())
    p.add_argument("--results-dir", default=None)
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and _backend.cuda_unavailable_reason() is not None:
        parser.error(f"--device {args.device}: {_backend.cuda_unavailable_reason()}")
    if getattr(args, "n", 0) is None:
        args.n = 3000 if args.command == "literal" else default_n(args.device)
    elif getattr(args, "n", 0) == "max":
        args.n = largest_n(args.device)
    run = Run(args.device, argv, args.results_dir)
    print(f"results: {run.path}", flush=True)
    {"table1": cmd_table1, "literal": cmd_literal, "figure3": cmd_figure3}[args.command](args, run)
    run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
