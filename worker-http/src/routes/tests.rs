//! The routes in process (`tower::ServiceExt::oneshot`) over the real engine thread and
//! scheduler with a scripted backend: streams, batching, cancel, faults and the health fields.
//! The black-box suite (`tests/tests/http_*.rs`) runs the real binaries on real models.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;
use worker_common::backend::CpuInfo;
use worker_common::generate::PromptFormatter;
use worker_common::schedule::PrefixIndex;
use worker_common::testing::{ScriptedBackend, tiny_tokenizer};
use worker_common::tokenizer::Tokenizer;

use super::router;
use crate::engine::start_loaded;
use crate::state::{Lifecycle, Loaded, Settings, Shared};

pub(super) fn settings(parallel: u32) -> Settings {
    Settings {
        worker_id: "w-test".into(),
        model_ref: "scripted.gguf".into(),
        ctx_size: None,
        max_tokens_out: 2048,
        max_prompt_tokens: None,
        inference_timeout: Duration::from_secs(30),
        shutdown_grace: Duration::from_secs(1),
        worker_type: "scripted",
        memory_architecture: "cpu",
        parallel: Some(parallel),
        batch_tokens: 512,
        kv_cache_mb: None,
        prefix_cache: true,
        draft_max: 0,
        draft_model: None,
        access: crate::Access::default(),
        test_engine_panic: None,
    }
}

/// A worker over `backend` with `slots` slots, ready.
pub(super) fn worker(backend: ScriptedBackend, slots: usize) -> Arc<Shared> {
    worker_with(backend, slots, crate::Access::default())
}

/// A worker with access rules.
pub(super) fn worker_with(
    backend: ScriptedBackend,
    slots: usize,
    access: crate::Access,
) -> Arc<Shared> {
    start(backend, slots, access).0
}

/// A ready worker and its engine thread.
pub(super) fn start(
    backend: ScriptedBackend,
    slots: usize,
    access: crate::Access,
) -> (Arc<Shared>, std::thread::JoinHandle<()>) {
    let settings = Settings {
        access,
        ..settings(slots as u32)
    };
    start_with(backend, slots, settings)
}

/// A ready worker with `settings` and its engine thread.
pub(super) fn start_with(
    backend: ScriptedBackend,
    slots: usize,
    settings: Settings,
) -> (Arc<Shared>, std::thread::JoinHandle<()>) {
    start_with_formatter(
        backend,
        slots,
        settings,
        PromptFormatter::without_template(),
    )
}

/// A ready worker whose prompts `formatter` renders, and its engine thread.
pub(super) fn start_with_formatter(
    backend: ScriptedBackend,
    slots: usize,
    settings: Settings,
    formatter: PromptFormatter,
) -> (Arc<Shared>, std::thread::JoinHandle<()>) {
    start_with_tokenizer(backend, slots, settings, formatter, tiny_tokenizer())
}

