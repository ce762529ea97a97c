//! JSON Schema → a regex over quarry's canonical JSON text, compiled by the same DFA machinery as
//! any regex constraint.
//!
//! The translator builds a typed tree ([`Re`]: sequences, alternatives, repetitions,
//! intersections, rule references, and regex text only for leaf languages such as a number
//! range or a format), which [`crate::Grammar`] lowers straight into its terms. Its text form
//! ([`schema_to_regex`], `quarry grammar explain`) is for people and for regex-level tests.
//!
//! # Output form
//! - Canonical JSON: object properties in schema order (`properties`), then any additional
//!   properties; strings escaped exactly as `serde_json` writes them (`\"`, `\\`, `\b \f \n \r \t`,
//!   other control characters as `\u00xx`, everything else raw UTF-8).
//! - Whitespace: [`Whitespace::Compact`] (none, the default) or [`Whitespace::Pretty`], which allows
//!   up to `max_run` whitespace bytes around each structural character. Never unbounded.
//! - Optional properties may be omitted. With `strict`, a missing `additionalProperties` means
//!   `false` (OpenAI structured-outputs semantics); without it, the schema's own rule applies.
//! - Where a schema allows *any* value (`true`, an absent `items`, additional properties), the
//!   values generated are JSON nested at most [`SchemaOptions::any_value_depth`] levels deep.
//!
//! # Drafts
//! `$schema` selects draft 4, 6, 7, 2019-09 or 2020-12 (the default). Where drafts differ, the
//! declared draft is honoured: `items` as an array with `additionalItems` (before 2020-12) versus
//! `prefixItems` + `items`; `exclusiveMinimum`/`exclusiveMaximum` as booleans (draft 4) versus
//! numbers; `$ref` siblings ignored (before 2019-09) versus applied.
//!
//! # Keywords: the contract
//! Supported:
//! - types: `type` (a name or an array of names, `null` included), `enum`, `const` (filtered by the
//!   schema's other keywords);
//! - objects: `properties`, `required`, `additionalProperties` (boolean or schema),
//!   `patternProperties` (a declared name takes every matching pattern's schema too; an
//!   additional name matching exactly one pattern takes its schema, one matching none takes
//!   `additionalProperties`; names matching several patterns are not generated), `propertyNames`,
//!   `minProperties`/`maxProperties` (up to 32), `dependentRequired` (draft 4–7: `dependencies`
//!   with name lists) over at most 6 properties (a name it mentions that only an additional
//!   property could have gets a slot after the declared properties), `dependentSchemas` (draft 4–7:
//!   `dependencies` with schemas), expanded to "without the trigger, or with it and the schema";
//!   `unevaluatedProperties` as `additionalProperties` of the object that `$ref`/`allOf`/`anyOf`/
//!   `oneOf`/`if`/`not` merge to (every branch written succeeded, so its properties were
//!   evaluated; negations there leave out alternatives that would write a property only the
//!   failed subschema names, which is narrower and sound);
//! - arrays: `items`, `prefixItems`, `additionalItems`, `minItems`, `maxItems`; `uniqueItems`,
//!   written into the language when `maxItems` ≤ 1 or the items are at most 6 values (`enum`,
//!   `const`, boolean), and otherwise checked while decoding by every matcher ([`unique`]: a token
//!   that would complete an item JSON-equal to an earlier one is refused); `contains` with
//!   `minContains`/`maxContains` (up to 16) next to a schema-valued `items` (with `maxContains`,
//!   the other items are those failing `contains`, by negation); `unevaluatedItems` like
//!   `unevaluatedProperties`;
//! - strings: `minLength`, `maxLength` (code points), `pattern` (ECMA-262: a search; `\d`, `\w`,
//!   `\s` and `.` with their ECMA meanings; `^`/`$` at the ends of each branch of a top-level
//!   alternation; look-aheads `(?=…)`/`(?!…)` at the top level, each an intersection or
//!   difference with the rest of the string, a leading one with `^` holding only for matches at
//!   the start), `format` for `date`, `time`, `date-time`, `uuid`,
//!   `ipv4`, `json-pointer`, `relative-json-pointer` (without characters that need a JSON
//!   escape), and conservative subsets (every value allowed is valid) of `ipv6` (uncompressed),
//!   `hostname`, `email`, `duration`, `uri` and `uri-reference`, whose ASCII forms also serve
//!   `idn-email`, `iri` and `iri-reference`. Several of these on one string
//!   must all hold: they are intersected exactly (an intersection term, whose product states the
//!   grammar's lazy DFA builds as decoding visits them), except that a `pattern` with a
//!   length is matched in full rather than searched, and where it has several variable-length
//!   parts they share the length budget (both sound, narrower);
//! - numbers: the exact JSON number grammar (no leading zeros; fraction; exponent), bounded to at
//!   most 18 integer digits, 18 fraction digits and a 2-digit exponent so every output parses as an
//!   `f64` and digits cannot run to `max_tokens`; `minimum`, `maximum`, `exclusiveMinimum`,
//!   `exclusiveMaximum` as exact digit languages, for integers and for decimals (bounded numbers
//!   are written without an exponent); `multipleOf` on integers for steps dividing 1000 (at most
//!   15 digits, where `f64` validators agree) or over ranges of at most 256 integers, and powers
//!   of ten on numbers (`0.01`: at most two fraction digits);
//! - combinators: `anyOf`; `oneOf`, sound: branches proven disjoint (types that cannot meet, as
//!   `type`, `enum`, `$ref`, `anyOf`/`oneOf` and `allOf` give them, disjoint
//!   `enum`/`const`, a required property with disjoint schemas, a required name the other
//!   branch forbids by `additionalProperties: false`) stay as they are, others are intersected
//!   with the negation of what each branch they may overlap asks beyond them (keywords both
//!   share, with what their meaning depends on, hold in both and are not negated); `allOf`,
//!   merged keyword by keyword where that is exact (types intersected, `required` united,
//!   `properties` merged per name, the tighter of two bounds, `enum` intersected, two `anyOf`s
//!   multiplied out (up to 128 branches), schema-valued `items` and `additionalProperties` as
//!   `allOf`s, integer `multipleOf` by their least common multiple, a second `if`/`then`/`else` as the `anyOf` it
//!   stands for, two tuples position by position, a branch's own `unevaluated*` as the
//!   `additionalProperties`/`items` it is against that branch's keywords); keywords
//!   next to `anyOf`/`oneOf` are merged into each branch; `not` by exact negation (De Morgan:
//!   types, bounds, lengths, counts, `required`, `properties`, `items`, `enum`/`const` of scalars,
//!   `pattern`, and `anyOf`/`allOf`/`not`/`oneOf` of those, a `oneOf` of at most 8 branches as
//!   "none, or two at once"; `additionalProperties`/`patternProperties` where the schema the
//!   negation is intersected with, the other `oneOf` branch or the rest of the schema, closes the
//!   names an object can have by `additionalProperties: false`: "one of those names, with a
//!   value failing what that name calls for"; negation is relative to that schema, at nested
//!   properties and items too); `if`/`then`/`else` expanded to
//!   `(if ∧ then) ∨ (¬if ∧ else)`;
//! - references: `$ref` by JSON Pointer (`#/$defs/…`, any pointer into a schema resource), by
//!   `$id` (absolute, relative or `urn:`, resolved against the base URI of the schema object that
//!   holds it, RFC 3986), by `$anchor` (and draft 6/7's `$id: "#name"`), to embedded resources and
//!   to documents given beside the schema ([`bundle`]); [`resolve`] rewrites each one as a pointer
//!   from the root before translating. A recursive reference becomes a rule of a grammar
//!   ([`crate::cfg`]: its target translated once, as the rule's body), or is unrolled to
//!   [`SchemaOptions::max_recursion_depth`] levels of regex when that is set. Where copying each
//!   referenced subschema into every use outgrows [`crate::Limits::max_regex_bytes`], the schema
//!   is translated again with each large target as a rule shared by its uses.
//!
//! Ignored (annotations): `title`, `description`, `examples`, `default`, `$comment`, `deprecated`,
//! `readOnly`, `writeOnly`, `$schema`, `$id` and `$anchor` (once references are resolved),
//! `$dynamicAnchor`, `$vocabulary`,
//! `contentMediaType`, `contentEncoding`, `contentSchema`.
//!
//! A typed [`SchemaError::Unsupported`] naming the keyword and its JSON Pointer, never a silent drop:
//! dependencies over more than 6 properties, `contains` next
//! to `prefixItems`, `maxItems` or `uniqueItems`, negations of other keywords (`format`,
//! `additionalProperties` and `patternProperties` where the other side leaves names open,
//! `uniqueItems`, `contains`, `prefixItems`, …), a double `not` next to `unevaluated*`, a `$dynamicRef` whose target depends on the evaluation path (two resources with its anchor, none at the root; the others are resolved by [`resolve`]), 2019-09's `$recursiveRef`, other `multipleOf`, other formats,
//! an `allOf` merge of two `anyOf`s with more than 128 branches in their product,
//! `allOf` branches that set
//! the same other keyword differently or split a coupled pair that cannot be merged exactly
//! (`prefixItems`/`items`, `additionalProperties` next to `patternProperties`; `properties`/
//! `additionalProperties` are merged exactly: a name one branch declares takes the other's
//! `additionalProperties`), look-aheads inside groups or next to a top-level alternation,
//! look-behinds, backreferences, word boundaries, references to documents neither in the schema
//! nor given to [`bundle`] (never fetched), a recursive reference with keywords next to it
//! (from 2019-09) or inside an operation on regular languages (`not`, overlapping `oneOf`,
//! `patternProperties` names), unless `max_recursion_depth` unrolls it. (From 2019-09, keywords
//! next to `$ref` are merged into its target.) Keywords that the declared draft does not define (`dependencies` in 2019-09 and
//! later, `dependentRequired` before, `if` before draft 7) are ignored, as validators of that
//! draft ignore them.
//! Any other keyword is an annotation, as JSON Schema says and validators do, and so is a format
//! JSON Schema does not define (`AWS::EC2::VPC.Id`); with
//! [`SchemaOptions::ignore_unknown_keywords`] off (the strict option) both are
//! [`SchemaError::UnknownKeyword`] errors instead.
//!
//! # Limits
//! Translation stops with [`SchemaError::OutOfTime`] at the compile-time limit, with
//! [`SchemaError::TooLarge`] when the typed regex held for the schema passes
//! [`crate::Limits::max_regex_bytes`] (each part shared by several uses counted once; its text,
//! where it is printed; even with shared rules), and with [`SchemaError::TooDeep`] past
//! [`crate::Limits::max_schema_nesting`] levels of subschemas, merges and
//! negations (deep recursion continues on stack segments of its own, so it never overflows the
//! caller's stack); the limits of
//! [`crate::Limits`] apply after. The DFA is built lazily, so its state limit bounds what decoding
//! visits ([`crate::Grammar::overflow_error`]); [`crate::Grammar::explore`] checks a whole schema
//! against it up front.

