//! Launches of the int8 tensor-core GEMM (`kernels/qgemm.cu`), the prefill path for the
//! quantized formats: the token rows of a pass are quantized once by [`Gpu::quantize_rows`]
//! (32-element int8 chunks, as the GEMV's and the CPU's activation blocks), every weight chunk
//! is decoded to int8 in shared memory and multiplied by `mma.sync`, and each output's f32 sum
//! follows the GEMV's order (a pairwise tree within each segment of [`SEGMENT`] elements, the
//! segments in order; `kernels/qgemv.cu`): a token row's results are the GEMV's, bit for bit,
//! and do not depend on the other rows.

use worker_common::backend::BackendError;
use worker_common::model::ModelPlan;

use crate::device::Gpu;
use crate::ops::{Projection, int};
use crate::params::{DevPtr, QgemmParams};
use crate::program::{QM_LARGE_MT, QM_LARGE_NT, QM_WARPS_M, QM_WARPS_N};
use crate::qgemv::{QgemvMode, check, qmatrices};

/// The block shapes of qgemm.cu (`QmSmall`, `QmLarge`), the index of their kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TileShape {
    /// 32 weight rows × 32 tokens: many blocks for a few dozen tokens, segments split apart.
    Small = 0,
    /// More rows or tokens a block, for passes with enough blocks to fill the GPU: fewer
    /// shared loads and scale reads for each output.
    Large = 1,
}

impl TileShape {
    /// Weight rows and tokens per block (output slots of a gated or RoPE block are half as
    /// many rows: each slot is two rows, gate and up, or a rotated pair).
    fn size(self) -> Shape {
        match self {
            Self::Small => SMALL,
            Self::Large => LARGE,
        }
    }
}

/// How a launch's blocks cover its outputs: the tile shape, and whether each block runs all of
/// its tile's segments (`together`) or one (the segments' totals in the split room).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The tile shape.
    pub tile: TileShape,
    /// Each block on all of its tile's segments.
    pub together: bool,
}

impl Layout {
    /// Every layout a launch can take (the large tiles only together), for the tests that
    /// prove they give the same bits.
    #[cfg(test)]
    pub const ALL: [Layout; 3] = [
        Layout {
            tile: TileShape::Small,
            together: false,
        },
        Layout {
            tile: TileShape::Small,
            together: true,
        },
        Layout {
            tile: TileShape::Large,
            together: true,
        },
    ];
}

/// A block's weight rows and tokens.
#[derive(Debug, Clone, Copy)]
struct Shape {
    rows: usize,
    tokens: usize,
}

/// One mma tile a warp.
const SMALL: Shape = Shape {
    rows: 16 * QM_WARPS_M,
    tokens: 8 * QM_WARPS_N,
};
const LARGE: Shape = Shape {
    rows: 16 * QM_WARPS_M * QM_LARGE_MT,
    tokens: 8 * QM_WARPS_N * QM_LARGE_NT,
};
/// Tokens from which a launch whose small tiles need no split takes the large shape.
const LARGE_FROM_TOKENS: usize = 64;
/// Threads per block.
const THREADS: u32 = (QM_WARPS_M * QM_WARPS_N * 32) as u32;
/// Below this many blocks (eight per SM of an H100), a launch over several segments runs each
/// segment in a block of its own (a prompt of a few dozen tokens then still fills the GPU on a
/// down projection); from it on, each block runs all of its tile's segments, and no split room
/// is needed. The order of the sums is the same either way.
const SPLIT_BELOW_BLOCKS: usize = 1056;
/// Most blocks along a grid's y dimension (the row tiles of a launch).
const MAX_GRID_Y: usize = 65_535;
/// Elements of a segment (`QG_SEG` chunks of 32): a wider matrix's products are summed per
/// segment, each segment in a block of its own.
pub const SEGMENT: usize = crate::program::QG_SEG * 32;
/// Bytes of one small tile's totals for one segment.
const SMALL_TILE_BYTES: usize = SMALL.rows * SMALL.tokens * 4;

/// Device scratch of the small shape's segments: per tile and segment its totals
/// (`partial_bytes`), per tile a zeroed count of finished segments (the kernel leaves it zeroed).
#[derive(Debug, Clone, Copy, Default)]
pub struct SplitRoom {
    /// The totals.
    pub partial: DevPtr<f32>,
    /// Their bytes.
    pub partial_bytes: usize,
    /// The counts.
    pub counters: DevPtr<u32>,
    /// Counts held.
    pub counter_count: usize,
}

