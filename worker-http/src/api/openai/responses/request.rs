//! `/v1/responses` bodies, validated into the same [`JobSpec`] as `/v1/chat/completions`
//! (specs/OPENAI.md, "Responses", lists every field: taken, ignored with its reason, or
//! refused).

use std::sync::Arc;

use serde_json::{Map, Value, json};
use worker_common::grammar::GrammarSpec;

use super::input::{conversation, input_items};
use crate::api::fields::{Fields, json_object};
use crate::api::openai::{Function, ToolChoice, Tools};
use crate::api::{FieldError, Grammar, JobSpec, Limits, Prompt};

/// The constraint of an unknown `previous_response_id`: OpenAI's error code for it too.
pub const PREVIOUS_RESPONSE_NOT_FOUND: &str = "previous_response_not_found";

/// Most `metadata` pairs (OpenAI's limit), and their keys' and values' longest lengths.
const MAX_METADATA: usize = 16;
const MAX_METADATA_KEY: usize = 64;
const MAX_METADATA_VALUE: usize = 512;

/// Top-level fields that ask for what the worker does not do: refused when present (and not
/// `null`, `false` or empty), never ignored.
const REFUSED: [(&str, &str); 4] = [
    (
        "background",
        "responses run while the request waits for them (no background mode)",
    ),
    (
        "prompt",
        "this worker keeps no reusable prompts; send instructions and input",
    ),
    (
        "conversation",
        "this worker serves no Conversations API; use previous_response_id",
    ),
    (
        "include",
        "this worker produces none of the extra outputs include names (logprobs, encrypted reasoning, hosted tools' results)",
    ),
];

/// Finds the conversation a previous response left, by its id.
pub type PreviousLookup<'a> = &'a dyn Fn(&str) -> Option<Arc<[Value]>>;

/// A validated Responses request.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesRequest {
    /// The job, as `/v1/chat/completions` would run it.
    pub job: JobSpec,
    /// Stream the typed events (else one response object).
    pub stream: bool,
    /// The tools the model may call (none with `tool_choice` `none`).
    pub tools: Option<Tools>,
    /// Keep the response for a later `previous_response_id` (`store`, true by default).
    pub store: bool,
    /// The conversation as input items: the previous response's, then this request's input;
    /// what is kept, with the output items, when the response is stored.
    pub items: Vec<Value>,
    /// The request's fields the response object repeats (`instructions`, `tools`,
    /// `tool_choice`, `temperature`, `top_p`, `text`, …), in the response's shape.
    pub echo: Map<String, Value>,
}

impl ResponsesRequest {
    /// Parses and validates a body sent with `content_type`; `previous` finds the stored
    /// conversation a `previous_response_id` names.
    pub fn parse(
        content_type: Option<&str>,
        body: &[u8],
        limits: Limits,
        previous: PreviousLookup<'_>,
    ) -> Result<Self, Vec<FieldError>> {
        let object = json_object(content_type, body)?;
        let mut fields = Fields::new(&object);
        if let Some(model) = fields.get("model").filter(|model| !model.is_string()) {
            fields.wrong_type("model", "string", model);
        }
        refuse_unsupported(&mut fields);
        let (tools, echo_tools) = tools(&mut fields);
        let instructions = optional_string(&mut fields, "instructions");
        let (previous_id, mut items) = previous_items(&mut fields, previous);
        let input = input_items(&mut fields);
        let messages = input
            .as_deref()
            .and_then(|input| conversation(&mut fields, instructions.as_deref(), &items, input));
        items.extend(input.unwrap_or_default());
        let max_tokens = fields.max_tokens("max_output_tokens", limits);
        let sampling = fields.sampling();
        let seed = fields.seed();
        let forced = tools.as_ref().is_some_and(|t| t.choice != ToolChoice::Auto);
        let (grammar, text) = text_format(&mut fields, forced);
        let stream = fields.boolean("stream");
        let store = boolean_or(&mut fields, "store", true);
        let parallel_tool_calls = boolean_or(&mut fields, "parallel_tool_calls", true);
        let metadata = metadata(&mut fields);
        let user = optional_string(&mut fields, "user");
        let reasoning = reasoning(&mut fields);
        truncation(&mut fields);
        top_logprobs(&mut fields);
        let echo = json!({
            "instructions": instructions,
            "max_output_tokens": max_tokens,
            "metadata": metadata,
            "parallel_tool_calls": parallel_tool_calls,
            "previous_response_id": previous_id,
            "reasoning": reasoning,
            "store": store,
            "temperature": fields.get("temperature").cloned().unwrap_or(json!(1.0)),
            "text": text,
            "tool_choice": fields.get("tool_choice").cloned().unwrap_or(json!("auto")),
            "tools": echo_tools,
            "top_p": fields.get("top_p").cloned().unwrap_or(json!(1.0)),
            "truncation": "disabled",
            "user": user,
            "background": false,
        });
        if !fields.errors.is_empty() {
            return Err(fields.errors);
        }
        Ok(Self {
            job: JobSpec {
                prompt: Prompt::Chat {
                    messages: messages.unwrap_or_default(),
                    tools: tools.as_ref().map(|tools| tools.json.clone()),
                    continue_final: false,
                },
                max_tokens,
                sampling,
                seed,
                stop: Vec::new(),
                ignore_eos: false,
                grammar,
                speculative: true,
            },
            stream,
            tools,
            store,
            items,
            echo: match echo {
                Value::Object(echo) => echo,
                _ => Map::new(),
            },
        })
    }
}

