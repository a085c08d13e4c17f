//! The k-quant kernels for AVX2 and AVX-512 VNNI (256-bit) in one generic body: register
//! tiles of `R` weight rows against `C` activation rows (tokens), bit-identical to
//! [`super::scalar`] for every tile shape.
//!
//! Per super-block and (row, token), the integer sums are exact, so computing them in any
//! order gives the reference's `isum` and `msum`: each sub-block's codes are multiplied by the
//! activation bytes with `vpmaddubsw` (u8 × i8 pair sums, exact: at most `2 · 63 · 128` in
//! magnitude for these unsigned codes), then by the sub-block's scale with `vpmaddwd` (AVX2)
//! or `vpdpwssd` (VNNI, the multiply and the add in one instruction) into one i32
//! accumulator per tile cell. Per lane and super-block, Q4_K/Q5_K add at most
//! `8 · 63 · 2 · 7936 < 2^23`, Q6_K (whose `(q − 32)·y` pairs, at most `2 · 32 · 128`, come
//! from two exact `vpmaddubsw`) at most `8 · 128 · 2 · 8192 = 2^24`. The Q4_K/Q5_K mins go
//! through `vpmaddwd` of the activation's `bsums` by the mins repeated per pair (at most
//! `2 · 32768 · 63` per lane). IQ4_XS's signed grid values go through `vpmaddubsw` with the
//! activations' magnitudes ([`iq4_xs`]), and so do IQ3_S's and IQ3_XXS's signed grid magnitudes
//! ([`iq3_s`], [`iq3_xxs`]);
//! Q2_K's 2-bit codes and 4-bit scales and mins take Q4_K's path ([`q2_k`]). Then the very
//! scalar f32 step of [`super::k_quants`].
//!
//! A tile unpacks each weight super-block once for its `C` tokens and loads each activation
//! block once for its `R` rows; every row prefetches the super-blocks ahead of it, as several
//! interleaved row streams defeat the hardware prefetchers.
#![allow(unused_unsafe)]

mod iq3_s;
mod iq3_xxs;
mod iq4_xs;
mod q2_k;
mod q3_k;

use std::arch::x86_64::*;

use super::k_quants::{k_step, scales_mins};
use super::{BlockQ8K, KQuant, f16_le};
use crate::kernels::formats::{self, KType};

/// Runs the fastest SIMD body this CPU has; `false` (nothing written) without AVX2, FMA and
/// F16C. Shapes must have been checked: `rows` holds `out.len() / cols` rows of `row_bytes`,
/// `a` holds `cols` rows of `row_bytes / format.block_bytes()` blocks.
pub(super) fn dot_rows(
    format: KQuant,
    rows: &[u8],
    row_bytes: usize,
    a: &[BlockQ8K],
    cols: usize,
    out: &mut [f32],
) -> bool {
    if !crate::isa::avx2() {
        return false;
    }
    let vnni = crate::isa::vnni();
    macro_rules! run {
        ($format:ty) => {
            // SAFETY: the features were detected above; the caller checked the shapes.
            unsafe {
                if vnni && cols >= WIDE_COLS {
                    tiles_vnni_wide::<$format>(rows, row_bytes, a, cols, out)
                } else if vnni {
                    tiles_vnni::<$format>(rows, row_bytes, a, cols, out)
                } else {
                    tiles_avx2::<$format>(rows, row_bytes, a, cols, out)
                }
            }
        };
    }
    match format {
        KQuant::Q2K => run!(formats::Q2K),
        KQuant::Q3K => run!(formats::Q3K),
        KQuant::Q4K => run!(formats::Q4K),
        KQuant::Q5K => run!(formats::Q5K),
        KQuant::Q6K => run!(formats::Q6K),
        KQuant::Iq4Xs => run!(formats::Iq4Xs),
        KQuant::Iq3S => run!(formats::Iq3S),
        KQuant::Iq3Xxs => run!(formats::Iq3Xxs),
    }
    true
}

