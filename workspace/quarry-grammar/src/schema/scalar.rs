//! Strings (lengths, `pattern`, `format`) and numbers (the bounded JSON number grammar, exact
//! integer ranges).

use serde_json::{Map, Value};

use super::decimal::decimal_range;
use super::negate::FRACTIONAL;
use super::Op;
use super::{
    alt_text as alt, child, count, invalid, leaf, unsupported, Draft, Re, Result, Translator,
    INTEGER, NOTHING, NUMBER, STR_CHAR,
};

impl Translator<'_> {
    pub(super) fn string(&mut self, m: &Map<String, Value>, pointer: &str) -> Result<Re> {
        let min = count(m, pointer, "minLength")?;
        let max = count(m, pointer, "maxLength")?;
        let format = m.get("format").map(|f| {
            f.as_str()
                .ok_or_else(|| invalid(&child(pointer, "format"), "expected a string"))
        });
        let format = format.transpose()?;
        let pattern = m.get("pattern").map(|p| {
            p.as_str()
                .ok_or_else(|| invalid(&child(pointer, "pattern"), "expected a string"))
        });
        let pattern = pattern.transpose()?;
        // Each keyword gives a language of string bodies (the text between the quotes); where
        // several are present, the body must be in all of them.
        let mut bodies: Vec<(&str, Re)> = Vec::new();
        if let Some(f) = format {
            // Formats JSON Schema does not define (`AWS::EC2::VPC.Id`) are annotations to
            // validators; with ignore_unknown_keywords they are to us too.
            let vendor = !STANDARD_FORMATS.contains(&f);
            if !(vendor && self.options.ignore_unknown_keywords) {
                bodies.push(("format", Re::text(format_body(f, pointer)?)));
            }
        }
        let mut length_applied = false;
        if let Some(p) = pattern {
            let length = (min.is_some() || max.is_some()).then(|| (min.unwrap_or(0), max));
            let (body, applied) = pattern_with_length(p, length, &child(pointer, "pattern"))?;
            if body.is_nothing() {
                return Ok(Re::nothing());
            }
            length_applied = applied;
            bodies.push(("pattern", body));
        }
        if (min.is_some() || max.is_some()) && !length_applied || bodies.is_empty() {
            let lo = min.unwrap_or(0);
            let body = match max {
                Some(hi) if hi < lo => return Ok(Re::nothing()),
                Some(hi) => Re::text(format!("{STR_CHAR}{{{lo},{hi}}}")),
                None if lo == 0 => Re::text(format!("{STR_CHAR}*")),
                None => Re::text(format!("{STR_CHAR}{{{lo},}}")),
            };
            bodies.push((
                if max.is_some() {
                    "maxLength"
                } else {
                    "minLength"
                },
                body,
            ));
        }
        let (_, mut body) = bodies.pop().expect("at least one body");
        for (keyword, other) in bodies.iter().rev() {
            body = self.combine(other, &body, Op::And, keyword, pointer)?;
        }
        Ok(Re::seq([Re::text("\""), body, Re::text("\"")]))
    }

    /// Lower and upper bounds as (value, exclusive), honouring the draft's form of `exclusive*`.
    pub(super) fn bounds(
        &self,
        m: &Map<String, Value>,
        pointer: &str,
    ) -> Result<[Option<(f64, bool)>; 2]> {
        let num = |k: &str| -> Result<Option<f64>> {
            m.get(k)
                .map(|v| {
                    v.as_f64()
                        .ok_or_else(|| invalid(&child(pointer, k), "expected a number"))
                })
                .transpose()
        };
        let (min, max) = (num("minimum")?, num("maximum")?);
        if self.draft == Draft::D4 {
            let flag = |k: &str| m.get(k).and_then(Value::as_bool).unwrap_or(false);
            return Ok([
                min.map(|v| (v, flag("exclusiveMinimum"))),
                max.map(|v| (v, flag("exclusiveMaximum"))),
            ]);
        }
        let (xmin, xmax) = (num("exclusiveMinimum")?, num("exclusiveMaximum")?);
        // The tighter of the inclusive and exclusive bound.
        let lower = match (min, xmin) {
            (Some(a), Some(b)) if b >= a => Some((b, true)),
            (Some(a), _) => Some((a, false)),
            (None, Some(b)) => Some((b, true)),
            (None, None) => None,
        };
        let upper = match (max, xmax) {
            (Some(a), Some(b)) if b <= a => Some((b, true)),
            (Some(a), _) => Some((a, false)),
            (None, Some(b)) => Some((b, true)),
            (None, None) => None,
        };
        Ok([lower, upper])
    }

    pub(super) fn integer(&mut self, m: &Map<String, Value>, pointer: &str) -> Result<Re> {
        let [lower, upper] = self.bounds(m, pointer)?;
        let lo = lower.map(|(v, x)| if x { v.floor() + 1.0 } else { v.ceil() });
        let hi = upper.map(|(v, x)| if x { v.ceil() - 1.0 } else { v.floor() });
        let fits = |v: f64| v.abs() < 1e18;
        if lo.is_some_and(|v| !fits(v)) || hi.is_some_and(|v| !fits(v)) {
            return Err(unsupported(
                "minimum",
                pointer,
                "integer bounds beyond ±10^18",
            ));
        }
        let (lo, hi) = (lo.map(|v| v as i64), hi.map(|v| v as i64));
        let range = leaf(int_range(lo, hi));
        let Some(step) = m.get("multipleOf") else {
            return Ok(range);
        };
        let here = child(pointer, "multipleOf");
        let step = step
            .as_f64()
            .filter(|s| *s > 0.0)
            .ok_or_else(|| invalid(&here, "expected a number above 0"))?;
        if step.fract() != 0.0 {
            // A fractional step: integers that are multiples of it, e.g. any integer for 0.5.
            let inverse = 1.0 / step;
            if inverse.fract() == 0.0 {
                return Ok(range);
            }
            return Err(unsupported(
                "multipleOf",
                pointer,
                "a fractional step that does not divide 1",
            ));
        }
        let k = step as u64;
        if k == 1 {
            return Ok(range);
        }
        // Small ranges are listed; otherwise steps that divide a power of ten (at most 1000)
        // are decided by the last digits.
        if let (Some(l), Some(h)) = (lo, hi) {
            if h.saturating_sub(l) <= 256 {
                let values: Vec<String> = (l..=h)
                    .filter(|v| v.unsigned_abs() % k == 0)
                    .map(|v| v.to_string())
                    .collect();
                return Ok(leaf(alt(&values)));
            }
        }
        let Some(m_digits) = (1..=3u32).find(|&d| 10u64.pow(d) % k == 0) else {
            return Err(unsupported(
                "multipleOf",
                pointer,
                "steps that do not divide 1000 are supported only over ranges of at most 256 integers",
            ));
        };
        let modulus = 10u64.pow(m_digits);
        let small: Vec<String> = (0..modulus)
            .step_by(k as usize)
            .map(|v| v.to_string())
            .collect();
        let tails: Vec<String> = (0..modulus)
            .step_by(k as usize)
            .map(|v| format!("{v:0width$}", width = m_digits as usize))
            .collect();
        // At most 15 digits: beyond 2^53 validators that compute in f64 disagree on divisibility.
        let lead = 15 - m_digits;
        let magnitude = format!(
            "(?:{}|[1-9][0-9]{{0,{}}}{})",
            small.join("|"),
            lead - 1,
            alt(&tails)
        );
        let multiples = format!("(?:{magnitude}|-{})", magnitude.replacen("(?:0|", "(?:", 1));
        let negative = format!("-{}", magnitude.replacen("(?:0|", "(?:", 1));
        match (lo, hi) {
            (None, None) => return Ok(Re::text(multiples)),
            (Some(0), None) => return Ok(Re::text(magnitude)),
            (Some(1), None) => return Ok(Re::text(magnitude.replacen("(?:0|", "(?:", 1))),
            (None, Some(0)) => return Ok(Re::text(format!("0|{negative}"))),
            (None, Some(-1)) => return Ok(Re::text(negative)),
            _ => {}
        }
        self.combine(&range, &Re::text(multiples), Op::And, "multipleOf", pointer)
    }

    /// Numbers; with `fractional`, only those that are not integers (`not: {type: integer}`).
    pub(super) fn number(
        &mut self,
        m: &Map<String, Value>,
        pointer: &str,
        fractional: bool,
    ) -> Result<Re> {
        let [lower, upper] = self.bounds(m, pointer)?;
        let mut room = 18;
        if let Some(step) = m.get("multipleOf") {
            let here = child(pointer, "multipleOf");
            let step = step
                .as_f64()
                .filter(|s| *s > 0.0)
                .ok_or_else(|| invalid(&here, "expected a number above 0"))?;
            if step.fract() == 0.0 {
                // Multiples of an integer are integers.
                return if fractional {
                    Ok(Re::nothing())
                } else {
                    self.integer(m, pointer)
                };
            }
            // 10^-k: at most k fraction digits.
            let k = (1..=18).find(|&k| (step * 10f64.powi(k) - 1.0).abs() < 1e-9);
            let Some(k) = k else {
                return Err(unsupported(
                    "multipleOf",
                    pointer,
                    "on numbers, only integer steps and powers of ten (0.1, 0.01, …) are supported yet",
                ));
            };
            room = k as usize;
        }
        if lower.is_none() && upper.is_none() && room == 18 {
            return Ok(Re::text(if fractional { FRACTIONAL } else { NUMBER }));
        }
        // Bounded numbers are written without an exponent, so the digits carry the value.
        Ok(leaf(decimal_range(lower, upper, room, fractional)))
    }
}

