"""Small labelled data sets and initial partitions shared by the method tests (fixed seeds, fresh per seed), and
two helpers they share: ``host`` and ``quiet_fit``."""

import warnings

import numpy as np


def blobs(n, d, n_centers, seed, spread=4.0):
    """n points around ``n_centers`` Gaussian centres (scale ``spread``) in d dimensions, unit noise; (X, y)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=spread, size=(n_centers, d))
    y = rng.integers(0, n_centers, n)
    return centers[y] + rng.normal(size=(n, d)), y


def random_partition(n, k, seed):
    """A random partition of n points into k clusters, none empty (int32 labels)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    labels[rng.permutation(n)[:k]] = np.arange(k)
    return labels.astype(np.int32)


def host(a):
    """A NumPy copy of a NumPy or CuPy array."""
    return np.asarray(a.get() if hasattr(a, "get") else a)


def quiet_fit(X, k, **kwargs):
    """kkmgpu.fit without its ConvergenceWarning (tests that check labels, not convergence)."""
    import kkmgpu

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kkmgpu.ConvergenceWarning)
        return kkmgpu.fit(X, k, **kwargs)
