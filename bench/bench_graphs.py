"""Graph objectives (fit(objective="ncut")) against scikit-learn's SpectralClustering: quality and speed.

    python bench/bench_graphs.py quality [--seeds 0 1 2 3 4] [--sets aggregation ... spirals] [--device cpu]
    python bench/bench_graphs.py speed [--n 70000] [--n-neighbors 10] [--timeout 3000] [--device cpu]
    python bench/bench_graphs.py search [--n 70000] [--n-neighbors 10]   # the CPU's graph step taken apart
    python bench/bench_graphs.py plot   # the spirals picture of docs/graphs.md
    python bench/bench_graphs.py many-clusters [--n 5000 20000 100000] [--k 100] [--equal] [--box 100] [--seeds 0]
    python bench/bench_graphs.py landmark {mnist,million,curve,grid,crossover} ...   # method='landmark': bench/bench_landmark.py
    python bench/bench_graphs.py fixed-cost [--sets ...] [--seeds 0] [--repeats 7]   # the small sets, ms by ms

``quality``: on the shape sets (aggregation, compound, flame, jain, r15; standardised), two moons
(scikit-learn's make_moons(1000, noise=0.08)), two spirals (kkmgpu.datasets.make_two_spirals(1000)), WiFi, Wine
(standardised), digits (/ 16) and MNIST samples of 2,000 and 5,000 (/ 255), with every seed:

- ``sklearn``: ``SpectralClustering(k, affinity="nearest_neighbors", n_neighbors=10, random_state=seed)``
  (its defaults: arpack, assign_labels="kmeans", n_init=10);
- ``ncut``: ``kkmgpu.fit(X, k, objective="ncut", n_neighbors=10, random_state=seed)`` (the default graph:
  self_tuning since round 2 of docs/selection.md, knn before; spectral start, n_init 10);
- ``ncut_kmeanspp``: the same from k-means++ starts in the graph kernel's feature space (n_init 10);
- ``ncut_search``: ``n_neighbors="search"`` (the largest spectral gap ratio of 5 ... 30, the default family);
- ``ratio_association``: ``objective="ratio_association"``;
- ``rbf``: plain kernel k-means, RBF gamma="scale", n_init 10 (what the graph objectives are for).
- ``landmark``: ``kkmgpu.fit(X, k, objective="ncut", method="landmark", random_state=seed)`` (its defaults:
  p = min(1500, max(k, n // 4)) representatives, 5 each).

NMI against the labels, seconds; the table of means is printed (markdown) and the cases merge into
``bench/results/<date>-<device>-graphs.json``.

``speed``: MNIST n = ``--n`` (pixels / 255; above 70,000 MNIST repeated with pixel noise 0.05), one run each
in a child process with a time limit: kkmgpu ncut (graph construction + spectral start + iterations) and
scikit-learn's SpectralClustering with the same number of neighbours, eigen_solver "arpack" and, when pyamg is
installed, "amg". Wall time, NMI and peak resident memory; a contestant past ``--timeout`` is recorded as such
(its time a lower bound).

``many-clusters``: issue 29's sets of many clusters, made here (:func:`make_many_clusters`): k Gaussian clusters of
unit spread in 2-D, centres uniform in [0, box]^2, sizes from a Dirichlet(2) draw (birch2-like; ``--equal``: n / k
each). kkmgpu's ncut (the default graph, 10 neighbours, spectral start, n_init 10) and scikit-learn's
``SpectralClustering(k, affinity="nearest_neighbors", n_neighbors=10)`` (arpack; pyamg is not used) one after the
other in this process per seed, so that both meet the same load: seconds, NMI and the ratio kkmgpu / scikit-learn.

``search``: the CPU's neighbour search on MNIST's centred features, step by step in this process: the exact
search with principal-component lower bounds (kkmgpu/kernels/knn_bounds.py) whole, then its plan, its search on
the projected features, its walk of the candidate lists and its walk of the rows whose lists ran out, and the
certified brute-force search on all pixels (``knn_bounds.nearest_neighbors(prune=False)``: the block search's
candidates re-ranked in float64 and certified, kkmgpu/kernels/knn_exact.py; its share of rows certified from the
candidates and its recomputed rows); the share of rows where both give the same neighbours in the same order.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import kkmgpu  # noqa: E402
from kkmgpu.metrics import nmi  # noqa: E402

SCHEMA = "kkmgpu-bench-graphs/1"
SETS = ("aggregation", "compound", "flame", "jain", "r15", "moons", "spirals", "wifi", "wine", "digits",
        "mnist-2000", "mnist-5000")
CONTESTANTS = ("sklearn", "ncut", "ncut_kmeanspp", "ncut_search", "ratio_association", "rbf", "landmark")
N_NEIGHBORS = 10


def Run(device, argv):
    from _kkmgpu_bench import ScriptRun

    return ScriptRun(device, argv, script="bench/bench_graphs.py", topic="graphs", schema=SCHEMA)


def load_set(name):
    if name == "moons":
        from sklearn.datasets import make_moons

        X, y = make_moons(1000, noise=0.08, random_state=0)
        return X, y, 2
    if name == "spirals":
        X, y = kkmgpu.datasets.make_two_spirals(1000, random_state=0)
        return X, y, 2
    from kkmgpu.compare.data import load_dataset

    data = load_dataset(name)
    return np.asarray(data.X, dtype=np.float64), np.asarray(data.y), data.k


def contestant(name, X, k, seed, device):
    if name == "sklearn":
        import warnings

        from sklearn.cluster import SpectralClustering

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "Graph is not fully connected"
            return SpectralClustering(k, affinity="nearest_neighbors", n_neighbors=N_NEIGHBORS,
                                      random_state=seed).fit(X).labels_
    common = dict(device=device, random_state=seed)
    if name == "ncut":
        return kkmgpu.fit(X, k, objective="ncut", n_neighbors=N_NEIGHBORS, **common).labels
    if name == "ncut_kmeanspp":
        return kkmgpu.fit(X, k, objective="ncut", n_neighbors=N_NEIGHBORS, init="k-means++", n_init=10,
                          **common).labels
    if name == "ncut_search":
        return kkmgpu.fit(X, k, objective="ncut", n_neighbors="search", **common)
    if name == "landmark":
        return kkmgpu.fit(X, k, objective="ncut", method="landmark", **common).labels
    if name == "ratio_association":
        return kkmgpu.fit(X, k, objective="ratio_association", n_neighbors=N_NEIGHBORS, **common).labels
    return kkmgpu.fit(X, k, n_init=10, **common).labels


def quality(args):
    run = Run(args.device, sys.argv[1:])
    means = {}
    for name in args.sets:
        X, y, k = load_set(name)
        print(f"{name}: n={X.shape[0]}, d={X.shape[1]}, k={k}", flush=True)
        for who in args.contestants:
            scores, seconds, extra = [], [], {}
            for seed in args.seeds:
                t0 = time.perf_counter()
                out = contestant(who, X, k, seed, args.device)
                took = time.perf_counter() - t0
                if who == "ncut_search":
                    extra = {"n_neighbors": out.method_params["n_neighbors"],
                             "ratio": out.method_params["graph_search"].chosen.ratio}
                    out = out.labels
                score = nmi(y, np.asarray(out))
                scores.append(score)
                seconds.append(took)
                run.add({"id": f"quality-{name}-{who}-seed{seed}", "kind": "quality", "set": name, "n": X.shape[0],
                         "k": k, "contestant": who, "seed": seed, "nmi": score, "seconds": took, **extra})
            means[name, who] = (statistics.fmean(scores), statistics.fmean(seconds))
            print(f"  {who:18s} NMI {means[name, who][0]:.3f}  {means[name, who][1]:.2f} s", flush=True)
    print_table(means, args.sets, args.contestants)


def print_table(means, sets, contestants):
    print("\n| set | " + " | ".join(contestants) + " |")
    print("|---|" + "---|" * len(contestants))
    for name in sets:
        print(f"| {name} | " + " | ".join(f"{means[name, c][0]:.3f}" for c in contestants) + " |")
    print("| **mean** | " + " | ".join(f"**{statistics.fmean(means[s, c][0] for s in sets):.3f}**"
                                      for c in contestants) + " |")


def load_mnist(n, noise=0.05, seed=0):
    X, y = kkmgpu.datasets.load_mnist()   # pixels already in [0, 1] (dividing by 255 again made the noise of the
    X = np.asarray(X, dtype=np.float32)     # repeated copies above 70,000 points 255 times the digits' own scale)
    if n <= X.shape[0]:
        pick = np.random.default_rng(seed).permutation(X.shape[0])[:n] if n < X.shape[0] else slice(None)
        return X[pick], y[pick]
    reps = -(-n // X.shape[0])
    rng = np.random.default_rng(seed)
    Xs = np.concatenate([X if r == 0 else X + rng.normal(scale=noise, size=X.shape).astype(np.float32)
                         for r in range(reps)])[:n]
    return Xs, np.tile(y, reps)[:n]


def child(args):
    X, y = load_mnist(args.n)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    t0 = time.perf_counter()
    timings = {}
    if args.who == "kkmgpu":
        result = kkmgpu.fit(X, 10, objective="ncut", n_neighbors=args.n_neighbors, device=args.device,
                            random_state=0)
        labels, timings = np.asarray(result.labels), result.timings
    else:
        from sklearn.cluster import SpectralClustering

        solver = args.who.split("-", 1)[1]
        labels = SpectralClustering(10, affinity="nearest_neighbors", n_neighbors=args.n_neighbors,
                                    eigen_solver=solver, random_state=0, n_jobs=-1).fit(X).labels_
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps({"seconds": seconds, "nmi": nmi(y, labels), "peak_rss_gib": peak, "data_rss_gib": base,
                      "timings": timings}))


def speed(args):
    run = Run(args.device, sys.argv[1:])
    contestants = list(args.contestants)
    try:
        import pyamg  # noqa: F401
    except ImportError:
        if "sklearn-amg" in contestants:
            print("pyamg is not installed: SpectralClustering(eigen_solver='amg') not measured")
            contestants.remove("sklearn-amg")
    print(f"MNIST n={args.n}, {args.n_neighbors} neighbours, k=10, device {args.device}")
    for who in contestants:
        command = [sys.executable, __file__, "child", "--who", who, "--n", str(args.n), "--n-neighbors",
                   str(args.n_neighbors), "--device", args.device if who == "kkmgpu" else "cpu"]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
            measured = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {
                "error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
        except subprocess.TimeoutExpired:
            measured = {"timed_out": True, "seconds_at_least": args.timeout}
        measured["wall_with_load_seconds"] = time.perf_counter() - t0
        case = run.add({"id": f"speed-n{args.n}-k{args.n_neighbors}-{who}-{args.device if who == 'kkmgpu' else 'cpu'}",
                        "kind": "speed", "n": args.n, "n_neighbors": args.n_neighbors, "contestant": who, **measured})
        print(f"  {who:16s} {json.dumps({k: v for k, v in case.items() if k not in ('id', 'run_id')})}", flush=True)


def make_many_clusters(n, k=100, *, equal=False, box=100.0, seed=0):
    """(X, y): ``k`` Gaussian clusters (unit spread) in 2-D with centres uniform in [0, box]^2, the sizes of
    unequal clusters from a Dirichlet(2) draw (at least 5 points each), equal ones n // k; birch2-like."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.0, box, size=(k, 2))
    if equal:
        sizes = np.full(k, n // k)
    else:
        sizes = np.maximum(np.round(rng.dirichlet(np.full(k, 2.0)) * n).astype(int), 5)
    y = np.repeat(np.arange(k), sizes)
    X = centres[y] + rng.normal(size=(y.size, 2))
    order = rng.permutation(y.size)
    return X[order], y[order]


def many_clusters(args):
    """kkmgpu's ncut and scikit-learn's SpectralClustering(nearest_neighbors) on make_many_clusters sets, in this
    process, one after the other per seed (the same load for both): seconds, NMI and their ratio."""
    import warnings

    from sklearn.cluster import SpectralClustering

    run = Run(args.device, sys.argv[1:])
    kkmgpu.fit(make_many_clusters(300, 3)[0], 3, objective="ncut", device=args.device, random_state=0)  # warm-up
    for n in args.n:
        X, y = make_many_clusters(n, args.k, equal=args.equal, box=args.box)
        print(f"{args.k} clusters ({'equal' if args.equal else 'unequal'}), n={X.shape[0]}, box {args.box:g}",
              flush=True)
        for seed in args.seeds:
            t0 = time.perf_counter()
            result = kkmgpu.fit(X, args.k, objective="ncut", n_neighbors=N_NEIGHBORS, device=args.device,
                                random_state=seed)
            ours = time.perf_counter() - t0
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "Graph is not fully connected"
                theirs_labels = SpectralClustering(args.k, affinity="nearest_neighbors", n_neighbors=N_NEIGHBORS,
                                                   random_state=seed).fit(X).labels_
            theirs = time.perf_counter() - t0
            row = {"n": int(X.shape[0]), "k": args.k, "equal": args.equal, "box": args.box, "seed": seed,
                   "kkmgpu_seconds": ours, "kkmgpu_nmi": nmi(y, np.asarray(result.labels)),
                   "sklearn_seconds": theirs, "sklearn_nmi": nmi(y, theirs_labels), "ratio": ours / theirs,
                   "timings": result.timings, "components": result.method_params.get("spectral_components"),
                   "spectral_seconds": result.method_params.get("spectral_seconds")}
            run.add({"id": f"many-clusters-n{X.shape[0]}-k{args.k}-seed{seed}", "kind": "many-clusters", **row})
            print(f"  seed {seed}: kkmgpu {ours:.2f} s (NMI {row['kkmgpu_nmi']:.4f}), sklearn {theirs:.2f} s "
                  f"(NMI {row['sklearn_nmi']:.4f}), ratio {row['ratio']:.2f}; kkmgpu "
                  + ", ".join(f"{key} {value:.2f} s" for key, value in result.timings.items())
                  + f" (eigenvectors {row['spectral_seconds']:.2f} s, {row['components']} components)", flush=True)


def fixed_cost(args):
    """The small sets' fixed cost (issue 29 point 1): kkmgpu's default ncut and scikit-learn's
    SpectralClustering(nearest_neighbors, arpack) alternately in this process, ``--repeats`` times per set and
    seed after a warm-up of each: median seconds, their ratio, kkmgpu's median timings and both NMIs. Written to
    ``bench/results/<date>-<device>-graphs-fixedcost.json``."""
    import os
    import warnings

    from _kkmgpu_bench import ScriptRun
    from sklearn.cluster import SpectralClustering

    run = ScriptRun(args.device, ["fixed-cost", *sys.argv[2:]], script="bench/bench_graphs.py",
                    topic="graphs-fixedcost", schema=SCHEMA)

    def sklearn(X, k, seed):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "Graph is not fully connected"
            return SpectralClustering(k, affinity="nearest_neighbors", n_neighbors=N_NEIGHBORS,
                                      random_state=seed).fit(X).labels_

    for name in args.sets:
        X, y, k = load_set(name)
        for seed in args.seeds:
            kkmgpu.fit(X, k, objective="ncut", device=args.device, random_state=seed)   # warm-up
            sklearn(X, k, seed)
            ours, theirs, timings = [], [], []
            load = os.getloadavg()[0]
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                result = kkmgpu.fit(X, k, objective="ncut", device=args.device, random_state=seed)
                ours.append(time.perf_counter() - t0)
                timings.append(result.timings)
                t0 = time.perf_counter()
                labels = sklearn(X, k, seed)
                theirs.append(time.perf_counter() - t0)
            row = {"set": name, "n": int(X.shape[0]), "k": k, "seed": seed, "repeats": args.repeats,
                   "kkmgpu_seconds": statistics.median(ours), "sklearn_seconds": statistics.median(theirs),
                   "kkmgpu_nmi": nmi(y, np.asarray(result.labels)), "sklearn_nmi": nmi(y, labels),
                   "timings": {key: statistics.median(t[key] for t in timings) for key in timings[0]},
                   "components": result.method_params.get("spectral_components"),
                   "load_average": [load, os.getloadavg()[0]]}
            row["ratio"] = row["kkmgpu_seconds"] / row["sklearn_seconds"]
            run.add({"id": f"fixed-cost-{name}-seed{seed}", "kind": "fixed-cost", **row})
            print(f"{name:12s} seed {seed}: kkmgpu {1e3 * row['kkmgpu_seconds']:.1f} ms (NMI {row['kkmgpu_nmi']:.3f}), "
                  f"sklearn {1e3 * row['sklearn_seconds']:.1f} ms (NMI {row['sklearn_nmi']:.3f}), ratio "
                  f"{row['ratio']:.2f}; kkmgpu " + ", ".join(f"{key} {1e3 * v:.1f}" for key, v in row["timings"].items())
                  + f" ms; load {load:.1f}", flush=True)


def plot(args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    X, y = kkmgpu.datasets.make_two_spirals(1000, random_state=0)
    rbf = kkmgpu.fit(X, 2, gamma="search", device="cpu", random_state=0)
    ncut = kkmgpu.fit(X, 2, objective="ncut", device="cpu", random_state=0)
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    for ax, result, title in ((axes[0], rbf, "kernel k-means, RBF, gamma='search'"),
                              (axes[1], ncut, "objective='ncut', 10 neighbours")):
        ax.scatter(X[:, 0], X[:, 1], c=np.asarray(result.labels), s=6, cmap="coolwarm")
        ax.set_title(f"{title}\nNMI {nmi(y, result.labels):.2f}", fontsize=10)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    out = Path(args.out)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def search(args):
    """The CPU graph step taken apart on MNIST's centred features: the bounded search's plan, its search on z,
    its two walks (its own report), against the certified brute-force search on all pixels (exact neighbours, its
    own report under "brute_force"); and whether both give the same neighbours, nearest first."""
    from kkmgpu.kernels import knn_bounds

    run = Run("cpu", sys.argv[1:])
    X, _ = load_mnist(args.n)
    A = X - X.mean(axis=0, dtype=np.float64).astype(np.float32)
    n = A.shape[0]
    k = args.n_neighbors
    knn_bounds.nearest_neighbors(A[:knn_bounds.MIN_ROWS + 1000], k)   # numba's cache, compiled or loaded
    clock = time.perf_counter
    report = {}
    t = clock()
    index = knn_bounds.nearest_neighbors(A, k, report=report)
    steps = {"bounded_total": clock() - t, **report.pop("seconds")}
    case = {"id": f"search-n{n}-k{k}-cpu", "kind": "search", "n": n, "n_neighbors": k, **report}
    brute_report = {}
    t = clock()
    brute = knn_bounds.nearest_neighbors(A, k, prune=False, report=brute_report)
    steps["brute_force"] = clock() - t
    brute_report.pop("seconds", None)
    case.update(seconds=steps, brute_force=brute_report,
                same_neighbours_rows=float((index == brute).all(axis=1).mean()))
    run.add(case)
    print(json.dumps(case, default=str))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["landmark"]:  # the landmark route's phases: bench/bench_landmark.py
        from bench_landmark import main as landmark

        return landmark(argv[1:], Run)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    q.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    q.add_argument("--contestants", nargs="+", default=list(CONTESTANTS), choices=CONTESTANTS)
    q.add_argument("--device", default="cpu")
    s = sub.add_parser("speed")
    s.add_argument("--n", type=int, default=70_000)
    s.add_argument("--n-neighbors", type=int, default=N_NEIGHBORS)
    s.add_argument("--timeout", type=float, default=3000)
    s.add_argument("--device", default="cpu")
    s.add_argument("--contestants", nargs="+", default=["kkmgpu", "sklearn-arpack", "sklearn-amg"],
                   choices=("kkmgpu", "sklearn-arpack", "sklearn-amg"))
    b = sub.add_parser("search")
    b.add_argument("--n", type=int, default=70_000)
    b.add_argument("--n-neighbors", type=int, default=N_NEIGHBORS)
    c = sub.add_parser("child")
    c.add_argument("--who", required=True)
    c.add_argument("--n", type=int, required=True)
    c.add_argument("--n-neighbors", type=int, required=True)
    c.add_argument("--device", default="cpu")
    m = sub.add_parser("many-clusters")
    m.add_argument("--n", type=int, nargs="+", default=[5_000, 20_000, 100_000])
    m.add_argument("--k", type=int, default=100)
    m.add_argument("--equal", action="store_true")
    m.add_argument("--box", type=float, default=100.0)
    m.add_argument("--seeds", type=int, nargs="+", default=[0])
    m.add_argument("--device", default="cpu")
    f = sub.add_parser("fixed-cost")
    f.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    f.add_argument("--seeds", type=int, nargs="+", default=[0])
    f.add_argument("--repeats", type=int, default=7)
    f.add_argument("--device", default="cpu")
    p = sub.add_parser("plot")
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "images" / "spirals-ncut.png"))
    args = parser.parse_args(argv)
    {"quality": quality, "speed": speed, "search": search, "child": child, "plot": plot,
     "many-clusters": many_clusters, "fixed-cost": fixed_cost}[args.command](args)


if __name__ == "__main__":
    main()
