"""The CuPy stand-in's own tests (tests/standin): it must be as strict as CuPy where kkmgpu could trip.

They run in every suite, with or without the emulation switch: the ``standin`` fixture imports a fresh copy of
the stand-in as ``cupy`` / ``cupyx`` for the duration of one test and then puts back whatever was there (nothing
in a plain run, the session's stand-in in an emulated one), so that no other test sees it.
"""

import importlib
import pickle
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sps

STANDIN_DIR = Path(__file__).resolve().parent / "standin"


def _is_cupy_module(name: str) -> bool:
    return name in ("cupy", "cupyx") or name.startswith(("cupy.", "cupyx."))


@pytest.fixture
def standin(monkeypatch):
    """A fresh stand-in: namespace with ``cp`` (cupy), ``cupyx``, ``sparse`` (cupyx.scipy.sparse) and ``eigsh``."""
    saved = {name: mod for name, mod in sys.modules.items() if _is_cupy_module(name)}
    for name in saved:
        del sys.modules[name]
    monkeypatch.syspath_prepend(str(STANDIN_DIR))
    backend = sys.modules.get("kkmgpu.backend.device")
    try:
        cp = importlib.import_module("cupy")
        assert cp.__file__.startswith(str(STANDIN_DIR)), cp.__file__
        ns = types.SimpleNamespace(cp=cp, cupyx=importlib.import_module("cupyx"),
                                   sparse=importlib.import_module("cupyx.scipy.sparse"),
                                   eigsh=importlib.import_module("cupyx.scipy.sparse.linalg").eigsh)
        yield ns
    finally:
        for name in [n for n in sys.modules if _is_cupy_module(n)]:
            del sys.modules[name]
        sys.modules.update(saved)
        if backend is not None:
            backend.cuda_unavailable_reason.cache_clear()


# ------------------------------------------------------------------------------------- strictness

def test_device_arrays_do_not_convert_to_numpy_implicitly(standin):
    cp = standin.cp
    d = cp.arange(6.0).reshape(2, 3)
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        np.asarray(d)
    with pytest.raises(TypeError):
        np.array([d, d])
    with pytest.raises(TypeError):
        memoryview(d)
    for name in ("__array_interface__", "__array_struct__", "ctypes"):
        assert not hasattr(d, name), name
    np.testing.assert_array_equal(d.get(), np.arange(6.0).reshape(2, 3))
    assert isinstance(cp.asnumpy(d), np.ndarray)
    assert isinstance(d.get(), np.ndarray) and not isinstance(d, np.ndarray)


def test_host_arrays_are_refused_by_operators_ufuncs_and_functions(standin):
    cp = standin.cp
    d, h = cp.ones(3), np.ones(3)
    for mix in (lambda: d + h, lambda: h + d, lambda: d * h, lambda: d @ h, lambda: cp.maximum(d, h),
                lambda: np.maximum(h, d), lambda: cp.concatenate([d, h]), lambda: np.concatenate([d, h]),
                lambda: cp.where(d > 0, h, d), lambda: cp.sum(h), lambda: cp.ascontiguousarray(h),
                lambda: cp.linalg.norm(h), lambda: d.dot(h)):
        with pytest.raises(TypeError, match="Unsupported type|Only cupy arrays|incorrect type"):
            mix()
    d += 1  # in place with a Python scalar is fine
    np.testing.assert_array_equal((d * np.float64(2.0)).get(), [4.0, 4.0, 4.0])


def test_asarray_copies_host_data_and_keeps_device_arrays(standin):
    cp = standin.cp
    h = np.arange(4.0)
    d = cp.asarray(h)
    h[0] = 99.0
    assert float(d[0]) == 0.0  # a device array never aliases host memory
    assert cp.asarray(d) is d and cp.asarray(d, dtype=d.dtype) is d
    assert d.astype(d.dtype, copy=False) is d
    g = d.get()
    g[1] = -1.0
    assert float(d[1]) == 1.0
    stacked = cp.asarray([d, d])  # CuPy concatenates a sequence of same-shaped device arrays
    assert stacked.shape == (2, 4) and isinstance(stacked, cp.ndarray)
    with pytest.raises(TypeError, match="Implicit conversion"):
        cp.asarray([d, h])
    with pytest.raises(TypeError, match="Implicit conversion"):
        cp.array([d[0], 1.0])


