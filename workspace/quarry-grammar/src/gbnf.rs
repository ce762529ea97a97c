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

use crate::cfg::Rules;
use crate::deriv::{Id, Terms, EMPTY, INF};
use crate::ebnf::{RuleTable, Scan};
use crate::error::GrammarError;
use crate::parse::{literal, unicode_class};
use regex_syntax::hir::{ClassUnicode, ClassUnicodeRange};

/// Deepest parenthesis nesting accepted.
const MAX_NESTING: usize = 200;

/// Parses GBNF `text` into rules, `root` first.
pub(crate) fn parse(text: &str) -> Result<Rules, GrammarError> {
    let mut p = Parser {
        s: text,
        i: 0,
        terms: Terms::new(),
        rules: RuleTable::new("root"),
        depth: 0,
    };
    loop {
        p.space(true);
        if p.i >= p.s.len() {
            break;
        }
        p.rule()?;
    }
    p.rules.finish(
        p.terms,
        text,
        "no `root` rule: the start rule must be called `root`",
    )
}

struct Parser<'a> {
    s: &'a str,
    i: usize,
    terms: Terms,
    rules: RuleTable,
    depth: usize,
}

impl Scan for Parser<'_> {
    fn text(&self) -> &str {
        self.s
    }
    fn pos(&mut self) -> &mut usize {
        &mut self.i
    }
    fn at(&self) -> usize {
        self.i
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

impl Parser<'_> {
    /// Skips spaces, tabs and comments, and newlines too when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.i += 1,
                '\r' | '\n' if newlines => self.i += 1,
                '#' => self.skip_line(),
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        self.name_by(is_name_char)
    }

    fn rule(&mut self) -> Result<(), GrammarError> {
        let at = self.i;
        let Some(name) = self.name() else {
            return Err(self.error("expected a rule name (letters, digits, `-`, `_`)"));
        };
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
        self.rules.define(self.s, &name, at, body)
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
                let name = self.name().expect("a name character");
                let save = self.i;
                self.space(false);
                if self.s[self.i..].starts_with("::=") {
                    return Err(self.error_at(
                        at,
                        &format!("rule `{name}` starts before the previous rule's line ended"),
                    ));
                }
                self.i = save;
                let r = self.rules.rule(&name, at);
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
        Ok(match e {
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            '\\' | '"' | '[' | ']' | '/' | '-' | '^' => e,
            'x' => self.hex(at, e, 2)?,
            'u' => self.hex(at, e, 4)?,
            'U' => self.hex(at, e, 8)?,
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
                let min = self.bound(at)?;
                self.space(false);
                let max = if self.eat(",") {
                    self.space(false);
                    if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                        self.bound(at)?
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
}
