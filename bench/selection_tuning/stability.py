"""Issue 28 point 3: is the stability of a graph's partition under subsampling a better label-free choice of the
graph than the eigenvalue ratio of ``affinity="search"``? Tuning half only.

For every tuning set (seed 0) and each of the nine graphs ``affinity="search"`` weighs (knn, mutual_knn and
self_tuning at 5, 10 and 20 neighbours), this fits ``objective="ncut"`` on all points, then on ``--repeats``
random subsamples of ``--fraction`` of the points (the same subsamples for every graph), and records the adjusted
Rand index between each subsample's labels and the full fit's labels on the same points (the stability), with the
full fit's NMI. ``--score FILE`` then scores rules on the records: the most stable graph, the most stable among
the ratio rule's near-winners, and the ratio rule itself (the eigenvalues from round 1's criteria file, as
``analyze.py`` reads them).

    python bench/selection_tuning/stability.py run stability.json [--repeats 3] [--fraction 0.8]
    python bench/selection_tuning/stability.py score stability.json criteria.json

It reads only the tuning sets (``bench_selection.half_of``), never a validation set.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import kkmgpu  # noqa: E402
from bench_selection import AFFINITIES, REGISTRY, half_of, load_set  # noqa: E402
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score  # noqa: E402

SIZES = (5, 10, 20)


def fit_labels(X, k, affinity, m):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(kkmgpu.fit(X, k, objective="ncut", affinity=affinity, n_neighbors=m, device="cpu",
                                     random_state=0).labels)


def run(out, repeats, fraction):
    names = sorted(name for name in REGISTRY if half_of(name) == "tuning")
    records = []
    for name in names:
        X, y, k = load_set(name)
        n = X.shape[0]
        rng = np.random.default_rng(12345)
        subs = [np.sort(rng.choice(n, int(round(fraction * n)), replace=False)) for _ in range(repeats)]
        for a in AFFINITIES:
            for m in SIZES:
                t0 = time.perf_counter()
                try:
                    full = fit_labels(X, k, a, m)
                    aris = [float(adjusted_rand_score(full[s], fit_labels(X[s], k, a, m))) for s in subs]
                    nmi = float(normalized_mutual_info_score(y, full))
                except ValueError as exc:   # a graph the search could not use either (too few points, ...)
                    print(f"{name} {a}-{m}: {exc}", flush=True)
                    continue
                records.append({"set": name, "fam": a, "m": m, "k": k, "n": n, "nmi": nmi, "aris": aris,
                                "stability": float(np.mean(aris)), "seconds": time.perf_counter() - t0})
                print(f"{name:36s} {a:12s} {m:3d}  NMI {nmi:.3f}  stability {np.mean(aris):.3f} "
                      f"({' '.join(f'{v:.2f}' for v in aris)})", flush=True)
        out.write_text(json.dumps({"half": "tuning", "repeats": repeats, "fraction": fraction, "sizes": SIZES,
                                   "records": records}, indent=1))


def score(stab_file, criteria_file):
    stab = json.load(open(stab_file))["records"]
    crit = {(r["set"], r["fam"], r["m"]): r for r in json.load(open(criteria_file)) if r["m"] in SIZES}
    by = collections.defaultdict(list)
    for r in stab:
        c = crit.get((r["set"], r["fam"], r["m"]))
        if c is None:
            continue
        lam = lambda i, c=c: max(1 - c["eig"][i - 1], 0.0)  # noqa: E731
        r = dict(r, ratio=lam(r["k"] + 1) / max(lam(r["k"]), 1e-9),
                 eligible=c["ncomp"] <= r["k"] and min(c["comp_sizes"]) >= 0.1 * r["n"] / r["k"])
        if c["ncomp"] == r["k"] and r["eligible"]:
            r["ratio"] = float("inf")
        by[r["set"]].append(r)

    def prior(c, factor=1.5):  # affinity="search"'s rule: self_tuning 10 unless beaten factor times
        ok = [r for r in c if r["eligible"]] or c
        default = [r for r in ok if (r["fam"], r["m"]) == ("self_tuning", 10)]
        top = max(ok, key=lambda r: r["ratio"])
        if default and not top["ratio"] > factor * default[0]["ratio"]:
            return default[0]
        return top

    def stable_among(c, within):
        ok = [r for r in c if r["eligible"]] or c
        top = max(r["ratio"] for r in ok)
        near = [r for r in ok if r["ratio"] >= top / within] if np.isfinite(top) else \
            [r for r in ok if not np.isfinite(r["ratio"])]
        return max(near, key=lambda r: (r["stability"], r["ratio"]))

    rules = {
        "ratio rule with the prior (affinity='search' today)": prior,
        "largest ratio among eligible": lambda c: max([r for r in c if r["eligible"]] or c, key=lambda r: r["ratio"]),
        "most stable (any graph)": lambda c: max(c, key=lambda r: r["stability"]),
        "most stable among eligible": lambda c: max([r for r in c if r["eligible"]] or c,
                                                    key=lambda r: r["stability"]),
        "most stable within ratio / 1.2 of the top": lambda c: stable_among(c, 1.2),
        "most stable within ratio / 1.5 of the top": lambda c: stable_among(c, 1.5),
        "most stable within ratio / 2 of the top": lambda c: stable_among(c, 2.0),
        "stability x ratio among eligible": lambda c: max(
            [r for r in c if r["eligible"]] or c, key=lambda r: r["stability"] * min(r["ratio"], 1e6)),
        "fixed self_tuning 10": lambda c: [r for r in c if (r["fam"], r["m"]) == ("self_tuning", 10)][0],
        "oracle (labels)": lambda c: max(c, key=lambda r: r["nmi"]),
    }
    sets = sorted(by)
    print("rule".ljust(48), "mean  " + " ".join(s[:6] for s in sets))
    for name, rule in rules.items():
        picks = [rule(by[s]) for s in sets]
        print(f"{name:48s} {np.mean([p['nmi'] for p in picks]):.3f} " + " ".join(f"{p['nmi']:.2f}" for p in picks))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=pathlib.Path)
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--fraction", type=float, default=0.8)
    s = sub.add_parser("score")
    s.add_argument("stability")
    s.add_argument("criteria")
    a = p.parse_args(argv)
    if a.cmd == "run":
        run(a.out, a.repeats, a.fraction)
    else:
        score(a.stability, a.criteria)


if __name__ == "__main__":
    main()
