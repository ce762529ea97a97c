//! What the two grammar-file parsers, GBNF ([`crate::gbnf`]) and Lark ([`crate::lark`]), share:
//! the table of named rules, positions reported as line and column, and the scanning of
//! characters, hex escapes and repetition bounds.

use rustc_hash::FxHashMap;

use crate::cfg::Rules;
use crate::deriv::{Id, Terms};
use crate::error::GrammarError;

/// The largest bound a counted repetition may have.
pub(crate) const MAX_REPEAT: u32 = 100_000;

/// `InvalidGrammar` at byte offset `at` of `text`, as a line and a column (in characters), both
/// from 1.
pub(crate) fn error_at(text: &str, at: usize, message: &str) -> GrammarError {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    GrammarError::InvalidGrammar {
        line,
        column,
        message: message.to_owned(),
    }
}

/// A parser over grammar text: the text and the position are the implementor's, the scanning is
/// shared.
pub(crate) trait Scan {
    fn text(&self) -> &str;
    fn pos(&mut self) -> &mut usize;
    fn at(&self) -> usize;

    fn error_at(&self, at: usize, message: &str) -> GrammarError {
        error_at(self.text(), at, message)
    }

    fn error(&self, message: &str) -> GrammarError {
        self.error_at(self.at(), message)
    }

    fn peek(&self) -> Option<char> {
        self.text()[self.at()..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        *self.pos() += c.len_utf8();
        Some(c)
    }

    fn eat(&mut self, prefix: &str) -> bool {
        if self.text()[self.at()..].starts_with(prefix) {
            *self.pos() += prefix.len();
            true
        } else {
            false
        }
    }

    /// Skips to the end of the line (a comment).
    fn skip_line(&mut self) {
        let rest = &self.text()[self.at()..];
        *self.pos() += rest.find('\n').unwrap_or(rest.len());
    }

    /// The characters from here while `is_char` holds (none: `None`).
    fn name_by(&mut self, is_char: fn(char) -> bool) -> Option<String> {
        let start = self.at();
        while self.peek().is_some_and(is_char) {
            *self.pos() += 1;
        }
        let end = self.at();
        (end > start).then(|| self.text()[start..end].to_owned())
    }

    /// The character of the `n` hex digits here, after the escape `\e` that began at `at`.
    fn hex(&mut self, at: usize, e: char, n: usize) -> Result<char, GrammarError> {
        let i = self.at();
        let digits = self
            .text()
            .get(i..i + n)
            .filter(|d| d.len() == n && d.bytes().all(|b| b.is_ascii_hexdigit()))
            .map(str::to_owned);
        let Some(digits) = digits else {
            return Err(self.error_at(at, &format!("`\\{e}` needs {n} hex digits")));
        };
        *self.pos() += n;
        let v = u32::from_str_radix(&digits, 16).expect("hex digits");
        char::from_u32(v)
            .ok_or_else(|| self.error_at(at, &format!("U+{v:X} is not a Unicode scalar value")))
    }

    /// A repetition bound (digits, up to [`MAX_REPEAT`]) for the repetition that began at `at`.
    fn bound(&mut self, at: usize) -> Result<u32, GrammarError> {
        let start = self.at();
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            *self.pos() += 1;
        }
        self.text()[start..self.at()]
            .parse::<u32>()
            .ok()
            .filter(|&n| n <= MAX_REPEAT)
            .ok_or_else(|| {
                self.error_at(
                    at,
                    &format!("a repetition bound is a number up to {MAX_REPEAT}"),
                )
            })
    }
}

/// The named rules of a grammar file as they are defined, in order of first mention; the start
/// rule is made first.
pub(crate) struct RuleTable {
    index: FxHashMap<String, u32>,
    names: Vec<String>,
    bodies: Vec<Option<Id>>,
    /// Byte offset of each name's first mention (for "never defined").
    first_use: Vec<usize>,
}

impl RuleTable {
    pub(crate) fn new(start: &str) -> Self {
        let mut t = Self {
            index: FxHashMap::default(),
            names: Vec::new(),
            bodies: Vec::new(),
            first_use: Vec::new(),
        };
        t.rule(start, 0);
        t
    }

    /// The number of rule `name`, made at its first mention (`at`).
    pub(crate) fn rule(&mut self, name: &str, at: usize) -> u32 {
        if let Some(&r) = self.index.get(name) {
            return r;
        }
        let r = self.names.len() as u32;
        self.index.insert(name.to_owned(), r);
        self.names.push(name.to_owned());
        self.bodies.push(None);
        self.first_use.push(at);
        r
    }

    pub(crate) fn body(&self, r: u32) -> Option<Id> {
        self.bodies[r as usize]
    }

    /// Defines rule `name` (defined at `at` of `text`): an error if it already was.
    pub(crate) fn define(
        &mut self,
        text: &str,
        name: &str,
        at: usize,
        body: Id,
    ) -> Result<(), GrammarError> {
        let r = self.rule(name, at);
        if self.bodies[r as usize].is_some() {
            return Err(error_at(text, at, &format!("`{name}` is defined twice")));
        }
        self.bodies[r as usize] = Some(body);
        Ok(())
    }

    /// Sets the body of rule `r`, defined or not.
    pub(crate) fn set(&mut self, r: u32, body: Id) {
        self.bodies[r as usize] = Some(body);
    }

    /// The rules, once every rule mentioned is defined; `no_start` is the error when the start
    /// rule is not.
    pub(crate) fn finish(
        self,
        terms: Terms,
        text: &str,
        no_start: &str,
    ) -> Result<Rules, GrammarError> {
        if self.bodies[0].is_none() {
            return Err(error_at(text, 0, no_start));
        }
        if let Some(r) = self.bodies.iter().position(Option::is_none) {
            return Err(error_at(
                text,
                self.first_use[r],
                &format!("`{}` is used but never defined", self.names[r]),
            ));
        }
        Ok(Rules {
            terms,
            names: self.names,
            bodies: self.bodies.into_iter().map(Option::unwrap).collect(),
        })
    }
}
