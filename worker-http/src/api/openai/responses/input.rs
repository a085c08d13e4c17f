//! A Responses request's `instructions` and `input` items (after the previous response's, with
//! `previous_response_id`) as the chat template's messages, as `/v1/chat/completions` gives
//! them: messages' text parts joined, `function_call` items as the preceding assistant message's
//! `tool_calls`, `function_call_output` items as `tool` messages, `reasoning` items dropped (the
//! template does not get reasoning back). Items and parts the worker cannot give the model
//! (images, files, audio, hosted tools' calls, item references) are refused.

use std::collections::HashMap;

use serde_json::{Map, Value, json};
use worker_common::tokenizer::template::ChatMessage;

use crate::api::fields::Fields;
use crate::api::openai::message_extra;

/// Roles an input message may have (`developer` is rendered as `system`).
const ROLES: [&str; 4] = ["user", "system", "developer", "assistant"];

/// Text parts a message's content may hold.
const TEXT_PARTS: [&str; 2] = ["input_text", "output_text"];

/// An assistant message being built: its text, and the calls that follow it.
struct Assistant {
    content: String,
    calls: Vec<Value>,
}

/// Builds the template's messages item by item.
struct Conversation {
    out: Vec<ChatMessage>,
    assistant: Option<Assistant>,
    /// The functions of the calls seen so far, by `call_id`.
    names: HashMap<String, String>,
}

impl Conversation {
    /// Ends the assistant message being built, if any.
    fn flush(&mut self) {
        let Some(Assistant { content, calls }) = self.assistant.take() else {
            return;
        };
        let mut object = Map::new();
        if !calls.is_empty() {
            object.insert("tool_calls".into(), Value::Array(calls));
        }
        // The calls are built here in the shape message_extra reads: it cannot refuse them.
        let extra = message_extra("assistant", &object).unwrap_or_default();
        self.out
            .push(ChatMessage::with_extra("assistant", content, extra));
    }

    fn push(&mut self, message: ChatMessage) {
        self.flush();
        self.out.push(message);
    }
}

/// The input items of a request: `input` itself when it is an array, else one user message
/// holding its text; `None` after recording why it is refused.
pub(super) fn input_items(fields: &mut Fields<'_>) -> Option<Vec<Value>> {
    match fields.get("input") {
        None => {
            fields.fail("input", "required", "input is required".into(), None);
            None
        }
        Some(Value::String(text)) => Some(vec![json!({"role": "user", "content": text})]),
        Some(Value::Array(items)) if items.is_empty() => {
            let message = "input must hold at least one item".into();
            fields.fail("input", "non_empty", message, None);
            None
        }
        Some(Value::Array(items)) => Some(items.clone()),
        Some(other) => {
            fields.wrong_type("input", "string", other);
            None
        }
    }
}

/// `instructions` (a system message first), then `previous` (the previous response's
/// conversation, already validated when it was stored), then `input`; `None` after recording
/// why an item is refused.
pub(super) fn conversation(
    fields: &mut Fields<'_>,
    instructions: Option<&str>,
    previous: &[Value],
    input: &[Value],
) -> Option<Vec<ChatMessage>> {
    let mut conversation = Conversation {
        out: instructions
            .map(|text| ChatMessage::new("system", text))
            .into_iter()
            .collect(),
        assistant: None,
        names: HashMap::new(),
    };
    let mut valid = true;
    let previous = previous
        .iter()
        .map(|item| ("previous_response_id".to_owned(), item));
    let input = (input.iter().enumerate()).map(|(i, item)| (format!("input[{i}]"), item));
    for (at, item) in previous.chain(input) {
        valid &= read_item(fields, &at, item, &mut conversation).is_some();
    }
    conversation.flush();
    valid.then_some(conversation.out)
}

/// One input item into `conversation`; `None` after recording why it is refused.
fn read_item(
    fields: &mut Fields<'_>,
    at: &str,
    item: &Value,
    conversation: &mut Conversation,
) -> Option<()> {
    let Value::Object(object) = item else {
        fields.wrong_type(at, "object", item);
        return None;
    };
    let kind = object.get("type").and_then(Value::as_str);
    match kind {
        None | Some("message") => message(fields, at, object, conversation),
        Some("function_call") => function_call(fields, at, object, conversation),
        Some("function_call_output") => function_call_output(fields, at, object, conversation),
        // The model's reasoning is not given back to the template (as on /v1/chat/completions).
        Some("reasoning") => Some(()),
        Some(other) => {
            let message = format!(
                "{other} items are not supported: this worker takes message, function_call, function_call_output and reasoning items (specs/OPENAI.md, Responses)"
            );
            fields.fail(&format!("{at}.type"), "input_item", message, None);
            None
        }
    }
}

