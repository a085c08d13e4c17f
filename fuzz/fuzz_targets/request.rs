//! `/execute` and `/cancel` bodies: arbitrary bytes and content types go through the same
//! parse-and-validate step as the HTTP routes. A request is either refused with at least one
//! field error (each serializable as the contract's error object) or accepted with every field
//! inside its documented range.
//!
//! Input: byte 0 picks the route (bit 0) and the content type (bits 1-3), byte 1 picks
//! `--max-tokens-out`, the rest is the body.

#![no_main]

use libfuzzer_sys::fuzz_target;
use worker_http::api::{CancelRequest, ExecuteRequest, FieldError, Limits, require_json};

const CONTENT_TYPES: [Option<&str>; 8] = [
    Some("application/json"),
    Some("application/json; charset=utf-8"),
    Some(" Application/JSON ;x"),
    Some("text/plain"),
    None,
    Some(""),
    Some(";application/json"),
    Some("application/jsonx"),
];

fn check_errors(errors: &[FieldError]) {
    assert!(!errors.is_empty(), "refused without a field error");
    for error in errors {
        assert!(
            !error.field.is_empty() && !error.constraint.is_empty() && !error.message.is_empty()
        );
    }
    serde_json::to_string(errors).expect("field errors serialize");
}

fuzz_target!(|data: &[u8]| {
    let [route, limit, body @ ..] = data else {
        return;
    };
    let content_type = CONTENT_TYPES[(route >> 1) as usize % CONTENT_TYPES.len()];
    if route & 1 != 0 {
        match CancelRequest::parse(content_type, body) {
            Ok(cancel) => {
                assert!(require_json(content_type).is_ok());
                assert!((1..=256).contains(&cancel.job_id.len()));
            }
            Err(errors) => check_errors(&errors),
        }
        return;
    }
    let max_tokens_out = match limit % 8 {
        0 => 0,
        1 => 1,
        2 => 256,
        3 => 2048,
        4 => 4096,
        5 => u32::MAX,
        _ => u32::from(*limit),
    };
    match ExecuteRequest::parse(content_type, body, Limits { max_tokens_out }) {
        Ok(request) => {
            assert!(require_json(content_type).is_ok());
            assert!((1..=256).contains(&request.job_id.len()));
            assert!((1..=32768).contains(&request.prompt.chars().count()));
            assert!(request.max_tokens <= max_tokens_out.min(2048));
            assert!(request.max_tokens >= 1 || max_tokens_out == 0);
            assert!((0.0..=2.0).contains(&request.temperature));
            assert!((0.0..=1.0).contains(&request.top_p));
            assert!((0.0..=1.0).contains(&request.min_p));
            assert!(request.repetition_penalty > 0.0 && request.repetition_penalty <= 2.0);
            assert!(request.stop.len() <= 4);
            assert!(request.stop.iter().all(|s| (1..=100).contains(&s.len())));
        }
        Err(errors) => check_errors(&errors),
    }
});
