//! The numerics guard and the vocabulary checks on mutated copies of SmolLM2, against the real
//! worker: a NaN or an infinity in a norm vector and a token list shorter or longer than the
//! embedding are refused at load (exit 1, `MODEL_LOAD_FAILED`, the tensor and the sizes named);
//! a NaN planted in one token's embedding row ends exactly the jobs whose computation reaches
//! that token with `MODEL_NUMERICS`, while the others succeed and /metrics counts them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use llorch_tests::assets::Model;
use llorch_tests::bins::binary;
use llorch_tests::gguf_writer::{GgufBuilder, OwnedArray, OwnedValue};
use llorch_tests::http::get;
use llorch_tests::stream::{job, run, terminal};
use llorch_tests::worker::{Worker, serial, worker_binary};
use serde_json::json;
use worker_common::gguf::{ArrayValue, GgmlType, Gguf, ValueType};
use worker_common::model::{ModelError, ModelSpec};

/// Tokens in SmolLM2's list, rows of its embedding table.
const VOCAB: usize = 49152;
/// Bytes of one Q8_0 row of SmolLM2's embedding table: 576 / 32 blocks of 34 bytes.
const EMBD_ROW_BYTES: usize = 576 / 32 * 34;
/// An f16 NaN, little-endian.
const F16_NAN: [u8; 2] = [0x00, 0x7e];

