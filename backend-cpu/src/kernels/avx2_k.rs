//! AVX2 (+FMA, F16C) kernels over the packed k-quant layouts ([`super::packed_k`]), with
//! AVX-512 VNNI integer dots where the CPU has them, bit-identical to the k-quants' scalar
//! reference (`super::rows::scalar`): lane `r` of the integer sums is row `r`'s exact `isum`
//! and `msum`, and the f32 step is the reference's, eight rows at a time.
//!
//! Per sub-block, the unsigned codes (≤ 15) times the broadcast activation quads are summed
//! exactly per lane by `vpdpbusd`, or by `vpmaddubsw` pairs (four of them added in i16, at most
//! `8·15·128`) and `vpmaddwd` by ones; then multiplied by the row's 6-bit scale (`vpmulld`).
//! The mins: `vpmaddwd` of the rows' `(m_2q, m_2q+1)` pairs by the activation's pair sums
//! `(b_4q + b_4q+1, b_4q+2 + b_4q+3)`, which fit i16 for quantized activations (at most
//! `2·16·128`). Magnitudes as in the reference: `|isum| < 2^25`.
//!
//! Q6_K: the unsigned six-bit codes (≤ 63) go through the same dot (`vpmaddubsw` pairs two
//! groups at a time, at most `2·2·63·128` in i16), starting each 16-element sub-block's lane
//! sum at `−32·b_s` (the activation's sum over the sub-block, from `bsums`), so the sum is
//! the reference's exact `Σ (q − 32)·y`; then times the row's i8 scale. `|isum| < 2^28`.
//!
//! Q3_K likewise: the codes `q + 4` (≤ 7) through the same dot, each sub-block's lane sum
//! starting at `−4·b_s`, so it is the reference's exact `Σ (q + 4)·y − 4·b_s`; then times the
//! row's scale less 32 (i8).
//!
//! Q2_K: the 2-bit codes (≤ 3) through the same dot, each sub-block's sum times the row's
//! scale (the low nibble of its stored byte); the mins (the high nibbles) times the
//! activation's `bsums[s]` (`vpmulld`, at most `15·32768` each) into a second sum per lane,
//! `msum`; then Q4_K's f32 step. `|isum| < 2^21`, `|msum| < 2^23`.
//!
//! IQ4_XS: the indices become grid values by one `vpshufb` of the grid. With VNNI, the grid
//! holds the codes `v + 128` (`1..=241`, unsigned) and `vpdpbusd` sums them against the
//! activations from a lane start of `−128·(b_2ib + b_2ib+1)`, as Q6_K's offset; the AVX2
//! body, whose `vpmaddubsw` pairs could not hold `2·241·128`, multiplies the broadcast quad's
//! magnitudes (u8) by the signed values carrying its signs (i8), `|y|·sign(y)·v = v·y`, exact
//! for every byte (`|−128|` is 128 unsigned; no grid value is −128). Per 32-element sub-block
//! at most `32·241·128 + 128·65536 < 2^24`, then times the row's scale less 32.
#![allow(unused_unsafe)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx2::{dot_groups, iq4nl_grid, load_f16x8, signed_dot};
use super::packed::Packed;
use super::packed_k::{
    IQ4_QS, IQ4_SC, KLayout, Q2K_QS, Q2K_SC, Q3K_HM, Q3K_QS, Q3K_SC, Q4K_MINS, Q4K_QS, Q4K_SC,
    Q6K_QH, Q6K_QL, Q6K_SC,
};
use super::rows::KQuant;
use super::{GROUP, MAX_COLS, TokenOutputs};
use crate::isa::vnni;
use crate::quant::activation::BlockQ8K;

