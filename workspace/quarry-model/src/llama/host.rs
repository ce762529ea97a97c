//! The forward pass over the host KV layout (the CPU default).
//!
//! Every step works on plain `f32` slices in buffers reused across layers, and each is shared out
//! on candle's barrier pool, the pool the matmul and attention kernels use:
//! - the residual add is fused with the RMS norm that follows it;
//! - RoPE (after Gemma's per-head query and key norms) is applied in place on the stacked Q/K/V
//!   output, and the same pass writes each new token's key and value into its pool slot;
//! - attention reads the queries from that stacked output, over each layer's window;
//! - `silu(gate)·up` (or Gemma's `gelu(gate)·up`) reads the stacked gate/up output;
//! - Gemma's output norms run in place on a projection's output before the residual add;
//! - the logits go straight into the caller's [`Logits`] buffer.
//!
//! Built on candle tensor ops instead, each step of a batch-32 decode allocated and copied its
//! output, several ran serially (or on rayon's pool, so two pools competed for two cores), and the
//! Q/K/V and gate/up splits were copies of their own. [`Llama::forward_tensor`] keeps that form
//! for devices without a host layout, and on CPU it is the cross-check of this one.

use std::ops::Range;

use candle_core::Tensor;

use crate::attention;
use crate::batch::{Logits, Plan, SeqInput};
use crate::config::{Activation, RopeStyle};
use crate::error::Result;
use crate::host_mem::SharedMut;
use crate::ragged::Heads;
use crate::simd;

use super::fused::{rms_norm_row, rotate_heads, QkNorm};
use super::{Layer, Llama, RopeTable};

/// Host copies of the small dense parameters, made at load on CPU.
pub(super) struct HostParams {
    layers: Vec<LayerNorms>,
    norm: Vec<f32>,
    /// `(cos, sin)`, each `[context_length, head_dim / 2]`, per RoPE base as in [`Llama`].
    rope: Vec<(Vec<f32>, Vec<f32>)>,
}

struct LayerNorms {
    attn: Vec<f32>,
    ffn: Vec<f32>,
    /// Per-head query and key norms.
    qk: Option<(Vec<f32>, Vec<f32>)>,
    /// Attention and feed-forward output norms.
    post: Option<(Vec<f32>, Vec<f32>)>,
    /// Q, K and V biases side by side.
    qkv_bias: Option<Vec<f32>>,
}

impl HostParams {
    pub(super) fn new(layers: &[Layer], norm: &Tensor, rope: &[RopeTable]) -> Result<Self> {
        let vec = |t: &Tensor| -> Result<Vec<f32>> { Ok(t.flatten_all()?.to_vec1()?) };
        let pair = |p: &Option<(Tensor, Tensor)>| -> Result<Option<(Vec<f32>, Vec<f32>)>> {
            p.as_ref().map(|(a, b)| Ok((vec(a)?, vec(b)?))).transpose()
        };
        Ok(Self {
            layers: layers
                .iter()
                .map(|l| {
                    Ok(LayerNorms {
                        attn: vec(&l.attn_norm)?,
                        ffn: vec(&l.ffn_norm)?,
                        qk: pair(&l.qk_norm)?,
                        post: pair(&l.post_norms)?,
                        qkv_bias: l.qkv_bias.as_ref().map(vec).transpose()?,
                    })
                })
                .collect::<Result<_>>()?,
            norm: vec(norm)?,
            rope: rope
                .iter()
                .map(|r| Ok((vec(&r.cos)?, vec(&r.sin)?)))
                .collect::<Result<_>>()?,
        })
    }
}

/// One forward call's activations, each `[tokens, width]`, reused by every layer.
#[derive(Default)]
struct Buffers {
    /// The residual stream.
    x: Vec<f32>,
    /// Its normalized form, the input of the next projection.
    h: Vec<f32>,
    /// Q, K and V side by side.
    qkv: Vec<f32>,
    attn: Vec<f32>,
    /// A projection's output, added to `x` by the next norm.
    y: Vec<f32>,
    /// Gate and up side by side.
    gate_up: Vec<f32>,
    act: Vec<f32>,
}

