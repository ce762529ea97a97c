//! The engine: admission, the per-step batch, the forward pass with masks filled alongside it,
//! sampling, and returning pages to the radix cache. Requests become sequences in `prepare`.

mod prepare;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use quarry_grammar::{Grammar, Limits, Matcher, SchemaOptions, Vocabulary};
use quarry_model::{Logits, PageId, SeqInput};

use self::prepare::{Encoded, Pending};
use crate::error::RequestError;
use crate::model::{Draws, LentPool, Model};
use quarry_tokenizer::{ChatVars, Tokenizer};
use rayon::prelude::*;
use rustc_hash::FxHashMap;

use crate::error::EngineError;
use crate::logits::processor_bans;
use crate::radix::{RadixCache, ROOT};
use crate::request::{Completion, FinishReason, Request, RequestStats};
use crate::sequence::{OverBudget, Phase, Sequence, TokenCtx, Took};
use crate::stats::EngineStats;

/// Positions a page of the engine's KV pool holds: one, so that the radix cache shares a prefix
/// to the token. What a GPU's free memory holds is read for this page size
/// ([`crate::Loaded::batch_sizes`]).
pub const KV_PAGE_SIZE: usize = 1;

/// Engine settings. The defaults suit the CPU and SmolLM2; see the configuration reference in docs/pipelines.md.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// KV pool capacity in token positions (the radix cache lives in it too).
    pub kv_tokens: usize,
    /// Sequences decoding at once.
    pub max_running: usize,
    /// Tokens per forward pass: decodes first, then prefill chunks fill the rest.
    pub step_tokens: usize,
    /// Requests waiting for admission; [`Engine::submit`] refuses more (backpressure).
    pub max_waiting: usize,
    /// Reuse KV across requests through the radix prefix cache.
    pub radix_cache: bool,
    /// Append forced bytes without sampling.
    pub jump_forward: bool,
    /// Output tokens re-encoded with the forced bytes at a jump-forward boundary.
    pub retokenize: usize,
    /// Which trailing tokens of that encoding are left for the model, because a following token
    /// could merge with them.
    pub keep_back_rule: KeepBack,
    /// Trailing tokens left for the model under [`KeepBack::Count`], and under
    /// [`KeepBack::Settled`] where the tokenizer knows no settled prefix. Default 1: on the engine
    /// benchmark (50 documents, compact JSON) it gave byte-identical outputs to 2 on both SmolLM2
    /// and Qwen2.5 while forcing more (SmolLM2 10.4% of output tokens against 5.7%, Qwen2.5 5.8%
    /// against 1.0%; BENCHMARKS.md, 2026-11-24). 0 forces the most but costs facts (SmolLM2 22.3%
    /// against 29.7%).
    pub keep_back: usize,
    /// Append the kept-back tokens anyway, as drafts, and let the next forward pass verify them:
    /// it returns logits at the position before each draft too, the engine samples there under
    /// the constraint, and a draft stays only if that sample is the draft itself. A confirmed draft
    /// costs no pass of its own; a refused one is replaced by the model's token, as if it had been
    /// kept back. With the same sampler draws in the same order, the output is the one keep-back
    /// alone gives (greedy: byte for byte), with fewer forward passes.
    pub draft_kept_back: bool,
    /// Records that always close (`docs/budget.md`): a constrained sequence takes only tokens
    /// after which a completion of its constraint still fits in what is left of `max_tokens`
    /// (a drawn token that does not fit is drawn again from those that do), so no constrained
    /// output ends cut at `max_tokens`; a request whose shortest record is longer than
    /// `max_tokens` is refused before decoding (`budget_too_small`). Records whose end the
    /// budget shaped finish `budget_closed`. Default on. Off: outputs may end cut (`length`),
    /// as in every other engine.
    pub close_within_budget: bool,
    /// Compiled constraints kept for reuse.
    pub grammar_cache: usize,
    /// How JSON Schemas become constraints. The layout defaults to `pretty:1` (the model writes
    /// its own spacing: at most one whitespace byte around each structural character), where
    /// the grammar library's default is compact: on 50 package records Qwen2.5-Coder 0.5B got
    /// 97.3% of the facts right against 93.3% in compact JSON, the 1.5B 99.3% against 95.7%; only
    /// SmolLM2-135M did better compact (36.3% against 28.3%). BENCHMARKS.md, 2026-11-28.
    #[serde(skip)]
    pub schema_options: SchemaOptions,
    #[serde(skip)]
    pub limits: Limits,
    /// Variables chat prompts are rendered with ([`ChatVars`]); `enable_thinking`, where they
    /// leave it out, is whether the request has a reasoning mode.
    pub chat_vars: ChatVars,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            kv_tokens: 16_384,
            max_running: 32,
            step_tokens: 512,
            max_waiting: 4096,
            radix_cache: true,
            jump_forward: true,
            retokenize: 2,
            keep_back_rule: KeepBack::Count,
            keep_back: 1,
            draft_kept_back: true,
            close_within_budget: true,
            grammar_cache: 64,
            schema_options: SchemaOptions {
                whitespace: quarry_grammar::Whitespace::Pretty { max_run: 1 },
                ..SchemaOptions::default()
            },
            limits: Limits::default(),
            chat_vars: ChatVars::default(),
        }
    }
}

/// How jump-forward chooses the trailing tokens it leaves for the model.
///
/// Measured on the engine benchmark (SmolLM2, compact JSON; BENCHMARKS.md, 2026-11-24): `Settled`
/// forces more tokens (6.8% against 5.7% of the output) but completes 16 of 50 documents against
/// `Count`'s 40, because canonical tokens are not the ones this model writes: it prefers `":` then
/// `"` (what `": "` in its training text tokenizes to) over the canonical `":"`, and loops more
/// often when handed the latter. So `Count` is the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeepBack {
    /// Always keep back [`EngineConfig::keep_back`] tokens, so the model writes the tail of every
    /// forced run itself (llguidance advises ≥ 2 against non-canonical tokenizations; 1 gave
    /// identical outputs on both benchmark models, see [`EngineConfig::keep_back`]).
    #[default]
    Count,
    /// Commit every token of the settled prefix ([`Tokenizer::settled_len`]): only the last
    /// pre-token, and only when a byte the constraint allows next could join it, waits for the
    /// model. The committed tokens are exactly the tokenizer's canonical ones, and nothing more is
    /// held back. Tokenizers without a settled prefix (SentencePiece-style BPE) keep back
    /// [`EngineConfig::keep_back`] tokens.
    Settled,
}

