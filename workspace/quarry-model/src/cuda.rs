//! quarry's own CUDA kernels (issue 25), launched on the stream of candle's device so that they
//! order with candle's own work: the whole-batch paged attention (`kernels/paged_attention.cu`)
//! and the step's sampling (`kernels/sampling.cu`). build.rs compiles them to PTX, embedded here;
//! the driver compiles that for its GPU when a device first loads the module.
//!
//! Each launcher takes the host-side description of its work ([`RaggedBatch`], [`SampleRows`]),
//! uploads its small arrays and leaves the large ones (queries, the KV pool, logits, masks) where
//! they are. The tests compare every kernel with its plain-Rust reference on random inputs; they
//! need a GPU and exist only in a CUDA build (`make build-cuda CUDA_TESTS=1`, then
//! `infra/gpu-check.sh`).

use candle_core::cuda::cudarc::driver::{
    CudaSlice, CudaStream, CudaView, HostSlice, LaunchConfig, PinnedHostSlice, PushKernelArg,
    SyncOnDrop,
};
use candle_core::cuda::CudaStorage;
use candle_core::cuda::WrapErr;
use candle_core::{CudaDevice, DType, Layout, Result, Storage, Tensor};

use crate::ragged::{AttentionKernel, RaggedBatch};
use crate::sampling::SampleRows;

const ATTENTION_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/paged_attention.ptx"));
const SAMPLING_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/sampling.ptx"));
const GLU_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/glu.ptx"));
const ROPE_STORE_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/rope_store.ptx"));
const RESIDUAL_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/residual.ptx"));
/// Threads per block of `rms_norm` (its `NORM_THREADS`): a block per row.
const NORM_THREADS: u32 = 256;
/// Threads per block of the element-wise kernels (GLU, the KV writes) and of `rope_qk`.
const ELEMENTWISE_THREADS: u32 = 256;

/// Threads per block of the sampling kernel (its `SAMPLE_THREADS`).
const SAMPLE_THREADS: u32 = 512;
/// Threads per block of the attention kernel: a warp per attended position for the scores.
const ATTENTION_THREADS: u32 = 128;
/// Threads per block of its `warps` layout (its `WARPS` × 32).
const ATTENTION_WARPS_THREADS: u32 = 256;
/// Query heads per key-value head the attention kernel serves in one block (its `MAX_GROUP`).
const MAX_GROUP: usize = 8;
/// Dynamic shared memory a block may have on Hopper (227 KiB).
const MAX_SHARED: usize = 227 * 1024;
/// Split-K's choice of chunk (`AttentionKernel::Split { chunk: None }`): about this many blocks
/// per SM in a launch, and no chunk under `MIN_CHUNK` positions (4 per warp).
const SPLIT_BLOCKS_PER_SM: usize = 4;
const MIN_CHUNK: usize = 32;

/// A layer's KV pool on the device, in the element type it is stored in.
pub enum KvPool<'a> {
    F32(&'a CudaSlice<f32>, &'a CudaSlice<f32>),
    F16(&'a CudaSlice<half::f16>, &'a CudaSlice<half::f16>),
    Bf16(&'a CudaSlice<half::bf16>, &'a CudaSlice<half::bf16>),
}

/// The attention's shape: heads, grouped-query KV heads, and Gemma's sliding window (0: none).
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub n_head: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub window: usize,
}

impl From<crate::attention::Heads> for AttentionShape {
    fn from(h: crate::attention::Heads) -> Self {
        Self {
            n_head: h.n_head,
            n_kv: h.n_kv,
            head_dim: h.head_dim,
            scale: h.scale,
            window: h.window.unwrap_or(0),
        }
    }
}

/// The batch's metadata on the device, uploaded once per step (one copy) and read by every
/// layer's launch.
pub struct DeviceBatch {
    /// `token_seq`, `token_pos`, `page_start` and `block_table` of [`RaggedBatch`], one after the
    /// other.
    ids: CudaSlice<u32>,
    /// Where each of the four starts in `ids`, and where the last ends.
    at: [usize; 5],
    tokens: usize,
    page_size: usize,
    /// The most positions one new token attends to (its shared-memory need).
    longest: usize,
    /// The device's streaming multiprocessors (split-K's choice of chunk).
    sms: usize,
}

impl DeviceBatch {
    pub fn upload(dev: &CudaDevice, meta: &RaggedBatch, window: usize) -> Result<Self> {
        let longest = meta
            .token_pos
            .iter()
            .map(|&p| match window {
                0 => p as usize + 1,
                w => (p as usize + 1).min(w),
            })
            .max()
            .unwrap_or(0);
        let parts = [
            &meta.token_seq,
            &meta.token_pos,
            &meta.page_start,
            &meta.block_table,
        ];
        let mut at = [0; 5];
        for (i, p) in parts.iter().enumerate() {
            at[i + 1] = at[i] + p.len();
        }
        let ids: Vec<u32> = parts.into_iter().flatten().copied().collect();
        Ok(Self {
            ids: dev.clone_htod(&nonempty(&ids))?,
            at,
            tokens: meta.tokens(),
            page_size: meta.page_size as usize,
            longest,
            sms: multiprocessors(dev)?,
        })
    }

    /// `token_seq`, `token_pos`, `page_start` and `block_table`, as the kernel reads them.
    fn arrays(&self) -> [CudaView<'_, u32>; 4] {
        std::array::from_fn(|i| self.ids.slice(self.at[i]..self.at[i + 1]))
    }
}

/// The device's streaming multiprocessors (132 on an H100 SXM).
fn multiprocessors(dev: &CudaDevice) -> Result<usize> {
    use candle_core::cuda::cudarc::driver::sys::CUdevice_attribute;
    let n = dev
        .cuda_stream()
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .w()?;
    Ok(n.max(1) as usize)
}

/// Keeps the memory a step frees mapped for the next step. candle allocates every tensor through
/// the stream-ordered allocator (`cuMemAllocAsync` from the device's default pool), whose default
/// release threshold of 0 hands freed memory back to the driver at every synchronization, so each
/// step (one synchronization at least: its tokens come back) would map its activations and its
/// logits (100 MB at batch 512 for a 49,152-token vocabulary) afresh. With no threshold the pool
/// keeps what the largest step needed, as PyTorch's caching allocator does.
pub fn keep_freed_memory(dev: &CudaDevice) -> Result<()> {
    use candle_core::cuda::cudarc::driver::sys;
    let ctx = dev.cuda_stream().context().clone();
    ctx.bind_to_thread().w()?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: the context is current on this thread; `pool` receives the device's default pool,
    // and the attribute's value is a u64, as the driver reads it.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device())
            .result()
            .w()?;
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .result()
        .w()?;
    }
    Ok(())
}

/// A zero-length upload is refused by the driver; an empty array travels as one unused element.
fn nonempty(v: &[u32]) -> Vec<u32> {
    if v.is_empty() {
        vec![0]
    } else {
        v.to_vec()
    }
}

