// Kernels with device-side errors that cudacpu turns into a CudaCpuError (tests/test_cudacpu.py), one per kernel.

// threads of one block reach two different __syncthreads
extern "C" __global__ void two_barriers(int* x)
{
    if (threadIdx.x & 1)
        __syncthreads();
    else
        __syncthreads();
    x[threadIdx.x] = 1;
}

// a device-side assert
extern "C" __global__ void checked(const int* x, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) assert(x[i] >= 0);
}

// __trap() in one thread of one block
extern "C" __global__ void trap_one(int* x)
{
    if (blockIdx.x == 1 && threadIdx.x == 3) __trap();
    x[threadIdx.x] = 1;
}

// a shuffle that reads lane 20 while only lanes 0-15 take part
extern "C" __global__ void bad_shuffle(int* x)
{
    if (threadIdx.x < 16) x[threadIdx.x] = __shfl_sync(0x0000ffffu, (int)threadIdx.x, 20);
}

// lane 0 waits at __syncwarp for lane 1, which waits at __syncthreads for lane 0: a deadlock
extern "C" __global__ void warp_deadlock(int* x)
{
    if (threadIdx.x == 0) __syncwarp(0x3u);
    else __syncthreads();
    x[threadIdx.x] = 1;
}

// reads dynamic shared memory nobody wrote: 0xff bytes (NaN) on every block, as garbage would be on the device
extern "C" __global__ void read_uninitialised(double* out)
{
    extern __shared__ double scratch[];
    out[blockIdx.x * blockDim.x + threadIdx.x] = scratch[threadIdx.x];
    scratch[threadIdx.x] = 1.0;  // the next block must not see this
}

// lanes of two half-warps exchange within their half (disjoint masks at once), then all 32 lanes vote
extern "C" __global__ void half_warps(int* out)
{
    const unsigned lane = threadIdx.x & 31;
    const unsigned mask = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    const int v = __shfl_xor_sync(mask, (int)lane, 1);
    out[threadIdx.x] = v + 100 * __popc(__ballot_sync(0xffffffffu, v > (int)lane));
}
