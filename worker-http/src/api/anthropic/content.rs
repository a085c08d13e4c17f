//! A Messages request's `system` and `messages` as the chat template's messages: text blocks
//! joined, an assistant's `tool_use` blocks as the message's `tool_calls` (as on
//! `/v1/chat/completions`), a user's `tool_result` blocks as `tool` messages before the user's
//! text; a final assistant message stays last, for the reply to continue (a prefill). Blocks
//! the worker cannot give the model (images, documents, server tools) are refused.

use std::collections::HashMap;

use serde_json::{Map, Value, json};
use worker_common::tokenizer::template::ChatMessage;

use crate::api::fields::Fields;
use crate::api::openai::message_extra;

/// What separates the text of consecutive text blocks of one message.
const BLOCK_SEPARATOR: &str = "\n";

/// Blocks of the model's own reasoning, which the template does not get back (as on
/// `/v1/chat/completions`): dropped from assistant messages.
const REASONING_BLOCKS: [&str; 2] = ["thinking", "redacted_thinking"];

/// `system` then `messages`; `None` after recording why they are refused.
pub(super) fn conversation(fields: &mut Fields<'_>) -> Option<Vec<ChatMessage>> {
    let system = system(fields);
    let mut out: Vec<ChatMessage> = system.into_iter().collect();
    let items = match fields.get("messages") {
        None => {
            fields.fail("messages", "required", "messages is required".into(), None);
            return None;
        }
        Some(Value::Array(items)) if items.is_empty() => {
            let message = "messages must hold at least one message".into();
            fields.fail("messages", "non_empty", message, None);
            return None;
        }
        Some(Value::Array(items)) => items,
        Some(other) => {
            fields.wrong_type("messages", "array", other);
            return None;
        }
    };
    let mut names = HashMap::new();
    let mut valid = true;
    for (i, item) in items.iter().enumerate() {
        match message(fields, &format!("messages[{i}]"), item, &mut names) {
            Some(messages) => out.extend(messages),
            None => valid = false,
        }
    }
    // A final assistant message is continued by the reply (a prefill): not past its calls.
    if let Some(last) = out.last()
        && last.role == "assistant"
        && last.extra.is_some()
    {
        let message = "the reply continues a final assistant message (prefill), which cannot follow tool_use blocks; end with their tool_result".into();
        let at = format!("messages[{}]", items.len() - 1);
        fields.fail(&at, "prefill", message, None);
        return None;
    }
    valid.then_some(out)
}

/// `system`: a string or an array of text blocks; `None` when absent or empty.
fn system(fields: &mut Fields<'_>) -> Option<ChatMessage> {
    let text = match fields.get("system")? {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (j, block) in blocks.iter().enumerate() {
                texts.push(text_block(fields, &format!("system[{j}]"), block)?);
            }
            texts.join(BLOCK_SEPARATOR)
        }
        other => {
            fields.wrong_type("system", "string", other);
            return None;
        }
    };
    (!text.is_empty()).then(|| ChatMessage::new("system", text))
}

/// A `{"type": "text", "text": …}` block's text (`cache_control` and `citations` ignored).
fn text_block(fields: &mut Fields<'_>, at: &str, block: &Value) -> Option<String> {
    match (block.get("type"), block.get("text")) {
        (Some(kind), Some(Value::String(text))) if kind == "text" => Some(text.clone()),
        _ => {
            let message =
                "only text blocks ({\"type\": \"text\", \"text\": …}) are taken here".into();
            fields.fail(at, "text_block", message, None);
            None
        }
    }
}