/// Attention for every new token of the batch: `q` is `[tokens, n_head · head_dim]` (f32), `out`
/// the same shape. One launch, or two for split-K (the chunks, then their combination).
pub fn paged_attention(
    dev: &CudaDevice,
    q: &CudaSlice<f32>,
    kv: KvPool<'_>,
    batch: &DeviceBatch,
    shape: AttentionShape,
    kernel: AttentionKernel,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    if batch.tokens == 0 {
        return Ok(());
    }
    let element = match kv {
        KvPool::F32(..) => "f32",
        KvPool::F16(..) => "f16",
        KvPool::Bf16(..) => "bf16",
    };
    if shape.head_dim > 256 {
        candle_core::bail!(
            "paged attention: heads of {} dimensions (256 at most)",
            shape.head_dim
        );
    }
    if shape.n_kv == 0
        || !shape.n_head.is_multiple_of(shape.n_kv)
        || shape.n_head / shape.n_kv > MAX_GROUP
    {
        candle_core::bail!(
            "paged attention: {} query heads on {} key-value heads (groups of at most {MAX_GROUP})",
            shape.n_head,
            shape.n_kv
        );
    }
    let group = shape.n_head / shape.n_kv;
    let chunk = split_chunk(batch, shape, kernel);
    let splits = chunk.map_or(1, |c| batch.longest.div_ceil(c));
    // Shared memory: the group's queries and scores, and for the `warps` layout the rows it reads
    // and its warps' partial sums (the kernel's comments).
    let (name, threads, shared) = match kernel {
        AttentionKernel::PerDimension => (
            format!("paged_attention_{element}"),
            ATTENTION_THREADS,
            group * (batch.longest + shape.head_dim) * 4,
        ),
        AttentionKernel::Warps | AttentionKernel::Split { .. } => {
            let layout = if splits > 1 { "split" } else { "warps" };
            let positions = chunk.unwrap_or(batch.longest).min(batch.longest);
            (
                format!("paged_attention_{layout}{}_{element}", dims_per_lane(shape)),
                ATTENTION_WARPS_THREADS,
                warps_shared_words(group, shape.head_dim, positions) * 4,
            )
        }
    };
    if shared > MAX_SHARED {
        candle_core::bail!(
            "paged attention: {} positions of context need {shared} bytes of shared memory, over \
             {MAX_SHARED}; QUARRY_ATTENTION=warps or split runs such contexts",
            batch.longest
        );
    }
    if splits > 65_535 {
        candle_core::bail!("paged attention: {splits} chunks of context (65,535 at most)");
    }
    let shared = shared as u32;
    let func = dev.get_or_load_custom_func(&name, "quarry_paged_attention", ATTENTION_PTX)?;
    if shared > 48 * 1024 {
        // Beyond the default dynamic shared memory: raise the kernel's limit (up to the
        // device's 227 KiB per block on Hopper).
        use candle_core::cuda::cudarc::driver::sys::CUfunction_attribute;
        func.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            shared as i32,
        )
        .w()?;
    }
    let cfg = LaunchConfig {
        grid_dim: (batch.tokens as u32, shape.n_kv as u32, splits as u32),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: shared,
    };
    // Split-K's chunk results: per (token, query head, chunk), the unnormalized sums and the
    // maximum and sum of the chunk's weights.
    let rows = batch.tokens * shape.n_head * splits;
    let mut parts = match splits {
        1 => None,
        // SAFETY: the split kernel writes every chunk's values, empty chunks included.
        _ => Some(unsafe {
            Split {
                acc: dev.alloc::<f32>(rows * shape.head_dim)?,
                ml: dev.alloc::<f32>(rows * 2)?,
            }
        }),
    };
    {
        let mut b = func.builder();
        b.arg(q);
        match kv {
            KvPool::F32(k, v) => b.arg(k).arg(v),
            KvPool::F16(k, v) => b.arg(k).arg(v),
            KvPool::Bf16(k, v) => b.arg(k).arg(v),
        };
        let [token_seq, token_pos, page_start, block_table] = batch.arrays();
        b.arg(&token_seq)
            .arg(&token_pos)
            .arg(&page_start)
            .arg(&block_table);
        let chunk32 = chunk.unwrap_or(0) as i32;
        let (n_head, n_kv, head_dim) = (
            shape.n_head as i32,
            shape.n_kv as i32,
            shape.head_dim as i32,
        );
        let (page_size, window) = (batch.page_size as i32, shape.window as i32);
        // The split kernel writes its chunks' results, the one-block kernel the output.
        let (acc, ml) = match &mut parts {
            Some(p) => (Some(&mut p.acc), Some(&mut p.ml)),
            None => (None, None),
        };
        match acc {
            Some(acc) => b.arg(acc),
            None => b.arg(&mut *out),
        };
        b.arg(&n_head)
            .arg(&n_kv)
            .arg(&head_dim)
            .arg(&page_size)
            .arg(&shape.scale)
            .arg(&window);
        if let Some(ml) = ml {
            b.arg(&chunk32).arg(ml);
        }
        // SAFETY: the arguments match the kernel's signature in kernels/paged_attention.cu, and
        // the buffers hold what the batch's metadata addresses (checked by the caller's pool
        // and plan).
        unsafe { b.launch(cfg) }.w()?;
    }
    let Some(Split { acc, ml }) = &parts else {
        return Ok(());
    };
    let func = dev.get_or_load_custom_func(
        "paged_attention_combine",
        "quarry_paged_attention",
        ATTENTION_PTX,
    )?;
    let cfg = LaunchConfig {
        grid_dim: ((batch.tokens * shape.n_head) as u32, 1, 1),
        block_dim: (shape.head_dim.div_ceil(32) as u32 * 32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (head_dim, splits32) = (shape.head_dim as i32, splits as i32);
    let mut b = func.builder();
    b.arg(acc).arg(ml).arg(out).arg(&head_dim).arg(&splits32);
    // SAFETY: `paged_attention_combine`'s signature; `acc` and `ml` hold `splits` chunks of every
    // (token, query head), `out` one row of `head_dim` each.
    unsafe { b.launch(cfg) }.w()?;
    Ok(())
}

/// Split-K's chunk results, per (token, query head, chunk): the unnormalized weighted sums
/// (`head_dim` each) and the chunk's weights' maximum and sum.
struct Split {
    acc: CudaSlice<f32>,
    ml: CudaSlice<f32>,
}

/// The warps layout's dimensions per lane (its template's DPL): heads of up to 64, 128 or 256.
fn dims_per_lane(shape: AttentionShape) -> usize {
    match shape.head_dim.div_ceil(32) {
        0..=2 => 2,
        3..=4 => 4,
        _ => 8,
    }
}

/// Shared memory words of one warps-layout block attending to `positions` positions: the group's
/// queries and scores, the pool rows, the warps' partial sums.
fn warps_shared_words(group: usize, head_dim: usize, positions: usize) -> usize {
    let warps = ATTENTION_WARPS_THREADS as usize / 32;
    group * (head_dim + positions) + positions + warps * group * head_dim
}

/// The positions per chunk a launch splits each token's context into, or `None` for one block
/// per (token, key-value head). `Warps` splits only a context too long for one block's shared
/// memory; `Split` takes its chunk, or chooses one that gives the launch about
/// `SPLIT_BLOCKS_PER_SM` blocks per SM (never under `MIN_CHUNK` positions); both stay within
/// shared memory. A chunk that covers the longest context is `None`.
fn split_chunk(
    batch: &DeviceBatch,
    shape: AttentionShape,
    kernel: AttentionKernel,
) -> Option<usize> {
    let group = shape.n_head / shape.n_kv;
    let fixed = warps_shared_words(group, shape.head_dim, 0);
    let most = (MAX_SHARED / 4).saturating_sub(fixed) / (group + 1);
    let chunk = match kernel {
        AttentionKernel::PerDimension => return None,
        AttentionKernel::Warps => most,
        AttentionKernel::Split { chunk: Some(c) } => c.clamp(1, most),
        AttentionKernel::Split { chunk: None } => {
            let blocks = batch.tokens * shape.n_kv;
            let wanted = (SPLIT_BLOCKS_PER_SM * batch.sms).div_ceil(blocks.max(1));
            batch
                .longest
                .div_ceil(wanted)
                .max(MIN_CHUNK)
                .min(most.max(1))
        }
    };
    (chunk < batch.longest).then_some(chunk)
}

/// A grid-stride launch over `n` values.
fn elementwise(n: usize) -> LaunchConfig {
    let blocks = (n as u64)
        .div_ceil(ELEMENTWISE_THREADS as u64)
        .clamp(1, 65_535) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (ELEMENTWISE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The contiguous values a layout addresses in a storage, as a kernel argument.
fn view<'a, T: candle_core::cuda::CudaDType>(
    s: &'a CudaStorage,
    l: &Layout,
    what: &str,
) -> Result<CudaView<'a, T>> {
    let Some((a, b)) = l.contiguous_offsets() else {
        candle_core::bail!("{what} must be contiguous");
    };
    Ok(s.as_cuda_slice::<T>()?.slice(a..b))
}

/// A tensor's storage, held for a launch that reads it, and its layout.
fn held(t: &Tensor) -> (impl std::ops::Deref<Target = Storage> + '_, &Layout) {
    t.storage_and_layout()
}

/// [`view`] of a held tensor's values (a launch's parameter tensor).
fn held_view<'a, T: candle_core::cuda::CudaDType>(
    storage: &'a impl std::ops::Deref<Target = Storage>,
    l: &Layout,
    what: &str,
) -> Result<CudaView<'a, T>> {
    match &**storage {
        Storage::Cuda(c) => view::<T>(c, l, what),
        _ => candle_core::bail!("{what} must be on the GPU"),
    }
}

