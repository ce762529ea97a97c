//! The per-sequence matcher: a DFA state plus the states before each accepted token, for rollback.

use std::borrow::Cow;
use std::sync::Arc;

use crate::error::Rejection;
use crate::grammar::Grammar;
use crate::schema::unique::Tracker;

/// A token walked from a matcher's position but not yet accepted ([`Matcher::peek_token`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peek {
    id: u32,
    /// The state and history length it was walked from.
    from: u32,
    at: usize,
    next: u32,
}

impl Peek {
    /// The token walked.
    pub fn token(&self) -> u32 {
        self.id
    }
}

/// One sequence's position in a shared [`Grammar`]. A few words of state; accepting a token
/// allocates nothing once the history has grown to the sequence length (reserve it with
/// [`Matcher::with_capacity`]). A JSON Schema whose `uniqueItems` is checked while decoding
/// ([`crate::schema::unique`]) adds a tracker that keeps the text and the items of the arrays
/// being checked; its masks are then filtered copies while such an array is open.
#[derive(Debug, Clone)]
pub struct Matcher {
    grammar: Arc<Grammar>,
    state: u32,
    /// `history[i]` is the state before the i-th accepted token (EOS included).
    history: Vec<u32>,
    terminated: bool,
    /// Only for schemas with `uniqueItems` the DFA cannot enforce ([`crate::schema::unique`]).
    unique: Option<Box<Unique>>,
}

#[derive(Debug, Clone)]
struct Unique {
    tracker: Tracker,
    /// `marks[i]` is the tracker's length before the i-th accepted token (as `history`).
    marks: Vec<usize>,
}

impl Matcher {
    pub fn new(grammar: Arc<Grammar>) -> Self {
        Self::with_capacity(grammar, 0)
    }

    /// A matcher whose rollback history holds `tokens` entries without reallocating.
    pub fn with_capacity(grammar: Arc<Grammar>, tokens: usize) -> Self {
        let state = grammar.start();
        let unique = grammar.unique_plan().map(|plan| {
            Box::new(Unique {
                tracker: Tracker::new(plan.clone()),
                marks: Vec::with_capacity(tokens),
            })
        });
        Self {
            grammar,
            state,
            history: Vec::with_capacity(tokens),
            terminated: false,
            unique,
        }
    }

    pub fn grammar(&self) -> &Arc<Grammar> {
        &self.grammar
    }

    #[inline]
    fn walk(&self, bytes: &[u8]) -> Result<u32, usize> {
        let mut s = self.state;
        for (i, &b) in bytes.iter().enumerate() {
            s = self.grammar.step(s, b).ok_or(i)?;
        }
        Ok(s)
    }

    /// Accepts token `id`, or leaves the matcher unchanged and says why not.
    pub fn accept_token(&mut self, id: u32) -> Result<(), Rejection> {
        if self.terminated {
            return Err(Rejection::Terminated);
        }
        if self.grammar.vocabulary().is_eos(id) {
            if !self.is_accepting() {
                return Err(Rejection::EosNotAllowed);
            }
            self.history.push(self.state);
            if let Some(u) = self.unique.as_mut() {
                u.marks.push(u.tracker.len());
            }
            self.terminated = true;
            return Ok(());
        }
        let peek = self.peek_token(id)?;
        self.accept_peeked(peek)
    }

    /// Walks token `id` (not end of generation) from here without accepting it: what the token
    /// budget looks at before a token is taken ([`Matcher::completion_after_peek`]), then
    /// accepted with [`Matcher::accept_peeked`] without walking its bytes a second time.
    #[inline]
    pub fn peek_token(&self, id: u32) -> Result<Peek, Rejection> {
        if self.terminated {
            return Err(Rejection::Terminated);
        }
        let vocab = self.grammar.vocabulary();
        if vocab.is_eos(id) || vocab.is_special(id) {
            return Err(Rejection::Special { id });
        }
        let bytes = vocab
            .token_bytes(id)
            .ok_or(Rejection::UnknownToken { id })?;
        let next = self.walk(bytes).map_err(|_| Rejection::Token { id })?;
        Ok(Peek {
            id,
            from: self.state,
            at: self.history.len(),
            next,
        })
    }

    /// The tokens a shortest completion needs after a peeked token (a cached length: the walk
    /// was the peek's). `None` where no completion was found.
    #[inline]
    pub fn completion_after_peek(&self, peek: &Peek) -> Option<usize> {
        self.grammar.completion(peek.next).map(|c| c.len as usize)
    }

