// kkmgpu: the matrix-free (tiled) engine's fused kernels, compiled at run time by CuPy (RawModule).
// CPU twins with the same signatures and semantics: kkmgpu/kernels/tiled_cpu.py; tests hold the two to each
// other and both to a float64 reference (tests/test_tiled.py).
//
// A tile G (t x m, row-major) holds inner products <x_i, y_j> of the rows i = row0 .. row0 + t - 1 with m
// column points (cuBLAS GEMM).  Each kernel turns a tile entry into a kernel value and consumes it at once:
//     v(i, j) = (T) kappa(G[i, j])          rounded to the tile's precision, as the dense engine stores K
//     v(i, j) = 1 for the distance kernels where col_points[j] == row0 + i (||x - x|| is exactly 0)
// kind codes (kkmgpu/kernels/functions.py EPILOGUE_CODES): 0 linear (and a callable's block), 1 rbf, 2 polynomial,
// 3 sigmoid, 4 laplacian.  Cluster sums accumulate in double.
//
// SHARED = true keeps a block's k per-cluster sums in shared memory (k * 8 bytes, launched for small k);
// SHARED = false adds into S with global atomics (any k).

template <typename T>
__device__ __forceinline__ double kkm_tile_value(T g, double a, double b, int kind, double gamma,
                                                 double coef0, int degree)
{
    double v = (double)g;
    if (kind == 1 || kind == 4) {
        double d = a + b - 2.0 * v;          // squared Euclidean distance from the GEMM
        if (d < 0.0) d = 0.0;
        v = kind == 1 ? exp(-gamma * d) : exp(-gamma * sqrt(d));
    } else if (kind == 2) {
        double base = gamma * v + coef0;
        v = 1.0;
        for (int p = 0; p < degree; ++p) v *= base;
    } else if (kind == 3) {
        v = tanh(gamma * v + coef0);
    }
    return (double)(T)v;
}

template <typename T>
__device__ __forceinline__ double kkm_tile_entry(const T* __restrict__ row, const T* __restrict__ col_sq,
                                                 const long long* __restrict__ col_points, long long point,
                                                 long long j, double a, int kind, double gamma, double coef0,
                                                 int degree)
{
    const bool distance = kind == 1 || kind == 4;
    if (distance && col_points[j] == point) return 1.0;
    return kkm_tile_value<T>(row[j], a, distance ? (double)col_sq[j] : 0.0, kind, gamma, coef0, degree);
}

template <bool SHARED>
__device__ __forceinline__ void kkm_flush(double* sums, double* S_row, int c, double acc)
{
    if (SHARED) atomicAdd(&sums[c], acc);
    else atomicAdd(&S_row[c], acc);
}

// Full cluster sums of a row tile (papers' Eq. 3-4 without K):
//     S[i, clusters[j]] += coeffs[j] * v(i, j)        j = 0 .. m-1
// One block per tile row (blocks stride over rows), threads stride over the columns (coalesced reads of
// G).  Columns are expected in label order (clusters non-decreasing): a thread then keeps one running
// double per cluster run and flushes it once per change; unsorted clusters are still summed correctly.
template <typename T, bool SHARED>
__global__ void tile_cluster_sums(const T* __restrict__ G, const T* __restrict__ row_sq,
                                  const T* __restrict__ col_sq, long long t, long long m, int kind,
                                  double gamma, double coef0, int degree, const int* __restrict__ clusters,
                                  const double* __restrict__ coeffs, const long long* __restrict__ col_points,
                                  long long row0, double* __restrict__ S, int k)
{
    extern __shared__ double sums[];
    const bool distance = kind == 1 || kind == 4;
    for (long long i = blockIdx.x; i < t; i += gridDim.x) {
        double* S_row = S + i * k;
        if (SHARED) {
            for (int c = threadIdx.x; c < k; c += blockDim.x) sums[c] = 0.0;
            __syncthreads();
        }
        const T* row = G + i * m;
        const double a = distance ? (double)row_sq[i] : 0.0;
        const long long point = row0 + i;
        int c = -1;
        double acc = 0.0;
        for (long long j = threadIdx.x; j < m; j += blockDim.x) {
            const int cj = clusters[j];
            if (cj != c) {
                if (c >= 0) kkm_flush<SHARED>(sums, S_row, c, acc);
                c = cj;
                acc = 0.0;
            }
            acc += coeffs[j] * kkm_tile_entry<T>(row, col_sq, col_points, point, j, a, kind, gamma, coef0, degree);
        }
        if (c >= 0) kkm_flush<SHARED>(sums, S_row, c, acc);
        if (SHARED) {
            __syncthreads();
            for (int cc = threadIdx.x; cc < k; cc += blockDim.x) S_row[cc] += sums[cc];
            __syncthreads();
        }
    }
}

