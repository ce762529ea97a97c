//! GBNF, llama.cpp's grammar syntax, parsed into [`Rules`].
//!
//! The syntax is llama.cpp's (`grammars/README.md` there), so users' existing files work:
//! - `name ::= alternatives`, one rule per line; a rule may continue on the next lines after
//!   `::=`, after `|` and anywhere inside parentheses. Names are letters, digits, `-` and `_`.
//!   The start rule is `root`. `#` starts a comment that runs to the end of the line.
//! - `"literal"` with the escapes `\n \r \t \\ \" \[ \] \/ \- \^ \xHH \uHHHH \UHHHHHHHH`;
//!   `[a-z0-9_]` and `[^"\\]` character classes over code points; `.` for any character.
//! - grouping `( … )`, alternation `|`, and the repetitions `* + ?`, `{m}`, `{m,}`, `{m,n}`.
//!
//! A grammar matches characters, written as UTF-8 bytes. Errors name the line and column
//! ([`GrammarError::InvalidGrammar`]): unknown syntax, a reference to a rule that is not defined,
//! a rule defined twice, a missing `root`. llama.cpp's token references (`<[id]>`, `<name>`) are
//! refused: a quarry constraint is on text, so it holds under any tokenization.

use regex_syntax::hir::{ClassUnicode, ClassUnicodeRange};
use rustc_hash::FxHashMap;

use crate::cfg::Rules;
use crate::deriv::{Id, Terms, EMPTY, INF};
use crate::error::GrammarError;
use crate::parse::{literal, unicode_class};

/// The largest bound a `{m,n}` repetition may have.
const MAX_REPEAT: u32 = 100_000;
/// Deepest parenthesis nesting accepted.
const MAX_NESTING: usize = 200;

/// Parses GBNF `text` into rules, `root` first.
pub(crate) fn parse(text: &str) -> Result<Rules, GrammarError> {
    let mut p = Parser {
        s: text,
        i: 0,
        terms: Terms::new(),
        index: FxHashMap::default(),
        names: Vec::new(),
        bodies: Vec::new(),
        first_use: Vec::new(),
        depth: 0,
    };
    p.rule_index("root", 0);
    loop {
        p.space(true);
        if p.i >= p.s.len() {
            break;
        }
        p.rule()?;
    }
    if p.bodies[0].is_none() {
        return Err(p.error_at(0, "no `root` rule: the start rule must be called `root`"));
    }
    if let Some(r) = p.bodies.iter().position(Option::is_none) {
        return Err(p.error_at(
            p.first_use[r],
            &format!("rule `{}` is used but never defined", p.names[r]),
        ));
    }
    Ok(Rules {
        terms: p.terms,
        names: p.names,
        bodies: p.bodies.into_iter().map(Option::unwrap).collect(),
    })
}

struct Parser<'a> {
    s: &'a str,
    i: usize,
    terms: Terms,
    index: FxHashMap<String, u32>,
    names: Vec<String>,
    bodies: Vec<Option<Id>>,
    /// Byte offset of each rule's first mention (for "never defined").
    first_use: Vec<usize>,
    depth: usize,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// `InvalidGrammar` at byte offset `at` of `text`, as a line and a column (in characters), both
/// from 1. Shared with the Lark parser ([`crate::lark`]).
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

