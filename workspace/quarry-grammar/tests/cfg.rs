//! Context-free constraints: GBNF grammars, `json_object` and recursive JSON Schemas.
//!
//! - Random grammars and walks against an independent Earley recognizer (below): a token is
//!   allowed iff its bytes keep some parse alive, EOS iff the text so far is a sentence.
//! - The test grammars in `tests/grammars/` (JSON, arithmetic, a SQL subset, CSV), each with
//!   texts it must accept and texts it must refuse.
//! - `json_object` and recursive schemas: walks end in JSON that serde_json parses and the
//!   jsonschema crate validates, at depths a regex could not reach.
//! - Errors: line and column for malformed grammars, left recursion, the parser work limit.

use std::collections::HashSet;
use std::sync::Arc;

use quarry_grammar::{
    Constraint, Grammar, GrammarError, Limits, Matcher, SchemaOptions, Vocabulary, Whitespace,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[path = "common/vocab.rs"]
mod vocab;
use vocab::{byte_vocab, model_vocab};

fn grammar_file(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/grammars")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn compile(c: &Constraint, vocab: &Arc<Vocabulary>) -> Arc<Grammar> {
    compile_with(c, vocab, Limits::default())
}

fn compile_with(c: &Constraint, vocab: &Arc<Vocabulary>, limits: Limits) -> Arc<Grammar> {
    Arc::new(Grammar::compile(c, vocab.clone(), limits).unwrap())
}

/// Limits that use loop regions wherever they apply, however small (masks must not change).
fn every_loop_region() -> Limits {
    Limits {
        min_loop_region: 0,
        ..Limits::default()
    }
}

/// Whether the grammar accepts exactly `text`, fed byte by byte.
fn accepts(g: &Arc<Grammar>, text: &str) -> bool {
    let mut m = Matcher::new(g.clone());
    m.accept_bytes(text.as_bytes()).is_ok() && m.is_accepting()
}

fn bit(mask: &[u32], id: u32) -> bool {
    mask[id as usize / 32] >> (id % 32) & 1 == 1
}

// ---------------------------------------------------------------------------------------------
// The oracle: a plain Earley recognizer over bytes, sharing nothing with the crate.

/// A symbol: a byte from a set, or a nonterminal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Sym {
    Bytes(Vec<u8>),
    Rule(usize),
}

/// Rule `i` is `rules[i]`: alternatives of symbol sequences. Rule 0 is the start. `star`: the
/// rule that repeats a byte set (`[set]*` in GBNF).
struct Bnf {
    rules: Vec<Vec<Vec<Sym>>>,
    star: Option<usize>,
}

/// An Earley item: (rule, alternative, dot, origin).
type Item = (usize, usize, usize, usize);

struct Earley<'g> {
    g: &'g Bnf,
    nullable: Vec<bool>,
    /// `sets[i]` is the Earley set after `i` bytes.
    sets: Vec<Vec<Item>>,
}

