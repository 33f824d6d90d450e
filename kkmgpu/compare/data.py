"""The comparison's data sets: the labelled sets by name, preprocessed as every method sees them
(:func:`load_dataset`), and the scenarios' Gaussian blobs (:func:`make_blobs`).

>>> X, y = make_blobs(6, 2, 3, seed=0)
>>> X.shape, sorted(y.tolist())
((6, 2), [0, 0, 1, 1, 2, 2])
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kkmgpu import datasets

SHAPES = tuple(datasets.SHAPE_SETS)
DEFAULT_DATASETS = (*SHAPES, "wifi", "wine", "wdbc", "digits", "mnist-1000", "mnist-2000", "mnist-5000")
QUICK_DATASETS = ("flame", "jain", "wine", "mnist-500")


class Unavailable(Exception):
    """A data set or method that cannot run here (missing package, file or kkmgpu feature); the message says why."""


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
