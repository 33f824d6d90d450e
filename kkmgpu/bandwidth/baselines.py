"""The paper's baselines: GRIDSEARCH (:func:`search_grid`) and MKNN (:func:`search_mknn`, :func:`mknn_sigmas`),
kernel k-means at fixed bandwidths from one initial partition, with the result type of the search.
"""

from __future__ import annotations

import math
import time

import numpy as np

from kkmgpu import _warn
from kkmgpu import _validation

from kkmgpu.bandwidth import matrices as _matrices
from kkmgpu.bandwidth._checks import _check_common, _check_positive
from kkmgpu.bandwidth.results import BandwidthSearchResult
from kkmgpu.bandwidth.search import _prepare, _Recorder, _run_kernel_kmeans
from kkmgpu.backend.device import check_fits, memory_advice, resolve_device
from kkmgpu.engine.dense import DenseKernelOperator
from kkmgpu.engine.lloyd import initial_labels
from kkmgpu._progress import check_progress, progress_bar


#: The paper's GRIDSEARCH values: sigma in {10^-6, ..., 10^6}.
GRID_SIGMAS = tuple(10.0 ** e for e in range(-6, 7))


def _evaluate_sigmas(X, k, sigmas, method, *, init, sample_weight, y_true, max_iter, tol, random_state, device,
                     dtype, verbose, t_start, progress=False):
    """Kernel k-means at each bandwidth from one initial partition (the baselines)."""
    backend, dt, rng, X, n, k, weights_h, init, y_true = _prepare(X, k, device, dtype, sample_weight, y_true,
                                                                   random_state, init)
    xp = backend.xp
    rec = _Recorder(X, k, backend, y_true, method, "sigma")
    with backend.activate():
        A = _matrices.centered_features(X, backend)
        if callable(sigmas):
            sigmas = sigmas(A, backend)
        rec.bar = progress_bar(len(sigmas), desc=f"bandwidth {method}", unit="run", enabled=check_progress(progress))
        rec.timings["validation"] = time.perf_counter() - t_start
        weights = backend.asarray(weights_h)
        check_fits(n * n * dt.itemsize, backend, f"the {n} x {n} {dt.name} kernel matrix",
                   advice=memory_advice(dtype=dt, method="search"))
        K = xp.empty((n, n), dtype=dt)
        try:                                       # keep -D / 2 when it fits: one exp pass per sigma, no GEMM
            check_fits(2 * n * n * dt.itemsize, backend, "D")
            G = _matrices.fill_neg_half_distances(xp.empty((n, n), dtype=dt), A, backend)
            zeros = xp.zeros(n, dtype=dt)
        except MemoryError:
            G = None
        labels0 = None
        for s in sigmas:
            t0 = time.perf_counter()
            if G is not None:
                _matrices.rbf_from_neg_half(K, G, s, backend, zeros)
            else:
                _matrices.fill_rbf(K, A, s, backend)
            rec.costs["kernel_builds"] += 1
            rec.timings["kernel_build"] += backend.timer() - t0
            if labels0 is None:
                labels0 = np.asarray(initial_labels(init, n, k, rng, DenseKernelOperator(K, weights, backend)),
                                     dtype=np.int32)
            run, seconds = _run_kernel_kmeans(K, weights, backend.asarray(labels0), k, backend, max_iter, tol, rec)
            index = rec.record(s, backend.to_host(run.labels).astype(np.int32), run, 0, backend.timer() - t0,
                               sigma=s, gamma=1.0 / s)
            if verbose:
                c = rec.clusterings[index]
                print(f"[kkmgpu] {method}: sigma={s:.6g}: clustering {index}, c-NNC {c.cnnc:.4f}, "
                      f"{run.n_iter} iterations")
    return rec.result(labels0, sigmas[0], n, backend.name, dt.name, t_start)


def search_grid(X, k, *, sigmas=GRID_SIGMAS, init="random", sample_weight=None, y_true=None, max_iter=300, tol=1e-6,
                random_state=None, device="auto", dtype="float64", verbose=False,
                progress=False) -> BandwidthSearchResult:
    """The paper's GRIDSEARCH baseline: kernel k-means at sigma = 10^-6, 10^-5, ..., 10^6 (13 values) from
    one initial partition, every distinct clustering scored by c-NNC (and NMI).

    K = exp(-D / sigma) is recomputed per value from the squared distances D kept on the device (when D and
    K fit; else from X).

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
    k : int
    sigmas : sequence of float, default=GRID_SIGMAS
        The bandwidths (each > 0), in the paper's convention exp(-||x - y||^2 / sigma).
    init, sample_weight, y_true, max_iter, tol, random_state, device, dtype, verbose
        As for :func:`search_bandwidth`.

    Returns
    -------
    BandwidthSearchResult
        method "grid"; ``evaluations`` has one entry per value.

    Raises
    ------
    ValueError
        A sigma <= 0 or not finite, an empty ``sigmas``, or the errors of :func:`search_bandwidth`.
    """
    t_start = time.perf_counter()
    max_iter, tol, _ = _check_common(max_iter, tol, 1)
    sigmas = [_check_positive(s, "sigma") for s in sigmas]
    if not sigmas:
        raise ValueError("sigmas is empty; give at least one bandwidth.")
    return _evaluate_sigmas(X, k, sigmas, "grid", init=init, sample_weight=sample_weight, y_true=y_true,
                            max_iter=max_iter, tol=tol, random_state=random_state, device=device, dtype=dtype,
                            verbose=verbose, t_start=t_start, progress=progress)