/// A message item `{role, content}`.
fn message(
    fields: &mut Fields<'_>,
    at: &str,
    object: &Map<String, Value>,
    conversation: &mut Conversation,
) -> Option<()> {
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
            let message = "a message item needs a role".into();
            fields.fail(&format!("{at}.role"), "required", message, None);
            return None;
        }
    };
    let text = content(fields, &format!("{at}.content"), object.get("content"))?;
    match role {
        "assistant" => {
            conversation.flush();
            conversation.assistant = Some(Assistant {
                content: text,
                calls: Vec::new(),
            });
        }
        "developer" | "system" => conversation.push(ChatMessage::new("system", text)),
        _ => conversation.push(ChatMessage::new(role, text)),
    }
    Some(())
}

/// A message's text: a string, or text parts (`input_text`, `output_text`) joined.
fn content(fields: &mut Fields<'_>, at: &str, value: Option<&Value>) -> Option<String> {
    let parts = match value {
        Some(Value::String(text)) => return Some(text.clone()),
        Some(Value::Array(parts)) => parts,
        Some(other) => {
            fields.wrong_type(at, "string", other);
            return None;
        }
        None => {
            let message = "a message item needs content".into();
            fields.fail(at, "required", message, None);
            return None;
        }
    };
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let kind = part.get("type").and_then(Value::as_str);
        match (kind, part.get("text")) {
            (Some(kind), Some(Value::String(part_text))) if TEXT_PARTS.contains(&kind) => {
                text.push_str(part_text);
            }
            _ => {
                let message = match kind {
                    Some(kind) if !TEXT_PARTS.contains(&kind) => format!(
                        "{kind} parts are not supported: this worker serves text models and takes input_text and output_text parts"
                    ),
                    _ => "a text part is {\"type\": \"input_text\", \"text\": …}".into(),
                };
                fields.fail(&format!("{at}[{j}].type"), "content_part", message, None);
                return None;
            }
        }
    }
    Some(text)
}

/// A string field of an item, recorded as missing otherwise.
fn string<'a>(
    fields: &mut Fields<'_>,
    at: &str,
    object: &'a Map<String, Value>,
    key: &str,
) -> Option<&'a str> {
    match object.get(key) {
        Some(Value::String(text)) => Some(text),
        Some(other) => {
            fields.wrong_type(&format!("{at}.{key}"), "string", other);
            None
        }
        None => {
            let message = format!("a {} item needs {key}", item_type(object));
            fields.fail(&format!("{at}.{key}"), "required", message, None);
            None
        }
    }
}

fn item_type(object: &Map<String, Value>) -> &str {
    object
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message")
}

/// A `function_call` item `{call_id, name, arguments}`: a call of the assistant message before
/// it (a message of its own when none is open).
fn function_call(
    fields: &mut Fields<'_>,
    at: &str,
    object: &Map<String, Value>,
    conversation: &mut Conversation,
) -> Option<()> {
    let call_id = string(fields, at, object, "call_id");
    let name = string(fields, at, object, "name");
    let arguments = string(fields, at, object, "arguments");
    let (call_id, name, arguments) = (call_id?, name?, arguments?);
    conversation
        .names
        .insert(call_id.to_owned(), name.to_owned());
    let function = json!({"name": name, "arguments": arguments});
    let call = json!({"id": call_id, "type": "function", "function": function});
    let assistant = conversation.assistant.get_or_insert_with(|| Assistant {
        content: String::new(),
        calls: Vec::new(),
    });
    assistant.calls.push(call);
    Some(())
}

