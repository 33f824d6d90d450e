// Planted bug for cudacpu's tests: blocks add their partial sums into one total without an atomic. Blocks run one
// after another on the CPU, so every plain run gives the right total; only ThreadSanitizer reports the race
// (on the device, two blocks' read-modify-writes interleave and lose updates).
extern "C" __global__ void racy_total(const double* __restrict__ x, double* __restrict__ total, long long n)
{
    __shared__ double partial;
    if (threadIdx.x == 0) partial = 0.0;
    __syncthreads();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&partial, x[i]);
    __syncthreads();
    if (threadIdx.x == 0) *total += partial;  // PLANTED: should be atomicAdd(total, partial)
}
