// Planted bug for cudacpu's tests: an out-of-bounds read (off by one) that a plain run does not notice and
// AddressSanitizer reports at the line below the marker.
extern "C" __global__ void shift_left(const float* __restrict__ x, float* __restrict__ y, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    // PLANTED: x[i + 1] for the last i is one past the end
    if (i < n) y[i] = x[i + 1];
}
