//! Regex text → a [`Terms`] term.
//!
//! Two routes build the same term (a test checks that they agree on every regex the schema suite
//! and corpus produce):
//! - a direct parser for the common dialect: literals, escapes of punctuation and `\t \n \r \f \v`,
//!   `\xHH` and `\x{H…}`, classes of characters and ranges (negated or not), `.`, groups `( )`,
//!   `(?: )` and `(?-u: )` (byte mode), alternation and the repetitions `* + ? {n} {n,} {n,m}`
//!   (lazy or not). JSON Schema regexes are written in it, and it is several times faster than
//!   going through regex-syntax's AST and HIR, which dominated compile time;
//! - regex-syntax for everything else (`\d`, `\p{…}`, flags, nested classes, named groups…), whose
//!   HIR is then converted. Errors (syntax, look-around, backreferences) come from it.
//!
//! Anchors `^ $ \A \z` are accepted at the very start and end of the pattern (the whole output is
//! matched anyway); anywhere else, and word boundaries, they are an error.

use regex_syntax::hir::{Class, ClassBytes, ClassBytesRange, ClassUnicode, ClassUnicodeRange};
use regex_syntax::hir::{Hir, HirKind, Look};

use crate::deriv::{ByteSet, Id, Terms, EMPTY, INF};
use crate::error::RegexError;

/// Deepest group nesting accepted (the derivative recursion follows it).
const NEST_LIMIT: u32 = 400;

/// Parses `pattern`. `bytes`: byte-mode groups may match invalid UTF-8 (schema regexes, whose
/// intersections split code points); user regexes must match UTF-8 only.
pub(crate) fn parse(terms: &mut Terms, pattern: &str, bytes: bool) -> Result<Id, RegexError> {
    parse_with_rules(terms, pattern, bytes, 0)
}

/// The name of the empty group that stands for a reference to rule `n` in a schema's regex text
/// ([`rule_ref_text`]).
const RULE_GROUP: &str = "quarry_rule_";

/// The regex text of a reference to rule `n`: an empty named group, which [`parse_with_rules`]
/// reads as [`Terms::rule_ref`] when `n` is below its `rules` and the caller asked for rules.
/// Only the text of a schema's typed regex ([`crate::schema::Re`]'s `Display`, what `quarry
/// grammar explain` prints) holds it; user regexes are parsed with no rules, where it is an
/// ordinary (empty) group.
pub(crate) fn rule_ref_text(n: usize) -> String {
    format!("(?P<{RULE_GROUP}{n}>)")
}

