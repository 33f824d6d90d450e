// kkmgpu: sparse products with a fixed order of summation, compiled at run time by CuPy (RawModule).
// Python side and semantics: kkmgpu/kernels/sparse_cuda.py (csr_product); tests: tests/test_sparse_product.py
// (against a float64 reference, and the same bits on every call).
//
// Why: cuSPARSE's CSR products (what CuPy runs for csr @ dense and csr.sum) split long rows between threads and
// add the pieces in an order that changes from run to run. On an H100 (2026-11-26, bench/probes/
// sparse_determinism.py) rows of 50 entries gave the same bits on every call, rows of 1,000 and 25,000 did not, so
// two fits with the same seed of method="landmark" gave cuts 8e-11 apart. Here the order is fixed by the matrix
// alone: each row's entries are cut into chunks of KKM_CSR_CHUNK (a constant, not the device's size), a thread adds
// one chunk's products in entry order (csr_chunk_sums) and another adds the row's chunk sums in chunk order
// (csr_chunk_combine). No atomics: the same inputs give the same bits on every run and every device.
//
// Layout: indptr (n_rows + 1), indices (nnz) int32 (CuPy's), data (nnz) float or double; X (n_cols x cols)
// row-major double; chunk_ptr (n_rows + 1) long long, row r's chunks are chunk_ptr[r] .. chunk_ptr[r + 1] - 1
// (ceil(length / KKM_CSR_CHUNK) of them); partial (max_chunks x cols) and out (n_rows x cols) row-major double.

#ifndef KKM_CSR_CHUNK
#define KKM_CSR_CHUNK 64  // kkmgpu/kernels/sparse_cuda.py CHUNK (tests hold the two equal)
#endif

// partial[t, j] = sum over the entries e of chunk t, in order, of data[e] * X[indices[e], j]. Thread (t, j) for
// t * cols + j: a warp covers consecutive columns of one chunk (X's rows read coalesced) or, for cols = 1,
// consecutive chunks. chunk_row[t] is chunk t's row (the last r with chunk_ptr[r] <= t; made once per matrix by
// the caller). Threads past the matrix's chunk count (the caller sizes the grid by an upper bound, so no count
// comes back to the host) return.
template <typename T>
__global__ void csr_chunk_sums(const int* __restrict__ indptr, const int* __restrict__ indices,
                               const T* __restrict__ data, const double* __restrict__ X,
                               const long long* __restrict__ chunk_ptr, const long long* __restrict__ chunk_row,
                               long long n_rows, long long cols, long long max_chunks, double* __restrict__ partial)
{
    const long long n_chunks = chunk_ptr[n_rows];
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < max_chunks * cols; g += stride) {
        const long long t = g / cols, j = g - t * cols;
        if (t >= n_chunks) return;  // g only grows
        const long long r = chunk_row[t];
        const long long e0 = (long long)indptr[r] + (t - chunk_ptr[r]) * KKM_CSR_CHUNK;
        const long long e_end = (long long)indptr[r + 1];
        const long long e1 = e0 + KKM_CSR_CHUNK < e_end ? e0 + KKM_CSR_CHUNK : e_end;
        double acc = 0.0;
        for (long long e = e0; e < e1; ++e) acc += (double)data[e] * X[(long long)indices[e] * cols + j];
        partial[t * cols + j] = acc;
    }
}

// out[r, j] = the chunk sums of row r, in chunk order (0 for a row without entries).
__global__ void csr_chunk_combine(const double* __restrict__ partial, const long long* __restrict__ chunk_ptr,
                                  long long n_rows, long long cols, double* __restrict__ out)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < n_rows * cols; g += stride) {
        const long long r = g / cols, j = g - r * cols;
        double acc = 0.0;
        for (long long t = chunk_ptr[r]; t < chunk_ptr[r + 1]; ++t) acc += partial[t * cols + j];
        out[g] = acc;
    }
}

#ifndef __CUDACC_RTC__
// Explicit instantiations so that a plain `nvcc --ptx` (CI's build check) compiles every body;
// at run time CuPy instantiates the same templates through name_expressions.
template __global__ void csr_chunk_sums<float>(const int*, const int*, const float*, const double*, const long long*, const long long*, long long, long long, long long, double*);
template __global__ void csr_chunk_sums<double>(const int*, const int*, const double*, const double*, const long long*, const long long*, long long, long long, long long, double*);
#endif
