//! Float-row dots: AVX2 against scalar bit for bit on every length class and alignment, and
//! against an f64 dot.

#![allow(clippy::unwrap_used)]

use half::{bf16, f16};

use super::tests::simd_available;
use super::*;
use crate::quant::test_rng::Rng;

type Kernel = fn(&[u8], &[f32]) -> Result<f32, DotError>;
type Simd = fn(&[u8], &[f32]) -> Option<f32>;

/// (name, bytes per element, dispatching, scalar, AVX2).
const KERNELS: [(&str, usize, Kernel, Kernel, Simd); 3] = [
    (
        "f32",
        4,
        dot_f32_f32,
        scalar::dot_f32_f32,
        avx2_float::f32_f32,
    ),
    (
        "f16",
        2,
        dot_f16_f32,
        scalar::dot_f16_f32,
        avx2_float::f16_f32,
    ),
    (
        "bf16",
        2,
        dot_bf16_f32,
        scalar::dot_bf16_f32,
        avx2_float::bf16_f32,
    ),
];

const LENGTHS: [usize; 11] = [0, 1, 7, 31, 32, 33, 63, 64, 100, 1000, 4103];

/// A random finite value of varied magnitude and sign, sometimes zero or subnormal-small.
fn value(rng: &mut Rng) -> f32 {
    match rng.next() % 16 {
        0 => 0.0,
        1 => -0.0,
        2 => rng.unit() * 1e-6,
        _ => rng.unit() * 2f32.powi((rng.next() % 16) as i32 - 8),
    }
}

/// Weights encoded as `bytes`-byte elements, at byte offset `skew` of the returned buffer,
/// and their exact f32 values.
fn encode(rng: &mut Rng, n: usize, bytes: usize, name: &str, skew: usize) -> (Vec<u8>, Vec<f32>) {
    let mut raw = vec![0xA5; skew];
    let mut vals = Vec::with_capacity(n);
    for _ in 0..n {
        let v = value(rng);
        match name {
            "f32" => {
                raw.extend(v.to_le_bytes());
                vals.push(v);
            }
            "f16" => {
                let h = f16::from_f32(v);
                raw.extend(h.to_le_bytes());
                vals.push(h.to_f32());
            }
            _ => {
                let h = bf16::from_f32(v);
                raw.extend(h.to_le_bytes());
                vals.push(h.to_f32());
            }
        }
        assert_eq!(raw.len() - skew, vals.len() * bytes);
    }
    (raw, vals)
}

#[test]
fn float_avx2_matches_scalar_and_f64() {
    let simd = simd_available();
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    for round in 0..10 {
        for n in LENGTHS {
            let a: Vec<f32> = (0..n).map(|_| value(&mut rng)).collect();
            for (name, bytes, dispatched, reference, avx2) in KERNELS {
                let skew = round % 4; // unaligned weight rows
                let (raw, vals) = encode(&mut rng, n, bytes, name, skew);
                let w = &raw[skew..];
                let ctx = format!("{name} round {round}, n {n}");
                let want = reference(w, &a).unwrap();
                assert_eq!(
                    dispatched(w, &a).unwrap().to_bits(),
                    want.to_bits(),
                    "{ctx}"
                );
                if simd {
                    assert_eq!(avx2(w, &a).unwrap().to_bits(), want.to_bits(), "{ctx} avx2");
                }
                let (exact, magnitude) = vals
                    .iter()
                    .zip(&a)
                    .map(|(&w, &a)| f64::from(w) * f64::from(a))
                    .fold((0.0, 0.0), |(s, m), t| (s + t, m + t.abs()));
                let err = (f64::from(want) - exact).abs();
                let tol = 1e-6 * magnitude + 1e-30;
                assert!(err <= tol, "{ctx}: {want} vs {exact}, err {err} > {tol}");
            }
        }
    }
}

/// The documented order, by hand: 32 lanes, pairwise reduction, then the tail.
#[test]
fn float_order_is_the_documented_one() {
    // Lane 0 gets 1e8 then -1e8 in the second chunk, lane 16 gets 1: reduced pairwise first
    // (1 survives), then the tail adds 0.5.
    let mut w = vec![0.0f32; 65];
    let a = vec![1.0f32; 65];
    w[0] = 1e8;
    w[32] = -1e8;
    w[16] = 1.0;
    w[64] = 0.5;
    let raw: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(scalar::dot_f32_f32(&raw, &a).unwrap(), 1.5);
    assert_eq!(dot_f32_f32(&raw, &a).unwrap(), 1.5);
    // Lanes 0 and 16 hold 2^24 and 1: the 1 is lost when they meet (ties to even), where a
    // sequential sum would lose it too; lane 1's 1 meets lane 17's 1 first, giving 2, which
    // then survives against 2^24.
    let mut w = [0.0f32; 32];
    w[0] = 16_777_216.0;
    w[16] = 1.0;
    w[1] = 1.0;
    w[17] = 1.0;
    let raw: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let a = vec![1.0f32; 32];
    assert_eq!(scalar::dot_f32_f32(&raw, &a).unwrap(), 16_777_218.0);
    assert_eq!(dot_f32_f32(&raw, &a).unwrap(), 16_777_218.0);
}

#[test]
fn float_length_mismatches_are_errors() {
    let a = [1.0f32; 3];
    let err = |bytes, block_bytes| {
        Err(DotError::LengthMismatch {
            bytes,
            blocks: 3,
            block_bytes,
        })
    };
    assert_eq!(dot_f32_f32(&[0; 11], &a), err(11, 4));
    assert_eq!(dot_f16_f32(&[0; 7], &a), err(7, 2));
    assert_eq!(scalar::dot_bf16_f32(&[0; 5], &a), err(5, 2));
    assert_eq!(dot_bf16_f32(&[], &[]), Ok(0.0));
}