/// Runs the kernel of `F`; the caller checked the shapes and [`super::packed_k_available`].
pub(super) fn dot_packed_k<F: KLayout>(
    w: &Packed<F>,
    groups: Range<usize>,
    a: &[BlockQ8K],
    out: TokenOutputs<'_, '_>,
) {
    // SAFETY: AVX2, FMA and F16C were detected by the caller (`packed_k_available`), VNNI
    // here; the caller checked the shapes.
    unsafe {
        if vnni() {
            tiles_vnni(w, groups, a, out)
        } else {
            tiles_avx2(w, groups, a, out)
        }
    }
}

/// [`tiles`] compiled for AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiles_avx2<F: KLayout>(
    w: &Packed<F>,
    groups: Range<usize>,
    a: &[BlockQ8K],
    out: TokenOutputs<'_, '_>,
) {
    // SAFETY: forwarded from the caller.
    unsafe { tiles::<F, false>(w, groups, a, out) }
}

/// [`tiles`] compiled for AVX-512 VNNI (256-bit).
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn tiles_vnni<F: KLayout>(
    w: &Packed<F>,
    groups: Range<usize>,
    a: &[BlockQ8K],
    out: TokenOutputs<'_, '_>,
) {
    // SAFETY: forwarded from the caller.
    unsafe { tiles::<F, true>(w, groups, a, out) }
}

/// Each group's eight rows × `out.len()` tokens in tiles of [`MAX_COLS`], 2 and 1 tokens
/// (`out[c][r]`).
#[inline(always)]
unsafe fn tiles<F: KLayout, const VNNI: bool>(
    w: &Packed<F>,
    groups: Range<usize>,
    a: &[BlockQ8K],
    out: TokenOutputs<'_, '_>,
) {
    let first_row = groups.start * GROUP;
    let cols = out.len();
    // SAFETY: the caller guarantees the features and the shapes.
    unsafe {
        for g in groups {
            let at = g * GROUP - first_row;
            let mut store = |sums: &[__m256], c: usize| {
                for (&sum, token) in sums.iter().zip(&mut out[c..]) {
                    let live = GROUP.min(token.len() - at);
                    super::avx2::store_rows(sum, &mut token[at..][..live]);
                }
            };
            let mut c = 0;
            while c + MAX_COLS <= cols {
                store(&tile::<F, VNNI, MAX_COLS>(w, g, a, c), c);
                c += MAX_COLS;
            }
            if c + 2 <= cols {
                store(&tile::<F, VNNI, 2>(w, g, a, c), c);
                c += 2;
            }
            if c < cols {
                store(&tile::<F, VNNI, 1>(w, g, a, c), c);
            }
        }
    }
}

#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// Group `g`'s eight rows against tokens `c..c + C`.
#[inline(always)]
unsafe fn tile<F: KLayout, const VNNI: bool, const C: usize>(
    w: &Packed<F>,
    g: usize,
    a: &[BlockQ8K],
    c: usize,
) -> [__m256; C] {
    let blocks = w.blocks();
    let group = w.group(g);
    // SAFETY: the callers guarantee the features; `group` holds `blocks` group-super-blocks,
    // the activations `blocks` blocks per token (checked by `super::dot_packed_k`).
    unsafe {
        let mut sums = [_mm256_setzero_ps(); C];
        for i in 0..blocks {
            let gb = group.as_ptr().add(i * F::GROUP_BYTES);
            if C > 1 || F::FORMAT != KQuant::Q4K {
                super::avx2::prefetch_ahead(gb, F::GROUP_BYTES);
            }
            let y: [&BlockQ8K; C] = std::array::from_fn(|k| &a[(c + k) * blocks + i]);
            match F::FORMAT {
                KQuant::Q6K => q6_k_block::<VNNI, C>(gb, &y, &mut sums),
                KQuant::Q3K => q3_k_block::<VNNI, C>(gb, &y, &mut sums),
                KQuant::Q2K => q2_k_block::<VNNI, C>(gb, &y, &mut sums),
                KQuant::Iq4Xs => iq4_xs_block::<VNNI, C>(gb, &y, &mut sums),
                _ => q4_k_block::<VNNI, C>(gb, &y, &mut sums),
            }
        }
        sums
    }
}