/// An optional string field.
fn optional_string(fields: &mut Fields<'_>, field: &str) -> Option<String> {
    match fields.get(field)? {
        Value::String(text) => Some(text.clone()),
        other => {
            fields.wrong_type(field, "string", other);
            None
        }
    }
}

/// An optional boolean field, `default` when absent.
fn boolean_or(fields: &mut Fields<'_>, field: &str, default: bool) -> bool {
    match fields.get(field) {
        None => default,
        Some(_) => fields.boolean(field),
    }
}

/// `previous_response_id` and the conversation it left; an id not kept (never stored,
/// `store: false`, or evicted) is refused with [`PREVIOUS_RESPONSE_NOT_FOUND`].
fn previous_items(
    fields: &mut Fields<'_>,
    previous: PreviousLookup<'_>,
) -> (Option<String>, Vec<Value>) {
    let Some(id) = optional_string(fields, "previous_response_id") else {
        return (None, Vec::new());
    };
    match previous(&id) {
        Some(items) => (Some(id), items.to_vec()),
        None => {
            let message = format!("Previous response with id '{id}' not found.");
            let value = json!(id);
            let field = "previous_response_id";
            fields.fail(field, PREVIOUS_RESPONSE_NOT_FOUND, message, Some(&value));
            (Some(id), Vec::new())
        }
    }
}

/// `tools` (function tools `{type: "function", name, description?, parameters?, strict?}`)
/// and `tool_choice`: the tools the model gets (`None` when there are none or the choice is
/// `none`), and the list the response repeats.
fn tools(fields: &mut Fields<'_>) -> (Option<Tools>, Vec<Value>) {
    let mut functions: Vec<Function> = Vec::new();
    let mut echo = Vec::new();
    for (i, item) in fields.tool_items("tools").into_iter().flatten().enumerate() {
        let at = format!("tools[{i}]");
        let Value::Object(object) = item else {
            fields.wrong_type(&at, "object", item);
            continue;
        };
        match object.get("type").and_then(Value::as_str) {
            Some("function") => {}
            kind => {
                let message = format!(
                    "{} is a hosted tool, which this worker does not run; only function tools ({{type: \"function\", name, description, parameters, strict}}) are served",
                    kind.unwrap_or("a tool without a type")
                );
                let kind = object.get("type");
                fields.fail(&format!("{at}.type"), "function_tool", message, kind);
                continue;
            }
        }
        let Some(function) = fields.function(&at, object, ("name", "parameters"), &functions)
        else {
            continue;
        };
        echo.push(json!({
            "type": "function",
            "name": function.name,
            "description": function.description,
            "parameters": object.get("parameters").cloned().unwrap_or(Value::Null),
            "strict": object.get("strict").cloned().unwrap_or(Value::Null),
        }));
        functions.push(function);
    }
    let Some(choice) = tool_choice(fields, &functions) else {
        return (None, echo);
    };
    (fields.offered(functions, choice), echo)
}

/// `tool_choice`: `auto` (the default), `required`, `{"type": "function", "name"}` naming a
/// listed function, or `none` (`None`: tools off).
fn tool_choice(fields: &mut Fields<'_>, functions: &[Function]) -> Option<ToolChoice> {
    let Some(value) = fields.get("tool_choice") else {
        return Some(ToolChoice::Auto);
    };
    match value.as_str() {
        Some("none") => return None,
        Some("auto") => return Some(ToolChoice::Auto),
        Some("required") => return Some(ToolChoice::Required),
        _ => {}
    }
    let kind = value.get("type").and_then(Value::as_str);
    let name = value.get("name").and_then(Value::as_str);
    match (kind, name) {
        (Some("function"), Some(name)) if functions.iter().any(|f| f.name == name) => {
            Some(ToolChoice::Named(name.to_owned()))
        }
        _ => {
            let message = "tool_choice is none, auto, required or {\"type\": \"function\", \"name\": <a listed function>} (hosted tools and allowed_tools are not served)".into();
            fields.fail("tool_choice", "tool_choice", message, Some(value));
            Some(ToolChoice::Auto)
        }
    }
}

