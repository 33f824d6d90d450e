"""Model selection without labels (issue 28): kkmgpu's default and searches against fixed settings on 41 sets.

    python bench/bench_selection.py run [--sets NAME|FAMILY ...] [--contestants ...] [--half tuning|validation|all]
                                        [--max-n N] [--timeout S] [--seeds 0] [--device cpu] [--out FILE]
    python bench/bench_selection.py report FILE [--full]      # markdown tables for docs/selection.md
    python bench/bench_selection.py split                     # the registry and its halves

Every set is labelled and every contestant gets its true k (HDBSCAN takes none). The sets are split once, by
:func:`half_of` (sha256 of the name), into a tuning half and a validation half; only the validation half is the
result (docs/selection.md). Each case runs in a worker process (``worker``) with a time limit; a case that fails
or runs out of time is recorded as such and the run goes on. NMI and ARI are scikit-learn's, against the labels.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from _kkmgpu_bench import ScriptRun  # noqa: E402

SCHEMA = "kkmgpu-bench-selection/1"
SPLIT_RULE = ("first byte of sha256(set name, UTF-8) even -> tuning half, odd -> validation half; fixed before "
              "any result was seen and never re-rolled")
EXTRA_DIMS_SCALE = 0.2  # added dimensions: N(0, (0.2 s)^2) columns, s the mean column std of the original


# --- the sets --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SetSpec:
    name: str
    family: str
    source: str
    preprocessing: str
    params: tuple = ()   # (key, value) pairs passed to the maker
    extra_dims: int = 0


def _synthetic():
    sets = []
    add = sets.append
    for n, noise, extra in ((1000, 0.05, 0), (1000, 0.10, 0), (1000, 0.15, 0), (3000, 0.10, 0), (1000, 0.10, 8)):
        add(SetSpec(f"moons-n{n}-noise{noise:.2f}" + (f"-plus{extra}d" if extra else ""), "moons",
                    "sklearn make_moons", "none", (("n", n), ("noise", noise)), extra))
    for n, noise, extra in ((1000, 0.03, 0), (1000, 0.06, 0), (1000, 0.10, 0), (3000, 0.06, 0), (1000, 0.06, 8)):
        add(SetSpec(f"circles-n{n}-noise{noise:.2f}" + (f"-plus{extra}d" if extra else ""), "circles",
                    "sklearn make_circles, factor 0.5", "none", (("n", n), ("noise", noise)), extra))
    for k, d, spread, extra in ((3, 2, 1.0, 0), (3, 2, 1.5, 0), (5, 2, 1.0, 0), (5, 10, 1.0, 0), (3, 2, 1.0, 8)):
        n = 1000 if k == 3 else 2000
        add(SetSpec(f"blobs-unequal-k{k}-n{n}-d{d}-std{spread:.1f}" + (f"-plus{extra}d" if extra else ""),
                    "blobs-unequal", "sklearn make_blobs, unequal sizes and spreads", "none",
                    (("k", k), ("d", d), ("spread", spread)), extra))
    for n, std, extra in ((1000, 1.0, 0), (1000, 1.5, 0), (3000, 1.0, 0), (1000, 1.0, 8)):
        add(SetSpec(f"aniso-k3-n{n}-std{std:.1f}" + (f"-plus{extra}d" if extra else ""), "aniso",
                    "sklearn make_blobs(random_state=170) @ [[0.6, -0.6], [-0.4, 0.8]]", "none",
                    (("n", n), ("std", std)), extra))
    for n, noise in ((1500, 0.2), (1500, 1.0), (3000, 0.5)):
        add(SetSpec(f"swissroll-k4-n{n}-noise{noise:.1f}", "swissroll",
                    "sklearn make_swiss_roll; label = 4 equal-width bins of the roll position t", "none",
                    (("n", n), ("noise", noise))))
    for n, noise, turns, extra in ((1000, 0.1, 1.0, 0), (1000, 0.3, 1.0, 0), (1000, 0.5, 1.0, 0),
                                   (1000, 0.3, 1.5, 0), (1000, 0.3, 1.0, 8)):
        add(SetSpec(f"spirals2-n{n}-noise{noise:.1f}" + (f"-turns{turns}" if turns != 1.0 else "")
                    + (f"-plus{extra}d" if extra else ""), "spirals2", "kkmgpu.datasets.make_two_spirals", "none",
                    (("n", n), ("noise", noise), ("turns", turns)), extra))
    for n, noise in ((312, 0.3), (1000, 0.3), (1000, 0.5)):
        add(SetSpec(f"spirals3-n{n}-noise{noise:.1f}", "spirals3", "make_three_spirals (this file)", "none",
                    (("n", n), ("noise", noise))))
    return sets


def _real():
    std = "standardised (each column to mean 0, std 1)"
    sets = [SetSpec(name, "shapes", f"shared data folder: shapes/{name}.csv (SIPU)", std)
            for name in ("aggregation", "compound", "flame", "jain", "r15")]
    sets.append(SetSpec("wifi", "uci", "shared data folder: uci/wifi_localization.csv", std))
    sets.append(SetSpec("wine", "uci", "sklearn load_wine", std))
    sets.append(SetSpec("wdbc", "uci", "sklearn load_breast_cancer", std))
    sets.append(SetSpec("digits", "digits", "sklearn load_digits", "pixels / 16"))
    for n in (2000, 5000):
        sets.append(SetSpec(f"mnist-{n}", "mnist", f"shared data folder: mnist/, {n} of the 70,000 drawn "
                            "with random_state=0", "pixels / 255"))
    return sets


REGISTRY = {spec.name: spec for spec in _synthetic() + _real()}
FAMILIES = sorted({spec.family for spec in REGISTRY.values()})


def half_of(name: str) -> str:
    """The half a set belongs to: the parity of the first byte of sha256(name) (SPLIT_RULE)."""
    return "tuning" if hashlib.sha256(name.encode("utf-8")).digest()[0] % 2 == 0 else "validation"


def split(names=None) -> dict:
    names = list(REGISTRY) if names is None else list(names)
    return {half: [n for n in names if half_of(n) == half] for half in ("tuning", "validation")}


def make_three_spirals(n_samples, noise, random_state=0, start=2.0, turns=1.0):
    """Three interleaved arms t (cos(t + 2 pi j / 3), sin(t + 2 pi j / 3)), t in [start, start + 2 pi turns]
    drawn so that points spread evenly along each arm (t^2 uniform), plus N(0, noise^2) on every coordinate."""
    rng = np.random.default_rng(random_state)
    y = np.arange(n_samples) % 3
    end = start + 2 * np.pi * turns
    t = np.sqrt(start ** 2 + (end ** 2 - start ** 2) * rng.random(n_samples))
    angle = t + 2 * np.pi * y / 3
    X = t[:, None] * np.c_[np.cos(angle), np.sin(angle)] + rng.normal(scale=noise, size=(n_samples, 2))
    order = rng.permutation(n_samples)
    return X[order], y[order]


class Unavailable(Exception):
    """A set whose file or package is missing here (the message says which)."""


def _make(spec: SetSpec):
    p = dict(spec.params)
    from sklearn import datasets as skd

    if spec.family == "moons":
        return skd.make_moons(p["n"], noise=p["noise"], random_state=0)
    if spec.family == "circles":
        return skd.make_circles(p["n"], noise=p["noise"], factor=0.5, random_state=0)
    if spec.family == "blobs-unequal":
        if p["k"] == 3:
            return skd.make_blobs([600, 300, 100], centers=[[0, 0], [5, 0], [2.5, 4]],
                                  cluster_std=[0.5 * p["spread"], 1.5 * p["spread"], 0.3 * p["spread"]],
                                  random_state=0)
        return skd.make_blobs([800, 500, 400, 200, 100], n_features=p["d"], random_state=0,
                              cluster_std=[s * p["spread"] for s in (1.0, 0.5, 1.5, 0.3, 0.8)])
    if spec.family == "aniso":
        X, y = skd.make_blobs(p["n"], cluster_std=p["std"], random_state=170)
        return X @ np.array([[0.6, -0.6], [-0.4, 0.8]]), y
    if spec.family == "swissroll":
        X, t = skd.make_swiss_roll(p["n"], noise=p["noise"], random_state=0)
        return X, np.clip(((t - 1.5 * np.pi) / (3 * np.pi) * 4).astype(np.int64), 0, 3)
    if spec.family == "spirals2":
        from kkmgpu.datasets import make_two_spirals

        return make_two_spirals(p["n"], noise=p["noise"], turns=p["turns"], random_state=0)
    if spec.family == "spirals3":
        return make_three_spirals(p["n"], p["noise"])
    from kkmgpu.compare.data import Unavailable as DataUnavailable, load_dataset

    try:
        data = load_dataset(spec.name)
    except DataUnavailable as exc:
        raise Unavailable(str(exc)) from None
    return data.X, data.y


def load_set(name: str, max_n=None):
    """(X float64, y int64 from 0, k) of a registered set, preprocessed; above ``max_n`` points a random subset
    of max_n (numpy default_rng(0)); k is the number of classes present. Raises Unavailable where a file is
    missing."""
    spec = REGISTRY[name]
    X, y = _make(spec)
    X, y = np.asarray(X, dtype=np.float64), np.unique(np.asarray(y), return_inverse=True)[1].astype(np.int64)
    if spec.extra_dims:
        s = X.std(axis=0).mean()
        X = np.c_[X, np.random.default_rng(1).normal(scale=EXTRA_DIMS_SCALE * s, size=(X.shape[0], spec.extra_dims))]
    if max_n is not None and X.shape[0] > max_n:
        keep = np.random.default_rng(0).permutation(X.shape[0])[:max_n]
        X, y = X[keep], np.unique(y[keep], return_inverse=True)[1].astype(np.int64)
    return X, y, int(y.max()) + 1


# --- the contestants -------------------------------------------------------------------------------------------

AFFINITIES = ("knn", "mutual_knn", "self_tuning")
CONTESTANTS = {"kkm-default": 'kkmgpu.fit(X, k, objective="ncut")'}
CONTESTANTS.update({f"kkm-{a}-{m}": f'kkmgpu.fit(X, k, objective="ncut", affinity="{a}", n_neighbors={m})'
                    for a in AFFINITIES for m in (5, 10, 20)})
CONTESTANTS.update({f"kkm-{a}-search": f'kkmgpu.fit(X, k, objective="ncut", affinity="{a}", n_neighbors="search")'
                    for a in AFFINITIES})
CONTESTANTS.update({
    "kkm-affinity-search": 'kkmgpu.fit(X, k, objective="ncut", affinity="search") (where kkmgpu has it)',
    "kkm-rbf-gamma-search": 'kkmgpu.fit(X, k, kernel="rbf", gamma="search")',
    "kkm-rbf-scale": 'kkmgpu.fit(X, k, kernel="rbf", gamma="scale")',
    "sk-spectral-nn10": 'SpectralClustering(k, affinity="nearest_neighbors", n_neighbors=10)',
    "sk-spectral-rbf": "SpectralClustering(k) (affinity rbf, gamma 1.0)",
    "sk-kmeans": "KMeans(k)",
    "sk-gmm": "GaussianMixture(k)",
    "sk-ward": 'AgglomerativeClustering(k, linkage="ward")',
    "sk-single": 'AgglomerativeClustering(k, linkage="single")',
    "sk-hdbscan": "HDBSCAN() (min_cluster_size 5; no k; noise points are one more label)",
})
#: the label-free choices issue 28 judges: the default graph and every search
SELECTORS = ("kkm-default", *(f"kkm-{a}-search" for a in AFFINITIES), "kkm-affinity-search", "kkm-rbf-gamma-search")


def _jsonable(value, depth=0):
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else str(float(value))
    if isinstance(value, np.integer):
        return int(value)
    if depth < 5 and isinstance(value, (list, tuple)) and len(value) <= 64:
        return [_jsonable(v, depth + 1) for v in value]
    if depth < 5 and isinstance(value, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, np.ndarray) and value.size <= 64:
        return _jsonable(value.tolist(), depth)
    if depth < 5 and dataclasses.is_dataclass(value) and not isinstance(value, type):  # e.g. a GraphSearch
        return {f.name: _jsonable(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)}
    return f"<{type(value).__name__}>"


def _evidence(result):
    """What a kkmgpu search chose and why: each candidate's criterion and the one kept."""
    params = result.method_params
    out = {}
    if "graph_search" in params:
        out["n_neighbors"] = params.get("n_neighbors")
    search = params.get("bandwidth_search")
    if search is not None:
        out["gamma"] = search.best.gamma
        out["candidates"] = [{"gamma": c.gamma, "cnnc": c.cnnc} for c in search.clusterings]
    elif "gamma" in (result.kernel_params or {}):
        out["gamma"] = result.kernel_params["gamma"]
    for key, value in params.items():  # whatever else a search reports (e.g. a future affinity search)
        if "search" in key and key != "bandwidth_search":
            out[key] = value
    return _jsonable(out)


