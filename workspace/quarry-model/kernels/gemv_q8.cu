// Small steps on 8-bit weights (W8A16): y[r][o] = sum_k x[r][k] * W[o][k] for a step of at most
// Q8_MAX_ROWS rows, where W is a Q8_0 matrix repacked at load into its int8 values `q`
// ([outputs, inputs], row-major, so a row's values are 16-byte aligned) and one f16 scale per 32
// consecutive values of a row (`scales`, [outputs, inputs / 32]). A step of a few rows reads each
// weight once and is bound by memory: this reads 8.5 bits a weight where the f16 copies cost 16,
// and keeps the activations as they come (f32 or f16), where candle's quantized kernels round
// them to 8 bits. Sums in f32; the output is f32 ([rows, outputs]).
//
// A warp per Q8_OUTS outputs (the same activations serve them all); each lane takes 16 values of
// a row at a time (one 16-byte load), converts them without a conversion instruction (below) and
// multiplies them by the 16 activations of every row of the step; each 16 values' sum is scaled
// by its block's scale; the lanes' sums are added by a warp reduction. inputs must be a multiple
// of 32 (Q8_0's block), and q, x 16-byte aligned (the launcher checks both).
//
// What a warp does with its sums (the epilogue, a form each; src/linear/q8_rows.rs `Epilogue`):
// - `gemv_q8_r*`: writes them, `y` [rows, outputs] f32;
// - `gemv_q8_add_r*`: adds them into `y` in place, the f32 residual stream [rows, outputs] (the
//   output and down projections; `llama::fused::AddInto`'s arithmetic, one launch fewer);
// - `gemv_q8_glu_{act}_r*`: the matrix is the gate and up projections stacked ([2f, inputs]), a
//   warp takes gate row j with up row f + j and writes act(gate) * up into `y` [rows, f], f16 or
//   f32 (`kernels/glu.cu`'s arithmetic, one launch and the [rows, 2f] tensor fewer);
// - `gemv_q8_rope_r*_{pool}`: the matrix is the stacked Q/K/V projection; a warp takes a RoPE
//   pair of a query or key head (rows 2i and 2i + 1 of the head, or i and i + head_dim / 2 for
//   the NeoX style) or two value rows, adds the bias (Qwen2), rotates the pair by its row's
//   position, and writes the queries into `q_out` [rows, q_w] f32 and the keys and values into
//   the pools' rows at the rows' slots (`kernels/rope_store.cu`'s `rope_store` arithmetic,
//   without the per-head norms: one launch and the [rows, width] tensor fewer).
//
// The `_norm` forms of the GLU and RoPE ones (steps of 1 or 2 rows) take the residual stream's
// f32 rows instead of their norm's f16 rows and normalize them first, each block into its shared
// memory, with `rms_norm_f32_f16`'s arithmetic in its order (kernels/residual.cu; a block of
// NORM_THREADS threads), so the activations are that kernel's bit for bit: the norm's launch
// fewer (at batch 1 a single block, a few microseconds), for a read of the row and the norm's
// weight by every block.
//
// Every form takes `ahead` after `rows`: the trips of weights a lane asks L2 for beyond the one it
// loads (0: none; the prefetch below).
//
// The reference is `Q8Rows`'s CPU side (src/linear/q8_rows.rs): the same products, summed in
// another order, then the epilogue.

#include "activation.cuh"
#include "common.cuh"

#include <string.h>

#define Q8_MAX_ROWS 8
#define Q8_OUTS 2

// The 4 signed bytes of `w` as floats, exactly: each byte, made unsigned (+128), becomes the low
// mantissa byte of 2^23 (one byte permutation), and 2^23 + 128 is taken off. Hopper converts
// integers to floats at a quarter of its FMA rate; this costs one integer and one float op.
__device__ __forceinline__ void bytes_to_floats(uint32_t w, float* out) {
    const uint32_t u = w ^ 0x80808080u;
    out[0] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540)) - 8388736.0f;
    out[1] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7541)) - 8388736.0f;
    out[2] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7542)) - 8388736.0f;
    out[3] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7543)) - 8388736.0f;
}

