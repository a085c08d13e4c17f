//! The 32-element legacy formats: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0.
//!
//! In the 4- and 5-bit formats, byte `j` of `qs` holds element `j` in its low nibble and
//! element `j + 16` in its high nibble. Each element is the C expression of
//! `dequantize_row_*`: the integer quant converted to f32, times `d` (then `+ m`).

use super::{blocks, f16_le};

/// Elements per block of every legacy format (`QK4_0` … `QK8_0`).
const QK: usize = 32;
const HALF: usize = QK / 2;

/// Q4_0 (18 bytes): `d: f16`, `qs: [u8; 16]`; `y = (q - 8) * d` with the subtraction in
/// integers.
pub(super) fn q4_0(data: &[u8], out: &mut [f32]) {
    for (block, y) in blocks::<18, QK>(data, out) {
        let d = f16_le([block[0], block[1]]);
        for j in 0..HALF {
            let q = block[2 + j];
            let x0 = i32::from(q & 0x0F) - 8;
            let x1 = i32::from(q >> 4) - 8;
            y[j] = x0 as f32 * d;
            y[j + HALF] = x1 as f32 * d;
        }
    }
}

/// Q4_1 (20 bytes): `d: f16`, `m: f16`, `qs: [u8; 16]`; `y = q * d + m`.
pub(super) fn q4_1(data: &[u8], out: &mut [f32]) {
    for (block, y) in blocks::<20, QK>(data, out) {
        let d = f16_le([block[0], block[1]]);
        let m = f16_le([block[2], block[3]]);
        for j in 0..HALF {
            let q = block[4 + j];
            y[j] = f32::from(q & 0x0F) * d + m;
            y[j + HALF] = f32::from(q >> 4) * d + m;
        }
    }
}

/// The fifth bits of a 5-bit block, moved to bit 4: bit `j` of `qh` for element `j`, bit
/// `j + 16` for element `j + 16`.
fn high_bits(qh: u32, j: usize) -> (u8, u8) {
    // `j < 16`, so both shifts are in range; the masks keep one bit, which fits a u8.
    let xh_0 = ((qh >> j) << 4) & 0x10;
    let xh_1 = (qh >> (j + 12)) & 0x10;
    (xh_0 as u8, xh_1 as u8)
}

/// Q5_0 (22 bytes): `d: f16`, `qh: u32`, `qs: [u8; 16]`; `y = (q - 16) * d` with the
/// subtraction in integers.
pub(super) fn q5_0(data: &[u8], out: &mut [f32]) {
    for (block, y) in blocks::<22, QK>(data, out) {
        let d = f16_le([block[0], block[1]]);
        let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
        for j in 0..HALF {
            let q = block[6 + j];
            let (xh_0, xh_1) = high_bits(qh, j);
            let x0 = i32::from((q & 0x0F) | xh_0) - 16;
            let x1 = i32::from((q >> 4) | xh_1) - 16;
            y[j] = x0 as f32 * d;
            y[j + HALF] = x1 as f32 * d;
        }
    }
}

/// Q5_1 (24 bytes): `d: f16`, `m: f16`, `qh: u32`, `qs: [u8; 16]`; `y = q * d + m`.
pub(super) fn q5_1(data: &[u8], out: &mut [f32]) {
    for (block, y) in blocks::<24, QK>(data, out) {
        let d = f16_le([block[0], block[1]]);
        let m = f16_le([block[2], block[3]]);
        let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
        for j in 0..HALF {
            let q = block[8 + j];
            let (xh_0, xh_1) = high_bits(qh, j);
            y[j] = f32::from((q & 0x0F) | xh_0) * d + m;
            y[j + HALF] = f32::from((q >> 4) | xh_1) * d + m;
        }
    }
}

/// Q8_0 (34 bytes): `d: f16`, `qs: [i8; 32]`; `y = q * d`.
pub(super) fn q8_0(data: &[u8], out: &mut [f32]) {
    for (block, y) in blocks::<34, QK>(data, out) {
        let d = f16_le([block[0], block[1]]);
        for j in 0..QK {
            let q = block[2 + j] as i8;
            y[j] = f32::from(q) * d;
        }
    }
}
