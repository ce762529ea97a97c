//! Context-free grammars: named rules whose bodies are regex terms ([`crate::deriv`]) that may
//! refer to rules, and the checks and rewriting that turn them into what the pushdown layer
//! ([`crate::dfa`]) runs.
//!
//! Every grammar source ends here: GBNF ([`crate::gbnf`]), `json_object`, and JSON Schemas with
//! recursive `$ref` ([`crate::schema`]). A rule body is built with the same term constructors as a
//! regex, plus [`Terms::rule_ref`].
//!
//! # Why a pushdown automaton over regex terms
//! The three classic choices are Earley (llguidance), GLR, and a pushdown automaton (XGrammar).
//! quarry already has a lazily built byte DFA whose states are regex terms, with masks cached per
//! state. A pushdown automaton whose stack frames are those same terms, with its configurations
//! (graph-structured stacks) interned as DFA states, keeps every part of that machinery: a step is still
//! one atomic load once the row is built, masks and forced bytes are still cached per state and
//! shared by every sequence, and rollback is still a state number. What a step costs beyond the
//! regular case is only paid when a row is first built. The price is that left recursion is
//! refused ([`prepare`]): it would push forever. llama.cpp refuses it in GBNF too, so users' GBNF
//! files are already written without it, and JSON grammars never need it.
//!
//! # What `prepare` does
//! 1. Productivity: a rule none of whose alternatives can finish is an error when the root needs
//!    it; references to it elsewhere become `∅`.
//! 2. Left recursion (a rule reachable from itself without reading a byte, through rules that can
//!    match the empty string) is an error naming the cycle.
//! 3. Inlining: every rule that is not needed to break a cycle is substituted into its callers, so
//!    only the rules that recursion needs stay references (for JSON: `value`). Everything between
//!    two references is then one regex term, read by the lexer-like DFA steps; the stack is only
//!    touched where recursion actually happens. A grammar without recursion becomes one regex and
//!    takes the regular fast path.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::deriv::{Id, Terms, NOTHING};
use crate::error::GrammarError;

/// Rules under construction: rule 0 is the root. Bodies refer to rules by index
/// ([`Terms::rule_ref`]).
pub(crate) struct Rules {
    pub(crate) terms: Terms,
    pub(crate) names: Vec<String>,
    pub(crate) bodies: Vec<Id>,
}

/// What [`crate::dfa::LazyDfa`] runs: the root term, and the bodies of the rules it (still)
/// refers to, renumbered `0..bodies.len()`. No bodies: the grammar is regular.
pub(crate) struct Prepared {
    pub(crate) terms: Terms,
    pub(crate) root: Id,
    pub(crate) bodies: Vec<Id>,
}

fn invalid(rule: &str, message: String) -> GrammarError {
    GrammarError::InvalidRule {
        rule: rule.to_owned(),
        message,
    }
}

