//! The SIMD row kernels against the scalar reference (bit for bit) and the reference against
//! the dequantizer (within Q8 rounding).

use half::f16;

use super::{
    GROUP, Legacy, MAX_COLS, PackedRows, Q8Rows, block_meta, dot_packed, dot_packed_into, scalar,
};
use crate::quant::activation::{BlockQ8_0, BlockQ8_1, QK8, quantize_q8_0, quantize_q8_1};
use crate::quant::test_rng::Rng;
use crate::quant::{KVALUES_IQ4NL, dequantize};

const FORMATS: [Legacy; 6] = [
    Legacy::Q4_0,
    Legacy::Q4_1,
    Legacy::Q5_0,
    Legacy::Q5_1,
    Legacy::Q8_0,
    Legacy::Iq4Nl,
];

fn ggml_type(format: Legacy) -> worker_common::gguf::GgmlType {
    use worker_common::gguf::GgmlType;
    match format {
        Legacy::Q4_0 => GgmlType::Q4_0,
        Legacy::Q4_1 => GgmlType::Q4_1,
        Legacy::Q5_0 => GgmlType::Q5_0,
        Legacy::Q5_1 => GgmlType::Q5_1,
        Legacy::Q8_0 => GgmlType::Q8_0,
        Legacy::Iq4Nl => GgmlType::IQ4_NL,
    }
}

/// A random finite f16 scale in roughly ±[2^-10, 2).
fn scale(rng: &mut Rng) -> [u8; 2] {
    let v = rng.unit() * 2.0;
    f16::from_f32(if v.abs() < 1e-3 { 0.5 } else { v }).to_le_bytes()
}

/// Random weight blocks; `extreme` fills every code with its largest magnitude.
fn weights(rng: &mut Rng, format: Legacy, blocks: usize, extreme: bool) -> Vec<u8> {
    let mut row = Vec::with_capacity(blocks * format.block_bytes());
    for _ in 0..blocks {
        let start = row.len();
        row.extend(scale(rng));
        if format.uses_q8_1() {
            row.extend(scale(rng));
        }
        while row.len() < start + format.block_bytes() {
            row.push(match (extreme, format) {
                (true, Legacy::Q8_0) => 0x80,
                // Index 0: the grid's −127.
                (true, Legacy::Iq4Nl) => 0x00,
                (true, _) => 0xFF,
                (false, _) => rng.byte(),
            });
        }
    }
    row
}

fn activations(rng: &mut Rng, n: usize, extreme: bool) -> Vec<f32> {
    (0..n)
        .map(|_| if extreme { -1.0 } else { rng.unit() * 4.0 })
        .collect()
}

/// Quantized activations for `format`, with hand-set −128 quants when `extreme`.
fn quantized(x: &[f32], extreme: bool) -> (Vec<BlockQ8_0>, Vec<BlockQ8_1>) {
    let (mut q0, mut q1) = (Vec::new(), Vec::new());
    quantize_q8_0(x, &mut q0).unwrap();
    quantize_q8_1(x, &mut q1).unwrap();
    if extreme {
        q0.iter_mut().for_each(|b| b.qs = [-128; QK8]);
        q1.iter_mut().for_each(|b| b.qs = [-128; QK8]);
    }
    (q0, q1)
}

fn rows<'a>(format: Legacy, q: &'a (Vec<BlockQ8_0>, Vec<BlockQ8_1>)) -> Q8Rows<'a> {
    if format.uses_q8_1() {
        Q8Rows::Q8_1(&q.1)
    } else {
        Q8Rows::Q8_0(&q.0)
    }
}

/// `n_rows` raw rows repacked, against all `cols` tokens, on the fastest path.
fn dot_rows(
    format: Legacy,
    raw: &[u8],
    activations: Q8Rows<'_>,
    cols: usize,
    out: &mut [f32],
) -> Result<(), super::ShapeError> {
    let n_rows = out.len() / cols.max(1);
    let packed = PackedRows::pack(format, raw, n_rows)?;
    let mut meta = Vec::new();
    block_meta(activations, &mut meta);
    let mut token_major = vec![0.0; out.len()];
    dot_packed(
        &packed,
        0..packed.groups(),
        activations,
        &meta,
        cols,
        &mut token_major,
    )?;
    for (c, token) in token_major.chunks_exact(n_rows).enumerate() {
        for (r, &v) in token.iter().enumerate() {
            out[r * cols + c] = v;
        }
    }
    Ok(())
}

/// Both SIMD paths (VNNI where the CPU has it, and AVX2 forced) against the scalar reference.
#[test]
fn simd_equals_scalar_bit_for_bit() {
    crate::isa::on_each_simd_path(simd_equals_scalar);
}

