//! The llama architecture (and Gemma 3, Qwen2 and Qwen3, llamas with the switches of
//! [`LlamaConfig`]): the weights, from whichever source ([`crate::weights::Weights`]), and the
//! batched ragged forward pass.

use std::path::Path;

use candle_core::quantized::{gguf_file::Content, GgmlDType};
use candle_core::{DType, Device, Tensor};

use crate::attention;
use crate::batch::{Logits, Plan, SeqInput};
use crate::config::LlamaConfig;
use crate::error::{without_backtrace, ModelError, Result};
use crate::kernel_plan::AttentionKernel;
use crate::linear::{Fused, GpuForms, Linear, Prologue};
use crate::options::{Attention, ModelOptions, SamplingSite};
use crate::pool::{KvPool, KvStorage};
use crate::ragged::Heads;
use crate::step_graph::PaddedStep;
use crate::weights::{Q8AtLoad, Stored, Weights};

pub(crate) mod fused;
mod residual;
#[cfg(all(feature = "cuda", test))]
pub(crate) use fused::AddInto;
pub use fused::Fusions;
use residual::{Add, Residual, StepIds};
mod host;

struct Layer {
    attn_norm: Tensor,
    /// Q, K and V.
    qkv: Fused,
    wo: Linear,
    ffn_norm: Tensor,
    /// Gate and up.
    gate_up: Fused,
    w_down: Linear,
    /// Per-head query and key norms (`[head_dim]` each), when the config has them.
    qk_norm: Option<(Tensor, Tensor)>,
    /// Norms of the attention and feed-forward outputs, when the config has them.
    post_norms: Option<(Tensor, Tensor)>,
    /// Q, K and V biases side by side (`[q_w + 2 * kv_w]`), when the config has them (Qwen2).
    qkv_bias: Option<Tensor>,
    /// Index into [`Llama::rope`]: 1 for the local layers with a RoPE of their own (Gemma 3),
    /// else 0.
    rope: usize,
}

impl Layer {
    /// Layer `i`'s weights: `get` reads a tensor by name and checks its shape.
    fn load(
        c: &LlamaConfig,
        i: usize,
        get: &mut impl FnMut(&str, &[usize]) -> Result<Stored>,
        device: &Device,
        forms: GpuForms,
    ) -> Result<Self> {
        let (e, hd) = (c.embedding_length, c.head_dim);
        let dense = |t: Stored| t.to_f32(device);
        let mm = |t: Stored| Linear::new(t, device, forms);
        let mut t = |suffix: &str, dims: &[usize]| get(&format!("blk.{i}.{suffix}"), dims);
        // A pair of norm vectors of width `w` that the config may or may not have.
        let mut norms = |has: bool, a: &str, b: &str, w: usize| -> Result<_> {
            has.then(|| Ok((dense(t(a, &[w])?)?, dense(t(b, &[w])?)?)))
                .transpose()
        };
        let qk_norm = norms(c.qk_norm, "attn_q_norm.weight", "attn_k_norm.weight", hd)?;
        let post_norms = norms(
            c.post_norms,
            "post_attention_norm.weight",
            "post_ffw_norm.weight",
            e,
        )?;
        let (q_w, kv_w) = (c.head_count * hd, c.kv_dim());
        let qkv_bias = if c.qkv_bias {
            let parts = [
                dense(t("attn_q.bias", &[q_w])?)?,
                dense(t("attn_k.bias", &[kv_w])?)?,
                dense(t("attn_v.bias", &[kv_w])?)?,
            ];
            Some(Tensor::cat(&parts, 0)?)
        } else {
            None
        };
        Ok(Layer {
            qk_norm,
            post_norms,
            qkv_bias,
            rope: usize::from(c.local_rope(i).is_some()),
            attn_norm: dense(t("attn_norm.weight", &[e])?)?,
            qkv: Fused::new(
                vec![
                    t("attn_q.weight", &[c.head_count * hd, e])?,
                    t("attn_k.weight", &[c.head_count_kv * hd, e])?,
                    t("attn_v.weight", &[c.head_count_kv * hd, e])?,
                ],
                device,
                forms,
            )?,
            wo: mm(t("attn_output.weight", &[e, c.head_count * hd])?)?,
            ffn_norm: dense(t("ffn_norm.weight", &[e])?)?,
            gate_up: Fused::new(
                vec![
                    t("ffn_gate.weight", &[c.feed_forward_length, e])?,
                    t("ffn_up.weight", &[c.feed_forward_length, e])?,
                ],
                device,
                forms,
            )?,
            w_down: mm(t("ffn_down.weight", &[e, c.feed_forward_length])?)?,
        })
    }
}

/// RoPE tables `[context_length, head_dim / 2]` for one base.
struct RopeTable {
    cos: Tensor,
    sin: Tensor,
}