/// The eight codes (`q + 4`) of quarter `K` of half `H` of a Q3_K group-super-block: quads
/// `m = 0..8`, bits `2K..2K + 2` of `qs` and bit `4H + K` of `hmask` moved to bit 2 (16-bit
/// shifts whose strays the masks drop).
#[inline(always)]
unsafe fn q3_k_codes<const H: usize, const K: usize>(gb: *const u8) -> [__m256i; 8] {
    // SAFETY: `gb` points at a whole Q3_K group-super-block; AVX2 guaranteed by the callers.
    unsafe {
        let three = _mm256_set1_epi8(3);
        let four = _mm256_set1_epi8(4);
        // Plain loops, not closures (see `super::avx2::codes`).
        let mut codes = [_mm256_setzero_si256(); 8];
        for (m, code) in codes.iter_mut().enumerate() {
            let qs = load(gb.add(Q3K_QS + 32 * (8 * H + m)));
            let hm = load(gb.add(Q3K_HM + 32 * m));
            let low = match K {
                0 => qs,
                1 => _mm256_srli_epi16::<2>(qs),
                2 => _mm256_srli_epi16::<4>(qs),
                _ => _mm256_srli_epi16::<6>(qs),
            };
            let high = match 4 * H + K {
                0 => _mm256_slli_epi16::<2>(hm),
                1 => _mm256_slli_epi16::<1>(hm),
                2 => hm,
                3 => _mm256_srli_epi16::<1>(hm),
                4 => _mm256_srli_epi16::<2>(hm),
                5 => _mm256_srli_epi16::<3>(hm),
                6 => _mm256_srli_epi16::<4>(hm),
                _ => _mm256_srli_epi16::<5>(hm),
            };
            *code = _mm256_or_si256(_mm256_and_si256(low, three), _mm256_and_si256(high, four));
        }
        codes
    }
}

/// Quarter `K` of half `H` of a Q3_K group-super-block (sub-blocks `8H + 2K` and
/// `8H + 2K + 1`) added into `isum`.
#[inline(always)]
unsafe fn q3_k_quarter<const VNNI: bool, const C: usize, const H: usize, const K: usize>(
    gb: *const u8,
    y: &[&BlockQ8K; C],
    isum: &mut [__m256i; C],
) {
    // SAFETY: as for `q3_k_codes`; `y` holds whole Q8_K blocks.
    unsafe {
        let codes = q3_k_codes::<H, K>(gb);
        sub_block_pair::<VNNI, C>(codes, gb.add(Q3K_SC), 8 * H + 2 * K, 4, y, isum);
    }
}

/// Sub-blocks `s` and `s + 1` (16 elements each, the eight rows' codes in `codes[0..4]` and
/// `codes[4..8]`) of an i8-scaled group-super-block whose scales start at `scales`, for each
/// token: the exact `Σ code·y − offset·bsums[s]` per row, times the row's scale, into `isum`.
#[inline(always)]
unsafe fn sub_block_pair<const VNNI: bool, const C: usize>(
    codes: [__m256i; 8],
    scales: *const u8,
    s: usize,
    offset: i32,
    y: &[&BlockQ8K; C],
    isum: &mut [__m256i; C],
) {
    // SAFETY: `scales` holds the group-super-block's `sc[16][8]`; AVX2 guaranteed by the callers.
    unsafe {
        let [q0, q1, q2, q3, q4, q5, q6, q7] = codes;
        for (half, quads) in [[q0, q1, q2, q3], [q4, q5, q6, q7]].iter().enumerate() {
            let s = s + half;
            let scale = _mm256_cvtepi8_epi32(_mm_loadl_epi64(scales.add(8 * s).cast()));
            for k in 0..C {
                let start = _mm256_set1_epi32(-offset * i32::from(y[k].bsums[s]));
                let at = y[k].qs.as_ptr().add(16 * s);
                let sub = dot_groups::<VNNI, 4, 2>(quads, at, start);
                isum[k] = _mm256_add_epi32(isum[k], _mm256_mullo_epi32(sub, scale));
            }
        }
    }
}

