//! The packed Q2_K, Q3_K, Q4_K, Q6_K and IQ4_XS kernels against the k-quants' scalar reference on the raw rows,
//! bit for bit, with the VNNI body (where the CPU has it) and the AVX2 body forced.

use half::f16;

use super::packed::Packed;
use super::rows::{KQuant, scalar};
use super::{
    GROUP, KLayout, PackedIq4Xs, PackedK, PackedQ2K, PackedQ3K, PackedQ6K, dot_packed_k,
    dot_packed_k_into, packed_k_available,
};
use crate::quant::activation::{BlockQ8K, QK_K, quantize_q8_k};
use crate::quant::test_rng::Rng;

/// Random super-blocks with finite f16 scales at the format's offsets; `extreme` sets every
/// quant and scale byte to all ones.
fn weights(rng: &mut Rng, format: KQuant, blocks: usize, extreme: bool) -> Vec<u8> {
    let scale = |rng: &mut Rng| f16::from_f32(rng.unit() * 0.5 + 0.01).to_le_bytes();
    let mut w = Vec::new();
    for _ in 0..blocks {
        let start = w.len();
        w.extend((0..format.block_bytes()).map(|_| if extreme { 0xFF } else { rng.byte() }));
        let scales: &[usize] = match format {
            KQuant::Q2K => &[80, 82],
            KQuant::Q3K => &[108],
            KQuant::Q6K => &[208],
            KQuant::Iq4Xs => &[0],
            _ => &[0, 2],
        };
        for &at in scales {
            w[start + at..start + at + 2].copy_from_slice(&scale(rng));
        }
    }
    w
}

/// Quantized activations (so `bsums` are the quants' sums); `extreme` at full scale.
fn activations(rng: &mut Rng, blocks: usize, extreme: bool) -> Vec<BlockQ8K> {
    let x: Vec<f32> = (0..blocks * QK_K)
        .map(|_| if extreme { -3.0 } else { rng.unit() * 4.0 })
        .collect();
    let mut a = Vec::new();
    quantize_q8_k(&x, &mut a).unwrap();
    a
}

fn packed_equals_scalar() {
    let mut rng = Rng(0xC0FF_EE00_1234_5678);
    check_format(&mut rng, PackedK::pack);
    check_format(&mut rng, PackedQ6K::pack);
    check_format(&mut rng, PackedQ3K::pack);
    check_format(&mut rng, PackedQ2K::pack);
    check_format(&mut rng, PackedIq4Xs::pack);
}

/// The packed kernel of `F` against the reference over shapes with partial groups, several
/// tile widths and extreme values, and on a range of groups.
fn check_format<F: KLayout>(rng: &mut Rng, pack: fn(&[u8], usize) -> Option<Packed<F>>) {
    let format = F::FORMAT;
    for blocks in [1, 3] {
        for (n_rows, cols) in [(1, 1), (8, 1), (9, 2), (17, 3), (8, 4), (5, 7), (16, 9)] {
            for extreme in [false, true] {
                let raw = weights(rng, format, n_rows * blocks, extreme);
                let a = activations(rng, cols * blocks, extreme);
                let mut reference = vec![0.0; n_rows * cols];
                scalar::dot_rows_k(format, &raw, &a, cols, &mut reference).unwrap();
                let packed = pack(&raw, n_rows).unwrap();
                let mut fast = vec![f32::NAN; n_rows * cols];
                dot_packed_k(&packed, 0..packed.groups(), &a, cols, &mut fast).unwrap();
                for r in 0..n_rows {
                    for c in 0..cols {
                        assert_eq!(
                            fast[c * n_rows + r].to_bits(),
                            reference[r * cols + c].to_bits(),
                            "{format:?} {blocks} blocks {n_rows}×{cols} extreme {extreme} \
                             at ({r}, {c})"
                        );
                    }
                }
                if n_rows > GROUP {
                    let part_rows = n_rows - GROUP;
                    let mut part = vec![0.0; part_rows * cols];
                    let groups = 1..packed.groups();
                    dot_packed_k(&packed, groups, &a, cols, &mut part).unwrap();
                    for c in 0..cols {
                        assert_eq!(
                            part[c * part_rows..][..part_rows],
                            fast[c * n_rows + GROUP..][..part_rows]
                        );
                    }
                    // In place: runs of wider output rows, the rest untouched.
                    let width = n_rows + 3;
                    let mut wide = vec![f32::NAN; width * cols];
                    let mut runs: Vec<&mut [f32]> = wide
                        .chunks_exact_mut(width)
                        .map(|row| &mut row[1..1 + part_rows])
                        .collect();
                    dot_packed_k_into(&packed, 1..packed.groups(), &a, &mut runs).unwrap();
                    for (c, row) in wide.chunks_exact(width).enumerate() {
                        let expected = &fast[c * n_rows + GROUP..][..part_rows];
                        assert_eq!(&row[1..1 + part_rows], expected);
                        assert!(row[0].is_nan() && row[1 + part_rows..].iter().all(|v| v.is_nan()));
                    }
                }
            }
        }
    }
}

