//! f16 → f32 widening of keys and values inside the attention bodies, sixteen values at a time
//! straight into the registers that use them (no f32 copy of a page is written and read back).
//! Called once per key dimension of a page and once per sixteen value dimensions of a slot, so
//! it must inline into the SIMD body that calls it rather than be a call with its own feature
//! check: [`F16c512`] in the AVX-512 body, [`F16c`] in the AVX2 body (both enable F16C),
//! [`Plain`] elsewhere. Widening is exact, so all give the same bits.

use half::f16;

/// Values widened at a time: a page's slots of one key dimension.
pub(super) const LANES: usize = 16;

/// A way to widen f16 to f32, and sixteen f32 lanes as the implementation holds them in
/// registers ([`Widen::V`]): loops that keep many sums across iterations (a row's value sums)
/// use these, as an array of sixteen f32 would be kept in memory there.
///
/// # Safety (every method)
///
/// The caller must run on a CPU with the implementation's features, in a function compiled
/// with them.
pub(super) trait Widen {
    /// Sixteen f32 lanes in registers.
    type V: Copy;
    /// `src` widened.
    unsafe fn lanes(src: &[f16; LANES]) -> [f32; LANES];
    /// `src` widened, in registers.
    unsafe fn widen(src: &[f16; LANES]) -> Self::V;
    /// `x` in every lane.
    unsafe fn splat(x: f32) -> Self::V;
    /// `sum + a · b` per lane, rounded after the product and after the sum (no fused
    /// multiply-add).
    unsafe fn mul_add(sum: Self::V, a: Self::V, b: Self::V) -> Self::V;
    /// The lanes, in order.
    unsafe fn store(v: Self::V) -> [f32; LANES];
}

/// Widening in plain Rust.
pub(super) struct Plain;

impl Widen for Plain {
    type V = [f32; LANES];
    #[inline(always)]
    unsafe fn lanes(src: &[f16; LANES]) -> [f32; LANES] {
        src.map(f16::to_f32)
    }
    #[inline(always)]
    unsafe fn widen(src: &[f16; LANES]) -> Self::V {
        src.map(f16::to_f32)
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        [x; LANES]
    }
    #[inline(always)]
    unsafe fn mul_add(sum: Self::V, a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|l| sum[l] + a[l] * b[l])
    }
    #[inline(always)]
    unsafe fn store(v: Self::V) -> [f32; LANES] {
        v
    }
}

/// Widening with F16C's 256-bit `vcvtph2ps`, eight values an instruction.
#[cfg(target_arch = "x86_64")]
pub(super) struct F16c;

