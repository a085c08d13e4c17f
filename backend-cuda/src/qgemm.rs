//! Launches of the int8 tensor-core GEMM (`kernels/qgemm.cu`), the prefill path for the
//! quantized formats: the token rows of a pass are quantized once by [`Gpu::quantize_rows`]
//! (32-element int8 chunks, as the GEMV's and the CPU's activation blocks), every weight chunk
//! is decoded to int8 in shared memory and multiplied by `mma.sync`, and each output's f32 sum
//! runs over the chunks in order: a token row's results do not depend on the other rows.

use worker_common::backend::BackendError;

use crate::device::{Arg, Gpu};
use crate::ops::Projection;
use crate::qgemv::{QgemvMode, check, int, matrix_args, rope_args};

/// A block shape of qgemm.cu (`QmSmall`, `QmLarge`): weight rows and tokens per block (output
/// slots of a gated or RoPE block are half as many rows: each slot is two rows, gate and up, or
/// a rotated pair).
#[derive(Debug, Clone, Copy)]
struct Shape {
    rows: usize,
    tokens: usize,
}

const SMALL: Shape = Shape {
    rows: 32,
    tokens: 32,
};
const LARGE: Shape = Shape {
    rows: 64,
    tokens: 64,
};
/// Threads per block of both shapes.
const THREADS: u32 = 256;
/// Blocks a launch of the large shape must fill (two per SM of an H100): below it the small
/// shape's four times as many blocks keep more SMs busy.
const LARGE_FROM_BLOCKS: usize = 264;
/// Most blocks along a grid's y dimension (the row tiles of a launch).
const MAX_GRID_Y: usize = 65_535;

/// Row tiles of a launch of `parts` in `mode` for a block shape of `rows` weight rows.
fn row_tiles(parts: &[Projection<'_>], mode: QgemvMode, rows: usize) -> usize {
    match mode {
        QgemvMode::Gated { .. } => parts[0].w.rows.div_ceil(rows / 2),
        QgemvMode::Rope(_) => parts
            .iter()
            .map(|p| (p.w.rows / 2).div_ceil(rows / 2))
            .sum(),
        _ => parts.iter().map(|p| p.w.rows.div_ceil(rows)).sum(),
    }
}

impl Gpu {
    /// `parts` (up to three matrices of one width, any mix of the
    /// [`has_qgemv`](crate::qgemv::has_qgemv) formats) times the `n` token rows
    /// [`Gpu::quantize_rows`] wrote at `quantized`, with the GEMV's modes ([`QgemvMode`]):
    /// stored (+ bias), added to the outputs, gated (gate and up), or rotated with K and V into
    /// the cache. A row's results do not depend on the other rows.
    pub fn qgemm(
        &self,
        parts: &[Projection<'_>],
        quantized: u64,
        n: usize,
        mode: QgemvMode,
    ) -> Result<(), BackendError> {
        check(parts, mode)?;
        let large = row_tiles(parts, mode, LARGE.rows) * n.div_ceil(LARGE.tokens);
        self.qgemm_shaped(parts, quantized, n, mode, large >= LARGE_FROM_BLOCKS)
    }

    /// [`Gpu::qgemm`] with the block shape chosen by the caller: `large` (64×64 tiles) or
    /// small (32×32). Both give every output the same bits.
    pub(crate) fn qgemm_shaped(
        &self,
        parts: &[Projection<'_>],
        quantized: u64,
        n: usize,
        mode: QgemvMode,
        large: bool,
    ) -> Result<(), BackendError> {
        let cols = check(parts, mode)?;
        if n == 0 {
            return Err(BackendError::Device("a qgemm launch of no rows".to_owned()));
        }
        // A block decodes all its rows in its matrix's format; a gated block's up rows too.
        let gated = matches!(mode, QgemvMode::Gated { .. });
        if gated && parts[0].w.ggml_type != parts[1].w.ggml_type {
            return Err(BackendError::Device(
                "a gated qgemm launch takes gate and up in one format".to_owned(),
            ));
        }
        let shape = if large { LARGE } else { SMALL };
        let tiles = row_tiles(parts, mode, shape.rows);
        if tiles > MAX_GRID_Y {
            return Err(BackendError::Device(format!(
                "a qgemm launch needs {tiles} row tiles (at most {MAX_GRID_Y})"
            )));
        }
        let mut args = matrix_args(parts)?;
        args.extend([
            Arg::I32(int(cols)?),
            Arg::I32(int(n)?),
            Arg::Ptr(quantized),
            Arg::I32(mode.code()),
        ]);
        rope_args(mode, &mut args)?;
        let grid = (int(n.div_ceil(shape.tokens))? as u32, tiles as u32);
        let func = if large {
            &self.kernels.qgemm_large
        } else {
            &self.kernels.qgemm_small
        };
        self.launch(func, grid, THREADS, &args)
    }
}