/// The length of [`rule_ref_text`]`(n)`, without writing it.
pub(crate) fn rule_ref_len(n: usize) -> usize {
    "(?P<>)".len() + RULE_GROUP.len() + n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// The marker between the two operands of an intersection in a schema's regex text:
/// `(?:(?:A)(?P<quarry_and>)(?:B))` is `A ∧ B`, and with [`AND_NOT`] `A ∧ ¬B` ([`and_text`]).
const AND: &str = "(?P<quarry_and>)";
const AND_NOT: &str = "(?P<quarry_andnot>)";

/// The regex text of `a ∧ b` (`negate`: `a ∧ ¬b`), which [`parse_with_rules`] reads as an `And`
/// term (with at least one rule: schema text), without building the product of the two automata.
/// Only the text of a schema's typed regex holds it; in user regexes it is an empty named group.
pub(crate) fn and_text(a: &str, b: &str, negate: bool) -> String {
    let op = if negate { AND_NOT } else { AND };
    format!("(?:(?:{a}){op}(?:{b}))")
}

/// The length of [`and_text`] around its two operands, without writing it.
pub(crate) fn and_text_len(negate: bool) -> usize {
    let op = if negate { AND_NOT } else { AND };
    "(?:(?:)(?:))".len() + op.len()
}

/// Whether schema text holds an intersection ([`and_text`]) or a rule reference: text that
/// regex-level tools (regex-automata) would misread.
pub(crate) fn has_markers(text: &str) -> bool {
    text.contains("(?P<quarry_")
}

/// [`parse`], where `(?P<quarry_rule_N>)` with `N < rules` is a reference to rule `N`.
pub(crate) fn parse_with_rules(
    terms: &mut Terms,
    pattern: &str,
    bytes: bool,
    rules: u32,
) -> Result<Id, RegexError> {
    let mut fast = Fast::new(terms, pattern, bytes);
    fast.rules = rules;
    if let Some(id) = fast.alternation(false) {
        if fast.i == fast.s.len() {
            return Ok(id);
        }
    }
    if rules > 0 && has_markers(pattern) {
        // regex-syntax would misread the markers: it flattens `x(?:(?:A)M(?:B))y` into one
        // concatenation, losing which parts the intersection joins, and refuses a group name
        // used twice. The schema translator writes only the direct dialect (user patterns are
        // rewritten into it), so this is a defect in quarry, reported as one.
        return Err(RegexError::Internal { at: fast.i });
    }
    let hir = regex_syntax::ParserBuilder::new()
        .utf8(!bytes)
        .nest_limit(NEST_LIMIT)
        .build()
        .parse(pattern)
        // One line: regex-syntax draws the pattern with a caret under the error.
        .map_err(|e| RegexError::Syntax {
            message: e
                .to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
        })?;
    from_hir(terms, &hir, true, true)
}

/// The term of a regex-syntax HIR. `at_start`/`at_end`: nothing can precede/follow this node.
pub(crate) fn from_hir(
    t: &mut Terms,
    h: &Hir,
    at_start: bool,
    at_end: bool,
) -> Result<Id, RegexError> {
    Ok(match h.kind() {
        HirKind::Empty => EMPTY,
        HirKind::Literal(lit) => literal(t, &lit.0),
        HirKind::Class(Class::Bytes(c)) => byte_class(t, c),
        HirKind::Class(Class::Unicode(c)) => unicode_class(t, c),
        HirKind::Look(look) => match look {
            Look::Start if at_start => EMPTY,
            Look::End if at_end => EMPTY,
            _ => {
                return Err(RegexError::Assertion {
                    look: format!("{look:?}"),
                })
            }
        },
        HirKind::Repetition(r) => {
            let x = from_hir(t, &r.sub, false, false)?;
            t.repeat(x, r.min, r.max.unwrap_or(INF))
        }
        HirKind::Capture(c) => from_hir(t, &c.sub, at_start, at_end)?,
        HirKind::Concat(xs) => {
            let mut acc = EMPTY;
            for (i, x) in xs.iter().enumerate().rev() {
                let x = from_hir(t, x, at_start && i == 0, at_end && i + 1 == xs.len())?;
                acc = t.concat(x, acc);
            }
            acc
        }
        HirKind::Alternation(xs) => {
            let items = xs
                .iter()
                .map(|x| from_hir(t, x, at_start, at_end))
                .collect::<Result<Vec<_>, _>>()?;
            t.or(&items)
        }
    })
}

pub(crate) fn literal(t: &mut Terms, bytes: &[u8]) -> Id {
    let mut acc = EMPTY;
    for &b in bytes.iter().rev() {
        let x = t.byte(b);
        acc = t.concat(x, acc);
    }
    acc
}

fn byte_class(t: &mut Terms, c: &ClassBytes) -> Id {
    let mut set = ByteSet::default();
    for r in c.iter() {
        set.insert_range(r.start(), r.end());
    }
    t.bytes(set)
}

/// A class of code points as the alternation of its UTF-8 byte sequences.
pub(crate) fn unicode_class(t: &mut Terms, c: &ClassUnicode) -> Id {
    let mut items = Vec::new();
    for r in c.iter() {
        for seq in regex_syntax::utf8::Utf8Sequences::new(r.start(), r.end()) {
            let mut acc = EMPTY;
            for range in seq.as_slice().iter().rev() {
                let x = t.bytes(ByteSet::range(range.start, range.end));
                acc = t.concat(x, acc);
            }
            items.push(acc);
        }
    }
    t.or(&items)
}

/// The direct parser. Each method returns `None` where the pattern leaves the dialect (or is
/// invalid); the caller then goes through regex-syntax, which either handles it or says why not.
struct Fast<'a> {
    t: &'a mut Terms,
    src: &'a str,
    s: &'a [u8],
    i: usize,
    allow_bytes: bool,
    /// Rule references `(?P<quarry_rule_N>)` are read for `N` below this ([`parse_with_rules`]).
    rules: u32,
    depth: u32,
    /// Whether the class just opened by [`Fast::bracket`] is negated.
    negated: bool,
    /// For each `(` and outermost `[`, the index of its closing bracket (`u32::MAX` elsewhere), or
    /// empty when the pre-scan could not tell.
    close: Vec<u32>,
    /// Groups and classes already parsed, by their text and mode: a schema regex repeats the same
    /// string, number and member groups hundreds of times, and equal text means an equal term.
    memo: rustc_hash::FxHashMap<(&'a str, bool), Id>,
}

/// For each `(` and outermost `[` of `s`, the index of its closing bracket; `None` when the
/// brackets do not balance (the parser then reports or defers the error).
fn closing_brackets(s: &[u8]) -> Option<Vec<u32>> {
    let mut close = vec![u32::MAX; s.len()];
    let mut groups: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'\\' => i += 1,
            b'(' => groups.push(i),
            b')' => close[groups.pop()?] = i as u32,
            b'[' => {
                let open = i;
                let mut depth = 0usize;
                loop {
                    // After `[` or `[^`, a `]` is a literal.
                    i += 1;
                    if s.get(i) == Some(&b'^') {
                        i += 1;
                    }
                    if s.get(i) == Some(&b']') {
                        i += 1;
                    }
                    loop {
                        match *s.get(i)? {
                            b'\\' => i += 2,
                            b'[' => break,
                            b']' if depth == 0 => {
                                close[open] = i as u32;
                                break;
                            }
                            b']' => {
                                depth -= 1;
                                i += 1;
                            }
                            _ => i += 1,
                        }
                    }
                    if close[open] != u32::MAX {
                        break;
                    }
                    depth += 1; // a nested `[`
                }
            }
            _ => {}
        }
        i += 1;
    }
    groups.is_empty().then_some(close)
}

