//! The whole-batch paged attention (`kernels/paged_attention.cu`): one launch per layer for
//! every new token of a ragged batch, in the layout [`AttentionKernel`] names, split over the
//! positions (split-K) where the launch would have too few blocks or a context too long for one
//! block's shared memory.

use candle_core::cuda::cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, LaunchConfig, PushKernelArg,
};
use candle_core::cuda::WrapErr;
use candle_core::{CudaDevice, Result};

use super::nonempty;
use crate::kernel_plan::AttentionKernel;
use crate::kernel_plan::{AttentionPlan, AttentionShape, BatchSize, PrefixPlan};
use crate::ragged::RaggedBatch;
use crate::step_graph::GraphKey;

/// The attention's forms, a module per pool type and kind (build.rs): the driver compiles a
/// module whole at its first load, a process reads one pool type, and only `attention = tiled`
/// launches the tiled forms, only `attention = cascade` the prefix forms.
macro_rules! attention_ptx {
    ($module:literal) => {
        include_str!(concat!(env!("OUT_DIR"), "/", $module, ".ptx"))
    };
}
const ATTENTION_PTX: [(&str, &str); 9] = [
    (
        "quarry_paged_attention_f32",
        attention_ptx!("paged_attention_f32"),
    ),
    (
        "quarry_paged_attention_f16",
        attention_ptx!("paged_attention_f16"),
    ),
    (
        "quarry_paged_attention_bf16",
        attention_ptx!("paged_attention_bf16"),
    ),
    (
        "quarry_paged_attention_tiled_f32",
        attention_ptx!("paged_attention_tiled_f32"),
    ),
    (
        "quarry_paged_attention_tiled_f16",
        attention_ptx!("paged_attention_tiled_f16"),
    ),
    (
        "quarry_paged_attention_tiled_bf16",
        attention_ptx!("paged_attention_tiled_bf16"),
    ),
    (
        "quarry_paged_attention_prefix_f32",
        attention_ptx!("paged_attention_prefix_f32"),
    ),
    (
        "quarry_paged_attention_prefix_f16",
        attention_ptx!("paged_attention_prefix_f16"),
    ),
    (
        "quarry_paged_attention_prefix_bf16",
        attention_ptx!("paged_attention_prefix_bf16"),
    ),
];

/// The module of `element`'s pool of a kind (`""`, `"tiled_"` or `"prefix_"`): its name on the
/// device, its PTX.
fn attention_module(element: &str, kind: &str) -> Result<(&'static str, &'static str)> {
    let name = format!("quarry_paged_attention_{kind}{element}");
    match ATTENTION_PTX.iter().find(|(n, _)| *n == name) {
        Some(&module) => Ok(module),
        None => candle_core::bail!("paged attention: no pool of {element}"),
    }
}

/// A layer's KV pool on the device, in the element type it is stored in.
pub enum KvPool<'a> {
    F32(&'a CudaSlice<f32>, &'a CudaSlice<f32>),
    F16(&'a CudaSlice<half::f16>, &'a CudaSlice<half::f16>),
    Bf16(&'a CudaSlice<half::bf16>, &'a CudaSlice<half::bf16>),
}