mod array;
mod canonical;
mod decimal;
mod merge;
mod negate;
mod object;
mod re;
mod resolve;
mod scalar;
#[cfg(test)]
mod tests;
pub mod unique;

pub use canonical::canonicalize;
pub use resolve::{bundle, flatten};

use serde_json::{json, Map, Value};

pub(crate) use re::Re;

/// Whitespace the output may contain between tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Whitespace {
    /// No whitespace at all: `{"a":1,"b":[true]}`.
    #[default]
    Compact,
    /// Exactly one space after each `,` and `:` and none elsewhere, as Python's `json.dumps` and
    /// most chat models write JSON: `{"a": 1, "b": [true]}`. As deterministic as `Compact` (the
    /// separators are forced bytes for jump-forward), in the form models saw in training.
    Spaced,
    /// Up to `max_run` bytes of space, tab, CR or LF around each structural character.
    Pretty { max_run: u8 },
}

impl Whitespace {
    /// `v` as this layout writes it: the text quarry's constraint produces for that value (for
    /// `Pretty`, its whitespace-free form, which `Pretty` accepts).
    pub fn render(&self, v: &Value) -> String {
        match self {
            Whitespace::Compact | Whitespace::Pretty { .. } => {
                serde_json::to_string(v).expect("a Value serializes")
            }
            Whitespace::Spaced => {
                let mut out = Vec::new();
                let mut ser = serde_json::Serializer::with_formatter(&mut out, SpacedFormatter);
                serde::Serialize::serialize(v, &mut ser).expect("a Value serializes");
                String::from_utf8(out).expect("serde_json writes UTF-8")
            }
        }
    }

    /// The regexes of an item separator (`,`), a key separator (`:`) and the padding inside
    /// brackets.
    fn separators(&self) -> Separators {
        match self {
            Whitespace::Compact => Separators {
                pad: Re::empty(),
                comma: Re::text(","),
                colon: Re::text(":"),
            },
            Whitespace::Spaced => Separators {
                pad: Re::empty(),
                comma: Re::text(", "),
                colon: Re::text(": "),
            },
            Whitespace::Pretty { max_run } => {
                let ws = format!("[ \\t\\n\\r]{{0,{max_run}}}");
                Separators {
                    comma: Re::text(format!("{ws},{ws}")),
                    colon: Re::text(format!("{ws}:{ws}")),
                    pad: Re::text(ws),
                }
            }
        }
    }
}

/// `compact`, `spaced`, `pretty` (up to 8 whitespace bytes) or `pretty:N`: the names the CLI and
/// job files use.
impl std::str::FromStr for Whitespace {
    type Err = UnknownWhitespace;

    fn from_str(s: &str) -> std::result::Result<Self, UnknownWhitespace> {
        match s {
            "compact" => Ok(Whitespace::Compact),
            "spaced" => Ok(Whitespace::Spaced),
            "pretty" => Ok(Whitespace::Pretty { max_run: 8 }),
            _ => match s.strip_prefix("pretty:").map(str::parse::<u8>) {
                Some(Ok(max_run)) if max_run > 0 => Ok(Whitespace::Pretty { max_run }),
                _ => Err(UnknownWhitespace {
                    given: s.to_owned(),
                }),
            },
        }
    }
}

