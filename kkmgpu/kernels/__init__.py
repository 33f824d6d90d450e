"""Internal: kernel functions and the custom operations behind the Lloyd iteration.

- ``spec``: kernel names, parameters and their defaults (``KernelSpec``), and the scales that keep values representable;
- ``blocks``: features prepared on the device, kernel blocks as a GEMM plus one fused epilogue, the kernel matrix.
- ``epilogue_codes``: the kernel codes shared by the CUDA sources and their twins.

Each CUDA source in ``kernels_cuda/`` has two beside-named modules with the same functions and signatures:

==========================  ===============================  ===========================
CUDA source                 CUDA launcher (CuPy)             CPU twin (numba)
==========================  ===============================  ===========================
``kernel_kmeans.cu``        ``kernel_kmeans_cuda``           ``kernel_kmeans_cpu``
``tiled.cu``                ``tiled_cuda``                   ``tiled_cpu``
``knn.cu``                  ``knn_cuda``                     ``knn_cpu``
``sparse.cu``               ``sparse_cuda``                  SciPy's CSR product
==========================  ===============================  ===========================

``graphs`` builds affinity graphs (kNN, mutual kNN, self-tuning) in CSR; their nearest-neighbour search is
``knn_cpu`` / ``knn_cuda`` (``offer_block``, ``nearest_neighbors``: the blocks on and above the diagonal of the
distance matrix, each row's best candidates kept without sorting); ``knn_exact`` re-ranks their candidates in
float64 and certifies them, so the neighbours are exact in every GEMM precision mode.
``csr_cpu`` has the numba CSR cluster sums; on a GPU the same work is ``sparse_cuda``'s fixed-order CSR product
(``kernels_cuda/sparse.cu``), which every CSR x dense product on a GPU takes.
"""
