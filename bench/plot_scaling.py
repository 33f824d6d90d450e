"""Plot the scaling of exact kernel k-means from a bench/results JSON file (log-log, to a PNG).

Left: per-iteration time of kkmgpu (best round; the marginal two-point estimate as a second marker),
the memory floor bytes(K) / copy bandwidth and twice that floor, one BLAS gemv over the same K (a
read of K at the speed the vendor library gets), and tslearn's per-iteration time where measured. Right: the kernel build time against its floor max(2 n^2 d / GEMM rate, bytes(K) / write bandwidth).

Usage (from the repository root)::

    python bench/plot_scaling.py bench/results/2026-11-22-cpu-amd-epyc-2core.json
    python bench/plot_scaling.py RESULTS.json -o scaling.png

By default the PNG is written next to the JSON file, with the same name.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _series(cases, benchmark, value):
    rows = sorted((case["n"], value(case)) for case in cases if case["benchmark"] == benchmark)
    rows = [(n, v) for n, v in rows if v is not None]
    return [n for n, _ in rows], [v for _, v in rows]


def plot(document: dict, output: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = document["cases"]
    fig, (ax_iter, ax_build) = plt.subplots(1, 2, figsize=(11, 4.4), constrained_layout=True)

    n, t = _series(cases, "exact_iterations", lambda c: c["time_s"]["per_iteration_best"])
    ax_iter.loglog(n, [v * 1e3 for v in t], "o-", color="C0", label="kkmgpu per iteration")
    n_m, t_m = _series(cases, "exact_iterations", lambda c: c["time_s"].get("per_iteration_marginal_wall"))
    if n_m:
        ax_iter.loglog(n_m, [v * 1e3 for v in t_m], "x", color="C0", ms=8, label="kkmgpu, marginal (wall)")
    n_f, f = _series(cases, "exact_iterations", lambda c: c["floor_s"])
    ax_iter.loglog(n_f, [v * 1e3 for v in f], "k--", label="memory floor: bytes(K) / copy bandwidth")
    ax_iter.loglog(n_f, [2e3 * v for v in f], ":", color="0.5", label="2 x floor (target at n = 10k)")
    n_g, t_g = _series(cases, "exact_iterations", lambda c: c["time_s"].get("same_K_gemv"))
    if n_g:
        ax_iter.loglog(n_g, [v * 1e3 for v in t_g], "-.", color="C7", lw=1, label="reference: BLAS gemv K @ 1 on the same K")
    n_ts, t_ts = _series(cases, "tslearn_iterations", lambda c: c["time_s"]["per_iteration_marginal"])
    if n_ts:
        ax_iter.loglog(n_ts, [v * 1e3 for v in t_ts], "s-", color="C3", label="tslearn KernelKMeans per iteration")
    for n_i, t_i, f_i in zip(n, t, f):
        ax_iter.annotate(f"{t_i / f_i:.1f}x", (n_i, t_i * 1e3), textcoords="offset points", xytext=(4, 6),
                         fontsize=8, color="C0")
    ax_iter.set_xlabel("n (MNIST points)")
    ax_iter.set_ylabel("time per Lloyd iteration [ms]")
    ax_iter.set_title("exact iterations, k = 10, RBF, float32")
    ax_iter.grid(True, which="both", alpha=0.3)
    ax_iter.legend(fontsize=8)

    n_b, t_b = _series(cases, "kernel_build", lambda c: c["time_s"]["best"])
    n_bf, f_b = _series(cases, "kernel_build", lambda c: c["floor_s"])
    ax_build.loglog(n_b, [v * 1e3 for v in t_b], "o-", color="C2", label="kkmgpu.kernel_matrix")
    ax_build.loglog(n_bf, [v * 1e3 for v in f_b], "k--", label="floor: max(2n²d / GEMM, bytes(K) / write bw)")
    n_e, t_e = _series(cases, "fit_end_to_end", lambda c: c["time_s"]["best"])
    if n_e:
        ax_build.loglog(n_e, [v * 1e3 for v in t_e], "^-", color="C1", label="fit end to end (build + iterations)")
    ax_build.set_xlabel("n (MNIST points)")
    ax_build.set_ylabel("time [ms]")
    ax_build.set_title("kernel build and whole fit")
    ax_build.grid(True, which="both", alpha=0.3)
    ax_build.legend(fontsize=8)

    versions = document.get("versions", {})
    fig.suptitle(f"kkmgpu {versions.get('kkmgpu')} on {document.get('device_name')} "
                 f"(numpy {versions.get('numpy')}, numba {versions.get('numba')}"
                 + (f", cupy {versions['cupy']}" if versions.get("cupy") else "") + ")", fontsize=10)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a bench/results/*.json file")
    parser.add_argument("-o", "--output", type=Path, help="PNG path (default: the JSON path with .png)")
    args = parser.parse_args(argv)
    document = json.loads(args.results.read_text())
    output = plot(document, args.output or args.results.with_suffix(".png"))
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