// 16 activations from `p` (16-byte aligned) as floats.
__device__ __forceinline__ void load16(const float* p, float* out) {
    const uint4* v = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const uint4 w = __ldg(v + j);
        out[4 * j] = __uint_as_float(w.x);
        out[4 * j + 1] = __uint_as_float(w.y);
        out[4 * j + 2] = __uint_as_float(w.z);
        out[4 * j + 3] = __uint_as_float(w.w);
    }
}

__device__ __forceinline__ void load16(const __half* p, float* out) {
    const uint4* v = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const uint4 w = __ldg(v + j);
        __half h[8];
        memcpy(h, &w, sizeof(h));
#pragma unroll
        for (int i = 0; i < 8; ++i) out[8 * j + i] = __half2float(h[i]);
    }
}

// 16 f16 activations from shared memory (`p` 16-byte aligned) as floats.
__device__ __forceinline__ void load16_shared(const __half* p, float* out) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const uint4 w = SHARED_LOAD16(p + 8 * j);
        __half h[8];
        memcpy(h, &w, sizeof(h));
#pragma unroll
        for (int i = 0; i < 8; ++i) out[8 * j + i] = __half2float(h[i]);
    }
}

// Threads of a block of the `_norm` forms, as `rms_norm`'s (NORM_THREADS in residual.cu): the
// sums of squares are added in that kernel's order.
#define GEMV_NORM_THREADS 256

// The `_norm` forms' prologue, run by every thread of the block: the step's `rows` stream rows
// (`x`, f32 [rows, width]) normalized by `w` into `h` (f16 [rows, width], shared memory), as
// `rms_norm_f32_f16` writes them: each thread's strided sum of squares, each warp's by shuffles,
// the warps' by the first warp's lanes, then x / sqrt(ss / width + eps) * w rounded to f16.
template <int R>
__device__ void normalize_rows(const float* __restrict__ x, const float* __restrict__ w, float eps,
                               int width, int rows, __half* __restrict__ h) {
    __shared__ float red[R][GEMV_NORM_THREADS / 32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float ss[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        ss[r] = 0.0f;
        if (r < rows) {
            const float* row = x + (size_t)r * width;
            for (int i = threadIdx.x; i < width; i += blockDim.x)
                ss[r] = __fadd_rn(ss[r], __fmul_rn(row[i], row[i]));
        }
        ss[r] = warp_sum(ss[r]);
        if (lane == 0) red[r][wid] = ss[r];
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r >= rows) continue;
        const float total = warp_sum(lane < warps ? red[r][lane] : 0.0f);
        const float m = __fsqrt_rn(__fadd_rn(__fdiv_rn(total, (float)width), eps));
        const float* row = x + (size_t)r * width;
        for (int i = threadIdx.x; i < width; i += blockDim.x)
            h[(size_t)r * width + i] = __float2half_rn(__fmul_rn(__fdiv_rn(row[i], m), w[i]));
    }
    __syncthreads();
}

// Two passes of a warp over a row (512 values each) go together for steps of 1 or 2 rows (one
// for more, whose accumulators take the registers): every load of a trip is issued before its
// products, and no branch stands between them. A pass past the row's end, an output past the
// matrix's and a row past the step's read from a clamped address in range and count for
// nothing (a zero scale; not written).

// 16 weights of row `row` at `k` and their block's scale.
struct Weights16 {
    uint4 v;
    float s;
};

__device__ __forceinline__ Weights16 load_weights(const int8_t* __restrict__ q,
                                                  const __half* __restrict__ scales, size_t row,
                                                  int k, int inputs) {
    Weights16 w;
    w.v = __ldg(reinterpret_cast<const uint4*>(q + row * inputs + k));
    w.s = __half2float(scales[row * (inputs / 32) + k / 32]);
    return w;
}

// The epilogues: each says which Q8_OUTS matrix rows a warp computes (`row`, past the matrix's
// end for none; `warps`, how many warps have work) and what lane 0 does with the warp's sums of
// step row r (`write`).