/// The formats JSON Schema (2020-12) defines.
const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// A host name label (RFC 1123): letters, digits and inner hyphens, at most 63.
const LABEL: &str = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
/// An RFC 6901 JSON Pointer, as a JSON string body.
const JSON_POINTER: &str = r#"(?:/(?:[^"\\\x00-\x1F~/]|~[01])*)*"#;
/// RFC 3986 `hier-part`, or with `relative` its `relative-part`: `//` with an authority
/// (optional user information, a host of LDH labels, an optional port of up to five digits) and
/// an absolute path; or a path that does not start with `//`, which would read as an authority
/// (`https://:I` has a port that is not a number); or nothing. A relative path's first segment
/// has no `:` (it would read as a scheme). The host is a subset of RFC 3986's `reg-name`, so
/// every value is valid.
fn uri_path(relative: bool) -> String {
    let userinfo = "(?:(?:[A-Za-z0-9._~!$&'()*+,;=:-]|%[0-9A-Fa-f]{2})*@)?";
    let segments = format!("(?:{PCHAR}|/)*");
    let rootless = if relative {
        format!("{PCHAR_NO_COLON}+(?:/{segments})?")
    } else {
        format!("{PCHAR}{segments}")
    };
    format!(
        "(?://{userinfo}{LABEL}(?:\\.{LABEL})*(?::[0-9]{{1,5}})?(?:/{segments})?\
         |/(?:{PCHAR}{segments})?|{rootless})?"
    )
}