/// Continuous-batching extraction engine over one model.
pub struct Engine {
    model: Arc<dyn Model>,
    tok: Arc<Tokenizer>,
    vocab: Arc<Vocabulary>,
    cfg: EngineConfig,
    /// Given back to the model when the engine drops ([`Model::give_back_pool`]).
    pool: LentPool,
    cache: RadixCache,
    /// Compiled grammars by constraint (compared structurally, schema values included).
    grammars: FxHashMap<quarry_grammar::ConstraintKey, Arc<Grammar>>,
    /// Requests submitted and not yet tokenized ([`prepare`]: beside the next pass), and those
    /// tokenized beside the last pass, queued before the next admission.
    pending: VecDeque<Pending>,
    encoded: Vec<Encoded>,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    done: Vec<Completion>,
    logits: Logits,
    masks: Vec<u32>,
    /// How many of the step's masks are sequences' own (the drafts' follow them).
    regular_masks: usize,
    /// The sequences whose drafts this step's draws verify, and their samplers' stream positions
    /// before each draft row's uniform (and after the last).
    checks: Vec<DraftCheck>,
    draft_positions: Vec<u128>,
    /// Which of the step's draws are taken (those of draft rows, and a refused draft's last row,
    /// are not).
    draw_used: Vec<bool>,
    /// The step's draws as the model takes them ([`Model::sample`]) and the running sequence
    /// each is for: kept across steps.
    draws: Draws,
    draw_seqs: Vec<usize>,
    /// Per running sequence, the draw it takes this step, if any.
    taken: Vec<Option<usize>>,
    /// The budget's draws again ([`Engine::redraw_over_budget`]) and their masks: kept across
    /// steps.
    redraw: Draws,
    redraw_masks: Vec<u32>,
    /// Per regular mask of the step, the tokens that fit the budget, filled beside the pass
    /// where the budget is tight ([`MaskJob`]), and `(tokens left, tokens kept)` where it was;
    /// per running sequence, its regular mask's row this step.
    fit_masks: Vec<u32>,
    fit_kept: Vec<Option<(usize, usize)>>,
    fit_row: Vec<Option<usize>>,
    /// Per running sequence, whether the take refused its draw this step (it does not fit the
    /// budget): drawn again.
    over_budget: Vec<bool>,
    bans: Vec<u32>,
    freed: Vec<PageId>,
    next_id: u64,
    stats: EngineStats,
}

/// One sequence's masks for a step, filled beside the forward pass: its own (the matcher's state
/// now) and, for its drafts, the state before each (rolled back, then each draft accepted again).
struct MaskJob<'a> {
    matcher: &'a mut Matcher,
    mask: &'a mut [u32],
    drafts: &'a [u32],
    draft_masks: &'a mut [u32],
    /// With the budget on and no drafts: the tokens left, and where to put the tokens that fit.
    fit: Option<FitJob<'a>>,
}

/// The budget's mask for a draw again, filled ahead ([`MaskJob::fill`]).
struct FitJob<'a> {
    left: usize,
    mask: &'a mut [u32],
    kept: &'a mut Option<(usize, usize)>,
}

impl MaskJob<'_> {
    fn fill(&mut self, words: usize, budget: bool) {
        self.matcher.fill_mask(self.mask);
        if budget {
            // The budget's check after the draw looks up the completions of the states ahead:
            // computing this state's (and the chain it walks) here keeps that off the step.
            let need = self.matcher.completion_len();
            // Where the tokens left are no more than the state's shortest completion, only tokens
            // on a shortest completion fit, and a draw is refused unless it is one: almost every
            // draw again happens there (BENCHMARKS.md, *Records that always close*). The tokens
            // that fit are kept here, beside the pass, so that a draw again does not walk them
            // while the device waits. Where the budget is looser, a draw again walks as before.
            if let (Some(fit), Some(need)) = (self.fit.as_mut(), need) {
                if fit.left <= need {
                    fit.mask.copy_from_slice(self.mask);
                    let kept = self.matcher.retain_fitting(fit.mask, fit.left);
                    *fit.kept = Some((fit.left, kept));
                }
            }
        }
        if self.drafts.is_empty() {
            return;
        }
        self.matcher.rollback(self.drafts.len());
        for (&t, mask) in self.drafts.iter().zip(self.draft_masks.chunks_mut(words)) {
            self.matcher.fill_mask(mask);
            self.matcher.accept_token(t).expect("accepted as a draft");
        }
    }
}

/// What one sequence contributes to a step.
#[derive(Clone, Copy)]
struct Slot {
    seq: usize,
    tokens: usize,
    /// The chunk reaches the end of the sequence, so a token is chosen after it.
    samples: bool,
}

