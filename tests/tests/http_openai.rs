//! OpenAI's API as users reach it: the official `openai` Python SDK (pinned in
//! `scripts/requirements-sdk.txt`, installed by `scripts/fetch-assets.sh python`) drives the
//! real worker on Qwen2.5-Coder-0.5B through `tests/openai/sdk_check.py`: chat and completions,
//! streamed and whole, usage, seeds, errors, and equality with `/execute`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use llorch_tests::assets::{Model, python_sdk};
use llorch_tests::worker::{Worker, serial};

#[test]
fn the_official_openai_sdk_drives_the_worker() {
    let _serial = serial();
    let worker = Worker::ready(
        &Model::Qwen05.path(),
        &["--threads", "2", "--ctx-size", "1024"],
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("openai/sdk_check.py");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let output = Command::new(&python)
        .arg(&script)
        .arg(format!("http://{}", worker.addr))
        .env("PYTHONPATH", python_sdk())
        .output()
        .unwrap_or_else(|err| panic!("cannot run {python}: {err}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "{} failed ({}):\n{stdout}\n{stderr}",
        script.display(),
        output.status
    );
    assert!(stdout.contains("every check passed"), "{stdout}");
}
