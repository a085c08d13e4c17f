//! Every matrix kernel of the CPU backend, in one tree: which kernel family reads a weight type
//! ([`kernel`], [`supports`]), the repacked layouts ([`packed`], [`packed_k`], in one [`Arena`]),
//! and per family a scalar oracle and SIMD bodies that match it bit for bit, chosen by the one
//! process-wide level of [`crate::isa`]:
//!
//! | family | layout | oracle | AVX2 / AVX-512 VNNI |
//! |---|---|---|---|
//! | Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL | repacked, 8 rows interleaved | [`scalar`] | `avx2` |
//! | Q2_K, Q3_K, Q4_K, Q6_K, IQ4_XS | repacked, 8 rows interleaved | [`rows::scalar`] | `avx2_k` |
//! | Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ3_S, IQ3_XXS | GGUF rows | [`rows::scalar`] | `rows/k_simd` |
//! | F32, F16, BF16 | GGUF rows | [`rows::scalar`] | `rows/avx2_float` |
//!
//! # The 32-element formats
//!
//! Weight rows against one or more Q8 activation rows (tokens). The weights are repacked at load
//! ([`packed`]): eight rows interleaved, so one integer dot instruction serves eight rows and
//! each block's integer sum per (row, token) is complete in one lane. The SIMD kernels then
//! cover eight rows × up to [`MAX_COLS`] tokens per register tile, unpacking each weight block
//! once for all the tile's tokens.
//!
//! # Summation order (the same in every implementation)
//!
//! For one output (row, token), block after block: the block's 32 products are summed exactly
//! in one i32 (`isum = Σ v_j·y_j`, `v_j` the signed element value: `q − 8` for Q4_0, `q − 16`
//! for Q5_0, the grid value `kvalues_iq4nl[q]` for IQ4_NL, `q` otherwise; `|isum| ≤ 32·128·128
//! < 2^20`, so its conversion to f32 is exact), then
//! `acc = fma(isum, d_w·d_a, acc)` (`d_w·d_a` is exact: two f16 values). Q4_1/Q5_1 also keep
//! `offsets = fma(m_w, s_a, offsets)`. The result is `acc + offsets`. The [`scalar`]
//! reference follows it with `f32::mul_add`, the SIMD kernels compute the same exact integer
//! sums and the same f32 steps, so they are bit-identical to it, and a row's result never
//! depends on the thread count, on the other tokens of the call or on how rows are grouped.
//!
//! Q4_K is repacked the same way ([`packed_k`], [`dot_packed_k`]) but keeps the k-quants'
//! own order ([`rows`]), whose reference it matches bit for bit.

pub mod arena;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_k;
pub mod formats;
pub mod packed;
pub mod packed_k;
pub mod rows;
pub mod scalar;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_k;
#[cfg(target_arch = "x86_64")]
mod vnni512;

use std::ops::Range;

use half::f16;
use worker_common::gguf::GgmlType;

pub use arena::Arena;
pub use packed::{GROUP, PackedRows};
pub use packed_k::{
    KLayout, PackedIq4Xs, PackedK, PackedQ2K, PackedQ3K, PackedQ6K, packed_k_available,
};

use crate::quant::activation::{BlockQ8_0, BlockQ8_1, BlockQ8K};
use rows::DotError;
use rows::KQuant;

/// A float row kernel: one weight row (raw little-endian bytes) · f32 activations.
pub type FloatDot = fn(&[u8], &[f32]) -> Result<f32, DotError>;

/// The kernel family of a weight type, which fixes the activation format it reads (ggml's
/// `vec_dot_type`): Q8_0/Q8_1 for the 32-element formats (IQ4_NL's too), Q8_K for the
/// k-quants, IQ4_XS, IQ3_S and IQ3_XXS, f32 for floats.
#[derive(Debug, Clone, Copy)]
pub enum Kernel {
    /// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL (packed at load).
    Legacy(Legacy),
    /// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ3_S, IQ3_XXS.
    KQuant(KQuant),
    /// F32, F16, BF16: one row × one token per call.
    Float(FloatDot),
}

/// The kernel family of `ggml_type`; `None` for the types no kernel reads.
pub fn kernel(ggml_type: GgmlType) -> Option<Kernel> {
    if let Some(format) = Legacy::of(ggml_type) {
        return Some(Kernel::Legacy(format));
    }
    Some(match ggml_type {
        GgmlType::Q2_K => Kernel::KQuant(KQuant::Q2K),
        GgmlType::Q3_K => Kernel::KQuant(KQuant::Q3K),
        GgmlType::Q4_K => Kernel::KQuant(KQuant::Q4K),
        GgmlType::Q5_K => Kernel::KQuant(KQuant::Q5K),
        GgmlType::Q6_K => Kernel::KQuant(KQuant::Q6K),
        GgmlType::IQ4_XS => Kernel::KQuant(KQuant::Iq4Xs),
        GgmlType::IQ3_S => Kernel::KQuant(KQuant::Iq3S),
        GgmlType::IQ3_XXS => Kernel::KQuant(KQuant::Iq3Xxs),
        GgmlType::F32 => Kernel::Float(rows::dot_f32_f32),
        GgmlType::F16 => Kernel::Float(rows::dot_f16_f32),
        GgmlType::BF16 => Kernel::Float(rows::dot_bf16_f32),
        _ => return None,
    })
}