def test_reductions_and_element_access_give_0d_device_arrays(standin):
    cp = standin.cp
    d = cp.arange(12.0).reshape(3, 4)
    for value in (d.sum(), d.max(), cp.max(d), np.sum(d), d[1, 2], cp.argmax(d), cp.count_nonzero(d),
                  cp.allclose(d, d), cp.linalg.norm(d), cp.dot(d[0], d[1]), d[0] @ d[1], cp.matmul(d[0], d[1])):
        assert isinstance(value, cp.ndarray) and value.shape == (), type(value)
    assert float(d.sum()) == 66.0 and int(cp.argmax(d)) == 11 and bool(cp.allclose(d, d))
    assert f"{d.mean():.2f}" == "5.50"
    assert [int(x) for x in cp.arange(3)] == [0, 1, 2]
    with pytest.raises(TypeError, match="0-d"):
        iter(d.sum())


def test_assignment_follows_cupy_for_host_values(standin):
    cp = standin.cp
    d = cp.zeros((3, 2))
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray cannot be used for fill"):
        d[:] = np.ones((3, 2))
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray cannot be used for copyto"):
        cp.copyto(d, np.ones((3, 2)))
    d[:] = np.float64(2.0)
    d[np.array([0, 2])] = np.array([[1.0, 1.0], [3.0, 3.0]])  # advanced indexing copies the value (CuPy too)
    d[cp.asarray([1])] = cp.asarray([[5.0, 6.0]])
    np.testing.assert_array_equal(d.get(), [[1, 1], [5, 6], [3, 3]])
    assert d[np.array([0, 1])].shape == (2, 2) and d[[0, 1]].shape == (2, 2)


def test_sorts_are_stable_and_take_no_other_kind(standin):
    cp = standin.cp
    keys = cp.asarray([1, 0, 1, 0, 1, 0] * 50)
    order = cp.argsort(keys).get()
    np.testing.assert_array_equal(order, np.argsort(keys.get(), kind="stable"))
    for call in (lambda: cp.argsort(keys, kind="quicksort"), lambda: cp.sort(keys, kind="heapsort"),
                 lambda: keys.argsort(kind="mergesort")):
        with pytest.raises(ValueError, match="stable"):
            call()


def test_what_cupy_lacks_or_does_differently_is_refused(standin):
    cp = standin.cp
    d = cp.ones(3)
    for name in ("acos", "astype", "concat", "loadtxt", "errstate", "matrix", "random"):
        with pytest.raises(AttributeError):
            getattr(cp, name)
    with pytest.raises(AttributeError):
        cp.linalg.eig
    with pytest.raises(TypeError, match="casting is not supported"):
        d.astype(np.float32, casting="unsafe")
    with pytest.raises(TypeError, match="device scalar"):
        cp.arange(cp.asarray(3))
    with pytest.raises(AttributeError):
        d.flat
    with pytest.raises(ValueError, match="Unsupported dtype"):
        cp.asarray(np.array(["a", "b"]))
    # CuPy takes no Python sequences outside its constructors, and a device scalar is no index (cupy/cupy#9109)
    with pytest.raises(TypeError, match="Python list"):
        cp.min([1, 2, 3])
    with pytest.raises(TypeError, match="Python tuple"):
        cp.cumsum((1.0, 2.0))
    with pytest.raises(TypeError):
        range(cp.asarray(3))
    with pytest.raises(TypeError):
        [0, 1, 2][cp.asarray(1)]
    assert int(cp.min(cp.asarray([3, 1, 2]))) == 1 and cp.concatenate([d, d]).shape == (6,)
    assert cp.take(d, cp.asarray([0, 2])).shape == (2,) and cp.zeros((2, 3)).shape == (2, 3)


def test_pickle_and_copy_go_through_the_host(standin):
    cp = standin.cp
    d = cp.arange(5.0)
    back = pickle.loads(pickle.dumps(d))
    assert isinstance(back, cp.ndarray)
    np.testing.assert_array_equal(back.get(), d.get())
    import copy
    c = copy.deepcopy(d)
    c[0] = 7.0
    assert float(d[0]) == 0.0


