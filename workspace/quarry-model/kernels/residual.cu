// The residual stream's ops in the element types around them (issue 25), where candle ran a
// cast, an add, its RMS norm and another cast:
//
// `add_into` adds a projection's output (f16 from the dense weights' GEMM, or f32) into the f32
// residual stream in place; `rms_norm` normalizes each row (y = x / sqrt(mean(x^2) + eps) * w)
// and writes it in the element type the next projection multiplies (f16 for its dense weights).
// The arithmetic is the host forward's (`fused::rms_norm_row` in src/llama/fused.rs, the ops'
// CPU side), each operation rounded alone; the block adds the squares in another order than the
// host, so the norm agrees within rounding, the add bit for bit.

#include "common.cuh"

#define NORM_THREADS 256

template <typename IN, typename OUT>
__device__ void rms_norm(const IN* __restrict__ x, OUT* __restrict__ out,
                         const float* __restrict__ w, int width, float eps) {
    __shared__ float red[NORM_THREADS / 32];
    const IN* row = x + (size_t)blockIdx.x * width;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        const float v = to_float(row[i]);
        ss = __fadd_rn(ss, __fmul_rn(v, v));
    }
    ss = warp_sum(ss);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    ss = lane < warps ? red[lane] : 0.0f;
    ss = warp_sum(ss);
    const float m = __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)width), eps));
    OUT* o = out + (size_t)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        o[i] = from_float<OUT>(__fmul_rn(__fdiv_rn(to_float(row[i]), m), w[i]));
}

#define RMS_NORM(NAME, IN, OUT)                                                                \
    extern "C" __global__ void __launch_bounds__(NORM_THREADS)                                 \
        NAME(const IN* x, OUT* out, const float* w, int width, float eps) {                    \
        rms_norm<IN, OUT>(x, out, w, width, eps);                                              \
    }

RMS_NORM(rms_norm_f32_f32, float, float)
RMS_NORM(rms_norm_f32_f16, float, __half)
RMS_NORM(rms_norm_f16_f32, __half, float)
RMS_NORM(rms_norm_f16_f16, __half, __half)

template <typename Y>
__device__ void add_into(float* __restrict__ x, const Y* __restrict__ y, uint64_t n) {
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        x[i] = __fadd_rn(x[i], to_float(y[i]));
}

extern "C" __global__ void add_into_f32(float* x, const float* y, uint64_t n) {
    add_into<float>(x, y, n);
}
extern "C" __global__ void add_into_f16(float* x, const __half* y, uint64_t n) {
    add_into<__half>(x, y, n);
}
