"""CUDA C++ sources of kkmgpu's custom kernels (installed as ``kkmgpu.kernels_cuda``).

The ``.cu`` files are compiled at run time by CuPy (``RawModule``); see kkmgpu/kernels/kernel_kmeans_cuda.py.
"""
