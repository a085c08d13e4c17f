//! Scalar kernels of the k-quant (and IQ4_XS, IQ3_S, IQ3_XXS) super-blocks against Q8_K activations (see the
//! parent module for the order and the overflow bounds).

use super::{
    BlockQ8K, IQ3_S_BYTES, IQ3_XXS_BYTES, IQ4_XS_BYTES, Q2_K_BYTES, Q3_K_BYTES, Q4_K_BYTES,
    Q5_K_BYTES, Q6_K_BYTES, f16_le, weight_blocks,
};
use crate::quant::{
    iq3_s_scales, iq3_s_value, iq3_xxs_scales, iq3_xxs_value, iq4_xs_scales, iq4_xs_value,
    q2_k_quant, q3_k_quant, q3_k_scales,
};

/// The 8 scales and 8 mins of a Q4_K / Q5_K super-block, unpacked from bytes 4..16 with
/// word-wide masks (branch-free); equal to `get_scale_min_k4` /
/// [`scale_min`](crate::quant::k_quants::scale_min) for every `j`.
///
/// Bytes 0..4 of the packed 12 hold the 6-bit scales of sub-blocks 0..4, bytes 4..8 their
/// mins; sub-blocks 4..8 keep their low 4 bits in the nibbles of bytes 8..12 (scales low,
/// mins high) and their top 2 bits in the top 2 bits of bytes 0..8.
pub(crate) fn scales_mins<const B: usize>(w: &[u8; B]) -> ([u8; 8], [u8; 8]) {
    const { assert!(B >= 16) };
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([w[i], w[i + 1], w[i + 2], w[i + 3]]);
    let (u0, u1, u2) = (word(4), word(8), word(12));
    let sc_lo = u0 & LOW6;
    let m_lo = u1 & LOW6;
    // The shifts move bits within each byte; the masks drop what crosses from the next one.
    let sc_hi = (u2 & LOW4) | (((u0 >> 6) & LOW2) << 4);
    let m_hi = ((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4);
    let bytes = |lo: u32, hi: u32| (u64::from(lo) | (u64::from(hi) << 32)).to_le_bytes();
    (bytes(sc_lo, sc_hi), bytes(m_lo, m_hi))
}

/// The 16 six-bit scales of a Q3_K super-block (before the offset of 32), unpacked from bytes
/// 96..108 with word-wide masks, as two little-endian words of eight (kept in registers by
/// the SIMD kernels); their bytes are [`q3_k_scales`] for every byte pattern. Scales
/// `4i..4i + 4` take their low nibbles from word 0 (i even) or 1 (i odd), shifted by 4 for
/// i ≥ 2, and their top two bits from bits `2i..2i + 2` of each byte of word 2.
pub(crate) fn q3_scales_words(w: &[u8; Q3_K_BYTES]) -> [u64; 2] {
    const LOW4: u32 = 0x0F0F_0F0F;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([w[96 + i], w[97 + i], w[98 + i], w[99 + i]]);
    let (a0, a1, a2) = (word(0), word(4), word(8));
    let group = |i: u32| {
        let low = if i.is_multiple_of(2) { a0 } else { a1 };
        ((low >> (4 * (i / 2))) & LOW4) | (((a2 >> (2 * i)) & LOW2) << 4)
    };
    let pair = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    [pair(group(0), group(1)), pair(group(2), group(3))]
}

/// `Σ_j m_j · (bsums[2j] + bsums[2j+1])`, exact (`< 2^25` in magnitude).
pub(super) fn min_sum(mins: &[u8; 8], bsums: &[i16; 16]) -> i32 {
    mins.iter()
        .zip(bsums.chunks_exact(2))
        .map(|(&m, b)| i32::from(m) * (i32::from(b[0]) + i32::from(b[1])))
        .sum()
}

/// The f32 step of a Q4_K / Q5_K super-block:
/// `sum + ((d * d_a) * isum - (dmin * d_a) * msum)`.
#[inline(always)]
pub(super) fn k_step(sum: f32, d: f32, dmin: f32, d_a: f32, isum: i32, msum: i32) -> f32 {
    sum + ((d * d_a) * isum as f32 - (dmin * d_a) * msum as f32)
}

/// Q4_K (or, with `qh`, Q5_K): `Σ_j sc_j · Σ q·y` over the 8 sub-blocks of 32. Bytes
/// `32p..32p + 32` of `qs` hold sub-block `2p` in their low nibbles and `2p + 1` in their
/// high ones; the fifth bit of element `l` of sub-block `s` is bit `s` of `qh[l]`.
fn k_isum(qs: &[u8], qh: Option<&[u8]>, scales: &[u8; 8], y: &[i8; 256]) -> i32 {
    let mut isum = 0i32;
    for (p, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact(64)).enumerate() {
        let (y_lo, y_hi) = y.split_at(32);
        let (mut s_lo, mut s_hi) = (0i32, 0i32);
        for l in 0..32 {
            let h = qh.map_or(0, |qh| qh[l] >> (2 * p));
            let x0 = (q[l] & 0x0F) | ((h & 1) << 4);
            let x1 = (q[l] >> 4) | ((h & 2) << 3);
            s_lo += i32::from(x0) * i32::from(y_lo[l]);
            s_hi += i32::from(x1) * i32::from(y_hi[l]);
        }
        isum += i32::from(scales[2 * p]) * s_lo + i32::from(scales[2 * p + 1]) * s_hi;
    }
    isum
}

pub(super) fn q4_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q4_K_BYTES>(w).zip(a) {
        let (scales, mins) = scales_mins(w);
        let isum = k_isum(&w[16..], None, &scales, &a.qs);
        let (d, dmin) = (f16_le([w[0], w[1]]), f16_le([w[2], w[3]]));
        sum = k_step(sum, d, dmin, a.d, isum, min_sum(&mins, &a.bsums));
    }
    sum
}

