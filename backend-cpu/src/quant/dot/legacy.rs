//! Scalar kernels of the 32-element legacy formats (see the parent module for the order).
//!
//! In the 4- and 5-bit formats, byte `j` of `qs` holds element `j` in its low nibble and
//! element `j + 16` in its high nibble; a 5-bit format's fifth bits are bit `j` of the
//! little-endian `qh: u32` for element `j`.

use super::{
    BlockQ8_0, BlockQ8_1, Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q5_1_BYTES, Q8_0_BYTES, QK8, f16_le,
    weight_blocks,
};

/// Exact `Σ (w_j - offset) · y_j` over a 4-bit (`qh = 0`) or 5-bit block: low nibble of
/// byte `j` is element `j`, high nibble element `j + 16` (ggml's layout), bit `j` of `qh` the
/// fifth bit of element `j`. At most `32 · 31 · 128 < 2^17` in magnitude.
fn packed_dot(qs: &[u8], qh: u32, y: &[i8; QK8], offset: i32) -> i32 {
    let (y_lo, y_hi) = y.split_at(QK8 / 2);
    qs.iter()
        .zip(y_lo.iter().zip(y_hi))
        .enumerate()
        .map(|(j, (&q, (&y0, &y1)))| {
            // `j < 16`: both shifts are in range and each keeps one bit, moved to bit 4.
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            let x0 = (u32::from(q & 0x0F) | h0) as i32 - offset;
            let x1 = (u32::from(q >> 4) | h1) as i32 - offset;
            x0 * i32::from(y0) + x1 * i32::from(y1)
        })
        .sum()
}

/// The little-endian u32 at bytes `OFF..OFF + 4` of a block.
fn qh_at<const B: usize, const OFF: usize>(w: &[u8; B]) -> u32 {
    const { assert!(OFF + 4 <= B) };
    u32::from_le_bytes([w[OFF], w[OFF + 1], w[OFF + 2], w[OFF + 3]])
}

pub(in crate::quant::dot) fn q8_0_q8_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q8_0_BYTES>(w).zip(a) {
        let isum: i32 = w[2..]
            .iter()
            .zip(&a.qs)
            .map(|(&q, &y)| i32::from(q as i8) * i32::from(y))
            .sum();
        sum += (f16_le([w[0], w[1]]) * a.d.to_f32()) * isum as f32;
    }
    sum
}

pub(in crate::quant::dot) fn q4_0_q8_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q4_0_BYTES>(w).zip(a) {
        let isum = packed_dot(&w[2..], 0, &a.qs, 8);
        sum += (f16_le([w[0], w[1]]) * a.d.to_f32()) * isum as f32;
    }
    sum
}

pub(in crate::quant::dot) fn q4_1_q8_1(w: &[u8], a: &[BlockQ8_1]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q4_1_BYTES>(w).zip(a) {
        let isum = packed_dot(&w[4..], 0, &a.qs, 0);
        let (d, m) = (f16_le([w[0], w[1]]), f16_le([w[2], w[3]]));
        sum += (d * a.d.to_f32()) * isum as f32 + m * a.s.to_f32();
    }
    sum
}

pub(in crate::quant::dot) fn q5_0_q8_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q5_0_BYTES>(w).zip(a) {
        let isum = packed_dot(&w[6..], qh_at::<Q5_0_BYTES, 2>(w), &a.qs, 16);
        sum += (f16_le([w[0], w[1]]) * a.d.to_f32()) * isum as f32;
    }
    sum
}

pub(in crate::quant::dot) fn q5_1_q8_1(w: &[u8], a: &[BlockQ8_1]) -> f32 {
    let mut sum = 0.0f32;
    for (w, a) in weight_blocks::<Q5_1_BYTES>(w).zip(a) {
        let isum = packed_dot(&w[8..], qh_at::<Q5_1_BYTES, 4>(w), &a.qs, 0);
        let (d, m) = (f16_le([w[0], w[1]]), f16_le([w[2], w[3]]));
        sum += (d * a.d.to_f32()) * isum as f32 + m * a.s.to_f32();
    }
    sum
}