impl Llama {
    pub(super) fn forward_host(
        &self,
        batch: &[SeqInput],
        plan: &Plan,
        k_pool: &mut [Vec<f32>],
        v_pool: &mut [Vec<f32>],
        heads: Heads,
        out: &mut Logits,
    ) -> Result<()> {
        let p = self.host.as_ref().expect("a CPU model has host parameters");
        let c = &self.config;
        let (t, e, eps) = (plan.tokens.len(), c.embedding_length, c.rms_norm_eps);
        let (q_w, kv_w) = (c.head_count * c.head_dim, c.kv_dim());
        let mut b = Buffers::default();
        crate::host_mem::with_host_slice(&self.embed, |emb| {
            b.x.reserve(t * e);
            for &tok in &plan.tokens {
                let at = tok as usize * e;
                b.x.extend_from_slice(&emb[at..at + e]);
            }
        })?;
        if c.embedding_scale != 1.0 {
            b.x.iter_mut().for_each(|v| *v *= c.embedding_scale);
        }
        for (l, layer) in self.layers.iter().enumerate() {
            let norms = &p.layers[l];
            // The previous layer's down projection joins the residual here.
            let y = (l > 0).then_some(b.y.as_slice());
            add_norm(&mut b.x, y, &norms.attn, eps, &mut b.h);
            layer.qkv.forward_host(&b.h, t, &mut b.qkv)?;
            if let Some(bias) = &norms.qkv_bias {
                for row in b.qkv.chunks_exact_mut(bias.len()) {
                    row.iter_mut().zip(bias).for_each(|(y, b)| *y += b);
                }
            }
            let (cos, sin) = &p.rope[layer.rope];
            let rope = Rope {
                q_w,
                kv_w,
                head_dim: c.head_dim,
                style: c.rope_style,
                cos,
                sin,
                qk_norm: norms
                    .qk
                    .as_ref()
                    .map(|(q, k)| (q.as_slice(), k.as_slice(), eps)),
            };
            rope.apply_and_store(&mut b.qkv, plan, &mut k_pool[l], &mut v_pool[l]);
            b.attn.resize(t * q_w, 0.0);
            let qkv_w = q_w + 2 * kv_w;
            attention::attend_host(
                &b.qkv,
                qkv_w,
                &k_pool[l],
                &v_pool[l],
                plan,
                batch,
                Heads {
                    window: c.window(l),
                    ..heads
                },
                &mut b.attn,
            );
            layer.wo.forward_host(&b.attn, t, &mut b.y)?;
            if let Some((post_attn, _)) = &norms.post {
                norm_in_place(&mut b.y, post_attn, eps);
            }
            add_norm(&mut b.x, Some(&b.y), &norms.ffn, eps, &mut b.h);
            layer.gate_up.forward_host(&b.h, t, &mut b.gate_up)?;
            gated(&b.gate_up, c.feed_forward_length, c.activation, &mut b.act);
            layer.w_down.forward_host(&b.act, t, &mut b.y)?;
            if let Some((_, post_ffw)) = &norms.post {
                norm_in_place(&mut b.y, post_ffw, eps);
            }
        }
        // Only the rows whose logits are wanted get the last residual add, the final norm and the
        // vocabulary projection, the largest matmul of a decode step.
        // (With output norms, the last `y` was normalized in the loop.)
        let mut last = Vec::with_capacity(plan.logit_rows.len() * e);
        for &r in &plan.logit_rows {
            let r = r as usize * e..(r as usize + 1) * e;
            last.extend(b.x[r.clone()].iter().zip(&b.y[r]).map(|(x, y)| x + y));
        }
        add_norm(&mut last, None, &p.norm, eps, &mut b.h);
        self.lm_head
            .forward_host(&b.h, plan.logit_rows.len(), &mut out.data)
    }
}

/// Runs `f` over `0..rows`, shared out on the pool when the work is worth waking it for.
fn par_rows(rows: usize, width: usize, f: impl Fn(Range<usize>) + Sync) {
    if rows >= 2 && rows * width >= 4096 {
        candle_core::utils::barrier_pool().execute_chunked(rows, f);
    } else {
        f(0..rows);
    }
}