/// A whitespace name [`Whitespace`]'s `FromStr` does not know; `given` is the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown whitespace {given:?}: expected compact, spaced, pretty or pretty:N (N from 1 to 255)"
)]
pub struct UnknownWhitespace {
    pub given: String,
}

impl std::fmt::Display for Whitespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Whitespace::Compact => f.write_str("compact"),
            Whitespace::Spaced => f.write_str("spaced"),
            Whitespace::Pretty { max_run } => write!(f, "pretty:{max_run}"),
        }
    }
}

/// serde_json's compact form with a space after each `,` and `:`.
struct SpacedFormatter;

/// `", "` before every array item and object member but the first.
fn spaced_comma<W: ?Sized + std::io::Write>(writer: &mut W, first: bool) -> std::io::Result<()> {
    if first {
        Ok(())
    } else {
        writer.write_all(b", ")
    }
}

impl serde_json::ser::Formatter for SpacedFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        spaced_comma(writer, first)
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        spaced_comma(writer, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

/// The regexes around structure, from [`Whitespace`].
#[derive(Clone)]
struct Separators {
    /// After `[`/`{` and before `]`/`}`.
    pad: Re,
    /// Between array items and between object members.
    comma: Re,
    /// Between a key and its value.
    colon: Re,
}

impl Separators {
    /// `open`, padding, `body`, padding, `close`: an array's or object's brackets around its
    /// items or members.
    fn bracketed(&self, open: &'static str, body: Re, close: &'static str) -> Re {
        Re::seq([
            Re::text(open),
            self.pad.clone(),
            body,
            self.pad.clone(),
            Re::text(close),
        ])
    }
}

/// How a schema becomes a constraint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SchemaOptions {
    pub whitespace: Whitespace,
    /// A missing `additionalProperties` means `false`.
    pub strict: bool,
    /// Nesting depth of values generated where the schema allows any value. Default 2.
    pub any_value_depth: usize,
    /// Treat keywords this module does not know (`markdownDescription`, `x-…` vendor extensions,
    /// `readonly`) as annotations, as JSON Schema says and as validators (the `jsonschema` crate
    /// included) do. Default true: about one real-world schema in five has such keywords. False
    /// is the strict option: any unknown keyword is [`SchemaError::UnknownKeyword`], which
    /// catches typos such as `propertees`. Either way a *validation* keyword quarry does not
    /// support is an error, never ignored.
    pub ignore_unknown_keywords: bool,
    /// Unroll a recursive `$ref` up to this many times along one path into a regex; past it, the
    /// reference admits nothing (so optional recursive members are left out, and a schema that
    /// requires deeper nesting admits nothing). `None` (the default): a recursive reference is a
    /// rule of a grammar, at any depth.
    pub max_recursion_depth: Option<usize>,
}

impl Default for SchemaOptions {
    fn default() -> Self {
        Self {
            whitespace: Whitespace::Compact,
            strict: false,
            any_value_depth: 2,
            ignore_unknown_keywords: true,
            max_recursion_depth: None,
        }
    }
}

/// Why a schema cannot be turned into a constraint. `pointer` is the JSON Pointer of the
/// subschema (`#/properties/age`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    #[error("unsupported `{keyword}` at {pointer}: {reason}")]
    Unsupported {
        keyword: String,
        pointer: String,
        reason: String,
    },
    #[error("unknown keyword `{keyword}` at {pointer}")]
    UnknownKeyword { keyword: String, pointer: String },
    #[error("invalid schema at {pointer}: {message}")]
    Invalid { pointer: String, message: String },
    /// Translating took longer than the compile-time limit (reported by [`crate::Grammar`] as
    /// `LimitExceeded { limit: "compile_time" }`).
    #[error("translating the schema ran out of time at {pointer}")]
    OutOfTime { pointer: String },
    /// The regex of a subschema grew past `limit` bytes ([`crate::Limits::max_regex_bytes`];
    /// typically many uses of a large `$ref`, or a wide `oneOf`). Compiling measures the typed
    /// regex held, where a part shared by several uses counts once; printing the regex
    /// ([`schema_to_regex`]) measures its text.
    #[error("the regex for {pointer} exceeds {limit} bytes (Limits::max_regex_bytes)")]
    TooLarge { pointer: String, limit: usize },
    /// Subschemas, `allOf` merges and negations nested past `limit` levels
    /// ([`crate::Limits::max_schema_nesting`]; the expansion of many conditionals or combinators
    /// into each other), refused before the translator's recursion could exhaust the stack.
    #[error("the schema nests subschemas, merges and negations more than {limit} levels deep at {pointer} (Limits::max_schema_nesting)")]
    TooDeep { pointer: String, limit: usize },
}

type Result<T> = std::result::Result<T, SchemaError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Draft {
    D4,
    D6,
    D7,
    D2019,
    D2020,
}

impl Draft {
    /// The draft `$schema` declares (2020-12 when it declares none).
    fn of(schema: &Value) -> Self {
        match schema.get("$schema").and_then(Value::as_str) {
            Some(s) if s.contains("draft-04") => Draft::D4,
            Some(s) if s.contains("draft-06") => Draft::D6,
            Some(s) if s.contains("draft-07") => Draft::D7,
            Some(s) if s.contains("2019-09") => Draft::D2019,
            _ => Draft::D2020,
        }
    }
}

/// One code point of a JSON string, as canonical JSON writes it.
/// `\u00xx` only for the control characters without a short escape, so that every string has
/// exactly one text (which `not: {enum: …}` relies on).
const STR_CHAR: &str = r#"(?:[^"\\\x00-\x1F]|\\["\\bfnrt]|\\u00(?:0[0-7bef]|1[0-9a-f]))"#;
/// The escapes of [`STR_CHAR`].
const ESCAPED: &str = r#"\\["\\bfnrt]|\\u00(?:0[0-7bef]|1[0-9a-f])"#;
/// Numbers are bounded so that every output parses as an `f64` (serde_json, Python and JavaScript
/// refuse or round to infinity beyond ±1.8e308) and a model cannot run digits to `max_tokens`: at
/// most 18 integer digits, 18 fraction digits and a 2-digit exponent.
const NUMBER: &str = r"-?(?:0|[1-9][0-9]{0,17})(?:\.[0-9]{1,18})?(?:[eE][+-]?[0-9]{1,2})?";
const INTEGER: &str = r"-?(?:0|[1-9][0-9]{0,17})";

const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "examples",
    "default",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$schema",
    "$id",
    "id",
    "$anchor",
    "$dynamicAnchor",
    "$vocabulary",
    "contentMediaType",
    "contentEncoding",
    "contentSchema",
    "$defs",
    "definitions",
];

const SUPPORTED: &[&str] = &[
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "not",
    "contains",
    "minContains",
    "maxContains",
    "minProperties",
    "maxProperties",
    "dependentRequired",
    "dependencies",
    "dependentSchemas",
    "patternProperties",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "if",
    "then",
    "else",
];

const UNSUPPORTED: &[&str] = &["$dynamicRef", "$recursiveRef", "$recursiveAnchor"];