/// One row against one token with the VNNI body if `vnni`, else AVX2; `None` where the CPU
/// lacks the features or the lengths do not match.
pub(super) fn one(format: KQuant, vnni: bool, w: &[u8], a: &[BlockQ8K]) -> Option<f32> {
    let available = if vnni {
        crate::isa::active() == crate::isa::Isa::Avx512Vnni
    } else {
        crate::isa::avx2()
    };
    if !available || a.len().checked_mul(format.block_bytes()) != Some(w.len()) {
        return None;
    }
    let mut out = [0.0];
    macro_rules! run {
        ($format:ty) => {
            // SAFETY: the features were detected just now; the caller checked the lengths.
            unsafe {
                if vnni {
                    tiles_vnni::<$format>(w, w.len(), a, 1, &mut out)
                } else {
                    tiles_avx2::<$format>(w, w.len(), a, 1, &mut out)
                }
            }
        };
    }
    match format {
        KQuant::Q2K => run!(formats::Q2K),
        KQuant::Q3K => run!(formats::Q3K),
        KQuant::Q4K => run!(formats::Q4K),
        KQuant::Q5K => run!(formats::Q5K),
        KQuant::Q6K => run!(formats::Q6K),
        KQuant::Iq4Xs => run!(formats::Iq4Xs),
        KQuant::Iq3S => run!(formats::Iq3S),
        KQuant::Iq3Xxs => run!(formats::Iq3Xxs),
    }
    Some(out[0])
}

/// The one-row Q2_K × Q8_K dot of [`super::scalar`] with the VNNI or AVX2 body (as
/// [`crate::isa`] says); `None` below AVX2.
pub(super) fn q2_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> Option<f32> {
    one(KQuant::Q2K, crate::isa::vnni(), w, a)
}

/// The one-row Q3_K × Q8_K dot of [`super::scalar`] with the VNNI or AVX2 body (as
/// [`crate::isa`] says); `None` below AVX2.
pub(super) fn q3_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> Option<f32> {
    one(KQuant::Q3K, crate::isa::vnni(), w, a)
}

/// The one-row Q4_K × Q8_K dot of [`super::scalar`] with the VNNI or AVX2 body (as
/// [`crate::isa`] says); `None` below AVX2.
pub(super) fn q4_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> Option<f32> {
    one(KQuant::Q4K, crate::isa::vnni(), w, a)
}

/// [`q4_k_q8_k`] for Q5_K.
pub(super) fn q5_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> Option<f32> {
    one(KQuant::Q5K, crate::isa::vnni(), w, a)
}

/// [`q4_k_q8_k`] for Q6_K.
pub(super) fn q6_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> Option<f32> {
    one(KQuant::Q6K, crate::isa::vnni(), w, a)
}

/// [`q4_k_q8_k`] for IQ4_XS.
pub(super) fn iq4_xs_q8_k(w: &[u8], a: &[BlockQ8K]) -> Option<f32> {
    one(KQuant::Iq4Xs, crate::isa::vnni(), w, a)
}

/// [`q4_k_q8_k`] for IQ3_S.
pub(super) fn iq3_s_q8_k(w: &[u8], a: &[BlockQ8K]) -> Option<f32> {
    one(KQuant::Iq3S, crate::isa::vnni(), w, a)
}

/// [`q4_k_q8_k`] for IQ3_XXS.
pub(super) fn iq3_xxs_q8_k(w: &[u8], a: &[BlockQ8K]) -> Option<f32> {
    one(KQuant::Iq3Xxs, crate::isa::vnni(), w, a)
}

/// [`tiles`] compiled for AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiles_avx2<F: KType>(
    rows: &[u8],
    row_bytes: usize,
    a: &[BlockQ8K],
    cols: usize,
    out: &mut [f32],
) {
    // SAFETY: forwarded from the caller.
    unsafe { tiles::<F, false, false>(rows, row_bytes, a, cols, out) }
}

/// [`tiles`] compiled for AVX-512 VNNI (256-bit).
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn tiles_vnni<F: KType>(
    rows: &[u8],
    row_bytes: usize,
    a: &[BlockQ8K],
    cols: usize,
    out: &mut [f32],
) {
    // SAFETY: forwarded from the caller.
    unsafe { tiles::<F, true, false>(rows, row_bytes, a, cols, out) }
}

