//! Regular expressions as hash-consed terms over bytes, and their Brzozowski derivatives.
//!
//! This is what a [`crate::Grammar`] runs on. A constraint's regex is parsed once into a term
//! ([`crate::parse`]); each DFA state *is* a term, and the state reached by byte `b` is the
//! derivative of that term by `b`, computed the first time it is needed ([`crate::dfa`]). Nothing is
//! determinized up front, and counted repetitions stay symbolic: `x{0,64}` is one node whose
//! derivative is `x'·x{0,63}`, where a Thompson NFA would hold 64 copies of `x`.
//!
//! Terms are normalized as they are built (`∅` absorbs concatenation, `ε` is its unit,
//! concatenation is right-nested, alternatives are flattened, sorted, deduplicated and their byte
//! sets merged), so equal languages reached by the usual routes are one node, and a term has
//! finitely many derivatives (Brzozowski's similarity). Every term other than [`NOTHING`] has a
//! non-empty language (the constructors remove `∅` wherever it appears), so every state other than
//! the dead one can still reach a match: liveness costs nothing.

use rustc_hash::FxHashMap;

/// A term: an index into [`Terms`].
pub(crate) type Id = u32;
/// The empty language.
pub(crate) const NOTHING: Id = 0;
/// The language of the empty string.
pub(crate) const EMPTY: Id = 1;
/// No upper bound on a repetition.
pub(crate) const INF: u32 = u32::MAX;

/// A set of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct ByteSet([u64; 4]);

impl ByteSet {
    pub(crate) fn range(lo: u8, hi: u8) -> Self {
        let mut s = Self::default();
        s.insert_range(lo, hi);
        s
    }

    pub(crate) fn insert_range(&mut self, lo: u8, hi: u8) {
        for b in lo..=hi {
            self.0[b as usize / 64] |= 1 << (b % 64);
        }
    }

    #[inline]
    pub(crate) fn contains(&self, b: u8) -> bool {
        self.0[b as usize / 64] >> (b % 64) & 1 == 1
    }

    fn union(&self, other: &Self) -> Self {
        Self(std::array::from_fn(|i| self.0[i] | other.0[i]))
    }

    fn is_empty(&self) -> bool {
        self.0 == [0; 4]
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Node {
    Nothing,
    Empty,
    Bytes(ByteSet),
    /// Right-nested: the head is never a `Concat`.
    Concat(Id, Id),
    /// At least two alternatives, sorted, none an `Or`, at most one `Bytes`.
    Or(Box<[Id]>),
    /// `x{min,max}`, `max` = [`INF`] for no bound.
    Repeat(Id, u32, u32),
    /// The strings in every one of at least two terms, sorted, none an `And`.
    And(Box<[Id]>),
    /// The byte strings not in the term (complement over all byte strings).
    Not(Id),
    /// A reference to rule `r` of a context-free grammar ([`crate::cfg`]): an opaque symbol here,
    /// never nullable, with no byte derivative. The pushdown layer ([`crate::dfa`]) enters the
    /// rule's body where a term can start with it ([`Terms::ref_row`]).
    Ref(u32),
}

/// The store of terms: construction, nullability and derivatives, all memoized.
pub(crate) struct Terms {
    nodes: Vec<Node>,
    nullable: Vec<bool>,
    /// Whether the term holds an `And` or a `Not`, so its language may be empty although it is
    /// not [`NOTHING`] ([`Terms::is_void`] decides).
    boolean: Vec<bool>,
    intern: FxHashMap<Node, Id>,
    /// [`Terms::is_void`] of the terms asked about.
    void: FxHashMap<Id, bool>,
    /// `term → its derivative by each byte class` ([`Terms::deriv_row`]).
    rows: FxHashMap<Id, Box<[Id]>>,
    /// `term → its derivative by each rule it can start with` ([`Terms::ref_row`]).
    ref_rows: FxHashMap<Id, Box<[(u32, Id)]>>,
    spine: Vec<Id>,
    /// [`Terms::universe`] once built ([`NOTHING`] before): every `and` and `not` of a
    /// derivative row asks for it, and building it each time (a 256-byte set and two lookups)
    /// was the largest cost of stepping an intersection's lazy states.
    universe: Id,
    /// [`Terms::min_len`] of the terms asked about.
    min_lens: FxHashMap<Id, u32>,
    /// [`Terms::horizon`] of the terms asked about.
    horizons: FxHashMap<Id, u32>,
    /// [`Terms::widen`] of the (term, length) pairs asked about.
    widened: FxHashMap<(Id, u32), Id>,
    /// The shortest yield of each rule of a grammar with recursion ([`Terms::settle_rules`]).
    rule_mins: Vec<u32>,
}

impl std::fmt::Debug for Terms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Terms({} nodes)", self.nodes.len())
    }
}

