//! Hand-built blocks with known values, length errors, and random input that must never panic.

#![allow(clippy::unwrap_used)]

use super::test_rng::Rng;
use super::*;

const F16_ONE: [u8; 2] = [0x00, 0x3C];
pub(super) const F16_HALF: [u8; 2] = [0x00, 0x38];
pub(super) const F16_QUARTER: [u8; 2] = [0x00, 0x34];
const F16_MINUS_ONE: [u8; 2] = [0x00, 0xBC];

pub(super) fn run(ggml_type: GgmlType, data: &[u8]) -> Vec<f32> {
    let mut out = vec![f32::NAN; element_count(ggml_type, data.len()).unwrap()];
    dequantize(ggml_type, data, &mut out).unwrap();
    out
}

/// Asserts bit equality, so `-0.0` and `0.0` differ.
pub(super) fn assert_bits(ours: &[f32], expected: &[f32]) {
    assert_eq!(ours.len(), expected.len());
    for (i, (a, b)) in ours.iter().zip(expected).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "element {i}: {a} vs {b}");
    }
}

#[test]
fn plain_floats() {
    let mut data = Vec::new();
    for x in [1.5f32, -2.0, f32::INFINITY, -0.0] {
        data.extend_from_slice(&x.to_le_bytes());
    }
    assert_bits(
        &run(GgmlType::F32, &data),
        &[1.5, -2.0, f32::INFINITY, -0.0],
    );
    // A NaN payload survives F32 untouched.
    let nan = run(GgmlType::F32, &0x7FA0_0001u32.to_le_bytes());
    assert_eq!(nan[0].to_bits(), 0x7FA0_0001);

    let f16 = [F16_ONE, [0x00, 0xC0], [0x01, 0x00], [0x00, 0x7C]].concat();
    let smallest_subnormal = 2f32.powi(-24);
    assert_bits(
        &run(GgmlType::F16, &f16),
        &[1.0, -2.0, smallest_subnormal, f32::INFINITY],
    );

    let bf16 = [[0x80, 0x3F], [0x20, 0xC0], [0x81, 0x7F]].concat();
    let out = run(GgmlType::BF16, &bf16);
    assert_bits(&out[..2], &[1.0, -2.5]);
    // A signalling NaN keeps its bits, as ggml's shift does (half would set the quiet bit).
    assert_eq!(out[2].to_bits(), 0x7F81_0000);
}

#[test]
fn q4_0_is_signed_nibbles_times_d() {
    let mut block = F16_HALF.to_vec();
    block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let expected: Vec<f32> = (0..16)
        .map(|j| (j - 8) as f32 * 0.5)
        .chain((0..16).map(|j| (7 - j) as f32 * 0.5))
        .collect();
    assert_bits(&run(GgmlType::Q4_0, &block), &expected);
}

#[test]
fn q4_1_adds_the_min() {
    let mut block = [F16_HALF, F16_MINUS_ONE].concat();
    block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let expected: Vec<f32> = (0..16)
        .map(|j| j as f32 * 0.5 - 1.0)
        .chain((0..16).map(|j| (15 - j) as f32 * 0.5 - 1.0))
        .collect();
    assert_bits(&run(GgmlType::Q4_1, &block), &expected);
}

#[test]
fn q5_0_takes_the_fifth_bit_from_qh() {
    // Fifth bits set for elements 16..32 and for element 3.
    let qh: u32 = 0xFFFF_0000 | (1 << 3);
    let mut block = F16_ONE.to_vec();
    block.extend_from_slice(&qh.to_le_bytes());
    block.extend((0..16u8).map(|j| j | (j << 4)));
    let expected: Vec<f32> = (0..16)
        .map(|j| if j == 3 { 3.0 } else { j as f32 - 16.0 })
        .chain((0..16).map(|j| j as f32))
        .collect();
    assert_bits(&run(GgmlType::Q5_0, &block), &expected);
}

#[test]
fn q5_1_takes_the_fifth_bit_and_adds_the_min() {
    let qh: u32 = 0x0000_FFFF;
    let mut block = [F16_ONE, F16_HALF].concat();
    block.extend_from_slice(&qh.to_le_bytes());
    block.extend((0..16u8).map(|j| j | (j << 4)));
    let expected: Vec<f32> = (0..16)
        .map(|j| (j + 16) as f32 + 0.5)
        .chain((0..16).map(|j| j as f32 + 0.5))
        .collect();
    assert_bits(&run(GgmlType::Q5_1, &block), &expected);
}