/// [`tiles`] with the wide prefill tile, compiled for AVX-512 VNNI: a function of its own, so
/// the decode loops keep their code generation (as in `crate::kernels`, where the wide tile
/// inlined beside them made decode ≈ 30 % slower).
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn tiles_vnni_wide<F: KType>(
    rows: &[u8],
    row_bytes: usize,
    a: &[BlockQ8K],
    cols: usize,
    out: &mut [f32],
) {
    // SAFETY: forwarded from the caller.
    unsafe { tiles::<F, true, true>(rows, row_bytes, a, cols, out) }
}

/// Tokens a prefill tile covers.
const TILE_COLS: usize = 4;
/// Tokens of the prefill tile on VNNI CPUs, whose 32 vector registers hold its 16
/// accumulators.
const WIDE_COLS: usize = 8;
/// Rows a prefill tile covers.
const TILE_ROWS: usize = 2;
/// Super-blocks ahead of the current one each row prefetches.
const PREFETCH_BLOCKS: usize = 4;

/// Covers the `rows × cols` outputs with tiles: [`TILE_ROWS`] × [`WIDE_COLS`] (VNNI) or
/// [`TILE_COLS`] where the shape allows (prefill), single rows for the rest and for decode.
#[inline(always)]
unsafe fn tiles<F: KType, const VNNI: bool, const WIDE: bool>(
    rows: &[u8],
    row_bytes: usize,
    a: &[BlockQ8K],
    cols: usize,
    out: &mut [f32],
) {
    let n_rows = out.len() / cols;
    let blocks = a.len() / cols;
    let row = |r: usize| &rows[r * row_bytes..(r + 1) * row_bytes];
    let col = |c: usize| &a[c * blocks..(c + 1) * blocks];
    // SAFETY: the caller guarantees the features and the shapes.
    unsafe {
        let mut r = 0;
        while r < n_rows {
            let height = if cols >= TILE_COLS && r + TILE_ROWS <= n_rows {
                TILE_ROWS
            } else {
                1
            };
            let mut c = 0;
            while WIDE && height == TILE_ROWS && c + WIDE_COLS <= cols {
                let group: [&[BlockQ8K]; WIDE_COLS] = std::array::from_fn(|k| col(c + k));
                let sums = tile::<F, VNNI, TILE_ROWS, WIDE_COLS>([row(r), row(r + 1)], group);
                for (i, sums) in sums.iter().enumerate() {
                    out[(r + i) * cols + c..][..WIDE_COLS].copy_from_slice(sums);
                }
                c += WIDE_COLS;
            }
            while c + TILE_COLS <= cols {
                let group = [col(c), col(c + 1), col(c + 2), col(c + 3)];
                if height == TILE_ROWS {
                    let sums = tile::<F, VNNI, TILE_ROWS, TILE_COLS>([row(r), row(r + 1)], group);
                    for (i, sums) in sums.iter().enumerate() {
                        out[(r + i) * cols + c..][..TILE_COLS].copy_from_slice(sums);
                    }
                } else {
                    let sums = tile::<F, VNNI, 1, TILE_COLS>([row(r)], group);
                    out[r * cols + c..][..TILE_COLS].copy_from_slice(&sums[0]);
                }
                c += TILE_COLS;
            }
            for rr in r..r + height {
                for cc in c..cols {
                    out[rr * cols + cc] = tile::<F, VNNI, 1, 1>([row(rr)], [col(cc)])[0][0];
                }
            }
            r += height;
        }
    }
}

/// `acc + Σ pairs·scale` per i32 lane (exact for the module's bounds).
#[inline(always)]
unsafe fn scaled_add<const VNNI: bool>(acc: __m256i, pairs: __m256i, scale: __m256i) -> __m256i {
    unsafe {
        if VNNI {
            _mm256_dpwssd_epi32(acc, pairs, scale)
        } else {
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, scale))
        }
    }
}

/// The 32 bytes of `b` at `off`; zeros if they are not all inside `b` (never the case for the
/// callers' offsets inside checked blocks, where the check folds away).
#[inline(always)]
unsafe fn load32<T: Copy>(b: &[T], off: usize) -> __m256i {
    const { assert!(size_of::<T>() == 1) };
    match b.get(off..off.saturating_add(32)) {
        // SAFETY: `T` is one byte, so the 32 bytes lie inside `b`; no alignment needed.
        Some(s) => unsafe { _mm256_loadu_si256(s.as_ptr().cast()) },
        None => unsafe { _mm256_setzero_si256() },
    }
}

