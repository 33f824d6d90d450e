"""The Off-the-grid search over the degree of the polynomial kernel (§6.3): :func:`search_polynomial_degree`.
"""

from __future__ import annotations

import math
import numbers
import time

import numpy as np

from kkmgpu.bandwidth import matrices as _matrices
from kkmgpu.bandwidth import offgrid as _offgrid
from kkmgpu.bandwidth._checks import _check_common, _check_depth, _check_positive
from kkmgpu.bandwidth._layout import _Layout, _alloc_pair
from kkmgpu.bandwidth.results import BandwidthSearchResult
from kkmgpu.bandwidth.search import _prepare, _Recorder, _run_kernel_kmeans
from kkmgpu.engine.dense import DenseKernelOperator
from kkmgpu.engine.lloyd import initial_labels
from kkmgpu._progress import check_progress, progress_bar


def search_polynomial_degree(X, k, *, degree0=1, gamma=None, coef0=1.0, depth=None, integer_degrees=True,
                             max_degree=64, max_values=50, init="random", sample_weight=None, y_true=None,
                             max_iter=300, tol=1e-6, random_state=None, device="auto", dtype="float64",
                             limit_checks=True, verbose=False, progress=False) -> BandwidthSearchResult:
    """The Off-the-grid search over the degree d of the polynomial kernel (gamma <x, y> + coef0) ** d (§6.3).

    With B = K_1 (the base, element-wise), K_d' = B ** d' = K_d ** (d' / d): the same dyadic walk as for
    the bandwidth, on the exponent q = d' / d >= 1 (doubling the degree while no point moves, then
    bisecting in [d_base, 2 d_base]). Real powers need B > 0 element-wise.

    Critical degree: for a partition P converged at degree d, the infimum of the real degrees d' > d at
    which one kernel k-means step from P with the matrix B ** d' moves a point (Definition 1 with d in the
    place of sigma). B ** d' for a non-integer d' need not be positive semidefinite, so with
    ``integer_degrees=True`` (default) kernel k-means runs at an integer degree (a valid polynomial kernel):
    the walk's depth is raised after its doubling phase until the bracket [lower, upper] is at most one
    degree wide, and the next degree is the first integer m > lower when a point moves at m (one more full
    check at B ** m when m < upper), else the next integer (>= upper). So no integer degree between two
    evaluated ones moves a point from the earlier clustering, as far as the bracket is exact. With False
    kernel k-means runs at the upper end itself.

    Parameters
    ----------
    degree0 : float, default=1
        Starting degree (>= 1; an integer when ``integer_degrees``).
    gamma : float, optional
        Default 1 / n_features (as :func:`kkmgpu.fit`).
    coef0 : float, default=1.0
    depth : int, optional
        Probes per dyadic level (final width 2^(1 - depth) d_base). Default 1 with ``integer_degrees``
        (raised per walk to 1 + ceil(log2(d_base)), the depth that resolves one degree), else 8.
    max_degree : float, default=64
        Cap on the probed degrees.
    Other parameters as for :func:`search_bandwidth`.

    Returns
    -------
    BandwidthSearchResult
        method "polynomial-degree", parameter "degree"; every clustering's ``degree`` is set.

    Raises
    ------
    ValueError
        If B = gamma <x, y> + coef0 has a value <= 0 (use a larger coef0), or bad parameters.
    """
    t_start = time.perf_counter()
    degree0 = _check_positive(degree0, "degree0")
    if degree0 < 1:
        raise ValueError(f"degree0={degree0!r} must be >= 1.")
    if integer_degrees and degree0 != int(degree0):
        raise ValueError(f"degree0={degree0!r} must be an integer with integer_degrees=True.")
    max_degree = _check_positive(max_degree, "max_degree")
    if depth is not None:
        depth = _check_depth(depth)
    coef0 = float(coef0) if isinstance(coef0, numbers.Real) and not isinstance(coef0, bool) else coef0
    if not isinstance(coef0, float) or not math.isfinite(coef0):
        raise ValueError(f"coef0={coef0!r} must be a finite number.")
    max_iter, tol, max_values = _check_common(max_iter, tol, max_values)
    backend, dt, rng, X, n, k, weights_h, init, y_true = _prepare(X, k, device, dtype, sample_weight, y_true,
                                                                   random_state, init)
    if gamma is None:
        gamma = 1.0 / X.shape[1]
    gamma = _check_positive(gamma, "gamma")
    xp = backend.xp
    rec = _Recorder(X, k, backend, y_true, "polynomial-degree", "degree",
                    progress_bar(max_values, desc="degree search", unit="run", enabled=check_progress(progress)))
    with backend.activate():
        X64 = backend.asarray(X, dtype=np.float64)
        rec.timings["validation"] = time.perf_counter() - t_start
        K, Kp = _alloc_pair(n, dt, backend)
        layout = _Layout(backend, n, weights_h)

        def build(d):
            t0 = time.perf_counter()
            smallest, _ = _matrices.fill_polynomial(K, X64[layout.order], gamma, coef0, d, backend)
            rec.costs["kernel_builds"] += 1
            rec.timings["kernel_build"] += backend.timer() - t0
            if smallest <= 0:
                raise ValueError(f"the polynomial base gamma <x, y> + coef0 has a minimum {smallest:.6g} <= 0; the "
                                 "degree walk takes real powers of it, which needs B > 0 element-wise. Use a larger "
                                 f"coef0 (> {coef0 - smallest:.6g}) or a smaller gamma.")
            if not bool(xp.isfinite(K).all()):
                raise ValueError(f"(gamma <x, y> + coef0) ** {d:g} overflows {dt.name}; lower the degree or scale X.")

        build(degree0)
        labels0 = np.asarray(initial_labels(init, n, k, rng, DenseKernelOperator(K, layout.weights, backend)),
                             dtype=np.int32)
        run, seconds = _run_kernel_kmeans(K, layout.weights, layout.from_input(labels0), k, backend, max_iter, tol,
                                          rec)
        rec.record(degree0, layout.to_input(run.labels), run, 0, seconds, gamma=gamma, degree=degree0)
        degree, labels_l = degree0, run.labels
        while len(rec.evaluations) < max_values:
            t0 = time.perf_counter()
            walk_depth = depth if depth is not None else (1 if integer_degrees else 8)
            limited = bool(limit_checks) and (walk_depth > 1 or integer_degrees)
            labels_l = layout.regroup(K, Kp, labels_l, k, limited, rec.costs)
            if int((np.bincount(backend.to_host(labels_l), minlength=k) > 0).sum()) <= 1:
                break
            question = _offgrid.OneStepQuestion(backend, labels_l, layout.weights, k, limited=limited)
            outcome = _offgrid.walk_degree(K, Kp, question, degree, walk_depth, backend, max_degree=max_degree,
                                           max_width=1.0 if integer_degrees else None, verbose=verbose)
            rec.costs["fused_steps"] += outcome.n_steps
            rec.timings["walk"] += backend.timer() - t0
            if not outcome.found:
                rec.add_question(question)
                if verbose:
                    print(f"[kkmgpu] degree search: stop, {outcome.capped}")
                break
            lower, upper = outcome.base * outcome.e_lower, outcome.base * outcome.e_upper
            walk_depth = int(outcome.depth)
            rec.brackets.append((lower, upper, walk_depth))
            if integer_degrees:
                # K holds B ** upper. The first integer above lower (no move there) is the next degree when a
                # point moves at it; the bracket is at most one degree wide, so otherwise the one after it is.
                held = upper                             # the degree K holds
                first = float(math.floor(lower + 1e-9) + 1)
                degree = first
                if first < upper - 1e-9 and first <= max_degree:
                    build(first)
                    held = first
                    t1 = time.perf_counter()
                    if question.full(K)[0] == 0:
                        degree = first + 1.0
                    rec.timings["walk"] += backend.timer() - t1
                rec.add_question(question)
                if degree > max_degree:
                    break
                if abs(degree - held) > 1e-9:
                    build(degree)
            else:
                rec.add_question(question)
                degree = upper
            run, _ = _run_kernel_kmeans(K, layout.weights, labels_l, k, backend, max_iter, tol, rec)
            labels_l = run.labels
            index = rec.record(degree, layout.to_input(labels_l), run, walk_depth, backend.timer() - t0,
                               gamma=gamma, degree=degree)
            if verbose:
                print(f"[kkmgpu] degree search: degree {degree:g} (critical in [{lower:.4g}, {upper:.4g}]): "
                      f"clustering {index}, c-NNC {rec.clusterings[index].cnnc:.4f}")
        del K, Kp
    return rec.result(labels0, degree0, n, backend.name, dt.name, t_start)