#[test]
fn q8_0_is_signed_bytes_times_d() {
    let mut block = F16_QUARTER.to_vec();
    block.extend((0..32i8).map(|j| (j * 4 - 64) as u8));
    let expected: Vec<f32> = (0..32).map(|j| (j * 4 - 64) as f32 * 0.25).collect();
    assert_bits(&run(GgmlType::Q8_0, &block), &expected);
}

/// Packs 8 six-bit scales and mins the way `get_scale_min_k4` unpacks them.
fn pack_scales(sc: [u8; 8], m: [u8; 8]) -> [u8; 12] {
    let mut packed = [0u8; 12];
    for j in 0..4 {
        packed[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        packed[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        packed[j + 8] = (sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4);
    }
    packed
}

const SCALES: [u8; 8] = [1, 2, 3, 63, 17, 33, 48, 5];
const MINS: [u8; 8] = [0, 1, 62, 3, 40, 21, 7, 63];

#[test]
fn k4_scales_unpack_to_what_was_packed() {
    let packed = pack_scales(SCALES, MINS);
    for j in 0..8 {
        assert_eq!(
            super::k_quants::scale_min(j, &packed),
            (SCALES[j], MINS[j]),
            "{j}"
        );
    }
}

/// Low nibble `l % 16`, high nibble `15 - l % 16`: every quant value in every sub-block.
fn nibbles(l: usize) -> u8 {
    let q = (l % 16) as u8;
    q | ((15 - q) << 4)
}

#[test]
fn q4_k_is_scaled_nibbles_minus_scaled_mins() {
    let mut block = [F16_ONE, F16_HALF].concat();
    block.extend_from_slice(&pack_scales(SCALES, MINS));
    block.extend((0..128).map(nibbles));
    // Sub-block s covers elements 32s..32s+32; its quants are in bytes 32(s/2).. of qs, low
    // nibbles for even s, high for odd. All values are small, so they are exact in f32.
    let expected: Vec<f32> = (0..256)
        .map(|e| {
            let (s, l) = (e / 32, e % 32);
            let byte = nibbles(32 * (s / 2) + l);
            let q = if s % 2 == 0 { byte & 0x0F } else { byte >> 4 };
            f32::from(SCALES[s]) * f32::from(q) - 0.5 * f32::from(MINS[s])
        })
        .collect();
    assert_bits(&run(GgmlType::Q4_K, &block), &expected);
}

#[test]
fn q5_k_adds_sixteen_for_the_high_bit() {
    let qh: Vec<u8> = (0..32u8).map(|l| l.wrapping_mul(37) ^ 0x5A).collect();
    let mut block = [F16_ONE, F16_HALF].concat();
    block.extend_from_slice(&pack_scales(SCALES, MINS));
    block.extend_from_slice(&qh);
    block.extend((0..128).map(nibbles));
    let expected: Vec<f32> = (0..256)
        .map(|e| {
            let (s, l) = (e / 32, e % 32);
            let byte = nibbles(32 * (s / 2) + l);
            let low = if s % 2 == 0 { byte & 0x0F } else { byte >> 4 };
            // The fifth bit of sub-block s is bit s of qh[l].
            let q = low + 16 * ((qh[l] >> s) & 1);
            f32::from(SCALES[s]) * f32::from(q) - 0.5 * f32::from(MINS[s])
        })
        .collect();
    assert_bits(&run(GgmlType::Q5_K, &block), &expected);
}

#[test]
fn q3_k_is_signed_three_bit_quants_times_offset_scales() {
    let hmask: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(41) ^ 0x69).collect();
    let qs: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(23) ^ 0x96).collect();
    // The 16 six-bit scales, packed as ggml's `quantize_row_q3_K_ref` packs them: low nibbles
    // of 0..8 in bytes 0..8, of 8..16 in their high nibbles, top two bits in bytes 8..12.
    let scales: Vec<u8> = (0..16u8).map(|j| (j * 13 + 5) % 64).collect();
    let mut packed = [0u8; 12];
    for (j, &s) in scales.iter().enumerate() {
        packed[j % 8] |= (s & 0x0F) << (4 * (j / 8));
        packed[8 + j % 4] |= (s >> 4) << (2 * (j / 4));
    }
    let mut block = hmask.clone();
    block.extend_from_slice(&qs);
    block.extend_from_slice(&packed);
    block.extend_from_slice(&F16_HALF);
    // Element e is in half e / 128, at 32k + l there: 2 bits from qs, the third from hmask.
    let expected: Vec<f32> = (0..256)
        .map(|e| {
            let (half, r) = (e / 128, e % 128);
            let (k, l) = (r / 32, r % 32);
            let low = i32::from((qs[32 * half + l] >> (2 * k)) & 3);
            let high = (hmask[l] >> (4 * half + k)) & 1;
            let q = if high == 1 { low } else { low - 4 };
            let sc = i32::from(scales[8 * half + 2 * k + l / 16]) - 32;
            0.5 * sc as f32 * q as f32
        })
        .collect();
    assert_bits(&run(GgmlType::Q3_K, &block), &expected);
}

