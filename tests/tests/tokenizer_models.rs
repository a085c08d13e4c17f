//! Our tokenizer on the four real models against llama.cpp (fixtures from
//! `scripts/gen-tokenizer-fixtures.py` with llama-cpp-python 0.3.36): a multilingual corpus must
//! encode to llama.cpp's ids with and without specials, each token must decode to llama.cpp's
//! bytes, streaming decode must equal one-shot decode, and the end-of-generation set must match.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use llorch_tests::assets::Model;
use llorch_tests::fixtures::{fixture_ids, fixture_pieces, tokenizer_fixture};
use std::collections::BTreeSet;
use worker_common::gguf::Gguf;
use worker_common::tokenizer::stream::StreamDecoder;
use worker_common::tokenizer::{Tokenizer, TokenizerKind};

/// Streams `ids` through the decoder; every fragment must be non-empty valid UTF-8 (a `String`).
fn streamed(tokenizer: &Tokenizer, ids: &[u32]) -> String {
    let mut decoder = StreamDecoder::new();
    let mut text = String::new();
    for &id in ids {
        if let Some(fragment) = decoder.push(&tokenizer.token_bytes(id)) {
            assert!(!fragment.is_empty());
            text.push_str(&fragment);
        }
    }
    text.extend(decoder.finish());
    text
}

fn check(model: Model, kind: TokenizerKind) {
    let fixture = tokenizer_fixture(model, None);
    let gguf = Gguf::open(model.path()).unwrap();
    let tokenizer = Tokenizer::from_gguf(&gguf).unwrap();
    assert_eq!(tokenizer.kind(), kind);
    let eog: BTreeSet<u32> = fixture_ids(&fixture["eog_ids"]).into_iter().collect();
    assert_eq!(
        tokenizer.vocab().end_of_generation(),
        &eog,
        "end-of-generation ids"
    );
    let mut failures = Vec::new();
    let samples = fixture["samples"].as_array().unwrap();
    for sample in samples {
        let name = sample["name"].as_str().unwrap();
        let text = sample["text"].as_str().unwrap();
        let plain = tokenizer.encode(text, false, false).unwrap();
        if plain != fixture_ids(&sample["ids_plain"]) {
            failures.push(format!(
                "{name}: plain ids {plain:?} != {:?}",
                fixture_ids(&sample["ids_plain"])
            ));
            continue;
        }
        let special = tokenizer.encode(text, true, true).unwrap();
        if special != fixture_ids(&sample["ids_special"]) {
            failures.push(format!(
                "{name}: special ids {special:?} != {:?}",
                fixture_ids(&sample["ids_special"])
            ));
        }
        let pieces = fixture_pieces(sample);
        let ours: Vec<Vec<u8>> = plain.iter().map(|&id| tokenizer.token_bytes(id)).collect();
        if ours != pieces {
            failures.push(format!(
                "{name}: token bytes differ from llama.cpp's pieces"
            ));
        }
        let decoded = tokenizer.decode(&plain);
        if decoded != sample["detok_plain"].as_str().unwrap() {
            failures.push(format!(
                "{name}: decode {decoded:?} != {:?}",
                sample["detok_plain"]
            ));
        }
        if kind == TokenizerKind::GgufBpe && decoded != text {
            failures.push(format!("{name}: BPE decode(encode(x)) {decoded:?} != x"));
        }
        if streamed(&tokenizer, &plain) != decoded {
            failures.push(format!(
                "{name}: streamed decode differs from one-shot decode"
            ));
        }
    }
    eprintln!(
        "{}: {}/{} samples agree with llama.cpp",
        model.file_name(),
        samples.len() - failures.len(),
        samples.len()
    );
    assert!(
        failures.is_empty(),
        "{}:\n{}",
        model.file_name(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_matches_llama_cpp() {
    check(Model::SmolLm2, TokenizerKind::GgufBpe);
}

#[test]
fn qwen_05b_matches_llama_cpp() {
    check(Model::Qwen05, TokenizerKind::GgufBpe);
}

#[test]
fn qwen_15b_matches_llama_cpp() {
    check(Model::Qwen15, TokenizerKind::GgufBpe);
}

#[test]
fn gemma3_matches_llama_cpp() {
    check(Model::Gemma3, TokenizerKind::GgufSpm);
}