/// Pushes the values storage `$s` and layout `$l` address (f32, else f16) on the builder `$b`;
/// `$x32` and `$x16` are the caller's (declared, unset) bindings that keep the view alive.
macro_rules! arg_f32_or_f16 {
    ($b:ident, $s:expr, $l:expr, $what:expr, $x32:ident, $x16:ident) => {
        match &$s.slice {
            candle_core::cuda::CudaStorageSlice::F32(_) => {
                $x32 = view::<f32>($s, $l, $what)?;
                $b.arg(&$x32)
            }
            _ => {
                $x16 = view::<half::f16>($s, $l, $what)?;
                $b.arg(&$x16)
            }
        }
    };
}

/// Launches `func(x, y, ...)` (a kernel `{prefix}_{input}_{output}`, [`in_out_name`]): `x` the
/// values storage `$s` and layout `$l` address (f32 or f16), `y` a new tensor of `$n` values of
/// `$out` (f32 or f16), then the arguments `$more` pushes on the builder `$b`; evaluates to `y`.
/// The caller's SAFETY: `func` has exactly that signature for both element types and writes
/// every value of `y`.
macro_rules! in_out_launch {
    (@one $in:ty, $o:ty, $s:ident, $l:ident, $func:ident, $n:expr, $cfg:expr, $what:expr,
     |$b:ident| $more:block) => {{
        let x = view::<$in>($s, $l, $what)?;
        let mut y = $s.device.alloc::<$o>(($n).max(1))?;
        if $n > 0 {
            let mut $b = $func.builder();
            $b.arg(&x).arg(&mut y);
            $more
            $b.launch($cfg).w()?;
        }
        CudaStorage::wrap_cuda_slice(y, $s.device.clone())
    }};
    ($s:ident, $l:ident, $out:expr, $func:ident, $n:expr, $cfg:expr, $what:expr,
     |$b:ident| $more:block) => {{
        use candle_core::cuda::CudaStorageSlice as S;
        match (&$s.slice, $out) {
            (S::F32(_), DType::F32) => {
                in_out_launch!(@one f32, f32, $s, $l, $func, $n, $cfg, $what, |$b| $more)
            }
            (S::F32(_), _) => {
                in_out_launch!(@one f32, half::f16, $s, $l, $func, $n, $cfg, $what, |$b| $more)
            }
            (_, DType::F32) => {
                in_out_launch!(@one half::f16, f32, $s, $l, $func, $n, $cfg, $what, |$b| $more)
            }
            _ => in_out_launch!(@one half::f16, half::f16, $s, $l, $func, $n, $cfg, $what, |$b| $more),
        }
    }};
}

/// `act(gate) · up` from the stacked gate/up output (`[rows, 2f]`, f32 or f16) into a new
/// `[rows, f]` of `out` (f32 or f16), one launch of `kernels/glu.cu`.
pub fn glu(
    s: &CudaStorage,
    l: &Layout,
    act: crate::config::Activation,
    out: DType,
    rows: usize,
    f: usize,
) -> Result<CudaStorage> {
    let act = match act {
        crate::config::Activation::Silu => "silu",
        crate::config::Activation::GeluTanh => "gelu_tanh",
    };
    let func = s.device.get_or_load_custom_func(
        &in_out_name(&format!("glu_{act}"), s, out)?,
        "quarry_glu",
        GLU_PTX,
    )?;
    let (rows64, f64) = (rows as u64, f as u64);
    // SAFETY: the arguments match `glu_*` in kernels/glu.cu; the input holds `rows` rows of 2f
    // values, the output `rows · f`, every one of which the kernel writes.
    Ok(unsafe {
        in_out_launch!(
            s,
            l,
            out,
            func,
            rows * f,
            elementwise(rows * f),
            "glu: the gate/up output",
            |b| {
                b.arg(&rows64).arg(&f64);
            }
        )
    })
}

/// The kernel `{prefix}_{input}_{output}` for an f32 or f16 input and output.
fn in_out_name(prefix: &str, s: &CudaStorage, out: DType) -> Result<String> {
    use candle_core::backend::BackendStorage;
    use candle_core::cuda::CudaStorageSlice as S;
    let name = |d: DType| if d == DType::F16 { "f16" } else { "f32" };
    match (&s.slice, out) {
        (S::F32(_) | S::F16(_), DType::F32 | DType::F16) => {
            Ok(format!("{prefix}_{}_{}", name(s.dtype()), name(out)))
        }
        (_, out) => candle_core::bail!(
            "{prefix}: f32 or f16 in and out, not {:?} to {out:?}",
            s.dtype()
        ),
    }
}

