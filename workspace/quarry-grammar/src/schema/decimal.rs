//! Bounded non-integer numbers: the exact language of decimal texts (`-?I(.F)?`, no exponent)
//! whose value lies between two bounds. Values are compared as JSON Schema validators do, on the
//! bounds' `f64` values, whose shortest decimal form (Rust's `Display`) gives the digits.
//!
//! A fraction is compared digit by digit against the bound's fraction as zero-padded strings, so
//! `1.5`, `1.50` and `1.500` are all equal to the bound `1.5`. Negative zero (`-0`, `-0.0`) is
//! never written.

use super::scalar::int_range;
use super::{alt_text as alt, NOTHING};

/// Largest integer part written (18 digits).
const INT_MAX: u64 = 999_999_999_999_999_999;

/// A non-negative decimal: integer part and fraction digits without trailing zeros.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Mag {
    int: u64,
    frac: Vec<u8>,
}

fn magnitude(v: f64) -> Mag {
    let s = v.abs().to_string();
    let (i, f) = s.split_once('.').unwrap_or((&s, ""));
    let mut frac: Vec<u8> = f.bytes().map(|c| c - b'0').collect();
    while frac.last() == Some(&0) {
        frac.pop();
    }
    Mag {
        int: i.parse().unwrap_or(u64::MAX),
        frac,
    }
}

/// Decimal texts whose value lies within the bounds, each `(value, exclusive)`.
/// At most `room` fraction digits (18 in the JSON number grammar; fewer for `multipleOf: 0.01`).
pub(super) fn decimal_range(
    lower: Option<(f64, bool)>,
    upper: Option<(f64, bool)>,
    room: usize,
    fractional: bool,
) -> String {
    // Outside ±10^18 a bound either excludes everything written or nothing.
    let lower = match lower {
        Some((v, _)) if v >= 1e18 => return NOTHING.to_owned(),
        Some((v, _)) if v <= -1e18 => None,
        b => b,
    };
    let upper = match upper {
        Some((v, _)) if v <= -1e18 => return NOTHING.to_owned(),
        Some((v, _)) if v >= 1e18 => None,
        b => b,
    };
    if let (Some((l, lx)), Some((h, hx))) = (lower, upper) {
        if l > h || (l == h && (lx || hx)) {
            return NOTHING.to_owned();
        }
    }
    let mut parts = Vec::new();
    // Negative values: magnitudes in (0, |lower|] above |upper| where upper < 0.
    if lower.is_none_or(|(l, _)| l < 0.0) {
        let (from, from_incl) = match upper {
            Some((h, hx)) if h < 0.0 => (magnitude(h), !hx),
            _ => (magnitude(0.0), false),
        };
        let to = lower.map(|(l, lx)| (magnitude(l), !lx));
        parts.push(format!(
            "-{}",
            between(&from, from_incl, to.as_ref(), room, fractional)
        ));
    }
    // Non-negative values.
    if upper.is_none_or(|(h, hx)| h > 0.0 || (h == 0.0 && !hx)) {
        let (from, from_incl) = match lower {
            Some((l, lx)) if l >= 0.0 => (magnitude(l), !lx),
            _ => (magnitude(0.0), true),
        };
        let to = upper.map(|(h, hx)| (magnitude(h), !hx));
        parts.push(between(&from, from_incl, to.as_ref(), room, fractional));
    }
    alt(&parts)
}