/// `unevaluatedProperties`/`unevaluatedItems` of a schema whose in-place applicators (`$ref`,
/// `allOf`, `anyOf`, `oneOf`, and the conditionals and `not` rewritten into them) are being
/// merged into it. They are taken out of the schema, so that merging does not read them against
/// a branch's `properties`, and held by the translator for the instance location being
/// translated: the object or array written there takes them like `additionalProperties`/`items`
/// (every branch written succeeded, so its properties and items were evaluated). Translating a
/// child location (a property's value, an item, a property name) starts with none.
#[derive(Debug, Clone, Default, PartialEq)]
struct Unevaluated {
    properties: Option<Value>,
    items: Option<Value>,
}

impl Unevaluated {
    fn is_empty(&self) -> bool {
        self.properties.is_none() && self.items.is_none()
    }

    /// `inner`'s keywords where it has them (a schema nested in place at the same location
    /// replaces its enclosing schema's), `self`'s otherwise.
    fn within(&self, inner: Unevaluated) -> Unevaluated {
        Unevaluated {
            properties: inner.properties.or_else(|| self.properties.clone()),
            items: inner.items.or_else(|| self.items.clone()),
        }
    }
}

/// Which of [`Unevaluated`]'s keywords.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UnevaluatedOf {
    Properties,
    Items,
}

impl UnevaluatedOf {
    fn keyword(self) -> &'static str {
        match self {
            UnevaluatedOf::Properties => "unevaluatedProperties",
            UnevaluatedOf::Items => "unevaluatedItems",
        }
    }
}

const TYPES: &[&str] = &["null", "boolean", "object", "array", "number", "string"];

/// The regex (over canonical JSON text, full match) of the instances `schema` accepts, with the
/// default compile-time limit: the text of the typed tree the translator builds. Where keywords
/// constrain the same text twice it holds intersection terms, written as empty named groups
/// (`(?P<quarry_and>)`) that regex-automata would read as nothing, so compile the schema with
/// [`crate::Grammar`] (which lowers the tree itself, not this text) and read this as
/// documentation, as `quarry grammar explain` prints it.
pub fn schema_to_regex(schema: &Value, options: &SchemaOptions) -> Result<String> {
    let limits = crate::Limits::default();
    let deadline = std::time::Instant::now() + limits.compile_time;
    schema_to_regex_by(schema, options, &limits, deadline)
}

/// [`schema_to_regex`] within `limits` (the regex size and nesting bounds), giving up with
/// [`SchemaError::OutOfTime`] after `deadline`. A schema
/// with a recursive `$ref` (and no [`SchemaOptions::max_recursion_depth`]) has no regex: it is a
/// grammar, which [`crate::Grammar::compile`] builds; here it is `Unsupported`.
pub fn schema_to_regex_by(
    schema: &Value,
    options: &SchemaOptions,
    limits: &crate::Limits,
    deadline: std::time::Instant,
) -> Result<String> {
    let (root, rules) = schema_to_rules_by(schema, options, limits, deadline, Measure::Text)?;
    match rules.first() {
        None => Ok(root.to_string()),
        Some(_) => Err(unsupported(
            "$ref",
            "#",
            "recursive references make a grammar, not a regex (compile the schema as a \
             constraint, or set max_recursion_depth to unroll them)",
        )),
    }
}

/// What [`crate::Limits::max_regex_bytes`] bounds when a schema is translated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Measure {
    /// The typed regex held (nodes, lists of parts, leaf text; [`re::held`]), where a subtree
    /// shared by several uses counts once: the memory compiling holds, and what it lowers.
    Held,
    /// The length of its text, where a shared subtree is written out at each use: for callers
    /// that print it ([`schema_to_regex`], [`crate::Constraint::rules`]).
    Text,
}

/// The schema as a typed regex for the root and for each rule a recursive `$ref` needs: rule
/// `k`'s regex is `rules[k - 1]`, and [`Re::rule`]`(k)` in any of them refers to it. No rules
/// when nothing recurses (or recursion is unrolled). Its size by `measure` is at most
/// `limits.max_regex_bytes`, or the result is [`SchemaError::TooLarge`].
pub(crate) fn schema_to_rules_by(
    schema: &Value,
    options: &SchemaOptions,
    limits: &crate::Limits,
    deadline: std::time::Instant,
    measure: Measure,
) -> Result<(Re, Vec<Re>)> {
    // Every reference as a pointer from the root, whatever `$id`s it was relative to.
    let schema = &*resolve::flatten(schema)?;
    // Inline copies of each referenced subschema first: a regular language where nothing
    // recurses, and text that intersections and negations can take. Where that outgrows
    // max_regex_bytes (a large definition used in many places), again with large references as
    // shared rules of a grammar, and again with smaller ones.
    let mut tries = SHARED_RULE_BYTES.iter().copied().map(Some);
    let mut share = None;
    loop {
        let start = re::held();
        // The schema's own values are copied whole in places (a property's schema, a merge),
        // which recurses as deep as the JSON: start with room for that whatever the caller's
        // stack (deeper levels of translation grow their own, see `Translator::nested`).
        let out = stacker::maybe_grow(STACK_TOP, STACK_SEGMENT, || {
            translate(schema, options, limits, deadline, share, measure)
        });
        let size = |(root, rules): &(Re, Vec<Re>)| match measure {
            Measure::Held => re::held().saturating_sub(start),
            Measure::Text => rules
                .iter()
                .map(Re::len)
                .fold(root.len(), usize::saturating_add),
        };
        let too_large = || SchemaError::TooLarge {
            pointer: "#".into(),
            limit: limits.max_regex_bytes,
        };
        match (out, tries.next()) {
            (Err(SchemaError::TooLarge { .. }), Some(next)) => share = next,
            (Ok(done), next) if size(&done) > limits.max_regex_bytes => match next {
                Some(next) => share = next,
                None => return Err(too_large()),
            },
            (out, _) => return out,
        }
    }
}

/// Stack that must be left for one more level of translation; below it the recursion continues
/// on a new segment of [`STACK_SEGMENT`] bytes (`stacker`), so any number of levels fits
/// whatever the caller's stack (2 MiB on spawned threads). Debug builds have far larger frames.
const STACK_RED_ZONE: usize = if cfg!(debug_assertions) {
    512 << 10
} else {
    64 << 10
};
const STACK_SEGMENT: usize = 8 << 20;
/// Stack that translation starts with at least (or on a new segment).
const STACK_TOP: usize = 1 << 20;

fn translate(
    schema: &Value,
    options: &SchemaOptions,
    limits: &crate::Limits,
    deadline: std::time::Instant,
    share_refs: Option<usize>,
    measure: Measure,
) -> Result<(Re, Vec<Re>)> {
    let draft = Draft::of(schema);
    let mut t = Translator {
        root: schema,
        options,
        draft,
        sep: options.whitespace.separators(),
        refs: Vec::new(),
        deadline,
        keep_evaluated: false,
        positive: None,
        unevaluated: Unevaluated::default(),
        rules: Vec::new(),
        share_refs,
        nesting: 0,
        max_nesting: limits.max_schema_nesting,
        max_regex_bytes: limits.max_regex_bytes,
        measure,
        held_at: re::held(),
        keys_outside: Default::default(),
    };
    let root = t.value(schema, "#")?;
    // Each rule's body is its target, translated with only itself on the path: a reference back
    // to it is the rule again. Bodies may find more rules.
    let mut bodies = Vec::new();
    while bodies.len() < t.rules.len() {
        let r = t.rules[bodies.len()].clone();
        let fragment = r.strip_prefix('#').expect("rules are local references");
        let target = resolve_fragment(schema, fragment).expect("resolved when the rule was made");
        t.refs = vec![r.clone()];
        bodies.push(t.value(target, &r)?);
    }
    Ok((root, bodies))
}

