"""The dense operator: the kernel matrix K held on the device."""

from __future__ import annotations

import numpy as np

from kkmgpu.backend.device import Backend, argsort_stable


class DenseKernelOperator:
    """Cluster sums from a dense symmetric kernel matrix held on the device.

    Full pass: S[i, c] = sum_{j in c} w_j K[i, j], one read of K. Incremental pass after m points
    moved: S += K[:, moved] dY (dY[j] = +w_j at the new cluster, -w_j at the old one), which reads
    2 m rows of K instead of n.
    """

    def __init__(self, K, weights, backend: Backend):
        self.K = K
        self.weights = weights
        self.backend = backend
        self.n = K.shape[0]
        self.diag = backend.xp.diagonal(K).astype(backend.xp.float64)
        self.total_diag = float((weights * self.diag).sum())  # sum_i w_i K_ii, the same every iteration

    def rows(self, index):
        """K[index, :] as a float64 host array (for k-means++ seeding)."""
        return self.backend.to_host(self.K[self.backend.asarray(np.asarray(index))]).astype(np.float64)

    def cluster_sums(self, labels, k):
        xp = self.backend.xp
        order = argsort_stable(xp, labels)
        S = xp.zeros((self.n, k), dtype=xp.float64)
        return self.backend.ops.segment_sums(self.K, order, labels[order], self.weights[order], S)

    def incremental_cost(self, n_moved):
        """Rows of K read by the incremental update, relative to a full pass."""
        return 2.0 * n_moved / max(1, self.n)

    def update_cluster_sums(self, S, old_labels, new_labels):
        """S for ``new_labels`` from S for ``old_labels``, in place, reading only the moved rows."""
        xp = self.backend.xp
        moved = xp.flatnonzero(old_labels != new_labels)
        rows = xp.concatenate([moved, moved])
        clusters = xp.concatenate([new_labels[moved], old_labels[moved]]).astype(xp.int32)
        w = self.weights[moved]
        coeffs = xp.concatenate([w, -w])
        order = argsort_stable(xp, clusters)
        return self.backend.ops.segment_sums(self.K, rows[order], clusters[order], coeffs[order], S)
