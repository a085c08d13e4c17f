//! Speculative decoding by prompt lookup (`--spec-ngram`) against the real worker binary
//! (`LLORCH_TEST_WORKER`, default `llorch-cpud`) on SmolLM2: greedy jobs get exactly the tokens
//! they get without speculation, alone and together, while drafts are verified and accepted;
//! `speculative: false` opts a job out; seeded sampled jobs speculate and keep their seed's
//! tokens; structured output speculates and stays valid, with the tokens it has without; a
//! draft model (`--draft-model`) gives the same tokens, and one of another vocabulary is refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use llorch_tests::assets::Model;
use llorch_tests::http::{self, post_json};
use llorch_tests::stream::{assert_well_formed, job, run, terminal, text};
use llorch_tests::worker::{Worker, serial, smollm2};
use serde_json::{Value, json};

/// A prompt whose answer repeats most of it: prompt lookup's case.
const REWRITE: &str = "Rewrite this function so that it returns the largest value.\n\n\
def total(values):\n    result = 0\n    for value in values:\n        result = result + value\n    \
return result\n\nHere is the function with that one change:\n\ndef largest(values):\n";

/// A list the model continues: its items follow the same pattern.
const LIST: &str = "Colors: red, green, blue, red, green, blue, red, green, blue, red,";

fn metric(addr: SocketAddr, name: &str) -> f64 {
    let text = http::get(addr, "/metrics").unwrap().text();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// A greedy job of `max_tokens` on `prompt` (raw text), with `extra` fields.
fn greedy(id: &str, prompt: &str, extra: Value) -> Value {
    let mut fields = json!({"raw": true, "temperature": 0.0, "max_tokens": 96});
    if let (Some(fields), Some(extra)) = (fields.as_object_mut(), extra.as_object()) {
        fields.extend(extra.clone());
    }
    job(id, prompt, fields)
}

/// The text and the generated token count of a finished job.
fn finished(addr: SocketAddr, body: &Value) -> (String, u64) {
    let events = run(addr, body);
    assert_well_formed(&events);
    let end = terminal(&events);
    assert_eq!(
        events.last().map(|e| e.event.as_str()),
        Some("end"),
        "{end}"
    );
    (text(&events), end["tokens_out"].as_u64().unwrap_or(0))
}

#[test]
fn prompt_lookup_gives_exactly_the_tokens_of_plain_decoding() {
    let _serial = serial();
    let worker = smollm2(&["--spec-ngram", "--parallel", "4"]);
    let addr = worker.addr;
    for (i, prompt) in [REWRITE, LIST].into_iter().enumerate() {
        let before = drafted_before(addr);
        let opted_out = greedy(&format!("plain{i}"), prompt, json!({"speculative": false}));
        let plain = finished(addr, &opted_out);
        assert_eq!(
            drafted_before(addr),
            before,
            "prompt {i}: an opted-out job drafted"
        );
        let fast = finished(addr, &greedy(&format!("fast{i}"), prompt, json!({})));
        assert_eq!(fast, plain, "prompt {i}: speculation changed the output");
        assert!(
            drafted_before(addr) > before,
            "prompt {i}: nothing was drafted for a prompt that repeats itself"
        );
    }
    let accepted = metric(addr, "worker_spec_accepted_tokens_total");
    let drafted = metric(addr, "worker_spec_draft_tokens_total");
    assert!(
        accepted > 0.0 && accepted <= drafted,
        "{accepted} of {drafted}"
    );
    // One acceptance ratio per job that drafted: the two speculating ones.
    assert_eq!(metric(addr, "worker_spec_acceptance_ratio_count"), 2.0);
}

/// Drafted tokens so far.
fn drafted_before(addr: SocketAddr) -> f64 {
    metric(addr, "worker_spec_draft_tokens_total")
}

#[test]
fn speculating_jobs_decoded_together_give_the_tokens_each_gives_alone() {
    let _serial = serial();
    let worker = smollm2(&["--spec-ngram", "--parallel", "4"]);
    let addr = worker.addr;
    let bodies: Vec<Value> = (0..4)
        .map(|i| {
            let prompt = if i % 2 == 0 { REWRITE } else { LIST };
            greedy(&format!("j{i}"), prompt, json!({"max_tokens": 48 + 8 * i}))
        })
        .collect();
    let alone: Vec<(String, u64)> = bodies
        .iter()
        .map(|body| {
            let mut body = body.clone();
            body["speculative"] = json!(false);
            body["job_id"] = json!(format!("alone-{}", body["job_id"].as_str().unwrap_or("")));
            finished(addr, &body)
        })
        .collect();
    let threads: Vec<_> = bodies
        .into_iter()
        .map(|body| std::thread::spawn(move || finished(addr, &body)))
        .collect();
    for (i, (thread, alone)) in threads.into_iter().zip(&alone).enumerate() {
        assert_eq!(&thread.join().unwrap(), alone, "job {i}");
    }
    // A seeded sampled job speculates too, and keeps the tokens of its seed: opted out, alone
    // and beside greedy jobs.
    let sampled = |id: &str, speculative: bool| {
        let fields = json!({"raw": true, "temperature": 0.8, "seed": 7, "max_tokens": 48,
            "speculative": speculative});
        finished(addr, &job(id, LIST, fields))
    };
    let plain = sampled("s0", false);
    let drafted = drafted_before(addr);
    assert_eq!(
        sampled("s1", true),
        plain,
        "speculation changed a seeded job"
    );
    assert!(
        drafted_before(addr) > drafted,
        "a sampled job drafted nothing"
    );
    let beside: Vec<_> = (0..2)
        .map(|i| {
            let body = greedy(&format!("b{i}"), REWRITE, json!({}));
            std::thread::spawn(move || finished(addr, &body))
        })
        .collect();
    assert_eq!(
        sampled("s2", true),
        plain,
        "a seeded job beside greedy ones"
    );
    for thread in beside {
        thread.join().unwrap();
    }
}

/// A chat request for JSON that repeats its prompt's list, under a schema.
fn structured(speculative: bool) -> Value {
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string"},
        "colors": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "colors"]});
    json!({"messages": [{"role": "user", "content": format!(
        "Return JSON with the name Alice and these colors, in order: {}",
        "red, green, blue, red, green, blue, red, green, blue")}],
        "max_tokens": 80, "temperature": 0, "speculative": speculative,
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}})
}

