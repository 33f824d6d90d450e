"""kkmgpu: GPU-accelerated kernel k-means with a NumPy + numba CPU fallback.

>>> import kkmgpu
>>> result = kkmgpu.fit(X, k=10, kernel="rbf", device="auto")      # doctest: +SKIP
>>> result.labels, result.objective, result.device                  # doctest: +SKIP
"""

from kkmgpu import datasets, metrics
from kkmgpu._api import fit, kernel_matrix, predict
from kkmgpu.backend.device import DeviceUnavailableError, InsufficientMemoryError, cuda_unavailable_reason
from kkmgpu.bandwidth import (BandwidthClustering, BandwidthSearchResult, CriticalBandwidth, bandwidth_lower_bound,
                        binary_search_critical_bandwidth, critical_bandwidth, fast_power, search_bandwidth,
                        search_grid, search_mknn, search_polynomial_degree)
from kkmgpu.kernels.spec import PrecisionWarning, UninformativeKernelWarning
from kkmgpu.engine.lloyd import ConvergenceWarning
from kkmgpu._result import KernelKMeansResult
from kkmgpu.trimming import TrimmedKernel, trim_kernel_matrix

__version__ = "0.1.0"


def __getattr__(name):
    # KernelKMeans imports scikit-learn when it is installed, which would triple the time of `import kkmgpu`:
    # its module loads on first use.
    if name == "KernelKMeans":
        from kkmgpu.estimator import KernelKMeans

        globals()["KernelKMeans"] = KernelKMeans
        return KernelKMeans
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {"KernelKMeans"})

__all__ = [
    "ConvergenceWarning",
    "DeviceUnavailableError",
    "InsufficientMemoryError",
    "PrecisionWarning",
    "UninformativeKernelWarning",
    "KernelKMeans",
    "KernelKMeansResult",
    "cuda_unavailable_reason",
    "datasets",
    "fit",
    "kernel_matrix",
    "metrics",
    "predict",
    "TrimmedKernel",
    "trim_kernel_matrix",
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
    "__version__",
]
