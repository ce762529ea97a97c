//! The `quarry` command line.
//!
//! Subcommands: `extract` (a dataset job from a `pipelines/*.toml` definition), `worker` (a Kafka
//! consumer-group member running such a definition), `inspect` (what published Parquet files
//! hold), `bench` (the throughput sweep on any device), `generate` (free or constrained generation
//! through the engine), and the tools underneath: `info`, `tokenize`, `chat-template`, `grammar`.
//!
//! Exit codes ([`EXIT_CODES`]): 0 success or "yes", 1 a "no" answer (`grammar accepts`), 2 an
//! error (one line on stderr with the cause and a hint), 3 a job stopped by a signal before it
//! finished (rerun it to resume).

mod bench_cmd;
mod generate_cmd;
mod grammar_cmd;
mod inspect_cmd;
mod pipeline_cmd;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use quarry_engine::Loaded;
use quarry_model::{ModelError, ModelInfo, ModelOptions};
use quarry_tokenizer::{
    ChatMessage, ChatVars, EncodeOptions, TokenKind, Tokenizer, TokenizerError,
};

/// The model `make setup` installs; every subcommand uses it unless `--model` says otherwise.
const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The exit codes, as `quarry --help` and `docs/cli.md` state them (a test keeps the page true).
macro_rules! exit_codes {
    () => {
        "Exit codes:
  0  success (or \"yes\" from `grammar accepts`)
  1  \"no\" from `grammar accepts` (the text does not match the constraint)
  2  error: bad arguments, an unreadable job definition, schema or model, a store or broker that
     keeps failing; one line on stderr with the cause and a hint
  3  `extract` stopped by SIGTERM/SIGINT before every shard was published; rerun it to resume"
    };
}
#[cfg(test)]
const EXIT_CODES: &str = exit_codes!();

#[derive(Parser)]
#[command(
    name = "quarry",
    version,
    about = "Bulk structured extraction with language models",
    long_about = "Bulk structured extraction with language models: documents from Kafka or object \
storage, a model on CPU or GPU whose every output follows a JSON Schema, a regex or a choice list, \
validated records written to Parquet effectively once.",
    after_help = concat!("Examples:
  quarry extract --pipeline pipelines/debian-packages.toml      # a dataset job to Parquet
  quarry worker --pipeline pipelines/kafka-packages.toml --brokers 127.0.0.1:9092
  quarry inspect target/demo/out/packages                       # what the job wrote
  quarry bench --device cuda:0 --batch 1,16,64                  # compare devices
  quarry generate --chat --schema schemas/debian-package.json --prompt 'Package: jq ...'
  quarry grammar mask --regex '[0-9]{3}' --prefix 12

Every subcommand has its own --help with examples. The model defaults to
models/SmolLM2-135M-Instruct.Q4_1.gguf (installed by `make setup`) or $QUARRY_MODEL.

", exit_codes!())
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show a model's architecture, sizes, vocabulary, special tokens and chat template.
    #[command(after_help = "Examples:
  quarry info
  quarry info --model models/gemma-3-270m-q4_k_m.gguf --json | jq .model.block_count")]
    Info {
        #[command(flatten)]
        model: ModelArg,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Tokenize TEXT and print the ids and token strings.
    #[command(after_help = "Examples:
  quarry tokenize 'Ünïcødé 😀'
  quarry tokenize --json --bos 'Hello world'
  quarry tokenize --parse-special '<|im_start|>user'")]
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
        /// The text to tokenize (it may begin with `-`: `quarry tokenize -1e5`).
        #[arg(allow_hyphen_values = true)]
        text: String,
    },
    /// Render a conversation with the model's chat template.
    #[command(after_help = "Examples:
  quarry chat-template 'Extract the invoice total.'
  quarry chat-template --system 'You extract JSON records.' --no-generation-prompt 'Invoice #12'")]
    ChatTemplate {
        #[command(flatten)]
        model: ModelArg,
        /// An optional system message.
        #[arg(long, allow_hyphen_values = true)]
        system: Option<String>,
        /// Leave out the assistant prefix that starts the model's reply.
        #[arg(long)]
        no_generation_prompt: bool,
        /// A variable the template sees: KEY=VALUE, VALUE as JSON where it is JSON, else a
        /// string (repeat the flag). `enable_thinking` is false unless set here.
        #[arg(long, value_name = "KEY=VALUE", value_parser = ChatVars::parse_pair)]
        chat_var: Vec<(String, serde_json::Value)>,
        /// The user message.
        #[arg(allow_hyphen_values = true)]
        user: String,
    },
    /// Compile regex and choice constraints against the model's vocabulary; check texts and masks.
    #[command(
        subcommand,
        after_help = "Examples:
  quarry grammar compile --schema schemas/debian-package.json
  quarry grammar mask --regex '[0-9]{3}' --prefix 12 --json
  printf 2024-02-29 | quarry grammar accepts --regex '[0-9]{4}-[0-9]{2}-[0-9]{2}' --explain"
    )]
    Grammar(grammar_cmd::GrammarCommand),
    /// Generate text from a prompt on the CPU or a GPU, streamed, ending with tokens/s (stderr).
    Generate(generate_cmd::GenerateArgs),
    /// Run a dataset job: documents under an object-store prefix to Parquet (resumable).
    Extract(pipeline_cmd::ExtractArgs),
    /// Run a Kafka worker: a consumer-group member writing Parquet, effectively once.
    Worker(pipeline_cmd::WorkerArgs),
    /// Show what Parquet files hold: schema, counts, offset ranges, sample rows.
    Inspect(inspect_cmd::InspectArgs),
    /// Measure extraction throughput on a device over a batch-size sweep (table + JSON).
    Bench(bench_cmd::BenchArgs),
}

