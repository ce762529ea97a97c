//! The paged attention kernel's layouts on a GPU, against the copy engine as the ceiling
//! (`make gpu-pack` builds it, `infra/gpu-check.sh` runs it; needs the `cuda` feature and a GPU):
//!
//! `attention-bench [context] [shape]`
//!
//! A model's heads (`smollm2`, the default: 9 query heads on 3 key-value heads of 64;
//! `llama3-8b`: 32 on 8 of 128, Llama 3.1 8B's and Qwen3 8B's; `qwen2.5-0.5b`: 14 on 2 of 64), an
//! f16 pool with one position per page (as the engine allocates), every sequence's pages
//! scattered. For decode batches of 1 to 512
//! rows at `context` positions each (default 800), and a 512-token prefill, it times each layout
//! (per-dimension, warps, and warps split over the positions with the chunk it chooses; then the
//! warps layout in the forms compiled for groups of up to 8, against the forms the model's groups
//! take; then the tiled form, whose prefill tokens share their key reads, against the warps
//! layout; then the cascade, which reads a shared prefix once for all its tokens; then split-K
//! with its combine in the chunks' launch, against the split column; then the warps layout with
//! each L2 prefetch of its rows, `attention_prefetch`, against the warps column; last, the warps
//! and split layouts with their key rows staged through shared memory, `attention_keys =
//! staged`, against the same layouts reading them directly; and split-K with every context in
//! two chunks, `attention_chunk`, against the warps column: at batch 256 the 8B heads' 2,048
//! blocks are 5.2 waves of 396, so the last wave runs a fifth full) with CUDA
//! events (median of 20 launches after 3 warm-ups) and reports the bytes of keys and values a
//! token-by-token launch must read over its time for the fastest, beside a device-to-device copy
//! of as many bytes (the bandwidth a kernel that only streamed the pool could reach), and the
//! layouts' largest relative difference from the first (their GPU tests are the real check).
//! The decode batches run twice: each sequence on pages of its own, then with the first 9/16 of
//! every sequence's positions on the same pages (450 of 800: quarry's extraction prompts share
//! their instructions, 54-67% of the prompt in the 8B runs, through the radix cache).

use candle_core::cuda::cudarc::driver::CudaSlice;
use quarry_bench::gpu_timing::{copy_gb_per_s, time_ms};
use quarry_model::cuda::{paged_attention, AttentionOut, AttentionShape, DeviceBatch, KvPool};
use quarry_model::{AttentionKernel, KeyReads, Prefetch, RaggedBatch, SeqInput};

/// The shapes by name: query heads, key-value heads, head width.
const SHAPES: [(&str, usize, usize, usize); 3] = [
    ("smollm2", 9, 3, 64),
    ("llama3-8b", 32, 8, 128),
    ("qwen2.5-0.5b", 14, 2, 64),
];

fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// Row `i` of `n` rows, scattered: `i` times a multiplier prime to `n`, modulo `n`, so each of
/// the `n` rows is used once.
fn scatter(i: usize, n: usize) -> usize {
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let m = [7, 11, 13, 17]
        .into_iter()
        .find(|&m| gcd(m, n) == 1)
        .unwrap_or(1);
    i * m % n
}

