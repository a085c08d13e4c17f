//! The 256-element k-quant super-blocks: Q2_K, Q3_K, Q4_K, Q5_K and Q6_K (layouts as ggml's
//! `block_q*_K` in ggml-common.h, values as `dequantize_row_q*_K` in ggml-quants.c).
//!
//! Q2_K has 16 sub-blocks of 16, each with a 4-bit scale and a 4-bit min in one byte:
//! `(d * sc) * q - (dmin * m)`, `q` an unsigned 2-bit quant.
//! Q3_K has 16 sub-blocks of 16 with 6-bit scales stored with an offset of 32:
//! `(d * (sc - 32)) * q`, `q` a signed 3-bit quant (2 low bits in `qs`, the third in `hmask`).
//! Q4_K and Q5_K split a super-block into 8 sub-blocks of 32 with a 6-bit scale and a 6-bit min
//! each, packed into 12 bytes; elements are `d * sc * q - dmin * m`, computed as
//! `dequantize_row_q4_K` does: `(d * sc) * q - (dmin * m)`. Q6_K has 16 sub-blocks of 16 with
//! signed 8-bit scales: `(d * sc) * q`.

use super::{blocks, f16_le};

/// Elements per super-block (`QK_K`).
const QK_K: usize = 256;

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes, as `get_scale_min_k4`.
///
/// Bytes 0..4 hold the 6-bit scales of sub-blocks 0..4, bytes 4..8 their mins; sub-blocks 4..8
/// keep their low 4 bits in the nibbles of bytes 8..12 and their top 2 bits in the top 2 bits
/// of bytes 0..8.
pub(crate) fn scale_min(j: usize, scales: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        let sc = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4);
        let m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
        (sc, m)
    }
}

/// The 12 packed scale bytes of a Q4_K or Q5_K block, which follow `d` and `dmin`.
fn packed_scales(block: &[u8]) -> [u8; 12] {
    let mut scales = [0; 12];
    scales.copy_from_slice(&block[4..16]);
    scales
}

/// The `(d1, m1)` of sub-block `j`: `d * sc` and `dmin * m`, each one f32 multiplication.
fn sub_block(j: usize, scales: &[u8; 12], d: f32, dmin: f32) -> (f32, f32) {
    let (sc, m) = scale_min(j, scales);
    (d * f32::from(sc), dmin * f32::from(m))
}

/// Bytes per Q2_K super-block: `scales: [u8; 16]` (scale in the low nibble, min in the high),
/// `qs: [u8; 64]`, `d, dmin: f16`.
pub const Q2_K_BYTES: usize = 84;

/// The unsigned 2-bit quant of element `128 h + 32 k + l` of a Q2_K block (h in 0..2, k in
/// 0..4, l in 0..32): bits `2k..2k + 2` of `qs[32 h + l]`; its scale byte is
/// `scales[8 h + 2 k + l / 16]` (the same walk as Q3_K's low bits).
pub(crate) fn q2_k_quant(block: &[u8; Q2_K_BYTES], h: usize, k: usize, l: usize) -> u8 {
    (block[16 + 32 * h + l] >> (2 * k)) & 3
}

/// Q2_K (84 bytes): element `128 h + 32 k + l` is `(d * sc) * q - (dmin * m)` with `sc`, `m`
/// the low and high nibbles of `scales[8 h + 2 k + l / 16]` and `q` [`q2_k_quant`], each
/// product one f32 rounding as in `dequantize_row_q2_K`.
pub(super) fn q2_k(data: &[u8], out: &mut [f32]) {
    for (block, y) in blocks::<Q2_K_BYTES, QK_K>(data, out) {
        let d = f16_le([block[80], block[81]]);
        let dmin = f16_le([block[82], block[83]]);
        for (i, y) in y.iter_mut().enumerate() {
            let (h, k, l) = (i / 128, (i / 32) % 4, i % 32);
            let sc = block[8 * h + 2 * k + l / 16];
            let (dl, ml) = (d * f32::from(sc & 0x0F), dmin * f32::from(sc >> 4));
            *y = dl * f32::from(q2_k_quant(block, h, k, l)) - ml;
        }
    }
}

/// The 16 scales of a Q3_K block (bytes 96..108, each `0..64`, stored with an offset of 32),
/// as `dequantize_row_q3_K` unpacks them: scale `j` takes its low 4 bits from nibble `j / 8`
/// of byte `j % 8` and its top 2 bits from bits `2 (j / 4)..` of byte `8 + j % 4`.
pub(crate) fn q3_k_scales(packed: &[u8; 12]) -> [u8; 16] {
    std::array::from_fn(|j| {
        let low = (packed[j % 8] >> (4 * (j / 8))) & 0x0F;
        let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        low | (high << 4)
    })
}

/// The signed 3-bit quant of element `128 h + 32 k + l` of a Q3_K block (h in 0..2, k in 0..4,
/// l in 0..32): bits `2k..2k + 2` of `qs[32 h + l]`, minus 4 unless bit `4 h + k` of `hmask[l]`
/// is set.
pub(crate) fn q3_k_quant(block: &[u8; 110], h: usize, k: usize, l: usize) -> i8 {
    let low = ((block[32 + 32 * h + l] >> (2 * k)) & 3) as i8;
    let high_set = block[l] & (1 << (4 * h + k)) != 0;
    if high_set { low } else { low - 4 }
}