#[derive(Args)]
pub(crate) struct ModelArg {
    /// GGUF model file, or Hugging Face checkpoint folder (default: the SmolLM2 file `make setup`
    /// installs, or $QUARRY_MODEL).
    #[arg(long, env = "QUARRY_MODEL", default_value = DEFAULT_MODEL)]
    pub(crate) model: PathBuf,
}

/// The model runtime options of a command that loads a model (`quarry_model::ModelOptions`,
/// docs/model-options.md).
#[derive(Args)]
pub(crate) struct RuntimeArgs {
    /// A model runtime option as KEY=VALUE (repeatable): attention, attention_chunk,
    /// attention_prefetch, kv_dtype, dense_from_rows, q8_gemv, gemv_prefetch, sampling,
    /// cuda_graphs, gemm_add, rope_store, add_norm, gemv_norm, split_combine, profile,
    /// cpu_weights. Over the QUARRY_<KEY> variables, which are over the defaults.
    #[arg(long = "runtime", value_name = "KEY=VALUE", long_help = quarry_model::ModelOptions::HELP)]
    pub(crate) runtime: Vec<String>,
}

impl RuntimeArgs {
    /// The defaults, then the environment's `QUARRY_*` variables ([`runtime_env`]), then the
    /// flags.
    pub(crate) fn options(&self) -> Result<ModelOptions> {
        let mut o = ModelOptions::default();
        runtime_env(&mut o)?;
        for pair in &self.runtime {
            o.set_pair(pair)?;
        }
        Ok(o)
    }
}

/// Applies the `QUARRY_*` model runtime variables over `options`: the one place the process
/// environment configures the model (the libraries read none).
pub(crate) fn runtime_env(options: &mut ModelOptions) -> Result<()> {
    options.apply_vars(|name| std::env::var(name).ok())?;
    Ok(())
}

/// How a command ended, for its exit code ([`EXIT_CODES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    Success,
    /// A "no" answer.
    No,
    /// A job stopped by a signal before it finished.
    Interrupted,
}