fn main() {
    let context: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("the context is a number of positions"))
        .unwrap_or(800);
    let name = std::env::args().nth(2).unwrap_or_else(|| "smollm2".into());
    let Some(&(_, n_head, n_kv, head_dim)) = SHAPES.iter().find(|s| s.0 == name) else {
        eprintln!(
            "attention-bench: no shape `{name}` (one of {})",
            SHAPES.map(|s| s.0).join(", ")
        );
        std::process::exit(2);
    };
    let dev = candle_core::Device::new_cuda(0)
        .and_then(|d| d.as_cuda_device().cloned())
        .expect("attention-bench needs a GPU");
    let kv_dim = n_kv * head_dim;
    let shape = AttentionShape {
        n_head,
        n_kv,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        window: 0,
        widest_group_form: false,
        prefetch: Prefetch::Off,
        keys: KeyReads::Direct,
    };
    println!(
        "paged attention, {name}: {n_head}/{n_kv} heads of {head_dim}, f16 pool, {context} positions per sequence"
    );
    // The layouts, then the warps layout in the forms compiled for groups of up to 8 (the only
    // forms before 2026-11-28's g4 forms: the same arithmetic with the registers of 8 heads).
    let widest = AttentionShape {
        widest_group_form: true,
        ..shape
    };
    // Then split-K with its combine in the chunks' launch (`split_combine`: the batch carries
    // the last block's counters) against the combine's own launch; the warps layout with each
    // L2 prefetch (`attention_prefetch`) against none; the warps and split layouts with their
    // key rows staged (`attention_keys`) against the same layouts reading them directly; last,
    // split-K with every context in two chunks against the warps layout.
    let prefetch = |prefetch| AttentionShape { prefetch, ..shape };
    let staged = AttentionShape {
        keys: KeyReads::Staged,
        ..shape
    };
    let split = AttentionKernel::Split { chunk: None };
    let halves = AttentionKernel::Split {
        chunk: Some(context.div_ceil(2)),
    };
    const WARPS: usize = 1;
    const SPLIT: usize = 2;
    let runs = [
        Run::new("per-dimension", AttentionKernel::PerDimension, shape),
        Run::new("warps", AttentionKernel::Warps, shape),
        Run::new("split", split, shape).against(WARPS, Ratio::SpeedUp),
        Run::new("warps g8", AttentionKernel::Warps, widest).against(WARPS, Ratio::Share),
        Run::new("tiled", AttentionKernel::Tiled, shape).against(WARPS, Ratio::SpeedUp),
        Run::new("cascade", AttentionKernel::Cascade, shape).against(WARPS, Ratio::SpeedUp),
        Run::new("last-block", split, shape)
            .counted()
            .against(SPLIT, Ratio::Share),
        Run::new(
            "pf values",
            AttentionKernel::Warps,
            prefetch(Prefetch::Values),
        )
        .against(WARPS, Ratio::Share),
        Run::new("pf keys", AttentionKernel::Warps, prefetch(Prefetch::Keys))
            .against(WARPS, Ratio::Share),
        Run::new("pf both", AttentionKernel::Warps, prefetch(Prefetch::Both))
            .against(WARPS, Ratio::Share),
        Run::new("warps staged", AttentionKernel::Warps, staged).against(WARPS, Ratio::SpeedUp),
        Run::new("split staged", split, staged).against(SPLIT, Ratio::SpeedUp),
        Run::new("split halves", halves, shape).against(WARPS, Ratio::Share),
    ];
    let mut header = format!("{:>30}", "case");
    for run in &runs {
        header += &format!(" {:>14}", format!("{} µs", run.name));
        if let Some((base, ratio)) = run.against {
            header += &format!(" {:>14}", ratio.header(runs[base].name));
        }
    }
    println!("{header} {:>10} {:>10}", "best GB/s", "copy GB/s");
    // (label, sequences, new tokens per sequence, shared positions)
    let shared = context * 9 / 16;
    let cases = [
        ("decode, batch 1", 1usize, 1usize, 0usize),
        ("decode, batch 8", 8, 1, 0),
        ("decode, batch 32", 32, 1, 0),
        ("decode, batch 128", 128, 1, 0),
        ("decode, batch 256", 256, 1, 0),
        ("decode, batch 512", 512, 1, 0),
        ("prefill, 512 tokens", 1, 512, 0),
        ("decode, batch 8, shared", 8, 1, shared),
        ("decode, batch 64, shared", 64, 1, shared),
        ("decode, batch 256, shared", 256, 1, shared),
        ("decode, batch 512, shared", 512, 1, shared),
    ];
    for (label, seqs, new, shared) in cases {
        let ctx = context.max(new);
        // The shared positions' pages first, then each sequence's own: page p of sequence s is
        // row shared + scatter((p - shared) * seqs + s) of its own rows, scattered, each used
        // once.
        let own = ctx - shared;
        let rows = shared + seqs * own;
        let pages: Vec<Vec<u32>> = (0..seqs)
            .map(|s| {
                (0..ctx)
                    .map(|p| match p.checked_sub(shared) {
                        None => scatter(p, shared) as u32,
                        Some(o) => (shared + scatter(o * seqs + s, seqs * own)) as u32,
                    })
                    .collect()
            })
            .collect();
        let tokens = vec![1u32; new];
        let batch: Vec<SeqInput<'_>> = pages
            .iter()
            .map(|pg| SeqInput::new(&tokens, ctx - new, pg))
            .collect();
        let mut meta = RaggedBatch::default();
        meta.fill(&batch, 1);
        let db = DeviceBatch::upload(&dev, &meta, 0, None).expect("upload");
        let counted = DeviceBatch::upload(&dev, &meta, 0, Some(n_kv)).expect("upload");
        let half = |x: Vec<f32>| x.into_iter().map(half::f16::from_f32).collect::<Vec<_>>();
        let k = dev.clone_htod(&half(values(1, rows * kv_dim))).expect("k");
        let v = dev.clone_htod(&half(values(2, rows * kv_dim))).expect("v");
        let q = dev
            .clone_htod(&values(3, meta.tokens() * n_head * head_dim))
            .expect("q");
        let mut outs: Vec<CudaSlice<f32>> = Vec::new();
        let mut times = Vec::new();
        for run in &runs {
            let (kernel, shape) = (run.kernel, run.shape);
            let db = if run.counted { &counted } else { &db };
            let mut out = dev
                .alloc_zeros::<f32>(meta.tokens() * n_head * head_dim)
                .expect("out");
            let ms = time_ms(&dev, || {
                paged_attention(
                    &dev,
                    &q,
                    KvPool::F16(&k, &v),
                    db,
                    shape,
                    kernel,
                    AttentionOut::F32(&mut out),
                )
                .expect("launch")
            });
            times.push(ms);
            outs.push(out);
        }
        // Keys and values each token's attention reads: (its position + 1) rows of both pools.
        let read: usize = meta
            .token_pos
            .iter()
            .map(|&p| p as usize + 1)
            .sum::<usize>()
            * kv_dim
            * 2
            * 2;
        // A copy of as many bytes as the launch reads, at most the pool's (a copy's reads and
        // writes counted).
        let copy = copy_gb_per_s(&dev, (rows * kv_dim * 2).min(read / 2));
        let a = dev.clone_dtoh(&outs[0]).expect("out");
        let norm = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        let diff = outs[1..]
            .iter()
            .map(|o| {
                let b = dev.clone_dtoh(o).expect("out");
                let d = a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2));
                d.sum::<f64>().sqrt() / norm.max(1e-30)
            })
            .fold(0.0, f64::max);
        let best = times.iter().copied().fold(f32::INFINITY, f32::min);
        let gbs = |ms: f32| read as f64 / (ms as f64 * 1e-3) / 1e9;
        let mut line = format!("{label:>30}");
        for (run, ms) in runs.iter().zip(&times) {
            line += &format!(" {:>14.1}", 1e3 * ms);
            if let Some((base, ratio)) = run.against {
                line += &format!(" {:>14}", ratio.show(*ms, times[base]));
            }
        }
        println!(
            "{line} {:>10.0} {:>10.0}   (layouts differ by {diff:.1e} relative at most)",
            gbs(best),
            copy
        );
    }
}

