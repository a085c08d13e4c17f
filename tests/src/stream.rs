//! Checks shared by the black-box contract tests: one job through `/execute`, and the shape
//! every stream must have.

use std::net::SocketAddr;

use serde_json::{Value, json};

use crate::http::{EventStream, SseEvent};

/// An `/execute` body: `job_id` and `prompt`, plus `extra` fields.
pub fn job(job_id: &str, prompt: &str, extra: Value) -> Value {
    let mut body = json!({"job_id": job_id, "prompt": prompt});
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    body
}

/// Runs one job to its end; panics unless it was accepted (200, `text/event-stream`).
pub fn run(addr: SocketAddr, body: &Value) -> Vec<SseEvent> {
    let stream = open(addr, body);
    let events = stream.collect();
    assert_well_formed(&events);
    events
}

/// Opens an accepted stream.
pub fn open(addr: SocketAddr, body: &Value) -> EventStream {
    let stream = EventStream::open(addr, "/execute", body)
        .unwrap_or_else(|err| panic!("POST /execute: {err}"));
    if stream.status != 200 {
        let status = stream.status;
        panic!("/execute answered {status}: {}", stream.rest());
    }
    let content_type = stream
        .headers
        .iter()
        .find(|(name, _)| name == "content-type")
        .map(|(_, value)| value.clone());
    assert_eq!(content_type.as_deref(), Some("text/event-stream"));
    stream
}

/// `started` first with its fields, contiguous `i` on tokens, `type` equal to the SSE event
/// name, exactly one terminal event and nothing after it.
pub fn assert_well_formed(events: &[SseEvent]) {
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names.first(), Some(&"started"), "{names:?}");
    let started = &events[0].data;
    for field in [
        "job_id",
        "model",
        "started_at",
        "seed",
        "prompt_tokens",
        "queue_position",
        "correlation_id",
    ] {
        assert!(
            !started[field].is_null(),
            "started lacks {field}: {started}"
        );
    }
    for event in events {
        assert_eq!(event.data["type"], event.event.as_str(), "{:?}", event.data);
    }
    let terminal = names
        .iter()
        .position(|name| *name == "end" || *name == "error")
        .unwrap_or_else(|| panic!("no terminal event: {names:?}"));
    assert_eq!(
        terminal,
        events.len() - 1,
        "events after the terminal one: {names:?}"
    );
    let indices: Vec<u64> = events
        .iter()
        .filter(|e| e.event == "token")
        .map(|e| e.data["i"].as_u64().unwrap_or(u64::MAX))
        .collect();
    assert!(
        indices.iter().copied().eq(0..indices.len() as u64),
        "{indices:?}"
    );
    for name in &names[1..terminal] {
        assert!(["token", "metrics"].contains(name), "{names:?}");
    }
}

/// The concatenated `t` of the token events.
pub fn text(events: &[SseEvent]) -> String {
    events
        .iter()
        .filter(|e| e.event == "token")
        .filter_map(|e| e.data["t"].as_str())
        .collect()
}

/// The terminal event's data.
pub fn terminal(events: &[SseEvent]) -> &Value {
    &events.last().unwrap_or_else(|| panic!("empty stream")).data
}