impl Terms {
    pub(crate) fn new() -> Self {
        let mut t = Self {
            nodes: Vec::new(),
            nullable: Vec::new(),
            boolean: Vec::new(),
            intern: FxHashMap::default(),
            void: FxHashMap::default(),
            rows: FxHashMap::default(),
            ref_rows: FxHashMap::default(),
            spine: Vec::new(),
            universe: NOTHING,
            min_lens: FxHashMap::default(),
            horizons: FxHashMap::default(),
            widened: FxHashMap::default(),
            rule_mins: Vec::new(),
        };
        t.intern(Node::Nothing);
        t.intern(Node::Empty);
        t
    }

    /// Number of terms built so far (the memory bound, `Limits::max_terms`).
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    pub(crate) fn nullable(&self, e: Id) -> bool {
        self.nullable[e as usize]
    }

    fn intern(&mut self, node: Node) -> Id {
        if let Some(&id) = self.intern.get(&node) {
            return id;
        }
        let id = self.nodes.len() as Id;
        let nullable = match &node {
            Node::Nothing | Node::Bytes(_) | Node::Ref(_) => false,
            Node::Empty => true,
            Node::Concat(a, b) => self.nullable(*a) && self.nullable(*b),
            Node::Or(xs) => xs.iter().any(|&x| self.nullable(x)),
            Node::Repeat(x, min, _) => *min == 0 || self.nullable(*x),
            Node::And(xs) => xs.iter().all(|&x| self.nullable(x)),
            Node::Not(x) => !self.nullable(*x),
        };
        let boolean = match &node {
            Node::And(_) | Node::Not(_) => true,
            Node::Concat(a, b) => self.boolean[*a as usize] || self.boolean[*b as usize],
            Node::Or(xs) => xs.iter().any(|&x| self.boolean[x as usize]),
            Node::Repeat(x, _, _) => self.boolean[*x as usize],
            _ => false,
        };
        self.nodes.push(node.clone());
        self.nullable.push(nullable);
        self.boolean.push(boolean);
        self.intern.insert(node, id);
        id
    }

    pub(crate) fn bytes(&mut self, set: ByteSet) -> Id {
        if set.is_empty() {
            return NOTHING;
        }
        self.intern(Node::Bytes(set))
    }

    pub(crate) fn byte(&mut self, b: u8) -> Id {
        self.bytes(ByteSet::range(b, b))
    }

    /// `a·b`.
    pub(crate) fn concat(&mut self, a: Id, b: Id) -> Id {
        if a == NOTHING || b == NOTHING {
            return NOTHING;
        }
        if a == EMPTY {
            return b;
        }
        if b == EMPTY {
            return a;
        }
        if !matches!(self.nodes[a as usize], Node::Concat(..)) {
            return self.intern(Node::Concat(a, b));
        }
        // Re-nest (x·y)·b as x·(y·b), iteratively: literals make long spines.
        let mut spine = std::mem::take(&mut self.spine);
        spine.clear();
        let mut x = a;
        while let Node::Concat(h, t) = self.nodes[x as usize] {
            spine.push(h);
            x = t;
        }
        let mut acc = self.intern(Node::Concat(x, b));
        for &h in spine.iter().rev() {
            acc = self.intern(Node::Concat(h, acc));
        }
        self.spine = spine;
        acc
    }