impl<'g> Earley<'g> {
    fn new(g: &'g Bnf) -> Self {
        let mut nullable = vec![false; g.rules.len()];
        loop {
            let mut changed = false;
            for (r, alts) in g.rules.iter().enumerate() {
                let n = alts
                    .iter()
                    .any(|a| a.iter().all(|s| matches!(s, Sym::Rule(x) if nullable[*x])));
                if n && !nullable[r] {
                    nullable[r] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        let mut e = Earley {
            g,
            nullable,
            sets: Vec::new(),
        };
        let start: Vec<Item> = (0..g.rules[0].len()).map(|a| (0, a, 0, 0)).collect();
        let s = e.close(start, 0);
        e.sets.push(s);
        e
    }

    /// Predict and complete until nothing changes (Aycock and Horspool's nullable fix).
    fn close(&self, items: Vec<Item>, pos: usize) -> Vec<Item> {
        let mut seen: HashSet<Item> = items.iter().copied().collect();
        let mut work = items;
        let mut i = 0;
        while i < work.len() {
            let (r, a, dot, origin) = work[i];
            i += 1;
            let alt = &self.g.rules[r][a];
            let mut add = |it: Item, work: &mut Vec<Item>| {
                if seen.insert(it) {
                    work.push(it);
                }
            };
            match alt.get(dot) {
                Some(Sym::Rule(x)) => {
                    for b in 0..self.g.rules[*x].len() {
                        add((*x, b, 0, pos), &mut work);
                    }
                    if self.nullable[*x] {
                        add((r, a, dot + 1, origin), &mut work);
                    }
                }
                Some(Sym::Bytes(_)) => {}
                None => {
                    // Complete: advance every item in the origin set waiting for `r`.
                    let waiting: Vec<Item> = if origin == pos {
                        work.clone()
                    } else {
                        self.sets[origin].clone()
                    };
                    for (r2, a2, d2, o2) in waiting {
                        if self.g.rules[r2][a2].get(d2) == Some(&Sym::Rule(r)) {
                            add((r2, a2, d2 + 1, o2), &mut work);
                        }
                    }
                }
            }
            // A completion at `pos` may be found after items that wait for it were added.
            if i == work.len() {
                let done: Vec<usize> = work
                    .iter()
                    .filter(|&&(r, a, d, o)| o == pos && d == self.g.rules[r][a].len())
                    .map(|&(r, ..)| r)
                    .collect();
                let before = work.len();
                for (r2, a2, d2, o2) in work.clone() {
                    if let Some(Sym::Rule(x)) = self.g.rules[r2][a2].get(d2) {
                        if done.contains(x) {
                            let it = (r2, a2, d2 + 1, o2);
                            if seen.insert(it) {
                                work.push(it);
                            }
                        }
                    }
                }
                if work.len() == before {
                    break;
                }
            }
        }
        work
    }

    /// Reads `b`; false (and nothing changed) if no parse survives it.
    fn push(&mut self, b: u8) -> bool {
        let pos = self.sets.len() - 1;
        let scanned: Vec<Item> = self.sets[pos]
            .iter()
            .filter(|&&(r, a, d, _)| {
                matches!(self.g.rules[r][a].get(d), Some(Sym::Bytes(set)) if set.contains(&b))
            })
            .map(|&(r, a, d, o)| (r, a, d + 1, o))
            .collect();
        if scanned.is_empty() {
            return false;
        }
        let s = self.close(scanned, pos + 1);
        self.sets.push(s);
        true
    }

    fn pop(&mut self, n: usize) {
        self.sets.truncate(self.sets.len() - n);
    }

    fn accepting(&self) -> bool {
        self.sets
            .last()
            .unwrap()
            .iter()
            .any(|&(r, a, d, o)| r == 0 && o == 0 && d == self.g.rules[0][a].len())
    }

    /// Whether `bytes` keeps a parse alive (every rule is productive, so a live parse can finish).
    fn allows(&mut self, bytes: &[u8]) -> bool {
        let mut n = 0;
        for &b in bytes {
            if !self.push(b) {
                break;
            }
            n += 1;
        }
        self.pop(n);
        n == bytes.len()
    }
}

/// The bytes random grammars are written in: `symbols` may stand alone or in sets; `loop_set`,
/// when not empty, is a set that also appears repeated (`[...]*`), so that states loop on it
/// and mask walks go through their loop regions.
struct Alphabet {
    symbols: &'static [u8],
    loop_set: &'static [u8],
}

/// A few bytes and a pair: masks per pushdown configuration, return points.
const SMALL: Alphabet = Alphabet {
    symbols: b"ab(),",
    loop_set: b"",
};

/// Eight letters repeated, as an identifier repeats its characters, reached from many contexts
/// (`crate::loops`): at least `MIN_LOOP_BYTES` bytes loop.
const LOOPING: Alphabet = Alphabet {
    symbols: b"ah(),bcdefg",
    loop_set: b"abcdefgh",
};

impl Alphabet {
    fn bytes(&self) -> Vec<u8> {
        let mut all = self.symbols.to_vec();
        all.extend(self.loop_set.iter().filter(|b| !self.symbols.contains(b)));
        all
    }
}

/// A random grammar over `alphabet` without left recursion: before the first byte of an
/// alternative, only rules with a higher number appear. Every rule has an alternative of bytes
/// only, so every rule can finish. A repeated loop set (`Sym::Rule` of a rule added at the end,
/// `""` or the set then itself) is written `[set]*` in GBNF ([`gbnf`]).
fn random_bnf(rng: &mut SmallRng, alphabet: &Alphabet) -> Bnf {
    let n = rng.random_range(2..5);
    let star = n;
    let looping = !alphabet.loop_set.is_empty();
    let byte = |rng: &mut SmallRng| -> Sym {
        match rng.random_range(0..if looping { 6 } else { 4 }) {
            0 => Sym::Bytes(b"ab".to_vec()),
            1 if looping => Sym::Bytes(alphabet.loop_set.to_vec()),
            _ => Sym::Bytes(vec![
                alphabet.symbols[rng.random_range(0..alphabet.symbols.len())],
            ]),
        }
    };
    let mut rules: Vec<Vec<Vec<Sym>>> = (0..n)
        .map(|r| {
            let mut alts = vec![(0..rng.random_range(0..3)).map(|_| byte(rng)).collect()];
            for _ in 0..rng.random_range(1..4) {
                let mut alt = Vec::new();
                let mut seen_byte = false;
                for _ in 0..rng.random_range(1..5) {
                    if looping && rng.random_bool(0.1) {
                        // Nullable: a loop is never the first byte that guards recursion.
                        alt.push(Sym::Rule(star));
                    } else if rng.random_bool(0.5) {
                        alt.push(byte(rng));
                        seen_byte = true;
                    } else if seen_byte {
                        alt.push(Sym::Rule(rng.random_range(0..n)));
                    } else if r + 1 < n {
                        alt.push(Sym::Rule(rng.random_range(r + 1..n)));
                    }
                }
                alts.push(alt);
            }
            alts
        })
        .collect();
    if looping {
        let set = alphabet.loop_set.to_vec();
        rules.push(vec![vec![], vec![Sym::Bytes(set), Sym::Rule(star)]]);
    }
    Bnf {
        rules,
        star: looping.then_some(star),
    }
}

fn gbnf(g: &Bnf) -> String {
    let name = |r: usize| {
        if r == 0 {
            "root".to_owned()
        } else {
            format!("r{r}")
        }
    };
    let set = |set: &[u8]| {
        let chars: String = set
            .iter()
            .map(|&b| match b {
                b'a'..=b'z' | b'(' | b')' | b',' => (b as char).to_string(),
                _ => format!("\\x{b:02X}"),
            })
            .collect();
        format!("[{chars}]")
    };
    let mut out = String::new();
    for (r, alts) in g.rules.iter().enumerate() {
        if Some(r) == g.star {
            continue;
        }
        let alts: Vec<String> = alts
            .iter()
            .map(|alt| {
                let syms: Vec<String> = alt
                    .iter()
                    .map(|s| match s {
                        Sym::Rule(x) if Some(*x) == g.star => {
                            let Sym::Bytes(b) = &g.rules[*x][1][0] else {
                                unreachable!("the loop rule starts with its set")
                            };
                            format!("{}*", set(b))
                        }
                        Sym::Rule(x) => name(*x),
                        Sym::Bytes(b) => set(b),
                    })
                    .collect();
                if syms.is_empty() {
                    "\"\"".to_owned()
                } else {
                    syms.join(" ")
                }
            })
            .collect();
        out += &format!("{} ::= {}\n", name(r), alts.join(" | "));
    }
    out
}

/// Every string of 1 to 3 bytes over `alphabet`'s first five bytes, every string of 1 or 2
/// over all of them, a few longer ones, then EOS.
fn alphabet_vocab(alphabet: &Alphabet) -> Arc<Vocabulary> {
    let all = alphabet.bytes();
    let mut toks: Vec<Vec<u8>> = Vec::new();
    for len in 1..=3u32 {
        let bytes = if len < 3 { &all[..] } else { &all[..5] };
        for i in 0..bytes.len().pow(len) {
            let mut t = Vec::new();
            let mut k = i;
            for _ in 0..len {
                t.push(bytes[k % bytes.len()]);
                k /= bytes.len();
            }
            toks.push(t);
        }
    }
    if alphabet.loop_set.len() >= 8 {
        for long in [
            "abcdefgh",
            "hgfe(",
            "ab,ba",
            "(gg)",
            "cafe,dead",
            "hhhhh",
            "ha,))",
            "ab,))",
        ] {
            toks.push(long.as_bytes().to_vec());
        }
    }
    toks.push(b"<eos>".to_vec());
    let eos = toks.len() as u32 - 1;
    Arc::new(Vocabulary::new(
        toks.iter()
            .enumerate()
            .map(|(i, t)| (t.as_slice(), i as u32 == eos)),
        &[eos],
    ))
}

#[test]
fn masks_match_an_earley_oracle_on_random_grammars() {
    let (steps, recursive) =
        random_grammars_against_the_oracle(&SMALL, Limits::default(), 150, 6, 16);
    assert!(steps > 3000, "only {steps} steps were checked");
    assert!(recursive > 30, "only {recursive} grammars recurse");
}

/// The same through loop regions ([`LOOPING`]): states that loop on eight letters in many
/// contexts, whose masks reuse one index of the vocabulary's trie.
#[test]
fn masks_match_an_earley_oracle_through_loop_regions() {
    let (steps, recursive) =
        random_grammars_against_the_oracle(&LOOPING, every_loop_region(), 60, 4, 12);
    assert!(steps > 1000, "only {steps} steps were checked");
    assert!(recursive > 10, "only {recursive} grammars recurse");
}

/// Compiles `grammars` random grammars over `alphabet` and walks each `walks` times for up to
/// `len` tokens, checking every mask, acceptance and forced bytes against the Earley oracle.
/// Returns the steps checked and how many grammars recurse.
fn random_grammars_against_the_oracle(
    alphabet: &Alphabet,
    limits: Limits,
    grammars: usize,
    walks: usize,
    len: usize,
) -> (usize, usize) {
    let shared = alphabet_vocab(alphabet);
    let mut rng = SmallRng::seed_from_u64(27);
    let (mut steps, mut recursive) = (0, 0);
    for k in 0..grammars {
        let bnf = random_bnf(&mut rng, alphabet);
        let text = gbnf(&bnf);
        // Every other grammar on a vocabulary of its own: loop indexes are kept per vocabulary,
        // so these walk their regions first, the others mostly reuse indexes.
        let vocab = if k % 2 == 0 {
            alphabet_vocab(alphabet)
        } else {
            shared.clone()
        };
        let g = compile_with(&Constraint::Gbnf(text.clone()), &vocab, limits);
        recursive += (g.state_count() > 0
            && text.contains("r1")
            && text.matches("root").count() > 1) as usize;
        steps += walks_against_the_oracle(&bnf, &g, &mut rng, walks, len);
    }
    (steps, recursive)
}

/// Walks `g` (compiled from `bnf`) `walks` times for up to `len` random allowed tokens, checking
/// every mask, acceptance and forced bytes against the Earley oracle. Returns the steps taken.
fn walks_against_the_oracle(
    bnf: &Bnf,
    g: &Arc<Grammar>,
    rng: &mut SmallRng,
    walks: usize,
    len: usize,
) -> usize {
    let vocab = g.vocabulary();
    let eos = vocab.eos()[0];
    let text = gbnf(bnf);
    let mut mask = vec![0u32; vocab.mask_words()];
    let mut steps = 0;
    for _ in 0..walks {
        let mut oracle = Earley::new(bnf);
        let mut m = Matcher::new(g.clone());
        for _ in 0..len {
            m.fill_mask(&mut mask);
            for id in 0..vocab.len() as u32 {
                let want = if id == eos {
                    oracle.accepting()
                } else {
                    oracle.allows(vocab.token_bytes(id).unwrap())
                };
                let got = bit(&mask, id);
                assert_eq!(
                    got,
                    want,
                    "grammar\n{text}token {:?} after {} bytes ({:?})",
                    String::from_utf8_lossy(vocab.token_bytes(id).unwrap()),
                    oracle.sets.len() - 1,
                    g.overflow_error()
                );
            }
            assert_eq!(m.is_accepting(), oracle.accepting(), "{text}");
            // Forced bytes are the single continuation the oracle sees, byte by byte.
            let forced = m.forced_bytes().to_vec();
            for &b in &forced {
                let live: Vec<u8> = (0..=255u8).filter(|&c| oracle.allows(&[c])).collect();
                assert_eq!(live, vec![b], "{text}: forced bytes {forced:?}");
                assert!(
                    !oracle.accepting(),
                    "{text}: forced past an accepting point"
                );
                assert!(oracle.push(b));
            }
            oracle.pop(forced.len());
            let allowed: Vec<u32> = (0..vocab.len() as u32)
                .filter(|&i| bit(&mask, i) && i != eos)
                .collect();
            if allowed.is_empty() {
                assert!(oracle.accepting(), "{text}: dead end");
                break;
            }
            let id = allowed[rng.random_range(0..allowed.len())];
            m.accept_token(id).unwrap();
            for &b in vocab.token_bytes(id).unwrap() {
                assert!(oracle.push(b));
            }
            steps += 1;
        }
    }
    steps
}

/// A loop that cannot end the rule it is in (an item needs its `,`), inside brackets that
/// recurse: the masks after `(h` and after `(` walk their cores' loop regions with return
/// points at and past the region's exits (`a,` then `)`).
#[test]
fn return_points_past_a_loop_region_match_the_oracle() {
    let set = LOOPING.loop_set.to_vec();
    let b = |s: &[u8]| Sym::Bytes(s.to_vec());
    // root ::= "(" "h" item ")" | "(" item ")" | "(" root ")"
    // item ::= [a-h] [a-h]* "," | "(" item      (recursive, so a rule of its own)
    // (rule 2 is the loop `[a-h]*`)
    let bnf = Bnf {
        rules: vec![
            vec![
                vec![b(b"("), b(b"h"), Sym::Rule(1), b(b")")],
                vec![b(b"("), Sym::Rule(1), b(b")")],
                vec![b(b"("), Sym::Rule(0), b(b")")],
            ],
            vec![
                vec![b(&set), Sym::Rule(2), b(b",")],
                vec![b(b"("), Sym::Rule(1)],
            ],
            vec![vec![], vec![b(&set), Sym::Rule(2)]],
        ],
        star: Some(2),
    };
    let vocab = alphabet_vocab(&LOOPING);
    let g = compile_with(&Constraint::Gbnf(gbnf(&bnf)), &vocab, every_loop_region());
    let mut rng = SmallRng::seed_from_u64(7);
    let steps = walks_against_the_oracle(&bnf, &g, &mut rng, 40, 12);
    assert!(steps > 200, "only {steps} steps were checked");
    // The states whose cores end at an exit, whatever the walks visited.
    let mut mask = vec![0u32; vocab.mask_words()];
    for prefix in ["(h", "((h", "(((", "(("] {
        let mut m = Matcher::new(g.clone());
        m.accept_bytes(prefix.as_bytes()).unwrap();
        m.fill_mask(&mut mask);
        let mut oracle = Earley::new(&bnf);
        for &b in prefix.as_bytes() {
            assert!(oracle.push(b));
        }
        for id in 0..vocab.len() as u32 - 1 {
            let bytes = vocab.token_bytes(id).unwrap();
            assert_eq!(
                bit(&mask, id),
                oracle.allows(bytes),
                "after {prefix:?}: token {:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The test grammars.

#[test]
fn the_test_grammars_accept_and_refuse_what_they_should() {
    let vocab = byte_vocab();
    let cases: &[(&str, &[&str], &[&str])] = &[
        (
            "json.gbnf",
            &[
                r#"{}"#,
                r#"{"a": [1, 2.5, -3e10, true, null], "b": {"c": "d\n\u00e9"}}"#,
                "{\"deep\": [[[[[[[[[[[[[[[[[[[[{\"x\": []}]]]]]]]]]]]]]]]]]]]]}",
                "{\n  \"k\": \"v\"\n}",
            ],
            &[r#"[]"#, r#"{"a" 1}"#, r#"{"a": 01}"#, r#"{"a": [1,]}"#, r#"{"a": "\x"}"#, "{"],
        ),
        (
            "arithmetic.gbnf",
            &["1", "1 + 2 * 3", "-(4-2)/(1+(2*(3+4)))", "((((((((((1))))))))))"],
            &["", "1 +", "(1", "1 2", "1 ++ 2", "()"],
        ),
        (
            "sql.gbnf",
            &[
                "SELECT * FROM users;",
                "SELECT id, name FROM users WHERE (age >= 18 AND NOT name = 'x') OR id < 3 ORDER BY name DESC LIMIT 10;",
            ],
            &[
                "SELECT FROM users;",
                "SELECT * FROM users WHERE;",
                "SELECT * FROM users LIMIT 0;",
                "SELECT * FROM users WHERE (a = 1;",
            ],
        ),
        (
            "csv.gbnf",
            &["a,b\n1,2", "name,quote\nx,\"he said \"\"hi\"\", then left\"\n", ",\n,"],
            &["a,b", "a\n\"unterminated", "a\n\"x\"y"],
        ),
    ];
    for (file, good, bad) in cases {
        // Each grammar in GBNF, and the same language in Lark syntax.
        let lark = file.replace(".gbnf", ".lark");
        for (name, c) in [
            (*file, Constraint::Gbnf(grammar_file(file))),
            (&lark, Constraint::Lark(grammar_file(&lark))),
        ] {
            let g = compile(&c, &vocab);
            for text in *good {
                assert!(accepts(&g, text), "{name} should accept {text:?}");
            }
            for text in *bad {
                assert!(!accepts(&g, text), "{name} should refuse {text:?}");
            }
        }
    }
}

/// The Lark versions of the test grammars describe the same languages as the GBNF ones: every
/// output of random walks under one is accepted by the other, both ways.
#[test]
fn lark_and_gbnf_test_grammars_describe_the_same_languages() {
    let vocab = byte_vocab();
    for name in ["json", "arithmetic", "sql", "csv"] {
        let gbnf = compile(
            &Constraint::Gbnf(grammar_file(&format!("{name}.gbnf"))),
            &vocab,
        );
        let lark = compile(
            &Constraint::Lark(grammar_file(&format!("{name}.lark"))),
            &vocab,
        );
        for (from, to, label) in [(&gbnf, &lark, "gbnf → lark"), (&lark, &gbnf, "lark → gbnf")]
        {
            let outs = walks(from, &vocab, 25, 3);
            for text in &outs {
                assert!(accepts(to, text), "{name} {label}: {text:?}");
            }
        }
    }
}

/// Lark's conveniences: `%import common`, `%ignore`, `[optional]`, `"a".."z"`, `~ n..m`,
/// case-insensitive literals, regex flags, rule prefixes, priorities, aliases and `|` lines.
#[test]
fn lark_imports_ignores_and_shorthands() {
    let vocab = byte_vocab();
    let text = r#"
// A JSON-like list of pairs, with free whitespace.
?start: "[" [pair ("," pair)*] "]"
!pair: KEY ":" value -> kv
value: SIGNED_NUMBER
     | ESCAPED_STRING
     | "null"i
     | CODE
KEY.2: "a".."z" ~ 1..3
CODE: /x[0-9a-f]{2}/i
%import common.SIGNED_NUMBER
%import common (ESCAPED_STRING, WS)
%ignore WS
"#;
    let g = compile(&Constraint::Lark(text.into()), &vocab);
    for good in [
        "[]",
        "[ab:1]",
        r#" [ ab : -2.5e3 , c:"x\"y" ,abc:NuLL, d: XAF ] "#,
        "[\n  a:\n1\n]",
    ] {
        assert!(accepts(&g, good), "should accept {good:?}");
    }
    for bad in ["[abcd:1]", "[a 1]", "[a:1,]", "[A:1]", "[a:xg0]", "a:1"] {
        assert!(!accepts(&g, bad), "should refuse {bad:?}");
    }
}

#[test]
fn arithmetic_nests_deeper_than_any_unrolled_regex() {
    let g = compile(
        &Constraint::Gbnf(grammar_file("arithmetic.gbnf")),
        &byte_vocab(),
    );
    let deep = format!("{}1{}", "(".repeat(300), ")".repeat(300));
    assert!(accepts(&g, &deep));
    assert!(!accepts(&g, &deep[..deep.len() - 1]));
    // Closing brackets are forced once the number is read and the nesting can only close.
    let mut m = Matcher::new(g.clone());
    m.accept_bytes(b"((((7").unwrap();
    assert_eq!(m.forced_bytes(), b"");
    assert!(!m.is_accepting());
}

// ---------------------------------------------------------------------------------------------
// json_object and recursive schemas.

/// Random walks to EOS; returns the outputs.
fn walks(g: &Arc<Grammar>, vocab: &Vocabulary, n: usize, seed: u64) -> Vec<String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut mask = vec![0u32; vocab.mask_words()];
    let eos = vocab.eos()[0];
    let mut out = Vec::new();
    while out.len() < n {
        let mut m = Matcher::new(g.clone());
        let mut text = Vec::new();
        let mut depth = 0i32;
        for _ in 0..400 {
            m.fill_mask(&mut mask);
            let allowed: Vec<u32> = (0..vocab.len() as u32).filter(|&i| bit(&mask, i)).collect();
            assert!(
                !allowed.is_empty(),
                "dead end after {:?}",
                String::from_utf8_lossy(&text)
            );
            // Open brackets early, close them later, stop when possible near the end.
            let prefer = |t: u32| match vocab.token_bytes(t) {
                Some(b"[" | b"{") => depth < 6,
                Some(b"]" | b"}" | b"\"") => depth >= 3,
                _ => t == eos,
            };
            let preferred: Vec<u32> = allowed.iter().copied().filter(|&t| prefer(t)).collect();
            let t = if !preferred.is_empty() && rng.random_bool(0.6) {
                preferred[rng.random_range(0..preferred.len())]
            } else {
                allowed[rng.random_range(0..allowed.len())]
            };
            m.accept_token(t).unwrap();
            if t == eos {
                out.push(String::from_utf8(text).unwrap());
                break;
            }
            let bytes = vocab.token_bytes(t).unwrap();
            depth += bytes.iter().filter(|&&b| b == b'[' || b == b'{').count() as i32;
            depth -= bytes.iter().filter(|&&b| b == b']' || b == b'}').count() as i32;
            text.extend_from_slice(bytes);
        }
    }
    out
}

fn depth(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        serde_json::Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

#[test]
fn json_object_walks_are_json_objects_at_any_depth() {
    let vocab = byte_vocab();
    for ws in [Whitespace::Compact, Whitespace::Spaced] {
        let g = compile(&Constraint::JsonObject { whitespace: ws }, &vocab);
        let outs = walks(&g, &vocab, 40, 1);
        let mut deepest = 0;
        for text in &outs {
            let v: serde_json::Value =
                serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            deepest = deepest.max(depth(&v));
            // The layout is the schema's: spaces after `:` and `,` exactly when spaced.
            let outside: String = text.split('"').step_by(2).collect::<Vec<_>>().concat();
            match ws {
                Whitespace::Compact => assert!(!outside.contains(' '), "{text}"),
                _ => assert_eq!(
                    outside.matches([',', ':']).count(),
                    outside.matches(", ").count() + outside.matches(": ").count(),
                    "{text}"
                ),
            }
        }
        assert!(deepest >= 4, "walks reached depth {deepest} only");
        assert!(
            outs.iter().all(|t| t.starts_with('{')),
            "an object at the top"
        );
        let nested = format!("{{\"a\":{}1{}}}", "[".repeat(100), "]".repeat(100));
        let nested = if ws == Whitespace::Spaced {
            nested.replace(':', ": ")
        } else {
            nested
        };
        assert!(accepts(&g, &nested), "{nested}");
        assert!(!accepts(&g, "[1]"));
        assert!(!accepts(&g, "{\"a\":[1,]}"));
    }
}

#[test]
fn recursive_schemas_compile_natively_and_their_outputs_validate() {
    let vocab = byte_vocab();
    let schemas = [
        // A tree through $defs.
        serde_json::json!({
            "$defs": {"node": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 8},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3}
                },
                "required": ["name", "children"],
                "additionalProperties": false
            }},
            "$ref": "#/$defs/node"
        }),
        // The root refers to itself, and a second rule refers back to the first.
        serde_json::json!({
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "next": {"anyOf": [{"type": "null"}, {"$ref": "#"}]},
                "alt": {"$ref": "#/$defs/wrap"}
            },
            "required": ["value"],
            "additionalProperties": false,
            "$defs": {"wrap": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}}
        }),
    ];
    for schema in schemas {
        let c = Constraint::JsonSchema {
            schema: schema.clone(),
            options: SchemaOptions::default(),
        };
        let g = compile(&c, &vocab);
        let validator = jsonschema::validator_for(&schema).unwrap();
        let outs = walks(&g, &vocab, 30, 2);
        let mut deepest = 0;
        for text in &outs {
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            assert!(validator.is_valid(&v), "{schema}\n{text} does not validate");
            deepest = deepest.max(depth(&v));
        }
        assert!(deepest >= 4, "{schema}: depth {deepest} only");
    }
}

/// Recursive schemas whose string leaves need intersections (a pattern and lengths that do not
/// narrow, a negated pattern, a format under a length) and Unicode classes: at every step of
/// random walks the mask is exactly the tokens the matcher accepts, and the outputs validate.
#[test]
fn recursive_schemas_with_intersected_strings_mask_what_they_accept() {
    let vocab = byte_vocab();
    let leaves = [
        serde_json::json!({"type": "string", "pattern": "^\\p{L}+$", "maxLength": 5}),
        serde_json::json!({"type": "string", "pattern": "^[a-zé]+-[0-9]+$", "minLength": 3, "maxLength": 6}),
        serde_json::json!({"type": "string", "maxLength": 4, "not": {"pattern": "^ab"}}),
        serde_json::json!({"type": "string", "pattern": "[\\p{Lu}][\\p{Ll}]", "maxLength": 7}),
        serde_json::json!({"type": "string", "format": "date", "minLength": 10}),
        serde_json::json!({"type": "string", "pattern": "\\p{L}\\d", "maxLength": 5}),
    ];
    let mut rng = SmallRng::seed_from_u64(11);
    let mut mask = vec![0u32; vocab.mask_words()];
    for leaf in leaves {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {
                "name": leaf,
                "left": {"anyOf": [{"type": "null"}, {"$ref": "#"}]},
                "right": {"anyOf": [{"type": "null"}, {"$ref": "#"}]},
                "more": {"$ref": "#"},
                "list": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}
            },
            "required": ["name", "left", "right"],
            "additionalProperties": false
        });
        let c = Constraint::JsonSchema {
            schema: schema.clone(),
            options: SchemaOptions::default(),
        };
        let g = Arc::new(
            Grammar::compile(&c, vocab.clone(), Limits::default())
                .unwrap_or_else(|e| panic!("{schema}: {e}")),
        );
        let validator = jsonschema::validator_for(&schema).unwrap();
        let mut finished = 0;
        for _ in 0..6 {
            let mut m = Matcher::new(g.clone());
            let mut text = Vec::new();
            for _ in 0..300 {
                m.fill_mask(&mut mask);
                for id in 0..vocab.len() as u32 {
                    assert_eq!(
                        bit(&mask, id),
                        m.fork().accept_token(id).is_ok(),
                        "{schema}: token {id} {:?} after {:?}",
                        vocab.token_bytes(id).map(String::from_utf8_lossy),
                        String::from_utf8_lossy(&text)
                    );
                }
                let allowed: Vec<u32> =
                    (0..vocab.len() as u32).filter(|&i| bit(&mask, i)).collect();
                assert!(!allowed.is_empty(), "{schema}: dead end after {text:?}");
                // Close early: prefer `null`'s first byte, the end of a string and EOS.
                let closing: Vec<u32> = allowed
                    .iter()
                    .copied()
                    .filter(|&t| {
                        vocab.is_eos(t) || matches!(vocab.token_bytes(t), Some(b"n" | b"\"" | b"}"))
                    })
                    .collect();
                let t = if !closing.is_empty() && rng.random_bool(0.5) {
                    closing[rng.random_range(0..closing.len())]
                } else {
                    allowed[rng.random_range(0..allowed.len())]
                };
                m.accept_token(t).unwrap();
                if vocab.is_eos(t) {
                    let s = String::from_utf8(text.clone()).expect("outputs are UTF-8");
                    let v: serde_json::Value = serde_json::from_str(&s).unwrap();
                    assert!(validator.is_valid(&v), "{schema}\n{s} does not validate");
                    finished += 1;
                    break;
                }
                text.extend_from_slice(vocab.token_bytes(t).unwrap());
            }
        }
        assert!(finished > 0, "{schema}: no walk finished");
    }
}

