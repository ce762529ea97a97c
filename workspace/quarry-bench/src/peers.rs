//! The same vocabulary and regex handed to each peer, behind one small interface: compile, then per
//! step write the allowed set as a `u32` bitmask (what an engine applies to logits) and accept a
//! token.

use std::sync::Arc;

use anyhow::{anyhow, Result};
use quarry_grammar::{Constraint, Grammar, Limits, Matcher, SchemaOptions, Vocabulary, Whitespace};

/// A compiled constraint's per-sequence walker.
pub trait Walker {
    /// Writes the allowed next tokens into `mask` (bit `i % 32` of word `i / 32`).
    fn fill_mask(&mut self, mask: &mut [u32]);
    /// Accepts a token; false if the engine refuses it.
    fn accept(&mut self, token: u32) -> bool;
    /// The token budget's check of a drawn token (`docs/budget.md`): the tokens a shortest
    /// completion needs after `token`. `None` for an engine without a budget (every peer).
    fn budget_check(&mut self, _token: u32) -> Option<usize> {
        None
    }
    /// Accepts a token as the engine does under the budget: one walk of its bytes serves the
    /// check (the tokens a completion needs after it, returned) and the acceptance. `None`
    /// where the engine has no budget or refuses the token.
    fn budget_accept(&mut self, _token: u32) -> Option<usize> {
        None
    }
}

/// A constraint for every peer: the same regex or JSON Schema for all, or a grammar written in
/// each peer's own syntax (GBNF for quarry, Lark for llguidance: the same language by hand).
#[derive(Debug, Clone)]
pub enum Spec {
    Regex(String),
    /// A JSON Schema; output is compact JSON (`,` and `:` with no spaces).
    Schema(serde_json::Value),
    /// Any JSON object, compact.
    JsonObject,
    Grammar {
        gbnf: String,
        lark: String,
    },
}

/// One engine under test.
pub trait Peer {
    fn name(&self) -> &'static str;
    /// Compiles `regex` (full match) into something that can start walks.
    fn compile(&self, regex: &str) -> Result<Box<dyn Compiled + '_>>;
    /// Compiles any [`Spec`]; peers without grammars or schemas refuse those.
    fn compile_spec(&self, spec: &Spec) -> Result<Box<dyn Compiled + '_>> {
        match spec {
            Spec::Regex(r) => self.compile(r),
            _ => Err(anyhow!("{} takes regexes only", self.name())),
        }
    }
}

/// A compiled constraint; `walker` starts a fresh sequence sharing the compiled state (and, for
/// engines that have one, its cache).
pub trait Compiled {
    fn walker(&self) -> Result<Box<dyn Walker + '_>>;
}

// ---------------------------------------------------------------------------------------------
// quarry

/// quarry's grammar. `eager` computes every state's mask at compile time on one thread (what
/// outlines-core's `Index` does), instead of on first use.
pub struct Quarry {
    pub vocab: Arc<Vocabulary>,
    pub eager: bool,
}

impl Peer for Quarry {
    fn name(&self) -> &'static str {
        if self.eager {
            "quarry (eager)"
        } else {
            "quarry"
        }
    }
    fn compile(&self, regex: &str) -> Result<Box<dyn Compiled + '_>> {
        self.compile_spec(&Spec::Regex(regex.into()))
    }
    fn compile_spec(&self, spec: &Spec) -> Result<Box<dyn Compiled + '_>> {
        let c = match spec {
            Spec::Regex(r) => Constraint::Regex(r.clone()),
            Spec::Schema(s) => Constraint::JsonSchema {
                schema: s.clone(),
                options: SchemaOptions::default(),
            },
            Spec::JsonObject => Constraint::JsonObject {
                whitespace: Whitespace::Compact,
            },
            Spec::Grammar { gbnf, .. } => Constraint::Gbnf(gbnf.clone()),
        };
        let g = Grammar::compile(&c, self.vocab.clone(), Limits::default())?;
        if self.eager {
            g.precompute(1);
        }
        Ok(Box::new(Arc::new(g)))
    }
}

impl Compiled for Arc<Grammar> {
    fn walker(&self) -> Result<Box<dyn Walker + '_>> {
        Ok(Box::new(Matcher::with_capacity(self.clone(), 4096)))
    }
}

impl Walker for Matcher {
    fn fill_mask(&mut self, mask: &mut [u32]) {
        Matcher::fill_mask(self, mask)
    }
    fn accept(&mut self, token: u32) -> bool {
        self.accept_token(token).is_ok()
    }
    fn budget_check(&mut self, token: u32) -> Option<usize> {
        Some(self.completion_after(token).unwrap_or(usize::MAX))
    }
    fn budget_accept(&mut self, token: u32) -> Option<usize> {
        let peek = self.peek_token(token).ok()?;
        let need = self.completion_after_peek(&peek).unwrap_or(usize::MAX);
        self.accept_peeked(peek).ok()?;
        Some(need)
    }
}

/// Peers take one end-of-sequence id; quarry's first one (the others stay special).
pub fn single_eos(v: &Vocabulary) -> Result<u32> {
    v.eos()
        .first()
        .copied()
        .ok_or_else(|| anyhow!("vocabulary has no EOS"))
}

// ---------------------------------------------------------------------------------------------
// outlines-core

/// outlines-core's `Index` over the same token bytes. It has a single EOS id; the other special
/// tokens are left out, as quarry never allows them.
pub struct Outlines {
    pub vocab: outlines_core::vocabulary::Vocabulary,
    pub words: usize,
}

