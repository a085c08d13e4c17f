//! Our tokenizer on the synthetic models' vocabularies (`scripts/gen-synthetic-models.py`:
//! llama-bpe, Qwen2, Phi-3's SentencePiece, and gpt-oss's `gpt-4o` pre-tokenizer over GPT-2's
//! BPE with harmony's specials) against llama.cpp b11434's `/tokenize` on a corpus of corner
//! cases (`tokenized` in the fixtures of `scripts/gen-synthetic-fixtures.py`), with and without
//! special tokens, and on the fixtures' prompts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use llorch_tests::fixtures::fixture_ids;
use llorch_tests::synthetic::Synthetic;
use worker_common::gguf::Gguf;
use worker_common::tokenizer::Tokenizer;

fn check(model: Synthetic) {
    let fixture = model.fixture(512);
    let gguf = Gguf::open(model.path()).unwrap();
    let tokenizer = Tokenizer::from_gguf(&gguf).unwrap();
    let mut failures = Vec::new();
    let samples = fixture["tokenized"].as_array().expect("tokenized");
    for sample in samples {
        let text = sample["text"].as_str().unwrap();
        for (special, key) in [(false, "plain"), (true, "special")] {
            let ours = tokenizer.encode(text, special, special).unwrap();
            let expected = fixture_ids(&sample[key]);
            if ours != expected {
                failures.push(format!("{text:?} ({key}): {ours:?} != {expected:?}"));
            }
        }
    }
    for sequence in fixture["sequences"].as_array().unwrap() {
        let text = sequence["text"].as_str().unwrap();
        let ours = tokenizer.encode(text, true, true).unwrap();
        if ours != fixture_ids(&sequence["prompt"]) {
            failures.push(format!("prompt {text:?}: {ours:?}"));
        }
    }
    eprintln!(
        "{}: {} samples, {} failures",
        model.name(),
        samples.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn gpt_oss_gpt4o_pre_tokenizer_matches_llama_cpp() {
    check(Synthetic::GptOss);
}

#[test]
fn llama3_tokenizer_matches_llama_cpp() {
    check(Synthetic::Llama3);
}

#[test]
fn qwen3_tokenizer_matches_llama_cpp() {
    check(Synthetic::Qwen3);
}

#[test]
fn phi3_tokenizer_matches_llama_cpp() {
    check(Synthetic::Phi3);
}
