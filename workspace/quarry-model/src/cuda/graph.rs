//! CUDA graphs of the forward pass (`step_graph.rs` says which steps, padded how). A pass at
//! small batches is launch-bound: about 13 launches a layer, each paying the driver's enqueue and
//! candle's bookkeeping on the host, while the GPU's part is a few microseconds. A graph captures
//! a pass's layers once and replays them with one launch.
//!
//! A graph replays the same launches on the same buffers, so a step of key `k`, padded to `k`
//! ([`crate::step_graph::GraphKey::pad`]), reads its inputs from buffers the graph of `k` owns (the layers'
//! ids, the attention's batch in [`crate::step_graph::GraphKey::layout`]), refilled before each replay, and the
//! layers write the residual stream into a buffer of the graph's, which the logits (run after the
//! graph at the step's own size) read. Everything the layers allocate in between is allocated and
//! freed inside the graph, which owns that memory. A key is captured the second time a step of
//! it comes ([`GraphCache`]). The capture's step runs the pass once first (so that candle's
//! upload cache holds the small parameters some of its ops copy from the host, which a capture
//! cannot take), then captures it (nothing runs while capturing) and replays the graph.
//!
//! If a capture fails (an operation the driver refuses to capture), steps run without graphs
//! from then on and the reason is printed once: the pass itself is the same either way.

use candle_core::backend::BackendStorage;
use candle_core::cuda::cudarc::driver::{sys, CudaGraph, DriverError};
use candle_core::cuda::{CudaStorage, CudaStorageSlice, WrapErr};
use candle_core::{CpuStorage, CudaDevice, DType, Device, Layout, Tensor};

use super::attention::DeviceBatch;
use crate::error::{ModelError, Result};
use crate::ragged::RaggedBatch;
use crate::step_graph::{Decision, GraphCache, GraphStats, PaddedStep};

/// The graphs of one model ([`GraphCache`]: which step captures, which replays) and their counts.
#[derive(Default)]
pub struct StepGraphs {
    cache: GraphCache<Entry, Option<candle_core::TensorId>>,
    /// Why a capture failed: steps run without graphs from then on.
    failed: Option<String>,
    /// The attention's batch in its fixed layout, reused between steps.
    packed: Vec<u32>,
    stats: GraphStats,
}

/// A graph and the buffers it reads and writes.
struct Entry {
    /// The layers' ids (tokens, positions, slots; `3 · tokens` words).
    ids: Tensor,
    batch: DeviceBatch,
    /// `[tokens, embedding]` f32: the residual stream after the last layer, after each replay.
    stream: Tensor,
    graph: Graph,
}

/// A captured and instantiated graph.
struct Graph(CudaGraph);

// SAFETY: a CUDA graph may be used from any thread as long as no two threads use it at once
// (the CUDA docs' "graph thread safety"); the graphs live in a `StepGraphs` that the model keeps
// behind a mutex, and nothing else reaches them.
unsafe impl Send for Graph {}

impl StepGraphs {
    /// A pass on the GPU that ran without a graph.
    pub fn count_eager(&mut self) {
        self.stats.eager += 1;
    }

    /// Runs the layers of a padded `step` through its key's graph: replays the graph with the
    /// step's ids and batch, or captures the layers `layers` runs (from the graph's own inputs)
    /// and replays them. A captured graph's batch carries split-K's last-block counters for
    /// `combine_heads` key-value heads a token where that is `Some` ([`DeviceBatch::fixed`]).
    /// Returns the residual stream after the last layer (`[tokens, embedding]` f32, the graph's
    /// buffer: valid until the next step), or `None` when the step must run without a graph
    /// (every step once a capture failed).
    pub(crate) fn run(
        &mut self,
        dev: &CudaDevice,
        step: &PaddedStep,
        pool: &[Tensor],
        embedding: usize,
        combine_heads: Option<usize>,
        layers: impl Fn(&Tensor, &RaggedBatch, &DeviceBatch) -> Result<Tensor>,
    ) -> Result<Option<Tensor>> {
        if self.failed.is_some() {
            return Ok(None);
        }
        let key = step.key;
        // A pool is told apart by its first layer's tensor (a pool's tensors are made with it,
        // and tensor ids are never reused): `KvPool::storage_id`.
        let pool = pool.first().map(Tensor::id);
        let decision = self.cache.decide(key, pool);
        self.stats.padded_tokens += step.pad as u64;
        self.stats.real_tokens += (key.tokens - step.pad) as u64;
        if let Decision::Replay(i) = decision {
            let e = self.cache.get_mut(i);
            e.ids.inplace_op1(&Fill(&step.ids))?;
            e.batch.refill(dev, key, &step.meta, &mut self.packed)?;
            e.graph.0.launch().map_err(driver("replaying"))?;
            self.stats.replayed += 1;
            return Ok(Some(e.stream.clone()));
        }
        let device = Device::Cuda(dev.clone());
        let free_before = free_memory(dev)?;
        let inputs = Tensor::from_slice(&step.ids, step.ids.len(), &device)?;
        let mut batch = DeviceBatch::fixed(dev, key, combine_heads)?;
        batch.refill(dev, key, &step.meta, &mut self.packed)?;
        let stream = Tensor::zeros((key.tokens, embedding), DType::F32, &device)?;
        // Some of candle's ops upload small parameters from the host at every call
        // (`index_select` its index tensor's shape and strides): a capture would keep a copy from
        // host memory freed by the time it replays. With candle's upload cache on, such uploads
        // are kept on the device by their contents, and a capture that misses the cache fails
        // instead; one pass before the capture fills it. (That pass writes the same keys and
        // values to the same slots as the graph's launch after it.)
        let _cache = dev.enable_cuda_graph_htod_cache();
        drop(layers(&inputs, &step.meta, &batch)?);
        let Some(graph) = self.capture(dev, || {
            let x = layers(&inputs, &step.meta, &batch)?;
            Ok(stream.slice_set(&x, 0, 0)?)
        })?
        else {
            return Ok(None);
        };
        graph.0.launch().map_err(driver("launching"))?;
        // What the graph holds: its buffers and the memory its launch reserved, as the driver
        // counts free memory (stream-ordered frees may return later: an estimate, not a bound).
        dev.cuda_stream().synchronize().w()?;
        let bytes = free_before.saturating_sub(free_memory(dev)?) as u64;
        self.stats.captured += 1;
        let entry = Entry {
            ids: inputs,
            batch,
            stream: stream.clone(),
            graph,
        };
        // A graph pushed out may still run (the step before launched it): the driver frees it
        // when it completes.
        let evicted = self.cache.insert(key, pool, entry, bytes);
        self.stats.evicted += evicted.len() as u64;
        drop(evicted);
        Ok(Some(stream))
    }

