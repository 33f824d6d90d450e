"""Theorem 1, Algorithm 1 and Algorithm 2 of the Off-the-grid paper: :func:`bandwidth_lower_bound`,
:func:`fast_power`, :func:`critical_bandwidth` (the dyadic walk) and its §7.3 baseline
:func:`binary_search_critical_bandwidth`.
"""

from __future__ import annotations

import math
import time

import numpy as np

from kkmgpu import _warn
from kkmgpu import _validation

from kkmgpu.bandwidth import matrices as _matrices
from kkmgpu.bandwidth import offgrid as _offgrid
from kkmgpu.bandwidth._checks import (_check_depth, _check_labels, _check_positive, _check_rbf_matrix,
                                      _check_walk_dtype)
from kkmgpu.bandwidth._layout import _Layout, _alloc_pair, _worth_limiting
from kkmgpu.bandwidth.results import CriticalBandwidth
from kkmgpu.backend.device import argsort_stable, resolve_device


# --- Theorem 1 and Algorithm 1 -----------------------------------------------------------------------------

def bandwidth_lower_bound(X, *, device="auto") -> float:
    """Theorem 1's bound: for sigma <= min ||x - y||^2 / log(3 n) kernel k-means moves no point.

    With the RBF kernel exp(-||x - y||^2 / sigma) (gamma = 1 / sigma), every off-diagonal kernel value is
    then <= 1 / (3 n), and from *any* partition no point is nearer (in feature space) to another cluster's
    mean than to its own. The minimum is over pairs of distinct points, found in row tiles on the device
    (GEMM-form distances locate the closest pairs, whose distances are then recomputed as ||x - y||^2
    directly); no n x n matrix is made.

    Duplicate points: Theorem 1 assumes distinct points (two copies of a point have kernel value 1 at every
    sigma, and kernel k-means can move a copy at any bandwidth when the copies are split between clusters).
    With duplicates the bound is computed over the pairs at positive distance and a UserWarning names the
    number of duplicated points; the guarantee then holds for partitions that keep copies together.

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
        NumPy or CuPy array, n_samples >= 2.
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"

    Returns
    -------
    float
        min_{x != y} ||x - y||^2 / log(3 n).

    Raises
    ------
    ValueError
        If X has fewer than 2 rows, is not finite, or all its points coincide.

    Examples
    --------
    >>> import numpy as np, kkmgpu
    >>> X = np.array([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]])
    >>> round(kkmgpu.bandwidth_lower_bound(X, device="cpu"), 5)   # 1 / log(9)
    0.45512
    """
    backend = resolve_device(device, (X,))
    with backend.activate():
        X = _validation.check_data(X, backend)
        n = X.shape[0]
        if n < 2:
            raise ValueError(f"X has {n} row; the bound needs at least 2 points.")
        A = _matrices.centered_features(X, backend)
        d_min, dup_pairs, dup_points = _matrices.min_pairwise_sq_distance(A, backend)
    if not math.isfinite(d_min) or d_min <= 0:
        raise ValueError("every pair of points in X coincides; Theorem 1's bound is undefined.")
    if dup_pairs:
        _warn.warn(f"X has {dup_points} duplicated points ({dup_pairs} pairs at distance 0); the bound is taken "
                   "over the pairs at positive distance, and it guarantees no moves only for partitions that "
                   "keep identical points in the same cluster (Theorem 1 assumes distinct points).",
                   UserWarning)
    return d_min / math.log(3.0 * n)


