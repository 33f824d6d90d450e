"""What a label-free choice within one family could reach at best (issue 28 point 3): the oracle bound.

For every set of the chosen half (seed 0), this fits each graph of a family at every size its search may pick
(5, 7, 10, 15, 20, 30 neighbours, as ``n_neighbors="search"`` does) and kernel k-means with an RBF kernel at a
grid of gammas that covers the bandwidth search's walk (the 1st percentile of the pairwise squared distances up
to K all ones); then it takes, per set, the best NMI any of them reaches, *with the labels*. The mean of those
maxima bounds every rule that chooses within the family: no label-free rule can pick better than the best
candidate of each set. It decides nothing: no rule is chosen from it, it only says whether a bar can be reached.

    python bench/selection_tuning/oracle.py validation oracle.json

Writes one JSON record per (set, candidate) and prints the bound per family beside the best fixed settings.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time
import warnings

import numpy as np
from scipy.spatial.distance import pdist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import kkmgpu  # noqa: E402
from bench_selection import AFFINITIES, REGISTRY, half_of, load_set  # noqa: E402
from sklearn.metrics import normalized_mutual_info_score  # noqa: E402

SIZES = (5, 7, 10, 15, 20, 30)
GAMMAS_PER_DECADE = 4


def gamma_grid(X):
    """Gammas (kkmgpu's RBF: exp(-gamma ||x - y||^2)) from 10 / (1st percentile of the pairwise squared
    distances) down to 0.1 / (99th percentile), GAMMAS_PER_DECADE per decade: from nearly the identity kernel to
    nearly all ones (a sample of 2,000 points gives the percentiles)."""
    rng = np.random.default_rng(0)
    sq = pdist(X[rng.permutation(X.shape[0])[:2000]].astype(np.float64), "sqeuclidean")
    lo, hi = 0.1 / np.percentile(sq, 99), 10.0 / np.percentile(sq[sq > 0], 1)
    count = int(np.ceil(GAMMAS_PER_DECADE * np.log10(hi / lo))) + 1
    return np.geomspace(lo, hi, count)


def main(argv):
    half, out = argv[0], pathlib.Path(argv[1])
    names = sorted(name for name in REGISTRY if half == "all" or half_of(name) == half)
    records = []
    for name in names:
        try:
            X, y, k = load_set(name)
        except Exception as exc:  # a set whose data is absent here
            print(f"{name}: skipped ({exc})", flush=True)
            continue
        candidates = [(f"kkm-{a}-{m}", dict(objective="ncut", affinity=a, n_neighbors=m))
                      for a in AFFINITIES for m in SIZES]
        candidates += [(f"kkm-rbf-gamma{g:.3e}", dict(kernel="rbf", gamma=float(g), n_init=10))
                       for g in gamma_grid(X)]
        for label, kwargs in candidates:
            t0 = time.perf_counter()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    labels = np.asarray(kkmgpu.fit(X, k, device="cpu", random_state=0, **kwargs).labels)
                nmi = float(normalized_mutual_info_score(y, labels))
            except Exception as exc:  # recorded: a candidate the search could not have picked either
                nmi = None
                print(f"{name} {label}: {type(exc).__name__}: {exc}", flush=True)
            records.append({"set": name, "half": half_of(name), "candidate": label, "nmi": nmi,
                            "seconds": time.perf_counter() - t0})
        best = {fam: max((r["nmi"] or 0.0) for r in records if r["set"] == name and r["candidate"].startswith(fam))
                for fam in (*(f"kkm-{a}-" for a in AFFINITIES), "kkm-rbf-gamma")}
        print(name, " ".join(f"{fam.strip('-')} {v:.3f}" for fam, v in best.items()), flush=True)
        out.write_text(json.dumps({"half": half, "sizes": SIZES, "gammas_per_decade": GAMMAS_PER_DECADE,
                                   "records": records}, indent=1))
    summary(records)


def summary(records):
    sets = sorted({r["set"] for r in records})
    print(f"\nOracle bounds over {len(sets)} sets (mean over sets of the best NMI among a family's candidates):")
    for fam in (*(f"kkm-{a}-" for a in AFFINITIES), "kkm-rbf-gamma"):
        per_set = [max((r["nmi"] or 0.0) for r in records if r["set"] == s and r["candidate"].startswith(fam))
                   for s in sets]
        print(f"  {fam.strip('-'):18s} {np.mean(per_set):.4f}")
    for label in sorted({r["candidate"] for r in records if not r["candidate"].startswith("kkm-rbf")}):
        values = [r["nmi"] or 0.0 for r in records if r["candidate"] == label]
        print(f"  fixed {label:22s} {np.mean(values):.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
