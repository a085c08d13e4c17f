//! The wire contract against the real worker binary (`LLORCH_TEST_WORKER`, default
//! `llorch-cpud`) on SmolLM2: stream shape and stop reasons, validation, health, metrics,
//! correlation ids, reproducibility, UTF-8, and the ready callback with a pool-manager stand-in.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use llorch_tests::assets::Model;
use llorch_tests::http::{self, post_json, request};
use llorch_tests::pool::{Pool, Requirement};
use llorch_tests::stream::{job, open, run, terminal, text};
use llorch_tests::worker::{Worker, serial, smollm2, worker_binary};
use serde_json::{Value, json};

#[test]
fn streams_have_the_contract_shape_and_stop_reasons() {
    let _serial = serial();
    let worker = smollm2(&[]);
    let greedy = json!({"raw": true, "temperature": 0, "max_tokens": 20, "seed": 7});
    let events = run(
        worker.addr,
        &job("max", "The capital of France is", greedy.clone()),
    );
    let started = &events[0].data;
    assert_eq!(
        (started["job_id"].as_str(), started["seed"].as_u64()),
        (Some("max"), Some(7))
    );
    assert_eq!(started["prompt_tokens"], 5);
    assert_eq!(started["queue_position"], 0);
    assert_eq!(started["model"], "Smollm2 135M 8k Lc100K Mix1 Ep2");
    let end = terminal(&events);
    assert_eq!(
        (end["type"].as_str(), end["stop_reason"].as_str()),
        (Some("end"), Some("MAX_TOKENS"))
    );
    assert_eq!(end["tokens_out"], 20);
    assert!(end.get("stop_sequence_matched").is_none());
    for field in [
        "decode_time_ms",
        "prefill_time_ms",
        "time_to_first_token_ms",
    ] {
        assert!(
            end[field].as_f64().is_some_and(|ms| ms > 0.0),
            "{field}: {end}"
        );
    }
    // The first tokens have clear margins on every backend (later ones may differ between the
    // CPU's Q8 activations and the GPU's f32 ones; specs/BACKEND.md, specs/CUDA.md).
    let full = text(&events);
    assert!(full.starts_with(" Paris.\n\nThe "), "{full:?}");

    // Stop strings taken from that greedy text: a one-token word, and a span across several
    // tokens; the text before the stop is streamed, the stop itself never, not even in part.
    let words: Vec<&str> = full.split_whitespace().collect();
    let word = words[3];
    let span_start = full.find(words[4]).unwrap();
    let span = &full[span_start..(span_start + 12).min(full.len())];
    for (id, stop) in [("stop", word), ("span", span)] {
        let mut with_stop = greedy.clone();
        with_stop["stop"] = json!([stop]);
        let events = run(worker.addr, &job(id, "The capital of France is", with_stop));
        let end = terminal(&events);
        assert_eq!(end["stop_reason"], "STOP_SEQUENCE", "{stop:?}");
        assert_eq!(end["stop_sequence_matched"], stop);
        assert_eq!(text(&events), full[..full.find(stop).unwrap()], "{stop:?}");
    }

    let chat = json!({"temperature": 0, "max_tokens": 64});
    let events = run(worker.addr, &job("eos", "What is 2+2?", chat));
    assert_eq!(terminal(&events)["stop_reason"], "EOS");
    assert!(!text(&events).contains("<|im_end|>"), "{:?}", text(&events));
}

