//! `/v1/chat/completions` and `/v1/completions` bodies, validated into the same [`JobSpec`] as
//! `/execute` (specs/OPENAI.md lists every field, taken or refused).

use serde_json::Value;
use worker_common::tokenizer::template::ChatMessage;

use super::tools::{Tools, message_extra};
use crate::api::fields::{Fields, json_object};
use crate::api::{FieldError, Grammar, JobSpec, Limits, Prompt};

/// Which of the two generation routes a body was sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`: `messages`, rendered with the chat template.
    Chat,
    /// `/v1/completions`: a raw text `prompt`.
    Completions,
}

/// A validated OpenAI request.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiRequest {
    /// The job, as `/execute` would run it.
    pub job: JobSpec,
    /// Stream `data:` chunks (else one JSON response).
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with `usage` and no choices.
    pub include_usage: bool,
    /// vLLM's `return_tokens_as_token_ids`: log-probability entries name tokens as
    /// `token_id:<id>` (exact where token text is ambiguous or not valid UTF-8).
    pub tokens_as_ids: bool,
    /// The tools a chat may call (none on completions, or with `tool_choice: none`).
    pub tools: Option<Tools>,
    /// `n`: choices to generate, each a job of its own (1 to [`MAX_CHOICES`]).
    pub choices: usize,
}

/// Most choices (`n`) a request may ask for: each is a sequence of its own, so a request of
/// many would take a batch's worth of the worker's slots.
pub const MAX_CHOICES: usize = 16;

/// Roles a chat message may have (`developer` is OpenAI's newer name for `system`).
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

impl OpenAiRequest {
    /// Parses and validates a body sent to `endpoint` with `content_type`.
    pub fn parse(
        endpoint: Endpoint,
        content_type: Option<&str>,
        body: &[u8],
        limits: Limits,
    ) -> Result<Self, Vec<FieldError>> {
        let object = json_object(content_type, body)?;
        let mut fields = Fields::new(&object);
        if let Some(model) = fields.get("model").filter(|model| !model.is_string()) {
            fields.wrong_type("model", "string", model);
        }
        let tools = match endpoint {
            Endpoint::Chat => fields.tools(),
            Endpoint::Completions => None,
        };
        let prompt = match endpoint {
            Endpoint::Chat => messages(&mut fields).map(|messages| Prompt::Chat {
                messages,
                tools: tools.as_ref().map(|tools| tools.json.clone()),
                continue_final: false,
            }),
            Endpoint::Completions => completion_prompt(&mut fields),
        };
        let max_tokens = max_tokens(&mut fields, endpoint, limits);
        let mut sampling = fields.sampling();
        sampling.logprobs = logprobs(&mut fields, endpoint);
        let seed = fields.seed();
        let stop = fields.stop("stop", true);
        let ignore_eos = fields.boolean("ignore_eos");
        let grammar = fields.response_format();
        fields.check_grammar_end(grammar.as_ref(), ignore_eos);
        let stream = fields.boolean("stream");
        let include_usage = stream_options(&mut fields);
        let tokens_as_ids = fields.boolean("return_tokens_as_token_ids");
        let choices = choice_count(&mut fields);
        let speculative = fields.boolean_or("speculative", true);
        refuse_unsupported(&mut fields, endpoint);
        if !fields.errors.is_empty() {
            return Err(fields.errors);
        }
        Ok(Self {
            job: JobSpec {
                prompt: prompt.unwrap_or(Prompt::Chat {
                    messages: Vec::new(),
                    tools: None,
                    continue_final: false,
                }),
                max_tokens,
                sampling,
                seed,
                stop,
                ignore_eos,
                grammar: grammar.map(|spec| Grammar {
                    spec,
                    field: "response_format",
                }),
                speculative,
            },
            stream,
            include_usage: stream && include_usage,
            tokens_as_ids,
            tools,
            choices,
        })
    }
}

