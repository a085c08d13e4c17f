//! Scalar reference dequantizers for ggml's block formats.
//!
//! Each element is computed with the same f32 operations, in the same order, as llama.cpp's
//! reference `dequantize_row_*` in `ggml-quants.c` (b11434), so the results are bit-identical
//! to ggml's. These are the oracle the optimised kernels are tested against, so clarity wins
//! over speed here. Block layouts are those of `ggml-common.h`; all fields are little-endian.
//!
//! For these formats the order matters less than it seems: scales are f16 (11 significant
//! bits) and quants and sub-block scales at most 8 bits, so every product but Q6_K's last is
//! exact in f32, and each element is rounded once at most (a fused multiply-add would give the
//! same bits). Faster kernels may reorder the products freely, but must not, say, precompute
//! `1/d` or fold `m` into a different sum.

pub mod activation;
mod float;
mod i_quants;
mod iq3_xxs;
pub use i_quants::{IQ3_S_BYTES, IQ4_NL_BYTES, IQ4_XS_BYTES};
pub(crate) use i_quants::{
    IQ3S_GRID, KVALUES_IQ4NL, iq3_s_index, iq3_s_scales, iq3_s_value, iq4_value, iq4_xs_scales,
    iq4_xs_value,
};
pub use iq3_xxs::IQ3_XXS_BYTES;
pub(crate) use iq3_xxs::{iq3_xxs_entry, iq3_xxs_scales, iq3_xxs_signs, iq3_xxs_value};
mod k_quants;
pub use k_quants::Q2_K_BYTES;
#[cfg(test)]
pub(crate) use k_quants::scale_min;
pub(crate) use k_quants::{q2_k_quant, q3_k_quant, q3_k_scales};
mod legacy;

use worker_common::gguf::GgmlType;

use activation::{QK_K, QK8};

/// Why a row could not be quantized or dotted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DotError {
    /// An activation row is not a whole number of 32-element blocks.
    #[error("{elements} activations is not a whole number of {QK8}-element blocks")]
    PartialBlock {
        /// Length of the activation row.
        elements: usize,
    },
    /// An activation row is not a whole number of 256-element super-blocks (Q8_K).
    #[error("{elements} activations is not a whole number of {QK_K}-element super-blocks")]
    PartialSuperBlock {
        /// Length of the activation row.
        elements: usize,
    },
    /// The weight row's bytes do not hold exactly one block per activation block (for float
    /// rows: one element per activation).
    #[error(
        "weight row of {bytes} bytes does not match {blocks} activation blocks of {block_bytes} bytes"
    )]
    LengthMismatch {
        /// Length of the weight row.
        bytes: usize,
        /// Number of activation blocks (or activations, for float rows).
        blocks: usize,
        /// Bytes per weight block (or element).
        block_bytes: usize,
    },
    /// The weight rows, activation rows and outputs of a matrix call do not fit together.
    #[error(
        "{bytes} weight bytes, {blocks} activation blocks in {cols} columns and {outputs} outputs do not match"
    )]
    RowsMismatch {
        /// Length of the weight rows.
        bytes: usize,
        /// Activation blocks given (all columns).
        blocks: usize,
        /// Activation rows (tokens).
        cols: usize,
        /// Outputs requested.
        outputs: usize,
    },
}

/// Why a buffer could not be dequantized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// The type has no dequantizer here.
    #[error("dequantizing {0} is not supported")]
    Unsupported(GgmlType),
    /// The data is not a whole number of blocks.
    #[error("{ggml_type}: {bytes} bytes is not a whole number of {block_bytes}-byte blocks")]
    PartialBlock {
        /// The type being dequantized.
        ggml_type: GgmlType,
        /// Length of the data.
        bytes: usize,
        /// Bytes per block of the type.
        block_bytes: usize,
    },
    /// The output does not hold exactly the elements the data encodes.
    #[error("{ggml_type}: the data holds {expected} elements but the output has room for {actual}")]
    OutputLength {
        /// The type being dequantized.
        ggml_type: GgmlType,
        /// Elements encoded by the data.
        expected: usize,
        /// Length of the output.
        actual: usize,
    },
}

