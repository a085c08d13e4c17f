//! Start-up failures of the real binaries: bad flags exit 2; bad models and a missing CUDA driver
//! exit 1 with a clean, structured message, never a panic.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

use llorch_tests::assets::Model;
use llorch_tests::bins::binary;

fn run(name: &str, args: &[&str]) -> Output {
    Command::new(binary(name))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap_or_else(|err| panic!("cannot run {name}: {err}"))
}

/// Everything the process printed (logs go to stdout as JSON lines, clap's errors to stderr).
fn stderr(output: &Output) -> String {
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    text
}

#[test]
fn a_file_that_is_not_gguf_exits_1_with_model_load_failed() {
    let not_gguf = std::env::current_exe().unwrap();
    let output = run("llorch-cpud", &["--model", not_gguf.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    let message = stderr(&output);
    assert!(
        message.contains("MODEL_LOAD_FAILED") && message.contains("not a GGUF file"),
        "{message}"
    );
    assert!(!message.contains("panicked"), "{message}");
    let error = message
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|line| line["event"] == "error")
        .unwrap_or_else(|| panic!("no JSON error line: {message}"));
    assert_eq!(error["code"], "MODEL_LOAD_FAILED");
    assert_eq!(error["model_ref"], not_gguf.to_str().unwrap());
}

#[test]
fn bad_flags_exit_2() {
    for args in [
        &[][..],
        &["--model", "m.gguf", "--port", "70000"],
        &["--model", "m.gguf", "--bogus"],
    ] {
        for name in ["llorch-cpud", "worker-orcd"] {
            let output = run(name, args);
            assert_eq!(
                output.status.code(),
                Some(2),
                "{name} {args:?}: {}",
                stderr(&output)
            );
        }
    }
}

#[test]
fn worker_orcd_without_a_driver_exits_1_with_a_clean_message() {
    let model = Model::SmolLm2.path();
    let output = run("worker-orcd", &["--model", model.to_str().unwrap()]);
    let message = stderr(&output);
    assert!(!message.contains("panicked"), "{message}");
    if backend_cuda::check_driver().is_err() {
        assert_eq!(output.status.code(), Some(1), "{message}");
        assert!(message.contains("no CUDA driver found"), "{message}");
    } else {
        assert!(
            !message.contains("no CUDA driver found"),
            "driver present but reported missing: {message}"
        );
    }
}

#[test]
fn a_kv_cache_smaller_than_one_context_exits_1_with_model_load_failed() {
    // 1 MiB holds 2 pages of SmolLM2's 16 positions (16 × 30 layers × 2 × 192 × 2 bytes =
    // 368,640 bytes each), far from a 2,048-position context's 128: a setting that cannot work,
    // not a lack of GPU memory.
    let model = Model::SmolLm2.path();
    let args = [
        "--model",
        model.to_str().unwrap(),
        "--ctx-size",
        "2048",
        "--kv-cache-mb",
        "1",
    ];
    let output = run("llorch-cpud", &args);
    assert_eq!(output.status.code(), Some(1));
    let message = stderr(&output);
    let error = message
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|line| line["event"] == "error")
        .unwrap_or_else(|| panic!("no JSON error line: {message}"));
    assert_eq!(error["code"], "MODEL_LOAD_FAILED", "{message}");
    assert!(message.contains("less than one context"), "{message}");
    assert!(!message.contains("panicked"), "{message}");
}

#[cfg(unix)]
#[test]
fn a_fifo_as_the_model_exits_1_at_once() {
    let fifo = std::env::temp_dir().join(format!("llorch-model-fifo-{}", std::process::id()));
    let _ = std::fs::remove_file(&fifo);
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success(), "mkfifo");
    // Opening a FIFO for reading waits for a writer: the worker would hang at load, so it
    // gets 30 s and is killed after them.
    let mut child = Command::new(binary("llorch-cpud"))
        .args(["--model", fifo.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            std::fs::remove_file(&fifo).unwrap();
            panic!("the worker still waits on the FIFO after 30 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    std::fs::remove_file(&fifo).unwrap();
    assert_eq!(output.status.code(), Some(1));
    let message = stderr(&output);
    assert!(
        message.contains("MODEL_LOAD_FAILED") && message.contains("not a regular file"),
        "{message}"
    );
}
