//! Quantizing an f32 activation row to Q8_0 / Q8_1 blocks, as the matmul kernels consume it.
//!
//! Bit-exact with llama.cpp's `quantize_row_q8_0_ref` / `quantize_row_q8_1_ref` (b11434): the
//! quants are computed with the unrounded f32 scale `d = amax / 127` (its reciprocal, as ggml),
//! and only then is `d` stored as f16, so the stored scale and the quants may disagree by f16
//! rounding, exactly as in ggml.

use super::DotError;
use crate::kernels::{BlockMeta, meta_of};
use crate::team::Team;
use half::f16;

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

/// `a > b ? a : b`, ggml's `MAX` (and `maxps`'s rule: the second operand when either is NaN).
#[inline(always)]
fn max_of(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// The largest magnitude of a block: eight lanes over the four runs of eight elements, then
/// halved three times, which vectorizes (the SIMD loops of [`simd`] inline it, eight blocks at
/// a time). For finite input this is ggml's sequential maximum, as a maximum
/// of finite values does not depend on the order.
#[inline(always)]
fn amax(x: &[f32; QK8]) -> f32 {
    let mut lanes = [0.0f32; 8];
    for run in x.chunks_exact(8) {
        for (lane, v) in lanes.iter_mut().zip(run) {
            *lane = max_of(*lane, v.abs());
        }
    }
    let fours: [f32; 4] = std::array::from_fn(|i| max_of(lanes[i], lanes[i + 4]));
    max_of(max_of(fours[0], fours[2]), max_of(fours[1], fours[3]))
}

/// The f32 scale `amax / 127` of a block and the reciprocal the quants are computed with.
#[inline(always)]
fn scale_of(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (d, id)
}

/// The f32 scale of a block and the reciprocal the quants are computed with.
#[inline(always)]
fn scale(x: &[f32; QK8]) -> (f32, f32) {
    scale_of(amax(x))
}

/// `roundf(x * id)` stored as i8. Finite inputs give `-127..=127`; larger values saturate and
/// NaN maps to 0, where C's conversion would be undefined, so hostile activations cannot
/// panic. Written without `round` and the saturating cast, which do not vectorize: `v − trunc(v)`
/// is exact, so a half or more rounds away from zero exactly as `roundf` does.
#[inline(always)]
fn quant(x: f32, id: f32) -> i8 {
    let v = x * id;
    let t = v.trunc();
    let rounded = if (v - t).abs() >= 0.5 {
        t + 1.0f32.copysign(v)
    } else {
        t
    };
    let clamped = if rounded.is_nan() {
        0.0
    } else {
        rounded.clamp(-128.0, 127.0)
    };
    // SAFETY: `clamped` is finite and within i32 (an integer in -128..=127), which is all
    // `to_int_unchecked` asks; unlike `as`, it vectorizes.
    unsafe { clamped.to_int_unchecked::<i32>() as i8 }
}

/// Checks `x` is a whole number of blocks.
fn whole_blocks(x: &[f32]) -> Result<(), DotError> {
    if x.len().is_multiple_of(QK8) {
        Ok(())
    } else {
        Err(DotError::PartialBlock { elements: x.len() })
    }
}

/// Quantizes `x` (a whole number of 32-element blocks) into `out`, replacing its contents.
///
/// Errors, leaving `out` untouched, when `x.len()` is not a multiple of 32.
pub fn quantize_q8_0(x: &[f32], out: &mut Vec<BlockQ8_0>) -> Result<(), DotError> {
    quantize_q8_0_on(None, x, out, &mut Vec::new())
}

/// [`quantize_q8_0`], long inputs split over `team`, each block's [`BlockMeta`] into `meta`
/// (what `kernels::block_meta` gives, computed in the same pass).
pub(crate) fn quantize_q8_0_on(
    team: Option<&Team>,
    x: &[f32],
    out: &mut Vec<BlockQ8_0>,
    meta: &mut Vec<BlockMeta>,
) -> Result<(), DotError> {
    whole_blocks(x)?;
    fill(
        team,
        x,
        (out, meta),
        (ZERO_Q8_0, ZERO_META),
        QK8,
        simd::q8_0,
    );
    Ok(())
}

/// Quantizes `x` (a whole number of 32-element blocks) into `out` as Q8_1, replacing its
/// contents.
///
/// Errors, leaving `out` untouched, when `x.len()` is not a multiple of 32.
pub fn quantize_q8_1(x: &[f32], out: &mut Vec<BlockQ8_1>) -> Result<(), DotError> {
    quantize_q8_1_on(None, x, out, &mut Vec::new())
}

/// [`quantize_q8_1`], long inputs split over `team`, with each block's [`BlockMeta`] as
/// [`quantize_q8_0_on`].
pub(crate) fn quantize_q8_1_on(
    team: Option<&Team>,
    x: &[f32],
    out: &mut Vec<BlockQ8_1>,
    meta: &mut Vec<BlockMeta>,
) -> Result<(), DotError> {
    whole_blocks(x)?;
    fill(
        team,
        x,
        (out, meta),
        (ZERO_Q8_1, ZERO_META),
        QK8,
        simd::q8_1,
    );
    Ok(())
}

/// `quant(v, id)` of every element, in a plain loop (`array::map` is not always inlined, and
/// these loops must vectorize).
#[inline(always)]
fn quants(x: &[f32; QK8], id: f32) -> [i8; QK8] {
    let mut qs = [0; QK8];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = quant(v, id);
    }
    qs
}

