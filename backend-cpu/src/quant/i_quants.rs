//! The i-quants read so far: IQ4_NL and IQ4_XS, whose 4-bit indices select the values of one
//! fixed non-uniform grid, [`KVALUES_IQ4NL`], and IQ3_S, whose 9-bit indices select four
//! magnitudes at once from [`IQ3S_GRID`] and whose signs are stored apart (IQ3_XXS, the same
//! idea with 8-bit indices and parity-completed sign indices, in the sibling `iq3_xxs`).
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
//!
//! IQ3_S (110 bytes, `block_iq3_s` of ggml-common.h): `d: f16`, `qs: [u8; 64]`, `qh: [u8; 8]`,
//! `signs: [u8; 32]`, `scales: [u8; 4]`. The 256 weights form 8 sub-blocks of 32, each with a
//! 4-bit scale `s` (nibble `ib % 2` of `scales[ib / 2]`) used as the odd `1 + 2 s`; a sub-block
//! is 8 groups of 4 weights, group `k` of sub-block `ib` taking the grid entry of index
//! `qs[8 ib + k] | (bit k of qh[ib]) << 8` (four unsigned magnitudes, odd values 1..15), and
//! element `j` of the sub-block is negative where bit `j % 8` of `signs[4 ib + j / 8]` is set:
//! element `32 ib + j` is `((d * (1 + 2 s)) * magnitude) * ±1`, as `dequantize_row_iq3_s`
//! computes it.

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

/// Bytes per IQ3_S super-block: `d: f16`, `qs: [u8; 64]`, `qh: [u8; 8]`, `signs: [u8; 32]`,
/// `scales: [u8; 4]`.
pub const IQ3_S_BYTES: usize = 110;

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

/// Offsets inside an IQ3_S super-block.
const IQ3_S_QS: usize = 2;
const IQ3_S_QH: usize = 66;
const IQ3_S_SIGNS: usize = 74;
const IQ3_S_SCALES: usize = 106;

