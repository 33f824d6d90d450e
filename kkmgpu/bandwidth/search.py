"""The Off-the-grid search of §7.1 (:func:`search_bandwidth`) and the machinery the searches share: the
starting bandwidth, kernel k-means runs to a fixed point, and the record of the distinct clusterings with their
scores.
"""

from __future__ import annotations

import math
import time
import warnings

import numpy as np

from kkmgpu import _warn
from kkmgpu import _validation

from kkmgpu.bandwidth import matrices as _matrices
from kkmgpu.bandwidth import offgrid as _offgrid
from kkmgpu.bandwidth._checks import MAX_DEPTH, _check_common, _check_depth, _check_positive, _check_walk_dtype
from kkmgpu.bandwidth._layout import _Layout, _alloc_pair
from kkmgpu.bandwidth.critical import bandwidth_lower_bound
from kkmgpu.bandwidth.results import BandwidthClustering, BandwidthSearchResult
from kkmgpu.backend.device import resolve_device
from kkmgpu.engine.dense import DenseKernelOperator
from kkmgpu.engine.lloyd import initial_labels, lloyd
from kkmgpu._progress import check_progress, finish, progress_bar


#: Above this many pairs the 1st percentile of the pairwise squared distances is estimated from a sample.
PERCENTILE_EXACT_MAX_PAIRS = 4_000_000
PERCENTILE_SAMPLE_PAIRS = 1_000_000


def _percentile_sigma(A, backend, rng, q=1.0):
    """The q-th percentile of the pairwise squared distances (pairs i < j): exact for up to
    PERCENTILE_EXACT_MAX_PAIRS pairs, else from PERCENTILE_SAMPLE_PAIRS pairs drawn with ``rng``."""
    xp = backend.xp
    n = A.shape[0]
    pairs = n * (n - 1) // 2
    if pairs <= PERCENTILE_EXACT_MAX_PAIRS:
        a_sq = (A * A).sum(axis=1)
        step = _matrices.tile_rows(n, 8, backend)
        values = []
        for i0 in range(0, n, step):
            i1 = min(n, i0 + step)
            D = _matrices._distance_tile(A, a_sq, i0, i1, xp)
            upper = xp.arange(n)[None, :] > xp.arange(i0, i1)[:, None]
            values.append(backend.to_host(D[upper]))
        d = np.concatenate(values)
    else:
        i = rng.integers(0, n, size=PERCENTILE_SAMPLE_PAIRS)
        j = rng.integers(0, n - 1, size=PERCENTILE_SAMPLE_PAIRS)
        j = j + (j >= i)
        # in chunks: 1M pairs x d features at once would be 6.3 GB per temporary for d = 784
        chunk = max(1, _matrices.tile_rows(A.shape[1], 2 * 8, backend))
        d = np.empty(PERCENTILE_SAMPLE_PAIRS, dtype=np.float64)
        for p0 in range(0, PERCENTILE_SAMPLE_PAIRS, chunk):
            p1 = min(PERCENTILE_SAMPLE_PAIRS, p0 + chunk)
            diff = A[backend.asarray(i[p0:p1])] - A[backend.asarray(j[p0:p1])]
            d[p0:p1] = backend.to_host((diff * diff).sum(axis=1))
    value = float(np.percentile(d, q))
    if value <= 0:
        positive = d[d > 0]
        if positive.size == 0:
            raise ValueError("every pair of points coincides; there is no bandwidth to search.")
        _warn.warn(f"at least {q:g}% of the point pairs are duplicates (squared distance 0); sigma0 is the "
                   f"{q:g}th percentile of the positive squared distances instead.", UserWarning)
        value = float(np.percentile(positive, q))
    return value


# --- shared machinery: kernel k-means runs, scoring ----------------------------------------------------