    /// Drops the graphs captured on the pool whose storage is `pool` ([`crate::KvPool::storage_id`]),
    /// which is going: their memory goes back (a graph still running is freed by the driver when
    /// it completes, as an evicted one is).
    pub fn forget_pool(&mut self, pool: candle_core::TensorId) {
        self.cache.forget_pool(Some(pool));
    }

    /// Drops every graph (the pass they replay has changed); the counts stay.
    pub fn clear(&mut self) {
        self.cache.clear();
    }

    /// What the graphs have done; `enabled` as the caller says.
    pub fn stats(&self, enabled: bool) -> GraphStats {
        GraphStats {
            enabled,
            graphs: self.cache.len() as u64,
            bytes: self.cache.bytes(),
            failed: self.failed.clone(),
            ..self.stats.clone()
        }
    }

    /// Captures what `pass` queues on candle's stream into an instantiated graph, or `None`
    /// (after saying why, once) when the driver refuses.
    fn capture(
        &mut self,
        dev: &CudaDevice,
        pass: impl FnOnce() -> Result<()>,
    ) -> Result<Option<Graph>> {
        let stream = dev.cuda_stream();
        // Thread-local: an operation of this thread that cannot be captured (a synchronous
        // allocation or copy) fails the capture instead of running behind its back.
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver("starting the capture of"))?;
        let queued = pass();
        let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        let why = match (queued, ended) {
            (Ok(()), Ok(Some(graph))) => return Ok(Some(Graph(graph))),
            (Err(e), _) => e.to_string(),
            (Ok(()), Err(e)) => format!("{e:?}"),
            (Ok(()), Ok(None)) => "the capture is empty".into(),
        };
        // Frees queued into the abandoned capture report their errors here: clear them, the
        // step runs without a graph.
        let _ = stream.context().check_err();
        eprintln!(
            "quarry-model: steps run without CUDA graphs (QUARRY_CUDA_GRAPHS): the capture failed: \
             {why}"
        );
        self.failed = Some(why);
        Ok(None)
    }
}

fn driver(doing: &'static str) -> impl Fn(DriverError) -> ModelError {
    move |e| ModelError::Forward {
        message: format!("{doing} a step's CUDA graph: {e:?}"),
    }
}

/// The device's free memory, as the driver counts it.
fn free_memory(dev: &CudaDevice) -> Result<usize> {
    let (free, _total) = dev.cuda_stream().context().mem_get_info().w()?;
    Ok(free)
}

/// Copies host words into a u32 tensor on the GPU, in place (a graph's inputs keep their buffer).
struct Fill<'a>(&'a [u32]);

impl candle_core::InplaceOp1 for Fill<'_> {
    fn name(&self) -> &'static str {
        "graph-input"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("a CUDA graph's inputs are on the GPU")
    }

    fn cuda_fwd(&self, s: &mut CudaStorage, l: &Layout) -> candle_core::Result<()> {
        let dev = s.device().clone();
        let Some((a, b)) = l.contiguous_offsets() else {
            candle_core::bail!("a graph's inputs are contiguous");
        };
        let CudaStorageSlice::U32(x) = &mut s.slice else {
            candle_core::bail!("a graph's inputs are u32");
        };
        if b - a != self.0.len() {
            candle_core::bail!(
                "a graph's inputs hold {} words, not {}",
                b - a,
                self.0.len()
            );
        }
        let mut dst = x.slice_mut(a..b);
        dev.cuda_stream().memcpy_htod(self.0, &mut dst).w()
    }
}
