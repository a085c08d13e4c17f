//! `hf-json`: a `tokenizer.json` beside the model is chosen over the GGUF vocabulary, and goes
//! through the `tokenizers` crate. The file is SmolLM2's tokenizer rebuilt from its GGUF (the
//! same vocabulary, merges and pre-tokenizer as the original `tokenizer.json`), so its ids must
//! equal llama.cpp's on the fixture corpus wherever no control-token text is involved (the crate
//! always matches added tokens; llama.cpp without `parse_special` does not).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use llorch_tests::assets::Model;
use llorch_tests::fixtures::{fixture_ids, tokenizer_fixture};
use serde_json::{Value as Json, json};
use worker_common::gguf::{ArrayValue, Gguf, Value};
use worker_common::tokenizer::{TokenType, Tokenizer, TokenizerKind};

/// SmolLM2's `tokenizer.json`, from the GGUF's tokens, types and merges.
fn smollm2_tokenizer_json(gguf: &Gguf) -> Json {
    let strings = |key: &str| -> Vec<String> {
        let array = gguf.require::<ArrayValue>(key).unwrap();
        array
            .iter()
            .map(|v| match v {
                Value::String(s) => String::from_utf8(s.to_vec()).unwrap(),
                other => panic!("{key}: {other}"),
            })
            .collect()
    };
    let tokens = strings("tokenizer.ggml.tokens");
    let tokenizer = Tokenizer::from_gguf(gguf).unwrap();
    let added: Vec<Json> = (0..tokens.len() as u32)
        .filter(|&id| tokenizer.vocab().token_type(id) == Some(TokenType::Control))
        .map(|id| {
            json!({"id": id, "content": tokens[id as usize], "single_word": false, "lstrip": false,
                         "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let vocab: serde_json::Map<String, Json> = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), json!(id)))
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": strings("tokenizer.ggml.merges")}
    })
}

/// A directory holding a link to SmolLM2 and a `tokenizer.json` beside it.
fn model_dir_with_tokenizer_json(gguf: &Gguf) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("llorch-hf-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join(Model::SmolLm2.file_name());
    if !model.exists() {
        std::os::unix::fs::symlink(Model::SmolLm2.path(), &model).unwrap();
    }
    std::fs::write(
        dir.join("tokenizer.json"),
        smollm2_tokenizer_json(gguf).to_string(),
    )
    .unwrap();
    (dir, model)
}

#[test]
fn a_tokenizer_json_beside_the_model_is_used_and_agrees_with_llama_cpp() {
    let gguf = Gguf::open(Model::SmolLm2.path()).unwrap();
    let (dir, model) = model_dir_with_tokenizer_json(&gguf);
    let tokenizer = Tokenizer::for_model(&gguf, &model, None).unwrap();
    assert_eq!(tokenizer.kind(), TokenizerKind::HfJson);
    let fixture = tokenizer_fixture(Model::SmolLm2, None);
    let mut compared = 0;
    for sample in fixture["samples"].as_array().unwrap() {
        let text = sample["text"].as_str().unwrap();
        // Samples with `<` may hold control-token text (see the module doc).
        if text.contains('<') {
            continue;
        }
        let got = tokenizer.encode(text, false, false).unwrap();
        assert_eq!(
            got,
            fixture_ids(&sample["ids_plain"]),
            "{:?}",
            sample["name"]
        );
        assert_eq!(tokenizer.decode(&got), text, "{:?}", sample["name"]);
        compared += 1;
    }
    eprintln!("hf-json agrees with llama.cpp on {compared} samples");
    assert!(compared >= 30, "only {compared} samples compared");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn without_a_tokenizer_json_the_gguf_vocabulary_is_used() {
    let gguf = Gguf::open(Model::SmolLm2.path()).unwrap();
    let tokenizer = Tokenizer::for_model(&gguf, &Model::SmolLm2.path(), None).unwrap();
    assert_eq!(tokenizer.kind(), TokenizerKind::GgufBpe);
}

#[test]
fn a_named_tokenizer_json_that_does_not_exist_is_an_error_naming_it() {
    let gguf = Gguf::open(Model::SmolLm2.path()).unwrap();
    let missing = Path::new("/nonexistent/tokenizer.json");
    let err = Tokenizer::for_model(&gguf, &Model::SmolLm2.path(), Some(missing)).unwrap_err();
    assert!(
        err.to_string().contains("/nonexistent/tokenizer.json"),
        "{err}"
    );
}
