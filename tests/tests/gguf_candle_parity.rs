//! Our GGUF reader against an independent one, candle-core's `gguf_file`: on the four real
//! models and on llama.cpp's vocab files both must see the same metadata (every value, every
//! array element), the same tensors (type, shape, offset) and the same start of the data section.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::{self, Content, VersionedMagic};
use llorch_tests::assets::{Model, vocab_files};
use worker_common::gguf::{GgmlType, Gguf, Value};

/// How much was compared, for the test output.
#[derive(Default)]
struct Compared {
    keys: usize,
    array_elements: usize,
    tensors: usize,
}

/// candle's dtype as our type. candle keeps its numeric ids private, so the mapping is by name;
/// the match is exhaustive, so a dtype candle adds fails to compile here instead of slipping by.
fn our_type(dtype: GgmlDType) -> GgmlType {
    match dtype {
        GgmlDType::F32 => GgmlType::F32,
        GgmlDType::F16 => GgmlType::F16,
        GgmlDType::BF16 => GgmlType::BF16,
        GgmlDType::Q4_0 => GgmlType::Q4_0,
        GgmlDType::Q4_1 => GgmlType::Q4_1,
        GgmlDType::Q5_0 => GgmlType::Q5_0,
        GgmlDType::Q5_1 => GgmlType::Q5_1,
        GgmlDType::Q8_0 => GgmlType::Q8_0,
        GgmlDType::Q8_1 => GgmlType::Q8_1,
        GgmlDType::Q2K => GgmlType::Q2_K,
        GgmlDType::Q3K => GgmlType::Q3_K,
        GgmlDType::Q4K => GgmlType::Q4_K,
        GgmlDType::Q5K => GgmlType::Q5_K,
        GgmlDType::Q6K => GgmlType::Q6_K,
        GgmlDType::Q8K => GgmlType::Q8_K,
    }
}

/// Asserts `ours` equals `theirs` in type and value, recursing into arrays; `at` names the value.
fn assert_same_value(
    at: &str,
    ours: Value<'_>,
    theirs: &gguf_file::Value,
    compared: &mut Compared,
) {
    use gguf_file::Value as C;
    match (ours, theirs) {
        (Value::U8(a), C::U8(b)) => assert_eq!(a, *b, "{at}"),
        (Value::I8(a), C::I8(b)) => assert_eq!(a, *b, "{at}"),
        (Value::U16(a), C::U16(b)) => assert_eq!(a, *b, "{at}"),
        (Value::I16(a), C::I16(b)) => assert_eq!(a, *b, "{at}"),
        (Value::U32(a), C::U32(b)) => assert_eq!(a, *b, "{at}"),
        (Value::I32(a), C::I32(b)) => assert_eq!(a, *b, "{at}"),
        (Value::U64(a), C::U64(b)) => assert_eq!(a, *b, "{at}"),
        (Value::I64(a), C::I64(b)) => assert_eq!(a, *b, "{at}"),
        // By bits: equal floats must be the same number, NaN payloads and signed zeros included.
        (Value::F32(a), C::F32(b)) => assert_eq!(a.to_bits(), b.to_bits(), "{at}"),
        (Value::F64(a), C::F64(b)) => assert_eq!(a.to_bits(), b.to_bits(), "{at}"),
        (Value::Bool(a), C::Bool(b)) => assert_eq!(a, *b, "{at}"),
        (Value::String(a), C::String(b)) => assert_eq!(a, b.as_bytes(), "{at}"),
        (Value::Array(a), C::Array(b)) => {
            assert_eq!(a.len(), b.len() as u64, "{at}: array length");
            let mut seen = 0;
            for (index, (ours, theirs)) in a.iter().zip(b).enumerate() {
                // candle keeps no element type, only typed elements: each of ours must carry the
                // array's declared type, and the match above then compares it with candle's.
                assert_eq!(ours.value_type(), a.element_type(), "{at}[{index}]");
                assert_same_value(&format!("{at}[{index}]"), ours, theirs, compared);
                seen += 1;
            }
            assert_eq!(seen, b.len(), "{at}: elements decoded");
            compared.array_elements += seen;
        }
        (ours, theirs) => panic!(
            "{at}: ours is {}, candle's is {:?}",
            ours.type_description(),
            theirs.value_type()
        ),
    }
}

/// candle's reading of the file at `path`, or the test fails naming the file.
fn candle(path: &Path) -> Content {
    // candle reads field by field; buffering turns a million small reads into a few hundred.
    let mut reader = BufReader::new(File::open(path).unwrap());
    Content::read(&mut reader).unwrap_or_else(|err| panic!("candle on {}: {err}", path.display()))
}

