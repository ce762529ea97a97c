/// Bounds on compiling a constraint. Exceeding one is a [`crate::GrammarError::LimitExceeded`]
/// naming the field; it never runs out of memory or hangs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Heap bytes the Thompson NFA may use. Default 16 MiB. Catches huge counted repetitions
    /// (`a{100000}`) before determinization starts.
    pub nfa_bytes: usize,
    /// Heap bytes the dense DFA may use. Default 64 MiB. This is the bound that stops the classic
    /// exponential blow-ups (`[ab]*a[ab]{20}`); determinization time grows with it, so it is also the
    /// compile-time bound (about 1 s per 64 MiB here).
    pub dfa_bytes: usize,
    /// Scratch memory the determinizer may use. Default 64 MiB.
    pub determinize_bytes: usize,
    /// DFA states reachable from the start. Default 100,000. Each visited state may cache one token
    /// mask (6 KiB at 49k tokens, 32 KiB at 262k), so this also bounds mask-cache memory.
    pub max_states: usize,
    /// Longest forced (jump-forward) byte run computed at once. Default 4,096.
    pub max_forced_bytes: usize,
    /// Wall-clock bound on compiling. Default 5 s. Checked while the reachable states are explored
    /// and tabulated; determinization itself cannot be interrupted, and is bounded by `dfa_bytes`
    /// and `determinize_bytes` instead.
    pub compile_time: std::time::Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            nfa_bytes: 16 << 20,
            dfa_bytes: 64 << 20,
            determinize_bytes: 64 << 20,
            max_states: 100_000,
            max_forced_bytes: 4096,
            compile_time: std::time::Duration::from_secs(5),
        }
    }
}
