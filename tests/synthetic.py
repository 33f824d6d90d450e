"""Small labelled data sets and initial partitions shared by the method tests (fixed seeds, fresh per seed)."""

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
