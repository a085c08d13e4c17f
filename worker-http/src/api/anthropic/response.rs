//! Anthropic's shapes for one job's answer: the message object, and the stream's events
//! (`message_start`, `ping`, `content_block_start` / `_delta` / `_stop`, `message_delta`,
//! `message_stop`). Content blocks come from the same pieces the OpenAI routes send: text,
//! reasoning (a `thinking` block) and tool calls (`tool_use` blocks).

use serde_json::{Value, json};
use worker_common::generate::{Finished, StopReason};

use crate::api::openai::{Piece, ToolCall};

/// What the message and every event of one reply repeat.
#[derive(Debug, Clone)]
pub struct Message {
    /// `msg_…`: the job id (so `/cancel/{id}` reaches it too).
    pub id: String,
    /// The loaded model's id.
    pub model: String,
}

/// A call's `tool_use` id: `toolu_` and the call's own 24 hex digits.
fn tool_use_id(call: &ToolCall) -> String {
    let digits = call.id.strip_prefix("call_").unwrap_or(&call.id);
    format!("toolu_{digits}")
}

/// A `tool_use` block; `input` is the call's arguments object, `{}` for arguments that are not
/// one (a call cut off by `max_tokens`).
fn tool_use_block(call: &ToolCall, input: Value) -> Value {
    json!({"type": "tool_use", "id": tool_use_id(call), "name": call.name, "input": input})
}

/// Anthropic's `stop_reason` (and `stop_sequence`) for how a job stopped, and whether its reply
/// made tool calls.
fn stop_reason(done: &Finished, called: bool) -> (&'static str, Option<&str>) {
    match done.stop_reason {
        StopReason::MaxTokens => ("max_tokens", None),
        StopReason::Eos | StopReason::StopSequence if called => ("tool_use", None),
        StopReason::StopSequence => ("stop_sequence", done.stop_sequence_matched.as_deref()),
        StopReason::Eos => ("end_turn", None),
    }
}

/// `usage` in Anthropic's terms: `input_tokens` are the prompt's tokens the prefix cache did
/// not serve, `cache_read_input_tokens` those it did (their sum is the prompt); nothing is
/// written to a cache on request.
fn usage(prompt_tokens: usize, cached_tokens: usize, output_tokens: usize) -> Value {
    json!({
        "input_tokens": prompt_tokens.saturating_sub(cached_tokens),
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
    })
}

impl Message {
    /// The message object around `content`.
    fn object(&self, content: Value, stop: (Option<&str>, Option<&str>), usage: Value) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop.0,
            "stop_sequence": stop.1,
            "usage": usage,
        })
    }

    /// The whole reply: `pieces` in order (joined content, reasoning and whole calls, as
    /// `routes::reply::Collected` holds them) as content blocks.
    pub fn whole(&self, pieces: &[Piece], done: &Finished) -> Value {
        let blocks: Vec<Value> = pieces
            .iter()
            .filter_map(|piece| match piece {
                Piece::Content(text) => Some(json!({"type": "text", "text": text})),
                Piece::Reasoning(text) => {
                    Some(json!({"type": "thinking", "thinking": text, "signature": ""}))
                }
                Piece::Call(call) => {
                    let input = serde_json::from_str::<Value>(&call.arguments)
                        .ok()
                        .filter(Value::is_object)
                        .unwrap_or_else(|| json!({}));
                    Some(tool_use_block(call, input))
                }
                Piece::CallStart(_) | Piece::Arguments(_) => None,
            })
            .collect();
        let called = pieces.iter().any(|piece| matches!(piece, Piece::Call(_)));
        let (reason, sequence) = stop_reason(done, called);
        let usage = usage(done.prompt_tokens, done.cached_tokens, done.tokens.len());
        self.object(Value::Array(blocks), (Some(reason), sequence), usage)
    }
}

/// The kind of the content block a stream has open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    Thinking,
    ToolUse,
}

