//! Conformance with llama.cpp's own tokenizer test vectors (`ggml-vocab-*.gguf.inp/.out`, build
//! b11434): every input must encode to exactly llama.cpp's ids.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use llorch_tests::assets::vocab_vectors;
use worker_common::gguf::Gguf;
use worker_common::tokenizer::{Tokenizer, TokenizerError};

/// Encodes every vector of `name` and fails listing the mismatches; prints passed/total.
fn assert_conformant(name: &str) {
    let vectors = vocab_vectors(name);
    let gguf = Gguf::open(&vectors.vocab).unwrap();
    let tokenizer = Tokenizer::from_gguf(&gguf).unwrap_or_else(|err| panic!("{name}: {err}"));
    let mut failures = Vec::new();
    for (text, expected) in &vectors.cases {
        let got = tokenizer.encode(text, false, false).unwrap();
        if &got != expected {
            failures.push(format!(
                "  {text:?}\n    expected {expected:?}\n    got      {got:?}"
            ));
        }
    }
    let total = vectors.cases.len();
    eprintln!("{name}: {}/{total} vectors passed", total - failures.len());
    assert!(
        failures.is_empty(),
        "{name}: {} of {total} vectors differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

macro_rules! conformance {
    ($($test:ident => $name:literal,)*) => {$(
        #[test]
        fn $test() {
            assert_conformant($name);
        }
    )*};
}

conformance! {
    gpt_2 => "gpt-2",
    llama_bpe => "llama-bpe",
    qwen2 => "qwen2",
    qwen35 => "qwen35",
    starcoder => "starcoder",
    refact => "refact",
    deepseek_llm => "deepseek-llm",
    deepseek_coder => "deepseek-coder",
    falcon => "falcon",
    mpt => "mpt",
    command_r => "command-r",
    llama_spm => "llama-spm",
    phi_3 => "phi-3",
    gemma_4 => "gemma-4",
}

#[test]
fn bert_bge_wordpiece_is_refused_clearly() {
    let vectors = vocab_vectors("bert-bge");
    let gguf = Gguf::open(&vectors.vocab).unwrap();
    let err = Tokenizer::from_gguf(&gguf).unwrap_err();
    assert!(
        matches!(&err, TokenizerError::UnsupportedModel { model, .. } if model == "bert"),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("unsupported tokenizer model \"bert\""),
        "{err}"
    );
}
