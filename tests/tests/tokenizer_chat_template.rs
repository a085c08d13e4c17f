//! The chat templates of the real models render exactly as Python's jinja2 renders them (the
//! Hugging Face rendering, which llama.cpp's server reproduces): the reference is
//! `tests/fixtures/tokenizer/<key>.chat.json`, written by `scripts/gen-tokenizer-fixtures.py`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use llorch_tests::assets::Model;
use llorch_tests::fixtures::tokenizer_fixture;
use serde_json::Value as Json;
use worker_common::gguf::{ArrayValue, Gguf, Value};
use worker_common::tokenizer::template::{ChatMessage, ChatTemplate};

const TEMPLATE_KEY: &str = "tokenizer.chat_template";

fn open(model: Model) -> Gguf {
    Gguf::open(model.path()).unwrap_or_else(|err| panic!("{}: {err}", model.file_name()))
}

/// The text of token `key`'s id (`tokenizer.ggml.bos_token_id` …), as llama.cpp's server passes
/// it to the template (`token_to_piece(id, special = true)`: the token's text for a control
/// token).
fn token_text(gguf: &Gguf, key: &str) -> String {
    let id = gguf.require::<u32>(key).unwrap();
    let tokens = gguf.require::<ArrayValue>("tokenizer.ggml.tokens").unwrap();
    match tokens.iter().nth(id as usize) {
        Some(Value::String(bytes)) => String::from_utf8(bytes.to_vec()).unwrap(),
        other => panic!("{key} = {id}: not a string token: {other:?}"),
    }
}

fn messages(case: &Json) -> Vec<ChatMessage> {
    case["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect()
}

fn assert_matches_jinja2(model: Model) {
    let gguf = open(model);
    let fixture = tokenizer_fixture(model, Some("chat"));
    assert_eq!(fixture["ground_truth"], "jinja2");
    assert_eq!(fixture["model"], model.file_name());

    let source = gguf.require::<&str>(TEMPLATE_KEY).unwrap();
    assert_eq!(
        fixture["template"].as_str().unwrap(),
        source,
        "the fixture was rendered from another template; regenerate it"
    );
    let bos = token_text(&gguf, "tokenizer.ggml.bos_token_id");
    let eos = token_text(&gguf, "tokenizer.ggml.eos_token_id");
    assert_eq!(fixture["bos_token"].as_str().unwrap(), bos);
    assert_eq!(fixture["eos_token"].as_str().unwrap(), eos);

    let template = ChatTemplate::new(source, &bos, &eos).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 8, "{} cases", cases.len());
    for case in cases {
        let add_generation_prompt = case["add_generation_prompt"].as_bool().unwrap();
        let rendered = template
            .render(&messages(case), add_generation_prompt)
            .unwrap_or_else(|err| panic!("{} {}: {err}", model.file_name(), case["name"]));
        assert_eq!(
            rendered,
            case["jinja2"].as_str().unwrap(),
            "{} case {} (add_generation_prompt = {add_generation_prompt})",
            model.file_name(),
            case["name"],
        );
    }
}

#[test]
fn smollm2_template_matches_jinja2() {
    assert_matches_jinja2(Model::SmolLm2);
}

#[test]
fn qwen05_template_matches_jinja2() {
    assert_matches_jinja2(Model::Qwen05);
}

#[test]
fn qwen15_template_matches_jinja2() {
    assert_matches_jinja2(Model::Qwen15);
}

/// gemma-3-270m is a base model: no chat template, so prompts are tokenized raw.
#[test]
fn gemma3_has_no_template() {
    let gguf = open(Model::Gemma3);
    assert_eq!(gguf.optional::<&str>(TEMPLATE_KEY).unwrap(), None);
    let fixture = tokenizer_fixture(Model::Gemma3, Some("chat"));
    assert_eq!(fixture["has_template"], false);
    assert!(fixture["cases"].as_array().unwrap().is_empty());
}
