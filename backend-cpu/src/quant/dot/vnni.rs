//! AVX-512 VNNI k-quant kernels (256-bit, `avx512vnni` + `avx512vl`), preferred over AVX2 when
//! the CPU has them: the same exact integer sums and the same scalar f32 steps, so
//! bit-identical to [`super::scalar`].
//!
//! `vpdpbusd` multiplies unsigned bytes by signed bytes and adds each group of four products
//! to an i32 lane, without saturation, so it is exact for every input. Q4_K/Q5_K sub-block sums
//! are one `vpdpbusd` each; Q6_K keeps the AVX2 kernel's exact `vpmaddubsw` pair sums and folds
//! the scale multiply and the accumulation into one `vpdpwssd` (i16 × i16 pairs into i32, exact
//! for these bounds). The 32-element formats' kernels are in `crate::kernels`.
//!
//! These intrinsics are stable since Rust 1.89, the workspace's `rust-version`.
#![allow(unused_unsafe)]

use std::arch::x86_64::{
    __m256i, _mm_add_epi32, _mm_cvtsi128_si32, _mm_shuffle_epi32, _mm256_add_epi32,
    _mm256_and_si256, _mm256_castsi256_si128, _mm256_dpbusd_epi32, _mm256_dpwssd_epi32,
    _mm256_extracti128_si256, _mm256_loadu_si256, _mm256_maddubs_epi16, _mm256_or_si256,
    _mm256_set1_epi8, _mm256_setzero_si256, _mm256_slli_epi16, _mm256_srli_epi16, _mm256_sub_epi16,
};
use std::sync::OnceLock;

use super::avx2_k::{k_finish, q6_scale, q6_scales, reduce8};
use super::{BlockQ8K, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, f16_le, weight_blocks};

/// Whether this CPU runs the VNNI kernels (which also use AVX2); detected once.
pub(super) fn available() -> bool {
    static VNNI: OnceLock<bool> = OnceLock::new();
    *VNNI.get_or_init(|| {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx512vl")
    })
}

/// Defines the `Option`-returning entry point of a VNNI kernel.
macro_rules! entry {
    ($name:ident, $act:ty, $kernel:ident) => {
        #[doc = concat!("[`super::scalar`]'s `", stringify!($name), "` kernel, or `None` without VNNI.")]
        pub(super) fn $name(w: &[u8], a: &[$act]) -> Option<f32> {
            // SAFETY: AVX2, FMA, F16C, AVX512-VNNI and AVX512-VL were detected on this CPU just now.
            available().then(|| unsafe { $kernel(w, a) })
        }
    };
}

entry!(q4_k_q8_k, BlockQ8K, q4_k_vnni);
entry!(q5_k_q8_k, BlockQ8K, q5_k_vnni);
entry!(q6_k_q8_k, BlockQ8K, q6_k_vnni);

/// The 32 bytes of `b` starting at `off`, as a vector; zeros if they are not all inside `b`
/// (never the case for the callers' constant offsets, where the check folds away).
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn load32<T: Copy>(b: &[T], off: usize) -> __m256i {
    const { assert!(size_of::<T>() == 1) };
    match b.get(off..off.saturating_add(32)) {
        // SAFETY: `T` is one byte, so the 32 bytes lie inside `b`; `loadu` has no alignment
        // requirement; the caller guarantees AVX2.
        Some(s) => unsafe { _mm256_loadu_si256(s.as_ptr().cast()) },
        // SAFETY: register-only; the caller guarantees AVX2.
        None => unsafe { _mm256_setzero_si256() },
    }
}

/// Exact sum of the eight i32 lanes.
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn hsum(v: __m256i) -> i32 {
    // SAFETY: register-only intrinsics; the caller guarantees AVX2.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }
}

