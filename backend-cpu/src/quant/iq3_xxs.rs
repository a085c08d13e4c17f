//! IQ3_XXS (98 bytes, `block_iq3_xxs` of ggml-common.h): `d: f16`, then `qs: [u8; 96]`, whose
//! first 64 bytes are grid indices and whose last 32 are one little-endian `u32` per
//! 32-element sub-block, `scales_and_signs`. A sub-block is 8 groups of 4 weights, group `k`
//! of sub-block `ib` taking the four unsigned magnitudes (even values 4..62) of
//! [`IQ3XXS_GRID`]`[qs[8 ib + k]]`. Its `u32` holds four 7-bit sign indices (bits `7 l..7 l +
//! 7` for the elements `8 l..8 l + 8`) into [`KSIGNS_IQ2XS`], whose eighth bit restores an even
//! count of negatives, and the 4-bit scale `s` in bits 28..32. Element `j` of sub-block `ib`
//! is `((d * (0.5 + s)) * 0.5 * magnitude) * ±1`, as `dequantize_row_iq3_xxs` computes it.

use super::{blocks, f16_le};

/// Elements per super-block (`QK_K`).
const QK_K: usize = 256;

/// Bytes per IQ3_XXS super-block: `d: f16`, `qs: [u8; 64]`, `scales_and_signs: [u8; 32]`.
pub const IQ3_XXS_BYTES: usize = 98;

/// Offsets inside an IQ3_XXS super-block.
const QS: usize = 2;
const SCALES_AND_SIGNS: usize = 66;

