//! f16 → f32 widening of keys and values inside the attention bodies. Called once per key page
//! and once per value row, so it must inline into the SIMD body that calls it rather than be a
//! call with its own feature check: [`F16c`] in the AVX2 and AVX-512 bodies (which enable F16C),
//! [`Plain`] elsewhere. Widening is exact, so both give the same bits.

use half::f16;

/// A way to widen f16 to f32.
pub(super) trait Widen {
    /// `dst[i] = src[i]` widened, for `i < dst.len().min(src.len())`.
    ///
    /// # Safety
    ///
    /// The caller must run on a CPU with the implementation's features, in a function compiled
    /// with them.
    unsafe fn widen(src: &[f16], dst: &mut [f32]);
}

/// Widening in plain Rust.
pub(super) struct Plain;

impl Widen for Plain {
    #[inline(always)]
    unsafe fn widen(src: &[f16], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
}

/// Widening with F16C's `vcvtph2ps`, eight values at a time.
#[cfg(target_arch = "x86_64")]
pub(super) struct F16c;

#[cfg(target_arch = "x86_64")]
impl Widen for F16c {
    #[inline(always)]
    unsafe fn widen(src: &[f16], dst: &mut [f32]) {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm256_cvtph_ps, _mm256_storeu_ps};
        let mut dst_chunks = dst.chunks_exact_mut(8);
        let mut src_chunks = src.chunks_exact(8);
        for (d, s) in (&mut dst_chunks).zip(&mut src_chunks) {
            // SAFETY: `s` holds eight f16 (16 bytes) and `d` eight f32; unaligned loads and
            // stores; F16C is guaranteed by the caller.
            unsafe {
                let halves = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
                _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(halves));
            }
        }
        for (d, s) in dst_chunks
            .into_remainder()
            .iter_mut()
            .zip(src_chunks.remainder())
        {
            *d = s.to_f32();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every half, at lengths around the eight-wide step: exact, NaN to NaN.
    fn check<W: Widen>() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        for len in [0, 1, 7, 8, 9, 23, all.len()] {
            let mut wide = vec![0.0f32; len];
            // SAFETY: the caller checked `W`'s features.
            unsafe { W::widen(&all[..len], &mut wide) };
            for (w, h) in wide.iter().zip(&all[..len]) {
                let expected = h.to_f32();
                assert!(
                    w.to_bits() == expected.to_bits() || (w.is_nan() && expected.is_nan()),
                    "{h:?}: {w} vs {expected}"
                );
            }
        }
    }

    #[test]
    fn widening_is_exact_for_every_half_and_any_length() {
        check::<Plain>();
        #[cfg(target_arch = "x86_64")]
        if crate::isa::avx2() {
            check::<F16c>();
        }
    }
}