/// One message as the template's messages (a user's tool results are messages of their own);
/// `names` maps the `tool_use` ids seen so far to their functions.
fn message(
    fields: &mut Fields<'_>,
    at: &str,
    item: &Value,
    names: &mut HashMap<String, String>,
) -> Option<Vec<ChatMessage>> {
    let Value::Object(object) = item else {
        fields.wrong_type(at, "object", item);
        return None;
    };
    let role = match object.get("role") {
        Some(Value::String(role)) if role == "user" || role == "assistant" => role.as_str(),
        Some(Value::String(role)) => {
            let message = format!(
                "role {role:?} is not user or assistant (the system prompt is the top-level system field)"
            );
            fields.fail(
                &format!("{at}.role"),
                "one_of(user, assistant)",
                message,
                None,
            );
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
    let at = format!("{at}.content");
    let blocks = match object.get("content") {
        Some(Value::String(text)) => return Some(vec![ChatMessage::new(role, text.clone())]),
        Some(Value::Array(blocks)) => blocks,
        Some(other) => {
            fields.wrong_type(&at, "string", other);
            return None;
        }
        None => {
            let message = format!("a {role} message needs content");
            fields.fail(&at, "required", message, None);
            return None;
        }
    };
    match role {
        "assistant" => assistant(fields, &at, blocks, names).map(|message| vec![message]),
        _ => user(fields, &at, blocks, names),
    }
}

/// An assistant message: its text blocks joined, its `tool_use` blocks as `tool_calls`.
fn assistant(
    fields: &mut Fields<'_>,
    at: &str,
    blocks: &[Value],
    names: &mut HashMap<String, String>,
) -> Option<ChatMessage> {
    let (mut texts, mut calls) = (Vec::new(), Vec::new());
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}[{j}]");
        match block_type(block) {
            Some("text") => texts.push(text_block(fields, &at, block)?),
            Some("tool_use") => {
                let (id, name, input) = tool_use(fields, &at, block)?;
                names.insert(id.clone(), name.clone());
                let function = json!({"name": name, "arguments": input});
                calls.push(json!({"id": id, "type": "function", "function": function}));
            }
            Some(kind) if REASONING_BLOCKS.contains(&kind) => {}
            other => {
                unsupported(fields, &at, other, "text, tool_use, thinking");
                return None;
            }
        }
    }
    let mut object = Map::new();
    if !calls.is_empty() {
        object.insert("tool_calls".into(), Value::Array(calls));
    }
    // The calls are built here in the shape message_extra reads: it cannot refuse them.
    let extra = message_extra("assistant", &object).unwrap_or_default();
    Some(ChatMessage::with_extra(
        "assistant",
        texts.join(BLOCK_SEPARATOR),
        extra,
    ))
}

/// A `tool_use` block's id, name and input object.
fn tool_use(fields: &mut Fields<'_>, at: &str, block: &Value) -> Option<(String, String, Value)> {
    let id = block.get("id").and_then(Value::as_str);
    let name = block.get("name").and_then(Value::as_str);
    match (id, name, block.get("input")) {
        (Some(id), Some(name), Some(input @ Value::Object(_))) => {
            Some((id.to_owned(), name.to_owned(), input.clone()))
        }
        _ => {
            let message =
                "a tool_use block needs id and name (strings) and input (an object)".into();
            fields.fail(at, "tool_use", message, None);
            None
        }
    }
}

/// A user message: each `tool_result` block as a `tool` message, then the text blocks joined
/// as one user message (when there are any).
fn user(
    fields: &mut Fields<'_>,
    at: &str,
    blocks: &[Value],
    names: &HashMap<String, String>,
) -> Option<Vec<ChatMessage>> {
    let (mut texts, mut out) = (Vec::new(), Vec::new());
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}[{j}]");
        match block_type(block) {
            Some("text") => texts.push(text_block(fields, &at, block)?),
            Some("tool_result") => out.push(tool_result(fields, &at, block, names)?),
            other => {
                unsupported(fields, &at, other, "text, tool_result");
                return None;
            }
        }
    }
    if !texts.is_empty() || out.is_empty() {
        out.push(ChatMessage::new("user", texts.join(BLOCK_SEPARATOR)));
    }
    Some(out)
}

/// A `tool_result` block as a `tool` message: its content (a string or text blocks) with the
/// call's id and, when an earlier `tool_use` named it, the function's name. `is_error` is
/// ignored: templates have no field for it.
fn tool_result(
    fields: &mut Fields<'_>,
    at: &str,
    block: &Value,
    names: &HashMap<String, String>,
) -> Option<ChatMessage> {
    let Some(id) = block.get("tool_use_id").and_then(Value::as_str) else {
        let message = "a tool_result block needs tool_use_id (a string)".into();
        fields.fail(&format!("{at}.tool_use_id"), "required", message, None);
        return None;
    };
    let content = match block.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(blocks)) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (k, inner) in blocks.iter().enumerate() {
                texts.push(text_block(fields, &format!("{at}.content[{k}]"), inner)?);
            }
            texts.join(BLOCK_SEPARATOR)
        }
        Some(other) => {
            fields.wrong_type(&format!("{at}.content"), "string", other);
            return None;
        }
    };
    let mut extra = Map::new();
    extra.insert("tool_call_id".into(), json!(id));
    if let Some(name) = names.get(id) {
        extra.insert("name".into(), json!(name));
    }
    Some(ChatMessage::with_extra("tool", content, extra))
}