fn simd_equals_scalar() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut compared = 0;
    for format in FORMATS {
        for blocks in [1, 3, 7, 33] {
            for (n_rows, cols) in [
                (1, 1),
                (5, 1),
                (9, 1),
                (3, 2),
                (2, 3),
                (1, 4),
                (5, 4),
                (3, 9),
                (16, 4),
                (33, 5),
            ] {
                for extreme in [false, true] {
                    let row = weights(&mut rng, format, n_rows * blocks, extreme);
                    let x = activations(&mut rng, cols * blocks * QK8, extreme);
                    let q = quantized(&x, extreme);
                    let mut fast = vec![0.0; n_rows * cols];
                    let mut reference = fast.clone();
                    dot_rows(format, &row, rows(format, &q), cols, &mut fast).unwrap();
                    scalar::dot_rows(format, &row, rows(format, &q), cols, &mut reference).unwrap();
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&fast),
                        bits(&reference),
                        "{format:?}, {blocks} blocks, {n_rows}×{cols}, extreme {extreme}"
                    );
                    compared += 1;
                }
            }
        }
    }
    assert_eq!(compared, FORMATS.len() * 4 * 10 * 2);
}

#[test]
fn columns_computed_together_equal_one_by_one() {
    let mut rng = Rng(7);
    for format in FORMATS {
        let blocks = 9;
        let row = weights(&mut rng, format, blocks, false);
        let x = activations(&mut rng, MAX_COLS * blocks * QK8, false);
        let q = quantized(&x, false);
        let mut together = vec![0.0; MAX_COLS];
        dot_rows(format, &row, rows(format, &q), MAX_COLS, &mut together).unwrap();
        for (c, together) in together.iter().enumerate() {
            let one = (
                q.0[c * blocks..(c + 1) * blocks].to_vec(),
                q.1[c * blocks..(c + 1) * blocks].to_vec(),
            );
            let mut alone = [0.0];
            dot_rows(format, &row, rows(format, &one), 1, &mut alone).unwrap();
            assert_eq!(alone[0].to_bits(), together.to_bits(), "{format:?} col {c}");
        }
    }
}

#[test]
fn reference_matches_dequantized_dot() {
    let mut rng = Rng(42);
    for format in FORMATS {
        let blocks = 17;
        let row = weights(&mut rng, format, blocks, false);
        let x = activations(&mut rng, blocks * QK8, false);
        let q = quantized(&x, false);
        let mut got = [0.0];
        scalar::dot_rows(format, &row, rows(format, &q), 1, &mut got).unwrap();
        let mut w = vec![0.0; blocks * QK8];
        dequantize(ggml_type(format), &row, &mut w).unwrap();
        let exact: f32 = w.iter().zip(&x).map(|(a, b)| a * b).sum();
        let magnitude: f32 = w.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
        assert!(
            (got[0] - exact).abs() <= 1e-2 * magnitude,
            "{format:?}: {} vs {exact} (magnitude {magnitude})",
            got[0]
        );
    }
}

#[test]
fn shape_errors_are_reported_not_panics() {
    let q: (Vec<BlockQ8_0>, Vec<BlockQ8_1>) = (
        vec![
            BlockQ8_0 {
                d: f16::ONE,
                qs: [0; QK8]
            };
            2
        ],
        Vec::new(),
    );
    let row = vec![0u8; 2 * Legacy::Q8_0.block_bytes()];
    let mut out = [0.0; 2];
    let a = Q8Rows::Q8_0(&q.0);
    let reference = scalar::dot_rows;
    assert!(reference(Legacy::Q8_0, &row, a, 1, &mut out).is_err());
    assert!(reference(Legacy::Q8_0, &row[..35], a, 1, &mut out[..1]).is_err());
    assert!(reference(Legacy::Q4_1, &row[..40], a, 1, &mut out[..1]).is_err());
    assert!(reference(Legacy::Q8_0, &row, a, 0, &mut []).is_err());
    assert!(reference(Legacy::Q8_0, &row, a, 3, &mut out).is_err());
    assert!(reference(Legacy::Q8_0, &row, a, 1, &mut out[..1]).is_ok());
    assert!(reference(Legacy::Q8_0, &row[..34], a, 2, &mut out).is_ok());

    // Packed: 1 row of 2 blocks against 1 column (2 blocks) and sums for each block.
    let packed = PackedRows::pack(Legacy::Q8_0, &row, 1).unwrap();
    let mut meta = Vec::new();
    block_meta(a, &mut meta);
    assert!(dot_packed(&packed, 0..1, a, &meta, 1, &mut out[..1]).is_ok());
    assert!(dot_packed(&packed, 0..1, a, &meta[..1], 1, &mut out[..1]).is_err());
    assert!(dot_packed(&packed, 0..2, a, &meta, 1, &mut out[..1]).is_err());
    assert!(dot_packed(&packed, 0..1, a, &meta, 1, &mut out).is_err());
    assert!(dot_packed(&packed, 0..1, a, &meta, 2, &mut out).is_err());
    let q1 = Q8Rows::Q8_1(&q.1);
    assert!(dot_packed(&packed, 0..1, q1, &[], 1, &mut out[..1]).is_err());
    assert!(PackedRows::pack(Legacy::Q8_0, &row[..35], 1).is_err());
    assert!(PackedRows::pack(Legacy::Q8_0, &row, 0).is_err());
    assert!(PackedRows::pack(Legacy::Q4_1, &row, 1).is_err());
}

