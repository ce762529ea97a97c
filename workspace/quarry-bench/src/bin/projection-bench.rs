//! A model shape's projections on a GPU, multiplied as the forward pass multiplies its dense
//! weights (f16 copies, cuBLAS through candle's matmul with f32 accumulation:
//! `linear::Linear::Dense`), against the memory's and the arithmetic's floors (`make gpu-pack`
//! builds it, `infra/gpu-check.sh` runs it; needs the `cuda` feature and a GPU):
//!
//! `projection-bench [shape] [rows,rows,...]`
//!
//! For a dummy-weight shape (`quarry_model::DUMMY_SHAPES`, default `llama3.1-8b`, or a
//! `config.json`), each of a layer's projections as the forward pass stacks them (Q/K/V, the
//! output, gate/up, down) and the vocabulary projection, at each row count (default 1, 8, 32,
//! 64, 128, 256, 512: a decode step's rows at that batch), timed with CUDA events (median of 20
//! after 3 warm-ups, `quarry_bench::gpu_timing`). Per projection: µs, TFLOP/s, and the weights'
//! bytes over that time against a device copy's rate (the floor where the step is bound by
//! reading the weights, at few rows). Per row count: a decode step's projections, the layer's
//! four times the layers plus the vocabulary projection, in ms: the share of a step that the
//! profile (`QUARRY_PROFILE`) measures with a synchronization after every phase, here without.
//! A batch-256 step of the Llama-3.1-8B shape took 21.66 ms on an H200 (2026-11-30); whether its
//! projections or its attention are further from their floor decides the next kernel work
//! (docs/gpu.md, *What is left*).

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use quarry_bench::gpu_timing::{copy_gb_per_s, time_ms};
use quarry_model::DummyShape;

const DEFAULT_ROWS: [usize; 7] = [1, 8, 32, 64, 128, 256, 512];

/// One projection: its name, outputs and inputs (`[outputs, inputs]` weights) and how many a
/// step multiplies (one a layer, or the one vocabulary projection).
struct Projection {
    name: &'static str,
    outputs: usize,
    inputs: usize,
    per_step: usize,
}

fn projections(shape: &DummyShape) -> Vec<Projection> {
    let c = &shape.config;
    let (e, f, layers) = (c.embedding_length, c.feed_forward_length, c.block_count);
    let (q, kv) = (c.head_count * c.head_dim, c.head_count_kv * c.head_dim);
    let layer = |name, outputs, inputs| Projection {
        name,
        outputs,
        inputs,
        per_step: layers,
    };
    vec![
        layer("Q/K/V", q + 2 * kv, e),
        layer("output", e, q),
        layer("gate/up", 2 * f, e),
        layer("down", e, f),
        Projection {
            name: "vocabulary",
            outputs: shape.published_vocab,
            inputs: e,
            per_step: 1,
        },
    ]
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "llama3.1-8b".into());
    let rows: Vec<usize> = match args.next() {
        Some(list) => list
            .split(',')
            .map(|r| r.trim().parse().ok().filter(|&n: &usize| n > 0))
            .collect::<Option<_>>()
            .with_context(|| format!("rows `{list}`: a comma-separated list of counts over 0"))?,
        None => DEFAULT_ROWS.to_vec(),
    };
    // The vocabulary a shape is measured with is its published one (the tokenizer's size only
    // matters to a model that runs).
    let shape = DummyShape::resolve(&name, 1)?;
    let device = Device::new_cuda(0).context("projection-bench needs a GPU")?;
    let Device::Cuda(dev) = &device else {
        bail!("projection-bench needs a CUDA device");
    };
    quarry_model::cuda::prepare(dev)?;
    let c = &shape.config;
    println!(
        "projections of {name} ({} layers, embedding {}, feed-forward {}, {}/{} heads of {}, vocabulary {}), f16 weights, cuBLAS through candle's matmul",
        c.block_count,
        c.embedding_length,
        c.feed_forward_length,
        c.head_count,
        c.head_count_kv,
        c.head_dim,
        shape.published_vocab
    );
    println!(
        "{:>6} {:>11} {:>16} {:>10} {:>9} {:>12} {:>10}",
        "rows", "projection", "weights", "µs", "TFLOP/s", "weights GB/s", "÷ copy"
    );
    let list = projections(&shape);
    let largest = list.iter().map(|p| p.outputs * p.inputs).max().unwrap_or(1);
    let copy = copy_gb_per_s(dev, largest * 2);
    let weights: Vec<Tensor> = list
        .iter()
        .map(|p| {
            Tensor::randn(0f32, 0.02, (p.outputs, p.inputs), &device)
                .and_then(|w| w.to_dtype(DType::F16))
                .with_context(|| format!("{name}'s {} weights", p.name))
        })
        .collect::<Result<_>>()?;
    for &m in &rows {
        let mut step_ms = 0.0f64;
        for (p, w) in list.iter().zip(&weights) {
            let x = Tensor::randn(0f32, 1.0, (m, p.inputs), &device)?.to_dtype(DType::F16)?;
            let wt = w.t()?;
            let mut failed = None;
            let ms = time_ms(dev, || {
                if let Err(e) = x.broadcast_matmul(&wt) {
                    failed.get_or_insert(e);
                }
            });
            if let Some(e) = failed {
                bail!("{} at {m} rows: {e}", p.name);
            }
            let s = ms as f64 * 1e-3;
            let flops = 2.0 * (m * p.outputs * p.inputs) as f64;
            let bytes = (2 * p.outputs * p.inputs) as f64;
            step_ms += ms as f64 * p.per_step as f64;
            println!(
                "{m:>6} {:>11} {:>16} {:>10.1} {:>9.1} {:>12.0} {:>9.2}x",
                p.name,
                format!("{}x{}", p.outputs, p.inputs),
                1e3 * ms,
                flops / s / 1e12,
                bytes / s / 1e9,
                bytes / s / 1e9 / copy,
            );
        }
        println!(
            "{m:>6} {:>11} {step_ms:>27.2} ms a step (copy: {copy:.0} GB/s)",
            "step"
        );
    }
    Ok(())
}
