//! AVX2 kernels: SIMD for each block's 32-element integer dot, scalar f32 for the
//! accumulation, so the result is bit-identical to [`super::scalar`] (same exact integer sums,
//! same f32 operations in the same order; see the parent module for the order).
//!
//! The integer products are widened to i16 and summed pairwise to i32 (`vpmaddwd`) rather
//! than using ggml's `vpmaddubsw` sign trick: that trick saturates at i16 and mis-handles a
//! quant of −128 on both sides, which a weight from a model file (or a hand-built activation
//! block) may hold; widening is exact for every i8 pair.
//!
//! Intrinsic calls sit in `unsafe` blocks because older compilers treat them as unsafe to call;
//! newer compilers treat the register-only ones as safe inside `#[target_feature]` functions
//! and would call those blocks unused, hence the `allow`.
#![allow(unused_unsafe)]

use std::arch::x86_64::{
    __m128i, __m256i, _mm_and_si128, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_or_si128, _mm_set1_epi8,
    _mm_set1_epi32, _mm_set1_epi64x, _mm_setr_epi8, _mm_shuffle_epi8, _mm_srli_epi16, _mm_sub_epi8,
    _mm256_add_epi32, _mm256_cvtepi8_epi16, _mm256_madd_epi16,
};
use std::sync::OnceLock;

use super::batch::batched;
use super::{
    BlockQ8_0, BlockQ8_1, Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q5_1_BYTES, Q8_0_BYTES, f16_le,
    weight_blocks,
};

/// Whether this CPU runs the AVX2 kernels; detected once, as the answer cannot change.
pub(super) fn available() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

/// [`super::scalar`]'s Q8_0 × Q8_0 kernel, or `None` without AVX2.
pub(super) fn q8_0_q8_0(w: &[u8], a: &[BlockQ8_0]) -> Option<f32> {
    // SAFETY: AVX2, FMA and F16C were detected on this CPU just now.
    available().then(|| unsafe { q8_0_q8_0_avx2(w, a) })
}

/// [`super::scalar`]'s Q4_0 × Q8_0 kernel, or `None` without AVX2.
pub(super) fn q4_0_q8_0(w: &[u8], a: &[BlockQ8_0]) -> Option<f32> {
    // SAFETY: AVX2, FMA and F16C were detected on this CPU just now.
    available().then(|| unsafe { q4_0_q8_0_avx2(w, a) })
}

/// [`super::scalar`]'s Q4_1 × Q8_1 kernel, or `None` without AVX2.
pub(super) fn q4_1_q8_1(w: &[u8], a: &[BlockQ8_1]) -> Option<f32> {
    // SAFETY: AVX2, FMA and F16C were detected on this CPU just now.
    available().then(|| unsafe { q4_1_q8_1_avx2(w, a) })
}

/// [`super::scalar`]'s Q5_0 × Q8_0 kernel, or `None` without AVX2.
pub(super) fn q5_0_q8_0(w: &[u8], a: &[BlockQ8_0]) -> Option<f32> {
    // SAFETY: AVX2, FMA and F16C were detected on this CPU just now.
    available().then(|| unsafe { q5_0_q8_0_avx2(w, a) })
}

/// [`super::scalar`]'s Q5_1 × Q8_1 kernel, or `None` without AVX2.
pub(super) fn q5_1_q8_1(w: &[u8], a: &[BlockQ8_1]) -> Option<f32> {
    // SAFETY: AVX2, FMA and F16C were detected on this CPU just now.
    available().then(|| unsafe { q5_1_q8_1_avx2(w, a) })
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

/// The products `x[j] * y[j]` over 32 i8 lanes (given as two 16-byte halves each), summed
/// into eight i32 lanes whose total is the exact dot (at most `2^19` in magnitude).
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_i8(x_lo: __m128i, x_hi: __m128i, y_lo: __m128i, y_hi: __m128i) -> __m256i {
    // SAFETY: register-only intrinsics; the caller guarantees AVX2.
    unsafe {
        // i8 -> i16 is exact; each i32 lane sums two products of at most 2^14: exact.
        let lo = _mm256_madd_epi16(_mm256_cvtepi8_epi16(x_lo), _mm256_cvtepi8_epi16(y_lo));
        let hi = _mm256_madd_epi16(_mm256_cvtepi8_epi16(x_hi), _mm256_cvtepi8_epi16(y_hi));
        _mm256_add_epi32(lo, hi)
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

/// The fifth bits of a 5-bit block as bytes `0x10` or `0`: bit `j` of `qh` for element `j`,
/// elements 0..16 in the first vector, 16..32 in the second.
///
/// # Safety
/// The CPU must support AVX2 (SSSE3's byte shuffle is all this needs).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn five_bits_raw(qh: u32) -> (__m128i, __m128i) {
    // SAFETY: register-only intrinsics; the caller guarantees AVX2.
    unsafe {
        let bits = _mm_set1_epi32(qh as i32);
        // Byte `k` of the lower half takes qh's byte `k / 8`, of the upper half byte
        // `2 + k / 8`; then each byte tests its own bit `k % 8`.
        let spread_lo = _mm_shuffle_epi8(
            bits,
            _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
        );
        let spread_hi = _mm_shuffle_epi8(
            bits,
            _mm_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3),
        );
        let bit = _mm_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let fifth = _mm_set1_epi8(0x10);
        (
            _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(spread_lo, bit), bit), fifth),
            _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(spread_hi, bit), bit), fifth),
        )
    }
}

