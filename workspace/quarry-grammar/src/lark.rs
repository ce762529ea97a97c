//! Lark's grammar syntax (the subset that describes a language), parsed into [`Rules`].
//!
//! Lark is what llguidance and Outlines users write grammars in. The language a Lark grammar
//! describes is kept; what only shapes Lark's parse tree is read and ignored:
//! - `name: expansions` defines a rule (`?name` and `!name` too), `NAME: expansions` a terminal
//!   (`NAME.2` too: priorities only order Lark's lexer). The start rule is `start`. A definition
//!   continues on the next lines inside `( )` or `[ ]`, and on lines that begin with `|`.
//! - `"literal"` (Python escapes; `"…"i` ignores case), `/regex/flags` (the regex syntax of
//!   [`crate::Constraint::Regex`], flags `i` and `s`), `"a".."z"` character ranges, names of
//!   rules and terminals, `( … )`, `[ … ]` (optional), `|`, the repetitions `* + ?`, `~ n` and
//!   `~ n..m`, and `-> alias` (ignored). `//` starts a comment.
//! - `%import common.NAME` (or `%import common (A, B)`) for Lark's common terminals (`WS`,
//!   `NUMBER`, `ESCAPED_STRING`, `CNAME`…), and `%ignore X`: the text `X` matches may appear
//!   before the first terminal and after every terminal of a rule.
//!
//! Templates, `%declare`, `%override` and `%extend`, and imports from other files are refused
//! with the line and column. One difference from Lark itself: Lark's lexer splits text into
//! terminals first (longest match, by priority) and may reject a text whose characters the
//! grammar describes; quarry constrains the characters, so it allows every text of the language
//! the rules describe.

use crate::cfg::Rules;
use crate::deriv::{Id, Terms, EMPTY, INF};
use crate::ebnf::{RuleTable, Scan};
use crate::error::GrammarError;
use crate::parse::literal;

/// Deepest nesting of `( )` and `[ ]` accepted.
const MAX_NESTING: usize = 200;

/// Lark's `common.lark` terminals, as regexes.
const COMMON: &[(&str, &str)] = &[
    ("DIGIT", "[0-9]"),
    ("HEXDIGIT", "[0-9a-fA-F]"),
    ("INT", "[0-9]+"),
    ("SIGNED_INT", "[+-]?[0-9]+"),
    ("DECIMAL", r"[0-9]+\.[0-9]*|\.[0-9]+"),
    (
        "FLOAT",
        r"[0-9]+[eE][+-]?[0-9]+|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?",
    ),
    (
        "SIGNED_FLOAT",
        r"[+-]?(?:[0-9]+[eE][+-]?[0-9]+|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)",
    ),
    (
        "NUMBER",
        r"[0-9]+(?:[eE][+-]?[0-9]+)?|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?",
    ),
    (
        "SIGNED_NUMBER",
        r"[+-]?(?:[0-9]+(?:[eE][+-]?[0-9]+)?|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)",
    ),
    ("ESCAPED_STRING", r#""(?:[^"\\\n]|\\[^\n])*""#),
    ("LCASE_LETTER", "[a-z]"),
    ("UCASE_LETTER", "[A-Z]"),
    ("LETTER", "[A-Za-z]"),
    ("WORD", "[A-Za-z]+"),
    ("CNAME", "[A-Za-z_][A-Za-z0-9_]*"),
    ("WS_INLINE", "[ \t]+"),
    ("WS", "[ \t\x0C\r\n]+"),
    ("CR", "\r"),
    ("LF", "\n"),
    ("NEWLINE", "(?:\r?\n)+"),
];

/// Parses Lark `text` into rules, `start` first.
pub(crate) fn parse(text: &str) -> Result<Rules, GrammarError> {
    let mut p = Parser {
        s: text,
        i: 0,
        terms: Terms::new(),
        rules: RuleTable::new("start"),
        depth: 0,
        ignore: None,
        ignored: Vec::new(),
        in_rule: false,
    };
    if has_ignore(text) {
        p.ignore = Some(p.rules.rule("%ignore", 0));
    }
    loop {
        p.space(true);
        if p.i >= p.s.len() {
            break;
        }
        p.statement()?;
    }
    if let (Some(r), Some(start)) = (p.ignore, p.rules.body(0)) {
        if p.ignored.is_empty() {
            return Err(p.error_at(0, "`%ignore` without anything to ignore"));
        }
        let any = p.terms.or(&p.ignored);
        p.rules.set(r, any);
        // The ignored text may come before the first terminal too.
        let pre = p.ignored_run();
        let start = p.terms.concat(pre, start);
        p.rules.set(0, start);
    }
    p.rules.finish(p.terms, text, NO_START)
}

const NO_START: &str = "no `start` rule: Lark grammars start at the rule `start`";

/// Whether a line of `text` is an `%ignore` statement.
fn has_ignore(text: &str) -> bool {
    text.lines().any(|l| l.trim_start().starts_with("%ignore"))
}

struct Parser<'a> {
    s: &'a str,
    i: usize,
    terms: Terms,
    rules: RuleTable,
    depth: usize,
    /// The rule of what `%ignore` allows, when the grammar has any.
    ignore: Option<u32>,
    ignored: Vec<Id>,
    /// Parsing a rule (where terminals are followed by ignored text), not a terminal.
    in_rule: bool,
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
    c.is_ascii_alphanumeric() || c == '_'
}