/// Whether [`dequantize`] handles `ggml_type`.
pub fn is_supported(ggml_type: GgmlType) -> bool {
    matches!(
        ggml_type,
        GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::IQ4_NL
            | GgmlType::IQ4_XS
            | GgmlType::IQ3_S
            | GgmlType::IQ3_XXS
    )
}

/// Elements encoded by `bytes` bytes of `ggml_type`, checking the data is whole blocks.
pub fn element_count(ggml_type: GgmlType, bytes: usize) -> Result<usize, QuantError> {
    // The table's sizes are small constants (at most a few hundred), so they fit any usize.
    let block_bytes = usize::try_from(ggml_type.block_bytes()).unwrap_or(usize::MAX);
    let block_size = usize::try_from(ggml_type.block_size()).unwrap_or(usize::MAX);
    let partial = QuantError::PartialBlock {
        ggml_type,
        bytes,
        block_bytes,
    };
    if block_bytes == 0 || !bytes.is_multiple_of(block_bytes) {
        return Err(partial);
    }
    // Cannot overflow for the supported types (each stores at least 1 bit per element), but an
    // overflow must be an error, not a wrap, for any type the table may gain.
    (bytes / block_bytes).checked_mul(block_size).ok_or(partial)
}

/// Dequantizes `data`, a whole number of blocks of `ggml_type`, into `out`, which must hold
/// exactly the elements the data encodes. Elements come out in storage order.
///
/// Errors, without writing to `out`, on an unsupported type, a partial block or a wrong output
/// length; never panics.
pub fn dequantize(ggml_type: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    if !is_supported(ggml_type) {
        return Err(QuantError::Unsupported(ggml_type));
    }
    let expected = element_count(ggml_type, data.len())?;
    if out.len() != expected {
        return Err(QuantError::OutputLength {
            ggml_type,
            expected,
            actual: out.len(),
        });
    }
    match ggml_type {
        GgmlType::F32 => float::f32(data, out),
        GgmlType::F16 => float::f16(data, out),
        GgmlType::BF16 => float::bf16(data, out),
        GgmlType::Q4_0 => legacy::q4_0(data, out),
        GgmlType::Q4_1 => legacy::q4_1(data, out),
        GgmlType::Q5_0 => legacy::q5_0(data, out),
        GgmlType::Q5_1 => legacy::q5_1(data, out),
        GgmlType::Q8_0 => legacy::q8_0(data, out),
        GgmlType::Q2_K => k_quants::q2_k(data, out),
        GgmlType::Q3_K => k_quants::q3_k(data, out),
        GgmlType::Q4_K => k_quants::q4_k(data, out),
        GgmlType::Q5_K => k_quants::q5_k(data, out),
        GgmlType::Q6_K => k_quants::q6_k(data, out),
        GgmlType::IQ4_NL => i_quants::iq4_nl(data, out),
        GgmlType::IQ4_XS => i_quants::iq4_xs(data, out),
        GgmlType::IQ3_S => i_quants::iq3_s(data, out),
        GgmlType::IQ3_XXS => iq3_xxs::iq3_xxs(data, out),
        other => return Err(QuantError::Unsupported(other)),
    }
    Ok(())
}

/// Pairs each `B`-byte block of `data` with its `N` output elements.
///
/// The caller has checked the lengths agree; fixed-size arrays let every index inside a block
/// be checked at compile time, and `chunks_exact` never yields a short chunk, so the
/// conversions cannot fail (were one to, that block would be skipped rather than panic; the
/// unit tests check every output element is written).
fn blocks<'a, const B: usize, const N: usize>(
    data: &'a [u8],
    out: &'a mut [f32],
) -> impl Iterator<Item = (&'a [u8; B], &'a mut [f32; N])> {
    data.chunks_exact(B)
        .zip(out.chunks_exact_mut(N))
        .filter_map(|(block, y)| Some((block.try_into().ok()?, y.try_into().ok()?)))
}

/// The f16 at `bytes`, widened exactly to f32 (as `GGML_FP16_TO_FP32`).
pub(crate) fn f16_le(bytes: [u8; 2]) -> f32 {
    half::f16::from_le_bytes(bytes).to_f32()
}

#[cfg(test)]
pub(crate) mod test_rng;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_iq3_xxs;
#[cfg(test)]
mod tests_q2_k;