/// The (field, constraint) pairs of a 400.
fn refusal(response: &http::Response) -> Vec<(String, String)> {
    assert_eq!(response.status, 400, "{}", response.text());
    let body = response.json();
    assert_eq!(body["error"]["code"], "INVALID_REQUEST", "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");
    assert_eq!(
        body["error"]["correlation_id"].as_str(),
        response.header("x-correlation-id"),
        "{body}"
    );
    body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["field"].as_str().unwrap().to_owned(),
                e["constraint"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn pair(field: &str, constraint: &str) -> Vec<(String, String)> {
    vec![(field.to_owned(), constraint.to_owned())]
}

/// Accepted: the stream opens with `started`; hanging up right after cancels the job.
fn accepted(worker: &Worker, body: &Value) {
    let mut stream = open(worker.addr, body);
    assert_eq!(
        stream.next_event().map(|e| e.event).as_deref(),
        Some("started")
    );
}

#[test]
fn every_boundary_of_the_request_is_validated() {
    let _serial = serial();
    let worker = smollm2(&[]);
    let addr = worker.addr;
    let with = |field: &str, value: Value| {
        let mut body = job("v", "Hello", json!({"max_tokens": 1}));
        body[field] = value;
        body
    };
    let refused = |body: &Value| refusal(&post_json(addr, "/execute", body).unwrap());
    assert_eq!(
        refused(&with("max_tokens", json!(0))),
        pair("max_tokens", "range(1..=2048)")
    );
    assert_eq!(
        refused(&with("max_tokens", json!(2049))),
        pair("max_tokens", "range(1..=2048)")
    );
    accepted(&worker, &with("max_tokens", json!(1)));
    accepted(&worker, &with("max_tokens", json!(2048)));
    assert_eq!(
        refused(&with("temperature", json!(-0.1))),
        pair("temperature", "range(0.0..=2.0)")
    );
    assert_eq!(
        refused(&with("temperature", json!(2.1))),
        pair("temperature", "range(0.0..=2.0)")
    );
    accepted(&worker, &with("temperature", json!(0)));
    accepted(&worker, &with("temperature", json!(2)));
    // No character cap: 64,000 '=' are 1,000 tokens in SmolLM2's vocabulary (runs of 64), well
    // inside its context; the context bounds prompts in tokens (below, and the next test).
    let long = "=".repeat(64_000);
    accepted(&worker, &with("prompt", json!(long)));
    assert_eq!(
        refused(&with("prompt", json!(""))),
        pair("prompt", "non_empty")
    );
    let over = "a ".repeat(9000);
    assert_eq!(
        refused(&with("prompt", json!(over))),
        pair("prompt", "context_length(8191)")
    );
    let five = json!(["a", "b", "c", "d", "e"]);
    assert_eq!(refused(&with("stop", five)), pair("stop", "max_count(4)"));
    assert_eq!(
        refused(&with("stop", json!([""]))),
        pair("stop[0]", "non_empty")
    );
    assert_eq!(
        refused(&with("stop", json!(["x".repeat(101)]))),
        pair("stop[0]", "max_length(100)")
    );
    assert_eq!(
        refused(&with("repetition_penalty", json!(0))),
        pair("repetition_penalty", "range(0.0..=2.0)")
    );
    assert_eq!(
        refused(&with("job_id", json!(""))),
        pair("job_id", "non_empty")
    );
    assert_eq!(
        refused(&json!({"prompt": "Hello"})),
        pair("job_id", "required")
    );
    assert_eq!(
        refused(&with("max_tokens", json!("ten"))),
        pair("max_tokens", "type(integer)")
    );
    assert_eq!(
        refused(&with("stop", json!("x"))),
        pair("stop", "type(array)")
    );

    let raw = |content_type: &str, body: &[u8]| {
        request(
            addr,
            "POST",
            "/execute",
            &[("Content-Type", content_type)],
            body,
        )
        .unwrap()
    };
    assert_eq!(
        refusal(&raw("application/json", b"{\"job_id\": ")),
        pair("body", "json")
    );
    assert_eq!(
        refusal(&raw("text/plain", b"{}")),
        pair("body", "content_type(application/json)")
    );
    assert_eq!(
        refusal(&raw("application/json", b"[]")),
        pair("body", "type(object)")
    );
    let huge = vec![b' '; 2 << 20];
    let response = raw("application/json", &huge);
    assert_eq!(response.status, 413, "{}", response.text());
    assert_eq!(response.json()["errors"][0]["field"], "body");
    let cancel = request(
        addr,
        "POST",
        "/cancel",
        &[("Content-Type", "text/plain")],
        b"x",
    )
    .unwrap();
    assert_eq!(
        refusal(&cancel),
        pair("body", "content_type(application/json)")
    );
    let unknown = http::get(addr, "/v2/nothing").unwrap();
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["error"]["code"], "INVALID_REQUEST");
    let wrong_method = http::get(addr, "/execute").unwrap();
    assert_eq!(wrong_method.status, 405);
}

#[test]
fn a_prompt_longer_than_the_context_is_refused_with_its_limit() {
    let _serial = serial();
    let worker = smollm2(&["--ctx-size", "64"]);
    let prompt = "word ".repeat(100);
    let response = post_json(
        worker.addr,
        "/execute",
        &job("c", &prompt, json!({"max_tokens": 4, "raw": true})),
    )
    .unwrap();
    assert_eq!(refusal(&response), pair("prompt", "context_length(60)"));
    let health = http::get(worker.addr, "/health").unwrap().json();
    assert_eq!(health["context_length"], 64);
}

#[test]
fn health_goes_from_loading_to_ready_and_busy_with_true_values() {
    let _serial = serial();
    let model = Model::Qwen05.path();
    let worker = Worker::spawn(&model, &["--worker-id", "w-health", "--parallel", "1"]);
    let first = http::get(worker.addr, "/health").unwrap();
    assert_eq!(first.status, 503, "{}", first.text());
    assert_eq!(first.json()["state"], "loading");
    let early = post_json(worker.addr, "/execute", &job("early", "Hi", json!({}))).unwrap();
    if early.status == 503 {
        assert_eq!(early.json()["error"]["code"], "WORKER_NOT_READY");
    }
    worker.wait_ready();
    let health = http::get(worker.addr, "/health").unwrap().json();
    let cpu = worker_binary() == "llorch-cpud";
    assert_eq!(health["status"], "healthy");
    assert_eq!(health["state"], "ready");
    assert_eq!(health["worker_id"], "w-health");
    assert_eq!(health["model_ref"], model.to_str().unwrap());
    assert_eq!(health["resident"], true);
    assert_eq!(health["quant_kind"], "Q4_K_M");
    assert_eq!(health["tokenizer_kind"], "gguf-bpe");
    assert_eq!(health["vocab_size"], 151936);
    assert_eq!(health["context_length"], 8192);
    assert_eq!(
        health["capabilities"],
        json!([
            "text-gen",
            "arch:qwen2",
            "quant:F32",
            "quant:Q5_0",
            "quant:Q8_0",
            "quant:Q4_K",
            "quant:Q6_K"
        ])
    );
    assert_eq!(health["protocol"], "sse");
    assert_eq!(
        health["worker_type"],
        if cpu { "cpu" } else { "bespoke-cuda" }
    );
    assert_eq!(
        health["memory_architecture"],
        if cpu { "cpu" } else { "vram-only" }
    );
    let file_bytes = std::fs::metadata(&model).unwrap().len();
    let memory = health["memory_bytes"].as_u64().unwrap();
    let metrics = http::get(worker.addr, "/metrics").unwrap().text();
    let kv = metric(&metrics, "worker_memory_bytes{kind=\"kv\"}") as u64;
    let pages = health["kv_pages_total"].as_u64().unwrap();
    // The KV pool is allocated at load: its pages hold the whole context at least.
    assert!(pages * 16 >= 8192 && kv > 0, "{pages} pages, {kv} bytes");
    let without_kv = memory - kv;
    assert!(
        without_kv > file_bytes / 2 && without_kv < file_bytes * 2,
        "{memory} - {kv} KV vs file {file_bytes}"
    );
    assert_eq!(health["kv_pages_free"], health["kv_pages_total"]);
    assert_eq!(
        (health["slots"].as_u64(), health["slots_busy"].as_u64()),
        (Some(1), Some(0))
    );
    let vram = if cpu { 0 } else { memory };
    assert_eq!(
        (
            health["vram_bytes"].as_u64(),
            health["vram_bytes_used"].as_u64()
        ),
        (Some(vram), Some(vram))
    );
    assert_eq!(health["queue_len"], 0);
    assert!(health["uptime_seconds"].is_u64() && health["version"].is_string());
    if !cpu {
        for field in ["device", "sm", "cuda_runtime_version"] {
            assert!(!health[field].is_null(), "{field}: {health}");
        }
    }
    let mut stream = open(
        worker.addr,
        &job("busy", "Count to one hundred.", json!({"max_tokens": 200})),
    );
    stream.next_event();
    stream.next_event();
    let busy = http::get(worker.addr, "/health").unwrap();
    assert_eq!(
        (busy.status, busy.json()["state"].as_str()),
        (200, Some("busy"))
    );
    assert_eq!(busy.json()["slots_busy"], 1);
}

/// Counter values of the Prometheus text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| {
            line.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
}

