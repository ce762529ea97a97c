//! How the paged attention kernel (`kernels/paged_attention.cu`) is launched for a batch: which
//! of its compiled forms, how many blocks, threads and bytes of shared memory, and where split-K
//! cuts each token's context. Plain arithmetic, compiled on every target, so that the CPU's tests
//! and quarry-cuda-emu (the kernels run on the CPU) check the very plan the CUDA launcher in
//! `src/cuda/attention.rs` follows.

use crate::ragged::{Heads, RaggedBatch};

/// Threads per block of the per-dimension layout.
pub const PER_DIMENSION_THREADS: u32 = 128;
/// Threads per block of the `warps` and split layouts (the kernel's `WARPS` × 32).
pub const WARPS_THREADS: u32 = 256;
/// Query heads per key-value head one block serves (the kernel's `MAX_GROUP`).
pub const MAX_GROUP: usize = 8;
/// The group sizes the warps and split forms are compiled for (their `g4` and `g8`): a block
/// keeps accumulators for as many query heads as its form's bound, so a model's groups take the
/// smallest bound that holds them (ptxas: 80 registers a thread for heads of 128 in f16 with the
/// bound 4, 121 with 8, so three blocks of 256 threads an SM where there were two).
pub const GROUP_FORMS: [usize; 2] = [4, MAX_GROUP];
/// The attention kernel's static shared memory (its `red`: a float per query head of
/// [`MAX_GROUP`] and warp of 8, for the group's reductions together), which counts against both
/// limits below: the driver's limits are on a block's static and dynamic shared memory together.
pub const STATIC_SHARED: usize = 8 * MAX_GROUP * 4;
/// Dynamic shared memory a block may have on Hopper once the kernel opts in (227 KiB in all).
pub const MAX_SHARED: usize = 227 * 1024 - STATIC_SHARED;
/// Dynamic shared memory a block may have without opting in (48 KiB in all): the launcher raises
/// the kernel's limit above it. (On 2026-11-27 an H100 refused 49,056 bytes beside the static
/// 128, from a launcher that raised the limit only above 48 KiB.)
pub const DEFAULT_SHARED: usize = 48 * 1024 - STATIC_SHARED;
/// Split-K's choice of chunk (`AttentionKernel::Split { chunk: None }`): about this many blocks
/// per SM in a launch, and no chunk under `MIN_CHUNK` positions (4 per warp).
const SPLIT_BLOCKS_PER_SM: usize = 4;
const MIN_CHUNK: usize = 32;

/// The layouts of `kernels/paged_attention.cu`, the same arithmetic: `ModelOptions::attention` is
/// `warps`, `split` or `per-dimension` (`auto`, the default, picks by the step's size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKernel {
    /// 128 threads; in the weighted sum, a thread per dimension walks every position (a chain of
    /// dependent loads: 303 µs a layer at batch 1 and 800 positions on an H100, 2026-11-26).
    PerDimension,
    /// 256 threads; the scores a thread per position (16-byte loads of its key row), the
    /// weighted sum a lane per 16-byte piece of a value row, a warp over a few positions, the
    /// rows they read gathered first (the kernel's comments). With a warp per position in both
    /// phases it took 123 µs in that case, 1.7-2.5x faster than `PerDimension` from batch 1 to
    /// 512; the 16-byte loads (newer, written without a GPU, tested by quarry-cuda-emu) are not
    /// yet measured.
    /// A block per (token, key-value head), except for a context too long for one block's shared
    /// memory, which it splits as [`AttentionKernel::Split`] does.
    Warps,
    /// The warps layout split over the positions too (split-K, flash-decoding): a block per
    /// (token, key-value head, `chunk` positions), then a launch that combines the chunks
    /// (`ragged::attend_split_reference`'s arithmetic). `chunk: None` chooses it per launch, so that a
    /// step has about four blocks per SM (a decode step at batch 1 is 3 blocks unsplit); with few
    /// enough blocks to split at all, it runs as `Warps`. `ModelOptions::attention_chunk` sets it.
    Split { chunk: Option<usize> },
    /// The warps layout where a step's tokens of one sequence (a prefill's or an extension's)
    /// share their key reads: tokens in tiles of [`TILE`] by batch index, a tile of one
    /// sequence's consecutive positions computed by one block, every other token as `Warps`
    /// computes it (the kernel's comments). Where the tile's shared memory would pass the
    /// limit, it runs as `Warps`. Every block holds a tile's shared memory and 128 registers a
    /// thread, so the tokens it computes alone (decode rows) run two blocks an SM where `Warps`
    /// runs three: a step of decodes only is `Warps`'s to run. Written 2026-11-28 without a GPU
    /// (quarry-cuda-emu checks it); `ModelOptions::attention = tiled` asks for it.
    Tiled,
    /// The shared prefix's positions once for all its tokens, then each token's own (cascade
    /// attention): where the batch's sequences begin with the same pages
    /// ([`RaggedBatch::token_shared`]), a first launch (the kernel's `prefix` forms, a block per
    /// [`PREFIX_ROWS`] tokens) reads the prefix's rows once for those tokens and writes its
    /// share in split-K's form; the split layout then computes each token's positions past the
    /// prefix (every position for a token outside it) into the slots after, and the combine adds
    /// them. Layers with a sliding window, and heads whose rows do not split into 8 pieces of 16
    /// bytes per lane, run as `Warps`. Written 2026-11-29 without a GPU (quarry-cuda-emu checks
    /// it); `ModelOptions::attention = cascade` asks for it.
    Cascade,
}