def fast_power(B, p, depth):
    """Algorithm 1: element-wise B ** p from products, square roots and divisions only.

    p = z + f with z integral and f in [0, 1): B ** z by repeated squaring (Lemma 1), B ** f' with f' the
    dyadic rational within 2^-depth of f reached by the +-2^-j steps of Lemma 2 over the successive
    square roots of B. So the result r satisfies B ** (p - 2^-depth) <= r <= B ** (p + 2^-depth) up to
    rounding: a (1 +- eps) approximation of B ** p with eps = exp(|log B| 2^-depth) - 1 (Theorem 2).
    On 2-D float32 / float64 arrays each fractional step is one fused pass (``offgrid_step``).

    Parameters
    ----------
    B : array
        Positive finite values (NumPy or CuPy; array-likes become NumPy). Integer arrays are computed in float64.
    p : float
        Exponent > 0.
    depth : int
        Dyadic depth of the fractional part, 1 <= depth <= 52.

    Returns
    -------
    array of B's shape, the same kind (NumPy or CuPy) as B

    Raises
    ------
    ValueError
        If B has a value <= 0 or not finite, p <= 0, or depth is out of range.

    Examples
    --------
    >>> import numpy as np, kkmgpu
    >>> r = kkmgpu.fast_power(np.array([2.0, 0.5]), 2.5, depth=1)   # 2.5 is dyadic at depth 1: exact
    >>> np.allclose(r, [2.0 ** 2.5, 0.5 ** 2.5])
    True
    """
    from kkmgpu.backend.device import Backend, is_cupy_array

    p = _check_positive(p, "p")
    depth = _check_depth(depth)
    if is_cupy_array(B):
        backend = Backend("cuda", int(B.device.id))
    else:
        backend = Backend("cpu")
        B = np.asarray(B)
    xp = backend.xp
    with backend.activate():
        if B.dtype.kind not in "biuf":
            raise ValueError(f"B has dtype {B.dtype}; real positive values are required.")
        if B.dtype.kind != "f" or B.dtype == np.float16:
            B = B.astype(xp.float64)
        if B.size and not bool(xp.isfinite(B).all()):
            raise ValueError("B contains NaN or infinity; fast_power needs finite positive values.")
        if B.size and float(B.min()) <= 0:
            raise ValueError(f"B has values <= 0 (min {float(B.min()):.3g}); fast_power needs B > 0 "
                             "(square roots and real powers of negative numbers are not defined).")
        return _offgrid.fast_power_inplace(xp.ascontiguousarray(B), p, depth, backend)


# --- Algorithm 2 -------------------------------------------------------------------------------------------

