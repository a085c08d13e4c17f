//! AVX2 + FMA (+ F16C) kernels of float weight rows against f32 activations: the lane
//! structure of [`super::float`] in four 8-lane registers (lanes `0..8`, `8..16`, `16..24`,
//! `24..32`), the same fused multiply-adds, the same pairwise reduction and the same scalar
//! tail, so the result is bit-identical to [`super::scalar`] for finite results.
#![allow(unused_unsafe)]

use std::arch::x86_64::{
    __m256, _mm_add_ps, _mm_add_ss, _mm_cvtss_f32, _mm_loadu_si128, _mm_movehl_ps, _mm_shuffle_ps,
    _mm256_add_ps, _mm256_castps256_ps128, _mm256_castsi256_ps, _mm256_cvtepu16_epi32,
    _mm256_cvtph_ps, _mm256_extractf128_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps,
    _mm256_slli_epi32,
};

use super::f16_le;
use super::float::LANES;
use crate::isa::avx2 as available;

/// Weight element encodings.
const F32: u8 = 0;
const F16: u8 = 1;
const BF16: u8 = 2;

/// [`super::scalar`]'s F32 × f32 kernel, or `None` without AVX2/FMA/F16C.
pub(super) fn f32_f32(w: &[u8], a: &[f32]) -> Option<f32> {
    // SAFETY: the features were detected on this CPU just now.
    available().then(|| unsafe { dot::<F32, 4, { 4 * LANES }>(w, a) })
}

/// [`super::scalar`]'s F16 × f32 kernel, or `None` without AVX2/FMA/F16C.
pub(super) fn f16_f32(w: &[u8], a: &[f32]) -> Option<f32> {
    // SAFETY: the features were detected on this CPU just now.
    available().then(|| unsafe { dot::<F16, 2, { 2 * LANES }>(w, a) })
}

/// [`super::scalar`]'s BF16 × f32 kernel, or `None` without AVX2/FMA/F16C.
pub(super) fn bf16_f32(w: &[u8], a: &[f32]) -> Option<f32> {
    // SAFETY: the features were detected on this CPU just now.
    available().then(|| unsafe { dot::<BF16, 2, { 2 * LANES }>(w, a) })
}

/// Elements `8i..8i + 8` of a chunk of `KIND`-encoded weights, widened exactly to f32.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen8<const KIND: u8, const CB: usize>(w: &[u8; CB], i: usize) -> __m256 {
    let bytes = if KIND == F32 { 32 } else { 16 };
    let Some(s) = w.get(bytes * i..bytes * (i + 1)) else {
        // Unreachable for the callers' constant `i < 4`, where the check folds away.
        // SAFETY: register-only; the caller guarantees AVX.
        return unsafe { _mm256_setzero_ps() };
    };
    // SAFETY: `s` holds the `bytes` bytes each load reads; `loadu` needs no alignment; the
    // caller guarantees the features.
    unsafe {
        match KIND {
            F32 => _mm256_loadu_ps(s.as_ptr().cast()),
            F16 => _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().cast())),
            // As `GGML_BF16_TO_FP32`: the 16 bits become the top of an f32, unchanged.
            _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                _mm_loadu_si128(s.as_ptr().cast()),
            ))),
        }
    }
}

/// The eight activations `8i..8i + 8` of a chunk.
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn act8(a: &[f32; LANES], i: usize) -> __m256 {
    match a.get(8 * i..8 * i + 8) {
        // SAFETY: the slice holds the 8 floats read; the caller guarantees AVX.
        Some(s) => unsafe { _mm256_loadu_ps(s.as_ptr()) },
        // SAFETY: register-only; the caller guarantees AVX.
        None => unsafe { _mm256_setzero_ps() },
    }
}

/// The shared order for `E`-byte elements of encoding `KIND`, `CB = E · 32` bytes a chunk.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot<const KIND: u8, const E: usize, const CB: usize>(w: &[u8], a: &[f32]) -> f32 {
    let a_chunks = a.chunks_exact(LANES);
    let a_tail = a_chunks.remainder();
    let w_tail = w.chunks_exact(CB).remainder();
    let chunks = w
        .chunks_exact(CB)
        .filter_map(|c| <&[u8; CB]>::try_from(c).ok())
        .zip(a_chunks.filter_map(|c| <&[f32; LANES]>::try_from(c).ok()));
    // SAFETY: register-only intrinsics and the helpers above; the caller guarantees the
    // features.
    let mut sum = unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        for (w, a) in chunks {
            for (i, acc) in acc.iter_mut().enumerate() {
                *acc = _mm256_fmadd_ps(widen8::<KIND, CB>(w, i), act8(a, i), *acc);
            }
        }
        // acc[l] += acc[l + 16], then acc[l] += acc[l + 8]: lanes 0..8 of one register.
        let s8 = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
        // acc[l] += acc[l + 4], acc[l] += acc[l + 2], then acc[0] + acc[1].
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)))
    };
    for (w, &a) in w_tail.chunks_exact(E).zip(a_tail) {
        // `w` has exactly `E` bytes (4 for F32, 2 otherwise), so the conversion matching
        // `KIND` always succeeds.
        let w = match KIND {
            F32 => w.try_into().map_or(0.0, f32::from_le_bytes),
            F16 => w.try_into().map_or(0.0, f16_le),
            _ => w.try_into().map_or(0.0, |b| {
                f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16)
            }),
        };
        sum = w.mul_add(a, sum);
    }
    sum
}