/// Tokens one block of the cascade's prefix launch serves (the kernel's `PREFIX_ROWS`).
pub const PREFIX_ROWS: usize = 8;
/// Positions of the prefix a block holds in shared memory at a time (the kernel's
/// `PREFIX_CHUNK`).
pub const PREFIX_CHUNK: usize = 64;
/// The prefix launch's slots (its grid's third dimension, each a run of the prefix's chunks) are
/// chosen for about this many blocks per SM (its `g4` forms take 78-96 registers a thread and
/// under 64 KiB for heads of up to 128: three blocks an SM), at most [`MAX_PREFIX_SLOTS`]: each
/// slot is a row of sums per token and query head that the combine reads.
const PREFIX_BLOCKS_PER_SM: usize = 3;
const MAX_PREFIX_SLOTS: usize = 8;

/// Tokens a tiled block serves (the kernel's `TILE`).
pub const TILE: usize = 4;

/// The attention's shape: heads, grouped-query KV heads, and Gemma's sliding window (0: none).
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub n_head: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub window: usize,
    /// Run the warps and split forms compiled for groups of up to [`MAX_GROUP`] even where a
    /// narrower one holds the groups ([`GROUP_FORMS`]): the same arithmetic, more registers
    /// (attention-bench times both). `false` in the forward pass.
    pub widest_group_form: bool,
    /// What the warps and split forms ask L2 for as they find their rows
    /// (`ModelOptions::attention_prefetch`).
    pub prefetch: Prefetch,
    /// How the warps and split forms' scores read their key rows
    /// (`ModelOptions::attention_keys`).
    pub keys: KeyReads,
}

impl AttentionShape {
    /// The one-token forms' last argument, `reads`: the L2 prefetch's bits and the key reads'.
    pub fn reads(&self) -> i32 {
        self.prefetch.bits() | self.keys.bits()
    }
}

/// How the warps and split forms' scores read their key rows (the kernel's `STAGE_KEYS` bit of
/// `reads`). Either way a thread computes each of its positions' scores with the same products
/// in the same order, so the output is the same bits; only the loads differ, which only a GPU
/// can time (attention-bench).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyReads {
    /// Each thread loads its own position's key row, 16 bytes at a time: a warp's load touches
    /// 32 rows, so 32 cache lines (the default until a GPU has timed the other).
    #[default]
    Direct,
    /// The block loads a tile of 256 positions' rows into shared memory, 128 bytes of a row at a
    /// time, consecutive threads taking consecutive 16-byte pieces of a row (a warp's load
    /// touches 4 lines); each thread then reads its position's pieces from there. About 36 KiB
    /// more shared memory a block ([`STAGE_WORDS`], less what the partial sums already take),
    /// two barriers per 128 bytes of a row.
    Staged,
}

impl KeyReads {
    /// Every choice, in the order attention-bench times them.
    pub const ALL: [KeyReads; 2] = [Self::Direct, Self::Staged];

    /// The kernel's bit (`STAGE_KEYS`, 4).
    pub fn bits(self) -> i32 {
        match self {
            Self::Direct => 0,
            Self::Staged => 4,
        }
    }

    /// Its name in `ModelOptions` (`attention_keys`, serde's).
    pub fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Staged => "staged",
        }
    }
}

/// Pieces of 16 bytes a staged key row takes in shared memory: a round's 8 (the kernel's
/// `KEY_BATCH`) and one of padding, so that the 8 rows 8 threads read at once fall in different
/// banks (the kernel's `KEY_STAGE_STRIDE`).
const STAGE_ROW_PIECES: usize = 9;
/// Shared memory words the staged key reads take: a tile of [`WARPS_THREADS`] rows of
/// [`STAGE_ROW_PIECES`] pieces, and 3 words to start it on 16 bytes.
pub const STAGE_WORDS: usize = WARPS_THREADS as usize * STAGE_ROW_PIECES * 4 + 3;