/// `n`: an integer from 1 to [`MAX_CHOICES`] (absent: 1).
fn choice_count(fields: &mut Fields<'_>) -> usize {
    let Some(n) = fields.get("n") else {
        return 1;
    };
    match n.as_u64().and_then(|n| usize::try_from(n).ok()) {
        Some(count @ 1..=MAX_CHOICES) => count,
        _ => {
            let message = format!(
                "n must be an integer from 1 to {MAX_CHOICES}: each choice is a sequence of its own"
            );
            fields.fail("n", &format!("range(1, {MAX_CHOICES})"), message, Some(n));
            1
        }
    }
}

/// `max_completion_tokens` (chat; OpenAI's current name) or `max_tokens`: any count from 1,
/// capped by `--max-tokens-out`; absent: what the context leaves (resolved after tokenizing).
fn max_tokens(fields: &mut Fields<'_>, endpoint: Endpoint, limits: Limits) -> Option<u32> {
    let legacy = fields.max_tokens("max_tokens", limits);
    let current = match endpoint {
        Endpoint::Chat => fields.max_tokens("max_completion_tokens", limits),
        Endpoint::Completions => None,
    };
    current.or(legacy)
}

/// How many alternatives `logprobs` asks for: chat's `logprobs: true` with `top_logprobs`
/// (0 when absent), completions' `logprobs: n`.
fn logprobs(fields: &mut Fields<'_>, endpoint: Endpoint) -> Option<u32> {
    match endpoint {
        Endpoint::Completions => fields.top_logprobs("logprobs"),
        Endpoint::Chat => {
            let top = fields.top_logprobs("top_logprobs");
            let wanted = fields.boolean("logprobs");
            if top.is_some() && !wanted {
                let message = "top_logprobs needs logprobs: true".into();
                fields.fail("top_logprobs", "requires(logprobs)", message, None);
            }
            wanted.then(|| top.unwrap_or(0))
        }
    }
}

/// `stream_options.include_usage`, false when absent.
fn stream_options(fields: &mut Fields<'_>) -> bool {
    match fields.get("stream_options") {
        None => false,
        Some(Value::Object(options)) => match options.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(include)) => *include,
            Some(other) => {
                fields.wrong_type("stream_options.include_usage", "boolean", other);
                false
            }
        },
        Some(other) => {
            fields.wrong_type("stream_options", "object", other);
            false
        }
    }
}

/// `/v1/completions`' `prompt`: a string, or an array holding one string. The text is
/// tokenized as is (no chat template), as OpenAI's and llama-server's completions are.
fn completion_prompt(fields: &mut Fields<'_>) -> Option<Prompt> {
    let value = match fields.get("prompt") {
        None => {
            fields.fail("prompt", "required", "prompt is required".into(), None);
            return None;
        }
        Some(value) => value,
    };
    let text = match value {
        Value::String(text) => text,
        Value::Array(items) => match items.as_slice() {
            [Value::String(text)] => text,
            _ => {
                let message = "an array prompt must hold exactly one string (token-id and batch prompts are not supported)";
                fields.fail("prompt", "one_string", message.into(), None);
                return None;
            }
        },
        other => {
            fields.wrong_type("prompt", "string", other);
            return None;
        }
    };
    if text.is_empty() {
        fields.fail(
            "prompt",
            "non_empty",
            "prompt must not be empty".into(),
            None,
        );
        return None;
    }
    Some(Prompt::Text {
        text: text.clone(),
        raw: true,
    })
}

/// `messages`: a non-empty array of `{role, content}` objects.
fn messages(fields: &mut Fields<'_>) -> Option<Vec<ChatMessage>> {
    let value = match fields.get("messages") {
        None => {
            fields.fail("messages", "required", "messages is required".into(), None);
            return None;
        }
        Some(value) => value,
    };
    let Value::Array(items) = value else {
        fields.wrong_type("messages", "array", value);
        return None;
    };
    if items.is_empty() {
        let message = "messages must hold at least one message".into();
        fields.fail("messages", "non_empty", message, None);
        return None;
    }
    let messages: Vec<Option<ChatMessage>> = items
        .iter()
        .enumerate()
        .map(|(i, item)| message(fields, &format!("messages[{i}]"), item))
        .collect();
    messages.into_iter().collect()
}

