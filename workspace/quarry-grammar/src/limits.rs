/// Bounds on compiling and growing a constraint. Exceeding one at compile time is a
/// [`crate::GrammarError::LimitExceeded`] naming the field; it never runs out of memory or hangs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest regex accepted: a regex constraint's text; a schema's typed regex as it is held
    /// while compiling (nodes and leaf text, a part shared by several uses counted once; all of
    /// it, and what each subschema adds while translating: past it the schema is translated
    /// again with large references as shared rules, then refused as `SchemaError::TooLarge`);
    /// a schema's regex text where it is printed (`schema_to_regex`, `Constraint::rules`).
    /// Default 4 MiB.
    pub max_regex_bytes: usize,
    /// Deepest nesting of a schema's subschemas, `allOf` merges and negations while translating
    /// (`SchemaError::TooDeep` past it). Default 256: real schemas stay far below it, and each
    /// level costs a few KiB of stack (grown on the heap past the caller's stack, so the bound
    /// is about time and memory, not overflow).
    pub max_schema_nesting: usize,
    /// Regex terms (parse nodes plus the derivatives built while the DFA grows). Default 2 million,
    /// about 100 MiB. At compile time exceeding it is an error; while decoding, see `max_states`.
    pub max_terms: usize,
    /// DFA states. Default 100,000. The DFA is built lazily, so this bounds the states that
    /// decoding and mask walks actually visit; each may cache one token mask (6 KiB at 49k tokens,
    /// 32 KiB at 262k), so it also bounds mask-cache memory. A step that would create a state past
    /// this bound (or terms past `max_terms`) is refused instead: outputs stay inside the language,
    /// some continuations are lost, and [`crate::Grammar::overflow_error`] names the limit.
    /// [`crate::Grammar::explore`] reports it as an error. Classic blow-ups such as
    /// `[ab]*a[ab]{20}` reach it; schemas do not.
    pub max_states: usize,
    /// The parser's work per byte for a grammar with recursion: the `(top, parent)` pairs of the
    /// graph-structured stack one step may visit (see [`crate::Grammar`]'s pushdown layer).
    /// Default 2,048. JSON, schemas and the usual GBNF files visit a handful; a very ambiguous
    /// grammar may visit many, and a step past this bound is refused like a state past
    /// `max_states` ([`crate::Grammar::overflow_error`] names it), so a mask costs at most this
    /// much per trie node and never hangs.
    pub max_parser_stacks: usize,
    /// Longest forced (jump-forward) byte run computed at once. Default 4,096.
    pub max_forced_bytes: usize,
    /// States one search for a shortest completion may expand ([`crate::Grammar::shortest_record`],
    /// the token budget's closing path: `docs/budget.md`). Default 20,000. The search is A*
    /// with an estimate that is exact for plain regular terms, so it expands about one state per
    /// byte of the completion there; intersections and complements (a schema's
    /// `additionalProperties` beside named ones, `not`) can make it look wider. Past the bound
    /// the state has no completion, and a sequence there decodes without the budget's guarantee
    /// (counted, never wrong).
    pub max_completion_search: usize,
    /// Bytes a grammar's fit tables may take in all: per state, its allowed tokens sorted into
    /// masks by the completion they leave, so that the budget's draw again is a mask AND
    /// ([`crate::fits`]). Default 64 MiB (about 400 states' tables at a 152k-token vocabulary);
    /// past it the draw again walks the tokens (same result, slower).
    pub max_fit_table_bytes: usize,
    /// Runs of allowed tokens a grammar may keep from the mask walks that states of long
    /// counted repetitions share (a string's `maxLength`: [`crate::Grammar`]'s subtree walks);
    /// 8 bytes each. Default 1 million (8 MiB); past it such walks are not kept (the same masks,
    /// slower). 0 turns the sharing off.
    pub max_shared_subtrees: usize,
    /// Wall-clock bound on compiling (translating a schema and parsing the regex). Default 5 s.
    pub compile_time: std::time::Duration,
    /// Speed only, not a bound: a mask walk of a grammar with recursion that reaches a state
    /// looping on many bytes (an identifier's `[a-z0-9_]*`) adds the tokens below that trie node
    /// from the vocabulary's index of the loop's region (`loops` module) where the node has at
    /// least this many nodes below it, and walks smaller subtrees node by node. Default 256 (a
    /// lookup and its exits cost more than walking a small subtree). Masks are the same for every
    /// value (tested); 0 uses the index wherever it applies, `usize::MAX` never.
    pub min_loop_region: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_regex_bytes: 4 << 20,
            max_schema_nesting: 256,
            max_terms: 2_000_000,
            max_states: 100_000,
            max_parser_stacks: 2048,
            max_forced_bytes: 4096,
            max_completion_search: 20_000,
            max_fit_table_bytes: 64 << 20,
            max_shared_subtrees: 1 << 20,
            compile_time: std::time::Duration::from_secs(5),
            min_loop_region: 256,
        }
    }
}
