// The gated feed-forward's activation in one pass: out = act(gate) * up, read from the
// stacked gate/up projection ([rows, 2f]: a row's f gate values, then its f up values) that one
// GEMM produces, and written in the element type the down projection multiplies (f16 for its
// dense weights), where candle would run a split, two casts, the activation, the product and a
// cast. `act` is SiLU (llama, Qwen2) or GELU with the tanh approximation (Gemma), with candle's
// own formulas, so the op equals candle's ops up to float rounding; the reference is
// `Glu::cpu_fwd` in src/glu.rs.

#include "activation.cuh"
#include "common.cuh"

template <typename IN, typename OUT, bool GELU>
__device__ void glu(const IN* __restrict__ gate_up, OUT* __restrict__ out, uint64_t rows,
                    uint64_t f) {
    const uint64_t n = rows * f;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t r = i / f, j = i - r * f;
        const float g = to_float(gate_up[2 * f * r + j]);
        const float u = to_float(gate_up[2 * f * r + f + j]);
        out[i] = from_float<OUT>(gated<GELU>(g, u));
    }
}

#define GLU(NAME, IN, OUT, GELU)                                                               \
    extern "C" __global__ void NAME(const IN* gate_up, OUT* out, uint64_t rows, uint64_t f) { \
        glu<IN, OUT, GELU>(gate_up, out, rows, f);                                            \
    }

GLU(glu_silu_f32_f32, float, float, false)
GLU(glu_silu_f32_f16, float, __half, false)
GLU(glu_silu_f16_f32, __half, float, false)
GLU(glu_silu_f16_f16, __half, __half, false)
GLU(glu_gelu_tanh_f32_f32, float, float, true)
GLU(glu_gelu_tanh_f32_f16, float, __half, true)
GLU(glu_gelu_tanh_f16_f32, __half, float, true)
GLU(glu_gelu_tanh_f16_f16, __half, __half, true)
