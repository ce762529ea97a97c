//! The `quarry` command line.
//!
//! Subcommands today: `info` (what a model file is), `tokenize` (ids and token strings),
//! `chat-template` (a rendered prompt), `grammar` (compile a constraint, check a text, print a
//! mask) and `generate` (free or constrained generation through the engine, one prompt or a JSONL
//! batch), `extract` (a dataset job from a `pipelines/*.toml` definition) and `worker` (a Kafka
//! consumer-group member running such a definition).
//!
//! Exit codes, as grep has them: 0 success or "yes", 1 a "no" answer (`grammar accepts`), 2 an
//! error (one line on stderr).

mod generate_cmd;
mod grammar_cmd;
mod pipeline_cmd;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use quarry_model::{ModelError, ModelInfo};
use quarry_tokenizer::{ChatMessage, EncodeOptions, TokenKind, Tokenizer, TokenizerError};

/// The model `make setup` installs; every subcommand uses it unless `--model` says otherwise.
const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Parser)]
#[command(
    name = "quarry",
    version,
    about = "Bulk structured extraction with language models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show a model's architecture, sizes, vocabulary, special tokens and chat template.
    Info {
        #[command(flatten)]
        model: ModelArg,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Tokenize TEXT and print the ids and token strings.
    Tokenize {
        #[command(flatten)]
        model: ModelArg,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Prepend the BOS token.
        #[arg(long)]
        bos: bool,
        /// Match control tokens written in the text (`<|im_start|>`). Off by default: document
        /// text must never turn into control tokens.
        #[arg(long)]
        parse_special: bool,
        /// The text to tokenize.
        text: String,
    },
    /// Render a conversation with the model's chat template.
    ChatTemplate {
        #[command(flatten)]
        model: ModelArg,
        /// An optional system message.
        #[arg(long)]
        system: Option<String>,
        /// Leave out the assistant prefix that starts the model's reply.
        #[arg(long)]
        no_generation_prompt: bool,
        /// The user message.
        user: String,
    },
    /// Compile regex and choice constraints against the model's vocabulary; check texts and masks.
    #[command(subcommand)]
    Grammar(grammar_cmd::GrammarCommand),
    /// Generate text from a prompt on the CPU or a GPU, streamed, ending with tokens/s (stderr).
    Generate(generate_cmd::GenerateArgs),
    /// Run a dataset job: documents under an object-store prefix to Parquet (resumable).
    Extract(pipeline_cmd::ExtractArgs),
    /// Run a Kafka worker: a consumer-group member writing Parquet, effectively once.
    Worker(pipeline_cmd::WorkerArgs),
}

#[derive(Args)]
pub(crate) struct ModelArg {
    /// GGUF model file (default: the SmolLM2 file `make setup` installs, or $QUARRY_MODEL).
    #[arg(long, env = "QUARRY_MODEL", default_value = DEFAULT_MODEL)]
    pub(crate) model: PathBuf,
}

/// Exit code of an error (1 is kept for a "no" answer).
const EXIT_ERROR: u8 = 2;

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        // A closed pipe (`quarry info | head`) is the reader's choice, not a failure.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            // One line: the cause chain joined, then how to fix it where we know.
            eprintln!("error: {e:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Runs the command; `Ok(false)` is a "no" answer (exit 1).
fn run(cli: Cli) -> Result<bool> {
    match cli.command {
        Command::Grammar(cmd) => return grammar_cmd::run(cmd),
        Command::Generate(args) => generate_cmd::run(args)?,
        Command::Extract(args) => pipeline_cmd::extract(args)?,
        Command::Worker(args) => pipeline_cmd::worker(args)?,
        Command::Info { model, json } => info(&model.model, json)?,
        Command::Tokenize {
            model,
            json,
            bos,
            parse_special,
            text,
        } => {
            let tok = load_tokenizer(&model.model)?;
            let ids = tok.encode_with(
                &text,
                EncodeOptions {
                    add_bos: bos,
                    parse_special,
                },
            )?;
            print_tokens(&tok, &text, &ids, json)?
        }
        Command::ChatTemplate {
            model,
            system,
            no_generation_prompt,
            user,
        } => {
            let tok = load_tokenizer(&model.model)?;
            let mut msgs: Vec<ChatMessage> = system
                .into_iter()
                .map(|s| ChatMessage::new("system", s))
                .collect();
            msgs.push(ChatMessage::new("user", user));
            write!(
                std::io::stdout().lock(),
                "{}",
                tok.apply_chat_template(&msgs, !no_generation_prompt)?
            )?;
        }
    }
    Ok(true)
}

fn setup_hint(path: &Path) -> String {
    if path == Path::new(DEFAULT_MODEL) {
        "run `make setup` from the repository root to download and verify the models".into()
    } else {
        format!("check the path, or run `make setup` and use the default {DEFAULT_MODEL}")
    }
}

fn check_exists(path: &Path) -> Result<()> {
    if !path.is_file() {
        anyhow::bail!(
            "model file {} not found: {}",
            path.display(),
            setup_hint(path)
        );
    }
    Ok(())
}

pub(crate) fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    check_exists(path)?;
    Tokenizer::from_gguf(path).map_err(|e| match e {
        TokenizerError::Gguf { .. } | TokenizerError::Io { .. } => {
            anyhow::anyhow!("{e}. To fix: {}", setup_hint(path))
        }
        other => anyhow::Error::new(other)
            .context(format!("loading the tokenizer of {}", path.display())),
    })
}