/// `x += y` (when given), then `h = x / rms(x) · w` per row, as candle's `rms_norm` computes it.
fn add_norm(x: &mut [f32], y: Option<&[f32]>, w: &[f32], eps: f32, h: &mut Vec<f32>) {
    let e = w.len();
    h.resize(x.len(), 0.0);
    let (xs, hs) = (SharedMut::new(x), SharedMut::new(h));
    par_rows(x.len() / e, e, |rows| {
        for r in rows {
            // SAFETY: row `r` of `x` and `h` is touched by this work item only.
            let (x, h) = unsafe { (xs.slice(r * e, e), hs.slice(r * e, e)) };
            if let Some(y) = y {
                for (x, y) in x.iter_mut().zip(&y[r * e..(r + 1) * e]) {
                    *x += y;
                }
            }
            h.copy_from_slice(x);
            rms_norm_row(h, w, eps);
        }
    });
}

/// `y = y / rms(y) · w` per row, in place (Gemma's output norms).
fn norm_in_place(y: &mut [f32], w: &[f32], eps: f32) {
    let e = w.len();
    let ys = SharedMut::new(y);
    par_rows(y.len() / e, e, |rows| {
        for r in rows {
            // SAFETY: row `r` is touched by this work item only.
            rms_norm_row(unsafe { ys.slice(r * e, e) }, w, eps);
        }
    });
}

/// `act = activation(gate) · up` per row of the stacked `[gate | up]` output (`f` values each).
fn gated(gate_up: &[f32], f: usize, activation: Activation, act: &mut Vec<f32>) {
    let rows = gate_up.len() / (2 * f);
    act.resize(rows * f, 0.0);
    let out = SharedMut::new(act);
    let avx = simd::Avx2::detect();
    par_rows(rows, 2 * f, |range| {
        for r in range {
            let (gate, up) = gate_up[r * 2 * f..(r + 1) * 2 * f].split_at(f);
            // SAFETY: row `r` is written by this work item only.
            let out = unsafe { out.slice(r * f, f) };
            match activation {
                Activation::Silu => simd::swiglu(gate, up, out, avx),
                Activation::GeluTanh => simd::geglu(gate, up, out, avx),
            }
        }
    });
}

/// Rotary embeddings on the stacked Q/K/V rows ([`rotate_heads`]: each pair of [`RopeStyle`]
/// rotates by `p·θ_i`), after the per-head query and key norms when the model has them, and the
/// KV writes.
struct Rope<'a> {
    q_w: usize,
    kv_w: usize,
    head_dim: usize,
    style: RopeStyle,
    cos: &'a [f32],
    sin: &'a [f32],
    /// Query norm, key norm, epsilon.
    qk_norm: QkNorm<'a>,
}

impl Rope<'_> {
    fn apply_and_store(
        &self,
        qkv: &mut [f32],
        plan: &Plan,
        k_pool: &mut [f32],
        v_pool: &mut [f32],
    ) {
        let (q_w, kv_w, half) = (self.q_w, self.kv_w, self.head_dim / 2);
        let width = q_w + 2 * kv_w;
        let (rows, kp, vp) = (
            SharedMut::new(qkv),
            SharedMut::new(k_pool),
            SharedMut::new(v_pool),
        );
        par_rows(plan.tokens.len(), width, |range| {
            for r in range {
                let pos = plan.positions[r] as usize;
                let table = (
                    &self.cos[pos * half..(pos + 1) * half],
                    &self.sin[pos * half..(pos + 1) * half],
                );
                // SAFETY: row `r` of the stacked output, and the pool row of its slot, are touched
                // by this work item only: the plan gives every new token its own slot.
                let row = unsafe { rows.slice(r * width, width) };
                rotate_heads(
                    &mut row[..q_w + kv_w],
                    q_w,
                    self.head_dim,
                    self.style,
                    table,
                    self.qk_norm,
                );
                let slot = plan.slots[r] as usize * kv_w;
                unsafe { kp.slice(slot, kv_w) }.copy_from_slice(&row[q_w..q_w + kv_w]);
                unsafe { vp.slice(slot, kv_w) }.copy_from_slice(&row[q_w + kv_w..]);
            }
        });
    }
}
