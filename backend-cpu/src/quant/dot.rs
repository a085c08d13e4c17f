//! Dot products of one quantized weight row with one quantized activation row, the ggml way.
//!
//! # Summation order
//!
//! For every block `i = 0, 1, …, n-1`, in that order:
//!
//! 1. an exact i32 sum `isum_i` of the 32 integer products (at most `32 * 128 * 128 = 2^19`
//!    in magnitude, so no overflow, and exactly representable in f32);
//! 2. `sum = sum + (d_w * d_a) * isum_i` in f32, starting from `sum = 0.0`. Q4_1 adds its
//!    offset term inside the same step: `sum = sum + ((d_w * d_a) * isum_i + m_w * s_a)`.
//!
//! `d_w * d_a` and `m_w * s_a` are products of two f16 values, hence exact in f32, so each
//! block term is rounded once, and the result depends only on the row's data, never on how
//! rows are spread over threads or which kernel ([`scalar`] or AVX2) ran. Separate multiply
//! and add (no FMA) are used on purpose: Rust never contracts `a * b + c` on its own, and the
//! AVX2 kernels keep the same scalar f32 steps, so they are bit-identical to the scalar ones.
//!
//! This is the order of ggml's `ggml_vec_dot_*_generic`, except for Q4_0, where ggml computes
//! `(isum * d_w) * d_a`, which may round differently in the last bit; we use the one formula
//! for all three formats.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(test)]
mod tests;

use super::activation::{BlockQ8_0, BlockQ8_1, QK8};
use super::f16_le;

/// Bytes per Q8_0 weight block: `d: f16`, `qs: [i8; 32]`.
pub const Q8_0_BYTES: usize = 34;
/// Bytes per Q4_0 weight block: `d: f16`, `qs: [u8; 16]`.
pub const Q4_0_BYTES: usize = 18;
/// Bytes per Q4_1 weight block: `d: f16`, `m: f16`, `qs: [u8; 16]`.
pub const Q4_1_BYTES: usize = 20;

/// Why a row could not be quantized or dotted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DotError {
    /// An activation row is not a whole number of 32-element blocks.
    #[error("{elements} activations is not a whole number of {QK8}-element blocks")]
    PartialBlock {
        /// Length of the activation row.
        elements: usize,
    },
    /// The weight row's bytes do not hold exactly one block per activation block.
    #[error(
        "weight row of {bytes} bytes does not match {blocks} activation blocks of {block_bytes} bytes"
    )]
    LengthMismatch {
        /// Length of the weight row.
        bytes: usize,
        /// Number of activation blocks.
        blocks: usize,
        /// Bytes per weight block.
        block_bytes: usize,
    },
}

/// Checks `w` is exactly `blocks` weight blocks of `B` bytes.
///
/// Checking here, before any kernel runs, is what lets the kernels assume whole blocks.
fn check_len<const B: usize>(w: &[u8], blocks: usize) -> Result<&[u8], DotError> {
    if blocks.checked_mul(B) == Some(w.len()) {
        Ok(w)
    } else {
        Err(DotError::LengthMismatch {
            bytes: w.len(),
            blocks,
            block_bytes: B,
        })
    }
}

/// The `B`-byte blocks of `w` as arrays, so offsets inside a block are checked at compile
/// time. `chunks_exact` yields only full chunks, so no block is ever dropped.
fn weight_blocks<const B: usize>(w: &[u8]) -> impl Iterator<Item = &[u8; B]> {
    w.chunks_exact(B).filter_map(|b| b.try_into().ok())
}

/// Dot product of a Q8_0 weight row (`w`, raw little-endian blocks from the model file) with
/// Q8_0 activations, using AVX2 when the CPU has it; bit-identical either way.
///
/// Errors when `w` is not exactly one 34-byte block per activation block; never panics.
pub fn dot_q8_0_q8_0(w: &[u8], a: &[BlockQ8_0]) -> Result<f32, DotError> {
    let w = check_len::<Q8_0_BYTES>(w, a.len())?;
    #[cfg(target_arch = "x86_64")]
    if let Some(sum) = avx2::q8_0_q8_0(w, a) {
        return Ok(sum);
    }
    Ok(scalar::q8_0_q8_0(w, a))
}