impl<'a> Fast<'a> {
    fn new(t: &'a mut Terms, pattern: &'a str, allow_bytes: bool) -> Self {
        Self {
            t,
            src: pattern,
            s: pattern.as_bytes(),
            i: 0,
            allow_bytes,
            rules: 0,
            depth: 0,
            negated: false,
            close: closing_brackets(pattern.as_bytes()).unwrap_or_default(),
            memo: Default::default(),
        }
    }

    /// Parses the group or class at `self.i` with `parse`, or takes it from the memo.
    fn memoized(&mut self, bytes: bool, parse: fn(&mut Self, bool) -> Option<Id>) -> Option<Id> {
        let close = self.close.get(self.i).copied().unwrap_or(u32::MAX);
        if close == u32::MAX {
            return parse(self, bytes);
        }
        let end = close as usize + 1;
        let key = (&self.src[self.i..end], bytes);
        if let Some(&id) = self.memo.get(&key) {
            self.i = end;
            return Some(id);
        }
        let id = parse(self, bytes)?;
        if self.i != end {
            return None; // the pre-scan and the parser disagree: leave it to regex-syntax
        }
        self.memo.insert(key, id);
        Some(id)
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, prefix: &[u8]) -> bool {
        if self.s[self.i..].starts_with(prefix) {
            self.i += prefix.len();
            true
        } else {
            false
        }
    }

