//! Q3_K's integer sums for the tiles of the parent module.

use std::arch::x86_64::*;

use super::super::k_quants::q3_scales_words;
use super::{BlockQ8K, add_codes, both_halves, load32, pick, shift_right, sum_pair};

/// `isum` of one Q3_K super-block per (row, token). Each half (128 elements) uses the 32
/// bytes of `qs` at `32 + 32h`; its chunk `k` takes bits `2k..2k + 2` of them and bit
/// `4h + k` of `hmask` (bytes 0..32) as the code's bit 2, so the code is `q + 4` in `0..8`
/// (the reference's `q` minus 4 when that bit is clear), with scale `8h + 2k` for elements
/// 0..16 and `8h + 2k + 1` for 16..32, less 32. The codes' pair sums with the activations
/// (`vpmaddubsw`, at most `2 · 7 · 128`) are scaled into the accumulator; the offset,
/// `4 · Σ_j sc_j · bsums[j]`, is one `vpmaddwd` of the 16 scales by `bsums` per token.
#[inline(always)]
pub(super) unsafe fn isums<const VNNI: bool, const R: usize, const C: usize>(
    w: [&[u8]; R],
    a: [&BlockQ8K; C],
) -> [[i32; C]; R] {
    // SAFETY: only reached from the tiles, whose callers guarantee AVX2.
    unsafe {
        let three = _mm256_set1_epi8(3);
        let four = _mm256_set1_epi8(4);
        let zero = _mm256_setzero_si256();
        // The signed scales less 32 of each half (sub-blocks 8h..8h + 8), and all 16 in
        // sub-block order, per row.
        let mut scales = [[zero; R]; 2];
        let mut all_scales = [zero; R];
        let mut hmask = [zero; R];
        let offset = _mm256_set1_epi16(32);
        for r in 0..R {
            let words = q3_scales_words(w[r].try_into().unwrap_or(&[0; 110]));
            for (half, word) in words.iter().enumerate() {
                let eight = both_halves(word.to_le_bytes(), false);
                scales[half][r] = _mm256_sub_epi16(eight, offset);
            }
            let sixteen = _mm_set_epi64x(words[1] as i64, words[0] as i64);
            all_scales[r] = _mm256_sub_epi16(_mm256_cvtepu8_epi16(sixteen), offset);
            hmask[r] = load32(w[r], 0);
        }
        let mut acc = [[zero; C]; R];
        for (half, half_scales) in scales.iter().enumerate() {
            for k in 0..4 {
                let mut q = [zero; R];
                let mut sc = [zero; R];
                let bit = 4 * half + k;
                for r in 0..R {
                    let qs = load32(w[r], 32 + 32 * half);
                    let low = _mm256_and_si256(shift_right(qs, 2 * k), three);
                    // Bit `bit` of each hmask byte, moved to bit 2 (0 or 4 per byte).
                    let high = _mm256_and_si256(shift_right_left(hmask[r], bit), four);
                    q[r] = _mm256_or_si256(low, high);
                    sc[r] = pick(half_scales[r], 2 * k, 2 * k + 1);
                }
                add_codes::<VNNI, R, C>(&mut acc, &q, &sc, a, 128 * half + 32 * k);
            }
        }
        let mut isums = [[0; C]; R];
        for c in 0..C {
            let bsums = _mm256_loadu_si256(a[c].bsums.as_ptr().cast());
            for r in 0..R {
                let offsets = _mm256_madd_epi16(bsums, all_scales[r]);
                let (codes, offset) = sum_pair(acc[r][c], offsets);
                isums[r][c] = codes - 4 * offset;
            }
        }
        isums
    }
}

/// `v` with bit `bit` (0..8) of each byte moved to bit 2, by a 16-bit shift either way; the
/// callers' mask keeps bit 2 of each byte only.
#[inline(always)]
unsafe fn shift_right_left(v: __m256i, bit: usize) -> __m256i {
    unsafe {
        if bit >= 2 {
            shift_right(v, bit - 2)
        } else {
            _mm256_sll_epi16(v, _mm_cvtsi32_si128((2 - bit) as i32))
        }
    }
}