/// Dot product of a Q4_0 weight row with Q8_0 activations; see [`dot_q8_0_q8_0`].
pub fn dot_q4_0_q8_0(w: &[u8], a: &[BlockQ8_0]) -> Result<f32, DotError> {
    let w = check_len::<Q4_0_BYTES>(w, a.len())?;
    #[cfg(target_arch = "x86_64")]
    if let Some(sum) = avx2::q4_0_q8_0(w, a) {
        return Ok(sum);
    }
    Ok(scalar::q4_0_q8_0(w, a))
}

/// Dot product of a Q4_1 weight row with Q8_1 activations; see [`dot_q8_0_q8_0`].
pub fn dot_q4_1_q8_1(w: &[u8], a: &[BlockQ8_1]) -> Result<f32, DotError> {
    let w = check_len::<Q4_1_BYTES>(w, a.len())?;
    #[cfg(target_arch = "x86_64")]
    if let Some(sum) = avx2::q4_1_q8_1(w, a) {
        return Ok(sum);
    }
    Ok(scalar::q4_1_q8_1(w, a))
}

/// The scalar reference kernels: the oracle the SIMD kernels must match bit for bit.
///
/// Public so benchmarks and tests can force the scalar path; lengths are checked as by the
/// dispatching functions.
pub mod scalar {
    use super::*;

    /// [`dot_q8_0_q8_0`](super::dot_q8_0_q8_0) without SIMD.
    pub fn dot_q8_0_q8_0(w: &[u8], a: &[BlockQ8_0]) -> Result<f32, DotError> {
        Ok(q8_0_q8_0(check_len::<Q8_0_BYTES>(w, a.len())?, a))
    }

    /// [`dot_q4_0_q8_0`](super::dot_q4_0_q8_0) without SIMD.
    pub fn dot_q4_0_q8_0(w: &[u8], a: &[BlockQ8_0]) -> Result<f32, DotError> {
        Ok(q4_0_q8_0(check_len::<Q4_0_BYTES>(w, a.len())?, a))
    }

    /// [`dot_q4_1_q8_1`](super::dot_q4_1_q8_1) without SIMD.
    pub fn dot_q4_1_q8_1(w: &[u8], a: &[BlockQ8_1]) -> Result<f32, DotError> {
        Ok(q4_1_q8_1(check_len::<Q4_1_BYTES>(w, a.len())?, a))
    }

    /// Low nibble of byte `j` is element `j`, high nibble element `j + 16` (ggml's layout).
    fn nibble_dot(qs: &[u8], y: &[i8; QK8], offset: i32) -> i32 {
        let (y_lo, y_hi) = y.split_at(QK8 / 2);
        qs.iter()
            .zip(y_lo.iter().zip(y_hi))
            .map(|(&q, (&y0, &y1))| {
                (i32::from(q & 0x0F) - offset) * i32::from(y0)
                    + (i32::from(q >> 4) - offset) * i32::from(y1)
            })
            .sum()
    }

    pub(super) fn q8_0_q8_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
        let mut sum = 0.0f32;
        for (w, a) in weight_blocks::<Q8_0_BYTES>(w).zip(a) {
            let isum: i32 = w[2..]
                .iter()
                .zip(&a.qs)
                .map(|(&q, &y)| i32::from(q as i8) * i32::from(y))
                .sum();
            sum += (f16_le([w[0], w[1]]) * a.d.to_f32()) * isum as f32;
        }
        sum
    }

    pub(super) fn q4_0_q8_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
        let mut sum = 0.0f32;
        for (w, a) in weight_blocks::<Q4_0_BYTES>(w).zip(a) {
            let isum = nibble_dot(&w[2..], &a.qs, 8);
            sum += (f16_le([w[0], w[1]]) * a.d.to_f32()) * isum as f32;
        }
        sum
    }

    pub(super) fn q4_1_q8_1(w: &[u8], a: &[BlockQ8_1]) -> f32 {
        let mut sum = 0.0f32;
        for (w, a) in weight_blocks::<Q4_1_BYTES>(w).zip(a) {
            let isum = nibble_dot(&w[4..], &a.qs, 0);
            let (d, m) = (f16_le([w[0], w[1]]), f16_le([w[2], w[3]]));
            sum += (d * a.d.to_f32()) * isum as f32 + m * a.s.to_f32();
        }
        sum
    }
}