/// RFC 3986 path characters (`pchar`); without `:` for the first segment of a relative path.
const PCHAR: &str = "(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})";
const PCHAR_NO_COLON: &str = "(?:[A-Za-z0-9._~!$&'()*+,;=@-]|%[0-9A-Fa-f]{2})";
const QUERY_FRAGMENT: &str = "(?:\\?(?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*)?(?:#(?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*)?";

/// RFC 3339 full-date, exactly: 30-day months, February 28 days, or 29 in leap years (divisible
/// by 4, centuries only when divisible by 400).
const DATE: &str = concat!(
    "(?:[0-9]{4}-(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])",
    "|[0-9]{4}-(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)",
    "|[0-9]{4}-02-(?:0[1-9]|1[0-9]|2[0-8])",
    "|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)"
);
const TIME: &str = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";

/// Decimal integers in `[lo, hi]` (either end open), in canonical form (no `-0`, no leading zeros).
pub(super) fn int_range(lo: Option<i64>, hi: Option<i64>) -> String {
    match (lo, hi) {
        (None, None) => INTEGER.to_owned(),
        (Some(l), Some(h)) if l > h => NOTHING.to_owned(),
        _ => {
            let mut parts = Vec::new();
            // Negative part: -[max(-h,1), -l].
            if lo.is_none_or(|l| l < 0) {
                let from = hi.map_or(1, |h| if h < 0 { -h as u64 } else { 1 });
                let to = lo.map(|l| l.unsigned_abs());
                parts.push(format!("-{}", nonneg_range(from, to)));
            }
            // Non-negative part: [max(l,0), h].
            if hi.is_none_or(|h| h >= 0) {
                let from = lo.map_or(0, |l| l.max(0) as u64);
                parts.push(nonneg_range(from, hi.map(|h| h as u64)));
            }
            alt(&parts)
        }
    }
}

/// Decimal numbers in `[lo, hi]` (`hi` open when `None`), no leading zeros.
fn nonneg_range(lo: u64, hi: Option<u64>) -> String {
    let digits = |v: u64| v.to_string().len() as u32;
    let mut parts = Vec::new();
    let top = hi.map_or(digits(lo), digits);
    for n in digits(lo)..=top {
        let a = if n == digits(lo) {
            lo
        } else {
            10u64.pow(n - 1)
        };
        let b = match hi {
            Some(h) if n == digits(h) => h,
            _ => 10u64.saturating_pow(n) - 1,
        };
        if a <= b {
            parts.push(same_length(&a.to_string(), &b.to_string()));
        }
    }
    if hi.is_none() && digits(lo) < 18 {
        // Longer numbers, up to the 18 digits every number is bounded to.
        parts.push(format!("[1-9][0-9]{{{},17}}", digits(lo)));
    }
    alt(&parts)
}