// ---------------------------------------------------------------------------------------------
// Errors and limits.

#[test]
fn malformed_grammars_name_the_line_and_column() {
    let vocab = byte_vocab();
    let cases: &[(&str, usize, usize, &str)] = &[
        ("root ::= \"a\"\nx ::= [a-z", 2, 7, "not closed"),
        ("root ::= \"a\" |\n  [b-", 2, 3, "not closed"),
        ("root ::= a\n", 1, 10, "never defined"),
        ("root ::= \"a\" )", 1, 14, "without a matching"),
        ("start ::= \"a\"", 1, 1, "root"),
        ("root ::= \"a\"\nroot ::= \"b\"", 2, 1, "defined twice"),
        ("root ::= \"\\q\"", 1, 11, "unknown escape"),
        ("root ::= [z-a]", 1, 10, "reversed"),
        ("root ::= \"a\"{3,1}", 1, 13, "empty"),
        ("root ::= <[42]>", 1, 10, "token references"),
        ("root ::= x\nx = \"a\"", 2, 3, "::="),
    ];
    let lark_cases: &[(&str, usize, usize, &str)] = &[
        ("start: \"a\"\nx: [\"b\"", 2, 4, "not closed"),
        ("start: a", 1, 8, "never defined"),
        ("begin: \"a\"", 1, 1, "start"),
        ("start: \"a\"\nstart: \"b\"", 2, 1, "defined twice"),
        ("start: \"a\"\n%declare X", 2, 1, "not supported"),
        ("start: X\n%import common.NOPE", 2, 1, "not known"),
        ("start: X\n%import mylib.X", 2, 1, "common"),
        ("start: x{\"a\"}", 1, 9, "unexpected"),
        ("start: /a(/", 1, 8, "regex"),
        ("start: /a/m", 1, 11, "flag"),
        ("start: \"b\"..\"a\"", 1, 8, "reversed"),
    ];
    // GBNF, then Lark.
    let all = cases
        .iter()
        .map(|&(t, l, c, n)| (Constraint::Gbnf(t.into()), t, l, c, n))
        .chain(
            lark_cases
                .iter()
                .map(|&(t, l, c, n)| (Constraint::Lark(t.into()), t, l, c, n)),
        );
    for (constraint, text, line, column, needle) in all {
        match Grammar::compile(&constraint, vocab.clone(), Limits::default()) {
            Err(GrammarError::InvalidGrammar {
                line: l,
                column: c,
                message,
            }) => {
                assert_eq!((l, c), (line, column), "{text:?}: {message}");
                assert!(message.contains(needle), "{text:?}: {message}");
            }
            other => panic!("{text:?}: {other:?}"),
        }
    }
    // Left recursion, idiomatic in Lark, is refused by name (as for GBNF).
    let err = Grammar::compile(
        &Constraint::Lark("start: start \"+\" N | N\nN: /[0-9]/".into()),
        vocab.clone(),
        Limits::default(),
    )
    .unwrap_err();
    assert!(matches!(err, GrammarError::InvalidRule { .. }), "{err:?}");
    assert!(err.to_string().contains("start"), "{err}");
}