/// Unsigned texts with magnitude from `a` (inclusive or not) up to `b` (`(bound, inclusive)`, or
/// unbounded).
/// With `fractional`, only values that are not integers.
fn between(
    a: &Mag,
    a_incl: bool,
    b: Option<&(Mag, bool)>,
    room: usize,
    fractional: bool,
) -> String {
    // Without integers: a zero fraction is excluded at every end and in between.
    let a_incl = a_incl && !(fractional && a.frac.is_empty());
    let middle = if fractional {
        ge(&[], false, room)
    } else {
        any(room)
    };
    let ints = |lo: u64, hi: u64| -> Option<String> {
        (lo <= hi).then(|| {
            let r = int_range(Some(lo as i64), Some(hi as i64));
            format!("{r}{}", suffix(&middle))
        })
    };
    let mut parts = Vec::new();
    match b {
        Some((b, b_incl)) if b.int == a.int => {
            let f = frac_between(&a.frac, a_incl, &b.frac, *b_incl, room);
            if f.1 || f.0.is_some() {
                parts.push(format!("{}{}", a.int, suffix(&f)));
            }
        }
        _ => {
            let top = b.map_or(INT_MAX, |(b, _)| b.int.min(INT_MAX));
            if a.int > INT_MAX {
                return NOTHING.to_owned();
            }
            parts.push(format!("{}{}", a.int, suffix(&ge(&a.frac, a_incl, room))));
            let below_top = if b.is_some() {
                top.saturating_sub(1)
            } else {
                top
            };
            if a.int < below_top || (b.is_none() && a.int < top) {
                parts.extend(ints(a.int + 1, below_top));
            }
            if let Some((b, b_incl)) = b {
                if b.int <= INT_MAX {
                    let upper = if fractional {
                        frac_between(&[], false, &b.frac, *b_incl, room)
                    } else {
                        le(&b.frac, *b_incl, room)
                    };
                    parts.push(format!("{}{}", b.int, suffix(&upper)));
                }
            }
        }
    }
    alt(&parts)
}

/// A language of fraction digit strings: the regex of its non-empty members, and whether the
/// empty string (no fraction written) belongs to it.
type Frac = (Option<String>, bool);

/// The text after the integer part for fractions in `f`: `.digits`, or nothing.
fn suffix(f: &Frac) -> String {
    match f {
        (Some(ne), true) => format!("(?:\\.{ne})?"),
        (Some(ne), false) => format!("\\.{ne}"),
        (None, true) => String::new(),
        (None, false) => NOTHING.to_owned(),
    }
}

fn any(room: usize) -> Frac {
    (Some(format!("[0-9]{{1,{room}}}")), true)
}

fn digits(room: usize) -> String {
    match room {
        0 => String::new(),
        r => format!("[0-9]{{0,{r}}}"),
    }
}

/// Prepends the digit `d` to every member of `rest` (the empty member included).
fn then(d: u8, rest: &Frac) -> Option<String> {
    let mut alts = Vec::new();
    if let Some(ne) = &rest.0 {
        alts.push(format!("{d}{ne}"));
    }
    if rest.1 {
        alts.push(d.to_string());
    }
    (!alts.is_empty()).then(|| alt(&alts))
}

fn class(lo: u8, hi: u8) -> Option<String> {
    match lo.cmp(&hi) {
        std::cmp::Ordering::Greater => None,
        std::cmp::Ordering::Equal => Some(lo.to_string()),
        std::cmp::Ordering::Less => Some(format!("[{lo}-{hi}]")),
    }
}

/// Fractions `f` (at most `room` digits) with `f ≥ d` (or `>`), comparing zero-padded.
fn ge(d: &[u8], incl: bool, room: usize) -> Frac {
    if room == 0 {
        return (None, d.is_empty() && incl);
    }
    let Some((&d0, rest)) = d.split_first() else {
        if incl {
            return any(room);
        }
        // Greater than zero: some digit is not 0.
        let alts: Vec<String> = (0..room)
            .map(|j| format!("0{{{j}}}[1-9]{}", digits(room - 1 - j)))
            .collect();
        return (Some(alt(&alts)), false);
    };
    let mut alts = Vec::new();
    if let Some(c) = class(d0 + 1, 9) {
        alts.push(format!("{c}{}", digits(room - 1)));
    }
    alts.extend(then(d0, &ge(rest, incl, room - 1)));
    ((!alts.is_empty()).then(|| alt(&alts)), false)
}

/// Fractions `f` (at most `room` digits) with `f ≤ d` (or `<`), comparing zero-padded.
fn le(d: &[u8], incl: bool, room: usize) -> Frac {
    let Some((&d0, rest)) = d.split_first() else {
        // Equal to zero: only zeros.
        return if incl {
            ((room > 0).then(|| format!("0{{1,{room}}}")), true)
        } else {
            (None, false)
        };
    };
    if room == 0 {
        return (None, true);
    }
    let mut alts = Vec::new();
    if d0 > 0 {
        alts.extend(class(0, d0 - 1).map(|c| format!("{c}{}", digits(room - 1))));
    }
    alts.extend(then(d0, &le(rest, incl, room - 1)));
    ((!alts.is_empty()).then(|| alt(&alts)), true)
}