/// The 512 grid entries of IQ3_S: four unsigned magnitudes per entry, byte `i` of the
/// little-endian `u32` the magnitude of a group's element `i`. This is ggml's constant table
/// `iq3s_grid` of `ggml-common.h` (llama.cpp b11434, MIT licence, © the ggml authors), copied
/// as it is there.
#[rustfmt::skip]
pub(crate) const IQ3S_GRID: [u32; 512] = [
    0x01010101, 0x01010103, 0x01010105, 0x0101010b, 0x0101010f, 0x01010301, 0x01010303, 0x01010305,
    0x01010309, 0x0101030d, 0x01010501, 0x01010503, 0x0101050b, 0x01010707, 0x01010901, 0x01010905,
    0x0101090b, 0x0101090f, 0x01010b03, 0x01010b07, 0x01010d01, 0x01010d05, 0x01010f03, 0x01010f09,
    0x01010f0f, 0x01030101, 0x01030103, 0x01030105, 0x01030109, 0x01030301, 0x01030303, 0x0103030b,
    0x01030501, 0x01030507, 0x0103050f, 0x01030703, 0x0103070b, 0x01030909, 0x01030d03, 0x01030d0b,
    0x01030f05, 0x01050101, 0x01050103, 0x0105010b, 0x0105010f, 0x01050301, 0x01050307, 0x0105030d,
    0x01050503, 0x0105050b, 0x01050701, 0x01050709, 0x01050905, 0x0105090b, 0x0105090f, 0x01050b03,
    0x01050b07, 0x01050f01, 0x01050f07, 0x01070107, 0x01070303, 0x0107030b, 0x01070501, 0x01070505,
    0x01070703, 0x01070707, 0x0107070d, 0x01070909, 0x01070b01, 0x01070b05, 0x01070d0f, 0x01070f03,
    0x01070f0b, 0x01090101, 0x01090307, 0x0109030f, 0x01090503, 0x01090509, 0x01090705, 0x01090901,
    0x01090907, 0x01090b03, 0x01090f01, 0x010b0105, 0x010b0109, 0x010b0501, 0x010b0505, 0x010b050d,
    0x010b0707, 0x010b0903, 0x010b090b, 0x010b090f, 0x010b0d0d, 0x010b0f07, 0x010d010d, 0x010d0303,
    0x010d0307, 0x010d0703, 0x010d0b05, 0x010d0f03, 0x010f0101, 0x010f0105, 0x010f0109, 0x010f0501,
    0x010f0505, 0x010f050d, 0x010f0707, 0x010f0b01, 0x010f0b09, 0x03010101, 0x03010103, 0x03010105,
    0x03010109, 0x03010301, 0x03010303, 0x03010307, 0x0301030b, 0x0301030f, 0x03010501, 0x03010505,
    0x03010703, 0x03010709, 0x0301070d, 0x03010b09, 0x03010b0d, 0x03010d03, 0x03010f05, 0x03030101,
    0x03030103, 0x03030107, 0x0303010d, 0x03030301, 0x03030309, 0x03030503, 0x03030701, 0x03030707,
    0x03030903, 0x03030b01, 0x03030b05, 0x03030f01, 0x03030f0d, 0x03050101, 0x03050305, 0x0305030b,
    0x0305030f, 0x03050501, 0x03050509, 0x03050705, 0x03050901, 0x03050907, 0x03050b0b, 0x03050d01,
    0x03050f05, 0x03070103, 0x03070109, 0x0307010f, 0x03070301, 0x03070307, 0x03070503, 0x0307050f,
    0x03070701, 0x03070709, 0x03070903, 0x03070d05, 0x03070f01, 0x03090107, 0x0309010b, 0x03090305,
    0x03090309, 0x03090703, 0x03090707, 0x03090905, 0x0309090d, 0x03090b01, 0x03090b09, 0x030b0103,
    0x030b0301, 0x030b0307, 0x030b0503, 0x030b0701, 0x030b0705, 0x030b0b03, 0x030d0501, 0x030d0509,
    0x030d050f, 0x030d0909, 0x030d090d, 0x030f0103, 0x030f0107, 0x030f0301, 0x030f0305, 0x030f0503,
    0x030f070b, 0x030f0903, 0x030f0d05, 0x030f0f01, 0x05010101, 0x05010103, 0x05010107, 0x0501010b,
    0x0501010f, 0x05010301, 0x05010305, 0x05010309, 0x0501030d, 0x05010503, 0x05010507, 0x0501050f,
    0x05010701, 0x05010705, 0x05010903, 0x05010907, 0x0501090b, 0x05010b01, 0x05010b05, 0x05010d0f,
    0x05010f01, 0x05010f07, 0x05010f0b, 0x05030101, 0x05030105, 0x05030301, 0x05030307, 0x0503030f,
    0x05030505, 0x0503050b, 0x05030703, 0x05030709, 0x05030905, 0x05030b03, 0x05050103, 0x05050109,
    0x0505010f, 0x05050503, 0x05050507, 0x05050701, 0x0505070f, 0x05050903, 0x05050b07, 0x05050b0f,
    0x05050f03, 0x05050f09, 0x05070101, 0x05070105, 0x0507010b, 0x05070303, 0x05070505, 0x05070509,
    0x05070703, 0x05070707, 0x05070905, 0x05070b01, 0x05070d0d, 0x05090103, 0x0509010f, 0x05090501,
    0x05090507, 0x05090705, 0x0509070b, 0x05090903, 0x05090f05, 0x05090f0b, 0x050b0109, 0x050b0303,
    0x050b0505, 0x050b070f, 0x050b0901, 0x050b0b07, 0x050b0f01, 0x050d0101, 0x050d0105, 0x050d010f,
    0x050d0503, 0x050d0b0b, 0x050d0d03, 0x050f010b, 0x050f0303, 0x050f050d, 0x050f0701, 0x050f0907,
    0x050f0b01, 0x07010105, 0x07010303, 0x07010307, 0x0701030b, 0x0701030f, 0x07010505, 0x07010703,
    0x07010707, 0x0701070b, 0x07010905, 0x07010909, 0x0701090f, 0x07010b03, 0x07010d07, 0x07010f03,
    0x07030103, 0x07030107, 0x0703010b, 0x07030309, 0x07030503, 0x07030507, 0x07030901, 0x07030d01,
    0x07030f05, 0x07030f0d, 0x07050101, 0x07050305, 0x07050501, 0x07050705, 0x07050709, 0x07050b01,
    0x07070103, 0x07070301, 0x07070309, 0x07070503, 0x07070507, 0x0707050f, 0x07070701, 0x07070903,
    0x07070907, 0x0707090f, 0x07070b0b, 0x07070f07, 0x07090107, 0x07090303, 0x0709030d, 0x07090505,
    0x07090703, 0x07090b05, 0x07090d01, 0x07090d09, 0x070b0103, 0x070b0301, 0x070b0305, 0x070b050b,
    0x070b0705, 0x070b0909, 0x070b0b0d, 0x070b0f07, 0x070d030d, 0x070d0903, 0x070f0103, 0x070f0107,
    0x070f0501, 0x070f0505, 0x070f070b, 0x09010101, 0x09010109, 0x09010305, 0x09010501, 0x09010509,
    0x0901050f, 0x09010705, 0x09010903, 0x09010b01, 0x09010f01, 0x09030105, 0x0903010f, 0x09030303,
    0x09030307, 0x09030505, 0x09030701, 0x0903070b, 0x09030907, 0x09030b03, 0x09030b0b, 0x09050103,
    0x09050107, 0x09050301, 0x0905030b, 0x09050503, 0x09050707, 0x09050901, 0x09050b0f, 0x09050d05,
    0x09050f01, 0x09070109, 0x09070303, 0x09070307, 0x09070501, 0x09070505, 0x09070703, 0x0907070b,
    0x09090101, 0x09090105, 0x09090509, 0x0909070f, 0x09090901, 0x09090f03, 0x090b010b, 0x090b010f,
    0x090b0503, 0x090b0d05, 0x090d0307, 0x090d0709, 0x090d0d01, 0x090f0301, 0x090f030b, 0x090f0701,
    0x090f0907, 0x090f0b03, 0x0b010105, 0x0b010301, 0x0b010309, 0x0b010505, 0x0b010901, 0x0b010909,
    0x0b01090f, 0x0b010b05, 0x0b010d0d, 0x0b010f09, 0x0b030103, 0x0b030107, 0x0b03010b, 0x0b030305,
    0x0b030503, 0x0b030705, 0x0b030f05, 0x0b050101, 0x0b050303, 0x0b050507, 0x0b050701, 0x0b05070d,
    0x0b050b07, 0x0b070105, 0x0b07010f, 0x0b070301, 0x0b07050f, 0x0b070909, 0x0b070b03, 0x0b070d0b,
    0x0b070f07, 0x0b090103, 0x0b090109, 0x0b090501, 0x0b090705, 0x0b09090d, 0x0b0b0305, 0x0b0b050d,
    0x0b0b0b03, 0x0b0b0b07, 0x0b0d0905, 0x0b0f0105, 0x0b0f0109, 0x0b0f0505, 0x0d010303, 0x0d010307,
    0x0d01030b, 0x0d010703, 0x0d010707, 0x0d010d01, 0x0d030101, 0x0d030501, 0x0d03050f, 0x0d030d09,
    0x0d050305, 0x0d050709, 0x0d050905, 0x0d050b0b, 0x0d050d05, 0x0d050f01, 0x0d070101, 0x0d070309,
    0x0d070503, 0x0d070901, 0x0d09050b, 0x0d090907, 0x0d090d05, 0x0d0b0101, 0x0d0b0107, 0x0d0b0709,
    0x0d0b0d01, 0x0d0d010b, 0x0d0d0901, 0x0d0f0303, 0x0d0f0307, 0x0f010101, 0x0f010109, 0x0f01010f,
    0x0f010501, 0x0f010505, 0x0f01070d, 0x0f010901, 0x0f010b09, 0x0f010d05, 0x0f030105, 0x0f030303,
    0x0f030509, 0x0f030907, 0x0f03090b, 0x0f050103, 0x0f050109, 0x0f050301, 0x0f05030d, 0x0f050503,
    0x0f050701, 0x0f050b03, 0x0f070105, 0x0f070705, 0x0f07070b, 0x0f070b07, 0x0f090103, 0x0f09010b,
    0x0f090307, 0x0f090501, 0x0f090b01, 0x0f0b0505, 0x0f0b0905, 0x0f0d0105, 0x0f0d0703, 0x0f0f0101,
];

