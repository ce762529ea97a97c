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
//   f32 (`kernels/glu.cu`'s arithmetic, one launch and the [rows, 2f] tensor fewer).
//
// The reference is `Q8Rows`'s CPU side (src/linear/q8_rows.rs): the same products, summed in
// another order, then the epilogue.

#include "activation.cuh"
#include "common.cuh"

#include <string.h>

#define Q8_MAX_ROWS 8
#define Q8_OUTS 2

// The epilogues (above).
#define EPI_STORE 0
#define EPI_ADD 1
#define EPI_SILU 2
#define EPI_GELU 3

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

// R: the rows the kernel has room for (1, 2, 4 or 8; `rows` at most R). A form per R keeps the
// accumulators of a batch-1 step from taking the registers of eight rows. The first form (one
// for every row count, a branch around each output's loads, loads and products a pass at a
// time) held 118 registers a thread and about one load a warp in flight: a batch-1 step of the
// 8B shape on an H200 took 5.90 ms with it, where the f16 copies took 5.69.
// EPI: the epilogue; Y: what `y` holds (f32, or f16 for a GLU's output).
template <typename X, int R, int EPI, typename Y>
__device__ void gemv_q8(const int8_t* __restrict__ q, const __half* __restrict__ scales,
                        const X* __restrict__ x, Y* __restrict__ y, int inputs, int outputs,
                        int rows) {
    constexpr bool GLU = EPI == EPI_SILU || EPI == EPI_GELU;
    const int lane = threadIdx.x & 31;
    const int warp = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    // The warp's Q8_OUTS matrix rows, `first + o * stride`: consecutive ones, or a GLU's gate
    // row j and its up row f + j.
    const int f = outputs / 2;
    const int first = GLU ? warp : warp * Q8_OUTS;
    const int stride = GLU ? f : 1;
    if (first >= (GLU ? f : outputs)) return;  // the whole warp: no lane is left to reduce with
    constexpr int PASSES = R <= 2 ? 2 : 1;
    float acc[Q8_OUTS][R];
#pragma unroll
    for (int o = 0; o < Q8_OUTS; ++o)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[o][r] = 0.0f;
    for (int k0 = lane * 16; k0 < inputs; k0 += PASSES * 32 * 16) {
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
                const int row = min(first + o * stride, outputs - 1);
                w[p][o] = load_weights(q, scales, (size_t)row, k[p], inputs);
                if (!in_row[p]) w[p][o].s = 0.0f;
            }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const X* xr = x + (size_t)min(r, rows - 1) * inputs;
#pragma unroll
            for (int p = 0; p < PASSES; ++p) {
                float a[16];
                load16(xr + k[p], a);
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
            if (lane == 0) {
                if constexpr (GLU) {
                    y[(size_t)r * f + first] = from_float<Y>(gated<EPI == EPI_GELU>(v[0], v[1]));
                } else {
#pragma unroll
                    for (int o = 0; o < Q8_OUTS; ++o) {
                        if (first + o >= outputs) continue;
                        Y* at = y + (size_t)r * outputs + first + o;
                        if constexpr (EPI == EPI_ADD) *at = __fadd_rn(*at, v[o]);
                        else *at = v[o];
                    }
                }
            }
        }
    }
}

#define GEMV_Q8(NAME, X, R, EPI, Y)                                                            \
    extern "C" __global__ void NAME(const int8_t* q, const __half* scales, const X* x, Y* y,   \
                                    int inputs, int outputs, int rows) {                       \
        gemv_q8<X, R, EPI, Y>(q, scales, x, y, inputs, outputs, rows);                         \
    }

GEMV_Q8(gemv_q8_r1_f32, float, 1, EPI_STORE, float)
GEMV_Q8(gemv_q8_r2_f32, float, 2, EPI_STORE, float)
GEMV_Q8(gemv_q8_r4_f32, float, 4, EPI_STORE, float)
GEMV_Q8(gemv_q8_r8_f32, float, 8, EPI_STORE, float)
GEMV_Q8(gemv_q8_r1_f16, __half, 1, EPI_STORE, float)
GEMV_Q8(gemv_q8_r2_f16, __half, 2, EPI_STORE, float)
GEMV_Q8(gemv_q8_r4_f16, __half, 4, EPI_STORE, float)
GEMV_Q8(gemv_q8_r8_f16, __half, 8, EPI_STORE, float)

// The fused epilogues take the f16 activations the GEMV's projections are given
// (`Small::input_dtype`); `y` is the stream (add) or the GLU's output in its element type.
GEMV_Q8(gemv_q8_add_r1_f16, __half, 1, EPI_ADD, float)
GEMV_Q8(gemv_q8_add_r2_f16, __half, 2, EPI_ADD, float)
GEMV_Q8(gemv_q8_add_r4_f16, __half, 4, EPI_ADD, float)
GEMV_Q8(gemv_q8_add_r8_f16, __half, 8, EPI_ADD, float)
GEMV_Q8(gemv_q8_glu_silu_r1_f16_f16, __half, 1, EPI_SILU, __half)
GEMV_Q8(gemv_q8_glu_silu_r2_f16_f16, __half, 2, EPI_SILU, __half)
GEMV_Q8(gemv_q8_glu_silu_r4_f16_f16, __half, 4, EPI_SILU, __half)
GEMV_Q8(gemv_q8_glu_silu_r8_f16_f16, __half, 8, EPI_SILU, __half)
GEMV_Q8(gemv_q8_glu_silu_r1_f16_f32, __half, 1, EPI_SILU, float)
GEMV_Q8(gemv_q8_glu_silu_r2_f16_f32, __half, 2, EPI_SILU, float)
GEMV_Q8(gemv_q8_glu_silu_r4_f16_f32, __half, 4, EPI_SILU, float)
GEMV_Q8(gemv_q8_glu_silu_r8_f16_f32, __half, 8, EPI_SILU, float)
GEMV_Q8(gemv_q8_glu_gelu_tanh_r1_f16_f16, __half, 1, EPI_GELU, __half)
GEMV_Q8(gemv_q8_glu_gelu_tanh_r2_f16_f16, __half, 2, EPI_GELU, __half)
GEMV_Q8(gemv_q8_glu_gelu_tanh_r4_f16_f16, __half, 4, EPI_GELU, __half)
GEMV_Q8(gemv_q8_glu_gelu_tanh_r8_f16_f16, __half, 8, EPI_GELU, __half)
GEMV_Q8(gemv_q8_glu_gelu_tanh_r1_f16_f32, __half, 1, EPI_GELU, float)
GEMV_Q8(gemv_q8_glu_gelu_tanh_r2_f16_f32, __half, 2, EPI_GELU, float)
GEMV_Q8(gemv_q8_glu_gelu_tanh_r4_f16_f32, __half, 4, EPI_GELU, float)
GEMV_Q8(gemv_q8_glu_gelu_tanh_r8_f16_f32, __half, 8, EPI_GELU, float)