/// A llama-architecture model (Llama 2/3, SmolLM, Mistral without sliding windows, …) or a Gemma 3
/// loaded from GGUF. Weights stay in their GGUF type (Q4_0, Q4_1, Q8_0, K-quants; F16 and F32 are used as
/// dense tensors) and are multiplied by this crate's Q4_1/Q8_0 kernels on CPU (Q5_0 repacked for
/// the Q8_0 one), candle's otherwise.
///
/// The model holds no per-sequence state: every call to [`Llama::forward`] names the KV pages it
/// reads and writes, so any number of sequences can be in flight at once.
pub struct Llama {
    config: LlamaConfig,
    device: Device,
    /// Token embeddings, dequantized once: `[vocab, embedding_length]`.
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Linear,
    /// One table per RoPE base: the global layers', then the local layers' when there are any.
    rope: Vec<RopeTable>,
    /// The norms and RoPE tables as plain vectors, for the host forward (CPU only).
    host: Option<host::HostParams>,
    /// The page-locked buffers the step's masks travel through to the GPU.
    #[cfg(feature = "cuda")]
    masks: std::sync::Mutex<Option<crate::cuda::MaskUpload>>,
    /// The decode steps' CUDA graphs.
    #[cfg(feature = "cuda")]
    graphs: std::sync::Mutex<crate::cuda::StepGraphs>,
    /// Whether decode steps on a GPU replay CUDA graphs ([`ModelOptions::cuda_graphs`] at load;
    /// a benchmark may switch it).
    graphs_on: std::sync::atomic::AtomicBool,
    /// The tensor forward's optional fusions ([`ModelOptions`]'s at load; a benchmark or a test
    /// may switch them).
    fusions: std::sync::Mutex<Fusions>,
    /// What the model was loaded with.
    options: ModelOptions,
    /// On a GPU, the projections' form and the memory it was chosen by.
    gpu_weights: Option<crate::linear::GpuWeights>,
    /// On a CPU, the plain projections' form and the memory it was chosen by.
    host_weights: Option<crate::linear::HostWeights>,
    /// The KV pool an engine gave back last ([`Llama::give_back_pool`]), lent again to the next
    /// that asks for its shape ([`Llama::kv_pool`]), and how often each happened.
    spare_pool: std::sync::Mutex<Option<KvPool>>,
    pools: std::sync::Mutex<crate::pool::PoolCounts>,
}

impl Llama {
    /// Loads a llama-architecture GGUF file onto `device` with the default [`ModelOptions`].
    pub fn load(path: impl AsRef<Path>, device: &Device) -> Result<Self> {
        Self::load_with(path, device, &ModelOptions::default())
    }

    /// Loads a llama-architecture GGUF file, or a Hugging Face checkpoint folder
    /// ([`crate::checkpoint`]), onto `device`, to run as `options` say for its whole life.
    pub fn load_with(
        path: impl AsRef<Path>,
        device: &Device,
        options: &ModelOptions,
    ) -> Result<Self> {
        if path.as_ref().is_dir() {
            let mut checkpoint = crate::checkpoint::Checkpoint::open(path.as_ref())?;
            let config = checkpoint.config().clone();
            return Self::from_weights(config, &mut checkpoint, device, options);
        }
        let (content, file_bytes, mut file) = crate::info::read_gguf(path.as_ref())?;
        // Reports a truncated file by name before any tensor read fails on it.
        crate::ModelInfo::from_content(&content, file_bytes)?;
        Self::from_content(&content, &mut file, device, options)
    }

    /// Loads the weights described by `content` from `reader`.
    pub fn from_content<R: std::io::Read + std::io::Seek>(
        content: &Content,
        reader: &mut R,
        device: &Device,
        options: &ModelOptions,
    ) -> Result<Self> {
        let mut config = LlamaConfig::from_content(content)?;
        config.rope_freq_factors = rope_freq_factors(content, reader, &config)?;
        Self::from_weights(
            config,
            &mut GgufWeights { content, reader },
            device,
            options,
        )
    }

    /// The model of `config` with the tensors of `weights` (llama.cpp's names) on `device`.
    pub(crate) fn from_weights(
        config: LlamaConfig,
        weights: &mut impl Weights,
        device: &Device,
        options: &ModelOptions,
    ) -> Result<Self> {
        if options.profile {
            crate::profile::set_enabled(true);
        }
        // Every source (a GGUF file, a checkpoint, dummy weights) runs on a prepared device:
        // event tracking off, freed memory kept (`cuda::prepare`), before the weights' plan
        // reads the free memory.
        #[cfg(feature = "cuda")]
        if let Device::Cuda(d) = device {
            crate::cuda::prepare(d)?;
        }
        let gpu_weights = crate::linear::GpuWeights::plan(&config, weights, device, options)?;
        let host_weights = match device.is_cpu() {
            true => Some(crate::linear::HostWeights::plan(
                &config,
                |n| weights.stored_type(n),
                crate::linear::host_available(),
                options.cpu_weights,
            )?),
            false => None,
        };
        let plans = (gpu_weights, host_weights);
        match plans.1.as_ref().is_some_and(|h| h.q8_0) {
            true => Self::build(config, &mut Q8AtLoad(weights), device, options, plans),
            false => Self::build(config, weights, device, options, plans),
        }
    }

    /// The model of `config` from `weights` in the forms `plans` chose (a GPU's, a CPU's).
    fn build(
        config: LlamaConfig,
        weights: &mut impl Weights,
        device: &Device,
        options: &ModelOptions,
        (gpu_weights, host_weights): (
            Option<crate::linear::GpuWeights>,
            Option<crate::linear::HostWeights>,
        ),
    ) -> Result<Self> {
        let untied = weights.has("output.weight");
        let forms = GpuForms {
            dense_from: gpu_weights
                .as_ref()
                .map_or(options.dense_from_rows, |p| p.dense_from),
            q8_gemv: options.q8_gemv,
            gemv_prefetch: options.gemv_prefetch,
        };
        let mut get = |name: &str, dims: &[usize]| -> Result<Stored> {
            if !weights.has(name) {
                return Err(ModelError::MissingTensor {
                    tensor: name.into(),
                });
            }
            let t = weights.tensor(name, dims, device)?;
            if t.dims() != dims {
                return Err(ModelError::TensorShape {
                    tensor: name.into(),
                    expected: format!("{dims:?}"),
                    found: format!("{:?}", t.dims()),
                });
            }
            Ok(t)
        };
        let c = &config;
        let e = c.embedding_length;
        let mm = |t: Stored| Linear::new(t, device, forms);
        let embed_q = get("token_embd.weight", &[c.vocab_size, e])?;
        let embed = embed_q.to_f32(device)?;
        let lm_head = if untied {
            mm(get("output.weight", &[c.vocab_size, e])?)?
        } else {
            // Tied embeddings (SmolLM2): the output projection is the embedding matrix.
            mm(embed_q)?
        };
        let layers = (0..c.block_count)
            .map(|i| Layer::load(c, i, &mut get, device, forms))
            .collect::<Result<Vec<_>>>()?;
        let norm = get("output_norm.weight", &[e])?.to_f32(device)?;
        let mut rope = vec![rope_table(c, false, device)?];
        if c.sliding_window.is_some_and(|w| w.rope_freq_base.is_some()) {
            rope.push(rope_table(c, true, device)?);
        }
        let host = if device.is_cpu() {
            Some(host::HostParams::new(&layers, &norm, &rope)?)
        } else {
            None
        };
        Ok(Self {
            config,
            device: device.clone(),
            embed,
            layers,
            norm,
            lm_head,
            rope,
            host,
            #[cfg(feature = "cuda")]
            masks: std::sync::Mutex::new(None),
            #[cfg(feature = "cuda")]
            graphs: Default::default(),
            graphs_on: options.cuda_graphs.into(),
            fusions: Fusions::from_options(options).into(),
            options: options.clone(),
            gpu_weights,
            host_weights,
            spare_pool: Default::default(),
            pools: Default::default(),
        })
    }