/// A terminal's name: upper case (with digits and `_`), as Lark tells terminals from rules.
fn is_terminal_name(name: &str) -> bool {
    name.trim_start_matches('_')
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_uppercase())
}

impl Parser<'_> {
    /// Skips spaces, tabs and `//` comments, and newlines too when `newlines`. Without
    /// `newlines`, a newline followed by a line that begins with `|` is skipped as well: that
    /// line continues the definition.
    fn space(&mut self, newlines: bool) {
        loop {
            match self.peek() {
                Some(' ' | '\t') => self.i += 1,
                Some('\r' | '\n') if newlines => self.i += 1,
                Some('\r' | '\n') => {
                    let rest = &self.s[self.i..];
                    let next = rest.trim_start_matches([' ', '\t', '\r', '\n']);
                    if next.starts_with('|') {
                        self.i = self.s.len() - next.len();
                    } else {
                        break;
                    }
                }
                Some('/') if self.s[self.i..].starts_with("//") => self.skip_line(),
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        self.name_by(is_name_char)
    }

    /// The end of a statement: a newline or the end of the text.
    fn end_of_statement(&mut self) -> Result<(), GrammarError> {
        self.space(false);
        match self.peek() {
            None | Some('\n' | '\r') => Ok(()),
            Some(')') => Err(self.error("`)` without a matching `(`")),
            Some(']') => Err(self.error("`]` without a matching `[`")),
            Some(c) => Err(self.error(&format!("unexpected {c:?}"))),
        }
    }

    fn statement(&mut self) -> Result<(), GrammarError> {
        if self.peek() == Some('%') {
            return self.directive();
        }
        let at = self.i;
        let _ = self.eat("?") || self.eat("!");
        let Some(name) = self.name() else {
            return Err(self.error("expected a rule or terminal name, or a `%` directive"));
        };
        if self.peek() == Some('{') {
            return Err(self.error("templates (`name{…}`) are not supported"));
        }
        let terminal = is_terminal_name(&name);
        if terminal && self.eat(".") {
            // A priority: it orders Lark's lexer, not the language.
            let digits = self.i;
            self.eat("-");
            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                self.i += 1;
            }
            if self.i == digits {
                return Err(self.error("expected a priority number after `.`"));
            }
        }
        self.space(false);
        if !self.eat(":") {
            return Err(self.error(&format!("expected `:` after `{name}`")));
        }
        self.space(false);
        self.in_rule = !terminal;
        let body = self.alternatives()?;
        self.end_of_statement()?;
        self.rules.define(self.s, &name, at, body)
    }

    fn directive(&mut self) -> Result<(), GrammarError> {
        let at = self.i;
        self.i += 1; // `%`
        let word = self.name().unwrap_or_default();
        self.space(false);
        match word.as_str() {
            "import" => self.import(at),
            "ignore" => {
                self.in_rule = false;
                let x = self.alternatives()?;
                self.ignored.push(x);
                self.end_of_statement()
            }
            _ => Err(self.error_at(
                at,
                &format!("`%{word}` is not supported (only `%import common…` and `%ignore`)"),
            )),
        }
    }

    /// `%import common.NAME [-> ALIAS]` or `%import common (A, B)`.
    fn import(&mut self, at: usize) -> Result<(), GrammarError> {
        if !self.eat("common") {
            return Err(self.error_at(
                at,
                "only Lark's `common` terminals can be imported (a constraint is one file)",
            ));
        }
        let mut wanted = Vec::new();
        if self.eat(".") {
            let name = self.name().ok_or_else(|| self.error("expected a name"))?;
            self.space(false);
            let alias = if self.eat("->") {
                self.space(false);
                self.name().ok_or_else(|| self.error("expected a name"))?
            } else {
                name.clone()
            };
            wanted.push((name, alias));
        } else {
            self.space(false);
            if !self.eat("(") {
                return Err(self.error("expected `.NAME` or `(A, B, …)` after `common`"));
            }
            loop {
                self.space(true);
                let name = self.name().ok_or_else(|| self.error("expected a name"))?;
                wanted.push((name.clone(), name));
                self.space(true);
                if self.eat(")") {
                    break;
                }
                if !self.eat(",") {
                    return Err(self.error("expected `,` or `)`"));
                }
            }
        }
        for (name, alias) in wanted {
            let Some((_, re)) = COMMON.iter().find(|(n, _)| *n == name) else {
                let known: Vec<&str> = COMMON.iter().map(|(n, _)| *n).collect();
                return Err(self.error_at(
                    at,
                    &format!(
                        "`common.{name}` is not known; these are: {}",
                        known.join(", ")
                    ),
                ));
            };
            let body = crate::parse::parse(&mut self.terms, re, false)
                .expect("the common terminals are valid regexes");
            self.rules.define(self.s, &alias, at, body)?;
        }
        self.end_of_statement()
    }

    fn alternatives(&mut self) -> Result<Id, GrammarError> {
        let mut items = vec![self.sequence()?];
        while self.eat("|") {
            self.space(self.depth > 0);
            items.push(self.sequence()?);
        }
        Ok(self.terms.or(&items))
    }

    fn sequence(&mut self) -> Result<Id, GrammarError> {
        let nested = self.depth > 0;
        let mut parts = Vec::new();
        loop {
            match self.peek() {
                None | Some('|' | ')' | ']') => break,
                Some('\n' | '\r') if !nested => break,
                _ => {}
            }
            if self.eat("->") {
                // An alias names the tree node; the text is the same.
                self.space(false);
                self.name()
                    .ok_or_else(|| self.error("expected a name after `->`"))?;
                self.space(nested);
                continue;
            }
            let atom = self.atom()?;
            self.space(false);
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

    /// `x` followed by what `%ignore` allows, where `x` is a terminal inside a rule.
    fn terminal(&mut self, x: Id) -> Id {
        if !self.in_rule || self.ignore.is_none() {
            return x;
        }
        let run = self.ignored_run();
        self.terms.concat(x, run)
    }

    /// Any run of ignored text.
    fn ignored_run(&mut self) -> Id {
        match self.ignore {
            Some(r) => {
                let one = self.terms.rule_ref(r);
                self.terms.repeat(one, 0, INF)
            }
            None => EMPTY,
        }
    }

    fn atom(&mut self) -> Result<Id, GrammarError> {
        let at = self.i;
        match self.peek() {
            Some('"') => {
                let s = self.string()?;
                let x = if self.s[self.i..].starts_with("..") {
                    self.i += 2;
                    self.space(false);
                    let hi = self.string()?;
                    let (mut a, mut b) = (s.chars(), hi.chars());
                    let (Some(lo), None, Some(hi), None) = (a.next(), a.next(), b.next(), b.next())
                    else {
                        return Err(self
                            .error_at(at, "a range `\"a\"..\"z\"` takes one character each side"));
                    };
                    if hi < lo {
                        return Err(self.error_at(at, &format!("range {lo:?}..{hi:?} is reversed")));
                    }
                    let class = regex_syntax::hir::ClassUnicode::new([
                        regex_syntax::hir::ClassUnicodeRange::new(lo, hi),
                    ]);
                    crate::parse::unicode_class(&mut self.terms, &class)
                } else if self.eat("i") {
                    let re = format!("(?i:{})", regex_syntax::escape(&s));
                    crate::parse::parse(&mut self.terms, &re, false)
                        .map_err(|e| self.error_at(at, &e.to_string()))?
                } else {
                    literal(&mut self.terms, s.as_bytes())
                };
                Ok(self.terminal(x))
            }
            Some('/') => {
                let x = self.regex()?;
                Ok(self.terminal(x))
            }
            Some(open @ ('(' | '[')) => {
                self.i += 1;
                self.depth += 1;
                if self.depth > MAX_NESTING {
                    return Err(self.error(&format!("nested deeper than {MAX_NESTING}")));
                }
                self.space(true);
                let inner = self.alternatives()?;
                self.space(true);
                let close = if open == '(' { ")" } else { "]" };
                if !self.eat(close) {
                    return Err(self.error_at(at, &format!("`{open}` is not closed")));
                }
                self.depth -= 1;
                Ok(if open == '[' {
                    self.terms.repeat(inner, 0, 1)
                } else {
                    inner
                })
            }
            Some(c) if is_name_char(c) => {
                let name = self.name().expect("a name character");
                let save = self.i;
                self.space(false);
                if self.peek() == Some(':') || self.s[self.i..].starts_with(".") {
                    return Err(self.error_at(
                        at,
                        &format!("`{name}` starts a definition before the previous one ended"),
                    ));
                }
                self.i = save;
                let r = self.rules.rule(&name, at);
                let x = self.terms.rule_ref(r);
                Ok(if is_terminal_name(&name) {
                    self.terminal(x)
                } else {
                    x
                })
            }
            Some(c) => Err(self.error(&format!("unexpected {c:?}"))),
            None => Err(self.error("unexpected end of the grammar")),
        }
    }

    /// A `"…"` literal with Python's escapes, decoded.
    fn string(&mut self) -> Result<String, GrammarError> {
        let at = self.i;
        self.i += 1; // `"`
        let mut out = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err(self.error_at(at, "string literal is not closed"));
            };
            self.i += c.len_utf8();
            match c {
                '"' => return Ok(out),
                '\n' | '\r' => return Err(self.error_at(at, "string literal is not closed")),
                '\\' => {
                    let e = self
                        .peek()
                        .ok_or_else(|| self.error_at(at, "string literal is not closed"))?;
                    self.i += e.len_utf8();
                    let decoded = match e {
                        'n' => '\n',
                        'r' => '\r',
                        't' => '\t',
                        'f' => '\x0C',
                        'v' => '\x0B',
                        '0' => '\0',
                        '\\' | '"' | '\'' => e,
                        'x' => self.hex(at, e, 2)?,
                        'u' => self.hex(at, e, 4)?,
                        'U' => self.hex(at, e, 8)?,
                        _ => {
                            // Python keeps an unknown escape as written.
                            out.push('\\');
                            e
                        }
                    };
                    out.push(decoded);
                }
                _ => out.push(c),
            }
        }
    }

    /// A `/…/flags` regex.
    fn regex(&mut self) -> Result<Id, GrammarError> {
        let at = self.i;
        self.i += 1; // `/`
        let mut body = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err(self.error_at(at, "regex is not closed"));
            };
            self.i += c.len_utf8();
            match c {
                '/' => break,
                '\n' | '\r' => return Err(self.error_at(at, "regex is not closed")),
                '\\' if self.peek() == Some('/') => {
                    self.i += 1;
                    body.push('/');
                }
                '\\' => {
                    body.push('\\');
                    if let Some(e) = self.peek() {
                        self.i += e.len_utf8();
                        body.push(e);
                    }
                }
                _ => body.push(c),
            }
        }
        let mut flags = String::new();
        while let Some(f) = self.peek().filter(char::is_ascii_lowercase) {
            if !matches!(f, 'i' | 's') {
                return Err(self.error(&format!("regex flag `{f}` is not supported (`i`, `s`)")));
            }
            flags.push(f);
            self.i += 1;
        }
        let re = if flags.is_empty() {
            body
        } else {
            format!("(?{flags}:{body})")
        };
        crate::parse::parse(&mut self.terms, &re, false)
            .map_err(|e| self.error_at(at, &format!("in the regex: {e}")))
    }

    fn repetition(&mut self, atom: Id) -> Result<Id, GrammarError> {
        let (min, max) = match self.peek() {
            Some('*') => (0, INF),
            Some('+') => (1, INF),
            Some('?') => (0, 1),
            Some('~') => {
                let at = self.i;
                self.i += 1;
                self.space(false);
                let min = self.bound(at)?;
                let max = if self.eat("..") { self.bound(at)? } else { min };
                if min > max {
                    return Err(self.error_at(at, &format!("repetition ~ {min}..{max} is empty")));
                }
                return Ok(self.terms.repeat(atom, min, max));
            }
            _ => return Ok(atom),
        };
        self.i += 1;
        Ok(self.terms.repeat(atom, min, max))
    }
}
