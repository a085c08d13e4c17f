//! Chat templates come from model files, which users download from anywhere. A template that
//! loops or grows a value without bound is refused at load when a sample conversation trips it,
//! or fails only the templated requests that trip it; raw requests keep working, and SIGTERM
//! still stops the worker.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use llorch_tests::assets::Model;
use llorch_tests::bins::binary;
use llorch_tests::gguf_writer::{GgufBuilder, OwnedValue};
use llorch_tests::http::post_json;
use llorch_tests::stream::{job, run, terminal};
use llorch_tests::worker::{Worker, serial, worker_binary};
use serde_json::json;
use worker_common::gguf::Gguf;

/// Three nested loops of 100,000: days of work for any template engine without a budget.
const SPIN: &str = "{% for a in range(100000) %}{% for b in range(100000) %}\
{% for c in range(100000) %}x{% endfor %}{% endfor %}{% endfor %}";

/// A string that doubles 60 times: 2^60 bytes, in a few hundred instructions (fuel does not
/// see it; the renderer process's heap cap does).
const DOUBLING: &str = "{% set ns = namespace(x='a') %}{% for i in range(60) %}\
{% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x|length }}";

/// SmolLM2 with `template` as its chat template, written to a temporary file.
fn smollm2_with_template(name: &str, template: &str) -> PathBuf {
    let original = Gguf::open(Model::SmolLm2.path()).unwrap();
    let mut copy = GgufBuilder::from_gguf(&original);
    copy.metadata("tokenizer.chat_template", OwnedValue::string(template));
    let path = std::env::temp_dir().join(format!("llorch-{name}-{}.gguf", std::process::id()));
    std::fs::write(&path, copy.to_bytes()).unwrap();
    path
}

#[test]
fn a_template_that_always_loops_is_refused_at_load() {
    refused_at_load("spin-always", SPIN);
}

#[test]
fn a_template_that_always_exhausts_memory_is_refused_at_load() {
    refused_at_load("double-always", DOUBLING);
}

#[test]
fn a_template_that_loops_on_some_prompts_fails_only_those() {
    fails_only_the_prompts_that_trip_it("spin-sometimes", SPIN);
}

#[test]
fn a_template_that_exhausts_memory_on_some_prompts_fails_only_those() {
    fails_only_the_prompts_that_trip_it("double-sometimes", DOUBLING);
}

fn refused_at_load(name: &str, template: &str) {
    let _serial = serial();
    let model = smollm2_with_template(name, template);
    let output = Command::new(binary(&worker_binary()))
        .arg("--model")
        .arg(&model)
        .output()
        .unwrap();
    std::fs::remove_file(&model).unwrap();
    let message = String::from_utf8_lossy(&output.stderr).into_owned()
        + &String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{message}");
    assert!(
        message.contains("MODEL_LOAD_FAILED") && message.contains("render budget"),
        "{message}"
    );
    assert!(!message.contains("panicked"), "{message}");
}

/// `hostile` runs only when the user's message contains "spin".
fn fails_only_the_prompts_that_trip_it(name: &str, hostile: &str) {
    let _serial = serial();
    let template = format!(
        "{{% if 'spin' in messages[-1]['content'] %}}{hostile}{{% endif %}}\
<|im_start|>user\n{{{{ messages[-1]['content'] }}}}<|im_end|>\n<|im_start|>assistant\n"
    );
    let model = smollm2_with_template(name, &template);
    let mut worker = Worker::ready(&model, &["--shutdown-grace-sec", "2"]);
    std::fs::remove_file(&model).unwrap();

    let started = Instant::now();
    let refused = post_json(
        worker.addr,
        "/execute",
        &job("spin", "please spin", json!({"max_tokens": 4})),
    )
    .unwrap();
    let took = started.elapsed();
    assert_eq!(refused.status, 400, "{}", refused.text());
    let error = refused.json();
    assert_eq!(error["error"]["code"], "INVALID_REQUEST", "{error}");
    assert!(error.to_string().contains("render budget"), "{error}");
    eprintln!("{name}: the render was refused after {took:?}");

    // The renderer that died is replaced: templated requests work again, twice.
    for (id, prompt, raw) in [
        ("raw", "please spin", true),
        ("calm", "hello", false),
        ("calm-again", "hello again", false),
    ] {
        let body = job(
            id,
            prompt,
            json!({"raw": raw, "max_tokens": 4, "temperature": 0}),
        );
        let events = run(worker.addr, &body);
        assert_eq!(terminal(&events)["type"], "end", "{id}: {events:?}");
    }

    worker.terminate();
    let exited = worker.wait_exit(Duration::from_secs(10));
    assert!(exited.is_some_and(|status| status.success()), "{exited:?}");
}

/// Renders that trip their budget (a value doubling to the heap cap: about a second each) hold
/// only their own renderer (several run at once, `MAX_RENDERERS`): with four in flight an
/// innocent chat request is answered before any of them is refused (one renderer made it wait
/// behind all four); and a SIGTERM while eight are rendering answers each of them, 400 or 503,
/// none cut off without an answer (one after another they outlasted the drain).
#[test]
fn budget_tripping_renders_hold_no_one_else() {
    let _serial = serial();
    let template = format!(
        "{{% if 'spin' in messages[-1]['content'] %}}{DOUBLING}{{% endif %}}\
<|im_start|>user\n{{{{ messages[-1]['content'] }}}}<|im_end|>\n<|im_start|>assistant\n"
    );
    let model = smollm2_with_template("double-many", &template);
    let mut worker = Worker::ready(&model, &["--shutdown-grace-sec", "2"]);
    std::fs::remove_file(&model).unwrap();
    let addr = worker.addr;
    let hostile = |count: usize| -> Vec<std::thread::JoinHandle<(u16, Instant)>> {
        (0..count)
            .map(|k| {
                std::thread::spawn(move || {
                    let body = job(
                        &format!("spin-{k}"),
                        "please spin",
                        json!({"max_tokens": 4}),
                    );
                    let answer = post_json(addr, "/execute", &body);
                    let status = answer.map_or(0, |answer| answer.status);
                    (status, Instant::now())
                })
            })
            .collect()
    };

    let spinning = hostile(4);
    std::thread::sleep(Duration::from_millis(100));
    let body = job("calm", "hello", json!({"max_tokens": 1, "temperature": 0}));
    let events = run(addr, &body);
    let answered = Instant::now();
    assert_eq!(terminal(&events)["type"], "end", "{events:?}");
    let refused: Vec<(u16, Instant)> = spinning.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        refused.iter().all(|&(status, _)| status == 400),
        "{refused:?}"
    );
    assert!(
        refused.iter().all(|&(_, at)| at > answered),
        "the innocent request waited for a budget-tripping render"
    );

    let spinning = hostile(8);
    std::thread::sleep(Duration::from_millis(100));
    worker.terminate();
    let statuses: Vec<u16> = spinning.into_iter().map(|t| t.join().unwrap().0).collect();
    assert!(
        statuses
            .iter()
            .all(|&status| status == 400 || status == 503),
        "every request rendering at the SIGTERM is answered (0: cut off): {statuses:?}"
    );
    let exited = worker.wait_exit(Duration::from_secs(20));
    assert!(exited.is_some_and(|status| status.success()), "{exited:?}");
}