/// Whether a matrix of `ggml_type` can be multiplied (the model loader asks before anything runs).
pub fn supports(ggml_type: GgmlType) -> bool {
    kernel(ggml_type).is_some()
}

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
    /// `d`, 16 nibble bytes as Q4_0's; value `d·kvalues_iq4nl[q]` (the i-quants' grid,
    /// `crate::quant::KVALUES_IQ4NL`).
    Iq4Nl,
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
            GgmlType::IQ4_NL => Legacy::Iq4Nl,
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
            Legacy::Iq4Nl => crate::quant::IQ4_NL_BYTES,
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

/// A kernel call's outputs, one slice per token (activation row), each as long as the call's
/// rows: `out[c][r − first]`. The slices may lie anywhere: in a batched matmul each is that
/// token's run of the matrix's output row, so the kernels write the final places and nothing
/// is copied after them.
pub type TokenOutputs<'a, 'b> = &'a mut [&'b mut [f32]];

/// `out[c * rows + (r − first)] = row r · activation row c` (token-major) for the `rows` rows
/// `r` of the groups `groups` of `w` (padding rows left out; `first` the groups' first row):
/// [`dot_packed_into`] with `out` cut into the tokens' runs.
pub fn dot_packed(
    w: &PackedRows,
    groups: Range<usize>,
    activations: Q8Rows<'_>,
    meta: &[BlockMeta],
    cols: usize,
    out: &mut [f32],
) -> Result<(), ShapeError> {
    let outputs = out.len();
    match token_runs(out, group_rows(w.rows(), &groups).len(), cols) {
        Some(mut tokens) => dot_packed_into(w, groups, activations, meta, &mut tokens),
        None => Err(shape_error(w, activations, cols, outputs)),
    }
}

/// `out[c][r − first] = row r · activation row c` for the rows `r` of the groups `groups` of
/// `w` (padding rows left out; `first` the groups' first row), `out.len()` tokens, using the
/// fastest kernel this CPU has; bit-identical to [`scalar::dot_rows`] on the raw rows. `meta`
/// is [`block_meta`] of the activations.
pub fn dot_packed_into(
    w: &PackedRows,
    groups: Range<usize>,
    activations: Q8Rows<'_>,
    meta: &[BlockMeta],
    out: TokenOutputs<'_, '_>,
) -> Result<(), ShapeError> {
    let rows = group_rows(w.rows(), &groups);
    let cols = out.len();
    let (activation_blocks, q8_1) = match activations {
        Q8Rows::Q8_0(a) => (a.len(), false),
        Q8Rows::Q8_1(a) => (a.len(), true),
    };
    let fits = groups.start <= groups.end
        && groups.end <= w.groups()
        && cols > 0
        && activation_blocks == cols * w.blocks()
        && meta.len() == activation_blocks
        && q8_1 == w.format().uses_q8_1()
        && out.iter().all(|token| token.len() == rows.len());
    if !fits {
        let outputs = out.iter().map(|token| token.len()).sum();
        return Err(shape_error(w, activations, cols, outputs));
    }
    #[cfg(target_arch = "x86_64")]
    if avx2::dot_packed(w, groups, activations, meta, out) {
        return Ok(());
    }
    scalar::dot_packed(w, rows, activations, out);
    Ok(())
}

/// Why [`dot_packed_into`] refused `w` against `activations` in `cols` tokens with `outputs`
/// outputs.
fn shape_error(w: &PackedRows, activations: Q8Rows<'_>, cols: usize, outputs: usize) -> ShapeError {
    let activation_blocks = match activations {
        Q8Rows::Q8_0(a) => a.len(),
        Q8Rows::Q8_1(a) => a.len(),
    };
    ShapeError {
        format: w.format(),
        weight_bytes: w.bytes(),
        activation_blocks,
        cols,
        outputs,
    }
}

