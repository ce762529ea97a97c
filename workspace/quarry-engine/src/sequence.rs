//! One running request: its tokens, where its KV is, its constraint matcher and sampler, and what
//! happens when a token is chosen (stop checks, reasoning phases, jump-forward).

use std::time::Instant;

use quarry_grammar::{Matcher, Peek};
use quarry_model::{PageId, Sampler};
use quarry_tokenizer::{EncodeOptions, Tokenizer};

use crate::radix::{NodeId, ROOT};
use crate::request::{Completion, FinishReason, Processor, Request, RequestStats};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Reasoning mode before the end-of-thinking marker: free text.
    Thinking,
    /// The answer, constrained when the request has a constraint.
    Output,
}

pub(crate) struct Sequence {
    pub id: u64,
    pub req: Request,
    /// Prompt then output tokens. Positions `0..kv_len` have KV in the pool; the rest are the next
    /// forward pass's input.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub kv_len: usize,
    /// Block table, one page (one position) per token.
    pub slots: Vec<PageId>,
    /// Positions `0..shared_len` are pages of the radix tree, pinned by the lock on `node`.
    pub shared_len: usize,
    pub node: NodeId,
    pub matcher: Option<Matcher>,
    pub sampler: Sampler,
    pub phase: Phase,
    /// Output bytes so far (thinking included).
    pub out_bytes: Vec<u8>,
    /// Byte offset in `out_bytes` where the answer starts (after the end-of-thinking marker).
    pub answer_start: usize,
    /// Index in `tokens` of the first token the matcher saw.
    pub constrained_from: usize,
    /// Tokens produced while thinking.
    pub thinking_tokens: usize,
    pub finish: Option<FinishReason>,
    /// The last `drafts` tokens are drafts: the tail of a forced run that jump-forward appended
    /// (and the matcher accepted) before the model confirmed them. The next forward pass returns
    /// logits at the position before each, and [`crate::Engine`] keeps a draft only if the model,
    /// sampling there under the constraint, chooses it.
    pub drafts: usize,
    /// Under [`crate::EngineConfig::close_within_budget`], with a constraint: every token taken
    /// leaves a completion that fits in what is left (`docs/budget.md`).
    pub budget: bool,
    /// The budget refused a token the model chose, or ended the record at `max_tokens`: the
    /// record finishes `budget_closed`.
    pub budget_shaped: bool,
    /// Tokens the forced end-of-thinking marker takes ("\n" + marker), kept free for it.
    pub marker_tokens: usize,
    pub stats: RequestStats,
    pub submitted: Instant,
    pub started: Option<Instant>,
}

/// Engine-wide knobs a sequence needs when it takes a token.
pub(crate) struct TokenCtx<'a> {
    pub tok: &'a Tokenizer,
    pub jump_forward: bool,
    pub keep_back: usize,
    /// Keep back only what follows the tokenizer's settled prefix, where it knows one.
    pub settle: bool,
    /// Append the kept-back tokens as drafts for the next pass to verify.
    pub draft: bool,
    pub retokenize: usize,
    pub context_length: usize,
}

/// What [`Sequence::take_token`] does with a token after which no completion of the constraint
/// fits in what is left (`docs/budget.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverBudget {
    /// Leave the sequence as it was and say so: the engine draws again, from the same logits,
    /// under the mask of the tokens that fit.
    Refuse,
    /// Take the first token of the state's completion instead (a refused draft's replacement,
    /// which has no draw of its own to repeat).
    First,
    /// Take it anyway: nothing fits (a `uniqueItems` tracker refused the completion), so the
    /// record may end cut.
    Take,
}

/// Whether [`Sequence::take_token`] took the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Took {
    Taken,
    /// Refused under [`OverBudget::Refuse`]; the sequence is unchanged.
    OverBudget,
    /// It did not fit either under [`OverBudget::First`], and the first token of the state's
    /// completion was taken in its place.
    Replaced,
}

