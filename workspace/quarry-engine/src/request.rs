//! What a caller asks for ([`Request`]) and what it gets back ([`Completion`]). All of it is plain
//! data (serde), so a job definition or a JSONL batch file can carry it; nothing here runs code.

use quarry_grammar::{Constraint, SchemaOptions};
use quarry_model::SamplingParams;
use quarry_tokenizer::ChatMessage;
use serde::{Deserialize, Serialize};

/// The text the model continues. In JSON: a string (text) or a list of `{"role", "content"}`
/// messages (chat).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Plain text, tokenized as it is (with the model's BOS where it uses one). Control-token text
    /// inside it stays text.
    Text(String),
    /// Chat messages rendered with the model's chat template, ending with the assistant prefix.
    Chat(Vec<ChatMessage>),
}

/// What the output must match. In JSON: `"none"`, `"json_object"`, `{"regex": "…"}`,
/// `{"choice": ["…"]}`, `{"json_schema": {…}}`, `{"grammar": "root ::= …"}` (GBNF) or
/// `{"lark": "start: …"}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConstraintSpec {
    /// Free text.
    #[default]
    None,
    /// The whole output matches this regex.
    Regex(String),
    /// The output is exactly one of these strings.
    Choice(Vec<String>),
    /// JSON that this JSON Schema accepts, laid out as [`crate::EngineConfig::schema_options`]
    /// says.
    JsonSchema(serde_json::Value),
    /// Any JSON object, its values nested to any depth, laid out the same way.
    JsonObject,
    /// A grammar in GBNF (llama.cpp's syntax), as text.
    Grammar(String),
    /// A grammar in Lark's syntax (llguidance's and Outlines'), as text.
    Lark(String),
}

impl ConstraintSpec {
    /// The grammar constraint, or `None` for free text.
    pub fn to_constraint(&self, options: SchemaOptions) -> Option<Constraint> {
        match self {
            ConstraintSpec::None => None,
            ConstraintSpec::Regex(r) => Some(Constraint::Regex(r.clone())),
            ConstraintSpec::Choice(c) => Some(Constraint::Choice(c.clone())),
            ConstraintSpec::JsonSchema(s) => Some(Constraint::JsonSchema {
                schema: s.clone(),
                options,
            }),
            ConstraintSpec::JsonObject => Some(Constraint::JsonObject {
                whitespace: options.whitespace,
            }),
            ConstraintSpec::Grammar(g) => Some(Constraint::Gbnf(g.clone())),
            ConstraintSpec::Lark(g) => Some(Constraint::Lark(g.clone())),
        }
    }

    /// A grammar file's constraint: Lark for a `.lark` file, GBNF otherwise
    /// ([`Constraint::grammar_file`]).
    pub fn grammar_file(path: &std::path::Path, text: String) -> Self {
        match Constraint::grammar_file(path, text) {
            Constraint::Lark(t) => ConstraintSpec::Lark(t),
            Constraint::Gbnf(t) => ConstraintSpec::Grammar(t),
            _ => unreachable!("a grammar file is GBNF or Lark"),
        }
    }
}

/// A built-in logit processor, configured by data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Processor {
    /// These token ids are never produced.
    DisallowTokens { ids: Vec<u32> },
    /// After `max_tokens` thinking tokens, force a newline and then the end-of-thinking marker.
    /// Needs a [`Reasoning`] mode.
    ThinkingBudget { max_tokens: usize },
    /// A token that would repeat an `n`-gram already present in the last `window` tokens is
    /// banned, unless it is in `whitelist`.
    NoRepeatNgram {
        n: usize,
        window: usize,
        #[serde(default)]
        whitelist: Vec<u32>,
    },
}

/// Reasoning mode: the model thinks in free text first; the constraint applies only after the
/// end-of-thinking marker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reasoning {
    /// The text that ends the thinking part (`</think>`).
    #[serde(default = "default_end_marker")]
    pub end_marker: String,
}

fn default_end_marker() -> String {
    "</think>".into()
}

impl Default for Reasoning {
    fn default() -> Self {
        Self {
            end_marker: default_end_marker(),
        }
    }
}