/// ggml's grid for the 4-bit indices of IQ4_NL and IQ4_XS, `kvalues_iq4nl` of `ggml-common.h`
/// (llama.cpp b11434), written out again here so the expected values do not come from the
/// code under test.
const GGML_IQ4NL_GRID: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// A hand-built IQ4_XS block, written from the layout (candle has no IQ4_XS to compare
/// with): chosen 6-bit scales packed as ggml's `quantize_row_iq4_xs` packs them (low nibbles
/// in `scales_l`, two at a byte; top two bits in `scales_h`, two bits each), and every index
/// in each sub-block, element `j` taking index `j` and element `j + 16` index `15 − j`.
#[test]
fn iq4_xs_is_grid_values_times_offset_scales() {
    let scales: [u8; 8] = [33, 0, 63, 32, 34, 31, 48, 16];
    let (mut high, mut low) = (0u16, [0u8; 4]);
    for (ib, &s) in scales.iter().enumerate() {
        low[ib / 2] |= (s & 0x0F) << (4 * (ib % 2));
        high |= u16::from(s >> 4) << (2 * ib);
    }
    assert_eq!((high, low), (0x76B2, [0x01, 0x0F, 0xF2, 0x00]));
    let mut block = F16_QUARTER.to_vec();
    block.extend_from_slice(&high.to_le_bytes());
    block.extend_from_slice(&low);
    for _ in 0..8 {
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    }
    let expected: Vec<f32> = (0..256)
        .map(|e| {
            let (ib, l) = (e / 32, e % 32);
            let index = if l < 16 { l } else { 31 - l };
            let sc = i32::from(scales[ib]) - 32;
            0.25 * sc as f32 * f32::from(GGML_IQ4NL_GRID[index])
        })
        .collect();
    let out = run(GgmlType::IQ4_XS, &block);
    assert_bits(&out, &expected);
    // A few by hand: scale 33 → +1, 0 → −32, 63 → +31, 32 → 0 (−0.0 for negative values).
    assert_eq!(out[0], -31.75);
    assert_eq!(out[16], 28.25);
    assert_eq!(out[32], 1016.0);
    assert_eq!(out[64 + 15], 875.75);
    assert_eq!(out[96].to_bits(), (-0.0f32).to_bits());
    assert_eq!(out[96 + 8].to_bits(), 0.0f32.to_bits());
}

/// A second IQ4_XS vector, from ggml's own Python package: the expected floats are gguf-py
/// 0.19.0's `IQ4_XS.dequantize_blocks` (llama.cpp's `gguf-py/gguf/quants.py`, an implementation
/// of `dequantize_row_iq4_xs` independent of ours) on this block (`d` = 0.125, byte `i` ≥ 2
/// `73 i + 29`), recorded once; candle has no IQ4_XS.
#[test]
fn iq4_xs_matches_gguf_py() {
    let mut block = vec![0x00, 0x30];
    block.extend((2..136u32).map(|i| (i * 73 + 29) as u8));
    let out = run(GgmlType::IQ4_XS, &block);
    assert_bits(&out, &GGUF_PY_IQ4_XS);
}