// The sums themselves, [rows, outputs] f32, a warp per two consecutive rows.
struct Store {
    float* __restrict__ y;
    int outputs;
    __device__ int warps() const { return (outputs + Q8_OUTS - 1) / Q8_OUTS; }
    __device__ int row(int warp, int o) const { return warp * Q8_OUTS + o; }
    __device__ void write(int r, int warp, const float* v) const {
#pragma unroll
        for (int o = 0; o < Q8_OUTS; ++o)
            if (row(warp, o) < outputs) y[(size_t)r * outputs + row(warp, o)] = v[o];
    }
};

// Added into the f32 stream in place (`add_into`'s arithmetic).
struct Add : Store {
    __device__ void write(int r, int warp, const float* v) const {
#pragma unroll
        for (int o = 0; o < Q8_OUTS; ++o) {
            if (row(warp, o) >= outputs) continue;
            float* at = y + (size_t)r * outputs + row(warp, o);
            *at = __fadd_rn(*at, v[o]);
        }
    }
};

// act(gate) * up into [rows, f] of OUT: a warp per gate row j and up row f + j.
template <bool GELU, typename OUT>
struct Glu {
    OUT* __restrict__ y;
    int f;
    __device__ int warps() const { return f; }
    __device__ int row(int warp, int o) const { return warp + o * f; }
    __device__ void write(int r, int warp, const float* v) const {
        y[(size_t)r * f + warp] = from_float<OUT>(gated<GELU>(v[0], v[1]));
    }
};

// RoPE and the KV writes (`rope_store`'s arithmetic): warps [0, (n_head + n_kv) * half) take a
// query or key head's pair i, the rest two value rows each.
template <typename P>
struct Rope {
    const float* __restrict__ bias;  // [width], or null
    const float* __restrict__ cos_table;
    const float* __restrict__ sin_table;
    const uint32_t* __restrict__ positions;
    const uint32_t* __restrict__ slots;
    float* __restrict__ q_out;
    P* __restrict__ k_pool;
    P* __restrict__ v_pool;
    int n_head, n_kv, head_dim, interleaved;

    __device__ int half() const { return head_dim / 2; }
    __device__ int pairs() const { return (n_head + n_kv) * half(); }
    __device__ int warps() const { return pairs() + n_kv * head_dim / 2; }
    // Row `o` of pair `i` within its head (the pair's two values' offsets).
    __device__ int in_head(int i, int o) const {
        return interleaved ? 2 * i + o : i + o * half();
    }
    __device__ int row(int warp, int o) const {
        if (warp < pairs()) return (warp / half()) * head_dim + in_head(warp % half(), o);
        return (n_head + n_kv) * head_dim + 2 * (warp - pairs()) + o;
    }
    __device__ void write(int r, int warp, const float* v) const {
        float x[Q8_OUTS];
#pragma unroll
        for (int o = 0; o < Q8_OUTS; ++o)
            x[o] = bias ? __fadd_rn(v[o], bias[row(warp, o)]) : v[o];
        const int kv_w = n_kv * head_dim;
        const size_t slot = (size_t)slots[r] * kv_w;
        if (warp >= pairs()) {
            const int j = 2 * (warp - pairs());
            v_pool[slot + j] = from_float<P>(x[0]);
            v_pool[slot + j + 1] = from_float<P>(x[1]);
            return;
        }
        const int h = warp / half(), i = warp % half();
        const size_t at = (size_t)positions[r] * half() + i;
        const float c = cos_table[at], s = sin_table[at];
        const float y0 = __fsub_rn(__fmul_rn(x[0], c), __fmul_rn(x[1], s));
        const float y1 = __fadd_rn(__fmul_rn(x[0], s), __fmul_rn(x[1], c));
        const int a = in_head(i, 0), b = in_head(i, 1);
        if (h < n_head) {
            float* o = q_out + (size_t)r * n_head * head_dim + h * head_dim;
            o[a] = y0;
            o[b] = y1;
        } else {
            P* o = k_pool + slot + (h - n_head) * head_dim;
            o[a] = from_float<P>(y0);
            o[b] = from_float<P>(y1);
        }
    }
};