/// How [`Translator::combine`] joins two languages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Strings in both languages.
    And,
    /// Strings in the first language and not in the second.
    AndNot,
}

/// Syntax for schema-derived regexes when regex-automata reads them (name tests): Unicode
/// classes, with UTF-8 validation of the pattern off, as the grammar parses them in byte mode.
pub(crate) fn schema_syntax() -> regex_automata::util::syntax::Config {
    regex_automata::util::syntax::Config::new().utf8(false)
}

struct Translator<'a> {
    root: &'a Value,
    options: &'a SchemaOptions,
    draft: Draft,
    /// What goes between tokens.
    sep: Separators,
    /// References being expanded (cycle detection).
    refs: Vec<String>,
    deadline: std::time::Instant,
    /// Negating next to `unevaluated*` (see [`Translator::negate_keeping`]).
    keep_evaluated: bool,
    /// While negating: the schema the negation will be intersected with at the location being
    /// negated (for a property's value, that schema's constraint on the property), where known.
    /// Negating relative to it lets `additionalProperties` be negated exactly where it closes
    /// the names an object can have ([`Translator::closed_names`]).
    positive: Option<Value>,
    /// `unevaluated*` of enclosing schemas at the instance location being translated.
    unevaluated: Unevaluated,
    /// The references that recurse, as rules: rule `k` is `rules[k - 1]` (see
    /// [`schema_to_rules_by`]).
    rules: Vec<String>,
    /// Write a reference whose target translates to more than this many bytes as a rule, shared
    /// by every use, instead of a copy per use (the later tries of a schema whose regex outgrew
    /// `max_regex_bytes`, [`SHARED_RULE_BYTES`]; see [`schema_to_rules_by`]).
    share_refs: Option<usize>,
    /// Translations, merges and negations in progress (at most `max_nesting`).
    nesting: usize,
    /// [`crate::Limits::max_schema_nesting`].
    max_nesting: usize,
    /// [`crate::Limits::max_regex_bytes`], for each subschema's regex by `measure` (for
    /// [`Measure::Held`], all held beyond what was held at `held_at`).
    max_regex_bytes: usize,
    measure: Measure,
    held_at: usize,
    /// [`Translator::keys_outside`] by sorted names.
    keys_outside: rustc_hash::FxHashMap<Vec<String>, Re>,
}

/// The sizes above which a reference target becomes a shared rule, one per try after the first
/// (which copies every target into each use): sharing only large targets keeps most of the
/// schema a plain regex; smaller ones are shared only when that was not enough.
const SHARED_RULE_BYTES: [usize; 2] = [16 << 10, 512];

fn unsupported(keyword: &str, pointer: &str, reason: &str) -> SchemaError {
    SchemaError::Unsupported {
        keyword: keyword.into(),
        pointer: pointer.into(),
        reason: reason.into(),
    }
}

fn invalid(pointer: &str, message: impl Into<String>) -> SchemaError {
    SchemaError::Invalid {
        pointer: pointer.into(),
        message: message.into(),
    }
}

fn child(pointer: &str, key: &str) -> String {
    format!("{pointer}/{}", key.replace('~', "~0").replace('/', "~1"))
}

/// Leaf text with an empty language, for the builders of leaf languages (number ranges).
const NOTHING: &str = r"[^\x00-\x{10FFFF}]";

/// Leaf text of any one of `parts` (none: [`NOTHING`]).
fn alt_text(parts: &[String]) -> String {
    match parts {
        [] => NOTHING.to_owned(),
        [one] => one.clone(),
        _ => format!("(?:{})", parts.join("|")),
    }
}

/// A leaf language built as text, with [`NOTHING`] as [`Re::nothing`].
fn leaf(text: String) -> Re {
    if text == NOTHING {
        Re::nothing()
    } else {
        Re::text(text)
    }
}

/// A value's canonical JSON text as a literal.
fn literal(v: &Value) -> Re {
    Re::lit(&serde_json::to_string(v).expect("a Value serializes"))
}

/// An `enum`/`const` value as a regex: its canonical text in the layout `sep`, where a number
/// with an integral value may also be written with `.0` (JSON Schema compares numbers by value: `1`
/// and `1.0` are equal).
fn value_literal(v: &Value, sep: &Separators) -> Re {
    // Items or members with the separator between them.
    let joined = |parts: Vec<Re>| {
        let mut out = Vec::with_capacity(2 * parts.len());
        for (i, p) in parts.into_iter().enumerate() {
            if i > 0 {
                out.push(sep.comma.clone());
            }
            out.push(p);
        }
        Re::seq(out)
    };
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 => {
                let i = f as i64;
                Re::text(format!("{i}|{i}\\.0"))
            }
            _ => literal(v),
        },
        Value::Array(a) => {
            let items = a.iter().map(|x| value_literal(x, sep)).collect();
            sep.bracketed(r"\[", joined(items), r"\]")
        }
        Value::Object(m) => {
            let members = m
                .iter()
                .map(|(k, x)| {
                    Re::seq([
                        literal(&Value::String(k.clone())),
                        sep.colon.clone(),
                        value_literal(x, sep),
                    ])
                })
                .collect();
            sep.bracketed(r"\{", joined(members), r"\}")
        }
        _ => literal(v),
    }
}

/// The non-negative integer keyword `key` of `m`, if present.
fn count(m: &Map<String, Value>, pointer: &str, key: &str) -> Result<Option<u64>> {
    m.get(key).map(|v| as_count(v, pointer, key)).transpose()
}

fn as_count(v: &Value, pointer: &str, keyword: &str) -> Result<u64> {
    v.as_u64()
        .or_else(|| {
            v.as_f64()
                .filter(|f| *f >= 0.0 && f.fract() == 0.0)
                .map(|f| f as u64)
        })
        .ok_or_else(|| invalid(&child(pointer, keyword), "expected a non-negative integer"))
}