/// One timed launch: its column's name, the layout and shape, whether the batch carries the
/// last-block combine's counters, and the run it is compared with.
struct Run {
    name: &'static str,
    kernel: AttentionKernel,
    shape: AttentionShape,
    counted: bool,
    against: Option<(usize, Ratio)>,
}

impl Run {
    fn new(name: &'static str, kernel: AttentionKernel, shape: AttentionShape) -> Self {
        Self {
            name,
            kernel,
            shape,
            counted: false,
            against: None,
        }
    }

    /// The batch with the last-block combine's counters (`split_combine`).
    fn counted(self) -> Self {
        Self {
            counted: true,
            ..self
        }
    }

    /// A ratio column against run `base` (its index), after this run's time.
    fn against(self, base: usize, ratio: Ratio) -> Self {
        Self {
            against: Some((base, ratio)),
            ..self
        }
    }
}

/// How a run's time is compared with its base's.
#[derive(Clone, Copy)]
enum Ratio {
    /// The base's time over this one's (`vs warps 1.25x`): above 1 where this run is faster.
    SpeedUp,
    /// This run's time over the base's (`÷ warps 0.80`): under 1 where this run is faster.
    Share,
}

impl Ratio {
    fn header(self, base: &str) -> String {
        match self {
            Ratio::SpeedUp => format!("vs {base}"),
            Ratio::Share => format!("÷ {base}"),
        }
    }

    fn show(self, ms: f32, base: f32) -> String {
        match self {
            Ratio::SpeedUp => format!("{:.2}x", base / ms),
            Ratio::Share => format!("{:.2}", ms / base),
        }
    }
}
