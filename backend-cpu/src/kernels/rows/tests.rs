//! SIMD kernels against the scalar ones bit for bit, quantization against its error bound, and
//! the scalar dots against an f64 dot of the dequantized rows.

#![allow(clippy::unwrap_used)]

use half::f16;
use worker_common::gguf::GgmlType;

use super::*;
use crate::kernels::{self, Legacy, Q8Rows};
use crate::quant::activation::{quantize_q8_0, quantize_q8_1};
use crate::quant::dequantize;
use crate::quant::test_rng::Rng;

/// Test data beyond the shared generator: scales and quants with the edge cases kernels miss.
pub(super) trait QuantData {
    fn scale(&mut self) -> f16;
    fn quant(&mut self) -> u8;
}

impl QuantData for Rng {
    /// A scale: often random of either sign and varied magnitude, sometimes exactly zero.
    fn scale(&mut self) -> f16 {
        match self.next() % 8 {
            0 => f16::ZERO,
            1 => f16::NEG_ZERO,
            _ => f16::from_f32(self.unit() * 2f32.powi((self.next() % 12) as i32 - 6)),
        }
    }
    /// A quant byte, a quarter of the time an extreme one.
    fn quant(&mut self) -> u8 {
        match self.next() % 8 {
            0 => 0x80, // -128 as i8
            1 => 0x7F, // 127
            _ => self.byte(),
        }
    }
}

pub(super) const SIZES: [usize; 5] = [1, 3, 7, 33, 100];

/// Random weight rows: `head` scale/offset bytes as random f16 scales, the rest quants.
pub(super) fn weights(rng: &mut Rng, blocks: usize, block_bytes: usize, head: usize) -> Vec<u8> {
    let mut w = Vec::with_capacity(blocks * block_bytes);
    for _ in 0..blocks {
        for _ in 0..head / 2 {
            w.extend_from_slice(&rng.scale().to_le_bytes());
        }
        w.extend((head..block_bytes).map(|_| rng.quant()));
    }
    w
}

fn q8_0_bytes(blocks: &[BlockQ8_0]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for b in blocks {
        bytes.extend_from_slice(&b.d.to_le_bytes());
        bytes.extend(b.qs.map(|q| q as u8));
    }
    bytes
}

/// Whether the AVX2 kernels run here; says so loudly when they do not, since the SIMD
/// comparisons then only exercise the scalar path.
pub(super) fn simd_available() -> bool {
    let available = crate::isa::avx2();
    if !available {
        eprintln!(
            "!!! AVX2/FMA/F16C NOT DETECTED: the SIMD kernels are NOT tested on this machine; \
             only the scalar path ran !!!"
        );
    }
    available
}

/// Random activations with per-block magnitudes from 0.1 to ~1000, so `d` is a normal f16.
pub(super) fn activations(rng: &mut Rng, blocks: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(blocks * 32);
    for _ in 0..blocks {
        let magnitude = 0.1 * 2f32.powi((rng.next() % 13) as i32);
        x.extend((0..32).map(|_| rng.unit() * magnitude));
    }
    x
}

#[test]
fn quantize_round_trip_within_bound() {
    let mut rng = Rng(42);
    for blocks in SIZES {
        let x = activations(&mut rng, blocks);
        let mut q = Vec::new();
        quantize_q8_0(&x, &mut q).unwrap();
        let mut q1 = Vec::new();
        quantize_q8_1(&x, &mut q1).unwrap();
        assert_eq!(q.len(), blocks);
        let mut y = vec![f32::NAN; x.len()];
        dequantize(GgmlType::Q8_0, &q8_0_bytes(&q), &mut y).unwrap();
        for ((xb, yb), (b0, b1)) in x.chunks(32).zip(y.chunks(32)).zip(q.iter().zip(&q1)) {
            let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            // Half a step of rounding, plus up to 127 quants times f16's 2^-11 scale error.
            let bound = 0.57 * d;
            for (a, b) in xb.iter().zip(yb) {
                assert!((a - b).abs() <= bound, "{a} vs {b}, bound {bound}");
            }
            assert!(b0.qs.iter().all(|&q| q != -128));
            // Q8_1 has the same d and quants, plus s from the unrounded d.
            assert_eq!(b0.d.to_bits(), b1.d.to_bits());
            assert_eq!(b0.qs, b1.qs);
            let sum: i32 = b1.qs.iter().map(|&q| i32::from(q)).sum();
            assert_eq!(b1.s.to_bits(), f16::from_f32(sum as f32 * d).to_bits());
        }
    }
}