    /// `a|b|…` up to `)` or the end.
    fn alternation(&mut self, bytes: bool) -> Option<Id> {
        let mut items = vec![self.concatenation(bytes)?];
        while self.eat(b"|") {
            items.push(self.concatenation(bytes)?);
        }
        Some(self.t.or(&items))
    }

    fn concatenation(&mut self, bytes: bool) -> Option<Id> {
        let mut parts: Vec<Id> = Vec::new();
        while let Some(c) = self.peek() {
            if c == b'|' || c == b')' {
                break;
            }
            if self.rules > 0 && c == b'(' {
                let negate = if self.s[self.i..].starts_with(AND.as_bytes()) {
                    Some(false)
                } else if self.s[self.i..].starts_with(AND_NOT.as_bytes()) {
                    Some(true)
                } else {
                    None
                };
                if let Some(negate) = negate {
                    self.i += if negate { AND_NOT.len() } else { AND.len() };
                    let mut left = EMPTY;
                    for &p in parts.iter().rev() {
                        left = self.t.concat(p, left);
                    }
                    let right = self.concatenation(bytes)?;
                    let right = if negate { self.t.not(right) } else { right };
                    return Some(self.t.and(&[left, right]));
                }
            }
            let atom = self.atom(bytes)?;
            let atom = self.repetitions(atom)?;
            parts.push(atom);
        }
        let mut acc = EMPTY;
        for &p in parts.iter().rev() {
            acc = self.t.concat(p, acc);
        }
        Some(acc)
    }

    fn repetitions(&mut self, atom: Id) -> Option<Id> {
        let (min, max) = match self.peek() {
            Some(b'*') => (0, INF),
            Some(b'+') => (1, INF),
            Some(b'?') => (0, 1),
            Some(b'{') => {
                let close = self.s[self.i..].iter().position(|&c| c == b'}')?;
                let body = std::str::from_utf8(&self.s[self.i + 1..self.i + close]).ok()?;
                let num = |x: &str| -> Option<u32> {
                    (!x.is_empty() && x.len() <= 6 && x.bytes().all(|c| c.is_ascii_digit()))
                        .then(|| x.parse().ok())
                        .flatten()
                };
                let (min, max) = match body.split_once(',') {
                    None => (num(body)?, num(body)?),
                    Some((a, "")) => (num(a)?, INF),
                    Some((a, b)) => (num(a)?, num(b)?),
                };
                if min > max {
                    return None;
                }
                self.i += close; // to the `}`, consumed below
                (min, max)
            }
            _ => return Some(atom),
        };
        self.i += 1;
        self.eat(b"?"); // laziness does not change the language
        if matches!(self.peek(), Some(b'*' | b'+' | b'?' | b'{')) {
            return None; // stacked repetitions: regex-syntax decides
        }
        Some(self.t.repeat(atom, min, max))
    }

    fn atom(&mut self, bytes: bool) -> Option<Id> {
        let c = self.peek()?;
        match c {
            b'(' => self.memoized(bytes, Self::group),
            b'[' => self.memoized(bytes, Self::class),
            b'.' if !bytes => {
                self.i += 1;
                let any = ClassUnicode::new([
                    ClassUnicodeRange::new('\0', '\x09'),
                    ClassUnicodeRange::new('\x0B', char::MAX),
                ]);
                Some(unicode_class(self.t, &any))
            }
            b'\\' => {
                let ch = self.escape(bytes)?;
                Some(self.char_term(ch, bytes))
            }
            b'^' | b'$' | b'.' | b'*' | b'+' | b'?' | b'{' | b'}' | b']' | b')' => None,
            _ => {
                let ch = self.char(bytes)?;
                Some(self.char_term(ch, bytes))
            }
        }
    }