impl Engine {
    /// An engine for `model` (a [`quarry_model::Llama`], or any [`Model`]), whose tokenizer is
    /// `tok`.
    pub fn new<M: Model + 'static>(
        model: Arc<M>,
        tok: Arc<Tokenizer>,
        cfg: EngineConfig,
    ) -> Result<Self, EngineError> {
        if cfg.max_running == 0 || cfg.step_tokens == 0 || cfg.kv_tokens == 0 {
            return Err(EngineError::Config(
                "kv_tokens, max_running and step_tokens must be positive".into(),
            ));
        }
        if cfg.step_tokens < cfg.max_running {
            return Err(EngineError::Config(format!(
                "step_tokens ({}) must be at least max_running ({}): every running sequence decodes each step",
                cfg.step_tokens, cfg.max_running
            )));
        }
        let vocab = crate::grammar_vocabulary(&tok);
        let model: Arc<dyn Model> = model;
        let pool = LentPool::new(
            model.clone(),
            model.kv_pool(KV_PAGE_SIZE, cfg.kv_tokens / KV_PAGE_SIZE)?,
        );
        // On a GPU the logits may stay there: the step's draws happen on the device
        // (Model::sample) and one token per row comes back.
        let mut logits = Logits::new();
        logits.keep_on_device(true);
        Ok(Self {
            model,
            tok,
            vocab,
            pool,
            cache: RadixCache::new(),
            grammars: FxHashMap::default(),
            pending: VecDeque::new(),
            encoded: Vec::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            done: Vec::new(),
            logits,
            masks: Vec::new(),
            regular_masks: 0,
            checks: Vec::new(),
            draft_positions: Vec::new(),
            draw_used: Vec::new(),
            draws: Draws::default(),
            draw_seqs: Vec::new(),
            taken: Vec::new(),
            redraw: Draws::default(),
            redraw_masks: Vec::new(),
            fit_masks: Vec::new(),
            fit_kept: Vec::new(),
            fit_row: Vec::new(),
            over_budget: Vec::new(),
            bans: Vec::new(),
            freed: Vec::new(),
            next_id: 0,
            stats: EngineStats::default(),
            cfg,
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tok
    }

    pub fn vocabulary(&self) -> &Arc<Vocabulary> {
        &self.vocab
    }

    pub fn stats(&self) -> EngineStats {
        let mut s = self.stats.clone();
        s.cache = self.cache.stats();
        s
    }

    /// Starts over as a new engine with the same configuration would, keeping what a long job
    /// keeps warm: the compiled grammars, with the masks and completions their states have
    /// filled, and the KV pool (on a GPU, with its CUDA graphs). The prefix cache is emptied and
    /// the counters zeroed, so the next requests compute their prompts as on a new engine.
    /// `quarry bench` runs its repeats this way: a new engine per run measured a job's cold
    /// start every time. Refused while requests are in flight.
    pub fn start_over(&mut self) -> Result<(), EngineError> {
        if !self.is_idle() {
            return Err(EngineError::Config(format!(
                "start_over with {} requests in flight",
                self.in_flight()
            )));
        }
        self.freed.clear();
        self.cache.evict(usize::MAX, &mut self.freed);
        for &p in &self.freed {
            self.pool.free(p)?;
        }
        self.freed.clear();
        self.cache = RadixCache::new();
        self.stats = EngineStats::default();
        debug_assert_eq!(self.pool.free_pages(), self.pool.num_pages());
        Ok(())
    }

    /// Requests submitted and not yet returned by [`Engine::step`].
    pub fn in_flight(&self) -> usize {
        self.pending.len()
            + self.encoded.len()
            + self.waiting.len()
            + self.running.len()
            + self.done.len()
    }

    pub fn is_idle(&self) -> bool {
        self.in_flight() == 0
    }

    /// The output bytes a running request has produced so far (for streaming), without its
    /// unconfirmed drafts. Bytes once returned never change; later calls only add to them.
    pub fn partial_output(&self, id: u64) -> Option<&[u8]> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .find(|s| s.id == id)
            .map(|s| s.written_bytes(&self.tok))
            .or_else(|| {
                // Not yet tokenized: nothing written.
                let mut queued = self.pending.iter().chain(self.encoded.iter().map(|e| &e.0));
                queued.any(|p| p.id == id).then_some(&[][..])
            })
    }

    /// Queues a request and returns its id. A request that cannot run (bad constraint, empty or
    /// too long prompt, bad sampling parameters) is not an error here: it comes back from the next
    /// [`Engine::step`] with [`FinishReason::Error`]. The only error is a full queue. The prompt
    /// is tokenized by the next step, beside its forward pass where one runs (`prepare`).
    pub fn submit(&mut self, req: Request) -> Result<u64, EngineError> {
        let queued = self.pending.len() + self.encoded.len() + self.waiting.len();
        if queued >= self.cfg.max_waiting {
            return Err(EngineError::QueueFull {
                capacity: self.cfg.max_waiting,
            });
        }
        let id = self.next_id;
        self.next_id += 1;
        self.pending.push_back(Pending {
            id,
            req,
            submitted: Instant::now(),
        });
        Ok(id)
    }

    /// Runs `requests` to completion, admitted in the radix tree's depth-first order (prompts
    /// sorted by token ids) so a shared prefix is computed once and then reused. Returns the
    /// completions in the order of `requests`.
    pub fn run_batch(&mut self, requests: Vec<Request>) -> Result<Vec<Completion>, EngineError> {
        let n = requests.len();
        let t = Instant::now();
        let batch: Vec<Pending> = requests
            .into_iter()
            .enumerate()
            .map(|(i, req)| Pending {
                id: self.next_id + i as u64,
                req,
                submitted: t,
            })
            .collect();
        // Every prompt first, on every core: the order below needs their tokens.
        let tokens = self.encode_all(&batch);
        self.stats.prompt_s += t.elapsed().as_secs_f64();
        let mut prepared: Vec<(usize, Result<Sequence, RequestError>)> = batch
            .into_iter()
            .zip(tokens)
            .enumerate()
            .map(|(i, (p, tokens))| (i, self.prepare(p, tokens)))
            .collect();
        let first = self.next_id;
        self.next_id += n as u64;
        prepared.sort_by(|a, b| match (&a.1, &b.1) {
            (Ok(x), Ok(y)) => x.tokens.cmp(&y.tokens),
            (Ok(_), Err(_)) => std::cmp::Ordering::Greater,
            (Err(_), Ok(_)) => std::cmp::Ordering::Less,
            (Err(_), Err(_)) => a.0.cmp(&b.0),
        });
        let mut results: Vec<Option<Completion>> = vec![None; n];
        let mut queue = prepared.into_iter().peekable();
        loop {
            while self.waiting.len() < self.cfg.max_waiting {
                let Some((i, p)) = queue.next() else { break };
                match p {
                    Ok(seq) => self.waiting.push_back(seq),
                    Err(e) => {
                        results[i] = Some(Completion {
                            id: first + i as u64,
                            text: String::new(),
                            reasoning: None,
                            tokens: Vec::new(),
                            finish: e.finish(),
                            stats: RequestStats::default(),
                        })
                    }
                }
            }
            if self.is_idle() && queue.peek().is_none() {
                break;
            }
            for c in self.step()? {
                if let Some(i) = c.id.checked_sub(first).filter(|&i| i < n as u64) {
                    results[i as usize] = Some(c);
                }
            }
        }
        Ok(results
            .into_iter()
            .map(|c| c.expect("every request completes"))
            .collect())
    }

    /// One scheduler step: admit, run one forward pass over decodes and prefill chunks, choose
    /// tokens, and return the requests that finished.
    pub fn step(&mut self) -> Result<Vec<Completion>, EngineError> {
        let t0 = Instant::now();
        self.stats.steps += 1;
        self.prepare_needed();
        self.admit()?;
        let plan = self.plan()?;
        let mut forward_s = 0.0;
        if !plan.is_empty() {
            // Tokenizes the pending requests beside the pass.
            forward_s = self.forward(&plan)?;
            self.queue_encoded();
            self.after_forward(&plan)?;
        }
        // Where no pass ran, now: a request's errors come back from the step after its submit.
        self.prepare_now(self.pending.len());
        self.release_finished()?;
        self.stats.forward_s += forward_s;
        self.stats.schedule_s += t0.elapsed().as_secs_f64() - forward_s;
        Ok(std::mem::take(&mut self.done))
    }

    /// Moves waiting requests into the running set while there is room in the batch and pages in
    /// the pool.
    fn admit(&mut self) -> Result<(), EngineError> {
        while self.running.len() < self.cfg.max_running {
            let Some(seq) = self.waiting.front() else {
                break;
            };
            // A prompt sharing more than the cache holds with one still being prefilled waits
            // for that prefill to land in the cache (in-batch prefix sharing).
            // (Whether one shares its first `n` tokens: a slice comparison that stops at the
            // first such sequence, where the longest common prefix over all of them made a
            // burst's admission quadratic in its prompts' lengths.)
            let shares = |r: &Sequence, n: usize| {
                r.kv_len < r.prompt_len
                    && n <= r.tokens.len().min(seq.tokens.len())
                    && r.tokens[..n] == seq.tokens[..n]
            };
            let waits_for_prefix =
                self.cfg.radix_cache && self.running.iter().any(|r| shares(r, 32)) && {
                    let tokens = &seq.tokens[..seq.tokens.len() - 1];
                    let need = self.cache.match_prefix(tokens).pages.len() + 32;
                    self.running.iter().any(|r| shares(r, need))
                };
            if waits_for_prefix {
                break;
            }
            let mut seq = self.waiting.pop_front().expect("peeked");
            self.unlock(&mut seq);
            seq.slots.clear();
            seq.kv_len = 0;
            seq.shared_len = 0;
            if self.cfg.radix_cache {
                // At least the last token is computed: its logits choose the next one.
                let m = self.cache.match_prefix(&seq.tokens[..seq.tokens.len() - 1]);
                self.cache.lock(m.node);
                seq.node = m.node;
                seq.kv_len = m.pages.len();
                seq.shared_len = m.pages.len();
                seq.slots = m.pages;
            }
            let need = seq.tokens.len() - seq.kv_len
                + (seq.req.max_tokens.min(16)).saturating_sub(seq.output().len());
            if !self.ensure_free(need) {
                self.unlock(&mut seq);
                seq.slots.clear();
                seq.kv_len = 0;
                seq.shared_len = 0;
                if self.running.is_empty() {
                    seq.drop_drafts(&self.tok);
                    seq.finish = Some(FinishReason::Error(format!(
                        "needs {need} KV positions but the pool has {} (engine kv_tokens)",
                        self.pool.num_pages()
                    )));
                    let c = seq.completion();
                    self.done.push(c);
                    continue;
                }
                self.waiting.push_front(seq);
                break;
            }
            if seq.started.is_none() {
                seq.started = Some(Instant::now());
                seq.stats.queue_s = seq.submitted.elapsed().as_secs_f64();
                seq.stats.cached_tokens = seq.kv_len;
                self.cache
                    .record_lookup(seq.kv_len, seq.prompt_len - seq.kv_len);
            }
            self.running.push(seq);
        }
        Ok(())
    }

    /// Makes `n` pages free, evicting from the cache where needed.
    fn ensure_free(&mut self, n: usize) -> bool {
        let free = self.pool.free_pages();
        if free >= n {
            return true;
        }
        self.freed.clear();
        self.cache.evict(n - free, &mut self.freed);
        for &p in &self.freed {
            self.pool.free(p).expect("evicted pages are allocated");
        }
        self.pool.free_pages() >= n
    }

    /// Chooses each running sequence's tokens for this step and gives them pages.
    fn plan(&mut self) -> Result<Vec<Slot>, EngineError> {
        let mut budget = self.cfg.step_tokens;
        let mut plan = Vec::with_capacity(self.running.len());
        // Decodes and short extends first, oldest first; then prefill chunks.
        let mut order: Vec<usize> = (0..self.running.len()).collect();
        order.sort_by_key(|&i| (self.running[i].pending() > 16, i));
        for i in order {
            if budget == 0 {
                break;
            }
            let mut pending = self.running[i].pending();
            if pending > budget && self.running[i].drafts > 0 {
                // Drafts are verified by the pass that computes the rest of the sequence; split
                // across passes, the model writes them instead.
                self.running[i].drop_drafts(&self.tok);
                pending = self.running[i].pending();
            }
            let tokens = pending.min(budget);
            budget -= tokens;
            plan.push(Slot {
                seq: i,
                tokens,
                samples: tokens == pending,
            });
        }
        // Pages for the positions written this step; retract the newest others if the pool is full.
        let mut k = 0;
        while k < plan.len() {
            let s = plan[k];
            let seq = &self.running[s.seq];
            let need = (seq.kv_len + s.tokens).saturating_sub(seq.slots.len());
            if need > 0 && !self.ensure_free(need) {
                if let Some(victim) = self.pick_victim(&plan, k) {
                    if plan[..k].iter().any(|s| s.seq == victim) {
                        k -= 1;
                    }
                    self.retract(victim, &mut plan);
                    continue;
                }
                // Alone and still out of pages: the pool cannot hold this sequence.
                self.running[s.seq].drop_drafts(&self.tok);
                self.running[s.seq].finish = Some(FinishReason::Length);
                plan.remove(k);
                continue;
            }
            let seq = &mut self.running[s.seq];
            let ok = self.pool.alloc_into(need, &mut seq.slots);
            debug_assert!(ok);
            k += 1;
        }
        Ok(plan)
    }

    /// The most recently admitted running sequence other than `plan[k]`'s.
    fn pick_victim(&self, plan: &[Slot], k: usize) -> Option<usize> {
        let me = plan[k].seq;
        (0..self.running.len())
            .rev()
            .find(|&i| i != me && self.running[i].finish.is_none())
    }

    /// Sends a running sequence back to the queue, freeing its private pages (it keeps its tokens,
    /// matcher and sampler, and recomputes its KV when admitted again).
    fn retract(&mut self, victim: usize, plan: &mut Vec<Slot>) {
        let mut seq = self.running.remove(victim);
        self.stats.retracted += 1;
        for &p in &seq.slots[seq.shared_len..] {
            self.pool.free(p).expect("private page is allocated");
        }
        seq.slots.truncate(seq.shared_len);
        seq.kv_len = seq.kv_len.min(seq.shared_len);
        self.waiting.push_front(seq);
        plan.retain(|s| s.seq != victim);
        for s in plan.iter_mut() {
            if s.seq > victim {
                s.seq -= 1;
            }
        }
    }

    /// Runs the forward pass; every mask this step's draws need is filled on another thread
    /// meanwhile (rayon over sequences): each constrained sequence that samples, in its state now,
    /// and for one with drafts also in its state before each draft (the matcher rolled back and
    /// moved forward again, so it ends where it began). On a GPU the pass returns once its
    /// launches are queued, so the masks are built while the device runs the step; what the
    /// step still waits for them after the pass returns is `mask_wait_s`. The pending requests'
    /// prompts are tokenized meanwhile, on this thread (`prepare`). Returns the forward time.
    fn forward(&mut self, plan: &[Slot]) -> Result<f64, EngineError> {
        let words = self.vocab.mask_words();
        // (sequence, drafts) of every constrained sequence that samples, in plan order: its
        // mask is row `k` of the step's masks, its drafts' after every such row, in this order.
        let jobs: Vec<(usize, usize)> = plan
            .iter()
            .filter(|s| s.samples && self.running[s.seq].is_constrained_now())
            .map(|s| (s.seq, self.running[s.seq].drafts))
            .collect();
        self.regular_masks = jobs.len();
        let drafts: usize = jobs.iter().map(|j| j.1).sum();
        self.masks.resize((jobs.len() + drafts) * words, 0);
        let budget = self.cfg.close_within_budget;
        let context_length = self.model.context_length();
        self.fit_row.clear();
        self.fit_row.resize(self.running.len(), None);
        self.fit_kept.clear();
        self.fit_kept.resize(jobs.len(), None);
        if budget {
            self.fit_masks.resize(jobs.len() * words, 0);
            for (k, &(seq, _)) in jobs.iter().enumerate() {
                self.fit_row[seq] = Some(k);
            }
        }
        let Engine {
            model,
            pool,
            logits,
            masks,
            running,
            stats,
            fit_masks,
            fit_kept,
            pending,
            encoded,
            tok,
            cfg,
            ..
        } = self;
        let lefts: Vec<usize> = running
            .iter()
            .map(|s| s.tokens_left(context_length))
            .collect();
        // Each sequence split into what the pass reads and the matcher the masks move.
        let mut views = Vec::with_capacity(running.len());
        let mut matchers = Vec::with_capacity(running.len());
        for seq in running.iter_mut() {
            let Sequence {
                tokens,
                slots,
                kv_len,
                matcher,
                drafts,
                ..
            } = seq;
            views.push((tokens.as_slice(), slots.as_slice(), *kv_len, *drafts));
            matchers.push(matcher.as_mut());
        }
        let inputs: Vec<SeqInput> = plan
            .iter()
            .map(|s| {
                let (tokens, slots, kv_len, drafts) = views[s.seq];
                let input = SeqInput::new(&tokens[kv_len..kv_len + s.tokens], kv_len, slots);
                if s.samples && drafts > 0 {
                    // The position before each draft, and the last one.
                    input.with_last_logits(drafts + 1)
                } else {
                    input
                }
            })
            .collect();
        let (regular, mut rest) = masks.split_at_mut(jobs.len() * words);
        let mut fits = fit_masks.chunks_mut(words).zip(fit_kept.iter_mut());
        let mut tasks: Vec<MaskJob> = Vec::with_capacity(jobs.len());
        for (&(seq, d), mask) in jobs.iter().zip(regular.chunks_mut(words)) {
            let (draft_masks, after) = std::mem::take(&mut rest).split_at_mut(d * words);
            rest = after;
            let tokens = views[seq].0;
            let fit = fits.next().filter(|_| d == 0).map(|(mask, kept)| FitJob {
                left: lefts[seq],
                mask,
                kept,
            });
            tasks.push(MaskJob {
                matcher: matchers[seq].take().expect("constrained"),
                mask,
                drafts: &tokens[tokens.len() - d..],
                draft_masks,
                fit,
            });
        }
        let (fwd, mask_s, wait_s) = std::thread::scope(|scope| {
            let filler = (!tasks.is_empty()).then(|| {
                scope.spawn(move || {
                    let t = Instant::now();
                    tasks.par_iter_mut().for_each(|job| job.fill(words, budget));
                    t.elapsed().as_secs_f64()
                })
            });
            let t = Instant::now();
            let r = model.forward(&inputs, pool, logits);
            let fwd = t.elapsed().as_secs_f64();
            // The pending requests' prompts, while the device runs the pass (on a GPU the
            // forward call returns once it is queued) and the masks fill.
            // Many (a burst of documents) share the thread pool with the masks.
            let t = Instant::now();
            let batch: Vec<Pending> = pending.drain(..).collect();
            let tokens = prepare::encode_all(tok, &cfg.chat_vars, &batch);
            stats.prompts_beside += batch.len() as u64;
            encoded.extend(batch.into_iter().zip(tokens));
            stats.prompt_beside_s += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let mask_s = filler.map(|h| h.join().expect("mask thread panicked"));
            (r.map(|_| fwd), mask_s, t.elapsed().as_secs_f64())
        });
        if let Some(s) = mask_s {
            stats.mask_s += s;
            stats.mask_wait_s += wait_s;
            stats.mask_steps += 1;
            stats.masks_filled += (jobs.len() + drafts) as u64;
            stats.budget_fits_beside += fit_kept.iter().filter(|k| k.is_some()).count() as u64;
        }
        let fwd = fwd?;
        stats.forward_passes += 1;
        stats.forward_tokens += plan.iter().map(|s| s.tokens as u64).sum::<u64>();
        Ok(fwd)
    }

    /// Chooses the next token of every sequence whose chunk reached its end.
    fn after_forward(&mut self, plan: &[Slot]) -> Result<(), EngineError> {
        let words = self.vocab.mask_words();
        let tok = Arc::clone(&self.tok);
        let ctx = TokenCtx {
            tok: &tok,
            jump_forward: self.cfg.jump_forward,
            keep_back: self.cfg.keep_back,
            settle: self.cfg.keep_back_rule == KeepBack::Settled,
            draft: self.cfg.draft_kept_back,
            retokenize: self.cfg.retokenize,
            context_length: self.model.context_length(),
        };
        let eog = &self.tok.special_tokens().end_of_generation;
        let mut mask_row = 0;
        let mut draft_mask = self.regular_masks;
        let mut inserts = Vec::new();
        self.draws.rows.clear();
        self.draws.words = words;
        self.draw_seqs.clear();
        for (row, s) in plan.iter().enumerate() {
            let seq = &mut self.running[s.seq];
            seq.kv_len += s.tokens;
            seq.stats.forward_passes += 1;
            if !s.samples {
                continue;
            }
            if seq.kv_len >= seq.prompt_len && seq.shared_len < seq.prompt_len {
                inserts.push(s.seq);
            }
            if seq.drafts > 0 {
                // A row at the position before each draft, drawn with the step's other rows
                // (where the logits are, on a GPU too) under the mask and bans of the state
                // before that draft; `settle_drafts` reads the verdicts after the draws.
                let first = seq.tokens.len() - seq.drafts;
                self.checks.push(DraftCheck {
                    seq: s.seq,
                    first_draw: self.draws.rows.rows(),
                    count: seq.drafts,
                    positions: self.draft_positions.len(),
                });
                self.draft_positions.push(seq.sampler.position());
                for i in 0..seq.drafts {
                    // Filled beside the forward pass, after every sequence's own mask.
                    let at = draft_mask;
                    draft_mask += 1;
                    self.bans.clear();
                    processor_bans(
                        &seq.req.processors,
                        &seq.tokens[seq.prompt_len..first + i],
                        &mut self.bans,
                    );
                    let mask = Some(u32::try_from(at).expect("a step's masks fit u32"));
                    let logit_row = self.logits.row_index(row, i);
                    self.draws.rows.push(
                        &mut seq.sampler,
                        logit_row,
                        mask,
                        self.bans.iter().copied(),
                    );
                    self.draw_seqs.push(s.seq);
                    self.draft_positions.push(seq.sampler.position());
                }
            }
            // The row's draw, taken with every other row's below: its bans (the processors',
            // and end of generation while thinking before a constraint) and its mask.
            let seq = &mut self.running[s.seq];
            self.bans.clear();
            processor_bans(
                &seq.req.processors,
                &seq.tokens[seq.prompt_len..],
                &mut self.bans,
            );
            let mask = if seq.is_constrained_now() {
                mask_row += 1;
                Some((mask_row - 1) as u32)
            } else {
                if seq.phase == Phase::Thinking && seq.matcher.is_some() {
                    // The answer must still come: no end of generation while thinking.
                    self.bans.extend_from_slice(eog);
                }
                None
            };
            let logit_row = self.logits.last_row_index(row);
            self.draws
                .rows
                .push(&mut seq.sampler, logit_row, mask, self.bans.iter().copied());
            self.draw_seqs.push(s.seq);
        }
        let t = Instant::now();
        self.model
            .sample(&mut self.logits, &self.masks, &mut self.draws);
        self.stats.sample_s += t.elapsed().as_secs_f64();
        self.settle_drafts(&ctx);
        // Each sequence takes its drawn token on its own (the matcher, jump-forward, re-encoding
        // a boundary): on a GPU the device waits for this, so large batches take them in
        // parallel over sequences (each sequence's state is its own: the same tokens either way).
        self.taken.clear();
        self.taken.resize(self.running.len(), None);
        for (d, &i) in self.draw_seqs.iter().enumerate() {
            if self.draw_used[d] {
                debug_assert!(self.taken[i].is_none(), "one draw taken a sequence");
                self.taken[i] = Some(d);
            }
        }
        // A draw after which no completion of its constraint fits is refused here (the budget,
        // `docs/budget.md`) and drawn again below.
        let mut over = std::mem::take(&mut self.over_budget);
        over.clear();
        over.resize(self.running.len(), false);
        let draws = &self.draws.out;
        let take_drawn = |((seq, d), over): ((&mut Sequence, &Option<usize>), &mut bool)| -> Taken {
            match d.map(|d| &draws[d]) {
                None => Taken::default(),
                Some(Ok(id)) => {
                    let (t, took) = take(seq, *id, &ctx, OverBudget::Refuse);
                    *over = took == Took::OverBudget;
                    t
                }
                Some(Err(e)) => {
                    let overflow = seq
                        .matcher
                        .as_ref()
                        .and_then(|m| m.grammar().overflow_error())
                        .map(|o| format!(" ({o})"))
                        .unwrap_or_default();
                    seq.finish = Some(FinishReason::Error(format!(
                        "no token can follow: {e}{overflow}"
                    )));
                    Taken::default()
                }
            }
        };
        let mut taken = if self.draw_seqs.len() >= PARALLEL_TAKES {
            self.running
                .par_iter_mut()
                .zip(self.taken.par_iter())
                .zip(over.par_iter_mut())
                .map(take_drawn)
                .reduce(Taken::default, Taken::add)
        } else {
            self.running
                .iter_mut()
                .zip(&self.taken)
                .zip(over.iter_mut())
                .map(take_drawn)
                .fold(Taken::default(), Taken::add)
        };
        if over.contains(&true) {
            taken = taken.add(self.redraw_over_budget(&over, &ctx));
        }
        self.over_budget = over;
        self.stats.sampled_tokens += taken.sampled;
        self.stats.forced_tokens += taken.forced;
        self.stats.retokenized_tokens += taken.retokenized;
        // Prompts whose prefill just finished go into the cache, so requests admitted next reuse them.
        for i in inserts {
            self.cache_prefix(i)?;
        }
        Ok(())
    }

    /// The token budget (`docs/budget.md`): each draw the take refused (`over[i]`: after it no
    /// completion of its constraint would fit in what the sequence has left) is drawn again,
    /// from the same logits row, under the mask of the tokens that do fit
    /// ([`quarry_grammar::Matcher::retain_fitting`]) and the row's bans, then taken. The first
    /// token of the state's completion always fits, so the draw again always has a token; the
    /// model still chooses among those that fit (an enum's value it prefers, not the shortest
    /// one). On a GPU the second draw reads the logits the step left on the device. The check
    /// itself costs nothing here: it is a cached length the take looks up after the walk it
    /// makes anyway ([`quarry_grammar::Matcher::peek_token`]); what is timed (`budget_s`) is
    /// this draw again.
    fn redraw_over_budget(&mut self, over: &[bool], ctx: &TokenCtx) -> Taken {
        let t = Instant::now();
        let context_length = ctx.context_length;
        let refused: Vec<usize> = (0..over.len()).filter(|&i| over[i]).collect();
        let words = self.vocab.mask_words();
        self.redraw.rows.clear();
        self.redraw.words = words;
        // The masks of the tokens that fit, one per refused draw, built in parallel (each walks
        // the tokens its state allows).
        self.redraw_masks.clear();
        self.redraw_masks.resize(refused.len() * words, 0);
        let running = &self.running;
        let (fit_masks, fit_kept, fit_row) = (&self.fit_masks, &self.fit_kept, &self.fit_row);
        let fit = |(mask, &i): (&mut [u32], &usize)| -> (usize, bool) {
            let seq = &running[i];
            let left = seq.tokens_left(context_length);
            // Filled beside the pass for this state and these tokens left (the refused draw is
            // the sequence's own row: it had no drafts), else walked now.
            let ahead = fit_row[i].and_then(|k| match fit_kept[k] {
                Some((l, kept)) if l == left => Some((k, kept)),
                _ => None,
            });
            if let Some((k, kept)) = ahead {
                mask.copy_from_slice(&fit_masks[k * words..(k + 1) * words]);
                return (kept, true);
            }
            let m = seq.matcher.as_ref().expect("constrained");
            m.fill_mask(mask);
            (m.retain_fitting(mask, left), false)
        };
        let kept: Vec<(usize, bool)> = if refused.len() > 1 {
            self.redraw_masks
                .par_chunks_mut(words)
                .zip(refused.par_iter())
                .map(fit)
                .collect()
        } else {
            self.redraw_masks
                .chunks_mut(words)
                .zip(refused.iter())
                .map(fit)
                .collect()
        };
        self.stats.budget_redraws_beside += kept.iter().filter(|k| k.1).count() as u64;
        let mut which: Vec<usize> = Vec::new();
        for (k, &i) in refused.iter().enumerate() {
            if kept[k].0 == 0 {
                // Nothing fits (a `uniqueItems` tracker refused the completion): the draw
                // stands, and the record may end cut (counted as `length`).
                continue;
            }
            let d = self.taken[i].expect("a checked draw");
            let seq = &mut self.running[i];
            self.bans.clear();
            processor_bans(
                &seq.req.processors,
                &seq.tokens[seq.prompt_len..],
                &mut self.bans,
            );
            let logit_row = self.draws.rows.logit_row[d] as usize;
            let mask_index = u32::try_from(k).expect("a step's masks fit u32");
            self.redraw.rows.push(
                &mut seq.sampler,
                logit_row,
                Some(mask_index),
                self.bans.iter().copied(),
            );
            seq.budget_shaped = true;
            which.push(d);
        }
        let mut taken = Taken::default();
        if !which.is_empty() {
            self.model
                .sample(&mut self.logits, &self.redraw_masks, &mut self.redraw);
            self.stats.budget_redraws += which.len() as u64;
        }
        let mut k = 0;
        for &i in &refused {
            let d = self.taken[i].expect("a checked draw");
            // The draw again where there was one (it fits); else the draw stands.
            let (drawn, over) = if which.get(k) == Some(&d) {
                k += 1;
                (&self.redraw.out[k - 1], OverBudget::First)
            } else {
                (&self.draws.out[d], OverBudget::Take)
            };
            let seq = &mut self.running[i];
            match drawn {
                Ok(id) => {
                    let (t, took) = take(seq, *id, ctx, over);
                    self.stats.budget_replaced += u64::from(took == Took::Replaced);
                    taken = taken.add(t);
                }
                Err(e) => {
                    seq.finish = Some(FinishReason::Error(format!("no token can follow: {e}")))
                }
            }
        }
        self.stats.budget_s += t.elapsed().as_secs_f64();
        taken
    }

    /// Reads the verdict on every sequence's drafts from the step's draws (rows
    /// `first_draw..first_draw + count` of a [`DraftCheck`], the row after them being the
    /// sequence's usual one): a draw equal to its draft confirms it, as a forced token; the first
    /// other draw replaces it, and what follows is cut. The matcher, which the rows' masks left
    /// after every draft, and the sampler's stream, which gave every row a uniform, go back to
    /// where checking the drafts one by one would have left them. Marks in `draw_used` the draws
    /// [`Engine::after_forward`] still takes.
    fn settle_drafts(&mut self, ctx: &TokenCtx) {
        self.draw_used.clear();
        self.draw_used.resize(self.draws.out.len(), true);
        for c in &self.checks {
            let seq = &mut self.running[c.seq];
            let first = seq.tokens.len() - c.count;
            self.draw_used[c.first_draw..c.first_draw + c.count].fill(false);
            let mut verdict = Verdict::Confirmed;
            for i in 0..c.count {
                let drawn = &self.draws.out[c.first_draw + i];
                if matches!(drawn, Ok(id) if *id == seq.tokens[first + i]) {
                    seq.confirm_draft();
                    self.stats.forced_tokens += 1;
                    self.stats.drafts_confirmed += 1;
                    continue;
                }
                // Back to before this draft, the stream to just after its row's uniform.
                let m = seq.matcher.as_mut().expect("drafts are constrained");
                m.rollback(c.count - i);
                seq.sampler
                    .rewind(self.draft_positions[c.positions + i + 1]);
                verdict = match drawn {
                    Ok(id) => {
                        self.stats.drafts_refused += seq.drafts as u64;
                        self.stats.sampled_tokens += 1;
                        Verdict::Replaced(*id)
                    }
                    Err(e) => Verdict::Failed(format!("no token can follow: {e}")),
                };
                seq.discard_drafts(ctx.tok);
                break;
            }
            let last = c.first_draw + c.count;
            match verdict {
                Verdict::Confirmed
                    if seq.output().len() >= seq.req.max_tokens
                        || seq.tokens.len() >= ctx.context_length =>
                {
                    // The drafts used the last of the budget, as the kept-back tokens would: the
                    // last row's draw goes unused, and its uniform back to the stream.
                    self.draw_used[last] = false;
                    seq.sampler
                        .rewind(self.draft_positions[c.positions + c.count]);
                    seq.finish = Some(seq.finish_at_limit());
                }
                Verdict::Confirmed => {}
                Verdict::Replaced(id) => {
                    // The model's own token replaces the refused draft; the last row's draw
                    // (for the state after the drafts) goes unused.
                    self.draw_used[last] = false;
                    // Counted as sampled with the verdict.
                    let (t, _) = take(seq, id, ctx, OverBudget::First);
                    self.stats.forced_tokens += t.forced;
                    self.stats.retokenized_tokens += t.retokenized;
                }
                Verdict::Failed(e) => {
                    self.draw_used[last] = false;
                    seq.finish = Some(FinishReason::Error(e));
                }
            }
        }
        self.checks.clear();
        self.draft_positions.clear();
    }

    /// Puts a running sequence's computed prompt into the radix tree and pins it.
    fn cache_prefix(&mut self, i: usize) -> Result<(), EngineError> {
        if !self.cfg.radix_cache {
            return Ok(());
        }
        let seq = &mut self.running[i];
        let len = seq.prompt_len.min(seq.kv_len);
        self.freed.clear();
        let node = self
            .cache
            .insert(&seq.tokens[..len], &mut seq.slots[..len], &mut self.freed);
        self.cache.lock(node);
        if seq.node != ROOT {
            self.cache.unlock(seq.node);
        }
        seq.node = node;
        seq.shared_len = len;
        for &p in &self.freed {
            self.pool.free(p)?;
        }
        Ok(())
    }

    /// Returns the pages of finished sequences (to the cache or the pool) and their completions.
    fn release_finished(&mut self) -> Result<(), EngineError> {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].finish.is_none() {
                i += 1;
                continue;
            }
            let mut seq = self.running.swap_remove(i);
            self.freed.clear();
            let computed = seq.kv_len.min(seq.slots.len());
            if self.cfg.radix_cache {
                // Insert then unlock: the new path is the cache's now.
                self.cache.insert(
                    &seq.tokens[..computed],
                    &mut seq.slots[..computed],
                    &mut self.freed,
                );
                self.freed.extend_from_slice(&seq.slots[computed..]);
            } else {
                self.freed.extend_from_slice(&seq.slots[seq.shared_len..]);
            }
            self.unlock(&mut seq);
            for &p in &self.freed {
                self.pool.free(p)?;
            }
            self.stats.completed += 1;
            self.done.push(seq.completion());
        }
        Ok(())
    }

    fn unlock(&mut self, seq: &mut Sequence) {
        if seq.holds_lock() {
            self.cache.unlock(seq.node);
            seq.node = ROOT;
        }
    }

    /// Checks that every page is accounted for exactly once: free, in the cache, or held by one
    /// running sequence (shared prefixes excepted). For tests.
    pub fn check_pages(&self) -> Result<(), crate::radix::Inconsistency> {
        let mut owner = vec![0u8; self.pool.num_pages()];
        for p in self.cache.pages() {
            owner[p as usize] += 1;
        }
        for s in &self.running {
            for &p in &s.slots[s.shared_len..] {
                owner[p as usize] += 1;
            }
        }
        for (p, &n) in owner.iter().enumerate() {
            let allocated = self.pool.is_allocated(p as u32);
            if (n == 0 && allocated) || (n > 0 && !allocated) || n > 1 {
                return Err(crate::radix::Inconsistency::PageOwners {
                    page: p as PageId,
                    owners: n,
                    allocated,
                });
            }
        }
        let mut locks = FxHashMap::default();
        for s in &self.running {
            if s.holds_lock() {
                *locks.entry(s.node).or_insert(0) += 1;
            }
        }
        for s in &self.waiting {
            if s.holds_lock() {
                *locks.entry(s.node).or_insert(0) += 1;
            }
        }
        self.cache.check(&locks)
    }
}