/// `out[c * rows + (r − first)] = row r · activation row c` (token-major) for the rows of the
/// groups `groups` of a packed k-quant (or IQ4_XS) matrix against `cols` rows of Q8_K activations:
/// [`dot_packed_k_into`] with `out` cut into the tokens' runs.
pub fn dot_packed_k<F: KLayout>(
    w: &packed::Packed<F>,
    groups: Range<usize>,
    a: &[BlockQ8K],
    cols: usize,
    out: &mut [f32],
) -> Result<(), DotError> {
    let outputs = out.len();
    match token_runs(out, group_rows(w.rows(), &groups).len(), cols) {
        Some(mut tokens) => dot_packed_k_into(w, groups, a, &mut tokens),
        None => Err(DotError::RowsMismatch {
            bytes: w.bytes(),
            blocks: a.len(),
            cols,
            outputs,
        }),
    }
}

/// `out[c][r − first] = row r · activation row c` for the rows of the groups `groups` of a
/// packed k-quant (or IQ4_XS) matrix against `out.len()` rows of Q8_K activations, bit-identical to
/// [`rows::scalar::dot_rows_k`] on the raw rows (for activations whose `bsums` are their
/// quants' sums, as [`crate::quant::activation::quantize_q8_k`] makes them).
pub fn dot_packed_k_into<F: KLayout>(
    w: &packed::Packed<F>,
    groups: Range<usize>,
    a: &[BlockQ8K],
    out: TokenOutputs<'_, '_>,
) -> Result<(), DotError> {
    let rows = group_rows(w.rows(), &groups);
    let cols = out.len();
    let fits = groups.start <= groups.end
        && groups.end <= w.groups()
        && cols > 0
        && a.len() == cols * w.blocks()
        && out.iter().all(|token| token.len() == rows.len())
        && packed_k_available();
    if !fits {
        return Err(DotError::RowsMismatch {
            bytes: w.bytes(),
            blocks: a.len(),
            cols,
            outputs: out.iter().map(|token| token.len()).sum(),
        });
    }
    #[cfg(target_arch = "x86_64")]
    avx2_k::dot_packed_k(w, groups, a, out);
    Ok(())
}

/// The rows (padding left out) of the groups `groups` of a matrix of `rows` rows.
fn group_rows(rows: usize, groups: &Range<usize>) -> Range<usize> {
    (groups.start * GROUP).min(rows)..(groups.end * GROUP).min(rows)
}

/// The token-major `out` cut into `cols` runs of `rows`; `None` unless it holds exactly that.
fn token_runs(out: &mut [f32], rows: usize, cols: usize) -> Option<Vec<&mut [f32]>> {
    if cols == 0 || out.len() != rows * cols {
        return None;
    }
    if rows == 0 {
        return Some((0..cols).map(|_| <&mut [f32]>::default()).collect());
    }
    Some(out.chunks_exact_mut(rows).collect())
}

/// What the SIMD kernels read of an activation block besides its quants, in the form they use
/// it: computed once per matmul call instead of once per (row group, block).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BlockMeta {
    /// The scale `d`, widened.
    pub d: f32,
    /// Q8_1's `s`, widened (0 for Q8_0).
    pub s: f32,
    /// The integer sum of the quants, for the formats whose codes are offset (Q4_0, Q5_0, and
    /// Q8_0 on VNNI).
    pub sum: i32,
}

/// [`BlockMeta`] of every activation block, into `out`: for blocks from elsewhere than the
/// quantizer (tests, benchmarks), which computes the same in the pass that makes its blocks
/// (`quant::activation`).
pub fn block_meta(activations: Q8Rows<'_>, out: &mut Vec<BlockMeta>) {
    out.clear();
    match activations {
        Q8Rows::Q8_0(a) => out.extend(a.iter().map(meta_of)),
        Q8Rows::Q8_1(a) => out.extend(a.iter().map(meta_of)),
    }
}

/// A Q8_0 or Q8_1 activation block: the SIMD tiles read its quants, [`BlockMeta`] its scales.
pub(crate) trait ActBlock: Copy {
    /// `d`, and `s` (Q8_1's; none for Q8_0).
    fn scales(&self) -> (f16, Option<f16>);
    fn qs(&self) -> &[i8; 32];
}

impl ActBlock for BlockQ8_0 {
    #[inline(always)]
    fn scales(&self) -> (f16, Option<f16>) {
        (self.d, None)
    }
    #[inline(always)]
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
}

impl ActBlock for BlockQ8_1 {
    #[inline(always)]
    fn scales(&self) -> (f16, Option<f16>) {
        (self.d, Some(self.s))
    }
    #[inline(always)]
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
}

/// `block`'s [`BlockMeta`].
pub(crate) fn meta_of(block: &impl ActBlock) -> BlockMeta {
    let (d, s) = block.scales();
    BlockMeta {
        d: d.to_f32(),
        s: s.map_or(0.0, f16::to_f32),
        sum: block.qs().iter().map(|&q| i32::from(q)).sum(),
    }
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