    /// A KV pool for this model: `num_pages` pages of `page_size` positions on its device, in
    /// the default layout ([`crate::KvLayout::Host`] on a CPU, [`crate::KvLayout::Tensor`] elsewhere) and
    /// [`ModelOptions::kv_dtype`]'s element type.
    ///
    /// The pool given back last ([`Llama::give_back_pool`]) is lent again where it has this
    /// shape, every page free. A CUDA graph holds the addresses of the pool it was captured on,
    /// so the engines one after another over a model (a benchmark's runs, one each for a fresh
    /// radix cache; a scheduled job's) replay the graphs the first captured, where each had
    /// captured its own inside its run; and a CPU pool's pages are not faulted in again. A spare
    /// of another shape is dropped first, with its graphs, so that its memory is free for the
    /// new one.
    pub fn kv_pool(&self, page_size: usize, num_pages: usize) -> Result<KvPool> {
        let dtype = crate::kv_dtype(&self.device, self.options.kv_dtype);
        let spare = self
            .spare_pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(mut pool) = spare {
            if pool.is_shaped(&self.config, &self.device, page_size, num_pages, dtype) {
                pool.reset();
                self.pools
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .lent_again += 1;
                return Ok(pool);
            }
            self.drop_pool(pool);
        }
        let pool = KvPool::with_dtype(
            &self.config,
            page_size,
            num_pages,
            &self.device,
            None,
            dtype,
        )?;
        self.pools.lock().unwrap_or_else(|p| p.into_inner()).made += 1;
        Ok(pool)
    }

    /// Keeps `pool`, which its engine is done with, to lend again ([`Llama::kv_pool`]); the spare
    /// it replaces is dropped with its graphs. What the pool's sequences wrote stays in it until
    /// the next engine overwrites it.
    pub fn give_back_pool(&self, pool: KvPool) {
        let old = self
            .spare_pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(pool);
        if let Some(old) = old {
            self.drop_pool(old);
        }
    }