impl SplitRoom {
    /// Bytes of totals and counts the GEMM launches of `plan`'s layers need for passes of up to
    /// `rows` token rows: the largest launch among those over more than one segment that runs
    /// its segments apart (fewer than [`SPLIT_BELOW_BLOCKS`] tiles).
    pub fn need(plan: &ModelPlan, rows: usize) -> (usize, usize) {
        let hp = &plan.hp;
        let tiles = |outputs: usize, per_tile: usize| outputs.div_ceil(per_tile);
        let qkv = [hp.q_width(), hp.k_width(), hp.v_width()]
            .iter()
            .map(|&w| tiles(w, SMALL.rows))
            .sum();
        // (input width, row tiles): Q·K·V, gate·up (two rows a slot), output, down.
        let launches = [
            (hp.n_embd, qkv),
            (hp.n_embd, tiles(hp.n_ff, SMALL.rows / 2)),
            (hp.attn_out_width(), tiles(hp.n_embd, SMALL.rows)),
            (hp.n_ff, tiles(hp.n_embd, SMALL.rows)),
        ];
        launches
            .iter()
            .filter(|&&(cols, _)| cols > SEGMENT)
            .map(|&(cols, row_tiles)| {
                let count = (rows.div_ceil(SMALL.tokens) * row_tiles).min(SPLIT_BELOW_BLOCKS);
                (count * cols.div_ceil(SEGMENT) * SMALL_TILE_BYTES, count)
            })
            .fold((0, 0), |(bytes, counts), (b, c)| {
                (bytes.max(b), counts.max(c))
            })
    }
}

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
    /// the cache. A row's results are the GEMV's ([`Gpu::qgemv`]), bit for bit.
    pub fn qgemm(
        &self,
        parts: &[Projection<'_>],
        quantized: DevPtr<u8>,
        n: usize,
        mode: QgemvMode,
        split: SplitRoom,
    ) -> Result<(), BackendError> {
        check(parts, mode)?;
        let blocks = row_tiles(parts, mode, SMALL.rows) * n.div_ceil(SMALL.tokens);
        let together = blocks >= SPLIT_BELOW_BLOCKS;
        let tile = if together && n >= LARGE_FROM_TOKENS {
            TileShape::Large
        } else {
            TileShape::Small
        };
        self.qgemm_shaped(parts, quantized, n, mode, Layout { tile, together }, split)
    }

    /// [`Gpu::qgemm`] in a given [`Layout`] (the large tiles only together); every layout
    /// gives every output the same bits.
    pub(crate) fn qgemm_shaped(
        &self,
        parts: &[Projection<'_>],
        quantized: DevPtr<u8>,
        n: usize,
        mode: QgemvMode,
        layout: Layout,
        split: SplitRoom,
    ) -> Result<(), BackendError> {
        let Layout { tile, together } = layout;
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
        if tile == TileShape::Large && !together {
            return Err(BackendError::Device(
                "the large qgemm tiles run all their segments in one block".to_owned(),
            ));
        }
        let shape = tile.size();
        let tiles = row_tiles(parts, mode, shape.rows);
        if tiles > MAX_GRID_Y {
            return Err(BackendError::Device(format!(
                "a qgemm launch needs {tiles} row tiles (at most {MAX_GRID_Y})"
            )));
        }
        let [m0, m1, m2] = qmatrices(parts)?;
        let params = QgemmParams {
            m0,
            m1,
            m2,
            rope: mode.rope_params()?,
            cols: int(cols)?,
            n: int(n)?,
            pre: quantized,
            mode: mode.code(),
            partial: split.partial,
            counters: split.counters,
        };
        let token_tiles = n.div_ceil(shape.tokens);
        let segments = if together { 1 } else { cols.div_ceil(SEGMENT) };
        if segments > 1 {
            let (bytes, counts) = (
                token_tiles * tiles * segments * SMALL_TILE_BYTES,
                token_tiles * tiles,
            );
            if bytes > split.partial_bytes || counts > split.counter_count {
                return Err(BackendError::Device(format!(
                    "a qgemm launch over {segments} segments needs {bytes} bytes and {counts} counts of split room, which holds {} and {}",
                    split.partial_bytes, split.counter_count
                )));
            }
        }
        let grid = (int(token_tiles)? as u32, tiles as u32, segments as u32);
        let first = parts[0].w.ggml_type;
        let one_format = parts
            .iter()
            .all(|p| p.w.ggml_type == first)
            .then_some(first);
        let kernel = self.kernels.qgemm(one_format, tile);
        self.launch_grid(kernel, grid, (THREADS, 0), &params)
    }
}
