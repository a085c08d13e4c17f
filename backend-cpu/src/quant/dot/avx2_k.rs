//! AVX2 kernels of the k-quants against Q8_K: SIMD for each super-block's exact integer sums,
//! the scalar f32 step of [`super::k_quants`], so the result is bit-identical to
//! [`super::scalar`].
//!
//! The weight quants are unsigned (Q6_K's before its `- 32`), so `vpmaddubsw` (u8 × i8, pairs
//! summed to i16 with saturation) is exact here: a pair is at most `2 · 63 · 128 = 16128` in
//! magnitude, far from i16's limits, for every weight and activation byte, −128 included.
//! Q4_K / Q5_K: the pair sums are widened to i32 quads (`vpmaddwd` by ones), the eight
//! sub-block vectors reduced together to one lane per sub-block, and the scales and mins
//! applied once per super-block with 32-bit multiplies. Q6_K: the `(q - 32)` pair sums (exact
//! in i16) are multiplied by their 16-element sub-block's scale with `vpmaddwd` (at most
//! `2 · 4096 · 128 < 2^21` per lane). Every lane total stays below the super-block bounds of
//! the parent module, so all of it is exact.
#![allow(unused_unsafe)]

use std::arch::x86_64::{
    __m256i, _mm_add_epi32, _mm_cvtepi8_epi16, _mm_cvtph_ps, _mm_cvtsi32_si128, _mm_cvtsi64_si128,
    _mm_cvtsi128_si32, _mm_cvtss_f32, _mm_extract_epi32, _mm_movehdup_ps, _mm_set1_epi16,
    _mm_shuffle_epi32, _mm256_add_epi32, _mm256_and_si256, _mm256_broadcastsi128_si256,
    _mm256_castsi256_si128, _mm256_cvtepu8_epi32, _mm256_extracti128_si256, _mm256_hadd_epi32,
    _mm256_loadu_si256, _mm256_madd_epi16, _mm256_maddubs_epi16, _mm256_mullo_epi32,
    _mm256_or_si256, _mm256_permute2x128_si256, _mm256_set_m128i, _mm256_set1_epi8,
    _mm256_set1_epi16, _mm256_setzero_si256, _mm256_shuffle_epi8, _mm256_slli_epi16,
    _mm256_srli_epi16, _mm256_sub_epi16,
};

use super::k_quants::{k_step, scales_mins};
use super::{BlockQ8K, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, f16_le, weight_blocks};

