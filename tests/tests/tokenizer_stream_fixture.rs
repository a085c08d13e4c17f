//! The streaming decoder on llama.cpp's own per-token pieces: for every corpus sample of every
//! model (`tests/fixtures/tokenizer/<key>.json`, from `scripts/gen-tokenizer-fixtures.py`),
//! feeding `llama_token_to_piece` bytes one token at a time yields only valid, non-empty UTF-8
//! fragments whose concatenation is llama.cpp's one-shot `llama_detokenize`, with no U+FFFD.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use llorch_tests::assets::Model;
use serde_json::Value as Json;
use worker_common::tokenizer::stream::StreamDecoder;

fn fixture(model: Model) -> Json {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/tokenizer")
        .join(format!("{}.json", model.fetch_target()));
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

fn unhex(hex: &str) -> Vec<u8> {
    assert!(hex.len() % 2 == 0, "odd hex {hex:?}");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn streamed_pieces_equal_one_shot_detokenize() {
    for model in Model::ALL {
        let fixture = fixture(model);
        let mut split_code_points = 0;
        for sample in fixture["samples"].as_array().unwrap() {
            let name = sample["name"].as_str().unwrap();
            let pieces: Vec<Vec<u8>> = sample["pieces_plain"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| unhex(p.as_str().unwrap()))
                .collect();
            split_code_points += pieces
                .iter()
                .filter(|p| std::str::from_utf8(p).is_err())
                .count();

            let mut decoder = StreamDecoder::new();
            let mut fragments: Vec<String> =
                pieces.iter().filter_map(|p| decoder.push(p)).collect();
            fragments.extend(decoder.finish());

            let expected = sample["detok_plain"].as_str().unwrap();
            assert_eq!(fragments.concat(), expected, "{model:?} {name}");
            assert!(
                !fragments
                    .iter()
                    .any(|f| f.is_empty() || f.contains('\u{FFFD}')),
                "{model:?} {name}: {fragments:?}"
            );
        }
        // The corpus is meant to exercise held bytes: every model splits some code point.
        assert!(
            split_code_points > 0,
            "{model:?}: no piece split a code point"
        );
    }
}
