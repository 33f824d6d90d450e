"""Issue 28 point 3: label-free graph-choice rules scored on the tuning half (rows of explore.py + eigfix.py):
mean NMI per rule, per set. Usage: python analyze.py <criteria json>."""
import json, sys, collections, numpy as np
rows = json.load(open(sys.argv[1]))
by = collections.defaultdict(list)
for r in rows: by[r["set"]].append(r)
def lam(r, i): return max(1 - r["eig"][i - 1], 0.0)
def ratio(r): return lam(r, r["k"] + 1) / max(lam(r, r["k"]), 1e-9)
def gap(r): return lam(r, r["k"] + 1) - lam(r, r["k"])
def small(r, frac): return min(r["comp_sizes"]) < frac * r["n"] / r["k"]
def pick(c, key, ok):
    cand = [r for r in c if ok(r)] or c
    return max(cand, key=key)
grid_all = lambda r: True
grid3 = lambda r: r["m"] in (5, 10, 20)
rules = {}
for gname, g in (("all18", grid_all), ("5/10/20", grid3)):
    for frac in (0.0, 0.1, 0.25, 0.5):
        ok = lambda r, g=g, frac=frac: g(r) and r["ncomp"] <= r["k"] and not small(r, frac)
        rules[f"ratio {gname} comp<=k minc>={frac}"] = lambda c, ok=ok: pick(c, ratio, ok)
        rules[f"gap   {gname} comp<=k minc>={frac}"] = lambda c, ok=ok: pick(c, gap, ok)
for f, m in (("knn", 10), ("self_tuning", 10), ("mutual_knn", 20), ("self_tuning", 20), ("knn", 20)):
    rules[f"fixed {f}-{m}"] = lambda c, f=f, m=m: [r for r in c if r["fam"] == f and r["m"] == m][0]
rules["oracle"] = lambda c: max(c, key=lambda r: r["nmi"])
for name, rule in rules.items():
    vals = [rule(c)["nmi"] for c in by.values()]
    print(f"{name:40s} {np.mean(vals):.3f}  " + " ".join(f"{v:.2f}" for v in vals))
print(" | ".join(s[:10] for s in by))
