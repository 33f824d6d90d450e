"""The large-n frontier: which method gives which clustering quality at which cost, at one n.

    python bench/bench_frontier.py run [--n 70000] [--seeds 0 1 2] [--methods cats approx ...] [--device cpu]
    python bench/bench_frontier.py plot [RESULT.json]

For every method and setting (3 or more each) and every seed, one child process fits MNIST (train + test, pixels
/ 255; a random subset for ``--n`` < 70,000; for ``--n`` > 70,000 MNIST repeated with Gaussian pixel noise of
standard deviation ``--noise``, labels repeated) and reports its wall time (data loading excluded) and its peak
resident memory above the loaded data (Linux ``ru_maxrss`` of the child, minus the resident size after loading;
on a GPU also CuPy's pool peak). The parent then scores the partition: NMI against the digit labels, and the exact
kernel k-means objective of the partition under the one kernel every kernel method uses (RBF, gamma = 1 / (d
var X), computed once), summed per cluster in tiles (O(sum_c n_c^2 d); no n x n matrix).

Methods and settings:

- ``cats``: kkmgpu method="cats", n_samples_per_cluster l in ``--cats-l`` (default 20, sqrt(n / k), 200);
- ``approx``: kkmgpu method="approx", n_landmarks m in ``--approx-m`` (default 500, 1000, 2000, 4000);
  ``approx_kmeanspp`` the same with landmarks="kmeans++" (default m 500, 1000, 2000);
- ``trimmed``: kkmgpu method="trimmed" (dtype float16), trim_slack in 0.005, 0.01, 0.02; needs the n x n matrix, so
  a case that does not fit is recorded as skipped with the library's InsufficientMemoryError;
- ``tiled``: the exact method's tiled engine, time-limited to ``--tiled-iters`` assignment steps (default 2): its
  per-iteration cost, and where it stands after them;
- ``nystroem``: scikit-learn's ``Nystroem`` (same RBF gamma, n_components m as for approx) then ``KMeans``;
- ``minibatch``: scikit-learn's ``MiniBatchKMeans`` on the raw pixels, batch_size 1024, 4096, 16384;
- ``kmeans``: scikit-learn's ``KMeans`` on the raw pixels, n_init 1, 3, 10.

kkmgpu's methods use init="k-means++" with one start (n_init=1); scikit-learn's use their defaults for init and
the n_init above. Results merge into ``bench/results/<date>-<device>-frontier.json`` (one case per method,
setting and seed, rewritten after every case); ``plot`` draws time against NMI and against the objective, one
line per method (mean over seeds), into the PNG beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _kkmgpu_bench import mnist_repeated, reset_peak, status_gib  # noqa: E402

import numpy as np  # noqa: E402

SCHEMA = "kkmgpu-bench-frontier/1"
K = 10
METHODS = ("cats", "approx", "approx_kmeanspp", "trimmed", "tiled", "nystroem", "minibatch", "kmeans")
KERNEL_METHODS = ("cats", "approx", "approx_kmeanspp", "trimmed", "tiled", "nystroem")


load = mnist_repeated


def rbf_gamma(X):
    return 1.0 / (X.shape[1] * float(X.astype(np.float64).var()))


def settings(method, n, args):
    if method == "cats":
        return [("l", l) for l in (args.cats_l or [20, int(math.ceil(math.sqrt(n / K))), 200])]
    if method in ("approx", "nystroem"):
        return [("m", m) for m in (args.approx_m or [500, 1000, 2000, 4000]) if m <= n]
    if method == "approx_kmeanspp":  # one kernel column per landmark: m passes over the data
        return [("m", m) for m in (args.approx_m or [500, 1000, 2000]) if m <= n]
    if method == "trimmed":
        return [("slack", s) for s in (0.005, 0.01, 0.02)]
    if method == "tiled":
        return [("iterations", args.tiled_iters)]
    if method == "minibatch":
        return [("batch_size", b) for b in (1024, 4096, 16384)]
    if method == "kmeans":
        return [("n_init", i) for i in (1, 3, 10)]
    raise ValueError(method)


def _fit_case(method, X, value, gamma, device, seed):
    """The fit of one case; returns an object with labels (``labels`` or ``labels_``) and maybe n_iter."""
    import kkmgpu

    common = dict(kernel="rbf", gamma=gamma, device=device, random_state=seed, n_init=1, init="k-means++")
    if method == "cats":
        return kkmgpu.fit(X, K, method="cats", n_samples_per_cluster=value, **common)
    if method in ("approx", "approx_kmeanspp"):
        return kkmgpu.fit(X, K, method="approx", n_landmarks=min(value, X.shape[0]),
                          landmarks="kmeans++" if method == "approx_kmeanspp" else "uniform", **common)
    if method == "trimmed":
        return kkmgpu.fit(X, K, method="trimmed", trim_slack=value, dtype="float16", **common)
    if method == "tiled":
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return kkmgpu.fit(X, K, engine="tiled", max_iter=value, tol=0.0, **common)
    if method == "nystroem":
        from sklearn.cluster import KMeans
        from sklearn.kernel_approximation import Nystroem
        features = Nystroem(kernel="rbf", gamma=gamma, n_components=min(value, X.shape[0]),
                            random_state=seed).fit_transform(X)
        return KMeans(K, n_init=1, random_state=seed).fit(features)
    if method == "minibatch":
        from sklearn.cluster import MiniBatchKMeans
        return MiniBatchKMeans(K, batch_size=value, n_init=3, random_state=seed).fit(X)
    if method == "kmeans":
        from sklearn.cluster import KMeans
        return KMeans(K, n_init=value, random_state=seed).fit(X)
    raise ValueError(method)


def child(args):
    """One case in this process: fit, write the labels and the measurements."""
    X, _ = load(args.n, noise=args.noise)
    gamma = rbf_gamma(X)
    value = json.loads(args.value)
    _fit_case(args.method, X[:300], value if not args.method.startswith("approx") else 50, gamma, args.device,
              args.seed)  # warm-up:
    # imports and numba's compilation, paid once per process, are not the method's cost at this n
    import gc

    gc.collect()
    base = status_gib("VmRSS")
    peak_reset = reset_peak()
    t0 = time.perf_counter()
    extra = {}
    result = _fit_case(args.method, X, value, gamma, args.device, args.seed)
    if args.method == "tiled":
        extra["seconds_per_iteration"] = result.timings["iterations"] / max(1, result.n_iter)
    seconds = time.perf_counter() - t0
    labels = np.asarray(getattr(result, "labels", getattr(result, "labels_", None))).astype(np.int32)
    if hasattr(result, "n_iter"):
        extra["n_iter"] = int(result.n_iter)
    elif hasattr(result, "n_iter_"):
        extra["n_iter"] = int(result.n_iter_)
    peak = status_gib("VmHWM") if peak_reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    np.save(args.labels_out, labels)
    print(json.dumps({"seconds": seconds, "peak_rss_gib": peak, "data_rss_gib": base,
                      "peak_above_data_gib": peak - base, "peak_since_fit": peak_reset, "gamma": gamma, **extra}))


def exact_objective(X, labels, gamma, device):
    """The exact kernel k-means objective of ``labels`` under the RBF kernel, per cluster in tiles."""
    from kkmgpu.backend.device import resolve_device
    from kkmgpu.engine.sampled import KernelSource, exact_objective as tiled_objective
    from kkmgpu.kernels import blocks, spec as kernel_spec

    backend = resolve_device(device)
    spec = kernel_spec.resolve_kernel("rbf", gamma=gamma, X=X, xp=np)
    spec = kernel_spec.with_center(spec, X, np, np.dtype(np.float64))
    with backend.activate():
        A = blocks.prepare_features(X, spec, backend, np.dtype(np.float32))
        return tiled_objective(KernelSource(A, spec, backend), labels, np.ones(len(labels)), K)


def run(args):
    from _kkmgpu_bench import ScriptRun
    from kkmgpu.metrics import nmi

    recorder = ScriptRun(args.device, sys.argv[1:], script="bench/bench_frontier.py", topic="frontier",
                         schema=SCHEMA, document_extra={"k": K, "kernel": "rbf, gamma = 1 / (d var X)",
                                                        "data": "MNIST / 255; n > 70,000: repeated with pixel noise"})
    X, y = load(args.n, noise=args.noise)
    gamma = rbf_gamma(X)
    print(f"MNIST n={len(y)}, k={K}, RBF gamma={gamma:.6g}, device {args.device}", flush=True)
    for method in args.methods:
        for name, value in settings(method, args.n, args):
            for seed in (args.seeds if method != "tiled" else args.seeds[:1]):
                case_id = f"{method}-{name}{value}-n{args.n}-seed{seed}"
                with tempfile.TemporaryDirectory() as tmp:
                    out = Path(tmp) / "labels.npy"
                    command = [sys.executable, __file__, "child", "--method", method, "--value", json.dumps(value),
                               "--seed", str(seed), "--n", str(args.n), "--noise", str(args.noise), "--device",
                               args.device, "--labels-out", str(out)]
                    proc = subprocess.run(command, capture_output=True, text=True, timeout=args.case_timeout)
                    if proc.returncode != 0:
                        reason = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
                        recorder.add({"id": case_id, "method": method, "setting": name, "value": value,
                                      "seed": seed, "n": args.n, "skipped": reason})
                        print(f"{case_id}: skipped: {reason}", flush=True)
                        continue
                    measured = json.loads(proc.stdout.strip().splitlines()[-1])
                    labels = np.load(out)
                t0 = time.perf_counter()
                objective = exact_objective(X, labels, gamma, args.device) if not args.no_objective else None
                case = {"id": case_id, "method": method, "setting": name, "value": value, "seed": seed,
                        "n": args.n, "nmi": nmi(y, labels), "exact_objective": objective,
                        "objective_seconds": time.perf_counter() - t0, **measured}
                recorder.add(case)
                print(f"{case_id}: NMI {case['nmi']:.4f}, objective {objective if objective is None else f'{objective:.6g}'}, "
                      f"{measured['seconds']:.1f} s, peak {measured['peak_above_data_gib']:.2f} GiB above the data",
                      flush=True)
    print(f"wrote {recorder.path}")
    if not args.no_plot:
        plot(recorder.path, args.n)


def plot(path, n=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    document = json.loads(Path(path).read_text())
    cases = [c for c in document["cases"] if "skipped" not in c]
    sizes = sorted({c["n"] for c in cases})
    n = n if n is not None else max(sizes, key=lambda size: sum(c["n"] == size for c in cases))
    cases = [c for c in cases if c["n"] == n]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for method in METHODS:
        mine = [c for c in cases if c["method"] == method]
        if not mine:
            continue
        points = []
        for value in sorted({json.dumps(c["value"]) for c in mine}, key=lambda v: float(json.loads(v))):
            group = [c for c in mine if json.dumps(c["value"]) == value]
            points.append((statistics.fmean(c["seconds"] for c in group), statistics.fmean(c["nmi"] for c in group),
                           statistics.fmean(c["exact_objective"] for c in group)
                           if all(c.get("exact_objective") is not None for c in group) else None,
                           f"{group[0]['setting']}={json.loads(value)}"))
        points.sort()
        style = "-o" if method in KERNEL_METHODS else "--s"
        line, = axes[0].plot([p[0] for p in points], [p[1] for p in points], style, label=method)
        with_objective = [p for p in points if p[2] is not None]
        if with_objective:
            axes[1].plot([p[0] for p in with_objective], [p[2] for p in with_objective], style, label=method,
                         color=line.get_color())
        for p in points:
            axes[0].annotate(p[3], (p[0], p[1]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    for ax, ylabel in zip(axes, ("NMI against the digit labels (higher is better)",
                                 "exact RBF kernel k-means objective (lower is better)")):
        ax.set_xscale("log")
        ax.set_xlabel("wall time per fit (s, log scale)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"MNIST n={n}, k={document.get('k')}, {document.get('device_name', '')}: "
                 "each point one setting, mean over seeds")
    fig.tight_layout()
    png = Path(path).with_name(Path(path).stem + ("" if n == 70_000 else f"-n{n}") + ".png")
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")
    return png


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--n", type=int, default=70_000)
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    r.add_argument("--device", default="cpu")
    r.add_argument("--noise", type=float, default=0.05)
    r.add_argument("--cats-l", type=int, nargs="+")
    r.add_argument("--approx-m", type=int, nargs="+")
    r.add_argument("--tiled-iters", type=int, default=2)
    r.add_argument("--case-timeout", type=float, default=3600)
    r.add_argument("--no-objective", action="store_true")
    r.add_argument("--no-plot", action="store_true")
    c = sub.add_parser("child")
    for name in ("--method", "--value", "--device", "--labels-out"):
        c.add_argument(name, required=True)
    c.add_argument("--seed", type=int, required=True)
    c.add_argument("--n", type=int, required=True)
    c.add_argument("--noise", type=float, default=0.05)
    p = sub.add_parser("plot")
    p.add_argument("path")
    p.add_argument("--n", type=int, help="the n to plot (default: the one with the most cases)")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
    elif args.command == "child":
        child(args)
    else:
        plot(args.path, args.n)


if __name__ == "__main__":
    main()
