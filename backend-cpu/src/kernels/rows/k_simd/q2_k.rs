//! Q2_K's integer sums for the tiles of the parent module.
//!
//! Each half of the super-block (128 elements) reads the 32 bytes of `qs` at `16 + 32h`; its
//! chunk `k` (elements `32k..32k + 32` of the half) takes bits `2k..2k + 2` of every byte, so
//! one load serves four chunks. The codes, `0..4`, are the unsigned operand of `vpmaddubsw`
//! (pair sums at most `2 · 3 · 128`, exact), scaled by the low nibble of `scales[8h + 2k]`
//! for the chunk's first 16 elements and of `scales[8h + 2k + 1]` for the rest
//! (`vpmaddwd` / `vpdpwssd`, at most `8 · 2 · 768 · 15 < 2^18` per lane and super-block). The
//! mins, the scales' high nibbles, meet the activation's 16 `bsums` in one `vpmaddwd` per
//! token (at most `2 · 32768 · 15` per lane).

use std::arch::x86_64::*;

use super::{BlockQ8K, add_codes, load32, pick, shift_right, sum_pair};

/// `isum` and `msum` of one Q2_K super-block per (row, token).
#[inline(always)]
pub(super) unsafe fn isums<const VNNI: bool, const R: usize, const C: usize>(
    w: [&[u8]; R],
    a: [&BlockQ8K; C],
) -> ([[i32; C]; R], [[i32; C]; R]) {
    // SAFETY: only reached from the tiles, whose callers guarantee AVX2.
    unsafe {
        let three = _mm256_set1_epi8(3);
        let low4 = _mm_set1_epi8(0x0F);
        let zero = _mm256_setzero_si256();
        // Per row: the 8 scales of each half as i16 in both 128-bit halves (for `pick`), and
        // the 16 mins as i16 in sub-block order (for `bsums`).
        let mut scales = [[zero; R]; 2];
        let mut mins = [zero; R];
        for r in 0..R {
            let mut packed = [0u8; 16];
            packed.copy_from_slice(&w[r][..16]);
            let v = _mm_loadu_si128(packed.as_ptr().cast());
            let sc = _mm_and_si128(v, low4);
            // The 16-bit shift drags the next byte's low bits into bits 4..8; the mask drops them.
            mins[r] = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(v), low4));
            scales[0][r] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc));
            scales[1][r] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_srli_si128::<8>(sc)));
        }
        let mut acc = [[zero; C]; R];
        for (half, half_scales) in scales.iter().enumerate() {
            // A loop, not `std::array::from_fn`: the closure would not inherit the target
            // features, and an intrinsic in it can become an out-of-line call (see `lane_sums`).
            let mut qs = [zero; R];
            for r in 0..R {
                qs[r] = load32(w[r], 16 + 32 * half);
            }
            for k in 0..4 {
                let mut q = [zero; R];
                let mut sc = [zero; R];
                for r in 0..R {
                    q[r] = _mm256_and_si256(shift_right(qs[r], 2 * k), three);
                    sc[r] = pick(half_scales[r], 2 * k, 2 * k + 1);
                }
                add_codes::<VNNI, R, C>(&mut acc, &q, &sc, a, 128 * half + 32 * k);
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
