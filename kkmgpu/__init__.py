"""kkmgpu: GPU-accelerated kernel k-means with a NumPy + numba CPU fallback.

>>> import kkmgpu
>>> result = kkmgpu.fit(X, k=10, kernel="rbf", device="auto")      # doctest: +SKIP
>>> result.labels, result.objective, result.device                  # doctest: +SKIP

The public names load on first use (PEP 562): ``import kkmgpu`` reads no NumPy, numba, SciPy, scikit-learn, dask or
CuPy, so a script or the CLI pays only for what it calls.
"""

import importlib

__version__ = "0.1.0"

#: public name -> the module that defines it (a name equal to its module's last part is the module itself)
_LAZY = {
    "datasets": "kkmgpu.datasets",
    "metrics": "kkmgpu.metrics",
    "fit": "kkmgpu._api",
    "kernel_matrix": "kkmgpu._api",
    "predict": "kkmgpu._api",
    "DeviceUnavailableError": "kkmgpu.backend.device",
    "InsufficientMemoryError": "kkmgpu.backend.device",
    "cuda_unavailable_reason": "kkmgpu.backend.device",
    "BandwidthClustering": "kkmgpu.bandwidth",
    "BandwidthSearchResult": "kkmgpu.bandwidth",
    "CriticalBandwidth": "kkmgpu.bandwidth",
    "bandwidth_lower_bound": "kkmgpu.bandwidth",
    "binary_search_critical_bandwidth": "kkmgpu.bandwidth",
    "critical_bandwidth": "kkmgpu.bandwidth",
    "fast_power": "kkmgpu.bandwidth",
    "search_bandwidth": "kkmgpu.bandwidth",
    "search_grid": "kkmgpu.bandwidth",
    "search_mknn": "kkmgpu.bandwidth",
    "search_polynomial_degree": "kkmgpu.bandwidth",
    "PrecisionWarning": "kkmgpu.kernels.spec",
    "UninformativeKernelWarning": "kkmgpu.kernels.spec",
    "ConvergenceWarning": "kkmgpu.engine.lloyd",
    "KernelKMeans": "kkmgpu.estimator",
    "KernelKMeansResult": "kkmgpu._result",
    "TrimmedKernel": "kkmgpu.trimming",
    "trim_kernel_matrix": "kkmgpu.trimming",
}


def __getattr__(name):
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(module_name)
    value = module if module_name == f"{__name__}.{name}" else getattr(module, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


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
