// The residual stream's ops in the element types around them, where candle ran a
// cast, an add, its RMS norm and another cast:
//
// `add_into` adds a projection's output (f16 from the dense weights' GEMM, or f32) into the f32
// residual stream in place; `rms_norm` normalizes each row (y = x / sqrt(mean(x^2) + eps) * w)
// and writes it in the element type the next projection multiplies (f16 for its dense weights).
// `add_norm` does both in one launch where the norm's rows are f32 (the next projection's
// quantized weights): it adds a block's row, keeps its squares' sum and writes the normalized row
// into the rows after the stream's (the stream tensor has room for them, src/llama/fused.rs
// `AddNorm`). It adds the squares in `rms_norm`'s order, so its output equals `add_into` then
// `rms_norm_f32_f32` bit for bit.
// The arithmetic is the host forward's (`fused::rms_norm_row` in src/llama/fused.rs, the ops'
// CPU side), each operation rounded alone; the block adds the squares in another order than the
// host, so the norm agrees within rounding, the add bit for bit.

#include "common.cuh"

#define NORM_THREADS 256

// The sum of every thread's `ss` over the block (NORM_THREADS threads), in every thread: each
// warp's sum, then the warps' sums added by every warp. Called once per launch (its shared memory
// is not synchronized for a second call).
__device__ __forceinline__ float block_sum(float ss) {
    __shared__ float red[NORM_THREADS / 32];
    ss = warp_sum(ss);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    ss = lane < warps ? red[lane] : 0.0f;
    return warp_sum(ss);
}

// `row` normalized by the sum of its squares `ss` into `o`: x / sqrt(ss / width + eps) * w.
template <typename IN, typename OUT>
__device__ __forceinline__ void write_norm(const IN* row, OUT* o, const float* __restrict__ w,
                                           int width, float ss, float eps) {
    const float m = __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)width), eps));
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        o[i] = from_float<OUT>(__fmul_rn(__fdiv_rn(to_float(row[i]), m), w[i]));
}

template <typename IN, typename OUT>
__device__ void rms_norm(const IN* __restrict__ x, OUT* __restrict__ out,
                         const float* __restrict__ w, int width, float eps) {
    const IN* row = x + (size_t)blockIdx.x * width;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        const float v = to_float(row[i]);
        ss = __fadd_rn(ss, __fmul_rn(v, v));
    }
    write_norm(row, out + (size_t)blockIdx.x * width, w, width, block_sum(ss), eps);
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

// `xh`: the stream's `rows` rows (f32, one block each, gridDim.x = rows), then room for as many
// normalized rows. A thread rereads only the values it wrote.
template <typename Y>
__device__ void add_norm(float* __restrict__ xh, const Y* __restrict__ y,
                         const float* __restrict__ w, int width, float eps) {
    const size_t at = (size_t)blockIdx.x * width;
    float* row = xh + at;
    const Y* add = y + at;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        const float v = __fadd_rn(row[i], to_float(add[i]));
        row[i] = v;
        ss = __fadd_rn(ss, __fmul_rn(v, v));
    }
    float* h = xh + (size_t)gridDim.x * width + at;
    write_norm(row, h, w, width, block_sum(ss), eps);
}

#define ADD_NORM(NAME, Y)                                                                      \
    extern "C" __global__ void __launch_bounds__(NORM_THREADS)                                 \
        NAME(float* xh, const Y* y, const float* w, int width, float eps) {                    \
        add_norm<Y>(xh, y, w, width, eps);                                                     \
    }

ADD_NORM(add_norm_f32, float)
ADD_NORM(add_norm_f16, __half)