/// `sums[k] + (d·d_a)·isum[k]` for each token, `d` the eight rows' f16 scales at `gb`.
#[inline(always)]
unsafe fn add_scaled<const C: usize>(
    gb: *const u8,
    y: &[&BlockQ8K; C],
    isum: &[__m256i; C],
    sums: &mut [__m256; C],
) {
    // SAFETY: `gb` starts with eight f16 scales; AVX2 and F16C guaranteed by the callers.
    unsafe {
        let d = load_f16x8(gb);
        for k in 0..C {
            let scaled = _mm256_mul_ps(
                _mm256_mul_ps(d, _mm256_set1_ps(y[k].d)),
                _mm256_cvtepi32_ps(isum[k]),
            );
            sums[k] = _mm256_add_ps(sums[k], scaled);
        }
    }
}

/// One Q3_K group-super-block against `C` tokens: `sum + (d·d_a)·isum`.
#[inline(always)]
unsafe fn q3_k_block<const VNNI: bool, const C: usize>(
    gb: *const u8,
    y: &[&BlockQ8K; C],
    sums: &mut [__m256; C],
) {
    // SAFETY: `gb` points at a whole Q3_K group-super-block; AVX2 (and VNNI) guaranteed.
    unsafe {
        let mut isum = [_mm256_setzero_si256(); C];
        q3_k_quarter::<VNNI, C, 0, 0>(gb, y, &mut isum);
        q3_k_quarter::<VNNI, C, 0, 1>(gb, y, &mut isum);
        q3_k_quarter::<VNNI, C, 0, 2>(gb, y, &mut isum);
        q3_k_quarter::<VNNI, C, 0, 3>(gb, y, &mut isum);
        q3_k_quarter::<VNNI, C, 1, 0>(gb, y, &mut isum);
        q3_k_quarter::<VNNI, C, 1, 1>(gb, y, &mut isum);
        q3_k_quarter::<VNNI, C, 1, 2>(gb, y, &mut isum);
        q3_k_quarter::<VNNI, C, 1, 3>(gb, y, &mut isum);
        add_scaled(gb, y, &isum, sums);
    }
}

/// One Q2_K group-super-block against `C` tokens:
/// `sum + ((d·d_a)·isum − (dmin·d_a)·msum)`.
#[inline(always)]
unsafe fn q2_k_block<const VNNI: bool, const C: usize>(
    gb: *const u8,
    y: &[&BlockQ8K; C],
    sums: &mut [__m256; C],
) {
    // SAFETY: `gb` points at a whole Q2_K group-super-block; AVX2 (and VNNI) guaranteed.
    unsafe {
        let three = _mm256_set1_epi8(3);
        let low4 = _mm256_set1_epi32(0x0F);
        let mut isum = [_mm256_setzero_si256(); C];
        let mut msum = [_mm256_setzero_si256(); C];
        for h in 0..2 {
            // Plain loops, not closures (see `super::avx2::codes`).
            let mut qs = [_mm256_setzero_si256(); 8];
            for (m, v) in qs.iter_mut().enumerate() {
                *v = load(gb.add(Q2K_QS + 32 * (8 * h + m)));
            }
            for k in 0..4 {
                let mut codes = [_mm256_setzero_si256(); 8];
                for (code, &v) in codes.iter_mut().zip(&qs) {
                    let v = _mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * k as i32));
                    *code = _mm256_and_si256(v, three);
                }
                let [q0, q1, q2, q3, q4, q5, q6, q7] = codes;
                for (half, quads) in [[q0, q1, q2, q3], [q4, q5, q6, q7]].iter().enumerate() {
                    let s = 8 * h + 2 * k + half;
                    let raw = _mm256_cvtepu8_epi32(_mm_loadl_epi64(gb.add(Q2K_SC + 8 * s).cast()));
                    let scale = _mm256_and_si256(raw, low4);
                    let min = _mm256_srli_epi32::<4>(raw);
                    for j in 0..C {
                        let at = y[j].qs.as_ptr().add(16 * s);
                        let sub = dot_groups::<VNNI, 4, 4>(quads, at, _mm256_setzero_si256());
                        isum[j] = _mm256_add_epi32(isum[j], _mm256_mullo_epi32(sub, scale));
                        let b = _mm256_set1_epi32(i32::from(y[j].bsums[s]));
                        msum[j] = _mm256_add_epi32(msum[j], _mm256_mullo_epi32(min, b));
                    }
                }
            }
        }
        let d = load_f16x8(gb);
        let dmin = load_f16x8(gb.add(16));
        for j in 0..C {
            let d_a = _mm256_set1_ps(y[j].d);
            let scaled = _mm256_mul_ps(_mm256_mul_ps(d, d_a), _mm256_cvtepi32_ps(isum[j]));
            let mins = _mm256_mul_ps(_mm256_mul_ps(dmin, d_a), _mm256_cvtepi32_ps(msum[j]));
            sums[j] = _mm256_add_ps(sums[j], _mm256_sub_ps(scaled, mins));
        }
    }
}