/// A ready worker over `tokenizer` whose prompts `formatter` renders, and its engine thread.
pub(super) fn start_with_tokenizer(
    backend: ScriptedBackend,
    slots: usize,
    settings: Settings,
    formatter: PromptFormatter,
    tokenizer: Tokenizer,
) -> (Arc<Shared>, std::thread::JoinHandle<()>) {
    let shared = Arc::new(Shared::new(settings, 64));
    let grammars = worker_common::grammar::Grammars::new(&tokenizer)
        .map(Arc::new)
        .map_err(|err| err.to_string());
    let grammars = crate::grammars::GrammarCell::built(grammars);
    let loaded = Loaded {
        grammars,
        model_name: "scripted".into(),
        quant_kind: "F32".into(),
        capabilities: vec!["text-gen".into(), "arch:llama".into(), "quant:F32".into()],
        tokenizer_kind: "gguf-bpe",
        vocab_size: tokenizer.vocab().len(),
        context_length: 256,
        tokenizer,
        formatter,
        device: "scripted".into(),
        gpu: None,
        cpu: Some(CpuInfo { isa: "avx2".into() }),
        slots,
        prefix_index: PrefixIndex::default(),
    };
    let engine = start_loaded(shared.clone(), backend, loaded);
    for _ in 0..1000 {
        if shared.lifecycle() == Lifecycle::Ready {
            return (shared, engine);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("the engine did not publish the model");
}

/// Next token: x, y, z, a, b, c… from the history's length (never the end of generation).
pub(super) fn counting() -> ScriptedBackend {
    ScriptedBackend::new(
        64,
        10,
        Arc::new(|h: &[u32]| [7, 8, 9, 1, 2, 3][h.len() % 6]),
    )
}

pub(super) async fn send(
    shared: &Arc<Shared>,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, String) {
    let request = Request::builder().method(method).uri(path);
    let request = match body {
        Some(body) => request.body(Body::from(body.to_string())),
        None => request.body(Body::empty()),
    };
    let mut request = request.unwrap();
    if method == "POST" {
        let json = "application/json".parse().unwrap();
        request.headers_mut().insert("content-type", json);
    }
    send_request(shared, request).await
}

pub(super) async fn send_request(
    shared: &Arc<Shared>,
    request: Request<Body>,
) -> (StatusCode, String) {
    let response = router(shared.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// The `data:` objects of an SSE body.
pub(super) fn events(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).unwrap())
        .collect()
}

pub(super) fn execute_body(id: &str, max_tokens: u32) -> Value {
    json!({"job_id": id, "prompt": "abc", "raw": true, "temperature": 0, "max_tokens": max_tokens})
}

pub(super) fn text(events: &[Value]) -> String {
    events
        .iter()
        .filter(|e| e["type"] == "token")
        .map(|e| e["t"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn a_job_streams_started_tokens_and_end() {
    let shared = worker(counting(), 2);
    let (status, body) = send(&shared, "POST", "/execute", Some(execute_body("one", 5))).await;
    assert_eq!(status, StatusCode::OK);
    let events = events(&body);
    assert_eq!(events[0]["type"], "started");
    assert_eq!(
        (
            events[0]["prompt_tokens"].as_u64(),
            events[0]["queue_position"].as_u64()
        ),
        (Some(3), Some(0))
    );
    assert_eq!(text(&events), "abcxy", "history lengths 3..7 → a b c x y");
    let end = events.last().unwrap();
    assert_eq!(
        (end["type"].as_str(), end["tokens_out"].as_u64()),
        (Some("end"), Some(5))
    );
    assert_eq!(end["stop_reason"], "MAX_TOKENS");
}

#[test]
fn the_backend_reserves_for_the_largest_step_before_the_worker_is_ready() {
    let backend = counting();
    let reserved = backend.reserved();
    let _shared = worker(backend, 4);
    let got = *reserved
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let limits = worker_common::backend::StepLimits {
        tokens: 512,
        sequences: 4,
    };
    assert_eq!(got, Some(limits), "--batch-tokens 512, four slots");
}

#[tokio::test]
async fn concurrent_jobs_share_steps_and_each_gets_its_own_tokens() {
    let mut backend = counting();
    backend.step_delay = Duration::from_millis(5);
    let steps = backend.steps();
    let shared = worker(backend, 4);
    let jobs = (0..4).map(|i| {
        let shared = shared.clone();
        tokio::spawn(async move {
            send(
                &shared,
                "POST",
                "/execute",
                Some(execute_body(&format!("j{i}"), 12)),
            )
            .await
        })
    });
    let bodies: Vec<_> = futures_util::future::join_all(jobs).await;
    for result in bodies {
        let (_, body) = result.unwrap();
        assert_eq!(text(&events(&body)), "abcxyzabcxyz");
    }
    let widest = steps.lock().unwrap().iter().map(|s| s.chunks.len()).max();
    assert!(widest >= Some(2), "no step held two jobs: {widest:?}");
    let (_, health) = send(&shared, "GET", "/health", None).await;
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(
        (health["slots"].as_u64(), health["slots_busy"].as_u64()),
        (Some(4), Some(0))
    );
    assert_eq!(health["kv_pages_total"], 64);
    assert_eq!(health["kv_pages_free"], 64);
    assert_eq!(
        (health["cpu_isa"].as_str(), health["device_name"].as_str()),
        (Some("avx2"), Some("scripted"))
    );
    assert_eq!(
        health["capabilities"],
        serde_json::json!(["text-gen", "arch:llama", "quant:F32"])
    );
}

#[tokio::test]
async fn a_cancel_ends_a_running_job_and_the_others_go_on() {
    let mut backend = counting();
    backend.step_delay = Duration::from_millis(20);
    let shared = worker(backend, 2);
    let long = {
        let shared = shared.clone();
        tokio::spawn(async move {
            send(&shared, "POST", "/execute", Some(execute_body("long", 200))).await
        })
    };
    let short = {
        let shared = shared.clone();
        tokio::spawn(async move {
            send(&shared, "POST", "/execute", Some(execute_body("short", 6))).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, _) = send(&shared, "POST", "/cancel/long", None).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (_, body) = long.await.unwrap();
    let cancelled = events(&body);
    assert_eq!(cancelled.last().unwrap()["code"], "CANCELLED");
    let (_, body) = short.await.unwrap();
    assert_eq!(text(&events(&body)), "abcxyz");
    let (_, metrics) = send(&shared, "GET", "/metrics", None).await;
    assert!(
        metrics.contains("worker_requests_total{outcome=\"cancelled\"} 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("worker_sequences_running 0\n"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_failing_step_fails_its_jobs_with_cuda_error_and_the_worker_goes_on() {
    let mut backend = counting();
    backend.fail_at_step = Some(0);
    let shared = worker(backend, 2);
    let (_, body) = send(&shared, "POST", "/execute", Some(execute_body("bad", 4))).await;
    let failed = events(&body);
    assert_eq!(failed.last().unwrap()["code"], "CUDA_ERROR");
    assert_eq!(failed.last().unwrap()["retriable"], false);
    let (status, health) = send(&shared, "GET", "/health", None).await;
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(
        status,
        StatusCode::OK,
        "a recoverable fault keeps the worker: {health}"
    );
    assert_eq!(
        (health["state"].as_str(), &health["last_error"]),
        (Some("ready"), &Value::Null)
    );
    let (_, body) = send(&shared, "POST", "/execute", Some(execute_body("good", 4))).await;
    assert_eq!(events(&body).last().unwrap()["type"], "end");
}

/// Polls `done` every millisecond for up to 5 s.
pub(super) async fn until(done: impl Fn() -> bool) {
    for _ in 0..5000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("timed out");
}

#[tokio::test]
async fn a_poisoning_fault_fails_the_worker_and_every_job_and_exits_1_after_the_grace() {
    let mut backend = counting();
    backend.fail_at_step = Some(4);
    backend.fail_poisons = true;
    backend.step_delay = Duration::from_millis(50);
    // One slot: the second job waits in the queue.
    let (shared, engine) = start(backend, 1, crate::Access::default());
    let serving = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let stopped = crate::server::serve_until_stopped(&shared, engine).await;
            (stopped, std::time::Instant::now())
        })
    };
    let execute = |id: &'static str| {
        let shared = shared.clone();
        tokio::spawn(
            async move { send(&shared, "POST", "/execute", Some(execute_body(id, 50))).await },
        )
    };
    let running = execute("running");
    until(|| shared.queue.running() == 1).await;
    let queued = execute("queued");
    until(|| shared.queue.len() == 1).await;

    let (_, body) = running.await.unwrap();
    let ran = events(&body);
    let error = ran.last().unwrap();
    assert_eq!(
        (error["type"].as_str(), error["code"].as_str()),
        (Some("error"), Some("CUDA_ERROR"))
    );
    assert_eq!(
        error["retriable"], true,
        "the request is not at fault: {error}"
    );
    assert_eq!(text(&ran), "abcx", "the steps before the fault streamed");
    let (status, health) = send(&shared, "GET", "/health", None).await;
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{health}");
    assert_eq!(
        (health["state"].as_str(), health["status"].as_str()),
        (Some("failed"), Some("unhealthy"))
    );
    assert_eq!(health["last_error"]["code"], "CUDA_ERROR");
    assert!(
        health["last_error"]["message"]
            .as_str()
            .unwrap()
            .contains("sticky"),
        "{health}"
    );

    let (_, body) = queued.await.unwrap();
    let waited = events(&body);
    assert_eq!(waited.first().unwrap()["type"], "started");
    assert_eq!(waited.last().unwrap()["code"], "CUDA_ERROR", "{waited:?}");
    assert_eq!(text(&waited), "");
    let (status, body) = send(&shared, "POST", "/execute", Some(execute_body("late", 2))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_of(&body)["code"], "WORKER_NOT_READY");
    assert!(
        error_of(&body)["message"]
            .as_str()
            .unwrap()
            .contains("CUDA_ERROR"),
        "{body}"
    );

    let (stopped, at) = serving.await.unwrap();
    let failed_at = shared.failure().unwrap().at;
    assert!(
        at.duration_since(failed_at) >= shared.settings.shutdown_grace,
        "exited before the grace"
    );
    let err = stopped.unwrap_err();
    assert_eq!(err.code(), "CUDA_ERROR");
    assert_eq!(
        crate::exit_code(Err(err), "w", "m"),
        std::process::ExitCode::FAILURE
    );
    assert_eq!(
        shared.lifecycle(),
        Lifecycle::Failed,
        "the drain leaves it failed"
    );
}

/// The error object of a non-2xx answer.
pub(super) fn error_of(body: &str) -> Value {
    serde_json::from_str::<Value>(body).unwrap()["error"].clone()
}

#[tokio::test]
async fn wrong_methods_bad_paths_and_bodyless_posts_get_the_error_object() {
    let shared = worker(counting(), 1);
    let (status, body) = send(&shared, "GET", "/execute", None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(error_of(&body)["code"], "INVALID_REQUEST");
    let (status, body) = send(&shared, "POST", "/cancel/%ff", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error_of(&body)["code"], "INVALID_REQUEST");
    // A path id longer than any job's (the body form's bound, 256 bytes) is refused alike.
    let (status, body) = send(
        &shared,
        "POST",
        &format!("/cancel/{}", "x".repeat(257)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let errors = serde_json::from_str::<Value>(&body).unwrap()["errors"].clone();
    assert_eq!(errors[0]["constraint"], "max_length(256)", "{body}");
    let (status, _) = send(
        &shared,
        "POST",
        &format!("/cancel/{}", "x".repeat(256)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let plain = Request::post("/shutdown").header("content-type", "text/plain");
    let (status, body) = send_request(&shared, plain.body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error_of(&body)["code"], "INVALID_REQUEST");
    assert_eq!(shared.lifecycle(), Lifecycle::Ready, "not shut down");
}

#[tokio::test]
async fn with_a_key_only_the_status_routes_are_open() {
    let key: crate::ApiKey = "k3y".parse().unwrap();
    let access = crate::Access::new(Some(key), [127, 0, 0, 1].into(), None);
    let shared = worker_with(counting(), 1, access);
    let (status, body) = send(&shared, "POST", "/execute", Some(execute_body("a", 2))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(error_of(&body)["code"], "UNAUTHORIZED");
    assert_eq!(
        send(&shared, "GET", "/health", None).await.0,
        StatusCode::OK
    );
    let keyed = Request::post("/execute")
        .header("content-type", "application/json")
        .header("authorization", "Bearer k3y")
        .body(Body::from(execute_body("a", 2).to_string()))
        .unwrap();
    let (status, body) = send_request(&shared, keyed).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(events(&body).last().unwrap()["type"], "end");
    let rebound = Request::get("/health").header("host", "attacker.example");
    let (status, _) = send_request(&shared, rebound.body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::MISDIRECTED_REQUEST);
}

#[tokio::test]
async fn prompts_over_the_token_budget_are_refused_before_the_queue() {
    let budget = Settings {
        max_prompt_tokens: Some(3),
        ..settings(1)
    };
    let (shared, _engine) = start_with(counting(), 1, budget);
    let long = json!({"job_id": "long", "prompt": "abcabc", "raw": true, "max_tokens": 2});
    let (status, body) = send(&shared, "POST", "/execute", Some(long)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let errors: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        errors["errors"][0]["constraint"], "max_prompt_tokens(3)",
        "{body}"
    );
    let short = json!({"job_id": "ok", "prompt": "ab", "raw": true, "max_tokens": 2});
    let (status, _) = send(&shared, "POST", "/execute", Some(short)).await;
    assert_eq!(status, StatusCode::OK);
}

#[test]
fn the_body_limit_grows_with_the_context_beyond_32k_tokens() {
    use super::{MAX_BODY_BYTES, body_limit};
    assert_eq!(body_limit(None), MAX_BODY_BYTES);
    assert_eq!(body_limit(Some(8192)), MAX_BODY_BYTES);
    assert_eq!(body_limit(Some(32768)), MAX_BODY_BYTES);
    assert_eq!(body_limit(Some(131_072)), 4 << 20);
}

#[tokio::test]
async fn tokenize_and_detokenize_use_the_models_tokenizer() {
    let shared = worker(counting(), 1);
    let (status, body) = send(
        &shared,
        "POST",
        "/tokenize",
        Some(json!({"content": "abc"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let tokens = serde_json::from_str::<Value>(&body).unwrap()["tokens"].clone();
    assert_eq!(tokens, json!([1, 2, 3]));
    let with_pieces = json!({"content": "abc", "with_pieces": true});
    let (status, body) = send(&shared, "POST", "/tokenize", Some(with_pieces)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let tokens = serde_json::from_str::<Value>(&body).unwrap()["tokens"].clone();
    assert_eq!(tokens[0], json!({"id": 1, "piece": "a"}), "{body}");
    assert_eq!(tokens.as_array().unwrap().len(), 3);
    let (status, body) = send(
        &shared,
        "POST",
        "/detokenize",
        Some(json!({"tokens": [1, 2, 3]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["content"],
        "abc"
    );

    // Refusals: a missing field, ids that are not ids, an id outside the vocabulary.
    let (status, body) = send(&shared, "POST", "/tokenize", Some(json!({}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error_of(&body)["code"], "INVALID_REQUEST");
    let (status, _) = send(
        &shared,
        "POST",
        "/detokenize",
        Some(json!({"tokens": [1, -2]})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = send(
        &shared,
        "POST",
        "/detokenize",
        Some(json!({"tokens": [1, 4000000]})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let errors = serde_json::from_str::<Value>(&body).unwrap()["errors"].clone();
    assert!(
        errors[0]["constraint"]
            .as_str()
            .unwrap()
            .starts_with("vocabulary("),
        "{body}"
    );
}