/// The attention's inputs from the stacked Q/K/V output (`s`, `[tokens, width]`, f32 or f16):
/// one launch of `rope_qk` (`kernels/rope_store.cu`), returning the f32 planes of
/// [`crate::llama::RopeQk`].
pub(crate) fn rope_qk(
    s: &CudaStorage,
    l: &Layout,
    op: &crate::llama::RopeQk<'_>,
    tokens: usize,
) -> Result<CudaStorage> {
    use candle_core::cuda::CudaStorageSlice as S;
    let dev = &s.device;
    let width = (op.n_head + 2 * op.n_kv) * op.head_dim;
    let name = match &s.slice {
        S::F32(_) => "rope_qk_f32",
        S::F16(_) => "rope_qk_f16",
        _ => candle_core::bail!("rope: the projection's output must be f32 or f16"),
    };
    let func = dev.get_or_load_custom_func(name, "quarry_rope_store", ROPE_STORE_PTX)?;
    let shared = (width * 4) as u32;
    if shared > 48 * 1024 {
        candle_core::bail!("rope: rows of {width} values exceed a block's shared memory");
    }
    // The parameters, held while the launch reads them; absent ones are null pointers.
    let positions = held(op.positions);
    let (cos, sin) = (held(op.cos), held(op.sin));
    let bias = op.bias.map(held);
    let norms = op.qk_norm.map(|(q, k)| (held(q), held(k)));
    let positions = held_view::<u32>(&positions.0, positions.1, "rope: positions")?;
    let cos = held_view::<f32>(&cos.0, cos.1, "rope: cos")?;
    let sin = held_view::<f32>(&sin.0, sin.1, "rope: sin")?;
    let bias = match &bias {
        Some((g, l)) => Some(held_view::<f32>(g, l, "rope: bias")?),
        None => None,
    };
    let norms = match &norms {
        Some(((qg, ql), (kg, kl))) => Some((
            held_view::<f32>(qg, ql, "rope: q norm")?,
            held_view::<f32>(kg, kl, "rope: k norm")?,
        )),
        None => None,
    };
    // SAFETY: the kernel writes every value of its planes (tokens · width).
    let mut out = unsafe { dev.alloc::<f32>((tokens * width).max(1)) }?;
    if tokens == 0 {
        return Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()));
    }
    let null = 0u64;
    let (tokens32, n_head, n_kv, head_dim) = (
        tokens as i32,
        op.n_head as i32,
        op.n_kv as i32,
        op.head_dim as i32,
    );
    let interleaved = i32::from(op.style == crate::config::RopeStyle::Interleaved);
    let cfg = LaunchConfig {
        grid_dim: (tokens as u32, 1, 1),
        block_dim: (ELEMENTWISE_THREADS, 1, 1),
        shared_mem_bytes: shared,
    };
    let (x32, x16);
    let mut b = func.builder();
    arg_f32_or_f16!(b, s, l, "rope: the projection's output", x32, x16);
    match &bias {
        Some(bias) => b.arg(bias),
        None => b.arg(&null),
    };
    match &norms {
        Some((q, k)) => b.arg(q).arg(k),
        None => b.arg(&null).arg(&null),
    };
    b.arg(&cos)
        .arg(&sin)
        .arg(&positions)
        .arg(&mut out)
        .arg(&tokens32)
        .arg(&n_head)
        .arg(&n_kv)
        .arg(&head_dim)
        .arg(&interleaved)
        .arg(&op.eps);
    // SAFETY: the arguments match `rope_qk_*` in kernels/rope_store.cu; the input holds `tokens`
    // rows of `width`, the bias `width` values, each norm `head_dim`, and the tables cover every
    // position (the plan checked them against the context length).
    unsafe { b.launch(cfg) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}

/// Each row of `s` (`rows` × `width`, f32 or f16) normalized by [`crate::llama::Norm`]'s weight,
/// into a new tensor of its `out` type: one launch of `rms_norm` (`kernels/residual.cu`).
pub(crate) fn rms_norm(
    s: &CudaStorage,
    l: &Layout,
    op: &crate::llama::Norm<'_>,
    rows: usize,
    width: usize,
) -> Result<CudaStorage> {
    let func = s.device.get_or_load_custom_func(
        &in_out_name("rms_norm", s, op.out)?,
        "quarry_residual",
        RESIDUAL_PTX,
    )?;
    let weight = held(op.weight);
    let weight = held_view::<f32>(&weight.0, weight.1, "norm: the weight")?;
    let cfg = LaunchConfig {
        grid_dim: (rows.max(1) as u32, 1, 1),
        block_dim: (NORM_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let width32 = width as i32;
    // SAFETY: the arguments match `rms_norm_*` in kernels/residual.cu; the input holds `rows`
    // rows of `width` values, the weight `width`, and the kernel writes every value of the output.
    Ok(unsafe {
        in_out_launch!(
            s,
            l,
            op.out,
            func,
            rows * width,
            cfg,
            "norm: the input",
            |b| {
                b.arg(&weight).arg(&width32).arg(&op.eps);
            }
        )
    })
}

/// `x += y` over their values (x f32, y f32 or f16, contiguous, one shape): one launch of
/// `add_into` (`kernels/residual.cu`).
pub(crate) fn add_into(
    x: &mut CudaStorage,
    lx: &Layout,
    y: &CudaStorage,
    ly: &Layout,
) -> Result<()> {
    use candle_core::cuda::CudaStorageSlice as S;
    let n = ly.shape().elem_count();
    if n == 0 {
        return Ok(());
    }
    let dev = x.device.clone();
    let name = match &y.slice {
        S::F32(_) => "add_into_f32",
        S::F16(_) => "add_into_f16",
        _ => candle_core::bail!("add: the projection's output must be f32 or f16"),
    };
    let func = dev.get_or_load_custom_func(name, "quarry_residual", RESIDUAL_PTX)?;
    let start = lx.start_offset();
    let S::F32(xs) = &mut x.slice else {
        candle_core::bail!("add: the residual stream must be f32");
    };
    let mut xs = xs.slice_mut(start..start + n);
    let n64 = n as u64;
    let (y32, y16);
    let mut b = func.builder();
    b.arg(&mut xs);
    arg_f32_or_f16!(b, y, ly, "add: the projection's output", y32, y16);
    b.arg(&n64);
    // SAFETY: the arguments match `add_into_*`; both hold `n` values.
    unsafe { b.launch(elementwise(n)) }.w()?;
    Ok(())
}

/// Writes a plane of `tokens` rows of `width` f32 values into a pool layer at the rows `slots`
/// names, in the pool's element type: one launch of `store_rows` (`kernels/rope_store.cu`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn store_rows(
    pool: &mut CudaStorage,
    lp: &Layout,
    plane: &CudaStorage,
    ls: &Layout,
    slots: &CudaStorage,
    lz: &Layout,
    tokens: usize,
    width: usize,
) -> Result<()> {
    use candle_core::cuda::CudaStorageSlice as S;
    if tokens == 0 {
        return Ok(());
    }
    let dev = pool.device.clone();
    let src = view::<f32>(plane, ls, "store rows: the plane")?;
    let slots = view::<u32>(slots, lz, "store rows: the slots")?;
    let (tokens64, width64) = (tokens as u64, width as u64);
    let cfg = elementwise(tokens * width);
    let start = lp.start_offset();
    let name = match &pool.slice {
        S::F32(_) => "store_rows_f32",
        S::F16(_) => "store_rows_f16",
        S::BF16(_) => "store_rows_bf16",
        _ => candle_core::bail!("store rows: pools are f32, f16 or bf16"),
    };
    let func = dev.get_or_load_custom_func(name, "quarry_rope_store", ROPE_STORE_PTX)?;
    let mut b = func.builder();
    b.arg(&src).arg(&slots);
    let (mut p32, mut p16, mut pb16);
    match &mut pool.slice {
        S::F32(p) => {
            p32 = p.slice_mut(start..);
            b.arg(&mut p32)
        }
        S::F16(p) => {
            p16 = p.slice_mut(start..);
            b.arg(&mut p16)
        }
        S::BF16(p) => {
            pb16 = p.slice_mut(start..);
            b.arg(&mut pb16)
        }
        _ => unreachable!("matched above"),
    };
    b.arg(&tokens64).arg(&width64);
    // SAFETY: the arguments match `store_rows_*`; the plane holds `tokens · width` values, the
    // slots `tokens` rows of the pool (the plan checked them against the pool's size).
    unsafe { b.launch(cfg) }.w()?;
    Ok(())
}

/// The step's masks on their way to the GPU: the host writes them into page-locked memory and one
/// asynchronous copy per step moves them to the device buffer the sampling kernel reads. Two host
/// buffers alternate, so the masks of step t + 1 are written while step t's copy may still be in
/// flight (cudarc records an event on each buffer at its copy, and handing a buffer out again
/// waits for that event only).
pub struct MaskUpload {
    host: [PinnedHostSlice<u32>; 2],
    device: CudaSlice<u32>,
    next: usize,
}

impl MaskUpload {
    /// Buffers for `words` mask words (grown on demand).
    pub fn new(dev: &CudaDevice, words: usize) -> Result<Self> {
        let words = words.max(1);
        Ok(Self {
            host: [pinned(dev, words)?, pinned(dev, words)?],
            device: dev.alloc_zeros::<u32>(words)?,
            next: 0,
        })
    }

    /// The host buffer for the next step's `words` words, to fill before [`MaskUpload::upload`].
    pub fn host_mut(&mut self, dev: &CudaDevice, words: usize) -> Result<&mut [u32]> {
        let words = words.max(1);
        if self.host[self.next].len() < words {
            self.host[self.next] = pinned(dev, words)?;
        }
        Ok(&mut self.host[self.next].as_mut_slice().w()?[..words])
    }

    /// Queues the copy of the buffer [`MaskUpload::host_mut`] handed out (its first `words`
    /// words) on candle's stream, and returns the device buffer: kernels queued after it on that
    /// stream read the step's masks.
    pub fn upload(&mut self, dev: &CudaDevice, words: usize) -> Result<&CudaSlice<u32>> {
        let words = words.max(1);
        if self.device.len() < words {
            self.device = dev.alloc_zeros::<u32>(words)?;
        }
        let host = &self.host[self.next];
        let mut dst = self.device.slice_mut(..words);
        dev.cuda_stream()
            .memcpy_htod(&HostPrefix(host, words), &mut dst)
            .w()?;
        self.next = 1 - self.next;
        Ok(&self.device)
    }
}

/// The first words of a page-locked buffer, as a copy's source: the copy records its event on
/// the whole buffer, as a copy of all of it would.
struct HostPrefix<'a>(&'a PinnedHostSlice<u32>, usize);

