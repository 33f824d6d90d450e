// Planted bug for cudacpu's tests: a missing __syncthreads between reading a neighbour's shared entry and
// overwriting one's own. Forward, reverse and random schedules give different results; ThreadSanitizer reports
// the race (also when a later barrier follows, which a single cumulative barrier clock would hide).
// y[i] = 2 * x[block start + (t + 1) % blockDim.x] (a rotation by one within the block), when correct.
extern "C" __global__ void rotate_double(const double* __restrict__ x, double* __restrict__ y)
{
    extern __shared__ double buf[];
    const unsigned t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    buf[t] = x[i];
    __syncthreads();
    const double v = buf[(t + 1) % blockDim.x];
    // PLANTED: __syncthreads() missing here: a neighbour may overwrite buf[t + 1] before this thread read it
    buf[t] = 2.0 * v;
    __syncthreads();
    y[i] = buf[t];
}
