// The part of CUDA's device API that quarry's kernels use, on the CPU (quarry-cuda-emu).
//
// A launch runs one block at a time on the calling OS thread; the block's threads are fibers
// (their own stacks, switched by emu/runtime.cpp) that run until they reach a barrier, so
// `__syncthreads`, the warp shuffles and every read and write of shared memory happen in an order
// the CUDA programming model allows. What a GPU leaves undefined is made visible where it is
// cheap: dynamic shared memory starts as NaN bytes, a 16-byte load must be aligned, a barrier not
// every live thread reaches is reported as a deadlock, a shuffle must name the whole warp, and
// cub's block reductions give their result to thread 0 only.
//
// What this cannot show: speed, register or shared-memory limits, and the GPU's own arithmetic
// (no fused multiply-add where nvcc would contract, exact expf for __expf): the tests compare
// with tolerances that cover those.

#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmath>

using std::isnan;

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

extern thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(quarry_emu::dynamic_shared())

namespace quarry_emu {
// The block's barrier and the calling thread's warp's barrier (fibers yield until every live
// thread of the block, or of the warp, has arrived).
void sync_block();
// The block's barrier, returning whether `pred` was non-zero for any thread that arrived.
int sync_block_or(int pred);
void sync_warp();
// The current thread's warp's exchange slots (32 words).
uint64_t* warp_slots();
// The launch's dynamic shared memory (shared_bytes, 16-byte aligned, NaN bytes at each block's
// start).
void* dynamic_shared();
// Stops the launch with a message (a kernel's use of the API this emulator refuses).
[[noreturn]] void fail(const char* what);
// Stops the launch where bytes p .. p + n are not all in the launch's dynamic shared memory: the
// 16-byte shared accesses' check, which the canary after it misses where an access lands far
// past the end (a plan that made too little room).
void check_shared(const void* p, size_t n);
// common.cuh's L2 prefetch: records the 128-byte line of `p` for the calling OS thread (the
// tests read them with quarry_emu_take_prefetches), and loads nothing.
void prefetch_l2(const void* p);
}  // namespace quarry_emu
#define PREFETCH_L2(p) quarry_emu::prefetch_l2(p)

__forceinline__ void __syncthreads() { quarry_emu::sync_block(); }
__forceinline__ int __syncthreads_or(int pred) { return quarry_emu::sync_block_or(pred); }
// One block runs at a time and its fibers switch only at barriers, so every write is seen by
// every later read: a fence orders nothing more.
__forceinline__ void __threadfence() {}
__forceinline__ void __syncwarp(unsigned mask = 0xffffffffu) {
    if (mask != 0xffffffffu) quarry_emu::fail("__syncwarp with a partial mask");
    quarry_emu::sync_warp();
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
    if (mask != 0xffffffffu || width != 32) quarry_emu::fail("a shuffle over part of a warp");
    uint64_t* slots = quarry_emu::warp_slots();
    const unsigned lane = threadIdx.x & 31u;
    uint64_t word = 0;
    memcpy(&word, &value, sizeof(T));
    slots[lane] = word;
    quarry_emu::sync_warp();
    word = slots[(lane ^ (unsigned)lane_mask) & 31u];
    quarry_emu::sync_warp();
    T out;
    memcpy(&out, &word, sizeof(T));
    return out;
}

// Fibers of one block never run at the same time, so an atomic is a plain read and write.
template <typename T>
T atomicAdd(T* at, T value) {
    const T old = *at;
    *at = old + value;
    return old;
}

template <typename T>
__forceinline__ T min(T a, T b) {
    return b < a ? b : a;
}
template <typename T>
__forceinline__ T max(T a, T b) {
    return a < b ? b : a;
}

// Intrinsics: the _rn forms are IEEE operations rounded to nearest (the build turns off
// contraction into fused multiply-adds); __expf is the GPU's fast exponential, here exact.
__forceinline__ float __fadd_rn(float a, float b) { return a + b; }
__forceinline__ float __fsub_rn(float a, float b) { return a - b; }
__forceinline__ float __fmul_rn(float a, float b) { return a * b; }
__forceinline__ float __fdiv_rn(float a, float b) { return a / b; }
__forceinline__ float __fsqrt_rn(float a) { return sqrtf(a); }
__forceinline__ float __expf(float a) { return expf(a); }
__forceinline__ uint32_t __float_as_uint(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
__forceinline__ float __uint_as_float(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

// The bytes of y:x (x the low 4) that the low 3 bits of each of s's 4 nibbles select, byte 0
// first (CUDA's default mode).
__forceinline__ uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
    const uint64_t v = ((uint64_t)y << 32) | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) {
        const uint32_t sel = (s >> (4 * i)) & 7u;
        r |= (uint32_t)((v >> (8 * sel)) & 0xffu) << (8 * i);
    }
    return r;
}

// 16-bit floats: IEEE half as the compiler's _Float16 (conversions round to nearest even), bf16
// as its bits.
typedef _Float16 __half;
struct __nv_bfloat16 {
    uint16_t bits;
};
__forceinline__ float __half2float(__half h) { return (float)h; }
__forceinline__ __half __float2half_rn(float x) { return (__half)x; }
__forceinline__ float __bfloat162float(__nv_bfloat16 b) { return __uint_as_float((uint32_t)b.bits << 16); }
__forceinline__ __nv_bfloat16 __float2bfloat16_rn(float x) {
    const uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(uint16_t)((u >> 16) | 0x40u)};
    return __nv_bfloat16{(uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

// Vector loads: a GPU faults on a misaligned one, so the emulator refuses it.
struct alignas(16) uint4 {
    uint32_t x, y, z, w;
};
template <typename T>
__forceinline__ T __ldg(const T* at) {
    if (reinterpret_cast<uintptr_t>(at) % alignof(T) != 0) quarry_emu::fail("a misaligned vector load");
    return *at;
}
// A load that skips L1 (a GPU's for data other blocks of the launch wrote): a plain load here.
template <typename T>
__forceinline__ T __ldcg(const T* at) {
    return __ldg(at);
}
struct alignas(16) float4 {
    float x, y, z, w;
};
// common.cuh's 16-byte load of shared memory, refused where misaligned as a GPU faults.
// Both are refused outside the dynamic shared memory too (every kernel's 16-byte shared
// accesses are in it).
template <typename T>
__forceinline__ T quarry_emu_load_shared(const T* at) {
    quarry_emu::check_shared(at, sizeof(T));
    return __ldg(at);
}
#define SHARED_LOAD4(p) quarry_emu_load_shared(reinterpret_cast<const float4*>(p))
#define SHARED_LOAD16(p) quarry_emu_load_shared(reinterpret_cast<const uint4*>(p))
template <typename T>
__forceinline__ void quarry_emu_store(T* at, T x) {
    if (reinterpret_cast<uintptr_t>(at) % alignof(T) != 0) quarry_emu::fail("a misaligned vector store");
    quarry_emu::check_shared(at, sizeof(T));
    *at = x;
}
#define SHARED_STORE16(p, x) quarry_emu_store(reinterpret_cast<uint4*>(p), (x))