/// A copy of SmolLM2 changed by `edit`, written to a temporary file named after `name`.
fn smollm2_with(name: &str, edit: impl FnOnce(&Gguf, &mut GgufBuilder<'_>)) -> PathBuf {
    let original = Gguf::open(Model::SmolLm2.path()).unwrap();
    let mut copy = GgufBuilder::from_gguf(&original);
    edit(&original, &mut copy);
    let path = std::env::temp_dir().join(format!("llorch-{name}-{}.gguf", std::process::id()));
    std::fs::write(&path, copy.to_bytes()).unwrap();
    path
}

/// Replaces f32 element `index` of vector `name` by `value`.
fn set_f32(original: &Gguf, copy: &mut GgufBuilder<'_>, name: &str, index: usize, value: f32) {
    let tensor = original.tensor(name).unwrap();
    assert_eq!(tensor.ggml_type, GgmlType::F32, "{name}");
    let mut data = tensor.data.to_vec();
    data[4 * index..4 * index + 4].copy_from_slice(&value.to_le_bytes());
    copy.tensor(name, GgmlType::F32, tensor.shape, data);
}

/// The elements of array `key`.
fn array(original: &Gguf, key: &str) -> Vec<OwnedValue> {
    let value = original.require::<ArrayValue>(key).unwrap();
    OwnedArray::from(value).elements().to_vec()
}

/// Gives the token list (and the token types beside it) `len` entries: cut, or padded with
/// `<extra_i>` tokens.
fn resize_vocabulary(original: &Gguf, copy: &mut GgufBuilder<'_>, len: usize) {
    let mut tokens = array(original, "tokenizer.ggml.tokens");
    let mut types = array(original, "tokenizer.ggml.token_type");
    tokens.truncate(len);
    types.truncate(len);
    for i in tokens.len()..len {
        tokens.push(OwnedValue::string(&format!("<extra_{i}>")));
        types.push(OwnedValue::I32(1));
    }
    copy.metadata(
        "tokenizer.ggml.tokens",
        OwnedValue::array(ValueType::String, tokens).unwrap(),
    );
    copy.metadata(
        "tokenizer.ggml.token_type",
        OwnedValue::array(ValueType::I32, types).unwrap(),
    );
}

/// Starts the worker on `model` (then deletes it) and returns its output; asserts that it
/// exited 1 with `MODEL_LOAD_FAILED` without a panic within a minute (a worker that accepts the
/// model would serve it until killed).
fn refused_at_load(model: PathBuf) -> String {
    let log = model.with_extension("log");
    let out = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(binary(&worker_binary()))
        .arg("--model")
        .arg(&model)
        .stderr(Stdio::from(out.try_clone().unwrap()))
        .stdout(Stdio::from(out))
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::fs::remove_file(&model).unwrap();
    let message = std::fs::read_to_string(&log).unwrap();
    std::fs::remove_file(&log).unwrap();
    let status = status.unwrap_or_else(|| panic!("the worker accepted the model: {message}"));
    assert_eq!(status.code(), Some(1), "{message}");
    assert!(message.contains("MODEL_LOAD_FAILED"), "{message}");
    assert!(!message.contains("panicked"), "{message}");
    message
}

#[test]
fn a_nan_or_infinite_norm_is_refused_at_load_naming_the_tensor() {
    let _serial = serial();
    let cases = [
        ("blk.7.ffn_norm.weight", 100, f32::NAN, "NaN"),
        ("output_norm.weight", 575, f32::NEG_INFINITY, "-inf"),
        ("blk.0.attn_norm.weight", 0, f32::INFINITY, "inf"),
    ];
    for (tensor, index, value, shown) in cases {
        let model = smollm2_with("nan-norm", |original, copy| {
            set_f32(original, copy, tensor, index, value);
        });
        let message = refused_at_load(model);
        let named = format!("holds {shown} at element {index}");
        assert!(message.contains(tensor), "{tensor}: {message}");
        assert!(message.contains(&named), "{named}: {message}");
    }
}

#[test]
fn a_token_list_shorter_than_the_embedding_is_refused_at_load() {
    let _serial = serial();
    // With `llama.vocab_size` (49152, the embedding's rows) and without it (the vocabulary's
    // size then comes from the token list): the same refusal.
    for keep_vocab_size in [true, false] {
        let model = smollm2_with("short-vocab", |original, copy| {
            resize_vocabulary(original, copy, VOCAB - 100);
            if !keep_vocab_size {
                copy.remove_metadata("llama.vocab_size").unwrap();
            }
        });
        let message = refused_at_load(model);
        assert_names_sizes(&message, 49052, "token_embd.weight", 49152);
    }
}

#[test]
fn a_token_list_longer_than_the_embedding_is_refused_at_load() {
    let _serial = serial();
    let model = smollm2_with("long-vocab", |original, copy| {
        resize_vocabulary(original, copy, VOCAB + 7);
    });
    let message = refused_at_load(model);
    assert_names_sizes(&message, 49159, "token_embd.weight", 49152);
}

/// The refusal names the token count, the tensor and its rows.
fn assert_names_sizes(message: &str, tokens: usize, tensor: &str, rows: usize) {
    for part in [
        format!("has {tokens} tokens but tensor"),
        tensor.to_owned(),
        format!("has {rows} rows"),
    ] {
        assert!(message.contains(&part), "{part}: {message}");
    }
}

#[test]
fn an_output_head_of_another_vocabulary_is_refused_naming_it() {
    // SmolLM2 ties its head to the embedding; this copy gets an untied head 52 rows short.
    let original = Gguf::open(Model::SmolLm2.path()).unwrap();
    let embd = original.tensor("token_embd.weight").unwrap();
    let rows = VOCAB - 52;
    let mut copy = GgufBuilder::from_gguf(&original);
    copy.tensor(
        "output.weight",
        GgmlType::Q8_0,
        &[576, rows as u64],
        &embd.data[..rows * EMBD_ROW_BYTES],
    );
    let edited = Gguf::parse(copy.to_bytes()).unwrap();
    match ModelSpec::from_gguf(&edited) {
        Err(err @ ModelError::VocabularyMismatch { .. }) => {
            assert_names_sizes(&err.to_string(), 49152, "\"output.weight\"", 49100);
        }
        other => panic!("{other:?}"),
    }
}

/// The id of `token` in SmolLM2's list.
fn token_id(original: &Gguf, token: &str) -> usize {
    array(original, "tokenizer.ggml.tokens")
        .iter()
        .position(|t| *t == OwnedValue::string(token))
        .unwrap_or_else(|| panic!("{token:?} is not a token of SmolLM2"))
}

/// The running count of metric `name` (a line `name value`).
fn metric(worker: &Worker, name: &str) -> u64 {
    let text = get(worker.addr, "/metrics").unwrap().text();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[test]
fn nan_logits_end_the_jobs_that_reach_a_broken_token_with_model_numerics() {
    let _serial = serial();
    // One block scale (the f16 `d` of the first Q8_0 block) of " Paris"'s embedding row is NaN:
    // the file loads (matrices are not scanned), and any sequence holding the token computes NaN.
    // SmolLM2 ties its output head to the embedding, which would make the logit of " Paris" NaN
    // for every job; the copy gets an untied head holding the intact table (the same numbers).
    let model = smollm2_with("nan-token", |original, copy| {
        let embd = original.tensor("token_embd.weight").unwrap();
        copy.tensor(
            "output.weight",
            embd.ggml_type,
            embd.shape,
            embd.data.to_vec(),
        );
        let at = token_id(original, "ĠParis") * EMBD_ROW_BYTES;
        let mut data = embd.data.to_vec();
        data[at..at + 2].copy_from_slice(&F16_NAN);
        copy.tensor("token_embd.weight", embd.ggml_type, embd.shape, data);
    });
    let worker = Worker::ready(&model, &[]);
    std::fs::remove_file(&model).unwrap();
    let raw = |temperature: f64, max_tokens: u64| json!({"raw": true, "temperature": temperature, "seed": 1, "max_tokens": max_tokens});

    // In the prompt: the greedy choice (T = 0) and the sampled logits row (T = 0.7).
    for (id, temperature) in [("greedy", 0.0), ("sampled", 0.7)] {
        let events = run(worker.addr, &job(id, "I love Paris", raw(temperature, 4)));
        let end = terminal(&events);
        assert_eq!(end["type"], "error", "{id}: {events:?}");
        assert_eq!(end["code"], "MODEL_NUMERICS", "{id}: {end}");
        assert_eq!(end["retriable"], false, "{id}: {end}");
        assert!(end["message"].as_str().unwrap().contains("NaN"), "{end}");
        assert!(
            events.iter().all(|e| e.event != "token"),
            "{id}: {events:?}"
        );
    }

    // Mid-run: the model answers " Paris", and the step that reads it back fails.
    let events = run(
        worker.addr,
        &job("mid-run", "The capital of France is", raw(0.0, 8)),
    );
    let tokens: Vec<&str> = events
        .iter()
        .filter(|e| e.event == "token")
        .filter_map(|e| e.data["t"].as_str())
        .collect();
    assert_eq!(tokens, [" Paris"], "{events:?}");
    assert_eq!(terminal(&events)["code"], "MODEL_NUMERICS", "{events:?}");

    // A prompt that never reaches the token is served as usual, before and after.
    let events = run(worker.addr, &job("clean", "Once upon a time", raw(0.0, 8)));
    assert_eq!(terminal(&events)["type"], "end", "{events:?}");
    assert_eq!(terminal(&events)["tokens_out"], 8, "{events:?}");

    assert_eq!(metric(&worker, "worker_model_numerics_errors_total"), 3);
    assert_eq!(
        metric(&worker, "worker_requests_total{outcome=\"error\"}"),
        3
    );
    assert_eq!(
        metric(&worker, "worker_requests_total{outcome=\"success\"}"),
        1
    );
}
