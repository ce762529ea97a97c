// What quarry's kernels share: conversions between the element types they read and write, and
// warp reductions. Included by the .cu files next to it (build.rs compiles each to PTX;
// workspace/quarry-cuda-emu compiles them for the CPU).

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// A kernel's dynamic shared memory (the launch's shared_mem_bytes), as a macro so that
// quarry-cuda-emu, which runs these kernels on the CPU, can give it a block's memory.
#ifndef DYNAMIC_SHARED
#define DYNAMIC_SHARED(T, name) extern __shared__ __align__(16) T name[]
#endif

// Four floats of shared memory in one 16-byte load (`p` 16-byte aligned), as a macro so that
// quarry-cuda-emu can refuse a misaligned one, as a GPU faults on it.
#ifndef SHARED_LOAD4
#define SHARED_LOAD4(p) (*reinterpret_cast<const float4*>(p))
#endif

// 16 bytes of shared memory loaded and stored whole (`p` 16-byte aligned), refused by
// quarry-cuda-emu where misaligned, as a GPU faults on it.
#ifndef SHARED_LOAD16
#define SHARED_LOAD16(p) (*reinterpret_cast<const uint4*>(p))
#define SHARED_STORE16(p, x) (*reinterpret_cast<uint4*>(p) = (x))
#endif

// A hint that the 128-byte line at `p` (global memory) be brought into L2, without waiting for
// it; as a macro so that quarry-cuda-emu can record which lines a kernel asks for.
#ifndef PREFETCH_L2
#define PREFETCH_L2(p) asm volatile("prefetch.global.L2 [%0];" ::"l"(p))
#endif

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// Round to nearest even, as half::f16::from_f32 and candle's casts do.
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
    return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
    return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