pub(super) fn q5_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q5_K_BYTES>(w).zip(a) {
        let (scales, mins) = scales_mins(w);
        let isum = k_isum(&w[48..], Some(&w[16..48]), &scales, &a.qs);
        let (d, dmin) = (f16_le([w[0], w[1]]), f16_le([w[2], w[3]]));
        sum = k_step(sum, d, dmin, a.d, isum, min_sum(&mins, &a.bsums));
    }
    sum
}

/// Q2_K, in the order of ggml's `ggml_vec_dot_q2_K_q8_K`: element `128 h + 32 k + l` (h in
/// 0..2, k in 0..4, l in 0..32) is the unsigned 2-bit quant [`q2_k_quant`] of sub-block
/// `j = 8 h + 2 k + l / 16`, which covers the activation's 16 elements `16 j..16 j + 16`
/// (stored sum `bsums[j]`) with the low nibble of `scales[j]` as its scale and the high one as
/// its min: `isum = Σ_j sc_j · Σ q·y`, `msum = Σ_j m_j · bsums[j]`, then [`k_step`] as Q4_K.
pub(super) fn q2_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q2_K_BYTES>(w).zip(a) {
        let (mut isum, mut msum) = (0i32, 0i32);
        for (j, &sc) in w[..16].iter().enumerate() {
            let (h, k, first) = (j / 8, (j % 8) / 2, 16 * (j % 2));
            let s: i32 = (first..first + 16)
                .map(|l| {
                    let y = a.qs[128 * h + 32 * k + l];
                    i32::from(q2_k_quant(w, h, k, l)) * i32::from(y)
                })
                .sum();
            isum += i32::from(sc & 0x0F) * s;
            msum += i32::from(sc >> 4) * i32::from(a.bsums[j]);
        }
        let (d, dmin) = (f16_le([w[80], w[81]]), f16_le([w[82], w[83]]));
        sum = k_step(sum, d, dmin, a.d, isum, msum);
    }
    sum
}

/// Q3_K: element `128 h + 32 k + l` (h in 0..2, k in 0..4, l in 0..32) is the signed 3-bit
/// quant [`q3_k_quant`] with scale `sc[8 h + 2 k + l / 16] - 32`; sub-block `j` covers the
/// activation's 16 elements `16 j..16 j + 16`, whose stored sum is `bsums[j]`. The quant's
/// offset of 4 comes off through `bsums`, as ggml's Q4_K mins do:
/// `isum = Σ_j sc_j · (Σ (q + 4) · y − 4 · bsums[j])`.
pub(super) fn q3_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q3_K_BYTES>(w).zip(a) {
        let mut packed = [0; 12];
        packed.copy_from_slice(&w[96..108]);
        let scales = q3_k_scales(&packed);
        let mut isum = 0i32;
        for (j, &sc) in scales.iter().enumerate() {
            let (h, k, first) = (j / 8, (j % 8) / 2, 16 * (j % 2));
            let codes: i32 = (first..first + 16)
                .map(|l| {
                    let code = i32::from(q3_k_quant(w, h, k, l)) + 4;
                    code * i32::from(a.qs[128 * h + 32 * k + l])
                })
                .sum();
            isum += (i32::from(sc) - 32) * (codes - 4 * i32::from(a.bsums[j]));
        }
        sum += (f16_le([w[108], w[109]]) * a.d) * isum as f32;
    }
    sum
}