#[test]
fn packed_k_equals_scalar_bit_for_bit() {
    if !packed_k_available() {
        eprintln!("!!! AVX2 NOT DETECTED: the packed k-quant kernels are NOT tested here !!!");
        return;
    }
    crate::isa::on_each_simd_path(packed_equals_scalar);
}

#[test]
fn packing_refuses_what_it_cannot_pack() {
    let raw = vec![0u8; 2 * KQuant::Q4K.block_bytes()];
    assert!(PackedK::pack(&raw, 2).is_some());
    assert!(PackedK::pack(&raw[1..], 1).is_none());
    assert!(PackedK::pack(&raw, 0).is_none());
    assert!(PackedK::pack(&raw[..100], 1).is_none());
    let raw_q6 = vec![0u8; 2 * KQuant::Q6K.block_bytes()];
    assert!(PackedQ6K::pack(&raw_q6, 2).is_some());
    assert!(PackedQ6K::pack(&raw_q6[1..], 1).is_none());
    let packed = PackedK::pack(&raw, 2).unwrap();
    let a = activations(&mut Rng(3), 1, false);
    let mut out = [0.0; 2];
    assert!(dot_packed_k(&packed, 0..1, &a, 1, &mut out).is_ok() || !packed_k_available());
    assert!(dot_packed_k(&packed, 0..2, &a, 1, &mut out).is_err());
    assert!(dot_packed_k(&packed, 0..1, &a, 2, &mut out).is_err());
    assert!(dot_packed_k(&packed, 0..1, &a, 1, &mut out[..1]).is_err());
}

/// IQ4_XS's packed kernel is exact for every activation byte, −128 included (which
/// `quantize_q8_k` never makes, so the test above cannot reach it); `bsums` are the quants'
/// sums, as the VNNI body takes its offset from them.
fn packed_iq4_xs_takes_any_activation_bytes() {
    let mut rng = Rng(0x1234_5678_9ABC_DEF0);
    let (blocks, n_rows, cols) = (2, 9, 3);
    let raw = weights(&mut rng, KQuant::Iq4Xs, n_rows * blocks, false);
    let packed = PackedIq4Xs::pack(&raw, n_rows).unwrap();
    for fill in [-128i8, 127, -1] {
        let mut block = |i: usize| {
            let qs: [i8; QK_K] = std::array::from_fn(|j| {
                if (i + j).is_multiple_of(3) {
                    fill
                } else {
                    rng.byte() as i8
                }
            });
            let sum = |s: usize| qs[16 * s..][..16].iter().map(|&q| i16::from(q)).sum();
            let bsums = std::array::from_fn(sum);
            BlockQ8K { d: 0.5, qs, bsums }
        };
        let a: Vec<BlockQ8K> = (0..cols * blocks).map(&mut block).collect();
        let mut reference = vec![0.0; n_rows * cols];
        scalar::dot_rows_k(KQuant::Iq4Xs, &raw, &a, cols, &mut reference).unwrap();
        let mut fast = vec![f32::NAN; n_rows * cols];
        dot_packed_k(&packed, 0..packed.groups(), &a, cols, &mut fast).unwrap();
        for r in 0..n_rows {
            for c in 0..cols {
                let (got, want) = (fast[c * n_rows + r], reference[r * cols + c]);
                assert_eq!(got.to_bits(), want.to_bits(), "{fill}: ({r}, {c})");
            }
        }
    }
}

#[test]
fn packed_iq4_xs_is_exact_for_any_activation_bytes() {
    if packed_k_available() {
        crate::isa::on_each_simd_path(packed_iq4_xs_takes_any_activation_bytes);
    }
}
