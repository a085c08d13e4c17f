//! The i-quants read so far: IQ4_NL and IQ4_XS, whose 4-bit indices select the values of one
//! fixed non-uniform grid, [`KVALUES_IQ4NL`].
//!
//! IQ4_NL (18 bytes, `block_iq4_nl` of ggml-common.h): `d: f16`, `qs: [u8; 16]`, the legacy
//! 32-element shape of Q4_0: byte `j` of `qs` holds element `j`'s index in its low nibble and
//! element `j + 16`'s in its high one, and element `j` is `d * KVALUES_IQ4NL[index]`, as
//! `dequantize_row_iq4_nl` computes it.
//!
//! IQ4_XS (136 bytes, `block_iq4_xs` of ggml-common.h): `d: f16`, `scales_h: u16`,
//! `scales_l: [u8; 4]`, `qs: [u8; 128]`. The 256 weights form 8 sub-blocks of 32, each with a
//! 6-bit scale stored with an offset of 32 (low 4 bits in `scales_l`, top 2 in `scales_h`);
//! a weight is a 4-bit index into [`KVALUES_IQ4NL`], a fixed non-uniform grid, so element `l`
//! of sub-block `ib` is `(d * (ls_ib - 32)) * KVALUES_IQ4NL[index]`, as
//! `dequantize_row_iq4_xs` computes it.

use super::{blocks, f16_le};

/// Elements per super-block (`QK_K`).
const QK_K: usize = 256;

/// Elements per IQ4_NL block (`QK4_NL`).
const QK4_NL: usize = 32;

/// Bytes per IQ4_NL block: `d: f16`, `qs: [u8; 16]`.
pub const IQ4_NL_BYTES: usize = 18;

/// Bytes per IQ4_XS super-block: `d: f16`, `scales_h: u16`, `scales_l: [u8; 4]`,
/// `qs: [u8; 128]`.
pub const IQ4_XS_BYTES: usize = 136;

/// The 16 values a 4-bit IQ4_NL / IQ4_XS index selects: `kvalues_iq4nl` of ggml's
/// `ggml-common.h` (llama.cpp b11434), denser near zero, where trained weights cluster.
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The grid value of element `j` (0..32) of a 32-element block whose 16 index bytes are `qs`:
/// the low nibbles are elements 0..16, the high ones 16..32 (IQ4_NL's block, and each of
/// IQ4_XS's sub-blocks).
pub(crate) fn iq4_value(qs: &[u8; 16], j: usize) -> i8 {
    KVALUES_IQ4NL[usize::from((qs[j % 16] >> (4 * (j / 16))) & 0x0F)]
}

/// IQ4_NL: element `j` is `d * value` (see [`iq4_value`]).
pub(super) fn iq4_nl(data: &[u8], out: &mut [f32]) {
    for (block, y) in blocks::<IQ4_NL_BYTES, QK4_NL>(data, out) {
        let [d0, d1, qs @ ..] = block;
        let d = f16_le([*d0, *d1]);
        for (j, y) in y.iter_mut().enumerate() {
            *y = d * f32::from(iq4_value(qs, j));
        }
    }
}

/// The eight 6-bit sub-block scales of an IQ4_XS super-block (each `0..64`, stored with an
/// offset of 32): scale `ib` takes its low 4 bits from nibble `ib % 2` of `scales_l[ib / 2]`
/// (byte `4 + ib / 2`) and its top 2 bits from bits `2 ib..2 ib + 2` of the little-endian
/// `scales_h` (bytes 2..4).
pub(crate) fn iq4_xs_scales(block: &[u8; IQ4_XS_BYTES]) -> [u8; 8] {
    let high = u16::from_le_bytes([block[2], block[3]]);
    std::array::from_fn(|ib| {
        let low = (block[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let top = ((high >> (2 * ib)) & 3) as u8;
        low | (top << 4)
    })
}

/// The grid value of element `l` (0..32) of sub-block `ib` (0..8): the 16 bytes of `qs` at
/// `8 + 16 ib` hold elements 0..16 in their low nibbles and 16..32 in their high ones.
pub(crate) fn iq4_xs_value(block: &[u8; IQ4_XS_BYTES], ib: usize, l: usize) -> i8 {
    let qs = block[8 + 16 * ib..][..16].try_into().unwrap_or(&[0; 16]);
    iq4_value(qs, l)
}

/// IQ4_XS: element `32 ib + l` is `(d * (ls_ib - 32)) * value` (see [`iq4_xs_value`]).
pub(super) fn iq4_xs(data: &[u8], out: &mut [f32]) {
    for (block, y) in blocks::<IQ4_XS_BYTES, QK_K>(data, out) {
        let d = f16_le([block[0], block[1]]);
        let scales = iq4_xs_scales(block);
        for (ib, (&ls, y)) in scales.iter().zip(y.chunks_exact_mut(32)).enumerate() {
            let dl = d * f32::from(ls as i8 - 32);
            for (l, y) in y.iter_mut().enumerate() {
                *y = dl * f32::from(iq4_xs_value(block, ib, l));
            }
        }
    }
}