/// gguf-py's dequantization of the block of [`iq4_xs_matches_gguf_py`].
#[rustfmt::skip]
const GGUF_PY_IQ4_XS: [f32; 256] = [
    -74.375, 189.125, -21.25, -269.875, 27.625, -176.375, 80.75, -104.125,
    146.625, -46.75, 240.125, 2.125, -221.0, 53.125, -138.125, 112.625,
    -46.75, 53.125, 240.125, -104.125, 2.125, 146.625, -221.0, -46.75,
    53.125, 240.125, -138.125, 2.125, 146.625, -221.0, -46.75, 53.125,
    -87.5, 222.5, -25.0, -317.5, 32.5, -207.5, 95.0, -122.5,
    172.5, -55.0, 282.5, 2.5, -260.0, 62.5, -162.5, 132.5,
    282.5, -162.5, 2.5, 172.5, -260.0, -55.0, 62.5, 282.5,
    -162.5, 2.5, 132.5, -260.0, -55.0, 62.5, 282.5, -162.5,
    -43.75, 111.25, -12.5, -158.75, 16.25, -103.75, 47.5, -61.25,
    86.25, -27.5, 141.25, 1.25, -130.0, 31.25, -81.25, 66.25,
    1.25, 66.25, -130.0, -27.5, 31.25, 141.25, -81.25, 1.25,
    66.25, -130.0, -43.75, 31.25, 141.25, -81.25, 1.25, 66.25,
    -35.0, 89.0, -10.0, -127.0, 13.0, -83.0, 38.0, -49.0,
    69.0, -22.0, 113.0, 1.0, -104.0, 25.0, -65.0, 53.0,
    -104.0, -35.0, 25.0, 113.0, -65.0, 1.0, 53.0, -104.0,
    -35.0, 25.0, 89.0, -65.0, 1.0, 53.0, -104.0, -35.0,
    126.875, -322.625, 36.25, 460.375, -47.125, 300.875, -137.75, 177.625,
    -250.125, 79.75, -409.625, -3.625, 377.0, -90.625, 235.625, -192.125,
    -90.625, -322.625, 235.625, -3.625, -192.125, 377.0, 126.875, -90.625,
    -322.625, 235.625, 36.25, -192.125, 377.0, 126.875, -90.625, -322.625,
    -56.875, 144.625, -16.25, -206.375, 21.125, -134.875, 61.75, -79.625,
    112.125, -35.75, 183.625, 1.625, -169.0, 40.625, -105.625, 86.125,
    -105.625, -16.25, 86.125, -169.0, -56.875, 40.625, 144.625, -105.625,
    -16.25, 86.125, -206.375, -56.875, 40.625, 144.625, -105.625, -16.25,
    -122.5, 311.5, -35.0, -444.5, 45.5, -290.5, 133.0, -171.5,
    241.5, -77.0, 395.5, 3.5, -364.0, 87.5, -227.5, 185.5,
    185.5, -444.5, -122.5, 87.5, 311.5, -227.5, -35.0, 185.5,
    -444.5, -122.5, 45.5, 311.5, -227.5, -35.0, 185.5, -444.5,
    -74.375, 189.125, -21.25, -269.875, 27.625, -176.375, 80.75, -104.125,
    146.625, -46.75, 240.125, 2.125, -221.0, 53.125, -138.125, 112.625,
    -74.375, 27.625, 189.125, -138.125, -21.25, 112.625, -269.875, -74.375,
    27.625, 189.125, -176.375, -21.25, 112.625, -269.875, -74.375, 27.625,
];

/// A hand-built IQ3_S block, written from the layout (candle has no IQ3_S): `d` = 0.25, the
/// eight 4-bit scales 0, 1, .., 6, 15 (multipliers 1, 3, .., 13, 31), grid index
/// `37 ib + 8 k` (mod 256) with the ninth bit from `qh[ib]` = 0xA5 (groups 0, 2, 5, 7), and
/// sign bytes `29 i + 3`.
#[test]
fn iq3_s_is_signed_grid_magnitudes_times_odd_scales() {
    let mut block = F16_QUARTER.to_vec();
    block.extend((0..8usize).flat_map(|ib| (0..8usize).map(move |k| (37 * ib + 8 * k) as u8)));
    block.extend([0xA5u8; 8]);
    let signs: Vec<u8> = (0..32u8)
        .map(|i| i.wrapping_mul(29).wrapping_add(3))
        .collect();
    block.extend_from_slice(&signs);
    block.extend([0x10, 0x32, 0x54, 0xF6]);
    assert_eq!(block.len(), IQ3_S_BYTES);
    let multipliers = [1.0f32, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0, 31.0];
    let expected: Vec<f32> = (0..256)
        .map(|e| {
            let (ib, j) = (e / 32, e % 32);
            let k = j / 4;
            let index = (37 * ib + 8 * k) % 256 + if 0xA5 & (1 << k) != 0 { 256 } else { 0 };
            let magnitude = IQ3S_GRID[index].to_le_bytes()[j % 4];
            let negative = signs[4 * ib + j / 8] & (1 << (j % 8)) != 0;
            let value = 0.25 * multipliers[ib] * f32::from(magnitude);
            if negative { -value } else { value }
        })
        .collect();
    let out = run(GgmlType::IQ3_S, &block);
    assert_bits(&out, &expected);
    // By hand: element 4 is group 1 of sub-block 0, index 8 (no ninth bit), ggml's entry
    // 0x01010309, magnitude 9, sign bit 4 of 3 clear: 0.25 · 1 · 9. Element 0 is index 256
    // (0x05090507 in ggml's table), magnitude 7, sign bit 0 of 3 set.
    assert_eq!(IQ3S_GRID[8], 0x0101_0309);
    assert_eq!(out[4], 2.25);
    assert_eq!(IQ3S_GRID[256], 0x0509_0507);
    assert_eq!(out[0], -1.75);
}