/// Exit code of an error.
const EXIT_ERROR: u8 = 2;

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(Exit::Success) => ExitCode::SUCCESS,
        Ok(Exit::No) => ExitCode::from(1),
        Ok(Exit::Interrupted) => ExitCode::from(3),
        // A closed pipe (`quarry info | head`) is the reader's choice, not a failure.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{}", error_line(&e));
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// An error as one line: the cause chain joined, then how to fix it where the message does not
/// already say. A cause the message already quotes (a typed error whose text includes its source)
/// is not repeated.
fn error_line(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !msg.contains(&cause) {
            msg.push_str(": ");
            msg.push_str(&cause);
        }
    }
    let msg = msg.split_whitespace().collect::<Vec<_>>().join(" ");
    match hint(e).filter(|_| !msg.contains("To fix") && !msg.contains("run `make")) {
        Some(h) => format!("error: {msg}. Hint: {h}"),
        None => format!("error: {msg}"),
    }
}

/// A hint for the errors whose fix is the same every time.
fn hint(e: &anyhow::Error) -> Option<&'static str> {
    use quarry_pipeline::PipelineError as P;
    let p = e.chain().find_map(|c| c.downcast_ref::<P>())?;
    Some(match p {
        P::Config { .. } | P::Definition { .. } => "job definitions are described in pipelines/README.md and the configuration reference in docs/pipelines.md",
        P::Read { .. } => "check the path (paths inside a job definition are relative to its folder)",
        P::WrongSource { .. } => "`quarry extract` runs dataset jobs and `quarry worker` Kafka jobs (pipelines/README.md)",
        P::Schema { .. } => "check the file with `quarry grammar compile --schema FILE`",
        P::Grammar { .. } => "check the file with `quarry grammar compile --grammar FILE`",
        P::MetricsListen { .. } => "metrics.listen (or --metrics) is HOST:PORT, and the port must be free",
        P::Signals(_) => "the process cannot install signal handlers (a sandbox that forbids them?)",
        P::Store { .. } => "check the URL, the credentials in the environment (AWS_*, GOOGLE_*, AZURE_*) and that the endpoint is up; nothing was committed, so a rerun is safe",
        P::Url { .. } => "use a local path or file://, s3://, gs://, az:// or memory://",
        P::Input { .. } => "check the path or URL (for a job, also source.format)",
        P::Kafka { .. } => "check --brokers and that the broker is reachable (`bash infra/local-kafka.sh start` runs a local one); uncommitted work is redone on restart",
        P::Stalled { .. } => "the partition's next batch cannot be read (a codec this build lacks, a corrupt batch, a broker fetch error): see docs/kafka.md; raise source.stall_timeout_s only for a slow broker",
        P::LagLeft { .. } => "the worker stopped before every assigned partition was committed to its high watermark; rerun it (it resumes), or look for a stalled partition in the log",
        P::Parquet { .. } => "the file is not Parquet or was cut short (a published file is never partial: check how it got there)",
        P::Reconcile { .. } => "the worker could not read the output and rejects prefixes to find where the partition resumes (the cause is above): check the URLs and their credentials; nothing was consumed",
        P::BadClaim { .. } => "a `_claim-*` object beside the rejects markers was not written by quarry: is the rejects prefix shared with something else?",
        P::Model { .. } | P::Tokenizer { .. } | P::Engine(_) => "check the model file (`quarry info --model FILE`) and --device",
        P::Conservation { .. } => "this is a bug: please report it with the job definition; nothing was committed",
        P::Template(_) => "prompt.template is a minijinja template over text, id and doc",
        // `PipelineError` is non-exhaustive: a newer variant has no hint until one is written.
        _ => return None,
    })
}

