// Planted bug for cudacpu's tests: a kernel that uses one more double of dynamic shared memory than the launch
// reserves (k + 1 slots for k * 8 bytes); AddressSanitizer reports the access past shared_mem.
extern "C" __global__ void bucket_sums(const int* __restrict__ bucket, const double* __restrict__ w, int n, int k,
                                       double* __restrict__ out)
{
    extern __shared__ double sums[];
    for (int c = threadIdx.x; c <= k; c += blockDim.x)
        sums[c] = 0.0;  // PLANTED: c <= k writes sums[k], past the k reserved slots
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(&sums[bucket[i]], w[i]);
    __syncthreads();
    for (int c = threadIdx.x; c < k; c += blockDim.x) out[c] = sums[c];
}