/// A second IQ3_S vector, from ggml's own Python package: the expected floats are gguf-py
/// 0.19.0's `IQ3_S.dequantize_blocks` (llama.cpp's `gguf-py/gguf/quants.py`, an implementation
/// of `dequantize_row_iq3_s` independent of ours, with its own copy of the grid) on these two
/// blocks (`d` = 0.125 and −0.5; byte `i` of the data past each `d` `73 i + 29`), recorded
/// once; candle has no IQ3_S.
#[test]
fn iq3_s_matches_gguf_py() {
    let mut data = Vec::new();
    for d in [0x3000u16, 0xB800] {
        data.extend(d.to_le_bytes());
        let at = data.len();
        data.extend((at..at + IQ3_S_BYTES - 2).map(|i| (i * 73 + 29) as u8));
    }
    assert_bits(&run(GgmlType::IQ3_S, &data), &GGUF_PY_IQ3_S);
}

/// gguf-py's dequantization of the blocks of [`iq3_s_matches_gguf_py`].
#[rustfmt::skip]
const GGUF_PY_IQ3_S: [f32; 512] = [
    -20.625, -24.375, -13.125, 20.625, -13.125, -5.625, 16.875, 28.125,
    28.125, 16.875, 13.125, 13.125, 13.125, 5.625, 24.375, -16.875,
    -13.125, 16.875, 1.875, -9.375, 20.625, 5.625, -1.875, -13.125,
    9.375, -1.875, 5.625, 16.875, -5.625, 20.625, 13.125, 20.625,
    -12.375, -6.875, 9.625, -6.875, -4.125, 9.625, -9.625, 1.375,
    1.375, 15.125, -4.125, 4.125, 15.125, -6.875, 12.375, -17.875,
    -9.625, 4.125, -1.375, -9.625, 1.375, -20.625, -1.375, -12.375,
    1.375, -15.125, -12.375, 4.125, -6.875, -6.875, 9.625, 6.875,
    -0.375, -1.125, -0.875, -0.875, -0.375, -1.125, -0.375, 0.375,
    0.625, 0.875, 0.125, -0.625, 0.375, 0.125, -0.375, -0.125,
    -0.375, 1.875, 1.625, 0.125, -1.625, 1.125, 1.125, 0.375,
    0.375, -0.375, 0.875, -0.625, -0.125, 0.875, -0.875, 0.875,
    -18.375, -18.375, 7.875, 7.875, 7.875, -13.125, 18.375, -34.125,
    2.625, 2.625, -7.875, -2.625, 7.875, -23.625, -2.625, -23.625,
    -13.125, 23.625, -23.625, 7.875, -28.875, -2.625, 18.375, 13.125,
    39.375, -13.125, -18.375, -18.375, -28.875, -2.625, -28.875, 23.625,
    -21.375, -7.125, -16.625, 30.875, 2.375, 26.125, -35.625, -11.875,
    7.125, 16.625, 30.875, 2.375, -16.625, 16.625, 21.375, 7.125,
    -11.875, 16.625, 16.625, -35.625, -7.125, 7.125, -16.625, 2.375,
    7.125, -11.875, 7.125, 7.125, 16.625, -11.875, 2.375, -11.875,
    -32.625, -54.375, 3.625, -3.625, 25.375, -10.875, -47.125, -3.625,
    18.125, 3.625, -25.375, 39.875, -18.125, -3.625, 25.375, 54.375,
    -10.875, 18.125, -25.375, -25.375, -32.625, -10.875, -10.875, 10.875,
    3.625, -54.375, -18.125, 47.125, 10.875, 54.375, -3.625, -3.625,
    -5.625, -3.125, -0.625, -5.625, 5.625, 1.875, 5.625, 1.875,
    1.875, 6.875, 3.125, -9.375, -4.375, 9.375, -3.125, 0.625,
    -0.625, 1.875, 1.875, 1.875, 3.125, -8.125, 3.125, -8.125,
    3.125, -8.125, 0.625, -0.625, 0.625, -3.125, -0.625, -5.625,
    -4.375, -2.625, 7.875, 2.625, -0.875, -6.125, 4.375, 13.125,
    0.875, 2.625, -6.125, -6.125, -7.875, -4.375, -7.875, 7.875,
    -7.875, 2.625, -0.875, 4.375, 2.625, 2.625, -13.125, -4.375,
    4.375, -2.625, -0.875, -7.875, 0.875, 6.125, 4.375, 9.625,
    5.5, -5.5, 71.5, -27.5, 27.5, -27.5, -60.5, 5.5,
    -27.5, 16.5, 16.5, 60.5, 49.5, -27.5, 16.5, 82.5,
    60.5, 27.5, 27.5, -5.5, -71.5, 38.5, -5.5, -16.5,
    -5.5, -71.5, -5.5, -71.5, 60.5, 27.5, 5.5, -5.5,
    11.5, -57.5, -126.5, 11.5, 126.5, 11.5, -34.5, 126.5,
    -34.5, 34.5, -34.5, -172.5, -34.5, -57.5, -57.5, -11.5,
    103.5, 11.5, -80.5, 103.5, -57.5, -149.5, 172.5, -34.5,
    -34.5, -57.5, 11.5, -11.5, 149.5, -34.5, -149.5, 80.5,
    101.5, -14.5, 43.5, 159.5, 72.5, -14.5, 43.5, 217.5,
    -14.5, 188.5, 43.5, -101.5, -14.5, 217.5, -72.5, -130.5,
    43.5, 101.5, 14.5, 188.5, -14.5, 72.5, 14.5, -14.5,
    -101.5, -217.5, -159.5, 101.5, 43.5, 14.5, -43.5, 159.5,
    46.5, -170.5, -46.5, -77.5, -108.5, -46.5, -77.5, -15.5,
    -77.5, 77.5, -15.5, 46.5, -170.5, -46.5, 15.5, -201.5,
    201.5, 46.5, -15.5, -15.5, 201.5, -170.5, -170.5, 108.5,
    -232.5, -15.5, 108.5, 46.5, 77.5, -139.5, 46.5, 77.5,
    52.5, -37.5, 22.5, -52.5, -7.5, 37.5, -7.5, -22.5,
    -22.5, 37.5, 112.5, 22.5, -67.5, 22.5, 7.5, -7.5,
    67.5, 67.5, 82.5, -52.5, 97.5, 97.5, -7.5, 82.5,
    -7.5, -67.5, -7.5, -112.5, -112.5, -7.5, -37.5, -7.5,
    67.5, -13.5, -4.5, 13.5, -13.5, -13.5, 4.5, -58.5,
    -22.5, 13.5, -4.5, -4.5, 22.5, -31.5, -49.5, 31.5,
    22.5, 49.5, -4.5, 49.5, 58.5, -31.5, 4.5, 67.5,
    -49.5, -4.5, 22.5, -4.5, -31.5, 31.5, -22.5, -40.5,
    2.5, -2.5, 7.5, 5.5, -4.5, 0.5, 5.5, -2.5,
    -0.5, 4.5, 4.5, -0.5, 2.5, 7.5, -2.5, 1.5,
    5.5, 2.5, 1.5, 2.5, 1.5, 0.5, 2.5, 0.5,
    -3.5, -1.5, -0.5, 1.5, -3.5, -0.5, 7.5, -1.5,
    9.5, -28.5, -9.5, -9.5, 47.5, -66.5, -85.5, 9.5,
    -85.5, 85.5, -9.5, 104.5, 9.5, -47.5, 9.5, 142.5,
    9.5, 9.5, -47.5, -9.5, -28.5, 28.5, -9.5, -28.5,
    -47.5, -9.5, 142.5, 104.5, -142.5, 9.5, 9.5, -9.5,
];

