//! MXFP4 (OCP microscaling FP4: gpt-oss's expert weights) rewritten as Q8_0 at load, exactly.
//!
//! A block of 32 elements is one E8M0 scale byte `e` and 16 bytes of 4-bit E2M1 codes (the low
//! nibbles elements 0..16, the high nibbles 16..32). ggml decodes code `c` as
//! `kvalues_mxfp4[c] · 2^(e − 128)` with `kvalues_mxfp4` = twice the E2M1 value, integers in
//! −12..=12. So a block is a Q8_0 block with quants `kvalues_mxfp4[c]` and scale `2^(e − 128)`,
//! which an f16 holds exactly for `e` in 104..=143 (2^−24 ..= 2^15); an all-zero block gets scale
//! 0. Both backends then run their Q8_0 kernels on it: the same products and integer sums as
//! ggml's MXFP4 × Q8_0 dot. The price is twice the bytes of the MXFP4 rows.

/// ggml's `kvalues_mxfp4`: each E2M1 code's value, doubled.
const VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];
/// Bytes of one MXFP4 block.
pub const MXFP4_BLOCK_BYTES: usize = 17;
/// Bytes of one Q8_0 block.
pub const Q8_0_BLOCK_BYTES: usize = 34;

/// Why an MXFP4 tensor cannot be rewritten as Q8_0.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mxfp4Error {
    /// The data is not a whole number of blocks.
    #[error("{bytes} bytes are not a whole number of 17-byte MXFP4 blocks")]
    Length {
        /// Bytes given.
        bytes: usize,
    },
    /// A block's scale has no exact f16 (outside 2^−24 ..= 2^15) while its codes are not all 0.
    #[error(
        "MXFP4 block {block} has scale 2^{exponent}, outside the range the backends' Q8_0 form of MXFP4 holds exactly (2^-24 to 2^15)"
    )]
    Scale {
        /// Index of the block.
        block: usize,
        /// `e − 128`.
        exponent: i32,
    },
}

/// The Q8_0 blocks equal to the MXFP4 blocks of `data`.
pub fn mxfp4_to_q8_0(data: &[u8]) -> Result<Vec<u8>, Mxfp4Error> {
    if !data.len().is_multiple_of(MXFP4_BLOCK_BYTES) {
        return Err(Mxfp4Error::Length { bytes: data.len() });
    }
    let blocks = data.len() / MXFP4_BLOCK_BYTES;
    let mut out = vec![0u8; blocks * Q8_0_BLOCK_BYTES];
    for (block, (src, dst)) in data
        .chunks_exact(MXFP4_BLOCK_BYTES)
        .zip(out.chunks_exact_mut(Q8_0_BLOCK_BYTES))
        .enumerate()
    {
        let (scale, codes) = (src[0], &src[1..]);
        let (low, high) = dst[2..].split_at_mut(16);
        let mut any = false;
        for ((&byte, lo), hi) in codes.iter().zip(low).zip(high) {
            let (a, b) = (
                VALUES[usize::from(byte & 0xf)],
                VALUES[usize::from(byte >> 4)],
            );
            any |= a != 0 || b != 0;
            *lo = a as u8;
            *hi = b as u8;
        }
        let d = if any {
            scale_f16_bits(scale).ok_or(Mxfp4Error::Scale {
                block,
                exponent: i32::from(scale) - 128,
            })?
        } else {
            0
        };
        dst[..2].copy_from_slice(&d.to_le_bytes());
    }
    Ok(out)
}

/// The bits of the f16 `2^(e − 128)`, when an f16 holds it: a normal number for exponents
/// −14..=15, a subnormal (one mantissa bit) for −24..=−15.
fn scale_f16_bits(e: u8) -> Option<u16> {
    match i32::from(e) - 128 {
        x @ -14..=15 => Some(((x + 15) as u16) << 10),
        x @ -24..=-15 => Some(1 << (x + 24)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's `dequantize_row_mxfp4`, for the reference.
    fn ggml_dequant(block: &[u8]) -> Vec<f32> {
        let d = 2f32.powi(i32::from(block[0]) - 128);
        let mut out = vec![0.0; 32];
        for (j, &byte) in block[1..].iter().enumerate() {
            out[j] = f32::from(VALUES[usize::from(byte & 0xf)]) * d;
            out[j + 16] = f32::from(VALUES[usize::from(byte >> 4)]) * d;
        }
        out
    }

    /// An f16 that is 0 or a power of two, as f32.
    fn f16_power_of_two(bits: u16) -> f32 {
        match (bits >> 10, bits & 0x3ff) {
            (0, 0) => 0.0,
            (0, mantissa) => f32::from(mantissa) * 2f32.powi(-24),
            (exponent, 0) => 2f32.powi(i32::from(exponent) - 15),
            _ => panic!("{bits:#x} is not a power of two"),
        }
    }

    fn q8_0_dequant(block: &[u8]) -> Vec<f32> {
        let d = f16_power_of_two(u16::from_le_bytes([block[0], block[1]]));
        block[2..].iter().map(|&q| f32::from(q as i8) * d).collect()
    }

    #[test]
    fn every_code_and_scale_in_range_converts_exactly() {
        for e in 104..=143u8 {
            let mut block = vec![e];
            block.extend((0..16u8).map(|i| i | ((15 - i) << 4)));
            let q8 = mxfp4_to_q8_0(&block).unwrap();
            assert_eq!(q8_0_dequant(&q8), ggml_dequant(&block), "scale byte {e}");
        }
    }

    #[test]
    fn zero_blocks_take_any_scale_and_others_out_of_range_are_refused() {
        let zeros = [0u8; 17];
        assert_eq!(q8_0_dequant(&mxfp4_to_q8_0(&zeros).unwrap()), vec![0.0; 32]);
        let mut block = [0u8; 17];
        block[0] = 200;
        block[5] = 0x10;
        assert_eq!(
            mxfp4_to_q8_0(&block),
            Err(Mxfp4Error::Scale {
                block: 0,
                exponent: 72
            })
        );
        assert_eq!(
            mxfp4_to_q8_0(&[0u8; 18]),
            Err(Mxfp4Error::Length { bytes: 18 })
        );
    }
}