/// Eight bytes widened to i16 (sign-extended if `signed`), in both 128-bit halves.
#[inline(always)]
unsafe fn both_halves(bytes: [u8; 8], signed: bool) -> __m256i {
    unsafe {
        let b = _mm_cvtsi64_si128(i64::from_le_bytes(bytes));
        let v = if signed {
            _mm_cvtepi8_epi16(b)
        } else {
            _mm_cvtepu8_epi16(b)
        };
        _mm256_broadcastsi128_si256(v)
    }
}

/// i16 lane `lo` of `v` (from [`both_halves`]) in the lower 128 bits, lane `hi` in the upper.
#[inline(always)]
unsafe fn pick(v: __m256i, lo: usize, hi: usize) -> __m256i {
    let byte_pair = |j: usize| (2 * j) as i16 | (((2 * j + 1) as i16) << 8);
    unsafe {
        let mask = _mm256_set_m128i(_mm_set1_epi16(byte_pair(hi)), _mm_set1_epi16(byte_pair(lo)));
        _mm256_shuffle_epi8(v, mask)
    }
}

/// Lanes 0 and 1 of the result: the exact sums of the eight lanes of `a` and of `b`.
#[inline(always)]
unsafe fn sum_pair(a: __m256i, b: __m256i) -> (i32, i32) {
    unsafe {
        let h = _mm256_hadd_epi32(a, b);
        let h = _mm256_hadd_epi32(h, h);
        let t = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
        (_mm_cvtsi128_si32(t), _mm_extract_epi32::<1>(t))
    }
}

/// The exact sum of the eight lanes of each (row, token) accumulator. Plain loops, not
/// `std::array::from_fn`: a closure does not inherit the tiles' target features, and where it
/// was not inlined (the 2 × 4 tiles) every intrinsic in it became a call passing vectors
/// through memory, making the tiled Q6_K, IQ4_XS and IQ3_S prefill slower than one row × token
/// per call.
#[inline(always)]
unsafe fn lane_sums<const R: usize, const C: usize>(acc: [[__m256i; C]; R]) -> [[i32; C]; R] {
    let mut sums = [[0; C]; R];
    for (row, acc) in sums.iter_mut().zip(&acc) {
        for (sum, &lanes) in row.iter_mut().zip(acc) {
            // SAFETY: only reached from the tiles, whose callers guarantee AVX2.
            *sum = unsafe { sum_pair(lanes, _mm256_setzero_si256()).0 };
        }
    }
    sums
}

/// Asks for the super-block [`PREFETCH_BLOCKS`] ahead of block `i` of `row`, a line every 64
/// bytes (its last line, if it reaches one more, shares the next block's first).
#[inline(always)]
fn prefetch(row: &[u8], i: usize, block_bytes: usize) {
    let ahead = row
        .as_ptr()
        .wrapping_add((i + PREFETCH_BLOCKS) * block_bytes);
    let mut line = 0;
    while line < block_bytes {
        // SAFETY: a prefetch never faults, whatever the address; SSE is baseline on x86_64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast()) };
        line += 64;
    }
}