/// A hand-built IQ4_NL block, written from the layout (candle has no IQ4_NL): every index,
/// element `j` taking index `j` and element `j + 16` index `15 − j`, times `d`.
#[test]
fn iq4_nl_is_grid_values_times_d() {
    let mut block = F16_MINUS_ONE.to_vec();
    block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let expected: Vec<f32> = (0..32)
        .map(|j| -f32::from(GGML_IQ4NL_GRID[if j < 16 { j } else { 31 - j }]))
        .collect();
    let out = run(GgmlType::IQ4_NL, &block);
    assert_bits(&out, &expected);
    assert_eq!(
        (out[0], out[15], out[16], out[31]),
        (127.0, -113.0, -113.0, 127.0)
    );
}

/// A second IQ4_NL vector, from ggml's own Python package: the expected floats are gguf-py
/// 0.19.0's `IQ4_NL.dequantize_blocks` (llama.cpp's `gguf-py/gguf/quants.py`, an implementation
/// of `dequantize_row_iq4_nl` independent of ours) on these four blocks (`d` = 0.125, −0.5, 3
/// and −0.0, whose products keep the signs of zero; byte `i` of the data past each `d`
/// `73 i + 29`), recorded once; candle has no IQ4_NL.
#[test]
fn iq4_nl_matches_gguf_py() {
    let mut data = Vec::new();
    for d in [0x3000u16, 0xB800, 0x4200, 0x8000] {
        data.extend(d.to_le_bytes());
        let at = data.len();
        data.extend((at..at + 16).map(|i| (i * 73 + 29) as u8));
    }
    assert_bits(&run(GgmlType::IQ4_NL, &data), &GGUF_PY_IQ4_NL);
}

