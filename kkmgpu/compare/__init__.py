"""How kkmgpu compares: its methods next to the clustering methods users know, on labelled data sets.

``kkmgpu compare`` (the command line) and ``bench/compare.py`` (the committed benchmark run) both call
:func:`run_comparison`. Every method clusters the same preprocessed data into the true number of clusters;
every partition is scored by the same metrics (:data:`METRICS`); wall time is the fit call alone.

Methods (:func:`methods`): kkmgpu's exact route, its eigendecomposition route (Algorithm 16), CATS, and,
where they have landed in this kkmgpu, kernel matrix trimming and the Off-the-grid bandwidth search;
scikit-learn's KMeans, AgglomerativeClustering (Ward), SpectralClustering (normalised-Laplacian embedding
then k-means, the Ng-Jordan-Weiss recipe) and GaussianMixture; tslearn's KernelKMeans. A method whose
package is missing, or that this kkmgpu does not have, is skipped with a message saying so.

Every RBF method (kkmgpu's, spectral clustering, tslearn) gets the same gamma per data set, scikit-learn's
"scale" rule gamma = 1 / (d Var(X)) (kkmgpu's default) -- except the bandwidth search, whose point is to
choose it. Data: the five SIPU shape sets, UCI WiFi, scikit-learn's Wine, WDBC and digits, MNIST samples
(pixels / 255); shape and UCI sets are standardised to zero mean and unit variance per feature (as the
Off-the-grid paper does for real data), digits are divided by 16. ``large/birch1.csv`` of the shared data
(100,000 points, k = 100) is left out: it is there for scaling runs past one kernel matrix in memory, and
AgglomerativeClustering, SpectralClustering, tslearn's KernelKMeans and the kernel-objective column all need
O(n^2) memory (80 GB in float64 at n = 100,000).

The thesis (kernel-kmeans-thesis-slides.txt, "Evaluation Strategy") adds two scenarios on synthetic
Gaussian blobs (centres uniform in [-10, 10]^d as in scikit-learn's ``make_blobs``, standard deviation
:data:`BLOB_STD` = 2.5): growing n
at fixed d, and growing d at fixed n, each over several seeds (mean and standard deviation reported).

Outputs (:func:`write_outputs`): ``<prefix>.md`` (tables), ``<prefix>.csv`` (one row per run),
``<prefix>.json`` (rows, configuration, versions, machine, load average) and PNG plots when matplotlib is
installed.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib
import importlib.metadata
import json
import math
import os
import platform
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import kkmgpu
from kkmgpu import datasets
from kkmgpu.backend.device import import_cupy, resolve_device
from kkmgpu._progress import check_progress, progress_bar

__all__ = ["METRICS", "Dataset", "Method", "add_arguments", "evaluate", "load_dataset", "make_blobs", "methods",
           "run_comparison", "run_from_args", "write_outputs"]

SCHEMA = "kkmgpu-compare/1"
METRICS = ("nmi", "ari", "silhouette", "calinski_harabasz", "davies_bouldin", "sum_of_variances",
           "kernel_objective", "cnnc")
#: metric -> True when lower values are better (used to mark the best value per data set)
LOWER_IS_BETTER = {"nmi": False, "ari": False, "silhouette": False, "calinski_harabasz": False,
                   "davies_bouldin": True, "sum_of_variances": True, "kernel_objective": True, "cnnc": True,
                   "time_s": True}
N_INIT = 10

SHAPES = tuple(datasets.SHAPE_SETS)
DEFAULT_DATASETS = (*SHAPES, "wifi", "wine", "wdbc", "digits", "mnist-1000", "mnist-2000", "mnist-5000")
QUICK_DATASETS = ("flame", "jain", "wine", "mnist-500")
SCENARIO_N = {"sizes": (500, 1000, 2000, 4000), "d": 10, "k": 5}
SCENARIO_D = {"dims": (2, 10, 50, 200, 784), "n": 1000, "k": 5}
QUICK_SCENARIO_N = {"sizes": (150, 300), "d": 5, "k": 3}
QUICK_SCENARIO_D = {"dims": (2, 16), "n": 200, "k": 3}


class Unavailable(Exception):
    """A data set or method that cannot run here (missing package, file or kkmgpu feature); the message says why."""


# ----------------------------------------------------------------------------------------- data sets


@dataclass
class Dataset:
    """A labelled data set, preprocessed as every method sees it."""

    name: str
    X: np.ndarray
    y: np.ndarray
    k: int
    description: str

    @property
    def shape(self):
        return self.X.shape


def _standardise(X):
    X = np.asarray(X, dtype=np.float64)
    std = X.std(axis=0)
    return (X - X.mean(axis=0)) / np.where(std > 0, std, 1.0)


def _sklearn_dataset(loader_name):
    try:
        sk_datasets = importlib.import_module("sklearn.datasets")
    except ImportError:
        raise Unavailable(f"scikit-learn is not installed (it ships the {loader_name[5:]} data set)") from None
    return getattr(sk_datasets, loader_name)()


def load_dataset(name, data_dir=None) -> Dataset:
    """One data set of the comparison by name, preprocessed as every method sees it.

    Parameters
    ----------
    name : str
        A shape set ("aggregation", "compound", "flame", "jain", "r15"), "wifi", "wine", "wdbc", "digits",
        or "mnist-N" (a sample of N MNIST digits drawn with random_state=0).
    data_dir : path, optional
        The shared data folder (with ``shapes/``, ``uci/``, ``mnist/``); default kkmgpu's search path.

    Returns
    -------
    Dataset

    Raises
    ------
    Unavailable
        When the set's file or the package that ships it is missing (the message says which).
    ValueError
        For an unknown name or a malformed "mnist-N".
    """
    data_dir = None if data_dir is None else Path(data_dir)
    if name in SHAPES:
        try:
            X, y = datasets.load_shape_set(name, None if data_dir is None else data_dir / "shapes")
        except FileNotFoundError as exc:
            raise Unavailable(" ".join(str(exc).split())) from None
        return Dataset(name, _standardise(X), y, int(y.max()) + 1, "SIPU shape set, standardised")
    if name == "wifi":
        candidates = [] if data_dir is None else [data_dir / "uci" / "wifi_localization.csv"]
        candidates += [d / "wifi_localization.csv" for d in datasets._shared_data_dirs("uci")]
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            raise Unavailable(f"wifi_localization.csv not found (tried {', '.join(map(str, candidates))})")
        table = datasets.load_array(path)
        y = table[:, -1].astype(np.int64)
        return Dataset(name, _standardise(table[:, :-1]), y - y.min(), int(np.unique(y).size),
                       "UCI wireless indoor localization, standardised")
    if name in ("wine", "wdbc"):
        bunch = _sklearn_dataset("load_wine" if name == "wine" else "load_breast_cancer")
        y = bunch.target.astype(np.int64)
        return Dataset(name, _standardise(bunch.data), y, int(np.unique(y).size),
                       f"scikit-learn {'load_wine' if name == 'wine' else 'load_breast_cancer'}, standardised")
    if name == "digits":
        bunch = _sklearn_dataset("load_digits")
        return Dataset(name, bunch.data / 16.0, bunch.target.astype(np.int64), 10, "scikit-learn load_digits / 16")
    if name.startswith("mnist-"):
        try:
            n = int(name.split("-", 1)[1])
        except ValueError:
            raise ValueError(f"data set {name!r}: use mnist-N with N an integer number of samples.") from None
        try:
            X, y = datasets.load_mnist(None if data_dir is None else data_dir / "mnist", n_samples=n,
                                       random_state=0)
        except FileNotFoundError as exc:
            raise Unavailable(" ".join(str(exc).split())) from None
        return Dataset(name, np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.int64), 10,
                       f"MNIST, {n} points drawn with random_state=0, pixels / 255")
    raise ValueError(f"data set {name!r} is not known; use one of {list(DEFAULT_DATASETS)} or mnist-N.")


def _check_dataset_name(name):
    if name in DEFAULT_DATASETS or name in ("wifi", "wine", "wdbc", "digits"):
        return
    if isinstance(name, str) and name.startswith("mnist-") and name[6:].isdigit() and 1 <= int(name[6:]) <= 70_000:
        return
    raise ValueError(f"data set {name!r} is not known; use one of {list(DEFAULT_DATASETS)} or mnist-N "
                     "(1 <= N <= 70000).")


#: standard deviation of the scenario blobs (scikit-learn's make_blobs default is 1.0, which every method
#: separates perfectly from d = 2 on; 2.5 makes clusters overlap at small d)
BLOB_STD = 2.5


def make_blobs(n, d, k, seed, cluster_std=BLOB_STD):
    """Gaussian blobs as scikit-learn's ``make_blobs``: centres uniform in [-10, 10]^d, isotropic noise.

    Parameters
    ----------
    n, d, k : int
        Points, dimensions and clusters; n >= 1, d >= 1, 1 <= k <= n.
    seed : int
        Seed of ``numpy.random.default_rng`` (the same seed gives the same data).
    cluster_std : float, default=BLOB_STD
        Standard deviation of every cluster, >= 0.

    Returns
    -------
    X : ndarray of shape (n, d), float64
    y : ndarray of shape (n,), int64
        The cluster of every point; cluster sizes differ by at most one.

    Raises
    ------
    ValueError
        If a size is out of range or cluster_std is negative or not finite.
    """
    for name, value, low in (("n", n, 1), ("d", d, 1), ("k", k, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name}={value!r} must be an integer >= {low}.")
    if k > n:
        raise ValueError(f"k={k} must be <= n={n} (every cluster needs a point).")
    if not (np.isfinite(cluster_std) and cluster_std >= 0):
        raise ValueError(f"cluster_std={cluster_std!r} must be a finite number >= 0.")
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-10.0, 10.0, size=(k, d))
    y = np.arange(n) % k
    rng.shuffle(y)
    return centres[y] + cluster_std * rng.normal(size=(n, d)), y.astype(np.int64)


# -------------------------------------------------------------------------------------------- methods


@dataclass
class Context:
    """What every method of one run gets: the shared RBF gamma, the seed, the device for kkmgpu."""

    gamma: float
    seed: int
    device: str = "auto"
    n_init: int = N_INIT


@dataclass
class Method:
    """A clustering method: ``run(X, k, ctx)`` returns labels; ``unavailable()`` returns None or why not."""

    name: str
    family: str
    description: str
    run: object
    unavailable: object = None
    notes: list = field(default_factory=list)

    def why_unavailable(self):
        return None if self.unavailable is None else self.unavailable()


def _needs(module):
    def check():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # tslearn warns at import when h5py is missing
                importlib.import_module(module)
        except ImportError as exc:
            return f"{module.split('.')[0]} is not installed ({exc})"
        return None
    return check


def _kkmgpu_fit(X, k, ctx, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        result = kkmgpu.fit(X, k, kernel="rbf", device=ctx.device, random_state=ctx.seed, **options)
    return np.asarray(result.labels)


def _has_method(name):
    from kkmgpu.methods import registry as _methods
    if name in _methods.METHODS:
        return None
    return f"not available: this kkmgpu has no method={name!r}"


def _has_search():
    if hasattr(kkmgpu, "search_bandwidth"):
        return None
    return "not available: this kkmgpu has no bandwidth search (kkmgpu.search_bandwidth)"


def _run_search(X, k, ctx):
    """Off-the-grid bandwidth search: fit(gamma="search") where fit takes it, else search_bandwidth's labels."""
    try:
        return _kkmgpu_fit(X, k, ctx, gamma="search", n_init=1)
    except (TypeError, ValueError) as exc:
        if "gamma" not in str(exc):
            raise
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        found = kkmgpu.search_bandwidth(X, k, device=ctx.device, random_state=ctx.seed)
    best = getattr(found, "best", None)
    labels = getattr(best, "labels", getattr(found, "labels", None))
    if labels is None:
        raise Unavailable("kkmgpu.search_bandwidth returned no labels")
    return np.asarray(labels)


