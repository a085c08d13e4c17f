//! Q8_K quantization and the k-quant dots: SIMD against scalar bit for bit, hand-computed
//! cases, and the scalar dots against an f64 dot of the dequantized rows.

#![allow(clippy::unwrap_used)]

use half::f16;
use worker_common::gguf::GgmlType;

use super::k_quants::scales_mins;
use super::tests::{QuantData, reference, simd_available};
use super::*;
use crate::quant::activation::{BlockQ8K, QK_K, quantize_q8_k};
use crate::quant::test_rng::Rng;

pub(super) const SUPER_SIZES: [usize; 4] = [1, 3, 7, 33];

/// A k-quant byte: often an extreme (all ones gives the largest scales, mins and quants).
fn k_byte(rng: &mut Rng) -> u8 {
    match rng.next() % 6 {
        0 => 0xFF,
        1 => 0x00,
        2 => 0x80,
        _ => rng.byte(),
    }
}

/// Random super-blocks with random finite f16 scales at `d_at` (and `d_at + 2` when `two`).
pub(super) fn k_weights(
    rng: &mut Rng,
    blocks: usize,
    bytes: usize,
    d_at: usize,
    two: bool,
) -> Vec<u8> {
    let mut w = Vec::with_capacity(blocks * bytes);
    for _ in 0..blocks {
        let mut b: Vec<u8> = (0..bytes).map(|_| k_byte(rng)).collect();
        b[d_at..d_at + 2].copy_from_slice(&rng.scale().to_le_bytes());
        if two {
            b[d_at + 2..d_at + 4].copy_from_slice(&rng.scale().to_le_bytes());
        }
        w.extend(b);
    }
    w
}

/// Random Q8_K blocks: extreme quants, arbitrary (even inconsistent, extreme) `bsums`.
pub(super) fn q8_k_acts(rng: &mut Rng, blocks: usize) -> Vec<BlockQ8K> {
    (0..blocks)
        .map(|_| BlockQ8K {
            d: rng.scale().to_f32() * (1.0 + rng.unit() / 3.0),
            qs: std::array::from_fn(|_| rng.quant() as i8),
            bsums: std::array::from_fn(|_| match rng.next() % 4 {
                0 => i16::MIN,
                1 => i16::MAX,
                _ => rng.next() as i16,
            }),
        })
        .collect()
}

type Kernel = fn(&[u8], &[BlockQ8K]) -> Result<f32, DotError>;
type Simd = fn(&[u8], &[BlockQ8K]) -> Option<f32>;

/// (name, bytes, d offset, has dmin, dispatching, scalar, AVX2).
const KERNELS: [(&str, usize, usize, bool, Kernel, Kernel, Simd); 8] = [
    (
        "q2_k",
        Q2_K_BYTES,
        80,
        true,
        dot_q2_k_q8_k,
        scalar::dot_q2_k_q8_k,
        |w, a| k_simd::one(KQuant::Q2K, false, w, a),
    ),
    (
        "q3_k",
        Q3_K_BYTES,
        108,
        false,
        dot_q3_k_q8_k,
        scalar::dot_q3_k_q8_k,
        |w, a| k_simd::one(KQuant::Q3K, false, w, a),
    ),
    (
        "q4_k",
        Q4_K_BYTES,
        0,
        true,
        dot_q4_k_q8_k,
        scalar::dot_q4_k_q8_k,
        |w, a| k_simd::one(KQuant::Q4K, false, w, a),
    ),
    (
        "q5_k",
        Q5_K_BYTES,
        0,
        true,
        dot_q5_k_q8_k,
        scalar::dot_q5_k_q8_k,
        |w, a| k_simd::one(KQuant::Q5K, false, w, a),
    ),
    (
        "q6_k",
        Q6_K_BYTES,
        208,
        false,
        dot_q6_k_q8_k,
        scalar::dot_q6_k_q8_k,
        |w, a| k_simd::one(KQuant::Q6K, false, w, a),
    ),
    (
        "iq4_xs",
        IQ4_XS_BYTES,
        0,
        false,
        dot_iq4_xs_q8_k,
        scalar::dot_iq4_xs_q8_k,
        |w, a| k_simd::one(KQuant::Iq4Xs, false, w, a),
    ),
    (
        "iq3_s",
        IQ3_S_BYTES,
        0,
        false,
        dot_iq3_s_q8_k,
        scalar::dot_iq3_s_q8_k,
        |w, a| k_simd::one(KQuant::Iq3S, false, w, a),
    ),
    (
        "iq3_xxs",
        IQ3_XXS_BYTES,
        0,
        false,
        dot_iq3_xxs_q8_k,
        scalar::dot_iq3_xxs_q8_k,
        |w, a| k_simd::one(KQuant::Iq3Xxs, false, w, a),
    ),
];