def test_get_array_module_device_and_streams(standin):
    cp = standin.cp
    assert cp.get_array_module(cp.ones(1)) is cp and cp.get_array_module(np.ones(1)) is np
    assert cp.cuda.runtime.getDeviceCount() == 1 and cp.cuda.Device().id == 0
    with cp.cuda.Device(0) as dev:
        assert dev.mem_info == cp.cuda.runtime.memGetInfo()
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="invalid device ordinal"):
        cp.cuda.Device(1)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    with cp.cuda.Stream(non_blocking=True) as s:
        assert cp.cuda.get_current_stream() is s
        end.record(s)
    s.synchronize()
    assert cp.cuda.get_elapsed_time(start, end) >= 0.0
    assert cp.ones(2).device == cp.cuda.Device(0)


# ---------------------------------------------------------------------------------- device memory

def test_memory_accounting_and_out_of_memory(standin):
    cp = standin.cp
    pool = cp.get_default_memory_pool()
    mib = 2**20
    with cp.cuda.standin_device_memory(4 * mib):
        base_free, total = cp.cuda.runtime.memGetInfo()
        assert total == 4 * mib
        a = cp.zeros(mib // 8)  # 1 MiB
        free, _ = cp.cuda.runtime.memGetInfo()
        assert base_free - free == mib and pool.used_bytes() >= mib
        view = a[10:20].reshape(2, 5)  # views take nothing more
        assert cp.cuda.runtime.memGetInfo()[0] == free and view.base is not None
        with pytest.raises(cp.cuda.memory.OutOfMemoryError, match=r"Out of memory allocating 4,194,304 bytes"):
            cp.empty(mib // 2)  # 4 MiB more does not fit
        with pytest.raises(MemoryError):  # the subclass CuPy raises
            a.astype(np.complex128) + cp.ones(mib // 8)
        del a, view
        # freed blocks stay in the pool: memGetInfo counts them as taken, the pool as free
        free_after, _ = cp.cuda.runtime.memGetInfo()
        assert pool.free_bytes() >= mib and free_after + pool.free_bytes() >= base_free
        pool.free_all_blocks()
        assert cp.cuda.runtime.memGetInfo()[0] >= base_free
        assert cp.cuda.Device().mem_info == cp.cuda.runtime.memGetInfo()
        pool.set_limit(size=mib)
        try:
            with pytest.raises(cp.cuda.memory.OutOfMemoryError, match="limit set to: 1,048,576 bytes"):
                cp.ones(mib // 4)
        finally:
            pool.set_limit(size=0)
    assert cp.cuda.runtime.memGetInfo()[1] == 16 * 2**30  # the default, back after the context
    pool.standin_peak_bytes(reset=True)
    start = pool.used_bytes()
    tmp = cp.ones(mib // 8) * 2.0  # two 1 MiB buffers at once
    del tmp
    assert pool.standin_peak_bytes() - start == 2 * mib and pool.used_bytes() == start


def test_device_memory_from_the_environment(standin, monkeypatch):
    monkeypatch.setenv("KKMGPU_STANDIN_DEVICE_MEMORY", str(3 * 2**20))
    for name in [n for n in sys.modules if _is_cupy_module(n)]:
        del sys.modules[name]
    cp = importlib.import_module("cupy")
    assert cp.cuda.runtime.memGetInfo()[1] == 3 * 2**20
    with pytest.raises(cp.cuda.memory.OutOfMemoryError):
        cp.zeros((1024, 1024))


def test_sparse_matrices_are_charged_to_the_device(standin):
    cp, sparse = standin.cp, standin.sparse
    pool = cp.get_default_memory_pool()
    before = pool.used_bytes()
    K = sparse.csr_matrix(sps.random(200, 200, density=0.5, random_state=0, format="csr"))
    assert pool.used_bytes() - before >= K.nnz * (8 + 4)


# ------------------------------------------------------------------------------------------ linalg

def test_eigh_of_a_stack_is_limited_to_32_by_32_as_cusolver_batched_jacobi(standin):
    cp = standin.cp
    rng = np.random.default_rng(0)
    for n in (32, 33):
        A = rng.normal(size=(4, n, n))
        A = A + A.transpose(0, 2, 1)
        if n <= 32:
            w, V = cp.linalg.eigh(cp.asarray(A))
            np.testing.assert_allclose(w.get(), np.linalg.eigvalsh(A), atol=1e-10)
            assert w.shape == (4, n) and V.shape == (4, n, n)
        else:
            with pytest.raises(cp.cuda.cusolver.CUSOLVERError, match="CUSOLVER_STATUS_INVALID_VALUE"):
                cp.linalg.eigh(cp.asarray(A))
            with pytest.raises(cp.cuda.cusolver.CUSOLVERError):
                cp.linalg.eigvalsh(cp.asarray(A))
            w, _ = cp.linalg.eigh(cp.asarray(A[0]))  # one matrix (syevd): any size
            np.testing.assert_allclose(w.get(), np.linalg.eigvalsh(A[0]), atol=1e-10)
    assert cp.linalg.eigh(cp.asarray(np.eye(3, dtype=np.float32)))[0].dtype == np.float32


def test_tf32_compute_type_rounds_float32_products(standin):
    cp = standin.cp
    from cupy._core import _routines_linalg as rl

    rng = np.random.default_rng(1)
    a = rng.normal(size=(64, 128)).astype(np.float32)
    b = rng.normal(size=(128, 32)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    plain = (cp.asarray(a) @ cp.asarray(b)).get()
    previous = rl.get_compute_type(np.float32)
    rl.set_compute_type(np.float32, rl.COMPUTE_TYPE_TF32)
    try:
        results = [(cp.asarray(a) @ cp.asarray(b)).get(), cp.matmul(cp.asarray(a), cp.asarray(b)).get(),
                   cp.dot(cp.asarray(a), cp.asarray(b)).get(), cp.einsum("ij,jk->ik", cp.asarray(a),
                                                                         cp.asarray(b)).get()]
        as64 = (cp.asarray(a, dtype=np.float64) @ cp.asarray(b, dtype=np.float64)).get()
    finally:
        rl.set_compute_type(np.float32, previous)
    np.testing.assert_allclose(as64, exact, rtol=1e-12)  # float64 is not affected
    plain_err = np.max(np.abs(plain - exact) / scale)
    for tf32 in results:
        err = np.max(np.abs(tf32 - exact) / scale)
        assert err < 2.0**-10 and err > 20 * plain_err, (err, plain_err)
    rounded = rl.tf32_round(np.float32([1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, np.inf]))
    np.testing.assert_array_equal(rounded, np.float32([1.0, 1.0 + 2.0**-9, np.inf]))  # ties to even


def test_kkmgpu_gemm_precision_switches_the_standin(standin):
    from kkmgpu.backend.device import Backend
    from kkmgpu.kernels.gemm import compute_type
    cp = standin.cp
    from cupy._core import _routines_linalg as rl

    before = rl.get_compute_type(np.float32)
    for mode in ("tf32", "3xtf32"):
        with compute_type(Backend("cuda", 0), mode):
            assert rl.get_compute_type(np.float32) == rl.COMPUTE_TYPE_TF32
    with compute_type(Backend("cuda", 0), "fp32"):
        assert rl.get_compute_type(np.float32) == before
    assert rl.get_compute_type(np.float32) == before
    assert cp.__file__.startswith(str(STANDIN_DIR))


# ------------------------------------------------------------------------------------------ sparse

def test_sparse_round_trip_products_and_methods(standin):
    cp, sparse = standin.cp, standin.sparse
    A = sps.random(40, 40, density=0.2, random_state=3, format="csr")
    A = (A + A.T).tocsr()
    K = sparse.csr_matrix(A)
    assert sparse.issparse(K) and not sparse.issparse(A) and sparse.isspmatrix_csr(K)
    for arr in (K.data, K.indices, K.indptr):
        assert isinstance(arr, cp.ndarray)
    assert K.indices.dtype == np.int32 and K.indptr.dtype == np.int32
    host = K.get()
    assert sps.issparse(host) and (host != A).nnz == 0
    Y = np.random.default_rng(0).normal(size=(40, 3))
    S = K @ cp.asarray(Y)
    assert isinstance(S, cp.ndarray)
    np.testing.assert_allclose(S.get(), A @ Y, rtol=1e-12)
    rows = cp.asarray([3, 1, 7])
    np.testing.assert_allclose((K[rows].T @ cp.asarray(Y[:3])).get(), A[[3, 1, 7]].T @ Y[:3], rtol=1e-12)
    assert isinstance(K.T, sparse.csc_matrix)
    assert (K - K.T.tocsr()).nnz == 0
    top = abs(K).max()
    assert isinstance(top, cp.ndarray) and top.shape == () and float(top) == abs(A).max()
    np.testing.assert_allclose(K.diagonal().get(), A.diagonal())
    np.testing.assert_allclose(K.maximum(K * 2.0).toarray().get(), A.maximum(A * 2.0).toarray())
    assert isinstance(K.sum(axis=1), cp.ndarray) and K.sum(axis=1).shape == (40, 1)
    K2 = K.copy()
    K2.data[:] = 0.0
    K2.eliminate_zeros()
    assert K2.nnz == 0 and K.nnz == A.nnz
    assert isinstance(cp.asarray(K @ cp.ones((40, 2))), cp.ndarray)
    coo = sparse.coo_matrix((cp.asarray([1.0, 2.0]), (cp.asarray([0, 1]), cp.asarray([1, 0]))), shape=(2, 2))
    np.testing.assert_array_equal(coo.tocsr().toarray().get(), [[0, 1], [2, 0]])


def test_a_transposed_sparse_product_adds_in_another_order_on_every_call(standin):
    """CSC @ dense (CuPy: cuSPARSE with the transposed CSR operand) equals SciPy's product to rounding but not to
    the bit from call to call, as cuSPARSE documents; CSR @ dense with short rows repeats its bits."""
    import scipy.sparse as sp

    rng = np.random.default_rng(501)
    A = sp.random(300, 40, density=0.1, random_state=502, format="csr")  # the transpose's rows: at most LONG_ROW
    B = rng.normal(size=(300, 3))
    dA, dB = standin.sparse.csr_matrix(A), standin.cp.asarray(B)
    want = A.T @ B
    runs = [(dA.T @ dB).get() for _ in range(4)]
    for run in runs:
        np.testing.assert_allclose(run, want, rtol=1e-12, atol=1e-12)
    assert any(not np.array_equal(run, runs[0]) for run in runs[1:])
    vector = (dA.T @ dB[:, 0]).get()
    np.testing.assert_allclose(vector, want[:, 0], rtol=1e-12, atol=1e-12)
    untransposed = [(dA.T.tocsr() @ dB).get() for _ in range(3)]
    assert all(np.array_equal(run, untransposed[0]) for run in untransposed)


def test_a_product_with_long_csr_rows_adds_in_another_order_on_every_call(standin):
    """CSR @ dense and the row and column sums: rows of at most LONG_ROW entries repeat their bits (an H100 did at
    50), longer ones change on every call (an H100 did at 1,000); the column sums (a transposed product) always."""
    import scipy.sparse as sp

    rng = np.random.default_rng(503)
    short = sp.random(400, 300, density=30 / 300, random_state=504, format="csr")
    long = sp.random(20, 3000, density=0.5, random_state=505, format="csr")
    assert np.diff(short.indptr).max() <= standin.sparse.LONG_ROW < np.diff(long.indptr).min()
    for A, repeats in ((short, True), (long, False)):
        dA = standin.sparse.csr_matrix(A)
        x = standin.cp.asarray(rng.normal(size=A.shape[1]))
        runs = [(dA @ x).get() for _ in range(4)]
        sums = [np.asarray(dA.sum(axis=1).get()).ravel() for _ in range(4)]
        for run in runs:
            np.testing.assert_allclose(run, A @ x.get(), rtol=1e-12, atol=1e-12)
        for total in sums:
            np.testing.assert_allclose(total, np.asarray(A.sum(axis=1)).ravel(), rtol=1e-12, atol=0)
        assert all(np.array_equal(run, runs[0]) for run in runs) == repeats
        assert all(np.array_equal(total, sums[0]) for total in sums) == repeats
    dA = standin.sparse.csr_matrix(short)
    dense = standin.cp.asarray(rng.normal(size=(3, 400)))
    left = [(dense @ dA).get() for _ in range(4)]   # dense @ sparse: CuPy's transposed product
    np.testing.assert_allclose(left[0], dense.get() @ short, rtol=1e-12, atol=1e-12)
    assert any(not np.array_equal(c, left[0]) for c in left[1:])
    columns = [np.asarray(dA.sum(axis=0).get()).ravel() for _ in range(4)]
    np.testing.assert_allclose(columns[0], np.asarray(short.sum(axis=0)).ravel(), rtol=1e-12, atol=0)
    assert any(not np.array_equal(c, columns[0]) for c in columns[1:])


def test_sparse_refuses_host_data_and_integer_values(standin):
    cp, sparse = standin.cp, standin.sparse
    A = sps.random(10, 10, density=0.3, random_state=0, format="csr")
    K = sparse.csr_matrix(A)
    with pytest.raises(ValueError, match="Only bool, float32, float64"):
        sparse.csr_matrix(A.astype(np.int64))
    with pytest.raises(ValueError, match="should be 1-D"):
        sparse.csr_matrix((A.data, A.indices, A.indptr), shape=A.shape)
    with pytest.raises(ValueError, match="Unsupported initializer format"):
        sparse.csr_matrix(A.toarray())
    with pytest.raises(TypeError, match="Unsupported type"):
        K @ np.ones((10, 2))
    with pytest.raises(TypeError, match="Unsupported type"):
        K.maximum(A)
    with pytest.raises(TypeError):
        np.asarray(K)
    with pytest.raises(ValueError, match="Only bool"):
        K.astype(np.int32)
    d = sparse.csr_matrix((cp.asarray(A.data), cp.asarray(A.indices), cp.asarray(A.indptr)), shape=A.shape)
    assert (d.get() != A).nnz == 0


def test_eigsh_matches_numpy_eigh(standin):
    cp, sparse, eigsh = standin.cp, standin.sparse, standin.eigsh
    rng = np.random.default_rng(5)
    X = rng.normal(size=(60, 60))
    A = X @ X.T / 60 - 0.5 * np.eye(60)
    full = np.linalg.eigvalsh(A)
    for which, expected in (("LA", full[-4:]), ("SA", full[:4]),
                            ("LM", np.sort(full[np.argsort(np.abs(full))[-4:]]))):
        for a in (cp.asarray(A), sparse.csr_matrix(sps.csr_matrix(A))):
            w, V = eigsh(a, k=4, which=which, v0=cp.asarray(rng.uniform(-1, 1, 60)))
            assert isinstance(w, cp.ndarray) and isinstance(V, cp.ndarray) and V.shape == (60, 4)
            np.testing.assert_allclose(w.get(), expected, atol=1e-9)
            np.testing.assert_allclose((cp.asarray(A) @ V - V * w[None, :]).get(), 0, atol=1e-7)
    w = eigsh(cp.asarray(A.astype(np.float32)), k=2, which="LA", return_eigenvectors=False)
    assert w.dtype == np.float32
    for bad, error in ((dict(k=60), ValueError), (dict(k=0), ValueError), (dict(which="SM"), ValueError),
                       (dict(v0=np.ones(60)), TypeError)):
        with pytest.raises(error):
            eigsh(cp.asarray(A), **{"k": 2, **bad})
    with pytest.raises(TypeError):
        eigsh(A, k=2)


def test_scatter_add_accumulates_repeated_indices(standin):
    cp, cupyx = standin.cp, standin.cupyx
    out = cp.zeros((2, 4))
    labels = cp.asarray([0, 2, 2, 3, 0])
    cupyx.scatter_add(out[0], labels, cp.asarray([1.0, 2.0, 3.0, 4.0, 5.0]))
    cupyx.scatter_add(out[1], labels, 1.0)
    np.testing.assert_array_equal(out.get(), [[6, 0, 5, 4], [2, 0, 2, 1]])
    with pytest.raises(TypeError, match="scatter_add only supports"):
        cupyx.scatter_add(cp.zeros(4, dtype=np.int64), labels, 1)
    with pytest.raises(TypeError, match="Unsupported type"):
        cupyx.scatter_add(np.zeros(4), labels, 1.0)


# ------------------------------------------------------------------------------------------ kernels

_KERNEL = r"""
extern "C" __global__ void axpy(const double* x, double* y, long long n, double a) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA-on-CPU harness needs g++")
def test_raw_module_launches_through_the_harness_and_refuses_host_arguments(standin):
    cp = standin.cp
    kernel = cp.RawModule(code=_KERNEL, options=("-std=c++14",)).get_function("axpy")
    x, y = cp.arange(300.0), cp.ones(300)
    kernel((2,), (256,), (x, y, np.int64(300), np.float64(2.0)))
    np.testing.assert_array_equal(y.get(), 1.0 + 2.0 * np.arange(300.0))
    with pytest.raises(TypeError, match="Unsupported type <class 'numpy.ndarray'>"):
        kernel((2,), (256,), (x.get(), y, np.int64(300), np.float64(2.0)))
    with pytest.raises(TypeError, match="Python int"):
        kernel((2,), (256,), (x, y, 300, np.float64(2.0)))
    with pytest.raises(cp.cuda.driver.CUDADriverError, match="CUDA_ERROR_INVALID_VALUE"):
        kernel((2,), (2048,), (x, y, np.int64(300), np.float64(2.0)))
    with pytest.raises(cp.cuda.driver.CUDADriverError, match="grid"):
        kernel((1, 70000), (32,), (x, y, np.int64(300), np.float64(2.0)))
    with pytest.raises(cp.cuda.driver.CUDADriverError, match="shared_mem"):
        kernel((1,), (32,), (x, y, np.int64(300), np.float64(2.0)), shared_mem=64 * 1024)
    raw = cp.RawKernel(_KERNEL, "axpy")
    raw((1,), (300,), (x, y, np.int64(300), np.float64(-2.0)))
    np.testing.assert_array_equal(y.get(), np.ones(300))


# ------------------------------------------------------------------------------------------ cost ledger

def test_ledger_counts_launches_device_bytes_and_gemm_flops(standin):
    cp = standin.cp
    rng = np.random.default_rng(11)
    m, k, n = 7, 5, 3
    A_h, B_h = rng.random((m, k), dtype=np.float32), rng.random((n, k), dtype=np.float32)
    with cp.cuda.standin_ledger() as led:
        A, B = cp.asarray(A_h), cp.asarray(B_h)
    assert (led.counts.launches, led.counts.syncs, led.counts.h2d_copies, led.counts.h2d_bytes) == \
        (0, 0, 2, A_h.nbytes + B_h.nbytes)
    with cp.cuda.standin_ledger() as led:
        A[1:], A.T, A.reshape(-1), A[2], A.ravel(), cp.empty((4, 4))  # views and allocations: no kernel
    assert led.counts == cp._ledger.Counts()
    with cp.cuda.standin_ledger() as led:
        C = A @ B.T
    assert (led.counts.launches, led.counts.flops) == (1, {"fp32": 2 * m * n * k})
    assert (led.counts.read_bytes, led.counts.written_bytes) == (A.nbytes + B.nbytes, C.nbytes)
    from cupy._core import _routines_linalg as rl
    previous = rl.get_compute_type(np.float32)
    rl.set_compute_type(np.float32, rl.COMPUTE_TYPE_TF32)
    try:
        with cp.cuda.standin_ledger() as led:
            cp.matmul(A, B.T)
            cp.einsum("ik,jk->ij", A.astype(np.float64), B.astype(np.float64))
    finally:
        rl.set_compute_type(np.float32, previous)
    assert led.counts.flops == {"tf32": 2 * m * n * k, "fp64": 2 * m * n * k}
    assert led.launch_names == {"matmul": 1, "einsum": 1, "astype": 2}
    idx = cp.asarray(np.array([4, 0, 4], dtype=np.int64))
    with cp.cuda.standin_ledger() as led:
        D = A + 1.0
        A.sum(axis=1)
        G = A[idx]
        cp.zeros(10)
        D[:, 0] = 0.0
        A.astype(np.float64)
    assert led.counts.launches == 6 and led.counts.syncs == 0
    assert led.launch_names == {"add": 1, "sum": 1, "getitem": 1, "zeros": 1, "setitem": 1, "astype": 1}
    # add reads A, writes D; sum reads A, writes m; the gather reads its rows and index, writes them; zeros and
    # the column fill write; astype reads A and writes twice its bytes
    assert led.counts.read_bytes == A.nbytes + A.nbytes + G.nbytes + idx.nbytes + A.nbytes
    assert led.counts.written_bytes == D.nbytes + 4 * m + G.nbytes + 80 + 4 * m + 2 * A.nbytes


def test_ledger_counts_syncs_transfers_and_where_they_happen(standin):
    cp = standin.cp
    d = cp.asarray(np.arange(12, dtype=np.float64))
    mask = d > 5
    with cp.cuda.standin_ledger() as led:
        d.get()
        cp.asnumpy(d)
        float(d.sum())
        int(d[3])
        bool(d[0] == 0)
        d[2].item()
        d[:4].tolist()
        cp.cuda.Device().synchronize()
    assert led.counts.syncs == 8 and led.counts.launches == 2  # the sum and the comparison
    assert led.counts.d2h_bytes == 2 * d.nbytes + 8 + 8 + 1 + 8 + 32
    assert {kind for kind, _ in led.sync_sites} == {"get", "float", "int", "bool", "item", "tolist", "synchronize"}
    assert all("test_cupy_standin.py" in site for _, site in led.sync_sites)
    with cp.cuda.standin_ledger() as led:
        cp.flatnonzero(mask)        # CuPy counts the nonzeros on the host to size its result
        d[mask]                     # so does a boolean-mask gather
        cp.bincount(cp.asarray(np.array([0, 2, 2], dtype=np.int32)))  # (x < 0).any() and x.max() sync
        d[np.array([1, 2])]         # the host index is copied to the device
    assert led.counts.syncs == 1 + 1 + 2
    assert led.counts.h2d_copies == 2 and led.counts.h2d_bytes == 12 + 16
    assert led.launch_names["flatnonzero"] == 3 and led.launch_names["bincount"] == 5


def test_ledger_marks_phases_and_nested_ledgers(standin):
    cp = standin.cp
    a = cp.ones(8)
    with cp.cuda.standin_ledger() as outer:
        a + 1
        outer.mark("first")
        with cp.cuda.standin_ledger() as inner:
            a * 2
            float(a[0])
        outer.mark("second")
    assert inner.counts.launches == 1 and inner.counts.syncs == 1
    (first, c1), (second, c2) = outer.phases()
    assert (first, second) == ("first", "second")
    assert (c1.launches, c1.syncs, c2.launches, c2.syncs) == (1, 0, 1, 1)
    assert c1 + c2 == outer.counts and (outer.counts - c1) / 1 == c2 and (2 * c2).syncs == 2
    a - 1  # outside every ledger: not counted
    assert outer.counts.launches == 2 and "launches" in outer.report()


_GATHER_KERNEL = r"""
extern "C" __global__ void segment_sums(const float* K, const long long* rows, double* S, long long n, int m) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) for (int p = 0; p < m; ++p) S[i] += K[rows[p] * n + i];
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA-on-CPU harness needs g++")
def test_ledger_counts_raw_kernel_arguments_by_constness_and_row_gathers(standin):
    cp = standin.cp
    x, y = cp.arange(300.0), cp.ones(300)
    axpy = cp.RawModule(code=_KERNEL, options=("-std=c++14",)).get_function("axpy")
    with cp.cuda.standin_ledger() as led:
        axpy((2,), (256,), (x, y, np.int64(300), np.float64(2.0)))
    # x behind a const pointer is read; y is read and written
    assert (led.counts.launches, led.counts.read_bytes, led.counts.written_bytes) == (1, 2 * 2400, 2400)
    n = 64
    K = cp.asarray(np.random.default_rng(0).random((n, n), dtype=np.float32))
    rows, S = cp.asarray(np.array([3, 9, 3], dtype=np.int64)), cp.zeros(n)
    gather = cp.RawKernel(_GATHER_KERNEL, "segment_sums")
    with cp.cuda.standin_ledger() as led:
        gather((1,), (64,), (K, rows, S, np.int64(n), np.int32(3)))
    np.testing.assert_allclose(S.get(), K.get()[[3, 9, 3]].sum(axis=0), rtol=1e-6)
    # segment_sums reads K only at the three listed rows (cupy._ledger.ROW_GATHERS)
    assert led.counts.read_bytes == 3 * n * 4 + rows.nbytes + S.nbytes and led.counts.written_bytes == S.nbytes


def test_standin_does_not_leak_into_other_tests():
    """No stand-in module stays behind the fixture (the emulated run installs its own, which stays)."""
    leaked = [m for name, m in sys.modules.items() if _is_cupy_module(name) and m is not None and
              getattr(m, "__file__", "") and str(STANDIN_DIR) in m.__file__]
    import conftest
    if conftest.GPU_MODE != "standin":
        assert leaked == []
