//! The per-sequence matcher: a DFA state plus the states before each accepted token, for rollback.

use std::sync::Arc;

use crate::error::Rejection;
use crate::grammar::Grammar;

/// One sequence's position in a shared [`Grammar`]. A few words of state; accepting a token
/// allocates nothing once the history has grown to the sequence length (reserve it with
/// [`Matcher::with_capacity`]).
#[derive(Debug, Clone)]
pub struct Matcher {
    grammar: Arc<Grammar>,
    state: u32,
    /// `history[i]` is the state before the i-th accepted token (EOS included).
    history: Vec<u32>,
    terminated: bool,
}

impl Matcher {
    pub fn new(grammar: Arc<Grammar>) -> Self {
        Self::with_capacity(grammar, 0)
    }

    /// A matcher whose rollback history holds `tokens` entries without reallocating.
    pub fn with_capacity(grammar: Arc<Grammar>, tokens: usize) -> Self {
        let state = grammar.start();
        Self {
            grammar,
            state,
            history: Vec::with_capacity(tokens),
            terminated: false,
        }
    }

    pub fn grammar(&self) -> &Arc<Grammar> {
        &self.grammar
    }

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
        let vocab = self.grammar.vocabulary();
        if vocab.is_eos(id) {
            if !self.is_accepting() {
                return Err(Rejection::EosNotAllowed);
            }
            self.history.push(self.state);
            self.terminated = true;
            return Ok(());
        }
        if vocab.is_special(id) {
            return Err(Rejection::Special { id });
        }
        let bytes = vocab
            .token_bytes(id)
            .ok_or(Rejection::UnknownToken { id })?;
        let next = self.walk(bytes).map_err(|_| Rejection::Token { id })?;
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
        self.state = self
            .walk(bytes)
            .map_err(|offset| Rejection::Bytes { offset })?;
        Ok(())
    }

    /// Writes the allowed next tokens into `mask` (bit `i % 32` of word `i / 32` = token `i`).
    /// `mask` must hold [`crate::Vocabulary::mask_words`] words. After EOS nothing is allowed.
    pub fn fill_mask(&self, mask: &mut [u32]) {
        if self.terminated {
            mask.fill(0);
        } else {
            mask.copy_from_slice(self.grammar.mask(self.state));
        }
    }

    /// The cached mask of the current state, without copying.
    pub fn mask(&self) -> &[u32] {
        self.grammar.mask(self.state)
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
        }
        n
    }

    /// An independent copy at the same position (for beam search or speculative branches).
    pub fn fork(&self) -> Self {
        self.clone()
    }
}