impl Translator<'_> {
    /// The regex of values that `schema` (at `pointer`) accepts.
    /// Runs `f` one level deeper, or refuses past `max_nesting`.
    fn nested<T>(&mut self, pointer: &str, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        if self.nesting >= self.max_nesting {
            return Err(SchemaError::TooDeep {
                pointer: pointer.into(),
                limit: self.max_nesting,
            });
        }
        self.nesting += 1;
        let out = stacker::maybe_grow(STACK_RED_ZONE, STACK_SEGMENT, || f(self));
        self.nesting -= 1;
        out
    }

    fn value(&mut self, schema: &Value, pointer: &str) -> Result<Re> {
        if std::time::Instant::now() > self.deadline {
            return Err(SchemaError::OutOfTime {
                pointer: pointer.into(),
            });
        }
        let re = self.nested(pointer, |t| t.value_unchecked(schema, pointer))?;
        let size = match self.measure {
            Measure::Held => re::held().saturating_sub(self.held_at),
            Measure::Text => re.len(),
        };
        if size > self.max_regex_bytes {
            return Err(SchemaError::TooLarge {
                pointer: pointer.into(),
                limit: self.max_regex_bytes,
            });
        }
        Ok(re)
    }

    fn value_unchecked(&mut self, schema: &Value, pointer: &str) -> Result<Re> {
        let empty = Map::new();
        let m = match schema {
            Value::Bool(true) if self.unevaluated.is_empty() => {
                return Ok(self.any_value(self.options.any_value_depth))
            }
            // An enclosing schema's `unevaluated*` still applies to what `true` accepts here.
            Value::Bool(true) => &empty,
            Value::Bool(false) => return Ok(Re::nothing()),
            Value::Object(m) => m,
            _ => return Err(invalid(pointer, "a schema is an object or a boolean")),
        };
        for k in m.keys() {
            let k = k.as_str();
            if UNSUPPORTED.contains(&k) {
                return Err(unsupported(k, pointer, "this keyword is not supported yet"));
            }
            if !SUPPORTED.contains(&k)
                && !ANNOTATIONS.contains(&k)
                && !self.options.ignore_unknown_keywords
            {
                return Err(SchemaError::UnknownKeyword {
                    keyword: k.into(),
                    pointer: pointer.into(),
                });
            }
        }
        if let Some((rest, found)) = self.hoist_unevaluated(m) {
            let inner = self.unevaluated.within(found);
            let outer = std::mem::replace(&mut self.unevaluated, inner);
            let out = self.value(&rest, pointer);
            self.unevaluated = outer;
            return out;
        }
        if let Some(r) = m.get("$ref") {
            return self.reference(m, r, pointer);
        }
        if let Some(expanded) = self.expand_conditionals(m, pointer)? {
            return self.value(&expanded, pointer);
        }
        if let Some(leaves) = Self::not_leaves(m) {
            return self.without_leaf(m, &leaves, pointer);
        }
        if let Some(n) = m.get("not") {
            let type_only = n.is_boolean()
                || n.as_object()
                    .is_some_and(|n| Self::constraining(n, &[]) == ["type"]);
            if !type_only {
                // m ∧ ¬n, with ¬n spelled out as a schema.
                let keep = self.has_unevaluated(m);
                let mut rest = m.clone();
                rest.remove("not");
                let positive = Some(Value::Object(rest.clone()));
                let negated = self.negate_keeping(n, &child(pointer, "not"), keep, positive)?;
                return self.value(&json!({"allOf": [rest, negated]}), pointer);
            }
        }
        for comb in ["anyOf", "oneOf", "allOf"] {
            if let Some(branches) = m.get(comb) {
                return self.combinator(m, comb, branches, pointer);
            }
        }
        if m.contains_key("enum") || m.contains_key("const") {
            return self.enumeration(m, pointer);
        }
        let types: Vec<&str> = match m.get("type") {
            None => TYPES.to_vec(),
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts
                .iter()
                .map(|t| {
                    t.as_str()
                        .ok_or_else(|| invalid(pointer, "type names are strings"))
                })
                .collect::<Result<_>>()?,
            Some(_) => {
                return Err(invalid(
                    &child(pointer, "type"),
                    "expected a string or array",
                ))
            }
        };
        let types = self.without_negated_types(m, types, pointer)?;
        let mut parts = Vec::new();
        let has_number = types.contains(&"number");
        for t in &types {
            let r = match *t {
                "null" => Re::text("null"),
                "boolean" => Re::text("true|false"),
                "object" => self.object(m, pointer)?,
                "array" => self.array(m, pointer)?,
                "string" => self.string(m, pointer)?,
                "number" => self.number(m, pointer, false)?,
                "fractional" => self.number(m, pointer, true)?,
                // Integers are numbers: covered by "number" when both are listed.
                "integer" if has_number => continue,
                "integer" => self.integer(m, pointer)?,
                other => {
                    return Err(invalid(
                        &child(pointer, "type"),
                        format!("unknown type {other:?}"),
                    ))
                }
            };
            parts.push(r);
        }
        Ok(Re::alt(parts))
    }

    /// Applies a `not` that only names types: `not: {type: …}` removes those types (`number`
    /// takes `integer` with it; removing only `integer` from `number` leaves the pseudo-type
    /// `fractional`), `not: false` removes nothing. Other `not`s were rewritten before.
    fn without_negated_types<'t>(
        &self,
        m: &Map<String, Value>,
        mut types: Vec<&'t str>,
        pointer: &str,
    ) -> Result<Vec<&'t str>> {
        let Some(not) = m.get("not") else {
            return Ok(types);
        };
        let here = child(pointer, "not");
        let refuse = || {
            unsupported(
                "not",
                pointer,
                "only `not: {type: …}` and `not: false` are supported yet",
            )
        };
        let excluded: Vec<String> = match not {
            Value::Bool(false) => return Ok(types),
            Value::Bool(true) => return Ok(Vec::new()),
            Value::Object(n) => {
                if Self::constraining(n, &[]) != ["type"] {
                    return Err(refuse());
                }
                match &n["type"] {
                    Value::String(t) => vec![t.clone()],
                    Value::Array(ts) => ts
                        .iter()
                        .map(|t| {
                            t.as_str()
                                .map(str::to_owned)
                                .ok_or_else(|| invalid(&here, "type names are strings"))
                        })
                        .collect::<Result<_>>()?,
                    _ => return Err(invalid(&here, "expected a string or array")),
                }
            }
            _ => return Err(invalid(&here, "a schema is an object or a boolean")),
        };
        let gone = |t: &str| {
            excluded
                .iter()
                .any(|e| e == t || (e == "number" && t == "integer"))
        };
        let fractional =
            excluded.iter().any(|e| e == "integer") && types.contains(&"number") && !gone("number");
        types.retain(|t| !gone(t));
        if fractional {
            // Numbers that are not integers: a pseudo-type for `value`.
            types.retain(|t| *t != "number" && *t != "integer");
            types.push("fractional");
        }
        Ok(types)
    }

    /// A schema with `unevaluated*` next to in-place applicators (`$ref`, `allOf`, `anyOf`,
    /// `oneOf`, and the conditionals and `not` that are rewritten into them): the schema without
    /// those keywords, and the keywords (see [`Unevaluated`]); `None` if there is nothing to
    /// take out.
    fn hoist_unevaluated(&self, m: &Map<String, Value>) -> Option<(Value, Unevaluated)> {
        if !(m.contains_key("unevaluatedProperties") || m.contains_key("unevaluatedItems")) {
            return None;
        }
        let applies = [
            "allOf",
            "anyOf",
            "oneOf",
            "if",
            "dependentSchemas",
            "dependencies",
            "not",
        ]
        .iter()
        .any(|c| m.contains_key(*c))
            || (m.contains_key("$ref") && self.draft >= Draft::D2019);
        if !applies {
            return None;
        }
        let mut rest = m.clone();
        let found = Unevaluated {
            properties: rest.remove("unevaluatedProperties"),
            items: rest.remove("unevaluatedItems"),
        };
        Some((Value::Object(rest), found))
    }

    /// The schema `unevaluated*` (`m`'s own, or an enclosing schema's at this location) imposes on
    /// what the rest of `m` leaves unevaluated: both apply when both are present. Drafts before
    /// 2019-09 do not have the keyword.
    fn unevaluated(&self, m: &Map<String, Value>, of: UnevaluatedOf) -> Option<Value> {
        if self.draft < Draft::D2019 {
            return None;
        }
        let inherited = match of {
            UnevaluatedOf::Properties => self.unevaluated.properties.as_ref(),
            UnevaluatedOf::Items => self.unevaluated.items.as_ref(),
        };
        match (m.get(of.keyword()), inherited) {
            (None, None) => None,
            (Some(one), None) | (None, Some(one)) => Some(one.clone()),
            (Some(own), Some(outer)) => Some(json!({ "allOf": [own, outer] })),
        }
    }

    /// Whether `unevaluated*` applies where `m` is translated (its own, or an enclosing
    /// schema's at this location).
    fn has_unevaluated(&self, m: &Map<String, Value>) -> bool {
        m.contains_key("unevaluatedProperties")
            || m.contains_key("unevaluatedItems")
            || !self.unevaluated.is_empty()
    }

    /// [`Self::value`] of a child location (a property's value or name, an item): the enclosing
    /// location's `unevaluated*` does not apply there.
    fn child_value(&mut self, schema: &Value, pointer: &str) -> Result<Re> {
        let outer = std::mem::take(&mut self.unevaluated);
        let out = self.value(schema, pointer);
        self.unevaluated = outer;
        out
    }

    /// [`Self::negate`]; with `keep_evaluated`, alternatives that would write properties or items
    /// only the failed subschema names are left out (a failed subschema evaluates nothing, so
    /// `unevaluated*` would apply to them): narrower, still sound. `positive`: the schema the
    /// negation will be intersected with; the result `N` then satisfies
    /// `positive ∧ N = positive ∧ ¬schema`, which is all the translator needs.
    fn negate_keeping(
        &mut self,
        schema: &Value,
        pointer: &str,
        keep_evaluated: bool,
        positive: Option<Value>,
    ) -> Result<Value> {
        let old = self.keep_evaluated;
        self.keep_evaluated |= keep_evaluated;
        let outer = std::mem::replace(&mut self.positive, positive);
        let out = self.negate(schema, pointer, 0);
        self.positive = outer;
        self.keep_evaluated = old;
        out
    }

    /// The only property names an object valid for `schema` can have: its `properties`, where
    /// the schema object (after resolving a `$ref`) has `additionalProperties: false` and no
    /// `patternProperties`; `None` otherwise. Whatever else the schema applies in place, its own
    /// `additionalProperties` refuses every other name, so this holds for every valid instance.
    fn closed_names(&mut self, schema: &Value, pointer: &str) -> Option<Vec<String>> {
        let s = self.inline_ref(schema, pointer, 0).ok()?;
        let m = s.as_object()?;
        if m.get("additionalProperties") != Some(&Value::Bool(false))
            || m.contains_key("patternProperties")
        {
            return None;
        }
        Some(match m.get("properties") {
            Some(Value::Object(p)) => p.keys().cloned().collect(),
            Some(_) => return None,
            None => Vec::new(),
        })
    }

    /// The strings of `a` that are (`Op::And`) or are not (`Op::AndNot`) strings of `b`, as an
    /// intersection term ([`Re::and`]): the grammar's lazy DFA builds the states of the product
    /// that decoding visits, each checked for emptiness, so nothing is built here and no product
    /// has a size limit of its own ([`crate::Limits`] bounds the states). A rule reference in
    /// either operand is `Unsupported` at `keyword`: intersection is defined on regular
    /// languages only.
    fn combine(&self, a: &Re, b: &Re, op: Op, keyword: &str, pointer: &str) -> Result<Re> {
        if a.has_rule() || b.has_rule() {
            return Err(unsupported(
                keyword,
                pointer,
                "combining keywords over a rule: a recursive reference (set \
                 max_recursion_depth to unroll it), or a large one shared by its uses",
            ));
        }
        Ok(Re::and(a.clone(), b.clone(), op == Op::AndNot))
    }

    /// Keywords other than annotations and those listed.
    fn constraining<'m>(m: &'m Map<String, Value>, except: &[&str]) -> Vec<&'m str> {
        m.keys()
            .map(String::as_str)
            .filter(|k| !ANNOTATIONS.contains(k) && !except.contains(k))
            .collect()
    }

    fn reference(&mut self, m: &Map<String, Value>, r: &Value, pointer: &str) -> Result<Re> {
        let r = r
            .as_str()
            .ok_or_else(|| invalid(&child(pointer, "$ref"), "expected a string"))?;
        let Some(fragment) = r.strip_prefix('#') else {
            return Err(unsupported(
                "$ref",
                pointer,
                &format!(
                    "remote reference {r:?}: no schema of this document has that URI; give the \
                     document it names with `--schema-resource` (or `schema::bundle`)"
                ),
            ));
        };
        // Keywords next to the reference apply to its target too (from 2019-09), and so does an
        // enclosing schema's `unevaluated*` at this location: the target is then not a plain
        // copy, shared or recursed into as a rule.
        let beside = self.draft >= Draft::D2019
            && (!Self::constraining(m, &["$ref"]).is_empty() || !self.unevaluated.is_empty());
        let plain = !beside;
        if self.share_refs.is_some() && plain {
            if let Some(k) = self.rules.iter().position(|x| x == r) {
                return Ok(Re::rule(k + 1));
            }
        }
        let unrolled = self.refs.iter().filter(|x| *x == r).count();
        if unrolled > 0 {
            match self.options.max_recursion_depth {
                Some(d) if unrolled > d => return Ok(Re::nothing()),
                Some(_) => {}
                None if beside => {
                    return Err(unsupported(
                        "$ref",
                        pointer,
                        &format!(
                            "recursive reference {r:?} with keywords next to it (set \
                             max_recursion_depth to unroll it)"
                        ),
                    ))
                }
                None => {
                    // A rule of the grammar: the target is translated once, as its body.
                    if resolve_fragment(self.root, fragment).is_none() {
                        return Err(unsupported(
                            "$ref",
                            pointer,
                            &format!("{r:?} does not resolve to a subschema of this document"),
                        ));
                    }
                    let k = match self.rules.iter().position(|x| x == r) {
                        Some(k) => k,
                        None => {
                            self.rules.push(r.to_owned());
                            self.rules.len() - 1
                        }
                    };
                    return Ok(Re::rule(k + 1));
                }
            }
        }
        let target = resolve_fragment(self.root, fragment).ok_or_else(|| {
            unsupported(
                "$ref",
                pointer,
                &format!("{r:?} does not resolve to a subschema of this document"),
            )
        })?;
        self.refs.push(r.to_owned());
        let out = if self.draft >= Draft::D2019 && !Self::constraining(m, &["$ref"]).is_empty() {
            // Keywords next to $ref apply too: merge them into the target.
            self.inline_ref(&Value::Object(m.clone()), pointer, 0)
                .and_then(|merged| self.value(&merged, pointer))
        } else {
            self.value(target, r)
        };
        self.refs.pop();
        match out {
            Ok(re) if self.share_refs.is_some_and(|min| plain && re.len() > min) => {
                self.rules.push(r.to_owned());
                Ok(Re::rule(self.rules.len()))
            }
            out => out,
        }
    }

    fn combinator(
        &mut self,
        m: &Map<String, Value>,
        comb: &str,
        branches: &Value,
        pointer: &str,
    ) -> Result<Re> {
        let branches = branches
            .as_array()
            .filter(|b| !b.is_empty())
            .ok_or_else(|| invalid(&child(pointer, comb), "expected a non-empty array"))?;
        // The schema's own keywords apply to every branch: intersection distributes over union.
        // Its definitions are not keywords (references are pointers from the root): a root's
        // `$defs` would be copied into every branch.
        let mut rest = m.clone();
        rest.remove(comb);
        rest.remove("$defs");
        rest.remove("definitions");
        let rest = Value::Object(rest);
        let has_rest = !Self::constraining(rest.as_object().unwrap(), &[]).is_empty();
        let here = child(pointer, comb);
        if comb == "allOf" {
            let mut acc = rest;
            for b in branches {
                acc = self.merge(&acc, b, pointer, 0)?;
            }
            return self.value(&acc, pointer);
        }
        let branches: Vec<Value> = if has_rest {
            branches
                .iter()
                .map(|b| self.merge(&rest, b, pointer, 0))
                .collect::<Result<_>>()?
        } else {
            branches.clone()
        };
        let branches = if comb == "oneOf" {
            // Sound only if no instance matches two branches: see `negate::one_of`.
            self.one_of(&branches, &here)?
        } else {
            branches
        };
        self.branches(&branches, &here)
    }

    fn branches(&mut self, branches: &[Value], pointer: &str) -> Result<Re> {
        let parts = branches
            .iter()
            .enumerate()
            .map(|(i, b)| self.value(b, &child(pointer, &i.to_string())))
            .collect::<Result<Vec<_>>>()?;
        Ok(Re::alt(parts))
    }

    /// `enum`/`const`, keeping only the values the rest of the schema accepts.
    fn enumeration(&mut self, m: &Map<String, Value>, pointer: &str) -> Result<Re> {
        let mut values: Vec<Value> = match m.get("enum") {
            Some(Value::Array(vs)) => vs.clone(),
            Some(_) => return Err(invalid(&child(pointer, "enum"), "expected an array")),
            None => Vec::new(),
        };
        if let Some(c) = m.get("const") {
            values = if m.contains_key("enum") {
                values.into_iter().filter(|v| json_equal(v, c)).collect()
            } else {
                vec![c.clone()]
            };
        }
        let mut rest = m.clone();
        rest.remove("enum");
        rest.remove("const");
        let constraining = Self::constraining(&rest, &[]);
        let keep: Vec<Re> = if constraining.is_empty() {
            values.iter().map(|v| value_literal(v, &self.sep)).collect()
        } else if constraining == ["type"] {
            // The common `{type, enum}`: filter by type without building a regex.
            let types: Vec<&str> = match &rest["type"] {
                Value::String(t) => vec![t.as_str()],
                Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                _ => {
                    return Err(invalid(
                        &child(pointer, "type"),
                        "expected a string or array",
                    ))
                }
            };
            let of_type = |v: &Value| match v {
                Value::Null => types.contains(&"null"),
                Value::Bool(_) => types.contains(&"boolean"),
                Value::String(_) => types.contains(&"string"),
                Value::Array(_) => types.contains(&"array"),
                Value::Object(_) => types.contains(&"object"),
                Value::Number(n) => {
                    types.contains(&"number")
                        || (types.contains(&"integer")
                            && n.as_f64().is_some_and(|f| f.fract() == 0.0))
                }
            };
            values
                .iter()
                .filter(|v| of_type(v))
                .map(|v| value_literal(v, &self.sep))
                .collect()
        } else {
            let rest_re = self.value(&Value::Object(rest), pointer)?;
            let full = object::Narrowing::new(&rest_re, "enum", pointer)?;
            values
                .iter()
                .filter(|v| full.is_match(self.options.whitespace.render(v).as_bytes()))
                .map(|v| value_literal(v, &self.sep))
                .collect()
        };
        Ok(Re::alt(keep))
    }

    fn any_value(&self, depth: usize) -> Re {
        if depth == 0 {
            return scalar();
        }
        any_value_over(&self.any_value(depth - 1), &self.sep)
    }
}

