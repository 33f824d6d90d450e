"""Effect of the kernel matrix's storage precision (float64 / float32 / float16) on labels and objective.

    python bench/storage_precision.py [--device cpu] [--seeds 5] [--mnist-n 5000]

For scikit-learn's digits and an MNIST sample (pixels / 255), k = 10, RBF with the default gamma, the same
random initial partitions for every precision: agreement of the labels with float64's, the exact (float64 K)
objective of each partition relative to float64's, and NMI to the true digits. Prints a Markdown table.
"""

import argparse
import warnings

import numpy as np

import kkmgpu
from kkmgpu import metrics


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--mnist-n", type=int, default=5000)
    args = parser.parse_args()
    sets = {}
    try:
        from sklearn.datasets import load_digits

        d = load_digits()
        sets["digits"] = (d.data / 16.0, d.target)
    except ImportError:
        print("scikit-learn missing: digits skipped")
    try:
        sets[f"MNIST {args.mnist_n}"] = kkmgpu.datasets.load_mnist(n_samples=args.mnist_n, random_state=0)
    except FileNotFoundError as exc:
        print(f"MNIST skipped: {exc}")
    print("| data | storage | label agreement with float64 (min / mean) | exact objective vs float64 (max rel. excess) "
          "| NMI to digits (mean, float64: mean) |")
    print("|---|---|---|---|---|")
    warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
    for name, (X, y) in sets.items():
        K64 = kkmgpu.kernel_matrix(X, dtype="float64", device="cpu")
        rows = {"float32": [], "float16": []}
        nmi64 = []
        for seed in range(args.seeds):
            init = np.random.default_rng(seed).integers(0, 10, len(X))
            exact = kkmgpu.fit(X, 10, init=init, dtype="float64", tol=0, device=args.device)
            nmi64.append(metrics.nmi(y, exact.labels))
            for dtype in rows:
                r = kkmgpu.fit(X, 10, init=init, dtype=dtype, tol=0, device=args.device)
                agree = float((np.asarray(r.labels) == np.asarray(exact.labels)).mean())
                excess = (metrics.kernel_kmeans_objective(K64, r.labels) - exact.objective) / exact.objective
                rows[dtype].append((agree, excess, metrics.nmi(y, r.labels)))
        for dtype, vals in rows.items():
            a = np.array(vals)
            print(f"| {name} (n={len(X)}) | {dtype} | {a[:, 0].min():.4f} / {a[:, 0].mean():.4f} | "
                  f"{a[:, 1].max():+.1e} | {a[:, 2].mean():.4f} ({np.mean(nmi64):.4f}) |")


if __name__ == "__main__":
    main()