/// One stream event: its `event:` name and its `data:` object.
pub type NamedEvent = (&'static str, Value);

/// A reply's pieces as Anthropic's stream events, one content block per run of text, of
/// reasoning, or per tool call.
#[derive(Debug)]
pub struct BlockEvents {
    /// The open block, and its index.
    open: Option<(Open, usize)>,
    /// Blocks started so far.
    blocks: usize,
    /// Whether a `tool_use` block was sent.
    called: bool,
}

impl BlockEvents {
    /// The events of `message`, whose prompt had `prompt_tokens`, `cached_tokens` of them from
    /// the prefix cache: `message_start` (no content, no stop reason yet) and a `ping`.
    pub fn start(
        message: &Message,
        prompt_tokens: usize,
        cached_tokens: usize,
    ) -> (Self, Vec<NamedEvent>) {
        let usage = usage(prompt_tokens, cached_tokens, 0);
        let object = message.object(json!([]), (None, None), usage);
        let events = vec![
            (
                "message_start",
                json!({"type": "message_start", "message": object}),
            ),
            ("ping", json!({"type": "ping"})),
        ];
        let stream = Self {
            open: None,
            blocks: 0,
            called: false,
        };
        (stream, events)
    }

    /// The events one piece of the reply sends.
    pub fn piece(&mut self, piece: Piece) -> Vec<NamedEvent> {
        let mut events = Vec::new();
        match piece {
            Piece::Content(text) => {
                let index =
                    self.ensure(Open::Text, json!({"type": "text", "text": ""}), &mut events);
                events.push(delta(index, json!({"type": "text_delta", "text": text})));
            }
            Piece::Reasoning(text) => {
                let block = json!({"type": "thinking", "thinking": "", "signature": ""});
                let index = self.ensure(Open::Thinking, block, &mut events);
                let thinking = json!({"type": "thinking_delta", "thinking": text});
                events.push(delta(index, thinking));
            }
            Piece::CallStart(call) => {
                self.open_call(&call, &mut events);
            }
            Piece::Call(call) => {
                let index = self.open_call(&call, &mut events);
                events.push(arguments(index, call.arguments));
            }
            Piece::Arguments(text) => {
                if let Some((Open::ToolUse, index)) = self.open {
                    events.push(arguments(index, text));
                }
            }
        }
        events
    }

    /// The reply ended: the open block's stop, `message_delta` (stop reason, usage) and
    /// `message_stop`.
    pub fn finish(&mut self, done: &Finished) -> Vec<NamedEvent> {
        let mut events = Vec::new();
        self.close(&mut events);
        let (reason, sequence) = stop_reason(done, self.called);
        let usage = usage(done.prompt_tokens, done.cached_tokens, done.tokens.len());
        let delta = json!({"stop_reason": reason, "stop_sequence": sequence});
        events.push((
            "message_delta",
            json!({"type": "message_delta", "delta": delta, "usage": usage}),
        ));
        events.push(("message_stop", json!({"type": "message_stop"})));
        events
    }

    /// Starts a `tool_use` block for `call` (its input empty, filled by `input_json_delta`s);
    /// returns its index.
    fn open_call(&mut self, call: &ToolCall, events: &mut Vec<NamedEvent>) -> usize {
        self.close(events);
        self.called = true;
        self.begin(Open::ToolUse, tool_use_block(call, json!({})), events)
    }

    /// The index of an open block of `kind`, starting `block` when another kind (or none) is
    /// open.
    fn ensure(&mut self, kind: Open, block: Value, events: &mut Vec<NamedEvent>) -> usize {
        match self.open {
            Some((open, index)) if open == kind => index,
            _ => {
                self.close(events);
                self.begin(kind, block, events)
            }
        }
    }

    fn begin(&mut self, kind: Open, block: Value, events: &mut Vec<NamedEvent>) -> usize {
        let index = self.blocks;
        self.blocks += 1;
        self.open = Some((kind, index));
        let start = json!({"type": "content_block_start", "index": index, "content_block": block});
        events.push(("content_block_start", start));
        index
    }

    fn close(&mut self, events: &mut Vec<NamedEvent>) {
        if let Some((_, index)) = self.open.take() {
            let stop = json!({"type": "content_block_stop", "index": index});
            events.push(("content_block_stop", stop));
        }
    }
}

fn delta(index: usize, delta: Value) -> NamedEvent {
    let event = json!({"type": "content_block_delta", "index": index, "delta": delta});
    ("content_block_delta", event)
}

fn arguments(index: usize, partial_json: String) -> NamedEvent {
    delta(
        index,
        json!({"type": "input_json_delta", "partial_json": partial_json}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(stop_reason: StopReason, matched: Option<&str>) -> Finished {
        Finished {
            stop_reason,
            stop_sequence_matched: matched.map(str::to_owned),
            tokens: vec![5, 6, 7],
            prompt_tokens: 10,
            cached_tokens: 4,
            prefill_time_ms: 1.0,
            time_to_first_token_ms: 1.0,
            decode_time_ms: 1.0,
            decode_steps_ms: 1.0,
            speculation: Default::default(),
        }
    }

    fn message() -> Message {
        Message {
            id: "msg_1".into(),
            model: "m".into(),
        }
    }

    fn call(arguments: &str) -> ToolCall {
        ToolCall {
            id: "call_0123".into(),
            name: "f".into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn a_whole_message_has_its_blocks_stop_reason_and_usage() {
        let pieces = [
            Piece::Reasoning("hm".into()),
            Piece::Content("Checking.".into()),
            Piece::Call(call(r#"{"x": 1}"#)),
        ];
        let whole = message().whole(&pieces, &done(StopReason::Eos, None));
        assert_eq!(
            (&whole["type"], &whole["role"], &whole["id"]),
            (&json!("message"), &json!("assistant"), &json!("msg_1"))
        );
        assert_eq!(
            whole["content"],
            json!([
                {"type": "thinking", "thinking": "hm", "signature": ""},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_0123", "name": "f", "input": {"x": 1}},
            ])
        );
        assert_eq!(
            (&whole["stop_reason"], &whole["stop_sequence"]),
            (&json!("tool_use"), &Value::Null)
        );
        assert_eq!(
            whole["usage"],
            json!({"input_tokens": 6, "output_tokens": 3, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 4})
        );
        let cut = message().whole(
            &[Piece::Call(call(r#"{"x": "#))],
            &done(StopReason::MaxTokens, None),
        );
        assert_eq!(cut["content"][0]["input"], json!({}));
        assert_eq!(cut["stop_reason"], "max_tokens");
        let stopped = message().whole(&[], &done(StopReason::StopSequence, Some("##")));
        assert_eq!(
            (
                &stopped["stop_reason"],
                &stopped["stop_sequence"],
                &stopped["content"]
            ),
            (&json!("stop_sequence"), &json!("##"), &json!([]))
        );
        let ended = message().whole(&[Piece::Content("a".into())], &done(StopReason::Eos, None));
        assert_eq!(ended["stop_reason"], "end_turn");
    }

    #[test]
    fn a_stream_opens_one_block_per_run_and_per_call() {
        let (mut stream, start) = BlockEvents::start(&message(), 10, 4);
        assert_eq!(start[0].1["message"]["content"], json!([]));
        assert!(start[0].1["message"]["stop_reason"].is_null());
        assert_eq!(start[0].1["message"]["usage"]["input_tokens"], 6);
        assert_eq!(start[1].0, "ping");
        let mut events = Vec::new();
        for piece in [
            Piece::Content("a".into()),
            Piece::Content("b".into()),
            Piece::CallStart(call("")),
            Piece::Arguments("{\"x\"".into()),
            Piece::Arguments(": 1}".into()),
            Piece::Call(call("{}")),
        ] {
            events.extend(stream.piece(piece));
        }
        events.extend(stream.finish(&done(StopReason::Eos, None)));
        assert_eq!(events.len(), 13, "{events:?}");
        let names: Vec<&str> = events.iter().map(|(name, _)| *name).collect();
        assert_eq!(
            names,
            [
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        for (name, data) in &events {
            assert_eq!(data["type"], *name);
        }
        assert_eq!(
            events[1].1["delta"],
            json!({"type": "text_delta", "text": "a"})
        );
        let tool = &events[4].1;
        assert_eq!(
            (&tool["index"], &tool["content_block"]),
            (
                &json!(1),
                &json!({"type": "tool_use", "id": "toolu_0123", "name": "f", "input": {}})
            )
        );
        assert_eq!(
            events[6].1["delta"],
            json!({"type": "input_json_delta", "partial_json": ": 1}"})
        );
        assert_eq!(events[10].1["index"], 2);
        let end = &events[11].1;
        assert_eq!(
            end["delta"],
            json!({"stop_reason": "tool_use", "stop_sequence": null})
        );
        assert_eq!(end["usage"]["output_tokens"], 3);
    }

    #[test]
    fn reasoning_streams_as_a_thinking_block_before_the_text() {
        let (mut stream, _) = BlockEvents::start(&message(), 3, 0);
        let mut events = Vec::new();
        for piece in [
            Piece::Reasoning("2+2".into()),
            Piece::Reasoning(" is 4".into()),
            Piece::Content("4".into()),
        ] {
            events.extend(stream.piece(piece));
        }
        let block = &events[0].1["content_block"];
        assert_eq!(
            block,
            &json!({"type": "thinking", "thinking": "", "signature": ""})
        );
        assert_eq!(
            events[2].1["delta"],
            json!({"type": "thinking_delta", "thinking": " is 4"})
        );
        assert_eq!(
            (events[3].0, &events[4].1["content_block"]["type"]),
            ("content_block_stop", &json!("text"))
        );
        assert_eq!(events[4].1["index"], 1);
    }
}
