"""method="approx" under hostile input (issue 27 point 2), each case against a float64 reference.

- A kernel that is not positive semi-definite (sigmoid; a precomputed K whose K_BB has negative eigenvalues): the
  approximate objective bounds nothing, so ``objective`` is the exact kernel k-means objective of the labels,
  and the restart with the lowest exact objective is kept; a PSD kernel keeps the approximate upper bound.
- K_BB and its eigendecomposition are checked against the device's memory before anything m x m is allocated.
- ``landmarks`` given as sample indices: used as given, validated with messages that name the rule.
- A precomputed K scaled by 1e-45 or 1e+45 (float32 subnormals, or beyond float32's range) clusters as K does.
"""

import re
import tracemalloc

import numpy as np
import pytest
from reference import kernel_kmeans_objective, kernel_matrix
from synthetic import blobs, random_partition

import kkmgpu
from kkmgpu.backend import device as _backend


def exact_objective(K, labels, weights=None):
    return kernel_kmeans_objective(K, np.asarray(labels), weights)


@pytest.mark.parametrize("dtype, rtol", [("float64", 1e-10), ("float32", 1e-5)])
def test_sigmoid_objective_is_the_exact_objective_of_the_labels(device, dtype, rtol):
    """With the sigmoid kernel the approximate objective was -32.9 where the exact one of its labels is 2.25:
    now ``objective`` is the exact one (a float64 evaluation of K on the same labels), for every restart, and
    the restart kept is the one with the lowest."""
    X, _ = blobs(160, 4, 4, seed=61, spread=1.5)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    params = dict(gamma=0.2, coef0=1.0)
    K = kernel_matrix(X, kernel="sigmoid", **params)
    assert np.linalg.eigvalsh(K)[0] < -1e-3 * np.abs(np.diag(K)).sum()  # the kernel is not PSD here
    result = kkmgpu.fit(X, 4, method="approx", kernel="sigmoid", n_landmarks=40, n_init=3, init="random",
                        random_state=2, dtype=dtype, device=device, **params)
    reference = exact_objective(K, result.labels)
    scale = np.abs(K).sum() / len(K)  # the within-cluster sums' magnitude, which float32 rounds relative to
    assert result.objective == pytest.approx(reference, rel=rtol, abs=rtol * scale)
    assert result.exact_objective == result.objective == min(result.objectives)
    assert result.method_params["reported_objective"] == "exact"


@pytest.mark.parametrize("kernel, reported", [("rbf", "approximate"), ("sigmoid", "exact")])
def test_a_precomputed_K_not_psd_on_the_landmarks_reports_the_exact_objective(device, kernel, reported):
    """A precomputed K is judged by its landmarks: K_BB with an eigenvalue below -m eps lambda_max proves K is not
    PSD (then the exact objective), otherwise the approximate objective, an upper bound of the exact one."""
    X, _ = blobs(200, 3, 3, seed=62, spread=2.0)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    K = kernel_matrix(X, kernel=kernel, **(dict(gamma=0.3) if kernel == "rbf" else dict(gamma=0.2, coef0=1.0)))
    result = kkmgpu.fit(K, 3, kernel="precomputed", method="approx", n_landmarks=50, random_state=4,
                        dtype="float64", device=device)
    reference = exact_objective(K, result.labels)
    if reported == "exact":
        assert result.objective == pytest.approx(reference, rel=1e-10)
        assert result.method_params["smallest_eigenvalue"] < -result.method_params["eigenvalue_cutoff"]
    else:
        assert result.exact_objective is None
        assert result.objective >= reference * (1 - 1e-12)
    assert result.method_params["reported_objective"] == reported