/// Asserts both readers see the same metadata, tensors and data offset in one file.
fn assert_candle_agrees<B: AsRef<[u8]>>(name: &str, gguf: &Gguf<B>, content: &Content) -> Compared {
    let mut compared = Compared::default();

    let our_keys: BTreeSet<&str> = gguf.metadata().map(|(key, _)| key).collect();
    let their_keys: BTreeSet<&str> = content.metadata.keys().map(String::as_str).collect();
    assert_eq!(our_keys, their_keys, "{name}: metadata keys");
    assert_eq!(
        gguf.metadata_len(),
        our_keys.len(),
        "{name}: a repeated key"
    );
    for (key, ours) in gguf.metadata() {
        assert_same_value(
            &format!("{name}: {key}"),
            ours,
            &content.metadata[key],
            &mut compared,
        );
        compared.keys += 1;
    }

    let our_names: BTreeSet<&str> = gguf.tensors().map(|t| t.name).collect();
    let their_names: BTreeSet<&str> = content.tensor_infos.keys().map(String::as_str).collect();
    assert_eq!(our_names, their_names, "{name}: tensor names");
    assert_eq!(
        gguf.tensor_count(),
        our_names.len(),
        "{name}: a repeated tensor"
    );
    // candle's offsets, like ours, are relative to the data section (its `TensorInfo::read` adds
    // `tensor_data_offset`), so both the stored offsets and the data section's start must match.
    assert_eq!(
        content.tensor_data_offset,
        gguf.data_offset() as u64,
        "{name}: data offset"
    );
    for tensor in gguf.tensors() {
        let at = format!("{name}: {}", tensor.name);
        let info = &content.tensor_infos[tensor.name];
        assert_eq!(our_type(info.ggml_dtype), tensor.ggml_type, "{at}: type");
        // candle reverses the dimensions into row-major order (slowest first); ours keep ggml's
        // order (row length first), so compare candle's reversed.
        let ggml_order: Vec<u64> = info.shape.dims().iter().rev().map(|&d| d as u64).collect();
        assert_eq!(ggml_order, tensor.shape, "{at}: shape");
        assert_eq!(info.offset, tensor.offset, "{at}: offset");
        let candle_bytes =
            info.shape.elem_count() / info.ggml_dtype.block_size() * info.ggml_dtype.type_size();
        assert_eq!(candle_bytes, tensor.data.len(), "{at}: data size");
        compared.tensors += 1;
    }
    compared
}

fn assert_candle_agrees_on(model: Model) {
    let path = model.path();
    let name = model.file_name();
    let gguf = Gguf::open(&path).unwrap_or_else(|err| panic!("{name}: {err}"));
    let content = candle(&path);
    assert!(matches!(content.magic, VersionedMagic::GgufV3), "{name}");
    let compared = assert_candle_agrees(name, &gguf, &content);
    eprintln!(
        "{name}: candle agrees on {} keys, {} array elements, {} tensors, data offset {}",
        compared.keys,
        compared.array_elements,
        compared.tensors,
        gguf.data_offset()
    );
}

#[test]
fn candle_reads_the_same_smollm2_header() {
    assert_candle_agrees_on(Model::SmolLm2);
}

#[test]
fn candle_reads_the_same_qwen_coder_05b_header() {
    assert_candle_agrees_on(Model::Qwen05);
}

#[test]
fn candle_reads_the_same_qwen_coder_15b_header() {
    assert_candle_agrees_on(Model::Qwen15);
}

#[test]
fn candle_reads_the_same_gemma3_270m_header() {
    assert_candle_agrees_on(Model::Gemma3);
}

#[test]
fn candle_reads_the_same_metadata_in_every_llama_cpp_vocab_file() {
    let mut total = Compared::default();
    let files = vocab_files();
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy();
        let content = candle(path);
        let gguf = Gguf::open(path).unwrap_or_else(|err| panic!("{name}: {err}"));
        let compared = assert_candle_agrees(&name, &gguf, &content);
        eprintln!(
            "{name}: candle agrees on {} keys, {} array elements, {} tensors ({:?})",
            compared.keys, compared.array_elements, compared.tensors, content.magic
        );
        total.keys += compared.keys;
        total.array_elements += compared.array_elements;
        total.tensors += compared.tensors;
    }
    eprintln!(
        "{} vocab files: candle agrees on {} keys, {} array elements, {} tensors",
        files.len(),
        total.keys,
        total.array_elements,
        total.tensors
    );
}
