//! A reply's pieces as the Responses API's typed stream events, each with its
//! `sequence_number`: one output item per run of text (a `message`), of reasoning (a
//! `reasoning` item) or per tool call (a `function_call`), in the order the model wrote them.
//! The whole response of a request that is not streamed is the same machine's last object, so
//! both carry the same items.

use serde_json::{Value, json};
use worker_common::generate::Finished;

use super::output::{
    ResponseHead, Status, call_item, call_item_id, item_id, message_item, reasoning_item,
    reasoning_part, text_part, usage,
};
use crate::api::openai::{Piece, ToolCall};

/// One stream event: its `event:` name (its `type`) and its `data:` object.
pub type NamedEvent = (&'static str, Value);

/// The kind of the item a stream has open.
#[derive(Debug)]
enum Kind {
    Message,
    Reasoning,
    Call(ToolCall),
}

/// The open item: its kind, id, output index and text (a call's arguments) so far.
#[derive(Debug)]
struct Open {
    kind: Kind,
    id: String,
    index: usize,
    text: String,
}

/// The events of one response.
#[derive(Debug)]
pub struct ResponseEvents {
    head: ResponseHead,
    /// The next event's `sequence_number`.
    sequence: u64,
    open: Option<Open>,
    /// The items done so far.
    output: Vec<Value>,
}

impl ResponseEvents {
    /// The events of the response `head` starts: `response.created` and
    /// `response.in_progress`, without output.
    pub fn start(head: ResponseHead) -> (Self, Vec<NamedEvent>) {
        let mut events = Self {
            head,
            sequence: 0,
            open: None,
            output: Vec::new(),
        };
        let object = events.head.object(Status::InProgress, &[], None);
        let first = vec![
            events.event("response.created", json!({"response": object})),
            events.event("response.in_progress", json!({"response": object})),
        ];
        (events, first)
    }

    /// The whole response of `pieces` (a collected reply), and its output items.
    pub fn whole(head: ResponseHead, pieces: Vec<Piece>, done: &Finished) -> (Value, Vec<Value>) {
        let (mut events, _) = Self::start(head);
        for piece in pieces {
            events.piece(piece);
        }
        events.close_as(item_status(done));
        let object = events.end_object(done);
        (object, events.output)
    }

    /// The items done so far.
    pub fn output(&self) -> &[Value] {
        &self.output
    }

    /// The events one piece of the reply sends.
    pub fn piece(&mut self, piece: Piece) -> Vec<NamedEvent> {
        let mut events = Vec::new();
        match piece {
            Piece::Content(text) => self.text(Kind::Message, text, &mut events),
            Piece::Reasoning(text) => self.text(Kind::Reasoning, text, &mut events),
            Piece::CallStart(call) => self.open_call(call, &mut events),
            Piece::Call(call) => {
                let arguments = call.arguments.clone();
                self.open_call(call, &mut events);
                self.arguments(arguments, &mut events);
                events.extend(self.close());
            }
            Piece::Arguments(text) => self.arguments(text, &mut events),
        }
        events
    }

    /// The reply ended: the open item's end, then `response.completed` (or
    /// `response.incomplete` when `max_output_tokens` cut it) with the whole response.
    pub fn finish(&mut self, done: &Finished) -> Vec<NamedEvent> {
        let mut events = self.close_as(item_status(done));
        let object = self.end_object(done);
        let name = match Status::of(done) {
            Status::Incomplete => "response.incomplete",
            _ => "response.completed",
        };
        events.push(self.event(name, json!({"response": object})));
        events
    }

    /// The job failed: `response.failed` with the items done so far and the error.
    pub fn fail(&mut self, message: &str) -> Vec<NamedEvent> {
        let object = self
            .head
            .object(Status::Failed(message), &self.output, None);
        vec![self.event("response.failed", json!({"response": object}))]
    }

    fn end_object(&self, done: &Finished) -> Value {
        self.head
            .object(Status::of(done), &self.output, Some(usage(done)))
    }

    /// An event named `name` holding `data`, numbered.
    fn event(&mut self, name: &'static str, mut data: Value) -> NamedEvent {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        (name, data)
    }

    /// More text of `kind` (a message's or reasoning): into the open item when it is of that
    /// kind, else into a new one after closing the open one.
    fn text(&mut self, kind: Kind, text: String, events: &mut Vec<NamedEvent>) {
        let (name, same) = match (&kind, self.open.as_ref().map(|open| &open.kind)) {
            (Kind::Message, Some(Kind::Message)) => ("response.output_text.delta", true),
            (Kind::Message, _) => ("response.output_text.delta", false),
            (_, Some(Kind::Reasoning)) => ("response.reasoning_text.delta", true),
            _ => ("response.reasoning_text.delta", false),
        };
        if !same {
            events.extend(self.close());
            events.extend(self.begin(kind));
        }
        let Some(open) = self.open.as_mut() else {
            return;
        };
        let mut data = json!({"item_id": open.id, "output_index": open.index,
            "content_index": 0, "delta": text});
        if matches!(open.kind, Kind::Message) {
            data["logprobs"] = json!([]);
        }
        open.text.push_str(&text);
        events.push(self.event(name, data));
    }

    /// Opens an item of `kind`: `response.output_item.added`, and for text the
    /// `response.content_part.added` of its one part.
    fn begin(&mut self, kind: Kind) -> Vec<NamedEvent> {
        let index = self.output.len();
        let (id, item, part) = match &kind {
            Kind::Message => {
                let id = item_id("msg");
                let item = message_item(&id, None, "in_progress");
                (id, item, Some(text_part("")))
            }
            Kind::Reasoning => {
                let id = item_id("rs");
                let item = reasoning_item(&id, None, "in_progress");
                (id, item, Some(reasoning_part("")))
            }
            Kind::Call(call) => (call_item_id(call), call_item(call, "", "in_progress"), None),
        };
        let mut events = Vec::new();
        let added = json!({"output_index": index, "item": item});
        events.push(self.event("response.output_item.added", added));
        if let Some(part) = part {
            let data = json!({"item_id": id, "output_index": index, "content_index": 0,
                "part": part});
            events.push(self.event("response.content_part.added", data));
        }
        self.open = Some(Open {
            kind,
            id,
            index,
            text: String::new(),
        });
        events
    }

    fn open_call(&mut self, call: ToolCall, events: &mut Vec<NamedEvent>) {
        events.extend(self.close());
        events.extend(self.begin(Kind::Call(call)));
    }

    /// More of the open call's arguments.
    fn arguments(&mut self, text: String, events: &mut Vec<NamedEvent>) {
        let calling = |open: &&mut Open| matches!(open.kind, Kind::Call(_));
        let Some(open) = self.open.as_mut().filter(calling) else {
            return;
        };
        if text.is_empty() {
            return;
        }
        open.text.push_str(&text);
        let data = json!({"item_id": open.id, "output_index": open.index, "delta": text});
        events.push(self.event("response.function_call_arguments.delta", data));
    }

    /// Closes the open item, if any, as completed: another item follows it.
    fn close(&mut self) -> Vec<NamedEvent> {
        self.close_as("completed")
    }

    /// Closes the open item, if any, with `status`: its text's and part's `done` events and
    /// `response.output_item.done`; the item joins the output.
    fn close_as(&mut self, status: &str) -> Vec<NamedEvent> {
        let Some(Open {
            kind,
            id,
            index,
            text,
        }) = self.open.take()
        else {
            return Vec::new();
        };
        let mut events = Vec::new();
        let at = json!({"item_id": id, "output_index": index, "content_index": 0});
        let with = |mut base: Value, key: &str, value: Value| {
            base[key] = value;
            base
        };
        let item = match kind {
            Kind::Message => {
                let done = with(at.clone(), "text", json!(text));
                let done = with(done, "logprobs", json!([]));
                events.push(self.event("response.output_text.done", done));
                let part = with(at, "part", text_part(&text));
                events.push(self.event("response.content_part.done", part));
                message_item(&id, Some(&text), status)
            }
            Kind::Reasoning => {
                let done = with(at.clone(), "text", json!(text));
                events.push(self.event("response.reasoning_text.done", done));
                let part = with(at, "part", reasoning_part(&text));
                events.push(self.event("response.content_part.done", part));
                reasoning_item(&id, Some(&text), status)
            }
            Kind::Call(call) => {
                let done = json!({"item_id": id, "output_index": index, "name": call.name,
                    "arguments": text});
                events.push(self.event("response.function_call_arguments.done", done));
                call_item(&call, &text, status)
            }
        };
        let done = json!({"output_index": index, "item": item});
        events.push(self.event("response.output_item.done", done));
        self.output.push(item);
        events
    }
}

/// The status of the item open when the reply ended: `incomplete` when `max_output_tokens` (or
/// the context) cut it, as OpenAI marks the item it cut; `completed` otherwise. Items closed
/// before (another followed them, or a call the parser had whole) are completed.
fn item_status(done: &Finished) -> &'static str {
    match Status::of(done) {
        Status::Incomplete => Status::Incomplete.as_str(),
        _ => Status::Completed.as_str(),
    }
}

#[cfg(test)]
mod tests;