#[test]
fn k_avx2_matches_scalar_bit_for_bit() {
    let simd = simd_available();
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    for round in 0..30 {
        for blocks in SUPER_SIZES {
            let a = q8_k_acts(&mut rng, blocks);
            for (name, bytes, d_at, two, dispatched, reference, avx2) in KERNELS {
                let ctx = format!("{name} round {round}, {blocks} super-blocks");
                let w = k_weights(&mut rng, blocks, bytes, d_at, two);
                let want = reference(&w, &a).unwrap();
                assert!(want.is_finite(), "{ctx}: {want}");
                assert_eq!(
                    dispatched(&w, &a).unwrap().to_bits(),
                    want.to_bits(),
                    "{ctx}"
                );
                if simd {
                    assert_eq!(
                        avx2(&w, &a).unwrap().to_bits(),
                        want.to_bits(),
                        "{ctx} avx2"
                    );
                }
            }
        }
    }
}

/// All-ones weight bytes (every scale, min and quant at its maximum) against ±128 / 127
/// activations and extreme `bsums`: the largest integer sums, computed by hand.
#[test]
fn k_extremes_are_exact() {
    let simd = simd_available();
    for (aq, bsum) in [
        (-128i8, i16::MIN),
        (127, i16::MAX),
        (-128, i16::MAX),
        (0, i16::MIN),
    ] {
        let a = [BlockQ8K {
            d: 1.0,
            qs: [aq; QK_K],
            bsums: [bsum; 16],
        }];
        let y = i64::from(aq);
        let msum = 63 * 8 * 2 * i64::from(bsum);
        // Q2_K: sc = m = 15, q = 3, each min against one `bsums`; Q3_K: scale 63 - 32, code
        // q + 4 = 7, offset 4 · bsums; Q4_K: sc = m = 63, q = 15; Q5_K: q = 31; Q6_K: scale -1 (0xFF), q = 63 - 32; IQ4_XS: scale 63 - 32, index 15
        // (grid value 113); IQ3_S: multiplier 31, index 511 (magnitudes 1, 1, 15, 15: 32 a
        // group of four, 64 groups), every sign negative; IQ3_XXS: multiplier 31, index 255
        // (magnitudes 4, 28, 52, 62: 146 a group), sign index 127 (all eight negative), and
        // the final quarter.
        let iq4 = (31 * 113 * y * 256) as f32;
        let iq3 = (-31 * 32 * y * 64) as f32;
        let iq3_xxs = 0.25 * (-31 * 146 * y * 64) as f32;
        let q2 = (15 * 3 * y * 256 - 15 * 16 * i64::from(bsum)) as f32;
        let q3 = (31 * 7 * y * 256 - 4 * 31 * 16 * i64::from(bsum)) as f32;
        let q4 = (63 * 15 * y * 256 - msum) as f32;
        let q5 = (63 * 31 * y * 256 - msum) as f32;
        let q6 = (-31 * y * 256) as f32;
        for (name, bytes, d_at, two, dispatched, reference, avx2) in KERNELS {
            let mut w = vec![0xFF; bytes];
            w[d_at..d_at + 2].copy_from_slice(&f16::ONE.to_le_bytes());
            if two {
                w[d_at + 2..d_at + 4].copy_from_slice(&f16::ONE.to_le_bytes());
            }
            let want = match name {
                "q2_k" => q2,
                "q3_k" => q3,
                "q4_k" => q4,
                "q5_k" => q5,
                "q6_k" => q6,
                "iq4_xs" => iq4,
                "iq3_xxs" => iq3_xxs,
                _ => iq3,
            };
            assert_eq!(reference(&w, &a).unwrap(), want, "{name} {aq}");
            assert_eq!(dispatched(&w, &a).unwrap(), want, "{name} {aq}");
            if simd {
                assert_eq!(avx2(&w, &a).unwrap(), want, "{name} {aq} avx2");
            }
        }
    }
}

/// Random activations with per-super-block magnitudes from 0.1 to ~400.
fn activations_k(rng: &mut Rng, blocks: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(blocks * QK_K);
    for _ in 0..blocks {
        let magnitude = 0.1 * 2f32.powi((rng.next() % 12) as i32);
        x.extend((0..QK_K).map(|_| rng.unit() * magnitude));
    }
    x
}