/// `R` rows against `C` tokens: `R·C` independent sums, each in the reference's order.
#[inline(always)]
unsafe fn tile<F: KType, const VNNI: bool, const R: usize, const C: usize>(
    rows: [&[u8]; R],
    cols: [&[BlockQ8K]; C],
) -> [[f32; C]; R] {
    let format = F::FORMAT;
    let bytes = format.block_bytes();
    let mut sums = [[0.0f32; C]; R];
    // SAFETY: only reached from `tiles`, whose callers guarantee the features.
    unsafe {
        for i in 0..cols[0].len() {
            let w: [&[u8]; R] = std::array::from_fn(|r| &rows[r][i * bytes..(i + 1) * bytes]);
            for row in rows {
                prefetch(row, i, bytes);
            }
            let a: [&BlockQ8K; C] = std::array::from_fn(|c| &cols[c][i]);
            if matches!(
                format,
                KQuant::Q6K | KQuant::Q3K | KQuant::Iq4Xs | KQuant::Iq3S | KQuant::Iq3Xxs
            ) {
                let (isums, d_at) = match format {
                    KQuant::Q6K => (q6_isums::<VNNI, R, C>(w, a), 208),
                    KQuant::Q3K => (q3_k::isums::<VNNI, R, C>(w, a), 108),
                    KQuant::Iq3S => (iq3_s::isums::<iq3_s::Iq3S, _, VNNI, R, C>(w, a), 0),
                    KQuant::Iq3Xxs => (iq3_s::isums::<iq3_xxs::Iq3Xxs, _, VNNI, R, C>(w, a), 0),
                    _ => (iq4_xs::isums::<VNNI, R, C>(w, a), 0),
                };
                for r in 0..R {
                    let d = f16_le([w[r][d_at], w[r][d_at + 1]]);
                    for c in 0..C {
                        sums[r][c] += (d * a[c].d) * isums[r][c] as f32;
                    }
                }
            } else {
                let ((isums, msums), d_at) = match format {
                    KQuant::Q2K => (q2_k::isums::<VNNI, R, C>(w, a), 80),
                    _ => (k_isums::<VNNI, R, C>(w, a, format == KQuant::Q5K), 0),
                };
                for r in 0..R {
                    let d = f16_le([w[r][d_at], w[r][d_at + 1]]);
                    let dmin = f16_le([w[r][d_at + 2], w[r][d_at + 3]]);
                    for c in 0..C {
                        sums[r][c] = k_step(sums[r][c], d, dmin, a[c].d, isums[r][c], msums[r][c]);
                    }
                }
            }
        }
    }
    if format == KQuant::Iq3Xxs {
        // ggml's final quarter of IQ3_XXS (see `super::k_quants::iq3_xxs_q8_k`).
        for sum in sums.iter_mut().flatten() {
            *sum *= 0.25;
        }
    }
    sums
}

/// `isum` and `msum` of one Q4_K (or, if `five`, Q5_K) super-block per (row, token).
#[inline(always)]
unsafe fn k_isums<const VNNI: bool, const R: usize, const C: usize>(
    w: [&[u8]; R],
    a: [&BlockQ8K; C],
    five: bool,
) -> ([[i32; C]; R], [[i32; C]; R]) {
    // Offsets inside the super-block: quants after the scales (and Q5_K's 32 fifth-bit bytes).
    let (qs, qh) = if five { (48, 16) } else { (16, 0) };
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        let two = _mm256_set1_epi8(2);
        let mut scales = [_mm256_setzero_si256(); R];
        let mut mins = [_mm256_setzero_si256(); R];
        let mut h = [_mm256_setzero_si256(); R];
        for r in 0..R {
            let (sc, m) = scales_mins::<16>(w[r][..16].try_into().unwrap_or(&[0; 16]));
            scales[r] = both_halves(sc, false);
            // Each min twice, for the two `bsums` of its sub-block.
            let m = _mm_cvtsi64_si128(i64::from_le_bytes(m));
            mins[r] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
            if five {
                h[r] = load32(w[r], qh);
            }
        }
        let zero = _mm256_setzero_si256();
        let mut acc = [[zero; C]; R];
        for p in 0..4 {
            // Sub-blocks 2p (low nibbles) and 2p + 1 (high nibbles) of every row.
            let mut codes = [[zero; 2]; R];
            let mut sc = [[zero; 2]; R];
            for r in 0..R {
                let q = load32(w[r], qs + 32 * p);
                let mut lo = _mm256_and_si256(q, mask);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), mask);
                if five {
                    // Bits 0 and 1 of each byte of `h` are the fifth bits of sub-blocks 2p and
                    // 2p + 1; the 16-bit shifts drag bits across bytes only into bits the
                    // masks drop.
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(_mm256_and_si256(h[r], one)));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16::<3>(_mm256_and_si256(h[r], two)));
                    h[r] = _mm256_srli_epi16::<2>(h[r]);
                }
                codes[r] = [lo, hi];
                sc[r] = [
                    pick(scales[r], 2 * p, 2 * p),
                    pick(scales[r], 2 * p + 1, 2 * p + 1),
                ];
            }
            for c in 0..C {
                for s in 0..2 {
                    let y = load32(&a[c].qs, 64 * p + 32 * s);
                    for r in 0..R {
                        let pairs = _mm256_maddubs_epi16(codes[r][s], y);
                        acc[r][c] = scaled_add::<VNNI>(acc[r][c], pairs, sc[r][s]);
                    }
                }
            }
        }
        let mut isums = [[0; C]; R];
        let mut msums = [[0; C]; R];
        for c in 0..C {
            let bsums = _mm256_loadu_si256(a[c].bsums.as_ptr().cast());
            for r in 0..R {
                let m = _mm256_madd_epi16(bsums, mins[r]);
                (isums[r][c], msums[r][c]) = sum_pair(acc[r][c], m);
            }
        }
        (isums, msums)
    }
}