def run_contestant(name, X, k, seed, device):
    """(labels, evidence) of one contestant."""
    if name.startswith("kkm-"):
        import kkmgpu

        common = dict(device=device, random_state=seed)
        if name == "kkm-default":
            result = kkmgpu.fit(X, k, objective="ncut", **common)
        elif name == "kkm-affinity-search":
            result = kkmgpu.fit(X, k, objective="ncut", affinity="search", **common)
        elif name == "kkm-rbf-gamma-search":
            result = kkmgpu.fit(X, k, kernel="rbf", gamma="search", **common)
        elif name == "kkm-rbf-scale":
            result = kkmgpu.fit(X, k, kernel="rbf", gamma="scale", **common)
        else:
            affinity, size = name[4:].rsplit("-", 1)
            result = kkmgpu.fit(X, k, objective="ncut", affinity=affinity,
                                n_neighbors=size if size == "search" else int(size), **common)
        return np.asarray(result.labels), _evidence(result)
    from sklearn import cluster, mixture

    model = {"sk-spectral-nn10": lambda: cluster.SpectralClustering(k, affinity="nearest_neighbors", n_neighbors=10,
                                                                    random_state=seed),
             "sk-spectral-rbf": lambda: cluster.SpectralClustering(k, random_state=seed),
             "sk-kmeans": lambda: cluster.KMeans(k, random_state=seed),
             "sk-gmm": lambda: mixture.GaussianMixture(k, random_state=seed),
             "sk-ward": lambda: cluster.AgglomerativeClustering(k, linkage="ward"),
             "sk-single": lambda: cluster.AgglomerativeClustering(k, linkage="single"),
             "sk-hdbscan": lambda: cluster.HDBSCAN()}[name]()
    labels = model.fit_predict(X)
    evidence = {}
    if name == "sk-hdbscan":
        evidence = {"noise_fraction": float(np.mean(labels == -1))}
    return np.asarray(labels), evidence


