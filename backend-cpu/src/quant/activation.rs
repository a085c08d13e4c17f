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
    if !x.len().is_multiple_of(QK8) {
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

/// Elements per Q8_K (and Q4_K, Q5_K, Q6_K) super-block (`QK_K`).
pub const QK_K: usize = 256;

/// One Q8_K activation super-block, as ggml's `block_q8_K`: `x[j] ≈ d * qs[j]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8K {
    /// Scale, `1 / (-127 / max)` in f32, where `max` is the signed element of largest
    /// magnitude (so `d` has the opposite sign of `max`); 0 for an all-zero block.
    pub d: f32,
    /// Quants, in `-127..=127` when produced by [`quantize_q8_k`] (any i8 is accepted by the
    /// dot kernels).
    pub qs: [i8; QK_K],
    /// `bsums[k] = Σ qs[16k..16k + 16]`; the Q4_K / Q5_K kernels use these for the min term,
    /// as ggml does, so they must agree with `qs` for a meaningful result (any values are
    /// safe: no overflow, no panic).
    pub bsums: [i16; QK_K / 16],
}

/// `nearest_int` of ggml for the finite values it is asked about: round half to even (ggml
/// adds `1.5 · 2^23`, which rounds the same way for `|x| < 2^22`), then `MIN(127, v)`. Clamped
/// to the i8 range and NaN mapped to 0 so that non-finite activations cannot panic (ggml's
/// result is undefined there).
fn nearest_q8_k(x: f32) -> i8 {
    (x.round_ties_even() as i32).clamp(-128, 127) as i8
}

/// Quantizes `x` (a whole number of 256-element super-blocks) into `out` as Q8_K, replacing
/// its contents; bit-exact with ggml's `quantize_row_q8_K_ref` (b11434) for finite input.
///
/// Errors, leaving `out` untouched, when `x.len()` is not a multiple of 256.
pub fn quantize_q8_k(x: &[f32], out: &mut Vec<BlockQ8K>) -> Result<(), DotError> {
    if !x.len().is_multiple_of(QK_K) {
        return Err(DotError::PartialSuperBlock { elements: x.len() });
    }
    out.clear();
    out.extend(
        x.chunks_exact(QK_K)
            .filter_map(|b| <&[f32; QK_K]>::try_from(b).ok())
            .map(|x| {
                // The first element of largest magnitude, with its sign (ggml's strict `>`;
                // NaNs never compare greater, so they are skipped as in C).
                let (mut amax, mut max) = (0.0f32, 0.0f32);
                for &v in x {
                    if v.abs() > amax {
                        amax = v.abs();
                        max = v;
                    }
                }
                if amax == 0.0 {
                    return BlockQ8K {
                        d: 0.0,
                        qs: [0; QK_K],
                        bsums: [0; QK_K / 16],
                    };
                }
                let iscale = -127.0 / max;
                let qs = x.map(|v| nearest_q8_k(iscale * v));
                // 16 quants of at most 128 in magnitude: fits i16 exactly.
                let bsums = std::array::from_fn(|k| {
                    qs[16 * k..16 * k + 16].iter().map(|&q| i16::from(q)).sum()
                });
                BlockQ8K {
                    d: 1.0 / iscale,
                    qs,
                    bsums,
                }
            }),
    );
    Ok(())
}
