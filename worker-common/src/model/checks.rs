//! Load-time checks of the file's content beyond names and shapes: the token list against the
//! embedding and output rows, and the model's vectors (norms, biases) for NaN and infinity.
//! Both are cheap (metadata and a few megabytes of vectors, never a weight matrix) and run once
//! in [`ModelSpec::from_gguf`](super::ModelSpec::from_gguf), so every backend gets them.

use crate::gguf::{ArrayValue, GgmlType, Gguf};

use super::{ModelError, TensorSpec};

/// The tensors whose rows are one per token: the embedding table and the untied output head.
const TOKEN_ROW_TENSORS: [&str; 2] = ["token_embd.weight", "output.weight"];

/// Refuses a token list whose length differs from the rows of the embedding table or of the
/// output head: a shorter list cannot decode every id the model samples (text silently lost), a
/// longer one gives ids the model has no row for. A file without a token list is left to the
/// tokenizer, and a tensor of a malformed shape to the shape checks.
pub(super) fn check_vocabulary<B: AsRef<[u8]>>(gguf: &Gguf<B>) -> Result<(), ModelError> {
    let Some(tokens) = gguf.optional::<ArrayValue>("tokenizer.ggml.tokens")? else {
        return Ok(());
    };
    let tokens = tokens.len();
    for name in TOKEN_ROW_TENSORS {
        let rows = match gguf.tensor(name).map(|t| t.shape) {
            Some(&[_, rows]) => rows,
            _ => continue,
        };
        if rows != tokens {
            return Err(ModelError::VocabularyMismatch {
                tokens,
                tensor: name,
                rows,
            });
        }
    }
    Ok(())
}

/// Refuses a model whose vectors (every 1-D tensor it reads: norms, biases, RoPE factors) hold
/// a NaN or an infinity, naming the tensor, the element and the value. Such a model loads but
/// computes NaN for every token; weight matrices and their block scales are not scanned (the
/// whole file would be read at every start).
pub(super) fn check_vectors<B: AsRef<[u8]>>(
    gguf: &Gguf<B>,
    specs: &[TensorSpec],
) -> Result<(), ModelError> {
    let vector = |s: &TensorSpec| s.shape.len() == 1 || s.name.ends_with(".bias");
    for spec in specs.iter().filter(|s| vector(s)) {
        let Some(tensor) = gguf.tensor(&spec.name) else {
            continue;
        };
        if let Some((index, value)) = first_non_finite(tensor.ggml_type, tensor.data) {
            return Err(ModelError::NonFiniteWeight {
                name: spec.name.clone(),
                index,
                value,
            });
        }
    }
    Ok(())
}

/// The first element of `data` that is NaN or infinite, with its value as f32, for the float
/// formats vectors are stored in (F32, F16, BF16); `None` for any other format (llama.cpp's
/// quantizer keeps 1-D tensors in f32).
fn first_non_finite(ggml_type: GgmlType, data: &[u8]) -> Option<(usize, f32)> {
    match ggml_type {
        GgmlType::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .enumerate()
            .find(|(_, v)| !v.is_finite()),
        GgmlType::F16 => half_non_finite(data, 0x7c00, 0x03ff),
        GgmlType::BF16 => half_non_finite(data, 0x7f80, 0x007f),
        _ => None,
    }
}

/// The first 16-bit float whose exponent bits (`exponent`) are all set: infinite when its
/// mantissa bits (`mantissa`) are zero, else NaN.
fn half_non_finite(data: &[u8], exponent: u16, mantissa: u16) -> Option<(usize, f32)> {
    data.chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .enumerate()
        .find(|(_, bits)| bits & exponent == exponent)
        .map(|(index, bits)| {
            let value = match (bits & mantissa == 0, bits & 0x8000 == 0) {
                (false, _) => f32::NAN,
                (true, true) => f32::INFINITY,
                (true, false) => f32::NEG_INFINITY,
            };
            (index, value)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn u16_bytes(values: &[u16]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn f32_vectors_report_their_first_nan_or_infinity() {
        let finite = f32_bytes(&[1.0, -0.0, f32::MAX, f32::MIN_POSITIVE, 1e-45]);
        assert_eq!(first_non_finite(GgmlType::F32, &finite), None);
        let found = first_non_finite(GgmlType::F32, &f32_bytes(&[1.0, 2.0, f32::NAN, 1.0]));
        assert!(matches!(found, Some((2, v)) if v.is_nan()), "{found:?}");
        let found = first_non_finite(GgmlType::F32, &f32_bytes(&[1.0, f32::NEG_INFINITY]));
        assert_eq!(found, Some((1, f32::NEG_INFINITY)));
    }

    #[test]
    fn f16_and_bf16_vectors_report_their_first_nan_or_infinity() {
        // f16: 1.0, 65504 (MAX), -0.0, then +inf, -inf, NaN.
        let finite = u16_bytes(&[0x3c00, 0x7bff, 0x8000]);
        assert_eq!(first_non_finite(GgmlType::F16, &finite), None);
        let infinity = u16_bytes(&[0x3c00, 0x7c00]);
        assert_eq!(
            first_non_finite(GgmlType::F16, &infinity),
            Some((1, f32::INFINITY))
        );
        let negative = u16_bytes(&[0xfc00]);
        assert_eq!(
            first_non_finite(GgmlType::F16, &negative),
            Some((0, f32::NEG_INFINITY))
        );
        let nan = first_non_finite(GgmlType::F16, &u16_bytes(&[0x3c00, 0x3c00, 0x7e00]));
        assert!(matches!(nan, Some((2, v)) if v.is_nan()), "{nan:?}");
        // bf16: 1.0 and the largest finite, then NaN.
        let bf16 = u16_bytes(&[0x3f80, 0x7f7f, 0x7fc0]);
        let nan = first_non_finite(GgmlType::BF16, &bf16);
        assert!(matches!(nan, Some((2, v)) if v.is_nan()), "{nan:?}");
        assert_eq!(
            first_non_finite(GgmlType::BF16, &u16_bytes(&[0xff80])),
            Some((0, f32::NEG_INFINITY))
        );
    }

    #[test]
    fn quantized_vectors_are_not_scanned() {
        assert_eq!(first_non_finite(GgmlType::Q8_0, &[0xff; 34]), None);
    }
}
