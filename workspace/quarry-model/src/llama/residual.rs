//! The residual stream of a tensor forward pass, and the fusion choices around it.
//!
//! The stream `x` (f32, `[tokens, embedding]`) takes each block's output projection in place;
//! each norm writes its rows in the element type the next projection multiplies
//! (`fused::Norm`). Where every norm's rows are f32 (the quantized weights' small batches) and
//! `add_norm` is on, the stream has room after its rows for a norm's, and each add but the last
//! writes the next norm in the same op (`fused::AddNorm`). Where `gemm_add` is on and nothing
//! comes between, the output projection's GEMM adds into the stream itself (`linear::GemmAdd`).
//! [`Residual`] owns those choices, so a layer's forward (`Llama::layer`) reads as the model's
//! arithmetic: norm, project, attend, add; norm, project, activate, add.

use candle_core::{DType, Tensor};

use super::fused::{self, Fusions};
use crate::error::Result;
use crate::linear::Linear;
use crate::profile::Phases;

/// A step's positions and KV slots on the device (`[tokens]` u32 each).
pub(super) struct StepIds<'a> {
    pub positions: &'a Tensor,
    pub slots: &'a Tensor,
}

/// One block's output added into the stream: its projection, Gemma's output norm where the
/// model has one, the next norm's weight and element type where the add may write its rows,
/// and the phase's name for the profile.
pub(super) struct Add<'a> {
    pub proj: &'a Linear,
    pub post: Option<&'a Tensor>,
    pub norm_with: Option<(&'a Tensor, DType)>,
    pub what: &'static str,
}

/// The residual stream of a pass of `rows` tokens, with the fusions it takes.
pub(super) struct Residual {
    /// The stream's rows (a view of `room`'s first half where there is room).
    x: Tensor,
    /// The stream followed by room for a norm's rows (`add_norm`), else `None`.
    room: Option<Tensor>,
    rows: usize,
    eps: f32,
    pub fusions: Fusions,
}

impl Residual {
    /// The stream starting at `x`; `fuse_add_norm` where every norm of the pass writes f32 rows
    /// and `add_norm` is on.
    pub fn new(
        x: Tensor,
        rows: usize,
        eps: f32,
        fusions: Fusions,
        fuse_add_norm: bool,
    ) -> Result<Self> {
        let (x, room) = if fuse_add_norm {
            // The room starts as a copy of the stream: every value is written before it is read.
            let room = Tensor::cat(&[&x, &x], 0)?;
            (room.narrow(0, 0, rows)?, Some(room))
        } else {
            (x, None)
        };
        Ok(Self {
            x,
            room,
            rows,
            eps,
            fusions,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The stream's rows (f32 `[rows, embedding]`), for an op that normalizes them itself (the
    /// 8-bit GEMV's prologue, `linear::Prologue`).
    pub fn stream(&self) -> &Tensor {
        &self.x
    }

    /// The stream after the last layer.
    pub fn into_stream(self) -> Tensor {
        self.x
    }

    fn norm(&self, x: &Tensor, weight: &Tensor, out: DType) -> Result<Tensor> {
        let eps = self.eps;
        Ok(x.apply_op1_no_bwd(&fused::Norm { weight, eps, out })?)
    }

    /// The stream's rows normalized by `weight` into `out`, unless the add before wrote them
    /// (`added`).
    pub fn normed(
        &self,
        added: Option<Tensor>,
        weight: &Tensor,
        out: DType,
        phases: &mut Phases<'_>,
    ) -> Result<Tensor> {
        match added {
            Some(h) => Ok(h),
            None => {
                let h = self.norm(&self.x, weight, out)?;
                phases.mark("norms")?;
                Ok(h)
            }
        }
    }

    /// `add.proj` of `input` (then `add.post`) added into the stream: by the projection's GEMM
    /// itself where `gemm_add` is on and nothing comes between, else projected and added. Where
    /// the stream has room and the next norm asks for f32 rows, the add writes them too and they
    /// are returned; otherwise the caller normalizes ([`Residual::normed`]).
    pub fn add(
        &mut self,
        add: &Add<'_>,
        input: &Tensor,
        phases: &mut Phases<'_>,
    ) -> Result<Option<Tensor>> {
        if self.fusions.gemm_add && add.post.is_none() && add.proj.add_into(&self.x, input)? {
            phases.mark(add.what)?;
            return Ok(None);
        }
        let mut y = add.proj.forward_raw(input)?;
        if let Some(weight) = add.post {
            y = self.norm(&y, weight, DType::F32)?;
        }
        phases.mark(add.what)?;
        if let (Some(room), Some((weight, DType::F32))) = (&self.room, add.norm_with) {
            let eps = self.eps;
            room.inplace_op2(&y, &fused::AddNorm { weight, eps })?;
            phases.mark("residual adds and norms")?;
            return Ok(Some(room.narrow(0, self.rows, self.rows)?));
        }
        self.x.inplace_op2(&y, &fused::AddInto)?;
        phases.mark("residual adds")?;
        Ok(None)
    }
}
