//! The tiled k-quant kernels ([`dot_rows_k`]) against the scalar reference, bit for bit, on
//! odd shapes that exercise every tile and remainder, with the VNNI body (where the CPU has
//! it) and the AVX2 body forced.

use super::tests_k::{k_weights, q8_k_acts};
use super::*;
use crate::quant::test_rng::Rng;

/// (format, offset of `d`, whether `dmin` follows it).
const FORMATS: [(KQuant, usize, bool); 8] = [
    (KQuant::Q2K, 80, true),
    (KQuant::Q3K, 108, false),
    (KQuant::Q4K, 0, true),
    (KQuant::Q5K, 0, true),
    (KQuant::Q6K, 208, false),
    (KQuant::Iq4Xs, 0, false),
    (KQuant::Iq3S, 0, false),
    (KQuant::Iq3Xxs, 0, false),
];

fn tiles_equal_scalar() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    for (format, d_at, two) in FORMATS {
        for blocks in [1, 3, 7] {
            for (n_rows, cols) in [
                (1, 1),
                (5, 1),
                (3, 2),
                (2, 3),
                (1, 4),
                (5, 4),
                (3, 9),
                (4, 8),
            ] {
                let w = k_weights(&mut rng, n_rows * blocks, format.block_bytes(), d_at, two);
                let a = q8_k_acts(&mut rng, cols * blocks);
                let mut fast = vec![f32::NAN; n_rows * cols];
                let mut reference = vec![f32::NAN; n_rows * cols];
                dot_rows_k(format, &w, &a, cols, &mut fast).unwrap();
                scalar::dot_rows_k(format, &w, &a, cols, &mut reference).unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&fast),
                    bits(&reference),
                    "{format:?}: {n_rows} rows × {cols} columns of {blocks} super-blocks"
                );
                // Each output is also the one-row dot of its row and column.
                let row_bytes = blocks * format.block_bytes();
                let one = match format {
                    KQuant::Q2K => scalar::dot_q2_k_q8_k,
                    KQuant::Q3K => scalar::dot_q3_k_q8_k,
                    KQuant::Q4K => scalar::dot_q4_k_q8_k,
                    KQuant::Q5K => scalar::dot_q5_k_q8_k,
                    KQuant::Q6K => scalar::dot_q6_k_q8_k,
                    KQuant::Iq4Xs => scalar::dot_iq4_xs_q8_k,
                    KQuant::Iq3S => scalar::dot_iq3_s_q8_k,
                    KQuant::Iq3Xxs => scalar::dot_iq3_xxs_q8_k,
                };
                for (r, row) in w.chunks_exact(row_bytes).enumerate() {
                    for (c, col) in a.chunks_exact(blocks).enumerate() {
                        let want = one(row, col).unwrap().to_bits();
                        assert_eq!(fast[r * cols + c].to_bits(), want, "{format:?} ({r}, {c})");
                    }
                }
            }
        }
    }
}

#[test]
fn k_tiles_equal_scalar_bit_for_bit() {
    crate::isa::on_each_simd_path(tiles_equal_scalar);
}

#[test]
fn k_rows_shape_errors_do_not_panic() {
    let a = q8_k_acts(&mut Rng(7), 4);
    let w = vec![0u8; 2 * 2 * Q4_K_BYTES];
    let mut out = [0.0; 4];
    assert!(dot_rows_k(KQuant::Q4K, &w, &a, 2, &mut out).is_ok());
    assert!(dot_rows_k(KQuant::Q4K, &w[1..], &a, 2, &mut out).is_err());
    assert!(dot_rows_k(KQuant::Q4K, &w, &a, 0, &mut out).is_err());
    assert!(dot_rows_k(KQuant::Q4K, &w, &a, 3, &mut out).is_err());
    assert!(dot_rows_k(KQuant::Q6K, &w, &a, 2, &mut out).is_err());
    assert!(dot_rows_k(KQuant::Q4K, &w, &a[..0], 2, &mut out[..0]).is_err());
}
