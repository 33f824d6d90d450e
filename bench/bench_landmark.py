"""The landmark route of the normalized cut (``fit(objective="ncut", method="landmark")``, issue 29 points 3-4).

    python bench/bench_graphs.py landmark mnist [--seeds 0 1 2] [--device cpu] [--exact] [--sklearn-n 20000]
    python bench/bench_graphs.py landmark million [--n 1000000] [--device cpu]
    python bench/bench_graphs.py landmark curve [--sizes 10000 30000 100000 300000 1000000] [--device cpu]
    python bench/bench_graphs.py landmark grid [--landmarks 1000 1500] [--neighbors 5] [--seeds 0 1 2]
    python bench/bench_graphs.py landmark crossover [--sizes 5000 10000 20000 40000 70000] [--seeds 0]
                                                    [--shapes spirals moons circles blobs100] [--shape-sizes 10000 50000]

Every case runs in a child process (``child``): MNIST (pixels in [0, 1]), a random subset for n < 70,000, and for
n > 70,000 MNIST repeated with Gaussian pixel noise of standard deviation 0.05 clipped to [0, 1]
(bench/bench_frontier.py's data); the child loads the data, warms numba's kernels up on 2,000 points, then fits and reports its wall time
(loading excluded), the fit's own step timings, NMI against the digits, and the peak resident memory above the
loaded data (Linux VmHWM after a reset, minus VmRSS after loading; ru_maxrss where the reset is not allowed).

``mnist``: method="landmark" at its defaults (p = 1000 landmarks, r = 5) for each seed; with ``--exact`` the
exact-graph ncut (its default graph) on all 70,000; with ``--sklearn-n`` scikit-learn's
SpectralClustering(nearest_neighbors, 10 neighbours, amg when pyamg is installed, else arpack) on a random subset
of that size (all 70,000 take it many minutes on 2 cores). The published figures are quoted beside, with the
hardware their papers give (PUBLISHED). ``million``: one fit at n = 10^6. ``curve``: one fit per size.
``grid``: NMI and time of n_landmarks x landmark_neighbors on MNIST-70k (the only set they were tuned on).
``crossover``: which route to take at which n. For each size and seed, the exact-graph ncut (the default call) and
method="landmark" (its defaults) one after the other, each in its own process: MNIST samples (k = 10), then the
shape sets of SHAPES (two spirals of two turns, two moons (noise 0.08), two circles (noise 0.05, factor 0.5), 100
Gaussian clusters of unequal size in 2-D as in bench_graphs.py many-clusters; their own k) at ``--shape-sizes``, where the representatives may not resolve the shapes.

Results merge into ``bench/results/<date>-<device>-graphs-landmark.json``, with the load average of the machine
at the start of each case.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _kkmgpu_bench import mnist_repeated, reset_peak, status_gib  # noqa: E402

import numpy as np  # noqa: E402

SCHEMA = "kkmgpu-bench-graphs/1"

#: MNIST-70k figures of the U-SPEC paper (Huang et al., TKDE 2020) as issue 29 quotes them; the hardware is that
#: paper's desktop CPU, not this machine's
PUBLISHED = {
    "U-SPEC (Huang et al., TKDE 2020)": {"nmi": 0.674, "seconds": 7.5, "hardware": "the U-SPEC paper's desktop CPU"},
    "LSC-K (Chen and Cai, AAAI 2011), as run in the U-SPEC paper": {"nmi": 0.740, "seconds": 16.5,
                                                                    "hardware": "the U-SPEC paper's desktop CPU"},
    "U-SENC (the U-SPEC paper's ensemble)": {"nmi": 0.750, "seconds": 132.0,
                                             "hardware": "the U-SPEC paper's desktop CPU"},
}


load = mnist_repeated


#: the non-MNIST sets of ``crossover``: name -> (k, a function of n giving (X, y))
def _spirals(n):
    import kkmgpu

    return kkmgpu.datasets.make_two_spirals(n, turns=2.0, random_state=0)


def _moons(n):
    from sklearn.datasets import make_moons

    return make_moons(n, noise=0.08, random_state=0)


def _circles(n):
    from sklearn.datasets import make_circles

    return make_circles(n, noise=0.05, factor=0.5, random_state=0)


def _blobs100(n):
    from bench_graphs import make_many_clusters

    return make_many_clusters(n, 100)


SHAPES = {"spirals": (2, _spirals), "moons": (2, _moons), "circles": (2, _circles), "blobs100": (100, _blobs100)}


def child(args):
    import gc

    import kkmgpu
    from kkmgpu.metrics import nmi

    if args.data == "mnist":
        k = 10
        X, y = load(args.n, seed=args.data_seed)
    else:
        k, make = SHAPES[args.data]
        X, y = make(args.n)
    extra = json.loads(args.params)
    if args.who == "landmark":
        def run(data):
            return kkmgpu.fit(data, k, objective="ncut", method="landmark", device=args.device,
                              random_state=args.seed, **extra)
    elif args.who == "exact":
        def run(data):
            return kkmgpu.fit(data, k, objective="ncut", device=args.device, random_state=args.seed, **extra)
    else:
        from sklearn.cluster import SpectralClustering
        try:
            import pyamg  # noqa: F401
            solver = "amg"
        except ImportError:
            solver = "arpack"

        def run(data):
            return SpectralClustering(10, affinity="nearest_neighbors", n_neighbors=10, eigen_solver=solver,
                                      random_state=args.seed, n_jobs=-1).fit(data)
    if args.who != "sklearn":
        run(X[:2000])                   # numba's kernels compiled or loaded: paid once per process
    gc.collect()
    base = status_gib("VmRSS")
    reset = reset_peak()
    t0 = time.perf_counter()
    result = run(X)
    seconds = time.perf_counter() - t0
    peak = status_gib("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    labels = np.asarray(getattr(result, "labels", getattr(result, "labels_", None)))
    out = {"seconds": seconds, "nmi": float(nmi(y, labels)), "peak_above_data_gib": peak - base,
           "data_gib": X.nbytes / 2**30, "peak_since_fit": reset}
    if args.who != "sklearn":
        out.update(timings=result.timings, objective=result.objective, n_iter=result.n_iter,
                   params={k: v for k, v in result.method_params.items()
                           if k in ("n_landmarks", "landmark_neighbors", "sigma", "start_ncut", "landmarks_linked",
                                    "spectral_components", "eigensolver", "affinity", "n_neighbors")})
    else:
        out["eigen_solver"] = solver
    print(json.dumps(out))


def _case(run, who, n, seed, device, params, timeout, tag, data="mnist"):
    command = [sys.executable, str(Path(__file__).resolve()), "child", "--who", who, "--n", str(n), "--seed",
               str(seed), "--device", device, "--params", json.dumps(params), "--data", data]
    load = list(os.getloadavg())
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        measured = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {
            "error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    except subprocess.TimeoutExpired:
        measured = {"timed_out": True, "seconds_at_least": timeout}
    name = "" if data == "mnist" else f"{data}-"
    case = run.add({"id": f"landmark-{tag}-{name}{who}-n{n}-seed{seed}-{json.dumps(params, sort_keys=True)}",
                    "kind": "landmark", "phase": tag, "data": data, "contestant": who, "n": n, "seed": seed,
                    "params": params, "load_average": load, **measured})
    shown = {k: case.get(k) for k in ("seconds", "nmi", "peak_above_data_gib", "error", "timed_out")}
    print(f"  {tag} {data} {who} n={n} seed={seed} {params or ''}: {json.dumps(shown)} (load {load[0]:.2f})",
          flush=True)
    return case


def main(argv, Run=None):
    parser = argparse.ArgumentParser(prog="bench_graphs.py landmark", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="phase", required=True)
    m = sub.add_parser("mnist")
    m.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    m.add_argument("--exact", action="store_true")
    m.add_argument("--sklearn-n", type=int, default=0)
    b = sub.add_parser("million")
    b.add_argument("--n", type=int, default=1_000_000)
    c = sub.add_parser("curve")
    c.add_argument("--sizes", type=int, nargs="+", default=[10_000, 30_000, 100_000, 300_000, 1_000_000])
    g = sub.add_parser("grid")
    g.add_argument("--landmarks", type=int, nargs="+", default=[1000, 1500])
    g.add_argument("--neighbors", type=int, nargs="+", default=[5])
    g.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    x = sub.add_parser("crossover")
    x.add_argument("--sizes", type=int, nargs="*", default=[5_000, 10_000, 20_000, 40_000, 70_000])
    x.add_argument("--seeds", type=int, nargs="+", default=[0])
    x.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    x.add_argument("--shape-sizes", type=int, nargs="*", default=[10_000, 50_000])
    for p in (m, b, c, g, x):
        p.add_argument("--device", default="cpu")
        p.add_argument("--timeout", type=float, default=3000)
    ch = sub.add_parser("child")
    ch.add_argument("--who", required=True)
    ch.add_argument("--n", type=int, required=True)
    ch.add_argument("--seed", type=int, default=0)
    ch.add_argument("--data-seed", type=int, default=0)
    ch.add_argument("--device", default="cpu")
    ch.add_argument("--params", default="{}")
    ch.add_argument("--data", default="mnist", choices=["mnist", *SHAPES])
    args = parser.parse_args(argv)
    if args.phase == "child":
        return child(args)
    from _kkmgpu_bench import ScriptRun

    run = ScriptRun(args.device, ["landmark", *argv], script="bench/bench_graphs.py", topic="graphs-landmark",
                    schema=SCHEMA)
    if args.phase == "mnist":
        for seed in args.seeds:
            _case(run, "landmark", 70_000, seed, args.device, {}, args.timeout, "mnist")
        if args.exact:
            _case(run, "exact", 70_000, 0, args.device, {}, args.timeout, "mnist")
        if args.sklearn_n:
            _case(run, "sklearn", args.sklearn_n, 0, "cpu", {}, args.timeout, "mnist")
        for name, figures in PUBLISHED.items():
            print(f"  published: {name}: NMI {figures['nmi']}, {figures['seconds']} s ({figures['hardware']})")
        run.add({"id": "landmark-published", "kind": "landmark", "phase": "published", "figures": PUBLISHED})
    elif args.phase == "million":
        _case(run, "landmark", args.n, 0, args.device, {}, args.timeout, "million")
    elif args.phase == "crossover":
        for n in args.sizes:
            for seed in args.seeds:
                for who in ("exact", "landmark"):
                    _case(run, who, n, seed, args.device, {}, args.timeout, "crossover")
        for shape in args.shapes:
            for n in args.shape_sizes:
                for seed in args.seeds:
                    for who in ("exact", "landmark"):
                        _case(run, who, n, seed, args.device, {}, args.timeout, "crossover", data=shape)
    elif args.phase == "curve":
        for n in args.sizes:
            _case(run, "landmark", n, 0, args.device, {}, args.timeout, "curve")
    else:
        for p in args.landmarks:
            for r in args.neighbors:
                for seed in args.seeds:
                    _case(run, "landmark", 70_000, seed, args.device, {"n_landmarks": p, "landmark_neighbors": r},
                          args.timeout, "grid")


if __name__ == "__main__":
    main(sys.argv[1:], None)