/// Digit strings of equal length between `a` and `b` inclusive.
fn same_length(a: &str, b: &str) -> String {
    if a.is_empty() {
        return String::new();
    }
    if a == b {
        return a.to_owned();
    }
    let (a0, b0) = (a.as_bytes()[0], b.as_bytes()[0]);
    let (ar, br) = (&a[1..], &b[1..]);
    let n = ar.len();
    if a0 == b0 {
        return format!("{}{}", a0 as char, same_length(ar, br));
    }
    if ar.bytes().all(|c| c == b'0') && br.bytes().all(|c| c == b'9') {
        return format!("[{}-{}][0-9]{{{n}}}", a0 as char, b0 as char);
    }
    let mut parts = vec![format!("{}{}", a0 as char, same_length(ar, &"9".repeat(n)))];
    if b0 - a0 > 1 {
        parts.push(format!(
            "[{}-{}][0-9]{{{n}}}",
            (a0 + 1) as char,
            (b0 - 1) as char
        ));
    }
    parts.push(format!("{}{}", b0 as char, same_length(&"0".repeat(n), br)));
    alt(&parts)
}

/// The body (the text between the quotes) of strings in `format`.
fn format_body(format: &str, pointer: &str) -> Result<String> {
    Ok(match format {
        "date" => DATE.to_owned(),
        "time" => TIME.to_owned(),
        "date-time" => format!("{DATE}[Tt]{TIME}"),
        "uuid" => {
            "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
                .to_owned()
        }
        "ipv4" => {
            let o = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])";
            format!("{o}\\.{o}\\.{o}\\.{o}")
        }
        // The formats below are conservative subsets of their RFCs: every value they
        // allow is valid, not every valid value is allowed.
        "ipv6" => "[0-9a-f]{1,4}(?::[0-9a-f]{1,4}){7}".to_owned(),
        "hostname" => format!("{LABEL}(?:\\.{LABEL})*"),
        "email" => format!(
            "[A-Za-z0-9_%+-]{{1,32}}(?:\\.[A-Za-z0-9_%+-]{{1,15}}){{0,2}}@{LABEL}(?:\\.{LABEL}){{1,4}}"
        ),
        "duration" => {
            // RFC 3339 appendix A, exactly: each unit may only be followed by the next.
            let n = "[0-9]{1,9}";
            let sec = format!("{n}S");
            let min = format!("{n}M(?:{sec})?");
            let hour = format!("{n}H(?:{min})?");
            let time = format!("T(?:{hour}|{min}|{sec})");
            let day = format!("{n}D");
            let month = format!("{n}M(?:{day})?");
            let year = format!("{n}Y(?:{month})?");
            format!("P(?:(?:{day}|{month}|{year})(?:{time})?|{time}|{n}W)")
        }
        // Every URI is an IRI and every e-mail address an internationalized one: the ASCII
        // subsets are sound for the IDN/IRI formats too.
        "uri" | "iri" => format!(
            "[A-Za-z][A-Za-z0-9+.-]{{0,15}}:{}{QUERY_FRAGMENT}",
            uri_path(false)
        ),
        "idn-email" => format_body("email", pointer)?,
        // LDH labels without `--` (which RFC 5891 reserves for A-labels): valid IDN hostnames.
        "idn-hostname" => {
            let label = "[a-z0-9]{1,20}(?:-[a-z0-9]{1,20}){0,2}";
            format!("{label}(?:\\.{label}){{0,4}}")
        }
        // Letters, digits, space, `_` and `-`: a regex that matches itself.
        "regex" => "[A-Za-z0-9 _-]{0,64}".to_owned(),
        // RFC 6570 literals only (no expressions): unreserved and reserved characters but `'`,
        // and percent-encodings.
        "uri-template" => "(?:[A-Za-z0-9._~:/?#@!$&()*+,;=-]|%[0-9A-Fa-f]{2}){0,128}".to_owned(),
        // RFC 6901: `/`-separated tokens where `~` is only `~0` or `~1` (characters that need a
        // JSON escape are left out).
        "json-pointer" => JSON_POINTER.to_owned(),
        "relative-json-pointer" => format!("(?:0|[1-9][0-9]{{0,8}})(?:#|{JSON_POINTER})"),
        "uri-reference" | "iri-reference" => format!(
            "(?:[A-Za-z][A-Za-z0-9+.-]{{0,15}}:{}|{}){QUERY_FRAGMENT}",
            uri_path(false),
            uri_path(true),
        ),
        other => {
            return Err(unsupported(
                "format",
                pointer,
                &format!("format {other:?} is not supported yet"),
            ))
        }
    })
}

