//! The scalar reference of the row kernels: plain code in the documented summation order, the
//! oracle the SIMD kernels must match bit for bit.

use std::ops::Range;

use super::{Legacy, PackedRows, Q8Rows, ShapeError, TokenOutputs, check};
use crate::quant::activation::QK8;
use crate::quant::iq4_value;

/// `out[r * cols + c] = row r · activation row c` for the whole rows in `rows` (row-major,
/// raw GGUF blocks, `blocks` blocks each, where `blocks` is the activations' blocks per
/// column): the reference the packed SIMD kernels are checked against.
pub fn dot_rows(
    format: Legacy,
    rows: &[u8],
    activations: Q8Rows<'_>,
    cols: usize,
    out: &mut [f32],
) -> Result<(), ShapeError> {
    let row_bytes = check(format, rows, activations, cols, out.len())?;
    for (row, out) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(cols)) {
        dot_row(format, row, activations, out);
    }
    Ok(())
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
        Legacy::Iq4Nl => {
            let qs = b[2..].try_into().unwrap_or(&[0; 16]);
            (std::array::from_fn(|j| i32::from(iq4_value(qs, j))), 0.0)
        }
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
        let mut sum = Sum::default();
        for (i, w) in row.chunks_exact(format.block_bytes()).enumerate() {
            sum.add(format, w, activations, c * blocks + i);
        }
        *o = sum.result();
    }
}

/// The running sums of one output, in the documented order.
#[derive(Default)]
pub(super) struct Sum {
    acc: f32,
    offsets: f32,
}

impl Sum {
    /// Adds raw weight block `w` times activation block `at`.
    pub(super) fn add(&mut self, format: Legacy, w: &[u8], activations: Q8Rows<'_>, at: usize) {
        let block = decode(format, w);
        let (qs, d_a, s_a) = match activations {
            Q8Rows::Q8_0(a) => (&a[at].qs, a[at].d.to_f32(), 0.0),
            Q8Rows::Q8_1(a) => (&a[at].qs, a[at].d.to_f32(), a[at].s.to_f32()),
        };
        let isum: i32 = block
            .values
            .iter()
            .zip(qs)
            .map(|(&v, &y)| v * i32::from(y))
            .sum();
        self.acc = (isum as f32).mul_add(block.d * d_a, self.acc);
        if format.uses_q8_1() {
            self.offsets = block.m.mul_add(s_a, self.offsets);
        }
    }

    /// The output.
    pub(super) fn result(&self) -> f32 {
        self.acc + self.offsets
    }
}

/// [`super::dot_packed_into`] without SIMD: each row's blocks read back from the packing.
pub(super) fn dot_packed(
    w: &PackedRows,
    rows: Range<usize>,
    activations: Q8Rows<'_>,
    out: TokenOutputs<'_, '_>,
) {
    let (blocks, first) = (w.blocks(), rows.start);
    for r in rows {
        for (c, token) in out.iter_mut().enumerate() {
            let mut sum = Sum::default();
            for i in 0..blocks {
                let block = w.raw_block(r, i);
                sum.add(w.format(), &block, activations, c * blocks + i);
            }
            token[r - first] = sum.result();
        }
    }
}