/// `text.format`: `{"type": "text"}` (the default: no grammar), `{"type": "json_object"}`, or
/// `{"type": "json_schema", "name", "schema", "strict"?}` (the reply follows `schema`), which a
/// forced call's grammar cannot join; `text.verbosity` is ignored. Returns the grammar and the
/// `text` object the response repeats.
fn text_format(fields: &mut Fields<'_>, forced: bool) -> (Option<Grammar>, Value) {
    let default = json!({"format": {"type": "text"}});
    let Some(text) = fields.get("text") else {
        return (None, default);
    };
    let Value::Object(object) = text else {
        fields.wrong_type("text", "object", text);
        return (None, default);
    };
    let mut echo = text.clone();
    let Some(format) = object.get("format").filter(|format| !format.is_null()) else {
        echo["format"] = json!({"type": "text"});
        return (None, echo);
    };
    let spec = match format.get("type").and_then(Value::as_str) {
        Some("text") => None,
        Some("json_object") => Some(GrammarSpec::JsonObject),
        Some("json_schema") => {
            if !format.get("name").is_some_and(Value::is_string) {
                let message = "text.format.name is required (a string)".into();
                fields.fail("text.format.name", "required", message, None);
            }
            fields.schema("text.format.schema", format.get("schema"))
        }
        _ => {
            let message = "text.format.type must be text, json_object or json_schema".into();
            let constraint = "one_of(text, json_object, json_schema)";
            fields.fail("text.format.type", constraint, message, format.get("type"));
            None
        }
    };
    if spec.is_some() && forced {
        let message = "a forced tool call cannot be combined with text.format".into();
        fields.fail("tool_choice", "conflicts(text.format)", message, None);
    }
    let grammar = spec.map(|spec| Grammar {
        spec,
        field: "text.format",
    });
    (grammar, echo)
}

/// `metadata`: at most 16 string values under keys of at most 64 characters, values of at
/// most 512; stored with the response and repeated, never read.
fn metadata(fields: &mut Fields<'_>) -> Value {
    let Some(value) = fields.get("metadata") else {
        return Value::Null;
    };
    let Value::Object(pairs) = value else {
        fields.wrong_type("metadata", "object", value);
        return Value::Null;
    };
    if !fields.within_count("metadata", pairs.len(), MAX_METADATA, "pairs") {
        return Value::Null;
    }
    for (key, text) in pairs {
        let fits = key.chars().count() <= MAX_METADATA_KEY
            && text
                .as_str()
                .is_some_and(|text| text.chars().count() <= MAX_METADATA_VALUE);
        if !fits {
            let message = format!(
                "metadata keys are at most {MAX_METADATA_KEY} characters, values strings of at most {MAX_METADATA_VALUE}"
            );
            fields.fail(&format!("metadata.{key}"), "metadata", message, None);
        }
    }
    value.clone()
}

/// `reasoning` (`effort`, `summary`): an object, repeated and otherwise ignored: whether and
/// how long a model reasons is the model's (a harmony model's reasoning comes back as a
/// `reasoning` item whatever the field says).
fn reasoning(fields: &mut Fields<'_>) -> Value {
    match fields.get("reasoning") {
        None => Value::Null,
        Some(value @ Value::Object(_)) => value.clone(),
        Some(other) => {
            fields.wrong_type("reasoning", "object", other);
            Value::Null
        }
    }
}

/// `truncation`: only `disabled` (the default): the worker never drops items to fit the
/// context; a conversation too long is refused.
fn truncation(fields: &mut Fields<'_>) {
    if let Some(value) = fields.get("truncation")
        && value != "disabled"
    {
        let message = "only truncation \"disabled\" is served: a conversation over the context is refused, never cut".into();
        fields.fail("truncation", "equals(disabled)", message, Some(value));
    }
}

/// `top_logprobs`: only 0 (log-probabilities are not served on this route yet).
fn top_logprobs(fields: &mut Fields<'_>) {
    if let Some(value) = fields.get("top_logprobs")
        && value.as_u64() != Some(0)
    {
        let message = "top_logprobs is not served on /v1/responses (specs/OPENAI.md)".into();
        fields.fail("top_logprobs", "unsupported", message, Some(value));
    }
}

/// The fields of [`REFUSED`], when given.
fn refuse_unsupported(fields: &mut Fields<'_>) {
    for (name, why) in REFUSED {
        let given = fields.get(name).filter(|value| match value {
            Value::Array(items) => !items.is_empty(),
            Value::Bool(on) => *on,
            _ => true,
        });
        if let Some(value) = given {
            let message = format!("{name} is not supported: {why} (specs/OPENAI.md, Responses)");
            fields.fail(name, "unsupported", message, Some(value));
        }
    }
}

#[cfg(test)]
mod tests;