/// gguf-py's dequantization of the blocks of [`iq4_nl_matches_gguf_py`].
#[rustfmt::skip]
const GGUF_PY_IQ4_NL: [f32; 128] = [
    14.125, 0.125, -13.0, 3.125, -8.125, 6.625, -4.375, 11.125,
    -1.25, -15.875, 1.625, -10.375, 4.75, -6.125, 8.625, -2.75,
    3.125, 14.125, -6.125, 0.125, 8.625, -13.0, -2.75, 3.125,
    14.125, -6.125, 0.125, 8.625, -13.0, -2.75, 3.125, 14.125,
    52.0, -12.5, 32.5, -26.5, 17.5, -44.5, 5.0, 63.5,
    -6.5, 41.5, -19.0, 24.5, -34.5, 11.0, -56.5, -0.5,
    -34.5, 52.0, 11.0, -12.5, -56.5, 32.5, -0.5, -34.5,
    52.0, 11.0, -12.5, -56.5, 32.5, -0.5, -26.5, 52.0,
    -195.0, 159.0, -105.0, 267.0, -30.0, -381.0, 39.0, -249.0,
    114.0, -147.0, 207.0, -66.0, 339.0, 3.0, -312.0, 75.0,
    339.0, -195.0, 3.0, 159.0, -312.0, -66.0, 75.0, 339.0,
    -195.0, 3.0, 159.0, -312.0, -105.0, 75.0, 339.0, -195.0,
    0.0, -0.0, 0.0, 0.0, -0.0, 0.0, -0.0, 0.0,
    -0.0, 0.0, -0.0, -0.0, 0.0, -0.0, 0.0, -0.0,
    0.0, 0.0, -0.0, -0.0, 0.0, -0.0, -0.0, 0.0,
    0.0, -0.0, -0.0, 0.0, -0.0, -0.0, 0.0, 0.0,
];

#[test]
fn q6_k_is_signed_six_bit_quants_times_signed_scales() {
    let ql: Vec<u8> = (0..128u8).map(|i| i.wrapping_mul(29) ^ 0x3C).collect();
    let qh: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(53) ^ 0xA5).collect();
    let scales: Vec<i8> = (0..16i8).map(|i| (i - 8) * 15).collect();
    let mut block = ql.clone();
    block.extend_from_slice(&qh);
    block.extend(scales.iter().map(|&s| s as u8));
    block.extend_from_slice(&F16_HALF);
    // Written from the layout, not the C loop: element e is in half e / 128, at l + 32k there.
    let expected: Vec<f32> = (0..256)
        .map(|e| {
            let (half, r) = (e / 128, e % 128);
            let (k, l) = (r / 32, r % 32);
            let byte = ql[64 * half + l + 32 * (k % 2)];
            let low = if k < 2 { byte & 0x0F } else { byte >> 4 };
            let high = (qh[32 * half + l] >> (2 * k)) & 3;
            let q = i32::from(low | (high << 4)) - 32;
            let sc = scales[8 * half + l / 16 + 2 * k];
            0.5 * f32::from(sc) * q as f32
        })
        .collect();
    assert_bits(&run(GgmlType::Q6_K, &block), &expected);
}

