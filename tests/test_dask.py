"""kkmgpu.dask on a real LocalCluster (2 worker processes, 1 thread each): the same labels as kkmgpu.fit
on one device from the same initial labels, for the exact (tiled) engine and for CATS."""

import subprocess
import sys

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import kkmgpu  # noqa: E402
import kkmgpu.dask  # noqa: E402
import reference  # noqa: E402
from conftest import cuda_skip_reason  # noqa: E402

ONE_THREAD = {name: "1" for name in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  env=ONE_THREAD) as cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(2)
        yield client


def _blobs(seed, n=437, d=5, k=3):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=3.0, size=(k, d))
    return centres[rng.integers(0, k, n)] + rng.normal(size=(n, d)), rng


def test_import_kkmgpu_does_not_import_dask():
    code = "import kkmgpu, sys; assert not any(m == 'dask' or m.startswith('dask.') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("kernel,params", [
    ("rbf", dict(gamma=0.1)),
    ("polynomial", dict(gamma=0.2, degree=2, coef0=1.0)),
    ("laplacian", dict(gamma=0.3)),
    ("sigmoid", dict(gamma=0.05, coef0=0.3)),
    ("linear", {}),
    (lambda A, B: (A @ B.T / 5.0 + 1.0) ** 2, {}),  # a callable (pickled by value to the workers)
])
def test_exact_same_labels_as_single_device(client, kernel, params):
    X, rng = _blobs(1)
    init = rng.integers(0, 3, X.shape[0])
    w = rng.uniform(0.5, 2.0, X.shape[0])
    w[:7] = 0.0
    kw = dict(kernel=kernel, dtype="float64", device="cpu", init=init, sample_weight=w, tol=0.0, **params)
    single = kkmgpu.fit(X, 3, **kw)
    dist = kkmgpu.dask.fit(da.from_array(X, chunks=(70, 2)), 3, client=client, **kw)  # 437 rows, 70-row chunks
    np.testing.assert_array_equal(dist.labels, single.labels)
    assert dist.n_iter == single.n_iter > 1
    np.testing.assert_allclose(dist.objective_history, single.objective_history, rtol=1e-9)
    np.testing.assert_allclose(dist.cluster_sizes, single.cluster_sizes, rtol=1e-12)
    assert dist.method_params["n_workers"] == 2 and dist.method_params["row_bounds"] == [0, 218, 437]
    # the objective is the kernel k-means objective of the labels (independent float64 reference)
    if not callable(kernel):
        K = reference.kernel_matrix(X, kernel=kernel, params=dict(params, **({"degree": 2} if kernel == "polynomial"
                                                                              else {})))
        np.testing.assert_allclose(dist.objective, reference.kernel_kmeans_objective(K, dist.labels, w, 3), rtol=1e-9)


@pytest.mark.parametrize("update", ["incremental", "full"])
def test_exact_kmeans_plus_plus_and_restarts_match(client, update):
    X, _ = _blobs(2, n=300, k=4)
    kw = dict(gamma=0.1, dtype="float64", device="cpu", init="k-means++", n_init=3, random_state=7, update=update)
    single = kkmgpu.fit(X, 4, **kw)
    dist = kkmgpu.dask.fit(da.from_array(X, chunks=100), 4, client=client, tile_rows=33, **kw)
    # every restart (same k-means++ seeds from the same random stream) ends at the same objective
    np.testing.assert_allclose(dist.objectives, single.objectives, rtol=1e-9)
    # restarts that end in the same partition under permuted labels tie up to rounding, so the kept one
    # may differ: compare partitions, not label values
    pairs = set(zip(dist.labels.tolist(), single.labels.tolist()))
    assert len(pairs) == len(set(single.labels.tolist())) == 4


def test_default_gamma_and_float32_close_to_single_device(client):
    X, rng = _blobs(3)
    init = rng.integers(0, 3, X.shape[0])
    single = kkmgpu.fit(X, 3, init=init, device="cpu", engine="tiled")
    dist = kkmgpu.dask.fit(da.from_array(X, chunks=100), 3, init=init, device="cpu", client=client)
    np.testing.assert_allclose(dist.kernel_params["gamma"], single.kernel_params["gamma"], rtol=1e-12)
    assert np.mean(dist.labels == single.labels) >= 0.99
    np.testing.assert_allclose(dist.objective, single.objective, rtol=1e-5)