/// Q3_K (110 bytes): `hmask: [u8; 32]`, `qs: [u8; 64]`, `scales: [u8; 12]`, `d: f16`. Element
/// `128 h + 32 k + l` is `(d * (sc[8 h + 2 k + l / 16] - 32)) * q` (see [`q3_k_quant`]).
pub(super) fn q3_k(data: &[u8], out: &mut [f32]) {
    for (block, y) in blocks::<110, QK_K>(data, out) {
        let d = f16_le([block[108], block[109]]);
        let mut packed = [0; 12];
        packed.copy_from_slice(&block[96..108]);
        let scales = q3_k_scales(&packed);
        for (i, y) in y.iter_mut().enumerate() {
            let (h, k, l) = (i / 128, (i / 32) % 4, i % 32);
            let dl = d * f32::from(scales[8 * h + 2 * k + l / 16] as i8 - 32);
            *y = dl * f32::from(q3_k_quant(block, h, k, l));
        }
    }
}

/// Q4_K (144 bytes): `d: f16`, `dmin: f16`, `scales: [u8; 12]`, `qs: [u8; 128]`. Each 32 bytes
/// of `qs` hold two sub-blocks: the low nibbles the first, the high nibbles the second.
pub(super) fn q4_k(data: &[u8], out: &mut [f32]) {
    for (block, y) in blocks::<144, QK_K>(data, out) {
        let d = f16_le([block[0], block[1]]);
        let dmin = f16_le([block[2], block[3]]);
        let scales = packed_scales(block);
        let qs = &block[16..144];
        for (pair, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
            let (d1, m1) = sub_block(2 * pair, &scales, d, dmin);
            let (d2, m2) = sub_block(2 * pair + 1, &scales, d, dmin);
            let (lo, hi) = y.split_at_mut(32);
            for ((&q, lo), hi) in q.iter().zip(lo).zip(hi) {
                *lo = d1 * f32::from(q & 0x0F) - m1;
                *hi = d2 * f32::from(q >> 4) - m2;
            }
        }
    }
}

/// Q5_K (176 bytes): `d: f16`, `dmin: f16`, `scales: [u8; 12]`, `qh: [u8; 32]`,
/// `qs: [u8; 128]`. Low nibbles as in Q4_K; the fifth bit of element `l` of sub-block `s` is
/// bit `s` of `qh[l]`.
pub(super) fn q5_k(data: &[u8], out: &mut [f32]) {
    for (block, y) in blocks::<176, QK_K>(data, out) {
        let d = f16_le([block[0], block[1]]);
        let dmin = f16_le([block[2], block[3]]);
        let scales = packed_scales(block);
        let qh = &block[16..48];
        let qs = &block[48..176];
        for (pair, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
            let (d1, m1) = sub_block(2 * pair, &scales, d, dmin);
            let (d2, m2) = sub_block(2 * pair + 1, &scales, d, dmin);
            let u1 = 1u8 << (2 * pair);
            let u2 = 2u8 << (2 * pair);
            let (lo, hi) = y.split_at_mut(32);
            for (((&q, &h), lo), hi) in q.iter().zip(qh).zip(lo).zip(hi) {
                // The quant is assembled in integers (at most 31), then converted: exact.
                let x0 = (q & 0x0F) + if h & u1 != 0 { 16 } else { 0 };
                let x1 = (q >> 4) + if h & u2 != 0 { 16 } else { 0 };
                *lo = d1 * f32::from(x0) - m1;
                *hi = d2 * f32::from(x1) - m2;
            }
        }
    }
}

/// Q6_K (210 bytes): `ql: [u8; 128]`, `qh: [u8; 64]`, `scales: [i8; 16]`, `d: f16`.
///
/// Each half of the super-block (128 elements) uses 64 bytes of `ql`, 32 of `qh` and 8 scales.
/// Element `l + 32 * k` (k in 0..4, l in 0..32) takes nibble `k / 2` of `ql[l + 32 * (k % 2)]`
/// and bits `2k..2k+2` of `qh[l]`, minus 32; its scale is `scales[l / 16 + 2 * k]`.
pub(super) fn q6_k(data: &[u8], out: &mut [f32]) {
    for (block, y) in blocks::<210, QK_K>(data, out) {
        let d = f16_le([block[208], block[209]]);
        let halves = block[0..128]
            .chunks_exact(64)
            .zip(block[128..192].chunks_exact(32))
            .zip(block[192..208].chunks_exact(8))
            .zip(y.chunks_exact_mut(128));
        for (((ql, qh), sc), y) in halves {
            for l in 0..32 {
                let is = l / 16;
                let h = qh[l];
                // Each quant is at most 63 before the subtraction, so it fits an i8 as in C.
                let q1 = ((ql[l] & 0x0F) | ((h & 3) << 4)) as i8 - 32;
                let q2 = ((ql[l + 32] & 0x0F) | (((h >> 2) & 3) << 4)) as i8 - 32;
                let q3 = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
                let scale = |k: usize| d * f32::from(sc[is + 2 * k] as i8);
                y[l] = scale(0) * f32::from(q1);
                y[l + 32] = scale(1) * f32::from(q2);
                y[l + 64] = scale(2) * f32::from(q3);
                y[l + 96] = scale(3) * f32::from(q4);
            }
        }
    }
}