#[cfg(target_arch = "x86_64")]
impl Widen for F16c {
    type V = [std::arch::x86_64::__m256; 2];
    #[inline(always)]
    unsafe fn lanes(src: &[f16; LANES]) -> [f32; LANES] {
        use std::arch::x86_64::{__m128i, __m256, _mm_loadu_si128, _mm256_cvtph_ps};
        // SAFETY: `src` holds sixteen f16 (two unaligned 16-byte loads); F16C is guaranteed by
        // the caller; two `__m256` are sixteen f32, bit for bit.
        unsafe {
            let at = src.as_ptr().cast::<__m128i>();
            let halves: [__m256; 2] = [
                _mm256_cvtph_ps(_mm_loadu_si128(at)),
                _mm256_cvtph_ps(_mm_loadu_si128(at.add(1))),
            ];
            std::mem::transmute(halves)
        }
    }
    #[inline(always)]
    unsafe fn widen(src: &[f16; LANES]) -> Self::V {
        // SAFETY: forwarded from the caller; `V` is two `__m256`, bit for bit sixteen f32.
        unsafe { std::mem::transmute(Self::lanes(src)) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        // SAFETY: AVX is implied by the F16C the caller guarantees.
        unsafe { [std::arch::x86_64::_mm256_set1_ps(x); 2] }
    }
    #[inline(always)]
    unsafe fn mul_add(sum: Self::V, a: Self::V, b: Self::V) -> Self::V {
        use std::arch::x86_64::{_mm256_add_ps, _mm256_mul_ps};
        // SAFETY: as `splat`.
        unsafe { std::array::from_fn(|h| _mm256_add_ps(sum[h], _mm256_mul_ps(a[h], b[h]))) }
    }
    #[inline(always)]
    unsafe fn store(v: Self::V) -> [f32; LANES] {
        // SAFETY: two `__m256` are sixteen f32, bit for bit.
        unsafe { std::mem::transmute(v) }
    }
}

/// Widening with AVX-512's `vcvtph2ps`, sixteen values an instruction.
#[cfg(target_arch = "x86_64")]
pub(super) struct F16c512;

#[cfg(target_arch = "x86_64")]
impl Widen for F16c512 {
    type V = std::arch::x86_64::__m512;
    #[inline(always)]
    unsafe fn lanes(src: &[f16; LANES]) -> [f32; LANES] {
        use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm512_cvtph_ps};
        // SAFETY: `src` holds sixteen f16 (one unaligned 32-byte load); AVX-512F is guaranteed
        // by the caller; a `__m512` is sixteen f32, bit for bit.
        unsafe {
            let halves = _mm256_loadu_si256(src.as_ptr().cast::<__m256i>());
            std::mem::transmute(_mm512_cvtph_ps(halves))
        }
    }
    #[inline(always)]
    unsafe fn widen(src: &[f16; LANES]) -> Self::V {
        // SAFETY: forwarded from the caller; a `__m512` is sixteen f32, bit for bit.
        unsafe { std::mem::transmute(Self::lanes(src)) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        // SAFETY: AVX-512F is guaranteed by the caller.
        unsafe { std::arch::x86_64::_mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn mul_add(sum: Self::V, a: Self::V, b: Self::V) -> Self::V {
        use std::arch::x86_64::{_mm512_add_ps, _mm512_mul_ps};
        // SAFETY: as `splat`.
        unsafe { _mm512_add_ps(sum, _mm512_mul_ps(a, b)) }
    }
    #[inline(always)]
    unsafe fn store(v: Self::V) -> [f32; LANES] {
        // SAFETY: a `__m512` is sixteen f32, bit for bit.
        unsafe { std::mem::transmute(v) }
    }
}

/// `row[at..at + R·LANES]` widened as `R` runs, zero beyond the row's end (only odd head sizes
/// reach it): one branch, then `R` widenings the caller's loop can keep in registers.
///
/// # Safety
///
/// As [`Widen::lanes`].
#[inline(always)]
pub(super) unsafe fn runs<W: Widen, const R: usize>(row: &[f16], at: usize) -> [[f32; LANES]; R] {
    let Some(whole) = row.get(at..at + R * LANES) else {
        return partial(row.get(at..).unwrap_or_default());
    };
    let (whole, _) = whole.as_chunks::<LANES>();
    let mut out = [[0.0f32; LANES]; R];
    for (lanes, run) in out.iter_mut().zip(whole) {
        // SAFETY: forwarded from the caller.
        *lanes = unsafe { W::lanes(run) };
    }
    out
}

/// The widening of a row's last, partial runs, one value at a time, zero past its end.
#[cold]
fn partial<const R: usize>(tail: &[f16]) -> [[f32; LANES]; R] {
    let mut out = [[0.0f32; LANES]; R];
    for (lane, &h) in out.as_flattened_mut().iter_mut().zip(tail) {
        *lane = h.to_f32();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every half, sixteen at a time and through `runs` at offsets that end mid-run: exact,
    /// NaN to NaN, zero past the row.
    fn check<W: Widen>() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let same =
            |w: f32, h: f16| w.to_bits() == h.to_f32().to_bits() || (w.is_nan() && h.is_nan());
        for run in all.chunks_exact(LANES) {
            // SAFETY: the caller checked `W`'s features.
            let wide = unsafe { W::lanes(run.try_into().unwrap()) };
            assert!(wide.iter().zip(run).all(|(&w, &h)| same(w, h)), "{run:?}");
        }
        let row = &all[1000..1000 + 37];
        for at in [0, 5, 16, 21, 32, 40] {
            // SAFETY: as above.
            let wide = unsafe { runs::<W, 2>(row, at) };
            let wide = wide.as_flattened();
            for (k, &w) in wide.iter().enumerate() {
                match row.get(at + k) {
                    Some(&h) => assert!(same(w, h), "{at} {k}"),
                    None => assert_eq!(w.to_bits(), 0, "{at} {k}"),
                }
            }
        }
    }

    #[test]
    fn widening_is_exact_for_every_half_and_zero_past_the_row() {
        check::<Plain>();
        #[cfg(target_arch = "x86_64")]
        if crate::isa::avx2() {
            check::<F16c>();
        }
        #[cfg(target_arch = "x86_64")]
        if crate::isa::avx512() {
            check::<F16c512>();
        }
    }
}
