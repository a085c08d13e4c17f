use serde_json::{Value, json};

use super::*;

const LIMITS: Limits = Limits {
    max_tokens_out: 2048,
};

fn parse(body: &Value) -> Result<ExecuteRequest, Vec<FieldError>> {
    ExecuteRequest::parse(
        Some("application/json"),
        body.to_string().as_bytes(),
        LIMITS,
    )
}

fn with(field: &str, value: Value) -> Value {
    let mut body = json!({"job_id": "j", "prompt": "hi"});
    body[field] = value;
    body
}

/// The single (field, constraint) a body is refused with.
fn refusal(body: &Value) -> (String, String) {
    match parse(body) {
        Ok(request) => panic!("accepted {body}: {request:?}"),
        Err(errors) => {
            assert_eq!(errors.len(), 1, "{errors:?}");
            (errors[0].field.clone(), errors[0].constraint.clone())
        }
    }
}

fn refused(field: &str, constraint: &str) -> (String, String) {
    (field.into(), constraint.into())
}

#[test]
fn defaults_follow_the_contract() {
    let request = parse(&json!({"job_id": "j", "prompt": "hi"})).unwrap();
    assert_eq!(request.max_tokens, 2048);
    assert_eq!(request.sampling.temperature, 1.0);
    assert_eq!(
        (
            request.sampling.top_k,
            request.sampling.top_p,
            request.sampling.min_p
        ),
        (0, 1.0, 0.0)
    );
    assert_eq!(request.sampling.repetition_penalty, 1.0);
    assert!(request.stop.is_empty() && request.seed.is_none() && !request.raw);
}

#[test]
fn max_tokens_boundaries() {
    assert_eq!(
        refusal(&with("max_tokens", json!(0))),
        refused("max_tokens", "range(1..=2048)")
    );
    assert_eq!(parse(&with("max_tokens", json!(1))).unwrap().max_tokens, 1);
    assert_eq!(
        parse(&with("max_tokens", json!(2048))).unwrap().max_tokens,
        2048
    );
    assert_eq!(
        refusal(&with("max_tokens", json!(2049))),
        refused("max_tokens", "range(1..=2048)")
    );
    assert_eq!(
        refusal(&with("max_tokens", json!(-1))),
        refused("max_tokens", "range(1..=2048)")
    );
    assert_eq!(
        refusal(&with("max_tokens", json!(1.5))),
        refused("max_tokens", "type(integer)")
    );
    let capped = Limits {
        max_tokens_out: 100,
    };
    let body = with("max_tokens", json!(500)).to_string();
    let request = ExecuteRequest::parse(Some("application/json"), body.as_bytes(), capped).unwrap();
    assert_eq!(request.max_tokens, 100);
}

#[test]
fn temperature_and_probability_boundaries() {
    let t = |v: Value| with("temperature", v);
    assert_eq!(
        refusal(&t(json!(-0.1))),
        refused("temperature", "range(0.0..=2.0)")
    );
    assert_eq!(parse(&t(json!(0))).unwrap().sampling.temperature, 0.0);
    assert_eq!(parse(&t(json!(2))).unwrap().sampling.temperature, 2.0);
    assert_eq!(
        refusal(&t(json!(2.1))),
        refused("temperature", "range(0.0..=2.0)")
    );
    assert_eq!(
        refusal(&with("top_p", json!(1.01))),
        refused("top_p", "range(0.0..=1.0)")
    );
    assert_eq!(
        refusal(&with("min_p", json!(-0.5))),
        refused("min_p", "range(0.0..=1.0)")
    );
    assert_eq!(
        parse(&with("top_p", json!(0.0))).unwrap().sampling.top_p,
        0.0
    );
    let penalty = |v: Value| with("repetition_penalty", v);
    assert_eq!(
        refusal(&penalty(json!(0))),
        refused("repetition_penalty", "range(0.0..=2.0)")
    );
    assert_eq!(
        parse(&penalty(json!(2.0)))
            .unwrap()
            .sampling
            .repetition_penalty,
        2.0
    );
    assert_eq!(
        refusal(&penalty(json!(2.01))),
        refused("repetition_penalty", "range(0.0..=2.0)")
    );
    assert_eq!(
        refusal(&t(json!("hot"))),
        refused("temperature", "type(number)")
    );
}

