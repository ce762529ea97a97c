// Paged attention for a whole ragged batch in one launch per layer (issue 25).
//
// The grid is (new tokens, query heads); one block computes one (token, head) row, exactly the
// arithmetic of `attend_reference` in src/ragged.rs (the test reference): scores q.k * scale over
// the positions the token sees (causal, and within `window` when it is not 0), a softmax that
// subtracts the row's maximum, and the weighted sum of the values. Decode rows and prefill or
// extension rows differ only in their position, so one launch covers a step's every sequence.
//
// The batch metadata is `RaggedBatch` (src/ragged.rs), uploaded as it is:
//   token_seq[t], token_pos[t]   the sequence and the position of new token t;
//   page_start[s]                where sequence s's pages begin in block_table (n_seq + 1 entries);
//   block_table[...]             every sequence's pages, concatenated.
// The pool of one layer holds `rows = pages * page_size` rows of `n_kv * head_dim` values; query
// head h reads key-value head h / (n_head / n_kv) (grouped-query attention).
//
// Scores live in dynamic shared memory, one float per attended position: the launcher passes
// (longest context + head_dim) * 4 bytes. Contexts beyond what shared memory holds need the
// split-K (flash-decoding) variant, which measurement has not asked for yet.

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// The block's reduction of one value per thread, through `red` (one float per warp). Every
// thread gets the result.
template <bool MAX>
__device__ float block_reduce(float x, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    x = MAX ? warp_max(x) : warp_sum(x);
    if (lane == 0) red[warp] = x;
    __syncthreads();
    x = lane < warps ? red[lane] : (MAX ? -INFINITY : 0.0f);
    x = MAX ? warp_max(x) : warp_sum(x);
    __syncthreads();
    return x;
}

template <typename KV>
__device__ void paged_attention(
    const float* __restrict__ q, const KV* __restrict__ k, const KV* __restrict__ v,
    const uint32_t* __restrict__ token_seq, const uint32_t* __restrict__ token_pos,
    const uint32_t* __restrict__ page_start, const uint32_t* __restrict__ block_table,
    float* __restrict__ out, int n_head, int n_kv, int head_dim, int page_size, float scale,
    int window) {
    extern __shared__ float shared[];
    __shared__ float red[32];
    const int t = blockIdx.x, head = blockIdx.y;
    const int seq = token_seq[t], pos = token_pos[t];
    const int first = window > 0 && pos + 1 > window ? pos + 1 - window : 0;
    const int n = pos + 1 - first;
    const int kv_dim = n_kv * head_dim, kv_head = head / (n_head / n_kv);
    const uint32_t* pages = block_table + page_start[seq];
    float* qs = shared;              // head_dim query values
    float* scores = shared + head_dim;  // n scores, then weights
    const float* qrow = q + (size_t)t * n_head * head_dim + (size_t)head * head_dim;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) qs[i] = qrow[i];
    __syncthreads();

    // Scores: a warp per position, its lanes across the head's dimensions (coalesced reads).
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float local_max = -INFINITY;
    for (int j = warp; j < n; j += warps) {
        const int p = first + j;
        const size_t row = (size_t)pages[p / page_size] * page_size + p % page_size;
        const KV* krow = k + row * kv_dim + (size_t)kv_head * head_dim;
        float dot = 0.0f;
        for (int i = lane; i < head_dim; i += 32) dot += qs[i] * to_float(krow[i]);
        dot = warp_sum(dot) * scale;
        if (lane == 0) scores[j] = dot;
        local_max = fmaxf(local_max, dot);
    }
    __syncthreads();
    const float max = block_reduce<true>(local_max, red);

    float local_sum = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float e = __expf(scores[j] - max);
        scores[j] = e;
        local_sum += e;
    }
    __syncthreads();
    const float inv = 1.0f / block_reduce<false>(local_sum, red);

    // The weighted sum: a thread per dimension, every position (adjacent threads, adjacent values).
    float* orow = out + (size_t)t * n_head * head_dim + (size_t)head * head_dim;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < n; ++j) {
            const int p = first + j;
            const size_t row = (size_t)pages[p / page_size] * page_size + p % page_size;
            acc += scores[j] * to_float(v[row * kv_dim + (size_t)kv_head * head_dim + i]);
        }
        orow[i] = acc * inv;
    }
}

#define PAGED_ATTENTION(NAME, KV)                                                              \
    extern "C" __global__ void NAME(                                                           \
        const float* q, const KV* k, const KV* v, const uint32_t* token_seq,                  \
        const uint32_t* token_pos, const uint32_t* page_start, const uint32_t* block_table,   \
        float* out, int n_head, int n_kv, int head_dim, int page_size, float scale,           \
        int window) {                                                                          \
        paged_attention<KV>(q, k, v, token_seq, token_pos, page_start, block_table, out,      \
                            n_head, n_kv, head_dim, page_size, scale, window);                \
    }

PAGED_ATTENTION(paged_attention_f32, float)
PAGED_ATTENTION(paged_attention_f16, __half)
PAGED_ATTENTION(paged_attention_bf16, __nv_bfloat16)
