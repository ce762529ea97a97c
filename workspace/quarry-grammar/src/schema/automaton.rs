//! Intersection and difference of two regular languages, for keywords that constrain the same text
//! twice: `pattern` with a length or a `format`, several `pattern`s, property names that must match
//! a pattern and differ from the declared names, and `not` on strings and numbers.
//!
//! Both regexes are compiled to DFAs, the reachable and co-reachable part of their product is
//! explored over the byte classes the two DFAs share, and the product is turned back into a regex
//! by state elimination, so it embeds in the surrounding schema regex like any other piece. The
//! result may use byte classes (`(?-u:[\x80-\xBF])`) where a product edge splits a multi-byte code
//! point; it only ever matches UTF-8 when both inputs do, and schema regexes are compiled with
//! UTF-8 validation of the *pattern* switched off for that reason.
//!
//! Where the product outgrows the limits below, the schema translator writes the intersection
//! itself instead ([`crate::parse::and_text`]): the grammar's DFA then builds the product's states
//! lazily from `And`/`Not` terms, only those outputs visit, each checked for emptiness.

use std::collections::HashMap;

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::util::{primitives::StateID, start, syntax};
use regex_automata::{Anchored, MatchKind};

use super::NOTHING;

/// Product states explored before giving up.
const MAX_STATES: usize = 4096;
/// Length of the regex state elimination may produce.
const MAX_REGEX_BYTES: usize = 256 * 1024;
/// Default size limit of each operand's DFA. Building the product pays off only where it is
/// small: above this, the lazy intersection term builds only the states outputs visit, and
/// building big DFAs here dominated the compile time of real schemas (p99 129 ms with 8 MiB,
/// 17 ms with 256 KiB on the 54-schema corpus, BENCHMARKS.md).
pub(super) const MAX_DFA_BYTES: usize = 256 << 10;

/// Why [`combine`] built no regex.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum CombineError {
    /// The deadline passed.
    OutOfTime,
    /// An operand's DFA, the product or the regex outgrew the limits (the message says which).
    TooLarge(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    /// Strings in both languages.
    And,
    /// Strings in the first language and not in the second.
    AndNot,
}

/// Syntax for schema-derived regexes: Unicode classes, but byte classes may appear (see the
/// module doc).
pub(crate) fn schema_syntax() -> syntax::Config {
    syntax::Config::new().utf8(false)
}

fn dfa(re: &str, max_bytes: usize) -> Result<dense::DFA<Vec<u32>>, CombineError> {
    dense::Builder::new()
        .configure(
            dense::DFA::config()
                .match_kind(MatchKind::All)
                .start_kind(StartKind::Anchored)
                .dfa_size_limit(Some(max_bytes))
                .determinize_size_limit(Some(max_bytes)),
        )
        .syntax(schema_syntax())
        .build(&format!("^(?:{re})$"))
        .map_err(|e| CombineError::TooLarge(e.to_string()))
}

fn start_of(d: &dense::DFA<Vec<u32>>) -> Result<StateID, CombineError> {
    d.start_state(&start::Config::new().anchored(Anchored::Yes))
        .map_err(|e| CombineError::TooLarge(e.to_string()))
}

