//! A real device fault on the GPU, against `worker-orcd` (`LLORCH_TEST_WORKER=worker-orcd`): the
//! test-only trigger `LLORCH_TEST_DEVICE_FAULT` (specs/CUDA.md) makes the backend launch a kernel
//! that writes through an invalid address at a given step, so the CUDA context gets a sticky
//! illegal-address error. Within that one job the worker turns `failed` (`/health` 503 with
//! `last_error`), the running and the queued job end with `CUDA_ERROR`, a new `/execute` is
//! refused, and the process exits 1 after `--shutdown-grace-sec`.
//!
//! The model is SmolLM2 cut to its first four layers (what it says does not matter here, and
//! the copy is small enough to carry to a GPU host): built from SmolLM2 into the asset cache
//! as `derived/SmolLM2-135M-Instruct.Q4_1.4-layers.gguf` on first use, or taken from there.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use llorch_tests::assets::{Model, assets_dir};
use llorch_tests::gguf_writer::{GgufBuilder, OwnedValue};
use llorch_tests::http::{EventStream, get, post_json};
use llorch_tests::stream::job;
use llorch_tests::worker::{Worker, serial, worker_binary};
use serde_json::{Value, json};
use worker_common::gguf::Gguf;

/// Layers the small model keeps.
const LAYERS: u32 = 4;
/// The step at which the device faults: the first job is far into its decode by then, and the
/// second has long been queued behind it.
const FAULT_STEP: u32 = 600;
/// `--shutdown-grace-sec`.
const GRACE: Duration = Duration::from_secs(3);

/// SmolLM2 with its first [`LAYERS`] layers, from the asset cache or built into it.
fn small_smollm2() -> PathBuf {
    let path = assets_dir()
        .join("derived")
        .join(format!("SmolLM2-135M-Instruct.Q4_1.{LAYERS}-layers.gguf"));
    if path.exists() {
        return path;
    }
    let original = Gguf::open(Model::SmolLm2.path()).unwrap();
    let mut copy = GgufBuilder::from_gguf(&original);
    for tensor in original.tensors() {
        let layer = tensor
            .name
            .strip_prefix("blk.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|n| n.parse::<u32>().ok());
        if layer.is_some_and(|layer| layer >= LAYERS) {
            copy.remove_tensor(tensor.name);
        }
    }
    copy.metadata("llama.block_count", OwnedValue::U32(LAYERS));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let temp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&temp, copy.to_bytes()).unwrap();
    std::fs::rename(&temp, &path).unwrap();
    path
}

/// A long greedy job that no end-of-generation token stops.
fn long_job(id: &str) -> Value {
    job(
        id,
        "The capital of France is",
        json!({"raw": true, "temperature": 0, "max_tokens": 2000, "ignore_eos": true}),
    )
}

/// Reads `stream` to its end; returns the tokens seen and the terminal event's data.
fn finish(mut stream: EventStream) -> (usize, Value) {
    let mut tokens = 0;
    while let Some(event) = stream.next_event() {
        match event.event.as_str() {
            "token" => tokens += 1,
            "end" | "error" => return (tokens, event.data),
            _ => {}
        }
    }
    panic!("the stream ended without a terminal event");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_device_fault_fails_the_worker_within_one_job_and_it_exits_1_after_the_grace() {
    let _serial = serial();
    let model = small_smollm2();
    assert_eq!(
        worker_binary(),
        "worker-orcd",
        "set LLORCH_TEST_WORKER=worker-orcd"
    );
    let step = FAULT_STEP.to_string();
    let grace = GRACE.as_secs().to_string();
    let mut worker = Worker::spawn_with_env(
        &model,
        &["--parallel", "1", "--shutdown-grace-sec", &grace],
        &[("LLORCH_TEST_DEVICE_FAULT", &step)],
    );
    worker.wait_ready();
    assert!(
        worker
            .wait_for_log(|line| line["message"]
                .as_str()
                .is_some_and(|m| m.contains("LLORCH_TEST_DEVICE_FAULT is set")))
            .is_some(),
        "the trigger was not armed: {:?}",
        worker.log_lines()
    );

    // One job running, one queued behind it (one slot).
    let mut running = EventStream::open(worker.addr, "/execute", &long_job("running")).unwrap();
    assert_eq!(running.next_event().unwrap().event, "started");
    let mut queued = EventStream::open(worker.addr, "/execute", &long_job("queued")).unwrap();
    let started = queued.next_event().unwrap();
    assert_eq!(started.event, "started");
    assert_eq!(started.data["queue_position"], 1, "{:?}", started.data);

    let (tokens, error) = finish(running);
    let job_ended = Instant::now();
    assert_eq!(error["code"], "CUDA_ERROR", "{error}");
    assert_eq!(error["retriable"], true, "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("ILLEGAL_ADDRESS"), "{message}");
    // One token per step before the fault (fewer events where text is held back or special).
    assert!(
        (1..=FAULT_STEP as usize).contains(&tokens),
        "{tokens} tokens, then {error}"
    );

    // Within that one job: /health is failed and keeps the error.
    let health = get(worker.addr, "/health").unwrap();
    let body = health.json();
    assert_eq!(health.status, 503, "{body}");
    assert_eq!(body["state"], "failed", "{body}");
    assert_eq!(body["status"], "unhealthy", "{body}");
    assert_eq!(body["last_error"]["code"], "CUDA_ERROR", "{body}");

    let (queued_tokens, queued_error) = finish(queued);
    assert_eq!(
        (queued_tokens, queued_error["code"].as_str()),
        (0, Some("CUDA_ERROR")),
        "{queued_error}"
    );
    let refused = post_json(worker.addr, "/execute", &long_job("late")).unwrap();
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.json()["error"]["code"], "WORKER_NOT_READY");

    let status = worker
        .wait_exit(GRACE + Duration::from_secs(20))
        .expect("the failed worker did not exit");
    let waited = job_ended.elapsed();
    assert_eq!(status.code(), Some(1), "{:?}", worker.log_lines());
    assert!(
        waited + Duration::from_millis(500) >= GRACE,
        "exited {waited:?} after the fault, before the grace"
    );
    let errors: Vec<Value> = worker
        .logs()
        .into_iter()
        .filter(|line| line["event"] == "error" && line["code"] == "CUDA_ERROR")
        .collect();
    assert!(
        errors.len() >= 2,
        "the fault and the exit are logged as CUDA_ERROR: {errors:?}"
    );
    let log = worker.log_lines().join("\n");
    assert!(!log.contains("panicked"), "{log}");
    eprintln!(
        "{tokens} tokens, then {error}\n/health: {body}\nexit {status} {waited:?} after the job's error\nCUDA_ERROR lines: {errors:#?}"
    );
}
