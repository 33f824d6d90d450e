"""Which sparse and reduction operations of CuPy give the same bits on every call (a real GPU only)?

Each operation the graph routes use runs REPEATS times on the same inputs; the report counts the distinct bit
patterns of its result (1 = repeatable). Then four method="landmark" fits of the same seed, with every
landmark_graph step's outputs hashed, show where two fits first part. kkmgpu's own fixed-order products
(kkmgpu/kernels/sparse_cuda.py) and pair distances (knn_cuda.pair_distances) are among the operations: they must
show 1. Written for the 2026-11-26 H100 recheck,
whose tests/test_landmark_cut.py::test_same_inputs_same_bits gave equal labels and cuts 8e-11 apart.

    python bench/probes/sparse_determinism.py [--json OUT]
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np

REPEATS = 12


def digest(a):
    import cupy
    import cupyx.scipy.sparse as cs
    if cs.issparse(a):
        a = a.tocsr()
        parts = [a.indptr, a.indices, a.data]
    elif isinstance(a, tuple):
        parts = list(a)
    else:
        parts = [a]
    h = hashlib.sha1()
    for p in parts:
        h.update(np.ascontiguousarray(cupy.asnumpy(p) if isinstance(p, cupy.ndarray) else np.asarray(p)).tobytes())
    return h.hexdigest()[:12]


def ops():
    import cupy
    import cupyx.scipy.sparse as cs

    from kkmgpu.kernels import knn_cuda
    from kkmgpu.kernels import sparse_cuda as _products
    rng = np.random.default_rng(0)
    out = {}
    for n, p, r in [(600, 60, 5), (200_000, 1000, 5)]:
        rows = np.repeat(np.arange(n), r)
        cols = rng.integers(0, p, n * r)
        vals = rng.random(n * r)
        B = cs.csr_matrix((cupy.asarray(vals), (cupy.asarray(rows), cupy.asarray(cols))), shape=(n, p))
        B.sum_duplicates()
        w = cupy.asarray(rng.random(n) + 0.5)
        v = cupy.asarray(rng.random(p))
        D = cupy.asarray(rng.random((p, 8)))
        Dn = cupy.asarray(rng.random((n, 8)))
        labels = cupy.asarray(rng.integers(0, 8, n))
        Y = cs.csr_matrix((w, (cupy.arange(n), labels)), shape=(n, 8))
        Bt = B.T.tocsr()
        cases = {
            "csr @ vec": lambda: B @ v,
            "csr @ dense(p,8)": lambda: B @ D,
            "csr.sum(axis=1)": lambda: B.sum(axis=1),
            "csr.sum(axis=0)": lambda: B.sum(axis=0),
            "csr.T @ vec (csc)": lambda: B.T @ w,
            "csr.T.tocsr()": lambda: B.T.tocsr(),
            "csr.T.tocsr() @ vec": lambda: B.T.tocsr() @ w,
            "Bt(csr) @ dense(n,8)": lambda: Bt @ Dn,
            "Y.T @ B (spgemm, transposed)": lambda: Y.T @ B,
            "Y.T.tocsr() @ B (spgemm)": lambda: Y.T.tocsr() @ B,
            "(Y.T.tocsr() @ B).toarray()": lambda: (Y.T.tocsr() @ B).toarray(),
            "B.T @ B (spgemm, transposed)": lambda: B.T @ B,
            "Bt @ B (spgemm)": lambda: Bt @ B,
            "Y.T.tocsr() @ w": lambda: Y.T.tocsr() @ w,
            "dense sum(axis=1)": lambda: Dn.sum(axis=1),
            "dense sum(axis=0)": lambda: Dn.sum(axis=0),
            "dense sum()": lambda: Dn.sum(),
            "coo->csr": lambda: B.tocoo().tocsr(),
            "kkmgpu csr_product(Bt, w)": lambda: _products.csr_product(Bt, w),
            "kkmgpu csr_product(Bt, dense(n,8))": lambda: _products.csr_product(Bt, Dn),
            "kkmgpu csr_product(Y.T.tocsr(), w)": lambda: _products.csr_product(Y.T.tocsr(), w),
            "kkmgpu csr_product(B, dense(p,8))": lambda: _products.csr_product(B, D),
            "kkmgpu pair_distances": lambda: knn_cuda.pair_distances(Dn, Dn, cupy.arange(n),
                                                                      cupy.arange(n)[::-1].copy(), 0.5),
        }
        for name, fn in cases.items():
            try:
                seen = {digest(fn()) for _ in range(REPEATS)}
                out[f"n={n} {name}"] = len(seen)
            except Exception as exc:  # noqa: BLE001 - a probe reports what failed
                out[f"n={n} {name}"] = f"{type(exc).__name__}: {exc}"
            print(f"{'n=' + str(n):10s} {name:34s} distinct={out[f'n={n} {name}']}", flush=True)
    return out


def timings():
    """Seconds (median of 7, after a warm-up) of kkmgpu's fixed-order products against cuSPARSE's (CuPy's @) on
    the shapes the library meets: a kNN graph's rows (n = 10^6, 10 per row) times a vector and an (n, 16) block,
    and a landmark graph's transpose (p = 1000 rows of 5,000) times a vector: the cost of the fixed order."""
    import time

    import cupy
    import cupyx.scipy.sparse as cs

    from kkmgpu.kernels import sparse_cuda as _products
    rng = np.random.default_rng(1)
    out = {}
    n, r, p = int(os.environ.get("KKMGPU_PROBE_N", 1_000_000)), 10, 1000  # a smaller n: a smoke run
    rows = np.repeat(np.arange(n), r)
    knn = cs.csr_matrix((cupy.asarray(rng.random(n * r)),
                         (cupy.asarray(rows), cupy.asarray(rng.integers(0, n, n * r)))), shape=(n, n))
    B = cs.csr_matrix((cupy.asarray(rng.random(n * 5)), (cupy.asarray(np.repeat(np.arange(n), 5)),
                                                        cupy.asarray(rng.integers(0, p, n * 5)))), shape=(n, p))
    Bt = B.T.tocsr()
    x, X16, w = cupy.asarray(rng.random(n)), cupy.asarray(rng.random((n, 16))), cupy.asarray(rng.random(n))
    plan = _products.CsrProduct(knn)
    cases = {"knn @ vec": (lambda: knn @ x, lambda: _products.csr_product(knn, x), lambda: plan(x)),
             "knn @ (n,16)": (lambda: knn @ X16, lambda: _products.csr_product(knn, X16), lambda: plan(X16)),
             "B^T (1000 x 10^6) @ vec": (lambda: Bt @ w, lambda: _products.csr_product(Bt, w), None)}
    for name, fns in cases.items():
        row = {}
        for label, fn in zip(("cusparse", "kkmgpu", "kkmgpu_planned"), fns):
            if fn is None:
                continue
            fn()
            cupy.cuda.Device().synchronize()
            times = []
            for _ in range(7):
                t0 = time.perf_counter()
                fn()
                cupy.cuda.Device().synchronize()
                times.append(time.perf_counter() - t0)
            row[label] = float(np.median(times))
        out[name] = row
        print(f"{name:26s} " + "  ".join(f"{k} {v * 1e3:.3f} ms" for k, v in row.items()), flush=True)
    return out


def fits():
    from sklearn.datasets import make_blobs

    import kkmgpu
    from kkmgpu.methods import landmark_graph as lg

    X, _ = make_blobs(600, centers=4, n_features=5, cluster_std=2.5, random_state=11)
    log = []
    names = ["degrees", "keep_linked", "transfer_cut", "cluster_totals", "ncut", "bipartite", "nearest"]
    originals = {name: getattr(lg, name) for name in names}

    def wrap(name):
        def inner(*args, **kwargs):
            result = originals[name](*args, **kwargs)
            parts = result if isinstance(result, tuple) else (result,)
            hs = []
            for part in parts:
                try:
                    hs.append(digest(part))
                except Exception:  # noqa: BLE001
                    hs.append(repr(part)[:40])
            log[-1].append((name, hs))
            return result
        return inner

    import kkmgpu.methods.landmark_cut as lc
    for name in names:
        setattr(lg, name, wrap(name))
    objectives = []
    try:
        for _ in range(4):
            log.append([])
            res = kkmgpu.fit(X, 4, objective="ncut", method="landmark", random_state=0, device="cuda")
            objectives.append(repr(res.objective))
    finally:
        for name in names:
            setattr(lg, name, originals[name])
    first = log[0]
    report = {"objectives": objectives, "steps": [[f"{n}:{','.join(h)}" for n, h in run] for run in log]}
    for i, run in enumerate(log[1:], 1):
        for a, b in zip(first, run):
            if a != b:
                print(f"fit {i} parts from fit 0 at {a[0]}: {a[1]} vs {b[1]}", flush=True)
                break
        else:
            print(f"fit {i}: every step the same bits as fit 0", flush=True)
    print("objectives", objectives, flush=True)
    del lc
    return report


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    import cupy
    print(cupy.__version__, cupy.cuda.runtime.getDeviceProperties(0)["name"], flush=True)
    result = {"ops": ops(), "fits": fits(), "timings": timings()}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