def test_landmark_memory_is_checked_before_anything_m_by_m_is_allocated(device, monkeypatch):
    """n_landmarks=30000 passed 8 GB unchecked: K_BB's m x m work is checked against the free memory first (a
    MemoryError naming n_landmarks and the bytes), before the landmarks are drawn; a smaller m fits the same
    budget."""
    X, _ = blobs(650, 3, 3, seed=63)
    m = 600
    monkeypatch.setattr(_backend.Backend, "available_bytes", lambda self: 12 * m * m)
    tracemalloc.start()
    try:
        with pytest.raises(MemoryError, match=rf"n_landmarks={m}\).* \((\d+) bytes\)") as caught:
            kkmgpu.fit(X, 3, method="approx", n_landmarks=m, random_state=0, device=device)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    need = int(re.search(r"\((\d+) bytes\)", str(caught.value)).group(1))
    assert need >= 3 * m * m * 8  # at least K_BB, eigh's copy and the eigenvectors in float64
    assert peak < m * m * 8  # not one m x m float64 array
    result = kkmgpu.fit(X, 3, method="approx", n_landmarks=m // 4, random_state=0, device=device)
    assert result.method_params["n_landmarks"] == m // 4


def test_landmarks_given_as_indices_are_the_landmarks(device):
    """landmarks=np.arange(50) crashed on an ambiguous truth value. Given indices (any order, a list or an array)
    are the landmarks: the same run as the uniform draw that picked them, from the same initial labels."""
    X, _ = blobs(300, 3, 3, seed=64, spread=2.0)
    init = random_partition(300, 3, seed=5)
    drawn = kkmgpu.fit(X, 3, method="approx", n_landmarks=40, init=init, random_state=6, device=device)
    B = np.asarray(drawn._approx_state.index)
    for given in (B[::-1].copy(), B.tolist()):
        result = kkmgpu.fit(X, 3, method="approx", landmarks=given, init=init, random_state=7, device=device)
        np.testing.assert_array_equal(result._approx_state.index, B)
        np.testing.assert_array_equal(result.labels, drawn.labels)
        assert result.objective == pytest.approx(drawn.objective, rel=1e-6)
        assert result.method_params["n_landmarks"] == 40
    result = kkmgpu.fit(X, 3, method="approx", landmarks=np.arange(50), random_state=0, device=device)
    np.testing.assert_array_equal(result._approx_state.index, np.arange(50))


@pytest.mark.parametrize("landmarks, extra, message", [
    (np.arange(2), {}, r"gives 2 landmarks; at least k=3"),
    (np.arange(50).reshape(5, 10), {}, r"1-D array of sample indices; got 2 dimension"),
    (np.array([0, 4, 4, 7]), {}, r"index 4 more than once"),
    (np.array([1, 2, 300]), {}, r"index 300, outside \[0, 300\)"),
    ([3, -1, 5], {}, r"index -1, outside \[0, 300\)"),
    (np.arange(50.0), {}, r"integer sample indices; got dtype float64"),
    (np.zeros(300, dtype=bool), {}, r"boolean mask"),
    (7, {}, r"landmarks=7 must be 'uniform', 'kmeans\+\+' or a 1-D array"),
    ("kmeans", {}, r"landmarks='kmeans' is not one of 'uniform', 'kmeans\+\+'"),
    (np.arange(10), dict(n_landmarks=12), r"n_landmarks=12 differs from the 10 indices"),
    (np.arange(10), dict(method="exact"), r"landmarks=<array of shape \(10,\).* only applies to method='approx'"),
])
def test_wrong_landmarks_name_the_rule(landmarks, extra, message):
    X, _ = blobs(300, 3, 3, seed=65)
    kwargs = dict(dict(method="approx"), **extra)
    with pytest.raises(ValueError, match=message):
        kkmgpu.fit(X, 3, landmarks=landmarks, random_state=0, device="cpu", **kwargs)


@pytest.mark.parametrize("method", ["approx", "exact"])
def test_a_precomputed_K_at_extreme_scales_clusters_as_K(device, method):
    """K * 1e-45 in float32 is subnormal (a few multiples of 1.4e-45): it gave ARI 0.35-0.85 silently. The fit
    brings K's values into range by a power of two (exact; the objective back in K's units), in the code every
    method shares: the labels of K itself at 1e-45, 1e+45 and 1e-300, in float32 and float64 storage; a K that
    arrives already subnormal is refused."""
    rng = np.random.default_rng(66)
    X = rng.normal(size=(150, 4))
    X[:75] += 1.0
    K = kernel_matrix(X, kernel="rbf", gamma=0.1)
    kwargs = dict(kernel="precomputed", method=method, random_state=0, device=device,
                  **(dict(n_landmarks=40) if method == "approx" else {}))
    for dtype in ("float32", "float64"):
        ref = kkmgpu.fit(K, 4, dtype=dtype, **kwargs)
        for scale in (1e-45, 1e45, 1e-300):
            result = kkmgpu.fit(K * scale, 4, dtype=dtype, **kwargs)
            np.testing.assert_array_equal(result.labels, ref.labels, err_msg=f"{dtype} K * {scale:g}")
            assert result.objective == pytest.approx(ref.objective * scale, rel=1e-5)
    with pytest.raises(ValueError, match=r"largest \|value\| is 1.4e-45, below float32's smallest normal number"):
        kkmgpu.fit((K * 1e-45).astype(np.float32), 4, **kwargs)