#[test]
fn left_recursion_and_rules_that_never_finish_are_refused_by_name() {
    let vocab = byte_vocab();
    let err = |text: &str| {
        Grammar::compile(
            &Constraint::Gbnf(text.into()),
            vocab.clone(),
            Limits::default(),
        )
        .unwrap_err()
    };
    match err("root ::= expr\nexpr ::= expr \"+\" num | num\nnum ::= [0-9]+") {
        GrammarError::InvalidRule { rule, message } => {
            assert_eq!(rule, "expr");
            assert!(
                message.contains("left recursion (expr -> expr)"),
                "{message}"
            );
        }
        e => panic!("{e:?}"),
    }
    // Through a rule that can be empty.
    match err("root ::= opt root \"x\" | \"y\"\nopt ::= \"\" | \"o\"") {
        GrammarError::InvalidRule { message, .. } => {
            assert!(message.contains("left recursion"), "{message}")
        }
        e => panic!("{e:?}"),
    }
    match err("root ::= \"(\" root \")\"") {
        GrammarError::InvalidRule { rule, message } => {
            assert_eq!(rule, "root");
            assert!(message.contains("never finish"), "{message}");
        }
        e => panic!("{e:?}"),
    }
    // A rule that never finishes is only an error where it is needed.
    let g = compile(
        &Constraint::Gbnf("root ::= \"a\" | \"b\" loop\nloop ::= \"(\" loop \")\"".into()),
        &vocab,
    );
    assert!(accepts(&g, "a"));
    assert!(!accepts(&g, "b"));
    let mut m = Matcher::new(g);
    assert!(m.accept_bytes(b"b").is_err(), "b leads nowhere");
}