impl Sequence {
    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// Tokens the next forward pass must compute.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.kv_len
    }

    pub fn is_constrained_now(&self) -> bool {
        self.phase == Phase::Output && self.matcher.is_some()
    }

    /// Output tokens this sequence may still write: what is left of `max_tokens` (its drafts
    /// counted as written) and of the context.
    pub fn tokens_left(&self, context_length: usize) -> usize {
        let by_max = self.req.max_tokens.saturating_sub(self.output().len());
        by_max.min(context_length.saturating_sub(self.tokens.len()))
    }

    /// Whether the budget lets this sequence take the peeked token: a completion of its
    /// constraint still fits after it (`docs/budget.md`; a cached length, the walk was the
    /// peek's). Always where the budget is off, and in a state whose completion the search did
    /// not find (no guarantee to keep). End of generation is never peeked: the mask allows it
    /// only where the constraint accepts.
    fn budget_allows(&self, m: &Matcher, peek: &Peek, context_length: usize) -> bool {
        if !self.budget {
            return true;
        }
        match m.completion_after_peek(peek) {
            Some(need) => need < self.tokens_left(context_length),
            None => m.completion_len().is_none(),
        }
    }

    /// How a constrained record that is complete finishes.
    fn complete(&self) -> FinishReason {
        if self.budget_shaped {
            FinishReason::BudgetClosed
        } else {
            FinishReason::ConstraintComplete
        }
    }

    /// How this sequence finishes when `max_tokens` or the context runs out (drafts already
    /// dropped): a complete record under the budget is `budget_closed`, anything else `length`.
    pub fn finish_at_limit(&self) -> FinishReason {
        let complete =
            self.is_constrained_now() && self.matcher.as_ref().is_some_and(|m| m.is_accepting());
        if self.budget && complete {
            FinishReason::BudgetClosed
        } else {
            FinishReason::Length
        }
    }

    fn thinking_budget(&self) -> Option<usize> {
        self.req.processors.iter().find_map(|p| match p {
            Processor::ThinkingBudget { max_tokens } => Some(*max_tokens),
            _ => None,
        })
    }

    /// Appends a sampled token and applies everything that follows from it.
    pub fn take_token(&mut self, id: u32, ctx: &TokenCtx, over: OverBudget) -> Took {
        if ctx
            .tok
            .special_tokens()
            .end_of_generation
            .binary_search(&id)
            .is_ok()
        {
            // The mask allowed EOS only where the constraint accepts.
            self.finish = Some(if self.is_constrained_now() {
                self.complete()
            } else if self.phase == Phase::Thinking && self.matcher.is_some() {
                FinishReason::Error("the model ended while still thinking".into())
            } else {
                FinishReason::Stop
            });
            return Took::Taken;
        }
        let mut id = id;
        let mut took = Took::Taken;
        if self.is_constrained_now() {
            let m = self.matcher.as_ref().expect("constrained");
            // One walk of the token's bytes serves the budget's check and the acceptance.
            let mut peeked = m.peek_token(id);
            if let Ok(p) = &peeked {
                if over != OverBudget::Take && !self.budget_allows(m, p, ctx.context_length) {
                    match over {
                        OverBudget::Refuse => return Took::OverBudget,
                        // The first token of the completion always fits.
                        _ => {
                            if let Some(first) = m.completion_first() {
                                self.budget_shaped = true;
                                took = Took::Replaced;
                                id = first;
                                peeked = m.peek_token(id);
                            }
                        }
                    }
                }
            }
            let m = self.matcher.as_mut().expect("constrained");
            if let Err(e) = peeked.and_then(|p| m.accept_peeked(p)) {
                self.finish = Some(FinishReason::Error(format!(
                    "sampled token {id} that the constraint refuses: {e}"
                )));
                return Took::Taken;
            }
        }
        self.push(id, ctx.tok);
        if self.stats.output_tokens == 0 {
            self.stats.first_token_s = self.submitted.elapsed().as_secs_f64();
        }
        self.stats.output_tokens += 1;
        if self.phase == Phase::Thinking {
            self.thinking_tokens += 1;
            self.after_thinking_token(ctx);
        }
        self.after_token(ctx);
        took
    }

    fn push(&mut self, id: u32, tok: &Tokenizer) {
        self.tokens.push(id);
        if let Ok(b) = tok.token_bytes(id) {
            self.out_bytes.extend_from_slice(b);
        }
    }

    /// Stop strings, the end-of-thinking marker and the thinking budget.
    fn after_thinking_token(&mut self, ctx: &TokenCtx) {
        let marker = self.req.reasoning.as_ref().map(|r| r.end_marker.as_bytes());
        let Some(marker) = marker else { return };
        // Only the tail can hold a marker the last token completed.
        let from = self.out_bytes.len().saturating_sub(marker.len() + 64);
        if let Some(at) = find_from(&self.out_bytes, marker, from) {
            self.start_answer(at + marker.len());
            return;
        }
        // Under the budget the answer keeps room for the marker and its shortest record.
        let reserve = self
            .matcher
            .as_ref()
            .filter(|_| self.budget)
            .and_then(|m| m.completion_len())
            .map(|c| c + self.marker_tokens);
        let out_of_room = reserve.is_some_and(|r| self.tokens_left(ctx.context_length) <= r);
        if out_of_room
            || self
                .thinking_budget()
                .is_some_and(|b| self.thinking_tokens >= b)
        {
            // Force a newline and the marker, in one extend pass.
            let text = format!("\n{}", String::from_utf8_lossy(marker));
            let opts = EncodeOptions {
                add_bos: false,
                parse_special: true,
            };
            match ctx.tok.encode_with(&text, opts) {
                Ok(ids) => {
                    for &t in &ids {
                        self.push(t, ctx.tok);
                    }
                    self.stats.output_tokens += ids.len();
                    self.stats.forced_tokens += ids.len();
                    let end = self.out_bytes.len();
                    self.start_answer(end);
                }
                Err(e) => {
                    self.finish = Some(FinishReason::Error(format!(
                        "cannot tokenize the end-of-thinking marker: {e}"
                    )))
                }
            }
        }
    }

    /// Leaves the thinking phase; bytes after the marker (in the same token) go to the matcher.
    fn start_answer(&mut self, at: usize) {
        self.phase = Phase::Output;
        self.answer_start = at;
        self.constrained_from = self.tokens.len();
        if let Some(m) = self.matcher.as_mut() {
            let rest = &self.out_bytes[at..];
            if let Err(e) = m.accept_bytes(rest) {
                self.finish = Some(FinishReason::Error(format!(
                    "the text after the end-of-thinking marker breaks the constraint: {e}"
                )));
            }
        }
    }

    /// Completion, stop strings, limits and jump-forward after the output grew.
    pub fn after_token(&mut self, ctx: &TokenCtx) {
        if self.finish.is_some() {
            return;
        }
        if self.is_constrained_now() {
            let m = self.matcher.as_ref().expect("constrained");
            if m.is_finished() {
                self.finish = Some(self.complete());
                return;
            }
            if ctx.jump_forward && !m.forced_bytes().is_empty() {
                self.jump_forward(ctx);
                if self.matcher.as_ref().is_some_and(|m| m.is_finished()) {
                    self.finish = Some(self.complete());
                    return;
                }
            }
        } else if let Some(cut) = self.find_stop() {
            self.out_bytes.truncate(cut);
            self.finish = Some(FinishReason::Stop);
            return;
        }
        // Drafts are not output yet: a pass confirms them first (and they fit the budget).
        let written = self.output().len() - self.drafts;
        if written >= self.req.max_tokens || self.tokens.len() >= ctx.context_length {
            // What is returned was written or confirmed by the model.
            self.drop_drafts(ctx.tok);
            self.finish = Some(self.finish_at_limit());
        }
    }

    /// Byte offset where the first stop string starts, looking only where the last token could
    /// have completed one.
    fn find_stop(&self) -> Option<usize> {
        let longest = self.req.stop.iter().map(|s| s.len()).max()?;
        let from = self
            .out_bytes
            .len()
            .saturating_sub(longest + 64)
            .max(self.answer_start);
        self.req
            .stop
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| find_from(&self.out_bytes, s.as_bytes(), from))
            .min()
    }

    /// Appends the constraint's forced bytes without sampling. The last `retokenize` output tokens
    /// plus the forced bytes are encoded again so the boundary is tokenized as the tokenizer would
    /// (canonically). The tail of that encoding that a following token could merge with is left for
    /// the model: the tokens after the tokenizer's settled prefix, or the last `keep_back` tokens
    /// (see [`crate::KeepBack`]). The matcher is rolled back and moved forward to
    /// match, and positions from the change on lose their KV: the next forward pass recomputes
    /// them in one extend that reuses every page before the change.
    fn jump_forward(&mut self, ctx: &TokenCtx) {
        let accepted = self.matcher.as_ref().map_or(0, |m| m.tokens_accepted());
        let budget = self
            .req
            .max_tokens
            .saturating_sub(self.tokens.len() - self.prompt_len);
        let floor = self.constrained_from.max(self.shared_len);
        let k = ctx.retokenize.min(self.tokens.len() - floor).min(accepted);
        let cut = self.tokens.len() - k;
        let budget_on = self.budget;
        let old_start = self.out_bytes.len() - self.token_bytes_len(cut, ctx.tok);
        let m = self.matcher.as_mut().expect("constrained");
        let mut text = self.out_bytes[old_start..].to_vec();
        let old_len = text.len();
        text.extend_from_slice(m.forced_bytes());
        // A forced run may end inside a UTF-8 character; the tokenizer takes whole characters.
        let valid = match std::str::from_utf8(&text) {
            Ok(s) => s.len(),
            Err(e) => e.valid_up_to(),
        };
        if valid <= old_len {
            return;
        }
        let text = std::str::from_utf8(&text[..valid]).expect("checked");
        let Ok(new) = ctx.tok.encode_with(text, EncodeOptions::default()) else {
            return;
        };
        // The encoding must spell exactly these bytes (a tokenizer that adds a prefix space does not).
        let mut spelled = 0;
        for &t in &new {
            match ctx.tok.token_bytes(t) {
                Ok(b) if text.as_bytes()[spelled..].starts_with(b) => spelled += b.len(),
                _ => return,
            }
        }
        if spelled != text.len() {
            return;
        }
        m.rollback(k);
        let restore = |m: &mut Matcher, accepted: usize, old: &[u32]| {
            m.rollback(accepted);
            for &t in old {
                m.accept_token(t).expect("accepted before");
            }
        };
        for (i, &t) in new.iter().enumerate() {
            if m.accept_token(t).is_err() {
                restore(m, i, &self.tokens[cut..]);
                return;
            }
        }
        let settled = if m.is_finished() {
            new.len()
        } else {
            // The bytes the constraint allows next decide whether the last pre-token can grow.
            let allowed = |b: u8| m.allows_byte(b);
            match ctx
                .settle
                .then(|| ctx.tok.settled_len(text, allowed))
                .flatten()
            {
                Some(at) => tokens_within(&new, at, ctx.tok),
                None => new.len() - ctx.keep_back.min(new.len()),
            }
        };
        let settled = settled.min(budget + k);
        // Drafts: the kept-back tail, appended for the next pass to verify. They must lie wholly in
        // the forced bytes: a draft spelling bytes the model chose itself would undo its choice
        // (it wrote `"` where the draft says `":"`), and be refused again, forever. The position
        // before the first draft must be computed in that pass (for its logits), and may not be
        // a shared page of the radix tree.
        let mut retained = settled;
        if ctx.draft && settled < new.len() && cut + settled > self.shared_len {
            let settled_bytes: usize = new[..settled]
                .iter()
                .map(|&t| ctx.tok.token_bytes(t).map_or(0, |b| b.len()))
                .sum();
            if settled_bytes >= old_len {
                retained = new.len().min(budget + k);
            }
        }
        m.rollback(new.len() - retained);
        // Under the budget the forced run must leave a completion that fits: its tokens are not
        // always the completion's own (a boundary re-encoded, a run cut by keep-back). Where it
        // would not, nothing is forced and the model writes the bytes under the budget's rule.
        if budget_on {
            let left = (budget + k).min(ctx.context_length.saturating_sub(cut));
            if m.completion_len()
                .is_some_and(|need| retained + need > left)
            {
                restore(m, retained, &self.tokens[cut..]);
                return;
            }
        }
        let retained_bytes: usize = new[..retained]
            .iter()
            .map(|&t| ctx.tok.token_bytes(t).map_or(0, |b| b.len()))
            .sum();
        if retained_bytes <= old_len {
            restore(m, retained, &self.tokens[cut..]);
            if ctx.draft && budget > 0 {
                // Nothing settles past the model's own bytes: the forced bytes alone, tokenized
                // apart from them, become the drafts. Not canonical, but the model decides.
                let forced = text[old_len..].to_string();
                self.draft_forced(&forced, budget, ctx);
            }
            return;
        }
        self.tokens.truncate(cut);
        self.tokens.extend_from_slice(&new[..retained]);
        self.out_bytes.truncate(old_start);
        self.out_bytes
            .extend_from_slice(&text.as_bytes()[..retained_bytes]);
        if self.kv_len > cut {
            self.stats.retokenized_tokens += self.kv_len - cut;
            self.kv_len = cut;
        }
        self.drafts = retained - settled;
        if self.drafts > 0 {
            // The pass must compute the token before the first draft, for its logits.
            let verify_at = cut + settled - 1;
            if self.kv_len > verify_at {
                self.stats.retokenized_tokens += self.kv_len - verify_at;
                self.kv_len = verify_at;
            }
        }
        self.stats.output_tokens = self.stats.output_tokens + retained - k;
        self.stats.forced_tokens += (retained - self.drafts).saturating_sub(k);
    }

    /// Appends `forced`, tokenized on its own, as drafts after the model's last token (at most
    /// `budget` of them). The matcher accepts them; if it refuses one (a tokenization the
    /// constraint does not allow), nothing is appended.
    fn draft_forced(&mut self, forced: &str, budget: usize, ctx: &TokenCtx) {
        let Ok(ids) = ctx.tok.encode_with(forced, EncodeOptions::default()) else {
            return;
        };
        if ids.is_empty() || ids.len() > budget || self.tokens.len() <= self.shared_len {
            return;
        }
        // They must spell exactly the forced bytes (a tokenizer that adds a prefix space does not).
        let spelled: Vec<u8> = ids
            .iter()
            .flat_map(|&t| ctx.tok.token_bytes(t).unwrap_or(&[]).iter().copied())
            .collect();
        if spelled != forced.as_bytes() {
            return;
        }
        let left = self.tokens_left(ctx.context_length);
        let m = self.matcher.as_mut().expect("constrained");
        for (i, &t) in ids.iter().enumerate() {
            if m.accept_token(t).is_err() {
                m.rollback(i);
                return;
            }
        }
        if self.budget
            && m.completion_len()
                .is_some_and(|need| ids.len() + need > left)
        {
            m.rollback(ids.len());
            return;
        }
        // The model's last token is the verifying position: it must be computed by the pass.
        self.kv_len = self.kv_len.min(self.tokens.len() - 1);
        for &t in &ids {
            self.push(t, ctx.tok);
        }
        self.drafts = ids.len();
        self.stats.output_tokens += ids.len();
    }

    /// Removes the unverified drafts: the model writes those bytes itself, as if they had been
    /// kept back.
    pub fn drop_drafts(&mut self, tok: &Tokenizer) {
        if let Some(m) = self.matcher.as_mut() {
            m.rollback(self.drafts);
        }
        self.discard_drafts(tok);
    }

    /// Cuts the drafts from the tokens, the output and the cache (where a pass computed them),
    /// leaving the matcher alone: the caller has already stepped it back.
    pub fn discard_drafts(&mut self, tok: &Tokenizer) {
        if self.drafts == 0 {
            return;
        }
        let keep = self.tokens.len() - self.drafts;
        let bytes = self.token_bytes_len(keep, tok);
        self.tokens.truncate(keep);
        self.out_bytes.truncate(self.out_bytes.len() - bytes);
        self.kv_len = self.kv_len.min(keep);
        self.stats.output_tokens -= self.drafts;
        self.drafts = 0;
    }

    /// The first draft is confirmed: it stays, and counts as forced.
    pub fn confirm_draft(&mut self) {
        self.drafts -= 1;
        self.stats.forced_tokens += 1;
    }

    /// The output bytes without the unconfirmed drafts.
    pub fn written_bytes(&self, tok: &Tokenizer) -> &[u8] {
        let drafts = self.token_bytes_len(self.tokens.len() - self.drafts, tok);
        &self.out_bytes[..self.out_bytes.len() - drafts]
    }

    fn token_bytes_len(&self, from: usize, tok: &Tokenizer) -> usize {
        self.tokens[from..]
            .iter()
            .map(|&t| tok.token_bytes(t).map_or(0, |b| b.len()))
            .sum()
    }

    /// The finished request's result.
    pub fn completion(&mut self) -> Completion {
        let now = Instant::now();
        self.stats.total_s = (now - self.submitted).as_secs_f64();
        let answer =
            String::from_utf8_lossy(&self.out_bytes[self.answer_start.min(self.out_bytes.len())..])
                .into_owned();
        let reasoning = self.req.reasoning.as_ref().map(|_| {
            String::from_utf8_lossy(&self.out_bytes[..self.answer_start.min(self.out_bytes.len())])
                .into_owned()
        });
        Completion {
            id: self.id,
            text: answer,
            reasoning,
            tokens: self.tokens[self.prompt_len.min(self.tokens.len())..].to_vec(),
            finish: self.finish.clone().unwrap_or(FinishReason::Length),
            stats: self.stats.clone(),
        }
    }

    pub fn holds_lock(&self) -> bool {
        self.node != ROOT
    }
}

/// How many leading tokens of `ids` fit in the first `bytes` bytes.
fn tokens_within(ids: &[u32], bytes: usize, tok: &Tokenizer) -> usize {
    let mut end = 0;
    ids.iter()
        .take_while(|&&t| {
            end += tok.token_bytes(t).map_or(0, |b| b.len());
            end <= bytes
        })
        .count()
}

fn find_from(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    (from..=hay.len() - needle.len()).find(|&i| &hay[i..i + needle.len()] == needle)
}