/// The regex of `a` ∩ `b` (or `a` ∖ `b`). Both are full-match regexes over the same text; each
/// operand's DFA may take `max_dfa_bytes`. An `Err` says why the result could not be built
/// within the limits.
pub(super) fn combine(
    a: &str,
    b: &str,
    op: Op,
    deadline: std::time::Instant,
    max_dfa_bytes: usize,
) -> Result<String, CombineError> {
    let late = || std::time::Instant::now() > deadline;
    let (da, db) = (dfa(a, max_dfa_bytes)?, dfa(b, max_dfa_bytes)?);
    // Bytes that both DFAs treat alike: one representative per pair of classes.
    let (ca, cb) = (da.byte_classes(), db.byte_classes());
    let mut rep_of: HashMap<(u8, u8), usize> = HashMap::new();
    let mut reps: Vec<u8> = Vec::new();
    let mut class_of = [0usize; 256];
    for byte in 0..=255u8 {
        let key = (ca.get(byte), cb.get(byte));
        let n = reps.len();
        let r = *rep_of.entry(key).or_insert(n);
        if r == n {
            reps.push(byte);
        }
        class_of[byte as usize] = r;
    }
    let mut members: Vec<Vec<u8>> = vec![Vec::new(); reps.len()];
    for byte in 0..=255u8 {
        members[class_of[byte as usize]].push(byte);
    }

    let s0 = (start_of(&da)?, start_of(&db)?);
    let mut ids: HashMap<(StateID, StateID), usize> = HashMap::from([(s0, 0)]);
    let mut pairs = vec![s0];
    // Per product state: (class, target).
    let mut edges: Vec<Vec<(usize, usize)>> = Vec::new();
    let mut accepting: Vec<bool> = Vec::new();
    let mut i = 0;
    while i < pairs.len() {
        let (x, y) = pairs[i];
        let fx = da.is_match_state(da.next_eoi_state(x));
        let fy = db.is_match_state(db.next_eoi_state(y));
        accepting.push(match op {
            Op::And => fx && fy,
            Op::AndNot => fx && !fy,
        });
        let mut out = Vec::new();
        for (class, &byte) in reps.iter().enumerate() {
            let nx = da.next_state(x, byte);
            if da.is_dead_state(nx) {
                continue;
            }
            let ny = db.next_state(y, byte);
            if op == Op::And && db.is_dead_state(ny) {
                continue;
            }
            let n = pairs.len();
            let id = *ids.entry((nx, ny)).or_insert(n);
            if id == n {
                if n >= MAX_STATES {
                    return Err(CombineError::TooLarge(format!(
                        "the product automaton exceeds {MAX_STATES} states"
                    )));
                }
                if n.is_multiple_of(256) && late() {
                    return Err(CombineError::OutOfTime);
                }
                pairs.push((nx, ny));
            }
            out.push((class, id));
        }
        edges.push(out);
        i += 1;
    }

    // Keep the states from which an accepting state is reachable.
    let n = pairs.len();
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (s, out) in edges.iter().enumerate() {
        for &(_, t) in out {
            preds[t].push(s);
        }
    }
    let mut live = accepting.clone();
    let mut stack: Vec<usize> = (0..n).filter(|&s| accepting[s]).collect();
    while let Some(s) = stack.pop() {
        for &p in &preds[s] {
            if !live[p] {
                live[p] = true;
                stack.push(p);
            }
        }
    }
    if !live[0] {
        return Ok(NOTHING.to_owned());
    }

    // State elimination over the live states, plus a new initial (n) and final (n + 1) state.
    let (init, fin) = (n, n + 1);
    let mut out: Vec<HashMap<usize, String>> = vec![HashMap::new(); n + 2];
    let mut inc: Vec<Vec<usize>> = vec![Vec::new(); n + 2];
    fn add(
        out: &mut [HashMap<usize, String>],
        inc: &mut [Vec<usize>],
        p: usize,
        q: usize,
        label: String,
    ) {
        match out[p].get_mut(&q) {
            Some(old) => *old = union(old, &label),
            None => {
                out[p].insert(q, label);
                inc[q].push(p);
            }
        }
    }
    add(&mut out, &mut inc, init, 0, String::new());
    for s in (0..n).filter(|&s| live[s]) {
        if accepting[s] {
            add(&mut out, &mut inc, s, fin, String::new());
        }
        let mut by_target: HashMap<usize, Vec<u8>> = HashMap::new();
        for &(class, t) in &edges[s] {
            if live[t] {
                by_target
                    .entry(t)
                    .or_default()
                    .extend_from_slice(&members[class]);
            }
        }
        for (t, mut bytes) in by_target {
            bytes.sort_unstable();
            add(&mut out, &mut inc, s, t, byte_set(&bytes));
        }
    }
    let mut remaining: Vec<usize> = (0..n).filter(|&s| live[s]).collect();
    while !remaining.is_empty() {
        // Eliminate the state with the fewest paths through it.
        let (pos, &k) = remaining
            .iter()
            .enumerate()
            .min_by_key(|(_, &k)| inc[k].len() * out[k].len())
            .expect("not empty");
        remaining.swap_remove(pos);
        if remaining.len().is_multiple_of(64) && late() {
            return Err(CombineError::OutOfTime);
        }
        let looped = out[k].remove(&k).map(|l| format!("(?:{l})*"));
        inc[k].retain(|&p| p != k);
        let succs: Vec<(usize, String)> = out[k].drain().collect();
        let preds_k = std::mem::take(&mut inc[k]);
        for &p in &preds_k {
            let a = out[p].remove(&k).expect("edge into k");
            for (q, b) in &succs {
                let label = format!("{a}{}{b}", looped.as_deref().unwrap_or(""));
                if label.len() > MAX_REGEX_BYTES {
                    return Err(CombineError::TooLarge(format!(
                        "the combined regex exceeds {} KiB",
                        MAX_REGEX_BYTES / 1024
                    )));
                }
                add(&mut out, &mut inc, p, *q, label);
            }
        }
        for (q, _) in &succs {
            inc[*q].retain(|&p| p != k);
        }
    }
    Ok(out[init]
        .remove(&fin)
        .map(|r| {
            if r.is_empty() {
                "(?:)".to_owned()
            } else {
                format!("(?:{r})")
            }
        })
        .unwrap_or_else(|| NOTHING.to_owned()))
}