impl Parser<'_> {
    fn error_at(&self, at: usize, message: &str) -> GrammarError {
        error_at(self.s, at, message)
    }

    fn error(&self, message: &str) -> GrammarError {
        self.error_at(self.i, message)
    }

    fn peek(&self) -> Option<char> {
        self.s[self.i..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.i += c.len_utf8();
        Some(c)
    }

    fn eat(&mut self, prefix: &str) -> bool {
        if self.s[self.i..].starts_with(prefix) {
            self.i += prefix.len();
            true
        } else {
            false
        }
    }

    /// Skips spaces, tabs and comments, and newlines too when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.i += 1,
                '\r' | '\n' if newlines => self.i += 1,
                '#' => {
                    let end = self.s[self.i..]
                        .find('\n')
                        .map_or(self.s.len(), |e| self.i + e);
                    self.i = end;
                }
                _ => break,
            }
        }
    }

    fn rule_index(&mut self, name: &str, at: usize) -> u32 {
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

    fn name(&mut self) -> Option<&str> {
        let start = self.i;
        while self.peek().is_some_and(is_name_char) {
            self.i += 1;
        }
        (self.i > start).then(|| &self.s[start..self.i])
    }

    fn rule(&mut self) -> Result<(), GrammarError> {
        let at = self.i;
        let Some(name) = self.name() else {
            return Err(self.error("expected a rule name (letters, digits, `-`, `_`)"));
        };
        let name = name.to_owned();
        self.space(false);
        if !self.eat("::=") {
            return Err(self.error(&format!("expected `::=` after the rule name `{name}`")));
        }
        self.space(true);
        let body = self.alternatives()?;
        match self.peek() {
            None | Some('\n' | '\r') => {}
            Some(')') => return Err(self.error("`)` without a matching `(`")),
            Some(c) => return Err(self.error(&format!("unexpected {c:?}"))),
        }
        let r = self.rule_index(&name, at);
        if self.bodies[r as usize].is_some() {
            return Err(self.error_at(at, &format!("rule `{name}` is defined twice")));
        }
        self.bodies[r as usize] = Some(body);
        Ok(())
    }

    fn alternatives(&mut self) -> Result<Id, GrammarError> {
        let mut items = vec![self.sequence()?];
        while self.eat("|") {
            self.space(true);
            items.push(self.sequence()?);
        }
        Ok(self.terms.or(&items))
    }

    fn sequence(&mut self) -> Result<Id, GrammarError> {
        let nested = self.depth > 0;
        let mut parts = Vec::new();
        loop {
            match self.peek() {
                None | Some('|' | ')') => break,
                Some('\n' | '\r') if !nested => break,
                _ => {}
            }
            let atom = self.atom()?;
            let item = self.repetition(atom)?;
            parts.push(item);
            self.space(nested);
        }
        let mut acc = EMPTY;
        for &p in parts.iter().rev() {
            acc = self.terms.concat(p, acc);
        }
        Ok(acc)
    }

    fn atom(&mut self) -> Result<Id, GrammarError> {
        let at = self.i;
        match self.peek() {
            Some('"') => {
                self.i += 1;
                let mut bytes = Vec::new();
                loop {
                    match self.peek() {
                        None | Some('\n' | '\r') => {
                            return Err(self.error_at(at, "string literal is not closed"))
                        }
                        Some('"') => {
                            self.i += 1;
                            break;
                        }
                        _ => {
                            let c = self.char()?;
                            let mut buf = [0u8; 4];
                            bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                        }
                    }
                }
                Ok(literal(&mut self.terms, &bytes))
            }
            Some('[') => self.class(),
            Some('.') => {
                self.i += 1;
                let any = ClassUnicode::new([ClassUnicodeRange::new('\0', char::MAX)]);
                Ok(unicode_class(&mut self.terms, &any))
            }
            Some('(') => {
                self.i += 1;
                self.depth += 1;
                if self.depth > MAX_NESTING {
                    return Err(
                        self.error(&format!("parentheses nested deeper than {MAX_NESTING}"))
                    );
                }
                self.space(true);
                let inner = self.alternatives()?;
                if !self.eat(")") {
                    return Err(self.error_at(at, "`(` is not closed"));
                }
                self.depth -= 1;
                Ok(inner)
            }
            Some('<') => Err(self.error(
                "token references (`<[id]>`, `<name>`) are not supported: quarry constrains text",
            )),
            Some(c) if is_name_char(c) => {
                let name = self.name().expect("a name character").to_owned();
                let save = self.i;
                self.space(false);
                if self.s[self.i..].starts_with("::=") {
                    return Err(self.error_at(
                        at,
                        &format!("rule `{name}` starts before the previous rule's line ended"),
                    ));
                }
                self.i = save;
                let r = self.rule_index(&name, at);
                Ok(self.terms.rule_ref(r))
            }
            Some(c) => Err(self.error(&format!("unexpected {c:?}"))),
            None => Err(self.error("unexpected end of the grammar")),
        }
    }

    /// One character of a literal or class, escapes decoded.
    fn char(&mut self) -> Result<char, GrammarError> {
        let at = self.i;
        let c = self.bump().ok_or_else(|| self.error("unexpected end"))?;
        if c != '\\' {
            return Ok(c);
        }
        let e = self
            .bump()
            .ok_or_else(|| self.error("unexpected end after `\\`"))?;
        let hex = |p: &mut Self, n: usize| -> Result<char, GrammarError> {
            let digits =
                p.s.get(p.i..p.i + n)
                    .filter(|d| d.len() == n && d.bytes().all(|b| b.is_ascii_hexdigit()));
            let Some(digits) = digits else {
                return Err(p.error_at(at, &format!("`\\{e}` needs {n} hex digits")));
            };
            p.i += n;
            let v = u32::from_str_radix(digits, 16).expect("hex digits");
            char::from_u32(v)
                .ok_or_else(|| p.error_at(at, &format!("U+{v:X} is not a Unicode scalar value")))
        };
        Ok(match e {
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            '\\' | '"' | '[' | ']' | '/' | '-' | '^' => e,
            'x' => hex(self, 2)?,
            'u' => hex(self, 4)?,
            'U' => hex(self, 8)?,
            _ => return Err(self.error_at(at, &format!("unknown escape `\\{e}`"))),
        })
    }

    fn class(&mut self) -> Result<Id, GrammarError> {
        let at = self.i;
        self.i += 1; // `[`
        let negated = self.eat("^");
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None | Some('\n' | '\r') => {
                    return Err(self.error_at(at, "character class is not closed"))
                }
                Some(']') => {
                    self.i += 1;
                    break;
                }
                _ => {}
            }
            let lo = self.char()?;
            let mut hi = lo;
            if self.peek() == Some('-') && !self.s[self.i + 1..].starts_with(']') {
                self.i += 1;
                if matches!(self.peek(), None | Some('\n' | '\r')) {
                    return Err(self.error_at(at, "character class is not closed"));
                }
                hi = self.char()?;
                if hi < lo {
                    return Err(self.error_at(at, &format!("range {lo:?}-{hi:?} is reversed")));
                }
            }
            ranges.push(ClassUnicodeRange::new(lo, hi));
        }
        let mut class = ClassUnicode::new(ranges);
        if negated {
            class.negate();
        }
        if class.ranges().is_empty() {
            return Err(self.error_at(at, "the character class matches nothing"));
        }
        Ok(unicode_class(&mut self.terms, &class))
    }

    fn repetition(&mut self, atom: Id) -> Result<Id, GrammarError> {
        let (min, max) = match self.peek() {
            Some('*') => (0, INF),
            Some('+') => (1, INF),
            Some('?') => (0, 1),
            Some('{') => {
                let at = self.i;
                self.i += 1;
                self.space(false);
                let min = self.number(at)?;
                self.space(false);
                let max = if self.eat(",") {
                    self.space(false);
                    if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                        self.number(at)?
                    } else {
                        INF
                    }
                } else {
                    min
                };
                self.space(false);
                if self.peek() != Some('}') {
                    return Err(self.error_at(at, "expected `{m}`, `{m,}` or `{m,n}`"));
                }
                if min > max {
                    return Err(self.error_at(at, &format!("repetition {{{min},{max}}} is empty")));
                }
                (min, max)
            }
            _ => return Ok(atom),
        };
        self.i += 1;
        if matches!(self.peek(), Some('*' | '+' | '?' | '{')) {
            return Err(self.error("a repetition of a repetition needs parentheses"));
        }
        Ok(self.terms.repeat(atom, min, max))
    }

    fn number(&mut self, at: usize) -> Result<u32, GrammarError> {
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        self.s[start..self.i]
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
