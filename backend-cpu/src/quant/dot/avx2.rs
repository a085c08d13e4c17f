//! AVX2 kernels: SIMD for each block's 32-element integer dot, scalar f32 for the
//! accumulation, so the result is bit-identical to [`super::scalar`] (same exact integer sums,
//! same f32 operations in the same order; see the parent module for the order).
//!
//! The integer products are widened to i16 and summed pairwise to i32 (`vpmaddwd`) rather
//! than using ggml's `vpmaddubsw` sign trick: that trick saturates at i16 and mis-handles a
//! quant of −128 on both sides, which a weight from a model file (or a hand-built activation
//! block) may hold; widening is exact for every i8 pair.
//!
//! Intrinsic calls sit in `unsafe` blocks because with the MSRV (1.85) they are unsafe to call;
//! newer compilers treat the register-only ones as safe inside `#[target_feature]` functions
//! and would call those blocks unused, hence the `allow`.
#![allow(unused_unsafe)]

use std::arch::x86_64::{
    __m128i, _mm_add_epi32, _mm_and_si128, _mm_cvtsi128_si32, _mm_loadu_si128, _mm_set1_epi8,
    _mm_shuffle_epi32, _mm_srli_epi16, _mm_sub_epi8, _mm256_add_epi32, _mm256_castsi256_si128,
    _mm256_cvtepi8_epi16, _mm256_extracti128_si256, _mm256_madd_epi16,
};
use std::sync::OnceLock;

use super::{BlockQ8_0, BlockQ8_1, Q4_0_BYTES, Q4_1_BYTES, Q8_0_BYTES, f16_le, weight_blocks};

/// Whether this CPU runs the AVX2 kernels; detected once, as the answer cannot change.
fn available() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
}

/// [`super::scalar`]'s Q8_0 × Q8_0 kernel, or `None` without AVX2.
pub(super) fn q8_0_q8_0(w: &[u8], a: &[BlockQ8_0]) -> Option<f32> {
    // SAFETY: AVX2 and FMA were detected on this CPU just now.
    available().then(|| unsafe { q8_0_q8_0_avx2(w, a) })
}

/// [`super::scalar`]'s Q4_0 × Q8_0 kernel, or `None` without AVX2.
pub(super) fn q4_0_q8_0(w: &[u8], a: &[BlockQ8_0]) -> Option<f32> {
    // SAFETY: AVX2 and FMA were detected on this CPU just now.
    available().then(|| unsafe { q4_0_q8_0_avx2(w, a) })
}

/// [`super::scalar`]'s Q4_1 × Q8_1 kernel, or `None` without AVX2.
pub(super) fn q4_1_q8_1(w: &[u8], a: &[BlockQ8_1]) -> Option<f32> {
    // SAFETY: AVX2 and FMA were detected on this CPU just now.
    available().then(|| unsafe { q4_1_q8_1_avx2(w, a) })
}

/// The 16 bytes of `b` starting at `OFF`, as a vector.
///
/// Needs only SSE2, which every x86_64 CPU has.
#[inline(always)]
fn load16<T, const N: usize, const OFF: usize>(b: &[T; N]) -> __m128i {
    // Checked at compile time for every instantiation, so the read below stays in `b`.
    const { assert!(size_of::<T>() == 1 && OFF + 16 <= N) };
    // SAFETY: `T` is one byte and `OFF + 16 <= N`, so bytes `OFF..OFF + 16` lie inside `b`;
    // `loadu` has no alignment requirement, and SSE2 is part of the x86_64 baseline.
    unsafe { _mm_loadu_si128(b.as_ptr().add(OFF).cast()) }
}

/// Exact `sum(x[j] * y[j])` over 32 i8 lanes given as two 16-byte halves each.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_i8(x_lo: __m128i, x_hi: __m128i, y_lo: __m128i, y_hi: __m128i) -> i32 {
    // SAFETY: register-only intrinsics; the caller guarantees AVX2.
    unsafe {
        // i8 -> i16 is exact; each i32 lane sums two products of at most 2^14: exact.
        let lo = _mm256_madd_epi16(_mm256_cvtepi8_epi16(x_lo), _mm256_cvtepi8_epi16(y_lo));
        let hi = _mm256_madd_epi16(_mm256_cvtepi8_epi16(x_hi), _mm256_cvtepi8_epi16(y_hi));
        let v = _mm256_add_epi32(lo, hi);
        // Horizontal sum of eight i32 lanes, exact: the total is at most 2^19 in magnitude.
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }
}

/// Elements 0..16 (low nibbles) and 16..32 (high nibbles) of the 16 packed bytes `q`, minus
/// `offset`, as i8 lanes.
#[inline(always)]
fn nibbles(q: __m128i, offset: i8) -> (__m128i, __m128i) {
    // SAFETY: SSE2-only register intrinsics, part of the x86_64 baseline.
    unsafe {
        let mask = _mm_set1_epi8(0x0F);
        let off = _mm_set1_epi8(offset);
        // The 16-bit shift drags bits across byte boundaries; the mask drops them again.
        let lo = _mm_and_si128(q, mask);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), mask);
        // 0..=15 minus at most 8 stays in i8 range.
        (_mm_sub_epi8(lo, off), _mm_sub_epi8(hi, off))
    }
}

/// The activation quants as two 16-byte halves.
#[inline(always)]
fn act(qs: &[i8; 32]) -> (__m128i, __m128i) {
    (load16::<_, 32, 0>(qs), load16::<_, 32, 16>(qs))
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn q8_0_q8_0_avx2(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q8_0_BYTES>(w).zip(a) {
        let (y_lo, y_hi) = act(&a.qs);
        let x_lo = load16::<_, Q8_0_BYTES, 2>(w);
        let x_hi = load16::<_, Q8_0_BYTES, 18>(w);
        // SAFETY: the caller guarantees AVX2.
        let isum = unsafe { dot_i8(x_lo, x_hi, y_lo, y_hi) };
        sum += (f16_le([w[0], w[1]]) * a.d.to_f32()) * isum as f32;
    }
    sum
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn q4_0_q8_0_avx2(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q4_0_BYTES>(w).zip(a) {
        let (x_lo, x_hi) = nibbles(load16::<_, Q4_0_BYTES, 2>(w), 8);
        let (y_lo, y_hi) = act(&a.qs);
        // SAFETY: the caller guarantees AVX2.
        let isum = unsafe { dot_i8(x_lo, x_hi, y_lo, y_hi) };
        sum += (f16_le([w[0], w[1]]) * a.d.to_f32()) * isum as f32;
    }
    sum
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn q4_1_q8_1_avx2(w: &[u8], a: &[BlockQ8_1]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q4_1_BYTES>(w).zip(a) {
        let (x_lo, x_hi) = nibbles(load16::<_, Q4_1_BYTES, 4>(w), 0);
        let (y_lo, y_hi) = act(&a.qs);
        // SAFETY: the caller guarantees AVX2.
        let isum = unsafe { dot_i8(x_lo, x_hi, y_lo, y_hi) };
        let (d, m) = (f16_le([w[0], w[1]]), f16_le([w[2], w[3]]));
        sum += (d * a.d.to_f32()) * isum as f32 + m * a.s.to_f32();
    }
    sum
}
