//! The arguments of the forward pass's fused operations: what each op reads, shared by its CPU
//! form and candle plumbing (`llama/fused.rs`) and its CUDA launcher (`cuda/forward.rs`), so
//! that neither imports the other.

use candle_core::{DType, Tensor};

use crate::config::RopeStyle;

/// The stacked Q/K/V projection's output (f32 or f16, `[tokens, q_w + 2·kv_w]`, contiguous) to
/// the attention's inputs: one f32 tensor of `tokens · (q_w + 2·kv_w)` values, the queries
/// (`[tokens, q_w]`), then the keys, then the values (`[tokens, kv_w]` each), with the bias
/// added, the query and key heads normalized and rotated (see `llama/fused.rs`).
pub(crate) struct RopeQk<'a> {
    pub n_head: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub style: RopeStyle,
    /// Each token's position (u32, `[tokens]`).
    pub positions: &'a Tensor,
    /// The RoPE tables, `[positions, head_dim / 2]` each.
    pub cos: &'a Tensor,
    pub sin: &'a Tensor,
    /// Q, K and V biases side by side (`[q_w + 2·kv_w]`).
    pub bias: Option<&'a Tensor>,
    /// Per-head query and key norms (`[head_dim]` each).
    pub qk_norm: Option<(&'a Tensor, &'a Tensor)>,
    pub eps: f32,
}

/// `x / rms(x) · w` per row of a contiguous `[rows, width]` tensor (f32 or f16), written in
/// `out` (f32 or f16: the element type the next projection multiplies), as `rms_norm_row`
/// computes it. On a GPU one launch (`kernels/residual.cu`) where candle ran its norm and a cast.
pub(crate) struct Norm<'a> {
    pub weight: &'a Tensor,
    pub eps: f32,
    pub out: DType,
}

/// `x += y`, then each row of the new `x` normalized by `weight` (as [`Norm`] into f32) into the
/// rows after `x`'s: `xh` the f32 residual stream with room for its norm (`[2 · rows, width]`,
/// contiguous: the stream's rows, then the norm's), `y` a projection's output (`[rows, width]`,
/// f32 or f16, contiguous): `xh.inplace_op2(&y, &AddNorm { .. })`. The same values as `AddInto`
/// then [`Norm`]; on a GPU one launch where they run two (`kernels/residual.cu`), for the norms
/// whose next projection multiplies f32 (the quantized weights' small batches).
pub(crate) struct AddNorm<'a> {
    pub weight: &'a Tensor,
    pub eps: f32,
}