impl Outlines {
    pub fn new(v: &Vocabulary) -> Result<Self> {
        let eos = single_eos(v)?;
        let mut vocab = outlines_core::vocabulary::Vocabulary::new(eos);
        for id in 0..v.len() as u32 {
            let bytes = v.token_bytes(id).unwrap();
            if !v.is_special(id) && !bytes.is_empty() {
                vocab.try_insert(bytes.to_vec(), id)?;
            }
        }
        Ok(Self {
            vocab,
            words: v.mask_words(),
        })
    }
}

pub struct OutlinesIndex {
    pub index: outlines_core::index::Index,
}

impl Peer for Outlines {
    fn name(&self) -> &'static str {
        "outlines-core"
    }
    fn compile(&self, regex: &str) -> Result<Box<dyn Compiled + '_>> {
        let index = outlines_core::index::Index::new(regex, &self.vocab)?;
        Ok(Box::new(OutlinesIndex { index }))
    }
}

impl Compiled for OutlinesIndex {
    fn walker(&self) -> Result<Box<dyn Walker + '_>> {
        Ok(Box::new(OutlinesWalker {
            index: &self.index,
            state: Some(self.index.initial_state()),
        }))
    }
}

pub struct OutlinesWalker<'a> {
    index: &'a outlines_core::index::Index,
    state: Option<u32>,
}

impl Walker for OutlinesWalker<'_> {
    fn fill_mask(&mut self, mask: &mut [u32]) {
        mask.fill(0);
        if let Some(it) = self.state.and_then(|s| self.index.allowed_tokens_iter(&s)) {
            for &t in it {
                mask[t as usize / 32] |= 1 << (t % 32);
            }
        }
    }
    fn accept(&mut self, token: u32) -> bool {
        self.state = self.state.and_then(|s| self.index.next_state(&s, &token));
        self.state.is_some()
    }
}

// ---------------------------------------------------------------------------------------------
// llguidance

/// llguidance's matcher over a toktrie of the same token bytes (special tokens marked with its
/// 0xFF prefix so they are never matched as text).
pub struct Llguidance {
    pub factory: llguidance::ParserFactory,
}

impl Llguidance {
    pub fn new(v: &Vocabulary) -> Result<Self> {
        let eos = single_eos(v)?;
        let words: Vec<Vec<u8>> = (0..v.len() as u32)
            .map(|id| {
                let b = v.token_bytes(id).unwrap();
                if v.is_special(id) {
                    let mut w = vec![toktrie::TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(format!("<special_{id}>").as_bytes());
                    w
                } else {
                    b.to_vec()
                }
            })
            .collect();
        let info = toktrie::TokRxInfo::new(v.len() as u32, eos);
        let trie = toktrie::TokTrie::from(&info, &words);
        let env: toktrie::TokEnv = Arc::new(toktrie::ApproximateTokEnv::new(trie));
        let mut factory = llguidance::ParserFactory::new_simple(&env)?;
        factory.quiet();
        Ok(Self { factory })
    }
}

pub struct LlgGrammar<'a> {
    factory: &'a llguidance::ParserFactory,
    grammar: llguidance::api::TopLevelGrammar,
}

/// llguidance's form of `spec`. Schemas get compact separators and no free whitespace, so that
/// they describe the same outputs as quarry's compact layout.
fn llg_grammar(spec: &Spec) -> llguidance::api::TopLevelGrammar {
    use llguidance::api::TopLevelGrammar;
    let compact = |mut s: serde_json::Value| {
        if let Some(m) = s.as_object_mut() {
            m.insert(
                "x-guidance".into(),
                serde_json::json!({"whitespace_flexible": false, "item_separator": ",", "key_separator": ":"}),
            );
        }
        s
    };
    match spec {
        Spec::Regex(r) => TopLevelGrammar::from_regex(r),
        Spec::Schema(s) => TopLevelGrammar::from_json_schema(compact(s.clone())),
        Spec::JsonObject => {
            TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
        }
        Spec::Grammar { lark, .. } => TopLevelGrammar::from_lark(lark.clone()),
    }
}

impl Peer for Llguidance {
    fn name(&self) -> &'static str {
        "llguidance"
    }
    /// llguidance compiles lazily: "compile" creates the parser (grammar → lexer and parser
    /// tables), which is done per sequence.
    fn compile(&self, regex: &str) -> Result<Box<dyn Compiled + '_>> {
        self.compile_spec(&Spec::Regex(regex.into()))
    }
    fn compile_spec(&self, spec: &Spec) -> Result<Box<dyn Compiled + '_>> {
        let grammar = llg_grammar(spec);
        // Create one parser now so the compile cost and any error are seen here.
        self.factory.create_parser(grammar.clone())?;
        Ok(Box::new(LlgGrammar {
            factory: &self.factory,
            grammar,
        }))
    }
}

impl Compiled for LlgGrammar<'_> {
    fn walker(&self) -> Result<Box<dyn Walker + '_>> {
        let parser = self.factory.create_parser(self.grammar.clone())?;
        Ok(Box::new(llguidance::Matcher::new(Ok(parser))))
    }
}

impl Walker for llguidance::Matcher {
    /// The mask, or only the end token's bit once the parser has stopped (a complete record
    /// nothing may follow), as an engine asks it.
    fn fill_mask(&mut self, mask: &mut [u32]) {
        match self.compute_mask_or_eos() {
            Ok(v) => {
                let s = v.as_slice();
                let n = s.len().min(mask.len());
                mask[..n].copy_from_slice(&s[..n]);
                mask[n..].fill(0);
            }
            Err(_) => mask.fill(0),
        }
    }
    fn accept(&mut self, token: u32) -> bool {
        self.consume_token(token).is_ok()
    }
}