#[test]
fn an_ambiguous_grammar_past_the_parser_limit_is_a_typed_error_not_a_hang() {
    let vocab = byte_vocab();
    // Every split of a run of a's is a parse: the stacks grow with the input.
    let text = "root ::= x+\nx ::= \"a\" | \"a\" x \"b\"? | y\ny ::= \"a\"+ x?";
    let limits = Limits {
        max_parser_stacks: 64,
        ..Limits::default()
    };
    let g =
        Arc::new(Grammar::compile(&Constraint::Gbnf(text.into()), vocab.clone(), limits).unwrap());
    let mut m = Matcher::new(g.clone());
    let refused = (0..200).any(|_| m.accept_bytes(b"a").is_err());
    assert!(refused, "the stacks never reached the limit");
    assert_eq!(
        g.overflow_error(),
        Some(GrammarError::LimitExceeded {
            limit: "max_parser_stacks",
            value: 64
        })
    );
    // With the default limit the same input is fine.
    let g = compile(&Constraint::Gbnf(text.into()), &vocab);
    assert!(accepts(&g, &"a".repeat(200)));
    assert_eq!(g.overflow_error(), None);
}

#[test]
fn a_grammar_without_recursion_takes_the_regular_path() {
    // Same language, as GBNF and as a regex: the same states and masks. Without the widened
    // states of counted repetitions (`max_shared_subtrees` 0), which only the regex's `{4}`
    // has: they are a cache of masks, not states of the language.
    let vocab = byte_vocab();
    let limits = Limits {
        max_shared_subtrees: 0,
        ..Limits::default()
    };
    let g = compile_with(
        &Constraint::Gbnf("root ::= date\ndate ::= d d d d \"-\" d d\nd ::= [0-9]".into()),
        &vocab,
        limits,
    );
    let r = compile_with(
        &Constraint::Regex("[0-9]{4}-[0-9]{2}".into()),
        &vocab,
        limits,
    );
    let (mut a, mut b) = (Matcher::new(g), Matcher::new(r));
    for byte in b"2024-11".iter() {
        assert_eq!(a.mask(), b.mask());
        a.accept_bytes(&[*byte]).unwrap();
        b.accept_bytes(&[*byte]).unwrap();
    }
    assert!(a.is_accepting() && b.is_accepting());
    assert_eq!(a.grammar().state_count(), b.grammar().state_count());
}