fn union(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, true) => String::new(),
        (true, false) => format!("(?:{b})?"),
        (false, true) => format!("(?:{a})?"),
        (false, false) => format!("(?:{a}|{b})"),
    }
}

/// A regex for one byte out of a sorted, non-empty set.
fn byte_set(bytes: &[u8]) -> String {
    if let [b] = bytes {
        if b.is_ascii_graphic() || *b == b' ' {
            return regex_syntax::escape(&(*b as char).to_string());
        }
        return format!("(?-u:\\x{b:02X})");
    }
    let mut class = String::from("(?-u:[");
    let mut i = 0;
    while i < bytes.len() {
        let lo = bytes[i];
        let mut hi = lo;
        while i + 1 < bytes.len() && bytes[i + 1] == hi.wrapping_add(1) && hi != 255 {
            i += 1;
            hi = bytes[i];
        }
        class.push_str(&format!("\\x{lo:02X}"));
        if hi != lo {
            class.push_str(&format!("-\\x{hi:02X}"));
        }
        i += 1;
    }
    class.push_str("])");
    class
}

#[cfg(test)]
mod tests {
    use super::*;

    fn far() -> std::time::Instant {
        std::time::Instant::now() + std::time::Duration::from_secs(60)
    }

    fn full(re: &str) -> regex_automata::dfa::regex::Regex {
        regex_automata::dfa::regex::Regex::builder()
            .syntax(schema_syntax())
            .build(&format!("^(?:{re})$"))
            .unwrap()
    }

    #[test]
    fn intersection_and_difference_are_exact() {
        let cases: &[(&str, &str)] = &[
            ("[a-z]*[0-9]*", ".{0,4}"),
            ("(?:ab|cd)+", "a.*"),
            ("[a-zé]{1,3}", "é.?"),
            ("\"[^\"]*\"", "\"x.*\""),
            ("(?:[01])*", "(?:0|1(?:01*0)*1)*"),
        ];
        let samples = [
            "", "a", "ab", "abcd", "cdab", "a1", "ab12", "abc12", "é", "éa", "aé", "ééé", "\"x\"",
            "\"\"", "\"xy", "0", "11", "110", "1001", "111", "10", "ab9", "z",
        ];
        for (a, b) in cases {
            let (ra, rb) = (full(a), full(b));
            for (op, want) in [
                (
                    Op::And,
                    (|x: bool, y: bool| x && y) as fn(bool, bool) -> bool,
                ),
                (Op::AndNot, |x, y| x && !y),
            ] {
                let re = combine(a, b, op, far(), MAX_DFA_BYTES).unwrap();
                let r = full(&re);
                for s in samples {
                    let expected = want(ra.is_match(s), rb.is_match(s));
                    assert_eq!(r.is_match(s), expected, "{a:?} {op:?} {b:?} on {s:?}: {re}");
                }
            }
        }
    }

    #[test]
    fn empty_results_and_limits() {
        assert_eq!(
            combine("a+", "b+", Op::And, far(), MAX_DFA_BYTES).unwrap(),
            NOTHING
        );
        assert_eq!(
            combine("a", "a|b", Op::AndNot, far(), MAX_DFA_BYTES).unwrap(),
            NOTHING
        );
        // Past the product's state limit, and past an operand's DFA size limit.
        let err = combine("[ab]*a[ab]{14}", "[ab]*", Op::And, far(), 8 << 20).unwrap_err();
        assert!(
            matches!(&err, CombineError::TooLarge(m) if m.contains("states")),
            "{err:?}"
        );
        let err = combine("[ab]*a[ab]{14}", "[ab]*", Op::And, far(), MAX_DFA_BYTES).unwrap_err();
        assert!(matches!(err, CombineError::TooLarge(_)), "{err:?}");
        let past = std::time::Instant::now() - std::time::Duration::from_secs(1);
        let err = combine("[ab]*a[ab]{9}", "[ab]*", Op::And, past, 8 << 20).unwrap_err();
        assert_eq!(err, CombineError::OutOfTime);
    }
}
