//! Where a model's tensors come from, by llama.cpp's names: a GGUF file (`llama`'s
//! `GgufWeights`), or a checkpoint folder ([`crate::checkpoint::Checkpoint`]) that renames and
//! converts its own. A bottom-layer module: the forward pass reads through it, the checkpoint
//! implements it, and neither imports the other for it.

use candle_core::quantized::QTensor;
use candle_core::Device;

use crate::error::Result;

pub(crate) trait Weights {
    fn has(&self, name: &str) -> bool;
    /// Tensor `name`, of shape `dims` where the file agrees (the caller checks that it exists
    /// and its shape), on `device`.
    fn tensor(&mut self, name: &str, dims: &[usize], device: &Device) -> Result<QTensor>;
}
