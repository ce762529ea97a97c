// The attention's inputs from the stacked Q/K/V projection in one launch per layer, then one per
// pool for the KV writes, where candle ran a cast, three bias adds, two norms, two
// RoPE kernels, copies and a cast and a scatter per pool.
//
// `rope_qk` takes the stacked projection ([tokens, width], width = q_w + 2 kv_w: a token's query
// heads, key heads, value heads, as the one GEMM of the stacked weights writes it, in f32 or f16),
// adds the bias (Qwen2), normalizes each query and key head (Gemma 3's per-head norms), rotates
// each pair of every query and key head by position * theta_i (RoPE: pairs (2i, 2i + 1), or
// (i, i + head_dim / 2) for the NeoX style, with the model's cos and sin tables, [positions,
// head_dim / 2]), and writes f32 planes: every token's queries ([tokens, q_w]), then keys, then
// values ([tokens, kv_w] each), so each is a contiguous tensor for the next op. One block per
// token; the row goes through shared memory (width floats).
//
// `store_rows` writes a plane of keys or values into the pool's rows at the tokens' slots, in
// the pool's element type (round to nearest even). `rope_store` does `rope_qk`'s work but writes
// only the queries as a plane and the keys and values straight into the pools' rows, as
// `store_rows` would: one launch for the three (src/llama/fused.rs `RopeStore`).
//
// The arithmetic is the host forward's (`fused::rotate_heads` in src/llama/fused.rs, the op's CPU
// side): products and sums rounded one by one (no fused multiply-add), so without the per-head
// norms (whose sums of squares the GPU adds in another order) the GPU's values equal the host's
// bit for bit.

#include "common.cuh"

// One token's rows (the block's): `in` its stacked Q/K/V values, `out_q` its queries (f32),
// `out_k` and `out_v` its key and value rows, in the type `KV` they are kept in (f32 planes for
// `rope_qk`, the pool's type for `rope_store`).
template <typename IN, typename KV>
__device__ void rope_rows(const IN* __restrict__ in, const float* __restrict__ bias,
                          const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                          const float* __restrict__ cos_table, const float* __restrict__ sin_table,
                          uint32_t position, float* __restrict__ out_q, KV* __restrict__ out_k,
                          KV* __restrict__ out_v, int n_head, int n_kv, int head_dim,
                          int interleaved, float eps) {
    DYNAMIC_SHARED(float, row);
    const int q_w = n_head * head_dim, kv_w = n_kv * head_dim, width = q_w + 2 * kv_w;
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        row[i] = bias ? __fadd_rn(to_float(in[i]), bias[i]) : to_float(in[i]);
    __syncthreads();
    const int heads = n_head + n_kv;
    if (q_norm) {
        // A warp per head: x / sqrt(mean(x^2) + eps) * w.
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
        for (int h = warp; h < heads; h += warps) {
            float* x = row + h * head_dim;
            float ss = 0.0f;
            for (int i = lane; i < head_dim; i += 32) ss = __fadd_rn(ss, __fmul_rn(x[i], x[i]));
            ss = warp_sum(ss);
            const float m = __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)head_dim), eps));
            const float* w = h < n_head ? q_norm : k_norm;
            for (int i = lane; i < head_dim; i += 32) x[i] = __fmul_rn(__fdiv_rn(x[i], m), w[i]);
        }
        __syncthreads();
    }
    const int half = head_dim / 2;
    const size_t at = (size_t)position * half;
    for (int p = threadIdx.x; p < heads * half; p += blockDim.x) {
        const int h = p / half, i = p - h * half;
        const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
        const float x0 = row[h * head_dim + a], x1 = row[h * head_dim + b];
        const float c = cos_table[at + i], s = sin_table[at + i];
        const float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        const float y1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
        if (h < n_head) {
            float* o = out_q + h * head_dim;
            o[a] = y0;
            o[b] = y1;
        } else {
            KV* o = out_k + (h - n_head) * head_dim;
            o[a] = from_float<KV>(y0);
            o[b] = from_float<KV>(y1);
        }
    }
    for (int i = threadIdx.x; i < kv_w; i += blockDim.x)
        out_v[i] = from_float<KV>(row[q_w + kv_w + i]);
}

