// kkmgpu: the matrix-free (tiled) engine's fused kernels, compiled at run time by CuPy (RawModule).
// CPU twins with the same signatures and semantics: kkmgpu/kernels/tiled_cpu.py; tests hold the two to each
// other and both to a float64 reference (tests/test_tiled.py).
//
// A tile G (t x m, row-major) holds inner products <x_i, y_j> of the rows i = row0 .. row0 + t - 1 with m
// column points (cuBLAS GEMM).  Each kernel turns a tile entry into a kernel value and consumes it at once:
//     v(i, j) = kappa(G[i, j])   in T's precision (float math for float tiles), as the dense engine stores K
//     v(i, j) = 1 for the distance kernels where col_points[j] == row0 + i (||x - x|| is exactly 0)
// kind codes (kkmgpu/kernels/functions.py EPILOGUE_CODES): 0 linear (and a callable's block), 1 rbf, 2 polynomial,
// 3 sigmoid, 4 laplacian.  Cluster sums accumulate in double.
//
// The cluster sums add in an order fixed by the launch's arguments alone, with no float atomics, so the same
// inputs give the same bits on every run (tests/test_tiled.py runs them under every thread schedule):
// - a warp owns KKM_ROWS rows and one piece of the entries (columns, or signed entries of moved points); its
//   lanes read consecutive entries (coalesced), each lane adds its entries of the current run (a stretch of one
//   cluster) into private doubles, and a run's total is a shuffle tree over the lanes;
// - with the entries sorted by cluster, a run inside a piece is that cluster's only part in the row, so its one
//   writer adds it to S; the first and last runs of a piece go to partial[] and tile_combine adds them, piece by
//   piece, in order. Unsorted entries (checked on the device: tile_order_check) give each warp whole rows.

#define KKM_FULL_MASK 0xffffffffu
#define KKM_ROWS 4  // rows per warp (kkm_warp_sums4): an entry's cluster, weight and norm serve them all
static_assert(KKM_ROWS == 4, "kkm_warp_sums4 reduces four rows");
#define KKM_THREADS 256  // threads per block of the summing kernels (at most; the launcher's _THREADS)

