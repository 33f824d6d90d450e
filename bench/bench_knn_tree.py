"""Where the CPU's k-d tree neighbour search pays (kkmgpu/kernels/knn_tree.py, MAX_FEATURES).

    python bench/bench_knn_tree.py [--n 1000 5000 20000] [--d 2 3 4 5 6 8 10 12] [--k 10] [--repeats 3]

For each (n, d): Gaussian points with unequal column scales (seed 0), float64; the certified brute-force search
(:func:`kkmgpu.kernels.knn_exact.search`) and the tree (:func:`kkmgpu.kernels.knn_tree.search`, its feature
limit lifted) one after the other in this process, best of ``--repeats``, and whether their lists and distances are
identical. Written to ``bench/results/<date>-<device>-knn-tree.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 5000, 20000])
    parser.add_argument("--d", type=int, nargs="+", default=[2, 3, 4, 5, 6, 8, 10, 12])
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    import numba

    from _kkmgpu_bench import ScriptRun
    from kkmgpu.backend.device import Backend
    from kkmgpu.kernels import knn_exact, knn_tree

    run = ScriptRun("cpu", sys.argv[1:], script="bench/bench_knn_tree.py", topic="knn-tree",
                    schema="kkmgpu-bench-knn-tree/1")
    knn_tree.MAX_FEATURES = max(args.d)
    cpu = Backend("cpu")
    for n in args.n:
        for d in args.d:
            rng = np.random.default_rng(0)
            X = rng.normal(size=(n, d)) * rng.uniform(0.1, 3.0, size=d)
            brute, tree = [], []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                want = knn_exact.search(X, args.k, cpu)
                brute.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                got = knn_tree.search(X, args.k, workers=numba.get_num_threads())
                tree.append(time.perf_counter() - t0)
            same = bool(np.array_equal(want[0], got[0]) and np.array_equal(want[1], got[1]))
            row = {"n": n, "d": d, "k": args.k, "brute_seconds": min(brute), "tree_seconds": min(tree),
                   "ratio": min(tree) / min(brute), "identical": same, "load_average": os.getloadavg()[0]}
            run.add({"id": f"knn-tree-n{n}-d{d}-k{args.k}", "kind": "knn-tree", **row})
            print(f"n={n:6d} d={d:3d}: brute {1e3 * min(brute):8.1f} ms, tree {1e3 * min(tree):8.1f} ms, "
                  f"ratio {row['ratio']:.2f}, identical {same}", flush=True)
    run.write()


if __name__ == "__main__":
    main()
