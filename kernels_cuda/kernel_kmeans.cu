// kkmgpu: fused CUDA kernels for kernel k-means, compiled at run time by CuPy (RawModule)
// and instantiated for float and double.  CPU twins with the same semantics live in
// kkmgpu/kernels/kernel_kmeans_cpu.py; tests hold the two to each other.
//
// kind codes (kkmgpu/kernels/functions.py EPILOGUE_CODES): 0 linear, 1 rbf, 2 polynomial, 3 sigmoid, 4 laplacian.
// Storage types: float, double, and unsigned short (float16 bits) for segment_sums.

// kappa(x_i, y_j) from the inner product g and the squared norms a, b, in the block's precision: float math for
// float blocks (the value is stored as float), double for double.
__device__ __forceinline__ float kkm_kernel_value(float g, float a, float b, int kind, float gamma, float coef0,
                                                  int degree)
{
    if (kind == 1 || kind == 4) {
        float d = a + b - 2.0f * g;          // squared Euclidean distance from the GEMM
        if (d < 0.0f) d = 0.0f;
        return kind == 1 ? expf(-gamma * d) : expf(-gamma * sqrtf(d));
    }
    if (kind == 2) {
        float base = gamma * g + coef0, v = 1.0f;
        for (int p = 0; p < degree; ++p) v *= base;
        return v;
    }
    if (kind == 3) return tanhf(gamma * g + coef0);
    return g;
}

__device__ __forceinline__ double kkm_kernel_value(double g, double a, double b, int kind, double gamma,
                                                   double coef0, int degree)
{
    if (kind == 1 || kind == 4) {
        double d = a + b - 2.0 * g;
        if (d < 0.0) d = 0.0;
        return kind == 1 ? exp(-gamma * d) : exp(-gamma * sqrt(d));
    }
    if (kind == 2) {
        double base = gamma * g + coef0, v = 1.0;
        for (int p = 0; p < degree; ++p) v *= base;
        return v;
    }
    if (kind == 3) return tanh(gamma * g + coef0);
    return g;
}

// In place over a row-major block (m x n) of inner products: block[i, j] <- kappa(x_i, y_j).
// Blocks stride over rows and threads over the columns of a row (coalesced, no index division).
template <typename T>
__global__ void kernel_epilogue(T* __restrict__ block, const T* __restrict__ row_sq,
                                const T* __restrict__ col_sq, long long m, long long n,
                                int kind, double gamma, double coef0, int degree)
{
    const T gam = (T)gamma, c0 = (T)coef0;
    for (long long i = blockIdx.x; i < m; i += gridDim.x) {
        const T a = row_sq[i];
        T* row = block + i * n;
        for (long long j = threadIdx.x; j < n; j += blockDim.x) {
            row[j] = kkm_kernel_value(row[j], a, col_sq[j], kind, gam, c0, degree);
        }
    }
}

// Fused distance + argmin + "did it move" (papers' Eq. 4):
// dist(i, c) = K_ii - 2 S[i, c] inv_size[c] + offset[c], clusters with inv_size[c] < 0 are empty.
// stats[0] counts the points that moved, stats[1 + c] the points now in cluster c (zeroed by the caller).
template <typename T>
__global__ void assign_labels(const double* __restrict__ S, const T* __restrict__ diag,
                              const double* __restrict__ inv_size, const double* __restrict__ offset,
                              const int* __restrict__ labels, int* __restrict__ new_labels,
                              double* __restrict__ min_dist, unsigned long long* __restrict__ stats,
                              long long n, int k)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const double kii = (double)diag[i];
        int best = -1;
        double best_d = __longlong_as_double(0x7ff0000000000000LL);  // +inf
        for (int c = 0; c < k; ++c) {
            const double inv = inv_size[c];
            if (inv < 0.0) continue;
            const double d = kii - 2.0 * S[i * k + c] * inv + offset[c];
            if (d < best_d) { best_d = d; best = c; }
        }
        if (best < 0) best = labels[i];
        new_labels[i] = best;
        min_dist[i] = best_d;
        if (best != labels[i]) atomicAdd(&stats[0], 1ULL);
        atomicAdd(&stats[1 + best], 1ULL);
    }
}

// float16 storage: K is passed as its IEEE 754 binary16 bit patterns (unsigned short) and widened by the
// hardware conversion (cvt.f32.f16; inline PTX, so the module needs no cuda_fp16.h, which NVRTC may not find).
// The CPU harness (tests/cudacpu) compiles this source with g++ and supplies the same exact conversion.
__device__ __forceinline__ float kkm_half_to_float(unsigned short h)
{
#ifdef CUDACPU_HALF_TO_FLOAT
    return CUDACPU_HALF_TO_FLOAT(h);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#endif
}

__device__ __forceinline__ double kkm_value(const float* K, long long idx) { return (double)K[idx]; }
__device__ __forceinline__ double kkm_value(const double* K, long long idx) { return K[idx]; }
__device__ __forceinline__ double kkm_value(const unsigned short* K, long long idx)
{
    return (double)kkm_half_to_float(K[idx]);
}