thread_local! {
    /// Built once per thread and shared, so every use lowers to the same term once.
    static SCALAR: Re = Re::text(format!("null|true|false|{NUMBER}|\"{STR_CHAR}*\""));
    static ANY_STRING: Re = Re::text(format!("\"{STR_CHAR}*\""));
}

/// Any JSON scalar.
fn scalar() -> Re {
    SCALAR.with(Re::clone)
}

/// Any JSON string.
fn any_string() -> Re {
    ANY_STRING.with(Re::clone)
}

/// Zero or more `item`s with `comma` between them.
fn separated(item: &Re, comma: &Re) -> Re {
    Re::opt(Re::seq([
        item.clone(),
        Re::star(Re::seq([comma.clone(), item.clone()])),
    ]))
}

/// An object whose members have any name and a value in `value`.
fn object_of(value: &Re, sep: &Separators) -> Re {
    let member = Re::seq([any_string(), sep.colon.clone(), value.clone()]);
    sep.bracketed(r"\{", separated(&member, &sep.comma), r"\}")
}

/// Any JSON value whose array items and member values are `inner`.
fn any_value_over(inner: &Re, sep: &Separators) -> Re {
    Re::alt([
        scalar(),
        sep.bracketed(r"\[", separated(inner, &sep.comma), r"\]"),
        object_of(inner, sep),
    ])
}

