//! From documents to validated outcomes: the prompt template, the engine behind the
//! [`Extractor`] trait, and the JSON Schema validator that decides accepted or rejected.
//!
//! The job loops only see [`Extractor`]: `submit` documents, `step` until they come back. The real
//! one is [`EngineExtractor`]; unit tests of the loops use a fake.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use minijinja::Environment;
use quarry_engine::{
    ConstraintSpec, Engine, EngineConfig, EngineStats, FinishReason, LoadError, Model, Prompt,
    Request, SizeError,
};
use quarry_tokenizer::{ChatMessage, ChatVars, Tokenizer};
use serde_json::Value;

use crate::config::{PipelineConfig, PromptConfig, SamplingConfig};
use crate::error::{PipelineError, SchemaProblem};
use crate::record::{DocStats, Document, Outcome, RejectCause};

/// What the model produced for one document, before validation.
#[derive(Debug, Clone)]
pub struct Generated {
    pub text: String,
    pub finish: FinishReason,
    pub stats: DocStats,
}

/// Runs documents through a model, many at a time.
pub trait Extractor {
    /// Queues a document under `key`. A document that cannot become a request (its template
    /// fails) is refused with the cause, and nothing is queued.
    fn submit(&mut self, key: u64, doc: &Document) -> Result<(), RejectCause>;
    /// Advances all queued work by one step and returns what finished.
    fn step(&mut self) -> Result<Vec<(u64, Generated)>, PipelineError>;
    /// Documents submitted and not yet returned.
    fn in_flight(&self) -> usize;
    /// Documents worth keeping queued (more only adds latency).
    fn capacity(&self) -> usize;
    /// Engine counters for metrics and summaries.
    fn engine_stats(&self) -> Option<EngineStats> {
        None
    }
}

/// Renders a document into the prompt the model sees.
pub struct PromptBuilder {
    env: Environment<'static>,
    system: Option<String>,
    chat: bool,
    chat_vars: ChatVars,
    /// Control-token spellings (`<|im_start|>`, ...) defused in document text, so a document can
    /// never inject a turn into the chat template.
    specials: Vec<String>,
}