/// Fractions between `a` and `b` (`a ≤ b` zero-padded), each end inclusive or not.
fn frac_between(a: &[u8], a_incl: bool, b: &[u8], b_incl: bool, room: usize) -> Frac {
    let Some((&a0, a_rest)) = a.split_first() else {
        // a is zero: f ≤ b, and f > 0 unless a is inclusive.
        let upper = le(b, b_incl, room);
        if a_incl {
            return upper;
        }
        let Some((&b0, b_rest)) = b.split_first() else {
            return (None, false);
        };
        if room == 0 {
            return (None, false);
        }
        let mut alts = Vec::new();
        if b0 == 0 {
            // 0 first, then a fraction in (0, b_rest].
            alts.extend(then(0, &frac_between(&[], false, b_rest, b_incl, room - 1)));
        } else {
            // 0 then anything above zero; 1 to b0 - 1 then anything; b0 then at most b_rest.
            alts.extend(then(0, &ge(&[], false, room - 1)));
            alts.extend(class(1, b0 - 1).map(|c| format!("{c}{}", digits(room - 1))));
            alts.extend(then(b0, &le(b_rest, b_incl, room - 1)));
        }
        return ((!alts.is_empty()).then(|| alt(&alts)), false);
    };
    if room == 0 {
        return (None, false);
    }
    let Some((&b0, b_rest)) = b.split_first() else {
        return (None, false); // b is zero and a is not: empty
    };
    if a0 == b0 {
        return (
            then(a0, &frac_between(a_rest, a_incl, b_rest, b_incl, room - 1)),
            false,
        );
    }
    let mut alts = Vec::new();
    alts.extend(then(a0, &ge(a_rest, a_incl, room - 1)));
    alts.extend(class(a0 + 1, b0 - 1).map(|c| format!("{c}{}", digits(room - 1))));
    alts.extend(then(b0, &le(b_rest, b_incl, room - 1)));
    ((!alts.is_empty()).then(|| alt(&alts)), false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_ranges_are_exact() {
        let bounds: &[Option<(f64, bool)>] = &[
            None,
            Some((0.0, false)),
            Some((0.0, true)),
            Some((1.5, false)),
            Some((1.5, true)),
            Some((-2.25, false)),
            Some((-2.25, true)),
            Some((0.05, false)),
            Some((1.0, true)),
            Some((-0.5, false)),
            Some((3.0, false)),
        ];
        let mut samples: Vec<String> = Vec::new();
        for i in -40..=40 {
            let v = i as f64 * 0.125;
            samples.push(format!("{v}"));
            samples.push(format!("{v:.3}"));
        }
        samples.extend(
            [
                "0",
                "-0",
                "-0.0",
                "0.05",
                "0.050",
                "0.049",
                "0.0500001",
                "1.5",
                "1.50",
                "1.49",
                "1.5000000001",
                "-2.25",
                "-2.250",
                "-2.2500001",
                "-2.2499",
                "3",
                "3.0",
                "3.00001",
                "10",
                "100.5",
                "-10",
                "-100.5",
                "2.999",
            ]
            .map(String::from),
        );
        for &lo in bounds {
            for &hi in bounds {
                for fractional in [false, true] {
                    let re = decimal_range(lo, hi, 18, fractional);
                    let r = regex_automata::dfa::regex::Regex::new(&format!("^(?:{re})$")).unwrap();
                    for s in &samples {
                        let v: f64 = s.parse().unwrap();
                        let negative_zero = s.starts_with('-') && v == 0.0;
                        let want = !(negative_zero || fractional && v.fract() == 0.0)
                            && lo.is_none_or(|(l, x)| if x { v > l } else { v >= l })
                            && hi.is_none_or(|(h, x)| if x { v < h } else { v <= h });
                        assert_eq!(
                            r.is_match(s),
                            want,
                            "{s} in {lo:?}..{hi:?} ({fractional}): {re}"
                        );
                    }
                }
            }
        }
    }
}