fn load_info(path: &Path) -> Result<ModelInfo> {
    check_exists(path)?;
    ModelInfo::from_gguf(path).map_err(|e| match e {
        ModelError::Gguf { .. } | ModelError::Io { .. } | ModelError::Truncated { .. } => {
            anyhow::anyhow!("{e}. To fix: {}", setup_hint(path))
        }
        other => anyhow::Error::new(other).context(format!("reading {}", path.display())),
    })
}

fn info(path: &Path, json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let model = load_info(path)?;
    let tok = load_tokenizer(path)?;
    let table = tok.token_table();
    let count = |k: TokenKind| table.iter().filter(|(_, _, kind)| *kind == k).count();
    let sp = tok.special_tokens();
    let name_of = |id: Option<u32>| id.and_then(|i| tok.token_text(i));
    if json {
        let json = serde_json::json!({
            "path": path,
            "model": model,
            "tokenizer": {
                "vocab_kind": tok.vocab_kind(),
                "pre_tokenizer": tok.pre_tokenizer(),
                "vocab_size": tok.vocab_size(),
                "control_tokens": count(TokenKind::Control),
                "user_defined_tokens": count(TokenKind::UserDefined),
                "byte_tokens": count(TokenKind::Byte),
                "special": sp,
                "add_bos": tok.add_bos_by_default(),
                "chat_template": tok.chat_template().map(|t| t.source()),
            }
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&json)?)?;
        return Ok(());
    }
    let opt = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
    writeln!(
        out,
        "file            {} ({:.1} MiB, GGUF v{})",
        path.display(),
        model.file_bytes as f64 / 1048576.0,
        model.gguf_version
    )?;
    writeln!(
        out,
        "name            {}",
        model.name.as_deref().unwrap_or("?")
    )?;
    writeln!(out, "architecture    {}", model.architecture)?;
    let dtypes: Vec<String> = model
        .tensor_dtypes
        .iter()
        .map(|(k, v)| format!("{k} ×{v}"))
        .collect();
    writeln!(
        out,
        "parameters      {:.1} M in {} tensors ({})",
        model.parameter_count as f64 / 1e6,
        model.tensor_count,
        dtypes.join(", ")
    )?;
    writeln!(out, "context length  {}", opt(model.context_length))?;
    writeln!(
        out,
        "layers          {} · embedding {} · feed-forward {} · heads {} (kv {})",
        opt(model.block_count),
        opt(model.embedding_length),
        opt(model.feed_forward_length),
        opt(model.head_count),
        opt(model.head_count_kv)
    )?;
    writeln!(
        out,
        "rope base       {} · rms eps {}",
        model.rope_freq_base.map_or("?".into(), |v| v.to_string()),
        model
            .rms_norm_eps
            .map_or("?".into(), |v| format!("{v:.1e}"))
    )?;
    writeln!(
        out,
        "vocabulary      {} tokens, {}{} · {} control, {} user-defined, {} byte tokens",
        tok.vocab_size(),
        tok.vocab_kind(),
        tok.pre_tokenizer()
            .map(|p| format!(" (pre-tokenizer {p})"))
            .unwrap_or_default(),
        count(TokenKind::Control),
        count(TokenKind::UserDefined),
        count(TokenKind::Byte)
    )?;
    let show = |label: &str, id: Option<u32>| match id {
        Some(i) => format!("{label} {i} {}", name_of(Some(i)).unwrap_or_default()),
        None => format!("{label} none"),
    };
    writeln!(
        out,
        "special tokens  {} · {} · {} · {}",
        show("bos", sp.bos),
        show("eos", sp.eos),
        show("unk", sp.unk),
        show("pad", sp.pad)
    )?;
    let eog: Vec<String> = sp
        .end_of_generation
        .iter()
        .map(|&i| format!("{i} {}", name_of(Some(i)).unwrap_or_default()))
        .collect();
    writeln!(out, "end of turn     {}", eog.join(" · "))?;
    writeln!(out, "add bos         {}", tok.add_bos_by_default())?;
    match tok.chat_template() {
        Some(t) => writeln!(
            out,
            "chat template   ({} bytes)\n{}",
            t.source().len(),
            t.source()
        ),
        None => writeln!(out, "chat template   none"),
    }?;
    Ok(())
}

fn print_tokens(tok: &Tokenizer, text: &str, ids: &[u32], json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let tokens: Vec<String> = ids
        .iter()
        .map(|&i| tok.token_text(i).unwrap_or_default())
        .collect();
    if json {
        let pieces: Vec<String> = ids
            .iter()
            .map(|&i| {
                tok.token_bytes(i)
                    .map(|b| String::from_utf8_lossy(b).into_owned())
            })
            .collect::<Result<_, _>>()?;
        let json =
            serde_json::json!({ "text": text, "ids": ids, "tokens": tokens, "pieces": pieces });
        writeln!(out, "{}", serde_json::to_string(&json)?)?;
        return Ok(());
    }
    writeln!(out, "{} tokens", ids.len())?;
    for (id, t) in ids.iter().zip(&tokens) {
        let bytes = show_bytes(tok.token_bytes(*id)?);
        writeln!(out, "{id:>8}  {t:<24}  {}", bytes)?;
    }
    Ok(())
}

/// A token's bytes for people: valid UTF-8 as text, a lone byte of a split character as `\xNN`.
pub(crate) fn show_bytes(bytes: &[u8]) -> String {
    let mut s = String::new();
    for chunk in bytes.utf8_chunks() {
        s.push_str(&chunk.valid().escape_debug().to_string());
        for b in chunk.invalid() {
            s.push_str(&format!("\\x{b:02X}"));
        }
    }
    format!("\"{s}\"")
}