    /// How many KV pools [`Llama::kv_pool`] made and how many it lent again.
    pub fn kv_pools(&self) -> crate::pool::PoolCounts {
        *self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops a pool and the CUDA graphs captured on it, which could never replay again.
    fn drop_pool(&self, pool: KvPool) {
        #[cfg(feature = "cuda")]
        if let Some(id) = pool.storage_id() {
            self.graphs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .forget_pool(id);
        }
        drop(pool);
    }

    /// How a CPU holds the plain projections, and why (`None` on a GPU): what a command says
    /// once at load where they are quantized.
    pub fn host_weights(&self) -> Option<&crate::linear::HostWeights> {
        self.host_weights.as_ref()
    }

    /// How a GPU holds the projections, and why (`None` on a CPU): what a command says once
    /// at load.
    pub fn gpu_weights(&self) -> Option<&crate::linear::GpuWeights> {
        self.gpu_weights.as_ref()
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// What the model was loaded with.
    pub fn options(&self) -> &ModelOptions {
        &self.options
    }

    /// Turns the decode steps' CUDA graphs on or off (for a benchmark or a test; the default
    /// is [`ModelOptions::cuda_graphs`]; a CPU has none either way).
    pub fn set_cuda_graphs(&self, on: bool) {
        self.graphs_on
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sets the tensor forward's optional fusions (for a benchmark or a test; the default comes
    /// from [`ModelOptions`], [`Fusions::from_options`]); the decode graphs captured before are
    /// dropped, since they replay the other form.
    pub fn set_fusions(&self, fusions: Fusions) {
        *self.fusions.lock().unwrap_or_else(|p| p.into_inner()) = fusions;
        #[cfg(feature = "cuda")]
        self.graphs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Whether a tensor forward pass of `tokens` new tokens takes the fused add-and-norm
    /// ([`Fusions::add_norm`] on, and every norm of the pass writing f32 rows: the quantized
    /// weights, which the CPU multiplies at every size and a GPU only below
    /// [`ModelOptions::dense_from_rows`]).
    pub fn fuses_add_norm(&self, tokens: usize) -> bool {
        self.fusions().add_norm
            && self.layers.iter().all(|l| {
                l.qkv.input_dtype(tokens) == DType::F32
                    && l.gate_up.input_dtype(tokens) == DType::F32
            })
    }

    /// The tensor forward's optional fusions.
    pub fn fusions(&self) -> Fusions {
        *self.fusions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the decode steps' CUDA graphs have done since the model was loaded (all zero on a
    /// CPU).
    pub fn cuda_graphs(&self) -> crate::step_graph::GraphStats {
        let enabled =
            self.graphs_on.load(std::sync::atomic::Ordering::Relaxed) && !self.device.is_cpu();
        #[cfg(feature = "cuda")]
        {
            let graphs = self.graphs.lock().unwrap_or_else(|p| p.into_inner());
            graphs.stats(enabled)
        }
        #[cfg(not(feature = "cuda"))]
        crate::step_graph::GraphStats {
            enabled,
            ..Default::default()
        }
    }

    /// Runs one forward pass over a ragged batch.
    ///
    /// For every sequence, writes the keys and values of its new tokens into `pool` at the slots
    /// its block table names, attends over positions `0..=p` for each new position `p`, and puts
    /// its logits in `out`: after the last new token, or after every new token when it asked for
    /// all of them. Sequences may share pages for positions before their new tokens; two
    /// sequences writing the same pool row in one call is a typed error.
    pub fn forward(&self, batch: &[SeqInput], pool: &mut KvPool, out: &mut Logits) -> Result<()> {
        self.forward_as(batch, pool, out, Route::Default)
    }

    /// [`Llama::forward`] through the paged attention as a GPU runs it (on the CPU, the kernel's
    /// reference arithmetic), without a graph; with `pad`, the step padded to the shape of its
    /// CUDA graph's key first ([`crate::step_graph::GraphKey::pad`]): the pass a graph replays,
    /// on any device, so the CPU's tests check that padding leaves every real row's logits as
    /// they are. Needs the tensor KV layout (its scratch page); a step past the largest bucket
    /// runs unpadded.
    #[doc(hidden)]
    pub fn forward_paged(
        &self,
        batch: &[SeqInput],
        pool: &mut KvPool,
        out: &mut Logits,
        pad: bool,
    ) -> Result<()> {
        self.forward_as(batch, pool, out, Route::Paged { pad })
    }

    fn forward_as(
        &self,
        batch: &[SeqInput],
        pool: &mut KvPool,
        out: &mut Logits,
        route: Route,
    ) -> Result<()> {
        pool.check_shape(&self.config, &self.device)?;
        out.vocab = self.config.vocab_size;
        out.rows.clear();
        out.device = None;
        if batch.is_empty() {
            out.data.clear();
            return Ok(());
        }
        let plan = Plan::new(batch, pool, &self.config)?;
        let c = &self.config;
        let heads = Heads {
            n_head: c.head_count,
            n_kv: c.head_count_kv,
            head_dim: c.head_dim,
            page_size: pool.page_size(),
            scale: c.attention_scale,
            window: None,
        };
        let scratch = pool.scratch_page();
        match (&mut pool.storage, route) {
            (KvStorage::Host { k, v }, Route::Default) => {
                self.forward_host(batch, &plan, k, v, heads, out)?
            }
            (KvStorage::Host { .. }, Route::Paged { .. }) => {
                return Err(ModelError::Pool {
                    message: "the paged attention needs the tensor KV layout".into(),
                })
            }
            (KvStorage::Tensor { k, v }, route) => {
                let pool = PoolView {
                    k,
                    v,
                    scratch: scratch.expect("the tensor layout has a scratch page"),
                };
                self.forward_tensor(batch, &plan, pool, heads, route, out)?
            }
        }
        out.rows = plan.out_rows;
        Ok(())
    }

    /// The forward pass in candle tensor ops, over the tensor KV layout: the path for CUDA, and on
    /// CPU the cross-check of [`Llama::forward_host`].
    fn forward_tensor(
        &self,
        batch: &[SeqInput],
        plan: &Plan,
        pool: PoolView<'_>,
        heads: Heads,
        route: Route,
        out: &mut Logits,
    ) -> Result<()> {
        let t = plan.tokens.len();
        let dev = &self.device;
        // Profiling on (`ModelOptions::profile`): each phase below ends with a synchronization and a mark.
        let mut phases = crate::profile::Phases::start(dev, batch)?;
        // Attention: one paged attention launch per layer for the whole batch on a GPU, or the
        // per-sequence gather of tensor ops (the CPU's cross-check, and `attention = gather`).
        let attention = match (attention_kernel(dev, t, &self.options), route) {
            (None, Route::Paged { .. }) => Some(AttentionKernel::Warps),
            (kernel, _) => kernel,
        };
        let mut meta = crate::ragged::RaggedBatch::default();
        if attention.is_some() {
            meta.fill(batch, heads.page_size);
        }
        let args = PassArgs {
            batch,
            plan,
            meta: &meta,
            #[cfg(feature = "cuda")]
            device_batch: None,
            attention,
            k_pool: pool.k,
            v_pool: pool.v,
            heads,
        };
        // The step padded to its graph's shape: replayed through its CUDA graph where it has one
        // (cuda/graph.rs), or run as it is for `forward_paged`.
        let pad = match route {
            Route::Paged { pad } => pad,
            Route::Default => {
                !dev.is_cpu()
                    && self.graphs_on.load(std::sync::atomic::Ordering::Relaxed)
                    && !crate::profile::enabled()
            }
        };
        let padded = match attention {
            Some(_) if pad => padded_step(&meta, plan, pool.scratch, heads.page_size),
            _ => None,
        };
        let logit_rows = || Tensor::from_slice(&plan.logit_rows, plan.logit_rows.len(), dev);
        #[cfg(feature = "cuda")]
        if let (Some(step), Route::Default) = (&padded, route) {
            if let Some(x) = self.graph_pass(&args, step)? {
                let logits = self.head(&x, &logit_rows()?, &mut phases)?;
                return self.logits_out(logits, out);
            }
        }
        if let (Some(step), Route::Paged { pad: true }) = (&padded, route) {
            let ids = Tensor::from_slice(&step.ids, step.ids.len(), dev)?;
            #[cfg(feature = "cuda")]
            let device_batch = match dev {
                Device::Cuda(d) => Some(crate::cuda::DeviceBatch::upload(
                    d,
                    &step.meta,
                    0,
                    self.combine_heads(),
                )?),
                _ => None,
            };
            let args = PassArgs {
                meta: &step.meta,
                #[cfg(feature = "cuda")]
                device_batch: device_batch.as_ref(),
                ..args
            };
            let x = self.layers(&args, step.key.tokens, &ids, &mut phases)?;
            let logits = self.head(&x, &logit_rows()?, &mut phases)?;
            return self.logits_out(logits, out);
        }
        #[cfg(feature = "cuda")]
        if !dev.is_cpu() {
            self.graphs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .count_eager();
        }
        // The step's token ids, positions and slots in one upload, before any kernel is queued
        // (an upload from pageable memory may wait for the work queued before it).
        let rows = plan.logit_rows.len();
        let ids: Vec<u32> = [&plan.tokens, &plan.positions, &plan.slots, &plan.logit_rows]
            .into_iter()
            .flatten()
            .copied()
            .collect();
        let ids = Tensor::from_vec(ids, 3 * t + rows, dev)?;
        #[cfg(feature = "cuda")]
        let device_batch = match attention {
            Some(_) => Some(crate::cuda::DeviceBatch::upload(
                dev.as_cuda_device()?,
                &meta,
                0,
                self.combine_heads(),
            )?),
            None => None,
        };
        #[cfg(feature = "cuda")]
        let args = PassArgs {
            device_batch: device_batch.as_ref(),
            ..args
        };
        let x = self.layers(&args, t, &ids, &mut phases)?;
        let logits = self.head(&x, &ids.narrow(0, 3 * t, rows)?, &mut phases)?;
        self.logits_out(logits, out)
    }

    /// Split-K's last-block counters a step's device batch carries: a token's key-value heads,
    /// where [`Fusions::split_combine`] is on.
    #[cfg(feature = "cuda")]
    fn combine_heads(&self) -> Option<usize> {
        self.fusions()
            .split_combine
            .then_some(self.config.head_count_kv)
    }

    /// A step through its CUDA graph ([`crate::cuda::StepGraphs`]): the residual stream after
    /// the last layer (`[key.tokens, embedding]` f32, padding rows included), or `None` when the
    /// step runs without one (profiling on, the gather attention, `cuda_graphs` off, the
    /// first step of its key, or every step once a capture failed).
    #[cfg(feature = "cuda")]
    fn graph_pass(&self, args: &PassArgs<'_>, step: &PaddedStep) -> Result<Option<Tensor>> {
        let Device::Cuda(dev) = &self.device else {
            return Ok(None);
        };
        if args.attention.is_none()
            || crate::profile::enabled()
            || !self.graphs_on.load(std::sync::atomic::Ordering::Relaxed)
        {
            return Ok(None);
        }
        let combine_heads = self.combine_heads();
        let mut graphs = self.graphs.lock().unwrap_or_else(|p| p.into_inner());
        graphs.run(
            dev,
            step,
            args.k_pool,
            self.config.embedding_length,
            combine_heads,
            |ids, meta, db| {
                let args = PassArgs {
                    meta,
                    device_batch: Some(db),
                    ..*args
                };
                self.layers(
                    &args,
                    step.key.tokens,
                    ids,
                    &mut crate::profile::Phases::start(&self.device, args.batch)?,
                )
            },
        )
    }

    /// The output norm and the vocabulary projection of the rows `logit_rows` of `x` (the
    /// residual stream after the last layer): the logits in the output projection's element
    /// type. Only the rows whose logits are wanted go through them: the vocabulary projection is
    /// the largest matmul of a decode step.
    fn head(
        &self,
        x: &Tensor,
        logit_rows: &Tensor,
        phases: &mut crate::profile::Phases<'_>,
    ) -> Result<Tensor> {
        let rows = logit_rows.elem_count();
        let x = x.index_select(logit_rows, 0)?;
        let h = x.apply_op1_no_bwd(&fused::Norm {
            weight: &self.norm,
            eps: self.config.rms_norm_eps,
            out: self.lm_head.input_dtype(rows),
        })?;
        let logits = self.lm_head.forward(&h)?;
        phases.mark("output norm and logits")?;
        Ok(logits)
    }

    /// The layers of a step of `t` new tokens whose ids (tokens, positions, slots: `t` words
    /// each, from the start of `ids`) are on the device: the residual stream after the last
    /// layer, `[t, embedding]` f32.
    fn layers(
        &self,
        a: &PassArgs<'_>,
        t: usize,
        ids: &Tensor,
        phases: &mut crate::profile::Phases<'_>,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (tokens, positions) = (ids.narrow(0, 0, t)?, ids.narrow(0, t, t)?);
        let slots = ids.narrow(0, 2 * t, t)?;
        let mut x = self.embed.index_select(&tokens, 0)?;
        if c.embedding_scale != 1.0 {
            x = (x * c.embedding_scale as f64)?;
        }
        let fusions = if self.device.is_cpu() {
            self.fusions()
        } else {
            // By the step's bucket, as the attention: one graph, one form.
            self.fusions()
                .for_step(crate::step_graph::token_bucket(t).unwrap_or(t))
        };
        let mut stream = Residual::new(x, t, c.rms_norm_eps, fusions, self.fuses_add_norm(t))?;
        phases.mark("set-up and embedding")?;
        let ids = StepIds {
            positions: &positions,
            slots: &slots,
        };
        // A layer's attention norm, from the add before it (none before the first layer).
        let mut next_h: Option<Tensor> = None;
        for l in 0..self.layers.len() {
            next_h = self.layer(l, a, &ids, &mut stream, next_h.take(), phases)?;
        }
        Ok(stream.into_stream())
    }

    /// Layer `l` of a step over the residual `stream`: attention, then the feed-forward, each
    /// added into the stream. `h`, the attention norm's rows where the add before wrote them;
    /// returns the next layer's, where this layer's last add wrote them.
    fn layer(
        &self,
        l: usize,
        a: &PassArgs<'_>,
        ids: &StepIds<'_>,
        stream: &mut Residual,
        h: Option<Tensor>,
        phases: &mut crate::profile::Phases<'_>,
    ) -> Result<Option<Tensor>> {
        let (c, layer, t) = (&self.config, &self.layers[l], stream.rows());
        // Q, K and V from one stacked projection, biased, normalized and rotated in one op
        // (llama/fused.rs), the keys and values written to the pools in one op each.
        let rope = &self.rope[layer.rope];
        let op = fused::RopeQk {
            n_head: c.head_count,
            n_kv: c.head_count_kv,
            head_dim: c.head_dim,
            style: c.rope_style,
            positions: ids.positions,
            cos: &rope.cos,
            sin: &rope.sin,
            bias: layer.qkv_bias.as_ref(),
            qk_norm: layer.qk_norm.as_ref().map(|(q, k)| (q, k)),
            eps: c.rms_norm_eps,
        };
        let (k_pool, v_pool) = (&a.k_pool[l], &a.v_pool[l]);
        let q = self.attention_inputs(l, op, ids, (k_pool, v_pool), stream, h, phases)?;
        let heads = Heads {
            window: c.window(l),
            ..a.heads
        };
        let attn = if let Some(_kernel) = a.attention {
            let op = crate::paged::PagedAttention {
                meta: a.meta,
                #[cfg(feature = "cuda")]
                device_batch: a.device_batch,
                heads,
                // The element type the output projection multiplies: no cast between.
                out: layer.wo.input_dtype(t),
                #[cfg(feature = "cuda")]
                kernel: _kernel,
                #[cfg(feature = "cuda")]
                prefetch: self.options.attention_prefetch,
                #[cfg(feature = "cuda")]
                keys: self.options.attention_keys,
            };
            q.apply_op3_no_bwd(k_pool, v_pool, &op)?
        } else {
            attention::attend_tensor(&q, k_pool, v_pool, a.plan, a.batch, heads, &self.device)?
        };
        // Gemma's output norms, applied before the residual add when the model has them.
        let (post_attn, post_ffw) = match &layer.post_norms {
            Some((a, f)) => (Some(a), Some(f)),
            None => (None, None),
        };
        phases.mark("attention")?;
        let ffn_in = layer.gate_up.input_dtype(t);
        let add = Add {
            proj: &layer.wo,
            post: post_attn,
            norm_with: Some((&layer.ffn_norm, ffn_in)),
            what: "output projection",
        };
        let added = stream.add(&add, &attn, phases)?;
        let act = self.gated_activation(l, stream, added, phases)?;
        let next_norm = self
            .layers
            .get(l + 1)
            .map(|n| (&n.attn_norm, n.qkv.input_dtype(t)));
        let add = Add {
            proj: &layer.w_down,
            post: post_ffw,
            norm_with: next_norm,
            what: "down projection",
        };
        // The next layer's attention norm, where this add wrote it; the next layer normalizes
        // otherwise (or its GEMV does, `gemv_norm`).
        stream.add(&add, &act, phases)
    }

    /// Layer `l`'s queries (`[t, heads, head_dim]`), its keys and values written into the pools
    /// at the step's slots: the attention norm (unless the add before wrote it, `h`), the
    /// stacked Q/K/V projection and `op` (bias, per-head norms, RoPE). Where the 8-bit GEMV runs
    /// the step and `gemm_add` and `rope_store` are on, the projection's own launch rotates and
    /// writes them (no per-head norms), and for 1 or 2 rows normalizes the stream first
    /// (`gemv_norm`).
    #[allow(clippy::too_many_arguments)]
    fn attention_inputs(
        &self,
        l: usize,
        op: fused::RopeQk<'_>,
        ids: &StepIds<'_>,
        (k_pool, v_pool): (&Tensor, &Tensor),
        stream: &Residual,
        h: Option<Tensor>,
        phases: &mut crate::profile::Phases<'_>,
    ) -> Result<Tensor> {
        let (c, layer, t) = (&self.config, &self.layers[l], stream.rows());
        let f = stream.fusions;
        let fused_rope = f.gemm_add && f.rope_store && op.qk_norm.is_none();
        let mut gemv = match (fused_rope && f.gemv_norm, &h) {
            (true, None) => layer.qkv.gemv_step(stream.stream(), true)?,
            _ => None,
        };
        let prologue = gemv.as_ref().map(|_| Prologue {
            weight: &layer.attn_norm,
            eps: c.rms_norm_eps,
        });
        let h = match prologue {
            Some(_) => None,
            None => Some(stream.normed(h, &layer.attn_norm, layer.qkv.input_dtype(t), phases)?),
        };
        if let (Some(h), true) = (&h, fused_rope) {
            gemv = layer.qkv.gemv_step(h, false)?;
        }
        let q = if let Some((gemv, x)) = gemv {
            let q = x.apply_op1_no_bwd(&fused::RopeStore {
                rope: op,
                slots: ids.slots,
                k_pool,
                v_pool,
                gemv: Some(gemv),
                norm: prologue,
            })?;
            phases.mark("Q/K/V projection")?;
            q.reshape((t, c.head_count, c.head_dim))?
        } else if stream.fusions.rope_store {
            let h = match h {
                Some(h) => h,
                None => stream.normed(None, &layer.attn_norm, layer.qkv.input_dtype(t), phases)?,
            };
            let qkv = layer.qkv.forward(&h)?;
            phases.mark("Q/K/V projection")?;
            // The keys and values straight into the pools (`rope_store`).
            let q = qkv.apply_op1_no_bwd(&fused::RopeStore {
                rope: op,
                slots: ids.slots,
                k_pool,
                v_pool,
                gemv: None,
                norm: None,
            })?;
            phases.mark("RoPE and KV writes")?;
            q.reshape((t, c.head_count, c.head_dim))?
        } else {
            let h = match h {
                Some(h) => h,
                None => stream.normed(None, &layer.attn_norm, layer.qkv.input_dtype(t), phases)?,
            };
            let qkv = layer.qkv.forward(&h)?;
            phases.mark("Q/K/V projection")?;
            let planes = qkv.apply_op1_no_bwd(&op)?;
            let [q, k, v] = op.split(&planes, t)?;
            phases.mark("RoPE")?;
            k_pool.inplace_op3(&k, ids.slots, &attention::StoreRows)?;
            v_pool.inplace_op3(&v, ids.slots, &attention::StoreRows)?;
            phases.mark("KV writes")?;
            q
        };
        Ok(q)
    }

    /// Layer `l`'s `act(gate) · up`, in the element type the down projection multiplies: the
    /// feed-forward norm (unless the add before wrote it, `added`), the stacked gate/up
    /// projection and the activation, in the projection's own launch where the 8-bit GEMV runs
    /// the step and the projections' epilogues are fused (`gemm_add`), with the norm before it
    /// for 1 or 2 rows (`gemv_norm`), else in one op after it.
    fn gated_activation(
        &self,
        l: usize,
        stream: &Residual,
        added: Option<Tensor>,
        phases: &mut crate::profile::Phases<'_>,
    ) -> Result<Tensor> {
        let (c, layer, t) = (&self.config, &self.layers[l], stream.rows());
        let (f, ffn_in) = (stream.fusions, layer.gate_up.input_dtype(t));
        let down_in = layer.w_down.input_dtype(t);
        let prologue = Prologue {
            weight: &layer.ffn_norm,
            eps: c.rms_norm_eps,
        };
        let mut fused = match (f.gemm_add && f.gemv_norm, &added) {
            (true, None) => {
                let x = stream.stream();
                layer
                    .gate_up
                    .forward_glu(x, Some(prologue), c.activation, down_in)?
            }
            _ => None,
        };
        let mut h_ffn = None;
        if fused.is_none() {
            let h = stream.normed(added, &layer.ffn_norm, ffn_in, phases)?;
            if f.gemm_add {
                fused = layer.gate_up.forward_glu(&h, None, c.activation, down_in)?;
            }
            h_ffn = Some(h);
        }
        let act = match fused {
            Some(act) => {
                phases.mark("gate/up projection")?;
                act
            }
            None => {
                let h_ffn = match h_ffn {
                    Some(h) => h,
                    None => stream.normed(None, &layer.ffn_norm, ffn_in, phases)?,
                };
                let gate_up = layer.gate_up.forward(&h_ffn)?;
                phases.mark("gate/up projection")?;
                let act = gate_up.apply_op1_no_bwd(&crate::glu::Glu {
                    act: c.activation,
                    out: down_in,
                })?;
                phases.mark("GLU")?;
                act
            }
        };
        Ok(act)
    }

    /// Hands a pass's logits to `out`: copied to the host, or left on the GPU for
    /// [`Llama::sample_on_device`].
    fn logits_out(&self, logits: Tensor, out: &mut Logits) -> Result<()> {
        out.device = None;
        if self.device.is_cpu() {
            out.data.clear();
            crate::host_mem::with_host_slice(&logits, |s| out.data.extend_from_slice(s))?;
        } else if out.device_wanted
            && cfg!(feature = "cuda")
            && self.options.sampling == SamplingSite::Device
        {
            // Sampled on the device (Llama::sample_on_device): only the tokens come back.
            out.data.clear();
            out.device = Some(logits.to_dtype(DType::F32)?.contiguous()?);
        } else {
            out.data = logits.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        }
        Ok(())
    }

    /// Draws the step's tokens on the GPU from logits a forward pass left there
    /// ([`Logits::keep_on_device`]): row `r` of `rows` from logits row `rows.logit_row[r]`, under
    /// its bans and its mask in `masks` (`words` words each), with the draw of
    /// [`crate::sampling::pick`]. `None` when the logits are on the host (the caller draws there).
    pub fn sample_on_device(
        &self,
        logits: &mut Logits,
        rows: &crate::sampling::SampleRows,
        masks: &[u32],
        words: usize,
    ) -> Option<Result<Vec<Result<u32>>>> {
        // Kept (a handle, not a copy): the token budget may draw a row again from the same
        // step's logits (the kernel only writes -inf where a row bans, which a second draw under
        // a narrower mask repeats). The next pass replaces them.
        let t = logits.device.clone()?;
        #[cfg(feature = "cuda")]
        {
            Some(self.sample_cuda(&t, logits.vocab, rows, masks, words))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (t, rows, masks, words);
            unreachable!("logits stay on a device only in a CUDA build")
        }
    }

    #[cfg(feature = "cuda")]
    fn sample_cuda(
        &self,
        t: &Tensor,
        vocab: usize,
        rows: &crate::sampling::SampleRows,
        masks: &[u32],
        words: usize,
    ) -> Result<Vec<Result<u32>>> {
        let dev = self.device.as_cuda_device()?;
        let (storage, layout) = t.storage_and_layout();
        let candle_core::Storage::Cuda(cs) = &*storage else {
            return Err(ModelError::Forward {
                message: "device logits are not on a CUDA device".into(),
            });
        };
        // The kernel edits its rows (bans) in place: these logits are the step's own (the forward
        // pass made them and handed them over in `Logits`, and nothing else reads them).
        let n = layout.shape().elem_count();
        let start = layout.start_offset();
        let rows_view = cs.as_cuda_slice::<f32>()?.slice(start..start + n);
        let mut upload = self.masks.lock().unwrap_or_else(|p| p.into_inner());
        if upload.is_none() {
            *upload = Some(crate::cuda::MaskUpload::new(dev, masks.len())?);
        }
        let upload = upload.as_mut().expect("set above");
        upload
            .host_mut(dev, masks.len())?
            .get_mut(..masks.len())
            .expect("sized above")
            .copy_from_slice(masks);
        let dm = upload.upload(dev, masks.len())?;
        Ok(crate::cuda::sample_rows(
            dev, &rows_view, vocab, dm, words, rows,
        )?)
    }
}

/// Which form of the forward pass [`Llama::forward_as`] runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    /// The host kernels on the host layout; on the tensor layout a step's CUDA graph where it has
    /// one, else the pass at the step's own size.
    Default,
    /// The paged attention without a graph, the step padded to its graph's key or not
    /// ([`Llama::forward_paged`]).
    Paged { pad: bool },
}

/// The tensor layout's pools and its scratch page.
#[derive(Clone, Copy)]
struct PoolView<'a> {
    k: &'a [Tensor],
    v: &'a [Tensor],
    scratch: crate::pool::PageId,
}

/// What one pass over a step reads besides its ids: the batch and its plan, the attention's
/// metadata (and its copy on the device), the pools.
#[derive(Clone, Copy)]
struct PassArgs<'a> {
    batch: &'a [SeqInput<'a>],
    plan: &'a Plan,
    meta: &'a crate::ragged::RaggedBatch,
    #[cfg(feature = "cuda")]
    device_batch: Option<&'a crate::cuda::DeviceBatch>,
    attention: Option<AttentionKernel>,
    k_pool: &'a [Tensor],
    v_pool: &'a [Tensor],
    heads: Heads,
}

/// The step padded to its graph's key ([`PaddedStep`]): its batch and ids, the padding's rows in
/// the `scratch` page. `None` where the step has no graph key (too many tokens).
fn padded_step(
    meta: &crate::ragged::RaggedBatch,
    plan: &Plan,
    scratch: crate::pool::PageId,
    page_size: usize,
) -> Option<PaddedStep> {
    let key = crate::step_graph::GraphKey::of(meta)?;
    let mut step = PaddedStep {
        key,
        meta: Default::default(),
        ids: Vec::new(),
        pad: 0,
    };
    step.pad = key.pad(meta, scratch, &mut step.meta);
    let scratch_slot = scratch * page_size as u32;
    key.pad_ids(
        &plan.tokens,
        &plan.positions,
        &plan.slots,
        scratch_slot,
        &mut step.ids,
    );
    Some(step)
}

/// A GGUF file's tensors, read from `reader` as `content` places them.
struct GgufWeights<'a, R> {
    content: &'a Content,
    reader: &'a mut R,
}