/// Runs the command.
fn run(cli: Cli) -> Result<Exit> {
    // The crash tests' fault injection (a build with quarry-pipeline's `test-support` only).
    quarry_pipeline::faults::arm_from(|k| std::env::var(k).ok())?;
    match cli.command {
        Command::Grammar(cmd) => {
            return Ok(if grammar_cmd::run(cmd)? {
                Exit::Success
            } else {
                Exit::No
            })
        }
        Command::Generate(args) => generate_cmd::run(args)?,
        Command::Extract(args) => return pipeline_cmd::extract(args),
        Command::Worker(args) => pipeline_cmd::worker(args)?,
        Command::Inspect(args) => inspect_cmd::run(args)?,
        Command::Bench(args) => bench_cmd::run(args)?,
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
            chat_var,
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
                tok.apply_chat_template_with(
                    &msgs,
                    !no_generation_prompt,
                    &ChatVars(chat_var.into_iter().collect()).for_reply(false)
                )?
            )?;
        }
    }
    Ok(Exit::Success)
}

fn setup_hint(path: &Path) -> String {
    if path == Path::new(DEFAULT_MODEL) {
        "run `make setup` from the repository root to download and verify the models".into()
    } else {
        format!("check the path, or run `make setup` and use the default {DEFAULT_MODEL}")
    }
}

/// A GGUF file, or a Hugging Face checkpoint folder (which has a `config.json`).
fn check_exists(path: &Path) -> Result<()> {
    if path.is_dir() && !path.join("config.json").is_file() {
        anyhow::bail!(
            "{} is a folder without a config.json: --model takes a GGUF file or a Hugging Face \
             checkpoint folder (config.json, *.safetensors, tokenizer.json)",
            path.display()
        );
    }
    if !path.exists() {
        anyhow::bail!(
            "model file {} not found: {}",
            path.display(),
            setup_hint(path)
        );
    }
    Ok(())
}

/// Loads a command's model (`--model`, `--device`, `--runtime`) the one way every engine is built
/// ([`quarry_engine::ModelSpec`]), with the set-up hint where the file is missing or not a model.
pub(crate) fn load_model(path: &Path, device: &str, options: ModelOptions) -> Result<Loaded> {
    use quarry_engine::LoadError;
    check_exists(path)?;
    let spec = quarry_engine::ModelSpec {
        path: path.to_path_buf(),
        device: device.to_owned(),
        options,
    };
    let loaded = spec.load().map_err(|e| match e {
        LoadError::Model {
            source: source @ (ModelError::Device { .. } | ModelError::DeviceOpen { .. }),
            ..
        } => anyhow::Error::new(source),
        LoadError::Tokenizer {
            source: source @ (TokenizerError::Gguf { .. } | TokenizerError::Io { .. }),
            ..
        } => anyhow::anyhow!("{source}. To fix: {}", setup_hint(path)),
        other => anyhow::Error::new(other),
    })?;
    say_weights(&loaded.model);
    Ok(loaded)
}

/// How the projections are held and why, once on stderr at load: on a GPU always, on a CPU
/// where plain weights were quantized to Q8_0.
pub(crate) fn say_weights(model: &quarry_model::Llama) {
    if let Some(w) = model.gpu_weights() {
        eprintln!("{w}");
    }
    if let Some(w) = model.host_weights().filter(|w| w.q8_0) {
        eprintln!("{w}");
    }
}

/// A command's tokenizer: a GGUF file's, a checkpoint folder's, or a folder of tokenizer files
/// alone (`tokenizer.json` and its `tokenizer_config.json`: `tokenize`, `chat-template` and
/// `grammar` need no weights).
pub(crate) fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    if !(path.is_dir() && path.join("tokenizer.json").is_file()) {
        check_exists(path)?;
    }
    Tokenizer::from_model(path).map_err(|e| match e {
        TokenizerError::Gguf { .. } | TokenizerError::Io { .. } => {
            anyhow::anyhow!("{e}. To fix: {}", setup_hint(path))
        }
        other => anyhow::Error::new(other)
            .context(format!("loading the tokenizer of {}", path.display())),
    })
}

/// A JSON Schema file, with the documents its `$ref`s name (`--schema-resource`) embedded, read
/// as a job definition's `schema` and `schema_resources` are
/// ([`quarry_pipeline::extract::read_schema`]).
pub(crate) fn load_schema(path: &Path, resources: &[PathBuf]) -> Result<serde_json::Value> {
    let (schema, _) = quarry_pipeline::extract::read_schema(path, resources)?;
    Ok(schema)
}