/// One extraction or generation request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub prompt: Prompt,
    #[serde(default)]
    pub constraint: ConstraintSpec,
    /// 0 is greedy.
    #[serde(default)]
    pub temperature: f32,
    /// Nucleus sampling mass; 1 keeps all.
    #[serde(default = "one")]
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    #[serde(default)]
    pub top_k: usize,
    /// Seed of the request's random stream.
    #[serde(default)]
    pub seed: u64,
    /// Most new tokens (forced ones included). A constrained output cut here is `length`, never
    /// valid.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    /// Generation stops before the first occurrence of any of these strings (free text and the
    /// thinking part; a constrained output ends where its constraint does).
    #[serde(default)]
    pub stop: Vec<String>,
    #[serde(default)]
    pub processors: Vec<Processor>,
    #[serde(default)]
    pub reasoning: Option<Reasoning>,
}

/// `max_tokens` when a request or a job definition leaves it out.
pub const DEFAULT_MAX_TOKENS: usize = 256;

fn default_max_tokens() -> usize {
    DEFAULT_MAX_TOKENS
}

fn one() -> f32 {
    1.0
}

impl Request {
    /// A greedy request for `prompt` with no constraint.
    pub fn new(prompt: Prompt) -> Self {
        Self {
            prompt,
            constraint: ConstraintSpec::None,
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
            max_tokens: default_max_tokens(),
            stop: Vec::new(),
            processors: Vec::new(),
            reasoning: None,
        }
    }

    pub fn text(prompt: impl Into<String>) -> Self {
        Self::new(Prompt::Text(prompt.into()))
    }

    pub fn with_constraint(mut self, c: ConstraintSpec) -> Self {
        self.constraint = c;
        self
    }

    pub fn with_max_tokens(mut self, n: usize) -> Self {
        self.max_tokens = n;
        self
    }

    pub fn with_sampling(mut self, s: SamplingParams) -> Self {
        self.temperature = s.temperature;
        self.top_p = s.top_p;
        self.top_k = s.top_k;
        self.seed = s.seed;
        self
    }

    /// The sampling parameters as the model's sampler takes them.
    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
        }
    }
}

/// Why a request ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "message")]
pub enum FinishReason {
    /// End of generation or a stop string (free text).
    Stop,
    /// `max_tokens` or the context ran out first. Under a constraint the output is truncated and
    /// must not be treated as valid.
    Length,
    /// The constraint is complete: its automaton accepts and the model ended (or nothing more
    /// could follow).
    ConstraintComplete,
    /// The constraint is complete, and the token budget shaped its end
    /// ([`crate::EngineConfig::close_within_budget`], `docs/budget.md`): a token the model
    /// chose was refused because no completion would have fitted after it, or the record was
    /// complete when `max_tokens` ran out. Valid like `ConstraintComplete`; counted apart so a
    /// user sees how many records the budget closed and can raise `max_tokens` where it matters.
    BudgetClosed,
    /// Refused before decoding: even the constraint's shortest record (`shortest` tokens) is
    /// longer than `max_tokens`.
    BudgetTooSmall { shortest: usize, max_tokens: usize },
    /// The request failed; the message says why (bad constraint, prompt too long, …).
    Error(String),
}

impl FinishReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ConstraintComplete => "constraint_complete",
            FinishReason::BudgetClosed => "budget_closed",
            FinishReason::BudgetTooSmall { .. } => "budget_too_small",
            FinishReason::Error(_) => "error",
        }
    }
}

/// Per-request counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestStats {
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: usize,
    /// Output tokens (sampled plus forced).
    pub output_tokens: usize,
    /// Output tokens appended by jump-forward or a processor without sampling.
    pub forced_tokens: usize,
    /// Tokens computed again after jump-forward re-tokenized a boundary.
    pub retokenized_tokens: usize,
    /// Forward passes this request took part in.
    pub forward_passes: usize,
    /// Seconds from submission to the first forward pass.
    pub queue_s: f64,
    /// Seconds from submission to the first sampled output token (time to first token).
    pub first_token_s: f64,
    /// Seconds from submission to the end.
    pub total_s: f64,
}

/// A finished request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// The id [`crate::Engine::submit`] returned.
    pub id: u64,
    /// The output after any thinking part (lossy UTF-8 where the bytes are not UTF-8).
    pub text: String,
    /// The thinking part, in reasoning mode.
    pub reasoning: Option<String>,
    /// Output token ids (thinking included).
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    pub stats: RequestStats,
}

impl Completion {
    /// The output is complete: its constraint accepted it, or free text ended normally.
    pub fn is_complete(&self) -> bool {
        matches!(
            self.finish,
            FinishReason::Stop | FinishReason::ConstraintComplete | FinishReason::BudgetClosed
        )
    }
}
