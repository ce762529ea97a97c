//! Chat templates: the model's Jinja template (`tokenizer.chat_template`) rendered with minijinja.
//!
//! The environment matches what Hugging Face transformers and llama-cpp-python give a template:
//! `trim_blocks` and `lstrip_blocks` on, `raise_exception(msg)`, `strftime_now(fmt)`, loop controls,
//! `tojson`, and Python string/dict methods (`.strip()`, `.startswith()`, `.items()`) through
//! minijinja-contrib's pycompat layer.

use minijinja::{Environment, ErrorKind, Value};
use serde::Serialize;

use crate::error::{Result, TokenizerError};

/// One chat message. `content` is plain text; templates that expect a list of parts get a string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// The variables a chat template sees beside `messages`, `add_generation_prompt`, `bos_token` and
/// `eos_token` (which they cannot replace): transformers' `chat_template_kwargs`.
///
/// Where they leave `enable_thinking` out, quarry sets it to whether the reply thinks first
/// ([`ChatVars::for_reply`]: a request in a reasoning mode), so by default to `false`. A record
/// is shaped by its constraint from its first byte, with no room for a reasoning block, and the
/// hybrid-reasoning templates that read the variable (Qwen3's, SmolLM3's) then open the reply
/// where an answer begins (Qwen3's after an empty `<think></think>`), as their authors advise
/// for answers without reasoning. A template that reads no such variable ignores it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct ChatVars(pub serde_json::Map<String, serde_json::Value>);

impl ChatVars {
    /// The variables a reply that thinks first (`thinking`) or not is rendered with:
    /// `enable_thinking = thinking` unless these set it.
    pub fn for_reply(&self, thinking: bool) -> ChatVars {
        let mut vars = self.clone();
        vars.0
            .entry("enable_thinking")
            .or_insert(serde_json::Value::Bool(thinking));
        vars
    }

    /// Parses `KEY=VALUE` (a command line's `--chat-var`): VALUE as JSON where it is JSON
    /// (`true`, `3`, `[1]`), else as a string.
    pub fn parse_pair(pair: &str) -> std::result::Result<(String, serde_json::Value), String> {
        let (key, value) = pair
            .split_once('=')
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| format!("`{pair}` is not KEY=VALUE"))?;
        let value = serde_json::from_str(value)
            .unwrap_or_else(|_| serde_json::Value::String(value.to_string()));
        Ok((key.to_string(), value))
    }
}

/// A compiled chat template plus the special-token strings templates refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source`. A syntax error is reported with its line.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(render_err)?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, source.to_owned())
            .map_err(render_err)?;
        Ok(Self {
            env,
            source: source.to_owned(),
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` for a reply that does not think first (`enable_thinking = false`).
    /// With `add_generation_prompt` the text ends where the assistant's reply begins.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with(
            messages,
            add_generation_prompt,
            &ChatVars::default().for_reply(false),
        )
    }

    /// Renders `messages` with `vars` beside them, as given.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        vars: &ChatVars,
    ) -> Result<String> {
        let tmpl = self.env.get_template(NAME).map_err(render_err)?;
        tmpl.render(minijinja::context! {
            messages => Value::from(minijinja::value::Serde(messages)),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
            ..Value::from(minijinja::value::Serde(&vars.0))
        })
        .map_err(render_err)
    }
}

fn render_err(e: minijinja::Error) -> TokenizerError {
    let mut msg = e.to_string();
    if let Some(line) = e.line() {
        msg = format!("{msg} (template line {line})");
    }
    TokenizerError::ChatTemplate(msg)
}

/// `strftime_now(fmt)` as used by Llama 3 templates. Only the date parts those templates use are
/// supported (`%d %b %Y %m %B %y`); the date is UTC.
fn strftime_now(fmt: String) -> Result<String, minijinja::Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y % 100)),
            Some('B') => out.push_str(MONTHS[m as usize - 1]),
            Some('b') => out.push_str(&MONTHS[m as usize - 1][..3]),
            Some('%') => out.push('%'),
            other => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: unsupported directive %{}",
                        other.unwrap_or(' ')
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn renders_with_python_methods_and_trim_blocks() {
        let src = "{% for m in messages %}\n<{{ m.role }}>{{ m.content.strip() }}\n{% endfor %}\n\
                   {% if add_generation_prompt %}<assistant>{% endif %}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let out = t
            .render(&[ChatMessage::new("user", "  hi  ")], true)
            .unwrap();
        assert_eq!(out, "<user>hi\n<assistant>");
    }

    #[test]
    fn chat_vars_reach_the_template_and_cannot_replace_its_own() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{{ m['content'] }}{% endfor %}\
             {% if add_generation_prompt %}|{% if not enable_thinking %}<think></think>{% endif %}\
             {{ style | default('plain') }}{% endif %}",
            "",
            "",
        )
        .unwrap();
        let msgs = [ChatMessage::new("user", "hi")];
        assert_eq!(t.render(&msgs, true).unwrap(), "hi|<think></think>plain");
        // A reasoning reply thinks unless the variables say otherwise.
        let none = ChatVars::default();
        assert_eq!(
            t.render_with(&msgs, true, &none.for_reply(true)).unwrap(),
            "hi|plain"
        );
        let mut vars = ChatVars::default();
        for pair in ["enable_thinking=false", "style=terse", "messages=[]"] {
            let (k, v) = ChatVars::parse_pair(pair).unwrap();
            vars.0.insert(k, v);
        }
        assert_eq!(
            t.render_with(&msgs, true, &vars.for_reply(true)).unwrap(),
            "hi|<think></think>terse"
        );
        assert!(ChatVars::parse_pair("=1").is_err() && ChatVars::parse_pair("x").is_err());
    }

    #[test]
    fn raise_exception_is_an_error_with_its_message() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        let err = t.render(&[], false).unwrap_err().to_string();
        assert!(err.contains("no system role"), "{err}");
    }

    #[test]
    fn syntax_error_names_the_line() {
        let err = ChatTemplate::new("ok\n{% if %}", "", "")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2"), "{err}");
    }
}