__device__ __forceinline__ float kkm_tile_value(float g, float a, float b, int kind, float gamma, float coef0,
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

__device__ __forceinline__ double kkm_tile_value(double g, double a, double b, int kind, double gamma,
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

template <typename T>
__device__ __forceinline__ T kkm_tile_entry(T g, T a, T b, long long col_point, long long point, int kind, T gamma,
                                            T coef0, int degree)
{
    if ((kind == 1 || kind == 4) && col_point == point) return (T)1;
    return kkm_tile_value(g, a, b, kind, gamma, coef0, degree);
}

// Lanes 8 r .. 8 r + 7 get the sum over the warp of x[r], r = 0 .. 3, each added in a fixed tree: the first two
// steps halve the rows a lane carries, so 6 shuffles do what 4 separate reductions do in 20.
__device__ __forceinline__ double kkm_warp_sums4(const double x[4], int lane)
{
    const bool hi16 = lane & 16, hi8 = lane & 8;
    const double w0 = (hi16 ? x[2] : x[0]) + __shfl_xor_sync(KKM_FULL_MASK, hi16 ? x[0] : x[2], 16);
    const double w1 = (hi16 ? x[3] : x[1]) + __shfl_xor_sync(KKM_FULL_MASK, hi16 ? x[1] : x[3], 16);
    double u = (hi8 ? w1 : w0) + __shfl_xor_sync(KKM_FULL_MASK, hi8 ? w0 : w1, 8);
    for (int d = 4; d > 0; d >>= 1) u += __shfl_xor_sync(KKM_FULL_MASK, u, d);
    return u;
}

// Entries e = 0 .. n_entries - 1 of a row tile: column j = GATHER ? cols[e] : e of G (row stride m), cluster
// clusters[e], weight coeffs[e]. For every row i: S[i, clusters[e]] += coeffs[e] * v(i, j). `sorted`: clusters
// are non-decreasing, so the entries are split into `pieces` pieces (see the file's head); else pieces = 1.
template <typename T, bool GATHER>
__device__ __forceinline__ void kkm_tile_sums(const T* __restrict__ G, const T* __restrict__ row_sq,
                                              const T* __restrict__ col_sq, long long t, long long m, int kind,
                                              T gamma, T coef0, int degree, const int* __restrict__ clusters,
                                              const double* __restrict__ coeffs,
                                              const long long* __restrict__ col_points,
                                              const long long* __restrict__ cols, long long n_entries,
                                              long long row0, double* __restrict__ S, int k,
                                              double* __restrict__ partial, int pieces, bool sorted)
{
    const bool distance = kind == 1 || kind == 4;
    const int P = sorted ? pieces : 1;
    const bool split = P > 1;
    const int lane = threadIdx.x & 31;
    const int warps = blockDim.x >> 5;
    const unsigned lanes_to_me = lane == 31 ? KKM_FULL_MASK : (2u << lane) - 1u;
    const long long row_blocks = (t + KKM_ROWS - 1) / KKM_ROWS;
    const long long per_piece = ((n_entries + P - 1) / P + 31) / 32 * 32;
    __shared__ double values[KKM_THREADS / 32][KKM_ROWS][32];  // a chunk's values, for the runs inside it
    double (*chunk)[32] = values[threadIdx.x >> 5];
    // warp w takes piece q of row block rb: columns in order (q = w / row_blocks), so that the warps of a block share
    // a piece's entries; gathered ones (q = w % P), so that they share rows, whose values the gathers revisit
    for (long long w = (long long)blockIdx.x * warps + (threadIdx.x >> 5); w < row_blocks * P;
         w += (long long)gridDim.x * warps) {
        const int q = (int)(GATHER ? w % P : w / row_blocks);
        const long long i0 = (GATHER ? w / P : w % row_blocks) * KKM_ROWS;
        const int rows = (int)min((long long)KKM_ROWS, t - i0);
        const long long p0 = q * per_piece, p1 = min(n_entries, p0 + per_piece);
        if (p0 >= p1) continue;
        T a[KKM_ROWS];
        double acc[KKM_ROWS];
#pragma unroll
        for (int r = 0; r < KKM_ROWS; ++r) {
            a[r] = distance && r < rows ? row_sq[i0 + r] : (T)0;
            acc[r] = 0.0;
        }
        int cur = clusters[p0];  // the open run's cluster; its lanes' parts are in acc
        bool first = true;       // the open run is the piece's first
        // the open run ends: its total goes to the piece's slot (0: first run, 1: last) or, as the one part of
        // its cluster in these rows (sorted entries) or from the rows' one warp (unsorted), straight into S
        auto close = [&](bool last) {
            const double total = kkm_warp_sums4(acc, lane);
            const int r = lane >> 3;
            if ((lane & 7) == 0 && r < rows) {
                if (split && (first || last))
                    partial[((i0 + r) * P + q) * 2 + (first ? 0 : 1)] = total;
                else
                    S[(i0 + r) * k + cur] += total;
            }
            __syncwarp();
        };
        for (long long e0 = p0; e0 < p1; e0 += 32) {
            const long long e = e0 + lane, tail = min(e0 + 31, p1 - 1);
            const bool valid = e < p1;
            const int c = clusters[valid ? e : tail];  // lanes past the end extend the last run with zeros
            double val[KKM_ROWS];
            if (valid) {
                const long long j = GATHER ? cols[e] : e;
                const double coeff = coeffs[e];
                const T b = distance ? col_sq[j] : (T)0;
                const long long point = distance ? col_points[j] : -1;
#pragma unroll
                for (int r = 0; r < KKM_ROWS; ++r)
                    val[r] = r < rows ? coeff * (double)kkm_tile_entry<T>(G[(i0 + r) * m + j], a[r], b, point,
                                                                        row0 + i0 + r, kind, gamma, coef0, degree)
                                      : 0.0;
            } else {
#pragma unroll
                for (int r = 0; r < KKM_ROWS; ++r) val[r] = 0.0;
            }
            if (__all_sync(KKM_FULL_MASK, c == cur)) {  // the open run goes on through the chunk
#pragma unroll
                for (int r = 0; r < KKM_ROWS; ++r) acc[r] += val[r];
                continue;
            }
            // runs of this chunk: a head starts one, the chunk's first run may continue the open one
            const int before = __shfl_up_sync(KKM_FULL_MASK, c, 1);
            const unsigned heads = __ballot_sync(KKM_FULL_MASK, lane == 0 || c != before);
            const bool cont = clusters[e0] == cur;
            const unsigned later = heads & ~1u;
            const int first_end = later ? __ffs((int)later) - 1 : 32;
            const int last_start = 31 - __clz((int)heads);
            const bool in_open = cont && lane < first_end;
#pragma unroll
            for (int r = 0; r < KKM_ROWS; ++r) acc[r] += in_open ? val[r] : 0.0;
            close(false);
            first = false;
            // runs that start and end in the chunk (neither the open one nor the last): the run's last lane adds
            // its lanes' values in order
            unsigned inner = (heads >> 1) & ~(1u << 31);
            if (cont) inner &= ~(1u << (first_end - 1));
            if (inner) {
#pragma unroll
                for (int r = 0; r < KKM_ROWS; ++r) chunk[r][lane] = val[r];
                __syncwarp();
                double x[KKM_ROWS];
                if ((inner >> lane) & 1u) {
                    const int start = 31 - __clz((int)(heads & lanes_to_me));
#pragma unroll
                    for (int r = 0; r < KKM_ROWS; ++r) {
                        x[r] = 0.0;
                        for (int l = start; l <= lane; ++l) x[r] += chunk[r][l];
                    }
                }
                // sorted: distinct clusters, one writer each; unsorted: a cluster may end several runs, in lane order
                for (unsigned todo = inner; todo; todo = sorted ? 0u : todo & (todo - 1u)) {
                    const unsigned mine = sorted ? todo : todo & (~todo + 1u);
                    if ((mine >> lane) & 1u) {
#pragma unroll
                        for (int r = 0; r < KKM_ROWS; ++r)
                            if (r < rows) S[(i0 + r) * k + c] += x[r];
                    }
                    __syncwarp();
                }
            }
#pragma unroll
            for (int r = 0; r < KKM_ROWS; ++r) acc[r] = lane >= last_start ? val[r] : 0.0;
            cur = clusters[tail];
        }
        close(true);
    }
}

// Full cluster sums of a row tile (papers' Eq. 3-4 without K):
//     S[i, clusters[j]] += coeffs[j] * v(i, j)        j = 0 .. m-1
// Columns in label order (clusters non-decreasing) split into `pieces` pieces; `unsorted` (tile_order_check) says
// whether they are, and any order is summed correctly. With pieces > 1, tile_combine finishes S.
template <typename T>
__global__ void __launch_bounds__(KKM_THREADS, 3)
tile_cluster_sums(const T* __restrict__ G, const T* __restrict__ row_sq, const T* __restrict__ col_sq, long long t,
                  long long m, int kind, double gamma, double coef0, int degree, const int* __restrict__ clusters,
                  const double* __restrict__ coeffs, const long long* __restrict__ col_points, long long row0,
                  double* __restrict__ S, int k, double* __restrict__ partial, int pieces,
                  const int* __restrict__ unsorted)
{
    kkm_tile_sums<T, false>(G, row_sq, col_sq, t, m, kind, (T)gamma, (T)coef0, degree, clusters, coeffs,
                            col_points, nullptr, m, row0, S, k, partial, pieces, *unsorted == 0);
}

// Incremental cluster sums for the points that moved, over a tile G of their kernel values (tile_epilogue ran
// first: each value computed once): the n_entries signed entries, sorted by cluster, are +w_j in the new
// cluster and -w_j in the old one of moved point j = cols[e]:
//     S[i, clusters[e]] += coeffs[e] * G[i, cols[e]],   i.e. S += K[:, moved] dY
template <typename T>
__global__ void __launch_bounds__(KKM_THREADS, 3)
tile_moved_sums(const T* __restrict__ G, long long t, long long m, const int* __restrict__ clusters,
                const double* __restrict__ coeffs, const long long* __restrict__ cols, long long n_entries,
                double* __restrict__ S, int k, double* __restrict__ partial, int pieces)
{
    kkm_tile_sums<T, true>(G, nullptr, nullptr, t, m, 0, (T)0, (T)0, 1, clusters, coeffs, nullptr, cols, n_entries,
                           0, S, k, partial, pieces, true);
}

// The first and last runs of each piece (partial[(i * pieces + q) * 2 + 0 / 1]) into S, piece by piece in order:
// one thread per row. Nothing to do when the entries were not sorted (then every warp wrote whole rows).
__global__ void tile_combine(const int* __restrict__ clusters, const double* __restrict__ partial, long long t,
                             long long n_entries, int pieces, const int* __restrict__ unsorted,
                             double* __restrict__ S, int k)
{
    if (*unsorted) return;
    const long long per_piece = ((n_entries + pieces - 1) / pieces + 31) / 32 * 32;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < t; i += stride) {
        int c = -1;
        double sum = 0.0;
        for (int q = 0; q < pieces && q * per_piece < n_entries; ++q) {
            const long long p0 = q * per_piece, p1 = min(n_entries, p0 + per_piece);
            const int head = clusters[p0], tail = clusters[p1 - 1];
            for (int s = 0; s < (head == tail ? 1 : 2); ++s) {
                const int cs = s == 0 ? head : tail;
                const double v = partial[(i * pieces + q) * 2 + s];
                if (cs == c) {
                    sum += v;
                } else {
                    if (c >= 0) S[i * k + c] += sum;
                    c = cs;
                    sum = v;
                }
            }
        }
        if (c >= 0) S[i * k + c] += sum;
    }
}

// *unsorted |= some clusters[j] < clusters[j - 1] (the caller zeroes it; an integer OR, so order-free)
__global__ void tile_order_check(const int* __restrict__ clusters, long long m, int* __restrict__ unsorted)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    int bad = 0;
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x + 1; j < m; j += stride)
        bad |= clusters[j] < clusters[j - 1];
    if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(unsorted, 1);
}