// Segmented row sums over a symmetric K (papers' Eq. 3-4), one pass, no one-hot operand:
//     S[i, clusters[p]] += coeffs[p] * K[rows[p], i]      for every entry p, i = 0..n-1
// Entries are sorted by cluster: cluster c's are chunk_starts[c] .. chunk_starts[c + 1] - 1. With rows =
// points in label order and coeffs = their weights this is the full cluster-sum pass; with the moved points
// (+w into the new cluster, -w out of the old one) it is the incremental update S += K[:, moved] dY.
// Each thread owns one column i (a warp reads 32 consecutive values of a row: coalesced) and one piece
// of one cluster's entries: blockIdx.y = (c - c0) * pieces + q, piece q of `pieces` equal parts. With one
// piece per cluster the thread adds its sum to S[i, c] (its only writer); with more, it stores the sum in
// partial[blockIdx.y * n + i] and segment_reduce adds the pieces in order. No atomics: the same inputs
// give the same bits on every run, so ties between clusters do not depend on the schedule.
template <typename T>
__global__ void segment_sums(const T* __restrict__ K, const long long* __restrict__ rows,
                             const double* __restrict__ coeffs, const long long* __restrict__ chunk_starts,
                             double* __restrict__ S, double* __restrict__ partial, long long n, int k, int c0,
                             int pieces)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int c = c0 + (int)(blockIdx.y / pieces);
    const long long q = blockIdx.y % pieces;
    const long long s0 = chunk_starts[c], length = chunk_starts[c + 1] - s0;
    const long long p0 = s0 + length * q / pieces, p1 = s0 + length * (q + 1) / pieces;
    double acc = 0.0;
#pragma unroll 4
    for (long long p = p0; p < p1; ++p) acc += coeffs[p] * kkm_value(K, rows[p] * n + i);
    if (pieces == 1) S[i * k + c] += acc;
    else partial[(long long)blockIdx.y * n + i] = acc;
}

// S[i, c] += the pieces of clusters c0 .. c0 + n_clusters - 1 from segment_sums, in piece order.
__global__ void segment_reduce(const double* __restrict__ partial, double* __restrict__ S, long long n, int k,
                               int c0, int n_clusters, int pieces)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    for (int c = 0; c < n_clusters; ++c) {
        double acc = 0.0;
        for (int q = 0; q < pieces; ++q) acc += partial[((long long)c * pieces + q) * n + i];
        S[i * k + c0 + c] += acc;
    }
}

// The incremental update after points moved (papers' Eq. 3-4) in one read of each moved row of K:
//     S[i, dst[p]] += coeffs[p] * K[rows[p], i]   and   S[i, src[p]] -= coeffs[p] * K[rows[p], i]
// for the m entries p (the moved points, with their old cluster src and new cluster dst), sorted by the pair
// (src, dst). A thread owns column i (a warp reads 32 consecutive values of a row: coalesced) and row i of S
// (its only writer): it walks the entries in order, sums each run of one pair and adds the run's sum into its
// two clusters. No atomics and a fixed order: the same inputs give the same bits on every run.
template <typename T>
__global__ void moved_sums(const T* __restrict__ K, const long long* __restrict__ rows,
                           const double* __restrict__ coeffs, const int* __restrict__ src,
                           const int* __restrict__ dst, double* __restrict__ S, long long n, int k, long long m)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long p = 0;
    while (p < m) {
        const int a = src[p], b = dst[p];
        long long end = p + 1;
        while (end < m && src[end] == a && dst[end] == b) ++end;
        double acc = 0.0;
#pragma unroll 4
        for (long long q = p; q < end; ++q) acc += coeffs[q] * kkm_value(K, rows[q] * n + i);
        S[i * k + b] += acc;
        S[i * k + a] -= acc;
        p = end;
    }
}

// The Off-the-grid bandwidth step (off-the-grid-bandwidth-search.txt, Algorithm 2, lines 5-9) in one
// pass over both matrices: Kp <- sqrt(Kp); K <- K / Kp (divide != 0) or K * Kp.
template <typename T>
__global__ void offgrid_step(T* __restrict__ K, T* __restrict__ Kp, long long size, int divide)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < size; idx += stride) {
        const T r = sqrt(Kp[idx]);
        Kp[idx] = r;
        K[idx] = divide ? K[idx] / r : K[idx] * r;
    }
}

#ifndef __CUDACC_RTC__
// Explicit instantiations so that a plain `nvcc --ptx` (CI's build check) compiles every body;
// at run time CuPy instantiates the same templates through name_expressions.
template __global__ void kernel_epilogue<float>(float*, const float*, const float*, long long, long long, int, double, double, int);
template __global__ void kernel_epilogue<double>(double*, const double*, const double*, long long, long long, int, double, double, int);
template __global__ void assign_labels<float>(const double*, const float*, const double*, const double*, const int*, int*, double*, unsigned long long*, long long, int);
template __global__ void assign_labels<double>(const double*, const double*, const double*, const double*, const int*, int*, double*, unsigned long long*, long long, int);
template __global__ void segment_sums<float>(const float*, const long long*, const double*, const long long*, double*, double*, long long, int, int, int);
template __global__ void segment_sums<double>(const double*, const long long*, const double*, const long long*, double*, double*, long long, int, int, int);
template __global__ void segment_sums<unsigned short>(const unsigned short*, const long long*, const double*, const long long*, double*, double*, long long, int, int, int);
template __global__ void moved_sums<float>(const float*, const long long*, const double*, const int*, const int*, double*, long long, int, long long);
template __global__ void moved_sums<double>(const double*, const long long*, const double*, const int*, const int*, double*, long long, int, long long);
template __global__ void moved_sums<unsigned short>(const unsigned short*, const long long*, const double*, const int*, const int*, double*, long long, int, long long);
template __global__ void offgrid_step<float>(float*, float*, long long, int);
template __global__ void offgrid_step<double>(double*, double*, long long, int);
#endif