    /// `a₀|a₁|…`.
    pub(crate) fn or(&mut self, items: &[Id]) -> Id {
        let mut v: Vec<Id> = Vec::with_capacity(items.len() + 1);
        let mut set = ByteSet::default();
        let mut push = |x: Id, nodes: &[Node], v: &mut Vec<Id>| match &nodes[x as usize] {
            Node::Nothing => {}
            Node::Bytes(s) => set = set.union(s),
            _ => v.push(x),
        };
        for &x in items {
            if let Node::Or(xs) = &self.nodes[x as usize] {
                for &y in xs.iter() {
                    push(y, &self.nodes, &mut v);
                }
            } else {
                push(x, &self.nodes, &mut v);
            }
        }
        if !set.is_empty() {
            v.push(self.bytes(set));
        }
        v.sort_unstable();
        v.dedup();
        // ε is redundant next to another nullable alternative.
        if v.len() > 1 && v[0] == EMPTY && v[1..].iter().any(|&x| self.nullable(x)) {
            v.remove(0);
        }
        match v.len() {
            0 => NOTHING,
            1 => v[0],
            _ => self.intern(Node::Or(v.into_boxed_slice())),
        }
    }

    /// `x{min,max}` (`max` = [`INF`] for no bound).
    pub(crate) fn repeat(&mut self, x: Id, min: u32, max: u32) -> Id {
        if max == 0 || x == EMPTY || min > max {
            return if min > max { NOTHING } else { EMPTY };
        }
        if x == NOTHING {
            return if min == 0 { EMPTY } else { NOTHING };
        }
        if min == 1 && max == 1 {
            return x;
        }
        self.intern(Node::Repeat(x, min, max))
    }

    /// Every byte string.
    pub(crate) fn universe(&mut self) -> Id {
        if self.universe == NOTHING {
            let all = self.bytes(ByteSet::range(0, 255));
            self.universe = self.repeat(all, 0, INF);
        }
        self.universe
    }

    /// `a₀ ∧ a₁ ∧ …`: the strings in all of them.
    pub(crate) fn and(&mut self, items: &[Id]) -> Id {
        if items.contains(&NOTHING) {
            return NOTHING;
        }
        let universe = self.universe();
        let mut v: Vec<Id> = Vec::with_capacity(items.len());
        for &x in items {
            match &self.nodes[x as usize] {
                Node::Nothing => return NOTHING,
                Node::And(xs) => v.extend(xs.iter().copied()),
                _ if x == universe => {}
                _ => v.push(x),
            }
        }
        v.sort_unstable();
        v.dedup();
        match v.len() {
            0 => universe,
            1 => v[0],
            _ => self.intern(Node::And(v.into_boxed_slice())),
        }
    }

    /// `¬a`: the byte strings not in `a`.
    pub(crate) fn not(&mut self, a: Id) -> Id {
        let universe = self.universe();
        if a == NOTHING {
            return universe;
        }
        if a == universe {
            return NOTHING;
        }
        if let Node::Not(x) = self.nodes[a as usize] {
            return x;
        }
        self.intern(Node::Not(a))
    }

    /// Whether [`Terms::is_void`] found `e` empty.
    pub(crate) fn known_void(&self, e: Id) -> bool {
        self.void.get(&e) == Some(&true)
    }

    /// Whether `e` holds an `And` or a `Not` (its language may be empty without being `∅`).
    pub(crate) fn may_be_void(&self, e: Id) -> bool {
        self.boolean[e as usize]
    }

    /// Whether `e`'s language is empty. Only terms with `And` or `Not` can be empty without being
    /// [`NOTHING`]; for those, a depth-first search over derivatives (by the byte classes `reps`)
    /// looks for a nullable term, visiting at most `budget` terms. Past the budget the answer is
    /// "empty" (sound: the DFA refuses the step) and the second value is true.
    pub(crate) fn is_void(&mut self, e: Id, reps: &[u8], budget: usize) -> (bool, bool) {
        if e == NOTHING {
            return (true, false);
        }
        if !self.boolean[e as usize] {
            return (false, false);
        }
        if let Some(&v) = self.void.get(&e) {
            return (v, false);
        }
        // Structurally down to the `And`/`Not` nodes, which are searched on their own: the
        // search stays inside the intersection, not the whole document around it.
        let (void, over) = match self.nodes[e as usize].clone() {
            Node::Concat(..) => {
                let mut x = e;
                let mut parts = Vec::new();
                while let Node::Concat(h, t) = self.nodes[x as usize] {
                    parts.push(h);
                    x = t;
                }
                parts.push(x);
                let mut out = (false, false);
                for p in parts {
                    let r = self.is_void(p, reps, budget);
                    if r.0 {
                        out = r;
                        break;
                    }
                }
                out
            }
            Node::Or(xs) => {
                let mut out = (true, false);
                for &x in xs.iter() {
                    let r = self.is_void(x, reps, budget);
                    out.1 |= r.1;
                    if !r.0 {
                        out = (false, false);
                        break;
                    }
                }
                out
            }
            Node::Repeat(x, min, _) if min > 0 => self.is_void(x, reps, budget),
            Node::And(_) | Node::Not(_) => self.search_void(e, reps, budget),
            _ => (false, false),
        };
        if !over {
            self.void.insert(e, void);
        }
        (void, over)
    }

