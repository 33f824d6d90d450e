// Planted bugs for cudacpu's tests: undefined behaviour that UndefinedBehaviorSanitizer reports (built with
// address,undefined), while a plain run goes on with whatever the CPU does.

// a 32-bit index product that overflows for large blocks (should be computed in long long)
extern "C" __global__ void strided_gather(const float* __restrict__ x, float* __restrict__ y, int stride, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int at = i * stride;  // PLANTED: signed overflow when i * stride > INT_MAX
    if (i < n) y[i] = x[(unsigned)at % (unsigned)n];
}

// a double read through a pointer 4 bytes past an 8-byte boundary
extern "C" __global__ void misaligned_read(const double* __restrict__ x, double* __restrict__ y)
{
    const double* shifted = (const double*)((const char*)x + 4);  // PLANTED: misaligned
    y[threadIdx.x] = shifted[threadIdx.x];
}
