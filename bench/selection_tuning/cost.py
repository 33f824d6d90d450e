"""Issue 28 point 6: the searches against the default call at n = 10,000 (two moons), each twice, back to back.

    python bench/selection_tuning/cost.py
"""
import time, json, numpy as np, kkmgpu
from sklearn.datasets import make_moons
X, y = make_moons(10000, noise=0.1, random_state=0)
kkmgpu.fit(X[:300], 2, objective="ncut", random_state=0)  # warm-up
calls = {"default": {}, "affinity=search": {"affinity": "search"},
         "knn search": {"affinity": "knn", "n_neighbors": "search"},
         "mutual_knn search": {"affinity": "mutual_knn", "n_neighbors": "search"},
         "self_tuning search": {"n_neighbors": "search"}}
out = {}
for rep in range(2):
    for name, kw in calls.items():
        t = time.perf_counter(); r = kkmgpu.fit(X, 2, objective="ncut", random_state=0, **kw); s = time.perf_counter() - t
        out.setdefault(name, []).append(round(s, 2))
        print(rep, name, round(s, 2), round(float(kkmgpu.metrics.nmi(y, r.labels)), 3), flush=True)
print(json.dumps(out))