// Incremental cluster sums for the m points that moved (columns j of the tile):
//     S[i, new_clusters[j]] += coeffs[j] * v(i, j);   S[i, old_clusters[j]] -= coeffs[j] * v(i, j)
// i.e. S += K[:, moved] dY with dY = +w at the new cluster and -w at the old one, each v computed once.
template <typename T, bool SHARED>
__global__ void tile_moved_sums(const T* __restrict__ G, const T* __restrict__ row_sq,
                                const T* __restrict__ col_sq, long long t, long long m, int kind,
                                double gamma, double coef0, int degree, const int* __restrict__ new_clusters,
                                const int* __restrict__ old_clusters, const double* __restrict__ coeffs,
                                const long long* __restrict__ col_points, long long row0,
                                double* __restrict__ S, int k)
{
    extern __shared__ double sums[];
    const bool distance = kind == 1 || kind == 4;
    for (long long i = blockIdx.x; i < t; i += gridDim.x) {
        double* S_row = S + i * k;
        if (SHARED) {
            for (int c = threadIdx.x; c < k; c += blockDim.x) sums[c] = 0.0;
            __syncthreads();
        }
        const T* row = G + i * m;
        const double a = distance ? (double)row_sq[i] : 0.0;
        const long long point = row0 + i;
        for (long long j = threadIdx.x; j < m; j += blockDim.x) {
            const double wv = coeffs[j] * kkm_tile_entry<T>(row, col_sq, col_points, point, j, a, kind, gamma,
                                                            coef0, degree);
            kkm_flush<SHARED>(sums, S_row, new_clusters[j], wv);
            kkm_flush<SHARED>(sums, S_row, old_clusters[j], -wv);
        }
        if (SHARED) {
            __syncthreads();
            for (int cc = threadIdx.x; cc < k; cc += blockDim.x) S_row[cc] += sums[cc];
            __syncthreads();
        }
    }
}

// In place: G[i, j] <- v(i, j), the kernel rows themselves (k-means++ seeding, prediction).
template <typename T>
__global__ void tile_epilogue(T* __restrict__ G, const T* __restrict__ row_sq, const T* __restrict__ col_sq,
                              long long t, long long m, int kind, double gamma, double coef0, int degree,
                              const long long* __restrict__ col_points, long long row0)
{
    const bool distance = kind == 1 || kind == 4;
    for (long long i = blockIdx.x; i < t; i += gridDim.x) {
        T* row = G + i * m;
        const double a = distance ? (double)row_sq[i] : 0.0;
        for (long long j = threadIdx.x; j < m; j += blockDim.x) {
            row[j] = (T)kkm_tile_entry<T>(row, col_sq, col_points, row0 + i, j, a, kind, gamma, coef0, degree);
        }
    }
}

#ifndef __CUDACC_RTC__
// Explicit instantiations so that a plain `nvcc --ptx` (CI's build check) compiles every body;
// at run time CuPy instantiates the same templates through name_expressions.
template __global__ void tile_cluster_sums<float, true>(const float*, const float*, const float*, long long, long long, int, double, double, int, const int*, const double*, const long long*, long long, double*, int);
template __global__ void tile_cluster_sums<float, false>(const float*, const float*, const float*, long long, long long, int, double, double, int, const int*, const double*, const long long*, long long, double*, int);
template __global__ void tile_cluster_sums<double, true>(const double*, const double*, const double*, long long, long long, int, double, double, int, const int*, const double*, const long long*, long long, double*, int);
template __global__ void tile_cluster_sums<double, false>(const double*, const double*, const double*, long long, long long, int, double, double, int, const int*, const double*, const long long*, long long, double*, int);
template __global__ void tile_moved_sums<float, true>(const float*, const float*, const float*, long long, long long, int, double, double, int, const int*, const int*, const double*, const long long*, long long, double*, int);
template __global__ void tile_moved_sums<float, false>(const float*, const float*, const float*, long long, long long, int, double, double, int, const int*, const int*, const double*, const long long*, long long, double*, int);
template __global__ void tile_moved_sums<double, true>(const double*, const double*, const double*, long long, long long, int, double, double, int, const int*, const int*, const double*, const long long*, long long, double*, int);
template __global__ void tile_moved_sums<double, false>(const double*, const double*, const double*, long long, long long, int, double, double, int, const int*, const int*, const double*, const long long*, long long, double*, int);
template __global__ void tile_epilogue<float>(float*, const float*, const float*, long long, long long, int, double, double, int, const long long*, long long);
template __global__ void tile_epilogue<double>(double*, const double*, const double*, long long, long long, int, double, double, int, const long long*, long long);
#endif
