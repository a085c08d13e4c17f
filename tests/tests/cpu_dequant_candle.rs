//! `backend-cpu`'s reference dequantizers against an independent implementation, candle-core's
//! (`QTensor::dequantize` on the CPU): on every tensor of the four real models, every element
//! must be the same f32, bit for bit (two NaNs count as equal, whatever their payloads).
//!
//! Both follow llama.cpp's `dequantize_row_*` operation by operation (`(q - 8) * d`,
//! `d * sc * q - dmin * m`, …), and Rust never fuses a multiply and an add on its own, so every
//! format the models use is expected bit-exact; the comparison is exact, with no tolerance.
//! (In these formats every element is rounded at most once, see `backend_cpu::quant`, so the
//! exact match also holds for implementations that order the products differently.)
//! The models use F32, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K only, so every supported format is also
//! compared on random blocks, which reach every bit pattern of quants, scales and mins; all but
//! IQ3_XXS, IQ4_NL, IQ3_S and IQ4_XS, which candle does not read (their dequantizers are held to hand-built
//! blocks and to gguf-py's in `backend_cpu::quant`'s unit tests).

#![allow(clippy::unwrap_used)]

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufReader;
use std::time::Instant;

use backend_cpu::quant::{dequantize, element_count, is_supported};
use candle_core::Device;
use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use llorch_tests::assets::Model;
use worker_common::gguf::{GgmlType, Gguf};

/// Tensors and elements compared for one type.
#[derive(Default)]
struct Count {
    tensors: usize,
    elements: usize,
}

/// Index of the first element where `ours` and `theirs` differ, by bits, NaNs all equal.
fn first_difference(ours: &[f32], theirs: &[f32]) -> Option<usize> {
    ours.iter()
        .zip(theirs)
        .position(|(a, b)| a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan()))
}

fn assert_candle_dequantizes_the_same(model: Model) {
    let start = Instant::now();
    let path = model.path();
    let name = model.file_name();
    let gguf = Gguf::open(&path).unwrap_or_else(|err| panic!("{name}: {err}"));
    // candle reads field by field and seeks per tensor; buffering makes the header cheap.
    let mut reader = BufReader::new(File::open(&path).unwrap());
    let content = Content::read(&mut reader).unwrap();

    let mut counts: BTreeMap<GgmlType, Count> = BTreeMap::new();
    let mut unsupported: BTreeMap<GgmlType, usize> = BTreeMap::new();
    // One tensor at a time: ours and candle's copies of the largest (Qwen 1.5B's embedding,
    // 233M elements) are ~1 GB each, so never hold more than one tensor's worth.
    for tensor in gguf.tensors() {
        let at = format!("{name}: {} ({})", tensor.name, tensor.ggml_type);
        if !is_supported(tensor.ggml_type) {
            *unsupported.entry(tensor.ggml_type).or_default() += 1;
            continue;
        }
        let elements = element_count(tensor.ggml_type, tensor.data.len()).unwrap();
        let shape_elements: u64 = tensor.shape.iter().product();
        assert_eq!(elements as u64, shape_elements, "{at}: element count");

        let mut ours = vec![0.0f32; elements];
        dequantize(tensor.ggml_type, tensor.data, &mut ours)
            .unwrap_or_else(|err| panic!("{at}: {err}"));

        let theirs = content
            .tensor(&mut reader, tensor.name, &Device::Cpu)
            .unwrap_or_else(|err| panic!("{at}: candle: {err}"))
            .dequantize(&Device::Cpu)
            .and_then(|t| t.flatten_all()?.to_vec1::<f32>())
            .unwrap_or_else(|err| panic!("{at}: candle: {err}"));
        assert_eq!(ours.len(), theirs.len(), "{at}: length");
        if let Some(i) = first_difference(&ours, &theirs) {
            panic!(
                "{at}: element {i}: ours {} ({:#010x}), candle's {} ({:#010x})",
                ours[i],
                ours[i].to_bits(),
                theirs[i],
                theirs[i].to_bits()
            );
        }
        let count = counts.entry(tensor.ggml_type).or_default();
        count.tensors += 1;
        count.elements += elements;
    }

    for (ggml_type, count) in &counts {
        eprintln!(
            "{name}: {ggml_type}: {} tensors, {} elements bit-identical to candle",
            count.tensors, count.elements
        );
    }
    let tensors: usize = counts.values().map(|c| c.tensors).sum();
    let elements: usize = counts.values().map(|c| c.elements).sum();
    eprintln!(
        "{name}: {tensors} tensors, {elements} elements in {:.1?}",
        start.elapsed()
    );
    // Every tensor the models ship must be covered: CPU inference dequantizes all of them.
    assert!(
        unsupported.is_empty(),
        "{name}: tensors of unsupported types: {unsupported:?}"
    );
    assert_eq!(tensors, gguf.tensor_count(), "{name}: tensors compared");
}