    fn group(&mut self, bytes: bool) -> Option<Id> {
        self.depth += 1;
        if self.depth > NEST_LIMIT {
            return None;
        }
        let inner_bytes = if self.eat(b"(?:") {
            bytes
        } else if self.eat(b"(?-u:") {
            if !self.allow_bytes {
                return None;
            }
            true
        } else if self.rules > 0 && self.s[self.i..].starts_with(b"(?P<quarry_rule_") {
            self.i += b"(?P<quarry_rule_".len();
            let digits = self.s[self.i..]
                .iter()
                .take_while(|c| c.is_ascii_digit())
                .count();
            let n: u32 = self.src[self.i..self.i + digits].parse().ok()?;
            self.i += digits;
            if n >= self.rules || !self.eat(b">)") {
                return None;
            }
            self.depth -= 1;
            return Some(self.t.rule_ref(n));
        } else if self.s.get(self.i + 1) == Some(&b'?') {
            return None; // flags, named groups
        } else {
            self.i += 1;
            bytes
        };
        let x = self.alternation(inner_bytes)?;
        if !self.eat(b")") {
            return None;
        }
        self.depth -= 1;
        Some(x)
    }

    fn char_term(&mut self, ch: u32, bytes: bool) -> Id {
        if bytes {
            return self.t.byte(ch as u8);
        }
        let c = char::from_u32(ch).expect("checked by the caller");
        let mut buf = [0u8; 4];
        literal(self.t, c.encode_utf8(&mut buf).as_bytes())
    }

    /// One literal character (a byte in byte mode), not an escape.
    fn char(&mut self, bytes: bool) -> Option<u32> {
        let c = self.src.get(self.i..)?.chars().next()?;
        if bytes && !c.is_ascii() {
            return None;
        }
        self.i += c.len_utf8();
        Some(c as u32)
    }

    /// An escape: a code point (a byte in byte mode). `None` for classes such as `\d`.
    fn escape(&mut self, bytes: bool) -> Option<u32> {
        let c = *self.s.get(self.i + 1)?;
        self.i += 2;
        let v = match c {
            b't' => 0x09,
            b'n' => 0x0A,
            b'v' => 0x0B,
            b'f' => 0x0C,
            b'r' => 0x0D,
            b'x' => {
                let (digits, skip) = if self.peek() == Some(b'{') {
                    let close = self.s[self.i..].iter().position(|&c| c == b'}')?;
                    (&self.s[self.i + 1..self.i + close], close + 1)
                } else {
                    (self.s.get(self.i..self.i + 2)?, 2)
                };
                if digits.is_empty()
                    || digits.len() > 8
                    || !digits.iter().all(u8::is_ascii_hexdigit)
                {
                    return None;
                }
                self.i += skip;
                u32::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()?
            }
            b'\\' | b'.' | b'+' | b'*' | b'?' | b'(' | b')' | b'|' | b'[' | b']' | b'{' | b'}'
            | b'^' | b'$' | b'#' | b'&' | b'-' | b'~' => c as u32,
            _ => return None,
        };
        if bytes {
            (v <= 0xFF).then_some(v)
        } else {
            char::from_u32(v).map(|_| v)
        }
    }

    fn class(&mut self, bytes: bool) -> Option<Id> {
        if bytes {
            let ranges = self.bracket(true)?;
            let mut class = ClassBytes::new(
                ranges
                    .iter()
                    .map(|r| ClassBytesRange::new(r.start() as u8, r.end() as u8)),
            );
            if self.negated {
                class.negate();
            }
            Some(byte_class(self.t, &class))
        } else {
            let class = self.unicode_bracket()?;
            Some(unicode_class(self.t, &class))
        }
    }

    /// A Unicode class `[…]`, with nested classes and the set operations `--`, `&&`, `~~`
    /// (left-associative, as in regex-syntax).
    fn unicode_bracket(&mut self) -> Option<ClassUnicode> {
        let first = self.bracket(false)?;
        let negated = self.negated;
        let mut acc = first;
        loop {
            let op = match self.s.get(self.i..)? {
                [b'-', b'-', ..] | [b'&', b'&', ..] | [b'~', b'~', ..] => self.s[self.i],
                [b']', ..] => {
                    self.i += 1;
                    break;
                }
                _ => return None,
            };
            self.i += 2;
            let rhs = self.items(false, false)?;
            match op {
                b'-' => acc.difference(&rhs),
                b'&' => acc.intersect(&rhs),
                _ => acc.symmetric_difference(&rhs),
            }
        }
        if negated {
            acc.negate();
        }
        Some(acc)
    }