impl HostSlice<u32> for HostPrefix<'_> {
    fn len(&self) -> usize {
        self.1
    }

    unsafe fn stream_synced_slice<'b>(
        &'b self,
        stream: &'b CudaStream,
    ) -> (&'b [u32], SyncOnDrop<'b>) {
        // SAFETY: as the caller's: the slice is used with `stream` only.
        let (all, sync) = unsafe { self.0.stream_synced_slice(stream) };
        (&all[..self.1], sync)
    }

    unsafe fn stream_synced_mut_slice<'b>(
        &'b mut self,
        _: &'b CudaStream,
    ) -> (&'b mut [u32], SyncOnDrop<'b>) {
        unreachable!("a mask upload's source is only read")
    }
}

fn pinned(dev: &CudaDevice, words: usize) -> Result<PinnedHostSlice<u32>> {
    // SAFETY: the memory is uninitialized until written; it is only read after `host_mut` handed
    // it out and the caller filled the words it uploads. Flags 0: plain page-locked memory (not
    // write-combined, which host reads would make slow).
    unsafe {
        dev.cuda_stream()
            .context()
            .alloc_pinned_with_flags::<u32>(words, 0)
    }
    .w()
}

/// One step's draws: row `rows.logit_row[r]` of `logits` (`[logit rows, vocab]`, edited in place
/// by bans, as the host edits its rows: the caller's own copy, no other tensor may read it) gives
/// row `r`'s token. `masks` holds the step's masks of
/// `words_per_mask` words each. Returns one `Result` per row: the token, or the host sampler's
/// error for that row (every token masked, a NaN logit).
pub fn sample_rows(
    dev: &CudaDevice,
    logits: &CudaView<'_, f32>,
    vocab: usize,
    masks: &CudaSlice<u32>,
    words_per_mask: usize,
    rows: &SampleRows,
) -> Result<Vec<crate::Result<u32>>> {
    let n = rows.rows();
    if n == 0 {
        return Ok(Vec::new());
    }
    let func = dev.get_or_load_custom_func("sample_rows", "quarry_sampling", SAMPLING_PTX)?;
    // The rows' parameters in one upload: the uniforms (f64, first, so they stay 8-byte
    // aligned), then every u32 and f32 array as words.
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let parts: [&[u32]; 7] = [
        &rows.logit_row,
        &bits(&rows.temperature),
        &rows.top_k,
        &bits(&rows.top_p),
        &rows.mask_index,
        &rows.ban_start,
        &nonempty(&rows.ban_ids),
    ];
    let mut words: Vec<u32> = rows
        .uniform
        .iter()
        .flat_map(|u| {
            let b = u.to_bits();
            [b as u32, (b >> 32) as u32]
        })
        .collect();
    let mut at = [2 * n; 8];
    for (i, p) in parts.iter().enumerate() {
        words.extend_from_slice(p);
        at[i + 1] = at[i] + p.len();
    }
    let params = dev.clone_htod(&words)?;
    let word = |i: usize| params.slice(at[i]..at[i + 1]);
    // SAFETY: each view reinterprets words that hold values of its type (f32 bits; the uniforms'
    // little-endian halves, at the buffer's 8-byte-aligned start).
    let (uniform, temperature, top_p) = unsafe {
        (
            params.slice(..2 * n).transmute::<f64>(n),
            word(1).transmute::<f32>(n),
            word(3).transmute::<f32>(n),
        )
    };
    let (Some(uniform), Some(temperature), Some(top_p)) = (uniform, temperature, top_p) else {
        candle_core::bail!("sampling: the parameters' upload is short");
    };
    let [logit_row, top_k, mask_index, ban_start, ban_ids] = [0, 2, 4, 5, 6].map(word);
    // Every row's token, then every row's status: one buffer, one copy back.
    let mut out = dev.alloc_zeros::<u32>(2 * n)?;
    let (vocab32, words32) = (vocab as u32, words_per_mask as u32);
    let cfg = LaunchConfig {
        grid_dim: (n as u32, 1, 1),
        block_dim: (SAMPLE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    {
        let (mut token, mut status) = out.split_at_mut(n);
        let mut b = func.builder();
        b.arg(logits)
            .arg(&logit_row)
            .arg(&vocab32)
            .arg(masks)
            .arg(&words32)
            .arg(&mask_index)
            .arg(&ban_start)
            .arg(&ban_ids)
            .arg(&temperature)
            .arg(&top_k)
            .arg(&top_p)
            .arg(&uniform)
            .arg(&mut token)
            .arg(&mut status);
        // SAFETY: the arguments match `sample_rows` in kernels/sampling.cu; every per-row array has
        // `n` entries (`ban_start` n + 1), and the caller's logits and masks have the sizes given.
        unsafe { b.launch(cfg) }.w()?;
    }
    let out = dev.clone_dtoh(&out)?;
    let (token, status) = out.split_at(n);
    Ok(token
        .iter()
        .zip(status)
        .map(|(&t, &s)| match s {
            0 => Ok(t),
            1 => Err(crate::ModelError::Sampling {
                message: "every token is masked (all logits are -inf)".into(),
            }),
            _ => Err(crate::ModelError::Sampling {
                message: format!("logit of token {t} is NaN"),
            }),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::Heads;
    use crate::batch::SeqInput;
    use crate::ragged::attend_reference;
    use crate::sampling::{Sampler, SamplingParams};
    use crate::simd::testing::{relative_error, values};

    /// The GPU the kernel tests run on. They exist only in CUDA builds and fail without a GPU:
    /// a CUDA build's test run is the GPU check.
    fn gpu() -> CudaDevice {
        candle_core::Device::new_cuda(0)
            .and_then(|d| d.as_cuda_device().cloned())
            .expect("the CUDA kernel tests need a GPU (run them through infra/gpu-check.sh)")
    }

    /// A batch as a step mixes them, on scattered pages of 16 positions: long and short prefills,
    /// decodes at long contexts, an extension.
    fn mixed(page_size: usize) -> (Vec<Vec<u32>>, Vec<usize>, Vec<Vec<u32>>) {
        let lens = [37usize, 1, 1, 5, 120, 1];
        let starts = [0usize, 700, 63, 30, 0, 2];
        let mut next_page = 0u32;
        let mut pages = Vec::new();
        for (l, s) in lens.iter().zip(&starts) {
            let n = (s + l).div_ceil(page_size);
            // Every other page, backwards: nothing contiguous or ordered.
            let p: Vec<u32> = (0..n as u32)
                .rev()
                .map(|i| (next_page + i) * 2 + 1)
                .collect();
            next_page += n as u32;
            pages.push(p);
        }
        let tokens = lens.iter().map(|&l| vec![1u32; l]).collect();
        (tokens, starts.to_vec(), pages)
    }

    #[test]
    fn paged_attention_matches_its_reference_on_a_mixed_batch() {
        paged_attention_matches_its_reference(AttentionKernel::PerDimension);
    }

    #[test]
    fn paged_attention_warps_matches_its_reference_on_a_mixed_batch() {
        paged_attention_matches_its_reference(AttentionKernel::Warps);
    }

    /// Split-K with chunks of 16 and 100 positions (most tokens' contexts split, some in one
    /// chunk; chunks past short tokens' ends left empty) and with the chunk it chooses.
    #[test]
    fn paged_attention_split_matches_its_reference_on_a_mixed_batch() {
        for chunk in [Some(16), Some(100), None] {
            paged_attention_matches_its_reference(AttentionKernel::Split { chunk });
        }
    }

    /// A decode row at 20,000 positions with Qwen2.5's groups of 7: more than one block's shared
    /// memory holds, so the warps layout splits it (and the per-dimension one refuses it, naming
    /// the way out).
    #[test]
    fn paged_attention_splits_a_context_too_long_for_one_block() {
        let dev = gpu();
        let (n_head, n_kv, head_dim, context) = (14, 2, 64, 20_000);
        let pages: Vec<u32> = (0..context as u32).rev().collect();
        let tokens = [1u32];
        let batch = [SeqInput::new(&tokens, context - 1, &pages)];
        let mut meta = RaggedBatch::default();
        meta.fill(&batch, 1);
        let h = Heads {
            n_head,
            n_kv,
            head_dim,
            page_size: 1,
            scale: 0.125,
            window: None,
        };
        let kv = context * n_kv * head_dim;
        let (k, v) = (values(11, kv, -1.0, 1.0), values(13, kv, -1.0, 1.0));
        let q = values(17, n_head * head_dim, -3.0, 3.0);
        let mut want = vec![0f32; q.len()];
        attend_reference(&meta, &q, &k, &v, h, &mut want);
        let shape = AttentionShape::from(h);
        let db = DeviceBatch::upload(&dev, &meta, 0).unwrap();
        let (dq, dk, dv) = (
            dev.clone_htod(&q).unwrap(),
            dev.clone_htod(&k).unwrap(),
            dev.clone_htod(&v).unwrap(),
        );
        let mut out = dev.clone_htod(&vec![f32::NAN; q.len()]).unwrap();
        let refused = paged_attention(
            &dev,
            &dq,
            KvPool::F32(&dk, &dv),
            &db,
            shape,
            AttentionKernel::PerDimension,
            &mut out,
        )
        .unwrap_err();
        assert!(refused.to_string().contains("shared memory"), "{refused}");
        paged_attention(
            &dev,
            &dq,
            KvPool::F32(&dk, &dv),
            &db,
            shape,
            AttentionKernel::Warps,
            &mut out,
        )
        .unwrap();
        let got = dev.clone_dtoh(&out).unwrap();
        let err = relative_error(&got, &want);
        eprintln!("paged attention over {context} positions, split: relative error {err:.2e}");
        assert!(err < 1e-5, "relative error {err:.2e}");
    }

    fn paged_attention_matches_its_reference(kernel: AttentionKernel) {
        let dev = gpu();
        let page_size = 16;
        let (tokens, starts, pages) = mixed(page_size);
        let batch: Vec<SeqInput<'_>> = (0..tokens.len())
            .map(|i| SeqInput::new(&tokens[i], starts[i], &pages[i]))
            .collect();
        let mut meta = RaggedBatch::default();
        meta.fill(&batch, page_size);
        let rows = (pages.iter().flatten().max().unwrap() + 1) as usize * page_size;
        // SmolLM2's groups of 3, Qwen2.5's of 7, Gemma's 4 heads on one of 256 with its window.
        for (n_head, n_kv, head_dim, window) in [(9, 3, 64, 0), (14, 2, 64, 0), (4, 1, 256, 48)] {
            let h = Heads {
                n_head,
                n_kv,
                head_dim,
                page_size,
                scale: 1.0 / (head_dim as f32).sqrt(),
                window: (window > 0).then_some(window),
            };
            let seed = (n_head * 1000 + head_dim + window) as u64;
            let kv = rows * n_kv * head_dim;
            let k = values(seed * 3 + 1, kv, -1.0, 1.0);
            let v = values(seed * 5 + 2, kv, -1.0, 1.0);
            let q = values(seed * 7 + 3, meta.tokens() * n_head * head_dim, -1.0, 1.0);
            let mut want = vec![0f32; q.len()];
            attend_reference(&meta, &q, &k, &v, h, &mut want);
            let shape = AttentionShape::from(h);
            let db = DeviceBatch::upload(&dev, &meta, window).unwrap();
            let dq = dev.clone_htod(&q).unwrap();
            let check = |pool: KvPool<'_>, what: &str, bound: f64| {
                // Poisoned: an unwritten output is NaN and fails.
                let mut out = dev.clone_htod(&vec![f32::NAN; q.len()]).unwrap();
                paged_attention(&dev, &dq, pool, &db, shape, kernel, &mut out).unwrap();
                let got = dev.clone_dtoh(&out).unwrap();
                assert!(
                    got.iter().all(|x| x.is_finite()),
                    "{what}: unwritten or NaN output"
                );
                let err = relative_error(&got, &want);
                eprintln!("paged attention {kernel:?} {what} ({n_head}/{n_kv} heads of {head_dim}, window {window}): relative error {err:.2e}");
                assert!(
                    err < bound,
                    "{what}: relative error {err:.2e} over {bound:.0e}"
                );
            };
            let (dk, dv) = (dev.clone_htod(&k).unwrap(), dev.clone_htod(&v).unwrap());
            check(KvPool::F32(&dk, &dv), "f32 pool", 1e-5);
            // The 16-bit pools hold rounded keys and values: bf16 keeps 8 bits of mantissa,
            // f16 11, so their errors sit near 2^-9 and 2^-12 of the values.
            let to =
                |x: &[f32], f: fn(f32) -> half::f16| x.iter().map(|&y| f(y)).collect::<Vec<_>>();
            let (hk, hv) = (to(&k, half::f16::from_f32), to(&v, half::f16::from_f32));
            let (dk, dv) = (dev.clone_htod(&hk).unwrap(), dev.clone_htod(&hv).unwrap());
            check(KvPool::F16(&dk, &dv), "f16 pool", 2e-3);
            let bk: Vec<half::bf16> = k.iter().map(|&y| half::bf16::from_f32(y)).collect();
            let bv: Vec<half::bf16> = v.iter().map(|&y| half::bf16::from_f32(y)).collect();
            let (dk, dv) = (dev.clone_htod(&bk).unwrap(), dev.clone_htod(&bv).unwrap());
            check(KvPool::Bf16(&dk, &dv), "bf16 pool", 1e-2);
        }
    }

    /// Rows of every kind over a vocabulary that is not a multiple of 32 (a padded vocabulary
    /// past the mask's cover), with tied logits at the top-k and top-p boundaries: the GPU's
    /// token equals the host's, except where the uniform sits within rounding of a boundary
    /// (then it equals the host's token for a uniform moved by 1e-9).
    #[test]
    fn sampling_matches_the_host_draw_row_for_row() {
        let dev = gpu();
        let vocab = 49_157;
        let words = 1536; // covers 49,152 tokens: the last 5 are masked under a mask
        let n_masks = 3;
        let mut masks = vec![0u32; n_masks * words];
        let bits = values(77, n_masks * words, 0.0, 1.0);
        for (m, (w, b)) in masks.iter_mut().zip(&bits).enumerate() {
            // Mask 0 dense, mask 1 sparse, mask 2 a handful of tokens.
            *w = match m / words {
                0 => (b * u32::MAX as f32) as u32 | 0x0101_0101,
                1 => 1 << ((b * 32.0) as u32 % 32),
                _ if m % words < 4 => 0x8000_0001,
                _ => 0,
            };
        }
        let kinds = [
            SamplingParams {
                temperature: 0.0,
                top_k: 0,
                top_p: 1.0,
                seed: 0,
            },
            SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                seed: 1,
            },
            SamplingParams {
                temperature: 0.7,
                top_k: 40,
                top_p: 1.0,
                seed: 2,
            },
            SamplingParams {
                temperature: 1.3,
                top_k: 0,
                top_p: 0.9,
                seed: 3,
            },
            SamplingParams {
                temperature: 0.8,
                top_k: 50,
                top_p: 0.95,
                seed: 4,
            },
            SamplingParams {
                temperature: 2.0,
                top_k: 1,
                top_p: 0.5,
                seed: 5,
            },
            SamplingParams {
                temperature: 0.5,
                top_k: 100_000,
                top_p: 0.3,
                seed: 6,
            },
        ];
        let mut rows = SampleRows::default();
        let mut logits = Vec::new();
        for (r, p) in kinds.iter().cycle().take(64).enumerate() {
            // Logits quantized to 1/8 so that many tie, including at the boundaries.
            let row: Vec<f32> = values(1000 + r as u64, vocab, -12.0, 12.0)
                .into_iter()
                .map(|x| (x * 8.0).round() / 8.0)
                .collect();
            logits.extend(row);
            let mut s = Sampler::new(SamplingParams {
                seed: r as u64,
                ..*p
            })
            .unwrap();
            let mask = match r % 4 {
                3 => None,
                m => Some(m as u32),
            };
            let bans: Vec<u32> = (0..(r % 3) as u32)
                .map(|i| i * 7919 % vocab as u32)
                .collect();
            rows.push(&mut s, r, mask, bans);
        }
        // A row of NaN after its mask, and a row with every token banned by an empty mask.
        logits.extend((0..vocab).map(|i| if i == 4242 { f32::NAN } else { 0.0 }));
        rows.push(&mut Sampler::new(kinds[1]).unwrap(), 64, None, []);
        let empty = masks.len() / words;
        masks.extend(std::iter::repeat_n(0, words));
        logits.extend(std::iter::repeat_n(1.0, vocab));
        rows.push(
            &mut Sampler::new(kinds[1]).unwrap(),
            65,
            Some(empty as u32),
            [],
        );
        // The rows read their logits through logit_row: reversed, so the indirection is tested.
        let n_rows = rows.rows();
        let reversed: Vec<f32> = (0..n_rows)
            .rev()
            .flat_map(|r| logits[r * vocab..(r + 1) * vocab].to_vec())
            .collect();
        for r in 0..n_rows {
            rows.logit_row[r] = (n_rows - 1 - r) as u32;
        }

        let dl = dev.clone_htod(&reversed).unwrap();
        // The masks travel as the engine's will: through the page-locked upload.
        let mut upload = MaskUpload::new(&dev, 1).unwrap();
        upload
            .host_mut(&dev, masks.len())
            .unwrap()
            .copy_from_slice(&masks);
        let dm = upload.upload(&dev, masks.len()).unwrap();
        let got = sample_rows(&dev, &dl.slice(..), vocab, dm, words, &rows).unwrap();
        let mut scratch = Vec::new();
        let (mut exact, mut boundary) = (0, 0);
        for (r, g) in got.iter().enumerate() {
            let row = || logits[r * vocab..(r + 1) * vocab].to_vec();
            let want = rows.pick_row(r, &mut row(), &masks, words, &mut scratch);
            match (want, g) {
                (Ok(w), Ok(g)) if w == *g => exact += 1,
                (Ok(w), Ok(g)) => {
                    let mut moved = rows.clone();
                    let near = [-1e-9, 1e-9].iter().any(|d| {
                        moved.uniform[r] = rows.uniform[r] + d;
                        moved
                            .pick_row(r, &mut row(), &masks, words, &mut scratch)
                            .ok()
                            == Some(*g)
                    });
                    assert!(
                        near,
                        "row {r} ({:?}): host {w}, GPU {g}",
                        kinds[r % kinds.len()]
                    );
                    boundary += 1;
                }
                (Err(w), Err(g)) => assert_eq!(w.to_string(), g.to_string(), "row {r}"),
                (w, g) => panic!("row {r}: host {w:?}, GPU {g:?}"),
            }
        }
        eprintln!(
            "sampling: {exact} rows equal the host's draw, {boundary} at a rounding boundary"
        );
        assert!(boundary <= 2, "{boundary} rows differ: more than rounding");
    }

    /// Uploads alternate between the two page-locked buffers, grow them, copy only the words
    /// asked for, and each lands whole in the device buffer.
    #[test]
    fn mask_uploads_alternate_grow_and_arrive_whole() {
        let dev = gpu();
        let mut upload = MaskUpload::new(&dev, 16).unwrap();
        let mut last = Vec::new();
        for (step, words) in [10usize, 16, 5000, 3, 70_000].into_iter().enumerate() {
            let want: Vec<u32> = (0..words as u32)
                .map(|i| i.wrapping_mul(2_654_435_761) ^ step as u32)
                .collect();
            upload.host_mut(&dev, words).unwrap().copy_from_slice(&want);
            let d = upload.upload(&dev, words).unwrap();
            let got = dev.clone_dtoh(d).unwrap();
            assert_eq!(&got[..words], &want[..], "step {step}");
            if last.len() > words {
                // Past the words copied the device buffer keeps what an earlier step put there.
                assert_eq!(&got[words..last.len()], &last[words..], "step {step}");
            }
            last = got;
        }
    }

    /// A tensor of `values` on the GPU and on the CPU, in `dtype`.
    fn both(x: &[f32], shape: &[usize], dtype: DType) -> (Tensor, Tensor) {
        on_both(
            Tensor::from_slice(x, shape, &candle_core::Device::Cpu)
                .and_then(|t| t.to_dtype(dtype))
                .unwrap(),
        )
    }

    /// A CPU tensor's copy on the GPU, and the tensor.
    fn on_both(cpu: Tensor) -> (Tensor, Tensor) {
        (
            cpu.to_device(&candle_core::Device::Cuda(gpu())).unwrap(),
            cpu,
        )
    }

    /// A CPU tensor of u32 `ids`, on both.
    fn ids_on_both(ids: &[u32]) -> (Tensor, Tensor) {
        on_both(Tensor::from_slice(ids, ids.len(), &candle_core::Device::Cpu).unwrap())
    }

    fn host_f32(t: &Tensor) -> Vec<f32> {
        t.to_dtype(DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .unwrap()
    }

    /// The fused activation equals its reference (the op's CPU side) on a large random stacked
    /// input, from f32 or f16 to f32 or f16.
    #[test]
    fn glu_matches_its_reference() {
        use crate::config::Activation;
        use crate::glu::Glu;
        let (rows, f) = (300, 1001);
        let x = values(31, rows * 2 * f, -8.0, 8.0);
        for input in [DType::F32, DType::F16] {
            let (xg, xc) = both(&x, &[rows, 2 * f], input);
            for act in [Activation::Silu, Activation::GeluTanh] {
                for out in [DType::F32, DType::F16] {
                    let op = Glu { act, out };
                    let got = xg.apply_op1_no_bwd(&op).unwrap();
                    assert_eq!((got.dims(), got.dtype()), (&[rows, f][..], out));
                    let want = host_f32(&xc.apply_op1_no_bwd(&op).unwrap());
                    let err = relative_error(&host_f32(&got), &want);
                    eprintln!("glu {act:?} {input:?} -> {out:?}: relative error {err:.2e}");
                    // expf and tanhf against Rust's: an ulp or two, then f16 rounding.
                    let bound = if out == DType::F16 { 1e-3 } else { 1e-6 };
                    assert!(err < bound, "{act:?} {input:?} -> {out:?}: {err:.2e}");
                }
            }
        }
    }

    /// The attention's inputs from a stacked Q/K/V output, against the op's CPU side (the host
    /// forward's arithmetic): bit for bit without per-head norms (every operation rounded alone
    /// on both sides), within rounding with them (sums of squares in another order). SmolLM2's
    /// heads (interleaved pairs, f16 input), Qwen2.5's (NeoX pairs, a bias, f32 and f16 input),
    /// Gemma 3's (NeoX pairs, heads of 256, query and key norms).
    #[test]
    fn rope_qk_matches_its_reference() {
        use crate::config::RopeStyle;
        use crate::llama::RopeQk;
        let (tokens, context) = (37, 1000);
        let cases = [
            (9, 3, 64, RopeStyle::Interleaved, false, false, DType::F16),
            (14, 2, 64, RopeStyle::Halves, true, false, DType::F32),
            (14, 2, 64, RopeStyle::Halves, true, false, DType::F16),
            (4, 1, 256, RopeStyle::Halves, false, true, DType::F32),
        ];
        for (n_head, n_kv, head_dim, style, with_bias, with_norm, input) in cases {
            let width = (n_head + 2 * n_kv) * head_dim;
            let half = head_dim / 2;
            let seed = (n_head * 1000 + head_dim) as u64;
            let (xg, xc) = both(
                &values(seed, tokens * width, -4.0, 4.0),
                &[tokens, width],
                input,
            );
            let pos: Vec<u32> = (0..tokens as u32)
                .map(|i| (i * 379 + 11) % context as u32)
                .collect();
            let (pg, pc) = ids_on_both(&pos);
            let angle =
                |p: usize, i: usize| p as f64 * 10_000f64.powf(-2.0 * i as f64 / head_dim as f64);
            let table = |f: fn(f64) -> f64| -> Vec<f32> {
                (0..context * half)
                    .map(|j| f(angle(j / half, j % half)) as f32)
                    .collect()
            };
            let (cg, cc) = both(&table(f64::cos), &[context, half], DType::F32);
            let (sg, sc) = both(&table(f64::sin), &[context, half], DType::F32);
            let (bg, bc) = both(&values(seed + 1, width, -1.0, 1.0), &[width], DType::F32);
            let (qg, qc) = both(
                &values(seed + 2, head_dim, 0.5, 1.5),
                &[head_dim],
                DType::F32,
            );
            let (kg, kc) = both(
                &values(seed + 3, head_dim, 0.5, 1.5),
                &[head_dim],
                DType::F32,
            );
            let op = |positions, cos, sin, bias, qk_norm| RopeQk {
                n_head,
                n_kv,
                head_dim,
                style,
                positions,
                cos,
                sin,
                bias: with_bias.then_some(bias),
                qk_norm: with_norm.then_some(qk_norm),
                eps: 1e-6,
            };
            let got = xg
                .apply_op1_no_bwd(&op(&pg, &cg, &sg, &bg, (&qg, &kg)))
                .unwrap();
            let want = xc
                .apply_op1_no_bwd(&op(&pc, &cc, &sc, &bc, (&qc, &kc)))
                .unwrap();
            assert_eq!(got.dims(), [tokens * width]);
            let (got, want) = (host_f32(&got), host_f32(&want));
            let what = format!("{n_head}/{n_kv} heads of {head_dim}, {style:?}, bias {with_bias}, norms {with_norm}, {input:?}");
            if with_norm {
                let err = relative_error(&got, &want);
                eprintln!("rope_qk {what}: relative error {err:.2e}");
                assert!(err < 1e-6, "{what}: relative error {err:.2e}");
            } else {
                let differ = got
                    .iter()
                    .zip(&want)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                eprintln!("rope_qk {what}: {differ} values differ");
                assert_eq!(differ, 0, "{what}: {differ} values differ from the host's");
            }
        }
    }

    /// The KV writes put each plane row at its slot in the pool's type, rounded as the host
    /// rounds (equal bit for bit), from a plane that starts inside its storage (as the keys'
    /// and values' planes do), leaving every other row as it was.
    #[test]
    fn store_rows_matches_its_reference() {
        use crate::attention::StoreRows;
        let (rows, width, tokens) = (300, 192, 37);
        let slots: Vec<u32> = (0..tokens as u32)
            .map(|i| (i * 97 + 5) % rows as u32)
            .collect();
        let (zg, zc) = ids_on_both(&slots);
        let planes = values(41, 3 * tokens * width, -3.0, 3.0);
        let (pg, pc) = both(&planes, &[3 * tokens * width], DType::F32);
        let plane = |t: &Tensor| {
            t.narrow(0, tokens * width, tokens * width)
                .unwrap()
                .reshape((tokens, width))
                .unwrap()
        };
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let (poolg, poolc) = both(&values(43, rows * width, -1.0, 1.0), &[rows, width], dtype);
            poolg.inplace_op3(&plane(&pg), &zg, &StoreRows).unwrap();
            poolc.inplace_op3(&plane(&pc), &zc, &StoreRows).unwrap();
            let (got, want) = (host_f32(&poolg), host_f32(&poolc));
            let differ = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(differ, 0, "{dtype:?}: {differ} values differ");
        }
    }

    /// The residual stream's norm against its CPU side (the host forward's `rms_norm_row`):
    /// within rounding (the block sums the squares in another order), from f32 or f16 rows to f32
    /// or f16; the in-place add bit for bit, from f32 or f16.
    #[test]
    fn residual_ops_match_their_reference() {
        use crate::llama::{AddInto, Norm};
        let (rows, width) = (37, 896);
        let x = values(51, rows * width, -4.0, 4.0);
        let (wg, wc) = both(&values(53, width, 0.5, 1.5), &[width], DType::F32);
        for input in [DType::F32, DType::F16] {
            let (xg, xc) = both(&x, &[rows, width], input);
            for out in [DType::F32, DType::F16] {
                let norm = |weight| Norm {
                    weight,
                    eps: 1e-5,
                    out,
                };
                let got = xg.apply_op1_no_bwd(&norm(&wg)).unwrap();
                assert_eq!(got.dtype(), out);
                let want = host_f32(&xc.apply_op1_no_bwd(&norm(&wc)).unwrap());
                let err = relative_error(&host_f32(&got), &want);
                eprintln!("rms_norm {input:?} -> {out:?}: relative error {err:.2e}");
                let bound = if out == DType::F16 { 1e-3 } else { 1e-6 };
                assert!(err < bound, "norm {input:?} -> {out:?}: {err:.2e}");
            }
            let (sg, sc) = both(
                &values(57, rows * width, -4.0, 4.0),
                &[rows, width],
                DType::F32,
            );
            sg.inplace_op2(&xg, &AddInto).unwrap();
            sc.inplace_op2(&xc, &AddInto).unwrap();
            assert_eq!(host_f32(&sg), host_f32(&sc), "add from {input:?}");
        }
    }
}