    /// [`Terms::is_void`] of an `And` or `Not`: a depth-first search over its derivatives for a
    /// nullable term.
    fn search_void(&mut self, e: Id, reps: &[u8], budget: usize) -> (bool, bool) {
        let mut seen: rustc_hash::FxHashSet<Id> = rustc_hash::FxHashSet::default();
        let mut stack = vec![e];
        seen.insert(e);
        while let Some(x) = stack.pop() {
            if self.nullable(x) || self.void.get(&x) == Some(&false) {
                return (false, false);
            }
            if seen.len() > budget {
                return (true, true);
            }
            let row = self.deriv_row(x, reps);
            for &d in row.iter() {
                if d != NOTHING && self.void.get(&d) != Some(&true) && seen.insert(d) {
                    stack.push(d);
                }
            }
        }
        (true, false)
    }

    /// A lower bound on the length of `e`'s shortest byte string ([`INF`] for the empty
    /// language): exact for terms without `And` or `Not` (an intersection counts its longest
    /// part's shortest string, a complement 0), a rule reference its rule's shortest yield
    /// ([`Terms::settle_rules`]). Memoized. The budget's search for a shortest completion
    /// ([`crate::budget`]) is A* with this as its estimate: exact where it is exact, so the
    /// search walks straight down a shortest path there.
    pub(crate) fn min_len(&mut self, e: Id) -> u32 {
        let mut memo = std::mem::take(&mut self.min_lens);
        let v = self.min_len_by(e, &self.rule_mins, &mut memo);
        self.min_lens = memo;
        v
    }

    fn min_len_by(&self, e: Id, rules: &[u32], memo: &mut FxHashMap<Id, u32>) -> u32 {
        if let Some(&v) = memo.get(&e) {
            return v;
        }
        let v = match &self.nodes[e as usize] {
            Node::Nothing => INF,
            Node::Empty | Node::Not(_) => 0,
            Node::Bytes(_) => 1,
            Node::Concat(..) => {
                // Right-nested: walk the chain instead of recursing down it.
                let (mut total, mut x) = (0u32, e);
                while let Node::Concat(h, t) = self.nodes[x as usize] {
                    total = total.saturating_add(self.min_len_by(h, rules, memo));
                    x = t;
                }
                total.saturating_add(self.min_len_by(x, rules, memo))
            }
            Node::Or(xs) => xs
                .iter()
                .map(|&x| self.min_len_by(x, rules, memo))
                .min()
                .unwrap_or(INF),
            Node::Repeat(x, min, _) => match *min {
                0 => 0,
                n => self.min_len_by(*x, rules, memo).saturating_mul(n),
            },
            Node::And(xs) => xs
                .iter()
                .map(|&x| self.min_len_by(x, rules, memo))
                .max()
                .unwrap_or(0),
            Node::Ref(r) => rules.get(*r as usize).copied().unwrap_or(INF),
        };
        memo.insert(e, v);
        v
    }

    /// The length below which [`Terms::widen`] changes `e`: 0 where it never does (no counted
    /// repetition outside an `And` or a `Not`). Memoized.
    pub(crate) fn horizon(&mut self, e: Id) -> u32 {
        if let Some(&v) = self.horizons.get(&e) {
            return v;
        }
        let v = match self.nodes[e as usize].clone() {
            Node::Nothing | Node::Empty | Node::Bytes(_) | Node::And(_) | Node::Not(_) => 0,
            Node::Ref(_) => 0,
            Node::Concat(..) => {
                let (mut v, mut x) = (0, e);
                while let Node::Concat(h, t) = self.nodes[x as usize] {
                    v = v.max(self.horizon(h));
                    x = t;
                }
                v.max(self.horizon(x))
            }
            Node::Or(xs) => xs.iter().map(|&x| self.horizon(x)).max().unwrap_or(0),
            Node::Repeat(x, min, max) => {
                let max = if max == INF { 0 } else { max };
                let min = if self.nullable(x) {
                    0
                } else {
                    min.saturating_sub(1)
                };
                self.horizon(x).max(max).max(min)
            }
        };
        self.horizons.insert(e, v);
        v
    }