    /// Opens a class: `[`, an optional `^` (left in `self.negated`), and its first items. In byte
    /// mode the class must close right there (no nesting or set operations).
    fn bracket(&mut self, bytes: bool) -> Option<ClassUnicode> {
        self.i += 1; // `[`
        let negated = self.eat(b"^");
        let items = self.items(bytes, true)?;
        self.negated = negated;
        if bytes {
            if !self.eat(b"]") {
                return None;
            }
            if items.iter().any(|r| r.end() as u32 > 0xFF) {
                return None;
            }
        }
        Some(items)
    }

    /// Class items up to (not including) a closing `]` or a set operator. `first`: a `]` here is
    /// a literal.
    fn items(&mut self, bytes: bool, first: bool) -> Option<ClassUnicode> {
        let mut class = ClassUnicode::empty();
        let mut ranges: Vec<ClassUnicodeRange> = Vec::new();
        let mut first = first;
        loop {
            let c = self.peek()?;
            if c == b']' && !first {
                break;
            }
            if matches!(c, b'-' | b'&' | b'~') && self.s.get(self.i + 1) == Some(&c) {
                break;
            }
            first = false;
            if c == b'[' {
                if bytes || self.s.get(self.i + 1) == Some(&b':') {
                    // POSIX classes (`[:alpha:]`) are regex-syntax's.
                    return None;
                }
                let nested = self.unicode_bracket()?;
                class.union(&nested);
                continue;
            }
            let lo = self.class_char(bytes)?;
            let hi = if self.peek() == Some(b'-')
                && !matches!(self.s.get(self.i + 1), Some(b']' | b'-'))
            {
                self.i += 1;
                self.class_char(bytes)?
            } else {
                lo
            };
            if lo > hi {
                return None;
            }
            ranges.push(ClassUnicodeRange::new(
                char::from_u32(lo)?,
                char::from_u32(hi)?,
            ));
        }
        class.union(&ClassUnicode::new(ranges));
        Some(class)
    }

