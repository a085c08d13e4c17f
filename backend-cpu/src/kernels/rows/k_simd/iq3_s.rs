//! IQ3_S's (and IQ3_XXS's, [`super::iq3_xxs`]) integer sums for the tiles of the parent module.
//!
//! A sub-block's 32 magnitudes are its eight grid entries, one dword each (group `k` of four
//! elements in dword `k`), read from [`IQ3S_GRID`] by eight scalar loads. Its 32 sign bits (the
//! four bytes of `signs` at `4 ib`) become a byte mask by one `vpshufb` (byte `j` of the
//! register takes sign byte `j / 8`) and a compare with each byte's bit; the magnitudes, at
//! most 15, are negated under the mask (`(g ^ m) − m`, never wrapping). From there on as
//! IQ4_XS: `vpmaddubsw` takes `|y|` as its unsigned operand and the signed values with `y`'s
//! sign as its signed one, `|y| · sign(y)·v = v·y`, exact for every byte, `y = −128` included;
//! each pair sum is at most `2 · 128 · 15` in magnitude, and the pairs are scaled by the odd
//! `1 + 2 s` (`vpmaddwd` / `vpdpwssd`, at most `8 · 2 · 3840 · 31 < 2^21` per lane and
//! super-block).

use std::arch::x86_64::*;

use super::{BlockQ8K, both_halves, lane_sums, load32, pick, scaled_add};
use crate::quant::{IQ3_S_BYTES, IQ3S_GRID, iq3_s_index, iq3_s_scales};

/// Offset of `signs` in an IQ3_S super-block.
const SIGNS: usize = 74;

/// A format whose 32-element sub-blocks are eight 4-magnitude grid entries with 32 stored
/// sign bits and an odd multiplier (IQ3_S, IQ3_XXS): [`isums`] for either. Monomorphised and
/// always inlined, so the tiles' target features reach every intrinsic.
pub(super) trait SignedGrid<const N: usize> {
    /// The eight odd multipliers of the super-block.
    fn multipliers(block: &[u8; N]) -> [u8; 8];
    /// The 32 signed values of sub-block `ib` (0..8), as bytes.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    unsafe fn values(block: &[u8; N], ib: usize) -> __m256i;
}

/// IQ3_S's [`SignedGrid`].
pub(super) struct Iq3S;

impl SignedGrid<IQ3_S_BYTES> for Iq3S {
    #[inline(always)]
    fn multipliers(block: &[u8; IQ3_S_BYTES]) -> [u8; 8] {
        iq3_s_scales(block)
    }

    #[inline(always)]
    unsafe fn values(block: &[u8; IQ3_S_BYTES], ib: usize) -> __m256i {
        let mut entries = [0; 8];
        for (k, e) in entries.iter_mut().enumerate() {
            *e = IQ3S_GRID[iq3_s_index(block, ib, k)];
        }
        let signs = u32::from_le_bytes([
            block[SIGNS + 4 * ib],
            block[SIGNS + 4 * ib + 1],
            block[SIGNS + 4 * ib + 2],
            block[SIGNS + 4 * ib + 3],
        ]);
        // SAFETY: the caller guarantees AVX2.
        unsafe { signed(entries, signs) }
    }
}

/// The eight grid `entries` (group `k` in dword `k`) with byte `j` negated where bit `j` of
/// `signs` is set.
#[inline(always)]
pub(super) unsafe fn signed(entries: [u32; 8], signs: u32) -> __m256i {
    // SAFETY: only reached from `SignedGrid::values`, whose callers guarantee AVX2.
    unsafe {
        // Eight scalar inserts, not a store and a vector load, which would stall on store
        // forwarding.
        let e = entries.map(|e| e as i32);
        let grid = _mm256_set_epi32(e[7], e[6], e[5], e[4], e[3], e[2], e[1], e[0]);
        // Byte j takes sign byte j / 8 (the dword is in both halves; the upper half's bytes are
        // 16..32, sign bytes 2 and 3).
        let spread = _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        );
        let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(signs as i32), spread);
        let mask = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bits), bits);
        _mm256_sub_epi8(_mm256_xor_si256(grid, mask), mask)
    }
}

/// `isum` of one IQ3_S or IQ3_XXS super-block per (row, token): sub-block `ib` (elements
/// `32 ib..32 ib + 32`) with its signed grid magnitudes and its odd multiplier.
#[inline(always)]
pub(super) unsafe fn isums<
    G: SignedGrid<N>,
    const N: usize,
    const VNNI: bool,
    const R: usize,
    const C: usize,
>(
    w: [&[u8]; R],
    a: [&BlockQ8K; C],
) -> [[i32; C]; R] {
    // SAFETY: only reached from the parent's tiles, whose callers guarantee AVX2 (and VNNI
    // when `VNNI`).
    unsafe {
        let zero = _mm256_setzero_si256();
        let blocks: [&[u8; N]; R] = std::array::from_fn(|r| w[r].try_into().unwrap_or(&[0; N]));
        // The eight odd multipliers of each row, as i16 in both halves.
        // A loop, not `std::array::from_fn`: the closure would not inherit the target features,
        // and an intrinsic in it can become an out-of-line call (see `lane_sums`).
        let mut scales = [zero; R];
        for r in 0..R {
            scales[r] = both_halves(G::multipliers(blocks[r]), false);
        }
        let mut acc = [[zero; C]; R];
        for ib in 0..8 {
            let mut v = [zero; R];
            let mut sc = [zero; R];
            for r in 0..R {
                v[r] = G::values(blocks[r], ib);
                sc[r] = pick(scales[r], ib, ib);
            }
            for c in 0..C {
                let y = load32(&a[c].qs, 32 * ib);
                let magnitude = _mm256_abs_epi8(y);
                for r in 0..R {
                    let signed = _mm256_sign_epi8(v[r], y);
                    let pairs = _mm256_maddubs_epi16(magnitude, signed);
                    acc[r][c] = scaled_add::<VNNI>(acc[r][c], pairs, sc[r]);
                }
            }
        }
        lane_sums(acc)
    }
}