#[test]
fn metrics_move_by_exactly_the_tokens_generated() {
    let _serial = serial();
    let worker = smollm2(&[]);
    let before = http::get(worker.addr, "/metrics").unwrap().text();
    let events = run(
        worker.addr,
        &job(
            "m",
            "The capital of France is",
            json!({"raw": true, "max_tokens": 7, "temperature": 0}),
        ),
    );
    let prompt_tokens = events[0].data["prompt_tokens"].as_f64().unwrap();
    let after = http::get(worker.addr, "/metrics").unwrap();
    assert!(
        after
            .header("content-type")
            .unwrap()
            .starts_with("text/plain")
    );
    let after = after.text();
    let delta = |name: &str| metric(&after, name) - metric(&before, name);
    assert_eq!(delta("tokens_out_total"), 7.0);
    assert_eq!(delta("worker_tokens_generated_total"), 7.0);
    assert_eq!(delta("worker_tokens_in_total"), prompt_tokens);
    assert_eq!(delta("worker_requests_total{outcome=\"success\"}"), 1.0);
    for histogram in [
        "worker_time_to_first_token_seconds",
        "worker_inter_token_latency_seconds",
        "worker_inference_duration_seconds",
    ] {
        assert_eq!(delta(&format!("{histogram}_count")), 1.0, "{histogram}");
        assert!(after.contains(&format!("# TYPE {histogram} histogram")));
    }
    for gauge in [
        "worker_queue_len",
        "worker_memory_bytes{kind=\"weights\"}",
        "worker_uptime_seconds",
    ] {
        metric(&after, gauge);
    }
    assert!(!after.contains("job_id"), "job ids are not labels");
}