/// Every block of every row read back from the packing equals the raw block.
#[test]
fn packing_round_trips() {
    let mut rng = Rng(99);
    for format in FORMATS {
        for n_rows in [1, 7, 8, 9, 17] {
            let blocks = 3;
            let raw = weights(&mut rng, format, n_rows * blocks, false);
            let packed = PackedRows::pack(format, &raw, n_rows).unwrap();
            assert_eq!(packed.groups(), n_rows.div_ceil(GROUP));
            for (r, row) in raw.chunks_exact(blocks * format.block_bytes()).enumerate() {
                for (i, block) in row.chunks_exact(format.block_bytes()).enumerate() {
                    assert_eq!(
                        packed.raw_block(r, i),
                        block,
                        "{format:?} row {r} block {i}"
                    );
                }
            }
        }
    }
}

/// A range of groups gives the same outputs as the whole matrix, written in place into runs of
/// wider output rows as well, and the scalar packed path the same as the SIMD one.
#[test]
fn group_ranges_equal_the_whole() {
    let mut rng = Rng(5);
    for format in FORMATS {
        let (n_rows, blocks, cols) = (21, 4, 3);
        let raw = weights(&mut rng, format, n_rows * blocks, false);
        let x = activations(&mut rng, cols * blocks * QK8, false);
        let q = quantized(&x, false);
        let mut whole = vec![0.0; n_rows * cols];
        dot_rows(format, &raw, rows(format, &q), cols, &mut whole).unwrap();
        let packed = PackedRows::pack(format, &raw, n_rows).unwrap();
        let mut meta = Vec::new();
        block_meta(rows(format, &q), &mut meta);
        let part_rows = n_rows - GROUP;
        let mut part = vec![0.0; part_rows * cols];
        dot_packed(&packed, 1..3, rows(format, &q), &meta, cols, &mut part).unwrap();
        let mut slow = vec![0.0f32; n_rows * cols];
        let mut slow_tokens: Vec<&mut [f32]> = slow.chunks_exact_mut(n_rows).collect();
        scalar::dot_packed(&packed, 0..n_rows, rows(format, &q), &mut slow_tokens);
        // Into the place a batched matmul gives a task: that run of each token's output row
        // of a wider matrix, the rest untouched.
        let (width, at) = (n_rows + 5, 3);
        let mut wide = vec![f32::NAN; width * cols];
        let mut runs: Vec<&mut [f32]> = wide
            .chunks_exact_mut(width)
            .map(|row| &mut row[at..at + part_rows])
            .collect();
        dot_packed_into(&packed, 1..3, rows(format, &q), &meta, &mut runs).unwrap();
        for r in 0..n_rows {
            for c in 0..cols {
                let want = whole[r * cols + c].to_bits();
                assert_eq!(slow[c * n_rows + r].to_bits(), want, "{format:?} {r} {c}");
                if r >= GROUP {
                    let got = part[c * part_rows + r - GROUP].to_bits();
                    assert_eq!(got, want, "{format:?} {r} {c}");
                    let got = wide[c * width + at + r - GROUP].to_bits();
                    assert_eq!(got, want, "{format:?} {r} {c}, in place");
                }
            }
        }
        let untouched = wide.chunks_exact(width).all(|row| {
            row[..at]
                .iter()
                .chain(&row[at + part_rows..])
                .all(|v| v.is_nan())
        });
        assert!(untouched, "{format:?}: outside the runs");
    }
}

