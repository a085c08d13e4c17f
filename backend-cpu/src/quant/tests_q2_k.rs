//! Q2_K's dequantizer on a hand-built block (candle's, the bit-identity oracle, is compared in
//! the tests crate).

#![allow(clippy::unwrap_used)]

use super::tests::{F16_HALF, F16_QUARTER, assert_bits, run};
use super::*;

/// Every scale byte distinct (scale and min nibbles both varying) and every 2-bit code at each
/// of its four positions, so a swapped nibble, sub-block or shift changes some element.
#[test]
fn q2_k_is_scaled_two_bit_quants_less_scaled_mins() {
    let scales: Vec<u8> = (0..16u8).map(|j| j.wrapping_mul(0x37) ^ 0x5A).collect();
    let qs: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(53) ^ 0xC5).collect();
    let mut block = scales.clone();
    block.extend_from_slice(&qs);
    block.extend_from_slice(&F16_HALF);
    block.extend_from_slice(&F16_QUARTER);
    assert_eq!(block.len(), Q2_K_BYTES);
    // Element e is in half e / 128, at 32k + l there: bits 2k of qs[32 half + l], with the
    // scale byte of its 16 elements, sub-block e / 16.
    let expected: Vec<f32> = (0..256)
        .map(|e| {
            let (half, r) = (e / 128, e % 128);
            let (k, l) = (r / 32, r % 32);
            let q = f32::from((qs[32 * half + l] >> (2 * k)) & 3);
            let sc = scales[e / 16];
            0.5 * f32::from(sc & 0x0F) * q - 0.25 * f32::from(sc >> 4)
        })
        .collect();
    let out = run(GgmlType::Q2_K, &block);
    assert_bits(&out, &expected);
    // Two blocks decode independently.
    let two = [block.clone(), block].concat();
    assert_bits(
        &run(GgmlType::Q2_K, &two),
        &[expected.clone(), expected].concat(),
    );
    assert!(matches!(
        dequantize(GgmlType::Q2_K, &two[..83], &mut [0.0; 256]),
        Err(QuantError::PartialBlock { .. })
    ));
}