/// One chat message; `None` after recording why it is refused.
fn message(fields: &mut Fields<'_>, at: &str, item: &Value) -> Option<ChatMessage> {
    let Value::Object(object) = item else {
        fields.wrong_type(at, "object", item);
        return None;
    };
    let role = match object.get("role") {
        Some(Value::String(role)) if ROLES.contains(&role.as_str()) => role.as_str(),
        Some(Value::String(role)) => {
            let message = format!("role {role:?} is not one of {}", ROLES.join(", "));
            fields.fail(&format!("{at}.role"), "one_of(roles)", message, None);
            return None;
        }
        Some(other) => {
            fields.wrong_type(&format!("{at}.role"), "string", other);
            return None;
        }
        None => {
            let message = "every message needs a role".into();
            fields.fail(&format!("{at}.role"), "required", message, None);
            return None;
        }
    };
    let extra = match message_extra(role, object) {
        Ok(extra) => extra,
        Err((key, message)) => {
            fields.fail(&format!("{at}.{key}"), "tool_fields", message, None);
            return None;
        }
    };
    let content = content(fields, at, role, object.get("content"))?;
    let role = if role == "developer" { "system" } else { role };
    Some(ChatMessage::with_extra(role, content, extra))
}

/// A message's text: a string, or an array of `{"type":"text","text":…}` parts joined; absent
/// or `null` only for an assistant message.
fn content(fields: &mut Fields<'_>, at: &str, role: &str, value: Option<&Value>) -> Option<String> {
    let field = format!("{at}.content");
    match value {
        Some(Value::String(text)) => Some(text.clone()),
        None | Some(Value::Null) if role == "assistant" => Some(String::new()),
        None | Some(Value::Null) => {
            let message = format!("a {role} message needs content");
            fields.fail(&field, "required", message, None);
            None
        }
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                match (part.get("type"), part.get("text")) {
                    (Some(kind), Some(Value::String(part_text))) if *kind == "text" => {
                        text.push_str(part_text);
                    }
                    _ => {
                        let message =
                            "only text parts ({\"type\":\"text\",\"text\":…}) are supported".into();
                        fields.fail(&format!("{field}[{j}]"), "text_part", message, None);
                        return None;
                    }
                }
            }
            Some(text)
        }
        Some(other) => {
            fields.wrong_type(&field, "string", other);
            None
        }
    }
}

/// Fields the worker does not implement (the legacy `functions` and `function_call`; completions'
/// `echo`, `best_of`, `suffix` and chat's tool fields, which completions do not have): refused
/// with a clear 400 rather than ignored, since the reply would not be what the caller asked for.
fn refuse_unsupported(fields: &mut Fields<'_>, endpoint: Endpoint) {
    for name in ["functions", "function_call"] {
        if let Some(value) = fields.get(name) {
            let message = format!(
                "{name} is the deprecated form of tools and tool_choice, which this worker does not serve; send tools and tool_choice (specs/OPENAI.md)"
            );
            fields.fail(name, "unsupported", message, Some(value));
        }
    }
    if endpoint != Endpoint::Completions {
        return;
    }
    let is_default = |name: &str, value: &Value| match name {
        "echo" => *value == false,
        "best_of" => value.as_u64() == Some(1),
        _ => false,
    };
    for name in ["tools", "tool_choice", "echo", "best_of", "suffix"] {
        if let Some(value) = fields.get(name)
            && !is_default(name, value)
        {
            let message = format!("{name} is not supported on /v1/completions (specs/OPENAI.md)");
            fields.fail(name, "unsupported", message, Some(value));
        }
    }
}

#[cfg(test)]
mod tests;
