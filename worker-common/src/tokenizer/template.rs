//! Chat templates: the GGUF's `tokenizer.chat_template` (a Jinja template, as shipped in the
//! model's Hugging Face `tokenizer_config.json`) rendered with MiniJinja.
//!
//! What the template sees mirrors llama.cpp's server (b11434, `common/chat.cpp`) and
//! Hugging Face's `apply_chat_template`, which the reference fixtures are rendered with
//! (`scripts/gen-tokenizer-fixtures.py`, Python `jinja2`):
//!
//! - variables `messages` (a list of `{role, content}` maps), `add_generation_prompt`,
//!   `bos_token`, `eos_token` (the special tokens' text), and `enable_thinking = true` (llama.cpp
//!   passes it; templates that read it, such as Qwen3's, then default to thinking as in HF);
//! - the function `raise_exception(message)`, which fails the render with
//!   [`TemplateError::Raised`];
//! - Jinja's `trim_blocks` and `lstrip_blocks` on, `keep_trailing_newline` off: HF's and
//!   llama.cpp's settings for chat templates;
//! - Python string/dict/list methods (`.strip()`, `.startswith()`, `.items()`, …) through
//!   `minijinja-contrib`'s `pycompat` callback, and `{% break %}`/`{% continue %}` (HF enables
//!   `jinja2.ext.loopcontrols`), and the `tojson` filter.
//!
//! - `tools` (OpenAI's tool list, when a request has one) and a message's extra keys
//!   (`tool_calls`, `tool_call_id`, `name`), with `tojson` writing what HF's filter writes.
//! - the function `strftime_now(format)` (llama.cpp's server offers it; gpt-oss's template
//!   writes the current date with it, Llama 3.x's may): the current time as C's `strftime`
//!   formats it, in UTC where llama.cpp uses local time (`template/strftime.rs`).
//!
//! Not provided: the `documents` variable and HF's `{% generation %}` training tag. A template
//! using them fails to compile or render with an error naming the line, or takes its
//! `is defined` branch. Booleans print as Python prints them (`True`), as in jinja2.
//!
//! A model without `tokenizer.chat_template` has no [`ChatTemplate`]: its prompt is tokenized
//! as is (CONTRACT.md, `raw`). llama.cpp's server would fall back to ChatML there; we do not,
//! because a base model (gemma-3-270m) was not trained on ChatML.

use std::fmt;
use std::sync::Arc;

use minijinja::value::{Enumerator, Object, ObjectRepr};
use minijinja::{Environment, Error, ErrorKind, Value, context};

use super::template_json;

mod strftime;

/// The name the template is registered under in its private environment.
const TEMPLATE_NAME: &str = "tokenizer.chat_template";

/// MiniJinja instructions one render may execute. Templates come from model files, which users
/// download from anywhere: a loop nest must end a request, not hang the worker. This admits
/// conversations of thousands of messages (a test renders 1,000) and stops a runaway render
/// within a fraction of a second.
pub const RENDER_FUEL: u64 = 2_000_000;

/// Most bytes one render may produce (a prompt this long is far beyond any context).
pub const MAX_RENDER_BYTES: usize = 16 << 20;

