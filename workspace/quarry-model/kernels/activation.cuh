// The gated feed-forward's activations, with candle's own formulas (the host's are
// `glu::silu` and `glu::gelu_tanh` in src/glu.rs): SiLU (llama, Qwen2) and GELU with the tanh
// approximation (Gemma). Included by glu.cu and by gemv_q8.cu, whose GLU forms apply them to the
// gate and up sums they compute.

#pragma once

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// `act(gate) * up`, the activation chosen at compile time.
template <bool GELU>
__device__ __forceinline__ float gated(float gate, float up) {
    return (GELU ? gelu_tanh(gate) : silu(gate)) * up;
}
