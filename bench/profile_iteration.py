"""Where the time of one exact Lloyd iteration goes, step by step, on one device.

Reproduces the steps of ``kkmgpu.engine.lloyd.lloyd`` on an MNIST sample (RBF, k = 10, float32, fixed random
labels) and times each one separately against the memory floor bytes(K) / copy bandwidth:

    cluster sums S (one pass over K) | assignment (fused distance + argmin) | empty-cluster check |
    sizes, within-cluster totals and objective | a whole iteration as the driver runs it

Usage (from the repository root)::

    python bench/profile_iteration.py                 # n = 1000 2000 5000 10000 on the CPU
    python bench/profile_iteration.py --n 10000 --device cuda --repeats 10

It reads private modules of kkmgpu (``_lloyd``, ``_backend``); it is a diagnosis tool, not a benchmark.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _kkmgpu_bench as kb  # noqa: E402

try:
    import kkmgpu  # noqa: F401
except ImportError:
    sys.path.insert(0, str(kb.REPO_ROOT))
    import kkmgpu  # noqa: F401

from kkmgpu.engine import lloyd as _lloyd  # noqa: E402
from kkmgpu.engine.dense import DenseKernelOperator  # noqa: E402
from kkmgpu.backend.device import resolve_device  # noqa: E402

K_CLUSTERS = 10


def _best(fn, backend, repeats):
    fn()  # compile / warm
    best = float("inf")
    for _ in range(repeats):
        t0 = backend.timer()
        fn()
        best = min(best, backend.timer() - t0)
    return best


def profile(n, device, repeats, floors, mnist):
    backend = resolve_device(device)
    xp = backend.xp
    X, _ = kb.mnist_sample(mnist, n, seed=0)
    gamma = 1.0 / (X.shape[1] * float(X.astype(np.float64).var()))
    K = kkmgpu.kernel_matrix(X, kernel="rbf", gamma=gamma, device=device, dtype="float32")
    weights = xp.ones(n, dtype=K.dtype)
    operator = DenseKernelOperator(K, weights, backend)
    rng = np.random.default_rng(0)
    labels = backend.asarray(_lloyd.random_partition(n, K_CLUSTERS, rng), dtype=np.int32)
    S, sizes, within, _ = _lloyd._update(operator, labels, K_CLUSTERS, xp)
    new_labels, _, _ = backend.ops.assign_labels(S, operator.diag, sizes, within, labels)

    steps = {
        "cluster_sums": lambda: operator.cluster_sums(new_labels, K_CLUSTERS),
        "assign_labels": lambda: backend.ops.assign_labels(S, operator.diag, sizes, within, labels),
        "empty_check": lambda: xp.bincount(new_labels, minlength=K_CLUSTERS).min() == 0,
        "update (sums+sizes+objective)": lambda: _lloyd._update(operator, new_labels, K_CLUSTERS, xp),
    }
    ones = xp.ones(n, dtype=K.dtype)
    steps["reference: K @ 1 (BLAS gemv, one read of K)"] = lambda: K @ ones
    out = {name: _best(fn, backend, repeats) for name, fn in steps.items()}
    out["update minus cluster_sums"] = out["update (sums+sizes+objective)"] - out["cluster_sums"]
    iterations = 10

    def driver():
        init = backend.asarray(_lloyd.random_partition(n, K_CLUSTERS, np.random.default_rng(0)), dtype=np.int32)
        return _lloyd.lloyd(operator, init, K_CLUSTERS, max_iter=iterations, tol=0)

    run = driver()
    out["driver per iteration"] = _best(driver, backend, max(2, repeats // 2)) / run.n_iter
    floors.measure(device)  # a second sample, taken with K allocated (the floor uses the best rate)
    floor = n * n * K.dtype.itemsize / floors.copy_bandwidth(device)
    return out, floor, run.n_iter


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 2000, 5000, 10000])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    from kkmgpu.datasets import load_mnist

    mnist = load_mnist(kb.mnist_dir())
    floors = kb.Floors()
    bw = floors.copy_bandwidth(args.device)
    print(f"device {args.device}: copy bandwidth {bw / 1e9:.1f} GB/s (read + write), "
          f"read {floors.bandwidths(args.device)['read_bandwidth_Bps'] / 1e9:.1f} GB/s")
    for n in args.n:
        times, floor, n_iter = profile(n, args.device, args.repeats, floors, mnist)
        bw = floors.copy_bandwidth(args.device)
        print(f"\nn = {n}: memory floor {floor * 1e3:.2f} ms (bytes(K) = {n * n * 4 / 2**20:.1f} MiB, "
              f"best copy bandwidth so far {bw / 1e9:.1f} GB/s)")
        for name, seconds in times.items():
            print(f"  {name:45s} {seconds * 1e3:9.3f} ms  {seconds / floor:7.2f} x floor")
        print(f"  (driver run: {n_iter} iterations, max_iter=10, tol=0)")


if __name__ == "__main__":
    main()
