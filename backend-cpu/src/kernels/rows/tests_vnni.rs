//! The AVX-512 VNNI k-quant kernels against the scalar ones bit for bit, on random and extreme data.

#![allow(clippy::unwrap_used)]

use half::f16;

use super::tests_k::{SUPER_SIZES, k_weights, q8_k_acts};
use super::*;
use crate::quant::activation::QK_K;
use crate::quant::test_rng::Rng;

/// Whether the VNNI kernels run here; says so loudly when they do not.
fn vnni_available() -> bool {
    let available = crate::isa::active() == crate::isa::Isa::Avx512Vnni;
    if !available {
        eprintln!("!!! AVX512-VNNI/VL NOT DETECTED: the VNNI kernels are NOT tested here !!!");
    }
    available
}

type KFn = fn(&[u8], &[BlockQ8K]) -> Result<f32, DotError>;
type SimdK = fn(&[u8], &[BlockQ8K]) -> Option<f32>;

#[test]
fn vnni_matches_scalar_bit_for_bit() {
    if !vnni_available() {
        return;
    }
    let mut rng = Rng(0xA076_1D64_78BD_642F);
    let k: [(&str, usize, usize, bool, KFn, SimdK); 8] = [
        (
            "q2_k",
            Q2_K_BYTES,
            80,
            true,
            scalar::dot_q2_k_q8_k,
            |w, a| k_simd::one(KQuant::Q2K, true, w, a),
        ),
        (
            "q3_k",
            Q3_K_BYTES,
            108,
            false,
            scalar::dot_q3_k_q8_k,
            |w, a| k_simd::one(KQuant::Q3K, true, w, a),
        ),
        (
            "q4_k",
            Q4_K_BYTES,
            0,
            true,
            scalar::dot_q4_k_q8_k,
            |w, a| k_simd::one(KQuant::Q4K, true, w, a),
        ),
        (
            "q5_k",
            Q5_K_BYTES,
            0,
            true,
            scalar::dot_q5_k_q8_k,
            |w, a| k_simd::one(KQuant::Q5K, true, w, a),
        ),
        (
            "q6_k",
            Q6_K_BYTES,
            208,
            false,
            scalar::dot_q6_k_q8_k,
            |w, a| k_simd::one(KQuant::Q6K, true, w, a),
        ),
        (
            "iq4_xs",
            IQ4_XS_BYTES,
            0,
            false,
            scalar::dot_iq4_xs_q8_k,
            |w, a| k_simd::one(KQuant::Iq4Xs, true, w, a),
        ),
        (
            "iq3_s",
            IQ3_S_BYTES,
            0,
            false,
            scalar::dot_iq3_s_q8_k,
            |w, a| k_simd::one(KQuant::Iq3S, true, w, a),
        ),
        (
            "iq3_xxs",
            IQ3_XXS_BYTES,
            0,
            false,
            scalar::dot_iq3_xxs_q8_k,
            |w, a| k_simd::one(KQuant::Iq3Xxs, true, w, a),
        ),
    ];
    for round in 0..20 {
        for blocks in SUPER_SIZES {
            let a = q8_k_acts(&mut rng, blocks);
            for (name, bytes, d_at, two, reference, simd) in k {
                let w = k_weights(&mut rng, blocks, bytes, d_at, two);
                let want = reference(&w, &a).unwrap().to_bits();
                assert_eq!(
                    simd(&w, &a).unwrap().to_bits(),
                    want,
                    "{name} {round} {blocks}"
                );
            }
        }
    }
}

/// Every weight byte at an extreme (−128 / 127 for Q8_0, all-ones nibbles and fifth bits)
/// against all-−128 or all-127 activations: the `+128` / offset corrections must be exact.
#[test]
fn vnni_extremes_are_exact() {
    if !vnni_available() {
        return;
    }
    for aq in [-128i8, 127, 0, -1] {
        let ak = [BlockQ8K {
            d: 1.0,
            qs: [aq; QK_K],
            bsums: [i16::MIN; 16],
        }];
        for wb in [0x80u8, 0x7F, 0xFF, 0x00] {
            let block = |bytes: usize, head: usize| {
                let mut w = vec![wb; bytes];
                for h in (0..head).step_by(2) {
                    w[h..h + 2].copy_from_slice(&f16::ONE.to_le_bytes());
                }
                w
            };
            let w = block(Q4_K_BYTES, 4);
            let want = scalar::dot_q4_k_q8_k(&w, &ak).unwrap();
            assert_eq!(k_simd::one(KQuant::Q4K, true, &w, &ak).unwrap(), want);
            let w = block(Q5_K_BYTES, 4);
            let want = scalar::dot_q5_k_q8_k(&w, &ak).unwrap();
            assert_eq!(k_simd::one(KQuant::Q5K, true, &w, &ak).unwrap(), want);
            let mut w = vec![wb; Q2_K_BYTES];
            w[80..82].copy_from_slice(&f16::ONE.to_le_bytes());
            w[82..].copy_from_slice(&f16::ONE.to_le_bytes());
            let want = scalar::dot_q2_k_q8_k(&w, &ak).unwrap();
            assert_eq!(k_simd::one(KQuant::Q2K, true, &w, &ak).unwrap(), want);
            let mut w = vec![wb; Q3_K_BYTES];
            w[108..].copy_from_slice(&f16::ONE.to_le_bytes());
            let want = scalar::dot_q3_k_q8_k(&w, &ak).unwrap();
            assert_eq!(k_simd::one(KQuant::Q3K, true, &w, &ak).unwrap(), want);
            let mut w = vec![wb; Q6_K_BYTES];
            w[208..].copy_from_slice(&f16::ONE.to_le_bytes());
            let want = scalar::dot_q6_k_q8_k(&w, &ak).unwrap();
            assert_eq!(k_simd::one(KQuant::Q6K, true, &w, &ak).unwrap(), want);
            let w = block(IQ4_XS_BYTES, 2);
            let want = scalar::dot_iq4_xs_q8_k(&w, &ak).unwrap();
            assert_eq!(k_simd::one(KQuant::Iq4Xs, true, &w, &ak).unwrap(), want);
            let w = block(IQ3_S_BYTES, 2);
            let want = scalar::dot_iq3_s_q8_k(&w, &ak).unwrap();
            assert_eq!(k_simd::one(KQuant::Iq3S, true, &w, &ak).unwrap(), want);
            let w = block(IQ3_XXS_BYTES, 2);
            let want = scalar::dot_iq3_xxs_q8_k(&w, &ak).unwrap();
            assert_eq!(k_simd::one(KQuant::Iq3Xxs, true, &w, &ak).unwrap(), want);
        }
    }
}
