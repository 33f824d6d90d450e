"""The kernel codes the fused epilogues switch on, shared by :mod:`kkmgpu.kernels.blocks` and the twins that compute
the kernels (``_cpu_kernels``, ``_tiled_cpu``; the CUDA sources repeat them in kernels_cuda/*.cu): a leaf
module, so the twins need not import ``_kernels`` (which imports the backend that loads them)."""

EPILOGUE_CODES = {"linear": 0, "rbf": 1, "polynomial": 2, "sigmoid": 3, "laplacian": 4}
