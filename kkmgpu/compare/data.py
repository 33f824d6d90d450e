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
#: sets that kkmgpu.datasets generates, so that every installation has data to compare on (600 points, seed 0)
GENERATED = {"circles": datasets.make_two_circles, "spirals": datasets.make_two_spirals}
GENERATED_N = 600
DEFAULT_DATASETS = (*SHAPES, "wifi", "wine", "wdbc", "digits", "mnist-1000", "mnist-2000", "mnist-5000")
QUICK_DATASETS = (*GENERATED, "flame", "jain", "wine", "mnist-500")
KNOWN_DATASETS = (*GENERATED, *DEFAULT_DATASETS)

_HOW_TO_POINT_AT_DATA = "set KKMGPU_DATA_DIR or pass --data-dir DIR (docs/data.md says where to get the files)"


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
        A generated set ("circles", "spirals": 600 points from :mod:`kkmgpu.datasets`, seed 0, on every
        installation), a shape set ("aggregation", "compound", "flame", "jain", "r15"), "wifi", "wine", "wdbc",
        "digits", or "mnist-N" (a sample of N MNIST digits drawn with random_state=0).
    data_dir : path, optional
        The data folder (with ``shapes/``, ``uci/``, ``mnist/``), then the only one looked in; by default
        ``$KKMGPU_DATA_DIR``, then, when kkmgpu runs from a source checkout, ``shared/data`` beside it
        (never a folder beside an installed package).

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
    if name in GENERATED:
        X, y = GENERATED[name](GENERATED_N, random_state=0)
        return Dataset(name, _standardise(X), y, 2,
                       f"kkmgpu.datasets.{GENERATED[name].__name__}({GENERATED_N}, random_state=0), standardised")
    if name in SHAPES:
        folders = [data_dir / "shapes"] if data_dir is not None else datasets._shared_data_dirs("shapes")
        path = next((d / f"{name}.csv" for d in folders if (d / f"{name}.csv").is_file()), None)
        if path is None:
            raise Unavailable(_not_found(f"shape set {name!r}", f"{name}.csv", folders))
        X, y = datasets.load_shape_set(name, path)
        return Dataset(name, _standardise(X), y, int(y.max()) + 1, "SIPU shape set, standardised")
    if name == "wifi":
        folders = [data_dir / "uci"] if data_dir is not None else datasets._shared_data_dirs("uci")
        path = next((d / "wifi_localization.csv" for d in folders if (d / "wifi_localization.csv").is_file()), None)
        if path is None:
            raise Unavailable(_not_found("WiFi", "wifi_localization.csv", folders))
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
        if data_dir is None and not datasets._mnist_dir_candidates(None):
            raise Unavailable(_not_found("MNIST", "the four MNIST files", []))
        try:
            X, y = datasets.load_mnist(None if data_dir is None else data_dir / "mnist", n_samples=n,
                                       random_state=0)
        except FileNotFoundError as exc:
            raise Unavailable(" ".join(str(exc).split()) + f" For kkmgpu compare: {_HOW_TO_POINT_AT_DATA}.") from None
        return Dataset(name, np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.int64), 10,
                       f"MNIST, {n} points drawn with random_state=0, pixels / 255")
    raise ValueError(f"data set {name!r} is not known; use one of {list(KNOWN_DATASETS)} or mnist-N.")


def _not_found(what, file_name, folders):
    """Why a data set is unavailable: the folders looked in (or that none was named), and how to name one."""
    where = f"no {file_name} in {', '.join(map(str, folders))}" if folders else "no data folder is set"
    return f"{what} not found ({where}); {_HOW_TO_POINT_AT_DATA}"


def _check_dataset_name(name):
    if name in KNOWN_DATASETS:
        return
    if isinstance(name, str) and name.startswith("mnist-") and name[6:].isdigit() and 1 <= int(name[6:]) <= 70_000:
        return
    raise ValueError(f"data set {name!r} is not known; use one of {list(KNOWN_DATASETS)} or mnist-N "
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