/// Checks and inlines `rules` (see the module doc).
pub(crate) fn prepare(rules: Rules) -> Result<Prepared, GrammarError> {
    let Rules {
        mut terms,
        names,
        mut bodies,
    } = rules;
    let n = bodies.len();
    let name = |r: usize| names[r].as_str();
    // 1. Productivity.
    let productive = fixed_point(&terms, &bodies, true);
    if !productive[0] {
        return Err(invalid(
            name(0),
            "can never finish: every alternative needs a rule that never finishes".into(),
        ));
    }
    let mut memo = FxHashMap::default();
    let dead = |r: u32| (!productive[r as usize]).then_some(NOTHING);
    for body in bodies.iter_mut() {
        *body = terms.substitute(*body, &dead, &mut memo);
    }
    // The rules the root can reach, and the reference graph.
    let edges: Vec<Vec<u32>> = bodies
        .iter()
        .map(|&b| {
            let mut out = Vec::new();
            terms.refs(b, &mut FxHashSet::default(), &mut out);
            out.sort_unstable();
            out.dedup();
            out
        })
        .collect();
    // 2. Left recursion.
    let nullable = fixed_point(&terms, &bodies, false);
    let heads: Vec<Vec<u32>> = bodies
        .iter()
        .map(|&b| {
            let mut out = Vec::new();
            terms.head_refs(b, &nullable, &mut out);
            out.sort_unstable();
            out.dedup();
            out
        })
        .collect();
    if let Some(cycle) = find_cycle(&heads) {
        let path: Vec<&str> = cycle.iter().map(|&r| name(r as usize)).collect();
        return Err(invalid(
            name(cycle[0] as usize),
            format!(
                "left recursion ({}): a rule may not reach itself before reading a byte; \
                 rewrite `a ::= a x | y` as `a ::= y x*`",
                path.join(" -> ")
            ),
        ));
    }
    // 3. Breakers: the targets of back edges of a depth-first search from the root.
    let mut breaker = vec![false; n];
    let mut order = Vec::new(); // postorder
    let mut mark = vec![0u8; n]; // 0 new, 1 on the path, 2 done
    let mut stack: Vec<(u32, usize)> = vec![(0, 0)];
    mark[0] = 1;
    while let Some(&mut (r, ref mut i)) = stack.last_mut() {
        if let Some(&x) = edges[r as usize].get(*i) {
            *i += 1;
            match mark[x as usize] {
                0 => {
                    mark[x as usize] = 1;
                    stack.push((x, 0));
                }
                1 => breaker[x as usize] = true,
                _ => {}
            }
        } else {
            mark[r as usize] = 2;
            order.push(r);
            stack.pop();
        }
    }
    // Expand non-breakers bottom-up (postorder puts a rule after everything it reaches first,
    // except along back edges, whose targets are breakers and stay references).
    let mut expanded: Vec<Option<Id>> = vec![None; n];
    let mut memo = FxHashMap::default();
    for &r in &order {
        let known = expanded.clone();
        let f = |x: u32| {
            if breaker[x as usize] {
                None
            } else {
                known[x as usize]
            }
        };
        expanded[r as usize] = Some(terms.substitute(bodies[r as usize], &f, &mut memo));
    }
    let kept: Vec<u32> = order
        .iter()
        .copied()
        .filter(|&r| breaker[r as usize])
        .collect();
    if kept.is_empty() {
        return Ok(Prepared {
            root: expanded[0].expect("the root is reached"),
            terms,
            bodies: Vec::new(),
        });
    }
    // Renumber the kept rules 0..k.
    let new_ref: FxHashMap<u32, Id> = kept
        .iter()
        .enumerate()
        .map(|(i, &r)| (r, terms.rule_ref(i as u32)))
        .collect();
    let mut memo = FxHashMap::default();
    let f = |x: u32| new_ref.get(&x).copied();
    let root = terms.substitute(expanded[0].expect("the root is reached"), &f, &mut memo);
    let bodies = kept
        .iter()
        .map(|&r| {
            let b = expanded[r as usize].expect("a kept rule is reached");
            terms.substitute(b, &f, &mut memo)
        })
        .collect();
    Ok(Prepared {
        terms,
        root,
        bodies,
    })
}

/// Which rules are productive (`bytes`: a byte set counts as a way to finish) or nullable (it
/// does not), as the least fixed point of [`Terms::eval`] over the rule bodies.
fn fixed_point(terms: &Terms, bodies: &[Id], bytes: bool) -> Vec<bool> {
    let mut holds = vec![false; bodies.len()];
    loop {
        let mut changed = false;
        for r in 0..bodies.len() {
            if !holds[r] {
                let mut memo = FxHashMap::default();
                if terms.eval(bodies[r], bytes, &|x| holds[x as usize], &mut memo) {
                    holds[r] = true;
                    changed = true;
                }
            }
        }
        if !changed {
            return holds;
        }
    }
}

/// A cycle in `graph` (as the rules along it, first repeated at the end), if there is one.
fn find_cycle(graph: &[Vec<u32>]) -> Option<Vec<u32>> {
    let n = graph.len();
    let mut mark = vec![0u8; n];
    for start in 0..n {
        if mark[start] != 0 {
            continue;
        }
        let mut stack: Vec<(u32, usize)> = vec![(start as u32, 0)];
        mark[start] = 1;
        while let Some(&mut (r, ref mut i)) = stack.last_mut() {
            if let Some(&x) = graph[r as usize].get(*i) {
                *i += 1;
                match mark[x as usize] {
                    0 => {
                        mark[x as usize] = 1;
                        stack.push((x, 0));
                    }
                    1 => {
                        let from = stack.iter().position(|&(y, _)| y == x).unwrap();
                        let mut cycle: Vec<u32> = stack[from..].iter().map(|&(y, _)| y).collect();
                        cycle.push(x);
                        return Some(cycle);
                    }
                    _ => {}
                }
            } else {
                mark[r as usize] = 2;
                stack.pop();
            }
        }
    }
    None
}
