//! The DFA of a [`crate::Grammar`], built lazily from derivatives and shared by every thread.
//!
//! State 0 is the constraint's term; a state's row (its successor for each byte class) is computed
//! the first time any thread steps out of it: the derivative of its term by each class's
//! representative byte, interned so that equal terms are one state. Rows are stored in
//! [`Grow`], an append-only table of atomics whose addresses never move, so a step is an atomic
//! load with no lock; only filling a row takes the mutex that guards the term store. State numbers
//! are stable for the grammar's lifetime, so masks and forced bytes can be cached per state and
//! matchers can hold states across threads.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use rustc_hash::FxHashMap;

use crate::deriv::{Id, Terms, NOTHING};

/// No transition: the byte leads outside the language.
pub(crate) const DEAD: u32 = u32::MAX;
/// A row slot not computed yet.
const UNKNOWN: u32 = u32::MAX - 1;

/// Why the DFA stopped growing ([`LazyDfa::overflow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overflow {
    States,
    Terms,
}

/// An append-only table of rows of `width` items each, in segments of 64·2ᵏ rows allocated on
/// first use. `row(r)` never moves, so readers need no lock.
pub(crate) struct Grow<T> {
    width: usize,
    make: fn() -> T,
    segs: [OnceLock<Box<[T]>>; 32],
}

const BASE: usize = 64;

impl<T> std::fmt::Debug for Grow<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let segments = self.segs.iter().filter(|s| s.get().is_some()).count();
        write!(f, "Grow({segments} segments of {} per row)", self.width)
    }
}

impl<T> Grow<T> {
    pub(crate) fn new(width: usize, make: fn() -> T) -> Self {
        Self {
            width,
            make,
            segs: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    #[inline]
    pub(crate) fn row(&self, r: usize) -> &[T] {
        let j = r / BASE + 1;
        let k = (usize::BITS - 1 - j.leading_zeros()) as usize;
        let off = r - BASE * ((1 << k) - 1);
        let seg = self.segs[k].get_or_init(|| {
            (0..(BASE << k) * self.width)
                .map(|_| (self.make)())
                .collect()
        });
        &seg[off * self.width..][..self.width]
    }

    #[inline]
    pub(crate) fn at(&self, r: usize) -> &T {
        &self.row(r)[0]
    }
}

struct Inner {
    terms: Terms,
    state_of: FxHashMap<Id, u32>,
    term_of: Vec<Id>,
}

pub(crate) struct LazyDfa {
    pub(crate) classes: [u8; 256],
    pub(crate) nclasses: usize,
    /// A byte of each class.
    reps: Vec<u8>,
    rows: Grow<AtomicU32>,
    accepting: Grow<AtomicBool>,
    states: AtomicU32,
    inner: Mutex<Inner>,
    max_states: usize,
    max_terms: usize,
    /// 0, or 1 + the [`Overflow`] that stopped growth.
    overflow: AtomicU8,
}

impl std::fmt::Debug for LazyDfa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyDfa")
            .field("nclasses", &self.nclasses)
            .field("states", &self.state_count())
            .finish()
    }
}

impl LazyDfa {
    pub(crate) fn new(terms: Terms, root: Id, max_states: usize, max_terms: usize) -> Self {
        let (classes, nclasses) = terms.byte_classes();
        let mut reps = vec![0u8; nclasses];
        for b in (0..=255u8).rev() {
            reps[classes[b as usize] as usize] = b;
        }
        let dfa = Self {
            classes,
            nclasses,
            reps,
            rows: Grow::new(nclasses, || AtomicU32::new(UNKNOWN)),
            accepting: Grow::new(1, || AtomicBool::new(false)),
            states: AtomicU32::new(1),
            inner: Mutex::new(Inner {
                state_of: FxHashMap::from_iter([(root, 0)]),
                term_of: vec![root],
                terms,
            }),
            max_states: max_states.max(1),
            max_terms,
            overflow: AtomicU8::new(0),
        };
        let inner = dfa.inner.lock().unwrap_or_else(PoisonError::into_inner);
        dfa.accepting
            .at(0)
            .store(inner.terms.nullable(root), Ordering::Relaxed);
        if root == NOTHING {
            // The empty language: the start has no way forward.
            for slot in dfa.rows.row(0) {
                slot.store(DEAD, Ordering::Relaxed);
            }
        }
        drop(inner);
        dfa
    }

    /// The successor of `s` by a byte of class `class`, or [`DEAD`].
    #[inline]
    pub(crate) fn next(&self, s: u32, class: usize) -> u32 {
        let slot = &self.rows.row(s as usize)[class];
        let v = slot.load(Ordering::Acquire);
        if v != UNKNOWN {
            return v;
        }
        self.fill(s);
        slot.load(Ordering::Acquire)
    }

    #[inline]
    pub(crate) fn step(&self, s: u32, b: u8) -> u32 {
        self.next(s, self.classes[b as usize] as usize)
    }

    pub(crate) fn is_accepting(&self, s: u32) -> bool {
        self.accepting.at(s as usize).load(Ordering::Relaxed)
    }

    /// States built so far.
    pub(crate) fn state_count(&self) -> usize {
        self.states.load(Ordering::Acquire) as usize
    }

    /// The language is empty (the start term is `∅`).
    pub(crate) fn is_empty_language(&self) -> bool {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.term_of[0] == NOTHING
    }

    /// Terms built so far.
    pub(crate) fn term_count(&self) -> usize {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.terms.len()
    }

    /// Why growth stopped, if it did: a successor that would have been a new state past
    /// `max_states`, or needed terms past `max_terms`, was made dead instead.
    pub(crate) fn overflow(&self) -> Option<Overflow> {
        match self.overflow.load(Ordering::Relaxed) {
            0 => None,
            1 => Some(Overflow::States),
            _ => Some(Overflow::Terms),
        }
    }

    /// Computes the row of `s`. Slot 0 is written last, so a filled slot 0 means a filled row.
    #[cold]
    fn fill(&self, s: u32) {
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let inner = &mut *guard;
        let row = self.rows.row(s as usize);
        if row[0].load(Ordering::Acquire) != UNKNOWN {
            return;
        }
        let e = inner.term_of[s as usize];
        let derivs = inner.terms.deriv_row(e, &self.reps);
        for c in (0..self.nclasses).rev() {
            let d = derivs[c];
            let t = if d == NOTHING {
                DEAD
            } else if let Some(&t) = inner.state_of.get(&d) {
                t
            } else if inner.term_of.len() >= self.max_states {
                self.overflow
                    .store(1 + Overflow::States as u8, Ordering::Relaxed);
                DEAD
            } else if inner.terms.len() > self.max_terms {
                self.overflow
                    .store(1 + Overflow::Terms as u8, Ordering::Relaxed);
                DEAD
            } else {
                let t = inner.term_of.len() as u32;
                self.accepting
                    .at(t as usize)
                    .store(inner.terms.nullable(d), Ordering::Relaxed);
                inner.term_of.push(d);
                inner.state_of.insert(d, t);
                self.states.store(t + 1, Ordering::Release);
                t
            };
            row[c].store(t, Ordering::Release);
        }
    }
}