/// The L2 prefetch of the warps and split forms (their `prefetch` argument, a bit mask): as a
/// block's threads find the pool rows of its attended positions, they ask L2 for those rows'
/// value bytes, key bytes or both, a 128-byte line at a time, without waiting. The loads are
/// the same, so the output is the same bits; where the bytes wait changes, which only a GPU can
/// time (attention-bench). The per-dimension, tiled and cascade-prefix forms ask for nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Prefetch {
    /// Nothing (the default until a GPU has timed the others).
    #[default]
    Off,
    /// The value rows, which the block otherwise requests only after its softmax.
    Values,
    /// The key rows, which the block otherwise requests 128 bytes a thread at a time.
    Keys,
    /// Both.
    Both,
}

impl Prefetch {
    /// Every choice, in the order attention-bench times them.
    pub const ALL: [Prefetch; 4] = [Self::Off, Self::Values, Self::Keys, Self::Both];

    /// The kernel's bits (`PREFETCH_VALUES` 1, `PREFETCH_KEYS` 2).
    pub fn bits(self) -> i32 {
        match self {
            Self::Off => 0,
            Self::Values => 1,
            Self::Keys => 2,
            Self::Both => 3,
        }
    }

    /// Its name in `ModelOptions` (`attention_prefetch`, serde's).
    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Values => "values",
            Self::Keys => "keys",
            Self::Both => "both",
        }
    }
}

impl From<Heads> for AttentionShape {
    fn from(h: Heads) -> Self {
        Self {
            n_head: h.n_head,
            n_kv: h.n_kv,
            head_dim: h.head_dim,
            scale: h.scale,
            window: h.window.unwrap_or(0),
            widest_group_form: false,
            prefetch: Prefetch::Off,
            keys: KeyReads::Direct,
        }
    }
}

/// What one launch needs to know about its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSize {
    /// New tokens (the grid's first dimension).
    pub tokens: usize,
    /// The most positions one new token attends to (its shared-memory need).
    pub longest: usize,
    /// The device's streaming multiprocessors (split-K's choice of chunk).
    pub sms: usize,
}

impl BatchSize {
    pub fn new(meta: &RaggedBatch, window: usize, sms: usize) -> Self {
        let longest = meta
            .token_pos
            .iter()
            .map(|&p| match window {
                0 => p as usize + 1,
                w => (p as usize + 1).min(w),
            })
            .max()
            .unwrap_or(0);
        Self {
            tokens: meta.tokens(),
            longest,
            sms: sms.max(1),
        }
    }
}

/// Why the paged attention kernel cannot run a batch in the layout asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    #[error("paged attention: heads of {head_dim} dimensions (256 at most)")]
    HeadDim { head_dim: usize },
    #[error(
        "paged attention: {n_head} query heads on {n_kv} key-value heads (groups of at most \
         {MAX_GROUP})"
    )]
    Groups { n_head: usize, n_kv: usize },
    #[error(
        "paged attention: {positions} positions of context need {bytes} bytes of shared memory, \
         over {MAX_SHARED}; the runtime option attention = warps (or split) runs such contexts"
    )]
    SharedMemory { positions: usize, bytes: usize },
    #[error("paged attention: {chunks} chunks of context (65,535 at most)")]
    Chunks { chunks: usize },
}

/// One layer's attention launch: the kernel's name, its grid, threads and shared memory, and for
/// split-K the chunk and the combine's launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttentionPlan {
    /// The compiled form, e.g. `paged_attention_warps2g4_f16`.
    pub kernel: String,
    pub grid: (u32, u32, u32),
    pub threads: u32,
    pub shared_bytes: usize,
    /// Positions per chunk when the launch is split (`grid.2` chunks), else `None`.
    pub chunk: Option<usize>,
    /// Whether the output is f16 (the `_out16` forms, and the combine's).
    pub out16: bool,
    /// The tiled form's last argument, the batch's tokens (`None`: another form).
    pub tokens: Option<usize>,
    /// The cascade's first launch, whose slots come before this launch's chunks (`None`:
    /// another form).
    pub prefix: Option<PrefixPlan>,
}

/// The cascade's prefix launch (`paged_attention_prefix*`): a block per ([`PREFIX_ROWS`] tokens,
/// key-value head, slot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixPlan {
    pub kernel: String,
    pub grid: (u32, u32, u32),
    pub threads: u32,
    pub shared_bytes: usize,
}

impl PrefixPlan {
    /// The dynamic shared memory limit the launcher must set first, where the default is too
    /// small.
    pub fn shared_limit(&self) -> Option<usize> {
        (self.shared_bytes > DEFAULT_SHARED).then_some(self.shared_bytes)
    }

    /// Its slots: the split layout's chunks come after them.
    pub fn slots(&self) -> usize {
        self.grid.2 as usize
    }
}

