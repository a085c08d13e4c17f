//! The block loops, compiled for AVX-512 or AVX2 where the CPU has it (the rounding and
//! conversions then vectorize) and as plain code otherwise: the same IEEE operations on every
//! element either way, so the same bits (Rust never fuses a multiply and an add on its own).

use super::{
    BlockMeta, BlockQ8_0, BlockQ8_1, BlockQ8K, QK_K, QK8, amax, block_q8_0, block_q8_1, block_q8_k,
    meta_of, scale_of,
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

/// Block `i` of `out` and what goes beside it in `side` from elements `N·i..` of `x`, by
/// `block`; inlined into each loop, so it runs with that loop's features.
#[inline(always)]
fn each_block<T, M, const N: usize>(
    x: &[f32],
    (out, side): (&mut [T], &mut [M]),
    block: impl Fn(&[f32; N]) -> (T, M),
) {
    for ((x, o), m) in x.chunks_exact(N).zip(out.iter_mut()).zip(side.iter_mut()) {
        if let Ok(x) = <&[f32; N]>::try_from(x) {
            (*o, *m) = block(x);
        }
    }
}

/// [`each_block`] for blocks that need no scale first (Q8_K's).
#[inline(always)]
fn each_unscaled<T, M, const N: usize>(
    x: &[f32],
    out: (&mut [T], &mut [M]),
    block: impl Fn(&[f32; N], ()) -> (T, M),
) {
    each_block(x, out, |x| block(x, ()));
}

/// Blocks that to be quantized need their scale (`scale_of(amax)`): the scales of eight
/// blocks first, then their quants. A block's quants wait on its maximum and two divisions;
/// computed block after block, that chain filled the scheduler and the blocks hardly
/// overlapped (a Q8_1 block took about 60 cycles); apart, the quantizations of the eight
/// run independently. Each block's operations are unchanged, so are its bits.
#[inline(always)]
fn each_scaled<T, M>(
    x: &[f32],
    (out, side): (&mut [T], &mut [M]),
    block: impl Fn(&[f32; QK8], (f32, f32)) -> (T, M),
) {
    const AHEAD: usize = 8;
    let runs = x
        .chunks(AHEAD * QK8)
        .zip(out.chunks_mut(AHEAD))
        .zip(side.chunks_mut(AHEAD));
    for ((x, out), side) in runs {
        let mut scales = [(0.0, 0.0); AHEAD];
        for (scale, x) in scales.iter_mut().zip(x.chunks_exact(QK8)) {
            if let Ok(x) = <&[f32; QK8]>::try_from(x) {
                *scale = scale_of(amax(x));
            }
        }
        let blocks = x.chunks_exact(QK8).zip(out.iter_mut()).zip(side.iter_mut());
        for (((x, o), m), &scale) in blocks.zip(&scales) {
            if let Ok(x) = <&[f32; QK8]>::try_from(x) {
                (*o, *m) = block(x, scale);
            }
        }
    }
}

/// Defines `$name(x, out, side)`: `out`'s blocks and `side`'s metadata from `x` (see
/// [`each_block`]), by `$wide` in the AVX-512 loop, by `$fast` in the AVX2 loop and by
/// `$block` otherwise.
macro_rules! loops {
    ($name:ident, $each:ident, $block:ident, $fast:path, $wide:path, $ty:ty, $side:ty) => {
        pub(super) fn $name(x: &[f32], out: &mut [$ty], side: &mut [$side]) {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
            unsafe fn avx512_loop(x: &[f32], out: (&mut [$ty], &mut [$side])) {
                // SAFETY: this function's features (which the closure inherits) are those
                // `$wide` needs.
                $each(x, out, |x, s| unsafe { $wide(x, s) });
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn avx2_loop(x: &[f32], out: (&mut [$ty], &mut [$side])) {
                // SAFETY: as above, for `$fast`.
                $each(x, out, |x, s| unsafe { $fast(x, s) });
            }
            #[cfg(target_arch = "x86_64")]
            match level() {
                // SAFETY (each arm): the features were detected on this CPU.
                2 => return unsafe { avx512_loop(x, (out, side)) },
                1 => return unsafe { avx2_loop(x, (out, side)) },
                _ => {}
            }
            each_block(x, (out, side), $block);
        }
    };
}

loops!(
    q8_0,
    each_scaled,
    plain_q8_0,
    x86::block_q8_0::<false>,
    x86::block_q8_0::<true>,
    BlockQ8_0,
    BlockMeta
);
loops!(
    q8_1,
    each_scaled,
    plain_q8_1,
    x86::block_q8_1::<false>,
    x86::block_q8_1::<true>,
    BlockQ8_1,
    BlockMeta
);
loops!(
    q8_k,
    each_unscaled,
    unit_q8_k,
    plain_q8_k,
    plain_q8_k,
    BlockQ8K,
    ()
);

/// The plain Q8_0 block and its metadata.
#[inline(always)]
fn plain_q8_0(x: &[f32; QK8]) -> (BlockQ8_0, BlockMeta) {
    let block = block_q8_0(x);
    (block, meta_of(&block))
}

/// The plain Q8_1 block and its metadata.
#[inline(always)]
fn plain_q8_1(x: &[f32; QK8]) -> (BlockQ8_1, BlockMeta) {
    let block = block_q8_1(x);
    (block, meta_of(&block))
}

/// The Q8_K block, with nothing beside it.
#[inline(always)]
fn unit_q8_k(x: &[f32; QK_K]) -> (BlockQ8K, ()) {
    (block_q8_k(x), ())
}

/// Q8_K's block, which the compiler vectorizes well enough on its own.
#[inline(always)]
unsafe fn plain_q8_k(x: &[f32; QK_K], (): ()) -> (BlockQ8K, ()) {
    unit_q8_k(x)
}

/// The Q8_0 and Q8_1 blocks written with AVX2 or AVX-512 intrinsics (the compiler turns the
/// plain code's i32 → i8 narrowing and quant sum into byte-by-byte moves): [`super::quant`]'s
/// rounding lane by lane, for the scales `each_scaled` computed ahead, so the same bits.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::super::{BlockMeta, BlockQ8_0, BlockQ8_1, QK8};

    /// The block's quants and their sum for the reciprocal scale `id` (`scale_of`), with
    /// 256-bit vectors.
    #[inline(always)]
    unsafe fn quantize(x: &[f32; QK8], id: f32) -> ([i8; QK8], i32) {
        // SAFETY: the callers run with AVX2; `x` holds 32 floats.
        unsafe {
            let sign = _mm256_set1_ps(-0.0);
            let (id, half, unit) = (_mm256_set1_ps(id), _mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
            let (low, high) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
            let mut q = [_mm256_setzero_si256(); 4];
            for (k, q) in q.iter_mut().enumerate() {
                let v = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(8 * k)), id);
                let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
                let away =
                    _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_andnot_ps(sign, _mm256_sub_ps(v, t)), half);
                let step = _mm256_or_ps(unit, _mm256_and_ps(sign, v));
                let rounded = _mm256_blendv_ps(t, _mm256_add_ps(t, step), away);
                let finite = _mm256_and_ps(rounded, _mm256_cmp_ps::<_CMP_ORD_Q>(rounded, rounded));
                *q = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(finite, low), high));
            }
            let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
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
            let (id, half, unit) = (_mm512_set1_ps(id), _mm512_set1_ps(0.5), _mm512_set1_ps(1.0));
            let (low, high) = (_mm512_set1_ps(-128.0), _mm512_set1_ps(127.0));
            let mut q = [_mm512_setzero_si512(); 2];
            for (k, q) in q.iter_mut().enumerate() {
                let v = _mm512_mul_ps(_mm512_loadu_ps(x.as_ptr().add(16 * k)), id);
                let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
                let distance = _mm512_andnot_si512(sign, bits(_mm512_sub_ps(v, t)));
                let away = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_castsi512_ps(distance), half);
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

    /// `d` and `s` rounded to f16 as the blocks store them (to nearest, ties to even:
    /// `f16::from_f32`'s rounding, which is this instruction where the CPU has F16C), and
    /// those f16 values widened back, as [`BlockMeta`] holds them.
    #[inline(always)]
    unsafe fn scales(d: f32, s: f32) -> ([f16; 2], [f32; 2]) {
        // SAFETY: the callers run with F16C (and AVX2).
        unsafe {
            let halves = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_setr_ps(d, s, 0.0, 0.0));
            let wide = _mm_cvtph_ps(halves);
            let bits = _mm_cvtsi128_si32(halves) as u32;
            (
                [
                    f16::from_bits(bits as u16),
                    f16::from_bits((bits >> 16) as u16),
                ],
                [_mm_cvtss_f32(wide), _mm_cvtss_f32(_mm_movehdup_ps(wide))],
            )
        }
    }

    /// [`super::super::block_q8_0`] with AVX2 or, `WIDE`, AVX-512, and its [`BlockMeta`].
    #[inline(always)]
    pub(super) unsafe fn block_q8_0<const WIDE: bool>(
        x: &[f32; QK8],
        (d, id): (f32, f32),
    ) -> (BlockQ8_0, BlockMeta) {
        // SAFETY (both blocks): forwarded from the caller.
        let (qs, sum) = unsafe { quantize_with::<WIDE>(x, id) };
        let ([d16, _], [d, _]) = unsafe { scales(d, 0.0) };
        (BlockQ8_0 { d: d16, qs }, BlockMeta { d, s: 0.0, sum })
    }

    /// [`super::super::block_q8_1`] with AVX2 or, `WIDE`, AVX-512, and its [`BlockMeta`].
    #[inline(always)]
    pub(super) unsafe fn block_q8_1<const WIDE: bool>(
        x: &[f32; QK8],
        (d, id): (f32, f32),
    ) -> (BlockQ8_1, BlockMeta) {
        // SAFETY (both blocks): forwarded from the caller. The sum is at most 32 * 127 in
        // magnitude: exact in f32, as in the plain block.
        let (qs, sum) = unsafe { quantize_with::<WIDE>(x, id) };
        let ([d16, s16], [d, s]) = unsafe { scales(d, sum as f32 * d) };
        (BlockQ8_1 { d: d16, s: s16, qs }, BlockMeta { d, s, sum })
    }
}