/// One IQ4_XS group-super-block against `C` tokens: `sum + (d·d_a)·isum`.
#[inline(always)]
unsafe fn iq4_xs_block<const VNNI: bool, const C: usize>(
    gb: *const u8,
    y: &[&BlockQ8K; C],
    sums: &mut [__m256; C],
) {
    // SAFETY: `gb` points at a whole IQ4_XS group-super-block; AVX2 (and VNNI) guaranteed.
    unsafe {
        // VNNI multiplies the unsigned codes `v + 128`.
        let grid = iq4nl_grid::<VNNI>();
        let mask = _mm256_set1_epi8(0x0F);
        let mut isum = [_mm256_setzero_si256(); C];
        for ib in 0..8 {
            // Values `k` of the eight rows: elements `4k..4k + 4` of the sub-block.
            let mut values = [_mm256_setzero_si256(); 8];
            for m in 0..4 {
                let v = load(gb.add(IQ4_QS + 32 * (4 * ib + m)));
                values[m] = _mm256_shuffle_epi8(grid, _mm256_and_si256(v, mask));
                let high = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
                values[4 + m] = _mm256_shuffle_epi8(grid, high);
            }
            let scale = _mm256_cvtepi8_epi32(_mm_loadl_epi64(gb.add(IQ4_SC + 8 * ib).cast()));
            for k in 0..C {
                let at = y[k].qs.as_ptr().add(32 * ib);
                let sub = if VNNI {
                    let sum = i32::from(y[k].bsums[2 * ib]) + i32::from(y[k].bsums[2 * ib + 1]);
                    dot_groups::<true, 8, 1>(&values, at, _mm256_set1_epi32(-128 * sum))
                } else {
                    signed_dot(&values, at)
                };
                isum[k] = _mm256_add_epi32(isum[k], _mm256_mullo_epi32(sub, scale));
            }
        }
        add_scaled(gb, y, &isum, sums);
    }
}

