"""Issue 28 point 3 exploration on the TUNING half only: per set and candidate graph, label-free criteria and NMI."""
import json, sys, time, warnings
import numpy as np, scipy.sparse as sps
from scipy.sparse.csgraph import connected_components
from scipy.sparse.linalg import eigsh
sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__import__("os").path.abspath(__file__)), ".."))
import bench_selection as bs
import kkmgpu
from kkmgpu.backend.device import resolve_device
from kkmgpu.kernels import graphs as G
from kkmgpu.methods.graph_scale import graph_features
from sklearn.metrics import normalized_mutual_info_score as nmi

half = sys.argv[1] if len(sys.argv) > 1 else "tuning"
out = sys.argv[2] if len(sys.argv) > 2 else f"{half}-criteria.json"
names = [n for n in bs.REGISTRY if bs.half_of(n) == half]
be = resolve_device("cpu", ())
rows = []
for name in names:
    try:
        X, y, k = bs.load_set(name)
    except bs.Unavailable as e:
        print("skip", name, e); continue
    n = len(X)
    feats = graph_features(np.asarray(X, np.float64), "float64", be)[1]
    nb = G.nearest_neighbors(feats, min(50, n - 1), be)
    for fam in ("knn", "mutual_knn", "self_tuning"):
        for m in (5, 7, 10, 15, 20, 30):
            if m >= n: continue
            t = time.time()
            g = G.build_graph(feats, m, fam, be, neighbors=nb).graph
            A = sps.csr_matrix(g)
            ncomp = connected_components(A, directed=False)[0]
            d = np.asarray(A.sum(1)).ravel()
            iso = int((d <= 0).sum())
            dd = np.where(d > 0, d, 1.0) ** -0.5
            N = sps.diags(dd) @ A @ sps.diags(dd)
            kk = min(k + 2, n - 2)
            try:
                w = eigsh(N, kk, which="LA", tol=1e-6, return_eigenvectors=False, v0=np.random.default_rng(0).standard_normal(n))
                w = np.sort(w)[::-1]
            except Exception as e:
                w = np.sort(np.linalg.eigvalsh(N.toarray()))[::-1][:kk]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    r = kkmgpu.fit(X, k, objective="ncut", affinity=fam, n_neighbors=m, random_state=0, device="cpu")
                    lab = np.asarray(r.labels); obj = float(r.objective)
                except Exception as e:
                    lab = np.zeros(n, int); obj = float("nan")
            rows.append(dict(set=name, n=n, k=k, fam=fam, m=m, ncomp=int(ncomp), iso=iso, eig=[float(v) for v in w],
                             nnz=int(A.nnz), ncut=obj, nmi=float(nmi(y, lab)), sizes=np.bincount(lab, minlength=k).tolist(),
                             sec=time.time() - t))
            print(name, fam, m, ncomp, np.round(w[:k + 1][-2:], 4), round(obj, 4), round(rows[-1]["nmi"], 3), flush=True)
    json.dump(rows, open(out, "w"))
