// Correct kernels for cudacpu's own tests (tests/test_cudacpu.py): each must give the NumPy reference's result in
// every mode (forward / reverse / random schedules, AddressSanitizer + UBSan, ThreadSanitizer).

// Sum of x (n entries): each block reduces a chunk in shared memory (tree, barriers), thread 0 adds the block's
// partial to *total atomically. blockDim.x must be a power of two; shared_mem = blockDim.x doubles.
extern "C" __global__ void block_sums(const double* __restrict__ x, double* __restrict__ total, long long n)
{
    extern __shared__ double partial[];
    const unsigned t = threadIdx.x;
    double acc = 0.0;
    for (long long i = (long long)blockIdx.x * blockDim.x + t; i < n; i += (long long)gridDim.x * blockDim.x)
        acc += x[i];
    partial[t] = acc;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) partial[t] += partial[t + s];
        __syncthreads();
    }
    if (t == 0) atomicAdd(total, partial[0]);
}

// Every thread writes its indices: out[g * 12 + ...] = threadIdx.xyz, blockIdx.xyz, blockDim.xyz, gridDim.xyz,
// g the global linear thread number (x fastest, threads of a block before the next block).
extern "C" __global__ void write_indices(unsigned* out)
{
    const unsigned long long block = blockIdx.x + (unsigned long long)gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned* o = out + (block * threads + t) * 12;
    o[0] = threadIdx.x, o[1] = threadIdx.y, o[2] = threadIdx.z;
    o[3] = blockIdx.x, o[4] = blockIdx.y, o[5] = blockIdx.z;
    o[6] = blockDim.x, o[7] = blockDim.y, o[8] = blockDim.z;
    o[9] = gridDim.x, o[10] = gridDim.y, o[11] = gridDim.z;
}

// Per warp (out[w * 5 + ...], w the global warp number): the sum of its x (shuffle down), the count of x > 0.5
// (ballot), the maximum (shuffle xor butterfly), whether any / all are > 0.5. Entries past n read as 0.
extern "C" __global__ void warp_stats(const double* __restrict__ x, double* __restrict__ out, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const double v = i < n ? x[i] : 0.0;
    double sum = v, mx = v;
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, off);
    for (int m = 16; m > 0; m >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, m));
    const unsigned votes = __ballot_sync(0xffffffffu, v > 0.5);
    const int any = __any_sync(0xffffffffu, v > 0.5), all = __all_sync(0xffffffffu, v > 0.5);
    const double first = __shfl_sync(0xffffffffu, mx, 0);  // every lane agrees on the butterfly's maximum
    if ((threadIdx.x & 31) == 0) {
        double* o = out + (i / 32) * 5;
        o[0] = sum, o[1] = __popc(votes), o[2] = first, o[3] = any, o[4] = all;
    }
}

// y = a * x, instantiated by name expression (scale<float>, scale<double>)
template <typename T>
__global__ void scale(T* __restrict__ y, const T* __restrict__ x, T a, long long n)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = a * x[i];
}

// Histogram of labels in [0, bins): shared-memory counts (atomics), then one global atomic per bin and block.
// Uses __syncthreads_count to report how many labels were in range (out of range are skipped).
extern "C" __global__ void histogram(const int* __restrict__ labels, long long n, unsigned long long* __restrict__ counts,
                                     int bins, unsigned* __restrict__ in_range)
{
    __shared__ unsigned local[64];
    for (int b = threadIdx.x; b < bins; b += blockDim.x) local[b] = 0;
    __syncthreads();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int ok = i < n && labels[i] >= 0 && labels[i] < bins;
    if (ok) atomicAdd(&local[labels[i]], 1u);
    const int block_ok = __syncthreads_count(ok);
    for (int b = threadIdx.x; b < bins; b += blockDim.x) atomicAdd(&counts[b], (unsigned long long)local[b]);
    if (threadIdx.x == 0) atomicAdd(in_range, (unsigned)block_ok);
}
