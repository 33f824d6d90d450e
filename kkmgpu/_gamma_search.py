"""``kkmgpu.fit(gamma="search")``: the Off-the-grid bandwidth search, then kernel k-means at the best gamma."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from kkmgpu import _validation
from kkmgpu.kernels import spec as _kernel_spec
from kkmgpu.bandwidth import search_bandwidth


def fit_with_search(X, k, *, fit_kwargs, fit):
    """:func:`kkmgpu.fit` with ``gamma="search"``: the best clustering of :func:`search_bandwidth`, refit.

    The search runs with the call's k, init, random_state, sample_weight, max_iter, tol, device and dtype
    (float16 searches in float32), so ``search_bandwidth`` called with the same values (fit's defaults are
    init="k-means++" and dtype="float32", not the search's "random" and "float64") finds the same clusterings;
    kernel k-means is then fit at the best gamma = 1 / sigma from the best clustering's labels (a fixed point
    there, so normally one step), giving a normal result that predict accepts. The search result is in
    ``result.method_params["bandwidth_search"]``. ``fit``: :func:`kkmgpu.fit` itself (this module is imported by
    the module that defines it).
    """
    kernel = fit_kwargs.get("kernel", "rbf")
    if callable(kernel) or _kernel_spec.canonical_kernel_name(kernel) != "rbf":
        raise ValueError(f"gamma='search' is the Off-the-grid RBF bandwidth search; it needs kernel='rbf', "
                         f"got kernel={kernel!r}.")
    method = fit_kwargs.get("method", "exact")
    if method != "exact":
        raise ValueError(f"gamma='search' needs method='exact' (the search holds the dense kernel matrix); "
                         f"got method={method!r}.")
    init = fit_kwargs.get("init", "k-means++")
    dtype = _validation.check_dtype(fit_kwargs.get("dtype", "float32"))
    search_dtype = np.float32 if dtype == np.float16 else dtype
    t0 = time.perf_counter()
    rng = _validation.make_rng(fit_kwargs.get("random_state"))
    search = search_bandwidth(X, k, init=init, sample_weight=fit_kwargs.get("sample_weight"),
                              max_iter=fit_kwargs.get("max_iter", 300), tol=fit_kwargs.get("tol", 1e-6),
                              random_state=rng, device=fit_kwargs.get("device", "auto"), dtype=search_dtype,
                              verbose=fit_kwargs.get("verbose", False), progress=fit_kwargs.get("progress", False))
    seconds = time.perf_counter() - t0
    best = search.best
    kwargs = dict(fit_kwargs)
    kwargs.update(kernel="rbf", gamma=best.gamma, init=best.labels, n_init=1, random_state=rng)
    result = fit(X, k, **kwargs)
    timings = dict(result.timings)
    timings["bandwidth_search"] = seconds
    timings["total"] = timings.get("total", 0.0) + seconds
    method_params = dict(result.method_params)
    method_params["bandwidth_search"] = search
    method_params["sigma"] = best.sigma
    return dataclasses.replace(result, timings=timings, method_params=method_params)