/// One character as a regex over its JSON encoding.
fn encode_char(c: char) -> String {
    let s = serde_json::to_string(&c.to_string()).unwrap();
    regex_syntax::escape(&s[1..s.len() - 1])
}
/// A regex-syntax pattern as a regex over the JSON encoding of the strings it matches.
fn tr(h: &regex_syntax::hir::Hir, pointer: &str) -> Result<String> {
    use regex_syntax::hir::{Class, HirKind};
    Ok(match h.kind() {
        HirKind::Empty => String::new(),
        HirKind::Literal(lit) => {
            let s = std::str::from_utf8(&lit.0)
                .map_err(|_| unsupported("pattern", pointer, "a byte-level literal"))?;
            s.chars().map(encode_char).collect()
        }
        HirKind::Class(Class::Unicode(cls)) => {
            // Characters that JSON writes raw stay a class; the others become their escapes.
            let mut raw = String::new();
            let mut escaped = Vec::new();
            for r in cls.ranges() {
                let (a, b) = (r.start() as u32, r.end() as u32);
                for special in (0..0x20).chain([0x22, 0x5C]) {
                    if a <= special && special <= b {
                        escaped.push(encode_char(char::from_u32(special).unwrap()));
                    }
                }
                raw.push_str(&format!("\\x{{{a:x}}}-\\x{{{b:x}}}"));
            }
            let class = format!(r#"[[{raw}]--[\x00-\x1F"\\]]"#);
            if escaped.is_empty() {
                class
            } else {
                format!("(?:{class}|{})", escaped.join("|"))
            }
        }
        HirKind::Class(Class::Bytes(_)) => {
            return Err(unsupported("pattern", pointer, "a byte class"))
        }
        HirKind::Look(_) => {
            return Err(unsupported(
                "pattern",
                pointer,
                "anchors or word boundaries inside the pattern",
            ))
        }
        HirKind::Repetition(rep) => {
            let inner = tr(&rep.sub, pointer)?;
            let max = rep.max.map_or(String::new(), |m| m.to_string());
            let q = if rep.max == Some(rep.min) {
                format!("{{{}}}", rep.min)
            } else {
                format!("{{{},{max}}}", rep.min)
            };
            format!("(?:{inner}){q}")
        }
        HirKind::Capture(c) => format!("(?:{})", tr(&c.sub, pointer)?),
        HirKind::Concat(hs) => hs
            .iter()
            .map(|h| tr(h, pointer))
            .collect::<Result<String>>()?,
        HirKind::Alternation(hs) => format!(
            "(?:{})",
            hs.iter()
                .map(|h| tr(h, pointer))
                .collect::<Result<Vec<_>>>()?
                .join("|")
        ),
    })
}

/// The strings of a search for `h` (anchored at the start and/or end), as a regex over their JSON
/// encoding.
fn search_text(
    h: &regex_syntax::hir::Hir,
    start: bool,
    end: bool,
    pointer: &str,
) -> Result<String> {
    let any = format!("{STR_CHAR}*");
    let pre = if start { "" } else { &any };
    let post = if end { "" } else { &any };
    Ok(format!("{pre}(?:{}){post}", tr(h, pointer)?))
}

/// A pattern with look-aheads at its top level, split around them: `pieces[0]` is the text before
/// the first look-ahead, then each look-ahead (its body and whether it is negative) with the text
/// after it.
struct Lookaheads<'p> {
    first: &'p str,
    rest: Vec<(&'p str, bool, &'p str)>,
}