// The planes: every token's queries, then keys, then values.
template <typename IN>
__device__ void rope_qk(const IN* __restrict__ qkv, const float* __restrict__ bias,
                        const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                        const float* __restrict__ cos_table, const float* __restrict__ sin_table,
                        const uint32_t* __restrict__ positions, float* __restrict__ out,
                        int tokens, int n_head, int n_kv, int head_dim, int interleaved,
                        float eps) {
    const int t = blockIdx.x;
    const int q_w = n_head * head_dim, kv_w = n_kv * head_dim, width = q_w + 2 * kv_w;
    rope_rows<IN, float>(qkv + (size_t)t * width, bias, q_norm, k_norm, cos_table, sin_table,
                         positions[t], out + (size_t)t * q_w,
                         out + (size_t)tokens * q_w + (size_t)t * kv_w,
                         out + (size_t)tokens * (q_w + kv_w) + (size_t)t * kv_w, n_head, n_kv,
                         head_dim, interleaved, eps);
}

#define ROPE_QK(NAME, IN)                                                                      \
    extern "C" __global__ void NAME(const IN* qkv, const float* bias, const float* q_norm,    \
                                    const float* k_norm, const float* cos_table,               \
                                    const float* sin_table, const uint32_t* positions,         \
                                    float* out, int tokens, int n_head, int n_kv,              \
                                    int head_dim, int interleaved, float eps) {                \
        rope_qk<IN>(qkv, bias, q_norm, k_norm, cos_table, sin_table, positions, out, tokens,  \
                    n_head, n_kv, head_dim, interleaved, eps);                                 \
    }

ROPE_QK(rope_qk_f32, float)
ROPE_QK(rope_qk_f16, __half)

template <typename P>
__device__ void store_rows(const float* __restrict__ src, const uint32_t* __restrict__ slots,
                           P* __restrict__ pool, uint64_t tokens, uint64_t width) {
    const uint64_t n = tokens * width;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t r = i / width, j = i - r * width;
        pool[(uint64_t)slots[r] * width + j] = from_float<P>(src[i]);
    }
}

#define STORE_ROWS(NAME, P)                                                                    \
    extern "C" __global__ void NAME(const float* src, const uint32_t* slots, P* pool,         \
                                    uint64_t tokens, uint64_t width) {                         \
        store_rows<P>(src, slots, pool, tokens, width);                                        \
    }

STORE_ROWS(store_rows_f32, float)
STORE_ROWS(store_rows_f16, __half)
STORE_ROWS(store_rows_bf16, __nv_bfloat16)

// `rope_store`: the queries into `q_out` (`[tokens, q_w]`, f32), the keys and values straight
// into the pools' rows at the tokens' slots (what `rope_qk` then `store_rows` on each pool write,
// in one launch).
template <typename IN, typename P>
__device__ void rope_store(const IN* __restrict__ qkv, const float* __restrict__ bias,
                           const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                           const float* __restrict__ cos_table,
                           const float* __restrict__ sin_table,
                           const uint32_t* __restrict__ positions,
                           const uint32_t* __restrict__ slots, float* __restrict__ q_out,
                           P* __restrict__ k_pool, P* __restrict__ v_pool, int n_head, int n_kv,
                           int head_dim, int interleaved, float eps) {
    const int t = blockIdx.x;
    const int q_w = n_head * head_dim, kv_w = n_kv * head_dim, width = q_w + 2 * kv_w;
    const size_t slot = (size_t)slots[t] * kv_w;
    rope_rows<IN, P>(qkv + (size_t)t * width, bias, q_norm, k_norm, cos_table, sin_table,
                     positions[t], q_out + (size_t)t * q_w, k_pool + slot, v_pool + slot, n_head,
                     n_kv, head_dim, interleaved, eps);
}

#define ROPE_STORE(NAME, IN, P)                                                                \
    extern "C" __global__ void NAME(const IN* qkv, const float* bias, const float* q_norm,    \
                                    const float* k_norm, const float* cos_table,               \
                                    const float* sin_table, const uint32_t* positions,         \
                                    const uint32_t* slots, float* q_out, P* k_pool, P* v_pool, \
                                    int n_head, int n_kv, int head_dim, int interleaved,       \
                                    float eps) {                                               \
        rope_store<IN, P>(qkv, bias, q_norm, k_norm, cos_table, sin_table, positions, slots,  \
                          q_out, k_pool, v_pool, n_head, n_kv, head_dim, interleaved, eps);    \
    }

ROPE_STORE(rope_store_f32_f32, float, float)
ROPE_STORE(rope_store_f32_f16, float, __half)
ROPE_STORE(rope_store_f32_bf16, float, __nv_bfloat16)
ROPE_STORE(rope_store_f16_f32, __half, float)
ROPE_STORE(rope_store_f16_f16, __half, __half)
ROPE_STORE(rope_store_f16_bf16, __half, __nv_bfloat16)
