//! The scalar reference of the row kernels: plain code in the documented summation order, the
//! oracle the SIMD kernels must match bit for bit.

use super::{Legacy, Q8Rows, ShapeError, check};
use crate::quant::activation::QK8;

/// [`super::dot_rows`] without SIMD.
pub fn dot_rows(
    format: Legacy,
    rows: &[u8],
    activations: Q8Rows<'_>,
    cols: usize,
    out: &mut [f32],
) -> Result<(), ShapeError> {
    let row_bytes = check(format, rows, activations, cols, out.len())?;
    dot_rows_unchecked(format, rows, row_bytes, activations, cols, out);
    Ok(())
}

/// All rows against all columns, for already-checked shapes.
pub(super) fn dot_rows_unchecked(
    format: Legacy,
    rows: &[u8],
    row_bytes: usize,
    activations: Q8Rows<'_>,
    cols: usize,
    out: &mut [f32],
) {
    for (row, out) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(cols)) {
        dot_row(format, row, activations, out);
    }
}

/// One weight block decoded: signed element values, scale, and offset `m` (0 when none).
struct Block {
    values: [i32; QK8],
    d: f32,
    m: f32,
}

fn f16(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Element `j` of a 16-byte nibble array: low nibbles are elements 0..16, high ones 16..32.
fn nibble(qs: &[u8], j: usize) -> i32 {
    i32::from(if j < 16 {
        qs[j] & 0x0F
    } else {
        qs[j - 16] >> 4
    })
}

fn decode(format: Legacy, b: &[u8]) -> Block {
    let fifth = |qh_at: usize, j: usize| {
        let qh = u32::from_le_bytes([b[qh_at], b[qh_at + 1], b[qh_at + 2], b[qh_at + 3]]);
        (((qh >> j) & 1) << 4) as i32
    };
    let (values, m): ([i32; QK8], f32) = match format {
        Legacy::Q4_0 => (std::array::from_fn(|j| nibble(&b[2..], j) - 8), 0.0),
        Legacy::Q4_1 => (std::array::from_fn(|j| nibble(&b[4..], j)), f16(b, 2)),
        Legacy::Q5_0 => (
            std::array::from_fn(|j| (nibble(&b[6..], j) | fifth(2, j)) - 16),
            0.0,
        ),
        Legacy::Q5_1 => (
            std::array::from_fn(|j| nibble(&b[8..], j) | fifth(4, j)),
            f16(b, 2),
        ),
        Legacy::Q8_0 => (std::array::from_fn(|j| i32::from(b[2 + j] as i8)), 0.0),
    };
    Block {
        values,
        d: f16(b, 0),
        m,
    }
}

/// One row against every column.
fn dot_row(format: Legacy, row: &[u8], activations: Q8Rows<'_>, out: &mut [f32]) {
    let blocks = row.len() / format.block_bytes();
    for (c, o) in out.iter_mut().enumerate() {
        let mut acc = [0.0f32; 8];
        let mut offsets = 0.0f32;
        for (i, w) in row.chunks_exact(format.block_bytes()).enumerate() {
            let block = decode(format, w);
            let (qs, d_a, s_a) = match activations {
                Q8Rows::Q8_0(a) => (&a[c * blocks + i].qs, a[c * blocks + i].d.to_f32(), 0.0),
                Q8Rows::Q8_1(a) => {
                    let a = &a[c * blocks + i];
                    (&a.qs, a.d.to_f32(), a.s.to_f32())
                }
            };
            let scale = block.d * d_a;
            for (g, acc) in acc.iter_mut().enumerate() {
                let lane: i32 = (4 * g..4 * g + 4)
                    .map(|j| block.values[j] * i32::from(qs[j]))
                    .sum();
                *acc = (lane as f32).mul_add(scale, *acc);
            }
            if format.uses_q8_1() {
                offsets += block.m * s_a;
            }
        }
        *o = reduce(&acc) + offsets;
    }
}

/// The fixed reduction of the eight accumulators.
pub(super) fn reduce(acc: &[f32; 8]) -> f32 {
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}
