//! Requests into sequences: each prompt tokenized, each request validated, its constraint
//! compiled (or taken from the engine's cache).
//!
//! Tokenizing a chat prompt of a few hundred tokens takes most of a millisecond (the chat
//! template, then the tokenizer's pre-tokenizing regexes), half a small model's decode step on a
//! GPU. So a request [`Engine::submit`] queues is tokenized beside the next forward pass, on the
//! engine's thread (with the thread pool where more than two wait) while the device runs the pass
//! and the mask thread fills the masks, and joins the queue after it: a job that feeds documents
//! as others finish (the pipeline keeps twice the batch in flight) no longer stops the device to
//! tokenize them. Where that would leave the batch short (nothing running or waiting, so no pass
//! to hide behind, or free slots that only new requests can fill) the step tokenizes what it
//! needs first, on every core. [`Engine::run_batch`] tokenizes its requests on every core before
//! its first step.

use std::sync::Arc;
use std::time::Instant;

use quarry_grammar::{Grammar, Matcher};
use quarry_model::Sampler;
use quarry_tokenizer::{ChatVars, EncodeOptions, Tokenizer};
use rayon::prelude::*;

use super::Engine;
use crate::error::RequestError;
use crate::radix::ROOT;
use crate::request::{Processor, Prompt, Request, RequestStats};
use crate::sequence::{Phase, Sequence};

/// A request submitted and not yet tokenized.
pub(super) struct Pending {
    pub id: u64,
    pub req: Request,
    pub submitted: Instant,
}

/// A pending request with its prompt's tokens, tokenized beside a pass.
pub(super) type Encoded = (Pending, Result<Vec<u32>, RequestError>);

impl Engine {
    /// Before a step's admission: the requests tokenized beside the last pass join the queue, and
    /// pending ones are tokenized now where the step needs them (all of them when nothing runs or
    /// waits, so no pass would hide them; else as many as the batch has free slots that the queue
    /// cannot fill). The rest are tokenized beside the pass.
    pub(super) fn prepare_needed(&mut self) {
        self.queue_encoded();
        let need = if self.running.is_empty() && self.waiting.is_empty() {
            self.pending.len()
        } else {
            let free = self.cfg.max_running.saturating_sub(self.running.len());
            free.saturating_sub(self.waiting.len())
        };
        self.prepare_now(need);
    }

    /// Tokenizes the first `n` pending requests now, on every core, and queues them.
    pub(super) fn prepare_now(&mut self, n: usize) {
        let n = n.min(self.pending.len());
        if n == 0 {
            return;
        }
        let t = Instant::now();
        let batch: Vec<Pending> = self.pending.drain(..n).collect();
        let tokens = self.encode_all(&batch);
        self.stats.prompt_s += t.elapsed().as_secs_f64();
        for (p, tokens) in batch.into_iter().zip(tokens) {
            self.queue_prepared(p, tokens);
        }
    }

    /// The prompts of `batch`, tokenized on every core.
    pub(super) fn encode_all(&self, batch: &[Pending]) -> Vec<Result<Vec<u32>, RequestError>> {
        encode_all(&self.tok, &self.cfg.chat_vars, batch)
    }

    /// The requests tokenized beside the last pass, prepared and queued in the order submitted.
    pub(super) fn queue_encoded(&mut self) {
        for (p, tokens) in std::mem::take(&mut self.encoded) {
            self.queue_prepared(p, tokens);
        }
    }

    /// Queues the request for admission, or (one that cannot run) its completion with the error,
    /// returned by the step.
    fn queue_prepared(&mut self, p: Pending, tokens: Result<Vec<u32>, RequestError>) {
        let (id, submitted) = (p.id, p.submitted);
        match self.prepare(p, tokens) {
            Ok(seq) => self.waiting.push_back(seq),
            Err(e) => self.done.push(crate::request::Completion {
                id,
                text: String::new(),
                reasoning: None,
                tokens: Vec::new(),
                finish: e.finish(),
                stats: RequestStats {
                    total_s: submitted.elapsed().as_secs_f64(),
                    ..RequestStats::default()
                },
            }),
        }
    }