impl PromptBuilder {
    pub fn new(cfg: &PromptConfig, tokenizer: Option<&Tokenizer>) -> Result<Self, PipelineError> {
        let mut env = Environment::new();
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        env.add_template_owned("prompt", cfg.template.clone())
            .map_err(PipelineError::Template)?;
        let mut specials: Vec<String> = tokenizer
            .map(|t| {
                t.token_table()
                    .iter()
                    .filter(|(_, _, kind)| kind.is_special())
                    .filter_map(|(_, bytes, _)| std::str::from_utf8(bytes).ok())
                    .filter(|s| s.chars().count() >= 2)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        specials.sort_by_key(|s| std::cmp::Reverse(s.len()));
        let builder = Self {
            env,
            system: cfg.system.clone(),
            chat: cfg.chat,
            chat_vars: cfg.chat_vars.for_reply(false),
            specials,
        };
        if let (true, Some(t)) = (cfg.chat, tokenizer) {
            builder.check_turns(t)?;
        }
        Ok(builder)
    }

    /// The model's chat template renders the job's turns (its system message, a user message),
    /// or the job stops with what to change: a template that refuses them (Mistral 7B v0.1's and
    /// v0.2's take no system message) would reject every document.
    fn check_turns(&self, tokenizer: &Tokenizer) -> Result<(), PipelineError> {
        let turns = self.turns("the document".into());
        let Err(e) = tokenizer.apply_chat_template_with(&turns, true, &self.chat_vars) else {
            return Ok(());
        };
        const SET_CHAT_OFF: &str =
            "set `chat = false` and write the whole prompt in `prompt.template`";
        let (problem, fix) = match (e, &self.system) {
            (quarry_tokenizer::TokenizerError::NoChatTemplate, _) => {
                ("the model has no chat template".to_string(), SET_CHAT_OFF)
            }
            (e, Some(_)) => (
                format!("the model's template refuses a system message and a user message: {e}"),
                "if it takes no system message, drop `prompt.system` and put its text in \
                 `prompt.template`",
            ),
            (e, None) => (
                format!("the model's template refuses a user message: {e}"),
                SET_CHAT_OFF,
            ),
        };
        Err(PipelineError::ChatTurns { problem, fix })
    }

    /// The chat turns around the rendered user message.
    fn turns(&self, user: String) -> Vec<ChatMessage> {
        let mut messages = Vec::with_capacity(2);
        if let Some(s) = &self.system {
            messages.push(ChatMessage::new("system", s.clone()));
        }
        messages.push(ChatMessage::new("user", user));
        messages
    }

    /// `text` with every control-token spelling broken by a zero-width space after its first
    /// character.
    pub fn defuse(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in &self.specials {
            if out.contains(s.as_str()) {
                let mut chars = s.chars();
                let first = chars.next().expect("specials have two chars or more");
                out = out.replace(s.as_str(), &format!("{first}\u{200b}{}", chars.as_str()));
            }
        }
        out
    }

    fn defuse_value(&self, v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(self.defuse(s)),
            Value::Array(a) => Value::Array(a.iter().map(|x| self.defuse_value(x)).collect()),
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, x)| (k.clone(), self.defuse_value(x)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    pub fn build(&self, doc: &Document) -> Result<Prompt, RejectCause> {
        let fields = self.defuse_value(&Value::Object(doc.fields.clone()));
        let user = self
            .env
            .get_template("prompt")
            .and_then(|t| {
                t.render(minijinja::context! {
                    text => self.defuse(&doc.text),
                    id => doc.id.clone(),
                    doc => minijinja::Value::from(minijinja::value::Serde(&fields)),
                })
            })
            .map_err(|e| RejectCause::Template(format!("{e:#}")))?;
        if !self.chat {
            return Ok(Prompt::Text(user));
        }
        Ok(Prompt::Chat(self.turns(user)))
    }
}

/// Decides accepted or rejected: parse, then validate with the `jsonschema` crate.
pub struct Validator {
    compiled: jsonschema::Validator,
}

impl Validator {
    pub fn new(schema: &Value, origin: &str) -> Result<Self, PipelineError> {
        let compiled = jsonschema::validator_for(schema).map_err(|e| PipelineError::Schema {
            path: origin.to_string(),
            source: SchemaProblem::Validator(Box::new(e)),
        })?;
        Ok(Self { compiled })
    }

    pub fn judge(&self, g: Generated) -> Outcome {
        let reject = |cause| Outcome::Rejected {
            cause,
            raw_output: Some(g.text.clone()),
            finish: Some(g.finish.as_str().to_string()),
            stats: g.stats,
        };
        match &g.finish {
            FinishReason::Error(e) => return reject(RejectCause::Engine(e.clone())),
            FinishReason::Length => return reject(RejectCause::Truncated),
            FinishReason::BudgetTooSmall {
                shortest,
                max_tokens,
            } => {
                return reject(RejectCause::BudgetTooSmall {
                    shortest: *shortest,
                    max_tokens: *max_tokens,
                })
            }
            FinishReason::Stop | FinishReason::ConstraintComplete | FinishReason::BudgetClosed => {}
        }
        let value: Value = match serde_json::from_str(&g.text) {
            Ok(v) => v,
            Err(e) => return reject(RejectCause::InvalidJson(e.to_string())),
        };
        if let Some(err) = self.compiled.iter_errors(&value).next() {
            let at = err.instance_path().to_string();
            let at = if at.is_empty() { "/".to_string() } else { at };
            return reject(RejectCause::SchemaViolation(format!("at {at}: {err}")));
        }
        Outcome::Accepted {
            record: value.to_string().into_boxed_str(),
            finish: g.finish.as_str().to_string(),
            stats: g.stats,
        }
    }
}

/// The real extractor: quarry's engine with the job's schema (or grammar) as the constraint.
pub struct EngineExtractor {
    engine: Engine,
    prompts: PromptBuilder,
    constraint: ConstraintSpec,
    sampling: SamplingConfig,
    keys: HashMap<u64, u64>,
    max_running: usize,
}

impl EngineExtractor {
    /// Loads the job's model and tokenizer ([`PipelineConfig::model_spec`]) and starts an engine.
    pub fn load(cfg: &PipelineConfig, schema: &Value) -> Result<Self, PipelineError> {
        let loaded = cfg.model_spec().load().map_err(|e| match e {
            LoadError::Model { path, source } => PipelineError::Model { path, source },
            LoadError::Tokenizer { path, source } => PipelineError::Tokenizer { path, source },
        })?;
        // On a GPU, the projections' form, once: a warning where the f16 copies did not fit.
        match loaded.model.gpu_weights() {
            Some(w) if w.fell_back => tracing::warn!("{w}"),
            Some(w) => tracing::info!("{w}"),
            None => {}
        }
        // On a CPU, plain weights quantized to Q8_0: a warning where f32 did not fit.
        match loaded.model.host_weights() {
            Some(w) if w.fell_back => tracing::warn!("{w}"),
            Some(w) if w.q8_0 => tracing::info!("{w}"),
            _ => {}
        }
        // The KV pool and the pass's size for the device: on a GPU, what its free memory holds
        // now that the weights are in, as `quarry bench` sizes it.
        let b = &cfg.batching;
        let sizes = loaded
            .batch_sizes(b.max_running, b.kv_tokens, b.step_tokens)
            .map_err(|e| match e {
                SizeError::Device(source) => PipelineError::Model {
                    path: cfg.model_path().display().to_string(),
                    source,
                },
                e => PipelineError::Config {
                    path: cfg.name.clone(),
                    message: format!("batching: {e}"),
                },
            })?;
        // Said on a GPU, where the pool takes what its memory holds; a CPU's is the default.
        if sizes.gpu_capacity.is_some() {
            tracing::info!("{sizes}");
        } else {
            tracing::debug!("{sizes}");
        }
        let ecfg = EngineConfig {
            max_running: cfg.batching.max_running,
            step_tokens: sizes.step_tokens,
            kv_tokens: sizes.kv_tokens,
            close_within_budget: cfg.sampling.close_within_budget,
            ..EngineConfig::default()
        };
        Self::new(loaded.model, loaded.tokenizer, ecfg, cfg, schema)
    }

    /// An extractor over `model` (the real one, or any other behind the engine's [`Model`] seam).
    pub fn new<M: Model + 'static>(
        model: Arc<M>,
        tok: Arc<Tokenizer>,
        mut ecfg: EngineConfig,
        cfg: &PipelineConfig,
        schema: &Value,
    ) -> Result<Self, PipelineError> {
        let max_running = ecfg.max_running;
        // The flow never holds more than `capacity()` documents in the engine, so with a queue at
        // least that long the engine's backpressure error (`QueueFull`) cannot happen: the flow's
        // own limit is the backpressure, and no document becomes an `engine_error` for it.
        ecfg.max_waiting = ecfg.max_waiting.max(2 * max_running);
        ecfg.schema_options.whitespace = cfg.whitespace;
        ecfg.chat_vars = cfg.prompt.chat_vars.clone();
        let prompts = PromptBuilder::new(&cfg.prompt, Some(&tok))?;
        let constraint = match cfg.grammar_path() {
            Some(path) => ConstraintSpec::grammar_file(
                &path,
                std::fs::read_to_string(&path).map_err(|source| PipelineError::Read {
                    path: path.display().to_string(),
                    source,
                })?,
            ),
            None => ConstraintSpec::JsonSchema(schema.clone()),
        };
        let (options, limits) = (ecfg.schema_options, ecfg.limits);
        let engine = Engine::new(model, tok, ecfg)?;
        // Compile the constraint once now: a schema or grammar quarry cannot use stops the job
        // with its error here, instead of rejecting every document for it.
        if let Some(c) = constraint.to_constraint(options) {
            quarry_grammar::Grammar::compile(&c, engine.vocabulary().clone(), limits).map_err(
                |e| match cfg.grammar_path() {
                    Some(path) => PipelineError::Grammar {
                        path: path.display().to_string(),
                        source: e,
                    },
                    None => PipelineError::Schema {
                        path: cfg.schema_path().display().to_string(),
                        source: SchemaProblem::Constraint(e),
                    },
                },
            )?;
        }
        Ok(Self {
            engine,
            prompts,
            constraint,
            sampling: cfg.sampling.clone(),
            keys: HashMap::new(),
            max_running,
        })
    }

    fn seed(&self, doc: &Document) -> u64 {
        // FNV-1a over the lineage: the same document draws the same on every rerun.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ self.sampling.seed;
        let l = &doc.lineage;
        let tail = [l.partition.unwrap_or(-1) as i64, l.offset];
        for b in l
            .source
            .bytes()
            .chain(tail.iter().flat_map(|x| x.to_le_bytes()))
        {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        h
    }
}

impl Extractor for EngineExtractor {
    fn submit(&mut self, key: u64, doc: &Document) -> Result<(), RejectCause> {
        let prompt = self.prompts.build(doc)?;
        let s = &self.sampling;
        let params = quarry_model::SamplingParams {
            seed: self.seed(doc),
            ..s.params()
        };
        let req = Request::new(prompt)
            .with_constraint(self.constraint.clone())
            .with_sampling(params)
            .with_max_tokens(s.max_tokens);
        let id = self
            .engine
            .submit(req)
            .map_err(|e| RejectCause::Engine(e.to_string()))?;
        self.keys.insert(id, key);
        Ok(())
    }

    fn step(&mut self) -> Result<Vec<(u64, Generated)>, PipelineError> {
        let done = self.engine.step()?;
        Ok(done
            .into_iter()
            .filter_map(|c| {
                let key = self.keys.remove(&c.id)?;
                let stats = DocStats {
                    prompt_tokens: c.stats.prompt_tokens as u64,
                    cached_tokens: c.stats.cached_tokens as u64,
                    output_tokens: c.stats.output_tokens as u64,
                    forced_tokens: c.stats.forced_tokens as u64,
                };
                Some((
                    key,
                    Generated {
                        text: c.text,
                        finish: c.finish,
                        stats,
                    },
                ))
            })
            .collect())
    }

    fn in_flight(&self) -> usize {
        self.keys.len()
    }

    fn capacity(&self) -> usize {
        // Enough waiting to refill every slot as sequences finish (and within `max_waiting`, see
        // `new`).
        self.max_running * 2
    }

    fn engine_stats(&self) -> Option<EngineStats> {
        Some(self.engine.stats())
    }
}

/// The SHA-256 of the schema file's bytes, hex (the `_schema_sha256` column); with
/// `schema_resources`, of the schema's bytes followed by each resource's, in the order listed.
pub fn schema_sha256(bytes: &[u8]) -> String {
    schema_sha256_of(&[bytes])
}

fn schema_sha256_of(parts: &[&[u8]]) -> String {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    for p in parts {
        hasher.update(p);
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Reads and parses the job's schema, with the documents its references name embedded
/// ([`quarry_grammar::schema::bundle`]; each resource is known by its file's URL and its own
/// `$id`, and the schema's references resolve against its file's URL). The error names the
/// file.
pub fn read_schema(path: &Path, resources: &[PathBuf]) -> Result<(Value, String), PipelineError> {
    let read = |p: &Path| -> Result<(String, Vec<u8>, Value), PipelineError> {
        let err = |source: SchemaProblem| PipelineError::Schema {
            path: p.display().to_string(),
            source,
        };
        let bytes = std::fs::read(p).map_err(|e| err(SchemaProblem::Read(e)))?;
        let value = serde_json::from_slice(&bytes).map_err(|e| err(SchemaProblem::Json(e)))?;
        let url = std::fs::canonicalize(p)
            .ok()
            .and_then(|abs| url::Url::from_file_path(abs).ok())
            .ok_or_else(|| err(SchemaProblem::NoFileUrl))?;
        Ok((url.into(), bytes, value))
    };
    let (base, bytes, value) = read(path)?;
    if resources.is_empty() {
        return Ok((value, schema_sha256(&bytes)));
    }
    let docs = resources
        .iter()
        .map(|p| read(p))
        .collect::<Result<Vec<_>, _>>()?;
    let given: Vec<(String, Value)> = docs
        .iter()
        .map(|(u, _, v)| (u.clone(), v.clone()))
        .collect();
    let bundled = quarry_grammar::schema::bundle(&value, Some(&base), &given).map_err(|e| {
        PipelineError::Schema {
            path: path.display().to_string(),
            source: e.into(),
        }
    })?;
    let mut parts: Vec<&[u8]> = vec![&bytes];
    parts.extend(docs.iter().map(|(_, b, _)| b.as_slice()));
    Ok((bundled, schema_sha256_of(&parts)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Lineage;

    #[test]
    fn schema_resources_are_embedded_for_validation_and_hashed() {
        let dir = std::env::temp_dir().join(format!("quarry-read-schema-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (main, common) = (dir.join("job.json"), dir.join("common.json"));
        let main_text =
            r#"{"type": "object", "properties": {"n": {"$ref": "common.json#/$defs/n"}}}"#;
        std::fs::write(&main, main_text).unwrap();
        std::fs::write(&common, r#"{"$defs": {"n": {"type": "integer"}}}"#).unwrap();
        let (schema, sha) = read_schema(&main, std::slice::from_ref(&common)).unwrap();
        let v = Validator::new(&schema, "job.json").unwrap();
        assert!(v.compiled.is_valid(&serde_json::json!({"n": 3})));
        assert!(!v.compiled.is_valid(&serde_json::json!({"n": "x"})));
        // The hash covers the resource: changing it changes the hash.
        let (_, alone) = read_schema(&main, &[]).unwrap();
        assert_eq!(alone, schema_sha256(main_text.as_bytes()));
        assert_ne!(sha, alone);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn doc(text: &str) -> Document {
        Document {
            id: "d1".into(),
            text: text.into(),
            fields: serde_json::json!({"title": "T"})
                .as_object()
                .unwrap()
                .clone(),
            lineage: Lineage::new("s", None, 0),
        }
    }

    #[test]
    fn templates_see_text_id_and_fields_and_fail_per_document() {
        let cfg = PromptConfig {
            template: "[{{ id }}] {{ doc.title }}: {{ text }}".into(),
            system: Some("sys".into()),
            chat: false,
            chat_vars: ChatVars::default(),
        };
        let b = PromptBuilder::new(&cfg, None).unwrap();
        assert_eq!(
            b.build(&doc("hello")).unwrap(),
            Prompt::Text("[d1] T: hello".into())
        );
        let cfg = PromptConfig {
            template: "{{ doc.missing.deeper }}".into(),
            system: None,
            chat: true,
            chat_vars: ChatVars::default(),
        };
        let err = PromptBuilder::new(&cfg, None)
            .unwrap()
            .build(&doc("x"))
            .unwrap_err();
        assert_eq!(err.name(), "template");
    }

    #[test]
    fn validator_sorts_outputs() {
        let v = Validator::new(
            &serde_json::json!({"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}}),
            "t",
        )
        .unwrap();
        let g = |text: &str, finish| Generated {
            text: text.into(),
            finish,
            stats: DocStats::default(),
        };
        let cause = |o: Outcome| match o {
            Outcome::Rejected { cause, .. } => cause.name(),
            Outcome::Accepted { .. } => "accepted",
            Outcome::Skipped { .. } => "skipped",
        };
        assert_eq!(
            cause(v.judge(g(r#"{"a":1}"#, FinishReason::ConstraintComplete))),
            "accepted"
        );
        assert_eq!(
            cause(v.judge(g(r#"{"a":"#, FinishReason::Length))),
            "truncated"
        );
        assert_eq!(
            cause(v.judge(g(r#"{"a":"x"}"#, FinishReason::Stop))),
            "schema_violation"
        );
        assert_eq!(
            cause(v.judge(g("nope", FinishReason::Stop))),
            "invalid_json"
        );
        assert_eq!(
            cause(v.judge(g("", FinishReason::Error("too long".into())))),
            "engine_error"
        );
    }
}