// In place: G[i, j] <- v(i, j), the kernel rows themselves (k-means++ seeding, prediction, moved points' values).
// Blocks stride over rows, threads over the columns of a row (coalesced).
template <typename T>
__global__ void tile_epilogue(T* __restrict__ G, const T* __restrict__ row_sq, const T* __restrict__ col_sq,
                              long long t, long long m, int kind, double gamma, double coef0, int degree,
                              const long long* __restrict__ col_points, long long row0)
{
    const bool distance = kind == 1 || kind == 4;
    const T gam = (T)gamma, c0 = (T)coef0;
    for (long long i = blockIdx.x; i < t; i += gridDim.x) {
        T* row = G + i * m;
        const T a = distance ? row_sq[i] : (T)0;
        for (long long j = threadIdx.x; j < m; j += blockDim.x) {
            row[j] = kkm_tile_entry<T>(row[j], a, distance ? col_sq[j] : (T)0, distance ? col_points[j] : -1,
                                       row0 + i, kind, gam, c0, degree);
        }
    }
}

#ifndef __CUDACC_RTC__
// Explicit instantiations so that a plain `nvcc --ptx` (CI's build check) compiles every body;
// at run time CuPy instantiates the same templates through name_expressions.
template __global__ void tile_cluster_sums<float>(const float*, const float*, const float*, long long, long long, int, double, double, int, const int*, const double*, const long long*, long long, double*, int, double*, int, const int*);
template __global__ void tile_cluster_sums<double>(const double*, const double*, const double*, long long, long long, int, double, double, int, const int*, const double*, const long long*, long long, double*, int, double*, int, const int*);
template __global__ void tile_moved_sums<float>(const float*, long long, long long, const int*, const double*, const long long*, long long, double*, int, double*, int);
template __global__ void tile_moved_sums<double>(const double*, long long, long long, const int*, const double*, const long long*, long long, double*, int, double*, int);
template __global__ void tile_epilogue<float>(float*, const float*, const float*, long long, long long, int, double, double, int, const long long*, long long);
template __global__ void tile_epilogue<double>(double*, const double*, const double*, long long, long long, int, double, double, int, const long long*, long long);
#endif
