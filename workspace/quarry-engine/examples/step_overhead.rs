//! The engine's own host time per step, with a model that costs nothing: its forward pass returns
//! at once and its draws (what a GPU's sampling kernel returns) are fixed tokens. What is left of a
//! step is the engine's bookkeeping (scheduling, block tables, the radix cache, appending and
//! detokenizing tokens), the part of a GPU step that no kernel shortens. A diagnostic, not a
//! benchmark against a peer (BENCHMARKS.md, issue 25):
//!
//! `cargo run --release -p quarry-engine --example step_overhead -- 512`

use std::sync::Arc;
use std::time::Instant;

use quarry_engine::{Draws, Engine, EngineConfig, Model, Prompt, Request};
use quarry_model::{parse_device, KvPool, LlamaConfig, Logits, SeqInput};
use quarry_tokenizer::Tokenizer;

/// Steps counted as prefill and left out of the per-step figure.
const WARM_STEPS: usize = 20;

struct Free {
    vocab: usize,
}

impl Model for Free {
    fn forward(
        &self,
        batch: &[SeqInput],
        _pool: &mut KvPool,
        out: &mut Logits,
    ) -> quarry_model::Result<()> {
        // One logit per row: the draws below never read them.
        out.layout(1, batch);
        Ok(())
    }

    fn kv_pool(&self, page_size: usize, num_pages: usize) -> quarry_model::Result<KvPool> {
        let cfg = LlamaConfig::minimal("free", self.vocab, self.context_length());
        KvPool::new(&cfg, page_size, num_pages, &parse_device("cpu")?, None)
    }

    fn context_length(&self) -> usize {
        4096
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn sample(&self, _logits: &mut Logits, _masks: &[u32], draws: &mut Draws) {
        draws.out.clear();
        draws
            .out
            .extend((0..draws.rows.rows()).map(|r| Ok(1000 + r as u32 % 300)));
    }
}

fn main() {
    let batch: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("the batch size is a number"))
        .unwrap_or(512);
    let tok = Tokenizer::from_gguf("models/SmolLM2-135M-Instruct.Q4_1.gguf")
        .expect("run from the checkout, after make setup");
    let tok = Arc::new(tok);
    let model = Arc::new(Free {
        vocab: tok.vocab_size(),
    });
    let cfg = EngineConfig {
        kv_tokens: batch * 1100,
        max_running: batch,
        step_tokens: 4096,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(model, tok, cfg).expect("engine");
    // About 700 prompt tokens each, most of them a shared instruction, like quarry bench's.
    let instruction = "Extract the record's facts. ".repeat(60);
    for i in 0..batch {
        let doc = format!("{instruction}Document {i}: {}", "word ".repeat(100));
        e.submit(Request::new(Prompt::Text(doc)).with_max_tokens(160))
            .expect("submitted");
    }
    let (mut steps, mut done, mut later_s) = (0usize, 0usize, 0.0);
    let start = Instant::now();
    while done < batch {
        let t = Instant::now();
        done += e.step().expect("step").len();
        steps += 1;
        if steps > WARM_STEPS {
            later_s += t.elapsed().as_secs_f64();
        }
    }
    let later = steps.saturating_sub(WARM_STEPS).max(1) as f64;
    println!(
        "batch {batch}: {steps} steps in {:.3} s; after the first {WARM_STEPS}, {:.3} ms per step ({:.2} µs per sequence)",
        start.elapsed().as_secs_f64(),
        1e3 * later_s / later,
        1e6 * later_s / later / batch as f64
    );
}