    /// Accepts a token [`Matcher::peek_token`] walked. A peek made at another position (the
    /// matcher moved since) is walked again, so the result is always that of
    /// [`Matcher::accept_token`].
    #[inline]
    pub fn accept_peeked(&mut self, peek: Peek) -> Result<(), Rejection> {
        if self.terminated {
            return Err(Rejection::Terminated);
        }
        let next = if peek.from == self.state && peek.at == self.history.len() {
            peek.next
        } else {
            self.peek_token(peek.id)?.next
        };
        if self.unique.is_some() {
            let bytes = self
                .grammar
                .vocabulary()
                .token_bytes(peek.id)
                .ok_or(Rejection::UnknownToken { id: peek.id })?;
            if let Some(mark) = Self::track(&mut self.unique, bytes)? {
                self.unique.as_mut().expect("tracked").marks.push(mark);
            }
        }
        self.history.push(self.state);
        self.state = next;
        Ok(())
    }

    /// Accepts raw bytes (forced bytes, a prefix) without counting them as a token: they cannot be
    /// rolled back on their own.
    pub fn accept_bytes(&mut self, bytes: &[u8]) -> Result<(), Rejection> {
        if self.terminated {
            return Err(Rejection::Terminated);
        }
        let next = self
            .walk(bytes)
            .map_err(|offset| Rejection::Bytes { offset })?;
        Self::track(&mut self.unique, bytes)?;
        self.state = next;
        Ok(())
    }

    /// Feeds `bytes` (which the DFA accepts) to the `uniqueItems` tracker, if any: its length
    /// before them, or the refusal (the tracker then unchanged).
    fn track(unique: &mut Option<Box<Unique>>, bytes: &[u8]) -> Result<Option<usize>, Rejection> {
        let Some(u) = unique.as_mut() else {
            return Ok(None);
        };
        let mark = u.tracker.len();
        if u.tracker.dead_string_item(bytes) {
            return Err(Rejection::DuplicateItem);
        }
        if u.tracker.feed(bytes).is_err() {
            u.tracker.truncate(mark);
            return Err(Rejection::DuplicateItem);
        }
        Ok(Some(mark))
    }

    /// Writes the allowed next tokens into `mask` (bit `i % 32` of word `i / 32` = token `i`).
    /// `mask` must hold [`crate::Vocabulary::mask_words`] words. After EOS nothing is allowed.
    pub fn fill_mask(&self, mask: &mut [u32]) {
        if self.terminated {
            mask.fill(0);
        } else {
            mask.copy_from_slice(self.grammar.mask(self.state));
            self.drop_duplicates(mask);
        }
    }

