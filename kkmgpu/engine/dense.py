"""The dense operator: the kernel matrix K held on the device."""

from __future__ import annotations

import numpy as np

from kkmgpu.backend.device import Backend, argsort_stable


class DenseKernelOperator:
    """Cluster sums from a dense symmetric kernel matrix held on the device.

    Full pass: S[i, c] = sum_{j in c} w_j K[i, j], one read of K. Incremental pass after m points
    moved: S += K[:, moved] dY (dY[j] = +w_j at the new cluster, -w_j at the old one), which reads
    the m moved rows of K once (``ops.moved_sums``) instead of all n.
    """

    #: :func:`kkmgpu.engine.lloyd.lloyd` passes the number of moved points to :meth:`update_cluster_sums`
    #: (known on the host from the assignment's transfer), so that the update needs no transfer of its own.
    takes_moved_count = True

    def __init__(self, K, weights, backend: Backend):
        self.K = K
        self.weights = weights
        self.backend = backend
        self.n = K.shape[0]
        self.diag = backend.xp.diagonal(K).astype(backend.xp.float64)
        self.total_diag = float((weights * self.diag).sum())  # sum_i w_i K_ii, the same every iteration

    def rows(self, index):
        """K[index, :] as a float64 host array."""
        return self.backend.to_host(self.device_rows(self.backend.asarray(np.asarray(index))))

    def device_rows(self, index):
        """K[index, :] as a float64 array on the device, for ``index`` on the device (k-means++ seeding)."""
        return self.K[index].astype(self.backend.xp.float64)

    def cluster_sums(self, labels, k):
        xp = self.backend.xp
        order = argsort_stable(xp, labels)
        S = xp.zeros((self.n, k), dtype=xp.float64)
        return self.backend.ops.segment_sums(self.K, order, labels[order], self.weights[order], S)

    def incremental_cost(self, n_moved):
        """Rows of K read by the incremental update, relative to a full pass."""
        return n_moved / max(1, self.n)

    def update_cluster_sums(self, S, old_labels, new_labels, n_moved=None):
        """S for ``new_labels`` from S for ``old_labels``, in place, reading each moved row of K once.

        ``n_moved``: how many labels differ, if known (else counted here, one transfer). The moved points are
        gathered on the device without a transfer and put in the order of their (old, new) pair by a sort of
        the m moved points only, which ``ops.moved_sums`` needs.
        """
        xp = self.backend.xp
        if n_moved is None:
            n_moved = int(xp.count_nonzero(old_labels != new_labels))
        if n_moved == 0:
            return S
        moved = moved_points(old_labels, new_labels, n_moved, xp)
        old_m = old_labels[moved]
        new_m = new_labels[moved]
        order = argsort_stable(xp, old_m.astype(xp.int64) * S.shape[1] + new_m)
        rows = moved[order]
        return self.backend.ops.moved_sums(self.K, rows, self.weights[rows], old_m[order].astype(xp.int32),
                                           new_m[order].astype(xp.int32), S)


def moved_points(old_labels, new_labels, n_moved, xp):
    """The indices (int64, increasing) of the ``n_moved`` points whose label changed, on the device, without a
    transfer: each moved point's rank among the moved ones (a cumulative sum) is its slot; the others write
    into one spare slot past the end, which is dropped."""
    changed = old_labels != new_labels
    slot = xp.where(changed, xp.cumsum(changed, dtype=xp.int64) - 1, n_moved)
    out = xp.empty(n_moved + 1, dtype=xp.int64)
    out[slot] = xp.arange(old_labels.shape[0], dtype=xp.int64)
    return out[:n_moved]
