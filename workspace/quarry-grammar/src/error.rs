/// Why a constraint could not be compiled or a matcher refused input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrammarError {
    /// The regex does not parse, or uses a feature a byte DFA cannot express.
    #[error("invalid regex {pattern:?}: {reason}")]
    InvalidRegex {
        pattern: String,
        #[source]
        reason: RegexError,
    },
    /// A grammar (GBNF) that does not parse; `line` and `column` count from 1 (columns in
    /// characters).
    #[error("invalid grammar at line {line}, column {column}: {message}")]
    InvalidGrammar {
        line: usize,
        column: usize,
        message: String,
    },
    /// A grammar whose rules parse but cannot be used: left recursion, or a root that can never
    /// finish. `rule` names the rule.
    #[error("grammar rule `{rule}`: {message}")]
    InvalidRule { rule: String, message: String },
    /// A choice constraint with no alternatives has an empty language.
    #[error("a choice constraint needs at least one alternative")]
    EmptyChoice,
    /// The constraint compiled, but no text at all satisfies it (a regex such as `a&&b`, a schema
    /// whose keywords contradict each other): no output could ever be complete.
    #[error("the constraint matches no text at all")]
    EmptyLanguage,
    /// A bound in [`crate::Limits`] was exceeded; `limit` names the field and `value` is its
    /// configured bound (bytes, states, or milliseconds for `compile_time`).
    #[error("constraint exceeds limit `{limit}` = {value}")]
    LimitExceeded { limit: &'static str, value: usize },
    /// A JSON Schema that cannot be turned into a constraint.
    #[error(transparent)]
    Schema(#[from] crate::schema::SchemaError),
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    UnknownToken { id: u32, vocab_size: usize },
}

/// Why a regex does not become a constraint: [`GrammarError::InvalidRegex`]'s source.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegexError {
    /// regex-syntax refused the pattern; `message` is its error on one line (it draws the
    /// pattern with a caret under the error on several).
    #[error("{message}")]
    Syntax { message: String },
    /// An assertion other than an anchor at the very start or end of the pattern (`look` is its
    /// name), or a word boundary: the whole output is matched, so nothing else is expressible.
    #[error(
        "the assertion {look} is not supported: anchors (^ $ \\A \\z) only at the start or end \
         of the pattern, since the whole output is matched, and no word boundaries"
    )]
    Assertion { look: String },
    /// Schema text with rule references or intersections that leaves the direct parser's
    /// dialect at byte `at`: a defect in quarry's schema translation, not in the schema.
    #[error(
        "internal error: schema regex with rule references or intersections leaves the direct \
         parser's dialect at byte {at} (please report the schema)"
    )]
    Internal { at: usize },
}

/// A token or bytes the constraint does not allow at this point. The matcher is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    #[error("token {id} leads outside the language")]
    Token { id: u32 },
    #[error("byte {offset} of the input leads outside the language")]
    Bytes { offset: usize },
    #[error("end of sequence is not allowed: the constraint is not complete")]
    EosNotAllowed,
    #[error("special token {id} is never allowed by this constraint")]
    Special { id: u32 },
    #[error("the matcher already accepted end of sequence")]
    Terminated,
    #[error("token id {id} is outside the vocabulary")]
    UnknownToken { id: u32 },
    /// The input completes an array item equal to an earlier one where the schema says
    /// `uniqueItems: true`, or starts an item that can only end as one (its items are listed
    /// strings, all that fit already used).
    #[error("the input repeats, or can only go on to repeat, an item of an array whose items must be unique (uniqueItems)")]
    DuplicateItem,
}
