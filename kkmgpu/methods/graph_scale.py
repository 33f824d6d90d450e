"""Scale safety of the graph objectives (:mod:`kkmgpu.methods.graphcut`): the features the graph is built from,
and the affinity matrix the graph kernel is formed from, each brought into range by a power of two (issue 27).

Neither changes a graph objective's partitions: a kNN set and d^2 / (sigma_i sigma_j) do not change with a common
power-of-two scale of X (the scaling is exact), and the normalized cut and the partitions of either objective do
not change with a common scale of A. Both keep float32 from rounding the data to nothing or to infinity.
"""

from __future__ import annotations

import math

import numpy as np

from kkmgpu import _validation, _warn

#: features whose largest centred |value| lies outside [2**-LIMIT, 2**LIMIT] of their dtype are scaled by a power of two
FEATURE_RANGE = {np.dtype(np.float32): 60, np.dtype(np.float64): 500}
#: the bulk's spread is estimated on at most this many rows (a fixed stride: the same rows on every call)
SPREAD_SAMPLE = 4096
#: warn when the bulk's spread is below this many units in the last place of the data's extent
RESOLUTION = 64


def bulk(Xd, backend):
    """(median, spread) of a strided sample of at most SPREAD_SAMPLE rows, in float64 on the host: the columns'
    medians (a location inside the bulk of the points, however far a few outliers lie) and the largest column's
    median absolute deviation (the bulk's spread)."""
    step = max(1, -(-Xd.shape[0] // SPREAD_SAMPLE))
    S = np.asarray(backend.to_host(Xd[::step]), dtype=np.float64)
    median = np.median(S, axis=0)
    return median, float(np.median(np.abs(S - median), axis=0).max())


def check_resolution(Xd, center, dtype, backend):
    """PrecisionWarning where the features in ``dtype`` cannot tell most points apart: the centre (the mean) lies
    so far from the bulk of the points (a few far outliers pull it away) that, after centring, the bulk's spread is
    below RESOLUTION units in the last place of its values (e.g. one point at 1e15 beside 3,000 spread over 10, in
    float32: the bulk sits 3e11 from the mean). The graph would be built on rounding, silently."""
    from kkmgpu.kernels.spec import PrecisionWarning

    median, spread = bulk(Xd, backend)
    offset = float(np.abs(median - np.asarray(backend.to_host(center), dtype=np.float64)).max())
    eps = float(np.finfo(dtype).eps)
    if spread > 0 and math.isfinite(offset) and spread < RESOLUTION * eps * offset:
        _warn.warn(f"dtype={np.dtype(dtype).name} cannot resolve most of these points: centred on their mean, which "
                   f"a few far points pull {offset:.3g} away from the bulk, the bulk's spread (the largest column's "
                   f"median absolute deviation, {spread:.3g}) is below {RESOLUTION} units in the last place of its "
                   "values, so the graph sees them as nearly identical. Use dtype='float64', or leave out the far "
                   "points.", PrecisionWarning)


def feature_exponent(Xd, center, dtype, backend) -> int:
    """e such that (X - center) / 2**e has its largest |value| in [1, 2), where it lies outside the dtype's
    FEATURE_RANGE (X * 1e40 would be infinite in float32, X * 1e-45 lose its digits), else 0: every graph is the
    same for a power-of-two scale of X (kNN sets and d^2 / (sigma_i sigma_j) alike), and ordinary data stay as they
    are."""
    from kkmgpu.kernels.blocks import tile_rows

    xp = backend.xp
    largest = 0.0
    step = tile_rows(Xd.shape[1], 8, backend=backend)
    for i0 in range(0, Xd.shape[0], step):
        largest = max(largest, float(xp.abs(Xd[i0:i0 + step].astype(xp.float64) - center).max()))
    check_resolution(Xd, center, dtype, backend)
    return exponent_of(largest, dtype)


def exponent_of(largest, dtype) -> int:
    """The power of two e putting ``largest`` (the features' largest centred |value|) in [1, 2) where it lies
    outside ``dtype``'s FEATURE_RANGE, else 0."""
    limit = FEATURE_RANGE[np.dtype(dtype)]
    if largest == 0.0 or not math.isfinite(largest) or 2.0 ** -limit <= largest <= 2.0 ** limit:
        return 0
    return math.frexp(largest)[1] - 1


def feature_dtype(dtype):
    return np.float64 if _validation.check_dtype(dtype) == np.float64 else np.float32


#: rows of the strided sample whose values give each column's grid (:func:`grid_center`)
GRID_SAMPLE = 1024


def grid_center(Xd, backend):
    """X's column means in float64, each rounded to a multiple of its column's grid step: the largest power of
    two dividing every value of a strided sample of at most GRID_SAMPLE rows (1 for integers, 2**-k for values on
    a grid of 2**-k), where that step is no larger than the sample's range in the column (so the centre moves by at
    most half the spread); the plain mean elsewhere (values with full-length mantissas: a step far below the mean's
    last place, which leaves the mean as it is, bit for bit).

    The sample's step is a multiple of the whole column's (a subset's common power of two can only be larger), so
    on grid data every X - centre is a multiple of the column's step, and exact within 2**53 steps of the centre:
    exact ties among X's distances (integer data, repeated grid steps) then stay exact ties among the features',
    broken by index as the neighbour search says, not by the rounding of X - mean (integer data and X + 12,345 gave
    different graphs in 18 of 20 random sets with the unrounded mean, 2026-11-27)."""
    xp = backend.xp
    mean = np.asarray(backend.to_host(Xd.mean(axis=0, dtype=xp.float64)), dtype=np.float64)
    step = max(1, -(-Xd.shape[0] // GRID_SAMPLE))
    values = np.asarray(backend.to_host(Xd[::step]), dtype=np.float64)
    mantissa, exponent = np.frexp(values)                 # values = mantissa 2**exponent, 0.5 <= |mantissa| < 1
    whole = (mantissa * 2.0 ** 53).astype(np.int64)       # the 53-bit integer mantissa, exactly
    lowest = (whole & -whole).astype(np.float64)          # its lowest set bit, a power of two (0 for a zero value)
    bits = np.frexp(lowest)[1] - 1
    with np.errstate(over="ignore"):
        quantum = np.where(values != 0, np.ldexp(1.0, exponent - 53 + bits), np.inf).min(axis=0)
        spread = values.max(axis=0) - values.min(axis=0)
        # where |mean| is 2**53 steps or more, the mean is a multiple of the step already (and mean / step may overflow)
        usable = (np.isfinite(quantum) & (quantum > 0) & (quantum <= spread)
                  & (np.abs(mean) < 2.0 ** 53 * np.where(quantum > 0, quantum, 1.0)))
    safe = np.where(usable, quantum, 1.0)
    return backend.asarray(np.where(usable, np.round(mean / safe) * safe, mean))


def graph_features(Xd, dtype, backend, center=None, exponent=None):
    """(center, features): X centred in float64 (on :func:`grid_center`, or ``center``), divided by 2**exponent
    (by default :func:`feature_exponent`'s), then cast to the compute precision (an offset such as 1e7 would
    otherwise take the float32 digits before the centring could)."""
    from kkmgpu.kernels.blocks import tile_rows

    xp = backend.xp
    ct = feature_dtype(dtype)
    center = grid_center(Xd, backend) if center is None else backend.asarray(center).astype(xp.float64)
    exponent = feature_exponent(Xd, center, ct, backend) if exponent is None else exponent
    half = -exponent // 2  # two factors, each representable, where 2**-e is not
    features = xp.empty(Xd.shape, dtype=ct)
    step = tile_rows(Xd.shape[1], 8, backend=backend)
    for i0 in range(0, Xd.shape[0], step):
        rows = Xd[i0:i0 + step].astype(xp.float64) - center
        if exponent:
            rows = rows * 2.0 ** half * 2.0 ** (-exponent - half)
        features[i0:i0 + step] = rows.astype(ct)
    return center, features


def normalize_scale(A):
    """(A / 2**e, e): A with its largest entry in [1, 2), e an integer (a copy; A itself where e = 0).

    The graph objectives do not change with a common scale of A (the ratio association's values scale with it,
    and are reported in A's units), but the graph kernel's float32 values do: D^-1 A D^-1 of an A near 1e60 is
    near 1e-60, 0 in float32. Dividing by a power of two keeps every digit of A's entries."""
    if A.nnz == 0:
        return A, 0
    exponent = math.frexp(float(A.data.max()))[1] - 1
    if exponent == 0:
        return A, 0
    A = A.copy()
    half = -exponent // 2  # two factors, each representable, where 2**-e is not (e near -1074 or 1023)
    A.data *= 2.0 ** half
    A.data *= 2.0 ** (-exponent - half)
    return A, exponent
