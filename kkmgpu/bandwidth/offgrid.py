"""Internals of the Off-the-grid bandwidth search (papers/off-the-grid-bandwidth-search.txt).

The paper's RBF kernel is k(x, y) = exp(-||x - y||^2 / sigma), so gamma = 1 / sigma. For a kernel matrix
K_sigma and a larger bandwidth sigma', kappa_sigma' = kappa_sigma ** p with p = sigma / sigma' in (0, 1)
(paper §5.1), so every K_sigma' is an element-wise power of K_sigma. The dyadic walk of Algorithm 2 keeps
two n x n arrays, K = K_base ** e and K' = K_base ** (2 ** -j), and moves the exponent e by +-2^-j per step
with one fused pass (``ops.offgrid_step``: K' <- sqrt(K'); K <- K / K' or K * K').

Direction of the steps. A smaller exponent e is a larger sigma'. If no point moves at the current e, the
critical value lies at a larger sigma', so e must decrease: K <- K / K'. If a point moves, e must increase
again: K <- K * K'. The paper's pseudocode (Algorithm 2, lines 6-9) writes the branches the other way round
("if P' != P then K <- K / K'"), which would walk towards *smaller* bandwidths; its published code
(``square_search_fast``) divides when there was no change, as here. The pseudocode's branches are the right
ones for the polynomial degree (§6.3), whose exponent d' / d grows with the parameter; :func:`walk` takes the
direction as an argument.

What one step asks (§6.2). Would one kernel k-means assignment step from the partition move any point?
The full check is the Lloyd driver's own assignment (cluster sums over all of K, ``ops.assign_labels``).
The limited check looks only at candidate points (smallest gap between their own and their second-best
cluster at the last full check, plus the points that moved at the last observed change): it needs the
within-cluster totals C_c (the diagonal blocks of K, contiguous because K is held in cluster order) and
the candidates' rows. A candidate counts as moving only when another cluster is nearer by a margin that
covers the rounding difference between the two computations; otherwise, and whenever no candidate moves,
the full check decides. So the limited check never answers differently from the full check; it only saves
the reads of the full pass when a candidate clearly moves.
"""

from __future__ import annotations

import math
import time

import numpy as np

from kkmgpu.bandwidth.matrices import tile_rows, tiny
from kkmgpu.backend.device import Backend, argsort_stable
from kkmgpu.engine.dense import DenseKernelOperator
from kkmgpu.engine.lloyd import _totals

#: Limited checks are used in a walk only where their expected reads (the diagonal blocks plus the
#: candidates' rows) are below this fraction of one full pass; tests set it high to force them.
LIMITED_CHECK_MAX_COST = 0.5
#: A point counts as moving (in a full or a limited check) only if another cluster is nearer by this much
#: relative to the size of its distance terms; both checks accumulate in float64, so rounding is ~n * 1e-16.
LIMITED_CHECK_RTOL = 1e-9


def exp_log_range(dtype) -> float:
    """-log(tiny): kernel values exp(-t) with t beyond this underflow in ``dtype``."""
    return -math.log(tiny(dtype))


def negligible_log(dtype) -> float:
    """t such that exp(-t) is negligible next to K's unit diagonal: 1e-3 of the dtype's epsilon."""
    return -math.log(np.finfo(dtype).eps * 1e-3)


def flat_log(dtype) -> float:
    """max_ij D_ij / sigma below which K is all ones to the dtype's precision for the walk's purpose.

    sqrt(eps): K_ij = 1 - D_ij / sigma + ..., so the distances are resolved to about sqrt(eps) relative;
    beyond it kernel k-means on K is numerically linear k-means and rounding decides the assignments.
    """
    return math.sqrt(float(np.finfo(dtype).eps))


