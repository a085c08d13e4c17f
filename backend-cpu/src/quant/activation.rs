//! Quantizing an f32 activation row to Q8_0 / Q8_1 blocks, as the matmul kernels consume it.
//!
//! Bit-exact with llama.cpp's `quantize_row_q8_0_ref` / `quantize_row_q8_1_ref` (b11434): the
//! quants are computed with the unrounded f32 scale `d = amax / 127` (its reciprocal, as ggml),
//! and only then is `d` stored as f16, so the stored scale and the quants may disagree by f16
//! rounding, exactly as in ggml.

use half::f16;

use super::dot::DotError;

/// Elements per Q8_0 / Q8_1 block.
pub const QK8: usize = 32;

/// One Q8_0 activation block: `x[j] ≈ d * qs[j]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8_0 {
    /// Scale, `amax / 127` rounded to f16.
    pub d: f16,
    /// Quants, in `-127..=127` when produced by [`quantize_q8_0`] (any i8 is accepted by the
    /// dot kernels).
    pub qs: [i8; QK8],
}

/// One Q8_1 activation block: a Q8_0 block plus `s = d * sum(qs)`, which lets the Q4_1 dot
/// apply the weight block's offset `m` with one multiplication.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8_1 {
    /// Scale, `amax / 127` rounded to f16.
    pub d: f16,
    /// `sum(qs) * d` with the unrounded f32 `d`, rounded to f16 (as ggml).
    pub s: f16,
    /// Quants, as in [`BlockQ8_0::qs`].
    pub qs: [i8; QK8],
}

/// The f32 scale of a block and the reciprocal the quants are computed with.
fn scale(x: &[f32; QK8]) -> (f32, f32) {
    // ggml's `MAX(amax, fabsf(v))` is `amax > v ? amax : v`; kept literally so a NaN input
    // propagates the same way (`f32::max` would drop it).
    let amax = x.iter().fold(
        0.0f32,
        |amax, v| if amax > v.abs() { amax } else { v.abs() },
    );
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (d, id)
}

/// `roundf(x * id)` stored as i8. Finite inputs give `-127..=127`; `as` saturates and maps NaN
/// to 0, where C's conversion would be undefined, so hostile activations cannot panic.
fn quant(x: f32, id: f32) -> i8 {
    (x * id).round() as i8
}

/// Splits `x` into whole blocks, or says why it cannot.
fn whole_blocks(x: &[f32]) -> Result<impl Iterator<Item = &[f32; QK8]>, DotError> {
    if x.len() % QK8 != 0 {
        return Err(DotError::PartialBlock { elements: x.len() });
    }
    // `chunks_exact` yields only full chunks, so every conversion succeeds.
    Ok(x.chunks_exact(QK8).filter_map(|b| b.try_into().ok()))
}

/// Quantizes `x` (a whole number of 32-element blocks) into `out`, replacing its contents.
///
/// Errors, leaving `out` untouched, when `x.len()` is not a multiple of 32.
pub fn quantize_q8_0(x: &[f32], out: &mut Vec<BlockQ8_0>) -> Result<(), DotError> {
    let blocks = whole_blocks(x)?;
    out.clear();
    out.extend(blocks.map(|x| {
        let (d, id) = scale(x);
        BlockQ8_0 {
            d: f16::from_f32(d),
            qs: x.map(|v| quant(v, id)),
        }
    }));
    Ok(())
}

/// Quantizes `x` (a whole number of 32-element blocks) into `out` as Q8_1, replacing its
/// contents.
///
/// Errors, leaving `out` untouched, when `x.len()` is not a multiple of 32.
pub fn quantize_q8_1(x: &[f32], out: &mut Vec<BlockQ8_1>) -> Result<(), DotError> {
    let blocks = whole_blocks(x)?;
    out.clear();
    out.extend(blocks.map(|x| {
        let (d, id) = scale(x);
        let qs = x.map(|v| quant(v, id));
        // At most 32 * 127 in magnitude: exact in i32 and in f32.
        let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
        BlockQ8_1 {
            d: f16::from_f32(d),
            s: f16::from_f32(sum as f32 * d),
            qs,
        }
    }));
    Ok(())
}