    /// `e` with its counted repetitions widened where their bounds cannot show within `h`
    /// bytes: an upper bound above `h` removed, a lower bound above `h + 1` lowered to `h + 1`
    /// (for a repeated term that reads at least a byte each time). A string of at most `h`
    /// bytes can be continued into a string of the language of `e` exactly when it can be
    /// continued into one of the widened term's: it completes at most `h` repetitions of any
    /// one repetition, and either bound only decides counts past that (a repetition of at most
    /// 120 string characters with 40 read allows what one without a bound allows, over the next
    /// 16 bytes). So a trie subtree of height `h` has the same allowed tokens from both, and the
    /// states of a long counted repetition (a JSON string's `maxLength`) share one walk of it
    /// ([`crate::Grammar`]'s subtree walks). `And` and `Not` are left as they are: what their
    /// parts allow together depends on their lengths past `h`. Memoized.
    pub(crate) fn widen(&mut self, e: Id, h: u32) -> Id {
        if self.horizon(e) <= h {
            return e;
        }
        if let Some(&x) = self.widened.get(&(e, h)) {
            return x;
        }
        let out = match self.nodes[e as usize].clone() {
            Node::Concat(..) => self.map_concat(e, &mut |terms, x| terms.widen(x, h)),
            Node::Or(xs) => {
                let items: Vec<Id> = xs.iter().map(|&x| self.widen(x, h)).collect();
                self.or(&items)
            }
            Node::Repeat(x, min, max) => {
                let min = if !self.nullable(x) && min > h.saturating_add(1) {
                    h + 1
                } else {
                    min
                };
                let max = if max > h { INF } else { max };
                let x = self.widen(x, h);
                self.repeat(x, min, max)
            }
            _ => e,
        };
        self.widened.insert((e, h), out);
        out
    }

