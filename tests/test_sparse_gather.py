"""The sparse operator's incremental update without a transfer of its own (issue 26, point 4): the moved rows of K
gathered on the device into a size the host knows (engine/sparse.py ``gathered_rows``, ``longest_rows_entries``),
held to the rows themselves and to the float64 dense products, on both devices."""

import numpy as np
import pytest
import scipy.sparse as sp

from kkmgpu.backend import device as _backend
from kkmgpu.engine import sparse as _sparse


def _symmetric_csr(n, density, seed, empty_rows=()):
    """A random symmetric CSR matrix (float64) whose rows ``empty_rows`` (and columns) hold nothing."""
    rng = np.random.default_rng(seed)
    A = sp.random(n, n, density=density, format="csr", random_state=rng)
    A = (A + A.T).tolil()
    for i in empty_rows:
        A[i, :] = 0
        A[:, i] = 0
    A = A.tocsr()
    A.eliminate_zeros()
    return A


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def test_longest_rows_entries_bound_every_choice_of_rows(device):
    A = _symmetric_csr(90, 0.08, 1, empty_rows=(4, 50))
    backend = _backend.resolve_device(device)
    with backend.activate():
        bound = _sparse.longest_rows_entries(_sparse.to_backend_csr(A, backend), backend)
    lengths = np.diff(A.indptr)
    np.testing.assert_array_equal(bound, np.concatenate([[0], np.cumsum(np.sort(lengths)[::-1])]))
    rng = np.random.default_rng(2)
    for m in (1, 7, 45, 90):
        for _ in range(20):
            assert lengths[rng.choice(90, m, replace=False)].sum() <= bound[m]


@pytest.mark.parametrize("extra", ["exact", "plus 7", "longest rows", "several padding rows"])
def test_gathered_rows_are_the_rows_then_zero_rows(device, extra):
    """Rows r < m are A[index[r]] exactly; the rest of the slots are zero rows; the matrix holds ``slots`` entries,
    each row's columns strictly increasing (canonical, as its flag says)."""
    n = 60
    A = _symmetric_csr(n, 0.1, 3, empty_rows=(7,))
    rng = np.random.default_rng(4)
    index = np.sort(rng.choice(n, 17, replace=False))
    index[0] = 7  # an empty row among them
    index = np.sort(index)
    entries = int(np.diff(A.indptr)[index].sum())
    slots = {"exact": entries, "plus 7": entries + 7, "longest rows": int(np.cumsum(np.sort(np.diff(A.indptr))
                                                                                    [::-1])[16]),
             "several padding rows": min(A.nnz, entries + 2 * n + 5)}[extra]
    backend = _backend.resolve_device(device)
    with backend.activate():
        K = _sparse.to_backend_csr(A, backend)
        rows = _sparse.gathered_rows(K, backend.asarray(index.astype(np.int64)), slots, backend.xp)
        host = rows.get() if backend.is_gpu else rows
        assert rows.has_canonical_format
    assert host.shape == (17 + slots // n + 1, n) and host.nnz == slots == host.indptr[-1]
    dense = host.toarray()
    np.testing.assert_array_equal(dense[:17], A.toarray()[index])
    assert not dense[17:].any()
    for r in range(host.shape[0]):
        assert np.all(np.diff(host.indices[host.indptr[r]:host.indptr[r + 1]]) > 0)


@pytest.mark.parametrize("n_moved", [0, 1, 37, 200])
def test_update_told_the_moved_count_equals_the_float64_sums(device, n_moved):
    """The operator's update, told the moved count as the Lloyd loop tells it, gives the sums of the update that
    counts the moved points itself (the same bits), the same bits again on a second call, and the float64 dense
    product A @ Y of the new labels. On a GPU the bits hold only with the gathered rows' transpose formed before the
    product: cuSPARSE's product with a transposed operand adds in an order that changes from run to run (an H100
    gave 313 of these 1,200 sums 1-2 ulp apart at 200 moved points, the two updates' inputs identical)."""
    n, k = 200, 6
    A = _symmetric_csr(n, 0.05, 5, empty_rows=(0, 13))
    rng = np.random.default_rng([n_moved, 6])
    labels = rng.integers(0, k, n).astype(np.int32)
    new = labels.copy()
    moved = rng.choice(n, n_moved, replace=False)
    new[moved] = (new[moved] + rng.integers(1, k, n_moved)) % k
    weights = rng.uniform(0.5, 2.0, n)
    Y = np.zeros((n, k))
    Y[np.arange(n), new] = weights
    backend = _backend.resolve_device(device)
    with backend.activate():
        op = _sparse.SparseKernelOperator(_sparse.to_backend_csr(A, backend), backend.asarray(weights), backend)
        assert op.takes_moved_count
        S = op.cluster_sums(backend.asarray(labels), k)
        counted = _host(op.update_cluster_sums(S.copy(), backend.asarray(labels), backend.asarray(new)))
        again = _host(op.update_cluster_sums(S.copy(), backend.asarray(labels), backend.asarray(new),
                                             n_moved=n_moved))
        told = _host(op.update_cluster_sums(S, backend.asarray(labels), backend.asarray(new), n_moved=n_moved))
    np.testing.assert_array_equal(told, counted)
    np.testing.assert_array_equal(told, again)
    np.testing.assert_allclose(told, A.toarray() @ Y, rtol=1e-10, atol=1e-10)


def test_library_route_told_the_count_and_slots_matches_the_numba_twin():
    """The GPU's route (on the CPU with SciPy), given the moved count and more slots than the rows hold, against the
    CPU's numba twin."""
    from kkmgpu.kernels.csr_cpu import csr_update_cluster_sums

    n, k = 150, 5
    A = _symmetric_csr(n, 0.06, 7)
    rng = np.random.default_rng(8)
    labels = rng.integers(0, k, n).astype(np.int32)
    new = labels.copy()
    moved = rng.choice(n, 30, replace=False)
    new[moved] = (new[moved] + rng.integers(1, k, 30)) % k
    w = rng.uniform(0.1, 3.0, n)
    S = rng.normal(size=(n, k))
    slots = int(_sparse.longest_rows_entries(A, _backend.Backend("cpu"))[30]) + 11
    got = _sparse.library_update_cluster_sums(A, S.copy(), labels, new, w, np, n_moved=30, slots=slots)
    np.testing.assert_allclose(got, csr_update_cluster_sums(A, S.copy(), labels, new, w), rtol=1e-12, atol=1e-12)
