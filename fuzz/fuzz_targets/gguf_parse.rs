//! Parses arbitrary bytes as GGUF; when the reader accepts them, touches everything it exposes,
//! then builds what a worker builds from a parsed file: the `ModelSpec` and the tokenizer (which
//! then encodes and decodes a short text).

#![no_main]

use std::hint::black_box;

use libfuzzer_sys::fuzz_target;
use worker_common::gguf::{ArrayValue, Gguf, Value};
use worker_common::model::ModelSpec;
use worker_common::tokenizer::Tokenizer;

fuzz_target!(|data: &[u8]| {
    let Ok(gguf) = Gguf::parse(data) else {
        return;
    };
    for (key, value) in gguf.metadata() {
        walk(value);
        let found = gguf.get(key);
        assert!(found.is_some_and(|v| same(v, value)), "lookup of {key:?}");
    }
    for tensor in gguf.tensors() {
        let expected = tensor.ggml_type.bytes_for(tensor.elements());
        assert_eq!(
            expected,
            Some(tensor.data.len() as u64),
            "size of {:?}",
            tensor.name
        );
        let start = (tensor.data.as_ptr() as usize).wrapping_sub(data.as_ptr() as usize);
        let end = start.checked_add(tensor.data.len());
        assert!(
            end.is_some_and(|end| end <= data.len()),
            "{:?} lies outside the file",
            tensor.name
        );
        assert_eq!(start as u64, gguf.data_offset() as u64 + tensor.offset);
        assert!(
            gguf.tensor(tensor.name)
                .is_some_and(|t| t.data == tensor.data)
        );
        black_box(tensor.data.iter().fold(0u8, |acc, b| acc ^ b));
    }
    match ModelSpec::from_gguf(&gguf) {
        Ok(spec) => {
            black_box(spec.to_string());
        }
        Err(err) => {
            black_box(err.to_string());
        }
    }
    match Tokenizer::from_gguf(&gguf) {
        Ok(tokenizer) => {
            let ids = tokenizer
                .encode("Hi <s> a\u{e9}\n\n🦀 12", true, true)
                .expect("a GGUF vocabulary always encodes");
            let n_vocab = tokenizer.vocab().len();
            assert!(
                ids.iter().all(|&id| (id as usize) < n_vocab),
                "{ids:?} of {n_vocab}"
            );
            black_box(tokenizer.decode(&ids));
        }
        Err(err) => {
            black_box(err.to_string());
        }
    }
});

/// Equality that holds for NaN floats too: files may store any bit pattern.
fn same(a: Value<'_>, b: Value<'_>) -> bool {
    match (a, b) {
        (Value::F32(x), Value::F32(y)) => x.to_bits() == y.to_bits(),
        (Value::F64(x), Value::F64(y)) => x.to_bits() == y.to_bits(),
        _ => a == b,
    }
}

/// Visits a value and, for arrays, every element down to the innermost level.
fn walk(value: Value<'_>) {
    black_box(value.to_string());
    if let Value::Array(array) = value {
        walk_array(array);
    }
}

fn walk_array(array: ArrayValue<'_>) {
    black_box(array.raw_bytes());
    let mut seen = 0u64;
    for element in array.iter() {
        assert_eq!(element.value_type(), array.element_type());
        walk(element);
        seen += 1;
    }
    assert_eq!(
        seen,
        array.len(),
        "array yields as many elements as it claims"
    );
}