#[test]
fn several_blocks_come_out_in_order() {
    let mut data = Vec::new();
    for d in [F16_ONE, F16_HALF, F16_QUARTER] {
        data.extend_from_slice(&d);
        data.extend(std::iter::repeat_n(2u8, 32));
    }
    let out = run(GgmlType::Q8_0, &data);
    assert_eq!(out.len(), 96);
    assert!(out[..32].iter().all(|&x| x == 2.0));
    assert!(out[32..64].iter().all(|&x| x == 1.0));
    assert!(out[64..].iter().all(|&x| x == 0.5));
}

#[test]
fn empty_input_is_empty_output() {
    for &t in GgmlType::ALL.iter().filter(|&&t| is_supported(t)) {
        assert_eq!(dequantize(t, &[], &mut []), Ok(()), "{t}");
    }
}

#[test]
fn partial_blocks_and_wrong_output_lengths_are_errors_that_leave_the_output_alone() {
    let mut out = vec![7.0f32; 64];
    let err = dequantize(GgmlType::Q4_K, &[0; 143], &mut out[..0]).unwrap_err();
    assert_eq!(
        err,
        QuantError::PartialBlock {
            ggml_type: GgmlType::Q4_K,
            bytes: 143,
            block_bytes: 144
        }
    );
    assert!(err.to_string().contains("Q4_K"), "{err}");
    let err = dequantize(GgmlType::F32, &[0; 6], &mut out).unwrap_err();
    assert!(matches!(err, QuantError::PartialBlock { .. }), "{err}");

    for len in [0, 31, 33, 64] {
        let err = dequantize(GgmlType::Q8_0, &[0; 34], &mut out[..len]).unwrap_err();
        assert_eq!(
            err,
            QuantError::OutputLength {
                ggml_type: GgmlType::Q8_0,
                expected: 32,
                actual: len
            }
        );
    }
    assert!(out.iter().all(|&x| x == 7.0));
}

#[test]
fn unsupported_types_are_errors_naming_the_type() {
    for &t in GgmlType::ALL.iter().filter(|&&t| !is_supported(t)) {
        let bytes = t.block_bytes() as usize;
        let mut out = vec![0.0; t.block_size() as usize];
        let err = dequantize(t, &vec![0; bytes], &mut out).unwrap_err();
        assert_eq!(err, QuantError::Unsupported(t));
        assert!(err.to_string().contains(t.name()), "{err}");
    }
    assert!(!is_supported(GgmlType::IQ2_XXS));
}

#[test]
fn random_bytes_and_lengths_never_panic() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for round in 0..4000 {
        let t = GgmlType::ALL[rng.below(GgmlType::ALL.len())];
        let block_bytes = t.block_bytes() as usize;
        // Mostly whole blocks (so the kernels run on random bits), sometimes ragged.
        let len = match round % 4 {
            0 => rng.below(3 * block_bytes + 2),
            _ => block_bytes * rng.below(5),
        };
        let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let expected = element_count(t, len).ok();
        let out_len = match (round % 3, expected) {
            (0, _) | (_, None) => rng.below(4 * t.block_size() as usize + 1),
            (_, Some(n)) => n,
        };
        let mut out = vec![0.0f32; out_len];
        let result = dequantize(t, &data, &mut out);
        let should_work = is_supported(t) && expected == Some(out_len);
        assert_eq!(
            result.is_ok(),
            should_work,
            "{t}, {len} bytes, {out_len} out: {result:?}"
        );
    }
}

#[test]
fn every_output_element_is_written_and_scales_propagate() {
    // Three blocks of zeros must give exactly zeros everywhere: the output starts as NaN, so an
    // element a kernel skipped (e.g. a block size out of step with ggml's table) shows up.
    // All-ones bytes make every f16 scale (and plain value) NaN, which must propagate.
    for &t in GgmlType::ALL.iter().filter(|&&t| is_supported(t)) {
        let bytes = 3 * t.block_bytes() as usize;
        let n = 3 * t.block_size() as usize;
        let mut out = vec![f32::NAN; n];
        dequantize(t, &vec![0u8; bytes], &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 0.0), "{t}: zeros");
        dequantize(t, &vec![0xFFu8; bytes], &mut out).unwrap();
        assert!(out.iter().all(|x| x.is_nan()), "{t}: all ones");
    }
}