impl<R: std::io::Read + std::io::Seek> Weights for GgufWeights<'_, R> {
    fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    fn stored_type(&self, name: &str) -> Option<GgmlDType> {
        self.content.tensor_infos.get(name).map(|t| t.ggml_dtype)
    }

    fn tensor(&mut self, name: &str, _: &[usize], device: &Device) -> Result<Stored> {
        self.content
            .tensor(self.reader, name, device)
            .map(Stored::Quant)
            .map_err(|e| ModelError::LoadTensor {
                tensor: name.into(),
                source: Box::new(without_backtrace(e)),
            })
    }
}

/// The per-frequency RoPE divisors of `rope_freqs.weight`, where the file has them (Llama 3.1/3.2:
/// `head_dim / 2` positive values; [`LlamaConfig::rope_freq_factors`]).
fn rope_freq_factors<R: std::io::Read + std::io::Seek>(
    content: &Content,
    reader: &mut R,
    c: &LlamaConfig,
) -> Result<Option<Vec<f32>>> {
    const NAME: &str = "rope_freqs.weight";
    if !content.tensor_infos.contains_key(NAME) {
        return Ok(None);
    }
    let t = content
        .tensor(reader, NAME, &Device::Cpu)
        .map_err(|e| ModelError::LoadTensor {
            tensor: NAME.into(),
            source: Box::new(without_backtrace(e)),
        })?;
    let factors = t
        .dequantize(&Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    if factors.len() != c.head_dim / 2 {
        return Err(ModelError::TensorShape {
            tensor: NAME.into(),
            expected: format!("[{}]", c.head_dim / 2),
            found: format!("{:?}", t.shape().dims()),
        });
    }
    if let Some(bad) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
        return Err(ModelError::InvalidKey {
            key: NAME.into(),
            message: format!("a RoPE frequency factor of {bad} (they divide the frequencies)"),
        });
    }
    Ok(Some(factors))
}