/// Whether this CPU runs the AVX2 kernels (with FMA and F16C); detected once, as the answer
/// cannot change.
pub(super) fn available() -> bool {
    static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX2.get_or_init(|| {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

/// [`super::scalar`]'s Q4_K × Q8_K kernel, or `None` without AVX2.
pub(super) fn q4_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> Option<f32> {
    // SAFETY: AVX2, FMA and F16C were detected on this CPU just now.
    available().then(|| unsafe { q4_k_avx2(w, a) })
}

/// [`super::scalar`]'s Q5_K × Q8_K kernel, or `None` without AVX2.
pub(super) fn q5_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> Option<f32> {
    // SAFETY: AVX2, FMA and F16C were detected on this CPU just now.
    available().then(|| unsafe { q5_k_avx2(w, a) })
}

/// [`super::scalar`]'s Q6_K × Q8_K kernel, or `None` without AVX2.
pub(super) fn q6_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> Option<f32> {
    // SAFETY: AVX2, FMA and F16C were detected on this CPU just now.
    available().then(|| unsafe { q6_k_avx2(w, a) })
}

/// The 32 bytes of `b` starting at `off`, as a vector; zeros if they are not all inside `b`
/// (never the case for the callers' constant offsets, where the check folds away).
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
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

/// The activation quants `32k..32k + 32`.
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn act(a: &BlockQ8K, k: usize) -> __m256i {
    // SAFETY: the caller guarantees AVX2.
    unsafe { load32(&a.qs, 32 * k) }
}

/// Exact sum of the eight i32 lanes (the callers' totals are below 2^28 in magnitude).
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum(v: __m256i) -> i32 {
    // SAFETY: register-only intrinsics; the caller guarantees AVX2.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }
}

/// The f32 step of a Q4_K / Q5_K super-block, given `sub` (lane `j`: the exact `Σ q·y` of
/// sub-block `j`, at most `32 · 31 · 128` in magnitude): the scales and the mins (with the
/// `bsums` pair sums) are applied with 32-bit multiplies, both sums reduced together (exact
/// integer arithmetic, any order), `d` and `dmin` widened by F16C (exact), then the very f32
/// operations of [`super::k_quants`]'s step.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k_finish<const B: usize>(
    sum: f32,
    w: &[u8; B],
    a: &BlockQ8K,
    sub: __m256i,
) -> f32 {
    const { assert!(B >= 16) };
    let (sc, m) = scales_mins(w);
    // SAFETY: register-only intrinsics, and a 32-byte load of the 16 i16 `bsums` (no
    // alignment needed); the caller guarantees the features.
    let (isum, msum, d, dmin) = unsafe {
        let sc = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(sc)));
        let m = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(m)));
        let bsums = _mm256_loadu_si256(a.bsums.as_ptr().cast());
        // bsums[2j] + bsums[2j + 1] (at most 2^16), times m_j (at most 63).
        let pairs = _mm256_madd_epi16(bsums, _mm256_set1_epi16(1));
        let isum_v = _mm256_mullo_epi32(sub, sc);
        let msum_v = _mm256_mullo_epi32(pairs, m);
        let h = _mm256_hadd_epi32(isum_v, msum_v);
        let h = _mm256_hadd_epi32(h, h);
        let t = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
        let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([
            w[0], w[1], w[2], w[3],
        ])));
        (
            _mm_cvtsi128_si32(t),
            _mm_extract_epi32::<1>(t),
            _mm_cvtss_f32(dd),
            _mm_cvtss_f32(_mm_movehdup_ps(dd)),
        )
    };
    k_step(sum, d, dmin, a.d, isum, msum)
}

/// The eight sub-block sums `Σ q·y` of one Q4_K / Q5_K super-block (lane `j`: sub-block
/// `j`): `qs` at `QS`, fifth bits at `QH` when `FIVE`.
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k_sub_sums<const B: usize, const QS: usize, const QH: usize, const FIVE: bool>(
    w: &[u8; B],
    a: &BlockQ8K,
) -> __m256i {
    // SAFETY: the caller guarantees AVX2; loads are checked.
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        let two = _mm256_set1_epi8(2);
        let ones16 = _mm256_set1_epi16(1);
        // Bits 0 and 1 of each byte of `h` are the fifth bits of sub-blocks 2p and 2p + 1;
        // the 16-bit shifts drag bits across bytes only into bits the masks drop.
        let mut h = if FIVE {
            load32(w, QH)
        } else {
            _mm256_setzero_si256()
        };
        let mut sub = [_mm256_setzero_si256(); 8];
        for (p, sub) in sub.chunks_exact_mut(2).enumerate() {
            let q = load32(w, QS + 32 * p);
            let mut lo = _mm256_and_si256(q, mask);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), mask);
            if FIVE {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(_mm256_and_si256(h, one)));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16::<3>(_mm256_and_si256(h, two)));
                h = _mm256_srli_epi16::<2>(h);
            }
            // Exact pair sums (at most 2 · 31 · 128), then exact i32 quads.
            sub[0] = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, act(a, 2 * p)), ones16);
            sub[1] = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, act(a, 2 * p + 1)), ones16);
        }
        reduce8(&sub)
    }
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_avx2(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q4_K_BYTES>(w).zip(a) {
        // SAFETY: the caller guarantees AVX2 and F16C.
        sum = unsafe { k_finish(sum, w, a, k_sub_sums::<Q4_K_BYTES, 16, 0, false>(w, a)) };
    }
    sum
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_avx2(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q5_K_BYTES>(w).zip(a) {
        // SAFETY: the caller guarantees AVX2 and F16C.
        sum = unsafe { k_finish(sum, w, a, k_sub_sums::<Q5_K_BYTES, 48, 16, true>(w, a)) };
    }
    sum
}

/// The 8 signed scales of one Q6_K half (bytes `sc..sc + 8`) widened to i16, the same 8 in
/// both 128-bit halves.
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_scales(w: &[u8; Q6_K_BYTES], sc: usize) -> __m256i {
    let mut bytes = [0u8; 8];
    if let Some(s) = w.get(sc..sc + 8) {
        bytes.copy_from_slice(s);
    }
    // SAFETY: register-only intrinsics; the caller guarantees AVX2.
    unsafe {
        let v = _mm_cvtepi8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(bytes)));
        _mm256_broadcastsi128_si256(v)
    }
}