def _sklearn(name):
    return importlib.import_module(name)


def _run_kmeans(X, k, ctx):
    return _sklearn("sklearn.cluster").KMeans(k, n_init=ctx.n_init, random_state=ctx.seed).fit(X).labels_


def _run_agglomerative(X, k, ctx):
    return _sklearn("sklearn.cluster").AgglomerativeClustering(k, linkage="ward").fit(X).labels_


def _run_spectral(X, k, ctx):
    model = _sklearn("sklearn.cluster").SpectralClustering(
        k, affinity="rbf", gamma=ctx.gamma, assign_labels="kmeans", n_init=ctx.n_init, random_state=ctx.seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Graph is not fully connected"
        return model.fit(X).labels_


def _gmm_covariance(d):
    return "full" if d <= 50 else "diag"


def _run_gmm(X, k, ctx):
    model = _sklearn("sklearn.mixture").GaussianMixture(
        k, covariance_type=_gmm_covariance(X.shape[1]), n_init=3, random_state=ctx.seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning of EM
        return model.fit(X).predict(X)


def _run_tslearn(X, k, ctx):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        KernelKMeans = importlib.import_module("tslearn.clustering").KernelKMeans
        model = KernelKMeans(n_clusters=k, kernel="rbf", kernel_params={"gamma": ctx.gamma}, n_init=ctx.n_init,
                             max_iter=300, tol=1e-6, random_state=ctx.seed)
        model.fit(X)
    if getattr(model, "labels_", None) is None:
        raise RuntimeError("tslearn found an empty cluster in every attempt")
    return model.labels_


def methods():
    """Every method of the comparison, in table order (unavailable ones included; see ``why_unavailable``)."""
    return [
        Method("kkmgpu-exact", "kkmgpu", f"fit(method='exact'), rbf, k-means++, n_init={N_INIT}",
               lambda X, k, ctx: _kkmgpu_fit(X, k, ctx, gamma=ctx.gamma, n_init=ctx.n_init)),
        Method("kkmgpu-eigen", "kkmgpu", f"fit(method='eigen') (Algorithm 16; all eigenpairs up to n=4096, "
               f"else the top 128), rbf, n_init={N_INIT}",
               lambda X, k, ctx: _kkmgpu_fit(X, k, ctx, gamma=ctx.gamma, n_init=ctx.n_init, method="eigen")),
        Method("kkmgpu-cats", "kkmgpu", f"fit(method='cats'), l = ceil(sqrt(n / k)), rbf, n_init={N_INIT}",
               lambda X, k, ctx: _kkmgpu_fit(X, k, ctx, gamma=ctx.gamma, n_init=ctx.n_init, method="cats")),
        Method("kkmgpu-trimmed", "kkmgpu", f"fit(method='trimmed') (kernel matrix trimming), rbf, n_init={N_INIT}",
               lambda X, k, ctx: _kkmgpu_fit(X, k, ctx, gamma=ctx.gamma, n_init=ctx.n_init, method="trimmed"),
               unavailable=lambda: _has_method("trimmed")),
        Method("kkmgpu-search", "kkmgpu", "Off-the-grid bandwidth search (gamma chosen by the search, not 'scale')",
               _run_search, unavailable=_has_search),
        Method("sklearn-kmeans", "scikit-learn", f"KMeans(n_init={N_INIT})", _run_kmeans,
               unavailable=_needs("sklearn.cluster")),
        Method("sklearn-agglomerative", "scikit-learn", "AgglomerativeClustering(linkage='ward')",
               _run_agglomerative, unavailable=_needs("sklearn.cluster")),
        Method("sklearn-spectral", "scikit-learn",
               f"SpectralClustering(affinity='rbf', gamma shared, assign_labels='kmeans', n_init={N_INIT}) (NJW)",
               _run_spectral, unavailable=_needs("sklearn.cluster")),
        Method("sklearn-gmm", "scikit-learn", "GaussianMixture(covariance_type='full' for d <= 50 else 'diag', "
               "n_init=3)", _run_gmm, unavailable=_needs("sklearn.mixture")),
        Method("tslearn-kernelkmeans", "tslearn",
               f"tslearn KernelKMeans(kernel='rbf', gamma shared, n_init={N_INIT}, max_iter=300)",
               _run_tslearn, unavailable=_needs("tslearn.clustering")),
    ]


# -------------------------------------------------------------------------------------------- metrics


def evaluate(X, y, labels, *, K=None, device="auto"):
    """Every metric of :data:`METRICS` for one partition.

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
        The data the partition was made from (the internal indices and c-NNC use it).
    y : array of shape (n_samples,)
        The true classes (for NMI and ARI).
    labels : array of shape (n_samples,)
        The partition to score.
    K : array of shape (n_samples, n_samples), optional
        The kernel matrix the kernel k-means objective is taken on (NaN without it).
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
        Where the O(n^2) metrics run.

    Returns
    -------
    values : dict
        Metric name -> float. An undefined metric (e.g. the silhouette of a single cluster) or a missing
        one (c-NNC in a kkmgpu without it) is NaN.
    notes : list of str
        Why each NaN metric is undefined.

    Raises
    ------
    ValueError
        If y or labels is not one value per row of X.
    """
    from kkmgpu import metrics

    labels = np.asarray(labels)
    n = np.shape(X)[0]
    for name, value in (("y", np.asarray(y)), ("labels", labels)):
        if value.shape != (n,):
            raise ValueError(f"{name} has shape {value.shape}; expected ({n},), one value per row of X.")
    values, notes = {}, []
    calls = {
        "nmi": lambda: metrics.nmi(y, labels),
        "ari": lambda: metrics.ari(y, labels),
        "silhouette": lambda: metrics.silhouette(X, labels, device=device),
        "calinski_harabasz": lambda: metrics.calinski_harabasz(X, labels, device=device),
        "davies_bouldin": lambda: metrics.davies_bouldin(X, labels, device=device),
        "sum_of_variances": lambda: metrics.sum_of_variances(X, labels, device=device),
        "kernel_objective": (None if K is None else lambda: metrics.kernel_kmeans_objective(K, labels)),
        "cnnc": (lambda: metrics.cnnc(X, labels, device=device)) if hasattr(metrics, "cnnc") else None,
    }
    for name in METRICS:
        call = calls[name]
        if call is None:
            values[name] = float("nan")
            continue
        try:
            values[name] = float(call())
        except ValueError as exc:
            values[name] = float("nan")
            notes.append(f"{name}: {exc}")
    return values, notes


def shared_gamma(X) -> float:
    """scikit-learn's and kkmgpu's gamma="scale": 1 / (n_features * X.var())."""
    var = float(np.var(X))
    return 1.0 / (X.shape[1] * var) if var > 0 else 1.0


# ------------------------------------------------------------------------------------------- the runs


def _log(verbose, text, bar=None):
    if verbose:
        if bar is None:
            print(text, flush=True)
        else:
            bar.write(text)


def _warm_up(selected, device):
    """One tiny fit of each kkmgpu method, so timings exclude numba compilation and GPU context creation."""
    X, _ = make_blobs(60, 3, 2, seed=0)
    ctx = Context(gamma=shared_gamma(X), seed=0, device=device, n_init=1)
    for method in selected:
        if method.family == "kkmgpu":
            try:
                method.run(X, 2, ctx)
            except Exception:  # the timed run reports the error
                pass


def _run_one(method, X, y, k, ctx, *, K, metric_device, section, dataset, seed, verbose, extra=None, bar=None):
    row = {"section": section, "dataset": dataset, "n": int(X.shape[0]), "d": int(X.shape[1]), "k": int(k),
           "method": method.name, "seed": seed, "gamma": ctx.gamma, "time_s": float("nan"),
           **{m: float("nan") for m in METRICS}, "note": "", **(extra or {})}
    if bar is not None:
        bar.set_postfix_str(f"{dataset}: {method.name}")
    t0 = time.perf_counter()
    try:
        labels = np.asarray(method.run(X, k, ctx))
    except Unavailable as exc:
        row["note"] = f"not available: {exc}"
        _log(verbose, f"  {method.name:<22} {row['note']}", bar)
        return row, None
    except Exception as exc:  # one failing method must not end the comparison; the row says what happened
        row["note"] = f"error: {type(exc).__name__}: {exc}"
        _log(verbose, f"  {method.name:<22} {row['note']}", bar)
        return row, None
    row["time_s"] = time.perf_counter() - t0
    values, notes = evaluate(X, y, labels, K=K, device=metric_device)
    row.update(values)
    row["n_clusters_found"] = int(np.unique(labels).size)
    row["note"] = "; ".join(notes)
    _log(verbose, f"  {method.name:<22} {row['time_s']:8.3f} s   NMI {row['nmi']:.3f}   ARI {row['ari']:.3f}   "
                  f"silhouette {row['silhouette']:.3f}", bar)
    return row, labels


def _kernel_for_objective(X, gamma, device):
    return kkmgpu.kernel_matrix(X, gamma=gamma, dtype="float64", device=device)


def run_comparison(*, dataset_names=None, method_names=None, scenarios=True, quick=False, seeds=None,
                   device="auto", data_dir=None, verbose=True, progress=False):
    """Run the comparison; returns the report dict that :func:`write_outputs` writes.

    Parameters
    ----------
    dataset_names : list of str, optional
        Default: :data:`DEFAULT_DATASETS` (:data:`QUICK_DATASETS` with ``quick``).
    method_names : list of str, optional
        Names from :func:`methods` (default: all; unavailable ones are reported, not run).
    scenarios : bool, default=True
        Also run the thesis's two scenarios (growing n at fixed d, growing d at fixed n).
    quick : bool, default=False
        Small data sets, small scenarios, one seed.
    seeds : int, optional
        Seeds per scenario point (default 3, 1 with ``quick``).
    device : {"auto", "cpu", "cuda", "cuda:N"}
        Where kkmgpu's methods and the metrics run (the other libraries run on the CPU).
    data_dir : path, optional
        The shared data folder (with ``shapes/``, ``uci/``, ``mnist/``); by default kkmgpu's search path.
    verbose : bool, default=True
        Print one line per run.
    progress : bool, default=False
        Show a progress bar over all runs (tqdm when installed, plain lines otherwise).

    Returns
    -------
    dict
        ``rows`` (one per data set / scenario point, method and seed), ``skipped`` (messages),
        ``config``, ``environment``.

    Raises
    ------
    ValueError
        For an unknown data set or method name.
    """
    every = methods()
    known = [m.name for m in every]
    if method_names is not None:
        unknown = [name for name in method_names if name not in known]
        if unknown:
            raise ValueError(f"unknown method(s) {unknown}; choose from {known}.")
        every = [m for m in every if m.name in method_names]
    if seeds is None:
        seeds = 1 if quick else 3
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds={seeds!r} must be an integer >= 1.")
    progress = check_progress(progress)
    names = list(dataset_names) if dataset_names is not None else list(QUICK_DATASETS if quick else DEFAULT_DATASETS)
    for name in names:
        _check_dataset_name(name)
    backend = resolve_device(device)
    metric_device = backend.name
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = _load_average()

    skipped, selected = [], []
    for method in every:
        reason = method.why_unavailable()
        if reason:
            skipped.append(f"method {method.name}: {reason}")
            _log(verbose, f"[compare] skipping {method.name}: {reason}")
        else:
            selected.append(method)
    _warm_up(selected, backend.name)

    scenario_config, points = {}, []
    if scenarios:
        grow_n = QUICK_SCENARIO_N if quick else SCENARIO_N
        grow_d = QUICK_SCENARIO_D if quick else SCENARIO_D
        scenario_config = {"growing_n": {**grow_n, "seeds": seeds}, "growing_d": {**grow_d, "seeds": seeds}}
        points = [("growing_n", n, grow_n["d"], grow_n["k"]) for n in grow_n["sizes"]]
        points += [("growing_d", grow_d["n"], d, grow_d["k"]) for d in grow_d["dims"]]

    rows, pictures = [], {}
    total = len(selected) * (len(names) + len(points) * seeds)
    with progress_bar(total, desc="compare", unit="run", enabled=progress) as bar:
        for name in names:
            try:
                data = load_dataset(name, data_dir)
            except Unavailable as exc:
                skipped.append(f"data set {name}: {exc}")
                _log(verbose, f"[compare] skipping data set {name}: {exc}", bar)
                bar.update(len(selected))
                continue
            gamma = shared_gamma(data.X)
            _log(verbose, f"[compare] {name} ({data.X.shape[0]} x {data.X.shape[1]}, k={data.k}, "
                          f"gamma={gamma:.4g}), load average {_load_average()}", bar)
            K = _kernel_for_objective(data.X, gamma, backend.name)
            ctx = Context(gamma=gamma, seed=0, device=backend.name)
            for method in selected:
                row, labels = _run_one(method, data.X, data.y, data.k, ctx, K=K, metric_device=metric_device,
                                       section="datasets", dataset=name, seed=0, verbose=verbose, bar=bar)
                rows.append(row)
                bar.update()
                if data.X.shape[1] == 2 and labels is not None:
                    pictures.setdefault(name, {"X": data.X, "labels": {}})["labels"][method.name] = labels
            del K

        for section, n, d, k in points:
            _log(verbose, f"[compare] scenario {section}: n={n}, d={d}, k={k}, {seeds} seed(s), "
                          f"load average {_load_average()}", bar)
            for seed in range(seeds):
                X, y = make_blobs(n, d, k, seed=1000 * seed + 17)
                gamma = shared_gamma(X)
                K = _kernel_for_objective(X, gamma, backend.name)
                ctx = Context(gamma=gamma, seed=seed, device=backend.name)
                for method in selected:
                    rows.append(_run_one(method, X, y, k, ctx, K=K, metric_device=metric_device, section=section,
                                         dataset=f"blobs-n{n}-d{d}", seed=seed, verbose=verbose, bar=bar)[0])
                    bar.update()
                del K

    return {
        "schema": SCHEMA,
        "started": started.isoformat(timespec="seconds"),
        "wall_s": (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds(),
        "load_average_start": load_start,
        "load_average_end": _load_average(),
        "config": {
            "datasets": names, "methods": {m.name: m.description for m in every},
            "gamma_rule": "gamma = 1 / (n_features * X.var()) (scikit-learn's 'scale'), shared by every rbf method",
            "n_init": N_INIT, "device": backend.name, "quick": quick, "scenarios": scenario_config,
            "timing": "wall time of the fit call (kernel build, eigendecomposition, iterations); after a warm-up "
                      "fit of every kkmgpu method (numba compilation excluded)",
        },
        "environment": environment(backend),
        "skipped": skipped,
        "rows": rows,
        "_pictures": pictures,  # 2-D data sets and each method's labels, for the plots (not written to JSON)
    }


def _load_average():
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(backend):
    """Machine, device and package versions for the result file."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.lower().startswith("model name")), cpu)
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    env = {"python": platform.python_version(), "platform": platform.platform(), "cpu_model": cpu,
           "cpu_count": cores, "device": backend.name, "kkmgpu": kkmgpu.__version__,
           **{name: _version(name) for name in ("numpy", "scipy", "numba", "scikit-learn", "tslearn", "matplotlib")}}
    if backend.is_gpu:
        cp = import_cupy()
        env["gpu"] = cp.cuda.runtime.getDeviceProperties(backend.index)["name"].decode()
        env["cupy"] = cp.__version__
    return env


# ------------------------------------------------------------------------------------------- outputs


COLUMNS = ("section", "dataset", "n", "d", "k", "method", "seed", "gamma", "time_s", *METRICS,
           "n_clusters_found", "note")
_LABELS = {"nmi": "NMI", "ari": "ARI", "silhouette": "silhouette", "calinski_harabasz": "Calinski-Harabasz",
           "davies_bouldin": "Davies-Bouldin", "sum_of_variances": "sum of variances",
           "kernel_objective": "kernel objective", "cnnc": "c-NNC", "time_s": "time (s)"}


def _fmt(value, digits=3):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e4 or abs(value) < 1e-2):
            return f"{value:.{digits}g}"
        return f"{value:.{digits}f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def _group(rows, section):
    out = {}
    for row in rows:
        if row["section"] == section:
            out.setdefault(row["dataset"], []).append(row)
    return out


def _best(rows, metric):
    values = [r[metric] for r in rows if not math.isnan(r[metric])]
    if not values:
        return None
    return min(values) if LOWER_IS_BETTER[metric] else max(values)


def _pivot(rows, metric, method_names):
    """Markdown: one row per data set, one column per method; the best value in bold."""
    grouped = _group(rows, "datasets")
    lines = ["| data set | n x d, k | " + " | ".join(method_names) + " |",
             "|---|---|" + "---:|" * len(method_names)]
    for dataset, runs in grouped.items():
        by_method = {r["method"]: r for r in runs}
        best = _best(runs, metric)
        cells = []
        for name in method_names:
            value = by_method.get(name, {}).get(metric, float("nan"))
            text = _fmt(value, 2 if metric == "time_s" else 3)
            cells.append(f"**{text}**" if best is not None and value == best else text)
        first = runs[0]
        lines.append(f"| {dataset} | {first['n']} x {first['d']}, {first['k']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _mean_std(values):
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return float("nan"), float("nan")
    return float(np.mean(values)), float(np.std(values))


def scenario_summary(rows, section):
    """(x, method) -> {metric: (mean, std)} over seeds for a scenario section."""
    key = "n" if section == "growing_n" else "d"
    cells = {}
    for row in rows:
        if row["section"] == section:
            cells.setdefault((row[key], row["method"]), []).append(row)
    return {cell: {m: _mean_std([r[m] for r in runs]) for m in (*METRICS, "time_s")}
            for cell, runs in sorted(cells.items())}


def _scenario_table(rows, section, metrics_shown):
    key = "n" if section == "growing_n" else "d"
    summary = scenario_summary(rows, section)
    lines = [f"| {key} | method | " + " | ".join(_LABELS[m] for m in metrics_shown) + " |",
             "|---:|---|" + "---:|" * len(metrics_shown)]
    for (x, method), stats in summary.items():
        cells = [f"{_fmt(stats[m][0])} ± {_fmt(stats[m][1], 2)}" for m in metrics_shown]
        lines.append(f"| {x} | {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(report) -> str:
    """The report as Markdown: pivot tables per metric, the full table, scenario tables, what was skipped."""
    rows = report["rows"]
    present = [name for name in report["config"]["methods"] if any(r["method"] == name for r in rows)]
    env = report["environment"]
    lines = [
        "# How kkmgpu compares",
        "",
        f"Run {report['started']} on {env.get('gpu') or env['cpu_model']} ({env['cpu_count']} cores), "
        f"device {env['device']}; {report['wall_s']:.0f} s in all. Load average at start "
        f"{report['load_average_start']}, at end {report['load_average_end']} (other work on the machine "
        "inflates wall times). Versions: " + ", ".join(f"{k} {v}" for k, v in env.items()
                                                       if k in ("kkmgpu", "numpy", "scipy", "scikit-learn",
                                                                "tslearn", "cupy") and v) + ".",
        "",
        f"Gamma: {report['config']['gamma_rule']}. Timing: {report['config']['timing']}.",
        "Best value per data set in bold (higher is better for NMI, ARI, silhouette and Calinski-Harabasz; lower "
        "for Davies-Bouldin, sum of variances, kernel objective, c-NNC and time).",
        "",
        "Methods:",
        "",
        *[f"- `{name}`: {desc}" for name, desc in report["config"]["methods"].items()],
        "",
    ]
    if report["skipped"]:
        lines += ["Skipped:", "", *[f"- {message}" for message in report["skipped"]], ""]
    if any(r["section"] == "datasets" for r in rows):
        for metric in ("nmi", "ari", "silhouette", "time_s"):
            lines += [f"## {_LABELS[metric]}", "", _pivot(rows, metric, present), ""]
        lines += ["## Every metric", "",
                  "| data set | method | time (s) | " + " | ".join(_LABELS[m] for m in METRICS) + " |",
                  "|---|---|---:|" + "---:|" * len(METRICS)]
        for dataset, runs in _group(rows, "datasets").items():
            best = {m: _best(runs, m) for m in (*METRICS, "time_s")}
            for r in runs:
                cells = []
                for m in ("time_s", *METRICS):
                    text = _fmt(r[m], 2 if m == "time_s" else 3)
                    cells.append(f"**{text}**" if best[m] is not None and r[m] == best[m] else text)
                lines.append(f"| {dataset} | {r['method']} | " + " | ".join(cells) + " |")
        lines.append("")
        notes = [f"- {r['dataset']} / {r['method']}: {r['note']}" for r in rows
                 if r["section"] == "datasets" and r["note"]]
        if notes:
            lines += ["Notes:", "", *notes, ""]
    shown = ("nmi", "silhouette", "calinski_harabasz", "davies_bouldin", "sum_of_variances", "time_s")
    for section, title in (("growing_n", "Scenario: growing n at fixed d"),
                           ("growing_d", "Scenario: growing d at fixed n")):
        if any(r["section"] == section for r in rows):
            cfg = report["config"]["scenarios"][section]
            fixed = f"d = {cfg['d']}" if section == "growing_n" else f"n = {cfg['n']}"
            lines += [f"## {title}", "",
                      f"Gaussian blobs (centres uniform in [-10, 10]^d, standard deviation {BLOB_STD}), "
                      f"k = {cfg['k']}, {fixed}; mean ± standard deviation over {cfg['seeds']} seed(s).", "", _scenario_table(rows, section, shown), ""]
    return "\n".join(lines)


def write_outputs(report, out_dir, prefix="compare", *, plots=True, verbose=True):
    """Write ``<prefix>.md``, ``.csv``, ``.json`` and the PNG plots into ``out_dir``.

    Parameters
    ----------
    report : dict
        What :func:`run_comparison` returns.
    out_dir : path
        Created if missing.
    prefix : str, default="compare"
        File name stem: ``<prefix>.md``, ``<prefix>.csv``, ``<prefix>.json``, ``<prefix>-datasets.png``,
        ``<prefix>-shapes.png`` (2-D data sets), ``<prefix>-scenario-n.png``, ``<prefix>-scenario-d.png``.
    plots : bool, default=True
        Write the PNG plots (skipped with a message when matplotlib is not installed).
    verbose : bool, default=True
        Print a message when the plots are skipped.

    Returns
    -------
    list of pathlib.Path
        The files written.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    md = out_dir / f"{prefix}.md"
    md.write_text(markdown(report) + "\n")
    paths.append(md)
    csv_path = out_dir / f"{prefix}.csv"
    with open(csv_path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in report["rows"]:
            writer.writerow({c: ("" if isinstance(row.get(c), float) and math.isnan(row[c]) else row.get(c, ""))
                             for c in COLUMNS})
    paths.append(csv_path)
    json_path = out_dir / f"{prefix}.json"
    public = {key: value for key, value in report.items() if not key.startswith("_")}
    json_path.write_text(json.dumps(public, indent=1, default=_json_default, allow_nan=True) + "\n")
    paths.append(json_path)
    if plots:
        try:
            importlib.import_module("matplotlib")
        except ImportError:
            _log(verbose, "[compare] plots skipped: matplotlib is not installed")
        else:
            paths += _plots(report, out_dir, prefix)
    return paths


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def _plots(report, out_dir, prefix):
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    rows = report["rows"]
    present = [name for name in report["config"]["methods"] if any(r["method"] == name for r in rows)]
    colours = {name: f"C{i}" for i, name in enumerate(present)}
    paths = []
    grouped = _group(rows, "datasets")
    if grouped:
        names = list(grouped)
        shown = ("nmi", "ari", "silhouette", "time_s")
        figure = Figure(figsize=(max(8, 1.1 * len(names) + 3), 3.2 * len(shown)), layout="constrained")
        width = 0.8 / max(1, len(present))
        for ax, metric in zip(figure.subplots(len(shown), 1), shown):
            for j, method in enumerate(present):
                values = [next((r[metric] for r in grouped[d] if r["method"] == method), float("nan")) for d in names]
                ax.bar(np.arange(len(names)) + (j - (len(present) - 1) / 2) * width, values, width,
                       label=method, color=colours[method])
            ax.set_xticks(np.arange(len(names)), names, rotation=20)
            ax.set_ylabel(_LABELS[metric])
            if metric == "time_s":
                ax.set_yscale("log")
            ax.grid(axis="y", alpha=0.3)
        figure.axes[0].legend(ncols=max(2, min(5, len(names))), fontsize=7, loc="lower left",
                              bbox_to_anchor=(0, 1.02))
        path = out_dir / f"{prefix}-datasets.png"
        figure.savefig(path, dpi=90)
        paths.append(path)

        if report.get("_pictures"):
            paths.append(_pictures_of_2d_sets(report, present, out_dir, prefix))

    for section, key, title in (("growing_n", "n", "growing n at fixed d"), ("growing_d", "d", "growing d at fixed n")):
        summary = scenario_summary(rows, section)
        if not summary:
            continue
        shown = ("nmi", "silhouette", "calinski_harabasz", "davies_bouldin", "sum_of_variances", "time_s")
        xs_all = sorted({x for x, _ in summary})
        figure = Figure(figsize=(13, 7), layout="constrained")
        axes = figure.subplots(2, 3).ravel()
        for ax, metric in zip(axes, shown):
            for method in present:
                points = sorted((x, s[metric]) for (x, m), s in summary.items() if m == method)
                if not points:
                    continue
                xs = [p[0] for p in points]
                ax.errorbar(xs, [p[1][0] for p in points], yerr=[p[1][1] for p in points], marker="o", ms=3,
                            capsize=2, label=method, color=colours[method])
            ax.set_xscale("log")
            # ticks at the scenario's own n (or d) values, written plainly: the default log locator labels
            # minor ticks as "2x10^0 3x10^0 ..." over a short range, which overlap and name no measured point
            ax.set_xticks(xs_all, [str(x) for x in xs_all])
            ax.xaxis.set_minor_locator(NullLocator())
            if metric in ("time_s", "calinski_harabasz", "sum_of_variances"):
                ax.set_yscale("log")
            ax.set_xlabel(key)
            ax.set_title(_LABELS[metric])
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        figure.suptitle(f"Scenario: {title} (Gaussian blobs; mean ± std over seeds)")
        path = out_dir / f"{prefix}-scenario-{key}.png"
        figure.savefig(path, dpi=90)
        paths.append(path)
    return paths


def _pictures_of_2d_sets(report, present, out_dir, prefix):
    """The 2-D data sets coloured by each method's partition."""
    from matplotlib.figure import Figure

    pictures = report["_pictures"]
    figure = Figure(figsize=(2.2 * len(present), 2.2 * len(pictures)), layout="constrained")
    axes = np.atleast_2d(figure.subplots(len(pictures), len(present)))
    for i, (name, picture) in enumerate(pictures.items()):
        X = picture["X"]
        for j, method in enumerate(present):
            ax = axes[i, j]
            labels = picture["labels"].get(method)
            if labels is not None:
                ax.scatter(X[:, 0], X[:, 1], c=labels, s=2, cmap="tab20")
                row = next(r for r in report["rows"] if r["dataset"] == name and r["method"] == method)
                ax.set_title((f"{method}\n" if i == 0 else "") + f"NMI {row['nmi']:.2f}", fontsize=7)
            else:
                ax.set_title((f"{method}\n" if i == 0 else "") + "no result", fontsize=7)
            ax.set_xticks([])
            ax.set_yticks([])
            if j == 0:
                ax.set_ylabel(name)
    path = out_dir / f"{prefix}-shapes.png"
    figure.savefig(path, dpi=90)
    return path


# ----------------------------------------------------------------------------------- command line


def add_arguments(parser):
    """The options of ``kkmgpu compare`` (also used by ``bench/compare.py``)."""
    parser.add_argument("--out", type=Path, default=Path("."), metavar="DIR",
                        help="folder for the .md, .csv, .json and .png outputs (default: the working directory)")
    parser.add_argument("--prefix", default="compare", help="file name stem of the outputs (default: compare)")
    parser.add_argument("--quick", action="store_true",
                        help=f"small data sets ({', '.join(QUICK_DATASETS)}), small scenarios, one seed")
    parser.add_argument("--datasets", type=_name_list, default=None, metavar="A,B,...",
                        help="comma-separated data sets (default: " + ", ".join(DEFAULT_DATASETS) + ")")
    parser.add_argument("--methods", type=_name_list, default=None, metavar="A,B,...",
                        help="comma-separated methods (default: all): " + ", ".join(m.name for m in methods()))
    parser.add_argument("--no-scenarios", dest="scenarios", action="store_false",
                        help="skip the growing-n and growing-d scenarios")
    parser.add_argument("--seeds", type=int, default=None, metavar="S",
                        help="seeds per scenario point (default: 3, 1 with --quick)")
    parser.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                        help="the shared data folder with shapes/, uci/ and mnist/ (default: kkmgpu's search path)")
    parser.add_argument("--no-plots", dest="plots", action="store_false", help="write no PNG plots")
    parser.add_argument("--device", default="auto", metavar="auto|cpu|cuda|cuda:N",
                        help="where kkmgpu's methods and the metrics run (default: auto)")
    parser.add_argument("--quiet", action="store_true", help="no per-run lines")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="a progress bar over the runs (default: on when stderr is a terminal)")
    return parser


def _progress_default(flag):
    """``--progress`` / ``--no-progress`` as given, otherwise on exactly when stderr is a terminal."""
    return bool(sys.stderr.isatty()) if flag is None else bool(flag)


def _name_list(text):
    return [part.strip() for part in text.split(",") if part.strip()]


def run_from_args(args):
    """Run the comparison from parsed arguments and write the outputs; returns the exit status 0."""
    verbose = not args.quiet
    report = run_comparison(dataset_names=args.datasets, method_names=args.methods, scenarios=args.scenarios,
                            quick=args.quick, seeds=args.seeds, device=args.device, data_dir=args.data_dir,
                            verbose=verbose, progress=_progress_default(args.progress))
    report["argv"] = sys.argv[1:]
    paths = write_outputs(report, args.out, args.prefix, plots=args.plots, verbose=verbose)
    for path in paths:
        print(f"wrote {path}")
    return 0


def main(argv=None):
    """``python -m kkmgpu.compare``: the same as ``kkmgpu compare``."""
    parser = add_arguments(argparse.ArgumentParser(prog="kkmgpu compare", description=__doc__.splitlines()[0]))
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
