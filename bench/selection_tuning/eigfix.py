"""Recompute the top k+2 eigenvalues of D^-1/2 A D^-1/2 exactly (dense) and the component sizes, for rows of explore.py."""
import json, sys
import numpy as np, scipy.sparse as sps
from scipy.sparse.csgraph import connected_components
sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__import__("os").path.abspath(__file__)), ".."))
import bench_selection as bs
from kkmgpu.backend.device import resolve_device
from kkmgpu.kernels import graphs as G
from kkmgpu.methods.graph_scale import graph_features
rows = json.load(open(sys.argv[1])); be = resolve_device("cpu", ())
cache = {}
for r in rows:
    if r["set"] not in cache:
        X, y, k = bs.load_set(r["set"]); feats = graph_features(np.asarray(X, np.float64), "float64", be)[1]
        cache = {r["set"]: (feats, G.nearest_neighbors(feats, min(50, len(X) - 1), be))}
    feats, nb = cache[r["set"]]
    A = sps.csr_matrix(G.build_graph(feats, r["m"], r["fam"], be, neighbors=nb).graph)
    nc, lab = connected_components(A, directed=False)
    d = np.asarray(A.sum(1)).ravel(); s = d ** -0.5
    N = (sps.diags(s) @ A @ sps.diags(s)).toarray()
    w = np.linalg.eigvalsh(N)[::-1][: r["k"] + 2]
    r["eig"] = [float(v) for v in w]; r["comp_sizes"] = sorted(np.bincount(lab).tolist())
    print(r["set"], r["fam"], r["m"], nc, r["comp_sizes"][:3], np.round(w[r["k"]-1:r["k"]+1], 5), flush=True)
json.dump(rows, open(sys.argv[2], "w"))