// The prefetch (`ahead` > 0; `gemv_prefetch`): a warp has its trip's loads in flight, 64 bytes a
// lane at 1 or 2 rows (two passes of two matrix rows), then waits for them before its products:
// a batch-1 step of the 8B shape read its 8.5 GB at 1.9 TB/s on an H200 (2026-11-30), where a
// copy reads 4.0-4.2. With `ahead` = A, each lane also asks L2 for the weights of the trip A + 1
// after the one it loads (the first A at the start), which holds no register and waits for
// nothing, so A more trips' bytes are in flight; the loads are the same, so the sums are the same
// bits. The scales (a 17th of the bytes) are not prefetched.
template <int PASSES>
__device__ __forceinline__ void prefetch_trip(const int8_t* __restrict__ q, const int* mrow,
                                              int k0, int inputs) {
#pragma unroll
    for (int p = 0; p < PASSES; ++p) {
        const int k = k0 + p * 512;
        if (k < inputs)
#pragma unroll
            for (int o = 0; o < Q8_OUTS; ++o) PREFETCH_L2(q + (size_t)mrow[o] * inputs + k);
    }
}

// R: the rows the kernel has room for (1, 2, 4 or 8; `rows` at most R). A form per R keeps the
// accumulators of a batch-1 step from taking the registers of eight rows. The first form (one
// for every row count, a branch around each output's loads, loads and products a pass at a
// time) held 118 registers a thread and about one load a warp in flight: a batch-1 step of the
// 8B shape on an H200 took 5.90 ms with it, where the f16 copies took 5.69.
// NORM: `x` is the stream's f32 rows, normalized by `norm_w` first (the `_norm` forms; X float).
template <typename X, int R, typename Epi, bool NORM = false>
__device__ void gemv_q8(const int8_t* __restrict__ q, const __half* __restrict__ scales,
                        const X* __restrict__ x, const Epi& epi, int inputs, int outputs,
                        int rows, int ahead, const float* __restrict__ norm_w = nullptr,
                        float eps = 0.0f) {
    const int lane = threadIdx.x & 31;
    const int warp = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    const __half* h = nullptr;
    if constexpr (NORM) {
        // Every thread of the block takes part in the prologue's barriers.
        DYNAMIC_SHARED(__half, normed);
        normalize_rows<R>(x, norm_w, eps, inputs, rows, normed);
        h = normed;
    }
    if (warp >= epi.warps()) return;  // the whole warp: no lane is left to reduce with
    int mrow[Q8_OUTS];
#pragma unroll
    for (int o = 0; o < Q8_OUTS; ++o) mrow[o] = min(epi.row(warp, o), outputs - 1);
    constexpr int PASSES = R <= 2 ? 2 : 1;
    constexpr int TRIP = PASSES * 32 * 16;  // a trip's values of a row
    // Past the row's end a trip asks for nothing, so the loop stops there whatever `ahead` is.
    for (int d = 1; d <= ahead && d * TRIP < inputs; ++d)
        prefetch_trip<PASSES>(q, mrow, lane * 16 + d * TRIP, inputs);
    float acc[Q8_OUTS][R];
#pragma unroll
    for (int o = 0; o < Q8_OUTS; ++o)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[o][r] = 0.0f;
    for (int k0 = lane * 16; k0 < inputs; k0 += TRIP) {
        if (ahead > 0) prefetch_trip<PASSES>(q, mrow, k0 + (ahead + 1) * TRIP, inputs);
        int k[PASSES];
        bool in_row[PASSES];
#pragma unroll
        for (int p = 0; p < PASSES; ++p) {
            in_row[p] = k0 + p * 512 < inputs;
            k[p] = in_row[p] ? k0 + p * 512 : k0;
        }
        Weights16 w[PASSES][Q8_OUTS];
#pragma unroll
        for (int p = 0; p < PASSES; ++p)
#pragma unroll
            for (int o = 0; o < Q8_OUTS; ++o) {
                w[p][o] = load_weights(q, scales, (size_t)mrow[o], k[p], inputs);
                if (!in_row[p]) w[p][o].s = 0.0f;
            }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const size_t at = (size_t)min(r, rows - 1) * inputs;
#pragma unroll
            for (int p = 0; p < PASSES; ++p) {
                float a[16];
                if constexpr (NORM) load16_shared(h + at + k[p], a);
                else load16(x + at + k[p], a);
#pragma unroll
                for (int o = 0; o < Q8_OUTS; ++o) {
                    float wf[16];
                    bytes_to_floats(w[p][o].v.x, wf);
                    bytes_to_floats(w[p][o].v.y, wf + 4);
                    bytes_to_floats(w[p][o].v.z, wf + 8);
                    bytes_to_floats(w[p][o].v.w, wf + 12);
                    float sum = 0.0f;
#pragma unroll
                    for (int i = 0; i < 16; ++i) sum += wf[i] * a[i];
                    acc[o][r] += w[p][o].s * sum;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r < rows) {
            float v[Q8_OUTS];
#pragma unroll
            for (int o = 0; o < Q8_OUTS; ++o) v[o] = warp_sum(acc[o][r]);
            if (lane == 0) epi.write(r, warp, v);
        }
    }
}

#define GEMV_Q8(NAME, X, R)                                                                     \
    extern "C" __global__ void NAME(const int8_t* q, const __half* scales, const X* x, float* y, \
                                    int inputs, int outputs, int rows, int ahead) {            \
        gemv_q8<X, R>(q, scales, x, Store{y, outputs}, inputs, outputs, rows, ahead);          \
    }

// The fused epilogues take the f16 activations the GEMV's projections are given
// (`Small::input_dtype`).
#define GEMV_Q8_ADD(NAME, R)                                                                   \
    extern "C" __global__ void NAME(const int8_t* q, const __half* scales, const __half* x,     \
                                    float* y, int inputs, int outputs, int rows, int ahead) {  \
        gemv_q8<__half, R>(q, scales, x, Add{{y, outputs}}, inputs, outputs, rows, ahead);     \
    }

#define GEMV_Q8_GLU(NAME, R, GELU, OUT)                                                        \
    extern "C" __global__ void NAME(const int8_t* q, const __half* scales, const __half* x,     \
                                    OUT* y, int inputs, int outputs, int rows, int ahead) {    \
        gemv_q8<__half, R>(q, scales, x, Glu<GELU, OUT>{y, outputs / 2}, inputs, outputs,      \
                           rows, ahead);                                                       \
    }

#define GEMV_Q8_NORM_GLU(NAME, R, GELU, OUT)                                                   \
    extern "C" __global__ void __launch_bounds__(GEMV_NORM_THREADS)                            \
        NAME(const int8_t* q, const __half* scales, const float* x, OUT* y, int inputs,         \
             int outputs, int rows, int ahead, const float* norm_w, float eps) {               \
        gemv_q8<float, R, Glu<GELU, OUT>, true>(q, scales, x, Glu<GELU, OUT>{y, outputs / 2},   \
                                                 inputs, outputs, rows, ahead, norm_w, eps);    \
    }

// `rows` tokens of the stacked Q/K/V projection (outputs = (n_head + 2 n_kv) * head_dim).
#define GEMV_Q8_ROPE(NAME, R, P)                                                               \
    extern "C" __global__ void NAME(                                                           \
        const int8_t* q, const __half* scales, const __half* x, const float* bias,             \
        const float* cos_table, const float* sin_table, const uint32_t* positions,             \
        const uint32_t* slots, float* q_out, P* k_pool, P* v_pool, int n_head, int n_kv,       \
        int head_dim, int interleaved, int inputs, int rows, int ahead) {                      \
        const Rope<P> epi{bias,    cos_table, sin_table, positions, slots, q_out,              \
                          k_pool,  v_pool,    n_head,    n_kv,      head_dim, interleaved};    \
        gemv_q8<__half, R>(q, scales, x, epi, inputs, (n_head + 2 * n_kv) * head_dim, rows,    \
                           ahead);                                                             \
    }

#define GEMV_Q8_NORM_ROPE(NAME, R, P)                                                          \
    extern "C" __global__ void __launch_bounds__(GEMV_NORM_THREADS) NAME(                      \
        const int8_t* q, const __half* scales, const float* x, const float* bias,              \
        const float* cos_table, const float* sin_table, const uint32_t* positions,             \
        const uint32_t* slots, float* q_out, P* k_pool, P* v_pool, int n_head, int n_kv,       \
        int head_dim, int interleaved, int inputs, int rows, int ahead, const float* norm_w,   \
        float eps) {                                                                           \
        const Rope<P> epi{bias,    cos_table, sin_table, positions, slots, q_out,              \
                          k_pool,  v_pool,    n_head,    n_kv,      head_dim, interleaved};    \
        gemv_q8<float, R, Rope<P>, true>(q, scales, x, epi, inputs,                            \
                                         (n_head + 2 * n_kv) * head_dim, rows, ahead, norm_w,  \
                                         eps);                                                 \
    }

// The forms, a module per room (build.rs compiles this file with -DQUARRY_GEMV_ROOM=R for each):
// the driver compiles a module whole at its first load (the 54 forms took ptxas 3.1 s on the
// development machine), and a process of batch-1 steps launches the r1 forms alone. Without the
// macro (quarry-cuda-emu), every form.
#ifndef QUARRY_GEMV_ROOM
#define QUARRY_GEMV_ROOM 0
#endif

#if QUARRY_GEMV_ROOM == 0 || QUARRY_GEMV_ROOM == 1
GEMV_Q8(gemv_q8_r1_f32, float, 1)
GEMV_Q8(gemv_q8_r1_f16, __half, 1)
GEMV_Q8_ADD(gemv_q8_add_r1_f16, 1)
GEMV_Q8_GLU(gemv_q8_glu_silu_r1_f16_f16, 1, false, __half)
GEMV_Q8_GLU(gemv_q8_glu_silu_r1_f16_f32, 1, false, float)
GEMV_Q8_GLU(gemv_q8_glu_gelu_tanh_r1_f16_f16, 1, true, __half)
GEMV_Q8_GLU(gemv_q8_glu_gelu_tanh_r1_f16_f32, 1, true, float)
GEMV_Q8_NORM_GLU(gemv_q8_norm_glu_silu_r1_f32_f16, 1, false, __half)
GEMV_Q8_NORM_GLU(gemv_q8_norm_glu_silu_r1_f32_f32, 1, false, float)
GEMV_Q8_NORM_GLU(gemv_q8_norm_glu_gelu_tanh_r1_f32_f16, 1, true, __half)
GEMV_Q8_NORM_GLU(gemv_q8_norm_glu_gelu_tanh_r1_f32_f32, 1, true, float)
GEMV_Q8_ROPE(gemv_q8_rope_r1_f16_f32, 1, float)
GEMV_Q8_ROPE(gemv_q8_rope_r1_f16_f16, 1, __half)
GEMV_Q8_ROPE(gemv_q8_rope_r1_f16_bf16, 1, __nv_bfloat16)
GEMV_Q8_NORM_ROPE(gemv_q8_norm_rope_r1_f32_f32, 1, float)
GEMV_Q8_NORM_ROPE(gemv_q8_norm_rope_r1_f32_f16, 1, __half)
GEMV_Q8_NORM_ROPE(gemv_q8_norm_rope_r1_f32_bf16, 1, __nv_bfloat16)
#endif

#if QUARRY_GEMV_ROOM == 0 || QUARRY_GEMV_ROOM == 2
GEMV_Q8(gemv_q8_r2_f32, float, 2)
GEMV_Q8(gemv_q8_r2_f16, __half, 2)
GEMV_Q8_ADD(gemv_q8_add_r2_f16, 2)
GEMV_Q8_GLU(gemv_q8_glu_silu_r2_f16_f16, 2, false, __half)
GEMV_Q8_GLU(gemv_q8_glu_silu_r2_f16_f32, 2, false, float)
GEMV_Q8_GLU(gemv_q8_glu_gelu_tanh_r2_f16_f16, 2, true, __half)
GEMV_Q8_GLU(gemv_q8_glu_gelu_tanh_r2_f16_f32, 2, true, float)
GEMV_Q8_NORM_GLU(gemv_q8_norm_glu_silu_r2_f32_f16, 2, false, __half)
GEMV_Q8_NORM_GLU(gemv_q8_norm_glu_silu_r2_f32_f32, 2, false, float)
GEMV_Q8_NORM_GLU(gemv_q8_norm_glu_gelu_tanh_r2_f32_f16, 2, true, __half)
GEMV_Q8_NORM_GLU(gemv_q8_norm_glu_gelu_tanh_r2_f32_f32, 2, true, float)
GEMV_Q8_ROPE(gemv_q8_rope_r2_f16_f32, 2, float)
GEMV_Q8_ROPE(gemv_q8_rope_r2_f16_f16, 2, __half)
GEMV_Q8_ROPE(gemv_q8_rope_r2_f16_bf16, 2, __nv_bfloat16)
GEMV_Q8_NORM_ROPE(gemv_q8_norm_rope_r2_f32_f32, 2, float)
GEMV_Q8_NORM_ROPE(gemv_q8_norm_rope_r2_f32_f16, 2, __half)
GEMV_Q8_NORM_ROPE(gemv_q8_norm_rope_r2_f32_bf16, 2, __nv_bfloat16)
#endif

#if QUARRY_GEMV_ROOM == 0 || QUARRY_GEMV_ROOM == 4
GEMV_Q8(gemv_q8_r4_f32, float, 4)
GEMV_Q8(gemv_q8_r4_f16, __half, 4)
GEMV_Q8_ADD(gemv_q8_add_r4_f16, 4)
GEMV_Q8_GLU(gemv_q8_glu_silu_r4_f16_f16, 4, false, __half)
GEMV_Q8_GLU(gemv_q8_glu_silu_r4_f16_f32, 4, false, float)
GEMV_Q8_GLU(gemv_q8_glu_gelu_tanh_r4_f16_f16, 4, true, __half)
GEMV_Q8_GLU(gemv_q8_glu_gelu_tanh_r4_f16_f32, 4, true, float)
GEMV_Q8_ROPE(gemv_q8_rope_r4_f16_f32, 4, float)
GEMV_Q8_ROPE(gemv_q8_rope_r4_f16_f16, 4, __half)
GEMV_Q8_ROPE(gemv_q8_rope_r4_f16_bf16, 4, __nv_bfloat16)
#endif

#if QUARRY_GEMV_ROOM == 0 || QUARRY_GEMV_ROOM == 8
GEMV_Q8(gemv_q8_r8_f32, float, 8)
GEMV_Q8(gemv_q8_r8_f16, __half, 8)
GEMV_Q8_ADD(gemv_q8_add_r8_f16, 8)
GEMV_Q8_GLU(gemv_q8_glu_silu_r8_f16_f16, 8, false, __half)
GEMV_Q8_GLU(gemv_q8_glu_silu_r8_f16_f32, 8, false, float)
GEMV_Q8_GLU(gemv_q8_glu_gelu_tanh_r8_f16_f16, 8, true, __half)
GEMV_Q8_GLU(gemv_q8_glu_gelu_tanh_r8_f16_f32, 8, true, float)
GEMV_Q8_ROPE(gemv_q8_rope_r8_f16_f32, 8, float)
GEMV_Q8_ROPE(gemv_q8_rope_r8_f16_f16, 8, __half)
GEMV_Q8_ROPE(gemv_q8_rope_r8_f16_bf16, 8, __nv_bfloat16)
#endif