/// Splits `pattern` at its top-level look-aheads (`(?=…)`, `(?!…)`); `None` when it has none.
/// Look-aheads inside groups, next to a top-level alternation, and look-behinds are unsupported.
fn split_lookaheads<'p>(pattern: &'p str, pointer: &str) -> Result<Option<Lookaheads<'p>>> {
    let refuse = |why: &str| unsupported("pattern", pointer, why);
    let b = pattern.as_bytes();
    let (mut depth, mut in_class, mut i) = (0usize, false, 0usize);
    let mut cuts: Vec<(usize, usize, bool)> = Vec::new(); // (open, close, negative)
    let mut open_at: Vec<(usize, Option<bool>)> = Vec::new();
    let mut alternation = false;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 1,
            b'[' if !in_class => in_class = true,
            b']' if in_class => in_class = false,
            _ if in_class => {}
            b'(' => {
                let look = match (b.get(i + 1), b.get(i + 2)) {
                    (Some(b'?'), Some(b'=')) => Some(false),
                    (Some(b'?'), Some(b'!')) => Some(true),
                    (Some(b'?'), Some(b'<')) if matches!(b.get(i + 3), Some(b'=' | b'!')) => {
                        return Err(refuse("look-behind is not supported"))
                    }
                    _ => None,
                };
                if look.is_some() && depth > 0 {
                    return Err(refuse("a look-ahead inside a group is not supported"));
                }
                open_at.push((i, look));
                depth += 1;
            }
            b')' => {
                let (at, look) = open_at.pop().ok_or_else(|| refuse("unbalanced `)`"))?;
                depth -= 1;
                if let Some(negative) = look {
                    cuts.push((at, i, negative));
                }
            }
            b'|' if depth == 0 => alternation = true,
            _ => {}
        }
        i += 1;
    }
    if cuts.is_empty() {
        return Ok(None);
    }
    if alternation {
        return Err(refuse(
            "a look-ahead next to a top-level alternation is not supported",
        ));
    }
    let first = &pattern[..cuts[0].0];
    let rest = cuts
        .iter()
        .enumerate()
        .map(|(k, &(open, close, negative))| {
            let until = cuts.get(k + 1).map_or(pattern.len(), |c| c.0);
            (
                &pattern[open + 3..close],
                negative,
                &pattern[close + 1..until],
            )
        })
        .collect();
    Ok(Some(Lookaheads { first, rest }))
}

/// The search for a pattern with top-level look-aheads. A look-ahead constrains the rest of the
/// whole string from where it stands: `P0 (?!X) P1` is `P0 · (R ∧ ¬(X·Σ*))` where `R` is `P1` and
/// whatever the search allows after it (`X` alone when it ends with `$`); several nest from the
/// right. Intersections are terms ([`Re::and`]), built lazily by the DFA.
fn with_lookaheads(p: &Lookaheads<'_>, pointer: &str) -> Result<Re> {
    let refuse = |why: &str| unsupported("pattern", pointer, why);
    // A fragment as a regex over the JSON text, matched in full.
    let full = |text: &str| -> Result<Re> {
        if text.is_empty() {
            return Ok(Re::empty());
        }
        pattern_in_json(&format!("^(?:{text})$"), pointer)
    };
    let (first, start) = match p.first.strip_prefix('^') {
        Some(f) => (f, true),
        None => (p.first, false),
    };
    let last = p.rest.last().expect("at least one look-ahead").2;
    let end = last.ends_with('$') && !last.ends_with("\\$");
    let any = Re::text(format!("{STR_CHAR}*"));
    let mut acc = Re::empty();
    // A leading look-ahead with `^`: whether it is negative, and the rest after it.
    let mut later: Option<(bool, Re)> = None;
    for (k, &(body, negative, after)) in p.rest.iter().enumerate().rev() {
        let after = if k + 1 == p.rest.len() && end {
            &after[..after.len() - 1]
        } else {
            after
        };
        let tail = if k + 1 == p.rest.len() && !end {
            any.clone()
        } else {
            Re::empty()
        };
        let rest = Re::seq([full(after)?, acc, tail]);
        // `^` inside a look-ahead holds only at the start of the string: in a pattern searched
        // anywhere, a match starting later sees the look-ahead fail.
        let body = match body.strip_prefix('^') {
            Some(b) if k == 0 && first.is_empty() => {
                later = Some((negative, rest.clone()));
                b
            }
            Some(_) => return Err(refuse("`^` inside a look-ahead that is not at the start")),
            None => body,
        };
        let look = match body.strip_suffix('$') {
            Some(b) if !b.ends_with('\\') => full(b)?,
            _ => Re::seq([full(body)?, any.clone()]),
        };
        acc = Re::and(rest, look, negative);
    }
    match later {
        Some(_) if start => Ok(acc),
        // A negative look-ahead passes for matches after the start, a positive one fails.
        Some((true, rest)) => Ok(Re::alt([
            acc,
            Re::seq([Re::text(format!("{STR_CHAR}+")), rest]),
        ])),
        Some((false, _)) => Ok(acc),
        None => {
            let pre = if start { Re::empty() } else { any };
            Ok(Re::seq([pre, full(first)?, acc]))
        }
    }
}

/// An ECMA-262 `pattern` (a search over the decoded string) as a regex over the canonical JSON
/// encoding of the string, without the quotes.
pub(super) fn pattern_in_json(pattern: &str, pointer: &str) -> Result<Re> {
    Ok(pattern_with_length(pattern, None, pointer)?.0)
}

