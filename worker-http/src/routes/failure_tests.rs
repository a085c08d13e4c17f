//! A panic in the engine, in process over the scripted backend: the worker turns `failed`
//! (`/health` 503 with `last_error`), every job, running or queued, ends with one retriable
//! `INTERNAL` error, new jobs are refused and the server exits 1 after the grace. Also the HTTP
//! listener's panic.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::Value;

use super::tests::{counting, error_of, events, execute_body, send, settings, start_with, until};
use crate::state::{Lifecycle, Settings, Shared};

/// Runs two jobs of `max_tokens` and queues a third on a worker whose engine panics (`backend`
/// or `settings` say where); checks everything the worker must do then, and returns
/// `last_error`'s message.
async fn panicking_worker(
    backend: worker_common::testing::ScriptedBackend,
    settings: Settings,
    max_tokens: u32,
) -> String {
    let (shared, engine) = start_with(backend, 2, settings);
    let serving = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let stopped = crate::server::serve_until_stopped(&shared, engine).await;
            (stopped, Instant::now())
        })
    };
    let execute = |id: &'static str, max_tokens| {
        let shared = shared.clone();
        let body = execute_body(id, max_tokens);
        tokio::spawn(async move { send(&shared, "POST", "/execute", Some(body)).await })
    };
    let running = [execute("a", max_tokens), execute("b", max_tokens)];
    until(|| shared.queue.running() == 2).await;
    let queued = execute("queued", 50);
    for job in running.into_iter().chain([queued]) {
        let (_, body) = job.await.unwrap();
        let streamed = events(&body);
        let ends: Vec<&Value> = streamed
            .iter()
            .filter(|e| e["type"] == "end" || e["type"] == "error")
            .collect();
        assert_eq!(ends.len(), 1, "one terminal event: {streamed:?}");
        assert_eq!(ends[0]["code"], "INTERNAL", "{streamed:?}");
        assert_eq!(ends[0]["retriable"], true, "{streamed:?}");
        assert_eq!(streamed.last(), Some(ends[0]), "the end is last");
        // The failure was published before any job heard of it.
        assert_eq!(shared.lifecycle(), Lifecycle::Failed);
    }
    let (status, health) = send(&shared, "GET", "/health", None).await;
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{health}");
    assert_eq!(health["state"], "failed", "{health}");
    assert_eq!(health["last_error"]["code"], "INTERNAL", "{health}");
    assert_eq!(health["slots_busy"], 0, "{health}");
    let (status, body) = send(&shared, "POST", "/execute", Some(execute_body("late", 2))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_of(&body)["code"], "WORKER_NOT_READY");

    let (stopped, at) = serving.await.unwrap();
    let failure = shared.failure().unwrap();
    assert!(
        at.duration_since(failure.at) >= shared.settings.shutdown_grace,
        "exited before the grace"
    );
    let err = stopped.unwrap_err();
    assert_eq!(err.code(), "INTERNAL");
    assert_eq!(
        crate::exit_code(Err(err), "w", "m"),
        std::process::ExitCode::FAILURE
    );
    let (_, metrics) = send(&shared, "GET", "/metrics", None).await;
    assert!(
        metrics.contains("worker_requests_total{outcome=\"error\"} 3\n"),
        "each job counted once, as an error: {metrics}"
    );
    health["last_error"]["message"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_panic_in_the_backend_fails_the_worker_and_ends_every_job_once() {
    let mut backend = counting();
    backend.step_delay = Duration::from_millis(20);
    backend.panic_at_step = Some(5);
    let message = panicking_worker(backend, settings(2), 50).await;
    assert!(message.contains("scripted panic in step 5"), "{message}");
}

#[tokio::test]
async fn a_panic_with_ended_jobs_in_hand_still_ends_them_and_the_others() {
    let mut backend = counting();
    // Long steps: the second and third jobs arrive during the first step.
    backend.step_delay = Duration::from_millis(200);
    // The first job ends in step 1 (prefill, then its second token), so it is in the step's
    // results when the engine panics; the second ends there too or is still running.
    let settings = Settings {
        test_engine_panic: Some(1),
        ..settings(2)
    };
    let message = panicking_worker(backend, settings, 2).await;
    assert!(message.contains("LLORCH_TEST_ENGINE_PANIC"), "{message}");
}

#[tokio::test]
async fn a_panicking_listener_fails_the_worker_and_wakes_the_exit() {
    let shared = Arc::new(Shared::new(settings(1), 4));
    crate::server::fail_on_panic(shared.clone(), "the HTTP listener", async {
        panic!("accept loop broke");
    })
    .await;
    let failure = shared.failure().unwrap();
    assert_eq!(failure.code, "INTERNAL");
    assert!(
        failure.message.contains("accept loop broke"),
        "{}",
        failure.message
    );
    tokio::time::timeout(Duration::from_secs(1), shared.shutdown.notified())
        .await
        .expect("the exit was not woken");
}
