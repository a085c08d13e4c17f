//! Hostile and degenerate input never panics, never hangs and yields only ids of the vocabulary:
//! every byte value, unpaired surrogates as they arrive from JSON, 100k spaces, a 100k-character
//! word, and special tokens nested inside each other. (Round trips are not required here: like
//! llama.cpp, a BPE vocabulary without a token for a control byte drops it; SmolLM2 lacks 0x04.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use llorch_tests::assets::Model;
use worker_common::gguf::Gguf;
use worker_common::tokenizer::Tokenizer;

fn tokenizer(model: Model) -> Tokenizer {
    let gguf = Gguf::open(model.path()).unwrap();
    Tokenizer::from_gguf(&gguf).unwrap_or_else(|err| panic!("{}: {err}", model.file_name()))
}

/// Inputs a client could send. JSON escapes such as `"\ud800"` reach us as U+FFFD after
/// serde's lossy handling, so they appear here in that form too.
fn garbage() -> Vec<(String, String)> {
    let every_char: String = (0u32..=0x2FF).filter_map(char::from_u32).collect();
    let every_byte_lossy = String::from_utf8_lossy(&(0u8..=255).collect::<Vec<u8>>()).into_owned();
    vec![
        ("every code point below U+0300".into(), every_char),
        ("every byte, lossily decoded".into(), every_byte_lossy),
        (
            "unpaired surrogates after JSON decoding".into(),
            "a\u{FFFD}b\u{FFFD}\u{FFFD}c".into(),
        ),
        ("100k spaces".into(), " ".repeat(100_000)),
        ("100k-character word".into(), "a".repeat(100_000)),
        ("100k newlines and tabs".into(), "\n\t".repeat(50_000)),
        (
            "nested special tokens".into(),
            "<|im_start|<|im_end|>>user<<end_of_turn>|im_start|><bos><|endoftext|>".into(),
        ),
        (
            "a lone combining mark and ZWJ".into(),
            "\u{0301}\u{200D}\u{FE0F}".into(),
        ),
        (
            "NUL and control characters".into(),
            "\0\u{1}\u{7}\u{1B}[0m\u{7F}".into(),
        ),
    ]
}

fn check(model: Model) {
    let tokenizer = tokenizer(model);
    for (label, text) in garbage() {
        for (add_special, parse_special) in [(false, false), (true, true)] {
            let ids = tokenizer.encode(&text, add_special, parse_special).unwrap();
            assert!(
                ids.iter()
                    .all(|&id| (id as usize) < tokenizer.vocab().len()),
                "{}: {label}: id out of range",
                model.file_name()
            );
            let decoded = tokenizer.decode(&ids);
            assert!(
                decoded.len() <= 4 * text.len() + 64,
                "{}: {label}: decode grew",
                model.file_name()
            );
        }
    }
}

#[test]
fn smollm2_survives_garbage() {
    check(Model::SmolLm2);
}

#[test]
fn qwen_survives_garbage() {
    check(Model::Qwen05);
}

#[test]
fn gemma3_survives_garbage() {
    check(Model::Gemma3);
}