    fn class_char(&mut self, bytes: bool) -> Option<u32> {
        match self.peek()? {
            b'\\' => self.escape(bytes),
            b'[' => None,
            _ => self.char(bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashSet, VecDeque};
    use std::path::PathBuf;

    use super::*;

    /// Both routes, in one store so that their terms can be compared.
    fn routes(pattern: &str, bytes: bool) -> (Terms, Option<Id>, Id) {
        let mut t = Terms::new();
        let mut fast = Fast::new(&mut t, pattern, bytes);
        let direct = fast.alternation(false).filter(|_| fast.i == pattern.len());
        let hir = regex_syntax::ParserBuilder::new()
            .utf8(!bytes)
            .build()
            .parse(pattern)
            .unwrap_or_else(|e| panic!("{pattern:?}: {e}"));
        let via_hir = from_hir(&mut t, &hir, true, true).unwrap();
        (t, direct, via_hir)
    }

    /// Same language: a breadth-first walk of pairs of derivatives, nullability compared at each,
    /// up to `budget` pairs. Returns the pairs visited, or the first difference.
    fn same_language(t: &mut Terms, a: Id, b: Id, budget: usize) -> Result<usize, Vec<u8>> {
        let (classes, n) = t.byte_classes();
        let mut reps = vec![0u8; n];
        for x in (0..=255u8).rev() {
            reps[classes[x as usize] as usize] = x;
        }
        let mut seen = HashSet::from([(a, b)]);
        let mut queue = VecDeque::from([(a, b, Vec::new())]);
        while let Some((x, y, path)) = queue.pop_front() {
            if t.nullable(x) != t.nullable(y) {
                return Err(path);
            }
            if seen.len() >= budget {
                continue;
            }
            let (dx, dy) = (t.deriv_row(x, &reps), t.deriv_row(y, &reps));
            for (c, &r) in reps.iter().enumerate() {
                let pair = (dx[c], dy[c]);
                if seen.insert(pair) {
                    let mut p = path.clone();
                    p.push(r);
                    queue.push_back((pair.0, pair.1, p));
                }
            }
        }
        Ok(seen.len())
    }

    #[test]
    fn direct_parser_agrees_with_regex_syntax() {
        let cases = [
            (r"abc|abd|a", false),
            (r"[^a-c\x00-\x1F]+x?", false),
            (r"(?:é|ü){2,5}[α-ω]", false),
            (r"[]a-]|[^]]|\.\*\\", false),
            (r"(a(b(c)))*d{3}e{2,}f{0,1}?", false),
            (r".\t\n\x{1F600}", false),
            (r"(?-u:[\x80-\xBF]\xFF)a|b", true),
            (
                r#"(?:[^"\\\x00-\x1F]|\\["\\bfnrt]|\\u00(?:0[0-7bef]|1[0-9a-f]))"#,
                false,
            ),
            (r"[^\x00-\x{10FFFF}]", false),
            (
                r#"[[^"\\\x00-\x1F]--[bf]]x|[[a-z]&&[^aeiou]]|[a-f~~[d-k]]|[[a]b[c-d]]"#,
                false,
            ),
        ];
        for (pattern, bytes) in cases {
            let (mut t, direct, via_hir) = routes(pattern, bytes);
            let direct = direct.unwrap_or_else(|| panic!("{pattern:?}: left the direct parser"));
            if let Err(path) = same_language(&mut t, direct, via_hir, usize::MAX) {
                panic!("{pattern:?}: the routes differ after {path:?}");
            }
        }
        // Outside the dialect the direct parser steps aside.
        for pattern in [r"\d", r"(?i)a", r"^a", r"[[:alpha:]]", r"(?P<x>a)", r"a**"] {
            assert!(routes(pattern, false).1.is_none(), "{pattern:?}");
        }
        // Except in schema text with markers, which regex-syntax would misread: an error.
        let mut t = Terms::new();
        for text in [
            format!("a{}\\d", rule_ref_text(0)),
            format!("x{}(?i)y", and_text("a", "b", false)),
        ] {
            let err = parse_with_rules(&mut t, &text, true, 1).unwrap_err();
            assert!(matches!(err, RegexError::Internal { .. }), "{text}: {err}");
        }
        // In user regexes, the marker names are ordinary groups.
        let user = format!("a{}b", rule_ref_text(0));
        let mut t = Terms::new();
        let id = parse(&mut t, &user, false).unwrap();
        let plain = parse(&mut t, "ab", false).unwrap();
        assert!(
            same_language(&mut t, id, plain, usize::MAX).is_ok(),
            "{user}"
        );
    }

    /// Every regex the schema suite derives is in the direct parser's dialect (the speed claim),
    /// and means what regex-syntax says it means. Intersection terms, which regex-syntax cannot
    /// read, are checked by `intersections_and_differences_are_exact_and_every_state_is_live`
    /// here and by the suite itself (every verdict against the `jsonschema` crate's).
    #[test]
    fn schema_regexes_take_the_direct_route_and_agree() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/json-schema-test-suite/tests/draft2020-12");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        let (mut checked, mut terms) = (0, 0);
        for file in files {
            let groups: Vec<serde_json::Value> =
                serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
            for group in groups {
                let Ok(re) = crate::schema::schema_to_regex(&group["schema"], &Default::default())
                else {
                    continue;
                };
                if has_markers(&re) {
                    let mut t = Terms::new();
                    let mut fast = Fast::new(&mut t, &re, true);
                    fast.rules = u32::MAX;
                    let direct = fast.alternation(false).filter(|_| fast.i == re.len());
                    assert!(
                        direct.is_some(),
                        "{}: a regex left the direct parser",
                        file.display()
                    );
                    terms += 1;
                    continue;
                }
                let (mut t, direct, via_hir) = routes(&re, true);
                let direct = direct.unwrap_or_else(|| {
                    panic!("{}: a regex left the direct parser", file.display())
                });
                if let Err(path) = same_language(&mut t, direct, via_hir, 400) {
                    panic!("{}: the routes differ after {path:?}", file.display());
                }
                checked += 1;
            }
        }
        assert!(checked > 250, "{checked} schemas");
        assert!(terms > 0, "no intersection was written as a term");
    }

    /// Intersections and differences as terms (`and_text`, read by both parser routes) accept
    /// exactly the strings both regexes (the first and not the second) accept, checked on every
    /// string of up to 5 bytes over a small alphabet; and every state the DFA builds can still
    /// reach a match (the emptiness check keeps empty intersections out of the rows).
    #[test]
    fn intersections_and_differences_are_exact_and_every_state_is_live() {
        let pats = [
            "a*b",
            "(ab)*",
            "[ab]{2,4}",
            "a[^a]*",
            ".*b.*",
            "(a|bb)+x?",
            "x|ab",
            "[ax]*",
            "b{3}",
        ];
        let alphabet = [b'a', b'b', b'x'];
        let mut strings: Vec<Vec<u8>> = vec![vec![]];
        for len in 1..=5 {
            let prev: Vec<Vec<u8>> = strings
                .iter()
                .filter(|s| s.len() == len - 1)
                .cloned()
                .collect();
            for s in prev {
                for &c in &alphabet {
                    let mut t = s.clone();
                    t.push(c);
                    strings.push(t);
                }
            }
        }
        let full = |p: &str| regex_automata::meta::Regex::new(&format!("^(?:{p})$")).unwrap();
        for a in pats {
            for b in pats {
                for negate in [false, true] {
                    let text = and_text(a, b, negate);
                    // Alone, and inside a concatenation and an alternation.
                    for text in [text.clone(), format!("(?:){text}(?:x{{9}}|)")] {
                        let mut t = Terms::new();
                        let root = parse_with_rules(&mut t, &text, true, 1).unwrap();
                        let dfa = crate::dfa::LazyDfa::new(t, root, 10_000, 1_000_000);
                        let (ra, rb) = (full(a), full(b));
                        for s in &strings {
                            let mut st = 0u32;
                            for &c in s {
                                if st != crate::dfa::DEAD {
                                    st = dfa.step(st, c);
                                }
                            }
                            let got = st != crate::dfa::DEAD && dfa.is_accepting(st);
                            let want = ra.is_match(s) && rb.is_match(s) != negate;
                            assert_eq!(got, want, "{text} on {:?}", String::from_utf8_lossy(s));
                        }
                        // Every state built is live: an accepting state is reachable.
                        let mut live = 0;
                        for s0 in 0..dfa.state_count() as u32 {
                            let mut seen = HashSet::from([s0]);
                            let mut queue = VecDeque::from([s0]);
                            let mut found = false;
                            while let Some(x) = queue.pop_front() {
                                if dfa.is_accepting(x) {
                                    found = true;
                                    break;
                                }
                                for c in 0..=255u8 {
                                    let y = dfa.step(x, c);
                                    if y != crate::dfa::DEAD && seen.insert(y) {
                                        queue.push_back(y);
                                    }
                                }
                            }
                            assert!(
                                found || dfa.is_empty_language(),
                                "{text}: state {s0} is a dead end"
                            );
                            live += found as usize;
                        }
                        assert!(live > 0 || dfa.is_empty_language());
                    }
                }
            }
        }
    }
}