/// One Q6_K group-super-block against `C` tokens: `sum + (d·d_a)·isum`.
#[inline(always)]
unsafe fn q6_k_block<const VNNI: bool, const C: usize>(
    gb: *const u8,
    y: &[&BlockQ8K; C],
    sums: &mut [__m256; C],
) {
    // SAFETY: `gb` points at a whole Q6_K group-super-block; AVX2 (and VNNI) guaranteed.
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        let top = _mm256_set1_epi8(0x30);
        let mut isum = [_mm256_setzero_si256(); C];
        for h in 0..2 {
            for j in 0..4 {
                // Plain loops, not closures (see `super::avx2::codes`).
                let mut codes = [_mm256_setzero_si256(); 8];
                for (m, code) in codes.iter_mut().enumerate() {
                    let ql = load(gb.add(Q6K_QL + 32 * (16 * h + 8 * (j % 2) + m)));
                    let qh = load(gb.add(Q6K_QH + 32 * (8 * h + m)));
                    let low = if j < 2 {
                        ql
                    } else {
                        _mm256_srli_epi16::<4>(ql)
                    };
                    let high = match j {
                        0 => _mm256_slli_epi16::<4>(qh),
                        1 => _mm256_slli_epi16::<2>(qh),
                        2 => qh,
                        _ => _mm256_srli_epi16::<2>(qh),
                    };
                    *code =
                        _mm256_or_si256(_mm256_and_si256(low, mask), _mm256_and_si256(high, top));
                }
                sub_block_pair::<VNNI, C>(codes, gb.add(Q6K_SC), 8 * h + 2 * j, 32, y, &mut isum);
            }
        }
        add_scaled(gb, y, &isum, sums);
    }
}

/// One Q4_K group-super-block against `C` tokens: `sum + ((d·d_a)·isum − (dmin·d_a)·msum)`.
#[inline(always)]
unsafe fn q4_k_block<const VNNI: bool, const C: usize>(
    gb: *const u8,
    y: &[&BlockQ8K; C],
    sums: &mut [__m256; C],
) {
    // SAFETY: `gb` points at a whole Q4_K group-super-block; AVX2 (and VNNI) guaranteed.
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        let mut isum = [_mm256_setzero_si256(); C];
        for j in 0..8 {
            let (p, high) = (j / 2, j % 2 == 1);
            // Plain loops, not closures: a closure is not compiled with the caller's target
            // features, and intrinsics it calls then stay function calls.
            let mut codes = [_mm256_setzero_si256(); 8];
            for (k, code) in codes.iter_mut().enumerate() {
                let v = load(gb.add(Q4K_QS + 32 * (8 * p + k)));
                let v = if high { _mm256_srli_epi16::<4>(v) } else { v };
                *code = _mm256_and_si256(v, mask);
            }
            let scale = _mm256_cvtepu8_epi32(_mm_loadl_epi64(gb.add(Q4K_SC + 8 * j).cast()));
            for k in 0..C {
                let sub = dot_groups::<VNNI, 8, 4>(
                    &codes,
                    y[k].qs.as_ptr().add(32 * j),
                    _mm256_setzero_si256(),
                );
                isum[k] = _mm256_add_epi32(isum[k], _mm256_mullo_epi32(sub, scale));
            }
        }
        let d = load_f16x8(gb);
        let dmin = load_f16x8(gb.add(16));
        for k in 0..C {
            // `b_2j + b_2j+1` for the eight sub-blocks, as i16 (at most 2·16·128 for
            // quantized activations), in each 128-bit half: [P0..P3, P0..P3 | P4..P7, P4..P7].
            let bsums = _mm256_loadu_si256(y[k].bsums.as_ptr().cast());
            let pair_sums = _mm256_madd_epi16(bsums, _mm256_set1_epi16(1));
            let packed = _mm256_packs_epi32(pair_sums, pair_sums);
            let mut msum = _mm256_setzero_si256();
            for (q, dword) in [0, 1, 4, 5].into_iter().enumerate() {
                let mins = load(gb.add(Q4K_MINS + 32 * q));
                let pair = _mm256_permutevar8x32_epi32(packed, _mm256_set1_epi32(dword));
                msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mins, pair));
            }
            let d_a = _mm256_set1_ps(y[k].d);
            let scaled = _mm256_mul_ps(_mm256_mul_ps(d, d_a), _mm256_cvtepi32_ps(isum[k]));
            let mins = _mm256_mul_ps(_mm256_mul_ps(dmin, d_a), _mm256_cvtepi32_ps(msum));
            sums[k] = _mm256_add_ps(sums[k], _mm256_sub_ps(scaled, mins));
        }
    }
}