    /// Validates the request, with its prompt's tokens (or the error encoding it gave, reported
    /// in the same order as before: after the request's own parameters), and compiles its
    /// constraint.
    pub(super) fn prepare(
        &mut self,
        pending: Pending,
        tokens: Result<Vec<u32>, RequestError>,
    ) -> Result<Sequence, RequestError> {
        let Pending { id, req, submitted } = pending;
        let sampler = Sampler::new(req.sampling()).map_err(RequestError::Sampling)?;
        for p in &req.processors {
            match p {
                Processor::ThinkingBudget { .. } if req.reasoning.is_none() => {
                    return Err(RequestError::ThinkingBudgetWithoutReasoning)
                }
                Processor::NoRepeatNgram { n, window, .. } if *n == 0 || window < n => {
                    return Err(RequestError::NoRepeatNgram {
                        n: *n,
                        window: *window,
                    })
                }
                Processor::DisallowTokens { ids } => {
                    if let Some(id) = ids.iter().find(|&&i| i as usize >= self.vocab.len()) {
                        return Err(RequestError::TokenOutsideVocabulary {
                            id: *id,
                            vocab_size: self.vocab.len(),
                        });
                    }
                }
                _ => {}
            }
        }
        if let Some(r) = &req.reasoning {
            if r.end_marker.is_empty() {
                return Err(RequestError::EmptyEndMarker);
            }
        }
        let tokens = tokens?;
        let ctx = self.model.context_length();
        if tokens.len() >= ctx {
            return Err(RequestError::PromptOverContext {
                tokens: tokens.len(),
                context: ctx,
            });
        }
        if tokens.len() >= self.cfg.kv_tokens {
            return Err(RequestError::PromptOverPool {
                tokens: tokens.len(),
                pool: self.cfg.kv_tokens,
            });
        }
        if req.max_tokens == 0 {
            return Err(RequestError::ZeroMaxTokens);
        }
        let matcher = match req.constraint.to_constraint(self.cfg.schema_options) {
            None => None,
            Some(c) => Some(Matcher::with_capacity(
                self.grammar(&c).map_err(RequestError::Constraint)?,
                req.max_tokens,
            )),
        };
        // The tokens the end-of-thinking marker takes when it is forced ("\n" + marker).
        let marker_tokens = match (&req.reasoning, &matcher) {
            (Some(r), Some(_)) => self
                .tok
                .encode_with(
                    &format!("\n{}", r.end_marker),
                    EncodeOptions {
                        add_bos: false,
                        parse_special: true,
                    },
                )
                .map_or(0, |ids| ids.len()),
            _ => 0,
        };
        let budget = self.cfg.close_within_budget && matcher.is_some();
        if let Some(shortest) = matcher
            .as_ref()
            .filter(|_| budget)
            .and_then(|m| m.grammar().shortest_record())
        {
            // With reasoning, the answer follows at least one thinking token and the marker.
            let shortest = shortest + marker_tokens + usize::from(marker_tokens > 0);
            if shortest > req.max_tokens {
                return Err(RequestError::BudgetTooSmall {
                    shortest,
                    max_tokens: req.max_tokens,
                });
            }
        }
        let phase = if req.reasoning.is_some() {
            Phase::Thinking
        } else {
            Phase::Output
        };
        let prompt_len = tokens.len();
        Ok(Sequence {
            id,
            req,
            tokens,
            prompt_len,
            kv_len: 0,
            slots: Vec::new(),
            shared_len: 0,
            node: ROOT,
            matcher,
            sampler,
            phase,
            out_bytes: Vec::new(),
            answer_start: 0,
            constrained_from: prompt_len,
            thinking_tokens: 0,
            finish: None,
            drafts: 0,
            budget,
            budget_shaped: false,
            marker_tokens,
            stats: RequestStats {
                prompt_tokens: prompt_len,
                ..RequestStats::default()
            },
            submitted,
            started: None,
        })
    }

    /// The compiled grammar for `c`, shared by every request with the same constraint.
    fn grammar(
        &mut self,
        c: &quarry_grammar::Constraint,
    ) -> Result<Arc<Grammar>, quarry_grammar::GrammarError> {
        // A grammar that stopped growing at a limit refuses some valid continuations from then
        // on; new requests get a fresh one (sequences already running keep theirs). A grammar
        // with recursion meets new parser configurations for as long as a worker runs, so this
        // bounds its memory without ever failing a request that a fresh grammar would serve.
        let key = quarry_grammar::ConstraintKey::new(c);
        if let Some(g) = self.grammars.get(&key) {
            if g.overflow_error().is_none() {
                return Ok(g.clone());
            }
        }
        let g = Arc::new(Grammar::compile(c, self.vocab.clone(), self.cfg.limits)?);
        self.stats.grammars_compiled += 1;
        if g.is_empty_language() {
            return Err(quarry_grammar::GrammarError::EmptyLanguage);
        }
        if self.grammars.len() >= self.cfg.grammar_cache {
            self.grammars.clear();
        }
        self.grammars.insert(key, g.clone());
        Ok(g)
    }
}

/// The prompt's token ids; a chat rendered for a reply that thinks first (`thinking`) or not.
pub(super) fn encode_prompt(
    tok: &Tokenizer,
    chat_vars: &ChatVars,
    prompt: &Prompt,
    thinking: bool,
) -> Result<Vec<u32>, RequestError> {
    let (text, chat) = match prompt {
        Prompt::Text(t) => (t.clone(), false),
        Prompt::Chat(messages) => (
            tok.apply_chat_template_with(messages, true, &chat_vars.for_reply(thinking))
                .map_err(RequestError::ChatTemplate)?,
            true,
        ),
    };
    let tokens = if chat {
        tok.encode_chat(&text)
    } else {
        tok.encode_with(
            &text,
            EncodeOptions {
                add_bos: tok.add_bos_by_default(),
                parse_special: false,
            },
        )
    }
    .map_err(RequestError::Tokenize)?;
    if tokens.is_empty() {
        return Err(RequestError::EmptyPrompt);
    }
    Ok(tokens)
}

/// The prompts of `batch`: one after another for a few (handing them to the thread pool costs
/// more than it saves), else on every core.
pub(super) fn encode_all(
    tok: &Tokenizer,
    chat_vars: &ChatVars,
    batch: &[Pending],
) -> Vec<Result<Vec<u32>, RequestError>> {
    let encode =
        |p: &Pending| encode_prompt(tok, chat_vars, &p.req.prompt, p.req.reasoning.is_some());
    if batch.len() > SERIAL_PROMPTS {
        batch.par_iter().map(encode).collect()
    } else {
        batch.iter().map(encode).collect()
    }
}

/// Prompts tokenized one after another, on the calling thread; more go to the thread pool.
const SERIAL_PROMPTS: usize = 2;
