"""Kernel error and labels of each GEMM precision mode (``gemm_precision``) against float64, on MNIST.

    python bench/gemm_precision.py --device cuda [--n 3000] [--seeds 3] [--json out.json]
    python bench/gemm_precision.py --emulate      # the CuPy stand-in: TF32 rounding modelled on the CPU

For n MNIST points (pixels / 255, a seeded subset) and the RBF kernel with gamma="scale": max and mean |K_mode -
K_float64| of ``kkmgpu.kernel_matrix`` in each mode against a float64 reference (SciPy's squared distances), and
for ``seeds`` random initial partitions the agreement of ``kkmgpu.fit``'s labels (k = 10, dense engine, tol=0)
with float64's from the same partition, and the relative difference of the objectives. On a real GPU it also
times the kernel build of each mode (best of 3, after a warm-up); the stand-in's times mean nothing and are not
printed. docs/performance.md ("GEMM precision") quotes it.
"""

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--emulate", action="store_true", help="run device='cuda' on the CuPy stand-in (tests/standin)")
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="also write the results there")
    args = parser.parse_args()
    if args.emulate:
        sys.path.insert(0, str(ROOT / "tests" / "standin"))
        args.device = "cuda"
    sys.path.insert(0, str(ROOT))
    import kkmgpu
    from kkmgpu.backend.device import resolve_device
    from kkmgpu.kernels import gemm
    from scipy.spatial.distance import cdist

    X, _ = kkmgpu.datasets.load_mnist(n_samples=args.n, random_state=0)
    X64 = X.astype(np.float64)
    gamma = 1.0 / (X64.shape[1] * X64.var())
    K64 = np.exp(-gamma * cdist(X64, X64, "sqeuclidean"))
    backend = resolve_device(args.device)
    real_gpu = backend.is_gpu and not args.emulate
    host = backend.to_host
    result = {"device": backend.name, "emulated": bool(args.emulate), "n": args.n, "d": X.shape[1],
              "kernel": "rbf", "gamma": gamma, "modes": {}}
    warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
    fits64 = []
    for seed in range(args.seeds):
        init = np.random.default_rng(seed).integers(0, 10, args.n)
        fits64.append((init, kkmgpu.fit(X, 10, init=init, dtype="float64", tol=0, device=args.device)))
    for mode in gemm.PRECISIONS:
        K = host(kkmgpu.kernel_matrix(X, device=args.device, gemm_precision=mode)).astype(np.float64)
        dK = np.abs(K - K64)
        entry = {"mode_ran": kkmgpu.fit(X[:64], 2, device=args.device, gemm_precision=mode,
                                        random_state=0).method_params["gemm_mode"],
                 "max_abs_dK": float(dK.max()), "mean_abs_dK": float(dK.mean()), "fits": []}
        del K, dK
        for init, exact in fits64:
            r = kkmgpu.fit(X, 10, init=init, tol=0, device=args.device, gemm_precision=mode)
            entry["fits"].append({"label_agreement": float(np.mean(host(r.labels) == host(exact.labels))),
                                  "objective_rel_diff": (r.objective - exact.objective) / abs(exact.objective),
                                  "n_iter": r.n_iter, "n_iter_float64": exact.n_iter})
        if real_gpu:
            times = []
            for _ in range(4):
                t0 = backend.timer()
                kkmgpu.kernel_matrix(X, device=args.device, gemm_precision=mode)
                times.append(backend.timer() - t0)
            entry["kernel_matrix_seconds_best"] = min(times[1:])
        result["modes"][mode] = entry
    print(f"MNIST n={args.n}, rbf gamma='scale', {result['device']}"
          + (" (emulated: the CuPy stand-in models TF32 rounding)" if args.emulate else ""))
    print("| mode | ran | max abs dK | mean abs dK | label agreement with float64 (min / mean) | "
          "objective vs float64 (max rel. diff) |" + (" kernel_matrix s |" if real_gpu else ""))
    print("|---|---|---|---|---|---|" + ("---|" if real_gpu else ""))
    for mode, e in result["modes"].items():
        agree = [f["label_agreement"] for f in e["fits"]]
        diff = max(abs(f["objective_rel_diff"]) for f in e["fits"])
        print(f"| {mode} | {e['mode_ran']} | {e['max_abs_dK']:.2g} | {e['mean_abs_dK']:.2g} | {min(agree):.4f} / "
              f"{np.mean(agree):.4f} | {diff:.1e} |" + (f" {e['kernel_matrix_seconds_best']:.4f} |" if real_gpu else ""))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
