//! Matrix kernels for the 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): a run of
//! weight rows against one or more Q8 activation rows (tokens). The SIMD kernels work in
//! register tiles: four weight rows against one token (decode loads each activation block once
//! for four rows), two rows against [`MAX_COLS`] tokens (prefill unpacks each weight block once
//! for four tokens).
//!
//! # Summation order (the same in every implementation)
//!
//! Each block's 32 products are summed exactly in eight i32 *lanes*, lane `g` holding elements
//! `4g..4g+4`. Eight f32 accumulators take, block after block, `acc[g] = fma(lane[g], d_w·d_a,
//! acc[g])` (`d_w·d_a` is exact: two f16 values). Q4_1/Q5_1 add their offsets to one scalar
//! `offsets += m_w·s_a`. The result is `((acc0+acc4)+(acc2+acc6)) + ((acc1+acc5)+(acc3+acc7))`,
//! plus `offsets`. This is the order of ggml's AVX2 kernels; the [`scalar`] reference follows it
//! with `f32::mul_add`, so the SIMD kernels are bit-identical to it, and a row's result never
//! depends on the thread count or on how many columns are computed together.

#[cfg(target_arch = "x86_64")]
mod avx2;
pub mod scalar;
#[cfg(test)]
mod tests;

use worker_common::gguf::GgmlType;

use crate::quant::activation::{BlockQ8_0, BlockQ8_1};

/// Tokens one register tile covers.
pub const MAX_COLS: usize = 4;

/// A 32-element weight block format, with its byte layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Legacy {
    /// `d`, 16 nibble bytes; value `d·(q − 8)`.
    Q4_0,
    /// `d`, `m`, 16 nibble bytes; value `d·q + m`.
    Q4_1,
    /// `d`, `qh: u32`, 16 nibble bytes; value `d·(q − 16)` with bit 4 from `qh`.
    Q5_0,
    /// `d`, `m`, `qh`, 16 nibble bytes; value `d·q + m`.
    Q5_1,
    /// `d`, 32 signed bytes; value `d·q`.
    Q8_0,
}

impl Legacy {
    /// The format of `ggml_type`, if it is one of these.
    pub fn of(ggml_type: GgmlType) -> Option<Self> {
        Some(match ggml_type {
            GgmlType::Q4_0 => Legacy::Q4_0,
            GgmlType::Q4_1 => Legacy::Q4_1,
            GgmlType::Q5_0 => Legacy::Q5_0,
            GgmlType::Q5_1 => Legacy::Q5_1,
            GgmlType::Q8_0 => Legacy::Q8_0,
            _ => return None,
        })
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            Legacy::Q4_0 => 18,
            Legacy::Q4_1 => 20,
            Legacy::Q5_0 => 22,
            Legacy::Q5_1 => 24,
            Legacy::Q8_0 => 34,
        }
    }

    /// Whether the activations must be Q8_1 (formats with an offset `m`) rather than Q8_0.
    pub const fn uses_q8_1(self) -> bool {
        matches!(self, Legacy::Q4_1 | Legacy::Q5_1)
    }
}

/// Activation rows for a [`Legacy`] row kernel: `cols` rows of `blocks` blocks each.
#[derive(Debug, Clone, Copy)]
pub enum Q8Rows<'a> {
    /// For Q4_0, Q5_0, Q8_0.
    Q8_0(&'a [BlockQ8_0]),
    /// For Q4_1, Q5_1.
    Q8_1(&'a [BlockQ8_1]),
}

/// Why a kernel refused its inputs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{format:?}: {weight_bytes} weight bytes, {activation_blocks} activation blocks in {cols} columns and {outputs} outputs do not match"
)]
pub struct ShapeError {
    /// The weight format.
    pub format: Legacy,
    /// Length of the weight rows.
    pub weight_bytes: usize,
    /// Activation blocks given (all columns).
    pub activation_blocks: usize,
    /// Activation rows (tokens).
    pub cols: usize,
    /// Outputs requested.
    pub outputs: usize,
}

/// `out[r * cols + c] = row r · activation row c` for the whole rows in `rows` (row-major,
/// `blocks` blocks each, where `blocks` is the activations' blocks per column), using the
/// fastest kernel this CPU has; bit-identical to [`scalar::dot_rows`].
pub fn dot_rows(
    format: Legacy,
    rows: &[u8],
    activations: Q8Rows<'_>,
    cols: usize,
    out: &mut [f32],
) -> Result<(), ShapeError> {
    let row_bytes = check(format, rows, activations, cols, out.len())?;
    #[cfg(target_arch = "x86_64")]
    if avx2::dot_rows(format, rows, row_bytes, activations, cols, out) {
        return Ok(());
    }
    scalar::dot_rows_unchecked(format, rows, row_bytes, activations, cols, out);
    Ok(())
}

/// Checks the shapes and the activation type (Q8_1 exactly for the formats with an offset);
/// returns the bytes per weight row.
fn check(
    format: Legacy,
    rows: &[u8],
    activations: Q8Rows<'_>,
    cols: usize,
    outputs: usize,
) -> Result<usize, ShapeError> {
    let (activation_blocks, q8_1) = match activations {
        Q8Rows::Q8_0(a) => (a.len(), false),
        Q8Rows::Q8_1(a) => (a.len(), true),
    };
    let error = ShapeError {
        format,
        weight_bytes: rows.len(),
        activation_blocks,
        cols,
        outputs,
    };
    if cols == 0
        || activation_blocks % cols != 0
        || !outputs.is_multiple_of(cols)
        || q8_1 != format.uses_q8_1()
    {
        return Err(error);
    }
    let row_bytes = (activation_blocks / cols) * format.block_bytes();
    if row_bytes == 0 || (outputs / cols).checked_mul(row_bytes) != Some(rows.len()) {
        return Err(error);
    }
    Ok(row_bytes)
}
