"""Is issue 29's MNIST-5000 shortfall (kkmgpu's default ncut 0.672 against scikit-learn's 0.686 on the subsample of
``bench_graphs.py quality``) a property of the default graph on MNIST, or of that one subsample?

Ten other random 5,000-point subsamples of MNIST's 70,000 digits (permutation seeds 100-109, pixels in [0, 1],
float32): ``kkmgpu.fit(X, 10, objective="ncut")`` (the default self_tuning graph), the same with
``affinity="knn"``, and scikit-learn's ``SpectralClustering(10, affinity="nearest_neighbors", n_neighbors=10)``,
random_state 0 each; NMI against the labels, and the mean difference default - scikit-learn with its standard
error. It decides nothing (MNIST is in the validation half of issue 28's benchmark): it describes.

    python bench/probes/mnist_subsamples.py [--json OUT]
"""
import argparse
import json
import warnings

import numpy as np

import kkmgpu


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(100, 110)))
    a = p.parse_args(argv)
    from sklearn.cluster import SpectralClustering
    from sklearn.metrics import normalized_mutual_info_score as nmi

    X, y = kkmgpu.datasets.load_mnist()
    X = np.asarray(X, dtype=np.float32)
    rows = []
    for s in a.seeds:
        pick = np.random.default_rng(s).permutation(X.shape[0])[:5000]
        Xs, ys = X[pick], y[pick]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            row = {"subsample_seed": s,
                   "default": nmi(ys, kkmgpu.fit(Xs, 10, objective="ncut", device="cpu", random_state=0).labels),
                   "knn": nmi(ys, kkmgpu.fit(Xs, 10, objective="ncut", affinity="knn", device="cpu",
                                             random_state=0).labels),
                   "sklearn": nmi(ys, SpectralClustering(10, affinity="nearest_neighbors", n_neighbors=10,
                                                         random_state=0).fit(Xs).labels_)}
        rows.append(row)
        print(f"subsample {s}: default {row['default']:.3f}, knn {row['knn']:.3f}, scikit-learn {row['sklearn']:.3f}",
              flush=True)
    diff = np.array([r["default"] - r["sklearn"] for r in rows])
    summary = {name: float(np.mean([r[name] for r in rows])) for name in ("default", "knn", "sklearn")}
    summary.update(default_minus_sklearn=float(diff.mean()),
                   standard_error=float(diff.std(ddof=1) / np.sqrt(diff.size)) if diff.size > 1 else None)
    print("mean: " + ", ".join(f"{k} {v:.4f}" for k, v in summary.items() if v is not None))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