/// The 256 grid entries of IQ3_XXS: four unsigned magnitudes per entry, byte `i` of the
/// little-endian `u32` the magnitude of a group's element `i`. This is ggml's constant table
/// `iq3xxs_grid` of `ggml-common.h` (llama.cpp b11434, MIT licence, © the ggml authors), copied
/// as it is there.
#[rustfmt::skip]
pub(crate) const IQ3XXS_GRID: [u32; 256] = [
    0x04040404, 0x04040414, 0x04040424, 0x04040c0c, 0x04040c1c, 0x04040c3e, 0x04041404, 0x04041414,
    0x04041c0c, 0x04042414, 0x04043e1c, 0x04043e2c, 0x040c040c, 0x040c041c, 0x040c0c04, 0x040c0c14,
    0x040c140c, 0x040c142c, 0x040c1c04, 0x040c1c14, 0x040c240c, 0x040c2c24, 0x040c3e04, 0x04140404,
    0x04140414, 0x04140424, 0x04140c0c, 0x04141404, 0x04141414, 0x04141c0c, 0x04141c1c, 0x04141c3e,
    0x04142c0c, 0x04142c3e, 0x04143e2c, 0x041c040c, 0x041c043e, 0x041c0c04, 0x041c0c14, 0x041c142c,
    0x041c3e04, 0x04240c1c, 0x04241c3e, 0x04242424, 0x04242c3e, 0x04243e1c, 0x04243e2c, 0x042c040c,
    0x042c043e, 0x042c1c14, 0x042c2c14, 0x04341c2c, 0x04343424, 0x043e0c04, 0x043e0c24, 0x043e0c34,
    0x043e241c, 0x043e340c, 0x0c04040c, 0x0c04041c, 0x0c040c04, 0x0c040c14, 0x0c04140c, 0x0c04141c,
    0x0c041c04, 0x0c041c14, 0x0c041c24, 0x0c04243e, 0x0c042c04, 0x0c0c0404, 0x0c0c0414, 0x0c0c0c0c,
    0x0c0c1404, 0x0c0c1414, 0x0c14040c, 0x0c14041c, 0x0c140c04, 0x0c140c14, 0x0c14140c, 0x0c141c04,
    0x0c143e14, 0x0c1c0404, 0x0c1c0414, 0x0c1c1404, 0x0c1c1c0c, 0x0c1c2434, 0x0c1c3434, 0x0c24040c,
    0x0c24042c, 0x0c242c04, 0x0c2c1404, 0x0c2c1424, 0x0c2c2434, 0x0c2c3e0c, 0x0c34042c, 0x0c3e1414,
    0x0c3e2404, 0x14040404, 0x14040414, 0x14040c0c, 0x14040c1c, 0x14041404, 0x14041414, 0x14041434,
    0x14041c0c, 0x14042414, 0x140c040c, 0x140c041c, 0x140c042c, 0x140c0c04, 0x140c0c14, 0x140c140c,
    0x140c1c04, 0x140c341c, 0x140c343e, 0x140c3e04, 0x14140404, 0x14140414, 0x14140c0c, 0x14140c3e,
    0x14141404, 0x14141414, 0x14141c3e, 0x14142404, 0x14142c2c, 0x141c040c, 0x141c0c04, 0x141c0c24,
    0x141c3e04, 0x141c3e24, 0x14241c2c, 0x14242c1c, 0x142c041c, 0x142c143e, 0x142c240c, 0x142c3e24,
    0x143e040c, 0x143e041c, 0x143e0c34, 0x143e242c, 0x1c04040c, 0x1c040c04, 0x1c040c14, 0x1c04140c,
    0x1c04141c, 0x1c042c04, 0x1c04342c, 0x1c043e14, 0x1c0c0404, 0x1c0c0414, 0x1c0c1404, 0x1c0c1c0c,
    0x1c0c2424, 0x1c0c2434, 0x1c14040c, 0x1c14041c, 0x1c140c04, 0x1c14142c, 0x1c142c14, 0x1c143e14,
    0x1c1c0c0c, 0x1c1c1c1c, 0x1c241c04, 0x1c24243e, 0x1c243e14, 0x1c2c0404, 0x1c2c0434, 0x1c2c1414,
    0x1c2c2c2c, 0x1c340c24, 0x1c341c34, 0x1c34341c, 0x1c3e1c1c, 0x1c3e3404, 0x24040424, 0x24040c3e,
    0x24041c2c, 0x24041c3e, 0x24042c1c, 0x24042c3e, 0x240c3e24, 0x24141404, 0x24141c3e, 0x24142404,
    0x24143404, 0x24143434, 0x241c043e, 0x241c242c, 0x24240424, 0x24242c0c, 0x24243424, 0x242c142c,
    0x242c241c, 0x242c3e04, 0x243e042c, 0x243e0c04, 0x243e0c14, 0x243e1c04, 0x2c040c14, 0x2c04240c,
    0x2c043e04, 0x2c0c0404, 0x2c0c0434, 0x2c0c1434, 0x2c0c2c2c, 0x2c140c24, 0x2c141c14, 0x2c143e14,
    0x2c1c0414, 0x2c1c2c1c, 0x2c240c04, 0x2c24141c, 0x2c24143e, 0x2c243e14, 0x2c2c0414, 0x2c2c1c0c,
    0x2c342c04, 0x2c3e1424, 0x2c3e2414, 0x34041424, 0x34042424, 0x34042434, 0x34043424, 0x340c140c,
    0x340c340c, 0x34140c3e, 0x34143424, 0x341c1c04, 0x341c1c34, 0x34242424, 0x342c042c, 0x342c2c14,
    0x34341c1c, 0x343e041c, 0x343e140c, 0x3e04041c, 0x3e04042c, 0x3e04043e, 0x3e040c04, 0x3e041c14,
    0x3e042c14, 0x3e0c1434, 0x3e0c2404, 0x3e140c14, 0x3e14242c, 0x3e142c14, 0x3e1c0404, 0x3e1c0c2c,
    0x3e1c1c1c, 0x3e1c3404, 0x3e24140c, 0x3e24240c, 0x3e2c0404, 0x3e2c0414, 0x3e2c1424, 0x3e341c04,
];