def test_gemm_precision_reaches_the_workers(client):
    """The mode asked for and the mode the workers ran are recorded; the deprecated tf32=True is gemm_precision='tf32'
    (a FutureWarning), which has no effect on CPU workers (a UserWarning) and gives the same labels."""
    X, rng = _blobs(5, n=200, d=40)
    init = rng.integers(0, 3, X.shape[0])
    Xd = da.from_array(X, chunks=100)
    plain = kkmgpu.dask.fit(Xd, 3, init=init, device="cpu", client=client, gemm_precision="fp32")
    assert (plain.method_params["gemm_precision"], plain.method_params["gemm_mode"]) == ("fp32", "fp32")
    with pytest.warns(FutureWarning, match="tf32=True is deprecated"), \
            pytest.warns(UserWarning, match="gemm_precision='tf32' has no effect on the workers"):
        alias = kkmgpu.dask.fit(Xd, 3, init=init, device="cpu", client=client, tf32=True)
    assert (alias.method_params["gemm_precision"], alias.method_params["gemm_mode"]) == ("tf32", "fp32")
    np.testing.assert_array_equal(alias.labels, plain.labels)


def test_cats_same_labels_as_single_device(client):
    X, rng = _blobs(4, n=400)
    init = rng.integers(0, 3, X.shape[0])
    kw = dict(method="cats", gamma=0.1, dtype="float64", device="cpu", init=init, random_state=11,
              n_samples_per_cluster=9)
    single = kkmgpu.fit(X, 3, **kw)
    dist = kkmgpu.dask.fit(da.from_array(X, chunks=150), 3, client=client, keep_features=True, **kw)
    np.testing.assert_array_equal(dist.labels, single.labels)
    assert dist.n_iter == single.n_iter
    np.testing.assert_allclose(dist.objective_history, single.objective_history, rtol=1e-9)
    np.testing.assert_array_equal(kkmgpu.predict(dist, X[:50]), kkmgpu.predict(single, X[:50]))


def test_keep_features_allows_predict(client):
    X, rng = _blobs(5, n=240)
    init = rng.integers(0, 3, X.shape[0])
    single = kkmgpu.fit(X, 3, gamma=0.1, dtype="float64", device="cpu", init=init)
    dist = kkmgpu.dask.fit(da.from_array(X, chunks=80), 3, gamma=0.1, dtype="float64", device="cpu", init=init,
                           keep_features=True, client=client)
    X_new = rng.normal(scale=3.0, size=(60, 5))
    np.testing.assert_array_equal(kkmgpu.predict(dist, X_new), kkmgpu.predict(single, X_new))


@pytest.mark.parametrize("method", ["exact", "cats"])
def test_predict_without_kept_features_is_a_clear_error(client, method):
    X, _ = _blobs(5, n=120)
    dist = kkmgpu.dask.fit(da.from_array(X, chunks=60), 3, gamma=0.1, device="cpu", method=method, random_state=0,
                           client=client)
    with pytest.raises(ValueError, match=r"kkmgpu.dask.fit.*keep_features=True"):
        kkmgpu.predict(dist, X[:5])


def test_non_symmetric_callable_is_rejected(client):
    X = da.from_array(np.random.default_rng(6).normal(size=(40, 3)), chunks=20)
    with pytest.raises(ValueError, match=r"kernel callable.*not a symmetric kernel matrix"):
        kkmgpu.dask.fit(X, 2, kernel=lambda A, B: A @ (B + 1.0).T, device="cpu", client=client)


@pytest.mark.parametrize("X,kwargs,error,match", [
    (np.zeros((10, 2)), {}, TypeError, r"must be a dask.array.Array"),
    (None, dict(kernel="precomputed"), ValueError, r"kernel='precomputed' is not supported"),
    (None, dict(method="eigen"), ValueError, r"method='eigen' is not available in kkmgpu.dask"),
    (None, dict(device="cuda:1"), ValueError, r"device='cuda:1' is not valid"),
    (None, dict(tf32="yes"), TypeError, r"tf32='yes' must be True or False"),
    (None, dict(gemm_precision="bf16"), ValueError, r"gemm_precision='bf16' is not one of 'fp32', '3xtf32', 'tf32'"),
])
def test_validation(client, X, kwargs, error, match):
    if X is None:
        X = da.from_array(np.random.default_rng(6).normal(size=(20, 3)), chunks=10)
    with pytest.raises(error, match=match):
        kkmgpu.dask.fit(X, 2, client=client, **kwargs)


