use serde_json::Map;
use worker_common::generate::StopReason;

use super::*;

fn done(stop_reason: StopReason) -> Finished {
    Finished {
        stop_reason,
        stop_sequence_matched: None,
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

fn head() -> ResponseHead {
    let mut echo = Map::new();
    echo.insert("tool_choice".into(), json!("auto"));
    ResponseHead {
        id: "resp_1".into(),
        created_at: 7,
        model: "m".into(),
        echo,
    }
}

fn call(arguments: &str) -> ToolCall {
    ToolCall {
        id: "call_0123".into(),
        name: "f".into(),
        arguments: arguments.into(),
    }
}

fn names(events: &[NamedEvent]) -> Vec<&str> {
    events.iter().map(|(name, _)| *name).collect()
}

#[test]
fn a_whole_response_has_its_items_status_and_usage() {
    let pieces = vec![
        Piece::Reasoning("hm".into()),
        Piece::Content("Checking.".into()),
        Piece::Call(call(r#"{"x": 1}"#)),
    ];
    let (whole, output) = ResponseEvents::whole(head(), pieces, &done(StopReason::Eos));
    assert_eq!(
        (
            &whole["id"],
            &whole["object"],
            &whole["status"],
            &whole["model"]
        ),
        (
            &json!("resp_1"),
            &json!("response"),
            &json!("completed"),
            &json!("m")
        )
    );
    assert_eq!(
        (&whole["created_at"], &whole["tool_choice"]),
        (&json!(7), &json!("auto"))
    );
    assert!(whole["error"].is_null() && whole["incomplete_details"].is_null());
    assert_eq!(whole["output"], Value::Array(output.clone()));
    assert_eq!(output.len(), 3);
    let reasoning = &output[0];
    assert_eq!(reasoning["type"], "reasoning");
    assert!(reasoning["id"].as_str().unwrap().starts_with("rs_"));
    assert_eq!(
        reasoning["content"],
        json!([{"type": "reasoning_text", "text": "hm"}])
    );
    let message = &output[1];
    let id = message["id"].as_str().unwrap();
    assert!(id.starts_with("msg_") && id.len() == 36, "{id}");
    assert_eq!(
        message["content"],
        json!([{"type": "output_text", "text": "Checking.", "annotations": []}])
    );
    assert_eq!(
        (&message["role"], &message["status"]),
        (&json!("assistant"), &json!("completed"))
    );
    assert_eq!(
        output[2],
        json!({"type": "function_call", "id": "fc_0123", "call_id": "call_0123", "name": "f",
            "arguments": "{\"x\": 1}", "status": "completed"})
    );
    assert_eq!(
        whole["usage"],
        json!({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
            "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 13})
    );
    let (cut, _) = ResponseEvents::whole(
        head(),
        vec![Piece::Content("a".into())],
        &done(StopReason::MaxTokens),
    );
    assert_eq!(cut["status"], "incomplete");
    assert_eq!(
        cut["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    let (empty, output) = ResponseEvents::whole(head(), vec![], &done(StopReason::Eos));
    assert_eq!((empty["output"].clone(), output.len()), (json!([]), 0));
}

#[test]
fn a_stream_numbers_its_events_and_opens_one_item_per_run_and_call() {
    let (mut stream, mut events) = ResponseEvents::start(head());
    for piece in [
        Piece::Content("a".into()),
        Piece::Content("b".into()),
        Piece::CallStart(call("")),
        Piece::Arguments("{\"x\"".into()),
        Piece::Arguments(": 1}".into()),
    ] {
        events.extend(stream.piece(piece));
    }
    events.extend(stream.finish(&done(StopReason::Eos)));
    assert_eq!(
        names(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], *name);
        assert_eq!(data["sequence_number"], i, "{data}");
    }
    let created = &events[0].1["response"];
    assert_eq!(
        (&created["status"], &created["output"], &created["usage"]),
        (&json!("in_progress"), &json!([]), &Value::Null)
    );
    let added = &events[2].1;
    assert_eq!(added["output_index"], 0);
    assert_eq!(
        (&added["item"]["status"], &added["item"]["content"]),
        (&json!("in_progress"), &json!([]))
    );
    let message_id = added["item"]["id"].clone();
    let delta = &events[5].1;
    assert_eq!(
        (
            &delta["item_id"],
            &delta["output_index"],
            &delta["content_index"],
            &delta["delta"]
        ),
        (&message_id, &json!(0), &json!(0), &json!("b"))
    );
    assert_eq!(events[6].1["text"], "ab");
    assert_eq!(events[7].1["part"]["text"], "ab");
    assert_eq!(events[8].1["item"]["content"][0]["text"], "ab");
    let call_added = &events[9].1;
    assert_eq!(call_added["output_index"], 1);
    assert_eq!(
        call_added["item"],
        json!({"type": "function_call", "id": "fc_0123", "call_id": "call_0123", "name": "f",
            "arguments": "", "status": "in_progress"})
    );
    assert_eq!(events[11].1["delta"], ": 1}");
    assert_eq!(
        (
            &events[12].1["arguments"],
            &events[12].1["name"],
            &events[12].1["item_id"]
        ),
        (&json!("{\"x\": 1}"), &json!("f"), &json!("fc_0123"))
    );
    let completed = &events[14].1["response"];
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["output"], Value::Array(stream.output().to_vec()));
    assert_eq!(completed["output"][1]["arguments"], "{\"x\": 1}");
    assert_eq!(completed["usage"]["output_tokens"], 3);
}

#[test]
fn reasoning_streams_as_its_own_item_before_the_message() {
    let (mut stream, _) = ResponseEvents::start(head());
    let mut events = Vec::new();
    for piece in [
        Piece::Reasoning("2+2".into()),
        Piece::Reasoning(" is 4".into()),
        Piece::Content("4".into()),
    ] {
        events.extend(stream.piece(piece));
    }
    events.extend(stream.finish(&done(StopReason::MaxTokens)));
    assert_eq!(
        names(&events)[..6],
        [
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
        ]
    );
    assert_eq!(events[0].1["item"]["type"], "reasoning");
    assert_eq!(
        events[1].1["part"],
        json!({"type": "reasoning_text", "text": ""})
    );
    assert_eq!(events[4].1["text"], "2+2 is 4");
    assert_eq!(events[7].1["item"]["type"], "message");
    assert_eq!(events[7].1["output_index"], 1);
    let (name, last) = events.last().unwrap();
    assert_eq!(*name, "response.incomplete");
    assert_eq!(
        last["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
}

#[test]
fn a_failure_sends_response_failed_with_the_items_done() {
    let (mut stream, start) = ResponseEvents::start(head());
    let mut events = start;
    events.extend(stream.piece(Piece::Call(call("{}"))));
    events.extend(stream.piece(Piece::Content("par".into())));
    events.extend(stream.fail("the device failed"));
    let (name, failed) = events.last().unwrap();
    assert_eq!(*name, "response.failed");
    assert_eq!(failed["sequence_number"], events.len() - 1);
    let response = &failed["response"];
    assert_eq!(response["status"], "failed");
    assert_eq!(
        response["error"],
        json!({"code": "server_error", "message": "the device failed"})
    );
    assert_eq!(
        response["output"].as_array().map(Vec::len),
        Some(1),
        "{response}"
    );
}