/// One Q8_0 block, as `quantize_row_q8_0_ref`.
#[inline(always)]
fn block_q8_0(x: &[f32; QK8]) -> BlockQ8_0 {
    let (d, id) = scale(x);
    BlockQ8_0 {
        d: f16::from_f32(d),
        qs: quants(x, id),
    }
}

/// One Q8_1 block, as `quantize_row_q8_1_ref`.
#[inline(always)]
fn block_q8_1(x: &[f32; QK8]) -> BlockQ8_1 {
    let (d, id) = scale(x);
    let qs = quants(x, id);
    // At most 32 * 127 in magnitude: exact in i32 and in f32.
    let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
    BlockQ8_1 {
        d: f16::from_f32(d),
        s: f16::from_f32(sum as f32 * d),
        qs,
    }
}

// The blocks (and metadata) `fill` sizes its outputs with before overwriting every one.
const ZERO_Q8_0: BlockQ8_0 = BlockQ8_0 {
    d: f16::ZERO,
    qs: [0; QK8],
};
const ZERO_Q8_1: BlockQ8_1 = BlockQ8_1 {
    d: f16::ZERO,
    s: f16::ZERO,
    qs: [0; QK8],
};
const ZERO_Q8_K: BlockQ8K = BlockQ8K {
    d: 0.0,
    qs: [0; QK_K],
    bsums: [0; QK_K / 16],
};
const ZERO_META: BlockMeta = BlockMeta {
    d: 0.0,
    s: 0.0,
    sum: 0,
};

/// Elements per task when a long input (a prefill batch) is quantized in parallel; inputs
/// shorter than two tasks (a decode step's rows) stay on the calling thread, where they cost
/// less than handing half to another core (split from 2,048 elements, a four-sequence SmolLM2
/// step took 2.5 % longer). Each block is quantized on its own, so the split cannot change a
/// bit.
const PARALLEL_ELEMENTS: usize = 8192;

/// Replaces `out.0` with the blocks of `x` (a whole number of `block`-element blocks, checked
/// by the caller) and `out.1` with what the quantizer gives beside each block (its
/// [`BlockMeta`]; nothing for Q8_K), computed by `blocks`, split over `team` for long inputs.
/// `blocks` writes every element, so the buffers are resized but not cleared: clearing them
/// zeroed each one again, a memset per matrix call on a decode step's serial path.
fn fill<B: Copy + Send + Sync, M: Copy + Send + Sync>(
    team: Option<&Team>,
    x: &[f32],
    (out, side): (&mut Vec<B>, &mut Vec<M>),
    (zero, side_zero): (B, M),
    block: usize,
    blocks: fn(&[f32], &mut [B], &mut [M]),
) {
    out.resize(x.len() / block, zero);
    side.resize(x.len() / block, side_zero);
    match team {
        Some(team) if x.len() >= 2 * PARALLEL_ELEMENTS => {
            let per_task = PARALLEL_ELEMENTS.next_multiple_of(block);
            let mut tasks: Vec<_> = out
                .chunks_mut(per_task / block)
                .zip(side.chunks_mut(per_task / block))
                .zip(x.chunks(per_task))
                .collect();
            team.for_each(&mut tasks, |((out, side), x)| blocks(x, out, side));
        }
        _ => blocks(x, out, side),
    }
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
#[inline(always)]
fn nearest_q8_k(x: f32) -> i8 {
    (x.round_ties_even() as i32).clamp(-128, 127) as i8
}

/// Quantizes `x` (a whole number of 256-element super-blocks) into `out` as Q8_K, replacing
/// its contents; bit-exact with ggml's `quantize_row_q8_K_ref` (b11434) for finite input.
///
/// Errors, leaving `out` untouched, when `x.len()` is not a multiple of 256.
pub fn quantize_q8_k(x: &[f32], out: &mut Vec<BlockQ8K>) -> Result<(), DotError> {
    quantize_q8_k_on(None, x, out)
}

/// [`quantize_q8_k`], long inputs split over `team`.
pub(crate) fn quantize_q8_k_on(
    team: Option<&Team>,
    x: &[f32],
    out: &mut Vec<BlockQ8K>,
) -> Result<(), DotError> {
    if !x.len().is_multiple_of(QK_K) {
        return Err(DotError::PartialSuperBlock { elements: x.len() });
    }
    let nothing: &mut Vec<()> = &mut Vec::new();
    fill(team, x, (out, nothing), (ZERO_Q8_K, ()), QK_K, simd::q8_k);
    Ok(())
}

/// One Q8_K super-block, as `quantize_row_q8_K_ref`.
#[inline(always)]
fn block_q8_k(x: &[f32; QK_K]) -> BlockQ8K {
    // The first element of largest magnitude, with its sign (ggml's strict `>`; NaNs never
    // compare greater, so they are skipped as in C).
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        return ZERO_Q8_K;
    }
    let iscale = -127.0 / max;
    let mut qs = [0; QK_K];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = nearest_q8_k(iscale * v);
    }
    // 16 quants of at most 128 in magnitude: fits i16 exactly.
    let bsums =
        std::array::from_fn(|k| qs[16 * k..16 * k + 16].iter().map(|&q| i16::from(q)).sum());
    BlockQ8K {
        d: 1.0 / iscale,
        qs,
        bsums,
    }
}

mod simd;

#[cfg(test)]
mod tests;
