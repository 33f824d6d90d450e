// kkmgpu: nearest-neighbour selection for the affinity graphs, compiled at run time by CuPy (RawModule).
// CPU twin with the same signature and semantics: kkmgpu/kernels/knn_cpu.py (offer_block); tests hold the two to
// each other (tests/test_twins.py) and both searches to a float64 cdist.
//
// A block G (b x m, row-major) holds inner products a_{row0 + r} . a_{col0 + j} (cuBLAS GEMM). Row i = row0 + r
// of the search keeps its k best candidates in best[i, 0..k-1] (keys, double, ascending) and arg[i, 0..k-1]
// (their indices); a candidate col0 + j has the key
//     col_sq[j] - 2 G[r, j]        (||a_i||^2 is the same for every candidate of row i, so it is left out)
// in double from G in the GEMM's precision mode: the lists are candidates, which kkmgpu/kernels/knn_exact.py
// re-ranks by direct float64 distances and certifies with an error bound of these keys (col_sq holds the norms
// shifted by the candidate's share of that bound).
// and candidates are ordered by (key, index): of equal keys the lower index comes first, so that the kernel and
// its twin keep the same neighbours from the same keys. A point is never its own neighbour. Empty slots hold
// (+inf, -1), which no candidate beats.
//
// One warp per row of G (warps stride over the rows): lane l reads the columns l, l + 32, ... (coalesced) and
// keeps its own sorted list of at most k candidates, seeded with its share of the row's list (entries l, l + 32);
// a candidate enters only when it beats the row's worst and, once the lane's list is full, the lane's worst.
// The row's new list is then the k least of the lanes' lists: k rounds of a warp arg-min over the lanes' heads.
// A row where no lane took a candidate (the usual case once the lists are good) is left as it is.

#ifndef KNN_MAX_NEIGHBORS
#define KNN_MAX_NEIGHBORS 64  // the per-lane list lives in local memory: k <= this (kkmgpu/kernels/knn_cuda.py)
#endif

// (key a, index ia) comes before (key b, index ib); false when either key is NaN
__device__ __forceinline__ bool knn_before(double a, long long ia, double b, long long ib)
{
    return a < b || (a == b && ia < ib);
}

template <typename T>
__global__ void knn_offer_block(const T* __restrict__ G, const double* __restrict__ col_sq, long long b,
                                long long m, long long row0, long long col0, int k, double* __restrict__ best,
                                long long* __restrict__ arg)
{
    const unsigned full = 0xffffffffu;
    const double inf = __longlong_as_double(0x7ff0000000000000LL);
    const long long no_index = 0x7fffffffffffffffLL;
    const int lane = threadIdx.x & 31;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    double key[KNN_MAX_NEIGHBORS];
    long long index[KNN_MAX_NEIGHBORS];
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < b; r += warps) {
        const long long i = row0 + r;
        double* best_i = best + i * k;
        long long* arg_i = arg + i * k;
        const T* row = G + r * m;
        int count = 0;
        for (int p = lane; p < k; p += 32) {
            key[count] = best_i[p];
            index[count] = arg_i[p];
            ++count;
        }
        bool took = false;
        const double worst = best_i[k - 1];
        const long long worst_index = arg_i[k - 1];
        for (long long j = lane; j < m; j += 32) {
            const double v = col_sq[j] - 2.0 * (double)row[j];
            const long long c = col0 + j;
            if (c == i || !knn_before(v, c, worst, worst_index)) continue;
            if (count == k && !knn_before(v, c, key[k - 1], index[k - 1])) continue;
            int p = count < k ? count++ : k - 1;
            while (p > 0 && knn_before(v, c, key[p - 1], index[p - 1])) {
                key[p] = key[p - 1];
                index[p] = index[p - 1];
                --p;
            }
            key[p] = v;
            index[p] = c;
            took = true;
        }
        if (!__any_sync(full, took)) continue;
        __syncwarp();  // every lane has read its share of the row's list before lane 0 overwrites it
        int head = 0;
        for (int out = 0; out < k; ++out) {
            const bool has = head < count;
            const double hk = has ? key[head] : inf;
            const long long hi = has ? index[head] : no_index;
            double mk = hk;
            long long mi = hi;
            for (int s = 16; s > 0; s >>= 1) {
                const double ok = __shfl_xor_sync(full, mk, s);
                const long long oi = __shfl_xor_sync(full, mi, s);
                if (knn_before(ok, oi, mk, mi)) {
                    mk = ok;
                    mi = oi;
                }
            }
            // the lowest lane holding the least head gives it up (seeded empty slots repeat (+inf, -1))
            const unsigned holders = __ballot_sync(full, has && hk == mk && hi == mi);
            if (lane == __ffs((int)holders) - 1) ++head;
            if (lane == 0) {
                best_i[out] = mk;
                arg_i[out] = mi;
            }
        }
    }
}

// out[t] = sum over the features f of ((Q[rows[t], f] - A[cols[t], f]) * scale)^2 in double, for t < m (Q and A
// row-major with d columns, one dtype): kkmgpu/kernels/knn_exact.py cross_distances, the exact distances that
// re-rank the candidates. One warp per pair (warps stride over the pairs): lane l adds the features l, l + 32, ...
// in order (coalesced reads), then the lanes' sums are added by a fixed butterfly. The order depends on d alone,
// not on how many pairs a call holds: the same pair gives the same bits in every call (CuPy's row reduction, used
// before, chose its order by the array's shape, and two landmark fits of one seed differed in the last bits).
template <typename T>
__global__ void knn_pair_distances(const T* __restrict__ Q, const T* __restrict__ A,
                                   const long long* __restrict__ rows, const long long* __restrict__ cols,
                                   long long m, long long d, double scale, double* __restrict__ out)
{
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long t = warp; t < m; t += warps) {  // the same trip count for every lane of a warp
        const T* q = Q + rows[t] * d;
        const T* a = A + cols[t] * d;
        double s = 0.0;
        for (long long f = lane; f < d; f += 32) {
            const double diff = ((double)q[f] - (double)a[f]) * scale;
            s += diff * diff;
        }
        for (int width = 16; width > 0; width >>= 1) s += __shfl_xor_sync(0xffffffffu, s, width);
        if (lane == 0) out[t] = s;
    }
}

#ifndef __CUDACC_RTC__
// Explicit instantiations so that a plain `nvcc --ptx` (CI's build check) compiles every body;
// at run time CuPy instantiates the same templates through name_expressions.
template __global__ void knn_offer_block<float>(const float*, const double*, long long, long long, long long, long long, int, double*, long long*);
template __global__ void knn_offer_block<double>(const double*, const double*, long long, long long, long long, long long, int, double*, long long*);
template __global__ void knn_pair_distances<float>(const float*, const float*, const long long*, const long long*, long long, long long, double, double*);
template __global__ void knn_pair_distances<double>(const double*, const double*, const long long*, const long long*, long long, long long, double, double*);
#endif
