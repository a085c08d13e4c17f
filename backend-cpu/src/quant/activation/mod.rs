//! Quantizing an f32 activation row to Q8_0 / Q8_1 blocks, as the matmul kernels consume it.
//!
//! Bit-exact with llama.cpp's `quantize_row_q8_0_ref` / `quantize_row_q8_1_ref` (b11434): the
//! quants are computed with the unrounded f32 scale `d = amax / 127` (its reciprocal, as ggml),
//! and only then is `d` stored as f16, so the stored scale and the quants may disagree by f16
//! rounding, exactly as in ggml.

use super::DotError;
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
    quantize_q8_0_on(None, x, out)
}

/// [`quantize_q8_0`], long inputs split over `team`.
pub(crate) fn quantize_q8_0_on(
    team: Option<&Team>,
    x: &[f32],
    out: &mut Vec<BlockQ8_0>,
) -> Result<(), DotError> {
    whole_blocks(x)?;
    fill(team, x, out, ZERO_Q8_0, QK8, simd::q8_0);
    Ok(())
}

/// Quantizes `x` (a whole number of 32-element blocks) into `out` as Q8_1, replacing its
/// contents.
///
/// Errors, leaving `out` untouched, when `x.len()` is not a multiple of 32.
pub fn quantize_q8_1(x: &[f32], out: &mut Vec<BlockQ8_1>) -> Result<(), DotError> {
    quantize_q8_1_on(None, x, out)
}

