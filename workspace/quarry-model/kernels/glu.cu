// The gated feed-forward's activation in one pass (issue 25): out = act(gate) * up, where candle
// runs the activation and the product as two kernels with an intermediate tensor between them.
// `act` is SiLU (llama, Qwen2) or GELU with the tanh approximation (Gemma), with candle's own
// formulas, so the fused op equals candle's two ops up to float rounding; the reference is
// `Glu::cpu_fwd` in src/glu.rs.

#include <stdint.h>

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

extern "C" __global__ void glu_silu(const float* __restrict__ gate, const float* __restrict__ up,
                                    float* __restrict__ out, uint64_t n) {
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        out[i] = silu(gate[i]) * up[i];
}

extern "C" __global__ void glu_gelu_tanh(const float* __restrict__ gate,
                                         const float* __restrict__ up, float* __restrict__ out,
                                         uint64_t n) {
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        out[i] = gelu_tanh(gate[i]) * up[i];
}