#[test]
fn k_scalar_dots_match_f64_reference() {
    let mut rng = Rng(11);
    for blocks in SUPER_SIZES {
        let x = activations_k(&mut rng, blocks);
        let mut q = Vec::new();
        quantize_q8_k(&x, &mut q).unwrap();
        let a: Vec<f64> = q
            .iter()
            .flat_map(|b| b.qs.map(|v| f64::from(v) * f64::from(b.d)))
            .collect();
        for (name, bytes, d_at, two, _, reference_dot, _) in KERNELS {
            let ggml_type = match name {
                "q2_k" => GgmlType::Q2_K,
                "q3_k" => GgmlType::Q3_K,
                "q4_k" => GgmlType::Q4_K,
                "q5_k" => GgmlType::Q5_K,
                "q6_k" => GgmlType::Q6_K,
                "iq4_xs" => GgmlType::IQ4_XS,
                "iq3_xxs" => GgmlType::IQ3_XXS,
                _ => GgmlType::IQ3_S,
            };
            let w = k_weights(&mut rng, blocks, bytes, d_at, two);
            let (want, _) = reference(ggml_type, &w, &a);
            // A bound on the sum of the magnitudes of the scale and min terms, which may
            // cancel: each term is rounded a few times at most, relative 2^-22.
            let bound: f64 = w
                .chunks(bytes)
                .zip(a.chunks(QK_K))
                .map(|(w, a)| {
                    let ya: f64 = a.iter().map(|v| v.abs()).sum();
                    let f16_at = |i: usize| f16::from_le_bytes([w[i], w[i + 1]]).to_f64().abs();
                    if name == "q2_k" {
                        // The largest scale · q (15 · 3) and min (15).
                        (f16_at(80) * 15.0 * 3.0 + f16_at(82) * 15.0) * ya
                    } else if two {
                        let w: &[u8; 16] = w[..16].try_into().unwrap();
                        let (sc, m) = scales_mins(w);
                        let d = f16::from_le_bytes([w[0], w[1]]).to_f64().abs();
                        let dmin = f16::from_le_bytes([w[2], w[3]]).to_f64().abs();
                        let (sc, m) = (sc.iter().max().unwrap(), m.iter().max().unwrap());
                        (d * 31.0 * f64::from(*sc) + dmin * f64::from(*m)) * ya
                    } else {
                        // The largest |scale · q|: Q3_K 32 · 4, Q6_K 128 · 32, IQ4_XS 32 · 127,
                        // IQ3_S 31 · 15, IQ3_XXS 31 · 62 (a quarter of it in fact).
                        let most = match name {
                            "q3_k" => 32.0 * 4.0,
                            "q6_k" => 128.0 * 32.0,
                            "iq4_xs" => 32.0 * 127.0,
                            "iq3_xxs" => 31.0 * 62.0,
                            _ => 31.0 * 15.0,
                        };
                        f16::from_le_bytes([w[d_at], w[d_at + 1]]).to_f64().abs() * most * ya
                    }
                })
                .sum();
            let got = reference_dot(&w, &q).unwrap();
            let err = (f64::from(got) - want).abs();
            let tol = 1e-6 * bound + 1e-30;
            assert!(
                err <= tol,
                "{name} {blocks}: {got} vs {want}, err {err} > {tol}"
            );
        }
    }
}

#[test]
fn k_length_mismatches_are_errors() {
    let a = [BlockQ8K {
        d: 1.0,
        qs: [1; QK_K],
        bsums: [16; 16],
    }];
    for (_, bytes, _, _, dispatched, reference, _) in KERNELS {
        let err = Err(DotError::LengthMismatch {
            bytes: bytes + 1,
            blocks: 1,
            block_bytes: bytes,
        });
        assert_eq!(dispatched(&vec![0; bytes + 1], &a), err);
        assert_eq!(reference(&vec![0; bytes + 1], &a), err);
        assert_eq!(dispatched(&[], &[]), Ok(0.0));
    }
    let mut out = vec![a[0]];
    assert_eq!(
        quantize_q8_k(&[0.0; 255], &mut out),
        Err(DotError::PartialSuperBlock { elements: 255 })
    );
    assert_eq!(out.len(), 1, "output untouched on error");
}

/// ggml's `nearest_int`, literally: the magic-number rounding.
fn ggml_nearest_int(f: f32) -> i32 {
    let val = f + 12_582_912.0;
    (val.to_bits() & 0x007F_FFFF) as i32 - 0x0040_0000
}