def test_nan_is_rejected(client):
    X = np.random.default_rng(8).normal(size=(20, 3))
    X[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN or infinity"):
        kkmgpu.dask.fit(da.from_array(X, chunks=10), 2, client=client)


def test_a_cluster_without_workers_is_a_clear_error():
    with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        X = da.from_array(np.random.default_rng(9).normal(size=(20, 3)), chunks=10)
        with pytest.raises(RuntimeError, match="has no workers"):
            kkmgpu.dask.fit(X, 2, device="cpu", client=client)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,params", [("rbf", dict(gamma=0.1)),
                                           ("polynomial", dict(gamma=0.2, degree=2, coef0=1.0))])
def test_cupy_chunks_on_gpu_workers_same_labels_as_single_gpu(kernel, params):
    """CuPy chunks (as dask-cuda users have them), GPU workers (two threads sharing device 0): the labels of
    kkmgpu.fit on the GPU from the same initial labels, and the objective of the float64 reference."""
    reason = cuda_skip_reason()
    if reason:
        pytest.skip(reason)
    import cupy

    X, rng = _blobs(10, n=530)
    init = rng.integers(0, 3, X.shape[0])
    kw = dict(kernel=kernel, dtype="float64", device="cuda", init=init, tol=0.0, **params)
    single = kkmgpu.fit(X, 3, engine="tiled", **kw)
    Xc = da.from_array(X, chunks=(100, -1)).map_blocks(cupy.asarray)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=":0") as cluster, distributed.Client(cluster) as client:
        dist = kkmgpu.dask.fit(Xc, 3, client=client, **kw)
    assert dist.device.startswith("cuda")
    np.testing.assert_array_equal(dist.labels, single.labels)
    np.testing.assert_allclose(dist.objective_history, single.objective_history, rtol=1e-9)
    K = reference.kernel_matrix(X, kernel=kernel, params=params)
    np.testing.assert_allclose(dist.objective, reference.kernel_kmeans_objective(K, dist.labels, np.ones(530), 3),
                               rtol=1e-9)


@pytest.mark.parametrize("method", ["exact", "cats"])
@pytest.mark.parametrize("kernel", ["rbf", "linear"])
@pytest.mark.parametrize("scale", [1e20, 1e-30])
def test_overflowing_and_tiny_scales_as_single_device(client, method, kernel, scale):
    """X * 1e20 (its squared norms overflow float32) and X * 1e-30 (they underflow) give kkmgpu.fit's finite
    result: the Dask path takes the same centre and power-of-two scales from statistics over the chunks."""
    X, rng = _blobs(3)
    init = rng.integers(0, 3, X.shape[0])
    kw = dict(kernel=kernel, method=method, device="cpu", init=init, random_state=0, max_iter=50)
    single = kkmgpu.fit(X * scale, 3, **kw)
    dist = kkmgpu.dask.fit(da.from_array(X * scale, chunks=(150, 5)), 3, client=client, **kw)
    np.testing.assert_array_equal(dist.labels, single.labels)
    assert np.isfinite(dist.objective) and dist.objective > 0
    assert dist.objective == pytest.approx(single.objective, rel=1e-4)
    unscaled = kkmgpu.fit(X, 3, **kw)  # and, for these kernels, the labels of the unscaled data
    np.testing.assert_array_equal(dist.labels, unscaled.labels)


def test_weights_scale_free(client):
    X, rng = _blobs(4)
    init = rng.integers(0, 3, X.shape[0])
    kw = dict(device="cpu", init=init, dtype="float64")
    ones = kkmgpu.dask.fit(da.from_array(X, chunks=(150, 5)), 3, client=client, **kw)
    for w in (1e38, 1e-50):
        dist = kkmgpu.dask.fit(da.from_array(X, chunks=(150, 5)), 3, client=client, sample_weight=np.full(len(X), w),
                               **kw)
        np.testing.assert_array_equal(dist.labels, ones.labels)
        assert dist.objective == pytest.approx(ones.objective * w, rel=1e-9)
        np.testing.assert_allclose(dist.cluster_sizes, ones.cluster_sizes * w, rtol=1e-12)
