//! `quarry generate`: unconstrained text generation, streamed, ending with the measured speed.

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use quarry_model::{parse_device, KvPool, Llama, Logits, Sampler, SamplingParams, SeqInput};
use quarry_tokenizer::{ChatMessage, EncodeOptions};

use crate::ModelArg;

#[derive(Args)]
#[command(after_help = "Examples:
  quarry generate --prompt 'The capital of France is'
  quarry generate --chat --prompt 'Name three Debian package managers.' --max-tokens 64
  quarry generate --prompt 'Once upon a time' --temperature 0.8 --top-p 0.95 --seed 7")]
pub(crate) struct GenerateArgs {
    #[command(flatten)]
    model: ModelArg,
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    chat: bool,
    /// Stop after this many new tokens.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling: keep the most likely tokens up to this probability mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the K most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Seed of the sampling stream: the same seed gives the same text.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// `cpu`, or `cuda:N` in a build with CUDA (`make build-cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
}

pub(crate) fn run(args: GenerateArgs) -> Result<()> {
    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    };
    let mut sampler = Sampler::new(params)?;
    let device = parse_device(&args.device)?;
    let tok = crate::load_tokenizer(&args.model.model)?;
    let model = Llama::load(&args.model.model, &device)
        .with_context(|| format!("loading {}", args.model.model.display()))?;
    let text = if args.chat {
        tok.apply_chat_template(&[ChatMessage::new("user", args.prompt.as_str())], true)?
    } else {
        args.prompt.clone()
    };
    let prompt = tok.encode_with(
        &text,
        EncodeOptions {
            add_bos: tok.add_bos_by_default(),
            // A rendered template's control tokens are real; a plain prompt's text stays text.
            parse_special: args.chat,
        },
    )?;
    if prompt.is_empty() {
        bail!("the prompt is empty. To fix: pass some text with --prompt");
    }
    let ctx = model.config().context_length;
    if prompt.len() >= ctx {
        bail!(
            "the prompt has {} tokens; the model's context is {ctx}. To fix: shorten the prompt",
            prompt.len()
        );
    }
    let max_new = args.max_tokens.min(ctx - prompt.len());
    let page_size = 16;
    let total = prompt.len() + max_new;
    let mut pool = KvPool::new(
        model.config(),
        page_size,
        total.div_ceil(page_size),
        &device,
        None,
    )?;
    let mut table = Vec::new();
    pool.alloc_into(pool.num_pages(), &mut table);
    let stops = &tok.special_tokens().end_of_generation;

    let mut out = Logits::new();
    let started = Instant::now();
    model.forward(&[SeqInput::new(&prompt, 0, &table)], &mut pool, &mut out)?;
    let prefill_s = started.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    let mut generated: Vec<u32> = Vec::with_capacity(max_new);
    let mut printed = 0usize;
    let stdout = std::io::stdout();
    let mut w = stdout.lock();
    let mut stopped = false;
    while generated.len() < max_new {
        let next = sampler.sample(out.last(0))?;
        if stops.binary_search(&next).is_ok() {
            stopped = true;
            break;
        }
        generated.push(next);
        // Print what has become complete UTF-8; a character split across tokens waits.
        let bytes = tok.decode_bytes(&generated)?;
        let complete = match std::str::from_utf8(&bytes[printed..]) {
            Ok(s) => s.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => bytes.len() - printed,
        };
        w.write_all(&bytes[printed..printed + complete])?;
        w.flush()?;
        printed += complete;
        if generated.len() == max_new {
            break;
        }
        let pos = prompt.len() + generated.len() - 1;
        model.forward(
            &[SeqInput::new(
                &generated[generated.len() - 1..],
                pos,
                &table,
            )],
            &mut pool,
            &mut out,
        )?;
    }
    let bytes = tok.decode_bytes(&generated)?;
    w.write_all(&bytes[printed..])?;
    writeln!(w)?;
    let decode_s = decode_start.elapsed().as_secs_f64();
    eprintln!(
        "[{} prompt tokens at {:.0} tok/s; {} new tokens at {:.1} tok/s; {}]",
        prompt.len(),
        prompt.len() as f64 / prefill_s,
        generated.len(),
        generated.len() as f64 / decode_s.max(1e-9),
        if stopped {
            "stopped at end of turn"
        } else {
            "reached --max-tokens"
        }
    );
    Ok(())
}
