//! IQ4_XS's integer sums for the tiles of the parent module.
//!
//! A sub-block's 32 four-bit indices become its grid values with one `vpshufb` of a register
//! holding [`KVALUES_IQ4NL`] in both 128-bit halves. The values are signed, so `vpmaddubsw`
//! (u8 × i8) takes `|y|` as its unsigned operand and the values with `y`'s sign as its signed
//! one: `|y| · sign(y)·v = v·y`, exact for every byte, `y = −128` included (`|−128|` is 128 as
//! an unsigned byte, and no grid value is −128, so negating one never wraps). Each pair sum is
//! at most `2 · 128 · 127 = 32512` in magnitude, inside i16. The pairs are then scaled by
//! `ls − 32` (`vpmaddwd` / `vpdpwssd`, at most `8 · 2 · 32512 · 32 < 2^24` per lane and
//! super-block), as the parent's formats are.

use std::arch::x86_64::*;

use super::{BlockQ8K, both_halves, lane_sums, load32, pick, scaled_add};
use crate::quant::{IQ4_XS_BYTES, KVALUES_IQ4NL, iq4_xs_scales};

/// The 16 bytes of `b` at `off`; zeros if they are not all inside `b` (never the case for
/// the callers' offsets inside checked blocks).
#[inline(always)]
unsafe fn load16(b: &[u8], off: usize) -> __m128i {
    match b.get(off..off.saturating_add(16)) {
        // SAFETY: the 16 bytes lie inside `b`; no alignment needed.
        Some(s) => unsafe { _mm_loadu_si128(s.as_ptr().cast()) },
        None => unsafe { _mm_setzero_si128() },
    }
}

/// `isum` of one IQ4_XS super-block per (row, token): sub-block `ib` (elements
/// `32 ib..32 ib + 32`) takes the 16 bytes of `qs` at `8 + 16 ib`, low nibbles for elements
/// 0..16 and high ones for 16..32, and the scale `ls_ib − 32`.
#[inline(always)]
pub(super) unsafe fn isums<const VNNI: bool, const R: usize, const C: usize>(
    w: [&[u8]; R],
    a: [&BlockQ8K; C],
) -> [[i32; C]; R] {
    // SAFETY: only reached from the parent's tiles, whose callers guarantee AVX2 (and VNNI
    // when `VNNI`).
    unsafe {
        let grid = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
        let grid = _mm256_broadcastsi128_si256(grid);
        let mask = _mm256_set1_epi8(0x0F);
        let zero = _mm256_setzero_si256();
        // The eight scales less 32 of each row, as i16 in both halves.
        let mut scales = [zero; R];
        for r in 0..R {
            let block = w[r].try_into().unwrap_or(&[0; IQ4_XS_BYTES]);
            let ls = both_halves(iq4_xs_scales(block), false);
            scales[r] = _mm256_sub_epi16(ls, _mm256_set1_epi16(32));
        }
        let mut acc = [[zero; C]; R];
        for ib in 0..8 {
            let mut values = [zero; R];
            let mut sc = [zero; R];
            for r in 0..R {
                let q = load16(w[r], 8 + 16 * ib);
                let both = _mm256_set_m128i(_mm_srli_epi16::<4>(q), q);
                values[r] = _mm256_shuffle_epi8(grid, _mm256_and_si256(both, mask));
                sc[r] = pick(scales[r], ib, ib);
            }
            for c in 0..C {
                let y = load32(&a[c].qs, 32 * ib);
                let magnitude = _mm256_abs_epi8(y);
                for r in 0..R {
                    let signed = _mm256_sign_epi8(values[r], y);
                    let pairs = _mm256_maddubs_epi16(magnitude, signed);
                    acc[r][c] = scaled_add::<VNNI>(acc[r][c], pairs, sc[r]);
                }
            }
        }
        lane_sums(acc)
    }
}