#[test]
fn smollm2_dequantizes_like_candle() {
    assert_candle_dequantizes_the_same(Model::SmolLm2);
}

#[test]
fn gemma3_270m_dequantizes_like_candle() {
    assert_candle_dequantizes_the_same(Model::Gemma3);
}

#[test]
fn qwen_coder_05b_dequantizes_like_candle() {
    assert_candle_dequantizes_the_same(Model::Qwen05);
}

#[test]
fn qwen_coder_15b_dequantizes_like_candle() {
    assert_candle_dequantizes_the_same(Model::Qwen15);
}

/// candle's dtype for each supported type; `None` for those candle lacks.
fn candle_dtype(ggml_type: GgmlType) -> Option<GgmlDType> {
    Some(match ggml_type {
        GgmlType::F32 => GgmlDType::F32,
        GgmlType::F16 => GgmlDType::F16,
        GgmlType::BF16 => GgmlDType::BF16,
        GgmlType::Q4_0 => GgmlDType::Q4_0,
        GgmlType::Q4_1 => GgmlDType::Q4_1,
        GgmlType::Q5_0 => GgmlDType::Q5_0,
        GgmlType::Q5_1 => GgmlDType::Q5_1,
        GgmlType::Q8_0 => GgmlDType::Q8_0,
        GgmlType::Q2_K => GgmlDType::Q2K,
        GgmlType::Q3_K => GgmlDType::Q3K,
        GgmlType::Q4_K => GgmlDType::Q4K,
        GgmlType::Q5_K => GgmlDType::Q5K,
        GgmlType::Q6_K => GgmlDType::Q6K,
        GgmlType::IQ3_XXS | GgmlType::IQ4_NL | GgmlType::IQ3_S | GgmlType::IQ4_XS => return None,
        other => panic!("{other} is not supported"),
    })
}

#[test]
fn random_blocks_of_every_supported_format_dequantize_like_candle() {
    // xorshift64*: deterministic, so a failure reproduces.
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next_byte = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
    };
    const BLOCKS: usize = 4096;
    let mut not_in_candle = Vec::new();
    for &ggml_type in GgmlType::ALL.iter().filter(|&&t| is_supported(t)) {
        let Some(dtype) = candle_dtype(ggml_type) else {
            not_in_candle.push(ggml_type);
            continue;
        };
        let bytes = BLOCKS * ggml_type.block_bytes() as usize;
        let data: Vec<u8> = (0..bytes).map(|_| next_byte()).collect();
        let elements = element_count(ggml_type, data.len()).unwrap();
        let mut ours = vec![0.0f32; elements];
        dequantize(ggml_type, &data, &mut ours).unwrap();

        let storage = QStorage::from_data(Cow::Borrowed(&data), &Device::Cpu, dtype).unwrap();
        let theirs = QTensor::new(storage, (elements,))
            .unwrap()
            .dequantize(&Device::Cpu)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(ours.len(), theirs.len(), "{ggml_type}: length");
        if let Some(i) = first_difference(&ours, &theirs) {
            panic!(
                "{ggml_type}: random block {}, element {i}: ours {} ({:#010x}), candle's {} \
                 ({:#010x})",
                i / ggml_type.block_size() as usize,
                ours[i],
                ours[i].to_bits(),
                theirs[i],
                theirs[i].to_bits()
            );
        }
        let nans = ours.iter().filter(|x| x.is_nan()).count();
        eprintln!(
            "random {ggml_type}: {BLOCKS} blocks, {elements} elements bit-identical to candle \
             ({nans} NaN)"
        );
    }
    // Only the formats candle is known to lack go unchecked here.
    assert_eq!(
        not_in_candle,
        [
            GgmlType::IQ3_XXS,
            GgmlType::IQ4_NL,
            GgmlType::IQ3_S,
            GgmlType::IQ4_XS
        ]
    );
}