def critical_bandwidth(X=None, labels=None, *, K=None, sigma, depth=10, sample_weight=None, limit_checks=True,
                       max_sigma=None, dtype="float64", device="auto", verbose=False) -> CriticalBandwidth:
    """The critical bandwidth of a partition (Definition 1) by Algorithm 2's dyadic walk.

    For sigma' > sigma, K_sigma' = K_sigma ** p element-wise with p = sigma / sigma' (paper §5.1). The walk
    keeps K = K_base ** e and K' = K_base ** 2^-j and moves e by +-2^-j with one fused pass over both
    (K' <- sqrt(K'); K <- K / K' when no point moved at the last probe, K * K' when one did; see
    :mod:`kkmgpu.bandwidth.offgrid` on the pseudocode's branches). At each probe it asks one question — would one
    kernel k-means assignment step from ``labels`` move any point? — first of the candidate points only
    (§6.2's limiting checks: those whose nearest other cluster is closest, and those that moved at the last
    change; only when one clearly moves), else of all points, so the answer is the full check's.

    Doubling phase: probe 2 sigma_base; while no point moves, 2 sigma_base becomes the base (no copy: K and
    K' are both K_base ** (1/2) then). Bisection phase: ``depth - 1`` further probes in the exponent interval
    [1/2, 1], so the returned bracket satisfies base_sigma / lower - base_sigma / upper = 2^-depth; the
    relative width of the bracket in sigma is at most 2^(1 - depth). The critical value lies in
    [lower, upper] (exactly when the set of moving bandwidths is an interval above it, which Definition 1
    does not promise in general).

    Cap: the doubling stops, with ``upper = inf``, when the next probe lies where no point can move (with X:
    if ``labels`` is a strict fixed point of plain k-means with smallest gap g, no point moves at any
    sigma' >= 0.75 max D^2 / g, since sigma dist_sigma(i, c) -> 2 ||x_i - m_c||^2), when K is all ones to the
    dtype's precision (max_ij D_ij / sigma_base < sqrt(eps): rounding would decide), or when the next probe
    would exceed ``max_sigma``.

    Underflow: kernel values below the smallest normal number are clamped to it. They can matter once the
    walk has doubled sigma a few times (float32: once, float64: 3-4 times); with X given, K is then
    recomputed from X at the current base (counted in ``n_rebuilds``); with only K given a UserWarning says
    that those entries are not known.

    Parameters
    ----------
    X : array of shape (n_samples, n_features), optional
        The data; K_sigma is built from it (RBF, exp(-||x - y||^2 / sigma), float64 arithmetic).
    labels : array of shape (n_samples,)
        The partition, normally converged kernel k-means output at sigma; integers >= 0.
    K : array of shape (n_samples, n_samples), optional
        Instead of X: the RBF kernel matrix at bandwidth ``sigma`` (symmetric, unit diagonal, values in
        [0, 1]); it is copied, not modified.
    sigma : float
        The bandwidth of K (gamma = 1 / sigma).
    depth : int, default=10
        Probes in the final dyadic level, 1 <= depth <= 52.
    sample_weight : array of shape (n_samples,), optional
    limit_checks : bool, default=True
        Use §6.2's limited checks where their expected reads are below half a full pass (K is then held
        in cluster order); the answers are the same either way.
    max_sigma : float, optional
        Do not probe beyond this bandwidth.
    dtype : {"float64", "float32"}, default="float64"
        Precision of K and K' when built from X (with K given: K's dtype).
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
    verbose : bool, default=False

    Returns
    -------
    CriticalBandwidth
        ``sigma`` (= ``upper``), the bracket, the moving points at ``upper``, counts and timings. If points
        move at ``sigma`` already (labels not a fixed point) it returns lower=0, upper=sigma with a warning.

    Raises
    ------
    ValueError
        Neither or both of X and K, K not an RBF matrix, bad labels (length, not integers, negative),
        sigma <= 0, depth out of [1, 52], dtype float16, bad sample_weight.
    InsufficientMemoryError
        If K and K' (two n x n arrays) do not fit the device.

    Examples
    --------
    >>> import kkmgpu
    >>> X, y = kkmgpu.datasets.make_two_circles(100, random_state=0)
    >>> labels = kkmgpu.fit(X, 2, gamma=10.0, init="random", random_state=0, device="cpu", dtype="float64",
    ...                     tol=0.0).labels                        # a fixed point at sigma = 1 / 10
    >>> cb = kkmgpu.critical_bandwidth(X, labels, sigma=0.1, depth=8, device="cpu")
    >>> bool(cb.lower < cb.upper), round(cb.base_sigma / cb.lower - cb.base_sigma / cb.upper, 6)
    (True, 0.003906)
    """
    t_start = time.perf_counter()
    if (X is None) == (K is None):
        raise ValueError("pass exactly one of X (the data) and K (the RBF kernel matrix at sigma).")
    sigma = _check_positive(sigma, "sigma")
    depth = _check_depth(depth)
    if max_sigma is not None:
        max_sigma = _check_positive(max_sigma, "max_sigma")
    source = X if K is None else K
    backend = resolve_device(device, (source,))
    xp = backend.xp
    with backend.activate():
        source = _validation.check_data(source, backend, name="X" if K is None else "K", square=K is not None)
        n = source.shape[0]
        labels_h, k = _check_labels(labels, n)
        weights_h = _validation.check_sample_weight(sample_weight, n)
        if K is not None:
            _check_rbf_matrix(source, backend)
            dt = np.dtype(source.dtype)
        else:
            dt = _check_walk_dtype(dtype)
            A_input = _matrices.centered_features(source, backend)
        t_valid = backend.timer()

        layout = _Layout(backend, n, weights_h)
        use_limited = bool(limit_checks) and depth > 1 and _worth_limiting(labels_h, k)
        if use_limited:
            perm = argsort_stable(np, labels_h).astype(np.int64)
            layout.order = backend.asarray(perm)
            layout.weights = backend.asarray(weights_h[perm])
        labels_l = layout.from_input(labels_h)
        Kw, Kp = _alloc_pair(n, dt, backend)
        if K is None:
            A = A_input[layout.order]
            info = _offgrid.BaseInfo(sigma, *_matrices.fill_rbf(Kw, A, sigma, backend))

            def rebuild(Kbuf, s):
                return _offgrid.BaseInfo(s, *_matrices.fill_rbf(Kbuf, A, s, backend))
        else:
            _matrices.permute_into(Kw, source, layout.order, backend)
            floor = _matrices.tiny(dt)
            n_clamped = int((Kw < floor).sum())
            smallest = float(Kw.min())
            if n_clamped:
                xp.maximum(Kw, floor, out=Kw)
            info = _offgrid.BaseInfo(sigma, n_clamped, smallest)
            rebuild = None
        t_kernel = backend.timer()

        question = _offgrid.OneStepQuestion(backend, labels_l, layout.weights, k, limited=use_limited)
        timings = {"validation": t_valid - t_start, "kernel_build": t_kernel - t_valid}
        nonempty = int((np.bincount(labels_h, minlength=k) > 0).sum())
        if nonempty <= 1:
            return _critical_result(math.inf, sigma, math.inf, 0, question, np.empty(0, np.int64), timings,
                                    t_kernel, t_start, backend, sigma, depth,
                                    "a single non-empty cluster: no point can change cluster")
        n_moved, moved = question.full(Kw)
        if n_moved:
            _warn.warn(f"labels are not a fixed point of kernel k-means at sigma={sigma:g}: {n_moved} points "
                       "move already, so the critical bandwidth is <= sigma (lower=0, upper=sigma).",
                       UserWarning)
            moved_h = np.sort(backend.to_host(layout.order[moved]).astype(np.int64))
            return _critical_result(sigma, 0.0, sigma, 0, question, moved_h, timings, t_kernel, t_start, backend,
                                    sigma, depth, "labels are not a fixed point at sigma")
        xp.copyto(Kp, Kw)
        beyond = (None if K is not None else
                  _offgrid.linear_regime_sigma(A, labels_l, layout.weights, k, backend))
        outcome = _offgrid.walk_rbf(Kw, Kp, question, sigma, depth, backend, info=info, rebuild=rebuild,
                                    max_sigma=max_sigma, no_move_beyond=beyond, verbose=verbose)
        for msg in outcome.warnings:
            _warn.warn(msg, UserWarning)
        if not outcome.found:
            return _critical_result(math.inf, outcome.base, math.inf, outcome.n_steps, question,
                                    np.empty(0, np.int64), timings, t_kernel, t_start, backend, outcome.base, depth,
                                    outcome.capped, n_rebuilds=outcome.n_rebuilds)
        lower = outcome.base / outcome.e_lower
        upper = outcome.base / outcome.e_upper
        n_moved, moved = question.full(Kw)         # the exact set of movers at upper (K holds K_upper)
        moved_h = (np.sort(backend.to_host(layout.order[moved]).astype(np.int64)) if n_moved
                   else np.empty(0, np.int64))
        return _critical_result(upper, lower, upper, outcome.n_steps, question, moved_h, timings, t_kernel, t_start,
                                backend, outcome.base, depth, "" if n_moved else
                                "rounding: the full check at upper found no mover", e=(outcome.e_lower,
                                                                                       outcome.e_upper),
                                n_rebuilds=outcome.n_rebuilds)