/// The i16 scales of chunk `k` (0..4) of a Q6_K half, from [`q6_scales`]: its elements 0..16
/// take scale `2k` (lower 128 bits), elements 16..32 scale `2k + 1` (upper 128 bits).
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_scale(scales: __m256i, k: usize) -> __m256i {
    // Byte indices of i16 lane 2k (lower half) and 2k + 1 (upper half), repeated.
    let lo = (4 * k) as i16 | (((4 * k + 1) as i16) << 8);
    let hi = (4 * k + 2) as i16 | (((4 * k + 3) as i16) << 8);
    // SAFETY: register-only intrinsics; the caller guarantees AVX2.
    unsafe {
        let mask = _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo));
        _mm256_shuffle_epi8(scales, mask)
    }
}

/// One half (128 elements) of a Q6_K super-block: `ql` at `QL`, `qh` at `QH`, scales at `SC`,
/// activations `128 · H..`.
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_half<const QL: usize, const QH: usize, const SC: usize, const H: usize>(
    acc: __m256i,
    w: &[u8; Q6_K_BYTES],
    a: &BlockQ8K,
) -> __m256i {
    // SAFETY: the caller guarantees AVX2; loads are checked at compile time.
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        let top = _mm256_set1_epi8(0x30);
        let m32 = _mm256_set1_epi8(32);
        let ql0 = load32(w, QL);
        let ql1 = load32(w, QL + 32);
        let qh = load32(w, QH);
        // Bits 2k..2k + 2 of each qh byte moved to bits 4..6 (16-bit shifts; the mask drops
        // what crosses bytes).
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
        let y = if H == 0 {
            [act(a, 0), act(a, 1), act(a, 2), act(a, 3)]
        } else {
            [act(a, 4), act(a, 5), act(a, 6), act(a, 7)]
        };
        let scales = q6_scales(w, SC);
        let mut acc = acc;
        for k in 0..4 {
            // (q - 32)·y pair sums: both `vpmaddubsw` results are exact (≤ 16128), and so is
            // their difference (≤ 2 · 32 · 128).
            let p = _mm256_sub_epi16(
                _mm256_maddubs_epi16(q[k], y[k]),
                _mm256_maddubs_epi16(m32, y[k]),
            );
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, q6_scale(scales, k)));
        }
        acc
    }
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_avx2(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q6_K_BYTES>(w).zip(a) {
        // SAFETY: the caller guarantees AVX2.
        let isum = unsafe {
            let acc = q6_half::<0, 128, 192, 0>(_mm256_setzero_si256(), w, a);
            hsum(q6_half::<64, 160, 200, 1>(acc, w, a))
        };
        sum += (f16_le([w[208], w[209]]) * a.d) * isum as f32;
    }
    sum
}

/// Lane `i` of the result is the exact sum of the eight lanes of `v[i]` (every caller's sums
/// are far below 2^31).
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn reduce8(v: &[__m256i; 8]) -> __m256i {
    // SAFETY: register-only intrinsics; the caller guarantees AVX2.
    unsafe {
        let h01 = _mm256_hadd_epi32(v[0], v[1]);
        let h23 = _mm256_hadd_epi32(v[2], v[3]);
        let h45 = _mm256_hadd_epi32(v[4], v[5]);
        let h67 = _mm256_hadd_epi32(v[6], v[7]);
        // Per 128-bit half: lanes hold partial sums of v[0..4] and v[4..8] respectively.
        let h0123 = _mm256_hadd_epi32(h01, h23);
        let h4567 = _mm256_hadd_epi32(h45, h67);
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(h0123, h4567),
            _mm256_permute2x128_si256::<0x31>(h0123, h4567),
        )
    }
}
