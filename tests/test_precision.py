"""Storage precision of K (float64 / float32 / float16): the effect on labels and objective stays small.

The bounds below are those measured on scikit-learn's digits (see README, "Storage precision"), with margin;
every objective is re-evaluated exactly (float64 K) so the comparison is between partitions, not roundings.
"""

import numpy as np
import pytest

import kkmgpu
from kkmgpu import metrics

datasets = pytest.importorskip("sklearn.datasets")

BOUNDS = {  # dtype: (min label agreement with float64, max relative excess of the exact objective)
    "float32": (0.995, 2e-5),
    "float16": (0.97, 3e-4),
}


@pytest.fixture(scope="module")
def digits():
    d = datasets.load_digits()
    return d.data / 16.0, d.target


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_storage_precision_effect_on_labels_and_objective(device, digits, dtype, seed):
    X, y = digits
    init = np.random.default_rng(seed).integers(0, 10, len(X))
    exact = kkmgpu.fit(X, 10, init=init, dtype="float64", tol=0, device=device)
    low = kkmgpu.fit(X, 10, init=init, dtype=dtype, tol=0, device=device)
    assert low.dtype == dtype
    K64 = kkmgpu.kernel_matrix(X, dtype="float64", device="cpu")
    agreement = float((np.asarray(low.labels) == np.asarray(exact.labels)).mean())
    excess = (metrics.kernel_kmeans_objective(K64, low.labels) - exact.objective) / exact.objective
    min_agreement, max_excess = BOUNDS[dtype]
    assert agreement >= min_agreement
    assert excess <= max_excess  # may be negative: another local minimum, as good or better
    assert abs(metrics.nmi(y, low.labels) - metrics.nmi(y, exact.labels)) <= 0.02
    # the reported objective is that of the stored (rounded) K: close to the exact one
    assert low.objective == pytest.approx(metrics.kernel_kmeans_objective(K64, low.labels), rel=10 * max_excess)


def test_float16_kernel_matrix_is_the_rounded_float32_one():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(120, 5))
    K16 = kkmgpu.kernel_matrix(X, dtype="float16", device="cpu")
    K32 = kkmgpu.kernel_matrix(X, dtype="float32", device="cpu")
    assert K16.dtype == np.float16
    np.testing.assert_array_equal(K16, K32.astype(np.float16))


def test_float16_halves_the_memory_check(monkeypatch):
    """The memory check counts 2 bytes per entry for float16: a budget that refuses float32 admits float16."""
    from kkmgpu.backend import device as _backend

    n = 400
    monkeypatch.setattr(_backend.Backend, "available_bytes", lambda self: int(n * n * 3 / _backend.MEMORY_HEADROOM))
    X = np.random.default_rng(4).normal(size=(n, 3))
    with pytest.raises(kkmgpu.InsufficientMemoryError, match="float32"):
        kkmgpu.fit(X, 2, dtype="float32", device="cpu", engine="dense")
    assert kkmgpu.fit(X, 2, dtype="float16", device="cpu", random_state=0, engine="dense").dtype == "float16"