// ---------------------------------------------------------------------------------------------
// A real vocabulary: masks against the token path.

/// On a real vocabulary every bit of every mask along random walks equals what accepting that
/// token says (every live state can finish, so "accepted" and "allowed" are the same). Masks
/// come from trie walks, the text slice, loop regions (by default, and wherever they apply)
/// and the context-independent split; acceptance from plain byte steps: two routes to one
/// answer.
#[test]
fn masks_equal_token_acceptance_on_real_vocabularies() {
    for (file, walks) in [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", 2),
        ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 1),
    ] {
        check_acceptance(&model_vocab(file), walks);
    }
}

fn check_acceptance(vocab: &Arc<Vocabulary>, walks: usize) {
    let constraints = [
        Constraint::JsonObject {
            whitespace: Whitespace::Compact,
        },
        Constraint::Gbnf(grammar_file("json.gbnf")),
        Constraint::Gbnf(grammar_file("sql.gbnf")),
        Constraint::Gbnf(grammar_file("csv.gbnf")),
        Constraint::JsonSchema {
            schema: serde_json::json!({
                "type": "object",
                "properties": {
                    "text": {"type": "string"},
                    "replies": {"type": "array", "items": {"$ref": "#"}}
                },
                "required": ["text", "replies"],
                "additionalProperties": false
            }),
            options: SchemaOptions::default(),
        },
    ];
    let mut rng = SmallRng::seed_from_u64(5);
    let mut mask = vec![0u32; vocab.mask_words()];
    let mut contexts = 0;
    let limits = [Limits::default(), every_loop_region()];
    for (c, limits) in constraints.iter().flat_map(|c| limits.map(|l| (c, l))) {
        let g = compile_with(c, vocab, limits);
        for _ in 0..walks {
            let mut m = Matcher::new(g.clone());
            let mut depth = 0i32;
            for _ in 0..14 {
                m.fill_mask(&mut mask);
                for id in 0..vocab.len() as u32 {
                    let accepted = m.fork().accept_token(id).is_ok();
                    assert_eq!(
                        bit(&mask, id),
                        accepted,
                        "{c:?}: token {id} {:?}",
                        vocab.token_bytes(id).map(String::from_utf8_lossy)
                    );
                }
                let allowed: Vec<u32> = (0..vocab.len() as u32)
                    .filter(|&i| bit(&mask, i) && !vocab.is_eos(i))
                    .collect();
                if allowed.is_empty() {
                    break;
                }
                // Go deep: prefer tokens that open brackets, then anything.
                let opening: Vec<u32> = allowed
                    .iter()
                    .copied()
                    .filter(|&t| {
                        vocab
                            .token_bytes(t)
                            .is_some_and(|b| b.iter().any(|c| b"[{('".contains(c)))
                    })
                    .collect();
                let id = if !opening.is_empty() && depth < 4 {
                    opening[rng.random_range(0..opening.len())]
                } else {
                    allowed[rng.random_range(0..allowed.len())]
                };
                let bytes = vocab.token_bytes(id).unwrap();
                depth += bytes.iter().filter(|&&b| b"[{(".contains(&b)).count() as i32;
                contexts += (depth > 1) as usize;
                m.accept_token(id).unwrap();
            }
        }
    }
    assert!(
        contexts > 10,
        "walks stayed shallow: {contexts} steps in a nested context"
    );
}