/// Elements 0..16 and 16..32 of a 5-bit block: the nibbles of `q` with bit `j` of `qh` as
/// bit 4 of element `j`, minus `offset` (0 or 16: the result stays in `-16..=31`), as i8 lanes.
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn five_bits(q: __m128i, qh: u32, offset: i8) -> (__m128i, __m128i) {
    // SAFETY: register-only intrinsics; the caller guarantees AVX2.
    unsafe {
        let (lo, hi) = nibbles(q, 0);
        let (h_lo, h_hi) = five_bits_raw(qh);
        let off = _mm_set1_epi8(offset);
        (
            _mm_sub_epi8(_mm_or_si128(lo, h_lo), off),
            _mm_sub_epi8(_mm_or_si128(hi, h_hi), off),
        )
    }
}

/// The activation quants as two 16-byte halves.
#[inline(always)]
fn act(qs: &[i8; 32]) -> (__m128i, __m128i) {
    (load16::<_, 32, 0>(qs), load16::<_, 32, 16>(qs))
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_q8_0_avx2(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    batched!(w, a, Q8_0_BYTES, false, |wb, ab| {
        let (y_lo, y_hi) = act(&ab.qs);
        let x_lo = load16::<_, Q8_0_BYTES, 2>(wb);
        let x_hi = load16::<_, Q8_0_BYTES, 18>(wb);
        // SAFETY: the caller guarantees AVX2.
        unsafe { dot_i8(x_lo, x_hi, y_lo, y_hi) }
    })
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_q8_0_avx2(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    batched!(w, a, Q4_0_BYTES, false, |wb, ab| {
        let (x_lo, x_hi) = nibbles(load16::<_, Q4_0_BYTES, 2>(wb), 8);
        let (y_lo, y_hi) = act(&ab.qs);
        // SAFETY: the caller guarantees AVX2.
        unsafe { dot_i8(x_lo, x_hi, y_lo, y_hi) }
    })
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_q8_1_avx2(w: &[u8], a: &[BlockQ8_1]) -> f32 {
    batched!(w, a, Q4_1_BYTES, true, |wb, ab| {
        let (x_lo, x_hi) = nibbles(load16::<_, Q4_1_BYTES, 4>(wb), 0);
        let (y_lo, y_hi) = act(&ab.qs);
        // SAFETY: the caller guarantees AVX2.
        unsafe { dot_i8(x_lo, x_hi, y_lo, y_hi) }
    })
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_q8_0_avx2(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    batched!(w, a, Q5_0_BYTES, false, |wb, ab| {
        let qh = u32::from_le_bytes([wb[2], wb[3], wb[4], wb[5]]);
        let (y_lo, y_hi) = act(&ab.qs);
        // SAFETY: the caller guarantees AVX2.
        unsafe {
            let (x_lo, x_hi) = five_bits(load16::<_, Q5_0_BYTES, 6>(wb), qh, 16);
            dot_i8(x_lo, x_hi, y_lo, y_hi)
        }
    })
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_1_q8_1_avx2(w: &[u8], a: &[BlockQ8_1]) -> f32 {
    batched!(w, a, Q5_1_BYTES, true, |wb, ab| {
        let qh = u32::from_le_bytes([wb[4], wb[5], wb[6], wb[7]]);
        let (y_lo, y_hi) = act(&ab.qs);
        // SAFETY: the caller guarantees AVX2.
        unsafe {
            let (x_lo, x_hi) = five_bits(load16::<_, Q5_1_BYTES, 8>(wb), qh, 0);
            dot_i8(x_lo, x_hi, y_lo, y_hi)
        }
    })
}