/// The eight sign bits of a 7-bit sign index: the index itself with, as bit 7, the parity of
/// its set bits, so every group of eight has an even number of negatives. This is ggml's
/// constant table `ksigns_iq2xs` of `ggml-common.h` (llama.cpp b11434, MIT licence, © the ggml
/// authors), copied as it is there (IQ2_XXS and IQ2_XS read it too).
#[rustfmt::skip]
pub(crate) const KSIGNS_IQ2XS: [u8; 128] = [
      0, 129, 130,   3, 132,   5,   6, 135, 136,   9,  10, 139,  12, 141, 142,  15,
    144,  17,  18, 147,  20, 149, 150,  23,  24, 153, 154,  27, 156,  29,  30, 159,
    160,  33,  34, 163,  36, 165, 166,  39,  40, 169, 170,  43, 172,  45,  46, 175,
     48, 177, 178,  51, 180,  53,  54, 183, 184,  57,  58, 187,  60, 189, 190,  63,
    192,  65,  66, 195,  68, 197, 198,  71,  72, 201, 202,  75, 204,  77,  78, 207,
     80, 209, 210,  83, 212,  85,  86, 215, 216,  89,  90, 219,  92, 221, 222,  95,
     96, 225, 226,  99, 228, 101, 102, 231, 232, 105, 106, 235, 108, 237, 238, 111,
    240, 113, 114, 243, 116, 245, 246, 119, 120, 249, 250, 123, 252, 125, 126, 255,
];

/// The `scales_and_signs` word of sub-block `ib` (0..8).
fn aux(block: &[u8; IQ3_XXS_BYTES], ib: usize) -> u32 {
    let at = SCALES_AND_SIGNS + 4 * ib;
    u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]])
}

/// The odd sub-block multipliers `1 + 2 s` of an IQ3_XXS super-block (each `1..=31`), `s` the
/// top nibble of the sub-block's `scales_and_signs` word: the dot's `ls` of
/// `ggml_vec_dot_iq3_xxs_q8_K`.
pub(crate) fn iq3_xxs_scales(block: &[u8; IQ3_XXS_BYTES]) -> [u8; 8] {
    std::array::from_fn(|ib| 1 + 2 * (aux(block, ib) >> 28) as u8)
}

/// The 32 sign bits of sub-block `ib` (0..8), bit `j` set where element `j` is negative: the
/// four [`KSIGNS_IQ2XS`] bytes of its 7-bit sign indices, little-endian.
pub(crate) fn iq3_xxs_signs(block: &[u8; IQ3_XXS_BYTES], ib: usize) -> u32 {
    let aux = aux(block, ib);
    let sign = |l: usize| KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
    u32::from_le_bytes([sign(0), sign(1), sign(2), sign(3)])
}

/// The grid entry of group `k` (0..8, elements `4 k..4 k + 4`) of sub-block `ib` (0..8).
pub(crate) fn iq3_xxs_entry(block: &[u8; IQ3_XXS_BYTES], ib: usize, k: usize) -> u32 {
    IQ3XXS_GRID[usize::from(block[QS + 8 * ib + k])]
}

/// The signed value of element `j` (0..32) of sub-block `ib` (0..8): its grid magnitude, negated
/// where bit `j` of [`iq3_xxs_signs`] is set; `|value| ≤ 62`.
pub(crate) fn iq3_xxs_value(block: &[u8; IQ3_XXS_BYTES], ib: usize, j: usize) -> i8 {
    let magnitude = iq3_xxs_entry(block, ib, j / 4).to_le_bytes()[j % 4] as i8;
    if (iq3_xxs_signs(block, ib) >> j) & 1 == 1 {
        -magnitude
    } else {
        magnitude
    }
}

/// IQ3_XXS: element `32 ib + j` is `(((d * (0.5 + s)) * 0.5) * magnitude) * ±1`, each product
/// rounded in that order (the halving exact) and the sign applied exactly, as ggml's.
pub(super) fn iq3_xxs(data: &[u8], out: &mut [f32]) {
    for (block, y) in blocks::<IQ3_XXS_BYTES, QK_K>(data, out) {
        let d = f16_le([block[0], block[1]]);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let db = d * (0.5 + (aux(block, ib) >> 28) as f32) * 0.5;
            for (j, y) in y.iter_mut().enumerate() {
                let v = iq3_xxs_value(block, ib, j);
                let sign = if v < 0 { -1.0 } else { 1.0 };
                *y = db * f32::from(v.unsigned_abs()) * sign;
            }
        }
    }
}