/// Where the attention writes: `[tokens, n_head · head_dim]` in f32, or in f16 for an output
/// projection that multiplies dense f16 weights (no cast between them).
pub enum AttentionOut<'a> {
    F32(&'a mut CudaSlice<f32>),
    F16(&'a mut CudaSlice<half::f16>),
}

/// The batch's metadata on the device, uploaded once per step (one copy) and read by every
/// layer's launch.
pub struct DeviceBatch {
    /// `token_seq`, `token_pos`, `token_shared`, `page_start` and `block_table` of
    /// [`RaggedBatch`], one after the other.
    ids: CudaSlice<u32>,
    /// Where each of the five starts in `ids`, and where the last ends.
    at: [usize; 6],
    page_size: usize,
    /// What the launch plan needs: tokens, the longest context, the device's SMs.
    size: BatchSize,
    /// Split-K's last-block combine ([`crate::Fusions::split_combine`]): a counter per (token,
    /// key-value head), zero between launches (the combining block sets it back), so that every
    /// layer's launch, and every replay of a CUDA graph, finds them zero. `None`: the combine's
    /// own launch.
    counters: Option<CudaSlice<u32>>,
}

impl DeviceBatch {
    /// `meta` on the device, with split-K's last-block counters for `combine_heads` key-value
    /// heads a token where that is `Some` ([`crate::Fusions::split_combine`]).
    pub fn upload(
        dev: &CudaDevice,
        meta: &RaggedBatch,
        window: usize,
        combine_heads: Option<usize>,
    ) -> Result<Self> {
        let parts = [
            &meta.token_seq,
            &meta.token_pos,
            &meta.token_shared,
            &meta.page_start,
            &meta.block_table,
        ];
        let mut at = [0; 6];
        for (i, p) in parts.iter().enumerate() {
            at[i + 1] = at[i] + p.len();
        }
        let ids: Vec<u32> = parts.into_iter().flatten().copied().collect();
        Ok(Self {
            ids: dev.clone_htod(&nonempty(&ids))?,
            at,
            page_size: meta.page_size as usize,
            size: BatchSize::new(meta, window, multiprocessors(dev)?),
            counters: counters(dev, meta.tokens(), combine_heads)?,
        })
    }

    /// The buffer a CUDA graph of `key` reads its batch from ([`GraphKey::layout`]): a step of
    /// that key refills it ([`DeviceBatch::refill`]) and its launches are planned for the key's
    /// tokens and its bound on the context.
    pub fn fixed(dev: &CudaDevice, key: GraphKey, combine_heads: Option<usize>) -> Result<Self> {
        let at = key.layout();
        Ok(Self {
            ids: dev.alloc_zeros::<u32>(at[5])?,
            at,
            page_size: key.page_size,
            size: BatchSize {
                tokens: key.tokens,
                longest: key.context,
                sms: multiprocessors(dev)?,
            },
            counters: counters(dev, key.tokens, combine_heads)?,
        })
    }

    /// Copies a step padded to `key` ([`GraphKey::pad`]) into a [`DeviceBatch::fixed`] buffer of
    /// that key, through `packed` (the caller's, reused between steps): only the words the step
    /// uses, up to the end of its block table.
    pub fn refill(
        &mut self,
        dev: &CudaDevice,
        key: GraphKey,
        padded: &RaggedBatch,
        packed: &mut Vec<u32>,
    ) -> Result<()> {
        if self.at != key.layout() || self.size.tokens != key.tokens {
            candle_core::bail!("paged attention: a batch refilled with another key's step");
        }
        let used = key.pack(padded, packed);
        let mut dst = self.ids.slice_mut(0..used);
        dev.cuda_stream().memcpy_htod(&packed[..used], &mut dst).w()
    }

    /// `token_seq`, `token_pos`, `token_shared`, `page_start` and `block_table`, as the kernel
    /// reads them.
    fn arrays(&self) -> [CudaView<'_, u32>; 5] {
        std::array::from_fn(|i| self.ids.slice(self.at[i]..self.at[i + 1]))
    }
}

/// Split-K's last-block counters for `tokens` tokens of `heads` key-value heads each, zeroed, or
/// none.
fn counters(
    dev: &CudaDevice,
    tokens: usize,
    heads: Option<usize>,
) -> Result<Option<CudaSlice<u32>>> {
    heads
        .map(|h| dev.alloc_zeros::<u32>((tokens * h).max(1)))
        .transpose()
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

/// Attention for every new token of the batch: `q` is `[tokens, n_head · head_dim]` (f32), `out`
/// the same shape (f32 or f16). One launch, or two for split-K (the chunks, then their
/// combination), or three for the cascade (the shared prefix's slots, the chunks, the
/// combination); split-K's combination is in the chunks' launch where `batch` carries the
/// last-block counters ([`crate::Fusions::split_combine`]).
pub fn paged_attention(
    dev: &CudaDevice,
    q: &CudaSlice<f32>,
    kv: KvPool<'_>,
    batch: &DeviceBatch,
    shape: AttentionShape,
    kernel: AttentionKernel,
    out: AttentionOut<'_>,
) -> Result<()> {
    if batch.size.tokens == 0 {
        return Ok(());
    }
    let element = match kv {
        KvPool::F32(..) => "f32",
        KvPool::F16(..) => "f16",
        KvPool::Bf16(..) => "bf16",
    };
    let plan = AttentionPlan::new(
        batch.size,
        shape,
        kernel,
        element,
        matches!(out, AttentionOut::F16(_)),
    )
    .map_err(candle_core::Error::msg)?;
    let (chunk, slots) = (plan.chunk, plan.slots());
    let kind = if plan.tokens.is_some() { "tiled_" } else { "" };
    let module = attention_module(element, kind)?;
    let func = dev.get_or_load_custom_func(&plan.kernel, module.0, module.1)?;
    raise_limit(&func, &plan.kernel, plan.shared_limit(), batch.size.longest)?;
    let cfg = LaunchConfig {
        grid_dim: plan.grid,
        block_dim: (plan.threads, 1, 1),
        shared_mem_bytes: plan.shared_bytes as u32,
    };
    // Split-K's chunk results: per (token, query head, slot), the unnormalized sums and the
    // maximum and sum of the slot's weights.
    let rows = batch.size.tokens * shape.n_head * slots;
    let mut parts = match slots {
        1 => None,
        // SAFETY: the launches write every slot's maximum and sum, and the sums of every slot
        // whose maximum is finite, the only ones the combine reads.
        _ => Some(unsafe {
            Split {
                acc: dev.alloc::<f32>(rows * shape.head_dim)?,
                ml: dev.alloc::<f32>(rows * 2)?,
            }
        }),
    };
    if let (Some(prefix), Some(split)) = (&plan.prefix, &mut parts) {
        launch_prefix(dev, prefix, element, q, &kv, batch, shape, slots, split)?;
    }
    // Where the output goes: this launch's blocks (no split), its last blocks (split-K with the
    // batch's counters: `split_combine`), or the combine's launch after it.
    let counters = batch.counters.as_ref().filter(|_| parts.is_some());
    if let Some(c) = counters {
        if c.len() < batch.size.tokens * shape.n_kv {
            candle_core::bail!(
                "paged attention: {} split-K counters for {} tokens of {} key-value heads",
                c.len(),
                batch.size.tokens,
                shape.n_kv
            );
        }
    }
    let mut out = Some(out);
    let mut direct = if parts.is_none() { out.take() } else { None };
    let mut last_block = if counters.is_some() { out.take() } else { None };
    let null = 0u64;
    {
        let mut b = func.builder();
        b.arg(q);
        match kv {
            KvPool::F32(k, v) => b.arg(k).arg(v),
            KvPool::F16(k, v) => b.arg(k).arg(v),
            KvPool::Bf16(k, v) => b.arg(k).arg(v),
        };
        let [token_seq, token_pos, token_shared, page_start, block_table] = batch.arrays();
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
        match (acc, &mut direct) {
            (Some(acc), _) => b.arg(acc),
            (None, Some(AttentionOut::F32(o))) => b.arg(&mut **o),
            (None, Some(AttentionOut::F16(o))) => b.arg(&mut **o),
            (None, None) => unreachable!("a launch without split-K writes the output"),
        };
        b.arg(&n_head)
            .arg(&n_kv)
            .arg(&head_dim)
            .arg(&page_size)
            .arg(&shape.scale)
            .arg(&window);
        // The split forms' last: the cascade's shared prefix per token and its slots before
        // this launch's chunks (0: `token_shared` is not read).
        let slot0 = plan.prefix_slots() as i32;
        if let Some(ml) = ml {
            b.arg(&chunk32).arg(ml).arg(&token_shared).arg(&slot0);
            // The last-block combine's counters and output (f32, or f16), or three nulls. The
            // kernel writes the counters through the batch's shared borrow: device memory that
            // is all zero again when the launch ends, as every launch on the stream expects.
            match (counters, &mut last_block) {
                (Some(c), Some(AttentionOut::F32(o))) => b.arg(c).arg(&mut **o).arg(&null),
                (Some(c), Some(AttentionOut::F16(o))) => b.arg(c).arg(&null).arg(&mut **o),
                _ => b.arg(&null).arg(&null).arg(&null),
            };
        }
        // The tiled form's last argument: the batch's tokens; every other form's, its `reads`
        // (the L2 prefetch's bits and the staged key reads': the per-dimension form ignores
        // them; the plan has sized the shared memory for the stage).
        let tokens32 = plan.tokens.unwrap_or(0) as i32;
        let reads = shape.reads();
        match plan.tokens {
            Some(_) => b.arg(&tokens32),
            None => b.arg(&reads),
        };
        // SAFETY: the arguments match the kernel's signature in kernels/paged_attention.cu, and
        // the buffers hold what the batch's metadata addresses (checked by the caller's pool
        // and plan).
        unsafe { b.launch(cfg) }.w()?;
    }
    match (&parts, out) {
        (Some(split), Some(out)) => combine(dev, module, &plan, shape, split, out),
        _ => Ok(()),
    }
}

/// The cascade's first launch: the shared prefix's share of its tokens' attention, into the
/// first `prefix.slots()` of the `slots` slots of `split` (kernel_plan's `PrefixPlan`).
#[allow(clippy::too_many_arguments)]
fn launch_prefix(
    dev: &CudaDevice,
    prefix: &PrefixPlan,
    element: &str,
    q: &CudaSlice<f32>,
    kv: &KvPool<'_>,
    batch: &DeviceBatch,
    shape: AttentionShape,
    slots: usize,
    split: &mut Split,
) -> Result<()> {
    let (module, ptx) = attention_module(element, "prefix_")?;
    let func = dev.get_or_load_custom_func(&prefix.kernel, module, ptx)?;
    raise_limit(
        &func,
        &prefix.kernel,
        prefix.shared_limit(),
        batch.size.longest,
    )?;
    let cfg = LaunchConfig {
        grid_dim: prefix.grid,
        block_dim: (prefix.threads, 1, 1),
        shared_mem_bytes: prefix.shared_bytes as u32,
    };
    let mut b = func.builder();
    b.arg(q);
    match kv {
        KvPool::F32(k, v) => b.arg(*k).arg(*v),
        KvPool::F16(k, v) => b.arg(*k).arg(*v),
        KvPool::Bf16(k, v) => b.arg(*k).arg(*v),
    };
    let [token_seq, _, token_shared, page_start, block_table] = batch.arrays();
    let ints = [
        batch.size.tokens,
        shape.n_head,
        shape.n_kv,
        shape.head_dim,
        batch.page_size,
    ]
    .map(|n| n as i32);
    let slots32 = slots as i32;
    b.arg(&token_seq)
        .arg(&token_shared)
        .arg(&page_start)
        .arg(&block_table)
        .arg(&mut split.acc)
        .arg(&mut split.ml);
    for n in &ints {
        b.arg(n);
    }
    b.arg(&shape.scale).arg(&slots32);
    // SAFETY: `paged_attention_prefix`'s signature in kernels/paged_attention.cu; `split` holds
    // `slots` slots of every (token, query head), of which the kernel writes the first
    // `prefix.slots()`.
    unsafe { b.launch(cfg) }.w()?;
    Ok(())
}

/// Raises `func`'s (`kernel`'s) dynamic shared memory limit to `limit`, where its launch needs
/// more than the default (`longest`: the batch's longest context, for the error).
fn raise_limit(
    func: &CudaFunction,
    kernel: &str,
    limit: Option<usize>,
    longest: usize,
) -> Result<()> {
    if let Some(limit) = limit {
        // Beyond the default dynamic shared memory (48 KiB less the kernel's static memory):
        // raise the kernel's limit (up to the device's 227 KiB per block on Hopper).
        use candle_core::cuda::cudarc::driver::sys::CUfunction_attribute;
        func.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            limit as i32,
        )
        .map_err(|e| {
            candle_core::Error::msg(format!(
                "paged attention: {kernel} could not have {limit} bytes of dynamic shared memory \
                 ({longest} positions of context): {e:?}"
            ))
        })?;
    }
    Ok(())
}

/// Split-K's second launch: `split`'s chunk results combined into `out`.
fn combine(
    dev: &CudaDevice,
    (module, ptx): (&str, &str),
    plan: &AttentionPlan,
    shape: AttentionShape,
    Split { acc, ml }: &Split,
    out: AttentionOut<'_>,
) -> Result<()> {
    let slots = plan.slots();
    let func = dev.get_or_load_custom_func(plan.combine_kernel(), module, ptx)?;
    let (blocks, threads) = plan.combine(shape);
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let (head_dim, slots32) = (shape.head_dim as i32, slots as i32);
    let mut b = func.builder();
    b.arg(acc).arg(ml);
    match out {
        AttentionOut::F32(o) => b.arg(o),
        AttentionOut::F16(o) => b.arg(o),
    };
    b.arg(&head_dim).arg(&slots32);
    // SAFETY: `paged_attention_combine`'s signature; `acc` and `ml` hold `slots` slots of every
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::testing::gpu;
    use crate::reference::{check_around_default_shared, relative_error, AttentionCase};

    #[test]
    fn paged_attention_matches_its_reference_on_a_mixed_batch() {
        paged_attention_matches_its_reference(AttentionKernel::PerDimension);
    }

    #[test]
    fn paged_attention_warps_matches_its_reference_on_a_mixed_batch() {
        paged_attention_matches_its_reference(AttentionKernel::Warps);
    }

    /// The tiled form: the mixed batch has whole tiles (a 120-token prefill, a 37-token one, an
    /// extension's 4 tokens), tiles across sequences and a last partial tile.
    #[test]
    fn paged_attention_tiled_matches_its_reference_on_a_mixed_batch() {
        paged_attention_matches_its_reference(AttentionKernel::Tiled);
    }

    /// The cascade: the mixed batch's sequences 1, 2 and 3 share 208 positions' pages
    /// (`reference::AttentionCase::mixed`); shapes with a window or heads of 80 run as `warps`.
    #[test]
    fn paged_attention_cascade_matches_its_reference_on_a_mixed_batch() {
        paged_attention_matches_its_reference(AttentionKernel::Cascade);
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
        let case = AttentionCase::long_context();
        let refused = decode_f32(&case, AttentionKernel::PerDimension).unwrap_err();
        assert!(refused.to_string().contains("shared memory"), "{refused}");
        let got = decode_f32(&case, AttentionKernel::Warps).unwrap();
        let err = relative_error(&got, &case.want);
        eprintln!("paged attention over 20,000 positions, split: relative error {err:.2e}");
        assert!(err < 1e-5, "relative error {err:.2e}");
    }

    /// Every form's static shared memory is what the plan counts against the driver's limits
    /// (`kernel_plan::STATIC_SHARED`): the PTX declares it, so this needs no GPU. Each pool
    /// type's one-token module holds 20 forms that declare it, and its tiled module 12 (their
    /// one-token path's).
    #[test]
    fn the_plan_counts_the_kernels_static_shared_memory() {
        let declared: Vec<usize> = ATTENTION_PTX
            .iter()
            .flat_map(|(_, ptx)| ptx.lines())
            .filter(|l| l.trim_start().starts_with(".shared") && l.contains("E3red["))
            .map(|l| {
                let size = l.rsplit('[').next().and_then(|r| r.split(']').next());
                size.and_then(|n| n.parse().ok()).expect(l)
            })
            .collect();
        assert!(
            declared.len() == 3 * (20 + 12),
            "{} forms' static shared memory declared in the PTX",
            declared.len()
        );
        let want = crate::kernel_plan::STATIC_SHARED;
        assert!(
            declared.iter().all(|&b| b == want),
            "{declared:?} against {want}"
        );
    }

    /// Shared memory on either side of the 48 KiB a kernel has without opting in
    /// (`reference::check_around_default_shared`).
    #[test]
    fn paged_attention_runs_on_either_side_of_the_default_shared_memory() {
        check_around_default_shared(|case| {
            decode_f32(case, AttentionKernel::Warps).map_err(|e| e.to_string())
        });
    }

    /// `case` through the kernel on an f32 pool, its output poisoned first.
    fn decode_f32(case: &AttentionCase, kernel: AttentionKernel) -> Result<Vec<f32>> {
        let dev = gpu();
        let shape = AttentionShape::from(case.heads);
        let db = DeviceBatch::upload(&dev, &case.meta, 0, None)?;
        let (dq, dk, dv) = (
            dev.clone_htod(&case.q)?,
            dev.clone_htod(&case.k)?,
            dev.clone_htod(&case.v)?,
        );
        let mut out = dev.clone_htod(&vec![f32::NAN; case.q.len()])?;
        paged_attention(
            &dev,
            &dq,
            KvPool::F32(&dk, &dv),
            &db,
            shape,
            kernel,
            AttentionOut::F32(&mut out),
        )?;
        dev.clone_dtoh(&out)
    }

    /// A mixed case on the device as the bit-for-bit tests launch it: its queries, its f16
    /// pool, its shape and window, and its batch uploaded without split-K's counters; and its
    /// launches' output bits.
    struct F16Case {
        dq: CudaSlice<f32>,
        dk: CudaSlice<half::f16>,
        dv: CudaSlice<half::f16>,
        shape: AttentionShape,
        window: usize,
        plain: DeviceBatch,
    }

    impl F16Case {
        fn new(dev: &CudaDevice, case: &AttentionCase) -> Self {
            let half = |x: &[f32]| {
                x.iter()
                    .map(|&y| half::f16::from_f32(y))
                    .collect::<Vec<_>>()
            };
            let window = case.heads.window.unwrap_or(0);
            Self {
                dq: dev.clone_htod(&case.q).unwrap(),
                dk: dev.clone_htod(&half(&case.k)).unwrap(),
                dv: dev.clone_htod(&half(&case.v)).unwrap(),
                shape: AttentionShape::from(case.heads),
                window,
                plain: DeviceBatch::upload(dev, &case.meta, window, None).unwrap(),
            }
        }

        /// The output's bits (f32, or f16 where `out16`), poisoned first.
        fn bits(
            &self,
            dev: &CudaDevice,
            db: &DeviceBatch,
            shape: AttentionShape,
            kernel: AttentionKernel,
            out16: bool,
        ) -> Vec<u32> {
            let (n, pool) = (self.dq.len(), KvPool::F16(&self.dk, &self.dv));
            if out16 {
                let mut out = dev.clone_htod(&vec![half::f16::NAN; n]).unwrap();
                let o = AttentionOut::F16(&mut out);
                paged_attention(dev, &self.dq, pool, db, shape, kernel, o).unwrap();
                let got = dev.clone_dtoh(&out).unwrap();
                got.iter().map(|x| x.to_bits() as u32).collect()
            } else {
                let mut out = dev.clone_htod(&vec![f32::NAN; n]).unwrap();
                let o = AttentionOut::F32(&mut out);
                paged_attention(dev, &self.dq, pool, db, shape, kernel, o).unwrap();
                let got = dev.clone_dtoh(&out).unwrap();
                got.iter().map(|x| x.to_bits()).collect()
            }
        }
    }

    /// Split-K with the combine in its last blocks (`split_combine`) against the combine's own
    /// launch, on the mixed cases, the f16 pool, both outputs, split and cascade: the same bits,
    /// twice in a row on the same counters (the combining blocks set them back to 0, which the
    /// second launch relies on and the read-back shows).
    #[test]
    fn the_last_block_combine_matches_the_combine_s_launch() {
        let dev = gpu();
        for case in AttentionCase::mixed(16) {
            let f16 = F16Case::new(&dev, &case);
            let (shape, plain) = (f16.shape, &f16.plain);
            let counted =
                DeviceBatch::upload(&dev, &case.meta, f16.window, Some(shape.n_kv)).unwrap();
            for kernel in [
                AttentionKernel::Split { chunk: None },
                AttentionKernel::Cascade,
            ] {
                for out16 in [false, true] {
                    let what = format!("{kernel:?}, f16 output {out16}, {shape:?}");
                    let want = f16.bits(&dev, plain, shape, kernel, out16);
                    let got = f16.bits(&dev, &counted, shape, kernel, out16);
                    assert_eq!(got, want, "{what}");
                    let again = f16.bits(&dev, &counted, shape, kernel, out16);
                    assert_eq!(again, want, "{what}, again");
                    let counters = counted.counters.as_ref().unwrap();
                    let left = dev.clone_dtoh(counters).unwrap();
                    assert!(left.iter().all(|&c| c == 0), "{what}: counters left");
                }
            }
        }
    }

    /// The L2 prefetch (`attention_prefetch`) changes where bytes wait, not what is read, and
    /// the staged key reads (`attention_keys`) how the key rows reach each thread, not the
    /// products: every combination gives the defaults' output bits, in the warps, split and
    /// cascade forms, on the mixed cases' f16 pool. (quarry-cuda-emu checks which lines each
    /// block asks for, and the staged reads' bits there.)
    #[test]
    fn the_prefetch_and_the_staged_keys_keep_the_output_bits() {
        let dev = gpu();
        for case in AttentionCase::mixed(16) {
            let f16 = F16Case::new(&dev, &case);
            let (shape, db) = (f16.shape, &f16.plain);
            for kernel in [
                AttentionKernel::Warps,
                AttentionKernel::Split { chunk: None },
                AttentionKernel::Cascade,
            ] {
                let want = f16.bits(&dev, db, shape, kernel, true);
                for prefetch in crate::Prefetch::ALL {
                    for keys in crate::KeyReads::ALL {
                        let asked = AttentionShape {
                            prefetch,
                            keys,
                            ..shape
                        };
                        let got = f16.bits(&dev, db, asked, kernel, true);
                        let what = format!("{kernel:?}, prefetch {prefetch:?}, keys {keys:?}");
                        assert_eq!(got, want, "{what}, {shape:?}");
                    }
                }
            }
        }
    }

    fn paged_attention_matches_its_reference(kernel: AttentionKernel) {
        let dev = gpu();
        // The cases quarry-cuda-emu runs too (reference::AttentionCase).
        for case in AttentionCase::mixed(16) {
            let AttentionCase {
                meta,
                heads: h,
                q,
                k,
                v,
                want,
            } = case;
            let (n_head, n_kv, head_dim) = (h.n_head, h.n_kv, h.head_dim);
            let window = h.window.unwrap_or(0);
            let shape = AttentionShape::from(h);
            let db = DeviceBatch::upload(&dev, &meta, window, None).unwrap();
            let dq = dev.clone_htod(&q).unwrap();
            let check = |pool: KvPool<'_>, shape: AttentionShape, what: &str, bound: f64| {
                // Poisoned: an unwritten output is NaN and fails.
                let mut out = dev.clone_htod(&vec![f32::NAN; q.len()]).unwrap();
                let o = AttentionOut::F32(&mut out);
                paged_attention(&dev, &dq, pool, &db, shape, kernel, o).unwrap();
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
            check(KvPool::F32(&dk, &dv), shape, "f32 pool", 1e-5);
            // The 16-bit pools hold rounded keys and values: bf16 keeps 8 bits of mantissa,
            // f16 11, so their errors sit near 2^-9 and 2^-12 of the values.
            let to =
                |x: &[f32], f: fn(f32) -> half::f16| x.iter().map(|&y| f(y)).collect::<Vec<_>>();
            let (hk, hv) = (to(&k, half::f16::from_f32), to(&v, half::f16::from_f32));
            let (dk, dv) = (dev.clone_htod(&hk).unwrap(), dev.clone_htod(&hv).unwrap());
            check(KvPool::F16(&dk, &dv), shape, "f16 pool", 2e-3);
            // The forms sized for groups of 8 too, which attention-bench compares.
            let widest = AttentionShape {
                widest_group_form: true,
                ..shape
            };
            let what = "f16 pool, the forms for groups of 8";
            check(KvPool::F16(&dk, &dv), widest, what, 2e-3);
            let bk: Vec<half::bf16> = k.iter().map(|&y| half::bf16::from_f32(y)).collect();
            let bv: Vec<half::bf16> = v.iter().map(|&y| half::bf16::from_f32(y)).collect();
            let (dk, dv) = (dev.clone_htod(&bk).unwrap(), dev.clone_htod(&bv).unwrap());
            check(KvPool::Bf16(&dk, &dv), shape, "bf16 pool", 1e-2);
        }
    }
}