    /// Computes each rule's shortest yield (`bodies[r]` is rule `r`'s body) as the least fixpoint
    /// of [`Terms::min_len`] over the rules, for the pushdown layer's states.
    pub(crate) fn settle_rules(&mut self, bodies: &[Id]) {
        let mut rules = vec![INF; bodies.len()];
        loop {
            let mut memo = FxHashMap::default();
            let mut changed = false;
            for (r, &body) in bodies.iter().enumerate() {
                let v = self.min_len_by(body, &rules, &mut memo);
                if v < rules[r] {
                    rules[r] = v;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        self.rule_mins = rules;
        self.min_lens.clear();
    }

    /// A reference to rule `r` ([`Node::Ref`]).
    pub(crate) fn rule_ref(&mut self, r: u32) -> Id {
        self.intern(Node::Ref(r))
    }

    /// The derivative of `e` by each rule symbol it can start with, sorted by rule, none `∅`:
    /// `d_r(r) = ε`, and otherwise the byte rules (`(h·t)' = h'·t | t'` when `h` is nullable, …).
    /// Memoized; this is what the pushdown layer calls a rule with.
    pub(crate) fn ref_row(&mut self, e: Id) -> Box<[(u32, Id)]> {
        if let Some(row) = self.ref_rows.get(&e) {
            return row.clone();
        }
        let mut out: Vec<(u32, Id)> = Vec::new();
        match self.nodes[e as usize].clone() {
            Node::Nothing | Node::Empty | Node::Bytes(_) | Node::And(_) | Node::Not(_) => {}
            Node::Ref(r) => out.push((r, EMPTY)),
            Node::Concat(..) => {
                let mut x = e;
                loop {
                    let Node::Concat(h, t) = self.nodes[x as usize] else {
                        out.extend(self.ref_row(x).iter().copied());
                        break;
                    };
                    for &(r, d) in self.ref_row(h).iter() {
                        let d = self.concat(d, t);
                        out.push((r, d));
                    }
                    if !self.nullable(h) {
                        break;
                    }
                    x = t;
                }
            }
            Node::Or(xs) => {
                for &x in xs.iter() {
                    out.extend(self.ref_row(x).iter().copied());
                }
            }
            Node::Repeat(x, min, max) => {
                let rest = self.repeat(
                    x,
                    min.saturating_sub(1),
                    if max == INF { INF } else { max - 1 },
                );
                for &(r, d) in self.ref_row(x).iter() {
                    let d = self.concat(d, rest);
                    out.push((r, d));
                }
            }
        }
        // One entry per rule: the union of its derivatives.
        out.sort_unstable();
        let mut row: Vec<(u32, Id)> = Vec::with_capacity(out.len());
        for (r, d) in out {
            match row.last_mut() {
                Some(last) if last.0 == r => last.1 = self.or(&[last.1, d]),
                _ if d != NOTHING => row.push((r, d)),
                _ => {}
            }
        }
        let row: Box<[(u32, Id)]> = row.into();
        self.ref_rows.insert(e, row.clone());
        row
    }

    /// Whether `e` can start with a rule reference ([`Terms::ref_row`] is not empty), without
    /// copying the row.
    pub(crate) fn calls(&mut self, e: Id) -> bool {
        if let Some(row) = self.ref_rows.get(&e) {
            return !row.is_empty();
        }
        !self.ref_row(e).is_empty()
    }

    /// The concatenation `e` with `f` applied to each of its parts, rebuilt: along the spine,
    /// iteratively (literals make long ones), the last part first.
    fn map_concat(&mut self, e: Id, f: &mut dyn FnMut(&mut Self, Id) -> Id) -> Id {
        let mut heads = Vec::new();
        let mut x = e;
        while let Node::Concat(h, t) = self.nodes[x as usize] {
            heads.push(h);
            x = t;
        }
        let mut acc = f(self, x);
        for &h in heads.iter().rev() {
            let h = f(self, h);
            acc = self.concat(h, acc);
        }
        acc
    }

    /// `e` with every reference to a rule `r` for which `f(r)` is `Some(x)` replaced by `x`
    /// (memoized in `memo` across calls with the same `f`).
    pub(crate) fn substitute(
        &mut self,
        e: Id,
        f: &dyn Fn(u32) -> Option<Id>,
        memo: &mut FxHashMap<Id, Id>,
    ) -> Id {
        if let Some(&x) = memo.get(&e) {
            return x;
        }
        let out = match self.nodes[e as usize].clone() {
            Node::Nothing | Node::Empty | Node::Bytes(_) | Node::And(_) | Node::Not(_) => e,
            Node::Ref(r) => f(r).unwrap_or(e),
            Node::Concat(..) => self.map_concat(e, &mut |terms, x| terms.substitute(x, f, memo)),
            Node::Or(xs) => {
                let items: Vec<Id> = xs.iter().map(|&x| self.substitute(x, f, memo)).collect();
                self.or(&items)
            }
            Node::Repeat(x, min, max) => {
                let x = self.substitute(x, f, memo);
                self.repeat(x, min, max)
            }
        };
        memo.insert(e, out);
        out
    }

    /// Folds `e` bottom-up as a boolean formula over its rule references: `leaf(r)` for a
    /// reference, and `bytes` for a byte set: false gives nullability, true productivity (the
    /// language is not empty). Used by the grammar checks in [`crate::cfg`].
    pub(crate) fn eval(
        &self,
        e: Id,
        bytes: bool,
        leaf: &dyn Fn(u32) -> bool,
        memo: &mut FxHashMap<Id, bool>,
    ) -> bool {
        if let Some(&x) = memo.get(&e) {
            return x;
        }
        let out = match &self.nodes[e as usize] {
            Node::Nothing => false,
            Node::Empty => true,
            Node::Bytes(_) => bytes,
            Node::Ref(r) => leaf(*r),
            Node::Concat(..) => {
                let mut x = e;
                loop {
                    let Node::Concat(h, t) = self.nodes[x as usize] else {
                        break self.eval(x, bytes, leaf, memo);
                    };
                    if !self.eval(h, bytes, leaf, memo) {
                        break false;
                    }
                    x = t;
                }
            }
            Node::Or(xs) => xs.iter().any(|&x| self.eval(x, bytes, leaf, memo)),
            Node::Repeat(x, min, _) => *min == 0 || self.eval(*x, bytes, leaf, memo),
            // No rule is referred to inside these (the schema module refuses it).
            Node::And(_) | Node::Not(_) => {
                if bytes {
                    true
                } else {
                    self.nullable(e)
                }
            }
        };
        memo.insert(e, out);
        out
    }

    /// The rules `e` can start with, given which rules can match the empty string.
    pub(crate) fn head_refs(&self, e: Id, nullable_rule: &[bool], out: &mut Vec<u32>) {
        match &self.nodes[e as usize] {
            Node::Nothing | Node::Empty | Node::Bytes(_) | Node::And(_) | Node::Not(_) => {}
            Node::Ref(r) => out.push(*r),
            Node::Concat(h, t) => {
                self.head_refs(*h, nullable_rule, out);
                let mut memo = FxHashMap::default();
                if self.eval(*h, false, &|r| nullable_rule[r as usize], &mut memo) {
                    self.head_refs(*t, nullable_rule, out);
                }
            }
            Node::Or(xs) => xs
                .iter()
                .for_each(|&x| self.head_refs(x, nullable_rule, out)),
            Node::Repeat(x, _, _) => self.head_refs(*x, nullable_rule, out),
        }
    }

    /// Every rule `e` refers to.
    pub(crate) fn refs(&self, e: Id, seen: &mut rustc_hash::FxHashSet<Id>, out: &mut Vec<u32>) {
        if !seen.insert(e) {
            return;
        }
        match &self.nodes[e as usize] {
            Node::Nothing | Node::Empty | Node::Bytes(_) | Node::And(_) | Node::Not(_) => {}
            Node::Ref(r) => out.push(*r),
            Node::Concat(..) => {
                let mut x = e;
                while let Node::Concat(h, t) = self.nodes[x as usize] {
                    self.refs(h, seen, out);
                    x = t;
                }
                self.refs(x, seen, out);
            }
            Node::Or(xs) => xs.iter().for_each(|&x| self.refs(x, seen, out)),
            Node::Repeat(x, _, _) => self.refs(*x, seen, out),
        }
    }

    /// `row[c] |= part[c]` for every class.
    fn merge(&mut self, row: &mut [Id], part: impl Iterator<Item = Id>) {
        for (r, d) in row.iter_mut().zip(part) {
            if d != NOTHING {
                *r = if *r == NOTHING { d } else { self.or(&[*r, d]) };
            }
        }
    }

    /// The derivative of `e` by every byte class at once (`reps[c]` is a byte of class `c`): one
    /// memo entry per term instead of one per (term, class), and plain array work for the classes
    /// a term cannot start with, which are most of them. This is what fills a DFA row.
    pub(crate) fn deriv_row(&mut self, e: Id, reps: &[u8]) -> Box<[Id]> {
        if let Some(row) = self.rows.get(&e) {
            return row.clone();
        }
        let n = reps.len();
        let row: Box<[Id]> = match self.nodes[e as usize] {
            Node::Nothing | Node::Empty | Node::Ref(_) => vec![NOTHING; n].into(),
            Node::Bytes(s) => reps
                .iter()
                .map(|&b| if s.contains(b) { EMPTY } else { NOTHING })
                .collect(),
            Node::Concat(..) => {
                // (h·t)' = h'·t | t' when h is nullable, iteratively along the spine.
                let mut row = vec![NOTHING; n];
                let mut x = e;
                loop {
                    let Node::Concat(h, t) = self.nodes[x as usize] else {
                        let dx = self.deriv_row(x, reps);
                        self.merge(&mut row, dx.iter().copied());
                        break;
                    };
                    let dh = self.deriv_row(h, reps);
                    let part: Vec<Id> = dh.iter().map(|&d| self.concat(d, t)).collect();
                    self.merge(&mut row, part.into_iter());
                    if !self.nullable(h) {
                        break;
                    }
                    x = t;
                }
                row.into()
            }
            Node::Or(ref xs) => {
                let xs = xs.clone();
                self.join_rows(&xs, reps, |t, items| {
                    items.retain(|&d| d != NOTHING);
                    match items.len() {
                        0 => NOTHING,
                        1 => items[0],
                        _ => t.or(items),
                    }
                })
            }
            Node::Repeat(x, min, max) => {
                let dx = self.deriv_row(x, reps);
                let rest = self.repeat(
                    x,
                    min.saturating_sub(1),
                    if max == INF { INF } else { max - 1 },
                );
                dx.iter().map(|&d| self.concat(d, rest)).collect()
            }
            Node::And(ref xs) => {
                let xs = xs.clone();
                self.join_rows(&xs, reps, |t, items| t.and(items))
            }
            Node::Not(x) => {
                let dx = self.deriv_row(x, reps);
                dx.iter().map(|&d| self.not(d)).collect()
            }
        };
        self.rows.insert(e, row.clone());
        row
    }

    /// The derivative rows of `xs`, joined class by class: `join` gets the items' derivatives by
    /// one class (`Or` and `And` rows).
    fn join_rows(
        &mut self,
        xs: &[Id],
        reps: &[u8],
        join: impl Fn(&mut Self, &mut Vec<Id>) -> Id,
    ) -> Box<[Id]> {
        let rows: Vec<Box<[Id]>> = xs.iter().map(|&x| self.deriv_row(x, reps)).collect();
        let mut items = Vec::with_capacity(xs.len());
        (0..reps.len())
            .map(|c| {
                items.clear();
                items.extend(rows.iter().map(|r| r[c]));
                join(self, &mut items)
            })
            .collect()
    }

    /// Byte equivalence classes: bytes no byte set among the terms built so far tells apart.
    /// Returns the class of each byte and the number of classes. Derivatives only ever build
    /// unions of existing byte sets, so the classes stay valid for every derivative.
    pub(crate) fn byte_classes(&self) -> ([u8; 256], usize) {
        let mut class = [0u8; 256];
        let mut n = 1usize;
        // Terms are hash-consed, so each `Bytes` node is a distinct set.
        for node in &self.nodes {
            let Node::Bytes(s) = node else { continue };
            // Split every class by membership in `s`: (class, member) → new class.
            let mut remap = [u16::MAX; 512];
            let mut fresh = 0u16;
            for b in 0..=255u8 {
                let key = class[b as usize] as usize * 2 + s.contains(b) as usize;
                if remap[key] == u16::MAX {
                    remap[key] = fresh;
                    fresh += 1;
                }
                class[b as usize] = remap[key] as u8;
            }
            n = fresh as usize;
        }
        (class, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `w` can still be continued into a string of `e`'s language.
    fn live(terms: &mut Terms, e: Id, w: &[u8]) -> bool {
        let (class, n) = terms.byte_classes();
        let mut reps = vec![0u8; n];
        for b in (0..=255u8).rev() {
            reps[class[b as usize] as usize] = b;
        }
        let mut x = e;
        for &b in w {
            x = terms.deriv_row(x, &reps)[class[b as usize] as usize];
            if x == NOTHING {
                return false;
            }
        }
        !terms.is_void(x, &reps, 1_000_000).0
    }

    /// [`Terms::widen`] keeps which strings of at most `h` bytes are live, for every `h` and
    /// every string over the patterns' bytes (both bounds at, just past and far past `h`, nested
    /// repetitions, repetitions after a prefix, and an intersection it must leave alone), and
    /// changes the term where a bound is past `h` (so the check is not vacuous).
    #[test]
    fn widening_keeps_the_strings_a_subtree_of_that_height_can_read() {
        let patterns = [
            "a{5,9}b",
            "a{0,3}b",
            "(?:ab|c){2,7}b?",
            "x(?:a{1,4}b){3,6}c",
            "(?:a|bc){6}a{0,2}",
            "a{0,12}(?:b|c{2,5})",
            "(?:a{2,3}|b){4,}c",
            "a{0,3}b{0,9}c",
            "a{3,4}b{0,9}",
            "(?:ba{0,9}){0,3}c",
        ];
        let alphabet = b"abcx";
        let mut widened = 0;
        for p in patterns {
            let mut terms = Terms::new();
            let e = crate::parse::parse(&mut terms, p, false).unwrap();
            let inter = {
                let other = crate::parse::parse(&mut terms, "[ab]{0,10}", false).unwrap();
                terms.and(&[e, other])
            };
            for h in 0..=6u32 {
                let w = terms.widen(e, h);
                widened += (w != e) as usize;
                assert_eq!(terms.widen(inter, h), inter, "{p} at {h}: an intersection");
                for s in crate::testing::words(alphabet, h as usize) {
                    assert_eq!(
                        live(&mut terms, e, &s),
                        live(&mut terms, w, &s),
                        "{p} widened at {h}: {:?}",
                        String::from_utf8_lossy(&s)
                    );
                }
            }
        }
        assert!(widened >= 20, "only {widened} widenings changed a term");
    }
}