    /// The mask of the current state: the grammar's cached one, not copied, unless an array
    /// whose items must be unique is open (then a filtered copy).
    pub fn mask(&self) -> Cow<'_, [u32]> {
        let cached = self.grammar.mask(self.state);
        match &self.unique {
            Some(u) if u.tracker.is_checking() => {
                let mut mask = cached.to_vec();
                self.drop_duplicates(&mut mask);
                Cow::Owned(mask)
            }
            _ => Cow::Borrowed(cached),
        }
    }

    /// Clears the tokens that would complete an item equal to an earlier one of an array whose
    /// items must be unique.
    fn drop_duplicates(&self, mask: &mut [u32]) {
        let Some(u) = self.unique.as_ref().filter(|u| u.tracker.is_checking()) else {
            return;
        };
        let vocab = self.grammar.vocabulary();
        let ends = vocab.json_ends();
        let ends = if u.tracker.in_string() {
            &ends.in_string
        } else {
            &ends.outside
        };
        let every = u.tracker.tries_every_token();
        for (w, word) in mask.iter_mut().enumerate() {
            let mut bits = if every { *word } else { *word & ends[w] };
            while bits != 0 {
                let bit = bits.trailing_zeros();
                bits &= bits - 1;
                let id = (w * 32) as u32 + bit;
                if vocab.is_special(id) {
                    continue;
                }
                if let Some(bytes) = vocab.token_bytes(id) {
                    if u.tracker.would_duplicate(bytes) {
                        *word &= !(1 << bit);
                    }
                }
            }
        }
    }

    /// The input so far is a complete match.
    pub fn is_accepting(&self) -> bool {
        !self.terminated && self.grammar.is_accepting(self.state)
    }

    /// Whether byte `b` may come next: the first byte of every token the mask allows passes.
    pub fn allows_byte(&self, b: u8) -> bool {
        !self.terminated && self.grammar.step(self.state, b).is_some()
    }

    /// No further byte can be added (EOS was accepted, or the language has no longer word).
    pub fn is_finished(&self) -> bool {
        self.terminated || self.grammar.is_finished(self.state)
    }

    /// Bytes every continuation must start with (jump-forward); empty when there is a choice.
    pub fn forced_bytes(&self) -> &[u8] {
        if self.terminated {
            &[]
        } else {
            self.grammar.forced(self.state)
        }
    }

    /// The length in tokens of a shortest completion from here ([`crate::Grammar::shortest_record`]'s
    /// measure, `docs/budget.md`): 0 where the input is already a match, `None` after EOS or
    /// where the search found none. Cached per state: a lookup once computed.
    pub fn completion_len(&self) -> Option<usize> {
        if self.terminated {
            return None;
        }
        self.grammar.completion(self.state).map(|c| c.len as usize)
    }

    /// The first token of that completion (`None` where the input is a match or there is none):
    /// following it always leaves a completion exactly one token shorter.
    pub fn completion_first(&self) -> Option<u32> {
        if self.terminated {
            return None;
        }
        self.grammar
            .completion(self.state)
            .filter(|c| c.len > 0)
            .map(|c| c.token)
    }

    /// The whole completion from here, token by token (for display and tests).
    pub fn completion_tokens(&self) -> Option<Vec<u32>> {
        if self.terminated {
            return None;
        }
        crate::budget::tokens(&self.grammar, self.state)
    }

    /// The tokens a shortest completion needs after token `id`: `Some(0)` for EOS where the
    /// input is a match, `None` where the constraint refuses `id` or no completion was found.
    /// The `uniqueItems` tracker is not consulted (see [`Matcher::accept_token`]).
    pub fn completion_after(&self, id: u32) -> Option<usize> {
        if self.terminated {
            return None;
        }
        if self.grammar.vocabulary().is_eos(id) {
            return self.is_accepting().then_some(0);
        }
        let peek = self.peek_token(id).ok()?;
        self.completion_after_peek(&peek)
    }

    /// Clears from `mask` every token after which no completion fits: a token fits when it and
    /// a shortest completion after it take at most `left` tokens (EOS, which ends the output
    /// without taking a token, fits wherever it is allowed). Returns the tokens kept. The state's
    /// fit table ([`crate::fits`], shared by the grammar's matchers and built on the second call
    /// in a state) makes it a mask AND; elsewhere it walks the vocabulary's trie from the state
    /// (the same result as [`Matcher::retain_fitting_by_walk`]).
    pub fn retain_fitting(&self, mask: &mut [u32], left: usize) -> usize {
        if self.terminated {
            mask.fill(0);
            return 0;
        }
        if let Some(kept) = self.grammar.retain_fitting_by_table(self.state, mask, left) {
            return kept;
        }
        self.grammar.retain_fitting_by_trie(self.state, mask, left)
    }

    /// [`Matcher::retain_fitting`] by walking each allowed token's bytes: the reference the fit
    /// tables and the trie walk are tested against.
    pub fn retain_fitting_by_walk(&self, mask: &mut [u32], left: usize) -> usize {
        let mut kept = 0;
        for (w, word) in mask.iter_mut().enumerate() {
            let mut bits = *word;
            while bits != 0 {
                let bit = bits.trailing_zeros();
                bits &= bits - 1;
                let id = (w * 32) as u32 + bit;
                let fits = match self.completion_after(id) {
                    Some(0) if self.grammar.vocabulary().is_eos(id) => true,
                    Some(need) => need < left,
                    None => false,
                };
                if fits {
                    kept += 1;
                } else {
                    *word &= !(1 << bit);
                }
            }
        }
        kept
    }

    /// Number of tokens accepted so far (EOS included).
    pub fn tokens_accepted(&self) -> usize {
        self.history.len()
    }

    /// Undoes the last `n` accepted tokens (with any bytes accepted after them). Returns the number
    /// actually undone, at most [`Matcher::tokens_accepted`].
    pub fn rollback(&mut self, n: usize) -> usize {
        let n = n.min(self.history.len());
        if n > 0 {
            let keep = self.history.len() - n;
            self.state = self.history[keep];
            self.history.truncate(keep);
            self.terminated = false;
            if let Some(u) = self.unique.as_mut() {
                u.tracker.truncate(u.marks[keep]);
                u.marks.truncate(keep);
            }
        }
        n
    }

    /// An independent copy at the same position (for beam search or speculative branches).
    pub fn fork(&self) -> Self {
        self.clone()
    }
}
