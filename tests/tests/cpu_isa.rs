//! `LLORCH_CPU_ISA` on the real CPU worker: every instruction-set level this machine has (the
//! scalar oracle always) shows in `/health` and gives the same greedy tokens and the same
//! log-probabilities, bit for bit, on SmolLM2 (32-element formats), Qwen 0.5B (k-quants) and
//! the synthetic Q3_K_M, IQ4_XS, IQ4_NL, IQ3_S, Q2_K and IQ3_XXS models;
//! a level the CPU lacks or a name that is none fails the start with `MODEL_LOAD_FAILED`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use backend_cpu::isa::Isa;
use llorch_tests::assets::{Asset, Model};
use llorch_tests::http;
use llorch_tests::synthetic::Synthetic;
use llorch_tests::worker::{Worker, serial, worker_binary};
use serde_json::{Value, json};

/// The levels to compare: scalar, AVX2 and AVX-512, those this CPU has.
fn levels() -> Vec<&'static str> {
    let detected = Isa::detected();
    let mut levels = vec!["scalar"];
    if detected >= Isa::Avx2 {
        levels.push("avx2");
    } else {
        eprintln!("!!! no AVX2 here: only the scalar level is exercised !!!");
    }
    if detected >= Isa::Avx512 {
        levels.push("avx512");
    }
    levels
}

/// `/health`'s `cpu_isa` and a greedy 12-token completion with the top-5 log-probabilities.
fn run(model: &Path, level: &str) -> (String, Value) {
    let worker = Worker::spawn_with_env(model, &["--threads", "2"], &[("LLORCH_CPU_ISA", level)]);
    worker.wait_ready();
    let health = http::get(worker.addr, "/health").unwrap().json();
    let body = json!({"prompt": "The three primary colors are", "max_tokens": 12,
        "temperature": 0, "logprobs": 5, "return_tokens_as_token_ids": true});
    let response = http::post_json(worker.addr, "/v1/completions", &body).unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
    let reply = response.json();
    (
        health["cpu_isa"].as_str().unwrap_or_default().to_owned(),
        reply["choices"][0]["logprobs"].clone(),
    )
}

fn every_level_computes_the_same_bits(model: impl Asset) {
    if worker_binary() != "llorch-cpud" {
        return;
    }
    let _serial = serial();
    let model = model.path();
    let mut first: Option<(&str, Value)> = None;
    for level in levels() {
        let (shown, logprobs) = run(&model, level);
        assert!(
            shown.starts_with(level),
            "{level}: /health says cpu_isa {shown:?}"
        );
        assert_eq!(logprobs["tokens"].as_array().map(Vec::len), Some(12));
        match &first {
            None => first = Some((level, logprobs)),
            Some((reference, expected)) => assert_eq!(
                &logprobs,
                expected,
                "{}: {level} differs from {reference}",
                model.display()
            ),
        }
    }
}

#[test]
fn every_isa_level_gives_the_same_tokens_and_logprobs_on_smollm2() {
    every_level_computes_the_same_bits(Model::SmolLm2);
}

#[test]
fn every_isa_level_gives_the_same_tokens_and_logprobs_on_qwen() {
    every_level_computes_the_same_bits(Model::Qwen05);
}

#[test]
fn every_isa_level_gives_the_same_tokens_and_logprobs_on_q3_k() {
    every_level_computes_the_same_bits(Synthetic::Q3K);
}

#[test]
fn every_isa_level_gives_the_same_tokens_and_logprobs_on_iq4_xs() {
    every_level_computes_the_same_bits(Synthetic::Iq4Xs);
}

#[test]
fn every_isa_level_gives_the_same_tokens_and_logprobs_on_iq4_nl() {
    every_level_computes_the_same_bits(Synthetic::Iq4Nl);
}

#[test]
fn every_isa_level_gives_the_same_tokens_and_logprobs_on_iq3_s() {
    every_level_computes_the_same_bits(Synthetic::Iq3S);
}

#[test]
fn every_isa_level_gives_the_same_tokens_and_logprobs_on_q2_k() {
    every_level_computes_the_same_bits(Synthetic::Q2K);
}

#[test]
fn every_isa_level_gives_the_same_tokens_and_logprobs_on_iq3_xxs() {
    every_level_computes_the_same_bits(Synthetic::Iq3Xxs);
}

#[test]
fn an_isa_the_cpu_lacks_or_an_unknown_name_fails_the_load() {
    if worker_binary() != "llorch-cpud" {
        return;
    }
    let _serial = serial();
    let mut refused = vec!["sse9"];
    if Isa::detected() < Isa::Avx512 {
        refused.push("avx512");
    }
    for level in refused {
        let mut worker =
            Worker::spawn_with_env(&Model::SmolLm2.path(), &[], &[("LLORCH_CPU_ISA", level)]);
        let status = worker.wait_exit(Duration::from_secs(60));
        assert_eq!(status.and_then(|s| s.code()), Some(1), "{level}");
        let error = worker
            .logs()
            .into_iter()
            .find(|line| line["event"] == "error")
            .unwrap_or_else(|| panic!("{level}: no error line in {:?}", worker.log_lines()));
        assert_eq!(error["code"], "MODEL_LOAD_FAILED", "{error}");
        let message = error.to_string();
        assert!(
            message.contains("LLORCH_CPU_ISA") && message.contains(level),
            "{message}"
        );
    }
}