/// [`quantize_q8_1`], long inputs split over `team`.
pub(crate) fn quantize_q8_1_on(
    team: Option<&Team>,
    x: &[f32],
    out: &mut Vec<BlockQ8_1>,
) -> Result<(), DotError> {
    whole_blocks(x)?;
    fill(team, x, out, ZERO_Q8_1, QK8, simd::q8_1);
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

// The blocks `fill` sizes its output with before overwriting every one.
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

/// Elements per task when a long input (a prefill batch) is quantized in parallel; inputs
/// shorter than two tasks (a decode step's rows) stay on the calling thread, where they cost
/// less than handing half to another core (split from 2,048 elements, a four-sequence SmolLM2
/// step took 2.5 % longer). Each block is quantized on its own, so the split cannot change a
/// bit.
const PARALLEL_ELEMENTS: usize = 8192;

/// Replaces `out` with the blocks of `x` (a whole number of `block`-element blocks, checked by
/// the caller), computed by `blocks`, split over `team` for long inputs.
fn fill<B: Copy + Send + Sync>(
    team: Option<&Team>,
    x: &[f32],
    out: &mut Vec<B>,
    zero: B,
    block: usize,
    blocks: fn(&[f32], &mut [B]),
) {
    out.clear();
    out.resize(x.len() / block, zero);
    match team {
        Some(team) if x.len() >= 2 * PARALLEL_ELEMENTS => {
            let per_task = PARALLEL_ELEMENTS.next_multiple_of(block);
            let mut tasks: Vec<_> = out
                .chunks_mut(per_task / block)
                .zip(x.chunks(per_task))
                .collect();
            team.for_each(&mut tasks, |(out, x)| blocks(x, out));
        }
        _ => blocks(x, out),
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
    fill(team, x, out, ZERO_Q8_K, QK_K, simd::q8_k);
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

/// The block loops, compiled for AVX-512 or AVX2 where the CPU has it (the rounding and
/// conversions then vectorize) and as plain code otherwise: the same IEEE operations on every
/// element either way, so the same bits (Rust never fuses a multiply and an add on its own).
mod simd {
    use super::{
        BlockQ8_0, BlockQ8_1, BlockQ8K, QK_K, QK8, amax, block_q8_0, block_q8_1, block_q8_k,
        scale_of,
    };

    /// The most the loops may use (0 plain, 1 AVX2, 2 AVX-512); tests lower it to compare.
    #[cfg(test)]
    pub(super) static LEVEL: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(2);

    /// The level the CPU has, capped by [`LEVEL`] in tests.
    #[cfg(target_arch = "x86_64")]
    fn level() -> u8 {
        let level = match (crate::isa::avx512(), crate::isa::avx2()) {
            (true, _) => 2,
            (false, true) => 1,
            _ => 0,
        };
        #[cfg(test)]
        let level = level.min(LEVEL.load(std::sync::atomic::Ordering::Relaxed));
        level
    }

    /// Block `i` of `out` from elements `N·i..` of `x`, by `block`; inlined into each loop, so
    /// it runs with that loop's features.
    #[inline(always)]
    fn each_block<T, const N: usize>(x: &[f32], out: &mut [T], block: impl Fn(&[f32; N]) -> T) {
        for (x, o) in x.chunks_exact(N).zip(out.iter_mut()) {
            if let Ok(x) = <&[f32; N]>::try_from(x) {
                *o = block(x);
            }
        }
    }

    /// [`each_block`] for blocks that need no scale first (Q8_K's).
    #[inline(always)]
    fn each_unscaled<T, const N: usize>(
        x: &[f32],
        out: &mut [T],
        block: impl Fn(&[f32; N], ()) -> T,
    ) {
        each_block(x, out, |x| block(x, ()));
    }

    /// Blocks that to be quantized need their scale (`scale_of(amax)`): the scales of eight
    /// blocks first, then their quants. A block's quants wait on its maximum and two divisions;
    /// computed block after block, that chain filled the scheduler and the blocks hardly
    /// overlapped (a Q8_1 block took about 60 cycles); apart, the quantizations of the eight
    /// run independently. Each block's operations are unchanged, so are its bits.
    #[inline(always)]
    fn each_scaled<T>(x: &[f32], out: &mut [T], block: impl Fn(&[f32; QK8], (f32, f32)) -> T) {
        const AHEAD: usize = 8;
        for (x, out) in x.chunks(AHEAD * QK8).zip(out.chunks_mut(AHEAD)) {
            let mut scales = [(0.0, 0.0); AHEAD];
            for (scale, x) in scales.iter_mut().zip(x.chunks_exact(QK8)) {
                if let Ok(x) = <&[f32; QK8]>::try_from(x) {
                    *scale = scale_of(amax(x));
                }
            }
            for ((x, o), &scale) in x.chunks_exact(QK8).zip(out.iter_mut()).zip(&scales) {
                if let Ok(x) = <&[f32; QK8]>::try_from(x) {
                    *o = block(x, scale);
                }
            }
        }
    }

    /// Defines `$name(x, out)`: `out`'s blocks from `x` (see [`each_block`]), by `$wide`
    /// in the AVX-512 loop, by `$fast` in the AVX2 loop and by `$block` otherwise.
    macro_rules! loops {
        ($name:ident, $each:ident, $block:ident, $fast:path, $wide:path, $ty:ty) => {
            pub(super) fn $name(x: &[f32], out: &mut [$ty]) {
                #[cfg(target_arch = "x86_64")]
                #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
                unsafe fn avx512_loop(x: &[f32], out: &mut [$ty]) {
                    // SAFETY: this function's features (which the closure inherits) are those
                    // `$wide` needs.
                    $each(x, out, |x, s| unsafe { $wide(x, s) });
                }
                #[cfg(target_arch = "x86_64")]
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn avx2_loop(x: &[f32], out: &mut [$ty]) {
                    // SAFETY: as above, for `$fast`.
                    $each(x, out, |x, s| unsafe { $fast(x, s) });
                }
                #[cfg(target_arch = "x86_64")]
                match level() {
                    // SAFETY (each arm): the features were detected on this CPU.
                    2 => return unsafe { avx512_loop(x, out) },
                    1 => return unsafe { avx2_loop(x, out) },
                    _ => {}
                }
                each_block(x, out, $block);
            }
        };
    }

    loops!(
        q8_0,
        each_scaled,
        block_q8_0,
        x86::block_q8_0::<false>,
        x86::block_q8_0::<true>,
        BlockQ8_0
    );
    loops!(
        q8_1,
        each_scaled,
        block_q8_1,
        x86::block_q8_1::<false>,
        x86::block_q8_1::<true>,
        BlockQ8_1
    );
    loops!(
        q8_k,
        each_unscaled,
        block_q8_k,
        plain_q8_k,
        plain_q8_k,
        BlockQ8K
    );

    /// Q8_K's block, which the compiler vectorizes well enough on its own.
    #[inline(always)]
    unsafe fn plain_q8_k(x: &[f32; QK_K], (): ()) -> BlockQ8K {
        block_q8_k(x)
    }

    /// The Q8_0 and Q8_1 blocks written with AVX2 or AVX-512 intrinsics (the compiler turns the
    /// plain code's i32 → i8 narrowing and quant sum into byte-by-byte moves): [`super::quant`]'s
    /// rounding lane by lane, for the scales `each_scaled` computed ahead, so the same bits.
    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use std::arch::x86_64::*;

        use half::f16;

        use super::super::{BlockQ8_0, BlockQ8_1, QK8};

        /// The block's quants and their sum for the reciprocal scale `id` (`scale_of`), with
        /// 256-bit vectors.
        #[inline(always)]
        unsafe fn quantize(x: &[f32; QK8], id: f32) -> ([i8; QK8], i32) {
            // SAFETY: the callers run with AVX2; `x` holds 32 floats.
            unsafe {
                let sign = _mm256_set1_ps(-0.0);
                let (id, half, unit) =
                    (_mm256_set1_ps(id), _mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
                let (low, high) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
                let mut q = [_mm256_setzero_si256(); 4];
                for (k, q) in q.iter_mut().enumerate() {
                    let v = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(8 * k)), id);
                    let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
                    let away = _mm256_cmp_ps::<_CMP_GE_OQ>(
                        _mm256_andnot_ps(sign, _mm256_sub_ps(v, t)),
                        half,
                    );
                    let step = _mm256_or_ps(unit, _mm256_and_ps(sign, v));
                    let rounded = _mm256_blendv_ps(t, _mm256_add_ps(t, step), away);
                    let finite =
                        _mm256_and_ps(rounded, _mm256_cmp_ps::<_CMP_ORD_Q>(rounded, rounded));
                    *q = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(finite, low), high));
                }
                let s =
                    _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
                let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
                let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
                let sum = _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<1>(s)));
                // The packs interleave 128-bit halves: dword `k` of `bytes` holds elements
                // 4·[0, 8, 16, 24, 4, 12, 20, 28][k]..; the permutation restores the order.
                let bytes = _mm256_packs_epi16(
                    _mm256_packs_epi32(q[0], q[1]),
                    _mm256_packs_epi32(q[2], q[3]),
                );
                let bytes =
                    _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                let mut qs = [0i8; QK8];
                _mm256_storeu_si256(qs.as_mut_ptr().cast(), bytes);
                (qs, sum)
            }
        }

        /// [`quantize`] with 512-bit vectors: the same operations on sixteen lanes at a time,
        /// masks for the selections and a saturating narrowing (exact: the values are already
        /// within -128..=127) for the packs.
        #[inline(always)]
        unsafe fn quantize512(x: &[f32; QK8], id: f32) -> ([i8; QK8], i32) {
            // SAFETY: the callers run with AVX-512F (and AVX2); `x` holds 32 floats.
            unsafe {
                // AVX-512F has the bitwise operations on integer vectors only (the float ones are
                // AVX512DQ): the casts are free.
                let sign = _mm512_set1_epi32(i32::MIN);
                let bits = _mm512_castps_si512;
                let (id, half, unit) =
                    (_mm512_set1_ps(id), _mm512_set1_ps(0.5), _mm512_set1_ps(1.0));
                let (low, high) = (_mm512_set1_ps(-128.0), _mm512_set1_ps(127.0));
                let mut q = [_mm512_setzero_si512(); 2];
                for (k, q) in q.iter_mut().enumerate() {
                    let v = _mm512_mul_ps(_mm512_loadu_ps(x.as_ptr().add(16 * k)), id);
                    let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
                    let distance = _mm512_andnot_si512(sign, bits(_mm512_sub_ps(v, t)));
                    let away =
                        _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_castsi512_ps(distance), half);
                    let step = _mm512_or_si512(bits(unit), _mm512_and_si512(sign, bits(v)));
                    let step = _mm512_castsi512_ps(step);
                    let rounded = _mm512_mask_add_ps(t, away, t, step);
                    let finite = _mm512_maskz_mov_ps(
                        _mm512_cmp_ps_mask::<_CMP_ORD_Q>(rounded, rounded),
                        rounded,
                    );
                    *q = _mm512_cvttps_epi32(_mm512_min_ps(_mm512_max_ps(finite, low), high));
                }
                let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));
                let mut qs = [0i8; QK8];
                _mm_storeu_si128(qs.as_mut_ptr().cast(), _mm512_cvtsepi32_epi8(q[0]));
                _mm_storeu_si128(qs.as_mut_ptr().add(16).cast(), _mm512_cvtsepi32_epi8(q[1]));
                (qs, sum)
            }
        }

        /// [`quantize`] or, `WIDE`, [`quantize512`].
        #[inline(always)]
        unsafe fn quantize_with<const WIDE: bool>(x: &[f32; QK8], id: f32) -> ([i8; QK8], i32) {
            // SAFETY (each arm): forwarded from the caller.
            if WIDE {
                unsafe { quantize512(x, id) }
            } else {
                unsafe { quantize(x, id) }
            }
        }

        /// [`super::super::block_q8_0`] with AVX2 or, `WIDE`, AVX-512.
        #[inline(always)]
        pub(super) unsafe fn block_q8_0<const WIDE: bool>(
            x: &[f32; QK8],
            (d, id): (f32, f32),
        ) -> BlockQ8_0 {
            // SAFETY: forwarded from the caller.
            let (qs, _) = unsafe { quantize_with::<WIDE>(x, id) };
            BlockQ8_0 {
                d: f16::from_f32(d),
                qs,
            }
        }

        /// [`super::super::block_q8_1`] with AVX2 or, `WIDE`, AVX-512.
        #[inline(always)]
        pub(super) unsafe fn block_q8_1<const WIDE: bool>(
            x: &[f32; QK8],
            (d, id): (f32, f32),
        ) -> BlockQ8_1 {
            // SAFETY: forwarded from the caller.
            let (qs, sum) = unsafe { quantize_with::<WIDE>(x, id) };
            BlockQ8_1 {
                d: f16::from_f32(d),
                s: f16::from_f32(sum as f32 * d),
                qs,
            }
        }
    }
}

#[cfg(test)]
mod tests;