/// `v` shifted right by `bits` (0..8) in 16-bit lanes; the callers' masks drop the bits that
/// cross from one byte into the other.
#[inline(always)]
unsafe fn shift_right(v: __m256i, bits: usize) -> __m256i {
    unsafe { _mm256_srl_epi16(v, _mm_cvtsi32_si128(bits as i32)) }
}

/// Adds the pair sums of the unsigned codes `q[r]` with the activations `a[c].qs[at..at + 32]`
/// (`vpmaddubsw`), scaled per pair by `sc[r]`, into `acc[r][c]`: the inner loop of the
/// two-bit-code formats (Q2_K, Q3_K).
#[inline(always)]
unsafe fn add_codes<const VNNI: bool, const R: usize, const C: usize>(
    acc: &mut [[__m256i; C]; R],
    q: &[__m256i; R],
    sc: &[__m256i; R],
    a: [&BlockQ8K; C],
    at: usize,
) {
    unsafe {
        for c in 0..C {
            let y = load32(&a[c].qs, at);
            for r in 0..R {
                let pairs = _mm256_maddubs_epi16(q[r], y);
                acc[r][c] = scaled_add::<VNNI>(acc[r][c], pairs, sc[r]);
            }
        }
    }
}

/// `isum` of one Q6_K super-block per (row, token). Each half (128 elements) uses 64 bytes of
/// `ql` at `64h`, 32 of `qh` at `128 + 32h` and 8 scales at `192 + 8h`; its chunk `k` takes
/// nibble `k / 2` of `ql[l + 32 (k % 2)]` and bits `2k..2k + 2` of `qh[l]` (moved to bits 4..6
/// by 16-bit shifts whose strays the mask drops), with scale `2k` for elements 0..16 and
/// `2k + 1` for 16..32.
#[inline(always)]
unsafe fn q6_isums<const VNNI: bool, const R: usize, const C: usize>(
    w: [&[u8]; R],
    a: [&BlockQ8K; C],
) -> [[i32; C]; R] {
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        let top = _mm256_set1_epi8(0x30);
        let m32 = _mm256_set1_epi8(32);
        let zero = _mm256_setzero_si256();
        let mut acc = [[zero; C]; R];
        for half in 0..2 {
            let mut scales = [zero; R];
            for r in 0..R {
                let mut bytes = [0; 8];
                bytes.copy_from_slice(&w[r][192 + 8 * half..200 + 8 * half]);
                scales[r] = both_halves(bytes, true);
            }
            for k in 0..4 {
                let mut q = [zero; R];
                let mut sc = [zero; R];
                for r in 0..R {
                    let ql = load32(w[r], 64 * half + 32 * (k % 2));
                    let qh = load32(w[r], 128 + 32 * half);
                    let (low, high) = match k {
                        0 => (ql, _mm256_slli_epi16::<4>(qh)),
                        1 => (ql, _mm256_slli_epi16::<2>(qh)),
                        2 => (_mm256_srli_epi16::<4>(ql), qh),
                        _ => (_mm256_srli_epi16::<4>(ql), _mm256_srli_epi16::<2>(qh)),
                    };
                    q[r] =
                        _mm256_or_si256(_mm256_and_si256(low, mask), _mm256_and_si256(high, top));
                    sc[r] = pick(scales[r], 2 * k, 2 * k + 1);
                }
                for c in 0..C {
                    let y = load32(&a[c].qs, 128 * half + 32 * k);
                    let offset = _mm256_maddubs_epi16(m32, y);
                    for r in 0..R {
                        let pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(q[r], y), offset);
                        acc[r][c] = scaled_add::<VNNI>(acc[r][c], pairs, sc[r]);
                    }
                }
            }
        }
        lane_sums(acc)
    }
}
