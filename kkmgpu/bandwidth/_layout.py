"""The device arrays of a walk: the points in a permuted order (K in cluster order for §6.2's limited checks)
and the pair of n x n matrices K and K'.
"""

from __future__ import annotations

import numpy as np

from kkmgpu.bandwidth import matrices as _matrices
from kkmgpu.bandwidth import offgrid as _offgrid
from kkmgpu.backend.device import argsort_stable, check_fits, memory_advice


class _Layout:
    """Points held in a permuted order (K in cluster order for the limited checks).

    ``order[i]`` is the input index of the point at position i.
    """

    def __init__(self, backend, n, weights_h):
        self.backend = backend
        self.order = backend.xp.arange(n, dtype=backend.xp.int64)
        self.weights = backend.asarray(weights_h)

    def to_input(self, labels_l):
        xp = self.backend.xp
        out = xp.empty_like(labels_l)
        out[self.order] = labels_l
        return self.backend.to_host(out).astype(np.int32)

    def from_input(self, labels_h):
        return self.backend.asarray(np.asarray(labels_h, dtype=np.int32))[self.order]

    def regroup(self, K, Kp, labels_l, k, limited, costs):
        """Kp <- K for the walk; in cluster order (K permuted too) when the limited checks will be used."""
        xp = self.backend.xp
        labels_h = self.backend.to_host(labels_l)
        if limited and _worth_limiting(labels_h, k) and (np.diff(labels_h) < 0).any():
            perm = argsort_stable(xp, labels_l).astype(xp.int64)
            _matrices.permute_into(Kp, K, perm, self.backend)
            xp.copyto(K, Kp)
            self.order = self.order[perm]
            self.weights = self.weights[perm]
            costs["relayouts"] += 1
            return labels_l[perm]
        xp.copyto(Kp, K)
        return labels_l


def _worth_limiting(labels_h, k):
    counts = np.bincount(labels_h, minlength=k).astype(np.float64)
    n = labels_h.size
    m = min(n, max(32, n // (4 * max(1, k))))
    return k > 1 and (np.sum(counts ** 2) + m * n) / max(1, n) ** 2 < _offgrid.LIMITED_CHECK_MAX_COST


def _alloc_pair(n, dt, backend):
    check_fits(2 * n * n * dt.itemsize, backend, f"the two {n} x {n} {dt.name} matrices K and K' of the walk",
               advice=memory_advice(dtype=dt, method="search"))
    xp = backend.xp
    return xp.empty((n, n), dtype=dt), xp.empty((n, n), dtype=dt)
