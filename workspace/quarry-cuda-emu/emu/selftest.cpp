// Kernels that test the emulator itself (tests/emulator.rs): barriers, warp exchanges, and the
// errors it must report rather than hide.

#include "cuda_emu.h"

// out[i] = in[n - 1 - i] through dynamic shared memory: wrong without a working __syncthreads.
extern "C" __global__ void emu_reverse(const float* in, float* out) {
    DYNAMIC_SHARED(float, s);
    const unsigned n = blockDim.x, i = threadIdx.x, base = blockIdx.x * n;
    s[i] = in[base + i];
    __syncthreads();
    out[base + i] = s[n - 1 - i];
}

// Each warp's sum, by butterfly exchanges, written by every lane.
extern "C" __global__ void emu_warp_sum(const float* in, float* out) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    float x = in[i];
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    out[i] = x;
}

// Thread 0 waits at the block's barrier while the rest of its warp waits for it at an exchange.
extern "C" __global__ void emu_deadlock(float* out) {
    if (threadIdx.x == 0) {
        __syncthreads();
    } else {
        out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
    }
}

// Writes one float past `words` of dynamic shared memory.
extern "C" __global__ void emu_shared_overflow(int words) {
    DYNAMIC_SHARED(float, s);
    if (threadIdx.x == 0) s[words] = 1.0f;
}

// Reads dynamic shared memory no thread wrote: the emulator's NaN bytes.
extern "C" __global__ void emu_read_unwritten(float* out) {
    DYNAMIC_SHARED(float, s);
    out[threadIdx.x] = s[threadIdx.x];
}

// Threads that return early no longer hold the block's barrier.
extern "C" __global__ void emu_early_return(float* out) {
    if (threadIdx.x % 2 == 1) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

// Three votes in a row, each by another set of threads: out[3 * thread + r] is vote r's result
// as that thread saw it. Vote 0: thread `voter` alone; vote 1: nobody; vote 2: every odd thread.
extern "C" __global__ void emu_votes(int voter, int* out) {
    const unsigned i = threadIdx.x;
    out[3 * i] = __syncthreads_or((int)i == voter);
    out[3 * i + 1] = __syncthreads_or(0);
    out[3 * i + 2] = __syncthreads_or(i % 2);
}
