//! `/v1/messages` bodies, validated into the same [`JobSpec`] as `/v1/chat/completions`
//! (specs/MESSAGES.md lists every field: taken, ignored with its reason, or refused).

use serde_json::Value;
use worker_common::tokenizer::template::ChatMessage;

use super::content::conversation;
use crate::api::fields::{Fields, json_object};
use crate::api::openai::{Function, ToolChoice, Tools};
use crate::api::{FieldError, Grammar, JobSpec, Limits, Prompt};

/// A validated Messages request.
#[derive(Debug, Clone, PartialEq)]
pub struct MessagesRequest {
    /// The job, as `/v1/chat/completions` would run it.
    pub job: JobSpec,
    /// Stream Anthropic's events (else one message object).
    pub stream: bool,
    /// The tools the model may call (none with `tool_choice` `none`).
    pub tools: Option<Tools>,
}

/// Top-level fields that ask for what the worker cannot do: refused when present (and not
/// empty), never ignored.
const REFUSED: [(&str, &str); 2] = [
    (
        "mcp_servers",
        "MCP servers are not reached from this worker",
    ),
    ("container", "this worker runs no code-execution container"),
];

/// What a body was sent for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `/v1/messages`: a reply (`max_tokens` required).
    Create,
    /// `/v1/messages/count_tokens`: the prompt's length only (`max_tokens` not read).
    CountTokens,
}

impl MessagesRequest {
    /// Parses and validates a body sent with `content_type` for `purpose`.
    pub fn parse(
        content_type: Option<&str>,
        body: &[u8],
        limits: Limits,
        purpose: Purpose,
    ) -> Result<Self, Vec<FieldError>> {
        let object = json_object(content_type, body)?;
        let mut fields = Fields::new(&object);
        // Any id: one worker serves one model (as on /v1/chat/completions).
        fields.required_string("model");
        let tools = tools(&mut fields);
        let messages = conversation(&mut fields);
        let max_tokens = match purpose {
            Purpose::Create => required_max_tokens(&mut fields, limits),
            Purpose::CountTokens => None,
        };
        let sampling = fields.sampling();
        let seed = fields.seed();
        let stop = fields.stop("stop_sequences", false);
        let stream = fields.boolean("stream");
        let grammar = output_format(&mut fields, tools.as_ref());
        refuse_unsupported(&mut fields);
        if !fields.errors.is_empty() {
            return Err(fields.errors);
        }
        Ok(Self {
            job: JobSpec {
                prompt: Prompt::Chat {
                    continue_final: ends_with_prefill(messages.as_deref()),
                    messages: messages.unwrap_or_default(),
                    tools: tools.as_ref().map(|tools| tools.json.clone()),
                },
                max_tokens,
                sampling,
                seed,
                stop,
                ignore_eos: false,
                grammar,
                speculative: true,
            },
            stream,
            tools,
        })
    }
}

/// Whether a conversation ends with the assistant's message, which the reply then continues
/// (Anthropic's prefill).
fn ends_with_prefill(messages: Option<&[ChatMessage]>) -> bool {
    messages
        .and_then(<[ChatMessage]>::last)
        .is_some_and(|message| message.role == "assistant")
}

/// `max_tokens`: required, at least 1, capped by `--max-tokens-out`.
fn required_max_tokens(fields: &mut Fields<'_>, limits: Limits) -> Option<u32> {
    if fields.get("max_tokens").is_none() {
        let message = "max_tokens is required".into();
        fields.fail("max_tokens", "required", message, None);
        return None;
    }
    fields.max_tokens("max_tokens", limits)
}

/// `tools` and `tool_choice`; `None` when there are none or the choice is `none`.
fn tools(fields: &mut Fields<'_>) -> Option<Tools> {
    let mut functions: Vec<Function> = Vec::new();
    for (i, item) in fields.tool_items("tools").into_iter().flatten().enumerate() {
        let at = format!("tools[{i}]");
        let Value::Object(object) = item else {
            fields.wrong_type(&at, "object", item);
            continue;
        };
        if let Some(kind) = object.get("type").filter(|kind| !kind.is_null())
            && kind.as_str() != Some("custom")
        {
            let message = format!(
                "{kind} is a server tool, which this worker does not run; only custom tools ({{name, description, input_schema}}) are served"
            );
            fields.fail(&format!("{at}.type"), "custom_tool", message, Some(kind));
            continue;
        }
        let keys = ("name", "input_schema");
        functions.extend(fields.function(&at, object, keys, &functions));
    }
    let choice = tool_choice(fields, &functions)?;
    fields.offered(functions, choice)
}

/// `tool_choice`: `{"type": "auto"}` (the default), `any` (some call), `tool` with `name` (that
/// call), or `none` (`None`: tools off). `disable_parallel_tool_use` is ignored: every call
/// the model writes is returned.
fn tool_choice(fields: &mut Fields<'_>, functions: &[Function]) -> Option<ToolChoice> {
    let Some(value) = fields.get("tool_choice") else {
        return Some(ToolChoice::Auto);
    };
    let name = value.get("name").and_then(Value::as_str);
    match (value.get("type").and_then(Value::as_str), name) {
        (Some("auto"), _) => Some(ToolChoice::Auto),
        (Some("any"), _) => Some(ToolChoice::Required),
        (Some("none"), _) => None,
        (Some("tool"), Some(name)) if functions.iter().any(|f| f.name == name) => {
            Some(ToolChoice::Named(name.to_owned()))
        }
        _ => {
            let message = "tool_choice is {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} or {\"type\": \"tool\", \"name\": <a listed tool>}".into();
            fields.fail("tool_choice", "tool_choice", message, Some(value));
            Some(ToolChoice::Auto)
        }
    }
}

/// `output_config.format`: `{"type": "json_schema", "schema": {…}}` becomes the grammar the
/// reply follows (structured output, as `response_format` on `/v1/chat/completions`), which a
/// forced call's grammar (`tools`' choice `any` or `tool`) cannot join; `output_config.effort`
/// is ignored.
fn output_format(fields: &mut Fields<'_>, tools: Option<&Tools>) -> Option<Grammar> {
    let format = fields.get("output_config")?.get("format")?;
    if format.is_null() {
        return None;
    }
    if tools.is_some_and(|tools| tools.choice != ToolChoice::Auto) {
        let message = "a forced tool call cannot be combined with output_config.format".into();
        let constraint = "conflicts(output_config.format)";
        fields.fail("tool_choice", constraint, message, None);
    }
    match (
        format.get("type").and_then(Value::as_str),
        format.get("schema"),
    ) {
        (Some("json_schema"), Some(schema @ Value::Object(_))) => Some(Grammar {
            spec: worker_common::grammar::GrammarSpec::JsonSchema(schema.clone()),
            field: "output_config.format",
        }),
        _ => {
            let message =
                "output_config.format is {\"type\": \"json_schema\", \"schema\": {…}}".into();
            fields.fail("output_config.format", "json_schema", message, Some(format));
            None
        }
    }
}

/// The fields of [`REFUSED`], when given.
fn refuse_unsupported(fields: &mut Fields<'_>) {
    for (name, why) in REFUSED {
        let given = fields.get(name).filter(|value| match value {
            Value::Array(items) => !items.is_empty(),
            _ => true,
        });
        if let Some(value) = given {
            let message = format!("{name} is not supported: {why} (specs/MESSAGES.md)");
            fields.fail(name, "unsupported", message, Some(value));
        }
    }
}

#[cfg(test)]
mod tests;