/// A `function_call_output` item `{call_id, output}` as a `tool` message (with the function's
/// `name` when an earlier `function_call` item named it); `output` a string or text parts.
fn function_call_output(
    fields: &mut Fields<'_>,
    at: &str,
    object: &Map<String, Value>,
    conversation: &mut Conversation,
) -> Option<()> {
    let call_id = string(fields, at, object, "call_id")?;
    let output = match object.get("output") {
        Some(Value::String(text)) => text.clone(),
        Some(parts @ Value::Array(_)) => content(fields, &format!("{at}.output"), Some(parts))?,
        Some(other) => {
            fields.wrong_type(&format!("{at}.output"), "string", other);
            return None;
        }
        None => {
            let message = "a function_call_output item needs output".into();
            fields.fail(&format!("{at}.output"), "required", message, None);
            return None;
        }
    };
    let mut extra = Map::new();
    extra.insert("tool_call_id".into(), json!(call_id));
    if let Some(name) = conversation.names.get(call_id) {
        extra.insert("name".into(), json!(name));
    }
    conversation.push(ChatMessage::with_extra("tool", output, extra));
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(input: Value) -> Result<Vec<ChatMessage>, Vec<(String, String)>> {
        let body = json!({"input": input});
        let object = body.as_object().cloned().unwrap_or_default();
        let mut fields = Fields::new(&object);
        let items = input_items(&mut fields).unwrap_or_default();
        let messages = conversation(&mut fields, Some("Be brief."), &[], &items);
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
    fn a_string_input_is_one_user_message_after_the_instructions() {
        assert_eq!(
            read(json!("hi")),
            Ok(vec![
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "hi")
            ])
        );
    }

    #[test]
    fn messages_take_strings_and_text_parts() {
        let messages = read(json!([
            {"role": "developer", "content": "d"},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                "content": [{"type": "output_text", "text": "c", "annotations": []}]},
        ]));
        assert_eq!(
            messages,
            Ok(vec![
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("system", "d"),
                ChatMessage::new("user", "ab"),
                ChatMessage::new("assistant", "c"),
            ])
        );
    }

    #[test]
    fn a_call_and_its_output_become_tool_calls_and_a_tool_message() {
        let messages = read(json!([
            {"role": "user", "content": "weather?"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
                "arguments": "{\"city\": \"Paris\"}", "status": "completed"},
            {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
            {"type": "function_call_output", "call_id": "call_2",
                "output": [{"type": "input_text", "text": "noon"}]},
        ]))
        .unwrap_or_else(|errors| panic!("{errors:?}"));
        assert_eq!(messages.len(), 5, "{messages:?}");
        assert_eq!(
            (messages[2].role.as_str(), messages[2].content.as_str()),
            ("assistant", "Checking.")
        );
        assert_eq!(
            extra(&messages[2])["tool_calls"],
            json!([
                {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"id": "call_2", "type": "function",
                    "function": {"name": "get_time", "arguments": {}}},
            ])
        );
        assert_eq!(
            (messages[3].role.as_str(), messages[3].content.as_str()),
            ("tool", "18 C")
        );
        assert_eq!(
            extra(&messages[3]),
            json!({"tool_call_id": "call_1", "name": "get_weather"})
        );
        assert_eq!(messages[4].content, "noon");
    }

    #[test]
    fn a_call_without_a_message_before_it_is_an_assistant_message_of_its_own() {
        let messages = read(json!([
            {"role": "user", "content": "weather?"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        ]))
        .unwrap_or_else(|errors| panic!("{errors:?}"));
        assert_eq!(
            (messages[2].role.as_str(), messages[2].content.as_str()),
            ("assistant", "")
        );
        assert_eq!(extra(&messages[2])["tool_calls"][0]["id"], "c");
    }

    #[test]
    fn items_and_parts_it_cannot_take_are_refused_with_their_path() {
        let image = json!({"type": "input_image", "image_url": "https://example.invalid/a.png"});
        let refused = read(json!([
            {"role": "user", "content": [{"type": "input_text", "text": "look"}, image]},
            {"role": "tool", "content": "x"},
            {"type": "function_call", "name": "f", "arguments": "{}"},
            {"type": "web_search_call", "id": "ws_1"},
            {"type": "item_reference", "id": "msg_1"},
            {"role": "user"},
            7,
        ]));
        assert_eq!(
            refused,
            Err(vec![
                ("input[0].content[1].type".into(), "content_part".into()),
                ("input[1].role".into(), "one_of(roles)".into()),
                ("input[2].call_id".into(), "required".into()),
                ("input[3].type".into(), "input_item".into()),
                ("input[4].type".into(), "input_item".into()),
                ("input[5].content".into(), "required".into()),
                ("input[6]".into(), "type(object)".into()),
            ])
        );
        assert_eq!(
            read(json!([])),
            Err(vec![("input".into(), "non_empty".into())])
        );
        assert_eq!(
            read(json!(7)),
            Err(vec![("input".into(), "type(string)".into())])
        );
    }
}