/// Deepest nesting of macro calls and blocks, well above what chat templates use.
const RECURSION_LIMIT: usize = 64;

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant` (passed through: templates decide what they accept).
    pub role: String,
    /// The message text.
    pub content: String,
    /// Further keys of the message as a JSON object's text (`tool_calls`, `tool_call_id`,
    /// `name`), when it has any.
    pub extra: Option<String>,
}

impl ChatMessage {
    /// A message from its role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            extra: None,
        }
    }

    /// A message with further keys, which templates read as `message.<key>`.
    pub fn with_extra(
        role: impl Into<String>,
        content: impl Into<String>,
        extra: serde_json::Map<String, serde_json::Value>,
    ) -> Self {
        Self {
            extra: (!extra.is_empty()).then(|| serde_json::Value::Object(extra).to_string()),
            ..Self::new(role, content)
        }
    }
}

/// A message as the template sees it: a map with the keys `role` and `content`, then its
/// extra keys, enumerated in that order (a Python dict's insertion order, for templates that
/// iterate over a message). Any other key is undefined.
#[derive(Debug)]
struct MessageObject {
    role: Value,
    content: Value,
    extra: serde_json::Map<String, serde_json::Value>,
}

impl Object for MessageObject {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "role" => Some(self.role.clone()),
            "content" => Some(self.content.clone()),
            other => self.extra.get(other).map(template_json::to_value),
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let keys = ["role", "content"].into_iter().map(str::to_owned);
        let keys = keys.chain(self.extra.keys().cloned());
        Enumerator::Values(keys.map(Value::from).collect())
    }
}

/// A JSON text given to a template (a message's extra keys, the tools), parsed.
fn parse_json(what: &str, text: &str) -> Result<serde_json::Value, TemplateError> {
    serde_json::from_str(text).map_err(|err| TemplateError::Render {
        line: Line(None),
        detail: format!("{what} is not valid JSON: {err}"),
    })
}

/// A line of the template, when MiniJinja knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line(pub Option<usize>);

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(line) => write!(f, "line {line}"),
            None => f.write_str("unknown line"),
        }
    }
}

/// Why a chat template could not be compiled or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template source is not valid Jinja (as MiniJinja reads it).
    #[error("chat template syntax error at {line}: {detail}")]
    Syntax {
        /// Where the error is.
        line: Line,
        /// MiniJinja's description.
        detail: String,
    },
    /// The template called `raise_exception(message)`, e.g. for an unsupported role order.
    #[error("chat template raised an exception: {0}")]
    Raised(String),
    /// The render ran past its budget of instructions ([`RENDER_FUEL`]) or output bytes
    /// ([`MAX_RENDER_BYTES`]): the template loops or grows without bound.
    #[error("chat template exceeded its render budget ({0})")]
    Budget(String),
    /// Rendering failed otherwise (an unknown filter or function, a type error, …).
    #[error("chat template failed to render at {line}: {detail}")]
    Render {
        /// Where the error is.
        line: Line,
        /// MiniJinja's description.
        detail: String,
    },
    /// The renderer process could not be started or asked (see
    /// [`crate::tokenizer::render_process`]).
    #[error("{0}")]
    Process(String),
}

/// The message of a `raise_exception` call, attached to MiniJinja's error as its source so
/// that [`ChatTemplate::render`] can tell it from the engine's own failures.
#[derive(Debug)]
struct RaisedByTemplate(String);

impl fmt::Display for RaisedByTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedByTemplate {}

/// `raise_exception(message)`: fails the render with the template's message.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(
        Error::new(ErrorKind::InvalidOperation, "raise_exception called")
            .with_source(RaisedByTemplate(message)),
    )
}

/// A compiled chat template with the model's BOS and EOS texts.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source` once. `bos_token` and `eos_token` are the texts of the vocab's BOS and
    /// EOS tokens (llama.cpp: `token_to_piece(id, special = true)`; empty when the vocab has
    /// none).
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        let mut syntax = minijinja::syntax::SyntaxConfig::builder();
        syntax
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false);
        // The builder fails only on custom delimiters, which we do not set; still no panic.
        let syntax = syntax.build().map_err(|err| syntax_error(&err))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_fuel(Some(RENDER_FUEL));
        env.set_recursion_limit(RECURSION_LIMIT);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime::strftime_now);
        env.add_filter("tojson", template_json::tojson);
        // MiniJinja 3.0.5's code generator panics (`unreachable!`) on some templates its parser
        // accepts, e.g. `{% import 'x' as y|upper %}`: a model file must not crash the worker,
        // so such a template is refused like any other that does not compile.
        let added = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            env.add_template_owned(TEMPLATE_NAME, source.to_owned())
        }));
        match added {
            Ok(result) => result.map_err(|err| syntax_error(&err))?,
            Err(_) => {
                return Err(TemplateError::Syntax {
                    line: Line(None),
                    detail: "the template compiler failed on this template".into(),
                });
            }
        }
        Ok(Self {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// The BOS text given to [`ChatTemplate::new`].
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The EOS text given to [`ChatTemplate::new`].
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders `messages`; with `add_generation_prompt` the template appends the opening of the
    /// assistant's turn (e.g. `<|im_start|>assistant\n`). This is exactly the template's output,
    /// as Python's `jinja2` renders it for Hugging Face.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// [`ChatTemplate::render`] with `tools`, a JSON array's text (OpenAI's tool list), as the
    /// template's `tools` variable (undefined without it).
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&str>,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let mut values = Vec::with_capacity(messages.len());
        for m in messages {
            let extra = match &m.extra {
                Some(text) => match parse_json("a message's extra keys", text)? {
                    serde_json::Value::Object(map) => map,
                    _ => serde_json::Map::new(),
                },
                None => serde_json::Map::new(),
            };
            values.push(Value::from_object(MessageObject {
                role: Value::from(m.role.as_str()),
                content: Value::from(m.content.as_str()),
                extra,
            }));
        }
        let tools = match tools {
            Some(text) => template_json::to_value(&parse_json("tools", text)?),
            None => Value::UNDEFINED,
        };
        let ctx = context! {
            messages => values,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
            enable_thinking => true,
        };
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|err| render_error(&err))?;
        let mut out = BoundedOutput::default();
        template
            .render_captured_to(ctx, &mut out)
            .map_err(|err| match out.overflowed {
                true => TemplateError::Budget(format!("more than {MAX_RENDER_BYTES} bytes")),
                false => render_error(&err),
            })?;
        String::from_utf8(out.bytes).map_err(|err| TemplateError::Render {
            line: Line(None),
            detail: format!("output is not UTF-8: {err}"),
        })
    }

    /// Renders as [`ChatTemplate::render`], then removes a leading BOS text when the tokenizer
    /// adds BOS itself (`add_bos`) and a trailing EOS text when it adds EOS (`add_eos`), so the
    /// prompt does not get them twice. This is what llama.cpp's server tokenizes
    /// (`common_chat_template_direct_apply`).
    pub fn render_prompt(
        &self,
        messages: &[ChatMessage],
        tools: Option<&str>,
        add_generation_prompt: bool,
        add_bos: bool,
        add_eos: bool,
    ) -> Result<String, TemplateError> {
        let mut text = self.render_with_tools(messages, tools, add_generation_prompt)?;
        if add_bos && !self.bos_token.is_empty() && text.starts_with(&self.bos_token) {
            text.drain(..self.bos_token.len());
        }
        if add_eos && !self.eos_token.is_empty() && text.ends_with(&self.eos_token) {
            text.truncate(text.len() - self.eos_token.len());
        }
        Ok(text)
    }
}

/// The render's output, refusing to grow past [`MAX_RENDER_BYTES`].
#[derive(Default)]
struct BoundedOutput {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for BoundedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_RENDER_BYTES {
            self.overflowed = true;
            return Err(std::io::Error::other("render output budget exceeded"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn syntax_error(err: &Error) -> TemplateError {
    TemplateError::Syntax {
        line: Line(err.line()),
        detail: describe(err),
    }
}

fn render_error(err: &Error) -> TemplateError {
    if err.kind() == ErrorKind::OutOfFuel {
        return TemplateError::Budget(format!("more than {RENDER_FUEL} instructions"));
    }
    // The raised message may sit below MiniJinja's own wrapping errors (e.g. from a macro).
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(current) = source {
        if let Some(raised) = current.downcast_ref::<RaisedByTemplate>() {
            return TemplateError::Raised(raised.0.clone());
        }
        source = current.source();
    }
    TemplateError::Render {
        line: Line(err.line()),
        detail: describe(err),
    }
}

/// MiniJinja's kind and detail, without its multi-line debug rendering of the source.
fn describe(err: &Error) -> String {
    match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.kind().to_string(),
    }
}

#[cfg(test)]
mod tests;