def affinity_search_available():
    """None when kkmgpu takes affinity="search", else the reason it does not."""
    import kkmgpu

    X = np.random.default_rng(0).normal(size=(40, 2))
    try:
        kkmgpu.fit(X, 2, objective="ncut", affinity="search", device="cpu", random_state=0)
    except (ValueError, TypeError, NotImplementedError) as exc:
        return f"not available: {type(exc).__name__}: {exc}"
    return None


# --- the worker: one process that loads a set and runs cases, killed when one runs past its limit ---------------

def worker(args):
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)                      # library prints go to stderr; stdout carries one JSON line per request
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    data = None
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "warmup":  # numba's compiled kernels loaded and imports done before any timed case
                from sklearn import cluster, datasets, mixture  # noqa: F401

                t0 = time.perf_counter()
                X, _ = datasets.make_moons(150, noise=0.05, random_state=0)
                for name in req["contestants"]:
                    run_contestant(name, X, 2, 0, req["device"])
                reply = {"ok": True, "seconds": time.perf_counter() - t0}
            elif req["op"] == "load":
                X, y, k = load_set(req["set"], req.get("max_n"))
                data = (req["set"], X, y, k)
                reply = {"ok": True, "n": X.shape[0], "d": X.shape[1], "k": k}
            else:
                _, X, y, k = data
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    t0, c0 = time.perf_counter(), time.process_time()
                    labels, evidence = run_contestant(req["contestant"], X, k, req["seed"], req["device"])
                    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
                found = np.unique(labels[labels >= 0]).size
                reply = {"ok": True, "nmi": float(normalized_mutual_info_score(y, labels)),
                         "ari": float(adjusted_rand_score(y, labels)), "seconds": seconds,
                         "cpu_seconds": cpu_seconds,
                         "n_clusters_found": int(found), "evidence": evidence,
                         "warnings": sorted({f"{w.category.__name__}: {str(w.message)[:160]}" for w in caught})[:5]}
        except Unavailable as exc:
            reply = {"ok": False, "unavailable": str(exc)}
        except Exception as exc:  # recorded, not fatal: the harness measures every contestant it can
            reply = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        out.write(json.dumps(reply) + "\n")