/// One block against one column, on the fastest path and the scalar one.
fn both_paths(format: Legacy, w: &[u8], a: Q8Rows<'_>) -> [f32; 2] {
    let (mut fast, mut reference) = ([0.0], [0.0]);
    dot_rows(format, w, a, 1, &mut fast).unwrap();
    scalar::dot_rows(format, w, a, 1, &mut reference).unwrap();
    [fast[0], reference[0]]
}

/// All-extreme blocks against hand-computed sums: the largest integer sums, where a
/// saturating SIMD trick (or a wrong offset correction) would fail.
#[test]
fn extreme_blocks_match_hand_sums() {
    let one = f16::ONE.to_le_bytes();
    for aq in [-128i8, 127, 0, -1] {
        let q0 = [BlockQ8_0 {
            d: f16::ONE,
            qs: [aq; QK8],
        }];
        let q1 = [BlockQ8_1 {
            d: f16::ONE,
            s: f16::from_f32(2.0),
            qs: [aq; QK8],
        }];
        for wq in [0x80u8, 0x7F, 0xFF, 0x00] {
            let w = [&one[..], &[wq; 32]].concat();
            let want = 32.0 * f32::from(wq as i8) * f32::from(aq);
            assert_eq!(both_paths(Legacy::Q8_0, &w, Q8Rows::Q8_0(&q0)), [want; 2]);
        }
        for (qh, qs) in [(u32::MAX, 0xFFu8), (0, 0), (0xAAAA_AAAA, 0x5A), (0, 0xFF)] {
            let code = |j: usize| {
                let nibble = if j < 16 { qs & 0x0F } else { qs >> 4 };
                i32::from(nibble) | (((qh >> j) & 1) << 4) as i32
            };
            let dot = |offset: i32, five: bool| -> f32 {
                let value = |j| if five { code(j) } else { code(j) & 0x0F };
                (0..32)
                    .map(|j| (value(j) - offset) * i32::from(aq))
                    .sum::<i32>() as f32
            };
            // IQ4_NL: Q4_0's bytes as indices into the grid.
            let grid: i32 = (0..32)
                .map(|j| i32::from(KVALUES_IQ4NL[(code(j) & 0x0F) as usize]) * i32::from(aq))
                .sum();
            let half = f16::from_f32(0.5).to_le_bytes();
            let q4_0 = [&one[..], &[qs; 16]].concat();
            let q4_1 = [&one[..], &half, &[qs; 16]].concat();
            let q5_0 = [&one[..], &qh.to_le_bytes(), &[qs; 16]].concat();
            let q5_1 = [&one[..], &half, &qh.to_le_bytes(), &[qs; 16]].concat();
            // Q4_1/Q5_1 add m·s = 0.5 · 2.
            let cases = [
                (Legacy::Iq4Nl, q4_0.clone(), Q8Rows::Q8_0(&q0), grid as f32),
                (Legacy::Q4_0, q4_0, Q8Rows::Q8_0(&q0), dot(8, false)),
                (Legacy::Q4_1, q4_1, Q8Rows::Q8_1(&q1), dot(0, false) + 1.0),
                (Legacy::Q5_0, q5_0, Q8Rows::Q8_0(&q0), dot(16, true)),
                (Legacy::Q5_1, q5_1, Q8Rows::Q8_1(&q1), dot(0, true) + 1.0),
            ];
            for (format, w, a, want) in cases {
                assert_eq!(
                    both_paths(format, &w, a),
                    [want; 2],
                    "{format:?} {qh:#x} {qs:#x} {aq}"
                );
            }
        }
    }
}

/// Batches that mix the 4-, 2- and 1-token tiles and partial groups, on both SIMD paths.
#[test]
fn wide_tiles_equal_scalar_bit_for_bit() {
    crate::isa::on_each_simd_path(wide_tiles_equal_scalar);
}

fn wide_tiles_equal_scalar() {
    let mut rng = Rng(0x0DDB_A11C_0FFE_E123);
    for format in FORMATS {
        for (n_rows, cols, blocks) in [(2, 8, 5), (12, 13, 3), (3, 16, 2), (17, 21, 7), (8, 7, 2)] {
            for extreme in [false, true] {
                let row = weights(&mut rng, format, n_rows * blocks, extreme);
                let x = activations(&mut rng, cols * blocks * QK8, extreme);
                let q = quantized(&x, extreme);
                let mut fast = vec![0.0; n_rows * cols];
                let mut reference = fast.clone();
                dot_rows(format, &row, rows(format, &q), cols, &mut fast).unwrap();
                scalar::dot_rows(format, &row, rows(format, &q), cols, &mut reference).unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&fast),
                    bits(&reference),
                    "{format:?}, {blocks} blocks, {n_rows}×{cols}, extreme {extreme}"
                );
            }
        }
    }
}