/// Appends sampled token `id` to `seq`, with what follows from it, counted in `stats`.
/// Draws from which a step's sequences take their tokens in parallel (below, one after another:
/// handing a few sequences to the thread pool costs more than it saves).
const PARALLEL_TAKES: usize = 32;

/// What sequences' tokens added to the engine's counters.
#[derive(Default, Clone, Copy)]
struct Taken {
    sampled: u64,
    forced: u64,
    retokenized: u64,
}

impl Taken {
    fn add(self, o: Taken) -> Taken {
        Taken {
            sampled: self.sampled + o.sampled,
            forced: self.forced + o.forced,
            retokenized: self.retokenized + o.retokenized,
        }
    }
}

/// `seq` takes the sampled token `id` (and whatever jump-forward appends after it).
fn take(seq: &mut Sequence, id: u32, ctx: &TokenCtx, over: OverBudget) -> (Taken, Took) {
    let forced_before = seq.stats.forced_tokens;
    let retok_before = seq.stats.retokenized_tokens;
    let took = seq.take_token(id, ctx, over);
    let taken = Taken {
        sampled: u64::from(took != Took::OverBudget),
        forced: (seq.stats.forced_tokens - forced_before) as u64,
        retokenized: (seq.stats.retokenized_tokens - retok_before) as u64,
    };
    (taken, took)
}

/// A sequence whose drafts this step's draws verify: draws `first_draw..first_draw + count` are
/// at the positions before its drafts, and its stream positions start at
/// `Engine::draft_positions[positions]`.
struct DraftCheck {
    seq: usize,
    first_draw: usize,
    count: usize,
    positions: usize,
}

/// What the pass said about a sequence's drafts.
enum Verdict {
    /// Every draft is confirmed; the last row samples as usual.
    Confirmed,
    /// A draft was refused: it and those after it are gone, and this token, the model's own
    /// choice there, is to be appended.
    Replaced(u32),
    /// Nothing could be sampled before a draft (a processor banned the only token allowed).
    Failed(String),
}
