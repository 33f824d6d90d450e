"""Issue 28, tuning half only: the self_tuning graph symmetrised as scikit-learn symmetrises its kNN graph,
0.5 (G + G^T) (an edge one point's neighbour list holds counts half), against kkmgpu's max(G, G^T), at 5 ... 30
neighbours; NMI of the default ncut fit (seed 0).

    python bench/selection_tuning/symmetrise.py tuning out.json

It patches ``kkmgpu.engine.sparse.symmetrise`` for the self_tuning graph only (an experiment, not an option)."""
import sys, json, warnings, numpy as np
sys.path.insert(0, "bench")
import kkmgpu
from kkmgpu.engine import sparse as S
from kkmgpu.kernels import graphs as G
from bench_selection import REGISTRY, half_of, load_set
from sklearn.metrics import normalized_mutual_info_score as nmi
orig = S.symmetrise
mode = {"avg": False}
def sym(A, backend, how="maximum", what=""):
    if mode["avg"] and how == "maximum" and "self_tuning graph" in what and "added" not in what:
        out = ((A + A.T.tocsr()) * 0.5).tocsr(); out.eliminate_zeros(); out.sort_indices(); return out
    return orig(A, backend, how, what)
import kkmgpu.engine.sparse
kkmgpu.engine.sparse.symmetrise = sym
half, out = sys.argv[1], sys.argv[2]
if half != "tuning":
    raise SystemExit("tuning half only")
names = sorted(n for n in REGISTRY if half_of(n) == half)
res = {}
for name in names:
    X, y, k = load_set(name)
    row = {}
    for m in (5, 7, 10, 15, 20, 30):
        for av in (False, True):
            mode["avg"] = av
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                lab = kkmgpu.fit(X, k, objective="ncut", affinity="self_tuning", n_neighbors=m, device="cpu", random_state=0).labels
            row[f"{'avg' if av else 'max'}{m}"] = float(nmi(y, lab))
    res[name] = row
    print(f"{name:36s} " + " ".join(f"{key}:{v:.3f}" for key, v in row.items()), flush=True)
keys = list(next(iter(res.values())))
print("mean  " + " ".join(f"{key}:{np.mean([r[key] for r in res.values()]):.3f}" for key in keys))
json.dump(res, open(out, "w"), indent=1)