/// Damaged grammars (characters deleted, duplicated or swapped in the test grammars) and random
/// text compile or fail with a typed error, never a panic; those that compile can be walked.
#[test]
fn damaged_grammars_are_errors_or_grammars_never_panics() {
    let vocab = byte_vocab();
    let mut rng = SmallRng::seed_from_u64(9);
    // GBNF and Lark files, alternately: `sources[i % 8]`, Lark from 4 on.
    let sources: Vec<String> = [
        "json.gbnf",
        "arithmetic.gbnf",
        "sql.gbnf",
        "csv.gbnf",
        "json.lark",
        "arithmetic.lark",
        "sql.lark",
        "csv.lark",
    ]
    .iter()
    .map(|f| grammar_file(f))
    .collect();
    let alphabet: Vec<char> = "root::=|()[]^-\"\\*+?{},.#\n az09x/%~>!_start"
        .chars()
        .collect();
    let (mut ok, mut errors) = (0, 0);
    for i in 0..800 {
        let lark = i % 8 >= 4;
        let mut chars: Vec<char> = if i % 4 == 3 {
            (0..rng.random_range(0..60))
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect()
        } else {
            sources[i % 8].chars().collect()
        };
        for _ in 0..rng.random_range(1..4) {
            if chars.is_empty() {
                break;
            }
            let at = rng.random_range(0..chars.len());
            match rng.random_range(0..3) {
                0 => {
                    chars.remove(at);
                }
                1 => chars.insert(at, chars[at]),
                _ => chars[at] = alphabet[rng.random_range(0..alphabet.len())],
            }
        }
        let text: String = chars.into_iter().collect();
        let c = if lark {
            Constraint::Lark(text.clone())
        } else {
            Constraint::Gbnf(text.clone())
        };
        match Grammar::compile(&c, vocab.clone(), Limits::default()) {
            Ok(g) => {
                ok += 1;
                // A bounded random walk: every state it reaches has a way on or is complete.
                let mut m = Matcher::new(Arc::new(g));
                let mut mask = vec![0u32; vocab.mask_words()];
                for _ in 0..50 {
                    m.fill_mask(&mut mask);
                    let allowed: Vec<u32> = (0..vocab.len() as u32)
                        .filter(|&t| bit(&mask, t) && !vocab.is_eos(t))
                        .collect();
                    if allowed.is_empty() {
                        assert!(
                            m.is_accepting() || m.grammar().is_empty_language(),
                            "{text:?}"
                        );
                        break;
                    }
                    m.accept_token(allowed[rng.random_range(0..allowed.len())])
                        .unwrap();
                }
            }
            Err(
                GrammarError::InvalidGrammar { .. }
                | GrammarError::InvalidRule { .. }
                | GrammarError::LimitExceeded { .. },
            ) => errors += 1,
            Err(e) => panic!("{text:?}: untyped {e:?}"),
        }
    }
    assert!(ok > 40 && errors > 200, "{ok} compiled, {errors} refused");
}