/// [`pattern_in_json`], and with `length` (`minLength`, `maxLength` in code points) also applied
/// where that is cheap: an anchored pattern whose parts have fixed lengths but for one repeated
/// fixed-length part (`^arn:[0-9]{12}:[a-z-]+$`) gets that repetition's bounds narrowed. The flag
/// says whether the length was applied (otherwise the caller intersects).
pub(super) fn pattern_with_length(
    pattern: &str,
    length: Option<(u64, Option<u64>)>,
    pointer: &str,
) -> Result<(Re, bool)> {
    use regex_syntax::hir::{Hir, HirKind, Look};
    if let Some(pieces) = split_lookaheads(pattern, pointer)? {
        return Ok((with_lookaheads(&pieces, pointer)?, false));
    }
    let ecma = ecma_classes(pattern);
    let hir =
        regex_syntax::ParserBuilder::new()
            .build()
            .parse(&ecma)
            .map_err(|e| {
                unsupported(
                    "pattern",
                    pointer,
                    &format!(
                    "not expressible as a DFA regex (look-around and backreferences are not): {}",
                    e.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
                ),
                )
            })?;
    // A search for an alternation is the union of the searches for its branches, so each
    // branch of a top-level alternation (inside groups) may carry its own leading ^ and trailing
    // $ (anchors); any other assertion is unsupported.
    fn branches(h: &Hir, start: bool, end: bool, out: &mut Vec<(Vec<Hir>, bool, bool)>) {
        match h.kind() {
            HirKind::Capture(c) => branches(&c.sub, start, end, out),
            HirKind::Alternation(hs) => {
                for b in hs {
                    branches(b, start, end, out);
                }
            }
            HirKind::Concat(items) => {
                let mut items = items.clone();
                let (mut s, mut e) = (start, end);
                while matches!(
                    items.first().map(Hir::kind),
                    Some(HirKind::Look(Look::Start))
                ) {
                    items.remove(0);
                    s = true;
                }
                while matches!(items.last().map(Hir::kind), Some(HirKind::Look(Look::End))) {
                    items.pop();
                    e = true;
                }
                match items.as_slice() {
                    [one] => branches(one, s, e, out),
                    _ => out.push((items, s, e)),
                }
            }
            HirKind::Look(Look::Start) => out.push((vec![], true, end)),
            HirKind::Look(Look::End) => out.push((vec![], start, true)),
            _ => out.push((vec![h.clone()], start, end)),
        }
    }
    let mut found = Vec::new();
    branches(&hir, false, false, &mut found);
    if found.len() > 1 {
        let mut alts = Vec::with_capacity(found.len());
        for (items, s, e) in found {
            alts.push(search_text(&Hir::concat(items), s, e, pointer)?);
        }
        return Ok((Re::text(alts.join("|")), false));
    }
    let (mut items, anchored_start, anchored_end) = found.pop().expect("one branch");
    let mut applied = false;
    let (mut anchored_start, mut anchored_end) = (anchored_start, anchored_end);
    if let Some((lo, hi)) = length {
        // With a length, the pattern is matched in full rather than searched for (a full match
        // is a search match: sound, narrower). Text around a match would be more variable parts
        // whose counts the automaton must track together.
        match narrow_to_length(&mut items, lo, hi) {
            Some(true) => (anchored_start, anchored_end, applied) = (true, true, true),
            Some(false) if anchored_start && anchored_end => {
                return Ok((Re::nothing(), true));
            }
            _ => {}
        }
    }
    let body: String = items
        .drain(..)
        .map(|h| tr(&h, pointer))
        .collect::<Result<String>>()?;
    let pre = if anchored_start {
        String::new()
    } else {
        format!("{STR_CHAR}*")
    };
    let post = if anchored_end {
        String::new()
    } else {
        format!("{STR_CHAR}*")
    };
    Ok((Re::text(format!("{pre}(?:{body}){post}")), applied))
}

/// ECMA-262 meanings of `\\d`, `\\w`, `\\s` and `.` where regex-syntax's Unicode ones are wider
/// (Unicode digits and letters; U+0085 in `\\s`; `\\r`, U+2028 and U+2029 in `.`). The
/// negated forms are left alone: theirs are narrower, which is sound.
fn ecma_classes(pattern: &str) -> String {
    const SPACE: &str = r"\t\n\x0B\x0C\r \xA0\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\x{FEFF}";
    let mut out = String::with_capacity(pattern.len());
    let mut in_class = false;
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let Some(e) = chars.next() else {
                    out.push(c);
                    break;
                };
                let (inside, outside) = match e {
                    'd' => ("0-9", "[0-9]"),
                    'w' => ("A-Za-z0-9_", "[A-Za-z0-9_]"),
                    's' => (SPACE, ""),
                    _ => {
                        out.push(c);
                        out.push(e);
                        continue;
                    }
                };
                if in_class {
                    out.push_str(inside);
                } else if e == 's' {
                    out.push_str(&format!("[{SPACE}]"));
                } else {
                    out.push_str(outside);
                }
            }
            '[' if !in_class => {
                in_class = true;
                out.push(c);
                // A `]` right after `[` or `[^` is a literal.
                if chars.peek() == Some(&'^') {
                    out.push(chars.next().unwrap());
                }
                if chars.peek() == Some(&']') {
                    out.push_str("\\]");
                    chars.next();
                }
            }
            ']' if in_class => {
                in_class = false;
                out.push(c);
            }
            '.' if !in_class => out.push_str(r"[^\n\r\x{2028}\x{2029}]"),
            _ => out.push(c),
        }
    }
    out
}