#[test]
fn quantize_known_values() {
    // amax 127 gives d = 1, so quants are roundf(x): halves round away from zero.
    let mut x = [0.0f32; 32];
    x[..6].copy_from_slice(&[127.0, -2.5, 2.5, 0.49, -0.5, 126.6]);
    let mut q = Vec::new();
    quantize_q8_0(&x, &mut q).unwrap();
    assert_eq!(q[0].d, f16::ONE);
    assert_eq!(&q[0].qs[..7], &[127, -3, 3, 0, -1, 127, 0]);

    // An all-zero block has d = 0 and zero quants (ggml's `id = 0`), with no NaN.
    let mut q1 = Vec::new();
    quantize_q8_1(&[0.0; 32], &mut q1).unwrap();
    assert_eq!(q1[0].d.to_bits(), 0);
    assert_eq!(q1[0].s.to_bits(), 0);
    assert_eq!(q1[0].qs, [0; 32]);

    // Non-finite activations must not panic (the results are garbage, as in ggml).
    let mut x = [1.0f32; 64];
    x[3] = f32::NAN;
    x[40] = f32::INFINITY;
    quantize_q8_1(&x, &mut q1).unwrap();
    assert_eq!(q1.len(), 2);
}

/// f64 dot of the dequantized weights with the dequantized activations, and the sum of the
/// magnitudes of its terms (for a relative tolerance).
pub(super) fn reference(ggml_type: GgmlType, w: &[u8], a: &[f64]) -> (f64, f64) {
    let mut wf = vec![f32::NAN; a.len()];
    dequantize(ggml_type, w, &mut wf).unwrap();
    wf.iter()
        .zip(a)
        .map(|(&w, &a)| f64::from(w) * a)
        .fold((0.0, 0.0), |(s, m), t| (s + t, m + t.abs()))
}

/// The scalar reference of `crate::kernels` for one row and one column.
fn legacy_dot(format: Legacy, w: &[u8], q: &[BlockQ8_0], q1: &[BlockQ8_1]) -> f32 {
    let activations = if format.uses_q8_1() {
        Q8Rows::Q8_1(q1)
    } else {
        Q8Rows::Q8_0(q)
    };
    let mut out = [0.0];
    kernels::scalar::dot_rows(format, w, activations, 1, &mut out).unwrap();
    out[0]
}

/// The 32-element formats' reference kernels (`crate::kernels::scalar`) against f64.
#[test]
fn legacy_reference_dots_match_f64() {
    let mut rng = Rng(7);
    for blocks in SIZES {
        let x = activations(&mut rng, blocks);
        let mut q = Vec::new();
        quantize_q8_0(&x, &mut q).unwrap();
        let mut q1 = Vec::new();
        quantize_q8_1(&x, &mut q1).unwrap();
        let a: Vec<f64> = q
            .iter()
            .flat_map(|b| b.qs.map(|v| f64::from(v) * f64::from(b.d.to_f32())))
            .collect();

        for (ggml_type, format, head) in [
            (GgmlType::Q8_0, Legacy::Q8_0, 2),
            (GgmlType::Q4_0, Legacy::Q4_0, 2),
            (GgmlType::Q4_1, Legacy::Q4_1, 4),
            (GgmlType::Q5_0, Legacy::Q5_0, 2),
            (GgmlType::Q5_1, Legacy::Q5_1, 4),
            (GgmlType::IQ4_NL, Legacy::Iq4Nl, 2),
        ] {
            let block_bytes = format.block_bytes();
            let w = weights(&mut rng, blocks, block_bytes, head);
            let (want, magnitude) = reference(ggml_type, &w, &a);
            let (got, mut tol) = match ggml_type {
                GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::IQ4_NL => {
                    (legacy_dot(format, &w, &q, &q1), 0.0)
                }
                _ => {
                    // The min term uses s, f16-rounded from the unrounded d, where the
                    // reference uses the f16 d times the quant sum: allow f16's error there.
                    let slack: f64 = w
                        .chunks(block_bytes)
                        .zip(&q1)
                        .map(|(w, b)| {
                            let m = f16::from_le_bytes([w[2], w[3]]).to_f64();
                            let sum: i32 = b.qs.iter().map(|&v| i32::from(v)).sum();
                            m.abs() * (b.s.to_f64().abs() + f64::from(sum.abs()) * b.d.to_f64())
                        })
                        .sum();
                    (legacy_dot(format, &w, &q, &q1), slack * 2e-3)
                }
            };
            tol += 1e-5 * magnitude + 1e-30;
            let err = (f64::from(got) - want).abs();
            assert!(
                err <= tol,
                "{ggml_type} {blocks} blocks: {got} vs {want}, err {err} > {tol}"
            );
        }
    }
}