fn load_info(path: &Path) -> Result<ModelInfo> {
    check_exists(path)?;
    ModelInfo::from_model(path).map_err(|e| match e {
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
    // Only for architectures quarry runs (the header of any other still reads).
    let gpu = quarry_model::Footprint::of_model(path).ok();
    let cpu = quarry_model::HostFootprint::of_model(path).ok();
    if json {
        let json = serde_json::json!({
            "path": path,
            "model": model,
            "gpu_weights": gpu,
            "cpu_weights": cpu,
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
    let format = match model.gguf_version {
        0 => "checkpoint folder, safetensors".to_string(),
        v => format!("GGUF v{v}"),
    };
    writeln!(
        out,
        "file            {} ({:.1} MiB, {format})",
        path.display(),
        model.file_bytes as f64 / 1048576.0,
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
    if let Some(g) = gpu {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        match g.quantized {
            0 => writeln!(
                out,
                "on a GPU        {:.2} GiB of weights (plain values: f32 as f32, bf16 and f16 \
                 as f16)",
                gib(g.with_f16())
            )?,
            _ => writeln!(
                out,
                "on a GPU        {:.2} GiB of weights with f16 copies (the default), {:.2} GiB \
                 quantized only",
                gib(g.with_f16()),
                gib(g.quantized_only())
            )?,
        }
    }
    if let Some(h) = cpu {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        match h.q8_0 < h.f32 {
            true => writeln!(
                out,
                "on a CPU        {:.2} GiB of weights (plain values in f32), {:.2} GiB with them \
                 quantized to Q8_0 at load",
                gib(h.f32),
                gib(h.q8_0)
            )?,
            false => writeln!(out, "on a CPU        {:.2} GiB of weights", gib(h.f32))?,
        }
    }
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
        "rope base       {}{} · rms eps {}",
        model.rope_freq_base.map_or("?".into(), |v| v.to_string()),
        model
            .rope_scaling
            .as_ref()
            .map(|s| format!(" · scaling: {s}"))
            .unwrap_or_default(),
        model
            .rms_norm_eps
            .map_or("?".into(), |v| format!("{v:.1e}"))
    )?;
    if let Some(w) = model.sliding_window {
        let layers = match (model.sliding_layers, model.block_count) {
            (Some(n), Some(all)) if n == all => "every layer".into(),
            (Some(n), Some(all)) => format!("{n} of {all} layers (the others see every position)"),
            _ => "its local layers".into(),
        };
        writeln!(
            out,
            "attention       a sliding window of {w} positions in {layers}"
        )?;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cli_page_states_the_exit_codes() {
        let page =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md"))
                .expect("docs/cli.md at the repository root");
        for line in EXIT_CODES.lines().skip(1) {
            assert!(
                page.contains(line.trim()),
                "docs/cli.md lacks the exit-code line {line:?}"
            );
        }
    }

    #[test]
    fn errors_are_one_line_with_a_hint() {
        let e = anyhow::Error::new(quarry_pipeline::PipelineError::Config {
            path: "job.toml".into(),
            message: "two lines\nof text".into(),
        });
        let line = error_line(&e);
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.starts_with("error: pipeline job.toml: two lines of text. Hint: "),
            "{line}"
        );
        // A typed error whose message quotes its source, in a context: each text once.
        let read = anyhow::Error::new(quarry_pipeline::PipelineError::Read {
            path: "grammar.gbnf".into(),
            source: std::io::Error::other("permission denied"),
        })
        .context("preparing the job");
        let line = error_line(&read);
        assert_eq!(line.matches("permission denied").count(), 1, "{line}");
        assert!(
            line.starts_with(
                "error: preparing the job: cannot read grammar.gbnf: permission denied. Hint: "
            ),
            "{line}"
        );
        let plain = error_line(&anyhow::anyhow!("model file x not found: run `make setup`"));
        assert_eq!(plain, "error: model file x not found: run `make setup`");
    }
}