/// The odd sub-block multipliers `1 + 2 s` of an IQ3_S super-block (each `1..=31`): `s` is
/// nibble `ib % 2` of `scales[ib / 2]`.
pub(crate) fn iq3_s_scales(block: &[u8; IQ3_S_BYTES]) -> [u8; 8] {
    std::array::from_fn(|ib| 1 + 2 * ((block[IQ3_S_SCALES + ib / 2] >> (4 * (ib % 2))) & 0x0F))
}

/// The grid index (0..512) of group `k` (0..8, elements `4 k..4 k + 4`) of sub-block `ib`
/// (0..8): `qs[8 ib + k]` with bit `k` of `qh[ib]` as its ninth bit.
pub(crate) fn iq3_s_index(block: &[u8; IQ3_S_BYTES], ib: usize, k: usize) -> usize {
    let low = usize::from(block[IQ3_S_QS + 8 * ib + k]);
    let high = usize::from((block[IQ3_S_QH + ib] >> k) & 1);
    low | (high << 8)
}

/// The signed value of element `j` (0..32) of sub-block `ib` (0..8): its grid magnitude
/// (byte `j % 4` of the group's entry), negated where bit `j % 8` of `signs[4 ib + j / 8]` is
/// set; `|value| ≤ 15`.
pub(crate) fn iq3_s_value(block: &[u8; IQ3_S_BYTES], ib: usize, j: usize) -> i8 {
    let entry = IQ3S_GRID[iq3_s_index(block, ib, j / 4)];
    let magnitude = entry.to_le_bytes()[j % 4] as i8;
    if (block[IQ3_S_SIGNS + 4 * ib + j / 8] >> (j % 8)) & 1 == 1 {
        -magnitude
    } else {
        magnitude
    }
}

/// IQ3_S: element `32 ib + j` is `((d * (1 + 2 s_ib)) * magnitude) * ±1` (see
/// [`iq3_s_value`]), the product rounded once and then multiplied by ±1 exactly, as ggml's.
pub(super) fn iq3_s(data: &[u8], out: &mut [f32]) {
    for (block, y) in blocks::<IQ3_S_BYTES, QK_K>(data, out) {
        let d = f16_le([block[0], block[1]]);
        let scales = iq3_s_scales(block);
        for (ib, (&ls, y)) in scales.iter().zip(y.chunks_exact_mut(32)).enumerate() {
            let db = d * f32::from(ls);
            for (j, y) in y.iter_mut().enumerate() {
                let v = iq3_s_value(block, ib, j);
                let sign = if v < 0 { -1.0 } else { 1.0 };
                *y = db * f32::from(v.unsigned_abs()) * sign;
            }
        }
    }
}