/// `json_object`: a JSON object whose values are any JSON value at any depth (the root, and one
/// recursive rule for a value, in the form of [`schema_to_rules_by`]), laid out as `whitespace`
/// lays out a schema's output. An object at the top, as OpenAI's and vLLM's `json_object` mean.
pub(crate) fn json_object_rules(whitespace: Whitespace) -> (Re, Vec<Re>) {
    let value = Re::rule(1);
    let sep = whitespace.separators();
    (object_of(&value, &sep), vec![any_value_over(&value, &sep)])
}

/// JSON equality as JSON Schema defines it (1 == 1.0).
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_equal(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_equal(v, w)))
        }
        _ => a == b,
    }
}

/// The subschema a local `$ref` points at: `#` (the root) or `#/a/b` (a JSON Pointer, with
/// percent-encoding undone).
fn resolve_local<'v>(root: &'v Value, reference: &str) -> Option<&'v Value> {
    resolve_fragment(root, reference.strip_prefix('#')?)
}

fn resolve_fragment<'v>(root: &'v Value, fragment: &str) -> Option<&'v Value> {
    let decoded = percent_decode(fragment);
    if decoded.is_empty() {
        Some(root)
    } else if decoded.starts_with('/') {
        root.pointer(&decoded)
    } else {
        None
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
