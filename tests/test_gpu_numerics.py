"""What the first H100 runs (2026-11-26) showed a real GPU does that NumPy does not, held on both devices: float32
subnormals flushed to zero by CuPy's kernels, CuPy's Lanczos failing on small or degenerate graphs, and sums in
another order (a perfect cut must still be 0)."""

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp

from conftest import host
from kkmgpu.backend.device import resolve_device
from kkmgpu.backend.magnitude import largest_magnitude
from kkmgpu.engine.sparse import to_backend_csr
from kkmgpu.methods import graph_spectral
from kkmgpu.methods.graphcut import degrees, graph_objective


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_largest_magnitude_is_max_abs_subnormals_and_signs_included(device, dtype):
    """largest_magnitude (max |K| of a precomputed kernel) equals NumPy's max |x| on the host: random values,
    subnormals only (the stand-in's float32 max reads them as 0, as CuPy does), the extreme on the negative side,
    a strided slice of a Fortran-ordered array, -0 and an empty array."""
    backend = resolve_device(device)
    rng = np.random.default_rng(300)
    tiny = float(np.finfo(dtype).tiny)
    cases = [rng.normal(size=(40, 7)), rng.integers(1, 6, size=(9, 9)) * float(np.finfo(dtype).smallest_subnormal),
             -np.abs(rng.normal(size=(5, 5))) * 1e3, np.array([[-0.0, 0.0]]), np.zeros((0, 3))]
    cases[2][1, 1] = 0.5  # the largest magnitude is negative: the positive maximum alone would miss it
    for values in cases:
        values = values.astype(dtype)
        want = float(np.abs(values.astype(np.float64)).max()) if values.size else 0.0
        assert largest_magnitude(backend.asarray(values)) == want
    F = np.asfortranarray(rng.normal(size=(30, 12)).astype(dtype))
    assert largest_magnitude(backend.asarray(F)[3:17]) == float(np.abs(F[3:17].astype(np.float64)).max())
    assert 0.0 < largest_magnitude(backend.asarray(cases[1].astype(dtype))) < tiny


def test_a_lanczos_that_breaks_down_gives_the_dense_shift(monkeypatch):
    """psd_shift above DENSE_SHIFT nodes: a Lanczos eigenvalue that comes back NaN (CuPy's unguarded breakdown)
    or raises LinAlgError is recomputed densely, never read as sigma = 0."""
    import scipy.sparse.linalg as spla

    rng = np.random.default_rng(301)
    n = graph_spectral.DENSE_SHIFT + 36
    W = np.triu(rng.uniform(0.1, 1.0, size=(n, n)) * (rng.random((n, n)) < 0.2), 1)
    A = sp.csr_matrix(W + W.T)
    d = np.asarray(A.sum(axis=1)).ravel()
    N = A.toarray() / np.sqrt(np.outer(d, d))
    want = 1.01 * -np.linalg.eigvalsh(N)[0]
    backend = resolve_device("cpu")

    def nan_eigsh(*args, **kwargs):
        return np.array([np.nan])

    def failing_eigsh(*args, **kwargs):
        raise np.linalg.LinAlgError("Eigenvalues did not converge")

    for broken in (nan_eigsh, failing_eigsh):
        monkeypatch.setattr(spla, "eigsh", broken)
        assert graph_spectral.psd_shift(A, d, "ncut", backend, np.random.default_rng(0)) == \
            pytest.approx(want, rel=1e-12)


def test_the_cut_of_a_partition_along_the_components_is_exactly_zero(device):
    """graph_objective's normalized cut sums the edges between clusters: a partition along the graph's components
    gives exactly 0 (the H100 gave 2.2e-16 from k - sum links(c, c) / d(c)); any other partition its float64
    reference sum_c links(c, V - c) / d(c)."""
    backend = resolve_device(device)
    rng = np.random.default_rng(302)
    k, m = 5, 23
    A = scipy.linalg.block_diag(*[B + B.T for B in (rng.uniform(1e-3, 1e3, size=(m, m)) for _ in range(k))])
    labels = np.repeat(rng.permutation(k), m)
    Ad = to_backend_csr(sp.csr_matrix(A), backend, np.float64)
    d = degrees(Ad, backend)
    assert graph_objective(Ad, d, backend.asarray(labels), k, "ncut", backend) == 0.0
    other = rng.integers(0, k, size=k * m)
    deg = A.sum(axis=1)
    want = sum(A[other == c][:, other != c].sum() / deg[other == c].sum() for c in range(k))
    value = graph_objective(Ad, d, backend.asarray(other), k, "ncut", backend)
    assert value == pytest.approx(want, rel=1e-12)
    assert np.isclose(host(d), deg, rtol=1e-14).all()


@pytest.mark.parametrize("n", [60, graph_spectral.DENSE_COMPONENT, graph_spectral.DENSE_COMPONENT + 1])
def test_small_graphs_on_a_gpu_take_the_dense_eigh_after_the_same_draws(device, n):
    """spectral_embedding of a connected graph: on a GPU up to DENSE_COMPONENT nodes by one dense eigh (LOBPCG
    there gave 100 identical points' eigenvalues that changed between calls on the H100), above it LOBPCG; on both
    devices the eigenvalues are the float64 reference's and the generator is left where the CPU's call leaves it,
    so the k-means++ seeds after the start are the same."""
    backend = resolve_device(device)
    rng = np.random.default_rng(303)
    k = 3
    W = rng.uniform(0.1, 1.0, size=(n, n))
    W = sp.csr_matrix(np.triu(W * (rng.uniform(size=(n, n)) < 0.2), 1))
    W = W + W.T + sp.diags(np.full(n - 1, 0.5), 1) + sp.diags(np.full(n - 1, 0.5), -1)  # a path: connected
    A = to_backend_csr(sp.csr_matrix(W), backend, np.float64)
    d = degrees(A, backend)
    dense = W.toarray()
    deg = dense.sum(axis=1)
    want = np.linalg.eigvalsh(dense / np.sqrt(np.outer(deg, deg)))[::-1][:k]
    generator, reference = np.random.default_rng(5), np.random.default_rng(5)
    E, w, _, solver = graph_spectral.spectral_embedding(A, d, k, backend, generator, tol=1e-10)
    graph_spectral.spectral_embedding(to_backend_csr(sp.csr_matrix(W), resolve_device("cpu"), np.float64),
                                      deg, k, resolve_device("cpu"), reference, tol=1e-10)
    np.testing.assert_allclose(w, want, rtol=0, atol=1e-8)
    assert solver == ("dense" if backend.is_gpu and n <= graph_spectral.DENSE_COMPONENT
                      else ("lobpcg" if backend.is_gpu else "arpack"))
    assert generator.integers(2 ** 62) == reference.integers(2 ** 62)
    assert np.isfinite(host(E)).all()