#[test]
fn prompt_and_job_id_boundaries() {
    let prompt = |n: usize| with("prompt", json!("é".repeat(n)));
    // No character cap here: the context bounds prompts in tokens once they are tokenized.
    assert_eq!(
        parse(&prompt(200_000)).unwrap().prompt.chars().count(),
        200_000
    );
    assert_eq!(parse(&prompt(1)).unwrap().prompt.chars().count(), 1);
    assert_eq!(refusal(&prompt(0)), refused("prompt", "non_empty"));
    assert_eq!(
        refusal(&with("job_id", json!(""))),
        refused("job_id", "non_empty")
    );
    assert_eq!(
        refusal(&with("job_id", json!("x".repeat(257)))),
        refused("job_id", "max_length(256)")
    );
    assert_eq!(
        refusal(&with("job_id", json!(7))),
        refused("job_id", "type(string)")
    );
    assert_eq!(
        refusal(&json!({"prompt": "hi"})),
        refused("job_id", "required")
    );
    assert_eq!(
        refusal(&json!({"job_id": "j", "prompt": null})),
        refused("prompt", "required")
    );
}

#[test]
fn stop_boundaries() {
    let stops = |v: Value| with("stop", v);
    assert_eq!(
        parse(&stops(json!(["a", "b", "c", "d"])))
            .unwrap()
            .stop
            .len(),
        4
    );
    assert_eq!(
        refusal(&stops(json!(["a", "b", "c", "d", "e"]))),
        refused("stop", "max_count(4)")
    );
    assert_eq!(
        refusal(&stops(json!(["a", ""]))),
        refused("stop[1]", "non_empty")
    );
    assert_eq!(
        parse(&stops(json!(["x".repeat(100)]))).unwrap().stop[0].len(),
        100
    );
    assert_eq!(
        refusal(&stops(json!(["x".repeat(101)]))),
        refused("stop[0]", "max_length(100)")
    );
    assert_eq!(
        refusal(&stops(json!("stop"))),
        refused("stop", "type(array)")
    );
    assert_eq!(
        refusal(&stops(json!([1]))),
        refused("stop[0]", "type(string)")
    );
}

#[test]
fn other_fields_and_unknown_fields() {
    let request = parse(&json!({
        "job_id": "j", "prompt": "hi", "seed": 42, "raw": true, "top_k": 1_000_000_000_000u64,
        "something_new": [1, 2],
    }))
    .unwrap();
    assert_eq!(
        (request.seed, request.raw, request.sampling.top_k),
        (Some(42), true, u32::MAX)
    );
    assert_eq!(
        refusal(&with("seed", json!(-1))),
        refused("seed", "type(u64)")
    );
    assert_eq!(
        refusal(&with("raw", json!("yes"))),
        refused("raw", "type(boolean)")
    );
}

#[test]
fn every_violation_is_reported_at_once() {
    let errors =
        parse(&json!({"job_id": "", "prompt": "", "max_tokens": 0, "temperature": 3})).unwrap_err();
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["job_id", "prompt", "max_tokens", "temperature"]);
    assert_eq!(errors[2].value, Some(json!(0)));
}

#[test]
fn bodies_that_are_not_json_objects() {
    let refuse = |content_type: Option<&str>, body: &str| {
        let errors = ExecuteRequest::parse(content_type, body.as_bytes(), LIMITS).unwrap_err();
        (errors[0].field.clone(), errors[0].constraint.clone())
    };
    assert_eq!(
        refuse(Some("application/json"), "{\"job_id\":"),
        refused("body", "json")
    );
    assert_eq!(
        refuse(Some("application/json"), "[1]"),
        refused("body", "type(object)")
    );
    assert_eq!(
        refuse(Some("text/plain"), "{}"),
        refused("body", "content_type(application/json)")
    );
    assert_eq!(
        refuse(None, "{}"),
        refused("body", "content_type(application/json)")
    );
    let charset = ExecuteRequest::parse(
        Some("application/json; charset=utf-8"),
        br#"{"job_id":"j","prompt":"hi"}"#,
        LIMITS,
    );
    assert!(charset.is_ok());
}

#[test]
fn cancel_bodies() {
    let ok = CancelRequest::parse(Some("application/json"), br#"{"job_id":"x"}"#).unwrap();
    assert_eq!(ok.job_id, "x");
    let errors = CancelRequest::parse(Some("application/json"), b"{}").unwrap_err();
    assert_eq!(errors[0].constraint, "required");
}