def _critical_result(estimate, lower, upper, n_steps, question, moved, timings, t_search, t_start, backend,
                     base, depth, reason, e=(math.nan, math.nan), n_rebuilds=0):
    t_end = backend.timer()
    timings = dict(timings)
    timings["search"] = t_end - t_search
    timings["checks"] = question.seconds
    timings["total"] = t_end - t_start
    moved = np.asarray(moved, dtype=np.int64)
    moved.flags.writeable = False
    return CriticalBandwidth(sigma=float(estimate), lower=float(lower), upper=float(upper), n_steps=int(n_steps),
                             n_full_checks=question.n_full, moved=moved, timings=timings,
                             n_limited_checks=question.n_limited, base_sigma=float(base), exponent_lower=float(e[0]),
                             exponent_upper=float(e[1]), depth=int(depth), reason=reason, n_rebuilds=int(n_rebuilds))


def binary_search_critical_bandwidth(X=None, labels=None, *, K=None, D=None, sigma, precision=1e-3, rtol=None,
                                     sigma_max=None, sample_weight=None, limit_checks=True, dtype="float64",
                                     device="auto", verbose=False) -> CriticalBandwidth:
    """The paper's §7.3 baseline: bisection on sigma', K = exp(-D / sigma') recomputed at every probe.

    D (the squared distances) is computed once, from X, or taken as given, or recovered from K as
    -sigma log K; each probe is one copy and one fused exp pass over the n x n matrix, followed by the same
    one-step question as :func:`critical_bandwidth`. The bracket starts at [sigma, sigma_max] (the paper used
    sigma_max = 1e6); with ``sigma_max=None`` the upper end is found by doubling sigma (as the walk does).
    Bisection stops when upper - lower <= precision (absolute, as in the paper) or, with ``rtol``,
    when upper - lower <= rtol * lower.

    Parameters
    ----------
    X, labels, K, sigma, sample_weight, limit_checks, dtype, device, verbose
        As for :func:`critical_bandwidth`.
    D : array of shape (n_samples, n_samples), optional
        Squared Euclidean distances, instead of X or K.
    precision : float, default=1e-3
        Absolute precision on sigma'.
    rtol : float, optional
        Relative precision on sigma' (stop at whichever of the two is reached first).
    sigma_max : float, optional
        Initial upper end of the bracket; ``upper = inf`` if no point moves there.

    Returns
    -------
    CriticalBandwidth
        ``n_steps`` counts the exp recomputations (probes).
    """
    t_start = time.perf_counter()
    given = [a is not None for a in (X, K, D)]
    if sum(given) != 1:
        raise ValueError("pass exactly one of X (the data), K (the RBF kernel matrix at sigma) and D (squared "
                         "distances).")
    sigma = _check_positive(sigma, "sigma")
    precision = _check_positive(precision, "precision")
    if rtol is not None:
        rtol = _check_positive(rtol, "rtol")
    if sigma_max is not None:
        sigma_max = _check_positive(sigma_max, "sigma_max")
        if sigma_max <= sigma:
            raise ValueError(f"sigma_max={sigma_max:g} must be > sigma={sigma:g}.")
    source = X if X is not None else (K if K is not None else D)
    backend = resolve_device(device, (source,))
    xp = backend.xp
    with backend.activate():
        source = _validation.check_data(source, backend, name="X" if X is not None else ("K" if K is not None
                                                                                          else "D"),
                                        square=X is None)
        n = source.shape[0]
        labels_h, k = _check_labels(labels, n)
        weights_h = _validation.check_sample_weight(sample_weight, n)
        if K is not None:
            _check_rbf_matrix(source, backend)
            dt = np.dtype(source.dtype)
        elif D is not None:
            dt = _check_walk_dtype(dtype)
            if float(source.min()) < 0:
                raise ValueError("D has negative entries; squared distances are >= 0.")
            _validation.check_symmetric(source, backend)
        else:
            dt = _check_walk_dtype(dtype)
        t_valid = backend.timer()

        layout = _Layout(backend, n, weights_h)
        use_limited = bool(limit_checks) and _worth_limiting(labels_h, k)
        if use_limited:
            perm = argsort_stable(np, labels_h).astype(np.int64)
            layout.order = backend.asarray(perm)
            layout.weights = backend.asarray(weights_h[perm])
        labels_l = layout.from_input(labels_h)
        G, Kw = _alloc_pair(n, dt, backend)        # G = -D / 2 and the probe's K
        if X is not None:
            _matrices.fill_neg_half_distances(G, _matrices.centered_features(source, backend)[layout.order], backend)
        else:
            _matrices.permute_into(G, source, layout.order, backend)
            if K is not None:
                if int((G <= 0).sum()):
                    _warn.warn("K has entries that underflowed to 0; their distances are unknown and taken as "
                               f"-sigma log(tiny) ({_offgrid.exp_log_range(dt):.0f} sigma).", UserWarning)
                xp.maximum(G, _matrices.tiny(dt), out=G)
                xp.log(G, out=G)
                G *= 0.5 * sigma                     # -D / 2 = (sigma / 2) log K
            else:
                G *= -0.5
        zeros = xp.zeros(n, dtype=dt)
        d_max = -2.0 * float(G.min())
        t_kernel = backend.timer()

        question = _offgrid.OneStepQuestion(backend, labels_l, layout.weights, k, limited=use_limited)
        timings = {"validation": t_valid - t_start, "kernel_build": t_kernel - t_valid}
        probes = 0

        def moves_at(s, allow_limited):
            nonlocal probes
            _matrices.rbf_from_neg_half(Kw, G, s, backend, zeros)
            probes += 1
            moved, idx = question.ask(Kw, allow_limited=allow_limited)
            if verbose:
                print(f"[kkmgpu] binary search: sigma'={s:.8g}: {'a point moves' if moved else 'no move'}")
            return moved

        if int((np.bincount(labels_h, minlength=k) > 0).sum()) <= 1:
            return _critical_result(math.inf, sigma, math.inf, 0, question, np.empty(0, np.int64), timings,
                                    t_kernel, t_start, backend, sigma, 0,
                                    "a single non-empty cluster: no point can change cluster")
        _matrices.rbf_from_neg_half(Kw, G, sigma, backend, zeros)
        probes += 1
        n_moved, moved = question.full(Kw)
        if n_moved:
            _warn.warn(f"labels are not a fixed point of kernel k-means at sigma={sigma:g}: {n_moved} points "
                       "move already, so the critical bandwidth is <= sigma (lower=0, upper=sigma).",
                       UserWarning)
            moved_h = np.sort(backend.to_host(layout.order[moved]).astype(np.int64))
            return _critical_result(sigma, 0.0, sigma, probes, question, moved_h, timings, t_kernel, t_start,
                                    backend, sigma, 0, "labels are not a fixed point at sigma")
        lower = sigma
        flat = _offgrid.flat_log(dt)
        if sigma_max is not None:
            if not moves_at(sigma_max, False):
                return _critical_result(math.inf, sigma_max, math.inf, probes, question, np.empty(0, np.int64),
                                        timings, t_kernel, t_start, backend, sigma, 0,
                                        f"no point moves at sigma_max={sigma_max:g}")
            upper = sigma_max
        else:
            upper = 2.0 * sigma
            while not moves_at(upper, False):
                lower = upper
                if d_max / upper < flat:
                    return _critical_result(math.inf, lower, math.inf, probes, question, np.empty(0, np.int64),
                                            timings, t_kernel, t_start, backend, sigma, 0,
                                            f"K is all ones to {dt.name} precision at sigma={upper:.6g}")
                upper *= 2.0
        while upper - lower > precision and not (rtol is not None and upper - lower <= rtol * lower):
            mid = 0.5 * (lower + upper)
            if mid <= lower or mid >= upper:
                break
            if moves_at(mid, True):
                upper = mid
            else:
                lower = mid
        _matrices.rbf_from_neg_half(Kw, G, upper, backend, zeros)
        n_moved, moved = question.full(Kw)
        moved_h = (np.sort(backend.to_host(layout.order[moved]).astype(np.int64)) if n_moved
                   else np.empty(0, np.int64))
        return _critical_result(upper, lower, upper, probes, question, moved_h, timings, t_kernel, t_start, backend,
                                sigma, 0, "" if n_moved else "rounding: the full check at upper found no mover")