impl AttentionPlan {
    /// The plan for `batch` in `kernel`'s layout over a pool of `element` (`f32`, `f16` or
    /// `bf16`), writing f16 when `out16` (else f32), or why the kernel cannot run it.
    pub fn new(
        batch: BatchSize,
        shape: AttentionShape,
        kernel: AttentionKernel,
        element: &str,
        out16: bool,
    ) -> Result<Self, PlanError> {
        if shape.head_dim > 256 {
            return Err(PlanError::HeadDim {
                head_dim: shape.head_dim,
            });
        }
        if shape.n_kv == 0
            || !shape.n_head.is_multiple_of(shape.n_kv)
            || shape.n_head / shape.n_kv > MAX_GROUP
        {
            return Err(PlanError::Groups {
                n_head: shape.n_head,
                n_kv: shape.n_kv,
            });
        }
        let group = shape.n_head / shape.n_kv;
        if kernel == AttentionKernel::Cascade {
            return Self::cascade(batch, shape, element, out16);
        }
        if kernel == AttentionKernel::Tiled {
            let words = tiled_shared_words(group, shape.head_dim, batch.longest, shape);
            if words * 4 <= MAX_SHARED {
                let suffix = if out16 { "_out16" } else { "" };
                return Ok(Self {
                    kernel: format!(
                        "paged_attention_tiled{}g{}_{element}{suffix}",
                        dims_per_lane(shape),
                        group_form(shape)
                    ),
                    grid: (batch.tokens as u32, shape.n_kv as u32, 1),
                    threads: WARPS_THREADS,
                    shared_bytes: words * 4,
                    chunk: None,
                    out16,
                    tokens: Some(batch.tokens),
                    prefix: None,
                });
            }
            return Self::new(batch, shape, AttentionKernel::Warps, element, out16);
        }
        let chunk = split_chunk(batch, shape, kernel);
        let splits = chunk.map_or(1, |c| batch.longest.div_ceil(c));
        // Shared memory: the group's queries and scores, and for the `warps` layout the rows it
        // reads and its warps' partial sums (the kernel's comments).
        // The one-launch forms write the output, the split ones f32 sums for the combine.
        let suffix = if out16 && splits == 1 { "_out16" } else { "" };
        let (kernel, threads, shared_bytes) = match kernel {
            AttentionKernel::PerDimension => (
                format!("paged_attention_{element}{suffix}"),
                PER_DIMENSION_THREADS,
                group * (batch.longest + shape.head_dim) * 4,
            ),
            AttentionKernel::Warps
            | AttentionKernel::Split { .. }
            | AttentionKernel::Tiled
            | AttentionKernel::Cascade => {
                let layout = if splits > 1 { "split" } else { "warps" };
                let positions = chunk.unwrap_or(batch.longest).min(batch.longest);
                (
                    format!(
                        "paged_attention_{layout}{}g{}_{element}{suffix}",
                        dims_per_lane(shape),
                        group_form(shape)
                    ),
                    WARPS_THREADS,
                    warps_shared_words(shape, positions) * 4,
                )
            }
        };
        if shared_bytes > MAX_SHARED {
            return Err(PlanError::SharedMemory {
                positions: batch.longest,
                bytes: shared_bytes,
            });
        }
        if splits > 65_535 {
            return Err(PlanError::Chunks { chunks: splits });
        }
        Ok(Self {
            kernel,
            grid: (batch.tokens as u32, shape.n_kv as u32, splits as u32),
            threads,
            shared_bytes,
            chunk,
            out16,
            tokens: None,
            prefix: None,
        })
    }

    /// The cascade's two launches and the combine (see [`AttentionKernel::Cascade`]), or the
    /// warps layout where the shape or the shared memory rules it out. The split launch takes
    /// the whole of a token's context in one chunk unless one block's shared memory cannot hold
    /// it, so each token has its prefix slots and (mostly) one of its own.
    fn cascade(
        batch: BatchSize,
        shape: AttentionShape,
        element: &str,
        out16: bool,
    ) -> Result<Self, PlanError> {
        let element_size = if element == "f32" { 4 } else { 2 };
        let pieces = 16 / element_size;
        let prefix_bytes = prefix_shared_words(shape, element_size) * 4;
        if shape.window > 0
            || !shape.head_dim.is_multiple_of(8 * pieces)
            || prefix_bytes > MAX_SHARED
            || batch.longest == 0
        {
            return Self::new(batch, shape, AttentionKernel::Warps, element, out16);
        }
        let chunk = split_chunk(batch, shape, AttentionKernel::Warps).unwrap_or(batch.longest);
        let splits = batch.longest.div_ceil(chunk);
        if splits > 65_535 {
            return Err(PlanError::Chunks { chunks: splits });
        }
        let blocks = batch.tokens.div_ceil(PREFIX_ROWS) * shape.n_kv;
        let slots = (PREFIX_BLOCKS_PER_SM * batch.sms)
            .div_ceil(blocks.max(1))
            .clamp(1, MAX_PREFIX_SLOTS);
        let form = format!("{}g{}_{element}", dims_per_lane(shape), group_form(shape));
        Ok(Self {
            kernel: format!("paged_attention_split{form}"),
            grid: (batch.tokens as u32, shape.n_kv as u32, splits as u32),
            threads: WARPS_THREADS,
            shared_bytes: warps_shared_words(shape, chunk) * 4,
            chunk: Some(chunk),
            out16,
            tokens: None,
            prefix: Some(PrefixPlan {
                kernel: format!("paged_attention_prefix{form}"),
                grid: (
                    batch.tokens.div_ceil(PREFIX_ROWS) as u32,
                    shape.n_kv as u32,
                    slots as u32,
                ),
                threads: WARPS_THREADS,
                shared_bytes: prefix_bytes,
            }),
        })
    }