/// Integer sum of one Q4_K / Q5_K super-block: `qs` at `QS`, fifth bits at `QH` when `FIVE`.
///
/// Each sub-block's `Σ q·y` is one `vpdpbusd` (unsigned quants ≤ 31, so lanes stay below
/// `4 · 31 · 128`), the eight sub-block vectors are reduced together, and the scales applied
/// with one 32-bit multiply (exact: at most `63 · 32 · 31 · 128 < 2^23` per lane).
///
/// # Safety
/// The CPU must support AVX2, AVX512-VNNI and AVX512-VL.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn k_sub_sums<const QS: usize, const QH: usize, const FIVE: bool>(
    w: &[u8],
    a: &BlockQ8K,
) -> __m256i {
    // SAFETY: register-only intrinsics and checked loads; the caller guarantees the features.
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        let two = _mm256_set1_epi8(2);
        let zero = _mm256_setzero_si256();
        let mut h = if FIVE { load32(w, QH) } else { zero };
        let mut s = [zero; 8];
        for (p, s) in s.chunks_exact_mut(2).enumerate() {
            let q = load32(w, QS + 32 * p);
            let mut lo = _mm256_and_si256(q, mask);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), mask);
            if FIVE {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(_mm256_and_si256(h, one)));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16::<3>(_mm256_and_si256(h, two)));
                h = _mm256_srli_epi16::<2>(h);
            }
            s[0] = _mm256_dpbusd_epi32(zero, lo, load32(&a.qs, 64 * p));
            s[1] = _mm256_dpbusd_epi32(zero, hi, load32(&a.qs, 64 * p + 32));
        }
        reduce8(&s)
    }
}

/// # Safety
/// The CPU must support AVX2, FMA, F16C, AVX512-VNNI and AVX512-VL.
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn q4_k_vnni(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q4_K_BYTES>(w).zip(a) {
        // SAFETY: the caller guarantees the features.
        sum = unsafe { k_finish(sum, w, a, k_sub_sums::<16, 0, false>(w, a)) };
    }
    sum
}

/// # Safety
/// The CPU must support AVX2, FMA, F16C, AVX512-VNNI and AVX512-VL.
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn q5_k_vnni(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q5_K_BYTES>(w).zip(a) {
        // SAFETY: the caller guarantees the features.
        sum = unsafe { k_finish(sum, w, a, k_sub_sums::<48, 16, true>(w, a)) };
    }
    sum
}

/// # Safety
/// The CPU must support AVX2, FMA, F16C, AVX512-VNNI and AVX512-VL.
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn q6_k_vnni(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q6_K_BYTES>(w).zip(a) {
        // SAFETY: register-only intrinsics and checked loads; the caller guarantees the
        // features.
        let isum = unsafe {
            let mask = _mm256_set1_epi8(0x0F);
            let top = _mm256_set1_epi8(0x30);
            let m32 = _mm256_set1_epi8(32);
            // One accumulator per half: two shorter `vpdpwssd` dependency chains.
            let mut accs = [_mm256_setzero_si256(); 2];
            for (half, acc) in accs.iter_mut().enumerate() {
                let ql0 = load32(w, 64 * half);
                let ql1 = load32(w, 64 * half + 32);
                let qh = load32(w, 128 + 32 * half);
                let scales = q6_scales(w, 192 + 8 * half);
                // As the AVX2 kernel: bits 2k..2k + 2 of qh moved to bits 4..6.
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, mask),
                        _mm256_and_si256(_mm256_slli_epi16::<4>(qh), top),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, mask),
                        _mm256_and_si256(_mm256_slli_epi16::<2>(qh), top),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), mask),
                        _mm256_and_si256(qh, top),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), mask),
                        _mm256_and_si256(_mm256_srli_epi16::<2>(qh), top),
                    ),
                ];
                for (k, q) in q.into_iter().enumerate() {
                    let y = load32(&a.qs, 128 * half + 32 * k);
                    // (q - 32)·y pair sums, exact in i16 (at most 2 · 32 · 128).
                    let p =
                        _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), _mm256_maddubs_epi16(m32, y));
                    *acc = _mm256_dpwssd_epi32(*acc, p, q6_scale(scales, k));
                }
            }
            hsum(_mm256_add_epi32(accs[0], accs[1]))
        };
        sum += (f16_le([w[208], w[209]]) * a.d) * isum as f32;
    }
    sum
}