def linear_regime_sigma(A, labels, weights, k: int, backend: Backend):
    """A bandwidth beyond which no kernel k-means step from ``labels`` moves any point, or None.

    For t >= 0, exp(-t) = 1 - t + R with 0 <= R <= t^2 / 2. Put into dist(i, c) = 1 - 2 sum_j w_j K_ij / n_c
    + sum_jl w_j w_l K_jl / n_c^2 this gives sigma dist(i, c) = 2 ||x_i - m_c||^2 + r with
    |r| <= 1.5 Dmax^2 / sigma (m_c the weighted mean in input space, Dmax the largest squared distance).
    So if ``labels`` is a strict fixed point of plain k-means with smallest gap
    g = min_i min_(c != own) ||x_i - m_c||^2 - ||x_i - m_own||^2 > 0, no point moves at any
    sigma >= 0.75 Dmax^2 / g. Returned with Dmax bounded by 4 max ||x_i - mean||^2 and the factor 0.75
    rounded up to 1; None when the partition is not a strict fixed point (then a move exists at large sigma).
    """
    xp = backend.xp
    n = A.shape[0]
    labels64 = labels.astype(xp.int64)
    Y = xp.zeros((n, k), dtype=xp.float64)
    Y[xp.arange(n), labels64] = weights
    sizes = backend.to_host(Y.sum(axis=0))
    nonempty = sizes > 0
    if int(nonempty.sum()) < 2:
        return None
    means = (Y.T @ A) / backend.asarray(np.where(nonempty, sizes, 1.0))[:, None]
    a_sq = (A * A).sum(axis=1)
    d2 = a_sq[:, None] - 2.0 * (A @ means.T) + (means * means).sum(axis=1)[None, :]
    d2 = xp.where(backend.asarray(nonempty)[None, :], d2, xp.inf)
    own = xp.take_along_axis(d2, labels64[:, None], axis=1)[:, 0]
    d2[xp.arange(n), labels64] = xp.inf
    gap = float((d2.min(axis=1) - own).min())
    d_max = 4.0 * float(a_sq.max())
    if not (gap > 1e-9 * d_max):
        return None
    return d_max * d_max / gap


# --- the one-step question ----------------------------------------------------------------------------

