"""Random draws over all n points made on the device, the same on every device: CATS's per-cluster samples and the
D^2 sampling of k-means++ landmarks.

The host draws only what does not grow with n (one seed per CATS iteration; one uniform per landmark); what is
n long (keys, cumulative sums, the searches in them) is computed where the data are. Random keys come from a
counter-based generator: SplitMix64's output function (Steele, Lea and Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014) applied to the point's index and the seed, integer arithmetic that NumPy and CuPy
evaluate alike, so the CPU and a GPU draw the same samples from the same seed.
"""

from __future__ import annotations

import numpy as np

from kkmgpu.backend.device import Backend, argsort_stable

_GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment: 2^64 / the golden ratio, odd
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def random_keys(n, seed, xp):
    """n pseudo-random uint64 keys: SplitMix64's outputs for the states seed + (i + 1) * golden, i = 0 .. n-1."""
    u64 = xp.uint64
    z = xp.arange(1, n + 1, dtype=u64) * u64(_GOLDEN) + u64(seed)
    z = (z ^ (z >> u64(30))) * u64(_MIX1)
    z = (z ^ (z >> u64(27))) * u64(_MIX2)
    return z ^ (z >> u64(31))


def sample_members(labels, positive, counts, width, seed, backend: Backend):
    """min(width, counts[c]) distinct positive-weight members of every cluster c, uniformly without replacement.

    Parameters
    ----------
    labels : int32 (n,) on the device
    positive : bool (n,) on the device, the points that may be drawn (positive weight)
    counts : host int (k,), the positive-weight members of each cluster of ``labels``
    width : int, the samples per cluster asked for (the row length)
    seed : int in [0, 2^64)

    Returns
    -------
    index : int64 (k, width) on the device, each row in increasing index, padded by repeating its first member (an
        empty cluster's row is 0)
    mask : host bool (k, width), True on the sampled entries

    Every point gets a random key; one stable sort by (cluster, key), with the points that may not be drawn after
    every cluster, lays each cluster's members out in one run in random order, and the first min(width, n_c) of
    the run (the members with the smallest keys) are a uniform sample without replacement. The host handles only
    k x width positions.
    """
    xp = backend.xp
    n = labels.shape[0]
    k = counts.shape[0]
    group = xp.where(positive, labels, k).astype(xp.uint64)
    order = argsort_stable(xp, (group << xp.uint64(32)) | (random_keys(n, seed, xp) >> xp.uint64(32)))
    taken = np.minimum(counts, width)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    j = np.arange(width)
    mask = j[None, :] < taken[:, None]
    position = np.minimum(starts[:, None] + np.where(mask, j[None, :], 0), max(n - 1, 0))
    mask_d = backend.asarray(mask)
    drawn = xp.sort(xp.where(mask_d, order[backend.asarray(position)], n), axis=1)  # padding (n) sorts last
    first = xp.where(mask_d[:, :1], drawn[:, :1], 0)
    return xp.where(mask_d, drawn, first), mask


def d2_sample_distinct(diag, weights, m, draws, column, backend: Backend):
    """m distinct points by D^2 sampling (the seeding of k-means++, Arthur and Vassilvitskii 2007, with m seeds):
    the first with probability proportional to its weight, each next with probability proportional to w_i times
    its squared feature-space distance to the nearest point drawn so far, K_ii - 2 K_ib + K_bb.

    ``diag`` (K_ii) and ``weights`` are float64 on the device; ``draws`` host uniforms in [0, 1), one per point,
    made by the caller's generator; ``column(b)`` gives the kernel column K(., b) for a device index array b of
    one point. Each point is found as ``Generator.choice(n, p=p / p.sum())`` finds it from the same uniform (the
    inverse of the normalised cumulative sum, searched to the right); once every point not drawn coincides with a
    drawn one (p = 0), any positive-weight point not drawn is equally likely. Everything n long stays on the
    device; returns the indices (device int64, in drawing order).
    """
    xp = backend.xp
    n = weights.shape[0]
    u = backend.asarray(np.asarray(draws, dtype=np.float64))
    chosen = xp.zeros(n, dtype=bool)
    index = xp.empty(m, dtype=xp.int64)
    fallback = (weights > 0).astype(xp.float64)
    closest = None
    for j in range(m):
        p = weights if closest is None else weights * xp.maximum(closest, 0.0)
        p = xp.where(chosen, 0.0, p)
        p = xp.where(p.sum() > 0, p, xp.where(chosen, 0.0, fallback))
        cdf = xp.cumsum(p / p.sum())
        cdf /= cdf[-1]
        b = xp.searchsorted(cdf, u[j:j + 1], side="right")
        index[j:j + 1] = b
        chosen[b] = True
        dist = diag + diag[b] - 2.0 * column(b)
        closest = dist if closest is None else xp.minimum(closest, dist)
    return index