#: a fresh worker runs these (those requested; kkm-default for any other kkmgpu contestant) once on 150 points
SETUP_TIMEOUT = 300.0
WARMUP = ("kkm-default", "kkm-mutual_knn-5", "kkm-self_tuning-5", "kkm-knn-search", "kkm-rbf-gamma-search",
          "kkm-rbf-scale")


class Worker:
    """One ``worker`` process; a fresh one (warmed up) after a case that ran out of time or crashed it."""

    def __init__(self, contestants, device, timeout):
        warm = [c for c in WARMUP if c in contestants]
        if not warm and any(c.startswith("kkm-") and c != "kkm-affinity-search" for c in contestants):
            warm = ["kkm-default"]
        self.warmup = {"op": "warmup", "contestants": warm, "device": device}
        #: starting, warming up and loading a set are not the case's time: they get at least SETUP_TIMEOUT
        self.timeout = max(timeout, SETUP_TIMEOUT)
        self.proc, self.loaded, self.warmup_seconds = None, None, []

    def start(self):
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self.lines = queue.Queue()
        threading.Thread(target=lambda p=self.proc, q=self.lines: [q.put(x) for x in p.stdout] + [q.put(None)],
                         daemon=True).start()
        reply = self._ask(self.warmup, self.timeout)
        self.warmup_seconds.append(reply.get("seconds"))
        if not reply.get("ok"):
            print(f"worker warm-up: {reply.get('error') or 'timed out'}", flush=True)
        elif self.loaded is not None:  # a replacement worker: the set the killed one held
            self._ask(self.loaded, self.timeout)

    def ask(self, request, timeout):
        """The worker's reply, or {"timed_out": True} after ``timeout`` s (the worker is then killed)."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        if self.proc is None:
            return {"ok": False, "error": "a fresh worker failed to start or warm up"}
        if request["op"] == "load":
            self.loaded = request
        return self._ask(request, timeout)

    def _ask(self, request, timeout):
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except OSError:
            pass   # a dead worker: its reader thread reports the end of its output below
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            return {"ok": False, "timed_out": True}
        if line is None:
            code = self.proc.wait()
            self.proc = None
            return {"ok": False, "error": f"worker died (exit code {code})"}
        return json.loads(line)

    def stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


# --- run ---------------------------------------------------------------------------------------------------------

def expand_sets(names):
    out = []
    for name in names:
        matched = [name] if name in REGISTRY else [s for s in REGISTRY if REGISTRY[s].family == name]
        if not matched:
            raise SystemExit(f"--sets: {name!r} is neither a set nor a family; sets: {', '.join(REGISTRY)}; "
                             f"families: {', '.join(FAMILIES)}")
        out += [m for m in matched if m not in out]
    return out


def run(args):
    names = [n for n in expand_sets(args.sets or list(REGISTRY)) if args.half == "all" or half_of(n) == args.half]
    contestants = args.contestants or list(CONTESTANTS)
    unknown = [c for c in contestants if c not in CONTESTANTS]
    if unknown:
        raise SystemExit(f"--contestants: unknown {unknown}; known: {', '.join(CONTESTANTS)}")
    unavailable = {}
    if "kkm-affinity-search" in contestants:
        reason = affinity_search_available()
        if reason:
            unavailable["kkm-affinity-search"] = reason
            print(f"kkm-affinity-search: {reason}", flush=True)
    halves = split()
    sets_doc = {n: {"family": s.family, "half": half_of(n), "source": s.source, "preprocessing": s.preprocessing,
                    "extra_dims": s.extra_dims} for n, s in REGISTRY.items()}
    run_doc = ScriptRun(args.device, args.argv, script="bench/bench_selection.py", topic="selection", schema=SCHEMA,
                        document_extra={"split_rule": SPLIT_RULE, "split": halves, "sets": sets_doc,
                                        "contestants": CONTESTANTS, "selectors": list(SELECTORS),
                                        "extra_dims_scale": EXTRA_DIMS_SCALE})
    if args.out:
        run_doc.path = Path(args.out)
    run_doc.meta.update(max_n=args.max_n, timeout_s=args.timeout, seeds=args.seeds, unavailable=unavailable)
    print(f"{len(names)} sets x {len(contestants)} contestants x {len(args.seeds)} seeds -> {run_doc.path}", flush=True)
    worker_ = Worker([c for c in contestants if c not in unavailable], args.device, args.timeout)
    t_run = time.perf_counter()
    try:
        for name in names:
            loaded = worker_.ask({"op": "load", "set": name, "max_n": args.max_n}, worker_.timeout)
            if not loaded.get("ok"):
                reason = loaded.get("unavailable") or loaded.get("error") or "timed out loading"
                print(f"{name}: SKIPPED ({reason})", flush=True)
                run_doc.meta.setdefault("skipped_sets", {})[name] = reason
                run_doc.write()
                continue
            shape = {key: loaded[key] for key in ("n", "d", "k")}
            for who in contestants:
                for seed in args.seeds:
                    case = {"id": f"{name}/{who}/seed{seed}", "set": name, "family": REGISTRY[name].family,
                            "half": half_of(name), "contestant": who, "seed": seed, "max_n": args.max_n, **shape}
                    if who in unavailable:
                        case.update(status="unavailable", reason=unavailable[who])
                    else:
                        t0 = time.perf_counter()
                        reply = worker_.ask({"op": "case", "contestant": who, "seed": seed, "device": args.device},
                                            args.timeout)
                        if reply.pop("ok"):
                            case.update(status="ok", **reply)
                        elif reply.get("timed_out"):
                            case.update(status="timeout", seconds_at_least=args.timeout)
                        else:
                            case.update(status="error", error=reply.get("error"))
                        case["wall_seconds"] = time.perf_counter() - t0
                    run_doc.add(case)
                    score = f"NMI {case['nmi']:.3f} ARI {case['ari']:.3f} {case['seconds']:7.2f} s" \
                        if case["status"] == "ok" else case["status"] + " " + str(case.get("error") or "")
                    print(f"{name} [{case['half'][0]}] n={shape['n']} k={shape['k']} {who:22s} seed {seed}: {score}",
                          flush=True)
    finally:
        worker_.stop()
        run_doc.meta.update(wall_seconds=time.perf_counter() - t_run, warmup_seconds=worker_.warmup_seconds)
        run_doc.write()
    print(f"wrote {run_doc.path} ({time.perf_counter() - t_run:.0f} s)")
    return run_doc.path


# --- report ------------------------------------------------------------------------------------------------------

def summarise(document):
    """{(set, contestant): (mean NMI, mean ARI, mean seconds, failures)} over seeds; a failed or timed-out case
    scores NMI = ARI = 0 (no answer); unavailable contestants are left out."""
    groups = {}
    for case in document["cases"]:
        if case["status"] != "unavailable":
            groups.setdefault((case["set"], case["contestant"]), []).append(case)
    table = {}
    for key, cases in groups.items():
        ok = [c for c in cases if c["status"] == "ok"]
        table[key] = (float(np.mean([c["nmi"] if c["status"] == "ok" else 0.0 for c in cases])),
                      float(np.mean([c["ari"] if c["status"] == "ok" else 0.0 for c in cases])),
                      float(np.mean([c["seconds"] for c in ok])) if ok else math.nan, len(cases) - len(ok))
    return table


def report(document, full=False) -> str:
    table = summarise(document)
    sets = sorted({s for s, _ in table})
    order = [c for c in document.get("contestants", CONTESTANTS) if any(c == w for _, w in table)]
    runs = document.get("runs", [])
    lines = [f"Device: {document.get('device_name')}; runs {', '.join(r['started'] for r in runs)}; max_n "
             f"{sorted({str(r.get('max_n')) for r in runs})}, timeout {sorted({r.get('timeout_s') for r in runs})} s "
             f"per case; commit {sorted({(r.get('git') or {}).get('commit', '?')[:10] for r in runs})}.", "",
             f"Split: {document.get('split_rule', SPLIT_RULE)}.", ""]
    unavailable = {c: r for run in document.get("runs", []) for c, r in run.get("unavailable", {}).items()}
    measured = {c["set"] for c in document.get("cases", [])}     # a set skipped in one run may be measured in another
    skipped = {s: r for run in document.get("runs", []) for s, r in run.get("skipped_sets", {}).items()
               if s not in measured}
    lines += [f"- `{c}`: {r}" for c, r in unavailable.items()]
    lines += [f"- set `{s}` skipped: {r}" for s, r in skipped.items()]
    for half in ("validation", "tuning"):
        members = [s for s in sets if half_of(s) == half]
        if not members:
            continue
        title = "the result" if half == "validation" else "tuning only, not the result"
        lines += ["", f"### {half.capitalize()} half ({len(members)} sets; {title})", "",
                  "| contestant | mean NMI | mean ARI | mean s | failed or timed out | sets |",
                  "|---|---|---|---|---|---|"]
        rows = []
        for who in order:
            got = [table[s, who] for s in members if (s, who) in table]
            if got:
                rows.append((float(np.mean([g[0] for g in got])), who, got))
        for mean_nmi, who, got in sorted(rows, key=lambda r: -r[0]):
            mark = "**" if who in SELECTORS else ""
            seconds = [g[2] for g in got if not math.isnan(g[2])]
            lines.append(f"| {mark}{who}{mark} | {mean_nmi:.3f} | {np.mean([g[1] for g in got]):.3f} | "
                         f"{np.mean(seconds) if seconds else math.nan:.2f} | {sum(g[3] for g in got)} | {len(got)} |")
        means = {who: mean_nmi for mean_nmi, who, got in rows if len(got) == len(members)}
        lines += _verdict(means, half)
        picked = [c for c in SELECTORS if c in order]
        lines += ["", f"Per set ({half}): the best contestant, and the label-free choices "
                  "(an NMI below half of the best is in bold).", "",
                  "| set | n | k | best | best NMI | " + " | ".join(picked) + " |",
                  "|---|---|---|---|---|" + "---|" * len(picked)]
        below = []
        for s in members:
            scores = {w: table[s, w][0] for w in order if (s, w) in table}
            best = max(scores, key=scores.get)
            n, k = next(((c["n"], c["k"]) for c in document["cases"] if c["set"] == s), ("", ""))
            cells = []
            for w in picked:
                if w not in scores:
                    cells.append("-")
                elif scores[w] < 0.5 * scores[best]:
                    cells.append(f"**{scores[w]:.3f}**")
                    below.append(f"`{s}`: `{w}` {scores[w]:.3f} < half of `{best}` {scores[best]:.3f}")
                else:
                    cells.append(f"{scores[w]:.3f}")
            lines.append(f"| {s} | {n} | {k} | {best} | {scores[best]:.3f} | " + " | ".join(cells) + " |")
        lines += ["", f"Below half of the best ({half}):" + (" none." if not below else ""), *[f"- {b}" for b in below]]
        if full:
            lines += ["", f"All NMI ({half}):", "", "| contestant | " + " | ".join(members) + " |",
                      "|---|" + "---|" * len(members)]
            lines += [f"| {w} | " + " | ".join(f"{table[s, w][0]:.3f}" if (s, w) in table else "-" for s in members)
                      + " |" for w in order]
    return "\n".join(lines) + "\n"


def _verdict(means, half):
    """Issue 28 point 3: each label-free choice against the best fixed scikit-learn and fixed kkmgpu setting
    (contestants with a case on every set of the half only)."""
    fixed_sk = {w: m for w, m in means.items() if w.startswith("sk-")}
    fixed_kkm = {w: m for w, m in means.items() if w.startswith("kkm-") and w not in SELECTORS}
    if not fixed_sk or not fixed_kkm:
        return []
    bars = [max(d.items(), key=lambda item: item[1]) for d in (fixed_sk, fixed_kkm)]
    lines = ["", f"Issue 28 point 3 ({half}): best fixed scikit-learn setting `{bars[0][0]}` {bars[0][1]:.3f}, "
             f"best fixed kkmgpu setting `{bars[1][0]}` {bars[1][1]:.3f}.", "",
             "| label-free choice | mean NMI | reaches both |", "|---|---|---|"]
    bar = max(bars[0][1], bars[1][1])
    lines += [f"| {w} | {means[w]:.3f} | {'yes' if means[w] >= bar else f'no ({means[w] - bar:+.3f})'} |"
              for w in SELECTORS if w in means]
    return lines


def print_split():
    halves = split()
    print(f"Split rule: {SPLIT_RULE}.\n\n| set | family | half | source | preprocessing |\n|---|---|---|---|---|")
    for name, spec in REGISTRY.items():
        extra = f"; {spec.extra_dims} added N(0, ({EXTRA_DIMS_SCALE} s)^2) columns" if spec.extra_dims else ""
        print(f"| {name} | {spec.family} | {half_of(name)} | {spec.source} | {spec.preprocessing}{extra} |")
    print("\n| family | tuning | validation |\n|---|---|---|")
    for family in FAMILIES:
        counts = [sum(REGISTRY[n].family == family for n in halves[h]) for h in ("tuning", "validation")]
        print(f"| {family} | {counts[0]} | {counts[1]} |")
    print(f"| **all** | {len(halves['tuning'])} | {len(halves['validation'])} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--sets", nargs="+", help="set or family names (default: all)")
    r.add_argument("--contestants", nargs="+", help=f"default: all of {', '.join(CONTESTANTS)}")
    r.add_argument("--half", choices=("tuning", "validation", "all"), default="all")
    r.add_argument("--max-n", type=int, default=None, help="subsample larger sets to this many points")
    r.add_argument("--timeout", type=float, default=300.0, help="seconds per case (default 300)")
    r.add_argument("--seeds", type=int, nargs="+", default=[0])
    r.add_argument("--device", default="cpu", help="kkmgpu's device (scikit-learn runs on the CPU)")
    r.add_argument("--out", help="result file (default bench/results/<date>-<device>-selection.json, merged)")
    p = sub.add_parser("report")
    p.add_argument("file")
    p.add_argument("--full", action="store_true", help="also every contestant's NMI on every set")
    sub.add_parser("split")
    sub.add_parser("worker")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.command == "run":
        return run(args)
    if args.command == "report":
        print(report(json.loads(Path(args.file).read_text()), full=args.full), end="")
    elif args.command == "split":
        print_split()
    else:
        worker(args)


if __name__ == "__main__":
    main()