class OneStepQuestion:
    """Would one kernel k-means assignment step from ``labels`` move any point, for the current K?

    Parameters
    ----------
    backend : Backend
    labels : device int32 array (n,)
        The partition; non-decreasing when ``limited`` (K is held in cluster order).
    weights : device float64 array (n,)
    k : int
    limited : bool
        Allow limited checks (§6.2) where they are expected to save reads.
    """

    def __init__(self, backend: Backend, labels, weights, k: int, *, limited: bool):
        xp = backend.xp
        self.backend = backend
        self.labels = labels
        self.weights = weights
        self.k = int(k)
        self.n = int(labels.shape[0])
        labels_h = backend.to_host(labels).astype(np.int64)
        weights_h = backend.to_host(weights).astype(np.float64)
        self.sizes = np.bincount(labels_h, weights=weights_h, minlength=self.k).astype(np.float64)
        counts = np.bincount(labels_h, minlength=self.k)
        self.n_candidates = int(min(self.n, max(32, self.n // (4 * max(1, self.k)))))
        cost = (float(np.sum(counts.astype(np.float64) ** 2)) + self.n_candidates * self.n) / max(1, self.n) ** 2
        self.limited = bool(limited) and self.k > 1 and cost < LIMITED_CHECK_MAX_COST
        if self.limited and labels_h.size > 1 and (np.diff(labels_h) < 0).any():
            raise AssertionError("limited checks need K and the labels in cluster order")
        self.starts = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        self.candidates = None      # device int64 indices, from the last full check
        self.last_moved = None      # device indices that moved at the last observed change
        self.n_full = 0
        self.n_limited = 0
        self.n_limited_decisive = 0
        self.seconds = 0.0
        self._indicator = None
        self.xp = xp

    # distances d(i, c) = K_ii - 2 S_ic / n_c + C_c / n_c^2 for the rows of S (empty clusters: +inf)
    def _distances(self, S, diag, within):
        xp = self.xp
        nonempty = self.sizes > 0
        inv = np.where(nonempty, 1.0 / np.where(nonempty, self.sizes, 1.0), 0.0)
        offset = np.where(nonempty, within * inv * inv, np.inf)
        inv_d = self.backend.asarray(inv)
        offset_d = self.backend.asarray(offset)
        terms = 2.0 * xp.abs(S) * inv_d[None, :] + xp.abs(xp.where(xp.isfinite(offset_d), offset_d, 0.0))[None, :]
        dist = diag[:, None] - 2.0 * S * inv_d[None, :] + offset_d[None, :]
        return dist, terms

    def full(self, K):
        """The Lloyd driver's assignment step over all points: (n_moved, moved indices)."""
        xp = self.xp
        t0 = time.perf_counter()
        operator = DenseKernelOperator(K, self.weights, self.backend)
        S = operator.cluster_sums(self.labels, self.k)
        sizes, within, _ = _totals(operator, S, self.labels, self.k, xp)
        new_labels, _, n_moved = self.backend.ops.assign_labels(S, operator.diag, sizes, within, self.labels)
        moved = xp.flatnonzero(new_labels != self.labels) if n_moved else None
        if moved is not None:
            moved = self._clear_moves(moved, S[moved], operator.diag[moved].astype(xp.float64), within)
            n_moved = 0 if moved is None else int(moved.shape[0])
        self.n_full += 1
        if self.limited:
            dist, _ = self._distances(S, operator.diag, within)
            own = xp.take_along_axis(dist, self.labels[:, None].astype(xp.int64), axis=1)[:, 0]
            dist[xp.arange(self.n), self.labels] = xp.inf
            gap = dist.min(axis=1) - own
            self.candidates = argsort_stable(xp, gap)[:self.n_candidates]
        self.seconds += time.perf_counter() - t0
        return int(n_moved), moved

    def _clear_moves(self, rows, S, diag, within):
        """The ``rows`` (with their cluster sums S and K_ii) whose nearest other cluster is nearer than their own
        by more than the rounding level, else None. The assignment step moves a point on any difference; an
        exact tie (a point as near to two clusters) is broken by the lowest index on the CPU, but a GPU's
        atomic accumulation sums the two clusters in different orders, so without the margin a tie would move
        on one device and stay on the other, and the bandwidth found would hang on rounding."""
        xp = self.xp
        dist, terms = self._distances(S, diag, within)
        own = xp.take_along_axis(dist, self.labels[rows].astype(xp.int64)[:, None], axis=1)[:, 0]
        margin = LIMITED_CHECK_RTOL * (xp.abs(diag) + terms.max(axis=1))
        clear = dist.min(axis=1) < own - margin
        return rows[clear] if bool(clear.any()) else None

    def _within_totals(self, K):
        """C_c = sum_{i, j in c} w_i w_j K_ij from the diagonal blocks of K (cluster order), float64 host (k,)."""
        xp = self.xp
        out = xp.zeros(self.k, dtype=xp.float64)
        for c in range(self.k):
            a, b = int(self.starts[c]), int(self.starts[c + 1])
            if b <= a:
                continue
            w = self.weights[a:b]
            step = tile_rows(b - a, 8, self.backend)
            for r0 in range(a, b, step):
                r1 = min(b, r0 + step)
                block = K[r0:r1, a:b].astype(xp.float64)
                out[c] += self.weights[r0:r1] @ (block @ w)
        return self.backend.to_host(out)

    def _rows_cluster_sums(self, K, rows):
        """S[rows, c] = sum_{j in c} w_j K[rows, j], float64 accumulation, in row tiles."""
        xp = self.xp
        if self._indicator is None:
            Y = xp.zeros((self.n, self.k), dtype=xp.float64)
            Y[xp.arange(self.n), self.labels] = self.weights
            self._indicator = Y
        out = xp.empty((rows.shape[0], self.k), dtype=xp.float64)
        step = tile_rows(self.n, 8 + K.dtype.itemsize, self.backend)
        for r0 in range(0, rows.shape[0], step):
            r1 = min(rows.shape[0], r0 + step)
            out[r0:r1] = K[rows[r0:r1]].astype(xp.float64) @ self._indicator
        return out

    def limited_check(self, K):
        """Moved candidate indices (a non-empty device array) when one clearly moves, else None."""
        xp = self.xp
        if self.candidates is None:
            return None
        t0 = time.perf_counter()
        cand = self.candidates
        if self.last_moved is not None:
            cand = xp.unique(xp.concatenate([cand, self.last_moved.astype(cand.dtype)]))
        within = self._within_totals(K)
        S = self._rows_cluster_sums(K, cand)
        diag = xp.diagonal(K)[cand].astype(xp.float64)
        dist, terms = self._distances(S, diag, within)
        moved = self._clear_moves(cand, S, diag, within)
        self.n_limited += 1
        if moved is not None:
            self.n_limited_decisive += 1
        self.seconds += time.perf_counter() - t0
        return moved

    def ask(self, K, *, allow_limited=True):
        """(moved?, moved indices or None). Limited first where allowed, the full check otherwise or after."""
        if allow_limited and self.limited:
            moved = self.limited_check(K)
            if moved is not None:
                self.last_moved = moved
                return True, moved
        n_moved, moved = self.full(K)
        if n_moved:
            self.last_moved = moved
            return True, moved
        return False, None


# --- the dyadic walk (Algorithm 2) -------------------------------------------------------------------

class WalkOutcome:
    """What one walk found: the bracket of exponents relative to ``base`` and the bookkeeping."""

    __slots__ = ("base", "e_lower", "e_upper", "found", "moved", "n_steps", "n_rebuilds", "capped",
                 "at_upper", "warnings", "info", "depth")

    def __init__(self):
        self.base = None
        self.e_lower = 1.0
        self.e_upper = None
        self.found = False
        self.moved = None
        self.n_steps = 0
        self.n_rebuilds = 0
        self.capped = ""
        self.at_upper = False
        self.warnings = []
        self.info = None
        self.depth = None


class BaseInfo:
    """What is known about the base matrix of a walk: the sigma it was built at, whether entries were
    clamped (underflow), and max_ij D_ij / sigma_build when nothing was clamped."""

    def __init__(self, sigma_build, n_clamped, smallest):
        self.sigma_build = float(sigma_build)
        self.n_clamped = int(n_clamped)
        self.log_range = -math.log(smallest) if (n_clamped == 0 and smallest > 0) else None


def walk_rbf(K, Kp, question: OneStepQuestion, sigma: float, depth: int, backend: Backend, *, info: BaseInfo,
             rebuild=None, max_sigma=None, no_move_beyond=None, verbose=False) -> WalkOutcome:
    """Algorithm 2 for the RBF bandwidth, from K = Kp = K_sigma at which no point moves.

    Doubling phase: probe e = 1/2 (sigma' = 2 sigma_base); while no point moves the probe becomes the new
    base (K = K' = K_base^(1/2) already: no copy). Bisection phase: ``depth - 1`` more steps in [1/2, 1],
    so that the final bracket of exponents has width 2^-depth. On return K holds K_base ** e_upper (the
    smallest probed bandwidth at which a point moves) when one was found.

    ``rebuild(K, sigma)`` refills K from the data (returns a new :class:`BaseInfo`) when entries that were
    clamped at the build could matter at the next probes; without it a warning says so once.
    ``no_move_beyond`` (from :func:`linear_regime_sigma`) ends the doubling once the next probe lies where
    no point can move.
    """
    xp = backend.xp
    dt = K.dtype
    out = WalkOutcome()
    base = float(sigma)
    flat = flat_log(dt)
    safe = exp_log_range(dt) / (2.0 * negligible_log(dt))  # base / sigma_build below which clamping is harmless
    warned = False
    while True:
        if no_move_beyond is not None and 2.0 * base >= no_move_beyond:
            out.capped = (f"no point moves at any sigma' >= {no_move_beyond:.6g}: the partition is a strict fixed "
                          "point of plain k-means, which kernel k-means approaches as sigma grows")
            break
        if info.log_range is not None and info.log_range * info.sigma_build / base < flat:
            out.capped = (f"K is all ones to {np.dtype(dt).name} precision at sigma={base:.6g} "
                          f"(max D / sigma = {info.log_range * info.sigma_build / base:.3g})")
            break
        if max_sigma is not None and 2.0 * base > max_sigma:
            out.capped = f"the next probe 2 * {base:.6g} exceeds max_sigma={max_sigma:.6g}"
            break
        if info.n_clamped and base / info.sigma_build >= safe:
            if rebuild is not None:
                info = rebuild(K, base)
                xp.copyto(Kp, K)
                out.n_rebuilds += 1
            elif not warned:
                warned = True
                msg = (f"{info.n_clamped} entries of K were below the smallest normal {np.dtype(dt).name} at "
                       f"sigma={info.sigma_build:.6g}; from sigma'={base:.6g} on their true values may exceed "
                       f"exp(-{negligible_log(dt):.0f}) and are not known. Pass X instead of K to rebuild.")
                out.warnings.append(msg)
            if rebuild is None and info.log_range is None:
                # the cap needs max D / sigma: read K's smallest entry once per level
                smallest = float(K.min())
                if smallest > 0 and -math.log(smallest) < flat:
                    out.capped = f"K is all ones to {np.dtype(dt).name} precision at sigma={base:.6g}"
                    break
        backend.ops.offgrid_step(K, Kp, True)        # K = K' = K_base ** (1/2)
        out.n_steps += 1
        moved, idx = question.ask(K, allow_limited=False)
        if verbose:
            print(f"[kkmgpu] walk: sigma'={2 * base:.6g} (doubling): {'a point moves' if moved else 'no move'}")
        if moved:
            out.moved = idx
            break
        base *= 2.0
    out.base = base
    out.info = info
    if out.capped:
        return out
    e, e_no, e_yes, last = 0.5, 1.0, 0.5, True
    for j in range(2, depth + 1):
        divide = not last
        backend.ops.offgrid_step(K, Kp, divide)      # K' = K_base ** 2^-j
        e = e - 2.0 ** -j if divide else e + 2.0 ** -j
        out.n_steps += 1
        last, idx = question.ask(K, allow_limited=True)
        if last:
            e_yes, out.moved = e, idx
        else:
            e_no = e
        if verbose:
            print(f"[kkmgpu] walk: sigma'={base / e:.6g} (e={e:g}): {'a point moves' if last else 'no move'}")
    if not last:
        xp.divide(K, Kp, out=K)                      # back to K_base ** e_yes (e_yes = e_no - 2^-depth)
    out.found = True
    out.at_upper = True
    out.e_lower, out.e_upper = e_no, e_yes
    return out


def walk_degree(K, Kp, question: OneStepQuestion, degree: float, depth: int, backend: Backend, *,
                max_degree=None, max_width=None, verbose=False) -> WalkOutcome:
    """Algorithm 2 for the polynomial degree (§6.3): K_d' = B ** d' = K_d ** (d' / d), exponent q = d' / d > 1.

    Doubling phase: probe q = 2 (K <- K * K'); while no point moves the probe becomes the new base (K' <- K).
    Bisection phase: ``depth - 1`` steps in [1, 2] (final width 2^(1 - depth) in q, base 2^(1 - depth) in
    degrees). With ``max_width`` the depth is raised, once the doubling has fixed the base, until the final
    bracket is at most ``max_width`` degrees wide (the integer degree search passes 1); ``out.depth`` is the
    depth used. Here a move means the degree is too large, so the step divides after a move and multiplies
    otherwise (the branches of the paper's pseudocode). On return K holds K_base ** q_upper when a move was
    found.
    """
    xp = backend.xp
    dt = K.dtype
    floor = tiny(dt)
    out = WalkOutcome()
    base = float(degree)
    while True:
        if max_degree is not None and 2.0 * base > max_degree:
            out.capped = f"the next probe 2 * {base:g} exceeds max_degree={max_degree:g}"
            break
        xp.multiply(K, Kp, out=K)                    # K = K_base ** 2
        out.n_steps += 1
        if not bool(xp.isfinite(K).all()):
            out.capped = f"B ** {2 * base:g} overflows {np.dtype(dt).name}"
            break
        moved, idx = question.ask(K, allow_limited=False)
        if verbose:
            print(f"[kkmgpu] walk: degree {2 * base:g} (doubling): {'a point moves' if moved else 'no move'}")
        if moved:
            out.moved = idx
            break
        base *= 2.0
        xp.maximum(K, floor, out=K)                  # no zeros in the new base: sqrt(0) would give 0 / 0
        xp.copyto(Kp, K)
    out.base = base
    if max_width is not None and base > max_width:
        depth = max(depth, 1 + math.ceil(math.log2(base / max_width)))
    out.depth = depth
    if out.capped:
        return out
    q, q_no, q_yes, last = 2.0, 1.0, 2.0, True
    for j in range(1, depth):
        divide = last
        backend.ops.offgrid_step(K, Kp, divide)      # K' = K_base ** 2^-j
        q = q - 2.0 ** -j if divide else q + 2.0 ** -j
        out.n_steps += 1
        last, idx = question.ask(K, allow_limited=True)
        if last:
            q_yes, out.moved = q, idx
        else:
            q_no = q
        if verbose:
            print(f"[kkmgpu] walk: degree {base * q:g}: {'a point moves' if last else 'no move'}")
    if not last:
        xp.multiply(K, Kp, out=K)                    # back to K_base ** q_yes (q_yes = q_no + 2^(1-depth))
    out.found = True
    out.at_upper = True
    out.e_lower, out.e_upper = q_no, q_yes
    return out


def fast_power_inplace(B, p: float, depth: int, backend: Backend):
    """Algorithm 1 on an array: B ** p with the fractional part of p rounded to a dyadic of depth ``depth``.

    Integral part by repeated squaring (Lemma 1); fractional part f by the +-2^-j walk of Lemma 2 over the
    successive square roots of B (with the fused ``offgrid_step`` for 2-D float32 / float64 arrays).
    Returns a new array; B is not modified.
    """
    xp = backend.xp
    z = int(math.floor(p))
    f = p - z
    result = None
    if z >= 1:
        result = B.copy()
        for bit in bin(z)[3:]:                       # Lemma 1: n_i = 2 n_(i-1) + b_i
            xp.multiply(result, result, out=result)
            if bit == "1":
                xp.multiply(result, B, out=result)
    if f > 0:
        frac = xp.ones_like(B)
        root = B.copy()
        fused = B.ndim == 2 and B.dtype in (np.float32, np.float64) and B.flags.c_contiguous
        e = 0.0
        for j in range(1, depth + 1):
            if e == f:
                break
            divide = e > f                           # Lemma 2: m_j = +1 below f, -1 above
            if fused:
                backend.ops.offgrid_step(frac, root, divide)
            else:
                xp.sqrt(root, out=root)
                (xp.divide if divide else xp.multiply)(frac, root, out=frac)
            e = e - 2.0 ** -j if divide else e + 2.0 ** -j
        result = frac if result is None else xp.multiply(result, frac, out=result)
    if result is None:
        result = xp.ones_like(B)
    return result
