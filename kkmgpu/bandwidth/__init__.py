"""Off-the-grid bandwidth search for kernel k-means (papers/off-the-grid-bandwidth-search.txt).

Kernel convention: the paper writes the RBF kernel as k(x, y) = exp(-||x - y||^2 / sigma), so the
bandwidth sigma of this module is 1 / gamma of :func:`kkmgpu.fit` (``gamma = 1 / sigma``).

- :func:`bandwidth_lower_bound` — Theorem 1: for sigma <= min ||x - y||^2 / log(3 n) kernel k-means moves
  no point from any partition.
- :func:`fast_power` — Algorithm 1: element-wise b ** p with only products, square roots and divisions,
  within a factor (1 +- eps) of the exact power (Theorem 2).
- :func:`critical_bandwidth` — Algorithm 2: the smallest sigma' > sigma at which one kernel k-means step
  from a partition moves a point (Definition 1), bracketed by a dyadic walk of the exponent sigma / sigma'
  with one fused element-wise pass over K per step; :func:`binary_search_critical_bandwidth` is the
  paper's §7.3 baseline (bisection on sigma', exp recomputed per probe).
- :func:`search_bandwidth` — the search of §7.1: from a small sigma, the sequence of critical values, kernel
  k-means run to convergence at each, every distinct clustering scored by c-NNC (and NMI), then a
  hierarchical refinement around the best. :func:`search_mknn` and :func:`search_grid` are the paper's
  baselines with the same result type; :func:`search_polynomial_degree` is the same search over the
  degree of the polynomial kernel (§6.3).

Memory: the walk holds two n x n matrices (K and K') on the device; nothing n x n is made on the host.
"""

from kkmgpu.bandwidth.baselines import GRID_SIGMAS, mknn_sigmas, search_grid, search_mknn
from kkmgpu.bandwidth.critical import (bandwidth_lower_bound, binary_search_critical_bandwidth, critical_bandwidth,
                                       fast_power)
from kkmgpu.bandwidth.polynomial import search_polynomial_degree
from kkmgpu.bandwidth.results import BandwidthClustering, BandwidthSearchResult, CriticalBandwidth
from kkmgpu.bandwidth.search import search_bandwidth

__all__ = [
    "BandwidthClustering",
    "BandwidthSearchResult",
    "CriticalBandwidth",
    "bandwidth_lower_bound",
    "binary_search_critical_bandwidth",
    "critical_bandwidth",
    "fast_power",
    "search_bandwidth",
    "search_grid",
    "search_mknn",
    "search_polynomial_degree",
]