def _canonical(labels_h):
    """Labels renumbered by first appearance: equal for the same partition under any label permutation."""
    _, first, inverse = np.unique(labels_h, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return rank[inverse.ravel()]


class _Recorder:
    """Distinct clusterings with their scores, the evaluations, costs and timings of one search."""

    def __init__(self, X, k, backend, y_true, method, parameter, bar=None):
        self.X = X
        self.bar = progress_bar(desc="", enabled=False) if bar is None else bar
        self.k = k
        self.backend = backend
        self.y_true = y_true
        self.method = method
        self.parameter = parameter
        self.clusterings = []
        self.keys = {}
        self.evaluations = []
        self.brackets = []
        self.warnings = []
        self.timings = {"validation": 0.0, "kernel_build": 0.0, "walk": 0.0, "kernel_kmeans": 0.0, "scoring": 0.0}
        self.costs = {"kernel_builds": 0, "fused_steps": 0, "full_checks": 0, "limited_checks": 0,
                      "limited_checks_decisive": 0, "relayouts": 0, "kernel_kmeans_runs": 0,
                      "kernel_kmeans_iterations": 0, "rebuilds": 0}
        self._scorer = None

    def _cnnc(self, labels_h):
        if self._scorer is None:
            try:
                from kkmgpu.metrics.cnnc import CnncScorer
                self._scorer = CnncScorer(self.X, self.backend)
            except ImportError:  # the public function is the contract; the scorer reuses the neighbour order
                from kkmgpu.metrics import cnnc
                self._scorer = lambda labels, k: cnnc(self.X, labels, k, device=self.backend.name)
        return float(self._scorer(labels_h, self.k))

    def record(self, value, labels_h, run, depth, seconds, *, sigma=None, gamma=None, degree=None):
        """Add one kernel k-means result; returns its clustering index."""
        key = _canonical(labels_h).tobytes()
        new = key not in self.keys
        if new:
            t0 = time.perf_counter()
            score = self._cnnc(labels_h)
            nmi = None
            if self.y_true is not None:
                from kkmgpu.metrics import nmi as _nmi
                nmi = float(_nmi(self.y_true, labels_h))
            self.timings["scoring"] += time.perf_counter() - t0
            labels_ro = labels_h.copy()
            labels_ro.flags.writeable = False
            self.keys[key] = len(self.clusterings)
            self.clusterings.append(BandwidthClustering(
                sigma=sigma, gamma=gamma, labels=labels_ro, objective=float(run.objective), cnnc=score, nmi=nmi,
                n_iter=int(run.n_iter), depth=int(depth), converged=bool(run.converged), degree=degree))
        index = self.keys[key]
        self.evaluations.append({"value": float(value), "clustering": index, "depth": int(depth),
                                 "seconds": float(seconds), "new": new})
        self.bar.update()
        best = self.clusterings[self.best_index()]
        self.bar.set_postfix_str(f"{self.parameter} {value:.4g}, {len(self.clusterings)} clusterings, "
                                 f"best c-NNC {best.cnnc:.4f}")
        return index

    def best_index(self):
        return min(range(len(self.clusterings)),
                   key=lambda i: (self.clusterings[i].cnnc, self.clusterings[i].objective))

    def add_question(self, question):
        self.costs["full_checks"] += question.n_full
        self.costs["limited_checks"] += question.n_limited
        self.costs["limited_checks_decisive"] += question.n_limited_decisive

    def result(self, initial_labels, start, n, device, dtype, t_start):
        finish(self.bar)  # max_values is a cap: the bar ends at the runs made
        self.timings["total"] = time.perf_counter() - t_start
        if self.warnings:
            from kkmgpu.engine.lloyd import ConvergenceWarning
            _warn.warn(f"{self.method} search: {len(self.warnings)} kernel k-means runs did not reach a fixed "
                       "point; increase max_iter.", ConvergenceWarning)
        init = np.asarray(initial_labels, dtype=np.int32).copy()
        init.flags.writeable = False
        return BandwidthSearchResult(
            method=self.method, parameter=self.parameter, clusterings=tuple(self.clusterings),
            best_index=self.best_index(), evaluations=tuple(self.evaluations), brackets=tuple(self.brackets),
            initial_labels=init, start=float(start), timings=dict(self.timings), costs=dict(self.costs),
            n_samples=n, n_clusters=self.k, device=device, dtype=dtype, warnings=tuple(self.warnings))


def _run_kernel_kmeans(K, weights, labels_l, k, backend, max_iter, tol, recorder, verbose=False):
    """Kernel k-means on K from ``labels_l`` until no point moves: Lloyd with ``tol``, then continued with
    tol=0 when it stopped on the objective (a fixed point is what the critical value refers to)."""
    t0 = time.perf_counter()
    operator = DenseKernelOperator(K, weights, backend)
    run = lloyd(operator, labels_l, k, max_iter=max_iter, tol=tol, verbose=verbose)
    iterations = run.n_iter
    if run.stop_reason != "no point moved":
        more = lloyd(operator, run.labels, k, max_iter=max_iter, tol=0.0, verbose=verbose)
        iterations += more.n_iter
        more.n_iter = iterations
        run = more
    if not run.converged:
        recorder.warnings.append(f"kernel k-means did not reach a fixed point in max_iter={max_iter} steps")
    recorder.costs["kernel_kmeans_runs"] += 1
    recorder.costs["kernel_kmeans_iterations"] += int(iterations)
    seconds = backend.timer() - t0
    recorder.timings["kernel_kmeans"] += seconds
    return run, seconds


def _prepare(X, k, device, dtype, sample_weight, y_true, random_state, init):
    backend = resolve_device(device, (X,))
    dt = _check_walk_dtype(dtype)
    rng = _validation.make_rng(random_state)
    with backend.activate():
        X = _validation.check_data(X, backend)
        n = X.shape[0]
        k = _validation.check_k(k, n)
        if n < 2:
            raise ValueError(f"X has {n} row; a bandwidth search needs at least 2 points.")
        weights_h = _validation.check_sample_weight(sample_weight, n)
        if (weights_h > 0).sum() < k:
            raise ValueError(f"only {(weights_h > 0).sum()} samples have a positive sample_weight; "
                             f"at least k={k} are required.")
        if isinstance(init, str) and init not in _validation.INIT_NAMES:
            raise ValueError(f"init={init!r} is not valid; use one of {list(_validation.INIT_NAMES)} or an "
                             "array of labels.")
        init, _ = _validation.check_init(init, n, k, 1)
        if y_true is not None:
            y_true = (y_true.get() if hasattr(y_true, "get") and not isinstance(y_true, np.ndarray)
                      else np.asarray(y_true))
            if y_true.ndim != 1 or y_true.shape[0] != n:
                raise ValueError(f"y_true has shape {y_true.shape}; expected ({n},), one label per sample.")
    return backend, dt, rng, X, n, k, weights_h, init, y_true


# --- the search of §7.1 ----------------------------------------------------------------------------------

def search_bandwidth(X, k, *, sigma0="percentile", depth=1, refine_depth=2, max_values=50, init="random",
                     sample_weight=None, y_true=None, max_iter=300, tol=1e-6, random_state=None, device="auto",
                     dtype="float64", limit_checks=True, max_sigma=None, verbose=False,
                     progress=False) -> BandwidthSearchResult:
    """The Off-the-grid search (paper §7.1): every distinct kernel k-means clustering along the critical
    bandwidths, scored by c-NNC, refined around the best.

    1. K at sigma0; kernel k-means from the initial partition.
    2. Main path: :func:`critical_bandwidth`'s walk at ``depth`` from the current clustering finds the next
       bandwidth at which a point moves; kernel k-means from the current labels runs to convergence there;
       repeat until the cap (K all ones to precision, or ``max_sigma``) or ``max_values`` runs.
    3. Refinement, for depth d = depth + 1 .. refine_depth: around the best clustering so far (lowest
       c-NNC), kernel k-means at its sigma from the initial partition, then the walk at depth d from that
       clustering up to the sigma of the run that followed the best on the coarser path (§6.2's
       hierarchical search, as in the paper's published experiments).

    Every kernel k-means run goes to a fixed point (no point moves): Lloyd with ``tol``, continued with
    tol=0 if it stopped on the objective. Every distinct partition is scored once by
    :func:`kkmgpu.metrics.cnnc` (and NMI with ``y_true``).

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
    k : int
    sigma0 : "percentile", "bound" or float, default="percentile"
        Starting bandwidth: the 1st percentile of the pairwise squared distances (the paper's choice;
        exact for up to 4 million pairs, else estimated from 1 million pairs drawn with ``random_state``),
        Theorem 1's bound (:func:`bandwidth_lower_bound`), or a number.
    depth : int, default=1
        Walk depth of the main path (1: the next critical value to within a factor 2).
    refine_depth : int, default=2
        Last depth of the hierarchical refinement (no refinement when <= depth).
    max_values : int, default=50
        Cap on the kernel k-means runs of the whole search.
    init : "random", "k-means++" or array of shape (n_samples,), default="random"
        The initial partition shared by every start (k-means++ seeds in the feature space at sigma0).
    sample_weight, y_true : arrays of shape (n_samples,), optional
    max_iter, tol : as for :func:`kkmgpu.fit`.
    random_state : int, Generator or None
    device : {"auto", "cpu", "cuda", "cuda:N"}
    dtype : {"float64", "float32"}, default="float64"
        Precision of K and K'.
    limit_checks : bool, default=True
        §6.2's limited checks where they save reads (same answers).
    max_sigma : float, optional
        Do not probe beyond this bandwidth.
    verbose : bool
        Print every step of the search.
    progress : bool, default=False
        A progress bar over the kernel k-means runs (of at most ``max_values``); tqdm when installed.

    Returns
    -------
    BandwidthSearchResult

    Raises
    ------
    ValueError, TypeError
        Bad data or parameters (the message names the value and the rule).
    InsufficientMemoryError
        If K and K' do not fit the device.

    Notes
    -----
    ``kkmgpu.fit(X, k, gamma="search")`` (and ``KernelKMeans(gamma="search")``, ``kkmgpu fit --gamma search``)
    runs this search with the fit's ``init``, ``dtype``, ``random_state``, ``sample_weight``, ``max_iter``,
    ``tol`` and ``device``, and every other parameter at its default here. The fit's defaults are
    ``init="k-means++"`` and ``dtype="float32"``, where this function defaults to the paper's random partition
    and float64: the initial partition decides which clusterings the walk meets, and the precision decides
    where it stops (K all ones to precision). ``search_bandwidth(X, k, init="k-means++", dtype="float32",
    random_state=s)`` is exactly the search of ``fit(X, k, gamma="search", random_state=s)``: the same
    clusterings, the same best sigma and labels; ``fit(..., gamma="search", init="random", dtype="float64")``
    is this function's default search. ``random_state`` is consumed the same way by both (the percentile
    sample above 4 million pairs, then the initial partition).

    Examples
    --------
    >>> import kkmgpu
    >>> X, y = kkmgpu.datasets.make_two_circles(300, random_state=0)
    >>> res = kkmgpu.search_bandwidth(X, 2, y_true=y, random_state=0, device="cpu")   # doctest: +SKIP
    >>> print(res.summary())                                                           # doctest: +SKIP
    """
    t_start = time.perf_counter()
    depth = _check_depth(depth)
    refine_depth = _validation.check_int(refine_depth, "refine_depth", minimum=0, maximum=MAX_DEPTH)
    max_iter, tol, max_values = _check_common(max_iter, tol, max_values)
    if max_sigma is not None:
        max_sigma = _check_positive(max_sigma, "max_sigma")
    if not (isinstance(sigma0, str) and sigma0 in ("percentile", "bound")):
        if isinstance(sigma0, str):
            raise ValueError(f"sigma0={sigma0!r} is not valid; use 'percentile', 'bound' or a number > 0.")
        sigma0 = _check_positive(sigma0, "sigma0")
    backend, dt, rng, X, n, k, weights_h, init, y_true = _prepare(X, k, device, dtype, sample_weight, y_true,
                                                                   random_state, init)
    xp = backend.xp
    rec = _Recorder(X, k, backend, y_true, "offgrid", "sigma",
                    progress_bar(max_values, desc="bandwidth search", unit="run", enabled=check_progress(progress)))
    with backend.activate():
        A0 = _matrices.centered_features(X, backend)
        if sigma0 == "percentile":
            sigma0 = _percentile_sigma(A0, backend, rng)
        elif sigma0 == "bound":
            sigma0 = bandwidth_lower_bound(X, device=backend.name)
        rec.timings["validation"] = time.perf_counter() - t_start
        K, Kp = _alloc_pair(n, dt, backend)
        layout = _Layout(backend, n, weights_h)

        def build(s):
            t0 = time.perf_counter()
            info = _offgrid.BaseInfo(s, *_matrices.fill_rbf(K, A0[layout.order], s, backend))
            rec.costs["kernel_builds"] += 1
            rec.timings["kernel_build"] += backend.timer() - t0
            return info

        def rebuild(Kbuf, s):
            rec.costs["rebuilds"] += 1
            return build(s)

        info = build(sigma0)
        labels0 = initial_labels(init, n, k, rng, DenseKernelOperator(K, layout.weights, backend))
        labels0 = np.asarray(labels0, dtype=np.int32)
        if verbose:
            print(f"[kkmgpu] search: sigma0={sigma0:.6g}, n={n}, k={k}, {backend.name}, {dt.name}")

        def path(sigma, labels_l, info, walk_depth, stop=math.inf):
            """Walk, run, record, repeat; returns the number of runs made."""
            runs = 0
            while len(rec.evaluations) < max_values:
                t0 = time.perf_counter()
                limited = bool(limit_checks) and walk_depth > 1   # depth 1 has no bisection step to limit
                labels_l = layout.regroup(K, Kp, labels_l, k, limited, rec.costs)
                question = _offgrid.OneStepQuestion(backend, labels_l, layout.weights, k, limited=limited)
                if int((np.bincount(backend.to_host(labels_l), minlength=k) > 0).sum()) <= 1:
                    break
                beyond = _offgrid.linear_regime_sigma(A0[layout.order], labels_l, layout.weights, k, backend)
                outcome = _offgrid.walk_rbf(K, Kp, question, sigma, walk_depth, backend, info=info, rebuild=rebuild,
                                            max_sigma=max_sigma, no_move_beyond=beyond, verbose=verbose)
                info = outcome.info
                rec.add_question(question)
                rec.costs["fused_steps"] += outcome.n_steps
                rec.timings["walk"] += backend.timer() - t0
                if not outcome.found:
                    if verbose:
                        print(f"[kkmgpu] search: stop, {outcome.capped}")
                    break
                lower, upper = outcome.base / outcome.e_lower, outcome.base / outcome.e_upper
                rec.brackets.append((lower, upper, walk_depth))
                if upper > stop * (1 + 1e-12):
                    break
                run, _ = _run_kernel_kmeans(K, layout.weights, labels_l, k, backend, max_iter, tol, rec)
                labels_l = run.labels
                index = rec.record(upper, layout.to_input(labels_l), run, walk_depth, backend.timer() - t0,
                                   sigma=upper, gamma=1.0 / upper)
                runs += 1
                sigma = upper
                if verbose:
                    c = rec.clusterings[index]
                    print(f"[kkmgpu] search: sigma={upper:.6g} (critical in [{lower:.6g}, {upper:.6g}]): "
                          f"clustering {index}, c-NNC {c.cnnc:.4f}, {run.n_iter} iterations")
            return runs

        # 1. the run at sigma0, 2. the main path
        run, seconds = _run_kernel_kmeans(K, layout.weights, layout.from_input(labels0), k, backend, max_iter,
                                          tol, rec)
        rec.record(sigma0, layout.to_input(run.labels), run, 0, seconds, sigma=sigma0, gamma=1.0 / sigma0)
        path(sigma0, run.labels, info, depth)

        # 3. hierarchical refinement around the best
        for d in range(depth + 1, refine_depth + 1):
            if len(rec.evaluations) >= max_values:
                break
            best = rec.best_index()
            evals = sorted(rec.evaluations, key=lambda e: e["value"])
            values_best = [e["value"] for e in evals if e["clustering"] == best]
            sigma_best = values_best[0]
            after = [e["value"] for e in evals if e["value"] > values_best[-1] * (1 + 1e-12)]
            stop = after[0] if after else math.inf
            layout = _Layout(backend, n, weights_h)
            info = build(sigma_best)
            run, seconds = _run_kernel_kmeans(K, layout.weights, layout.from_input(labels0), k, backend, max_iter,
                                              tol, rec)
            rec.record(sigma_best, layout.to_input(run.labels), run, d, seconds, sigma=sigma_best,
                       gamma=1.0 / sigma_best)
            if verbose:
                print(f"[kkmgpu] search: refinement at depth {d} in [{sigma_best:.6g}, {stop:.6g}]")
            path(sigma_best, run.labels, info, d, stop=stop)
        del K, Kp
    return rec.result(labels0, sigma0, n, backend.name, dt.name, t_start)
