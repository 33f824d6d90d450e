// Planted bug for cudacpu's tests (issue 27, a surviving mutant): kernels_cuda/kernel_kmeans.cu's assign_labels,
// verbatim but for its per-cluster count, made a plain increment. Blocks run one after another on the CPU and a
// block's threads switch only at barriers, so every plain run counts right; on a GPU two threads' read-modify-
// writes of one cluster's count interleave and lose points. Only ThreadSanitizer sees it (each block on its own
// thread there). tests/test_cudacpu.py checks that this copy still equals the real kernel but for that line.
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
        stats[1 + best] += 1ULL;  // PLANTED: kernel_kmeans.cu has atomicAdd(&stats[1 + best], 1ULL)
    }
}

template __global__ void assign_labels<double>(const double*, const double*, const double*, const double*, const int*, int*, double*, unsigned long long*, long long, int);