#[test]
fn correlation_ids_are_echoed_or_generated() {
    let _serial = serial();
    let worker = smollm2(&[]);
    let id = "6f1c2e0a-8d4b-4c3e-9a5f-0b1c2d3e4f50";
    let response = request(
        worker.addr,
        "GET",
        "/health",
        &[("X-Correlation-Id", id)],
        b"",
    )
    .unwrap();
    assert_eq!(response.header("x-correlation-id"), Some(id));
    let response = request(
        worker.addr,
        "GET",
        "/health",
        &[("X-Correlation-Id", "not-a-uuid")],
        b"",
    )
    .unwrap();
    let generated = response.header("x-correlation-id").unwrap();
    assert!(
        generated != "not-a-uuid" && generated.len() == 36,
        "{generated}"
    );
    let body = job("corr", "Hi", json!({"max_tokens": 2}));
    let mut stream = llorch_tests::http::EventStream::open(worker.addr, "/execute", &body).unwrap();
    let echoed = stream
        .headers
        .iter()
        .find(|(k, _)| k == "x-correlation-id")
        .map(|(_, v)| v.clone());
    let started = stream.next_event().unwrap();
    assert_eq!(started.data["correlation_id"].as_str(), echoed.as_deref());
    stream.collect();
    let id = started.data["correlation_id"].clone();
    for event in ["execute_start", "execute_end"] {
        let line = worker.wait_for_log(|l| l["event"] == event && l["correlation_id"] == id);
        assert!(
            line.is_some(),
            "no {event} log line with correlation id {id}"
        );
    }
}

#[test]
fn the_same_seed_gives_the_same_tokens() {
    let _serial = serial();
    let worker = smollm2(&[]);
    for temperature in [0.0, 0.7] {
        let body = job(
            "seed",
            "Tell me a story about a fox.",
            json!({"seed": 42, "temperature": temperature, "max_tokens": 40}),
        );
        let first = run(worker.addr, &body);
        let second = run(worker.addr, &body);
        assert_eq!(text(&first), text(&second), "T = {temperature}");
        assert_eq!(
            terminal(&first)["tokens_out"],
            terminal(&second)["tokens_out"]
        );
    }
}