fn block_type(block: &Value) -> Option<&str> {
    block.get("type").and_then(Value::as_str)
}

/// Records a block of a type the worker does not take (images, documents, server tools' blocks).
fn unsupported(fields: &mut Fields<'_>, at: &str, kind: Option<&str>, taken: &str) {
    let message = match kind {
        Some(kind) => format!("{kind} blocks are not supported here; this worker takes {taken}"),
        None => format!("a content block needs a type; this worker takes {taken}"),
    };
    fields.fail(&format!("{at}.type"), "content_block", message, None);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: Value) -> Result<Vec<ChatMessage>, Vec<(String, String)>> {
        let object = body.as_object().cloned().unwrap_or_default();
        let mut fields = Fields::new(&object);
        let messages = conversation(&mut fields);
        match messages {
            Some(messages) if fields.errors.is_empty() => Ok(messages),
            _ => Err(fields
                .errors
                .into_iter()
                .map(|error| (error.field, error.constraint))
                .collect()),
        }
    }

    fn extra(message: &ChatMessage) -> Value {
        serde_json::from_str(message.extra.as_deref().unwrap_or("{}")).unwrap_or_default()
    }

    #[test]
    fn system_and_text_blocks_become_messages() {
        let messages = read(json!({
            "system": [{"type": "text", "text": "be"}, {"type": "text", "text": "brief", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        }));
        assert_eq!(
            messages,
            Ok(vec![
                ChatMessage::new("system", "be\nbrief"),
                ChatMessage::new("user", "a\nb")
            ])
        );
        let plain = read(json!({"system": "s", "messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(
            plain,
            Ok(vec![
                ChatMessage::new("system", "s"),
                ChatMessage::new("user", "hi")
            ])
        );
    }

    #[test]
    fn a_tool_round_trip_becomes_tool_calls_and_a_tool_message() {
        let messages = read(json!({"messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": ""},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C"}]},
                {"type": "text", "text": "and now?"},
            ]},
        ]}))
        .unwrap_or_else(|errors| panic!("{errors:?}"));
        assert_eq!(messages.len(), 4, "{messages:?}");
        assert_eq!(
            (messages[1].role.as_str(), messages[1].content.as_str()),
            ("assistant", "Checking.")
        );
        assert_eq!(
            extra(&messages[1])["tool_calls"],
            json!([{"id": "toolu_1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}])
        );
        assert_eq!(
            (messages[2].role.as_str(), messages[2].content.as_str()),
            ("tool", "18 C")
        );
        assert_eq!(
            extra(&messages[2]),
            json!({"tool_call_id": "toolu_1", "name": "get_weather"})
        );
        assert_eq!(messages[3], ChatMessage::new("user", "and now?"));
    }

    #[test]
    fn blocks_it_cannot_take_are_refused_with_their_path() {
        let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}});
        let refused = read(json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"}, image]},
            {"role": "system", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]},
            {"role": "user", "content": [{"type": "tool_result"}]},
            {"role": "user", "content": 7},
        ]}));
        assert_eq!(
            refused,
            Err(vec![
                ("messages[0].content[1].type".into(), "content_block".into()),
                ("messages[1].role".into(), "one_of(user, assistant)".into()),
                ("messages[2].content[0]".into(), "tool_use".into()),
                (
                    "messages[3].content[0].tool_use_id".into(),
                    "required".into()
                ),
                ("messages[4].content".into(), "type(string)".into()),
            ])
        );
        let prefill = read(json!({"messages": [
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "The answer is"},
        ]}));
        assert_eq!(
            prefill.map(|messages| messages.len()),
            Ok(2),
            "a prefill is the last message"
        );
        let after_calls = read(json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        ]}));
        assert_eq!(
            after_calls,
            Err(vec![("messages[1]".into(), "prefill".into())])
        );
        assert_eq!(
            read(json!({"messages": []})),
            Err(vec![("messages".into(), "non_empty".into())])
        );
        assert_eq!(
            read(json!({})),
            Err(vec![("messages".into(), "required".into())])
        );
    }
}
