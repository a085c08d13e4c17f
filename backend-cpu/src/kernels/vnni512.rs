//! The [`super::avx2`] tiles at 512 bits, for CPUs with AVX-512 VNNI: two groups side by side
//! (sixteen rows) in each register, so one `vpdpbusd` adds four products for sixteen rows and
//! the per-token scaling steps serve sixteen rows at once. The instruction count of a
//! multi-token tile, which bounds decode steps of several sequences and prompts, halves; each
//! lane still runs its row's reference steps in the reference order (exact integer block sums,
//! then the same f32 multiply and fused multiply-adds), so the results are the 256-bit tiles'
//! bits, and the scalar oracle's.
#![allow(unused_unsafe)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx2::{
    Call, Width, group_tiles, iq4nl_grid, load_f16x8, prefetch_ahead, store_rows, tile,
};
use super::formats::LegacyType;
use super::packed::group_layout;
use super::{ActBlock, GROUP, Legacy, MAX_COLS, PackedRows, TokenOutputs};

/// Tokens of the widest 512-bit tile: AVX-512's 32 registers hold its eight accumulators, eight
/// offset sums and eight code vectors, so each weight block is unpacked once for eight tokens.
const WIDE_COLS: usize = 8;

/// Covers the groups two at a time with sixteen-row tiles, and an odd last group with the
/// 256-bit tiles (`out[c][r]`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
pub(super) unsafe fn tiles<F: LegacyType, A: ActBlock>(
    call: &Call<'_, A>,
    groups: Range<usize>,
    out: TokenOutputs<'_, '_>,
) {
    let first_row = groups.start * GROUP;
    for g in groups.clone().step_by(2) {
        let at = g * GROUP - first_row;
        // SAFETY: the caller guarantees the features and the shapes.
        unsafe {
            if g + 1 == groups.end {
                group_tiles::<F, A, true>(call, g, at, out);
            } else {
                pair_tiles::<F, A>(call, g, at, out);
            }
        }
    }
}

/// Groups `g` and `g + 1` × every token in tiles of [`WIDE_COLS`], [`MAX_COLS`], 2 and 1
/// tokens, into rows `at..` of each token's outputs.
#[inline(always)]
unsafe fn pair_tiles<F: LegacyType, A: ActBlock>(
    call: &Call<'_, A>,
    g: usize,
    at: usize,
    out: TokenOutputs<'_, '_>,
) {
    let cols = call.cols;
    let mut c = 0;
    // SAFETY: the caller guarantees the features and the shapes.
    unsafe {
        while c + WIDE_COLS <= cols {
            store_pair(&tile::<Zmm, F, A, WIDE_COLS>(call, g, c), c, at, out);
            c += WIDE_COLS;
        }
        if c + MAX_COLS <= cols {
            store_pair(&tile::<Zmm, F, A, MAX_COLS>(call, g, c), c, at, out);
            c += MAX_COLS;
        }
        if c + 2 <= cols {
            store_pair(&tile::<Zmm, F, A, 2>(call, g, c), c, at, out);
            c += 2;
        }
        if c < cols {
            store_pair(&tile::<Zmm, F, A, 1>(call, g, c), c, at, out);
        }
    }
}

/// Writes tokens `c..`'s sums of a two-group tile into rows `at..` of their outputs, leaving
/// out padding rows. A function, not a closure: a closure is not compiled with the caller's
/// target features, and the intrinsics in it would stay calls.
#[inline(always)]
unsafe fn store_pair(sums: &[__m512], c: usize, at: usize, out: TokenOutputs<'_, '_>) {
    for (&sum, token) in sums.iter().zip(&mut out[c..]) {
        let live = (2 * GROUP).min(token.len() - at);
        let (low, high) = token[at..][..live].split_at_mut(live.min(GROUP));
        // SAFETY: AVX-512F is enabled in every caller.
        unsafe {
            store_rows(_mm512_castps512_ps256(sum), low);
            if !high.is_empty() {
                let upper = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(sum));
                store_rows(_mm256_castpd_ps(upper), high);
            }
        }
    }
}

/// Two 256-bit vectors at `low` and `high` as one 512-bit vector (`low` in lanes 0..8).
#[inline(always)]
unsafe fn pair(low: *const u8, high: *const u8) -> __m512i {
    // SAFETY: the callers pass 32 readable bytes at each.
    unsafe {
        let low = _mm512_castsi256_si512(_mm256_loadu_si256(low.cast()));
        _mm512_inserti64x4::<1>(low, _mm256_loadu_si256(high.cast()))
    }
}

/// Eight f16 scales at each of `low` and `high` as sixteen f32.
#[inline(always)]
unsafe fn scales(low: *const u8, high: *const u8) -> __m512 {
    // SAFETY: the callers pass 16 readable bytes at each.
    unsafe {
        let low = _mm512_castpd256_pd512(_mm256_castps_pd(load_f16x8(low)));
        let both = _mm512_insertf64x4::<1>(low, _mm256_castps_pd(load_f16x8(high)));
        _mm512_castpd_ps(both)
    }
}

