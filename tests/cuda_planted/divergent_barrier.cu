// Planted bug for cudacpu's tests: a __syncthreads that only half of the block reaches (the other half returned).
// Undefined on the device (a hang or garbage); cudacpu raises CudaCpuError naming the block and a thread.
extern "C" __global__ void half_barrier(const float* __restrict__ x, float* __restrict__ y, int n)
{
    extern __shared__ float tile[];
    const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    if (t >= blockDim.x / 2) return;  // PLANTED: these threads never reach the barrier below
    tile[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) y[i] = tile[(t + 1) % (blockDim.x / 2)];
}