/// Q6_K: each half of the super-block (128 elements) uses 64 bytes of `ql`, 32 of `qh` and 8
/// scales; element `l + 32k` of a half (k in 0..4, l in 0..32) takes nibble `k / 2` of
/// `ql[l + 32 (k % 2)]` and bits `2k..2k + 2` of `qh[l]`, minus 32, with scale
/// `scales[l / 16 + 2k]`.
pub(super) fn q6_k_q8_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q6_K_BYTES>(w).zip(a) {
        let mut isum = 0i32;
        let halves = w[0..128]
            .chunks_exact(64)
            .zip(w[128..192].chunks_exact(32))
            .zip(w[192..208].chunks_exact(8))
            .zip(a.qs.chunks_exact(128));
        for (((ql, qh), sc), y) in halves {
            for k in 0..4 {
                for half in 0..2 {
                    let mut s = 0i32;
                    for l in 16 * half..16 * half + 16 {
                        let nib = (ql[l + 32 * (k % 2)] >> (4 * (k / 2))) & 0x0F;
                        let q = nib | (((qh[l] >> (2 * k)) & 3) << 4);
                        s += (i32::from(q) - 32) * i32::from(y[32 * k + l]);
                    }
                    isum += i32::from(sc[half + 2 * k] as i8) * s;
                }
            }
        }
        sum += (f16_le([w[208], w[209]]) * a.d) * isum as f32;
    }
    sum
}

/// IQ4_XS: sub-block `ib` covers the activation's elements `32 ib..32 ib + 32`, with the grid
/// values [`iq4_xs_value`] and the scale `ls_ib - 32`:
/// `isum = Σ_ib (ls_ib - 32) · Σ_l v_l · y_l`.
pub(super) fn iq4_xs_q8_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<IQ4_XS_BYTES>(w).zip(a) {
        let scales = iq4_xs_scales(w);
        let mut isum = 0i32;
        for (ib, y) in a.qs.chunks_exact(32).enumerate() {
            let s: i32 = y
                .iter()
                .enumerate()
                .map(|(l, &y)| i32::from(iq4_xs_value(w, ib, l)) * i32::from(y))
                .sum();
            isum += (i32::from(scales[ib]) - 32) * s;
        }
        sum += (f16_le([w[0], w[1]]) * a.d) * isum as f32;
    }
    sum
}

/// IQ3_S: sub-block `ib` covers the activation's elements `32 ib..32 ib + 32`, with the signed
/// grid magnitudes [`iq3_s_value`] and the odd multiplier `1 + 2 s_ib`, as ggml's
/// `ggml_vec_dot_iq3_s_q8_K`: `isum = Σ_ib (1 + 2 s_ib) · Σ_j v_j · y_j`.
pub(super) fn iq3_s_q8_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    signed_grid_q8_k::<IQ3_S_BYTES>(w, a, iq3_s_scales, iq3_s_value)
}

/// IQ3_XXS: as IQ3_S with [`iq3_xxs_value`] and the multipliers `1 + 2 s_ib` of
/// [`iq3_xxs_scales`], then `0.25 · sum` (ggml's `ggml_vec_dot_iq3_xxs_q8_K` keeps the
/// dequantizer's `(0.5 + s) · 0.5 = (1 + 2 s) / 4` as the odd integer and a final quarter).
pub(super) fn iq3_xxs_q8_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    0.25 * signed_grid_q8_k::<IQ3_XXS_BYTES>(w, a, iq3_xxs_scales, iq3_xxs_value)
}

/// The sum of the signed-grid formats (IQ3_S, IQ3_XXS) of `N`-byte super-blocks, from their
/// eight odd multipliers and the signed value of element `j` of sub-block `ib`: per super-block
/// `isum = Σ_ib multiplier_ib · Σ_j v_j · y_j`, then `sum += (d_w · d_a) · isum`.
fn signed_grid_q8_k<const N: usize>(
    w: &[u8],
    a: &[BlockQ8K],
    multipliers: fn(&[u8; N]) -> [u8; 8],
    value: fn(&[u8; N], usize, usize) -> i8,
) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<N>(w).zip(a) {
        let scales = multipliers(w);
        let mut isum = 0i32;
        for (ib, y) in a.qs.chunks_exact(32).enumerate() {
            let s: i32 = y
                .iter()
                .enumerate()
                .map(|(j, &y)| i32::from(value(w, ib, j)) * i32::from(y))
                .sum();
            isum += i32::from(scales[ib]) * s;
        }
        sum += (f16_le([w[0], w[1]]) * a.d) * isum as f32;
    }
    sum
}