/// The eight quant vectors of the group-blocks at `low` and `high`, side by side: unsigned
/// codes (Q8_0's and IQ4_NL's with the sign bit flipped), as [`super::avx2`]'s `codes` makes
/// them.
#[inline(always)]
unsafe fn codes<F: LegacyType>(low: *const u8, high: *const u8) -> [__m512i; 8] {
    let format = F::FORMAT;
    let layout = group_layout(format);
    // SAFETY: `low` and `high` point at whole group-blocks of `format`.
    unsafe {
        let (lq, hq) = (low.add(layout.qs), high.add(layout.qs));
        let mut codes = [_mm512_setzero_si512(); 8];
        if format == Legacy::Q8_0 {
            let flip = _mm512_set1_epi8(i8::MIN);
            for (k, code) in codes.iter_mut().enumerate() {
                *code = _mm512_xor_si512(pair(lq.add(32 * k), hq.add(32 * k)), flip);
            }
            return codes;
        }
        let mask = _mm512_set1_epi8(0x0F);
        for p in 0..4 {
            let v = pair(lq.add(32 * p), hq.add(32 * p));
            codes[p] = _mm512_and_si512(v, mask);
            codes[p + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask);
        }
        if format == Legacy::Iq4Nl {
            let grid = _mm512_broadcast_i32x4(_mm256_castsi256_si128(iq4nl_grid::<true>()));
            for code in &mut codes {
                *code = _mm512_shuffle_epi8(grid, *code);
            }
        }
        if let Some(at) = layout.h {
            let h = pair(low.add(at), high.add(at));
            let bit4 = _mm512_set1_epi8(0x10);
            for (k, code) in codes.iter_mut().enumerate() {
                // Bit k of each byte of h to bit 4 (16-bit shifts; the mask drops what crosses
                // a byte boundary).
                let moved = match k {
                    0 => _mm512_slli_epi16::<4>(h),
                    1 => _mm512_slli_epi16::<3>(h),
                    2 => _mm512_slli_epi16::<2>(h),
                    3 => _mm512_slli_epi16::<1>(h),
                    4 => h,
                    5 => _mm512_srli_epi16::<1>(h),
                    6 => _mm512_srli_epi16::<2>(h),
                    _ => _mm512_srli_epi16::<3>(h),
                };
                *code = _mm512_or_si512(*code, _mm512_and_si512(moved, bit4));
            }
        }
        codes
    }
}

/// `start + Σ_k codes[k] · quad k of y` per lane, exactly (`vpdpbusd` in two chains).
#[inline(always)]
unsafe fn block_isum(codes: &[__m512i; 8], y: &[i8; 32], start: __m512i) -> __m512i {
    // SAFETY: the callers guarantee AVX-512 VNNI; `y` holds 32 bytes.
    unsafe {
        let quad =
            |k: usize| _mm512_set1_epi32(y.as_ptr().add(4 * k).cast::<i32>().read_unaligned());
        let (mut even, mut odd) = (start, _mm512_setzero_si512());
        for k in (0..8).step_by(2) {
            even = _mm512_dpbusd_epi32(even, codes[k], quad(k));
            odd = _mm512_dpbusd_epi32(odd, codes[k + 1], quad(k + 1));
        }
        _mm512_add_epi32(even, odd)
    }
}

/// Two groups side by side at 512 bits, with VNNI integer dots.
struct Zmm;

impl Width for Zmm {
    type F = __m512;
    type I = __m512i;
    type At = (*const u8, *const u8);
    const VNNI: bool = true;

    #[inline(always)]
    unsafe fn at(w: &PackedRows, g: usize, offset: usize) -> Self::At {
        // SAFETY: the callers pass an offset inside the groups.
        unsafe {
            (
                w.group(g).as_ptr().add(offset),
                w.group(g + 1).as_ptr().add(offset),
            )
        }
    }
    #[inline(always)]
    unsafe fn prefetch((low, high): Self::At, bytes: usize) {
        prefetch_ahead(low, bytes);
        prefetch_ahead(high, bytes);
    }
    #[inline(always)]
    unsafe fn scales((low, high): Self::At, offset: usize) -> __m512 {
        // SAFETY: the callers pass the offset of eight scales inside the group-blocks.
        unsafe { scales(low.add(offset), high.add(offset)) }
    }
    #[inline(always)]
    unsafe fn codes<F: LegacyType>((low, high): Self::At) -> [__m512i; 8] {
        // SAFETY: forwarded from the caller.
        unsafe { codes::<F>(low, high) }
    }
    #[inline(always)]
    unsafe fn isum<F: LegacyType>(codes: &[__m512i; 8], y: &[i8; 32], start: i32) -> __m512i {
        // SAFETY: forwarded from the caller.
        unsafe { block_isum(codes, y, _mm512_set1_epi32(start)) }
    }
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn step(acc: __m512, isum: __m512i, d_w: __m512, d: f32) -> __m512 {
        // SAFETY: the callers guarantee AVX-512F.
        unsafe {
            let scale = _mm512_mul_ps(d_w, _mm512_set1_ps(d));
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc)
        }
    }
    #[inline(always)]
    unsafe fn offset(offsets: __m512, m_w: __m512, s: f32) -> __m512 {
        unsafe { _mm512_fmadd_ps(m_w, _mm512_set1_ps(s), offsets) }
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_add_ps(a, b) }
    }
}