#[test]
fn chinese_emoji_and_arabic_prompts_stream_valid_utf8() {
    let _serial = serial();
    let worker = smollm2(&[]);
    for (i, prompt) in [
        "请用中文介绍一下长城。",
        "Describe your day using only emoji 🎉🌞🍕",
        "ما هي عاصمة مصر؟",
    ]
    .iter()
    .enumerate()
    {
        let events = run(
            worker.addr,
            &job(
                &format!("u{i}"),
                prompt,
                json!({"temperature": 0.7, "seed": 1, "max_tokens": 48}),
            ),
        );
        // A code point is never split between events. Only a job cut off by max_tokens
        // inside one ends with the one U+FFFD that flushes its incomplete bytes
        // (specs/TOKENIZER.md).
        let tokens: Vec<&str> = events
            .iter()
            .filter(|e| e.event == "token")
            .map(|e| e.data["t"].as_str().unwrap())
            .collect();
        let cut_off = terminal(&events)["stop_reason"] == "MAX_TOKENS";
        for (k, t) in tokens.iter().enumerate() {
            let flush = cut_off && k + 1 == tokens.len();
            let body = if flush {
                t.strip_suffix('\u{FFFD}').unwrap_or(t)
            } else {
                t
            };
            assert!(
                !t.is_empty() && !body.contains('\u{FFFD}'),
                "{t:?} (token {k}) in {prompt}"
            );
        }
    }
}

#[test]
fn the_ready_callback_reaches_the_pool_which_picks_by_what_workers_advertise() {
    let _serial = serial();
    let pool = Pool::start(200);
    let url = pool.callback_url();
    let worker = Worker::spawn(
        &Model::SmolLm2.path(),
        &["--callback-url", &url, "--worker-id", "w-cb"],
    );
    let registration = pool
        .wait_for(1, Duration::from_secs(60))
        .pop()
        .expect("no callback");
    let payload = &registration.payload;
    assert_eq!(payload["worker_id"], "w-cb");
    assert_eq!(payload["uri"], format!("http://{}", worker.addr));
    assert_eq!(
        payload["capabilities"],
        json!([
            "text-gen",
            "arch:llama",
            "quant:F32",
            "quant:Q4_1",
            "quant:Q8_0"
        ])
    );
    assert_eq!(payload["protocol"], "sse");
    assert_eq!(payload["quant_kind"], "Q4_1");
    assert_eq!(payload["context_length"], 8192);
    assert!(payload["memory_bytes"].as_u64().unwrap() > 0 && payload["model"].is_string());
    assert!(
        payload["model_ref"]
            .as_str()
            .unwrap()
            .ends_with(Model::SmolLm2.file_name())
    );
    // The listener was up while the callback was handled.
    let health = registration
        .health
        .expect("the pool could not call /health during the callback");
    assert_eq!(health["state"], "ready");
    let cpu = worker_binary() == "llorch-cpud";
    let text_gen = Requirement {
        capability: "text-gen".into(),
        ..Default::default()
    };
    assert_eq!(
        pool.pick(&text_gen).map(|w| w["worker_id"].clone()),
        Some(json!("w-cb"))
    );
    let vram_only = Requirement {
        memory_architecture: Some("vram-only".into()),
        ..text_gen.clone()
    };
    assert_eq!(pool.pick(&vram_only).is_some(), !cpu);
    let embeddings = Requirement {
        capability: "embeddings".into(),
        ..Default::default()
    };
    assert!(pool.pick(&embeddings).is_none());
    let accepted = worker.wait_for_log(|l| l["event"] == "callback" && l["outcome"] == "accepted");
    assert!(accepted.is_some(), "no accepted callback in the log");
}

#[test]
fn a_failed_callback_exits_1() {
    let _serial = serial();
    // Nothing listens on port 1: every attempt fails to connect, then the worker gives up.
    let mut unreachable = Worker::spawn(
        &Model::SmolLm2.path(),
        &["--callback-url", "http://127.0.0.1:1/ready"],
    );
    let status = unreachable
        .wait_exit(Duration::from_secs(60))
        .expect("still running");
    assert_eq!(status.code(), Some(1));
    let attempts = unreachable
        .logs()
        .iter()
        .filter(|l| l["event"] == "callback")
        .count();
    assert_eq!(attempts, 4, "one attempt and 3 retries");
    assert!(
        unreachable
            .logs()
            .iter()
            .any(|l| l["event"] == "error" && l["code"] == "CALLBACK_FAILED")
    );

    let refusing = Pool::start(409);
    let mut refused = Worker::spawn(
        &Model::SmolLm2.path(),
        &["--callback-url", &refusing.callback_url()],
    );
    let status = refused
        .wait_exit(Duration::from_secs(60))
        .expect("still running");
    assert_eq!(status.code(), Some(1));
    assert_eq!(
        refused
            .logs()
            .iter()
            .filter(|l| l["event"] == "callback")
            .count(),
        1,
        "4xx is not retried"
    );
}
