//! The real binaries at this stage: they validate the model and describe it, refuse bad flags
//! with exit 2, and fail cleanly (exit 1, no panic) on bad models or a missing CUDA driver.

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

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn llorch_cpud_describes_smollm2() {
    let model = Model::SmolLm2.path();
    let output = run("llorch-cpud", &["--model", model.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("(llama, Q4_1): 30 layers, width 576"),
        "{stdout}"
    );
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
