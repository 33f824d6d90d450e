"""One far outlier beside a bulk of points, and weights beyond float64's range (hostile cases of the graph routes).

- The exact graph route centres the features on their mean: one point at 1e15 beside 3,000 points spread over 10
  moves the mean 3e11 from the bulk, and float32 features there keep no digit of the bulk's spread. It cannot be
  right, so it must say so (PrecisionWarning); float64 keeps the digits and finds the blobs, silently.
- The landmark route centres on the bulk's median and runs its representatives' k-means in float64: the same data
  give the blobs in float32 and float64 (before: NMI 0.001 in float32, 6 distinct representatives of 1500; 0.003
  in float64, the GEMM keys lost to the offset).
- Weights from 1e-300 to 1e300 cannot be held relative to each other in float64: the landmark route refuses them
  (before: a representative whose every edge had weight 0 was renumbered to -1 in the CSR, and scipy's sparse
  product corrupted the heap: "double free or corruption", the interpreter aborted).
"""

import warnings

import numpy as np
import pytest
import scipy.sparse as sps

import kkmgpu
from kkmgpu.backend.device import resolve_device
from kkmgpu.kernels.spec import PrecisionWarning
from kkmgpu.methods import landmark_graph


def _blobs_and_outlier(seed=0):
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [30.0, 0.0], [0.0, 30.0], [30.0, 30.0]])
    y = np.repeat(np.arange(4), 400)
    X = centres[y] + rng.normal(size=(1600, 2))
    return np.r_[X, [[1e15, 1e15]]], y


def _nmi_on_bulk(y, labels):
    return kkmgpu.metrics.nmi(y, np.asarray(labels)[:len(y)])


def test_the_exact_route_warns_where_float32_cannot_resolve_the_bulk():
    X, y = _blobs_and_outlier()
    with pytest.warns(PrecisionWarning, match=r"dtype=float32 cannot resolve most of these points.*float64"):
        kkmgpu.fit(X, 4, objective="ncut", random_state=0, device="cpu", n_init=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrecisionWarning)
        result = kkmgpu.fit(X, 4, objective="ncut", random_state=0, device="cpu", dtype="float64", n_init=2)
        assert _nmi_on_bulk(y, result.labels) > 0.95
        kkmgpu.fit(X[:-1], 4, objective="ncut", random_state=0, device="cpu", n_init=2)   # no outlier: no warning


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_landmark_route_finds_the_blobs_beside_a_far_outlier(dtype):
    X, y = _blobs_and_outlier()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrecisionWarning)
        result = kkmgpu.fit(X, 4, objective="ncut", method="landmark", n_landmarks=200, random_state=0,
                            device="cpu", dtype=dtype)
    assert _nmi_on_bulk(y, result.labels) > 0.95
    assert np.isfinite(result.objective)


def test_weights_beyond_float64s_range_are_refused_not_a_crash():
    X, _ = _blobs_and_outlier()
    w = np.geomspace(1e-300, 1e300, X.shape[0])
    with pytest.raises(ValueError, match=r"sample_weight spans 1e\+300 to 1e-300.*underflow"):
        kkmgpu.fit(X, 4, objective="ncut", method="landmark", n_landmarks=100, sample_weight=w, device="cpu")


def test_a_dropped_representative_takes_its_zero_edges_with_it():
    """Column 1's only entries are 0 (edges whose weight underflowed): it is dropped with them, the others are
    renumbered, and the result is the float64 reference with that column removed (no index below 0)."""
    backend = resolve_device("cpu", ())
    B = sps.csr_matrix(np.array([[0.5, 0.0, 0.2], [0.0, 0.0, 0.7], [0.3, 0.0, 0.0]]))
    B[0, 1] = 0.0   # an explicit stored zero
    B[2, 1] = 0.0
    assert B.nnz == 6
    dy = np.asarray(B.sum(axis=0)).ravel()
    B2, dy2, kept = landmark_graph.keep_linked(B, dy, backend)
    np.testing.assert_array_equal(kept, [0, 2])
    assert B2.indices.min() >= 0 and B2.shape == (3, 2)
    np.testing.assert_array_equal(B2.toarray(), B.toarray()[:, [0, 2]])
    np.testing.assert_array_equal(dy2, dy[[0, 2]])


@pytest.mark.parametrize("n, k, want", [(40, 3, 10), (40, 12, 12), (1000, 2, 250), (5999, 3, 1499), (8000, 3, 1500)])
def test_the_landmark_default_is_a_quarter_of_small_data(n, k, want):
    """p = min(1500, max(k, n // 4)): with p = n (the first default) every point was its own representative and
    the route lost the small sets (docs/graphs.md); n // 4 was chosen on the selection tuning half."""
    from kkmgpu.methods import landmark_cut

    assert landmark_cut.default_landmarks(n, k) == want


def test_the_default_representatives_resolve_two_spirals():
    """1,000 points of two spirals: p = n gave NMI 0.50 (seed 0), the quarter gives 1.0."""
    X, y = kkmgpu.datasets.make_two_spirals(1000, random_state=0)
    result = kkmgpu.fit(X, 2, objective="ncut", method="landmark", random_state=0, device="cpu")
    assert result.method_params["n_landmarks"] == 250
    assert kkmgpu.metrics.nmi(y, result.labels) > 0.95
