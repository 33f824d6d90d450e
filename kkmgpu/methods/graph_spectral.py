"""The graph objectives' eigenproblems: the PSD shift and the spectral start (:mod:`kkmgpu.methods.graphcut`).

Every eigensolver here is seeded from the fit's ``random_state``: ARPACK draws a fresh start vector when its Krylov
space breaks down (an invariant subspace, such as that of identical points), and an unseeded draw made the spectral
start, hence the labels, change between calls with the same seed (issue 27). Where the installed SciPy's ``eigsh``
takes no ``rng`` (before 1.15), the spectral start takes LOBPCG instead, whose only random input is its start block.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import time

import numpy as np
from numba import njit

from kkmgpu.backend.device import check_fits, import_cupyx
from kkmgpu.engine import small_kmeans as _small_kmeans
from kkmgpu.engine import sparse as _sparse
from kkmgpu.kernels import sparse_cuda as _products

#: LOBPCG's tolerance and iteration cap for the spectral start
EIGEN_TOL = 1e-5
EIGEN_MAXITER = 500
#: ARPACK's tolerance in the spectral start (CPU): the eigenvectors only seed the k-means of the embedding and the
#: refinements. Against 1e-5 the same NMI on the 12 sets of bench_graphs.py and 53 of the 54 cases of the selection
#: benchmark's tuning half (the 54th 0.8166 against 0.8136), and two moons' start in 0.8 of the time (its top
#: eigenvalues 1, 0.99984, 0.99939, 0.99906 crowd); the graph search's eigenvalues keep EIGEN_TOL
START_ARPACK_TOL = 1e-4
#: the relative objective change at which the spectral start's k-means of the embedding stops
EMBEDDING_TOL = 1e-4


#: graphs up to this many nodes get the PSD shift's smallest eigenvalue from a dense eigvalsh (host, float64)
DENSE_SHIFT = 64
#: Lanczos's tolerance for the shift's eigenvalue: a residual ||N v - theta v|| <= SHIFT_TOL |theta| puts theta within
#: 0.1% of an eigenvalue, inside the shift's 1% margin (and the eigenvalue's error is of the order of the residual
#: squared over the gap: on the 10 small sets of bench_graphs.py it agreed with eigvalsh to 6 digits, as at 1e-6,
#: with 30-45% fewer products: two moons 51 against 81, MNIST-2000 61 against 101)
SHIFT_TOL = 1e-3


def psd_shift(A, d, objective, backend, rng) -> float:
    """The smallest sigma making K positive semi-definite, with a 1% margin (0 when it already is).

    Lanczos (smallest algebraic) above DENSE_SHIFT nodes, a dense eigvalsh up to it on both devices. CuPy's
    thick-restart Lanczos (up to at least 14.2) takes ncv = min(max(2k, k + 32), n - 1) vectors and writes the
    (k + 2)-th at its first restart: with k = 1 it raised IndexError on a 3-node graph on an H100 (2026-11-26),
    and a Krylov space that nearly fills R^n also meets its unguarded breakdown (beta -> 0). A Lanczos eigenvalue
    that comes back non-finite (that breakdown, possible on a graph of few distinct eigenvalues) is recomputed
    densely rather than read as sigma = 0."""
    M = normalized(A, d, backend) if objective == "ncut" else A
    n = A.shape[0]
    if n <= DENSE_SHIFT:
        lam = _smallest_dense(M, backend)
    else:
        v0 = backend.asarray(rng.standard_normal(n))
        restarts = _restart_rng(rng)  # drawn on both devices, so that the draws after it stay the same
        if backend.is_gpu:
            eigsh, seeded = import_cupyx("scipy.sparse.linalg").eigsh, {}
        else:
            from scipy.sparse.linalg import eigsh
            seeded = {"rng": restarts} if _arpack_takes_rng() else {}
        try:
            lam = float(eigsh(_products.operator(M, backend), k=1, which="SA", v0=v0, tol=SHIFT_TOL,
                              return_eigenvectors=False, **seeded)[0])
        except np.linalg.LinAlgError:  # NaN in CuPy's Lanczos tridiagonal (kkmgpu.engine.embedding._lanczos_failed)
            lam = math.nan
        if not math.isfinite(lam):
            lam = _smallest_dense(M, backend)
    return max(0.0, -lam) * 1.01


def _smallest_dense(M, backend) -> float:
    """The smallest eigenvalue of the sparse symmetric M by a dense eigvalsh (on the host for small M)."""
    n = M.shape[0]
    if n <= DENSE_SHIFT or not backend.is_gpu:
        return float(np.linalg.eigvalsh(np.asarray(backend.to_host(M.toarray())))[0])
    check_fits(3 * n * n * 8, backend, f"the dense eigenvalues of the {n} x {n} graph matrix (Lanczos broke down)")
    return float(backend.xp.linalg.eigvalsh(M.toarray())[0])


@contextlib.contextmanager
def one_thread(backend):
    """On the CPU, BLAS (threadpoolctl) and numba on one thread each within the block; a GPU: nothing changes.

    The spectral start's k-means on the (n, k) embedding and the graph kernel's refinements are many short
    products and numba kernels (an iteration is milliseconds at n = 5,000): two threads that meet at a barrier
    on every call lose far more than they share on a machine whose cores are busy. On the 2-core reference machine
    under load (31 Gaussian clusters, 3,100 points) the start took 14.6-18.5 s with two threads each and 1.2 s with
    one; scikit-learn's KMeans limits its BLAS the same way. The cores are used instead by running the start's
    k-means side by side (:func:`_embedding_kmeans`), one thread each, with no barrier between them."""
    if backend.is_gpu:
        yield
        return
    with _blas_controller().limit(limits=1, user_api="blas"), _numba_one_thread():
        yield


#: a CPU neighbour search of n points in d dimensions with n^2 (d + 32) below this runs on one thread
SERIAL_SEARCH = 2 ** 29


def search_threads(shape, backend):
    """:func:`one_thread` for the graph's neighbour search of ``shape`` (n, d) on the CPU where it is small (n^2
    (d + 32) < SERIAL_SEARCH: two moons, digits), else a block that changes nothing. The search's products and
    list passes are then a few milliseconds each, and two threads that meet at a barrier on each lose: 1,000 points
    in 2-D (2-core CPU, load 3.5) took 44 ms with two threads and 16 ms with one; 1,797 x 64 (digits) 70 ms and
    48 ms. The neighbours are the same on any number of threads (exact, ties to the lower index)."""
    n, d = shape
    if backend.is_gpu or float(n) * n * (d + 32) >= SERIAL_SEARCH:
        return contextlib.nullcontext()
    return one_thread(backend)


@contextlib.contextmanager
def _numba_one_thread():
    """numba on one thread in the calling thread (its setting is thread-local; the caller's comes back)."""
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(before)


@functools.lru_cache(maxsize=None)
def _blas_controller():
    """threadpoolctl's view of the loaded thread pools, found once (a scan of the process's libraries: 10 ms)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _restart_rng(rng):
    """The generator of ARPACK's restart vectors, drawn from the fit's ``rng``."""
    return np.random.default_rng(int(rng.integers(2 ** 63)))


def _arpack_takes_rng() -> bool:
    """Whether SciPy's ``eigsh`` seeds its restart vectors from an ``rng`` argument (SciPy 1.15 and later)."""
    from scipy.sparse.linalg import eigsh

    return "rng" in inspect.signature(eigsh).parameters


def diag(values, backend):
    """diag(values) in CSR (built from its arrays: cupyx and SciPy alike)."""
    xp = backend.xp
    n = values.shape[0]
    index = xp.arange(n + 1, dtype=xp.int32)
    return _sparse.sparse_module(backend).csr_matrix((values.astype(xp.float64), index[:n], index), shape=(n, n))


def normalized(A, d, backend):
    """D^-1/2 A D^-1/2 in CSR."""
    s = diag(d ** -0.5, backend)
    return (s @ A @ s).tocsr()



def spectral_embedding(A, d, k, backend, rng, *, tol=EIGEN_TOL, maxiter=EIGEN_MAXITER, bar=None, info=None,
                       arpack_tol=None):
    """(E, eigenvalues, iterations, solver): E = D^-1/2 V (n, k), V the top-k eigenvectors of D^-1/2 A D^-1/2.

    On the CPU by Lanczos (ARPACK's ``eigsh``, largest algebraic, random start vector): for a connected graph on
    the whole of it; for a graph of c components on each component alone (:func:`_top_by_components`: small ones
    densely), the top k of the union taken. A graph of c components has the eigenvalue 1 c times, which a
    single-vector Krylov method on the whole graph cannot be trusted to find more than once; on each component it
    is found once. Otherwise (a GPU, or ARPACK not converging) by LOBPCG (its start block's first column D^1/2 1,
    the known top eigenvector), a block method; CuPy's Lanczos also breaks down on such invariant subspaces
    (:func:`kkmgpu.engine.embedding._lanczos_failed`), so a GPU keeps LOBPCG.
    Both draw the same start block from ``rng``, so the k-means++ seeds after it are the same on both devices.
    On MNIST-70k's 10-neighbour graph (2-core CPU) eigsh takes 1.1 s against LOBPCG's 5.2 s (120 iterations),
    with the same eigenvalues to 8 digits. ``iterations``: LOBPCG's, or ARPACK's matrix-vector products;
    ``solver``: "arpack", "lobpcg" or "dense" (n <= 5 k + 1; on a GPU also n <= DENSE_COMPONENT, after the
    same draws). ``tol``: the solvers' tolerance, ARPACK's ``arpack_tol`` where given. ``bar``: a progress bar whose
    text follows the components solved; ``info``: a dict that receives the number of connected components (where
    they were counted, else 1).
    """
    xp = backend.xp
    n = A.shape[0]
    N = normalized(A, d, backend)
    if n <= 5 * k + 1:  # LOBPCG needs n well above the block size: the dense decomposition
        return _dense_top(N, d, k, backend)
    X0 = rng.standard_normal((n, k))
    restarts = _restart_rng(rng)  # drawn on both devices, so that the k-means++ seeds after it stay the same
    if backend.is_gpu and n <= DENSE_COMPONENT:
        # A GPU's LOBPCG on a graph this small: slower than one dense eigh, and on an H100 (2026-11-26) the
        # eigenvalues of 100 identical points' graph differed between calls with the same seed and the same
        # normalised matrix (1.9e-16 against -1.3e-19); the CPU solves components this small densely too.
        return _dense_top(N, d, k, backend)
    V, solver = None, "arpack"
    if not backend.is_gpu and _arpack_takes_rng():
        arpack_tol = tol if arpack_tol is None else arpack_tol
        count, component = _components(A)
        if info is not None:
            info["components"] = int(count)
        if count == 1:
            w, V, iterations = _arpack_top(N, k, X0[:, 0], tol=arpack_tol, maxiter=maxiter, rng=restarts)
        else:
            w, V, iterations = _top_by_components(N, component, count, k, X0[:, 0], tol=arpack_tol, maxiter=maxiter,
                                                  rng=restarts, bar=bar, d=backend.to_host(d))
    if V is None:   # a GPU, or ARPACK did not converge
        X0[:, 0] = np.sqrt(backend.to_host(d))
        lobpcg = import_cupyx("scipy.sparse.linalg").lobpcg if backend.is_gpu else _scipy_lobpcg()
        w, V, history = lobpcg(_products.operator(N, backend), backend.asarray(X0), largest=True, tol=tol,
                               maxiter=maxiter, retResidualNormsHistory=True)
        w = backend.to_host(xp.asarray(w))
        iterations, solver = len(history), "lobpcg"
    E = V * (d ** -0.5)[:, None]
    return E, np.sort(np.asarray(w, dtype=np.float64))[::-1], iterations, solver


def _dense_top(N, d, k, backend):
    """spectral_embedding's result from numpy's dense eigh of N (on the host, float64)."""
    w, V = np.linalg.eigh(np.asarray(backend.to_host(N.toarray()), dtype=np.float64))
    w, V = w[::-1][:k], backend.asarray(np.ascontiguousarray(V[:, ::-1][:, :k]))
    E = V * (d ** -0.5)[:, None]
    return E, np.sort(np.asarray(w, dtype=np.float64))[::-1], 0, "dense"


def _components(A):
    """(count, labels) of the connected components of the symmetric sparse A (SciPy, on the host)."""
    from scipy.sparse.csgraph import connected_components

    return connected_components(A, directed=False)


#: components up to this size are solved densely (numpy's eigh) by :func:`_top_by_components`: up to 128 points
#: eigh is faster than ARPACK (75 points: 0.9 ms against 1.7-2.1 ms; 128: 2.3 against 3.1; 200: 5.2 against
#: 3.3-4.2; 2-core CPU, one thread)
DENSE_COMPONENT = 128


def _top_by_components(N, component, count, k, v0, *, tol, maxiter, rng, bar=None, d=None):
    """(w, V, matvecs) of the k largest eigenpairs of the block-diagonal N (one block per connected component;
    CPU): the union of the blocks' spectra, each block solved alone, by ARPACK (connected: a single-vector Krylov
    method is reliable there) or densely when small; every block has the eigenvalue 1 once, so a graph of c
    components gets it c times, which ARPACK on the whole of N cannot be trusted to find. (None, None, 0) where a
    block's ARPACK does not converge. Ties at the k-th eigenvalue are broken by component order.

    The c eigenvalues 1 are all among the top k when c <= k, so a block needs only its k - c + 1 largest. Where
    c >= k, the top k are k of the eigenvalues 1 and no block is solved: a block's is D_b^1/2 1 / ||D_b^1/2 1||
    (``d``: the degrees), and the k components of largest volume d(b) are taken (ties: component order), the
    rest left together at the embedding's origin (two spirals, 1,000 points: 28 ms of ARPACK on the two
    components saved, 2-core CPU)."""
    n = N.shape[0]
    order = np.argsort(component, kind="stable")
    bounds = np.searchsorted(component[order], np.arange(count + 1))
    if count >= k and d is not None:
        return _indicator_vectors(order, bounds, count, k, np.asarray(d, dtype=np.float64), n)
    values, vectors, matvecs = [], [], 0
    for c in range(count):
        rows = order[bounds[c]:bounds[c + 1]]
        block = N[rows][:, rows]
        want = min(k - count + 1, rows.size)
        if rows.size <= max(DENSE_COMPONENT, 5 * want + 1):
            w, V = np.linalg.eigh(block.toarray())
            w, V = w[::-1][:want], V[:, ::-1][:, :want]
        else:
            w, V, products = _arpack_top(block, want, v0[rows], tol=tol, maxiter=maxiter, rng=rng)
            if w is None:
                return None, None, 0
            matvecs += products
        values.extend((float(value), c, j) for j, value in enumerate(w))
        vectors.append((rows, V))
        if bar is not None and (c + 1) % max(1, count // 10) == 0:
            bar.set_postfix_str(f"component {c + 1}/{count}")
    top = sorted(values, key=lambda t: (-t[0], t[1], t[2]))[:k]
    w = np.array([t[0] for t in top])
    V = np.zeros((n, k))
    for column, (_, c, j) in enumerate(top):
        rows, block_vectors = vectors[c]
        V[rows, column] = block_vectors[:, j]
    return w, V, matvecs


def _indicator_vectors(order, bounds, count, k, d, n):
    """(w, V, 0): the eigenvalue 1 of the k components of largest volume (``order``, ``bounds``: the points of
    each component), each with its eigenvector D_b^1/2 1 / ||D_b^1/2 1|| (the largest of a connected block)."""
    volume = np.add.reduceat(d[order], bounds[:-1])
    chosen = np.lexsort((np.arange(count), -volume))[:k]
    V = np.zeros((n, k))
    for column, c in enumerate(chosen):
        rows = order[bounds[c]:bounds[c + 1]]
        root = np.sqrt(d[rows])
        V[rows, column] = root / np.linalg.norm(root)
    return np.ones(k), V, 0


#: ARPACK is asked for at least this many eigenpairs (the top k kept): with k = 2 the second eigenvalue of a graph
#: of two dense parts crowds the third, and the requested pairs converge slowly (two moons, 1,000 points:
#: 1, 0.99984, 0.99939, 0.99906; 595 products for the top 2, 292 with 4 asked for; Jain 180 against 131)
ARPACK_PAIRS = 4


def _arpack_top(N, k, v0, *, tol, maxiter, rng):
    """(w, V, matvecs) of the k largest eigenpairs of the sparse symmetric N by ARPACK (asked for at least
    ARPACK_PAIRS), or (None, None, 0) where it does not converge within ``maxiter`` restarts; ``rng`` draws its
    restart vectors."""
    from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh

    count = [0]

    def matvec(x):
        count[0] += 1
        return N @ x

    op = LinearOperator(N.shape, matvec=matvec, matmat=lambda X: N @ X, dtype=N.dtype)
    try:
        w, V = eigsh(op, k=max(k, min(ARPACK_PAIRS, N.shape[0] - 2)), which="LA", tol=tol, maxiter=maxiter, v0=v0,
                     rng=rng)
    except ArpackNoConvergence:
        return None, None, 0
    order = np.argsort(w)[::-1][:k]
    return w[order], np.ascontiguousarray(V[:, order]), count[0]


def _scipy_lobpcg():
    import warnings

    from scipy.sparse.linalg import lobpcg

    def quiet(*args, **kwargs):
        with warnings.catch_warnings():  # "not reaching the requested tolerance": the start needs no more
            warnings.simplefilter("ignore", UserWarning)
            return lobpcg(*args, **kwargs)
    return quiet



def starts(init, n_init, A, d, k, backend, rng, *, verbose=False, progress=False, name="ncut"):
    """The initial partitions: ``n_init`` spectral ones, or ``init`` itself (a string the driver resolves).

    ``progress``: a bar over the start's steps, the eigenvectors (its text following the components solved), then
    each k-means of the embedding; ``verbose``: a line for the eigenvectors and one per k-means (``[name]``)."""
    if not (isinstance(init, str) and init == "spectral"):
        return [init], {}
    from kkmgpu._progress import progress_bar

    workers = 1 if backend.is_gpu or A.shape[0] * k < SERIAL_KMEANS else min(n_init, _cpu_threads())
    with progress_bar(1 + n_init, desc="spectral start", unit="step", enabled=progress) as bar, one_thread(backend):
        t0 = time.perf_counter()
        info = {}
        E, w, iterations, solver = spectral_embedding(A, d, k, backend, rng, bar=bar, info=info,
                                                      arpack_tol=START_ARPACK_TOL)
        seconds = time.perf_counter() - t0
        where = f" on {info['components']} components" if info.get("components", 1) > 1 else ""
        bar.set_postfix_str(f"eigenvectors by {solver}{where}, {seconds:.1f} s")
        bar.update()
        if verbose:
            print(f"[{name}] spectral start: the top {k} eigenvectors of D^-1/2 A D^-1/2 by {solver}{where} in "
                  f"{seconds:.3g} s (eigenvalues {w[0]:.6g} ... {w[-1]:.6g}); k-means of the embedding, "
                  f"{n_init} start(s)", flush=True)
        operator = _embedding_operator(E, backend)
        # each k-means of the embedding draws from its own stream, so that they may run side by side (the CPU:
        # one thread each, no barrier between them) and give the same starts whatever the number of threads
        seeds = rng.integers(2 ** 63, size=n_init)
        labels = []
        for r, best in enumerate(_embedding_kmeans(operator, k, seeds, backend, workers)):
            labels.append(backend.to_host(best.labels).astype(np.int32))
            bar.set_postfix_str(f"k-means {r} of the embedding: {best.n_iter} iterations")
            bar.update()
            if verbose:
                print(f"[{name}] spectral start {r}: k-means of the embedding, {best.n_iter} iterations, "
                      f"objective {best.objective:.10g}", flush=True)
    return labels, {"spectral_eigenvalues": w.tolist(), "eigensolver": solver, "eigensolver_iterations": iterations,
                    "spectral_seconds": seconds, "spectral_components": int(info.get("components", 1))}


#: the k-means of an (n, k) embedding with n k below this run one after the other in the calling thread: each
#: takes about a millisecond, less than starting and joining the threads that would share them (wine, 178 points:
#: 24 ms of a 60 ms fit waited on their locks, 2-core CPU, load 2.6); they draw the same starts either way
SERIAL_KMEANS = 2 ** 15


def _cpu_threads() -> int:
    """The threads numba may use here (NUMBA_NUM_THREADS, or the caller's numba.set_num_threads)."""
    import numba

    return max(1, numba.get_num_threads())


def _embedding_kmeans(operator, k, seeds, backend, workers):
    """Yield, in order, the k-means run on the embedding from one k-means++ start per seed; on the CPU up to
    ``workers`` at once in threads (BLAS and numba release the GIL; each run on one thread of each)."""
    from kkmgpu.engine.lloyd import run_restarts

    small = not backend.is_gpu and operator.n * k * k <= _small_kmeans.SMALL

    def one(seed):
        with _numba_one_thread() if not backend.is_gpu else contextlib.nullcontext():  # per thread: its own
            run = _small_kmeans.kmeans(operator.A, k, np.random.default_rng(int(seed)), max_iter=300,
                                       tol=EMBEDDING_TOL) if small else None
            # the driver where the embedding is larger, on a GPU, or where the compiled run emptied a cluster
            return run or run_restarts(operator, k, init="k-means++", n_init=1, max_iter=300, tol=EMBEDDING_TOL,
                                       rng=np.random.default_rng(int(seed)), verbose=False, progress=False)[0]

    if workers <= 1:
        yield from map(one, seeds)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kkmgpu-start") as pool:
        yield from pool.map(one, seeds)


def _embedding_operator(E, backend):
    """The Lloyd driver's operator on the embedding E (:class:`kkmgpu.engine.embedding.EmbeddingOperator`, unit
    weights), its centroid sums by a sparse one-hot product, O(n k) where the dense one is O(n k^2): half of an
    iteration's work at k = 100. On the CPU, k-means++'s rows E[index] E^T take a contiguous copy of E^T: OpenBLAS
    multiplies the few seeds' rows by it 2.4 times as fast as by the transposed view (n = 20,000, k = 100, one
    thread: 3.2 ms against 7.8 ms), and the greedy seeding is most of the start's time there."""
    from kkmgpu.engine.embedding import EmbeddingOperator

    class Operator(EmbeddingOperator):
        def centroid_sums(self, labels, k):
            xp = self.backend.xp
            if not self.backend.is_gpu:
                return _row_sums_by_cluster(self.weighted, np.ascontiguousarray(labels, dtype=np.int64), int(k))
            Y = _sparse.sparse_module(self.backend).csr_matrix(
                (self.weights, (backend.asarray(labels).astype(xp.int64), xp.arange(self.n))), shape=(k, self.n))
            return xp.asarray(_products.product(Y, self.A, self.backend))   # Y's rows: n / k entries

        def device_rows(self, index):
            if self.backend.is_gpu:
                return super().device_rows(index)
            return self.A[index] @ self.transposed

    operator = Operator(E, backend.xp.ones(E.shape[0], dtype=backend.xp.float64), backend)
    if not backend.is_gpu:   # made here, before any thread reads it
        operator.transposed = np.ascontiguousarray(operator.A.T)
        operator.weighted = operator.A * operator.weights[:, None]
    return operator


@njit(cache=True)
def _row_sums_by_cluster(V, labels, k):
    """M (k, r): M[c] = the sum of the rows V[i] with labels[i] == c, each added in index order: on the CPU the
    embedding's centroid sums, the same sums in the same order as the sparse one-hot product or a bincount per
    column (which it replaces: no sparse matrix built on every iteration, one pass over V; 3,100 points, k = 31:
    the sparse product's construction was a third of the spectral start)."""
    n, r = V.shape
    M = np.zeros((k, r))
    for i in range(n):
        c = labels[i]
        for j in range(r):
            M[c, j] += V[i, j]
    return M
