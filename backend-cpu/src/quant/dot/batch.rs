//! The legacy SIMD kernels' shared outer loop: blocks are taken eight at a time, their eight
//! exact integer sums reduced together (one transpose-add instead of eight horizontal sums)
//! and their eight f32 block terms computed in one vector, with the very operations of the
//! scalar step (`(d_w * d_a) * isum`, then `+ m_w * s_a`, each rounded as in scalar f32); the
//! terms are then added to the running sum one by one, in block order. So the result is
//! bit-identical to [`super::scalar`]; only the work around the f32 chain is vectorized.
#![allow(unused_unsafe)]

use std::arch::x86_64::{
    __m256, __m256i, _mm_loadu_si128, _mm256_add_epi32, _mm256_add_ps, _mm256_cvtepi32_ps,
    _mm256_cvtph_ps, _mm256_hadd_epi32, _mm256_mul_ps, _mm256_permute2x128_si256, _mm256_storeu_ps,
};

use super::{BlockQ8_0, BlockQ8_1};

/// The f16 scales of an activation block, as bits.
pub(super) trait ActScales {
    /// `d`.
    fn d_bits(&self) -> u16;
    /// `s` (0 for blocks without one).
    fn s_bits(&self) -> u16;
}

impl ActScales for BlockQ8_0 {
    #[inline(always)]
    fn d_bits(&self) -> u16 {
        self.d.to_bits()
    }
    #[inline(always)]
    fn s_bits(&self) -> u16 {
        0
    }
}

impl ActScales for BlockQ8_1 {
    #[inline(always)]
    fn d_bits(&self) -> u16 {
        self.d.to_bits()
    }
    #[inline(always)]
    fn s_bits(&self) -> u16 {
        self.s.to_bits()
    }
}

/// Lane `i` of the result is the (exact, wrapping-free: every caller's block sums are below
/// 2^20) sum of the eight lanes of `v[i]`.
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

/// Eight f16 values (bits) widened exactly.
///
/// # Safety
/// The CPU must support F16C and AVX.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen(h: &[u16; 8]) -> __m256 {
    // SAFETY: `h` is 16 readable bytes; `loadu` needs no alignment; the caller guarantees
    // the features.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().cast())) }
}

/// `sum + t_0 + t_1 + … + t_7` (left to right) with `t_i = (dw_i * da_i) * isum_i`, plus
/// `mw_i * sa_i` inside `t_i` when `ms` is given: the scalar step for eight blocks.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn step8(
    mut sum: f32,
    isums: __m256i,
    dw: &[u16; 8],
    da: &[u16; 8],
    ms: Option<(&[u16; 8], &[u16; 8])>,
) -> f32 {
    let mut t = [0.0f32; 8];
    // SAFETY: register-only intrinsics and a store into `t` (32 writable bytes, no alignment
    // needed); the caller guarantees the features.
    unsafe {
        // Separate multiplies and adds: no FMA, exactly the scalar roundings.
        let mut v = _mm256_mul_ps(
            _mm256_mul_ps(widen(dw), widen(da)),
            _mm256_cvtepi32_ps(isums),
        );
        if let Some((mw, sa)) = ms {
            v = _mm256_add_ps(v, _mm256_mul_ps(widen(mw), widen(sa)));
        }
        _mm256_storeu_ps(t.as_mut_ptr(), v);
    }
    for t in t {
        sum += t;
    }
    sum
}

/// The batched loop over a legacy row: `$block` (evaluated with `$wb: &[u8; $bytes]` and
/// `$ab` the activation block) gives a block's integer products as eight i32 lanes whose sum
/// is the block's exact `isum`; `$min` says whether the format has `m` (bytes 2..4) and the
/// activations `s`. Expands inside the calling `#[target_feature]` kernel so everything
/// inlines; that kernel must enable `avx2,fma,f16c`.
macro_rules! batched {
    ($w:expr, $a:expr, $bytes:expr, $min:expr, |$wb:ident, $ab:ident| $block:expr) => {{
        use $crate::quant::dot::batch::{ActScales as _, reduce8, step8};
        let (w, a) = ($w, $a);
        let mut sum = 0.0f32;
        let w_groups = w.chunks_exact(8 * $bytes);
        let a_groups = a.chunks_exact(8);
        let (w_rest, a_rest) = (w_groups.remainder(), a_groups.remainder());
        for (w8, a8) in w_groups.zip(a_groups) {
            // SAFETY: register-only; the calling kernel guarantees AVX2.
            let mut v = [unsafe { std::arch::x86_64::_mm256_setzero_si256() }; 8];
            let (mut dw, mut da, mut mw, mut sa) = ([0u16; 8], [0u16; 8], [0u16; 8], [0u16; 8]);
            let slots = v
                .iter_mut()
                .zip(dw.iter_mut().zip(&mut da))
                .zip(mw.iter_mut().zip(&mut sa));
            for (((v, (dw, da)), (mw, sa)), ($wb, $ab)) in
                slots.zip(weight_blocks::<{ $bytes }>(w8).zip(a8))
            {
                *v = $block;
                *dw = u16::from_le_bytes([$wb[0], $wb[1]]);
                *da = $ab.d_bits();
                if $min {
                    *mw = u16::from_le_bytes([$wb[2], $wb[3]]);
                    *sa = $ab.s_bits();
                }
            }
            let ms = if $min { Some((&mw, &sa)) } else { None };
            // SAFETY: the calling kernel guarantees AVX2 and F16C.
            sum = unsafe { step8(sum, reduce8(&v), &dw, &da, ms) };
        }
        for ($wb, $ab) in weight_blocks::<{ $bytes }>(w_rest).zip(a_rest) {
            // SAFETY: the calling kernel guarantees AVX2.
            let isum = unsafe { $crate::quant::dot::batch::hsum($block) };
            let d = f16_le([$wb[0], $wb[1]]) * half::f16::from_bits($ab.d_bits()).to_f32();
            if $min {
                let m = f16_le([$wb[2], $wb[3]]);
                sum += d * isum as f32 + m * half::f16::from_bits($ab.s_bits()).to_f32();
            } else {
                sum += d * isum as f32;
            }
        }
        sum
    }};
}
pub(super) use batched;

/// Exact sum of the eight i32 lanes (block sums are below 2^20 in magnitude).
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum(v: __m256i) -> i32 {
    use std::arch::x86_64::{
        _mm_add_epi32, _mm_cvtsi128_si32, _mm_shuffle_epi32, _mm256_castsi256_si128,
        _mm256_extracti128_si256,
    };
    // SAFETY: register-only intrinsics; the caller guarantees AVX2.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }
}