/// The length in code points of every string `h` matches, if they all have the same.
fn fixed_len(h: &regex_syntax::hir::Hir) -> Option<u64> {
    use regex_syntax::hir::HirKind;
    match h.kind() {
        HirKind::Empty => Some(0),
        HirKind::Literal(l) => std::str::from_utf8(&l.0)
            .ok()
            .map(|s| s.chars().count() as u64),
        HirKind::Class(_) => Some(1),
        HirKind::Capture(c) => fixed_len(&c.sub),
        HirKind::Concat(hs) => hs.iter().map(fixed_len).sum(),
        HirKind::Alternation(hs) => {
            let first = fixed_len(&hs[0])?;
            hs.iter()
                .all(|h| fixed_len(h) == Some(first))
                .then_some(first)
        }
        HirKind::Repetition(r) if r.max == Some(r.min) => Some(r.min as u64 * fixed_len(&r.sub)?),
        _ => None,
    }
}

/// Narrows the variable-length repetitions in `items` (a full-match concatenation) so the whole
/// has a length in `[lo, hi]`: `Some(true)` when done, `Some(false)` when no length fits, `None`
/// when some part is not a repetition of a fixed-length piece. With one such repetition this is
/// exact; with several, each gets an equal share of the budget (sound, narrower), and the first
/// takes up any shortfall below `lo`.
fn narrow_to_length(
    items: &mut [regex_syntax::hir::Hir],
    lo: u64,
    hi: Option<u64>,
) -> Option<bool> {
    use regex_syntax::hir::{Hir, HirKind, Repetition};
    let lens: Vec<Option<u64>> = items.iter().map(fixed_len).collect();
    let fixed: u64 = lens.iter().flatten().sum();
    let mut reps: Vec<(usize, Repetition, u64)> = Vec::new();
    for i in (0..items.len()).filter(|&i| lens[i].is_none()) {
        let mut h = &items[i];
        while let HirKind::Capture(c) = h.kind() {
            h = &c.sub;
        }
        let HirKind::Repetition(r) = h.kind() else {
            return None;
        };
        let k = fixed_len(&r.sub).filter(|&k| k > 0)?;
        reps.push((i, r.clone(), k));
    }
    if reps.is_empty() {
        return Some(fixed >= lo && hi.is_none_or(|h| fixed <= h));
    }
    let n = reps.len() as u64;
    let budget = match hi {
        Some(h) => Some(h.checked_sub(fixed)?),
        None => None,
    };
    let mut bounds: Vec<(u64, Option<u64>)> = reps
        .iter()
        .map(|(_, r, k)| {
            let share = budget.map(|b| if n == 1 { b / k } else { b / n / k });
            let max = match (share, r.max) {
                (Some(s), Some(m)) => Some(s.min(m as u64)),
                (s, m) => s.or(m.map(u64::from)),
            };
            (r.min as u64, max)
        })
        .collect();
    let least: u64 = bounds
        .iter()
        .zip(&reps)
        .map(|((min, _), (_, _, k))| min * k)
        .sum();
    let shortfall = lo.saturating_sub(fixed + least);
    if shortfall > 0 {
        let k = reps[0].2;
        bounds[0].0 += shortfall.div_ceil(k);
    }
    if bounds
        .iter()
        .any(|(min, max)| max.is_some_and(|m| m < *min))
    {
        // With one part that is exact: nothing fits. With several, the shares may be too
        // narrow: leave it to the intersection.
        return if n == 1 { Some(false) } else { None };
    }
    for ((i, r, _), (min, max)) in reps.iter().zip(bounds) {
        let min = u32::try_from(min).ok()?;
        let max = match max {
            Some(m) => Some(u32::try_from(m).ok()?),
            None => None,
        };
        items[*i] = Hir::repetition(Repetition {
            min,
            max,
            greedy: r.greedy,
            sub: r.sub.clone(),
        });
    }
    Some(true)
}