def mknn_sigmas(X, n_neighbors=None, *, device="auto"):
    """The MKNN bandwidths: sigma_j = 2 (mean_i d_j(x_i))^2 for j = 1..J, J = int(2 (log n + 1)).

    d_j(x_i) is the Euclidean distance from x_i to its j-th nearest other point. The mean distance to the
    j-th neighbour (Von Luxburg's heuristic) is a scale s for the kernel exp(-||x - y||^2 / (2 s^2)); in the
    paper's convention exp(-||x - y||^2 / sigma) that is sigma = 2 s^2 (its footnote 1). The paper's
    published code averages 2 d_j^2 instead (and counts the point itself as its 1st neighbour).
    Values that come out 0 (duplicate points) are dropped with a UserWarning.

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
    n_neighbors : int, optional
        J; default int(2 (log n + 1)), at most n - 1.
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"

    Returns
    -------
    list of float
        sigma_1, ..., sigma_J (zeros dropped).

    Raises
    ------
    ValueError
        Bad X, or every bandwidth is 0 (the nearest neighbours coincide with the points).
    """
    backend = resolve_device(device, (X,))
    with backend.activate():
        X = _validation.check_data(X, backend)
        return _mknn_sigmas(_matrices.centered_features(X, backend), backend, n_neighbors)


def _mknn_sigmas(A, backend, n_neighbors=None):
    n = A.shape[0]
    if n_neighbors is None:
        n_neighbors = int(2 * (math.log(n) + 1))
    n_neighbors = max(1, min(int(n_neighbors), n - 1))
    d = _matrices.nearest_neighbour_distances(A, n_neighbors, backend)
    sigmas = [2.0 * float(m) ** 2 for m in d.mean(axis=0)]
    kept = [s for s in sigmas if s > 0]
    if len(kept) < len(sigmas):
        _warn.warn(f"{len(sigmas) - len(kept)} MKNN bandwidths are 0 (duplicate points) and were dropped.",
                   UserWarning)
    if not kept:
        raise ValueError("every MKNN bandwidth is 0: the nearest neighbours coincide with the points.")
    return kept


def search_mknn(X, k, *, n_neighbors=None, init="random", sample_weight=None, y_true=None, max_iter=300, tol=1e-6,
                random_state=None, device="auto", dtype="float64", verbose=False,
                progress=False) -> BandwidthSearchResult:
    """The paper's MKNN baseline: sigma from the mean distance to the j-th nearest neighbour, j = 1..J.

    J = int(2 (log n + 1)) unless ``n_neighbors`` is given; see :func:`mknn_sigmas` for the conversion to
    the paper's kernel convention (sigma = 2 s^2). Kernel k-means runs from one initial partition at every
    value; every distinct clustering is scored by c-NNC (and NMI). The neighbour distances are computed in
    row tiles on the device.

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
    k : int
    n_neighbors : int, optional
        J (>= 1); default int(2 (log n + 1)).
    init, sample_weight, y_true, max_iter, tol, random_state, device, dtype, verbose
        As for :func:`search_bandwidth`.

    Returns
    -------
    BandwidthSearchResult
        method "mknn"; ``evaluations`` has one entry per neighbour rank.

    Raises
    ------
    ValueError, TypeError
        ``n_neighbors`` not an integer >= 1, or the errors of :func:`search_bandwidth`.
    """
    t_start = time.perf_counter()
    max_iter, tol, _ = _check_common(max_iter, tol, 1)
    if n_neighbors is not None:
        n_neighbors = _validation.check_int(n_neighbors, "n_neighbors", minimum=1)
    return _evaluate_sigmas(X, k, lambda A, backend: _mknn_sigmas(A, backend, n_neighbors), "mknn", init=init,
                            sample_weight=sample_weight, y_true=y_true, max_iter=max_iter, tol=tol,
                            random_state=random_state, device=device, dtype=dtype, verbose=verbose, t_start=t_start,
                            progress=progress)
