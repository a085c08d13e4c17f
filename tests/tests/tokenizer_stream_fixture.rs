//! The streaming decoder on llama.cpp's own per-token pieces: for every corpus sample of every
//! model (`tests/fixtures/tokenizer/<key>.json`, from `scripts/gen-tokenizer-fixtures.py`),
//! feeding `llama_token_to_piece` bytes one token at a time yields only valid, non-empty UTF-8
//! fragments whose concatenation is llama.cpp's one-shot `llama_detokenize`, with no U+FFFD.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use llorch_tests::assets::Model;
use llorch_tests::fixtures::{fixture_pieces, tokenizer_fixture};
use worker_common::tokenizer::stream::StreamDecoder;

#[test]
fn streamed_pieces_equal_one_shot_detokenize() {
    for model in Model::ALL {
        let fixture = tokenizer_fixture(model, None);
        let mut split_code_points = 0;
        for sample in fixture["samples"].as_array().unwrap() {
            let name = sample["name"].as_str().unwrap();
            let pieces = fixture_pieces(sample);
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