/// `cos(p * θ_i)` and `sin(p * θ_i)` for every position and frequency: the global layers' angles
/// ([`LlamaConfig::rope_frequencies`]), or with `local` Gemma 3's local layers', each times the
/// layers' magnitude (YaRN's; [`LlamaConfig::rope_magnitude`]).
fn rope_table(c: &LlamaConfig, local: bool, device: &Device) -> Result<RopeTable> {
    let half = c.head_dim / 2;
    let inv = c.rope_frequencies(local);
    let m = c.rope_magnitude(local);
    let mut cos = Vec::with_capacity(c.context_length * half);
    let mut sin = Vec::with_capacity(c.context_length * half);
    for p in 0..c.context_length {
        for f in &inv {
            let a = p as f64 * f;
            cos.push((a.cos() * m) as f32);
            sin.push((a.sin() * m) as f32);
        }
    }
    Ok(RopeTable {
        cos: Tensor::from_vec(cos, (c.context_length, half), device)?,
        sin: Tensor::from_vec(sin, (c.context_length, half), device)?,
    })
}

/// Whether the tensor forward pass of a step of `tokens` new tokens runs attention as one paged
/// attention launch per layer (a GPU: [`ModelOptions::attention`]'s form, `auto` being `split`
/// for steps whose bucket is at most [`fused::SMALL_STEP_TOKENS`] tokens and `warps` above, as
/// measured) or as the per-sequence gather of tensor ops (the CPU, and `gather`).
fn attention_kernel(
    dev: &Device,
    tokens: usize,
    options: &ModelOptions,
) -> Option<AttentionKernel> {
    if dev.is_cpu() {
        return None;
    }
    let chunk = options.attention_chunk;
    let small =
        crate::step_graph::token_bucket(tokens).unwrap_or(tokens) <= fused::SMALL_STEP_TOKENS;
    match options.attention {
        Attention::Auto if small => Some(AttentionKernel::Split { chunk }),
        Attention::Auto | Attention::Warps => Some(AttentionKernel::Warps),
        Attention::Split => Some(AttentionKernel::Split { chunk }),
        Attention::PerDimension => Some(AttentionKernel::PerDimension),
        Attention::Tiled => Some(AttentionKernel::Tiled),
        Attention::Cascade => Some(AttentionKernel::Cascade),
        Attention::Gather => None,
    }
}