#[test]
fn quantize_q8_k_known_values() {
    // Largest magnitude 127 (positive): iscale = -1, d = -1, quants -x rounded half to even.
    let mut x = [0.0f32; 2 * QK_K];
    x[..8].copy_from_slice(&[127.0, 2.5, -2.5, 3.5, 0.5, -0.49, 1.5, -126.6]);
    x[20] = -7.0;
    // Second super-block: largest magnitude -254 (negative): iscale = 0.5, d = 2.
    x[QK_K..QK_K + 5].copy_from_slice(&[-254.0, 5.0, 3.0, 1.0, 254.0]);
    let mut q = Vec::new();
    quantize_q8_k(&x, &mut q).unwrap();
    assert_eq!(q.len(), 2);
    assert_eq!(q[0].d, -1.0);
    assert_eq!(&q[0].qs[..9], &[-127, -2, 2, -4, 0, 0, -2, 127, 0]);
    assert_eq!(q[0].qs[20], 7);
    assert_eq!(q[0].bsums[0], -127 - 2 + 2 - 4 - 2 + 127);
    assert_eq!(q[0].bsums[1], 7);
    assert_eq!(&q[0].bsums[2..], &[0; 14]);
    assert_eq!(q[1].d, 2.0);
    assert_eq!(&q[1].qs[..6], &[-127, 2, 2, 0, 127, 0]);
    assert_eq!(q[1].bsums[0], 4);

    // All zeros: d = 0, no NaN.
    quantize_q8_k(&[0.0; QK_K], &mut q).unwrap();
    assert_eq!(q.len(), 1);
    assert_eq!(q[0].d.to_bits(), 0);
    assert_eq!(q[0].qs, [0; QK_K]);
    assert_eq!(q[0].bsums, [0; 16]);

    // Non-finite or subnormal activations must not panic (garbage, as in ggml).
    let mut x = [1.0f32; QK_K];
    x[3] = f32::NAN;
    x[40] = f32::INFINITY;
    quantize_q8_k(&x, &mut q).unwrap();
    let mut x = [0.0f32; QK_K];
    x[7] = 1e-40;
    x[8] = -1e-45;
    quantize_q8_k(&x, &mut q).unwrap();
}

#[test]
fn quantize_q8_k_round_trip_and_ggml_rounding() {
    let mut rng = Rng(99);
    for blocks in SUPER_SIZES {
        let x = activations_k(&mut rng, blocks);
        let mut q = Vec::new();
        quantize_q8_k(&x, &mut q).unwrap();
        assert_eq!(q.len(), blocks);
        for (x, b) in x.chunks(QK_K).zip(&q) {
            let (mut amax, mut max) = (0.0f32, 0.0f32);
            for &v in x {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            let iscale = -127.0 / max;
            assert_eq!(b.d.to_bits(), (1.0 / iscale).to_bits());
            for (k, (x, &q)) in x.iter().zip(&b.qs).enumerate() {
                // Bit-exact with ggml's formula.
                assert_eq!(i32::from(q), ggml_nearest_int(iscale * x).min(127), "{k}");
                assert!((-127..=127).contains(&q));
                // Half a step of rounding, plus f32 error.
                assert!(
                    (x - b.d * f32::from(q)).abs() <= 0.5001 * b.d.abs(),
                    "{x} vs {q}"
                );
            }
            for (k, s) in b.bsums.iter().enumerate() {
                let want: i32 = b.qs[16 * k..16 * k + 16]
                    .iter()
                    .map(|&q| i32::from(q))
                    .sum();
                assert_eq!(i32::from(*s), want);
            }
        }
    }
}

#[test]
fn q3_scale_words_match_the_reference_unpacking() {
    let mut rng = Rng(6);
    for _ in 0..2000 {
        let w: [u8; Q3_K_BYTES] = std::array::from_fn(|_| k_byte(&mut rng));
        let packed: [u8; 12] = std::array::from_fn(|i| w[96 + i]);
        let [low, high] = super::k_quants::q3_scales_words(&w);
        let bytes: Vec<u8> = [low.to_le_bytes(), high.to_le_bytes()].concat();
        assert_eq!(bytes, crate::quant::q3_k_scales(&packed), "{packed:?}");
    }
}

#[test]
fn scales_mins_match_ggml_unpacking() {
    let mut rng = Rng(5);
    for _ in 0..2000 {
        let w: [u8; 16] = std::array::from_fn(|_| k_byte(&mut rng));
        let packed: [u8; 12] = std::array::from_fn(|i| w[4 + i]);
        let (sc, m) = scales_mins(&w);
        for j in 0..8 {
            assert_eq!(
                (sc[j], m[j]),
                crate::quant::scale_min(j, &packed),
                "{w:?} {j}"
            );
        }
    }
}