    /// The dynamic shared memory limit the launcher must set on the kernel
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`) before the launch, where the default
    /// is too small.
    pub fn shared_limit(&self) -> Option<usize> {
        (self.shared_bytes > DEFAULT_SHARED).then_some(self.shared_bytes)
    }

    /// Chunks per token (1 unsplit): this launch's.
    pub fn splits(&self) -> usize {
        self.grid.2 as usize
    }

    /// The cascade's prefix slots, which come before this launch's chunks (0: another form).
    pub fn prefix_slots(&self) -> usize {
        self.prefix.as_ref().map_or(0, PrefixPlan::slots)
    }

    /// Slots per (token, query head) the combine adds: the prefix's and the chunks.
    pub fn slots(&self) -> usize {
        self.prefix_slots() + self.splits()
    }

    /// The combine's form (split launches): f32 or f16 output.
    pub fn combine_kernel(&self) -> &'static str {
        if self.out16 {
            "paged_attention_combine_out16"
        } else {
            "paged_attention_combine"
        }
    }

    /// `paged_attention_combine`'s grid (a block per token and query head) and threads (the
    /// head's dimensions, rounded up to warps).
    pub fn combine(&self, shape: AttentionShape) -> (u32, u32) {
        (
            self.grid.0 * shape.n_head as u32,
            shape.head_dim.div_ceil(32) as u32 * 32,
        )
    }
}

/// The warps layout's dimensions per lane (its template's DPL): heads of up to 64, 128 or 256.
fn dims_per_lane(shape: AttentionShape) -> usize {
    match shape.head_dim.div_ceil(32) {
        0..=2 => 2,
        3..=4 => 4,
        _ => 8,
    }
}

/// The group bound of the warps and split forms a shape runs (their template's G): the smallest
/// of [`GROUP_FORMS`] that holds its groups, unless it asks for the widest.
fn group_form(shape: AttentionShape) -> usize {
    let group = shape.n_head / shape.n_kv;
    match shape.widest_group_form {
        true => MAX_GROUP,
        false => GROUP_FORMS
            .into_iter()
            .find(|&g| g >= group)
            .unwrap_or(MAX_GROUP),
    }
}

/// Shared memory words of one warps-layout block attending to `positions` positions: the group's
/// queries and scores, the pool rows, then the warps' partial sums or, where the scores stage
/// their key rows ([`KeyReads::Staged`]), the stage, whichever is larger (the two take turns).
fn warps_shared_words(shape: AttentionShape, positions: usize) -> usize {
    let (group, head_dim) = (shape.n_head / shape.n_kv, shape.head_dim);
    let warps = WARPS_THREADS as usize / 32;
    let partial = warps * group * head_dim;
    let after = match shape.keys {
        KeyReads::Direct => partial,
        KeyReads::Staged => partial.max(STAGE_WORDS),
    };
    group * (head_dim + positions) + positions + after
}

/// Shared memory words of a cascade prefix block (the kernel's layout): the query rows of
/// [`PREFIX_ROWS`] tokens at the form's group bound, `head_dim + 4` floats each; the key and
/// value chunks, `head_dim` values and 16 bytes a position; the weights, 72 floats a query row;
/// each row's maximum, sum and rescaling.
fn prefix_shared_words(shape: AttentionShape, element_size: usize) -> usize {
    let rows = PREFIX_ROWS * group_form(shape);
    let kv_row_words = (shape.head_dim * element_size + 16) / 4;
    rows * (shape.head_dim + 4) + 2 * PREFIX_CHUNK * kv_row_words + rows * 72 + 3 * rows
}

/// Shared memory words of a tiled block: the warps layout's for the longest context (the tokens
/// it computes alone), or a tile's, whichever is larger: its [`TILE`] tokens' queries and scores
/// over the union of their ranges (up to `longest + TILE - 1` positions), the rows, the warps'
/// partial sums and the reductions' room (8 warps by `TILE` times the form's group bound).
fn tiled_shared_words(
    group: usize,
    head_dim: usize,
    longest: usize,
    shape: AttentionShape,
) -> usize {
    let warps = WARPS_THREADS as usize / 32;
    let n = longest + TILE - 1;
    let tile =
        TILE * group * (head_dim + n) + n + warps * group * head_dim + 8 * TILE * group_form(shape);
    // The tokens it computes alone run the warps layout without staging (the tiled kernel
    // passes no `reads`).
    let alone = AttentionShape {
        keys: KeyReads::Direct,
        ..shape
    };
    tile.max(warps_shared_words(alone, longest))
}

/// The positions per chunk a launch splits each token's context into, or `None` for one block
/// per (token, key-value head). `Warps` splits only a context too long for one block's shared
/// memory; `Split` takes its chunk, or chooses one that gives the launch about
/// `SPLIT_BLOCKS_PER_SM` blocks per SM (never under `MIN_CHUNK` positions); both stay within
/// shared memory. A chunk that covers the longest context is `None`.
fn split_chunk(batch: BatchSize, shape: AttentionShape, kernel: AttentionKernel) -> Option<usize> {
    let group = shape.n_head / shape.n_kv;
    let fixed = warps_shared_words(shape, 0);
    let most = (MAX_SHARED / 4).saturating_sub(fixed) / (group + 1);
    let chunk = match kernel {
        AttentionKernel::PerDimension => return None,
        AttentionKernel::Warps | AttentionKernel::Tiled | AttentionKernel::Cascade => most,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm2() -> AttentionShape {
        AttentionShape {
            n_head: 9,
            n_kv: 3,
            head_dim: 64,
            scale: 0.125,
            window: 0,
            widest_group_form: false,
            prefetch: Prefetch::Off,
            keys: KeyReads::Direct,
        }
    }

    fn batch(tokens: usize, longest: usize) -> BatchSize {
        BatchSize {
            tokens,
            longest,
            sms: 132,
        }
    }

    /// A decode step at batch 1 and 800 positions is 3 blocks unsplit; split-K would want about
    /// 4 blocks per SM (176 chunks of 5 positions) but takes no chunk under 32 positions: 25
    /// chunks, 75 blocks. At 8,000 positions the chunk grows to keep about 4 blocks per SM.
    #[test]
    fn split_k_fills_the_device_at_small_batches() {
        let auto = AttentionKernel::Split { chunk: None };
        let p = AttentionPlan::new(batch(1, 800), smollm2(), auto, "f16", false).unwrap();
        assert_eq!(p.kernel, "paged_attention_split2g4_f16");
        assert_eq!((p.chunk, p.grid), (Some(32), (1, 3, 25)));
        let p = AttentionPlan::new(batch(1, 8_000), smollm2(), auto, "f16", false).unwrap();
        assert_eq!((p.chunk, p.grid), (Some(46), (1, 3, 174)));
        // At batch 512 there are blocks enough: no split, the warps layout.
        let p = AttentionPlan::new(batch(512, 800), smollm2(), auto, "f16", false).unwrap();
        assert_eq!(
            (p.kernel.as_str(), p.chunk),
            ("paged_attention_warps2g4_f16", None)
        );
        // An f16 output: the one-launch form writes it; a split launch's combine does.
        let p = AttentionPlan::new(batch(512, 800), smollm2(), auto, "f16", true).unwrap();
        assert_eq!(p.kernel, "paged_attention_warps2g4_f16_out16");
        let p = AttentionPlan::new(batch(1, 800), smollm2(), auto, "f16", true).unwrap();
        assert_eq!(
            (p.kernel.as_str(), p.combine_kernel()),
            (
                "paged_attention_split2g4_f16",
                "paged_attention_combine_out16"
            )
        );
        // A fixed chunk is taken as given.
        let fixed = AttentionKernel::Split { chunk: Some(100) };
        let p = AttentionPlan::new(batch(4, 450), smollm2(), fixed, "bf16", false).unwrap();
        assert_eq!((p.chunk, p.grid), (Some(100), (4, 3, 5)));
        assert_eq!(p.combine(smollm2()), (36, 64));
    }

    /// Groups of up to 4 run the forms sized for 4, larger ones those sized for 8; a shape may
    /// ask for the widest (attention-bench's comparison).
    #[test]
    fn groups_take_the_narrowest_form_that_holds_them() {
        let form = |n_head, n_kv, widest_group_form| {
            let shape = AttentionShape {
                n_head,
                n_kv,
                head_dim: 128,
                widest_group_form,
                ..smollm2()
            };
            AttentionPlan::new(batch(256, 800), shape, AttentionKernel::Warps, "f16", true)
                .unwrap()
                .kernel
        };
        assert_eq!(form(32, 8, false), "paged_attention_warps4g4_f16_out16");
        assert_eq!(form(32, 8, true), "paged_attention_warps4g8_f16_out16");
        assert_eq!(form(8, 8, false), "paged_attention_warps4g4_f16_out16");
        assert_eq!(form(28, 4, false), "paged_attention_warps4g8_f16_out16");
        assert_eq!(form(40, 8, false), "paged_attention_warps4g8_f16_out16");
    }

    /// The tiled form: a block per token like the warps layout, the batch's tokens as its last
    /// argument, room for a tile's scores; a context whose tile passes the shared memory limit
    /// runs as the warps layout.
    #[test]
    fn tiled_plans_room_for_a_tile_or_runs_as_warps() {
        let p = AttentionPlan::new(
            batch(512, 800),
            smollm2(),
            AttentionKernel::Tiled,
            "f16",
            true,
        )
        .unwrap();
        assert_eq!(p.kernel, "paged_attention_tiled2g4_f16_out16");
        assert_eq!((p.grid, p.tokens, p.chunk), ((512, 3, 1), Some(512), None));
        let words = TILE * 3 * (64 + 803) + 803 + 8 * 3 * 64 + 8 * TILE * 4;
        assert_eq!(p.shared_bytes, words * 4);
        let long = AttentionPlan::new(
            batch(1, 20_000),
            smollm2(),
            AttentionKernel::Tiled,
            "f16",
            true,
        )
        .unwrap();
        assert!(
            long.kernel.starts_with("paged_attention_split2g4"),
            "{long:?}"
        );
        assert_eq!(long.tokens, None);
    }

    /// The cascade: a prefix launch of a block per 8 tokens and key-value head, its slots chosen
    /// for about three blocks an SM (at most 8), then the split forms with one chunk per token
    /// (several past one block's shared memory), the combine over both; a window, heads that do
    /// not split into 8 pieces of 16 bytes per lane, or a prefix block past the shared memory
    /// limit run as the warps layout.
    #[test]
    fn cascade_plans_the_prefix_slots_before_each_tokens_own() {
        let llama8b = AttentionShape {
            n_head: 32,
            n_kv: 8,
            head_dim: 128,
            ..smollm2()
        };
        let cascade = AttentionKernel::Cascade;
        let p = AttentionPlan::new(batch(256, 800), llama8b, cascade, "f16", true).unwrap();
        assert_eq!(p.kernel, "paged_attention_split4g4_f16");
        assert_eq!((p.grid, p.chunk), ((256, 8, 1), Some(800)));
        assert_eq!(p.combine_kernel(), "paged_attention_combine_out16");
        let prefix = p.prefix.clone().unwrap();
        assert_eq!(prefix.kernel, "paged_attention_prefix4g4_f16");
        // 32 × 8 blocks a slot: two slots for 396 blocks (3 an SM on 132).
        assert_eq!(prefix.grid, (32, 8, 2));
        assert_eq!((p.prefix_slots(), p.slots()), (2, 3));
        // 32 query rows of 132 floats, two chunks of 64 rows of 272 bytes, 32 rows of 72
        // weights and 3 statistics.
        let words = 32 * 132 + 2 * 64 * 68 + 32 * 72 + 3 * 32;
        assert_eq!(prefix.shared_bytes, words * 4);
        assert_eq!(prefix.shared_limit(), Some(words * 4));
        // Batch 1: the slots' cap.
        let p = AttentionPlan::new(batch(1, 800), llama8b, cascade, "f16", true).unwrap();
        assert_eq!(p.prefix.unwrap().grid, (1, 8, 8));
        // A context past one block's shared memory: split into chunks after the prefix's slots.
        let p = AttentionPlan::new(batch(4, 40_000), llama8b, cascade, "f32", false).unwrap();
        assert!(p.splits() > 1 && p.shared_bytes <= MAX_SHARED, "{p:?}");
        assert_eq!(p.slots(), p.prefix_slots() + p.splits());
        // What runs as warps.
        let warps = |shape, element| {
            let p = AttentionPlan::new(batch(256, 800), shape, cascade, element, true).unwrap();
            assert!(p.prefix.is_none(), "{p:?}");
            p.kernel
        };
        let windowed = AttentionShape {
            window: 512,
            ..llama8b
        };
        assert_eq!(warps(windowed, "f16"), "paged_attention_warps4g4_f16_out16");
        let head80 = AttentionShape {
            head_dim: 80,
            ..llama8b
        };
        assert_eq!(warps(head80, "f32"), "paged_attention_warps4g4_f32_out16");
        // Heads of 64 in f32 split into 8 pieces a lane of 2; Qwen's groups of 7 take the g8
        // forms, whose largest block (f32 heads of 256) still fits: 218,880 bytes.
        let qwen = AttentionShape {
            n_head: 14,
            n_kv: 2,
            head_dim: 64,
            ..smollm2()
        };
        let p = AttentionPlan::new(batch(256, 800), qwen, cascade, "f32", false).unwrap();
        assert_eq!(p.prefix.unwrap().kernel, "paged_attention_prefix2g8_f32");
        let wide = AttentionShape {
            head_dim: 256,
            ..qwen
        };
        let p = AttentionPlan::new(batch(256, 800), wide, cascade, "f32", false).unwrap();
        let prefix = p.prefix.unwrap();
        assert_eq!(prefix.kernel, "paged_attention_prefix8g8_f32");
        assert!(prefix.shared_bytes == 218_880 && prefix.shared_bytes <= MAX_SHARED);
    }

    /// Staged key reads make room for their tile where the warps' partial sums do not already
    /// (the two take turns), in the warps and split launches and the cascade's split launch, not
    /// in the per-dimension form or the tiled one (which stages nothing); a context that then
    /// passes one block's shared memory splits sooner.
    #[test]
    fn staged_key_reads_make_room_for_their_tile() {
        let staged = |shape: AttentionShape| AttentionShape {
            keys: KeyReads::Staged,
            ..shape
        };
        let llama = AttentionShape {
            n_head: 32,
            n_kv: 8,
            head_dim: 128,
            ..smollm2()
        };
        let gemma = AttentionShape {
            n_head: 4,
            n_kv: 1,
            head_dim: 256,
            ..smollm2()
        };
        for shape in [smollm2(), llama, gemma] {
            let group = shape.n_head / shape.n_kv;
            let partial = 8 * group * shape.head_dim;
            for kernel in [
                AttentionKernel::Warps,
                AttentionKernel::Split { chunk: Some(64) },
                AttentionKernel::Cascade,
            ] {
                let plan = |s| AttentionPlan::new(batch(256, 800), s, kernel, "f16", true).unwrap();
                let (direct, with) = (plan(shape), plan(staged(shape)));
                assert_eq!(direct.kernel, with.kernel);
                let more = with.shared_bytes - direct.shared_bytes;
                assert_eq!(
                    more,
                    (STAGE_WORDS - partial.min(STAGE_WORDS)) * 4,
                    "{kernel:?}"
                );
            }
            for kernel in [AttentionKernel::PerDimension, AttentionKernel::Tiled] {
                let plan = |s| AttentionPlan::new(batch(256, 800), s, kernel, "f16", true).unwrap();
                assert_eq!(plan(shape).shared_bytes, plan(staged(shape)).shared_bytes);
            }
        }
        // SmolLM2's groups of 3 at 13,000 positions: one block direct, split when staged.
        let warps =
            |s| AttentionPlan::new(batch(1, 13_000), s, AttentionKernel::Warps, "f16", false);
        let (direct, with) = (warps(smollm2()).unwrap(), warps(staged(smollm2())).unwrap());
        assert_eq!(direct.chunk, None);
        assert!(
            with.chunk.is_some() && with.shared_bytes <= MAX_SHARED,
            "{with:?}"
        );
    }

    /// The warps layout splits only a context beyond one block's shared memory; the
    /// per-dimension layout refuses it, naming the way out; heads and groups past the kernel's
    /// limits are refused.
    #[test]
    fn contexts_beyond_shared_memory_split_or_are_refused() {
        let qwen = AttentionShape {
            n_head: 14,
            n_kv: 2,
            head_dim: 64,
            ..smollm2()
        };
        let p = AttentionPlan::new(batch(1, 6_000), qwen, AttentionKernel::Warps, "f16", false)
            .unwrap();
        assert_eq!(p.chunk, None);
        let p = AttentionPlan::new(batch(1, 20_000), qwen, AttentionKernel::Warps, "f16", false)
            .unwrap();
        assert!(p.chunk.is_some() && p.shared_bytes <= MAX_SHARED, "{p:?}");
        let e = AttentionPlan::new(
            batch(1, 20_000),
            qwen,
            AttentionKernel::PerDimension,
            "f16",
            false,
        )
        .unwrap_err();
        assert!(
            matches!(e, PlanError::SharedMemory { positions: 20_000, bytes } if bytes > MAX_SHARED),
            "{e}"
        );
        assert!(e.to_string().contains("attention = warps"), "{e}");
        let wide = AttentionShape {
            head_dim: 512,
            ..qwen
        };
        let warps =
            |shape| AttentionPlan::new(batch(1, 10), shape, AttentionKernel::Warps, "f16", false);
        assert_eq!(warps(wide), Err(PlanError::HeadDim { head_dim: 512 }));
        let ungrouped = AttentionShape { n_kv: 1, ..qwen };
        assert_eq!(
            warps(ungrouped),
            Err(PlanError::Groups {
                n_head: qwen.n_head,
                n_kv: 1
            })
        );
    }
}
