"""max |x| of a float array read from its bits, so that a GPU's flush of subnormals to zero cannot change it.

A float's bits ordered as an integer order its magnitude (the sign bit aside). On an H100 (2026-11-26) a
precomputed float32 K * 1e-45, every value subnormal, had max |K| = 0 from CuPy's float max / min (subnormals
flushed to zero): the check that refuses such a K never ran, and the fit went on with a kernel of zeros. Integer
reductions flush nothing: the result is the largest magnitude stored, on every device.
"""

from __future__ import annotations

import numpy as np


def largest_magnitude(values) -> float:
    """max |values| (0 for an empty array) of a float16/32/64 array on either device, by two integer reductions
    of its bits and no temporary: the signed maximum finds the largest positive value, the unsigned maximum the
    negative of largest magnitude (its sign bit set). NaN's bits lie above infinity's: NaN comes back as NaN."""
    dtype = np.dtype(values.dtype)
    if values.size == 0:
        return 0.0
    if dtype.kind != "f":
        return float(max(values.max(), -values.min()))
    bits = 8 * dtype.itemsize
    signed, unsigned = np.dtype(f"int{bits}"), np.dtype(f"uint{bits}")
    positive = int(values.view(signed).max())
    negative = int(values.view(unsigned).max()) - (1 << (bits - 1))
    largest = max(positive, negative, 0)
    return float(np.array(largest, dtype=unsigned).view(dtype))