#[test]
fn structured_output_speculates_and_keeps_its_tokens() {
    let _serial = serial();
    let worker = smollm2(&["--spec-ngram"]);
    let addr = worker.addr;
    let content = |speculative| {
        let reply = post_json(addr, "/v1/chat/completions", &structured(speculative)).unwrap();
        assert_eq!(reply.status, 200);
        let reply = reply.json();
        let choice = &reply["choices"][0];
        (
            choice["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            choice["finish_reason"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    };
    let plain = content(false);
    let drafted = drafted_before(addr);
    let fast = content(true);
    assert_eq!(fast, plain, "speculation changed a structured reply");
    assert!(
        drafted_before(addr) > drafted,
        "a structured job drafted nothing"
    );
    if plain.1 == "stop" {
        let parsed: Value = serde_json::from_str(&plain.0).expect("valid JSON");
        assert!(parsed["colors"].is_array(), "{parsed}");
    }
}

#[test]
fn a_draft_model_gives_exactly_the_tokens_of_plain_decoding() {
    let _serial = serial();
    let model = Model::SmolLm2.path();
    let draft = model.display().to_string();
    let worker = smollm2(&["--draft-model", &draft, "--parallel", "2"]);
    let addr = worker.addr;
    for (i, prompt) in [REWRITE, LIST].into_iter().enumerate() {
        let plain = finished(
            addr,
            &greedy(&format!("p{i}"), prompt, json!({"speculative": false})),
        );
        let fast = finished(addr, &greedy(&format!("f{i}"), prompt, json!({})));
        assert_eq!(
            fast, plain,
            "prompt {i}: the draft model changed the output"
        );
    }
    let sampled = |id: &str, speculative: bool| {
        let fields = json!({"raw": true, "temperature": 0.8, "seed": 11, "max_tokens": 40,
            "speculative": speculative});
        finished(addr, &job(id, REWRITE, fields))
    };
    assert_eq!(sampled("s1", true), sampled("s0", false));
    // The model drafting for itself: greedy drafts are all its own choices.
    let accepted = metric(addr, "worker_spec_accepted_tokens_total");
    let drafted = metric(addr, "worker_spec_draft_tokens_total");
    assert!(accepted > 0.5 * drafted, "{accepted} of {drafted}");
}

#[test]
fn a_draft_model_with_another_vocabulary_is_refused_at_start() {
    let _serial = serial();
    let draft = Model::Qwen05.path().display().to_string();
    let mut worker = Worker::spawn(&Model::SmolLm2.path(), &["--draft-model", &draft]);
    let status = worker
        .wait_exit(Duration::from_secs(120))
        .expect("still running");
    assert_eq!(status.code(), Some(1));
    let logs = worker.log_lines().join("\n");
    assert!(
        logs.contains("another vocabulary") && logs.contains("qwen"),
        "{logs}"
    );
}
